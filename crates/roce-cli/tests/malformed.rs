//! A `rocev2 perf` server under attack: while it serves a real client run (two processes over UDP on
//! 127.0.N.x), a third address sends it a burst of hostile datagrams to UDP 4791. The client run must complete
//! with verified data, the server must exit 0, and its `--stats` must count every hostile datagram, exactly, in
//! the counter for its kind:
//!
//! | datagram | counted by |
//! |---|---|
//! | shorter than BTH + ICRC (0, 5, 11, 15 bytes) | UDP link `rx_icrc_bad` (no ICRC to check) |
//! | valid frame with a corrupted ICRC (to the server's own QP) | UDP link `rx_icrc_bad` |
//! | larger than the link MTU (9000 bytes) | UDP link `rx_truncated` |
//! | good ICRC, cut inside RETH / DETH / AtomicETH | engine `drop_malformed` |
//! | good ICRC, BTH TVer 1 | engine `drop_malformed` |
//! | good ICRC, unknown destination QP | engine `drop_unknown_qp` |
//! | good ICRC, opcode unknown or not valid for the QP type, to the server's QP | engine `drop_bad_opcode` |
//! | good ICRC, wrong P_Key | engine `drop_pkey_mismatch` |
//! | good ICRC, UD SEND with a wrong Q_Key (UD server) | engine `drop_qkey_mismatch` |
//!
//! The UDP backend rebuilds the Ethernet/IPv4/UDP headers of a received datagram (IPv4 ID 0, DF, the socket's
//! addresses and ports) and checks the ICRC over that image, so the "good ICRC" datagrams are sealed here over the
//! same image with roce-wire (and checked with `RoceRepr::parse` before they are sent). The server's QP is read from
//! the server itself (`rocev2 stat --json`): each engine numbers its QPs from an offset drawn from its seed
//! (`roce_proto::QpnRange`); the counts prove the hostile frames reached it.

mod common;

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream, UdpSocket};
use std::time::{Duration, Instant};

use common::{Proc, scratch, serial, stats_section, strings};
use roce_wire::{
    Bth, BthRepr, Ecn, Ipv4Packet, Ipv4Repr, Opcode, Psn, Qpn, ROCE_V2_PORT, RoceRepr, UdpPacket,
    UdpRepr, icrc,
};

/// Where a hostile datagram must be counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Counter {
    /// UDP link `rx_icrc_bad`.
    LinkIcrc,
    /// UDP link `rx_truncated`.
    LinkTruncated,
    /// Engine `drop_malformed`.
    Malformed,
    /// Engine `drop_unknown_qp`.
    UnknownQp,
    /// Engine `drop_bad_opcode`.
    BadOpcode,
    /// Engine `drop_pkey_mismatch`.
    Pkey,
    /// Engine `drop_qkey_mismatch`.
    Qkey,
}

impl Counter {
    const ALL: [Counter; 7] = [
        Counter::LinkIcrc,
        Counter::LinkTruncated,
        Counter::Malformed,
        Counter::UnknownQp,
        Counter::BadOpcode,
        Counter::Pkey,
        Counter::Qkey,
    ];
    /// `(section, name)` in the `--stats` output.
    fn name(self) -> (&'static str, &'static str) {
        match self {
            Counter::LinkIcrc => ("udp", "rx_icrc_bad"),
            Counter::LinkTruncated => ("udp", "rx_truncated"),
            Counter::Malformed => ("engine", "drop_malformed"),
            Counter::UnknownQp => ("engine", "drop_unknown_qp"),
            Counter::BadOpcode => ("engine", "drop_bad_opcode"),
            Counter::Pkey => ("engine", "drop_pkey_mismatch"),
            Counter::Qkey => ("engine", "drop_qkey_mismatch"),
        }
    }
}

/// Builds UDP payloads (BTH .. ICRC) as the server's UDP link will see them.
struct Forge {
    src: Ipv4Addr,
    dst: Ipv4Addr,
    sport: u16,
}

/// RC/UC/UD opcodes used below (IBTA Vol 1 Table 38, `ROCEV2.md §1.6`).
const RC_SEND_ONLY: u8 = 0x04;
const RC_WRITE_ONLY: u8 = 0x0A;
const RC_READ_REQUEST: u8 = 0x0C;
const RC_FETCH_ADD: u8 = 0x14;
const UC_SEND_ONLY: u8 = 0x24;
const UD_SEND_ONLY: u8 = 0x64;

