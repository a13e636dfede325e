//! Memory windows (`crate::mw`: type 1 and 2 binds, LOCAL_INV, SEND with invalidate, dealloc) and RDMA ATOMIC
//! WRITE between two engines.

use super::util::*;
use crate::*;

/// The responder's MR: local write + MW_BIND only (no remote rights of its own: every remote access goes through
/// a window), 4096 zero bytes.
fn bindable_mr(e: &mut Engine, pd: PdHandle) -> MrInfo {
    e.reg_mr(
        pd,
        vec![0u8; 4096],
        AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND,
    )
    .unwrap()
}

fn bind(mw: Rkey, new_byte: u32, m: &MrInfo, off: u64, len: u64, access: AccessFlags) -> SendOp {
    SendOp::BindMw {
        mw,
        rkey: Rkey((mw.0 & !0xff) | (new_byte & 0xff)),
        mr: m.lkey,
        addr: m.addr + off,
        length: len,
        access,
    }
}

/// Posts one signaled WR on `qpn` of `e`, drives the pair and returns the completions of `cq` on that side.
fn post_one(p: &mut Pair, on_a: bool, e: End, op: SendOp, sg: &[Sge]) -> Vec<Wc> {
    let eng = if on_a { &mut p.a } else { &mut p.b };
    eng.post_send(e.qpn, &[SendWr::new(7, op, sg).signaled()])
        .unwrap();
    p.drive();
    let eng = if on_a { &mut p.a } else { &mut p.b };
    poll_all(eng, e.cq)
}

fn write_through(p: &mut Pair, a: End, src: &MrInfo, len: u32, addr: u64, rkey: Rkey) -> WcStatus {
    let w = post_one(
        p,
        true,
        a,
        SendOp::RdmaWrite {
            remote_addr: addr,
            rkey,
        },
        &[sge(src, 0, len)],
    );
    assert_eq!(w.len(), 1, "{w:?}");
    w[0].status
}

#[test]
fn type2_window_grants_writes_inside_its_range_only() {
    let mut p = Pair::new();
    let (a, b) = connect(&mut p, &ConnOpts::default());
    let src = mr(&mut p.a, a.pd, 64, |i| i as u8 + 1);
    let target = bindable_mr(&mut p.b, b.pd);
    let mw = p.b.alloc_mw(b.pd, MwType::Type2).unwrap();
    assert_ne!(
        mw.0 & 0x8000_0000,
        0,
        "window keys are told apart from MR keys"
    );
    // Unbound: no access.
    let wb = post_one(
        &mut p,
        false,
        b,
        bind(mw, mw.0 + 1, &target, 1024, 256, AccessFlags::REMOTE_WRITE),
        &[],
    );
    assert_eq!(
        (wb[0].status, wb[0].opcode),
        (WcStatus::Success, WcOpcode::BindMw)
    );
    let key = Rkey((mw.0 & !0xff) | ((mw.0 + 1) & 0xff));
    assert_eq!(
        write_through(&mut p, a, &src, 64, target.addr + 1024 + 192, key),
        WcStatus::Success
    );
    let got = p.b.mr_bytes(target.lkey).unwrap();
    assert_eq!(
        &got[1024 + 192..1024 + 256],
        &(1..=64).collect::<Vec<u8>>()[..]
    );
    assert!(
        got[..1024 + 192]
            .iter()
            .chain(&got[1024 + 256..])
            .all(|&b| b == 0)
    );
    // One byte past the window (still inside the MR): NAK remote access error.
    assert_eq!(
        write_through(&mut p, a, &src, 64, target.addr + 1024 + 193, key),
        WcStatus::RemAccessErr
    );
    assert_eq!(p.b.qp_info(b.qpn).unwrap().state, QpState::Err);
}

