//! Shared receive queues (`crate::srq`): QPs of every type on one SRQ, the responder's rules when it is empty, the
//! limit event, LAST_WQE_REACHED, resize, and the object rules (EBUSY, post_recv refused).

use core::time::Duration;

use super::util::*;
use crate::*;

/// B's side: one PD, one CQ, one SRQ (`max_wr`, 4 SGEs) and `n` QPs on it, each connected to its own QP on A.
struct SrqSetup {
    p: Pair,
    a: Vec<End>,
    b_pd: PdHandle,
    b_cq: CqHandle,
    b_qps: Vec<Qpn>,
    srq: SrqHandle,
}

fn srq_setup(o: &ConnOpts, n: usize, max_wr: u32) -> SrqSetup {
    let mut p = Pair::new();
    let b_pd = p.b.alloc_pd().unwrap();
    let b_cq = p.b.create_cq(4096).unwrap();
    let (srq, attr) = p.b.create_srq(b_pd, max_wr, 4).unwrap();
    assert_eq!(
        attr,
        SrqAttr {
            max_wr,
            max_sge: 4,
            srq_limit: 0
        }
    );
    let mut a = Vec::new();
    let mut b_qps = Vec::new();
    for k in 0..n {
        let ea = make_qp(&mut p.a, o);
        let (qpn, cap) =
            p.b.create_qp_srq(
                &QpInitAttr {
                    qp_type: o.qp_type,
                    pd: b_pd,
                    send_cq: b_cq,
                    recv_cq: b_cq,
                    cap: o.cap,
                    sq_sig_all: o.sq_sig_all,
                },
                Some(srq),
            )
            .unwrap();
        assert_eq!((cap.max_recv_wr, cap.max_recv_sge), (0, 0), "{cap:?}");
        let eb = End {
            pd: b_pd,
            cq: b_cq,
            qpn,
        };
        let psn_a = o.a_psn + 1000 * k as u32;
        bring_up(&mut p.a, ea, eb.qpn, MAC_B, IP_B, psn_a, o.b_psn, o);
        bring_up(&mut p.b, eb, ea.qpn, MAC_A, IP_A, o.b_psn, psn_a, o);
        a.push(ea);
        b_qps.push(qpn);
    }
    SrqSetup {
        p,
        a,
        b_pd,
        b_cq,
        b_qps,
        srq,
    }
}

fn ud_dest(s: &mut SrqSetup, k: usize) -> UdDest {
    let ah =
        s.p.a
            .create_ah(
                s.a[k].pd,
                &AhAttr {
                    dgid: Gid::from_ipv4(IP_B),
                    dmac: MAC_B,
                    ..AhAttr::default()
                },
            )
            .unwrap();
    UdDest {
        ah,
        remote_qpn: s.b_qps[k],
        remote_qkey: 0x1111_1111,
    }
}

/// Posts `wr_ids` on the SRQ, each a 4096-byte buffer at `4096 × i` in `m` split over two SGEs.
fn post_srq(e: &mut Engine, srq: SrqHandle, m: &MrInfo, wr_ids: core::ops::Range<u64>) {
    for id in wr_ids {
        let off = 4096 * (id % 16);
        e.post_srq_recv(
            srq,
            &[RecvWr {
                wr_id: id,
                sg_list: &[sge(m, off, 1024), sge(m, off + 1024, 3072)],
            }],
        )
        .unwrap();
    }
}

