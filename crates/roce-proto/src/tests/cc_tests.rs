//! DCQCN in the engine (`docs/spec/DCQCN.md` §2): a sender whose frames are CE-marked for a while receives
//! CNPs from the receiver's notification point, its reaction point cuts the rate (and the pacing follows), and the
//! rate recovers once the marking stops; the data arrives intact.

use std::time::Duration;

use super::util::*;
use crate::cc::Profile;
use crate::*;

const LINE: f64 = 10e9;

fn dcqcn_cfg(mac: [u8; 6], ip: [u8; 4], seed: u64) -> EngineConfig {
    let mut d = DcqcnConfig::new(Profile::Paper, LINE);
    // A small byte counter so that recovery reaches hyper increase quickly.
    d.set("B_bytes", "200000").unwrap();
    EngineConfig {
        dcqcn: Some(d),
        ..cfg(mac, ip, seed)
    }
}

/// Bytes of A→B data frames sent in `[from, to)`.
fn sent_bytes(p: &Pair, from: Instant, to: Instant) -> u64 {
    p.captured
        .iter()
        .filter(|c| c.1 == Dir::AtoB && c.0 >= from && c.0 < to && c.2.len() > 200)
        .map(|c| c.2.len() as u64)
        .sum()
}

#[test]
fn dcqcn_cuts_on_ce_marks_and_recovers() {
    let mut p = Pair::with_configs(dcqcn_cfg(MAC_A, IP_A, 1), dcqcn_cfg(MAC_B, IP_B, 2));
    let (a, b) = connect(&mut p, &ConnOpts::default());
    // The shaper enforces the reaction point's rate from the start (C before any CNP, DCQCN.md R0).
    assert_eq!(p.a.qp_rate_bps(a.qpn), Some(LINE as u64));
    let len = 1 << 16;
    let ma = mr(&mut p.a, a.pd, len, |i| (i * 7 % 251) as u8);
    let mb = mr(&mut p.b, b.pd, len, |_| 0);
    let t0 = p.now;
    let t = |us: u64| t0 + Duration::from_micros(us);
    let (mark_from, mark_to, end) = (t(300), t(600), t(8000));
    // CE on every A→B frame in [mark_from, mark_to) (a congested switch queue).
    let marks = std::rc::Rc::new(std::cell::Cell::new((mark_from, mark_to, Instant::ZERO)));
    let m = marks.clone();
    p.filter = Box::new(move |d, f| {
        let (from, to, now) = m.get();
        if d == Dir::AtoB && now >= from && now < to {
            f[15] |= 3;
        }
        true
    });
    let mut outstanding = 0u32;
    let mut wr = 0u64;
    let mut rates = vec![];
    let sg = [sge(&ma, 0, len as u32)];
    while p.now < end {
        while outstanding < 16 {
            let w = SendWr::new(
                wr,
                SendOp::RdmaWrite {
                    remote_addr: mb.addr,
                    rkey: mb.rkey,
                },
                &sg,
            );
            p.a.post_send(a.qpn, &[w]).unwrap();
            wr += 1;
            outstanding += 1;
        }
        marks.set((mark_from, mark_to, p.now));
        p.drive_for(Duration::from_micros(5));
        for w in poll_all(&mut p.a, a.cq) {
            assert_eq!(w.status, WcStatus::Success);
            outstanding -= 1;
        }
        let r = p.a.qp_rate(a.qpn, p.now).unwrap();
        rates.push((p.now, r.rate_bps.unwrap() as f64));
    }
    let (ca, cb) = (p.a.counters().clone(), p.b.counters().clone());
    // NP: CE marks seen, CNPs at most one per 50 µs of marking (+1), all handled by the RP.
    assert!(cb.np_ecn_marked_roce_packets > 10, "{cb:?}");
    assert!(
        cb.np_cnp_sent >= 3 && cb.np_cnp_sent <= 300 / 50 + 2,
        "{cb:?}"
    );
    assert_eq!(ca.rp_cnp_handled, cb.np_cnp_sent);
    assert_eq!(ca.rp_cnp_ignored, 0);
    // RP: line rate before the marks, cut during them, recovered to ≥ 99 % of C well after.
    let at = |t: Instant| rates.iter().rfind(|r| r.0 <= t).unwrap().1;
    assert_eq!(at(t(290)), LINE);
    let min = rates
        .iter()
        .filter(|r| r.0 >= mark_from && r.0 < t(650))
        .map(|r| r.1)
        .fold(f64::MAX, f64::min);
    assert!(min < LINE / 8.0, "deep cut expected, lowest rate {min}");
    assert!(at(end) >= 0.99 * LINE, "recovered: {}", at(end));
    // The pacing follows the rate: throughput in the congested window is far below the uncongested one.
    let w = Duration::from_micros(200);
    let before = sent_bytes(&p, t(100), mark_from);
    let during = sent_bytes(&p, t(400), mark_to);
    let after = sent_bytes(&p, t(7800), end);
    let line_bytes = (LINE * w.as_secs_f64() / 8.0) as u64;
    assert!(
        before > line_bytes * 9 / 10 && before <= line_bytes * 101 / 100,
        "{before} vs {line_bytes}"
    );
    assert!(during < before / 4, "during {during} vs before {before}");
    assert!(after > line_bytes * 9 / 10, "after {after} vs {line_bytes}");
    // The dump shows the RP state.
    let dump = p.a.qp_dump(a.qpn).unwrap();
    assert!(dump.contains("dcqcn paper"), "{dump}");
    // Data intact.
    p.drive();
    assert_eq!(
        p.b.mr_bytes(mb.lkey).unwrap(),
        p.a.mr_bytes(ma.lkey).unwrap()
    );
}

