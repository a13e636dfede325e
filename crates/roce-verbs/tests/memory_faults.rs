//! Issue #21, first defect: a program that unmaps or protects memory it registered, then has the engine touch it
//! (a peer's RDMA WRITE, READ or atomic; its own send, READ or receive), must not die with SIGSEGV. The engine
//! answers as an RNIC does on a translation fault (IBTA §9.7.5.1.3/§10.7.2.2; rxe `rxe_resp.c`/`rxe_req.c`/
//! `rxe_comp.c`): NAK remote access error for a peer's request, LOC_PROT_ERR for a local WR, and counts it in
//! `mr_access_faults`. Each test here died with SIGSEGV before the fault-tolerant copies (`roce_verbs::fault`).

use std::time::{Duration, Instant};

use roce_verbs::*;

const PAGE: usize = 4096;

/// An anonymous private mapping of `pages` pages, unmapped on drop unless already unmapped.
struct Map {
    ptr: *mut u8,
    len: usize,
    mapped: bool,
}

impl Map {
    fn new(pages: usize) -> Map {
        let len = pages * PAGE;
        // SAFETY: a fresh anonymous mapping; no existing memory is affected.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED, "mmap");
        Map {
            ptr: p.cast(),
            len,
            mapped: true,
        }
    }

    fn protect(&self, prot: libc::c_int) {
        // SAFETY: the range is this mapping, which nothing else in the process uses.
        assert_eq!(
            unsafe { libc::mprotect(self.ptr.cast(), self.len, prot) },
            0
        );
    }

    fn unmap(&mut self) {
        // SAFETY: as in `protect`; after this the range is never touched by the test itself.
        assert_eq!(unsafe { libc::munmap(self.ptr.cast(), self.len) }, 0);
        self.mapped = false;
    }
}

impl Drop for Map {
    fn drop(&mut self) {
        if self.mapped {
            // SAFETY: as in `protect`.
            unsafe { libc::munmap(self.ptr.cast(), self.len) };
        }
    }
}

struct End {
    ctx: Context,
    pd: Pd,
    cq: Cq,
    qp: Qp,
}

fn all_access() -> AccessFlags {
    AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC
}

fn pair() -> (End, End) {
    let (ca, cb) = Context::sim_pair(RuntimeConfig::with_mode(ProgressMode::Thread)).expect("pair");
    let mk = |ctx: &Context| {
        let pd = ctx.alloc_pd().expect("pd");
        let cq = ctx.create_cq(64, None, Moderation::default()).expect("cq");
        let cap = QpCap {
            max_send_wr: 16,
            max_recv_wr: 16,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 64,
        };
        let qp = pd.create_qp(QpType::Rc, &cq, &cq, cap, false).expect("qp");
        End {
            ctx: ctx.clone(),
            pd,
            cq,
            qp,
        }
    };
    let (a, b) = (mk(&ca), mk(&cb));
    let o = ConnectOpts::default();
    let (pa, pb) = (Psn::new(1), Psn::new(7000));
    a.qp.connect(&b.qp.endpoint(pb), pa, &o).expect("connect a");
    b.qp.connect(&a.qp.endpoint(pa), pb, &o).expect("connect b");
    (a, b)
}

/// A raw registration of `map` on `e`'s PD.
fn reg(e: &End, map: &Map) -> Mr {
    // SAFETY: the mapping stays allocated to this test (unmapped or protected at most, never reused by the test)
    // until the MR and the context are gone; the engine's copies survive it being unmapped or protected.
    unsafe { e.pd.reg_mr_raw(map.ptr, map.len, all_access()) }.expect("reg_mr_raw")
}

/// A heap-backed MR for the other side's buffers.
fn heap_mr(e: &End, len: usize) -> (MrBuf, Mr) {
    let buf = MrBuf::new(len).expect("buf");
    let mr = e.pd.reg_mr(&buf, all_access()).expect("mr");
    (buf, mr)
}

fn wait_one(cq: &Cq) -> Wc {
    let t0 = Instant::now();
    let mut wc = [Wc::default(); 1];
    loop {
        if cq.poll(&mut wc) == 1 {
            return wc[0];
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "no completion");
        std::thread::yield_now();
    }
}

fn faults(e: &End) -> u64 {
    let port = e.ctx.counters().expect("counters").mr_access_faults;
    let qp = e
        .ctx
        .qp_counters(e.qp.qpn())
        .expect("counters")
        .expect("qp")
        .mr_access_faults;
    assert_eq!(port, qp, "port and QP count the same faults");
    port
}

fn state(e: &End) -> QpState {
    e.qp.query().expect("query").qp_state
}

