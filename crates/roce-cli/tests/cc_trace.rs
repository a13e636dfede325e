//! `rocev2 cc trace` (the product's DCQCN reaction point, `roce_proto::cc::Dcqcn`) against the oracle
//! `testdata/dcqcn/rp_reference.py`, within the tolerances of `DCQCN.md` §5.2:
//!
//! * the stored reference runs (`testdata/dcqcn/rp_*.json`), re-run with every parameter of the file;
//! * new schedules (CNP storms, ties with timer instants, repeated and fractional CNP times, long quiet periods)
//!   with parameter overrides given as `--set` with the oracle's names, for `paper` and `ns3_mlx`; the test runs
//!   the oracle itself (python3), so nothing here is a frozen copy of its output.
//!
//! Comparison: the oracle's events without its `paper` α-decay entries (the RP evaluates α in closed form and logs
//! no separate decay event; α is compared in every other event) must match ours one to one — same event and action,
//! the same instant (±1 ns; byte-counter events ±one packet time, MTU·8/RC with MTU 4096), RC, RT and α within
//! 1e-9 relative, the same stage counters. RC on the sample grid within 1e-9 (a sample within one packet time of a
//! byte-counter event is skipped), and the summary. Each case prints its largest deviations.

mod common;

use std::path::Path;
use std::process::Command;

use common::{bin, scratch, testdata_dir};
use serde_json::Value;

/// §5.2: byte-counter event times may differ by one packet time (MTU·8/RC); RoCE's largest MTU.
const MTU_BYTES: f64 = 4096.0;
const REL: f64 = 1e-9;

fn rocev2_trace(args: &[String]) -> Value {
    let out = common::output_within(
        Command::new(bin()).args(["cc", "trace"]).args(args),
        common::RUN,
    );
    assert!(
        out.status.success(),
        "rocev2 cc trace {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON from rocev2 cc trace")
}

