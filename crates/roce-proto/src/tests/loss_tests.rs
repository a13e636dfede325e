//! Loss, retransmission, timers, RNR, retry exhaustion, flush semantics, malformed input.

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

/// Drops the `n`-th frame (0-based) in direction `dir`.
fn drop_nth(dir: Dir, n: usize) -> Filter {
    let mut k = 0;
    Box::new(move |d, _| {
        if d != dir {
            return true;
        }
        k += 1;
        k - 1 != n
    })
}

#[test]
fn lost_data_packet_seq_nak_go_back_n_byte_identical() {
    let (mut p, a, b, ma, mb) = setup(&ConnOpts::default());
    p.filter = drop_nth(Dir::AtoB, 2);
    p.b.post_recv(
        b.qpn,
        &[RecvWr {
            wr_id: 1,
            sg_list: &[sge(&mb, 0, 8192)],
        }],
    )
    .unwrap();
    let s = [sge(&ma, 0, 5000)];
    p.a.post_send(a.qpn, &[SendWr::new(1, SendOp::Send, &s)])
        .unwrap();
    p.drive();
    let wa = poll_all(&mut p.a, a.cq);
    assert_eq!(
        wa.iter().map(|w| w.status).collect::<Vec<_>>(),
        vec![WcStatus::Success]
    );
    assert_eq!(
        &p.b.mr_bytes(mb.lkey).unwrap()[..5000],
        &p.a.mr_bytes(ma.lkey).unwrap()[..5000]
    );
    let ca = p.a.counters();
    assert_eq!(
        (ca.rcvd_seq_err, ca.packet_seq_err, ca.completer_retry_err),
        (1, 1, 1)
    );
    assert_eq!(
        p.b.counters().out_of_seq_request,
        2,
        "PSNs 103 and 104 arrived after the gap"
    );
    // One NAK per gap.
    let naks = p
        .captured
        .iter()
        .filter(|c| c.1 == Dir::BtoA && c.2[54] == 0x60)
        .count();
    assert_eq!(naks, 1);
    // Retransmissions of PSN 102.. are byte-identical to the originals except IP identification/checksum.
    let frames: Vec<_> = p
        .captured
        .iter()
        .filter(|c| c.1 == Dir::AtoB)
        .map(|c| c.2.clone())
        .collect();
    let orig = frames.iter().find(|f| bth_of(f).1 == 102).unwrap();
    let re = frames.iter().rev().find(|f| bth_of(f).1 == 102).unwrap();
    assert_eq!(
        orig, re,
        "retransmission is byte-identical (IP ID derives from the PSN)"
    );
    assert!(p.a.counters().retransmitted_pkts >= 3);
}

#[test]
fn lost_ack_recovers_by_timeout_and_duplicate_is_reacked() {
    let o = ConnOpts {
        timeout: 8,
        ..ConnOpts::default()
    };
    let (mut p, a, b, ma, mb) = setup(&o);
    p.filter = drop_nth(Dir::BtoA, 0);
    p.b.post_recv(
        b.qpn,
        &[RecvWr {
            wr_id: 1,
            sg_list: &[sge(&mb, 0, 100)],
        }],
    )
    .unwrap();
    let s = [sge(&ma, 0, 100)];
    let t0 = p.now;
    p.a.post_send(a.qpn, &[SendWr::new(1, SendOp::Send, &s)])
        .unwrap();
    p.drive();
    assert_eq!(poll_all(&mut p.a, a.cq)[0].status, WcStatus::Success);
    assert_eq!(
        poll_all(&mut p.b, b.cq).len(),
        1,
        "the duplicate is not delivered twice"
    );
    assert_eq!(p.b.counters().duplicate_request, 1);
    assert_eq!(p.a.counters().local_ack_timeout_err, 1);
    // The retransmission happened one local ACK timeout (4.096 µs · 2^8) after the send.
    let sends: Vec<_> = p
        .captured
        .iter()
        .filter(|c| c.1 == Dir::AtoB)
        .map(|c| c.0)
        .collect();
    assert_eq!(sends.len(), 2);
    assert_eq!(sends[1] - sends[0], Duration::from_nanos(4096 << 8));
    assert!(sends[0] >= t0);
}

