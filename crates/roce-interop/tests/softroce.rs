//! rocev2 against Linux Soft-RoCE (rdma_rxe 6.1) in a QEMU guest: rdma-core's pingpong tools and perftest in the
//! guest, `rocev2` on the host inside namespace `roce-net` at 198.18.0.1, each side once as client and once as
//! server, sizes across the 1024-byte path MTU. One guest (g1, 198.18.0.2) is booted for the whole suite.
//!
//! Per case: both sides must exit 0; data checks where the tools make them (`ibv_*_pingpong -c`, rocev2's own
//! verification lines); the tcpdump capture of the bridge must pass `testdata/tools/check_pcap.py --pmtu 1024`
//! (ICRC of every packet in both directions, header sanity, segmentation at the PMTU); the expected opcodes must
//! appear in the right direction; rxe's counters must show no error caused by our packets, every packet we sent
//! must have been accepted by rxe (`rcvd_pkts`) unless dropped before it, and the guest kernel must log nothing
//! about them (see `roce_interop::classify`).
//!
//! Runs when root with `/dev/net/tun` (the harness installs QEMU etc. on first use); otherwise it prints a loud
//! SKIPPED line and passes. `SOFTROCE_CASES=substr[,substr]` runs only the cases whose names contain one of the
//! substrings. Artifacts (pcaps, tool output) land in `target/tmp/softroce-interop/<case>/`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant, SystemTime};

use roce_interop::{Bg, Guest, HOST_IP, SoftRoce, Traffic, check_pcap, classify, say, traffic};

const GUEST: &str = "g1";
const GUEST_IP: &str = "198.18.0.2";
/// rxe0's active MTU with eth0 at 1500 (`docs/spec/INTEROP.md` §4).
const PMTU: u32 = 1024;
const OOB_PORT: u16 = 18515;
const MIB: u64 = 1 << 20;
/// rocev2 `--stats` counters (UdpLink, engine) that mean a frame from rxe was rejected as malformed or misaddressed.
const ROCEV2_REJECTS: &[&str] = &[
    "rx_icrc_bad",
    "rx_truncated",
    "rx_bad_addr",
    "drop_malformed",
    "drop_bad_opcode",
    "drop_wrong_peer",
    "drop_wrong_dest_ip",
    "drop_pkey_mismatch",
    "drop_qkey_mismatch",
    "drop_ud_too_long",
];
/// PID-file tag of the guest tool of the running case (`Guest::spawn_tracked`).
const GUEST_TAG: &str = "roce-case";