impl Forge {
    /// A BTH (TVer 0, P_Key 0xFFFF unless given).
    fn bth(opcode: u8, dest_qp: u32, pkey: u16) -> Vec<u8> {
        let mut b = vec![0u8; 12];
        BthRepr {
            opcode: Opcode(opcode),
            solicited: false,
            mig_req: false,
            pad_count: 0,
            pkey,
            fecn: false,
            becn: false,
            dest_qp: Qpn::new(dest_qp),
            ack_req: true,
            psn: Psn::new(0x123),
        }
        .emit(&mut Bth::new_unchecked(&mut b[..]));
        b
    }

    /// Appends the ICRC computed over the IPv4 + UDP header image the receiving UDP link rebuilds (ID 0, DF).
    fn seal(&self, mut body: Vec<u8>) -> Vec<u8> {
        body.extend_from_slice(&[0; 4]);
        let mut image = vec![0u8; 28 + body.len()];
        Ipv4Repr {
            src_addr: self.src,
            dst_addr: self.dst,
            dscp: 0,
            ecn: Ecn::NotEct,
            ident: 0,
            dont_frag: true,
            ttl: 64,
            protocol: 17,
        }
        .emit(
            &mut Ipv4Packet::new_unchecked(&mut image[..]),
            8 + body.len(),
        );
        UdpRepr {
            src_port: self.sport,
            dst_port: ROCE_V2_PORT,
        }
        .emit(&mut UdpPacket::new_unchecked(&mut image[20..]), body.len());
        image[28..].copy_from_slice(&body);
        icrc::fill(&mut image).expect("ICRC over the header image");
        image[28..].to_vec()
    }

    /// The whole Ethernet frame the server's link hands its engine for `payload` (for self-checks).
    fn frame(&self, payload: &[u8]) -> Vec<u8> {
        let mut image = vec![0u8; 14 + 28 + payload.len()];
        image[12] = 0x08;
        Ipv4Repr {
            src_addr: self.src,
            dst_addr: self.dst,
            dscp: 0,
            ecn: Ecn::NotEct,
            ident: 0,
            dont_frag: true,
            ttl: 64,
            protocol: 17,
        }
        .emit(
            &mut Ipv4Packet::new_unchecked(&mut image[14..]),
            8 + payload.len(),
        );
        UdpRepr {
            src_port: self.sport,
            dst_port: ROCE_V2_PORT,
        }
        .emit(
            &mut UdpPacket::new_unchecked(&mut image[34..]),
            payload.len(),
        );
        image[42..].copy_from_slice(payload);
        image
    }

