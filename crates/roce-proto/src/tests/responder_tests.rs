//! Responder rules found wanting by issue #10: responder resources and MR lifetime, duplicate-request ACK PSNs,
//! `max_dest_rd_atomic` 0, per-connection state across RESET.

use super::util::*;
use crate::*;

fn setup() -> (Pair, End, End, MrInfo, MrInfo) {
    let mut p = Pair::new();
    let (a, b) = connect(&mut p, &ConnOpts::default());
    let ma = mr(&mut p.a, a.pd, 1 << 16, |i| (i % 251) as u8);
    let mb = mr(&mut p.b, b.pd, 1 << 16, |i| (i % 13) as u8 ^ 0x5a);
    (p, a, b, ma, mb)
}

fn statuses(w: &[Wc]) -> Vec<(u64, WcStatus)> {
    w.iter().map(|w| (w.wr_id, w.status)).collect()
}

/// AETH syndrome and PSN of every ACK/NAK B sent.
fn acks_from_b(p: &Pair) -> Vec<(u8, u32)> {
    p.captured
        .iter()
        .filter(|c| c.1 == Dir::BtoA && c.2[42] == 0x11)
        .map(|c| (c.2[54], bth_of(&c.2).1))
        .collect()
}

fn read_wr<'a>(id: u64, mb: &MrInfo, off: u64, local: &'a [Sge]) -> SendWr<'a> {
    SendWr::new(
        id,
        SendOp::RdmaRead {
            remote_addr: mb.addr + off,
            rkey: mb.rkey,
        },
        local,
    )
    .signaled()
}

/// rxe "RDMA/rxe: Replace mr by rkey in responder resources" (2022): a saved READ keeps the R_Key, not the MR, so
/// once the peer's READ has completed the MR can be deregistered, and a new READ naming that R_Key gets NAK remote
/// access error (REM_ACCESS_ERR at the requester).
#[test]
fn dereg_mr_after_a_peer_read_completed() {
    let (mut p, a, _b, ma, mb) = setup();
    let local = [sge(&ma, 0, 3000)];
    p.a.post_send(a.qpn, &[read_wr(1, &mb, 0, &local)]).unwrap();
    p.drive();
    assert_eq!(
        statuses(&poll_all(&mut p.a, a.cq)),
        vec![(1, WcStatus::Success)]
    );
    assert!(
        p.b.dereg_mr(mb.lkey).is_ok(),
        "a completed READ must not pin the responder's MR"
    );
    let local = [sge(&ma, 0, 100)];
    p.a.post_send(a.qpn, &[read_wr(2, &mb, 0, &local)]).unwrap();
    p.drive();
    assert_eq!(
        statuses(&poll_all(&mut p.a, a.cq)),
        vec![(2, WcStatus::RemAccessErr)]
    );
    assert_eq!(p.b.counters().resp_remote_access_errors, 1);
}

/// The same R_Key rule for a duplicate READ (`ROCEV2.md §5`: replayed from the saved request): after the MR is
/// deregistered, the replay is answered with NAK remote access error at the duplicate's PSN, never with bytes of
/// freed or reused memory.
#[test]
fn duplicate_read_after_dereg_gets_nak_remote_access() {
    let (mut p, a, b, ma, mb) = setup();
    let local = [sge(&ma, 0, 3000)];
    p.a.post_send(a.qpn, &[read_wr(1, &mb, 0, &local)]).unwrap();
    p.drive();
    assert_eq!(
        statuses(&poll_all(&mut p.a, a.cq)),
        vec![(1, WcStatus::Success)]
    );
    let req = p
        .captured
        .iter()
        .find(|c| c.1 == Dir::AtoB && c.2[42] == 0x0C)
        .unwrap()
        .2
        .clone();
    let read_psn = bth_of(&req).1;
    assert!(p.b.dereg_mr(mb.lkey).is_ok());
    // An MR registered afterwards must not be read under the old R_Key either.
    let _other = mr(&mut p.b, b.pd, 1 << 16, |_| 0xEE);
    let now = p.now;
    p.b.handle_frame(now, &req);
    p.drive();
    assert!(
        !p.captured
            .iter()
            .any(|c| c.1 == Dir::BtoA && (0x0D..=0x10).contains(&c.2[42]) && c.0 >= now),
        "replayed READ responses after dereg"
    );
    assert_eq!(acks_from_b(&p).last(), Some(&(0x62, read_psn)));
    assert_eq!(p.b.qp_info(b.qpn).unwrap().state, QpState::Err);
    assert_eq!(p.b.counters().resp_remote_access_errors, 1);
}