/// Guest timeout (`exec -t`) of a case moving `size`-byte messages; the host waits 30 s longer.
fn timeout_for(size: u64) -> u64 {
    if size >= MIB { 120 } else { 60 }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Side {
    Guest,
    Host,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Dir {
    HostToGuest,
    GuestToHost,
}

/// What the host side runs.
#[derive(Clone, Debug)]
enum HostProg {
    /// `testdata/interop/host_pingpong_peer.py` (client only): the smoke case that needs no rocev2 feature.
    PythonPeer(Vec<String>),
    /// The `rocev2` binary.
    Rocev2(Vec<String>),
}

#[derive(Clone, Debug)]
struct Case {
    name: String,
    server: Side,
    /// Full guest command line (with the server address when the guest is the client).
    guest_cmd: String,
    host: HostProg,
    /// Guest timeout (`exec -t`) and host deadline, seconds.
    timeout_s: u64,
    /// Opcode-name prefixes that must appear in a direction (e.g. `RC_RDMA_WRITE` host→guest).
    expect_ops: Vec<(Dir, &'static str)>,
    /// Substrings that must not appear in either side's output (data-check failures).
    forbid_output: Vec<&'static str>,
    /// Required rocev2 subcommand/flag (checked against `--help`); a missing one fails the case by name.
    needs: Option<Feature>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Feature {
    Pingpong,
    PerftestCompat,
}

impl Feature {
    fn describe(self) -> &'static str {
        match self {
            Feature::Pingpong => {
                "`rocev2 pingpong` (ibv_rc_pingpong/ibv_ud_pingpong compatible, with --rx packet)"
            }
            Feature::PerftestCompat => "`rocev2 perf --perftest-compat` (perftest's TCP exchange)",
        }
    }
}

fn s(v: &[&str]) -> Vec<String> {
    v.iter().map(|x| x.to_string()).collect()
}

/// Iterations for a size: keep the bytes moved small (TCG moves about 0.1 Gb/s).
fn iters_for(size: u64) -> u64 {
    match size {
        0..=4096 => 20,
        4097..=65536 => 10,
        _ => 5,
    }
}

fn pingpong_cases() -> Vec<Case> {
    let mut v = Vec::new();
    // Smoke: the harness's Python peer (client) against the real rc/ud pingpong server; needs nothing from rocev2.
    for (kind, size) in [("rc", 4096u64), ("ud", 1024)] {
        v.push(Case {
            name: format!("smoke_python_{kind}_{size}"),
            server: Side::Guest,
            guest_cmd: format!("ibv_{kind}_pingpong -d rxe0 -g 1 -c -s {size} -n 20"),
            host: HostProg::PythonPeer(s(&[
                kind,
                GUEST_IP,
                "--size",
                &size.to_string(),
                "--iters",
                "20",
            ])),
            timeout_s: 60,
            expect_ops: vec![(
                Dir::HostToGuest,
                if kind == "rc" {
                    "RC_SEND"
                } else {
                    "UD_SEND_ONLY"
                },
            )],
            forbid_output: vec!["invalid data", "Invalid data"],
            needs: None,
        });
    }
    // rocev2 pingpong vs ibv_rc_pingpong / ibv_ud_pingpong, both roles.
    let rc_sizes = [1u64, PMTU as u64, PMTU as u64 + 1, 4096, MIB];
    let ud_sizes = [1u64, PMTU as u64];
    for (kind, sizes) in [("rc", &rc_sizes[..]), ("ud", &ud_sizes[..])] {
        for &size in sizes {
            let n = iters_for(size);
            for server in [Side::Guest, Side::Host] {
                let tool = format!("ibv_{kind}_pingpong -d rxe0 -g 1 -c -s {size} -n {n}");
                let guest_cmd = match server {
                    Side::Guest => tool,
                    Side::Host => format!("{tool} {HOST_IP}"),
                };
                let mut args = s(&["pingpong", kind]);
                if server == Side::Guest {
                    args.push(GUEST_IP.into());
                }
                // No -c here: rocev2's check expects its own sender pattern, ibv_*_pingpong sends another one.
                args.extend(s(&[
                    "--ip",
                    HOST_IP,
                    "-g",
                    "1",
                    "-s",
                    &size.to_string(),
                    "-n",
                    &n.to_string(),
                    "--rx",
                    "packet",
                ]));
                let op = if kind == "rc" {
                    "RC_SEND"
                } else {
                    "UD_SEND_ONLY"
                };
                v.push(Case {
                    name: format!("pingpong_{kind}_{size}_{}server", side_name(server)),
                    server,
                    guest_cmd,
                    host: HostProg::Rocev2(args),
                    timeout_s: timeout_for(size),
                    expect_ops: vec![(Dir::HostToGuest, op), (Dir::GuestToHost, op)],
                    forbid_output: vec!["invalid data", "Invalid data", "mismatch"],
                    needs: Some(Feature::Pingpong),
                });
            }
        }
    }
    v
}

fn side_name(s: Side) -> &'static str {
    match s {
        Side::Guest => "guest",
        Side::Host => "host",
    }
}

/// perftest tool name → (rocev2 perf test, sizes, opcode prefix sent by the client, opcode prefix sent back).
fn perftest_cases() -> Vec<Case> {
    let bw_sizes = [1u64, PMTU as u64, PMTU as u64 + 1, 4096, MIB];
    let lat_sizes = [1u64, PMTU as u64, PMTU as u64 + 1, 4096];
    type Tool<'a> = (
        &'a str,
        &'a str,
        &'a [u64],
        &'static str,
        Option<&'static str>,
    );
    let tools: [Tool; 6] = [
        ("ib_send_bw", "send-bw", &bw_sizes, "RC_SEND", None),
        ("ib_write_bw", "write-bw", &bw_sizes, "RC_RDMA_WRITE", None),
        (
            "ib_read_bw",
            "read-bw",
            &bw_sizes,
            "RC_RDMA_READ_REQUEST",
            Some("RC_RDMA_READ_RESPONSE"),
        ),
        (
            "ib_atomic_bw",
            "atomic-bw",
            &[8],
            "RC_FETCH_ADD",
            Some("RC_ATOMIC_ACKNOWLEDGE"),
        ),
        (
            "ib_send_lat",
            "send-lat",
            &lat_sizes,
            "RC_SEND",
            Some("RC_SEND"),
        ),
        (
            "ib_write_lat",
            "write-lat",
            &lat_sizes,
            "RC_RDMA_WRITE",
            Some("RC_RDMA_WRITE"),
        ),
    ];
    let mut v = Vec::new();
    for (tool, test, sizes, client_op, back_op) in tools {
        for &size in sizes {
            let n = iters_for(size).max(5);
            for server in [Side::Guest, Side::Host] {
                let size_flag = if tool == "ib_atomic_bw" {
                    String::new()
                } else {
                    format!(" -s {size}")
                };
                let t = format!("{tool} -d rxe0 -x 1 -F{size_flag} -n {n}");
                let guest_cmd = match server {
                    Side::Guest => t,
                    Side::Host => format!("{t} {HOST_IP}"),
                };
                let mut args = s(&["perf", test]);
                if server == Side::Guest {
                    args.push(GUEST_IP.into());
                }
                args.extend(s(&[
                    "--perftest-compat",
                    "--stats",
                    "--ip",
                    HOST_IP,
                    "--rx-mode",
                    "packet",
                    "-x",
                    "1",
                    "-F",
                    "-n",
                    &n.to_string(),
                ]));
                if tool != "ib_atomic_bw" {
                    args.extend(s(&["-s", &size.to_string()]));
                }
                let (to_guest, to_host) = match server {
                    Side::Guest => (Dir::HostToGuest, Dir::GuestToHost),
                    Side::Host => (Dir::GuestToHost, Dir::HostToGuest),
                };
                let mut expect_ops = vec![(to_guest, client_op)];
                if let Some(b) = back_op {
                    expect_ops.push((to_host, b));
                }
                v.push(Case {
                    name: format!("{tool}_{size}_{}server", side_name(server)),
                    server,
                    guest_cmd,
                    host: HostProg::Rocev2(args),
                    timeout_s: timeout_for(size),
                    expect_ops,
                    forbid_output: vec!["verification FAILED", "mismatch"],
                    needs: Some(Feature::PerftestCompat),
                });
            }
        }
    }
    v
}

/// Which rocev2 features the built binary has (from its `--help` texts).
fn features(rocev2: &Path) -> Vec<Feature> {
    // Bounded like every program these tests start (`roce_interop::run`: killed with its group after 60 s).
    let log = std::env::temp_dir().join(format!("softroce-help-{}", std::process::id()));
    let help = |args: &[&str]| -> String {
        let mut cmd = Command::new(rocev2);
        cmd.args(args);
        let o = roce_interop::run(cmd, &log, "rocev2 --help", Duration::from_secs(60));
        assert!(!o.timed_out, "`rocev2 {args:?}` still running after 60 s");
        o.stdout
    };
    let mut f = Vec::new();
    if help(&["pingpong", "--help"]).contains("--rx") {
        f.push(Feature::Pingpong);
    }
    if help(&["perf", "--help"]).contains("--perftest-compat")
        && help(&["perf", "--help"]).contains("--rx-mode")
    {
        f.push(Feature::PerftestCompat);
    }
    for ext in ["out", "err"] {
        let _ = fs::remove_file(log.with_extension(ext));
    }
    f
}

/// The `rocev2` binary cargo built next to this test (`target/<profile>/rocev2`), and a warning when it is older
/// than a source file of the workspace crates (under `cargo test --workspace` it is always fresh: cargo builds every
/// target before running any test).
fn locate_rocev2(root: &Path) -> Result<(PathBuf, Option<String>), String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .ok_or("cannot locate the target directory")?;
    let bin = profile_dir.join("rocev2");
    let meta = fs::metadata(&bin).map_err(|_| {
        format!("{} not found: build it first (`cargo build --release -p roce-cli`, or run the whole workspace)", bin.display())
    })?;
    let built = meta.modified().map_err(|e| e.to_string())?;
    let mut newest: Option<(SystemTime, PathBuf)> = None;
    let mut stack = vec![root.join("crates")];
    while let Some(d) = stack.pop() {
        let Ok(rd) = fs::read_dir(&d) else { continue };
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                if !p.ends_with("tests") && !p.ends_with("benches") && !p.ends_with("roce-interop")
                {
                    stack.push(p);
                }
            } else if p.extension().is_some_and(|x| x == "rs")
                && let Ok(m) = e.metadata().and_then(|m| m.modified())
                && newest.as_ref().is_none_or(|(t, _)| m > *t)
            {
                newest = Some((m, p));
            }
        }
    }
    let stale = newest.filter(|(t, _)| *t > built).map(|(_, p)| {
        format!(
            "{} is older than {}: rebuild it (`cargo build --release -p roce-cli`)",
            bin.display(),
            p.display()
        )
    });
    Ok((bin, stale))
}

