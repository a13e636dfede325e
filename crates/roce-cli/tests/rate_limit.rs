//! `rocev2 perf --rate-limit` on the real wire (issue #12): server and client in two network namespaces joined by a
//! veth pair (9000-byte MTU, RoCE PMTU 4096), the client's QP limited by the engine's token-bucket shaper
//! (`roce_proto::sched`). What the receiver got over the run — the server's `rcvd_bytes` (whole frames, the unit
//! `--rate-limit` is in) over the client's elapsed time — must be within 3 % of the limit, at 1 Gb/s and at
//! 0.5 Gb/s (the second run shows the limit, not the machine, sets the rate). Data verification stays on.
//!
//! The bucket is 2 MB deep (`--burst`, 16 ms at 1 Gb/s) instead of the default 187.5 KB: the thread that drives the
//! engine of this software NIC (the client's own thread in the default run-to-completion mode, `--progress caller`;
//! the progress thread with `--progress thread`) shares two cores with the other side (and, on a development
//! machine, with builds), and is descheduled for milliseconds at a time; tokens it could not use meanwhile must not be lost, or the
//! rate measures the host's scheduler, not the shaper. The burst adds at most 2 MB to ≥ 190 MB sent (≤ 1.1 %).
//! Exceeding the limit by more than 3 % always fails. Falling short fails too, unless the same path, unlimited, right
//! afterwards cannot carry 1.3 × the limit either: then the host is too loaded to test a rate and the test says so
//! (SKIPPED, with the numbers) and passes.
//!
//! Needs root and `ip netns` (otherwise prints why it is skipped and passes); run it under the network lock:
//! `flock /tmp/rocev2-net.lock cargo test --release -p roce-cli --test rate_limit`.

mod common;

use std::time::Duration;

use common::{
    Finished, NetnsPair, Proc, netns_unavailable, scratch, serial, stats_section, strings,
};
use serde_json::Value;

const IP_A: &str = "198.18.12.1";
const IP_B: &str = "198.18.12.2";
const SIZE: u64 = 65536;
const BURST: &str = "2000000";

/// One write-bw run of `iters` 64 KiB messages, the client limited to `gbps` on the wire (`None`: unlimited); returns
/// (receiver's wire Gb/s, client's reported payload Gb/s).
fn run(ns: &NetnsPair, port: u16, gbps: Option<f64>, iters: u64) -> (f64, f64) {
    let label = gbps.map_or("unlimited".to_owned(), |g| g.to_string());
    let dir = scratch(&format!("rate-limit-{label}"));
    let port_s = port.to_string();
    let srv = strings(&[
        "perf", "write-bw", "--ip", IP_A, "-p", &port_s, "--json", "--stats",
    ]);
    let mut server = Proc::spawn("server", &dir, &NetnsPair::argv(&ns.a, &srv));
    common::wait_socket(
        &mut server,
        "tcp",
        [198, 18, 12, 1],
        port,
        Duration::from_secs(20),
    );
    let (size, n) = (SIZE.to_string(), iters.to_string());
    let mut cli = strings(&[
        "perf",
        "write-bw",
        IP_A,
        "-p",
        &port_s,
        "--ip",
        IP_B,
        "-s",
        &size,
        "-n",
        &n,
        "-m",
        "4096",
        "--json",
        "--stats",
        "--timeout",
        "30",
    ]);
    if let Some(g) = gbps {
        cli.extend(strings(&["--rate-limit", &g.to_string(), "--burst", BURST]));
    }
    let client =
        Proc::spawn("client", &dir, &NetnsPair::argv(&ns.b, &cli)).wait(Duration::from_secs(120));
    let server = server.wait(Duration::from_secs(30));
    assert!(
        client.status.success() && server.status.success(),
        "--rate-limit {label}:\nclient {client}\nserver {server}"
    );
    let json =
        |f: &Finished| -> Value { f.json_lines().into_iter().next().expect("a JSON report") };
    let (cj, sj) = (json(&client), json(&server));
    assert_eq!(cj["verified"], true, "{cj}");
    assert_eq!(sj["verified"], true, "{sj}");
    let elapsed = cj["elapsed_s"].as_f64().expect("elapsed_s");
    let rx = stats_section(&server.stderr, "engine counters (server):");
    let rcvd = *rx
        .get("rcvd_bytes")
        .unwrap_or_else(|| panic!("server stats:\n{server}"));
    let wire = rcvd as f64 * 8.0 / elapsed / 1e9;
    let payload = cj["bw_avg_gbps"].as_f64().expect("bw_avg_gbps");
    eprintln!(
        "--rate-limit {label}: receiver got {rcvd} B of frames in {elapsed:.3} s = {wire:.4} Gb/s on the wire \
         (client reports {payload:.4} Gb/s of payload; load {})",
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .trim()
    );
    (wire, payload)
}