/// Deregistration between two packets of a READ response stream: the next packet becomes NAK remote access error
/// with that packet's PSN (IBTA: the NAK replaces the response it stands for) and the READ completes with
/// REM_ACCESS_ERR; nothing is read from the freed MR.
#[test]
fn dereg_mr_in_the_middle_of_a_read_response_stream() {
    let (mut p, a, _b, ma, mb) = setup();
    let local = [sge(&ma, 0, 8192)];
    p.a.post_send(a.qpn, &[read_wr(1, &mb, 0, &local)]).unwrap();
    let mut buf = vec![0u8; 9000];
    let now = p.now;
    let m = p.a.poll_transmit(now, &mut buf).unwrap();
    let req = buf[..m.len].to_vec();
    let read_psn = bth_of(&req).1;
    p.b.handle_frame(now, &req);
    let m = p.b.poll_transmit(now, &mut buf).unwrap();
    assert_eq!(buf[42], 0x0D, "READ RESPONSE FIRST");
    let first = buf[..m.len].to_vec();
    p.a.handle_frame(now, &first);
    assert!(
        p.b.dereg_mr(mb.lkey).is_ok(),
        "remote access holds no lease on the MR"
    );
    p.drive();
    assert_eq!(
        statuses(&poll_all(&mut p.a, a.cq)),
        vec![(1, WcStatus::RemAccessErr)]
    );
    assert_eq!(acks_from_b(&p), vec![(0x62, read_psn + 1)]);
}

/// The same for a multi-packet RDMA WRITE: the R_Key is resolved again for every packet, so a WRITE whose MR is
/// deregistered mid-message gets NAK remote access error at the next packet — never a write into a freed or
/// reused slot, never a panic.
#[test]
fn dereg_mr_in_the_middle_of_a_write() {
    let (mut p, a, b, ma, mb) = setup();
    let local = [sge(&ma, 0, 4096)];
    p.a.post_send(
        a.qpn,
        &[SendWr::new(
            1,
            SendOp::RdmaWrite {
                remote_addr: mb.addr,
                rkey: mb.rkey,
            },
            &local,
        )
        .signaled()],
    )
    .unwrap();
    let mut buf = vec![0u8; 9000];
    let now = p.now;
    let m = p.a.poll_transmit(now, &mut buf).unwrap();
    assert_eq!(buf[42], 0x06, "WRITE FIRST");
    let first = buf[..m.len].to_vec();
    let first_psn = bth_of(&first).1;
    p.b.handle_frame(now, &first);
    assert!(p.b.dereg_mr(mb.lkey).is_ok());
    // The slot is reused at once by an MR the WRITE never named.
    let other = mr(&mut p.b, b.pd, 1 << 16, |_| 0xEE);
    p.drive();
    assert_eq!(
        statuses(&poll_all(&mut p.a, a.cq)),
        vec![(1, WcStatus::RemAccessErr)]
    );
    assert_eq!(acks_from_b(&p), vec![(0x62, first_psn + 1)]);
    assert!(
        p.b.mr_bytes(other.lkey).unwrap().iter().all(|&x| x == 0xEE),
        "the WRITE landed in another MR"
    );
}

/// `ROCEV2.md §5` (rxe `resp.ack_psn`, "IB/rxe: fix for duplicate request processing and ack psns", 2019): a
/// duplicate SEND/WRITE is re-acknowledged with the PSN of the last SEND/WRITE the responder executed, never with
/// ePSN−1 when a READ or atomic was executed after it — an ACK at or beyond an outstanding READ/atomic PSN is an
/// implied NAK for it (`§4.4`), so the requester would retry it for nothing.
#[test]
fn duplicate_write_after_a_read_is_acked_with_the_write_psn() {
    for then_atomic in [false, true] {
        let (mut p, a, _b, ma, mb) = setup();
        let w_sg = [sge(&ma, 0, 100)];
        let r_sg = [sge(&ma, 4096, 8192)];
        let at_sg = [sge(&ma, 512, 8)];
        let second = if then_atomic {
            SendWr::new(
                2,
                SendOp::AtomicFetchAndAdd {
                    remote_addr: mb.addr + 64,
                    rkey: mb.rkey,
                    add: 1,
                },
                &at_sg,
            )
        } else {
            read_wr(2, &mb, 0, &r_sg)
        };
        let write = SendWr::new(
            1,
            SendOp::RdmaWrite {
                remote_addr: mb.addr + 1024,
                rkey: mb.rkey,
            },
            &w_sg,
        );
        p.a.post_send(a.qpn, &[write, second]).unwrap();
        let mut buf = vec![0u8; 9000];
        let now = p.now;
        let m = p.a.poll_transmit(now, &mut buf).unwrap();
        let w = buf[..m.len].to_vec();
        let m = p.a.poll_transmit(now, &mut buf).unwrap();
        let r = buf[..m.len].to_vec();
        let write_psn = bth_of(&w).1;
        // B executes the WRITE and the READ/atomic, then sees the WRITE again (a duplicate on the wire).
        p.b.handle_frame(now, &w);
        p.b.handle_frame(now, &r);
        p.b.handle_frame(now, &w);
        p.drive();
        let acks = acks_from_b(&p);
        assert_eq!(
            acks.last().map(|x| x.1),
            Some(write_psn),
            "atomic={then_atomic}: the duplicate WRITE's ACK names {acks:?}"
        );
        assert_eq!(
            statuses(&poll_all(&mut p.a, a.cq)),
            vec![(1, WcStatus::Success), (2, WcStatus::Success)]
        );
        assert_eq!(p.a.counters().completer_retry_err, 0);
    }
}

