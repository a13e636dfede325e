//! The progress line of long `rocev2 perf` runs (`-a`, `-D`, large `-n`; issue #11): drawn on stderr when stderr is
//! a terminal, never on stdout, never with `--json` or `--output`, never on a short run or when piped. The terminal
//! is a pseudo-terminal made by util-linux `script` (package bsdutils, essential on Debian) with `TERM=xterm`; what
//! the terminal showed is `script`'s output. Every run is in loopback on its own 127.0.21x pair.

use std::path::Path;
use std::process::{Command, Stdio};

use serde_json::Value;

mod common;

use common::loopback_ips as ips;

/// The sizes of `-a`: 2 B to 8 MiB.
fn sweep() -> Vec<u64> {
    common::SweepCase {
        test: "write-bw",
        conn: "RC",
    }
    .sizes(u64::MAX)
}

/// Runs `rocev2 args` with stderr, and stdout unless `stdout_file` is given, on a pseudo-terminal; returns
/// whether it exited 0 and the bytes the terminal received.
fn on_terminal(args: &[&str], stdout_file: Option<&Path>) -> (bool, String) {
    let mut cmd = format!("'{}'", common::bin());
    for a in args {
        assert!(!a.contains('\''), "{a}");
        cmd += &format!(" '{a}'");
    }
    if let Some(f) = stdout_file {
        cmd += &format!(" >'{}'", f.display());
    }
    let out = common::output_within(
        Command::new("script")
            .args(["-qec", &cmd, "/dev/null"])
            .env("TERM", "xterm")
            .stdin(Stdio::null())
            .stderr(Stdio::inherit()),
        common::RUN,
    );
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// The lines a terminal ends up showing: each received line from its last line-clear (`ESC [2K`, how the
/// progress line is removed before a result line is printed) or carriage return on.
fn screen_lines(t: &str) -> Vec<String> {
    t.split('\n')
        .map(|l| {
            let l = l.strip_suffix('\r').unwrap_or(l);
            let l = l.rsplit("\x1b[2K").next().unwrap_or(l);
            l.rsplit('\r').next().unwrap_or(l).to_owned()
        })
        .collect()
}

/// The bandwidth result lines of a table (`#bytes #iterations peak average rate`) as (size, iterations).
fn bw_results(lines: &[String]) -> Vec<(u64, u64)> {
    lines
        .iter()
        .filter_map(|l| {
            let c: Vec<&str> = l.split_whitespace().collect();
            match (c.len(), c.first()?.parse().ok(), c.get(1)?.parse().ok()) {
                (5, Some(s), Some(n)) => Some((s, n)),
                _ => None,
            }
        })
        .collect()
}

/// `text` with every whitespace-separated word that holds a digit replaced by `#` (measured numbers, ports,
/// addresses), one space between words.
fn masked(text: &str) -> Vec<String> {
    text.lines()
        .map(|l| {
            l.split_whitespace()
                .map(|w| {
                    if w.bytes().any(|b| b.is_ascii_digit()) {
                        "#"
                    } else {
                        w
                    }
                })
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect()
}

#[test]
fn a_sweep_on_a_terminal_shows_progress_and_the_same_result_lines() {
    let _serial = common::serial();
    let ips = ips(214);
    let args = [
        "perf",
        "write-bw",
        "--loopback",
        "--loopback-ips",
        &ips,
        "-a",
        "-n",
        "5",
    ];
    let want: Vec<(u64, u64)> = sweep().into_iter().map(|s| (s, 5)).collect();

    // Everything on one terminal: the line names each size, and is lifted for each result line.
    let (ok, t) = on_terminal(&args, None);
    assert!(ok, "{t}");
    for (k, size) in sweep().iter().enumerate() {
        let msg = format!("{size} B ({}/23) [", k + 1);
        assert!(
            t.contains(&msg),
            "no progress line {msg:?} on the terminal:\n{t:?}"
        );
    }
    let screen = screen_lines(&t);
    assert_eq!(bw_results(&screen), want, "{t:?}");
    let last = screen.iter().rev().find(|l| !l.trim().is_empty());
    assert!(
        last.is_some_and(|l| l.starts_with("-----")),
        "the progress line was not removed before the footer: {last:?}\n{t:?}"
    );

    // stdout to a file, stderr on the terminal: the progress line only on the terminal.
    let dir = common::scratch("perf-progress");
    let file = dir.join("stdout.txt");
    let (ok, t) = on_terminal(&args, Some(&file));
    assert!(ok, "{t}");
    assert!(t.contains("8388608 B (23/23) ["), "{t:?}");
    let with_bar = std::fs::read_to_string(&file).expect("read stdout");
    assert!(
        !with_bar.contains(['\x1b', '\r']),
        "terminal control on stdout: {with_bar:?}"
    );

    // Piped: nothing on stderr, and stdout is line for line what the terminal run printed (numbers aside).
    let piped = common::output_within(Command::new(common::bin()).args(args), common::RUN);
    let stdout = String::from_utf8_lossy(&piped.stdout);
    let stderr = String::from_utf8_lossy(&piped.stderr);
    assert!(piped.status.success(), "{stdout}\n{stderr}");
    assert_eq!(stderr, "", "a piped run wrote to stderr");
    assert_eq!(masked(&stdout), masked(&with_bar));
    let lines: Vec<String> = stdout.lines().map(str::to_owned).collect();
    assert_eq!(bw_results(&lines), want, "{stdout}");
}

#[test]
fn json_output_and_short_runs_draw_nothing_on_a_terminal() {
    let _serial = common::serial();
    let ips = ips(215);
    let sweep_args = |extra: &'static [&'static str]| {
        let mut v = vec![
            "perf",
            "write-bw",
            "--loopback",
            "--loopback-ips",
            &ips,
            "-a",
            "-n",
            "5",
        ];
        v.extend_from_slice(extra);
        v
    };

    // --json: one JSON object per size and nothing else.
    let (ok, t) = on_terminal(&sweep_args(&["--json"]), None);
    assert!(ok, "{t}");
    assert!(!t.contains('\x1b'), "terminal control with --json: {t:?}");
    let sizes: Vec<u64> = t
        .split_terminator("\r\n")
        .map(|l| {
            let v: Value =
                serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l:?}"));
            v["size"].as_u64().expect("size")
        })
        .collect();
    assert_eq!(sizes, sweep());

    // --output: one number per size and nothing else.
    let (ok, t) = on_terminal(&sweep_args(&["--output", "bandwidth"]), None);
    assert!(ok, "{t}");
    assert!(!t.contains('\x1b'), "terminal control with --output: {t:?}");
    let numbers: Vec<f64> = t
        .split_terminator("\r\n")
        .map(|l| l.parse().unwrap_or_else(|e| panic!("{e}: {l:?}")))
        .collect();
    assert_eq!(numbers.len(), sweep().len(), "{t:?}");

    // One short size: the table alone.
    let (ok, t) = on_terminal(
        &[
            "perf",
            "write-bw",
            "--loopback",
            "--loopback-ips",
            &ips,
            "-s",
            "64",
            "-n",
            "100",
        ],
        None,
    );
    assert!(ok, "{t}");
    assert!(
        !t.contains('\x1b'),
        "terminal control on a short run: {t:?}"
    );
    assert_eq!(bw_results(&screen_lines(&t)), [(64, 100)], "{t:?}");
}

#[test]
fn duration_and_large_iteration_runs_show_progress_on_a_terminal() {
    let _serial = common::serial();
    let ips = ips(216);
    // -D: the line counts the run's time.
    let (ok, t) = on_terminal(
        &[
            "perf",
            "write-lat",
            "--loopback",
            "--loopback-ips",
            &ips,
            "-s",
            "64",
            "-D",
            "1",
        ],
        None,
    );
    assert!(ok, "{t}");
    assert!(t.contains("64 B ["), "no progress line with -D:\n{t:?}");
    let result = screen_lines(&t)
        .into_iter()
        .find(|l| l.split_whitespace().next() == Some("64") && l.split_whitespace().count() == 9);
    assert!(result.is_some(), "no latency result line: {t:?}");

    // -n of 10 000 or more: the line counts completions.
    let (ok, t) = on_terminal(
        &[
            "perf",
            "write-bw",
            "--loopback",
            "--loopback-ips",
            &ips,
            "-s",
            "64",
            "-n",
            "20000",
        ],
        None,
    );
    assert!(ok, "{t}");
    assert!(
        t.contains("64 B ["),
        "no progress line with -n 20000:\n{t:?}"
    );
    assert_eq!(bw_results(&screen_lines(&t)), [(64, 20000)], "{t:?}");
}
