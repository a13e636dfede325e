//! `--link xdp` (the AF_XDP link, `roce_link::xdp`) end to end: `rocev2 perf` and `rocev2 pingpong` between two
//! processes in two network namespaces joined by a veth pair (198.18.26.0/24, 1500-byte MTU, RoCE PMTU 1024),
//! both sides on AF_XDP. Needs root and `ip netns`; otherwise every test prints why it is skipped and passes.
//!
//! Each run asserts: both exit codes are 0 and the data was verified (perf's JSON `verified: true`, pingpong's
//! `-c` check); both sides said they took the AF_XDP link and their `--stats` link counters show the frames went
//! through the AF_XDP rings (`xdp_rx_frames`, `xdp_tx_frames`); the server namespace's kernel UDP stack delivered
//! (almost) none of the RoCE packets (`Udp: InDatagrams`, so the XDP program really steered them to the socket);
//! the client's `--pcap` capture passes `testdata/tools/check_pcap.py --strict --pmtu 1024`.
//!
//! Loss: RC write-bw and send-bw under 5 % loss on both sides (`--loss 0.05`) over AF_XDP complete with verified
//! data.
//!
//! Interoperation: an AF_XDP client against a server on the UDP link (kernel UDP stack), same checks on the
//! client's side.
//!
//! The fallback: a server without privilege (`setpriv` to `nobody`) asked for `--link xdp` prints the cause and
//! runs over UDP, and the run completes.

mod common;

use std::path::Path;
use std::time::Duration;

use common::{
    Finished, NetnsPair, Proc, check_pcap, netns_unavailable, scratch, serial, stats_section,
    strings, udp_in_datagrams,
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
    let udp_before = udp_in_datagrams(&ns.a);
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
    // server in its default AF_PACKET receive mode is not counted there either, so nothing to compare then.)
    let udp = udp_in_datagrams(&ns.a).saturating_sub(udp_before);
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
