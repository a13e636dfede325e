//! Contention: no completion is lost or doubled when several application threads share a QP and a CQ while
//! progress moves between them (`STYLE-progress-memory.md` §3–4). Two threads post to **one** RC QP, a third polls
//! its **one** CQ, over the simulated segment with loss (so retransmission timers and NAKs run in whichever thread
//! drives a pass). Every signaled WR must complete exactly once, successfully, within a bound; in both progress
//! modes. A lost completion (or a lost post) shows up as a timeout with the missing `wr_id`s named.
//!
//! Like any verbs program, the posters keep no more WRs outstanding than the CQ holds (`CQ_DEPTH`, counted from
//! post to poll): send queue slots free up when a WR *completes*, not when its completion is polled, so without that
//! bound a starved poller lets completions overrun the CQ (`cq_overflow`; IBTA §11.4.2.1 — the program's error).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use roce_link::{FaultConfig, Faulty, SimConfig};
use roce_verbs::*;

/// WRs per posting thread.
const PER_THREAD: u64 = 3000;
/// Give up (and fail) after this long.
const LIMIT: Duration = Duration::from_secs(60);
/// Bytes of the MRs.
const LEN: usize = 64 * 1024;
/// CQ depth, and the bound on WRs posted and not yet polled.
const CQ_DEPTH: u64 = 256;

