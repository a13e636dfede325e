//! Randomised end-to-end runs: random WR mixes over a lossy, reordering-free wire with random PMTU; every WR must
//! complete successfully, in order, and memory must match a model.

use std::time::Duration;

use super::util::*;
use crate::*;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

const SLOT: u64 = 10_000;

fn run(seed: u64, nwr: usize, loss_pct: u64) {
    let mut rng = Rng(seed);
    let mtu = [
        Mtu::Mtu256,
        Mtu::Mtu512,
        Mtu::Mtu1024,
        Mtu::Mtu2048,
        Mtu::Mtu4096,
    ][rng.below(5) as usize];
    let o = ConnOpts {
        mtu,
        timeout: 6,
        retry_cnt: 7,
        a_psn: Psn::new(0xFF_FF00 + rng.below(0x100) as u32),
        max_rd_atomic: 1 + rng.below(4) as u8,
        cap: QpCap {
            max_send_wr: 512,
            max_recv_wr: 512,
            max_send_sge: 4,
            max_recv_sge: 4,
            max_inline_data: 256,
        },
        ..ConnOpts::default()
    };
    let mut p = Pair::new();
    let (a, b) = connect(&mut p, &o);
    let n = nwr as u64;
    let ma = mr(&mut p.a, a.pd, (SLOT * (n + 1)) as usize, |i| {
        (i as u64 * 31 + seed) as u8
    });
    let mb = mr(&mut p.b, b.pd, (SLOT * (n + 1)) as usize, |i| {
        (i as u64 * 17 + seed * 3) as u8
    });
    let mut lr = Rng(seed ^ 0xABCD);
    p.filter = Box::new(move |_, _| lr.below(100) >= loss_pct);
    let mut expect_b = p.b.mr_bytes(mb.lkey).unwrap().to_vec();
    let mut expect_a = p.a.mr_bytes(ma.lkey).unwrap().to_vec();
    let src_a = expect_a.clone();
    let counter_off = SLOT * n; // 8-byte atomic cell in B
    let mut counter = u64::from_le_bytes(
        expect_b[counter_off as usize..counter_off as usize + 8]
            .try_into()
            .unwrap(),
    );
    let mut expected_wc = Vec::new();
    let mut recv_id = 0u64;
    let mut sg_store = Vec::new();
    for i in 0..n {
        let len = match rng.below(4) {
            0 => 0,
            1 => rng.below(64),
            _ => rng.below(SLOT - 16),
        } as u32;
        let off = i * SLOT;
        let kind = rng.below(7);
        let (op, opcode) = match kind {
            0 => (SendOp::Send, WcOpcode::Send),
            1 => (SendOp::SendWithImm { imm: i as u32 }, WcOpcode::Send),
            2 => (
                SendOp::RdmaWrite {
                    remote_addr: mb.addr + off,
                    rkey: mb.rkey,
                },
                WcOpcode::RdmaWrite,
            ),
            3 => (
                SendOp::RdmaWriteWithImm {
                    remote_addr: mb.addr + off,
                    rkey: mb.rkey,
                    imm: 7,
                },
                WcOpcode::RdmaWrite,
            ),
            4 => (
                SendOp::RdmaRead {
                    remote_addr: mb.addr + off,
                    rkey: mb.rkey,
                },
                WcOpcode::RdmaRead,
            ),
            5 => (
                SendOp::AtomicFetchAndAdd {
                    remote_addr: mb.addr + counter_off,
                    rkey: mb.rkey,
                    add: i + 1,
                },
                WcOpcode::FetchAdd,
            ),
            _ => (
                SendOp::AtomicCmpAndSwp {
                    remote_addr: mb.addr + counter_off,
                    rkey: mb.rkey,
                    compare: counter,
                    swap: i,
                },
                WcOpcode::CompSwap,
            ),
        };
        let len = if kind >= 5 { 8 } else { len };
        // Local SGL: up to 3 pieces of the slot.
        let pieces = 1 + rng.below(3) as u32;
        let mut sges = Vec::new();
        let mut left = len;
        let mut lo = off;
        for k in 0..pieces {
            let l = if k + 1 == pieces { left } else { left / 2 };
            sges.push(sge(&ma, lo, l));
            lo += u64::from(l) + 3;
            left -= l;
        }
        let local_bytes = |v: &Vec<u8>| -> Vec<u8> {
            let mut out = Vec::new();
            for s in &sges {
                let o = (s.addr - ma.addr) as usize;
                out.extend_from_slice(&v[o..o + s.length as usize]);
            }
            out
        };
        match kind {
            0 | 1 => {
                p.b.post_recv(
                    b.qpn,
                    &[RecvWr {
                        wr_id: recv_id,
                        sg_list: &[sge(&mb, off, SLOT as u32)],
                    }],
                )
                .unwrap();
                recv_id += 1;
                let data = local_bytes(&src_a);
                expect_b[off as usize..off as usize + data.len()].copy_from_slice(&data);
            }
            2 | 3 => {
                if kind == 3 {
                    p.b.post_recv(
                        b.qpn,
                        &[RecvWr {
                            wr_id: recv_id,
                            sg_list: &[],
                        }],
                    )
                    .unwrap();
                    recv_id += 1;
                }
                let data = local_bytes(&src_a);
                expect_b[off as usize..off as usize + data.len()].copy_from_slice(&data);
            }
            4 => {
                let remote = expect_b[off as usize..off as usize + len as usize].to_vec();
                let mut k = 0;
                for s in &sges {
                    let o = (s.addr - ma.addr) as usize;
                    expect_a[o..o + s.length as usize]
                        .copy_from_slice(&remote[k..k + s.length as usize]);
                    k += s.length as usize;
                }
            }
            _ => {
                // Atomic: single 8-byte SGE.
                sges = vec![sge(&ma, off, 8)];
                let orig = counter;
                counter = if kind == 5 {
                    counter.wrapping_add(i + 1)
                } else if counter == orig {
                    i
                } else {
                    counter
                };
                expect_a[off as usize..off as usize + 8].copy_from_slice(&orig.to_le_bytes());
            }
        }
        expected_wc.push((i, opcode));
        sg_store.push((op, sges));
    }
    expect_b[counter_off as usize..counter_off as usize + 8]
        .copy_from_slice(&counter.to_le_bytes());
    // Post in random-size chains.
    let mut k = 0;
    while k < sg_store.len() {
        let m = (1 + rng.below(8) as usize).min(sg_store.len() - k);
        let wrs: Vec<SendWr<'_>> = sg_store[k..k + m]
            .iter()
            .enumerate()
            .map(|(j, (op, s))| SendWr::new((k + j) as u64, *op, s))
            .collect();
        p.a.post_send(a.qpn, &wrs).unwrap();
        k += m;
        p.drive_for(Duration::from_micros(rng.below(50)));
    }
    p.drive_for(Duration::from_secs(30));
    assert_counters_add_up(&p.a);
    assert_counters_add_up(&p.b);
    let wa = poll_all(&mut p.a, a.cq);
    let got: Vec<_> = wa.iter().map(|w| (w.wr_id, w.opcode)).collect();
    let bad: Vec<_> = wa
        .iter()
        .filter(|w| w.status != WcStatus::Success)
        .collect();
    if !bad.is_empty() && std::env::var("TRACE").is_ok() {
        for ((t, d, f), dropped) in p.captured.iter().zip(&p.dropped) {
            let (o, psn, ar) = bth_of(f);
            let extra = if o == 0x0c {
                format!(
                    " va={:x} len={}",
                    u64::from_be_bytes(f[54..62].try_into().unwrap()),
                    u32::from_be_bytes(f[66..70].try_into().unwrap())
                )
            } else if o == 0x11 || o == 0x0d || o == 0x0f || o == 0x10 {
                format!(" syn={:x}", f[54])
            } else {
                String::new()
            };
            eprintln!(
                "{t} {d:?} op={o:#x} psn={psn} ar={ar} len={}{extra}{}",
                f.len(),
                if *dropped { " DROPPED" } else { "" }
            );
        }
    }
    assert!(
        bad.is_empty(),
        "seed {seed}: errors {bad:?}\n{}\n{}",
        p.a.qp_dump(a.qpn).unwrap(),
        p.b.qp_dump(b.qpn).unwrap()
    );
    assert_eq!(got, expected_wc, "seed {seed}: completions in SQ order");
    assert_eq!(
        poll_all(&mut p.b, b.cq).len() as u64,
        recv_id,
        "seed {seed}"
    );
    assert!(
        p.b.mr_bytes(mb.lkey).unwrap() == expect_b,
        "seed {seed}: responder memory"
    );
    assert!(
        p.a.mr_bytes(ma.lkey).unwrap() == expect_a,
        "seed {seed}: requester memory"
    );
    // Every lease was returned.
    assert!(p.a.dereg_mr(ma.lkey).is_ok());
}

