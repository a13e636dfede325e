//! The send scheduler end to end (issue #12; `roce_proto::sched`, `docs/spec/DCQCN.md §7, §9`): real engines on
//! the simulated link, measured at the receiver.
//!
//! * `shaping_holds_the_rate_for_1_to_1000_qps`: N QPs (1, 10, 100, 1000) each limited to 80/N Gb/s on a 100 Gb/s
//!   link, backlogged with RDMA WRITEs; every QP's received bytes over 100 ms of virtual time (after the initial
//!   buckets drained) are within 1 % of its rate.
//! * `weights_three_to_one_split_the_link`: two saturated traffic classes with ETS weights 3:1 (one QP in the first,
//!   three in the second) split a 10 Gb/s link 75/25 within 2 %.
//! * `control_frames_never_wait_behind_data`: both nodes send bulk WRITEs to each other over a 10 Gb/s link with every
//!   data frame CE-marked, so each node owes ACKs and CNPs while its own data is backlogged. With the port paced to
//!   the link (`SchedConfig::port_rate_bps`), every ACK and CNP starts on the wire at most one largest frame after
//!   it became due (`DCQCN.md §9 S5` and its check "CNP queueing delay at the sender NIC ≤ 1 max packet time");
//!   without port pacing the link's queue fills with data and they wait many frames (the test shows both).

use std::collections::HashMap;
use std::time::Duration;

use roce_proto::*;
use roce_tests::*;

const MSG: u32 = 64 * 1024;

/// A node's shared objects: one PD, one CQ and one MR for all of its QPs.
struct Node {
    pd: PdHandle,
    cq: CqHandle,
    mr: MrInfo,
}

fn node(p: &mut Pair, i: usize, mr_len: usize) -> Node {
    let e = p.e(i);
    let pd = e.alloc_pd().expect("pd");
    let cq = e.create_cq(1 << 17).expect("cq");
    let mr = e.reg_mr(pd, vec![0u8; mr_len], ALL_ACCESS).expect("mr");
    Node { pd, cq, mr }
}

/// Creates and connects `n` RC QP pairs from node `x` to node `y` on the nodes' shared PD/CQ.
fn pairs(
    p: &mut Pair,
    x: (usize, &Node),
    y: (usize, &Node),
    n: usize,
    o: &ConnOpts,
) -> Vec<(End, End)> {
    let mk = |p: &mut Pair, (i, nd): (usize, &Node)| {
        let (qpn, cap) = p
            .e(i)
            .create_qp(&QpInitAttr {
                qp_type: QpType::Rc,
                pd: nd.pd,
                send_cq: nd.cq,
                recv_cq: nd.cq,
                cap: o.cap,
                sq_sig_all: true,
            })
            .expect("create_qp");
        End {
            node: i,
            pd: nd.pd,
            cq: nd.cq,
            qpn,
            cap,
        }
    };
    (0..n)
        .map(|_| {
            let (a, b) = (mk(p, x), mk(p, y));
            bring_up(p, a, b, o.a_psn, o.b_psn, o).expect("up a");
            bring_up(p, b, a, o.b_psn, o.a_psn, o).expect("up b");
            (a, b)
        })
        .collect()
}

/// Posts `k` signaled 64 KiB RDMA WRITEs from `a` into the peer's MR.
fn write(p: &mut Pair, a: End, src: &MrInfo, dst: &MrInfo, k: usize) {
    let sg = [sge(src, 0, MSG)];
    let wrs: Vec<SendWr> = (0..k)
        .map(|_| {
            SendWr::new(
                1,
                SendOp::RdmaWrite {
                    remote_addr: dst.addr,
                    rkey: dst.rkey,
                },
                &sg,
            )
        })
        .collect();
    p.e(a.node).post_send(a.qpn, &wrs).expect("post_send");
}

/// Drives for `d`, re-posting one WRITE per completion so every QP stays backlogged.
fn drive_backlogged(
    p: &mut Pair,
    d: Duration,
    cq: CqHandle,
    ends: &HashMap<Qpn, End>,
    src: &MrInfo,
    dst: &MrInfo,
) {
    let end = p.now + d;
    while p.now < end {
        let step = Duration::from_micros(500).min(end - p.now);
        p.drive_for(step);
        let wcs = poll_all(p.a(), cq);
        let mut again: HashMap<Qpn, usize> = HashMap::new();
        for w in &wcs {
            assert_eq!(w.status, WcStatus::Success, "{w:?}");
            *again.entry(w.qp_num).or_default() += 1;
        }
        for (q, k) in again {
            write(p, ends[&q], src, dst, k);
        }
    }
}

