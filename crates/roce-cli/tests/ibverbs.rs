//! Unmodified Debian ibverbs programs on rocev2 through `rocev2 run` and rocev2's `libibverbs.so.1` (crate
//! `roce-ibverbs`):
//!
//! * `ibv_devices` / `ibv_devinfo -v` list the device of the address given with `--ip` (name, node GUID, port
//!   ACTIVE, link layer Ethernet, RoCE v2 GID `::ffff:a.b.c.d`), and every field `rocev2 devinfo -v -d ADDRESS`
//!   also prints agrees with it — no network traffic;
//! * a program on an address whose UDP 4791 another process owns is told once, on stderr, to start it with
//!   `rocev2 run --ip <next address> -- PROGRAM`;
//! * `ibv_rc_pingpong -g 0` (polling and `-e` events), `ibv_ud_pingpong -g 0`, `ibv_srq_pingpong -g 0` (16 RC QPs
//!   receiving from one shared receive queue; polling and `-e` events), and perftest's `ib_send_bw` (RC,
//!   RC with `-e` events, UD), `ib_write_bw`, `ib_read_bw`, `ib_atomic_bw`, `ib_send_lat`, `ib_write_lat` and
//!   `ib_read_lat`: server and client each under `rocev2 run`, in two network namespaces joined by a veth pair
//!   (`rcetest<pid>-ibverbs…`, 198.18.40.0/24, deleted when the test ends); both sides must exit 0 and print their
//!   result lines. Needs root and `ip netns` (otherwise skipped with the reason).
//!
//! The programs come from Debian's `ibverbs-utils` and `perftest` (installed by `.ci/run`); a missing program is a
//! failure naming the package. The library is `libroce_ibverbs.so` beside the `rocev2` binary: this test builds it
//! (`cargo build -p roce-ibverbs`, a no-op when fresh) so that it is never stale.

mod common;

use std::process::Command;
use std::time::Duration;

use common::{Finished, NetnsPair, Proc, netns_unavailable, scratch, serial, strings, wait_socket};

/// `rocev2 run --ip IP -- ARGS` in this namespace, waited for.
fn run_here(ip: &str, args: &[&str]) -> std::process::Output {
    common::c_libraries();
    common::output_within(
        Command::new(common::bin())
            .args(["run", "--ip", ip, "--"])
            .args(args),
        common::RUN,
    )
}

