//! One test per failure scenario of `docs/spec/SCENARIOS.md` (S01..S20), each driving two real engines over
//! the simulated link and asserting the scenario's "right value" — and, where the issue asks, the whole kind of
//! fault (several PSNs, timeouts, RNR codes, sizes).

use std::time::Duration;

use roce_proto::*;
use roce_tests::*;

const PSN_MASK: u32 = 0xFF_FFFF;

fn psn_add(p: u32, n: u32) -> u32 {
    p.wrapping_add(n) & PSN_MASK
}

/// A connected pair with a 1 MiB MR on each side (a: pattern, b: other pattern).
fn setup(o: &ConnOpts) -> (Pair, End, End, MrInfo, MrInfo) {
    setup_with(PairConfig::default(), o)
}

fn setup_with(cfg: PairConfig, o: &ConnOpts) -> (Pair, End, End, MrInfo, MrInfo) {
    let mut p = Pair::with_config(cfg);
    let (a, b) = connect(&mut p, o);
    let ma = reg(&mut p, a, 1 << 20, |i| (i % 251) as u8);
    let mb = reg(&mut p, b, 1 << 20, |i| ((i % 13) as u8) ^ 0x5a);
    (p, a, b, ma, mb)
}

fn recv(p: &mut Pair, end: End, wr_id: u64, sg: &[Sge]) {
    p.e(end.node)
        .post_recv(end.qpn, &[RecvWr { wr_id, sg_list: sg }])
        .expect("post_recv");
}

fn write_op(mb: &MrInfo, off: u64) -> SendOp {
    SendOp::RdmaWrite {
        remote_addr: mb.addr + off,
        rkey: mb.rkey,
    }
}

fn mr_vec(p: &mut Pair, node: usize, m: &MrInfo) -> Vec<u8> {
    p.e(node).mr_bytes(m.lkey).expect("mr").to_vec()
}

/// Requests (by PSN order of emission) node `from` put on the wire.
fn requests(p: &Pair, from: usize) -> Vec<Pkt> {
    p.sent_by(from)
        .into_iter()
        .filter(Pkt::is_request)
        .collect()
}

// ------------------------------------------------------------------------------------------------ S01

/// S01: the 128-PSN unacked window holds across the 24-bit wrap; all compares are modular.
#[test]
fn s01_psn_window_wrap() {
    for init in [0xFF_FFF0u32, 0xFF_FFFF, 0xFF_FF81, 0xFF_FF00, 0x7F_FFF0] {
        let o = ConnOpts {
            a_psn: Psn::new(init),
            ..ConnOpts::default()
        };
        let (mut p, a, _b, ma, mb) = setup(&o);
        // The peer never answers: every frame B sends is lost.
        p.faults(1).set_tx_faults(FaultConfig {
            loss: 1.0,
            ..FaultConfig::default()
        });
        let len = 250 * 1024u32;
        let sg = [sge(&ma, 0, len)];
        p.a()
            .post_send(a.qpn, &[SendWr::new(1, write_op(&mb, 0), &sg).signaled()])
            .unwrap();
        // Well below the 67 ms local ACK timeout: only first transmissions.
        p.drive_for(Duration::from_millis(5));
        let reqs = requests(&p, 0);
        assert_eq!(
            reqs.len(),
            128,
            "init {init:#x}: exactly max_unacked packets outstanding"
        );
        let want: Vec<u32> = (0..128).map(|i| psn_add(init, i)).collect();
        assert_eq!(
            reqs.iter().map(|r| r.psn).collect::<Vec<_>>(),
            want,
            "init {init:#x}"
        );
        assert_eq!(reqs.last().unwrap().psn, psn_add(init, 127));
        if init == 0xFF_FFF0 {
            assert_eq!(
                reqs.last().unwrap().psn,
                0x00_006F,
                "the scenario's right value"
            );
        }
        assert_eq!(
            p.a().qp_info(a.qpn).unwrap().next_psn,
            Psn::new(psn_add(init, 128))
        );
        // Let the ACKs through: the message completes across the wrap, data intact.
        p.faults(1).set_tx_faults(FaultConfig::default());
        p.drive();
        let wc = poll_all(p.a(), a.cq);
        assert_eq!(
            wc.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
            vec![(1, WcStatus::Success)],
            "init {init:#x}"
        );
        let got = mr_vec(&mut p, 1, &mb);
        let src = mr_vec(&mut p, 0, &ma);
        assert_eq!(&got[..len as usize], &src[..len as usize]);
        assert_eq!(
            p.b().qp_info(_b.qpn).unwrap().epsn,
            Psn::new(psn_add(init, 250))
        );
        // Every emitted PSN lies in [init, init+250) modulo 2^24.
        for r in requests(&p, 0) {
            assert!(
                r.psn.wrapping_sub(init) & PSN_MASK < 250,
                "psn {:#x} outside the message",
                r.psn
            );
        }
    }
}

// ------------------------------------------------------------------------------------------------ S02

/// S02: PadCnt = (−len) mod 4, zero pad bytes on the wire, ICRC over the pad; the receiver accepts.
#[test]
fn s02_icrc_covers_pad() {
    let o = ConnOpts::default();
    let (mut p, a, b, ma, mb) = setup(&o);
    let sizes = [13u32, 1, 2, 3, 4, 5, 1023, 1025, 1026, 1027, 2047];
    for (k, &len) in sizes.iter().enumerate() {
        recv(&mut p, b, k as u64, &[sge(&mb, 0, 4096)]);
        let sg = [sge(&ma, 7, len)];
        p.a()
            .post_send(
                a.qpn,
                &[SendWr::new(k as u64, SendOp::Send, &sg).signaled()],
            )
            .unwrap();
        p.drive();
        let wb = poll_all(p.b(), b.cq);
        assert_eq!(wb.len(), 1, "len {len}");
        assert_eq!(
            (wb[0].status, wb[0].byte_len),
            (WcStatus::Success, len),
            "len {len}"
        );
        let got = mr_vec(&mut p, 1, &mb);
        let src = mr_vec(&mut p, 0, &ma);
        assert_eq!(&got[..len as usize], &src[7..7 + len as usize], "len {len}");
    }
    let reqs = requests(&p, 0);
    let last_packets: Vec<&Pkt> = reqs
        .iter()
        .filter(|r| matches!(r.opcode, 0x02 | 0x04))
        .collect();
    assert_eq!(last_packets.len(), sizes.len());
    for (r, &len) in last_packets.iter().zip(&sizes) {
        let want_pad = ((4 - len % 4) % 4) as u8;
        assert_eq!(r.pad, want_pad, "len {len}");
        assert_eq!(
            r.pad_bytes,
            vec![0; want_pad as usize],
            "len {len}: zero pad bytes"
        );
        assert_eq!((r.transport_len - 12) % 4, 0, "BTH..pad is a multiple of 4");
    }
    // The 13-byte SEND: SEND_ONLY, PadCnt 3, 12 + 13 + 3 transport bytes.
    let first = last_packets[0];
    assert_eq!(
        (first.opcode, first.pad, first.transport_len),
        (0x04, 3, 28)
    );
    // FIRST/MIDDLE packets never carry pad.
    assert!(
        reqs.iter()
            .filter(|r| matches!(r.opcode, 0x00 | 0x01))
            .all(|r| r.pad == 0)
    );
    for c in &p.captured {
        assert!(icrc_ok(&c.frame), "independent ICRC check");
    }
    assert_capture_valid(&p, "s02");
}

// ------------------------------------------------------------------------------------------------ S03

