//! End-to-end tests of `rocev2 perf`, running the built binary with `--loopback` (both ends in one process over
//! real UDP sockets). Every test uses its own 127.0.N.1 / 127.0.N.2 pair (`--loopback-ips`) because the RoCE port
//! 4791 is fixed, so tests can run in parallel.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use serde_json::Value;

mod common;

use common::loopback_ips as ips;

fn rocev2(args: &[&str]) -> Output {
    common::output_within(
        Command::new(env!("CARGO_BIN_EXE_rocev2")).args(args),
        common::RUN,
    )
}

/// Runs a loopback test and returns its JSON lines (asserting exit 0).
fn loopback_json(test: &str, net: u8, extra: &[&str]) -> Vec<Value> {
    loopback_json_at(test, &ips(net), extra)
}

/// [`loopback_json`] on the address pair `ips` (`A,B`).
fn loopback_json_at(test: &str, ips: &str, extra: &[&str]) -> Vec<Value> {
    let mut args = vec![
        "perf",
        test,
        "--loopback",
        "--loopback-ips",
        ips,
        "--json",
        "--timeout",
        "20",
    ];
    args.extend_from_slice(extra);
    let t0 = Instant::now();
    let out = rocev2(&args);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{args:?} failed ({:?}):\n{stdout}\n{stderr}",
        out.status
    );
    assert!(
        t0.elapsed() < Duration::from_secs(60),
        "{args:?} took {:?}",
        t0.elapsed()
    );
    stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect()
}

fn check_bw(v: &Value, test: &str, size: u64, iters: u64) {
    assert_eq!(v["test"], test);
    assert_eq!(v["size"], size);
    assert_eq!(v["iterations"], iters);
    assert_eq!(v["verified"], true, "{v}");
    for f in ["bw_avg_gbps", "bw_peak_gbps", "msg_rate_mpps"] {
        let x = v[f].as_f64().unwrap_or(-1.0);
        assert!(x > 0.0 && x.is_finite(), "{f} = {x} in {v}");
    }
    assert!(
        v["bw_peak_gbps"].as_f64() >= v["bw_avg_gbps"].as_f64(),
        "{v}"
    );
}

fn check_lat(v: &Value, test: &str, size: u64, iters: u64) {
    assert_eq!(v["test"], test);
    assert_eq!(v["size"], size);
    assert_eq!(v["iterations"], iters);
    assert_eq!(v["verified"], true, "{v}");
    let g = |f: &str| v[f].as_f64().unwrap_or(-1.0);
    assert!(g("t_min_us") > 0.0, "{v}");
    assert!(
        g("t_min_us") <= g("t_typical_us") && g("t_typical_us") <= g("p99_us") + 0.01,
        "{v}"
    );
    assert!(
        g("p99_us") <= g("p999_us") + 0.01 && g("t_avg_us") > 0.0,
        "{v}"
    );
}

/// The perf tests each start busy-polling client and server engine threads; run them one at a time so that on a
/// 2-core CI machine they do not starve each other (an unreliable UC/UD run cannot recover a datagram the kernel
/// dropped under CPU starvation).
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

#[test]
fn every_bw_test_verifies_over_loopback() {
    let _serial = serial();
    for (i, t) in ["send-bw", "write-bw", "read-bw"].iter().enumerate() {
        let v = loopback_json(
            t,
            80 + i as u8,
            // perftest's rules: -n a multiple of -l, -l a multiple of -Q.
            &["-s", "1000", "-n", "300", "-q", "2", "-l", "4", "-Q", "2"],
        );
        assert_eq!(v.len(), 1, "one JSON object");
        // -n is per QP, as in perftest.
        check_bw(&v[0], t, 1000, 600);
    }
    let v = loopback_json("atomic-bw", 83, &["-n", "300"]);
    check_bw(&v[0], "atomic-bw", 8, 300);
}

/// 1,024 QPs active at once (issue #21): `-q 1024` (perftest allows up to 16,384; the device's `max_qp`), 20 WRITEs
/// of 4 KiB on each, every byte verified. Before `-q` was allowed past 64 it was refused.
#[test]
fn a_thousand_qps_at_once_verify_over_loopback() {
    let _serial = serial();
    let v = loopback_json("write-bw", 241, &["-q", "1024", "-s", "4096", "-n", "20"]);
    assert_eq!(v.len(), 1, "one JSON object");
    check_bw(&v[0], "write-bw", 4096, 1024 * 20);
}

/// 2,048 QPs active at once (issue #21): more distinct UDP source ports than the link's 1,024 transmit sockets, so
/// the QPs past them share sockets (4 KiB WRITEs: gathered frames, copied by the link when their port is rewritten).
/// Before, every frame of those QPs failed (`tx_errors`) and the run stalled. `-t 8` and `-u 16` (268 ms): 2,048 QPs
/// with 20 messages each in flight overflow the 4 MiB receive socket and, on a loaded machine, a side may not run
/// for a 67 ms ACK timeout; neither is what this test is about.
#[test]
fn two_thousand_qps_share_the_transmit_sockets() {
    let _serial = serial();
    let v = loopback_json_at(
        "write-bw",
        "127.0.202.21,127.0.202.22",
        &[
            "-q", "2048", "-t", "8", "-u", "16", "-s", "4096", "-n", "20",
        ],
    );
    assert_eq!(v.len(), 1, "one JSON object");
    check_bw(&v[0], "write-bw", 4096, 2048 * 20);
}