/// The scenario: B registers memory for remote WRITE, unmaps it, A writes to it. B survives, A's WRITE
/// completes REM_ACCESS_ERR (B answered NAK remote access error), both QPs end in ERR, B counts the fault.
#[test]
fn peer_write_into_unmapped_memory_is_a_remote_access_error() {
    for len in [64usize, 3 * PAGE] {
        let (a, b) = pair();
        let mut map = Map::new(4);
        let target = reg(&b, &map);
        let (src, smr) = heap_mr(&a, len);
        src.fill(0x77);
        map.unmap();
        let before = memory_faults();
        let sge = [smr.sge(0, len as u32)];
        let wr = SendWr::new(
            1,
            SendOp::RdmaWrite {
                remote_addr: target.addr(),
                rkey: target.rkey(),
            },
            &sge,
        )
        .signaled();
        a.qp.post_send(&[wr]).expect("post");
        let wc = wait_one(&a.cq);
        assert_eq!(
            (wc.wr_id, wc.status),
            (1, WcStatus::RemAccessErr),
            "len {len}"
        );
        assert_eq!(faults(&b), 1, "len {len}");
        assert_eq!(b.ctx.counters().expect("c").resp_remote_access_errors, 1);
        assert_eq!(state(&b), QpState::Err);
        if FAULT_TOLERANT {
            assert!(memory_faults() > before, "the handler took the fault");
        }
    }
}

/// A peer's READ of protected memory (PROT_NONE): READ completes REM_ACCESS_ERR at the requester.
#[test]
fn peer_read_of_protected_memory_is_a_remote_access_error() {
    let (a, b) = pair();
    let map = Map::new(2);
    let source = reg(&b, &map);
    let (_dst, dmr) = heap_mr(&a, 2 * PAGE);
    map.protect(libc::PROT_NONE);
    let sge = [dmr.sge(0, (2 * PAGE) as u32)];
    let wr = SendWr::new(
        2,
        SendOp::RdmaRead {
            remote_addr: source.addr(),
            rkey: source.rkey(),
        },
        &sge,
    )
    .signaled();
    a.qp.post_send(&[wr]).expect("post");
    let wc = wait_one(&a.cq);
    assert_eq!((wc.wr_id, wc.status), (2, WcStatus::RemAccessErr));
    assert_eq!(faults(&b), 1);
    assert_eq!(state(&b), QpState::Err);
}

/// A peer's atomic on read-only memory (PROT_READ): REM_ACCESS_ERR, nothing written.
#[test]
fn peer_atomic_on_read_only_memory_is_a_remote_access_error() {
    let (a, b) = pair();
    let map = Map::new(1);
    let target = reg(&b, &map);
    let (_dst, dmr) = heap_mr(&a, 8);
    map.protect(libc::PROT_READ);
    let sge = [dmr.sge(0, 8)];
    let wr = SendWr::new(
        3,
        SendOp::AtomicFetchAndAdd {
            remote_addr: target.addr(),
            rkey: target.rkey(),
            add: 1,
        },
        &sge,
    )
    .signaled();
    a.qp.post_send(&[wr]).expect("post");
    let wc = wait_one(&a.cq);
    assert_eq!((wc.wr_id, wc.status), (3, WcStatus::RemAccessErr));
    assert_eq!(faults(&b), 1);
    // SAFETY: the page is still mapped readable.
    assert_eq!(
        unsafe { std::ptr::read(map.ptr.cast::<u64>()) },
        0,
        "not added"
    );
}

/// A's own SEND from memory it unmapped (small: copied into the frame; 3 pages: the gather path where the link
/// gathers, with the ICRC read through the primitive): LOC_PROT_ERR, A's QP in ERR, nothing reaches B.
#[test]
fn send_from_unmapped_memory_is_a_local_protection_error() {
    for len in [64usize, 3 * PAGE] {
        let (a, b) = pair();
        let mut map = Map::new(4);
        let src = reg(&a, &map);
        let (_rbuf, rmr) = heap_mr(&b, 4 * PAGE);
        let rsge = [rmr.sge(0, (4 * PAGE) as u32)];
        b.qp.post_recv(&[RecvWr {
            wr_id: 9,
            sg_list: &rsge,
        }])
        .expect("post_recv");
        map.unmap();
        let sge = [src.sge(0, len as u32)];
        a.qp.post_send(&[SendWr::new(4, SendOp::Send, &sge).signaled()])
            .expect("post");
        let wc = wait_one(&a.cq);
        assert_eq!(
            (wc.wr_id, wc.status),
            (4, WcStatus::LocProtErr),
            "len {len}"
        );
        assert_eq!(faults(&a), 1, "len {len}");
        assert_eq!(state(&a), QpState::Err);
        let mut wcs = [Wc::default(); 1];
        assert_eq!(b.cq.poll(&mut wcs), 0, "len {len}: nothing received");
    }
}