#[test]
fn s15_retry_exhaustion_flushes_everything() {
    let o = ConnOpts {
        timeout: 14,
        retry_cnt: 3,
        ..ConnOpts::default()
    };
    let (mut p, a, _b, ma, _mb) = setup(&o);
    p.filter = Box::new(|d, _| d != Dir::AtoB);
    let s = [sge(&ma, 0, 10)];
    let wrs: Vec<_> = (1..=3)
        .map(|i| {
            SendWr::new(i, SendOp::Send, &s).flags(if i == 2 {
                SendFlags::EMPTY
            } else {
                SendFlags::SIGNALED
            })
        })
        .collect();
    p.a.post_recv(
        a.qpn,
        &[RecvWr {
            wr_id: 50,
            sg_list: &[sge(&ma, 0, 10)],
        }],
    )
    .unwrap();
    p.a.post_send(a.qpn, &wrs).unwrap();
    p.drive_for(Duration::from_secs(2));
    let first_psn_tx: Vec<_> = p
        .captured
        .iter()
        .filter(|c| c.1 == Dir::AtoB && bth_of(&c.2).1 == 100)
        .map(|c| c.0)
        .collect();
    assert_eq!(
        first_psn_tx.len(),
        4,
        "1 + retry_cnt transmissions of the first unacked PSN"
    );
    let t = Duration::from_nanos(4096 << 14);
    for w in first_psn_tx.windows(2) {
        assert_eq!(w[1] - w[0], t);
    }
    let wa = poll_all(&mut p.a, a.cq);
    let st: Vec<_> = wa.iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(
        st,
        vec![
            (1, WcStatus::RetryExcErr),
            (2, WcStatus::WrFlushErr),
            (3, WcStatus::WrFlushErr),
            (50, WcStatus::WrFlushErr)
        ]
    );
    let c = p.a.counters();
    assert_eq!((c.local_ack_timeout_err, c.retry_exceeded_err), (4, 1));
    assert_eq!(p.a.qp_info(a.qpn).unwrap().state, QpState::Err);
    assert_eq!(
        p.a.poll_async_event().map(|e| e.event_type),
        Some(AsyncEventType::QpFatal)
    );
    // Posting in ERR flushes immediately.
    p.a.post_send(a.qpn, &[SendWr::new(9, SendOp::Send, &s)])
        .unwrap();
    assert_eq!(
        poll_all(&mut p.a, a.cq)
            .iter()
            .map(|w| (w.wr_id, w.status))
            .collect::<Vec<_>>(),
        vec![(9, WcStatus::WrFlushErr)]
    );
    // Nothing leaked: the MR can be deregistered.
    assert!(p.a.dereg_mr(ma.lkey).is_ok());
}

#[test]
fn s04_rnr_waits_the_advertised_time_and_retries() {
    let o = ConnOpts {
        timeout: 8,
        min_rnr_timer: 14,
        rnr_retry: 2,
        ..ConnOpts::default()
    };
    let (mut p, a, b, ma, mb) = setup(&o);
    let s = [sge(&ma, 0, 10)];
    p.a.post_send(a.qpn, &[SendWr::new(1, SendOp::Send, &s)])
        .unwrap();
    p.drive_for(Duration::from_millis(1));
    // One SEND, one RNR NAK; no retransmission before 1.28 ms.
    let sends: Vec<_> = p
        .captured
        .iter()
        .filter(|c| c.1 == Dir::AtoB)
        .map(|c| c.0)
        .collect();
    assert_eq!(sends.len(), 1);
    assert_eq!(p.a.counters().rcvd_rnr_err, 1);
    assert_eq!(p.b.counters().send_rnr_err, 1);
    let nak = p
        .captured
        .iter()
        .find(|c| c.1 == Dir::BtoA)
        .unwrap()
        .clone();
    assert_eq!(nak.2[54], 0x20 | 14);
    p.drive_for(Duration::from_micros(400));
    let sends: Vec<_> = p
        .captured
        .iter()
        .filter(|c| c.1 == Dir::AtoB)
        .map(|c| c.0)
        .collect();
    assert_eq!(sends.len(), 2);
    assert_eq!(sends[1] - nak.0 - p.latency, Duration::from_micros(1280));
    // Post the receive: the next retry succeeds.
    p.b.post_recv(
        b.qpn,
        &[RecvWr {
            wr_id: 1,
            sg_list: &[sge(&mb, 0, 10)],
        }],
    )
    .unwrap();
    p.drive();
    assert_eq!(poll_all(&mut p.a, a.cq)[0].status, WcStatus::Success);
    assert_eq!(poll_all(&mut p.b, b.cq).len(), 1);
}

#[test]
fn rnr_retry_exhaustion() {
    let o = ConnOpts {
        min_rnr_timer: 1,
        rnr_retry: 2,
        ..ConnOpts::default()
    };
    let (mut p, a, _b, ma, _mb) = setup(&o);
    let s = [sge(&ma, 0, 10)];
    p.a.post_send(a.qpn, &[SendWr::new(1, SendOp::Send, &s)])
        .unwrap();
    p.drive();
    let wa = poll_all(&mut p.a, a.cq);
    assert_eq!(
        wa.iter().map(|w| w.status).collect::<Vec<_>>(),
        vec![WcStatus::RnrRetryExcErr]
    );
    assert_eq!(p.a.counters().rcvd_rnr_err, 3);
    assert_eq!(p.a.counters().retry_rnr_exceeded_err, 1);
}

