//! Property tests (STYLE T7): template output equals full `RoceRepr::emit`,
//! emit/parse round trips for random frames, any single-bit error in
//! ICRC-covered bytes is detected, and the parser / pretty printer never
//! panic on arbitrary or mutated bytes.

mod common;

use core::net::{Ipv4Addr, Ipv6Addr};

use proptest::prelude::*;
use roce_wire::*;

fn known_opcodes() -> Vec<Opcode> {
    (0..=255u8).map(Opcode).filter(|o| o.is_known()).collect()
}

fn arb_eth() -> impl Strategy<Value = EthernetRepr> {
    (
        any::<[u8; 6]>(),
        any::<[u8; 6]>(),
        proptest::option::of((0u8..8, any::<bool>(), 0u16..4096)),
    )
        .prop_map(|(s, d, vlan)| EthernetRepr {
            src_addr: EthernetAddress(s),
            dst_addr: EthernetAddress(d),
            vlan: vlan.map(|(pcp, dei, vid)| VlanTag { pcp, dei, vid }),
            ethertype: EtherType::IPV4, // fixed up by arb_repr
        })
}

fn arb_ip() -> impl Strategy<Value = IpRepr> {
    let v4 = (
        any::<u32>(),
        any::<u32>(),
        0u8..64,
        0u8..4,
        any::<u16>(),
        any::<bool>(),
        any::<u8>(),
    )
        .prop_map(|(s, d, dscp, ecn, ident, df, ttl)| {
            IpRepr::Ipv4(Ipv4Repr {
                src_addr: Ipv4Addr::from(s),
                dst_addr: Ipv4Addr::from(d),
                dscp,
                ecn: Ecn::from_bits(ecn),
                ident,
                dont_frag: df,
                ttl,
                protocol: 17,
            })
        });
    let v6 = (
        any::<u128>(),
        any::<u128>(),
        0u8..64,
        0u8..4,
        0u32..(1 << 20),
        any::<u8>(),
    )
        .prop_map(|(s, d, dscp, ecn, fl, hop)| {
            IpRepr::Ipv6(Ipv6Repr {
                src_addr: Ipv6Addr::from(s),
                dst_addr: Ipv6Addr::from(d),
                dscp,
                ecn: Ecn::from_bits(ecn),
                flow_label: fl,
                next_header: 17,
                hop_limit: hop,
            })
        });
    prop_oneof![v4, v6]
}

fn arb_full_ext() -> impl Strategy<Value = ExtRepr> {
    (
        (
            any::<u32>(),
            any::<u32>(),
            any::<u32>(),
            any::<u64>(),
            any::<u32>(),
            any::<u32>(),
        ),
        (any::<u64>(), any::<u32>(), any::<u64>(), any::<u64>()),
        (
            any::<u8>(),
            any::<u32>(),
            any::<u64>(),
            any::<u32>(),
            any::<u32>(),
        ),
    )
        .prop_map(
            |(
                (qkey, sqp, feth, va, rkey, len),
                (ava, arkey, swap, cmp),
                (syn, msn, orig, imm, irkey),
            )| {
                ExtRepr {
                    deth: Some(DethRepr {
                        qkey,
                        src_qp: Qpn::new(sqp),
                    }),
                    feth: Some(FethRepr { word: feth }),
                    reth: Some(RethRepr {
                        va,
                        rkey,
                        dma_len: len,
                    }),
                    atomic_eth: Some(AtomicEthRepr {
                        va: ava,
                        rkey: arkey,
                        swap_add: swap,
                        compare: cmp,
                    }),
                    aeth: Some(AethRepr {
                        syndrome: AethSyndrome::from_byte(syn),
                        msn: Msn::new(msn),
                    }),
                    atomic_ack_eth: Some(AtomicAckEthRepr { orig_value: orig }),
                    immdt: Some(ImmDtRepr { imm_data: imm }),
                    ieth: Some(IethRepr { rkey: irkey }),
                    cnp: Some(CnpRepr),
                }
            },
        )
}

