//! `rocev2 cc trace`: drives the product's DCQCN reaction point ([`roce_proto::cc::Dcqcn`], the type every QP of
//! the engine runs) through a CNP schedule and writes the trajectory as JSON in the schema of the oracle
//! `testdata/dcqcn/rp_reference.py` (`params`, `schedule`, `summary`, `events`, `samples_us_rc_bps`;
//! `DCQCN.md` §5), optionally with an SVG plot of RC and RT.
//!
//! The sender is backlogged: it transmits at RC all the time (a fluid source), so the byte counter fires exactly
//! when RC integrated since the last reset reaches B (the oracle's fluid mode). Everything else — cuts, α, timers,
//! phases — is the RP's own code, fed with `now`.
//!
//! Differences from the oracle's log, by design: α is evaluated in closed form between CNPs, so `paper` logs no
//! separate `alpha` decay events (α is reported in every event); once RT = RC = C the RP stops its rate timer.
//! Neither changes RC, RT or α at any instant (`crates/roce-cli/tests/cc_trace.rs` compares the two).

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, Subcommand};
use roce_proto::Instant;
use roce_proto::cc::{Dcqcn, DcqcnConfig, ParamValue, Profile, RpEvent, RpEventKind};
use serde_json::{Map, Value, json};

/// `rocev2 cc ...`.
#[derive(Debug, Args)]
pub struct CcArgs {
    #[command(subcommand)]
    cmd: CcCommand,
}

#[derive(Debug, Subcommand)]
enum CcCommand {
    /// Drive the DCQCN reaction point through a CNP schedule and write its trajectory (JSON in the schema of
    /// `testdata/dcqcn/rp_reference.py`), optionally plotted.
    ///
    /// Example: `rocev2 cc trace --profile paper --line-gbps 40 --cnp-us 100,300 --end-us 5000 --plot rc.svg`.
    /// Parameters are set by the profile's names (`--set B_bytes=0`, `--set rpg_time_reset=100`); `--list-params`
    /// prints them with their defaults.
    Trace(TraceArgs),
}

/// `rocev2 cc trace` arguments.
#[derive(Debug, Args)]
pub struct TraceArgs {
    /// RP profile: paper (docs/spec/DCQCN.md §2.3), ns3_mlx (§2.4), nvidia (§2.5).
    #[arg(long, default_value = "paper", value_parser = parse_profile)]
    profile: Profile,
    /// Line rate C in Gb/s (the rate before any CNP and the cap of RC and RT).
    #[arg(long = "line-gbps", default_value_t = 40.0)]
    line_gbps: f64,
    /// CNP arrival times in µs, comma-separated (any order; repeats allowed).
    #[arg(long = "cnp-us", value_delimiter = ',', allow_hyphen_values = true)]
    cnp_us: Vec<f64>,
    /// End of the trace in µs.
    #[arg(long = "end-us", default_value_t = 5000.0)]
    end_us: f64,
    /// Spacing of the RC samples in µs.
    #[arg(long = "sample-us", default_value_t = 10.0)]
    sample_us: f64,
    /// Override a parameter by the profile's name for it, e.g. `--set B_bytes=150000` (repeatable).
    #[arg(long = "set", value_name = "NAME=VALUE")]
    set: Vec<String>,
    /// Write the JSON here instead of stdout.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Also draw RC and RT over time into this SVG file.
    #[arg(long)]
    plot: Option<PathBuf>,
    /// Print the profile's parameters (name = value, after --set) and exit.
    #[arg(long = "list-params")]
    list_params: bool,
}

fn parse_profile(s: &str) -> Result<Profile, String> {
    Profile::from_name(s).ok_or_else(|| format!("unknown profile `{s}` (paper, ns3_mlx, nvidia)"))
}

/// Entry point of `rocev2 cc`.
pub fn run(a: &CcArgs) -> ExitCode {
    match &a.cmd {
        CcCommand::Trace(t) => match trace_cmd(t) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("rocev2 cc trace: {e}");
                ExitCode::from(2)
            }
        },
    }
}

/// Applies `NAME=VALUE` overrides to a configuration.
///
/// # Errors
/// A malformed pair, an unknown name or a bad value, as one line.
pub fn apply_sets(cfg: &mut DcqcnConfig, sets: &[String]) -> Result<(), String> {
    for kv in sets {
        let (k, v) = kv
            .split_once('=')
            .ok_or_else(|| format!("`{kv}`: expected NAME=VALUE"))?;
        cfg.set(k.trim(), v.trim()).map_err(|e| e.to_string())?;
    }
    Ok(())
}

