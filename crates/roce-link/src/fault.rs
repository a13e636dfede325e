//! `Faulty<L>`: a seeded fault-injecting decorator for any [`Link`] (smoltcp `phy::FaultInjector`, extended).
//!
//! Faults are configured per direction ([`FaultConfig`] for frames the wrapped side transmits and for frames it
//! receives) and drawn from one seeded ChaCha8 stream, so a run is reproducible from its seed. Per frame, in
//! this order:
//!
//! 1. **loss**: Gilbert–Elliott burst loss (if configured; the channel state advances once per frame), then
//!    independent random loss;
//! 2. **corruption**: one bit flipped in the ICRC-covered RoCE part (BTH .. ICRC, never BTH byte 4, which the
//!    ICRC masks — `ROCEV2.md §3`), so the receiver's ICRC check must catch it;
//! 3. **ECN CE marking**: only on ECN-capable (ECT(0)/ECT(1)) IPv4/IPv6 packets; sets CE and fixes the IPv4
//!    header checksum. The ICRC stays valid because TOS / traffic class is masked (`ROCEV2.md §3`);
//! 4. **reorder** (hold the frame back until `reorder_depth` later frames passed, or `reorder_max_hold`
//!    elapsed) or **delay** (hold for `delay_time`);
//! 5. **duplication** (the frame is delivered twice).
//!
//! On the transmit side a probability `busy` makes [`Link::tx_buf`] answer [`LinkError::Busy`] (back-pressure,
//! `SCENARIOS.md` S05). Scripted faults ([`Faulty::script_tx`], [`Faulty::script_rx`]) override the random draw
//! for the next frames. Everything it did is counted in [`FaultStats`].

use std::collections::VecDeque;
use std::time::Duration;

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::pool::FramePool;
use crate::{Instant, Link, LinkCaps, LinkError, min_instant};

/// Gilbert–Elliott two-state burst-loss channel. The state moves once per frame: Good→Bad with
/// `p_good_to_bad`, Bad→Good with `p_bad_to_good`; a frame is lost with `loss_good` / `loss_bad` in the state
/// reached. Mean burst length is `1 / p_bad_to_good` frames.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GilbertElliott {
    /// Probability of entering the Bad state from Good, per frame.
    pub p_good_to_bad: f64,
    /// Probability of returning to Good from Bad, per frame.
    pub p_bad_to_good: f64,
    /// Loss probability in the Good state.
    pub loss_good: f64,
    /// Loss probability in the Bad state.
    pub loss_bad: f64,
}

impl GilbertElliott {
    /// Long-run loss rate: `π_bad · loss_bad + π_good · loss_good` with `π_bad = p_gb / (p_gb + p_bg)`.
    pub fn mean_loss(&self) -> f64 {
        let s = self.p_good_to_bad + self.p_bad_to_good;
        if s == 0.0 {
            return self.loss_good;
        }
        let bad = self.p_good_to_bad / s;
        bad * self.loss_bad + (1.0 - bad) * self.loss_good
    }
}

/// Fault probabilities for one direction. All probabilities are in `[0, 1]`; the default injects nothing.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct FaultConfig {
    /// Independent loss probability per frame.
    pub loss: f64,
    /// Burst loss, applied before `loss`.
    pub burst_loss: Option<GilbertElliott>,
    /// Probability of flipping one ICRC-covered bit of the RoCE part.
    pub corrupt: f64,
    /// Probability of setting ECN CE on an ECN-capable packet.
    pub ce_mark: f64,
    /// Probability of holding a frame back (reordering it behind later frames).
    pub reorder: f64,
    /// A reordered frame is released after this many later frames passed (at least 1).
    pub reorder_depth: u32,
    /// ... or after this much time, whichever comes first (so a quiet link does not keep it forever).
    pub reorder_max_hold: Duration,
    /// Probability of delaying a frame by `delay_time` (later frames may overtake it).
    pub delay: f64,
    /// Delay applied by `delay`.
    pub delay_time: Duration,
    /// Probability of delivering a frame twice.
    pub duplicate: f64,
    /// Transmit side only: probability that `tx_buf` reports [`LinkError::Busy`].
    pub busy: f64,
}

