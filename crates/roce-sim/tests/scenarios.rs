//! E1–E8 of `docs/spec/DCQCN.md` §6, each asserting that section's pass/fail bands on the shipped scenario
//! file, and determinism (same scenario and seed → byte-identical CSV). Run in release:
//! `cargo test --release -p roce-sim --test scenarios`.

use std::path::PathBuf;

use roce_sim::scenario::MarkAt;
use roce_sim::{Scenario, Sim, Summary};

fn load(name: &str) -> Scenario {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("scenarios")
        .join(name);
    Scenario::load(&p).unwrap_or_else(|e| panic!("{e}"))
}

fn run(name: &str) -> (Scenario, Sim, Summary) {
    run_sc(load(name))
}

/// The scenario as shipped (marking at enqueue) and with marking at dequeue: `DCQCN.md` §6's bands cover both.
fn both_marking(name: &str) -> [(Scenario, Sim, Summary); 2] {
    let sc = load(name);
    assert_eq!(sc.switch.mark, MarkAt::Enqueue);
    let mut deq = sc.clone();
    deq.switch.mark = MarkAt::Dequeue;
    [run_sc(sc), run_sc(deq)]
}

fn run_sc(sc: Scenario) -> (Scenario, Sim, Summary) {
    let mut sim = Sim::new(&sc).unwrap_or_else(|e| panic!("{e}"));
    let t = std::time::Instant::now();
    sim.run();
    let s = sim.recorder.summary(&sc);
    eprintln!("{}{} events in {:.2?}", s.table(), sim.events, t.elapsed());
    (sc, sim, s)
}

#[test]
fn e1_single_flow_no_congestion() {
    let (sc, sim, s) = run("e1_single_flow.toml");
    assert_eq!(sim.switch.marks, 0, "E1: no CE marks");
    assert_eq!(s.cnps, 0, "E1: no CNPs");
    assert_eq!(sim.switch.drops, 0);
    // RC = C at every bin end.
    let c = sc.link.rate_gbps * 1e9;
    for b in &sim.recorder.bins[0] {
        assert_eq!(b.rc_bps, c, "E1: RC = C at every instant");
    }
    // Goodput = C · payload / wire size ± 0.1 %: wire throughput = C ± 0.1 %.
    let t = s.flows[0].throughput_gbps;
    assert!(
        (t - sc.link.rate_gbps).abs() <= 0.001 * sc.link.rate_gbps,
        "E1: throughput {t} Gb/s"
    );
    assert!(
        s.queue_max_bytes <= 2 * 1100,
        "E1: max queue {} B > 2 packets",
        s.queue_max_bytes
    );
    // Percentiles never exceed the largest depth seen (a histogram bucket's upper edge did: p99 1.5 KB, max 1.1 KB).
    for p in [s.queue_p50_bytes, s.queue_p95_bytes, s.queue_p99_bytes] {
        assert!(
            p <= s.queue_max_bytes as f64,
            "E1: percentile {p} B above the max {} B",
            s.queue_max_bytes
        );
    }
}

/// Asserts `lo ≤ v ≤ hi` with the quantity's name in the message.
fn band(what: &str, v: f64, lo: f64, hi: f64) {
    assert!((lo..=hi).contains(&v), "{what} = {v}, band [{lo}, {hi}]");
}

