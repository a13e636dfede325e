//! The engine thread (`STYLE.md` D1, D4, §10): owns one or more [`Engine`]s with their [`Link`]s and drives them.
//!
//! One loop iteration:
//! 1. per device: `rx_burst` → `handle_frame` for each frame; `handle_timeout(now)` when the engine's deadline
//!    has passed;
//! 2. drain the QP rings named by doorbells (`post_send` / `post_recv` into the engine; WQEs wait in the ring while
//!    the engine's SQ/RQ is full) and evaluate the CQs named by arm doorbells ([`crate::Cq::req_notify`]);
//! 3. run queued control commands (create/modify/destroy, reg_mr, counters);
//! 4. per device: `poll_transmit` into link transmit buffers up to `tx_budget` frames, then **one** `flush()`;
//! 5. publish completions into the per-CQ rings (never more than a ring has room for: the rest stays in the engine
//!    CQ, so no completion is lost) and fire completion-channel events (CQ moderation);
//! 6. back off when idle: spin, then `yield_now`, then park until the next engine/link/moderation deadline
//!    (at most `park_max`, because a real link's receive readiness is not visible to a parked thread).
//!
//! Application threads wake a parked engine thread with a doorbell (see [`Shared::ring`]).
//!
//! # Per-packet cost
//!
//! Nothing here allocates, locks or scans all QPs/CQs per packet or per post (`docs/ARCHITECTURE.md`):
//!
//! * **Doorbells** go through one fixed-capacity lock-free MPMC queue (`crossbeam_queue::ArrayQueue`, allocated once
//!   when the engine thread starts). Each QP has a "doorbell pending" flag and each CQ an "arm pending" flag; an
//!   entry is pushed only when the flag goes from clear to set, and the engine clears the flag before acting on the
//!   entry, so a QP or CQ has at most one entry queued and the queue is sized for every QP and CQ the devices allow
//!   (twice over: destroyed objects may leave a stale entry that is consumed on the next pass). Should a push still
//!   fail (pathological create/destroy churn), the producer sets an overflow flag and the engine falls back to one
//!   pass over every QP and CQ — correct, and only on that path. Alternatives weighed: one rtrb SPSC ring per
//!   producer needs a registry of producer threads (QP handles are `Sync`, any thread may post); the previous
//!   `SegQueue` allocated a block every 31 pushes on the posting thread and freed it on the engine thread.
//! * **Completions**: the engine lists the CQs that gained completions ([`Engine::poll_ready_cq`], each once); a CQ
//!   whose ring was full (or that has runtime-made completions waiting) goes on a short pending list, retried on
//!   every pass until drained. Runner CQ slots are indexed by the engine's CQ index, so no lookup is needed.
//! * **Moderation timers** of armed CQs live in a binary heap (at most one entry per CQ, capacity reserved at
//!   `create_cq`); the idle path looks only at its top.
//! * **Events** ([`CompChannel`]): firing one takes the channel's mutex, pushes into a queue whose capacity was
//!   reserved when the CQ was attached (no allocation), and signals the condition variable. That lock is on the
//!   event path only — at most one event per `req_notify` (events are one-shot), never per packet or per
//!   completion — and is contended only by a thread inside [`CompChannel::get_event`].

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering, fence};
use std::sync::{Arc, Mutex};
use std::thread::Thread;
use std::time::Duration;

use crossbeam_queue::{ArrayQueue, SegQueue};
use roce_link::{Link, min_instant};
use roce_proto::{CqHandle, Engine, Instant, Qpn, Wc, WcStatus};

use crate::channel::{CompChannel, Moderation, ModerationState};
use crate::clock::Clock;
use crate::endpoint::StatsEndpoint;
use crate::wqe::{RecvWqe, SendWqe};

/// A control command: runs on the engine thread with the device it targets.
pub(crate) type Cmd = Box<dyn FnOnce(&mut Device) + Send>;