struct Ctx<'a> {
    sr: &'a SoftRoce,
    g: &'a Guest,
    rocev2: &'a Path,
    out: &'a Path,
    features: &'a [Feature],
}

#[derive(Debug)]
struct CaseResult {
    name: String,
    ok: bool,
    secs: f64,
    summary: String,
    problems: Vec<String>,
    notes: Vec<String>,
}

fn wait_listening(ctx: &Ctx, side: Side, server: &mut Bg, timeout: Duration) -> Result<(), String> {
    let t0 = Instant::now();
    loop {
        if !server.running() {
            return Err("server exited before listening".into());
        }
        let up = match side {
            Side::Guest => ctx.g.listening(OOB_PORT),
            Side::Host => ctx.sr.host_listening(OOB_PORT),
        };
        if up {
            return Ok(());
        }
        if t0.elapsed() > timeout {
            return Err(format!(
                "server not listening on TCP {OOB_PORT} after {}s",
                timeout.as_secs()
            ));
        }
        thread::sleep(Duration::from_millis(if side == Side::Host {
            100
        } else {
            300
        }));
    }
}

fn spawn_side(ctx: &Ctx, case: &Case, side: Side, dir: &Path) -> Result<Bg, String> {
    match side {
        Side::Guest => ctx.g.spawn_tracked(
            case.timeout_s,
            &case.guest_cmd,
            GUEST_TAG,
            &dir.join("guest"),
        ),
        Side::Host => {
            let (prog, args): (PathBuf, Vec<String>) = match &case.host {
                HostProg::PythonPeer(a) => {
                    let mut v = vec![
                        ctx.sr
                            .testdata()
                            .join("interop/host_pingpong_peer.py")
                            .display()
                            .to_string(),
                    ];
                    v.extend(a.iter().cloned());
                    (PathBuf::from("python3"), v)
                }
                HostProg::Rocev2(a) => (ctx.rocev2.to_path_buf(), a.clone()),
            };
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            ctx.sr.host_spawn(&prog, &args, &dir.join("host"))
        }
    }
}