/// Runs the oracle `testdata/dcqcn/rp_reference.py` (paper profile) for one flow at `line_gbps` with CNPs arriving
/// at `cnp_us`, to `end_us`, sampling RC every `sample_us`; its JSON output. `None` when python3 is missing.
fn oracle(
    line_gbps: f64,
    cnp_us: &[f64],
    end_us: f64,
    sample_us: f64,
    tx: Option<&[(u64, u32)]>,
) -> Option<serde_json::Value> {
    let has_python = std::process::Command::new("python3")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !has_python {
        return None;
    }
    let script =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/dcqcn/rp_reference.py");
    let out = std::env::temp_dir().join(format!(
        "roce-sim-oracle-{}-{:?}.json",
        std::process::id(),
        std::thread::current().id()
    ));
    let cnps: Vec<String> = cnp_us.iter().map(|t| t.to_string()).collect();
    let mut cmd = std::process::Command::new("python3");
    cmd.arg(&script);
    let tx_path = out.with_extension("tx.json");
    if let Some(tx) = tx {
        let list: Vec<(f64, u32)> = tx.iter().map(|&(t, b)| (t as f64 / 1e3, b)).collect();
        std::fs::write(&tx_path, serde_json::to_string(&list).unwrap()).unwrap();
        cmd.arg("--tx-json").arg(&tx_path);
    }
    let st = cmd
        .args(["--profile", "paper", "--line-gbps", &line_gbps.to_string()])
        .arg(format!("--cnp-us={}", cnps.join(",")))
        .args(["--end-us", &end_us.to_string()])
        .args(["--sample-us", &sample_us.to_string()])
        .arg("--out")
        .arg(&out)
        .output()
        .expect("python3");
    assert!(
        st.status.success(),
        "oracle: {}",
        String::from_utf8_lossy(&st.stderr)
    );
    let o = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    let _ = std::fs::remove_file(&out);
    let _ = std::fs::remove_file(&tx_path);
    Some(o)
}

