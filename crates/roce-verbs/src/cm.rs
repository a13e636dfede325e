//! The IB connection manager of a device, over its QP 1: connect, listen, accept, reject and disconnect RC/UC QPs
//! by service ID instead of exchanging QP numbers out of band (IBTA Vol 1 ch. 12; the layer under rdma_cm).
//!
//! Each device runs at most one sans-IO [`roce_cm::Cm`] beside its engine, created by the first
//! [`ConnectionManager::open`] and driven by the device's ordinary passes: MADs from the engine's GSI
//! ([`roce_proto::Engine::poll_mad`]) into [`roce_cm::Cm::handle_mad`], [`roce_cm::Cm::poll_transmit`] into
//! [`roce_proto::Engine::send_mad`], the CM's timeout joined with the device's next deadline (so its retries and
//! timewait run whoever drives). [`ConnectionManager`] handles are `Send + Sync` clones of one per-device state.
//!
//! # Events
//!
//! The CM's events wait in a queue: [`ConnectionManager::poll_event`] takes one, [`ConnectionManager::get_event`]
//! waits for one (driving progress meanwhile), and [`ConnectionManager::fd`] is an eventfd that is readable while
//! the queue is not empty (`poll`/`epoll`; one count per queued event, as an rdma_cm event channel). Like
//! librdmacm's `rdma_get_cm_event`, taking an event also does the work it implies (librdmacm `cma.c`
//! `ucma_process_conn_resp`): a REP for our REQ moves our QP to RTR/RTS towards the peer's QPN and starting PSN
//! and sends the RTU (the program then sees [`CmEvent::Established`] with the REP's private data); a DREQ moves
//! the QP to ERR and is answered with a DREP (as Linux `cma.c` does for `IB_CM_DREQ_RECEIVED`).
//!
//! # Addresses
//!
//! Peers are named by GID. The destination MAC of the active side comes with [`ConnectionManager::connect`]; the
//! passive side uses the MAC it was told for that GID ([`ConnectionManager::add_neighbor`], or an earlier connect)
//! and otherwise the Ethernet broadcast address (links that route by IP — UDP — ignore MACs; neighbour resolution
//! from the host's tables belongs to the rdma_cm layer, `docs/RDMACM.md`).
//!
//! # SIDR (UD service resolution, IBTA Vol 1 §12.11)
//!
//! The UD port spaces of rdma_cm (`RDMA_PS_UDP`, `RDMA_PS_IPOIB`, UD ids of `RDMA_PS_IB`) do not connect: the
//! active side asks for the service's QP with [`ConnectionManager::sidr_resolve`] (a SIDR_REQ, re-sent after the
//! CM response timeout like a REQ) and gets [`CmEvent::SidrResolved`] with what rdma_cm's ESTABLISHED event for UD
//! carries (`rdma_ud_param`: the address handle, the remote QPN and its Q_Key), [`CmEvent::SidrRejected`] with the
//! SIDR_REP's status, or [`CmEvent::Unreachable`] after all retries. The passive side listens on the service ID as
//! for connections ([`ConnectionManager::listen`]), gets [`CmEvent::SidrRequest`] and answers with
//! [`ConnectionManager::sidr_accept`] (its UD QP's number and Q_Key, [`RDMA_UDP_QKEY`] for rdma_cm's UDP port
//! space) or [`ConnectionManager::sidr_reject`]. A SIDR_REQ for a service nobody listens on is answered by the CM
//! with status 1 (unsupported service ID). The responder keeps no state once it has answered (as Linux `cm.c`
//! `ib_send_cm_sidr_rep`): a SIDR_REQ re-sent because its SIDR_REP was lost is a new [`CmEvent::SidrRequest`],
//! to be answered again; copies of a request that is still pending are dropped by the CM.
//!
//! # Callers that move their QPs themselves
//!
//! [`ConnectionManager::connect_qpn`] / [`ConnectionManager::accept_qpn`] / [`ConnectionManager::establish`] run the
//! same exchange without touching a QP (the REP arrives as [`CmEvent::ConnectResponse`]; the caller moves its QP and
//! sends the RTU): rocev2's librdmacm (crate `roce-rdmacm`) moves its QPs through libibverbs, as rdma-core's does.
//! [`ConnectionManager::sidr_accept_qpn`] answers a SIDR_REQ naming a UD QP the caller moved itself.
//! [`ConnectionManager::open_listening`] starts a device's CM and its first listen in one step.
//!
//! # Not here (yet)
//!
//! MRA from the application, alternate paths, the rdma_cm address header and port spaces (carried opaquely in
//! private data and service IDs; which QP type a port space's listener takes is the rdma_cm layer's check).

use std::collections::{HashMap, VecDeque};
use std::os::fd::RawFd;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use roce_cm::{AcceptParams, Cm, ConnectParams, Disconnect, Event, Peer};
pub use roce_cm::{CmConfig, CmStats, ConnId, ListenId};
use roce_link::wait::{Semaphore, Waiter};
use roce_proto::{Engine, GsiError, Instant, MadDest, Qpn};
use roce_wire::cm::{PathRepr, rej_reason, sidr_status, transport_type};
use roce_wire::mad::MAD_LEN;

use crate::handles::{ConnectOpts, Context, Error, Qp, QpEndpoint};
use crate::{AhAttr, Gid, Mtu, Psn, QpState, QpType};

const BROADCAST: [u8; 6] = [0xff; 6];

/// The Q_Key rdma_cm gives the UD QPs of its `RDMA_PS_UDP` and `RDMA_PS_IB` ids and announces in the SIDR_REP
/// (Linux `include/rdma/rdma_cm.h` `RDMA_UDP_QKEY`, applied by `cma.c` `cma_set_qkey`).
pub const RDMA_UDP_QKEY: u32 = 0x0123_4567;

/// Hop limit of the address handle [`CmEvent::SidrResolved`] describes (the IP TTL on RoCE v2; Linux's rxe path
/// records carry 64 too, `docs/spec/INTEROP.md` §4).
const SIDR_HOP_LIMIT: u8 = 64;

fn wire_gid(g: Gid) -> roce_wire::Gid {
    roce_wire::Gid::from_bytes(g.0)
}

fn proto_gid(g: roce_wire::Gid) -> Gid {
    Gid(g.to_bytes())
}

/// The path MTU of an IBTA MTU code (REQ `path_mtu`), `None` for codes outside 1..=5.
fn mtu_of_code(code: u8) -> Option<Mtu> {
    [
        Mtu::Mtu256,
        Mtu::Mtu512,
        Mtu::Mtu1024,
        Mtu::Mtu2048,
        Mtu::Mtu4096,
    ]
    .into_iter()
    .find(|m| *m as u8 == code)
}

