//! Unit tests: writer → reader round trips and the typed accessors.

use super::*;

fn all_types_writer() -> GgufWriter {
    let mut w = GgufWriter::new();
    w.add_kv("general.architecture", MetaValue::String("llama".into()))
        .add_kv("t.u8", MetaValue::U8(200))
        .add_kv("t.i8", MetaValue::I8(-5))
        .add_kv("t.u16", MetaValue::U16(60000))
        .add_kv("t.i16", MetaValue::I16(-30000))
        .add_kv("t.u32", MetaValue::U32(4_000_000_000))
        .add_kv("t.i32", MetaValue::I32(-7))
        .add_kv("t.f32", MetaValue::F32(1.5e-6))
        .add_kv("t.bool", MetaValue::Bool(true))
        .add_kv("t.u64", MetaValue::U64(u64::MAX))
        .add_kv("t.i64", MetaValue::I64(i64::MIN))
        .add_kv("t.f64", MetaValue::F64(1e6))
        .add_kv(
            "t.strs",
            MetaValue::Array(
                ValueType::String,
                vec![MetaValue::String("a b".into()), MetaValue::String("ü".into()), MetaValue::String("".into())],
            ),
        )
        .add_kv("t.f32s", MetaValue::Array(ValueType::F32, vec![MetaValue::F32(0.5), MetaValue::F32(-2.0)]))
        .add_kv("t.u16s", MetaValue::Array(ValueType::U16, vec![MetaValue::U16(1), MetaValue::U16(65535)]))
        .add_kv(
            "t.nested",
            MetaValue::Array(
                ValueType::Array,
                vec![
                    MetaValue::Array(ValueType::I32, vec![MetaValue::I32(1), MetaValue::I32(-2)]),
                    MetaValue::Array(ValueType::String, vec![MetaValue::String("x".into())]),
                    MetaValue::Array(ValueType::Bool, vec![]),
                ],
            ),
        )
        .add_kv("t.empty", MetaValue::Array(ValueType::U8, vec![]));
    w
}

fn with_tensors(mut w: GgufWriter) -> GgufWriter {
    let f32s: Vec<u8> = (0..12).flat_map(|i| (i as f32).to_le_bytes()).collect();
    w.add_tensor("a.weight", GgmlType::F32, &[4, 3], f32s);
    w.add_tensor("b.q8", GgmlType::Q8_0, &[64, 2], (0..136u32).map(|i| i as u8).collect());
    w.add_tensor("c.q4k", GgmlType::Q4_K, &[256], vec![7u8; 144]);
    w
}

#[test]
fn round_trip_all_value_types_and_tensors() {
    let w = with_tensors(all_types_writer());
    let bytes = w.to_bytes().unwrap();
    let f = GgufFile::from_bytes(bytes.clone()).unwrap();
    assert_eq!(f.version(), 3);
    assert_eq!(f.alignment(), 32);
    assert_eq!(f.data_offset() % 32, 0);
    assert_eq!(f.metadata().len(), 17);
    for (k, v) in w.metadata().iter() {
        assert_eq!(f.get(k), Some(v), "{k}");
    }
    assert_eq!(f.tensors().len(), 3);
    let a = f.tensor("a.weight").unwrap();
    assert_eq!(a.info.dims, vec![4, 3]);
    assert_eq!(a.info.n_bytes, 48);
    assert_eq!(a.info.n_rows(), 3);
    assert_eq!(f32::from_le_bytes(a.data[8..12].try_into().unwrap()), 2.0);
    assert_eq!(a.file_offset, f.data_offset());
    let b = f.tensor("b.q8").unwrap();
    assert_eq!(b.info.offset, 64); // 48 padded to 64
    assert_eq!(b.data.len(), 68 * 2);
    assert_eq!(b.data[5], 5);
    let c = f.tensor("c.q4k").unwrap();
    assert_eq!(c.info.ty, GgmlType::Q4_K);
    assert!(c.data.iter().all(|&x| x == 7));
    // The view borrows the buffer: same address range.
    let base = f.bytes().as_ptr() as usize;
    assert_eq!(c.data.as_ptr() as usize - base, c.file_offset as usize);
    // Writing what we read reproduces the same bytes.
    let mut w2 = GgufWriter::new();
    for (k, v) in f.metadata() {
        w2.add_kv(k.clone(), v.clone());
    }
    for v in f.views() {
        w2.add_tensor(v.info.name.clone(), v.info.ty, &v.info.dims, v.data.to_vec());
    }
    assert_eq!(w2.to_bytes().unwrap(), bytes);
}