/// A QP taken through RESET and connected again starts a new connection: its responder MSN (and every other
/// per-connection requester/responder state) is cleared on RESET (IBTA 10.3.1: RESET is the state of a newly
/// created QP; rxe `rxe_qp_reset`), so the first ACK of the new connection carries MSN 1.
#[test]
fn reset_clears_the_responder_msn() {
    let (mut p, a, b, ma, mb) = setup();
    let o = ConnOpts::default();
    let send = |p: &mut Pair, id: u64| {
        p.b.post_recv(
            b.qpn,
            &[RecvWr {
                wr_id: id,
                sg_list: &[sge(&mb, 0, 100)],
            }],
        )
        .unwrap();
        p.a.post_send(a.qpn, &[SendWr::new(id, SendOp::Send, &[sge(&ma, 0, 10)])])
            .unwrap();
        p.drive();
    };
    for id in 0..3 {
        send(&mut p, id);
    }
    assert_eq!(p.b.qp_info(b.qpn).unwrap().msn, 3);
    let reset = QpAttr {
        qp_state: QpState::Reset,
        ..QpAttr::default()
    };
    for (e, q) in [(&mut p.a, a.qpn), (&mut p.b, b.qpn)] {
        e.modify_qp(q, &reset, QpAttrMask::STATE).unwrap();
        assert_eq!(e.qp_info(q).unwrap().msn, 0, "MSN survives RESET");
    }
    let (pa, pb) = (Psn::new(7000), Psn::new(9000));
    bring_up(&mut p.a, a, b.qpn, MAC_B, IP_B, pa, pb, &o);
    bring_up(&mut p.b, b, a.qpn, MAC_A, IP_A, pb, pa, &o);
    let before = p.captured.len();
    send(&mut p, 10);
    let ack = p.captured[before..]
        .iter()
        .find(|c| c.1 == Dir::BtoA && c.2[42] == 0x11)
        .expect("an ACK of the new connection");
    let msn = u32::from_be_bytes([0, ack.2[55], ack.2[56], ack.2[57]]);
    assert_eq!((bth_of(&ack.2).1, msn), (7000, 1));
}

/// A responder with no READ/atomic resources (`max_dest_rd_atomic` 0) refuses READs and atomics with NAK invalid
/// request (IBTA; rxe `check_resource` → RESPST_ERR_TOO_MANY_RDMA_ATM_REQ; siw "zero-sized Read and Receive
/// Queues", 2020): the requester sees REM_INV_REQ_ERR, and `query_qp` reports the 0 it was given.
#[test]
fn max_dest_rd_atomic_zero_refuses_read_and_atomic() {
    for atomic in [false, true] {
        let mut p = Pair::new();
        let o = ConnOpts {
            max_dest_rd_atomic: 0,
            ..ConnOpts::default()
        };
        let (a, b) = connect(&mut p, &o);
        let ma = mr(&mut p.a, a.pd, 4096, |_| 0);
        let mb = mr(&mut p.b, b.pd, 4096, |i| i as u8);
        assert_eq!(p.b.query_qp(b.qpn).unwrap().max_dest_rd_atomic, 0);
        let local = [sge(&ma, 0, 8)];
        let wr = if atomic {
            SendWr::new(
                1,
                SendOp::AtomicFetchAndAdd {
                    remote_addr: mb.addr,
                    rkey: mb.rkey,
                    add: 1,
                },
                &local,
            )
        } else {
            read_wr(1, &mb, 0, &local)
        };
        p.a.post_send(a.qpn, &[wr]).unwrap();
        p.drive();
        assert_eq!(
            statuses(&poll_all(&mut p.a, a.cq)),
            vec![(1, WcStatus::RemInvReqErr)],
            "atomic={atomic}"
        );
        assert_eq!(acks_from_b(&p).last().map(|x| x.0), Some(0x61));
        assert_eq!(p.b.qp_info(b.qpn).unwrap().state, QpState::Err);
        let untouched = p.b.mr_bytes(mb.lkey).unwrap()[..8].to_vec();
        assert_eq!(untouched, (0..8).collect::<Vec<u8>>(), "atomic executed");
    }
}
