//! The export table of the built `libibverbs.so.1` against what the Debian programs and the provider libraries
//! they load import (`docs/spec/LIBIBVERBS-ABI.md` §1.2–§2.2): every `symbol@IBVERBS_*` that one of them needs
//! from libibverbs must be defined by ours at that version (the loader binds them all before `main`), and the
//! SONAME must be `libibverbs.so.1`. Read with `readelf` (binutils); the binaries come from Debian's
//! `ibverbs-utils`, `perftest` and `ibverbs-providers` (installed by `.ci/run`).

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

fn readelf(args: &[&str], file: &Path) -> String {
    let out = Command::new("readelf")
        .args(args)
        .arg(file)
        .output()
        .expect("readelf (binutils) runs");
    assert!(out.status.success(), "readelf {args:?} {}", file.display());
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `name@VERSION` entries of the dynamic symbol table: defined ones (`@@`, section index ≠ UND) or undefined ones
/// from libibverbs (`@IBVERBS_…`).
fn symbols(file: &Path, defined: bool) -> BTreeSet<String> {
    readelf(&["--dyn-syms", "-W"], file)
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            if f.len() < 8 || (f[6] == "UND") == defined {
                return None;
            }
            let name = f[7].replace("@@", "@");
            let (_, ver) = name.split_once('@')?;
            ver.starts_with("IBVERBS_").then_some(name)
        })
        .collect()
}

fn which(program: &str) -> PathBuf {
    std::env::var_os("PATH")
        .and_then(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join(program))
                .find(|p| p.is_file())
        })
        .unwrap_or_else(|| {
            panic!(
                "{program} not found: install Debian's ibverbs-utils and perftest (.ci/run does)"
            )
        })
}

#[test]
fn every_import_of_the_debian_programs_and_providers_is_exported_at_its_version() {
    let lib = common::library();
    assert!(
        readelf(&["-d"], &lib).contains("Library soname: [libibverbs.so.1]"),
        "SONAME"
    );
    let ours = symbols(&lib, true);
    let mut importers: Vec<PathBuf> = [
        "ibv_devices",
        "ibv_devinfo",
        "ibv_rc_pingpong",
        "ibv_ud_pingpong",
        "ibv_srq_pingpong",
        "ib_send_bw",
        "ib_write_bw",
        "ib_read_bw",
        "ib_atomic_bw",
        "ib_send_lat",
        "ib_write_lat",
        "ib_read_lat",
    ]
    .iter()
    .map(|p| which(p))
    .collect();
    for so in ["libmlx5.so.1", "libefa.so.1", "librdmacm.so.1"] {
        importers.push(Path::new("/usr/lib/x86_64-linux-gnu").join(so));
    }
    let mut needed = BTreeSet::new();
    for f in &importers {
        let imports = symbols(f, false);
        assert!(
            !imports.is_empty(),
            "{} imports nothing from libibverbs?",
            f.display()
        );
        let missing: Vec<_> = imports.difference(&ours).collect();
        assert!(missing.is_empty(), "{} needs {missing:?}", f.display());
        needed.extend(imports);
    }
    assert_eq!(
        needed.len(),
        109,
        "ABI.md §2: 37 + 72 symbols, got {needed:#?}"
    );
}

/// `name@VERSION` (non-default, an old twin) or `name@@VERSION` (default) for every symbol `file` defines in an
/// `IBVERBS_*` node, exactly as `readelf` prints it.
fn exports(file: &Path) -> BTreeSet<String> {
    readelf(&["--dyn-syms", "-W"], file)
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() >= 8 && f[6] != "UND" && f[7].contains("@IBVERBS_")).then(|| f[7].to_string())
        })
        .collect()
}

/// Symbols of Debian's table not exported yet (none: the SRQ verbs landed).
const PENDING: [&str; 0] = [];

#[test]
fn every_export_of_debians_libibverbs_is_ours_at_the_same_version() {
    let debian = Path::new("/usr/lib/x86_64-linux-gnu/libibverbs.so.1");
    assert!(
        debian.is_file(),
        "Debian's libibverbs1 is not installed (.ci/run installs it with ibverbs-utils)"
    );
    let theirs = exports(debian);
    assert_eq!(
        theirs.len(),
        180,
        "Debian 12's libibverbs.so.1 (rdma-core 44): {theirs:#?}"
    );
    assert_eq!(
        theirs.iter().filter(|s| !s.contains("@@")).count(),
        34,
        "33 IBVERBS_1.0 twins + ibv_register_driver@IBVERBS_1.1 (ABI.md §1.3)"
    );
    let ours = exports(&common::library());
    let missing: Vec<_> = theirs
        .difference(&ours)
        .filter(|s| !PENDING.contains(&s.as_str()))
        .collect();
    assert!(missing.is_empty(), "missing from ours: {missing:#?}");
    let extra: Vec<_> = ours.difference(&theirs).collect();
    assert!(
        extra.is_empty(),
        "ours exports more than Debian's: {extra:#?}"
    );
}
