//! The path MTU `rocev2 perf` and `rocev2 pingpong` pick on a real link: two processes in two network namespaces
//! joined by a veth pair of 1500-byte MTU, where the active MTU (netdev MTU − 80 rounded down to an IB MTU, as
//! Linux rxe) is 1024. Needs root and `ip netns`; otherwise every test prints why it is skipped and passes.
//!
//! * `perf write-bw` without `-m`: completes with verified data, the client's banner says `Mtu : 1024[B]`, the
//!   server's JSON says `mtu: 1024`, nothing is noted on stderr, and the client's capture passes
//!   `check_pcap.py --strict --pmtu 1024` with at least `iters × size / 1024` packets.
//! * `-m 4096` on the client: lowered to 1024 with a note on its stderr, verified. `-m 512`: honoured (512 on
//!   both sides, which take the smaller), verified.
//! * `pingpong rc -m 4096` on both sides: each notes the lowering and the run completes with the pattern checked.
//!
//! The namespaces are deleted and the processes killed when a test ends, also on failure (drop guards).

mod common;

use std::path::Path;
use std::time::Duration;

use common::{Finished, NetnsPair, Proc, check_pcap, netns_unavailable, scratch, serial, strings};
use serde_json::Value;

const LINK_MTU: u32 = 1500;
const ACTIVE: u64 = 1024;
const IP_A: &str = "198.18.12.1";
const IP_B: &str = "198.18.12.2";
const SIZE: u64 = 8192;
const ITERS: u64 = 300;

fn skip() -> bool {
    if let Some(why) = netns_unavailable() {
        eprintln!("SKIPPED (netns_mtu): {why}; these tests need root and `ip netns`");
        return true;
    }
    false
}

/// Runs `perf write-bw` between A (server, `--json`) and B (client, `--json` if `client_json`), the client with
/// `extra` flags and a capture; asserts both exit 0 and returns (client, server, capture path).
fn perf(
    ns: &NetnsPair,
    dir: &Path,
    port: u16,
    label: &str,
    extra: &[&str],
    client_json: bool,
) -> (Finished, Finished, std::path::PathBuf) {
    let port_s = port.to_string();
    let srv_args = strings(&[
        "perf", "write-bw", "--ip", &ns.ip_a, "-p", &port_s, "--json",
    ]);
    let mut server = Proc::spawn(
        &format!("server-{label}"),
        dir,
        &NetnsPair::argv(&ns.a, &srv_args),
    );
    common::wait_socket(
        &mut server,
        "tcp",
        ns.octets_a(),
        port,
        Duration::from_secs(20),
    );
    let pcap = dir.join(format!("{label}.pcap"));
    let (s, n) = (SIZE.to_string(), ITERS.to_string());
    let mut cli_args = strings(&[
        "perf",
        "write-bw",
        &ns.ip_a,
        "-p",
        &port_s,
        "--ip",
        &ns.ip_b,
        "-s",
        &s,
        "-n",
        &n,
        "--timeout",
        "20",
        "--pcap",
    ]);
    cli_args.push(pcap.to_string_lossy().into_owned());
    cli_args.extend(strings(extra));
    if client_json {
        cli_args.push("--json".into());
    }
    let mut client = Proc::spawn(
        &format!("client-{label}"),
        dir,
        &NetnsPair::argv(&ns.b, &cli_args),
    );
    let client = client.wait(Duration::from_secs(120));
    let server = server.wait(Duration::from_secs(30));
    assert!(
        client.status.success() && server.status.success(),
        "{label}:\nclient {client}\nserver {server}"
    );
    (client, server, pcap)
}

/// The single JSON object of a side, checked for a verified write-bw of `SIZE` × `ITERS` at path MTU `mtu`.
fn check_json(f: &Finished, label: &str, mtu: u64) {
    let v = f.json_lines();
    assert_eq!(v.len(), 1, "{label}: one JSON object: {f}");
    let j: &Value = &v[0];
    assert_eq!(j["test"], "write-bw", "{label}: {j}");
    assert_eq!(j["size"], SIZE, "{label}: {j}");
    assert_eq!(j["iterations"], ITERS, "{label}: {j}");
    assert_eq!(j["verified"], true, "{label}: {j}");
    assert_eq!(j["mtu"], mtu, "{label}: {j}");
}