#[test]
fn rc_qps_on_one_srq_take_wqes_in_post_order_and_place_multi_packet_sends() {
    let o = ConnOpts::default();
    let mut s = srq_setup(&o, 2, 16);
    let dst = mr(&mut s.p.b, s.b_pd, 16 * 4096, |_| 0);
    post_srq(&mut s.p.b, s.srq, &dst, 0..4);
    let src: Vec<MrInfo> = (0..2)
        .map(|k| mr(&mut s.p.a, s.a[k].pd, 3000, |i| (i * 3 + k * 101) as u8))
        .collect();
    // Both QPs send a 3-packet message (PMTU 1024) at once, then one more each: four messages, four WQEs.
    for round in 0..2u64 {
        for (k, (m, end)) in src.iter().zip(&s.a).enumerate() {
            let sg = [sge(m, 0, 3000)];
            s.p.a
                .post_send(
                    end.qpn,
                    &[SendWr::new(10 * round + k as u64, SendOp::Send, &sg).signaled()],
                )
                .unwrap();
        }
    }
    s.p.drive();
    for k in 0..2 {
        let wa = poll_all(&mut s.p.a, s.a[k].cq);
        assert!(
            wa.len() == 2 && wa.iter().all(|w| w.status == WcStatus::Success),
            "{wa:?}"
        );
    }
    let wb = poll_all(&mut s.p.b, s.b_cq);
    assert_eq!(wb.len(), 4, "{wb:?}");
    // Every WQE was used once, each by the QP whose message it completed, in post order.
    let ids: Vec<u64> = wb.iter().map(|w| w.wr_id).collect();
    assert_eq!(ids, vec![0, 1, 2, 3], "WQEs are taken in post order");
    let bytes = s.p.b.mr_bytes(dst.lkey).unwrap();
    for w in &wb {
        assert_eq!(
            (w.status, w.opcode, w.byte_len),
            (WcStatus::Success, WcOpcode::Recv, 3000)
        );
        let k = s.b_qps.iter().position(|&q| q == w.qp_num).unwrap();
        assert_eq!(w.src_qp, s.a[k].qpn);
        let want = s.p.a.mr_bytes(src[k].lkey).unwrap();
        let off = 4096 * w.wr_id as usize;
        assert_eq!(&bytes[off..off + 3000], &want[..], "WQE {}", w.wr_id);
    }
    assert_eq!(s.p.b.srq_outstanding(s.srq), Some(0));
    assert_counters_add_up(&s.p.b);
}

#[test]
fn rc_on_an_empty_srq_gets_rnr_nak_until_a_wqe_is_posted() {
    let o = ConnOpts::default();
    let mut s = srq_setup(&o, 1, 8);
    let dst = mr(&mut s.p.b, s.b_pd, 16 * 4096, |_| 0);
    let src = mr(&mut s.p.a, s.a[0].pd, 2000, |i| i as u8);
    let sg = [sge(&src, 0, 2000)];
    s.p.a
        .post_send(s.a[0].qpn, &[SendWr::new(7, SendOp::Send, &sg).signaled()])
        .unwrap();
    s.p.drive_for(Duration::from_millis(5));
    let rnr = s.p.b.counters().send_rnr_err;
    assert!(rnr >= 1, "the responder sent no RNR NAK");
    assert!(s.p.a.counters().rcvd_rnr_err >= 1);
    assert!(poll_all(&mut s.p.b, s.b_cq).is_empty());
    assert!(poll_all(&mut s.p.a, s.a[0].cq).is_empty());
    post_srq(&mut s.p.b, s.srq, &dst, 0..1);
    s.p.drive();
    let wa = poll_all(&mut s.p.a, s.a[0].cq);
    assert_eq!(
        wa.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        vec![(7, WcStatus::Success)]
    );
    let wb = poll_all(&mut s.p.b, s.b_cq);
    assert_eq!(
        wb.iter()
            .map(|w| (w.wr_id, w.status, w.byte_len))
            .collect::<Vec<_>>(),
        vec![(0, WcStatus::Success, 2000)]
    );
    assert_eq!(
        &s.p.b.mr_bytes(dst.lkey).unwrap()[..2000],
        &s.p.a.mr_bytes(src.lkey).unwrap()[..]
    );
}