#[test]
fn rate_limit_holds_on_the_real_wire() {
    let _g = serial();
    if let Some(why) = netns_unavailable() {
        eprintln!("SKIPPED rate_limit_holds_on_the_real_wire: {why}");
        return;
    }
    let ns = NetnsPair::up("sched", IP_A, IP_B, 9000);
    // About 3 s each: 1 Gb/s × 3 s = 375 MB = 5722 messages of 64 KiB.
    for (k, (gbps, iters)) in [(1.0, 5700u64), (0.5, 2850)].into_iter().enumerate() {
        let (wire, payload) = run(&ns, 18600 + 2 * k as u16, Some(gbps), iters);
        let err = (wire - gbps) / gbps;
        assert!(
            err < 0.03,
            "--rate-limit {gbps}: the receiver got {wire} Gb/s ({:+.2} %)",
            err * 100.0
        );
        if err <= -0.03 {
            let (cap, _) = run(&ns, 18601 + 2 * k as u16, None, iters);
            if cap < 1.3 * gbps {
                eprintln!(
                    "SKIPPED rate_limit_holds_on_the_real_wire at {gbps} Gb/s: the host is too loaded — limited \
                     {wire:.4} Gb/s, unlimited only {cap:.4} Gb/s"
                );
                continue;
            }
            panic!(
                "--rate-limit {gbps}: the receiver got {wire} Gb/s ({:+.2} %) while the path carries {cap} Gb/s",
                err * 100.0
            );
        }
        // The reported payload rate is below the wire rate by the header share (58 of 4154 bytes per frame).
        assert!(
            payload < wire && payload > wire * 0.97,
            "{payload} vs {wire}"
        );
    }
}

/// Flag combinations the scheduler options refuse before anything is opened (exit 2, one line naming the rule).
#[test]
fn bad_scheduler_flags_are_refused() {
    let cases: &[(&[&str], &str)] = &[
        (
            &["write-bw", "--loopback", "--rate-limit", "0"],
            "--rate-limit must be a positive number",
        ),
        (
            &[
                "write-bw",
                "--loopback",
                "--rate-limit",
                "1",
                "--rate_limit",
                "1",
            ],
            "not both",
        ),
        (
            &["write-bw", "--loopback", "--rate_limit", "1", "-a"],
            "give one -s",
        ),
        (
            &["atomic-bw", "--loopback", "--rate_limit", "1"],
            "--rate_limit applies to",
        ),
        (
            &["write-bw", "--loopback", "--burst_size", "4"],
            "--burst_size needs --rate_limit",
        ),
        (
            &["write-bw", "--loopback", "--tc-weights", "3,0"],
            "at least 1",
        ),
        (&["write-bw", "--loopback", "--tc", "8"], "8"),
        (
            &["write-bw", "--loopback", "--link", "sim", "--tc", "1"],
            "UDP link",
        ),
    ];
    for (args, want) in cases {
        let out = std::process::Command::new(common::bin())
            .arg("perf")
            .args(*args)
            .output()
            .expect("run rocev2");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
    }
}