/// Keeps only the headers `opcode` carries.
fn restrict(full: &ExtRepr, opcode: Opcode) -> ExtRepr {
    let h = opcode.ext_headers();
    let keep = |x: ExtHeader| h.contains(x);
    ExtRepr {
        deth: full.deth.filter(|_| keep(ExtHeader::Deth)),
        feth: full.feth.filter(|_| keep(ExtHeader::Feth)),
        reth: full.reth.filter(|_| keep(ExtHeader::Reth)),
        atomic_eth: full.atomic_eth.filter(|_| keep(ExtHeader::AtomicEth)),
        aeth: full.aeth.filter(|_| keep(ExtHeader::Aeth)),
        atomic_ack_eth: full
            .atomic_ack_eth
            .filter(|_| keep(ExtHeader::AtomicAckEth)),
        immdt: full.immdt.filter(|_| keep(ExtHeader::ImmDt)),
        ieth: full.ieth.filter(|_| keep(ExtHeader::Ieth)),
        cnp: full.cnp.filter(|_| keep(ExtHeader::CnpBody)),
    }
}

#[derive(Debug, Clone)]
struct Case {
    repr: RoceRepr,
    payload: Vec<u8>,
}

fn arb_case() -> impl Strategy<Value = Case> {
    let ops = known_opcodes();
    (
        arb_eth(),
        arb_ip(),
        any::<u16>(),
        proptest::sample::select(ops),
        (
            any::<bool>(),
            any::<bool>(),
            any::<u16>(),
            any::<bool>(),
            any::<bool>(),
            any::<u32>(),
            any::<bool>(),
            any::<u32>(),
        ),
        arb_full_ext(),
        0usize..700,
        any::<u8>(),
    )
        .prop_map(
            |(eth, ip, sport, opcode, (se, m, pkey, fecn, becn, qp, a, psn), full, len, seed)| {
                let info = opcode.info().unwrap();
                let payload_len = match info.payload {
                    PayloadRule::None => 0,
                    PayloadRule::Exactly(n) => usize::from(n),
                    _ => len,
                };
                let pad = if info.has_payload() {
                    ((4 - payload_len % 4) % 4) as u8
                } else {
                    0
                };
                let repr = RoceRepr {
                    eth: EthernetRepr {
                        ethertype: ip.ethertype(),
                        ..eth
                    },
                    ip,
                    udp: UdpRepr {
                        src_port: sport,
                        dst_port: ROCE_V2_PORT,
                    },
                    bth: BthRepr {
                        opcode,
                        solicited: se,
                        mig_req: m,
                        pad_count: pad,
                        pkey,
                        fecn,
                        becn,
                        dest_qp: Qpn::new(qp),
                        ack_req: a,
                        psn: Psn::new(psn),
                    },
                    ext: restrict(&full, opcode),
                    payload_len,
                };
                let payload = (0..payload_len)
                    .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
                    .collect();
                Case { repr, payload }
            },
        )
}

fn emit(c: &Case) -> Vec<u8> {
    let mut f = vec![0u8; c.repr.buffer_len()];
    let n = c.repr.emit_with_payload(&mut f, &c.payload).unwrap();
    assert_eq!(n, f.len());
    f
}

