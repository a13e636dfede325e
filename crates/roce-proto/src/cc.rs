//! Rate-control seam (STYLE E5): a per-QP [`RateController`] receives CNPs, transmit events and its own timer, and
//! *computes* the QP's rate; the QP's token-bucket shaper (`crate::sched`, `DCQCN.md §7`) *enforces* it.
//! Implementations: [`FixedRate`] (line rate or a fixed rate; CNPs ignored, `rp_cnp_ignored`) and [`Dcqcn`], the DCQCN
//! reaction point (`docs/spec/DCQCN.md` §2.3–§2.5), which the engine gives every new QP when
//! [`crate::EngineConfig::dcqcn`] is set.
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

mod dcqcn;
mod params;

use core::fmt;

use crate::time::Instant;

pub use dcqcn::{Dcqcn, DcqcnConfig, EXACT_STEPS, Profile, RpAction, RpEvent, RpEventKind};
pub use params::{NpParams, Ns3MlxParams, NvidiaParams, PaperParams, ParamError, ParamValue};

/// A snapshot of a controller's state for dumps and rate logs ([`RateController::metrics`]).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct RateMetrics {
    /// Current rate (bit/s, DCQCN RC); `None` = line rate / unlimited.
    pub rate_bps: Option<u64>,
    /// Target rate (bit/s), for controllers that have one (DCQCN RT).
    pub target_bps: Option<u64>,
    /// Congestion estimate α (DCQCN) at the instant asked for.
    pub alpha: Option<f64>,
    /// The controller is limiting the QP because of congestion (DCQCN: a CNP was seen).
    pub limited: bool,
}

/// Per-QP reaction-point hook. All inputs carry `now`; no method reads a clock. `Send` so the engine can move to
/// its driver thread. See the [module docs](self) for when the engine calls what. The `Debug` form is the
/// controller's state in the QP dump (`rocev2 stat --qp`): write it for operators, in the controller's own terms
/// (as [`Dcqcn`]'s `dcqcn paper rc=... alpha=...`), not a derived Rust struct dump.
pub trait RateController: fmt::Debug + Send {
    /// A data frame of `bytes` (whole frame) was released by the shaper at `now`.
    fn on_tx(&mut self, now: Instant, bytes: usize);
    /// A CNP for this QP was received at `now` (`ROCEV2.md §6`). Returns whether the controller reacted to it
    /// (counted as `rp_cnp_handled`) or ignored it (`rp_cnp_ignored`, mlx5: no reaction point enabled).
    fn on_cnp(&mut self, now: Instant) -> bool;
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
    /// State for the QP dump and rate logs, as of `now`.
    fn metrics(&self, _now: Instant) -> RateMetrics {
        RateMetrics {
            rate_bps: self.rate_bps(),
            ..RateMetrics::default()
        }
    }
    /// The QP was reset: forget congestion state.
    fn reset(&mut self) {}
}

/// A fixed-rate (or unlimited) controller: reports `rate_bps` if set, which the QP's shaper enforces; CNPs are
/// counted by the engine and otherwise ignored (no DCQCN).
#[derive(Clone, Default)]
pub struct FixedRate {
    rate_bps: Option<u64>,
    cnps: u64,
}

/// The QP dump's form: `fixed cnps=N` (the rate is printed beside it).
impl fmt::Debug for FixedRate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "fixed cnps={}", self.cnps)
    }
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

/// The DCQCN reaction point as the engine's per-QP controller: RC is the rate the shaper enforces; RC starts at the
/// configuration's line rate, so a QP never sends faster than the emulated port (`DCQCN.md` R0).
impl RateController for Dcqcn {
    fn on_tx(&mut self, now: Instant, bytes: usize) {
        Dcqcn::on_tx(self, now, bytes as u64);
    }
    fn on_cnp(&mut self, now: Instant) -> bool {
        Dcqcn::on_cnp(self, now);
        true
    }
    fn rate_bps(&self) -> Option<u64> {
        Some(Dcqcn::rate_bps(self))
    }
    fn next_timer(&self) -> Option<Instant> {
        Dcqcn::next_timer(self)
    }
    fn on_timer(&mut self, now: Instant) {
        Dcqcn::on_timer(self, now);
    }
    fn metrics(&self, now: Instant) -> RateMetrics {
        RateMetrics {
            rate_bps: Some(Dcqcn::rate_bps(self)),
            target_bps: Some(self.rt_bps() as u64),
            alpha: Some(self.alpha_at(now)),
            limited: self.is_limited(),
        }
    }
    fn reset(&mut self) {
        Dcqcn::reset(self);
    }
}

impl RateController for FixedRate {
    fn on_tx(&mut self, _now: Instant, _bytes: usize) {}
    fn on_cnp(&mut self, _now: Instant) -> bool {
        self.cnps += 1;
        false
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
        assert!(
            !r.on_cnp(Instant::from_micros(2)),
            "ignored: no reaction point"
        );
        assert_eq!(FixedRate::with_rate(0).rate_bps(), None);
        assert_eq!(FixedRate::unlimited().rate_bps(), None);
    }
}