/// A SEND with an inline SGE (copied at post) from protected memory: LOC_PROT_ERR in its turn.
#[test]
fn inline_send_from_protected_memory_is_a_local_protection_error() {
    let (a, b) = pair();
    let map = Map::new(1);
    let src = reg(&a, &map);
    map.protect(libc::PROT_NONE);
    let sge = [src.sge(0, 32)];
    let wr = SendWr::new(5, SendOp::Send, &sge).signaled();
    let mut wr = wr;
    wr.send_flags |= SendFlags::INLINE;
    a.qp.post_send(&[wr]).expect("post");
    let wc = wait_one(&a.cq);
    assert_eq!((wc.wr_id, wc.status), (5, WcStatus::LocProtErr));
    assert_eq!(faults(&a), 1);
    let _ = b;
}

/// A's READ into its own memory that it protected read-only: the response cannot land; LOC_PROT_ERR.
#[test]
fn read_into_read_only_memory_is_a_local_protection_error() {
    let (a, b) = pair();
    let map = Map::new(1);
    let dst = reg(&a, &map);
    let (_src, smr) = heap_mr(&b, PAGE);
    map.protect(libc::PROT_READ);
    let sge = [dst.sge(0, PAGE as u32)];
    let wr = SendWr::new(
        6,
        SendOp::RdmaRead {
            remote_addr: smr.addr(),
            rkey: smr.rkey(),
        },
        &sge,
    )
    .signaled();
    a.qp.post_send(&[wr]).expect("post");
    let wc = wait_one(&a.cq);
    assert_eq!((wc.wr_id, wc.status), (6, WcStatus::LocProtErr));
    assert_eq!(faults(&a), 1);
    assert_eq!(state(&a), QpState::Err);
}

/// B's receive buffer protected read-only: B's receive completes LOC_PROT_ERR, A's SEND REM_OP_ERR (NAK remote
/// operational error, as for a receive WQE whose SGE fails its check).
#[test]
fn receive_into_read_only_memory_is_a_local_protection_error() {
    let (a, b) = pair();
    let map = Map::new(1);
    let dst = reg(&b, &map);
    let rsge = [dst.sge(0, PAGE as u32)];
    b.qp.post_recv(&[RecvWr {
        wr_id: 7,
        sg_list: &rsge,
    }])
    .expect("post_recv");
    map.protect(libc::PROT_READ);
    let data = [1u8; 16];
    let parts: [&[u8]; 1] = [&data];
    let wr = SendWr::new(8, SendOp::Send, &[]).inline(&parts).signaled();
    a.qp.post_send(&[wr]).expect("post");
    let rwc = wait_one(&b.cq);
    assert_eq!((rwc.wr_id, rwc.status), (7, WcStatus::LocProtErr));
    let swc = wait_one(&a.cq);
    assert_eq!((swc.wr_id, swc.status), (8, WcStatus::RemOpErr));
    assert_eq!(faults(&b), 1);
}

/// The application's own copies through an `Mr` of unmapped memory are errors, not crashes.
#[test]
fn application_copies_of_unmapped_memory_are_errors() {
    let (a, _b) = pair();
    let mut map = Map::new(1);
    let mr = reg(&a, &map);
    mr.write(0, b"ok").expect("mapped");
    assert_eq!(mr.read(0, 2).expect("mapped"), b"ok");
    map.unmap();
    assert!(mr.read(0, 2).is_err());
    assert!(mr.write(0, b"no").is_err());
}

/// The faulting WR completes in SQ order: a healthy WRITE posted before it completes `Success` first (the engine
/// builds the SEND's packet in the same pass, before the WRITE's ACK arrives, so the fault is met with the WRITE
/// still outstanding), then the SEND from unmapped memory `LOC_PROT_ERR`, then the QP flushes what follows.
#[test]
fn a_fault_behind_outstanding_wrs_completes_in_order() {
    let (a, b) = pair();
    let mut map = Map::new(2);
    let src = reg(&a, &map);
    let (good, gmr) = heap_mr(&a, 2 * PAGE);
    good.fill(0x11);
    let (target, tmr) = heap_mr(&b, 2 * PAGE);
    map.unmap();
    let gsge = [gmr.sge(0, (2 * PAGE) as u32)];
    let bad = [src.sge(0, 512)];
    let after = [gmr.sge(0, 64)];
    let write = SendWr::new(
        1,
        SendOp::RdmaWrite {
            remote_addr: tmr.addr(),
            rkey: tmr.rkey(),
        },
        &gsge,
    )
    .signaled();
    let send = SendWr::new(2, SendOp::Send, &bad).signaled();
    let write2 = SendWr::new(
        3,
        SendOp::RdmaWrite {
            remote_addr: tmr.addr(),
            rkey: tmr.rkey(),
        },
        &after,
    )
    .signaled();
    a.qp.post_send(&[write, send, write2]).expect("post");
    let got: Vec<(u64, WcStatus)> = (0..3)
        .map(|_| {
            let wc = wait_one(&a.cq);
            (wc.wr_id, wc.status)
        })
        .collect();
    assert_eq!(
        got,
        [
            (1, WcStatus::Success),
            (2, WcStatus::LocProtErr),
            (3, WcStatus::WrFlushErr)
        ]
    );
    assert_eq!(
        target.to_vec(),
        vec![0x11u8; 2 * PAGE],
        "the WRITE before it landed"
    );
    assert_eq!(faults(&a), 1);
}

