//! The send scheduler: which QP transmits next and how fast (`../shared/dcqcn/DCQCN.md §7, §9, §10`).
//!
//! * [`shaper`]: token buckets (per QP; the QP's rate is its [`RateController`](crate::RateController)'s
//!   `rate_bps()`, capped by the QP's own rate limit).
//!
//! The rate seam: a rate controller (DCQCN's reaction point, or [`FixedRate`](crate::FixedRate)) only *computes* the
//! QP's rate; the engine re-reads `rate_bps()` after every call into the controller (`on_tx`, `on_cnp`, `on_timer`,
//! installation) and hands it to the QP's token bucket, which enforces it: refill at that rate, tokens clamped when
//! the rate drops (no burst right after a CNP, `DCQCN.md §7 TB5`), and a pending departure re-timed on every change
//! (`§2.3 R7`, `§2.4 M7`).

pub mod shaper;

use core::time::Duration;

use crate::time::Instant;
pub use shaper::TokenBucket;

/// Upper bound of the bytes a RoCE v2 frame carries besides its payload: Ethernet 14 + 802.1Q 4 + IPv6 40 + UDP 8 +
/// BTH 12 + the largest extension-header set (AtomicETH 28; RETH 16 + ImmDt 4 = 20; DETH 8 + ImmDt 4 = 12;
/// AETH 4 + AtomicAckETH 8 = 12) + pad 3 + ICRC 4 = 113, rounded up (`ROCEV2.md §1`). Used for the largest frame a
/// QP can send next (shaper conformance, `DCQCN.md §7 TB2`) and for the DWRR quantum (`§9 S2`).
pub const MAX_FRAME_OVERHEAD: u32 = 128;

/// Scheduler and shaper configuration (part of [`EngineConfig`](crate::EngineConfig)).
///
/// The default per-QP bucket depth is `1.5 · BDP = 1.5 · line_rate_bps · base_rtt / 8` (`DCQCN.md §7 TB3`), floored at
/// one frame. With the defaults — a 100 Gb/s line and a 10 µs RTT, the TB3 example for a 100G NIC — that is
/// 187,500 bytes. Neither value is measured: `line_rate_bps` is the NIC speed the driver declares (the simulated
/// link's `bandwidth_bps`, or the real port's speed), `base_rtt` the fabric's unloaded round trip. Set
/// `qp_burst_bytes` to override the depth (`rocev2 perf --burst`; down to one frame gives per-packet pacing, what
/// ConnectX and HPCC ns-3 do, `TB6`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SchedConfig {
    /// Line rate `C` of the port in bit/s: the BDP of the default bucket depth, and the rate an unlimited QP is
    /// assumed to have when it first gets a limit (`TB5` clamp). Default 100 Gb/s.
    pub line_rate_bps: u64,
    /// Base round-trip time for the BDP of the default bucket depth. Default 10 µs (`DCQCN.md §7 TB3`).
    pub base_rtt: Duration,
    /// Per-QP bucket depth in bytes; `None` = `1.5 · line_rate_bps · base_rtt / 8`. Floored at one frame.
    pub qp_burst_bytes: Option<u64>,
    /// Rate limit given to every new QP in bit/s (`None` = none); [`Engine::set_qp_rate_limit`] changes one QP's.
    /// The QP's rate is the smaller of this limit and its rate controller's rate.
    ///
    /// [`Engine::set_qp_rate_limit`]: crate::Engine::set_qp_rate_limit
    pub qp_rate_limit_bps: Option<u64>,
}

impl Default for SchedConfig {
    fn default() -> Self {
        SchedConfig {
            line_rate_bps: 100_000_000_000,
            base_rtt: Duration::from_micros(10),
            qp_burst_bytes: None,
            qp_rate_limit_bps: None,
        }
    }
}

impl SchedConfig {
    /// The default per-QP bucket depth in bytes: `1.5 · line_rate_bps · base_rtt / 8` (`DCQCN.md §7 TB3`).
    pub fn bdp_depth_bytes(&self) -> u64 {
        let bits = u128::from(self.line_rate_bps) * self.base_rtt.as_nanos() / 1_000_000_000;
        u64::try_from(bits * 3 / 16).unwrap_or(u64::MAX)
    }

    /// The per-QP bucket depth for a QP whose largest frame is `max_frame` bytes.
    pub(crate) fn qp_depth(&self, max_frame: u32) -> u64 {
        self.qp_burst_bytes
            .unwrap_or_else(|| self.bdp_depth_bytes())
            .max(u64::from(max_frame))
    }
}

/// Per-QP shaping state.
#[derive(Clone, Copy, Debug)]
pub(crate) struct QpShape {
    /// The QP's bucket (rate = min(controller rate, `limit`)).
    pub(crate) bucket: TokenBucket,
    /// The QP's own rate limit (`ibv_modify_qp_rate_limit`'s `rate_limit`, `DCQCN.md §8`).
    pub(crate) limit: Option<u64>,
    /// Depth set for this QP (`max_burst_sz`), else the configured default.
    pub(crate) burst: Option<u64>,
    /// Largest frame this QP can send next (path MTU + [`MAX_FRAME_OVERHEAD`]): the shaper's conformance need.
    pub(crate) max_frame: u32,
    /// Waiting for its `Shaper` timer (not on the data queue).
    pub(crate) parked: bool,
}

impl QpShape {
    pub(crate) fn new(cfg: &SchedConfig, pmtu: u32, now: Instant) -> QpShape {
        let max_frame = pmtu + MAX_FRAME_OVERHEAD;
        QpShape {
            bucket: TokenBucket::new(cfg.qp_rate_limit_bps, cfg.qp_depth(max_frame), now),
            limit: cfg.qp_rate_limit_bps,
            burst: None,
            max_frame,
            parked: false,
        }
    }

