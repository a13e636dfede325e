//! The QP state machine: valid transitions and required/optional attribute masks per QP type
//! (`ROCEV2.md §4.6`, kernel `drivers/infiniband/core/verbs.c` `qp_state_table`, `ibv_modify_qp(3)`).

use crate::error::ModifyQpError;
use crate::verbs::{QpAttrMask as M, QpState as S, QpType};

/// Required and optional attribute masks of one transition (`STATE` is implied and not listed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TransitionRule {
    /// Attributes that must be in the mask.
    pub required: M,
    /// Attributes that may be in the mask.
    pub optional: M,
}

const fn m(bits: u32) -> M {
    M(bits)
}

const fn rule(required: u32, optional: u32) -> Option<TransitionRule> {
    Some(TransitionRule {
        required: m(required),
        optional: m(optional),
    })
}

/// The rule for `from → to` on a QP of type `t`, or `None` if the transition is invalid.
///
/// Moves to RESET and ERR are allowed from every state except RESET→ERR (`ROCEV2.md §4.6`: not in the kernel
/// tables read, so not relied on). SQE exists only for UC/UD.
pub fn transition_rule(t: QpType, from: S, to: S) -> Option<TransitionRule> {
    const PKEY: u32 = M::PKEY_INDEX.0;
    const PORT: u32 = M::PORT.0;
    const ACC: u32 = M::ACCESS_FLAGS.0;
    const QKEY: u32 = M::QKEY.0;
    const AV: u32 = M::AV.0;
    const MTU: u32 = M::PATH_MTU.0;
    const DQPN: u32 = M::DEST_QPN.0;
    const RQPSN: u32 = M::RQ_PSN.0;
    const MDRA: u32 = M::MAX_DEST_RD_ATOMIC.0;
    const MRNR: u32 = M::MIN_RNR_TIMER.0;
    const ALT: u32 = M::ALT_PATH.0;
    const SQPSN: u32 = M::SQ_PSN.0;
    const TMO: u32 = M::TIMEOUT.0;
    const RETRY: u32 = M::RETRY_CNT.0;
    const RNR: u32 = M::RNR_RETRY.0;
    const MRA: u32 = M::MAX_QP_RD_ATOMIC.0;
    const CUR: u32 = M::CUR_STATE.0;
    const MIG: u32 = M::PATH_MIG_STATE.0;
    const SQDN: u32 = M::EN_SQD_ASYNC_NOTIFY.0;
    use QpType::*;
    match (from, to) {
        (S::Reset, S::Reset) => rule(0, 0),
        (S::Reset, S::Init) => match t {
            Ud => rule(PKEY | PORT | QKEY, 0),
            Rc | Uc => rule(PKEY | PORT | ACC, 0),
        },
        (S::Reset, _) => None,
        (_, S::Reset) | (_, S::Err) => rule(0, 0),
        (S::Init, S::Init) => match t {
            Ud => rule(0, PKEY | PORT | QKEY),
            Rc | Uc => rule(0, PKEY | PORT | ACC),
        },
        (S::Init, S::Rtr) => match t {
            Rc => rule(AV | MTU | DQPN | RQPSN | MDRA | MRNR, ALT | ACC | PKEY),
            Uc => rule(AV | MTU | DQPN | RQPSN, ALT | ACC | PKEY),
            Ud => rule(0, PKEY | QKEY),
        },
        (S::Rtr, S::Rts) => match t {
            Rc => rule(
                SQPSN | TMO | RETRY | RNR | MRA,
                CUR | ALT | ACC | MRNR | MIG,
            ),
            Uc => rule(SQPSN, CUR | ALT | ACC | MIG),
            Ud => rule(SQPSN, CUR | QKEY),
        },
        (S::Rts, S::Rts) => match t {
            Rc => rule(0, CUR | ACC | ALT | MIG | MRNR),
            Uc => rule(0, CUR | ACC | ALT | MIG),
            Ud => rule(0, CUR | QKEY),
        },
        (S::Rts, S::Sqd) => rule(0, SQDN),
        (S::Sqd, S::Rts) => match t {
            Rc => rule(0, CUR | ALT | ACC | MRNR | MIG),
            Uc => rule(0, CUR | ALT | ACC | MIG),
            Ud => rule(0, CUR | QKEY),
        },
        (S::Sqd, S::Sqd) => match t {
            Rc => rule(
                0,
                PORT | AV | TMO | RETRY | RNR | MRA | MDRA | ALT | ACC | PKEY | MRNR | MIG,
            ),
            Uc => rule(0, AV | ALT | ACC | PKEY | MIG),
            Ud => rule(0, PKEY | QKEY),
        },
        (S::Sqe, S::Rts) => match t {
            Rc => None,
            Uc => rule(0, CUR | ACC),
            Ud => rule(0, CUR | QKEY),
        },
        _ => None,
    }
}

/// Validates a `modify_qp` mask against the table: the transition must exist, required attributes present, no
/// attribute outside required ∪ optional ∪ {STATE}. Without `STATE` in the mask the transition is `cur → cur`.
pub fn check_modify(t: QpType, cur: S, to: S, mask: M) -> Result<TransitionRule, ModifyQpError> {
    let r = transition_rule(t, cur, to).ok_or(ModifyQpError::InvalidTransition {
        qp_type: t,
        from: cur,
        to,
    })?;
    let missing = M(r.required.0 & !mask.0);
    if missing.0 != 0 {
        return Err(ModifyQpError::MissingAttrs {
            from: cur,
            to,
            missing,
        });
    }
    let extra = M(mask.0 & !(r.required.0 | r.optional.0 | M::STATE.0));
    if extra.0 != 0 {
        return Err(ModifyQpError::ExtraAttrs {
            from: cur,
            to,
            extra,
        });
    }
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rc_happy_path_and_diagnostics() {
        let t = QpType::Rc;
        assert!(
            check_modify(
                t,
                S::Reset,
                S::Init,
                M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS
            )
            .is_ok()
        );
        let e = check_modify(t, S::Reset, S::Init, M::STATE | M::PKEY_INDEX).unwrap_err();
        assert_eq!(
            e,
            ModifyQpError::MissingAttrs {
                from: S::Reset,
                to: S::Init,
                missing: M::PORT | M::ACCESS_FLAGS
            }
        );
        assert_eq!(
            e.to_string(),
            "Reset -> Init requires attributes ACCESS_FLAGS|PORT (missing from the mask)"
        );
        let e = check_modify(
            t,
            S::Reset,
            S::Init,
            M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS | M::QKEY,
        )
        .unwrap_err();
        assert_eq!(
            e,
            ModifyQpError::ExtraAttrs {
                from: S::Reset,
                to: S::Init,
                extra: M::QKEY
            }
        );
        assert!(matches!(
            check_modify(t, S::Init, S::Rts, M::STATE),
            Err(ModifyQpError::InvalidTransition { .. })
        ));
        assert!(check_modify(t, S::Reset, S::Err, M::STATE).is_err());
        assert!(check_modify(t, S::Rts, S::Err, M::STATE).is_ok());
        assert!(check_modify(t, S::Sqe, S::Rts, M::STATE).is_err());
        assert!(check_modify(QpType::Ud, S::Sqe, S::Rts, M::STATE).is_ok());
        assert!(check_modify(QpType::Ud, S::Init, S::Rtr, M::STATE).is_ok());
    }
}
