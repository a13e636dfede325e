//! A whole connection life of two CMs, captured as RoCE v2 frames (UD SEND
//! ONLY to QP1, DETH with the GSI Q_Key, the MAD, ICRC) and checked by the
//! independent checker `testdata/tools/check_pcap.py` and by Wireshark's
//! dissector (`tshark`): every frame valid, every CM message named, no
//! malformed packet, no expert warning. Each tool is skipped with a printed
//! reason when it is not installed.

use core::net::Ipv4Addr;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use roce_cm::testing::{ChannelConfig, Pair, Side};
use roce_cm::*;
use roce_proto::time::Instant;
use roce_wire::cm::{PathRepr, PortSpace, transport_type};
use roce_wire::mad::{self, MAD_LEN};
use roce_wire::*;

const SID: u64 = cm::service_id(PortSpace::Tcp, 7471);
const IP_A: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
const IP_B: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 2);

fn frame(from: Side, psn: u32, mad_bytes: &[u8; MAD_LEN]) -> Vec<u8> {
    let (src, dst) = match from {
        Side::A => (IP_A, IP_B),
        Side::B => (IP_B, IP_A),
    };
    let (bth, ext) = mad::gsi_ud_repr(mad::GSI_QPN, mad::GSI_QPN, mad::DEFAULT_PKEY, Psn::new(psn));
    let repr = RoceRepr {
        eth: EthernetRepr {
            src_addr: EthernetAddress([2, 0, 0, 0, 0, src.octets()[3]]),
            dst_addr: EthernetAddress([2, 0, 0, 0, 0, dst.octets()[3]]),
            vlan: None,
            ethertype: EtherType::IPV4,
        },
        ip: IpRepr::Ipv4(Ipv4Repr {
            src_addr: src,
            dst_addr: dst,
            dscp: 0,
            ecn: Ecn::NotEct,
            ident: psn as u16,
            dont_frag: true,
            ttl: 64,
            protocol: 17,
        }),
        udp: UdpRepr {
            src_port: udp_sport(mad::GSI_QPN, mad::GSI_QPN, 0),
            dst_port: ROCE_V2_PORT,
        },
        bth,
        ext,
        payload_len: MAD_LEN,
    };
    let mut f = vec![0u8; repr.buffer_len()];
    let n = repr.emit_with_payload(&mut f, mad_bytes).unwrap();
    f.truncate(n);
    f
}

fn write_pcap(path: &Path, frames: &[(Instant, Vec<u8>)]) {
    let mut f = std::fs::File::create(path).unwrap();
    let mut hdr = Vec::new();
    hdr.extend_from_slice(&0xa1b2_3c4du32.to_le_bytes()); // nanosecond pcap
    hdr.extend_from_slice(&2u16.to_le_bytes());
    hdr.extend_from_slice(&4u16.to_le_bytes());
    hdr.extend_from_slice(&[0; 8]);
    hdr.extend_from_slice(&65535u32.to_le_bytes());
    hdr.extend_from_slice(&1u32.to_le_bytes());
    f.write_all(&hdr).unwrap();
    for (t, fr) in frames {
        let ns = t.as_nanos();
        let mut rec = Vec::new();
        rec.extend_from_slice(&((ns / 1_000_000_000) as u32).to_le_bytes());
        rec.extend_from_slice(&((ns % 1_000_000_000) as u32).to_le_bytes());
        rec.extend_from_slice(&(fr.len() as u32).to_le_bytes());
        rec.extend_from_slice(&(fr.len() as u32).to_le_bytes());
        f.write_all(&rec).unwrap();
        f.write_all(fr).unwrap();
    }
}

/// The repository's test data (`testdata/`, provenance in its README).
fn testdata() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata")
}