#[test]
fn s19_rnr_storm_is_paced() {
    let o = ConnOpts {
        min_rnr_timer: 1,
        rnr_retry: 7,
        ..ConnOpts::default()
    };
    let (mut p, a, _b, ma, _mb) = setup(&o);
    p.latency = Duration::from_nanos(100);
    let s = [sge(&ma, 0, 10)];
    p.a.post_send(a.qpn, &[SendWr::new(1, SendOp::Send, &s)])
        .unwrap();
    p.drive_for(Duration::from_secs(1));
    let naks = p.a.counters().rcvd_rnr_err;
    // ≤ 100 000 retries per second at 10 µs, and infinite retries never give up.
    assert!(naks <= 100_000 && naks > 90_000, "{naks}");
    assert_eq!(naks, p.b.counters().send_rnr_err);
    assert_eq!(p.a.qp_info(a.qpn).unwrap().state, QpState::Rts);
}

#[test]
fn lost_read_response_retries_remainder() {
    let (mut p, a, _b, ma, mb) = setup(&ConnOpts::default());
    // Drop the 3rd READ response packet (index 2 in B→A).
    p.filter = drop_nth(Dir::BtoA, 2);
    p.b.mr_write(
        mb.lkey,
        0,
        &(0..5000u32).map(|i| (i * 3) as u8).collect::<Vec<u8>>(),
    )
    .unwrap();
    let s = [sge(&ma, 1000, 5000)];
    p.a.post_send(
        a.qpn,
        &[SendWr::new(
            1,
            SendOp::RdmaRead {
                remote_addr: mb.addr,
                rkey: mb.rkey,
            },
            &s,
        )],
    )
    .unwrap();
    p.drive();
    let wa = poll_all(&mut p.a, a.cq);
    assert_eq!((wa[0].status, wa[0].byte_len), (WcStatus::Success, 5000));
    assert_eq!(
        &p.a.mr_bytes(ma.lkey).unwrap()[1000..6000],
        &p.b.mr_bytes(mb.lkey).unwrap()[..5000]
    );
    // The re-request starts at PSN 102 with VA advanced by 2048 and length 2952.
    let reqs: Vec<_> = p
        .captured
        .iter()
        .filter(|c| c.1 == Dir::AtoB)
        .map(|c| c.2.clone())
        .collect();
    assert_eq!(reqs.len(), 2);
    let r = &reqs[1];
    assert_eq!(bth_of(r).1, 102);
    let va = u64::from_be_bytes(r[54..62].try_into().unwrap());
    let len = u32::from_be_bytes(r[66..70].try_into().unwrap());
    assert_eq!((va - mb.addr, len), (2048, 2952));
}

#[test]
fn lost_read_request_is_recovered_by_implied_nak_or_timeout() {
    let o = ConnOpts {
        timeout: 8,
        ..ConnOpts::default()
    };
    let (mut p, a, b, ma, mb) = setup(&o);
    // A READ followed by a SEND: drop the READ request; the ACK for the SEND implies the READ was lost.
    p.filter = drop_nth(Dir::AtoB, 0);
    p.b.post_recv(
        b.qpn,
        &[RecvWr {
            wr_id: 1,
            sg_list: &[sge(&mb, 0, 100)],
        }],
    )
    .unwrap();
    let s = [sge(&ma, 0, 64)];
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
            SendWr::new(2, SendOp::Send, &s),
        ],
    )
    .unwrap();
    p.drive();
    let wa = poll_all(&mut p.a, a.cq);
    assert_eq!(
        wa.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        vec![(1, WcStatus::Success), (2, WcStatus::Success)]
    );
    assert_eq!(poll_all(&mut p.b, b.cq).len(), 1);
}

#[test]
fn duplicate_read_and_atomic_are_replayed_not_reexecuted() {
    let o = ConnOpts {
        timeout: 8,
        ..ConnOpts::default()
    };
    let (mut p, a, _b, ma, mb) = setup(&o);
    // Drop the first ATOMIC ACK: the requester retransmits, the responder must answer from its saved result.
    p.filter = drop_nth(Dir::BtoA, 0);
    let s = [sge(&ma, 0, 8)];
    p.a.post_send(
        a.qpn,
        &[SendWr::new(
            1,
            SendOp::AtomicFetchAndAdd {
                remote_addr: mb.addr,
                rkey: mb.rkey,
                add: 1,
            },
            &s,
        )],
    )
    .unwrap();
    p.drive();
    assert_eq!(poll_all(&mut p.a, a.cq)[0].status, WcStatus::Success);
    let mut v = [0u8; 8];
    p.b.mr_read(mb.lkey, 0, &mut v).unwrap();
    assert_eq!(u64::from_le_bytes(v), 1, "executed once");
    assert_eq!(p.b.counters().duplicate_request, 1);
    // Same for a READ whose single response is lost.
    p.filter = drop_nth(Dir::BtoA, 0);
    let s = [sge(&ma, 100, 300)];
    p.a.post_send(
        a.qpn,
        &[SendWr::new(
            2,
            SendOp::RdmaRead {
                remote_addr: mb.addr,
                rkey: mb.rkey,
            },
            &s,
        )],
    )
    .unwrap();
    p.drive();
    assert_eq!(poll_all(&mut p.a, a.cq)[0].status, WcStatus::Success);
    assert_eq!(p.b.counters().duplicate_request, 2);
}

