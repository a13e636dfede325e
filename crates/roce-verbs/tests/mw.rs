//! Memory windows through the runtime (`Pd::alloc_mw`, `Mw`; issue #16): a type 2 window bound by a BIND_MW WR on
//! the target's send queue carries an RDMA WRITE into an MR that has no remote rights of its own, exactly inside the
//! window; LOCAL_INV frees it and the next WRITE through its key fails with REM_ACCESS_ERR. Also an RDMA ATOMIC
//! WRITE's 8 bytes in application memory. In both progress modes, over the simulated segment.

use std::time::{Duration, Instant};

use roce_verbs::*;

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
    type2_window_write_and_local_invalidate,
    atomic_write_in_application_memory,
    an_mr_with_a_bound_window_cannot_be_deregistered
);

struct End {
    pd: Pd,
    cq: Cq,
    qp: Qp,
}

fn end(ctx: &Context) -> End {
    let pd = ctx.alloc_pd().expect("pd");
    let cq = ctx.create_cq(64, None, Moderation::default()).expect("cq");
    let cap = QpCap {
        max_send_wr: 16,
        max_recv_wr: 16,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let qp = pd.create_qp(QpType::Rc, &cq, &cq, cap, false).expect("qp");
    End { pd, cq, qp }
}

fn pair(mode: ProgressMode) -> (End, End) {
    let (ca, cb) = Context::sim_pair(RuntimeConfig::with_mode(mode)).expect("pair");
    let (a, b) = (end(&ca), end(&cb));
    let (pa, pb) = (Psn::new(11), Psn::new(700));
    let o = ConnectOpts::default();
    a.qp.connect(&b.qp.endpoint(pb), pa, &o).expect("connect a");
    b.qp.connect(&a.qp.endpoint(pa), pb, &o).expect("connect b");
    (a, b)
}

fn poll_one(cq: &Cq) -> Wc {
    let t0 = Instant::now();
    let mut wc = [Wc::default(); 1];
    loop {
        if cq.poll(&mut wc) == 1 {
            return wc[0];
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "no completion");
        std::thread::yield_now();
    }
}

fn post(qp: &Qp, id: u64, op: SendOp, sg: &[Sge]) {
    qp.post_send(&[SendWr::new(id, op, sg).signaled()])
        .expect("post");
}

fn type2_window_write_and_local_invalidate(mode: ProgressMode) {
    let (a, b) = pair(mode);
    let src = MrBuf::new(4096).expect("buf");
    src.write(0, &[0x5a; 64]).expect("write");
    let smr = a.pd.reg_mr(&src, AccessFlags::LOCAL_WRITE).expect("mr");
    let dst = MrBuf::new(4096).expect("buf");
    let dmr =
        b.pd.reg_mr(&dst, AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND)
            .expect("mr");
    let mw = b.pd.alloc_mw(MwType::Type2).expect("alloc_mw");
    assert_eq!(mw.mw_type(), MwType::Type2);
    let key = Rkey((mw.rkey().0 & !0xff) | (mw.rkey().0.wrapping_add(1) & 0xff));
    let bind = SendOp::BindMw {
        mw: mw.rkey(),
        rkey: key,
        mr: dmr.lkey(),
        addr: dmr.addr() + 256,
        length: 64,
        access: AccessFlags::REMOTE_WRITE,
    };
    post(&b.qp, 1, bind, &[]);
    let w = poll_one(&b.cq);
    assert_eq!(
        (w.wr_id, w.status, w.opcode),
        (1, WcStatus::Success, WcOpcode::BindMw)
    );
    let write = |id, at: u64| {
        post(
            &a.qp,
            id,
            SendOp::RdmaWrite {
                remote_addr: at,
                rkey: key,
            },
            &[smr.sge(0, 64)],
        );
        poll_one(&a.cq)
    };
    let w = write(2, dmr.addr() + 256);
    assert_eq!((w.wr_id, w.status), (2, WcStatus::Success));
    let got = dst.to_vec();
    assert!(got[256..320].iter().all(|&x| x == 0x5a));
    assert!(got[..256].iter().chain(&got[320..]).all(|&x| x == 0));
    post(&b.qp, 3, SendOp::LocalInv { rkey: key }, &[]);
    let w = poll_one(&b.cq);
    assert_eq!(
        (w.wr_id, w.status, w.opcode),
        (3, WcStatus::Success, WcOpcode::LocalInv)
    );
    let w = write(4, dmr.addr() + 256);
    assert_eq!((w.wr_id, w.status), (4, WcStatus::RemAccessErr));
    mw.dealloc().expect("dealloc");
    assert!(mw.dealloc().is_err(), "freed already");
}

/// `Mr::dereg` and `Mr::dereg_invalidate` (the C library's `ibv_dereg_mr`) of an MR a window is bound to fail with
/// EINVAL (rxe `rxe_dereg_mr` while `num_mw` is not 0) and hand the MR back still registered; once the window is
/// unbound (LOCAL_INV) the MR deregisters.
fn an_mr_with_a_bound_window_cannot_be_deregistered(mode: ProgressMode) {
    let (_a, b) = pair(mode);
    let dst = MrBuf::new(4096).expect("buf");
    let dmr =
        b.pd.reg_mr(&dst, AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND)
            .expect("mr");
    let mw = b.pd.alloc_mw(MwType::Type2).expect("alloc_mw");
    let key = Rkey((mw.rkey().0 & !0xff) | (mw.rkey().0.wrapping_add(1) & 0xff));
    let bind = SendOp::BindMw {
        mw: mw.rkey(),
        rkey: key,
        mr: dmr.lkey(),
        addr: dmr.addr(),
        length: 64,
        access: AccessFlags::REMOTE_WRITE,
    };
    post(&b.qp, 1, bind, &[]);
    assert_eq!(poll_one(&b.cq).status, WcStatus::Success);
    let (dmr, e) = dmr.dereg().expect_err("a window is bound to the MR");
    assert_eq!(e.errno(), 22, "{e}");
    let (dmr, e) = dmr
        .dereg_invalidate()
        .expect_err("a window is bound to the MR");
    assert_eq!(e.errno(), 22, "{e}");
    dmr.write(0, b"still registered")
        .expect("the MR is still registered");
    post(&b.qp, 2, SendOp::LocalInv { rkey: key }, &[]);
    assert_eq!(poll_one(&b.cq).status, WcStatus::Success);
    dmr.dereg().expect("no window bound any more");
}

fn atomic_write_in_application_memory(mode: ProgressMode) {
    let (a, b) = pair(mode);
    let dst = MrBuf::new(4096).expect("buf");
    let dmr =
        b.pd.reg_mr(&dst, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
            .expect("mr");
    let op = SendOp::AtomicWrite {
        remote_addr: dmr.addr() + 8,
        rkey: dmr.rkey(),
        value: 0x0102_0304_0506_0708u64.to_le_bytes(),
    };
    post(&a.qp, 9, op, &[]);
    let w = poll_one(&a.cq);
    assert_eq!(
        (w.wr_id, w.status, w.opcode),
        (9, WcStatus::Success, WcOpcode::AtomicWrite)
    );
    let got = dst.to_vec();
    assert_eq!(
        u64::from_le_bytes(got[8..16].try_into().unwrap()),
        0x0102_0304_0506_0708
    );
    assert!(got[..8].iter().chain(&got[16..]).all(|&x| x == 0));
}
