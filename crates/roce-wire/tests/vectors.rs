//! Golden vectors (`testdata/spec/vectors.json`), corruption cases and
//! masked-field behaviour of the ICRC.

mod common;

use common::{crosscheck_outer, hex, hexnum, parse, reemit, vectors};
use roce_wire::*;

fn field_u(v: &serde_json::Value) -> u64 {
    match v {
        serde_json::Value::Number(n) => n.as_u64().unwrap(),
        _ => hexnum(v),
    }
}

#[test]
fn every_vector_parses_to_listed_fields_and_reemits() {
    let vs = vectors();
    assert_eq!(vs.len(), 24);
    for v in &vs {
        let id = v["id"].as_str().unwrap();
        let frame = hex(v["frame_hex"].as_str().unwrap());
        assert_eq!(frame.len() as u64, v["frame_len"].as_u64().unwrap(), "{id}");
        let p = parse(&frame);
        let r = &p.repr;
        assert!(p.icrc_ok, "{id}: icrc");
        assert!(p.ip_checksum_ok, "{id}: ip checksum");
        assert_eq!(p.frame_len, frame.len(), "{id}");
        assert_eq!(u64::from(p.icrc), hexnum(&v["icrc_crc32_value"]), "{id}");
        assert_eq!(
            &frame[frame.len() - 4..],
            &hex(v["icrc_wire_bytes"].as_str().unwrap())[..]
        );
        assert_eq!(
            u64::from(r.ip.version()),
            v["ip_version"].as_u64().unwrap(),
            "{id}"
        );
        let tos = (r.ip.dscp() << 2) | r.ip.ecn().bits();
        assert_eq!(u64::from(tos), hexnum(&v["ip_tos_or_tclass"]), "{id}");
        assert_eq!(
            u64::from(r.udp.src_port),
            v["udp_sport"].as_u64().unwrap(),
            "{id}"
        );
        assert_eq!(
            u64::from(r.udp.dst_port),
            v["udp_dport"].as_u64().unwrap(),
            "{id}"
        );
        assert_eq!(
            r.payload_len as u64,
            v["payload_len"].as_u64().unwrap(),
            "{id}"
        );
        assert_eq!(p.payload.len(), r.payload_len);

        let b = &v["bth"];
        let bth = &r.bth;
        assert_eq!(u64::from(bth.opcode.0), hexnum(&b["opcode"]), "{id}");
        assert_eq!(
            bth.opcode.name(),
            b["opcode_name"].as_str().unwrap(),
            "{id}"
        );
        assert_eq!(u64::from(bth.solicited), b["se"].as_u64().unwrap(), "{id}");
        assert_eq!(u64::from(bth.mig_req), b["m"].as_u64().unwrap(), "{id}");
        assert_eq!(
            u64::from(bth.pad_count),
            b["padcnt"].as_u64().unwrap(),
            "{id}"
        );
        assert_eq!(b["tver"].as_u64().unwrap(), 0);
        assert_eq!(u64::from(bth.pkey), hexnum(&b["pkey"]), "{id}");
        assert_eq!(u64::from(bth.fecn), b["fecn"].as_u64().unwrap(), "{id}");
        assert_eq!(u64::from(bth.becn), b["becn"].as_u64().unwrap(), "{id}");
        assert_eq!(
            u64::from(bth.dest_qp.value()),
            hexnum(&b["dest_qp"]),
            "{id}"
        );
        assert_eq!(
            u64::from(bth.ack_req),
            b["ackreq"].as_u64().unwrap(),
            "{id}"
        );
        assert_eq!(u64::from(bth.psn.value()), hexnum(&b["psn"]), "{id}");
        assert!(r.ext.matches(bth.opcode), "{id}");

        let e = &v["ext"];
        let ext = &r.ext;
        if let Some(x) = e.get("reth_va") {
            let reth = ext.reth.unwrap();
            assert_eq!(reth.va, hexnum(x), "{id}");
            assert_eq!(u64::from(reth.rkey), hexnum(&e["reth_rkey"]));
            assert_eq!(u64::from(reth.dma_len), e["reth_dmalen"].as_u64().unwrap());
        } else {
            assert!(ext.reth.is_none(), "{id}");
        }
        if let Some(x) = e.get("immdt") {
            assert_eq!(u64::from(ext.immdt.unwrap().imm_data), hexnum(x), "{id}");
        } else {
            assert!(ext.immdt.is_none(), "{id}");
        }
        if let Some(x) = e.get("aeth_syndrome") {
            let aeth = ext.aeth.unwrap();
            assert_eq!(u64::from(aeth.syndrome.to_byte()), hexnum(x), "{id}");
            assert_eq!(
                u64::from(aeth.msn.value()),
                e["aeth_msn"].as_u64().unwrap(),
                "{id}"
            );
        } else {
            assert!(ext.aeth.is_none(), "{id}");
        }
        if let Some(code) = e.get("rnr_timer_code") {
            let AethSyndrome::RnrNak { timer } = ext.aeth.unwrap().syndrome else {
                panic!("{id}: not an RNR NAK");
            };
            assert_eq!(u64::from(timer), code.as_u64().unwrap());
            assert_eq!(
                u64::from(rnr_timer_us(timer)),
                e["rnr_timer_us"].as_u64().unwrap()
            );
        }
        if let Some(x) = e.get("atomic_va") {
            let a = ext.atomic_eth.unwrap();
            assert_eq!(a.va, hexnum(x), "{id}");
            assert_eq!(u64::from(a.rkey), hexnum(&e["atomic_rkey"]));
            let swap_add = e.get("swap").or_else(|| e.get("add")).unwrap();
            assert_eq!(a.swap_add, hexnum(swap_add));
            assert_eq!(a.compare, hexnum(&e["compare"]));
        } else {
            assert!(ext.atomic_eth.is_none(), "{id}");
        }
        if let Some(x) = e.get("deth_qkey") {
            let d = ext.deth.unwrap();
            assert_eq!(u64::from(d.qkey), hexnum(x), "{id}");
            assert_eq!(u64::from(d.src_qp.value()), hexnum(&e["deth_src_qp"]));
        } else {
            assert!(ext.deth.is_none(), "{id}");
        }
        if e.get("reserved_bytes").is_some() {
            assert_eq!(ext.cnp, Some(CnpRepr), "{id}");
            assert_eq!(ext.byte_len() as u64, field_u(&e["reserved_bytes"]));
        }
        if let Some(x) = e.get("payload") {
            assert_eq!(p.payload, &hex(x.as_str().unwrap())[..], "{id}");
        }
        if e.get("payload_pattern").is_some() {
            assert!(
                p.payload.iter().enumerate().all(|(i, b)| *b as usize == i),
                "{id}"
            );
        }

        // Byte-for-byte re-emit from repr + payload.
        assert_eq!(reemit(&p), frame, "{id}: re-emit differs");
        crosscheck_outer(&frame, &p);
        // The pretty line names the opcode and the ICRC status.
        let line = p.to_string();
        assert!(line.ends_with("icrc=ok"), "{id}: {line}");
    }
}

