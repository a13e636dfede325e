//! Scale (issue #21): 16,384 QPs on one device, the engine memory an idle QP costs, and per-packet work that does
//! not grow with the number of QPs (`docs/ARCHITECTURE.md`: "no allocation, lock or scan over all QPs per packet").
//!
//! This binary installs a global allocator that keeps the number of live heap bytes, so a test can measure what
//! creating QPs costs. Tests that measure run one at a time (a lock), since the count is process-wide.

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Instant as StdInstant;

use roce_proto::*;

struct Live;

static LIVE: AtomicI64 = AtomicI64::new(0);
static SERIAL: Mutex<()> = Mutex::new(());

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

const MAC_A: [u8; 6] = [2, 0, 0, 0, 0, 1];
const MAC_B: [u8; 6] = [2, 0, 0, 0, 0, 2];
const IP_A: [u8; 4] = [10, 0, 0, 1];
const IP_B: [u8; 4] = [10, 0, 0, 2];

fn cfg(mac: [u8; 6], ip: [u8; 4], seed: u64) -> EngineConfig {
    EngineConfig {
        mac,
        gids: vec![Gid::from_ipv4(ip)],
        seed,
        last_qpn: 0xFFFF,
        ..EngineConfig::default()
    }
}

const ACCESS: AccessFlags = AccessFlags::LOCAL_WRITE;

fn remote_access() -> AccessFlags {
    AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ
}

/// One send and one receive WR of one SGE, no inline data, no READ/atomic resources: the smallest queues a QP can
/// have.
const SMALL: QpCap = QpCap {
    max_send_wr: 1,
    max_recv_wr: 1,
    max_send_sge: 1,
    max_recv_sge: 1,
    max_inline_data: 0,
};

fn create(e: &mut Engine, pd: PdHandle, cq: CqHandle, cap: QpCap) -> Result<Qpn, CreateQpError> {
    e.create_qp(&QpInitAttr {
        qp_type: QpType::Rc,
        pd,
        send_cq: cq,
        recv_cq: cq,
        cap,
        sq_sig_all: true,
    })
    .map(|(q, _)| q)
}

/// RESET → INIT → RTR → RTS, connected to `peer` at `peer_ip`, with `rd_atomic` READ/atomic resources each way.
fn bring_up(
    e: &mut Engine,
    me: Qpn,
    peer: Qpn,
    peer_mac: [u8; 6],
    peer_ip: [u8; 4],
    rd_atomic: u8,
) {
    let mut at = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        qp_access_flags: remote_access(),
        ..QpAttr::default()
    };
    e.modify_qp(
        me,
        &at,
        QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::ACCESS_FLAGS,
    )
    .unwrap();
    at.qp_state = QpState::Rtr;
    at.ah_attr = AhAttr {
        dgid: Gid::from_ipv4(peer_ip),
        dmac: peer_mac,
        ..AhAttr::default()
    };
    at.path_mtu = Mtu::Mtu1024;
    at.dest_qp_num = peer;
    at.rq_psn = Psn::new(0);
    at.max_dest_rd_atomic = rd_atomic;
    at.min_rnr_timer = 1;
    e.modify_qp(
        me,
        &at,
        QpAttrMask::STATE
            | QpAttrMask::AV
            | QpAttrMask::PATH_MTU
            | QpAttrMask::DEST_QPN
            | QpAttrMask::RQ_PSN
            | QpAttrMask::MAX_DEST_RD_ATOMIC
            | QpAttrMask::MIN_RNR_TIMER,
    )
    .unwrap();
    at.qp_state = QpState::Rts;
    at.sq_psn = Psn::new(0);
    at.timeout = 14;
    at.retry_cnt = 7;
    at.rnr_retry = 7;
    at.max_rd_atomic = rd_atomic;
    e.modify_qp(
        me,
        &at,
        QpAttrMask::STATE
            | QpAttrMask::SQ_PSN
            | QpAttrMask::TIMEOUT
            | QpAttrMask::RETRY_CNT
            | QpAttrMask::RNR_RETRY
            | QpAttrMask::MAX_QP_RD_ATOMIC,
    )
    .unwrap();
}

/// QPs on one device (`DeviceAttr::max_qp`).
const N_QPS: u32 = 16_384;