/// Tuning of the engine thread loop.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuntimeConfig {
    /// Pin the engine thread to this core (index into `core_affinity::get_core_ids()`); `None` = no pinning.
    pub pin_core: Option<usize>,
    /// Frames taken from the link per receive burst.
    pub rx_burst: usize,
    /// Frames produced per device per loop iteration before `flush()` (doorbell batching).
    pub tx_budget: usize,
    /// Idle time spent busy-polling before yielding.
    pub spin: Duration,
    /// Idle time (from the last useful iteration) after which the thread parks instead of yielding.
    pub yield_for: Duration,
    /// Longest single park (a real link's receive readiness is only seen when the thread runs).
    pub park_max: Duration,
    /// Where the runtime's stats endpoint listens (what `rocev2 stat` reads; see the `endpoint` module docs).
    pub stats_endpoint: StatsEndpoint,
}

impl Default for RuntimeConfig {
    /// No pinning, bursts of 32 frames, spin 20 µs, yield up to 2 ms idle, then park at most 1 ms at a time; the
    /// stats endpoint in the run directory.
    fn default() -> Self {
        RuntimeConfig {
            pin_core: None,
            rx_burst: 32,
            tx_budget: 32,
            spin: Duration::from_micros(20),
            yield_for: Duration::from_millis(2),
            park_max: Duration::from_millis(1),
            stats_endpoint: StatsEndpoint::RunDir,
        }
    }
}

/// Counters of the engine thread itself (not the protocol): how often it looped, parked, was woken.
#[derive(Debug, Default)]
pub struct RuntimeStats {
    /// Loop iterations.
    pub loops: AtomicU64,
    /// Times the thread parked.
    pub parks: AtomicU64,
    /// Unparks issued by application doorbells.
    pub wakeups: AtomicU64,
    /// Doorbells rung (one per posted chain).
    pub doorbells: AtomicU64,
    /// Work requests posted (send and receive), counted with their doorbell: `wqes / doorbells` is the average
    /// chain length.
    pub wqes: AtomicU64,
    /// `flush()` calls that followed at least one frame.
    pub flushes: AtomicU64,
    /// Frames transmitted.
    pub tx_frames: AtomicU64,
    /// Frames received.
    pub rx_frames: AtomicU64,
    /// Link errors (other than back-pressure) seen by the loop.
    pub link_errors: AtomicU64,
    /// Times the doorbell queue was found full and the loop looked at every QP and CQ once instead (expected 0; see
    /// the `runner` module docs).
    pub doorbell_overflows: AtomicU64,
}

/// Doorbell entry kind bit: the entry names a CQ that was armed (else a QP with new ring entries).
const DB_CQ_ARM: u64 = 1 << 63;

/// Largest doorbell queue (16 bytes per entry: 4 MiB), for configurations with very large `max_qp`/`max_cq`.
const MAX_DOORBELLS: usize = 1 << 18;

