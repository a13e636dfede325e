//! Timers as data (STYLE E4): a binary heap of `(deadline, qpn, kind, generation)` with lazy invalidation.
//!
//! Each QP keeps one generation per [`TimerKind`]; re-arming or cancelling bumps it, so stale heap entries are
//! skipped when they surface. `Timers::next` is what `Engine::poll_timeout` returns.

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
}

pub(crate) const TIMER_KINDS: usize = 3;

/// One QP's timer slots.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct QpTimers {
    pub(crate) deadline: [Option<Instant>; TIMER_KINDS],
    generation: [u32; TIMER_KINDS],
}

impl QpTimers {
    /// Timer slots whose generations start at `base`, so that heap entries left by a destroyed QP that used the same
    /// QPN can never match the new QP's timers.
    pub(crate) fn with_base(base: u32) -> QpTimers {
        QpTimers {
            deadline: [None; TIMER_KINDS],
            generation: [base; TIMER_KINDS],
        }
    }

    pub(crate) fn get(&self, k: TimerKind) -> Option<Instant> {
        self.deadline[k as usize]
    }
}

#[derive(Debug, Default)]
pub(crate) struct Timers {
    heap: BinaryHeap<Reverse<(Instant, u32, u8, u32)>>,
}

impl Timers {
    pub(crate) fn set(&mut self, qt: &mut QpTimers, qpn: u32, k: TimerKind, at: Instant) {
        let i = k as usize;
        if qt.deadline[i] == Some(at) {
            return;
        }
        qt.generation[i] = qt.generation[i].wrapping_add(1);
        qt.deadline[i] = Some(at);
        self.heap
            .push(Reverse((at, qpn, k as u8, qt.generation[i])));
    }

    pub(crate) fn cancel(qt: &mut QpTimers, k: TimerKind) {
        let i = k as usize;
        if qt.deadline[i].is_some() {
            qt.generation[i] = qt.generation[i].wrapping_add(1);
            qt.deadline[i] = None;
        }
    }

    /// Earliest live deadline; discards stale entries at the head (`live` says whether an entry is current).
    pub(crate) fn next(&mut self, mut live: impl FnMut(u32, u8, u32) -> bool) -> Option<Instant> {
        while let Some(Reverse((at, q, k, g))) = self.heap.peek().copied() {
            if live(q, k, g) {
                return Some(at);
            }
            self.heap.pop();
        }
        None
    }

    /// Pops one entry due at or before `now` (stale entries included; the caller checks the generation).
    pub(crate) fn pop_due(&mut self, now: Instant) -> Option<(u32, TimerKind, u32)> {
        let Reverse((at, q, k, g)) = *self.heap.peek()?;
        if at > now {
            return None;
        }
        self.heap.pop();
        let kind = match k {
            0 => TimerKind::AckTimeout,
            1 => TimerKind::RnrRetry,
            _ => TimerKind::Shaper,
        };
        Some((q, kind, g))
    }

    pub(crate) fn is_current(qt: &QpTimers, k: TimerKind, generation: u32) -> bool {
        qt.deadline[k as usize].is_some() && qt.generation[k as usize] == generation
    }

    pub(crate) fn gen_of(qt: &QpTimers, k: u8) -> Option<u32> {
        let i = k as usize;
        if i < TIMER_KINDS && qt.deadline[i].is_some() {
            Some(qt.generation[i])
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rearm_invalidates_old_entries() {
        let mut t = Timers::default();
        let mut q = QpTimers::default();
        t.set(&mut q, 7, TimerKind::AckTimeout, Instant::from_micros(10));
        t.set(&mut q, 7, TimerKind::AckTimeout, Instant::from_micros(20));
        let qc = q;
        assert_eq!(
            t.next(|_, k, g| Timers::gen_of(&qc, k) == Some(g)),
            Some(Instant::from_micros(20))
        );
        let (qpn, k, g) = t.pop_due(Instant::from_micros(25)).unwrap();
        assert_eq!((qpn, k), (7, TimerKind::AckTimeout));
        assert!(Timers::is_current(&q, k, g));
        Timers::cancel(&mut q, TimerKind::AckTimeout);
        assert!(!Timers::is_current(&q, k, g));
        assert_eq!(t.pop_due(Instant::from_micros(25)), None);
    }
}
