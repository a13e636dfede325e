//! Progress: the one bounded pass that moves a device group's engines and links (`STYLE.md` D1, D4, §10;
//! `STYLE-progress-memory.md` §2–3), and who runs it.
//!
//! # The pass ([`pass`])
//!
//! Per device of the group:
//! 1. drain the QP rings named by doorbells (`post_send` / `post_recv` into the engine; WQEs wait in the ring while
//!    the engine's SQ/RQ is full) and evaluate the CQs named by arm doorbells ([`crate::Cq::req_notify`]) — first,
//!    so that receives posted before the pass are there for the frames it receives;
//! 2. `rx_burst` (at most [`RuntimeConfig::rx_burst`] frames) → `handle_frame`; `handle_timeout(now)` when the
//!    engine's deadline has passed — always **after** receiving what the link holds: a pass that finds a timer due
//!    receives even if its kind skips receiving, and keeps receiving while bursts come back full (at most
//!    [`RX_BEFORE_TIMERS`] frames), so that an ACK or response already waiting in the link is processed before the
//!    local ACK timeout it answers can fire. A pass that runs late (its thread was descheduled, the caller stopped
//!    calling) would otherwise retransmit for nothing, and after `retry_cnt` such passes end a WR in
//!    `RETRY_EXC_ERR` although every response arrived (`docs/FINDINGS-retry.md`);
//! 3. `poll_transmit` into link transmit buffers, at most [`RuntimeConfig::tx_budget`] frames (quinn's
//!    `MAX_TRANSMIT_DATAGRAMS`: a thread that posts one WR never sends someone else's 8 MiB WRITE to the end; the
//!    rest goes out in later passes), then **one** `flush()`;
//! 4. publish completions into the per-CQ rings (never more than a ring has room for: the rest stays in the engine
//!    CQ, so no completion is lost) and fire completion-channel events (CQ moderation); retry deferred MR
//!    deregistrations.
//!
//! A post's pass skips the receive burst (the poll that follows receives); a poll's pass that publishes completions,
//! and a receive post's pass, skip step 3 (for at most [`TX_DEFER_MAX`]), so that the ACK of what was just
//! received leaves with the application's reply in one `sendmmsg` ([`PassKind`]). Every other pass is full.
//!
//! # Doorbell batching
//!
//! Posts that arrive while another thread's pass holds the progress lock are served by one pass after it (`missed`),
//! so their frames leave in one `flush` (one `sendmmsg`). A thread that posts in a loop would still pay one I/O call
//! per post, so a post's pass holds its frames back when the post is part of a stream, and the pass that closes the
//! batch sends them together (the engine's adaptive batching window, `roce_proto::sched::batch`,
//! `docs/SCHEDULER.md`, `docs/spec/DCQCN.md §10`):
//!
//! * **stream**: every doorbell the pass found is of a QP whose previous doorbell came less than the window `W`
//!   before. `W` = [`Engine::batch_window`] (a quarter of the measured SRTT: the span the engine gives one batch on
//!   the wire, so batching never hides an ACK or a CNP from the peer for longer — §10), at most [`TX_DEFER_MAX`].
//!   It adapts to the load twice over: the doorbell rate decides whether posts batch at all, the RTT how long.
//! * **idle**: a doorbell of a QP not rung within `W` — a post on an idle QP, a latency test's request — transmits
//!   at once, with everything held back for other QPs.
//! * the batch closes (the pass transmits) when it is `W` old, or holds [`Engine::tx_burst`] send WQEs (the engine's
//!   frames per I/O call, at most [`RuntimeConfig::tx_budget`]), or any non-post pass runs (a poll, an event wait,
//!   a control verb); a post or poll after the window has passed transmits it. If the application stops calling
//!   altogether, the auto-progress thread sends it after [`RuntimeConfig::auto_progress`], as it does an ACK a poll
//!   pass left for the reply.
//!
//! [`RuntimeStats`] counts doorbells, WQEs, held-back posts (`batched_posts`) and the I/O calls on both sides
//! (`flushes`, `rx_bursts`) with their frames; `rocev2 stat` shows WQEs per doorbell and packets per I/O call.
//!
//! # Who runs it ([`ProgressMode`])
//!
//! The engines and links sit behind one progress lock per device group ([`ProgressLock`]: `try_lock`, and a
//! `missed` flag so that a thread that finds it held hands its work to the holder instead of waiting).
//!
//! * [`ProgressMode::Caller`] (default, run-to-completion): `post_send`/`post_recv` run a pass in the posting thread
//!   (an idle QP's packets are built and sent before the call returns); [`crate::Cq::poll`] on an empty ring runs a
//!   pass in the polling thread (receive, process, complete); [`crate::CompChannel::get_event`] drives passes while
//!   it waits. A poller whose polls have found nothing for [`RuntimeConfig::spin`] yields the core after each
//!   further empty poll ([`Shared::poll_idle`], the progress thread's back-off): on a host with more runnable
//!   threads than cores, the thread it waits for (the peer of a ping-pong on this host, a preempted holder of the
//!   progress lock) then runs at once instead of after the scheduler preempts the spinning poller (a slice, ~1 ms
//!   per message of a latency test). For programs that stop calling (a pure RDMA WRITE target, a process blocked elsewhere) an
//!   **auto-progress** thread takes over after [`RuntimeConfig::auto_progress`] without any caller pass, and steps
//!   back as soon as callers drive again. While callers are busy it costs about two wake-ups per `auto_progress`
//!   period (1000/s at the 1 ms default) if they receive themselves, and a wake-up and a pass per frame nobody
//!   receives (below); nothing on the data path. A program that stops calling altogether has its first frame
//!   waiting up to that period (far below any RC ACK timeout), after which the thread keeps it moving like the
//!   Thread mode.
//!
//!   **Frames nobody receives.** While callers are active the auto-progress thread does not just sleep out the
//!   period: it blocks in `ppoll` on the links' receive descriptors (as an idle driver does). When a frame waits
//!   and no caller has run a receiving pass (a poll, an event wait) for [`AUTO_RX_LIVE`] — or for
//!   [`AUTO_RX_POLLING`] while a caller is in a polling loop (its last poll found its CQ empty) — nobody is going
//!   to take it soon — a program that posts and then spins on memory for the peer's RDMA WRITE (perftest's
//!   `ib_write_lat`), whose only passes are its posts' (which do not receive) — so the thread runs a pass at once
//!   ([`RuntimeStats::auto_rx_passes`]): the WRITE lands in microseconds, not after `auto_progress`. A caller that
//!   polls takes its frames itself; the thread then stays away at least [`AUTO_RX_LIVE`] before it looks again (the
//!   wait is level-triggered and the frame may still be queued), and the longer callers keep receiving, the longer
//!   it stays away (doubling up to `auto_progress`): a busy poller (`ib_send_lat`) costs it about two wake-ups per
//!   period and no pass. A caller blocked in an event wait ([`crate::CompChannel::get_event`]) wakes for the frame
//!   itself, so the thread leaves it to it too; a program that sleeps in `ibv_get_cq_event` for longer than
//!   `auto_progress` is not an active caller: the thread blocks as below.
//! * [`ProgressMode::Thread`]: a progress thread keeps every QP moving (the former engine-thread runtime): posts
//!   ring a doorbell and wake it if it is parked ([`SleepFlag`]); polls read the CQ ring only.
//!
//! Control verbs (create/modify/destroy, `reg_mr`, counters) take the progress lock (blocking), act, and run one
//! pass, in the calling thread, in both modes.
//!
//! # Idle
//!
//! A thread that drives passes in a loop and finds nothing to do ([`idle_step`]: the progress / auto-progress thread,
//! a [`CompChannel::get_event`] waiter) busy-polls for [`RuntimeConfig::spin`] (so a busy run pays no system call
//! beyond its passes), then **blocks until there is work**: in `ppoll(2)` on every link's receive descriptor
//! ([`Link::wait_fd`], published by each pass) and its own eventfd (`roce_link::wait::Waiter`: rung by doorbells in
//! Thread mode, hand-offs, the shutdown, and completion events for a channel waiter), with the group's next deadline
//! (engine timers, link releases, CQ moderation) as the timeout, at most [`RuntimeConfig::park_max`]. A frame wakes
//! it as soon as the kernel queues it (on a busy CPU, as soon as the scheduler gives its group the CPU), where a
//! timed sleep would wake only at its end and a `sched_yield` loop burns the CPU it waits on (BENCHMARKS.md, "Real
//! wire"). The [`SleepFlag`] handshake (loom-checked) makes sure a post
//! that comes just before the block still wakes it. `park_max` still bounds each wait, for work no descriptor
//! announces: a timer set by another thread's pass meanwhile, CQ ring room a Thread-mode poller made. Counted in
//! [`RuntimeStats::readiness_waits`] / [`RuntimeStats::readiness_wakeups`].
//!
//! If some link has no descriptor now (the simulated link; a UDP link with frames queued after back-pressure), the
//! driver falls back to polling: yield until [`RuntimeConfig::yield_for`], then sleep at most `park_max` at a time
//! ([`RuntimeStats::parks`]). [`crate::Cq::poll`] never blocks (`ibv_poll_cq` is non-blocking): where a driver would
//! block, an empty poll yields its core instead.
//!
//! # Per-packet cost
//!
//! Nothing here allocates, locks (besides the progress lock once per pass) or scans all QPs/CQs per packet or per
//! post (`docs/ARCHITECTURE.md`):
//!
//! * **Doorbells** go through one fixed-capacity lock-free MPMC queue (`crossbeam_queue::ArrayQueue`, allocated once
//!   when the group opens). Each QP has a "doorbell pending" flag and each CQ an "arm pending" flag; an entry is
//!   pushed only when the flag goes from clear to set, and the pass clears the flag before acting on the entry, so
//!   a QP or CQ has at most one entry queued and the queue is sized for every QP and CQ the devices allow (twice
//!   over: destroyed objects may leave a stale entry that is consumed on the next pass). Should a push still fail
//!   (pathological create/destroy churn), the producer sets an overflow flag and the next pass looks at every QP and
//!   CQ once — correct, and only on that path.
//! * **Completions**: the engine lists the CQs that gained completions ([`Engine::poll_ready_cq`], each once); a CQ
//!   whose ring was full (or that has runtime-made completions waiting) goes on a short pending list, retried on
//!   every pass until drained. Runner CQ slots are indexed by the engine's CQ index, so no lookup is needed.
//! * **Moderation timers** of armed CQs live in a binary heap (at most one entry per CQ, capacity reserved at
//!   `create_cq`); the idle path looks only at its top.
//! * **Events** ([`CompChannel`]): firing one takes the channel's mutex, pushes into a queue whose capacity was
//!   reserved when the CQ was attached (no allocation), and signals the condition variable — at most one event per
//!   `req_notify` (events are one-shot), never per packet or per completion.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::os::fd::RawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::atomic::{AtomicI32, AtomicU32, AtomicUsize};
use std::time::Duration;

