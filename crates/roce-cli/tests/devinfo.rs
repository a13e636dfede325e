//! `rocev2 devinfo`: the loopback device as `ibv_devinfo` would show an rxe device on `lo`, a 1500-byte veth in a
//! network namespace (active MTU 1024), the limits of `-v`, and the programs using a device.

mod common;

use std::process::{Command, Output};
use std::time::{Duration, Instant};

use serde_json::Value;

fn devinfo(args: &[&str]) -> Output {
    common::output_within(
        Command::new(common::bin()).arg("devinfo").args(args),
        common::SHORT,
    )
}

#[test]
fn loopback_device_looks_like_ibv_devinfo() {
    let out = devinfo(&["-d", "lo"]);
    let t = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{t}");
    let lo_mtu: u32 = std::fs::read_to_string("/sys/class/net/lo/mtu")
        .expect("lo mtu")
        .trim()
        .parse()
        .expect("number");
    let active = if lo_mtu >= 4096 + 80 { "4096 (5)" } else { "" };
    for want in [
        "hca_id:\trocev2_lo",
        "transport:              InfiniBand (0)",
        "phys_port_cnt:          1",
        "state:          PORT_ACTIVE (4)",
        "max_mtu:        4096 (5)",
        "link_layer:     Ethernet",
        "GID[  0]:\t::ffff:127.0.0.1, RoCE v2",
    ] {
        assert!(t.contains(want), "`{want}` not in:\n{t}");
    }
    assert!(t.contains(&format!("active_mtu:     {active}")), "{t}");
    assert!(!t.contains("max_qp_wr"), "limits only with -v:\n{t}");
    // An address names its device too; -v adds the limits.
    let out = devinfo(&["-d", "127.0.0.1", "-v"]);
    let t = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{t}");
    for want in [
        "hca_id:\trocev2_lo",
        "max_qp_wr:              16384",
        "max_msg_sz:     0x80000000",
    ] {
        assert!(t.contains(want), "`{want}` not in:\n{t}");
    }
    let out = devinfo(&["-d", "rocev2_lo", "--json"]);
    let v: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v.as_array().map(Vec::len), Some(1), "{v}");
    assert_eq!(v[0]["port"]["gids"][0]["gid"], "::ffff:127.0.0.1");
    let out = devinfo(&["-d", "nosuchdev0"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no device `nosuchdev0`"));
}

#[test]
fn a_device_in_use_names_its_program() {
    let _serial = common::serial();
    let dir = common::scratch("devinfo-use");
    let run_dir = dir.join("run");
    let argv: Vec<String> = [
        "env",
        &format!("ROCEV2_RUN_DIR={}", run_dir.display()),
        common::bin(),
        "perf",
        "send-lat",
        "--loopback",
        "--loopback-ips",
        "127.0.51.1,127.0.51.2",
        "-D",
        "3",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    let mut p = common::Proc::spawn("perf", &dir, &argv);
    let t0 = Instant::now();
    let text = loop {
        let out = common::output_within(
            Command::new(common::bin())
                .args(["devinfo", "-d", "lo"])
                .env("ROCEV2_RUN_DIR", &run_dir),
            common::SHORT,
        );
        let t = String::from_utf8_lossy(&out.stdout).into_owned();
        if t.matches("in use by:").count() >= 2 || t0.elapsed() > Duration::from_secs(10) {
            break t;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let pid = p.pid();
    // The users as `ps` names a process (pid and comm), each on its address (127.0.51.x is not configured on `lo`:
    // any 127/8 address is bound there). Each is GID[0] of the device that program opened (docs/DEVICE.md), so it is
    // not listed at another index of this table.
    for gid in ["::ffff:127.0.51.1", "::ffff:127.0.51.2"] {
        assert!(
            text.contains(&format!(
                "in use by:\tpid {pid} (rocev2) on {gid} (its GID[0])\n"
            )),
            "{gid}:\n{text}"
        );
        assert!(
            !text
                .lines()
                .any(|l| l.contains("GID[") && l.contains(&format!("{gid},"))),
            "{gid} at an index of the GID table of the device on another address:\n{text}"
        );
    }
    let done = p.wait(Duration::from_secs(30));
    assert!(done.status.success(), "{done}");
}

#[test]
fn a_1500_byte_link_offers_mtu_1024() {
    if let Some(why) = common::netns_unavailable() {
        eprintln!("SKIPPED (devinfo netns): {why}");
        return;
    }
    let _serial = common::serial();
    let ns = common::NetnsPair::up("devinfo", "198.18.31.1", "198.18.31.2", 1500);
    let out = common::output_within(
        Command::new("ip").args([
            "netns",
            "exec",
            &ns.a,
            common::bin(),
            "devinfo",
            "-d",
            &ns.ip_a,
        ]),
        common::SHORT,
    );
    let t = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{t}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for want in [
        "active_mtu:     1024 (3)",
        "GID[  0]:\t::ffff:198.18.31.1, RoCE v2",
        "(1500)",
    ] {
        assert!(t.contains(want), "`{want}` not in:\n{t}");
    }
}
