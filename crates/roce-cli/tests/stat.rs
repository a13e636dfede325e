//! `rocev2 stat` against a live `rocev2 perf --loopback` run: the counters and signals of both devices, read from the
//! running process through its stats endpoints (in a private run directory, `ROCEV2_RUN_DIR`), the QP dump, and
//! nothing once the run has ended.

mod common;

use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::{Proc, scratch, serial};
use serde_json::Value;

fn stat(run_dir: &Path, args: &[&str]) -> Output {
    common::output_within(
        Command::new(common::bin())
            .arg("stat")
            .args(args)
            .env("ROCEV2_RUN_DIR", run_dir),
        common::SHORT,
    )
}

/// Starts `rocev2 perf ARGS --loopback` with its endpoints in `run_dir`; returns once both runtimes' sockets exist.
fn perf(dir: &Path, run_dir: &Path, args: &[&str]) -> Proc {
    let mut argv = vec![
        common::bin().to_owned(),
        "perf".to_owned(),
        // `env` puts the run directory into the child's environment (Proc takes an argv).
    ];
    argv.extend(args.iter().map(|s| (*s).to_owned()));
    let mut full = vec![
        "env".to_owned(),
        format!("ROCEV2_RUN_DIR={}", run_dir.display()),
    ];
    full.extend(argv);
    let mut p = Proc::spawn("perf", dir, &full);
    let t0 = Instant::now();
    while sockets(run_dir).len() < 2 {
        assert!(
            p.try_wait().is_none(),
            "perf ended early\n{}",
            p.output_so_far()
        );
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "no endpoints in {}\n{}",
            run_dir.display(),
            p.output_so_far()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    p
}

fn sockets(run_dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(run_dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "sock"))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn stat_reads_a_running_perf() {
    let _serial = serial();
    let dir = scratch("stat");
    let run_dir = dir.join("run");
    let mut p = perf(
        &dir,
        &run_dir,
        &[
            "write-bw",
            "--loopback",
            "--loopback-ips",
            "127.0.48.1,127.0.48.2",
            "-s",
            "1024",
            "-l",
            "4",
            "-D",
            "6",
        ],
    );
    // Give the run time to start sending (the endpoints exist from the device's creation on).
    std::thread::sleep(Duration::from_millis(1500));
    let out = stat(&run_dir, &["--json", "--interval", "0.5"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("json");
    let rts = v["runtimes"].as_array().expect("runtimes");
    // --loopback over UDP: one process, one runtime per end.
    assert_eq!(rts.len(), 2, "{v}");
    let pid = p.pid();
    let devs: Vec<&Value> = rts
        .iter()
        .inspect(|r| assert_eq!(r["pid"], pid, "{r}"))
        .flat_map(|r| r["devices"].as_array().expect("devices").iter())
        .collect();
    let by_gid = |g: &str| {
        *devs
            .iter()
            .find(|d| d["gids"][0] == g)
            .unwrap_or_else(|| panic!("no device {g}: {v}"))
    };
    let client = by_gid("::ffff:127.0.48.2");
    let server = by_gid("::ffff:127.0.48.1");
    let cs = &client["signals"];
    // The client posts chains of 4 WRITEs (-l 4): one doorbell each.
    let wpd = cs["wqes_per_doorbell"].as_f64().expect("wqes/doorbell");
    assert!((3.9..=4.1).contains(&wpd), "{cs}");
    assert!(cs["doorbells_per_s"].as_f64() > Some(0.0), "{cs}");
    // Packets per link I/O call: every call carried at least one; the client's chains of 4 go out together.
    let tx_io = cs["tx_pkts_per_io"]
        .as_f64()
        .expect("tx packets per I/O call");
    let rx_io = server["signals"]["rx_pkts_per_io"]
        .as_f64()
        .expect("rx packets per I/O call");
    eprintln!("client: {tx_io:.2} packets per transmit call; server: {rx_io:.2} per receive call");
    assert!(tx_io >= 2.0, "{cs}");
    assert!(rx_io >= 1.0, "{}", server["signals"]);
    // The loopback loses nothing, but the product does not promise zero retransmissions: on a loaded host a pass
    // can run later than the 67 ms local ACK timeout (`max_pass_gap_us`), and the requester then retransmits as
    // IBTA requires. What it does promise: every retransmission here comes from a local ACK timeout, never from a
    // sequence NAK (the responder saw no gap), and the flag says whether the rate is above 5 %.
    let rate = cs["retrans_rate"].as_f64().expect("retrans_rate");
    assert!((0.0..=1.0).contains(&rate), "{cs}");
    assert_eq!(cs["retrans_flag"], rate > 0.05, "{cs}");
    let cc = |k: &str| client["counters"][k].as_u64().unwrap_or(0);
    assert!(
        rate == 0.0 || cc("local_ack_timeout_err") > 0,
        "retransmissions without a local ACK timeout on a lossless link: {cs}\n{}",
        client["counters"]
    );
    assert_eq!(cc("rcvd_seq_err"), 0, "no loss: {}", client["counters"]);
    assert!(cs["max_pass_gap_us"].is_u64(), "{cs}");
    assert!(cs["sent_pps"].as_f64() > Some(0.0), "{cs}");
    assert!(server["signals"]["rcvd_pps"].as_f64() > Some(0.0));
    assert!(
        server["counters"]["rx_write_requests"].as_u64() > Some(0),
        "{server}"
    );
    // The perf QP (QP 1, the GSI, is listed too).
    let q = client["qps"]
        .as_array()
        .and_then(|v| v.iter().find(|q| q["type"] == "RC").cloned())
        .unwrap_or_default();
    let q = &q;
    assert_eq!(
        (&q["type"], &q["state"]),
        (&"RC".into(), &"RTS".into()),
        "{q}"
    );
    assert!(q["sq_outstanding"].as_u64() <= Some(128), "{q}");
    // Each end numbers its QPs from an offset drawn from its engine's seed (`roce_proto::QpnRange`): the QPNs the
    // text and `--qp` checks below look for are the ones the JSON reports.
    let rc_qpn = |d: &Value| {
        d["qps"]
            .as_array()
            .and_then(|v| v.iter().find(|q| q["type"] == "RC"))
            .and_then(|q| q["qpn"].as_u64())
            .unwrap_or_else(|| panic!("no RC QP: {d}"))
    };
    let (cq, sq) = (rc_qpn(client), rc_qpn(server));

    // --interval 0: one snapshot, at once: the counters and queue depths, no rates (they need two snapshots).
    let out = stat(&run_dir, &["--json", "--interval", "0"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v0: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v0["interval_s"], 0.0, "{v0}");
    let d0 = &v0["runtimes"][0]["devices"][0];
    assert!(d0["counters"]["sent_pkts"].as_u64() > Some(0), "{d0}");
    assert!(d0["signals"]["sq_depth"].is_u64(), "{d0}");
    assert!(d0["signals"].get("sent_pps").is_none(), "{d0}");
    assert_eq!(
        stat(&run_dir, &["-w", "1", "--interval", "0"])
            .status
            .code(),
        Some(2),
        "watch mode keeps a positive --interval"
    );

    // Text: a link line per device, a qp line per QP, the signals.
    let out = stat(&run_dir, &["--interval", "0.3"]);
    let t = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    // One device naming for stat, devinfo and perf's banner: `rocev2_<interface>` (127.0.48.x is on `lo`), the port
    // `/1` as `rdma statistic` writes a link; the two ends in one process are told apart by pid and GID.
    let devinfo = common::output_within(
        Command::new(common::bin())
            .args(["devinfo", "--json", "-d", "127.0.48.1"])
            .env("ROCEV2_RUN_DIR", &run_dir),
        common::SHORT,
    );
    let di: Value = serde_json::from_slice(&devinfo.stdout).expect("devinfo json");
    assert_eq!(di[0]["hca_id"], "rocev2_lo", "{di}");
    assert_eq!(client["name"], di[0]["hca_id"], "{client}");
    assert_eq!(server["name"], di[0]["hca_id"], "{server}");
    for want in [
        &format!("link rocev2_lo/1 127.0.48.2 pid {pid} comm rocev2\n"),
        &format!("link rocev2_lo/1 127.0.48.1 pid {pid} comm rocev2\n"),
        &format!("qp {sq:#x} rocev2_lo/1 127.0.48.1 type RC state RTS"),
        &format!("qp {cq:#x} rocev2_lo/1 127.0.48.2 type RC state RTS"),
        " Gb/s ",
        "wqes/doorbell 4.00",
        "per I/O call",
        "max_pass_gap_us ",
    ] {
        assert!(t.contains(want), "`{want}` not in:\n{t}");
    }
    // Issue #18 item 6: the report fits a 120-column terminal; `--wide` keeps one line per device and QP.
    assert!(
        t.lines().all(|l| l.chars().count() <= 120),
        "a line over 120 columns:\n{t}"
    );
    let wide = stat(&run_dir, &["--interval", "0.2", "--wide"]);
    let w = String::from_utf8_lossy(&wide.stdout);
    assert_eq!(
        w.lines().filter(|l| l.starts_with("link ")).count(),
        2,
        "{w}"
    );
    assert!(
        w.lines()
            .all(|l| l.starts_with("link ") || l.starts_with("qp ")),
        "--wide: one line per device and QP:\n{w}"
    );
    // The rate as a percentage (not necessarily 0: see the JSON check above).
    assert!(
        t.lines()
            .any(|l| l.split_once(" retrans ").is_some_and(|(_, r)| r
                .split_once(" %")
                .is_some_and(|(n, _)| n.parse::<f64>().is_ok()))),
        "no `retrans N.NN %` in:\n{t}"
    );

    // --qp: the engine's dump of the client's QP on every device that has that QPN (the client's; the server's too
    // only if both ends drew the same one), in verbs terms with PSNs in hex, no Rust debug text.
    let (cqs, sqs) = (format!("{cq:#x}"), format!("{sq:#x}"));
    let out = stat(&run_dir, &["--qp", &cqs, "--pid", &pid.to_string()]);
    let t = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{t}");
    let both = if cq == sq { 2 } else { 1 };
    assert_eq!(t.matches(&format!("QP {cqs}:")).count(), both, "{t}");
    // `--ip` picks one end.
    let one = stat(
        &run_dir,
        &[
            "--qp",
            &sqs,
            "--pid",
            &pid.to_string(),
            "--ip",
            "127.0.48.1",
        ],
    );
    let one = format!(
        "{}{}",
        String::from_utf8_lossy(&one.stdout),
        String::from_utf8_lossy(&one.stderr)
    );
    assert_eq!(
        one.matches(&format!("QP {sqs}:")).count(),
        1,
        "{one}\nJSON: {v}"
    );
    assert!(
        one.contains(&format!(
            "device rocev2_lo/1 127.0.48.1 gid ::ffff:127.0.48.1 QP {sqs}:"
        )),
        "{one}"
    );
    for want in [
        &format!("device rocev2_lo/1 127.0.48.2 gid ::ffff:127.0.48.2 QP {cqs}:"),
        "RC state=RTS",
        "requester: next_psn=0x",
        "rate: line (fixed cnps=0)",
    ] {
        assert!(t.contains(want), "`{want}` not in:\n{t}");
    }
    for unwanted in ["Rts", "Rkey(", "FixedRate", "Some(", " {"] {
        assert!(!t.contains(unwanted), "`{unwanted}` in:\n{t}");
    }
    let absent = (0x999u64..)
        .find(|q| *q != cq && *q != sq)
        .expect("a QPN no device has");
    let out = stat(&run_dir, &["--qp", &format!("{absent:#x}")]);
    assert_eq!(out.status.code(), Some(1));

    // comm is the process name (as `rdma statistic`'s), the command line is in --json; watch mode heads each
    // sample with its time.
    let out = stat(&run_dir, &["--json", "--interval", "0.2"]);
    let v: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["runtimes"][0]["comm"], "rocev2", "{v}");
    let cmdline = v["runtimes"][0]["cmdline"].as_str().unwrap_or_default();
    assert!(cmdline.contains("perf write-bw --loopback"), "{v}");
    let mut w = Command::new(common::bin())
        .args(["stat", "-w", "0.3"])
        .env("ROCEV2_RUN_DIR", &run_dir)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("rocev2 stat -w");
    std::thread::sleep(Duration::from_millis(1200));
    w.kill().expect("kill stat -w");
    let t = String::from_utf8_lossy(&w.wait_with_output().expect("stat -w").stdout).into_owned();
    assert!(
        t.contains(&format!(
            "link rocev2_lo/1 127.0.48.2 pid {pid} comm rocev2"
        )),
        "{t}"
    );
    let stamps: Vec<&str> = t.lines().filter(|l| l.starts_with("--- ")).collect();
    assert!(stamps.len() >= 2, "{t}");
    // `--- 2026-12-01T23:05:33.123Z every 0.3s`
    let today = v["time"].as_str().expect("time")[..10].to_owned();
    assert!(
        stamps
            .iter()
            .all(|l| l.starts_with(&format!("--- {today}T")) && l.ends_with("Z every 0.3s")),
        "{t}"
    );

    let done = p.wait(Duration::from_secs(30));
    assert!(done.status.success(), "{done}");
    // The endpoints went with the run.
    assert!(sockets(&run_dir).is_empty(), "{:?}", sockets(&run_dir));
    let out = stat(&run_dir, &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no rocev2 device is running"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn stat_flags_a_high_retransmission_rate() {
    let _serial = serial();
    let dir = scratch("stat-loss");
    let run_dir = dir.join("run");
    let mut p = perf(
        &dir,
        &run_dir,
        &[
            "write-bw",
            "--loopback",
            "--loopback-ips",
            "127.0.49.1,127.0.49.2",
            "-s",
            "4096",
            "--loss",
            "0.1",
            "-D",
            "5",
        ],
    );
    std::thread::sleep(Duration::from_millis(1500));
    let out = stat(&run_dir, &["--interval", "0.5"]);
    let t = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{t}");
    // The client device's block: its head line and the indented lines under it (the flagged rate is a field of
    // the second line, which may wrap onto a continuation line).
    let mut block = t
        .lines()
        .skip_while(|l| !l.starts_with("link rocev2_lo/1 127.0.49.2 "));
    assert!(block.next().is_some(), "no client device:\n{t}");
    let link: Vec<&str> = block.take_while(|l| l.starts_with(' ')).collect();
    let link = link.join("\n");
    assert!(
        link.contains("retrans") && link.contains("(!) above 5 %"),
        "{link}\n{t}"
    );
    let done = p.wait(Duration::from_secs(30));
    assert!(done.status.success(), "{done}");
}

#[test]
fn endpoints_can_be_turned_off() {
    let _serial = serial();
    let dir = scratch("stat-off");
    let run_dir = dir.join("run");
    let argv: Vec<String> = [
        "env",
        &format!("ROCEV2_RUN_DIR={}", run_dir.display()),
        "ROCEV2_STATS_ENDPOINT=0",
        common::bin(),
        "perf",
        "send-lat",
        "--loopback",
        "--loopback-ips",
        "127.0.50.1,127.0.50.2",
        "-D",
        "2",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    let mut p = Proc::spawn("perf", &dir, &argv);
    std::thread::sleep(Duration::from_millis(1000));
    assert!(sockets(&run_dir).is_empty());
    let done = p.wait(Duration::from_secs(30));
    assert!(done.status.success(), "{done}");
}

/// A socket in the run directory that answers with something other than a rocev2 stats object (another process of
/// the same user can put one there): `rocev2 stat` reports it and does not panic.
#[test]
fn a_malformed_answer_is_reported_not_a_panic() {
    let dir = scratch("stat-malformed");
    let run_dir = dir.join("run");
    std::fs::create_dir_all(&run_dir).expect("run dir");
    // Named after this (live) process, as an endpoint of it would be.
    let path = run_dir.join(format!("{}.0.sock", std::process::id()));
    let l = std::os::unix::net::UnixListener::bind(&path).expect("bind");
    let answers: [&[u8]; 3] = [
        br#"{"proto":"rocev2-stats","v":1,"pid":1,"devices":[7,null,{"index":"x","counters":5,"qps":[1]}]}"#,
        br#"[1,2,3]"#,
        br#"{"proto":"rocev2-stats","v":1,"devices":{"index":0}}"#,
    ];
    let server = std::thread::spawn(move || {
        use std::io::{Read, Write};
        for a in answers {
            let (mut s, _) = l.accept().expect("accept");
            let mut b = [0u8; 256];
            let _ = s.read(&mut b);
            let _ = s.write_all(a);
            let _ = s.write_all(b"\n");
        }
    });
    for _ in 0..3 {
        let o = stat(&run_dir, &["--json"]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            !err.contains("panicked") && o.status.code() != Some(101),
            "rocev2 stat panicked on a malformed answer: {err}"
        );
    }
    server.join().expect("server");
}

/// A program in another network namespace shares the run directory but not the interfaces: `rocev2 stat` and
/// `rocev2 devinfo` in this namespace do not list it (its 127.0.52.x is another namespace's `lo`), and `rocev2 stat`
/// inside its namespace does.
#[test]
fn programs_of_another_netns_are_not_listed() {
    if let Some(why) = common::netns_unavailable() {
        eprintln!("SKIPPED (stat netns): {why}");
        return;
    }
    let _serial = serial();
    let dir = scratch("stat-netns");
    let run_dir = dir.join("run");
    // `unshare --net` runs the shell in a new network namespace; it brings up its loopback and execs perf (same pid).
    let perf_cmd = format!(
        "ip link set lo up && exec env ROCEV2_RUN_DIR={} {} perf send-lat --loopback --loopback-ips \
         127.0.52.1,127.0.52.2 -D 4",
        run_dir.display(),
        common::bin()
    );
    let argv = common::strings(&["unshare", "--net", "sh", "-c", &perf_cmd]);
    let mut p = Proc::spawn("perf", &dir, &argv);
    let t0 = Instant::now();
    while sockets(&run_dir).len() < 2 {
        assert!(p.try_wait().is_none(), "{}", p.output_so_far());
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "{}",
            p.output_so_far()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = stat(&run_dir, &["--json", "--interval", "0.2"]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "listed from another netns: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    let out = common::output_within(
        Command::new(common::bin())
            .args(["devinfo", "-d", "lo"])
            .env("ROCEV2_RUN_DIR", &run_dir),
        common::SHORT,
    );
    let t = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && !t.contains("in use by"), "{t}");
    // From inside its namespace it is listed.
    let out = common::output_within(
        Command::new("nsenter")
            .arg(format!("--net=/proc/{}/ns/net", p.pid()))
            .args([common::bin(), "stat", "--json", "--interval", "0.2"])
            .env("ROCEV2_RUN_DIR", &run_dir),
        common::SHORT,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["runtimes"].as_array().map(Vec::len), Some(2), "{v}");
    let done = p.wait(Duration::from_secs(30));
    assert!(done.status.success(), "{done}");
}

/// A socket left by a process that died without removing it, whose pid now belongs to another process (here: this
/// test, alive): the socket's name carries its creator's start time, which is not this process's, so `rocev2 stat`
/// removes it and finds nothing running (it used to list it, and failed to connect to it, for as long as the pid
/// lived).
#[test]
fn a_socket_of_a_reused_pid_is_removed() {
    let dir = scratch("stat-reused-pid");
    let run_dir = dir.join("run");
    std::fs::create_dir_all(&run_dir).expect("run dir");
    // Start time 1 (clock ticks after boot): no process of this test started then.
    let path = run_dir.join(format!("{}.1.0.sock", std::process::id()));
    drop(std::os::unix::net::UnixListener::bind(&path).expect("bind"));
    assert!(path.exists());
    let out = stat(&run_dir, &["--interval", "0"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("no rocev2 device is running"), "{err}");
    assert!(!path.exists(), "the stale socket is still there");
}

/// `rocev2 stat -w SECS | head -1`: once the reader has gone, the next sample ends the watch quietly (exit 0), not
/// with a panic on the closed pipe. Nothing is running (an empty run directory), which still prints a line per
/// sample.
#[test]
fn a_closed_stdout_ends_a_watch_without_a_panic() {
    use std::process::Stdio;
    let run_dir = scratch("stat-closed-stdout");
    let mut child = Command::new(common::bin())
        .args(["stat", "-w", "0.05"])
        .env("ROCEV2_RUN_DIR", &run_dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run rocev2 stat");
    drop(child.stdout.take());
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        if t0.elapsed() > Duration::from_secs(10) {
            let _ = child.kill();
            panic!("rocev2 stat -w kept running with its stdout closed");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().expect("stderr"), &mut err)
        .expect("read stderr");
    assert!(
        status.success() && !err.contains("panicked"),
        "{status:?}\n{err}"
    );
}

/// `runuser -u nobody -- env -u ... BIN ARGS` (no run directory or XDG runtime directory from this environment).
fn as_nobody(args: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = [
        "runuser",
        "-u",
        "nobody",
        "--",
        "env",
        "-u",
        "ROCEV2_RUN_DIR",
        "-u",
        "XDG_RUNTIME_DIR",
        common::bin(),
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    v.extend(args.iter().map(|s| (*s).to_owned()));
    v
}

/// Issue #21, as a second local user: a normal user's program got no stats endpoint whenever root's `/run/rocev2`
/// existed (bind failed with EACCES, no fallback), and the fallback `/tmp/rocev2-<uid>` was used without checking
/// who owns it, so another user could pre-create it and capture or replace the endpoints. Now the user's program
/// skips root's directory and serves from its own; a pre-created directory it does not own is refused (the run
/// still completes, without an endpoint).
#[test]
fn a_normal_user_serves_its_own_endpoint_and_refuses_a_planted_directory() {
    let _serial = serial();
    let id = |args: &[&str]| {
        Command::new("id")
            .args(args)
            .output()
            .ok()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
    };
    if id(&["-u"]).as_deref() != Some("0") {
        eprintln!("skipped: needs root to run programs as user nobody");
        return;
    }
    let Some(uid) = id(&["-u", "nobody"]).filter(|u| !u.is_empty()) else {
        eprintln!("skipped: no user nobody");
        return;
    };
    let run = |args: &[&str]| {
        let argv = as_nobody(args);
        common::output_within(Command::new(&argv[0]).args(&argv[1..]), common::SHORT)
    };
    if !run(&["--version"]).status.success() {
        eprintln!(
            "skipped: user nobody cannot run {} (a directory on its path is not searchable)",
            common::bin()
        );
        return;
    }
    // Root's run directory exists (the defect's condition).
    let _ = std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create("/run/rocev2");
    let fallback = PathBuf::from(format!("/tmp/rocev2-{uid}"));
    let _ = std::fs::remove_dir_all(&fallback);
    let dir = scratch("stat-nobody");
    let mut p = Proc::spawn(
        "perf",
        &dir,
        &as_nobody(&[
            "perf",
            "write-bw",
            "--loopback",
            "--loopback-ips",
            "127.0.225.1,127.0.225.2",
            "-D",
            "4",
        ]),
    );
    let t0 = Instant::now();
    loop {
        let out = run(&["stat", "--interval", "0"]);
        let t = String::from_utf8_lossy(&out.stdout).into_owned();
        if t.contains("link rocev2_lo/1 127.0.225.1 ") {
            break;
        }
        assert!(
            p.try_wait().is_none() && t0.elapsed() < Duration::from_secs(15),
            "user nobody's rocev2 stat never saw its own run:\n{t}{}\n{}",
            String::from_utf8_lossy(&out.stderr),
            p.output_so_far()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let done = p.wait(Duration::from_secs(30));
    assert!(done.status.success(), "{done}");

    // Another user (root here) plants the fallback directory, world-writable: it must not be used.
    let _ = std::fs::remove_dir_all(&fallback);
    std::fs::create_dir(&fallback).expect("plant");
    std::fs::set_permissions(&fallback, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    let mut p = Proc::spawn(
        "perf2",
        &dir,
        &as_nobody(&[
            "perf",
            "write-bw",
            "--loopback",
            "--loopback-ips",
            "127.0.225.3,127.0.225.4",
            "-D",
            "2",
        ]),
    );
    std::thread::sleep(Duration::from_millis(1000));
    let planted: Vec<PathBuf> = std::fs::read_dir(&fallback)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    let out = run(&["stat", "--interval", "0"]);
    let done = p.wait(Duration::from_secs(30));
    let _ = std::fs::remove_dir_all(&fallback);
    assert!(
        planted.is_empty(),
        "endpoint in a planted directory: {planted:?}"
    );
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains("127.0.225.3"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(done.status.success(), "{done}");
}

/// Issue #18's fresh-user finding: on an 80-column terminal the default report (laid out for 120 columns unless
/// `COLUMNS` was exported, which shells do not do) ran past the edge and the terminal wrapped it mid-field (`retrans`
/// on one line, its value on the next). Now the report takes the terminal's width and wraps between fields. The
/// terminal is a pseudo-terminal of util-linux `script`, set to 80 columns with `stty`; `COLUMNS` is unset. The run
/// has loss, so the longest field (a flagged retransmission rate) may be there too.
#[test]
fn the_report_fits_an_80_column_terminal() {
    if let Some(why) = common::program_missing("script", "bsdutils") {
        eprintln!("SKIPPED: {why}");
        return;
    }
    let _serial = serial();
    let dir = scratch("stat-80");
    let run_dir = dir.join("run");
    let mut p = perf(
        &dir,
        &run_dir,
        &[
            "write-bw",
            "--loopback",
            "--loopback-ips",
            "127.0.215.3,127.0.215.4",
            "-s",
            "4096",
            "--loss",
            "0.05",
            "-D",
            "5",
        ],
    );
    std::thread::sleep(Duration::from_millis(1000));
    let out = common::output_within(
        Command::new("script")
            .args([
                "-qec",
                &format!(
                    "stty cols 80 rows 50; '{}' stat --interval 0.5",
                    common::bin()
                ),
                "/dev/null",
            ])
            .env("ROCEV2_RUN_DIR", &run_dir)
            .env("TERM", "xterm")
            .env_remove("COLUMNS")
            .stdin(std::process::Stdio::null()),
        common::RUN,
    );
    let t = String::from_utf8_lossy(&out.stdout).replace('\r', "");
    assert!(out.status.success(), "{t}");
    assert!(t.contains("link rocev2_lo/1 127.0.215.4 "), "{t}");
    // The server's QP (its QPN is drawn from its engine's seed: `roce_proto::QpnRange`).
    assert!(
        t.lines()
            .any(|l| l.starts_with("qp 0x") && l.contains(" rocev2_lo/1 127.0.215.3 ")),
        "{t}"
    );
    assert!(
        t.lines().all(|l| l.chars().count() <= 80),
        "a line over 80 columns:\n{t}"
    );
    // No name is cut from its value: no line ends with a field's name.
    for l in t.lines() {
        let last = l.split_whitespace().last().unwrap_or("");
        assert!(
            ![
                "retrans",
                "next_psn",
                "una_psn",
                "epsn",
                "sq_depth",
                "max_pass_gap_us",
                "type",
                "state",
            ]
            .contains(&last),
            "`{last}` apart from its value in `{l}`:\n{t}"
        );
    }
    assert!(
        t.lines()
            .any(|l| l.split_once(" retrans ").is_some_and(|(_, r)| r
                .split_once(" %")
                .is_some_and(|(n, _)| n.parse::<f64>().is_ok()))),
        "no `retrans N.NN %` in one piece:\n{t}"
    );
    let done = p.wait(Duration::from_secs(30));
    assert!(done.status.success(), "{done}");
    let _ = std::fs::remove_dir_all(&dir);
}