/// A connection event (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CmEvent {
    /// A REQ for a service ID this device listens on: answer with [`ConnectionManager::accept`] or
    /// [`ConnectionManager::reject`].
    ConnectRequest {
        /// The new connection.
        id: ConnId,
        /// The listen it matched.
        listen: ListenId,
        /// The service ID.
        service_id: u64,
        /// The requester's GID.
        peer: Gid,
        /// The requester's QPN (our QP is connected to it on accept).
        remote_qpn: Qpn,
        /// The REQ's Starting PSN: the PSN our QP sends from once accepted (Linux `cm.c` reads it so: the
        /// requester's `rq_psn`, the responder's `sq_psn`; the REP's Starting PSN is the other direction).
        remote_psn: Psn,
        /// The REQ's private data (92 bytes, zero-padded as on the wire).
        private_data: Vec<u8>,
    },
    /// A REP for a connection made with [`ConnectionManager::connect_qpn`] (no QP handle: the caller moves its QP
    /// to RTR/RTS itself, then sends the RTU with [`ConnectionManager::establish`]; librdmacm's
    /// `RDMA_CM_EVENT_CONNECT_RESPONSE`, rdma-core `cma.c` `ucma_process_conn_resp`).
    ConnectResponse {
        /// The connection.
        id: ConnId,
        /// The responder's QPN.
        remote_qpn: Qpn,
        /// The responder's starting PSN (our RQ PSN).
        remote_psn: Psn,
        /// The REP's responder resources and initiator depth (IBTA Vol 1 §12.7.32).
        responder_resources: u8,
        /// See `responder_resources`.
        initiator_depth: u8,
        /// The REP's RNR retry count.
        rnr_retry_count: u8,
        /// The local ACK timeout (4.096 µs · 2^n) the caller's QP takes at RTS: from the REP's TargetACKDelay and
        /// the packet lifetime of our REQ, as Linux `cm.c` `cm_rep_handler` computes `av.timeout`
        /// ([`roce_cm::ack_timeout`]); the REQ announced the same computation with our own ACK delay.
        local_ack_timeout: u8,
        /// The REP's private data (196 bytes).
        private_data: Vec<u8>,
    },
    /// The connection is established: our QP is in RTS towards the peer's QP.
    Established {
        /// The connection.
        id: ConnId,
        /// Active side: the REP's private data (196 bytes); passive side: empty.
        private_data: Vec<u8>,
    },
    /// The peer rejected our REQ (or gave up on its REP); the connection is gone.
    Rejected {
        /// The connection.
        id: ConnId,
        /// IBTA REJ reason (Vol 1 §12.6.7, Table 112): 8 invalid service ID, 28 consumer reject, 4 timeout, ...
        reason: u16,
        /// The REJ's private data (148 bytes).
        private_data: Vec<u8>,
    },
    /// The connection is disconnected (a DREQ from the peer — our QP went to ERR and a DREP was sent — or the
    /// answer to ours, or our DREQ went unanswered). Timewait follows.
    Disconnected {
        /// The connection.
        id: ConnId,
    },
    /// Timewait is over: the QP may be reused.
    TimewaitExit {
        /// The connection.
        id: ConnId,
    },
    /// Our REQ or REP went unanswered after all retries (the CM sent a REJ with reason timeout), or our SIDR_REQ
    /// did.
    Unreachable {
        /// The connection.
        id: ConnId,
    },
    /// A SIDR_REQ for a service ID this device listens on (module docs, SIDR): answer with
    /// [`ConnectionManager::sidr_accept`] or [`ConnectionManager::sidr_reject`].
    SidrRequest {
        /// The exchange.
        id: ConnId,
        /// The listen it matched.
        listen: ListenId,
        /// The service ID.
        service_id: u64,
        /// The requester's GID (its IP address; datagrams from it carry it in the GRH too).
        peer: Gid,
        /// The SIDR_REQ's private data (216 bytes, zero-padded as on the wire; rdma_cm starts it with a `cma_hdr`).
        private_data: Vec<u8>,
    },
    /// Our SIDR_REQ was answered with status 0 (success): the service's UD QP, what rdma_cm's ESTABLISHED event
    /// for a UD id carries (`struct rdma_ud_param`: `ah_attr`, `qp_num`, `qkey`; Linux `cma.c`
    /// `cma_sidr_rep_handler`). The exchange is over.
    SidrResolved {
        /// The exchange.
        id: ConnId,
        /// Address handle attributes towards the responder: its GID and MAC, our source GID index, hop limit 64.
        ah: AhAttr,
        /// The service's QP number.
        qpn: Qpn,
        /// The service's Q_Key (send with it: [`RDMA_UDP_QKEY`] from rdma_cm's UDP port space).
        qkey: u32,
        /// The SIDR_REP's private data (136 bytes).
        private_data: Vec<u8>,
    },
    /// Our SIDR_REQ was answered with another status (IBTA Vol 1 §12.11, Table 120,
    /// [`roce_wire::cm::sidr_status`]: 1 unsupported service ID, 2 rejected by the service, 3 no QP, 4 redirect,
    /// 5 unsupported version); rdma_cm reports it as UNREACHABLE with this status. The exchange is over.
    SidrRejected {
        /// The exchange.
        id: ConnId,
        /// The SIDR_REP's status.
        status: u8,
        /// The SIDR_REP's private data (136 bytes).
        private_data: Vec<u8>,
    },
}

/// What the runtime remembers of a connection until it is gone.
#[derive(Clone, Debug)]
struct ConnInfo {
    qp: Option<Qp>,
    /// The Starting PSN we sent (in our REQ or REP): the PSN our QP expects the peer's first request to carry.
    psn: Psn,
    opts: ConnectOpts,
    peer: Gid,
    /// Passive side: the REQ's QPN and Starting PSN (our send PSN).
    remote: Option<(Qpn, Psn)>,
    /// Passive side: the REQ's path MTU (`None` for a code outside 1..=5), the most our QP may use.
    req_mtu: Option<Mtu>,
    rep_private: Vec<u8>,
    /// Made by [`ConnectionManager::connect_qpn`] / accepted by [`ConnectionManager::accept_qpn`]: the caller
    /// owns the QP's state changes.
    by_qpn: bool,
    /// Passive side: what the REQ asked for.
    req: Option<RequestParams>,
    /// Active side: the packet lifetime our REQ's Local ACK Timeout was computed from (with the REP's
    /// TargetACKDelay it gives our QP's ACK timeout, Linux `cm.c` `cm_rep_handler`).
    packet_life_time: Option<u8>,
}

