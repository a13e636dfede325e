//! Scheduling-level tests: the [`Scheduler`] alone, driven like the engine drives it (pick → "send" → re-queue).

use super::*;

const L: u32 = 4096 + 18; // L_max of a 4096-byte netdev MTU

fn t(ns: u64) -> Instant {
    Instant::from_nanos(ns)
}

fn sched(cfg: SchedConfig, qps: usize) -> Scheduler {
    let mut s = Scheduler::new(cfg, L);
    for i in 0..qps {
        s.add_qp(i, 4096);
    }
    s
}

fn weights(w: &[u32]) -> SchedConfig {
    let mut c = SchedConfig::default();
    for (k, &x) in w.iter().enumerate() {
        c.tcs[k].weight = x;
    }
    c
}

/// A saturated run: every picked QP "sends" a frame of `size(k)` bytes and is queued again at once. Returns the
/// picks in order. `saturated(i)` decides whether QP `i` is queued again.
fn run(
    s: &mut Scheduler,
    n: usize,
    size: impl Fn(usize) -> usize,
    saturated: impl Fn(usize) -> bool,
) -> Vec<Pick> {
    let mut out = Vec::with_capacity(n);
    let now = s.now();
    for k in 0..n {
        let Some(p) = s.next(now) else { break };
        let i = match p {
            Pick::Ctrl(i) | Pick::Read(i) | Pick::Data(i) => i,
            Pick::Park(..) => panic!("unshaped QPs never park"),
        };
        s.sent(now, p, size(k));
        if saturated(i) && matches!(p, Pick::Data(_)) {
            s.push_data(i);
        }
        out.push(p);
    }
    out
}

/// `DCQCN.md §9 S1`: a control frame is never queued behind data — whatever is queued on the READ and request tiers,
/// the next pick after `push_ctrl` is that control frame.
#[test]
fn control_never_waits_behind_data_or_read_responses() {
    let mut s = sched(weights(&[3, 1, 1, 1]), 64);
    for i in 0..60 {
        s.set_tc(i, (i % 4) as u8);
        s.push_data(i);
        if i % 3 == 0 {
            s.push_read(i);
        }
    }
    let now = t(0);
    for round in 0..200usize {
        // Send a few data/read frames, then a control frame appears on some QP.
        for _ in 0..round % 5 {
            let p = s.next(now).unwrap();
            s.sent(now, p, 4000);
            if let Pick::Data(i) = p {
                s.push_data(i);
            }
            if let Pick::Read(i) = p {
                s.push_read(i);
            }
        }
        let q = (round * 7) % 64;
        s.push_ctrl(q);
        assert_eq!(s.next(now), Some(Pick::Ctrl(q)), "round {round}");
        s.sent(now, Pick::Ctrl(q), 60);
    }
    assert_eq!(s.stats().ctrl, 200);
}

/// READ responses go before new requests (issue #12), and control before both.
#[test]
fn read_responses_before_requests() {
    let mut s = sched(SchedConfig::default(), 3);
    s.push_data(0);
    s.push_read(1);
    s.push_ctrl(2);
    s.push_data(2);
    let now = t(0);
    assert_eq!(s.next(now), Some(Pick::Ctrl(2)));
    assert_eq!(s.next(now), Some(Pick::Read(1)));
    assert_eq!(s.next(now), Some(Pick::Data(0)));
    assert_eq!(s.next(now), Some(Pick::Data(2)));
    assert_eq!(s.next(now), None);
}

/// `DCQCN.md §9 S2`: weights 3:1 between two saturated classes split the bytes 75/25 (within 2 %; DWRR by bytes is
/// exact up to one quantum), with frames of mixed sizes, and a class with many QPs gets no more than its weight.
#[test]
fn dwrr_three_to_one_splits_bytes() {
    let mut s = sched(weights(&[3, 1]), 10);
    // Class 0: one QP; class 1: nine QPs (QP count must not matter).
    for i in 1..10 {
        s.set_tc(i, 1);
    }
    for i in 0..10 {
        s.push_data(i);
    }
    let sizes = [4154usize, 64, 1078, 2100, 300];
    run(&mut s, 200_000, |k| sizes[k % 5], |_| true);
    let b = s.stats().class_bytes;
    let share = b[0] as f64 / (b[0] + b[1]) as f64;
    assert!((share - 0.75).abs() < 0.02 * 0.75, "share {share}");
    // In fact DWRR is exact to a quantum over this many rounds.
    assert!((share - 0.75).abs() < 0.001, "share {share}");
}