#[test]
fn local_protection_error_and_flush_order() {
    let (mut p, a, b, ma, mb) = setup(&ConnOpts::default());
    p.b.post_recv(
        b.qpn,
        &[RecvWr {
            wr_id: 1,
            sg_list: &[sge(&mb, 0, 100)],
        }],
    )
    .unwrap();
    let good = [sge(&ma, 0, 10)];
    let bad = [Sge {
        addr: ma.addr + (1 << 16) - 4,
        length: 10,
        lkey: ma.lkey,
    }];
    p.a.post_send(
        a.qpn,
        &[
            SendWr::new(1, SendOp::Send, &good),
            SendWr::new(2, SendOp::Send, &bad).flags(SendFlags::EMPTY),
            SendWr::new(3, SendOp::Send, &good),
        ],
    )
    .unwrap();
    p.drive();
    let wa = poll_all(&mut p.a, a.cq);
    assert_eq!(
        wa.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        vec![
            (1, WcStatus::Success),
            (2, WcStatus::LocProtErr),
            (3, WcStatus::WrFlushErr)
        ]
    );
    assert_eq!(p.a.counters().send_err, 1);
}

#[test]
fn remote_access_and_invalid_request_naks() {
    let (mut p, a, b, ma, mb) = setup(&ConnOpts::default());
    let s = [sge(&ma, 0, 16)];
    // Out of bounds WRITE → NAK remote access error (0x62) → REM_ACCESS_ERR, both QPs to ERR.
    p.a.post_send(
        a.qpn,
        &[SendWr::new(
            1,
            SendOp::RdmaWrite {
                remote_addr: mb.addr + (1 << 16) - 8,
                rkey: mb.rkey,
            },
            &s,
        )],
    )
    .unwrap();
    p.drive();
    assert_eq!(poll_all(&mut p.a, a.cq)[0].status, WcStatus::RemAccessErr);
    assert_eq!(p.b.qp_info(b.qpn).unwrap().state, QpState::Err);
    assert_eq!(
        p.b.mr_bytes(mb.lkey).unwrap()[(1 << 16) - 8..],
        [0u8; 8],
        "nothing written outside the MR"
    );
    assert_eq!(p.a.counters().req_remote_access_errors, 1);
    assert_eq!(p.b.counters().resp_remote_access_errors, 1);
    // Misaligned atomic → NAK invalid request → REM_INV_REQ_ERR.
    let (mut p, a, _b, ma, mb) = setup(&ConnOpts::default());
    let s = [sge(&ma, 0, 8)];
    p.a.post_send(
        a.qpn,
        &[SendWr::new(
            1,
            SendOp::AtomicFetchAndAdd {
                remote_addr: mb.addr + 4,
                rkey: mb.rkey,
                add: 1,
            },
            &s,
        )],
    )
    .unwrap();
    p.drive();
    assert_eq!(poll_all(&mut p.a, a.cq)[0].status, WcStatus::RemInvReqErr);
    // Receive buffer too small → responder LOC_LEN_ERR, requester REM_INV_REQ_ERR.
    let (mut p, a, b, ma, mb) = setup(&ConnOpts::default());
    p.b.post_recv(
        b.qpn,
        &[
            RecvWr {
                wr_id: 7,
                sg_list: &[sge(&mb, 0, 10)],
            },
            RecvWr {
                wr_id: 8,
                sg_list: &[],
            },
        ],
    )
    .unwrap();
    let s = [sge(&ma, 0, 11)];
    p.a.post_send(a.qpn, &[SendWr::new(1, SendOp::Send, &s)])
        .unwrap();
    p.drive();
    assert_eq!(poll_all(&mut p.a, a.cq)[0].status, WcStatus::RemInvReqErr);
    let wb = poll_all(&mut p.b, b.cq);
    assert_eq!(
        wb.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        vec![(7, WcStatus::LocLenErr), (8, WcStatus::WrFlushErr)]
    );
    assert_eq!(p.a.counters().req_remote_invalid_request, 1);
    assert_eq!(p.b.counters().resp_local_length_error, 1);
}

