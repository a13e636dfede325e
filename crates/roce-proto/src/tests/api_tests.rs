//! Verbs-level behaviour: device limits, caps (S09), max message (S10), MR leases, CQ overrun, SQD, fence and
//! `max_rd_atomic`, UC resync, IPv6, counters and the QP dump.

use std::time::Duration;

use super::util::*;
use crate::*;

fn setup(o: &ConnOpts) -> (Pair, End, End, MrInfo, MrInfo) {
    let mut p = Pair::new();
    let (a, b) = connect(&mut p, o);
    let ma = mr(&mut p.a, a.pd, 1 << 16, |i| (i % 251) as u8);
    let mb = mr(&mut p.b, b.pd, 1 << 16, |_| 0);
    (p, a, b, ma, mb)
}

#[test]
fn query_device_reports_enforced_limits() {
    let e = Engine::new(cfg(MAC_A, IP_A, 1));
    let d = e.query_device();
    assert!(d.max_sge >= 16 && d.max_inline_data >= 256);
    assert_eq!(d.max_msg_sz, 1 << 31);
    assert_eq!(d.max_mtu, Mtu::Mtu4096, "netdev 4200 → 4096");
    let e = Engine::new(EngineConfig {
        netdev_mtu: 1500,
        ..cfg(MAC_A, IP_A, 1)
    });
    assert_eq!(
        e.query_device().max_mtu,
        Mtu::Mtu1024,
        "rxe rule: largest IB MTU ≤ netdev MTU − 80"
    );
}

#[test]
fn s09_caps_reject_or_clamp() {
    let mut e = Engine::new(cfg(MAC_A, IP_A, 1));
    let pd = e.alloc_pd().unwrap();
    let cq = e.create_cq(16).unwrap();
    let max = e.query_device().max_inline_data;
    let mut init = QpInitAttr {
        qp_type: QpType::Rc,
        pd,
        send_cq: cq,
        recv_cq: cq,
        cap: QpCap {
            max_send_wr: 8,
            max_recv_wr: 8,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: max + 1,
        },
        sq_sig_all: false,
    };
    let err = e.create_qp(&init).unwrap_err();
    assert_eq!(
        err,
        CreateQpError::CapExceeded {
            field: "max_inline_data",
            requested: max + 1,
            limit: max
        }
    );
    assert_eq!(
        err.to_string(),
        format!(
            "cap.max_inline_data = {} exceeds the device limit {max}",
            max + 1
        )
    );
    let mut e = Engine::new(EngineConfig {
        cap_policy: CapPolicy::Clamp,
        ..cfg(MAC_A, IP_A, 1)
    });
    let pd = e.alloc_pd().unwrap();
    let cq = e.create_cq(16).unwrap();
    init.pd = pd;
    init.send_cq = cq;
    init.recv_cq = cq;
    let (qpn, cap) = e.create_qp(&init).unwrap();
    assert_eq!(cap.max_inline_data, max);
    assert_eq!(e.query_qp(qpn).unwrap().cap.max_inline_data, max);
    // CQ in use cannot be destroyed; PD with a QP cannot be deallocated.
    assert!(matches!(e.destroy_cq(cq), Err(ResourceError::Busy(_))));
    assert!(matches!(e.dealloc_pd(pd), Err(ResourceError::Busy(_))));
    e.destroy_qp(qpn).unwrap();
    e.destroy_cq(cq).unwrap();
    e.dealloc_pd(pd).unwrap();
}

#[test]
fn s10_message_larger_than_max_msg_sz_is_loc_len_err() {
    let (mut p, a, _b, ma, _mb) = setup(&ConnOpts::default());
    // 2^31 + 1 bytes of SGEs (SGEs may overlap one MR).
    let big =
        p.a.reg_mr(a.pd, vec![0u8; 1 << 30], AccessFlags::LOCAL_WRITE)
            .unwrap();
    let s = [sge(&big, 0, 1 << 30), sge(&big, 0, 1 << 30), sge(&ma, 0, 1)];
    p.a.post_send(a.qpn, &[SendWr::new(1, SendOp::Send, &s)])
        .unwrap();
    p.drive();
    let wa = poll_all(&mut p.a, a.cq);
    assert_eq!(
        wa.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        vec![(1, WcStatus::LocLenErr)]
    );
    assert!(p.captured.is_empty(), "nothing was sent");
    assert_eq!(p.a.qp_info(a.qpn).unwrap().state, QpState::Err);
}

#[test]
fn post_errors_are_synchronous_and_name_the_wr() {
    let (mut p, a, _b, ma, mb) = setup(&ConnOpts::default());
    let s: Vec<Sge> = (0..5).map(|i| sge(&ma, i * 10, 10)).collect();
    let ok = [sge(&ma, 0, 10)];
    let e =
        p.a.post_send(
            a.qpn,
            &[
                SendWr::new(1, SendOp::Send, &ok),
                SendWr::new(2, SendOp::Send, &s),
            ],
        )
        .unwrap_err();
    assert_eq!(
        e,
        PostError {
            index: 1,
            kind: PostErrorKind::TooManySges { given: 5, max: 4 }
        }
    );
    // Before RTS posting fails with the state.
    let o = ConnOpts::default();
    let c = make_qp(&mut p.a, &o);
    let e =
        p.a.post_send(c.qpn, &[SendWr::new(3, SendOp::Send, &ok)])
            .unwrap_err();
    assert_eq!(e.kind, PostErrorKind::InvalidState(QpState::Reset));
    // SQ full.
    let o = ConnOpts {
        cap: QpCap {
            max_send_wr: 2,
            ..ConnOpts::default().cap
        },
        ..ConnOpts::default()
    };
    let (x, _y) = connect(&mut p, &o);
    let wrs: Vec<_> = (0..3)
        .map(|i| {
            SendWr::new(
                i,
                SendOp::RdmaWrite {
                    remote_addr: mb.addr,
                    rkey: mb.rkey,
                },
                &ok,
            )
        })
        .collect();
    assert_eq!(
        p.a.post_send(x.qpn, &wrs).unwrap_err(),
        PostError {
            index: 2,
            kind: PostErrorKind::QueueFull
        }
    );
}