#[test]
fn pretty_lines() {
    let vs = vectors();
    let line = |id: &str| {
        let v = vs.iter().find(|v| v["id"] == id).unwrap();
        let f = hex(v["frame_hex"].as_str().unwrap());
        PrettyFrame(&f).to_string()
    };
    assert_eq!(
        line("rc_send_first"),
        "RC SEND_FIRST qp=0x000012 psn=0x000064 A=0 pad=0 len=256 icrc=ok"
    );
    assert_eq!(
        line("rc_write_first"),
        "RC RDMA_WRITE_FIRST qp=0x000012 psn=0x0000c8 A=0 pad=0 len=256 reth(va=0x7f0000001000 rkey=0x1234abcd len=600) icrc=ok"
    );
    assert_eq!(
        line("rc_ack"),
        "RC ACKNOWLEDGE qp=0x000011 psn=0x000066 A=0 pad=0 len=0 aeth(ack msn=5) icrc=ok"
    );
    assert_eq!(
        line("rc_nak_seq_err"),
        "RC ACKNOWLEDGE qp=0x000011 psn=0x000067 A=0 pad=0 len=0 aeth(nak seq msn=5) icrc=ok"
    );
    assert_eq!(
        line("rc_send_only_imm"),
        "RC SEND_ONLY_WITH_IMMEDIATE qp=0x000012 psn=0x000067 A=1 pad=0 len=8 immdt=0xdeadbeef SE icrc=ok"
    );
    assert_eq!(
        line("cnp"),
        "CNP qp=0x000011 psn=0x000000 A=0 pad=0 len=0 BECN icrc=ok"
    );
    assert_eq!(
        line("ud_send_only"),
        "UD SEND_ONLY qp=0x000456 psn=0x000010 A=0 pad=0 len=64 deth(qkey=0x11111111 src_qp=0x000123) icrc=ok"
    );
    assert_eq!(
        PrettyFrame(&[0u8; 10]).to_string(),
        "malformed: ethernet header (truncated, len=10)"
    );
}

