//! The per-packet path allocates nothing (`docs/ARCHITECTURE.md`, "no allocation, lock or scan over all QPs per
//! packet").
//!
//! This test binary installs a counting `#[global_allocator]`. Counting is armed per thread (a thread-local flag), so
//! the test harness and tests running in parallel on other threads do not disturb the count. Each test builds two
//! engines through the public API — an RC pair (both engines are requester and responder), a UC pair and a UD pair
//! — and shuttles frames between them with its own allocation-free wire (preallocated frame buffers, a FIFO with
//! fixed latency, optional loss and CE marking). Right after the QPs reach RTS — no warm-up: every queue the
//! per-packet path pushes to is sized at `create_qp` / `create_cq` — it arms the counter and runs a steady state of
//! `post_send` (SEND / SEND_WITH_IMM / RDMA WRITE / WRITE_WITH_IMM / READ / CMP_AND_SWP / FETCH_AND_ADD / ATOMIC WRITE;
//! inline and SGE; single- and multi-packet; FENCE and SOLICITED; a BIND_MW of a memory window and, from then on, a
//! multi-packet WRITE through the window's key), `post_recv`, `poll_transmit` → `handle_frame`, ACKs,
//! `poll_ready_cq` / `poll_cq`, `poll_timeout` / `handle_timeout`, `poll_async_event`, a paced QP (`Shaper` timer),
//! a rate controller with its own timer (`RateTimer`), DCQCN reaction points of all three profiles on the other
//! QPs (CNPs in, cuts, rate-increase timers, byte counter, the rate changes handed to the shapers; with CE marks the
//! notification point's `CnpPacing` window timer too) and the scheduler's other paths (a paced port, QPs in three
//! traffic classes with ETS weights, a class bucket, the READ-response tier), and asserts that not one allocation,
//! reallocation or deallocation happened. The lossy variant (three loss rates) drops frames, so local ACK timeouts,
//! sequence NAKs, implied NAKs, go-back-N retransmissions and duplicate requests run (it asserts each of those
//! counters moved), marks some data frames CE (CNPs) and posts some receives late (RNR NAK → RNR wait → retry).
//!
//! Engine A transmits through `poll_transmit_gather` (payloads of `GATHER_MIN` bytes or more left in its MRs as
//! pieces the test wire copies), engine B through `poll_transmit`, so both output paths are covered.
//!
//! Engine B's RC and UD QPs take their receive WQEs from shared receive queues (`post_srq_recv`, one SRQ each),
//! so the SRQ receive path runs in the measured loop too: WQEs moved from the SRQ to the QP, multi-packet SENDs and
//! WRITE_WITH_IMM on them, RNR NAKs when the SRQ is empty (the late receives), and the SRQ limit event, re-armed
//! (`modify_srq`) after each time it fires. A's RC and B's UC QPs keep their own receive queues.
//! Both engines' GSIs (QP 1) exchange one MAD each way per iteration (`send_mad` → `poll_mad`, the UD path).
//!
//! On failure the message names the counts and the engine frames of the first few allocations in the armed region.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use roce_proto::*;

// ------------------------------------------------------------------------------------------ counting allocator

struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);
static REALLOCS: AtomicU64 = AtomicU64::new(0);
static DEALLOCS: AtomicU64 = AtomicU64::new(0);
/// Where the first counted events came from (engine frames of their backtraces), at most `TRACES` of them.
static FIRST: Mutex<Vec<String>> = Mutex::new(Vec::new());
const TRACES: usize = 8;

thread_local! {
    /// Counting is on for this thread (const-initialised: reading it never allocates).
    static ARMED: Cell<bool> = const { Cell::new(false) };
}

fn note(counter: &AtomicU64) {
    if !ARMED.try_with(Cell::get).unwrap_or(false) {
        return;
    }
    counter.fetch_add(1, Ordering::Relaxed);
    // Record where the first ones came from; disarm while doing so (the backtrace allocates).
    ARMED.with(|a| a.set(false));
    if let Ok(mut first) = FIRST.lock()
        && first.len() < TRACES
    {
        let bt = std::backtrace::Backtrace::force_capture().to_string();
        // Keep the engine's frames and the collection that grew (symbol + location), then the test's caller.
        let mut short = String::new();
        let lines: Vec<&str> = bt.lines().collect();
        for (k, l) in lines.iter().enumerate() {
            let engine = l.contains("roce_proto::") || l.contains("alloc::collections");
            let caller =
                l.contains("no_alloc::") && !l.contains("note") && !l.contains("GlobalAlloc");
            if engine || caller {
                short.push_str(l.trim());
                if let Some(at) = lines
                    .get(k + 1)
                    .filter(|n| n.trim_start().starts_with("at "))
                {
                    short.push(' ');
                    short.push_str(at.trim());
                }
                short.push('\n');
            }
            if caller {
                break;
            }
        }
        first.push(short);
    }
    ARMED.with(|a| a.set(true));
}

// SAFETY: every method forwards to `System` with the caller's arguments unchanged; the bookkeeping only touches
// atomics, a const thread-local and (on the first counted event) a mutex-protected string.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(&ALLOCS);
        // SAFETY: forwarded contract.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(&ALLOCS);
        // SAFETY: forwarded contract.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(&REALLOCS);
        // SAFETY: forwarded contract.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        note(&DEALLOCS);
        // SAFETY: forwarded contract.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Counts of (allocations, reallocations, deallocations) made by this thread while `f` ran.
fn count_allocs(f: impl FnOnce()) -> (u64, u64, u64) {
    let before = (
        ALLOCS.load(Ordering::Relaxed),
        REALLOCS.load(Ordering::Relaxed),
        DEALLOCS.load(Ordering::Relaxed),
    );
    ARMED.with(|a| a.set(true));
    f();
    ARMED.with(|a| a.set(false));
    (
        ALLOCS.load(Ordering::Relaxed) - before.0,
        REALLOCS.load(Ordering::Relaxed) - before.1,
        DEALLOCS.load(Ordering::Relaxed) - before.2,
    )
}

/// Tests share the global counters: run them one at a time (other threads' allocations are not counted, but the
/// counters' deltas would mix).
static SERIAL: Mutex<()> = Mutex::new(());

// ------------------------------------------------------------------------------------------ the wire

