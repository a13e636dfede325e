//! `--link xdp` (the AF_XDP link, `roce_link::xdp`) end to end: `rocev2 perf` and `rocev2 pingpong` between two
//! processes in two network namespaces joined by a veth pair (198.18.26.0/24, 1500-byte MTU, RoCE PMTU 1024),
//! both sides on AF_XDP. Needs root and `ip netns`; otherwise every test prints why it is skipped and passes.
//!
//! Each run asserts: both exit codes are 0 and the data was verified (perf's JSON `verified: true`, pingpong's
//! `-c` check); both sides said they took the AF_XDP link and their `--stats` link counters show the frames went
//! through the AF_XDP rings (`xdp_rx_frames`, `xdp_tx_frames`); the server namespace's kernel UDP stack saw
//! (almost) none of the RoCE packets (`Udp:` InDatagrams + NoPorts + InErrors, so the XDP program really steered
//! them to the socket); the client's `--pcap` capture passes `testdata/tools/check_pcap.py --strict --pmtu 1024`.
//!
//! Loss: RC write-bw and send-bw under 5 % loss on both sides (`--loss 0.05`) over AF_XDP complete with verified
//! data.
//!
//! Interoperation: an AF_XDP client against a server on the UDP link (kernel UDP stack), same checks on the
//! client's side.
//!
//! The fallback: a server without privilege (`setpriv` to `nobody`) asked for `--link xdp` prints the cause and
//! runs over UDP, and the run completes.
//!
//! The C library (`rocev2 run --link xdp`, issue #19), in 198.18.52.0/24: Debian's `ibv_rc_pingpong` and
//! perftest's `ib_write_bw`, `ib_send_lat` and `ib_send_bw -c UD` with both ends on AF_XDP complete by their own criteria, both
//! libraries say they opened the AF_XDP link, neither kernel UDP stack saw the RoCE packets, and the client's
//! capture (`rocev2 run --pcap`) passes `check_pcap.py --strict --pmtu 1024`; without privilege the library names the cause and the run completes over UDP;
//! a second process on an address an AF_XDP program holds is refused with the rule (and a UDP one with the taken
//! port), the first completes; on a loopback address (127.0.218.1/.2, no root needed) the library names the cause
//! and runs over UDP.
//!
//! In 198.18.56.0/24 (issue #19): on veths of MTU 9000 the C library reports the MTU the AF_XDP link carries
//! (2048) and `ibv_rc_pingpong -m 4096` is refused cleanly; an AF_XDP client whose peer is an address of its own
//! host is named unreachable once.

mod common;

use std::path::Path;
use std::time::Duration;

use common::{
    Finished, NetnsPair, Proc, check_pcap, netns_unavailable, scratch, serial, stats_section,
    strings,
};
use serde_json::Value;

const IP_A: &str = "198.18.26.1";
const IP_B: &str = "198.18.26.2";
const PMTU: u32 = 1024;

fn skip(name: &str) -> bool {
    if let Some(why) = netns_unavailable() {
        eprintln!("SKIPPED ({name}): {why}; these tests need root and `ip netns`");
        return true;
    }
    if let Err(e) = roce_link::xdp::probe() {
        eprintln!("SKIPPED ({name}): no AF_XDP here: {e}");
        return true;
    }
    false
}

/// Asserts that `f` (side `side`) took the AF_XDP link and moved frames through its rings.
fn assert_xdp_used(label: &str, side: &str, f: &Finished) {
    assert!(
        f.stderr.contains("AF_XDP link on veth0"),
        "{label} {side}: no AF_XDP link message:\n{f}"
    );
    assert!(
        !f.stderr.contains("AF_XDP cannot be used"),
        "{label} {side}: fell back:\n{f}"
    );
    let link = stats_section(&f.stderr, &format!("udp link counters ({side}):"));
    for k in ["xdp_rx_frames", "xdp_tx_frames"] {
        assert!(
            link.get(k).copied().unwrap_or(0) > 0,
            "{label} {side}: {k} is 0: {link:?}"
        );
    }
    for k in ["xdp_tx_no_neighbour", "xdp_tx_invalid", "xdp_rx_bad_desc"] {
        assert_eq!(
            link.get(k).copied().unwrap_or(0),
            0,
            "{label} {side}: {k}: {link:?}"
        );
    }
}