fn host_cmdline(case: &Case) -> String {
    match &case.host {
        HostProg::PythonPeer(a) => format!("python3 host_pingpong_peer.py {}", a.join(" ")),
        HostProg::Rocev2(a) => format!("rocev2 {}", a.join(" ")),
    }
}

fn run_case(ctx: &Ctx, case: &Case) -> CaseResult {
    let t0 = Instant::now();
    let dir = ctx.out.join(&case.name);
    let _ = fs::remove_dir_all(&dir);
    let _ = fs::create_dir_all(&dir);
    let mut r = CaseResult {
        name: case.name.clone(),
        ok: false,
        secs: 0.0,
        summary: String::new(),
        problems: Vec::new(),
        notes: Vec::new(),
    };
    let _ = fs::write(
        dir.join("commands.txt"),
        format!(
            "guest ({GUEST}): {}\nhost (netns roce-net): {}\n",
            case.guest_cmd,
            host_cmdline(case)
        ),
    );
    if let Some(f) = case.needs
        && !ctx.features.contains(&f)
    {
        r.problems.push(format!(
            "FEATURE MISSING: the built rocev2 has no {}",
            f.describe()
        ));
        r.secs = t0.elapsed().as_secs_f64();
        return r;
    }
    r.problems = run_case_inner(ctx, case, &dir, &mut r.notes, &mut r.summary);
    r.ok = r.problems.is_empty();
    r.secs = t0.elapsed().as_secs_f64();
    r
}