/// The rejection reason for `f` (panics if it parses).
fn reason(f: &[u8]) -> &'static str {
    RoceRepr::parse_explained(f).unwrap_err().reason
}

fn vector(id: &str) -> Vec<u8> {
    let vs = vectors();
    let v = vs.iter().find(|v| v["id"] == id).unwrap();
    hex(v["frame_hex"].as_str().unwrap())
}

/// Recomputes IPv4 checksum and ICRC after an edit, so the edit is the only defect.
fn refresh(frame: &mut [u8]) {
    let eth = EthernetFrame::new_unchecked(&frame[..]).header_len();
    if frame[eth] >> 4 == 4 {
        Ipv4Packet::new_unchecked(&mut frame[eth..]).fill_checksum();
    }
    icrc::fill(&mut frame[eth..]).unwrap();
}

#[test]
fn corrupted_payload_bit_is_bad_icrc() {
    let mut f = vector("rc_send_first");
    f[60] ^= 0x01;
    let p = RoceRepr::parse(&f).unwrap();
    assert!(!p.icrc_ok);
    assert_eq!(p.check_icrc(), Err(Error::BadIcrc));
    assert!(p.to_string().ends_with("icrc=bad"));
    assert_eq!(icrc::verify(&f[14..]), Err(Error::BadIcrc));
}

#[test]
fn wrong_padcnt_is_rejected() {
    // pad 3 -> 2 on the 5-byte payload: structurally possible (8 bytes after
    // the BTH), so only the ICRC (which covers BTH byte 1) catches it.
    let mut f = vector("rc_send_only_pad3");
    f[43] = (f[43] & !0x30) | 0x20;
    let p = RoceRepr::parse(&f).unwrap();
    assert!(!p.icrc_ok);
    assert_eq!(p.payload.len(), 6);
    // The same on a 16-byte payload with pad 3.
    let mut f = vector("rc_send_only_v4");
    f[43] |= 0x30; // pad 3 on 16 bytes: BTH..pad still a multiple of 4, payload 13
    let p = RoceRepr::parse(&f).unwrap();
    assert!(!p.icrc_ok, "BTH byte 1 is covered by the ICRC");
    assert_eq!(p.payload.len(), 13);
    // Pad on an opcode without payload.
    let mut f = vector("rc_ack");
    f[43] |= 0x10;
    refresh(&mut f);
    assert_eq!(RoceRepr::parse(&f).unwrap_err(), Error::Malformed);
    assert_eq!(reason(&f), "pad count on an opcode without payload");
    // Pad larger than what is there: SEND ONLY with 0 payload bytes and pad 1.
    let mut f = vector("rc_read_request");
    f[42] = Opcode::RC_SEND_ONLY.0; // READ REQUEST (RETH, no payload) -> SEND ONLY: 16 bytes payload
    f[43] |= 0x10;
    refresh(&mut f);
    let p = RoceRepr::parse(&f).unwrap();
    assert_eq!(p.repr.payload_len, 15);
}