fn us_to_ns(us: f64, what: &str) -> Result<u64, String> {
    if !(0.0..=1.0e12).contains(&us) {
        return Err(format!("{what} {us}: expected a time of 0 .. 1e12 µs"));
    }
    Ok((us * 1000.0).round() as u64)
}

fn trace_cmd(a: &TraceArgs) -> Result<(), String> {
    if !(a.line_gbps.is_finite() && a.line_gbps > 0.0) {
        return Err(format!(
            "--line-gbps {}: expected a positive rate",
            a.line_gbps
        ));
    }
    let mut cfg = DcqcnConfig::new(a.profile, a.line_gbps * 1e9);
    apply_sets(&mut cfg, &a.set)?;
    if a.list_params {
        for (k, v) in cfg.params() {
            println!("{k} = {v}");
        }
        return Ok(());
    }
    let end = us_to_ns(a.end_us, "--end-us")?;
    let sample = us_to_ns(a.sample_us, "--sample-us")?;
    if sample == 0 {
        return Err("--sample-us must be at least 0.001".into());
    }
    let mut cnps = a
        .cnp_us
        .iter()
        .map(|&t| us_to_ns(t, "--cnp-us"))
        .collect::<Result<Vec<_>, _>>()?;
    cnps.sort_unstable();
    let t = Trace::run(&cfg, &cnps, end, sample);
    let doc = t.to_json(&cfg, &a.cnp_us, a.end_us, a.sample_us);
    let text = serde_json::to_string_pretty(&doc).map_err(|e| e.to_string())?;
    match &a.out {
        Some(p) => std::fs::write(p, text + "\n").map_err(|e| format!("{}: {e}", p.display()))?,
        None => {
            let mut o = std::io::stdout().lock();
            writeln!(o, "{text}").map_err(|e| e.to_string())?;
        }
    }
    if let Some(p) = &a.plot {
        t.plot(p, &cfg, a.end_us)
            .map_err(|e| format!("--plot {}: {e}", p.display()))?;
    }
    Ok(())
}

/// A trace: the logged events (the oracle's rule: every CNP and every event that changed RC or RT), RC on the
/// sample grid, α at the end.
pub struct Trace {
    /// Logged events, the first being the initial state at t = 0.
    pub events: Vec<RpEvent>,
    /// `(t_ns, RC)` on the sample grid: RC after all events strictly before the sample instant.
    pub samples: Vec<(u64, f64)>,
    /// α at the end instant.
    pub alpha_at_end: f64,
    line: f64,
}

impl Trace {
    /// Runs a backlogged flow through the CNP instants `cnps` (ns, sorted) up to `end` (ns, events at `end`
    /// included), sampling RC every `sample` ns.
    pub fn run(cfg: &DcqcnConfig, cnps: &[u64], end: u64, sample: u64) -> Trace {
        let mut rp = Dcqcn::new(cfg.clone());
        let line = rp.line_rate_bps();
        let init = RpEvent {
            at: Instant::ZERO,
            kind: RpEventKind::Timer,
            action: roce_proto::cc::RpAction::FastRecovery,
            rc_bps: rp.rc_bps(),
            rt_bps: rp.rt_bps(),
            alpha: rp.alpha_at(Instant::ZERO),
            t_cnt: 0,
            bc_cnt: 0,
            stage: 0,
            limited: false,
        };
        let mut events = vec![init];
        let mut samples = Vec::new();
        let mut next_sample = 0u64;
        let mut ci = 0;
        // Fluid sender: bytes sent since the RP's byte counter last restarted, not yet handed to the RP.
        let mut acc = 0.0f64;
        let mut last = 0u64;
        loop {
            let t_cnp = cnps.get(ci).copied();
            let t_timer = rp.next_timer().map(Instant::as_nanos);
            let t_byte = rp.bytes_to_byte_event().map(|rem| {
                let bits = (rem as f64 - acc).max(0.0) * 8.0;
                last + ((bits / rp.rc_bps() * 1e9).ceil() as u64).max(1)
            });
            let Some(t) = [t_cnp, t_timer, t_byte].into_iter().flatten().min() else {
                break;
            };
            if t > end {
                break;
            }
            while next_sample <= t && next_sample <= end {
                samples.push((next_sample, rp.rc_bps()));
                next_sample += sample;
            }
            if rp.bytes_to_byte_event().is_some() {
                acc += rp.rc_bps() * (t - last) as f64 / 8e9;
            }
            last = t;
            let mut restarted = false;
            let mut log = |e: &RpEvent| {
                let prev = events.last().map(|p| (p.rc_bps, p.rt_bps));
                if matches!(e.kind, RpEventKind::Cnp | RpEventKind::Dec)
                    && e.action == roce_proto::cc::RpAction::Cut
                {
                    restarted = true;
                }
                if e.kind == RpEventKind::Cnp || prev != Some((e.rc_bps, e.rt_bps)) {
                    events.push(*e);
                }
            };
            let now = Instant::from_nanos(t);
            // Same instant: CNP, then timers, then the byte counter (R6, M6).
            if t_cnp == Some(t) {
                ci += 1;
                rp.on_cnp_with(now, &mut log);
            } else if t_timer == Some(t) {
                rp.on_timer_with(now, &mut log);
            } else if let Some(rem) = rp.bytes_to_byte_event() {
                rp.on_tx_with(now, rem, &mut log);
                acc = 0.0;
            }
            if restarted || rp.bytes_to_byte_event().is_none() {
                acc = 0.0;
            }
        }
        while next_sample <= end {
            samples.push((next_sample, rp.rc_bps()));
            next_sample += sample;
        }
        Trace {
            events,
            samples,
            alpha_at_end: rp.alpha_at(Instant::from_nanos(end)),
            line,
        }
    }

