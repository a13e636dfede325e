//! The send scheduler: which QP transmits next and how fast (`docs/spec/DCQCN.md §7, §9, §10`).
//!
//! # Tiers (strict priority between them)
//!
//! 1. **Control**: ACK, NAK, RNR NAK, ATOMIC ACKNOWLEDGE and CNP — FIFO over the QPs that owe one, never shaped per
//!    QP or per class (`DCQCN.md §9 S1`: CNP, ACK and NAK go to a strict-priority class; `§2.2 N4`; HPCC ns-3 queue 0).
//! 2. **READ responses** — FIFO over the QPs with a response stream at the front of their response queue; each
//!    still passes its QP's shaper (`§2.2 N5`: for a READ the responder is the sender DCQCN slows down). Served before
//!    new requests so the remote requester's outstanding READs complete (issue #12).
//! 3. **Requests** (new packets and go-back-N retransmissions) — deficit-weighted round robin by bytes across eight
//!    traffic classes (ETS, IEEE 802.1Qaz transmission selection, `§9 S2/S3`), round robin over the QPs of a class,
//!    one packet per turn (`§9 S4`, what HPCC ns-3 does), each QP first passing its shaper.
//!
//! # Shapers
//!
//! Token buckets ([`shaper`]) per QP (rate = the QP's [`RateController`](crate::RateController) output, capped by
//! the QP's own limit), per traffic class (optional `TcConfig::rate_bps`) and per port (optional
//! `SchedConfig::port_rate_bps`, the NIC's own serialiser: it keeps the link's queue at about one frame so a control
//! frame never waits behind a burst of data there, `§9 S5`). A QP whose bucket does not conform is *parked*: the
//! scheduler returns [`Pick::Park`] with the instant it conforms, the engine arms the QP's one `Shaper` timer, and
//! the QP re-enters its queue when it fires. A class or the port that does not conform is skipped; its instant is in
//! [`Scheduler::poll_timeout`]. Nothing spins.
//!
//! The rate seam: a rate controller (DCQCN's reaction point, or [`FixedRate`](crate::FixedRate)) only *computes* the
//! QP's rate; the engine re-reads `rate_bps()` after every call into the controller (`on_tx`, `on_cnp`, `on_timer`,
//! installation) and hands it to the QP's bucket ([`Scheduler::set_qp_rate`]), which enforces it: refill at that
//! rate, tokens clamped when the rate drops (no burst right after a CNP, `§7 TB5`), and a pending departure re-timed
//! on every change (`§2.3 R7`, `§2.4 M7`).
//!
//! # Credit lost while backlogged
//!
//! A bucket caps its tokens at its depth (`§7 TB1`); tokens that accrue while its QP (or the port) has frames
//! waiting and the bucket is already full are lost for good, and the flow's rate falls short of its limit by them
//! (the [`shaper`] module docs). That happens when the engine is not driven for longer than `depth / rate` — its
//! thread descheduled on a loaded host — and also while a class bucket, the port bucket or the other QPs' DWRR turns
//! hold a QP back. The scheduler marks a bucket backlogged only at instants it is given (`next(now)`, timers), never
//! at a `push_*` (which has no `now`: a driver posts before it reads the clock), so the count is a lower bound: a QP
//! is backlogged from the [`next`](Scheduler::next) that pops or parks it until it is left with nothing to send
//! ([`settle`](Scheduler::settle), [`unpark`](Scheduler::unpark)) — packets held by the PSN window or a fence count
//! as waiting; the port from a `next` that finds work until `settle` finds none. The `TB5` clamp on a rate cut is
//! never counted, nor are WQEs still in a driver's ring (the engine does not see them). Exported per QP and per port as `shaper_credit_lost_bytes` and `port_shaper_credit_lost_bytes`
//! (`crate::Counters`).
//!
//! # Batching window
//!
//! [`batch`]: the engine measures the RTT from RC ACKs and tells a driver how many WQEs to take from a QP's ring per
//! round ([`Scheduler::drain_quota`]) and how many frames to produce per I/O call ([`Scheduler::tx_burst`]) — the
//! seed's "dynamic batching window" (`DCQCN.md §10`).
//!
//! # Cost
//!
//! Every queue is an intrusive FIFO threaded through one per-QP entry (three `u32` links), sized when the QP is
//! created ([`Scheduler::add_qp`]); a QP is on each tier at most once. Choosing the next frame pops one entry; the
//! DWRR visits at most the eight classes (bit masks). No allocation, no scan over QPs — the cost per decision does not
//! depend on how many QPs exist or are active (`benches/sched.rs`).
//!
//! # Using it
//!
//! The engine calls, per frame: [`next`](Scheduler::next) → build the frame for the picked QP →
//! [`sent`](Scheduler::sent) with its length (or [`unpop`](Scheduler::unpop) if the caller's buffer was too small)
//! → `push_*` again if the QP has more work. Whenever a QP gains work: [`push_ctrl`](Scheduler::push_ctrl),
//! [`push_read`](Scheduler::push_read), [`push_data`](Scheduler::push_data) (no-ops if already queued or parked).

