//! Timers as data (STYLE E4): a binary heap of `(instant, qpn, kind, generation)` entries with lazy invalidation.
//!
//! Each QP keeps, per [`TimerKind`], its logical deadline and the earliest heap entry queued for it. Re-arming a
//! timer *later* (the common case: the local ACK timer restarts on every ACK) does not push a new entry; when the
//! queued entry surfaces, the engine re-queues it at the real deadline. Re-arming *earlier* pushes a new entry.
//! Cancelling only clears the deadline. So the heap holds O(QPs × kinds) entries however fast timers are re-armed,
//! and no entry of a destroyed QP can fire for a new QP with the same QPN (the generation differs,
//! `QpTimers::with_base`). `Engine::poll_timeout` returns the head after settling it.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use crate::time::Instant;

/// Per-QP timer kinds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(u8)]
pub enum TimerKind {
    /// Local ACK timeout / retransmit (4.096 µs · 2^timeout, `ROCEV2.md §4.2`).
    AckTimeout = 0,
    /// Wait before retransmitting after an RNR NAK (the advertised RNR time, S04).
    RnrRetry = 1,
    /// Rate-controller seam: the QP is not eligible to send before this instant (per-QP "eligible at").
    Shaper = 2,
    /// The rate controller's own timer (`RateController::next_timer`; DCQCN alpha/rate-increase timers).
    RateTimer = 3,
    /// Notification point: the end of the QP's CNP window, when a CE mark that arrived inside it is answered with
    /// one CNP (`DCQCN.md` §2.2 N2).
    CnpPacing = 4,
}

impl TimerKind {
    /// The timer's name in the QP dump: `ack_timeout`, `rnr_retry`, `shaper`, `rate_timer`, `cnp_pacing`.
    pub(crate) const fn name(self) -> &'static str {
        match self {
            TimerKind::AckTimeout => "ack_timeout",
            TimerKind::RnrRetry => "rnr_retry",
            TimerKind::Shaper => "shaper",
            TimerKind::RateTimer => "rate_timer",
            TimerKind::CnpPacing => "cnp_pacing",
        }
    }

    /// Every kind, in discriminant order.
    pub(crate) const ALL: [TimerKind; TIMER_KINDS] = [
        TimerKind::AckTimeout,
        TimerKind::RnrRetry,
        TimerKind::Shaper,
        TimerKind::RateTimer,
        TimerKind::CnpPacing,
    ];
}

pub(crate) const TIMER_KINDS: usize = 5;

/// An optional instant in 8 bytes (`Option<Instant>` takes 16): nanoseconds, [`Slot::NONE`] for "not set". Timers
/// are armed at most at [`Slot::LATEST`] ([`Timers::set`] clamps), so no armed instant is mistaken for `NONE`. Part of
/// keeping an idle QP small (issue #21: ten of these per QP).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Slot(u64);

impl Slot {
    const NONE: Slot = Slot(u64::MAX);
    /// The latest instant a timer can be armed for: 1 ns before [`Instant::MAX`] (about 584 years after the epoch).
    const LATEST: Instant = Instant::from_nanos(u64::MAX - 1);

    fn get(self) -> Option<Instant> {
        (self != Slot::NONE).then_some(Instant::from_nanos(self.0))
    }

    fn is(self, at: Instant) -> bool {
        self.0 == at.as_nanos()
    }
}

impl From<Option<Instant>> for Slot {
    fn from(v: Option<Instant>) -> Slot {
        v.map_or(Slot::NONE, |t| Slot(t.as_nanos()))
    }
}

/// One QP's timer slots: 88 bytes.
#[derive(Clone, Copy, Debug)]
pub(crate) struct QpTimers {
    deadline: [Slot; TIMER_KINDS],
    queued: [Slot; TIMER_KINDS],
    generation: u32,
}

impl QpTimers {
    /// Timer slots of a new QP; `base` must differ from every earlier QP's so that heap entries left by a destroyed
    /// QP that used the same QPN never match.
    pub(crate) fn with_base(base: u32) -> QpTimers {
        QpTimers {
            deadline: [Slot::NONE; TIMER_KINDS],
            queued: [Slot::NONE; TIMER_KINDS],
            generation: base,
        }
    }

    pub(crate) fn get(&self, k: TimerKind) -> Option<Instant> {
        self.deadline[k as usize].get()
    }
}

/// A heap entry: `(instant, qpn << 8 | kind, generation)`, 16 bytes (QPNs are 24 bits, IBTA §9.2). The packed middle
/// word orders as `(qpn, kind)` did.
pub(crate) type Entry = Reverse<(Instant, u32, u32)>;

fn entry(at: Instant, qpn: u32, k: u8, generation: u32) -> Entry {
    Reverse((at, (qpn & 0xFF_FFFF) << 8 | u32::from(k), generation))
}