    /// The hostile datagrams with the counter each must land in. `qpn` is the server's QP, a UD QP if `ud`.
    fn hostile(&self, qpn: u32, ud: bool) -> Vec<(&'static str, Vec<u8>, Counter)> {
        let mut v = Vec::new();
        // Shorter than BTH + ICRC.
        for n in [0usize, 5, 11, 15] {
            v.push((
                "short",
                (0..n).map(|i| i as u8).collect(),
                Counter::LinkIcrc,
            ));
        }
        // A valid SEND ONLY to the server's own QP, ICRC corrupted (would be accepted with a good one).
        let mut send = Self::bth(RC_SEND_ONLY, qpn, 0xFFFF);
        send.extend_from_slice(&[0x5a; 8]);
        let mut bad = self.seal(send.clone());
        let last = bad.len() - 1;
        bad[last] ^= 0x01;
        v.push(("bad ICRC", bad, Counter::LinkIcrc));
        // One byte flipped in the payload, ICRC left as it was.
        let mut bad = self.seal(send.clone());
        bad[14] ^= 0x80;
        v.push(("payload bit flip", bad, Counter::LinkIcrc));
        // Oversized.
        v.push(("oversized", vec![0x11; 9000], Counter::LinkTruncated));
        // Cut inside an extension header, ICRC good.
        for (op, keep) in [
            (RC_WRITE_ONLY, 8usize),
            (RC_READ_REQUEST, 12),
            (RC_FETCH_ADD, 20),
            (UD_SEND_ONLY, 4),
        ] {
            let mut b = Self::bth(op, qpn, 0xFFFF);
            b.extend((0..keep).map(|i| i as u8));
            v.push(("cut extension header", self.seal(b), Counter::Malformed));
        }
        // TVer 1.
        let mut b = send.clone();
        b[1] |= 0x01;
        v.push(("TVer 1", self.seal(b), Counter::Malformed));
        // Unknown destination QPs (QP 0 is not implemented; the server has one QP besides the GSI, so its
        // neighbour and 0xABCDEF are no QP of it, and 0xFFFFFF is the multicast DestQP with no group attached).
        let neighbour = if qpn > 2 { qpn - 1 } else { qpn + 1 };
        let far = if qpn == 0xABCDEF { 0xABCDEE } else { 0xABCDEF };
        for q in [0u32, neighbour, far, 0xFFFFFF] {
            let mut b = Self::bth(RC_SEND_ONLY, q, 0xFFFF);
            b.extend_from_slice(&[0x5a; 8]);
            v.push(("unknown QP", self.seal(b), Counter::UnknownQp));
        }
        // QP 1 is the GSI (a UD QP for CM MADs): an RC SEND to it is an opcode its transport refuses.
        let mut b = Self::bth(RC_SEND_ONLY, 1, 0xFFFF);
        b.extend_from_slice(&[0x5a; 8]);
        v.push((
            "RC opcode to QP 1 (the GSI)",
            self.seal(b),
            Counter::BadOpcode,
        ));
        // Opcodes the QP must refuse: SENDs of the other transports, a reserved RC opcode, a reserved class.
        let mut b = Self::bth(UC_SEND_ONLY, qpn, 0xFFFF);
        b.extend_from_slice(&[0x5a; 8]);
        v.push(("UC opcode", self.seal(b), Counter::BadOpcode));
        if ud {
            let mut b = Self::bth(RC_SEND_ONLY, qpn, 0xFFFF);
            b.extend_from_slice(&[0x5a; 8]);
            v.push(("RC opcode to UD QP", self.seal(b), Counter::BadOpcode));
            // A UD SEND with a Q_Key other than perf's 0x11111111.
            let mut b = Self::bth(UD_SEND_ONLY, qpn, 0xFFFF);
            b.extend_from_slice(&[0x22, 0x22, 0x22, 0x22, 0, 0, 0, 9]);
            b.extend_from_slice(&[0x5a; 8]);
            v.push(("Q_Key mismatch", self.seal(b), Counter::Qkey));
        } else {
            let mut b = Self::bth(UD_SEND_ONLY, qpn, 0xFFFF);
            b.extend_from_slice(&[0x11, 0x11, 0x11, 0x11, 0, 0, 0, 9]);
            b.extend_from_slice(&[0x5a; 8]);
            v.push(("UD opcode to RC QP", self.seal(b), Counter::BadOpcode));
        }
        for op in [0x1F, 0xE5] {
            let mut b = Self::bth(op, qpn, 0xFFFF);
            b.extend_from_slice(&[0x5a; 8]);
            v.push(("reserved opcode", self.seal(b), Counter::BadOpcode));
        }
        // Wrong P_Key.
        let mut b = Self::bth(RC_SEND_ONLY, qpn, 0x1234);
        b.extend_from_slice(&[0x5a; 8]);
        v.push(("P_Key mismatch", self.seal(b), Counter::Pkey));
        v
    }
}

/// Self-check: what roce-wire says about a datagram must match the counter it is expected in.
fn self_check(f: &Forge, what: &str, d: &[u8], c: Counter) {
    if matches!(c, Counter::LinkTruncated) || d.len() < 16 {
        return;
    }
    let frame = f.frame(d);
    let parsed = RoceRepr::parse(&frame);
    match c {
        Counter::LinkIcrc => {
            let p = parsed.unwrap_or_else(|e| panic!("{what}: {e:?}"));
            assert!(!p.icrc_ok, "{what}: ICRC should be bad");
        }
        Counter::Malformed => {
            assert!(parsed.is_err(), "{what}: should not parse: {parsed:?}");
            // ... yet its ICRC (over the declared lengths) is right, so the link passes it to the engine.
            icrc::verify(&frame[14..]).unwrap_or_else(|e| panic!("{what}: ICRC {e:?}"));
        }
        _ => {
            let p = parsed.unwrap_or_else(|e| panic!("{what}: {e:?}"));
            assert!(p.icrc_ok, "{what}: ICRC should be good");
        }
    }
}

fn free_tcp_port(ip: &str) -> u16 {
    TcpListener::bind((ip, 0))
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port()
}