/// What a REQ asked for (passive side; [`ConnectionManager::request_params`]), for the caller that moves its QP
/// itself (librdmacm's `rdma_init_qp_attr`, the `rdma_conn_param` of `RDMA_CM_EVENT_CONNECT_REQUEST`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequestParams {
    /// Path MTU (IBTA encoding: 1 = 256 ... 5 = 4096).
    pub path_mtu: u8,
    /// The requester's responder resources (our initiator depth at most).
    pub responder_resources: u8,
    /// The requester's initiator depth (our responder resources at most).
    pub initiator_depth: u8,
    /// Transport retry count.
    pub retry_count: u8,
    /// RNR retry count.
    pub rnr_retry_count: u8,
    /// Local ACK timeout of the primary path (4.096 µs · 2^n).
    pub local_ack_timeout: u8,
    /// Traffic class of the primary path.
    pub traffic_class: u8,
}

/// The state a device's CM shares with its handles.
#[derive(Debug)]
pub(crate) struct CmShared {
    /// Events from the pass, not yet taken (one semaphore count each).
    queue: Mutex<VecDeque<Event>>,
    sem: Semaphore,
    neighbors: Mutex<HashMap<Gid, [u8; 6]>>,
    conns: Mutex<HashMap<ConnId, ConnInfo>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl CmShared {
    fn mac_of(&self, gid: Gid) -> [u8; 6] {
        lock(&self.neighbors)
            .get(&gid)
            .copied()
            .unwrap_or(BROADCAST)
    }
}

/// The device-side half: the CM state machine and the MAD pump (lives in the device, under the progress lock).
#[derive(Debug)]
pub(crate) struct DevCm {
    cm: Cm,
    shared: Arc<CmShared>,
    buf: [u8; MAD_LEN],
    /// A MAD the GSI's send queue had no room for (retried first in the next pass).
    held: Option<(MadDest, [u8; MAD_LEN])>,
    /// The service ID of each listen (to end its steering, [`roce_link::Link::steer_service`]).
    listens: HashMap<ListenId, u64>,
}

/// Listens on `service_id` and steers its requests to this process ([`roce_link::Link::steer_service`]: on an
/// address several processes share, the kernel hands REQs and SIDR_REQs to the process that claimed the service).
/// A service another running process of the address listens on is [`roce_cm::CmError::ServiceIdInUse`] (as a second
/// listen in one CM); other steering failures are logged and the listen stays (its requests then reach this process
/// only when the kernel's hash picks it).
fn listen_steered(
    cm: &mut DevCm,
    link: &(dyn roce_link::Link + Send),
    service_id: u64,
) -> Result<ListenId, roce_cm::CmError> {
    let l = cm.cm.listen(service_id)?;
    match link.steer_service(service_id, true) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
            tracing::warn!(error = %e, "listen refused");
            cm.cm.stop_listen(l);
            return Err(roce_cm::CmError::ServiceIdInUse);
        }
        Err(e) => tracing::warn!(error = %e, service_id, "the listen's requests are not steered"),
    }
    cm.listens.insert(l, service_id);
    Ok(l)
}

impl DevCm {
    /// One round (called by every pass): received MADs in, due timers, events out to the queue, MADs to QP 1.
    pub(crate) fn drive(&mut self, engine: &mut Engine, now: Instant) -> bool {
        let mut work = false;
        while let Some(r) = engine.poll_mad(&mut self.buf) {
            let src = Peer {
                gid: wire_gid(r.src_gid),
                qpn: r.src_qp,
            };
            self.cm.handle_mad(now, src, &self.buf);
            work = true;
        }
        if self.cm.poll_timeout().is_some_and(|t| t <= now) {
            self.cm.handle_timeout(now);
            work = true;
        }
        self.flush_events();
        work | self.transmit(engine)
    }

    /// Moves the CM's events to the shared queue (one semaphore count each).
    fn flush_events(&mut self) {
        while let Some(ev) = self.cm.poll_event() {
            lock(&self.shared.queue).push_back(ev);
            self.shared.sem.post();
        }
    }

    fn transmit(&mut self, engine: &mut Engine) -> bool {
        let mut work = false;
        loop {
            if let Some((dest, mad)) = &self.held {
                match engine.send_mad(dest, mad) {
                    Ok(()) => work = true,
                    Err(GsiError::Busy) => return work,
                    Err(e) => tracing::warn!(error = %e, "CM MAD not sent"),
                }
                self.held = None;
            }
            let Some(t) = self.cm.poll_transmit(&mut self.buf) else {
                return work;
            };
            let dgid = proto_gid(t.dst.gid);
            let dest = MadDest {
                dgid,
                dmac: self.shared.mac_of(dgid),
                qpn: t.dst.qpn,
                sgid_index: 0,
            };
            self.held = Some((dest, self.buf));
        }
    }

    /// The CM's next timer.
    pub(crate) fn poll_timeout(&mut self) -> Option<Instant> {
        self.cm.poll_timeout()
    }
}

/// A handle on a device's connection manager (see the module docs). Cheap to clone, `Send + Sync`.
#[derive(Clone, Debug)]
pub struct ConnectionManager {
    ctx: Context,
    shared: Arc<CmShared>,
    waiter: Arc<Waiter>,
}

impl ConnectionManager {
    /// The connection manager of `ctx`'s device, started on first use (one per device: later calls share it).
    ///
    /// Errors: [`Error::Spawn`] if the eventfds cannot be created; [`Error::EngineGone`].
    pub fn open(ctx: &Context) -> Result<ConnectionManager, Error> {
        Self::open_with(ctx, CmConfig::default())
    }

    /// Like [`open`](Self::open) with the CM's configuration (timeouts, retries, caps), used if this call starts
    /// the device's CM (otherwise the running CM is shared and `cfg` is ignored). A zero `local_ca_guid` is
    /// replaced by the EUI-64 of the port MAC, a zero `seed` by one drawn from the engine.
    pub fn open_with(ctx: &Context, cfg: CmConfig) -> Result<ConnectionManager, Error> {
        Ok(Self::open_inner(ctx, cfg, None)?.0)
    }

