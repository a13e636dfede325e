//! `rocev2 perf --rate-limit` on the real wire (issue #12): server and client in two network namespaces joined by a
//! veth pair (9000-byte MTU, RoCE PMTU 4096), the client's QP limited by the engine's token-bucket shaper
//! (`roce_proto::sched`). What the receiver got over the run — the server's `rcvd_bytes` (whole frames, the unit
//! `--rate-limit` is in) over the client's elapsed time — must be within 3 % of the limit, at 1 Gb/s and at
//! 0.5 Gb/s (the second run shows the limit, not the machine, sets the rate). Data verification stays on.
//!
//! The bucket is 2 MB deep (`--burst`, 16 ms at 1 Gb/s) instead of the default 187.5 KB: the thread that drives the
//! engine of this software NIC (the client's own thread in the default run-to-completion mode, `--progress caller`;
//! the progress thread with `--progress thread`) shares two cores with the other side (and, on a development
//! machine, with builds), and is descheduled for milliseconds at a time. Tokens that accrue while the QP has frames
//! waiting and its bucket is full are lost for good — the host's scheduler, not the shaper — and the engine counts
//! them (`shaper_credit_lost_bytes`, `roce_proto::sched`, "credit lost while backlogged"). So the criterion is the
//! honest one: what the receiver got must be within 3 % of `limit × elapsed + burst − credit lost` (the client's
//! counter; the burst is at most 2 MB of ≥ 190 MB sent). Exceeding the limit itself by more than 3 % always fails.
//! When the credit lost is more than 30 % of `limit × elapsed`, the host is too loaded to test a rate: the test says
//! so (SKIPPED, with the numbers) and passes.
//!
//! The older escape hatch stays for what the counter cannot see: a shortfall beyond 3 % passes (SKIPPED) only if
//! the same path, unlimited, right afterwards cannot carry 1.3 × the limit either. The counter is a lower bound —
//! the engine's scheduler sees a QP as waiting only for the WQEs the runtime has moved from its ring into the engine
//! (at 1 Gb/s the batching window is one 64 KiB WQE, so between two passes the QP often looks idle), and a wait for
//! a local ACK timeout after a frame the receiver dropped is not a wait for credit. Measured on a loaded host
//! (stress-ng on both cores plus builds) most short runs are explained to within ±1 %; some (−4 % to −14 %) are not.
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

/// What one limited run measured.
struct Run {
    /// Frame bytes the receiver got (`rcvd_bytes`).
    rcvd: u64,
    /// The client's elapsed time in seconds.
    elapsed: f64,
    /// The client's `shaper_credit_lost_bytes`.
    lost: u64,
    /// The client's reported payload rate in Gb/s.
    payload: f64,
}

/// One write-bw run of `iters` 64 KiB messages, the client limited to `gbps` on the wire (`None`: unlimited).
fn run(ns: &NetnsPair, port: u16, gbps: Option<f64>, iters: u64) -> Run {
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
    if gbps.is_some() {
        cli.extend(strings(&["--rate-limit", &label, "--burst", BURST]));
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
    let tx = stats_section(&client.stderr, "engine counters (client):");
    let c = |k: &str| tx.get(k).copied().unwrap_or(0);
    let lost = c("shaper_credit_lost_bytes");
    let payload = cj["bw_avg_gbps"].as_f64().expect("bw_avg_gbps");
    eprintln!(
        "--rate-limit {label}: receiver got {rcvd} B of frames in {elapsed:.3} s = {:.4} Gb/s on the wire \
         (client reports {payload:.4} Gb/s of payload; client: credit lost {lost} B, sent {} B, retransmitted {} \
         pkts, {} ACK timeouts; load {})",
        rcvd as f64 * 8.0 / elapsed / 1e9,
        c("sent_bytes"),
        c("retransmitted_pkts"),
        c("local_ack_timeout_err"),
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .trim()
    );
    Run {
        rcvd,
        elapsed,
        lost,
        payload,
    }
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
        let r = run(&ns, 18600 + 2 * k as u16, Some(gbps), iters);
        let limit = gbps * 1e9 / 8.0 * r.elapsed;
        let wire = r.rcvd as f64 * 8.0 / r.elapsed / 1e9;
        let over = (wire - gbps) / gbps;
        assert!(
            over < 0.03,
            "--rate-limit {gbps}: the receiver got {wire} Gb/s ({:+.2} %)",
            over * 100.0
        );
        let share = r.lost as f64 / limit;
        if share > 0.3 {
            eprintln!(
                "SKIPPED rate_limit_holds_on_the_real_wire at {gbps} Gb/s: the host is too loaded — the client's \
                 shaper lost {} B of credit ({:.1} % of limit × elapsed = {limit:.0} B) while its QP waited; the \
                 receiver got {} B",
                r.lost,
                share * 100.0,
                r.rcvd
            );
            continue;
        }
        // What the shaper let out: the initial burst plus the rate over the run, less the credit it lost.
        let budget = limit + BURST.parse::<f64>().unwrap() - r.lost as f64;
        let err = (r.rcvd as f64 - budget) / budget;
        eprintln!(
            "--rate-limit {gbps}: limit × elapsed {limit:.0} B + burst {BURST} B − credit lost {} B = {budget:.0} B; \
             receiver got {} B ({:+.2} %)",
            r.lost,
            r.rcvd,
            err * 100.0
        );
        if err <= -0.03 {
            // A shortfall the counter does not explain (see the module docs): the host, if the same path cannot
            // carry 1.3 × the limit unlimited either; the shaper otherwise.
            let cap = run(&ns, 18601 + 2 * k as u16, None, iters);
            let cap_gbps = cap.rcvd as f64 * 8.0 / cap.elapsed / 1e9;
            if cap_gbps < 1.3 * gbps {
                eprintln!(
                    "SKIPPED rate_limit_holds_on_the_real_wire at {gbps} Gb/s: the host is too loaded — limited \
                     {wire:.4} Gb/s ({:+.2} % off the budget), unlimited only {cap_gbps:.4} Gb/s",
                    err * 100.0
                );
                continue;
            }
            panic!(
                "--rate-limit {gbps}: the receiver got {} B, {:+.2} % off limit × elapsed + burst − credit lost = \
                 {budget:.0} B (credit lost {} B), while the path carries {cap_gbps:.4} Gb/s",
                r.rcvd,
                err * 100.0,
                r.lost
            );
        }
        assert!(
            err < 0.03,
            "--rate-limit {gbps}: the receiver got {} B, {:+.2} % above the budget {budget:.0} B",
            r.rcvd,
            err * 100.0
        );
        // The reported payload rate is below the wire rate by the header share (58 of 4154 bytes per frame).
        assert!(
            r.payload < wire && r.payload > wire * 0.97,
            "{} vs {wire}",
            r.payload
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
        let out = common::output_within(
            std::process::Command::new(common::bin())
                .arg("perf")
                .args(*args),
            common::SHORT,
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
    }
}
