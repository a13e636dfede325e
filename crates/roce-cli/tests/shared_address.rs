//! Many processes on one device address (issue #16, `docs/MULTIPROCESS.md`): two unmodified `ibv_rc_pingpong`
//! servers under `rocev2 run` on one address and their two clients under `rocev2 run` on another — four processes,
//! two per address, all on UDP 4791 — each pair completes its iterations. Each process of an address numbers its
//! QPs inside its own slot (QPNs `0x00....`, `0x01....`, ...), and the kernel's SK_REUSEPORT program hands every packet
//! to the process owning its destination QP; `rocev2 devinfo` lists both programs under the one GID. Needs root
//! (CAP_BPF) and `ibverbs-utils`; when the kernel refuses the steering, the test is skipped with the reason the
//! second process prints. Without CAP_BPF (setpriv drops it), a second program on a taken address is refused and
//! told what sharing needs.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

fn pingpong(ip: &str, port: u16, server: Option<&str>) -> common::Proc {
    let port = port.to_string();
    let mut args = vec![
        "run",
        "--ip",
        ip,
        "--",
        "ibv_rc_pingpong",
        "-g",
        "0",
        "-n",
        "300",
        "-p",
        &port,
    ];
    args.extend(server);
    let dir = common::scratch(&format!("shared-address-{ip}-{port}"));
    common::Proc::spawn_command("pingpong", &dir, Command::new(common::bin()).args(&args))
}

/// Waits for `c` at most `limit`; kills it (its process group) past that. Returns (exit ok, stdout, stderr).
fn finish(mut c: common::Proc, limit: Duration) -> (bool, String, String) {
    let t0 = Instant::now();
    while c.try_wait().is_none() && t0.elapsed() <= limit {
        std::thread::sleep(Duration::from_millis(20));
    }
    c.kill_group();
    let out = c.output(Duration::ZERO);
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The local QPN `ibv_rc_pingpong` printed.
fn local_qpn(stdout: &str) -> Option<u32> {
    let line = stdout.lines().find(|l| l.contains("local address"))?;
    let q = line.split("QPN ").nth(1)?.split(',').next()?;
    u32::from_str_radix(q.trim_start_matches("0x"), 16).ok()
}

#[test]
fn two_pingpong_pairs_share_two_addresses() {
    let _g = common::serial();
    let found = std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join("ibv_rc_pingpong").is_file()));
    assert!(
        found,
        "ibv_rc_pingpong not found: install Debian's ibverbs-utils (.ci/run does)"
    );
    common::c_libraries();
    let (a, b) = ("127.0.78.1", "127.0.78.2");
    let s1 = pingpong(a, 18711, None);
    let s2 = pingpong(a, 18712, None);
    std::thread::sleep(Duration::from_millis(1500));
    // `rocev2 devinfo` lists both programs on the one GID (read while the servers wait for their clients).
    let info = common::output_within(
        Command::new(common::bin()).args(["devinfo", "-d", a]),
        common::SHORT,
    );
    let users = String::from_utf8_lossy(&info.stdout)
        .lines()
        .filter(|l| {
            l.contains("in use by:") && l.contains("(ibv_rc_pingpong) on ::ffff:127.0.78.1")
        })
        .count();
    let c1 = pingpong(b, 18711, Some(a));
    let c2 = pingpong(b, 18712, Some(a));
    let limit = Duration::from_secs(60);
    let all = [s1, s2, c1, c2].map(|c| finish(c, limit));
    if let Some((_, _, err)) = all
        .iter()
        .find(|(_, _, e)| e.contains("needs the kernel steering"))
    {
        eprintln!("skipped: the kernel refuses the steering here:\n{err}");
        return;
    }
    assert_eq!(users, 2, "rocev2 devinfo -d {a}: {info:?}");
    for (i, (ok, out, err)) in all.iter().enumerate() {
        assert!(
            *ok && out.contains("300 iters in"),
            "process {i}:\n--- stdout\n{out}--- stderr\n{err}"
        );
    }
    // The two processes of each address hold different QPN slots.
    let qpns: Vec<u32> = all
        .iter()
        .map(|(_, out, _)| local_qpn(out).expect("local QPN"))
        .collect();
    assert_ne!(qpns[0] >> 16, qpns[1] >> 16, "servers' QPNs {qpns:x?}");
    assert_ne!(qpns[2] >> 16, qpns[3] >> 16, "clients' QPNs {qpns:x?}");
}