/// S03: ICRC = CRC-32 over the masked pseudo-packet, stored least-significant byte first, on every frame kind.
#[test]
fn s03_icrc_byte_order() {
    // The independent CRC matches the golden vector of ROCEV2.md §3.
    let golden = "0200000000020200000000010800456a003c010040004011b543c0000201c0000202c13212b7002800000400ffff\
                  0000001280000000000102030405060708090a0b0c0d0e0f966aa432";
    let g: Vec<u8> = (0..golden.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&golden[i..i + 2], 16).unwrap())
        .collect();
    assert_eq!(icrc_compute(&g), Some(0x32a4_6a96));
    assert_eq!(&g[g.len() - 4..], &[0x96, 0x6a, 0xa4, 0x32]);
    assert!(icrc_ok(&g));

    // Every frame the engines emit: SEND, WRITE, READ (+responses), atomics, ACKs.
    let (mut p, a, b, ma, mb) = setup(&ConnOpts::default());
    recv(&mut p, b, 1, &[sge(&mb, 0, 8192)]);
    let s1 = [sge(&ma, 0, 3000)];
    let s2 = [sge(&ma, 4096, 777)];
    let s3 = [sge(&ma, 8192, 2500)];
    let s4 = [sge(&ma, 16384, 8)];
    let wrs = [
        SendWr::new(1, SendOp::Send, &s1).signaled(),
        SendWr::new(2, write_op(&mb, 10_000), &s2).signaled(),
        SendWr::new(
            3,
            SendOp::RdmaRead {
                remote_addr: mb.addr + 20_000,
                rkey: mb.rkey,
            },
            &s3,
        )
        .signaled(),
        SendWr::new(
            4,
            SendOp::AtomicFetchAndAdd {
                remote_addr: mb.addr + 64,
                rkey: mb.rkey,
                add: 3,
            },
            &s4,
        )
        .signaled(),
    ];
    p.a().post_send(a.qpn, &wrs).unwrap();
    p.drive();
    assert_eq!(
        poll_all(p.a(), a.cq)
            .iter()
            .filter(|w| w.status == WcStatus::Success)
            .count(),
        4
    );
    let mut kinds = std::collections::BTreeSet::new();
    for c in &p.captured {
        let v = icrc_compute(&c.frame).unwrap();
        let tail = &c.frame[c.frame.len() - 4..];
        assert_eq!(tail, v.to_le_bytes(), "ICRC little-endian on the wire");
        if v.swap_bytes() != v {
            assert_ne!(tail, v.to_be_bytes(), "not big-endian");
        }
        let k = Pkt::parse(&c.frame).unwrap();
        assert!(k.icrc_ok, "roce-wire agrees");
        kinds.insert(k.opcode);
    }
    for op in [0x00u8, 0x02, 0x0A, 0x0C, 0x0D, 0x0F, 0x11, 0x12, 0x14] {
        assert!(kinds.contains(&op), "opcode {op:#04x} exercised");
    }
    assert_capture_valid(&p, "s03");
}

// ------------------------------------------------------------------------------------------------ S12

/// S12: RC packets carry MigReq = 1; a received packet with MigReq = 0 is accepted (ignored).
#[test]
fn s12_migreq_set_and_ignored() {
    let (mut p, a, b, ma, mb) = setup(&ConnOpts::default());
    recv(&mut p, b, 1, &[sge(&mb, 0, 64)]);
    recv(&mut p, b, 2, &[sge(&mb, 64, 64)]);
    let sg = [sge(&ma, 0, 32)];
    p.a()
        .post_send(a.qpn, &[SendWr::new(1, SendOp::Send, &sg).signaled()])
        .unwrap();
    p.drive();
    let all: Vec<Pkt> = p
        .captured
        .iter()
        .filter_map(|c| Pkt::parse(&c.frame))
        .collect();
    assert!(!all.is_empty());
    for k in &all {
        assert!(k.mig_req, "opcode {:#04x}: MigReq must be 1", k.opcode);
    }
    // A second SEND whose MigReq bit is cleared in flight is still accepted.
    let template = p
        .captured
        .iter()
        .find(|c| c.from == 0)
        .unwrap()
        .frame
        .clone();
    p.faults(0).script_tx([Fault::Drop]);
    let sg = [sge(&ma, 100, 32)];
    p.a()
        .post_send(a.qpn, &[SendWr::new(2, SendOp::Send, &sg).signaled()])
        .unwrap();
    p.drive_until(Duration::from_micros(50), |p| {
        p.captured.iter().filter(|c| c.from == 0).count() >= 3
    });
    let orig = p
        .captured
        .iter()
        .rfind(|c| c.from == 0 && Pkt::parse(&c.frame).is_some_and(|k| k.is_request()))
        .unwrap();
    let mut t = transport_of(&orig.frame).to_vec();
    t[1] &= !0x40;
    let crafted = craft(&template, &t);
    assert!(!Pkt::parse(&crafted).unwrap().mig_req);
    let now = p.now;
    p.nodes[0].link.transmit(now, &crafted).unwrap();
    p.drive();
    let wb = poll_all(p.b(), b.cq);
    assert_eq!(
        wb.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        vec![(1, WcStatus::Success), (2, WcStatus::Success)]
    );
    let got = mr_vec(&mut p, 1, &mb);
    let src = mr_vec(&mut p, 0, &ma);
    assert_eq!(&got[64..96], &src[100..132]);
}

// ------------------------------------------------------------------------------------------------ S13

/// S13: UDP dst 4791; src port per QP in 0xC000..=0xFFFF, stable for all its packets (incl. retransmissions),
/// different across QPs.
#[test]
fn s13_udp_source_port_entropy() {
    let mut p = Pair::new();
    let o = ConnOpts::default();
    let mut conns = Vec::new();
    for _ in 0..4 {
        let (a, b) = connect(&mut p, &o);
        let ma = reg(&mut p, a, 64 * 1024, |i| i as u8);
        let mb = reg(&mut p, b, 64 * 1024, |_| 0);
        conns.push((a, b, ma, mb));
    }
    // Some loss so retransmissions happen.
    p.faults(0).set_tx_faults(FaultConfig {
        loss: 0.2,
        ..FaultConfig::default()
    });
    for (i, (a, _, ma, mb)) in conns.iter().enumerate() {
        let sg = [sge(ma, 0, 20_000)];
        p.a()
            .post_send(
                a.qpn,
                &[SendWr::new(i as u64, write_op(mb, 0), &sg).signaled()],
            )
            .unwrap();
    }
    p.drive();
    let mut ports = Vec::new();
    for (a, b, _, _) in &conns {
        assert_eq!(poll_all(p.a(), a.cq)[0].status, WcStatus::Success);
        let pk: Vec<Pkt> = p
            .sent_by(0)
            .into_iter()
            .filter(|k| k.dest_qp == b.qpn.value())
            .collect();
        assert!(pk.len() >= 20);
        let sport = pk[0].sport;
        assert!(
            pk.iter().all(|k| k.sport == sport && k.dport == 4791),
            "one source port per QP, dport 4791"
        );
        assert!((0xC000..=0xFFFF).contains(&sport), "{sport:#x}");
        ports.push(sport);
    }
    assert!(
        p.a().counters().retransmitted_pkts > 0,
        "retransmissions were exercised"
    );
    let mut uniq = ports.clone();
    uniq.sort_unstable();
    uniq.dedup();
    assert_eq!(uniq.len(), 4, "ports differ across QPs: {ports:x?}");
}

// ------------------------------------------------------------------------------------------------ S14

/// S14: a zero-length message is one ONLY packet consuming one PSN (SEND, SEND_IMM, WRITE with RETH length 0,
/// READ of 0 bytes).
#[test]
fn s14_zero_length_psn() {
    let (mut p, a, b, ma, mb) = setup(&ConnOpts::default());
    for i in 0..3 {
        recv(&mut p, b, i, &[sge(&mb, 0, 64)]);
    }
    let none: [Sge; 0] = [];
    let ten = [sge(&ma, 0, 10)];
    let wrs = [
        SendWr::new(1, SendOp::Send, &none).signaled(),
        SendWr::new(2, SendOp::Send, &ten).signaled(),
        SendWr::new(3, write_op(&mb, 100), &none).signaled(),
        SendWr::new(4, SendOp::SendWithImm { imm: 7 }, &none).signaled(),
        SendWr::new(
            5,
            SendOp::RdmaRead {
                remote_addr: mb.addr,
                rkey: mb.rkey,
            },
            &none,
        )
        .signaled(),
        SendWr::new(6, write_op(&mb, 200), &ten).signaled(),
    ];
    p.a().post_send(a.qpn, &wrs).unwrap();
    p.drive();
    let wa = poll_all(p.a(), a.cq);
    assert_eq!(
        wa.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        (1..=6).map(|i| (i, WcStatus::Success)).collect::<Vec<_>>()
    );
    let r = requests(&p, 0);
    let got: Vec<(u8, u32, usize, u8)> = r
        .iter()
        .map(|k| (k.opcode, k.psn, k.payload.len(), k.pad))
        .collect();
    assert_eq!(
        got,
        vec![
            (0x04, 100, 0, 0),
            (0x04, 101, 10, 2),
            (0x0A, 102, 0, 0),
            (0x05, 103, 0, 0),
            (0x0C, 104, 0, 0),
            (0x0A, 105, 10, 2)
        ]
    );
    assert_eq!(
        r[2].reth.map(|x| x.2),
        Some(0),
        "zero-length WRITE carries RETH length 0"
    );
    assert_eq!(r[4].reth.map(|x| x.2), Some(0));
    let resp: Vec<Pkt> = p
        .sent_by(1)
        .into_iter()
        .filter(|k| k.opcode == 0x10)
        .collect();
    assert_eq!(resp.len(), 1, "zero-length READ: one READ RESPONSE ONLY");
    assert!(resp[0].payload.is_empty());
    assert_eq!(p.a().qp_info(a.qpn).unwrap().next_psn, Psn::new(106));
    let wb = poll_all(p.b(), b.cq);
    assert_eq!(
        wb.iter().map(|w| w.byte_len).collect::<Vec<_>>(),
        vec![0, 10, 0]
    );
}

