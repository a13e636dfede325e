//! `rocev2 perf` flag values as perftest treats them: a value perftest refuses is refused with exit status 2 and a
//! message naming the flag; a value perftest adjusts is adjusted with a printed note; nothing is changed silently.
//! The runs that must start use `--loopback` on their own 127.0.N.x pair, one at a time.

mod common;

use std::process::{Command, Output};

use serde_json::Value;

fn rocev2(args: &[&str]) -> Output {
    common::output_within(Command::new(common::bin()).args(args), common::RUN)
}

#[test]
fn values_perftest_refuses_are_refused_with_the_flag_named() {
    let cases: &[(&[&str], &str)] = &[
        (&["write-bw", "-q", "0"], "-q 0"),
        (&["write-bw", "-q", "16385"], "-q 16385"),
        (
            &["write-bw", "-q", "16384", "-t", "15000"],
            "at most 2097152 send WRs",
        ),
        (&["write-bw", "-t", "0"], "-t 0"),
        (&["write-bw", "-t", "100000"], "-t 100000"),
        (
            &["write-lat", "-q", "4"],
            "only available in bandwidth tests",
        ),
        (
            &["atomic-bw", "-s", "16"],
            "cannot be changed for atomic tests",
        ),
        (&["write-bw", "-n", "4"], "-n 4"),
        (&["write-bw", "-Q", "0"], "-Q 0"),
        (&["write-bw", "-Q", "2000"], "-Q 2000"),
        (
            &["write-bw", "-l", "4", "-n", "10"],
            "multiple of the post list",
        ),
        (
            &["write-bw", "-l", "4", "-Q", "8"],
            "multiple of the CQ moderation",
        ),
        (&["write-bw", "-l", "256"], "longer than the TX depth"),
        (&["send-lat", "-l", "2"], "bandwidth tests only"),
        (&["read-bw", "-I", "16"], "not available on READ and atomic"),
        (
            &["atomic-lat", "-I", "16"],
            "not available on READ and atomic",
        ),
        (&["write-bw", "-s", "9M"], "-s 9437184"),
        (&["write-bw", "-s", "0"], "-s 0"),
        (&["write-bw", "-a", "-D", "2"], "all sizes"),
        (&["read-bw", "-c", "UC"], "does not run over UC"),
        (&["write-lat", "-b"], "only available in bandwidth tests"),
        (
            &["write-bw", "-b", "--run_infinitely"],
            "-b with --run_infinitely",
        ),
        (
            &["write-bw", "--output", "latency"],
            "bandwidth, message_rate",
        ),
        (&["send-lat", "--output", "bandwidth"], "can be: latency"),
        (
            &["write-bw", "--ip", "192.0.2.77"],
            "no interface in this network namespace has address 192.0.2.77",
        ),
        (&["write-bw", "-O"], "one port"),
        (&["write-bw", "--dualport"], "one port"),
        (
            &["write-bw", "-R"],
            "rocev2 run --ip ADDRESS -- ib_send_bw -R",
        ),
        (
            &["send-lat", "--rdma_cm"],
            "rocev2 run --ip ADDRESS -- ib_send_bw -R",
        ),
    ];
    for (args, want) in cases {
        let mut v = vec!["perf"];
        v.extend_from_slice(args);
        v.push("--loopback");
        let out = rocev2(&v);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{v:?}: {err}");
        assert!(err.contains(want), "{v:?}: `{want}` not in: {err}");
    }
}

