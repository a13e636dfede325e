//! Thread-safe verbs handles (`STYLE.md` §4.3 V1–V7): [`Context`], [`Pd`], [`Mr`], [`Cq`], [`Qp`], [`Ah`].
//!
//! Handles are cheap `Clone`s (`Arc`), `Send + Sync`. Each keeps the objects it depends on alive (a QP holds its PD
//! and CQs, an MR its PD, everything its context), so dropping in any order is safe (V1); the engine-side object is
//! destroyed when the last handle goes. The progress thread stops when the last handle of its last device is dropped.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use roce_link::{Link, LinkError, SimConfig, SimNet};
use roce_proto::{
    AccessFlags, AhAttr, AhHandle, Counters, CqHandle, CreateQpError, DeviceAttr, Engine,
    EngineConfig, Gid, Lkey, ModifyQpError, MrBuffer, MrInfo, Mtu, Psn, QpAttr, QpAttrMask, QpCap,
    QpInfo, QpInitAttr, QpState, QpType, Qpn, RecvWr, ResourceError, Rkey, SendWr, Sge, Wc,
};

use crate::channel::{CompChannel, Moderation};
use crate::endpoint::{self, DeviceList, Endpoint};
use crate::runner::{
    self, CqNotify, CqSlot, Device, PassKind, ProgressMode, QpSlot, RuntimeConfig, RuntimeStats,
    Shared, WrCredits,
};
use crate::wqe::{RecvWqe, SendWqe, WqeError, WqeProducer, wqe_ring};