/// E2: the impulse response of the engine's RP in the network equals the oracle `rp_reference.py` (paper profile)
/// run with the CNP's measured arrival time: RC on the 10-µs sample grid within 1e-9 relative (`DCQCN.md` §5.2),
/// up to the oracle's first byte-counter event (its fluid byte counter integrates RC, ours counts the frames the
/// link really carried; §5.2 allows one packet time there). Skipped with a message when python3 is missing.
#[test]
fn e2_impulse_response_matches_the_oracle() {
    let (sc, sim, s) = run("e2_impulse.toml");
    assert_eq!(s.cnps, 1, "E2: exactly one CNP");
    assert_eq!(sim.switch.marks, 1, "E2: the forced mark only");
    let t_cnp = sim.recorder.cnp_times[0][0];
    let sample = sc.rc_sample_us.expect("E2 samples RC");
    let Some(o) = oracle(
        sc.link.rate_gbps,
        &[t_cnp as f64 / 1e3],
        sc.duration_ms * 1e3,
        sample,
        None,
    ) else {
        eprintln!("SKIPPED (e2 oracle comparison): python3 is needed to run the oracle");
        return;
    };
    let events: Vec<(f64, String)> = o["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["t_us"].as_f64().unwrap(),
                e["event"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let first_byte = events
        .iter()
        .find(|e| e.1 == "byte")
        .map_or(f64::MAX, |e| e.0);
    band(
        "E2: no byte-counter event before +2 ms (µs after the CNP)",
        first_byte - t_cnp as f64 / 1e3,
        2000.0,
        f64::MAX,
    );
    let samples = o["samples_us_rc_bps"].as_array().unwrap();
    let mut compared = 0;
    let mut worst: f64 = 0.0;
    for (t_ns, rc) in &sim.recorder.rc_samples {
        let t_us = *t_ns as f64 / 1e3;
        if t_us >= first_byte || events.iter().any(|e| (e.0 - t_us).abs() < 0.001) {
            continue;
        }
        let k = (t_us / sample).round() as usize;
        let ot = samples[k][0].as_f64().unwrap();
        assert!(
            (ot - t_us).abs() < 1e-6,
            "sample grid: oracle {ot} µs vs ours {t_us} µs"
        );
        let orc = samples[k][1].as_f64().unwrap();
        let rel = (rc[0] - orc).abs() / orc;
        worst = worst.max(rel);
        assert!(
            rel <= 1e-9,
            "E2: RC at {t_us} µs: ours {} vs oracle {orc} (rel {rel})",
            rc[0]
        );
        compared += 1;
    }
    eprintln!(
        "E2: CNP at {t_cnp} ns, {compared} RC samples equal to the oracle (worst rel {worst:e})"
    );
    assert!(compared >= 200, "E2 compared only {compared} samples");
}

#[test]
fn e3_two_flows_fair_share_and_queue() {
    for (_, sim, s) in both_marking("e3_two_flows.toml") {
        for f in &s.flows {
            band("E3 per-flow Gb/s", f.throughput_gbps, 17.5, 22.5);
            band("E3 CNPs per ms per flow", f.cnps_per_ms, 0.8, 2.5);
        }
        band("E3 Jain of means", s.jain, 0.98, 1.0);
        band("E3 mean per-ms Jain", s.mean_bin_jain, 0.97, 1.0);
        band("E3 utilisation", s.utilisation, 0.97, 1.0);
        band("E3 mean queue KB", s.queue_mean_bytes / 1e3, 10.0, 30.0);
        band("E3 time above Kmax", s.above_kmax_fraction, 0.0, 0.005);
        assert_eq!(sim.switch.drops, 0);
    }
}

/// E3's marked-fraction band (0.1–0.5 %, the team's DCQCN reference, §6 E3; the repository's `docs/spec/DCQCN.md` has no E3 section) is not met, and the cause is the band,
/// not the simulator: the run marks 0.062 % of ECT packets in [20, 60] ms (111 of 177 938; seed 1, enqueue).
///
/// What was checked (issue #20, 2026-12-03):
/// * **The measurement matches §6's definition.** Window [20, 60] ms as §6 says; marks are counted where they are
///   decided, at the bottleneck egress (the only queue data frames meet: the senders' ports carry ACKs and CNPs,
///   which are not ECN-capable and not counted — ECT decisions in the window, 177 938, equal the data frames the
///   40-ms window carries at 39.4 Gb/s of 1106-B frames); data frames only; CNPs sit in the strict queue and are
///   never marked (§2.1). Enqueue and dequeue marking both miss the band.
/// * **The scenario matches §6's E3 setup:** 2 backlogged flows from 0, 40 Gb/s and 1 µs per link, ramp 5 KB /
///   200 KB / 1 %, 4 MB buffer (no drops), N = 50 µs, paper profile with §3's values (g 1/256, K = T = 55 µs,
///   B 10 MB, F 5, R_AI 40 Mb/s, R_HAI 200 Mb/s, R_min 100 Mb/s), 60 ms. One deviation: 1106-B frames on the wire
///   (PMTU 1024) instead of 1000 B; with 1016-B frames an earlier run marked 0.058–0.068 %, so not the cause.
/// * **The engine's RP is right:** `e3_rp_follows_the_oracle_under_e3s_cnps` feeds each E3 flow's CNP arrivals and
///   its real transmissions to `rp_reference.py`: RC equals the oracle within 1e-9 at all 6 000 samples of 60 ms,
///   byte-counter events included. So the CNP rate the flows need to hold the fair share (1.24–1.65 per ms per flow
///   here, in §6's band 0.8–2.5) is the paper profile's, and a mark almost always makes its own CNP (111 marks,
///   108 CNPs in the window): marked fraction ≈ CNPs per ms / data packets per ms (≈ 1.4 / 2 240).
/// * **The band disagrees with §6's own numbers.** §6's fluid fixed point for N = 2 at 40G is p* = 0.078 % (solved
///   again from §6's equations: 0.078 % with 1000-B packets, 0.086 % with our 1106-B frames), and at the fixed point
///   the marked fraction *is* p*: below 0.1 %. §6's DES reports 1.0–1.2 CNPs per ms per flow; at 0.1 % of 2 500
///   packets per ms per flow (1000 B at 20 G) a flow would see ≥ 2.5 marks per ms, i.e. two marks per CNP window
///   on average, with the queue "almost never above Kmax" and p ≤ 0.25 % below its p95 of 52 KB — which does not
///   fit. The mean-queue bound says the same: 0.01 · (18.8 − 5 + 2.75) KB / 195 KB ≈ 0.085 % at most for the DES's
///   largest mean queue (time below Kmin counted at Kmin).
/// * Measured here, seeds 1–5, enqueue and dequeue: 0.058–0.075 % in the window (mean queue 12.3–18.2 KB). Over the
///   whole run [0, 60] ms the fraction is 0.16–0.45 % (the start-up transient marks everything above Kmax): inside
///   the band, so the band probably came from a whole-run count.
///
/// Left failing (a looser band or another window would hide the disagreement) until the reference band is settled.
#[test]
#[ignore = "fails: 0.062 % marked vs band 0.1-0.5 %, below the band as DCQCN.md's own fixed point p* = 0.078 % is"]
fn e3_two_flows_marked_fraction() {
    let (_, _, s) = run("e3_two_flows.toml");
    band("E3 marked fraction", s.mark_fraction, 0.001, 0.005);
}

/// E3's RP in the network against the oracle: each flow's RC, sampled every 10 µs over the whole 60-ms run, equals
/// `rp_reference.py` (paper profile) fed with the CNP arrival instants that flow really saw, within 1e-9 relative,
/// up to the oracle's first byte-counter event (its fluid byte counter integrates RC, ours counts the frames sent,
/// `DCQCN.md` §5.2). So E3's CNP rate and marked fraction are what the paper-profile RP makes of that fabric, not an
/// RP defect. Skipped with a message when python3 is missing.
#[test]
fn e3_rp_follows_the_oracle_under_e3s_cnps() {
    let mut sc = load("e3_two_flows.toml");
    sc.rc_sample_us = Some(10.0);
    let mut sim = Sim::new(&sc).unwrap();
    sim.log_tx();
    sim.run();
    let r = &sim.recorder;
    let tx = sim.tx_log.as_ref().unwrap();
    for f in 0..sc.flows.len() {
        let cnp_us: Vec<f64> = r.cnp_times[f].iter().map(|&t| t as f64 / 1e3).collect();
        assert!(cnp_us.len() > 40, "E3 flow {f}: {} CNPs", cnp_us.len());
        let sent = &tx[sc.flows[f].sender];
        let Some(o) = oracle(
            sc.link.rate_gbps,
            &cnp_us,
            sc.duration_ms * 1e3,
            10.0,
            Some(sent),
        ) else {
            eprintln!("SKIPPED (e3 oracle comparison): python3 is needed to run the oracle");
            return;
        };
        let events: Vec<(f64, String)> = o["events"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| {
                (
                    e["t_us"].as_f64().unwrap(),
                    e["event"].as_str().unwrap().to_owned(),
                )
            })
            .collect();
        let first_byte = events
            .iter()
            .find(|e| e.1 == "byte")
            .map_or(f64::MAX, |e| e.0);
        let samples = o["samples_us_rc_bps"].as_array().unwrap();
        let (mut compared, mut worst) = (0, 0f64);
        for (t_ns, rc) in &r.rc_samples {
            let t_us = *t_ns as f64 / 1e3;
            if events.iter().any(|e| (e.0 - t_us).abs() < 0.001) {
                continue;
            }
            let k = (t_us / 10.0).round() as usize;
            let Some(s) = samples.get(k) else { continue };
            assert!((s[0].as_f64().unwrap() - t_us).abs() < 1e-6);
            let orc = s[1].as_f64().unwrap();
            let rel = (rc[f] - orc).abs() / orc;
            worst = worst.max(rel);
            assert!(
                rel <= 1e-9,
                "E3 flow {f}: RC at {t_us} µs: ours {} vs oracle {orc} (rel {rel})",
                rc[f]
            );
            compared += 1;
        }
        eprintln!(
            "E3 flow {f}: {} CNPs, {compared} RC samples equal to the oracle (worst rel {worst:e}), first oracle byte event at {first_byte} µs",
            cnp_us.len()
        );
        assert!(
            compared >= 5000,
            "E3 flow {f} compared only {compared} samples"
        );
    }
}

/// Per-bin throughput of flow `f`, Gb/s, with each bin's end in ms.
fn series(sim: &Sim, f: usize) -> Vec<(f64, f64)> {
    let r = &sim.recorder;
    let mut prev = 0u64;
    r.bin_ends
        .iter()
        .zip(&r.bins[f])
        .map(|(&t, b)| {
            let dt = (t - prev) as f64;
            prev = t;
            (t as f64 / 1e6, b.bytes as f64 * 8.0 / dt)
        })
        .collect()
}

/// Least-squares slope of the points, Gb/s per ms.
fn slope(pts: &[(f64, f64)]) -> f64 {
    let n = pts.len() as f64;
    let mx = pts.iter().map(|p| p.0).sum::<f64>() / n;
    let my = pts.iter().map(|p| p.1).sum::<f64>() / n;
    let sxy: f64 = pts.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    let sxx: f64 = pts.iter().map(|p| (p.0 - mx) * (p.0 - mx)).sum();
    sxy / sxx
}

#[test]
fn e4_late_joiner_convergence() {
    let (sc, sim, s) = run("e4_late_joiner.toml");
    let join = sc.flows[2].start_ms;
    assert_eq!(sc.bin_ms, 1.0, "E4 is measured in 1-ms bins");
    let new = series(&sim, 2);
    let after = |a: f64, b: f64| -> Vec<(f64, f64)> {
        new.iter()
            .copied()
            .filter(|&(t, _)| t > join + a && t <= join + b)
            .collect()
    };
    let first3 = after(0.0, 3.0);
    assert_eq!(first3.len(), 3);
    let lowest = first3.iter().map(|p| p.1).fold(f64::MAX, f64::min);
    band(
        "E4 newcomer's lowest per-ms Gb/s in the 3 ms after joining",
        lowest,
        0.0,
        4.0,
    );
    band(
        "E4 newcomer's ramp slope over the next 7 ms, Gb/s per ms",
        slope(&after(3.0, 10.0)),
        f64::MIN,
        0.8,
    );
    let conv = s
        .converge_ms
        .expect("E4: per-ms Jain ≥ 0.95 for 5 ms is reached");
    band("E4 convergence after the join, ms", conv, 10.0, 40.0);
    for f in &s.flows {
        band(
            "E4 long-run per-flow Gb/s",
            f.throughput_gbps,
            13.33 - 2.5,
            13.33 + 2.5,
        );
    }
    band("E4 Jain of means", s.jain, 0.98, 1.0);
    band("E4 mean queue KB", s.queue_mean_bytes / 1e3, 20.0, 40.0);
}

#[test]
fn e6_recovery_after_congestion_ends() {
    let (sc, sim, _) = run("e6_recovery.toml");
    let dep = sc.flows[1].stop_ms.expect("flow 2 stops");
    let c = sc.link.rate_gbps;
    let f1: Vec<(f64, f64)> = series(&sim, 0)
        .into_iter()
        .filter(|&(t, _)| t > dep)
        .collect();
    let reach = |frac: f64| f1.iter().find(|p| p.1 >= frac * c).map(|p| p.0 - dep);
    let t90 = reach(0.9).expect("E6: flow 1 reaches 0.9C");
    let t99 = reach(0.99).expect("E6: flow 1 reaches 0.99C");
    band("E6 time to 0.9C after the departure, ms", t90, 14.0, 22.0);
    band("E6 time to 0.99C after the departure, ms", t99, 15.0, 23.0);
    // Non-decreasing per-ms throughput except ≤ 1 ms of residual-queue effects; a drop of at most two full
    // packets (2 · 1106 B per ms = 0.018 Gb/s) is bin quantisation, not a decrease.
    let quantum = 2.0 * 1106.0 * 8.0 / 1e6;
    let decreases = f1.windows(2).filter(|w| w[1].1 < w[0].1 - quantum).count();
    band(
        "E6 bins with decreasing throughput after the departure",
        decreases as f64,
        0.0,
        1.0,
    );
    // Linear phase: from the end of fast recovery (+1 ms) to well before 0.9C.
    let lin: Vec<(f64, f64)> = f1
        .iter()
        .copied()
        .filter(|&(t, _)| t > dep + 2.0 && t <= dep + 14.0)
        .collect();
    band(
        "E6 linear-phase slope, Gb/s per ms",
        slope(&lin),
        0.73 - 0.08,
        0.73 + 0.08,
    );
}

#[test]
fn e5_incast_8() {
    for (sc, sim, s) in both_marking("e5_incast_8.toml") {
        for f in &s.flows {
            band("E5 per-flow Gb/s", f.throughput_gbps, 3.8, 6.2);
            band("E5 CNPs per ms per flow", f.cnps_per_ms, 1.8, 2.8);
        }
        band("E5 Jain of means", s.jain, 0.97, 1.0);
        band("E5 utilisation", s.utilisation, 0.95, 1.0);
        band("E5 mean queue KB", s.queue_mean_bytes / 1e3, 55.0, 110.0);
        // p95 ≤ Kmax + 2 packets (a full frame is 1082 B).
        band(
            "E5 p95 queue B",
            s.queue_p95_bytes,
            0.0,
            (sc.switch.kmax_bytes + 2 * 1082) as f64,
        );
        band("E5 time above Kmax", s.above_kmax_fraction, 0.0, 0.03);
        // "No flow ever receives two CNPs < 50 µs apart": the NP spaces its decisions by N, but a CNP leaves the
        // receiver's NIC only once the frame in service there is out (links are not preemptive), so two CNPs of one flow
        // may leave — and arrive — up to one frame time (a full frame: 1106 B at 40 Gb/s = 221 ns) closer than N.
        let frame_us = 1106.0 * 8.0 / (sc.link.rate_gbps * 1e3);
        let sent = s.min_cnp_sent_gap_us.expect("E5 flows get CNPs");
        let got = s.min_cnp_gap_us.expect("E5 flows get CNPs");
        band(
            "E5 min CNP gap at the NP, µs",
            sent,
            sc.cc.np_interval_us - frame_us,
            f64::MAX,
        );
        band(
            "E5 min CNP gap at the RP, µs",
            got,
            sc.cc.np_interval_us - frame_us,
            f64::MAX,
        );
        assert_eq!(sim.switch.drops, 0);
    }
}

#[test]
fn e8_incast_16_beyond_the_ramp() {
    for (_, _, s) in both_marking("e8_incast_16.toml") {
        band("E8 time above Kmax", s.above_kmax_fraction, 0.02, 1.0);
        band("E8 marked fraction", s.mark_fraction, 0.03, 1.0);
        band("E8 utilisation", s.utilisation, 0.85, 0.99);
        band("E8 Jain of means", s.jain, 0.98, 1.0);
    }
}

/// E7 invariants 1, 2 (at the NP, within one frame time of link waiting), 3 and 4–5 (RC, RT, α sampled every 5 µs)
/// on a scenario: returns the violations of invariant 1 (pairs of CNP send instants of one flow closer than N
/// minus one frame time).
fn e7_check(name: &str) -> Vec<(usize, u64, u64)> {
    let mut sc = load(name);
    sc.rc_sample_us = Some(5.0);
    let mut sim = Sim::new(&sc).unwrap();
    sim.run();
    let r = &sim.recorder;
    let n_ns = (sc.cc.np_interval_us * 1e3) as u64;
    // A CNP may wait for the frame in service on the receiver's link (ACKs and CNPs only: ≤ 100 B, 20 ns).
    let jitter = 1106 * 8 * 1000 / (sc.link.rate_gbps as u64 * 1000);
    let mut close = vec![];
    for (f, sent) in r.cnp_sent_times.iter().enumerate() {
        let ce = &r.ce_times[f];
        // 3. No CE, no CNP.
        if ce.is_empty() {
            assert!(sent.is_empty(), "{name} flow {f}: CNPs without CE marks");
        }
        for w in sent.windows(2) {
            if w[1] - w[0] + jitter < n_ns {
                close.push((f, w[0], w[1]));
            }
        }
        // 2. Each CE arrival is answered at once after ≥ N of silence, else at the window end.
        for &t in ce {
            let last = sent.iter().rev().find(|&&s| s < t).copied();
            let due = match last {
                Some(l) if t < l + n_ns => l + n_ns,
                _ => t,
            };
            assert!(
                sent.iter().any(|&s| s + jitter >= due && s <= due + jitter),
                "{name} flow {f}: CE at {t} ns: no CNP at {due} ns (+{jitter} ns); sent {:?} CE {:?}",
                sent.iter()
                    .filter(|&&s| s + 200_000 > t && s < t + 200_000)
                    .collect::<Vec<_>>(),
                ce.iter()
                    .filter(|&&s| s + 200_000 > t && s < t + 200_000)
                    .collect::<Vec<_>>()
            );
        }
    }
    // 4, 5. RC within [R_min, C]; RT ≥ RC (paper); α in [0, 1], ≥ g after a CNP.
    let c = sc.link.rate_gbps * 1e9;
    let (r_min, g) = (100e6, 1.0 / 256.0);
    for ((t, rcs), rp) in r.rc_samples.iter().zip(&r.rp_samples) {
        for (f, (&rc, &(rt, alpha))) in rcs.iter().zip(rp).enumerate() {
            assert!(rc <= c && rc >= r_min, "{name} flow {f} at {t} ns: RC {rc}");
            let rt = rt.expect("paper RP has RT") as f64;
            assert!(rt >= rc, "{name} flow {f} at {t} ns: RT {rt} < RC {rc}");
            let a = alpha.expect("paper RP has α");
            assert!((0.0..=1.0).contains(&a), "{name} flow {f} at {t} ns: α {a}");
            if !r.cnp_times[f].is_empty() && r.cnp_times[f][0] <= *t {
                assert!(
                    a >= g * 0.999_999,
                    "{name} flow {f} at {t} ns: α {a} < g after a CNP"
                );
            }
        }
    }
    close
}

#[test]
fn e7_np_rp_invariants() {
    for name in [
        "e3_two_flows.toml",
        "e5_incast_8.toml",
        "e4_late_joiner.toml",
    ] {
        let close = e7_check(name);
        assert!(
            close.is_empty(),
            "{name}: CNPs of one flow closer than N: {close:?}"
        );
    }
}

/// E7 invariant 1 on E8 (16:1): at most one CNP per flow per N. It failed here before the engine's NP was fixed: a
/// CE-marked packet arriving exactly when the flow's CNP window ended, while a mark from inside that window was
/// pending, made two CNPs at one instant (flow 8 at 58 834 618 and 58 834 638 ns); roce-proto's
/// `np_sends_one_cnp_when_a_mark_arrives_exactly_at_the_window_end` pins the rule.
#[test]
fn e7_np_spacing_in_e8() {
    let close = e7_check("e8_incast_16.toml");
    assert!(
        close.is_empty(),
        "CNPs of one flow closer than N: {close:?}"
    );
}

#[test]
fn same_scenario_and_seed_give_identical_csv() {
    let csv = || {
        let (_, sim, _) = run("e3_two_flows.toml");
        sim.recorder.csv()
    };
    let (a, b) = (csv(), csv());
    assert!(a.0.lines().count() > 60);
    assert_eq!(a, b);
    // A different seed gives a different run (the seed is used).
    let mut sc = load("e3_two_flows.toml");
    sc.seed = 2;
    let mut sim = Sim::new(&sc).unwrap();
    sim.run();
    assert_ne!(sim.recorder.csv(), a);
}

/// A sized flow (`bytes`) completes all of its bytes and stops; its completion time is at least the serialisation
/// time of its data at line rate and, alone on the fabric, within 5 % + a few RTTs of it.
#[test]
fn sized_flow_completes() {
    let sc = Scenario::from_toml(
        r#"
name = "sized"
duration_ms = 2.0
[[flow]]
sender = 0
bytes = 1000000
[[flow]]
sender = 1
start_ms = 0.5
bytes = 100000
"#,
    )
    .unwrap();
    let mut sim = Sim::new(&sc).unwrap();
    sim.run();
    for (f, want) in [(0usize, 1_000_000u64), (1, 100_000)] {
        let (done, at, errors) = sim.flow_done(f);
        assert_eq!((done, errors), (want, 0), "flow {f}");
        let start = (sc.flows[f].start_ms * 1e6) as u64;
        let fct = at.expect("finished") - start;
        // 1 KiB of payload per 1106 wire bytes at 40 Gb/s.
        let ideal = (want as f64 / 1024.0 * 1106.0 * 8.0 / 40.0) as u64;
        assert!(
            fct >= ideal && fct <= ideal * 105 / 100 + 20_000,
            "flow {f}: FCT {fct} ns, ideal {ideal} ns"
        );
    }
    assert_eq!(sim.switch.drops, 0);
}

/// Every shipped scenario parses, and a scenario survives a JSON round trip (the loader takes either format).
#[test]
fn scenario_files_parse_and_json_round_trips() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scenarios");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(
        names.len(),
        7,
        "E1-E6 and E8 ship as files (E7 checks invariants on them): {names:?}"
    );
    for n in &names {
        let sc = load(n);
        let json = serde_json::to_string(&sc).unwrap();
        assert_eq!(Scenario::from_json(&json).unwrap(), sc, "{n}");
    }
}