fn stress(mode: ProgressMode) {
    let loss = FaultConfig {
        loss: 0.01,
        ..FaultConfig::default()
    };
    let mut seed = 0u64;
    let (ca, cb) = Context::sim_pair_with(
        RuntimeConfig::with_mode(mode),
        SimConfig::default(),
        move |l| {
            seed += 1;
            Ok(Box::new(Faulty::new(l, loss, FaultConfig::default(), seed)) as SendLink)
        },
    )
    .expect("pair");
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    let (pda, pdb) = (ca.alloc_pd().expect("pd"), cb.alloc_pd().expect("pd"));
    let cqa = ca
        .create_cq(CQ_DEPTH as u32, None, Moderation::default())
        .expect("cq");
    let cqb = cb.create_cq(16, None, Moderation::default()).expect("cq");
    let cap = QpCap {
        max_send_wr: 128,
        max_recv_wr: 1,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 64,
    };
    let qa = pda
        .create_qp(QpType::Rc, &cqa, &cqa, cap, false)
        .expect("qp");
    let qb = pdb
        .create_qp(QpType::Rc, &cqb, &cqb, cap, false)
        .expect("qp");
    let bufa = MrBuf::from_slice(&(0..LEN).map(|i| i as u8).collect::<Vec<_>>()).expect("buf");
    let bufb = MrBuf::from_slice(&(0..LEN).map(|i| !(i as u8)).collect::<Vec<_>>()).expect("buf");
    let mra = pda.reg_mr(&bufa, access).expect("mr");
    let mrb = pdb.reg_mr(&bufb, access).expect("mr");
    // A short ACK timeout (≈17 ms) so tail losses cost little time; infinite RNR retries are not needed (no SENDs).
    // Not shorter: a go-back-N retransmission of a full window (128 WRs of up to 3 packets) in a debug build on a
    // loaded 2-core machine takes longer than 1 ms, so with timeout 8 (≈1 ms) seven timeouts could pass without
    // the responder seeing the window once and the QP ended in RETRY_EXC_ERR (measured: 1 in 6000 WRs, with 65
    // timeouts, in 4 of 6 debug runs at load 8).
    let o = ConnectOpts {
        timeout: 12,
        ..ConnectOpts::default()
    };
    let (pa, pb) = (Psn::new(0xff_ff00), Psn::new(77));
    qa.connect(&qb.endpoint(pb), pa, &o).expect("connect a");
    qb.connect(&qa.endpoint(pa), pb, &o).expect("connect b");

    let seen: Arc<Mutex<HashMap<u64, WcStatus>>> = Arc::default();
    let dup = Arc::new(AtomicU64::new(0));
    // WRs posted and not yet polled (see the module docs).
    let outstanding = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let t0 = Instant::now();
    let total = 2 * PER_THREAD;
    let poller = {
        let (cq, seen, dup, done) = (cqa.clone(), seen.clone(), dup.clone(), done.clone());
        let outstanding = outstanding.clone();
        std::thread::spawn(move || {
            let mut wcs = [Wc::default(); 32];
            let mut got = 0u64;
            while got < total && t0.elapsed() < LIMIT {
                let n = cq.poll(&mut wcs);
                let mut s = seen.lock().expect("seen");
                for wc in &wcs[..n] {
                    if s.insert(wc.wr_id, wc.status).is_some() {
                        dup.fetch_add(1, Ordering::Relaxed);
                    }
                    got += 1;
                }
                drop(s);
                outstanding.fetch_sub(n as u64, Ordering::AcqRel);
                if n == 0 {
                    std::thread::yield_now();
                }
            }
            done.store(true, Ordering::Release);
        })
    };
    let posters: Vec<_> = (0..2u64)
        .map(|t| {
            let (qp, done, outstanding) = (qa.clone(), done.clone(), outstanding.clone());
            let (mra, mrb) = (mra.clone(), mrb.clone());
            std::thread::spawn(move || {
                let mut i = 0u64;
                while i < PER_THREAD && !done.load(Ordering::Acquire) {
                    if outstanding.fetch_add(1, Ordering::AcqRel) >= CQ_DEPTH {
                        outstanding.fetch_sub(1, Ordering::AcqRel);
                        std::thread::yield_now();
                        continue;
                    }
                    let id = (t << 32) | i;
                    // WRITEs and READs of 1..=3000 bytes (up to 3 packets at PMTU 1024) at varying offsets; a READ
                    // lands in this thread's half of A's buffer, which no WRITE reads.
                    let len = 1 + (i * 977 % 3000) as u32;
                    let off = (i * 4093) % (LEN as u64 / 2 - 3000);
                    let (sge, op) = if i % 4 == 3 {
                        (
                            [mra.sge(LEN as u64 / 2 + t * 4096, len.min(4096))],
                            SendOp::RdmaRead {
                                remote_addr: mrb.addr() + off,
                                rkey: mrb.rkey(),
                            },
                        )
                    } else {
                        (
                            [mra.sge(off, len)],
                            SendOp::RdmaWrite {
                                remote_addr: mrb.addr() + LEN as u64 / 2 + off,
                                rkey: mrb.rkey(),
                            },
                        )
                    };
                    match qp.post_send(&[SendWr::new(id, op, &sge).signaled()]) {
                        Ok(()) => i += 1,
                        Err(PostError::QueueFull { .. }) => {
                            outstanding.fetch_sub(1, Ordering::AcqRel);
                            std::thread::yield_now();
                        }
                        Err(e) => panic!("post_send: {e}"),
                    }
                }
                i
            })
        })
        .collect();
    let posted: Vec<u64> = posters
        .into_iter()
        .map(|h| h.join().expect("poster"))
        .collect();
    poller.join().expect("poller");
    let seen = seen.lock().expect("seen");
    let missing: Vec<u64> = (0..2u64)
        .flat_map(|t| (0..PER_THREAD).map(move |i| (t << 32) | i))
        .filter(|id| !seen.contains_key(id))
        .take(10)
        .collect();
    assert_eq!(posted, vec![PER_THREAD; 2], "{mode:?}: posts stopped early");
    assert!(
        missing.is_empty(),
        "{mode:?}: {} of {total} completions after {:?}; first missing wr_ids {missing:x?}; stats {:?}; QP {:?}; \
         counters {:?}; cq_overflow {:?}",
        seen.len(),
        t0.elapsed(),
        ca.runtime_stats(),
        qa.query().map(|a| a.qp_state),
        ca.qp_dump(qa.qpn()),
        ca.counters().map(|c| c.cq_overflow),
    );
    assert_eq!(ca.counters().expect("counters").cq_overflow, 0);
    assert_eq!(
        dup.load(Ordering::Relaxed),
        0,
        "{mode:?}: duplicate completions"
    );
    assert_eq!(seen.len() as u64, total, "{mode:?}: unexpected wr_ids");
    let bad: Vec<_> = seen
        .iter()
        .filter(|(_, s)| **s != WcStatus::Success)
        .take(5)
        .collect();
    assert!(bad.is_empty(), "{mode:?}: failed completions {bad:x?}");
    let st = ca.runtime_stats();
    let (caller, thread, missed) = (
        st.caller_passes.load(Ordering::Relaxed),
        st.thread_passes.load(Ordering::Relaxed),
        st.missed.load(Ordering::Relaxed),
    );
    eprintln!(
        "{mode:?}: {total} WRs in {:?}; passes: caller {caller}, thread {thread}; missed {missed}; rx {} tx {}",
        t0.elapsed(),
        st.rx_frames.load(Ordering::Relaxed),
        st.tx_frames.load(Ordering::Relaxed),
    );
    if mode == ProgressMode::Caller {
        assert!(caller > 0, "the application threads drove progress");
    } else {
        assert!(thread > 0, "the progress thread drove progress");
    }
    // READ targets were A's second half only: the first half (WRITE sources) is untouched.
    drop((qa, qb, mra, mrb, bufb));
    assert!(
        bufa.to_vec()[..LEN / 2]
            .iter()
            .enumerate()
            .all(|(i, &x)| x == i as u8)
    );
}

#[test]
fn two_posters_one_poller_one_qp_caller_mode() {
    stress(ProgressMode::Caller);
}

#[test]
fn two_posters_one_poller_one_qp_thread_mode() {
    stress(ProgressMode::Thread);
}