use crossbeam_queue::ArrayQueue;
use roce_link::{Link, MAX_WAIT_FDS, Waiter, Woken, min_instant};
use roce_proto::{CqHandle, Engine, Instant, Qpn, Wc, WcStatus};

use crate::channel::{CompChannel, Moderation, ModerationState};
use crate::clock::Clock;
use crate::endpoint::StatsEndpoint;
use crate::progress::{Outcome, ProgressLock, SleepFlag};
use crate::wqe::{MAX_SGE, RecvWqe, SendWqe, WqeConsumer};

/// Who drives the engines (module docs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ProgressMode {
    /// Run-to-completion: posts, polls and event waits run passes in the calling thread; an auto-progress thread
    /// covers programs that stop calling ([`RuntimeConfig::auto_progress`]).
    #[default]
    Caller,
    /// A progress thread keeps every QP moving; posts and polls only touch the rings.
    Thread,
}

impl std::str::FromStr for ProgressMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "caller" => Ok(ProgressMode::Caller),
            "thread" => Ok(ProgressMode::Thread),
            _ => Err(format!("unknown progress mode {s:?} (caller or thread)")),
        }
    }
}

/// Tuning of progress.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuntimeConfig {
    /// Who drives the engines.
    pub progress: ProgressMode,
    /// [`ProgressMode::Caller`]: the auto-progress thread starts driving after this long without a caller pass
    /// (`None`: no such thread; the application must call often enough itself, e.g. by polling).
    pub auto_progress: Option<Duration>,
    /// Pin the progress / auto-progress thread to this core (index into `core_affinity::get_core_ids()`).
    pub pin_core: Option<usize>,
    /// Frames taken from each link per pass.
    pub rx_burst: usize,
    /// Frames produced per device per pass before `flush()` (doorbell batching, and the bound on what one caller's
    /// pass transmits).
    pub tx_budget: usize,
    /// Passes one call runs at most while other threads keep flagging `missed` (see `src/progress.rs`).
    pub max_rounds: u32,
    /// Idle time the progress thread (and a waiting [`CompChannel::get_event`]) spends busy-polling before it blocks
    /// on the links' readiness (or, on links without a descriptor, before yielding).
    pub spin: Duration,
    /// Links without a receive descriptor ([`Link::wait_fd`] `None`: the simulated link): idle time (from the last
    /// useful pass) after which a driver sleeps instead of yielding. Unused while every link has one (module docs,
    /// "Idle").
    pub yield_for: Duration,
    /// Longest single sleep or readiness wait. A readiness wait ends at once when a frame arrives; the bound is for
    /// work no descriptor announces (a timer another thread's pass set meanwhile, CQ ring room a poller made).
    pub park_max: Duration,
    /// Where the runtime's stats endpoint listens (what `rocev2 stat` reads; see the `endpoint` module docs).
    pub stats_endpoint: StatsEndpoint,
}

impl Default for RuntimeConfig {
    /// Caller mode with auto-progress after 1 ms, no pinning, bursts of 32 frames, 4 rounds, spin 20 µs, yield up
    /// to 2 ms idle, then sleep at most 1 ms at a time; the stats endpoint in the run directory.
    fn default() -> Self {
        RuntimeConfig {
            progress: ProgressMode::Caller,
            auto_progress: Some(Duration::from_millis(1)),
            pin_core: None,
            rx_burst: 32,
            tx_budget: 32,
            max_rounds: 4,
            spin: Duration::from_micros(20),
            yield_for: Duration::from_millis(2),
            park_max: Duration::from_millis(1),
            stats_endpoint: StatsEndpoint::RunDir,
        }
    }
}

impl RuntimeConfig {
    /// The default configuration in `mode`.
    pub fn with_mode(mode: ProgressMode) -> RuntimeConfig {
        RuntimeConfig {
            progress: mode,
            ..RuntimeConfig::default()
        }
    }
}

/// Counters of the runtime itself (not the protocol), shared by every device of a group.
#[derive(Debug, Default)]
pub struct RuntimeStats {
    /// Passes run by application threads (posts, polls, event waits, control verbs).
    pub caller_passes: AtomicU64,
    /// Passes run by the progress / auto-progress thread.
    pub thread_passes: AtomicU64,
    /// Times an application thread found the progress lock held and handed its work to the holder (`missed`).
    pub missed: AtomicU64,
    /// Times the progress thread found the progress lock held.
    pub thread_missed: AtomicU64,
    /// Times the progress thread slept without a link to wait on (links without a receive descriptor).
    pub parks: AtomicU64,
    /// Wake-ups (eventfd rings) issued by application doorbells to a sleeping progress thread (Thread mode).
    pub wakeups: AtomicU64,
    /// Times an idle driver (the progress / auto-progress thread, a [`CompChannel::get_event`] waiter) blocked in
    /// `ppoll` on the links' receive descriptors and its eventfd, up to the next deadline (module docs, "Idle").
    pub readiness_waits: AtomicU64,
    /// Readiness waits that ended because a link became readable (a frame arrived), rather than a ring or the
    /// timeout.
    pub readiness_wakeups: AtomicU64,
    /// Caller mode: passes the auto-progress thread ran while callers were active because a frame waited in a link
    /// and no caller was receiving (a program spinning on memory for a peer's RDMA WRITE; module docs, "Frames
    /// nobody receives").
    pub auto_rx_passes: AtomicU64,
    /// Doorbells rung (one per posted chain).
    pub doorbells: AtomicU64,
    /// Work requests posted (send and receive), counted with their doorbell: `wqes / doorbells` is the average
    /// chain length.
    pub wqes: AtomicU64,
    /// Transmit I/O calls: `flush()` calls that followed at least one frame (on `UdpLink` one `sendmmsg` per
    /// source-port socket with frames queued, i.e. per QP); `tx_frames / flushes` is packets per transmit call.
    pub flushes: AtomicU64,
    /// Frames transmitted.
    pub tx_frames: AtomicU64,
    /// Receive I/O calls: `rx_burst()` calls that returned at least one frame (on `UdpLink` one `recvmmsg`);
    /// `rx_frames / rx_bursts` is packets per receive call.
    pub rx_bursts: AtomicU64,
    /// Frames received.
    pub rx_frames: AtomicU64,
    /// Post passes that left transmitting to a later pass, to send their work in one I/O call with the posts that
    /// follow (doorbell batching, module docs).
    pub batched_posts: AtomicU64,
    /// Caller mode: empty polls that yielded the core after polls of their CQ had found nothing for
    /// [`RuntimeConfig::spin`] ([`crate::Cq::poll`]).
    pub poll_yields: AtomicU64,
    /// Link errors (other than back-pressure) seen by passes.
    pub link_errors: AtomicU64,
    /// Times the doorbell queue was found full and a pass looked at every QP and CQ once instead (expected 0; see
    /// the module docs).
    pub doorbell_overflows: AtomicU64,
    /// The longest time (µs) between the starts of two consecutive passes while a device of the group had work
    /// outstanding at the end of the first: an engine timer armed (requests waiting for their ACK timeout; rate and
    /// CNP timers count too), frames left for a later pass (the transmit budget was used up, a receive burst came
    /// back full, or transmitting was deferred). One pass serves every device of the group, so this is each
    /// device's value. A value near or above the local ACK
    /// timeout (4.096 µs · 2^timeout, 67 ms by default) means the engine was not run for that long — a stalled
    /// progress thread or a caller that stopped calling — and timeouts in that stretch may be spurious.
    pub max_pass_gap_us: AtomicU64,
}

