//! Token-bucket shaper (`docs/spec/DCQCN.md §7`; the "next eligible instant" form of STYLE E6).
//!
//! One bucket per QP (rate = the QP's rate controller output, e.g. DCQCN's RC, capped by the QP's own rate limit),
//! one per traffic class and one for the port. The bucket never sleeps and never spins: [`TokenBucket::eligible_at`]
//! answers when a frame may leave, and the scheduler arms one timer for that instant.
//!
//! Rules and where they come from:
//!
//! * **Lazy refill** (`DCQCN.md §7 TB1`): tokens grow by `rate · (now − last)` up to the depth, computed when
//!   asked; no per-tick work.
//! * **Conformance** (`TB2`): a frame may leave when the bucket holds at least `need` bytes, where the caller passes
//!   the *largest* frame the flow can send next (its path MTU plus the largest RoCE header stack), because the
//!   scheduler decides before the requester has built the frame. The bucket is then charged the frame's real length
//!   ([`TokenBucket::consume`]). Charging exactly what left keeps the long-run rate exact for a backlogged flow; asking
//!   for a full frame keeps the bucket from ever going negative, so the arrival curve is `bytes(τ) ≤ b + r·τ` with no
//!   extra MTU (the "deficit variant" of TB2 would add one).
//! * **Depth** (`TB3`): `b = 1.5 · C · RTT / 8`, floored at one frame; see `SchedConfig` for which `C` and `RTT`.
//! * **Rate cut** (`TB5`): on a decrease the tokens are clamped to `b · r_new / r_old`, so a flow told to slow down
//!   (a CNP) cannot first dump a full bucket at line rate. No clamp on an increase. A pending departure is re-timed
//!   by asking [`TokenBucket::eligible_at`] again (`R7`/`M7`: "on any RC change the pending departure is re-timed").
//! * **Credit lost while backlogged** (a measurement, not a rule): `TB1` caps the tokens at the depth, which is what
//!   bounds a burst after an *idle* period (`TB2`'s arrival curve `b + r·τ`). The same cap also discards the tokens
//!   that accrue while the flow *has frames waiting* but is not served — in a software NIC, when the thread that
//!   drives the engine is descheduled for longer than the bucket's depth lasts (`b / r`: 16 ms for 2 MB at 1 Gb/s).
//!   Those bytes the flow was entitled to are gone, and its long-run rate falls short of `r` by exactly them. The
//!   bucket counts them ([`TokenBucket::credit_lost_bytes`]) over the spans its owner marks as backlogged
//!   ([`TokenBucket::set_backlogged`]); accrual while idle is clamped without counting (normal token-bucket
//!   behaviour), and so are the deliberate `TB5` clamp and a depth reduction. So for a flow backlogged throughout,
//!   `bytes sent = b₀ + r·T − credit lost − b_T` (tokens at the start and the end): the shortfall the host caused is
//!   visible instead of looking like a shaper error.
//!
//! Arithmetic is exact integer arithmetic: a token is one bit·nanosecond per second (a byte is `8·10⁹` tokens), so a
//! refill is `elapsed_ns · rate_bps` with no rounding and no drift however long a flow runs; only the instant returned
//! by `eligible_at` is rounded, up, to the next nanosecond.

use crate::time::Instant;
use core::time::Duration;

/// Tokens per byte: 8 bits × 10⁹ ns/s (a byte at `r` bit/s takes `8·10⁹ / r` ns).
const TOKENS_PER_BYTE: i64 = 8_000_000_000;

/// Largest depth a bucket accepts (1 GiB; keeps the token count inside `i64`).
pub const MAX_DEPTH_BYTES: u64 = 1 << 30;

/// A token bucket with an optional rate (`None` = unlimited: always eligible, nothing charged).
///
/// Units: rates in bits per second, sizes in bytes of the frames the bucket is charged with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TokenBucket {
    /// Refill rate in bit/s; 0 = unlimited.
    rate_bps: u64,
    /// Depth in tokens.
    depth: i64,
    /// Tokens at `last`.
    tokens: i64,
    last: Instant,
    /// Whether accrual from `last` on happens while the owner has frames waiting (overflow then counts as lost).
    backlogged: bool,
    /// Tokens discarded at the depth while backlogged, in all.
    lost: u128,
}