#[test]
fn s01_window_limits_outstanding_psns_across_wrap() {
    let o = ConnOpts {
        a_psn: Psn::new(0xFF_FFF0),
        mtu: Mtu::Mtu256,
        timeout: 0,
        ..ConnOpts::default()
    };
    let (mut p, a, _b, ma, _mb) = setup(&o);
    p.filter = Box::new(|d, _| d != Dir::AtoB);
    let s = [sge(&ma, 0, 256 * 100)];
    let wrs = [
        SendWr::new(1, SendOp::Send, &s),
        SendWr::new(2, SendOp::Send, &s),
    ];
    p.a.post_send(a.qpn, &wrs).unwrap();
    p.drive_for(Duration::from_millis(10));
    let psns: Vec<u32> = p
        .captured
        .iter()
        .filter(|c| c.1 == Dir::AtoB)
        .map(|c| bth_of(&c.2).1)
        .collect();
    assert_eq!(psns.len(), 128);
    assert_eq!(*psns.last().unwrap(), 0x00_006F);
    // AckReq every 64 packets and on the last packet of a message.
    let acks: Vec<usize> = p
        .captured
        .iter()
        .filter(|c| c.1 == Dir::AtoB)
        .enumerate()
        .filter(|(_, c)| bth_of(&c.2).2)
        .map(|(i, _)| i)
        .collect();
    assert_eq!(acks, vec![63, 99]);
}

#[test]
fn s05_refused_transmit_consumes_nothing() {
    let (mut p, a, b, ma, mb) = setup(&ConnOpts::default());
    p.b.post_recv(
        b.qpn,
        &[RecvWr {
            wr_id: 1,
            sg_list: &[sge(&mb, 0, 8192)],
        }],
    )
    .unwrap();
    let s = [
        sge(&ma, 0, 1500),
        sge(&ma, 2000, 1500),
        sge(&ma, 4000, 1500),
    ];
    p.a.post_send(a.qpn, &[SendWr::new(1, SendOp::Send, &s)])
        .unwrap();
    let mut buf = vec![0u8; 9000];
    let m1 = p.a.poll_transmit(p.now, &mut buf).unwrap();
    let first = buf[..m1.len].to_vec();
    let mut small = vec![0u8; 100];
    assert!(p.a.poll_transmit(p.now, &mut small).is_none());
    assert_eq!(p.a.counters().tx_refused, 1);
    let m2 = p.a.poll_transmit(p.now, &mut buf).unwrap();
    assert_eq!(
        bth_of(&buf[..m2.len]).1,
        101,
        "the refused packet keeps its PSN"
    );
    p.b.handle_frame(p.now, &first);
    p.b.handle_frame(p.now, &buf[..m2.len]);
    p.drive();
    let mut expect = Vec::new();
    for (o, l) in [(0, 1500), (2000, 1500), (4000, 1500)] {
        expect.extend_from_slice(&p.a.mr_bytes(ma.lkey).unwrap()[o..o + l]);
    }
    assert_eq!(&p.b.mr_bytes(mb.lkey).unwrap()[..4500], &expect[..]);
}

#[test]
fn s08_inline_is_captured_at_post_time() {
    let (mut p, a, b, ma, mb) = setup(&ConnOpts::default());
    p.b.post_recv(
        b.qpn,
        &[
            RecvWr {
                wr_id: 1,
                sg_list: &[sge(&mb, 0, 200)],
            },
            RecvWr {
                wr_id: 2,
                sg_list: &[sge(&mb, 200, 200)],
            },
        ],
    )
    .unwrap();
    let s = [sge(&ma, 0, 37), sge(&ma, 100, 64)];
    let before: Vec<u8> = [
        &p.a.mr_bytes(ma.lkey).unwrap()[0..37],
        &p.a.mr_bytes(ma.lkey).unwrap()[100..164],
    ]
    .concat();
    p.a.post_send(
        a.qpn,
        &[SendWr::new(1, SendOp::Send, &s).flags(SendFlags::INLINE)],
    )
    .unwrap();
    let mut app = vec![7u8; 50];
    let slices: [&[u8]; 1] = [&app];
    p.a.post_send(a.qpn, &[SendWr::new(2, SendOp::Send, &[]).inline(&slices)])
        .unwrap();
    app.fill(0);
    p.a.mr_write(ma.lkey, 0, &[0xEE; 200]).unwrap();
    p.drive();
    assert_eq!(&p.b.mr_bytes(mb.lkey).unwrap()[..101], &before[..]);
    assert_eq!(&p.b.mr_bytes(mb.lkey).unwrap()[200..250], &[7u8; 50][..]);
    // Inline larger than the granted max_inline_data is a post error.
    let big = vec![0u8; 257];
    let sl: [&[u8]; 1] = [&big];
    let e =
        p.a.post_send(a.qpn, &[SendWr::new(3, SendOp::Send, &[]).inline(&sl)])
            .unwrap_err();
    assert_eq!(
        e.kind,
        PostErrorKind::InlineTooLarge {
            given: 257,
            max: 256
        }
    );
}