#[test]
fn qp_reset_forgets_congestion_state() {
    let mut p = Pair::with_configs(dcqcn_cfg(MAC_A, IP_A, 1), dcqcn_cfg(MAC_B, IP_B, 2));
    let (a, b) = connect(&mut p, &ConnOpts::default());
    let ma = mr(&mut p.a, a.pd, 4096, |i| i as u8);
    let mb = mr(&mut p.b, b.pd, 4096, |_| 0);
    p.filter = Box::new(|d, f| {
        if d == Dir::AtoB {
            f[15] |= 3;
        }
        true
    });
    let sg = [sge(&ma, 0, 4096)];
    let w = SendWr::new(
        1,
        SendOp::RdmaWrite {
            remote_addr: mb.addr,
            rkey: mb.rkey,
        },
        &sg,
    );
    p.a.post_send(a.qpn, &[w]).unwrap();
    p.drive_for(Duration::from_micros(20));
    let r = p.a.qp_rate(a.qpn, p.now).unwrap();
    assert!(r.limited && r.rate_bps.unwrap() < LINE as u64, "{r:?}");
    p.a.modify_qp(
        a.qpn,
        &QpAttr {
            qp_state: QpState::Reset,
            ..QpAttr::default()
        },
        QpAttrMask::STATE,
    )
    .unwrap();
    let r = p.a.qp_rate(a.qpn, p.now).unwrap();
    assert!(!r.limited && r.rate_bps == Some(LINE as u64), "{r:?}");
}

/// Notification point, found by the simulator (issue #20, E7 on the E8 scenario): a CE mark that arrives exactly
/// when the open window ends, while a mark from inside the window still owes its end-of-window CNP, made two CNPs at
/// the same instant (the arrival opened a new window and sent one; the window-end timer, run after it, sent the
/// owed one as well). One CNP answers both: at most one per `cnp_interval` (`DCQCN.md` §2.2 N1–N2, §6 E7.2).
#[test]
fn np_sends_one_cnp_when_a_mark_arrives_exactly_at_the_window_end() {
    let n = Duration::from_micros(50);
    let mut r = NpRig::new(EngineConfig {
        cnp_interval: n,
        ..cfg(MAC_B, IP_B, 2)
    });
    let t0 = r.p.now + Duration::from_micros(100);
    let us = |x: u64| t0 + Duration::from_micros(x);
    // A mark at 10 µs (CNP at once, window to 60), one at 20 (owes a CNP at 60), one that reaches B at 60 exactly.
    r.write_at(us(10), true);
    r.p.drive_for(Duration::from_micros(1));
    r.write_at(us(20), true);
    r.p.drive_for(Duration::from_micros(1));
    r.write_at(us(60), true);
    r.p.drive_for(Duration::from_micros(200));
    let lat = r.p.latency;
    let cnps: Vec<_> = r.cnps().into_iter().map(|(t, _)| t).collect();
    assert_eq!(cnps, vec![us(10) + lat, us(60) + lat], "one CNP per window");
    assert_eq!(r.p.b.counters().np_cnp_sent, 2);
}

/// An RC pair whose A→B RDMA WRITEs can be CE-marked on the wire, for the notification point's tests: `write_at`
/// posts one 64-byte WRITE at a chosen instant, `cnps` lists the CNPs B sent (instant, DSCP).
struct NpRig {
    p: Pair,
    qpn: Qpn,
    wr: (Sge, u64, Rkey),
    marks: std::rc::Rc<std::cell::Cell<bool>>,
}

impl NpRig {
    fn new(b_cfg: EngineConfig) -> NpRig {
        let mut p = Pair::with_configs(cfg(MAC_A, IP_A, 1), b_cfg);
        let (a, b) = connect(&mut p, &ConnOpts::default());
        let ma = mr(&mut p.a, a.pd, 4096, |i| i as u8);
        let mb = mr(&mut p.b, b.pd, 4096, |_| 0);
        let marks = std::rc::Rc::new(std::cell::Cell::new(false));
        let m = marks.clone();
        p.filter = Box::new(move |d, f| {
            if d == Dir::AtoB && m.get() {
                f[15] |= 3;
            }
            true
        });
        NpRig {
            p,
            qpn: a.qpn,
            wr: (sge(&ma, 0, 64), mb.addr, mb.rkey),
            marks,
        }
    }