/// What happened to frames, per direction.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultStats {
    /// Frames offered to the decorator.
    pub frames: u64,
    /// Frames lost by independent loss (incl. scripted drops).
    pub dropped: u64,
    /// Frames lost by the Gilbert–Elliott channel.
    pub burst_dropped: u64,
    /// Frames with a flipped bit.
    pub corrupted: u64,
    /// Frames whose ECN field was set to CE.
    pub ce_marked: u64,
    /// CE marking drawn for a frame that is not ECN-capable RoCE/IP (left unchanged).
    pub ce_not_ect: u64,
    /// Frames held back for reordering.
    pub reordered: u64,
    /// Frames delayed.
    pub delayed: u64,
    /// Extra copies delivered.
    pub duplicated: u64,
    /// Duplicates or held frames that could not be sent because the inner link was busy.
    pub busy_lost: u64,
    /// `tx_buf` calls answered with an injected `Busy`.
    pub busy_injected: u64,
}

/// A scripted fate for one frame (overrides the random draw).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Deliver unchanged.
    Pass,
    /// Lose it.
    Drop,
    /// Flip one ICRC-covered bit.
    Corrupt,
    /// Set ECN CE (if ECN-capable).
    MarkCe,
    /// Deliver it twice.
    Duplicate,
    /// Hold it until this many later frames passed.
    Reorder(u32),
    /// Hold it for this long.
    Delay(Duration),
}

struct Held {
    release_at: Instant,
    release_after: u64,
    frame: Vec<u8>,
}

#[derive(Default)]
struct Dir {
    cfg: FaultConfig,
    ge_bad: bool,
    stats: FaultStats,
    script: VecDeque<Fault>,
    held: Vec<Held>,
    /// Frames passed (delivered) in this direction; reorder release counts against it.
    passed: u64,
}

/// Fate decided for one frame.
#[derive(Default)]
struct Fate {
    drop: bool,
    corrupt: bool,
    ce: bool,
    hold: Option<(Instant, u64)>,
    duplicate: bool,
}

impl Dir {
    fn decide(&mut self, rng: &mut ChaCha8Rng, now: Instant) -> Fate {
        self.stats.frames += 1;
        let mut f = Fate::default();
        if let Some(s) = self.script.pop_front() {
            match s {
                Fault::Pass => {}
                Fault::Drop => f.drop = true,
                Fault::Corrupt => f.corrupt = true,
                Fault::MarkCe => f.ce = true,
                Fault::Duplicate => f.duplicate = true,
                Fault::Reorder(n) => {
                    f.hold = Some((Instant::MAX, self.passed + u64::from(n.max(1))))
                }
                Fault::Delay(d) => f.hold = Some((now + d, u64::MAX)),
            }
            if f.drop {
                self.stats.dropped += 1;
            }
            return f;
        }
        let c = self.cfg;
        if let Some(ge) = c.burst_loss {
            let flip = if self.ge_bad {
                ge.p_bad_to_good
            } else {
                ge.p_good_to_bad
            };
            if chance(rng, flip) {
                self.ge_bad = !self.ge_bad;
            }
            if chance(
                rng,
                if self.ge_bad {
                    ge.loss_bad
                } else {
                    ge.loss_good
                },
            ) {
                self.stats.burst_dropped += 1;
                f.drop = true;
                return f;
            }
        }
        if chance(rng, c.loss) {
            self.stats.dropped += 1;
            f.drop = true;
            return f;
        }
        f.corrupt = chance(rng, c.corrupt);
        f.ce = chance(rng, c.ce_mark);
        if chance(rng, c.reorder) {
            let hold = if c.reorder_max_hold.is_zero() {
                Instant::MAX
            } else {
                now + c.reorder_max_hold
            };
            f.hold = Some((hold, self.passed + u64::from(c.reorder_depth.max(1))));
        } else if chance(rng, c.delay) {
            f.hold = Some((now + c.delay_time, u64::MAX));
        }
        f.duplicate = chance(rng, c.duplicate);
        f
    }

    /// Applies the in-place parts of a fate; returns false if the frame was dropped.
    fn mutate(&mut self, f: &Fate, rng: &mut ChaCha8Rng, frame: &mut [u8]) -> bool {
        if f.drop {
            return false;
        }
        if f.corrupt && corrupt_roce(frame, rng) {
            self.stats.corrupted += 1;
        }
        if f.ce {
            if mark_ce(frame) {
                self.stats.ce_marked += 1;
            } else {
                self.stats.ce_not_ect += 1;
            }
        }
        true
    }

