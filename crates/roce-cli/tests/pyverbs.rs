//! rdma-core's own verbs test suite (the `tests/` directory of rdma-core v44.0, run with Debian 12's unmodified
//! python3-pyverbs 44) on rocev2 under `rocev2 run` with the device on a loopback address (issue #16): first every
//! test module in its own process, then the whole suite in one process. Each run must end with 0 failures and
//! 0 errors, and every skip must give a reason listed in `tests/pyverbs_allowed_skips.txt` (hardware this
//! product does not emulate, or a named gap). docs/TESTING.md lists the counts and the reasons.
//!
//! The suite is rdma-core's code and is not kept in this repository: Debian's python3-pyverbs 44.0 ships rdma-core
//! v44.0's `tests/` (identical to the v44.0 tag's, without its CMakeLists.txt) under `/usr/share/doc/rdma-core/tests`,
//! some files gzipped; the test copies it into a scratch directory and unpacks them. `ROCEV2_PYVERBS_TESTS` names
//! another copy instead. The test is skipped with the reason when neither is there or `/usr/bin/python3` cannot
//! import pyverbs (install Debian's `python3-pyverbs`; `.ci/run` does).
//!
//! `test_rdmacm` forks a passive and an active process from the suite's process (which has opened the device) for
//! each test; they connect through rdma_cm on the device's netdev address, 127.0.0.1 here, which stands for the
//! device on 127.0.203.1 (the path goes to the device's own address: `docs/RDMACM.md` §5; issues #16, #17). Its
//! multicast tests join 230.0.0.1 from both processes (`rdma_join_multicast`; the device's link joins the IP group).
//! Binds UDP 4791 on 127.0.203.1 and 230.0.0.1. Each process is bounded by [`LIMIT`].

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::{Proc, scratch, serial};

const IP: &str = "127.0.203.1";
const PYTHON: &str = "/usr/bin/python3";
/// Bound of one suite process (the whole suite takes a few seconds on the 2-core CI machine).
const LIMIT: Duration = Duration::from_secs(300);
/// Modules not run, with the reason (printed).
const NOT_RUN: &[(&str, &str)] = &[];

/// Where Debian's python3-pyverbs puts rdma-core's `tests/`.
const DEBIAN_SUITE: &str = "/usr/share/doc/rdma-core/tests";

/// A runnable copy of the suite in `scratch` (or the directory `ROCEV2_PYVERBS_TESTS` names), or why the test is
/// skipped.
fn suite(scratch: &Path) -> Result<PathBuf, String> {
    let ok = Command::new(PYTHON)
        .args(["-c", "import pyverbs.device"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        return Err(format!(
            "{PYTHON} cannot import pyverbs: install Debian's python3-pyverbs (.ci/run does)"
        ));
    }
    if let Some(dir) = std::env::var_os("ROCEV2_PYVERBS_TESTS") {
        let dir = PathBuf::from(dir);
        return if dir.join("run_tests.py").is_file() {
            Ok(dir)
        } else {
            Err(format!(
                "ROCEV2_PYVERBS_TESTS={} has no run_tests.py",
                dir.display()
            ))
        };
    }
    let src = Path::new(DEBIAN_SUITE);
    if !src.join("run_tests.py").is_file() {
        return Err(format!(
            "{DEBIAN_SUITE} has no run_tests.py (Debian's python3-pyverbs ships it)"
        ));
    }
    let dir = scratch.join("tests");
    std::fs::create_dir_all(&dir).expect("suite copy dir");
    for e in std::fs::read_dir(src).expect("read the suite") {
        let p = e.expect("entry").path();
        let name = p
            .file_name()
            .and_then(|n| n.to_str())
            .expect("file name")
            .to_owned();
        if let Some(stem) = name.strip_suffix(".gz") {
            let out = Command::new("gzip")
                .arg("-dc")
                .arg(&p)
                .output()
                .expect("run gzip");
            assert!(out.status.success(), "gzip -dc {}", p.display());
            std::fs::write(dir.join(stem), out.stdout).expect("write the unpacked file");
        } else if p.is_file() {
            std::fs::copy(&p, dir.join(&name)).expect("copy a suite file");
        }
    }
    Ok(dir)
}

/// `KIND<TAB>reason<TAB>why` lines of the allowlist: reason → kind.
fn allowed() -> BTreeMap<String, String> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/pyverbs_allowed_skips.txt");
    let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let mut f = l.split('\t');
            let kind = f.next().unwrap_or_default().to_owned();
            let reason = f
                .next()
                .unwrap_or_else(|| panic!("no reason: {l}"))
                .to_owned();
            assert!(f.next().is_some(), "no why: {l}");
            assert!(kind == "hardware" || kind == "gap", "kind {kind}: {l}");
            (reason, kind)
        })
        .collect()
}

