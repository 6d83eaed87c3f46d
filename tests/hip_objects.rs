//! The AMD code objects build.rs embedded (with Debian's clang-19 in CI) are real gfx11
//! code objects exporting every kernel the runtime looks up. `ci/check-hip-objects.sh`
//! additionally disassembles them (WMMA instructions in the GEMM family).
//! Skips with a note where no AMD code objects were built (no clang on this machine).

include!(concat!(env!("OUT_DIR"), "/kernels_embedded.rs"));

/// Names in the ELF symbol table (.symtab / .dynsym) of a 64-bit LE ELF.
fn elf_symbols(elf: &[u8]) -> Vec<String> {
    let r16 = |o: usize| u16::from_le_bytes([elf[o], elf[o + 1]]) as usize;
    let r32 = |o: usize| u32::from_le_bytes(elf[o..o + 4].try_into().unwrap()) as usize;
    let r64 = |o: usize| u64::from_le_bytes(elf[o..o + 8].try_into().unwrap()) as usize;
    let (shoff, shentsize, shnum) = (r64(0x28), r16(0x3a), r16(0x3c));
    let sh = |i: usize| shoff + i * shentsize;
    let mut out = Vec::new();
    for i in 0..shnum {
        let ty = r32(sh(i) + 4);
        if ty != 2 && ty != 11 {
            continue; // SHT_SYMTAB / SHT_DYNSYM
        }
        let (off, size, link, entsize) = (r64(sh(i) + 24), r64(sh(i) + 32), r32(sh(i) + 40), r64(sh(i) + 56));
        let stroff = r64(sh(link) + 24);
        for s in 0..size / entsize.max(1) {
            let name = r32(off + s * entsize) + stroff;
            let end = elf[name..].iter().position(|&b| b == 0).unwrap() + name;
            out.push(String::from_utf8_lossy(&elf[name..end]).into_owned());
        }
    }
    out
}

#[test]
fn amd_code_objects_export_every_kernel() {
    let amd: Vec<_> = EMBEDDED.iter().filter(|(_, a, _)| a.starts_with("gfx")).collect();
    if amd.is_empty() {
        eprintln!("SKIP: no AMD code objects were built (clang-19 not found by build.rs)");
        return;
    }
    for arch in ["gfx1100", "gfx1151"] {
        for fam in lode_runtime::backend::gpu::kernels::FAMILIES {
            let family = &fam.name;
            let (_, _, blob) = amd
                .iter()
                .find(|(f, a, _)| f == family && *a == arch)
                .unwrap_or_else(|| panic!("no {arch} code object for family {family}"));
            assert_eq!(&blob[..4], b"\x7fELF", "{family}.{arch} is not an ELF code object");
            assert_eq!(u16::from_le_bytes([blob[18], blob[19]]), 224, "{family}.{arch}: e_machine is not EM_AMDGPU");
            let syms = elf_symbols(blob);
            for n in fam.kernel_names() {
                assert!(syms.iter().any(|s| s == n), "{family}.{arch} lacks kernel {n}");
                assert!(syms.iter().any(|s| *s == format!("{n}.kd")), "{family}.{arch} lacks kernel descriptor {n}.kd");
            }
        }
    }
}

/// The embedded objects were compiled from the very kernel sources the runtime embeds
/// (a build directory shared between checkouts can hold objects of other sources; the
/// runtime then compiles at run time instead, and this test says so).
#[test]
fn embedded_objects_match_the_embedded_sources() {
    use lode_runtime::backend::gpu::kernels;
    kernels::register_embedded(EMBEDDED, EMBEDDED_SOURCES);
    for f in kernels::FAMILIES {
        let family = f.name;
        assert!(kernels::embedded_matches_sources(family, f.source), "{family}: embedded objects were built from other sources");
    }
    // The check can fail: other sources give another fingerprint.
    assert!(!kernels::embedded_matches_sources("matvec", "// not the matvec source"));
}