pub mod batch;
pub mod shaper;

use core::time::Duration;

use crate::Psn;
use crate::time::Instant;
use batch::PendingSample;
pub use batch::{BatchConfig, RttEstimator};
pub use shaper::TokenBucket;

/// Upper bound of the bytes a RoCE v2 frame carries besides its payload: Ethernet 14 + 802.1Q 4 + IPv6 40 + UDP 8 +
/// BTH 12 + the largest extension-header set (AtomicETH 28; RETH 16 + ImmDt 4 = 20; DETH 8 + ImmDt 4 = 12;
/// AETH 4 + AtomicAckETH 8 = 12) + pad 3 + ICRC 4 = 113, rounded up (`ROCEV2.md §1`). Used for the largest frame a
/// QP can send next (shaper conformance, `DCQCN.md §7 TB2`).
pub const MAX_FRAME_OVERHEAD: u32 = 128;

/// Number of traffic classes (IEEE 802.1Qaz: eight TCs, `DCQCN.md §9`).
pub const TRAFFIC_CLASSES: usize = 8;

/// One traffic class: its ETS weight and optional shaper.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TcConfig {
    /// ETS weight (bandwidth share relative to the other backlogged classes, `DCQCN.md §9 S2/S3`). 0 counts as 1.
    /// Weights need not sum to 100: only ratios matter.
    pub weight: u32,
    /// Rate limit of the class in bit/s (`None` = none): a per-class token bucket charged with the class's
    /// requests and READ responses.
    pub rate_bps: Option<u64>,
    /// Depth of the class bucket in bytes (`None` = the per-QP default depth rule, `SchedConfig::bdp_depth_bytes`).
    pub burst_bytes: Option<u64>,
}

impl Default for TcConfig {
    /// Weight 1, no rate limit.
    fn default() -> Self {
        TcConfig {
            weight: 1,
            rate_bps: None,
            burst_bytes: None,
        }
    }
}

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
    /// Traffic class of every new QP (0..=7; larger values count as 7); [`Engine::set_qp_tc`] changes one QP's.
    ///
    /// [`Engine::set_qp_tc`]: crate::Engine::set_qp_tc
    pub qp_tc: u8,
    /// The eight traffic classes (ETS weights, optional shapers). Default: equal weights, no limits.
    pub tcs: [TcConfig; TRAFFIC_CLASSES],
    /// Pace everything the port sends (control frames included) to this rate in bit/s, counting
    /// `frame_overhead` extra bytes per frame — the port's own serialiser. `None` (default): the link is the only
    /// limit (the runtime's transmit budget and the link's back-pressure). Set it to the link's rate when the link
    /// queues without back-pressure (the simulated link), so frames wait here, where priorities apply.
    pub port_rate_bps: Option<u64>,
    /// Depth of the port bucket in bytes (`None` = two largest frames).
    pub port_burst_bytes: Option<u64>,
    /// Bytes a frame occupies on the wire beyond the frame itself, for the port bucket: preamble + SFD 8, FCS 4,
    /// inter-frame gap 12 = 24 (IEEE 802.3).
    pub frame_overhead: u32,
    /// Limits of the adaptive batching window ([`batch`]).
    pub batch: BatchConfig,
}