/// Errors of control verbs.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The engine refused a resource operation.
    #[error(transparent)]
    Resource(#[from] ResourceError),
    /// The engine refused `create_qp`.
    #[error(transparent)]
    CreateQp(#[from] CreateQpError),
    /// The engine refused `modify_qp`.
    #[error(transparent)]
    ModifyQp(#[from] ModifyQpError),
    /// Opening the link failed.
    #[error("opening the link failed")]
    Link(#[from] LinkError),
    /// The device is gone (a device index that does not exist).
    #[error("the device has stopped")]
    EngineGone,
    /// Spawning the progress thread (or creating the eventfd that wakes it) failed.
    #[error("spawning the progress thread failed")]
    Spawn(#[source] std::io::Error),
    /// A bad argument detected by the runtime.
    #[error("invalid argument: {0}")]
    InvalidArgument(&'static str),
    /// Allocating or mapping memory failed.
    #[error("allocating MR memory failed")]
    Alloc(#[source] std::io::Error),
    /// The object is in use (`EBUSY`): e.g. [`Mr::dereg`] while work requests that name the MR are in flight.
    #[error("busy: {0}")]
    Busy(&'static str),
    /// The connection manager refused a command ([`crate::cm`]).
    #[error("connection manager: {0}")]
    Cm(#[from] roce_cm::CmError),
}

impl Error {
    /// The `errno` a libibverbs call reports for this error (Linux values): `EBUSY` (16) for [`Error::Busy`] and an
    /// engine `Busy`, `EINVAL` (22) for bad handles and arguments, `ENOMEM` (12) for exhausted resources and failed
    /// allocations, `EIO` (5) for a dead or silent engine and link failures, `EAGAIN` (11) for a failed spawn.
    pub fn errno(&self) -> i32 {
        const EIO: i32 = 5;
        const EAGAIN: i32 = 11;
        const ENOMEM: i32 = 12;
        const EBUSY: i32 = 16;
        const EINVAL: i32 = 22;
        match self {
            Error::Busy(_) | Error::Resource(ResourceError::Busy(_)) => EBUSY,
            Error::Resource(ResourceError::Exhausted(_))
            | Error::CreateQp(CreateQpError::Resource(ResourceError::Exhausted(_)))
            | Error::Alloc(_) => ENOMEM,
            Error::Resource(_) | Error::CreateQp(_) | Error::ModifyQp(_) => EINVAL,
            Error::InvalidArgument(_) => EINVAL,
            Error::Spawn(_) => EAGAIN,
            Error::Link(_) | Error::EngineGone => EIO,
            Error::Cm(roce_cm::CmError::NoResources) => ENOMEM,
            Error::Cm(roce_cm::CmError::ServiceIdInUse) => 98, // EADDRINUSE
            Error::Cm(_) => EINVAL,
        }
    }
}

/// Errors of [`Qp::post_send`] / [`Qp::post_recv`] (synchronous checks, `STYLE.md` V3). Nothing of the chain was
/// posted when one is returned. Errors the engine finds later (bad lkey, QP state) become completions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PostError {
    /// The ring has no room for the whole chain (`ENOMEM` in libibverbs).
    #[error("queue full: {free} free slots for {wanted} work requests")]
    QueueFull {
        /// Free ring slots.
        free: usize,
        /// WRs in the chain.
        wanted: usize,
    },
    /// More SGEs than [`crate::MAX_SGE`] or the QP's capability.
    #[error("too many SGEs")]
    TooManySges,
    /// Inline payload longer than [`crate::MAX_INLINE`] or the QP's `max_inline_data`.
    #[error("inline data too long")]
    InlineTooLong,
    /// `post_recv` on a QP created on an SRQ (`EINVAL`; post on the [`crate::Srq`]).
    #[error("the QP takes its receive WQEs from an SRQ")]
    QpOnSrq,
    /// The SRQ was destroyed ([`crate::Srq::destroy`] through another handle) (`EINVAL`).
    #[error("the SRQ is gone")]
    SrqGone,
}

impl From<WqeError> for PostError {
    fn from(e: WqeError) -> Self {
        match e {
            WqeError::TooManySges => PostError::TooManySges,
            WqeError::InlineTooLong => PostError::InlineTooLong,
        }
    }
}

/// One QP's rates ([`Context::qp_rates`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct QpRate {
    /// The QP.
    pub qpn: Qpn,
    /// Its rate controller's state (DCQCN: RC, RT, α, limited).
    pub controller: roce_proto::RateMetrics,
    /// The rate its shaper enforces in bit/s (`None` = unlimited).
    pub shaped_bps: Option<u64>,
}

/// A device's counters at one instant ([`Context::stats_snapshot`]).
#[derive(Clone, Debug)]
pub struct StatsSnapshot {
    /// The port counters.
    pub counters: Counters,
    /// Every QP.
    pub qps: Vec<QpSnapshot>,
    /// The link's own counters, `(name, value)` ([`roce_link::Link::counters`]; none for a link without any).
    pub link: Vec<(&'static str, u64)>,
}

/// One QP as [`Context::qp_snapshots`] sees it.
#[derive(Clone, Debug)]
pub struct QpSnapshot {
    /// The QP.
    pub qpn: Qpn,
    /// State, PSNs, queue depths (send WRs outstanding: the send-queue depth).
    pub info: QpInfo,
    /// Its counters.
    pub counters: Counters,
    /// Its rate controller's state, if it has one (DCQCN RC, RT, α).
    pub rate: Option<roce_proto::RateMetrics>,
    /// The rate its shaper enforces in bit/s (`None` = unlimited).
    pub shaped_bps: Option<u64>,
}

/// A device group's shared state and its progress thread (if any); stopped and joined when the last context goes.
#[derive(Debug)]
struct Runtime {
    shared: Arc<Shared>,
    join: Mutex<Option<JoinHandle<()>>>,
    /// The stats endpoint serving this runtime's devices (`endpoint` module).
    endpoint: Mutex<Option<Endpoint>>,
}

impl Drop for Runtime {
    fn drop(&mut self) {
        if !self.shared.owned_here() {
            // A forked child's copy: the threads, the endpoint's socket and the link's port and steering entry are
            // the parent's, and a lock one of its threads held at the fork is held for ever here. Nothing is stopped
            // or joined (the thread does not exist here) and the group is leaked on purpose: its link's teardown
            // would act on the parent's shared state (module `runner`, `Shared::owner_pid`).
            std::mem::forget(Arc::clone(&self.shared));
            if let Ok(mut g) = self.join.try_lock() {
                std::mem::forget(g.take());
            }
            return;
        }
        if let Some(e) = self.endpoint.lock().ok().and_then(|mut g| g.take()) {
            e.stop();
        }
        self.shared.shutdown();
        if let Ok(mut g) = self.join.lock()
            && let Some(j) = g.take()
            && j.join().is_err()
        {
            tracing::error!("the progress thread panicked");
        }
    }
}

#[derive(Debug)]
pub(crate) struct CtxInner {
    rt: Arc<Runtime>,
    dev: usize,
    cfg: EngineConfig,
    attr: DeviceAttr,
}

/// A device (one engine port with its link): `ibv_context`.
#[derive(Clone, Debug)]
pub struct Context {
    inner: Arc<CtxInner>,
}

/// A link a runtime can drive from any thread.
pub type SendLink = Box<dyn Link + Send>;

/// What a link factory returns: one link per device, in order.
type LinkFactory = Box<dyn FnOnce() -> Result<Vec<SendLink>, LinkError>>;

/// The limits a program gets from a device with engine configuration `cfg` (`ibv_query_device`): the engine's
/// ([`Engine::query_device`]) lowered to what the runtime carries per work request ([`crate::MAX_SGE`] SGEs,
/// [`crate::MAX_INLINE`] inline bytes; [`Pd::create_qp`] refuses more). `rocev2 devinfo` and `roce-ibverbs`
/// report these, so both show the limits a program really has.
pub fn device_attr(cfg: &EngineConfig) -> DeviceAttr {
    let mut a = Engine::new(cfg.clone()).query_device();
    a.max_sge = a.max_sge.min(crate::MAX_SGE as u32);
    a.max_inline_data = a.max_inline_data.min(crate::MAX_INLINE as u32);
    a
}

impl Context {
    /// Opens one device. `link` builds its link (in this thread).
    ///
    /// Errors: [`Error::Link`] if the factory fails, [`Error::Spawn`] if the progress thread cannot start.
    pub fn open<F>(cfg: EngineConfig, rt: RuntimeConfig, link: F) -> Result<Context, Error>
    where
        F: FnOnce() -> Result<SendLink, LinkError> + 'static,
    {
        let mut v = Context::open_group(vec![cfg], rt, Box::new(move || link().map(|l| vec![l])))?;
        v.pop().ok_or(Error::EngineGone)
    }

    /// Opens several devices behind **one** progress lock and progress thread (for links that share state, like
    /// the ports of one [`SimNet`]: any pass drives them all). `links` must return one link per config, in order; a
    /// link that receives one QPN range of a shared address (`LinkCaps::first_qpn`) sets its engine's `first_qpn` and
    /// `last_qpn` to that range.
    pub fn open_group(
        cfgs: Vec<EngineConfig>,
        rt: RuntimeConfig,
        links: LinkFactory,
    ) -> Result<Vec<Context>, Error> {
        let max_objects = cfgs
            .iter()
            .map(|c| c.device.max_qp as usize + c.device.max_cq as usize)
            .sum();
        let links = links()?;
        if links.len() != cfgs.len() {
            return Err(Error::InvalidArgument("one link per device"));
        }
        // A link that receives one QPN range of a shared address (`LinkCaps::first_qpn`) numbers the QPs. The
        // netdev MTU is capped at what the link carries (`LinkCaps::mtu` less the 14-byte Ethernet header), so the
        // port offers no path MTU (`max_mtu`, `Engine::query_device`) whose frames the link can never send: an
        // RTR transition asking for more is refused, and no WQE waits forever for a transmit buffer large enough
        // (issue #19: the AF_XDP link carries 3840-byte frames on a 9000-byte interface).
        let mut cfgs = cfgs;
        for (c, l) in cfgs.iter_mut().zip(&links) {
            let caps = l.caps();
            if let Some(q) = caps.first_qpn {
                // The slot's range: up to where the next slot starts (`roce_link::reuseport::QPN_SHIFT`). The
                // engine enters it at an offset drawn from its seed (`roce_proto::QpnRange`).
                c.first_qpn = q;
                c.last_qpn = q | ((1 << roce_link::reuseport::QPN_SHIFT) - 1);
            }
            let carried = caps.mtu.saturating_sub(roce_wire::eth::HEADER_LEN);
            c.netdev_mtu = c.netdev_mtu.min(u32::try_from(carried).unwrap_or(u32::MAX));
        }
        let devs = cfgs
            .iter()
            .cloned()
            .zip(links)
            .map(|(c, l)| Device::new(Engine::new(c), l))
            .collect();
        let rt_endpoint = rt.stats_endpoint.clone();
        let shared = Arc::new(Shared::new(devs, max_objects, rt).map_err(Error::Spawn)?);
        let join = if shared.wants_thread() {
            let sh = Arc::clone(&shared);
            let name = match shared.mode() {
                ProgressMode::Thread => "roce-progress",
                ProgressMode::Caller => "roce-autoprogress",
            };
            let (started_tx, started_rx) = std::sync::mpsc::sync_channel::<()>(1);
            let j = std::thread::Builder::new()
                .name(name.into())
                .spawn(move || {
                    let _ = started_tx.send(());
                    runner::run_thread(sh)
                })
                .map_err(Error::Spawn)?;
            // The thread runs before `open` returns (its start-up, which allocates, is not left to chance later).
            started_rx.recv().map_err(|_| Error::EngineGone)?;
            Some(j)
        } else {
            None
        };
        let runtime = Arc::new(Runtime {
            shared,
            join: Mutex::new(join),
            endpoint: Mutex::new(None),
        });
        let ctxs: Vec<Context> = cfgs
            .into_iter()
            .enumerate()
            .map(|(dev, cfg)| Context {
                inner: Arc::new(CtxInner {
                    rt: Arc::clone(&runtime),
                    dev,
                    attr: device_attr(&cfg),
                    cfg,
                }),
            })
            .collect();
        let devices: DeviceList = Arc::new(Mutex::new(
            ctxs.iter().map(|c| Arc::downgrade(&c.inner)).collect(),
        ));
        let ep = endpoint::start(&rt_endpoint, devices);
        if let Ok(mut g) = runtime.endpoint.lock() {
            *g = ep;
        }
        Ok(ctxs)
    }

    /// A handle from the shared state the stats endpoint keeps (weakly).
    pub(crate) fn from_inner(inner: Arc<CtxInner>) -> Context {
        Context { inner }
    }

    /// The index of this device in its group (0 for [`Context::open`]).
    pub fn index(&self) -> usize {
        self.inner.dev
    }

    /// The socket of the stats endpoint serving this device (`None` when off or not created; see the `endpoint`
    /// module docs).
    pub fn stats_endpoint(&self) -> Option<std::path::PathBuf> {
        self.inner
            .rt
            .endpoint
            .lock()
            .ok()?
            .as_ref()
            .map(|e| e.path().to_owned())
    }

    /// Every QP of this device with its state, PSNs, queue depths, counters and rate state, in one engine call
    /// (control path: visits each QP once; for `rocev2 stat`).
    pub fn qp_snapshots(&self) -> Result<Vec<QpSnapshot>, Error> {
        self.call(|d| qp_snapshots_of(d))
    }

    /// The port counters, [`qp_snapshots`](Self::qp_snapshots) and the link's own counters
    /// ([`roce_link::Link::counters`]: what it dropped before the engine saw it) taken in one engine call, so at one
    /// instant: the port counters are then exactly the sum over the QPs plus what belongs to no QP
    /// (`roce_proto::Counters`), except the counts of QPs destroyed since, which stay in the port's. Two separate
    /// calls let packets in between (a QP's `rcvd_bytes` ahead of its port's). Control path (visits each QP once;
    /// the stats endpoint).
    pub fn stats_snapshot(&self) -> Result<StatsSnapshot, Error> {
        self.call(|d| {
            let mut link = Vec::new();
            d.link.counters(&mut |n, v| link.push((n, v)));
            StatsSnapshot {
                counters: d.engine.counters().clone(),
                qps: qp_snapshots_of(d),
                link,
            }
        })
    }

    /// Two devices (MAC 02:00:00:00:00:01 / :02, GIDs `::ffff:192.0.2.1` / `.2`) on a simulated 100 Gb/s segment
    /// ([`SimConfig::default`]), one device group in real time (any pass drives both ports).
    pub fn sim_pair(rt: RuntimeConfig) -> Result<(Context, Context), Error> {
        Context::sim_pair_with(rt, SimConfig::default(), Ok)
    }

    /// Like [`sim_pair`](Self::sim_pair) with a segment configuration and a wrapper applied to each port's link
    /// (decorators such as `Faulty` or `Pcap`; called with port 0, then port 1).
    pub fn sim_pair_with<W>(
        rt: RuntimeConfig,
        sim: SimConfig,
        mut wrap: W,
    ) -> Result<(Context, Context), Error>
    where
        W: FnMut(SendLink) -> Result<SendLink, LinkError> + 'static,
    {
        let cfg = |i: u8| EngineConfig {
            mac: [0x02, 0, 0, 0, 0, i],
            gids: vec![Gid::from_ipv4([192, 0, 2, i])],
            seed: u64::from(i),
            ..EngineConfig::default()
        };
        let (a, b) = (cfg(1), cfg(2));
        let (ma, mb) = (a.mac, b.mac);
        let mut v = Context::open_group(
            vec![a, b],
            rt,
            Box::new(move || {
                let (_net, pa, pb): (SimNet, _, _) = SimNet::pair(sim, ma, mb);
                let a = wrap(Box::new(pa))?;
                let b = wrap(Box::new(pb))?;
                Ok(vec![a, b])
            }),
        )?;
        let b = v.pop().ok_or(Error::EngineGone)?;
        let a = v.pop().ok_or(Error::EngineGone)?;
        Ok((a, b))
    }

    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.inner.rt.shared
    }

    /// Runs `f` with this device under the progress lock (blocking), then one pass; in the calling thread.
    pub(crate) fn call<R, F>(&self, f: F) -> Result<R, Error>
    where
        F: FnOnce(&mut Device) -> R,
    {
        self.shared()
            .control(self.inner.dev, f)
            .ok_or(Error::EngineGone)
    }

    /// Sends this device's asynchronous events to `handler` from now on (`ibv_get_async_event`'s source; see
    /// [`AsyncHandler`](crate::AsyncHandler) for what it may do). Replaces an earlier handler. Errors:
    /// `EngineGone`.
    pub fn set_async_handler(&self, handler: crate::AsyncHandler) -> Result<(), Error> {
        self.call(move |d| d.async_handler = Some(handler))
    }

    /// Like [`call`](Self::call), ignoring the result (used by `Drop`).
    pub(crate) fn cast<F>(&self, f: F)
    where
        F: FnOnce(&mut Device),
    {
        let _ = self.call(f);
    }

    /// Drives this device's group once in the calling thread — receive, process, transmit, complete — if no other
    /// thread is doing it right now (then that thread runs a pass for this caller). Returns true if the pass did
    /// anything. For programs that wait without posting or polling (e.g. a pure RDMA WRITE target in a loop of its
    /// own) and want to drive progress themselves in [`ProgressMode::Caller`].
    pub fn progress(&self) -> bool {
        self.shared().progress()
    }

    /// Who drives this device ([`RuntimeConfig::progress`]).
    pub fn progress_mode(&self) -> ProgressMode {
        self.shared().mode()
    }

    /// The engine configuration (MAC, GID table, netdev MTU).
    pub fn config(&self) -> &EngineConfig {
        &self.inner.cfg
    }

    /// `ibv_query_device`.
    pub fn query_device(&self) -> DeviceAttr {
        self.inner.attr
    }

    /// GID at `index` of the port GID table.
    pub fn gid(&self, index: usize) -> Option<Gid> {
        self.inner.cfg.gids.get(index).copied()
    }

    /// Port counters (a snapshot).
    pub fn counters(&self) -> Result<Counters, Error> {
        self.call(|d| d.engine.counters().clone())
    }

    /// Counters of one QP.
    pub fn qp_counters(&self, qpn: Qpn) -> Result<Option<Counters>, Error> {
        self.call(move |d| d.engine.qp_counters(qpn).cloned())
    }

    /// The engine's text dump of QP `qpn` (state, PSNs, queue depths, retry counters and timers, rate controller,
    /// non-zero counters); `None` for an unknown QPN.
    pub fn qp_dump(&self, qpn: Qpn) -> Result<Option<String>, Error> {
        self.call(move |d| d.engine.qp_dump(qpn))
    }

    /// The rate state of every QP of this device but QP 1 (the GSI), as of the runtime's current instant (returned
    /// with it): the rate controller's view (DCQCN RC, RT, α, `docs/spec/DCQCN.md` §2) and the rate its shaper enforces
    /// (the smaller of that and the QP's limit; `None` = unlimited). For rate logs (`rocev2 perf --rate-log`).
    pub fn qp_rates(&self) -> Result<(roce_proto::Instant, Vec<QpRate>), Error> {
        self.call(|d| {
            let now = d.now;
            let e = &d.engine;
            // QP 1 (the GSI, the device's own) carries only MADs: rate logs are about the program's QPs.
            let v = e
                .qpns()
                .filter(|q| q.value() != 1)
                .filter_map(|qpn| {
                    Some(QpRate {
                        qpn,
                        controller: e.qp_rate(qpn, now)?,
                        shaped_bps: e.qp_rate_bps(qpn),
                    })
                })
                .collect();
            (now, v)
        })
    }

    /// Counters of the runtime (shared by every device of the group).
    pub fn runtime_stats(&self) -> &RuntimeStats {
        &self.shared().stats
    }

    /// The oldest asynchronous event of this device not yet taken (`ibv_get_async_event` without the blocking):
    /// QP fatal / request / access errors, COMM_EST, SQ_DRAINED, CQ overrun, port up/down, an SRQ's limit
    /// ([`roce_proto::AsyncEventType::SrqLimitReached`], naming it by [`crate::Srq::handle`]) and LAST_WQE_REACHED.
    /// The device keeps the last 1024 events; older ones are dropped. Takes the progress lock and runs a pass.
    /// Nothing is kept while an [`AsyncHandler`](crate::AsyncHandler) is installed (it takes every event).
    pub fn poll_async_event(&self) -> Result<Option<roce_proto::AsyncEvent>, Error> {
        self.call(|d| d.events.pop_front())
    }

    /// Asynchronous events dropped because 1024 were waiting untaken ([`poll_async_event`](Self::poll_async_event)).
    pub fn async_events_dropped(&self) -> Result<u64, Error> {
        self.call(|d| d.events_dropped)
    }

    /// A random initial PSN from the engine's seeded RNG.
    pub fn random_psn(&self) -> Result<Psn, Error> {
        self.call(|d| d.engine_mut().random_psn())
    }

    /// `ibv_alloc_pd`.
    pub fn alloc_pd(&self) -> Result<Pd, Error> {
        let h = self.call(|d| d.engine.alloc_pd())??;
        Ok(Pd {
            inner: Arc::new(PdInner {
                ctx: self.clone(),
                handle: h,
            }),
        })
    }

    /// `ibv_create_cq` with room for `depth` completions, optionally attached to a completion channel with the given
    /// moderation. The ring between the passes and [`Cq::poll`] also holds `depth` entries; completions that
    /// do not fit wait in the engine CQ (whose overrun rules apply, `ROCEV2.md §4.4`).
    pub fn create_cq(
        &self,
        depth: u32,
        channel: Option<&Arc<CompChannel>>,
        moderation: Moderation,
    ) -> Result<Cq, Error> {
        if depth == 0 {
            return Err(Error::InvalidArgument("cq depth must be at least 1"));
        }
        let armed = Arc::new(AtomicBool::new(false));
        let arm_pending = Arc::new(AtomicBool::new(false));
        let notify = channel.map(|c| CqNotify {
            chan: Arc::clone(c),
            armed: Arc::clone(&armed),
            arm_pending: Arc::clone(&arm_pending),
        });
        let (handle, slot, cons) = self.call(move |d| {
            let h = d.engine.create_cq(depth)?;
            // The ring is sized only once the engine has accepted `depth` (1..=max_cqe): a huge depth is an
            // `InvalidArgument`, never an allocation that aborts the process.
            let (prod, cons) = rtrb::RingBuffer::<Wc>::new(depth as usize);
            let slot = d.put_cq(CqSlot::new(h, prod, notify, moderation));
            Ok::<_, ResourceError>((h, slot, cons))
        })??;
        if let Some(c) = channel {
            // Only once the engine accepted the CQ, so a refusal leaves the channel as it was. Room for this CQ's
            // event, so firing it in a pass does not allocate: no event can fire before this, since the CQ is armed
            // only by `req_notify` on the handle returned below.
            c.attach(Arc::downgrade(self.shared()));
        }
        Ok(Cq {
            inner: Arc::new(CqInner {
                ctx: self.clone(),
                handle,
                slot,
                ring: Mutex::new(cons),
                armed,
                arm_pending,
                idle_since: AtomicU64::new(runner::NOT_IDLE),
            }),
        })
    }
}

/// Every QP of device `d` as [`QpSnapshot`]s (inside an engine call).
fn qp_snapshots_of(d: &Device) -> Vec<QpSnapshot> {
    let now = d.now;
    let e = &d.engine;
    e.qpns()
        .filter_map(|qpn| {
            Some(QpSnapshot {
                qpn,
                info: e.qp_info(qpn)?,
                counters: e.qp_counters(qpn)?.clone(),
                rate: e.qp_rate(qpn, now),
                shaped_bps: e.qp_rate_bps(qpn),
            })
        })
        .collect()
}

#[derive(Debug)]
struct PdInner {
    ctx: Context,
    handle: roce_proto::PdHandle,
}

impl Drop for PdInner {
    fn drop(&mut self) {
        let h = self.handle;
        self.ctx.cast(move |d| {
            if let Err(e) = d.engine.dealloc_pd(h) {
                tracing::warn!(error = %e, "dealloc_pd failed");
            }
        });
    }
}

/// A protection domain (`ibv_pd`).
#[derive(Clone, Debug)]
pub struct Pd {
    inner: Arc<PdInner>,
}

impl Pd {
    /// The context.
    pub fn context(&self) -> &Context {
        &self.inner.ctx
    }

    /// `ibv_reg_mr` of a buffer the application owns: the MR covers all of `buf`, its address is the buffer's
    /// ([`MrBuf::as_ptr`](crate::MrBuf::as_ptr)), and the application keeps reading and writing the bytes through
    /// `buf` under the RNIC contract (crate docs: a buffer is not changed between post and completion). The engine
    /// co-owns the memory until the MR is gone, so dropping `buf` first is harmless.
    ///
    /// Errors: the engine's (`Error::Resource`: dead PD, `max_mr`, `max_mr_size`, REMOTE_WRITE without
    /// LOCAL_WRITE).
    pub fn reg_mr(&self, buf: &crate::MrBuf, access: AccessFlags) -> Result<Mr, Error> {
        self.reg_region(Arc::clone(buf.region()), access)
    }

    /// Registers `region` at its own address (shared by [`reg_mr`](Self::reg_mr) and `reg_mr_raw`).
    pub(crate) fn reg_region(
        &self,
        region: Arc<crate::memory::Region>,
        access: AccessFlags,
    ) -> Result<Mr, Error> {
        let iova = region.base() as u64;
        self.reg_region_at(region, access, iova)
    }

    /// Registers `region` with byte 0 at virtual address `iova` (`ibv_reg_mr_iova2`).
    pub(crate) fn reg_region_at(
        &self,
        region: Arc<crate::memory::Region>,
        access: AccessFlags,
        iova: u64,
    ) -> Result<Mr, Error> {
        let huge = region.is_huge();
        let mem = MrBuffer::new(crate::memory::SharedMemory(Arc::clone(&region)));
        let pd = self.inner.handle;
        let info = self
            .inner
            .ctx
            .call(move |d| d.engine.reg_mr_iova(pd, mem, access, iova))??;
        Ok(Mr {
            inner: Arc::new(MrInner {
                pd: self.clone(),
                info,
                huge,
                access,
                region,
                registered: AtomicBool::new(true),
            }),
        })
    }

    /// `ibv_create_ah` (UD address vector).
    pub fn create_ah(&self, attr: &AhAttr) -> Result<Ah, Error> {
        let pd = self.inner.handle;
        let attr = *attr;
        let h = self
            .inner
            .ctx
            .call(move |d| d.engine.create_ah(pd, &attr))??;
        Ok(Ah {
            inner: Arc::new(AhInner {
                pd: self.clone(),
                handle: h,
            }),
        })
    }

    /// The engine handle of this PD.
    pub(crate) fn handle(&self) -> roce_proto::PdHandle {
        self.inner.handle
    }

    /// `ibv_create_qp`. The granted capabilities are in [`Qp::cap`]; SGEs per WR are bounded by
    /// [`crate::MAX_SGE`] and inline data by [`crate::MAX_INLINE`] as well.
    pub fn create_qp(
        &self,
        qp_type: QpType,
        send_cq: &Cq,
        recv_cq: &Cq,
        cap: QpCap,
        sq_sig_all: bool,
    ) -> Result<Qp, Error> {
        self.create_qp_with_srq(qp_type, send_cq, recv_cq, cap, sq_sig_all, None)
    }

    /// `ibv_create_qp` with `ibv_qp_init_attr.srq`: as [`create_qp`](Self::create_qp); with `Some(srq)` the QP takes
    /// its receive WQEs from `srq` (`cap.max_recv_wr` / `max_recv_sge` are ignored and granted as 0, and
    /// [`Qp::post_recv`] is refused with [`PostError::QpOnSrq`]). The QP keeps the SRQ alive. Errors as
    /// `create_qp`; an SRQ of another device is `InvalidArgument`.
    pub fn create_qp_with_srq(
        &self,
        qp_type: QpType,
        send_cq: &Cq,
        recv_cq: &Cq,
        cap: QpCap,
        sq_sig_all: bool,
        srq: Option<&crate::Srq>,
    ) -> Result<Qp, Error> {
        if srq.is_some_and(|s| !Arc::ptr_eq(&s.context().inner, &self.inner.ctx.inner)) {
            return Err(Error::InvalidArgument("the SRQ belongs to another device"));
        }
        let srq_handle = srq.map(crate::Srq::handle);
        if cap.max_send_sge as usize > crate::MAX_SGE || cap.max_recv_sge as usize > crate::MAX_SGE
        {
            return Err(Error::InvalidArgument("more SGEs than roce_verbs::MAX_SGE"));
        }
        if cap.max_inline_data as usize > crate::MAX_INLINE {
            return Err(Error::InvalidArgument(
                "inline data above roce_verbs::MAX_INLINE",
            ));
        }
        let init = QpInitAttr {
            qp_type,
            pd: self.inner.handle,
            send_cq: send_cq.inner.handle,
            recv_cq: recv_cq.inner.handle,
            cap,
            sq_sig_all,
        };
        let pending = Arc::new(AtomicBool::new(false));
        let p2 = Arc::clone(&pending);
        let credits = Arc::new(WrCredits::default());
        let c2 = Arc::clone(&credits);
        let (scq, rcq) = (send_cq.inner.slot, recv_cq.inner.slot);
        let (qpn, granted, slot, sqp, rqp) = self.inner.ctx.call(move |d| {
            let (qpn, granted) = d.engine.create_qp_srq(&init, srq_handle)?;
            let (sqp, sqc) = wqe_ring::<SendWqe>(granted.max_send_wr, granted.max_send_sge);
            let (rqp, rqc) = wqe_ring::<RecvWqe>(granted.max_recv_wr, granted.max_recv_sge);
            let slot = Device::insert(
                &mut d.qps,
                QpSlot::new(
                    qpn,
                    sqc,
                    rqc,
                    p2,
                    scq,
                    rcq,
                    granted.max_send_wr,
                    granted.max_recv_wr,
                    c2,
                ),
            );
            d.qp_slots.insert(qpn, slot);
            Ok::<_, CreateQpError>((qpn, granted, slot, sqp, rqp))
        })??;
        Ok(Qp {
            inner: Arc::new(QpInner {
                pd: self.clone(),
                send_cq: send_cq.clone(),
                recv_cq: recv_cq.clone(),
                qpn,
                qp_type,
                cap: granted,
                slot,
                sq: Mutex::new(sqp),
                rq: Mutex::new(rqp),
                rq_count: Mutex::new(RqCount::default()),
                pending,
                credits,
                srq: srq.cloned(),
            }),
        })
    }
}

struct MrInner {
    pd: Pd,
    info: MrInfo,
    huge: bool,
    /// The access flags it was registered with (`Mr::write` needs LOCAL_WRITE).
    access: AccessFlags,
    region: Arc<crate::memory::Region>,
    /// Cleared by a successful [`Mr::dereg`] (under the region's application lock, which `Mr::read`/`Mr::write`
    /// hold while they check it and copy), so no copy reaches deregistered memory and `Drop` does not deregister
    /// again.
    registered: AtomicBool,
}

impl std::fmt::Debug for MrInner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mr")
            .field("info", &self.info)
            .field("huge", &self.huge)
            .finish_non_exhaustive()
    }
}

impl Drop for MrInner {
    fn drop(&mut self) {
        if !self.registered.load(Ordering::Acquire) {
            return;
        }
        let lkey = self.info.lkey;
        // With WRs still in flight the engine refuses; the device retries until they have completed (the engine
        // co-owns the memory meanwhile, so nothing is freed early).
        self.pd.inner.ctx.cast(move |d| d.dereg_or_defer(lkey));
    }
}

/// A QP's receive-queue occupancy as `Qp::post_recv` bounds it: `known` outstanding at the last exact count,
/// `since` posted after it.
#[derive(Debug, Default)]
struct RqCount {
    known: u64,
    since: u64,
}

/// A memory region (`ibv_mr`) over memory the application owns ([`MrBuf`](crate::MrBuf) or a raw registration).
#[derive(Clone, Debug)]
pub struct Mr {
    inner: Arc<MrInner>,
}

impl Mr {
    /// Local key.
    pub fn lkey(&self) -> Lkey {
        self.inner.info.lkey
    }
    /// Remote key.
    pub fn rkey(&self) -> Rkey {
        self.inner.info.rkey
    }
    /// Virtual address of byte 0 (the registered memory's own address, or the `iova` of
    /// [`reg_mr_raw_iova`](crate::Pd::reg_mr_raw_iova)).
    pub fn addr(&self) -> u64 {
        self.inner.info.addr
    }
    /// Length in bytes.
    pub fn length(&self) -> u64 {
        self.inner.info.length
    }
    /// True when the memory is on hugetlb (2 MiB) pages.
    pub fn is_huge(&self) -> bool {
        self.inner.huge
    }

    /// An SGE for `len` bytes at byte `offset` (not checked here: the engine checks SGEs against the MR and reports
    /// violations as completions, `STYLE.md` V3).
    pub fn sge(&self, offset: u64, len: u32) -> Sge {
        Sge {
            addr: self.addr().wrapping_add(offset),
            length: len,
            lkey: self.lkey(),
        }
    }

    /// Copies `len` bytes from byte `offset` of the registered memory: one bulk copy in the calling thread that
    /// forms no reference to the memory (as [`MrBuf::read`](crate::MrBuf::read); bytes a WR or a peer is writing
    /// meanwhile may be old or new). Errors: `InvalidArgument` (range outside the MR, or the MR was deregistered —
    /// a raw registration's memory may be gone then).
    pub fn read(&self, offset: usize, len: usize) -> Result<Vec<u8>, Error> {
        self.range_ok(offset, len)?;
        let mut v = vec![0u8; len];
        let _g = self.inner.region.app_read();
        self.registered_ok()?;
        self.inner.region.read(offset, &mut v).map_err(|_| {
            Error::InvalidArgument(
                "registered memory could not be accessed (unmapped or protected)",
            )
        })?;
        Ok(v)
    }

    /// Copies `data` into the registered memory at byte `offset` (as [`read`](Self::read); `data` may even lie
    /// inside this MR). Copies through the MRs and the [`MrBuf`](crate::MrBuf) of one memory never interleave.
    /// Errors: `InvalidArgument` (range outside the MR, the MR was deregistered, or it was registered without
    /// LOCAL_WRITE — a raw registration's memory may be read-only then).
    pub fn write(&self, offset: usize, data: &[u8]) -> Result<(), Error> {
        self.range_ok(offset, data.len())?;
        if !self.inner.access.contains(AccessFlags::LOCAL_WRITE) {
            return Err(Error::InvalidArgument("MR registered without LOCAL_WRITE"));
        }
        let _g = self.inner.region.app_write();
        self.registered_ok()?;
        self.inner.region.write(offset, data).map_err(|_| {
            Error::InvalidArgument(
                "registered memory could not be accessed (unmapped or protected)",
            )
        })
    }

    fn range_ok(&self, offset: usize, len: usize) -> Result<(), Error> {
        match offset.checked_add(len) {
            Some(end) if end <= self.inner.region.len() => Ok(()),
            _ => Err(Error::InvalidArgument("range outside the MR")),
        }
    }

    /// Call with the region's application lock held (`dereg` clears the flag under it).
    fn registered_ok(&self) -> Result<(), Error> {
        if self.inner.registered.load(Ordering::Acquire) {
            Ok(())
        } else {
            Err(Error::InvalidArgument("MR deregistered"))
        }
    }

    /// `ibv_dereg_mr`. Refused while work requests that name the MR are in flight (posted and not yet completed, or
    /// a READ/atomic the responder still replays): the MR comes back with [`Error::Busy`] (`EBUSY`, see
    /// [`Error::errno`]), and the caller tries again after polling their completions. Work posted before this call
    /// counts even if the runtime had not handed it to the engine yet. Other handles cloned from this one become
    /// dead keys (a later WR naming them completes with a protection error). Refused with
    /// `Resource(InvalidArgument)` (`EINVAL`) while a memory window is bound to the MR, as rxe's `rxe_dereg_mr`
    /// ([`Engine::mr_has_bound_mw`](roce_proto::Engine::mr_has_bound_mw)): unbind or free the window first.
    pub fn dereg(self) -> Result<(), (Mr, Error)> {
        let lkey = self.lkey();
        // Held until `registered` is cleared: a clone's `read`/`write` either finishes before the engine lets go of
        // the memory or sees the flag cleared (issue #22 item 3). The engine never takes this lock.
        let guard = self.inner.region.app_write();
        let r = self.inner.pd.inner.ctx.call(move |d| {
            d.drain_all_posted();
            if d.engine.mr_has_bound_mw(lkey) {
                return Err(ResourceError::InvalidArgument(
                    "memory windows are bound to the MR",
                ));
            }
            d.engine.dereg_mr(lkey).map(drop)
        });
        if matches!(r, Ok(Ok(()))) {
            self.inner.registered.store(false, Ordering::Release);
        }
        drop(guard);
        match r {
            Ok(Ok(())) => Ok(()),
            Ok(Err(ResourceError::Busy(what))) => Err((self, Error::Busy(what))),
            Ok(Err(e)) => Err((self, Error::Resource(e))),
            Err(e) => Err((self, e)),
        }
    }

    /// `ibv_rereg_mr` in place ([`Engine::rereg_mr`](roce_proto::Engine::rereg_mr)): the MR keeps its keys and
    /// gets the PD `pd`, the access `access` and, with `translation` = `Some((region, iova))`, that memory at
    /// virtual address `iova`. Returns the new handle; this one and its clones then act as deregistered (their
    /// copies fail, dropping them deregisters nothing). Work posted before the call counts (WQEs not yet started
    /// that the new PD or memory no longer covers fail with a protection error). Errors: `InvalidArgument` (a PD of
    /// another context, or this handle no longer registered), the engine's (`InvalidArgument` as `reg_mr`), the
    /// runtime's (a dead context); on error the MR is unchanged.
    pub(crate) fn rereg_region(
        &self,
        pd: &Pd,
        access: AccessFlags,
        translation: Option<(Arc<crate::memory::Region>, u64)>,
    ) -> Result<Mr, Error> {
        if !Arc::ptr_eq(&pd.inner.ctx.inner, &self.inner.pd.inner.ctx.inner) {
            return Err(Error::InvalidArgument("PD of another context"));
        }
        let lkey = self.lkey();
        let pdh = pd.inner.handle;
        let (region, mem) = match &translation {
            Some((r, iova)) => (
                Arc::clone(r),
                Some((
                    MrBuffer::new(crate::memory::SharedMemory(Arc::clone(r))),
                    *iova,
                )),
            ),
            None => (Arc::clone(&self.inner.region), None),
        };
        // Held until `registered` is cleared, as in `dereg`: a clone's copy finishes before the memory changes.
        let guard = self.inner.region.app_write();
        self.registered_ok()?;
        let r = self.inner.pd.inner.ctx.call(move |d| {
            d.drain_all_posted();
            d.engine
                .rereg_mr(lkey, pdh, access, mem)
                .map(|(info, _old)| info)
        })?;
        let info = r?;
        self.inner.registered.store(false, Ordering::Release);
        drop(guard);
        Ok(Mr {
            inner: Arc::new(MrInner {
                pd: pd.clone(),
                info,
                huge: region.is_huge(),
                access,
                region,
                registered: AtomicBool::new(true),
            }),
        })
    }

    /// `ibv_dereg_mr` with the kernel's semantics (the C library's): succeeds while WRs name the MR. Their QPs go
    /// to ERR, the first WR naming the MR completing with `LocProtErr` ([`Engine::dereg_mr_invalidate`]
    /// (roce_proto::Engine::dereg_mr_invalidate)); the key is dead at once, and the engine never touches the
    /// memory after this returns. Work posted before this call counts. Errors: the MR comes back with the
    /// runtime's error (a dead context) or the engine's (`InvalidHandle`: already deregistered; `InvalidArgument`,
    /// `EINVAL`: a memory window is bound to the MR, as rxe's `rxe_dereg_mr`).
    pub fn dereg_invalidate(self) -> Result<(), (Mr, Error)> {
        let lkey = self.lkey();
        let r = self.inner.pd.inner.ctx.call(move |d| {
            d.drain_all_posted();
            d.engine.dereg_mr_invalidate(lkey).map(drop)
        });
        match r {
            Ok(Ok(())) => {
                self.inner.registered.store(false, Ordering::Release);
                Ok(())
            }
            Ok(Err(e)) => Err((self, Error::Resource(e))),
            Err(e) => Err((self, e)),
        }
    }
}

#[derive(Debug)]
struct AhInner {
    pd: Pd,
    handle: AhHandle,
}

impl Drop for AhInner {
    fn drop(&mut self) {
        let h = self.handle;
        self.pd.inner.ctx.cast(move |d| {
            let _ = d.engine.destroy_ah(h);
        });
    }
}

/// An address handle (`ibv_ah`) for UD sends.
#[derive(Clone, Debug)]
pub struct Ah {
    inner: Arc<AhInner>,
}

impl Ah {
    /// The engine handle to put into [`roce_proto::UdDest::ah`]; valid while this `Ah` lives.
    pub fn handle(&self) -> AhHandle {
        self.inner.handle
    }
}

struct CqInner {
    ctx: Context,
    handle: CqHandle,
    slot: u32,
    ring: Mutex<rtrb::Consumer<Wc>>,
    armed: Arc<AtomicBool>,
    arm_pending: Arc<AtomicBool>,
    /// Caller mode: engine time (ns) since which polls of this CQ have found nothing and their passes did nothing
    /// ([`runner::NOT_IDLE`] while completions or work come); decides when a poller gives its core away
    /// ([`Shared::poll_idle`](runner::Shared::poll_idle)).
    idle_since: AtomicU64,
}

impl std::fmt::Debug for CqInner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cq")
            .field("handle", &self.handle)
            .finish_non_exhaustive()
    }
}

impl Drop for CqInner {
    fn drop(&mut self) {
        let (h, slot) = (self.handle, self.slot);
        self.ctx.cast(move |d| {
            d.remove_cq(slot);
            if let Err(e) = d.engine.destroy_cq(h) {
                tracing::warn!(error = %e, "destroy_cq failed");
            }
        });
    }
}

/// A completion queue (`ibv_cq`).
#[derive(Clone, Debug)]
pub struct Cq {
    inner: Arc<CqInner>,
}

impl Cq {
    /// `ibv_resize_cq`: the CQ holds `depth` completions from now on (grown or shrunk; its ring between the passes
    /// and [`poll`](Self::poll) too), keeping every completion queued, in order ([`Engine::resize_cq`]
    /// (roce_proto::Engine::resize_cq)). Errors (nothing changed): `InvalidArgument` for `depth` outside
    /// 1..=`max_cqe` or below the completions queued (rxe `rxe_cq_chk_attr`), the runtime's (a dead context).
    pub fn resize(&self, depth: u32) -> Result<(), Error> {
        let mut ring = self.inner.ring.lock().unwrap_or_else(|p| p.into_inner());
        // A one-entry stand-in while the device thread moves the queued completions into the new ring.
        let (_, standin) = rtrb::RingBuffer::<Wc>::new(1);
        let mut old = std::mem::replace(&mut *ring, standin);
        let (h, slot) = (self.inner.handle, self.inner.slot);
        let r = self.inner.ctx.call(move |d| {
            let Some(Some(s)) = d.cqs.get_mut(slot as usize) else {
                return Err((old, Error::InvalidArgument("CQ destroyed")));
            };
            let held = old.slots() + s.synthetic.len();
            if let Err(e) = d.engine.resize_cq(h, depth, held) {
                return Err((old, Error::Resource(e)));
            }
            // Sized only once the engine accepted `depth` (as `create_cq`).
            let (mut prod, cons) = rtrb::RingBuffer::<Wc>::new(depth as usize);
            while let Ok(wc) = old.pop() {
                // Fits: the engine checked `depth` against everything queued.
                let _ = prod.push(wc);
            }
            s.ring = prod;
            Ok(cons)
        });
        match r {
            Ok(Ok(cons)) => {
                *ring = cons;
                Ok(())
            }
            Ok(Err((old, e))) => {
                *ring = old;
                Err(e)
            }
            // The call never ran (a dead context): the closure and the old consumer are gone with it.
            Err(e) => Err(e),
        }
    }

    /// `ibv_poll_cq`: moves up to `out.len()` completions into `out`; returns how many (0 = empty, not an error,
    /// `STYLE.md` V6). Reads the CQ ring first (no progress lock); in [`ProgressMode::Caller`] an empty ring makes
    /// this thread run a pass (receive, process, complete) and read again. Concurrent pollers of one CQ serialise
    /// on the ring's mutex.
    ///
    /// Caller mode: once polls of this CQ have found nothing (and their passes did nothing) for
    /// [`RuntimeConfig::spin`], each further empty poll yields the core (`sched_yield`) before returning, so an
    /// application spinning on `poll` lets the thread that must answer it run (the peer of a ping-pong on this host,
    /// the lock holder it handed its pass to) instead of holding the core until the scheduler preempts it
    /// (`runner` module docs, "Who runs it").
    pub fn poll(&self, out: &mut [Wc]) -> usize {
        let sh = self.inner.ctx.shared();
        let n = self.take(out);
        if sh.mode() != ProgressMode::Caller {
            return n;
        }
        if n > 0 {
            sh.poll_idle(&self.inner.idle_since, true);
            sh.note_poll(true);
            return n;
        }
        let (work, handed_over) = sh.progress_for(PassKind::Poll);
        // Handed over: another thread holds the progress lock (and runs the pass for us); if it was preempted on
        // this core, spinning would only keep it off the CPU.
        if sh.poll_idle(&self.inner.idle_since, work) || handed_over {
            std::thread::yield_now();
        }
        let n = self.take(out);
        if n > 0 {
            sh.poll_idle(&self.inner.idle_since, true);
        }
        sh.note_poll(n > 0);
        n
    }

    /// Moves what the ring holds (at most `out.len()`) into `out`.
    fn take(&self, out: &mut [Wc]) -> usize {
        let Ok(mut ring) = self.inner.ring.lock() else {
            return 0;
        };
        let n = out.len().min(ring.slots());
        if n == 0 {
            return 0;
        }
        let Ok(chunk) = ring.read_chunk(n) else {
            return 0;
        };
        let (a, b) = chunk.as_slices();
        out[..a.len()].copy_from_slice(a);
        out[a.len()..a.len() + b.len()].copy_from_slice(b);
        chunk.commit_all();
        n
    }

    /// `ibv_req_notify_cq`: arms the CQ so that its channel gets one event under the CQ's moderation rule. Poll the
    /// CQ after arming: completions published before the arm do count toward the moderation limits.
    pub fn req_notify(&self) {
        self.inner.armed.store(true, Ordering::SeqCst);
        // The arm doorbell: the next pass evaluates this CQ's moderation (no allocation; in Caller mode that pass runs
        // now, in this thread).
        self.inner.ctx.shared().ring_arm(
            self.inner.ctx.inner.dev,
            self.inner.slot,
            &self.inner.arm_pending,
        );
    }

    /// The device of this CQ.
    pub fn context(&self) -> &Context {
        &self.inner.ctx
    }

    /// An id for this CQ, as returned by [`CompChannel::get_event`].
    pub fn id(&self) -> u32 {
        self.inner.handle.0
    }
}

struct QpInner {
    pd: Pd,
    send_cq: Cq,
    recv_cq: Cq,
    qpn: Qpn,
    qp_type: QpType,
    cap: QpCap,
    slot: u32,
    sq: Mutex<WqeProducer<SendWqe>>,
    rq: Mutex<WqeProducer<RecvWqe>>,
    /// Receive-queue accounting under `rq`'s lock (`Qp::post_recv`).
    rq_count: Mutex<RqCount>,
    pending: Arc<AtomicBool>,
    /// WRs outstanding on each queue (ring + engine), capped at the granted depths.
    credits: Arc<WrCredits>,
    /// The SRQ the QP receives from (kept alive by the QP, as the kernel's use count does).
    srq: Option<crate::Srq>,
}

impl std::fmt::Debug for QpInner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Qp")
            .field("qpn", &self.qpn)
            .field("qp_type", &self.qp_type)
            .finish_non_exhaustive()
    }
}