fn unpack(e: &Entry) -> (Instant, u32, u8, u32) {
    let Reverse((at, w, generation)) = *e;
    (at, w >> 8, w as u8, generation)
}

/// What a surfaced heap entry means for its QP.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Settle {
    /// Not (or no longer) relevant: drop it.
    Stale,
    /// The timer is due: it has been disarmed, run its handler.
    Fire(TimerKind),
    /// The deadline moved later; the entry was re-queued at the real deadline.
    Requeued,
    /// A live entry for a deadline in the future: the heap head is accurate.
    Pending,
}

#[derive(Debug, Default)]
pub(crate) struct Timers {
    heap: BinaryHeap<Entry>,
}

impl Timers {
    /// Arms (or re-arms) timer `k` of a QP for `at`.
    /// `at` is clamped to 1 ns before [`Instant::MAX`] (the QP's slots keep "not armed" in that value).
    pub(crate) fn set(&mut self, qt: &mut QpTimers, qpn: u32, k: TimerKind, at: Instant) {
        let at = at.min(Slot::LATEST);
        let i = k as usize;
        qt.deadline[i] = Some(at).into();
        if qt.queued[i].get().is_none_or(|q| at < q) {
            qt.queued[i] = Some(at).into();
            self.heap.push(entry(at, qpn, k as u8, qt.generation));
        }
    }

    /// Disarms timer `k` (its heap entry is dropped when it surfaces).
    pub(crate) fn cancel(qt: &mut QpTimers, k: TimerKind) {
        qt.deadline[k as usize] = Slot::NONE;
    }

    /// The head entry: `(instant, qpn, kind, generation)`.
    pub(crate) fn peek(&self) -> Option<(Instant, u32, u8, u32)> {
        self.heap.peek().map(unpack)
    }

    /// Whether the head entry is live and exactly at its QP's deadline — what [`settle`](Self::settle) with
    /// `consume` = false answers [`Settle::Pending`] for after popping the entry and pushing the same one back — so
    /// `Engine::poll_timeout` can answer from the head without touching the heap (it did a pop and a push per call:
    /// 2 % of the simulator's 64:1 incast profile, 2026-12-03).
    pub(crate) fn head_is_pending(&self, qt: Option<&QpTimers>) -> bool {
        let Some((at, _, k, generation)) = self.heap.peek().map(unpack) else {
            return false;
        };
        let (Some(qt), Some(&kind)) = (qt, TimerKind::ALL.get(usize::from(k))) else {
            return false;
        };
        let i = kind as usize;
        qt.generation == generation && qt.deadline[i].is(at) && qt.queued[i].is(at)
    }

    /// Removes the head entry and decides what it means for `qt` (the QP it names, if it still exists) at `now`.
    /// `consume` = false (from `poll_timeout`) never fires: a due entry is put back.
    pub(crate) fn settle(
        &mut self,
        qt: Option<&mut QpTimers>,
        now: Instant,
        consume: bool,
    ) -> Settle {
        let Some((at, qpn, k, generation)) = self.heap.pop().as_ref().map(unpack) else {
            return Settle::Stale;
        };
        let Some(qt) = qt else { return Settle::Stale };
        let Some(&kind) = TimerKind::ALL.get(k as usize) else {
            return Settle::Stale;
        };
        if qt.generation != generation {
            return Settle::Stale;
        }
        let i = kind as usize;
        if qt.queued[i].is(at) {
            qt.queued[i] = Slot::NONE;
        }
        match qt.deadline[i].get() {
            None => Settle::Stale,
            Some(d) if d <= now && consume => {
                qt.deadline[i] = Slot::NONE;
                Settle::Fire(kind)
            }
            Some(d) => {
                // Re-queue at the real deadline unless an entry at or before it is already queued.
                if qt.queued[i].get().is_none_or(|q| d < q) {
                    qt.queued[i] = Some(d).into();
                    self.heap.push(entry(d, qpn, k, generation));
                }
                if d == at {
                    Settle::Pending
                } else {
                    Settle::Requeued
                }
            }
        }
    }

    /// Makes room for exactly `n` more entries (the caller picks the growth: `Engine::create_qp`), so arming timers
    /// after `create_qp` allocates nothing (the heap holds about one entry per armed (QP, kind); re-arming earlier
    /// adds a short-lived stale one).
    pub(crate) fn reserve_exact(&mut self, n: usize) {
        self.heap.reserve_exact(n);
    }

    /// Entries the heap has room for.
    pub(crate) fn capacity(&self) -> usize {
        self.heap.capacity()
    }