impl RuntimeStats {
    /// Every counter by its field name, in declaration order (each read `Relaxed`, so not one instant): what the
    /// stats endpoint and `rocev2 perf --stats` list. A field added to the struct must be added here (the
    /// destructuring below is exhaustive, so the build says so).
    pub fn counters(&self) -> [(&'static str, u64); 20] {
        let RuntimeStats {
            caller_passes,
            thread_passes,
            missed,
            thread_missed,
            parks,
            wakeups,
            readiness_waits,
            readiness_wakeups,
            auto_rx_passes,
            doorbells,
            wqes,
            flushes,
            tx_frames,
            rx_bursts,
            rx_frames,
            batched_posts,
            poll_yields,
            link_errors,
            doorbell_overflows,
            max_pass_gap_us,
        } = self;
        let ld = |a: &AtomicU64| a.load(Ordering::Relaxed);
        [
            ("caller_passes", ld(caller_passes)),
            ("thread_passes", ld(thread_passes)),
            ("missed", ld(missed)),
            ("thread_missed", ld(thread_missed)),
            ("parks", ld(parks)),
            ("wakeups", ld(wakeups)),
            ("readiness_waits", ld(readiness_waits)),
            ("readiness_wakeups", ld(readiness_wakeups)),
            ("auto_rx_passes", ld(auto_rx_passes)),
            ("doorbells", ld(doorbells)),
            ("wqes", ld(wqes)),
            ("flushes", ld(flushes)),
            ("tx_frames", ld(tx_frames)),
            ("rx_bursts", ld(rx_bursts)),
            ("rx_frames", ld(rx_frames)),
            ("batched_posts", ld(batched_posts)),
            ("poll_yields", ld(poll_yields)),
            ("link_errors", ld(link_errors)),
            ("doorbell_overflows", ld(doorbell_overflows)),
            ("max_pass_gap_us", ld(max_pass_gap_us)),
        ]
    }
}

/// What a pass is for; a post and a poll skip what they do not need (module docs, "The pass").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PassKind {
    /// Everything (progress thread, auto-progress, event waits, control verbs, [`crate::Context::progress`]).
    Full,
    /// After a send post: no receive burst (the next poll receives); transmit the posted work now, unless the post
    /// is part of a stream (module docs, "Doorbell batching").
    Post,
    /// After a receive post: hand the receives to the engine; no receive burst, and transmitting is left to a later
    /// pass like [`PassKind::Poll`] does (an application that reposts a receive and then replies sends the pending
    /// ACK with the reply).
    Recv,
    /// An empty poll: receive and complete; if that published completions, leave transmitting (e.g. the ACK of the
    /// message just received) to a later pass — usually the application's reply post, so ACK and reply share one
    /// `sendmmsg` — for at most [`TX_DEFER_MAX`].
    Poll,
}

/// Most frames one pass receives before it fires an engine timer that is due, while bursts come back full (module
/// docs, "The pass"): 256 bursts of the default 32, twice what a 16 MiB receive buffer (`rocev2 perf`'s largest) holds
/// of 4 KiB frames. Bounded so that a flood that never lets the queue empty delays a timer by one long pass, not
/// forever.
pub(crate) const RX_BEFORE_TIMERS: usize = 8192;

/// How long poll passes may leave transmitting to a later pass (an ACK waits at most this plus one application
/// call: far below any RC ACK timeout, 4.096 µs · 2^timeout).
pub(crate) const TX_DEFER_MAX: Duration = Duration::from_micros(50);

/// [`CqInner`](crate::Cq)'s idle clock while polls find completions or work ([`Shared::poll_idle`]).
pub(crate) const NOT_IDLE: u64 = u64::MAX;

/// Doorbell entry kind bit: the entry names a CQ that was armed (else a QP with new ring entries).
const DB_CQ_ARM: u64 = 1 << 63;

/// Caller mode: a frame waiting in a link is left to the callers if one of them ran a receiving pass (a poll, an
/// event wait) less than this long before; otherwise the auto-progress thread receives it at once (module docs,
/// "Frames nobody receives"). A polling caller's passes come a few µs apart (one `recvmmsg` and a poll of the
/// engine), so 10 µs tells a poller from a program that has stopped polling.
pub(crate) const AUTO_RX_LIVE: Duration = Duration::from_micros(10);

/// Caller mode: as [`AUTO_RX_LIVE`] while a caller is in a polling loop (its last poll found its CQ empty): such a
/// caller polls again, but yields the core between empty polls ([`Shared::poll_idle`]), so on a busy host its
/// receiving passes can be this far apart; only beyond it does the auto-progress thread take the frame.
pub(crate) const AUTO_RX_POLLING: Duration = Duration::from_micros(200);

/// Largest doorbell queue (16 bytes per entry: 4 MiB), for configurations with very large `max_qp`/`max_cq`.
const MAX_DOORBELLS: usize = 1 << 18;

/// The devices of a group: what the progress lock protects.
pub(crate) struct Group {
    pub(crate) devs: Vec<Device>,
}