#[test]
fn pad_larger_than_body_is_malformed() {
    // ACK frame re-labelled as SEND ONLY: body after BTH is the 4-byte AETH,
    // i.e. a 4-byte "payload"; make it 0 bytes by trimming lengths.
    let mut f = vector("rc_ack");
    f[42] = Opcode::RC_SEND_ONLY.0;
    f[43] |= 0x30; // pad 3
    // Remove the 4 AETH bytes: IP len 48 -> 44, UDP len 28 -> 24.
    f.drain(54..58);
    f[16..18].copy_from_slice(&44u16.to_be_bytes());
    f[38..40].copy_from_slice(&24u16.to_be_bytes());
    refresh(&mut f);
    assert_eq!(RoceRepr::parse(&f).unwrap_err(), Error::Malformed);
    assert_eq!(reason(&f), "pad count larger than payload");
}

#[test]
fn bth_to_pad_not_multiple_of_four_is_malformed() {
    let mut f = vector("rc_send_only_v4");
    // Drop one payload byte and fix lengths: 15-byte body with pad 0.
    f.remove(60);
    f[16..18].copy_from_slice(&59u16.to_be_bytes());
    f[38..40].copy_from_slice(&39u16.to_be_bytes());
    refresh(&mut f);
    assert_eq!(RoceRepr::parse(&f).unwrap_err(), Error::Malformed);
    assert_eq!(reason(&f), "BTH..pad not a multiple of 4");
}

#[test]
fn truncated_frames() {
    let f = vector("rc_write_first");
    for n in [0, 5, 13, 14, 20, 33, 40, f.len() - 1] {
        assert_eq!(
            RoceRepr::parse(&f[..n]).unwrap_err(),
            Error::Truncated,
            "len {n}"
        );
        assert!(
            PrettyFrame(&f[..n])
                .to_string()
                .ends_with(&format!("(truncated, len={n})"))
        );
    }
    let f6 = vector("rc_ack_v6");
    assert_eq!(
        RoceRepr::parse(&f6[..f6.len() - 2]).unwrap_err(),
        Error::Truncated
    );
}

#[test]
fn length_and_header_inconsistencies() {
    // UDP length disagrees with IP length.
    let mut f = vector("rc_send_only_v4");
    f[38..40].copy_from_slice(&36u16.to_be_bytes());
    refresh_ip_only(&mut f);
    assert_eq!(RoceRepr::parse(&f).unwrap_err(), Error::Malformed);
    assert_eq!(reason(&f), "UDP length disagrees with IP length");
    // IP total length shorter than the frame says: UDP len no longer matches.
    let mut f = vector("rc_send_only_v4");
    f[16..18].copy_from_slice(&56u16.to_be_bytes());
    refresh_ip_only(&mut f);
    assert_eq!(RoceRepr::parse(&f).unwrap_err(), Error::Malformed);
    assert_eq!(reason(&f), "UDP length disagrees with IP length");
    // IP total length longer than the buffer.
    let mut f = vector("rc_send_only_v4");
    f[16..18].copy_from_slice(&100u16.to_be_bytes());
    assert_eq!(RoceRepr::parse(&f).unwrap_err(), Error::Truncated);
    // TVer != 0.
    let mut f = vector("rc_send_only_v4");
    f[43] |= 0x01;
    refresh(&mut f);
    assert_eq!(RoceRepr::parse(&f).unwrap_err(), Error::Malformed);
    assert_eq!(reason(&f), "BTH TVer is not 0");
    // Payload on an opcode without payload (ACK with 4 extra bytes).
    let mut f = vector("rc_ack");
    f.splice(58..58, [0u8; 4]);
    f[16..18].copy_from_slice(&52u16.to_be_bytes());
    f[38..40].copy_from_slice(&32u16.to_be_bytes());
    refresh(&mut f);
    assert_eq!(RoceRepr::parse(&f).unwrap_err(), Error::Malformed);
    assert_eq!(reason(&f), "payload on an opcode without payload");
    // UDP payload too short for the extension headers of the opcode.
    let mut f = vector("rc_ack");
    f[42] = Opcode::RC_COMPARE_SWAP.0;
    refresh(&mut f);
    assert_eq!(RoceRepr::parse(&f).unwrap_err(), Error::Malformed);
    assert_eq!(reason(&f), "too short for the opcode's extension headers");
    // IPv4 options.
    let mut f = vector("rc_ack");
    f[14] = 0x46;
    assert_eq!(RoceRepr::parse(&f).unwrap_err(), Error::Malformed);
    assert_eq!(reason(&f), "IPv4 version, options or fragment");
}

