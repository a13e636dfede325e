//! `rocev2 bench engine`: the engine's send-path cost per core on a null link (workloads in `roce_bench`, whose
//! crate docs say exactly what is measured; `cargo bench -p roce-bench` runs the same workloads under criterion).
//!
//! Every workload is sampled `--reps` times, the repetitions interleaved (rep 1 of every workload, then rep 2, ...)
//! so that a change in machine load hits all of them alike; each figure is the median over the repetitions. A
//! sample runs for about `--sample-ms` (its message count is calibrated once per workload).

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::Duration;

use roce_bench::{Baseline, Loopback, Op, SendSide, Workload};
use serde_json::{Value, json};

/// Post-list sizes of the sweep.
const POST_LISTS: [usize; 5] = [1, 4, 8, 16, 32];

/// `rocev2 bench` subcommands.
#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    what: BenchWhat,
}

#[derive(Debug, clap::Subcommand)]
enum BenchWhat {
    /// Send-path cost of the engine per core on a null link: 64 B SENDs and 4 KiB WRITEs (messages/s, Gb/s), the
    /// same with both ends in one thread, post-list sizes 1..32, beside memcpy + crc32 of the same bytes.
    Engine(EngineArgs),
}

#[derive(Debug, clap::Args)]
struct EngineArgs {
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
    /// Repetitions per workload (interleaved); figures are medians.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=1000))]
    reps: u32,
    /// Target duration of one sample in milliseconds.
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u64).range(1..=60_000))]
    sample_ms: u64,
    /// Post-list size of the headline figures (send64_msgs_per_s, write4k_gbps, loopback).
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u64).range(1..=32))]
    post_list: u64,
    /// The null link fully checks (whole-frame parse, ICRC, payload) every N-th frame; 1 = every frame. Every
    /// frame's headers are parsed regardless.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..))]
    check_every: u64,
    /// Run only the workloads whose name contains this text (e.g. `send64_pl16`; for profiling). Figures of the
    /// workloads left out are reported as null.
    #[arg(long)]
    only: Option<String>,
}

/// Runs `rocev2 bench ...`.
pub fn run(args: &BenchArgs) -> ExitCode {
    match &args.what {
        BenchWhat::Engine(a) => engine(a),
    }
}

