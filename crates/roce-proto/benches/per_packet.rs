//! Criterion benchmark: per-packet cost of the engine with and without many idle QPs.
//!
//! Two engines in one thread, no link: engine A posts 16 signaled-at-the-end RDMA WRITEs of 4 KiB (64 packets at
//! PMTU 1024) on one RC QP, frames are handed straight to engine B's `handle_frame` and ACKs back, until the
//! completion arrives. Each engine also holds `idle` other RC QPs in RTS that have no work. If any per-packet or
//! per-poll step scanned all QPs, the time per packet would grow with `idle`; with ready queues it does not.
//!
//! Run: `cargo bench -p roce-proto --bench per_packet`; smoke run: `cargo test -p roce-proto --benches`.

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use roce_proto::*;

const MAC: [[u8; 6]; 2] = [[2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2]];
const IP: [[u8; 4]; 2] = [[10, 0, 0, 1], [10, 0, 0, 2]];
const ACCESS: AccessFlags = AccessFlags(AccessFlags::LOCAL_WRITE.0 | AccessFlags::REMOTE_WRITE.0);
const WRS: u64 = 16;
const WR_LEN: u32 = 4096;
const PACKETS: u64 = WRS * 4;

struct Setup {
    a: Engine,
    b: Engine,
    qpn: Qpn,
    cq: CqHandle,
    src: MrInfo,
    dst: MrInfo,
}

fn rc_qp(e: &mut Engine, pd: PdHandle, cq: CqHandle) -> Qpn {
    e.create_qp(&QpInitAttr {
        qp_type: QpType::Rc,
        pd,
        send_cq: cq,
        recv_cq: cq,
        cap: QpCap {
            max_send_wr: 64,
            max_recv_wr: 1,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        },
        sq_sig_all: false,
    })
    .expect("create_qp")
    .0
}

fn bring_up(e: &mut Engine, me: Qpn, peer: Qpn, p: usize) {
    let mut at = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        qp_access_flags: ACCESS,
        ..QpAttr::default()
    };
    let init =
        QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::ACCESS_FLAGS;
    e.modify_qp(me, &at, init).expect("INIT");
    at.qp_state = QpState::Rtr;
    at.ah_attr = AhAttr {
        dgid: Gid::from_ipv4(IP[p]),
        dmac: MAC[p],
        ..AhAttr::default()
    };
    at.path_mtu = Mtu::Mtu1024;
    at.dest_qp_num = peer;
    let rtr = QpAttrMask::STATE
        | QpAttrMask::AV
        | QpAttrMask::PATH_MTU
        | QpAttrMask::DEST_QPN
        | QpAttrMask::RQ_PSN
        | QpAttrMask::MAX_DEST_RD_ATOMIC
        | QpAttrMask::MIN_RNR_TIMER;
    e.modify_qp(me, &at, rtr).expect("RTR");
    at.qp_state = QpState::Rts;
    at.timeout = 14;
    at.retry_cnt = 7;
    at.rnr_retry = 7;
    let rts = QpAttrMask::STATE
        | QpAttrMask::SQ_PSN
        | QpAttrMask::TIMEOUT
        | QpAttrMask::RETRY_CNT
        | QpAttrMask::RNR_RETRY
        | QpAttrMask::MAX_QP_RD_ATOMIC;
    e.modify_qp(me, &at, rts).expect("RTS");
}

fn setup(idle: u32) -> Setup {
    let cfg = |p: usize| EngineConfig {
        mac: MAC[p],
        gids: vec![Gid::from_ipv4(IP[p])],
        seed: p as u64,
        ..EngineConfig::default()
    };
    let mut e = [Engine::new(cfg(0)), Engine::new(cfg(1))];
    let mut qp = [Qpn::new(0); 2];
    let mut cq = [CqHandle(0); 2];
    let mut mr = Vec::new();
    for (k, e) in e.iter_mut().enumerate() {
        let pd = e.alloc_pd().expect("pd");
        cq[k] = e.create_cq(1024).expect("cq");
        mr.push(e.reg_mr(pd, vec![1u8; 1 << 16], ACCESS).expect("mr"));
        // Idle QPs first (lower QPNs), connected to a QPN nobody uses.
        let idle_cq = e.create_cq(16).expect("idle cq");
        for _ in 0..idle {
            let q = rc_qp(e, pd, idle_cq);
            bring_up(e, q, Qpn::new(0xAB_CDEF), 1 - k);
        }
        qp[k] = rc_qp(e, pd, cq[k]);
    }
    let [mut a, mut b] = e;
    bring_up(&mut a, qp[0], qp[1], 1);
    bring_up(&mut b, qp[1], qp[0], 0);
    Setup {
        a,
        b,
        qpn: qp[0],
        cq: cq[0],
        src: mr[0],
        dst: mr[1],
    }
}

/// One round: 16 WRITEs of 4 KiB, frames moved until the last one's completion is back. Returns frames moved.
fn round(s: &mut Setup, now: &mut Instant, buf: &mut [u8], wcs: &mut [Wc]) -> u64 {
    let sg = [Sge {
        addr: s.src.addr,
        length: WR_LEN,
        lkey: s.src.lkey,
    }];
    let op = SendOp::RdmaWrite {
        remote_addr: s.dst.addr,
        rkey: s.dst.rkey,
    };
    let wrs: [SendWr<'_>; WRS as usize] = core::array::from_fn(|i| {
        let wr = SendWr::new(i as u64, op, &sg);
        if i as u64 == WRS - 1 {
            wr.signaled()
        } else {
            wr
        }
    });
    s.a.post_send(s.qpn, &wrs).expect("post_send");
    let mut frames = 0;
    loop {
        *now = Instant::from_nanos(now.as_nanos() + 100);
        while let Some(m) = s.a.poll_transmit(*now, buf) {
            s.b.handle_frame(*now, &buf[..m.len]);
            frames += 1;
        }
        while let Some(m) = s.b.poll_transmit(*now, buf) {
            s.a.handle_frame(*now, &buf[..m.len]);
            frames += 1;
        }
        if s.a.poll_cq(s.cq, wcs) > 0 {
            assert_eq!(wcs[0].status, WcStatus::Success);
            return frames;
        }
    }
}

fn per_packet(c: &mut Criterion) {
    let mut g = c.benchmark_group("rc_write_4k_x16");
    g.throughput(Throughput::Elements(PACKETS));
    for idle in [0u32, 1000, 4000] {
        let mut s = setup(idle);
        let mut now = Instant::from_micros(1);
        let mut buf = vec![0u8; 9000];
        let mut wcs = [Wc::default(); 4];
        g.bench_with_input(BenchmarkId::new("idle_qps", idle), &idle, |bch, _| {
            bch.iter(|| black_box(round(&mut s, &mut now, &mut buf, &mut wcs)));
        });
    }
    g.finish();
}

criterion_group!(benches, per_packet);
criterion_main!(benches);