impl Drop for QpInner {
    fn drop(&mut self) {
        let (qpn, slot) = (self.qpn, self.slot);
        self.pd.inner.ctx.cast(move |d| {
            if let Some(s) = d.qps.get_mut(slot as usize) {
                *s = None;
            }
            d.qp_slots.remove(&qpn);
            // The handle is gone: its multicast attachments go with it (and the link leaves emptied groups).
            for g in d.engine.mcast_groups_of(qpn) {
                if d.engine.detach_mcast(qpn, g) == Ok(true) {
                    let _ = d.link.join_multicast(gid_ip(g), false);
                }
            }
            if let Err(e) = d.engine.destroy_qp(qpn) {
                tracing::warn!(error = %e, "destroy_qp failed");
            }
        });
        let _ = (&self.send_cq, &self.recv_cq);
    }
}

/// The IP address a GID stands for (IPv4-mapped GIDs: the IPv4 address; `ROCEV2.md §1.2`).
fn gid_ip(g: Gid) -> std::net::IpAddr {
    match g.as_ipv4() {
        Some(v4) => std::net::IpAddr::from(v4),
        None => std::net::IpAddr::from(g.0),
    }
}

/// The peer-visible parameters of a QP, exchanged out of band before connecting (`STYLE.md` V7).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpEndpoint {
    /// QP number.
    pub qpn: Qpn,
    /// First PSN the QP will send (the peer's expected receive PSN).
    pub psn: Psn,
    /// Port GID (IPv4-mapped for IPv4).
    pub gid: Gid,
    /// Port MAC address.
    pub mac: [u8; 6],
}

