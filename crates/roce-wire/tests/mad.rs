//! CM MADs: every message round-trips (parse ∘ emit = id on reprs built from
//! random bytes), every truncation is an error and never a panic, arbitrary
//! bytes never panic, and — when `tshark` is installed — Wireshark dissects a
//! capture of every message as a RoCE v2 UD datagram to QP1 with no malformed
//! packet and no expert warning.

use core::net::{IpAddr, Ipv4Addr};
use std::io::Write;
use std::process::Command;

use proptest::prelude::*;
use roce_wire::cm::{self, CmaHdr, PortSpace, attr};
use roce_wire::mad::{self, DATA_LEN, MAD_LEN, MadHeaderRepr};
use roce_wire::*;

const ATTRS: [u16; 9] = [
    attr::REQ,
    attr::MRA,
    attr::REJ,
    attr::REP,
    attr::RTU,
    attr::DREQ,
    attr::DREP,
    attr::SIDR_REQ,
    attr::SIDR_REP,
];

/// Random data bytes made acceptable to `attr`'s parser (the two length
/// fields in range).
fn fix_lengths(attr_id: u16, d: &mut [u8]) {
    match attr_id {
        attr::REJ => d[9] = (d[9] % 73) << 1 | (d[9] & 1),
        attr::SIDR_REP => d[5] %= 73,
        _ => {}
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn every_message_round_trips(
        which in 0usize..9,
        data in proptest::collection::vec(any::<u8>(), DATA_LEN),
        tid in any::<u64>(),
        attr_mod in any::<u32>(),
    ) {
        let attr_id = ATTRS[which];
        let mut data = data;
        fix_lengths(attr_id, &mut data);
        let msg = CmMessage::parse(attr_id, &data).unwrap();
        prop_assert_eq!(msg.attr_id(), attr_id);
        let m = CmMad::new(tid, attr_mod, msg);
        let mut buf = [0u8; MAD_LEN + 8];
        prop_assert_eq!(m.emit(&mut buf).unwrap(), MAD_LEN);
        let back = CmMad::parse(&buf[..MAD_LEN]).unwrap();
        prop_assert_eq!(back, m);
        // Emitting again gives the same bytes (reserved bits stay 0).
        let mut again = [0u8; MAD_LEN];
        back.emit(&mut again).unwrap();
        prop_assert_eq!(&again[..], &buf[..MAD_LEN]);
        // The emitted data differs from the random input only in reserved bits:
        // every bit the emitter set was set in the input.
        for (o, i) in buf[mad::HEADER_LEN..MAD_LEN].iter().zip(&data) {
            prop_assert_eq!(o & !i, 0);
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
        let _ = CmMad::parse(&bytes);
        let _ = CmaHdr::parse(&bytes);
        for a in ATTRS {
            let _ = CmMessage::parse(a, &bytes);
        }
        if let Ok(m) = Mad::new_checked(&bytes[..]) {
            let _ = MadHeaderRepr::parse(&m);
        }
    }
}

#[test]
fn truncation_at_every_length_is_an_error() {
    for a in ATTRS {
        let mut m = [0u8; MAD_LEN];
        let msg = CmMessage::parse(a, &[0u8; DATA_LEN]).unwrap();
        CmMad::new(7, 0, msg).emit(&mut m).unwrap();
        assert!(CmMad::parse(&m).is_ok());
        for n in 0..MAD_LEN {
            assert_eq!(
                CmMad::parse(&m[..n]),
                Err(Error::Truncated),
                "attr {a:#x} len {n}"
            );
        }
        for n in 0..DATA_LEN {
            assert_eq!(
                CmMessage::parse(a, &m[mad::HEADER_LEN..mad::HEADER_LEN + n]),
                Err(Error::Truncated),
                "attr {a:#x} data len {n}"
            );
        }
        let mut short = [0u8; MAD_LEN - 1];
        assert_eq!(
            CmMad::new(7, 0, msg).emit(&mut short),
            Err(Error::Truncated)
        );
    }
}

/// One MAD of every message type with plausible contents (an rdma_cm REQ with
/// its address header, as a Linux active side sends it).
fn sample_mads() -> Vec<CmMad> {
    let gid_a = Gid::from_ipv4(Ipv4Addr::new(198, 18, 0, 1));
    let gid_b = Gid::from_ipv4(Ipv4Addr::new(198, 18, 0, 2));
    let mut req = cm::ReqRepr {
        local_comm_id: 0x1111_2222,
        service_id: cm::service_id(PortSpace::Tcp, 7174),
        local_ca_guid: 0x0200_00ff_fe00_0001,
        local_qpn: Qpn::new(0x11),
        responder_resources: 16,
        initiator_depth: 16,
        remote_cm_response_timeout: 20,
        transport_service_type: cm::transport_type::RC,
        starting_psn: Psn::new(0x12_3456),
        local_cm_response_timeout: 20,
        retry_count: 7,
        pkey: mad::DEFAULT_PKEY,
        path_mtu: 3,
        rnr_retry_count: 7,
        max_cm_retries: 15,
        ..Default::default()
    };
    req.primary = cm::PathRepr {
        local_lid: 0xffff,
        remote_lid: 0xffff,
        local_gid: gid_a,
        remote_gid: gid_b,
        hop_limit: 64,
        packet_rate: 2,
        local_ack_timeout: 14,
        ..Default::default()
    };
    CmaHdr {
        src_port: 40000,
        src_addr: IpAddr::V4(Ipv4Addr::new(198, 18, 0, 1)),
        dst_addr: IpAddr::V4(Ipv4Addr::new(198, 18, 0, 2)),
    }
    .emit(&mut req.private_data)
    .unwrap();
    let mra = cm::MraRepr {
        local_comm_id: 0x3333_4444,
        remote_comm_id: 0x1111_2222,
        message_mraed: cm::msg_response::REQ,
        service_timeout: 20,
        ..Default::default()
    };
    let rep = cm::RepRepr {
        local_comm_id: 0x3333_4444,
        remote_comm_id: 0x1111_2222,
        local_qpn: Qpn::new(0x12),
        starting_psn: Psn::new(0x65_4321),
        responder_resources: 16,
        initiator_depth: 16,
        target_ack_delay: 15,
        rnr_retry_count: 7,
        local_ca_guid: 0x0200_00ff_fe00_0002,
        ..Default::default()
    };
    let mut rej = cm::RejRepr {
        local_comm_id: 0x3333_4444,
        remote_comm_id: 0x1111_2222,
        message_rejected: cm::msg_response::REQ,
        reason: cm::rej_reason::CONSUMER_DEFINED,
        ..Default::default()
    };
    rej.private_data[..5].copy_from_slice(b"nope!");
    let rtu = cm::RtuRepr {
        local_comm_id: 0x1111_2222,
        remote_comm_id: 0x3333_4444,
        ..Default::default()
    };
    let dreq = cm::DreqRepr {
        local_comm_id: 0x1111_2222,
        remote_comm_id: 0x3333_4444,
        remote_qpn_eecn: Qpn::new(0x12),
        ..Default::default()
    };
    let drep = cm::DrepRepr {
        local_comm_id: 0x3333_4444,
        remote_comm_id: 0x1111_2222,
        ..Default::default()
    };
    let sidr_req = cm::SidrReqRepr {
        request_id: 0x5555_6666,
        pkey: mad::DEFAULT_PKEY,
        service_id: cm::service_id(PortSpace::Udp, 7174),
        ..Default::default()
    };
    let sidr_rep = cm::SidrRepRepr {
        request_id: 0x5555_6666,
        status: cm::sidr_status::SUCCESS,
        qpn: Qpn::new(0x13),
        service_id: cm::service_id(PortSpace::Udp, 7174),
        qkey: 0x0123_4567,
        ..Default::default()
    };
    let tid = 0x0000_0001_1111_2222;
    vec![
        CmMad::new(tid, 0, CmMessage::Req(req)),
        CmMad::new(tid, 0, CmMessage::Mra(mra)),
        CmMad::new(tid, 0, CmMessage::Rep(rep)),
        CmMad::new(tid, 0, CmMessage::Rtu(rtu)),
        CmMad::new(tid, 0, CmMessage::Rej(rej)),
        CmMad::new(tid + 1, 0, CmMessage::Dreq(dreq)),
        CmMad::new(tid + 1, 0, CmMessage::Drep(drep)),
        CmMad::new(tid + 2, 0, CmMessage::SidrReq(sidr_req)),
        CmMad::new(tid + 2, 0, CmMessage::SidrRep(sidr_rep)),
    ]
}

/// A whole RoCE v2 frame carrying `mad` from QP1 to QP1.
fn gsi_frame(mad: &CmMad, psn: u32) -> Vec<u8> {
    let mut bytes = [0u8; MAD_LEN];
    mad.emit(&mut bytes).unwrap();
    let (bth, ext) = mad::gsi_ud_repr(mad::GSI_QPN, mad::GSI_QPN, mad::DEFAULT_PKEY, Psn::new(psn));
    let repr = RoceRepr {
        eth: EthernetRepr {
            src_addr: EthernetAddress([2, 0, 0, 0, 0, 1]),
            dst_addr: EthernetAddress([2, 0, 0, 0, 0, 2]),
            vlan: None,
            ethertype: EtherType::IPV4,
        },
        ip: IpRepr::Ipv4(Ipv4Repr {
            src_addr: Ipv4Addr::new(198, 18, 0, 1),
            dst_addr: Ipv4Addr::new(198, 18, 0, 2),
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
    let mut frame = vec![0u8; repr.buffer_len()];
    let n = repr.emit_with_payload(&mut frame, &bytes).unwrap();
    frame.truncate(n);
    // The frame parses back to the same MAD.
    let p = RoceRepr::parse(&frame).unwrap();
    assert!(p.icrc_ok);
    assert_eq!(p.repr.ext.deth.unwrap().qkey, mad::GSI_QKEY);
    assert_eq!(CmMad::parse(p.payload).unwrap(), *mad);
    frame
}

/// A classic pcap (Ethernet link type) of `frames`.
fn write_pcap(path: &std::path::Path, frames: &[Vec<u8>]) {
    let mut f = std::fs::File::create(path).unwrap();
    let mut hdr = Vec::new();
    hdr.extend_from_slice(&0xa1b2_c3d4u32.to_le_bytes());
    hdr.extend_from_slice(&2u16.to_le_bytes());
    hdr.extend_from_slice(&4u16.to_le_bytes());
    hdr.extend_from_slice(&0i32.to_le_bytes());
    hdr.extend_from_slice(&0u32.to_le_bytes());
    hdr.extend_from_slice(&65535u32.to_le_bytes());
    hdr.extend_from_slice(&1u32.to_le_bytes());
    f.write_all(&hdr).unwrap();
    for (i, fr) in frames.iter().enumerate() {
        let mut rec = Vec::new();
        rec.extend_from_slice(&(1_700_000_000u32 + i as u32).to_le_bytes());
        rec.extend_from_slice(&0u32.to_le_bytes());
        rec.extend_from_slice(&(fr.len() as u32).to_le_bytes());
        rec.extend_from_slice(&(fr.len() as u32).to_le_bytes());
        f.write_all(&rec).unwrap();
        f.write_all(fr).unwrap();
    }
}

#[test]
fn tshark_dissects_every_cm_message_cleanly() {
    let mads = sample_mads();
    let frames: Vec<Vec<u8>> = mads
        .iter()
        .enumerate()
        .map(|(i, m)| gsi_frame(m, i as u32))
        .collect();
    if Command::new("tshark").arg("--version").output().is_err() {
        eprintln!("SKIPPED tshark_dissects_every_cm_message_cleanly: tshark is not installed");
        return;
    }
    let dir = std::env::temp_dir().join(format!("roce-wire-mad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let pcap = dir.join("cm.pcap");
    write_pcap(&pcap, &frames);
    let out = Command::new("tshark")
        .args(["-n", "-r"])
        .arg(&pcap)
        .arg("-V")
        .output();
    let out = match out {
        Ok(o) => o,
        Err(e) => panic!("tshark failed to run: {e}"),
    };
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let expert = Command::new("tshark")
        .args(["-n", "-q", "-r"])
        .arg(&pcap)
        .args(["-z", "expert,note"])
        .output()
        .unwrap();
    let expert_text = String::from_utf8_lossy(&expert.stdout).into_owned();
    if std::env::var_os("ROCE_KEEP_PCAP").is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    assert!(
        out.status.success(),
        "tshark failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !text.contains("Malformed"),
        "tshark reports a malformed packet:\n{text}"
    );
    assert!(
        !text.contains("Expert Info"),
        "tshark reports expert info:\n{text}"
    );
    for e in ["Warnings", "Errors"] {
        assert!(
            !expert_text.contains(e),
            "tshark expert {e}:\n{expert_text}"
        );
    }
    // Wireshark names each CM message (packet-infiniband.c: "ConnectRequest" ...).
    for name in [
        "ConnectRequest",
        "MsgRcptAck",
        "ConnectReply",
        "ReadyToUse",
        "ConnectReject",
        "DisconnectRequest",
        "DisconnectReply",
    ] {
        assert!(
            text.contains(name),
            "tshark did not dissect {name}:\n{text}"
        );
    }
}
