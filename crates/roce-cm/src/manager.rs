//! [`Cm`]: the connection table, the per-connection state machine, timers and
//! the transmit / event queues. The protocol rules are in the crate docs.

use core::cmp::Reverse;
use core::time::Duration;
use std::collections::{BTreeMap, BinaryHeap, VecDeque};

use roce_proto::time::Instant;
use roce_wire::cm::{
    self, CmMessage, DrepRepr, DreqRepr, MraRepr, PathRepr, RejRepr, RepRepr, ReqRepr, RtuRepr,
    SidrRepRepr, SidrReqRepr, attr, msg_response, rej_reason, sidr_status, transport_type,
};
use roce_wire::mad::{self, MAD_LEN, MadHeaderRepr};
use roce_wire::{CmMad, Gid, Mad, Psn, Qpn};

use crate::event::{CmStats, ConnId, Disconnect, Event, ListenId, Peer, State};

/// Configuration of one CM instance (one port).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CmConfig {
    /// At most this many connections (and SIDR exchanges) at once, timewait
    /// included; a REQ beyond it is dropped and counted, `connect` fails.
    pub max_connections: usize,
    /// At most this many received REQs / SIDR_REQs waiting for the
    /// application; beyond it a REQ is dropped and counted (the peer retries).
    pub max_pending_requests: usize,
    /// At most this many listens.
    pub max_listeners: usize,
    /// At most this many MADs waiting in the transmit queue.
    pub max_tx_queue: usize,
    /// This port's CA GUID (REQ/REP `LocalCAGUID`).
    pub local_ca_guid: u64,
    /// How long this CM takes to answer, as 4.096 µs × 2^n (REQ
    /// `LocalCMResponseTimeout`, and `RemoteCMResponseTimeout` we ask of the
    /// peer). rdma_cm uses 20 (≈ 4.3 s; Linux `cma.c` `CMA_CM_RESPONSE_TIMEOUT`).
    pub cm_response_timeout: u8,
    /// How often a REQ, REP, DREQ or SIDR_REQ is re-sent (4 bits). rdma_cm
    /// uses 15 (`CMA_MAX_CM_RETRIES`).
    pub max_cm_retries: u8,
    /// Packet lifetime, 4.096 µs × 2^n. rdma_cm on RoCE uses 16 (≈ 268 ms;
    /// Linux `cma.c` `CMA_IBOE_PACKET_LIFETIME`).
    pub packet_life_time: u8,
    /// This CA's ACK delay, 4.096 µs × 2^n (REP `TargetACKDelay`).
    pub ack_delay: u8,
    /// The P_Key put in SIDR_REQs and REQs.
    pub pkey: u16,
    /// When a received REQ is repeated while the application has not
    /// answered it yet, send an MRA with this service timeout (4.096 µs ×
    /// 2^n) so the peer waits instead of giving up; `None`: stay silent.
    /// rdma_cm does this with 24 (≈ 69 s; Linux `cma.c` `CMA_CM_MRA_SETTING`
    /// with `IB_CM_MRA_FLAG_DELAY`: the MRA goes out on the first duplicate).
    pub mra_on_duplicate_req: Option<u8>,
    /// Seed of the random comm IDs and transaction IDs.
    pub seed: u64,
    /// The most significant byte of every local comm ID (SIDR request ID) this CM makes, the rest random; `None`:
    /// all 32 bits random. Several processes sharing one address each put their QPN slot here, so the kernel's
    /// steering program hands every CM MAD that names a comm ID of ours (REP, MRA, REJ, RTU, DREQ, DREP: the
    /// `RemoteCommID`; SIDR_REP: the `RequestID`) to this process (`docs/MULTIPROCESS.md`, QP 1).
    pub comm_id_prefix: Option<u8>,
}

impl Default for CmConfig {
    fn default() -> Self {
        CmConfig {
            max_connections: 4096,
            max_pending_requests: 256,
            max_listeners: 256,
            max_tx_queue: 4096,
            local_ca_guid: 0,
            cm_response_timeout: 20,
            max_cm_retries: 15,
            packet_life_time: 16,
            ack_delay: 15,
            pkey: mad::DEFAULT_PKEY,
            mra_on_duplicate_req: Some(24),
            seed: 0,
            comm_id_prefix: None,
        }
    }
}

/// 4.096 µs × 2^`exp` (the IBTA time encoding of CM timeouts, packet
/// lifetimes and ACK timeouts), exact in nanoseconds; `exp` above 31 counts
/// as 31.
pub fn iba_time(exp: u8) -> Duration {
    Duration::from_nanos(4096u64 << u32::from(exp.min(31)))
}

/// The local ACK timeout exponent for a CA ACK delay and a packet lifetime:
/// 4.096 µs × 2^t ≥ ack delay + 2 × packet lifetime, rounded as Linux `cm.c`
/// `cm_ack_timeout` does (the larger of the two terms, plus one when the
/// other is within a factor of two). Used for the timewait length.
pub fn ack_timeout(ca_ack_delay: u8, packet_life_time: u8) -> u8 {
    let pl = packet_life_time.saturating_add(1);
    let t = if pl >= ca_ack_delay {
        pl + u8::from(ca_ack_delay >= pl.saturating_sub(1))
    } else {
        ca_ack_delay + u8::from(pl >= ca_ack_delay.saturating_sub(1))
    };
    t.min(31)
}

/// What `connect` puts in the REQ.
#[derive(Debug, Clone, Copy)]
pub struct ConnectParams<'a> {
    /// Service ID (rdma_cm: [`roce_wire::cm::service_id`]).
    pub service_id: u64,
    /// [`transport_type::RC`] or [`transport_type::UC`].
    pub transport: u8,
    /// The local QP.
    pub local_qpn: Qpn,
    /// The REQ's Starting PSN: the PSN the local QP expects the responder's first request to carry (the
    /// responder sends from it; Linux `cm.c` `ib_send_cm_req` makes it the requester's `rq_psn`).
    pub starting_psn: Psn,
    /// RDMA READ / atomic requests the local QP accepts at once.
    pub responder_resources: u8,
    /// RDMA READ / atomic requests the local QP issues at once.
    pub initiator_depth: u8,
    /// Transport retry count (3 bits).
    pub retry_count: u8,
    /// RNR retry count (3 bits).
    pub rnr_retry_count: u8,
    /// Path MTU (IBTA encoding, 1..=5).
    pub path_mtu: u8,
    /// SRQ in use.
    pub srq: bool,
    /// The primary path (GIDs, traffic class, hop limit, ...). Its `local_ack_timeout` is not taken: the REQ's
    /// Local ACK Timeout is computed from the packet lifetime (below) and this CA's ACK delay.
    pub path: PathRepr,
    /// The path's packet lifetime (4.096 µs × 2^n), from which the REQ's Local ACK Timeout
    /// ([`ack_timeout`]`(ack_delay, packet_life_time)`, Linux `cm.c` `cm_format_req`) and the REQ's resend
    /// interval are computed; `None`: [`CmConfig::packet_life_time`]. rdma_cm passes ACK timeout − 1 when the
    /// program set `RDMA_OPTION_ID_ACK_TIMEOUT` (Linux `cma.c` `cma_resolve_iboe_route`).
    pub packet_life_time: Option<u8>,
    /// Private data (at most 92 bytes; rdma_cm starts it with a `CmaHdr`).
    pub private_data: &'a [u8],
}