#[test]
fn s20_icrc_and_malformed_frames_are_counted_drops() {
    let (mut p, a, b, ma, mb) = setup(&ConnOpts::default());
    p.b.post_recv(
        b.qpn,
        &[RecvWr {
            wr_id: 1,
            sg_list: &[sge(&mb, 0, 100)],
        }],
    )
    .unwrap();
    let s = [sge(&ma, 0, 20)];
    p.a.post_send(a.qpn, &[SendWr::new(1, SendOp::Send, &s)])
        .unwrap();
    let mut buf = vec![0u8; 9000];
    let m = p.a.poll_transmit(p.now, &mut buf).unwrap();
    let f = buf[..m.len].to_vec();
    let mut flipped = f.clone();
    flipped[60] ^= 0x10;
    p.b.handle_frame(p.now, &flipped);
    assert_eq!(p.b.counters().rx_icrc_encapsulated, 1);
    for n in 0..f.len() {
        p.b.handle_frame(p.now, &f[..n]);
    }
    p.b.handle_frame(p.now, &[0xff; 3]);
    assert!(p.b.counters().drop_malformed > 0);
    assert!(
        p.b.poll_transmit(p.now, &mut buf).is_none(),
        "no NAK for garbage"
    );
    // Variant fields changed in flight (TTL, DSCP/ECN, IP checksum, UDP checksum) still pass.
    let mut hop = f.clone();
    hop[22] = 7;
    hop[15] = 0x01;
    hop[24] ^= 0xff;
    hop[40] = 0x12;
    p.b.handle_frame(p.now, &hop);
    assert_eq!(poll_all(&mut p.b, b.cq).len(), 1);
    // Wrong peer: a frame from another source IP is dropped.
    let mut other = f.clone();
    other[29] = 99;
    p.b.handle_frame(p.now, &other);
    assert_eq!(
        p.b.counters().rx_icrc_encapsulated,
        2,
        "source IP is ICRC-covered"
    );
}

#[test]
fn s18_cnp_only_for_ce_and_paced() {
    let (mut p, a, b, ma, mb) = setup(&ConnOpts::default());
    for i in 0..30 {
        p.b.post_recv(
            b.qpn,
            &[RecvWr {
                wr_id: i,
                sg_list: &[sge(&mb, 0, 100)],
            }],
        )
        .unwrap();
    }
    let s = [sge(&ma, 0, 20)];
    let wrs: Vec<_> = (0..10).map(|i| SendWr::new(i, SendOp::Send, &s)).collect();
    p.a.post_send(a.qpn, &wrs).unwrap();
    p.drive();
    assert_eq!(
        p.b.counters().np_cnp_sent,
        0,
        "ECT(0) alone never triggers a CNP"
    );
    // Now mark CE on every data frame.
    p.filter = Box::new(|d, f| {
        if d == Dir::AtoB {
            f[15] |= 3;
        }
        true
    });
    p.a.post_send(a.qpn, &wrs).unwrap();
    p.drive();
    let c = p.b.counters();
    assert_eq!(c.np_ecn_marked_roce_packets, 10);
    // The first mark is answered at once, the nine others (inside that 50-µs window) by one CNP at its end
    // (`DCQCN.md` §2.2 N1/N2).
    assert_eq!(c.np_cnp_sent, 2, "10 CE packets within 50 µs → two CNPs");
    // No reaction point configured (`EngineConfig::dcqcn` = None): the CNP is counted as ignored.
    let ca = p.a.counters();
    assert_eq!((ca.rp_cnp_handled, ca.rp_cnp_ignored), (0, 2));
    let cnp = p
        .captured
        .iter()
        .find(|c| c.1 == Dir::BtoA && c.2[42] == 0x81)
        .unwrap();
    let f = &cnp.2;
    assert_eq!(f.len(), 74);
    assert_eq!(f[15] >> 2, 48, "DSCP 48");
    assert_eq!(
        &f[42..54],
        &[
            0x81,
            0,
            0xff,
            0xff,
            0x40,
            (a.qpn.value() >> 16) as u8,
            (a.qpn.value() >> 8) as u8,
            a.qpn.value() as u8,
            0,
            0,
            0,
            0
        ]
    );
    assert_eq!(&f[54..70], &[0u8; 16]);
    // After the interval another CE packet produces another CNP.
    p.advance(Duration::from_micros(60));
    p.a.post_send(a.qpn, &wrs[..1]).unwrap();
    p.drive();
    assert_eq!(p.b.counters().np_cnp_sent, 3);
}

