//! Fuzz target `parse_frame`: arbitrary bytes as an Ethernet frame.
//!
//! Must never panic. Exercises, on every input:
//! * the pretty printer ([`PrettyFrame`]) on the raw bytes;
//! * every zero-copy view whose `new_checked` accepts the bytes (Ethernet, IPv4, IPv6,
//!   UDP, BTH, each extension header), calling all read accessors;
//! * [`RoceRepr::parse`]; on success it also checks that
//!   - the reported lengths and offsets lie inside the input,
//!   - re-emitting the repr with the same payload parses back to the same repr and
//!     payload (parse ∘ emit = id),
//!   - for known opcodes, [`HeaderTemplate::emit`] produces the same bytes as
//!     [`RoceRepr::emit`] (the template's incremental IPv4 checksum included).
//!
//! Under `cfg(fuzzing)` roce-wire reports every ICRC as good so the fuzzer can reach
//! the code after the ICRC check.

#![no_main]

use core::fmt::{self, Write};
use std::hint::black_box;

use libfuzzer_sys::fuzz_target;
use roce_wire::{
    Aeth, AtomicAckEth, AtomicEth, Bth, CnpBody, Deth, EtherType, EthernetFrame, Feth,
    HeaderTemplate, Ieth, ImmDt, Ipv4Packet, Ipv6Packet, PacketHeader, PrettyFrame, Reth,
    RoceFrame, RoceRepr, UdpPacket,
};

/// A formatter sink that discards output (formatting runs, nothing is stored).
struct Sink;

impl Write for Sink {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        black_box(s);
        Ok(())
    }
}

fn views_after_checks(data: &[u8]) {
    if let Ok(eth) = EthernetFrame::new_checked(data) {
        black_box((
            eth.has_vlan(),
            eth.header_len(),
            eth.dst_addr(),
            eth.src_addr(),
        ));
        black_box((eth.vlan(), eth.ethertype()));
        let l3 = eth.payload();
        match eth.ethertype() {
            EtherType::IPV4 => ipv4(l3),
            EtherType::IPV6 => ipv6(l3),
            _ => {}
        }
    }
    // The IP parsers must also cope with garbage at the start of the buffer.
    ipv4(data);
    ipv6(data);
    udp(data);
    transport(data);
    if let Ok(f) = RoceFrame::new(data) {
        black_box(f.bth_offset());
        bth(f.bth());
        transport(f.after_bth());
        black_box(f.as_bytes().len());
    }
}

fn ipv4(b: &[u8]) {
    if let Ok(p) = Ipv4Packet::new_checked(b) {
        black_box((
            p.version(),
            p.header_len(),
            p.dscp(),
            p.ecn(),
            p.total_len(),
        ));
        black_box((
            p.ident(),
            p.dont_frag(),
            p.more_frags(),
            p.frag_offset(),
            p.ttl(),
        ));
        black_box((p.protocol(), p.checksum(), p.src_addr(), p.dst_addr()));
        black_box(p.verify_checksum());
        udp(p.payload());
    }
}

fn ipv6(b: &[u8]) {
    if let Ok(p) = Ipv6Packet::new_checked(b) {
        black_box((
            p.version(),
            p.traffic_class(),
            p.dscp(),
            p.ecn(),
            p.flow_label(),
        ));
        black_box((p.payload_len(), p.next_header(), p.hop_limit()));
        black_box((p.src_addr(), p.dst_addr()));
        udp(p.payload());
    }
}

fn udp(b: &[u8]) {
    if let Ok(u) = UdpPacket::new_checked(b) {
        black_box((
            u.src_port(),
            u.dst_port(),
            u.len(),
            u.is_empty(),
            u.checksum(),
        ));
        let payload = u.payload();
        if let Ok(h) = Bth::new_checked(payload) {
            bth(h);
        }
    }
}

