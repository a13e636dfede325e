//! The simulated link allocates nothing per frame once warm: two engines with an RC QP pair run SEND, multi-packet
//! RDMA WRITE and READ over a [`SimNet`] through the [`Link`] trait (`rx_burst` → `handle_frame`, `tx_buf` →
//! `poll_transmit` → `tx_commit`, `flush`), and a counting `#[global_allocator]` (armed per thread) must see zero
//! allocations, reallocations and deallocations in the steady state. The warm-up lets the segment's frame pool,
//! arrival heaps and egress queues reach their working size (they grow with the number of frames in flight).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

use roce_link::{Link, SimConfig, SimNet, SimPort, min_instant};
use roce_proto::*;

struct Counting;

static EVENTS: AtomicU64 = AtomicU64::new(0);

thread_local! {
    static ARMED: Cell<bool> = const { Cell::new(false) };
}

fn note() {
    if ARMED.try_with(Cell::get).unwrap_or(false) {
        EVENTS.fetch_add(1, Ordering::Relaxed);
    }
}

// SAFETY: every method forwards to `System` unchanged; the bookkeeping touches an atomic and a const thread-local.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note();
        // SAFETY: forwarded contract.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note();
        // SAFETY: forwarded contract.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note();
        // SAFETY: forwarded contract.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        note();
        // SAFETY: forwarded contract.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const MAC: [[u8; 6]; 2] = [[2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2]];
const IP: [[u8; 4]; 2] = [[10, 0, 0, 1], [10, 0, 0, 2]];
const ACCESS: AccessFlags = AccessFlags(
    AccessFlags::LOCAL_WRITE.0
        | AccessFlags::REMOTE_WRITE.0
        | AccessFlags::REMOTE_READ.0
        | AccessFlags::REMOTE_ATOMIC.0,
);

struct End {
    qpn: Qpn,
    cq: CqHandle,
    mr: MrInfo,
}

fn make(e: &mut Engine) -> End {
    let pd = e.alloc_pd().unwrap();
    let cq = e.create_cq(1024).unwrap();
    let mr = e.reg_mr(pd, vec![7u8; 1 << 16], ACCESS).unwrap();
    let (qpn, _) = e
        .create_qp(&QpInitAttr {
            qp_type: QpType::Rc,
            pd,
            send_cq: cq,
            recv_cq: cq,
            cap: QpCap {
                max_send_wr: 64,
                max_recv_wr: 64,
                max_send_sge: 2,
                max_recv_sge: 2,
                max_inline_data: 64,
            },
            sq_sig_all: true,
        })
        .unwrap();
    End { qpn, cq, mr }
}