/// Scale under `rocev2 run` (issue #21): `crates/roce-ibverbs/tests/c/manyqp.c`, an ordinary libibverbs program
/// built with `cc -libverbs`, creates `max_qp` (16,384) QPs on one context (the next is refused with `ENOMEM`), then
/// drives 1,024 RC QP pairs with a 4 KiB RDMA WRITE each in flight at once, four rounds, every byte compared.
#[test]
fn a_program_under_run_creates_max_qp_qps_and_drives_a_thousand_at_once() {
    let dir = scratch("ibverbs-manyqp");
    let src =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../roce-ibverbs/tests/c/manyqp.c");
    let prog = dir.join("manyqp");
    let cc = Command::new("cc")
        .args(["-O1", "-Wall", "-Werror", "-o"])
        .arg(&prog)
        .arg(&src)
        .arg("-libverbs")
        .output()
        .expect("cc runs");
    assert!(
        cc.status.success(),
        "cc failed (Debian's libibverbs-dev installed?):\n{}",
        String::from_utf8_lossy(&cc.stderr)
    );
    let out = run_here("127.0.202.1", &[prog.to_str().expect("utf-8 path")]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.trim() == "ok",
        "{:?}\n--- stdout\n{stdout}--- stderr\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn devices_and_devinfo_list_the_device_of_the_address() {
    common::need_program("ibv_devices", "ibverbs-utils");
    let out = run_here("127.0.0.1", &["ibv_devices"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    // Device `rocev2_<interface of 127.0.0.1>`, node GUID = EUI-64 of MAC 02:00:7f:00:00:01.
    let line = text
        .lines()
        .find(|l| l.contains("rocev2_"))
        .unwrap_or_else(|| panic!("no rocev2 device:\n{text}"));
    let f: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(f, ["rocev2_lo", "00007ffffe000001"], "{text}");

    let out = run_here("127.0.0.1", &["ibv_devinfo", "-v"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    for want in [
        "hca_id:\trocev2_lo",
        "node_guid:\t\t\t0000:7fff:fe00:0001",
        "vendor_part_id:\t\t\t0",
        "phys_port_cnt:\t\t\t1",
        "state:\t\t\tPORT_ACTIVE (4)",
        "link_layer:\t\tEthernet",
        "gid_tbl_len:\t\t1",
        "GID[  0]:\t\t::ffff:127.0.0.1, RoCE v2",
    ] {
        assert!(text.contains(want), "missing {want:?} in:\n{text}");
    }

    // `rocev2 devinfo -v -d ADDRESS` shows the same device as the program run with `--ip ADDRESS` sees: every field
    // both print agrees (identity, limits, port, GID table).
    let ours = common::output_within(
        Command::new(common::bin()).args(["devinfo", "-v", "-d", "127.0.0.1"]),
        common::SHORT,
    );
    assert!(ours.status.success(), "{ours:?}");
    let ours = fields(&String::from_utf8_lossy(&ours.stdout));
    let theirs = fields(&text);
    for key in [
        "hca_id",
        "node_guid",
        "sys_image_guid",
        "vendor_id",
        "vendor_part_id",
        "phys_port_cnt",
        "max_mr_size",
        "page_size_cap",
        "max_qp",
        "max_qp_wr",
        "max_sge",
        "max_cq",
        "max_cqe",
        "max_mr",
        "max_pd",
        "max_qp_rd_atom",
        "max_qp_init_rd_atom",
        "max_ah",
        "max_srq",
        "max_srq_wr",
        "max_srq_sge",
        "state",
        "max_mtu",
        "active_mtu",
        "link_layer",
        "max_msg_sz",
        "gid_tbl_len",
        "GID[  0]",
        "GID[  1]",
    ] {
        assert_eq!(
            ours.get(key),
            theirs.get(key),
            "{key}: rocev2 devinfo -v vs ibv_devinfo -v\n{ours:#?}\n{theirs:#?}"
        );
    }

    // An address no interface has is refused by `rocev2 run` itself.
    let out = run_here("198.51.100.77", &["ibv_devices"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("198.51.100.77"));
}

#[test]
fn a_second_program_on_a_taken_address_is_told_to_use_another() {
    common::need_program("ibv_rc_pingpong", "ibverbs-utils");
    // Another process owns UDP 4791 on the address (here: this test); the program's first verb that needs the
    // device fails, and the library says once on stderr how to start it instead.
    let taken = std::net::UdpSocket::bind("127.0.77.1:4791").expect("bind 127.0.77.1:4791");
    let out = run_here("127.0.77.1", &["ibv_rc_pingpong", "-g", "0"]);
    drop(taken);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{out:?}");
    assert!(
        err.contains("start it with `rocev2 run --ip 127.0.77.2 -- ibv_rc_pingpong"),
        "no remedy in:\n{err}"
    );
    assert_eq!(
        err.matches("rocev2 libibverbs:").count(),
        1,
        "said once:\n{err}"
    );
}

/// Every line of `ibv_devinfo -v`-style text as (name, value), whitespace collapsed: `name: value` lines split at
/// the first `:`, other lines (`NO SUPPORT`, `core clock not supported`) whole with an empty value.
fn all_fields(text: &str) -> Vec<(String, String)> {
    let norm = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| match l.trim().split_once(':') {
            Some((k, v)) => (norm(k), norm(v)),
            None => (norm(l), String::new()),
        })
        .collect()
}

#[test]
fn devinfo_v_prints_every_field_ibv_devinfo_v_prints() {
    common::need_program("ibv_devinfo", "ibverbs-utils");
    let theirs = run_here("127.0.0.1", &["ibv_devinfo", "-v"]);
    assert!(theirs.status.success(), "{theirs:?}");
    let theirs = String::from_utf8_lossy(&theirs.stdout).into_owned();
    let ours = common::output_within(
        Command::new(common::bin()).args(["devinfo", "-v", "-d", "127.0.0.1"]),
        common::SHORT,
    );
    assert!(ours.status.success(), "{ours:?}");
    let ours = String::from_utf8_lossy(&ours.stdout).into_owned();
    // Every (field, value) ibv_devinfo -v prints, as often as it prints it, is in rocev2 devinfo -v's output; the
    // only lines of ours not in theirs are the ones it adds (`max_inline_data`, `netdev`, other addresses, users).
    let mut left = all_fields(&ours);
    let mut missing = Vec::new();
    for f in all_fields(&theirs) {
        match left.iter().position(|x| *x == f) {
            Some(i) => {
                left.remove(i);
            }
            None => missing.push(f),
        }
    }
    assert!(
        missing.is_empty(),
        "ibv_devinfo -v fields missing or different in rocev2 devinfo -v: {missing:#?}\n--- ibv_devinfo -v\n\
         {theirs}--- rocev2 devinfo -v\n{ours}"
    );
    let extra: Vec<&String> = left
        .iter()
        .map(|(k, _)| k)
        .filter(|k| {
            !matches!(
                k.as_str(),
                "max_inline_data" | "netdev" | "other address" | "in use by"
            )
        })
        .collect();
    assert!(
        extra.is_empty(),
        "fields ibv_devinfo -v does not print: {extra:?}\n{ours}"
    );
}

/// The `GID[ i]` lines of `ibv_devinfo`-style text as (index, GID text).
fn gid_lines(text: &str) -> Vec<(usize, String)> {
    text.lines()
        .filter_map(|l| {
            let l = l.trim();
            let rest = l.strip_prefix("GID[")?;
            let (i, g) = rest.split_once("]:")?;
            let g = g.trim().split(',').next()?.trim().to_owned();
            Some((i.trim().parse().ok()?, g))
        })
        .collect()
}

#[test]
fn gid_indexes_agree_across_every_view() {
    common::need_program("ibv_devinfo", "ibverbs-utils");
    // `rocev2 devinfo` (no address) lists GID[i] = g only if a program on g's address reads g at index i; the
    // interface's other addresses are GID[0] of the device opened on them, so they must not appear at another index.
    let out = common::output_within(
        Command::new(common::bin()).args(["devinfo", "-d", "lo"]),
        common::SHORT,
    );
    assert!(out.status.success(), "{out:?}");
    let listing = String::from_utf8_lossy(&out.stdout).into_owned();
    let shown = gid_lines(&listing);
    assert_eq!(shown.first().map(|(i, _)| *i), Some(0), "{listing}");
    for (i, g) in &shown {
        let v6: std::net::Ipv6Addr = g.parse().expect("GID text");
        let ip = v6
            .to_ipv4_mapped()
            .map_or(v6.to_string(), |v4| v4.to_string());
        let prog = run_here(&ip, &["ibv_devinfo", "-v"]);
        assert!(prog.status.success(), "{prog:?}");
        let seen = gid_lines(&String::from_utf8_lossy(&prog.stdout));
        assert!(
            seen.contains(&(*i, g.clone())),
            "rocev2 devinfo shows GID[{i}] {g}; under `rocev2 run --ip {ip}` ibv_devinfo -v shows {seen:?}\n{listing}"
        );
    }
    // A program on an address that is not configured (127.0.0.2 on lo): the verbs answer, sysfs and
    // `rocev2 devinfo -d ADDRESS` agree on its one GID at index 0.
    let prog = run_here("127.0.0.2", &["ibv_devinfo", "-v"]);
    let seen = gid_lines(&String::from_utf8_lossy(&prog.stdout));
    assert_eq!(seen, [(0, "::ffff:127.0.0.2".to_owned())], "{prog:?}");
    let ours = common::output_within(
        Command::new(common::bin()).args(["devinfo", "-v", "-d", "127.0.0.2"]),
        common::SHORT,
    );
    assert_eq!(gid_lines(&String::from_utf8_lossy(&ours.stdout)), seen);
    let sys = run_here(
        "127.0.0.2",
        &[
            "cat",
            "/sys/class/infiniband/rocev2_lo/ports/1/gids/0",
            "/sys/class/infiniband/rocev2_lo/ports/1/gid_attrs/types/0",
        ],
    );
    assert_eq!(
        String::from_utf8_lossy(&sys.stdout),
        "0000:0000:0000:0000:0000:ffff:7f00:0002\nRoCE v2\n",
        "{sys:?}"
    );
}

#[test]
fn a_veth_port_reports_the_speed_of_its_netdev() {
    if let Some(why) = netns_unavailable() {
        eprintln!("SKIPPED (speed netns): {why}");
        return;
    }
    common::need_program("ibv_devinfo", "ibverbs-utils");
    common::c_libraries();
    let _serial = serial();
    let ns = NetnsPair::up("speed", "198.18.41.1", "198.18.41.2", 1500);
    ns.wait_running();
    let in_ns = |args: &[&str]| {
        let out = common::output_within(
            Command::new("ip")
                .args(["netns", "exec", &ns.a, common::bin()])
                .args(args),
            common::RUN,
        );
        assert!(out.status.success(), "{args:?}: {out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let speed = Command::new("ip")
        .args(["netns", "exec", &ns.a, "cat", "/sys/class/net/veth0/speed"])
        .output()
        .expect("ip netns exec");
    assert_eq!(
        String::from_utf8_lossy(&speed.stdout).trim(),
        "10000",
        "a veth reports 10 Gb/s"
    );
    // 10 000 Mb/s is 1X FDR10 (10 Gb/s) in Linux's map, in every view.
    let ip = ns.ip_a.clone();
    let prog = in_ns(&["run", "--ip", &ip, "--", "ibv_devinfo", "-v"]);
    let ours = in_ns(&["devinfo", "-v", "-d", &ip]);
    for text in [&prog, &ours] {
        let f = fields(text);
        assert_eq!(
            f.get("active_width").map(String::as_str),
            Some("1X (1)"),
            "{text}"
        );
        assert_eq!(
            f.get("active_speed").map(String::as_str),
            Some("10.0 Gbps (8)"),
            "{text}"
        );
    }
    let rate = in_ns(&[
        "run",
        "--ip",
        &ip,
        "--",
        "cat",
        "/sys/class/infiniband/rocev2_veth0/ports/1/rate",
    ]);
    assert_eq!(rate, "10 Gb/sec (1X FDR10)\n");
}

/// `key: value` lines of `ibv_devinfo -v`-style text (first occurrence of each key; values trimmed).
fn fields(text: &str) -> std::collections::HashMap<String, String> {
    let mut m = std::collections::HashMap::new();
    for l in text.lines() {
        if let Some((k, v)) = l.trim().split_once(':') {
            m.entry(k.trim().to_owned())
                .or_insert_with(|| v.trim().to_owned());
        }
    }
    m
}

const IP_A: &str = "198.18.40.1";
const IP_B: &str = "198.18.40.2";

/// Server in namespace A, client in B, both `rocev2 run -- PROGRAM ARGS` (the client adds the server address);
/// waits for the server's TCP port `port` before starting the client. Returns (server, client).
fn pair_run(tag: &str, program: &str, args: &[&str], port: u16) -> Option<(Finished, Finished)> {
    if let Some(why) = netns_unavailable() {
        eprintln!("skipped: {why}");
        return None;
    }
    common::c_libraries();
    let _turn = serial();
    let ns = NetnsPair::up(&format!("ibverbs{tag}"), IP_A, IP_B, 1500);
    // The port is ACTIVE only with carrier (as rxe's); perftest refuses a port that is Down.
    ns.wait_running();
    let dir = scratch(&format!("ibverbs-{tag}"));
    let argv = |ns_name: &str, ip: &str, peer: Option<&str>| {
        let mut v = strings(&["run", "--ip", ip, "--", program]);
        v.extend(strings(args));
        v.extend(peer.map(str::to_owned));
        NetnsPair::argv(ns_name, &v)
    };
    let mut server = Proc::spawn("server", &dir, &argv(&ns.a, IP_A, None));
    wait_socket(
        &mut server,
        "tcp",
        [0, 0, 0, 0],
        port,
        Duration::from_secs(60),
    );
    let mut client = Proc::spawn("client", &dir, &argv(&ns.b, IP_B, Some(IP_A)));
    let c = client.wait(Duration::from_secs(120));
    let s = server.wait(Duration::from_secs(60));
    assert!(s.status.success(), "server failed:\n{s}\nclient:\n{c}");
    assert!(c.status.success(), "client failed:\n{c}\nserver:\n{s}");
    Some((s, c))
}

/// Both sides of a pingpong printed the peer's GID and the two result lines for `iters` iterations.
fn check_pingpong(s: &Finished, c: &Finished, iters: u64) {
    for (side, f, remote) in [("server", s, IP_B), ("client", c, IP_A)] {
        let out = &f.stdout;
        assert!(
            out.contains("remote address: LID 0x0000")
                && out.contains(&format!("GID ::ffff:{remote}")),
            "{side}: no remote GID ::ffff:{remote}\n{f}"
        );
        assert!(out.contains(" bytes in "), "{side}: no bandwidth line\n{f}");
        assert!(
            out.contains(&format!("{iters} iters in ")),
            "{side}: no latency line for {iters} iterations\n{f}"
        );
    }
}

#[test]
fn rc_pingpong_between_namespaces_polling_and_with_events() {
    common::need_program("ibv_rc_pingpong", "ibverbs-utils");
    let Some((s, c)) = pair_run("rc", "ibv_rc_pingpong", &["-g", "0", "-n", "200"], 18515) else {
        return;
    };
    check_pingpong(&s, &c, 200);
    let (s, c) = pair_run(
        "rce",
        "ibv_rc_pingpong",
        &["-g", "0", "-n", "200", "-e"],
        18515,
    )
    .expect("ran above");
    check_pingpong(&s, &c, 200);
}

#[test]
fn ud_pingpong_between_namespaces() {
    common::need_program("ibv_ud_pingpong", "ibverbs-utils");
    // UD messages fit the port MTU (1024 on a 1500-byte link).
    let Some((s, c)) = pair_run(
        "ud",
        "ibv_ud_pingpong",
        &["-g", "0", "-n", "200", "-s", "512"],
        18515,
    ) else {
        return;
    };
    check_pingpong(&s, &c, 200);
}

#[test]
fn srq_pingpong_between_namespaces_polling_and_with_events() {
    common::need_program("ibv_srq_pingpong", "ibverbs-utils");
    let Some((s, c)) = pair_run("srq", "ibv_srq_pingpong", &["-g", "0", "-n", "200"], 18515) else {
        return;
    };
    check_pingpong(&s, &c, 200);
    // Every one of the 16 QPs (the default `-q`) connected to its peer.
    for (side, f) in [("server", &s), ("client", &c)] {
        assert_eq!(
            f.stdout.matches("remote address: LID 0x0000").count(),
            16,
            "{side}: 16 QPs\n{f}"
        );
    }
    let (s, c) = pair_run(
        "srqe",
        "ibv_srq_pingpong",
        &["-g", "0", "-n", "200", "-e"],
        18515,
    )
    .expect("ran above");
    check_pingpong(&s, &c, 200);
}

/// One perftest run: program, arguments, the size its result row starts with, the number of columns of that row,
/// and whether the server prints the row too.
struct Perftest {
    program: &'static str,
    args: &'static [&'static str],
    size: &'static str,
    columns: usize,
    server_row: bool,
}

#[test]
fn perftest_bandwidth_and_latency_between_namespaces() {
    common::need_program("ib_send_bw", "perftest");
    // Bandwidth rows: size, iterations, peak and average bandwidth, message rate. Latency rows: size, iterations,
    // t_min, t_max, t_typical, t_avg, t_stdev, 99 % and 99.9 % percentiles.
    let bw = |program, args, size, server_row| Perftest {
        program,
        args,
        size,
        columns: 5,
        server_row,
    };
    let lat = |program, args| Perftest {
        program,
        args,
        size: "64",
        columns: 9,
        server_row: false,
    };
    let runs = [
        bw("ib_send_bw", &["-n", "200", "-s", "4096"][..], "4096", true),
        bw(
            "ib_send_bw",
            &["-n", "200", "-s", "4096", "-e"],
            "4096",
            true,
        ),
        bw(
            "ib_send_bw",
            &["-n", "200", "-s", "512", "-c", "UD"],
            "512",
            true,
        ),
        bw("ib_write_bw", &["-n", "200", "-s", "4096"], "4096", false),
        bw("ib_read_bw", &["-n", "200", "-s", "4096"], "4096", false),
        bw("ib_atomic_bw", &["-n", "200"], "8", false),
        lat("ib_send_lat", &["-n", "200", "-s", "64"]),
        lat("ib_write_lat", &["-n", "200", "-s", "64"]),
        lat("ib_read_lat", &["-n", "200", "-s", "64"]),
    ];
    for (i, r) in runs.iter().enumerate() {
        let Some((s, c)) = pair_run(&format!("pt{i}"), r.program, r.args, 18515) else {
            return;
        };
        let what = format!("{} {}", r.program, r.args.join(" "));
        for (side, f) in [("server", &s), ("client", &c)] {
            assert!(
                f.stdout.contains("Device         : rocev2_veth0"),
                "{what} {side}\n{f}"
            );
            if side == "server" && !r.server_row {
                continue;
            }
            let row = f
                .stdout
                .lines()
                .find(|l| l.split_whitespace().take(2).eq([r.size, "200"]))
                .unwrap_or_else(|| panic!("{what} {side}: no result row\n{f}"));
            assert_eq!(
                row.split_whitespace().count(),
                r.columns,
                "{what} {side}: {row}"
            );
        }
    }
}
