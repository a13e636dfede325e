//! `rocev2 sim SCENARIO`: a thin adapter over the roce-sim crate (the simulator, its scenarios and measurements
//! live there): runs the scenario file, prints the summary table (or `--json`), writes the CSV series (`--csv DIR`)
//! and SVG plots of rates and queue (`--plot DIR`, the plotters + registered-font setup of `rocev2 cc trace
//! --plot`), with a progress bar of simulated time on a terminal.

use std::io::IsTerminal as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Args;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressFinish, ProgressStyle};
use roce_sim::{Scenario, Sim};

/// `rocev2 sim` arguments.
#[derive(Debug, Args)]
pub struct SimArgs {
    /// Scenario file (TOML, or JSON by extension), e.g. crates/roce-sim/scenarios/e3_two_flows.toml.
    scenario: PathBuf,
    /// Print the summary as one JSON object instead of the table.
    #[arg(long)]
    json: bool,
    /// Write the per-flow (`flows.csv`: rate, RC, CNPs, marks per bin) and queue (`queue.csv`) series here.
    #[arg(long)]
    csv: Option<PathBuf>,
    /// Draw per-flow rates and the bottleneck queue over time as SVG files here (`rates.svg`, `queue.svg`).
    #[arg(long)]
    plot: Option<PathBuf>,
    /// Override the scenario's seed.
    #[arg(long)]
    seed: Option<u64>,
    /// Do not run: write the scenario as HPCC ns-3 input into DIR (`topology.txt`, `flow.txt`, `config.txt` with
    /// CC_MODE 1, `trace.txt`) and list what does not carry over in `NOTES.txt` and on stderr
    /// (docs/SIMULATOR.md "ns-3 export").
    #[arg(long, value_name = "DIR")]
    export_ns3: Option<PathBuf>,
}

/// Entry point of `rocev2 sim`.
pub fn run(a: &SimArgs) -> ExitCode {
    match sim_cmd(a) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rocev2 sim: {e}");
            ExitCode::from(2)
        }
    }
}

fn sim_cmd(a: &SimArgs) -> Result<(), String> {
    let mut sc = Scenario::load(&a.scenario).map_err(|e| e.to_string())?;
    if let Some(s) = a.seed {
        sc.seed = s;
    }
    if let Some(dir) = &a.export_ns3 {
        let ex = roce_sim::ns3::Ns3Export::from_scenario(&sc, dir).map_err(|e| e.to_string())?;
        ex.write(dir).map_err(|e| e.to_string())?;
        println!(
            "wrote {} (topology.txt, flow.txt, config.txt, trace.txt, NOTES.txt): {} hosts, {} flows, CC_MODE 1",
            dir.display(),
            sc.sender_count() + 1,
            sc.flows.len()
        );
        for n in &ex.notes {
            eprintln!("not carried over: {n}");
        }
        return Ok(());
    }
    let mut sim = Sim::new(&sc).map_err(|e| e.to_string())?;
    let bar = (!a.json && std::io::stderr().is_terminal()).then(|| {
        let style = ProgressStyle::with_template("{msg} [{bar:30}] {percent:>3}% {elapsed}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> ");
        ProgressBar::with_draw_target(
            Some(sim.end_ns() / 1000),
            ProgressDrawTarget::stderr_with_hz(5),
        )
        .with_style(style)
        .with_finish(ProgressFinish::AndClear)
        .with_message(format!("{} (simulated µs)", sc.name))
    });
    // Steps of 100 µs of simulated time between progress updates.
    let wall = std::time::Instant::now();
    let mut t = 0;
    loop {
        t += 100_000;
        let done = sim.run_until(t);
        if let Some(b) = &bar {
            b.set_position(sim.now_ns() / 1000);
        }
        if done {
            break;
        }
    }
    drop(bar);
    let secs = wall.elapsed().as_secs_f64();
    let s = sim.recorder.summary(&sc);
    if a.json {
        println!("{}", serde_json::to_string(&s).map_err(|e| e.to_string())?);
    } else {
        print!("{}", s.table());
        println!(
            "{} events in {secs:.2} s of wall-clock time ({:.2} M events/s)",
            sim.events,
            sim.events as f64 / secs.max(1e-9) / 1e6
        );
    }
    if let Some(dir) = &a.csv {
        std::fs::create_dir_all(dir).map_err(|e| format!("--csv {}: {e}", dir.display()))?;
        let (flows, queue) = sim.recorder.csv();
        for (name, text) in [("flows.csv", flows), ("queue.csv", queue)] {
            let p = dir.join(name);
            std::fs::write(&p, text).map_err(|e| format!("{}: {e}", p.display()))?;
        }
    }
    if let Some(dir) = &a.plot {
        std::fs::create_dir_all(dir).map_err(|e| format!("--plot {}: {e}", dir.display()))?;
        plot(&sim, &sc, dir).map_err(|e| format!("--plot {}: {e}", dir.display()))?;
    }
    Ok(())
}