    /// Like [`open`](Self::open), listening on `service_id` in the same step: a REQ that reached the device before
    /// its CM existed (it waits in the GSI's receive queue) meets the listen instead of a REJ "invalid service ID"
    /// — a program's first `rdma_listen` starts the CM and listens at once.
    ///
    /// Errors: as [`open`](Self::open) and [`listen`](Self::listen).
    pub fn open_listening(
        ctx: &Context,
        service_id: u64,
    ) -> Result<(ConnectionManager, ListenId), Error> {
        let (cm, l) = Self::open_inner(ctx, CmConfig::default(), Some(service_id))?;
        let l = l.ok_or(Error::EngineGone)??;
        Ok((cm, l))
    }

    #[allow(clippy::type_complexity)]
    fn open_inner(
        ctx: &Context,
        cfg: CmConfig,
        listen: Option<u64>,
    ) -> Result<
        (
            ConnectionManager,
            Option<Result<ListenId, roce_cm::CmError>>,
        ),
        Error,
    > {
        let fresh = Arc::new(CmShared {
            queue: Mutex::new(VecDeque::new()),
            sem: Semaphore::new().map_err(Error::Spawn)?,
            neighbors: Mutex::new(HashMap::new()),
            conns: Mutex::new(HashMap::new()),
        });
        let waiter = Arc::new(Waiter::new().map_err(Error::Spawn)?);
        let (shared, listened) = ctx.call(move |d| {
            if let Some(cm) = &mut d.cm {
                let l = listen.map(|sid| listen_steered(cm, &*d.link, sid));
                return (cm.shared.clone(), l);
            }
            // On a shared address the first byte of every comm ID is this process's slot, so the kernel hands the
            // MADs naming them to this process (`CmConfig::comm_id_prefix`, docs/MULTIPROCESS.md).
            let prefix = d.link.caps().first_qpn.map(|q| (q >> 16) as u8);
            let mac = d.engine.config().mac;
            // The CA GUID as an EUI-64 of the port MAC (IBTA Annex A17 / RoCE practice: FF:FE in the middle).
            let guid = u64::from_be_bytes([
                mac[0] ^ 2,
                mac[1],
                mac[2],
                0xff,
                0xfe,
                mac[3],
                mac[4],
                mac[5],
            ]);
            let seed = u64::from(d.engine.random_psn().value()) << 32 ^ d.now.as_nanos();
            let cfg = CmConfig {
                local_ca_guid: if cfg.local_ca_guid == 0 {
                    guid
                } else {
                    cfg.local_ca_guid
                },
                seed: if cfg.seed == 0 { seed } else { cfg.seed },
                comm_id_prefix: cfg.comm_id_prefix.or(prefix),
                ..cfg
            };
            let mut cm = Box::new(DevCm {
                cm: Cm::new(cfg),
                shared: fresh.clone(),
                buf: [0; MAD_LEN],
                held: None,
                listens: HashMap::new(),
            });
            let l = listen.map(|sid| listen_steered(&mut cm, &*d.link, sid));
            d.cm = Some(cm);
            (fresh, l)
        })?;
        let cm = ConnectionManager {
            ctx: ctx.clone(),
            shared,
            waiter,
        };
        Ok((cm, listened))
    }

    /// Runs `f` on the device's CM (under the progress lock; a pass follows, which sends what `f` queued).
    fn with_cm<R>(&self, f: impl FnOnce(&mut Cm, Instant) -> R) -> Result<R, Error> {
        self.ctx.call(move |d| {
            let now = d.now;
            let cm = d.cm.as_deref_mut().ok_or(Error::EngineGone)?;
            let r = f(&mut cm.cm, now);
            cm.flush_events();
            Ok(r)
        })?
    }

    /// The CM's counters (MADs in and out, retransmissions, duplicates, drops by cause).
    pub fn stats(&self) -> Result<CmStats, Error> {
        self.with_cm(|cm, _| *cm.stats())
    }

    /// The device.
    pub fn context(&self) -> &Context {
        &self.ctx
    }

    /// Tells the CM the MAC address of the port with `gid` (used for MADs to it and for QPs connected to it).
    pub fn add_neighbor(&self, gid: Gid, mac: [u8; 6]) {
        lock(&self.shared.neighbors).insert(gid, mac);
    }

    /// Listens on `service_id` (exact match; rdma_cm builds it as `port space << 16 | port`).
    ///
    /// Errors: [`Error::Cm`] with `ServiceIdInUse` (also when another process on a shared address listens on it)
    /// or `NoResources`.
    pub fn listen(&self, service_id: u64) -> Result<ListenId, Error> {
        self.ctx.call(move |d| {
            let cm = d.cm.as_deref_mut().ok_or(Error::EngineGone)?;
            Ok(listen_steered(cm, &*d.link, service_id)?)
        })?
    }

    /// Stops listening (connections already requested are not affected) and ends the steering of its requests.
    pub fn stop_listen(&self, id: ListenId) -> Result<(), Error> {
        self.ctx.call(move |d| {
            let cm = d.cm.as_deref_mut().ok_or(Error::EngineGone)?;
            cm.cm.stop_listen(id);
            if let Some(sid) = cm.listens.remove(&id) {
                let _ = d.link.steer_service(sid, false);
            }
            Ok(())
        })?
    }

    /// Sends a REQ for `service_id` to the port `dest_gid` (MAC `dest_mac`) offering `qp` (RC or UC, in RESET)
    /// with a random Starting PSN (the PSN `qp` will expect from the peer; it sends from the REP's Starting PSN,
    /// as Linux `cm.c` `ib_send_cm_req` / `cm_rep_handler` do) and `private_data` (at most 92 bytes). The QP is connected when the REP arrives
    /// (the event that reports it is [`CmEvent::Established`]) with `opts` (MTU, access, retries), except its local
    /// ACK timeout: the one the CM exchanged, from the REP's TargetACKDelay and the REQ's packet lifetime (Linux
    /// `cm_rep_handler`; the value [`CmEvent::ConnectResponse`] reports to [`connect_qpn`](Self::connect_qpn)'s
    /// caller), not `opts.timeout`.
    ///
    /// Errors: [`Error::InvalidArgument`] for a UD QP or a QP not in RESET; [`Error::Cm`] (private data too long,
    /// no resources).
    pub fn connect(
        &self,
        qp: &Qp,
        dest_gid: Gid,
        dest_mac: [u8; 6],
        service_id: u64,
        private_data: &[u8],
        opts: &ConnectOpts,
    ) -> Result<ConnId, Error> {
        if qp.query()?.qp_state != QpState::Reset {
            return Err(Error::InvalidArgument("the QP to connect must be in RESET"));
        }
        let target = (Some(qp), qp.qpn(), qp.qp_type());
        let (id, _) = self.connect_inner(
            target,
            dest_gid,
            dest_mac,
            service_id,
            private_data,
            opts,
            None,
        )?;
        Ok(id)
    }