/// 16,384 QPs on one device, all of them in RTS connected to a peer engine's QPs, and a 16,385th refused with
/// `Exhausted("max_qp")` (`DeviceAttr::max_qp`). Their QPNs are consecutive from the seeded offset and wrap inside
/// one 65,536-QPN slot of the shared-address scheme (`docs/MULTIPROCESS.md`). Then every one of them carries one
/// verified RDMA WRITE, 1,024 of them at once, and the engine's memory per idle QP (live heap bytes beyond its
/// queues) is measured and printed.
#[test]
fn sixteen_thousand_qps_on_one_device() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut a = Engine::new(cfg(MAC_A, IP_A, 1));
    let mut b = Engine::new(cfg(MAC_B, IP_B, 2));
    assert_eq!(a.query_device().max_qp, N_QPS);
    let pa = a.alloc_pd().unwrap();
    let pb = b.alloc_pd().unwrap();
    let ca = a.create_cq(4 * N_QPS).unwrap();
    let cb = b.create_cq(4 * N_QPS).unwrap();

    // Memory: a first batch warms the engine-wide tables (QP table, scheduler entries, timer heap) to their final
    // size class; the per-QP cost is measured on the rest, in RESET and again in RTS.
    let mut qa = Vec::new();
    for _ in 0..1024 {
        qa.push(create(&mut a, pa, ca, SMALL).unwrap());
    }
    let before = LIVE.load(Ordering::Relaxed);
    for _ in 1024..N_QPS {
        qa.push(create(&mut a, pa, ca, SMALL).unwrap());
    }
    let created = LIVE.load(Ordering::Relaxed) - before;
    let per_qp_reset = created as f64 / f64::from(N_QPS - 1024);
    assert!(matches!(
        create(&mut a, pa, ca, SMALL),
        Err(CreateQpError::Resource(ResourceError::Exhausted("max_qp")))
    ));
    // Slot 0 of a shared address (`roce_verbs::Context::open` sets the range from the link): the QPNs are
    // consecutive from the seeded offset, wrapping inside the slot, all distinct, each found by its number.
    let r = a.qpn_range();
    assert_eq!((r.first(), r.last()), (FIRST_QPN, 0xFFFF));
    let mut seen = vec![false; 0x1_0000];
    for (i, q) in qa.iter().enumerate() {
        assert_eq!(*q, r.nth(i as u32), "QPNs are consecutive from the offset");
        assert_eq!(r.index(q.value()), Some(i as u32));
        assert!((FIRST_QPN..=0xFFFF).contains(&q.value()), "inside the slot");
        assert!(
            !std::mem::replace(&mut seen[q.value() as usize], true),
            "{q:?} twice"
        );
    }

    let mut qb = Vec::new();
    for _ in 0..N_QPS {
        qb.push(create(&mut b, pb, cb, SMALL).unwrap());
    }
    for i in 0..1024 {
        bring_up(&mut a, qa[i], qb[i], MAC_B, IP_B, 0);
    }
    let before = LIVE.load(Ordering::Relaxed);
    for i in 1024..N_QPS as usize {
        bring_up(&mut a, qa[i], qb[i], MAC_B, IP_B, 0);
    }
    let rts = LIVE.load(Ordering::Relaxed) - before;
    for i in 0..N_QPS as usize {
        bring_up(&mut b, qb[i], qa[i], MAC_A, IP_A, 0);
    }
    // The queues of a SMALL QP: one send WQE with its SGE slot, one receive WQE with its SGE. Measured as the
    // difference to a QP with 2 of each (one more slot of everything), which is what one WQE pair costs.
    let q_small = qp_bytes(SMALL);
    let q_two = qp_bytes(QpCap {
        max_send_wr: 2,
        max_recv_wr: 2,
        ..SMALL
    });
    let queues = (q_two - q_small) as f64;
    let per_qp = per_qp_reset + rts as f64 / f64::from(N_QPS - 1024);
    let beyond = per_qp - queues;
    eprintln!(
        "engine memory per idle QP: {per_qp:.0} B in RTS ({per_qp_reset:.0} B at create_qp, \
         {:.0} B more for RTR/RTS); its 1-WR queues {queues:.0} B; beyond its queues {beyond:.0} B",
        per_qp - per_qp_reset
    );
    // Measured 1,917 B (2,093 B with the queues): the `Qp` record 1,408 B (424 B of it its counters, 280 B its
    // header images), its room in the scheduler (160 B), the timer heap (10 entries of 16 B) and the event queue
    // (3 of 28 B), 4 response-queue slots (96 B), the rate controller (24 B) and its QP table slot (8 B);
    // docs/TESTING.md has the breakdown. It was 2,524 B before the timer slots and heap entries were packed and the
    // tables' growth was capped at `max_qp` (14,812 B before responder resources were sized by
    // `max_dest_rd_atomic`). The aim, < 1 KiB, is not reached.
    assert!(
        beyond < 2048.0,
        "{beyond:.0} B per idle QP beyond its queues (measured 1,917 B; aim: < 1 KiB)"
    );

    // Traffic on every QP: one 64-byte WRITE each, in waves of 1,024 QPs active at once, every byte verified.
    let src = a.reg_mr(pa, vec![0u8; 64 * 1024], ACCESS).unwrap();
    let dst = b
        .reg_mr(pb, vec![0u8; 64 * N_QPS as usize], remote_access())
        .unwrap();
    let mut wire = Wire::default();
    for wave in 0..(N_QPS as usize / 1024) {
        for j in 0..1024 {
            let i = wave * 1024 + j;
            let bytes: Vec<u8> = (0..64).map(|k| (i * 31 + k) as u8).collect();
            a.mr_write(src.lkey, j * 64, &bytes).unwrap();
            let s = [Sge {
                addr: src.addr + (j * 64) as u64,
                length: 64,
                lkey: src.lkey,
            }];
            a.post_send(
                qa[i],
                &[SendWr::new(
                    i as u64,
                    SendOp::RdmaWrite {
                        remote_addr: dst.addr + (i * 64) as u64,
                        rkey: dst.rkey,
                    },
                    &s,
                )],
            )
            .unwrap();
        }
        wire.run(&mut a, &mut b);
        let mut wcs = vec![Wc::default(); 2048];
        let n = a.poll_cq(ca, &mut wcs);
        assert_eq!(n, 1024, "wave {wave}");
        for wc in &wcs[..n] {
            assert_eq!(wc.status, WcStatus::Success);
        }
    }
    let got = b.mr_bytes(dst.lkey).unwrap();
    for i in 0..N_QPS as usize {
        for k in 0..64 {
            assert_eq!(got[i * 64 + k], (i * 31 + k) as u8, "QP {i} byte {k}");
        }
    }
    assert_eq!(b.counters().rx_write_requests, u64::from(N_QPS));
}