/// State shared by every handle of a device group and its progress thread.
pub(crate) struct Shared {
    /// QPs with newly posted work and CQs newly armed: `kind | (device << 32) | slot` (see the module docs).
    doorbells: ArrayQueue<u64>,
    /// A doorbell push found the queue full: the next pass must look at every QP and CQ once.
    db_overflow: AtomicBool,
    /// The engines and links.
    pub(crate) group: ProgressLock<Group>,
    sleep: SleepFlag,
    pub(crate) stop: AtomicBool,
    /// What the progress thread blocks on when idle, and what wakes it (doorbells, hand-offs, shutdown); `None` for a
    /// group without a thread.
    waiter: Option<Waiter>,
    /// The links' receive descriptors as of the last pass ([`ReadyFds`]).
    ready: ReadyFds,
    pub(crate) cfg: RuntimeConfig,
    pub(crate) clock: Clock,
    /// Engine time (ns) of the last pass an application thread asked for (auto-progress watches it).
    last_caller: AtomicU64,
    /// Engine time (ns) of the last pass an application thread asked for that receives (a poll's, an event wait's,
    /// a control verb's; not a post's): auto-progress leaves a waiting frame to callers only while they receive.
    last_caller_rx: AtomicU64,
    /// The last [`crate::Cq::poll`] of an application thread found the CQ empty: it is in a polling loop and will
    /// poll (and receive) again; a poll that returns completions clears it (the program goes on to something else,
    /// maybe spinning on memory).
    caller_polling: AtomicBool,
    /// Application threads blocked in a readiness wait on this group's links ([`crate::CompChannel::get_event`]):
    /// they wake for a frame themselves.
    caller_waiters: AtomicUsize,
    /// A holder stopped at `max_rounds` with `missed` still set: the progress thread must run a pass even while
    /// callers are active (Caller mode's auto-progress otherwise stays out of their way).
    handoff: AtomicBool,
    /// Engine time (ns) of the group's next deadline (engine timers, link arrivals, moderation), as of the last
    /// pass; `u64::MAX` = none. Lets the progress thread size its sleep without the lock.
    next_deadline: AtomicU64,
    pub(crate) stats: RuntimeStats,
    /// The process that created the group. A `fork`ed child inherits this memory but not the threads: a lock one of
    /// them held at the fork stays held for ever in the child, and the progress thread is not there to join. So the
    /// child's control verbs on the parent's objects answer `None` (`EngineGone`) without touching the lock, and its
    /// last reference leaves the group alone (rdma-core: a child may not use its parent's verbs resources,
    /// ibv_fork_init(3)).
    pub(crate) owner_pid: u32,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("doorbells", &self.doorbells.len())
            .field("mode", &self.cfg.progress)
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl Shared {
    /// `max_objects`: QPs + CQs all devices of the group allow (the doorbell queue holds twice that, at least 64
    /// and at most [`MAX_DOORBELLS`] entries; beyond that the overflow path keeps it correct).
    ///
    /// Errors: creating the progress thread's eventfd failed.
    pub(crate) fn new(
        devs: Vec<Device>,
        max_objects: usize,
        cfg: RuntimeConfig,
    ) -> std::io::Result<Shared> {
        let thread = cfg.progress == ProgressMode::Thread || cfg.auto_progress.is_some();
        let waiter = if thread { Some(Waiter::new()?) } else { None };
        Ok(Shared {
            doorbells: ArrayQueue::new(max_objects.saturating_mul(2).clamp(64, MAX_DOORBELLS)),
            db_overflow: AtomicBool::new(false),
            group: ProgressLock::new(Group { devs }),
            sleep: SleepFlag::default(),
            stop: AtomicBool::new(false),
            waiter,
            ready: ReadyFds::default(),
            cfg,
            clock: Clock::new(),
            last_caller: AtomicU64::new(0),
            last_caller_rx: AtomicU64::new(0),
            caller_polling: AtomicBool::new(false),
            owner_pid: std::process::id(),
            caller_waiters: AtomicUsize::new(0),
            handoff: AtomicBool::new(false),
            next_deadline: AtomicU64::new(u64::MAX),
            stats: RuntimeStats::default(),
        })
    }

    pub(crate) fn mode(&self) -> ProgressMode {
        self.cfg.progress
    }

    /// True if a progress thread exists for this group.
    pub(crate) fn wants_thread(&self) -> bool {
        self.cfg.progress == ProgressMode::Thread || self.cfg.auto_progress.is_some()
    }

    /// Rings the progress thread's waiter: it returns from its sleep or readiness wait, or does not enter the next.
    fn ring_thread(&self) {
        if let Some(w) = &self.waiter {
            w.wake();
        }
    }

    /// Wakes the progress thread if (and only if) it sleeps (Thread mode; [`SleepFlag`]).
    fn wake(&self) {
        if self.sleep.must_wake() {
            self.stats.wakeups.fetch_add(1, Ordering::Relaxed);
            self.ring_thread();
        }
    }

    /// The progress thread's sleeps: blocks on its waiter (and on `fds`, the links' receive descriptors, if any)
    /// for at most `d`. Returns what ended it.
    fn thread_wait(&self, fds: &[RawFd], d: Duration) -> Woken {
        match &self.waiter {
            Some(w) => w.wait(fds, d).unwrap_or_else(|e| {
                tracing::warn!(error = %e, "readiness wait failed; sleeping instead");
                std::thread::sleep(d);
                Woken::default()
            }),
            None => {
                std::thread::sleep(d);
                Woken::default()
            }
        }
    }

    /// The links' receive descriptors as of the last pass (into `out`), or `None` if some link has none now (then
    /// idle drivers poll).
    pub(crate) fn ready_fds(&self, out: &mut [RawFd]) -> Option<usize> {
        self.ready.load(out)
    }

    /// The doorbell: announces that QP `slot` of device `dev` has `wqes` new ring entries. In Thread mode it also
    /// wakes the progress thread; in Caller mode the caller runs a pass next ([`progress`](Self::progress)).
    pub(crate) fn ring(&self, dev: usize, slot: u32, pending: &AtomicBool, wqes: usize) {
        self.stats.doorbells.fetch_add(1, Ordering::Relaxed);
        self.stats.wqes.fetch_add(wqes as u64, Ordering::Relaxed);
        // Only one doorbell entry per QP is outstanding: a pass clears `pending` (SeqCst) before it drains the
        // ring, so a push made after its drain started sets the flag again and enqueues the QP again.
        if !pending.swap(true, Ordering::SeqCst) {
            self.push_doorbell(((dev as u64) << 32) | u64::from(slot));
        }
        if self.mode() == ProgressMode::Thread {
            self.wake();
        }
    }

    /// The arm doorbell: CQ `slot` of device `dev` was armed (`req_notify`); the next pass re-evaluates its
    /// moderation (completions published before the arm count). `arm_pending` plays the role of the QP's `pending`.
    pub(crate) fn ring_arm(&self, dev: usize, slot: u32, arm_pending: &AtomicBool) {
        if !arm_pending.swap(true, Ordering::SeqCst) {
            self.push_doorbell(DB_CQ_ARM | ((dev as u64) << 32) | u64::from(slot));
        }
        match self.mode() {
            ProgressMode::Thread => self.wake(),
            ProgressMode::Caller => {
                self.progress();
            }
        }
    }

    fn push_doorbell(&self, db: u64) {
        if self.doorbells.push(db).is_err() {
            // Only under heavy create/destroy churn (see the module docs): the next pass scans once.
            self.db_overflow.store(true, Ordering::SeqCst);
        }
    }

    /// Work a parked progress thread must not sleep through.
    fn has_work(&self) -> bool {
        !self.doorbells.is_empty()
            || self.db_overflow.load(Ordering::SeqCst)
            || self.group.missed()
            || self.stop.load(Ordering::SeqCst)
    }

    /// A full pass in an application thread (event waits, [`crate::Context::progress`]): runs it now if the
    /// progress lock is free, else hands it to the holder. Returns true if this call ran a pass that did something.
    pub(crate) fn progress(&self) -> bool {
        self.progress_for(PassKind::Full).0
    }

    /// [`progress`](Self::progress) with a pass of `kind` (posts, polls). Only this call's first pass has that kind;
    /// passes it runs for other threads (`missed`) are full ones. Returns (did something, handed over to the holder).
    pub(crate) fn progress_for(&self, kind: PassKind) -> (bool, bool) {
        let now = self.clock.now();
        self.last_caller.store(now.as_nanos(), Ordering::Relaxed);
        if matches!(kind, PassKind::Full | PassKind::Poll) {
            self.last_caller_rx.store(now.as_nanos(), Ordering::Relaxed);
        }
        let mut work = false;
        let mut k = kind;
        let o = self.group.try_progress(self.cfg.max_rounds, |g| {
            work |= pass(self, g, k);
            k = PassKind::Full;
        });
        self.account(o, true);
        (work, o.passes == 0)
    }

    /// Caller mode: what a [`crate::Cq::poll`] returns (`got`: completions) — whether the caller stays in its
    /// polling loop ([`Shared::caller_polling`]). Written only when it changes.
    pub(crate) fn note_poll(&self, got: bool) {
        if self.caller_polling.load(Ordering::Relaxed) == got {
            self.caller_polling.store(!got, Ordering::Relaxed);
        }
    }

    /// An application thread starts (`true`) or ends (`false`) a readiness wait on this group's links
    /// ([`crate::CompChannel::get_event`]): while one waits, the auto-progress thread leaves frames to it.
    pub(crate) fn caller_waits(&self, waiting: bool) {
        if waiting {
            self.caller_waiters.fetch_add(1, Ordering::SeqCst);
        } else {
            self.caller_waiters.fetch_sub(1, Ordering::SeqCst);
        }
    }

    fn account(&self, o: Outcome, caller: bool) {
        let (c, m) = if caller {
            (&self.stats.caller_passes, &self.stats.missed)
        } else {
            (&self.stats.thread_passes, &self.stats.thread_missed)
        };
        if o.passes == 0 {
            m.fetch_add(1, Ordering::Relaxed);
        } else {
            c.fetch_add(u64::from(o.passes), Ordering::Relaxed);
        }
        if o.left_missed {
            // This thread has done its share; the progress thread serves the rest.
            self.handoff.store(true, Ordering::SeqCst);
            self.ring_thread();
        }
    }

    /// Caller mode, after a poll of a CQ whose idle clock is `idle_since` (engine ns, [`NOT_IDLE`]): `busy` = the
    /// poll returned completions or its pass did something, which restarts the clock. Otherwise returns true if
    /// the poller should yield the core: the CQ has been idle for [`RuntimeConfig::spin`] and no engine or link
    /// deadline is due ([`idle_step`], the progress thread's back-off, whose sleep a poll turns into a yield: `poll`
    /// never blocks). Counts the yields (`poll_yields`).
    pub(crate) fn poll_idle(&self, idle_since: &AtomicU64, busy: bool) -> bool {
        if busy {
            if idle_since.load(Ordering::Relaxed) != NOT_IDLE {
                idle_since.store(NOT_IDLE, Ordering::Relaxed);
            }
            return false;
        }
        let now = self.clock.now();
        let since = idle_since.load(Ordering::Relaxed);
        if since == NOT_IDLE {
            idle_since.store(now.as_nanos(), Ordering::Relaxed);
        }
        let idle = now.saturating_duration_since(Instant::from_nanos(since.min(now.as_nanos())));
        // A poll never blocks (`ibv_poll_cq`): where the progress thread would sleep or wait, it yields.
        if matches!(idle_step(self, now, idle, false), Idle::Spin) {
            return false;
        }
        self.stats.poll_yields.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// A control verb: takes the progress lock (blocking), runs `f` on device `dev`, then a pass.
    /// `None` in a `fork`ed child ([`Shared::owner_pid`]) or for an unknown `dev`.
    pub(crate) fn control<R>(&self, dev: usize, f: impl FnOnce(&mut Device) -> R) -> Option<R> {
        if !self.owned_here() {
            return None;
        }
        let now = self.clock.now();
        let (r, o) = self.group.with(
            self.cfg.max_rounds,
            |g| {
                // Transmit what poll passes left for later (an ACK) before the verb: destroying the QP, or a
                // program ending after its last completion, must not swallow it.
                if g.devs.iter().any(|d| d.tx_deferred.is_some()) {
                    pass(self, g, PassKind::Full);
                }
                g.devs.get_mut(dev).map(|d| {
                    d.now = now;
                    f(d)
                })
            },
            |g| {
                pass(self, g, PassKind::Full);
            },
        );
        self.account(o, true);
        r
    }

    /// Whether this process created the group (false in a `fork`ed child: [`Shared::owner_pid`]).
    pub(crate) fn owned_here(&self) -> bool {
        std::process::id() == self.owner_pid
    }

    /// Asks the progress thread to stop and wakes it.
    pub(crate) fn shutdown(&self) {
        self.stop.store(true, Ordering::SeqCst);
        self.ring_thread();
    }

    /// Sleep bound for an idle driver: time to the group's next deadline (at most `park_max`).
    pub(crate) fn idle_sleep(&self, now: Instant) -> Duration {
        let d = self.next_deadline.load(Ordering::Relaxed);
        let until = if d == u64::MAX {
            self.cfg.park_max
        } else {
            Instant::from_nanos(d).saturating_duration_since(now)
        };
        until.min(self.cfg.park_max)
    }
}

/// The receive descriptors of a group's links ([`Link::wait_fd`]), published by every pass (under the progress lock)
/// and read without it by idle drivers: the descriptors a link names do not change while it lives, only whether it
/// names one (a queued transmit frame makes it say `None` for a while), so a reader that races a pass sees either
/// answer, both true of some moment.
struct ReadyFds {
    fds: [AtomicI32; MAX_WAIT_FDS],
    /// How many of `fds` are valid; [`ReadyFds::NONE`]: some link has no descriptor now (or there are more links
    /// than one wait takes).
    n: AtomicUsize,
}

impl Default for ReadyFds {
    fn default() -> Self {
        ReadyFds {
            fds: std::array::from_fn(|_| AtomicI32::new(-1)),
            n: AtomicUsize::new(ReadyFds::NONE),
        }
    }
}

impl ReadyFds {
    const NONE: usize = usize::MAX;

    /// A pass: records what the links say now (a virtual call and a store per device; no allocation).
    fn publish(&self, devs: &[Device]) {
        let mut n = devs.len();
        for (i, d) in devs.iter().enumerate() {
            match (d.link.wait_fd(), self.fds.get(i)) {
                (Some(fd), Some(slot)) => {
                    if slot.load(Ordering::Relaxed) != fd {
                        slot.store(fd, Ordering::Relaxed);
                    }
                }
                _ => {
                    n = Self::NONE;
                    break;
                }
            }
        }
        if self.n.load(Ordering::Relaxed) != n {
            self.n.store(n, Ordering::Release);
        }
    }

    /// Copies the descriptors into `out`; `None` if some link has none (or `out` is too short).
    fn load(&self, out: &mut [RawFd]) -> Option<usize> {
        let n = self.n.load(Ordering::Acquire);
        if n == Self::NONE || n > out.len() {
            return None;
        }
        for (o, f) in out.iter_mut().zip(&self.fds[..n]) {
            *o = f.load(Ordering::Relaxed);
        }
        Some(n)
    }
}

/// The WRs outstanding on a QP's send and receive queue: posted (in the runtime's ring or in the engine) and not
/// yet retired by the engine. A post adds its WRs and is refused (`QueueFull`, `ENOMEM`) when the sum would pass
/// the granted `max_send_wr` / `max_recv_wr`, as a hardware queue of that depth is full (rxe's provider: its
/// shared queue's producer meets the consumer; IBTA §11.4.1.1: a post beyond the queue's depth fails). The pass
/// gives slots back ([`QpSlot::release`]) before it publishes the completion that retires them, so a slot is free
/// no later than the application can poll its completion.
#[derive(Debug, Default)]
pub(crate) struct WrCredits {
    pub(crate) sq: AtomicU32,
    pub(crate) rq: AtomicU32,
}

/// Engine-side state of one QP.
pub(crate) struct QpSlot {
    pub(crate) qpn: Qpn,
    pub(crate) sq: WqeConsumer<SendWqe>,
    pub(crate) rq: WqeConsumer<RecvWqe>,
    pub(crate) pending: Arc<AtomicBool>,
    pub(crate) send_cq: u32,
    pub(crate) recv_cq: u32,
    pub(crate) max_send_wr: u32,
    pub(crate) max_recv_wr: u32,
    /// Outstanding WRs, shared with the posting side ([`WrCredits`]).
    credits: Arc<WrCredits>,
    /// Send / receive WRs moved from the rings into the engine (refused ones included), and how many of those
    /// have been given back to [`Self::credits`].
    sq_moved: u64,
    sq_released: u64,
    rq_moved: u64,
    rq_released: u64,
    /// Already waiting in `Device::blocked`.
    blocked: bool,
    /// When a pass last moved send WQEs of this QP into the engine (doorbell batching: send work again within the
    /// batching window means the QP is streaming posts).
    last_send: Instant,
}

impl QpSlot {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        qpn: Qpn,
        sq: WqeConsumer<SendWqe>,
        rq: WqeConsumer<RecvWqe>,
        pending: Arc<AtomicBool>,
        send_cq: u32,
        recv_cq: u32,
        max_send_wr: u32,
        max_recv_wr: u32,
        credits: Arc<WrCredits>,
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
            credits,
            sq_moved: 0,
            sq_released: 0,
            rq_moved: 0,
            rq_released: 0,
            blocked: false,
            last_send: Instant::ZERO,
        }
    }

