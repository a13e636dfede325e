//! The built `librdmacm.so.1` against Debian 12's (`docs/spec/LIBRDMACM-ABI.md` §1–§2): the same SONAME, the same
//! 68 symbols each at the same version node, and a `DT_NEEDED` on `libibverbs.so.1` (so the program's libibverbs —
//! rocev2's under `rocev2 run` — is the one it calls), its `ibv_*` imports versioned as Debian's are (an
//! unversioned one would bind to an `IBVERBS_1.0` twin). Needs `readelf` and Debian's `librdmacm1`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

fn readelf(args: &[&str], file: &Path) -> String {
    let out = Command::new("readelf")
        .args(args)
        .arg(file)
        .output()
        .expect("readelf runs (binutils)");
    assert!(out.status.success(), "readelf {args:?} {}", file.display());
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `name@@VERSION` of every symbol `file` defines in an `RDMACM_*` node.
fn exports(file: &Path) -> BTreeSet<String> {
    readelf(&["--dyn-syms", "-W"], file)
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() >= 8 && f[6] != "UND" && f[7].contains("@RDMACM_")).then(|| f[7].to_string())
        })
        .collect()
}

/// `name@VERSION` of every `ibv_*` function `file` imports.
fn ibv_imports(file: &Path) -> BTreeSet<String> {
    readelf(&["--dyn-syms", "-W"], file)
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() >= 8 && f[6] == "UND" && f[7].starts_with("ibv_")).then(|| f[7].to_string())
        })
        .collect()
}

fn ours() -> PathBuf {
    let mut cmd = Command::new(env!("CARGO"));
    cmd.args(["build", "-p", "roce-rdmacm"]);
    if !cfg!(debug_assertions) {
        cmd.arg("--release");
    }
    assert!(cmd.status().expect("cargo build").success());
    let exe = std::env::current_exe().expect("test path");
    let lib = exe
        .parent()
        .and_then(Path::parent)
        .expect("profile dir")
        .join("libroce_rdmacm.so");
    assert!(lib.is_file(), "{} missing", lib.display());
    lib
}

const DEBIAN: &str = "/usr/lib/x86_64-linux-gnu/librdmacm.so.1";

#[test]
fn every_export_of_debians_librdmacm_is_ours_at_the_same_version() {
    let debian = Path::new(DEBIAN);
    assert!(
        debian.is_file(),
        "Debian's librdmacm1 is not installed (.ci/run installs it with rdmacm-utils)"
    );
    let theirs = exports(debian);
    assert_eq!(
        theirs.len(),
        68,
        "Debian 12's librdmacm.so.1 (rdma-core 44): {theirs:#?}"
    );
    let ours_lib = ours();
    let mine = exports(&ours_lib);
    let missing: Vec<_> = theirs.difference(&mine).collect();
    let extra: Vec<_> = mine.difference(&theirs).collect();
    assert!(missing.is_empty(), "missing from ours: {missing:#?}");
    assert!(
        extra.is_empty(),
        "ours exports more than Debian's: {extra:#?}"
    );
}

#[test]
fn soname_needed_and_versioned_ibverbs_imports_as_debians() {
    let lib = ours();
    let dynamic = readelf(&["-d", "-W"], &lib);
    assert!(
        dynamic.contains("Library soname: [librdmacm.so.1]"),
        "{dynamic}"
    );
    assert!(
        dynamic.contains("Shared library: [libibverbs.so.1]"),
        "{dynamic}"
    );
    let mine = ibv_imports(&lib);
    assert!(!mine.is_empty());
    let theirs = ibv_imports(Path::new(DEBIAN));
    for imp in &mine {
        assert!(imp.contains("@IBVERBS_"), "unversioned import {imp}");
        assert!(
            theirs.contains(imp),
            "{imp} is not imported at that version by Debian's librdmacm: {theirs:#?}"
        );
    }
}