/// State shared between application threads and the engine thread.
pub(crate) struct Shared {
    /// QPs with newly posted work and CQs newly armed: `kind | (device << 32) | slot` (see the module docs).
    doorbells: ArrayQueue<u64>,
    /// A doorbell push found the queue full: the engine must look at every QP and CQ once.
    db_overflow: AtomicBool,
    cmds: SegQueue<(usize, Cmd)>,
    parked: AtomicBool,
    pub(crate) stop: AtomicBool,
    thread: Mutex<Option<Thread>>,
    pub(crate) stats: RuntimeStats,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("doorbells", &self.doorbells.len())
            .field("cmds", &self.cmds.len())
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl Shared {
    /// `max_objects`: QPs + CQs all devices on the thread allow (the doorbell queue holds twice that, at least 64
    /// and at most [`MAX_DOORBELLS`] entries; beyond that the overflow path keeps it correct).
    pub(crate) fn new(max_objects: usize) -> Shared {
        Shared {
            doorbells: ArrayQueue::new(max_objects.saturating_mul(2).clamp(64, MAX_DOORBELLS)),
            db_overflow: AtomicBool::new(false),
            cmds: SegQueue::new(),
            parked: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            thread: Mutex::new(None),
            stats: RuntimeStats::default(),
        }
    }

    pub(crate) fn set_thread(&self, t: Thread) {
        if let Ok(mut g) = self.thread.lock() {
            *g = Some(t);
        }
    }

    /// Wakes the engine thread if (and only if) it is parked.
    ///
    /// Ordering: the caller has just published work (a ring push, a queue push). The SeqCst fence orders that
    /// publication before the load of `parked`; the engine thread stores `parked = true` and then issues its own
    /// SeqCst fence before re-checking the queues. So either the engine sees our work, or we see `parked` and
    /// unpark it (Dekker pattern) — a wake-up cannot be lost.
    fn wake(&self) {
        fence(Ordering::SeqCst);
        if self.parked.load(Ordering::Relaxed) {
            self.stats.wakeups.fetch_add(1, Ordering::Relaxed);
            if let Ok(g) = self.thread.lock()
                && let Some(t) = g.as_ref()
            {
                t.unpark();
            }
        }
    }

    /// The doorbell: announces that QP `slot` of device `dev` has `wqes` new ring entries.
    pub(crate) fn ring(&self, dev: usize, slot: u32, pending: &AtomicBool, wqes: usize) {
        self.stats.doorbells.fetch_add(1, Ordering::Relaxed);
        self.stats.wqes.fetch_add(wqes as u64, Ordering::Relaxed);
        // Only one doorbell entry per QP is outstanding: the engine clears `pending` (SeqCst) before it drains the
        // ring, so a push made after its drain started sets the flag again and enqueues the QP again.
        if !pending.swap(true, Ordering::SeqCst) {
            self.push_doorbell(((dev as u64) << 32) | u64::from(slot));
        }
        self.wake();
    }

    /// The arm doorbell: CQ `slot` of device `dev` was armed (`req_notify`); the engine re-evaluates its moderation
    /// (completions published before the arm count). `arm_pending` plays the role of the QP's `pending` flag.
    pub(crate) fn ring_arm(&self, dev: usize, slot: u32, arm_pending: &AtomicBool) {
        if !arm_pending.swap(true, Ordering::SeqCst) {
            self.push_doorbell(DB_CQ_ARM | ((dev as u64) << 32) | u64::from(slot));
        }
        self.wake();
    }

    fn push_doorbell(&self, db: u64) {
        if self.doorbells.push(db).is_err() {
            // Only under heavy create/destroy churn (see the module docs): the engine scans once.
            self.db_overflow.store(true, Ordering::SeqCst);
        }
    }

    /// Queues a control command for device `dev`.
    pub(crate) fn submit(&self, dev: usize, cmd: Cmd) {
        self.cmds.push((dev, cmd));
        self.wake();
    }

    /// Asks the loop to stop and wakes it.
    pub(crate) fn shutdown(&self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Ok(g) = self.thread.lock()
            && let Some(t) = g.as_ref()
        {
            t.unpark();
        }
    }
}

/// Engine-side state of one QP.
pub(crate) struct QpSlot {
    pub(crate) qpn: Qpn,
    pub(crate) sq: rtrb::Consumer<SendWqe>,
    pub(crate) rq: rtrb::Consumer<RecvWqe>,
    pub(crate) pending: Arc<AtomicBool>,
    pub(crate) send_cq: u32,
    pub(crate) recv_cq: u32,
    pub(crate) max_send_wr: u32,
    pub(crate) max_recv_wr: u32,
    /// Already waiting in `Device::blocked`.
    blocked: bool,
}

impl QpSlot {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        qpn: Qpn,
        sq: rtrb::Consumer<SendWqe>,
        rq: rtrb::Consumer<RecvWqe>,
        pending: Arc<AtomicBool>,
        send_cq: u32,
        recv_cq: u32,
        max_send_wr: u32,
        max_recv_wr: u32,
    ) -> QpSlot {
        QpSlot {
            qpn,
            sq,
            rq,
            pending,
            send_cq,
            recv_cq,
            max_send_wr,
            max_recv_wr,
            blocked: false,
        }
    }
}

