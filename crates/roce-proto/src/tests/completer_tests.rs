//! Requester response handling after a go-back-N rewind and on error NAKs (issue #10), driven frame by frame so
//! the order of events is exact.

use std::time::Duration;

use super::util::*;
use crate::*;

/// Both ends connected; A owns `ma`, B owns `mb` (64 KiB each).
fn setup() -> (Pair, End, End, MrInfo, MrInfo) {
    let mut p = Pair::new();
    let (a, b) = connect(&mut p, &ConnOpts::default());
    let ma = mr(&mut p.a, a.pd, 1 << 18, |i| (i % 251) as u8);
    let mb = mr(&mut p.b, b.pd, 1 << 18, |i| (i % 13) as u8 ^ 0x5a);
    (p, a, b, ma, mb)
}

/// Every frame `e` has ready now, in order.
fn pump(e: &mut Engine, now: Instant) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut buf = vec![0u8; 9000];
    while let Some(m) = e.poll_transmit(now, &mut buf) {
        out.push(buf[..m.len].to_vec());
    }
    out
}

/// The next frame `e` has ready now.
fn one(e: &mut Engine, now: Instant) -> Vec<u8> {
    let mut buf = vec![0u8; 9000];
    let m = e.poll_transmit(now, &mut buf).expect("a frame");
    buf[..m.len].to_vec()
}

fn statuses(w: &[Wc]) -> Vec<(u64, WcStatus)> {
    w.iter().map(|w| (w.wr_id, w.status)).collect()
}

fn write<'a>(id: u64, mb: &MrInfo, off: u64, local: &'a [Sge]) -> SendWr<'a> {
    SendWr::new(
        id,
        SendOp::RdmaWrite {
            remote_addr: mb.addr + off,
            rkey: mb.rkey,
        },
        local,
    )
    .signaled()
}

/// Lets A's local ACK timer (timeout 14 ≈ 67 ms) expire: A rewinds to its oldest unacknowledged PSN.
fn expire_ack_timer(p: &mut Pair) {
    p.now += Duration::from_millis(70);
    let now = p.now;
    p.a.handle_timeout(now);
}

/// The issue-#10 scenario: a full window (128 PSNs) is sent and every ACK is lost; the local ACK timer expires and A
/// rewinds to the window's first PSN; the responder answers the first retransmitted (duplicate) packet with an ACK
/// for its latest PSN. That ACK lies beyond A's rewound send pointer but within what A sent before the rewind: it
/// acknowledges packets the responder did receive and must be processed (IBTA/rxe: a response is valid against
/// the outstanding window, i.e. the highest PSN sent; rxe `rxe_comp.c` check_psn), not dropped as stale — so the
/// two WRITEs it covers complete at once and A resumes with new data, without re-sending the other 127 packets.
#[test]
fn ack_beyond_the_rewound_send_pointer_completes_the_window() {
    let (mut p, a, b, ma, mb) = setup();
    let s1 = [sge(&ma, 0, 64 * 1024)];
    let s2 = [sge(&ma, 64 * 1024, 64 * 1024)];
    let s3 = [sge(&ma, 128 * 1024, 8 * 1024)];
    p.a.post_send(
        a.qpn,
        &[
            write(1, &mb, 0, &s1),
            write(2, &mb, 0, &s2),
            write(3, &mb, 0, &s3),
        ],
    )
    .unwrap();
    let now = p.now;
    let window = pump(&mut p.a, now);
    assert_eq!(window.len(), 128, "the window holds 128 PSNs");
    for f in &window {
        p.b.handle_frame(now, f);
    }
    let lost = pump(&mut p.b, now);
    assert!(
        !lost.is_empty(),
        "B acknowledged the window (and all of it is lost)"
    );
    expire_ack_timer(&mut p);
    let now = p.now;
    let again = one(&mut p.a, now);
    assert_eq!(
        bth_of(&again).1,
        100,
        "go-back-N restarts at the oldest unacknowledged PSN"
    );
    p.b.handle_frame(now, &again);
    let ack = one(&mut p.b, now);
    assert_eq!(
        (ack[42], bth_of(&ack).1),
        (0x11, 227),
        "B ACKs its latest PSN"
    );
    p.a.handle_frame(now, &ack);
    assert_eq!(
        statuses(&poll_all(&mut p.a, a.cq)),
        vec![(1, WcStatus::Success), (2, WcStatus::Success)],
        "the ACK for PSN 227 was not processed"
    );
    assert_eq!(p.a.counters().drop_stale_response, 0);
    let next = one(&mut p.a, now);
    assert_eq!(
        (next[42], bth_of(&next).1),
        (0x06, 228),
        "A resumes with WRITE 3 at PSN 228, not with a retransmission"
    );
    p.b.handle_frame(now, &next);
    p.drive();
    assert_eq!(
        statuses(&poll_all(&mut p.a, a.cq)),
        vec![(3, WcStatus::Success)]
    );
    assert_eq!(p.a.counters().retransmitted_pkts, 1);
    let _ = b;
}