#[test]
fn typed_accessors_accept_any_integer_width() {
    let f = GgufFile::from_bytes(all_types_writer().to_bytes().unwrap()).unwrap();
    assert_eq!(f.get_u64("t.u8").unwrap(), Some(200));
    assert_eq!(f.get_u64("t.u16").unwrap(), Some(60000));
    assert_eq!(f.get_u64("t.u32").unwrap(), Some(4_000_000_000));
    assert_eq!(f.get_u64("t.u64").unwrap(), Some(u64::MAX));
    assert!(matches!(f.get_u64("t.i8"), Err(GgufError::OutOfRange { .. })));
    assert_eq!(f.get_i64("t.i64").unwrap(), Some(i64::MIN));
    assert!(matches!(f.get_i64("t.u64"), Err(GgufError::OutOfRange { .. })));
    assert!(matches!(f.get_u64("t.f32"), Err(GgufError::TypeMismatch { .. })));
    assert_eq!(f.get_u64("missing").unwrap(), None);
    assert_eq!(f.get_f32("t.f32").unwrap(), Some(1.5e-6));
    assert_eq!(f.get_f32("t.f64").unwrap(), Some(1e6));
    assert_eq!(f.get_bool("t.bool").unwrap(), Some(true));
    assert_eq!(f.get_str("general.architecture").unwrap(), Some("llama"));
    assert!(f.get_str("t.u8").is_err());
    assert_eq!(f.get_str_array("t.strs").unwrap(), Some(vec!["a b", "ü", ""]));
    assert_eq!(f.get_f32_array("t.f32s").unwrap(), Some(vec![0.5, -2.0]));
    assert_eq!(f.get_i32_array("t.u16s").unwrap(), Some(vec![1, 65535]));
    assert_eq!(f.get_u64_array("t.u16s").unwrap(), Some(vec![1, 65535]));
    assert!(f.get_i32_array("t.strs").is_err());
    assert!(f.get_str_array("t.nested").is_err());
    let msg = f.get_str("t.nested").unwrap_err().to_string();
    assert!(msg.contains("t.nested") && msg.contains("array of array"), "{msg}");
}

#[test]
fn version_2_and_custom_alignment() {
    let mut w = with_tensors(GgufWriter::new());
    w.set_version(2).add_kv("general.alignment", MetaValue::U32(256));
    let f = GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap();
    assert_eq!(f.version(), 2);
    assert_eq!(f.alignment(), 256);
    assert_eq!(f.data_offset() % 256, 0);
    for t in f.tensors() {
        assert_eq!(t.offset % 256, 0);
    }
}

#[test]
fn open_maps_a_file() {
    let dir = std::env::temp_dir().join(format!("lode-gguf-unit-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("t.gguf");
    with_tensors(all_types_writer()).write_to(&path).unwrap();
    let f = GgufFile::open(&path).unwrap();
    assert_eq!(f.tensors().len(), 3);
    assert_eq!(f.tensor("c.q4k").unwrap().data.len(), 144);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn gguf_file_is_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<GgufFile>();
    check::<TensorView<'static>>();
}

#[test]
fn writer_rejects_wrong_data_length() {
    let mut w = GgufWriter::new();
    w.add_tensor("x", GgmlType::Q8_0, &[32], vec![0; 33]);
    let e = w.to_bytes().unwrap_err();
    assert!(matches!(e, GgufError::ByteSizeMismatch { expected: 34, got: 33, .. }), "{e}");
}
