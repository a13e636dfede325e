//! Speed of the simulator (issue #20): simulated packet events per wall-clock second for the 64:1 incast, and the
//! run time as the number of flows grows 2, 4, …, 1,024 (N:1 incasts of `Scenario::incast`, `DCQCN.md` §6's common
//! setup). One thread, the release profile:
//!
//! ```sh
//! cargo bench -p roce-sim --bench speed                 # 64:1 for 20 ms, then N = 2..1024 for 5 ms each
//! cargo bench -p roce-sim --bench speed -- --incast-n 64 --incast-ms 60 --sweep-ms 10 --max-n 256
//! ```
//!
//! Prints Markdown tables (the shape of BENCHMARKS.md). An event is one entry popped from the simulator's event
//! heap (a frame finishing serialisation or arriving, an engine timer, a flow start, a bin); the table also gives
//! the frames the bottleneck carried, so the rate can be read per packet too.

use std::time::Instant;

use roce_sim::{Scenario, Sim};

/// CPU time of this thread, s (`/proc/thread-self/stat` utime + stime, in clock ticks of 10 ms): on a shared
/// machine the wall clock also counts the time other processes held the core.
fn thread_cpu_secs() -> f64 {
    let stat = std::fs::read_to_string("/proc/thread-self/stat").unwrap_or_default();
    // Fields after the command name (which ends with the last ')'): state is field 3, utime 14, stime 15.
    let rest = stat.rsplit_once(')').map_or("", |r| r.1);
    let f: Vec<u64> = rest
        .split_whitespace()
        .skip(11)
        .take(2)
        .filter_map(|v| v.parse().ok())
        .collect();
    f.iter().sum::<u64>() as f64 / 100.0
}

struct Run {
    n: usize,
    /// Events of one run.
    events: u64,
    /// ECN-capable data frames through the switch in one run.
    frames: u64,
    /// Wall-clock and CPU seconds per run (mean over the repetitions), and the shortest wall-clock time of a run
    /// (the one least disturbed by other processes on a shared machine).
    wall: f64,
    cpu: f64,
    best: f64,
    reps: u32,
    sim_ms: f64,
}

/// Runs the N:1 incast for `ms` simulated (set-up excluded), repeated until at least `min_cpu` s of CPU time have
/// been spent (the CPU clock ticks every 10 ms).
fn run(n: usize, ms: f64, min_cpu: f64) -> Run {
    let sc = Scenario::incast(n, ms).unwrap_or_else(|e| panic!("{e}"));
    let (mut wall, mut cpu, mut reps, mut best) = (0.0, 0.0, 0, f64::MAX);
    let (mut events, mut frames) = (0, 0);
    while reps == 0 || cpu < min_cpu {
        let mut sim = Sim::new(&sc).unwrap_or_else(|e| panic!("{e}"));
        let (t, c) = (Instant::now(), thread_cpu_secs());
        sim.run();
        let w = t.elapsed().as_secs_f64();
        wall += w;
        best = best.min(w);
        cpu += thread_cpu_secs() - c;
        reps += 1;
        (events, frames) = (sim.events, sim.switch.ect_frames);
    }
    Run {
        n,
        events,
        frames,
        wall: wall / f64::from(reps),
        cpu: cpu / f64::from(reps),
        best,
        reps,
        sim_ms: ms,
    }
}

fn main() {
    let mut incast_ms = 20.0;
    let mut sweep_ms = 5.0;
    let mut max_n = 1024;
    let mut incast_n = 64;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = |what: &str| -> f64 {
            args.next()
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("{what}: expected a number"))
        };
        match a.as_str() {
            "--incast-ms" => incast_ms = val("--incast-ms"),
            "--sweep-ms" => sweep_ms = val("--sweep-ms"),
            "--max-n" => max_n = val("--max-n") as usize,
            "--incast-n" => incast_n = val("--incast-n") as usize,
            // `cargo bench` passes --bench to every bench target.
            "--bench" => {}
            _ => panic!(
                "unknown argument {a}: --incast-n N, --incast-ms MS, --sweep-ms MS, --max-n N"
            ),
        }
    }
    let r = run(incast_n, incast_ms, 1.0);
    println!("## {incast_n}:1 incast, {incast_ms} ms simulated\n");
    println!(
        "| events | data frames | M events/s (best run) | M events/s (CPU time) | M events/s (wall, mean) | best wall s | CPU s | runs |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    println!(
        "| {} | {} | {:.2} | {:.2} | {:.2} | {:.4} | {:.3} | {} |\n",
        r.events,
        r.frames,
        r.events as f64 / r.best / 1e6,
        r.events as f64 / r.cpu / 1e6,
        r.events as f64 / r.wall / 1e6,
        r.best,
        r.cpu,
        r.reps
    );
    println!("## N:1 incasts, {sweep_ms} ms simulated each\n");
    println!(
        "| flows | events | events per flow per ms | best wall s | best / best at N/2 | M events/s (best run) | CPU s | M events/s (CPU time) | runs |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    let mut prev: Option<f64> = None;
    let mut n = 2;
    while n <= max_n {
        let r = run(n, sweep_ms, 0.5);
        println!(
            "| {} | {} | {:.0} | {:.4} | {} | {:.2} | {:.3} | {:.2} | {} |",
            r.n,
            r.events,
            r.events as f64 / r.n as f64 / r.sim_ms,
            r.best,
            prev.map_or("—".into(), |p| format!("{:.2}", r.best / p)),
            r.events as f64 / r.best / 1e6,
            r.cpu,
            r.events as f64 / r.cpu / 1e6,
            r.reps
        );
        prev = Some(r.best);
        n *= 2;
    }
}
