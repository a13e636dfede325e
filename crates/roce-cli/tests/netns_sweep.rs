//! The size sweep `-a` of every `rocev2 perf` test over every transport perftest allows it on, between two processes
//! in two network namespaces joined by a veth pair (1500-byte link MTU, so PMTU 1024 and UD up to 1024 bytes): the
//! way a user runs it on two hosts, server `rocev2 perf TEST` and client `rocev2 perf TEST SERVER -a`. Each run
//! must end with both exit codes 0 and, on both sides, one verified JSON result per size in order. The loopback
//! version of the sweep is `perf_sweep.rs`. Needs root and `ip netns` (otherwise prints why it skips and passes).

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{
    NetnsPair, Proc, SweepCase, netns_unavailable, scratch, serial, strings, sweep_cases,
};

const PMTU: u64 = 1024;

/// Runs `case` with `-a -n 5` from namespace B (client) to A (server) on TCP `port`; panics with both outputs on a
/// failure.
fn sweep(ns: &NetnsPair, dir: &Path, port: u16, case: &SweepCase) {
    let label = format!("{}-{}", case.test, case.conn);
    let p = port.to_string();
    let srv = strings(&[
        "perf",
        case.test,
        "--ip",
        &ns.ip_a,
        "-p",
        &p,
        "--json",
        "--timeout",
        "60",
    ]);
    let mut server = Proc::spawn(
        &format!("server-{label}"),
        dir,
        &NetnsPair::argv(&ns.a, &srv),
    );
    common::wait_socket(
        &mut server,
        "tcp",
        ns.octets_a(),
        port,
        Duration::from_secs(20),
    );
    let cli = strings(&[
        "perf",
        case.test,
        &ns.ip_a,
        "-p",
        &p,
        "--ip",
        &ns.ip_b,
        "-a",
        "-n",
        "5",
        "-c",
        case.conn,
        "--json",
        "--timeout",
        "30",
    ]);
    let t0 = Instant::now();
    let client = Proc::spawn(
        &format!("client-{label}"),
        dir,
        &NetnsPair::argv(&ns.b, &cli),
    )
    .wait(Duration::from_secs(180));
    let server = server.wait(Duration::from_secs(30));
    assert!(
        client.status.success() && server.status.success(),
        "{label}:\nclient {client}\nserver {server}"
    );
    case.check(&client.json_lines(), PMTU, 5);
    case.check(&server.json_lines(), PMTU, 5);
    eprintln!("{label}: {:?}", t0.elapsed());
}

#[test]
fn every_test_sweeps_all_sizes_between_namespaces() {
    if let Some(why) = netns_unavailable() {
        eprintln!("SKIPPED (netns_sweep): {why}; these tests need root and `ip netns`");
        return;
    }
    let _serial = serial();
    let ns = NetnsPair::up("sweep", "198.18.32.1", "198.18.32.2", 1500);
    let dir = scratch("netns-sweep");
    let mut failed = Vec::new();
    for (i, c) in sweep_cases().iter().enumerate() {
        let r = std::panic::catch_unwind(|| sweep(&ns, &dir, 19300 + i as u16, c));
        if r.is_err() {
            failed.push(format!("{} {}", c.test, c.conn));
        }
    }
    assert!(failed.is_empty(), "sweeps failed: {failed:?}");
}