/// Parameters of [`Qp::connect`] (RESET→INIT→RTR→RTS), with perftest-like defaults.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectOpts {
    /// Path MTU.
    pub mtu: Mtu,
    /// Responder access (REMOTE_WRITE / REMOTE_READ / REMOTE_ATOMIC).
    pub access: AccessFlags,
    /// Local ACK timeout exponent (4.096 µs · 2^n; `ROCEV2.md §4.2`). Not used by
    /// [`ConnectionManager::connect`](crate::cm::ConnectionManager::connect) / `accept`: their QPs take the value
    /// the CM exchanged (17 with rdma_cm's ACK delay and packet lifetime).
    pub timeout: u8,
    /// Transport retries (IBTA count).
    pub retry_cnt: u8,
    /// RNR retries (7 = infinite).
    pub rnr_retry: u8,
    /// RNR timer code sent in RNR NAKs.
    pub min_rnr_timer: u8,
    /// Outstanding READ/atomic as initiator and as responder.
    pub rd_atomic: u8,
    /// Source GID index.
    pub sgid_index: u8,
    /// Traffic class (DSCP << 2).
    pub traffic_class: u8,
}

impl Default for ConnectOpts {
    /// MTU 1024, all remote access, timeout 14 (≈67 ms), 7 retries, infinite RNR retries with the shortest RNR
    /// timer (code 1, 0.01 ms), 16 outstanding READ/atomic.
    fn default() -> Self {
        ConnectOpts {
            mtu: Mtu::Mtu1024,
            access: AccessFlags::REMOTE_WRITE
                | AccessFlags::REMOTE_READ
                | AccessFlags::REMOTE_ATOMIC,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 1,
            rd_atomic: 16,
            sgid_index: 0,
            traffic_class: 0,
        }
    }
}