/// PFC: an 8:1 incast without congestion control overflows a 400 KB buffer (tail drops); with PFC (XOFF 30 KB /
/// XON 20 KB per ingress port, headroom for one propagation delay and a frame per port) the same run loses nothing,
/// pauses the senders and keeps the bottleneck busy.
#[test]
fn pfc_makes_an_uncontrolled_incast_lossless() {
    let text = |pfc: &str| {
        format!(
            r#"
name = "pfc_incast"
duration_ms = 3.0
measure_from_ms = 1.0
[switch]
buffer_bytes = 400000
kmin_bytes = 5000
kmax_bytes = 200000
pmax = 0.01
{pfc}
[cc]
profile = "none"
np_interval_us = 50.0
{}"#,
            (0..8)
                .map(|i| format!("[[flow]]\nsender = {i}\n"))
                .collect::<String>()
        )
    };
    let lossy = run_sc(Scenario::from_toml(&text("")).unwrap());
    assert!(lossy.1.switch.drops > 0, "without PFC the buffer overflows");
    assert_eq!(lossy.1.switch.pauses, 0);
    let (_, sim, s) = run_sc(
        Scenario::from_toml(&text("pfc = { xoff_bytes = 30000, xon_bytes = 20000 }")).unwrap(),
    );
    assert_eq!(sim.switch.drops, 0, "PFC: lossless");
    assert!(sim.switch.pauses > 0, "PFC paused the senders");
    // Frames count whole at their arrival: a window edge can hold one frame more than the line rate carried.
    band("PFC utilisation", s.utilisation, 0.99, 1.001);
    band("PFC Jain of means", s.jain, 0.99, 1.0);
    band("PFC max queue B", s.queue_max_bytes as f64, 0.0, 400_000.0);
}

