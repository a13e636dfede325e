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

/// A QP limited to 1 Gb/s with a 2 MB bucket (16 ms), driven like the engine drives it (pick → sent → re-queue →
/// settle) at `now` until it parks or runs out of work (`frames` left to send). Returns the frames sent and the park
/// instant, if it parked.
fn drain(s: &mut Scheduler, now: Instant, frames: &mut u32) -> Option<Instant> {
    while let Some(p) = s.next(now) {
        match p {
            Pick::Data(i) => {
                s.sent(now, p, 4154);
                *frames -= 1;
                if *frames > 0 {
                    s.push_data(i);
                }
                s.settle(i, false);
            }
            Pick::Park(_, at) => return Some(at),
            other => panic!("{other:?}"),
        }
    }
    None
}

const GBPS: u64 = 1_000_000_000;
const DEPTH: u64 = 2_000_000;

fn limited() -> Scheduler {
    let cfg = SchedConfig {
        qp_rate_limit_bps: Some(GBPS),
        qp_burst_bytes: Some(DEPTH),
        ..SchedConfig::default()
    };
    sched(cfg, 1)
}

/// Credit lost while backlogged (module docs): a backlogged QP whose engine is not driven for three bucket times
/// (48 ms) after it parked loses exactly the credit that overflowed its bucket — `r·Δt` less the room the bucket had
/// at the park — and nothing more once it is driven again; the bytes it sent obey `b₀ + r·T − lost − b_T`.
#[test]
fn backlogged_qp_not_driven_loses_exactly_the_overflow() {
    let mut s = limited();
    let mut left = u32::MAX;
    s.push_data(0);
    let t0 = t(0);
    let at = drain(&mut s, t0, &mut left).expect("parks once the bucket is empty");
    let room = DEPTH as i64 - s.qp(0).unwrap().bucket().tokens_bytes(t0);
    assert_eq!(s.qp(0).unwrap().bucket().credit_lost_bytes(), 0);
    // The Shaper timer was due at `at`; the engine's thread runs again 48 ms later.
    let late = at + Duration::from_millis(48);
    s.observe(late);
    s.unpark(0);
    s.push_data(0);
    let lost = s.qp(0).unwrap().bucket().credit_lost_bytes();
    let accrued = u128::from(late.as_nanos()) * u128::from(GBPS) / 8_000_000_000;
    assert_eq!(lost as i64, accrued as i64 - room, "room {room} B");
    assert!(lost > 2 * DEPTH, "{lost}");
    // Driven again: the full bucket goes out, then pacing resumes; nothing more is lost.
    let mut now = late;
    for _ in 0..200 {
        let at = drain(&mut s, now, &mut left).expect("parks");
        now = at;
        s.observe(now);
        s.unpark(0);
        s.push_data(0);
    }
    assert_eq!(s.qp(0).unwrap().bucket().credit_lost_bytes(), lost);
    // Bytes sent = b₀ + r·T − lost − tokens left, to within the rounding to whole bytes.
    let sent = u64::from(u32::MAX - left) * 4154;
    let tokens = s.qp(0).unwrap().bucket().tokens_bytes(now);
    let budget =
        DEPTH as i128 + i128::from(now.as_nanos()) / 8 - i128::from(lost) - i128::from(tokens);
    assert!((i128::from(sent) - budget).abs() <= 1, "{sent} vs {budget}");
}

/// An idle QP loses nothing however long it idles, even when a post finds the scheduler's clock stale (a driver
/// posts before it reads the clock); the `TB5` clamp on a rate cut while backlogged is not counted either.
#[test]
fn idle_qp_and_rate_cut_lose_nothing() {
    let mut s = limited();
    let mut left = 10;
    s.push_data(0);
    assert_eq!(drain(&mut s, t(0), &mut left), None, "sent its 10 frames");
    assert!(!s.qp(0).unwrap().bucket().is_backlogged());
    // Idle for 1 s (60 bucket times); a post arrives while the scheduler last saw t = 0.
    left = 100;
    s.push_data(0);
    let now = t(1_000_000_000);
    assert_eq!(drain(&mut s, now, &mut left), None);
    assert_eq!(s.qp(0).unwrap().bucket().credit_lost_bytes(), 0);
    // Idle again, then backlogged with a full bucket and cut to a tenth: the tokens are clamped to a tenth of the
    // depth (TB5) and nothing is counted as lost.
    s.push_data(0);
    let now = t(2_000_000_000);
    let p = s.next(now).expect("a full bucket conforms");
    assert!(s.qp(0).unwrap().bucket().is_backlogged());
    assert_eq!(s.set_qp_rate(0, now, Some(GBPS / 10)), Retime::None);
    assert_eq!(
        s.qp(0).unwrap().bucket().tokens_bytes(now),
        DEPTH as i64 / 10
    );
    s.sent(now, p, 4154);
    assert_eq!(s.qp(0).unwrap().bucket().credit_lost_bytes(), 0);
    // Idle ticks of an unlimited port bucket count nothing either.
    assert_eq!(s.port_bucket().credit_lost_bytes(), 0);
}

/// The port bucket counts its own overflow while anything is queued: a 1 Gb/s port with an unshaped QP, not driven
/// for 10 ms while the port waits, loses `r·Δt` less the room it had.
#[test]
fn port_bucket_counts_its_overflow_while_work_waits() {
    let cfg = SchedConfig {
        port_rate_bps: Some(GBPS),
        ..SchedConfig::default()
    };
    let mut s = sched(cfg, 1);
    let t0 = t(0);
    s.push_data(0);
    while let Some(p) = s.next(t0) {
        s.sent(t0, p, 4154);
        s.push_data(0);
        s.settle(0, false);
    }
    let room = s.port_bucket().depth_bytes() as i64 - s.port_bucket().tokens_bytes(t0);
    let late = t(10_000_000);
    let p = s.next(late).expect("the port conforms again");
    s.sent(late, p, 4154);
    let lost = s.port_bucket().credit_lost_bytes() as i64;
    assert_eq!(lost, 10_000_000 / 8 - room);
    // Nothing queued any more: the port idles without counting.
    s.settle(0, false);
    assert_eq!(s.next(t(50_000_000)), None);
    let p = {
        s.push_data(0);
        s.next(t(60_000_000)).expect("conforms")
    };
    s.sent(t(60_000_000), p, 4154);
    assert_eq!(s.port_bucket().credit_lost_bytes() as i64, lost);
}
