//! Random damage to a valid file's header, metadata and tensor-info region: the reader
//! must return (never panic), and whatever it accepts must still be self-consistent
//! (every view inside the buffer, every accessor callable). The cargo-fuzz target in
//! `fuzz/` drives the same entry point with coverage guidance.

mod gguf_common;

use gguf_common::{regions, small_valid};
use lode_runtime::gguf::GgufFile;
use proptest::prelude::*;

/// Parse, and if accepted, touch everything a caller could touch.
fn exercise(bytes: Vec<u8>) {
    let len = bytes.len() as u64;
    let Ok(f) = GgufFile::from_bytes(bytes) else { return };
    for (k, _) in f.metadata() {
        let _ = (f.get_u64(k), f.get_i64(k), f.get_f32(k), f.get_bool(k), f.get_str(k));
        let _ = (f.get_str_array(k), f.get_f32_array(k), f.get_i32_array(k), f.get_u64_array(k));
        let _ = f.get(k).map(|v| v.to_string());
    }
    for v in f.views() {
        assert_eq!(v.data.len() as u64, v.info.n_bytes);
        assert!(v.file_offset + v.info.n_bytes <= len);
        assert_eq!(v.info.offset % f.alignment(), 0);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    /// Overwrite 1..8 bytes anywhere before the data section.
    #[test]
    fn overwritten_bytes_never_panic(edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8)) {
        let mut b = small_valid();
        let (_, data) = regions(&b);
        for (i, v) in edits {
            b[i.index(data)] = v;
        }
        exercise(b);
    }

    /// Overwrite bytes in the tensor-info region only, with values biased toward
    /// structural extremes (0, 0xff, small counts).
    #[test]
    fn damaged_tensor_infos_never_panic(
        edits in prop::collection::vec((any::<prop::sample::Index>(), prop_oneof![Just(0u8), Just(0xff), Just(0x80), 0u8..16, any::<u8>()]), 1..6)
    ) {
        let mut b = small_valid();
        let (infos, data) = regions(&b);
        for (i, v) in edits {
            b[infos + i.index(data - infos)] = v;
        }
        exercise(b);
    }

    /// Overwrite one little-endian u64 field-sized window with an extreme value (lengths,
    /// counts, offsets, dims).
    #[test]
    fn extreme_u64_fields_never_panic(at in any::<prop::sample::Index>(), v in prop_oneof![Just(u64::MAX), Just(i64::MAX as u64), Just(1u64 << 32), Just(1u64 << 62), 0u64..64, any::<u64>()]) {
        let mut b = small_valid();
        let (_, data) = regions(&b);
        let at = 8 + at.index(data - 16);
        b[at..at + 8].copy_from_slice(&v.to_le_bytes());
        exercise(b);
    }

    /// Insert or delete a run of bytes before the data section (shifts every field).
    #[test]
    fn shifted_layout_never_panics(at in any::<prop::sample::Index>(), n in 1usize..40, insert in any::<bool>(), fill in any::<u8>()) {
        let mut b = small_valid();
        let (_, data) = regions(&b);
        let at = at.index(data);
        if insert {
            b.splice(at..at, std::iter::repeat(fill).take(n));
        } else {
            b.drain(at..(at + n).min(b.len()));
        }
        exercise(b);
    }

    /// Random bytes behind a valid magic and version.
    #[test]
    fn random_bodies_never_panic(version in 2u32..4, body in prop::collection::vec(any::<u8>(), 0..400)) {
        let mut b = b"GGUF".to_vec();
        b.extend_from_slice(&version.to_le_bytes());
        b.extend_from_slice(&body);
        exercise(b);
    }
}
