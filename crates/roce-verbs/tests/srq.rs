//! Shared receive queues through the runtime ([`Srq`]): RC and UD QPs on one SRQ over the simulated segment, in both
//! progress modes: verified data, RNR with an empty SRQ (the send completes once a WR is posted), the limit arm, its
//! event ([`Context::poll_async_event`]) and one-shot disarm, LAST_WQE_REACHED, the object rules (EBUSY while QPs use it, `post_recv` on a QP on an SRQ refused), and
//! concurrent posting from several threads.

use std::sync::Arc;
use std::time::{Duration, Instant};

use roce_verbs::*;

/// `mod $name { caller, thread }`: runs `fn $name(mode)` once per progress mode.
macro_rules! both_modes {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[test]
            fn caller() {
                super::$name(roce_verbs::ProgressMode::Caller);
            }
            #[test]
            fn thread() {
                super::$name(roce_verbs::ProgressMode::Thread);
            }
        }
    )*};
}

both_modes!(
    rc_and_ud_qps_share_one_srq,
    empty_srq_rnr_then_post_completes,
    limit_is_one_shot_and_destroy_is_busy_while_qps_use_the_srq,
    threads_post_on_one_srq_while_two_qps_consume,
);

const CAP: QpCap = QpCap {
    max_send_wr: 64,
    max_recv_wr: 0,
    max_send_sge: 1,
    max_recv_sge: 0,
    max_inline_data: 64,
};

const ACCESS: AccessFlags = AccessFlags(AccessFlags::LOCAL_WRITE.0 | AccessFlags::REMOTE_WRITE.0);

struct Side {
    pd: Pd,
    cq: Cq,
    mr: Mr,
    _buf: MrBuf,
}

fn side(ctx: &Context, len: usize) -> Side {
    let pd = ctx.alloc_pd().expect("pd");
    let cq = ctx
        .create_cq(1024, None, Moderation::default())
        .expect("cq");
    let buf = MrBuf::new(len).expect("buf");
    let mr = pd.reg_mr(&buf, ACCESS).expect("mr");
    Side {
        pd,
        cq,
        mr,
        _buf: buf,
    }
}

fn rc_pair(a: &Side, b: &Side, srq: &Srq, k: u32) -> (Qp, Qp) {
    let cap_a = QpCap {
        max_recv_wr: 4,
        max_recv_sge: 1,
        ..CAP
    };
    let qa =
        a.pd.create_qp(QpType::Rc, &a.cq, &a.cq, cap_a, true)
            .expect("qp a");
    let qb =
        b.pd.create_qp_with_srq(QpType::Rc, &b.cq, &b.cq, CAP, true, Some(srq))
            .expect("qp b on srq");
    assert_eq!((qb.cap().max_recv_wr, qb.cap().max_recv_sge), (0, 0));
    let (pa, pb) = (Psn::new(100 + k), Psn::new(5000 + k));
    let o = ConnectOpts::default();
    qa.connect(&qb.endpoint(pb), pa, &o).expect("connect a");
    qb.connect(&qa.endpoint(pa), pb, &o).expect("connect b");
    (qa, qb)
}

fn poll_n(cq: &Cq, n: usize, limit: Duration) -> Vec<Wc> {
    let t0 = Instant::now();
    let mut out = Vec::new();
    let mut buf = [Wc::default(); 32];
    while out.len() < n {
        let k = cq.poll(&mut buf);
        out.extend_from_slice(&buf[..k]);
        assert!(
            t0.elapsed() < limit,
            "only {} of {n} completions after {limit:?}: {out:?}",
            out.len()
        );
        if k == 0 {
            std::thread::yield_now();
        }
    }
    out
}

/// Posts SRQ receive WR `id` over `len` bytes at `4096 × (id % 32)` of `b`'s MR.
fn post_srq(srq: &Srq, b: &Side, id: u64, len: u32) {
    srq.post_recv(&[RecvWr {
        wr_id: id,
        sg_list: &[b.mr.sge(4096 * (id % 32), len)],
    }])
    .expect("post_srq_recv");
}

