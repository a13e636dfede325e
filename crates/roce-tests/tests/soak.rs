//! Soak: 100,000 SEND messages between two RC QPs under 10 % random loss in both directions plus reordering,
//! duplication and corruption. Every message must arrive once, in order, byte-identical; every send must
//! complete successfully. Prints the virtual time and the wall time (`cargo test -p roce-tests --test soak --
//! --nocapture`).

use std::time::Duration;

use roce_proto::*;
use roce_tests::*;

const MESSAGES: u64 = 100_000;
const SLOTS: u64 = 512;
const SLOT_LEN: u64 = 4096;
const SRC_LEN: u64 = 1 << 20;
const WINDOW: u64 = 128;

/// Size of message `i`: 1 B .. 3000 B, so single- and multi-packet messages (PMTU 1024) mix.
fn size_of(i: u64) -> u32 {
    (1 + (i.wrapping_mul(2_654_435_761) >> 7) % 3000) as u32
}

fn src_off(i: u64) -> u64 {
    i.wrapping_mul(7919) % (SRC_LEN - 4096)
}

#[test]
fn soak_100k_messages_under_faults() {
    let faults = FaultConfig {
        loss: 0.10,
        reorder: 0.02,
        reorder_depth: 3,
        reorder_max_hold: Duration::from_micros(20),
        duplicate: 0.02,
        corrupt: 0.01,
        ..FaultConfig::default()
    };
    let cfg = PairConfig {
        capture: false,
        fault_seed: 2026,
        ..PairConfig::default()
    };
    let mut p = Pair::with_config(cfg);
    // A short ACK timeout (≈1 ms) keeps tail-loss recovery quick in virtual time.
    let cap = QpCap {
        max_recv_wr: SLOTS as u32,
        ..ConnOpts::default().cap
    };
    let o = ConnOpts {
        timeout: 8,
        retry_cnt: 7,
        cap,
        ..ConnOpts::default()
    };
    let (a, b) = connect(&mut p, &o);
    let src = reg(&mut p, a, SRC_LEN as usize, |i| {
        (i.wrapping_mul(31) ^ (i >> 9)) as u8
    });
    let dst = reg(&mut p, b, (SLOTS * SLOT_LEN) as usize, |_| 0);
    let src_bytes = p.e(0).mr_bytes(src.lkey).unwrap().to_vec();
    p.set_faults_all(faults);

    let wall = std::time::Instant::now();
    let t0 = p.now;
    let (mut posted, mut sent_done, mut recv_posted, mut received) = (0u64, 0u64, 0u64, 0u64);
    let mut data_errors = 0u64;
    let mut wcs = vec![Wc::default(); 256];
    while received < MESSAGES || sent_done < MESSAGES {
        // Keep the receive ring full: slot = message index mod SLOTS.
        while recv_posted < MESSAGES && recv_posted < received + SLOTS {
            let sg = [sge(&dst, (recv_posted % SLOTS) * SLOT_LEN, SLOT_LEN as u32)];
            p.e(1)
                .post_recv(
                    b.qpn,
                    &[RecvWr {
                        wr_id: recv_posted,
                        sg_list: &sg,
                    }],
                )
                .unwrap();
            recv_posted += 1;
        }
        // Keep up to WINDOW sends outstanding.
        while posted < MESSAGES && posted < sent_done + WINDOW {
            let sg = [sge(&src, src_off(posted), size_of(posted))];
            p.a()
                .post_send(a.qpn, &[SendWr::new(posted, SendOp::Send, &sg).signaled()])
                .unwrap();
            posted += 1;
        }
        let progressed = p.drive_until(Duration::from_secs(60), |p| {
            p.nodes[0].engine.cq_len(a.cq) >= 32 || p.nodes[1].engine.cq_len(b.cq) >= 32
        });
        let n = p.a().poll_cq(a.cq, &mut wcs);
        for w in &wcs[..n] {
            assert_eq!(
                (w.wr_id, w.status),
                (sent_done, WcStatus::Success),
                "send completions in order"
            );
            sent_done += 1;
        }
        let n = p.b().poll_cq(b.cq, &mut wcs);
        for w in wcs[..n].iter().copied() {
            assert_eq!(
                (w.wr_id, w.status),
                (received, WcStatus::Success),
                "receives in order"
            );
            let len = size_of(received);
            assert_eq!(w.byte_len, len);
            let off = ((received % SLOTS) * SLOT_LEN) as usize;
            let so = src_off(received) as usize;
            let got = &p.e(1).mr_bytes(dst.lkey).unwrap()[off..off + len as usize];
            if got != &src_bytes[so..so + len as usize] {
                data_errors += 1;
            }
            received += 1;
        }
        if !progressed
            && n == 0
            && p.next_event().is_none()
            && (received < MESSAGES || sent_done < MESSAGES)
        {
            // Idle with work outstanding is only possible if everything was delivered up to the window.
            assert!(
                posted > sent_done || recv_posted > received,
                "stalled at {received} received / {sent_done} sent"
            );
        }
    }
    let virt = p.now - t0;
    let ca = p.counters(0);
    let cb = p.counters(1);
    let fa = p.faults(0).tx_stats();
    let fb = p.faults(1).tx_stats();
    println!(
        "soak: {MESSAGES} messages, {data_errors} data errors; virtual time {virt:?}; wall time {:?}; \
         a: sent {} pkts ({} retransmitted, {} timeouts, {} seq NAKs); b: {} duplicates, {} out-of-seq, {} ICRC drops; \
         faults a→b {fa:?}; b→a {fb:?}",
        wall.elapsed(),
        ca.sent_pkts,
        ca.retransmitted_pkts,
        ca.local_ack_timeout_err,
        ca.rcvd_seq_err,
        cb.duplicate_request,
        cb.out_of_seq_request,
        cb.rx_icrc_encapsulated,
    );
    assert_eq!(data_errors, 0);
    assert_eq!((sent_done, received), (MESSAGES, MESSAGES));
    assert_eq!(ca.retry_exceeded_err, 0);
    assert_eq!(cb.rdma_recvs, MESSAGES);
    assert!(
        fa.dropped > 0 && fa.corrupted > 0 && fa.duplicated > 0 && fa.reordered > 0,
        "faults were injected: {fa:?}"
    );
    assert!(cb.rx_icrc_encapsulated > 0 && ca.retransmitted_pkts > 0);
}