impl TokenBucket {
    /// A full bucket of `depth_bytes` (clamped to 1..=[`MAX_DEPTH_BYTES`]) refilling at `rate_bps` (`None` or 0 =
    /// unlimited).
    pub fn new(rate_bps: Option<u64>, depth_bytes: u64, now: Instant) -> TokenBucket {
        let depth = depth_bytes.clamp(1, MAX_DEPTH_BYTES) as i64 * TOKENS_PER_BYTE;
        TokenBucket {
            rate_bps: rate_bps.unwrap_or(0),
            depth,
            tokens: depth,
            last: now,
            backlogged: false,
            lost: 0,
        }
    }

    /// The refill rate in bit/s (`None` = unlimited).
    pub fn rate_bps(&self) -> Option<u64> {
        (self.rate_bps > 0).then_some(self.rate_bps)
    }

    /// The depth in bytes.
    pub fn depth_bytes(&self) -> u64 {
        (self.depth / TOKENS_PER_BYTE) as u64
    }

    /// Whole bytes in the bucket at `now` (may be negative after a frame larger than `need` was charged).
    pub fn tokens_bytes(&self, now: Instant) -> i64 {
        self.tokens_at(now) / TOKENS_PER_BYTE
    }

    fn tokens_at(&self, now: Instant) -> i64 {
        if self.rate_bps == 0 {
            return self.depth;
        }
        let dt = now.as_nanos().saturating_sub(self.last.as_nanos());
        let add = u128::from(dt) * u128::from(self.rate_bps);
        let room = (self.depth - self.tokens).max(0) as u128;
        if add >= room {
            self.depth.max(self.tokens)
        } else {
            self.tokens + add as i64
        }
    }

    fn refill(&mut self, now: Instant) {
        if self.backlogged && self.rate_bps != 0 {
            let dt = now.as_nanos().saturating_sub(self.last.as_nanos());
            let add = u128::from(dt) * u128::from(self.rate_bps);
            let room = (self.depth - self.tokens).max(0) as u128;
            self.lost = self.lost.saturating_add(add.saturating_sub(room));
        }
        self.tokens = self.tokens_at(now);
        if now > self.last {
            self.last = now;
        }
    }

    /// Marks, at `now`, whether the bucket's owner has frames waiting to send from now on. Tokens accrued up to `now`
    /// are credited under the previous mark first. While backlogged, tokens that would overflow the depth are counted
    /// in [`credit_lost_bytes`](Self::credit_lost_bytes) (see the module docs). O(1), no allocation.
    pub fn set_backlogged(&mut self, now: Instant, backlogged: bool) {
        if backlogged != self.backlogged {
            self.refill(now);
            self.backlogged = backlogged;
        }
    }

    /// Whether the bucket is marked backlogged ([`set_backlogged`](Self::set_backlogged)).
    pub fn is_backlogged(&self) -> bool {
        self.backlogged
    }

    /// Whole bytes of credit discarded at the depth while backlogged, up to the last refill (a charge, a rate or
    /// depth change, a backlog mark). Never counts idle overflow, the `TB5` clamp or a depth cut; survives
    /// [`restart`](Self::restart).
    pub fn credit_lost_bytes(&self) -> u64 {
        u64::try_from(self.lost / TOKENS_PER_BYTE as u128).unwrap_or(u64::MAX)
    }

    /// Starts over at `now` as a full bucket of `depth_bytes` refilling at `rate_bps` (a new rate-limit entry), not
    /// backlogged. Credit lost before `now` is kept (and counted up to `now` if backlogged).
    pub fn restart(&mut self, now: Instant, rate_bps: Option<u64>, depth_bytes: u64) {
        self.refill(now);
        let lost = self.lost;
        *self = TokenBucket::new(rate_bps, depth_bytes, self.last.max(now));
        self.lost = lost;
    }

    /// The earliest instant (≥ `now`) at which the bucket holds `need_bytes` (capped at the depth, so a full bucket
    /// always conforms). `now` itself when unlimited or already conforming (`DCQCN.md §7 TB2`).
    pub fn eligible_at(&self, now: Instant, need_bytes: u32) -> Instant {
        if self.rate_bps == 0 {
            return now;
        }
        let need = (i64::from(need_bytes) * TOKENS_PER_BYTE).min(self.depth);
        let have = self.tokens_at(now);
        if have >= need {
            return now;
        }
        let missing = (need - have) as u128;
        let ns = missing.div_ceil(u128::from(self.rate_bps));
        now + Duration::from_nanos(u64::try_from(ns).unwrap_or(u64::MAX))
    }

