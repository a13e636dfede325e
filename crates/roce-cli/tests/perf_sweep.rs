//! The size sweep `-a` of every `rocev2 perf` test over every transport perftest allows it on (RC, UC, UD), with
//! both ends in one process over real UDP sockets (`--loopback`). A sweep exercises what a single size does not:
//! state carried from one size to the next (receive WRs posted for the previous size, queue accounting, buffers
//! sized for the largest message). Each run must end with exit 0 and one verified JSON result per size, in order.
//!
//! `-n 5` (perftest's minimum) keeps the 8 MiB end of the sweep quick; UD stops at the MTU (4096 on loopback).
//! The same sweep between two network namespaces is in `netns_e2e.rs` (`every_test_sweeps_all_sizes_between_namespaces`).

mod common;

use common::{SweepCase, sweep_cases};
use serde_json::Value;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// The bound of one sweep or README example run: 600 s; the slowest measured was 30 s (the write-lat sweep, debug
/// build, load average 12 on the 2-core development machine); 23 sizes up to 8 MiB stretch more under load than
/// one run does.
const SWEEP: Duration = Duration::from_secs(600);

/// Runs `case` with `-a` over loopback pair `127.0.<net>.1/.2` and checks every size (panics with the run's
/// output on a failure).
fn sweep_loopback(case: &SweepCase, net: u8) {
    let ips = common::loopback_ips(net);
    let args = [
        "perf",
        case.test,
        "--loopback",
        "--loopback-ips",
        &ips,
        "-a",
        "-n",
        "5",
        "-c",
        case.conn,
        "--json",
        "--timeout",
        "20",
    ];
    let t0 = Instant::now();
    let out = common::output_within(Command::new(common::bin()).args(args), SWEEP);
    let took = t0.elapsed();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{args:?} failed ({:?}) after {took:?}:\n{stdout}\n{stderr}",
        out.status
    );
    let lines: Vec<Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    case.check(&lines, 4096, 5);
    eprintln!(
        "{} {}: {} sizes in {took:?}",
        case.test,
        case.conn,
        lines.len()
    );
    assert!(took < Duration::from_secs(120), "{args:?} took {took:?}");
}

/// Runs every case `pick` selects (all of them, so one failure does not hide the next) and fails listing those
/// that failed.
fn sweep_all(pick: impl Fn(&SweepCase) -> bool, first_net: u8) {
    let _serial = common::serial();
    let mut failed = Vec::new();
    for (i, c) in sweep_cases().iter().filter(|c| pick(c)).enumerate() {
        let r = std::panic::catch_unwind(|| sweep_loopback(c, first_net + i as u8));
        if r.is_err() {
            failed.push(format!("{} {}", c.test, c.conn));
        }
    }
    assert!(failed.is_empty(), "sweeps failed: {failed:?}");
}

#[test]
fn every_test_sweeps_all_sizes_over_loopback_rc() {
    sweep_all(|c| c.conn == "RC", 60);
}

#[test]
fn every_test_sweeps_all_sizes_over_loopback_uc_ud() {
    sweep_all(|c| c.conn != "RC", 70);
}

/// The README's perftest examples: every line of the block after the `perf-examples` marker runs as written (with
/// this build's binary) and exits 0, so the commands a new user copies keep working.
#[test]
fn readme_commands_run() {
    let _serial = common::serial();
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md"))
            .expect("README.md");
    let block: Vec<&str> = readme
        .lines()
        .skip_while(|l| !l.contains("<!-- perf-examples"))
        .skip(2) // the marker and the opening fence
        .take_while(|l| !l.starts_with("```"))
        .collect();
    assert!(
        block.len() >= 10,
        "the README's perf-examples block is missing or short"
    );
    let mut failed = Vec::new();
    for line in &block {
        let cmd = line.split('#').next().unwrap_or("").trim();
        let mut words = cmd.split_whitespace();
        assert_eq!(words.next(), Some("target/release/rocev2"), "{line}");
        let args: Vec<&str> = words.collect();
        let t0 = Instant::now();
        let out = common::output_within(Command::new(common::bin()).args(&args), SWEEP);
        eprintln!("{cmd}: {:?} in {:?}", out.status.code(), t0.elapsed());
        if !out.status.success() {
            failed.push(format!(
                "{cmd}: {:?} after {:?}\n--- stdout\n{}--- stderr\n{}",
                out.status,
                t0.elapsed(),
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
    }
    assert!(
        failed.is_empty(),
        "README commands failed:\n{}",
        failed.join("\n")
    );
}