    /// Gives back to [`WrCredits`] the slots of the WRs the engine has retired since the last call: moved into
    /// the engine and no longer among its outstanding ones (completed, flushed, or refused at the move).
    pub(crate) fn release(&mut self, engine: &Engine) {
        let Some(info) = engine.qp_info(self.qpn) else {
            return;
        };
        let sq_done = self.sq_moved.saturating_sub(info.sq_outstanding as u64);
        if sq_done > self.sq_released {
            let n = u32::try_from(sq_done - self.sq_released).unwrap_or(u32::MAX);
            self.credits.sq.fetch_sub(n, Ordering::AcqRel);
            self.sq_released = sq_done;
        }
        let rq_done = self.rq_moved.saturating_sub(info.rq_outstanding as u64);
        if rq_done > self.rq_released {
            let n = u32::try_from(rq_done - self.rq_released).unwrap_or(u32::MAX);
            self.credits.rq.fetch_sub(n, Ordering::AcqRel);
            self.rq_released = rq_done;
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

/// Receives a device's asynchronous events ([`roce_proto::AsyncEvent`]: QP fatal, CQ error, SQ drained,
/// communication established, port state) in the pass that took them from the engine, under the progress lock:
/// it must not call back into the runtime, and should only queue the event (events are rare, never per packet).
/// Installed with [`Context::set_async_handler`](crate::Context::set_async_handler); without one the device keeps
/// them for [`Context::poll_async_event`](crate::Context::poll_async_event) (the last 1024).
pub type AsyncHandler = Box<dyn FnMut(roce_proto::AsyncEvent) + Send>;

/// One device (port) of a group.
pub struct Device {
    pub(crate) engine: Engine,
    pub(crate) link: Box<dyn Link + Send>,
    pub(crate) qps: Vec<Option<QpSlot>>,
    /// The slot in `qps` of each QPN (a completion names its QP by QPN; [`QpSlot::release`] before publishing it).
    pub(crate) qp_slots: std::collections::HashMap<Qpn, u32>,
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
    /// Since when passes have left transmitting to a later pass ([`PassKind::Poll`], doorbell batching).
    tx_deferred: Option<Instant>,
    /// Send WQEs moved into the engine since the last transmit (the size of the doorbell batch being gathered).
    batch_wqes: u32,
    /// This pass moved send WQEs of a QP that had moved some within the batching window before (a stream of posts)
    /// / of an idle QP.
    db_busy: bool,
    db_idle: bool,
    pub(crate) now: Instant,
    /// Start of the last pass, if it left work outstanding (for `RuntimeStats::max_pass_gap_us`).
    busy_pass: Option<Instant>,
    /// This pass left frames for a later one (full receive burst, transmit budget used up, transmit deferred).
    left_work: bool,
    /// Asynchronous events the engine raised and nobody has taken yet ([`crate::Context::poll_async_event`]); at
    /// most [`ASYNC_EVENTS_KEPT`], the oldest dropped first (room reserved at creation: keeping one never allocates).
    pub(crate) events: VecDeque<roce_proto::AsyncEvent>,
    /// Events dropped because [`ASYNC_EVENTS_KEPT`] were waiting.
    pub(crate) events_dropped: u64,
    /// Where the engine's asynchronous events go ([`AsyncHandler`]).
    pub(crate) async_handler: Option<AsyncHandler>,
    /// The connection manager on this port's QP 1 (`crate::cm`), once a program asked for one.
    pub(crate) cm: Option<Box<crate::cm::DevCm>>,
}

/// Asynchronous events a device keeps for [`crate::Context::poll_async_event`].
pub(crate) const ASYNC_EVENTS_KEPT: usize = 1024;

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device")
            .field("engine", &self.engine)
            .finish_non_exhaustive()
    }
}

impl Device {
    pub(crate) fn new(engine: Engine, link: Box<dyn Link + Send>) -> Device {
        Device {
            engine,
            link,
            qps: Vec::new(),
            qp_slots: std::collections::HashMap::new(),
            cqs: Vec::new(),
            blocked: VecDeque::new(),
            cq_pending: VecDeque::new(),
            cq_timers: BinaryHeap::new(),
            wc_buf: vec![Wc::default(); 64],
            deferred_dereg: Vec::new(),
            tx_deferred: None,
            batch_wqes: 0,
            db_busy: false,
            db_idle: false,
            now: Instant::ZERO,
            busy_pass: None,
            left_work: false,
            events: VecDeque::with_capacity(ASYNC_EVENTS_KEPT),
            events_dropped: 0,
            async_handler: None,
            cm: None,
        }
    }