/// `DCQCN.md §9` checks: weights 50/30/20 all backlogged → 50/30/20 ± 1 % over every window of 1 ms at 40 Gb/s
/// (≈ 5000 frames of 1000 B); with TC 2 idle the others split 62.5/37.5 (S3 work conservation).
#[test]
fn dwrr_fifty_thirty_twenty_and_work_conservation() {
    let mut s = sched(weights(&[50, 30, 20]), 3);
    for i in 0..3 {
        s.set_tc(i, i as u8);
        s.push_data(i);
    }
    let picks = run(&mut s, 50_000, |_| 1000, |_| true);
    for w in picks.chunks(5000) {
        let mut c = [0f64; 3];
        for p in w {
            if let Pick::Data(i) = p {
                c[*i] += 1.0;
            }
        }
        let n: f64 = c.iter().sum();
        for (k, want) in [0.5, 0.3, 0.2].iter().enumerate() {
            assert!((c[k] / n - want).abs() < 0.01, "{c:?}");
        }
    }
    // TC 2 goes idle: QP 2 is not queued again.
    let before = s.stats().class_bytes;
    run(&mut s, 50_000, |_| 1000, |i| i != 2);
    let after = s.stats().class_bytes;
    let d: Vec<f64> = (0..2).map(|k| (after[k] - before[k]) as f64).collect();
    let share = d[0] / (d[0] + d[1]);
    assert!((share - 0.625).abs() < 0.01, "share {share}");
}

/// `DCQCN.md §9 S4`: round robin over the QPs of a class, one packet per turn.
#[test]
fn round_robin_within_a_class() {
    let mut s = sched(SchedConfig::default(), 5);
    for i in 0..5 {
        s.push_data(i);
    }
    let picks = run(&mut s, 20, |_| 1000, |_| true);
    let order: Vec<usize> = picks
        .iter()
        .map(|p| match p {
            Pick::Data(i) => *i,
            _ => usize::MAX,
        })
        .collect();
    assert_eq!(order, (0..20).map(|k| k % 5).collect::<Vec<_>>());
}

/// A QP whose bucket does not conform is parked with the instant it conforms, leaves the queue, and is queued
/// again only after `unpark`; a rate increase re-times it; other QPs keep going meanwhile.
#[test]
fn shaped_qp_parks_and_is_retimed() {
    let mut s = sched(SchedConfig::default(), 2);
    // QP 0: 1 Gb/s, one-frame bucket (4224 B): after one 4154-B frame it needs 4154 B more = 33,232 ns.
    s.set_limit(0, Some(1_000_000_000), Some(0), None);
    s.push_data(0);
    s.push_data(1);
    let now = t(1000);
    assert_eq!(s.next(now), Some(Pick::Data(0)));
    s.sent(now, Pick::Data(0), 4154);
    s.push_data(0);
    assert_eq!(s.next(now), Some(Pick::Data(1)));
    s.sent(now, Pick::Data(1), 4154);
    s.push_data(1);
    let at = now + Duration::from_nanos(4154 * 8);
    assert_eq!(s.next(now), Some(Pick::Park(0, at)));
    assert!(s.qp(0).unwrap().is_parked());
    // Parked: pushing does nothing; QP 1 is served alone.
    s.push_data(0);
    assert_eq!(s.next(now), Some(Pick::Data(1)));
    s.sent(now, Pick::Data(1), 4154);
    // 10 Gb/s now: the departure moves to 3,324 ns after the last.
    let r = s.set_qp_rate(0, now, Some(10_000_000_000));
    assert_eq!(
        r,
        Retime::None,
        "the limit (1 Gb/s) still caps the controller"
    );
    s.set_limit(0, Some(10_000_000_000), Some(0), None);
    assert_eq!(
        s.parked_until(0),
        Some(now),
        "a new limit starts a full bucket"
    );
    s.unpark(0);
    s.push_data(0);
    assert_eq!(s.next(now), Some(Pick::Data(0)));
    s.sent(now, Pick::Data(0), 4154);
    s.push_data(0);
    assert_eq!(
        s.next(now),
        Some(Pick::Park(0, now + Duration::from_nanos(3324)))
    );
    // The controller drops to 1 Gb/s while the QP is parked: the wait grows tenfold (re-timed, R7; the 70 tokens
    // left are below the TB5 clamp of 4224/10).
    assert_eq!(
        s.set_qp_rate(0, now, Some(1_000_000_000)),
        Retime::At(now + Duration::from_nanos(4154 * 8))
    );
    // ... and back to unlimited: it conforms at once.
    s.set_limit(0, None, Some(0), Some(1_000_000_000));
    assert_eq!(s.set_qp_rate(0, now, None), Retime::Now);
    assert!(!s.qp(0).unwrap().is_parked());
}