/// Completion-channel attachment of a CQ.
pub(crate) struct CqNotify {
    pub(crate) chan: Arc<CompChannel>,
    /// Set by `req_notify`, cleared when an event fires (one-shot).
    pub(crate) armed: Arc<AtomicBool>,
    /// An arm doorbell for this CQ is queued (see [`Shared::ring_arm`]).
    pub(crate) arm_pending: Arc<AtomicBool>,
}

/// Engine-side state of one CQ.
pub(crate) struct CqSlot {
    pub(crate) handle: CqHandle,
    pub(crate) ring: rtrb::Producer<Wc>,
    pub(crate) notify: Option<CqNotify>,
    pub(crate) moder: ModerationState,
    /// Completions made by the runtime itself (a WR the engine refused after the application's post returned;
    /// an error path, so this queue may allocate).
    pub(crate) synthetic: VecDeque<Wc>,
    /// On `Device::cq_pending`.
    listed: bool,
    /// Has an entry in `Device::cq_timers`.
    timer_queued: bool,
}

impl CqSlot {
    pub(crate) fn new(
        handle: CqHandle,
        ring: rtrb::Producer<Wc>,
        notify: Option<CqNotify>,
        moderation: Moderation,
    ) -> CqSlot {
        CqSlot {
            handle,
            ring,
            notify,
            moder: ModerationState::new(moderation),
            synthetic: VecDeque::new(),
            listed: false,
            timer_queued: false,
        }
    }

    /// Fires the channel event if the CQ is armed and its moderation rule is met. Returns true if it fired.
    fn maybe_fire(&mut self, now: Instant) -> bool {
        let Some(n) = &self.notify else {
            return false;
        };
        if self.moder.due(now) && n.armed.swap(false, Ordering::AcqRel) {
            self.moder.fired(now);
            n.chan.notify(self.handle.0);
            return true;
        }
        false
    }

    fn is_armed(&self) -> bool {
        self.notify
            .as_ref()
            .is_some_and(|n| n.armed.load(Ordering::Acquire))
    }
}

/// One device (port) on an engine thread.
pub struct Device {
    pub(crate) engine: Engine,
    pub(crate) link: Box<dyn Link + 'static>,
    pub(crate) qps: Vec<Option<QpSlot>>,
    /// Indexed by the engine's CQ index (`CqHandle.0 - 1`), so [`Engine::poll_ready_cq`] names the slot.
    pub(crate) cqs: Vec<Option<CqSlot>>,
    blocked: VecDeque<u32>,
    /// CQs with completions left over (ring was full, or runtime-made completions wait); each listed once.
    cq_pending: VecDeque<u32>,
    /// Moderation deadlines of armed CQs: `(deadline, cq slot)`, at most one entry per CQ.
    cq_timers: BinaryHeap<Reverse<(Instant, u32)>>,
    wc_buf: Vec<Wc>,
    /// MRs whose last handle went while WRs still used them: deregistered once the engine lets go.
    deferred_dereg: Vec<roce_proto::Lkey>,
    pub(crate) now: Instant,
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device")
            .field("engine", &self.engine)
            .finish_non_exhaustive()
    }
}

impl Device {
    pub(crate) fn new(engine: Engine, link: Box<dyn Link + 'static>) -> Device {
        Device {
            engine,
            link,
            qps: Vec::new(),
            cqs: Vec::new(),
            blocked: VecDeque::new(),
            cq_pending: VecDeque::new(),
            cq_timers: BinaryHeap::new(),
            wc_buf: vec![Wc::default(); 64],
            deferred_dereg: Vec::new(),
            now: Instant::ZERO,
        }
    }

    /// The engine (for control commands).
    pub(crate) fn engine_mut(&mut self) -> &mut Engine {
        &mut self.engine
    }

    /// Puts a slot value into the first free index of `v`.
    pub(crate) fn insert<T>(v: &mut Vec<Option<T>>, item: T) -> u32 {
        if let Some(i) = v.iter().position(Option::is_none) {
            v[i] = Some(item);
            i as u32
        } else {
            v.push(Some(item));
            (v.len() - 1) as u32
        }
    }