    /// Keeps an asynchronous event of the engine for the application, dropping the oldest when full.
    fn keep_event(&mut self, ev: roce_proto::AsyncEvent) {
        if self.events.len() >= ASYNC_EVENTS_KEPT {
            self.events.pop_front();
            self.events_dropped += 1;
        }
        self.events.push_back(ev);
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
        let sq_before = sq_out;
        // SGEs of a WR with more than the ring entry holds (`wqe` module docs); on the stack, no allocation.
        let mut spill = [roce_proto::Sge::default(); MAX_SGE];
        while !qp.rq.is_empty() {
            if rq_out >= qp.max_recv_wr {
                stuck = true;
                break;
            }
            let Some(wqe) = qp.rq.front(&mut spill) else {
                break;
            };
            let wr = roce_proto::RecvWr {
                wr_id: wqe.wr_id,
                sg_list: wqe.sges.resolve(&spill),
            };
            let r = self.engine.post_recv(qpn, &[wr]);
            let wr_id = wqe.wr_id;
            qp.rq.pop();
            moved = true;
            rq_out += 1;
            qp.rq_moved += 1;
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
        while !qp.sq.is_empty() {
            if sq_out >= qp.max_send_wr {
                stuck = true;
                break;
            }
            let Some(wqe) = qp.sq.front(&mut spill) else {
                break;
            };
            let r = wqe.with_wr(&spill, |wr| {
                self.engine.post_send(qpn, std::slice::from_ref(wr))
            });
            let (wr_id, opc) = (wqe.wr_id, wqe.op.wc_opcode());
            qp.sq.pop();
            moved = true;
            sq_out += 1;
            qp.sq_moved += 1;
            self.batch_wqes = self.batch_wqes.saturating_add(1);
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
        if sq_out > sq_before {
            // Doorbell batching (module docs): send work again within the window = a stream of posts.
            let window = self.engine.batch_window().min(TX_DEFER_MAX);
            if self.now.saturating_duration_since(qp.last_send) < window {
                self.db_busy = true;
            } else {
                self.db_idle = true;
            }
            qp.last_send = self.now;
        }
        if stuck && !qp.blocked {
            qp.blocked = true;
            self.blocked.push_back(slot);
        }
        // WRs the engine refused are retired already (their completions are published later in this pass).
        qp.release(&self.engine);
        moved
    }

    /// [`QpSlot::release`] of QP `slot` (the posting side found its queue full: completions may have retired WRs
    /// without a pass having given their slots back yet, e.g. unsignaled WRs, or a QP reset).
    pub(crate) fn release_credits(&mut self, slot: u32) {
        if let Some(Some(qp)) = self.qps.get_mut(slot as usize) {
            qp.release(&self.engine);
        }
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
            // The slots these completions retire are free before the application can see them (`WrCredits`).
            let mut last = None;
            for wc in &self.wc_buf[..got] {
                if last != Some(wc.qp_num) {
                    last = Some(wc.qp_num);
                    if let Some(Some(qp)) = self
                        .qp_slots
                        .get(&wc.qp_num)
                        .and_then(|&i| self.qps.get_mut(i as usize))
                    {
                        qp.release(&self.engine);
                    }
                }
            }
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

/// One bounded pass over every device of the group (module docs). Returns true if it did anything.
pub(crate) fn pass(shared: &Shared, g: &mut Group, kind: PassKind) -> bool {
    let cfg = &shared.cfg;
    let stats = &shared.stats;
    let now = shared.clock.now();
    let devs = &mut g.devs;
    let mut work = false;
    for dev in devs.iter_mut() {
        dev.now = now;
        dev.left_work = false;
        if let Some(t) = dev.busy_pass {
            let gap =
                u64::try_from(now.saturating_duration_since(t).as_micros()).unwrap_or(u64::MAX);
            stats.max_pass_gap_us.fetch_max(gap, Ordering::Relaxed);
        }
    }
    // Posted work first, so that a receive the application posted before this pass is in the engine before the
    // frames this pass receives are processed.
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
        for dev in devs.iter_mut() {
            work |= dev.recover_overflow(now);
        }
    }
    for dev in devs.iter_mut() {
        work |= dev.retry_blocked();
        // Receive before timers (module docs, "The pass"): a due timer makes every pass receive, and receive
        // everything waiting (bounded), so that responses already in the link count before the timeout fires.
        let due = dev.engine.poll_timeout().is_some_and(|t| t <= now);
        if due || matches!(kind, PassKind::Full | PassKind::Poll) {
            let mut left = if due { RX_BEFORE_TIMERS } else { cfg.rx_burst };
            while left > 0 {
                let engine = &mut dev.engine;
                let max = cfg.rx_burst.min(left);
                match dev
                    .link
                    .rx_burst(now, max, &mut |f| engine.handle_frame(now, f))
                {
                    Ok(n) => {
                        if n > 0 {
                            stats.rx_bursts.fetch_add(1, Ordering::Relaxed);
                            stats.rx_frames.fetch_add(n as u64, Ordering::Relaxed);
                            work = true;
                        }
                        dev.left_work = n == max;
                        left = if n < max { 0 } else { left - n };
                    }
                    Err(e) => {
                        stats.link_errors.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(error = %e, "rx_burst failed");
                        left = 0;
                    }
                }
            }
        }
        if dev.engine.poll_timeout().is_some_and(|t| t <= now) {
            dev.engine.handle_timeout(now);
            work = true;
        }
        // MADs received on QP 1 into the CM, its due timers, its MADs out through QP 1 (sent below).
        if let Some(cm) = dev.cm.as_deref_mut() {
            work |= cm.drive(&mut dev.engine, now);
        }
    }
    let mut deadline: Option<Instant> = None;
    for dev in devs.iter_mut() {
        let (busy, idle) = (
            std::mem::take(&mut dev.db_busy),
            std::mem::take(&mut dev.db_idle),
        );
        let age = dev
            .tx_deferred
            .map_or(Duration::ZERO, |t| now.saturating_duration_since(t));
        // Doorbell batching (module docs, "Doorbell batching"): only a post pass whose doorbells all come from QPs
        // that are streaming posts holds back, while the batch is younger than the window and smaller than a
        // transmit call's worth.
        let window = dev.engine.batch_window().min(TX_DEFER_MAX);
        let (defer, limit) = match kind {
            PassKind::Recv => (age < TX_DEFER_MAX, TX_DEFER_MAX),
            // The caller has completions to act on; its next call transmits (see `PassKind::Poll`).
            PassKind::Poll => (age < TX_DEFER_MAX && dev.publish(now) > 0, TX_DEFER_MAX),
            PassKind::Post => (
                busy && !idle
                    && age < window
                    && (dev.batch_wqes as usize) < dev.engine.tx_burst().min(cfg.tx_budget),
                window,
            ),
            PassKind::Full => (false, Duration::ZERO),
        };
        if defer {
            dev.left_work = true;
            let t0 = *dev.tx_deferred.get_or_insert(now);
            work = true;
            if kind == PassKind::Post {
                stats.batched_posts.fetch_add(1, Ordering::Relaxed);
                deadline = min_instant(deadline, Some(t0.saturating_add(limit)));
            } else {
                deadline = min_instant(deadline, Some(now));
            }
            continue;
        }
        dev.tx_deferred = None;
        dev.batch_wqes = 0;
        // The transmit loop hands the link pointers into MRs (gathered pieces) that are valid only until this
        // pass releases the progress lock. If anything in it panics, the link is flushed before the panic goes on
        // (issue #22 item 7): otherwise the pieces would stay queued while the poisoned lock is taken again, and
        // another thread could destroy the QP and free the MR before the next `flush` hands them to `sendmmsg`.
        // No allocation and no cost on the normal path (an unwind landing pad).
        let tx = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            transmit(cfg, stats, dev, now)
        }));
        let sent = match tx {
            Ok(sent) => sent,
            Err(panic) => {
                // The memory behind the pieces is still pinned: this thread holds the progress lock until the
                // unwind leaves `pass`.
                if let Err(e) = dev.link.flush(now) {
                    tracing::warn!(error = %e, "flush after a panic in the transmit loop failed");
                }
                std::panic::resume_unwind(panic);
            }
        };
        dev.left_work |= sent >= cfg.tx_budget;
        if sent > 0 {
            stats.tx_frames.fetch_add(sent as u64, Ordering::Relaxed);
            stats.flushes.fetch_add(1, Ordering::Relaxed);
            work = true;
        }
        // Flush every pass: a link may hold frames from an earlier Busy.
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
            if let Some(h) = dev.async_handler.as_mut() {
                h(ev);
            } else {
                dev.keep_event(ev);
            }
        }
        deadline = min_instant(deadline, dev.engine.poll_timeout());
        deadline = min_instant(
            deadline,
            dev.cm.as_deref_mut().and_then(|c| c.poll_timeout()),
        );
        deadline = min_instant(deadline, dev.link.poll_at());
        deadline = min_instant(deadline, dev.moderation_deadline());
    }
    for dev in devs.iter_mut() {
        let busy = dev.left_work || dev.engine.poll_timeout().is_some();
        dev.busy_pass = busy.then_some(now);
    }
    shared.next_deadline.store(
        deadline.map_or(u64::MAX, Instant::as_nanos),
        Ordering::Relaxed,
    );
    shared.ready.publish(devs);
    work
}