fn sim(bandwidth_bps: u64) -> SimConfig {
    SimConfig {
        bandwidth_bps,
        propagation: Duration::from_micros(1),
        queue_limit: 4096,
        ..SimConfig::default()
    }
}

fn opts() -> ConnOpts {
    ConnOpts {
        mtu: Mtu::Mtu4096,
        cap: QpCap {
            max_send_wr: 64,
            max_recv_wr: 1,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        },
        ..ConnOpts::default()
    }
}

/// Node 0's engine configuration: the port paced to the link (so the link queue stays short and the engine's
/// scheduler decides), `line_rate_bps` = the link.
fn paced(link_bps: u64) -> EngineConfig {
    EngineConfig {
        sched: SchedConfig {
            line_rate_bps: link_bps,
            port_rate_bps: Some(link_bps),
            ..SchedConfig::default()
        },
        ..EngineConfig::default()
    }
}

#[test]
fn shaping_holds_the_rate_for_1_to_1000_qps() {
    const LINK: u64 = 100_000_000_000;
    const TOTAL: u64 = 80_000_000_000;
    for n in [1usize, 10, 100, 1000] {
        let mut p = Pair::with_config(PairConfig {
            sim: sim(LINK),
            engine: paced(LINK),
            capture: false,
            ..PairConfig::default()
        });
        let (na, nb) = (node(&mut p, 0, MSG as usize), node(&mut p, 1, MSG as usize));
        let qps = pairs(&mut p, (0, &na), (1, &nb), n, &opts());
        let rate = TOTAL / n as u64;
        let mut ends = HashMap::new();
        for (a, _) in &qps {
            // The default bucket depth (1.5 BDP = 187.5 KB at 100 Gb/s × 10 µs).
            p.a()
                .set_qp_rate_limit(a.qpn, Some(rate), None)
                .expect("limit");
            ends.insert(a.qpn, *a);
            // Enough WRITEs for 2 ms at the QP's rate, at least 4.
            let k = ((rate / 8 / 500) as usize / MSG as usize + 4).min(60);
            write(&mut p, *a, &na.mr, &nb.mr, k);
        }
        // Warm-up: the initial buckets (n × 187.5 KB) drain into the 20 Gb/s of spare link capacity.
        let warm = Duration::from_millis(2)
            + Duration::from_nanos(n as u64 * 187_500 * 8 * 1_000_000_000 / (LINK - TOTAL));
        drive_backlogged(&mut p, warm, na.cq, &ends, &na.mr, &nb.mr);
        let before: Vec<u64> = qps
            .iter()
            .map(|(_, b)| p.b().qp_counters(b.qpn).expect("b").rcvd_bytes)
            .collect();
        let window = Duration::from_millis(100);
        drive_backlogged(&mut p, window, na.cq, &ends, &na.mr, &nb.mr);
        let want = rate as f64 * window.as_secs_f64() / 8.0;
        let mut worst = 0f64;
        for (k, (_, b)) in qps.iter().enumerate() {
            let got = (p.b().qp_counters(b.qpn).expect("b").rcvd_bytes - before[k]) as f64;
            let err = (got - want).abs() / want;
            worst = worst.max(err);
            assert!(
                err < 0.01,
                "{n} QPs: QP {k} received {got} B in 100 ms, want {want} (error {:.3} %)",
                err * 100.0
            );
        }
        let c = p.counters(0);
        assert_eq!(c.retransmitted_pkts, 0, "{n} QPs: no loss");
        eprintln!(
            "{n:>4} QPs at {:.3} Gb/s each: worst error over 100 ms {:.3} %",
            rate as f64 / 1e9,
            worst * 100.0
        );
    }
}

