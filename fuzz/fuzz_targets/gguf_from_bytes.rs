//! Any byte string given to `GgufFile::from_bytes` returns `Ok` or `Err`; when it returns
//! `Ok`, every tensor view lies inside the buffer and every accessor returns.
#![no_main]

use libfuzzer_sys::fuzz_target;
use lode_runtime::gguf::GgufFile;

fuzz_target!(|data: &[u8]| {
    let len = data.len() as u64;
    let Ok(f) = GgufFile::from_bytes(data.to_vec()) else { return };
    for (k, _) in f.metadata() {
        let _ = (f.get_u64(k), f.get_i64(k), f.get_f32(k), f.get_bool(k), f.get_str(k));
        let _ = (f.get_str_array(k), f.get_f32_array(k), f.get_i32_array(k), f.get_u64_array(k));
    }
    for v in f.views() {
        assert_eq!(v.data.len() as u64, v.info.n_bytes);
        assert!(v.file_offset + v.info.n_bytes <= len);
    }
});
