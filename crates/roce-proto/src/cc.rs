//! Rate-control seam (STYLE E5): a per-QP [`RateController`] receives CNPs, transmit events and its own timer, and
//! *computes* the QP's rate; the QP's token-bucket shaper (`crate::sched`, `DCQCN.md §7`) *enforces* it. DCQCN's
//! reaction point plugs in here; the engine ships [`FixedRate`] (line rate or a fixed rate, CNPs only counted).
//!
//! # Contract between a controller and the engine
//!
//! * The engine calls [`on_tx`](RateController::on_tx) for every data frame the shaper released (READ responses,
//!   requests and retransmissions; `bytes` = the whole frame, the wire bytes of `DCQCN.md §10` and `§7 TB7`),
//!   [`on_cnp`](RateController::on_cnp) for every CNP addressed to the QP, and [`on_timer`](RateController::on_timer)
//!   when the instant last returned by [`next_timer`](RateController::next_timer) has come.
//! * After **every** one of those calls, and when the controller is installed, the engine re-reads
//!   [`rate_bps`](RateController::rate_bps) and [`next_timer`](RateController::next_timer). A changed rate goes to the
//!   QP's bucket at once: it refills at the new rate from that instant, a decrease clamps the tokens to
//!   `depth · new / old` (`DCQCN.md §7 TB5`: no burst right after a CNP), and a departure the QP is waiting for is
//!   re-timed (`§2.3 R7`, `§2.4 M7`). So a controller never paces packets itself and needs no "eligible at" logic.
//! * The QP's rate is the smaller of `rate_bps()` and the QP's own limit (`Engine::set_qp_rate_limit`,
//!   `SchedConfig::qp_rate_limit_bps`).

use core::fmt;

use crate::time::Instant;

/// Per-QP reaction-point hook. All inputs carry `now`; no method reads a clock. `Send` so the engine can move to
/// its driver thread. See the [module docs](self) for when the engine calls what.
pub trait RateController: fmt::Debug + Send {
    /// A data frame of `bytes` (whole frame) was released by the shaper at `now`.
    fn on_tx(&mut self, now: Instant, bytes: usize);
    /// A CNP for this QP was received at `now` (`ROCEV2.md §6`).
    fn on_cnp(&mut self, now: Instant);
    /// The rate the QP may send at now, in bits per second (DCQCN's RC); `None` = unlimited (line rate, no
    /// shaping). Re-read after every call into the controller.
    fn rate_bps(&self) -> Option<u64>;
    /// The instant at which the controller next wants [`on_timer`](Self::on_timer) (DCQCN: alpha update, rate
    /// increase). The engine re-reads it after every call into the controller and keeps one `RateTimer` armed.
    fn next_timer(&self) -> Option<Instant> {
        None
    }
    /// Timer callback for [`next_timer`](Self::next_timer).
    fn on_timer(&mut self, _now: Instant) {}
}

/// A fixed-rate (or unlimited) controller: reports `rate_bps` if set, which the QP's shaper enforces; CNPs are
/// counted by the engine and otherwise ignored (no DCQCN).
#[derive(Clone, Debug, Default)]
pub struct FixedRate {
    rate_bps: Option<u64>,
    cnps: u64,
}

impl FixedRate {
    /// Unlimited (line rate).
    pub fn unlimited() -> Self {
        FixedRate::default()
    }
    /// A fixed rate of `rate_bps` bits per second (0 is treated as unlimited).
    pub fn with_rate(rate_bps: u64) -> Self {
        FixedRate {
            rate_bps: (rate_bps > 0).then_some(rate_bps),
            ..Default::default()
        }
    }
    /// CNPs seen.
    pub fn cnps(&self) -> u64 {
        self.cnps
    }
}

impl RateController for FixedRate {
    fn on_tx(&mut self, _now: Instant, _bytes: usize) {}
    fn on_cnp(&mut self, _now: Instant) {
        self.cnps += 1;
    }
    fn rate_bps(&self) -> Option<u64> {
        self.rate_bps
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_rate_reports_its_rate() {
        let mut r = FixedRate::with_rate(8_000_000_000);
        r.on_cnp(Instant::from_micros(1));
        assert_eq!(r.rate_bps(), Some(8_000_000_000));
        assert_eq!(r.cnps(), 1);
        assert_eq!(FixedRate::with_rate(0).rate_bps(), None);
        assert_eq!(FixedRate::unlimited().rate_bps(), None);
    }
}
