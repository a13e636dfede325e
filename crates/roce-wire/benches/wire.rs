//! Criterion benchmarks of the roce-wire hot paths. Results: `BENCHMARKS.md`.
//!
//! Run: `cargo bench -p roce-wire --bench wire`; smoke run (each benchmark once):
//! `cargo test -p roce-wire --benches`.
//!
//! Groups:
//! * `header`: the Ethernet/IPv4/UDP/BTH bytes of one packet, written from reprs
//!   (what `RoceRepr::emit` does before extension headers, payload and ICRC) versus a
//!   `HeaderTemplate` copy-and-patch (`write_headers`). No ICRC in either.
//! * `frame`: a whole RC SEND_ONLY frame, `RoceRepr::emit` versus `HeaderTemplate::emit`,
//!   ICRC included, for 16 B and 1 KiB payloads.
//! * `icrc`: `roce_wire::icrc::compute` over the IP packet of a RoCE frame with a 64 B,
//!   1 KiB and 4 KiB payload, beside plain `crc32fast::hash` over the same bytes.
//! * `parse`: `RoceRepr::parse` (ICRC verification included) of the same frames.

use std::hint::black_box;
use std::net::Ipv4Addr;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use roce_wire::{
    Bth, BthRepr, Ecn, EtherType, EthernetAddress, EthernetFrame, EthernetRepr, ExtRepr,
    HeaderTemplate, IpRepr, Ipv4Packet, Ipv4Repr, Opcode, PacketHeader, Psn, Qpn, ROCE_V2_PORT,
    RoceRepr, UdpPacket, UdpRepr, bth, icrc, ipv4, udp,
};

/// Payload sizes for the ICRC and parse groups: a small packet, the Soft-RoCE default
/// path MTU (1 KiB) and the largest IB MTU (4 KiB).
const ICRC_SIZES: [usize; 3] = [64, 1024, 4096];
/// Payload sizes for the whole-frame emit group.
const FRAME_SIZES: [usize; 2] = [16, 1024];

/// An RC SEND_ONLY from QP 0x11 to QP 0x12 over IPv4, as `rocev2` would send it
/// (addresses and ports of `testdata/spec/vectors.json`).
fn send_only(payload_len: usize) -> RoceRepr {
    let ip = Ipv4Repr {
        src_addr: Ipv4Addr::new(192, 0, 2, 1),
        dst_addr: Ipv4Addr::new(192, 0, 2, 2),
        dscp: 26,
        ecn: Ecn::Ect0,
        ident: 0,
        dont_frag: true,
        ttl: 64,
        protocol: ipv4::PROTOCOL_UDP,
    };
    RoceRepr {
        eth: EthernetRepr {
            src_addr: EthernetAddress([2, 0, 0, 0, 0, 1]),
            dst_addr: EthernetAddress([2, 0, 0, 0, 0, 2]),
            vlan: None,
            ethertype: EtherType::IPV4,
        },
        ip: IpRepr::Ipv4(ip),
        udp: UdpRepr {
            src_port: roce_wire::udp_sport(Qpn::new(0x11), Qpn::new(0x12), 0),
            dst_port: ROCE_V2_PORT,
        },
        bth: BthRepr {
            opcode: Opcode::RC_SEND_ONLY,
            solicited: false,
            mig_req: false,
            pad_count: HeaderTemplate::pad_for(payload_len) as u8,
            pkey: bth::DEFAULT_PKEY,
            fecn: false,
            becn: false,
            dest_qp: Qpn::new(0x12),
            ack_req: true,
            psn: Psn::new(100),
        },
        ext: ExtRepr::NONE,
        payload_len,
    }
}

fn frame_bytes(payload_len: usize) -> Vec<u8> {
    let repr = send_only(payload_len);
    let payload: Vec<u8> = (0..payload_len).map(|i| (i * 7 + 3) as u8).collect();
    let mut frame = vec![0u8; repr.buffer_len()];
    repr.emit_with_payload(&mut frame, &payload)
        .expect("valid repr");
    frame
}

