//! The progress line of long `rocev2 perf` runs (indicatif): `-a` (which size of how many), `-D` (seconds of the
//! run) and large `-n` (completions of this size). It is drawn on stderr only when stderr is a terminal and the
//! output is the table (not `--json`, not `--output`), so a piped or scripted run prints exactly what it did
//! before; result lines go to stdout through [`Progress::println`], which lifts the line while they are printed.
//!
//! Cost on the measured loops: [`Progress::at`] is called from the client's existing sampling points (every
//! 500 µs of completions in the bandwidth loop, every 64 iterations in the latency loop); it stores a position
//! (an atomic) and draws at most [`REFRESH_HZ`] times a second. Nothing allocates there between draws.

use std::io::IsTerminal as _;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressFinish, ProgressStyle};

use super::Params;

/// `-n` (times the QPs) from which a single size counts as long.
pub const LONG_ITERS: u64 = 10_000;

/// Redraws per second at most.
pub const REFRESH_HZ: u8 = 5;

/// The progress line of the client side (cheap to clone: the clones share one line).
#[derive(Clone, Debug)]
pub struct Progress {
    bar: ProgressBar,
    sizes: usize,
    /// `-D`: the line counts milliseconds of the run instead of completions.
    duration: Option<Duration>,
}

impl Progress {
    /// A progress line for a client running `p` when the run is long (`-a`, `-D`, or at least [`LONG_ITERS`]
    /// completions), not `--run_infinitely` (which prints a line per interval), the output is the table
    /// (`tables`: not `--json`, not `--output`) and stderr is a terminal. `None` otherwise.
    pub fn for_run(p: &Params, tables: bool) -> Option<Progress> {
        let long =
            p.sizes.len() > 1 || p.duration.is_some() || p.iters * u64::from(p.qps) >= LONG_ITERS;
        if !tables || p.infinite || !long || !std::io::stderr().is_terminal() {
            return None;
        }
        Some(Progress::new(
            p,
            ProgressDrawTarget::stderr_with_hz(REFRESH_HZ),
        ))
    }

    fn new(p: &Params, target: ProgressDrawTarget) -> Progress {
        let style = ProgressStyle::with_template("{msg} [{bar:30}] {percent:>3}% {elapsed}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> ");
        // Cleared when the last clone goes, also when the run ends in an error (printed after it).
        let bar = ProgressBar::with_draw_target(None, target)
            .with_style(style)
            .with_finish(ProgressFinish::AndClear);
        Progress {
            bar,
            sizes: p.sizes.len(),
            duration: p.duration,
        }
    }

    /// Size `size` (bytes; `index` of the run's sizes) begins: `iters` completions expected (with `-D`, the
    /// run's duration is the length instead).
    pub fn start_size(&self, index: usize, size: u64, iters: u64) {
        let len = match self.duration {
            Some(d) => u64::try_from(d.as_millis()).unwrap_or(u64::MAX),
            None => iters,
        };
        let of = if self.sizes > 1 {
            format!(" ({}/{})", index + 1, self.sizes)
        } else {
            String::new()
        };
        self.bar.set_message(format!("{size} B{of}"));
        self.bar.reset();
        self.bar.set_length(len.max(1));
    }

    /// Progress within the size: `done` completions, `elapsed` since the size began.
    pub fn at(&self, done: u64, elapsed: Duration) {
        match self.duration {
            Some(_) => self
                .bar
                .set_position(u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX)),
            None => self.bar.set_position(done),
        }
    }

    /// Prints `line` and a newline to stdout with the progress line lifted.
    pub fn println(&self, line: &str) {
        self.bar.suspend(|| println!("{line}"));
    }

    /// Removes the line (end of the run).
    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }
}
