//! `rawudp` end to end on loopback: the sink counts what `send` sent, `ping` gets RTTs from `pong`.

use std::process::{Command, Stdio};

/// `rawudp` under `timeout -k 5 60`: every run here is bounded (each ends by itself within 20 s; past 60 s it is
/// killed, SIGKILL 5 s after SIGTERM, and exits 124 or 137, which [`json`] reports with its output).
fn bin() -> Command {
    let mut c = Command::new("timeout");
    c.args(["-k", "5", "60", env!("CARGO_BIN_EXE_rawudp")]);
    c
}

/// Waits (at most 20 s) until a process has bound UDP `addr` (`a.b.c.d:port`), as `/proc/net/udp` lists it: a
/// fixed sleep was not enough on a loaded machine (the ping started before the pong had bound and got "Connection
/// refused"). Reading the table, unlike a probe bind, never takes the port from the process starting up.
fn wait_bound(addr: &str) {
    let a: std::net::SocketAddrV4 = addr.parse().expect("IPv4 socket address");
    // The kernel prints the address as the 32-bit word in host order (little endian here) and the port in hex.
    let want = format!(
        "{:08X}:{:04X}",
        u32::from_le_bytes(a.ip().octets()),
        a.port()
    );
    let t0 = std::time::Instant::now();
    loop {
        let table = std::fs::read_to_string("/proc/net/udp").unwrap_or_default();
        if table
            .lines()
            .any(|l| l.split_whitespace().nth(1) == Some(want.as_str()))
        {
            return;
        }
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(20),
            "nothing bound {addr}"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

fn json(out: std::process::Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "rawudp failed ({:?}; 124 or 137: still running after `timeout`'s 60 s)\n--- stdout\n{}--- stderr\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("one JSON object")
}

#[test]
fn send_to_sink_counts_match() {
    let sink = bin()
        .args([
            "sink",
            "127.0.51.2:4791",
            "--idle",
            "0.3",
            "--max-wait",
            "10",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn sink");
    wait_bound("127.0.51.2:4791");
    let sent = json(
        bin()
            .args([
                "send",
                "127.0.51.2:4791",
                "--size",
                "1024",
                "--seconds",
                "0.3",
            ])
            .output()
            .expect("send"),
    );
    let got = json(sink.wait_with_output().expect("sink"));
    let (s, r) = (
        sent["packets"].as_u64().expect("packets"),
        got["packets"].as_u64().expect("packets"),
    );
    assert!(s > 0 && r > 0, "sent {s} received {r}");
    assert!(r <= s);
    assert_eq!(got["bytes"].as_u64(), Some(r * 1024));
    assert!(sent["gbps"].as_f64().expect("gbps") > 0.0);
}

#[test]
fn ping_pong_reports_percentiles() {
    let pong = bin()
        .args([
            "pong",
            "127.0.51.3:4791",
            "--idle",
            "0.5",
            "--max-secs",
            "20",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn pong");
    wait_bound("127.0.51.3:4791");
    let v = json(
        bin()
            .args([
                "ping",
                "127.0.51.3:4791",
                "--size",
                "64",
                "--iters",
                "300",
                "--warmup",
                "20",
            ])
            .output()
            .expect("ping"),
    );
    let echoed = json(pong.wait_with_output().expect("pong"))["echoed"]
        .as_u64()
        .expect("echoed");
    assert!(echoed >= 320, "echoed {echoed}");
    let r = &v["rtt_us"];
    let f = |k: &str| r[k].as_f64().expect(k);
    assert!(f("min") > 0.0);
    assert!(f("min") <= f("typical") && f("typical") <= f("p99") && f("p99") <= f("p99_9"));
    assert!(f("p99_9") <= f("max"));
}

#[test]
fn link_send_to_sink_counts_match() {
    let sink = bin()
        .args([
            "sink",
            "127.0.51.4:4791",
            "--idle",
            "0.3",
            "--max-wait",
            "10",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn sink");
    wait_bound("127.0.51.2:4791");
    let sent = json(
        bin()
            .args([
                "link-send",
                "127.0.51.4:4791",
                "--local",
                "127.0.51.5",
                "--size",
                "1024",
                "--seconds",
                "0.3",
            ])
            .output()
            .expect("link-send"),
    );
    let got = json(sink.wait_with_output().expect("sink"));
    let (s, r) = (
        sent["packets"].as_u64().expect("packets"),
        got["packets"].as_u64().expect("packets"),
    );
    assert!(s > 0 && r > 0 && r <= s, "sent {s} received {r}");
    // Each datagram is BTH (12) + payload + ICRC (4).
    assert_eq!(got["bytes"].as_u64(), Some(r * (1024 + 16)));
    assert_eq!(sent["tx_errors"].as_u64(), Some(0));
}