    /// Installs the runtime state of engine CQ `cq` (control path): slot index = engine CQ index; room on the
    /// pending list and the timer heap is reserved for every slot.
    pub(crate) fn put_cq(&mut self, cq: CqSlot) -> u32 {
        let i = (cq.handle.0 as usize).saturating_sub(1);
        if self.cqs.len() <= i {
            self.cqs.resize_with(i + 1, || None);
        }
        self.cqs[i] = Some(cq);
        let n = self.cqs.len();
        self.cq_pending
            .reserve(n.saturating_sub(self.cq_pending.len()));
        self.cq_timers
            .reserve(n.saturating_sub(self.cq_timers.len()));
        i as u32
    }

    /// Removes the runtime state of CQ `slot` (control path), with its pending-list and timer entries.
    pub(crate) fn remove_cq(&mut self, slot: u32) {
        if let Some(s) = self.cqs.get_mut(slot as usize) {
            *s = None;
        }
        self.cq_pending.retain(|&c| c != slot);
        self.cq_timers.retain(|Reverse((_, c))| *c != slot);
    }

    /// Moves WQEs from QP `slot`'s rings into the engine while its queues have room. Returns true if any moved.
    pub(crate) fn drain_qp(&mut self, slot: u32) -> bool {
        let Some(Some(qp)) = self.qps.get_mut(slot as usize) else {
            return false;
        };
        let qpn = qp.qpn;
        let mut moved = false;
        let mut stuck = false;
        let info = self.engine.qp_info(qpn);
        let (mut sq_out, mut rq_out) =
            info.map_or((0, 0), |i| (i.sq_outstanding, i.rq_outstanding));
        while let Ok(wqe) = qp.rq.peek() {
            if rq_out >= qp.max_recv_wr {
                stuck = true;
                break;
            }
            let sges = wqe.sges;
            let wr = roce_proto::RecvWr {
                wr_id: wqe.wr_id,
                sg_list: sges.as_slice(),
            };
            let r = self.engine.post_recv(qpn, &[wr]);
            let wr_id = wqe.wr_id;
            let _ = qp.rq.pop();
            moved = true;
            rq_out += 1;
            if let Err(e) = r {
                tracing::warn!(%qpn, error = %e, "post_recv refused by the engine; completing with LOC_QP_OP_ERR");
                push_synthetic(
                    &mut self.cqs,
                    &mut self.cq_pending,
                    qp.recv_cq,
                    qpn,
                    wr_id,
                    roce_proto::WcOpcode::Recv,
                );
            }
        }
        while let Ok(wqe) = qp.sq.peek() {
            if sq_out >= qp.max_send_wr {
                stuck = true;
                break;
            }
            let r = wqe.with_wr(|wr| self.engine.post_send(qpn, std::slice::from_ref(wr)));
            let (wr_id, opc) = (wqe.wr_id, wqe.op.wc_opcode());
            let _ = qp.sq.pop();
            moved = true;
            sq_out += 1;
            if let Err(e) = r {
                tracing::warn!(%qpn, error = %e, "post_send refused by the engine; completing with LOC_QP_OP_ERR");
                push_synthetic(
                    &mut self.cqs,
                    &mut self.cq_pending,
                    qp.send_cq,
                    qpn,
                    wr_id,
                    opc,
                );
            }
        }
        if stuck && !qp.blocked {
            qp.blocked = true;
            self.blocked.push_back(slot);
        }
        moved
    }

    /// Hands every WR the application has posted (on any QP) to the engine, as far as its queues have room
    /// (control path: one pass over the QPs).
    pub(crate) fn drain_all_posted(&mut self) {
        for slot in 0..self.qps.len() as u32 {
            self.drain_qp(slot);
        }
    }

    /// Deregisters MR `lkey`, or, while WRs still use it, keeps it for [`retry_deferred_dereg`]
    /// (Self::retry_deferred_dereg).
    pub(crate) fn dereg_or_defer(&mut self, lkey: roce_proto::Lkey) {
        self.drain_all_posted();
        match self.engine.dereg_mr(lkey) {
            Ok(_) => {}
            Err(roce_proto::ResourceError::Busy(_)) => self.deferred_dereg.push(lkey),
            Err(e) => tracing::warn!(error = %e, "dereg_mr failed"),
        }
    }

