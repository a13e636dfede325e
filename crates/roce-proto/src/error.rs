//! Per-verb error enums (STYLE X1). Data-path failures are never errors here: they are work completions.

use crate::Qpn;
use crate::verbs::{QpAttrMask, QpState, QpType};

/// Errors of resource-allocation verbs (`alloc_pd`, `create_cq`, `create_ah`, ...).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ResourceError {
    /// The device limit for this object kind is reached (ENOMEM).
    #[error("device limit reached ({0})")]
    Exhausted(&'static str),
    /// A handle does not name a live object (EINVAL).
    #[error("invalid handle ({0})")]
    InvalidHandle(&'static str),
    /// An argument is out of range (EINVAL).
    #[error("invalid argument: {0}")]
    InvalidArgument(&'static str),
    /// The object is still in use (EBUSY): an MR with in-flight WRs, a CQ or PD with QPs.
    #[error("resource busy ({0})")]
    Busy(&'static str),
}

/// Errors of `create_qp`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CreateQpError {
    /// A requested capability exceeds the device limit (S09). `granted` is what [`crate::CapPolicy::Clamp`] would give.
    #[error("cap.{field} = {requested} exceeds the device limit {limit}")]
    CapExceeded {
        /// Name of the `ibv_qp_cap` field.
        field: &'static str,
        /// Requested value.
        requested: u32,
        /// Device limit.
        limit: u32,
    },
    /// Bad PD/CQ handle or limits.
    #[error(transparent)]
    Resource(#[from] ResourceError),
}

/// Errors of `modify_qp` (STYLE V5: computed from the transition table, naming the attributes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ModifyQpError {
    /// No such QP.
    #[error("unknown QP {0}")]
    UnknownQp(Qpn),
    /// The transition is not in the table for this QP type.
    #[error("invalid {qp_type:?} QP transition {from:?} -> {to:?}")]
    InvalidTransition {
        /// QP type.
        qp_type: QpType,
        /// Current state.
        from: QpState,
        /// Requested state.
        to: QpState,
    },
    /// Required attributes are missing from the mask.
    #[error("{from:?} -> {to:?} requires attributes {missing} (missing from the mask)")]
    MissingAttrs {
        /// Current state.
        from: QpState,
        /// Requested state.
        to: QpState,
        /// The missing bits.
        missing: QpAttrMask,
    },
    /// The mask names attributes that this transition does not accept.
    #[error("{from:?} -> {to:?} does not accept attributes {extra}")]
    ExtraAttrs {
        /// Current state.
        from: QpState,
        /// Requested state.
        to: QpState,
        /// The offending bits.
        extra: QpAttrMask,
    },
    /// `cur_qp_state` was given and does not match.
    #[error("cur_qp_state {given:?} does not match the QP state {actual:?}")]
    CurStateMismatch {
        /// Given value.
        given: QpState,
        /// Actual state.
        actual: QpState,
    },
    /// An attribute value is out of range.
    #[error("invalid value for {attr}: {reason}")]
    InvalidValue {
        /// Attribute name (`ibv_qp_attr` field).
        attr: &'static str,
        /// Why.
        reason: &'static str,
    },
}

/// Why one WR of a `post_send`/`post_recv` chain was rejected synchronously (libibverbs `bad_wr`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PostErrorKind {
    /// No such QP.
    #[error("unknown QP")]
    UnknownQp,
    /// The QP state does not accept this post (EINVAL), e.g. post_send before RTS.
    #[error("QP is in state {0:?}")]
    InvalidState(QpState),
    /// More SGEs than the QP's `max_send_sge`/`max_recv_sge`.
    #[error("{given} SGEs exceed the QP limit {max}")]
    TooManySges {
        /// SGEs in the WR.
        given: usize,
        /// QP limit.
        max: u32,
    },
    /// Inline payload larger than the QP's `max_inline_data` (S09).
    #[error("inline payload {given} B exceeds max_inline_data {max} B")]
    InlineTooLarge {
        /// Payload length.
        given: u64,
        /// QP limit.
        max: u32,
    },
    /// The queue is full (ENOMEM).
    #[error("queue full")]
    QueueFull,
    /// The operation is not supported by the QP type (e.g. READ on UC).
    #[error("opcode not supported on this QP type")]
    InvalidOpcode,
    /// A UD WR without a destination or with an unknown address handle.
    #[error("missing or invalid UD destination")]
    InvalidUdDest,
    /// Inline data named by the SGL could not be read (bad lkey/bounds).
    #[error("inline SGE does not name registered memory")]
    InvalidInlineSge,
    /// No such SRQ (`post_srq_recv`).
    #[error("unknown SRQ")]
    UnknownSrq,
    /// `post_recv` on a QP created with an SRQ: its receive WQEs come from the SRQ (EINVAL; rxe `rxe_post_recv`).
    #[error("the QP takes its receive WQEs from an SRQ")]
    QpOnSrq,
    /// A UD message larger than the path MTU (libibverbs EINVAL on some providers).
    #[error("UD message {0} B exceeds the port MTU")]
    UdTooLarge(u64),
}

/// A rejected post: the index of the first bad WR (`bad_wr`); WRs before it were posted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("WR #{index} rejected: {kind}")]
pub struct PostError {
    /// Index in the chain of the rejected WR.
    pub index: usize,
    /// Why.
    pub kind: PostErrorKind,
}