fn refresh_ip_only(frame: &mut [u8]) {
    Ipv4Packet::new_unchecked(&mut frame[14..]).fill_checksum();
}

#[test]
fn not_roce() {
    // Other UDP port.
    let mut f = vector("rc_send_only_v4");
    f[36..38].copy_from_slice(&4792u16.to_be_bytes());
    assert_eq!(RoceRepr::parse(&f).unwrap_err(), Error::NotRoce);
    assert_eq!(reason(&f), "UDP destination port is not 4791");
    assert!(PrettyFrame(&f).to_string().starts_with("not RoCE v2"));
    // TCP.
    let mut f = vector("rc_send_only_v4");
    f[23] = 6;
    assert_eq!(RoceRepr::parse(&f).unwrap_err(), Error::NotRoce);
    assert_eq!(reason(&f), "IP protocol is not UDP");
    // ARP.
    let mut f = vector("rc_send_only_v4");
    f[12..14].copy_from_slice(&0x0806u16.to_be_bytes());
    assert_eq!(RoceRepr::parse(&f).unwrap_err(), Error::NotRoce);
    assert_eq!(reason(&f), "EtherType is not IPv4/IPv6");
}

#[test]
fn unknown_opcode_is_opaque() {
    let mut f = vector("rc_send_only_v4");
    f[42] = 0x15;
    refresh(&mut f);
    let p = RoceRepr::parse(&f).unwrap();
    assert!(p.icrc_ok);
    assert!(!p.repr.bth.opcode.is_known());
    assert_eq!(p.repr.ext, ExtRepr::NONE);
    assert_eq!(p.payload.len(), 16);
    assert_eq!(reemit(&p), f);
    assert!(p.to_string().starts_with("UNKNOWN(0x15) qp=0x000012"));
}