#[test]
fn stale_key_byte_and_missing_rights_are_refused() {
    let mut p = Pair::new();
    let (a, b) = connect(&mut p, &ConnOpts::default());
    let src = mr(&mut p.a, a.pd, 64, |_| 5);
    let target = bindable_mr(&mut p.b, b.pd);
    let mw = p.b.alloc_mw(b.pd, MwType::Type2).unwrap();
    // Read-only window: a WRITE through it fails.
    let wb = post_one(
        &mut p,
        false,
        b,
        bind(mw, 0x33, &target, 0, 4096, AccessFlags::REMOTE_READ),
        &[],
    );
    assert_eq!(wb[0].status, WcStatus::Success);
    let key = Rkey((mw.0 & !0xff) | 0x33);
    assert_eq!(
        write_through(&mut p, a, &src, 8, target.addr, key),
        WcStatus::RemAccessErr
    );

    let mut p = Pair::new();
    let (a, b) = connect(&mut p, &ConnOpts::default());
    let src = mr(&mut p.a, a.pd, 64, |_| 5);
    let target = bindable_mr(&mut p.b, b.pd);
    let mw = p.b.alloc_mw(b.pd, MwType::Type2).unwrap();
    let wb = post_one(
        &mut p,
        false,
        b,
        bind(mw, 0x33, &target, 0, 4096, AccessFlags::REMOTE_WRITE),
        &[],
    );
    assert_eq!(wb[0].status, WcStatus::Success);
    // The allocation-time key (old key byte) no longer names the window.
    let stale = if mw.0 & 0xff == 0x33 {
        Rkey(mw.0 ^ 1)
    } else {
        mw
    };
    assert_eq!(
        write_through(&mut p, a, &src, 8, target.addr, stale),
        WcStatus::RemAccessErr
    );
}

#[test]
fn bind_errors_complete_mw_bind_err_and_stop_the_qp() {
    // MR without MW_BIND (C10-73).
    let mut p = Pair::new();
    let (_a, b) = connect(&mut p, &ConnOpts::default());
    let plain = mr(&mut p.b, b.pd, 4096, |_| 0);
    let mw = p.b.alloc_mw(b.pd, MwType::Type2).unwrap();
    let wb = post_one(
        &mut p,
        false,
        b,
        bind(mw, 1, &plain, 0, 64, AccessFlags::REMOTE_WRITE),
        &[],
    );
    assert_eq!(
        (wb[0].status, wb[0].opcode),
        (WcStatus::MwBindErr, WcOpcode::BindMw)
    );
    assert_eq!(p.b.qp_info(b.qpn).unwrap().state, QpState::Err);
    // Range outside the MR (C10-75), remote write over an MR without local write (C10-74), a zero-length type 2
    // bind, a second bind of a bound type 2 window.
    type MakeMr = fn(&mut Engine, PdHandle) -> MrInfo;
    let cases: [(&str, MakeMr, u64, u64, bool); 4] = [
        ("outside", bindable_mr, 4000, 200, false),
        (
            "no local write",
            |e, pd| e.reg_mr(pd, vec![0u8; 4096], AccessFlags::MW_BIND).unwrap(),
            0,
            64,
            false,
        ),
        ("zero length", bindable_mr, 0, 0, false),
        ("rebind", bindable_mr, 0, 64, true),
    ];
    for (what, make, off, len, twice) in cases {
        let mut p = Pair::new();
        let (_a, b) = connect(&mut p, &ConnOpts::default());
        let m = make(&mut p.b, b.pd);
        let mw = p.b.alloc_mw(b.pd, MwType::Type2).unwrap();
        if twice {
            let wb = post_one(
                &mut p,
                false,
                b,
                bind(mw, 1, &m, off, len, AccessFlags::REMOTE_WRITE),
                &[],
            );
            assert_eq!(wb[0].status, WcStatus::Success, "{what}");
        }
        let wb = post_one(
            &mut p,
            false,
            b,
            bind(mw, 2, &m, off, len, AccessFlags::REMOTE_WRITE),
            &[],
        );
        assert_eq!(wb[0].status, WcStatus::MwBindErr, "{what}");
    }
}