#[test]
fn s13_udp_source_port_fixed_per_qp_and_distinct() {
    let mut p = Pair::new();
    let o = ConnOpts::default();
    let mut ports = Vec::new();
    for _ in 0..4 {
        let (a, _b) = connect(&mut p, &o);
        let sp = p.a.qp_info(a.qpn).unwrap().udp_sport;
        assert!(sp >= 0xC000);
        ports.push(sp);
    }
    ports.sort();
    ports.dedup();
    assert_eq!(ports.len(), 4);
}

#[test]
fn s06_responder_length_checks() {
    // Inject hand-made frames through A's emitter: build a SEND_FIRST with 1000 B on PMTU 1024 by posting a
    // 1000-byte SEND on a PMTU-512 requester while the responder runs PMTU 1024.
    let mut p = Pair::new();
    let oa = ConnOpts {
        mtu: Mtu::Mtu512,
        ..ConnOpts::default()
    };
    let ob = ConnOpts {
        mtu: Mtu::Mtu1024,
        ..ConnOpts::default()
    };
    let a = make_qp(&mut p.a, &oa);
    let b = make_qp(&mut p.b, &ob);
    bring_up(&mut p.a, a, b.qpn, MAC_B, IP_B, oa.a_psn, oa.b_psn, &oa);
    bring_up(&mut p.b, b, a.qpn, MAC_A, IP_A, ob.b_psn, ob.a_psn, &ob);
    let ma = mr(&mut p.a, a.pd, 4096, |i| i as u8);
    let mb = mr(&mut p.b, b.pd, 4096, |_| 0);
    p.b.post_recv(
        b.qpn,
        &[RecvWr {
            wr_id: 1,
            sg_list: &[sge(&mb, 0, 4096)],
        }],
    )
    .unwrap();
    let s = [sge(&ma, 0, 1000)];
    p.a.post_send(a.qpn, &[SendWr::new(1, SendOp::Send, &s)])
        .unwrap();
    p.drive();
    // FIRST carried 512 B ≠ PMTU 1024 → NAK invalid request.
    assert_eq!(poll_all(&mut p.a, a.cq)[0].status, WcStatus::RemInvReqErr);
    assert_eq!(p.b.counters().resp_nak_sent, 1);
    assert_eq!(
        p.captured
            .iter()
            .filter(|c| c.1 == Dir::BtoA)
            .map(|c| c.2[54])
            .collect::<Vec<_>>(),
        vec![0x61]
    );
}

/// Sets up a connection, returns one real A→B SEND_ONLY frame (PSN 100, not delivered) to use as a template.
fn injected_setup() -> (Pair, End, End, MrInfo, MrInfo, Vec<u8>) {
    let (mut p, a, b, ma, mb) = setup(&ConnOpts::default());
    p.a.post_send(a.qpn, &[SendWr::new(1, SendOp::Send, &[sge(&ma, 0, 4)])])
        .unwrap();
    let mut buf = vec![0u8; 9000];
    let m = p.a.poll_transmit(p.now, &mut buf).unwrap();
    buf.truncate(m.len);
    (p, a, b, ma, mb, buf)
}

fn naks_from(p: &mut Pair) -> Vec<(u8, u32)> {
    let mut buf = vec![0u8; 9000];
    let mut out = Vec::new();
    while let Some(m) = p.b.poll_transmit(p.now, &mut buf) {
        let f = &buf[..m.len];
        out.push((f[54], bth_of(f).1));
    }
    out
}

#[test]
fn s06_injected_length_violations_nak_invalid_request() {
    use roce_wire::{ExtRepr, RethRepr};
    let cases: Vec<(u8, ExtRepr, usize)> = vec![
        (0x00, ExtRepr::NONE, 1000), // SEND_FIRST 1000 B on PMTU 1024
        (0x04, ExtRepr::NONE, 1025), // SEND_ONLY 1025 B
        (
            0x0A,
            ExtRepr {
                reth: Some(RethRepr {
                    va: 0,
                    rkey: 0,
                    dma_len: (1 << 31) + 1,
                }),
                ..ExtRepr::NONE
            },
            0,
        ),
    ];
    for (opcode, ext, len) in cases {
        let (mut p, _a, b, _ma, mb, tmpl) = injected_setup();
        p.b.post_recv(
            b.qpn,
            &[RecvWr {
                wr_id: 1,
                sg_list: &[sge(&mb, 0, 4096)],
            }],
        )
        .unwrap();
        let mut ext = ext;
        if let Some(r) = ext.reth.as_mut() {
            r.va = mb.addr;
            r.rkey = mb.rkey.0;
        }
        let f = craft(&tmpl, opcode, 100, ext, &vec![0xAB; len]);
        p.b.handle_frame(p.now, &f);
        assert_eq!(
            naks_from(&mut p),
            vec![(0x61, 100)],
            "opcode {opcode:#x} len {len}"
        );
        assert_eq!(p.b.qp_info(b.qpn).unwrap().state, QpState::Err);
        assert!(
            p.b.mr_bytes(mb.lkey).unwrap().iter().all(|&x| x == 0),
            "nothing written"
        );
    }
    // SEND_LAST with 0 B after a valid FIRST.
    let (mut p, _a, b, _ma, mb, tmpl) = injected_setup();
    p.b.post_recv(
        b.qpn,
        &[RecvWr {
            wr_id: 1,
            sg_list: &[sge(&mb, 0, 4096)],
        }],
    )
    .unwrap();
    p.b.handle_frame(p.now, &craft(&tmpl, 0x00, 100, ExtRepr::NONE, &[1; 1024]));
    p.b.handle_frame(p.now, &craft(&tmpl, 0x02, 101, ExtRepr::NONE, &[]));
    // The QP goes to ERR at once; the ACK already owed for 100 (AckReq) still leaves first, then the NAK
    // (responses in PSN order, `responder_fatal`).
    assert_eq!(naks_from(&mut p), vec![(0x1f, 100), (0x61, 101)]);
}

