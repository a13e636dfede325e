//! `rocev2 pingpong` paired with rdma-core's own `ibv_rc_pingpong` / `ibv_ud_pingpong` (run on rocev2 through
//! `rocev2 run`) on one host, in both roles (issue #18 item 2): server on 127.0.61.1, client on 127.0.61.2, as a
//! user tries first (`rocev2 pingpong rc --ip 127.0.0.1` and `rocev2 run --ip 127.0.0.2 -- ibv_rc_pingpong -g 0
//! 127.0.0.1`). The client's TCP connection to the server comes *from* the server's own address (Linux picks the
//! source of a loopback connection by the route), not from 127.0.61.2; the peer's RoCE address is the one in its
//! GID (`docs/spec/ROCEV2.md` §1.2), so both sides must complete. No root needed.
//!
//! The programs come from Debian's `ibverbs-utils` (installed by `.ci/run`); the library is `libroce_ibverbs.so`
//! beside `rocev2`, built here (`cargo build -p roce-ibverbs`, a no-op when fresh).

mod common;

use std::time::Duration;

use common::{
    Finished, Proc, bin, c_libraries, need_program, scratch, serial, strings, wait_socket,
};

const SERVER_IP: &str = "127.0.61.1";
const CLIENT_IP: &str = "127.0.61.2";
const ITERS: &str = "50";

/// Runs `server` (which listens on TCP `port`), then `client`; both must exit 0. Returns (server, client).
fn pair(tag: &str, port: u16, server: &[String], client: &[String]) -> (Finished, Finished) {
    let dir = scratch(&format!("pingpong-one-host-{tag}"));
    let mut s = Proc::spawn("server", &dir, server);
    wait_socket(
        &mut s,
        "tcp",
        [127, 0, 61, 1],
        port,
        Duration::from_secs(30),
    );
    let mut c = Proc::spawn("client", &dir, client);
    let c = c.wait(Duration::from_secs(60));
    let s = s.wait(Duration::from_secs(30));
    assert!(
        s.status.success(),
        "{tag}: server failed:\n{s}\nclient:\n{c}"
    );
    assert!(
        c.status.success(),
        "{tag}: client failed:\n{c}\nserver:\n{s}"
    );
    let _ = std::fs::remove_dir_all(&dir);
    (s, c)
}

/// Both sides name the other's GID and print the result lines for [`ITERS`] iterations.
fn check(tag: &str, s: &Finished, c: &Finished) {
    for (side, f, remote) in [("server", s, CLIENT_IP), ("client", c, SERVER_IP)] {
        assert!(
            f.stdout.contains(&format!("GID ::ffff:{remote}")),
            "{tag} {side}: no remote GID ::ffff:{remote}\n{f}"
        );
        assert!(
            f.stdout.contains(&format!("{ITERS} iters in ")),
            "{tag} {side}: no latency line\n{f}"
        );
    }
}

fn rocev2_pingpong(
    kind: &str,
    peer: Option<&str>,
    ip: &str,
    port: u16,
    extra: &[&str],
) -> Vec<String> {
    let mut v = strings(&[bin(), "pingpong", kind]);
    v.extend(peer.map(str::to_owned));
    v.extend(strings(&[
        "--ip",
        ip,
        "-p",
        &port.to_string(),
        "-n",
        ITERS,
        "--timeout",
        "30",
    ]));
    v.extend(strings(extra));
    v
}

fn rdma_core(kind: &str, peer: Option<&str>, ip: &str, port: u16, extra: &[&str]) -> Vec<String> {
    let program = format!("ibv_{kind}_pingpong");
    let mut v = strings(&[bin(), "run", "--ip", ip, "--", &program, "-g", "0"]);
    v.extend(strings(&["-p", &port.to_string(), "-n", ITERS]));
    v.extend(strings(extra));
    v.extend(peer.map(str::to_owned));
    v
}

#[test]
fn rdma_core_client_against_rocev2_server() {
    need_program("ibv_rc_pingpong", "ibverbs-utils");
    need_program("ibv_ud_pingpong", "ibverbs-utils");
    c_libraries();
    let _s = serial();
    for (kind, port, extra) in [("rc", 18761, &[][..]), ("ud", 18762, &["-s", "1024"][..])] {
        let (s, c) = pair(
            &format!("{kind}-rdma-core-client"),
            port,
            &rocev2_pingpong(kind, None, SERVER_IP, port, extra),
            &rdma_core(kind, Some(SERVER_IP), CLIENT_IP, port, extra),
        );
        check(kind, &s, &c);
    }
}

#[test]
fn rocev2_client_against_rdma_core_server() {
    need_program("ibv_rc_pingpong", "ibverbs-utils");
    need_program("ibv_ud_pingpong", "ibverbs-utils");
    c_libraries();
    let _s = serial();
    for (kind, port, extra) in [("rc", 18763, &[][..]), ("ud", 18764, &["-s", "1024"][..])] {
        let (s, c) = pair(
            &format!("{kind}-rocev2-client"),
            port,
            &rdma_core(kind, None, SERVER_IP, port, extra),
            &rocev2_pingpong(kind, Some(SERVER_IP), CLIENT_IP, port, extra),
        );
        check(kind, &s, &c);
    }
}