    fn hold(&mut self, pool: &mut FramePool, release: (Instant, u64), frame: &[u8]) {
        if release.1 == u64::MAX {
            self.stats.delayed += 1;
        } else {
            self.stats.reordered += 1;
        }
        self.held.push(Held {
            release_at: release.0,
            release_after: release.1,
            frame: pool.copy_of(frame),
        });
    }

    /// Index of a held frame due now, oldest first.
    fn due(&self, now: Instant) -> Option<usize> {
        self.held
            .iter()
            .position(|h| h.release_at <= now || self.passed >= h.release_after)
    }

    fn next_release(&self) -> Option<Instant> {
        self.held
            .iter()
            .map(|h| h.release_at)
            .filter(|&t| t != Instant::MAX)
            .min()
    }
}

fn chance(rng: &mut ChaCha8Rng, p: f64) -> bool {
    p > 0.0 && (p >= 1.0 || rng.random::<f64>() < p)
}

/// The fault-injecting decorator.
pub struct Faulty<L> {
    inner: L,
    rng: ChaCha8Rng,
    tx: Dir,
    rx: Dir,
    tx_pending: bool,
    pool: FramePool,
    scratch: Vec<u8>,
}

impl<L> core::fmt::Debug for Faulty<L> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Faulty")
            .field("tx", &self.tx.cfg)
            .field("rx", &self.rx.cfg)
            .field("tx_stats", &self.tx.stats)
            .field("rx_stats", &self.rx.stats)
            .finish_non_exhaustive()
    }
}

impl<L: Link> Faulty<L> {
    /// Wraps `inner`; faults in `tx` apply to transmitted frames, `rx` to received ones; all draws come from a
    /// ChaCha8 stream seeded with `seed`.
    pub fn new(inner: L, tx: FaultConfig, rx: FaultConfig, seed: u64) -> Faulty<L> {
        Faulty {
            inner,
            rng: ChaCha8Rng::seed_from_u64(seed),
            tx: Dir {
                cfg: tx,
                ..Dir::default()
            },
            rx: Dir {
                cfg: rx,
                ..Dir::default()
            },
            tx_pending: false,
            pool: FramePool::default(),
            scratch: Vec::new(),
        }
    }

    /// The wrapped link.
    pub fn inner(&self) -> &L {
        &self.inner
    }

    /// The wrapped link, mutably.
    pub fn inner_mut(&mut self) -> &mut L {
        &mut self.inner
    }

    /// Unwraps (held frames are discarded).
    pub fn into_inner(self) -> L {
        self.inner
    }

    /// Replaces the transmit-side fault configuration (takes effect for the next frame).
    pub fn set_tx_faults(&mut self, cfg: FaultConfig) {
        self.tx.cfg = cfg;
    }

    /// Replaces the receive-side fault configuration.
    pub fn set_rx_faults(&mut self, cfg: FaultConfig) {
        self.rx.cfg = cfg;
    }

    /// Queues scripted fates for the next transmitted frames (overriding the random draw).
    pub fn script_tx(&mut self, faults: impl IntoIterator<Item = Fault>) {
        self.tx.script.extend(faults);
    }

    /// Queues scripted fates for the next received frames.
    pub fn script_rx(&mut self, faults: impl IntoIterator<Item = Fault>) {
        self.rx.script.extend(faults);
    }

    /// Transmit-side counters.
    pub fn tx_stats(&self) -> FaultStats {
        self.tx.stats
    }

    /// Receive-side counters.
    pub fn rx_stats(&self) -> FaultStats {
        self.rx.stats
    }

    /// Frames currently held back (both directions).
    pub fn held(&self) -> usize {
        self.tx.held.len() + self.rx.held.len()
    }

