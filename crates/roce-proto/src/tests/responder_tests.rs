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