/// The value of `rocev2_<name>_total{side="server"}` from the server's metrics endpoint, if reachable.
fn scrape(addr: &str, name: &str) -> Option<u64> {
    let mut s = TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").ok()?;
    let mut body = String::new();
    let _ = s.read_to_string(&mut body);
    let key = format!("rocev2_{name}_total{{side=\"server\"}} ");
    body.lines()
        .find_map(|l| l.strip_prefix(&key))
        .and_then(|v| v.trim().parse().ok())
}

/// The QPN of the one QP (besides QP 1, the GSI) of the `rocev2` process `pid` whose endpoint is in `run_dir`, as
/// `rocev2 stat --json` reports it.
fn server_qpn(run_dir: &std::path::Path, pid: u32) -> u32 {
    let out = std::process::Command::new(common::bin())
        .args([
            "stat",
            "--json",
            "--interval",
            "0",
            "--pid",
            &pid.to_string(),
        ])
        .env("ROCEV2_RUN_DIR", run_dir)
        .output()
        .expect("run rocev2 stat");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "rocev2 stat: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_str(&text).expect("stat json");
    let qpns: Vec<u64> = v["runtimes"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|r| r["devices"].as_array().into_iter().flatten())
        .flat_map(|d| d["qps"].as_array().into_iter().flatten())
        .filter_map(|q| q["qpn"].as_u64())
        .filter(|&q| q != 1)
        .collect();
    assert_eq!(qpns.len(), 1, "the server's QPs: {text}");
    u32::try_from(qpns[0]).expect("24-bit QPN")
}

