//! `rocev2 perf --use_hugepages`: the test buffers go on 2 MiB huge pages when the kernel has them reserved, and the
//! run falls back to normal pages with a warning on stderr when it has none. Both runs use `--loopback --link sim`
//! (no sockets, so nothing to share with `tests/perf.rs`). The tests change `/proc/sys/vm/nr_hugepages` (root only;
//! restored on drop, also when an assertion fails) and hold one lock so they never see each other's pool.

mod common;

use std::process::{Command, Output};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde_json::Value;

static POOL: Mutex<()> = Mutex::new(());

const NR: &str = "/proc/sys/vm/nr_hugepages";
const OVERCOMMIT: &str = "/proc/sys/vm/nr_overcommit_hugepages";
const WARNING: &str = "no free 2 MiB huge pages";

/// Holds [`POOL`] and puts back the sysctls it changed.
struct PoolGuard {
    saved: Vec<(&'static str, String)>,
    _lock: MutexGuard<'static, ()>,
}

fn read(path: &str) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_owned())
}

impl PoolGuard {
    fn lock() -> PoolGuard {
        PoolGuard {
            saved: Vec::new(),
            _lock: POOL.lock().unwrap_or_else(|p| p.into_inner()),
        }
    }

    fn set(&mut self, path: &'static str, value: u64) -> bool {
        let Some(prev) = read(path) else {
            return false;
        };
        if !self.saved.iter().any(|(p, _)| *p == path) {
            self.saved.push((path, prev));
        }
        std::fs::write(path, value.to_string()).is_ok()
            && read(path).and_then(|s| s.parse::<u64>().ok()) == Some(value)
    }

    /// Exactly `pages` persistent huge pages and no surplus; false if that cannot be arranged (not root).
    fn pool(&mut self, pages: u64) -> bool {
        self.set(OVERCOMMIT, 0) && self.set(NR, pages)
    }
}

impl Drop for PoolGuard {
    fn drop(&mut self) {
        for (path, prev) in self.saved.iter().rev() {
            if let Err(e) = std::fs::write(path, prev) {
                eprintln!("could not restore {path} to {prev}: {e}");
            }
        }
    }
}

fn free_pages() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("HugePages_Free:"))
                .and_then(|v| v.trim().parse().ok())
        })
        .unwrap_or(0)
}

fn perf_args<'a>(extra: &[&'a str]) -> Vec<&'a str> {
    let mut v = vec![
        "perf",
        "write-bw",
        "--loopback",
        "--link",
        "sim",
        "--use_hugepages",
        "--json",
        "--timeout",
        "20",
    ];
    v.extend_from_slice(extra);
    v
}

/// Checks exit 0 and one verified write-bw JSON line; returns stderr.
fn check_run(args: &[&str], out: &Output) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "{args:?} failed ({:?}):\n{stdout}\n{stderr}",
        out.status
    );
    let lines: Vec<Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    assert_eq!(lines.len(), 1, "{stdout}");
    assert_eq!(lines[0]["test"], "write-bw");
    assert_eq!(lines[0]["verified"], true, "{stdout}");
    stderr
}

#[test]
fn use_hugepages_without_reserved_pages_warns_and_runs_on_normal_pages() {
    let mut g = PoolGuard::lock();
    if !g.pool(0) && free_pages() != 0 {
        eprintln!("skipped: huge pages are free and the pool cannot be emptied (not root?)");
        return;
    }
    let args = perf_args(&["-n", "300"]);
    let out = common::output_within(
        Command::new(env!("CARGO_BIN_EXE_rocev2")).args(&args),
        common::RUN,
    );
    let stderr = check_run(&args, &out);
    assert!(stderr.contains(WARNING), "no fallback warning:\n{stderr}");
    assert!(stderr.contains("nr_hugepages"), "{stderr}");
    // Once only: the in-process server of --loopback does not print.
    assert_eq!(stderr.matches(WARNING).count(), 1, "{stderr}");
}

#[test]
fn use_hugepages_puts_both_buffers_on_reserved_huge_pages() {
    let mut g = PoolGuard::lock();
    // Each side's buffer (64 KiB messages: about 1.1 MB) fits one 2 MiB page; two spare pages stay free.
    if !g.pool(4) {
        eprintln!("skipped: cannot reserve huge pages (needs root and a writable /proc/sys/vm)");
        return;
    }
    assert_eq!(free_pages(), 4);
    let args = perf_args(&["-D", "1.5"]);
    let dir = common::scratch("hugepages-perf");
    let mut child = common::Proc::spawn_command(
        "perf",
        &dir,
        Command::new(env!("CARGO_BIN_EXE_rocev2")).args(&args),
    );
    // While the test runs, the pool shows both buffers' pages in use.
    let t0 = Instant::now();
    let mut min_free = free_pages();
    while child.try_wait().is_none() && t0.elapsed() < Duration::from_secs(30) {
        min_free = min_free.min(free_pages());
        std::thread::sleep(Duration::from_millis(10));
    }
    let out = child.output(common::RUN);
    let stderr = check_run(&args, &out);
    assert!(
        !stderr.contains(WARNING),
        "fell back although pages were free:\n{stderr}"
    );
    assert_eq!(
        min_free, 2,
        "two huge pages (one per side) in use during the run"
    );
    assert_eq!(free_pages(), 4, "pages returned at exit");
}
