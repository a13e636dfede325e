//! The QP state machine against a reference model written from the `ROCEV2.md §4.6` table (rows as text), driven
//! by proptest with random transitions and attribute masks through the public `modify_qp`.

use proptest::prelude::*;

use super::util::*;
use crate::*;

/// `ROCEV2.md §4.6`, one row per (transition, type): required and optional attribute names, as in the table.
const TABLE: &[(&str, &str, &str, &str, &str)] = &[
    ("RESET", "INIT", "RC UC", "PKEY_INDEX PORT ACCESS_FLAGS", ""),
    ("RESET", "INIT", "UD", "PKEY_INDEX PORT QKEY", ""),
    ("INIT", "INIT", "RC UC", "", "PKEY_INDEX PORT ACCESS_FLAGS"),
    ("INIT", "INIT", "UD", "", "PKEY_INDEX PORT QKEY"),
    (
        "INIT",
        "RTR",
        "RC",
        "AV PATH_MTU DEST_QPN RQ_PSN MAX_DEST_RD_ATOMIC MIN_RNR_TIMER",
        "ALT_PATH ACCESS_FLAGS PKEY_INDEX",
    ),
    (
        "INIT",
        "RTR",
        "UC",
        "AV PATH_MTU DEST_QPN RQ_PSN",
        "ALT_PATH ACCESS_FLAGS PKEY_INDEX",
    ),
    ("INIT", "RTR", "UD", "", "PKEY_INDEX QKEY"),
    (
        "RTR",
        "RTS",
        "RC",
        "SQ_PSN TIMEOUT RETRY_CNT RNR_RETRY MAX_QP_RD_ATOMIC",
        "CUR_STATE ALT_PATH ACCESS_FLAGS MIN_RNR_TIMER PATH_MIG_STATE",
    ),
    (
        "RTR",
        "RTS",
        "UC",
        "SQ_PSN",
        "CUR_STATE ALT_PATH ACCESS_FLAGS PATH_MIG_STATE",
    ),
    ("RTR", "RTS", "UD", "SQ_PSN", "CUR_STATE QKEY"),
    (
        "RTS",
        "RTS",
        "RC",
        "",
        "CUR_STATE ACCESS_FLAGS ALT_PATH PATH_MIG_STATE MIN_RNR_TIMER",
    ),
    (
        "RTS",
        "RTS",
        "UC",
        "",
        "CUR_STATE ACCESS_FLAGS ALT_PATH PATH_MIG_STATE",
    ),
    ("RTS", "RTS", "UD", "", "CUR_STATE QKEY"),
    ("RTS", "SQD", "RC UC UD", "", "EN_SQD_ASYNC_NOTIFY"),
    (
        "SQD",
        "RTS",
        "RC",
        "",
        "CUR_STATE ALT_PATH ACCESS_FLAGS MIN_RNR_TIMER PATH_MIG_STATE",
    ),
    (
        "SQD",
        "RTS",
        "UC",
        "",
        "CUR_STATE ALT_PATH ACCESS_FLAGS PATH_MIG_STATE",
    ),
    ("SQD", "RTS", "UD", "", "CUR_STATE QKEY"),
    (
        "SQD",
        "SQD",
        "RC",
        "",
        "PORT AV TIMEOUT RETRY_CNT RNR_RETRY MAX_QP_RD_ATOMIC MAX_DEST_RD_ATOMIC ALT_PATH ACCESS_FLAGS PKEY_INDEX MIN_RNR_TIMER PATH_MIG_STATE",
    ),
    (
        "SQD",
        "SQD",
        "UC",
        "",
        "AV ALT_PATH ACCESS_FLAGS PKEY_INDEX PATH_MIG_STATE",
    ),
    ("SQD", "SQD", "UD", "", "PKEY_INDEX QKEY"),
    ("SQE", "RTS", "UC", "", "CUR_STATE ACCESS_FLAGS"),
    ("SQE", "RTS", "UD", "", "CUR_STATE QKEY"),
    ("RESET", "RESET", "RC UC UD", "", ""),
];

