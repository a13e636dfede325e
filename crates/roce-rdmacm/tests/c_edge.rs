//! `tests/c/edge.c`, compiled with `cc` against the system `<rdma/rdma_cma.h>` and linked with `-lrdmacm -libverbs`
//! (Debian's librdmacm-dev / libibverbs-dev) like any rdma_cm program, then run with rocev2's `librdmacm.so.1` and
//! `libibverbs.so.1` first on `LD_LIBRARY_PATH` and the device on 127.0.209.1: a listener and a client in one
//! process, the edge semantics the file's header lists (invalid pointers → `EINVAL`, a non-blocking channel →
//! `EAGAIN`, migrate, reject with private data and reason seen by the peer, accept with private data, a SEND over
//! the connection, disconnect events on both sides, destroy with an unacknowledged event).
//!
//! Also the layout check: every size and offset `src/abi.rs` asserts, compared with the installed header by a C
//! program (`offsetof`/`sizeof`).
//!
//! Also `tests/c/forkcm.c`: processes forked from a program that opened the device use it and rdma_cm afresh; and
//! `tests/c/oldbridge.c`: a libibverbs whose private bridge table is of another version is refused.
//!
//! Also `tests/c/mcast.c`: UD multicast through rdma_cm from three processes on one address.
//!
//! Binds UDP 4791 on 127.0.209.1, 127.0.210.1, 127.0.212.1, 127.0.214.50 and 127.0.222.1 (and briefly 127.0.0.1,
//! a sentinel).

use std::path::{Path, PathBuf};
use std::process::Command;

/// Builds `roce-ibverbs` and `roce-rdmacm` (a no-op when fresh) and returns the directory holding both.
fn libraries() -> PathBuf {
    let mut cmd = Command::new(env!("CARGO"));
    cmd.args(["build", "-p", "roce-ibverbs", "-p", "roce-rdmacm"]);
    if !cfg!(debug_assertions) {
        cmd.arg("--release");
    }
    let out = cmd.output().expect("run cargo build");
    assert!(
        out.status.success(),
        "cargo build failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let exe = std::env::current_exe().expect("test path");
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target profile dir");
    for lib in ["libroce_ibverbs.so", "libroce_rdmacm.so"] {
        assert!(
            dir.join(lib).is_file(),
            "{lib} missing in {}",
            dir.display()
        );
    }
    dir.to_path_buf()
}

/// `cc -O1 -Wall -Werror -o out src extra...` (the test fails with the compiler's messages).
fn cc(out: &Path, src: &Path, extra: &[&str]) {
    let res = Command::new("cc")
        .args(["-O1", "-Wall", "-Werror", "-o"])
        .arg(out)
        .arg(src)
        .args(extra)
        .output()
        .expect("cc runs");
    assert!(
        res.status.success(),
        "cc failed:\n{}",
        String::from_utf8_lossy(&res.stderr)
    );
}

/// Compiles `tests/c/<name>.c` into a scratch directory that also holds `libibverbs.so.1` / `librdmacm.so.1` links.
fn build(name: &str, libs: &[&str]) -> (PathBuf, PathBuf) {
    build_in(name, name, libs)
}

/// [`build`] into the scratch directory named after `tag` (tests that run the same program side by side).
fn build_in(name: &str, tag: &str, libs: &[&str]) -> (PathBuf, PathBuf) {
    assert!(
        Path::new("/usr/include/rdma/rdma_cma.h").is_file(),
        "<rdma/rdma_cma.h> missing: install Debian's librdmacm-dev (.ci/run does)"
    );
    let built = libraries();
    let dir =
        Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("rdmacm-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/c/{name}.c"));
    let prog = dir.join(name);
    cc(&prog, &src, libs);
    for (lib, link) in [
        ("libroce_ibverbs.so", "libibverbs.so.1"),
        ("libroce_rdmacm.so", "librdmacm.so.1"),
    ] {
        let target = built.join(lib).canonicalize().expect("canonical");
        std::os::unix::fs::symlink(target, dir.join(link)).expect("symlink");
    }
    (prog, dir)
}