/// Runs `test` over `conn` between 127.0.`net`.1 (server) and .2 (client), attacks the server from .3 once
/// traffic flows, and checks the outcome.
fn attack_during(test: &str, conn: &str, net: u8, client_extra: &[&str]) {
    let srv_ip = format!("127.0.{net}.1");
    let cli_ip = format!("127.0.{net}.2");
    let att_ip = format!("127.0.{net}.3");
    let dir = scratch(&format!("malformed-{test}-{conn}"));
    let port = free_tcp_port(&srv_ip).to_string();
    let mport = free_tcp_port(&srv_ip);
    let maddr = format!("{srv_ip}:{mport}");
    // `env` gives the server a run directory of its own, where `rocev2 stat` finds it.
    let run_dir = dir.join("run");
    let mut srv_argv = vec![
        "env".to_owned(),
        format!("ROCEV2_RUN_DIR={}", run_dir.display()),
        common::bin().to_owned(),
    ];
    srv_argv.extend(strings(&[
        "perf",
        test,
        "--ip",
        &srv_ip,
        "-p",
        &port,
        "--json",
        "--stats",
        "--metrics",
        &maddr,
    ]));
    let mut server = Proc::spawn("server", &dir, &srv_argv);
    common::wait_socket(
        &mut server,
        "tcp",
        [127, 0, net, 1],
        port.parse().expect("port"),
        Duration::from_secs(20),
    );
    let mut cli_argv = vec![common::bin().to_owned()];
    cli_argv.extend(strings(&[
        "perf",
        test,
        &srv_ip,
        "-p",
        &port,
        "--ip",
        &cli_ip,
        "-c",
        conn,
        "--json",
        "--timeout",
        "20",
    ]));
    cli_argv.extend(strings(client_extra));
    let mut client = Proc::spawn("client", &dir, &cli_argv);

    // Attack once the server's QP is receiving the client's traffic.
    let t0 = Instant::now();
    while scrape(&maddr, "rcvd_pkts").unwrap_or(0) == 0 {
        assert!(
            server.try_wait().is_none() && client.try_wait().is_none(),
            "a side ended before traffic flowed\n{}\n{}",
            server.output_so_far(),
            client.output_so_far()
        );
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "no traffic at the server\n{}\n{}",
            server.output_so_far(),
            client.output_so_far()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let sock = UdpSocket::bind((att_ip.as_str(), 0)).expect("bind attacker");
    let forge = Forge {
        src: att_ip.parse().expect("ip"),
        dst: srv_ip.parse().expect("ip"),
        sport: sock.local_addr().expect("addr").port(),
    };
    let qpn = server_qpn(&run_dir, server.pid());
    let hostile = forge.hostile(qpn, conn == "UD");
    for (what, d, c) in &hostile {
        self_check(&forge, what, d, *c);
    }
    const ROUNDS: u64 = 3;
    let mut expected = std::collections::BTreeMap::new();
    for _ in 0..ROUNDS {
        for (what, d, c) in &hostile {
            let n = sock
                .send_to(d, (srv_ip.as_str(), ROCE_V2_PORT))
                .unwrap_or_else(|e| panic!("send {what}: {e}"));
            assert_eq!(n, d.len());
            *expected.entry(*c).or_insert(0u64) += 1;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    // The burst hit a server that was still serving.
    assert!(
        client.try_wait().is_none(),
        "the client finished before the burst was sent; lengthen its run\n{}",
        client.output_so_far()
    );

    let c = client.wait(Duration::from_secs(60));
    let s = server.wait(Duration::from_secs(30));
    assert!(c.status.success(), "client {c}\nserver {s}");
    assert!(s.status.success(), "server {s}\nclient {c}");
    let cj = c.json_lines();
    assert_eq!(cj.len(), 1, "{c}");
    assert_eq!(cj[0]["verified"], true, "{c}");
    assert_eq!(cj[0]["connection"], conn, "{c}");
    assert!(cj[0]["iterations"].as_u64().unwrap_or(0) > 0, "{c}");
    let sj = s.json_lines();
    assert_eq!(sj.len(), 1, "{s}");
    assert_eq!(sj[0]["verified"], true, "{s}");

    let engine = stats_section(&s.stderr, "engine counters (server):");
    let link = stats_section(&s.stderr, "udp link counters (server):");
    let mut report = String::new();
    for k in Counter::ALL {
        let want = expected.get(&k).copied().unwrap_or(0);
        let (sec, name) = k.name();
        let got = if sec == "udp" { &link } else { &engine }
            .get(name)
            .copied()
            .unwrap_or(0);
        if got != want {
            report.push_str(&format!("  {sec} {name}: counted {got}, sent {want}\n"));
        }
    }
    // The link verifies ICRCs, so the engine's own ICRC counter stays 0; no datagram had a foreign address family.
    for (m, name) in [(&engine, "rx_icrc_encapsulated"), (&link, "rx_bad_addr")] {
        if let Some(v) = m.get(name) {
            report.push_str(&format!("  {name}: {v}, expected 0\n"));
        }
    }
    assert!(
        report.is_empty(),
        "{test} over {conn}: hostile datagrams miscounted:\n{report}server stats:\n{}",
        s.stderr
    );
    eprintln!(
        "malformed: {test} {conn}: {} hostile datagrams counted exactly ({expected:?})",
        hostile.len() as u64 * ROUNDS
    );
}

#[test]
fn hostile_datagrams_during_rc_send_bw() {
    let _serial = serial();
    attack_during(
        "send-bw",
        "RC",
        211,
        &["-s", "3000", "-m", "1024", "-D", "3"],
    );
}

#[test]
fn hostile_datagrams_during_ud_send_lat() {
    let _serial = serial();
    attack_during(
        "send-lat",
        "UD",
        212,
        &["-s", "1024", "-m", "1024", "-D", "3"],
    );
}

#[test]
fn hostile_datagrams_during_rc_read_bw() {
    let _serial = serial();
    // The server is passive (its responder answers READs): the hostile frames meet the responder path only.
    attack_during(
        "read-bw",
        "RC",
        213,
        &["-s", "5000", "-m", "1024", "-D", "3"],
    );
}

/// A small deterministic generator (xorshift64*) for the flood below.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// The UDP payload (BTH .. ICRC) of a packet `src`:`sport` → `dst`:4791 with every extension header `opcode`
/// needs (filled with plausible values) and `payload`, the ICRC computed over the IPv4 header image the receiving
/// UDP link rebuilds (ID 0, DF; TTL, TOS and checksums are masked out of the ICRC). `None` for an opcode whose
/// layout roce-wire does not know and cannot emit.
#[allow(clippy::too_many_arguments)]
fn forged(
    src: Ipv4Addr,
    dst: Ipv4Addr,
    sport: u16,
    opcode: u8,
    dest_qp: u32,
    psn: u32,
    syndrome: u8,
    payload: &[u8],
) -> Option<Vec<u8>> {
    use roce_wire::{
        AethRepr, AethSyndrome, AtomicAckEthRepr, AtomicEthRepr, DethRepr, EtherType,
        EthernetAddress, EthernetRepr, ExtHeader, ExtRepr, IethRepr, ImmDtRepr, IpRepr, Msn,
        RethRepr,
    };
    let op = Opcode(opcode);
    let hs = op.ext_headers();
    let ext = ExtRepr {
        deth: hs.contains(ExtHeader::Deth).then_some(DethRepr {
            qkey: 0x1111_1111,
            src_qp: Qpn::new(0x11),
        }),
        feth: None,
        reth: hs.contains(ExtHeader::Reth).then_some(RethRepr {
            va: 0x7f00_0000_0000,
            rkey: 0x101,
            dma_len: payload.len() as u32,
        }),
        atomic_eth: hs.contains(ExtHeader::AtomicEth).then_some(AtomicEthRepr {
            va: 0x7f00_0000_0000,
            rkey: 0x101,
            swap_add: 1,
            compare: 0,
        }),
        aeth: hs.contains(ExtHeader::Aeth).then_some(AethRepr {
            syndrome: AethSyndrome::from_byte(syndrome),
            msn: Msn::new(1),
        }),
        atomic_ack_eth: hs
            .contains(ExtHeader::AtomicAckEth)
            .then_some(AtomicAckEthRepr { orig_value: 7 }),
        immdt: hs
            .contains(ExtHeader::ImmDt)
            .then_some(ImmDtRepr { imm_data: 1 }),
        ieth: hs
            .contains(ExtHeader::Ieth)
            .then_some(IethRepr { rkey: 0x101 }),
        cnp: None,
    };
    let payload = if op.is_known() && op.has_payload() {
        payload
    } else {
        &[]
    };
    let repr = RoceRepr {
        eth: EthernetRepr {
            src_addr: EthernetAddress([0; 6]),
            dst_addr: EthernetAddress([0; 6]),
            vlan: None,
            ethertype: EtherType::IPV4,
        },
        ip: IpRepr::Ipv4(Ipv4Repr {
            src_addr: src,
            dst_addr: dst,
            dscp: 0,
            ecn: Ecn::NotEct,
            ident: 0,
            dont_frag: true,
            ttl: 64,
            protocol: 17,
        }),
        udp: UdpRepr {
            src_port: sport,
            dst_port: ROCE_V2_PORT,
        },
        bth: BthRepr {
            opcode: op,
            solicited: false,
            mig_req: false,
            pad_count: ((4 - payload.len() % 4) % 4) as u8,
            pkey: 0xFFFF,
            fecn: false,
            becn: false,
            dest_qp: Qpn::new(dest_qp),
            ack_req: true,
            psn: Psn::new(psn & 0xFF_FFFF),
        },
        ext,
        payload_len: payload.len(),
    };
    let mut frame = vec![0u8; repr.buffer_len()];
    repr.emit(&mut frame, |b| b.copy_from_slice(payload)).ok()?;
    Some(frame[42..].to_vec())
}

/// `(QPN, PSN)` from a perftest-style "local address:" / "remote address:" line.
fn qp_line(text: &str, which: &str) -> Option<(u32, u32)> {
    let l = text.lines().find(|l| l.trim_start().starts_with(which))?;
    let field = |k: &str| {
        let i = l.find(k)? + k.len();
        let v = l[i..].split_whitespace().next()?;
        u32::from_str_radix(v.trim_start_matches("0x"), 16).ok()
    };
    Some((field("QPN ")?, field("PSN ")?))
}

/// Issue #10: a flood of forged packets that pass every address check — sent from the peers' own IP addresses to
/// the live QPs of a running `write-bw` (RC) — with random opcodes, PSNs ahead of everything the run will send,
/// PSNs behind it, and the PSN-wrap values 0, 0x7FFFFF, 0x800000, 0xFFFFFF (when the run does not cover them). The
/// requests make the server's responder NAK (sequence error) or re-ACK (duplicates) again and again; the responses
/// reach the client's requester as ghosts or duplicates. The run must still complete (it once ended in
/// IBV_WC_RETRY_EXC_ERR between two namespaces: ACKs beyond a send pointer rewound by those NAKs were dropped as
/// stale), the go-back-N retries the NAKs provoke must not re-send what the server already acknowledged, and the
/// counters must show where the flood went.
#[test]
fn spoofed_flood_during_rc_write_bw() {
    let _serial = serial();
    let net = 214u8;
    let srv_ip = format!("127.0.{net}.1");
    let cli_ip = format!("127.0.{net}.2");
    let (srv, cli): (Ipv4Addr, Ipv4Addr) = (srv_ip.parse().unwrap(), cli_ip.parse().unwrap());
    let dir = scratch("malformed-spoofed-flood");
    let port = free_tcp_port(&srv_ip).to_string();
    // 64 KiB messages at PMTU 4096: 16 PSNs each.
    const ITERS: u32 = 20000;
    const PSNS: u32 = ITERS * 16;
    let mut srv_argv = vec![common::bin().to_owned()];
    srv_argv.extend(strings(&[
        "perf",
        "write-bw",
        "--ip",
        &srv_ip,
        "-p",
        &port,
        "--perftest-compat",
        "--json",
        "--stats",
    ]));
    let mut server = Proc::spawn("server", &dir, &srv_argv);
    common::wait_socket(
        &mut server,
        "tcp",
        [127, 0, net, 1],
        port.parse().expect("port"),
        Duration::from_secs(20),
    );
    let mut cli_argv = vec![common::bin().to_owned()];
    cli_argv.extend(strings(&[
        "perf",
        "write-bw",
        &srv_ip,
        "-p",
        &port,
        "--ip",
        &cli_ip,
        "--perftest-compat",
        "-n",
        &ITERS.to_string(),
        "--json",
        "--stats",
        "--timeout",
        "20",
    ]));
    let mut client = Proc::spawn("client", &dir, &cli_argv);
    // The QPNs and initial PSNs of both sides, from the client's perftest-style report.
    let t0 = Instant::now();
    let (mine, theirs) = loop {
        let out = client.output_so_far();
        if let (Some(m), Some(r)) = (
            qp_line(&out, "local address:"),
            qp_line(&out, "remote address:"),
        ) {
            break (m, r);
        }
        assert!(
            client.try_wait().is_none() && t0.elapsed() < Duration::from_secs(20),
            "no QP report from the client\n{out}\n{}",
            server.output_so_far()
        );
        std::thread::sleep(Duration::from_millis(5));
    };
    let ((cli_qpn, cli_psn), (srv_qpn, srv_psn)) = (mine, theirs);
    // As the client (to the server's responder) and as the server (to the client's requester and responder).
    let as_cli = UdpSocket::bind((cli_ip.as_str(), 0)).expect("bind as client");
    let as_srv = UdpSocket::bind((srv_ip.as_str(), 0)).expect("bind as server");
    let (p_cli, p_srv) = (
        as_cli.local_addr().unwrap().port(),
        as_srv.local_addr().unwrap().port(),
    );
    let m24 = |x: u64| (x & 0xFF_FFFF) as u32;
    // PSNs the run covers (client's requests) — never forged, so no forged packet can be in sequence.
    let covers = |psn: u32, base: u32, len: u32| (psn.wrapping_sub(base) & 0xFF_FFFF) <= len + 64;
    let mut rng = Rng(0x5eed_f00d ^ u64::from(cli_psn));
    let requests = [
        0x00u8, 0x01, 0x02, 0x04, 0x06, 0x07, 0x08, 0x0A, 0x0B, 0x0C, 0x13, 0x14, 0x17,
    ];
    let responses = [0x0Du8, 0x0E, 0x0F, 0x10, 0x11, 0x12];
    let syndromes = [0x1Fu8, 0x60, 0x61, 0x62, 0x63, 0x2E, 0x00];
    let wrap = [0u32, 0x7F_FFFF, 0x80_0000, 0xFF_FFFF];
    let (mut to_server, mut ghosts) = (0u64, 0u64);
    let payload = [0xA5u8; 64];
    while client.try_wait().is_none() && t0.elapsed() < Duration::from_secs(60) {
        for _ in 0..32 {
            // Where in PSN space: ahead of the whole run, behind it, or a wrap value.
            let region = rng.below(8);
            let ahead = |rng: &mut Rng, base: u32, len: u32| {
                m24(u64::from(base) + u64::from(len) + 1000 + rng.below(1 << 22))
            };
            let behind = |rng: &mut Rng, base: u32| {
                m24(u64::from(base) + (1 << 24) - 1 - rng.below(1 << 22))
            };
            match rng.below(3) {
                0 => {
                    // Requests to the server's responder (expects the client's PSNs).
                    let psn = match region {
                        0..=3 => ahead(&mut rng, cli_psn, PSNS),
                        4..=6 => behind(&mut rng, cli_psn),
                        _ => wrap[rng.below(4) as usize],
                    };
                    if covers(psn, cli_psn, PSNS) {
                        continue;
                    }
                    let op = if rng.below(8) == 0 {
                        rng.below(256) as u8
                    } else {
                        requests[rng.below(requests.len() as u64) as usize]
                    };
                    let Some(d) = forged(cli, srv, p_cli, op, srv_qpn, psn, 0x1F, &payload) else {
                        continue;
                    };
                    let _ = as_cli.send_to(&d, (srv_ip.as_str(), ROCE_V2_PORT));
                    to_server += 1;
                }
                1 => {
                    // Responses to the client's requester, ahead of anything it will send (ghosts) or behind it.
                    let ghost = region <= 4;
                    let psn = if ghost {
                        ahead(&mut rng, cli_psn, PSNS)
                    } else {
                        behind(&mut rng, cli_psn)
                    };
                    let op = responses[rng.below(responses.len() as u64) as usize];
                    let syn = syndromes[rng.below(syndromes.len() as u64) as usize];
                    let Some(d) = forged(srv, cli, p_srv, op, cli_qpn, psn, syn, &payload) else {
                        continue;
                    };
                    let _ = as_srv.send_to(&d, (cli_ip.as_str(), ROCE_V2_PORT));
                    if ghost {
                        ghosts += 1;
                    }
                }
                _ => {
                    // Requests to the client's responder (expects the server's PSNs; the server sends none).
                    let psn = match region {
                        0..=5 => ahead(&mut rng, srv_psn, 0),
                        _ => behind(&mut rng, srv_psn),
                    };
                    let op = requests[rng.below(requests.len() as u64) as usize];
                    if let Some(d) = forged(srv, cli, p_srv, op, cli_qpn, psn, 0x1F, &payload) {
                        let _ = as_srv.send_to(&d, (cli_ip.as_str(), ROCE_V2_PORT));
                    }
                }
            }
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let c = client.wait(Duration::from_secs(60));
    let s = server.wait(Duration::from_secs(30));
    let ce = stats_section(&c.stderr, "engine counters (client):");
    let se = stats_section(&s.stderr, "engine counters (server):");
    let get = |m: &std::collections::BTreeMap<String, u64>, k: &str| m.get(k).copied().unwrap_or(0);
    let summary = format!(
        "flood: {to_server} requests to the server, {ghosts} ghost responses to the client; client \
         local_ack_timeout_err {} completer_retry_err {} retransmitted_pkts {} drop_stale_response {}; server \
         out_of_seq_request {} duplicate_request {} drop_bad_opcode {}",
        get(&ce, "local_ack_timeout_err"),
        get(&ce, "completer_retry_err"),
        get(&ce, "retransmitted_pkts"),
        get(&ce, "drop_stale_response"),
        get(&se, "out_of_seq_request"),
        get(&se, "duplicate_request"),
        get(&se, "drop_bad_opcode"),
    );
    assert!(c.status.success(), "client {c}\nserver {s}\n{summary}");
    assert!(s.status.success(), "server {s}\nclient {c}\n{summary}");
    let cj = c.json_lines();
    assert_eq!(cj.len(), 1, "{c}");
    assert_eq!(cj[0]["iterations"].as_u64(), Some(u64::from(ITERS)), "{c}");
    assert!(
        to_server > 1000 && ghosts > 300,
        "the flood was too small: {summary}"
    );
    // Every ghost response was dropped and counted (the server's own sequence NAKs can add more).
    assert!(get(&ce, "drop_stale_response") >= ghosts, "{summary}");
    assert!(
        get(&se, "out_of_seq_request") > 0 && get(&se, "duplicate_request") > 0,
        "{summary}"
    );
    assert_eq!(get(&ce, "retry_exceeded_err"), 0, "{summary}");
    // Each provoked sequence NAK makes the client go back to the server's ePSN; the ACKs for what the server
    // already has then let it catch up. Dropping ACKs beyond the rewound send pointer (the defect) made it re-send
    // about half a window per retry instead: measured 52–71 packets per retry before the fix, 3–9 after.
    let (retries, resent) = (
        get(&ce, "completer_retry_err"),
        get(&ce, "retransmitted_pkts"),
    );
    assert!(
        resent <= 24 * retries.max(1),
        "go-back-N re-sent {resent} packets for {retries} retries: acknowledged packets were sent again
{summary}"
    );
    eprintln!("malformed: {summary}");
}