const MAC_A: [u8; 6] = [2, 0, 0, 0, 0, 1];
const MAC_B: [u8; 6] = [2, 0, 0, 0, 0, 2];
const IP_A: [u8; 4] = [10, 0, 0, 1];
const IP_B: [u8; 4] = [10, 0, 0, 2];
const FRAME_CAP: usize = 9216;
const WIRE_SLOTS: usize = 4096;
const LATENCY: Duration = Duration::from_micros(2);

struct InFlight {
    at: Instant,
    to_b: bool,
    len: usize,
    buf: Box<[u8]>,
}

/// Two engines and an allocation-free FIFO wire between them.
struct Net {
    a: Engine,
    b: Engine,
    now: Instant,
    tx: Box<[u8]>,
    wire: VecDeque<InFlight>,
    free: Vec<Box<[u8]>>,
    /// Drop probability in 1/1000 (both directions).
    loss_permille: u32,
    /// Mark every n-th ECN-capable frame CE (0 = never).
    ce_every: u32,
    rng: u64,
    sent: u64,
    dropped: u64,
    ce_marked: u64,
    ect_seen: u32,
    /// Frames engine A handed over as gathered pieces.
    gathered: u64,
    /// QPs running a DCQCN reaction point: A's RC (paper), A's UD (ns3_mlx), B's RC (nvidia); set by `run`.
    qpns: (Qpn, Qpn, Qpn),
    /// SRQ limit events seen (and re-armed) at B.
    srq_limit_events: u64,
    /// MADs received on the GSIs (QP 1) of both engines.
    mads: u64,
}

impl Net {
    fn new(loss_permille: u32, ce_every: u32) -> Net {
        // Every QP runs a DCQCN reaction point (A: paper with a small byte counter and a fast timer, so increases
        // happen inside the measured loop; B: nvidia), unless the test installs another controller.
        let mut paper = DcqcnConfig::new(cc::Profile::Paper, 100e9);
        paper.set("B_bytes", "65536").unwrap();
        paper.set("T_us", "20").unwrap();
        let nvidia = DcqcnConfig::new(cc::Profile::Nvidia, 100e9);
        // (B's RC QP gets its own nvidia RP in `run`.)
        let cfg = |mac, ip, seed, dcqcn| EngineConfig {
            mac,
            gids: vec![Gid::from_ipv4(ip)],
            seed,
            dcqcn: Some(dcqcn),
            ..EngineConfig::default()
        };
        // A's scheduler runs every path: port pacing (100 Gb/s), ETS weights 3:1:1, a class shaper on TC 2 (its QPs
        // are put in TCs 0, 1, 2 by `run`).
        let mut sched = SchedConfig {
            port_rate_bps: Some(100_000_000_000),
            ..SchedConfig::default()
        };
        sched.tcs[0].weight = 3;
        sched.tcs[2].rate_bps = Some(20_000_000_000);
        Net {
            a: Engine::new(EngineConfig {
                sched,
                ..cfg(MAC_A, IP_A, 1, paper)
            }),
            b: Engine::new(cfg(MAC_B, IP_B, 2, nvidia)),
            now: Instant::from_micros(1),
            tx: vec![0u8; FRAME_CAP].into_boxed_slice(),
            wire: VecDeque::with_capacity(WIRE_SLOTS),
            free: (0..WIRE_SLOTS)
                .map(|_| vec![0u8; FRAME_CAP].into_boxed_slice())
                .collect(),
            loss_permille,
            ce_every,
            rng: 0x9E37_79B9_7F4A_7C15,
            sent: 0,
            dropped: 0,
            ce_marked: 0,
            ect_seen: 0,
            gathered: 0,
            qpns: (Qpn::new(0), Qpn::new(0), Qpn::new(0)),
            srq_limit_events: 0,
            mads: 0,
        }
    }