#[test]
fn dereg_mr_busy_while_leased_and_cq_overrun_event() {
    let (mut p, a, b, ma, mb) = setup(&ConnOpts::default());
    p.b.post_recv(
        b.qpn,
        &[RecvWr {
            wr_id: 1,
            sg_list: &[sge(&mb, 0, 100)],
        }],
    )
    .unwrap();
    assert!(
        matches!(p.b.dereg_mr(mb.lkey), Err(ResourceError::Busy(_))),
        "posted receive holds a lease"
    );
    p.a.post_send(a.qpn, &[SendWr::new(1, SendOp::Send, &[sge(&ma, 0, 10)])])
        .unwrap();
    assert!(matches!(p.a.dereg_mr(ma.lkey), Err(ResourceError::Busy(_))));
    p.drive();
    assert!(p.a.dereg_mr(ma.lkey).is_ok());
    let _ = poll_all(&mut p.b, b.cq);
    assert!(p.b.dereg_mr(mb.lkey).is_ok());
    // CQ overrun: depth-1 CQ, two completions.
    let mut e = Engine::new(cfg(MAC_A, IP_A, 1));
    let pd = e.alloc_pd().unwrap();
    let cq = e.create_cq(1).unwrap();
    let (q, _) = e
        .create_qp(&QpInitAttr {
            qp_type: QpType::Rc,
            pd,
            send_cq: cq,
            recv_cq: cq,
            cap: QpCap {
                max_send_wr: 4,
                max_recv_wr: 4,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            sq_sig_all: false,
        })
        .unwrap();
    let at = QpAttr {
        qp_state: QpState::Init,
        qp_access_flags: AccessFlags::EMPTY,
        ..QpAttr::default()
    };
    e.modify_qp(
        q,
        &at,
        QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::ACCESS_FLAGS,
    )
    .unwrap();
    e.post_recv(
        q,
        &[
            RecvWr {
                wr_id: 1,
                sg_list: &[],
            },
            RecvWr {
                wr_id: 2,
                sg_list: &[],
            },
        ],
    )
    .unwrap();
    e.modify_qp(
        q,
        &QpAttr {
            qp_state: QpState::Err,
            ..at
        },
        QpAttrMask::STATE,
    )
    .unwrap();
    let mut wc = [Wc::default(); 4];
    assert_eq!(e.poll_cq(cq, &mut wc), 1);
    assert_eq!(e.counters().cq_overflow, 1);
    let evs: Vec<_> = std::iter::from_fn(|| e.poll_async_event())
        .map(|ev| ev.event_type)
        .collect();
    assert!(evs.contains(&AsyncEventType::CqErr), "{evs:?}");
    assert_eq!(e.poll_cq(cq, &mut wc), 0, "empty CQ is 0, not an error");
}

#[test]
fn max_rd_atomic_and_fence_order_requests() {
    let o = ConnOpts {
        max_rd_atomic: 1,
        ..ConnOpts::default()
    };
    let (mut p, a, b, ma, mb) = setup(&o);
    p.b.post_recv(
        b.qpn,
        &[RecvWr {
            wr_id: 1,
            sg_list: &[sge(&mb, 0, 100)],
        }],
    )
    .unwrap();
    let s = [sge(&ma, 0, 3000)];
    let s2 = [sge(&ma, 4000, 3000)];
    let w = [sge(&ma, 8000, 10)];
    p.a.post_send(
        a.qpn,
        &[
            SendWr::new(
                1,
                SendOp::RdmaRead {
                    remote_addr: mb.addr,
                    rkey: mb.rkey,
                },
                &s,
            ),
            SendWr::new(
                2,
                SendOp::RdmaRead {
                    remote_addr: mb.addr,
                    rkey: mb.rkey,
                },
                &s2,
            ),
            SendWr::new(3, SendOp::Send, &w).flags(SendFlags::FENCE),
        ],
    )
    .unwrap();
    // Only the first READ request goes out before its responses arrive.
    let mut buf = vec![0u8; 9000];
    assert!(p.a.poll_transmit(p.now, &mut buf).is_some());
    assert!(
        p.a.poll_transmit(p.now, &mut buf).is_none(),
        "max_rd_atomic = 1 holds the second READ"
    );
    p.drive();
    let reqs: Vec<(u8, u32)> = p
        .captured
        .iter()
        .filter(|c| c.1 == Dir::AtoB)
        .map(|c| (bth_of(&c.2).0, bth_of(&c.2).1))
        .collect();
    assert_eq!(reqs, vec![(0x0c, 100), (0x0c, 103), (0x04, 106)]);
    // The fenced SEND left only after the second READ's last response.
    let last_resp = p
        .captured
        .iter()
        .position(|c| c.1 == Dir::BtoA && bth_of(&c.2).0 == 0x0f && bth_of(&c.2).1 == 105)
        .unwrap();
    let send = p
        .captured
        .iter()
        .position(|c| c.1 == Dir::AtoB && bth_of(&c.2).0 == 0x04)
        .unwrap();
    assert!(send > last_resp);
    assert_eq!(poll_all(&mut p.a, a.cq).len(), 3);
}

#[test]
fn sqd_drains_and_notifies() {
    let o = ConnOpts {
        timeout: 8,
        ..ConnOpts::default()
    };
    let (mut p, a, b, ma, mb) = setup(&o);
    p.b.post_recv(
        b.qpn,
        &[RecvWr {
            wr_id: 1,
            sg_list: &[sge(&mb, 0, 8000)],
        }],
    )
    .unwrap();
    let s = [sge(&ma, 0, 5000)];
    p.a.post_send(
        a.qpn,
        &[
            SendWr::new(1, SendOp::Send, &s),
            SendWr::new(2, SendOp::Send, &s),
        ],
    )
    .unwrap();
    let mut buf = vec![0u8; 9000];
    let _ = p.a.poll_transmit(p.now, &mut buf).unwrap(); // FIRST of WR 1 leaves; the engine keeps the rest
    let first = buf.clone();
    let at = QpAttr {
        qp_state: QpState::Sqd,
        en_sqd_async_notify: true,
        ..QpAttr::default()
    };
    p.a.modify_qp(
        a.qpn,
        &at,
        QpAttrMask::STATE | QpAttrMask::EN_SQD_ASYNC_NOTIFY,
    )
    .unwrap();
    p.b.handle_frame(p.now, &first);
    p.drive();
    // WR 1 (already started) finished; WR 2 did not start.
    let wa = poll_all(&mut p.a, a.cq);
    assert_eq!(wa.iter().map(|w| w.wr_id).collect::<Vec<_>>(), vec![1]);
    let evs: Vec<_> = std::iter::from_fn(|| p.a.poll_async_event())
        .map(|e| e.event_type)
        .collect();
    assert_eq!(evs, vec![AsyncEventType::SqDrained]);
    // Back to RTS: WR 2 goes.
    p.a.modify_qp(
        a.qpn,
        &QpAttr {
            qp_state: QpState::Rts,
            ..QpAttr::default()
        },
        QpAttrMask::STATE,
    )
    .unwrap();
    p.b.post_recv(
        b.qpn,
        &[RecvWr {
            wr_id: 2,
            sg_list: &[sge(&mb, 0, 8000)],
        }],
    )
    .unwrap();
    p.drive();
    assert_eq!(
        poll_all(&mut p.a, a.cq)
            .iter()
            .map(|w| w.wr_id)
            .collect::<Vec<_>>(),
        vec![2]
    );
}

#[test]
fn uc_gap_drops_partial_message_and_resyncs() {
    let o = ConnOpts {
        qp_type: QpType::Uc,
        ..ConnOpts::default()
    };
    let (mut p, a, b, ma, mb) = setup(&o);
    p.b.post_recv(
        b.qpn,
        &[
            RecvWr {
                wr_id: 1,
                sg_list: &[sge(&mb, 0, 8000)],
            },
            RecvWr {
                wr_id: 2,
                sg_list: &[sge(&mb, 0, 8000)],
            },
        ],
    )
    .unwrap();
    // Drop the MIDDLE of the first 3-packet message.
    let mut k = 0;
    p.filter = Box::new(move |_, _| {
        k += 1;
        k != 2
    });
    let s = [sge(&ma, 0, 2500)];
    p.a.post_send(
        a.qpn,
        &[
            SendWr::new(1, SendOp::Send, &s),
            SendWr::new(2, SendOp::Send, &s),
        ],
    )
    .unwrap();
    p.drive();
    assert_eq!(
        poll_all(&mut p.a, a.cq).len(),
        2,
        "UC completes at send time"
    );
    let wb = poll_all(&mut p.b, b.cq);
    assert_eq!(
        wb.iter().map(|w| (w.wr_id, w.byte_len)).collect::<Vec<_>>(),
        vec![(1, 2500)],
        "second message lands in WR 1"
    );
    assert!(p.b.counters().drop_uc_out_of_seq >= 1);
    assert_eq!(p.b.qp_info(b.qpn).unwrap().state, QpState::Rts);
}

/// UC has no RNR NAK: a SEND that finds no receive WQE is silently dropped, whole (rxe `rxe_resp.c`
/// `RESPST_ERR_RNR`: UD/UC class D, drop the message). That is not a PSN gap: every packet of it counts as
/// `drop_uc_no_recv`, none as `drop_uc_out_of_seq`, and the next message lands once a receive is posted.
#[test]
fn uc_send_without_receive_counts_no_recv_not_out_of_seq() {
    let o = ConnOpts {
        qp_type: QpType::Uc,
        ..ConnOpts::default()
    };
    let (mut p, a, b, ma, mb) = setup(&o);
    // A 3-packet message (PMTU 1024) and a 1-packet one, with no receive posted.
    let long = [sge(&ma, 0, 2500)];
    let short = [sge(&ma, 0, 100)];
    p.a.post_send(
        a.qpn,
        &[
            SendWr::new(1, SendOp::Send, &long),
            SendWr::new(2, SendOp::Send, &short),
        ],
    )
    .unwrap();
    p.drive();
    assert_eq!(
        poll_all(&mut p.a, a.cq).len(),
        2,
        "UC completes at send time"
    );
    assert!(poll_all(&mut p.b, b.cq).is_empty());
    for c in [p.b.counters(), p.b.qp_counters(b.qpn).unwrap()] {
        assert_eq!(c.drop_uc_no_recv, 4, "all 4 packets of the 2 messages");
        assert_eq!(c.drop_uc_out_of_seq, 0, "no PSN gap");
        assert_eq!(c.out_of_sequence, 0);
    }
    assert_counters_add_up(&p.b);
    // With a receive posted the next message lands: ePSN followed the dropped ones.
    p.b.post_recv(
        b.qpn,
        &[RecvWr {
            wr_id: 7,
            sg_list: &[sge(&mb, 0, 8000)],
        }],
    )
    .unwrap();
    p.a.post_send(a.qpn, &[SendWr::new(3, SendOp::Send, &long)])
        .unwrap();
    p.drive();
    let wb = poll_all(&mut p.b, b.cq);
    assert_eq!(
        wb.iter().map(|w| (w.wr_id, w.byte_len)).collect::<Vec<_>>(),
        vec![(7, 2500)]
    );
    assert_eq!(p.b.counters().drop_uc_no_recv, 4);
    assert_eq!(p.b.counters().drop_uc_out_of_seq, 0);
    assert_eq!(p.b.qp_info(b.qpn).unwrap().state, QpState::Rts);
}

#[test]
fn ipv6_rc_round_trip() {
    let ga = Gid([0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
    let gb = Gid([0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2]);
    let ca = EngineConfig {
        mac: MAC_A,
        gids: vec![ga],
        ..EngineConfig::default()
    };
    let cb = EngineConfig {
        mac: MAC_B,
        gids: vec![gb],
        ..EngineConfig::default()
    };
    let mut p = Pair::with_configs(ca, cb);
    let o = ConnOpts::default();
    let a = make_qp(&mut p.a, &o);
    let b = make_qp(&mut p.b, &o);
    // Bring up by hand with IPv6 GIDs.
    for (e, me, peer, mac, gid, sq, rq) in [
        (&mut p.a, a, b.qpn, MAC_B, gb, o.a_psn, o.b_psn),
        (&mut p.b, b, a.qpn, MAC_A, ga, o.b_psn, o.a_psn),
    ] {
        let mut at = QpAttr {
            qp_state: QpState::Init,
            qp_access_flags: o.access,
            ..QpAttr::default()
        };
        e.modify_qp(
            me.qpn,
            &at,
            QpAttrMask::STATE
                | QpAttrMask::PKEY_INDEX
                | QpAttrMask::PORT
                | QpAttrMask::ACCESS_FLAGS,
        )
        .unwrap();
        at.qp_state = QpState::Rtr;
        at.ah_attr = AhAttr {
            dgid: gid,
            dmac: mac,
            ..AhAttr::default()
        };
        at.dest_qp_num = peer;
        at.rq_psn = rq;
        e.modify_qp(
            me.qpn,
            &at,
            QpAttrMask::STATE
                | QpAttrMask::AV
                | QpAttrMask::PATH_MTU
                | QpAttrMask::DEST_QPN
                | QpAttrMask::RQ_PSN
                | QpAttrMask::MAX_DEST_RD_ATOMIC
                | QpAttrMask::MIN_RNR_TIMER,
        )
        .unwrap();
        at.qp_state = QpState::Rts;
        at.sq_psn = sq;
        e.modify_qp(
            me.qpn,
            &at,
            QpAttrMask::STATE
                | QpAttrMask::SQ_PSN
                | QpAttrMask::TIMEOUT
                | QpAttrMask::RETRY_CNT
                | QpAttrMask::RNR_RETRY
                | QpAttrMask::MAX_QP_RD_ATOMIC,
        )
        .unwrap();
    }
    let ma = mr(&mut p.a, a.pd, 4096, |i| i as u8);
    let mb = mr(&mut p.b, b.pd, 4096, |_| 0);
    let s = [sge(&ma, 0, 2000)];
    p.a.post_send(
        a.qpn,
        &[SendWr::new(
            1,
            SendOp::RdmaWrite {
                remote_addr: mb.addr,
                rkey: mb.rkey,
            },
            &s,
        )
        .signaled()],
    )
    .unwrap();
    p.drive();
    assert_eq!(poll_all(&mut p.a, a.cq)[0].status, WcStatus::Success);
    assert_eq!(
        &p.b.mr_bytes(mb.lkey).unwrap()[..2000],
        &p.a.mr_bytes(ma.lkey).unwrap()[..2000]
    );
    assert_eq!(&p.captured[0].2[12..14], &[0x86, 0xdd]);
    // An IPv4 destination on an IPv6 source GID is rejected at modify time (S16).
    let c = make_qp(&mut p.a, &o);
    let at = QpAttr {
        qp_state: QpState::Init,
        qp_access_flags: o.access,
        ..QpAttr::default()
    };
    p.a.modify_qp(
        c.qpn,
        &at,
        QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::ACCESS_FLAGS,
    )
    .unwrap();
    let at = QpAttr {
        qp_state: QpState::Rtr,
        ah_attr: AhAttr {
            dgid: Gid::from_ipv4(IP_B),
            ..AhAttr::default()
        },
        ..at
    };
    let e = p.a.modify_qp(
        c.qpn,
        &at,
        QpAttrMask::STATE
            | QpAttrMask::AV
            | QpAttrMask::PATH_MTU
            | QpAttrMask::DEST_QPN
            | QpAttrMask::RQ_PSN
            | QpAttrMask::MAX_DEST_RD_ATOMIC
            | QpAttrMask::MIN_RNR_TIMER,
    );
    assert!(
        matches!(
            e,
            Err(ModifyQpError::InvalidValue {
                attr: "ah_attr.dgid",
                ..
            })
        ),
        "{e:?}"
    );
}

#[test]
fn s11_counters_by_name_and_qp_dump() {
    let (mut p, a, b, ma, mb) = setup(&ConnOpts::default());
    p.b.post_recv(
        b.qpn,
        &[RecvWr {
            wr_id: 1,
            sg_list: &[sge(&mb, 0, 100)],
        }],
    )
    .unwrap();
    p.a.post_send(a.qpn, &[SendWr::new(1, SendOp::Send, &[sge(&ma, 0, 10)])])
        .unwrap();
    p.drive();
    for name in [
        "sent_pkts",
        "rcvd_pkts",
        "duplicate_request",
        "out_of_seq_request",
        "rcvd_rnr_err",
        "send_rnr_err",
        "rcvd_seq_err",
        "ack_deferred",
        "retry_exceeded_err",
        "retry_rnr_exceeded_err",
        "completer_retry_err",
        "send_err",
        "link_downed",
        "rdma_sends",
        "rdma_recvs",
        "local_ack_timeout_err",
        "packet_seq_err",
        "implied_nak_seq_err",
        "rx_icrc_encapsulated",
        "np_cnp_sent",
        "rp_cnp_handled",
        "np_ecn_marked_roce_packets",
        "out_of_sequence",
    ] {
        assert!(Counters::NAMES.contains(&name), "{name}");
    }
    assert_eq!(p.a.counters().get("sent_pkts"), Some(1));
    assert_eq!(p.a.counters().get("rdma_sends"), Some(1));
    assert_eq!(p.b.counters().get("rdma_recvs"), Some(1));
    assert_eq!(p.a.counters().get("no_such_counter"), None);
    assert_eq!(p.a.counters().iter().count(), Counters::NAMES.len());
    assert_eq!(p.a.qp_counters(a.qpn).unwrap().sent_pkts, 1);
    let dump = p.a.qp_dump(a.qpn).unwrap();
    assert!(
        dump.contains(&format!("QP {} RC state=RTS", a.qpn))
            && dump.contains("next_psn=0x65")
            && dump.contains("una_psn=0x65")
            && dump.contains("msg=none")
            && dump.contains("rate: line (fixed cnps=0)"),
        "{dump}"
    );
    // S12: RC packets carry MigReq = 1.
    assert!(p.captured.iter().all(|c| c.2[43] & 0x40 != 0));
}

#[test]
fn zero_length_read_and_write() {
    let (mut p, a, _b, ma, mb) = setup(&ConnOpts::default());
    p.a.post_send(
        a.qpn,
        &[
            SendWr::new(
                1,
                SendOp::RdmaRead {
                    remote_addr: mb.addr,
                    rkey: mb.rkey,
                },
                &[],
            ),
            SendWr::new(
                2,
                SendOp::RdmaWrite {
                    remote_addr: mb.addr,
                    rkey: mb.rkey,
                },
                &[],
            ),
        ],
    )
    .unwrap();
    p.drive();
    let wa = poll_all(&mut p.a, a.cq);
    assert_eq!(
        wa.iter()
            .map(|w| (w.status, w.byte_len))
            .collect::<Vec<_>>(),
        vec![(WcStatus::Success, 0); 2]
    );
    let frames: Vec<(u8, u32)> = p
        .captured
        .iter()
        .map(|c| (bth_of(&c.2).0, bth_of(&c.2).1))
        .collect();
    assert_eq!(
        frames,
        vec![(0x0c, 100), (0x0a, 101), (0x10, 100), (0x11, 101)]
    );
    let _ = ma;
}

#[test]
fn rate_controller_seam_parks_the_qp() {
    let (mut p, a, b, ma, mb) = setup(&ConnOpts::default());
    // 8 Mbit/s: a 1 KiB frame every ~1 ms; a bucket of one frame (per-packet pacing, `DCQCN.md §7 TB6`).
    p.a.set_qp_rate_limit(a.qpn, None, Some(0)).unwrap();
    p.a.set_rate_controller(a.qpn, Box::new(FixedRate::with_rate(8_000_000)))
        .unwrap();
    assert_eq!(p.a.qp_rate_bps(a.qpn), Some(8_000_000));
    p.b.post_recv(
        b.qpn,
        &[RecvWr {
            wr_id: 1,
            sg_list: &[sge(&mb, 0, 8000)],
        }],
    )
    .unwrap();
    p.a.post_send(a.qpn, &[SendWr::new(1, SendOp::Send, &[sge(&ma, 0, 4096)])])
        .unwrap();
    p.drive();
    let t: Vec<_> = p
        .captured
        .iter()
        .filter(|c| c.1 == Dir::AtoB)
        .map(|c| c.0)
        .collect();
    assert_eq!(t.len(), 4);
    for w in t.windows(2) {
        assert!(
            w[1] - w[0] >= Duration::from_micros(1000),
            "{:?}",
            w[1] - w[0]
        );
    }
    assert_eq!(poll_all(&mut p.a, a.cq)[0].status, WcStatus::Success);
}

#[test]
fn link_events_are_counted() {
    let mut e = Engine::new(cfg(MAC_A, IP_A, 1));
    e.handle_link_change(false);
    e.handle_link_change(true);
    assert_eq!(e.counters().link_downed, 1);
    let evs: Vec<_> = std::iter::from_fn(|| e.poll_async_event())
        .map(|ev| ev.event_type)
        .collect();
    assert_eq!(
        evs,
        vec![AsyncEventType::PortErr, AsyncEventType::PortActive]
    );
}

#[test]
fn zero_length_rdma_skips_rkey_checks() {
    let (mut p, a, _b, _ma, _mb) = setup(&ConnOpts::default());
    p.a.post_send(
        a.qpn,
        &[
            SendWr::new(
                1,
                SendOp::RdmaRead {
                    remote_addr: 0,
                    rkey: Rkey(0xdead),
                },
                &[],
            ),
            SendWr::new(
                2,
                SendOp::RdmaWrite {
                    remote_addr: 0,
                    rkey: Rkey(0xdead),
                },
                &[],
            ),
        ],
    )
    .unwrap();
    p.drive();
    let wa = poll_all(&mut p.a, a.cq);
    assert_eq!(
        wa.iter().map(|w| w.status).collect::<Vec<_>>(),
        vec![WcStatus::Success; 2]
    );
}

#[test]
fn engine_is_send() {
    fn assert_send<T: Send>() {}
    assert_send::<Engine>();
}

/// A controller that asks for a timer 10 µs after each CNP and records the calls (the DCQCN seam).
#[derive(Debug, Default)]
struct Probe {
    cnps: u32,
    timers: std::sync::Arc<std::sync::atomic::AtomicU32>,
    due: Option<Instant>,
}

impl RateController for Probe {
    fn on_tx(&mut self, _now: Instant, _bytes: usize) {}
    fn on_cnp(&mut self, now: Instant) -> bool {
        self.cnps += 1;
        self.due = Some(now + Duration::from_micros(10));
        true
    }
    fn rate_bps(&self) -> Option<u64> {
        None
    }
    fn next_timer(&self) -> Option<Instant> {
        self.due
    }
    fn on_timer(&mut self, now: Instant) {
        assert!(self.due.is_some_and(|d| d <= now));
        self.timers
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.due = None;
    }
}

#[test]
fn rate_controller_gets_cnps_and_its_timer() {
    let (mut p, a, b, ma, mb) = setup(&ConnOpts::default());
    let fired = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    p.a.set_rate_controller(
        a.qpn,
        Box::new(Probe {
            timers: fired.clone(),
            ..Probe::default()
        }),
    )
    .unwrap();
    p.filter = Box::new(|d, f| {
        if d == Dir::AtoB {
            f[15] |= 3;
        }
        true
    });
    p.b.post_recv(
        b.qpn,
        &[RecvWr {
            wr_id: 1,
            sg_list: &[sge(&mb, 0, 100)],
        }],
    )
    .unwrap();
    p.a.post_send(a.qpn, &[SendWr::new(1, SendOp::Send, &[sge(&ma, 0, 10)])])
        .unwrap();
    p.drive();
    assert_eq!(p.a.counters().rp_cnp_handled, 1);
    assert_eq!(fired.load(std::sync::atomic::Ordering::Relaxed), 1);
    assert!(p.a.qp_dump(a.qpn).unwrap().contains("cnps: 1"));
}

/// A controller at 10 Gb/s that drops to 1 Gb/s on a CNP and returns to 10 Gb/s 200 µs later (its timer).
#[derive(Debug)]
struct CutAndRecover {
    rate: u64,
    due: Option<Instant>,
}

impl RateController for CutAndRecover {
    fn on_tx(&mut self, _now: Instant, _bytes: usize) {}
    fn on_cnp(&mut self, now: Instant) -> bool {
        self.rate = 1_000_000_000;
        self.due = Some(now + Duration::from_micros(200));
        true
    }
    fn rate_bps(&self) -> Option<u64> {
        Some(self.rate)
    }
    fn next_timer(&self) -> Option<Instant> {
        self.due
    }
    fn on_timer(&mut self, _now: Instant) {
        self.rate = 10_000_000_000;
        self.due = None;
    }
}

/// The rate seam (`crate::cc`, `DCQCN.md §7 TB5`, `§2.3 R7`): the engine re-reads the controller's rate after a CNP
/// and after its timer. The cut clamps the bucket (187.5 KB deep by default) to a tenth, so right after the CNP the
/// QP sends at most that tenth plus what 1 Gb/s earns — not the ~80 KB left in the bucket; the increase re-times the
/// QP waiting for its next departure at once.
#[test]
fn rate_cut_clamps_the_bucket_and_an_increase_retimes_the_qp() {
    let (mut p, a, _b, _ma, _mb) = setup(&ConnOpts::default());
    let src = mr(&mut p.a, a.pd, 100 * 1024, |i| i as u8);
    let dst = mr(&mut p.b, _b.pd, 100 * 1024, |_| 0);
    p.a.set_rate_controller(
        a.qpn,
        Box::new(CutAndRecover {
            rate: 10_000_000_000,
            due: None,
        }),
    )
    .unwrap();
    let depth = p.a.config().sched.bdp_depth_bytes();
    assert_eq!(depth, 187_500);
    let write = |p: &mut Pair, id: u64| {
        p.a.post_send(
            a.qpn,
            &[SendWr::new(
                id,
                SendOp::RdmaWrite {
                    remote_addr: dst.addr,
                    rkey: dst.rkey,
                },
                &[sge(&src, 0, 100 * 1024)],
            )
            .signaled()],
        )
        .unwrap();
    };
    // The wire marks A's first frame CE, so B's notification point answers it with one CNP (marking more frames
    // would add a second CNP at the end of the 50-µs window, `DCQCN.md` §2.2 N2).
    let mut first = true;
    p.filter = Box::new(move |d, f| {
        if d == Dir::AtoB && std::mem::take(&mut first) {
            f[15] |= 3;
        }
        true
    });
    // 100 frames of 1 KiB leave at once from the full bucket (about 108 KB of 187.5 KB).
    write(&mut p, 1);
    p.transmit();
    let t0 = p.now;
    assert_eq!(p.captured.iter().filter(|c| c.1 == Dir::AtoB).count(), 100);
    let mut t_cnp = t0;
    while p.a.counters().rp_cnp_handled == 0 {
        assert!(p.step() && p.now < t0 + Duration::from_micros(10), "no CNP");
        t_cnp = p.now;
    }
    // The CNP cut 10 → 1 Gb/s; marking stops; now the second WRITE.
    assert_eq!(p.a.qp_rate_bps(a.qpn), Some(1_000_000_000));
    p.filter = Box::new(|_, _| true);
    write(&mut p, 2);
    let before = p.captured.len();
    p.drive_for(Duration::from_millis(2));
    assert_eq!(p.a.counters().rp_cnp_handled, 1, "one CNP");
    assert_eq!(
        poll_all(&mut p.a, a.cq)
            .iter()
            .map(|w| w.status)
            .collect::<Vec<_>>(),
        vec![WcStatus::Success; 2]
    );
    let second: Vec<(Instant, usize)> = p.captured[before..]
        .iter()
        .filter(|c| c.1 == Dir::AtoB)
        .map(|c| (c.0, c.2.len()))
        .collect();
    // Bytes of the second WRITE sent in the 10 µs after the CNP: ≤ depth/10 + 1 Gb/s · 10 µs (TB5 check (d)).
    let early: usize = second
        .iter()
        .filter(|(t, _)| *t <= t_cnp + Duration::from_micros(10))
        .map(|x| x.1)
        .sum();
    assert!(
        early as u64 <= depth / 10 + 1_250,
        "{early} bytes within 10 µs of the cut"
    );
    // At 10 Gb/s again from t_cnp + 200 µs: the QP, parked for its next 1 Gb/s departure (≈ 8.6 µs apart), leaves
    // within one 10 Gb/s frame time (≈ 0.9 µs) of the increase, and the WRITE finishes soon after.
    let t_inc = t_cnp + Duration::from_micros(200);
    let (after, _) = *second
        .iter()
        .find(|(t, _)| *t >= t_inc)
        .expect("frames after the increase");
    assert!(
        after - t_inc <= Duration::from_nanos(1_000),
        "first departure after the increase at +{:?}",
        after - t_inc
    );
    let last = second.last().unwrap().0;
    assert!(last - t0 < Duration::from_micros(300), "{:?}", last - t0);
    assert_eq!(p.a.qp_rate_bps(a.qpn), Some(10_000_000_000));
}

#[test]
fn ready_cq_list_reports_each_cq_with_news_once() {
    let mut p = Pair::new();
    let o = ConnOpts::default();
    let (a1, b1) = connect(&mut p, &o);
    let (a2, b2) = connect(&mut p, &o);
    let dst = mr(&mut p.b, b1.pd, 4096, |_| 0);
    let dst2 = mr(&mut p.b, b2.pd, 4096, |_| 0);
    assert_eq!(p.a.poll_ready_cq(), None);
    let send = |p: &mut Pair, qpn: Qpn, id: u64| {
        p.a.post_send(qpn, &[SendWr::new(id, SendOp::Send, &[]).inline(&[b"hi"])])
            .unwrap();
    };
    let recv = |p: &mut Pair, qpn: Qpn, m: &MrInfo| {
        p.b.post_recv(
            qpn,
            &[RecvWr {
                wr_id: 0,
                sg_list: &[sge(m, 0, 64)],
            }],
        )
        .unwrap();
    };
    recv(&mut p, b1.qpn, &dst);
    send(&mut p, a1.qpn, 1);
    p.drive();
    assert_eq!(p.a.poll_ready_cq(), Some(a1.cq));
    assert_eq!(p.a.poll_ready_cq(), None, "listed once");
    assert_eq!(p.b.poll_ready_cq(), Some(b1.cq));
    assert_eq!(p.b.poll_ready_cq(), None);
    // Two completions on one CQ: listed once. A CQ returned and left undrained is listed again only on news.
    recv(&mut p, b2.qpn, &dst2);
    recv(&mut p, b2.qpn, &dst2);
    send(&mut p, a2.qpn, 2);
    send(&mut p, a2.qpn, 3);
    p.drive();
    assert_eq!(p.a.poll_ready_cq(), Some(a2.cq));
    assert_eq!(p.a.poll_ready_cq(), None);
    assert_eq!(p.a.cq_len(a2.cq), 2);
    recv(&mut p, b2.qpn, &dst2);
    send(&mut p, a2.qpn, 4);
    p.drive();
    assert_eq!(p.a.poll_ready_cq(), Some(a2.cq));
    assert_eq!(p.a.cq_len(a2.cq), 3);
    // FIFO order across CQs.
    recv(&mut p, b1.qpn, &dst);
    recv(&mut p, b2.qpn, &dst2);
    send(&mut p, a2.qpn, 5);
    p.drive();
    send(&mut p, a1.qpn, 6);
    p.drive();
    assert_eq!(p.a.poll_ready_cq(), Some(a2.cq));
    assert_eq!(p.a.poll_ready_cq(), Some(a1.cq));
    assert_eq!(p.a.poll_ready_cq(), None);
    // A destroyed CQ leaves the list; a new CQ in its slot is not reported for the old one's completions.
    recv(&mut p, b1.qpn, &dst);
    send(&mut p, a1.qpn, 7);
    p.drive();
    p.a.destroy_qp(a1.qpn).unwrap();
    p.a.destroy_cq(a1.cq).unwrap();
    let c = p.a.create_cq(8).unwrap();
    assert_eq!(c, a1.cq, "slot reused");
    assert_eq!(p.a.poll_ready_cq(), None);
    assert_eq!(poll_all(&mut p.a, a2.cq).len(), 4);
}

/// Issue #21: 10,000 signalled WRs into a 16-entry CQ lost 9,968 completions silently while the QP stayed in RTS,
/// so a program waiting for them waited forever. A CQ overrun is a CQ error (IBTA Vol 1 §11.4.2.1): one `CqErr`
/// event, and the QPs that complete into that CQ go to the error state (`QpFatal`); a QP on another CQ is untouched.
#[test]
fn cq_overrun_is_a_cq_error_and_its_qps_go_to_error() {
    let mut p = Pair::new();
    let o = ConnOpts::default();
    let pd = p.a.alloc_pd().unwrap();
    let small = p.a.create_cq(2).unwrap();
    let (qpn, _) =
        p.a.create_qp(&QpInitAttr {
            qp_type: QpType::Rc,
            pd,
            send_cq: small,
            recv_cq: small,
            cap: o.cap,
            sq_sig_all: true,
        })
        .unwrap();
    let a = End { pd, cq: small, qpn };
    let b = make_qp(&mut p.b, &o);
    bring_up(&mut p.a, a, b.qpn, MAC_B, IP_B, o.a_psn, o.b_psn, &o);
    bring_up(&mut p.b, b, a.qpn, MAC_A, IP_A, o.b_psn, o.a_psn, &o);
    // A second connected pair on its own CQ, on the same engines.
    let (c, _d) = connect(&mut p, &o);
    let ma = mr(&mut p.a, a.pd, 64, |i| i as u8);
    let mb = mr(&mut p.b, b.pd, 64, |_| 0);
    let sg = [sge(&ma, 0, 8)];
    for i in 0..6 {
        let w = SendWr::new(
            i,
            SendOp::RdmaWrite {
                remote_addr: mb.addr,
                rkey: mb.rkey,
            },
            &sg,
        );
        p.a.post_send(a.qpn, &[w]).unwrap();
        p.drive();
    }
    assert!(p.a.counters().cq_overflow >= 4, "{:?}", p.a.counters());
    let evs: Vec<_> = std::iter::from_fn(|| p.a.poll_async_event()).collect();
    let cq_errs = evs
        .iter()
        .filter(|e| e.event_type == AsyncEventType::CqErr)
        .count();
    assert_eq!(cq_errs, 1, "one CQ error per overrun CQ: {evs:?}");
    assert!(
        evs.iter()
            .any(|e| e.event_type == AsyncEventType::QpFatal && e.qpn == Some(a.qpn)),
        "{evs:?}"
    );
    assert_eq!(p.a.query_qp(a.qpn).unwrap().qp_state, QpState::Err);
    assert_eq!(p.a.query_qp(c.qpn).unwrap().qp_state, QpState::Rts);
    // The two completions that fit are still there to poll.
    let mut wc = [Wc::default(); 8];
    assert_eq!(p.a.poll_cq(small, &mut wc), 2);
}

/// `dereg_mr_invalidate` (the C library's `ibv_dereg_mr`, issue #16): succeeds while a posted receive and a posted
/// send name the MRs; the receive completes with LOC_PROT_ERR and its QP goes to ERR (the WR behind it flushed), the
/// send likewise; the keys are dead at once (a new WR naming the old lkey fails its SGE check), and a SEND that
/// arrives for the deregistered receive buffer writes nothing into it.
#[test]
fn dereg_mr_invalidate_while_leased_fails_the_wrs_and_never_touches_the_memory() {
    let (mut p, a, b, ma, mb) = setup(&ConnOpts::default());
    p.b.post_recv(
        b.qpn,
        &[
            RecvWr {
                wr_id: 1,
                sg_list: &[sge(&mb, 0, 100)],
            },
            RecvWr {
                wr_id: 2,
                sg_list: &[sge(&mb, 100, 100)],
            },
        ],
    )
    .unwrap();
    let before = p.b.mr_bytes(mb.lkey).unwrap();
    assert!(p.b.mr_busy(mb.lkey));
    let back =
        p.b.dereg_mr_invalidate(mb.lkey)
            .expect("succeeds while leased");
    assert!(p.b.mr_bytes(mb.lkey).is_none(), "key dead at once");
    let wb = poll_all(&mut p.b, b.cq);
    let got: Vec<_> = wb.iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(
        got,
        [(1, WcStatus::LocProtErr), (2, WcStatus::WrFlushErr)],
        "{wb:?}"
    );
    assert_eq!(p.b.query_qp(b.qpn).unwrap().qp_state, QpState::Err);
    // The peer's SEND finds the QP in ERR: nothing lands anywhere (the memory was handed back untouched).
    p.a.post_send(
        a.qpn,
        &[SendWr::new(5, SendOp::Send, &[sge(&ma, 0, 10)]).signaled()],
    )
    .unwrap();
    p.a.dereg_mr_invalidate(ma.lkey)
        .expect("succeeds while the send is posted");
    let wa = poll_all(&mut p.a, a.cq);
    assert_eq!(wa.len(), 1, "{wa:?}");
    assert_eq!((wa[0].wr_id, wa[0].status), (5, WcStatus::LocProtErr));
    assert_eq!(p.a.query_qp(a.qpn).unwrap().qp_state, QpState::Err);
    p.drive();
    assert_eq!(
        back.to_vec(),
        before,
        "nothing written after the deregistration"
    );
    assert!(
        p.b.dereg_mr_invalidate(mb.lkey).is_err(),
        "a second dereg names an unknown key"
    );
}

/// A QP the consumer moves to ERR with `modify_qp` raises no `QpFatal` (UCX printed "local work queue catastrophic
/// error" for every QP it tore down that way); a QP that meets an error (retries exhausted here) does.
#[test]
fn modify_to_err_raises_no_qp_fatal_but_an_error_does() {
    let mut p = Pair::new();
    let o = ConnOpts {
        retry_cnt: 0,
        timeout: 1,
        ..ConnOpts::default()
    };
    let (a, _b) = connect(&mut p, &o);
    p.a.modify_qp(
        a.qpn,
        &QpAttr {
            qp_state: QpState::Err,
            ..QpAttr::default()
        },
        QpAttrMask::STATE,
    )
    .unwrap();
    p.drive();
    let evs: Vec<_> = std::iter::from_fn(|| p.a.poll_async_event()).collect();
    assert!(
        !evs.iter().any(|e| e.event_type == AsyncEventType::QpFatal),
        "{evs:?}"
    );
    // An error the QP meets: its peer never answers (every frame A→B dropped), retries exhausted.
    let (c, _d) = connect(&mut p, &o);
    let m = mr(&mut p.a, c.pd, 64, |_| 0);
    p.filter = Box::new(|d, _| d != Dir::AtoB);
    let sg = [sge(&m, 0, 8)];
    p.a.post_send(c.qpn, &[SendWr::new(1, SendOp::Send, &sg).signaled()])
        .unwrap();
    p.drive_for(Duration::from_secs(1));
    let evs: Vec<_> = std::iter::from_fn(|| p.a.poll_async_event()).collect();
    assert!(
        evs.iter()
            .any(|e| e.event_type == AsyncEventType::QpFatal && e.qpn == Some(c.qpn)),
        "{evs:?}"
    );
}