    /// Deregisters the deferred MRs whose WRs have completed (only when some are waiting).
    fn retry_deferred_dereg(&mut self) {
        if self.deferred_dereg.is_empty() {
            return;
        }
        let engine = &mut self.engine;
        self.deferred_dereg
            .retain(|&k| matches!(engine.dereg_mr(k), Err(roce_proto::ResourceError::Busy(_))));
    }

    /// Retries QPs whose rings were left non-empty because the engine's queues were full.
    fn retry_blocked(&mut self) -> bool {
        let mut moved = false;
        for _ in 0..self.blocked.len() {
            let Some(slot) = self.blocked.pop_front() else {
                break;
            };
            if let Some(Some(qp)) = self.qps.get_mut(slot as usize) {
                qp.blocked = false;
            } else {
                continue;
            }
            moved |= self.drain_qp(slot);
        }
        moved
    }

    /// Moves engine completions into the CQ rings and fires moderated events. Returns completions published.
    ///
    /// Looks only at CQs left over from earlier passes and at those the engine reports with news
    /// ([`Engine::poll_ready_cq`]); never at every CQ.
    fn publish(&mut self, now: Instant) -> usize {
        let mut total = 0;
        for _ in 0..self.cq_pending.len() {
            let Some(slot) = self.cq_pending.pop_front() else {
                break;
            };
            if let Some(Some(cq)) = self.cqs.get_mut(slot as usize) {
                cq.listed = false;
            }
            total += self.publish_cq(slot, now);
        }
        while let Some(h) = self.engine.poll_ready_cq() {
            total += self.publish_cq(h.0.wrapping_sub(1), now);
        }
        total
    }

    /// Publishes what CQ `slot` has (runtime-made completions first, then the engine's) into its ring; lists it on
    /// `cq_pending` if some remain; runs its moderation. Returns completions published.
    fn publish_cq(&mut self, slot: u32, now: Instant) -> usize {
        let Some(Some(cq)) = self.cqs.get_mut(slot as usize) else {
            return 0;
        };
        let mut n = 0;
        while cq.ring.slots() > 0
            && let Some(wc) = cq.synthetic.pop_front()
        {
            let _ = cq.ring.push(wc);
            n += 1;
        }
        loop {
            let room = cq.ring.slots().min(self.wc_buf.len());
            if room == 0 {
                break;
            }
            let got = self.engine.poll_cq(cq.handle, &mut self.wc_buf[..room]);
            for wc in &self.wc_buf[..got] {
                // Cannot fail: at most `slots()` entries are pushed.
                let _ = cq.ring.push(*wc);
            }
            n += got;
            if got < room {
                break;
            }
        }
        if !cq.listed && (!cq.synthetic.is_empty() || self.engine.cq_len(cq.handle) > 0) {
            // The ring is full: the engine will not list this CQ again until a new completion, so remember it.
            cq.listed = true;
            self.cq_pending.push_back(slot);
        }
        if n > 0 && cq.notify.is_some() {
            cq.moder.on_completions(n, now);
            self.moderate(slot, now);
        }
        n
    }

    /// Fires CQ `slot`'s event if it is armed and due; otherwise, if armed with a pending deadline, makes sure a
    /// timer entry exists (at most one per CQ).
    fn moderate(&mut self, slot: u32, now: Instant) {
        let Some(Some(cq)) = self.cqs.get_mut(slot as usize) else {
            return;
        };
        if cq.maybe_fire(now) || cq.timer_queued || !cq.is_armed() {
            return;
        }
        if let Some(d) = cq.moder.deadline() {
            cq.timer_queued = true;
            // Room for one entry per CQ slot was reserved in `put_cq`.
            self.cq_timers.push(Reverse((d, slot)));
        }
    }