    /// Sends `frame` through the inner link (no faults); false if the inner link was busy.
    fn push_inner(&mut self, now: Instant, which: Option<usize>) -> Result<bool, LinkError> {
        let frame: &[u8] = match which {
            Some(i) => &self.tx.held[i].frame,
            None => &self.scratch,
        };
        match self.inner.transmit(now, frame) {
            Ok(()) => {
                self.tx.passed += 1;
                Ok(true)
            }
            Err(LinkError::Busy) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Sends held transmit frames that are due.
    fn release_tx(&mut self, now: Instant) -> Result<(), LinkError> {
        if self.tx_pending {
            // The inner buffer holds an uncommitted frame; releasing now would overwrite it.
            return Ok(());
        }
        while let Some(i) = self.tx.due(now) {
            if !self.push_inner(now, Some(i))? {
                // Busy: try again at the next opportunity (the held frame keeps its place).
                break;
            }
            let h = self.tx.held.remove(i);
            self.pool.put(h.frame);
        }
        Ok(())
    }
}

impl<L: Link> Link for Faulty<L> {
    fn caps(&self) -> LinkCaps {
        self.inner.caps()
    }

    fn rx_burst(
        &mut self,
        now: Instant,
        max: usize,
        sink: &mut dyn FnMut(&mut [u8]),
    ) -> Result<usize, LinkError> {
        let Faulty {
            inner,
            rng,
            rx,
            pool,
            scratch,
            ..
        } = self;
        // Held frames that are due go first.
        while let Some(i) = rx.due(now) {
            let mut h = rx.held.remove(i);
            rx.passed += 1;
            sink(&mut h.frame);
            pool.put(h.frame);
        }
        inner.rx_burst(now, max, &mut |frame: &mut [u8]| {
            let fate = rx.decide(rng, now);
            if !rx.mutate(&fate, rng, frame) {
                return;
            }
            if let Some(release) = fate.hold {
                rx.hold(pool, release, frame);
            } else {
                if fate.duplicate {
                    scratch.clear();
                    scratch.extend_from_slice(frame);
                }
                rx.passed += 1;
                sink(frame);
                if fate.duplicate {
                    rx.stats.duplicated += 1;
                    sink(scratch);
                }
            }
            // Reordered frames whose count is reached follow immediately.
            while let Some(i) = rx.held.iter().position(|h| rx.passed >= h.release_after) {
                let mut h = rx.held.remove(i);
                rx.passed += 1;
                sink(&mut h.frame);
                pool.put(h.frame);
            }
        })
    }

    fn tx_buf(&mut self, now: Instant) -> Result<&mut [u8], LinkError> {
        if !self.tx_pending {
            self.release_tx(now)?;
            if chance(&mut self.rng, self.tx.cfg.busy) {
                self.tx.stats.busy_injected += 1;
                return Err(LinkError::Busy);
            }
        }
        let buf = self.inner.tx_buf(now)?;
        self.tx_pending = true;
        Ok(buf)
    }

    fn tx_commit(&mut self, now: Instant, len: usize) -> Result<(), LinkError> {
        if !self.tx_pending {
            return Err(LinkError::NoTxBuffer);
        }
        let mtu = self.inner.caps().mtu;
        let fate = self.tx.decide(&mut self.rng, now);
        let buf = self.inner.tx_buf(now)?;
        let Some(frame) = buf.get_mut(..len) else {
            return Err(LinkError::TooLong { len, mtu });
        };
        self.tx_pending = false;
        if !self.tx.mutate(&fate, &mut self.rng, frame) {
            // Dropped: the inner buffer is not committed and will be reused.
            return Ok(());
        }
        if let Some(release) = fate.hold {
            self.tx.hold(&mut self.pool, release, frame);
            return Ok(());
        }
        if fate.duplicate {
            self.scratch.clear();
            self.scratch.extend_from_slice(frame);
        }
        self.inner.tx_commit(now, len)?;
        self.tx.passed += 1;
        if fate.duplicate {
            if self.push_inner(now, None)? {
                self.tx.stats.duplicated += 1;
            } else {
                self.tx.stats.busy_lost += 1;
            }
        }
        self.release_tx(now)
    }

    fn flush(&mut self, now: Instant) -> Result<(), LinkError> {
        // An uncommitted `tx_buf` is abandoned at flush (trait contract), so held frames may use the buffer.
        self.tx_pending = false;
        self.release_tx(now)?;
        self.inner.flush(now)
    }

    fn poll_at(&self) -> Option<Instant> {
        let held = min_instant(self.tx.next_release(), self.rx.next_release());
        min_instant(self.inner.poll_at(), held)
    }

    /// The inner link's: frames held back here (delay, reordering) are announced by [`Link::poll_at`].
    fn wait_fd(&self) -> Option<std::os::fd::RawFd> {
        self.inner.wait_fd()
    }

    fn counters(&self, f: &mut dyn FnMut(&'static str, u64)) {
        self.inner.counters(f)
    }

    fn steer_service(&self, service_id: u64, listen: bool) -> std::io::Result<()> {
        self.inner.steer_service(service_id, listen)
    }

    fn join_multicast(&mut self, group: std::net::IpAddr, join: bool) -> std::io::Result<()> {
        self.inner.join_multicast(group, join)
    }
}

// ------------------------------------------------------------------------------------------------ frame edits

/// Flips one random ICRC-covered bit of a RoCE v2 frame (BTH through the ICRC, skipping BTH byte 4).
/// Returns false (frame unchanged) if the frame is not RoCE v2.
fn corrupt_roce(frame: &mut [u8], rng: &mut ChaCha8Rng) -> bool {
    let Some(loc) = locate::roce(frame) else {
        return false;
    };
    // Candidate bytes: [bth, end) minus bth+4.
    let n = loc.end - loc.bth - 1;
    if n == 0 {
        return false;
    }
    let mut k = loc.bth + rng.random_range(0..n);
    if k >= loc.bth + 4 {
        k += 1;
    }
    frame[k] ^= 1 << rng.random_range(0..8u32);
    true
}

/// Sets ECN = CE on an ECN-capable IPv4/IPv6 frame, fixing the IPv4 header checksum. Returns false (frame
/// unchanged) for Not-ECT or non-IP frames.
fn mark_ce(frame: &mut [u8]) -> bool {
    locate::mark_ce(frame)
}

mod locate {
    //! Where the RoCE part of a frame lies, and ECN marking — through roce-wire's header views (Ethernet with
    //! 802.1Q tags, IPv4/IPv6, UDP), never by hand.

    use roce_wire::{
        Ecn, EtherType, EthernetFrame, Ipv4Packet, Ipv6Packet, ROCE_V2_PORT, UdpPacket, bth, ipv6,
        udp,
    };

    /// Offsets of a RoCE v2 packet in a frame.
    pub(super) struct Roce {
        /// Offset of the BTH.
        pub(super) bth: usize,
        /// End of the UDP payload (exclusive; the ICRC is its last 4 bytes). Ethernet padding lies beyond.
        pub(super) end: usize,
    }

    const IP_PROTO_UDP: u8 = 17;

    pub(super) fn roce(frame: &[u8]) -> Option<Roce> {
        let eth = EthernetFrame::new_checked(frame).ok()?;
        let l3 = eth.header_len();
        let ip = frame.get(l3..)?;
        let udp_off = match eth.ethertype() {
            EtherType::IPV4 => {
                let p = Ipv4Packet::new_checked(ip).ok()?;
                (p.protocol() == IP_PROTO_UDP).then(|| l3 + p.header_len())?
            }
            EtherType::IPV6 => {
                let p = Ipv6Packet::new_checked(ip).ok()?;
                (p.next_header() == IP_PROTO_UDP).then_some(l3 + ipv6::HEADER_LEN)?
            }
            _ => return None,
        };
        let u = UdpPacket::new_checked(frame.get(udp_off..)?).ok()?;
        if u.dst_port() != ROCE_V2_PORT {
            return None;
        }
        let bth = udp_off + udp::HEADER_LEN;
        let end = udp_off + usize::from(u.len());
        if end > frame.len() || end < bth + bth::HEADER_LEN + roce_wire::ICRC_LEN {
            return None;
        }
        Some(Roce { bth, end })
    }

    fn ect(e: Ecn) -> bool {
        matches!(e, Ecn::Ect0 | Ecn::Ect1)
    }

    pub(super) fn mark_ce(frame: &mut [u8]) -> bool {
        let Ok(eth) = EthernetFrame::new_checked(&*frame) else {
            return false;
        };
        let (l3, ty) = (eth.header_len(), eth.ethertype());
        let Some(ip) = frame.get_mut(l3..) else {
            return false;
        };
        match ty {
            EtherType::IPV4 => {
                let Ok(mut p) = Ipv4Packet::new_checked(ip) else {
                    return false;
                };
                if !ect(p.ecn()) {
                    return false;
                }
                p.set_ecn(Ecn::Ce);
                p.fill_checksum();
                true
            }
            EtherType::IPV6 => {
                let Ok(mut p) = Ipv6Packet::new_checked(ip) else {
                    return false;
                };
                if !ect(p.ecn()) {
                    return false;
                }
                p.set_ecn(Ecn::Ce);
                true
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::{SimConfig, SimNet, SimPort};
    use crate::testutil::vectors;

    const A: [u8; 6] = [2, 0, 0, 0, 0, 1];
    const B: [u8; 6] = [2, 0, 0, 0, 0, 2];

    fn pair(tx: FaultConfig, seed: u64) -> (Faulty<SimPort>, SimPort) {
        let (_net, a, b) = SimNet::pair(
            SimConfig {
                bandwidth_bps: 0,
                ..SimConfig::default()
            },
            A,
            B,
        );
        (Faulty::new(a, tx, FaultConfig::default(), seed), b)
    }

    fn numbered(i: u32) -> Vec<u8> {
        let mut f = vec![0u8; 64];
        f[..6].copy_from_slice(&B);
        f[20..24].copy_from_slice(&i.to_be_bytes());
        f
    }

    fn id(f: &[u8]) -> u32 {
        u32::from_be_bytes([f[20], f[21], f[22], f[23]])
    }

    /// Sends `n` numbered frames 1 µs apart and returns the ids received, in order.
    fn run(a: &mut Faulty<SimPort>, b: &mut SimPort, n: u32) -> Vec<u32> {
        let mut got = Vec::new();
        for i in 0..n {
            let now = Instant::from_micros(u64::from(i));
            a.transmit(now, &numbered(i)).unwrap();
            a.flush(now).unwrap();
            b.rx_burst(now, usize::MAX, &mut |f| got.push(id(f)))
                .unwrap();
        }
        let end = Instant::from_secs_for_test(10);
        a.flush(end).unwrap();
        b.rx_burst(Instant::from_secs_for_test(11), usize::MAX, &mut |f| {
            got.push(id(f))
        })
        .unwrap();
        got
    }

    trait Secs {
        fn from_secs_for_test(s: u64) -> Instant;
    }
    impl Secs for Instant {
        fn from_secs_for_test(s: u64) -> Instant {
            Instant::from_millis(s * 1000)
        }
    }

    fn mixed() -> FaultConfig {
        FaultConfig {
            loss: 0.05,
            reorder: 0.05,
            reorder_depth: 3,
            reorder_max_hold: Duration::from_micros(50),
            delay: 0.02,
            delay_time: Duration::from_micros(20),
            duplicate: 0.05,
            ..FaultConfig::default()
        }
    }

    #[test]
    fn same_seed_same_run() {
        let (mut a1, mut b1) = pair(mixed(), 42);
        let (mut a2, mut b2) = pair(mixed(), 42);
        let (mut a3, mut b3) = pair(mixed(), 43);
        let r1 = run(&mut a1, &mut b1, 2000);
        assert_eq!(r1, run(&mut a2, &mut b2, 2000));
        assert_eq!(a1.tx_stats(), a2.tx_stats());
        assert_ne!(r1, run(&mut a3, &mut b3, 2000));
        let s = a1.tx_stats();
        assert!(
            s.dropped > 0 && s.reordered > 0 && s.delayed > 0 && s.duplicated > 0,
            "{s:?}"
        );
        // Conservation: every frame is delivered once, plus duplicates, minus losses.
        assert_eq!(r1.len() as u64, 2000 - s.dropped + s.duplicated);
        assert_eq!(a1.held(), 0);
    }

    #[test]
    fn random_loss_rate_within_tolerance() {
        let cfg = FaultConfig {
            loss: 0.1,
            ..FaultConfig::default()
        };
        let (mut a, mut b) = pair(cfg, 1);
        let n = 50_000;
        let got = run(&mut a, &mut b, n);
        let rate = 1.0 - got.len() as f64 / f64::from(n);
        // σ = sqrt(0.1·0.9/50000) ≈ 0.0013; allow 4σ.
        assert!((rate - 0.1).abs() < 0.0055, "loss rate {rate}");
        assert_eq!(a.tx_stats().dropped, u64::from(n) - got.len() as u64);
        // Order is preserved when only loss is injected.
        assert!(got.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn gilbert_elliott_bursts() {
        let ge = GilbertElliott {
            p_good_to_bad: 0.01,
            p_bad_to_good: 0.25,
            loss_good: 0.0,
            loss_bad: 1.0,
        };
        let cfg = FaultConfig {
            burst_loss: Some(ge),
            ..FaultConfig::default()
        };
        let (mut a, mut b) = pair(cfg, 9);
        let n = 100_000u32;
        let got = run(&mut a, &mut b, n);
        let lost = f64::from(n) - got.len() as f64;
        let rate = lost / f64::from(n);
        assert!(
            (rate - ge.mean_loss()).abs() < 0.25 * ge.mean_loss(),
            "rate {rate} vs {}",
            ge.mean_loss()
        );
        // Bursts: count gaps in the received id sequence; mean gap ≈ 1 / p_bad_to_good = 4.
        let mut bursts = 0u32;
        for w in got.windows(2) {
            if w[1] != w[0] + 1 {
                bursts += 1;
            }
        }
        let mean_burst = lost / f64::from(bursts);
        assert!((3.0..5.0).contains(&mean_burst), "mean burst {mean_burst}");
        assert_eq!(a.tx_stats().burst_dropped as f64, lost);
    }

    #[test]
    fn reorder_by_depth_and_by_time() {
        let (mut a, mut b) = pair(FaultConfig::default(), 0);
        a.script_tx([Fault::Reorder(2), Fault::Pass, Fault::Pass, Fault::Pass]);
        let got = run(&mut a, &mut b, 4);
        assert_eq!(got, vec![1, 2, 0, 3]);
        // A held frame on a quiet link comes out after its hold time, announced by poll_at.
        let cfg = FaultConfig {
            reorder: 1.0,
            reorder_depth: 5,
            reorder_max_hold: Duration::from_micros(30),
            ..FaultConfig::default()
        };
        let (mut a, mut b) = pair(cfg, 0);
        a.transmit(Instant::ZERO, &numbered(7)).unwrap();
        assert_eq!(a.poll_at(), Some(Instant::from_micros(30)));
        a.flush(Instant::from_micros(29)).unwrap();
        assert_eq!(a.held(), 1);
        a.flush(Instant::from_micros(30)).unwrap();
        assert_eq!(a.held(), 0);
        let mut got = Vec::new();
        b.rx_burst(Instant::from_millis(1), 8, &mut |f| got.push(id(f)))
            .unwrap();
        assert_eq!(got, vec![7]);
    }

    /// A driver takes a buffer, the engine has nothing to send, the driver flushes: held frames must still be
    /// released on time (the uncommitted buffer is abandoned at flush).
    #[test]
    fn flush_abandons_uncommitted_buffer_and_releases_held() {
        let (mut a, mut b) = pair(FaultConfig::default(), 0);
        a.script_tx([Fault::Delay(Duration::from_micros(10))]);
        a.transmit(Instant::ZERO, &numbered(1)).unwrap();
        assert_eq!(a.held(), 1);
        let t = Instant::from_micros(10);
        let _ = a.tx_buf(t).unwrap();
        a.flush(t).unwrap();
        assert_eq!(a.held(), 0, "released although a tx_buf was outstanding");
        assert!(matches!(a.tx_commit(t, 64), Err(LinkError::NoTxBuffer)));
        let mut got = Vec::new();
        b.rx_burst(Instant::from_millis(1), 8, &mut |f| got.push(id(f)))
            .unwrap();
        assert_eq!(got, vec![1]);
    }

    #[test]
    fn rx_side_faults_and_duplicates() {
        let (_net, mut a, b) = SimNet::pair(
            SimConfig {
                bandwidth_bps: 0,
                ..SimConfig::default()
            },
            A,
            B,
        );
        let mut b = Faulty::new(b, FaultConfig::default(), FaultConfig::default(), 3);
        b.script_rx([
            Fault::Duplicate,
            Fault::Drop,
            Fault::Reorder(1),
            Fault::Pass,
            Fault::Delay(Duration::from_micros(5)),
        ]);
        for i in 0..5 {
            a.transmit(Instant::ZERO, &numbered(i)).unwrap();
        }
        let mut got = Vec::new();
        let now = Instant::from_micros(2);
        assert_eq!(b.rx_burst(now, 16, &mut |f| got.push(id(f))).unwrap(), 5);
        assert_eq!(got, vec![0, 0, 3, 2]);
        assert_eq!(b.poll_at(), Some(Instant::from_micros(7)));
        b.rx_burst(Instant::from_micros(7), 16, &mut |f| got.push(id(f)))
            .unwrap();
        assert_eq!(got, vec![0, 0, 3, 2, 4]);
        let s = b.rx_stats();
        assert_eq!(
            (s.duplicated, s.dropped, s.reordered, s.delayed),
            (1, 1, 1, 1)
        );
    }

    #[test]
    fn busy_injection_is_back_pressure() {
        let cfg = FaultConfig {
            busy: 0.3,
            ..FaultConfig::default()
        };
        let (mut a, mut b) = pair(cfg, 5);
        let mut sent = 0u32;
        let mut busy = 0u32;
        for i in 0..1000 {
            match a.tx_buf(Instant::ZERO) {
                Ok(buf) => {
                    buf[..64].copy_from_slice(&numbered(i));
                    // Re-borrowing does not draw again.
                    assert!(a.tx_buf(Instant::ZERO).is_ok());
                    a.tx_commit(Instant::ZERO, 64).unwrap();
                    sent += 1;
                }
                Err(LinkError::Busy) => busy += 1,
                Err(e) => panic!("{e}"),
            }
        }
        assert_eq!(u64::from(busy), a.tx_stats().busy_injected);
        assert!((230..370).contains(&busy), "{busy}");
        let mut n = 0;
        b.rx_burst(Instant::from_millis(1), usize::MAX, &mut |_| n += 1)
            .unwrap();
        assert_eq!(n, sent);
    }

    #[test]
    fn ce_marking_only_on_ect_and_fixes_ipv4_checksum() {
        let mut marked = 0;
        for (name, frame) in vectors() {
            let mut f = frame.clone();
            let Some((l3, ty)) = locate_l3(&f) else {
                continue;
            };
            let ecn_before = if ty == 0x0800 {
                f[l3 + 1] & 3
            } else {
                (f[l3 + 1] >> 4) & 3
            };
            let did = mark_ce(&mut f);
            assert_eq!(did, ecn_before == 1 || ecn_before == 2, "{name}");
            if !did {
                assert_eq!(f, frame, "{name}: untouched");
                continue;
            }
            marked += 1;
            assert!(
                roce_wire::icrc::verify(&frame[l3..]).is_ok(),
                "{name}: golden ICRC valid"
            );
            assert!(
                roce_wire::icrc::verify(&f[l3..]).is_ok(),
                "{name}: ICRC still valid after CE marking (roce-wire)"
            );
            if ty == 0x0800 {
                assert!(
                    roce_wire::Ipv4Packet::new_checked(&f[l3..])
                        .unwrap()
                        .verify_checksum(),
                    "{name}"
                );
                assert_eq!(f[l3 + 1] & 3, 3);
                assert_eq!(f[l3 + 1] >> 2, frame[l3 + 1] >> 2, "DSCP kept");
                let mut sum = 0u32;
                for w in f[l3..l3 + 20].chunks_exact(2) {
                    sum += u32::from(u16::from_be_bytes([w[0], w[1]]));
                }
                while sum > 0xffff {
                    sum = (sum & 0xffff) + (sum >> 16);
                }
                assert_eq!(sum, 0xffff, "{name}: IPv4 checksum valid");
            } else {
                assert_eq!((f[l3 + 1] >> 4) & 3, 3);
            }
            // Only TOS/traffic class and the IPv4 checksum changed: the ICRC-covered bytes are identical.
            for (i, (x, y)) in f.iter().zip(&frame).enumerate() {
                if x != y {
                    assert!(
                        i == l3 + 1 || (ty == 0x0800 && (i == l3 + 10 || i == l3 + 11)),
                        "{name}: byte {i}"
                    );
                }
            }
        }
        assert!(marked > 0, "some golden vector is ECN-capable");
    }

    fn locate_l3(f: &[u8]) -> Option<(usize, u16)> {
        let ty = u16::from_be_bytes([f[12], f[13]]);
        matches!(ty, 0x0800 | 0x86dd).then_some((14, ty))
    }

    #[test]
    fn corruption_hits_the_icrc_covered_part() {
        let mut rng = ChaCha8Rng::seed_from_u64(11);
        for (name, frame) in vectors() {
            let Some(loc) = locate::roce(&frame) else {
                continue;
            };
            for _ in 0..200 {
                let mut f = frame.clone();
                assert!(corrupt_roce(&mut f, &mut rng), "{name}");
                let diff: Vec<usize> = (0..f.len()).filter(|&i| f[i] != frame[i]).collect();
                assert_eq!(diff.len(), 1, "{name}");
                let i = diff[0];
                assert!(
                    i >= loc.bth && i < loc.end && i != loc.bth + 4,
                    "{name}: byte {i}"
                );
                assert_eq!((f[i] ^ frame[i]).count_ones(), 1);
                assert_eq!(
                    roce_wire::icrc::verify(&f[14..]),
                    Err(roce_wire::Error::BadIcrc),
                    "{name}: byte {i} caught"
                );
            }
        }
        let mut short = vec![0u8; 20];
        assert!(!corrupt_roce(&mut short, &mut rng));
    }
}