    /// Like [`connect`](Self::connect) for a QP the caller moves itself (by number, of type `qp_type`): the REP
    /// is reported as [`CmEvent::ConnectResponse`], after which the caller brings its QP to RTR/RTS and calls
    /// [`establish`](Self::establish) (librdmacm's split between the CM and the program's QP). Returns the
    /// connection and the starting PSN offered in the REQ (the QP's SQ PSN).
    ///
    /// Errors: [`Error::InvalidArgument`] for UD; [`Error::Cm`] (private data too long, no resources).
    #[allow(clippy::too_many_arguments)]
    pub fn connect_qpn(
        &self,
        qpn: Qpn,
        qp_type: QpType,
        dest_gid: Gid,
        dest_mac: [u8; 6],
        service_id: u64,
        private_data: &[u8],
        opts: &ConnectOpts,
    ) -> Result<(ConnId, Psn), Error> {
        self.connect_qpn_with_lifetime(
            qpn,
            qp_type,
            dest_gid,
            dest_mac,
            service_id,
            private_data,
            opts,
            None,
        )
    }

    /// [`connect_qpn`](Self::connect_qpn) with the path's packet lifetime (4.096 µs · 2^n) the REQ's Local ACK
    /// Timeout is computed from (`None`: the CM's [`CmConfig::packet_life_time`]): librdmacm passes ACK timeout − 1
    /// for an id with `RDMA_OPTION_ID_ACK_TIMEOUT` (Linux `cma.c` `cma_resolve_iboe_route`), so the peer's QP
    /// uses about the timeout ours does.
    ///
    /// Errors: as [`connect_qpn`](Self::connect_qpn).
    #[allow(clippy::too_many_arguments)]
    pub fn connect_qpn_with_lifetime(
        &self,
        qpn: Qpn,
        qp_type: QpType,
        dest_gid: Gid,
        dest_mac: [u8; 6],
        service_id: u64,
        private_data: &[u8],
        opts: &ConnectOpts,
        packet_life_time: Option<u8>,
    ) -> Result<(ConnId, Psn), Error> {
        let target = (None, qpn, qp_type);
        self.connect_inner(
            target,
            dest_gid,
            dest_mac,
            service_id,
            private_data,
            opts,
            packet_life_time,
        )
    }

    /// [`connect`](Self::connect) with a QP handle, [`connect_qpn`](Self::connect_qpn) without.
    #[allow(clippy::too_many_arguments)]
    fn connect_inner(
        &self,
        (qp, qpn, qp_type): (Option<&Qp>, Qpn, QpType),
        dest_gid: Gid,
        dest_mac: [u8; 6],
        service_id: u64,
        private_data: &[u8],
        opts: &ConnectOpts,
        packet_life_time: Option<u8>,
    ) -> Result<(ConnId, Psn), Error> {
        let transport = match qp_type {
            QpType::Rc => transport_type::RC,
            QpType::Uc => transport_type::UC,
            QpType::Ud => return Err(Error::InvalidArgument("the CM connects RC/UC QPs")),
        };
        self.add_neighbor(dest_gid, dest_mac);
        let psn = self.ctx.random_psn()?;
        let local_gid = self
            .ctx
            .gid(usize::from(opts.sgid_index))
            .ok_or(Error::InvalidArgument("sgid_index"))?;
        let o = *opts;
        let (id, plt) = self.with_cm(move |cm, now| {
            let plt = packet_life_time
                .unwrap_or(cm.config().packet_life_time)
                .min(31);
            let path = PathRepr {
                local_gid: wire_gid(local_gid),
                remote_gid: wire_gid(dest_gid),
                traffic_class: o.traffic_class,
                hop_limit: 64,
                local_ack_timeout: o.timeout,
                ..PathRepr::default()
            };
            let p = ConnectParams {
                service_id,
                transport,
                local_qpn: qpn,
                starting_psn: psn,
                responder_resources: o.rd_atomic,
                initiator_depth: o.rd_atomic,
                retry_count: o.retry_cnt,
                rnr_retry_count: o.rnr_retry,
                path_mtu: o.mtu as u8,
                srq: false,
                path,
                packet_life_time: Some(plt),
                private_data,
            };
            cm.connect(now, Peer::gsi(wire_gid(dest_gid)), &p)
                .map(|id| (id, plt))
        })??;
        lock(&self.shared.conns).insert(
            id,
            ConnInfo {
                qp: qp.cloned(),
                psn,
                opts: *opts,
                peer: dest_gid,
                remote: None,
                req_mtu: None,
                rep_private: Vec::new(),
                by_qpn: qp.is_none(),
                req: None,
                packet_life_time: Some(plt),
            },
        );
        Ok((id, psn))
    }

    /// Sends the RTU of a connection made with [`connect_qpn`](Self::connect_qpn) after its
    /// [`CmEvent::ConnectResponse`] (librdmacm's `rdma_establish`); [`CmEvent::Established`] follows.
    ///
    /// Errors: [`Error::Cm`] when the connection is not waiting for an RTU.
    pub fn establish(&self, id: ConnId) -> Result<(), Error> {
        Ok(self.with_cm(|cm, now| cm.rtu(now, id, &[]))??)
    }

    /// What the REQ of a pending or accepted [`CmEvent::ConnectRequest`] asked for (`None` for another id).
    pub fn request_params(&self, id: ConnId) -> Option<RequestParams> {
        lock(&self.shared.conns).get(&id).and_then(|c| c.req)
    }

    /// Accepts a [`CmEvent::ConnectRequest`] for a QP the caller has already brought to RTR (or RTS) itself: sends
    /// the REP naming `qpn` and `psn` (the Starting PSN: the PSN its receive queue expects, Linux `cm.c`) with
    /// `private_data` (at most 196 bytes); the QP is not touched.
    /// [`CmEvent::Established`] follows when the RTU arrives.
    ///
    /// Errors: [`Error::InvalidArgument`] for an id that is not a pending request; [`Error::Cm`].
    pub fn accept_qpn(
        &self,
        id: ConnId,
        qpn: Qpn,
        psn: Psn,
        private_data: &[u8],
        opts: &ConnectOpts,
    ) -> Result<(), Error> {
        if lock(&self.shared.conns)
            .get(&id)
            .and_then(|c| c.remote)
            .is_none()
        {
            return Err(Error::InvalidArgument("not a pending connect request"));
        }
        let o = *opts;
        self.with_cm(move |cm, now| {
            let p = AcceptParams {
                local_qpn: qpn,
                starting_psn: psn,
                responder_resources: o.rd_atomic,
                initiator_depth: o.rd_atomic,
                rnr_retry_count: o.rnr_retry,
                srq: false,
                private_data,
            };
            cm.accept(now, id, &p)
        })??;
        if let Some(c) = lock(&self.shared.conns).get_mut(&id) {
            c.psn = psn;
            c.opts = o;
            c.by_qpn = true;
        }
        Ok(())
    }