// ------------------------------------------------------------------------------------------------ timers

/// RNR NAK timer codes in µs (`ROCEV2.md §4.2`, IBTA table; code 0 is the longest).
const RNR_US: [u64; 32] = [
    655_360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1280, 1920, 2560, 3840,
    5120, 7680, 10_240, 15_360, 20_480, 30_720, 40_960, 61_440, 81_920, 122_880, 163_840, 245_760,
    327_680, 491_520,
];

/// Local ACK timeout 4.096 µs · 2^t (`ROCEV2.md §4.2`).
fn ack_timeout(t: u8) -> Duration {
    Duration::from_nanos(4096 << t)
}

/// Capture times of node `from`'s packets matching `f`.
fn times_of(p: &Pair, from: usize, f: impl Fn(&Pkt) -> bool) -> Vec<Instant> {
    p.captured
        .iter()
        .filter(|c| c.from == from)
        .filter(|c| Pkt::parse(&c.frame).is_some_and(|k| f(&k)))
        .map(|c| c.at)
        .collect()
}

/// One-way delay of a frame of `len` bytes on the default sim link (1 µs + serialisation at 100 Gb/s).
fn wire_delay(len: usize) -> Duration {
    Duration::from_micros(1) + Duration::from_nanos(((len.max(60) + 24) * 8 / 100) as u64)
}

// ------------------------------------------------------------------------------------------------ S04

/// S04: after an RNR NAK the requester waits the advertised RNR delay (not its ACK timeout), for every code;
/// rnr_retry 7 never exhausts; rnr_retry < 7 ends in RNR_RETRY_EXC_ERR after exactly that many retries.
#[test]
fn s04_rnr_retry_waits_the_rnr_timer() {
    for code in [14u8, 1, 8, 12, 18, 0] {
        // ACK timeout 8 (≈1.05 ms) is shorter than the 1.28 ms of code 14: the bug resent on the ACK timer.
        let o = ConnOpts {
            min_rnr_timer: code,
            timeout: 8,
            rnr_retry: 7,
            ..ConnOpts::default()
        };
        let (mut p, a, b, ma, mb) = setup(&o);
        let sg = [sge(&ma, 0, 100)];
        p.a()
            .post_send(a.qpn, &[SendWr::new(1, SendOp::Send, &sg).signaled()])
            .unwrap();
        let naks_wanted = 5;
        let ok = p.drive_until(Duration::from_secs(10), |p| {
            times_of(p, 1, |k| k.aeth.is_some_and(|x| x.0 >> 5 == 1)).len() >= naks_wanted
        });
        assert!(ok, "code {code}: RNR NAKs keep coming");
        // Let the last NAK reach the requester (less than the shortest RNR delay).
        p.drive_for(Duration::from_micros(5));
        let naks: Vec<(Instant, Pkt)> = p
            .captured
            .iter()
            .filter(|c| c.from == 1)
            .filter_map(|c| Pkt::parse(&c.frame).map(|k| (c.at, k)))
            .filter(|(_, k)| k.aeth.is_some_and(|x| x.0 >> 5 == 1))
            .collect();
        for (_, k) in &naks {
            assert_eq!(
                k.aeth.unwrap().0,
                0x20 | code,
                "syndrome carries the responder's min_rnr_timer"
            );
            assert_eq!(k.psn, 100, "RNR NAK names the rejected PSN");
        }
        let sends = times_of(&p, 0, |k| k.opcode == 0x04 && k.psn == 100);
        let delay = Duration::from_micros(RNR_US[code as usize]);
        for (i, (t_nak, k)) in naks.iter().enumerate() {
            let arrival = *t_nak + wire_delay(k.transport_len + 46);
            let next = sends.iter().find(|&&t| t > *t_nak).copied();
            let Some(next) = next else {
                assert_eq!(
                    i,
                    naks.len() - 1,
                    "code {code}: a retry follows every NAK but the last seen"
                );
                continue;
            };
            let gap = next - arrival;
            assert!(
                gap >= delay,
                "code {code}: retry {gap:?} after the NAK, must wait {delay:?}"
            );
            assert!(
                gap <= delay + Duration::from_micros(20),
                "code {code}: retry late: {gap:?} vs {delay:?}"
            );
        }
        assert!(
            poll_all(p.a(), a.cq).is_empty(),
            "rnr_retry 7 never exhausts"
        );
        assert_eq!(p.counters(0).rcvd_rnr_err, p.counters(1).send_rnr_err);
        assert_eq!(
            p.b().counters().send_rnr_err as usize,
            times_of(&p, 1, |k| k.aeth.is_some_and(|x| x.0 >> 5 == 1)).len()
        );
        // A receive WR ends it.
        recv(&mut p, b, 9, &[sge(&mb, 0, 128)]);
        p.drive();
        let wa = poll_all(p.a(), a.cq);
        assert_eq!(
            wa.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
            vec![(1, WcStatus::Success)],
            "code {code}"
        );
    }
    // Finite rnr_retry: exactly that many retries, then RNR_RETRY_EXC_ERR and ERR; the rest is flushed.
    for rnr_retry in [0u8, 1, 3, 6] {
        let o = ConnOpts {
            min_rnr_timer: 1,
            rnr_retry,
            ..ConnOpts::default()
        };
        let (mut p, a, _b, ma, _mb) = setup(&o);
        let sg = [sge(&ma, 0, 100)];
        let sg2 = [sge(&ma, 200, 100)];
        p.a()
            .post_send(
                a.qpn,
                &[
                    SendWr::new(1, SendOp::Send, &sg).signaled(),
                    SendWr::new(2, SendOp::Send, &sg2).signaled(),
                ],
            )
            .unwrap();
        p.drive();
        let wa = poll_all(p.a(), a.cq);
        assert_eq!(
            wa.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
            vec![(1, WcStatus::RnrRetryExcErr), (2, WcStatus::WrFlushErr)],
            "rnr_retry {rnr_retry}"
        );
        assert_eq!(
            times_of(&p, 0, |k| k.psn == 100 && k.is_request()).len(),
            1 + rnr_retry as usize,
            "rnr_retry {rnr_retry}"
        );
        assert_eq!(p.a().counters().rcvd_rnr_err, 1 + u64::from(rnr_retry));
        assert_eq!(p.a().counters().retry_rnr_exceeded_err, 1);
        assert_eq!(p.a().qp_info(a.qpn).unwrap().state, QpState::Err);
    }
}

// ------------------------------------------------------------------------------------------------ S05

fn s05_run(refuse_second: bool, busy: f64) -> (Vec<Vec<u8>>, Vec<u8>, u64) {
    let cfg = PairConfig {
        tx_budget: 1,
        ..PairConfig::default()
    };
    let (mut p, a, b, ma, mb) = setup_with(cfg, &ConnOpts::default());
    recv(&mut p, b, 1, &[sge(&mb, 0, 8192)]);
    if busy > 0.0 {
        p.faults(0).set_tx_faults(FaultConfig {
            busy,
            ..FaultConfig::default()
        });
    }
    let sg = [
        sge(&ma, 0, 1500),
        sge(&ma, 3000, 1500),
        sge(&ma, 7001, 1500),
    ];
    p.a()
        .post_send(a.qpn, &[SendWr::new(1, SendOp::Send, &sg).signaled()])
        .unwrap();
    if refuse_second {
        assert!(p.drive_until(Duration::from_millis(1), |p| {
            p.captured.iter().any(|c| c.from == 0)
        }));
        p.refuse_tx[0] = 1;
    }
    p.drive();
    assert_eq!(poll_all(p.a(), a.cq)[0].status, WcStatus::Success);
    assert_eq!(poll_all(p.b(), b.cq)[0].byte_len, 4500);
    let frames = p
        .captured
        .iter()
        .filter(|c| c.from == 0)
        .map(|c| c.frame.clone())
        .collect();
    let got = mr_vec(&mut p, 1, &mb)[..4500].to_vec();
    (frames, got, p.a().counters().tx_refused)
}