/// The transmit loop of a pass: at most `cfg.tx_budget` frames from `dev`'s engine into its link, gathered where
/// the link gathers. Returns the frames committed. The caller flushes the link before it releases the progress
/// lock, also when this panics: the gathered pieces are valid only until then.
fn transmit(cfg: &RuntimeConfig, stats: &RuntimeStats, dev: &mut Device, now: Instant) -> usize {
    let mut sent = 0;
    while sent < cfg.tx_budget {
        let buf = match dev.link.tx_buf(now) {
            Ok(b) => b,
            Err(roce_link::LinkError::Busy) => {
                dev.left_work = true;
                break;
            }
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
            // SAFETY: the pieces point into MRs of this engine, and the pass holds the group's progress lock
            // until after its `flush` of this link, which it runs even when this loop panics (`pass`): no engine
            // call (the only way to write an MR's bytes on the engine's behalf or to deregister it) runs before
            // then, and the link keeps no piece past that flush (`Link::tx_commit_gather`).
            #[allow(unsafe_code)]
            Some(g) => unsafe { dev.link.tx_commit_gather(now, g, &segs) },
        };
        if let Err(e) = committed {
            stats.link_errors.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(error = %e, "tx_commit failed");
        }
        sent += 1;
    }
    sent
}

/// Idle back-off of a thread that drives passes in a loop (module docs, "Idle"): busy-poll for `spin`; then, if
/// every link has a receive descriptor, block on them until a frame arrives, a ring, or the next deadline (at most
/// `park_max`); on links without one, yield until `yield_for`, then sleep (at most `park_max`, never past the
/// group's next deadline).
pub(crate) enum Idle {
    /// Call again at once.
    Spin,
    /// `yield_now`, then call again.
    Yield,
    /// Sleep this long.
    Sleep(Duration),
    /// Block on the links' receive descriptors (and the waiter) at most this long.
    Wait(Duration),
}

/// What an idle driver does `idle` after its last useful pass. `readiness`: it can block on the links' receive
/// descriptors ([`Shared::ready_fds`]).
pub(crate) fn idle_step(shared: &Shared, now: Instant, idle: Duration, readiness: bool) -> Idle {
    let cfg = &shared.cfg;
    if idle < cfg.spin {
        return Idle::Spin;
    }
    let sleep = shared.idle_sleep(now);
    if sleep.is_zero() {
        return Idle::Spin;
    }
    if readiness {
        return Idle::Wait(sleep);
    }
    if idle < cfg.yield_for {
        return Idle::Yield;
    }
    Idle::Sleep(sleep)
}

/// Caller mode, callers active, a frame waiting: whether the callers will receive it themselves, so the
/// auto-progress thread leaves it to them (module docs, "Frames nobody receives"): a caller ran a receiving pass
/// `rx_age` ago, and `polling` says whether it is in a polling loop (its last poll found its CQ empty).
fn callers_take_it(rx_age: Duration, polling: bool) -> bool {
    rx_age < AUTO_RX_LIVE || (polling && rx_age < AUTO_RX_POLLING)
}