/// One perf run `test` (RC, `-s size`, `-n iters`) with the client on `--link xdp` and the server on
/// `server_link` (`xdp` or `udp`).
fn perf_over_xdp(
    ns: &NetnsPair,
    dir: &Path,
    port: u16,
    (test, size, iters): (&str, u64, u64),
    server_link: &str,
    loss: Option<f64>,
) {
    let label = format!(
        "{test}-s{size}-server-{server_link}-loss{}",
        loss.unwrap_or(0.0)
    );
    let lossy = |seed: &str| -> Vec<String> {
        loss.map_or(vec![], |l| {
            strings(&["--loss", &l.to_string(), "--seed", seed])
        })
    };
    let port_s = port.to_string();
    let udp_before = udp_seen_by_kernel(&ns.a);
    let mut srv = strings(&[
        "perf",
        test,
        "--ip",
        IP_A,
        "-p",
        &port_s,
        "--json",
        "--stats",
        "--link",
        server_link,
    ]);
    srv.extend(lossy("11"));
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
    let pcap = dir.join(format!("{label}.pcap"));
    let mut cli = strings(&[
        "perf",
        test,
        IP_A,
        "-p",
        &port_s,
        "--ip",
        IP_B,
        "-n",
        &iters.to_string(),
        "-s",
        &size.to_string(),
        "-m",
        &PMTU.to_string(),
        "--json",
        "--stats",
        "--timeout",
        "20",
        "--link",
        "xdp",
        "--pcap",
    ]);
    cli.push(pcap.to_string_lossy().into_owned());
    cli.extend(lossy("12"));
    let client = Proc::spawn(
        &format!("client-{label}"),
        dir,
        &NetnsPair::argv(&ns.b, &cli),
    )
    .wait(Duration::from_secs(120));
    let server = server.wait(Duration::from_secs(30));
    assert!(
        client.status.success() && server.status.success(),
        "{label}:\nclient {client}\nserver {server}"
    );
    for (side, f) in [("client", &client), ("server", &server)] {
        let v: Vec<Value> = f.json_lines();
        assert_eq!(v.len(), 1, "{label} {side}: {f}");
        assert_eq!(v[0]["test"], test, "{label} {side}: {f}");
        assert_eq!(v[0]["iterations"], iters, "{label} {side}: {f}");
        assert_eq!(v[0]["verified"], true, "{label} {side}: {f}");
        if side == "client" || server_link == "xdp" {
            assert_xdp_used(&label, side, f);
        }
    }
    if loss.is_some() {
        let eng = stats_section(&client.stderr, "engine counters (client):");
        assert!(
            eng.get("retransmitted_pkts").copied().unwrap_or(0) > 0,
            "{label}: no retransmission under loss: {eng:?}"
        );
    }
    // Every iteration moves at least one message's data packets through the client.
    let captured = check_pcap(&pcap, Some(PMTU));
    let min = iters * size.div_ceil(u64::from(PMTU)).max(1);
    assert!(
        captured >= min,
        "{label}: {captured} RoCE packets captured, expected at least {min}"
    );
    // With an AF_XDP server the RoCE packets went to its socket, not to the kernel's UDP stack (a few datagrams
    // of the neighbour solicitation may reach the discard port; none of the >= `min` RoCE packets may). (A UDP
    // server's packets do go through its kernel's UDP stack, so nothing to compare then.)
    let udp = udp_seen_by_kernel(&ns.a).saturating_sub(udp_before);
    if server_link == "xdp" {
        assert!(
            udp < min / 2,
            "{label}: the server namespace's kernel delivered {udp} UDP datagrams (RoCE went through the kernel?)"
        );
    }
}