/// S05: a transmit refused by the link (busy) or by a too-small buffer consumes no PSN and the frame that is
/// finally sent is byte-identical to the one an undisturbed run sends.
#[test]
fn s05_backpressure_keeps_sge_cursor() {
    let (reference, data, refused) = s05_run(false, 0.0);
    assert_eq!(refused, 0);
    assert_eq!(
        reference
            .iter()
            .filter(|f| Pkt::parse(f).unwrap().is_request())
            .count(),
        5,
        "4500 B at PMTU 1024"
    );
    let mut want = Vec::new();
    {
        let (mut p, a, _, ma, _) = setup(&ConnOpts::default());
        let _ = a;
        let src = mr_vec(&mut p, 0, &ma);
        for (o, l) in [(0, 1500), (3000, 1500), (7001, 1500)] {
            want.extend_from_slice(&src[o..o + l]);
        }
    }
    assert_eq!(data, want, "the message arrives byte-identical");
    // Engine-level refusal of the 2nd packet.
    let (frames, data2, refused) = s05_run(true, 0.0);
    assert_eq!(refused, 1, "tx_refused counts the refusal");
    assert_eq!(frames, reference, "same PSNs, same bytes");
    assert_eq!(data2, want);
    // Link-level back-pressure (tx_buf busy) on ~half the attempts.
    let (frames, data3, _) = s05_run(false, 0.5);
    assert_eq!(frames, reference);
    assert_eq!(data3, want);
}

// ------------------------------------------------------------------------------------------------ S15

/// S15: local ACK timeout = 4.096 µs · 2^timeout; exactly retry_cnt retransmissions; then RETRY_EXC_ERR, ERR,
/// the rest flushed; timeout 0 = no retransmission timer.
#[test]
fn s15_local_ack_timeout() {
    for timeout in [8u8, 10, 14, 18] {
        let o = ConnOpts {
            timeout,
            retry_cnt: 3,
            ..ConnOpts::default()
        };
        let (mut p, a, b, ma, mb) = setup(&o);
        for i in 0..3 {
            recv(&mut p, b, i, &[sge(&mb, 0, 4096)]);
        }
        // The peer silently drops everything.
        p.faults(0).set_tx_faults(FaultConfig {
            loss: 1.0,
            ..FaultConfig::default()
        });
        let sgs: Vec<[Sge; 1]> = (0..3).map(|i| [sge(&ma, i * 100, 100)]).collect();
        let wrs: Vec<SendWr> = sgs
            .iter()
            .enumerate()
            .map(|(i, s)| SendWr::new(i as u64 + 1, SendOp::Send, s).signaled())
            .collect();
        let before = p.a().counters().clone();
        p.a().post_send(a.qpn, &wrs).unwrap();
        let t_post = p.now;
        assert!(
            p.drive_until(Duration::from_secs(100), |p| p.a().cq_len(a.cq) > 0),
            "timeout {timeout}"
        );
        let t_err = p.now;
        p.drive();
        let tx = times_of(&p, 0, |k| k.psn == 100 && k.is_request());
        assert_eq!(
            tx.len(),
            4,
            "timeout {timeout}: 1 + retry_cnt transmissions of the first PSN"
        );
        let t = ack_timeout(timeout);
        let slack = Duration::from_micros(10);
        for w in tx.windows(2) {
            let gap = w[1] - w[0];
            assert!(
                gap >= t && gap <= t + slack,
                "timeout {timeout}: gap {gap:?}, want {t:?}"
            );
        }
        let e = t_err - tx[3];
        assert!(
            e >= t && e <= t + slack,
            "timeout {timeout}: error after {e:?}"
        );
        assert!(tx[0] - t_post < slack);
        let wa = poll_all(p.a(), a.cq);
        assert_eq!(
            wa.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
            vec![
                (1, WcStatus::RetryExcErr),
                (2, WcStatus::WrFlushErr),
                (3, WcStatus::WrFlushErr)
            ],
            "timeout {timeout}"
        );
        assert_eq!(p.a().qp_info(a.qpn).unwrap().state, QpState::Err);
        let c = p.a().counters().clone();
        assert_eq!(
            c.local_ack_timeout_err - before.local_ack_timeout_err,
            4,
            "one per expiry, the last one gives up"
        );
        assert_eq!(c.retry_exceeded_err - before.retry_exceeded_err, 1);
        if timeout == 14 {
            assert_eq!(t, Duration::from_nanos(67_108_864), "≈67.1 ms");
        }
    }
    // timeout 0: infinite — no retransmission ever, no completion.
    let o = ConnOpts {
        timeout: 0,
        retry_cnt: 3,
        ..ConnOpts::default()
    };
    let (mut p, a, _b, ma, mb) = setup(&o);
    p.faults(0).set_tx_faults(FaultConfig {
        loss: 1.0,
        ..FaultConfig::default()
    });
    let sg = [sge(&ma, 0, 100)];
    p.a()
        .post_send(a.qpn, &[SendWr::new(1, write_op(&mb, 0), &sg).signaled()])
        .unwrap();
    p.drive_for(Duration::from_secs(3600));
    assert_eq!(times_of(&p, 0, Pkt::is_request).len(), 1);
    assert!(poll_all(p.a(), a.cq).is_empty());
    assert_eq!(p.a().qp_info(a.qpn).unwrap().state, QpState::Rts);
}

// ------------------------------------------------------------------------------------------------ S19

/// S19: RNR storm with min_rnr_timer 1 (10 µs) and infinite rnr_retry for 1 s of virtual time: retries no faster
/// than the advertised delay, counters agree with the NAKs on the wire, bounded work, ends when a RECV is posted.
#[test]
fn s19_rnr_storm_bounded() {
    let o = ConnOpts {
        min_rnr_timer: 1,
        rnr_retry: 7,
        ..ConnOpts::default()
    };
    let (mut p, a, b, ma, mb) = setup(&o);
    let sg = [sge(&ma, 0, 64)];
    p.a()
        .post_send(a.qpn, &[SendWr::new(1, SendOp::Send, &sg).signaled()])
        .unwrap();
    let wall = std::time::Instant::now();
    let t0 = p.now;
    let steps0 = p.steps;
    p.drive_for(Duration::from_secs(1));
    let elapsed = p.now - t0;
    let tries = times_of(&p, 0, |k| k.is_request());
    let naks = times_of(&p, 1, |k| k.aeth.is_some_and(|x| x.0 >> 5 == 1));
    let max = (elapsed.as_micros() / 10) as usize + 1;
    assert!(
        tries.len() <= max,
        "{} retries in {elapsed:?} exceeds one per 10 µs",
        tries.len()
    );
    assert!(
        tries.len() >= max / 2,
        "{} retries: the requester must keep retrying (rnr_retry 7)",
        tries.len()
    );
    for w in tries.windows(2) {
        assert!(
            w[1] - w[0] >= Duration::from_micros(10),
            "retry faster than the RNR delay"
        );
    }
    assert_eq!(p.a().counters().rcvd_rnr_err as usize, naks.len());
    assert_eq!(p.b().counters().send_rnr_err as usize, naks.len());
    let steps = p.steps - steps0;
    assert!(
        steps < 10 * tries.len() as u64 + 1000,
        "bounded work: {steps} steps for {} retries",
        tries.len()
    );
    println!(
        "s19: {} retries, {} RNR NAKs in {elapsed:?} virtual, {steps} steps, {:?} wall",
        tries.len(),
        naks.len(),
        wall.elapsed()
    );
    recv(&mut p, b, 7, &[sge(&mb, 0, 64)]);
    p.drive();
    assert_eq!(poll_all(p.a(), a.cq)[0].status, WcStatus::Success);
    assert_eq!(poll_all(p.b(), b.cq)[0].status, WcStatus::Success);
}

// ------------------------------------------------------------------------------------------------ S06

/// Checks the segmentation rules of `ROCEV2.md §2.1` / §5 on every request a node emitted.
fn assert_requests_well_formed(reqs: &[Pkt], pmtu: usize) {
    for r in reqs {
        let n = r.payload.len();
        match r.opcode & 0x1F {
            0x00 | 0x01 | 0x06 | 0x07 => {
                assert_eq!(n, pmtu, "FIRST/MIDDLE carry exactly PMTU: {r:?}")
            }
            0x02 | 0x03 | 0x08 | 0x09 | 0x16 => {
                assert!((1..=pmtu).contains(&n), "LAST carries 1..PMTU: {r:?}")
            }
            0x04 | 0x05 | 0x0A | 0x0B | 0x17 => assert!(n <= pmtu, "ONLY carries ≤ PMTU: {r:?}"),
            _ => assert_eq!(n, 0, "no payload: {r:?}"),
        }
        if let Some((_, _, len)) = r.reth {
            assert!(len <= 1 << 31, "RETH length ≤ 2^31");
        }
    }
}