/// The same rule for READ responses and ATOMIC ACKs of the original request: a WRITE's ACK is lost, the READ's
/// responses (or the atomic's ACK) are late; the timer expires and A rewinds to the WRITE and re-sends its first
/// packet; then the late responses arrive. They lie beyond the rewound send pointer but within what was sent, so
/// they acknowledge the WRITE (`ROCEV2.md §4.4`) and complete the READ/atomic with the original data.
#[test]
fn late_read_responses_and_atomic_ack_after_a_rewind_are_processed() {
    for atomic in [true, false] {
        let (mut p, a, _b, ma, mb) = setup();
        let w = [sge(&ma, 0, 4096)];
        let r = [sge(&ma, 8192, 4096)];
        let at = [sge(&ma, 16384, 8)];
        let second = if atomic {
            SendWr::new(
                2,
                SendOp::AtomicFetchAndAdd {
                    remote_addr: mb.addr + 64,
                    rkey: mb.rkey,
                    add: 1,
                },
                &at,
            )
        } else {
            SendWr::new(
                2,
                SendOp::RdmaRead {
                    remote_addr: mb.addr + 4096,
                    rkey: mb.rkey,
                },
                &r,
            )
        }
        .signaled();
        p.a.post_send(a.qpn, &[write(1, &mb, 0, &w), second])
            .unwrap();
        let now = p.now;
        for f in pump(&mut p.a, now) {
            p.b.handle_frame(now, &f);
        }
        let from_b = pump(&mut p.b, now);
        assert_eq!(from_b[0][42], 0x11, "B's ACK for the WRITE (lost)");
        let late = from_b[1..].to_vec();
        assert!(!late.is_empty());
        expire_ack_timer(&mut p);
        let now = p.now;
        let again = one(&mut p.a, now);
        assert_eq!(bth_of(&again).1, 100);
        for f in &late {
            p.a.handle_frame(now, f);
        }
        assert_eq!(
            statuses(&poll_all(&mut p.a, a.cq)),
            vec![(1, WcStatus::Success), (2, WcStatus::Success)],
            "atomic={atomic}: late responses were dropped"
        );
        assert_eq!(p.a.counters().drop_stale_response, 0);
        assert_eq!(p.a.counters().duplicate_response, 0);
        // The same responses once more (the answer to the retransmitted request, had it been a duplicate READ or
        // atomic): below una, ignored and counted as duplicates; nothing completes again.
        for f in &late {
            p.a.handle_frame(now, f);
        }
        assert!(poll_all(&mut p.a, a.cq).is_empty());
        assert_eq!(p.a.counters().duplicate_response, late.len() as u64);
        assert_eq!(
            p.a.qp_counters(a.qpn).unwrap().duplicate_response,
            late.len() as u64
        );
        assert_eq!(p.a.counters().drop_stale_response, 0);
        if atomic {
            let mut orig = [0u8; 8];
            p.a.mr_read(ma.lkey, 16384, &mut orig).unwrap();
            let want = p.b.mr_bytes(mb.lkey).unwrap()[64..72].to_vec();
            assert_eq!(
                u64::from_le_bytes(orig) + 1,
                u64::from_le_bytes(want.try_into().unwrap())
            );
        } else {
            let got = p.a.mr_bytes(ma.lkey).unwrap()[8192..12288].to_vec();
            assert_eq!(got, p.b.mr_bytes(mb.lkey).unwrap()[4096..8192].to_vec());
        }
        assert!(pump(&mut p.a, now).is_empty(), "nothing left to send");
    }
}

