//! End-to-end tests of `rocev2 pingpong`, running the built binary.
//!
//! * rocev2 server ↔ rocev2 client over loopback addresses (RC and UD, no privileges; each test has its own
//!   127.0.20N.x pair because the RoCE port 4791 is fixed, so tests can run in parallel);
//! * in a pair of network namespaces joined by a veth (root only, skipped otherwise): rocev2 server ↔
//!   `testdata/interop/host_pingpong_peer.py`, an independent Python implementation of the rdma-core pingpong
//!   client (RC and UD), with the server's `--pcap` checked by `testdata/tools/check_pcap.py`;
//! * the exchange: a peer that sends an all-zero GID (the rdma-core tools without `-g`) is refused at exchange time
//!   with an error naming both GIDs, on either side; an absent or silent peer ends the run with exit 1 in bounded
//!   time.

mod common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_rocev2")
}

fn testdata() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata")
}

fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Runs `cmd` (optionally inside network namespace `ns`) in the background, as a [`common::Proc`] (its own process
/// group, killed when dropped; output in a scratch directory of its own).
fn spawn(ns: Option<&str>, cmd: &[&str]) -> common::Proc {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = common::scratch(&format!("pingpong-{n}"));
    let mut c = match ns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns]).args(cmd);
            c
        }
        None => {
            let mut c = Command::new(cmd[0]);
            c.args(&cmd[1..]);
            c
        }
    };
    common::Proc::spawn_command("p", &dir, &mut c)
}