/// Without CAP_BPF (and CAP_SYS_ADMIN, CAP_NET_ADMIN) the first program on an address binds alone and runs; a second
/// one on the address is refused at its first verb and told what sharing needs and which address to use instead.
#[test]
fn without_bpf_a_second_program_is_told_what_sharing_needs() {
    let _g = common::serial();
    let found = std::env::var_os("PATH").is_some_and(|p| {
        std::env::split_paths(&p)
            .any(|d| d.join("setpriv").is_file() && d.join("ibv_rc_pingpong").is_file())
    });
    if !found {
        eprintln!("skipped: needs setpriv (util-linux) and ibv_rc_pingpong (ibverbs-utils)");
        return;
    }
    common::c_libraries();
    let drop_caps = |port: &str| {
        let dir = common::scratch(&format!("shared-address-caps-{port}"));
        let mut cmd = Command::new("setpriv");
        cmd.args([
            "--bounding-set",
            "-sys_admin,-bpf,-net_admin,-perfmon",
            "--inh-caps",
            "-sys_admin,-bpf,-net_admin,-perfmon",
            common::bin(),
            "run",
            "--ip",
            "127.0.79.1",
            "--",
            "ibv_rc_pingpong",
            "-g",
            "0",
            "-p",
            port,
        ]);
        common::Proc::spawn_command("setpriv", &dir, &mut cmd)
    };
    let mut first = drop_caps("18741");
    std::thread::sleep(Duration::from_millis(1500));
    let second = finish(drop_caps("18742"), Duration::from_secs(30));
    let first_alive = first.try_wait().is_none();
    first.kill_group();
    let first = finish(first, Duration::from_secs(5));
    let (ok, _, err) = &second;
    assert!(
        first_alive,
        "the first program waits for its client: {first:?}"
    );
    assert!(!ok, "{second:?}");
    for want in [
        "Address already in use",
        "needs CAP_BPF and CAP_NET_ADMIN",
        "start it with `rocev2 run --ip 127.0.79.2 -- ibv_rc_pingpong",
    ] {
        assert!(err.contains(want), "missing {want:?} in:\n{err}");
    }
}

/// A program started again on the same address does not number its QPs as the one before it did (the rule of
/// `docs/MULTIPROCESS.md` "QPN range"; before it, every `rocev2 run` process took QPN 0x11 first, and a peer's CM
/// still holding a connection of a crashed predecessor refused the new one as stale, REJ 10): two `ibv_rc_pingpong`
/// pairs, one after the other on 127.0.223.11 (server) and 127.0.223.12 (client), complete, and the two servers'
/// QPNs differ, as do the two clients'. Each `rocev2 run` process draws its engine seed from the clock and its pid;
/// the two runs share a first QPN with probability about 1.5 · 10⁻⁵ per end when the process holds a 65,519-QPN
/// slot of a shared address (as root: measured QPNs 0x5f2a then 0xf4fa), 6 · 10⁻⁸ when it is alone on it.
#[test]
fn a_program_started_again_on_its_address_takes_other_qpns() {
    let _g = common::serial();
    common::need_program("ibv_rc_pingpong", "ibverbs-utils");
    common::c_libraries();
    let (a, b) = ("127.0.223.11", "127.0.223.12");
    // ibv_rc_pingpong's server listens on every address: a port no other test uses.
    const PORT: u16 = 18_953;
    let mut runs = Vec::new();
    for _ in 0..2 {
        let mut s = pingpong(a, PORT, None);
        // The client connects once the server listens (`rocev2 run` execs the program: the pid is the server's).
        let t0 = Instant::now();
        while !common::has_socket(s.pid(), "tcp", [127, 0, 223, 11], PORT) {
            if let Some(st) = s.try_wait() {
                panic!(
                    "the server ended ({st:?}) before listening: {:?}",
                    finish(s, Duration::ZERO)
                );
            }
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "the server does not listen"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        let c = pingpong(b, PORT, Some(a));
        let limit = Duration::from_secs(60);
        let (s, c) = (finish(s, limit), finish(c, limit));
        assert!(s.0 && c.0, "server {s:?}\nclient {c:?}");
        let q =
            |o: &(bool, String, String)| local_qpn(&o.1).unwrap_or_else(|| panic!("no QPN: {o:?}"));
        runs.push((q(&s), q(&c)));
    }
    eprintln!("QPNs (server, client) of the two runs: {runs:x?}");
    assert_ne!(runs[0].0, runs[1].0, "the restarted server's QPN");
    assert_ne!(runs[0].1, runs[1].1, "the restarted client's QPN");
}