#[test]
fn random_ops_no_loss() {
    for seed in 0..20 {
        run(seed, 60, 0);
    }
}

#[test]
fn random_ops_with_loss() {
    for seed in 100..130 {
        run(seed, 60, 5);
    }
}

#[test]
#[ignore]
fn many_seeds() {
    let n: u64 = std::env::var("SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(300);
    let loss: u64 = std::env::var("LOSS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    let start: u64 = std::env::var("START")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1000);
    for seed in start..start + n {
        run(seed, 100, loss);
    }
}

/// Throughput of the two engines in one thread (no link): `cargo test --release -p roce-proto perf_pair -- --ignored
/// --nocapture`.
#[test]
#[ignore]
fn perf_pair() {
    for (size, mtu) in [
        (4096u32, Mtu::Mtu4096),
        (65536, Mtu::Mtu4096),
        (64, Mtu::Mtu1024),
    ] {
        let o = ConnOpts {
            mtu,
            sq_sig_all: false,
            cap: QpCap {
                max_send_wr: 1024,
                max_recv_wr: 1024,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            ..ConnOpts::default()
        };
        let mut p = Pair::new();
        let (a, b) = connect(&mut p, &o);
        let ma = mr(&mut p.a, a.pd, size as usize, |i| i as u8);
        let mb = mr(&mut p.b, b.pd, size as usize, |_| 0);
        let s = [sge(&ma, 0, size)];
        let n = if size >= 4096 {
            100_000 * 4096 / u64::from(size)
        } else {
            500_000
        };
        let t0 = std::time::Instant::now();
        let mut buf = vec![0u8; 9000];
        let mut frames = 0u64;
        let mut posted = 0u64;
        while posted < n {
            let k = 64.min(n - posted);
            let wrs: Vec<_> = (0..k)
                .map(|i| {
                    SendWr::new(
                        posted + i,
                        SendOp::RdmaWrite {
                            remote_addr: mb.addr,
                            rkey: mb.rkey,
                        },
                        &s,
                    )
                })
                .collect();
            p.a.post_send(a.qpn, &wrs).unwrap();
            posted += k;
            loop {
                let mut moved = false;
                while let Some(m) = p.a.poll_transmit(p.now, &mut buf) {
                    p.b.handle_frame(p.now, &buf[..m.len]);
                    frames += 1;
                    moved = true;
                }
                while let Some(m) = p.b.poll_transmit(p.now, &mut buf) {
                    p.a.handle_frame(p.now, &buf[..m.len]);
                    moved = true;
                }
                if !moved {
                    break;
                }
            }
        }
        let dt = t0.elapsed();
        assert_eq!(p.a.qp_info(a.qpn).unwrap().sq_outstanding, 0);
        eprintln!(
            "RDMA WRITE {size} B, PMTU {}: {n} msgs, {frames} data frames in {:?}: {:.0} ns/frame (both engines), {:.2} Gbit/s payload",
            mtu.bytes(),
            dt,
            dt.as_nanos() as f64 / frames as f64,
            (n * u64::from(size) * 8) as f64 / dt.as_secs_f64() / 1e9
        );
    }
}

#[test]
fn many_qps_share_the_port_fairly_under_loss() {
    let mut p = Pair::new();
    let o = ConnOpts {
        timeout: 6,
        ..ConnOpts::default()
    };
    let mut lr = Rng(77);
    p.filter = Box::new(move |_, _| lr.below(100) >= 2);
    let mut conns = Vec::new();
    for q in 0..16u64 {
        let (a, b) = connect(&mut p, &o);
        let ma = mr(&mut p.a, a.pd, 64 * 1024, move |i| (i as u64 * 7 + q) as u8);
        let mb = mr(&mut p.b, b.pd, 64 * 1024, |_| 0);
        conns.push((a, b, ma, mb));
    }
    for (a, b, ma, mb) in &conns {
        for k in 0..8u64 {
            p.b.post_recv(
                b.qpn,
                &[RecvWr {
                    wr_id: k,
                    sg_list: &[sge(mb, k * 8192, 8192)],
                }],
            )
            .unwrap();
        }
        let sges: Vec<[Sge; 1]> = (0..8u64)
            .map(|k| [sge(ma, k * 8192, 5000 + k as u32)])
            .collect();
        let wrs: Vec<_> = sges
            .iter()
            .enumerate()
            .map(|(k, s)| SendWr::new(k as u64, SendOp::Send, s))
            .collect();
        p.a.post_send(a.qpn, &wrs).unwrap();
    }
    // Round-robin: after the first 16 data frames every QP has sent at least one packet.
    let mut buf = vec![0u8; 9000];
    let mut first: Vec<Qpn> = Vec::new();
    for _ in 0..16 {
        let m = p.a.poll_transmit(p.now, &mut buf).unwrap();
        first.push(m.qpn);
        p.b.handle_frame(p.now, &buf[..m.len]);
    }
    first.sort();
    first.dedup();
    assert_eq!(first.len(), 16, "one packet per runnable QP per round");
    p.drive_for(Duration::from_secs(5));
    for (a, b, ma, mb) in &conns {
        let wa = poll_all(&mut p.a, a.cq);
        assert_eq!(wa.len(), 8);
        assert!(wa.iter().all(|w| w.status == WcStatus::Success));
        let wb = poll_all(&mut p.b, b.cq);
        assert_eq!(
            wb.iter().map(|w| w.byte_len).collect::<Vec<_>>(),
            (0..8).map(|k| 5000 + k).collect::<Vec<_>>()
        );
        for k in 0..8usize {
            let n = 5000 + k;
            assert_eq!(
                &p.b.mr_bytes(mb.lkey).unwrap()[k * 8192..k * 8192 + n],
                &p.a.mr_bytes(ma.lkey).unwrap()[k * 8192..k * 8192 + n]
            );
        }
    }
}

/// SENDs racing receive posting (RNR NAKs) under loss: everything completes once, in order, byte-exact.
fn run_rnr(seed: u64, loss_pct: u64) -> u64 {
    let mut rng = Rng(seed);
    let o = ConnOpts {
        mtu: Mtu::Mtu1024,
        timeout: 6,
        min_rnr_timer: 1 + rng.below(4) as u8,
        rnr_retry: 7,
        ..ConnOpts::default()
    };
    let mut p = Pair::new();
    let (a, b) = connect(&mut p, &o);
    let n = 40u64;
    let ma = mr(&mut p.a, a.pd, (SLOT * n) as usize, |i| {
        (i as u64 * 13 + seed) as u8
    });
    let mb = mr(&mut p.b, b.pd, (SLOT * n) as usize, |_| 0);
    let mut lr = Rng(seed ^ 0x5555);
    p.filter = Box::new(move |_, _| lr.below(100) >= loss_pct);
    let lens: Vec<u32> = (0..n).map(|_| rng.below(5000) as u32).collect();
    let sges: Vec<[Sge; 1]> = (0..n)
        .map(|i| [sge(&ma, i * SLOT, lens[i as usize])])
        .collect();
    let wrs: Vec<_> = sges
        .iter()
        .enumerate()
        .map(|(i, s)| SendWr::new(i as u64, SendOp::Send, s))
        .collect();
    p.a.post_send(a.qpn, &wrs).unwrap();
    let mut posted = 0u64;
    while posted < n {
        p.drive_for(Duration::from_micros(rng.below(300)));
        let k = (1 + rng.below(6)).min(n - posted);
        for j in posted..posted + k {
            p.b.post_recv(
                b.qpn,
                &[RecvWr {
                    wr_id: j,
                    sg_list: &[sge(&mb, j * SLOT, SLOT as u32)],
                }],
            )
            .unwrap();
        }
        posted += k;
    }
    p.drive_for(Duration::from_secs(30));
    let wa = poll_all(&mut p.a, a.cq);
    assert_eq!(
        wa.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        (0..n).map(|i| (i, WcStatus::Success)).collect::<Vec<_>>(),
        "seed {seed}"
    );
    let wb = poll_all(&mut p.b, b.cq);
    assert_eq!(
        wb.iter().map(|w| (w.wr_id, w.byte_len)).collect::<Vec<_>>(),
        (0..n).map(|i| (i, lens[i as usize])).collect::<Vec<_>>(),
        "seed {seed}"
    );
    for (i, &l) in lens.iter().enumerate() {
        let o = i * SLOT as usize;
        let l = l as usize;
        assert_eq!(
            &p.b.mr_bytes(mb.lkey).unwrap()[o..o + l],
            &p.a.mr_bytes(ma.lkey).unwrap()[o..o + l],
            "seed {seed} msg {i}"
        );
    }
    assert_counters_add_up(&p.a);
    assert_counters_add_up(&p.b);
    p.a.counters().rcvd_rnr_err
}

#[test]
fn sends_racing_receives_rnr_under_loss() {
    let mut rnr = 0;
    for seed in 0..15 {
        rnr += run_rnr(seed, if seed % 2 == 0 { 0 } else { 3 });
    }
    assert!(rnr > 0, "the schedule must actually produce RNR NAKs");
}

#[test]
#[ignore]
fn many_rnr_seeds() {
    let n: u64 = std::env::var("SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(300);
    for seed in 0..n {
        run_rnr(seed, seed % 5);
    }
}