#[test]
fn perf_without_m_uses_the_active_mtu_of_a_1500_byte_link() {
    if skip() {
        return;
    }
    let _s = serial();
    let dir = scratch("netns-mtu-perf");
    let ns = NetnsPair::up("mtup", IP_A, IP_B, LINK_MTU);

    // No -m: the active MTU, silently.
    let (client, server, pcap) = perf(&ns, &dir, 19611, "default", &[], false);
    let banner = client
        .stdout
        .lines()
        .find(|l| l.trim_start().starts_with("Mtu"))
        .unwrap_or_else(|| panic!("no Mtu line in the client's banner: {client}"));
    assert_eq!(
        banner.split(':').nth(1).map(str::trim),
        Some("1024[B]"),
        "banner: {client}"
    );
    check_json(&server, "default (server)", ACTIVE);
    assert!(
        !client.stderr.contains("active MTU") && !server.stderr.contains("active MTU"),
        "no note without -m:\nclient {client}\nserver {server}"
    );
    let captured = check_pcap(&pcap, Some(ACTIVE as u32));
    let min = ITERS * SIZE.div_ceil(ACTIVE);
    assert!(
        captured >= min,
        "{captured} RoCE packets in {}, expected at least {min}",
        pcap.display()
    );

    // -m 4096: lowered to the active MTU, with a note.
    let (client, server, pcap) = perf(&ns, &dir, 19612, "m4096", &["-m", "4096"], true);
    check_json(&client, "m4096 (client)", ACTIVE);
    check_json(&server, "m4096 (server)", ACTIVE);
    let note = client
        .stderr
        .lines()
        .find(|l| l.contains("-m 4096 is above the active MTU"))
        .unwrap_or_else(|| panic!("no note on the client's stderr: {client}"));
    assert!(
        note.contains("veth0") && note.contains("1500") && note.contains("using 1024"),
        "{note}"
    );
    check_pcap(&pcap, Some(ACTIVE as u32));

    // -m 512: below the active MTU, honoured by both sides.
    let (client, server, pcap) = perf(&ns, &dir, 19613, "m512", &["-m", "512"], true);
    check_json(&client, "m512 (client)", 512);
    check_json(&server, "m512 (server)", 512);
    assert!(!client.stderr.contains("active MTU"), "{client}");
    let captured = check_pcap(&pcap, Some(512));
    assert!(captured >= ITERS * SIZE.div_ceil(512), "{captured} packets");
}

#[test]
fn pingpong_caps_m_by_the_active_mtu() {
    if skip() {
        return;
    }
    let _s = serial();
    let dir = scratch("netns-mtu-pingpong");
    let ns = NetnsPair::up("mtug", IP_A, IP_B, LINK_MTU);
    let port = 19621u16;
    let port_s = port.to_string();
    let common_args = ["-m", "4096", "-s", "4096", "-n", "200", "-c", "-p", &port_s];
    let mut srv_args = strings(&["pingpong", "rc", "--ip", &ns.ip_a]);
    srv_args.extend(strings(&common_args));
    let mut server = Proc::spawn("pp-server", &dir, &NetnsPair::argv(&ns.a, &srv_args));
    common::wait_socket(
        &mut server,
        "tcp",
        ns.octets_a(),
        port,
        Duration::from_secs(20),
    );
    let mut cli_args = strings(&["pingpong", "rc", &ns.ip_a, "--ip", &ns.ip_b]);
    cli_args.extend(strings(&common_args));
    let mut client = Proc::spawn("pp-client", &dir, &NetnsPair::argv(&ns.b, &cli_args));
    let client = client.wait(Duration::from_secs(60));
    let server = server.wait(Duration::from_secs(30));
    assert!(
        client.status.success() && server.status.success(),
        "client {client}\nserver {server}"
    );
    for (side, f) in [("client", &client), ("server", &server)] {
        assert!(
            f.stderr
                .contains("-m 4096 is above the active MTU of 198.18.12.")
                && f.stderr.contains("using 1024"),
            "{side}: {f}"
        );
        assert!(
            f.stdout.contains("1638400 bytes in") && f.stdout.contains("200 iters in"),
            "{side}: {f}"
        );
    }
}
