//! Hostile out-of-band peers against the real `rocev2` binary: bad input must end in a clear error and a non-zero
//! exit (never a panic, exit code 101) within the timeout.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

/// A `rocev2 perf write-bw` server with `--timeout timeout_s` on `ip`:`port`, and a TCP connection to it (made
/// within 10 s of its start).
fn server_and_client(port: u16, timeout_s: &str, ip: &str) -> (common::Proc, TcpStream) {
    let dir = common::scratch(&format!("hostile-{port}"));
    let srv = common::Proc::spawn_command(
        "server",
        &dir,
        Command::new(env!("CARGO_BIN_EXE_rocev2"))
            .args([
                "perf",
                "write-bw",
                "--timeout",
                timeout_s,
                "-p",
                &port.to_string(),
            ])
            .args(["--ip", ip])
            .env("RUST_BACKTRACE", "1"),
    );
    let t0 = Instant::now();
    loop {
        match TcpStream::connect((ip, port)) {
            Ok(s) => return (srv, s),
            Err(_) if t0.elapsed() < Duration::from_secs(10) => {
                std::thread::sleep(Duration::from_millis(50))
            }
            Err(e) => panic!("server never listened: {e}"),
        }
    }
}

/// A `rocev2 perf` server on 127.0.0.221:`port`; a hostile client sends one `hello` with `params`.
fn server_vs_hello(port: u16, params: &str) -> (Option<i32>, String) {
    let (mut srv, mut s) = server_and_client(port, "3", "127.0.0.221");
    let line = format!(r#"{{"proto":"rocev2-perf","v":1,"kind":"hello","body":{params}}}"#);
    s.write_all(line.as_bytes()).expect("write");
    s.write_all(b"\n").expect("write");
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let mut reply = String::new();
    let _ = BufReader::new(&s).read_line(&mut reply);
    drop(s);
    let out = srv.output(common::RUN);
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn huge_duration_from_the_client_is_an_error_not_a_panic() {
    // Before the fix: `Duration::from_secs_f64(1e300)` panicked in the server (exit 101).
    let params = r#"{"test":"write-bw","conn":"RC","sizes":[64],"iters":10,"duration_s":1e300,"qps":1,"tx_depth":16,"mtu":1024,"inline":0,"cq_mod":1,"post_list":1}"#;
    let (code, err) = server_vs_hello(18721, params);
    assert_ne!(code, Some(101), "panicked: {err}");
    assert_ne!(code, Some(0), "accepted a 1e300 s duration: {err}");
    assert!(err.contains("duration_s"), "unclear error: {err}");
}

/// A `rocev2 perf` server with `--timeout 2` on 127.0.0.222:`port`; `feed` plays the hostile client on the TCP
/// connection. Returns the exit code, stderr and how long the server took to exit after the connection.
fn server_vs(port: u16, feed: impl FnOnce(&mut TcpStream)) -> (Option<i32>, String, Duration) {
    let (mut srv, mut s) = server_and_client(port, "2", "127.0.0.222");
    let t1 = Instant::now();
    feed(&mut s);
    let out = srv.output(common::RUN);
    let took = t1.elapsed();
    drop(s);
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        took,
    )
}

#[test]
fn dribbling_client_is_cut_off_at_the_timeout() {
    // One byte every 200 ms, never a newline: before the overall deadline each byte restarted the 2 s read
    // timeout, so the server waited as long as the peer kept dribbling.
    let (code, err, took) = server_vs(18722, |s| {
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(8) {
            if s.write_all(b"{").is_err() {
                break;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    });
    assert_ne!(code, Some(101), "panicked: {err}");
    assert_ne!(code, Some(0), "accepted a dribbling peer: {err}");
    assert!(
        took < Duration::from_secs(7),
        "server held on for {took:?}: {err}"
    );
    // Which wait ran out, after how long, and that bytes did arrive (it said "Resource temporarily unavailable
    // (os error 11)" before).
    assert!(
        err.contains("waiting for `hello`")
            && err.contains("timed out after 2 s (--timeout)")
            && err.contains("bytes of an unfinished message"),
        "unclear error: {err}"
    );
    assert!(!err.contains("os error"), "raw OS error: {err}");
}

#[test]
fn endless_line_is_refused_not_buffered() {
    // 4 MiB with no newline, starting like a message (bytes that cannot start one are refused at once, as not
    // rocev2 perf): refused once it passes the 1 MiB message cap.
    let (code, err, _) = server_vs(18723, |s| {
        let _ = s.write_all(br#"{"proto":"rocev2-perf","v":1,"kind":"hello","body":""#);
        let chunk = vec![b'a'; 64 << 10];
        for _ in 0..64 {
            if s.write_all(&chunk).is_err() {
                break;
            }
        }
    });
    assert_ne!(code, Some(101), "panicked: {err}");
    assert_ne!(code, Some(0), "accepted an endless line: {err}");
    assert!(err.contains("longer than"), "unclear error: {err}");
}

#[test]
fn a_client_asking_for_more_send_wrs_than_a_run_allows_is_refused() {
    // `-q` may be up to 16,384 (perftest's limit); 16,384 QPs of 15,000 WRs would be tens of GB on the server.
    let params = r#"{"test":"write-bw","conn":"RC","sizes":[64],"iters":10,"qps":16384,"tx_depth":15000,"mtu":1024,"inline":0,"cq_mod":1,"post_list":1}"#;
    let (code, err) = server_vs_hello(18729, params);
    assert_ne!(code, Some(101), "panicked: {err}");
    assert_ne!(code, Some(0), "accepted 16,384 x 15,000 WRs: {err}");
    assert!(err.contains("send WRs"), "unclear error: {err}");
}