/// A class with a rate limit gets that rate (its bucket) while the other class takes the rest; while the limited
/// class alone is backlogged and its bucket is empty, `next` returns nothing and `poll_timeout` names the instant.
#[test]
fn class_shaper_limits_a_class() {
    let mut c = weights(&[1, 1]);
    c.tcs[1].rate_bps = Some(1_000_000_000);
    // Three frames deep: room to wait for its DWRR turn without losing tokens.
    c.tcs[1].burst_bytes = Some(3 * u64::from(L));
    let mut s = sched(c, 2);
    s.set_tc(1, 1);
    s.push_data(0);
    s.push_data(1);
    // Simulate a 10 Gb/s wire: one 1000-B frame per 800 ns; measure class 1 from 1 ms (after the initial bucket)
    // to 11 ms.
    let mut now = 0u64;
    let mut at_1ms = None;
    while now < 11_000_000 {
        if now >= 1_000_000 && at_1ms.is_none() {
            at_1ms = Some(s.stats().class_bytes);
        }
        match s.next(t(now)) {
            Some(p @ Pick::Data(i)) => {
                s.sent(t(now), p, 1000);
                s.push_data(i);
                now += 800;
            }
            Some(other) => panic!("{other:?}"),
            None => now = s.poll_timeout().unwrap().as_nanos(),
        }
    }
    let (b0, b) = (at_1ms.unwrap(), s.stats().class_bytes);
    let rate1 = (b[1] - b0[1]) as f64 * 8.0 / 0.01;
    assert!((rate1 / 1e9 - 1.0).abs() < 0.01, "class 1 at {rate1}");
    assert!(b[0] > 8 * b[1], "class 0 takes the rest: {b:?}");
    // Class 1 alone: nothing until its bucket conforms.
    let mut s2 = sched(
        {
            let mut c = SchedConfig::default();
            c.tcs[1].rate_bps = Some(1_000_000_000);
            c.tcs[1].burst_bytes = Some(0);
            c
        },
        1,
    );
    s2.set_tc(0, 1);
    s2.push_data(0);
    let p = s2.next(t(0)).unwrap();
    s2.sent(t(0), p, L as usize);
    s2.push_data(0);
    assert_eq!(s2.next(t(0)), None);
    assert_eq!(s2.poll_timeout(), Some(t(u64::from(L) * 8)));
    assert!(s2.next(t(u64::from(L) * 8)).is_some());
}

/// The port bucket paces everything, control frames included, and a control frame waits at most for the frame
/// in progress (`DCQCN.md §9 S5`).
#[test]
fn port_shaper_paces_all_tiers() {
    let c = SchedConfig {
        port_rate_bps: Some(10_000_000_000),
        port_burst_bytes: Some(0),
        ..SchedConfig::default()
    };
    let mut s = sched(c, 2);
    s.push_data(0);
    let p = s.next(t(0)).unwrap();
    s.sent(t(0), p, 4000);
    s.push_data(0);
    s.push_ctrl(1);
    // The port owes (4000 + 24) B at 10 Gb/s = 3219.2 ns; it holds one frame (L + 24), so it conforms again after
    // the bytes of the frame in progress.
    assert_eq!(s.next(t(100)), None);
    let at = s.poll_timeout().unwrap();
    assert_eq!(at, t(3220));
    assert_eq!(s.next(at), Some(Pick::Ctrl(1)));
    assert!(s.stats().port_waits >= 1);
}

/// `set_tc` on a queued QP moves it when reached; `unpop` puts a pick back at the front, uncharged.
#[test]
fn class_change_and_unpop() {
    let mut s = sched(weights(&[1, 1]), 3);
    s.push_data(0);
    s.push_data(1);
    s.set_tc(0, 1);
    let now = t(0);
    let p = s.next(now).unwrap();
    assert_eq!(
        p,
        Pick::Data(1),
        "QP 0 moved to class 1, behind nothing there"
    );
    s.unpop(p);
    assert_eq!(s.next(now), Some(Pick::Data(1)));
    assert_eq!(s.tc(0), Some(1));
    assert_eq!(s.next(now), Some(Pick::Data(0)));
    assert_eq!(s.next(now), None);
    assert_eq!(s.stats().class_bytes, [0; TRAFFIC_CLASSES]);
}