fn snapshot(ctx: &Ctx) -> Result<roce_interop::Snapshot, String> {
    let mut s = ctx.g.snapshot()?;
    s.counters.extend(ctx.sr.tap_drops(GUEST));
    Ok(s)
}

fn run_case_inner(
    ctx: &Ctx,
    case: &Case,
    dir: &Path,
    notes: &mut Vec<String>,
    summary: &mut String,
) -> Vec<String> {
    let mut p = Vec::new();
    let before = match snapshot(ctx) {
        Ok(s) => s,
        Err(e) => return vec![e],
    };
    let pcap = dir.join("capture.pcap");
    let cap = match roce_interop::Capture::start(&pcap) {
        Ok(c) => c,
        Err(e) => return vec![e],
    };
    let client_side = match case.server {
        Side::Guest => Side::Host,
        Side::Host => Side::Guest,
    };
    let limit = Duration::from_secs(case.timeout_s + 30);
    let mut server = match spawn_side(ctx, case, case.server, dir) {
        Ok(b) => b,
        Err(e) => return vec![e],
    };
    if let Err(e) = wait_listening(ctx, case.server, &mut server, Duration::from_secs(60)) {
        let so = server.wait(Duration::from_secs(5));
        ctx.g.kill_tracked(
            GUEST_TAG,
            case.guest_cmd.split_whitespace().next().unwrap_or(""),
        );
        cap.stop();
        return vec![format!(
            "{} server: {e}: {}",
            side_name(case.server),
            so.describe(10)
        )];
    }
    let client = match spawn_side(ctx, case, client_side, dir) {
        Ok(b) => b,
        Err(e) => return vec![e],
    };
    let co = client.wait(limit);
    let so = server.wait(if co.ok() {
        Duration::from_secs(45)
    } else {
        Duration::from_secs(10)
    });
    // A guest tool the host gave up on would keep running (and retransmitting) into the next case.
    let program = case.guest_cmd.split_whitespace().next().unwrap_or("");
    if ctx.g.kill_tracked(GUEST_TAG, program) {
        p.push(format!(
            "guest {program} still running after the host gave up: killed"
        ));
    }
    let (tcpdump_summary, cap_dropped) = cap.stop();
    let (guest_out, host_out) = match case.server {
        Side::Guest => (&so, &co),
        Side::Host => (&co, &so),
    };
    for (who, o) in [("guest", guest_out), ("host", host_out)] {
        let role = if (who == "guest") == (case.server == Side::Guest) {
            "server"
        } else {
            "client"
        };
        if !o.ok() {
            p.push(format!("{who} {role} failed: {}", o.describe(12)));
        }
        for bad in &case.forbid_output {
            if o.stdout.contains(bad) || o.stderr.contains(bad) {
                p.push(format!(
                    "{who} {role} output contains {bad:?}: {}",
                    o.describe(12)
                ));
            }
        }
    }
    let _ = write!(
        summary,
        "guest: {} | host: {}",
        result_line(&guest_out.stdout),
        result_line(&host_out.stdout)
    );
    // rocev2's own receive-side verdict on rxe's frames (AF_PACKET: real IP headers, so the ICRC is checked).
    let rc = rocev2_counters(&host_out.stdout);
    for (k, n) in rc.iter().filter(|(_, n)| **n > 0) {
        if ROCEV2_REJECTS.contains(&k.as_str()) {
            p.push(format!(
                "rocev2 --stats: {k} {n} (frames from rxe rejected)"
            ));
        } else if k.ends_with("_err") || k.starts_with("drop_") {
            notes.push(format!("rocev2 {k} {n}"));
        }
    }
    // Independent ICRC/header check of everything on the bridge.
    let chk = check_pcap(
        ctx.sr.testdata(),
        &pcap,
        Some(PMTU),
        &dir.join("check_pcap"),
    );
    let python = matches!(case.host, HostProg::PythonPeer(_));
    let mut artifacts = 0;
    for l in &chk.bad {
        // The Python peer sends with kernel UDP checksum offload: on the bridge its packets carry a partial
        // checksum (README, "Capturing host-side traffic"). That, and only that, is tolerated for it.
        let errs = l.split_once(": ").map(|x| x.1).unwrap_or("");
        if python
            && errs
                .split("; ")
                .all(|e| e.starts_with("UDP checksum wrong"))
        {
            artifacts += 1;
        } else if p.len() < 40 {
            p.push(format!("check_pcap.py: {l}"));
        }
    }
    if chk.rc == Some(2) || chk.rc.is_none() {
        p.push(format!("check_pcap.py could not read {}", pcap.display()));
    }
    if artifacts > 0 {
        notes.push(format!(
            "{artifacts} host packets with the offload UDP-checksum artifact (ICRC good)"
        ));
    }
    if cap_dropped > 0 {
        notes.push(format!("tcpdump: {cap_dropped} packets dropped by kernel"));
    }
    let _ = fs::write(dir.join("tcpdump.txt"), tcpdump_summary);
    let tr = match traffic(ctx.rocev2, &pcap, HOST_IP, GUEST_IP, &dir.join("decode")) {
        Ok(t) => t,
        Err(e) => {
            p.push(e);
            Traffic::default()
        }
    };
    let _ = write!(
        summary,
        " | pcap: {} ok/{} bad, host->guest {}, guest->host {}",
        chk.passed, chk.failed, tr.a_to_b, tr.b_to_a
    );
    for (dir_, prefix) in &case.expect_ops {
        let ops = match dir_ {
            Dir::HostToGuest => &tr.ops_a_to_b,
            Dir::GuestToHost => &tr.ops_b_to_a,
        };
        if !ops.keys().any(|k| k.starts_with(prefix)) {
            p.push(format!(
                "no {prefix}* packet {dir_:?} in the capture (seen: {ops:?})"
            ));
        }
    }
    for (k, n) in &tr.naks {
        // 0x60 | code: PSN sequence error NAK (code 0) is judged with the counters; RNR NAKs are 0x20 (not here).
        p.push(format!("NAK in capture: {k} x{n}"));
    }
    match snapshot(ctx) {
        Ok(after) => {
            let (delta, new_log) = before.delta(&after);
            let v = classify(&delta, &new_log);
            p.extend(v.errors);
            notes.extend(v.notes);
            let rcvd = delta.get("rxe.rcvd_pkts").copied().unwrap_or(0);
            let drops: u64 = delta
                .iter()
                .filter(|(k, _)| k.starts_with("tap.") || k.starts_with("eth0."))
                .map(|(_, n)| n)
                .sum();
            if cap_dropped == 0 && rcvd + drops < tr.a_to_b {
                p.push(format!(
                    "rxe accepted {rcvd} of the {} RoCE packets we sent ({drops} dropped before rxe): \
                     {} rejected by rxe's header/ICRC checks",
                    tr.a_to_b,
                    tr.a_to_b - rcvd - drops
                ));
            }
            let _ = fs::write(
                dir.join("counters.txt"),
                format!("{delta:#?}\nnew kernel log:\n{}\n", new_log.join("\n")),
            );
        }
        Err(e) => p.push(e),
    }
    p
}

