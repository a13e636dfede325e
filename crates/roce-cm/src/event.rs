//! What the CM reports: connection states, events and counters.

use roce_wire::Gid;
use roce_wire::Qpn;
use roce_wire::cm::{DrepRepr, DreqRepr, RejRepr, RepRepr, ReqRepr, SidrRepRepr, SidrReqRepr};

/// The other end of a CM exchange: the port GID (on RoCE v2 the peer's IP
/// address as a GID) and the QP its MADs come from (QP1 unless redirected).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Peer {
    /// The peer port's GID.
    pub gid: Gid,
    /// The peer's GSI QP (1).
    pub qpn: Qpn,
}

impl Peer {
    /// A peer reached through its QP1.
    pub const fn gsi(gid: Gid) -> Self {
        Peer {
            gid,
            qpn: roce_wire::mad::GSI_QPN,
        }
    }
}

/// Handle of one connection (or SIDR exchange). Stale handles (the
/// connection reached IDLE and its slot was reused) are recognised by the
/// generation and refused with [`crate::CmError::UnknownId`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConnId {
    pub(crate) slot: u32,
    pub(crate) generation: u32,
}

/// Handle of one listen (a service ID).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ListenId(pub(crate) u32);

/// States of a connection, as IBTA Vol 1 ch. 12 names them (Linux `enum
/// ib_cm_state`). `Idle` is never observed from outside: a connection that
/// reaches it is released (see the crate docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum State {
    /// REQ sent, waiting for REP / REJ / MRA (active side).
    ReqSent,
    /// REQ received, the application decides (passive side).
    ReqRcvd,
    /// MRA sent for a received REQ (passive side).
    MraReqSent,
    /// MRA received for our REQ (active side).
    MraReqRcvd,
    /// REP sent, waiting for RTU (passive side).
    RepSent,
    /// REP received, the application decides (active side).
    RepRcvd,
    /// MRA sent for a received REP (active side).
    MraRepSent,
    /// MRA received for our REP (passive side).
    MraRepRcvd,
    /// Connected.
    Established,
    /// DREQ sent, waiting for DREP.
    DreqSent,
    /// DREQ received, the application answers with a DREP.
    DreqRcvd,
    /// After a disconnection: stale MADs are answered, the QP must not be
    /// reused yet (IBTA Vol 1 ch. 12).
    Timewait,
    /// SIDR_REQ sent, waiting for SIDR_REP.
    SidrReqSent,
    /// SIDR_REQ received, the application answers with a SIDR_REP.
    SidrReqRcvd,
}

impl State {
    /// States in which a received REQ or SIDR_REQ waits for the application:
    /// these are capped by [`crate::CmConfig::max_pending_requests`].
    pub const fn is_pending_request(self) -> bool {
        matches!(
            self,
            State::ReqRcvd | State::MraReqSent | State::SidrReqRcvd
        )
    }
}

/// Why a connection is disconnected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(clippy::large_enum_variant)]
pub enum Disconnect {
    /// The peer sent a DREQ (answer with [`crate::Cm::disconnect`], which
    /// sends the DREP).
    Request(DreqRepr),
    /// The peer answered our DREQ.
    Reply(DrepRepr),
    /// Our DREQ was not answered after all retries.
    Timeout,
}