/// A's atomic whose local 8-byte target it protected read-only: the peer executes the atomic (its memory is
/// fine), the ATOMIC ACK's original value cannot land; the WR completes LOC_PROT_ERR.
#[test]
fn atomic_result_into_read_only_memory_is_a_local_protection_error() {
    let (a, b) = pair();
    let map = Map::new(1);
    let dst = reg(&a, &map);
    let (target, tmr) = heap_mr(&b, 8);
    target.write(0, &41u64.to_le_bytes()).expect("in range");
    map.protect(libc::PROT_READ);
    let sge = [dst.sge(0, 8)];
    let wr = SendWr::new(
        10,
        SendOp::AtomicFetchAndAdd {
            remote_addr: tmr.addr(),
            rkey: tmr.rkey(),
            add: 1,
        },
        &sge,
    )
    .signaled();
    a.qp.post_send(&[wr]).expect("post");
    let wc = wait_one(&a.cq);
    assert_eq!((wc.wr_id, wc.status), (10, WcStatus::LocProtErr));
    assert_eq!(faults(&a), 1);
    assert_eq!(faults(&b), 0);
    assert_eq!(target.to_vec(), 42u64.to_le_bytes(), "the peer added");
    assert_eq!(state(&a), QpState::Err);
}

/// UD: a datagram whose receive buffer (GRH area and payload) was protected read-only: the receive completes
/// LOC_PROT_ERR and the receiving QP goes to ERR (no NAK on UD); the sender's datagram completed when it left.
#[test]
fn ud_receive_into_read_only_memory_is_a_local_protection_error() {
    let (ca, cb) = Context::sim_pair(RuntimeConfig::with_mode(ProgressMode::Thread)).expect("pair");
    let cap = QpCap {
        max_send_wr: 4,
        max_recv_wr: 4,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 64,
    };
    let (pa, pb) = (ca.alloc_pd().expect("pd"), cb.alloc_pd().expect("pd"));
    let cqa = ca.create_cq(16, None, Moderation::default()).expect("cq");
    let cqb = cb.create_cq(16, None, Moderation::default()).expect("cq");
    let ua = pa
        .create_qp(QpType::Ud, &cqa, &cqa, cap, true)
        .expect("ud a");
    let ub = pb
        .create_qp(QpType::Ud, &cqb, &cqb, cap, true)
        .expect("ud b");
    ua.ready_ud(0x11, Psn::new(1)).expect("rts");
    ub.ready_ud(0x11, Psn::new(2)).expect("rts");
    let map = Map::new(1);
    // SAFETY: as in `reg`.
    let rmr = unsafe { pb.reg_mr_raw(map.ptr, map.len, all_access()) }.expect("reg_mr_raw");
    let rsge = [rmr.sge(0, 1024)];
    ub.post_recv(&[RecvWr {
        wr_id: 11,
        sg_list: &rsge,
    }])
    .expect("post_recv");
    map.protect(libc::PROT_READ);
    let ah = pa
        .create_ah(&AhAttr {
            dgid: cb.gid(0).expect("gid"),
            dmac: cb.config().mac,
            ..AhAttr::default()
        })
        .expect("ah");
    let dest = UdDest {
        ah: ah.handle(),
        remote_qpn: ub.qpn(),
        remote_qkey: 0x11,
    };
    let data = [5u8; 32];
    let parts: [&[u8]; 1] = [&data];
    let wr = SendWr::new(12, SendOp::Send, &[])
        .inline(&parts)
        .ud(dest)
        .signaled();
    ua.post_send(&[wr]).expect("post");
    let swc = wait_one(&cqa);
    assert_eq!((swc.wr_id, swc.status), (12, WcStatus::Success));
    let rwc = wait_one(&cqb);
    assert_eq!((rwc.wr_id, rwc.status), (11, WcStatus::LocProtErr));
    assert_eq!(cb.counters().expect("c").mr_access_faults, 1);
    assert_eq!(ub.query().expect("query").qp_state, QpState::Err);
}