    /// Accepts a [`CmEvent::ConnectRequest`]: connects `qp` (RC/UC, in RESET) to the requester's QP with `opts`
    /// (RTR/RTS; it sends from the REQ's Starting PSN and expects the REP's, a random one, as Linux `cm.c`
    /// `cm_req_handler` / `ib_send_cm_rep` do; its path MTU is the smaller of `opts.mtu` and the REQ's, as Linux
    /// gives the responder the REQ's; its local ACK timeout is the REQ's Local ACK Timeout, not `opts.timeout`, as
    /// Linux `cm_req_handler` gives it) and sends the REP with `private_data` (at most 196 bytes).
    /// [`CmEvent::Established`] follows when the RTU arrives.
    ///
    /// Errors: [`Error::InvalidArgument`] for an id that is not a pending request; [`Error::ModifyQp`] if the QP
    /// cannot be connected; [`Error::Cm`].
    pub fn accept(
        &self,
        id: ConnId,
        qp: &Qp,
        private_data: &[u8],
        opts: &ConnectOpts,
    ) -> Result<(), Error> {
        let info = lock(&self.shared.conns)
            .get(&id)
            .cloned()
            .ok_or(Error::InvalidArgument("not a pending connect request"))?;
        let (rqpn, rpsn) = info
            .remote
            .ok_or(Error::InvalidArgument("not a pending connect request"))?;
        let psn = self.ctx.random_psn()?;
        // Our receive PSN is the one we offer in the REP; we send from the REQ's.
        let remote = QpEndpoint {
            qpn: rqpn,
            psn,
            gid: info.peer,
            mac: self.shared.mac_of(info.peer),
        };
        let mut o = *opts;
        if let Some(m) = info.req_mtu {
            o.mtu = o.mtu.min(m);
        }
        // The passive QP's local ACK timeout is the REQ's Local ACK Timeout (Linux `cm.c` `cm_req_handler`), as the
        // C library's QP gets it through `CONNECT_REQUEST` and `rdma_init_qp_attr`.
        if let Some(req) = info.req {
            o.timeout = req.local_ack_timeout;
        }
        qp.connect(&remote, rpsn, &o)?;
        let qpn = qp.qpn();
        self.with_cm(move |cm, now| {
            let p = AcceptParams {
                local_qpn: qpn,
                starting_psn: psn,
                responder_resources: o.rd_atomic,
                initiator_depth: o.rd_atomic,
                rnr_retry_count: o.rnr_retry,
                srq: false,
                private_data,
            };
            cm.accept(now, id, &p)
        })??;
        if let Some(c) = lock(&self.shared.conns).get_mut(&id) {
            c.qp = Some(qp.clone());
            c.psn = psn;
            c.opts = o;
        }
        Ok(())
    }

    /// Rejects a [`CmEvent::ConnectRequest`] with reason "consumer reject" (28) and `private_data` (at most 148
    /// bytes, IBTA Vol 1 §12.6.7).
    pub fn reject(&self, id: ConnId, private_data: &[u8]) -> Result<(), Error> {
        self.with_cm(|cm, now| cm.reject(now, id, rej_reason::CONSUMER_DEFINED, private_data))??;
        lock(&self.shared.conns).remove(&id);
        Ok(())
    }

    /// Disconnects an established connection: our QP goes to ERR (its outstanding WRs complete with
    /// WR_FLUSH_ERR) and a DREQ is sent; [`CmEvent::Disconnected`] follows with the DREP (or after all retries).
    pub fn disconnect(&self, id: ConnId) -> Result<(), Error> {
        self.qp_to_err(id);
        self.with_cm(|cm, now| cm.disconnect(now, id, &[]))??;
        Ok(())
    }

    fn qp_to_err(&self, id: ConnId) {
        let qp = lock(&self.shared.conns).get(&id).and_then(|c| c.qp.clone());
        if let Some(qp) = qp {
            let at = crate::QpAttr {
                qp_state: QpState::Err,
                ..crate::QpAttr::default()
            };
            if let Err(e) = qp.modify(&at, crate::QpAttrMask::STATE) {
                tracing::debug!(error = %e, "QP to ERR on disconnect");
            }
        }
    }

    /// Asks the port `dest_gid` (MAC `dest_mac`) for the UD QP of `service_id` with a SIDR_REQ carrying
    /// `private_data` (at most 216 bytes; rdma_cm puts its `cma_hdr` first), sent from GID index `sgid_index`; the
    /// CM re-sends it after its response timeout, [`CmConfig::max_cm_retries`] times. The answer is
    /// [`CmEvent::SidrResolved`], [`CmEvent::SidrRejected`] or, after all retries, [`CmEvent::Unreachable`].
    ///
    /// Errors: [`Error::InvalidArgument`] for an `sgid_index` outside the GID table; [`Error::Cm`] (private data
    /// too long, no resources).
    pub fn sidr_resolve(
        &self,
        dest_gid: Gid,
        dest_mac: [u8; 6],
        service_id: u64,
        private_data: &[u8],
        sgid_index: u8,
    ) -> Result<ConnId, Error> {
        self.ctx
            .gid(usize::from(sgid_index))
            .ok_or(Error::InvalidArgument("sgid_index"))?;
        self.add_neighbor(dest_gid, dest_mac);
        let id = self.with_cm(move |cm, now| {
            cm.sidr_request(now, Peer::gsi(wire_gid(dest_gid)), service_id, private_data)
        })??;
        lock(&self.shared.conns).insert(
            id,
            ConnInfo {
                qp: None,
                psn: Psn::new(0),
                opts: ConnectOpts {
                    sgid_index,
                    ..ConnectOpts::default()
                },
                peer: dest_gid,
                remote: None,
                req_mtu: None,
                rep_private: Vec::new(),
                by_qpn: false,
                req: None,
                packet_life_time: None,
            },
        );
        Ok(id)
    }