/// What `accept` puts in the REP.
#[derive(Debug, Clone, Copy)]
pub struct AcceptParams<'a> {
    /// The local QP.
    pub local_qpn: Qpn,
    /// The REP's Starting PSN: the PSN the local QP expects the requester's first request to carry (the
    /// requester sends from it; Linux `cm.c` `cm_rep_handler` makes it the requester's `sq_psn`).
    pub starting_psn: Psn,
    /// Responder resources.
    pub responder_resources: u8,
    /// Initiator depth.
    pub initiator_depth: u8,
    /// RNR retry count (3 bits).
    pub rnr_retry_count: u8,
    /// SRQ in use.
    pub srq: bool,
    /// Private data (at most 196 bytes).
    pub private_data: &'a [u8],
}

/// Why a command was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CmError {
    /// The handle names no live connection (never issued, or released).
    UnknownId,
    /// The command is not valid in the connection's current state.
    InvalidState(State),
    /// The private data is longer than the message's area.
    PrivateDataTooLong {
        /// The longest allowed.
        max: usize,
    },
    /// A configured cap is reached.
    NoResources,
    /// Somebody already listens on this service ID.
    ServiceIdInUse,
    /// An invalid argument (e.g. a transport type other than RC/UC).
    InvalidArgument,
}

impl core::fmt::Display for CmError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            CmError::UnknownId => f.write_str("unknown connection id"),
            CmError::InvalidState(s) => write!(f, "not allowed in state {s:?}"),
            CmError::PrivateDataTooLong { max } => {
                write!(f, "private data longer than {max} bytes")
            }
            CmError::NoResources => f.write_str("connection table full"),
            CmError::ServiceIdInUse => f.write_str("service ID already listened on"),
            CmError::InvalidArgument => f.write_str("invalid argument"),
        }
    }
}

impl std::error::Error for CmError {}

/// A MAD to send, returned by [`Cm::poll_transmit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transmit {
    /// Where to: a UD datagram to `dst.qpn` (QP1) at `dst.gid`, with the GSI
    /// Q_Key (see [`roce_wire::mad::gsi_ud_repr`]).
    pub dst: Peer,
    /// Bytes written into the caller's buffer (always [`MAD_LEN`]).
    pub len: usize,
    /// The attribute ID of the message (for tracing).
    pub attr_id: u16,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TimerKind {
    Retry,
    Timewait,
}

#[derive(Debug, Clone)]
struct Conn {
    state: State,
    local_id: u32,
    remote_id: u32,
    peer: Peer,
    /// TID of the connection setup (REQ's), echoed by REP / RTU / MRA / REJ.
    tid: u64,
    /// TID of the DREQ exchange.
    dreq_tid: u64,
    /// The service ID of the REQ / SIDR_REQ.
    service_id: u64,
    local_qpn: Qpn,
    remote_qpn: Qpn,
    remote_ca_guid: u64,
    /// The message being retried and how many retries are left.
    retry: Option<(CmMad, u8)>,
    /// Per-try response timeout of retried messages.
    retry_timeout: Duration,
    /// Retries of REQ/REP/DREQ/SIDR_REQ (ours for our REQ, the REQ's
    /// `MaxCMRetries` on the passive side).
    max_retries: u8,
    /// The last reply sent, re-sent when a duplicate arrives (MRA, RTU, DREP).
    stored: Option<CmMad>,
    deadline: Option<(Instant, TimerKind)>,
    timer_seq: u64,
    timewait: Duration,
    /// Keys this connection holds in the indexes.
    remote_key: Option<(Gid, u32)>,
    qpn_key: Option<(Gid, u64, u32)>,
    sidr_key: Option<(Gid, u32)>,
}

/// The communication manager of one port: see the crate docs.
#[derive(Debug)]
pub struct Cm {
    config: CmConfig,
    rng: u64,
    hi_tid: u32,
    slots: Vec<Option<Conn>>,
    generations: Vec<u32>,
    free: Vec<usize>,
    live: usize,
    pending: usize,
    by_local: BTreeMap<u32, usize>,
    by_remote: BTreeMap<(Gid, u32), usize>,
    by_remote_qpn: BTreeMap<(Gid, u64, u32), usize>,
    by_sidr: BTreeMap<(Gid, u32), usize>,
    listeners: BTreeMap<u64, ListenId>,
    listen_ids: Vec<Option<u64>>,
    timers: BinaryHeap<Reverse<(Instant, usize, u64)>>,
    tx: VecDeque<(Peer, CmMad)>,
    events: VecDeque<Event>,
    stats: CmStats,
}