    fn rand(&mut self) -> u64 {
        // xorshift64*
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        self.rng.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Moves every frame both engines have ready onto the wire (or drops it). Returns how many were produced.
    fn transmit(&mut self) -> usize {
        let mut n = 0;
        for from_a in [true, false] {
            loop {
                // A transmits through the gathering path (payload pieces left in its MRs), B through the copying one.
                let mut segs = [TxSeg::EMPTY; 8];
                let meta = if from_a {
                    self.a
                        .poll_transmit_gather(self.now, &mut self.tx, &mut segs)
                } else {
                    self.b.poll_transmit(self.now, &mut self.tx)
                };
                let Some(meta) = meta else {
                    break;
                };
                if let Some(g) = meta.gather {
                    self.gathered += 1;
                    // The frame is head ++ pieces ++ tail; make it whole in `tx` (room for it is guaranteed).
                    self.tx
                        .copy_within(g.head..g.head + g.tail, meta.len - g.tail);
                    let mut at = g.head;
                    for p in &segs[..g.segs] {
                        // SAFETY: the pieces point into engine A's MR memory, which nothing writes or deregisters
                        // before this copy (the engines are not called in between); `tx` is disjoint from it.
                        let src = unsafe { core::slice::from_raw_parts(p.ptr, p.len) };
                        self.tx[at..at + p.len].copy_from_slice(src);
                        at += p.len;
                    }
                }
                n += 1;
                self.sent += 1;
                if self.loss_permille > 0 && (self.rand() % 1000) < u64::from(self.loss_permille) {
                    self.dropped += 1;
                    continue;
                }
                let mut buf = self
                    .free
                    .pop()
                    .expect("test wire: out of preallocated frame buffers");
                buf[..meta.len].copy_from_slice(&self.tx[..meta.len]);
                if self.ce_every > 0 && meta.ecn != 0 && buf[12..14] == [0x08, 0x00] {
                    self.ect_seen += 1;
                    if self.ect_seen.is_multiple_of(self.ce_every) {
                        mark_ce_ipv4(&mut buf[..meta.len]);
                        self.ce_marked += 1;
                    }
                }
                assert!(
                    self.wire.len() < WIRE_SLOTS,
                    "test wire: more frames in flight than reserved slots"
                );
                self.wire.push_back(InFlight {
                    at: self.now + LATENCY,
                    to_b: from_a,
                    len: meta.len,
                    buf,
                });
            }
        }
        n
    }

    /// One step: transmit, deliver what is due, fire due timers; when nothing happened, advance the clock to the
    /// next event. Returns false when there is no next event at all.
    fn step(&mut self) -> bool {
        let mut busy = self.transmit() > 0;
        while self.wire.front().is_some_and(|f| f.at <= self.now) {
            let Some(f) = self.wire.pop_front() else {
                break;
            };
            if f.to_b {
                self.b.handle_frame(self.now, &f.buf[..f.len]);
            } else {
                self.a.handle_frame(self.now, &f.buf[..f.len]);
            }
            self.free.push(f.buf);
            busy = true;
        }
        self.a.handle_timeout(self.now);
        self.b.handle_timeout(self.now);
        busy |= self.transmit() > 0;
        if busy {
            return true;
        }
        let next = [
            self.wire.front().map(|f| f.at),
            self.a.poll_timeout(),
            self.b.poll_timeout(),
        ]
        .into_iter()
        .flatten()
        .min();
        match next {
            Some(t) => {
                if t > self.now {
                    self.now = t;
                }
                true
            }
            None => false,
        }
    }

    /// Steps for `d` of virtual time (or until idle).
    fn run_for(&mut self, d: Duration) {
        let end = self.now + d;
        let mut guard = 0u32;
        while self.now < end && self.step() {
            guard += 1;
            assert!(guard < 1_000_000, "test wire: livelock");
        }
    }
}

/// Sets ECN = CE in an IPv4 frame and recomputes the header checksum (the ICRC masks the TOS byte).
fn mark_ce_ipv4(f: &mut [u8]) {
    f[15] |= 0b11;
    f[24] = 0;
    f[25] = 0;
    let mut sum = 0u32;
    for c in f[14..34].chunks(2) {
        sum += u32::from(u16::from_be_bytes([c[0], c[1]]));
    }
    while sum > 0xFFFF {
        sum = (sum & 0xFFFF) + (sum >> 16);
    }
    let ck = !(sum as u16);
    f[24..26].copy_from_slice(&ck.to_be_bytes());
}

// ------------------------------------------------------------------------------------------ setup

const CAP: QpCap = QpCap {
    max_send_wr: 64,
    max_recv_wr: 128,
    max_send_sge: 4,
    max_recv_sge: 4,
    max_inline_data: 256,
};
const ALL_ACCESS: AccessFlags = AccessFlags(
    AccessFlags::LOCAL_WRITE.0
        | AccessFlags::REMOTE_WRITE.0
        | AccessFlags::REMOTE_READ.0
        | AccessFlags::REMOTE_ATOMIC.0,
);
/// The MRs' access: everything, and windows may be bound to them.
const MR_ACCESS: AccessFlags = AccessFlags(ALL_ACCESS.0 | AccessFlags::MW_BIND.0);
const QKEY: u32 = 0x1111_1111;
const MR_LEN: usize = 64 * 1024;

/// One engine's objects.
#[derive(Clone, Copy)]
struct Side {
    pd: PdHandle,
    rc: Qpn,
    ud: Qpn,
    uc: Qpn,
    rc_cq: CqHandle,
    /// CQ of the UD and UC QPs.
    ud_cq: CqHandle,
    /// Source of gathers, target of remote WRITE/READ/atomics.
    mr: MrInfo,
    /// Receive buffers and READ/atomic result buffers.
    rx: MrInfo,
    ah_to_peer: AhHandle,
    /// A type 1 memory window in `pd` (unbound; B binds it over part of `mr` in iteration 0).
    mw: Rkey,
    /// SRQs the RC and UD QPs take their receive WQEs from (B only).
    rc_srq: Option<SrqHandle>,
    ud_srq: Option<SrqHandle>,
}

/// The SRQ limit armed at B's RC SRQ (it fires when fewer WQEs than this remain).
const RC_SRQ_LIMIT: u32 = 3;

fn make_side(e: &mut Engine, with_srqs: bool) -> Side {
    let pd = e.alloc_pd().unwrap();
    let rc_cq = e.create_cq(4096).unwrap();
    let ud_cq = e.create_cq(4096).unwrap();
    let mr = e
        .reg_mr(
            pd,
            (0..MR_LEN).map(|i| i as u8).collect::<Vec<u8>>(),
            MR_ACCESS,
        )
        .unwrap();
    let rx = e.reg_mr(pd, vec![0u8; MR_LEN], MR_ACCESS).unwrap();
    let (rc_srq, ud_srq) = if with_srqs {
        let rc_srq = e.create_srq(pd, CAP.max_recv_wr, 4).unwrap().0;
        arm_srq_limit(e, rc_srq);
        (Some(rc_srq), Some(e.create_srq(pd, UD_RECVS, 1).unwrap().0))
    } else {
        (None, None)
    };
    let qp = |e: &mut Engine, qp_type, cq, srq| {
        e.create_qp_srq(
            &QpInitAttr {
                qp_type,
                pd,
                send_cq: cq,
                recv_cq: cq,
                cap: CAP,
                sq_sig_all: true,
            },
            srq,
        )
        .unwrap()
        .0
    };
    let rc = qp(e, QpType::Rc, rc_cq, rc_srq);
    let ud = qp(e, QpType::Ud, ud_cq, ud_srq);
    let uc = qp(e, QpType::Uc, ud_cq, None);
    Side {
        rc,
        ud,
        uc,
        rc_cq,
        ud_cq,
        mr,
        rx,
        pd,
        // Set by `connect` once the peer's address is known.
        ah_to_peer: AhHandle(0),
        mw: e.alloc_mw(pd, MwType::Type1).unwrap(),
        rc_srq,
        ud_srq,
    }
}

fn arm_srq_limit(e: &mut Engine, srq: SrqHandle) {
    e.modify_srq(
        srq,
        &SrqAttr {
            srq_limit: RC_SRQ_LIMIT,
            ..SrqAttr::default()
        },
        SrqAttrMask::LIMIT,
    )
    .unwrap();
}

/// `post_recv` on the QP, or `post_srq_recv` on its SRQ.
fn post_recv_on(e: &mut Engine, qpn: Qpn, srq: Option<SrqHandle>, wr: RecvWr<'_>) {
    match srq {
        Some(srq) => e.post_srq_recv(srq, &[wr]).unwrap(),
        None => e.post_recv(qpn, &[wr]).unwrap(),
    }
}

/// RESET→INIT→RTR→RTS of the RC QP `me` towards `peer`.
fn bring_up_rc(
    e: &mut Engine,
    me: Qpn,
    peer: Qpn,
    peer_mac: [u8; 6],
    peer_ip: [u8; 4],
    timeout: u8,
) {
    let mut at = QpAttr {
        qp_state: QpState::Init,
        pkey_index: 0,
        port_num: 1,
        qp_access_flags: ALL_ACCESS,
        ..QpAttr::default()
    };
    e.modify_qp(
        me,
        &at,
        QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::ACCESS_FLAGS,
    )
    .unwrap();
    at.qp_state = QpState::Rtr;
    at.ah_attr = AhAttr {
        dgid: Gid::from_ipv4(peer_ip),
        dmac: peer_mac,
        traffic_class: 26 << 2,
        ..AhAttr::default()
    };
    at.path_mtu = Mtu::Mtu1024;
    at.dest_qp_num = peer;
    at.rq_psn = Psn::new(0xFF_FF00); // PSNs wrap during the test
    at.max_dest_rd_atomic = 16;
    at.min_rnr_timer = 1; // 0.01 ms
    e.modify_qp(
        me,
        &at,
        QpAttrMask::STATE
            | QpAttrMask::AV
            | QpAttrMask::PATH_MTU
            | QpAttrMask::DEST_QPN
            | QpAttrMask::RQ_PSN
            | QpAttrMask::MAX_DEST_RD_ATOMIC
            | QpAttrMask::MIN_RNR_TIMER,
    )
    .unwrap();
    at.qp_state = QpState::Rts;
    at.sq_psn = Psn::new(0xFF_FF00);
    at.timeout = timeout;
    at.retry_cnt = 7;
    at.rnr_retry = 7;
    at.max_rd_atomic = 4;
    e.modify_qp(
        me,
        &at,
        QpAttrMask::STATE
            | QpAttrMask::SQ_PSN
            | QpAttrMask::TIMEOUT
            | QpAttrMask::RETRY_CNT
            | QpAttrMask::RNR_RETRY
            | QpAttrMask::MAX_QP_RD_ATOMIC,
    )
    .unwrap();
}

/// RESET→INIT→RTR→RTS of the UC QP `me` towards `peer`.
fn bring_up_uc(e: &mut Engine, me: Qpn, peer: Qpn, peer_mac: [u8; 6], peer_ip: [u8; 4]) {
    let mut at = QpAttr {
        qp_state: QpState::Init,
        pkey_index: 0,
        port_num: 1,
        qp_access_flags: ALL_ACCESS,
        ..QpAttr::default()
    };
    e.modify_qp(
        me,
        &at,
        QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::ACCESS_FLAGS,
    )
    .unwrap();
    at.qp_state = QpState::Rtr;
    at.ah_attr = AhAttr {
        dgid: Gid::from_ipv4(peer_ip),
        dmac: peer_mac,
        ..AhAttr::default()
    };
    at.path_mtu = Mtu::Mtu1024;
    at.dest_qp_num = peer;
    at.rq_psn = Psn::new(0xFF_FFF0);
    e.modify_qp(
        me,
        &at,
        QpAttrMask::STATE
            | QpAttrMask::AV
            | QpAttrMask::PATH_MTU
            | QpAttrMask::DEST_QPN
            | QpAttrMask::RQ_PSN,
    )
    .unwrap();
    at.qp_state = QpState::Rts;
    at.sq_psn = Psn::new(0xFF_FFF0);
    e.modify_qp(me, &at, QpAttrMask::STATE | QpAttrMask::SQ_PSN)
        .unwrap();
}

fn bring_up_ud(e: &mut Engine, me: Qpn) {
    let mut at = QpAttr {
        qp_state: QpState::Init,
        pkey_index: 0,
        port_num: 1,
        qkey: QKEY,
        ..QpAttr::default()
    };
    e.modify_qp(
        me,
        &at,
        QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::QKEY,
    )
    .unwrap();
    at.qp_state = QpState::Rtr;
    e.modify_qp(me, &at, QpAttrMask::STATE).unwrap();
    at.qp_state = QpState::Rts;
    at.sq_psn = Psn::new(7);
    e.modify_qp(me, &at, QpAttrMask::STATE | QpAttrMask::SQ_PSN)
        .unwrap();
}

fn connect(net: &mut Net, timeout: u8) -> (Side, Side) {
    let mut a = make_side(&mut net.a, false);
    let mut b = make_side(&mut net.b, true);
    bring_up_rc(&mut net.a, a.rc, b.rc, MAC_B, IP_B, timeout);
    bring_up_rc(&mut net.b, b.rc, a.rc, MAC_A, IP_A, timeout);
    bring_up_ud(&mut net.a, a.ud);
    bring_up_ud(&mut net.b, b.ud);
    bring_up_uc(&mut net.a, a.uc, b.uc, MAC_B, IP_B);
    bring_up_uc(&mut net.b, b.uc, a.uc, MAC_A, IP_A);
    let av = |mac, ip| AhAttr {
        dgid: Gid::from_ipv4(ip),
        dmac: mac,
        ..AhAttr::default()
    };
    a.ah_to_peer = net.a.create_ah(a.pd, &av(MAC_B, IP_B)).unwrap();
    b.ah_to_peer = net.b.create_ah(b.pd, &av(MAC_A, IP_A)).unwrap();
    (a, b)
}

// ------------------------------------------------------------------------------------------ the steady state

/// What one iteration expects and what it has seen so far.
#[derive(Default)]
struct Tally {
    a_rc_expected: u32,
    b_rc_expected: u32,
    a_rc: u32,
    b_rc: u32,
    b_ud_recv: u32,
    a_ud_send: u32,
    a_ud_expected: u32,
}

fn sge(m: &MrInfo, off: u64, len: u32) -> Sge {
    Sge {
        addr: m.addr + off,
        length: len,
        lkey: m.lkey,
    }
}

/// Receive WRs B keeps posted for A's SENDs (and WRITE_WITH_IMM) per iteration.
const B_RECVS_PER_ITER: u32 = 5;
/// UD receives kept posted at B.
const UD_RECVS: u32 = 32;
/// UC receives kept posted at B.
const UC_RECVS: u32 = 16;

fn post_b_recvs(net: &mut Net, b: &Side, iter: u64) {
    for k in 0..B_RECVS_PER_ITER {
        let off = u64::from(k) * 4096;
        let sg = [sge(&b.rx, off, 2048), sge(&b.rx, off + 2048, 2048)];
        post_recv_on(
            &mut net.b,
            b.rc,
            b.rc_srq,
            RecvWr {
                wr_id: iter * 100 + u64::from(k),
                sg_list: &sg,
            },
        );
    }
}

fn post_a_recv(net: &mut Net, a: &Side, iter: u64) {
    let sg = [sge(&a.rx, 0, 4096)];
    net.a
        .post_recv(
            a.rc,
            &[RecvWr {
                wr_id: iter,
                sg_list: &sg,
            }],
        )
        .unwrap();
}

/// Posts `n` receives on B's UD or UC QP `qpn` (UD: 40-byte GRH area + 1 KiB; UC: 4 KiB).
fn post_unrel_recvs(net: &mut Net, b: &Side, qpn: Qpn, n: u32) {
    for k in 0..n {
        let (sg, srq) = if qpn == b.ud {
            (
                [sge(&b.rx, 40_000 + u64::from(k % 8) * 1100, 1100)],
                b.ud_srq,
            )
        } else {
            ([sge(&b.rx, 50_000, 4096)], None)
        };
        post_recv_on(
            &mut net.b,
            qpn,
            srq,
            RecvWr {
                wr_id: u64::from(k),
                sg_list: &sg,
            },
        );
    }
}

/// A's RC work of one iteration: 10 WRs, every opcode (RDMA ATOMIC WRITE too; the 5-packet WRITE through B's memory
/// window from iteration 1), inline and SGE, 0..5 packets each. B's: 3 WRs (and the window's bind in iteration 0).
fn post_sends(net: &mut Net, a: &Side, b: &Side, iter: u64, t: &mut Tally) {
    let inline_payload: [u8; 100] = [0x5A; 100];
    let inline_parts: [&[u8]; 2] = [&inline_payload[..60], &inline_payload[60..]];
    let two_sges = [sge(&a.mr, 0, 1500), sge(&a.mr, 8192, 1000)];
    let write_src = [sge(&a.mr, 16384, 5000)];
    let wimm_src = [sge(&a.mr, 100, 1500)];
    let read_dst = [sge(&a.rx, 8192, 4000)];
    let cas_dst = [sge(&a.rx, 20_000, 8)];
    let faa_dst = [sge(&a.rx, 20_008, 8)];
    let inline_from_mr = [sge(&a.mr, 300, 200)];
    let id = iter * 100;
    let base = b.mr.addr;
    // B's window: bound over 16 KiB of its MR at `base + 32768` in iteration 0 (a local operation on B's send
    // queue); from iteration 1 on A's multi-packet RDMA WRITE goes through the window's key (each packet resolves it).
    let window = Rkey((b.mw.0 & !0xff) | (b.mw.0.wrapping_add(1) & 0xff));
    if iter == 0 {
        let bind = SendOp::BindMw {
            mw: b.mw,
            rkey: window,
            mr: b.mr.lkey,
            addr: base + 32768,
            length: 16384,
            access: AccessFlags::REMOTE_WRITE,
        };
        net.b
            .post_send(b.rc, &[SendWr::new(id + 99, bind, &[])])
            .unwrap();
        t.b_rc_expected += 1;
    }
    let write_key = if iter == 0 { b.mr.rkey } else { window };
    let wrs = [
        SendWr::new(id, SendOp::Send, &[]).inline(&inline_parts),
        SendWr::new(id + 1, SendOp::Send, &two_sges).flags(SendFlags::SOLICITED),
        SendWr::new(id + 2, SendOp::SendWithImm { imm: iter as u32 }, &[]),
        SendWr::new(
            id + 3,
            SendOp::RdmaWrite {
                remote_addr: base + 32768,
                rkey: write_key,
            },
            &write_src,
        ),
        SendWr::new(
            id + 4,
            SendOp::RdmaWriteWithImm {
                remote_addr: base + 40_000,
                rkey: b.mr.rkey,
                imm: 7,
            },
            &wimm_src,
        ),
        SendWr::new(
            id + 5,
            SendOp::RdmaRead {
                remote_addr: base + 1000,
                rkey: b.mr.rkey,
            },
            &read_dst,
        ),
        SendWr::new(
            id + 6,
            SendOp::AtomicCmpAndSwp {
                remote_addr: base + 50_000,
                rkey: b.mr.rkey,
                compare: iter,
                swap: iter + 1,
            },
            &cas_dst,
        ),
        SendWr::new(
            id + 7,
            SendOp::AtomicFetchAndAdd {
                remote_addr: base + 50_008,
                rkey: b.mr.rkey,
                add: 1,
            },
            &faa_dst,
        ),
        SendWr::new(id + 8, SendOp::Send, &inline_from_mr)
            .flags(SendFlags::INLINE | SendFlags::FENCE),
        SendWr::new(
            id + 9,
            SendOp::AtomicWrite {
                remote_addr: base + 50_016,
                rkey: b.mr.rkey,
                value: iter.to_le_bytes(),
            },
            &[],
        ),
    ];
    net.a.post_send(a.rc, &wrs).unwrap();
    t.a_rc_expected += wrs.len() as u32;
    t.b_rc_expected += B_RECVS_PER_ITER;

    let b_send = [sge(&b.mr, 0, 1200)];
    let b_write = [sge(&b.mr, 4096, 3000)];
    let b_read = [sge(&b.rx, 30_000, 2048)];
    let wrs = [
        SendWr::new(id, SendOp::Send, &b_send),
        SendWr::new(
            id + 1,
            SendOp::RdmaWrite {
                remote_addr: a.mr.addr + 24_000,
                rkey: a.mr.rkey,
            },
            &b_write,
        ),
        SendWr::new(
            id + 2,
            SendOp::RdmaRead {
                remote_addr: a.mr.addr,
                rkey: a.mr.rkey,
            },
            &b_read,
        )
        .flags(SendFlags::FENCE),
    ];
    net.b.post_send(b.rc, &wrs).unwrap();
    t.b_rc_expected += wrs.len() as u32;
    t.a_rc_expected += 1; // the receive of B's SEND

    let dest = UdDest {
        ah: a.ah_to_peer,
        remote_qpn: b.ud,
        remote_qkey: QKEY,
    };
    let ud_payload = [0xC3u8; 64];
    let ud_inline: [&[u8]; 1] = [&ud_payload];
    let ud_sge = [sge(&a.mr, 2000, 1000)];
    let wrs = [
        SendWr::new(id, SendOp::SendWithImm { imm: 1 }, &[])
            .inline(&ud_inline)
            .ud(dest),
        SendWr::new(id + 1, SendOp::Send, &ud_sge).ud(dest),
    ];
    net.a.post_send(a.ud, &wrs).unwrap();
    t.a_ud_expected += wrs.len() as u32;

    // UC: multi-packet SEND, WRITE and WRITE_WITH_IMM (complete once on the wire; lost ones are simply gone).
    let uc_send = [sge(&a.mr, 0, 2500)];
    let uc_write = [sge(&a.mr, 4096, 3000)];
    let uc_wimm = [sge(&a.mr, 9000, 1500)];
    let wrs = [
        SendWr::new(id, SendOp::Send, &uc_send),
        SendWr::new(
            id + 1,
            SendOp::RdmaWrite {
                remote_addr: base + 56_000,
                rkey: b.mr.rkey,
            },
            &uc_write,
        ),
        SendWr::new(
            id + 2,
            SendOp::RdmaWriteWithImm {
                remote_addr: base + 60_000,
                rkey: b.mr.rkey,
                imm: 9,
            },
            &uc_wimm,
        ),
    ];
    net.a.post_send(a.uc, &wrs).unwrap();
    t.a_ud_expected += wrs.len() as u32;
}

/// Drains the CQs the engines list as ready (`poll_ready_cq`, no scan over CQs) into a fixed array, checking
/// every status; reposts consumed UD/UC receives. Afterwards every CQ must be empty (the ready list missed none).
fn reap(net: &mut Net, a: &Side, b: &Side, t: &mut Tally) {
    let mut wcs = [Wc::default(); 32];
    while let Some(cq) = net.a.poll_ready_cq() {
        loop {
            let n = net.a.poll_cq(cq, &mut wcs);
            if n == 0 {
                break;
            }
            for wc in &wcs[..n] {
                assert_eq!(wc.status, WcStatus::Success, "A completion {wc:?}");
            }
            if cq == a.rc_cq {
                t.a_rc += n as u32;
            } else {
                assert_eq!(cq, a.ud_cq);
                t.a_ud_send += n as u32;
            }
        }
    }
    while let Some(cq) = net.b.poll_ready_cq() {
        loop {
            let n = net.b.poll_cq(cq, &mut wcs);
            if n == 0 {
                break;
            }
            for wc in &wcs[..n] {
                assert_eq!(wc.status, WcStatus::Success, "B completion {wc:?}");
            }
            if cq == b.rc_cq {
                t.b_rc += n as u32;
                continue;
            }
            assert_eq!(cq, b.ud_cq);
            for wc in &wcs[..n] {
                assert!(matches!(
                    wc.opcode,
                    WcOpcode::Recv | WcOpcode::RecvRdmaWithImm
                ));
                post_unrel_recvs(net, b, wc.qp_num, 1);
            }
            t.b_ud_recv += n as u32;
        }
    }
    for (e, cq) in [
        (&net.a, a.rc_cq),
        (&net.a, a.ud_cq),
        (&net.b, b.rc_cq),
        (&net.b, b.ud_cq),
    ] {
        assert_eq!(
            e.cq_len(cq),
            0,
            "a CQ with completions was not on the ready list"
        );
    }
    while let Some(ev) = net
        .a
        .poll_async_event()
        .or_else(|| net.b.poll_async_event())
    {
        if ev.event_type == AsyncEventType::SrqLimitReached {
            assert_eq!(ev.srq, b.rc_srq, "{ev:?}");
            net.srq_limit_events += 1;
            arm_srq_limit(&mut net.b, ev.srq.unwrap());
            continue;
        }
        assert!(
            matches!(ev.event_type, AsyncEventType::CommEst),
            "unexpected async event {ev:?}"
        );
    }
}

/// One iteration: post receives and sends, move frames until every RC WR (and UD send) completed and the wire is
/// quiet. With `late_recv` B's receives are posted only after A's SENDs had time to hit RNR.
/// One MAD each way between the engines' GSIs (QP 1): `send_mad` with a cached address handle.
fn send_mads(net: &mut Net, iter: u64) {
    let mad = [iter as u8; 256];
    for (e, ip, mac) in [(&mut net.a, IP_B, MAC_B), (&mut net.b, IP_A, MAC_A)] {
        let dest = MadDest {
            dgid: Gid::from_ipv4(ip),
            dmac: mac,
            qpn: Qpn::new(1),
            sgid_index: 0,
        };
        e.send_mad(&dest, &mad).unwrap();
    }
}

/// Drains both GSIs with `poll_mad` (which re-posts each receive slot).
fn reap_mads(net: &mut Net) {
    let mut out = [0u8; 256];
    for e in [&mut net.a, &mut net.b] {
        while e.poll_mad(&mut out).is_some() {
            net.mads += 1;
        }
    }
}

fn iteration(net: &mut Net, a: &Side, b: &Side, iter: u64, late_recv: bool) {
    let mut t = Tally::default();
    send_mads(net, iter);
    post_a_recv(net, a, iter);
    if !late_recv {
        post_b_recvs(net, b, iter);
    }
    post_sends(net, a, b, iter, &mut t);
    if late_recv {
        net.run_for(Duration::from_micros(30));
        reap(net, a, b, &mut t);
        post_b_recvs(net, b, iter);
    }
    let mut guard = 0u32;
    loop {
        let more = net.step();
        reap(net, a, b, &mut t);
        reap_mads(net);
        let done = t.a_rc == t.a_rc_expected
            && t.b_rc == t.b_rc_expected
            && t.a_ud_send == t.a_ud_expected
            && net.wire.is_empty();
        if done {
            break;
        }
        guard += 1;
        assert!(
            more && guard < 200_000,
            "iteration {iter} stuck: A rc {}/{} B rc {}/{} A ud {}/{}\n{}\n{}",
            t.a_rc,
            t.a_rc_expected,
            t.b_rc,
            t.b_rc_expected,
            t.a_ud_send,
            t.a_ud_expected,
            net.a.qp_dump(a.rc).unwrap_or_default(),
            net.b.qp_dump(b.rc).unwrap_or_default(),
        );
    }
    assert!(t.a_rc <= t.a_rc_expected && t.b_rc <= t.b_rc_expected);
}

fn assert_zero(what: &str, (allocs, reallocs, deallocs): (u64, u64, u64)) {
    let first = FIRST.lock().map(|f| f.join("\n")).unwrap_or_default();
    assert!(
        allocs == 0 && reallocs == 0 && deallocs == 0,
        "{what}: {allocs} allocations, {reallocs} reallocations, {deallocs} deallocations in the steady state; \
         first ones:\n{first}"
    );
}

/// A rate controller that wants `on_timer` every 10 µs (exercises the engine's `RateTimer`).
#[derive(Debug, Default)]
struct Ticking {
    next: Instant,
}

/// `Ticking::on_timer` calls (all engines of this binary).
static TICKS: AtomicU64 = AtomicU64::new(0);

impl RateController for Ticking {
    fn on_tx(&mut self, _now: Instant, _bytes: usize) {}
    fn on_cnp(&mut self, _now: Instant) -> bool {
        true
    }
    fn rate_bps(&self) -> Option<u64> {
        None
    }
    fn next_timer(&self) -> Option<Instant> {
        Some(self.next)
    }
    fn on_timer(&mut self, now: Instant) {
        TICKS.fetch_add(1, Ordering::Relaxed);
        self.next = now + Duration::from_micros(10);
    }
}

fn run(loss_permille: u32, ce_every: u32, rnr_every: u64, warmup: u64, iters: u64) -> Net {
    let mut net = Net::new(loss_permille, ce_every);
    // timeout 8 = 1.05 ms local ACK timeout (virtual time).
    let (a, b) = connect(&mut net, 8);
    post_unrel_recvs(&mut net, &b, b.ud, UD_RECVS);
    post_unrel_recvs(&mut net, &b, b.uc, UC_RECVS);
    // Rate-controller paths: B's RC QP is paced per packet (a one-frame bucket, so its Shaper timer runs) at the
    // rate of an nvidia DCQCN RP on a 20 Gb/s port, A's UC QP has a controller with its own timer.
    net.b.set_qp_rate_limit(b.rc, None, Some(0)).unwrap();
    net.b
        .set_rate_controller(
            b.rc,
            Box::new(cc::Dcqcn::new(DcqcnConfig::new(cc::Profile::Nvidia, 20e9))),
        )
        .unwrap();
    net.a
        .set_rate_controller(a.uc, Box::new(Ticking::default()))
        .unwrap();
    // A's UD QP runs the ns3_mlx RP (the other QPs run the engines' configured profiles).
    net.qpns = (a.rc, a.ud, b.rc);
    net.a
        .set_rate_controller(
            a.ud,
            Box::new(cc::Dcqcn::new(DcqcnConfig::new(cc::Profile::Ns3Mlx, 100e9))),
        )
        .unwrap();
    for (q, tc) in [(a.rc, 0), (a.uc, 1), (a.ud, 2)] {
        net.a.set_qp_tc(q, tc).unwrap();
    }
    // The GSIs' address handles are created by the first MADs (control path), before the measured region.
    send_mads(&mut net, u64::MAX);
    let late = |i: u64| rnr_every > 0 && i % rnr_every == rnr_every - 1;
    for i in 0..warmup {
        iteration(&mut net, &a, &b, i, late(i));
    }
    let counts = count_allocs(|| {
        for i in warmup..warmup + iters {
            iteration(&mut net, &a, &b, i, late(i));
        }
    });
    assert_zero(
        if loss_permille > 0 {
            "lossy steady state"
        } else {
            "lossless steady state"
        },
        counts,
    );
    net
}

#[test]
fn steady_state_allocates_nothing() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let ticks = TICKS.load(Ordering::Relaxed);
    let net = run(0, 0, 0, 0, 1000);
    assert!(
        TICKS.load(Ordering::Relaxed) > ticks + 100,
        "RateTimer fired"
    );
    let c = net.a.counters();
    assert_eq!(c.retransmitted_pkts, 0);
    assert!(
        net.a.counters().sent_pkts > 20_000,
        "{:?}",
        net.a.counters()
    );
    assert_eq!(net.dropped, 0);
    // B's SRQs served its RC and UD receives, and the limit event fired (and was re-armed) in the measured loop.
    assert!(net.srq_limit_events > 100, "{}", net.srq_limit_events);
    assert!(net.b.counters().rdma_recvs > 1000);
    assert!(net.mads >= 2 * 1000, "MADs through QP 1: {}", net.mads);
    assert!(
        net.gathered > 1000,
        "A's gathering transmit path ran: {}",
        net.gathered
    );
    // The scheduler's paths ran in the measured region: A's port bucket made it wait, all three of its classes sent
    // (TC 2 through its class bucket), B served READ responses and parked its paced QP.
    let (sa, sb) = (net.a.scheduler().stats(), net.b.scheduler().stats());
    assert!(sa.port_waits > 0, "{sa:?}");
    assert!(sa.class_bytes[..3].iter().all(|&b| b > 0), "{sa:?}");
    assert!(sa.ctrl > 0 && sb.read > 0 && sb.parks > 0, "{sa:?}\n{sb:?}");
    // ... and the RTT estimator that sizes the batching window took samples from RC ACKs.
    assert!(
        net.a.scheduler().rtt().samples() > 100,
        "{:?}",
        net.a.scheduler().rtt()
    );
}