#[test]
fn type2_key_is_usable_only_through_the_qp_that_bound_it() {
    let mut p = Pair::new();
    let o = ConnOpts::default();
    let (a, b) = connect(&mut p, &o);
    // A second connected pair whose responder QP shares `b`'s PD.
    let a2 = make_qp(&mut p.a, &o);
    let cq2 = p.b.create_cq(64).unwrap();
    let (qpn2, _) =
        p.b.create_qp(&QpInitAttr {
            qp_type: QpType::Rc,
            pd: b.pd,
            send_cq: cq2,
            recv_cq: cq2,
            cap: o.cap,
            sq_sig_all: false,
        })
        .unwrap();
    let b2 = End {
        pd: b.pd,
        cq: cq2,
        qpn: qpn2,
    };
    bring_up(&mut p.a, a2, b2.qpn, MAC_B, IP_B, o.a_psn, o.b_psn, &o);
    bring_up(&mut p.b, b2, a2.qpn, MAC_A, IP_A, o.b_psn, o.a_psn, &o);
    let src = mr(&mut p.a, a.pd, 64, |_| 9);
    let src2 = mr(&mut p.a, a2.pd, 64, |_| 9);
    let target = bindable_mr(&mut p.b, b.pd);
    let mw = p.b.alloc_mw(b.pd, MwType::Type2).unwrap();
    let wb = post_one(
        &mut p,
        false,
        b2,
        bind(mw, 7, &target, 0, 4096, AccessFlags::REMOTE_WRITE),
        &[],
    );
    assert_eq!(wb[0].status, WcStatus::Success);
    let key = Rkey((mw.0 & !0xff) | 7);
    assert_eq!(
        write_through(&mut p, a2, &src2, 8, target.addr, key),
        WcStatus::Success
    );
    // Same PD, other QP: refused.
    assert_eq!(
        write_through(&mut p, a, &src, 8, target.addr, key),
        WcStatus::RemAccessErr
    );
}

#[test]
fn local_invalidate_remote_invalidate_and_dealloc_end_a_type2_window() {
    for how in ["local", "remote", "dealloc"] {
        let mut p = Pair::new();
        let (a, b) = connect(&mut p, &ConnOpts::default());
        let src = mr(&mut p.a, a.pd, 64, |_| 3);
        let rbuf = mr(&mut p.b, b.pd, 64, |_| 0);
        let target = bindable_mr(&mut p.b, b.pd);
        let mw = p.b.alloc_mw(b.pd, MwType::Type2).unwrap();
        let wb = post_one(
            &mut p,
            false,
            b,
            bind(mw, 0x40, &target, 0, 4096, AccessFlags::REMOTE_WRITE),
            &[],
        );
        assert_eq!(wb[0].status, WcStatus::Success);
        let key = Rkey((mw.0 & !0xff) | 0x40);
        assert_eq!(
            write_through(&mut p, a, &src, 8, target.addr, key),
            WcStatus::Success,
            "{how}"
        );
        match how {
            "local" => {
                let wb = post_one(&mut p, false, b, SendOp::LocalInv { rkey: key }, &[]);
                assert_eq!(
                    (wb[0].status, wb[0].opcode),
                    (WcStatus::Success, WcOpcode::LocalInv)
                );
            }
            "remote" => {
                p.b.post_recv(
                    b.qpn,
                    &[RecvWr {
                        wr_id: 50,
                        sg_list: &[sge(&rbuf, 0, 64)],
                    }],
                )
                .unwrap();
                let wa = post_one(
                    &mut p,
                    true,
                    a,
                    SendOp::SendWithInv {
                        invalidate_rkey: key,
                    },
                    &[sge(&src, 0, 4)],
                );
                assert_eq!(wa[0].status, WcStatus::Success);
                let wb = poll_all(&mut p.b, b.cq);
                assert_eq!(
                    (wb[0].status, wb[0].wc_flags, wb[0].invalidated_rkey),
                    (WcStatus::Success, WcFlags::WITH_INV, key)
                );
                // IETH on the wire: SEND_ONLY_WITH_INVALIDATE (0x17) carrying the window's key.
                let f = &p
                    .captured
                    .iter()
                    .rev()
                    .find(|c| c.1 == Dir::AtoB)
                    .unwrap()
                    .2;
                assert_eq!(bth_of(f).0, 0x17);
                assert_eq!(u32::from_be_bytes([f[54], f[55], f[56], f[57]]), key.0);
            }
            _ => p.b.dealloc_mw(mw).unwrap(),
        }
        assert_eq!(
            write_through(&mut p, a, &src, 8, target.addr, key),
            WcStatus::RemAccessErr,
            "{how}"
        );
    }
}