    /// Drives to `at`, then posts and transmits one WRITE, CE-marked if `ce`.
    fn write_at(&mut self, at: Instant, ce: bool) {
        let p = &mut self.p;
        p.drive_for(at - p.now);
        p.now = at;
        self.marks.set(ce);
        let sg = [self.wr.0];
        let w = SendWr::new(
            1,
            SendOp::RdmaWrite {
                remote_addr: self.wr.1,
                rkey: self.wr.2,
            },
            &sg,
        );
        p.a.post_send(self.qpn, &[w]).unwrap();
        p.transmit();
        self.marks.set(false);
    }

    /// The CNPs B sent: (instant, DSCP).
    fn cnps(&self) -> Vec<(Instant, u8)> {
        self.p
            .captured
            .iter()
            .filter(|c| c.1 == Dir::BtoA && c.2[42] == 0x81)
            .map(|c| (c.0, c.2[15] >> 2))
            .collect()
    }
}

/// Notification point (`DCQCN.md` §2.2 N1–N3, §6 E7.1–E7.3): the first CE mark after a quiet window is answered at
/// the same instant; marks inside the open window by exactly one CNP at its end; unmarked traffic by none; CNPs
/// carry DSCP `cnp_dscp` and priority `cnp_prio`.
#[test]
fn np_answers_the_first_mark_at_once_and_marks_inside_the_window_at_its_end() {
    let n = Duration::from_micros(50);
    let mut r = NpRig::new(EngineConfig {
        cnp_interval: n,
        cnp_dscp: 40,
        cnp_prio: 5,
        ..cfg(MAC_B, IP_B, 2)
    });
    let write_at = |r: &mut NpRig, at: Instant, ce: bool| {
        r.write_at(at, ce);
        r.p.drive_for(Duration::from_micros(1));
    };
    let t0 = r.p.now + Duration::from_micros(100);
    let us = |x: u64| t0 + Duration::from_micros(x);
    // Unmarked traffic: no CNP (E7.3).
    write_at(&mut r, us(0), false);
    // Marks at 10, 20, 30 µs: CNP at 10 + the latency (N1), one more at the window end 60 µs (N2).
    for t in [10, 20, 30] {
        write_at(&mut r, us(t), true);
    }
    // A mark at 130 µs, after the window of the 60-µs CNP closed at 110: answered at once.
    write_at(&mut r, us(130), true);
    r.p.drive_for(Duration::from_micros(200));
    let lat = r.p.latency;
    assert_eq!(
        r.cnps(),
        vec![
            (us(10) + lat, 40),
            (us(10) + lat + n, 40),
            (us(130) + lat, 40)
        ],
        "CNP instants and DSCP"
    );
    let p = &r.p;
    let c = p.b.counters();
    assert_eq!((c.np_ecn_marked_roce_packets, c.np_cnp_sent), (4, 3));
    // A CNP's metadata carries its priority and DSCP (a fresh pair, driven by hand).
    let mut buf = vec![0u8; 256];
    let mut b2 = Pair::with_configs(
        cfg(MAC_A, IP_A, 1),
        EngineConfig {
            cnp_prio: 5,
            ..cfg(MAC_B, IP_B, 2)
        },
    );
    let (a2, bb) = connect(&mut b2, &ConnOpts::default());
    let ma2 = mr(&mut b2.a, a2.pd, 64, |i| i as u8);
    let mb2 = mr(&mut b2.b, bb.pd, 64, |_| 0);
    let sg2 = [sge(&ma2, 0, 64)];
    b2.a.post_send(
        a2.qpn,
        &[SendWr::new(
            1,
            SendOp::RdmaWrite {
                remote_addr: mb2.addr,
                rkey: mb2.rkey,
            },
            &sg2,
        )],
    )
    .unwrap();
    let meta = b2.a.poll_transmit(b2.now, &mut buf).unwrap();
    let mut f = buf[..meta.len].to_vec();
    f[15] |= 3;
    b2.b.handle_frame(b2.now, &f);
    let mut kinds = vec![];
    while let Some(m) = b2.b.poll_transmit(b2.now, &mut buf) {
        kinds.push((m.kind, m.prio, m.dscp));
    }
    assert!(kinds.contains(&(TxKind::Cnp, 5, 48)), "{kinds:?}");
    assert!(
        kinds.iter().all(|k| k.0 == TxKind::Cnp || k.1 == 0),
        "{kinds:?}"
    );
}