/// Live heap bytes one more QP with `cap` costs on a fresh engine (after a warm-up QP).
fn qp_bytes(cap: QpCap) -> i64 {
    let mut e = Engine::new(cfg(MAC_A, IP_A, 3));
    let pd = e.alloc_pd().unwrap();
    let cq = e.create_cq(64).unwrap();
    for _ in 0..64 {
        create(&mut e, pd, cq, cap).unwrap();
    }
    let before = LIVE.load(Ordering::Relaxed);
    for _ in 0..64 {
        create(&mut e, pd, cq, cap).unwrap();
    }
    (LIVE.load(Ordering::Relaxed) - before) / 64
}

/// A wire between two engines with a fixed latency; frames in flight are kept in a FIFO.
#[derive(Default)]
struct Wire {
    now_ns: u64,
    q: VecDeque<(u64, bool, Vec<u8>)>,
    frames: u64,
}

impl Wire {
    fn now(&self) -> Instant {
        Instant::from_nanos(self.now_ns)
    }

    /// Runs until both engines are idle (no frame in flight, no timer due within 1 s), bounded by 10 s of virtual
    /// time.
    fn run(&mut self, a: &mut Engine, b: &mut Engine) {
        let end = self.now_ns + 10_000_000_000;
        let mut buf = vec![0u8; 9000];
        loop {
            let now = self.now();
            a.handle_timeout(now);
            b.handle_timeout(now);
            while let Some(m) = a.poll_transmit(now, &mut buf) {
                self.q
                    .push_back((self.now_ns + 1_000, true, buf[..m.len].to_vec()));
            }
            while let Some(m) = b.poll_transmit(now, &mut buf) {
                self.q
                    .push_back((self.now_ns + 1_000, false, buf[..m.len].to_vec()));
            }
            let mut delivered = false;
            while self.q.front().is_some_and(|f| f.0 <= self.now_ns) {
                let (_, to_b, f) = self.q.pop_front().unwrap();
                self.frames += 1;
                delivered = true;
                if to_b {
                    b.handle_frame(now, &f);
                } else {
                    a.handle_frame(now, &f);
                }
            }
            if delivered {
                continue;
            }
            let timer = [a.poll_timeout(), b.poll_timeout()]
                .into_iter()
                .flatten()
                .map(|t| t.as_nanos())
                .min();
            let next = match (self.q.front().map(|f| f.0), timer) {
                (Some(f), Some(t)) => f.min(t),
                (Some(f), None) => f,
                (None, Some(t)) if t <= self.now_ns + 1_000_000_000 => t,
                (None, _) => return,
            };
            self.now_ns = next.max(self.now_ns + 1);
            assert!(self.now_ns < end, "no progress in 10 s of virtual time");
        }
    }
}