/// Waits for `child` at most `limit`; kills it (its process group) on timeout (the test then fails on the status).
fn wait_bounded(mut child: common::Proc, limit: Duration) -> (Output, Duration) {
    let t0 = Instant::now();
    while child.try_wait().is_none() && t0.elapsed() <= limit {
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill_group();
    let out = child.output(Duration::ZERO);
    (out, t0.elapsed())
}

fn text(o: &Output) -> String {
    format!(
        "status {:?} (signal {:?})\n--- stdout\n{}--- stderr\n{}",
        o.status.code(),
        o.status.signal(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Waits until something listens on TCP `port` (read from `/proc/net/tcp` of namespace `ns`, or of this one).
fn wait_listening(ns: Option<&str>, port: u16) {
    let want = format!(":{port:04X} ");
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(10) {
        let table = match ns {
            Some(ns) => Command::new("ip")
                .args(["netns", "exec", ns, "cat", "/proc/net/tcp"])
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                .unwrap_or_default(),
            None => std::fs::read_to_string("/proc/net/tcp").unwrap_or_default(),
        };
        // local_address is field 1, state field 3 (0A = LISTEN).
        if table.lines().any(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.len() > 3 && format!("{} ", f[1]).ends_with(&want) && f[3] == "0A"
        }) {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("nothing listens on TCP {port}");
}

/// Parses "N iters in X seconds = Y usec/iter".
fn iters_line(stdout: &str) -> Option<u32> {
    stdout
        .lines()
        .find(|l| l.contains("iters in") && l.ends_with("usec/iter"))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|n| n.parse().ok())
}

fn bytes_line(stdout: &str) -> Option<u64> {
    stdout
        .lines()
        .find(|l| l.contains("bytes in") && l.ends_with("Mbit/sec"))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|n| n.parse().ok())
}

/// rocev2 server and client over loopback `net`; both must succeed and agree.
fn loopback_pair(transport: &str, net: u8, port: u16, size: u32, iters: u32) {
    loopback_pair_with(transport, net, port, size, iters, &[]);
}

/// [`loopback_pair`] with `extra` arguments for both sides.
fn loopback_pair_with(transport: &str, net: u8, port: u16, size: u32, iters: u32, extra: &[&str]) {
    let srv_ip = format!("127.0.{net}.1");
    let cli_ip = format!("127.0.{net}.2");
    let (port_s, size_s, iters_s) = (port.to_string(), size.to_string(), iters.to_string());
    let common = [
        "-p",
        &port_s,
        "-s",
        &size_s,
        "-n",
        &iters_s,
        "-c",
        "--timeout",
        "20",
    ];
    let mut s_args = vec![bin(), "pingpong", transport, "--ip", &srv_ip];
    s_args.extend_from_slice(&common);
    s_args.extend_from_slice(extra);
    let server = spawn(None, &s_args);
    wait_listening(None, port);
    let mut c_args = vec![bin(), "pingpong", transport, &srv_ip, "--ip", &cli_ip];
    c_args.extend_from_slice(&common);
    c_args.extend_from_slice(extra);
    let client = spawn(None, &c_args);
    let (co, _) = wait_bounded(client, Duration::from_secs(60));
    let (so, _) = wait_bounded(server, Duration::from_secs(30));
    assert!(co.status.success(), "client: {}", text(&co));
    assert!(so.status.success(), "server: {}", text(&so));
    let (cout, sout) = (
        String::from_utf8_lossy(&co.stdout),
        String::from_utf8_lossy(&so.stdout),
    );
    for (out, local, remote) in [(&cout, &cli_ip, &srv_ip), (&sout, &srv_ip, &cli_ip)] {
        assert_eq!(iters_line(out), Some(iters), "{out}");
        assert_eq!(
            bytes_line(out),
            Some(2 * u64::from(size) * u64::from(iters)),
            "{out}"
        );
        let l = out
            .lines()
            .find(|l| l.starts_with("  local address:  LID 0x0000, QPN 0x"));
        let r = out
            .lines()
            .find(|l| l.starts_with("  remote address: LID 0x0000, QPN 0x"));
        assert!(
            l.is_some_and(|l| l.ends_with(&format!(" GID ::ffff:{local}"))),
            "{out}"
        );
        assert!(
            r.is_some_and(|r| r.ends_with(&format!(", GID ::ffff:{remote}"))),
            "{out}"
        );
    }
    // Each side's remote QPN/PSN is the other's local one.
    let field = |out: &str, which: &str| -> (String, String) {
        let l = out.lines().find(|l| l.contains(which)).unwrap_or_default();
        let after = |key: &str| {
            l.find(key)
                .and_then(|i| l.get(i + key.len()..i + key.len() + 6))
                .unwrap_or_default()
                .to_owned()
        };
        (after("QPN 0x"), after("PSN 0x"))
    };
    assert_eq!(
        field(&cout, "remote address"),
        field(&sout, "local address")
    );
    assert_eq!(
        field(&sout, "remote address"),
        field(&cout, "local address")
    );
}

/// Both progress modes, with and without completion events (`-e`).
#[test]
fn rc_loopback_progress_modes_and_events() {
    for (i, extra) in [
        &["--progress", "thread"][..],
        &["--progress", "thread", "-e"][..],
        &["--progress", "caller", "-e"][..],
    ]
    .iter()
    .enumerate()
    {
        loopback_pair_with("rc", 221 + i as u8, 18790 + i as u16, 1024, 200, extra);
    }
}

#[test]
fn rc_loopback_rocev2_pair() {
    loopback_pair("rc", 201, 18701, 4096, 300);
}

#[test]
fn ud_loopback_rocev2_pair() {
    loopback_pair("ud", 202, 18702, 1024, 300);
}

#[test]
fn rc_loopback_small_and_odd_size() {
    // 1 byte (one SEND_ONLY with 3 pad bytes) and 5000 bytes (FIRST/MIDDLE×3/LAST at MTU 1024).
    loopback_pair("rc", 203, 18703, 1, 50);
    loopback_pair("rc", 203, 18703, 5000, 50);
}

/// A fake rdma-core peer on loopback that sends `record` (52 bytes).
fn zero_gid_record() -> Vec<u8> {
    let mut r = b"0000:000011:123456:00000000000000000000000000000000".to_vec();
    r.push(0);
    assert_eq!(r.len(), 52);
    r
}

#[test]
fn server_refuses_zero_gid_client() {
    let port = 18704;
    let server = spawn(
        None,
        &[
            bin(),
            "pingpong",
            "--ip",
            "127.0.204.1",
            "-p",
            "18704",
            "--timeout",
            "10",
        ],
    );
    wait_listening(None, port);
    let mut c = TcpStream::connect(("127.0.204.1", port)).expect("connect");
    c.write_all(&zero_gid_record()).expect("write record");
    // The server refuses before answering: we see the connection close without its record.
    c.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let mut buf = Vec::new();
    let _ = c.read_to_end(&mut buf);
    assert!(buf.is_empty(), "server answered {buf:?}");
    let (o, dt) = wait_bounded(server, Duration::from_secs(20));
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("GID refused")
            && err.contains("all-zero GID")
            && err.contains("::ffff:127.0.0.1")
            && err.contains("-g N"),
        "{}",
        text(&o)
    );
    assert!(dt < Duration::from_secs(15), "{dt:?}");
}

#[test]
fn client_refuses_zero_gid_server() {
    let l = TcpListener::bind(("127.0.205.1", 0)).expect("listen");
    let port = l.local_addr().expect("addr").port();
    let fake = std::thread::spawn(move || {
        let (mut s, _) = l.accept().expect("accept");
        let mut rec = [0u8; 52];
        s.read_exact(&mut rec).expect("client record");
        s.write_all(&zero_gid_record()).expect("write");
        let mut rest = Vec::new();
        s.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("t");
        let _ = s.read_to_end(&mut rest);
        (rec, rest)
    });
    let port_s = port.to_string();
    let client = spawn(
        None,
        &[
            bin(),
            "pingpong",
            "127.0.205.1",
            "--ip",
            "127.0.205.2",
            "-p",
            &port_s,
            "--timeout",
            "10",
        ],
    );
    let (o, dt) = wait_bounded(client, Duration::from_secs(20));
    let (rec, rest) = fake.join().expect("fake server");
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("GID refused") && err.contains("::ffff:127.0.205.1") && err.contains("-g N"),
        "{}",
        text(&o)
    );
    // The client's own record: LID 0, its GID, 52 bytes with the NUL; no "done" after a refused record.
    let rec = String::from_utf8_lossy(&rec);
    assert!(
        rec.starts_with("0000:") && rec.ends_with("00000000000000000000ffff7f00cd02\0"),
        "{rec:?}"
    );
    assert!(rest.is_empty(), "client sent {rest:?} after refusing");
    assert!(dt < Duration::from_secs(15), "{dt:?}");
}

#[test]
fn absent_and_silent_peers_end_in_bounded_time() {
    // Nothing listens: the client fails at once.
    let (o, dt) = wait_bounded(
        spawn(
            None,
            &[
                bin(),
                "pingpong",
                "127.0.206.1",
                "--ip",
                "127.0.206.2",
                "-p",
                "18706",
            ],
        ),
        Duration::from_secs(20),
    );
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(String::from_utf8_lossy(&o.stderr).contains("Couldn't connect to 127.0.206.1:18706"));
    assert!(dt < Duration::from_secs(10), "{dt:?}");

    // No client comes: the server gives up after --timeout.
    let (o, dt) = wait_bounded(
        spawn(
            None,
            &[
                bin(),
                "pingpong",
                "--ip",
                "127.0.206.1",
                "-p",
                "18707",
                "--timeout",
                "1",
            ],
        ),
        Duration::from_secs(20),
    );
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(String::from_utf8_lossy(&o.stderr).contains("no client connected"));
    assert!(dt < Duration::from_secs(10), "{dt:?}");

    // A server that completes the exchange but runs no RoCE stack: RC retries run out (7 × ≈67 ms).
    let l = TcpListener::bind(("127.0.206.1", 0)).expect("listen");
    let port = l.local_addr().expect("addr").port();
    let fake = std::thread::spawn(move || {
        let (mut s, _) = l.accept().expect("accept");
        let mut rec = [0u8; 52];
        s.read_exact(&mut rec).expect("client record");
        let mut mine = b"0000:000011:000100:00000000000000000000ffff7f00ce01".to_vec();
        mine.push(0);
        s.write_all(&mine).expect("write");
        let mut done = [0u8; 5];
        s.read_exact(&mut done).expect("done");
        done
    });
    let port_s = port.to_string();
    let (o, dt) = wait_bounded(
        spawn(
            None,
            &[
                bin(),
                "pingpong",
                "127.0.206.1",
                "--ip",
                "127.0.206.2",
                "-p",
                &port_s,
                "--timeout",
                "10",
            ],
        ),
        Duration::from_secs(30),
    );
    assert_eq!(&fake.join().expect("fake"), b"done\0");
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("IBV_WC_RETRY_EXC_ERR"),
        "{}",
        text(&o)
    );
    assert!(dt < Duration::from_secs(15), "{dt:?}");

    // UD has no acknowledgements: the client stops after --timeout without a completion.
    let l = TcpListener::bind(("127.0.206.1", 0)).expect("listen");
    let port = l.local_addr().expect("addr").port();
    let fake = std::thread::spawn(move || {
        let (mut s, _) = l.accept().expect("accept");
        let mut rec = [0u8; 52];
        s.read_exact(&mut rec).expect("client record");
        let mut mine = b"0000:000011:000100:00000000000000000000ffff7f00ce01".to_vec();
        mine.push(0);
        s.write_all(&mine).expect("write");
        let mut done = [0u8; 5];
        let _ = s.read_exact(&mut done);
    });
    let port_s = port.to_string();
    let (o, dt) = wait_bounded(
        spawn(
            None,
            &[
                bin(),
                "pingpong",
                "ud",
                "127.0.206.1",
                "--ip",
                "127.0.206.2",
                "-p",
                &port_s,
                "--timeout",
                "1",
            ],
        ),
        Duration::from_secs(20),
    );
    let _ = fake.join();
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("no completion for 1.0 s"),
        "{}",
        text(&o)
    );
    assert!(dt < Duration::from_secs(10), "{dt:?}");
}