/// Sends one message from a whose request frames are all dropped, injects `crafted(originals)` instead, and
/// returns a's completions plus b's frames.
fn s06_case(
    msg: u32,
    write: bool,
    craft_fn: impl Fn(&[Vec<u8>]) -> Vec<Vec<u8>>,
) -> (Vec<Wc>, Vec<Pkt>, QpState) {
    let (mut p, a, b, ma, mb) = setup(&ConnOpts::default());
    recv(&mut p, b, 1, &[sge(&mb, 0, 8192)]);
    let npk = msg.div_ceil(1024).max(1) as usize;
    p.faults(0).script_tx(std::iter::repeat_n(Fault::Drop, npk));
    let sg = [sge(&ma, 0, msg)];
    let op = if write {
        write_op(&mb, 0)
    } else {
        SendOp::Send
    };
    p.a()
        .post_send(a.qpn, &[SendWr::new(1, op, &sg).signaled()])
        .unwrap();
    assert!(p.drive_until(Duration::from_millis(1), |p| {
        p.captured.iter().filter(|c| c.from == 0).count() >= npk
    }));
    let originals: Vec<Vec<u8>> = p
        .captured
        .iter()
        .filter(|c| c.from == 0)
        .map(|c| c.frame.clone())
        .collect();
    for f in craft_fn(&originals) {
        let now = p.now;
        p.nodes[0].link.transmit(now, &f).unwrap();
    }
    p.drive();
    let st = p.b().qp_info(b.qpn).unwrap().state;
    (poll_all(p.a(), a.cq), p.sent_by(1), st)
}

/// Replaces the payload (and pad) of a frame's transport, keeping BTH and extension headers.
fn with_payload(frame: &[u8], opcode: u8, payload_len: usize) -> Vec<u8> {
    let t = transport_of(frame);
    let info = roce_wire::Opcode(opcode).info().expect("known opcode");
    let hdr = 12 + info.ext.byte_len();
    let mut n = t[..hdr.min(t.len())].to_vec();
    n.resize(hdr, 0);
    n[0] = opcode;
    let pad = (4 - payload_len % 4) % 4;
    n[1] = (n[1] & !0x30) | ((pad as u8) << 4);
    n.extend((0..payload_len).map(|i| i as u8));
    n.extend(std::iter::repeat_n(0, pad));
    craft(frame, &n)
}

/// S06: the responder enforces FIRST/MIDDLE = PMTU, LAST 1..PMTU, ONLY ≤ PMTU, RETH length ≤ 2^31 with NAK
/// invalid request (0x61) → requester REM_INV_REQ_ERR; and the requester never emits such packets.
#[test]
fn s06_responder_length_checks() {
    let nak = |frames: &[Pkt], psn: u32| {
        frames
            .iter()
            .any(|k| k.opcode == 0x11 && k.aeth.map(|x| x.0) == Some(0x61) && k.psn == psn)
    };
    // SEND_FIRST with 1000 B on a PMTU-1024 QP.
    let (wc, bf, st) = s06_case(2000, false, |o| vec![with_payload(&o[0], 0x00, 1000)]);
    assert!(nak(&bf, 100), "FIRST 1000 B → NAK 0x61: {bf:?}");
    assert_eq!((wc[0].wr_id, wc[0].status), (1, WcStatus::RemInvReqErr));
    assert_eq!(
        st,
        QpState::Err,
        "class C error moves the responder QP to ERR"
    );
    // SEND_LAST with 0 B.
    let (wc, bf, _) = s06_case(2000, false, |o| {
        vec![o[0].clone(), with_payload(&o[1], 0x02, 0)]
    });
    assert!(nak(&bf, 101), "LAST 0 B → NAK 0x61: {bf:?}");
    assert_eq!(wc[0].status, WcStatus::RemInvReqErr);
    // SEND_ONLY with 1025 B.
    let (wc, bf, _) = s06_case(1000, false, |o| vec![with_payload(&o[0], 0x04, 1025)]);
    assert!(nak(&bf, 100), "ONLY 1025 B → NAK 0x61: {bf:?}");
    assert_eq!(wc[0].status, WcStatus::RemInvReqErr);
    // SEND_MIDDLE of 1020 B inside a 3-packet message.
    let (wc, bf, _) = s06_case(3000, false, |o| {
        vec![o[0].clone(), with_payload(&o[1], 0x01, 1020)]
    });
    assert!(nak(&bf, 101), "MIDDLE 1020 B → NAK 0x61: {bf:?}");
    assert_eq!(wc[0].status, WcStatus::RemInvReqErr);
    // WRITE_ONLY with RETH length 2^31 + 1.
    let (wc, bf, _) = s06_case(100, true, |o| {
        let mut t = transport_of(&o[0]).to_vec();
        t[12 + 12..12 + 16].copy_from_slice(&((1u32 << 31) + 1).to_be_bytes());
        vec![craft(&o[0], &t)]
    });
    assert!(nak(&bf, 100), "RETH length 2^31+1 → NAK 0x61: {bf:?}");
    assert_eq!(wc[0].status, WcStatus::RemInvReqErr);

    // Requester side: nothing it emits breaks these rules, over many sizes and both PMTUs.
    for mtu in [Mtu::Mtu256, Mtu::Mtu1024, Mtu::Mtu4096] {
        let o = ConnOpts {
            mtu,
            ..ConnOpts::default()
        };
        let (mut p, a, b, ma, mb) = setup(&o);
        let sizes = [
            0u32, 1, 255, 256, 257, 1023, 1024, 1025, 4095, 4096, 4097, 12_345,
        ];
        for (i, &n) in sizes.iter().enumerate() {
            recv(&mut p, b, i as u64, &[sge(&mb, 0, 16_384)]);
            let sg = [sge(&ma, 0, n)];
            p.a()
                .post_send(
                    a.qpn,
                    &[
                        SendWr::new(i as u64, SendOp::Send, &sg),
                        SendWr::new(100 + i as u64, write_op(&mb, 20_000), &sg),
                    ],
                )
                .unwrap();
            p.drive();
        }
        assert_requests_well_formed(&requests(&p, 0), mtu.bytes() as usize);
        let reads: Vec<Pkt> = p
            .sent_by(1)
            .into_iter()
            .filter(|k| (0x0D..=0x10).contains(&k.opcode))
            .collect();
        assert!(reads.is_empty());
    }
}

// ------------------------------------------------------------------------------------------------ S07 / S17

fn ud_pair() -> (Pair, End, End, MrInfo, MrInfo, UdDest) {
    let o = ConnOpts {
        qp_type: QpType::Ud,
        ..ConnOpts::default()
    };
    let (mut p, a, b, ma, mb) = setup(&o);
    let dest = ud_dest(&mut p, a, b, o.qkey);
    (p, a, b, ma, mb, dest)
}

/// S07: a UD payload larger than the posted receive buffer is dropped silently and counted; the QP stays RTS;
/// no CQE and no receive WR are consumed; the next fitting message is received normally.
#[test]
fn s07_ud_oversize_dropped() {
    for (big, small) in [(1024u32, 216u32), (217, 216), (1000, 1)] {
        let (mut p, a, b, ma, mb, dest) = ud_pair();
        recv(&mut p, b, 5, &[sge(&mb, 0, 256)]);
        let sg = [sge(&ma, 0, big)];
        p.a()
            .post_send(
                a.qpn,
                &[SendWr::new(1, SendOp::Send, &sg).signaled().ud(dest)],
            )
            .unwrap();
        p.drive();
        assert_eq!(
            p.counters(1).drop_ud_too_long,
            1,
            "{big} B into 256 B (incl. 40 B GRH)"
        );
        assert!(poll_all(p.b(), b.cq).is_empty(), "no CQE");
        let info = p.b().qp_info(b.qpn).unwrap();
        assert_eq!(
            (info.state, info.rq_outstanding),
            (QpState::Rts, 1),
            "QP in RTS, RECV still posted"
        );
        assert_eq!(
            poll_all(p.a(), a.cq)[0].status,
            WcStatus::Success,
            "UD send completes locally"
        );
        let sg = [sge(&ma, 1000, small)];
        p.a()
            .post_send(
                a.qpn,
                &[SendWr::new(2, SendOp::Send, &sg).signaled().ud(dest)],
            )
            .unwrap();
        p.drive();
        let wb = poll_all(p.b(), b.cq);
        assert_eq!(wb.len(), 1);
        assert_eq!(
            (wb[0].wr_id, wb[0].status, wb[0].byte_len),
            (5, WcStatus::Success, small + 40)
        );
        assert_eq!(wb[0].src_qp, a.qpn);
        let got = mr_vec(&mut p, 1, &mb);
        let src = mr_vec(&mut p, 0, &ma);
        assert_eq!(
            &got[40..40 + small as usize],
            &src[1000..1000 + small as usize]
        );
    }
}