/// Byte offsets (from the frame start) that the ICRC does not cover.
fn uncovered(repr: &RoceRepr, len: usize) -> Vec<usize> {
    let ip = repr.eth.header_len();
    let mut v: Vec<usize> = (0..ip).collect();
    let (udp, masked): (usize, Vec<usize>) = match repr.ip {
        IpRepr::Ipv4(_) => (ip + 20, vec![ip + 1, ip + 8, ip + 10, ip + 11]),
        // IPv6 byte 0 holds the version and the top of the (masked) traffic class.
        IpRepr::Ipv6(_) => (ip + 40, vec![ip, ip + 1, ip + 2, ip + 3, ip + 7]),
    };
    v.extend(masked);
    v.extend([udp + 6, udp + 7, udp + 8 + 4]);
    v.extend(len - 4..len); // the ICRC itself
    v
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn template_equals_repr_emit(c in arb_case(), t_op in proptest::sample::select(known_opcodes()), t_psn in any::<u32>()) {
        let full = emit(&c);
        // Build the template from a repr whose per-packet fields differ, to
        // prove they are all patched.
        let mut tbth = c.repr.bth;
        tbth.opcode = t_op;
        tbth.psn = Psn::new(t_psn);
        tbth.solicited = !tbth.solicited;
        tbth.ack_req = !tbth.ack_req;
        tbth.pad_count = 3 - tbth.pad_count;
        let t = HeaderTemplate::new(&c.repr.eth, &c.repr.ip, &c.repr.udp, &tbth);
        let hdr = PacketHeader {
            opcode: c.repr.bth.opcode,
            solicited: c.repr.bth.solicited,
            ack_req: c.repr.bth.ack_req,
            psn: c.repr.bth.psn,
        };
        let mut out = vec![0xA5u8; full.len() + 8];
        let n = t.emit(&mut out, &hdr, &c.repr.ext, c.payload.len(), |b| b.copy_from_slice(&c.payload)).unwrap();
        prop_assert_eq!(n, full.len());
        prop_assert_eq!(&out[..n], &full[..]);
        prop_assert_eq!(t.frame_len(c.repr.ext.byte_len(), c.payload.len()), n);
    }

    #[test]
    fn emit_parse_roundtrip(c in arb_case()) {
        let f = emit(&c);
        let p = RoceRepr::parse(&f).unwrap();
        prop_assert!(p.icrc_ok);
        prop_assert!(p.ip_checksum_ok);
        prop_assert!(p.udp_checksum_ok);
        prop_assert_eq!(p.repr, c.repr);
        prop_assert_eq!(p.payload, &c.payload[..]);
        prop_assert_eq!(p.frame_len, f.len());
        prop_assert_eq!(p.payload_offset, c.repr.header_len());
        common::crosscheck_outer(&f, &p);
        // Light view agrees.
        let v = RoceFrame::new(&f).unwrap();
        prop_assert_eq!(BthRepr::parse(&v.bth()).unwrap(), c.repr.bth);
        prop_assert_eq!(ExtRepr::parse(c.repr.bth.opcode, v.after_bth()).unwrap(), c.repr.ext);
        // Display never panics and names the ICRC status.
        prop_assert!(p.to_string().ends_with("icrc=ok"));
    }

    #[test]
    fn single_bit_errors_are_detected(c in arb_case(), pos in any::<prop::sample::Index>(), bit in 0u8..8) {
        let mut f = emit(&c);
        let skip = uncovered(&c.repr, f.len());
        let candidates: Vec<usize> = (0..f.len()).filter(|i| !skip.contains(i)).collect();
        let i = candidates[pos.index(candidates.len())];
        f[i] ^= 1 << bit;
        // Either the structure is now invalid, or the ICRC catches it.
        if let Ok(p) = RoceRepr::parse(&f) {
            prop_assert!(!p.icrc_ok, "flip at {} not detected: {}", i, p);
        }
    }

    #[test]
    fn masked_bytes_do_not_matter(c in arb_case(), vals in any::<[u8; 8]>()) {
        let mut f = emit(&c);
        let ip = c.repr.eth.header_len();
        let udp = ip + c.repr.ip.header_len();
        match c.repr.ip {
            IpRepr::Ipv4(_) => {
                f[ip + 1] = vals[0];
                f[ip + 8] = vals[1];
                f[ip + 10] = vals[2];
                f[ip + 11] = vals[3];
            }
            IpRepr::Ipv6(_) => {
                f[ip] = 0x60 | (vals[0] & 0x0F);
                f[ip + 1] = vals[1];
                f[ip + 2] = vals[2];
                f[ip + 3] = vals[3];
                f[ip + 7] = vals[4];
            }
        }
        f[udp + 6] = vals[5];
        f[udp + 7] = vals[6];
        f[udp + 8 + 4] = vals[7];
        let p = RoceRepr::parse(&f).unwrap();
        prop_assert!(p.icrc_ok);
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
        let _ = RoceRepr::parse(&bytes);
        let _ = PrettyFrame(&bytes).to_string();
        let _ = icrc::compute(&bytes);
        let _ = icrc::verify(&bytes);
        if let Ok(v) = RoceFrame::new(&bytes) {
            let _ = BthRepr::parse(&v.bth());
            let _ = ExtRepr::parse(v.bth().opcode(), v.after_bth());
        }
    }

    #[test]
    fn mutated_frames_never_panic(
        c in arb_case(),
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6),
        cut in any::<prop::sample::Index>(),
        extra in 0usize..8,
    ) {
        let mut f = emit(&c);
        for (i, v) in edits {
            let i = i.index(f.len());
            f[i] = v;
        }
        let n = cut.index(f.len() + 1);
        let mut g = f[..n].to_vec();
        g.extend(std::iter::repeat_n(0u8, extra));
        let _ = RoceRepr::parse(&g);
        let _ = PrettyFrame(&g).to_string();
        let _ = RoceRepr::parse(&f);
    }
}