    /// The bucket depth this QP should have.
    pub(crate) fn depth(&self, cfg: &SchedConfig) -> u64 {
        self.burst
            .unwrap_or_else(|| cfg.qp_depth(self.max_frame))
            .max(u64::from(self.max_frame))
    }

    fn effective(&self, controller: Option<u64>) -> Option<u64> {
        match (controller.filter(|&r| r > 0), self.limit) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// A rate change from the controller: sets the bucket rate to `min(controller, limit)` with the `TB5` clamp;
    /// returns whether it changed.
    pub(crate) fn apply(&mut self, now: Instant, controller: Option<u64>, line_rate: u64) -> bool {
        let eff = self.effective(controller);
        self.bucket.set_rate(now, eff, line_rate)
    }

    /// (Re)configuration — a controller installed, a limit or depth set: a fresh, full bucket at
    /// `min(controller, limit)`, like a new rate-limit entry (`ibv_modify_qp_rate_limit`, `DCQCN.md §8`).
    pub(crate) fn reset(&mut self, now: Instant, controller: Option<u64>, cfg: &SchedConfig) {
        let eff = self.effective(controller);
        self.bucket = TokenBucket::new(eff, self.depth(cfg), now);
    }

    /// When the QP may send its next frame.
    pub(crate) fn eligible_at(&self, now: Instant) -> Instant {
        self.bucket.eligible_at(now, self.max_frame)
    }
}

impl core::fmt::Display for QpShape {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "{} limit={} max_frame={} parked={}",
            self.bucket,
            Rate(self.limit),
            self.max_frame,
            self.parked
        )
    }
}

/// A rate for display: `1.250 Gb/s`, or `unlimited`.
pub(crate) struct Rate(pub(crate) Option<u64>);

impl core::fmt::Display for Rate {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self.0 {
            Some(r) => write!(f, "{:.3} Gb/s", r as f64 / 1e9),
            None => f.write_str("unlimited"),
        }
    }
}

/// The engine's scheduling state: one [`QpShape`] per QP slot (sized at `create_qp`), and the latest instant the
/// engine was given (for commands that carry no `now`).
#[derive(Debug)]
pub(crate) struct Scheduler {
    cfg: SchedConfig,
    qps: Vec<QpShape>,
    now: Instant,
}

impl Scheduler {
    pub(crate) fn new(cfg: SchedConfig) -> Scheduler {
        Scheduler {
            cfg,
            qps: Vec::new(),
            now: Instant::ZERO,
        }
    }

    /// The latest instant seen by [`observe`](Self::observe).
    pub(crate) fn now(&self) -> Instant {
        self.now
    }

    /// Records the engine's current instant (inputs and outputs call it).
    pub(crate) fn observe(&mut self, now: Instant) {
        if now > self.now {
            self.now = now;
        }
    }

    /// A QP was created in `slot` (control path: may grow the table).
    pub(crate) fn add_qp(&mut self, slot: usize, pmtu: u32) {
        let s = QpShape::new(&self.cfg, pmtu, self.now);
        if slot >= self.qps.len() {
            self.qps.resize(slot + 1, s);
        }
        self.qps[slot] = s;
    }

    /// The QP's path MTU is now `pmtu` (its largest frame, hence its bucket's floor).
    pub(crate) fn set_pmtu(&mut self, slot: usize, pmtu: u32) {
        let (cfg, now) = (&self.cfg, self.now);
        if let Some(s) = self.qps.get_mut(slot) {
            s.max_frame = pmtu + MAX_FRAME_OVERHEAD;
            let d = s.depth(cfg);
            s.bucket.set_depth(now, d);
        }
    }

    /// Sets the QP's own limit and depth; the bucket starts full at the new rate (`controller` = the QP's controller
    /// rate now).
    pub(crate) fn set_limit(
        &mut self,
        slot: usize,
        rate: Option<u64>,
        burst: Option<u64>,
        controller: Option<u64>,
    ) {
        let (cfg, now) = (&self.cfg, self.now);
        if let Some(s) = self.qps.get_mut(slot) {
            s.limit = rate;
            s.burst = burst;
            s.reset(now, controller, cfg);
        }
    }

    /// A new controller was installed on the QP: fresh bucket at its rate.
    pub(crate) fn reset_qp(&mut self, slot: usize, controller: Option<u64>) {
        let (cfg, now) = (&self.cfg, self.now);
        if let Some(s) = self.qps.get_mut(slot) {
            s.reset(now, controller, cfg);
        }
    }

    pub(crate) fn qp(&self, slot: usize) -> Option<&QpShape> {
        self.qps.get(slot)
    }

    pub(crate) fn qp_mut(&mut self, slot: usize) -> Option<&mut QpShape> {
        self.qps.get_mut(slot)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_depth_is_one_and_a_half_bdp() {
        let c = SchedConfig::default();
        assert_eq!(c.bdp_depth_bytes(), 187_500);
        let c40 = SchedConfig {
            line_rate_bps: 40_000_000_000,
            base_rtt: Duration::from_nanos(8_400),
            ..SchedConfig::default()
        };
        // DCQCN.md §7 TB3: 40G × 8.4 µs ⇒ BDP 42 KB, b = 63 KB.
        assert_eq!(c40.bdp_depth_bytes(), 63_000);
        let one = SchedConfig {
            qp_burst_bytes: Some(1),
            ..SchedConfig::default()
        };
        assert_eq!(one.qp_depth(1152), 1152);
    }
}