#[test]
fn perf_send_bw_write_bw_read_lat_over_xdp() {
    if skip("xdp_netns") {
        return;
    }
    let _g = serial();
    let ns = NetnsPair::up("xdp1", IP_A, IP_B, 1500);
    ns.wait_running();
    let dir = scratch("xdp_netns_perf");
    perf_over_xdp(&ns, &dir, 19261, ("send-bw", 4096, 2000), "xdp", None);
    perf_over_xdp(&ns, &dir, 19262, ("write-bw", 4096, 2000), "xdp", None);
    perf_over_xdp(&ns, &dir, 19263, ("read-lat", 2048, 500), "xdp", None);
    // 5 % loss on both sides (fault injection over the AF_XDP link): go-back-N recovers, data verified.
    perf_over_xdp(
        &ns,
        &dir,
        19268,
        ("write-bw", 4096, 1000),
        "xdp",
        Some(0.05),
    );
    perf_over_xdp(&ns, &dir, 19269, ("send-bw", 4096, 1000), "xdp", Some(0.05));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Interoperation: an AF_XDP client against a server on the kernel's UDP stack (whose frames the client's XDP
/// program must steer to its socket, on whichever receive queue they arrive).
#[test]
fn xdp_client_against_a_udp_server() {
    if skip("xdp_netns") {
        return;
    }
    let _g = serial();
    let ns = NetnsPair::up("xdp4", IP_A, IP_B, 1500);
    // Two receive queues on each veth end (ethtool, when installed): the kernel then spreads the server's flows
    // over both, and the client must have a socket on each.
    let two_queues = common::program_missing("ethtool", "ethtool").is_none()
        && [&ns.a, &ns.b].iter().all(|n| {
            std::process::Command::new("ip")
                .args([
                    "netns", "exec", n, "ethtool", "-L", "veth0", "rx", "2", "tx", "2",
                ])
                .status()
                .is_ok_and(|s| s.success())
        });
    if !two_queues {
        eprintln!("note (xdp_netns): one receive queue per veth end (ethtool missing or refused)");
    }
    ns.wait_running();
    let dir = scratch("xdp_netns_mixed");
    perf_over_xdp(&ns, &dir, 19266, ("write-bw", 4096, 2000), "udp", None);
    perf_over_xdp(&ns, &dir, 19267, ("send-lat", 64, 500), "udp", None);
    if two_queues {
        let err = std::fs::read_to_string(dir.join("client-send-lat-s64-server-udp-loss0.err"))
            .expect("client stderr");
        assert!(
            err.contains("(2 receive queue(s)"),
            "client did not bind two queues:\n{err}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn pingpong_over_xdp_with_check() {
    if skip("xdp_netns") {
        return;
    }
    let _g = serial();
    let ns = NetnsPair::up("xdp2", IP_A, IP_B, 1500);
    ns.wait_running();
    let dir = scratch("xdp_netns_pingpong");
    let srv = strings(&[
        "pingpong", "rc", "--ip", IP_A, "-p", "19264", "-n", "300", "-c", "--link", "xdp",
    ]);
    let mut server = Proc::spawn("server", &dir, &NetnsPair::argv(&ns.a, &srv));
    common::wait_socket(
        &mut server,
        "tcp",
        ns.octets_a(),
        19264,
        Duration::from_secs(20),
    );
    let cli = strings(&[
        "pingpong", "rc", IP_A, "--ip", IP_B, "-p", "19264", "-n", "300", "-c", "--link", "xdp",
    ]);
    let client =
        Proc::spawn("client", &dir, &NetnsPair::argv(&ns.b, &cli)).wait(Duration::from_secs(60));
    let server = server.wait(Duration::from_secs(30));
    assert!(
        client.status.success() && server.status.success(),
        "client {client}\nserver {server}"
    );
    for (side, f) in [("client", &client), ("server", &server)] {
        assert!(f.stderr.contains("AF_XDP link on veth0"), "{side}: {f}");
        assert!(f.stdout.contains("300 iters"), "{side}: {f}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Without privilege the AF_XDP socket cannot be opened: the server says why and runs over UDP with a UDP client.
#[test]
fn xdp_without_privilege_falls_back_to_udp_with_the_cause() {
    if skip("xdp_netns") {
        return;
    }
    if let Some(why) = common::program_missing("setpriv", "util-linux") {
        eprintln!("SKIPPED (xdp_netns): {why}");
        return;
    }
    let _g = serial();
    let ns = NetnsPair::up("xdp3", IP_A, IP_B, 1500);
    ns.wait_running();
    let dir = scratch("xdp_netns_fallback");
    let mut srv = vec![
        "ip".to_owned(),
        "netns".to_owned(),
        "exec".to_owned(),
        ns.a.clone(),
        "setpriv".to_owned(),
        "--reuid=nobody".to_owned(),
        "--regid=nogroup".to_owned(),
        "--clear-groups".to_owned(),
        "--".to_owned(),
        common::bin().to_owned(),
    ];
    srv.extend(strings(&[
        "perf", "write-bw", "--ip", IP_A, "-p", "19265", "--json", "--link", "xdp",
    ]));
    let mut server = Proc::spawn("server", &dir, &srv);
    common::wait_socket(
        &mut server,
        "tcp",
        ns.octets_a(),
        19265,
        Duration::from_secs(20),
    );
    let cli = strings(&[
        "perf",
        "write-bw",
        IP_A,
        "--ip",
        IP_B,
        "-p",
        "19265",
        "-n",
        "200",
        "-s",
        "4096",
        "--json",
        "--timeout",
        "20",
    ]);
    let client =
        Proc::spawn("client", &dir, &NetnsPair::argv(&ns.b, &cli)).wait(Duration::from_secs(60));
    let server = server.wait(Duration::from_secs(30));
    assert!(
        client.status.success() && server.status.success(),
        "client {client}\nserver {server}"
    );
    assert!(
        server
            .stderr
            .contains("--link xdp: AF_XDP cannot be used (")
            && server.stderr.contains("Operation not permitted")
            && server.stderr.contains("CAP_NET_ADMIN")
            && server.stderr.contains("using the UDP link"),
        "server did not name the cause:\n{server}"
    );
    assert!(!server.stderr.contains("AF_XDP link on"), "{server}");
    let v = server.json_lines();
    assert_eq!(v.len(), 1, "{server}");
    assert_eq!(v[0]["verified"], true, "{server}");
    let _ = std::fs::remove_dir_all(&dir);
}

// ---- The libibverbs programs under `rocev2 run --link xdp` (198.18.52.0/24) ----

const C_IP_A: &str = "198.18.52.1";
const C_IP_B: &str = "198.18.52.2";

/// The UDP datagrams the kernel's UDP stack of namespace `ns` has seen (`/proc/net/snmp` `Udp:` InDatagrams +
/// NoPorts + InErrors): a RoCE packet the XDP program failed to steer is one of them, whether a socket read it, no
/// socket had the port, or the AF_XDP link's claim socket on UDP 4791 (which drops all) discarded it.
fn udp_seen_by_kernel(ns: &str) -> u64 {
    let out = std::process::Command::new("ip")
        .args(["netns", "exec", ns, "cat", "/proc/net/snmp"])
        .output()
        .expect("read /proc/net/snmp");
    let text = String::from_utf8_lossy(&out.stdout);
    let mut udp = text.lines().filter(|l| l.starts_with("Udp:"));
    let (names, values) = (
        udp.next().expect("Udp header"),
        udp.next().expect("Udp values"),
    );
    names
        .split_whitespace()
        .zip(values.split_whitespace())
        .filter(|(n, _)| ["InDatagrams", "NoPorts", "InErrors"].contains(n))
        .map(|(_, v)| v.parse::<u64>().expect("number"))
        .sum()
}

/// `[ip netns exec NS] [setpriv … nobody --] rocev2 run --ip IP --link LINK -- PROGRAM ARGS [PEER]`.
fn run_cmd(
    ns: Option<&str>,
    unprivileged: bool,
    ip: &str,
    link: &str,
    program: &[&str],
    peer: Option<&str>,
) -> Vec<String> {
    let mut v = Vec::new();
    if let Some(ns) = ns {
        v.extend(strings(&["ip", "netns", "exec", ns]));
    }
    if unprivileged {
        v.extend(strings(&[
            "setpriv",
            "--reuid=nobody",
            "--regid=nogroup",
            "--clear-groups",
            "--",
        ]));
    }
    v.extend(strings(&[
        common::bin(),
        "run",
        "--ip",
        ip,
        "--link",
        link,
        "--",
    ]));
    v.extend(strings(program));
    v.extend(peer.map(str::to_owned));
    v
}

/// `argv` of [`run_cmd`] with `--pcap FILE` among `rocev2 run`'s options.
fn with_pcap(mut argv: Vec<String>, file: &Path) -> Vec<String> {
    let run = argv.iter().position(|a| a == "run").expect("rocev2 run");
    let end = run + argv[run..].iter().position(|a| a == "--").expect("--");
    argv.splice(
        end..end,
        ["--pcap".to_owned(), file.to_string_lossy().into_owned()],
    );
    argv
}

/// Server (`server` argv) then client (`client` argv, the server's TCP port `port` open first); both must exit 0.
fn c_pair(
    dir: &Path,
    label: &str,
    server: &[String],
    client: &[String],
    port: u16,
) -> (Finished, Finished) {
    let mut s = Proc::spawn(&format!("{label}-server"), dir, server);
    common::wait_socket(&mut s, "tcp", [0, 0, 0, 0], port, Duration::from_secs(60));
    let c = Proc::spawn(&format!("{label}-client"), dir, client).wait(Duration::from_secs(120));
    let s = s.wait(Duration::from_secs(60));
    assert!(
        s.status.success() && c.status.success(),
        "{label}:\nserver {s}\nclient {c}"
    );
    (s, c)
}

/// What a side of a C program run says about its link: over AF_XDP, or the fallback with its cause.
fn assert_library_on_xdp(label: &str, side: &str, f: &Finished) {
    assert!(
        f.stderr
            .contains("rocev2 libibverbs: AF_XDP link on veth0 (")
            && !f.stderr.contains("AF_XDP cannot be used"),
        "{label} {side}: the library did not open the AF_XDP link:\n{f}"
    );
}

/// Debian's `ibv_rc_pingpong` and perftest's `ib_write_bw`, `ib_send_lat` and `ib_send_bw -c UD`, both ends under
/// `rocev2 run --link xdp` in two namespaces: each completes by its own criteria (pingpong's result lines, perftest's
/// result row), both libraries say they opened the AF_XDP link, the client's capture (`rocev2 run --pcap`) passes
/// the ICRC checker, and neither namespace's kernel UDP stack saw the RoCE packets (the XDP program steered them to
/// the sockets).
#[test]
fn libibverbs_programs_over_xdp() {
    if skip("xdp_netns") {
        return;
    }
    common::need_program("ibv_rc_pingpong", "ibverbs-utils");
    common::need_program("ib_write_bw", "perftest");
    common::c_libraries();
    let _g = serial();
    let ns = NetnsPair::up("xdpc1", C_IP_A, C_IP_B, 1500);
    ns.wait_running();
    let dir = scratch("xdp_netns_libibverbs");
    // (program and arguments, the line of a completed run).
    // (program and arguments, the size its result row starts with; `None`: ibv_rc_pingpong, whose two sides print
    // "200 iters in"). perftest's bandwidth and latency rows start with the size and the 200 iterations; the
    // client prints them (ib_send_bw's server too).
    let runs: [(&[&str], Option<&str>); 4] = [
        (&["ibv_rc_pingpong", "-g", "0", "-n", "200"], None),
        (&["ib_write_bw", "-n", "200", "-s", "4096"], Some("4096")),
        (&["ib_send_lat", "-n", "200", "-s", "64"], Some("64")),
        (
            &["ib_send_bw", "-n", "200", "-s", "512", "-c", "UD"],
            Some("512"),
        ),
    ];
    for (i, (program, row)) in runs.into_iter().enumerate() {
        let label = format!("{i}-{}", program[0]);
        let before = [udp_seen_by_kernel(&ns.a), udp_seen_by_kernel(&ns.b)];
        let pcap = dir.join(format!("{label}.pcap"));
        let (s, c) = c_pair(
            &dir,
            &label,
            &run_cmd(Some(&ns.a), false, C_IP_A, "xdp", program, None),
            &with_pcap(
                run_cmd(Some(&ns.b), false, C_IP_B, "xdp", program, Some(C_IP_A)),
                &pcap,
            ),
            18515,
        );
        for (side, f) in [("server", &s), ("client", &c)] {
            assert_library_on_xdp(&label, side, f);
        }
        match row {
            None => {
                for (side, f) in [("server", &s), ("client", &c)] {
                    assert!(f.stdout.contains("200 iters in "), "{label} {side}:\n{f}");
                }
            }
            Some(size) => assert!(
                c.stdout
                    .lines()
                    .any(|l| l.split_whitespace().take(2).eq([size, "200"])),
                "{label}: no result row for {size} B x 200:\n{c}"
            ),
        }
        // The client's capture (`rocev2 run --pcap`, both directions): every ICRC and header checks out, and it
        // holds at least the 200 messages of the run.
        let captured = check_pcap(&pcap, Some(PMTU));
        assert!(captured >= 200, "{label}: {captured} RoCE packets captured");
        // Every run moves hundreds of RoCE packets (ib_write_bw: 800 data packets into the server); the kernel's UDP
        // stacks may see none of them (nothing else in these namespaces sends UDP; a bound of 10 leaves room for a
        // neighbour probe).
        for (side, n, was) in [("server", &ns.a, before[0]), ("client", &ns.b, before[1])] {
            let seen = udp_seen_by_kernel(n) - was;
            assert!(
                seen < 10,
                "{label} {side}: the kernel's UDP stack saw {seen} datagrams (RoCE went through the kernel?)"
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Without privilege (`setpriv` to `nobody`) the library asked for `--link xdp` cannot open an AF_XDP socket: it
/// says why and runs over UDP, and `ibv_rc_pingpong` completes against a client that is on AF_XDP.
#[test]
fn libibverbs_without_privilege_falls_back_to_udp_with_the_cause() {
    if skip("xdp_netns") {
        return;
    }
    common::need_program("ibv_rc_pingpong", "ibverbs-utils");
    if let Some(why) = common::program_missing("setpriv", "util-linux") {
        eprintln!("SKIPPED (xdp_netns): {why}");
        return;
    }
    common::c_libraries();
    let _g = serial();
    let ns = NetnsPair::up("xdpc2", C_IP_A, C_IP_B, 1500);
    ns.wait_running();
    let dir = scratch("xdp_netns_libibverbs_fallback");
    let program = ["ibv_rc_pingpong", "-g", "0", "-n", "100"];
    let (s, c) = c_pair(
        &dir,
        "unprivileged",
        &run_cmd(Some(&ns.a), true, C_IP_A, "xdp", &program, None),
        &run_cmd(Some(&ns.b), false, C_IP_B, "xdp", &program, Some(C_IP_A)),
        18515,
    );
    assert!(
        s.stderr.contains(
            "rocev2 libibverbs: --link xdp: AF_XDP cannot be used (link I/O error: opening an AF_XDP socket: \
             Operation not permitted"
        ) && s.stderr.contains("CAP_NET_ADMIN")
            && s.stderr.contains("; using the UDP link"),
        "server did not name the cause:\n{s}"
    );
    assert!(!s.stderr.contains("AF_XDP link on"), "{s}");
    assert_library_on_xdp("unprivileged", "client", &c);
    for (side, f) in [("server", &s), ("client", &c)] {
        assert!(f.stdout.contains("100 iters in "), "{side}: {f}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// One process per address over AF_XDP: while a program under `rocev2 run --link xdp` has the address, a second
/// one asked for `--link xdp` on it is refused with the rule (its `ibv_alloc_pd` fails), and so is one on the
/// UDP link (the port is taken); the first program is unaffected and completes. And with a UDP-link program first,
/// one asked for `--link xdp` is refused too (no fallback to UDP beside it).
#[test]
fn a_second_process_on_an_xdp_address_is_refused() {
    if skip("xdp_netns") {
        return;
    }
    common::need_program("ibv_rc_pingpong", "ibverbs-utils");
    common::c_libraries();
    let _g = serial();
    let ns = NetnsPair::up("xdpc3", C_IP_A, C_IP_B, 1500);
    ns.wait_running();
    let dir = scratch("xdp_netns_libibverbs_second");
    let program = ["ibv_rc_pingpong", "-g", "0", "-n", "100"];
    // ibv_rc_pingpong has its PD, CQ and QP (so the device's link) before it listens on TCP.
    let mut first = Proc::spawn(
        "first",
        &dir,
        &run_cmd(Some(&ns.a), false, C_IP_A, "xdp", &program, None),
    );
    common::wait_socket(
        &mut first,
        "tcp",
        [0, 0, 0, 0],
        18515,
        Duration::from_secs(60),
    );
    let other_port = ["ibv_rc_pingpong", "-g", "0", "-n", "100", "-p", "18516"];
    for link in ["xdp", "udp"] {
        let second = Proc::spawn(
            &format!("second-{link}"),
            &dir,
            &run_cmd(Some(&ns.a), false, C_IP_A, link, &other_port, None),
        )
        .wait(Duration::from_secs(60));
        assert!(!second.status.success(), "second ({link}) ran:\n{second}");
        assert!(
            second.stderr.contains("Couldn't allocate PD"),
            "second ({link}): {second}"
        );
        let why = if link == "xdp" {
            "UDP 4791 on 198.18.52.1 is taken by another process, and an AF_XDP link takes its address alone: \
             several processes on one address are not supported over AF_XDP"
        } else {
            "bind for UDP 198.18.52.1:4791: Address already in use"
        };
        assert!(
            second
                .stderr
                .contains("rocev2 libibverbs: opening rocev2_veth0 on 198.18.52.1")
                && second.stderr.contains(why),
            "second ({link}) did not say why:\n{second}"
        );
    }
    let c = Proc::spawn(
        "client",
        &dir,
        &run_cmd(Some(&ns.b), false, C_IP_B, "xdp", &program, Some(C_IP_A)),
    )
    .wait(Duration::from_secs(120));
    let s = first.wait(Duration::from_secs(60));
    assert!(
        s.status.success() && c.status.success(),
        "first {s}\nclient {c}"
    );
    for (side, f) in [("first", &s), ("client", &c)] {
        assert_library_on_xdp("second-process", side, f);
        assert!(f.stdout.contains("100 iters in "), "{side}: {f}");
    }
    // The other order: a program on the UDP link has the address (its socket shares through SO_REUSEPORT); one
    // asked for AF_XDP there is refused, not put beside it on UDP.
    let mut first = Proc::spawn(
        "first-udp",
        &dir,
        &run_cmd(Some(&ns.a), false, C_IP_A, "udp", &program, None),
    );
    common::wait_socket(
        &mut first,
        "tcp",
        [0, 0, 0, 0],
        18515,
        Duration::from_secs(60),
    );
    let second = Proc::spawn(
        "second-after-udp",
        &dir,
        &run_cmd(Some(&ns.a), false, C_IP_A, "xdp", &other_port, None),
    )
    .wait(Duration::from_secs(60));
    assert!(
        !second.status.success()
            && second.stderr.contains(
                "UDP 4791 on 198.18.52.1 is taken by another process, and an AF_XDP link takes its address alone"
            )
            && !second.stderr.contains("using the UDP link"),
        "second (xdp after udp):\n{second}"
    );
    let c = Proc::spawn(
        "client-udp",
        &dir,
        &run_cmd(Some(&ns.b), false, C_IP_B, "udp", &program, Some(C_IP_A)),
    )
    .wait(Duration::from_secs(120));
    let s = first.wait(Duration::from_secs(60));
    assert!(
        s.status.success() && c.status.success(),
        "first (udp) {s}\nclient {c}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// An interface without AF_XDP for rocev2: on a loopback address (`lo`, no neighbour table) the library asked for
/// `--link xdp` says so and both ends of `ibv_rc_pingpong` run over UDP to completion. Needs no privilege
/// (127.0.218.1 / .2, TCP port 18652).
#[test]
fn libibverbs_on_loopback_falls_back_to_udp_with_the_cause() {
    common::need_program("ibv_rc_pingpong", "ibverbs-utils");
    common::c_libraries();
    let dir = scratch("xdp_loopback_libibverbs");
    let program = ["ibv_rc_pingpong", "-g", "0", "-n", "100", "-p", "18652"];
    let (s, c) = c_pair(
        &dir,
        "loopback",
        &run_cmd(None, false, "127.0.218.1", "xdp", &program, None),
        &run_cmd(
            None,
            false,
            "127.0.218.2",
            "xdp",
            &program,
            Some("127.0.218.1"),
        ),
        18652,
    );
    for (side, f, ip) in [("server", &s, "127.0.218.1"), ("client", &c, "127.0.218.2")] {
        assert!(
            f.stderr.contains(&format!(
                "rocev2 libibverbs: --link xdp: AF_XDP cannot be used (on a loopback address ({ip})); using the \
                 UDP link"
            )),
            "{side}: no fallback message:\n{f}"
        );
        assert!(f.stdout.contains("100 iters in "), "{side}: {f}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

// ---- A jumbo interface under `rocev2 run --link xdp` (198.18.56.0/24, MTU 9000) ----

const J_IP_A: &str = "198.18.56.1";
const J_IP_B: &str = "198.18.56.2";

/// Issue #19: on veths of MTU 9000 the AF_XDP link still carries only frames of one 4 KiB UMEM chunk (3840 B), so
/// the device reports the MTU it can carry: `ibv_devinfo` shows active_mtu 2048 (it showed 4096), and
/// `ibv_rc_pingpong -m 4096` is refused cleanly at RTR ("Failed to modify QP to RTR", both sides exit) where it
/// used to spin forever on a frame the link could never send; at `-m 2048` the run completes over AF_XDP.
#[test]
fn libibverbs_on_a_jumbo_interface_get_the_mtu_the_xdp_link_carries() {
    if skip("xdp_netns") {
        return;
    }
    common::need_program("ibv_rc_pingpong", "ibverbs-utils");
    common::need_program("ibv_devinfo", "ibverbs-utils");
    common::c_libraries();
    let _g = serial();
    let ns = NetnsPair::up("xdpj", J_IP_A, J_IP_B, 9000);
    ns.wait_running();
    let dir = scratch("xdp_netns_jumbo");
    let info = Proc::spawn(
        "devinfo",
        &dir,
        &run_cmd(
            Some(&ns.a),
            false,
            J_IP_A,
            "xdp",
            &["ibv_devinfo", "-v"],
            None,
        ),
    )
    .wait(Duration::from_secs(60));
    assert!(info.status.success(), "{info}");
    let mtu_of = |key: &str| -> Vec<String> {
        info.stdout
            .lines()
            .filter(|l| l.trim_start().starts_with(key))
            .map(|l| l.split_whitespace().skip(1).collect::<Vec<_>>().join(" "))
            .collect()
    };
    assert_eq!(mtu_of("active_mtu:"), ["2048 (4)"], "{info}");
    assert_eq!(mtu_of("max_mtu:"), ["2048 (4)"], "{info}");

    // -m 4096: refused at RTR on both sides, no spinning.
    let pp = |m: &'static str| -> [&'static str; 7] {
        ["ibv_rc_pingpong", "-g", "0", "-m", m, "-n", "100"]
    };
    let big = pp("4096");
    let mut s = Proc::spawn(
        "m4096-server",
        &dir,
        &run_cmd(Some(&ns.a), false, J_IP_A, "xdp", &big, None),
    );
    common::wait_socket(&mut s, "tcp", [0, 0, 0, 0], 18515, Duration::from_secs(60));
    let c = Proc::spawn(
        "m4096-client",
        &dir,
        &run_cmd(Some(&ns.b), false, J_IP_B, "xdp", &big, Some(J_IP_A)),
    )
    .wait(Duration::from_secs(60));
    let s = s.wait(Duration::from_secs(60));
    // The server refuses at RTR and closes the exchange; the client then cannot read the server's address.
    assert!(
        !s.status.success() && s.stderr.contains("Failed to modify QP to RTR"),
        "-m 4096 server: expected a refusal at RTR:\n{s}"
    );
    assert!(
        !c.status.success(),
        "-m 4096 client: expected a failure after the server's refusal:\n{c}"
    );

    // -m 2048: completes over AF_XDP.
    let (s, c) = c_pair(
        &dir,
        "m2048",
        &run_cmd(Some(&ns.a), false, J_IP_A, "xdp", &pp("2048"), None),
        &run_cmd(Some(&ns.b), false, J_IP_B, "xdp", &pp("2048"), Some(J_IP_A)),
        18515,
    );
    for (side, f) in [("server", &s), ("client", &c)] {
        assert_library_on_xdp("m2048", side, f);
        assert!(f.stdout.contains("100 iters in "), "m2048 {side}:\n{f}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue #19: the AF_XDP link reaches on-link peers on other hosts only. A client on AF_XDP (198.18.56.1) whose
/// server is another address of its own host (198.18.56.11, same namespace, on the UDP link) never reaches it
/// (its frames would have to go over `lo`): the library says so once, naming the peer and why, and the program
/// fails (retries exhausted) instead of hanging.
#[test]
fn an_xdp_peer_on_this_host_is_named_as_unreachable() {
    if skip("xdp_netns") {
        return;
    }
    common::need_program("ibv_rc_pingpong", "ibverbs-utils");
    common::c_libraries();
    let _g = serial();
    let ns = NetnsPair::up("xdpl", J_IP_A, J_IP_B, 1500);
    ns.wait_running();
    let own = "198.18.56.11";
    let added = std::process::Command::new("ip")
        .args([
            "-n",
            &ns.a,
            "addr",
            "add",
            &format!("{own}/24"),
            "dev",
            "veth0",
        ])
        .status()
        .expect("ip addr add");
    assert!(added.success(), "ip addr add {own}");
    let dir = scratch("xdp_netns_samehost");
    let pp = ["ibv_rc_pingpong", "-g", "0", "-n", "20"];
    let mut s = Proc::spawn(
        "server",
        &dir,
        &run_cmd(Some(&ns.a), false, own, "udp", &pp, None),
    );
    common::wait_socket(&mut s, "tcp", [0, 0, 0, 0], 18515, Duration::from_secs(60));
    let c = Proc::spawn(
        "client",
        &dir,
        &run_cmd(Some(&ns.a), false, J_IP_A, "xdp", &pp, Some(own)),
    )
    .wait(Duration::from_secs(120));
    drop(s);
    assert_library_on_xdp("samehost", "client", &c);
    let warned = format!("AF_XDP link on veth0: cannot reach {own}: it is an address of this host");
    assert_eq!(
        c.stderr.matches(&warned).count(),
        1,
        "the client must name the unreachable peer once:\n{c}"
    );
    assert!(
        !c.status.success(),
        "the client cannot have completed:\n{c}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
