//! UD multicast (`crate::mcast`): attach/detach rules (`ib_attach_mcast`, rxe `rxe_mcast.c`), DestQP 0xFFFFFF and
//! the group's MAC on transmit, one copy per attached QP on receive (rxe `rxe_rcv_mcast_pkt`).

use super::util::*;
use crate::mcast::MULTICAST_QPN;
use crate::*;

const GROUP: [u8; 4] = [239, 214, 0, 1];

fn ud() -> ConnOpts {
    ConnOpts {
        qp_type: QpType::Ud,
        ..ConnOpts::default()
    }
}

/// A UD QP on `e` in RTS with Q_Key `qkey`, its own PD and CQ, and a 256-byte receive MR.
fn ud_qp(e: &mut Engine, qkey: u32) -> (End, MrInfo) {
    let end = make_qp(e, &ud());
    let m = mr(e, end.pd, 4096, |_| 0);
    let mut at = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        qkey,
        ..QpAttr::default()
    };
    e.modify_qp(
        end.qpn,
        &at,
        QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::QKEY,
    )
    .unwrap();
    at.qp_state = QpState::Rtr;
    e.modify_qp(end.qpn, &at, QpAttrMask::STATE).unwrap();
    at.qp_state = QpState::Rts;
    e.modify_qp(end.qpn, &at, QpAttrMask::STATE | QpAttrMask::SQ_PSN)
        .unwrap();
    (end, m)
}

fn recv(e: &mut Engine, q: &End, m: &MrInfo, wr_id: u64) {
    e.post_recv(
        q.qpn,
        &[RecvWr {
            wr_id,
            sg_list: &[sge(m, 0, 256)],
        }],
    )
    .unwrap();
}

#[test]
fn a_send_to_a_group_reaches_every_attached_qp_once() {
    let mut p = Pair::new();
    let mgid = Gid::from_ipv4(GROUP);
    let (tx, mtx) = ud_qp(&mut p.a, 0x1111_1111);
    let (r1, m1) = ud_qp(&mut p.b, 0x1111_1111);
    let (r2, m2) = ud_qp(&mut p.b, 0x1111_1111);
    let (r3, m3) = ud_qp(&mut p.b, 0x1111_1111);
    let (r4, m4) = ud_qp(&mut p.b, 0x2222_2222);
    assert!(
        p.b.attach_mcast(r1.qpn, mgid).unwrap(),
        "first QP: new group"
    );
    assert!(!p.b.attach_mcast(r2.qpn, mgid).unwrap());
    assert!(
        !p.b.attach_mcast(r2.qpn, mgid).unwrap(),
        "again: no-op (rxe)"
    );
    p.b.attach_mcast(r4.qpn, mgid).unwrap();
    for (q, m) in [(&r1, &m1), (&r2, &m2), (&r3, &m3), (&r4, &m4)] {
        recv(&mut p.b, q, m, u64::from(q.qpn.value()));
    }
    p.a.mr_write(mtx.lkey, 0, b"to the group").unwrap();
    let ah =
        p.a.create_ah(
            tx.pd,
            &AhAttr {
                dgid: mgid,
                dmac: MAC_B,
                hop_limit: 1,
                ..AhAttr::default()
            },
        )
        .unwrap();
    // The WR names some QPN; the packet goes to the multicast QP all the same.
    let dest = UdDest {
        ah,
        remote_qpn: r1.qpn,
        remote_qkey: 0x1111_1111,
    };
    p.a.post_send(
        tx.qpn,
        &[SendWr::new(1, SendOp::Send, &[sge(&mtx, 0, 12)])
            .ud(dest)
            .signaled()],
    )
    .unwrap();
    p.drive();
    let (_, _, f) = p.captured.first().expect("one frame");
    assert_eq!(
        &f[..6],
        &[0x01, 0x00, 0x5e, 0x56, 0x00, 0x01],
        "RFC 1112 MAC"
    );
    assert_eq!(&f[14 + 16..14 + 20], &GROUP, "IPv4 destination");
    let dest_qp = u32::from_be_bytes([0, f[42 + 5], f[42 + 6], f[42 + 7]]);
    assert_eq!(dest_qp, MULTICAST_QPN, "BTH DestQP");
    for (q, m) in [(&r1, &m1), (&r2, &m2)] {
        let wc = poll_all(&mut p.b, q.cq);
        assert_eq!(wc.len(), 1, "one copy for QP {}", q.qpn.value());
        assert_eq!(wc[0].status, WcStatus::Success);
        assert_eq!((wc[0].byte_len, wc[0].src_qp), (40 + 12, tx.qpn));
        let mut got = [0u8; 12];
        p.b.mr_read(m.lkey, 40, &mut got).unwrap();
        assert_eq!(&got, b"to the group");
        // The GRH area holds the IPv4 header, destination the group.
        let mut dst = [0u8; 4];
        p.b.mr_read(m.lkey, 20 + 16, &mut dst).unwrap();
        assert_eq!(dst, GROUP);
    }
    assert!(poll_all(&mut p.b, r3.cq).is_empty(), "not attached");
    assert!(poll_all(&mut p.b, r4.cq).is_empty(), "other Q_Key");
    assert_eq!(p.b.qp_counters(r4.qpn).unwrap().drop_qkey_mismatch, 1);
    assert_eq!(p.b.counters().rdma_recvs, 2);
    assert_counters_add_up(&p.b);

    // Detached: r1 gets nothing more, r2 still does; the last detach empties the group.
    assert!(!p.b.detach_mcast(r1.qpn, mgid).unwrap());
    recv(&mut p.b, &r1, &m1, 11);
    recv(&mut p.b, &r2, &m2, 12);
    p.a.post_send(
        tx.qpn,
        &[SendWr::new(2, SendOp::Send, &[sge(&mtx, 0, 12)]).ud(dest)],
    )
    .unwrap();
    p.drive();
    assert!(poll_all(&mut p.b, r1.cq).is_empty());
    assert_eq!(poll_all(&mut p.b, r2.cq).len(), 1);
    assert!(!p.b.detach_mcast(r4.qpn, mgid).unwrap());
    assert!(p.b.detach_mcast(r2.qpn, mgid).unwrap(), "group now empty");
    let before = p.b.counters().drop_unknown_qp;
    p.a.post_send(
        tx.qpn,
        &[SendWr::new(3, SendOp::Send, &[sge(&mtx, 0, 12)]).ud(dest)],
    )
    .unwrap();
    p.drive();
    assert_eq!(
        p.b.counters().drop_unknown_qp,
        before + 1,
        "no group: counted drop"
    );
}