/// Per-packet work does not grow with the number of QPs: the same traffic on 16 connected QPs costs the same CPU
/// time per frame on a device that has 16 QPs as on one that has 16,384 (the other 16,368 connected, in RTS, idle).
/// The engine finds QPs by QPN index, MRs by key index, the next sender from the scheduler's intrusive queues and
/// timers from a heap of armed timers only: a scan over all QPs per packet would make the second case about 1,000
/// times slower; the bound is 5x (noise on a shared machine: measured 0.5x to 1.6x). Best of 5 runs each.
#[test]
fn per_packet_work_does_not_grow_with_the_qp_count() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let small = best_ns_per_frame(16);
    let large = best_ns_per_frame(N_QPS);
    eprintln!(
        "per frame: {small:.0} ns with 16 QPs, {large:.0} ns with 16 active among {N_QPS} ({:.2}x)",
        large / small
    );
    assert!(
        large < 5.0 * small,
        "{large:.0} ns per frame with {N_QPS} QPs vs {small:.0} ns with 16"
    );
}

fn best_ns_per_frame(total: u32) -> f64 {
    let mut a = Engine::new(cfg(MAC_A, IP_A, 1));
    let mut b = Engine::new(cfg(MAC_B, IP_B, 2));
    let pa = a.alloc_pd().unwrap();
    let pb = b.alloc_pd().unwrap();
    let ca = a.create_cq(1 << 16).unwrap();
    let cb = b.create_cq(1 << 16).unwrap();
    let mut qs = Vec::new();
    for _ in 0..total {
        let x = create(&mut a, pa, ca, SMALL).unwrap();
        let y = create(&mut b, pb, cb, SMALL).unwrap();
        bring_up(&mut a, x, y, MAC_B, IP_B, 0);
        bring_up(&mut b, y, x, MAC_A, IP_A, 0);
        qs.push(x);
    }
    // The 16 active QPs are spread over the whole table.
    let step = (total / 16) as usize;
    let active: Vec<Qpn> = (0..16).map(|k| qs[k * step]).collect();
    let src = a.reg_mr(pa, vec![7u8; 4096], ACCESS).unwrap();
    let dst = b.reg_mr(pb, vec![0u8; 4096], remote_access()).unwrap();
    let mut wire = Wire::default();
    let mut wcs = vec![Wc::default(); 64];
    let mut best = f64::MAX;
    for _ in 0..5 {
        let f0 = wire.frames;
        let t0 = StdInstant::now();
        for _ in 0..50 {
            for (k, &q) in active.iter().enumerate() {
                let s = [Sge {
                    addr: src.addr,
                    length: 256,
                    lkey: src.lkey,
                }];
                a.post_send(
                    q,
                    &[SendWr::new(
                        k as u64,
                        SendOp::RdmaWrite {
                            remote_addr: dst.addr + (k * 256) as u64,
                            rkey: dst.rkey,
                        },
                        &s,
                    )],
                )
                .unwrap();
            }
            wire.run(&mut a, &mut b);
            let mut n = 0;
            loop {
                let k = a.poll_cq(ca, &mut wcs);
                if k == 0 {
                    break;
                }
                n += k;
            }
            assert_eq!(n, 16);
        }
        let dt = t0.elapsed();
        let frames = wire.frames - f0;
        best = best.min(dt.as_nanos() as f64 / frames as f64);
    }
    best
}