/// A C program's verdict: it exited 0 and printed exactly "ok" (else the test fails with its output).
fn expect_ok(out: &std::process::Output) {
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.trim() == "ok",
        "{:?}\n--- stdout\n{stdout}--- stderr\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn c_program_meets_the_rdma_cm_edge_semantics() {
    let (prog, dir) = build("edge", &["-lrdmacm", "-libverbs"]);
    // Bounded: a lost completion would block rdma_get_send_comp for ever.
    let out = Command::new("timeout")
        .args(["-k", "5", "120"])
        .arg(&prog)
        .arg("127.0.209.1")
        .env("LD_LIBRARY_PATH", &dir)
        .env("ROCEV2_IBV_IP", "127.0.209.1")
        .output()
        .expect("run the C program");
    expect_ok(&out);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Finding (issue #17): a thread waiting in a synchronous call (`rdma_get_request`, `rdma_connect` on an id made
/// without a channel) blocked for ever when another thread destroyed or migrated the id: it read the eventfd of a
/// channel that had been closed under it. `tests/c/waiters.c` checks that the waiter returns -1 with `ECANCELED`
/// within 5 s in the three cases its header lists. Binds UDP 4791 on 127.0.203.1; 127.0.203.9 stays silent.
#[test]
fn a_synchronous_waiter_returns_when_its_id_is_destroyed_or_migrated() {
    let (prog, dir) = build("waiters", &["-lrdmacm", "-libverbs", "-lpthread"]);
    // Bounded: the defect was a waiter that never returned (the program then never exits).
    let out = Command::new("timeout")
        .args(["-k", "5", "60"])
        .arg(&prog)
        .args(["127.0.203.1", "127.0.203.9"])
        .env("LD_LIBRARY_PATH", &dir)
        .env("ROCEV2_IBV_IP", "127.0.203.1")
        .output()
        .expect("run the C program");
    expect_ok(&out);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Finding (issues #16, #17: pyverbs' test_rdmacm): processes forked from a program that had opened the device,
/// started its runtime and used rdma_cm inherited its runtime and rdma_cm state, whose threads do not exist in a
/// child, so a passive and an active child connecting to each other both waited until they were killed.
/// `tests/c/forkcm.c` checks that the children connect and exchange SENDs with runtimes of their own, and that the
/// parent is undisturbed afterwards (its pre-fork listener serves a third child). Binds UDP 4791 on 127.0.210.1.
///
/// CI finding (it was the "1 run in 8" intermittent): a child forked while the parent's rdma_cm dispatcher thread
/// held the library's state lock inherited the lock held and waited for ever in its first `rdma_create_id`; each
/// process now has its own lock and state (`roce_fork::ForkLocal`). No retry: one stuck child fails the test.
#[test]
fn processes_forked_from_a_program_that_opened_the_device_use_rdma_cm_afresh() {
    let (prog, dir) = build("forkcm", &["-lrdmacm", "-libverbs"]);
    // Bounded: the defect was children that never connected (the program bounds each of them itself).
    let out = Command::new("timeout")
        .args(["-k", "5", "120"])
        .arg(&prog)
        .args(["127.0.210.1", "7471", "7472"])
        .env("LD_LIBRARY_PATH", &dir)
        .env("ROCEV2_IBV_IP", "127.0.210.1")
        .output()
        .expect("run the C program");
    expect_ok(&out);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Finding (issue #17, rxe interop): the REQ announced Local ACK Timeout 17 (≈ 0.54 s) while the QP that librdmacm
/// moved to RTS on the active side retransmitted after 4.096 µs · 2^14 ≈ 67 ms, and gave up on a slow Linux peer
/// (`RETRY_EXC_ERR`). `tests/c/acktmo.c` checks the QPs' timeouts after ESTABLISHED (`ibv_query_qp`,
/// `rdma_init_qp_attr` for RTS) without and with `RDMA_OPTION_ID_ACK_TIMEOUT` on either side, against the values
/// Linux `cm.c` / `cma.c` give (its header). Binds UDP 4791 on 127.0.213.1.
#[test]
fn the_qps_ack_timeout_agrees_with_what_the_cm_announced() {
    let (prog, dir) = build("acktmo", &["-lrdmacm", "-libverbs"]);
    let out = Command::new("timeout")
        .args(["-k", "5", "60"])
        .arg(&prog)
        .arg("127.0.213.1")
        .env("LD_LIBRARY_PATH", &dir)
        .env("ROCEV2_IBV_IP", "127.0.213.1")
        .output()
        .expect("run the C program");
    expect_ok(&out);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Finding (issues #16, #17: pyverbs' test_rdmacm on a device on 127.0.210.3): pyverbs connects through 127.0.0.1,
/// which stands for a device on any loopback address (`docs/RDMACM.md` §5), and two processes connecting through
/// it never connected: the path's DGID was 127.0.0.1's, so the REQ went to 127.0.0.1:4791, where the device is
/// not (and where another rocev2 process could be). `tests/c/forkcm.c` run with 127.0.0.1 and the device on
/// 127.0.212.1: two forked children connect and exchange SENDs through the alias, and a third child connects to the
/// parent's listener. The alias holds while nothing is bound to UDP 4791 on 127.0.0.1 (issue #17: a device there
/// is a peer like any other, `roce-cli`'s `tests/rdmacm.rs`
/// `rping_reaches_a_server_on_127_0_0_1_from_another_loopback_address`), so the test needs the address free and
/// says so when it is not. Binds UDP 4791 on 127.0.212.1.
#[test]
fn processes_connect_through_the_loopback_alias_of_a_device_on_another_loopback_address() {
    let (prog, dir) = build("forkcm", &["-lrdmacm", "-libverbs"]);
    assert!(
        std::net::UdpSocket::bind("127.0.0.1:4791").is_ok(),
        "UDP 4791 on 127.0.0.1 is taken (another rocev2 device?): 127.0.0.1 is then that device, not the alias"
    );
    // Bounded: the defect was children that never connected (the program bounds each of them itself).
    let out = Command::new("timeout")
        .args(["-k", "5", "120"])
        .arg(&prog)
        .args(["127.0.0.1", "7491", "7492"])
        .env("LD_LIBRARY_PATH", &dir)
        .env("ROCEV2_IBV_IP", "127.0.212.1")
        .output()
        .expect("run the C program");
    expect_ok(&out);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issues #16, #17 (pyverbs' test_rdmacm multicast tests skipped: `rdma_join_multicast` was ENOSYS, `ibv_attach_mcast`
/// EINVAL, `max_mcast_grp` 0): `tests/c/mcast.c` — two forked receivers and a sending parent, three processes on one
/// device address, join 239.214.2.1 with rdma_cm; each receiver gets each of 20 datagrams once, and none after
/// leaving; the JOIN event, the limits and the error cases its header lists. Binds UDP 4791 on 127.0.214.50 and
/// 239.214.2.1 (and joins 239.214.2.0).
#[test]
fn processes_on_one_address_join_a_multicast_group_and_each_gets_every_datagram() {
    let (prog, dir) = build("mcast", &["-lrdmacm", "-libverbs"]);
    // Bounded: a lost datagram would leave a receiver polling (each bounds itself to 10 s per wait).
    let out = Command::new("timeout")
        .args(["-k", "5", "120"])
        .arg(&prog)
        .args(["127.0.214.50", "239.214.2.1"])
        .env("LD_LIBRARY_PATH", &dir)
        .env("ROCEV2_IBV_IP", "127.0.214.50")
        .output()
        .expect("run the C program");
    expect_ok(&out);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The private bridge's version check (crate roce-abi, `bridge::check`): with a `libibverbs.so.1` whose
/// `rocev2_private_v1@ROCEV2_PRIVATE` table is of version 3 (`tests/c/bridge_v3.c`, preloaded ahead of rocev2's;
/// version 3 had version 4's layout, only two fields' meanings changed), `rdma_listen` fails with `ENODEV` and the
/// library names both versions on stderr, instead of calling through the table (which answers `EPROTO`). No UDP
/// socket (checked with strace): the runtime of the device (`ROCEV2_IBV_IP` 127.0.209.1) never starts, the CM
/// being refused first.
#[test]
fn a_bridge_table_of_another_version_is_refused_with_a_clear_error() {
    let (prog, dir) = build("oldbridge", &["-lrdmacm", "-libverbs"]);
    let map = dir.join("bridge.map");
    std::fs::write(
        &map,
        "ROCEV2_PRIVATE { global: rocev2_private_v1; local: *; };\n",
    )
    .expect("version script");
    let shim = dir.join("libbridge_v3.so");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/bridge_v3.c");
    let script = format!("-Wl,--version-script={}", map.display());
    cc(&shim, &src, &["-shared", "-fPIC", &script]);
    let out = Command::new("timeout")
        .args(["-k", "5", "60"])
        .arg(&prog)
        .env("LD_LIBRARY_PATH", &dir)
        .env("LD_PRELOAD", &shim)
        .env("ROCEV2_IBV_IP", "127.0.209.1")
        .output()
        .expect("run the C program");
    expect_ok(&out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(
            "rocev2 librdmacm: rocev2's libibverbs.so.1 offers private table version 3 (128 bytes), this librdmacm \
             needs version 4 (128 bytes): use the two libraries of one build"
        ),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn structure_layouts_match_the_installed_header() {
    let (prog, dir) = build("layout", &[]);
    assert!(prog.is_file());
    let _ = std::fs::remove_dir_all(&dir);
}

/// `tests/c/addrinfo.c`: `rdma_getaddrinfo` answers as rdma-core's `librdmacm/addrinfo.c` does, including the call
/// with neither node nor service (only hints with the addresses) that libfabric's verbs provider makes for every
/// passive endpoint (`vrb_get_rdmacm_rai`; `fi_pingpong -e rdm -p "verbs;ofi_rxm"` failed there with EINVAL).
#[test]
fn rdma_getaddrinfo_answers_as_librdmacm() {
    let (prog, dir) = build("addrinfo", &["-lrdmacm"]);
    let out = Command::new("timeout")
        .args(["-k", "5", "60"])
        .arg(&prog)
        .env("LD_LIBRARY_PATH", &dir)
        .output()
        .expect("run the C program");
    expect_ok(&out);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Finding (issue #17): a process that ended with a connected rdma_cm id and no `rdma_disconnect` sent nothing, so
/// its peer waited for messages until its own timeouts; with Linux the kernel destroys the ids of an ending process
/// (`ucma_close` → `rdma_destroy_id` → `cm_destroy_id`: a DREQ for an established connection). `tests/c/exitpeer.c`:
/// the server on 127.0.211.1 ends by `exit(0)` and, in a second run, by returning from `main`, right after
/// ESTABLISHED, and in a third by SIGTERM's default action (the library's handler, installed only where the
/// program left the default, ends the ids and lets the signal end the process); the client on 127.0.211.2 must see
/// `RDMA_CM_EVENT_DISCONNECTED` within 1 s.
#[test]
fn a_peer_sees_disconnected_when_the_server_process_exits_without_rdma_disconnect() {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;
    let (prog, dir) = build("exitpeer", &["-lrdmacm", "-libverbs"]);
    use std::os::unix::process::ExitStatusExt;
    for (how, port) in [("exit", "7481"), ("return", "7482"), ("term", "7483")] {
        let mut server = Command::new("timeout")
            .args(["-k", "5", "60"])
            .arg(&prog)
            .args(["server", "127.0.211.1", port, how])
            .env("LD_LIBRARY_PATH", &dir)
            .env("ROCEV2_IBV_IP", "127.0.211.1")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start the server");
        let mut line = String::new();
        BufReader::new(server.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("server stdout");
        assert_eq!(line.trim(), "listening", "server ({how}) did not listen");
        let client = Command::new("timeout")
            .args(["-k", "5", "60"])
            .arg(&prog)
            .args(["client", "127.0.211.2", "127.0.211.1", port])
            .env("LD_LIBRARY_PATH", &dir)
            .env("ROCEV2_IBV_IP", "127.0.211.2")
            .output()
            .expect("run the client");
        let sout = server.wait_with_output().expect("server ends");
        let stdout = String::from_utf8_lossy(&client.stdout);
        assert!(
            client.status.success() && stdout.starts_with("ok "),
            "server ending by {how}: client {:?}\n--- stdout\n{stdout}--- stderr\n{}--- server {:?} stderr\n{}",
            client.status,
            String::from_utf8_lossy(&client.stderr),
            sout.status,
            String::from_utf8_lossy(&sout.stderr)
        );
        if how == "term" {
            // Ended by SIGTERM (`timeout` passes the signal on by raising it itself; 143 = 128 + 15 otherwise).
            assert!(
                sout.status.signal() == Some(libc::SIGTERM) || sout.status.code() == Some(143),
                "server ({how}) did not end by SIGTERM: {:?}",
                sout.status
            );
        } else {
            assert!(sout.status.success(), "server ({how}): {:?}", sout.status);
        }
        // "ok <ms>": the time from the client's ESTABLISHED to its DISCONNECTED.
        eprintln!("server ending by {how}: client {}", stdout.trim());
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Runs `tests/c/rsclose.c` in `mode` (its header) with the device on `ip` (127.0.220.0/24, one address per test
/// so they run side by side); bounded by `timeout` beyond the program's own 60 s alarm.
fn rsclose(mode: &str, ip: &str, port: &str) {
    let (prog, dir) = build_in(
        "rsclose",
        &format!("rsclose-{mode}"),
        &["-lrdmacm", "-libverbs", "-lpthread"],
    );
    let out = Command::new("timeout")
        .args(["-k", "5", "90"])
        .arg(&prog)
        .args([mode, ip, port])
        .env("LD_LIBRARY_PATH", &dir)
        .env("ROCEV2_IBV_IP", ip)
        .output()
        .expect("run the C program");
    eprintln!("{}", String::from_utf8_lossy(&out.stderr));
    expect_ok(&out);
    let _ = std::fs::remove_dir_all(&dir);
}

/// rsockets (issue #17): `rpoll` on a listening rsocket reports nothing before a request, `POLLOUT` when asked (as
/// rsocket.c, whose listener polls a writable socket pair) and `POLLIN` while a client's request is pending; the
/// accepted socket reads the data and then the end of the stream after the client's `rclose`. Binds UDP 4791 on
/// 127.0.220.1.
#[test]
fn rsocket_rpoll_on_a_listener_reports_a_pending_request() {
    rsclose("listen", "127.0.220.1", "7501");
}

/// rsockets (issue #17): `rclose` returns (within 30 s) when the peer never posts a receive, so the disconnect
/// message and credits it sends meet RNR NAKs retried for ever; the peer then sees `RDMA_CM_EVENT_DISCONNECTED`.
/// Failing-first: `rclose` waited for those sends for ever. Binds UDP 4791 on 127.0.220.2.
#[test]
fn rsocket_rclose_returns_when_the_peer_posts_no_receives() {
    rsclose("norecv", "127.0.220.2", "7502");
}

/// rsockets (issue #17): a peer's data message longer than the buffer half it was given aborts the connection:
/// `rrecv` returns -1 with `EPROTO` (not 0, the end of an orderly stream), `SO_ERROR` reads it, `rpoll` reports
/// `POLLERR`, `rsend` fails with `ECONNRESET`. Failing-first: `rrecv` returned 0. Binds UDP 4791 on 127.0.220.3.
#[test]
fn rsocket_rrecv_reports_an_aborted_connection_as_an_error() {
    rsclose("abort", "127.0.220.3", "7503");
}

/// rsockets (breaker finding): `rclose` of an accepted socket while another thread of the process blocks in
/// `rrecv` on it (`tests/c/rsrace.c`, 5 rounds): the `rrecv` returns (0 or `EBADF`), `rclose` returns 0 and the
/// peer sees the end of the stream. Failing-first: a SIGSEGV (the completion channel freed under the waiting
/// thread) or a hang (`rclose` waiting, holding the socket, for the acknowledgement of an event the reader took).
/// Binds UDP 4791 on 127.0.222.1.
#[test]
fn rsocket_rclose_wakes_a_thread_blocked_in_rrecv() {
    let (prog, dir) = build("rsrace", &["-lrdmacm", "-libverbs", "-lpthread"]);
    let out = Command::new("timeout")
        .args(["-k", "5", "150"])
        .arg(&prog)
        .args(["127.0.222.1", "7521", "5"])
        .env("LD_LIBRARY_PATH", &dir)
        .env("ROCEV2_IBV_IP", "127.0.222.1")
        .output()
        .expect("run the C program");
    eprintln!("{}", String::from_utf8_lossy(&out.stderr));
    expect_ok(&out);
    let _ = std::fs::remove_dir_all(&dir);
}
