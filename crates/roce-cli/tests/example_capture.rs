//! `examples/capture.pcap`, the README's demo capture, is produced by roce-wire's
//! emitter (`RoceRepr::emit`) here, never copied from `testdata/`.
//!
//! * `ROCEV2_WRITE_EXAMPLE=1 cargo test -p roce-cli --test example_capture` rewrites it.
//! * Without the variable the test fails if the committed file differs from what the
//!   emitter produces now, then checks the file with `rocev2 decode --json` (exit 0,
//!   every extension header, VLAN and IPv6 present) and with the independent checker
//!   `testdata/tools/check_pcap.py`.
//!
//! The capture is one small RC conversation between QP 0x11 (192.0.2.1) and QP 0x12
//! (192.0.2.2) at PMTU 256 — SEND FIRST/MIDDLE/LAST + ACK, RDMA WRITE ONLY with
//! immediate, RDMA READ request and responses, COMPARE & SWAP and its atomic ACK, SEND
//! ONLY with invalidate, an RNR NAK — plus a UD SEND over IPv6, a CNP, and one SEND on an
//! 802.1Q-tagged link.

mod common;

use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use pcap_file::DataLink;
use pcap_file::pcap::{PcapHeader, PcapPacket, PcapWriter};
use roce_wire::{
    AethRepr, AethSyndrome, AtomicAckEthRepr, AtomicEthRepr, BthRepr, CnpRepr, DethRepr, Ecn,
    EtherType, EthernetAddress, EthernetRepr, ExtRepr, IethRepr, ImmDtRepr, IpRepr, Ipv4Repr,
    Ipv6Repr, Msn, Opcode, Psn, Qpn, ROCE_V2_PORT, RethRepr, RoceRepr, UdpRepr, VlanTag, ipv4,
    udp_sport,
};
use serde_json::Value;

const PMTU: usize = 256;
const REQ_QP: u32 = 0x11;
const RSP_QP: u32 = 0x12;

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn example_path() -> PathBuf {
    workspace_root().join("examples/capture.pcap")
}

/// Direction of a packet: requester → responder or back.
#[derive(Clone, Copy)]
enum Dir {
    ToResponder,
    ToRequester,
}

struct Builder {
    frames: Vec<Vec<u8>>,
    ident: u16,
}

impl Builder {
    fn base(&mut self, dir: Dir, opcode: Opcode, psn: u32, payload_len: usize) -> RoceRepr {
        let (a, b) = (Ipv4Addr::new(192, 0, 2, 1), Ipv4Addr::new(192, 0, 2, 2));
        let (ma, mb) = ([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2]);
        let (src, dst, smac, dmac, dest_qp) = match dir {
            Dir::ToResponder => (a, b, ma, mb, RSP_QP),
            Dir::ToRequester => (b, a, mb, ma, REQ_QP),
        };
        self.ident = self.ident.wrapping_add(1);
        RoceRepr {
            eth: EthernetRepr {
                src_addr: EthernetAddress(smac),
                dst_addr: EthernetAddress(dmac),
                vlan: None,
                ethertype: EtherType::IPV4,
            },
            ip: IpRepr::Ipv4(Ipv4Repr {
                src_addr: src,
                dst_addr: dst,
                dscp: 26,
                ecn: Ecn::Ect0,
                ident: self.ident,
                dont_frag: true,
                ttl: 64,
                protocol: ipv4::PROTOCOL_UDP,
            }),
            udp: UdpRepr {
                src_port: udp_sport(Qpn::new(REQ_QP), Qpn::new(RSP_QP), 0),
                dst_port: ROCE_V2_PORT,
            },
            bth: BthRepr {
                opcode,
                solicited: false,
                mig_req: false,
                pad_count: ((4 - payload_len % 4) % 4) as u8,
                pkey: 0xffff,
                fecn: false,
                becn: false,
                dest_qp: Qpn::new(dest_qp),
                ack_req: false,
                psn: Psn::new(psn),
            },
            ext: ExtRepr::NONE,
            payload_len,
        }
    }

    fn push(&mut self, repr: RoceRepr) {
        let mut frame = vec![0u8; repr.buffer_len()];
        let n = self.frames.len();
        repr.emit(&mut frame, |p| {
            for (i, b) in p.iter_mut().enumerate() {
                *b = (i + n) as u8;
            }
        })
        .unwrap_or_else(|e| panic!("emit frame {n}: {e:?} ({repr:?})"));
        self.frames.push(frame);
    }
}

fn ack(b: &mut Builder, psn: u32, syndrome: u8, msn: u32) -> RoceRepr {
    let mut r = b.base(Dir::ToRequester, Opcode::RC_ACKNOWLEDGE, psn, 0);
    r.ext.aeth = Some(AethRepr {
        syndrome: AethSyndrome::from_byte(syndrome),
        msn: Msn::new(msn),
    });
    r
}