/// A named edit of a frame.
type Edit = (&'static str, fn(&mut Vec<u8>));

#[test]
fn masked_fields_keep_icrc_v4() {
    let orig = vector("rc_write_first");
    let edits: [Edit; 6] = [
        ("ttl", |f| f[22] = 1),
        ("ecn ce", |f| f[15] |= 0x03),
        ("dscp", |f| f[15] = 0xc0),
        ("ip checksum", |f| f[24..26].copy_from_slice(&[0x12, 0x34])),
        ("udp checksum", |f| f[40..42].copy_from_slice(&[0xab, 0xcd])),
        ("fecn/becn", |f| f[46] = 0xc0),
    ];
    for (what, edit) in edits {
        let mut f = orig.clone();
        edit(&mut f);
        let p = RoceRepr::parse(&f).unwrap();
        assert!(p.icrc_ok, "{what} must not change the ICRC");
    }
    // IP checksum wrong is reported but ICRC is fine.
    let mut f = orig.clone();
    f[24] ^= 0xff;
    let p = RoceRepr::parse(&f).unwrap();
    assert!(p.icrc_ok && !p.ip_checksum_ok);
    assert!(p.to_string().contains("ipcsum=bad"));
    // IP identification is covered.
    let mut f = orig.clone();
    f[19] ^= 0x01;
    refresh_ip_only(&mut f);
    let p = RoceRepr::parse(&f).unwrap();
    assert!(
        p.ip_checksum_ok && !p.icrc_ok,
        "IP ID change must break the ICRC"
    );
    // So are the addresses and the UDP source port.
    let mut f = orig.clone();
    f[34] ^= 0x01;
    assert!(!RoceRepr::parse(&f).unwrap().icrc_ok);
}

#[test]
fn masked_fields_keep_icrc_v6() {
    let orig = vector("rc_send_only_v6");
    let edits: [Edit; 5] = [
        ("traffic class", |f| f[14] = 0x6c),
        ("ecn ce", |f| f[15] |= 0x30),
        ("flow label", |f| {
            f[15..18].copy_from_slice(&[0x0a, 0xbc, 0xde])
        }),
        ("hop limit", |f| f[21] = 3),
        ("udp checksum", |f| f[60..62].copy_from_slice(&[1, 2])),
    ];
    for (what, edit) in edits {
        let mut f = orig.clone();
        edit(&mut f);
        let p = RoceRepr::parse(&f).unwrap();
        assert!(p.icrc_ok, "{what} must not change the ICRC");
    }
    let mut f = orig.clone();
    f[14] = 0x76; // version nibble is covered
    assert_eq!(RoceRepr::parse(&f).unwrap_err(), Error::Malformed);
    assert_eq!(reason(&f), "IPv6 version");
    let mut f = orig.clone();
    f[25] ^= 1; // source address
    assert!(!RoceRepr::parse(&f).unwrap().icrc_ok);
}

#[test]
fn ecn_ce_shows_in_pretty_line() {
    let mut f = vector("rc_send_first");
    Ipv4Packet::new_unchecked(&mut f[14..]).set_ecn(Ecn::Ce);
    let p = RoceRepr::parse(&f).unwrap();
    assert_eq!(p.repr.ip.ecn(), Ecn::Ce);
    assert!(p.to_string().contains("ecn=ce icrc=ok"));
}

#[test]
fn ethernet_min_padding_is_ignored() {
    // A 0-byte SEND ONLY over IPv4 is 58 bytes; the MAC pads it to 60.
    let base = parse(&vector("rc_send_only_v4")).repr;
    let repr = RoceRepr {
        payload_len: 0,
        ..base
    };
    let mut f = vec![0u8; repr.buffer_len()];
    repr.emit(&mut f, |_| {}).unwrap();
    assert_eq!(f.len(), 58);
    f.extend_from_slice(&[0xee, 0xee]); // non-zero padding on purpose
    assert_eq!(f.len(), eth::MIN_FRAME_LEN);
    let p = RoceRepr::parse(&f).unwrap();
    assert!(p.icrc_ok);
    assert_eq!(p.frame_len, 58);
    assert_eq!(p.payload.len(), 0);
    assert_eq!(p.repr, repr);
}

#[test]
fn vlan_tagged_frame_roundtrip() {
    let base = parse(&vector("rc_write_first")).repr;
    let untagged = vector("rc_write_first");
    let payload = parse(&untagged).payload.to_vec();
    let repr = RoceRepr {
        eth: EthernetRepr {
            vlan: Some(VlanTag {
                pcp: 3,
                dei: false,
                vid: 42,
            }),
            ..base.eth
        },
        ..base
    };
    let mut f = vec![0u8; repr.buffer_len()];
    repr.emit_with_payload(&mut f, &payload).unwrap();
    assert_eq!(f.len(), 330 + 4);
    let p = parse(&f);
    assert!(p.icrc_ok);
    assert_eq!(p.repr, repr);
    // VLAN tag is not covered by the ICRC: same ICRC as the untagged vector.
    assert_eq!(p.icrc, parse(&untagged).icrc);
    crosscheck_outer(&f, &p);
}

#[test]
fn emit_rejects_inconsistent_reprs() {
    let base = parse(&vector("rc_write_first")).repr;
    let mut buf = [0u8; 400];
    let no_reth = RoceRepr {
        ext: ExtRepr::NONE,
        ..base
    };
    assert_eq!(no_reth.emit(&mut buf, |_| {}), Err(Error::Malformed));
    let bad_pad = RoceRepr {
        payload_len: 255,
        ..base
    };
    assert_eq!(bad_pad.emit(&mut buf, |_| {}), Err(Error::Malformed));
    assert_eq!(
        base.emit(&mut buf[..base.buffer_len() - 1], |_| {}),
        Err(Error::Truncated)
    );
    assert_eq!(
        base.emit_with_payload(&mut buf, &[0u8; 3]),
        Err(Error::Malformed)
    );
    let ack = parse(&vector("rc_ack")).repr;
    let ack_payload = RoceRepr {
        payload_len: 4,
        ..ack
    };
    assert_eq!(ack_payload.emit(&mut buf, |_| {}), Err(Error::Malformed));
}

#[test]
fn udp_checksum_zero_correct_or_wrong() {
    use etherparse::{NetHeaders, PacketHeaders, TransportHeader};
    for id in ["rc_write_first", "rc_send_only_v6", "rc_ack_v6", "cnp"] {
        let mut f = vector(id);
        assert!(parse(&f).udp_checksum_ok, "{id}: zero is accepted");
        // Fill in the correct checksum as computed by etherparse.
        let (ip_off, udp_off) = if f[12] == 0x86 { (14, 54) } else { (14, 34) };
        let h = PacketHeaders::from_ethernet_slice(&f).unwrap();
        let Some(TransportHeader::Udp(u)) = h.transport else {
            panic!("{id}")
        };
        let payload = &f[udp_off + 8..];
        let c = match h.net {
            Some(NetHeaders::Ipv4(ip, _)) => u.calc_checksum_ipv4(&ip, payload).unwrap(),
            Some(NetHeaders::Ipv6(ip, _)) => u.calc_checksum_ipv6(&ip, payload).unwrap(),
            _ => panic!("{id}"),
        };
        assert_ne!(c, 0);
        assert_eq!(
            udp::checksum(
                ip_addr(&f, ip_off, true),
                ip_addr(&f, ip_off, false),
                &f[udp_off..]
            ),
            c,
            "{id}"
        );
        f[udp_off + 6..udp_off + 8].copy_from_slice(&c.to_be_bytes());
        let p = parse(&f);
        assert!(p.udp_checksum_ok && p.icrc_ok, "{id}");
        // A wrong non-zero checksum is reported; the ICRC does not cover it.
        f[udp_off + 7] ^= 0x01;
        let p = parse(&f);
        assert!(!p.udp_checksum_ok && p.icrc_ok, "{id}");
        assert!(p.to_string().ends_with("icrc=ok udpcsum=bad"), "{id}");
    }
}

fn ip_addr(f: &[u8], ip_off: usize, src: bool) -> core::net::IpAddr {
    if f[ip_off] >> 4 == 4 {
        let o = ip_off + if src { 12 } else { 16 };
        core::net::IpAddr::from(<[u8; 4]>::try_from(&f[o..o + 4]).unwrap())
    } else {
        let o = ip_off + if src { 8 } else { 24 };
        core::net::IpAddr::from(<[u8; 16]>::try_from(&f[o..o + 16]).unwrap())
    }
}
