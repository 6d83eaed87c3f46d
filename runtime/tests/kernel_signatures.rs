//! Every kernel's typed launch arguments (`kernel_args!` in `backend/gpu/family/`) match
//! the parameter list of its C declaration, read from the preprocessed `kernels-hip/`
//! sources by `ci/kernel-signatures.py` (clang-19's preprocessor expands the macros that
//! stamp out kernels); and every kernel a source exports is declared by its family. A
//! launch whose arguments drifted from its kernel would pass garbage on the device, and no
//! compiler sees both sides; this test does.

use lode_runtime::backend::gpu::family;
use lode_runtime::backend::gpu::launch::ArgKind;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

fn kind(s: &str) -> ArgKind {
    match s {
        "ptr" => ArgKind::Ptr,
        "i32" => ArgKind::I32,
        "u32" => ArgKind::U32,
        "f32" => ArgKind::F32,
        other => panic!("unknown parameter kind {other}"),
    }
}

/// (family, kernel) → parameter kinds, from the sources.
fn source_signatures() -> Option<BTreeMap<(String, String), Vec<ArgKind>>> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let clang = ["clang-19", "/opt/rocm/llvm/bin/clang"].into_iter().find(|c| Command::new(c).arg("--version").output().is_ok_and(|o| o.status.success()))?;
    let out = Command::new("python3").arg(root.join("ci/kernel-signatures.py")).arg(clang).arg(root.join("kernels-hip")).output().ok()?;
    assert!(out.status.success(), "kernel-signatures.py failed:\n{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).expect("utf-8");
    let mut m = BTreeMap::new();
    for line in text.lines() {
        let mut it = line.split(' ');
        let (fam, name, kinds) = (it.next().unwrap(), it.next().unwrap(), it.next().unwrap_or(""));
        let kinds = if kinds.is_empty() { vec![] } else { kinds.split(',').map(kind).collect() };
        m.insert((fam.to_string(), name.to_string()), kinds);
    }
    Some(m)
}

#[test]
fn launch_arguments_match_the_kernel_declarations() {
    let Some(src) = source_signatures() else {
        eprintln!("SKIP: clang-19 or python3 not found (CI installs both)");
        return;
    };
    assert!(src.len() > 100, "only {} kernels found in the sources", src.len());
    let mut declared = 0;
    for fam in family::ALL {
        for sig in fam.sigs() {
            let key = (fam.name.to_string(), sig.name.to_string());
            let want = src.get(&key).unwrap_or_else(|| panic!("{}: kernel {} is declared in Rust but not exported by kernels-hip/{}.hip", fam.name, sig.name, fam.name));
            assert_eq!(sig.args, &want[..], "{}: {}'s Rust arguments differ from its C parameters", fam.name, sig.name);
            declared += 1;
        }
    }
    for (fam, name) in src.keys() {
        let f = family::ALL.iter().find(|f| f.name == fam).unwrap_or_else(|| panic!("kernels-hip/{fam}.hip has no family module"));
        assert!(f.kernel_names().any(|n| n == name), "{fam}: kernel {name} is exported by the source but no launcher declares it");
    }
    assert_eq!(declared, src.len());
}

/// The comparison can fail: a kind list off by one parameter is caught.
#[test]
fn a_drifted_argument_list_is_caught() {
    let Some(src) = source_signatures() else { return };
    let want = &src[&("quantize".to_string(), "quantize_q8_1".to_string())];
    let sig = family::quantize::FAMILY.sigs().find(|s| s.name == "quantize_q8_1").unwrap();
    assert_eq!(sig.args, &want[..]);
    assert_ne!(&sig.args[..sig.args.len() - 1], &want[..]);
}