/// The result line of a tool's output: the data row after perftest's `#bytes` header, else pingpong's
/// `... iters in ...` line, else the last non-empty line; whitespace squeezed.
fn result_line(s: &str) -> String {
    let lines: Vec<&str> = s.lines().collect();
    let pick = lines
        .iter()
        .position(|l| l.contains("#bytes"))
        .and_then(|i| lines.get(i + 1))
        .or_else(|| lines.iter().rev().find(|l| l.contains(" iters in ")))
        .or_else(|| lines.iter().rev().find(|l| !l.trim().is_empty()))
        .copied()
        .unwrap_or("");
    pick.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .chars()
        .take(100)
        .collect()
}

/// `  name value` counter lines of `rocev2 ... --stats` output.
fn rocev2_counters(out: &str) -> BTreeMap<String, u64> {
    out.lines()
        .filter(|l| l.starts_with("  "))
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            let (k, v) = (it.next()?, it.next()?);
            if it.next().is_some() {
                return None;
            }
            Some((k.to_string(), v.parse().ok()?))
        })
        .collect()
}

fn selected(all: Vec<Case>) -> Vec<Case> {
    match std::env::var("SOFTROCE_CASES") {
        Ok(f) if !f.is_empty() => {
            let pats: Vec<&str> = f.split(',').collect();
            all.into_iter()
                .filter(|c| pats.iter().any(|p| c.name.contains(p)))
                .collect()
        }
        _ => all,
    }
}