#[test]
fn weights_three_to_one_split_the_link() {
    const LINK: u64 = 10_000_000_000;
    let mut cfg = paced(LINK);
    cfg.sched.tcs[0].weight = 3;
    cfg.sched.tcs[1].weight = 1;
    let mut p = Pair::with_config(PairConfig {
        sim: sim(LINK),
        engine: cfg,
        capture: false,
        ..PairConfig::default()
    });
    let (na, nb) = (node(&mut p, 0, MSG as usize), node(&mut p, 1, MSG as usize));
    let qps = pairs(&mut p, (0, &na), (1, &nb), 4, &opts());
    let mut ends = HashMap::new();
    for (k, (a, _)) in qps.iter().enumerate() {
        // QP 0 in class 0; QPs 1..=3 in class 1 (a class's share does not depend on its QP count).
        p.a().set_qp_tc(a.qpn, u8::from(k > 0)).expect("tc");
        ends.insert(a.qpn, *a);
        write(&mut p, *a, &na.mr, &nb.mr, 40);
    }
    assert!(p.a().set_qp_tc(qps[0].0.qpn, 8).is_err());
    drive_backlogged(
        &mut p,
        Duration::from_millis(2),
        na.cq,
        &ends,
        &na.mr,
        &nb.mr,
    );
    let rx = |p: &mut Pair| -> Vec<u64> {
        qps.iter()
            .map(|(_, b)| p.b().qp_counters(b.qpn).expect("b").rcvd_bytes)
            .collect()
    };
    let before = rx(&mut p);
    drive_backlogged(
        &mut p,
        Duration::from_millis(20),
        na.cq,
        &ends,
        &na.mr,
        &nb.mr,
    );
    let after = rx(&mut p);
    let d: Vec<f64> = (0..4).map(|k| (after[k] - before[k]) as f64).collect();
    let class0 = d[0];
    let class1 = d[1] + d[2] + d[3];
    let share = class0 / (class0 + class1);
    let util = (class0 + class1) * 8.0 / 0.02 / LINK as f64;
    eprintln!(
        "class shares {:.2} % / {:.2} % (QPs of class 1: {:?} B), link use {:.1} %",
        share * 100.0,
        (1.0 - share) * 100.0,
        &d[1..],
        util * 100.0
    );
    assert!((share - 0.75).abs() <= 0.02, "share of class 0: {share}");
    assert!(util > 0.95, "the link stays busy: {util}");
    // Round robin inside class 1: its three QPs within 2 % of each other.
    for k in 2..4 {
        assert!((d[k] - d[1]).abs() / d[1] < 0.02, "{d:?}");
    }
}

/// Serialisation start of every captured frame of node `from` on a FIFO link of `bps` (the simulated link's model:
/// a frame starts when it was handed over or when the previous one finished; `SimConfig::per_frame_overhead` 24),
/// and its finish.
fn wire_times(p: &Pair, from: usize, bps: u64) -> Vec<(usize, Instant, Instant)> {
    let mut busy = Instant::ZERO;
    let mut out = Vec::new();
    for (k, c) in p
        .captured
        .iter()
        .enumerate()
        .filter(|(_, c)| c.from == from)
    {
        let start = c.at.max(busy);
        let ns = (c.frame.len().max(60) + 24) as u64 * 8 * 1_000_000_000 / bps;
        busy = start + Duration::from_nanos(ns);
        out.push((k, start, busy));
    }
    out
}

