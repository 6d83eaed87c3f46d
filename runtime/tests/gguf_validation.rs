//! Every malformed-file case the reader must reject, each with the error variant and a
//! message that names what and where.

mod gguf_common;

use gguf_common::{small_valid, Raw};
use lode_runtime::gguf::{GgufError, GgufFile};

fn err(bytes: Vec<u8>) -> GgufError {
    GgufFile::from_bytes(bytes).expect_err("malformed file was accepted")
}

#[test]
fn small_valid_file_parses() {
    let f = GgufFile::from_bytes(small_valid()).unwrap();
    assert_eq!(f.tensors().len(), 3);
    assert_eq!(f.bytes().len() as u64, f.data_offset() + 64 + 160 + 64);
}

#[test]
fn every_truncation_is_an_error() {
    let bytes = small_valid();
    for cut in 0..bytes.len() {
        let r = GgufFile::from_bytes(bytes[..cut].to_vec());
        assert!(r.is_err(), "prefix of {cut} bytes (of {}) was accepted", bytes.len());
    }
}

#[test]
fn bad_magic() {
    let mut b = small_valid();
    b[0] = b'g';
    assert!(matches!(err(b), GgufError::BadMagic { .. }));
    assert!(matches!(err(b"GG".to_vec()), GgufError::BadMagic { .. }));
    assert!(matches!(err(vec![]), GgufError::BadMagic { .. }));
}

#[test]
fn unsupported_versions() {
    for v in [0u32, 1, 4, 0x0300_0000] {
        let e = err(Raw::header(v, 0, 0).b);
        assert!(matches!(e, GgufError::UnsupportedVersion { version, .. } if version == v), "{e}");
    }
    assert!(err(Raw::header(0x0300_0000, 0, 0).b).to_string().contains("big-endian"));
}

#[test]
fn empty_files_of_both_versions_parse() {
    for v in [2, 3] {
        let f = GgufFile::from_bytes(Raw::header(v, 0, 0).b).unwrap();
        assert_eq!(f.version(), v);
        assert!(f.tensors().is_empty());
    }
}

#[test]
fn counts_larger_than_the_file() {
    let e = err(Raw::header(3, u64::MAX, 0).b);
    assert!(matches!(e, GgufError::LengthTooLarge { offset: 8, .. }), "{e}");
    let e = err(Raw::header(3, 0, 1 << 40).b);
    assert!(matches!(e, GgufError::LengthTooLarge { offset: 16, .. }), "{e}");
    // String length.
    let mut r = Raw::header(3, 0, 1);
    r.u64(1 << 50).zeros(16);
    let e = err(r.b);
    assert!(matches!(e, GgufError::LengthTooLarge { offset: 24, len, .. } if len == 1 << 50), "{e}");
    // Array length.
    let mut r = Raw::header(3, 0, 1);
    r.str("a").u32(9).u32(4).u64(1_000_000).zeros(40);
    let e = err(r.b);
    assert!(matches!(e, GgufError::LengthTooLarge { .. }), "{e}");
    assert!(e.to_string().contains("'a'"), "{e}");
}

#[test]
fn duplicate_key() {
    let mut r = Raw::header(3, 0, 2);
    r.kv_u32("x.y", 1).kv_u32("x.y", 2);
    let e = err(r.b);
    assert!(matches!(&e, GgufError::DuplicateKey { key, offset: 43 } if key == "x.y"), "{e}");
}

#[test]
fn empty_key() {
    let mut r = Raw::header(3, 0, 1);
    r.kv_u32("", 1);
    assert!(matches!(err(r.b), GgufError::EmptyKey { offset: 24 }));
}

#[test]
fn unknown_value_type_names_the_id() {
    let mut r = Raw::header(3, 0, 1);
    r.str("k").u32(13).u32(0);
    let e = err(r.b);
    assert!(matches!(&e, GgufError::UnknownValueType { id: 13, offset: 33, .. }), "{e}");
    assert!(e.to_string().contains("13") && e.to_string().contains("'k'"));
    // Unknown array element type.
    let mut r = Raw::header(3, 0, 1);
    r.str("k").u32(9).u32(99).u64(0);
    assert!(matches!(err(r.b), GgufError::UnknownValueType { id: 99, .. }));
}

#[test]
fn bad_bool_and_bad_utf8() {
    let mut r = Raw::header(3, 0, 1);
    r.str("k").u32(7).u8(2);
    assert!(matches!(err(r.b), GgufError::BadBool { value: 2, offset: 37, .. }));
    let mut r = Raw::header(3, 0, 1);
    r.str("k").u32(8).u64(2).u8(0xff).u8(0xfe);
    assert!(matches!(err(r.b), GgufError::InvalidUtf8 { offset: 45, .. }));
}

#[test]
fn arrays_nested_too_deep() {
    let mut r = Raw::header(3, 0, 1);
    r.str("deep").u32(9);
    for _ in 0..100 {
        r.u32(9).u64(1);
    }
    r.u32(0).u64(0);
    assert!(matches!(err(r.b), GgufError::ArrayTooDeep { .. }));
}

#[test]
fn bad_alignment() {
    for (ty, val) in [(4u32, 0u32), (4, 48), (5, 32)] {
        let mut r = Raw::header(3, 0, 1);
        r.str("general.alignment").u32(ty).u32(val);
        let e = err(r.b);
        assert!(matches!(e, GgufError::BadAlignment { .. }), "{e}");
    }
}