fn splitmix(s: &mut u64) -> u64 {
    *s = s.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *s;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn copy_private<const N: usize>(src: &[u8]) -> Result<[u8; N], CmError> {
    if src.len() > N {
        return Err(CmError::PrivateDataTooLong { max: N });
    }
    let mut a = [0u8; N];
    a[..src.len()].copy_from_slice(src);
    Ok(a)
}

impl Cm {
    /// A CM with no connections and no listens.
    pub fn new(config: CmConfig) -> Self {
        let mut rng = config.seed ^ 0x5eed_c0de_0000_0007;
        let hi_tid = splitmix(&mut rng) as u32;
        Cm {
            config,
            rng,
            hi_tid,
            slots: Vec::new(),
            generations: Vec::new(),
            free: Vec::new(),
            live: 0,
            pending: 0,
            by_local: BTreeMap::new(),
            by_remote: BTreeMap::new(),
            by_remote_qpn: BTreeMap::new(),
            by_sidr: BTreeMap::new(),
            listeners: BTreeMap::new(),
            listen_ids: Vec::new(),
            timers: BinaryHeap::new(),
            tx: VecDeque::new(),
            events: VecDeque::new(),
            stats: CmStats::default(),
        }
    }

    // ---- (A) getters ----

    /// The configuration.
    pub fn config(&self) -> &CmConfig {
        &self.config
    }

    /// The counters.
    pub fn stats(&self) -> &CmStats {
        &self.stats
    }

    /// The state of a connection, `None` when the handle is stale.
    pub fn state(&self, id: ConnId) -> Option<State> {
        self.conn(id).map(|c| c.state)
    }

    /// The local communication ID of a connection (what the peer's MADs name).
    pub fn local_comm_id(&self, id: ConnId) -> Option<u32> {
        self.conn(id).map(|c| c.local_id)
    }

    /// The peer's communication ID, once known.
    pub fn remote_comm_id(&self, id: ConnId) -> Option<u32> {
        self.conn(id).map(|c| c.remote_id)
    }

    /// The service ID a connection or SIDR exchange is for.
    pub fn service_id(&self, id: ConnId) -> Option<u64> {
        self.conn(id).map(|c| c.service_id)
    }

    /// Live connections (timewait included).
    pub fn connections(&self) -> usize {
        self.live
    }

    // ---- (C) commands ----

    /// Listens on `service_id`: REQs and SIDR_REQs for it become
    /// [`Event::ConnectRequest`] / [`Event::SidrRequest`].
    ///
    /// # Errors
    /// [`CmError::ServiceIdInUse`], [`CmError::NoResources`].
    pub fn listen(&mut self, service_id: u64) -> Result<ListenId, CmError> {
        if self.listeners.contains_key(&service_id) {
            return Err(CmError::ServiceIdInUse);
        }
        let idx = match self.listen_ids.iter().position(Option::is_none) {
            Some(i) => i,
            None if self.listen_ids.len() < self.config.max_listeners => {
                self.listen_ids.push(None);
                self.listen_ids.len() - 1
            }
            None => return Err(CmError::NoResources),
        };
        self.listen_ids[idx] = Some(service_id);
        let id = ListenId(idx as u32);
        self.listeners.insert(service_id, id);
        Ok(id)
    }

    /// Stops a listen (connections it created are not affected).
    pub fn stop_listen(&mut self, id: ListenId) {
        if let Some(sid) = self
            .listen_ids
            .get_mut(id.0 as usize)
            .and_then(Option::take)
        {
            self.listeners.remove(&sid);
        }
    }

    /// Sends a REQ to `peer` (state `ReqSent`). The REQ is re-sent every
    /// 2 × packet lifetime + the CM response timeout we ask of the peer, at
    /// most `max_cm_retries` times.
    ///
    /// # Errors
    /// [`CmError::PrivateDataTooLong`] (> 92), [`CmError::InvalidArgument`]
    /// (transport not RC/UC), [`CmError::NoResources`].
    pub fn connect(
        &mut self,
        now: Instant,
        peer: Peer,
        p: &ConnectParams<'_>,
    ) -> Result<ConnId, CmError> {
        let private_data = copy_private::<{ cm::REQ_PRIVATE_DATA_LEN }>(p.private_data)?;
        if p.transport != transport_type::RC && p.transport != transport_type::UC {
            return Err(CmError::InvalidArgument);
        }
        let c = &self.config;
        let plt = p.packet_life_time.unwrap_or(c.packet_life_time).min(31);
        let retry_timeout = iba_time(plt) * 2 + iba_time(c.cm_response_timeout);
        let mut path = p.path;
        path.local_ack_timeout = ack_timeout(c.ack_delay, plt);
        let mut req = ReqRepr {
            service_id: p.service_id,
            local_ca_guid: c.local_ca_guid,
            local_qpn: p.local_qpn,
            responder_resources: p.responder_resources,
            initiator_depth: p.initiator_depth,
            remote_cm_response_timeout: c.cm_response_timeout,
            transport_service_type: p.transport,
            starting_psn: p.starting_psn,
            local_cm_response_timeout: c.cm_response_timeout,
            retry_count: p.retry_count,
            pkey: c.pkey,
            path_mtu: p.path_mtu,
            rnr_retry_count: p.rnr_retry_count,
            max_cm_retries: c.max_cm_retries,
            srq: p.srq,
            primary: path,
            private_data,
            ..ReqRepr::default()
        };
        let retries = c.max_cm_retries;
        let slot = self.alloc(peer, State::ReqSent)?;
        let conn = self.slots[slot].as_mut().expect("just allocated");
        req.local_comm_id = conn.local_id;
        conn.service_id = p.service_id;
        conn.tid = (u64::from(self.hi_tid) << 32) | u64::from(conn.local_id);
        conn.local_qpn = p.local_qpn;
        conn.retry_timeout = retry_timeout;
        conn.max_retries = retries;
        let mad = CmMad::new(conn.tid, 0, CmMessage::Req(req));
        conn.retry = Some((mad, retries));
        self.send(peer, mad);
        self.arm(slot, now + retry_timeout, TimerKind::Retry);
        Ok(self.id_of(slot))
    }

    /// Accepts a received REQ: sends the REP (state `RepSent`), re-sent
    /// every 2 × packet lifetime + the REQ's `LocalCMResponseTimeout`, at most
    /// the REQ's `MaxCMRetries` times.
    ///
    /// # Errors
    /// [`CmError::UnknownId`], [`CmError::InvalidState`] (not `ReqRcvd` /
    /// `MraReqSent`), [`CmError::PrivateDataTooLong`] (> 196).
    pub fn accept(
        &mut self,
        now: Instant,
        id: ConnId,
        p: &AcceptParams<'_>,
    ) -> Result<(), CmError> {
        let private_data = copy_private::<{ cm::REP_PRIVATE_DATA_LEN }>(p.private_data)?;
        let slot = self.slot_in(id, &[State::ReqRcvd, State::MraReqSent])?;
        let (ca_guid, ack_delay) = (self.config.local_ca_guid, self.config.ack_delay);
        let conn = self.slots[slot].as_mut().expect("checked");
        conn.local_qpn = p.local_qpn;
        let rep = RepRepr {
            local_comm_id: conn.local_id,
            remote_comm_id: conn.remote_id,
            local_qpn: p.local_qpn,
            starting_psn: p.starting_psn,
            responder_resources: p.responder_resources,
            initiator_depth: p.initiator_depth,
            target_ack_delay: ack_delay,
            rnr_retry_count: p.rnr_retry_count,
            srq: p.srq,
            local_ca_guid: ca_guid,
            private_data,
            ..RepRepr::default()
        };
        let mad = CmMad::new(conn.tid, 0, CmMessage::Rep(rep));
        let (peer, timeout, retries) = (conn.peer, conn.retry_timeout, conn.max_retries);
        conn.retry = Some((mad, retries));
        conn.stored = None;
        self.set_state(slot, State::RepSent);
        self.send(peer, mad);
        self.arm(slot, now + timeout, TimerKind::Retry);
        Ok(())
    }

    /// Answers a received REP with an RTU: the connection is established
    /// ([`Event::Established`] is queued). The RTU is kept and re-sent if the
    /// REP arrives again.
    ///
    /// # Errors
    /// [`CmError::UnknownId`], [`CmError::InvalidState`] (not `RepRcvd` /
    /// `MraRepSent`), [`CmError::PrivateDataTooLong`] (> 224).
    pub fn rtu(&mut self, _now: Instant, id: ConnId, private_data: &[u8]) -> Result<(), CmError> {
        let private_data = copy_private::<{ cm::RTU_PRIVATE_DATA_LEN }>(private_data)?;
        let slot = self.slot_in(id, &[State::RepRcvd, State::MraRepSent])?;
        let conn = self.slots[slot].as_mut().expect("checked");
        let rtu = RtuRepr {
            local_comm_id: conn.local_id,
            remote_comm_id: conn.remote_id,
            private_data,
        };
        let mad = CmMad::new(conn.tid, 0, CmMessage::Rtu(rtu));
        conn.stored = Some(mad);
        let peer = conn.peer;
        self.set_state(slot, State::Established);
        self.disarm(slot);
        self.send(peer, mad);
        self.events.push_back(Event::Established { id });
        Ok(())
    }

    /// Sends an MRA for the received REQ (`MraReqSent`) or REP
    /// (`MraRepSent`): the peer extends its timeout by 4.096 µs ×
    /// 2^`service_timeout`. The MRA is re-sent for each duplicate.
    ///
    /// # Errors
    /// [`CmError::UnknownId`], [`CmError::InvalidState`],
    /// [`CmError::PrivateDataTooLong`] (> 222).
    pub fn mra(
        &mut self,
        _now: Instant,
        id: ConnId,
        service_timeout: u8,
        private_data: &[u8],
    ) -> Result<(), CmError> {
        let private_data = copy_private::<{ cm::MRA_PRIVATE_DATA_LEN }>(private_data)?;
        let slot = self.slot_in(id, &[State::ReqRcvd, State::RepRcvd])?;
        let conn = self.slots[slot].as_mut().expect("checked");
        let (mraed, next) = if conn.state == State::ReqRcvd {
            (msg_response::REQ, State::MraReqSent)
        } else {
            (msg_response::REP, State::MraRepSent)
        };
        let mra = MraRepr {
            local_comm_id: conn.local_id,
            remote_comm_id: conn.remote_id,
            message_mraed: mraed,
            service_timeout,
            private_data,
        };
        let mad = CmMad::new(conn.tid, 0, CmMessage::Mra(mra));
        conn.stored = Some(mad);
        let peer = conn.peer;
        self.set_state(slot, next);
        self.send(peer, mad);
        Ok(())
    }

    /// Rejects a received REQ (before `accept`) or REP (before `rtu`) with
    /// `reason` ([`roce_wire::cm::rej_reason`], usually `CONSUMER_DEFINED`)
    /// and private data; the connection is released.
    ///
    /// # Errors
    /// [`CmError::UnknownId`], [`CmError::InvalidState`],
    /// [`CmError::PrivateDataTooLong`] (> 148).
    pub fn reject(
        &mut self,
        _now: Instant,
        id: ConnId,
        reason: u16,
        private_data: &[u8],
    ) -> Result<(), CmError> {
        let private_data = copy_private::<{ cm::REJ_PRIVATE_DATA_LEN }>(private_data)?;
        let slot = self.slot_in(
            id,
            &[
                State::ReqRcvd,
                State::MraReqSent,
                State::RepRcvd,
                State::MraRepSent,
            ],
        )?;
        let conn = self.slots[slot].as_ref().expect("checked");
        let rejected = if matches!(conn.state, State::ReqRcvd | State::MraReqSent) {
            msg_response::REQ
        } else {
            msg_response::REP
        };
        let rej = RejRepr {
            local_comm_id: conn.local_id,
            remote_comm_id: conn.remote_id,
            message_rejected: rejected,
            reason,
            private_data,
            ..RejRepr::default()
        };
        let (peer, tid) = (conn.peer, conn.tid);
        self.send(peer, CmMad::new(tid, 0, CmMessage::Rej(rej)));
        self.release(slot);
        Ok(())
    }

    /// Disconnects: in `Established` sends a DREQ (state `DreqSent`, re-sent
    /// like a REQ until a DREP, then timewait); in `DreqRcvd` sends the DREP
    /// and enters timewait. The timewait lasts 4.096 µs × 2^t with t the local
    /// ACK timeout ([`ack_timeout`]), as Linux `cm_enter_timewait`.
    ///
    /// # Errors
    /// [`CmError::UnknownId`], [`CmError::InvalidState`],
    /// [`CmError::PrivateDataTooLong`] (DREQ > 220, DREP > 224).
    pub fn disconnect(
        &mut self,
        now: Instant,
        id: ConnId,
        private_data: &[u8],
    ) -> Result<(), CmError> {
        let slot = self.slot_in(id, &[State::Established, State::DreqRcvd])?;
        let hi_tid = self.hi_tid;
        let conn = self.slots[slot].as_mut().expect("checked");
        if conn.state == State::Established {
            let dreq = DreqRepr {
                local_comm_id: conn.local_id,
                remote_comm_id: conn.remote_id,
                remote_qpn_eecn: conn.remote_qpn,
                private_data: copy_private(private_data)?,
            };
            conn.dreq_tid = dreq_tid(hi_tid, conn.local_id);
            let mad = CmMad::new(conn.dreq_tid, 0, CmMessage::Dreq(dreq));
            conn.retry = Some((mad, conn.max_retries));
            let (peer, timeout) = (conn.peer, conn.retry_timeout);
            self.set_state(slot, State::DreqSent);
            self.send(peer, mad);
            self.arm(slot, now + timeout, TimerKind::Retry);
        } else {
            let drep = DrepRepr {
                local_comm_id: conn.local_id,
                remote_comm_id: conn.remote_id,
                private_data: copy_private(private_data)?,
            };
            let mad = CmMad::new(conn.dreq_tid, 0, CmMessage::Drep(drep));
            conn.stored = Some(mad);
            let peer = conn.peer;
            self.send(peer, mad);
            self.enter_timewait(now, slot);
        }
        Ok(())
    }

    /// Sends a SIDR_REQ for `service_id` to `peer` (state `SidrReqSent`),
    /// re-sent like a REQ until the SIDR_REP.
    ///
    /// # Errors
    /// [`CmError::PrivateDataTooLong`] (> 216), [`CmError::NoResources`].
    pub fn sidr_request(
        &mut self,
        now: Instant,
        peer: Peer,
        service_id: u64,
        private_data: &[u8],
    ) -> Result<ConnId, CmError> {
        let private_data = copy_private::<{ cm::SIDR_REQ_PRIVATE_DATA_LEN }>(private_data)?;
        let c = &self.config;
        let timeout = iba_time(c.packet_life_time) * 2 + iba_time(c.cm_response_timeout);
        let (pkey, retries) = (c.pkey, c.max_cm_retries);
        let slot = self.alloc(peer, State::SidrReqSent)?;
        let conn = self.slots[slot].as_mut().expect("just allocated");
        conn.tid = (u64::from(self.hi_tid) << 32) | u64::from(conn.local_id);
        conn.service_id = service_id;
        conn.retry_timeout = timeout;
        let req = SidrReqRepr {
            request_id: conn.local_id,
            pkey,
            service_id,
            private_data,
        };
        let mad = CmMad::new(conn.tid, 0, CmMessage::SidrReq(req));
        conn.retry = Some((mad, retries));
        self.send(peer, mad);
        self.arm(slot, now + timeout, TimerKind::Retry);
        Ok(self.id_of(slot))
    }

    /// Answers a received SIDR_REQ with `status`
    /// ([`roce_wire::cm::sidr_status`]), the service's QPN and Q_Key and
    /// private data; the exchange is released.
    ///
    /// # Errors
    /// [`CmError::UnknownId`], [`CmError::InvalidState`],
    /// [`CmError::PrivateDataTooLong`] (> 136).
    pub fn sidr_reply(
        &mut self,
        _now: Instant,
        id: ConnId,
        status: u8,
        qpn: Qpn,
        qkey: u32,
        private_data: &[u8],
    ) -> Result<(), CmError> {
        let private_data = copy_private::<{ cm::SIDR_REP_PRIVATE_DATA_LEN }>(private_data)?;
        let slot = self.slot_in(id, &[State::SidrReqRcvd])?;
        let conn = self.slots[slot].as_ref().expect("checked");
        let rep = SidrRepRepr {
            request_id: conn.remote_id,
            status,
            qpn,
            service_id: conn.service_id,
            qkey,
            private_data,
            ..SidrRepRepr::default()
        };
        let (peer, tid) = (conn.peer, conn.tid);
        self.send(peer, CmMad::new(tid, 0, CmMessage::SidrRep(rep)));
        self.release(slot);
        Ok(())
    }

    /// Forgets a connection as the application destroys its id, telling the
    /// peer what Linux `cm_destroy_id` tells it: a REJ (Timeout for our own
    /// pending REQ, consumer-defined otherwise) before establishment, a DREQ
    /// (sent once) when established, a DREP when a DREQ waits, a SIDR_REP
    /// (reject) for a pending SIDR_REQ. Connections that must still pass
    /// timewait stay in the table without events until it ends. A stale id
    /// is ignored.
    pub fn destroy(&mut self, now: Instant, id: ConnId) {
        let Some(slot) = self.slot_of(id) else {
            return;
        };
        let hi_tid = self.hi_tid;
        let conn = self.slots[slot].as_mut().expect("checked");
        let (state, peer) = (conn.state, conn.peer);
        let reason = match state {
            State::ReqSent | State::MraReqRcvd => rej_reason::TIMEOUT,
            _ => rej_reason::CONSUMER_DEFINED,
        };
        match state {
            State::ReqSent | State::MraReqRcvd | State::ReqRcvd | State::MraReqSent => {
                let rej = conn_rej(conn, msg_response::REQ, reason);
                self.send_rej(peer, rej);
                self.release(slot);
            }
            State::RepSent | State::MraRepRcvd | State::RepRcvd | State::MraRepSent => {
                let rej = conn_rej(conn, msg_response::REP, reason);
                self.send_rej(peer, rej);
                self.release(slot);
            }
            State::Established | State::DreqSent => {
                if state == State::Established {
                    let dreq = DreqRepr {
                        local_comm_id: conn.local_id,
                        remote_comm_id: conn.remote_id,
                        remote_qpn_eecn: conn.remote_qpn,
                        ..DreqRepr::default()
                    };
                    let mad = CmMad::new(dreq_tid(hi_tid, conn.local_id), 0, CmMessage::Dreq(dreq));
                    self.send(peer, mad);
                }
                self.detach(slot);
                self.enter_timewait(now, slot);
            }
            State::DreqRcvd => {
                let drep = DrepRepr {
                    local_comm_id: conn.local_id,
                    remote_comm_id: conn.remote_id,
                    ..DrepRepr::default()
                };
                let mad = CmMad::new(conn.dreq_tid, 0, CmMessage::Drep(drep));
                conn.stored = Some(mad);
                self.send(peer, mad);
                self.detach(slot);
                self.enter_timewait(now, slot);
            }
            State::Timewait => self.detach(slot),
            State::SidrReqSent => self.release(slot),
            State::SidrReqRcvd => {
                let _ = self.sidr_reply(now, id, sidr_status::REJECT, Qpn::new(0), 0, &[]);
            }
        }
    }

    // ---- (B) inputs ----

    /// Handles one received MAD (the UD payload of a GSI datagram) from
    /// `src`. Never fails: what cannot be used is counted in
    /// [`CmStats`]' `drop_*` counters.
    pub fn handle_mad(&mut self, now: Instant, src: Peer, bytes: &[u8]) {
        self.stats.rx_mads += 1;
        let Ok(view) = Mad::new_checked(bytes) else {
            self.stats.drop_truncated += 1;
            return;
        };
        let Ok(hdr) = MadHeaderRepr::parse(&view) else {
            self.stats.drop_truncated += 1;
            return;
        };
        if hdr.base_version != mad::BASE_VERSION {
            self.stats.drop_bad_base_version += 1;
            return;
        }
        if hdr.mgmt_class != mad::MGMT_CLASS_CM {
            self.stats.drop_bad_class += 1;
            return;
        }
        if hdr.class_version != mad::CM_CLASS_VERSION {
            self.stats.drop_bad_class_version += 1;
            return;
        }
        if hdr.method != mad::method::SEND {
            self.stats.drop_bad_method += 1;
            return;
        }
        if !(attr::REQ..=attr::SIDR_REP).contains(&hdr.attr_id) {
            self.stats.drop_unknown_attr += 1;
            return;
        }
        let Ok(msg) = CmMessage::parse(hdr.attr_id, view.data()) else {
            self.stats.drop_malformed += 1;
            return;
        };
        let tid = hdr.tid;
        match msg {
            CmMessage::Req(m) => self.on_req(src, tid, m),
            CmMessage::Mra(m) => self.on_mra(now, src, tid, m),
            CmMessage::Rej(m) => self.on_rej(src, tid, m),
            CmMessage::Rep(m) => self.on_rep(src, tid, m),
            CmMessage::Rtu(m) => self.on_rtu(src, tid, m),
            CmMessage::Dreq(m) => self.on_dreq(src, tid, m),
            CmMessage::Drep(m) => self.on_drep(now, src, tid, m),
            CmMessage::SidrReq(m) => self.on_sidr_req(src, tid, m),
            CmMessage::SidrRep(m) => self.on_sidr_rep(src, tid, m),
        }
    }

    /// Fires the timers due at `now`: retransmissions, give-ups and timewait
    /// exits.
    pub fn handle_timeout(&mut self, now: Instant) {
        while let Some(&Reverse((at, slot, seq))) = self.timers.peek() {
            if at > now {
                break;
            }
            self.timers.pop();
            let Some(conn) = self.slots.get_mut(slot).and_then(Option::as_mut) else {
                continue;
            };
            if conn.timer_seq != seq {
                continue;
            }
            let Some((_, kind)) = conn.deadline.take() else {
                continue;
            };
            match kind {
                TimerKind::Timewait => {
                    let id = self.id_of(slot);
                    let detached = self.is_detached(slot);
                    self.release(slot);
                    if !detached {
                        self.events.push_back(Event::TimewaitExit { id });
                    }
                }
                TimerKind::Retry => self.retry_or_give_up(now, slot),
            }
        }
    }

    // ---- (D) outputs ----

    /// The next MAD to send, written into `buf`; `None` when nothing waits.
    #[must_use]
    pub fn poll_transmit(&mut self, buf: &mut [u8; MAD_LEN]) -> Option<Transmit> {
        let (dst, mad) = self.tx.pop_front()?;
        let len = mad.emit(buf).expect("buffer is MAD_LEN bytes");
        Some(Transmit {
            dst,
            len,
            attr_id: mad.message.attr_id(),
        })
    }

    /// Whether MADs wait for [`Cm::poll_transmit`] (a caller that must see its last MADs leave, e.g. at process
    /// exit, drives until this is false).
    #[must_use]
    pub fn transmit_pending(&self) -> bool {
        !self.tx.is_empty()
    }

    /// The next event for the application.
    #[must_use]
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// When [`Cm::handle_timeout`] should be called next.
    #[must_use]
    pub fn poll_timeout(&mut self) -> Option<Instant> {
        while let Some(&Reverse((at, slot, seq))) = self.timers.peek() {
            let valid = self
                .slots
                .get(slot)
                .and_then(Option::as_ref)
                .is_some_and(|c| c.timer_seq == seq && c.deadline.is_some());
            if valid {
                return Some(at);
            }
            self.timers.pop();
        }
        None
    }

    // ---- message handlers ----

    fn on_req(&mut self, src: Peer, tid: u64, req: ReqRepr) {
        if let Some(&slot) = self.by_remote.get(&(src.gid, req.local_comm_id)) {
            self.stats.duplicates += 1;
            let conn = self.slots[slot].as_ref().expect("indexed");
            let (state, peer, stored, retry) = (conn.state, conn.peer, conn.stored, conn.retry);
            match state {
                State::ReqRcvd => {
                    if let Some(t) = self.config.mra_on_duplicate_req {
                        let id = self.id_of(slot);
                        let _ = self.mra(Instant::ZERO, id, t, &[]);
                    }
                }
                State::MraReqSent => {
                    if let Some(m) = stored {
                        self.send(peer, m);
                    }
                }
                State::RepSent | State::MraRepRcvd => {
                    if let Some((m, _)) = retry {
                        self.send(peer, m);
                    }
                }
                State::Timewait => {
                    self.stats.rej_stale_sent += 1;
                    self.issue_rej(
                        src,
                        tid,
                        req.local_comm_id,
                        0,
                        msg_response::REQ,
                        rej_reason::STALE_CONN,
                    );
                }
                _ => {}
            }
            return;
        }
        if self
            .by_remote_qpn
            .contains_key(&(src.gid, req.local_ca_guid, req.local_qpn.value()))
        {
            // The peer's QP is still connected (or in timewait) here: a stale
            // connection (Linux `cm_req_handler` / `cm_insert_remote_qpn`).
            self.stats.rej_stale_sent += 1;
            self.issue_rej(
                src,
                tid,
                req.local_comm_id,
                0,
                msg_response::REQ,
                rej_reason::STALE_CONN,
            );
            return;
        }
        let Some(&listen) = self.listeners.get(&req.service_id) else {
            self.stats.rej_no_listener_sent += 1;
            self.issue_rej(
                src,
                tid,
                req.local_comm_id,
                0,
                msg_response::REQ,
                rej_reason::INVALID_SERVICE_ID,
            );
            return;
        };
        if req.transport_service_type != transport_type::RC
            && req.transport_service_type != transport_type::UC
        {
            self.stats.drop_bad_transport += 1;
            self.issue_rej(
                src,
                tid,
                req.local_comm_id,
                0,
                msg_response::REQ,
                rej_reason::INVALID_TRANSPORT_TYPE,
            );
            return;
        }
        if self.pending >= self.config.max_pending_requests {
            self.stats.drop_over_cap += 1;
            return;
        }
        let Ok(slot) = self.alloc(src, State::ReqRcvd) else {
            self.stats.drop_over_cap += 1;
            return;
        };
        let pl = self.config.packet_life_time;
        let conn = self.slots[slot].as_mut().expect("just allocated");
        conn.remote_id = req.local_comm_id;
        conn.tid = tid;
        conn.service_id = req.service_id;
        conn.remote_qpn = req.local_qpn;
        conn.remote_ca_guid = req.local_ca_guid;
        conn.retry_timeout = iba_time(pl) * 2 + iba_time(req.local_cm_response_timeout);
        conn.max_retries = req.max_cm_retries;
        self.index_remote(slot, src.gid, req.local_comm_id);
        self.index_qpn(slot, src.gid, req.local_ca_guid, req.local_qpn);
        let id = self.id_of(slot);
        self.events.push_back(Event::ConnectRequest {
            id,
            listen,
            peer: src,
            req,
        });
    }

    fn on_mra(&mut self, now: Instant, src: Peer, tid: u64, mra: MraRepr) {
        let Some(slot) = self.match_local(src, tid, mra.remote_comm_id, None) else {
            return;
        };
        let conn = self.slots[slot].as_ref().expect("matched");
        let next = match (conn.state, mra.message_mraed) {
            (State::ReqSent, msg_response::REQ) => State::MraReqRcvd,
            (State::RepSent, msg_response::REP) => State::MraRepRcvd,
            (State::MraReqRcvd, msg_response::REQ) | (State::MraRepRcvd, msg_response::REP) => {
                self.stats.duplicates += 1;
                return;
            }
            _ => {
                self.stats.drop_wrong_state += 1;
                return;
            }
        };
        let timeout = iba_time(mra.service_timeout) + iba_time(self.config.packet_life_time) * 2;
        self.set_state(slot, next);
        self.arm(slot, now + timeout, TimerKind::Retry);
    }

    fn on_rej(&mut self, src: Peer, tid: u64, rej: RejRepr) {
        let slot = if rej.remote_comm_id != 0 {
            self.by_local.get(&rej.remote_comm_id).copied()
        } else {
            self.by_remote.get(&(src.gid, rej.local_comm_id)).copied()
        };
        let Some(slot) = slot else {
            self.stats.drop_unmatched += 1;
            return;
        };
        let conn = self.slots[slot].as_ref().expect("indexed");
        if conn.peer.gid != src.gid
            || conn.tid != tid
            || (conn.remote_id != 0 && conn.remote_id != rej.local_comm_id)
        {
            self.stats.drop_forged += 1;
            return;
        }
        match conn.state {
            State::ReqSent
            | State::MraReqRcvd
            | State::RepRcvd
            | State::MraRepSent
            | State::ReqRcvd
            | State::MraReqSent
            | State::RepSent
            | State::MraRepRcvd => {
                let id = self.id_of(slot);
                self.release(slot);
                self.events.push_back(Event::Rejected { id, rej });
            }
            _ => self.stats.drop_wrong_state += 1,
        }
    }

    fn on_rep(&mut self, src: Peer, tid: u64, rep: RepRepr) {
        let Some(slot) = self.match_local(src, tid, rep.remote_comm_id, None) else {
            return;
        };
        let conn = self.slots[slot].as_ref().expect("matched");
        match conn.state {
            State::ReqSent | State::MraReqRcvd => {
                let key = (src.gid, rep.local_ca_guid, rep.local_qpn.value());
                if self.by_remote_qpn.get(&key).is_some_and(|&s| s != slot) {
                    // The peer's QP is still connected here: reject the REP as
                    // stale and give up the connection (Linux cm_rep_handler).
                    self.stats.rej_stale_sent += 1;
                    let conn = self.slots[slot].as_ref().expect("matched");
                    let (t, mut rej) = conn_rej(conn, msg_response::REP, rej_reason::STALE_CONN);
                    rej.remote_comm_id = rep.local_comm_id;
                    self.send_rej(src, (t, rej));
                    let id = self.id_of(slot);
                    self.release(slot);
                    self.events.push_back(Event::Rejected { id, rej });
                    return;
                }
                let conn = self.slots[slot].as_mut().expect("matched");
                conn.remote_id = rep.local_comm_id;
                conn.remote_qpn = rep.local_qpn;
                conn.remote_ca_guid = rep.local_ca_guid;
                conn.retry = None;
                self.index_remote(slot, src.gid, rep.local_comm_id);
                self.index_qpn(slot, src.gid, rep.local_ca_guid, rep.local_qpn);
                self.set_state(slot, State::RepRcvd);
                self.disarm(slot);
                let id = self.id_of(slot);
                self.events.push_back(Event::Reply { id, rep });
            }
            State::RepRcvd | State::MraRepSent | State::Established => {
                if rep.local_comm_id != conn.remote_id {
                    self.stats.drop_forged += 1;
                    return;
                }
                self.stats.duplicates += 1;
                let (state, peer, stored) = (conn.state, conn.peer, conn.stored);
                if state != State::RepRcvd
                    && let Some(m) = stored
                {
                    self.send(peer, m);
                }
            }
            _ => self.stats.drop_wrong_state += 1,
        }
    }

    fn on_rtu(&mut self, src: Peer, tid: u64, rtu: RtuRepr) {
        let Some(slot) = self.match_local(src, tid, rtu.remote_comm_id, Some(rtu.local_comm_id))
        else {
            return;
        };
        match self.slots[slot].as_ref().expect("matched").state {
            State::RepSent | State::MraRepRcvd => {
                self.slots[slot].as_mut().expect("matched").retry = None;
                self.set_state(slot, State::Established);
                self.disarm(slot);
                let id = self.id_of(slot);
                self.events.push_back(Event::Established { id });
            }
            State::Established | State::DreqSent | State::DreqRcvd | State::Timewait => {
                self.stats.duplicates += 1;
            }
            _ => self.stats.drop_wrong_state += 1,
        }
    }

    fn on_dreq(&mut self, src: Peer, tid: u64, dreq: DreqRepr) {
        let Some(&slot) = self.by_local.get(&dreq.remote_comm_id) else {
            // Our side already left timewait (our DREP was lost and the peer's
            // retry came late): answer so the peer completes too (Linux
            // `cm_issue_drep`). Counted as unmatched; one DREP per DREQ.
            self.stats.drop_unmatched += 1;
            self.stats.drep_for_unknown += 1;
            let drep = DrepRepr {
                local_comm_id: dreq.remote_comm_id,
                remote_comm_id: dreq.local_comm_id,
                ..DrepRepr::default()
            };
            self.send(src, CmMad::new(tid, 0, CmMessage::Drep(drep)));
            return;
        };
        let conn = self.slots[slot].as_ref().expect("indexed");
        if conn.peer.gid != src.gid
            || conn.remote_id != dreq.local_comm_id
            || conn.local_qpn != dreq.remote_qpn_eecn
        {
            self.stats.drop_forged += 1;
            return;
        }
        let id = self.id_of(slot);
        match conn.state {
            State::RepSent | State::MraRepRcvd | State::Established | State::DreqSent => {
                if matches!(conn.state, State::RepSent | State::MraRepRcvd) {
                    // The RTU was lost or is late: the DREQ proves the active
                    // side established the connection.
                    self.events.push_back(Event::Established { id });
                }
                let conn = self.slots[slot].as_mut().expect("indexed");
                conn.retry = None;
                conn.dreq_tid = tid;
                self.set_state(slot, State::DreqRcvd);
                self.disarm(slot);
                self.events.push_back(Event::Disconnected {
                    id,
                    cause: Disconnect::Request(dreq),
                });
            }
            State::DreqRcvd => self.stats.duplicates += 1,
            State::Timewait => {
                self.stats.duplicates += 1;
                let (peer, stored) = (conn.peer, conn.stored);
                if let Some(m) = stored {
                    self.send(peer, m);
                }
            }
            _ => self.stats.drop_wrong_state += 1,
        }
    }

    fn on_drep(&mut self, now: Instant, src: Peer, tid: u64, drep: DrepRepr) {
        let Some(&slot) = self.by_local.get(&drep.remote_comm_id) else {
            self.stats.drop_unmatched += 1;
            return;
        };
        let conn = self.slots[slot].as_ref().expect("indexed");
        if conn.peer.gid != src.gid || conn.remote_id != drep.local_comm_id {
            self.stats.drop_forged += 1;
            return;
        }
        match conn.state {
            State::DreqSent if conn.dreq_tid == tid => {
                let id = self.id_of(slot);
                self.enter_timewait(now, slot);
                if !self.is_detached(slot) {
                    self.events.push_back(Event::Disconnected {
                        id,
                        cause: Disconnect::Reply(drep),
                    });
                }
            }
            State::DreqSent => self.stats.drop_forged += 1,
            State::Timewait => self.stats.duplicates += 1,
            _ => self.stats.drop_wrong_state += 1,
        }
    }

    fn on_sidr_req(&mut self, src: Peer, tid: u64, req: SidrReqRepr) {
        if self.by_sidr.contains_key(&(src.gid, req.request_id)) {
            self.stats.duplicates += 1;
            return;
        }
        let Some(&listen) = self.listeners.get(&req.service_id) else {
            self.stats.rej_no_listener_sent += 1;
            let rep = SidrRepRepr {
                request_id: req.request_id,
                status: sidr_status::UNSUPPORTED,
                service_id: req.service_id,
                ..SidrRepRepr::default()
            };
            self.send(src, CmMad::new(tid, 0, CmMessage::SidrRep(rep)));
            return;
        };
        if self.pending >= self.config.max_pending_requests {
            self.stats.drop_over_cap += 1;
            return;
        }
        let Ok(slot) = self.alloc(src, State::SidrReqRcvd) else {
            self.stats.drop_over_cap += 1;
            return;
        };
        let conn = self.slots[slot].as_mut().expect("just allocated");
        conn.remote_id = req.request_id;
        conn.tid = tid;
        conn.service_id = req.service_id;
        conn.sidr_key = Some((src.gid, req.request_id));
        self.by_sidr.insert((src.gid, req.request_id), slot);
        let id = self.id_of(slot);
        self.events.push_back(Event::SidrRequest {
            id,
            listen,
            peer: src,
            req,
        });
    }

    fn on_sidr_rep(&mut self, src: Peer, tid: u64, rep: SidrRepRepr) {
        let Some(slot) = self.match_local(src, tid, rep.request_id, None) else {
            return;
        };
        if self.slots[slot].as_ref().expect("matched").state != State::SidrReqSent {
            self.stats.drop_wrong_state += 1;
            return;
        }
        let id = self.id_of(slot);
        self.release(slot);
        self.events.push_back(Event::SidrReply { id, rep });
    }

    // ---- helpers ----

    /// The connection whose local ID is `local`, if the MAD's peer and TID
    /// (and the sender's comm ID, when given and known) agree with it; counts
    /// the drop otherwise.
    fn match_local(
        &mut self,
        src: Peer,
        tid: u64,
        local: u32,
        remote: Option<u32>,
    ) -> Option<usize> {
        let Some(&slot) = self.by_local.get(&local) else {
            self.stats.drop_unmatched += 1;
            return None;
        };
        let conn = self.slots[slot].as_ref().expect("indexed");
        let remote_ok = match remote {
            Some(r) => conn.remote_id == r,
            None => true,
        };
        if conn.peer.gid != src.gid || conn.tid != tid || !remote_ok {
            self.stats.drop_forged += 1;
            return None;
        }
        Some(slot)
    }

    fn retry_or_give_up(&mut self, now: Instant, slot: usize) {
        let conn = self.slots[slot].as_mut().expect("timer of a live conn");
        if let Some((mad, left)) = conn.retry
            && left > 0
        {
            conn.retry = Some((mad, left - 1));
            let (peer, timeout) = (conn.peer, conn.retry_timeout);
            self.stats.retransmits += 1;
            self.send(peer, mad);
            self.arm(slot, now + timeout, TimerKind::Retry);
            return;
        }
        let (state, peer) = (conn.state, conn.peer);
        conn.retry = None;
        let (rejected, attr_id) = if matches!(state, State::ReqSent | State::MraReqRcvd) {
            (msg_response::REQ, attr::REQ)
        } else {
            (msg_response::REP, attr::REP)
        };
        let rej = conn_rej(conn, rejected, rej_reason::TIMEOUT);
        self.stats.timeouts += 1;
        let id = self.id_of(slot);
        match state {
            State::ReqSent | State::MraReqRcvd | State::RepSent | State::MraRepRcvd => {
                self.send_rej(peer, rej);
                self.release(slot);
                self.events.push_back(Event::Unreachable { id, attr_id });
            }
            State::DreqSent => {
                let detached = self.is_detached(slot);
                self.enter_timewait(now, slot);
                if !detached {
                    self.events.push_back(Event::Disconnected {
                        id,
                        cause: Disconnect::Timeout,
                    });
                }
            }
            State::SidrReqSent => {
                self.release(slot);
                self.events.push_back(Event::Unreachable {
                    id,
                    attr_id: attr::SIDR_REQ,
                });
            }
            _ => {}
        }
    }

    fn enter_timewait(&mut self, now: Instant, slot: usize) {
        let t = iba_time(ack_timeout(
            self.config.ack_delay,
            self.config.packet_life_time,
        ));
        let conn = self.slots[slot].as_mut().expect("live");
        conn.retry = None;
        conn.timewait = t;
        // The peer's QP is free again: a REQ from it is a new connection (Linux `cm_enter_timewait` →
        // `cm_cleanup_timewait` takes the remote QPN out of the table; only live connections make a REQ stale).
        if let Some(k) = conn.qpn_key.take() {
            self.by_remote_qpn.remove(&k);
        }
        self.set_state(slot, State::Timewait);
        self.arm(slot, now + t, TimerKind::Timewait);
    }

    fn send(&mut self, dst: Peer, mad: CmMad) {
        if self.tx.len() >= self.config.max_tx_queue {
            self.stats.drop_tx_full += 1;
            return;
        }
        self.stats.tx_mads += 1;
        self.tx.push_back((dst, mad));
    }

    fn send_rej(&mut self, dst: Peer, rej: (u64, RejRepr)) {
        self.send(dst, CmMad::new(rej.0, 0, CmMessage::Rej(rej.1)));
    }

    /// A REJ for a MAD that has no connection here (Linux `cm_issue_rej`):
    /// the comm IDs swapped, the MAD's TID echoed.
    fn issue_rej(
        &mut self,
        dst: Peer,
        tid: u64,
        their_id: u32,
        our_id: u32,
        rejected: u8,
        reason: u16,
    ) {
        let rej = RejRepr {
            local_comm_id: our_id,
            remote_comm_id: their_id,
            message_rejected: rejected,
            reason,
            ..RejRepr::default()
        };
        self.send(dst, CmMad::new(tid, 0, CmMessage::Rej(rej)));
    }

    fn alloc(&mut self, peer: Peer, state: State) -> Result<usize, CmError> {
        if self.live >= self.config.max_connections {
            return Err(CmError::NoResources);
        }
        let prefix = self.config.comm_id_prefix;
        let local_id = loop {
            let r = splitmix(&mut self.rng) as u32;
            let id = match prefix {
                Some(p) => u32::from(p) << 24 | r & 0x00ff_ffff,
                None => r,
            };
            if id != 0 && !self.by_local.contains_key(&id) {
                break id;
            }
        };
        let slot = match self.free.pop() {
            Some(s) => s,
            None => {
                self.slots.push(None);
                self.generations.push(0);
                self.slots.len() - 1
            }
        };
        self.slots[slot] = Some(Conn {
            state,
            local_id,
            remote_id: 0,
            peer,
            tid: 0,
            dreq_tid: 0,
            service_id: 0,
            local_qpn: Qpn::new(0),
            remote_qpn: Qpn::new(0),
            remote_ca_guid: 0,
            retry: None,
            retry_timeout: Duration::ZERO,
            max_retries: 0,
            stored: None,
            deadline: None,
            timer_seq: 0,
            timewait: Duration::ZERO,
            remote_key: None,
            qpn_key: None,
            sidr_key: None,
        });
        self.by_local.insert(local_id, slot);
        self.live += 1;
        if state.is_pending_request() {
            self.pending += 1;
        }
        Ok(slot)
    }

    fn release(&mut self, slot: usize) {
        let Some(conn) = self.slots[slot].take() else {
            return;
        };
        self.by_local.remove(&conn.local_id);
        if let Some(k) = conn.remote_key {
            self.by_remote.remove(&k);
        }
        if let Some(k) = conn.qpn_key {
            self.by_remote_qpn.remove(&k);
        }
        if let Some(k) = conn.sidr_key {
            self.by_sidr.remove(&k);
        }
        if conn.state.is_pending_request() {
            self.pending -= 1;
        }
        self.live -= 1;
        self.generations[slot] = self.generations[slot].wrapping_add(1) & 0x7fff_ffff;
        self.free.push(slot);
    }

    /// Marks a connection the application destroyed: its events are
    /// suppressed and its handle is stale, but it keeps its slot (and keys)
    /// until timewait ends. The generation's top bit marks it.
    fn detach(&mut self, slot: usize) {
        self.generations[slot] |= 0x8000_0000;
    }

    fn is_detached(&self, slot: usize) -> bool {
        self.generations[slot] & 0x8000_0000 != 0
    }

    fn set_state(&mut self, slot: usize, next: State) {
        let conn = self.slots[slot].as_mut().expect("live");
        let was = conn.state.is_pending_request();
        conn.state = next;
        match (was, next.is_pending_request()) {
            (true, false) => self.pending -= 1,
            (false, true) => self.pending += 1,
            _ => {}
        }
    }

    fn arm(&mut self, slot: usize, at: Instant, kind: TimerKind) {
        let conn = self.slots[slot].as_mut().expect("live");
        conn.timer_seq += 1;
        conn.deadline = Some((at, kind));
        self.timers.push(Reverse((at, slot, conn.timer_seq)));
    }

    fn disarm(&mut self, slot: usize) {
        let conn = self.slots[slot].as_mut().expect("live");
        conn.timer_seq += 1;
        conn.deadline = None;
    }

    fn index_remote(&mut self, slot: usize, gid: Gid, remote_id: u32) {
        let key = (gid, remote_id);
        self.by_remote.insert(key, slot);
        self.slots[slot].as_mut().expect("live").remote_key = Some(key);
    }

    fn index_qpn(&mut self, slot: usize, gid: Gid, ca_guid: u64, qpn: Qpn) {
        let key = (gid, ca_guid, qpn.value());
        if self.by_remote_qpn.contains_key(&key) {
            return;
        }
        self.by_remote_qpn.insert(key, slot);
        self.slots[slot].as_mut().expect("live").qpn_key = Some(key);
    }

    fn id_of(&self, slot: usize) -> ConnId {
        ConnId {
            slot: slot as u32,
            generation: self.generations[slot] & 0x7fff_ffff,
        }
    }

    fn slot_of(&self, id: ConnId) -> Option<usize> {
        let slot = id.slot as usize;
        let generation = *self.generations.get(slot)?;
        (generation == id.generation && self.slots[slot].is_some()).then_some(slot)
    }

    fn conn(&self, id: ConnId) -> Option<&Conn> {
        self.slot_of(id).and_then(|s| self.slots[s].as_ref())
    }

    fn slot_in(&self, id: ConnId, states: &[State]) -> Result<usize, CmError> {
        let slot = self.slot_of(id).ok_or(CmError::UnknownId)?;
        let state = self.slots[slot].as_ref().expect("checked").state;
        if states.contains(&state) {
            Ok(slot)
        } else {
            Err(CmError::InvalidState(state))
        }
    }
}

/// The TID of a DREQ: like Linux `cm_form_tid` (hi_tid, local comm ID) with
/// the top bit set so it differs from the connection setup's.
fn dreq_tid(hi_tid: u32, local_id: u32) -> u64 {
    (u64::from(hi_tid & 0x7fff_ffff) << 32) | u64::from(local_id) | (1 << 63)
}

/// A REJ from `conn` (its IDs and setup TID).
fn conn_rej(conn: &Conn, rejected: u8, reason: u16) -> (u64, RejRepr) {
    (
        conn.tid,
        RejRepr {
            local_comm_id: conn.local_id,
            remote_comm_id: conn.remote_id,
            message_rejected: rejected,
            reason,
            ..RejRepr::default()
        },
    )
}