/// A re-ACK for una−1 (the responder re-acknowledges every duplicate) is harmless: it is ignored, as rxe's
/// completer does (`check_psn`: older PSN → done), and counted as `duplicate_response`, not as a drop. Responses
/// beyond anything ever sent are still dropped and counted (`drop_stale_response`).
#[test]
fn reack_of_una_minus_one_is_not_a_drop() {
    let (mut p, a, b, ma, mb) = setup();
    let s = [sge(&ma, 0, 100)];
    p.a.post_send(a.qpn, &[write(1, &mb, 0, &s)]).unwrap();
    let now = p.now;
    let frames = pump(&mut p.a, now);
    p.b.handle_frame(now, &frames[0]);
    let ack = one(&mut p.b, now);
    p.a.handle_frame(now, &ack);
    // The WRITE arrives again (duplicated on the wire); B re-ACKs PSN 100 = A's una−1.
    p.b.handle_frame(now, &frames[0]);
    let reack = one(&mut p.b, now);
    assert_eq!(bth_of(&reack).1, 100);
    p.a.handle_frame(now, &reack);
    assert_eq!(p.a.counters().drop_stale_response, 0);
    assert_eq!(p.a.qp_counters(a.qpn).unwrap().drop_stale_response, 0);
    assert_eq!(p.a.counters().duplicate_response, 1);
    assert_eq!(p.a.qp_counters(a.qpn).unwrap().duplicate_response, 1);
    // An ACK for a PSN never sent is a stale (ghost) response.
    let ghost = craft(
        &ack,
        0x11,
        5000,
        roce_wire::ExtRepr {
            aeth: ack_aeth(0x1f),
            ..roce_wire::ExtRepr::NONE
        },
        &[],
    );
    p.a.handle_frame(now, &ghost);
    assert_eq!(p.a.counters().drop_stale_response, 1);
    assert_eq!(p.a.qp_counters(a.qpn).unwrap().drop_stale_response, 1);
    assert_eq!(p.a.counters().duplicate_response, 1);
    let _ = b;
}

fn ack_aeth(syndrome: u8) -> Option<roce_wire::AethRepr> {
    Some(roce_wire::AethRepr {
        syndrome: roce_wire::AethSyndrome::from_byte(syndrome),
        msn: Msn::new(1),
    })
}

/// After an error NAK the WR that fails is the one the NAK names (`ROCEV2.md §4.4`), not an unanswered READ ahead
/// of it. Here nothing is lost: the responder executes a READ, then a WRITE with a bad R_Key. It sends the READ's
/// responses before the NAK (responses leave in PSN order, IBTA), so the READ succeeds and the WRITE completes
/// with REM_ACCESS_ERR.
#[test]
fn error_nak_fails_the_named_wr_after_a_read() {
    let (mut p, a, _b, ma, mb) = setup();
    let r = [sge(&ma, 0, 4096)];
    let w = [sge(&ma, 8192, 100)];
    let bad = SendWr::new(
        2,
        SendOp::RdmaWrite {
            remote_addr: mb.addr,
            rkey: Rkey(mb.rkey.0 ^ 0x100),
        },
        &w,
    )
    .signaled();
    let read = SendWr::new(
        1,
        SendOp::RdmaRead {
            remote_addr: mb.addr,
            rkey: mb.rkey,
        },
        &r,
    )
    .signaled();
    p.a.post_send(a.qpn, &[read, bad]).unwrap();
    p.drive();
    assert_eq!(
        statuses(&poll_all(&mut p.a, a.cq)),
        vec![(1, WcStatus::Success), (2, WcStatus::RemAccessErr)]
    );
    let got = p.a.mr_bytes(ma.lkey).unwrap()[..4096].to_vec();
    assert_eq!(got, p.b.mr_bytes(mb.lkey).unwrap()[..4096].to_vec());
}