/// `-q` 4,096 and 16,384 (perftest's and the device's limit) fit one CQ within `max_cqe` (1 Mi): the send side is
/// sized by the moderation (`-Q`), a SEND receiver's ring shrinks when `-q` × 256 receives would not fit (issue #21:
/// these failed creating the CQ). Small messages, shallow `-t` and `-u 16` keep the load (and the memory, ~0.5 GB
/// for both sides of the 16,384-QP runs) within what a shared test machine gives.
#[test]
fn sixteen_thousand_qps_fit_the_cq() {
    let _serial = serial();
    let ips = "127.0.202.31,127.0.202.32";
    for (test, q) in [
        ("write-bw", 4096u64),
        ("send-bw", 4096),
        ("write-bw", 16384),
        ("send-bw", 16384),
    ] {
        let qs = q.to_string();
        let v = loopback_json_at(
            test,
            ips,
            &["-q", &qs, "-t", "2", "-u", "16", "-s", "64", "-n", "6"],
        );
        check_bw(&v[0], test, 64, q * 6);
    }
}

#[test]
fn every_lat_test_verifies_over_loopback() {
    let _serial = serial();
    for (i, t) in ["send-lat", "write-lat", "read-lat"].iter().enumerate() {
        let v = loopback_json(t, 90 + i as u8, &["-s", "300", "-n", "100"]);
        assert_eq!(v.len(), 1);
        check_lat(&v[0], t, 300, 100);
    }
    let v = loopback_json("atomic-lat", 93, &["-n", "100"]);
    check_lat(&v[0], "atomic-lat", 8, 100);
}