    /// Charges a frame of `bytes` that left at `now` (no-op when unlimited).
    pub fn consume(&mut self, now: Instant, bytes: usize) {
        if self.rate_bps == 0 {
            return;
        }
        self.refill(now);
        let cost = (bytes as i64).saturating_mul(TOKENS_PER_BYTE);
        self.tokens = self.tokens.saturating_sub(cost);
    }

    /// Changes the rate at `now` (`None` or 0 = unlimited). Tokens earned so far are credited at the old rate first.
    /// On a decrease the tokens are clamped to `depth · new / old` (`DCQCN.md §7 TB5`); leaving unlimited counts as a
    /// decrease from `line_rate_bps`. Returns whether the rate changed.
    pub fn set_rate(&mut self, now: Instant, rate_bps: Option<u64>, line_rate_bps: u64) -> bool {
        let new = rate_bps.unwrap_or(0);
        if new == self.rate_bps {
            return false;
        }
        self.refill(now);
        self.last = self.last.max(now);
        let old = if self.rate_bps == 0 {
            line_rate_bps.max(1)
        } else {
            self.rate_bps
        };
        if new != 0 && new < old {
            let cap = (self.depth as u128 * u128::from(new) / u128::from(old)) as i64;
            self.tokens = self.tokens.min(cap);
        }
        if new == 0 {
            // Unlimited: nothing is charged any more; a later limit starts from a full bucket (then clamped).
            self.tokens = self.depth;
        }
        self.rate_bps = new;
        true
    }

    /// Changes the depth (bytes, clamped to 1..=[`MAX_DEPTH_BYTES`]); tokens above the new depth are dropped.
    pub fn set_depth(&mut self, now: Instant, depth_bytes: u64) {
        self.refill(now);
        self.depth = depth_bytes.clamp(1, MAX_DEPTH_BYTES) as i64 * TOKENS_PER_BYTE;
        self.tokens = self.tokens.min(self.depth);
    }
}

impl core::fmt::Display for TokenBucket {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "rate={} depth={} B tokens={} B@{} backlogged={} credit_lost={} B",
            super::Rate(self.rate_bps()),
            self.depth_bytes(),
            self.tokens / TOKENS_PER_BYTE,
            self.last,
            self.backlogged,
            self.credit_lost_bytes()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: u64 = 1_000;

    fn t(ns: u64) -> Instant {
        Instant::from_nanos(ns)
    }

    /// `DCQCN.md §7` check (a): r = 10 G, C = 40 G, b = 60 KB, 1000-B frames, full bucket: the first frames leave
    /// back-to-back at line rate for b·C/(C − r) = 80 KB (16 µs), then one frame every 0.8 µs.
    #[test]
    fn burst_then_spacing() {
        let line = 40_000_000_000u64;
        let mut b = TokenBucket::new(Some(10_000_000_000), 60_000, t(0));
        let mut now = 0u64;
        let mut sent = Vec::new();
        // The "wire" serialises one 1000-B frame per 200 ns at 40 G.
        for _ in 0..200 {
            let at = b.eligible_at(t(now), 1000).as_nanos().max(now);
            b.consume(t(at), 1000);
            sent.push(at);
            now = at + 1000 * 8 * 1_000_000_000 / line;
        }
        let burst = sent.windows(2).take_while(|w| w[1] - w[0] == 200).count() + 1;
        // 80 KB = 80 frames (the last one of the burst may straddle: ±1).
        assert!((79..=81).contains(&burst), "burst of {burst} frames");
        for w in sent[burst + 1..].windows(2) {
            assert_eq!(w[1] - w[0], 800, "{sent:?}");
        }
    }

