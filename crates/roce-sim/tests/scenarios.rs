//! E1–E8 of `docs/spec/DCQCN.md` §6, each asserting that section's pass/fail bands on the shipped scenario
//! file, and determinism (same scenario and seed → byte-identical CSV). Run in release:
//! `cargo test --release -p roce-sim --test scenarios`.

use std::path::PathBuf;

use roce_proto::cc::{DcqcnConfig, PaperParams, Profile};
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
    both_marking_sc(load(name))
}

/// `sc` (marking at enqueue) and the same with marking at dequeue.
fn both_marking_sc(sc: Scenario) -> [(Scenario, Sim, Summary); 2] {
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

/// The fluid model of `docs/spec/DCQCN.md` §6 (the DCQCN paper's §4 model) at the fair share, solved for the
/// marking probability p. Per flow: R = C/n packets per second (`pkt` wire bytes each), NP window τ = N, α period K,
/// timer T, byte counter B in packets, F fast-recovery steps, R_AI in packets per second (paper profile). With
/// a = 1 − (1−p)^{τR} (at least one mark, hence one CNP, per window), b = p/((1−p)^{−B} − 1), c = b(1−p)^{FB},
/// d = p/((1−p)^{−TR} − 1), e = d(1−p)^{FTR}, the rates stand still (dRT/dt = dRC/dt = 0 at RC = R) when
/// α·a² = τ²·R_AI·R·(b + d)(c + e), and α stands still when α = 1 − (1−p)^{KR}.
struct Fluid {
    r: f64,
    tau: f64,
    k: f64,
    t: f64,
    b: f64,
    f: f64,
    r_ai: f64,
}

impl Fluid {
    fn new(c_bps: f64, n: usize, pkt: f64, tau_us: f64, p: &PaperParams) -> Fluid {
        let bits = pkt * 8.0;
        Fluid {
            r: c_bps / n as f64 / bits,
            tau: tau_us * 1e-6,
            k: p.k_us * 1e-6,
            t: p.t_us * 1e-6,
            b: p.b_bytes as f64 / pkt,
            f: p.f as f64,
            r_ai: p.r_ai_bps / bits,
        }
    }

    /// For a scenario of backlogged flows of full frames (PMTU payload) under the paper profile.
    fn of(sc: &Scenario) -> Fluid {
        let c = sc.link.rate_gbps * 1e9;
        let mut cfg = DcqcnConfig::new(Profile::Paper, c);
        for (k, v) in &sc.cc.set {
            cfg.set(k, v).unwrap();
        }
        let DcqcnConfig::Paper(p) = cfg else {
            unreachable!()
        };
        // Eth 14 + IPv4 20 + UDP 8 + BTH 12 + payload + ICRC 4 + the link's per-frame overhead.
        let pkt = 58.0 + f64::from(sc.host.mtu) + f64::from(sc.link.overhead_bytes);
        Fluid::new(c, sc.flows.len(), pkt, sc.cc.np_interval_us, &p)
    }

    /// 1 − (1 − p)^x, exact for small p.
    fn at_least_one(p: f64, x: f64) -> f64 {
        -(x * (-p).ln_1p()).exp_m1()
    }

    /// a: the probability that a window τ carries a mark, i.e. the CNPs per window.
    fn a(&self, p: f64) -> f64 {
        Self::at_least_one(p, self.tau * self.r)
    }

    /// α's fixed point at p.
    fn alpha(&self, p: f64) -> f64 {
        Self::at_least_one(p, self.k * self.r)
    }

    /// α·a² − τ²·R_AI·R·(b + d)(c + e): negative below the balancing p, positive above.
    fn residual(&self, p: f64, alpha: f64) -> f64 {
        let l = (-p).ln_1p();
        let b = p / (-self.b * l).exp_m1();
        let c = b * (self.f * self.b * l).exp();
        let tr = self.t * self.r;
        let d = p / (-tr * l).exp_m1();
        let e = d * (self.f * tr * l).exp();
        let a = self.a(p);
        alpha * a * a - self.tau * self.tau * self.r_ai * self.r * (b + d) * (c + e)
    }

    /// The p at which the rates stand still with α held at `alpha` (quasi-static), or at α's own fixed point
    /// (`None`: the fixed point p* of §6), by bisection on log p.
    fn p(&self, alpha: Option<f64>) -> f64 {
        let (mut lo, mut hi) = (1e-9f64, 0.5f64);
        for _ in 0..200 {
            let m = (lo * hi).sqrt();
            if self.residual(m, alpha.unwrap_or_else(|| self.alpha(m))) > 0.0 {
                hi = m;
            } else {
                lo = m;
            }
        }
        (lo * hi).sqrt()
    }

    /// CNPs per ms per flow at p.
    fn cnps_per_ms(&self, p: f64) -> f64 {
        self.a(p) / self.tau / 1e3
    }
}

/// The solver is §6's model: it gives §6's table of p* and q* = Kmin + (Kmax − Kmin)·p*/Pmax (1000-byte packets,
/// paper ramp 5 KB / 200 KB / 1 %, paper profile, N = 50 µs), to the table's rounding (its q* for N = 3, 31 KB, is
/// computed from p* rounded to 0.131 %: 30.49 KB from p* itself).
#[test]
fn fluid_model_reproduces_dcqcn_md_6_table() {
    let q = |p: f64| (5e3 + 195e3 * p / 0.01) / 1e3;
    for (c, n, p_pct, q_kb) in [
        (40e9, 2, 0.078, 20.0),
        (40e9, 3, 0.131, 31.0),
        (40e9, 4, 0.189, 42.0),
        (40e9, 8, 0.455, 94.0),
        (100e9, 2, 0.024, 10.0),
        (100e9, 3, 0.040, 13.0),
        (100e9, 4, 0.058, 16.0),
        (100e9, 8, 0.142, 33.0),
        (100e9, 16, 0.343, 72.0),
    ] {
        let DcqcnConfig::Paper(pp) = DcqcnConfig::new(Profile::Paper, c) else {
            unreachable!()
        };
        let p = Fluid::new(c, n, 1000.0, 50.0, &pp).p(None);
        band(
            &format!("p* % at {c} b/s, N = {n}"),
            p * 100.0,
            p_pct - 0.0005,
            p_pct + 0.0005,
        );
        band(
            &format!("q* KB at {c} b/s, N = {n}"),
            q(p),
            q_kb - 0.6,
            q_kb + 0.6,
        );
    }
    // 16:1 at 40G has no interior point: p* = 1.09 % > Pmax.
    let DcqcnConfig::Paper(pp) = DcqcnConfig::new(Profile::Paper, 40e9) else {
        unreachable!()
    };
    band(
        "p* % at 40G, N = 16",
        Fluid::new(40e9, 16, 1000.0, 50.0, &pp).p(None) * 100.0,
        1.085,
        1.095,
    );
}

/// E3 (`DCQCN.md` §6 E3, 2:1, measured over [20, 60] ms) on seeds 1–3 (the seeds of the reference's DES), marking
/// at enqueue and at dequeue: every band of E3 as written except the marked fraction, which is asserted against the
/// fluid model instead (below, and `docs/spec/DCQCN.md` §6.1).
///
/// **Marked fraction.** E3 writes 0.1–0.5 %; no faithful DCQCN with E3's parameters reaches it in E3's window:
/// * What is measured is what E3 defines: CE marks / ECN-capable data packets that met a marking decision at the
///   bottleneck egress in [20, 60] ms, per packet (all data packets are full frames, so bytes give the same
///   fraction), at enqueue or at dequeue as selected.
/// * At the fluid fixed point the marked fraction *is* the marking probability p*, and §6's own table gives
///   p* = 0.078 % for N = 2 at 40G (1000-B packets; `fluid_model_reproduces_dcqcn_md_6_table`); with our 1106-B
///   frames (PMTU 1024) it is 0.086 %: the flows need ≈ 1.9 marks per ms each whatever the packet size, over
///   2 261 frames per ms instead of 2 500. Both lie below 0.1 %.
/// * In E3's window α has not reached its fixed point α* ≈ 0.10: the start-up (both flows at line rate, the queue
///   past Kmax, 2–5 halving CNPs each with α = 1) is followed by 9–25 ms of additive increase without a CNP in
///   which α only decays, α ≥ (1 − g)^{t/K}: ≈ 0.24–0.3 at 20 ms, then ≈ 14 ms (K/g) to settle. A larger α cuts more
///   per CNP, so fewer marks balance the increase: with α held, the same balance gives p(α), 0.055 % at α = 0.3.
///   So the window's fraction lies between p(α at 20 ms) and p* — measured 0.058–0.075 % over seeds 1–20 × both
///   markings (2026-12-03) — and `e3_marked_fraction_and_cnp_rate_settle_at_the_fluid_fixed_point` shows it
///   reaching p* once α has settled.
///
/// Each run's fraction is asserted in [p(α₂₀)·(1 − 3/√m), p*·(1 + 3/√m)] (α₂₀ the larger of the flows' α at
/// 20 ms, m the marks counted: three standard deviations of a count of m), and the six runs pooled in the same
/// way: that pooled band, ≈ 0.05–0.095 %, excludes E3's 0.1–0.5 %.
///
/// Over seeds 1–20 × both markings the other bands held in 36 of 40 runs; 4 (enqueue seed 20, dequeue seeds 4, 14,
/// 17) had one flow at 22.7–23.0 G and the other at 16.7–17.0 G (Jain 0.975–0.980). The spread comes from the
/// start-up: a flow with one halving CNP (or more) more than the other there (21 of the 40 runs; e.g. 3 and 4)
/// starts additive increase, the same for both, at half the other's RT or less, and only the cuts of the congested
/// phase (from 9–25 ms) close that gap, at a random pace. Three of the four misses had such a start; the fourth
/// (dequeue seed 17) had equal start-up counts and was not looked into further. The team's reference reports its
/// own DES on seeds 1–3.
#[test]
fn e3_two_flows_fair_share_and_queue() {
    let base = load("e3_two_flows.toml");
    let fl = Fluid::of(&base);
    let p_star = fl.p(None);
    let (mut marks, mut ect, mut p_lo) = (0u64, 0u64, p_star);
    for seed in 1..=3 {
        let mut sc = base.clone();
        sc.seed = seed;
        sc.rc_sample_us = Some(1000.0);
        for (sc, sim, s) in both_marking_sc(sc) {
            let what = |b: &str| format!("E3 seed {seed} {:?}: {b}", sc.switch.mark);
            for f in &s.flows {
                band(&what("per-flow Gb/s"), f.throughput_gbps, 17.5, 22.5);
                band(&what("CNPs per ms per flow"), f.cnps_per_ms, 0.8, 2.5);
            }
            band(&what("Jain of means"), s.jain, 0.98, 1.0);
            band(&what("mean per-ms Jain"), s.mean_bin_jain, 0.97, 1.0);
            band(&what("utilisation"), s.utilisation, 0.97, 1.0);
            band(&what("mean queue KB"), s.queue_mean_bytes / 1e3, 10.0, 30.0);
            band(&what("time above Kmax"), s.above_kmax_fraction, 0.0, 0.005);
            assert_eq!(sim.switch.drops, 0);
            let r = &sim.recorder;
            let from = (sc.measure_from_ms * 1e6) as u64;
            let k = r
                .rc_samples
                .iter()
                .position(|(t, _)| *t == from)
                .expect("an RP sample where the window opens");
            let alpha20 = r.rp_samples[k]
                .iter()
                .map(|x| x.1.expect("paper RP has α"))
                .fold(0.0, f64::max);
            let lo = fl.p(Some(alpha20));
            p_lo = p_lo.min(lo);
            let tol = 3.0 / (s.marks as f64).sqrt();
            eprintln!(
                "E3 seed {seed} {:?}: marked {:.4} %, fluid band {:.4}..{:.4} % (α₂₀ {alpha20:.3})",
                sc.switch.mark,
                s.mark_fraction * 100.0,
                lo * (1.0 - tol) * 100.0,
                p_star * (1.0 + tol) * 100.0
            );
            band(
                &what(&format!(
                    "marked fraction vs the fluid model (α₂₀ {alpha20:.3}: p {:.4} %, p* {:.4} %)",
                    lo * 100.0,
                    p_star * 100.0
                )),
                s.mark_fraction,
                lo * (1.0 - tol),
                p_star * (1.0 + tol),
            );
            marks += s.marks;
            ect += s.ect_frames;
        }
    }
    let tol = 3.0 / (marks as f64).sqrt();
    eprintln!(
        "E3 pooled: marked {:.4} % ({marks} of {ect}), fluid band {:.4}..{:.4} %",
        marks as f64 / ect as f64 * 100.0,
        p_lo * (1.0 - tol) * 100.0,
        p_star * (1.0 + tol) * 100.0
    );
    band(
        "E3 marked fraction, six runs pooled, vs the fluid model",
        marks as f64 / ect as f64,
        p_lo * (1.0 - tol),
        p_star * (1.0 + tol),
    );
}

/// E3 run on to its steady state (300 ms, measured over [100, 300] ms, α settled) meets the fluid fixed point of
/// `DCQCN.md` §6 for its frames: marked fraction p* (0.086 % for 1106-B frames) and a CNP rate a(p*)/N (1.85 per ms
/// per flow), each within ±20 % (three standard deviations of the ≈ 700 marks counted, 11 %, plus the model's own
/// approximations: measured −8 to −10 % for the fraction and −6 to −9 % for the CNPs, seeds 1–3 × both markings,
/// 2026-12-03). With E3's band 0.1–0.5 % the measured fraction would have to be ≥ 16 % above p*.
#[test]
fn e3_marked_fraction_and_cnp_rate_settle_at_the_fluid_fixed_point() {
    let mut sc = load("e3_two_flows.toml");
    sc.duration_ms = 300.0;
    sc.measure_from_ms = 100.0;
    let fl = Fluid::of(&sc);
    let p_star = fl.p(None);
    let cnps = fl.cnps_per_ms(p_star);
    for (sc, _, s) in both_marking_sc(sc) {
        eprintln!(
            "E3 steady state {:?}: marked {:.4} % (p* {:.4} %), CNPs {:.3} per ms per flow (fluid {cnps:.3})",
            sc.switch.mark,
            s.mark_fraction * 100.0,
            p_star * 100.0,
            s.cnps_per_ms_per_flow
        );
        band(
            &format!(
                "E3 steady state {:?}: marked fraction / p* ({p_star})",
                sc.switch.mark
            ),
            s.mark_fraction / p_star,
            0.8,
            1.2,
        );
        band(
            &format!(
                "E3 steady state {:?}: CNPs per ms per flow / fluid ({cnps})",
                sc.switch.mark
            ),
            s.cnps_per_ms_per_flow / cnps,
            0.8,
            1.2,
        );
    }
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
