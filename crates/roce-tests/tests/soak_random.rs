//! Bounded soak (issue #21): random traffic on many RC QPs over the faulty simulated link (loss, duplication,
//! reordering, corruption, CE marks) for a wall-clock time, with invariants checked continuously:
//!
//! * exactly-once completions: every signaled WR completes once, successfully, in posting order per QP; every
//!   receive once, in order;
//! * data equal to a model: each WR names a slot of its QP that no other WR in flight touches (slot = sequence
//!   number mod the window), so the model is exact: a completed WRITE's target bytes on B, a READ's bytes on A, a
//!   SEND's received bytes, each fetch-and-add's original value (the sum of the QP's earlier adds) — checked at every
//!   completion, and all of B's memory against the model at the end;
//! * counters consistent: per engine the port counter equals the sum over its QPs, and the executed-request counters
//!   stay between the completed and the posted counts;
//! * memory not growing: live heap bytes (a counting global allocator) after the first tenth of the run and at the
//!   end differ by less than 1 MiB.
//!
//! `SOAK_SECS` sets the duration (default 60 s in release, 10 s in a debug build); `SOAK_SEED` the seed. Prints a
//! summary (`--nocapture`).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, Instant as WallInstant};

use roce_proto::*;
use roce_tests::*;

struct Live;
static LIVE: AtomicI64 = AtomicI64::new(0);