/// S17: UD receives place a 40-byte GRH area first (IPv4 header in its last 20 bytes); byte_len = payload + 40;
/// a buffer of exactly the payload size is too small (LOC_LEN_ERR or a counted drop).
#[test]
fn s17_ud_grh_area() {
    for payload in [1024u32, 256, 1] {
        // Too small: room for the payload but not the GRH area.
        let (mut p, a, b, ma, mb, dest) = ud_pair();
        recv(&mut p, b, 1, &[sge(&mb, 0, payload)]);
        let sg = [sge(&ma, 0, payload)];
        p.a()
            .post_send(
                a.qpn,
                &[SendWr::new(1, SendOp::Send, &sg).signaled().ud(dest)],
            )
            .unwrap();
        p.drive();
        let wb = poll_all(p.b(), b.cq);
        let dropped = p.counters(1).drop_ud_too_long;
        match wb.as_slice() {
            [] => assert_eq!(dropped, 1, "too small: dropped and counted"),
            [w] => assert_eq!(
                (w.wr_id, w.status),
                (1, WcStatus::LocLenErr),
                "too small: LOC_LEN_ERR"
            ),
            _ => panic!("{wb:?}"),
        }
        // Room for the GRH area (in two SGEs, to check the scatter too).
        let (mut p, a, b, ma, mb, dest) = ud_pair();
        p.e(1).mr_write(mb.lkey, 0, &[0xEE; 2048]).unwrap();
        recv(
            &mut p,
            b,
            2,
            &[sge(&mb, 0, 30), sge(&mb, 4096, payload + 10)],
        );
        p.a()
            .post_send(
                a.qpn,
                &[SendWr::new(2, SendOp::Send, &sg).signaled().ud(dest)],
            )
            .unwrap();
        p.drive();
        let wb = poll_all(p.b(), b.cq);
        assert_eq!(wb.len(), 1, "payload {payload}");
        let w = wb[0];
        assert_eq!((w.status, w.byte_len), (WcStatus::Success, payload + 40));
        assert!(w.wc_flags.contains(WcFlags::GRH));
        assert_eq!(w.network_hdr_type, 2, "IPv4, as mlx5 reports it in wc.sl");
        let got = mr_vec(&mut p, 1, &mb);
        let mut area = got[..30].to_vec();
        area.extend_from_slice(&got[4096..4096 + payload as usize + 10]);
        let grh = &area[..40];
        assert_eq!(
            grh[20] >> 4,
            4,
            "IPv4 header in the last 20 bytes of the GRH area"
        );
        assert_eq!(&grh[20 + 12..20 + 16], &ip(0));
        assert_eq!(&grh[20 + 16..20 + 20], &ip(1));
        let src = mr_vec(&mut p, 0, &ma);
        assert_eq!(&area[40..40 + payload as usize], &src[..payload as usize]);
    }
}

// ------------------------------------------------------------------------------------------------ S08 / S09 / S10

/// S08: inline payload is the SGE bytes captured at post time, whatever happens to the buffer afterwards.
#[test]
fn s08_inline_copied_at_post() {
    let (mut p, a, b, ma, mb) = setup(&ConnOpts::default());
    recv(&mut p, b, 1, &[sge(&mb, 0, 4096)]);
    recv(&mut p, b, 2, &[sge(&mb, 4096, 4096)]);
    let src = mr_vec(&mut p, 0, &ma);
    let mut want = src[1000..1037].to_vec();
    want.extend_from_slice(&src[5000..5064]);
    // From MR memory (inline flag, no inline slices), then overwrite the MR right after the post.
    let sg = [sge(&ma, 1000, 37), sge(&ma, 5000, 64)];
    p.a()
        .post_send(
            a.qpn,
            &[SendWr::new(1, SendOp::Send, &sg).flags(SendFlags::INLINE | SendFlags::SIGNALED)],
        )
        .unwrap();
    p.e(0).mr_write(ma.lkey, 0, &vec![0xEE; 8192]).unwrap();
    // From application slices, mutated after the post.
    let mut app1 = vec![1u8; 37];
    let mut app2: Vec<u8> = (0..64).collect();
    {
        let parts: [&[u8]; 2] = [&app1, &app2];
        p.a()
            .post_send(
                a.qpn,
                &[SendWr::new(2, SendOp::Send, &[]).inline(&parts).signaled()],
            )
            .unwrap();
    }
    app1.fill(0xAA);
    app2.fill(0xBB);
    // Inline WRITE.
    let parts: [&[u8]; 1] = [&[7u8; 50]];
    p.a()
        .post_send(
            a.qpn,
            &[SendWr::new(3, write_op(&mb, 9000), &[])
                .inline(&parts)
                .signaled()],
        )
        .unwrap();
    p.drive();
    assert_eq!(
        poll_all(p.a(), a.cq)
            .iter()
            .filter(|w| w.status == WcStatus::Success)
            .count(),
        3
    );
    let reqs = requests(&p, 0);
    assert_eq!(reqs[0].payload, want, "payload = SGE bytes at post time");
    let mut want2 = vec![1u8; 37];
    want2.extend(0..64u8);
    assert_eq!(reqs[1].payload, want2);
    assert_eq!(reqs[2].payload, vec![7u8; 50]);
    let got = mr_vec(&mut p, 1, &mb);
    assert_eq!(&got[..101], &want[..]);
    assert_eq!(&got[4096..4096 + 101], &want2[..]);
    assert_eq!(&got[9000..9050], &[7u8; 50]);
}

/// S09: the device reports its true max inline size; create_qp beyond it fails cleanly (or clamps and reports);
/// an inline post above the granted size fails at post time without emitting anything.
#[test]
fn s09_max_inline() {
    let mut p = Pair::new();
    let dev = p.a().query_device();
    let max = dev.max_inline_data;
    assert!(max >= 220, "perftest's default 220 B fits");
    let o = ConnOpts {
        cap: QpCap {
            max_inline_data: max + 1,
            ..ConnOpts::default().cap
        },
        ..ConnOpts::default()
    };
    let pd = p.a().alloc_pd().unwrap();
    let cq = p.a().create_cq(16).unwrap();
    let init = QpInitAttr {
        qp_type: QpType::Rc,
        pd,
        send_cq: cq,
        recv_cq: cq,
        cap: o.cap,
        sq_sig_all: false,
    };
    match p.a().create_qp(&init) {
        Err(CreateQpError::CapExceeded {
            field,
            requested,
            limit,
        }) => {
            assert_eq!((field, requested, limit), ("max_inline_data", max + 1, max));
        }
        other => panic!("expected CapExceeded, got {other:?}"),
    }
    // Clamp policy: granted value reported.
    let cfg = PairConfig {
        engine: EngineConfig {
            cap_policy: CapPolicy::Clamp,
            ..EngineConfig::default()
        },
        ..PairConfig::default()
    };
    let mut p = Pair::with_config(cfg);
    let (a, b) = connect(&mut p, &o);
    assert_eq!(a.cap.max_inline_data, max, "clamped to the device maximum");
    let ma = reg(&mut p, a, 4096, |i| i as u8);
    let mb = reg(&mut p, b, 4096, |_| 0);
    let big = vec![3u8; max as usize + 1];
    let parts: [&[u8]; 1] = [&big];
    let err = p
        .a()
        .post_send(
            a.qpn,
            &[SendWr::new(1, write_op(&mb, 0), &[]).inline(&parts)],
        )
        .unwrap_err();
    assert!(
        matches!(err.kind, PostErrorKind::InlineTooLarge { .. }),
        "{err}"
    );
    // Same via SGEs naming MR memory.
    let sg = [sge(&ma, 0, max), sge(&ma, 0, 1)];
    let err = p
        .a()
        .post_send(
            a.qpn,
            &[SendWr::new(2, write_op(&mb, 0), &sg).flags(SendFlags::INLINE)],
        )
        .unwrap_err();
    assert!(
        matches!(err.kind, PostErrorKind::InlineTooLarge { .. }),
        "{err}"
    );
    p.drive();
    assert!(requests(&p, 0).is_empty(), "a refused post emits nothing");
    // 220 B (perftest default) and exactly the granted size go through.
    for (id, n) in [(3u64, 220usize), (4, max as usize)] {
        let d = vec![id as u8; n];
        let parts: [&[u8]; 1] = [&d];
        p.a()
            .post_send(
                a.qpn,
                &[SendWr::new(id, write_op(&mb, 0), &[])
                    .inline(&parts)
                    .signaled()],
            )
            .unwrap();
    }
    p.drive();
    assert_eq!(
        poll_all(p.a(), a.cq)
            .iter()
            .map(|w| w.status)
            .collect::<Vec<_>>(),
        vec![WcStatus::Success; 2]
    );
    // A QP asking for less gets at least that; a post above its grant fails.
    let o2 = ConnOpts {
        cap: QpCap {
            max_inline_data: 64,
            ..ConnOpts::default().cap
        },
        ..ConnOpts::default()
    };
    let (a2, b2) = connect(&mut p, &o2);
    assert!((64..=max).contains(&a2.cap.max_inline_data));
    let mb2 = reg(&mut p, b2, 4096, |_| 0);
    let d = vec![0u8; a2.cap.max_inline_data as usize + 1];
    let parts: [&[u8]; 1] = [&d];
    assert!(
        p.a()
            .post_send(
                a2.qpn,
                &[SendWr::new(5, write_op(&mb2, 0), &[]).inline(&parts)]
            )
            .is_err()
    );
}