    fn t_us(e: &RpEvent) -> f64 {
        e.at.as_nanos() as f64 / 1000.0
    }

    /// The oracle's `summary` (`rp_reference.py` `summarize`): deficit against line rate, final state, lowest RC,
    /// time of the last cut and recovery times to 90/99/99.9 % of C after the last CNP.
    fn summary(&self, cnp_us: &[f64], end_us: f64) -> Value {
        let ev = &self.events;
        let mut deficit_bits = 0.0;
        for (i, e) in ev.iter().enumerate() {
            let next = ev.get(i + 1).map_or(end_us, Self::t_us);
            deficit_bits += (self.line - e.rc_bps) * (next - Self::t_us(e)) * 1e-6;
        }
        let last_cut = (1..ev.len())
            .rev()
            .find(|&i| ev[i].rc_bps < ev[i - 1].rc_bps)
            .unwrap_or(0);
        let last = ev.last().unwrap_or(&ev[0]);
        let mut m = Map::new();
        m.insert(
            "deficit_bytes_vs_line_rate".into(),
            json!(deficit_bits / 8.0),
        );
        m.insert("final_rc_bps".into(), json!(last.rc_bps));
        m.insert("final_rt_bps".into(), json!(last.rt_bps));
        m.insert("alpha_at_end".into(), json!(self.alpha_at_end));
        m.insert(
            "min_rc_bps".into(),
            json!(ev.iter().map(|e| e.rc_bps).fold(f64::INFINITY, f64::min)),
        );
        m.insert("last_cut_t_us".into(), json!(Self::t_us(&ev[last_cut])));
        if let Some(last_cnp) = cnp_us.iter().copied().reduce(f64::max) {
            for (frac, key) in [(0.9, "0.9"), (0.99, "0.99"), (0.999, "0.999")] {
                let hit = ev[last_cut..]
                    .iter()
                    .find(|e| e.rc_bps >= frac * self.line)
                    .map(|e| ((Self::t_us(e) - last_cnp) * 1e6).round() / 1e6);
                m.insert(format!("t_to_{key}_line_after_last_cnp_us"), json!(hit));
            }
        }
        Value::Object(m)
    }