/// A queue pair (`ibv_qp`).
#[derive(Clone, Debug)]
pub struct Qp {
    inner: Arc<QpInner>,
}

impl Qp {
    /// QP number.
    pub fn qpn(&self) -> Qpn {
        self.inner.qpn
    }
    /// Transport type.
    pub fn qp_type(&self) -> QpType {
        self.inner.qp_type
    }
    /// Granted capabilities.
    pub fn cap(&self) -> QpCap {
        self.inner.cap
    }
    /// The SRQ the QP takes its receive WQEs from, if any.
    pub fn srq(&self) -> Option<&crate::Srq> {
        self.inner.srq.as_ref()
    }
    fn ctx(&self) -> &Context {
        &self.inner.pd.inner.ctx
    }

    /// The device of this QP.
    pub fn context(&self) -> &Context {
        self.ctx()
    }

    /// This QP's endpoint record for the peer, with first send PSN `psn`.
    pub fn endpoint(&self, psn: Psn) -> QpEndpoint {
        let cfg = self.ctx().config();
        QpEndpoint {
            qpn: self.qpn(),
            psn,
            gid: cfg.gids.first().copied().unwrap_or_default(),
            mac: cfg.mac,
        }
    }

    /// Run-to-completion: in [`ProgressMode::Caller`], a pass in this thread right after the doorbell (the QP's
    /// packets leave before the post returns, as far as the pass budget allows; if another thread is driving the
    /// engine, it runs the pass for us).
    fn kick(&self) {
        self.kick_for(PassKind::Post);
    }