fn header(c: &mut Criterion) {
    let repr = send_only(16);
    let IpRepr::Ipv4(ip) = repr.ip else {
        unreachable!("send_only builds IPv4")
    };
    let template = HeaderTemplate::from_repr(&repr);
    let mut buf = vec![0u8; repr.buffer_len()];
    let udp_payload_len = repr.udp_payload_len();
    // Untagged Ethernet (14) + IPv4 (20) + UDP (8) + BTH (12).
    let repr_headers = |f: &mut [u8], psn: Psn| {
        let bth = BthRepr { psn, ..repr.bth };
        repr.eth.emit(&mut EthernetFrame::new_unchecked(&mut f[..]));
        ip.emit(
            &mut Ipv4Packet::new_unchecked(&mut f[14..]),
            udp::HEADER_LEN + udp_payload_len,
        );
        repr.udp
            .emit(&mut UdpPacket::new_unchecked(&mut f[34..]), udp_payload_len);
        bth.emit(&mut Bth::new_unchecked(&mut f[42..54]));
    };
    let template_headers = |f: &mut [u8], psn: Psn| {
        let hdr = PacketHeader {
            opcode: Opcode::RC_SEND_ONLY,
            solicited: false,
            ack_req: true,
            psn,
        };
        template.write_headers(f, &hdr, 0, 16).expect("fits")
    };
    // Both paths must write the same 54 header bytes, or the comparison is meaningless.
    let mut other = buf.clone();
    repr_headers(&mut buf, Psn::new(7));
    template_headers(&mut other, Psn::new(7));
    assert_eq!(buf[..54], other[..54], "template and repr headers differ");

    let mut g = c.benchmark_group("header");
    g.throughput(Throughput::Elements(1));
    g.bench_function("repr_emit", |b| {
        let mut psn = Psn::new(0);
        b.iter(|| {
            psn = psn.next();
            repr_headers(black_box(&mut buf[..]), psn);
        })
    });
    g.bench_function("template_patch", |b| {
        let mut psn = Psn::new(0);
        b.iter(|| {
            psn = psn.next();
            template_headers(black_box(&mut buf[..]), psn)
        })
    });
    g.finish();
}

fn frame(c: &mut Criterion) {
    let mut g = c.benchmark_group("frame");
    g.throughput(Throughput::Elements(1));
    for size in FRAME_SIZES {
        let repr = send_only(size);
        let template = HeaderTemplate::from_repr(&repr);
        let payload: Vec<u8> = (0..size).map(|i| i as u8).collect();
        let mut buf = vec![0u8; repr.buffer_len()];
        g.bench_with_input(BenchmarkId::new("repr_emit", size), &size, |b, _| {
            let mut r = repr;
            b.iter(|| {
                r.bth.psn = r.bth.psn.next();
                r.emit(black_box(&mut buf[..]), |p| p.copy_from_slice(&payload))
                    .expect("emit")
            })
        });
        g.bench_with_input(BenchmarkId::new("template_emit", size), &size, |b, _| {
            let mut hdr = PacketHeader {
                opcode: Opcode::RC_SEND_ONLY,
                solicited: false,
                ack_req: true,
                psn: Psn::new(100),
            };
            b.iter(|| {
                hdr.psn = hdr.psn.next();
                template
                    .emit(black_box(&mut buf[..]), &hdr, &ExtRepr::NONE, size, |p| {
                        p.copy_from_slice(&payload)
                    })
                    .expect("emit")
            })
        });
    }
    g.finish();
}

fn icrc_group(c: &mut Criterion) {
    let mut g = c.benchmark_group("icrc");
    for size in ICRC_SIZES {
        let frame = frame_bytes(size);
        let ip = &frame[14..];
        g.throughput(Throughput::Bytes(ip.len() as u64));
        g.bench_with_input(BenchmarkId::new("roce_wire_icrc", size), ip, |b, ip| {
            b.iter(|| icrc::compute(black_box(ip)).expect("valid packet"))
        });
        g.bench_with_input(BenchmarkId::new("crc32fast_raw", size), ip, |b, ip| {
            b.iter(|| crc32fast::hash(black_box(ip)))
        });
    }
    g.finish();
}

fn parse(c: &mut Criterion) {
    let mut g = c.benchmark_group("parse");
    for size in ICRC_SIZES {
        let frame = frame_bytes(size);
        g.throughput(Throughput::Bytes(frame.len() as u64));
        g.bench_with_input(BenchmarkId::new("roce_repr_parse", size), &frame, |b, f| {
            b.iter(|| {
                let p = RoceRepr::parse(black_box(f)).expect("valid frame");
                assert!(p.icrc_ok);
                p.repr.bth.psn
            })
        });
    }
    g.finish();
}

criterion_group!(benches, header, frame, icrc_group, parse);
criterion_main!(benches);