    /// The whole document in the oracle's schema.
    pub fn to_json(&self, cfg: &DcqcnConfig, cnp_us: &[f64], end_us: f64, sample_us: f64) -> Value {
        let profile = cfg.profile();
        let mut params = Map::new();
        params.insert("profile".into(), json!(profile.name()));
        for (k, v) in cfg.params() {
            let v = match v {
                ParamValue::F64(x) => json!(x),
                ParamValue::U64(x) => json!(x),
                ParamValue::Bool(x) => json!(x),
            };
            params.insert(k.into(), v);
        }
        let events: Vec<Value> = self
            .events
            .iter()
            .enumerate()
            .map(|(i, e)| {
                let (event, action) = if i == 0 {
                    ("init", Value::Null)
                } else {
                    let name = match (e.kind, profile) {
                        (RpEventKind::Cnp, _) => "cnp",
                        (RpEventKind::Timer, Profile::Ns3Mlx) => "inc",
                        (RpEventKind::Timer, _) => "timer",
                        (RpEventKind::Byte, _) => "byte",
                        (RpEventKind::Dec, _) => "dec",
                    };
                    (name, json!(e.action.name()))
                };
                let mut o = Map::new();
                o.insert("t_us".into(), json!(Self::t_us(e)));
                o.insert("event".into(), json!(event));
                o.insert("action".into(), action);
                o.insert("rc_bps".into(), json!(e.rc_bps));
                o.insert("rt_bps".into(), json!(e.rt_bps));
                o.insert("alpha".into(), json!(e.alpha));
                if profile == Profile::Ns3Mlx {
                    o.insert("stage".into(), json!(e.stage));
                } else {
                    o.insert("T".into(), json!(e.t_cnt));
                    o.insert("BC".into(), json!(e.bc_cnt));
                }
                Value::Object(o)
            })
            .collect();
        let samples: Vec<Value> = self
            .samples
            .iter()
            .map(|&(t, rc)| json!([t as f64 / 1000.0, rc]))
            .collect();
        json!({
            "model": "rocev2 cc trace (roce_proto::cc::Dcqcn)",
            "params": params,
            "schedule": {"cnp_us": cnp_us, "end_us": end_us, "tx": null, "sample_us": sample_us},
            "summary": self.summary(cnp_us, end_us),
            "events": events,
            "samples_us_rc_bps": samples,
        })
    }

    /// Draws RC and RT (step functions) and the CNP instants into an SVG file.
    pub fn plot(&self, path: &Path, cfg: &DcqcnConfig, end_us: f64) -> Result<(), String> {
        use plotters::prelude::*;
        crate::plotfont::register()?;
        let e = |x: DrawingAreaErrorKind<_>| x.to_string();
        let (scale, unit) = if end_us > 20_000.0 {
            (1e-3, "ms")
        } else {
            (1.0, "µs")
        };
        let x_end = (end_us * scale).max(1e-9);
        let gbps = self.line / 1e9;
        let root = SVGBackend::new(path, (1000, 560)).into_drawing_area();
        root.fill(&WHITE).map_err(e)?;
        let title = format!(
            "DCQCN {} RP, C = {gbps} Gb/s, CNPs: {}",
            cfg.profile(),
            self.events
                .iter()
                .filter(|x| x.kind == RpEventKind::Cnp)
                .count()
        );
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 22))
            .margin(12)
            .x_label_area_size(45)
            .y_label_area_size(60)
            .build_cartesian_2d(0f64..x_end, 0f64..gbps * 1.05)
            .map_err(e)?;
        chart
            .configure_mesh()
            .x_desc(format!("time ({unit})"))
            .y_desc("rate (Gb/s)")
            .draw()
            .map_err(e)?;
        let steps = |f: fn(&RpEvent) -> f64| {
            let mut pts = Vec::with_capacity(2 * self.events.len() + 1);
            for (i, ev) in self.events.iter().enumerate() {
                let x = Self::t_us(ev) * scale;
                if i > 0 {
                    pts.push((x, f(&self.events[i - 1]) / 1e9));
                }
                pts.push((x, f(ev) / 1e9));
            }
            if let Some(l) = self.events.last() {
                pts.push((x_end, f(l) / 1e9));
            }
            pts
        };
        chart
            .draw_series(LineSeries::new(steps(|e| e.rt_bps), RED.stroke_width(1)))
            .map_err(e)?
            .label("RT (target)")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], RED));
        chart
            .draw_series(LineSeries::new(steps(|e| e.rc_bps), BLUE.stroke_width(2)))
            .map_err(e)?
            .label("RC (current)")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLUE));
        chart
            .draw_series(
                self.events
                    .iter()
                    .filter(|x| x.kind == RpEventKind::Cnp)
                    .map(|x| {
                        TriangleMarker::new((Self::t_us(x) * scale, gbps * 1.02), 4, BLACK.filled())
                    }),
            )
            .map_err(e)?
            .label("CNP")
            .legend(|(x, y)| TriangleMarker::new((x + 10, y), 4, BLACK.filled()));
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()
            .map_err(e)?;
        root.present().map_err(e)?;
        Ok(())
    }
}