#[test]
fn attach_and_detach_errors_follow_the_kernel() {
    let mut p = Pair::new();
    let mgid = Gid::from_ipv4(GROUP);
    let (u, _) = ud_qp(&mut p.b, 1);
    let rc = make_qp(&mut p.b, &ConnOpts::default());
    let inval =
        |r: Result<bool, ResourceError>| matches!(r, Err(ResourceError::InvalidArgument(_)));
    assert!(inval(p.b.attach_mcast(rc.qpn, mgid)), "RC QP");
    assert!(
        inval(p.b.attach_mcast(u.qpn, Gid::from_ipv4(IP_A))),
        "unicast GID"
    );
    assert!(inval(p.b.detach_mcast(u.qpn, mgid)), "no such group");
    assert!(matches!(
        p.b.attach_mcast(Qpn::new(0x77_7777), mgid),
        Err(ResourceError::InvalidHandle(_))
    ));
    p.b.attach_mcast(u.qpn, mgid).unwrap();
    assert!(inval(
        p.b.detach_mcast(u.qpn, Gid::from_ipv4([239, 214, 0, 2]))
    ));
    assert_eq!(p.b.mcast_groups_of(u.qpn), vec![mgid]);
    assert!(
        matches!(p.b.destroy_qp(u.qpn), Err(ResourceError::Busy(_))),
        "rxe_qp_chk_destroy"
    );
    p.b.detach_mcast(u.qpn, mgid).unwrap();
    p.b.destroy_qp(u.qpn).unwrap();
}

#[test]
fn multicast_limits_are_enforced() {
    let mut c = cfg(MAC_B, IP_B, 2);
    c.device.max_mcast_grp = 2;
    c.device.max_mcast_qp_attach = 2;
    c.device.max_total_mcast_qp_attach = 3;
    let mut e = Engine::new(c);
    let q: Vec<End> = (0..3).map(|_| ud_qp(&mut e, 1).0).collect();
    let g = |n: u8| Gid::from_ipv4([239, 214, 1, n]);
    e.attach_mcast(q[0].qpn, g(1)).unwrap();
    e.attach_mcast(q[1].qpn, g(1)).unwrap();
    assert_eq!(
        e.attach_mcast(q[2].qpn, g(1)),
        Err(ResourceError::Exhausted("max_mcast_qp_attach"))
    );
    e.attach_mcast(q[2].qpn, g(2)).unwrap();
    assert_eq!(
        e.attach_mcast(q[0].qpn, g(3)),
        Err(ResourceError::Exhausted("max_mcast_grp"))
    );
    assert_eq!(
        e.attach_mcast(q[0].qpn, g(2)),
        Err(ResourceError::Exhausted("max_total_mcast_qp_attach"))
    );
    e.detach_mcast(q[1].qpn, g(1)).unwrap();
    e.attach_mcast(q[0].qpn, g(2)).unwrap();
}