fn bring_up(e: &mut Engine, me: &End, peer: Qpn, p: usize) {
    let mut at = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        qp_access_flags: ACCESS,
        ..QpAttr::default()
    };
    e.modify_qp(
        me.qpn,
        &at,
        QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::ACCESS_FLAGS,
    )
    .unwrap();
    at.qp_state = QpState::Rtr;
    at.ah_attr = AhAttr {
        dgid: Gid::from_ipv4(IP[p]),
        dmac: MAC[p],
        ..AhAttr::default()
    };
    at.path_mtu = Mtu::Mtu1024;
    at.dest_qp_num = peer;
    at.max_dest_rd_atomic = 4;
    e.modify_qp(
        me.qpn,
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
    at.timeout = 14;
    at.retry_cnt = 7;
    at.rnr_retry = 7;
    at.max_rd_atomic = 4;
    e.modify_qp(
        me.qpn,
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

/// Moves frames between the engines and the segment until `want` completions arrived at each end.
fn drive(
    net: &SimNet,
    nodes: &mut [(Engine, SimPort); 2],
    ends: &[End; 2],
    now: &mut Instant,
    want: [u32; 2],
) {
    let mut got = [0u32; 2];
    let mut wcs = [Wc::default(); 16];
    let mut guard = 0u32;
    while got != want {
        guard += 1;
        assert!(guard < 100_000, "stuck: {got:?} of {want:?}");
        let t = *now;
        let mut progress = false;
        for (k, (engine, port)) in nodes.iter_mut().enumerate() {
            let n = port
                .rx_burst(t, 64, &mut |f: &mut [u8]| engine.handle_frame(t, f))
                .unwrap();
            progress |= n > 0;
            if engine.poll_timeout().is_some_and(|d| d <= t) {
                engine.handle_timeout(t);
            }
            loop {
                let buf = port.tx_buf(t).unwrap();
                let Some(meta) = engine.poll_transmit(t, buf) else {
                    break;
                };
                port.tx_commit(t, meta.len).unwrap();
                progress = true;
            }
            port.flush(t).unwrap();
            loop {
                let c = engine.poll_cq(ends[k].cq, &mut wcs);
                if c == 0 {
                    break;
                }
                for wc in &wcs[..c] {
                    assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
                }
                got[k] += c as u32;
            }
        }
        if !progress {
            let mut next = net.next_event();
            for (engine, _) in nodes.iter_mut() {
                next = min_instant(next, engine.poll_timeout());
            }
            if let Some(n) = next.filter(|n| *n > t) {
                *now = n;
            }
        }
    }
}

fn iteration(
    net: &SimNet,
    nodes: &mut [(Engine, SimPort); 2],
    ends: &[End; 2],
    now: &mut Instant,
    i: u64,
) {
    let (a, b) = (&ends[0], &ends[1]);
    let rsg = [Sge {
        addr: b.mr.addr + 32768,
        length: 4096,
        lkey: b.mr.lkey,
    }];
    nodes[1]
        .0
        .post_recv(
            b.qpn,
            &[RecvWr {
                wr_id: i,
                sg_list: &rsg,
            }],
        )
        .unwrap();
    let send = [Sge {
        addr: a.mr.addr,
        length: 3000,
        lkey: a.mr.lkey,
    }];
    let write = [Sge {
        addr: a.mr.addr + 4096,
        length: 8000,
        lkey: a.mr.lkey,
    }];
    let read = [Sge {
        addr: a.mr.addr + 16384,
        length: 5000,
        lkey: a.mr.lkey,
    }];
    let wrs = [
        SendWr::new(i, SendOp::Send, &send),
        SendWr::new(
            i,
            SendOp::RdmaWrite {
                remote_addr: b.mr.addr,
                rkey: b.mr.rkey,
            },
            &write,
        ),
        SendWr::new(
            i,
            SendOp::RdmaRead {
                remote_addr: b.mr.addr + 40_000,
                rkey: b.mr.rkey,
            },
            &read,
        ),
    ];
    nodes[0].0.post_send(a.qpn, &wrs).unwrap();
    drive(net, nodes, ends, now, [3, 1]);
}

#[test]
fn sim_link_steady_state_allocates_nothing() {
    let cfg = |p: usize| EngineConfig {
        mac: MAC[p],
        gids: vec![Gid::from_ipv4(IP[p])],
        seed: p as u64,
        ..EngineConfig::default()
    };
    let (net, pa, pb) = SimNet::pair(SimConfig::default(), MAC[0], MAC[1]);
    let mut nodes = [(Engine::new(cfg(0)), pa), (Engine::new(cfg(1)), pb)];
    let ends = [make(&mut nodes[0].0), make(&mut nodes[1].0)];
    bring_up(&mut nodes[0].0, &ends[0], ends[1].qpn, 1);
    bring_up(&mut nodes[1].0, &ends[1], ends[0].qpn, 0);
    let mut now = Instant::from_micros(1);
    for i in 0..20 {
        iteration(&net, &mut nodes, &ends, &mut now, i);
    }
    let before = EVENTS.load(Ordering::Relaxed);
    ARMED.with(|a| a.set(true));
    for i in 20..1020 {
        iteration(&net, &mut nodes, &ends, &mut now, i);
    }
    ARMED.with(|a| a.set(false));
    let n = EVENTS.load(Ordering::Relaxed) - before;
    assert_eq!(
        n, 0,
        "allocator calls in 1000 steady-state iterations over the simulated link"
    );
    assert_eq!(net.stats(0).map(|s| s.drops_queue_full), Some(0));
    assert!(nodes[0].0.counters().sent_pkts >= 12 * 1020);
}