/// S10: the reported max_msg_sz is the enforced limit: 2^31; a larger post fails at post time or completes with
/// LOC_LEN_ERR, never reaching the wire.
#[test]
fn s10_max_msg_size() {
    let mut p = Pair::new();
    assert_eq!(p.a().query_device().max_msg_sz, 1 << 31);
    let o = ConnOpts::default();
    let (a, b) = connect(&mut p, &o);
    // A 2 GiB + 1 B MR (zero pages are not touched unless sent) so that only the length is wrong.
    let big = p
        .e(0)
        .reg_mr(a.pd, vec![0u8; (1 << 31) + 1], ALL_ACCESS)
        .unwrap();
    let mb = reg(&mut p, b, 4096, |_| 0);
    let sg = [sge(&big, 0, 1 << 30), sge(&big, 1 << 30, (1 << 30) + 1)];
    for (id, op) in [
        (1u64, SendOp::Send),
        (2, write_op(&mb, 0)),
        (
            3,
            SendOp::RdmaRead {
                remote_addr: mb.addr,
                rkey: mb.rkey,
            },
        ),
    ] {
        match p
            .a()
            .post_send(a.qpn, &[SendWr::new(id, op, &sg).signaled()])
        {
            Err(e) => {
                assert_eq!(e.index, 0, "{e}");
                println!("s10: op {id}: post failed: {e}");
            }
            Ok(()) => {
                println!("s10: op {id}: accepted at post time");
                p.drive();
                let wc = poll_all(p.a(), a.cq);
                assert_eq!(
                    wc.first().map(|w| (w.wr_id, w.status)),
                    Some((id, WcStatus::LocLenErr)),
                    "op {id}: {wc:?}"
                );
                break; // the QP is in ERR after an error completion
            }
        }
    }
    assert!(
        requests(&p, 0).is_empty(),
        "nothing over max_msg_sz reaches the wire"
    );
}

// ------------------------------------------------------------------------------------------------ S11

/// S11: the counter set has fixed, documented names (rxe + mlx5 CC), and they move with the traffic.
#[test]
fn s11_counter_names() {
    let required = [
        "sent_pkts",
        "rcvd_pkts",
        "duplicate_request",
        "out_of_seq_request",
        "rcvd_rnr_err",
        "send_rnr_err",
        "rcvd_seq_err",
        "ack_deferred",
        "retry_exceeded_err",
        "retry_rnr_exceeded_err",
        "completer_retry_err",
        "send_err",
        "link_downed",
        "rdma_sends",
        "rdma_recvs",
        "np_cnp_sent",
        "rp_cnp_handled",
        "np_ecn_marked_roce_packets",
        "local_ack_timeout_err",
        "packet_seq_err",
        "implied_nak_seq_err",
    ];
    for n in required {
        assert!(Counters::NAMES.contains(&n), "counter {n} missing");
        assert!(Counters::default().get(n).is_some());
    }
    for typo in ["ack_deffered", "out_of_sequence_request"] {
        assert!(!Counters::NAMES.contains(&typo), "{typo}");
    }
    let mut uniq = Counters::NAMES.to_vec();
    uniq.sort_unstable();
    uniq.dedup();
    assert_eq!(uniq.len(), Counters::NAMES.len(), "names are unique");
    // Counters agree with what was on the wire under loss.
    let (mut p, a, b, ma, mb) = setup(&ConnOpts::default());
    p.set_faults_all(FaultConfig {
        loss: 0.1,
        ..FaultConfig::default()
    });
    for i in 0..20 {
        recv(&mut p, b, i, &[sge(&mb, 0, 8192)]);
    }
    let sg = [sge(&ma, 0, 5000)];
    let wrs: Vec<SendWr> = (0..20)
        .map(|i| SendWr::new(i, SendOp::Send, &sg).signaled())
        .collect();
    p.a().post_send(a.qpn, &wrs).unwrap();
    p.drive();
    assert_eq!(poll_all(p.a(), a.cq).len(), 20);
    for i in 0..2 {
        let c = p.counters(i);
        let sent = p.captured.iter().filter(|x| x.from == i).count() as u64;
        assert_eq!(
            c.sent_pkts, sent,
            "node {i}: sent_pkts = frames on the wire"
        );
        assert_eq!(c.get("sent_pkts"), Some(sent));
    }
    let ca = p.counters(0);
    let cb = p.counters(1);
    assert_eq!(cb.rdma_recvs, 20);
    assert!(ca.retransmitted_pkts > 0 && cb.duplicate_request + cb.out_of_seq_request > 0);
    let rx_b = p.nodes[1].link.inner().inner().stats().rx_frames;
    assert_eq!(
        cb.rcvd_pkts, rx_b,
        "every frame delivered to b was accepted"
    );
}

// ------------------------------------------------------------------------------------------------ S16

/// S16: RoCE v2 over IPv4 uses IPv4-mapped GIDs and an IPv4 outer header; inconsistent address vectors are
/// rejected with a clear error at modify time.
#[test]
fn s16_gid_selection() {
    let (mut p, a, b, ma, mb) = setup(&ConnOpts::default());
    let sg = [sge(&ma, 0, 10)];
    p.a()
        .post_send(a.qpn, &[SendWr::new(1, write_op(&mb, 0), &sg).signaled()])
        .unwrap();
    p.drive();
    for c in &p.captured {
        assert_eq!(&c.frame[12..14], &[0x08, 0x00], "IPv4 EtherType");
        let (src, dst) = if c.from == 0 {
            (ip(0), ip(1))
        } else {
            (ip(1), ip(0))
        };
        assert_eq!(&c.frame[26..30], &src);
        assert_eq!(&c.frame[30..34], &dst);
    }
    let _ = b;
    // An IPv6 (not IPv4-mapped) destination with an IPv4 source GID, and a GID index outside the table.
    let o = ConnOpts::default();
    let c = make_qp(&mut p, 0, &o);
    let at = QpAttr {
        qp_state: QpState::Init,
        qp_access_flags: o.access,
        ..QpAttr::default()
    };
    p.a()
        .modify_qp(
            c.qpn,
            &at,
            QpAttrMask::STATE
                | QpAttrMask::PKEY_INDEX
                | QpAttrMask::PORT
                | QpAttrMask::ACCESS_FLAGS,
        )
        .unwrap();
    let rtr_mask = QpAttrMask::STATE
        | QpAttrMask::AV
        | QpAttrMask::PATH_MTU
        | QpAttrMask::DEST_QPN
        | QpAttrMask::RQ_PSN
        | QpAttrMask::MAX_DEST_RD_ATOMIC
        | QpAttrMask::MIN_RNR_TIMER;
    let mut v6 = [0u8; 16];
    v6[0] = 0xfe;
    v6[1] = 0x80;
    v6[15] = 2;
    for (what, ah) in [
        (
            "IPv6 link-local dgid with an IPv4 sgid",
            AhAttr {
                dgid: Gid(v6),
                dmac: mac(1),
                ..AhAttr::default()
            },
        ),
        (
            "sgid_index outside the GID table",
            AhAttr {
                dgid: Gid::from_ipv4(ip(1)),
                sgid_index: 5,
                dmac: mac(1),
                ..AhAttr::default()
            },
        ),
    ] {
        let rtr = QpAttr {
            qp_state: QpState::Rtr,
            ah_attr: ah,
            dest_qp_num: b.qpn,
            ..at
        };
        let r = p.a().modify_qp(c.qpn, &rtr, rtr_mask);
        assert!(r.is_err(), "{what}: must be rejected, got {r:?}");
        println!("s16: {what}: {}", r.unwrap_err());
    }
}

// ------------------------------------------------------------------------------------------------ S18