/// Breaker finding: values that passed validation made the simulator allocate without bound (senders 1e8: 308 GB;
/// bin_ms 1e-6; rc_sample_us 1e-9; 4 GiB messages) and `rocev2 sim /dev/zero` read the file whole. Each is now a
/// one-line error before anything is allocated.
#[test]
fn scenarios_that_would_allocate_without_bound_are_refused() {
    let base = load("e1_single_flow.toml");
    let mut cases: Vec<(&str, Scenario)> = Vec::new();
    let mut s = base.clone();
    s.senders = Some(100_000_000);
    cases.push(("senders", s));
    let mut s = base.clone();
    s.bin_ms = 1e-6;
    cases.push(("bin_ms", s));
    let mut s = base.clone();
    s.rc_sample_us = Some(1e-9);
    cases.push(("rc_sample_us", s));
    let mut s = base.clone();
    s.host.message_bytes = u32::MAX;
    cases.push(("message_bytes", s));
    for (what, s) in cases {
        let e = s.validate().expect_err(what);
        assert!(e.to_string().contains(what), "{what}: {e}");
    }
    let e = Scenario::load(std::path::Path::new("/dev/zero")).expect_err("/dev/zero");
    assert!(e.to_string().contains("longer than"), "{e}");
}

/// The largest study (`MAX_SENDERS` = 1,024 senders, one flow each, `Scenario::incast`) builds and runs: the
/// receiver holds 1,024 QPs. It failed with `flow 1023: alloc_pd: device limit reached (max_pd)` when every QP had a
/// PD of its own (the engine allows 1,024 PDs per device); a host now shares one PD among its QPs.
#[test]
fn the_largest_incast_builds_and_runs() {
    let sc = Scenario::incast(roce_sim::scenario::MAX_SENDERS, 0.05).unwrap();
    let mut sim = Sim::new(&sc).unwrap_or_else(|e| panic!("{e}"));
    sim.run();
    assert_eq!(sim.recorder.bins.len(), roce_sim::scenario::MAX_SENDERS);
    assert!(sim.switch.ect_frames > 0);
}