#[test]
fn responder_filters_unknown_qp_pkey_peer_and_out_of_order() {
    let (mut p, _a, b, _ma, mb, tmpl) = injected_setup();
    p.b.post_recv(
        b.qpn,
        &[RecvWr {
            wr_id: 1,
            sg_list: &[sge(&mb, 0, 4096)],
        }],
    )
    .unwrap();
    // Unknown destination QP.
    let mut f = tmpl.clone();
    let mut r = roce_wire::RoceRepr::parse(&f).unwrap().repr;
    r.bth.dest_qp = Qpn::new(0x7777);
    r.emit(&mut f, |x| x.copy_from_slice(&tmpl[54..58]))
        .unwrap();
    p.b.handle_frame(p.now, &f);
    assert_eq!(p.b.counters().drop_unknown_qp, 1);
    // P_Key mismatch.
    let mut r = roce_wire::RoceRepr::parse(&tmpl).unwrap().repr;
    r.bth.pkey = 0x8001;
    r.emit(&mut f, |x| x.copy_from_slice(&tmpl[54..58]))
        .unwrap();
    p.b.handle_frame(p.now, &f);
    assert_eq!(p.b.counters().drop_pkey_mismatch, 1);
    // Wrong peer (source IP not the connected QP's).
    let mut r = roce_wire::RoceRepr::parse(&tmpl).unwrap().repr;
    if let roce_wire::IpRepr::Ipv4(ip) = &mut r.ip {
        ip.src_addr = core::net::Ipv4Addr::new(10, 9, 9, 9);
    }
    r.emit(&mut f, |x| x.copy_from_slice(&tmpl[54..58]))
        .unwrap();
    p.b.handle_frame(p.now, &f);
    assert_eq!(p.b.counters().drop_wrong_peer, 1);
    assert!(naks_from(&mut p).is_empty(), "silent drops");
    // Out of order twice → exactly one NAK (PSN sequence error, expected PSN 100).
    p.b.handle_frame(
        p.now,
        &craft(&tmpl, 0x04, 102, roce_wire::ExtRepr::NONE, &[1; 4]),
    );
    p.b.handle_frame(
        p.now,
        &craft(&tmpl, 0x04, 103, roce_wire::ExtRepr::NONE, &[1; 4]),
    );
    assert_eq!(naks_from(&mut p), vec![(0x60, 100)]);
    assert_eq!(p.b.counters().out_of_seq_request, 2);
    // A duplicate READ outside the saved range is silently dropped; a sub-range one is replayed.
    p.b.handle_frame(p.now, &tmpl);
    let read = |psn: u32, off: u64, len: u32| {
        let ext = roce_wire::ExtRepr {
            reth: Some(roce_wire::RethRepr {
                va: mb.addr + off,
                rkey: mb.rkey.0,
                dma_len: len,
            }),
            ..roce_wire::ExtRepr::NONE
        };
        craft(&tmpl, 0x0C, psn, ext, &[])
    };
    p.b.handle_frame(p.now, &read(101, 0, 3000));
    let first = naks_from(&mut p);
    assert_eq!(
        first.iter().map(|x| x.1).collect::<Vec<_>>(),
        vec![100, 101, 102, 103]
    );
    p.b.handle_frame(p.now, &read(102, 1024, 1976));
    assert_eq!(
        naks_from(&mut p).iter().map(|x| x.1).collect::<Vec<_>>(),
        vec![102, 103],
        "replay from 102"
    );
    p.b.handle_frame(p.now, &read(102, 1000, 2000));
    assert!(
        naks_from(&mut p).is_empty(),
        "not a sub-range of the saved request"
    );
}