// SAFETY: forwards every call to `System` unchanged; only counts sizes.
unsafe impl GlobalAlloc for Live {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        LIVE.fetch_add(l.size() as i64, Ordering::Relaxed);
        // SAFETY: the caller's contract is `System`'s.
        unsafe { System.alloc(l) }
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        LIVE.fetch_add(l.size() as i64, Ordering::Relaxed);
        // SAFETY: as `alloc`.
        unsafe { System.alloc_zeroed(l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        LIVE.fetch_add(new as i64 - l.size() as i64, Ordering::Relaxed);
        // SAFETY: as `alloc`.
        unsafe { System.realloc(p, l, new) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(l.size() as i64, Ordering::Relaxed);
        // SAFETY: as `alloc`.
        unsafe { System.dealloc(p, l) }
    }
}

#[global_allocator]
static GLOBAL: Live = Live;

const QPS: usize = 32;
/// WRs in flight per QP at most, and slots per QP.
const WINDOW: u64 = 8;
const SLOT: u64 = 4096;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Write,
    Read,
    Send,
    FetchAdd(u64),
}

/// One posted WR awaiting its completion.
#[derive(Clone, Copy, Debug)]
struct Posted {
    seq: u64,
    kind: Kind,
    len: u32,
}

struct Conn {
    a: End,
    b: End,
    /// A's slots: source of WRITEs and SENDs, destination of READs and fetch-and-add results.
    a_mr: MrInfo,
    /// B's slots: WRITE targets and READ sources; `b_recv`: SEND receive slots; `b_atomic`: the QP's counter.
    b_mr: MrInfo,
    b_recv: MrInfo,
    b_atomic: MrInfo,
    /// The model of B's slots.
    model: Vec<u8>,
    /// The model of the counter: the sum of the adds posted so far.
    counter: u64,
    inflight: std::collections::VecDeque<Posted>,
    /// SEND sequence numbers awaiting their receive at B, with the bytes sent.
    sends: std::collections::VecDeque<(u64, Vec<u8>)>,
    next_seq: u64,
    recv_posted: u64,
    recv_done: u64,
}

fn soak_secs() -> u64 {
    std::env::var("SOAK_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(if cfg!(debug_assertions) { 10 } else { 60 })
}

#[test]
fn random_traffic_on_many_qps_under_faults_keeps_every_invariant() {
    let secs = soak_secs();
    let seed = std::env::var("SOAK_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2026u64);
    let mut rng = Rng(seed | 1);
    let mut p = Pair::with_config(PairConfig {
        capture: false,
        fault_seed: seed,
        ..PairConfig::default()
    });
    let o = ConnOpts {
        timeout: 8,
        retry_cnt: 7,
        cq_depth: 4096,
        sq_sig_all: true,
        cap: QpCap {
            max_send_wr: WINDOW as u32,
            max_recv_wr: 2 * WINDOW as u32,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        },
        ..ConnOpts::default()
    };
    let mut conns = Vec::new();
    for _ in 0..QPS {
        let (a, b) = connect(&mut p, &o);
        let a_mr = reg(&mut p, a, (WINDOW * SLOT) as usize, |_| 0);
        let b_mr = reg(&mut p, b, (WINDOW * SLOT) as usize, |i| (i * 7) as u8);
        let b_recv = reg(&mut p, b, (2 * WINDOW * SLOT) as usize, |_| 0);
        let b_atomic = reg(&mut p, b, 8, |_| 0);
        let model = p.e(1).mr_bytes(b_mr.lkey).unwrap().to_vec();
        conns.push(Conn {
            a,
            b,
            a_mr,
            b_mr,
            b_recv,
            b_atomic,
            model,
            counter: 0,
            inflight: Default::default(),
            sends: Default::default(),
            next_seq: 0,
            recv_posted: 0,
            recv_done: 0,
        });
    }
    p.set_faults_all(FaultConfig {
        loss: 0.03,
        reorder: 0.02,
        reorder_depth: 3,
        reorder_max_hold: Duration::from_micros(20),
        duplicate: 0.02,
        corrupt: 0.005,
        ce_mark: 0.01,
        ..FaultConfig::default()
    });

    let wall = WallInstant::now();
    let deadline = wall + Duration::from_secs(secs);
    let mut mem_after_warmup = None;
    let (mut completed, mut received, mut posted_total) = (0u64, 0u64, 0u64);
    let mut posted_kind = [0u64; 4];
    let mut done_kind = [0u64; 4];
    let kind_ix = |k: Kind| match k {
        Kind::Write => 0,
        Kind::Read => 1,
        Kind::Send => 2,
        Kind::FetchAdd(_) => 3,
    };
    let mut rounds = 0u64;
    while WallInstant::now() < deadline {
        rounds += 1;
        // Post: a random QP gets a few random WRs, within its window.
        for _ in 0..4 {
            let c = &mut conns[rng.below(QPS as u64) as usize];
            // Keep B's receive queue full; a slot is posted again only after its receive was checked.
            while c.recv_posted < c.recv_done + 2 * WINDOW {
                let slot = c.recv_posted % (2 * WINDOW);
                let sg = [sge(&c.b_recv, slot * SLOT, SLOT as u32)];
                p.e(1)
                    .post_recv(
                        c.b.qpn,
                        &[RecvWr {
                            wr_id: c.recv_posted,
                            sg_list: &sg,
                        }],
                    )
                    .unwrap();
                c.recv_posted += 1;
            }
            while (c.inflight.len() as u64) < WINDOW && rng.below(3) != 0 {
                let seq = c.next_seq;
                let slot = seq % WINDOW;
                let kind = match rng.below(4) {
                    0 => Kind::Write,
                    1 => Kind::Read,
                    2 => Kind::Send,
                    _ => Kind::FetchAdd(rng.next() >> 40),
                };
                let len = match kind {
                    Kind::FetchAdd(_) => 8,
                    _ => 1 + rng.below(SLOT) as u32,
                };
                let off = slot * SLOT;
                let op = match kind {
                    Kind::Write | Kind::Send => {
                        let bytes: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
                        p.e(0).mr_write(c.a_mr.lkey, off as usize, &bytes).unwrap();
                        if kind == Kind::Write {
                            c.model[off as usize..off as usize + len as usize]
                                .copy_from_slice(&bytes);
                            SendOp::RdmaWrite {
                                remote_addr: c.b_mr.addr + off,
                                rkey: c.b_mr.rkey,
                            }
                        } else {
                            c.sends.push_back((seq, bytes));
                            SendOp::Send
                        }
                    }
                    Kind::Read => SendOp::RdmaRead {
                        remote_addr: c.b_mr.addr + off,
                        rkey: c.b_mr.rkey,
                    },
                    Kind::FetchAdd(add) => SendOp::AtomicFetchAndAdd {
                        remote_addr: c.b_atomic.addr,
                        rkey: c.b_atomic.rkey,
                        add,
                    },
                };
                let sg = [sge(&c.a_mr, off, len)];
                p.e(0)
                    .post_send(c.a.qpn, &[SendWr::new(seq, op, &sg)])
                    .unwrap();
                c.inflight.push_back(Posted { seq, kind, len });
                posted_kind[kind_ix(kind)] += 1;
                c.next_seq += 1;
                posted_total += 1;
            }
        }
        p.drive_until(Duration::from_millis(5), |p| {
            p.nodes[0].engine.poll_ready_cq().is_some()
        });
        // Check every completion against the model.
        for c in conns.iter_mut() {
            for wc in poll_all(p.e(0), c.a.cq) {
                let w = c.inflight.pop_front().unwrap_or_else(|| {
                    panic!("QP {:?}: completion {wc:?} with nothing in flight", c.a.qpn)
                });
                assert_eq!(
                    (wc.wr_id, wc.status),
                    (w.seq, WcStatus::Success),
                    "QP {:?}: completions once, in order, successful",
                    c.a.qpn
                );
                let off = ((w.seq % WINDOW) * SLOT) as usize;
                let len = w.len as usize;
                match w.kind {
                    Kind::Write => {
                        let got = p.e(1).mr_bytes(c.b_mr.lkey).unwrap();
                        assert_eq!(&got[off..off + len], &c.model[off..off + len], "WRITE data");
                    }
                    Kind::Read => {
                        assert_eq!(wc.byte_len, w.len);
                        let got = p.e(0).mr_bytes(c.a_mr.lkey).unwrap();
                        assert_eq!(&got[off..off + len], &c.model[off..off + len], "READ data");
                    }
                    Kind::FetchAdd(add) => {
                        let got = p.e(0).mr_bytes(c.a_mr.lkey).unwrap();
                        // The requester stores the original value little-endian (roce-proto `requester.rs`).
                        let orig = u64::from_le_bytes(got[off..off + 8].try_into().unwrap());
                        assert_eq!(orig, c.counter, "fetch-and-add original value");
                        c.counter = c.counter.wrapping_add(add);
                    }
                    Kind::Send => {}
                }
                done_kind[kind_ix(w.kind)] += 1;
                completed += 1;
            }
            for wc in poll_all(p.e(1), c.b.cq) {
                let (seq, bytes) = c.sends.pop_front().unwrap_or_else(|| {
                    panic!("QP {:?}: a receive {wc:?} with no SEND posted", c.b.qpn)
                });
                assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
                assert_eq!(wc.byte_len as usize, bytes.len(), "SEND {seq} length");
                let slot = wc.wr_id % (2 * WINDOW);
                let got = p.e(1).mr_bytes(c.b_recv.lkey).unwrap();
                let off = (slot * SLOT) as usize;
                assert_eq!(&got[off..off + bytes.len()], &bytes[..], "SEND {seq} data");
                assert_eq!(wc.wr_id, c.recv_done, "receives in order");
                received += 1;
                c.recv_done += 1;
            }
        }
        // Counters: port = sum over QPs; executed requests between completed and posted.
        if rounds.is_multiple_of(64) {
            for n in 0..2 {
                counters_add_up(&p.counters(n), p.e(n));
            }
            let cb = p.counters(1);
            assert!(cb.rx_write_requests >= done_kind[0] && cb.rx_write_requests <= posted_kind[0]);
            assert!(cb.rx_read_requests >= done_kind[1] && cb.rx_read_requests <= posted_kind[1]);
            assert!(
                cb.rx_atomic_requests >= done_kind[3] && cb.rx_atomic_requests <= posted_kind[3]
            );
            assert!(cb.rdma_recvs == received);
        }
        if mem_after_warmup.is_none() && wall.elapsed() > Duration::from_secs(secs) / 10 {
            mem_after_warmup = Some(LIVE.load(Ordering::Relaxed));
        }
    }
    // Drain, then check all of B's memory against the model.
    p.set_faults_all(FaultConfig::default());
    p.drive_until(Duration::from_secs(10), |_| false);
    for c in conns.iter_mut() {
        for wc in poll_all(p.e(0), c.a.cq) {
            let w = c.inflight.pop_front().expect("completion");
            assert_eq!((wc.wr_id, wc.status), (w.seq, WcStatus::Success));
            completed += 1;
        }
        received += poll_all(p.e(1), c.b.cq).len() as u64;
        assert!(
            c.inflight.is_empty(),
            "QP {:?}: WRs never completed",
            c.a.qpn
        );
        assert_eq!(p.e(1).mr_bytes(c.b_mr.lkey).unwrap(), c.model, "B's memory");
    }
    assert_eq!(completed, posted_total, "every WR completed exactly once");
    let mem_end = LIVE.load(Ordering::Relaxed);
    let growth = mem_end - mem_after_warmup.unwrap_or(mem_end);
    let ca = p.counters(0);
    let cb = p.counters(1);
    let fa = p.faults(0).tx_stats();
    println!(
        "soak_random: {secs} s wall, {QPS} QPs, {completed} WRs (write {}, read {}, send {}, fetch-add {}), {received} \
         receives, virtual time {:?}; a: {} pkts sent, {} retransmitted, {} timeouts, {} seq NAKs; b: {} duplicates, \
         {} ICRC drops; faults a->b {fa:?}; heap growth after warm-up {growth} B",
        posted_kind[0],
        posted_kind[1],
        posted_kind[2],
        posted_kind[3],
        p.now - Instant::ZERO,
        ca.sent_pkts,
        ca.retransmitted_pkts,
        ca.local_ack_timeout_err,
        ca.rcvd_seq_err,
        cb.duplicate_request,
        cb.rx_icrc_encapsulated,
    );
    assert!(
        growth.abs() < 1 << 20,
        "heap grew by {growth} B during the soak"
    );
    assert!(fa.dropped > 0 && fa.duplicated > 0 && fa.reordered > 0 && fa.corrupted > 0);
    assert!(completed > 1000, "too little traffic: {completed}");
}

/// Counters only the port counts (drops before a QP is known, port and CQ events; roce-proto `stats.rs`).
const PORT_LEVEL: &[&str] = &[
    "rx_icrc_encapsulated",
    "drop_malformed",
    "drop_wrong_dest_ip",
    "drop_pkey_mismatch",
    "drop_unknown_qp",
    "link_downed",
    "cq_overflow",
    "port_shaper_credit_lost_bytes",
];

/// The port counter set is the sum over the QPs (more for [`PORT_LEVEL`]).
fn counters_add_up(port: &Counters, e: &Engine) {
    for &name in Counters::NAMES {
        let total = port.get(name).unwrap_or(0);
        let sum: u64 = e
            .qpns()
            .map(|q| e.qp_counters(q).and_then(|c| c.get(name)).unwrap_or(0))
            .sum();
        if PORT_LEVEL.contains(&name) {
            assert!(total >= sum, "{name}: port {total} < sum over QPs {sum}");
        } else {
            assert_eq!(
                total, sum,
                "{name}: port counter is not the sum over its QPs"
            );
        }
    }
}
