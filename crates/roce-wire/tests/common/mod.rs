//! Helpers shared by the integration tests: locating `testdata/`, hex, a tiny
//! pcap reader, and the etherparse cross-check of outer headers (STYLE T2).
#![allow(dead_code)]

use std::path::PathBuf;

use roce_wire::{IpRepr, ParsedFrame, RoceRepr};

/// `<checkout>/testdata` (provenance in `testdata/README.md`), from the crate directory.
pub fn testdata_dir() -> PathBuf {
    let here = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let p = here.join("../../testdata");
    assert!(
        p.join("spec/vectors.json").exists(),
        "reference material not found at {}",
        p.display()
    );
    p
}

pub fn hex(s: &str) -> Vec<u8> {
    assert!(s.len().is_multiple_of(2));
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// Parses a `"0x…"` hex string.
pub fn hexnum(v: &serde_json::Value) -> u64 {
    let s = v.as_str().unwrap_or_else(|| panic!("not a string: {v}"));
    u64::from_str_radix(s.trim_start_matches("0x"), 16).unwrap()
}

pub fn vectors() -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(testdata_dir().join("spec/vectors.json")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v["vectors"].as_array().unwrap().clone()
}

/// Reads a classic little- or big-endian pcap file: (link type, frames).
pub fn read_pcap(path: &std::path::Path) -> (u32, Vec<Vec<u8>>) {
    let d = std::fs::read(path).unwrap();
    let magic = u32::from_le_bytes(d[0..4].try_into().unwrap());
    let le = match magic {
        0xa1b2c3d4 | 0xa1b23c4d => true,
        0xd4c3b2a1 | 0x4d3cb2a1 => false,
        m => panic!("not a pcap file: magic {m:#x}"),
    };
    let u32at = |o: usize| {
        let b: [u8; 4] = d[o..o + 4].try_into().unwrap();
        if le {
            u32::from_le_bytes(b)
        } else {
            u32::from_be_bytes(b)
        }
    };
    let linktype = u32at(20);
    let mut off = 24;
    let mut out = Vec::new();
    while off + 16 <= d.len() {
        let caplen = u32at(off + 8) as usize;
        off += 16;
        out.push(d[off..off + caplen].to_vec());
        off += caplen;
    }
    assert_eq!(off, d.len(), "trailing bytes in pcap");
    (linktype, out)
}

/// Checks the outer headers of `frame` with etherparse against `p`.
pub fn crosscheck_outer(frame: &[u8], p: &ParsedFrame<'_>) {
    use etherparse::{LinkExtHeader, LinkHeader, NetHeaders, PacketHeaders, TransportHeader};
    let h = PacketHeaders::from_ethernet_slice(frame).expect("etherparse rejects frame");
    let r = &p.repr;
    match h.link {
        Some(LinkHeader::Ethernet2(e)) => {
            assert_eq!(e.source, r.eth.src_addr.0);
            assert_eq!(e.destination, r.eth.dst_addr.0);
        }
        other => panic!("no ethernet header: {other:?}"),
    }
    match (h.link_exts.first(), r.eth.vlan) {
        (Some(LinkExtHeader::Vlan(v)), Some(tag)) => {
            assert_eq!(v.pcp.value(), tag.pcp);
            assert_eq!(v.vlan_id.value(), tag.vid);
            assert_eq!(v.drop_eligible_indicator, tag.dei);
        }
        (None, None) => {}
        (a, b) => panic!("vlan mismatch: {a:?} vs {b:?}"),
    }
    let udp_len = match (h.net, &r.ip) {
        (Some(NetHeaders::Ipv4(ip, _)), IpRepr::Ipv4(me)) => {
            assert_eq!(ip.source, me.src_addr.octets());
            assert_eq!(ip.destination, me.dst_addr.octets());
            assert_eq!(ip.dscp.value(), me.dscp);
            assert_eq!(ip.ecn.value(), me.ecn.bits());
            assert_eq!(ip.identification, me.ident);
            assert_eq!(ip.dont_fragment, me.dont_frag);
            assert_eq!(ip.time_to_live, me.ttl);
            assert_eq!(ip.protocol.0, 17);
            assert_eq!(
                ip.header_checksum,
                ip.calc_header_checksum(),
                "IPv4 checksum"
            );
            assert!(p.ip_checksum_ok);
            usize::from(ip.total_len) - 20
        }
        (Some(NetHeaders::Ipv6(ip, _)), IpRepr::Ipv6(me)) => {
            assert_eq!(ip.source, me.src_addr.octets());
            assert_eq!(ip.destination, me.dst_addr.octets());
            assert_eq!(ip.traffic_class, (me.dscp << 2) | me.ecn.bits());
            assert_eq!(ip.flow_label.value(), me.flow_label);
            assert_eq!(ip.hop_limit, me.hop_limit);
            assert_eq!(ip.next_header.0, 17);
            usize::from(ip.payload_length)
        }
        (a, b) => panic!("ip mismatch: {a:?} vs {b:?}"),
    };
    match h.transport {
        Some(TransportHeader::Udp(u)) => {
            assert_eq!(u.source_port, r.udp.src_port);
            assert_eq!(u.destination_port, 4791);
            assert_eq!(usize::from(u.length), udp_len);
            assert_eq!(usize::from(u.length), 8 + r.udp_payload_len());
        }
        other => panic!("no udp header: {other:?}"),
    }
}

/// Re-emits a parsed frame from its repr and payload.
pub fn reemit(p: &ParsedFrame<'_>) -> Vec<u8> {
    let mut out = vec![0u8; p.repr.buffer_len()];
    let n = p.repr.emit_with_payload(&mut out, p.payload).expect("emit");
    assert_eq!(n, out.len());
    out
}

/// Parses `frame`, panicking with the pretty line on failure.
pub fn parse(frame: &[u8]) -> ParsedFrame<'_> {
    RoceRepr::parse(frame).unwrap_or_else(|e| panic!("parse failed: {e}"))
}