#[test]
fn ud_on_an_empty_srq_drops_and_counts_then_receives_with_grh() {
    let o = ConnOpts {
        qp_type: QpType::Ud,
        ..ConnOpts::default()
    };
    let mut s = srq_setup(&o, 2, 8);
    let dst = mr(&mut s.p.b, s.b_pd, 16 * 4096, |_| 0);
    let src = mr(&mut s.p.a, s.a[0].pd, 512, |i| (i ^ 0x3c) as u8);
    let d0 = ud_dest(&mut s, 0);
    let sg = [sge(&src, 0, 512)];
    s.p.a
        .post_send(
            s.a[0].qpn,
            &[SendWr::new(1, SendOp::Send, &sg).signaled().ud(d0)],
        )
        .unwrap();
    s.p.drive();
    assert_eq!(s.p.b.counters().drop_ud_no_recv, 1);
    assert!(poll_all(&mut s.p.b, s.b_cq).is_empty());
    post_srq(&mut s.p.b, s.srq, &dst, 0..2);
    let d1 = ud_dest(&mut s, 1);
    let src1 = mr(&mut s.p.a, s.a[1].pd, 512, |i| (i ^ 0x3c) as u8);
    let sg1 = [sge(&src1, 0, 512)];
    for k in 0..2 {
        let (d, sg) = if k == 0 { (d0, &sg) } else { (d1, &sg1) };
        s.p.a
            .post_send(
                s.a[k].qpn,
                &[SendWr::new(2, SendOp::Send, sg).signaled().ud(d)],
            )
            .unwrap();
        s.p.drive();
    }
    let wb = poll_all(&mut s.p.b, s.b_cq);
    assert_eq!(wb.len(), 2, "{wb:?}");
    for (k, w) in wb.iter().enumerate() {
        assert_eq!(
            (w.wr_id, w.status, w.byte_len, w.qp_num, w.src_qp),
            (k as u64, WcStatus::Success, 552, s.b_qps[k], s.a[k].qpn)
        );
        assert!(w.wc_flags.contains(WcFlags::GRH));
        let off = 4096 * k + 40;
        assert_eq!(
            &s.p.b.mr_bytes(dst.lkey).unwrap()[off..off + 512],
            &s.p.a.mr_bytes(src.lkey).unwrap()[..]
        );
    }
    assert_eq!(s.p.b.counters().drop_ud_no_recv, 1);
}

#[test]
fn uc_on_an_empty_srq_drops_the_whole_message_and_counts_it() {
    let o = ConnOpts {
        qp_type: QpType::Uc,
        ..ConnOpts::default()
    };
    let mut s = srq_setup(&o, 1, 8);
    let dst = mr(&mut s.p.b, s.b_pd, 16 * 4096, |_| 0);
    let src = mr(&mut s.p.a, s.a[0].pd, 3000, |i| (i * 5) as u8);
    let sg = [sge(&src, 0, 3000)];
    s.p.a
        .post_send(s.a[0].qpn, &[SendWr::new(1, SendOp::Send, &sg).signaled()])
        .unwrap();
    s.p.drive();
    // FIRST, MIDDLE and LAST of the message each counted as dropped for lack of a WQE.
    assert_eq!(s.p.b.counters().drop_uc_no_recv, 3);
    post_srq(&mut s.p.b, s.srq, &dst, 0..1);
    s.p.a
        .post_send(s.a[0].qpn, &[SendWr::new(2, SendOp::Send, &sg).signaled()])
        .unwrap();
    s.p.drive();
    let wb = poll_all(&mut s.p.b, s.b_cq);
    assert_eq!(
        wb.iter()
            .map(|w| (w.wr_id, w.status, w.byte_len))
            .collect::<Vec<_>>(),
        vec![(0, WcStatus::Success, 3000)]
    );
    assert_eq!(
        &s.p.b.mr_bytes(dst.lkey).unwrap()[..3000],
        &s.p.a.mr_bytes(src.lkey).unwrap()[..]
    );
}

fn srq_events(e: &mut Engine) -> Vec<AsyncEvent> {
    core::iter::from_fn(|| e.poll_async_event())
        .filter(|ev| {
            matches!(
                ev.event_type,
                AsyncEventType::SrqLimitReached | AsyncEventType::QpLastWqeReached
            )
        })
        .collect()
}