/// S18: no CNP for ECT-only traffic; one CNP (exact format) for a CE packet; at most one CNP per QP per
/// configured interval under a CE storm; counters on both sides; the sender's DCQCN reaction point (paper profile
/// at the 10 Gb/s of the segment, `DCQCN.md` §2.3) handles every CNP and slows the storm's transfer down.
#[test]
fn s18_cnp_only_for_ce() {
    for interval_us in [50u64, 10] {
        let engine = EngineConfig {
            cnp_interval: Duration::from_micros(interval_us),
            dcqcn: Some(DcqcnConfig::new(cc::Profile::Paper, 10_000_000_000.0)),
            ..EngineConfig::default()
        };
        // 10 Gb/s so that a 400-packet burst spans several CNP intervals.
        let sim = SimConfig {
            bandwidth_bps: 10_000_000_000,
            ..PairConfig::default().sim
        };
        let (mut p, a, b, ma, mb) = setup_with(
            PairConfig {
                engine,
                sim,
                ..PairConfig::default()
            },
            &ConnOpts::default(),
        );
        let sg = [sge(&ma, 0, 1000 * 1024)];
        p.a()
            .post_send(a.qpn, &[SendWr::new(1, write_op(&mb, 0), &sg).signaled()])
            .unwrap();
        p.drive();
        let data = requests(&p, 0);
        assert_eq!(data.len(), 1000);
        assert!(data.iter().all(|k| k.ecn == 2), "data is ECT(0)");
        assert!(
            p.sent_by(1).iter().all(|k| k.opcode != 0x81),
            "no CNP without CE"
        );
        assert_eq!(p.counters(1).np_cnp_sent, 0);
        // One CE-marked packet.
        p.faults(0).script_tx([Fault::MarkCe]);
        let sg = [sge(&ma, 0, 64)];
        p.a()
            .post_send(a.qpn, &[SendWr::new(2, write_op(&mb, 0), &sg).signaled()])
            .unwrap();
        p.drive();
        let cnps: Vec<Pkt> = p
            .sent_by(1)
            .into_iter()
            .filter(|k| k.opcode == 0x81)
            .collect();
        assert_eq!(cnps.len(), 1);
        let c = &cnps[0];
        assert!(c.becn && !c.mig_req && !c.ack_req && !c.solicited);
        assert_eq!(
            (c.pkey, c.dest_qp, c.psn, c.pad, c.dport, c.dscp),
            (0xFFFF, a.qpn.value(), 0, 0, 4791, 48)
        );
        let frame = &p
            .captured
            .iter()
            .rfind(|x| x.from == 1 && Pkt::parse(&x.frame).is_some_and(|k| k.opcode == 0x81))
            .unwrap()
            .frame;
        assert_eq!(
            transport_of(frame)[12..],
            [0u8; 16],
            "16 reserved zero bytes after the BTH"
        );
        assert!(c.payload.is_empty());
        assert_eq!(frame.len(), 74, "CNP frame size (IPv4)");
        assert!(icrc_ok(frame));
        let (ca, cb) = (p.counters(0), p.counters(1));
        assert_eq!(
            (
                cb.np_ecn_marked_roce_packets,
                cb.np_cnp_sent,
                ca.rp_cnp_handled
            ),
            (1, 1, 1)
        );
        // CE storm: every data packet marked (after the previous CNP's interval has passed).
        p.advance(Duration::from_millis(1));
        p.faults(0).set_tx_faults(FaultConfig {
            ce_mark: 1.0,
            ..FaultConfig::default()
        });
        let first_cnp = p.captured.len();
        let sg = [sge(&ma, 0, 400 * 1024)];
        p.a()
            .post_send(a.qpn, &[SendWr::new(3, write_op(&mb, 0), &sg).signaled()])
            .unwrap();
        p.drive();
        let storm: Vec<Instant> = p.captured[first_cnp..]
            .iter()
            .filter(|x| x.from == 1 && Pkt::parse(&x.frame).is_some_and(|k| k.opcode == 0x81))
            .map(|x| x.at)
            .collect();
        let marked: Vec<Instant> = p.captured[first_cnp..]
            .iter()
            .filter(|x| x.from == 0)
            .map(|x| x.at)
            .collect();
        let span = *marked.last().unwrap() - marked[0];
        // At most one CNP per interval (checked pairwise below), and the storm keeps producing them: about one per
        // interval, or one per few packets once the cuts spread the packets wider than the interval.
        let min = ((span.as_nanos() / u128::from(interval_us * 1000) / 2) as usize).min(400 / 3);
        assert!(
            storm.len() >= min.max(2),
            "interval {interval_us} µs: only {} CNPs over {span:?}",
            storm.len()
        );
        for w in storm.windows(2) {
            assert!(
                w[1] - w[0] >= Duration::from_micros(interval_us),
                "CNPs closer than the interval"
            );
        }
        let (ca, cb) = (p.counters(0), p.counters(1));
        assert_eq!(cb.np_ecn_marked_roce_packets, 1 + 400);
        assert_eq!(cb.np_cnp_sent, 1 + storm.len() as u64);
        assert_eq!(ca.rp_cnp_handled, cb.np_cnp_sent);
        assert_eq!(ca.rp_cnp_ignored, 0);
        // The cuts stretch the storm well beyond its line-rate duration (α ≈ 1, so each cut about halves RC, and
        // CNPs arrive faster than the 55-µs recovery timer undoes them).
        let frame = p.captured[first_cnp..]
            .iter()
            .find(|x| x.from == 0)
            .map_or(0, |x| x.frame.len());
        let line_rate_span = Duration::from_nanos((400 * frame * 8 / 10) as u64);
        assert!(
            span > line_rate_span * 2,
            "interval {interval_us} µs: the storm took {span:?}, {line_rate_span:?} at line rate"
        );
        assert_eq!(poll_all(p.a(), a.cq).len(), 3);
        let _ = b;
    }
}

// ------------------------------------------------------------------------------------------------ S20

/// S20: the ICRC check masks TTL, TOS (DSCP+ECN), the IPv4 checksum and the UDP checksum; a payload bit flip is
/// dropped silently (no NAK) and counted in `rx_icrc_encapsulated`.
#[test]
fn s20_icrc_masks_variant_fields() {
    let (mut p, a, b, ma, mb) = setup(&ConnOpts::default());
    recv(&mut p, b, 1, &[sge(&mb, 0, 4096)]);
    recv(&mut p, b, 2, &[sge(&mb, 4096, 4096)]);
    p.faults(0).script_tx([Fault::Drop]);
    let sg = [sge(&ma, 0, 300)];
    p.a()
        .post_send(a.qpn, &[SendWr::new(1, SendOp::Send, &sg).signaled()])
        .unwrap();
    assert!(p.drive_until(Duration::from_millis(1), |p| {
        p.captured.iter().any(|c| c.from == 0)
    }));
    let mut f = p
        .captured
        .iter()
        .find(|c| c.from == 0)
        .unwrap()
        .frame
        .clone();
    let icrc_before = f[f.len() - 4..].to_vec();
    f[22] = 3; // TTL after some router hops
    f[15] = (46 << 2) | 3; // DSCP rewritten, ECN CE
    f[40] = 0; // UDP checksum 0 ("no checksum")
    f[41] = 0;
    fix_ipv4_checksum(&mut f);
    assert_eq!(&f[f.len() - 4..], &icrc_before[..], "ICRC unchanged");
    assert!(icrc_ok(&f));
    let now = p.now;
    p.nodes[0].link.transmit(now, &f).unwrap();
    p.drive();
    let wb = poll_all(p.b(), b.cq);
    assert_eq!(
        wb.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        vec![(1, WcStatus::Success)],
        "rewritten packet accepted"
    );
    assert_eq!(p.counters(1).rx_icrc_encapsulated, 0);
    // A flipped bit anywhere in the ICRC-covered part: dropped, no NAK, counted; the retransmission recovers.
    let b_frames_before = p.captured.iter().filter(|c| c.from == 1).count();
    p.faults(0).script_tx([Fault::Corrupt]);
    let sg = [sge(&ma, 1000, 300)];
    p.a()
        .post_send(a.qpn, &[SendWr::new(2, SendOp::Send, &sg).signaled()])
        .unwrap();
    let t_corrupt = p.now;
    assert!(p.drive_until(Duration::from_secs(1), |p| p.b().cq_len(b.cq) > 0));
    assert_eq!(p.faults(0).tx_stats().corrupted, 1);
    assert_eq!(p.counters(1).rx_icrc_encapsulated, 1);
    let b_after: Vec<&Captured> = p
        .captured
        .iter()
        .filter(|c| c.from == 1)
        .skip(b_frames_before)
        .collect();
    let first_reply = b_after.first().map(|c| c.at).unwrap();
    assert!(
        first_reply - t_corrupt >= Duration::from_millis(60),
        "no reply to the corrupted packet; recovery by ACK timeout"
    );
    for c in &b_after {
        let k = Pkt::parse(&c.frame).unwrap();
        assert!(k.aeth.is_none_or(|x| x.0 >> 5 == 0), "no NAK: {k:?}");
    }
    p.drive();
    assert_eq!(
        poll_all(p.a(), a.cq)
            .iter()
            .map(|w| w.status)
            .collect::<Vec<_>>(),
        vec![WcStatus::Success; 2]
    );
    let got = mr_vec(&mut p, 1, &mb);
    let src = mr_vec(&mut p, 0, &ma);
    assert_eq!(&got[4096..4396], &src[1000..1300]);
}