fn python3() -> bool {
    Command::new("python3")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Runs the oracle with the same command-line arguments (its CLI and ours share them).
fn oracle(args: &[String], dir: &Path, name: &str) -> Value {
    let out = dir.join(format!("{name}.oracle.json"));
    let script = testdata_dir().join("dcqcn/rp_reference.py");
    let st = Command::new("python3")
        .arg(&script)
        .args(args)
        .arg("--out")
        .arg(&out)
        .output()
        .expect("run python3");
    assert!(
        st.status.success(),
        "{name}: rp_reference.py {args:?}: {}",
        String::from_utf8_lossy(&st.stderr)
    );
    serde_json::from_str(&std::fs::read_to_string(&out).expect("oracle output")).expect("JSON")
}

fn rel(a: f64, b: f64) -> f64 {
    if a == b {
        return 0.0;
    }
    (a - b).abs() / a.abs().max(b.abs()).max(1e-300)
}

fn num(v: &Value, k: &str) -> f64 {
    v[k].as_f64()
        .unwrap_or_else(|| panic!("{k} is not a number in {v}"))
}

/// Largest deviations found in one comparison.
#[derive(Debug, Default)]
struct Dev {
    events: usize,
    byte_events: usize,
    rate: f64,
    alpha: f64,
    dt_us: f64,
    byte_dt_us: f64,
    byte_tol_us: f64,
    samples: usize,
    samples_skipped: usize,
    sample_rate: f64,
}

/// Compares our trace with the oracle's (see the module docs); panics naming the first difference beyond §5.2.
fn compare(name: &str, o: &Value, a: &Value) -> Dev {
    let mut d = Dev::default();
    let oe: Vec<&Value> = o["events"]
        .as_array()
        .expect("oracle events")
        .iter()
        .filter(|e| e["event"] != "alpha")
        .collect();
    let ae = a["events"].as_array().expect("our events");
    assert_eq!(
        oe.len(),
        ae.len(),
        "{name}: {} oracle events (α decays left out) vs {} of ours",
        oe.len(),
        ae.len()
    );
    let mut byte_times = vec![];
    let mut prev_rc = num(oe[0], "rc_bps");
    for (i, (x, y)) in oe.iter().zip(ae).enumerate() {
        let ctx = || format!("{name}: event {i}:\n oracle {x}\n ours   {y}");
        assert_eq!(x["event"], y["event"], "{}", ctx());
        assert_eq!(x["action"], y["action"], "{}", ctx());
        for k in ["T", "BC", "stage"] {
            assert_eq!(x.get(k), y.get(k), "{}", ctx());
        }
        let dt = (num(x, "t_us") - num(y, "t_us")).abs();
        if x["event"] == "byte" {
            let tol = MTU_BYTES * 8.0 / prev_rc * 1e6;
            assert!(dt <= tol, "{}: byte event Δt {dt} µs > {tol} µs", ctx());
            d.byte_events += 1;
            d.byte_dt_us = d.byte_dt_us.max(dt);
            d.byte_tol_us = d.byte_tol_us.max(tol);
            byte_times.push((num(x, "t_us"), tol));
        } else {
            assert!(dt <= 0.001, "{}: Δt {dt} µs", ctx());
            d.dt_us = d.dt_us.max(dt);
        }
        for k in ["rc_bps", "rt_bps"] {
            let r = rel(num(x, k), num(y, k));
            assert!(r <= REL, "{}: {k} relative error {r}", ctx());
            d.rate = d.rate.max(r);
        }
        let r = rel(num(x, "alpha"), num(y, "alpha"));
        assert!(r <= REL, "{}: alpha relative error {r}", ctx());
        d.alpha = d.alpha.max(r);
        prev_rc = num(x, "rc_bps");
    }
    d.events = oe.len();
    let os = o["samples_us_rc_bps"].as_array().expect("oracle samples");
    let us = a["samples_us_rc_bps"].as_array().expect("our samples");
    assert_eq!(os.len(), us.len(), "{name}: sample count");
    for (x, y) in os.iter().zip(us) {
        let (tx, ty) = (x[0].as_f64().unwrap(), y[0].as_f64().unwrap());
        assert!((tx - ty).abs() <= 0.001, "{name}: sample grid {x} vs {y}");
        if byte_times.iter().any(|&(tb, tol)| (tx - tb).abs() <= tol) {
            d.samples_skipped += 1;
            continue;
        }
        let r = rel(x[1].as_f64().unwrap(), y[1].as_f64().unwrap());
        assert!(r <= REL, "{name}: sample {x} vs {y}: {r}");
        d.sample_rate = d.sample_rate.max(r);
        d.samples += 1;
    }
    let (os, us) = (&o["summary"], &a["summary"]);
    for (k, v) in os.as_object().expect("summary") {
        let w = &us[k.as_str()];
        match (v.as_f64(), w.as_f64()) {
            (Some(x), Some(y)) => {
                let tol = match k.as_str() {
                    // The integral moves with the byte-counter instants (ns apart).
                    "deficit_bytes_vs_line_rate" => 1e-6,
                    k if k.starts_with("t_to_") => d.byte_tol_us.max(0.001) / x.abs().max(1.0),
                    _ => REL,
                };
                assert!(rel(x, y) <= tol, "{name}: summary {k}: {x} vs {y}");
            }
            _ => assert_eq!(v, w, "{name}: summary {k}"),
        }
    }
    eprintln!(
        "{name}: {} events ({} byte-counter) match; max rel. error RC/RT {:.1e}, α {:.1e} (tolerance {REL:.0e}); \
         max |Δt| {:.3} µs (tolerance 0.001), byte events {:.4} µs (tolerance one packet ≤ {:.3} µs); \
         {} samples max rel. error {:.1e} ({} skipped next to byte events)",
        d.events,
        d.byte_events,
        d.rate,
        d.alpha,
        d.dt_us,
        d.byte_dt_us,
        d.byte_tol_us,
        d.samples,
        d.sample_rate,
        d.samples_skipped
    );
    d
}

fn fmt_list(v: &[f64]) -> String {
    v.iter()
        .map(|x| x.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

/// One schedule, as command-line arguments both programs understand.
struct Case {
    name: &'static str,
    profile: &'static str,
    line_gbps: f64,
    cnp_us: Vec<f64>,
    end_us: f64,
    sample_us: f64,
    set: Vec<(&'static str, String)>,
}

impl Case {
    fn args(&self) -> Vec<String> {
        let mut a = vec![
            "--profile".into(),
            self.profile.into(),
            "--line-gbps".into(),
            self.line_gbps.to_string(),
            format!("--cnp-us={}", fmt_list(&self.cnp_us)),
            "--end-us".into(),
            self.end_us.to_string(),
            "--sample-us".into(),
            self.sample_us.to_string(),
        ];
        for (k, v) in &self.set {
            a.push("--set".into());
            a.push(format!("{k}={v}"));
        }
        a
    }
}

/// A deterministic scatter of `n` CNP instants in `[from, to)` µs with nanosecond fractions, some repeated.
fn scatter(seed: u64, n: usize, from: f64, to: f64) -> Vec<f64> {
    let mut s = seed;
    let mut v: Vec<f64> = (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            let u = (s >> 11) as f64 / (1u64 << 53) as f64;
            ((from + u * (to - from)) * 1000.0).round() / 1000.0
        })
        .collect();
    let dup = v[n / 3];
    v.push(dup);
    v
}

fn every(from: f64, step: f64, n: usize) -> Vec<f64> {
    (0..n).map(|k| from + step * k as f64).collect()
}

#[test]
fn stored_reference_runs_match() {
    let dir = testdata_dir().join("dcqcn");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("testdata/dcqcn")
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.extension().is_some_and(|x| x == "json")
                && p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("rp_"))
        })
        .collect();
    files.sort();
    assert!(files.len() >= 4, "reference runs in {}", dir.display());
    for f in files {
        let name = f.file_stem().unwrap().to_string_lossy().into_owned();
        let o: Value = serde_json::from_str(&std::fs::read_to_string(&f).unwrap()).unwrap();
        let (p, s) = (&o["params"], &o["schedule"]);
        assert!(s["tx"].is_null(), "{name}: transmit lists are not replayed");
        let mut args = vec![
            "--profile".to_owned(),
            p["profile"].as_str().unwrap().to_owned(),
            "--line-gbps".into(),
            (num(p, "line_rate_bps") / 1e9).to_string(),
            format!(
                "--cnp-us={}",
                s["cnp_us"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|v| v.to_string())
                    .collect::<Vec<_>>()
                    .join(",")
            ),
            "--end-us".into(),
            s["end_us"].to_string(),
            "--sample-us".into(),
            s["sample_us"].to_string(),
        ];
        for (k, v) in p.as_object().unwrap() {
            if k != "profile" {
                args.push("--set".into());
                args.push(format!("{k}={v}"));
            }
        }
        let a = rocev2_trace(&args);
        assert_eq!(a["params"], o["params"], "{name}: params");
        compare(&name, &o, &a);
    }
}