    /// Answers a [`CmEvent::SidrRequest`] with status success, the number of `qp` (a UD QP; its Q_Key must be
    /// `qkey`, as rdma_cm's `rdma_init_qp_attr` sets it) and `qkey` ([`RDMA_UDP_QKEY`] for rdma_cm's UDP port
    /// space), and `private_data` (at most 136 bytes). The exchange is over; the requester then sends datagrams.
    ///
    /// Errors: [`Error::InvalidArgument`] for a QP that is not UD or not ready to receive (RTR/RTS), or whose Q_Key
    /// is not `qkey`; [`Error::Cm`] for an id that is not a pending SIDR_REQ or private data too long.
    pub fn sidr_accept(
        &self,
        id: ConnId,
        qp: &Qp,
        qkey: u32,
        private_data: &[u8],
    ) -> Result<(), Error> {
        if qp.qp_type() != QpType::Ud {
            return Err(Error::InvalidArgument("SIDR answers with a UD QP"));
        }
        let a = qp.query()?;
        if !matches!(a.qp_state, QpState::Rtr | QpState::Rts) {
            return Err(Error::InvalidArgument(
                "the UD QP must be ready to receive (RTR or RTS)",
            ));
        }
        if a.qkey != qkey {
            return Err(Error::InvalidArgument(
                "the UD QP's Q_Key differs from the announced one",
            ));
        }
        let qpn = qp.qpn();
        self.with_cm(move |cm, now| {
            cm.sidr_reply(now, id, sidr_status::SUCCESS, qpn, qkey, private_data)
        })??;
        lock(&self.shared.conns).remove(&id);
        Ok(())
    }

    /// Like [`sidr_accept`](Self::sidr_accept) for a UD QP the caller manages itself (by number): the SIDR_REP
    /// names `qpn` and `qkey` and the QP is not looked at — the caller has brought it to RTS with that Q_Key (as
    /// rocev2's librdmacm does through libibverbs at `rdma_create_qp`, rdma-core `cma.c` `ucma_init_ud_qp`; Linux
    /// `cma.c` sends the QPN of `rdma_accept` unchecked too).
    ///
    /// Errors: [`Error::Cm`] for an id that is not a pending SIDR_REQ or private data longer than 136 bytes.
    pub fn sidr_accept_qpn(
        &self,
        id: ConnId,
        qpn: Qpn,
        qkey: u32,
        private_data: &[u8],
    ) -> Result<(), Error> {
        self.with_cm(move |cm, now| {
            cm.sidr_reply(now, id, sidr_status::SUCCESS, qpn, qkey, private_data)
        })??;
        lock(&self.shared.conns).remove(&id);
        Ok(())
    }

    /// Answers a [`CmEvent::SidrRequest`] with status 2 (rejected by the service, as Linux `cma.c` does for
    /// `rdma_reject` on a UD id) and `private_data` (at most 136 bytes).
    ///
    /// Errors: [`Error::Cm`] for an id that is not a pending SIDR_REQ or private data too long.
    pub fn sidr_reject(&self, id: ConnId, private_data: &[u8]) -> Result<(), Error> {
        self.with_cm(|cm, now| {
            cm.sidr_reply(now, id, sidr_status::REJECT, Qpn::new(0), 0, private_data)
        })??;
        lock(&self.shared.conns).remove(&id);
        Ok(())
    }

    /// Forgets `id` as the application destroys it, telling the peer what Linux `cm.c` `cm_destroy_id` tells it
    /// ([`roce_cm::Cm::destroy`]: a REJ before establishment, a DREQ after, a SIDR_REP with status 2 for a SIDR_REQ
    /// not answered). A SIDR_REQ of ours still unanswered is not re-sent any more and reports nothing (a late
    /// SIDR_REP is dropped). QPs are not touched. A stale id is ignored.
    pub fn destroy(&self, id: ConnId) -> Result<(), Error> {
        self.with_cm(|cm, now| cm.destroy(now, id))?;
        lock(&self.shared.conns).remove(&id);
        Ok(())
    }

