//! RDMA READ (and atomic) bandwidth under random loss, shaped like `rocev2 perf read-bw`
//! (`crates/roce-cli/src/perf/bench.rs` with roce-verbs `ConnectOpts::default()`): RC, PMTU 1024,
//! `max_rd_atomic` = `max_dest_rd_atomic` = 16, local ACK timeout 14 (≈67 ms), `retry_cnt` 7, 128 WRs posted, every
//! one signaled. READs of 3000 bytes need three response packets each, so loss hits the middle of response streams
//! and the requester re-requests partial READs (`ROCEV2.md §4.4`, `§5`). Loss is seeded and applies to both
//! directions.
//!
//! Every READ must complete successfully with the bytes of the responder's MR, every atomic with the value the
//! cell held before it (so each executed exactly once); no `RETRY_EXC_ERR`; and the responder must never have
//! dropped a duplicate READ/atomic for want of its saved state (`drop_stale_response`), since with loss alone (no
//! reordering) the requester only ever re-requests what the responder must still hold.
//!
//! The "slow responder" runs pace the responder's QP below the link rate and use a 1 ms link, so READ responses
//! (and replays for duplicate READs) wait in the responder's own queue while new READs arrive — what a loaded
//! machine does to `rocev2 perf`. Before the responder-resource fix (`roce-proto` `responder.rs`,
//! `alloc_resource`) most of those seeds ended in `RETRY_EXC_ERR` (measured: 7 of seeds 1..=8 for READs, 8 of 8
//! for the READ+atomic mix). `queued_replay_of_the_oldest_read_does_not_evict_a_newer_one` is the same failure
//! as one scripted timeline (it ended in `RETRY_EXC_ERR` after 7 dropped duplicates before the fix).
//!
//! `sweep_seeds` (ignored) sweeps seeds with the parameters taken from the environment, for investigation.

use std::time::Duration;

use roce_proto::*;
use roce_tests::*;

/// One run's parameters.
#[derive(Clone, Copy, Debug)]
struct ReadRun {
    /// Fault-injector seed (node i uses seed + i).
    seed: u64,
    /// Independent loss probability in both directions.
    loss: f64,
    /// READ length in bytes.
    size: u32,
    /// WRs to complete.
    iters: u64,
    /// WRs posted at once (perf `-t`).
    depth: u64,
    /// Every `atomic_every`-th WR is a FETCH_ADD instead of a READ (0: READs only).
    atomic_every: u64,
    /// Line rate of the simulated link.
    bandwidth_bps: u64,
    /// One-way propagation delay of the link.
    propagation: Duration,
    /// Pacing rate of the responder's QP in bit/s, per packet (0: unpaced). Below the link rate, READ responses wait in the
    /// responder's own queue (as when its CPU, not the wire, is the bottleneck), so duplicate READs and new READs
    /// meet queued response streams.
    responder_rate_bps: u64,
    /// Frames per step each node may transmit.
    tx_budget: usize,
}

impl Default for ReadRun {
    fn default() -> Self {
        ReadRun {
            seed: 1,
            loss: 0.05,
            size: 3000,
            iters: 400,
            depth: 128,
            atomic_every: 0,
            bandwidth_bps: 1_000_000_000,
            propagation: Duration::from_micros(5),
            responder_rate_bps: 0,
            tx_budget: 4,
        }
    }
}

impl ReadRun {
    /// The slow-responder shape: 10 Gb/s link with 1 ms propagation, responder paced to 1 Gb/s.
    fn slow_responder() -> ReadRun {
        ReadRun {
            bandwidth_bps: 10_000_000_000,
            propagation: Duration::from_millis(1),
            responder_rate_bps: 1_000_000_000,
            ..ReadRun::default()
        }
    }
}

/// Counters of a successful run.
#[derive(Clone, Debug)]
struct ReadOutcome {
    requester: Counters,
    responder: Counters,
}

/// Destination slots (and source regions / atomic cells) reused round-robin.
const SLOTS: u64 = 64;