    /// Number of heap entries (for tests and the QP dump).
    pub(crate) fn len(&self) -> usize {
        self.heap.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rearm_later_does_not_grow_the_heap_and_fires_at_the_real_deadline() {
        let mut t = Timers::default();
        let mut q = QpTimers::with_base(7);
        for k in 1..=1000u64 {
            t.set(
                &mut q,
                9,
                TimerKind::AckTimeout,
                Instant::from_micros(10 + k),
            );
        }
        assert_eq!(t.len(), 1);
        // The entry at 11 µs surfaces and is re-queued at 1010 µs.
        assert_eq!(t.peek().map(|e| e.0), Some(Instant::from_micros(11)));
        assert_eq!(
            t.settle(Some(&mut q), Instant::from_micros(11), true),
            Settle::Requeued
        );
        assert_eq!(t.peek().map(|e| e.0), Some(Instant::from_micros(1010)));
        assert_eq!(
            t.settle(Some(&mut q), Instant::from_micros(1010), true),
            Settle::Fire(TimerKind::AckTimeout)
        );
        assert_eq!(q.get(TimerKind::AckTimeout), None);
        assert_eq!(t.len(), 0);
    }

    #[test]
    fn earlier_rearm_and_cancel() {
        let mut t = Timers::default();
        let mut q = QpTimers::with_base(1);
        t.set(&mut q, 9, TimerKind::RnrRetry, Instant::from_micros(100));
        t.set(&mut q, 9, TimerKind::RnrRetry, Instant::from_micros(50));
        assert_eq!(t.len(), 2);
        assert_eq!(
            t.settle(Some(&mut q), Instant::from_micros(50), true),
            Settle::Fire(TimerKind::RnrRetry)
        );
        assert_eq!(
            t.settle(Some(&mut q), Instant::from_micros(100), true),
            Settle::Stale
        );
        t.set(&mut q, 9, TimerKind::Shaper, Instant::from_micros(200));
        Timers::cancel(&mut q, TimerKind::Shaper);
        assert_eq!(
            t.settle(Some(&mut q), Instant::from_micros(300), true),
            Settle::Stale
        );
        // An entry of an older QP with the same QPN never fires for the new one.
        let mut old = QpTimers::with_base(1);
        t.set(&mut old, 9, TimerKind::AckTimeout, Instant::from_micros(10));
        let mut new = QpTimers::with_base(2);
        new.deadline[0] = Some(Instant::from_micros(10)).into();
        assert_eq!(
            t.settle(Some(&mut new), Instant::from_micros(10), true),
            Settle::Stale
        );
        // Peeking (consume = false) never fires.
        t.set(&mut new, 9, TimerKind::AckTimeout, Instant::from_micros(20));
        assert!(t.head_is_pending(Some(&new)));
        assert_eq!(
            t.settle(Some(&mut new), Instant::from_micros(30), false),
            Settle::Pending
        );
        assert_eq!(t.peek().map(|e| e.0), Some(Instant::from_micros(20)));
    }

    /// `head_is_pending` answers true exactly when `settle(.., false)` would answer `Pending` leaving the heap and
    /// the QP's slots as they were: live entries at the deadline, re-armed later, re-armed earlier (stale head),
    /// cancelled, another QP generation.
    #[test]
    fn head_is_pending_agrees_with_settle_without_consuming() {
        type Setup<'a> = &'a dyn Fn(&mut Timers, &mut QpTimers);
        let cases: [Setup; 5] = [
            &|t, q| t.set(q, 9, TimerKind::Shaper, Instant::from_micros(40)),
            &|t, q| {
                t.set(q, 9, TimerKind::Shaper, Instant::from_micros(40));
                t.set(q, 9, TimerKind::Shaper, Instant::from_micros(90));
            },
            &|t, q| {
                t.set(q, 9, TimerKind::RateTimer, Instant::from_micros(60));
                t.set(q, 9, TimerKind::RateTimer, Instant::from_micros(30));
                Timers::cancel(q, TimerKind::RateTimer);
                t.set(q, 9, TimerKind::RateTimer, Instant::from_micros(70));
            },
            &|t, q| {
                t.set(q, 9, TimerKind::AckTimeout, Instant::from_micros(10));
                Timers::cancel(q, TimerKind::AckTimeout);
            },
            &|t, _| {
                let mut other = QpTimers::with_base(99);
                t.set(&mut other, 9, TimerKind::CnpPacing, Instant::from_micros(5));
            },
        ];
        for (n, make) in cases.iter().enumerate() {
            let mut t = Timers::default();
            let mut q = QpTimers::with_base(3);
            make(&mut t, &mut q);
            let fast = t.head_is_pending(Some(&q));
            let (heap, slots) = (t.heap.clone().into_sorted_vec(), (q.deadline, q.queued));
            let slow = t.settle(Some(&mut q), Instant::ZERO, false) == Settle::Pending;
            assert_eq!(fast, slow, "case {n}");
            if fast {
                assert_eq!(t.heap.clone().into_sorted_vec(), heap, "case {n}: heap");
                assert_eq!((q.deadline, q.queued), slots, "case {n}: slots");
            }
        }
        assert!(!Timers::default().head_is_pending(None));
    }
}