    /// Waits until every MAD the CM has queued (a DREQ or REJ of [`destroy`](Self::destroy), say) has been handed
    /// to QP 1 and a transmit pass has run since, driving the device from this thread meanwhile; at most `timeout`.
    /// Returns whether that point was reached. For an ending process (rocev2's librdmacm at exit: the DREQs of its
    /// connected ids must leave before the process does, as the kernel sends them for Linux's rdma_cm).
    ///
    /// Errors: [`Error::EngineGone`].
    pub fn flush(&self, timeout: Duration) -> Result<bool, Error> {
        let t0 = std::time::Instant::now();
        loop {
            self.ctx.progress();
            let idle = self.ctx.call(|d| {
                d.cm.as_deref()
                    .is_none_or(|c| c.held.is_none() && !c.cm.transmit_pending())
            })?;
            if idle {
                // The pass that handed the last MAD to QP 1 transmitted it unless the link deferred it: one more.
                self.ctx.progress();
                return Ok(true);
            }
            if t0.elapsed() >= timeout {
                return Ok(false);
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    /// The event queue's eventfd: readable while events wait (one count per event). The descriptor belongs to the
    /// connection manager (poll it, do not close it).
    pub fn fd(&self) -> RawFd {
        self.shared.sem.fd()
    }

    /// The next event, if one is waiting (does the work it implies first, see the module docs).
    pub fn poll_event(&self) -> Result<Option<CmEvent>, Error> {
        loop {
            let Some(ev) = lock(&self.shared.queue).pop_front() else {
                return Ok(None);
            };
            self.shared.sem.take();
            if let Some(e) = self.process(ev)? {
                return Ok(Some(e));
            }
        }
    }

    /// Waits up to `timeout` for the next event, driving the device meanwhile.
    pub fn get_event(&self, timeout: Duration) -> Result<Option<CmEvent>, Error> {
        let end = std::time::Instant::now() + timeout;
        loop {
            if let Some(e) = self.poll_event()? {
                return Ok(Some(e));
            }
            self.ctx.progress();
            if let Some(e) = self.poll_event()? {
                return Ok(Some(e));
            }
            let left = end.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            // Readable semaphore or a short nap: passes run in this thread (Caller mode) or the progress thread.
            let _ = self
                .waiter
                .wait(&[self.fd()], left.min(Duration::from_micros(200)));
        }
    }

    /// Turns a CM event into what the program sees, doing what it implies.
    fn process(&self, ev: Event) -> Result<Option<CmEvent>, Error> {
        let conns = &self.shared.conns;
        Ok(match ev {
            Event::ConnectRequest {
                id,
                listen,
                peer,
                req,
            } => {
                let gid = proto_gid(peer.gid);
                lock(conns).insert(
                    id,
                    ConnInfo {
                        qp: None,
                        psn: Psn::new(0),
                        opts: ConnectOpts::default(),
                        peer: gid,
                        remote: Some((req.local_qpn, req.starting_psn)),
                        req_mtu: mtu_of_code(req.path_mtu),
                        rep_private: Vec::new(),
                        by_qpn: false,
                        req: Some(RequestParams {
                            path_mtu: req.path_mtu,
                            responder_resources: req.responder_resources,
                            initiator_depth: req.initiator_depth,
                            retry_count: req.retry_count,
                            rnr_retry_count: req.rnr_retry_count,
                            local_ack_timeout: req.primary.local_ack_timeout,
                            traffic_class: req.primary.traffic_class,
                        }),
                        packet_life_time: None,
                    },
                );
                Some(CmEvent::ConnectRequest {
                    id,
                    listen,
                    service_id: req.service_id,
                    peer: gid,
                    remote_qpn: req.local_qpn,
                    remote_psn: req.starting_psn,
                    private_data: req.private_data.to_vec(),
                })
            }
            Event::Reply { id, rep } => {
                let info = lock(conns).get(&id).cloned();
                let Some(info) = info else {
                    return Ok(None);
                };
                // The active QP's local ACK timeout, whoever moves the QP (Linux `cm.c` `cm_rep_handler`: from the
                // REP's TargetACKDelay and the packet lifetime our REQ's Local ACK Timeout came from).
                let local_ack_timeout = roce_cm::ack_timeout(
                    rep.target_ack_delay,
                    info.packet_life_time
                        .unwrap_or(CmConfig::default().packet_life_time),
                );
                if info.by_qpn {
                    if let Some(c) = lock(conns).get_mut(&id) {
                        c.rep_private = rep.private_data.to_vec();
                    }
                    return Ok(Some(CmEvent::ConnectResponse {
                        id,
                        remote_qpn: rep.local_qpn,
                        remote_psn: rep.starting_psn,
                        responder_resources: rep.responder_resources,
                        initiator_depth: rep.initiator_depth,
                        rnr_retry_count: rep.rnr_retry_count,
                        local_ack_timeout,
                        private_data: rep.private_data.to_vec(),
                    }));
                }
                // We expect the PSN our REQ offered and send from the REP's (Linux `cm_rep_handler`).
                let remote = QpEndpoint {
                    qpn: rep.local_qpn,
                    psn: info.psn,
                    gid: info.peer,
                    mac: self.shared.mac_of(info.peer),
                };
                let opts = ConnectOpts {
                    timeout: local_ack_timeout,
                    ..info.opts
                };
                let connected = match &info.qp {
                    Some(qp) => qp.connect(&remote, rep.starting_psn, &opts),
                    None => Err(Error::InvalidArgument("no QP")),
                };
                if let Err(e) = connected {
                    tracing::warn!(error = %e, "connecting the QP to the REP failed; rejecting");
                    self.with_cm(|cm, now| cm.reject(now, id, rej_reason::CONSUMER_DEFINED, &[]))??;
                    lock(conns).remove(&id);
                    return Ok(Some(CmEvent::Rejected {
                        id,
                        reason: rej_reason::CONSUMER_DEFINED,
                        private_data: Vec::new(),
                    }));
                }
                if let Some(c) = lock(conns).get_mut(&id) {
                    c.rep_private = rep.private_data.to_vec();
                }
                // The RTU; the CM then reports Established (taken below, with the REP's private data).
                self.with_cm(|cm, now| cm.rtu(now, id, &[]))??;
                None
            }
            Event::Established { id } => {
                let private_data = lock(conns)
                    .get_mut(&id)
                    .map(|c| std::mem::take(&mut c.rep_private))
                    .unwrap_or_default();
                Some(CmEvent::Established { id, private_data })
            }
            Event::Rejected { id, rej } => {
                lock(conns).remove(&id);
                Some(CmEvent::Rejected {
                    id,
                    reason: rej.reason,
                    private_data: rej.private_data.to_vec(),
                })
            }
            Event::Disconnected { id, cause } => {
                if let Disconnect::Request(_) = cause {
                    self.qp_to_err(id);
                    // The program's own disconnect may have answered this DREQ between the CM taking it and this
                    // event (its DREP sent, timewait entered or even left: "invalid state" or "unknown id"); it is
                    // disconnected all the same and the event is the program's (Linux `cma_ib_handler` reports
                    // DISCONNECTED for the DREQ whoever sends the DREP). Losing it hung perftest's `-R` client.
                    match self.with_cm(|cm, now| cm.disconnect(now, id, &[]))? {
                        Ok(())
                        | Err(roce_cm::CmError::InvalidState(_) | roce_cm::CmError::UnknownId) => {}
                        Err(e) => return Err(e.into()),
                    }
                }
                Some(CmEvent::Disconnected { id })
            }
            Event::TimewaitExit { id } => {
                lock(conns).remove(&id);
                Some(CmEvent::TimewaitExit { id })
            }
            Event::Unreachable { id, .. } => {
                lock(conns).remove(&id);
                Some(CmEvent::Unreachable { id })
            }
            Event::SidrRequest {
                id,
                listen,
                peer,
                req,
            } => {
                let gid = proto_gid(peer.gid);
                lock(conns).insert(
                    id,
                    ConnInfo {
                        qp: None,
                        psn: Psn::new(0),
                        opts: ConnectOpts::default(),
                        peer: gid,
                        remote: None,
                        req_mtu: None,
                        rep_private: Vec::new(),
                        by_qpn: false,
                        req: None,
                        packet_life_time: None,
                    },
                );
                Some(CmEvent::SidrRequest {
                    id,
                    listen,
                    service_id: req.service_id,
                    peer: gid,
                    private_data: req.private_data.to_vec(),
                })
            }
            Event::SidrReply { id, rep } => {
                let Some(info) = lock(conns).remove(&id) else {
                    return Ok(None);
                };
                let private_data = rep.private_data.to_vec();
                Some(if rep.status == sidr_status::SUCCESS {
                    CmEvent::SidrResolved {
                        id,
                        ah: AhAttr {
                            dgid: info.peer,
                            dmac: self.shared.mac_of(info.peer),
                            sgid_index: info.opts.sgid_index,
                            hop_limit: SIDR_HOP_LIMIT,
                            ..AhAttr::default()
                        },
                        qpn: rep.qpn,
                        qkey: rep.qkey,
                        private_data,
                    }
                } else {
                    CmEvent::SidrRejected {
                        id,
                        status: rep.status,
                        private_data,
                    }
                })
            }
        })
    }
}