#[test]
fn limit_event_fires_once_when_the_srq_falls_below_the_armed_limit() {
    let o = ConnOpts::default();
    let mut s = srq_setup(&o, 1, 8);
    let dst = mr(&mut s.p.b, s.b_pd, 16 * 4096, |_| 0);
    let src = mr(&mut s.p.a, s.a[0].pd, 64, |i| i as u8);
    post_srq(&mut s.p.b, s.srq, &dst, 0..5);
    let srq = s.srq;
    let arm = |e: &mut Engine, limit| {
        e.modify_srq(
            srq,
            &SrqAttr {
                srq_limit: limit,
                ..SrqAttr::default()
            },
            SrqAttrMask::LIMIT,
        )
    };
    // A limit above max_wr is refused.
    assert!(matches!(
        arm(&mut s.p.b, 9),
        Err(ResourceError::InvalidArgument(_))
    ));
    arm(&mut s.p.b, 3).unwrap();
    assert_eq!(s.p.b.query_srq(s.srq).unwrap().srq_limit, 3);
    let send = |s: &mut SrqSetup, id| {
        let sg = [sge(&src, 0, 64)];
        s.p.a
            .post_send(s.a[0].qpn, &[SendWr::new(id, SendOp::Send, &sg).signaled()])
            .unwrap();
        s.p.drive();
    };
    // 5 → 4 → 3 WQEs: not below 3, no event.
    send(&mut s, 1);
    send(&mut s, 2);
    assert_eq!(srq_events(&mut s.p.b), vec![]);
    // 3 → 2: below the limit: one event naming the SRQ, and the limit disarms.
    send(&mut s, 3);
    assert_eq!(
        srq_events(&mut s.p.b),
        vec![AsyncEvent {
            event_type: AsyncEventType::SrqLimitReached,
            qpn: None,
            cq: None,
            srq: Some(s.srq),
        }]
    );
    assert_eq!(s.p.b.query_srq(s.srq).unwrap().srq_limit, 0);
    // 2 → 1: disarmed, silent.
    send(&mut s, 4);
    assert_eq!(srq_events(&mut s.p.b), vec![]);
    // Armed again at 2 with 1 left: fires on the next WQE taken (1 → 0).
    arm(&mut s.p.b, 2).unwrap();
    send(&mut s, 5);
    assert_eq!(srq_events(&mut s.p.b).len(), 1);
    assert_eq!(poll_all(&mut s.p.b, s.b_cq).len(), 5);
}

#[test]
fn a_qp_on_an_srq_entering_error_raises_last_wqe_reached_and_leaves_the_srq_alone() {
    let o = ConnOpts::default();
    let mut s = srq_setup(&o, 2, 8);
    let dst = mr(&mut s.p.b, s.b_pd, 16 * 4096, |_| 0);
    post_srq(&mut s.p.b, s.srq, &dst, 0..3);
    s.p.b
        .modify_qp(
            s.b_qps[0],
            &QpAttr {
                qp_state: QpState::Err,
                ..QpAttr::default()
            },
            QpAttrMask::STATE,
        )
        .unwrap();
    let ev = srq_events(&mut s.p.b);
    assert_eq!(
        ev.iter().map(|e| (e.event_type, e.qpn)).collect::<Vec<_>>(),
        vec![(AsyncEventType::QpLastWqeReached, Some(s.b_qps[0]))]
    );
    // The SRQ's WQEs are not flushed by the QP: the other QP still uses them.
    assert!(poll_all(&mut s.p.b, s.b_cq).is_empty());
    assert_eq!(s.p.b.srq_outstanding(s.srq), Some(3));
    let src = mr(&mut s.p.a, s.a[1].pd, 100, |i| i as u8);
    let sg = [sge(&src, 0, 100)];
    s.p.a
        .post_send(s.a[1].qpn, &[SendWr::new(1, SendOp::Send, &sg).signaled()])
        .unwrap();
    s.p.drive();
    let wb = poll_all(&mut s.p.b, s.b_cq);
    assert_eq!(
        wb.iter()
            .map(|w| (w.wr_id, w.status, w.qp_num))
            .collect::<Vec<_>>(),
        vec![(0, WcStatus::Success, s.b_qps[1])]
    );
    assert_eq!(s.p.b.srq_outstanding(s.srq), Some(2));
}

