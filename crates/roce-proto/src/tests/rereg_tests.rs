//! `Engine::rereg_mr` (in place, keys kept), `Engine::resize_cq`, `Engine::clean_cq` and `Engine::rq_len`.

use super::util::*;
use crate::*;

fn setup() -> (Pair, End, End, MrInfo, MrInfo) {
    let mut p = Pair::new();
    let (a, b) = connect(&mut p, &ConnOpts::default());
    let ma = mr(&mut p.a, a.pd, 4096, |i| (i % 251) as u8);
    let mb = mr(&mut p.b, b.pd, 4096, |_| 0);
    (p, a, b, ma, mb)
}

fn statuses(w: &[Wc]) -> Vec<(u64, WcStatus)> {
    w.iter().map(|w| (w.wr_id, w.status)).collect()
}

#[test]
fn rereg_keeps_the_keys_and_the_next_packet_sees_the_new_access() {
    let (mut p, a, b, ma, mb) = setup();
    let (info, old) =
        p.b.rereg_mr(mb.lkey, b.pd, AccessFlags::LOCAL_WRITE, None)
            .unwrap();
    assert!(old.is_none());
    assert_eq!(
        (info.lkey, info.rkey, info.addr),
        (mb.lkey, mb.rkey, mb.addr)
    );
    let write = SendOp::RdmaWrite {
        remote_addr: mb.addr,
        rkey: mb.rkey,
    };
    p.a.post_send(a.qpn, &[SendWr::new(1, write, &[sge(&ma, 0, 64)])])
        .unwrap();
    p.drive();
    assert_eq!(
        statuses(&poll_all(&mut p.a, a.cq)),
        vec![(1, WcStatus::RemAccessErr)]
    );
    assert_eq!(
        p.b.mr_bytes(mb.lkey).map(|b| b[0]),
        Some(0),
        "nothing written"
    );
}

#[test]
fn rereg_translation_fails_a_posted_receive_and_hands_back_the_old_memory() {
    let (mut p, a, b, ma, mb) = setup();
    p.b.post_recv(
        b.qpn,
        &[RecvWr {
            wr_id: 7,
            sg_list: &[sge(&mb, 0, 64)],
        }],
    )
    .unwrap();
    assert_eq!(p.b.rq_len(b.qpn), Some(1));
    let fresh = vec![0u8; 8192];
    let (info, old) =
        p.b.rereg_mr(
            mb.lkey,
            b.pd,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
            Some((fresh.into(), 0x5000_0000)),
        )
        .unwrap();
    assert_eq!(
        (info.lkey, info.addr, info.length),
        (mb.lkey, 0x5000_0000, 8192)
    );
    assert_eq!(
        old.map(|o| o.len()),
        Some(4096),
        "the old memory comes back"
    );
    p.a.post_send(a.qpn, &[SendWr::new(1, SendOp::Send, &[sge(&ma, 0, 64)])])
        .unwrap();
    p.drive();
    assert_eq!(
        statuses(&poll_all(&mut p.a, a.cq)),
        vec![(1, WcStatus::RemOpErr)]
    );
    let wb = poll_all(&mut p.b, b.cq);
    assert_eq!(
        wb.first().map(|w| (w.wr_id, w.status)),
        Some((7, WcStatus::LocProtErr))
    );
    assert_eq!(p.b.rq_len(b.qpn), Some(0));
    // Unknown key, dead PD: errors, nothing changes.
    assert!(matches!(
        p.b.rereg_mr(Lkey(0xdead_0001), b.pd, AccessFlags::LOCAL_WRITE, None),
        Err(ResourceError::InvalidHandle(_))
    ));
    assert!(matches!(
        p.b.rereg_mr(mb.lkey, PdHandle(99), AccessFlags::LOCAL_WRITE, None),
        Err(ResourceError::InvalidHandle(_))
    ));
    assert!(matches!(
        p.b.rereg_mr(mb.lkey, b.pd, AccessFlags::REMOTE_WRITE, None),
        Err(ResourceError::InvalidArgument(_))
    ));
}

#[test]
fn resize_cq_keeps_completions_and_refuses_fewer_entries_than_queued_and_clean_cq_drops_one_qps() {
    let (mut p, a, _b, ma, mb) = setup();
    let write = SendOp::RdmaWrite {
        remote_addr: mb.addr,
        rkey: mb.rkey,
    };
    for id in 1..=3 {
        p.a.post_send(a.qpn, &[SendWr::new(id, write, &[sge(&ma, 0, 8)])])
            .unwrap();
    }
    p.drive();
    assert!(matches!(
        p.a.resize_cq(a.cq, 2, 0),
        Err(ResourceError::InvalidArgument(_))
    ));
    assert!(matches!(
        p.a.resize_cq(a.cq, 3, 1),
        Err(ResourceError::InvalidArgument(_))
    ));
    assert!(matches!(
        p.a.resize_cq(a.cq, 0, 0),
        Err(ResourceError::InvalidArgument(_))
    ));
    p.a.resize_cq(a.cq, 3, 0).unwrap();
    p.a.resize_cq(a.cq, 100_000, 0).unwrap();
    assert_eq!(
        p.a.clean_cq(a.cq, Qpn::new(0x00ab_cdef)),
        0,
        "another QP's: none"
    );
    let w = poll_all(&mut p.a, a.cq);
    assert_eq!(
        statuses(&w),
        vec![
            (1, WcStatus::Success),
            (2, WcStatus::Success),
            (3, WcStatus::Success)
        ]
    );
    for id in 4..=5 {
        p.a.post_send(a.qpn, &[SendWr::new(id, write, &[sge(&ma, 0, 8)])])
            .unwrap();
    }
    p.drive();
    assert_eq!(p.a.clean_cq(a.cq, a.qpn), 2);
    assert!(poll_all(&mut p.a, a.cq).is_empty());
}
