//! The time bound of every program a test starts (`common::Proc::wait`, `common::output_within`): a program that
//! would run for ever is killed at its limit, with the children it started, and the test fails naming it with its
//! output so far. CI must end with a verdict: its last run did not, a C program hung in `Command::output()`.

mod common;

use std::path::Path;
use std::process::Command;
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Whether process `pid` is still alive (a zombie, exited but not yet reaped by its new parent, counts as gone).
fn alive(pid: &str) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().next().map(str::to_owned))
        })
        .is_some_and(|state| state != "Z" && state != "X")
}

/// `sh` starts `sleep 1000` in the background, prints its pid and a line, and waits for it: with a 2 s bound,
/// `output_within` must panic within the test's own 60 s watchdog, say it ran out of time, show the line printed
/// so far, and leave neither `sh` nor its `sleep` running.
#[test]
fn output_within_kills_a_program_that_runs_for_ever() {
    let (tx, rx) = mpsc::channel();
    let t0 = Instant::now();
    std::thread::spawn(move || {
        let r = std::panic::catch_unwind(|| {
            common::output_within(
                Command::new("sh").args([
                    "-c",
                    "sleep 1000 & echo \"child $!\"; echo 'output so far' >&2; wait",
                ]),
                Duration::from_secs(2),
            )
        });
        let _ = tx.send(r.map_err(|e| {
            e.downcast_ref::<String>()
                .cloned()
                .or_else(|| e.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .unwrap_or_default()
        }));
    });
    let msg = match rx.recv_timeout(Duration::from_secs(60)) {
        Ok(Err(msg)) => msg,
        Ok(Ok(out)) => panic!("the program ended by itself?! {out:?}"),
        Err(_) => panic!("output_within did not return within 60 s: the 2 s bound does not hold"),
    };
    let took = t0.elapsed();
    assert!(
        msg.contains("still running after 2s"),
        "no expiry in the message: {msg}"
    );
    assert!(
        msg.contains("output so far"),
        "the output so far is not shown: {msg}"
    );
    let pid = msg
        .lines()
        .find_map(|l| l.strip_prefix("child "))
        .unwrap_or_else(|| panic!("no child pid in: {msg}"))
        .trim()
        .to_owned();
    // The group was killed before the panic; its `sleep`, reparented, is reaped by init in a moment.
    let gone = Instant::now();
    while alive(&pid) {
        assert!(
            gone.elapsed() < Duration::from_secs(30),
            "sleep {pid} (the program's child) still running after the bound expired"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(took >= Duration::from_secs(2), "expired early: {took:?}");
    // Nothing left of the output files.
    let left = std::fs::read_dir(env!("CARGO_TARGET_TMPDIR"))
        .expect("tmpdir")
        .flatten()
        .any(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with(&format!("bounded-{}-", std::process::id()))
        });
    assert!(!left, "output_within left its output directory behind");
}

/// The same bound through `Proc::wait`, the form the multi-process tests use: a server that never ends is killed
/// at the limit and the test fails.
#[test]
fn proc_wait_kills_a_program_that_runs_for_ever() {
    let dir = common::scratch("bounded-proc");
    let (tx, rx) = mpsc::channel();
    let d = dir.clone();
    std::thread::spawn(move || {
        let mut p = common::Proc::spawn("forever", &d, &common::strings(&["sleep", "1000"]));
        let pid = p.pid();
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            p.wait(Duration::from_secs(2));
        }));
        let _ = tx.send((pid, r.is_err()));
    });
    let (pid, panicked) = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("Proc::wait did not return within 60 s: the 2 s bound does not hold");
    assert!(
        panicked,
        "Proc::wait returned although sleep 1000 was running"
    );
    assert!(
        !alive(&pid.to_string()),
        "sleep {pid} still running after the bound expired"
    );
    let _ = std::fs::remove_dir_all(Path::new(&dir));
}