/// Worst wait of node 1's ACKs and CNPs from the instant they became due (the arrival of the frame that asked for
/// them, or the end of the NP's CNP window) to the start of their serialisation, and how many there were. `b2a` maps node 1's QPNs of the node 0 → 1
/// pairs to their peers.
fn control_waits(p: &Pair, bps: u64, b2a: &HashMap<u32, u32>) -> (Duration, usize, usize) {
    let prop = Duration::from_micros(1);
    // Arrivals of node 0's data frames at node 1, keyed by the sending QP (node 0's QPN).
    let mut acked: HashMap<(u32, u32), Vec<Instant>> = HashMap::new();
    let mut arrivals: HashMap<u32, Vec<Instant>> = HashMap::new();
    for (k, _, fin) in wire_times(p, 0, bps) {
        let c = &p.captured[k];
        let Some(pkt) = Pkt::parse(&c.frame) else {
            continue;
        };
        if !matches!(c.meta.kind, TxKind::Data | TxKind::Retransmit) {
            continue;
        }
        let a = b2a[&pkt.dest_qp];
        arrivals.entry(a).or_default().push(fin + prop);
        if pkt.ack_req {
            acked.entry((a, pkt.psn)).or_default().push(fin + prop);
        }
    }
    // The NP's rules per QP (DCQCN.md §2.2, `EngineConfig::cnp_interval` 50 µs; every data frame is CE-marked): N1, a
    // marked arrival ≥ 50 µs after the last CNP makes a CNP due at once; N2, a marked arrival inside the window makes
    // one due at the window's end, which opens the next window.
    let window = Duration::from_micros(50);
    let mut cnp_due: HashMap<u32, std::collections::VecDeque<Instant>> = HashMap::new();
    for (a, times) in &arrivals {
        let due = cnp_due.entry(*a).or_default();
        let (mut last, mut owed): (Option<Instant>, bool) = (None, false);
        for &t in times {
            while let (true, Some(l)) = (owed, last) {
                if t < l + window {
                    break;
                }
                due.push_back(l + window);
                last = Some(l + window);
                owed = false;
            }
            if last.is_none_or(|l| t - l >= window) {
                due.push_back(t);
                last = Some(t);
            } else {
                owed = true;
            }
        }
        if let (true, Some(l)) = (owed, last) {
            due.push_back(l + window);
        }
    }
    let (mut worst, mut acks, mut cnps) = (Duration::ZERO, 0, 0);
    for (k, start, _) in wire_times(p, 1, bps) {
        let c = &p.captured[k];
        let Some(pkt) = Pkt::parse(&c.frame) else {
            continue;
        };
        if !b2a.values().any(|&a| a == pkt.dest_qp) {
            continue;
        }
        let due = match c.meta.kind {
            TxKind::Ack => {
                acks += 1;
                // The latest arrival of the acknowledged request before the ACK was emitted.
                acked[&(pkt.dest_qp, pkt.psn)]
                    .iter()
                    .copied()
                    .filter(|&t| t <= c.at)
                    .max()
                    .expect("ACK for a frame that arrived")
            }
            TxKind::Cnp => {
                cnps += 1;
                cnp_due
                    .get_mut(&pkt.dest_qp)
                    .and_then(|q| q.pop_front())
                    .expect("a CNP the NP rule predicts")
            }
            _ => continue,
        };
        assert!(start >= due, "sent before due: {start} < {due}");
        worst = worst.max(start - due);
    }
    (worst, acks, cnps)
}

#[test]
fn control_frames_never_wait_behind_data() {
    const LINK: u64 = 10_000_000_000;
    let run = |port_paced: bool| {
        let mut cfg = if port_paced {
            paced(LINK)
        } else {
            EngineConfig::default()
        };
        // One frame of slack at the port: a control frame waits at most for the frame on the wire (S5).
        cfg.sched.port_burst_bytes = Some(0);
        let mut p = Pair::with_config(PairConfig {
            sim: sim(LINK),
            engine: cfg,
            ..PairConfig::default()
        });
        let (na, nb) = (node(&mut p, 0, MSG as usize), node(&mut p, 1, MSG as usize));
        let ab = pairs(&mut p, (0, &na), (1, &nb), 2, &opts());
        let ba = pairs(&mut p, (1, &nb), (0, &na), 2, &opts());
        let every = FaultConfig {
            ce_mark: 1.0,
            ..FaultConfig::default()
        };
        p.faults(0).set_tx_faults(every);
        p.faults(1).set_tx_faults(every);
        for (a, _) in &ab {
            write(&mut p, *a, &na.mr, &nb.mr, 60);
        }
        for (b, _) in &ba {
            write(&mut p, *b, &nb.mr, &na.mr, 60);
        }
        p.drive_for(Duration::from_millis(4));
        let b2a: HashMap<u32, u32> = ab
            .iter()
            .map(|(a, b)| (b.qpn.value(), a.qpn.value()))
            .collect();
        let (worst, acks, cnps) = control_waits(&p, LINK, &b2a);
        let c = p.counters(1);
        (worst, acks, cnps, c)
    };
    // Largest frame: a WRITE FIRST/ONLY, 4096 payload + 58 B of headers + RETH 16, + 24 B of wire overhead, at
    // 10 Gb/s (rounded up).
    let max_frame = Duration::from_nanos(((4096 + 58 + 16 + 24) * 8u64).div_ceil(10));
    let (worst, acks, cnps, c) = run(true);
    eprintln!(
        "port paced: {acks} ACKs, {cnps} CNPs, worst wait {worst:?} (one largest frame = {max_frame:?})"
    );
    assert!(acks > 50 && cnps > 20, "{acks} ACKs, {cnps} CNPs; {c:?}");
    assert!(
        worst <= max_frame,
        "an ACK or CNP waited {worst:?} > {max_frame:?}"
    );
    let (worst_unpaced, ..) = run(false);
    eprintln!("port not paced: worst wait {worst_unpaced:?} (the link's own queue)");
    assert!(
        worst_unpaced > 4 * max_frame,
        "without port pacing the link queue should delay control frames: {worst_unpaced:?}"
    );
}