/// A connection event, returned by [`crate::Cm::poll_event`]. The messages
/// are carried whole, private data included.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(clippy::large_enum_variant)]
pub enum Event {
    /// A REQ for a listened service ID: answer with `accept`, `reject` or
    /// `mra`.
    ConnectRequest {
        /// The new connection (state `ReqRcvd`).
        id: ConnId,
        /// The listen it matched.
        listen: ListenId,
        /// Where it came from.
        peer: Peer,
        /// The REQ.
        req: ReqRepr,
    },
    /// A REP for our REQ: answer with `rtu` (after moving the QP to RTR/RTS),
    /// `reject` or `mra`.
    Reply {
        /// The connection (state `RepRcvd`).
        id: ConnId,
        /// The REP.
        rep: RepRepr,
    },
    /// The connection is established (passive: RTU received, or a DREQ
    /// proved the active side established; active: RTU sent).
    Established {
        /// The connection.
        id: ConnId,
    },
    /// The peer rejected the connection; it is released.
    Rejected {
        /// The connection (now gone).
        id: ConnId,
        /// The REJ (reason, ARI, private data).
        rej: RejRepr,
    },
    /// The connection is being disconnected.
    Disconnected {
        /// The connection (`DreqRcvd` for a request, `Timewait` otherwise).
        id: ConnId,
        /// What happened.
        cause: Disconnect,
    },
    /// Timewait is over; the connection is released and its QP may be
    /// reused.
    TimewaitExit {
        /// The connection (now gone).
        id: ConnId,
    },
    /// A REQ, REP or SIDR_REQ was not answered after all retries; the
    /// connection is released (for REQ and REP a REJ with reason Timeout
    /// went to the peer).
    Unreachable {
        /// The connection (now gone).
        id: ConnId,
        /// The attribute ID of the unanswered message.
        attr_id: u16,
    },
    /// A SIDR_REQ for a listened service ID: answer with `sidr_reply`.
    SidrRequest {
        /// The exchange (state `SidrReqRcvd`).
        id: ConnId,
        /// The listen it matched.
        listen: ListenId,
        /// Where it came from.
        peer: Peer,
        /// The SIDR_REQ.
        req: SidrReqRepr,
    },
    /// The answer to our SIDR_REQ; the exchange is released.
    SidrReply {
        /// The exchange (now gone).
        id: ConnId,
        /// The SIDR_REP.
        rep: SidrRepRepr,
    },
}

/// Counters (plain fields, STYLE E9). Every MAD handed to
/// [`crate::Cm::handle_mad`] is counted in `rx_mads` and, unless it changed
/// state or was answered as a duplicate, in exactly one `drop_*` counter.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CmStats {
    /// MADs received.
    pub rx_mads: u64,
    /// MADs queued for transmission (retransmissions included).
    pub tx_mads: u64,
    /// Retransmissions after a response timeout.
    pub retransmits: u64,
    /// Duplicates received (answered from the stored reply or ignored).
    pub duplicates: u64,
    /// REJs with reason stale connection sent.
    pub rej_stale_sent: u64,
    /// REJs (or SIDR_REPs) sent because nobody listens on the service ID.
    pub rej_no_listener_sent: u64,
    /// DREPs sent for DREQs that name no connection (Linux `cm_issue_drep`).
    pub drep_for_unknown: u64,
    /// Exchanges given up after all retries.
    pub timeouts: u64,
    /// Dropped: shorter than a MAD.
    pub drop_truncated: u64,
    /// Dropped: base version ≠ 1.
    pub drop_bad_base_version: u64,
    /// Dropped: management class ≠ 0x07.
    pub drop_bad_class: u64,
    /// Dropped: class version ≠ 2.
    pub drop_bad_class_version: u64,
    /// Dropped: method ≠ Send().
    pub drop_bad_method: u64,
    /// Dropped: attribute ID not one of the nine messages (LAP, APR,
    /// ClassPortInfo included).
    pub drop_unknown_attr: u64,
    /// Dropped: a length field inside the message out of range.
    pub drop_malformed: u64,
    /// Dropped: no connection with the comm ID / request ID it names.
    pub drop_unmatched: u64,
    /// Dropped: names a live connection but the peer, the other comm ID, the
    /// transaction ID or the QPN do not match it (a forged or misdirected
    /// MAD; the connection is untouched).
    pub drop_forged: u64,
    /// Dropped: valid for the connection but not in its state.
    pub drop_wrong_state: u64,
    /// Dropped: a REQ or SIDR_REQ beyond the configured caps.
    pub drop_over_cap: u64,
    /// Dropped: a REQ with a transport type other than RC or UC (a REJ is
    /// sent).
    pub drop_bad_transport: u64,
    /// Not queued: the transmit queue was full.
    pub drop_tx_full: u64,
}