    /// An arm doorbell for CQ `slot`: completions published before the arm count toward its moderation limits.
    fn on_arm(&mut self, slot: u32, now: Instant) {
        if let Some(Some(CqSlot {
            notify: Some(n), ..
        })) = self.cqs.get(slot as usize)
        {
            // Cleared before evaluating: an arm after this point rings again (see `Shared::ring_arm`).
            n.arm_pending.store(false, Ordering::SeqCst);
            self.moderate(slot, now);
        }
    }

    /// Runs the moderation timers that are due. Returns true if any was due.
    fn run_timers(&mut self, now: Instant) -> bool {
        let mut any = false;
        while let Some(&Reverse((t, slot))) = self.cq_timers.peek() {
            if t > now {
                break;
            }
            self.cq_timers.pop();
            any = true;
            if let Some(Some(cq)) = self.cqs.get_mut(slot as usize) {
                cq.timer_queued = false;
                // Re-queues with the CQ's current deadline if it is armed and not yet due.
                self.moderate(slot, now);
            }
        }
        any
    }

    /// Earliest moderation deadline of an armed CQ (the top of the timer heap; an entry is never later than its
    /// CQ's deadline).
    fn moderation_deadline(&self) -> Option<Instant> {
        self.cq_timers.peek().map(|Reverse((t, _))| *t)
    }

    /// The doorbell queue overflowed: look at every QP ring and every armed CQ once.
    fn recover_overflow(&mut self, now: Instant) -> bool {
        let mut moved = false;
        for slot in 0..self.qps.len() as u32 {
            if let Some(Some(qp)) = self.qps.get(slot as usize) {
                qp.pending.store(false, Ordering::SeqCst);
                moved |= self.drain_qp(slot);
            }
        }
        for slot in 0..self.cqs.len() as u32 {
            self.on_arm(slot, now);
        }
        moved
    }
}

fn push_synthetic(
    cqs: &mut [Option<CqSlot>],
    pending: &mut VecDeque<u32>,
    cq: u32,
    qpn: Qpn,
    wr_id: u64,
    opcode: roce_proto::WcOpcode,
) {
    if let Some(Some(c)) = cqs.get_mut(cq as usize) {
        if !c.listed {
            c.listed = true;
            pending.push_back(cq);
        }
        c.synthetic.push_back(Wc {
            wr_id,
            status: WcStatus::LocQpOpErr,
            opcode,
            qp_num: qpn,
            ..Wc::default()
        });
    }
}

