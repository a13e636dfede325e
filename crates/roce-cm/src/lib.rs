//! # roce-cm: the IB communication manager as a sans-IO state machine
//!
//! The connection manager of IBTA Vol 1 chapter 12 (and Annex A17 for RoCE
//! v2), the protocol under rdma_cm: connection requests, replies, rejects,
//! disconnection and service ID resolution exchanged as CM MADs (management
//! class 0x07, class version 2) on QP1. The wire formats are in
//! [`roce_wire::mad`] and [`roce_wire::cm`]; this crate is the state machine,
//! shaped like the engine (quinn-proto style, `docs/ARCHITECTURE.md`): it
//! reads no clock, does no I/O, uses seeded randomness only and has no
//! `unsafe` code.
//!
//! ## Using it
//!
//! One [`Cm`] per port. Four kinds of methods (STYLE E2):
//!
//! * inputs: [`Cm::handle_mad`]`(now, src, bytes)` for every MAD that arrives
//!   on QP1 (the UD payload; `src` is the sender's GID and QP),
//!   [`Cm::handle_timeout`]`(now)` when [`Cm::poll_timeout`] is due;
//! * commands: [`Cm::listen`], [`Cm::connect`], [`Cm::accept`],
//!   [`Cm::rtu`], [`Cm::mra`], [`Cm::reject`], [`Cm::disconnect`],
//!   [`Cm::sidr_request`], [`Cm::sidr_reply`], [`Cm::destroy`];
//! * outputs, to call after every input or command: [`Cm::poll_transmit`]
//!   (the MADs to send, each a UD datagram to the peer's QP1 with the GSI
//!   Q_Key), [`Cm::poll_event`] ([`Event`]: connect request, reply,
//!   established, rejected with the REJ, disconnected, timewait exit,
//!   unreachable after retries, SIDR request/reply — each with the message
//!   and its private data), [`Cm::poll_timeout`];
//! * getters: [`Cm::state`], [`Cm::stats`], [`Cm::connections`].
//!
//! `now` must not go backwards. [`testing::Pair`] runs two CMs over a lossy,
//! duplicating, reordering channel on a virtual clock.
//!
//! ## The protocol rules it follows
//!
//! * **States** (IBTA Vol 1 ch. 12 state diagrams; Linux `enum ib_cm_state`): active side
//!   `ReqSent` → (`MraReqRcvd`) → `RepRcvd` → (`MraRepSent`) → `Established`;
//!   passive side `ReqRcvd` → (`MraReqSent`) → `RepSent` → (`MraRepRcvd`) →
//!   `Established`; then `DreqSent` / `DreqRcvd` → `Timewait`; SIDR uses
//!   `SidrReqSent` / `SidrReqRcvd`. A connection that reaches IDLE (rejected,
//!   given up, timewait over, SIDR answered) is released at once and its
//!   [`ConnId`] becomes stale.
//! * **Identifiers.** Each connection has a random nonzero 32-bit local comm
//!   ID; the transaction ID of everything it sends during setup is
//!   `hi_tid << 32 | local comm ID`, as Linux `cm_form_tid` builds it (DREQs
//!   use the same with the top bit set). REP, MRA, REJ and RTU echo the
//!   REQ's TID; DREP echoes the DREQ's.
//! * **Matching** (what keeps a forged MAD from touching a live connection):
//!   REP, MRA, RTU, DREQ, DREP and SIDR_REP are looked up by the comm ID they
//!   name as ours; the sender's GID must be the connection's peer, the TID
//!   must be the exchange's (REP, MRA, RTU, REJ, DREP, SIDR_REP), the
//!   sender's comm ID must be the one we know (RTU, REJ, DREQ, DREP, REP
//!   duplicates), and a DREQ must name our QPN (IBTA `RemoteQPN/EECN`, as
//!   Linux `cm_dreq_handler` checks). A MAD that names a connection but fails
//!   these checks is dropped and counted in `drop_forged`; one that names no
//!   connection in `drop_unmatched`.
//! * **Response timeouts and retries** (IBTA Vol 1 ch. 12, CM timeouts; Linux
//!   `ib_send_cm_req`): a REQ, REP, DREQ or SIDR_REQ is re-sent every
//!   2 × packet lifetime + the response time the receiver advertised (for a
//!   REQ: the `RemoteCMResponseTimeout` we put in it; for a REP: the REQ's
//!   `LocalCMResponseTimeout`), at most `MaxCMRetries` times (ours, or the
//!   REQ's on the passive side). Times are 4.096 µs × 2^n ([`iba_time`]),
//!   exact in nanoseconds (Linux rounds to milliseconds). When retries run
//!   out: a REQ or REP is given up with a REJ (reason Timeout) to the peer and
//!   [`Event::Unreachable`]; a DREQ moves to timewait with
//!   [`Disconnect::Timeout`]; a SIDR_REQ ends with [`Event::Unreachable`].
//! * **MRA** (IBTA Vol 1 §12.6, Table 107): an MRA for our REQ or REP moves to
//!   `MraReqRcvd` / `MraRepRcvd` and re-arms the wait to the MRA's service
//!   timeout + 2 × packet lifetime (Linux `cm_mra_handler`); our MRA is kept
//!   and re-sent for each duplicate of the message it acknowledged.
//! * **Duplicates** (Linux `cm_dup_req_handler`, `cm_dup_rep_handler`,
//!   `cm_dreq_handler`): a repeated REQ is answered with the stored MRA or REP
//!   (while the application decides: with an MRA, as rdma_cm's delayed MRA
//!   does, see [`CmConfig::mra_on_duplicate_req`]); a repeated REP with the
//!   stored RTU (or MRA); a repeated DREQ in timewait with the stored DREP; a
//!   DREQ that names no connection (we already left timewait) with a DREP
//!   built from it (Linux `cm_issue_drep`), so the peer completes.
//! * **Stale connections** (IBTA Vol 1 ch. 12; Linux `cm_insert_remote_qpn`):
//!   a REQ from a (GID, CA GUID, QPN) that a live connection here still uses
//!   (not one in timewait: Linux `cm_cleanup_timewait` frees it then), or a
//!   repeated REQ of a connection in timewait, is answered
//!   with a REJ reason stale connection (10); a REP naming such a remote QP
//!   makes the active side reject it the same way. The live connection is not
//!   touched.
//! * **Timewait** lasts 4.096 µs × 2^t with t the local ACK timeout
//!   ([`ack_timeout`] of our ACK delay and the packet lifetime), as Linux
//!   `cm_enter_timewait`.
//! * **No listener**: a REQ for a service ID nobody listens on gets a REJ
//!   reason invalid service ID (8); a SIDR_REQ gets a SIDR_REP status
//!   unsupported (Linux `cm_req_handler`, `cm_sidr_req_handler`).
//! * **rdma_cm** puts its address header ([`roce_wire::cm::CmaHdr`]) at the
//!   start of the REQ's private data and uses service IDs
//!   `port space << 16 | port` ([`roce_wire::cm::service_id`]); this crate
//!   carries both opaquely (the librdmacm layer fills and checks them).
//!
//! ## Bad input and bounded state
//!
//! [`Cm::handle_mad`] never fails and never panics: truncated MADs, other
//! base versions, management classes, class versions or methods, unknown
//! attributes (LAP, APR, ClassPortInfo included), out-of-range length fields,
//! unmatched or forged MADs and MADs in the wrong state are counted drops
//! ([`CmStats`]). State is bounded by [`CmConfig`]: at most
//! `max_connections` connections, at most `max_pending_requests` received
//! REQs / SIDR_REQs waiting for the application (a REQ flood beyond it is
//! dropped and counted, so the peer retries), at most `max_tx_queue` queued
//! MADs. Every reply to an unknown peer (REJ, SIDR_REP, DREP) answers one
//! received MAD with one MAD of the same size.
//!
//! ## Not implemented (yet)
//!
//! Alternate paths (LAP/APR, path migration), redirection (ClassPortInfo),
//! RD / XRC transport types, ECE options (the attribute modifier and vendor
//! IDs are carried by the wire types but not negotiated), and service ID
//! masks on listen (exact match only).
//!
//! ## Where it plugs in
//!
//! QP1 belongs in the engine as a GSI QP beside the others: a UD QP numbered 1
//! whose received `UD_SEND_ONLY` packets with DETH Q_Key 0x8001_0000
//! ([`roce_wire::mad::GSI_QKEY`]) and a 256-byte payload go to
//! [`Cm::handle_mad`] with the source GID (the IP source as a GID) and the
//! DETH source QP, and whose transmit queue takes [`Cm::poll_transmit`]'s
//! MADs as UD sends to the peer's QP1 with the GSI Q_Key (the privileged
//! Q_Key rule: only QP1 may send with a Q_Key whose top bit is set: the controlled
//! Q_Key rule of IBTA Vol 1). [`Cm::poll_timeout`] joins the engine's timer heap.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod event;
pub mod manager;
pub mod testing;

pub use event::{CmStats, ConnId, Disconnect, Event, ListenId, Peer, State};
pub use manager::{
    AcceptParams, Cm, CmConfig, CmError, ConnectParams, Transmit, ack_timeout, iba_time,
};