/// The same when the READ's responses are lost: the READ cannot complete (the responder has stopped), but it is not
/// what failed: it is flushed (WR_FLUSH_ERR) and the WRITE the NAK names carries REM_ACCESS_ERR.
#[test]
fn error_nak_after_lost_read_responses_fails_the_named_wr() {
    let (mut p, a, _b, ma, mb) = setup();
    let r = [sge(&ma, 0, 4096)];
    let w = [sge(&ma, 8192, 100)];
    let bad = SendWr::new(
        2,
        SendOp::RdmaWrite {
            remote_addr: mb.addr,
            rkey: Rkey(mb.rkey.0 ^ 0x100),
        },
        &w,
    )
    .signaled();
    let read = SendWr::new(
        1,
        SendOp::RdmaRead {
            remote_addr: mb.addr,
            rkey: mb.rkey,
        },
        &r,
    )
    .signaled();
    p.a.post_send(a.qpn, &[read, bad]).unwrap();
    // Drop every READ response on the wire.
    p.filter = Box::new(|d, f| !(d == Dir::BtoA && (0x0D..=0x10).contains(&f[42])));
    p.drive();
    assert_eq!(
        statuses(&poll_all(&mut p.a, a.cq)),
        vec![(1, WcStatus::WrFlushErr), (2, WcStatus::RemAccessErr)]
    );
}

/// One retry at a time (`ROCEV2.md §4.4`; rxe `comp.started_retry`): a READ's response is lost and a later SEND
/// too, so the responder sends an ACK beyond the READ (an implied NAK: retry 1 starts, going back to the READ)
/// and a sequence NAK for the lost SEND. The NAK acknowledges nothing new — the unanswered READ still blocks — so
/// it belongs to the same loss burst and must not start a second retry: every such NAK spent a retry from the
/// shared `retry_cnt` budget, and a few lossy bursts ended in RETRY_EXC_ERR (10 % random loss, seed sweep).
#[test]
fn nak_beyond_an_unanswered_read_does_not_start_a_second_retry() {
    let (mut p, a, b, ma, mb) = setup();
    for k in 0..8 {
        p.b.post_recv(
            b.qpn,
            &[RecvWr {
                wr_id: k,
                sg_list: &[sge(&mb, 4096 * k, 4096)],
            }],
        )
        .unwrap();
    }
    let r = [sge(&ma, 0, 512)];
    let s = [sge(&ma, 8192, 64)];
    let mut wrs = vec![SendWr::new(
        1,
        SendOp::RdmaRead {
            remote_addr: mb.addr + 65536,
            rkey: mb.rkey,
        },
        &r,
    )];
    for id in 2..6 {
        wrs.push(SendWr::new(id, SendOp::Send, &s));
    }
    p.a.post_send(a.qpn, &wrs).unwrap();
    let now = p.now;
    let sent = pump(&mut p.a, now);
    assert_eq!(sent.len(), 5);
    // PSN 102 is lost on the way to B.
    for (k, f) in sent.iter().enumerate() {
        if k != 2 {
            p.b.handle_frame(now, f);
        }
    }
    let from_b = pump(&mut p.b, now);
    let kinds: Vec<(u8, u32)> = from_b.iter().map(|f| (f[42], bth_of(f).1)).collect();
    assert_eq!(kinds, vec![(0x10, 100), (0x11, 101), (0x11, 102)]);
    assert_eq!(from_b[2][54], 0x60, "sequence NAK for 102");
    // The READ response is lost; the ACK and the NAK arrive.
    p.a.handle_frame(now, &from_b[1]);
    assert_eq!(
        p.a.counters().completer_retry_err,
        1,
        "implied NAK: retry 1"
    );
    p.a.handle_frame(now, &from_b[2]);
    assert_eq!(
        p.a.counters().completer_retry_err,
        1,
        "the NAK from the same burst started a second retry"
    );
    p.drive();
    assert_eq!(
        statuses(&poll_all(&mut p.a, a.cq))
            .iter()
            .filter(|s| s.1 != WcStatus::Success)
            .count(),
        0
    );
}