fn bth<T: AsRef<[u8]>>(h: Bth<T>) {
    black_box((
        h.opcode(),
        h.solicited(),
        h.mig_req(),
        h.pad_count(),
        h.tver(),
    ));
    black_box((
        h.pkey(),
        h.fecn(),
        h.becn(),
        h.dest_qp(),
        h.ack_req(),
        h.psn(),
    ));
    let op = h.opcode();
    black_box((op.info(), op.is_known(), op.transport(), op.name()));
    black_box((op.ext_headers(), op.ext_len(), op.has_payload()));
}

/// Every extension-header view over the same bytes.
fn transport(b: &[u8]) {
    if let Ok(h) = Reth::new_checked(b) {
        black_box((h.va(), h.rkey(), h.dma_len()));
    }
    if let Ok(h) = Aeth::new_checked(b) {
        black_box((h.syndrome_byte(), h.syndrome(), h.msn()));
        let _ = write!(Sink, "{:?}", h.syndrome());
    }
    if let Ok(h) = Deth::new_checked(b) {
        black_box((h.qkey(), h.src_qp()));
    }
    if let Ok(h) = AtomicEth::new_checked(b) {
        black_box((h.va(), h.rkey(), h.swap_add(), h.compare()));
    }
    if let Ok(h) = AtomicAckEth::new_checked(b) {
        black_box(h.orig_value());
    }
    if let Ok(h) = ImmDt::new_checked(b) {
        black_box(h.imm_data());
    }
    if let Ok(h) = Ieth::new_checked(b) {
        black_box(h.rkey());
    }
    if let Ok(h) = Feth::new_checked(b) {
        black_box(h.word());
    }
    if let Ok(h) = CnpBody::new_checked(b) {
        black_box(h.reserved());
    }
}

fn parsed_frame_invariants(data: &[u8]) {
    let Ok(p) = RoceRepr::parse(data) else {
        return;
    };
    let _ = write!(Sink, "{p}");
    let repr = p.repr;
    assert!(p.frame_len <= data.len(), "frame_len beyond input");
    assert_eq!(p.payload.len(), repr.payload_len);
    assert!(p.payload_offset + repr.payload_len <= p.frame_len);
    assert_eq!(
        &data[p.payload_offset..p.payload_offset + repr.payload_len],
        p.payload
    );
    assert_eq!(
        repr.buffer_len(),
        p.frame_len,
        "buffer_len disagrees with the parsed frame"
    );

    // parse ∘ emit = id
    let mut out = vec![0u8; repr.buffer_len()];
    let n = repr
        .emit_with_payload(&mut out, p.payload)
        .unwrap_or_else(|e| panic!("re-emitting a parsed repr failed: {e:?} for {repr:?}"));
    assert_eq!(n, out.len());
    let q = RoceRepr::parse(&out)
        .unwrap_or_else(|e| panic!("re-parsing an emitted frame failed: {e:?} for {repr:?}"));
    assert_eq!(q.repr, repr, "round trip changed the repr");
    assert_eq!(q.payload, p.payload, "round trip changed the payload");

    // HeaderTemplate emit == RoceRepr emit (known opcodes: the template derives PadCnt
    // from the payload length, which only the opcode table makes meaningful).
    if repr.bth.opcode.is_known() {
        let t = HeaderTemplate::from_repr(&repr);
        let hdr = PacketHeader {
            opcode: repr.bth.opcode,
            solicited: repr.bth.solicited,
            ack_req: repr.bth.ack_req,
            psn: repr.bth.psn,
        };
        let mut via_template = vec![0u8; out.len()];
        let m = t
            .emit(&mut via_template, &hdr, &repr.ext, repr.payload_len, |b| {
                b.copy_from_slice(p.payload)
            })
            .unwrap_or_else(|e| panic!("template emit failed: {e:?} for {repr:?}"));
        assert_eq!(m, n);
        assert_eq!(
            via_template, out,
            "template and repr emit differ for {repr:?}"
        );
    }
}

fuzz_target!(|data: &[u8]| {
    let _ = write!(Sink, "{}", PrettyFrame(data));
    views_after_checks(data);
    parsed_frame_invariants(data);
});
