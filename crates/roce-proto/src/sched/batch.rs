//! Adaptive batching — the seed's "dynamic batching window" (issue #12; `docs/spec/DCQCN.md §10`).
//!
//! A driver's progress round moves WQEs from the application's rings into the engine and frames from the engine to
//! the link. How much it takes per round is a trade-off the engine can judge from what it measures:
//!
//! * **WQEs per QP per round** ([`Engine::drain_quota`](crate::Engine::drain_quota)): enough to keep the QP's send pipeline one *window* ahead —
//!   the bytes the QP can put on the wire in one smoothed RTT at its shaped rate, but never more than its token-bucket
//!   depth (`§10`: "batching must not create a per-QP burst larger than the shaper depth") — minus what the engine
//!   already holds unsent for it (its queue depth). A deep ring is drained over several rounds instead of flooding
//!   the engine's send queue ahead of the other QPs; a QP whose pipeline is already full takes nothing this round.
//! * **Frames per I/O call** ([`Engine::tx_burst`](crate::Engine::tx_burst)): as many as fit in a quarter of the smoothed RTT at the port's
//!   rate, so a batch's wire time never hides an ACK or a CNP from the engine for more than that (`§10`: CNP handling
//!   is on the critical path; "do not wait for the current batch to drain"); at least 1, at most `max_frames_per_io`.
//!   What is ready (the queue depth) bounds it from below: a call never waits for more.
//!
//! The RTT is measured by the engine (RFC 6298 smoothing, α = 1/8, from RC ACKs; Karn's rule: no sample across a
//! retransmission); until the first sample, and for UC/UD traffic, `SchedConfig::base_rtt` stands in.

use core::time::Duration;

use crate::Psn;
use crate::time::Instant;

/// Limits of the batching window (part of [`SchedConfig`](super::SchedConfig)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchConfig {
    /// Most WQEs taken from one QP's ring per round. Default 64.
    pub max_wqes_per_round: u32,
    /// Most frames per I/O call. Default 64 (the `sendmmsg` batch of the UDP link).
    pub max_frames_per_io: u32,
    /// A batch of frames spans at most `1/rtt_fraction` of the smoothed RTT on the wire. Default 4.
    pub rtt_fraction: u32,
}

impl Default for BatchConfig {
    fn default() -> Self {
        BatchConfig {
            max_wqes_per_round: 64,
            max_frames_per_io: 64,
            rtt_fraction: 4,
        }
    }
}

/// Smoothed round-trip time of the port (RFC 6298 §2: `SRTT ← 7/8 SRTT + 1/8 R`, the first sample taken as is),
/// from RC requests that asked for an ACK; one sample in flight per QP; a retransmission cancels the QP's sample
/// (Karn's rule, RFC 6298 §3).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RttEstimator {
    srtt_ns: u64,
    samples: u64,
}

impl RttEstimator {
    /// Adds a sample.
    pub fn sample(&mut self, rtt: Duration) {
        let r = u64::try_from(rtt.as_nanos()).unwrap_or(u64::MAX).max(1);
        self.srtt_ns = if self.samples == 0 {
            r
        } else {
            // 7/8 · SRTT + 1/8 · R, in integers.
            self.srtt_ns - self.srtt_ns / 8 + r / 8
        };
        self.samples += 1;
    }

    /// The smoothed RTT, `None` before the first sample.
    pub fn srtt(&self) -> Option<Duration> {
        (self.samples > 0).then(|| Duration::from_nanos(self.srtt_ns))
    }

    /// Samples taken.
    pub fn samples(&self) -> u64 {
        self.samples
    }
}

/// A QP's RTT sample in flight: ACKs up to `target` (exclusive) close it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PendingSample {
    pub(crate) target: Psn,
    pub(crate) sent: Instant,
}

/// Bytes one frame batch may take: `rate · srtt / (8 · fraction)`.
pub(crate) fn window_bytes(rate_bps: u64, srtt: Duration, fraction: u32) -> u64 {
    let bits = u128::from(rate_bps) * srtt.as_nanos() / 1_000_000_000;
    u64::try_from(bits / 8 / u128::from(fraction.max(1))).unwrap_or(u64::MAX)
}

/// WQEs to take from a ring holding `pending` for a QP whose window is `window` bytes, whose average WQE is `avg`
/// bytes and that has `unsent` WQEs not yet fully sent in the engine and `free` free send-queue slots (see the module
/// docs). At least one when the engine holds nothing unsent for it.
pub(crate) fn wqe_quota(
    window: u64,
    avg: u64,
    unsent: u32,
    pending: u32,
    free: u32,
    max: u32,
) -> u32 {
    let want = window.div_ceil(avg.max(1)).clamp(1, u64::from(max.max(1))) as u32;
    let mut q = want.saturating_sub(unsent);
    if unsent == 0 {
        q = q.max(1);
    }
    q.min(pending).min(free)
}

/// Frames per I/O call for a window of `window` bytes and frames of `avg` bytes on average, clamped to
/// `1..=max`.
pub(crate) fn frames_per_io(window: u64, avg: u64, max: u32) -> u32 {
    (window / avg.max(1)).clamp(1, u64::from(max.max(1))) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn srtt_follows_rfc6298() {
        let mut r = RttEstimator::default();
        assert_eq!(r.srtt(), None);
        r.sample(Duration::from_micros(80));
        assert_eq!(r.srtt(), Some(Duration::from_micros(80)));
        r.sample(Duration::from_micros(160));
        assert_eq!(r.srtt(), Some(Duration::from_micros(90)));
        for _ in 0..200 {
            r.sample(Duration::from_micros(20));
        }
        let s = r.srtt().unwrap();
        assert!(
            s >= Duration::from_micros(20) && s < Duration::from_nanos(20_100),
            "{s:?}"
        );
    }

    /// The window and both quotas grow with the RTT and with the rate, and are bounded.
    #[test]
    fn quotas_follow_rtt_rate_and_queue_depth() {
        let w = |rate, us| window_bytes(rate, Duration::from_micros(us), 1);
        // 100 Gb/s × 10 µs = 125,000 B; 10 Gb/s × 10 µs = 12,500 B.
        assert_eq!(w(100_000_000_000, 10), 125_000);
        assert_eq!(w(10_000_000_000, 10), 12_500);
        // 64 KiB messages: 2 per round at 125 KB, 1 at 12.5 KB; 64 B messages: the cap.
        assert_eq!(wqe_quota(125_000, 65_536, 0, 100, 100, 64), 2);
        assert_eq!(wqe_quota(12_500, 65_536, 0, 100, 100, 64), 1);
        assert_eq!(wqe_quota(125_000, 64, 0, 100, 100, 64), 64);
        // Queue depth: what the engine already holds unsent counts against the window; a full pipeline takes none.
        assert_eq!(wqe_quota(125_000, 1000, 100, 500, 500, 200), 25);
        assert_eq!(wqe_quota(125_000, 1000, 200, 500, 500, 200), 0);
        // Never more than the ring holds or the send queue has room for.
        assert_eq!(wqe_quota(125_000, 1000, 0, 3, 100, 200), 3);
        assert_eq!(wqe_quota(125_000, 1000, 0, 300, 7, 200), 7);
        // Frames per I/O: a quarter RTT at the port rate, 1..=max.
        let io =
            |rate, us| frames_per_io(window_bytes(rate, Duration::from_micros(us), 4), 4154, 64);
        assert_eq!(io(100_000_000_000, 10), 7);
        assert_eq!(io(100_000_000_000, 100), 64);
        assert_eq!(io(1_000_000_000, 10), 1);
    }
}
