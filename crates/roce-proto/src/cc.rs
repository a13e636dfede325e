//! Rate-control seam (STYLE E5/E6): a per-QP [`RateController`] receives CNPs and transmit events and answers
//! when the QP may send next. DCQCN plugs in here later; today the engine ships [`FixedRate`] (line rate or a fixed
//! rate, with CNPs only counted).

use core::fmt;
use core::time::Duration;

use crate::time::Instant;

/// Per-QP reaction-point hook. All inputs carry `now`; no method reads a clock. `Send` so the engine can move to
/// its driver thread.
pub trait RateController: fmt::Debug + Send {
    /// A data packet of `bytes` (whole frame) was handed to the link at `now`.
    fn on_tx(&mut self, now: Instant, bytes: usize);
    /// A CNP for this QP was received at `now` (`ROCEV2.md §6`).
    fn on_cnp(&mut self, now: Instant);
    /// Earliest instant at which the QP may send its next data packet; `<= now` means "now".
    fn eligible_at(&self, now: Instant) -> Instant;
    /// Current rate limit in bits per second (`None` = line rate).
    fn rate_bps(&self) -> Option<u64>;
    /// The instant at which the controller next wants [`on_timer`](Self::on_timer) (DCQCN: alpha update, rate
    /// increase). The engine re-reads it after every call into the controller and keeps one `RateTimer` armed.
    fn next_timer(&self) -> Option<Instant> {
        None
    }
    /// Timer callback for [`next_timer`](Self::next_timer).
    fn on_timer(&mut self, _now: Instant) {}
}

/// A fixed-rate (or unlimited) controller: paces data to `rate_bps` if set; CNPs are counted by the engine and
/// otherwise ignored (no DCQCN yet).
#[derive(Clone, Debug, Default)]
pub struct FixedRate {
    rate_bps: Option<u64>,
    next: Instant,
    cnps: u64,
}

impl FixedRate {
    /// Unlimited (line rate).
    pub fn unlimited() -> Self {
        FixedRate::default()
    }
    /// Paced to `rate_bps` bits per second (0 is treated as unlimited).
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
    fn on_tx(&mut self, now: Instant, bytes: usize) {
        if let Some(r) = self.rate_bps {
            let ns = (bytes as u128 * 8 * 1_000_000_000 / r as u128).min(u64::MAX as u128) as u64;
            let start = if self.next > now { self.next } else { now };
            self.next = start + Duration::from_nanos(ns);
        }
    }
    fn on_cnp(&mut self, _now: Instant) {
        self.cnps += 1;
    }
    fn eligible_at(&self, now: Instant) -> Instant {
        if self.rate_bps.is_some() && self.next > now {
            self.next
        } else {
            now
        }
    }
    fn rate_bps(&self) -> Option<u64> {
        self.rate_bps
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_rate_paces() {
        let mut r = FixedRate::with_rate(8_000_000_000); // 1 byte per ns
        let t0 = Instant::from_micros(1);
        assert_eq!(r.eligible_at(t0), t0);
        r.on_tx(t0, 1000);
        assert_eq!(r.eligible_at(t0), t0 + Duration::from_nanos(1000));
        let mut u = FixedRate::unlimited();
        u.on_tx(t0, 1000);
        assert_eq!(u.eligible_at(t0), t0);
    }
}