    fn kick_for(&self, kind: PassKind) {
        let sh = self.ctx().shared();
        if sh.mode() == ProgressMode::Caller {
            sh.progress_for(kind);
        }
    }

    /// Room for WRs on a queue of granted depth `max` whose outstanding count is `out` ([`WrCredits`]) and whose
    /// ring has `ring_free` free entries. When the count says full, the pass may not yet have given back the slots
    /// of WRs the engine retired without a completion of theirs being published (unsignaled WRs, a reset QP): the
    /// engine is asked once (under the progress lock, on this slow path only) before the post is refused.
    /// `wanted`: the WRs of the chain.
    fn room(&self, out: &AtomicU32, max: u32, ring_free: usize, wanted: usize) -> usize {
        let free = |o: &AtomicU32| max.saturating_sub(o.load(Ordering::Acquire)) as usize;
        let mut f = free(out);
        if f < wanted {
            let slot = self.inner.slot;
            let _ = self.ctx().call(move |d| d.release_credits(slot));
            f = free(out);
        }
        f.min(ring_free)
    }

    /// `ibv_post_send` of a chain: every WR is copied into the send ring, then **one** doorbell is rung; in
    /// [`ProgressMode::Caller`] this thread then runs a pass (crate docs, "Progress"). All or nothing: on error
    /// nothing was posted.
    pub fn post_send(&self, wrs: &[SendWr<'_>]) -> Result<(), PostError> {
        let cap = self.inner.cap;
        let mut ring = self.inner.sq.lock().unwrap_or_else(|p| p.into_inner());
        let free = self.room(
            &self.inner.credits.sq,
            cap.max_send_wr,
            ring.slots(),
            wrs.len(),
        );
        if free < wrs.len() {
            return Err(PostError::QueueFull {
                free,
                wanted: wrs.len(),
            });
        }
        // Validate the whole chain before publishing any of it.
        for wr in wrs {
            if wr.sg_list.len() > cap.max_send_sge.max(1) as usize {
                return Err(PostError::TooManySges);
            }
            let inline: usize = wr.inline_data.iter().map(|p| p.len()).sum();
            if inline > cap.max_inline_data as usize {
                return Err(PostError::InlineTooLong);
            }
        }
        for wr in wrs {
            let wqe = SendWqe::from_wr(wr)?;
            // Room was checked under the lock; the SGE ring has room for every entry's SGEs.
            ring.push(wqe, wr.sg_list)?;
        }
        self.inner
            .credits
            .sq
            .fetch_add(wrs.len() as u32, Ordering::AcqRel);
        drop(ring);
        self.ctx().shared().ring(
            self.ctx().inner.dev,
            self.inner.slot,
            &self.inner.pending,
            wrs.len(),
        );
        self.kick();
        Ok(())
    }

    /// `ibv_post_recv` of a chain (one doorbell). A QP on an SRQ refuses it ([`PostError::QpOnSrq`]).
    pub fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<(), PostError> {
        if self.inner.srq.is_some() {
            return Err(PostError::QpOnSrq);
        }
        let cap = self.inner.cap;
        let mut ring = self.inner.rq.lock().unwrap_or_else(|p| p.into_inner());
        let free = self.room(
            &self.inner.credits.rq,
            cap.max_recv_wr,
            ring.slots(),
            wrs.len(),
        );
        if free < wrs.len() {
            return Err(PostError::QueueFull {
                free,
                wanted: wrs.len(),
            });
        }
        // The ring and the engine's queue hold `max_recv_wr` each: count what is outstanding in both, so a post
        // beyond `max_recv_wr` is refused as on an RNIC (ibv_post_recv(3): ENOMEM). `known + since` bounds it from
        // above (completions only lower it); only when that bound says full, the device counts exactly.
        let mut count = self
            .inner
            .rq_count
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let want = wrs.len() as u64;
        let max = u64::from(cap.max_recv_wr);
        if count.known + count.since + want > max {
            let (qpn, slot) = (self.qpn(), self.inner.slot);
            let exact = self
                .ctx()
                .call(move |d| {
                    let ring = d
                        .qps
                        .get(slot as usize)
                        .and_then(Option::as_ref)
                        .map_or(0, |s| s.rq.len());
                    ring as u64 + u64::from(d.engine.rq_len(qpn).unwrap_or(0))
                })
                .map_err(|_| PostError::QueueFull {
                    free: 0,
                    wanted: wrs.len(),
                })?;
            count.known = exact;
            count.since = 0;
            if exact + want > max {
                return Err(PostError::QueueFull {
                    free: max.saturating_sub(exact) as usize,
                    wanted: wrs.len(),
                });
            }
        }
        count.since += want;
        drop(count);
        if wrs
            .iter()
            .any(|w| w.sg_list.len() > cap.max_recv_sge.max(1) as usize)
        {
            return Err(PostError::TooManySges);
        }
        for wr in wrs {
            ring.push(RecvWqe::from_wr(wr)?, wr.sg_list)?;
        }
        self.inner
            .credits
            .rq
            .fetch_add(wrs.len() as u32, Ordering::AcqRel);
        drop(ring);
        self.ctx().shared().ring(
            self.ctx().inner.dev,
            self.inner.slot,
            &self.inner.pending,
            wrs.len(),
        );
        self.kick_for(PassKind::Recv);
        Ok(())
    }

    /// Waits until every WR posted so far has been handed to the engine (as far as its queues have room), so a
    /// receive posted before this call is guaranteed to be there when the next packet is processed. Posting
    /// itself is asynchronous (a ring push); use this before telling a peer over another channel that receives
    /// are ready (UC/UD have no RNR retry).
    pub fn sync(&self) -> Result<(), Error> {
        let slot = self.inner.slot;
        self.ctx().call(move |d| {
            d.drain_qp(slot);
        })
    }

    /// `ibv_modify_qp`.
    pub fn modify(&self, attr: &QpAttr, mask: QpAttrMask) -> Result<(), Error> {
        let (qpn, attr) = (self.qpn(), *attr);
        self.ctx()
            .call(move |d| d.engine.modify_qp(qpn, &attr, mask))??;
        if mask.contains(QpAttrMask::STATE) && attr.qp_state == QpState::Reset {
            self.clean_cqs();
        }
        Ok(())
    }

    /// After a move to RESET: the QP's completions still queued on its CQs (engine CQ, the runtime ring, the
    /// runtime's own completions) are removed, the others kept in order ([`Engine::clean_cq`]
    /// (roce_proto::Engine::clean_cq), as mlx5's `mlx5_cq_clean`). The rings are locked in slot order.
    fn clean_cqs(&self) {
        let qpn = self.qpn();
        let (s, r) = (&self.inner.send_cq.inner, &self.inner.recv_cq.inner);
        let mut cqs = vec![s];
        if !Arc::ptr_eq(s, r) {
            cqs.push(r);
        }
        cqs.sort_by_key(|c| c.slot);
        let mut rings: Vec<_> = cqs
            .iter()
            .map(|c| c.ring.lock().unwrap_or_else(|p| p.into_inner()))
            .collect();
        let _ = self.ctx().call(|d| {
            for (c, ring) in cqs.iter().zip(rings.iter_mut()) {
                d.engine.clean_cq(c.handle, qpn);
                let Some(Some(slot)) = d.cqs.get_mut(c.slot as usize) else {
                    continue;
                };
                slot.synthetic.retain(|wc| wc.qp_num != qpn);
                // The device thread is not producing now: take everything, give back the others in order (they
                // fit: the ring held them).
                let n = ring.slots();
                for _ in 0..n {
                    if let Ok(wc) = ring.pop()
                        && wc.qp_num != qpn
                    {
                        let _ = slot.ring.push(wc);
                    }
                }
            }
        });
    }

    /// `ibv_attach_mcast`: attaches this UD QP to the multicast group `mgid` ([`Engine::attach_mcast`]
    /// (roce_proto::Engine::attach_mcast): rxe's rules and limits); the first QP of the device to attach to a group
    /// joins the IP group on the device's link ([`roce_link::Link::join_multicast`]: the IGMP/MLD join of Linux's
    /// rdma_cm for RoCE), so frames sent to it arrive. Attaching again does nothing.
    ///
    /// Errors: [`Error::Resource`] (`InvalidArgument` for a non-UD QP or a non-multicast GID: EINVAL; `Exhausted` past
    /// the device's multicast limits: ENOMEM); [`Error::Link`] when the link cannot join (EIO; the attach is undone).
    pub fn attach_mcast(&self, mgid: Gid) -> Result<(), Error> {
        let qpn = self.qpn();
        self.ctx().call(move |d| -> Result<(), Error> {
            if d.engine.attach_mcast(qpn, mgid)?
                && let Err(e) = d.link.join_multicast(gid_ip(mgid), true)
            {
                let _ = d.engine.detach_mcast(qpn, mgid);
                return Err(Error::Link(LinkError::Io(e)));
            }
            Ok(())
        })?
    }

    /// `ibv_detach_mcast`: detaches this QP from `mgid`; the last QP of the device to leave a group leaves the IP
    /// group on the link.
    ///
    /// Errors: [`Error::Resource`] `InvalidArgument` (EINVAL, as rxe) for a non-UD QP, a non-multicast GID, or a
    /// group the QP is not attached to.
    pub fn detach_mcast(&self, mgid: Gid) -> Result<(), Error> {
        let qpn = self.qpn();
        self.ctx().call(move |d| -> Result<(), Error> {
            if d.engine.detach_mcast(qpn, mgid)?
                && let Err(e) = d.link.join_multicast(gid_ip(mgid), false)
            {
                tracing::warn!(error = %e, "leaving multicast group {mgid}");
            }
            Ok(())
        })?
    }

    /// The multicast groups this QP is attached to (`ibv_destroy_qp` is refused while there are any: rxe
    /// `rxe_qp_chk_destroy`). A QP dropped while attached is detached first.
    pub fn mcast_groups(&self) -> Result<Vec<Gid>, Error> {
        let qpn = self.qpn();
        self.ctx().call(move |d| d.engine.mcast_groups_of(qpn))
    }

    /// `ibv_query_qp`.
    pub fn query(&self) -> Result<QpAttr, Error> {
        let qpn = self.qpn();
        self.ctx()
            .call(move |d| d.engine.query_qp(qpn))?
            .ok_or(Error::InvalidArgument("QP is gone"))
    }

    /// RC/UC: RESET→INIT→RTR→RTS towards `remote`, sending from `local_psn` (ibverbs `handshake`, `STYLE.md` V5).
    pub fn connect(
        &self,
        remote: &QpEndpoint,
        local_psn: Psn,
        o: &ConnectOpts,
    ) -> Result<(), Error> {
        let rc = match self.qp_type() {
            QpType::Rc => true,
            QpType::Uc => false,
            QpType::Ud => return Err(Error::InvalidArgument("connect is for RC/UC; use ready_ud")),
        };
        let access = if rc {
            o.access
        } else {
            o.access & AccessFlags::REMOTE_WRITE
        };
        let init = QpAttr {
            qp_state: QpState::Init,
            pkey_index: 0,
            port_num: 1,
            qp_access_flags: access,
            ..QpAttr::default()
        };
        self.modify(
            &init,
            QpAttrMask::STATE
                | QpAttrMask::PKEY_INDEX
                | QpAttrMask::PORT
                | QpAttrMask::ACCESS_FLAGS,
        )?;
        let rtr = QpAttr {
            qp_state: QpState::Rtr,
            ah_attr: AhAttr {
                dgid: remote.gid,
                sgid_index: o.sgid_index,
                traffic_class: o.traffic_class,
                hop_limit: 64,
                flow_label: 0,
                dmac: remote.mac,
            },
            path_mtu: o.mtu,
            dest_qp_num: remote.qpn,
            rq_psn: remote.psn,
            max_dest_rd_atomic: o.rd_atomic,
            min_rnr_timer: o.min_rnr_timer,
            ..QpAttr::default()
        };
        let mut mask = QpAttrMask::STATE
            | QpAttrMask::AV
            | QpAttrMask::PATH_MTU
            | QpAttrMask::DEST_QPN
            | QpAttrMask::RQ_PSN;
        if rc {
            mask |= QpAttrMask::MAX_DEST_RD_ATOMIC | QpAttrMask::MIN_RNR_TIMER;
        }
        self.modify(&rtr, mask)?;
        let rts = QpAttr {
            qp_state: QpState::Rts,
            sq_psn: local_psn,
            timeout: o.timeout,
            retry_cnt: o.retry_cnt,
            rnr_retry: o.rnr_retry,
            max_rd_atomic: o.rd_atomic,
            ..QpAttr::default()
        };
        let mut mask = QpAttrMask::STATE | QpAttrMask::SQ_PSN;
        if rc {
            mask |= QpAttrMask::TIMEOUT
                | QpAttrMask::RETRY_CNT
                | QpAttrMask::RNR_RETRY
                | QpAttrMask::MAX_QP_RD_ATOMIC;
        }
        self.modify(&rts, mask)
    }

    /// UD: RESET→INIT (Q_Key `qkey`)→RTR→RTS sending from `psn`.
    pub fn ready_ud(&self, qkey: u32, psn: Psn) -> Result<(), Error> {
        if self.qp_type() != QpType::Ud {
            return Err(Error::InvalidArgument("ready_ud is for UD QPs"));
        }
        let a = QpAttr {
            qp_state: QpState::Init,
            pkey_index: 0,
            port_num: 1,
            qkey,
            ..QpAttr::default()
        };
        self.modify(
            &a,
            QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::QKEY,
        )?;
        self.modify(
            &QpAttr {
                qp_state: QpState::Rtr,
                ..QpAttr::default()
            },
            QpAttrMask::STATE,
        )?;
        self.modify(
            &QpAttr {
                qp_state: QpState::Rts,
                sq_psn: psn,
                ..QpAttr::default()
            },
            QpAttrMask::STATE | QpAttrMask::SQ_PSN,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use roce_proto::{SendOp, WcStatus};
    use std::sync::mpsc;
    use std::time::Duration;

    /// More QPs ring at once than the doorbell queue holds (its minimum is 64 entries, and `max_qp` / `max_cq` are
    /// configured small): the producers flag an overflow, the next pass looks at every QP once, and every
    /// WR still completes.
    #[test]
    fn doorbell_overflow_falls_back_to_one_pass_over_all_qps() {
        let cfg = |i: u8| EngineConfig {
            mac: [0x02, 0, 0, 0, 0, i],
            gids: vec![Gid::from_ipv4([192, 0, 2, i])],
            seed: u64::from(i),
            device: DeviceAttr {
                max_qp: 8,
                max_cq: 8,
                ..DeviceAttr::default()
            },
            ..EngineConfig::default()
        };
        let (a, b) = (cfg(1), cfg(2));
        let (ma, mb) = (a.mac, b.mac);
        let mut v = Context::open_group(
            vec![a, b],
            RuntimeConfig::default(),
            Box::new(move || {
                let (_net, pa, pb) = SimNet::pair(SimConfig::default(), ma, mb);
                Ok(vec![Box::new(pa) as SendLink, Box::new(pb)])
            }),
        )
        .expect("open");
        let (cb, ca) = (v.pop().expect("b"), v.pop().expect("a"));
        let (pda, pdb) = (ca.alloc_pd().expect("pd"), cb.alloc_pd().expect("pd"));
        let (cqa, cqb) = (
            ca.create_cq(64, None, Moderation::default()).expect("cq"),
            cb.create_cq(64, None, Moderation::default()).expect("cq"),
        );
        let cap = QpCap {
            max_send_wr: 16,
            max_recv_wr: 1,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
        let (bufa, bufb) = (
            crate::MrBuf::new(64).expect("buf"),
            crate::MrBuf::new(64).expect("buf"),
        );
        let mra = pda.reg_mr(&bufa, access).expect("mr");
        let mrb = pdb.reg_mr(&bufb, access).expect("mr");
        let mut qps = Vec::new();
        for i in 0..8u32 {
            let qa = pda
                .create_qp(QpType::Rc, &cqa, &cqa, cap, false)
                .expect("qp a");
            let qb = pdb
                .create_qp(QpType::Rc, &cqb, &cqb, cap, false)
                .expect("qp b");
            let (pa, pb) = (Psn::new(10 + i), Psn::new(500 + i));
            let o = ConnectOpts::default();
            qa.connect(&qb.endpoint(pb), pa, &o).expect("connect a");
            qb.connect(&qa.endpoint(pa), pb, &o).expect("connect b");
            qps.push((qa, qb));
        }
        // Hold the progress lock (a control verb in another thread) so that no doorbell is consumed while the QPs
        // ring: the posts' own passes find the lock held and hand over (`missed`). With one entry per QP the
        // 64-entry queue cannot fill, so QPs 0..7 clear their pending flag after each post (as a destroyed QP's
        // stale entry would leave it) and push 70 entries; QP 7 then posts once and finds the queue full: only the
        // overflow pass can find its WR.
        let (tx, rx) = mpsc::channel::<()>();
        let (held_tx, held_rx) = mpsc::channel::<()>();
        let holder = {
            let ca = ca.clone();
            std::thread::spawn(move || {
                ca.cast(move |_| {
                    let _ = held_tx.send(());
                    let _ = rx.recv_timeout(Duration::from_secs(5));
                });
            })
        };
        held_rx.recv().expect("lock held");
        let post = |qa: &Qp, id: u64| {
            let sge = [mra.sge(0, 8)];
            let wr = SendWr::new(
                id,
                SendOp::RdmaWrite {
                    remote_addr: mrb.addr(),
                    rkey: mrb.rkey(),
                },
                &sge,
            )
            .signaled();
            qa.post_send(&[wr]).expect("post");
        };
        let mut posted = 0u64;
        for round in 0..10u64 {
            for (qa, _) in &qps[..7] {
                post(qa, round);
                qa.inner.pending.store(false, Ordering::SeqCst);
                posted += 1;
            }
        }
        post(&qps[7].0, 99);
        posted += 1;
        let _ = tx.send(());
        holder.join().expect("holder");
        let mut got = 0u64;
        let mut wcs = [Wc::default(); 16];
        let t0 = std::time::Instant::now();
        let mut last_qp_done = false;
        while got < posted {
            let k = cqa.poll(&mut wcs);
            assert!(wcs[..k].iter().all(|w| w.status == WcStatus::Success));
            last_qp_done |= wcs[..k].iter().any(|w| w.qp_num == qps[7].0.qpn());
            got += k as u64;
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "{got}/{posted} completions"
            );
            std::thread::yield_now();
        }
        assert!(last_qp_done);
        assert!(
            ca.runtime_stats()
                .doorbell_overflows
                .load(Ordering::Relaxed)
                >= 1
        );
    }
}