/// One workload under measurement.
struct Entry {
    name: String,
    w: Box<dyn Workload>,
    /// Messages per sample (calibrated).
    n: u64,
    rates: Vec<f64>,
    gbps: Vec<f64>,
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    match s.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => s[n / 2],
        n => (s[n / 2 - 1] + s[n / 2]) / 2.0,
    }
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn engine(a: &EngineArgs) -> ExitCode {
    let pl = a.post_list as usize;
    let ce = a.check_every;
    let mut entries: Vec<Entry> = Vec::new();
    let mut add = |name: String, w: Box<dyn Workload>| {
        entries.push(Entry {
            name,
            w,
            n: 0,
            rates: Vec::new(),
            gbps: Vec::new(),
        });
    };
    add("baseline_64".into(), Box::new(Baseline::new(Op::Send64)));
    add("baseline_4k".into(), Box::new(Baseline::new(Op::Write4k)));
    for p in POST_LISTS {
        add(
            format!("send64_pl{p}"),
            Box::new(SendSide::new(Op::Send64, p, ce)),
        );
        add(
            format!("write4k_pl{p}"),
            Box::new(SendSide::new(Op::Write4k, p, ce)),
        );
    }
    if !POST_LISTS.contains(&pl) {
        add(
            format!("send64_pl{pl}"),
            Box::new(SendSide::new(Op::Send64, pl, ce)),
        );
        add(
            format!("write4k_pl{pl}"),
            Box::new(SendSide::new(Op::Write4k, pl, ce)),
        );
    }
    add(
        "loopback_send64".into(),
        Box::new(Loopback::new(Op::Send64, pl, ce)),
    );
    add(
        "loopback_write4k".into(),
        Box::new(Loopback::new(Op::Write4k, pl, ce)),
    );
    if let Some(only) = &a.only {
        entries.retain(|e| e.name.contains(only.as_str()));
    }
    let load_start = loadavg();
    let target = Duration::from_millis(a.sample_ms);
    // Calibrate: a short warm-up sample sets the message count of each workload's samples.
    for e in &mut entries {
        let mut n = 256u64;
        loop {
            let s = e.w.sample(n);
            if s.elapsed >= target / 8 || n >= 1 << 30 {
                let per = s.elapsed.as_secs_f64() / n as f64;
                e.n = ((target.as_secs_f64() / per.max(1e-12)) as u64).clamp(64, 1 << 32);
                break;
            }
            n *= 4;
        }
    }
    for _ in 0..a.reps {
        for e in &mut entries {
            let s = e.w.sample(e.n);
            e.rates.push(s.msgs_per_s());
            e.gbps.push(s.gbps());
        }
    }
    let load_end = loadavg();
    let med: BTreeMap<String, (f64, f64)> = entries
        .iter()
        .map(|e| (e.name.clone(), (median(&e.rates), median(&e.gbps))))
        .collect();
    let get = |k: &str| med.get(k).copied().unwrap_or((f64::NAN, f64::NAN));
    let send64 = get(&format!("send64_pl{pl}"));
    let write4k = get(&format!("write4k_pl{pl}"));
    let base64 = get("baseline_64");
    let base4k = get("baseline_4k");
    let lb_send = get("loopback_send64");
    let lb_write = get("loopback_write4k");
    let post_list: serde_json::Map<String, Value> = POST_LISTS
        .iter()
        .map(|p| (p.to_string(), json!(get(&format!("send64_pl{p}")).0)))
        .collect();
    let post_list_w: serde_json::Map<String, Value> = POST_LISTS
        .iter()
        .map(|p| (p.to_string(), json!(get(&format!("write4k_pl{p}")).1)))
        .collect();
    // Data checks: every workload's null link saw no bad frame, loopback MRs hold the source pattern.
    let mut bad = 0u64;
    let mut full_checks = 0u64;
    let mut frames = 0u64;
    for e in &entries {
        if let Some(s) = e.w.link_stats() {
            bad += s.bad;
            full_checks += s.full_checks;
            frames += s.tx_frames;
        }
    }
    let has_link = entries.iter().any(|e| e.w.link_stats().is_some());
    let verified =
        bad == 0 && (full_checks > 0 || !has_link) && entries.iter().all(|e| e.w.verified());
    let pl1 = get("send64_pl1").0;
    let pl16 = get("send64_pl16").0;
    let out = json!({
        "send64_msgs_per_s": send64.0,
        "send64_gbps": send64.1,
        "write4k_msgs_per_s": write4k.0,
        "write4k_gbps": write4k.1,
        "baseline_memcpy_crc32_gbps": base4k.1,
        "baseline_memcpy_crc32_64_msgs_per_s": base64.0,
        "write4k_over_baseline": write4k.1 / base4k.1,
        "loopback_send64_msgs_per_s": lb_send.0,
        "loopback_write4k_gbps": lb_write.1,
        "post_list": post_list,
        "post_list_write4k_gbps": post_list_w,
        "post_list16_over_1": pl16 / pl1,
        "headline_post_list": pl,
        "reps": a.reps,
        "sample_ms": a.sample_ms,
        "check_every": ce,
        "frames": frames,
        "full_checks": full_checks,
        "bad_frames": bad,
        "verified": verified,
        "load_start": load_start,
        "load_end": load_end,
    });
    if a.json {
        println!("{out}");
    } else {
        println!(
            "rocev2 bench engine: medians of {} interleaved repetitions of ~{} ms",
            a.reps, a.sample_ms
        );
        println!("{:<22} {:>14} {:>10}", "workload", "messages/s", "Gb/s");
        for (k, (r, g)) in &med {
            println!("{k:<22} {r:>14.0} {g:>10.2}");
        }
        println!(
            "write4k (post-list {pl}) / memcpy+crc32 baseline: {:.2}; post-list 16 / post-list 1 (64 B): {:.2}",
            write4k.1 / base4k.1,
            pl16 / pl1
        );
        println!(
            "frames {frames}, fully checked {full_checks}, bad {bad}; data verified: {verified}; load {load_start} -> {load_end}"
        );
    }
    if verified {
        ExitCode::SUCCESS
    } else {
        eprintln!(
            "rocev2 bench engine: data check failed ({bad} bad frames, {full_checks} fully checked)"
        );
        ExitCode::FAILURE
    }
}
