//! One test per failure scenario of `shared/spec/SCENARIOS.md` (S01..S20), each driving two real engines over
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
        kinds.insert(Pkt::parse(&c.frame).unwrap().opcode);
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
