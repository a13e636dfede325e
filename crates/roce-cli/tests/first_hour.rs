//! What a new user meets in the first hour (issue #18 item 9), each case one thing that tripped a user up:
//! * `rocev2 perf` without a test lists the tests (clap's "required argument" error named none);
//! * the perf header names the peer in the user's terms, not an internal format name (`Rocev2V1`);
//! * `rocev2 run` without `libroce_ibverbs.so` beside it names the one command that builds it — README's build
//!   command, for the profile the `rocev2` binary itself was built with (a debug `rocev2` was told to build a
//!   release library, which it would not find);
//! * the perf header's link type names the link actually opened (`--link xdp` said UDP; after its fallback it is
//!   the UDP link, named as such);
//! * README leads with the two commands a newcomer needs (the main job, the tests), each in its own block.
//!
//! `decode`'s PSN format and flag names are checked in `decode.rs` (`text_psn_is_hex_and_migreq_is_named`).

mod common;

use std::process::Command;

use common::{bin, scratch, serial};

#[test]
fn perf_without_a_test_lists_the_tests() {
    let out = common::output_within(Command::new(bin()).arg("perf"), common::SHORT);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    for t in [
        "send-bw",
        "write-bw",
        "read-bw",
        "atomic-bw",
        "send-lat",
        "write-lat",
        "read-lat",
        "atomic-lat",
    ] {
        assert!(err.contains(t), "{t} listed: {err}");
    }
    assert!(err.contains("--loopback"), "how to start one: {err}");
    // A wrong test name is still clap's error, which lists the possible values.
    let bad = common::output_within(
        Command::new(bin()).args(["perf", "write-bandwidth"]),
        common::SHORT,
    );
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("write-bw"));
}