/// Writes a classic pcap (Ethernet link type, microsecond timestamps).
fn write_pcap(path: &std::path::Path, frames: &[Vec<u8>]) {
    let mut out = Vec::new();
    out.extend_from_slice(&0xa1b2_c3d4u32.to_le_bytes());
    out.extend_from_slice(&2u16.to_le_bytes());
    out.extend_from_slice(&4u16.to_le_bytes());
    out.extend_from_slice(&0i32.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(&65535u32.to_le_bytes());
    out.extend_from_slice(&1u32.to_le_bytes());
    for (i, f) in frames.iter().enumerate() {
        out.extend_from_slice(&(i as u32).to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes());
        out.extend_from_slice(&(f.len() as u32).to_le_bytes());
        out.extend_from_slice(&(f.len() as u32).to_le_bytes());
        out.extend_from_slice(f);
    }
    std::fs::write(path, out).unwrap();
}

/// Random frames from both emit paths, checked by the independent Python
/// checker (`testdata/tools/check_pcap.py`, bitwise CRC, its own parser).
#[test]
fn independent_checker_accepts_emitted_frames() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    let strategy = arb_case();
    let mut frames = Vec::new();
    for i in 0..300u32 {
        let c = strategy.new_tree(&mut runner).unwrap().current();
        // The checker insists on a syndrome it knows and zero reserved bits,
        // which real senders use; keep the random generator honest elsewhere.
        let mut repr = c.repr;
        let is_ack = repr.bth.opcode == Opcode::RC_ACKNOWLEDGE;
        if let Some(a) = &mut repr.ext.aeth {
            // Reserved syndromes are rejected, and READ responses / ATOMIC
            // ACKs must carry an ACK syndrome.
            if matches!(a.syndrome, AethSyndrome::Reserved(_)) || !is_ack {
                a.syndrome = AethSyndrome::ACK;
            }
        }
        if let Some(f) = &mut repr.ext.feth {
            f.word &= 0x3F;
        }
        let c = Case {
            repr,
            payload: c.payload,
        };
        if i % 2 == 0 {
            frames.push(emit(&c));
        } else {
            let t = HeaderTemplate::from_repr(&c.repr);
            let hdr = PacketHeader {
                opcode: c.repr.bth.opcode,
                solicited: c.repr.bth.solicited,
                ack_req: c.repr.bth.ack_req,
                psn: c.repr.bth.psn,
            };
            let mut f = vec![0u8; c.repr.buffer_len()];
            t.emit(&mut f, &hdr, &c.repr.ext, c.payload.len(), |b| {
                b.copy_from_slice(&c.payload)
            })
            .unwrap();
            frames.push(f);
        }
    }
    let dir = std::env::temp_dir().join(format!("roce-wire-check-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let pcap = dir.join("emitted.pcap");
    write_pcap(&pcap, &frames);
    let checker = common::testdata_dir().join("tools/check_pcap.py");
    let out = std::process::Command::new("python3")
        .arg(&checker)
        .arg("--quiet")
        .arg(&pcap)
        .output()
        .expect("python3 is required for the independent ICRC checker (.ci/run installs it)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        out.status.success(),
        "checker failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains(&format!("{} passed, 0 failed", frames.len())),
        "{stdout}"
    );
}