/// What one unittest run reported.
#[derive(Debug, Default)]
struct Outcome {
    ran: u64,
    failures: u64,
    errors: u64,
    /// Skip reason → count.
    skips: BTreeMap<String, u64>,
}

/// Parses unittest's verbose output: `... skipped 'REASON'` lines, `Ran N tests`, and the
/// `OK (skipped=K)` / `FAILED (failures=F, errors=E, skipped=K)` line.
fn parse(text: &str) -> Outcome {
    let mut o = Outcome::default();
    for line in text.lines() {
        if let Some(i) = line.find(" ... skipped '") {
            let r = line[i + " ... skipped '".len()..].trim_end();
            let r = r.strip_suffix('\'').unwrap_or(r);
            *o.skips.entry(r.to_owned()).or_default() += 1;
        } else if let Some(n) = line.strip_prefix("Ran ") {
            o.ran = n
                .split(' ')
                .next()
                .and_then(|x| x.parse().ok())
                .unwrap_or(0);
        } else if line.starts_with("FAILED (") || line.starts_with("OK") {
            for part in line
                .trim_start_matches("FAILED (")
                .trim_start_matches("OK (")
                .trim_end_matches(')')
                .split(", ")
            {
                let n = |k: &str| {
                    part.strip_prefix(k)
                        .and_then(|x| x.parse().ok())
                        .unwrap_or(0)
                };
                o.failures += n("failures=");
                o.errors += n("errors=");
            }
        }
    }
    o
}

/// Runs `run_tests.py -v NAMES…` under `rocev2 run` and checks its outcome.
fn run(
    dir: &Path,
    scratch: &Path,
    label: &str,
    names: &[String],
    allowed: &BTreeMap<String, String>,
) -> Outcome {
    let mut argv: Vec<String> = [common::bin(), "run", "--ip", IP, "--", PYTHON]
        .iter()
        .map(|s| s.to_string())
        .collect();
    argv.push(dir.join("run_tests.py").to_string_lossy().into_owned());
    argv.push("-v".into());
    argv.extend(names.iter().cloned());
    let t0 = Instant::now();
    let fin = Proc::spawn(label, scratch, &argv).wait(LIMIT);
    let o = parse(&fin.stderr);
    eprintln!(
        "{label}: ran {} in {:.1} s, {} failures, {} errors, {} skipped",
        o.ran,
        t0.elapsed().as_secs_f64(),
        o.failures,
        o.errors,
        o.skips.values().sum::<u64>()
    );
    assert!(o.ran > 0, "{label}: no test ran\n{fin}");
    assert!(
        o.failures == 0 && o.errors == 0 && fin.status.success(),
        "{label}: {o:?}\n{fin}"
    );
    let unknown: Vec<_> = o
        .skips
        .keys()
        .filter(|r| !allowed.contains_key(*r))
        .collect();
    assert!(
        unknown.is_empty(),
        "{label}: skips not in the allowlist: {unknown:?}\n{fin}"
    );
    o
}

#[test]
fn rdma_core_pyverbs_suite_passes_under_rocev2_run() {
    let out = scratch("pyverbs");
    let dir = match suite(&out) {
        Ok(d) => d,
        Err(why) => {
            eprintln!("skipped: {why}");
            let _ = std::fs::remove_dir_all(&out);
            return;
        }
    };
    common::c_libraries();
    let _turn = serial();
    let allowed = allowed();
    let mut modules: Vec<String> = std::fs::read_dir(&dir)
        .expect("read the suite's directory")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter_map(|n| n.strip_suffix(".py").map(str::to_owned))
        .filter(|n| n.starts_with("test_"))
        .collect();
    modules.sort();
    for (m, why) in NOT_RUN {
        eprintln!("not run: {m}: {why}");
    }
    modules.retain(|m| !NOT_RUN.iter().any(|(n, _)| n == m));
    let mut per_module = Outcome::default();
    for m in &modules {
        let o = run(&dir, &out, m, std::slice::from_ref(m), &allowed);
        per_module.ran += o.ran;
        for (r, n) in o.skips {
            *per_module.skips.entry(r).or_default() += n;
        }
    }
    let whole = run(&dir, &out, "whole-suite", &modules, &allowed);
    assert_eq!(
        whole.ran, per_module.ran,
        "the whole suite ran as many tests as the modules one by one"
    );
    for (r, n) in &whole.skips {
        eprintln!("skipped {n:3} × [{}] {r}", allowed[r]);
    }
    let _ = std::fs::remove_dir_all(&out);
}
