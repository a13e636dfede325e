//! Deterministic lost-response cases (written while reducing a property-test failure): the responder replays a
//! saved ATOMIC ACK / re-reads a READ for the retransmitted request, and the requester completes on it.

use std::time::Duration;

use roce_proto::*;
use roce_tests::*;

/// Posts `wrs` (built by `mk` against a's MR and b's MR) with b's transmit fates scripted, then drives and returns
/// a's completions and the frame log.
fn lost_response(
    script_b: &[Fault],
    mk: impl Fn(&MrInfo, &MrInfo) -> Vec<(SendOp, Vec<Sge>)>,
) -> (Vec<Wc>, String, Counters) {
    let mut p = Pair::new();
    let (a, b) = connect(&mut p, &ConnOpts::default());
    let ma = reg(&mut p, a, 1 << 16, |i| i as u8);
    let mb = reg(&mut p, b, 1 << 16, |i| (i * 7) as u8);
    p.e(1)
        .post_recv(
            b.qpn,
            &[RecvWr {
                wr_id: 1,
                sg_list: &[sge(&mb, 0, 4096)],
            }],
        )
        .unwrap();
    p.faults(1).script_tx(script_b.iter().copied());
    let ops = mk(&ma, &mb);
    let wrs: Vec<SendWr> = ops
        .iter()
        .enumerate()
        .map(|(i, (op, sg))| SendWr::new(i as u64 + 1, *op, sg).signaled())
        .collect();
    p.a().post_send(a.qpn, &wrs).unwrap();
    p.drive_for(Duration::from_secs(2));
    let c = p.counters(0);
    (poll_all(p.a(), a.cq), p.dump(30), c)
}

fn statuses(w: &[Wc]) -> Vec<(u64, WcStatus)> {
    w.iter().map(|w| (w.wr_id, w.status)).collect()
}

/// `ROCEV2.md §5`: a duplicate atomic is answered with the saved ATOMIC ACKNOWLEDGE; `§4.4`: the requester
/// completes the atomic on that response. Here the first ATOMIC ACK is lost, after an ACK for an earlier SEND.
#[test]
fn atomic_ack_lost_after_send_ack() {
    let (wc, log, c) = lost_response(&[Fault::Pass, Fault::Drop], |ma, mb| {
        vec![
            (SendOp::Send, vec![]),
            (
                SendOp::AtomicCmpAndSwp {
                    remote_addr: mb.addr + 64,
                    rkey: mb.rkey,
                    compare: 1,
                    swap: 2,
                },
                vec![sge(ma, 0, 8)],
            ),
        ]
    });
    assert_eq!(
        statuses(&wc),
        vec![(1, WcStatus::Success), (2, WcStatus::Success)],
        "counters {c:?}\n{log}"
    );
}

/// The same with the atomic alone.
#[test]
fn atomic_ack_lost_alone() {
    let (wc, log, c) = lost_response(&[Fault::Drop], |ma, mb| {
        vec![(
            SendOp::AtomicFetchAndAdd {
                remote_addr: mb.addr + 64,
                rkey: mb.rkey,
                add: 5,
            },
            vec![sge(ma, 0, 8)],
        )]
    });
    assert_eq!(
        statuses(&wc),
        vec![(1, WcStatus::Success)],
        "counters {c:?}\n{log}"
    );
}

/// The same for a READ whose only response is lost, after an ACKed SEND.
#[test]
fn read_response_lost_after_send_ack() {
    let (wc, log, c) = lost_response(&[Fault::Pass, Fault::Drop], |ma, mb| {
        vec![
            (SendOp::Send, vec![]),
            (
                SendOp::RdmaRead {
                    remote_addr: mb.addr,
                    rkey: mb.rkey,
                },
                vec![sge(ma, 0, 100)],
            ),
        ]
    });
    assert_eq!(
        statuses(&wc),
        vec![(1, WcStatus::Success), (2, WcStatus::Success)],
        "counters {c:?}\n{log}"
    );
}