/// The frames of the demo capture, in order.
fn frames() -> Vec<Vec<u8>> {
    let mut b = Builder {
        frames: Vec::new(),
        ident: 0x4000,
    };
    // SEND of 600 bytes at PMTU 256: FIRST, MIDDLE, LAST (AckReq on the last).
    let r = b.base(Dir::ToResponder, Opcode::RC_SEND_FIRST, 1000, PMTU);
    b.push(r);
    let r = b.base(Dir::ToResponder, Opcode::RC_SEND_MIDDLE, 1001, PMTU);
    b.push(r);
    let mut r = b.base(Dir::ToResponder, Opcode::RC_SEND_LAST, 1002, 600 - 2 * PMTU);
    r.bth.ack_req = true;
    b.push(r);
    let r = ack(&mut b, 1002, 0x1f, 1);
    b.push(r);
    // RDMA WRITE ONLY with immediate, 13 bytes (PadCnt 3), solicited.
    let mut r = b.base(
        Dir::ToResponder,
        Opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE,
        1003,
        13,
    );
    r.bth.ack_req = true;
    r.bth.solicited = true;
    r.ext.reth = Some(RethRepr {
        va: 0x7f00_0000_1000,
        rkey: 0x1234_abcd,
        dma_len: 13,
    });
    r.ext.immdt = Some(ImmDtRepr {
        imm_data: 0xcafe_f00d,
    });
    b.push(r);
    let r = ack(&mut b, 1003, 0x1f, 2);
    b.push(r);
    // RDMA READ of 300 bytes: request (consumes PSNs 1004-1005), two responses.
    let mut r = b.base(Dir::ToResponder, Opcode::RC_RDMA_READ_REQUEST, 1004, 0);
    r.bth.ack_req = true;
    r.ext.reth = Some(RethRepr {
        va: 0x7f00_0000_2000,
        rkey: 0x1234_abcd,
        dma_len: 300,
    });
    b.push(r);
    let mut r = b.base(
        Dir::ToRequester,
        Opcode::RC_RDMA_READ_RESPONSE_FIRST,
        1004,
        PMTU,
    );
    r.ext.aeth = Some(AethRepr {
        syndrome: AethSyndrome::from_byte(0x1f),
        msn: Msn::new(3),
    });
    b.push(r);
    let mut r = b.base(
        Dir::ToRequester,
        Opcode::RC_RDMA_READ_RESPONSE_LAST,
        1005,
        300 - PMTU,
    );
    r.ext.aeth = Some(AethRepr {
        syndrome: AethSyndrome::from_byte(0x1f),
        msn: Msn::new(3),
    });
    b.push(r);
    // COMPARE & SWAP and its atomic acknowledge.
    let mut r = b.base(Dir::ToResponder, Opcode::RC_COMPARE_SWAP, 1006, 0);
    r.bth.ack_req = true;
    r.ext.atomic_eth = Some(AtomicEthRepr {
        va: 0x7f00_0000_3000,
        rkey: 0x1234_abcd,
        swap_add: 0x1111_1111_1111_1111,
        compare: 0x2222_2222_2222_2222,
    });
    b.push(r);
    let mut r = b.base(Dir::ToRequester, Opcode::RC_ATOMIC_ACKNOWLEDGE, 1006, 0);
    r.ext.aeth = Some(AethRepr {
        syndrome: AethSyndrome::from_byte(0x1f),
        msn: Msn::new(4),
    });
    r.ext.atomic_ack_eth = Some(AtomicAckEthRepr {
        orig_value: 0x2222_2222_2222_2222,
    });
    b.push(r);
    // SEND ONLY with invalidate, answered by an RNR NAK (timer code 12), then retried.
    for psn_try in 0..2 {
        let mut r = b.base(
            Dir::ToResponder,
            Opcode::RC_SEND_ONLY_WITH_INVALIDATE,
            1007,
            32,
        );
        r.bth.ack_req = true;
        r.ext.ieth = Some(IethRepr { rkey: 0x0000_5a5a });
        b.push(r);
        let r = if psn_try == 0 {
            ack(&mut b, 1007, 0x2c, 4)
        } else {
            ack(&mut b, 1007, 0x1f, 5)
        };
        b.push(r);
    }
    // UD SEND ONLY over IPv6 with DETH.
    let mut r = b.base(Dir::ToResponder, Opcode::UD_SEND_ONLY, 0x10, 64);
    r.eth.ethertype = EtherType::IPV6;
    r.ip = IpRepr::Ipv6(Ipv6Repr {
        src_addr: Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1),
        dst_addr: Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 2),
        dscp: 26,
        ecn: Ecn::Ect0,
        flow_label: 0,
        next_header: ipv4::PROTOCOL_UDP,
        hop_limit: 64,
    });
    r.udp.src_port = udp_sport(Qpn::new(0x123), Qpn::new(0x456), 0);
    r.bth.dest_qp = Qpn::new(0x456);
    r.ext.deth = Some(DethRepr {
        qkey: 0x1111_1111,
        src_qp: Qpn::new(0x123),
    });
    b.push(r);
    // A CE-marked SEND and the CNP the receiver answers with (ROCEV2.md §6).
    let mut r = b.base(Dir::ToResponder, Opcode::RC_SEND_ONLY, 1008, 8);
    if let IpRepr::Ipv4(ip) = &mut r.ip {
        ip.ecn = Ecn::Ce;
    }
    r.bth.ack_req = true;
    b.push(r);
    let mut r = b.base(Dir::ToRequester, Opcode::CNP, 0, 0);
    if let IpRepr::Ipv4(ip) = &mut r.ip {
        ip.dscp = 48;
        ip.ecn = Ecn::NotEct;
    }
    r.bth.becn = true;
    r.ext.cnp = Some(CnpRepr);
    b.push(r);
    // The same kind of SEND on an 802.1Q-tagged link (VLAN 100, priority 3).
    let mut r = b.base(Dir::ToResponder, Opcode::RC_SEND_ONLY, 1009, 4);
    r.bth.ack_req = true;
    r.eth.vlan = Some(VlanTag {
        pcp: 3,
        dei: false,
        vid: 100,
    });
    b.push(r);
    b.frames
}