/// The progress thread (Thread mode) or auto-progress thread (Caller mode). Returns when `shared.stop` is set.
pub(crate) fn run_thread(shared: Arc<Shared>) {
    let cfg = shared.cfg.clone();
    if let Some(core) = cfg.pin_core {
        match core_affinity::get_core_ids().and_then(|ids| ids.get(core).copied()) {
            Some(id) if core_affinity::set_for_current(id) => {}
            _ => tracing::warn!(core, "could not pin the progress thread; running unpinned"),
        }
    }
    let clock = shared.clock;
    let mut last_work = clock.now();
    let mut fds = [0 as RawFd; MAX_WAIT_FDS];
    // Caller mode, callers active (module docs, "Frames nobody receives"): the thread watches the links' descriptors
    // from `watch_at` on; `backoff` is how long it last stayed away because callers were receiving themselves.
    let mut watch_at = Instant::ZERO;
    let mut backoff = Duration::ZERO;
    while !shared.stop.load(Ordering::Acquire) {
        let now = clock.now();
        if cfg.progress == ProgressMode::Caller {
            let after = cfg.auto_progress.unwrap_or(cfg.park_max);
            let since_caller = now.saturating_duration_since(Instant::from_nanos(
                shared.last_caller.load(Ordering::Relaxed),
            ));
            // `missed` alone is no reason to step in: a caller that raised it is served by the caller holding the
            // lock; only a holder that gave up (`handoff`) needs this thread while callers are active.
            if since_caller < after && !shared.handoff.swap(false, Ordering::SeqCst) {
                // Callers are driving: stay out of their way, look again when they might have stopped (or when a
                // hand-off or the shutdown rings) — but watch the links meanwhile (module docs, "Frames nobody
                // receives"): a frame that arrives while no caller is receiving is taken at once.
                let left = after - since_caller;
                // Not watching (callers were receiving themselves at the last look): wait until the back-off
                // ends, then look again.
                let pause = watch_at.saturating_duration_since(now);
                let ready = if pause.is_zero() {
                    shared.ready_fds(&mut fds)
                } else {
                    None
                };
                let Some(n) = ready else {
                    let d = if pause.is_zero() { AUTO_RX_LIVE } else { pause };
                    shared.thread_wait(&[], left.min(d));
                    last_work = clock.now();
                    continue;
                };
                if !shared.thread_wait(&fds[..n], left).readable {
                    last_work = clock.now();
                    continue;
                }
                let t = clock.now();
                let rx_age = t.saturating_duration_since(Instant::from_nanos(
                    shared.last_caller_rx.load(Ordering::Relaxed),
                ));
                if shared.caller_waiters.load(Ordering::SeqCst) > 0
                    || callers_take_it(rx_age, shared.caller_polling.load(Ordering::Relaxed))
                {
                    // A caller is polling (its receiving passes come this close together, or it is in a polling
                    // loop whose yields leave longer gaps): it takes the frame.
                    // Do not look again at once (the wait is level-triggered; the frame may still be queued), and
                    // the longer callers keep receiving themselves, the less often (doubling, up to the
                    // auto-progress period): a busy poller costs this thread about what it did before.
                    backoff = (backoff * 2).clamp(AUTO_RX_LIVE, after);
                    watch_at = t.saturating_add(backoff);
                    last_work = t;
                    continue;
                }
                // Nobody receives (a program spinning on memory for a peer's RDMA WRITE, ib_write_lat): this
                // thread does, now.
                let mut work = false;
                let o = shared.group.try_progress_idle(cfg.max_rounds, |g| {
                    work |= pass(&shared, g, PassKind::Full)
                });
                shared.account(o, false);
                shared
                    .stats
                    .auto_rx_passes
                    .fetch_add(u64::from(o.passes), Ordering::Relaxed);
                // Watch again at once; but a readable descriptor that yields nothing (an error condition the pass
                // reported, or a caller took the frame meanwhile) must not turn this into a busy loop.
                backoff = Duration::ZERO;
                watch_at = if work {
                    t
                } else {
                    clock.now().saturating_add(AUTO_RX_LIVE)
                };
                last_work = clock.now();
                continue;
            }
        }
        let mut work = false;
        let o = shared
            .group
            .try_progress_idle(cfg.max_rounds, |g| work |= pass(&shared, g, PassKind::Full));
        shared.account(o, false);
        if o.passes == 0 {
            // Someone holds the lock and drives (a caller, possibly preempted mid-pass, or a control verb):
            // spinning here would only take CPU from it.
            shared.thread_wait(&[], cfg.spin);
            continue;
        }
        if work {
            last_work = now;
            continue;
        }
        let ready = shared.ready_fds(&mut fds);
        match idle_step(
            &shared,
            now,
            now.saturating_duration_since(last_work),
            ready.is_some(),
        ) {
            Idle::Spin => std::hint::spin_loop(),
            Idle::Yield => std::thread::yield_now(),
            Idle::Sleep(d) => {
                if shared.sleep.prepare_park(|| shared.has_work()) {
                    shared.stats.parks.fetch_add(1, Ordering::Relaxed);
                    shared.thread_wait(&[], d);
                    shared.sleep.unparked();
                }
            }
            Idle::Wait(d) => {
                if shared.sleep.prepare_park(|| shared.has_work()) {
                    shared.stats.readiness_waits.fetch_add(1, Ordering::Relaxed);
                    let n = ready.unwrap_or(0);
                    if shared.thread_wait(&fds[..n], d).readable {
                        shared
                            .stats
                            .readiness_wakeups
                            .fetch_add(1, Ordering::Relaxed);
                    }
                    shared.sleep.unparked();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use roce_link::{LinkCaps, LinkError, SimConfig};
    use roce_proto::{TxGather, TxSeg};

    use super::*;
    use crate::*;

    #[test]
    fn auto_progress_leaves_a_frame_to_a_receiving_or_polling_caller_only() {
        let us = Duration::from_micros;
        // A caller that received just now takes it, polling or not.
        assert!(callers_take_it(us(5), false));
        assert!(callers_take_it(us(5), true));
        // A caller in a polling loop whose yields leave a 50 µs gap still takes it (ib_send_lat on a busy host) ...
        assert!(callers_take_it(us(50), true));
        // ... but not one that stopped polling (spinning on memory for a WRITE: ib_write_lat) ...
        assert!(!callers_take_it(us(50), false));
        // ... nor a poller that has not received for longer than AUTO_RX_POLLING (starved: the thread helps).
        assert!(!callers_take_it(AUTO_RX_POLLING, true));
    }

    /// What [`HoldsPieces`] saw: gathered frames queued and not yet flushed, and whether it has panicked.
    #[derive(Default)]
    struct Seen {
        queued: usize,
        panicked: bool,
    }

    /// A link that keeps gathered frames until `flush`, as `UdpLink` keeps their pieces for `sendmmsg` (here it
    /// only counts them and drops the frames), and panics in the first `tx_buf` after it has queued one: a fault
    /// inside the pass's transmit loop while pointers into an MR are queued. After the fault it passes everything
    /// on to the simulated link.
    struct HoldsPieces {
        inner: SendLink,
        seen: Arc<Mutex<Seen>>,
    }

    impl Link for HoldsPieces {
        fn caps(&self) -> LinkCaps {
            self.inner.caps()
        }
        fn rx_burst(
            &mut self,
            now: Instant,
            max: usize,
            sink: &mut dyn FnMut(&mut [u8]),
        ) -> Result<usize, LinkError> {
            self.inner.rx_burst(now, max, sink)
        }
        fn tx_buf(&mut self, now: Instant) -> Result<&mut [u8], LinkError> {
            {
                let mut s = self.seen.lock().expect("seen");
                if s.queued > 0 && !s.panicked {
                    s.panicked = true;
                    drop(s);
                    panic!("injected fault in the transmit loop");
                }
            }
            self.inner.tx_buf(now)
        }
        fn tx_commit(&mut self, now: Instant, len: usize) -> Result<(), LinkError> {
            self.inner.tx_commit(now, len)
        }
        #[allow(unsafe_code)]
        unsafe fn tx_commit_gather(
            &mut self,
            now: Instant,
            g: TxGather,
            segs: &[TxSeg],
        ) -> Result<(), LinkError> {
            let mut s = self.seen.lock().expect("seen");
            if !s.panicked {
                // Before the fault: counted and dropped (a lost frame; go-back-N sends it again).
                s.queued += 1;
                return Ok(());
            }
            drop(s);
            // SAFETY: the caller's guarantee (pieces readable until the next flush) is passed on unchanged.
            unsafe { self.inner.tx_commit_gather(now, g, segs) }
        }
        fn flush(&mut self, now: Instant) -> Result<(), LinkError> {
            self.seen.lock().expect("seen").queued = 0;
            self.inner.flush(now)
        }
        fn poll_at(&self) -> Option<Instant> {
            self.inner.poll_at()
        }
    }

    /// Issue #22 item 7: a panic inside a pass's transmit loop, after a gathered frame (pointers into an MR) went
    /// to the link, reaches the application only after the link has been flushed, so no piece is still queued
    /// when the poisoned progress lock is taken again (by a `dereg` or a QP destroy that frees the memory).
    /// Before the fix the panic left the frame queued (`queued == 1` here).
    #[test]
    fn a_panic_in_the_transmit_loop_leaves_no_gathered_piece_queued() {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let mut port = 0;
        let s2 = Arc::clone(&seen);
        let (ca, cb) = Context::sim_pair_with(
            RuntimeConfig {
                // Only this thread drives: the auto-progress thread would otherwise run some passes (and take the
                // injected panic instead of the caller) on a slow build (seen under AddressSanitizer).
                auto_progress: None,
                ..RuntimeConfig::with_mode(ProgressMode::Caller)
            },
            SimConfig::default(),
            move |l| {
                port += 1;
                Ok(if port == 1 {
                    Box::new(HoldsPieces {
                        inner: l,
                        seen: Arc::clone(&s2),
                    }) as SendLink
                } else {
                    l
                })
            },
        )
        .expect("pair");
        let cap = QpCap {
            max_send_wr: 4,
            max_recv_wr: 1,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        let side = |c: &Context| {
            let pd = c.alloc_pd().expect("pd");
            let cq = c.create_cq(8, None, Moderation::default()).expect("cq");
            let qp = pd.create_qp(QpType::Rc, &cq, &cq, cap, false).expect("qp");
            let buf = MrBuf::new(8192).expect("buf");
            let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
            let mr = pd.reg_mr(&buf, access).expect("mr");
            (pd, cq, qp, mr, buf)
        };
        let (_pda, cqa, qa, mra, _bufa) = side(&ca);
        let (_pdb, _cqb, qb, mrb, _bufb) = side(&cb);
        let o = ConnectOpts::default();
        qa.connect(&qb.endpoint(Psn::new(9)), Psn::new(3), &o)
            .expect("connect a");
        qb.connect(&qa.endpoint(Psn::new(3)), Psn::new(9), &o)
            .expect("connect b");
        // A 4 KiB WRITE: several packets whose payload the engine gathers from the MR.
        let sge = [mra.sge(0, 4096)];
        let op = SendOp::RdmaWrite {
            remote_addr: mrb.addr(),
            rkey: mrb.rkey(),
        };
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            qa.post_send(&[SendWr::new(1, op, &sge).signaled()])
                .expect("post");
            for _ in 0..100 {
                ca.progress();
            }
        }));
        let (queued, panicked) = {
            let s = seen.lock().expect("seen");
            (s.queued, s.panicked)
        };
        assert!(
            r.is_err() && panicked,
            "the injected panic reached the caller"
        );
        assert_eq!(queued, 0, "gathered frames still queued in the link");
        // The device keeps working after the panic (the poisoned lock is taken again): the WR completes.
        let mut wc = [Wc::default(); 1];
        let t0 = std::time::Instant::now();
        while cqa.poll(&mut wc) == 0 {
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "no completion after the panic"
            );
            ca.progress();
        }
        assert_eq!((wc[0].wr_id, wc[0].status), (1, WcStatus::Success));
    }
}