#[test]
fn uc_and_ud_where_perftest_has_them() {
    let _serial = serial();
    let v = loopback_json(
        "send-bw",
        100,
        &["-c", "UD", "-s", "512", "-n", "200", "-m", "1024"],
    );
    // UD may drop under load (no retransmission); whatever arrived was verified.
    assert_eq!(v[0]["verified"], true);
    let v = loopback_json("send-lat", 101, &["-c", "UD", "-n", "50"]);
    check_lat(&v[0], "send-lat", 2, 50);
    let v = loopback_json("write-bw", 102, &["-c", "UC", "-s", "2048", "-n", "200"]);
    check_bw(&v[0], "write-bw", 2048, 200);
    let v = loopback_json("write-lat", 103, &["-c", "UC", "-n", "50"]);
    check_lat(&v[0], "write-lat", 2, 50);
    // perftest has no READ over UC.
    let out = rocev2(&["perf", "read-bw", "-c", "UC", "--loopback"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("does not run over UC"));
}

/// Issue #18 item 8: an unreliable sweep ended every size with a fixed 200 ms wait for stragglers (UC/UD) or a
/// 100 ms quiet wait (passive UC WRITE target), so `write-lat -a -n 10 -c UC` took 5.5 s against RC's 1.1 s. A
/// size now ends as soon as every message the client sent has arrived; the fixed waits remain only for a loss.
/// Judged as a same-run ratio against the RC sweep of the same test (the machine is shared; the old code was
/// 3.5-5 x slower than RC here), not against a wall-clock figure.
#[test]
fn unreliable_sweeps_do_not_wait_out_every_size() {
    let _serial = serial();
    let time = |test: &str, net: u8, conn: &str| {
        let t0 = Instant::now();
        let v = loopback_json(test, net, &["-a", "-n", "10", "-c", conn]);
        assert!(v.len() >= 12, "{test} -c {conn}: one line per size: {v:?}");
        t0.elapsed()
    };
    for (test, net) in [("write-lat", 217u8), ("send-lat", 219), ("write-bw", 221)] {
        let rc = time(test, net, "RC");
        let uc = time(test, net + 1, "UC");
        assert!(
            uc < rc * 2 + Duration::from_millis(500),
            "{test} -a over UC took {uc:?} against RC's {rc:?} in the same run"
        );
    }
}

/// Issue #18 item 6: a run whose QPs hit local ACK timeouts (each a stall of at least the timeout) says so on
/// stderr, even without `--stats`; a clean run says nothing of the kind.
#[test]
fn local_ack_timeouts_are_reported_after_the_run() {
    let _serial = serial();
    let run = |net: u8, extra: &[&str]| {
        let ips = ips(net);
        let mut args = vec![
            "perf",
            "send-lat",
            "--loopback",
            "--loopback-ips",
            &ips,
            "-n",
            "30",
        ];
        args.extend_from_slice(extra);
        let out = rocev2(&args);
        assert!(out.status.success(), "{args:?}: {out:?}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    // A latency test has one message in flight: a lost request or response can only be recovered by a timeout.
    let lossy = run(223, &["--loss", "0.2", "-u", "8"]);
    assert!(
        lossy.contains("local ACK timeout") && lossy.contains("stall of at least the ACK timeout"),
        "{lossy}"
    );
    // Clean: no loss, and a 4.3 s timeout so that a loaded machine's scheduling stall is not one.
    let clean = run(224, &["-u", "20"]);
    assert!(!clean.contains("local ACK timeout"), "{clean}");
}

/// Issue #21: every run used seed 1, so every run had the same initial PSNs and the same rkey (0x101): a blind
/// in-window injection was easy. Without `--seed` two runs now differ in both; with the same `--seed` they agree
/// (fault-injection runs stay reproducible).
#[test]
fn psns_and_rkeys_differ_between_runs_unless_seeded() {
    let _serial = serial();
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"));
    // (PSN, rkey) of the first WRITE of a `write-bw` run.
    let first = |tag: &str, extra: &[&str]| -> (u64, u64) {
        let file = dir.join(format!("seed-{tag}-{}.pcap", std::process::id()));
        let f = file.to_string_lossy().into_owned();
        let mut args = vec!["-s", "64", "-n", "5", "--pcap", &f];
        args.extend_from_slice(extra);
        loopback_json("write-bw", 227, &args);
        let out = rocev2(&["decode", "--json", &f]);
        let _ = std::fs::remove_file(&file);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let w: Value = text
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .find(|v| v["reth"].is_object())
            .unwrap_or_else(|| panic!("no WRITE in the capture:\n{text}"));
        (
            w["psn"].as_u64().expect("psn"),
            w["reth"]["rkey"].as_u64().expect("rkey"),
        )
    };
    let (a, b) = (first("a", &[]), first("b", &[]));
    assert_ne!(a.0, b.0, "the same initial PSN in two runs");
    // The key byte takes one of 255 values: two runs agree by chance once in 255, both on the old fixed key once
    // in 65,025.
    assert!(
        a.1 != 0x101 || b.1 != 0x101,
        "the first MR's rkey is 0x101 in every run"
    );
    let (c, d) = (first("c", &["--seed", "9"]), first("d", &["--seed", "9"]));
    assert_eq!(c, d, "--seed reproduces a run");
}

#[test]
fn loss_still_completes_with_verified_data() {
    let _serial = serial();
    let v = loopback_json(
        "write-bw",
        110,
        &[
            "-s", "3000", "-n", "400", "--loss", "0.05", "--seed", "7", "--stats",
        ],
    );
    check_bw(&v[0], "write-bw", 3000, 400);
    let v = loopback_json(
        "send-bw",
        111,
        &[
            "-s",
            "1500",
            "-n",
            "300",
            "--loss",
            "0.05",
            "--reorder",
            "0.05",
            "--dup",
            "0.02",
            "-m",
            "1024",
        ],
    );
    check_bw(&v[0], "send-bw", 1500, 300);
}

#[test]
fn duration_mode_counts_what_completed() {
    let _serial = serial();
    let v = loopback_json("write-bw", 120, &["-s", "512", "-D", "0.5"]);
    let n = v[0]["iterations"].as_u64().unwrap_or(0);
    assert!(n > 0, "{}", v[0]);
    assert_eq!(v[0]["verified"], true);
    let e = v[0]["elapsed_s"].as_f64().unwrap_or(0.0);
    assert!((0.45..5.0).contains(&e), "elapsed {e}");
}

#[test]
fn text_table_matches_perftest_columns() {
    let _serial = serial();
    let ips = ips(121);
    let out = rocev2(&[
        "perf",
        "write-bw",
        "--loopback",
        "--loopback-ips",
        &ips,
        "-s",
        "64",
        "-n",
        "50",
        "--report_gbits",
    ]);
    let s = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{s}");
    assert!(
        s.contains(
            "#bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]"
        ),
        "{s}"
    );
    let line = s
        .lines()
        .find(|l| l.trim_start().starts_with("64 "))
        .expect("result line");
    let cols: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(cols.len(), 5, "{line}");
    assert_eq!(cols[1], "50");
}

#[test]
fn client_without_server_fails_fast() {
    let _serial = serial();
    let port = TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    let t0 = Instant::now();
    let out = rocev2(&[
        "perf",
        "write-bw",
        "127.0.0.1",
        "-p",
        &port.to_string(),
        "--timeout",
        "2",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        t0.elapsed() < Duration::from_secs(5),
        "took {:?}",
        t0.elapsed()
    );
    assert!(
        err.contains(&format!("connecting to 127.0.0.1:{port}")),
        "{err}"
    );
    assert!(
        err.contains("is a `rocev2 perf` server running there?"),
        "{err}"
    );
}

#[test]
fn server_waits_for_a_client_no_longer_than_timeout() {
    // The server ignored --timeout while waiting (it waited an hour). Now --timeout bounds the wait and the error
    // says which wait ended after how long.
    let port = TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    let t0 = Instant::now();
    let dir = common::scratch("server-wait");
    let argv: Vec<String> = [
        common::bin(),
        "perf",
        "write-bw",
        "--ip",
        "127.0.0.1",
        "-p",
        &port.to_string(),
        "--timeout",
        "1",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    // Killed after 10 s if it is still waiting (it waited an hour before the fix).
    let out = common::Proc::spawn("server", &dir, &argv).wait(Duration::from_secs(10));
    let err = &out.stderr;
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        t0.elapsed() < Duration::from_secs(5),
        "took {:?}",
        t0.elapsed()
    );
    assert!(
        err.contains(&format!("waiting for a client on 127.0.0.1:{port}"))
            && err.contains("timed out after 1 s (--timeout)"),
        "{err}"
    );
}

#[test]
fn an_unknown_server_name_is_not_blamed_on_the_server() {
    // A DNS failure said "is a `rocev2 perf` server running there?".
    let out = rocev2(&["perf", "write-bw", "no-such-host.invalid", "--timeout", "2"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("resolving the server name `no-such-host.invalid`"),
        "{err}"
    );
    assert!(!err.contains("server running there"), "{err}");
    let out = rocev2(&["perf", "write-bw", "127.0.0.1", "--timeout", "0"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--timeout 0"));
}

#[test]
fn silent_server_times_out() {
    let _serial = serial();
    // A TCP listener that never answers: the client's read timeout ends the run.
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = l.local_addr().expect("addr").port();
    let t0 = Instant::now();
    let out = rocev2(&[
        "perf",
        "send-lat",
        "127.0.0.1",
        "-p",
        &port.to_string(),
        "--timeout",
        "1",
    ]);
    assert!(!out.status.success());
    assert!(
        t0.elapsed() < Duration::from_secs(5),
        "took {:?}",
        t0.elapsed()
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("waiting for `hello`") && err.contains("timed out after 1 s (--timeout)"),
        "{err}"
    );
    drop(l);
}

#[test]
fn pcap_capture_decodes_with_good_icrc() {
    let _serial = serial();
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let file = dir.join(format!("perf-{}.pcap", std::process::id()));
    let f = file.to_string_lossy().into_owned();
    let v = loopback_json(
        "send-bw",
        130,
        &["-s", "2000", "-n", "20", "-m", "1024", "--pcap", &f],
    );
    check_bw(&v[0], "send-bw", 2000, 20);
    // 20 messages of 2 packets each plus ACKs, both directions: every frame decodes with a good ICRC.
    let out = rocev2(&["decode", &f]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines = String::from_utf8_lossy(&out.stdout).lines().count();
    assert!(lines >= 40, "{lines} packets in the capture");
    let _ = std::fs::remove_file(&file);
}

#[test]
fn metrics_are_served_while_running() {
    let _serial = serial();
    let mport = TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    let maddr = format!("127.0.0.1:{mport}");
    let ips = ips(140);
    let dir = common::scratch("perf-metrics-loopback");
    let mut child = common::Proc::spawn_command(
        "perf",
        &dir,
        Command::new(env!("CARGO_BIN_EXE_rocev2")).args([
            "perf",
            "write-bw",
            "--loopback",
            "--loopback-ips",
            &ips,
            "-s",
            "256",
            "-D",
            "3",
            "--metrics",
            &maddr,
        ]),
    );
    let t0 = Instant::now();
    let mut body = String::new();
    while t0.elapsed() < Duration::from_secs(3) {
        if let Ok(mut s) = TcpStream::connect(&maddr) {
            let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
            let _ = s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n");
            let _ = s.read_to_string(&mut body);
            // Both ends of the loopback run (only the client was exported before).
            if body.contains("rocev2_sent_pkts_total{side=\"client\"}")
                && body.contains("rocev2_sent_pkts_total{side=\"server\"}")
            {
                break;
            }
            body.clear();
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let status = child.wait(common::RUN).status;
    assert!(status.success());
    assert!(body.starts_with("HTTP/1.0 200 OK"), "{body}");
    assert!(
        body.contains("rocev2_rcvd_pkts_total{side=\"server\"}"),
        "the loopback server is not exported: {body}"
    );
    assert!(body.contains("# TYPE rocev2_sent_pkts counter"), "{body}");
    // The runtime's counters: the client rang doorbells and both sides made link I/O calls.
    let metric = |name: &str| -> u64 {
        body.lines()
            .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {name}: {body}"))
    };
    assert!(metric("rocev2_runtime_doorbells_total{side=\"client\"}") > 0);
    let (calls, frames) = (
        metric("rocev2_runtime_tx_io_calls_total{side=\"client\"}"),
        metric("rocev2_runtime_tx_frames_total{side=\"client\"}"),
    );
    assert!(
        calls > 0 && frames >= calls,
        "{calls} calls, {frames} frames"
    );
    assert!(metric("rocev2_runtime_rx_io_calls_total{side=\"server\"}") > 0);
    // The longest pass gap is a gauge (µs), exported for both sides.
    let _ = metric("rocev2_runtime_max_pass_gap_us{side=\"client\"}");
    assert!(body.trim_end().ends_with("# EOF"), "{body}");
}

#[test]
fn a_data_mismatch_fails_the_run() {
    let _serial = serial();
    // The hidden testing flag alters one verified byte (or the atomic counter) before verification.
    for (i, (t, c)) in [
        ("write-bw", "RC"),
        ("read-bw", "RC"),
        ("atomic-bw", "RC"),
        ("send-bw", "RC"),
        ("send-lat", "RC"),
        ("read-lat", "RC"),
        ("write-lat", "RC"),
        // UC WRITE tolerates a lost tail (zeros), never a wrong byte.
        ("write-bw", "UC"),
        ("send-bw", "UD"),
    ]
    .iter()
    .enumerate()
    {
        let ips = ips(150 + i as u8);
        // Atomics are always 8 bytes (-s is refused for them, as in perftest).
        let size = if t.starts_with("atomic") { "8" } else { "128" };
        let out = rocev2(&[
            "perf",
            t,
            "-c",
            c,
            "--loopback",
            "--loopback-ips",
            &ips,
            "-s",
            size,
            "-n",
            "20",
            "--json",
            "--debug-corrupt-before-verify",
        ]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{t}: {err}");
        assert!(err.contains("verification failed"), "{t}: {err}");
        // The same run without the flag passes, so the failure is the injected mismatch.
        let out = rocev2(&[
            "perf",
            t,
            "-c",
            c,
            "--loopback",
            "--loopback-ips",
            &ips,
            "-s",
            size,
            "-n",
            "20",
            "--json",
        ]);
        assert!(
            out.status.success(),
            "{t}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        // --no-verify skips the check entirely.
        let out = rocev2(&[
            "perf",
            t,
            "-c",
            c,
            "--loopback",
            "--loopback-ips",
            &ips,
            "-s",
            size,
            "-n",
            "20",
            "--json",
            "--no-verify",
            "--debug-corrupt-before-verify",
        ]);
        assert!(
            out.status.success(),
            "{t}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: Value = serde_json::from_slice(&out.stdout).expect("json");
        assert_eq!(v["verified"], Value::Null);
    }
}

#[test]
fn completion_channel_with_moderation() {
    let _serial = serial();
    let v = loopback_json("send-lat", 160, &["-e", "-n", "100"]);
    check_lat(&v[0], "send-lat", 2, 100);
    let v = loopback_json(
        "write-bw",
        161,
        &[
            "-e",
            "-s",
            "4096",
            "-n",
            "500",
            "-Q",
            "16",
            "--cq-period",
            "50",
            "--adaptive-moderation",
        ],
    );
    check_bw(&v[0], "write-bw", 4096, 500);
}

#[test]
fn sim_link_loopback() {
    let _serial = serial();
    let v = loopback_json(
        "write-bw",
        162,
        &["--link", "sim", "-s", "4096", "-n", "500", "--loss", "0.02"],
    );
    check_bw(&v[0], "write-bw", 4096, 500);
}

#[test]
fn busy_roce_port_is_a_clear_error() {
    let _serial = serial();
    let _squatter = std::net::UdpSocket::bind("127.0.170.2:4791").expect("bind 4791");
    let t0 = Instant::now();
    let out = rocev2(&[
        "perf",
        "write-bw",
        "--loopback",
        "--loopback-ips",
        "127.0.170.1,127.0.170.2",
        "-n",
        "10",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("127.0.170.2:4791") && err.contains("in use"),
        "{err}"
    );
    assert!(
        t0.elapsed() < Duration::from_secs(15),
        "took {:?}",
        t0.elapsed()
    );
}

#[test]
fn same_host_server_and_client_without_ip_are_told_about_ip() {
    let _serial = serial();
    // A server and a client on one host, neither with --ip: both take 127.0.0.1 as their RoCE address and the second
    // cannot bind UDP 4791 there. The hint named --loopback only; the way out with two processes is --ip.
    let dir = common::scratch("same-host-no-ip");
    let port = TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
        .to_string();
    let argv = |extra: &[&str]| -> Vec<String> {
        let mut v: Vec<String> = [common::bin(), "perf", "write-bw", "-p", &port, "-n", "10"]
            .iter()
            .map(|s| (*s).to_owned())
            .collect();
        v.extend(extra.iter().map(|s| (*s).to_owned()));
        v
    };
    let mut srv = common::Proc::spawn("server", &dir, &argv(&["--timeout", "20"]));
    let p: u16 = port.parse().expect("port");
    common::wait_socket(&mut srv, "tcp", [0, 0, 0, 0], p, Duration::from_secs(10));
    let cli =
        common::Proc::spawn("client", &dir, &argv(&["127.0.0.1"])).wait(Duration::from_secs(30));
    let srv = srv.wait(Duration::from_secs(30));
    assert!(!cli.status.success(), "{cli}\n{srv}");
    assert!(
        cli.stderr.contains("127.0.0.1:4791")
            && cli.stderr.contains("in use")
            && cli.stderr.contains("--ip 127.0.0.2")
            && cli.stderr.contains("--loopback"),
        "{cli}"
    );
}

#[test]
fn sim_link_banner_names_the_simulated_segment() {
    let _serial = serial();
    // It said "Ethernet (UDP 4791)" for the in-memory segment.
    let out = rocev2(&[
        "perf",
        "write-bw",
        "--loopback",
        "--link",
        "sim",
        "-n",
        "20",
    ]);
    let s = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{s}");
    let link = s
        .lines()
        .find(|l| l.trim_start().starts_with("Link type"))
        .expect("a Link type line");
    assert!(
        link.contains("simulated segment") && !link.contains("UDP"),
        "{link}"
    );
}

#[test]
fn stats_blocks_come_client_first_every_time() {
    let _serial = serial();
    // The in-process server printed its blocks when its thread ended, before or after the client's.
    for run in 0..4 {
        let ips = ips(122);
        let out = rocev2(&[
            "perf",
            "send-bw",
            "--loopback",
            "--loopback-ips",
            &ips,
            "-s",
            "64",
            "-n",
            "20",
            "--stats",
        ]);
        let s = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{s}");
        let order: Vec<usize> = [
            "engine counters (client):",
            "udp link counters (client):",
            "engine counters (server):",
            "udp link counters (server):",
        ]
        .iter()
        .map(|h| {
            s.find(h)
                .unwrap_or_else(|| panic!("run {run}: no `{h}` in:\n{s}"))
        })
        .collect();
        assert!(
            order.windows(2).all(|w| w[0] < w[1]),
            "run {run}: {order:?}\n{s}"
        );
    }
}

#[test]
fn link_byte_counters_count_frames_on_both_sides() {
    let _serial = serial();
    // tx_bytes counted UDP payload, rx_bytes whole frames: the two ends of one loopback run disagreed.
    let ips = ips(123);
    let out = rocev2(&[
        "perf",
        "write-bw",
        "--loopback",
        "--loopback-ips",
        &ips,
        "-s",
        "3000",
        "-n",
        "50",
        "--stats",
    ]);
    let s = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{s}");
    let value = |header: &str, name: &str| -> u64 {
        let sec = &s[s
            .find(header)
            .unwrap_or_else(|| panic!("no {header}:\n{s}"))..];
        sec.lines()
            .skip(1)
            .take_while(|l| l.starts_with("  "))
            .find_map(|l| {
                let mut w = l.split_whitespace();
                (w.next() == Some(name)).then(|| w.next().and_then(|v| v.parse().ok()))?
            })
            .unwrap_or(0)
    };
    let (ctx, srx) = (
        value("udp link counters (client):", "tx_bytes"),
        value("udp link counters (server):", "rx_bytes"),
    );
    let (crx, stx) = (
        value("udp link counters (client):", "rx_bytes"),
        value("udp link counters (server):", "tx_bytes"),
    );
    assert!(ctx > 0 && stx > 0, "{s}");
    assert_eq!(ctx, srx, "client tx vs server rx:\n{s}");
    assert_eq!(stx, crx, "server tx vs client rx:\n{s}");
    assert_eq!(ctx, value("engine counters (client):", "sent_bytes"), "{s}");
}

/// The readiness check the multi-process tests wait on (`common::wait_socket`) looks at the given process's own
/// sockets: `/proc/PID/net/tcp` lists every socket of the network namespace, and a listener of another process on the
/// same port (here the test's own) made it report a server ready that was not listening yet — its client was then
/// refused (`a_standalone_server_prints_the_header_block` failed so on a loaded host).
#[test]
fn socket_readiness_is_the_process_own() {
    let l = TcpListener::bind("127.0.125.1:0").expect("bind");
    let port = l.local_addr().expect("addr").port();
    let dir = common::scratch("readiness");
    let other = common::Proc::spawn("sleep", &dir, &common::strings(&["sleep", "30"]));
    assert!(common::has_socket(
        std::process::id(),
        "tcp",
        [127, 0, 125, 1],
        port
    ));
    assert!(!common::has_socket(
        other.pid(),
        "tcp",
        [127, 0, 125, 1],
        port
    ));
}

#[test]
fn a_standalone_server_prints_the_header_block() {
    let _serial = serial();
    // perftest's server prints the test's header and the address block; rocev2's printed only the table.
    let dir = common::scratch("server-banner");
    let port = TcpListener::bind("127.0.124.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    let p = port.to_string();
    let argv = |extra: &[&str]| -> Vec<String> {
        let mut v: Vec<String> = [
            common::bin(),
            "perf",
            "read-bw",
            "-p",
            &p,
            "--timeout",
            "20",
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
        v.extend(extra.iter().map(|s| (*s).to_owned()));
        v
    };
    let mut srv = common::Proc::spawn("server", &dir, &argv(&["--ip", "127.0.124.1"]));
    common::wait_socket(
        &mut srv,
        "tcp",
        [127, 0, 124, 1],
        port,
        Duration::from_secs(10),
    );
    let cli = common::Proc::spawn(
        "client",
        &dir,
        &argv(&[
            "127.0.124.1",
            "--ip",
            "127.0.124.2",
            "-n",
            "20",
            "-s",
            "1024",
        ]),
    )
    .wait(Duration::from_secs(30));
    let srv = srv.wait(Duration::from_secs(30));
    assert!(cli.status.success(), "{cli}");
    assert!(srv.status.success(), "{srv}");
    for want in [
        "RDMA_Read BW Test",
        "Connection type : RC",
        "Mtu             : 4096[B]",
        " local address: LID 0000 QPN 0x",
        " remote address: LID 0000 QPN 0x",
        " GID: 00:00:00:00:00:00:00:00:00:00:255:255:127:00:124:01",
        "#bytes     #iterations",
    ] {
        assert!(
            srv.stdout.contains(want),
            "`{want}` not in the server's output:\n{srv}"
        );
        assert!(
            cli.stdout.contains(want),
            "`{want}` not in the client's output:\n{cli}"
        );
    }
}

#[test]
fn top_level_help_lists_what_is_there() {
    let out = rocev2(&["--help"]);
    let s = String::from_utf8_lossy(&out.stdout);
    assert!(!s.contains("later"), "{s}");
    for cmd in ["decode", "perf", "pingpong"] {
        assert!(s.contains(cmd), "{cmd} missing: {s}");
    }
}

/// Three `--loopback` runs started at the same instant without `--loopback-ips` each get a pair of their own (they
/// used to probe the same free pair and all but one failed with "Address already in use": fresh-user report).
#[test]
fn simultaneous_loopback_runs_each_get_a_pair() {
    let _serial = serial();
    let dir = common::scratch("perf-simultaneous");
    let runs: Vec<_> = (0..3)
        .map(|i| {
            common::Proc::spawn_command(
                &format!("run{i}"),
                &dir,
                Command::new(env!("CARGO_BIN_EXE_rocev2")).args([
                    "perf",
                    "write-bw",
                    "--loopback",
                    "-n",
                    "200",
                    "-s",
                    "1024",
                    "--json",
                ]),
            )
        })
        .collect();
    for mut r in runs {
        let out = r.output(common::RUN);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn loopback_without_ips_picks_a_free_pair() {
    let _serial = serial();
    // Another run owns 127.0.0.2:4791 (here a plain socket): a second --loopback run failed with "in use".
    let _other = std::net::UdpSocket::bind("127.0.0.2:4791").expect("bind 127.0.0.2:4791");
    let out = rocev2(&[
        "perf",
        "write-bw",
        "--loopback",
        "-n",
        "20",
        "-s",
        "64",
        "--json",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("using 127.0.0.3 and 127.0.0.4"), "{err}");
    let v: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["verified"], true);
    // An explicit pair that is taken says how to choose another.
    let out = rocev2(&[
        "perf",
        "write-bw",
        "--loopback",
        "--loopback-ips",
        "127.0.0.1,127.0.0.2",
        "-n",
        "20",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("--loopback-ips A,B"), "{err}");
}

#[test]
fn bidirectional_bandwidth_verifies_both_directions() {
    let _serial = serial();
    for (i, (t, c)) in [
        ("send-bw", "RC"),
        ("write-bw", "RC"),
        ("read-bw", "RC"),
        ("atomic-bw", "RC"),
        ("send-bw", "UD"),
        ("write-bw", "UC"),
    ]
    .iter()
    .enumerate()
    {
        let mut extra = vec!["-b", "-c", c, "-n", "200", "-q", "2"];
        if !t.starts_with("atomic") && *c != "UD" {
            extra.extend_from_slice(&["-s", "1500"]);
        }
        let v = loopback_json(t, 125 + i as u8, &extra);
        assert_eq!(v.len(), 1, "{t} {c}");
        assert_eq!(v[0]["bidirectional"], true, "{}", v[0]);
        assert_eq!(v[0]["verified"], true, "{}", v[0]);
        assert_eq!(v[0]["iterations"], 400, "{}", v[0]);
        assert_eq!(v[0]["peer_iterations"], 400, "{}", v[0]);
    }
    // A corrupted byte on either side fails the run.
    for t in ["write-bw", "send-bw", "read-bw", "atomic-bw"] {
        let ips = ips(131);
        let out = rocev2(&[
            "perf",
            t,
            "-b",
            "--loopback",
            "--loopback-ips",
            &ips,
            "-n",
            "50",
            "--json",
            "--debug-corrupt-before-verify",
        ]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{t}: {err}");
        assert!(err.contains("verification failed"), "{t}: {err}");
    }
}

#[test]
fn traffic_class_marks_every_packet() {
    let _serial = serial();
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let file = dir.join(format!("tclass-{}.pcap", std::process::id()));
    let f = file.to_string_lossy().into_owned();
    // -T/--tos are perftest's letters for the IP ToS, --tclass its GRH traffic class: one byte in RoCE v2.
    for (flag, value, dscp) in [
        ("-T", "104", 26),
        ("--tclass", "184", 46),
        ("--tos", "72", 18),
    ] {
        for t in ["send-bw", "read-lat"] {
            let v = loopback_json(
                t,
                132,
                &["-s", "2000", "-n", "20", flag, value, "--pcap", &f],
            );
            assert_eq!(v[0]["verified"], true);
            let out = rocev2(&["decode", "--json", &f]);
            assert!(out.status.success());
            let pkts: Vec<Value> = String::from_utf8_lossy(&out.stdout)
                .lines()
                .map(|l| serde_json::from_str(l).expect("json"))
                .collect();
            assert!(pkts.len() >= 20, "{t}: {} packets", pkts.len());
            // Both directions: requests and ACKs / responses.
            assert!(pkts.iter().any(|p| p["dst_ip"] == "127.0.132.1"));
            assert!(pkts.iter().any(|p| p["dst_ip"] == "127.0.132.2"));
            for p in &pkts {
                assert_eq!(p["dscp"], dscp, "{t} {flag} {value}: {p}");
            }
        }
    }
    let _ = std::fs::remove_file(&file);
}

#[test]
fn output_levels_print_one_number_per_size() {
    let _serial = serial();
    for (t, level, extra) in [
        ("write-bw", "bandwidth", &["-n", "50"][..]),
        ("send-bw", "message_rate", &["-n", "50", "-a"][..]),
        ("read-lat", "latency", &["-n", "20"][..]),
    ] {
        let ips = ips(133);
        let mut args = vec![
            "perf",
            t,
            "--loopback",
            "--loopback-ips",
            &ips,
            "--output",
            level,
        ];
        args.extend_from_slice(extra);
        let out = rocev2(&args);
        let s = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{args:?}: {s}");
        let lines: Vec<&str> = s.lines().collect();
        let want = if extra.contains(&"-a") { 23 } else { 1 };
        assert_eq!(lines.len(), want, "{args:?}: {s}");
        for l in lines {
            let x: f64 = l
                .trim()
                .parse()
                .unwrap_or_else(|_| panic!("not a number: {l:?}"));
            assert!(x > 0.0 && x.is_finite(), "{l}");
        }
    }
}

#[test]
fn run_infinitely_reports_latency_percentiles_per_interval() {
    let _serial = serial();
    // --run_infinitely was refused for latency tests; now each -D interval prints a full latency line.
    let dir = common::scratch("infinite");
    let argv: Vec<String> = [
        common::bin(),
        "perf",
        "send-lat",
        "--loopback",
        "--loopback-ips",
        "127.0.134.1,127.0.134.2",
        "--run_infinitely",
        "-D",
        "1",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    let mut p = common::Proc::spawn("send-lat", &dir, &argv);
    let t0 = Instant::now();
    let lines = loop {
        std::thread::sleep(Duration::from_millis(200));
        let text = std::fs::read_to_string(dir.join("send-lat.out")).unwrap_or_default();
        let lines: Vec<String> = text
            .lines()
            .filter(|l| l.trim_start().starts_with("2 "))
            .map(str::to_owned)
            .collect();
        if lines.len() >= 2 || t0.elapsed() > Duration::from_secs(20) || p.try_wait().is_some() {
            break lines;
        }
    };
    drop(p);
    assert!(lines.len() >= 2, "{lines:?}");
    for l in &lines {
        // #bytes #iterations t_min t_max t_typical t_avg t_stdev p99 p99.9
        let cols: Vec<f64> = l
            .split_whitespace()
            .map(|c| c.parse().expect("number"))
            .collect();
        assert_eq!(cols.len(), 9, "{l}");
        assert!(
            cols[1] > 0.0 && cols[7] >= cols[4] && cols[8] >= cols[7],
            "{l}"
        );
    }
}

/// Both progress modes, polling and completion events (`-e`): run-to-completion (`--progress caller`, the default)
/// drives the engine in the test threads (the passive write-bw server through its auto-progress thread), `--progress
/// thread` in progress threads; every run verifies its data.
#[test]
fn both_progress_modes_with_and_without_events() {
    let _serial = serial();
    let mut net = 190u8;
    for mode in ["caller", "thread"] {
        for events in [false, true] {
            let mut extra = vec!["--progress", mode, "-n", "200"];
            if events {
                extra.push("-e");
            }
            let v = loopback_json("send-lat", net, &extra);
            check_lat(&v[0], "send-lat", 2, 200);
            extra.extend_from_slice(&["-s", "4096"]);
            let v = loopback_json("write-bw", net + 1, &extra);
            check_bw(&v[0], "write-bw", 4096, 200);
            net += 2;
        }
    }
    let out = rocev2(&["perf", "send-lat", "--loopback", "--progress", "polling"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("caller or thread"));
}

/// `-u N` sets this side's local ACK timeout (4.096 µs · 2^N, perftest's `-u`), not only with `--perftest-compat`:
/// with `-u 1` (8 µs, shorter than a 64 KiB READ takes over loopback) the requester times out and retries, with the
/// default 67 ms it does not need to. Before, `rocev2 perf` accepted `-u` and connected with timeout 14 anyway.
#[test]
fn qp_timeout_flag_sets_the_local_ack_timeout() {
    let _serial = serial();
    let ips = ips(172);
    let out = rocev2(&[
        "perf",
        "read-bw",
        "--loopback",
        "--loopback-ips",
        &ips,
        "-s",
        "65536",
        "-n",
        "50",
        "-u",
        "1",
        "--stats",
        "--timeout",
        "20",
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    let err = String::from_utf8_lossy(&out.stderr);
    let timeouts: u64 = text
        .lines()
        .skip_while(|l| !l.starts_with("engine counters (client)"))
        .take_while(|l| !l.starts_with("runtime (client"))
        .find_map(|l| {
            l.trim()
                .strip_prefix("local_ack_timeout_err")?
                .trim()
                .parse()
                .ok()
        })
        .unwrap_or(0);
    assert!(
        timeouts > 0,
        "no local ACK timeout with -u 1 (exit {:?}):\n{text}\n{err}",
        out.status.code()
    );
}