#[test]
fn perf_header_names_the_peer_plainly() {
    let _s = serial();
    let out = common::output_within(
        Command::new(bin()).args(["perf", "write-bw", "--loopback", "-n", "10"]),
        common::RUN,
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let peer = text
        .lines()
        .find(|l| l.trim_start().starts_with("Peer"))
        .unwrap_or_else(|| panic!("a Peer line: {text}"));
    assert!(peer.contains("rocev2 perf"), "{peer}");
    assert!(peer.contains("--perftest-compat"), "{peer}");
    for jargon in ["Rocev2V1", "out-of-band format"] {
        assert!(!text.contains(jargon), "{jargon:?} in the header: {text}");
    }
}

/// The `Link type` line of perf's header named "UDP 4791" whatever `--link` opened (issue #18's fresh-user
/// finding: `--link xdp` printed the UDP header). It names the link actually used: the UDP link, and after `--link
/// xdp` fell back (a loopback address: no AF_XDP there, no privilege needed to see it) the UDP link with the
/// fallback, whose cause is on stderr. AF_XDP itself is checked in `xdp_netns.rs` (root).
#[test]
fn perf_header_names_the_link_used() {
    let _s = serial();
    let run = |extra: &[&str]| {
        let out = common::output_within(
            Command::new(bin())
                .args([
                    "perf",
                    "write-bw",
                    "--loopback",
                    "--loopback-ips",
                    "127.0.215.1,127.0.215.2",
                    "-n",
                    "10",
                ])
                .args(extra),
            common::RUN,
        );
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{extra:?}: {text}{err}");
        let link = text
            .lines()
            .find(|l| l.trim_start().starts_with("Link type"))
            .unwrap_or_else(|| panic!("{extra:?}: a Link type line: {text}"))
            .to_owned();
        (link, err)
    };
    let (udp, _) = run(&[]);
    assert!(udp.contains("on the UDP link"), "{udp}");
    assert!(!udp.contains("xdp") && !udp.contains("XDP"), "{udp}");
    let (fallback, err) = run(&["--link", "xdp"]);
    assert!(
        err.contains("AF_XDP cannot be used") && err.contains("using the UDP link"),
        "the fallback says why: {err}"
    );
    assert!(fallback.contains("on the UDP link"), "{fallback}");
    assert!(fallback.contains("--link xdp fell back"), "{fallback}");
    assert!(!fallback.contains("AF_XDP link ("), "{fallback}");
}

/// Over AF_XDP (both sides `--link xdp` between two namespaces, 198.18.51.0/24; root) the header of each side names
/// the AF_XDP link and its interface; it said "UDP 4791" as for the UDP link.
#[test]
fn perf_header_names_the_af_xdp_link() {
    if let Some(why) = common::netns_unavailable() {
        eprintln!("SKIPPED (first_hour AF_XDP header): {why}; needs root and `ip netns`");
        return;
    }
    if let Err(e) = roce_link::xdp::probe() {
        eprintln!("SKIPPED (first_hour AF_XDP header): no AF_XDP here: {e}");
        return;
    }
    let _s = serial();
    let (ip_a, ip_b) = ("198.18.51.1", "198.18.51.2");
    let ns = common::NetnsPair::up("fhxdp", ip_a, ip_b, 1500);
    ns.wait_running();
    let dir = scratch("first-hour-xdp");
    let srv = common::strings(&[
        "perf", "write-bw", "--ip", ip_a, "-p", "19511", "--link", "xdp",
    ]);
    let mut server = common::Proc::spawn("server", &dir, &common::NetnsPair::argv(&ns.a, &srv));
    common::wait_socket(
        &mut server,
        "tcp",
        ns.octets_a(),
        19511,
        std::time::Duration::from_secs(20),
    );
    let cli = common::strings(&[
        "perf",
        "write-bw",
        ip_a,
        "--ip",
        ip_b,
        "-p",
        "19511",
        "-n",
        "100",
        "--link",
        "xdp",
        "--timeout",
        "20",
    ]);
    let client = common::Proc::spawn("client", &dir, &common::NetnsPair::argv(&ns.b, &cli))
        .wait(std::time::Duration::from_secs(60));
    let server = server.wait(std::time::Duration::from_secs(30));
    assert!(
        client.status.success() && server.status.success(),
        "client {client}\nserver {server}"
    );
    for (side, f) in [("client", &client), ("server", &server)] {
        assert!(f.stderr.contains("AF_XDP link on veth0"), "{side}: {f}");
        let link = f
            .stdout
            .lines()
            .find(|l| l.trim_start().starts_with("Link type"))
            .unwrap_or_else(|| panic!("{side}: a Link type line: {f}"));
        assert!(
            link.contains("on the AF_XDP link (veth0, "),
            "{side}: {link}"
        );
        assert!(!link.contains("UDP link"), "{side}: {link}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// README's Quick start (issue #18's fresh-user finding: it was hard to scan): the two commands a newcomer needs,
/// the main job and the tests, are README's first two code blocks, each alone in its block, before the status table;
/// the test command is the one `.ci/run` runs.
#[test]
fn readme_leads_with_the_main_job_and_the_tests() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let readme = std::fs::read_to_string(root.join("README.md")).expect("README.md");
    let mut blocks = Vec::new();
    let mut lines = readme.lines().enumerate();
    while let Some((n, l)) = lines.next() {
        if l.starts_with("```") {
            let body: Vec<&str> = lines
                .by_ref()
                .map(|(_, l)| l)
                .take_while(|l| !l.starts_with("```"))
                .collect();
            blocks.push((n, body));
        }
    }
    let test = "cargo test --workspace --release --no-fail-fast";
    assert_eq!(
        blocks.first().map(|b| b.1.clone()),
        Some(vec![
            "cargo run --release -p roce-cli -- perf write-bw --loopback"
        ]),
        "the main job first"
    );
    assert_eq!(
        blocks.get(1).map(|b| b.1.clone()),
        Some(vec![test]),
        "the tests second"
    );
    let status = readme
        .lines()
        .position(|l| l.starts_with("## Status"))
        .expect("a Status section");
    assert!(blocks[1].0 < status, "both before the status table");
    let prereq = readme
        .lines()
        .take(blocks[0].0)
        .any(|l| l.starts_with("Prerequisites:"));
    assert!(prereq, "the prerequisites above the commands");
    let ci = std::fs::read_to_string(root.join(".ci/run")).expect(".ci/run");
    assert!(
        ci.lines().any(|l| l.trim_start().starts_with(test)),
        ".ci/run runs README's test command"
    );
}

/// The build command of README's Quick start: the first line of a `sh` block that starts with `cargo build`.
fn readme_build_command() -> String {
    let readme = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md"),
    )
    .expect("README.md");
    readme
        .lines()
        .find(|l| l.starts_with("cargo build"))
        .expect("a `cargo build` line in README")
        .trim()
        .to_owned()
}

/// `rocev2 run` copied into `target/debug`-, `target/release`-named and other directories without the library.
/// The command named is README's build command (`cargo build --release`, which makes both libraries `rocev2 run`
/// needs), or its debug twin; it said `cargo build --release -p roce-ibverbs`, which builds neither
/// `libroce_rdmacm.so` nor with README's feature set (issue #18's fresh-user finding).
#[test]
fn run_names_the_build_command_for_its_profile() {
    let readme = readme_build_command();
    assert_eq!(readme, "cargo build --release", "README's build command");
    let root = scratch("first-hour-run");
    let cases = [
        ("release", format!("`{readme}` in the rocev2 checkout")),
        ("debug", "`cargo build` in the rocev2 checkout".to_owned()),
        (
            "bin",
            format!(
                "`{readme}` (README's build command) and copy target/release/libroce_ibverbs.so and \
                 target/release/libroce_rdmacm.so to "
            ),
        ),
    ];
    for (dir, want) in cases {
        let d = root.join(dir);
        std::fs::create_dir_all(&d).expect("mkdir");
        let exe = d.join("rocev2");
        std::fs::copy(bin(), &exe).expect("copy rocev2");
        let out = common::output_within(
            Command::new(&exe)
                .args(["run", "--", "true"])
                .env_remove("ROCEV2_IBVERBS_LIB"),
            common::RUN,
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{dir}: {err}");
        assert!(err.contains("libroce_ibverbs.so not found"), "{dir}: {err}");
        assert!(err.contains(&want), "{dir}: wants {want:?}: {err}");
        assert!(
            !err.contains(" -p roce-"),
            "{dir}: one build for every library, not a -p build: {err}"
        );
        if dir == "debug" {
            assert!(
                !err.contains("--release"),
                "a debug rocev2 needs a debug library: {err}"
            );
        }
    }
    let _ = std::fs::remove_dir_all(&root);
}

/// A run killed by a signal never removes its stats endpoint socket (`<run dir>/<pid>.<start>.<n>.sock`); the next
/// rocev2 program that starts a runtime there removes it, so they do not pile up in `/run/rocev2` (before, only a
/// `rocev2 stat` did).
#[test]
fn a_killed_runs_socket_is_removed_by_the_next_run() {
    let _s = serial();
    let run_dir = scratch("first-hour-stale").join("run");
    std::fs::create_dir_all(&run_dir).expect("run dir");
    let socks = |pid: Option<u32>| -> Vec<std::path::PathBuf> {
        std::fs::read_dir(&run_dir)
            .map(|rd| {
                rd.flatten()
                    .map(|e| e.path())
                    .filter(|p| p.extension().is_some_and(|x| x == "sock"))
                    .filter(|p| {
                        pid.is_none_or(|pid| {
                            p.file_name()
                                .and_then(|n| n.to_str())
                                .is_some_and(|n| n.starts_with(&format!("{pid}.")))
                        })
                    })
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut victim = Command::new(bin())
        .args(["perf", "write-bw", "--loopback", "-D", "30"])
        .env("ROCEV2_RUN_DIR", &run_dir)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start the run to kill");
    let t0 = std::time::Instant::now();
    while socks(Some(victim.id())).is_empty() {
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(20),
            "no endpoint socket appeared"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    victim.kill().expect("SIGKILL");
    let _ = victim.wait();
    let left = socks(Some(victim.id()));
    assert!(!left.is_empty(), "the killed run's socket is left behind");
    let out = common::output_within(
        Command::new(bin())
            .args(["perf", "write-bw", "--loopback", "-n", "10"])
            .env("ROCEV2_RUN_DIR", &run_dir),
        common::RUN,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for p in &left {
        assert!(!p.exists(), "{} is still there", p.display());
    }
    assert!(socks(None).is_empty(), "left over: {:?}", socks(None));
}

// The UC/UD sweep of issue #18 item 8 is tested in perf.rs (`unreliable_sweeps_do_not_wait_out_every_size`).

/// `rocev2 pingpong --help` said "use -g 1" while the README runs rdma-core's tools under `rocev2 run` with `-g 0`
/// (issue #18 item 5): both are right for their device, and the help now says which is which.
#[test]
fn pingpong_help_says_which_gid_index_where() {
    let out = common::output_within(
        Command::new(bin()).args(["pingpong", "--help"]),
        common::SHORT,
    );
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{help}");
    assert!(help.contains("ibv_rc_pingpong -g 1"), "{help}");
    assert!(
        help.contains("rocev2 run --ip 198.18.0.2 -- ibv_rc_pingpong -g 0"),
        "{help}"
    );
    assert!(
        help.contains("1 on\nLinux rxe") || help.contains("1 on Linux rxe"),
        "{help}"
    );
    assert!(help.contains("0 under `rocev2 run`"), "{help}");
}