#[test]
fn connection_life_capture_is_valid_roce_and_dissects_cleanly() {
    let (pa, pb) = (
        Peer::gsi(Gid::from_ipv4(IP_A)),
        Peer::gsi(Gid::from_ipv4(IP_B)),
    );
    let cfg = |seed, guid| CmConfig {
        cm_response_timeout: 8,
        packet_life_time: 6,
        ack_delay: 6,
        local_ca_guid: guid,
        seed,
        ..CmConfig::default()
    };
    let mut p = Pair::new(
        Cm::new(cfg(1, 0x0200_00ff_fe00_0001)),
        pa,
        Cm::new(cfg(2, 0x0200_00ff_fe00_0002)),
        pb,
        ChannelConfig::default(),
    );
    p.b.listen(SID).unwrap();
    let mut private = [0u8; 56 + 36];
    cm::CmaHdr {
        src_port: 40000,
        src_addr: IP_A.into(),
        dst_addr: IP_B.into(),
    }
    .emit(&mut private)
    .unwrap();
    let params = ConnectParams {
        service_id: SID,
        transport: transport_type::RC,
        local_qpn: Qpn::new(0x11),
        starting_psn: Psn::new(0x1234),
        responder_resources: 16,
        initiator_depth: 16,
        retry_count: 7,
        rnr_retry_count: 7,
        path_mtu: 3,
        srq: false,
        packet_life_time: None,
        path: PathRepr {
            local_lid: 0xffff,
            remote_lid: 0xffff,
            local_gid: pa.gid,
            remote_gid: pb.gid,
            hop_limit: 64,
            ..PathRepr::default()
        },
        private_data: &private,
    };
    let (now, b_peer) = (p.now, p.b_peer);
    p.a.connect(now, b_peer, &params).unwrap();
    // A connection life in which B first answers with an MRA; then a REQ
    // nobody listens for (REJ) and a SIDR exchange, so every message appears.
    p.run(Instant::from_millis(1000), |side, cm, now, ev| {
        match (side, ev) {
            (Side::B, Event::ConnectRequest { id, .. }) => {
                cm.mra(now, *id, 10, b"").unwrap();
                let ap = AcceptParams {
                    local_qpn: Qpn::new(0x22),
                    starting_psn: Psn::new(0x4321),
                    responder_resources: 16,
                    initiator_depth: 16,
                    rnr_retry_count: 7,
                    srq: false,
                    private_data: b"rep",
                };
                cm.accept(now, *id, &ap).unwrap();
            }
            (Side::A, Event::Reply { id, .. }) => cm.rtu(now, *id, b"").unwrap(),
            (Side::A, Event::Established { id }) => cm.disconnect(now, *id, b"").unwrap(),
            (
                Side::B,
                Event::Disconnected {
                    id,
                    cause: Disconnect::Request(_),
                },
            ) => cm.disconnect(now, *id, b"").unwrap(),
            _ => {}
        }
    });
    // A second attempt to an unknown service: REJ; and a SIDR exchange.
    let now = p.now;
    let mut bad = params;
    bad.service_id = SID + 1;
    p.a.connect(now, b_peer, &bad).unwrap();
    p.b.listen(cm::service_id(PortSpace::Udp, 7174)).unwrap();
    p.a.sidr_request(now, b_peer, cm::service_id(PortSpace::Udp, 7174), b"")
        .unwrap();
    p.run(Instant::from_millis(2000), |side, cm, now, ev| {
        if let (Side::B, Event::SidrRequest { id, .. }) = (side, ev) {
            cm.sidr_reply(
                now,
                *id,
                cm::sidr_status::SUCCESS,
                Qpn::new(0x33),
                0x1111,
                b"",
            )
            .unwrap();
        }
    });

    let frames: Vec<(Instant, Vec<u8>)> = p
        .capture
        .iter()
        .enumerate()
        .map(|(i, (t, side, m))| (*t, frame(*side, i as u32, m)))
        .collect();
    let names: Vec<&str> = p
        .capture
        .iter()
        .map(|(_, _, m)| CmMad::parse(m).unwrap().message.name())
        .collect();
    assert_eq!(
        names,
        [
            "REQ", "MRA", "REP", "RTU", "DREQ", "DREP", "REQ", "SIDR_REQ", "REJ", "SIDR_REP"
        ]
    );
    let dir = std::env::temp_dir().join(format!("roce-cm-capture-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let pcap = dir.join("cm.pcap");
    write_pcap(&pcap, &frames);

    let checker = testdata().join("tools/check_pcap.py");
    match Command::new("python3").arg(&checker).arg(&pcap).output() {
        Ok(out) if checker.exists() => {
            let text = String::from_utf8_lossy(&out.stdout);
            assert!(out.status.success(), "check_pcap.py failed:\n{text}");
            assert!(text.contains("10 passed, 0 failed"), "{text}");
        }
        _ => eprintln!(
            "SKIPPED check_pcap.py: python3 or {} missing",
            checker.display()
        ),
    }

    match Command::new("tshark")
        .arg("-n")
        .arg("-r")
        .arg(&pcap)
        .arg("-V")
        .output()
    {
        Ok(out) => {
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            assert!(
                out.status.success(),
                "tshark: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(!text.contains("Malformed"), "{text}");
            assert!(!text.contains("Expert Info"), "{text}");
            for n in [
                "ConnectRequest",
                "MsgRcptAck",
                "ConnectReply",
                "ReadyToUse",
                "DisconnectRequest",
                "DisconnectReply",
                "ConnectReject",
                "ServiceIDResReq",
                "ServiceIDResReqResp",
            ] {
                assert!(text.contains(n), "tshark did not name {n}");
            }
            // The rdma_cm address header is recognised in the REQ.
            assert!(text.contains("IP CM IP Version: 0x4"), "no cma_hdr");
        }
        Err(e) => eprintln!("SKIPPED tshark: {e}"),
    }
    if std::env::var_os("ROCE_KEEP_PCAP").is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    } else {
        eprintln!("capture kept at {}", pcap.display());
    }
}