/// The engine measures the RTT from its RC ACKs (RFC 6298 smoothing) and sizes the batching window with it
/// (`Engine::drain_quota`, `Engine::tx_burst`; issue #12 "dynamic batching window", `DCQCN.md §10`): on a 10 Gb/s
/// link with 5 µs and with 50 µs of propagation, one 4 KiB WRITE at a time, the SRTT is the wire's round trip
/// (2 × propagation + the WRITE's and the ACK's serialisation) within 2 %, and both quotas grow with it.
#[test]
fn rtt_is_measured_and_sizes_the_batching_window() {
    const LINK: u64 = 10_000_000_000;
    let mut seen = Vec::new();
    for prop_us in [5u64, 50] {
        let mut cfg = EngineConfig::default();
        cfg.sched.line_rate_bps = LINK;
        let mut p = Pair::with_config(PairConfig {
            sim: SimConfig {
                propagation: Duration::from_micros(prop_us),
                ..sim(LINK)
            },
            engine: cfg,
            capture: false,
            ..PairConfig::default()
        });
        let (na, nb) = (node(&mut p, 0, MSG as usize), node(&mut p, 1, MSG as usize));
        let (a, _) = pairs(&mut p, (0, &na), (1, &nb), 1, &opts())[0];
        assert_eq!(
            p.a().srtt(),
            Duration::from_micros(10),
            "base_rtt before any sample"
        );
        let sg = [sge(&na.mr, 0, 4096)];
        for _ in 0..50 {
            let wr = SendWr::new(
                1,
                SendOp::RdmaWrite {
                    remote_addr: nb.mr.addr,
                    rkey: nb.mr.rkey,
                },
                &sg,
            );
            p.a().post_send(a.qpn, &[wr]).expect("post");
            p.drive();
            assert_eq!(poll_all(p.a(), na.cq).len(), 1);
        }
        // WRITE ONLY 4096 + 74 B of headers, ACK 62 B (padded to 64 on the wire), each + 24 B of overhead.
        let ser = |b: u64| b * 8 * 1_000_000_000 / LINK;
        let want = 2 * prop_us * 1000 + ser(4170 + 24) + ser(64 + 24);
        let got = p.a().srtt().as_nanos() as u64;
        assert!(
            (got as f64 - want as f64).abs() / (want as f64) < 0.02,
            "SRTT {got} ns, the wire's round trip {want} ns"
        );
        assert_eq!(p.a().scheduler().rtt().samples(), 50);
        let quota = p.a().drain_quota(a.qpn, 1000);
        let burst = p.a().tx_burst();
        // The doorbell batching window a runtime uses: a quarter of the SRTT.
        assert_eq!(p.a().batch_window(), p.a().srtt() / 4);
        eprintln!(
            "propagation {prop_us} µs: SRTT {got} ns, drain quota {quota} WQEs of 4 KiB, {burst} frames per I/O"
        );
        seen.push((quota, burst));
    }
    // One window (10 Gb/s × SRTT) of 4 KiB WQEs: 13.4 µs → 5, 103.4 µs → 32; frames per I/O: a quarter of it.
    assert!(seen[1].0 > 4 * seen[0].0, "{seen:?}");
    assert!(seen[1].1 > 4 * seen[0].1, "{seen:?}");
}