/// Breaker finding: a SEND with invalidate naming the R_Key of a region registered with `reg_mr` (not a window)
/// revoked it for good, so one client of a shared MR could cut off all the others. Only type 2 windows (and
/// fast-registered regions, which rocev2 has not) can be invalidated (IBTA Vol 1 §10.6.7; rxe `rxe_invalidate_mr`
/// refuses any MR but a fast-registration one): the responder answers NAK invalid request (the sender's WR
/// completes REM_INV_REQ_ERR, rxe `RESPST_ERR_INVALIDATE_RKEY`); a LOCAL_INV of it fails with LOC_QP_OP_ERR (rxe
/// `rxe_do_local_ops`). Either way the MR keeps granting remote access: a second QP pair on the same PDs writes
/// through its R_Key afterwards (the first pair is in ERR).
#[test]
fn a_registered_mr_cannot_be_invalidated_remotely_or_locally() {
    for how in ["remote", "local"] {
        let mut p = Pair::new();
        let o = ConnOpts::default();
        let (a, b) = connect(&mut p, &o);
        let src = mr(&mut p.a, a.pd, 64, |_| 3);
        let shared = mr(&mut p.b, b.pd, 64, |_| 0);
        let rbuf = mr(&mut p.b, b.pd, 64, |_| 0);
        if how == "remote" {
            p.b.post_recv(
                b.qpn,
                &[RecvWr {
                    wr_id: 50,
                    sg_list: &[sge(&rbuf, 0, 64)],
                }],
            )
            .unwrap();
            let wa = post_one(
                &mut p,
                true,
                a,
                SendOp::SendWithInv {
                    invalidate_rkey: shared.rkey,
                },
                &[sge(&src, 0, 4)],
            );
            assert_eq!(wa[0].status, WcStatus::RemInvReqErr, "{how}");
            let wb = poll_all(&mut p.b, b.cq);
            assert!(
                wb.iter().all(|w| w.status != WcStatus::Success),
                "{how}: the receive must not complete as a good SEND with invalidate: {wb:?}"
            );
        } else {
            let wb = post_one(
                &mut p,
                false,
                b,
                SendOp::LocalInv { rkey: shared.rkey },
                &[],
            );
            assert_eq!(wb[0].status, WcStatus::LocQpOpErr, "{how}");
        }
        // A second connection between the same PDs: the MR's R_Key still grants its range.
        let qp_on = |e: &mut Engine, pd: PdHandle| {
            let cq = e.create_cq(64).unwrap();
            let (qpn, _) = e
                .create_qp(&QpInitAttr {
                    qp_type: o.qp_type,
                    pd,
                    send_cq: cq,
                    recv_cq: cq,
                    cap: o.cap,
                    sq_sig_all: o.sq_sig_all,
                })
                .unwrap();
            End { pd, cq, qpn }
        };
        let a2 = qp_on(&mut p.a, a.pd);
        let b2 = qp_on(&mut p.b, b.pd);
        bring_up(&mut p.a, a2, b2.qpn, MAC_B, IP_B, o.a_psn, o.b_psn, &o);
        bring_up(&mut p.b, b2, a2.qpn, MAC_A, IP_A, o.b_psn, o.a_psn, &o);
        assert_eq!(
            write_through(&mut p, a2, &src, 8, shared.addr, shared.rkey),
            WcStatus::Success,
            "{how}: the MR's R_Key was invalidated"
        );
        assert_eq!(p.b.mr_bytes(shared.lkey).unwrap()[..8], [3u8; 8], "{how}");
    }
}