/// `rates.svg` (every flow's throughput per bin and its RC) and `queue.svg` (mean and max per bin).
fn plot(sim: &Sim, sc: &Scenario, dir: &Path) -> Result<(), String> {
    use plotters::prelude::*;
    crate::plotfont::register()?;
    let e = |x: DrawingAreaErrorKind<_>| x.to_string();
    let r = &sim.recorder;
    let t_ms: Vec<f64> = r.bin_ends.iter().map(|&t| t as f64 / 1e6).collect();
    let x_end = sc.duration_ms;
    let gbps = sc.link.rate_gbps;
    {
        let path = dir.join("rates.svg");
        let root = SVGBackend::new(&path, (1000, 560)).into_drawing_area();
        root.fill(&WHITE).map_err(e)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(
                format!("{}: per-flow throughput (solid) and RC (thin)", sc.name),
                ("sans-serif", 22),
            )
            .margin(12)
            .x_label_area_size(45)
            .y_label_area_size(60)
            .build_cartesian_2d(0f64..x_end, 0f64..gbps * 1.05)
            .map_err(e)?;
        chart
            .configure_mesh()
            .x_desc("time (ms)")
            .y_desc("rate (Gb/s)")
            .draw()
            .map_err(e)?;
        for (f, bins) in r.bins.iter().enumerate() {
            let c = Palette99::pick(f).to_rgba();
            let mut prev = 0.0;
            let tput = bins.iter().zip(&t_ms).map(|(b, &t)| {
                let dt = (t - prev) * 1e6;
                prev = t;
                (t, b.bytes as f64 * 8.0 / dt)
            });
            chart
                .draw_series(LineSeries::new(tput, c.stroke_width(2)))
                .map_err(e)?
                .label(format!("flow {f}"))
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c));
            let rc = bins.iter().zip(&t_ms).map(|(b, &t)| (t, b.rc_bps / 1e9));
            chart
                .draw_series(LineSeries::new(rc, c.stroke_width(1)))
                .map_err(e)?;
        }
        if r.bins.len() <= 16 {
            chart
                .configure_series_labels()
                .position(SeriesLabelPosition::LowerRight)
                .background_style(WHITE.mix(0.8))
                .border_style(BLACK)
                .draw()
                .map_err(e)?;
        }
        root.present().map_err(e)?;
    }
    {
        let path = dir.join("queue.svg");
        let root = SVGBackend::new(&path, (1000, 560)).into_drawing_area();
        root.fill(&WHITE).map_err(e)?;
        let top = r
            .qbins
            .iter()
            .map(|q| q.max)
            .max()
            .unwrap_or(0)
            .max(sc.switch.kmax_bytes) as f64
            / 1e3;
        let mut chart = ChartBuilder::on(&root)
            .caption(format!("{}: bottleneck queue", sc.name), ("sans-serif", 22))
            .margin(12)
            .x_label_area_size(45)
            .y_label_area_size(60)
            .build_cartesian_2d(0f64..x_end, 0f64..top * 1.05)
            .map_err(e)?;
        chart
            .configure_mesh()
            .x_desc("time (ms)")
            .y_desc("queue (KB)")
            .draw()
            .map_err(e)?;
        let mean = r.qbins.iter().zip(&t_ms).map(|(q, &t)| (t, q.mean / 1e3));
        chart
            .draw_series(LineSeries::new(mean, BLUE.stroke_width(2)))
            .map_err(e)?
            .label("mean per bin")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLUE));
        let max = r
            .qbins
            .iter()
            .zip(&t_ms)
            .map(|(q, &t)| (t, q.max as f64 / 1e3));
        chart
            .draw_series(LineSeries::new(max, RED.stroke_width(1)))
            .map_err(e)?
            .label("max per bin")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], RED));
        for (k, c) in [(sc.switch.kmin_bytes, BLACK), (sc.switch.kmax_bytes, BLACK)] {
            let y = k as f64 / 1e3;
            chart
                .draw_series(LineSeries::new([(0.0, y), (x_end, y)], c.mix(0.4)))
                .map_err(e)?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()
            .map_err(e)?;
        root.present().map_err(e)?;
    }
    Ok(())
}