#[test]
fn lossy_steady_state_allocates_nothing() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // (loss ‰, CE-mark every n-th ECT frame, late receives every n-th iteration)
    for (loss, ce, rnr) in [(5, 8, 3), (20, 16, 5), (60, 32, 7)] {
        let net = run(loss, ce, rnr, 0, 1500);
        // The recovery paths did run inside the measured loop's workload.
        let (a, b) = (net.a.counters(), net.b.counters());
        let ctx = format!("loss {loss}‰: A {a:?}\nB {b:?}");
        assert!(net.dropped > 100, "dropped {} ({ctx})", net.dropped);
        assert!(net.ce_marked > 100, "CE marked {} ({ctx})", net.ce_marked);
        assert!(net.gathered > 100, "gathered {} ({ctx})", net.gathered);
        assert!(
            a.retransmitted_pkts > 0 && b.retransmitted_pkts > 0,
            "{ctx}"
        );
        assert!(a.local_ack_timeout_err > 0, "{ctx}");
        assert!(a.rcvd_seq_err > 0, "{ctx}");
        assert!(a.implied_nak_seq_err + b.implied_nak_seq_err > 0, "{ctx}");
        assert!(b.duplicate_request > 0, "{ctx}");
        // RNR NAKs from B's RC QP, whose receive WQEs come from its (then empty) SRQ.
        assert!(a.rcvd_rnr_err > 0 && b.send_rnr_err > 0, "{ctx}");
        assert!(net.srq_limit_events > 0, "{ctx}");
        assert!(b.np_cnp_sent > 0 && a.rp_cnp_handled > 0, "{ctx}");
        assert!(a.np_cnp_sent > 0 && b.rp_cnp_handled > 0, "{ctx}");
        // DCQCN ran inside the measured loop: CNPs in, cuts, timer/byte-counter increases (each rate change reaches
        // the QP's shaper), for one QP of each profile.
        for (e, q, what) in [
            (&net.a, net.qpns.0, "A rc (paper)"),
            (&net.a, net.qpns.1, "A ud (ns3_mlx)"),
            (&net.b, net.qpns.2, "B rc (nvidia)"),
        ] {
            let dump = e.qp_dump(q).unwrap();
            let count = |k: &str| -> u64 {
                dump.split(&format!(" {k}="))
                    .nth(1)
                    .and_then(|r| r.split(' ').next())
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0)
            };
            assert!(
                count("cnps") > 0 && count("cuts") > 0 && count("incs") > 0,
                "loss {loss}‰, {what}: {dump}"
            );
        }
        assert!(b.drop_uc_out_of_seq > 0, "{ctx}");
    }
}