/// The loop. Returns when `shared.stop` is set.
pub(crate) fn run(mut devs: Vec<Device>, shared: Arc<Shared>, cfg: RuntimeConfig, clock: Clock) {
    if let Some(core) = cfg.pin_core {
        match core_affinity::get_core_ids().and_then(|ids| ids.get(core).copied()) {
            Some(id) if core_affinity::set_for_current(id) => {}
            _ => tracing::warn!(core, "could not pin the engine thread; running unpinned"),
        }
    }
    let stats = &shared.stats;
    let mut last_work = clock.now();
    while !shared.stop.load(Ordering::Acquire) {
        stats.loops.fetch_add(1, Ordering::Relaxed);
        let now = clock.now();
        let mut work = false;
        for dev in &mut devs {
            let engine = &mut dev.engine;
            match dev
                .link
                .rx_burst(now, cfg.rx_burst, &mut |f| engine.handle_frame(now, f))
            {
                Ok(n) => {
                    if n > 0 {
                        stats.rx_frames.fetch_add(n as u64, Ordering::Relaxed);
                        work = true;
                    }
                }
                Err(e) => {
                    stats.link_errors.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(error = %e, "rx_burst failed");
                }
            }
            if dev.engine.poll_timeout().is_some_and(|t| t <= now) {
                dev.engine.handle_timeout(now);
                work = true;
            }
        }
        while let Some(db) = shared.doorbells.pop() {
            let (d, slot) = (((db & !DB_CQ_ARM) >> 32) as usize, db as u32);
            let Some(dev) = devs.get_mut(d) else {
                continue;
            };
            if db & DB_CQ_ARM != 0 {
                dev.on_arm(slot, now);
                continue;
            }
            if let Some(Some(qp)) = dev.qps.get(slot as usize) {
                // Cleared before draining: a post after this point rings again (see `Shared::ring`).
                qp.pending.store(false, Ordering::SeqCst);
            }
            work |= dev.drain_qp(slot);
        }
        if shared.db_overflow.swap(false, Ordering::SeqCst) {
            stats.doorbell_overflows.fetch_add(1, Ordering::Relaxed);
            for dev in &mut devs {
                work |= dev.recover_overflow(now);
            }
        }
        // Control commands after the doorbells: WRs a thread posted before it issued a command (e.g. `Mr::dereg`)
        // are in the engine when the command runs.
        while let Some((d, cmd)) = shared.cmds.pop() {
            if let Some(dev) = devs.get_mut(d) {
                dev.now = now;
                cmd(dev);
            }
            work = true;
        }
        for dev in &mut devs {
            work |= dev.retry_blocked();
            let mut sent = 0;
            while sent < cfg.tx_budget {
                let buf = match dev.link.tx_buf(now) {
                    Ok(b) => b,
                    Err(roce_link::LinkError::Busy) => break,
                    Err(e) => {
                        stats.link_errors.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(error = %e, "tx_buf failed");
                        break;
                    }
                };
                // Zero copy where the link gathers: payload pieces stay in the registered memory.
                let mut segs = [roce_proto::TxSeg::EMPTY; 8];
                let Some(meta) = dev.engine.poll_transmit_gather(now, buf, &mut segs) else {
                    break;
                };
                let committed = match meta.gather {
                    None => dev.link.tx_commit(now, meta.len),
                    // SAFETY: the pieces point into MRs of this engine, which this thread alone drives: nothing
                    // writes them or deregisters an MR (those are engine calls, made only by this loop) before
                    // the `flush` below, and the link keeps no piece past that flush (`Link::tx_commit_gather`).
                    #[allow(unsafe_code)]
                    Some(g) => unsafe { dev.link.tx_commit_gather(now, g, &segs) },
                };
                if let Err(e) = committed {
                    stats.link_errors.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(error = %e, "tx_commit failed");
                }
                sent += 1;
            }
            if sent > 0 {
                stats.tx_frames.fetch_add(sent as u64, Ordering::Relaxed);
                stats.flushes.fetch_add(1, Ordering::Relaxed);
                work = true;
            }
            // Flush every iteration: a link may hold frames from an earlier Busy.
            if let Err(e) = dev.link.flush(now) {
                stats.link_errors.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(error = %e, "flush failed");
            }
            if dev.publish(now) > 0 {
                work = true;
            }
            dev.run_timers(now);
            dev.retry_deferred_dereg();
            while let Some(ev) = dev.engine.poll_async_event() {
                tracing::debug!(?ev, "async event");
            }
        }
        if work {
            last_work = now;
            continue;
        }
        let idle = now.saturating_duration_since(last_work);
        if idle < cfg.spin {
            std::hint::spin_loop();
            continue;
        }
        let mut deadline: Option<Instant> = None;
        for dev in &mut devs {
            deadline = min_instant(deadline, dev.engine.poll_timeout());
            deadline = min_instant(deadline, dev.link.poll_at());
            deadline = min_instant(deadline, dev.moderation_deadline());
        }
        let until = deadline.map_or(cfg.park_max, |d| d.saturating_duration_since(now));
        if until.is_zero() {
            continue;
        }
        if idle < cfg.yield_for {
            std::thread::yield_now();
            continue;
        }
        // Park (Dekker with `Shared::wake`): announce, fence, re-check the queues, then sleep.
        shared.parked.store(true, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        if shared.doorbells.is_empty()
            && !shared.db_overflow.load(Ordering::SeqCst)
            && shared.cmds.is_empty()
            && !shared.stop.load(Ordering::SeqCst)
        {
            stats.parks.fetch_add(1, Ordering::Relaxed);
            std::thread::park_timeout(until.min(cfg.park_max));
        }
        shared.parked.store(false, Ordering::Relaxed);
    }
}