fn state_name(s: QpState) -> &'static str {
    ["RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR"][s as usize]
}

fn type_name(t: QpType) -> &'static str {
    match t {
        QpType::Rc => "RC",
        QpType::Uc => "UC",
        QpType::Ud => "UD",
    }
}

fn mask_of(names: &str) -> u32 {
    names
        .split_whitespace()
        .map(|n| {
            QpAttrMask::ALL_BITS
                .iter()
                .find(|(name, _)| *name == n)
                .map(|(_, b)| *b)
                .unwrap_or_else(|| panic!("{n}"))
        })
        .fold(0, |a, b| a | b)
}

/// Reference: (required, optional) or None.
fn reference(t: QpType, from: QpState, to: QpState) -> Option<(u32, u32)> {
    for (f, tt, types, req, opt) in TABLE {
        if *f == state_name(from)
            && *tt == state_name(to)
            && types.split_whitespace().any(|x| x == type_name(t))
        {
            return Some((mask_of(req), mask_of(opt)));
        }
    }
    // "From INIT, RTR, RTS, SQD, SQE and ERR a move to RESET or ERR is always allowed".
    if from != QpState::Reset && matches!(to, QpState::Reset | QpState::Err) {
        return Some((0, 0));
    }
    None
}

fn valid_attr() -> QpAttr {
    QpAttr {
        qp_access_flags: AccessFlags::REMOTE_WRITE,
        ah_attr: AhAttr {
            dgid: Gid::from_ipv4(IP_B),
            dmac: MAC_B,
            ..AhAttr::default()
        },
        dest_qp_num: Qpn::new(0x99),
        ..QpAttr::default()
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]
    #[test]
    fn modify_qp_matches_reference(
        ty in 0u8..3,
        steps in prop::collection::vec((0u8..7, any::<u32>(), any::<bool>()), 1..25),
    ) {
        let t = [QpType::Rc, QpType::Uc, QpType::Ud][ty as usize];
        let mut e = Engine::new(cfg(MAC_A, IP_A, 1));
        let o = ConnOpts { qp_type: t, ..ConnOpts::default() };
        let end = make_qp(&mut e, &o);
        let mut model = QpState::Reset;
        let all: u32 = QpAttrMask::ALL_BITS.iter().map(|(_, b)| *b).fold(0, |a, b| a | b);
        for (to, bits, bias) in steps {
            let to = QpState::ALL[to as usize];
            let rule = reference(t, model, to);
            // Half of the steps use exactly the required set plus random optional bits, so valid paths are explored.
            let mask = match (bias, rule) {
                (true, Some((req, opt))) => QpAttrMask(req | (bits & opt) | QpAttrMask::STATE.0),
                _ => QpAttrMask((bits & all) | QpAttrMask::STATE.0),
            };
            let mut attr = valid_attr();
            attr.qp_state = to;
            attr.cur_qp_state = model;
            let r = e.modify_qp(end.qpn, &attr, mask);
            let expect_ok = match rule {
                Some((req, opt)) => mask.0 & req == req && mask.0 & !(req | opt | QpAttrMask::STATE.0) == 0,
                None => false,
            };
            prop_assert_eq!(r.is_ok(), expect_ok, "{:?} -> {:?} mask {} → {:?}", model, to, mask, r);
            if let Err(err) = r {
                // Errors name the offending attributes.
                match (err, rule) {
                    (ModifyQpError::MissingAttrs { missing, .. }, Some((req, _))) => {
                        prop_assert_eq!(missing.0, req & !mask.0)
                    }
                    (ModifyQpError::ExtraAttrs { extra, .. }, Some((req, opt))) => {
                        prop_assert_eq!(extra.0, mask.0 & !(req | opt | QpAttrMask::STATE.0))
                    }
                    (ModifyQpError::InvalidTransition { .. }, None) => {}
                    (other, _) => prop_assert!(false, "unexpected {other:?}"),
                }
            } else {
                model = to;
            }
            prop_assert_eq!(e.query_qp(end.qpn).unwrap().qp_state, model);
        }
    }
}