#[test]
fn type1_window_rebinds_and_a_zero_length_bind_unbinds_it() {
    let mut p = Pair::new();
    let (a, b) = connect(&mut p, &ConnOpts::default());
    let src = mr(&mut p.a, a.pd, 64, |_| 1);
    let target = bindable_mr(&mut p.b, b.pd);
    let mw = p.b.alloc_mw(b.pd, MwType::Type1).unwrap();
    let k1 = Rkey((mw.0 & !0xff) | ((mw.0 + 1) & 0xff));
    let wb = post_one(
        &mut p,
        false,
        b,
        bind(mw, k1.0, &target, 0, 128, AccessFlags::REMOTE_WRITE),
        &[],
    );
    assert_eq!(wb[0].status, WcStatus::Success);
    assert_eq!(
        write_through(&mut p, a, &src, 8, target.addr + 64, k1),
        WcStatus::Success
    );
    // A type 1 window cannot be invalidated (LOCAL_INV fails: LOC_QP_OP_ERR), so rebind with length 0 instead —
    // on a fresh pair since the failure stops the QP.
    let k2 = Rkey((k1.0 & !0xff) | ((k1.0 + 1) & 0xff));
    let wb = post_one(
        &mut p,
        false,
        b,
        bind(mw, k2.0, &target, 0, 0, AccessFlags::EMPTY),
        &[],
    );
    assert_eq!(wb[0].status, WcStatus::Success);
    assert_eq!(
        write_through(&mut p, a, &src, 8, target.addr + 64, k1),
        WcStatus::RemAccessErr
    );

    let mut p = Pair::new();
    let (_a, b) = connect(&mut p, &ConnOpts::default());
    let target = bindable_mr(&mut p.b, b.pd);
    let mw = p.b.alloc_mw(b.pd, MwType::Type1).unwrap();
    let wb = post_one(
        &mut p,
        false,
        b,
        bind(mw, 9, &target, 0, 128, AccessFlags::REMOTE_WRITE),
        &[],
    );
    assert_eq!(wb[0].status, WcStatus::Success);
    let wb = post_one(
        &mut p,
        false,
        b,
        SendOp::LocalInv {
            rkey: Rkey((mw.0 & !0xff) | 9),
        },
        &[],
    );
    assert_eq!(
        (wb[0].status, wb[0].opcode),
        (WcStatus::LocQpOpErr, WcOpcode::LocalInv)
    );
}

#[test]
fn window_and_pd_bookkeeping() {
    let mut e = Engine::new(EngineConfig::default());
    let pd = e.alloc_pd().unwrap();
    let mw = e.alloc_mw(pd, MwType::Type1).unwrap();
    assert_eq!(e.mw_count(), 1);
    assert!(e.dealloc_pd(pd).is_err(), "a PD with a window is busy");
    e.dealloc_mw(mw).unwrap();
    assert!(e.dealloc_mw(mw).is_err());
    let again = e.alloc_mw(pd, MwType::Type2).unwrap();
    assert_ne!(again, mw, "a reused slot gets a new key");
    e.dealloc_mw(again).unwrap();
    e.dealloc_pd(pd).unwrap();
    assert!(e.alloc_mw(pd, MwType::Type1).is_err());
}

#[test]
fn a_window_on_a_deregistered_mr_reaches_nothing() {
    let mut p = Pair::new();
    let (a, b) = connect(&mut p, &ConnOpts::default());
    let src = mr(&mut p.a, a.pd, 64, |_| 1);
    let target = bindable_mr(&mut p.b, b.pd);
    let mw = p.b.alloc_mw(b.pd, MwType::Type2).unwrap();
    let wb = post_one(
        &mut p,
        false,
        b,
        bind(mw, 0x21, &target, 0, 4096, AccessFlags::REMOTE_WRITE),
        &[],
    );
    assert_eq!(wb[0].status, WcStatus::Success);
    p.b.dereg_mr(target.lkey).unwrap();
    // A new MR, likely in the same slot: the window must not reach it.
    let _other = bindable_mr(&mut p.b, b.pd);
    let key = Rkey((mw.0 & !0xff) | 0x21);
    assert_eq!(
        write_through(&mut p, a, &src, 8, target.addr, key),
        WcStatus::RemAccessErr
    );
}

