//! The shipped binary has no link-time dependency on any GPU library: CUDA and HIP are
//! opened at run time (DESIGN decision 1). Reads the ELF dynamic section's DT_NEEDED
//! entries of the built `lode` binary.

use std::convert::TryInto;

fn u16le(b: &[u8], o: usize) -> u64 {
    u16::from_le_bytes(b[o..o + 2].try_into().unwrap()) as u64
}
fn u32le(b: &[u8], o: usize) -> u64 {
    u32::from_le_bytes(b[o..o + 4].try_into().unwrap()) as u64
}
fn u64le(b: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(b[o..o + 8].try_into().unwrap())
}

/// DT_NEEDED library names of a 64-bit little-endian ELF file.
fn needed_libs(elf: &[u8]) -> Vec<String> {
    assert_eq!(&elf[..4], b"\x7fELF", "not an ELF file");
    assert_eq!(elf[4], 2, "expected a 64-bit ELF");
    let phoff = u64le(elf, 0x20) as usize;
    let phentsize = u16le(elf, 0x36) as usize;
    let phnum = u16le(elf, 0x38) as usize;
    let segs: Vec<(u64, u64, u64, u64)> = (0..phnum)
        .map(|i| {
            let p = phoff + i * phentsize;
            // (type, offset, vaddr, filesz)
            (u32le(elf, p), u64le(elf, p + 8), u64le(elf, p + 16), u64le(elf, p + 32))
        })
        .collect();
    let vaddr_to_off = |va: u64| segs.iter().find(|s| s.0 == 1 && va >= s.2 && va < s.2 + s.3).map(|s| (va - s.2 + s.1) as usize);
    let Some(dynseg) = segs.iter().find(|s| s.0 == 2) else { return vec![] }; // static binary
    let (mut strtab, mut needed) = (0u64, Vec::new());
    let mut o = dynseg.1 as usize;
    loop {
        let tag = u64le(elf, o);
        let val = u64le(elf, o + 8);
        match tag {
            0 => break,
            1 => needed.push(val),
            5 => strtab = val,
            _ => {}
        }
        o += 16;
    }
    let base = vaddr_to_off(strtab).expect("DT_STRTAB inside a loaded segment");
    needed
        .into_iter()
        .map(|n| {
            let s = base + n as usize;
            let end = elf[s..].iter().position(|&b| b == 0).unwrap() + s;
            String::from_utf8_lossy(&elf[s..end]).into_owned()
        })
        .collect()
}

#[test]
fn lode_binary_links_no_gpu_library() {
    let bin = env!("CARGO_BIN_EXE_lode");
    let elf = std::fs::read(bin).expect("read the lode binary");
    let libs = needed_libs(&elf);
    assert!(libs.iter().any(|l| l.starts_with("libc.so")), "DT_NEEDED parse looks wrong: {libs:?}");
    for l in &libs {
        for bad in ["libcuda", "libcudart", "libnvrtc", "libamdhip64", "libhiprtc", "libhsa-runtime"] {
            assert!(!l.starts_with(bad), "lode links {l} at build time; GPU runtimes must be opened at run time");
        }
    }
}