fn send(qp: &Qp, a: &Side, id: u64, off: u64, len: u32, ud: Option<UdDest>) {
    let sg = [a.mr.sge(off, len)];
    let mut wr = SendWr::new(id, SendOp::Send, &sg).signaled();
    if let Some(d) = ud {
        wr = wr.ud(d);
    }
    qp.post_send(&[wr]).expect("post_send");
}

/// The SRQ events (limit, LAST_WQE_REACHED) the device has raised since the last call.
fn srq_events(ctx: &Context) -> Vec<AsyncEvent> {
    std::iter::from_fn(|| ctx.poll_async_event().unwrap())
        .filter(|e| {
            matches!(
                e.event_type,
                AsyncEventType::SrqLimitReached | AsyncEventType::QpLastWqeReached
            )
        })
        .collect()
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn rc_and_ud_qps_share_one_srq(mode: ProgressMode) {
    let (ca, cb) = Context::sim_pair(RuntimeConfig::with_mode(mode)).expect("pair");
    let a = side(&ca, 1 << 18);
    let b = side(&cb, 1 << 18);
    let srq = b.pd.create_srq(32, 2).expect("srq");
    assert_eq!(
        srq.query().unwrap(),
        SrqAttr {
            max_wr: 32,
            max_sge: 2,
            srq_limit: 0
        }
    );
    let (qa, qb) = rc_pair(&a, &b, &srq, 0);
    // A UD pair whose receiving QP takes from the same SRQ.
    let ua =
        a.pd.create_qp(QpType::Ud, &a.cq, &a.cq, CAP, true)
            .expect("ud a");
    let ub =
        b.pd.create_qp_with_srq(QpType::Ud, &b.cq, &b.cq, CAP, true, Some(&srq))
            .expect("ud b");
    ua.ready_ud(0x11, Psn::new(1)).unwrap();
    ub.ready_ud(0x11, Psn::new(2)).unwrap();
    let ah =
        a.pd.create_ah(&AhAttr {
            dgid: cb.gid(0).unwrap(),
            dmac: cb.config().mac,
            ..AhAttr::default()
        })
        .unwrap();
    let dest = UdDest {
        ah: ah.handle(),
        remote_qpn: ub.qpn(),
        remote_qkey: 0x11,
    };
    for id in 0..4 {
        post_srq(&srq, &b, id, 4096);
    }
    assert_eq!(
        qb.post_recv(&[RecvWr {
            wr_id: 99,
            sg_list: &[b.mr.sge(0, 16)],
        }]),
        Err(PostError::QpOnSrq)
    );
    // RC: 3000 bytes (3 packets); UD: 900 bytes (+ 40-byte GRH); RC again; UD again.
    let rc_data = pattern(3000, 1);
    let ud_data = pattern(900, 2);
    a.mr.write(0, &rc_data).unwrap();
    a.mr.write(8192, &ud_data).unwrap();
    send(&qa, &a, 1, 0, 3000, None);
    let mut wb = poll_n(&b.cq, 1, Duration::from_secs(10));
    send(&ua, &a, 2, 8192, 900, Some(dest));
    wb.extend(poll_n(&b.cq, 1, Duration::from_secs(10)));
    send(&qa, &a, 3, 0, 3000, None);
    wb.extend(poll_n(&b.cq, 1, Duration::from_secs(10)));
    send(&ua, &a, 4, 8192, 900, Some(dest));
    wb.extend(poll_n(&b.cq, 1, Duration::from_secs(10)));
    let wa = poll_n(&a.cq, 4, Duration::from_secs(10));
    assert!(wa.iter().all(|w| w.status == WcStatus::Success), "{wa:?}");
    // The SRQ's WRs were taken in post order, each by the QP whose message it completed.
    let got: Vec<_> = wb
        .iter()
        .map(|w| (w.wr_id, w.status, w.byte_len, w.qp_num))
        .collect();
    assert_eq!(
        got,
        vec![
            (0, WcStatus::Success, 3000, qb.qpn()),
            (1, WcStatus::Success, 940, ub.qpn()),
            (2, WcStatus::Success, 3000, qb.qpn()),
            (3, WcStatus::Success, 940, ub.qpn()),
        ]
    );
    for id in [0u64, 2] {
        assert_eq!(b.mr.read(4096 * id as usize, 3000).unwrap(), rc_data);
    }
    for id in [1usize, 3] {
        assert_eq!(b.mr.read(4096 * id + 40, 900).unwrap(), ud_data);
    }
    assert_eq!(srq.outstanding().unwrap(), 0);
}

fn empty_srq_rnr_then_post_completes(mode: ProgressMode) {
    let (ca, cb) = Context::sim_pair(RuntimeConfig::with_mode(mode)).expect("pair");
    let a = side(&ca, 1 << 16);
    let b = side(&cb, 1 << 18);
    let srq = b.pd.create_srq(8, 1).expect("srq");
    let (qa, _qb) = rc_pair(&a, &b, &srq, 0);
    a.mr.write(0, &pattern(2000, 9)).unwrap();
    send(&qa, &a, 7, 0, 2000, None);
    // No WR on the SRQ: the responder answers RNR NAK, the requester waits and retries (rnr_retry 7 = forever).
    let t0 = Instant::now();
    while ca.counters().unwrap().rcvd_rnr_err == 0 {
        assert!(t0.elapsed() < Duration::from_secs(10), "no RNR NAK");
        ca.progress();
        cb.progress();
        std::thread::yield_now();
    }
    assert!(cb.counters().unwrap().send_rnr_err > 0);
    let mut none = [Wc::default(); 4];
    assert_eq!(a.cq.poll(&mut none), 0);
    post_srq(&srq, &b, 0, 4096);
    let wb = poll_n(&b.cq, 1, Duration::from_secs(10));
    assert_eq!(
        (wb[0].wr_id, wb[0].status, wb[0].byte_len),
        (0, WcStatus::Success, 2000)
    );
    let wa = poll_n(&a.cq, 1, Duration::from_secs(10));
    assert_eq!((wa[0].wr_id, wa[0].status), (7, WcStatus::Success));
    assert_eq!(b.mr.read(0, 2000).unwrap(), pattern(2000, 9));
}

fn limit_is_one_shot_and_destroy_is_busy_while_qps_use_the_srq(mode: ProgressMode) {
    let (ca, cb) = Context::sim_pair(RuntimeConfig::with_mode(mode)).expect("pair");
    let a = side(&ca, 1 << 16);
    let b = side(&cb, 1 << 18);
    let d = cb.query_device();
    assert!(b.pd.create_srq(d.max_srq_wr + 1, 1).is_err());
    assert!(b.pd.create_srq(4, d.max_srq_sge + 1).is_err());
    let srq = b.pd.create_srq(8, 1).expect("srq");
    let (qa, qb) = rc_pair(&a, &b, &srq, 0);
    for id in 0..4 {
        post_srq(&srq, &b, id, 256);
    }
    let limit = |n| SrqAttr {
        srq_limit: n,
        ..SrqAttr::default()
    };
    assert_eq!(
        srq.modify(&limit(9), SrqAttrMask::LIMIT)
            .unwrap_err()
            .errno(),
        22
    );
    srq.modify(&limit(3), SrqAttrMask::LIMIT).unwrap();
    assert_eq!(srq.query().unwrap().srq_limit, 3);
    // 4 → 3 WRs: not below the limit, still armed.
    send(&qa, &a, 1, 0, 64, None);
    poll_n(&b.cq, 1, Duration::from_secs(10));
    assert_eq!(srq.query().unwrap().srq_limit, 3);
    assert_eq!(srq_events(&cb), vec![]);
    // 3 → 2: below it: the limit event (naming the SRQ) fired once and the limit disarmed.
    send(&qa, &a, 2, 0, 64, None);
    poll_n(&b.cq, 1, Duration::from_secs(10));
    assert_eq!(srq.query().unwrap().srq_limit, 0);
    assert_eq!(
        srq_events(&cb),
        vec![AsyncEvent {
            event_type: AsyncEventType::SrqLimitReached,
            qpn: None,
            cq: None,
            srq: Some(srq.handle()),
        }]
    );
    // Resize keeps the 2 posted.
    srq.modify(
        &SrqAttr {
            max_wr: 16,
            ..SrqAttr::default()
        },
        SrqAttrMask::MAX_WR,
    )
    .unwrap();
    assert_eq!(
        (srq.query().unwrap().max_wr, srq.outstanding().unwrap()),
        (16, 2)
    );
    // The QP on the SRQ moved to ERR: LAST_WQE_REACHED, and the SRQ keeps its WRs.
    qb.modify(
        &QpAttr {
            qp_state: QpState::Err,
            ..QpAttr::default()
        },
        QpAttrMask::STATE,
    )
    .unwrap();
    assert_eq!(
        srq_events(&cb)
            .iter()
            .map(|e| (e.event_type, e.qpn))
            .collect::<Vec<_>>(),
        vec![(AsyncEventType::QpLastWqeReached, Some(qb.qpn()))]
    );
    assert_eq!(srq.outstanding().unwrap(), 2);
    // EBUSY while the QP exists; accepted once it is gone.
    let (srq, e) = srq.clone().destroy().unwrap_err();
    assert_eq!(e.errno(), 16);
    drop(qb);
    drop(qa);
    srq.destroy().expect("destroy after the QP is gone");
    poll_n(&a.cq, 2, Duration::from_secs(10));
}

/// Four threads post on the SRQ while two RC QPs receive 200 messages from their peers: every message lands in
/// exactly one WR, and both QPs take from the SRQ.
fn threads_post_on_one_srq_while_two_qps_consume(mode: ProgressMode) {
    const N: u64 = 200;
    let (ca, cb) = Context::sim_pair(RuntimeConfig::with_mode(mode)).expect("pair");
    let a = side(&ca, 1 << 16);
    let b = Arc::new(side(&cb, 1 << 18));
    let srq = b.pd.create_srq(64, 1).expect("srq");
    let pairs = [rc_pair(&a, &b, &srq, 0), rc_pair(&a, &b, &srq, 1)];
    a.mr.write(0, &pattern(512, 3)).unwrap();
    let posters: Vec<_> = (0..4u64)
        .map(|t| {
            let (srq, b) = (srq.clone(), Arc::clone(&b));
            std::thread::spawn(move || {
                let mut id = t;
                while id < N {
                    match srq.post_recv(&[RecvWr {
                        wr_id: id,
                        sg_list: &[b.mr.sge(4096 * (id % 32), 512)],
                    }]) {
                        Ok(()) => id += 4,
                        Err(PostError::QueueFull { .. }) => std::thread::yield_now(),
                        Err(e) => panic!("{e}"),
                    }
                }
            })
        })
        .collect();
    for i in 0..N {
        let (qa, _) = &pairs[(i % 2) as usize];
        loop {
            let sg = [a.mr.sge(0, 512)];
            match qa.post_send(&[SendWr::new(i, SendOp::Send, &sg).signaled()]) {
                Ok(()) => break,
                Err(PostError::QueueFull { .. }) => {
                    let mut w = [Wc::default(); 16];
                    let _ = a.cq.poll(&mut w);
                }
                Err(e) => panic!("{e}"),
            }
        }
    }
    let wb = poll_n(&b.cq, N as usize, Duration::from_secs(30));
    for p in posters {
        p.join().unwrap();
    }
    let mut ids: Vec<u64> = wb.iter().map(|w| w.wr_id).collect();
    ids.sort_unstable();
    assert_eq!(ids, (0..N).collect::<Vec<_>>());
    assert!(
        wb.iter()
            .all(|w| w.status == WcStatus::Success && w.byte_len == 512),
        "{wb:?}"
    );
    let qpns: std::collections::HashSet<_> = wb.iter().map(|w| w.qp_num).collect();
    assert_eq!(qpns.len(), 2, "both QPs consumed from the SRQ");
}