impl Default for SchedConfig {
    fn default() -> Self {
        SchedConfig {
            line_rate_bps: 100_000_000_000,
            base_rtt: Duration::from_micros(10),
            qp_burst_bytes: None,
            qp_rate_limit_bps: None,
            qp_tc: 0,
            tcs: [TcConfig::default(); TRAFFIC_CLASSES],
            port_rate_bps: None,
            port_burst_bytes: None,
            frame_overhead: 24,
            batch: BatchConfig::default(),
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
pub struct QpShape {
    /// The QP's bucket (rate = min(controller rate, `limit`)).
    pub(crate) bucket: TokenBucket,
    /// The QP's own rate limit (`ibv_modify_qp_rate_limit`'s `rate_limit`, `DCQCN.md §8`).
    pub(crate) limit: Option<u64>,
    /// Depth set for this QP (`max_burst_sz`), else the configured default.
    pub(crate) burst: Option<u64>,
    /// Largest frame this QP can send next (path MTU + [`MAX_FRAME_OVERHEAD`]): the shaper's conformance need.
    pub(crate) max_frame: u32,
    /// Waiting for its `Shaper` timer (off the READ and request queues).
    pub(crate) parked: bool,
}

impl QpShape {
    fn new(cfg: &SchedConfig, pmtu: u32, now: Instant) -> QpShape {
        let max_frame = pmtu + MAX_FRAME_OVERHEAD;
        QpShape {
            bucket: TokenBucket::new(cfg.qp_rate_limit_bps, cfg.qp_depth(max_frame), now),
            limit: cfg.qp_rate_limit_bps,
            burst: None,
            max_frame,
            parked: false,
        }
    }

    /// The QP's bucket.
    pub fn bucket(&self) -> &TokenBucket {
        &self.bucket
    }

    /// Whether the QP waits for its `Shaper` timer.
    pub fn is_parked(&self) -> bool {
        self.parked
    }

    /// The bucket depth this QP should have.
    fn depth(&self, cfg: &SchedConfig) -> u64 {
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

    /// (Re)configuration — a controller installed, a limit or depth set: a fresh, full bucket at
    /// `min(controller, limit)`, like a new rate-limit entry (`ibv_modify_qp_rate_limit`, `DCQCN.md §8`).
    fn reset(&mut self, now: Instant, controller: Option<u64>, cfg: &SchedConfig) {
        let eff = self.effective(controller);
        let depth = self.depth(cfg);
        self.bucket.restart(now, eff, depth);
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

/// What the scheduler chose ([`Scheduler::next`]). The `usize` is the QP's slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pick {
    /// Send the QP's next control frame (ACK/NAK/ATOMIC ACK/CNP).
    Ctrl(usize),
    /// Send the QP's next READ response packet.
    Read(usize),
    /// Send the QP's next request packet.
    Data(usize),
    /// The QP's shaper does not conform before this instant: arm its `Shaper` timer and call
    /// [`Scheduler::unpark`] then; the QP has left the READ/request queues. Call `next` again.
    Park(usize, Instant),
}

/// What a rate change means for a parked QP ([`Scheduler::set_qp_rate`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Retime {
    /// Nothing to do (rate unchanged, or the QP is not parked).
    None,
    /// The parked QP now conforms later or earlier: re-arm its `Shaper` timer for this instant.
    At(Instant),
    /// The parked QP conforms now: it has been unparked; put it back on its queues.
    Now,
}

const NIL: u32 = u32::MAX;
/// Tiers (index of the link in `Entry::next`).
const T_CTRL: usize = 0;
const T_READ: usize = 1;
const T_DATA: usize = 2;

/// One QP slot: shaping state, traffic class, queue membership and the intrusive links.
#[derive(Clone, Copy, Debug)]
struct Entry {
    shape: QpShape,
    tc: u8,
    /// On tier `t`'s queue: bit `1 << t`.
    queued: u8,
    /// Class whose list holds the entry (when queued on the request tier).
    in_class: u8,
    next: [u32; 3],
}

impl Entry {
    /// Not backlogged any more if nothing is queued for the QP's bucket (READ or request tier) and it is not parked.
    fn settle(&mut self, now: Instant) {
        if self.queued & (1 << T_READ | 1 << T_DATA) == 0 && !self.shape.parked {
            self.shape.bucket.set_backlogged(now, false);
        }
    }
}

/// Per-QP state off the per-decision path: the RTT sample in flight and the average WQE size.
#[derive(Clone, Copy, Debug)]
struct Cold {
    sample: Option<PendingSample>,
    /// Average bytes per posted WQE (EWMA, 1/8 per WQE).
    avg_wqe: u64,
}

/// An intrusive FIFO of slots, linked through `Entry::next[tier]`.
#[derive(Clone, Copy, Debug)]
struct Fifo {
    head: u32,
    tail: u32,
}

impl Fifo {
    const EMPTY: Fifo = Fifo {
        head: NIL,
        tail: NIL,
    };

    fn is_empty(&self) -> bool {
        self.head == NIL
    }

    fn push_back(&mut self, e: &mut [Entry], t: usize, i: u32) {
        e[i as usize].next[t] = NIL;
        if self.tail == NIL {
            self.head = i;
        } else {
            e[self.tail as usize].next[t] = i;
        }
        self.tail = i;
    }

    fn push_front(&mut self, e: &mut [Entry], t: usize, i: u32) {
        e[i as usize].next[t] = self.head;
        if self.head == NIL {
            self.tail = i;
        }
        self.head = i;
    }

    fn pop_front(&mut self, e: &[Entry], t: usize) -> Option<u32> {
        if self.head == NIL {
            return None;
        }
        let i = self.head;
        self.head = e[i as usize].next[t];
        if self.head == NIL {
            self.tail = NIL;
        }
        Some(i)
    }
}

/// One traffic class: its QP list, DWRR deficit and quantum, bucket.
#[derive(Clone, Copy, Debug)]
struct Class {
    list: Fifo,
    /// Bytes the class may still send in its current DWRR turn (may go below zero by less than one frame).
    deficit: i64,
    /// `weight / min(weight) · L_max` bytes (`DCQCN.md §9 S2`).
    quantum: i64,
    bucket: TokenBucket,
}

/// Scheduling decisions by outcome (for tests and the QP-independent cost benchmark).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SchedStats {
    /// Control frames picked.
    pub ctrl: u64,
    /// READ response packets picked.
    pub read: u64,
    /// Request packets picked.
    pub data: u64,
    /// QPs parked on their shaper.
    pub parks: u64,
    /// Times `next` found work but the port bucket did not conform.
    pub port_waits: u64,
    /// Request bytes sent per traffic class.
    pub class_bytes: [u64; TRAFFIC_CLASSES],
}

/// The send scheduler of one port (see the [module docs](self)).
#[derive(Debug)]
pub struct Scheduler {
    cfg: SchedConfig,
    /// Largest frame of the port (`L_max`): DWRR quantum unit, class and port conformance need.
    max_frame: u32,
    qps: Vec<Entry>,
    ctrl: Fifo,
    read: Fifo,
    classes: [Class; TRAFFIC_CLASSES],
    /// Classes with a non-empty list.
    active: u8,
    /// Classes whose list went empty since the last class choice (their deficit is forfeited, `§9 S2`).
    emptied: u8,
    /// Classes with a rate limit.
    limited: u8,
    /// Class whose DWRR turn it is.
    cur: u8,
    /// Class of the last `Pick::Data` (charged by `sent`).
    last_class: u8,
    port: TokenBucket,
    now: Instant,
    stats: SchedStats,
    cold: Vec<Cold>,
    rtt: RttEstimator,
    /// Average bytes per data frame sent (EWMA, 1/8 per frame).
    avg_frame: u64,
}

impl Scheduler {
    /// A scheduler for a port whose largest frame is `max_frame` bytes (Ethernet header to ICRC).
    pub fn new(cfg: SchedConfig, max_frame: u32) -> Scheduler {
        let max_frame = max_frame.max(64);
        let min_w = cfg.tcs.iter().map(|t| t.weight.max(1)).min().unwrap_or(1);
        let depth = cfg.bdp_depth_bytes();
        let mut limited = 0u8;
        let classes = core::array::from_fn(|c| {
            let t = cfg.tcs[c];
            if t.rate_bps.is_some_and(|r| r > 0) {
                limited |= 1 << c;
            }
            Class {
                list: Fifo::EMPTY,
                deficit: 0,
                quantum: i64::from(t.weight.max(1)) * i64::from(max_frame) / i64::from(min_w),
                bucket: TokenBucket::new(
                    t.rate_bps,
                    t.burst_bytes.unwrap_or(depth).max(u64::from(max_frame)),
                    Instant::ZERO,
                ),
            }
        });
        let port_frame = max_frame + cfg.frame_overhead;
        let port = TokenBucket::new(
            cfg.port_rate_bps,
            cfg.port_burst_bytes
                .unwrap_or(2 * u64::from(port_frame))
                .max(u64::from(port_frame)),
            Instant::ZERO,
        );
        Scheduler {
            cfg,
            max_frame,
            qps: Vec::new(),
            ctrl: Fifo::EMPTY,
            read: Fifo::EMPTY,
            classes,
            active: 0,
            emptied: 0,
            limited,
            cur: 0,
            last_class: 0,
            port,
            now: Instant::ZERO,
            stats: SchedStats::default(),
            cold: Vec::new(),
            rtt: RttEstimator::default(),
            avg_frame: u64::from(max_frame),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &SchedConfig {
        &self.cfg
    }

    /// Decision counters.
    pub fn stats(&self) -> &SchedStats {
        &self.stats
    }

    /// The latest instant seen by [`observe`](Self::observe) (or [`next`](Self::next)).
    pub fn now(&self) -> Instant {
        self.now
    }

    /// Records the current instant (the engine calls it from its inputs and outputs; commands without a `now`
    /// use the latest).
    pub fn observe(&mut self, now: Instant) {
        if now > self.now {
            self.now = now;
        }
    }

    /// Makes room for the entries of slots `0..slots` without reallocating later (control path: `Engine::create_qp`
    /// sizes its per-QP tables together, growth capped at the device's `max_qp`, issue #21).
    pub(crate) fn reserve_slots(&mut self, slots: usize) {
        self.qps.reserve_exact(slots.saturating_sub(self.qps.len()));
        self.cold
            .reserve_exact(slots.saturating_sub(self.cold.len()));
    }

    /// A QP was created in `slot` with path MTU `pmtu` (control path: grows the table; queue membership of an
    /// earlier QP in the same slot is kept, its stale entries are popped and find no work).
    pub fn add_qp(&mut self, slot: usize, pmtu: u32) {
        let shape = QpShape::new(&self.cfg, pmtu, self.now);
        let tc = self.cfg.qp_tc.min(TRAFFIC_CLASSES as u8 - 1);
        if slot >= self.qps.len() {
            self.qps.resize(
                slot + 1,
                Entry {
                    shape,
                    tc,
                    queued: 0,
                    in_class: tc,
                    next: [NIL; 3],
                },
            );
        }
        let e = &mut self.qps[slot];
        e.shape = shape;
        e.tc = tc;
        let cold = Cold {
            sample: None,
            avg_wqe: u64::from(pmtu),
        };
        if slot >= self.cold.len() {
            self.cold.resize(slot + 1, cold);
        }
        self.cold[slot] = cold;
    }

    /// The QP's path MTU is now `pmtu` (its largest frame, hence its bucket's floor).
    pub fn set_pmtu(&mut self, slot: usize, pmtu: u32) {
        let (cfg, now) = (&self.cfg, self.now);
        if let Some(e) = self.qps.get_mut(slot) {
            e.shape.max_frame = pmtu + MAX_FRAME_OVERHEAD;
            let d = e.shape.depth(cfg);
            e.shape.bucket.set_depth(now, d);
        }
    }

    /// Sets the QP's traffic class (0..=7, larger values count as 7). A QP already queued moves when it is next
    /// reached (O(1)).
    pub fn set_tc(&mut self, slot: usize, tc: u8) {
        if let Some(e) = self.qps.get_mut(slot) {
            e.tc = tc.min(TRAFFIC_CLASSES as u8 - 1);
        }
    }

    /// The QP's traffic class.
    pub fn tc(&self, slot: usize) -> Option<u8> {
        self.qps.get(slot).map(|e| e.tc)
    }

    /// Sets the QP's own limit (`None` = none) and depth (`None` = default); the bucket starts full at
    /// `min(controller, limit)` (`controller` = the QP's controller rate now).
    pub fn set_limit(
        &mut self,
        slot: usize,
        rate: Option<u64>,
        burst: Option<u64>,
        controller: Option<u64>,
    ) {
        let (cfg, now) = (&self.cfg, self.now);
        if let Some(e) = self.qps.get_mut(slot) {
            e.shape.limit = rate;
            e.shape.burst = burst;
            e.shape.reset(now, controller, cfg);
        }
    }

    /// A new rate controller was installed on the QP: a fresh, full bucket at its rate (capped by the limit).
    pub fn reset_qp(&mut self, slot: usize, controller: Option<u64>) {
        let (cfg, now) = (&self.cfg, self.now);
        if let Some(e) = self.qps.get_mut(slot) {
            e.shape.reset(now, controller, cfg);
        }
    }

    /// The QP's controller now reports `controller` bit/s (re-read after every controller call): the bucket takes
    /// `min(controller, limit)` with the `TB5` clamp on a decrease, and a parked QP is re-timed (`§2.3 R7`).
    pub fn set_qp_rate(&mut self, slot: usize, now: Instant, controller: Option<u64>) -> Retime {
        self.observe(now);
        let line = self.cfg.line_rate_bps;
        let Some(e) = self.qps.get_mut(slot) else {
            return Retime::None;
        };
        let eff = e.shape.effective(controller);
        if !e.shape.bucket.set_rate(now, eff, line) || !e.shape.parked {
            return Retime::None;
        }
        let at = e.shape.eligible_at(now);
        if at <= now {
            e.shape.parked = false;
            e.settle(now);
            Retime::Now
        } else {
            Retime::At(at)
        }
    }

    /// Shaping state of the QP in `slot`.
    pub fn qp(&self, slot: usize) -> Option<&QpShape> {
        self.qps.get(slot).map(|e| &e.shape)
    }

    /// The QP's `Shaper` timer fired (or its wait was cancelled): it may be queued again. Until it is, it counts as
    /// not backlogged (credit lost while it was parked is counted up to the latest observed instant).
    pub fn unpark(&mut self, slot: usize) {
        let now = self.now;
        if let Some(e) = self.qps.get_mut(slot) {
            e.shape.parked = false;
            e.settle(now);
        }
    }

    /// After the engine has dealt with a pick of the QP in `slot` (sent and re-queued it, or found nothing to send):
    /// a QP left with nothing queued is no longer backlogged unless `waiting` (it has packets held by something
    /// other than its bucket — the PSN window, a fence — and is queued again when that clears), nor is the port if
    /// nothing at all is queued (credit lost is counted up to the latest observed instant). O(1).
    pub fn settle(&mut self, slot: usize, waiting: bool) {
        let now = self.now;
        if let Some(e) = self.qps.get_mut(slot)
            && !waiting
        {
            e.settle(now);
        }
        if self.ctrl.is_empty() && self.read.is_empty() && self.active == 0 {
            self.port.set_backlogged(now, false);
        }
    }

    /// The port bucket (rate `SchedConfig::port_rate_bps`; unlimited when none).
    pub fn port_bucket(&self) -> &TokenBucket {
        &self.port
    }

    /// If the QP is parked, the instant it conforms now (after a bucket reset).
    pub fn parked_until(&self, slot: usize) -> Option<Instant> {
        let e = self.qps.get(slot)?;
        e.shape.parked.then(|| e.shape.eligible_at(self.now))
    }

    /// The QP owes a control frame: queue it on the control tier (no-op if queued).
    pub fn push_ctrl(&mut self, slot: usize) {
        let Some(e) = self.qps.get_mut(slot) else {
            return;
        };
        if e.queued & (1 << T_CTRL) == 0 {
            e.queued |= 1 << T_CTRL;
            self.ctrl.push_back(&mut self.qps, T_CTRL, slot as u32);
        }
    }

    /// The QP has a READ response to send: queue it on the READ tier (no-op if queued or parked).
    pub fn push_read(&mut self, slot: usize) {
        let Some(e) = self.qps.get_mut(slot) else {
            return;
        };
        if e.queued & (1 << T_READ) == 0 && !e.shape.parked {
            e.queued |= 1 << T_READ;
            self.read.push_back(&mut self.qps, T_READ, slot as u32);
        }
    }

    /// The QP has a request packet to send: queue it at the tail of its class (no-op if queued or parked).
    pub fn push_data(&mut self, slot: usize) {
        let Some(e) = self.qps.get_mut(slot) else {
            return;
        };
        if e.queued & (1 << T_DATA) == 0 && !e.shape.parked {
            e.queued |= 1 << T_DATA;
            let c = e.tc;
            e.in_class = c;
            self.classes[c as usize]
                .list
                .push_back(&mut self.qps, T_DATA, slot as u32);
            self.active |= 1 << c;
        }
    }

    /// Undoes the last [`next`](Self::next) (the caller's buffer was too small): the QP goes back to the front of
    /// its queue, nothing is charged.
    pub fn unpop(&mut self, pick: Pick) {
        let (t, slot) = match pick {
            Pick::Ctrl(s) => (T_CTRL, s),
            Pick::Read(s) => (T_READ, s),
            Pick::Data(s) => (T_DATA, s),
            Pick::Park(..) => return,
        };
        let Some(e) = self.qps.get_mut(slot) else {
            return;
        };
        if e.queued & (1 << t) != 0 {
            return;
        }
        e.queued |= 1 << t;
        match t {
            T_CTRL => self.ctrl.push_front(&mut self.qps, t, slot as u32),
            T_READ => self.read.push_front(&mut self.qps, t, slot as u32),
            _ => {
                let c = self.last_class;
                e.in_class = c;
                self.classes[c as usize]
                    .list
                    .push_front(&mut self.qps, t, slot as u32);
                self.active |= 1 << c;
            }
        }
    }

    /// Chooses what to send at `now`, or `None` when nothing may be sent now (nothing queued, or the port, every
    /// backlogged class and every queued QP wait for their buckets: see [`poll_timeout`](Self::poll_timeout) and
    /// the `Park` picks). Bounded work: each call pops at most one entry per queued QP and visits each class at
    /// most twice.
    pub fn next(&mut self, now: Instant) -> Option<Pick> {
        self.observe(now);
        if self.ctrl.is_empty() && self.read.is_empty() && self.active == 0 {
            self.port.set_backlogged(now, false);
            return None;
        }
        self.port.set_backlogged(now, true);
        if self
            .port
            .eligible_at(now, self.max_frame + self.cfg.frame_overhead)
            > now
        {
            self.stats.port_waits += 1;
            return None;
        }
        if let Some(i) = self.ctrl.pop_front(&self.qps, T_CTRL) {
            self.qps[i as usize].queued &= !(1 << T_CTRL);
            self.stats.ctrl += 1;
            return Some(Pick::Ctrl(i as usize));
        }
        if let Some(i) = self.read.pop_front(&self.qps, T_READ) {
            let e = &mut self.qps[i as usize];
            e.queued &= !(1 << T_READ);
            e.shape.bucket.set_backlogged(now, true);
            let at = e.shape.eligible_at(now);
            if at > now {
                e.shape.parked = true;
                self.stats.parks += 1;
                return Some(Pick::Park(i as usize, at));
            }
            self.stats.read += 1;
            return Some(Pick::Read(i as usize));
        }
        loop {
            let c = self.pick_class(now)?;
            let class = &mut self.classes[c];
            let Some(i) = class.list.pop_front(&self.qps, T_DATA) else {
                self.active &= !(1 << c);
                continue;
            };
            if class.list.is_empty() {
                self.active &= !(1 << c);
                self.emptied |= 1 << c;
            }
            let e = &mut self.qps[i as usize];
            e.queued &= !(1 << T_DATA);
            if e.tc as usize != c {
                // The QP changed class while queued: it joins its new class.
                self.push_data(i as usize);
                continue;
            }
            e.shape.bucket.set_backlogged(now, true);
            let at = e.shape.eligible_at(now);
            if at > now {
                e.shape.parked = true;
                self.stats.parks += 1;
                return Some(Pick::Park(i as usize, at));
            }
            self.last_class = c as u8;
            self.stats.data += 1;
            return Some(Pick::Data(i as usize));
        }
    }

    /// The class whose turn it is (DWRR, `DCQCN.md §9 S2`): the current class while it has deficit left, else the
    /// next backlogged class whose bucket conforms, which receives its quantum. `None` if no class may send.
    fn pick_class(&mut self, now: Instant) -> Option<usize> {
        let idle = self.emptied & !self.active;
        self.emptied = 0;
        for c in Bits(idle) {
            self.classes[c].deficit = 0;
        }
        let mut eligible = self.active;
        for c in Bits(self.active & self.limited) {
            if self.classes[c].bucket.eligible_at(now, self.max_frame) > now {
                eligible &= !(1 << c);
            }
        }
        if eligible == 0 {
            return None;
        }
        let mut c = self.cur as usize;
        if eligible & (1 << c) != 0 && self.classes[c].deficit > 0 {
            return Some(c);
        }
        let twice = u16::from(eligible) | (u16::from(eligible) << 8);
        for _ in 0..2 * TRAFFIC_CLASSES {
            c = (c + 1 + (twice >> (c + 1)).trailing_zeros() as usize) % TRAFFIC_CLASSES;
            let k = &mut self.classes[c];
            k.deficit += k.quantum;
            if k.deficit > 0 {
                self.cur = c as u8;
                return Some(c);
            }
        }
        self.cur = c as u8;
        Some(c)
    }

    /// Charges a frame of `bytes` sent for `pick` at `now`: the port bucket (plus the per-frame overhead); for a
    /// READ response or a request, the QP's and its class's buckets; for a request, the class's DWRR deficit.
    pub fn sent(&mut self, now: Instant, pick: Pick, bytes: usize) {
        self.port
            .consume(now, bytes + self.cfg.frame_overhead as usize);
        self.avg_frame = self.avg_frame - self.avg_frame / 8 + bytes as u64 / 8;
        let (slot, class) = match pick {
            Pick::Ctrl(_) | Pick::Park(..) => return,
            Pick::Read(s) => (s, None),
            Pick::Data(s) => (s, Some(self.last_class as usize)),
        };
        let Some(e) = self.qps.get_mut(slot) else {
            return;
        };
        e.shape.bucket.consume(now, bytes);
        let c = class.unwrap_or(e.tc as usize);
        let k = &mut self.classes[c];
        k.bucket.consume(now, bytes);
        if class.is_some() {
            k.deficit -= bytes as i64;
            self.stats.class_bytes[c] += bytes as u64;
        }
    }

    // ------------------------------------------------------------------------------------------- batching window

    /// A WQE of `bytes` was posted on the QP (its average WQE size feeds [`drain_quota`](Self::drain_quota)).
    pub fn note_wqe(&mut self, slot: usize, bytes: u64) {
        if let Some(c) = self.cold.get_mut(slot) {
            c.avg_wqe = c.avg_wqe - c.avg_wqe / 8 + bytes / 8;
        }
    }

    /// The QP sent, at `now`, a first transmission that asked for an ACK; once the QP's oldest unacknowledged PSN
    /// reaches `target` the time taken is an RTT sample (one in flight per QP).
    pub fn rtt_sent(&mut self, slot: usize, target: Psn, now: Instant) {
        if let Some(c) = self.cold.get_mut(slot)
            && c.sample.is_none()
        {
            c.sample = Some(PendingSample { target, sent: now });
        }
    }

    /// The QP's oldest unacknowledged PSN is now `una`: closes its sample if it covers the target.
    pub fn rtt_acked(&mut self, slot: usize, una: Psn, now: Instant) {
        let Some(c) = self.cold.get_mut(slot) else {
            return;
        };
        if let Some(p) = c.sample
            && una.diff(p.target) >= 0
        {
            c.sample = None;
            self.rtt.sample(now - p.sent);
        }
    }

    /// The QP retransmits: its sample is dropped (Karn's rule, RFC 6298 §3).
    pub fn rtt_cancel(&mut self, slot: usize) {
        if let Some(c) = self.cold.get_mut(slot) {
            c.sample = None;
        }
    }

    /// The port's RTT estimator.
    pub fn rtt(&self) -> &RttEstimator {
        &self.rtt
    }

    /// The smoothed RTT, or `SchedConfig::base_rtt` before the first sample.
    pub fn srtt(&self) -> Duration {
        self.rtt.srtt().unwrap_or(self.cfg.base_rtt)
    }

    /// WQEs a driver should move from the QP's ring now, with `pending` WQEs in the ring, `unsent` WQEs the engine
    /// holds that are not fully sent and `free` free send-queue slots ([`batch`]: one window of the QP's rate × SRTT
    /// — at most its bucket depth when it is shaped — less what is unsent).
    pub fn drain_quota(&self, slot: usize, pending: u32, unsent: u32, free: u32) -> u32 {
        let (Some(e), Some(c)) = (self.qps.get(slot), self.cold.get(slot)) else {
            return pending.min(free);
        };
        // A shaped QP's window never exceeds its bucket (`DCQCN.md §10`); an unshaped one runs at the line rate.
        let window = match e.shape.bucket.rate_bps() {
            Some(r) => batch::window_bytes(r, self.srtt(), 1).min(e.shape.bucket.depth_bytes()),
            None => batch::window_bytes(self.cfg.line_rate_bps, self.srtt(), 1),
        }
        .max(u64::from(e.shape.max_frame));
        batch::wqe_quota(
            window,
            c.avg_wqe,
            unsent,
            pending,
            free,
            self.cfg.batch.max_wqes_per_round,
        )
    }

    /// Frames a driver should produce per I/O call now ([`batch`]: a `1/rtt_fraction` of the SRTT at the port's
    /// rate — the port limit, else the line rate — in frames of the average size sent, `1..=max_frames_per_io`).
    pub fn tx_burst(&self) -> usize {
        let rate = self.port.rate_bps().unwrap_or(self.cfg.line_rate_bps);
        let b = &self.cfg.batch;
        let window = batch::window_bytes(rate, self.srtt(), b.rtt_fraction);
        batch::frames_per_io(window, self.avg_frame, b.max_frames_per_io) as usize
    }

    /// `SRTT / rtt_fraction`: the span of one batch ([`batch`]; `Engine::batch_window`).
    pub fn batch_window(&self) -> Duration {
        self.srtt() / self.cfg.batch.rtt_fraction.max(1)
    }

    /// The earliest instant after the last observed one at which the port or a backlogged class bucket conforms
    /// again, while work waits for it (`None` if nothing waits on a bucket). QPs waiting for their own bucket have
    /// `Shaper` timers instead.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let now = self.now;
        if self.ctrl.is_empty() && self.read.is_empty() && self.active == 0 {
            return None;
        }
        let port = self
            .port
            .eligible_at(now, self.max_frame + self.cfg.frame_overhead);
        if port > now {
            return Some(port);
        }
        if !self.ctrl.is_empty() || !self.read.is_empty() {
            return None;
        }
        let mut best: Option<Instant> = None;
        for c in Bits(self.active) {
            let at = self.classes[c].bucket.eligible_at(now, self.max_frame);
            if at <= now {
                return None;
            }
            best = Some(best.map_or(at, |b| b.min(at)));
        }
        best
    }
}

/// Iterator over the set bits of a class mask.
struct Bits(u8);

impl Iterator for Bits {
    type Item = usize;
    fn next(&mut self) -> Option<usize> {
        if self.0 == 0 {
            return None;
        }
        let c = self.0.trailing_zeros() as usize;
        self.0 &= self.0 - 1;
        Some(c)
    }
}

#[cfg(test)]
mod tests;