#[test]
fn softroce_interop() {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let root = crate_dir.join("../..");
    let testdata = root.join("testdata");
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("softroce-interop");
    let _ = fs::create_dir_all(&out);
    let (rocev2, stale) = locate_rocev2(&root).unwrap_or_else(|e| panic!("{e}"));
    if let Some(w) = stale {
        // Only a warning: in a shared working tree someone may be editing right now, and under
        // `cargo test --workspace` cargo rebuilt the binary before any test ran.
        say(&format!("WARNING: {w}"));
    }
    let suite_t0 = Instant::now();
    let sr = match SoftRoce::acquire(&testdata, &out.join("scratch"), Duration::from_secs(1800)) {
        Ok(s) => s,
        Err(reason) => {
            say("");
            say("######################################################################");
            say(&format!(
                "SKIPPED: Soft-RoCE interop suite not run: {reason}"
            ));
            say("######################################################################");
            return;
        }
    };
    let features = features(&rocev2);
    let mut cases = pingpong_cases();
    cases.extend(perftest_cases());
    let cases = selected(cases);
    say(&format!(
        "{} cases; rocev2 features present: {features:?}; artifacts in {}",
        cases.len(),
        out.display()
    ));
    let g = sr.up(GUEST, GUEST_IP).unwrap_or_else(|e| panic!("{e}"));
    say(&format!("{} | {}", g.boot_log, g.ready_line));
    let ctx = Ctx {
        sr: &sr,
        g: &g,
        rocev2: &rocev2,
        out: &out,
        features: &features,
    };
    let mut results = Vec::new();
    for (i, case) in cases.iter().enumerate() {
        let r = run_case(&ctx, case);
        say(&format!(
            "[{}/{}] {} {} ({:.1}s) {}",
            i + 1,
            cases.len(),
            if r.ok { "ok  " } else { "FAIL" },
            r.name,
            r.secs,
            r.summary
        ));
        for n in &r.notes {
            say(&format!("        note: {n}"));
        }
        for pr in &r.problems {
            say(&format!("        problem: {pr}"));
        }
        results.push(r);
    }
    drop(sr);
    let failed: Vec<&CaseResult> = results.iter().filter(|r| !r.ok).collect();
    let mut report = String::new();
    let mut by_problem: BTreeMap<String, Vec<&str>> = BTreeMap::new();
    for r in &failed {
        let first = r
            .problems
            .first()
            .map(|s| s.lines().next().unwrap_or("").to_string())
            .unwrap_or_default();
        by_problem.entry(first).or_default().push(&r.name);
    }
    for (prob, names) in &by_problem {
        let _ = writeln!(
            report,
            "  {} case(s): {prob}\n    {}",
            names.len(),
            names.join(", ")
        );
    }
    say(&format!(
        "suite: {} cases, {} passed, {} failed, {:.0}s",
        results.len(),
        results.len() - failed.len(),
        failed.len(),
        suite_t0.elapsed().as_secs_f64()
    ));
    assert!(
        failed.is_empty(),
        "{} of {} Soft-RoCE interop cases failed:\n{report}",
        failed.len(),
        results.len()
    );
}
