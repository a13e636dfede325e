//! `rocev2 perf` meeting something that is not `rocev2 perf` on its TCP port, without `--perftest-compat`
//! (issue #18 item 3): it must say what the peer is and what to do, at once — not "Connection reset by peer", not a
//! wait for the whole `--timeout` ending in "16 bytes of an unfinished message had arrived", not a JSON parser's
//! "expected value at line 1 column 1".
//!
//! * a rocev2 client against Debian's `ib_write_bw` server (run on rocev2 through `rocev2 run`);
//! * Debian's `ib_write_bw` client against a rocev2 server;
//! * a rocev2 client against a server that greets with something else (an SSH banner).
//!
//! One host (127.0.63.1 and .2), no root. perftest comes from Debian's `perftest` (installed by `.ci/run`).

mod common;

use std::io::Write;
use std::net::TcpListener;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{Proc, bin, c_libraries, need_program, scratch, serial, strings, wait_socket};

const SERVER_IP: &str = "127.0.63.1";
const CLIENT_IP: &str = "127.0.63.2";

/// The run's `--timeout`; "at once" is well under it.
const TIMEOUT_S: u64 = 20;

#[test]
fn rocev2_client_against_perftest_server_names_the_flag() {
    need_program("ib_write_bw", "perftest");
    c_libraries();
    let _s = serial();
    let port = 18771;
    let dir = scratch("perftest-without-flag-client");
    let argv = strings(&[
        bin(),
        "run",
        "--ip",
        SERVER_IP,
        "--",
        "ib_write_bw",
        "-x",
        "0",
        "-p",
        &port.to_string(),
        "-n",
        "10",
    ]);
    let mut server = Proc::spawn("ib_write_bw", &dir, &argv);
    wait_socket(
        &mut server,
        "tcp",
        [127, 0, 63, 1],
        port,
        Duration::from_secs(30),
    );
    let t0 = Instant::now();
    let out = common::output_within(
        Command::new(bin())
            .args(["perf", "write-bw", SERVER_IP, "--ip", CLIENT_IP, "-n", "10"])
            .args(["-p", &port.to_string(), "--timeout", &TIMEOUT_S.to_string()]),
        common::RUN,
    );
    let dt = t0.elapsed();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "a rocev2 client cannot pair with perftest without the flag: {err}"
    );
    assert!(err.contains("--perftest-compat"), "names the flag: {err}");
    assert!(
        dt < Duration::from_secs(TIMEOUT_S / 2),
        "at once, not after --timeout: {dt:?} {err}"
    );
    drop(server); // perftest may still wait for a client that speaks its exchange
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn perftest_client_against_rocev2_server_is_named_at_once() {
    need_program("ib_write_bw", "perftest");
    c_libraries();
    let _s = serial();
    let port = 18772;
    let dir = scratch("perftest-without-flag-server");
    let argv = strings(&[
        bin(),
        "perf",
        "write-bw",
        "--ip",
        SERVER_IP,
        "-p",
        &port.to_string(),
        "-n",
        "10",
        "--timeout",
        &TIMEOUT_S.to_string(),
    ]);
    let mut server = Proc::spawn("rocev2-server", &dir, &argv);
    wait_socket(
        &mut server,
        "tcp",
        [127, 0, 63, 1],
        port,
        Duration::from_secs(30),
    );
    let t0 = Instant::now();
    let client = common::output_within(
        Command::new(bin())
            .args(["run", "--ip", CLIENT_IP, "--", "ib_write_bw", "-x", "0"])
            .args(["-p", &port.to_string(), "-n", "10", SERVER_IP]),
        common::RUN,
    );
    let s = server.wait(Duration::from_secs(TIMEOUT_S + 10));
    let dt = t0.elapsed();
    assert!(
        !s.status.success(),
        "the rocev2 server cannot pair with perftest without the flag:\n{s}"
    );
    assert!(
        s.stderr.contains("perftest") && s.stderr.contains("--perftest-compat"),
        "names perftest and the flag:\n{s}"
    );
    assert!(
        dt < Duration::from_secs(TIMEOUT_S / 2),
        "at once, not after --timeout: {dt:?}\n{s}\nib_write_bw: {}",
        String::from_utf8_lossy(&client.stderr)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn rocev2_client_against_another_program_shows_its_first_bytes() {
    let l = TcpListener::bind((SERVER_IP, 0)).expect("listen");
    let port = l.local_addr().expect("addr").port();
    let banner = std::thread::spawn(move || {
        let (mut s, _) = l.accept().expect("accept");
        s.write_all(b"SSH-2.0-OpenSSH_9.2p1 Debian-2\r\n")
            .expect("banner");
        std::thread::sleep(Duration::from_secs(3));
    });
    let t0 = Instant::now();
    let out = common::output_within(
        Command::new(bin())
            .args(["perf", "write-bw", SERVER_IP, "--ip", CLIENT_IP, "-n", "10"])
            .args(["-p", &port.to_string(), "--timeout", &TIMEOUT_S.to_string()]),
        common::RUN,
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("not rocev2 perf") && err.contains("SSH-2.0-OpenSSH"),
        "says what arrived: {err}"
    );
    assert!(
        !err.contains("line 1 column 1"),
        "no JSON parser jargon: {err}"
    );
    assert!(t0.elapsed() < Duration::from_secs(TIMEOUT_S / 2), "{err}");
    banner.join().expect("banner thread");
}