fn run_cases(cases: &[Case]) {
    if !python3() {
        eprintln!("SKIPPED (cc_trace generated schedules): python3 is needed to run the oracle");
        return;
    }
    let dir = scratch("cc-trace");
    for c in cases {
        let args = c.args();
        let o = oracle(&args, &dir, c.name);
        let a = rocev2_trace(&args);
        assert_eq!(a["params"], o["params"], "{}: params", c.name);
        compare(c.name, &o, &a);
    }
}

#[test]
fn paper_matches_the_oracle_on_new_schedules() {
    let s = |k, v: &str| (k, v.to_owned());
    run_cases(&[
        // DCQCN.md §5.1's example: 100 Gb/s, three CNPs 50 µs apart, no byte counter.
        Case {
            name: "paper-100g-3cnp-no-bc",
            profile: "paper",
            line_gbps: 100.0,
            cnp_us: vec![10.0, 60.0, 110.0],
            end_us: 5000.0,
            sample_us: 10.0,
            set: vec![s("B_bytes", "0")],
        },
        // §5.3 S3: a CNP storm drives RC and RT to the floor; timer-AI then byte-counter hyper increase.
        Case {
            name: "paper-s3-storm",
            profile: "paper",
            line_gbps: 40.0,
            cnp_us: every(100.0, 50.0, 20),
            end_us: 80_000.0,
            sample_us: 50.0,
            set: vec![],
        },
        // CNPs on the 55-µs timer grid and repeated (same-instant order R6), a small byte counter.
        Case {
            name: "paper-ties-and-repeats",
            profile: "paper",
            line_gbps: 40.0,
            cnp_us: vec![100.0, 155.0, 155.0, 210.0, 430.0, 430.0, 2000.0],
            end_us: 6000.0,
            sample_us: 5.0,
            set: vec![s("B_bytes", "300000")],
        },
        // Every parameter moved; scattered CNPs with nanosecond fractions; α₀ = 0.5, no RT clamp.
        Case {
            name: "paper-overrides-scatter",
            profile: "paper",
            line_gbps: 25.0,
            cnp_us: scatter(7, 25, 50.0, 4000.0),
            end_us: 20_000.0,
            sample_us: 7.0,
            set: vec![
                s("K_us", "40"),
                s("T_us", "30"),
                s("F", "3"),
                s("B_bytes", "1000000"),
                s("R_AI_bps", "1e8"),
                s("R_HAI_bps", "5e8"),
                s("g", "0.0625"),
                s("min_rate_bps", "5e8"),
                s("clamp_target_on_cnp", "0"),
                s("alpha_init", "0.5"),
            ],
        },
        // Byte-counter driven recovery at 10 Gb/s (many byte events between timer steps).
        Case {
            name: "paper-byte-counter-heavy",
            profile: "paper",
            line_gbps: 10.0,
            cnp_us: vec![100.0, 150.0, 1000.0],
            end_us: 30_000.0,
            sample_us: 20.0,
            set: vec![s("B_bytes", "200000"), s("T_us", "500")],
        },
    ]);
}