/// Frames of the capture to print on failure (`READ_LOSS_DUMP=n`; capture is off without it).
fn dump_len() -> usize {
    std::env::var("READ_LOSS_DUMP")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Runs `r`; `Err` describes the first failed or out-of-order completion, a data mismatch or a stall.
fn run(r: ReadRun) -> Result<ReadOutcome, String> {
    let cfg = PairConfig {
        capture: dump_len() > 0,
        fault_seed: r.seed,
        tx_budget: r.tx_budget,
        sim: SimConfig {
            bandwidth_bps: r.bandwidth_bps,
            propagation: r.propagation,
            ..SimConfig::default()
        },
        ..PairConfig::default()
    };
    let mut p = Pair::with_config(cfg);
    let o = ConnOpts {
        mtu: Mtu::Mtu1024,
        max_rd_atomic: 16,
        max_dest_rd_atomic: 16,
        timeout: 14,
        retry_cnt: 7,
        ..ConnOpts::default()
    };
    let (a, b) = connect(&mut p, &o);
    if r.responder_rate_bps > 0 {
        p.b()
            .set_qp_rate_limit(b.qpn, Some(r.responder_rate_bps), Some(0))
            .map_err(|e| format!("{e:?}"))?;
    }
    let slot = u64::from(r.size.max(8)).div_ceil(64) * 64;
    let len = (SLOTS * slot) as usize;
    let dst = reg(&mut p, a, len, |_| 0);
    // The responder's buffer: a position-dependent pattern, so a response from the wrong READ or offset is caught.
    let src = reg(&mut p, b, len, |i| (i.wrapping_mul(131) ^ (i >> 8)) as u8);
    let cells = reg(&mut p, b, (SLOTS * 8) as usize, |_| 0);
    let src_bytes = p.e(1).mr_bytes(src.lkey).expect("src").to_vec();
    // FETCH_ADD cell k adds 1 per use; the value returned to use number n of cell k must be n.
    let mut cell_uses = [0u64; SLOTS as usize];
    let mut expect_orig = std::collections::VecDeque::new();
    p.set_faults_all(FaultConfig {
        loss: r.loss,
        ..FaultConfig::default()
    });
    let is_atomic = |n: u64| r.atomic_every > 0 && n % r.atomic_every == r.atomic_every - 1;
    let (mut posted, mut done) = (0u64, 0u64);
    let mut wcs = vec![Wc::default(); 256];
    while done < r.iters {
        while posted < r.iters && posted < done + r.depth.min(SLOTS) {
            let k = posted % SLOTS;
            let (op, sg) = if is_atomic(posted) {
                expect_orig.push_back(cell_uses[k as usize]);
                cell_uses[k as usize] += 1;
                (
                    SendOp::AtomicFetchAndAdd {
                        remote_addr: cells.addr + k * 8,
                        rkey: cells.rkey,
                        add: 1,
                    },
                    [sge(&dst, k * slot, 8)],
                )
            } else {
                (
                    SendOp::RdmaRead {
                        remote_addr: src.addr + k * slot,
                        rkey: src.rkey,
                    },
                    [sge(&dst, k * slot, r.size)],
                )
            };
            let wr = SendWr::new(posted, op, &sg).signaled();
            p.a()
                .post_send(a.qpn, &[wr])
                .map_err(|e| format!("{e:?}"))?;
            posted += 1;
        }
        let seen = p.drive_until(Duration::from_secs(30), |p| {
            p.nodes[0].engine.cq_len(a.cq) > 0
        });
        let n = p.a().poll_cq(a.cq, &mut wcs);
        if !seen && n == 0 {
            return Err(format!(
                "stalled at {done}/{} completions; requester {:?}; responder {:?}",
                r.iters,
                p.counters(0),
                p.counters(1)
            ));
        }
        for w in &wcs[..n] {
            if (w.wr_id, w.status) != (done, WcStatus::Success) {
                return Err(format!(
                    "completion {done}: got wr_id {} {:?}; requester {:?}; responder {:?}\n{}",
                    w.wr_id,
                    w.status,
                    p.counters(0),
                    p.counters(1),
                    p.dump(dump_len())
                ));
            }
            let off = ((done % SLOTS) * slot) as usize;
            let mine = p.e(0).mr_bytes(dst.lkey).expect("dst");
            if is_atomic(done) {
                let mut v = [0u8; 8];
                v.copy_from_slice(&mine[off..off + 8]);
                let want = expect_orig.pop_front();
                if Some(u64::from_le_bytes(v)) != want {
                    return Err(format!(
                        "atomic {done}: original value {} (expected {want:?})",
                        u64::from_le_bytes(v)
                    ));
                }
            } else if mine[off..off + r.size as usize] != src_bytes[off..off + r.size as usize] {
                return Err(format!("READ {done}: data differs from the responder's MR"));
            }
            // Clear the slot so the next WR into it must really land.
            p.a()
                .mr_write(dst.lkey, off, &vec![0u8; slot as usize])
                .expect("dst");
            done += 1;
        }
    }
    let responder = p.counters(1);
    if responder.drop_stale_response != 0 {
        return Err(format!(
            "the responder dropped {} duplicate READ/atomic requests without saved state: {responder:?}",
            responder.drop_stale_response
        ));
    }
    Ok(ReadOutcome {
        requester: p.counters(0),
        responder,
    })
}

/// Runs `base` for each seed in `seeds`; panics listing every failing seed. Checks that loss really caused
/// retransmissions and duplicate requests.
fn assert_all_pass(base: ReadRun, seeds: std::ops::RangeInclusive<u64>) {
    let mut fails = Vec::new();
    for seed in seeds {
        match run(ReadRun { seed, ..base }) {
            Ok(out) => {
                assert!(
                    out.requester.retransmitted_pkts > 0 && out.responder.duplicate_request > 0,
                    "seed {seed}: loss caused no retransmission: {out:?}"
                );
            }
            Err(e) => fails.push((seed, e)),
        }
    }
    assert!(
        fails.is_empty(),
        "{} seeds failed with {base:?}: {fails:#?}",
        fails.len()
    );
}

/// 3000-byte READs (3 response packets each) at 5% loss both ways, responder at line rate.
#[test]
fn read_bw_multi_packet_under_loss() {
    assert_all_pass(ReadRun::default(), 1..=8);
}

/// The same with the responder slower than the link: response streams and replays queue at the responder while
/// new READs arrive. This is the `rocev2 perf read-bw` failure of the netns test
/// (`rc_read_bw_multi_packet_under_loss`): before the fix a new READ skipped the resource whose replay was still
/// queued and overwrote a newer one the requester still needed.
#[test]
fn read_bw_multi_packet_under_loss_slow_responder() {
    assert_all_pass(ReadRun::slow_responder(), 1..=8);
}

/// READs and FETCH_ADDs (every 4th WR) share the responder resources: a duplicate atomic must be answered from its
/// saved result (never re-executed) however new READs recycle the ring.
#[test]
fn reads_and_atomics_under_loss_slow_responder() {
    assert_all_pass(
        ReadRun {
            atomic_every: 4,
            ..ReadRun::slow_responder()
        },
        1..=8,
    );
}

/// Seed sweep for investigation: `cargo test -p roce-tests --release --test read_loss -- --ignored --nocapture`.
/// Environment: `READ_LOSS_SEEDS` (count, default 200), `READ_LOSS_FIRST` (first seed), `READ_LOSS_SLOW=1` (slow
/// responder shape), `READ_LOSS_LOSS`, `READ_LOSS_SIZE`, `READ_LOSS_ATOMIC_EVERY`, `READ_LOSS_BW` (link bit/s),
/// `READ_LOSS_PROP_US`, `READ_LOSS_RATE` (responder pacing bit/s), `READ_LOSS_BUDGET`, `READ_LOSS_DUMP` (frames
/// to print on failure).
#[test]
#[ignore = "seed sweep for investigation; the fixed-seed tests run by default"]
fn sweep_seeds() {
    fn env<T: std::str::FromStr>(k: &str) -> Option<T> {
        std::env::var(k).ok().and_then(|v| v.parse().ok())
    }
    let n: u64 = env("READ_LOSS_SEEDS").unwrap_or(200);
    let first: u64 = env("READ_LOSS_FIRST").unwrap_or(1);
    let mut base = if env::<u8>("READ_LOSS_SLOW") == Some(1) {
        ReadRun::slow_responder()
    } else {
        ReadRun::default()
    };
    if let Some(v) = env("READ_LOSS_LOSS") {
        base.loss = v;
    }
    if let Some(v) = env("READ_LOSS_SIZE") {
        base.size = v;
    }
    if let Some(v) = env("READ_LOSS_ATOMIC_EVERY") {
        base.atomic_every = v;
    }
    if let Some(v) = env("READ_LOSS_BW") {
        base.bandwidth_bps = v;
    }
    if let Some(v) = env("READ_LOSS_PROP_US") {
        base.propagation = Duration::from_micros(v);
    }
    if let Some(v) = env("READ_LOSS_RATE") {
        base.responder_rate_bps = v;
    }
    if let Some(v) = env("READ_LOSS_BUDGET") {
        base.tx_budget = v;
    }
    let mut fails = 0;
    for seed in first..first + n {
        if let Err(e) = run(ReadRun { seed, ..base }) {
            fails += 1;
            println!("seed {seed}: {e}");
        }
    }
    println!("{base:?}: {fails} of {n} seeds failed");
    assert_eq!(fails, 0);
}

/// The failure in slow motion (two responder resources, three 3000-byte READs X, Y, Z; a 1 ms link; a local ACK
/// timeout of ≈1 ms, so the requester retries X and Y while their responses are still on the wire; the responder
/// paced to 25 Mb/s, so its response streams queue):
///
/// 1. X and Y are executed (resources 0 and 1); X's stream leaves; the spurious timeout re-requests X and Y.
/// 2. Duplicate X finds X's stream gone and queues a replay of X; duplicate Y queues Y's again.
///    The restarted Y MIDDLE is dropped (scripted), so the requester still needs Y.
/// 3. X's original responses complete X; the requester sends Z.
/// 4. Z must take resource 0 (X, completed). The old rule skipped a busy resource 0 and overwrote Y, so every
///    re-request of Y's rest was dropped (`drop_stale_response`, 7 times) until `RETRY_EXC_ERR` — the symptom seen
///    in the netns test.
///
/// When this test was written, X's replay went behind Y's queued stream and was still queued when Z arrived (the
/// case `alloc_resource` handles by dropping it). Since a duplicate READ's replay goes before the streams queued for
/// later PSNs (`duplicate_read_is_answered_before_later_queued_streams`), X's replay leaves at once and Z finds
/// nothing of X queued; the seeded slow-responder runs above still recycle resources under loss.
#[test]
fn queued_replay_of_the_oldest_read_does_not_evict_a_newer_one() {
    let cfg = PairConfig {
        sim: SimConfig {
            bandwidth_bps: 10_000_000_000,
            propagation: Duration::from_millis(1),
            ..SimConfig::default()
        },
        ..PairConfig::default()
    };
    let mut p = Pair::with_config(cfg);
    let o = ConnOpts {
        max_rd_atomic: 2,
        max_dest_rd_atomic: 2,
        timeout: 8,
        retry_cnt: 7,
        ..ConnOpts::default()
    };
    let (a, b) = connect(&mut p, &o);
    p.b()
        .set_qp_rate_limit(b.qpn, Some(25_000_000), Some(0))
        .expect("rate limit");
    let dst = reg(&mut p, a, 3 * 4096, |_| 0);
    let src = reg(&mut p, b, 3 * 4096, |i| (i * 7 + (i >> 8)) as u8);
    // Responder frames: X F/M/L, Y F, Y F (restart), Y M (restart) ← dropped.
    p.faults(1).script_tx([
        Fault::Pass,
        Fault::Pass,
        Fault::Pass,
        Fault::Pass,
        Fault::Pass,
        Fault::Drop,
    ]);
    let sgs: Vec<[Sge; 1]> = (0..3).map(|k| [sge(&dst, k * 4096, 3000)]).collect();
    let wrs: Vec<SendWr> = (0..3u64)
        .map(|k| {
            SendWr::new(
                k,
                SendOp::RdmaRead {
                    remote_addr: src.addr + k * 4096,
                    rkey: src.rkey,
                },
                &sgs[k as usize],
            )
            .signaled()
        })
        .collect();
    p.a().post_send(a.qpn, &wrs).expect("post_send");
    p.drive_for(Duration::from_millis(100));
    let wc = poll_all(p.a(), a.cq);
    let log = p.dump(60);
    let statuses: Vec<(u64, WcStatus)> = wc.iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(
        statuses,
        vec![
            (0, WcStatus::Success),
            (1, WcStatus::Success),
            (2, WcStatus::Success)
        ],
        "{log}"
    );
    let want = p.e(1).mr_bytes(src.lkey).expect("src").to_vec();
    let got = p.e(0).mr_bytes(dst.lkey).expect("dst");
    for k in 0..3 {
        let r = k * 4096..k * 4096 + 3000;
        assert!(got[r.clone()] == want[r], "READ {k}: wrong data");
    }
    assert_eq!(p.counters(1).drop_stale_response, 0, "{log}");
    // The preconditions really occurred: X was replayed (X FIRST sent twice, the second time before Z was sent: the
    // replay went ahead of Y's stream), and Y's rest was re-requested.
    let z_sent = p
        .captured
        .iter()
        .find(|c| c.from == 0 && Pkt::parse(&c.frame).is_some_and(|k| k.psn == 106))
        .map(|c| c.at)
        .expect("Z sent");
    let x_first: Vec<Instant> = p
        .captured
        .iter()
        .filter(|c| c.from == 1)
        .filter(|c| Pkt::parse(&c.frame).is_some_and(|k| k.psn == 100 && k.opcode == 0x0D))
        .map(|c| c.at)
        .collect();
    assert!(
        x_first.len() == 2 && x_first[1] < z_sent,
        "X not replayed ahead of Y's stream: {x_first:?}, Z at {z_sent}\n{log}"
    );
    assert!(
        p.sent_by(0)
            .iter()
            .any(|k| k.psn == 104 && k.reth.is_some_and(|r| r.2 == 3000 - 1024)),
        "Y's rest was not re-requested\n{log}"
    );
}

/// A duplicate READ is answered before the response streams the responder has queued for later READs (issue #10,
/// found while classifying the `read-bw -a` retries): 16 posted 64 KiB READs (64 response packets each at PMTU
/// 1024; the requester's 128-PSN window lets three be outstanding), the responder paced to 50 Mb/s so their streams
/// queue, the local ACK timeout of `rocev2 perf` (14, ≈67 ms) and `retry_cnt` 7. The LAST response packet of READ 0
/// is lost after READ 0's stream has left the queue; READ 1's FIRST response is then an implied NAK and the
/// requester goes back to READ 0's last packet, re-requesting READ 0's rest and the READs after it (`ROCEV2.md
/// §4.4`, go-back-N).
///
/// The requester takes responses only in PSN order from its resume point, so everything the responder sends for
/// later READs before READ 0's replay is discarded. The old rule appended the replay behind the queued streams of
/// READs 1 and 2 (and each re-requested READ restarted its queued stream in place), so recovery waited for the local
/// ACK timeout: one `local_ack_timeout_err` and a second retry here (three with a 4096-PSN window), a 67 ms stall
/// per lost tail packet. Responses go in PSN order (IBTA: the responder answers requests in the PSN order it
/// received them; rxe `rxe_resp.c` `duplicate_request` makes the duplicate the current reply at once): a duplicate
/// READ at PSN p drops what is queued for PSNs after p — the rewound requester asks for all of it again — and its
/// replay is next. One loss, one retry, no timeout.
#[test]
fn duplicate_read_is_answered_before_later_queued_streams() {
    const N: u64 = 16;
    const LEN: u32 = 64 << 10;
    let mut p = Pair::with_config(PairConfig {
        sim: SimConfig {
            bandwidth_bps: 10_000_000_000,
            propagation: Duration::from_micros(20),
            ..SimConfig::default()
        },
        ..PairConfig::default()
    });
    let o = ConnOpts {
        mtu: Mtu::Mtu1024,
        max_rd_atomic: 16,
        max_dest_rd_atomic: 16,
        timeout: 14,
        retry_cnt: 7,
        ..ConnOpts::default()
    };
    let (a, b) = connect(&mut p, &o);
    p.b()
        .set_qp_rate_limit(b.qpn, Some(50_000_000), Some(0))
        .expect("rate limit");
    let total = (N * u64::from(LEN)) as usize;
    let dst = reg(&mut p, a, total, |_| 0);
    let src = reg(&mut p, b, total, |i| (i.wrapping_mul(131) ^ (i >> 8)) as u8);
    // The responder's frames: READ 0's 63 FIRST/MIDDLE pass, its LAST is lost.
    let pkts = LEN / 1024;
    p.faults(1).script_tx((0..pkts).map(|k| {
        if k + 1 < pkts {
            Fault::Pass
        } else {
            Fault::Drop
        }
    }));
    let sgs: Vec<[Sge; 1]> = (0..N)
        .map(|k| [sge(&dst, k * u64::from(LEN), LEN)])
        .collect();
    let wrs: Vec<SendWr> = (0..N)
        .map(|k| {
            SendWr::new(
                k,
                SendOp::RdmaRead {
                    remote_addr: src.addr + k * u64::from(LEN),
                    rkey: src.rkey,
                },
                &sgs[k as usize],
            )
            .signaled()
        })
        .collect();
    p.a().post_send(a.qpn, &wrs).expect("post_send");
    let done = p.drive_until(Duration::from_secs(5), |p| {
        p.nodes[0].engine.cq_len(a.cq) >= N as usize
    });
    let wc = poll_all(p.a(), a.cq);
    let statuses: Vec<(u64, WcStatus)> = wc.iter().map(|w| (w.wr_id, w.status)).collect();
    let want: Vec<(u64, WcStatus)> = (0..N).map(|k| (k, WcStatus::Success)).collect();
    let (req, resp) = (p.counters(0), p.counters(1));
    assert!(
        done && statuses == want,
        "completions {statuses:?}\nrequester {req:?}\nresponder {resp:?}"
    );
    let src_bytes = p.e(1).mr_bytes(src.lkey).expect("src").to_vec();
    assert!(
        p.e(0).mr_bytes(dst.lkey).expect("dst") == src_bytes[..],
        "READ data differs from the responder's MR"
    );
    // One loss, one retry: the implied NAK's; no local ACK timeout.
    assert_eq!(
        (req.local_ack_timeout_err, req.implied_nak_seq_err),
        (0, 1),
        "requester {req:?}"
    );
}