    /// `DCQCN.md §7` checks (b) and (c): over 10 ms the mean rate is r (exactly, up to one frame), and the bytes in
    /// every interval never exceed b + r·τ.
    #[test]
    fn mean_rate_and_arrival_curve() {
        let r = 3_300_000_000u64;
        let depth = 20_000u64;
        let mut b = TokenBucket::new(Some(r), depth, t(0));
        let mut now = 0u64;
        let mut log = Vec::new();
        let sizes = [1078u32, 64, 4154, 300, 2000];
        let mut k = 0;
        while now < 10_000 * US {
            let len = sizes[k % sizes.len()];
            k += 1;
            let at = b.eligible_at(t(now), 4154).as_nanos().max(now);
            b.consume(t(at), len as usize);
            log.push((at, len as u64));
            now = at;
        }
        let total: u64 = log.iter().map(|x| x.1).sum();
        let expect = r as f64 * now as f64 / 8e9 + depth as f64;
        assert!(
            (total as f64 - expect).abs() <= 4154.0,
            "{total} vs {expect}"
        );
        // Arrival curve on every window starting at a departure (O(n²) on a short prefix).
        for i in 0..400 {
            let mut bytes = 0u64;
            for j in i..log.len().min(i + 400) {
                bytes += log[j].1;
                let tau = log[j].0 - log[i].0;
                let bound = depth as f64 + r as f64 * tau as f64 / 8e9;
                assert!(bytes as f64 <= bound + 1e-6, "window {i}..={j}");
            }
        }
    }

    /// `DCQCN.md §7` check (d) and TB5: a cut 40 → 20 G clamps the tokens to half the depth, so the bytes sent in the
    /// next 10 µs are at most b/2 + 25 KB; without the clamp a full bucket would leave at once.
    #[test]
    fn cut_clamps_tokens() {
        let mut b = TokenBucket::new(Some(40_000_000_000), 60_000, t(0));
        assert!(b.set_rate(t(0), Some(20_000_000_000), 100_000_000_000));
        assert_eq!(b.tokens_bytes(t(0)), 30_000);
        let (mut now, mut bytes) = (0u64, 0u64);
        loop {
            let at = b.eligible_at(t(now), 1000).as_nanos().max(now);
            if at > 10 * US {
                break;
            }
            b.consume(t(at), 1000);
            bytes += 1000;
            now = at;
        }
        assert!(bytes <= 30_000 + 25_000, "{bytes}");
        // An increase does not clamp; tokens earned at the old rate are kept.
        let mut c = TokenBucket::new(Some(1_000_000_000), 10_000, t(0));
        c.consume(t(0), 10_000);
        assert!(c.set_rate(t(40 * US), Some(2_000_000_000), 0));
        assert_eq!(c.tokens_bytes(t(40 * US)), 5_000);
        assert!(!c.set_rate(t(40 * US), Some(2_000_000_000), 0));
    }

    #[test]
    fn unlimited_and_transitions() {
        let mut b = TokenBucket::new(None, 10_000, t(0));
        b.consume(t(0), 1 << 20);
        assert_eq!(b.eligible_at(t(5), 9000), t(5));
        // Leaving "unlimited" is a decrease from the line rate: 100 G → 25 G keeps a quarter of the depth.
        assert!(b.set_rate(t(10), Some(25_000_000_000), 100_000_000_000));
        assert_eq!(b.tokens_bytes(t(10)), 2_500);
        assert_eq!(b.rate_bps(), Some(25_000_000_000));
        // Need more than is there: wait (5000 − 2500) B at 25 G = 800 ns.
        assert_eq!(b.eligible_at(t(10), 5_000), t(810));
        // A need above the depth is capped at the depth: a full bucket always conforms.
        assert_eq!(b.eligible_at(t(10), 50_000), t(10 + 7_500 * 8 / 25));
        b.set_depth(t(10), 1_000);
        assert_eq!(b.tokens_bytes(t(10)), 1_000);
        assert!(b.set_rate(t(20), None, 0));
        assert_eq!(b.eligible_at(t(20), 9000), t(20));
        // Rounding is up: 1 byte at 3 bit/s needs 2.67 s → 2_666_666_667 ns.
        let mut s = TokenBucket::new(Some(3), 1, t(0));
        s.consume(t(0), 1);
        assert_eq!(s.eligible_at(t(0), 1), t(2_666_666_667));
    }

    #[test]
    fn long_idle_does_not_overflow() {
        let mut b = TokenBucket::new(Some(400_000_000_000), MAX_DEPTH_BYTES * 4, t(0));
        assert_eq!(b.depth_bytes(), MAX_DEPTH_BYTES);
        b.consume(t(0), 1 << 29);
        assert_eq!(b.tokens_bytes(Instant::MAX), MAX_DEPTH_BYTES as i64);
        assert_eq!(b.eligible_at(Instant::MAX, 100), Instant::MAX);
    }
}