#[test]
fn ns3_mlx_matches_the_oracle_on_new_schedules() {
    let s = |k, v: &str| (k, v.to_owned());
    run_cases(&[
        // A storm faster than the 4-µs decrease grid, then recovery through AI and HAI.
        Case {
            name: "ns3mlx-25g-storm",
            profile: "ns3_mlx",
            line_gbps: 25.0,
            cnp_us: every(100.0, 3.0, 100),
            end_us: 10_000.0,
            sample_us: 10.0,
            set: vec![],
        },
        // DCQCN.md §6 E6: CNPs 400 µs apart clamp RT; slow HAI-bound recovery.
        Case {
            name: "ns3mlx-e6-spaced",
            profile: "ns3_mlx",
            line_gbps: 40.0,
            cnp_us: every(100.0, 400.0, 10),
            end_us: 50_000.0,
            sample_us: 100.0,
            set: vec![],
        },
        // Every parameter moved; scattered CNPs.
        Case {
            name: "ns3mlx-overrides-scatter",
            profile: "ns3_mlx",
            line_gbps: 100.0,
            cnp_us: scatter(11, 30, 20.0, 3000.0),
            end_us: 15_000.0,
            sample_us: 9.0,
            set: vec![
                s("alpha_tick_us", "2"),
                s("dec_period_us", "5"),
                s("T_us", "55"),
                s("F", "3"),
                s("g", "0.0625"),
                s("clamp_target_always", "1"),
                s("rate_on_first_cnp", "0.5"),
                s("min_rate_bps", "1e9"),
                s("R_AI_bps", "2e7"),
                s("R_HAI_bps", "2e8"),
            ],
        },
    ]);
}

#[test]
fn nvidia_trace_runs_and_plots() {
    let dir = scratch("cc-trace-nvidia");
    let svg = dir.join("nv.svg");
    let a = rocev2_trace(&[
        "--profile".into(),
        "nvidia".into(),
        "--line-gbps".into(),
        "100".into(),
        "--cnp-us=100,104,300,2000".into(),
        "--end-us".into(),
        "20000".into(),
        "--set".into(),
        "rpg_time_reset=100".into(),
        "--plot".into(),
        svg.to_string_lossy().into_owned(),
    ]);
    assert_eq!(a["params"]["profile"], "nvidia");
    assert_eq!(a["params"]["rpg_time_reset"], 100);
    let ev = a["events"].as_array().unwrap();
    let cuts: Vec<f64> = ev
        .iter()
        .filter(|e| e["action"] == "cut")
        .map(|e| num(e, "t_us"))
        .collect();
    // Cuts on the rate_reduce_monitor_period grid, 4 µs after the first CNP: the CNPs at 100 and 104 µs fall in one
    // period (a CNP at a check instant comes before the check), so one cut. The default 32767-byte counter brings
    // RC back to C and releases the limiter before 300 µs, so the CNPs at 300 and 2000 µs are first CNPs again.
    assert_eq!(cuts, vec![104.0, 304.0, 2004.0], "{ev:?}");
    let firsts = ev.iter().filter(|e| e["action"] == "first_cnp").count();
    assert_eq!(firsts, 3);
    for e in ev {
        assert!(num(e, "rc_bps") <= 100e9 && num(e, "rt_bps") <= 100e9);
        assert!(e.get("T").is_some() && e.get("BC").is_some());
    }
    let text = std::fs::read_to_string(&svg).expect("SVG written");
    assert!(
        text.starts_with("<svg") && text.contains("RC (current)") && text.contains("RT (target)")
    );
}

#[test]
fn bad_arguments_are_one_line_errors() {
    for (args, want) in [
        (vec!["--profile", "cubic"], "unknown profile"),
        (
            vec!["--set", "rpg_gd=11"],
            "unknown paper parameter `rpg_gd`",
        ),
        (
            vec!["--profile", "nvidia", "--set", "K_us=5"],
            "unknown nvidia parameter",
        ),
        (vec!["--set", "g=2"], "g=2"),
        (vec!["--set", "F"], "expected NAME=VALUE"),
        (vec!["--cnp-us=-5"], "--cnp-us -5"),
    ] {
        let out = common::output_within(
            Command::new(bin()).args(["cc", "trace"]).args(&args),
            common::SHORT,
        );
        assert!(!out.status.success(), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(want), "{args:?}: {err}");
    }
    let out = common::output_within(
        Command::new(bin()).args(["cc", "trace", "--profile", "ns3_mlx", "--list-params"]),
        common::SHORT,
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("alpha_tick_us = 1") && text.contains("R_AI_bps = 8000000"),
        "{text}"
    );
}