#[test]
fn srq_object_rules_busy_post_recv_refused_resize_and_limits() {
    let o = ConnOpts::default();
    let mut s = srq_setup(&o, 1, 4);
    let e = &mut s.p.b;
    let dst = mr(e, s.b_pd, 16 * 4096, |_| 0);
    // post_recv on a QP on an SRQ is refused; the SRQ's own queue fills at max_wr.
    let err = e
        .post_recv(
            s.b_qps[0],
            &[RecvWr {
                wr_id: 1,
                sg_list: &[sge(&dst, 0, 64)],
            }],
        )
        .unwrap_err();
    assert_eq!(err.kind, PostErrorKind::QpOnSrq);
    post_srq(e, s.srq, &dst, 0..4);
    let full = e
        .post_srq_recv(
            s.srq,
            &[RecvWr {
                wr_id: 9,
                sg_list: &[],
            }],
        )
        .unwrap_err();
    assert_eq!(full.kind, PostErrorKind::QueueFull);
    let five = [sge(&dst, 0, 8); 5];
    let many = e
        .post_srq_recv(
            s.srq,
            &[RecvWr {
                wr_id: 9,
                sg_list: &five,
            }],
        )
        .unwrap_err();
    assert!(matches!(many.kind, PostErrorKind::TooManySges { .. }));
    // Resize: not below the 4 posted; growing keeps them in order.
    let srq = s.srq;
    let resize = |e: &mut Engine, n| {
        e.modify_srq(
            srq,
            &SrqAttr {
                max_wr: n,
                ..SrqAttr::default()
            },
            SrqAttrMask::MAX_WR,
        )
    };
    assert!(resize(e, 3).is_err());
    assert!(resize(e, 0).is_err());
    resize(e, 6).unwrap();
    assert_eq!(e.query_srq(s.srq).unwrap().max_wr, 6);
    post_srq(e, s.srq, &dst, 4..6);
    assert_eq!(e.srq_outstanding(s.srq), Some(6));
    // Device limits: create_srq checks what query_device reports.
    let d = e.query_device();
    assert!(e.create_srq(s.b_pd, d.max_srq_wr + 1, 1).is_err());
    assert!(e.create_srq(s.b_pd, 0, 1).is_err());
    assert!(e.create_srq(s.b_pd, 1, d.max_srq_sge + 1).is_err());
    // EBUSY while a QP uses it (and the PD while the SRQ exists); fine once the QP is gone.
    assert_eq!(
        e.destroy_srq(s.srq),
        Err(ResourceError::Busy("SRQ has QPs"))
    );
    e.destroy_qp(s.b_qps[0]).unwrap();
    assert!(matches!(e.dealloc_pd(s.b_pd), Err(ResourceError::Busy(_))));
    // The posted WQEs' leases go with the SRQ: the MR can be deregistered afterwards.
    assert!(matches!(e.dereg_mr(dst.lkey), Err(ResourceError::Busy(_))));
    e.destroy_srq(s.srq).unwrap();
    assert!(e.query_srq(s.srq).is_none());
    e.dereg_mr(dst.lkey).unwrap();
    assert_eq!(
        e.post_srq_recv(s.srq, &[]).unwrap_err().kind,
        PostErrorKind::UnknownSrq
    );
    e.destroy_cq(s.b_cq).unwrap();
    e.dealloc_pd(s.b_pd).unwrap();
}

#[test]
fn create_qp_on_a_dead_srq_is_refused() {
    let mut e = Engine::new(cfg(MAC_A, IP_A, 1));
    let pd = e.alloc_pd().unwrap();
    let cq = e.create_cq(16).unwrap();
    let init = QpInitAttr {
        qp_type: QpType::Rc,
        pd,
        send_cq: cq,
        recv_cq: cq,
        cap: QpCap {
            max_send_wr: 4,
            max_recv_wr: 0,
            max_send_sge: 1,
            max_recv_sge: 0,
            max_inline_data: 0,
        },
        sq_sig_all: false,
    };
    assert!(e.create_qp_srq(&init, Some(SrqHandle(1))).is_err());
    let (srq, _) = e.create_srq(pd, 4, 1).unwrap();
    e.create_qp_srq(&init, Some(srq)).unwrap();
}