/// Two namespaces joined by a veth (`scripts/netns.sh`), deleted on drop.
struct NetnsPair {
    a: String,
    b: String,
}

impl NetnsPair {
    fn up(tag: &str, ip_a: &str, ip_b: &str) -> Result<NetnsPair, String> {
        // Root (namespaces, AF_PACKET) is needed; `id -u` avoids unsafe code here.
        let uid = Command::new("id")
            .arg("-u")
            .output()
            .map_err(|e| e.to_string())?;
        if String::from_utf8_lossy(&uid.stdout).trim() != "0" {
            return Err("not root".into());
        }
        let pid = std::process::id();
        let p = NetnsPair {
            a: format!("pp{tag}{pid}a"),
            b: format!("pp{tag}{pid}b"),
        };
        let out = Command::new("bash")
            .arg(workspace().join("scripts/netns.sh"))
            .args(["up", &p.a, &p.b, ip_a, ip_b, "1500"])
            .output()
            .map_err(|e| format!("netns.sh: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "netns.sh up failed: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        Ok(p)
    }
}

impl Drop for NetnsPair {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .arg(workspace().join("scripts/netns.sh"))
            .args(["down", &self.a, &self.b])
            .status();
    }
}

/// `-u` sets the RC QP's local ACK timeout: against a peer that completes the exchange but never acknowledges,
/// `-u 18` (≈1.07 s per try, 8 tries with retry count 7) takes at least 7 s to reach RETRY_EXC_ERR, where the
/// default 14 takes ≈0.5 s; `-u 0` is refused as a bad argument.
#[test]
fn qp_timeout_sets_the_local_ack_timeout() {
    let bad = common::output_within(
        Command::new(bin()).args(["pingpong", "127.0.208.1", "-u", "0"]),
        common::SHORT,
    );
    assert_eq!(bad.status.code(), Some(2), "{}", text(&bad));
    for (u, min, max) in [("14", 0.0, 6.0), ("18", 7.0, 25.0)] {
        let l = TcpListener::bind(("127.0.208.1", 0)).expect("listen");
        let port = l.local_addr().expect("addr").port();
        let fake = std::thread::spawn(move || {
            let (mut s, _) = l.accept().expect("accept");
            let mut rec = [0u8; 52];
            s.read_exact(&mut rec).expect("client record");
            let mut mine = b"0000:000011:000100:00000000000000000000ffff7f00d001".to_vec();
            mine.push(0);
            s.write_all(&mine).expect("write");
            let mut done = [0u8; 5];
            s.read_exact(&mut done).expect("done");
            done
        });
        let port_s = port.to_string();
        let (o, dt) = wait_bounded(
            spawn(
                None,
                &[
                    bin(),
                    "pingpong",
                    "127.0.208.1",
                    "--ip",
                    "127.0.208.2",
                    "-p",
                    &port_s,
                    "-u",
                    u,
                    "--timeout",
                    "30",
                ],
            ),
            Duration::from_secs(60),
        );
        assert_eq!(&fake.join().expect("fake"), b"done\0");
        assert_eq!(o.status.code(), Some(1), "-u {u}: {}", text(&o));
        assert!(
            String::from_utf8_lossy(&o.stderr).contains("IBV_WC_RETRY_EXC_ERR"),
            "-u {u}: {}",
            text(&o)
        );
        let secs = dt.as_secs_f64();
        assert!(secs >= min && secs < max, "-u {u}: {secs:.2} s");
    }
}

/// Runs `check_pcap.py --quiet`; returns `(passed, failed)` from its last line.
fn check_pcap(file: &Path) -> Option<(u64, u64)> {
    let out = Command::new("python3")
        .arg(testdata().join("tools/check_pcap.py"))
        .arg("--quiet")
        .arg(file)
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let last = text.lines().last()?.to_owned();
    // "N passed, M failed"
    let mut it = last.split_whitespace();
    let passed = it.next()?.parse().ok()?;
    let failed = it.nth(1)?.parse().ok()?;
    assert_eq!(out.status.success(), failed == 0, "{text}");
    Some((passed, failed))
}

/// rocev2 server in namespace B ↔ host_pingpong_peer.py client in namespace A.
fn python_peer(transport: &str, tag: &str, size: u32, iters: u32, expect_packets: u64) {
    let net = if transport == "rc" { 8 } else { 9 };
    let (ip_a, ip_b) = (format!("198.18.{net}.1"), format!("198.18.{net}.2"));
    let ns = match NetnsPair::up(tag, &format!("{ip_a}/24"), &format!("{ip_b}/24")) {
        Ok(n) => n,
        Err(why) => {
            eprintln!("skipping netns test: {why}");
            return;
        }
    };
    let peer = testdata().join("interop/host_pingpong_peer.py");
    if !peer.exists() || Command::new("python3").arg("-V").output().is_err() {
        eprintln!("skipping: python3 or {} unavailable", peer.display());
        return;
    }
    let pcap =
        std::env::temp_dir().join(format!("pingpong_{transport}_{}.pcap", std::process::id()));
    let pcap_s = pcap.to_string_lossy().into_owned();
    let (size_s, iters_s) = (size.to_string(), iters.to_string());
    let server = spawn(
        Some(&ns.b),
        &[
            bin(),
            "pingpong",
            transport,
            "--ip",
            &ip_b,
            "-s",
            &size_s,
            "-n",
            &iters_s,
            "-c",
            "--pcap",
            &pcap_s,
            "--timeout",
            "20",
        ],
    );
    wait_listening(Some(&ns.b), 18515);
    let peer_s = peer.to_string_lossy().into_owned();
    let client = spawn(
        Some(&ns.a),
        &[
            "python3",
            &peer_s,
            transport,
            &ip_b,
            "--size",
            &size_s,
            "--iters",
            &iters_s,
            "--local-ip",
            &ip_a,
            "--ifname",
            "veth0",
            "--timeout",
            "10",
        ],
    );
    let (co, _) = wait_bounded(client, Duration::from_secs(60));
    let (so, _) = wait_bounded(server, Duration::from_secs(30));
    assert!(co.status.success(), "python peer: {}", text(&co));
    assert!(so.status.success(), "rocev2 server: {}", text(&so));
    let cout = String::from_utf8_lossy(&co.stdout);
    assert!(
        cout.contains(&format!("{iters} iters of {size} bytes")),
        "{cout}"
    );
    assert!(cout.contains(" 0 bad"), "{cout}");
    let sout = String::from_utf8_lossy(&so.stdout);
    assert_eq!(iters_line(&sout), Some(iters), "{sout}");
    assert!(sout.contains(&format!("GID ::ffff:{ip_a}")), "{sout}");
    match check_pcap(&pcap) {
        Some((passed, failed)) => {
            assert_eq!(failed, 0);
            assert!(passed >= expect_packets, "{passed} packets in the capture");
        }
        None => eprintln!("python3 check_pcap.py not run"),
    }
    let _ = std::fs::remove_file(&pcap);
}

#[test]
fn rc_netns_rocev2_server_python_client() {
    // 4096 bytes at MTU 1024: 4 data packets each way per iteration plus ACKs.
    python_peer("rc", "r", 4096, 100, 100 * 8);
}

#[test]
fn ud_netns_rocev2_server_python_client() {
    python_peer("ud", "u", 1024, 100, 200);
}

/// A namespace with IPv6 addresses fd00::1 and fd00::2 on `lo`; deleted on drop.
struct Netns6(String);

impl Netns6 {
    fn up(tag: &str) -> Result<Netns6, String> {
        let uid = Command::new("id")
            .arg("-u")
            .output()
            .map_err(|e| e.to_string())?;
        if String::from_utf8_lossy(&uid.stdout).trim() != "0" {
            return Err("not root".into());
        }
        let ns = Netns6(format!("pp{tag}{}", std::process::id()));
        let run = |args: &[&str]| {
            Command::new("ip")
                .args(args)
                .status()
                .is_ok_and(|s| s.success())
        };
        let ok = run(&["netns", "add", &ns.0])
            && run(&["-n", &ns.0, "link", "set", "lo", "up"])
            && run(&[
                "-n",
                &ns.0,
                "addr",
                "add",
                "fd00::1/128",
                "dev",
                "lo",
                "nodad",
            ])
            && run(&[
                "-n",
                &ns.0,
                "addr",
                "add",
                "fd00::2/128",
                "dev",
                "lo",
                "nodad",
            ]);
        if ok {
            Ok(ns)
        } else {
            Err("cannot set up the IPv6 namespace".into())
        }
    }
}

impl Drop for Netns6 {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

#[test]
fn rc_ipv6_both_receive_modes() {
    let ns = match Netns6::up("6") {
        Ok(n) => n,
        Err(why) => {
            eprintln!("skipping netns test: {why}");
            return;
        }
    };
    for (rx, port) in [("socket", 18710u16), ("packet", 18711)] {
        let pcap =
            std::env::temp_dir().join(format!("pingpong_v6_{rx}_{}.pcap", std::process::id()));
        let (pcap_s, port_s) = (pcap.to_string_lossy().into_owned(), port.to_string());
        let server = spawn(
            Some(&ns.0),
            &[
                bin(),
                "pingpong",
                "rc",
                "--ip",
                "fd00::1",
                "-p",
                &port_s,
                "-n",
                "100",
                "-c",
                "--rx",
                rx,
                "--pcap",
                &pcap_s,
                "--timeout",
                "20",
            ],
        );
        wait_listening6(&ns.0, port);
        let client = spawn(
            Some(&ns.0),
            &[
                bin(),
                "pingpong",
                "rc",
                "fd00::1",
                "--ip",
                "fd00::2",
                "-p",
                &port_s,
                "-n",
                "100",
                "-c",
                "--rx",
                rx,
                "--timeout",
                "20",
            ],
        );
        let (co, _) = wait_bounded(client, Duration::from_secs(60));
        let (so, _) = wait_bounded(server, Duration::from_secs(30));
        assert!(co.status.success(), "{rx} client: {}", text(&co));
        assert!(so.status.success(), "{rx} server: {}", text(&so));
        let sout = String::from_utf8_lossy(&so.stdout);
        assert_eq!(iters_line(&sout), Some(100), "{sout}");
        assert!(
            sout.contains("GID fd00::1") && sout.contains("GID fd00::2"),
            "{sout}"
        );
        if let Some((passed, failed)) = check_pcap(&pcap) {
            assert_eq!(failed, 0);
            // 4 data packets each way per iteration, plus ACKs.
            assert!(passed >= 800, "{passed}");
        }
        let _ = std::fs::remove_file(&pcap);
    }
}

/// Waits until something listens on TCP `port` over IPv6 in namespace `ns` (`/proc/net/tcp6`).
fn wait_listening6(ns: &str, port: u16) {
    let want = format!(":{port:04X}");
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(10) {
        let table = Command::new("ip")
            .args(["netns", "exec", ns, "cat", "/proc/net/tcp6"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        if table.lines().any(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.len() > 3 && f[1].ends_with(&want) && f[3] == "0A"
        }) {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("nothing listens on TCP6 {port}");
}

#[test]
fn unprivileged_auto_falls_back_to_socket_and_packet_is_refused() {
    let ns = match NetnsPair::up("n", "198.18.10.1/24", "198.18.10.2/24") {
        Ok(n) => n,
        Err(why) => {
            eprintln!("skipping netns test: {why}");
            return;
        }
    };
    if Command::new("setpriv").arg("--version").output().is_err() {
        eprintln!("skipping: setpriv unavailable");
        return;
    }
    let nobody = [
        "setpriv",
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
    ];
    let with = |cmd: &[&str]| -> Vec<String> {
        nobody.iter().chain(cmd).map(|s| (*s).to_owned()).collect()
    };
    // The peer is on another host (namespace): auto would pick packet mode, which needs CAP_NET_RAW.
    let s_cmd = with(&[
        bin(),
        "pingpong",
        "--ip",
        "198.18.10.2",
        "-n",
        "50",
        "-c",
        "--timeout",
        "20",
    ]);
    let server = spawn(Some(&ns.b), &as_refs(&s_cmd));
    wait_listening(Some(&ns.b), 18515);
    let c_cmd = with(&[
        bin(),
        "pingpong",
        "198.18.10.2",
        "-n",
        "50",
        "-c",
        "--timeout",
        "20",
    ]);
    let client = spawn(Some(&ns.a), &as_refs(&c_cmd));
    let (co, _) = wait_bounded(client, Duration::from_secs(60));
    let (so, _) = wait_bounded(server, Duration::from_secs(30));
    for (side, o) in [("client", &co), ("server", &so)] {
        assert!(o.status.success(), "{side}: {}", text(o));
        assert!(
            String::from_utf8_lossy(&o.stderr).contains("AF_PACKET receive not permitted"),
            "{side}: {}",
            text(o)
        );
        assert_eq!(iters_line(&String::from_utf8_lossy(&o.stdout)), Some(50));
    }
    // Asked for explicitly, packet mode is an error naming the capability.
    let s_cmd = with(&[
        bin(),
        "pingpong",
        "--ip",
        "198.18.10.2",
        "--rx",
        "packet",
        "--timeout",
        "20",
    ]);
    let server = spawn(Some(&ns.b), &as_refs(&s_cmd));
    wait_listening(Some(&ns.b), 18515);
    let c_cmd = with(&[
        bin(),
        "pingpong",
        "198.18.10.2",
        "--rx",
        "socket",
        "--timeout",
        "5",
    ]);
    let client = spawn(Some(&ns.a), &as_refs(&c_cmd));
    let (so, dt) = wait_bounded(server, Duration::from_secs(30));
    let (co, _) = wait_bounded(client, Duration::from_secs(30));
    assert_eq!(so.status.code(), Some(1), "{}", text(&so));
    assert!(
        String::from_utf8_lossy(&so.stderr).contains("CAP_NET_RAW"),
        "{}",
        text(&so)
    );
    assert_eq!(co.status.code(), Some(1), "{}", text(&co));
    assert!(dt < Duration::from_secs(20), "{dt:?}");
}

fn as_refs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}