/// `ibv_dereg_mr` of an MR that windows are bound to fails with EINVAL and leaves everything as it was (rxe
/// `rxe_dereg_mr` refuses while the MR's `num_mw` is not 0): `dereg_mr_invalidate` (the C library's) says
/// `InvalidArgument`, the window keeps writing into the MR; once the window is freed (LOCAL_INV) the MR goes.
#[test]
fn an_mr_with_a_bound_window_cannot_be_deregistered() {
    let mut p = Pair::new();
    let (a, b) = connect(&mut p, &ConnOpts::default());
    let src = mr(&mut p.a, a.pd, 64, |_| 7);
    let target = bindable_mr(&mut p.b, b.pd);
    let mw = p.b.alloc_mw(b.pd, MwType::Type2).unwrap();
    assert!(!p.b.mr_has_bound_mw(target.lkey), "nothing bound yet");
    let wb = post_one(
        &mut p,
        false,
        b,
        bind(mw, 0x31, &target, 0, 4096, AccessFlags::REMOTE_WRITE),
        &[],
    );
    assert_eq!(wb[0].status, WcStatus::Success);
    assert!(p.b.mr_has_bound_mw(target.lkey));
    assert!(matches!(
        p.b.dereg_mr_invalidate(target.lkey),
        Err(ResourceError::InvalidArgument(_))
    ));
    let key = Rkey((mw.0 & !0xff) | 0x31);
    assert_eq!(
        write_through(&mut p, a, &src, 8, target.addr + 8, key),
        WcStatus::Success,
        "the MR and its window are untouched"
    );
    assert_eq!(p.b.mr_bytes(target.lkey).unwrap()[8..16], [7u8; 8]);
    let wb = post_one(&mut p, false, b, SendOp::LocalInv { rkey: key }, &[]);
    assert_eq!(wb[0].status, WcStatus::Success);
    assert!(!p.b.mr_has_bound_mw(target.lkey));
    p.b.dereg_mr_invalidate(target.lkey).unwrap();
}

#[test]
fn atomic_write_puts_eight_bytes_and_is_acked_like_a_write() {
    let mut p = Pair::new();
    let (a, b) = connect(&mut p, &ConnOpts::default());
    let target = mr(&mut p.b, b.pd, 64, |_| 0xee);
    let value = *b"rocev2!!";
    let wa = post_one(
        &mut p,
        true,
        a,
        SendOp::AtomicWrite {
            remote_addr: target.addr + 16,
            rkey: target.rkey,
            value,
        },
        &[],
    );
    assert_eq!(
        (wa[0].status, wa[0].opcode, wa[0].byte_len),
        (WcStatus::Success, WcOpcode::AtomicWrite, 8)
    );
    let got = p.b.mr_bytes(target.lkey).unwrap();
    assert_eq!(&got[16..24], b"rocev2!!");
    assert!(got[..16].iter().chain(&got[24..]).all(|&b| b == 0xee));
    // On the wire: RC_ATOMIC_WRITE (0x1D) with RETH (va, rkey, DMA length 8) and the 8 bytes; answered by an ACK.
    let f = &p.captured.iter().find(|c| c.1 == Dir::AtoB).unwrap().2;
    assert_eq!(bth_of(f).0, 0x1D);
    assert!(bth_of(f).2, "AckReq");
    assert_eq!(
        u64::from_be_bytes(f[54..62].try_into().unwrap()),
        target.addr + 16
    );
    assert_eq!(
        u32::from_be_bytes(f[62..66].try_into().unwrap()),
        target.rkey.0
    );
    assert_eq!(u32::from_be_bytes(f[66..70].try_into().unwrap()), 8);
    assert_eq!(&f[70..78], b"rocev2!!");
    let back = &p.captured.iter().find(|c| c.1 == Dir::BtoA).unwrap().2;
    assert_eq!(bth_of(back).0, 0x11, "RC ACKNOWLEDGE");
    // Misaligned: NAK invalid request.
    let wa = post_one(
        &mut p,
        true,
        a,
        SendOp::AtomicWrite {
            remote_addr: target.addr + 4,
            rkey: target.rkey,
            value,
        },
        &[],
    );
    assert_eq!(wa[0].status, WcStatus::RemInvReqErr);
}

#[test]
fn atomic_write_needs_remote_write() {
    let mut p = Pair::new();
    let (a, b) = connect(&mut p, &ConnOpts::default());
    let ro =
        p.b.reg_mr(
            b.pd,
            vec![0u8; 64],
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ,
        )
        .unwrap();
    let wa = post_one(
        &mut p,
        true,
        a,
        SendOp::AtomicWrite {
            remote_addr: ro.addr,
            rkey: ro.rkey,
            value: [1; 8],
        },
        &[],
    );
    assert_eq!(wa[0].status, WcStatus::RemAccessErr);
    assert_eq!(p.b.mr_bytes(ro.lkey).unwrap(), vec![0u8; 64]);
}