/// A file with one kv-free header and the given tensor records, padded, plus `data` bytes.
fn with_tensors(records: &[(&str, &[i64], u32, u64)], data: usize) -> Vec<u8> {
    let mut r = Raw::header(3, records.len() as u64, 0);
    for (name, dims, ty, off) in records {
        r.tensor(name, dims, *ty, *off);
    }
    r.pad(32).zeros(data);
    r.b
}

#[test]
fn raw_tensor_file_parses() {
    let f = GgufFile::from_bytes(with_tensors(&[("a", &[32, 2], 8, 0), ("b", &[8], 0, 96)], 128)).unwrap();
    assert_eq!(f.tensor("b").unwrap().info.n_bytes, 32);
}

#[test]
fn duplicate_tensor_name() {
    let e = err(with_tensors(&[("a", &[8], 0, 0), ("a", &[8], 0, 32)], 64));
    assert!(matches!(&e, GgufError::DuplicateTensor { name, .. } if name == "a"), "{e}");
}

#[test]
fn unknown_tensor_type_names_the_id() {
    let e = err(with_tensors(&[("w", &[8], 4, 0)], 64));
    assert!(matches!(&e, GgufError::UnknownTensorType { id: 4, tensor, offset: 24 } if tensor == "w"), "{e}");
    let e = err(with_tensors(&[("w", &[8], 1000, 0)], 64));
    assert!(e.to_string().contains("1000") && e.to_string().contains("'w'"), "{e}");
}

#[test]
fn dims() {
    let e = err(with_tensors(&[("w", &[1, 1, 1, 1, 1], 0, 0)], 64));
    assert!(matches!(e, GgufError::BadDimCount { n_dims: 5, .. }), "{e}");
    let e = err(with_tensors(&[("w", &[], 0, 0)], 64));
    assert!(matches!(e, GgufError::BadDimCount { n_dims: 0, .. }), "{e}");
    let e = err(with_tensors(&[("w", &[8, -1], 0, 0)], 64));
    assert!(matches!(e, GgufError::BadDim { index: 1, value: -1, .. }), "{e}");
}

#[test]
fn shape_overflow() {
    let e = err(with_tensors(&[("w", &[1 << 40, 1 << 40], 0, 0)], 64));
    assert!(matches!(e, GgufError::ShapeOverflow { .. }), "{e}");
    // Element count fits i64, byte size does not.
    let e = err(with_tensors(&[("w", &[1 << 31, 1 << 31], 0, 0)], 64));
    assert!(matches!(e, GgufError::ShapeOverflow { .. }), "{e}");
}

#[test]
fn row_length_not_a_whole_block() {
    let e = err(with_tensors(&[("w", &[100, 4], 12, 0)], 1024));
    assert!(matches!(e, GgufError::PartialBlock { ne0: 100, block: 256, .. }), "{e}");
    // Total is a multiple of 32 but the row is not.
    let e = err(with_tensors(&[("w", &[16, 2], 8, 0)], 64));
    assert!(matches!(e, GgufError::PartialBlock { ne0: 16, block: 32, .. }), "{e}");
}

#[test]
fn misaligned_offset() {
    let e = err(with_tensors(&[("w", &[8], 0, 4)], 64));
    assert!(matches!(e, GgufError::MisalignedOffset { offset: 4, alignment: 32, .. }), "{e}");
}

#[test]
fn data_out_of_bounds() {
    let e = err(with_tensors(&[("w", &[8], 0, 0)], 31));
    assert!(matches!(&e, GgufError::DataOutOfBounds { tensor, .. } if tensor == "w"), "{e}");
    let e = err(with_tensors(&[("w", &[8], 0, u64::MAX - 31)], 64));
    assert!(matches!(e, GgufError::DataOutOfBounds { .. }), "{e}");
}

#[test]
fn overlapping_tensors() {
    let e = err(with_tensors(&[("a", &[16], 0, 0), ("b", &[8], 0, 32)], 128));
    assert!(matches!(&e, GgufError::Overlap { a, b, offset: 32 } if a == "a" && b == "b"), "{e}");
    // Out of order in the file, overlapping in the data.
    let e = err(with_tensors(&[("b", &[8], 0, 32), ("a", &[16], 0, 0)], 128));
    assert!(matches!(e, GgufError::Overlap { .. }), "{e}");
    // Out of order but disjoint is fine.
    GgufFile::from_bytes(with_tensors(&[("b", &[8], 0, 64), ("a", &[16], 0, 0)], 128)).unwrap();
}

#[test]
fn messages_name_what_and_where() {
    let e = err(with_tensors(&[("blk.3.ffn_down.weight", &[8], 0, 4)], 64));
    let m = e.to_string();
    assert!(m.contains("blk.3.ffn_down.weight") && m.contains('4'), "{m}");
    let mut r = Raw::header(3, 0, 1);
    r.u64(20).b.extend_from_slice(b"general.abcde");
    let m = err(r.b).to_string();
    assert!(m.contains("byte 24") && m.contains("key of metadata record #0"), "{m}");
    let mut r = Raw::header(3, 0, 1);
    r.str("k").u32(4).u8(1);
    let e = err(r.b);
    assert!(matches!(e, GgufError::Truncated { offset: 37, need: 4, have: 1, .. }), "{e}");
    assert!(e.to_string().contains("value of key 'k'"), "{e}");
}