#[test]
fn a_server_address_beside_loopback_is_refused() {
    // It used to be ignored: the run went to 127.0.0.1 whatever the address said.
    let out = rocev2(&["perf", "write-bw", "198.18.99.1", "--loopback"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--loopback") && err.contains("198.18.99.1"),
        "{err}"
    );
}

fn banner_value(stdout: &str, key: &str) -> String {
    stdout
        .lines()
        .find(|l| l.trim_start().starts_with(key))
        .and_then(|l| l.split(':').nth(1))
        .map(|v| v.split_whitespace().next().unwrap_or("").to_owned())
        .unwrap_or_else(|| panic!("no `{key}` in the banner:\n{stdout}"))
}

#[test]
fn adjusted_values_come_with_a_note() {
    let _serial = common::serial();
    // -Q above the TX depth: perftest lowers it to the TX depth; so do we, and say so.
    let out = rocev2(&[
        "perf",
        "write-bw",
        "--loopback",
        "--loopback-ips",
        "127.0.44.1,127.0.44.2",
        "-Q",
        "1000",
        "-n",
        "200",
        "-s",
        "64",
    ]);
    let (so, se) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{so}{se}");
    assert!(se.contains("note: -Q 1000"), "{se}");
    assert_eq!(banner_value(&so, "CQ Moderation"), "128", "{so}");
    // A post list without -Q: CQ moderation follows the post list (perftest's note).
    let out = rocev2(&[
        "perf",
        "write-bw",
        "--loopback",
        "--loopback-ips",
        "127.0.44.1,127.0.44.2",
        "-l",
        "4",
        "-n",
        "200",
        "-s",
        "64",
    ]);
    let (so, se) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{so}{se}");
    assert!(
        se.contains("CQ moderation will be the size of the post list"),
        "{se}"
    );
    assert_eq!(banner_value(&so, "CQ Moderation"), "4", "{so}");
    assert_eq!(banner_value(&so, "Post List"), "4", "{so}");
}

fn json_run(args: &[&str]) -> Vec<Value> {
    let mut v = vec!["perf"];
    v.extend_from_slice(args);
    v.extend_from_slice(&["--json", "--timeout", "20"]);
    let out = rocev2(&v);
    let (so, se) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{v:?}: {so}{se}");
    so.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect()
}

#[test]
fn ud_without_size_sends_mtu_sized_messages() {
    let _serial = common::serial();
    // perftest's UD default is the MTU; rocev2 refused its own 65536-byte default before.
    let v = json_run(&[
        "send-bw",
        "-c",
        "UD",
        "--loopback",
        "--loopback-ips",
        "127.0.45.1,127.0.45.2",
        "-n",
        "50",
    ]);
    assert_eq!(v[0]["size"], 4096, "{}", v[0]);
    assert_eq!(v[0]["verified"], true, "{}", v[0]);
    // With -m the MTU given.
    let v = json_run(&[
        "send-lat",
        "-c",
        "UD",
        "--loopback",
        "--loopback-ips",
        "127.0.45.1,127.0.45.2",
        "-n",
        "20",
        "-m",
        "1024",
    ]);
    assert_eq!(
        v[0]["size"], 2,
        "latency keeps perftest's 2-byte default: {}",
        v[0]
    );
    let v = json_run(&[
        "send-bw",
        "-c",
        "UD",
        "--loopback",
        "--loopback-ips",
        "127.0.45.1,127.0.45.2",
        "-n",
        "20",
        "-m",
        "1024",
    ]);
    assert_eq!(v[0]["size"], 1024, "{}", v[0]);
}

#[test]
fn sizes_take_perftest_suffixes() {
    let _serial = common::serial();
    let v = json_run(&[
        "write-bw",
        "--loopback",
        "--loopback-ips",
        "127.0.46.1,127.0.46.2",
        "-s",
        "64K",
        "-n",
        "20",
    ]);
    assert_eq!(v[0]["size"], 65536, "{}", v[0]);
}

#[test]
fn perftest_spellings_are_accepted() {
    let _serial = common::serial();
    // perftest spells these with underscores or dashes; both are accepted (clap refused the other spelling).
    let v = json_run(&[
        "write-bw",
        "--loopback",
        "--tx_depth",
        "64",
        "--post-list",
        "2",
        "--cq_mod",
        "2",
        "--inline-size",
        "64",
        "--report-gbits",
        "--use-hugepages",
        "--qp_timeout",
        "14",
        "--gid_index",
        "0",
        "-n",
        "20",
        "-s",
        "64",
    ]);
    assert_eq!(v[0]["verified"], true, "{}", v[0]);
    let v = json_run(&[
        "write-bw",
        "--loopback",
        "--tx-depth",
        "64",
        "--post_list",
        "2",
        "--cq-mod",
        "2",
        "--inline_size",
        "64",
        "--report_gbits",
        "--use_hugepages",
        "--tos",
        "0",
        "-n",
        "20",
        "-s",
        "64",
    ]);
    assert_eq!(v[0]["verified"], true, "{}", v[0]);
}

#[test]
fn default_inline_sizes_are_perftests() {
    let _serial = common::serial();
    // perftest_parameters.h DEF_INLINE_WRITE 220, DEF_INLINE_SEND_RC_UC 236, DEF_INLINE_SEND_UD 188; ctx_set_max_inline
    // applies them to latency tests only (READ, atomics and bandwidth tests: 0). rocev2 used 220 for every latency test.
    let cases: &[(&str, &str, &str)] = &[
        ("send-lat", "RC", "236[B]"),
        ("send-lat", "UC", "236[B]"),
        ("send-lat", "UD", "188[B]"),
        ("write-lat", "RC", "220[B]"),
        ("write-lat", "UC", "220[B]"),
        ("read-lat", "RC", "0[B]"),
        ("atomic-lat", "RC", "0[B]"),
        ("send-bw", "RC", "0[B]"),
        ("write-bw", "RC", "0[B]"),
    ];
    let ips = common::loopback_ips(47);
    for (test, conn, want) in cases {
        // --perftest-compat (two processes, no banner) takes its inline size from the same parameters.
        let args = [
            "perf",
            test,
            "-c",
            conn,
            "--loopback",
            "--loopback-ips",
            &ips,
            "-n",
            "10",
            "-s",
            "8",
        ];
        let out = rocev2(&args);
        let (so, se) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        assert!(out.status.success(), "{args:?}: {so}{se}");
        assert_eq!(
            banner_value(&so, "Max inline data"),
            *want,
            "{args:?}: {so}"
        );
    }
}

/// perftest flags users type that clap used to reject as "unexpected argument" (issue #18 item 4): what maps to
/// rocev2 is accepted (`-i 1`, `-S 0`, `--report-both` with `-b`), the rest is refused naming the flag, perftest's
/// meaning and why.
#[test]
fn perftest_flags_are_mapped_or_refused_with_their_meaning() {
    let refused: &[(&[&str], &[&str])] = &[
        (
            &["write-bw", "-i", "2"],
            &["-i/--ib-port 2", "one port, 1", "--ip"],
        ),
        (&["write-bw", "--ib-port", "2"], &["-i/--ib-port 2"]),
        (
            &["send-lat", "-S", "3"],
            &["-S/--sl 3", "802.1p", "-T/--tclass"],
        ),
        (&["write-bw", "--report-both"], &["--report-both", "add -b"]),
        (
            &["write-bw", "--cpu_util", "-D", "2"],
            &["--cpu_util", "CPU utilisation", "time"],
        ),
        (
            &["write-bw", "-z"],
            &[
                "-z/--com_rdma_cm",
                "connection manager",
                "TCP",
                "rocev2 run",
            ],
        ),
        (
            &["write-bw", "-w", "10"],
            &["-w/--limit_bw 10", "pass/fail"],
        ),
    ];
    for (args, wants) in refused {
        let mut v = vec!["perf"];
        v.extend_from_slice(args);
        v.push("--loopback");
        let out = rocev2(&v);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{v:?}: {err}");
        assert!(!err.contains("unexpected argument"), "{v:?}: {err}");
        for want in *wants {
            assert!(err.contains(want), "{v:?}: `{want}` not in: {err}");
        }
    }
    let _serial = common::serial();
    let out = rocev2(&[
        "perf",
        "write-bw",
        "--loopback",
        "-i",
        "1",
        "-S",
        "0",
        "-b",
        "--report-both",
        "-n",
        "20",
        "-s",
        "4096",
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let row = |label: &str| {
        text.lines()
            .find(|l| l.ends_with(label))
            .unwrap_or_else(|| panic!("no line ending {label:?}: {text}"))
            .split_whitespace()
            .next()
            .map(str::to_owned)
    };
    // Each direction's own line, in the table's layout (the size first).
    assert_eq!(
        row("(sent by this side)").as_deref(),
        Some("4096"),
        "{text}"
    );
    assert_eq!(row("(sent by the peer)").as_deref(), Some("4096"), "{text}");
}