#[test]
fn the_counter_sees_allocations() {
    // The harness can fail: an allocation in the armed region is counted.
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (allocs, _, deallocs) = count_allocs(|| {
        let v = std::hint::black_box(vec![1u8; 64]);
        drop(v);
    });
    assert_eq!((allocs, deallocs), (1, 1));
    if let Ok(mut f) = FIRST.lock() {
        f.clear();
    }
}

/// UD multicast (`roce_proto::mcast`): A sends to a group three of B's UD QPs are attached to (one with another
/// Q_Key), B receives one copy per attached QP with the Q_Key checked, and A's own attached QP its copy of B's sends:
/// transmit to the group's MAC and DestQP 0xFFFFFF, the group lookup, the delivery loop and the per-QP drops allocate
/// nothing once the groups are attached.
#[test]
fn multicast_steady_state_allocates_nothing() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut net = Net::new(0, 0);
    let group = Gid::from_ipv4([239, 214, 9, 1]);
    let make = |e: &mut Engine, qkey: u32| {
        let pd = e.alloc_pd().unwrap();
        let cq = e.create_cq(256).unwrap();
        let (qpn, _) = e
            .create_qp(&QpInitAttr {
                qp_type: QpType::Ud,
                pd,
                send_cq: cq,
                recv_cq: cq,
                cap: CAP,
                sq_sig_all: true,
            })
            .unwrap();
        bring_up_ud(e, qpn);
        if qkey != QKEY {
            let at = QpAttr {
                qkey,
                ..QpAttr::default()
            };
            e.modify_qp(qpn, &at, QpAttrMask::QKEY).unwrap();
        }
        let m = e.reg_mr(pd, vec![0u8; 4096], MR_ACCESS).unwrap();
        let ah = e
            .create_ah(
                pd,
                &AhAttr {
                    dgid: group,
                    ..AhAttr::default()
                },
            )
            .unwrap();
        e.attach_mcast(qpn, group).unwrap();
        (qpn, cq, m, ah)
    };
    let tx = make(&mut net.a, QKEY);
    let rx: Vec<_> = (0..3)
        .map(|k| make(&mut net.b, if k == 2 { 0x2222 } else { QKEY }))
        .collect();
    let dest = |ah| UdDest {
        ah,
        remote_qpn: Qpn::new(0xFF_FFFF),
        remote_qkey: QKEY,
    };
    let mut wc = [Wc::default(); 16];
    let mut got = 0u64;
    // The QP with the other Q_Key keeps one receive posted (never consumed).
    net.b
        .post_recv(
            rx[2].0,
            &[RecvWr {
                wr_id: 1,
                sg_list: &[sge(&rx[2].2, 0, 256)],
            }],
        )
        .unwrap();
    let mut round = |net: &mut Net, got: &mut u64| {
        for (qpn, _, m, _) in &rx[..2] {
            net.b
                .post_recv(
                    *qpn,
                    &[RecvWr {
                        wr_id: 1,
                        sg_list: &[sge(m, 0, 256)],
                    }],
                )
                .unwrap();
        }
        net.a
            .post_recv(
                tx.0,
                &[RecvWr {
                    wr_id: 2,
                    sg_list: &[sge(&tx.2, 0, 256)],
                }],
            )
            .unwrap();
        net.a
            .post_send(
                tx.0,
                &[SendWr::new(3, SendOp::Send, &[sge(&tx.2, 1024, 100)]).ud(dest(tx.3))],
            )
            .unwrap();
        let (q, _, m, ah) = &rx[0];
        net.b
            .post_send(
                *q,
                &[SendWr::new(4, SendOp::Send, &[sge(m, 1024, 64)]).ud(dest(*ah))],
            )
            .unwrap();
        net.run_for(Duration::from_micros(50));
        for (on_a, cq) in [
            (true, tx.1),
            (false, rx[0].1),
            (false, rx[1].1),
            (false, rx[2].1),
        ] {
            let e = if on_a { &mut net.a } else { &mut net.b };
            loop {
                let n = e.poll_cq(cq, &mut wc);
                if n == 0 {
                    break;
                }
                *got += wc[..n]
                    .iter()
                    .filter(|w| w.status == WcStatus::Success && w.opcode == WcOpcode::Recv)
                    .count() as u64;
            }
        }
    };
    round(&mut net, &mut got);
    let before = got;
    let c = count_allocs(|| {
        for _ in 0..200 {
            round(&mut net, &mut got);
        }
    });
    assert_zero("multicast", c);
    // Per round: B's two QPs with the right Q_Key get A's datagram (the third drops it: Q_Key), B's own sender QP
    // (attached) loops nothing back (no loopback in the engine: the link's IP multicast loop does that), and A's
    // attached QP gets B's datagram.
    assert_eq!(got - before, 200 * 3, "copies received");
    assert_eq!(net.b.qp_counters(rx[2].0).unwrap().drop_qkey_mismatch, 201);
}