fn pcap_bytes(frames: &[Vec<u8>]) -> Vec<u8> {
    let header = PcapHeader {
        datalink: DataLink::ETHERNET,
        ..Default::default()
    };
    let mut w = PcapWriter::with_header(Vec::new(), header).expect("pcap header");
    // 1.7e9 s (2023-11-14) + 125 µs per packet: fixed, so the file is reproducible.
    for (i, f) in frames.iter().enumerate() {
        let ts = Duration::from_secs(1_700_000_000) + Duration::from_micros(125 * i as u64);
        w.write_packet(&PcapPacket::new(ts, f.len() as u32, f))
            .expect("write packet");
    }
    w.into_writer()
}

#[test]
fn example_capture_is_current() {
    let bytes = pcap_bytes(&frames());
    let path = example_path();
    if std::env::var_os("ROCEV2_WRITE_EXAMPLE").is_some() {
        std::fs::create_dir_all(path.parent().expect("examples dir")).expect("mkdir");
        std::fs::write(&path, &bytes).expect("write example capture");
    }
    let committed = std::fs::read(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; regenerate with ROCEV2_WRITE_EXAMPLE=1 cargo test -p roce-cli --test example_capture",
            path.display()
        )
    });
    assert!(
        committed == bytes,
        "{} is stale; regenerate with ROCEV2_WRITE_EXAMPLE=1 cargo test -p roce-cli --test example_capture",
        path.display()
    );
}

#[test]
fn example_capture_decodes_cleanly() {
    let want = frames().len();
    let out = common::output_within(
        Command::new(env!("CARGO_BIN_EXE_rocev2"))
            .args(["decode", "--json"])
            .arg(example_path()),
        common::SHORT,
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let objs: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON line"))
        .collect();
    assert_eq!(objs.len(), want);
    assert!(objs.iter().all(|o| o["icrc_ok"] == Value::Bool(true)));
    let find = |name: &str| {
        objs.iter()
            .find(|o| o["opcode_name"] == name)
            .unwrap_or_else(|| panic!("no {name} packet"))
    };
    let ack = find("RC_ATOMIC_ACKNOWLEDGE");
    assert_eq!(
        ack["atomic_ack_eth"]["orig"].as_u64(),
        Some(0x2222_2222_2222_2222)
    );
    assert_eq!(ack["aeth"]["msn"].as_u64(), Some(4));
    let inv = find("RC_SEND_ONLY_WITH_INVALIDATE");
    assert_eq!(inv["ieth"].as_u64(), Some(0x5a5a));
    let imm = find("RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE");
    assert_eq!(imm["immdt"].as_u64(), Some(0xcafe_f00d));
    assert_eq!(imm["pad"].as_u64(), Some(3));
    assert_eq!(imm["se"], Value::Bool(true));
    let ud = find("UD_SEND_ONLY");
    assert_eq!(ud["ip_version"].as_u64(), Some(6));
    assert_eq!(ud["src_ip"].as_str(), Some("2001:db8::1"));
    assert_eq!(ud["deth"]["src_qp"].as_u64(), Some(0x123));
    let cnp = find("CNP");
    assert_eq!(cnp["becn"], Value::Bool(true));
    let tagged: Vec<&Value> = objs.iter().filter(|o| o.get("vlan").is_some()).collect();
    assert_eq!(tagged.len(), 1);
    assert_eq!(tagged[0]["vlan"]["vid"].as_u64(), Some(100));
    assert_eq!(tagged[0]["vlan"]["pcp"].as_u64(), Some(3));
    assert_eq!(
        objs.iter().filter(|o| o["ecn"].as_u64() == Some(3)).count(),
        1,
        "one CE-marked packet"
    );
}

#[test]
fn example_capture_passes_independent_checker() {
    let out = Command::new("python3")
        .arg(workspace_root().join("testdata/tools/check_pcap.py"))
        // Not `--strict`: it rejects UDP checksum 0 over IPv6, which rxe and our emitter
        // send (ROCEV2.md §1.4).
        .arg("--pmtu")
        .arg(PMTU.to_string())
        .arg(example_path())
        .output()
        .expect("python3 runs check_pcap.py");
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    let want = format!("{} passed, 0 failed", frames().len());
    assert!(text.lines().any(|l| l == want), "{text}");
}
