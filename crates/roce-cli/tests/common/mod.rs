//! Helpers shared by the multi-process `rocev2 perf` tests (`netns_e2e.rs`, `malformed.rs`): child processes that
//! are killed when dropped, readiness checks through `/proc/PID/net/*` (which never consume the server's single
//! accept), `--stats` parsing, the independent pcap checker, and two network namespaces joined by a veth pair that
//! are deleted when dropped.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;

/// The `rocev2` binary under test.
pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_rocev2")
}

/// `<checkout>/testdata`: the reference data the tests read (provenance in `testdata/README.md`).
pub fn testdata_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata")
}

/// A per-test scratch directory under `CARGO_TARGET_TMPDIR`, emptied first.
pub fn scratch(name: &str) -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("create scratch dir");
    d
}

/// Perf runs start busy-polling engine threads; on a 2-core machine concurrent runs starve each other (and an
/// unreliable UC/UD run cannot recover a datagram the kernel dropped meanwhile), so the tests of one file take
/// turns. (Cargo runs test files one after another.)
pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// A child process whose stdout/stderr go to files, in a process group of its own; killed (the whole group, so also
/// the programs it started: `mpirun`'s ranks, `script`'s shell) and reaped when dropped unless it has exited.
pub struct Proc {
    pub name: String,
    child: Child,
    out: PathBuf,
    err: PathBuf,
    status: Option<ExitStatus>,
}

/// What a finished [`Proc`] left behind.
#[derive(Debug)]
pub struct Finished {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl Finished {
    /// The stdout lines parsed as JSON (panics on a non-JSON line).
    pub fn json_lines(&self) -> Vec<Value> {
        self.stdout
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
            .collect()
    }
}

impl std::fmt::Display for Finished {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "exit {:?}\n--- stdout\n{}--- stderr\n{}",
            self.status, self.stdout, self.stderr
        )
    }
}

impl Proc {
    /// Spawns `argv` (program first); output goes to `dir/name.out|.err`.
    pub fn spawn(name: &str, dir: &Path, argv: &[String]) -> Proc {
        let mut cmd = Command::new(&argv[0]);
        cmd.args(&argv[1..]);
        Proc::spawn_command(name, dir, &mut cmd)
    }

    /// Spawns `cmd` (its arguments, environment and directory as set) with stdin from `/dev/null`, output to
    /// `dir/name.out|.err`, in a new process group (see [`Proc`]).
    pub fn spawn_command(name: &str, dir: &Path, cmd: &mut Command) -> Proc {
        let out = dir.join(format!("{name}.out"));
        let err = dir.join(format!("{name}.err"));
        let child = cmd
            .stdin(Stdio::null())
            .stdout(File::create(&out).expect("stdout file"))
            .stderr(File::create(&err).expect("stderr file"))
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"));
        Proc {
            name: name.to_owned(),
            child,
            out,
            err,
            status: None,
        }
    }

    /// The process id (with `ip netns exec`, the id of the program itself: `ip` execs it).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `Some(status)` once it has exited.
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        if self.status.is_none() {
            self.status = self.child.try_wait().ok().flatten();
        }
        self.status
    }

    /// Waits up to `limit`; panics (the guard then kills it) if it is still running, showing its output.
    pub fn wait(&mut self, limit: Duration) -> Finished {
        let t0 = Instant::now();
        while self.try_wait().is_none() {
            if t0.elapsed() > limit {
                self.kill_group();
                panic!(
                    "{} still running after {limit:?}\n--- stdout\n{}--- stderr\n{}",
                    self.name,
                    self.read(&self.out),
                    self.read(&self.err)
                );
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        Finished {
            status: self.status.expect("exited"),
            stdout: self.read(&self.out),
            stderr: self.read(&self.err),
        }
    }

    /// [`Proc::wait`] as `std::process::Output` (stdout and stderr as the program wrote them).
    pub fn output(&mut self, limit: Duration) -> Output {
        let status = self.wait(limit).status;
        Output {
            status,
            stdout: std::fs::read(&self.out).unwrap_or_default(),
            stderr: std::fs::read(&self.err).unwrap_or_default(),
        }
    }

    /// Output so far (for failure messages).
    pub fn output_so_far(&self) -> String {
        format!(
            "--- {} stdout\n{}--- {} stderr\n{}",
            self.name,
            self.read(&self.out),
            self.name,
            self.read(&self.err)
        )
    }

    fn read(&self, p: &Path) -> String {
        String::from_utf8_lossy(&std::fs::read(p).unwrap_or_default()).into_owned()
    }

    /// SIGKILL to the process group (the program and whatever it started that stayed in its group), then reaps the
    /// program; nothing once it has exited. Only while it is not reaped: until then its pid, which is the group id,
    /// cannot be reused. [`Proc::output`] afterwards returns what it left.
    pub fn kill_group(&mut self) {
        if self.try_wait().is_some() {
            return;
        }
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{}", self.child.id())])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        let _ = self.child.kill();
        self.status = self.child.wait().ok();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill_group();
    }
}

/// The time bound of a short `rocev2` command on one host (`decode`, `stat`, `devinfo`, argument errors): 60 s; the
/// slowest measured was 3.4 s (`devinfo -v`, debug build, load average 12 on the 2-core development machine).
pub const SHORT: Duration = Duration::from_secs(60);

/// The time bound of one `rocev2 perf` run or one program under `rocev2 run` (over loopback or between namespaces,
/// with its own `--timeout` of 20 s or less): 180 s, the bound `roce-ibverbs/tests/c_api.rs` gives its C programs;
/// about 4 × the slowest measured, 44 s (perf.rs's 1,024-QP loopback run, debug build, load average 12 on the 2-core
/// development machine).
pub const RUN: Duration = Duration::from_secs(180);

/// `cmd.output()` within `limit`: runs `cmd` (stdin `/dev/null`, output to files under `CARGO_TARGET_TMPDIR`) as a
/// [`Proc`] and returns its exit status and output. Past `limit` the test panics with the output so far and the
/// program's whole process group is killed (a program using our libraries must never hang CI: see the test
/// `bounded.rs`).
pub fn output_within(cmd: &mut Command, limit: Duration) -> Output {
    static N: AtomicUsize = AtomicUsize::new(0);
    /// Removes the output files' directory, also when the wait panics.
    struct Dir(PathBuf);
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    let dir = Dir(Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "bounded-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )));
    std::fs::create_dir_all(&dir.0).expect("create output dir");
    let name = Path::new(cmd.get_program())
        .file_name()
        .map_or_else(|| "program".into(), |n| n.to_string_lossy().into_owned());
    Proc::spawn_command(&name, &dir.0, cmd).output(limit)
}

/// Whether process `pid` has a socket of `proto` ("tcp" or "udp") bound to `ip:port` — for TCP, listening. Reads
/// `/proc/PID/net/PROTO` (every socket of the process's network namespace) and keeps only the sockets whose inode is
/// one of the process's own descriptors (`/proc/PID/fd`), so the check never touches the socket and is not fooled by
/// another process's socket on the same port (another test's server, or a port-picking listener that a concurrently
/// forked child still holds until it execs).
pub fn has_socket(pid: u32, proto: &str, ip: [u8; 4], port: u16) -> bool {
    let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/net/{proto}")) else {
        return false;
    };
    // `local_address` is the address as a host-order u32 in hex (little-endian machines: reversed octets).
    let addr = u32::from_ne_bytes(ip);
    let want = format!("{addr:08X}:{port:04X}");
    let want_any = format!("{:08X}:{port:04X}", 0u32);
    let inodes: Vec<String> = text
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let found = f.len() > 9
                && (f[1] == want || f[1] == want_any)
                && (proto != "tcp" || f[3] == "0A");
            found.then(|| f[9].to_owned())
        })
        .collect();
    if inodes.is_empty() {
        return false;
    }
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    fds.flatten().any(|fd| {
        std::fs::read_link(fd.path()).is_ok_and(|t| {
            t.to_str()
                .and_then(|t| t.strip_prefix("socket:[")?.strip_suffix(']'))
                .is_some_and(|ino| inodes.iter().any(|i| i == ino))
        })
    })
}

/// Waits until `p` has the socket (see [`has_socket`]); panics with its output if it exits or time runs out.
pub fn wait_socket(p: &mut Proc, proto: &str, ip: [u8; 4], port: u16, limit: Duration) {
    let t0 = Instant::now();
    while !has_socket(p.pid(), proto, ip, port) {
        if let Some(s) = p.try_wait() {
            panic!(
                "{} exited ({s:?}) before opening {proto} port {port}\n{}",
                p.name,
                p.output_so_far()
            );
        }
        assert!(
            t0.elapsed() < limit,
            "{} did not open {proto} port {port} within {limit:?}\n{}",
            p.name,
            p.output_so_far()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Counters of one `--stats` section (`engine counters (server):` or `udp link counters (server):`): the
/// non-zero ones are printed, so an absent name is 0.
pub fn stats_section(text: &str, header: &str) -> BTreeMap<String, u64> {
    let mut m = BTreeMap::new();
    let mut lines = text.lines().skip_while(|l| l.trim() != header);
    if lines.next().is_none() {
        panic!("no `{header}` section in:\n{text}");
    }
    for l in lines {
        if !l.starts_with("  ") {
            break;
        }
        let mut it = l.split_whitespace();
        if let (Some(k), Some(v), None) = (it.next(), it.next(), it.next())
            && let Ok(v) = v.parse()
        {
            m.insert(k.to_owned(), v);
        }
    }
    m
}

/// Runs `testdata/tools/check_pcap.py --strict` (with `--pmtu` if given) on `file`; asserts it passes and returns
/// the number of RoCE packets it checked.
pub fn check_pcap(file: &Path, pmtu: Option<u32>) -> u64 {
    let script = testdata_dir().join("tools/check_pcap.py");
    let mut cmd = Command::new("python3");
    cmd.arg(&script).arg("--quiet").arg("--strict");
    if let Some(m) = pmtu {
        cmd.arg("--pmtu").arg(m.to_string());
    }
    let out = cmd
        .arg(file)
        .output()
        .unwrap_or_else(|e| panic!("running python3 {}: {e}", script.display()));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "check_pcap.py {} failed ({:?}):\n{text}{}",
        file.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let last = text.lines().last().unwrap_or("");
    let mut it = last.split_whitespace();
    let passed: u64 = match (it.next(), it.next(), it.next(), it.next()) {
        (Some(p), Some("passed,"), Some("0"), Some("failed")) => p.parse().unwrap_or(0),
        _ => panic!(
            "unexpected check_pcap.py summary `{last}` for {}",
            file.display()
        ),
    };
    passed
}

/// Why the namespace tests cannot run here, if they cannot.
pub fn netns_unavailable() -> Option<String> {
    let uid = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(1).map(str::to_owned))
        })
        .unwrap_or_default();
    if uid != "0" {
        return Some(format!("not running as root (uid {uid})"));
    }
    match Command::new("ip").args(["netns", "list"]).output() {
        Ok(o) if o.status.success() => None,
        Ok(o) => Some(format!(
            "`ip netns list` failed: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        )),
        Err(e) => Some(format!("iproute2 `ip` not runnable: {e}")),
    }
}

/// Two network namespaces joined by a veth pair (`scripts/netns.sh up`), deleted when dropped (also on panic).
/// Names carry the test process id; namespaces left by a killed earlier run (its pid gone) are removed first.
pub struct NetnsPair {
    pub a: String,
    pub b: String,
    pub ip_a: String,
    pub ip_b: String,
}

const PREFIX: &str = "rcetest";

fn netns_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/netns.sh")
}

impl NetnsPair {
    /// `ip_a` as octets, the form [`wait_socket`] takes.
    pub fn octets_a(&self) -> [u8; 4] {
        self.ip_a
            .parse::<std::net::Ipv4Addr>()
            .expect("IPv4")
            .octets()
    }

    /// Creates `rcetest<pid>-<tag>a` / `...b` with `ip_a`/`ip_b` (in 198.18.0.0/15) on links of `mtu` bytes.
    pub fn up(tag: &str, ip_a: &str, ip_b: &str, mtu: u32) -> NetnsPair {
        remove_stale();
        let pid = std::process::id();
        let pair = NetnsPair {
            a: format!("{PREFIX}{pid}-{tag}a"),
            b: format!("{PREFIX}{pid}-{tag}b"),
            ip_a: ip_a.to_owned(),
            ip_b: ip_b.to_owned(),
        };
        let out = Command::new("bash")
            .arg(netns_script())
            .args(["up", &pair.a, &pair.b])
            .arg(format!("{ip_a}/24"))
            .arg(format!("{ip_b}/24"))
            .arg(mtu.to_string())
            .output()
            .expect("run scripts/netns.sh");
        assert!(
            out.status.success(),
            "netns.sh up failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        pair
    }

    /// Waits until `veth0` of both namespaces has carrier (operstate `up`): a veth end is running only some time
    /// after `up` returns, and a program that reads the port state first (perftest: "Port number 1 state is
    /// Down") must not race it. Panics after 10 s.
    pub fn wait_running(&self) {
        let t0 = Instant::now();
        for ns in [&self.a, &self.b] {
            loop {
                let out = Command::new("ip")
                    .args(["netns", "exec", ns, "cat", "/sys/class/net/veth0/operstate"])
                    .output()
                    .expect("ip netns exec");
                if String::from_utf8_lossy(&out.stdout).trim() == "up" {
                    break;
                }
                assert!(
                    t0.elapsed() < Duration::from_secs(10),
                    "veth0 of {ns} not up"
                );
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }

    /// `ip netns exec NS rocev2 ARGS...` as an argv.
    pub fn argv(ns: &str, args: &[String]) -> Vec<String> {
        let mut v: Vec<String> = ["ip", "netns", "exec", ns, bin()]
            .iter()
            .map(|s| (*s).to_owned())
            .collect();
        v.extend_from_slice(args);
        v
    }
}

impl Drop for NetnsPair {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .arg(netns_script())
            .args(["down", &self.a, &self.b])
            .output();
    }
}

/// Deletes `rcetest<pid>-...` namespaces whose test process no longer exists.
fn remove_stale() {
    let Ok(out) = Command::new("ip").args(["netns", "list"]).output() else {
        return;
    };
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Some(name) = line.split_whitespace().next() else {
            continue;
        };
        let Some(rest) = name.strip_prefix(PREFIX) else {
            continue;
        };
        let pid: String = rest.chars().take_while(char::is_ascii_digit).collect();
        if !pid.is_empty() && !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = Command::new("ip").args(["netns", "del", name]).output();
        }
    }
}

/// `Udp: InDatagrams` of network namespace `ns` (`/proc/net/snmp`): the UDP datagrams delivered to its sockets.
pub fn udp_in_datagrams(ns: &str) -> u64 {
    let out = Command::new("ip")
        .args(["netns", "exec", ns, "cat", "/proc/net/snmp"])
        .output()
        .expect("read /proc/net/snmp");
    let text = String::from_utf8_lossy(&out.stdout);
    let mut udp = text.lines().filter(|l| l.starts_with("Udp:"));
    let (names, values) = (
        udp.next().expect("Udp header"),
        udp.next().expect("Udp values"),
    );
    let i = names
        .split_whitespace()
        .position(|n| n == "InDatagrams")
        .expect("InDatagrams");
    values
        .split_whitespace()
        .nth(i)
        .expect("value")
        .parse()
        .expect("number")
}

/// `args` as owned strings.
pub fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| (*s).to_owned()).collect()
}

/// One `rocev2 perf TEST -a -c CONN` sweep: the test and a transport perftest runs it over.
#[derive(Clone, Copy, Debug)]
pub struct SweepCase {
    pub test: &'static str,
    pub conn: &'static str,
}

/// Every perf test over every transport perftest allows it on: SEND over RC, UC and UD; WRITE over RC and UC;
/// READ and atomics over RC.
pub fn sweep_cases() -> Vec<SweepCase> {
    let mut v = Vec::new();
    for (test, conns) in [
        ("send-bw", &["RC", "UC", "UD"][..]),
        ("write-bw", &["RC", "UC"][..]),
        ("read-bw", &["RC"][..]),
        ("atomic-bw", &["RC"][..]),
        ("send-lat", &["RC", "UC", "UD"][..]),
        ("write-lat", &["RC", "UC"][..]),
        ("read-lat", &["RC"][..]),
        ("atomic-lat", &["RC"][..]),
    ] {
        for &conn in conns {
            v.push(SweepCase { test, conn });
        }
    }
    v
}

/// The `--loopback-ips` value of loopback pair `n`: 127.0.n.1 (server) and 127.0.n.2 (client).
pub fn loopback_ips(n: u8) -> String {
    format!("127.0.{n}.1,127.0.{n}.2")
}

impl SweepCase {
    /// The sizes `-a` must produce: 2 B .. 8 MiB in powers of two (UD: up to `ud_mtu`); atomics: 8 B only.
    pub fn sizes(&self, ud_mtu: u64) -> Vec<u64> {
        if self.test.starts_with("atomic") {
            return vec![8];
        }
        (1..=23)
            .map(|i| 1u64 << i)
            .filter(|&s| self.conn != "UD" || s <= ud_mtu)
            .collect()
    }

    /// Checks a sweep's `--json` lines: one per size in order, each of this test and transport, verified, with
    /// `iters` iterations (RC; UC/UD bandwidth tests count what was sent, also `iters`).
    pub fn check(&self, lines: &[Value], ud_mtu: u64, iters: u64) {
        let got: Vec<u64> = lines
            .iter()
            .map(|v| v["size"].as_u64().unwrap_or(0))
            .collect();
        assert_eq!(
            got,
            self.sizes(ud_mtu),
            "{} {}: sizes",
            self.test,
            self.conn
        );
        for v in lines {
            assert_eq!(v["test"], self.test, "{v}");
            assert_eq!(v["connection"], self.conn, "{v}");
            assert_eq!(v["verified"], true, "{} {}: {v}", self.test, self.conn);
            assert_eq!(v["iterations"], iters, "{} {}: {v}", self.test, self.conn);
        }
    }
}

/// Why a test needing `program` cannot run, naming the Debian `package` that has it, when it is not on `PATH`
/// (`.ci/run` installs them); `None` when it is there.
pub fn program_missing(program: &str, package: &str) -> Option<String> {
    let found = std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(program).is_file()));
    (!found).then(|| format!("{program} not found: install Debian's {package} (.ci/run does)"))
}

/// Panics naming the Debian package when `program` is not on `PATH` (`.ci/run` installs them).
pub fn need_program(program: &str, package: &str) {
    let found = std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(program).is_file()));
    assert!(
        found,
        "{program} not found: install Debian's {package} (.ci/run does)"
    );
}

/// Builds our two C libraries, `roce-ibverbs` and `roce-rdmacm`, in this test's profile once per test binary, so
/// `rocev2 run` finds current `libroce_ibverbs.so` and `libroce_rdmacm.so` beside `rocev2` (a no-op when fresh).
/// Both, always: a program that only uses libibverbs may still load librdmacm (pyverbs does), and `rocev2 run`
/// preloads whichever is there — a stale or missing one is the system's, which needs `/dev/infiniband`.
pub fn c_libraries() {
    static BUILT: std::sync::OnceLock<()> = std::sync::OnceLock::new();
    BUILT.get_or_init(|| {
        let mut cmd = Command::new(env!("CARGO"));
        cmd.args(["build", "-p", "roce-ibverbs", "-p", "roce-rdmacm"]);
        if !cfg!(debug_assertions) {
            cmd.arg("--release");
        }
        let out = cmd
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .expect("run cargo build");
        assert!(
            out.status.success(),
            "cargo build -p roce-ibverbs -p roce-rdmacm failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let dir = Path::new(bin()).parent().expect("bin dir");
        for lib in ["libroce_ibverbs.so", "libroce_rdmacm.so"] {
            assert!(dir.join(lib).is_file(), "{lib} missing after the build");
        }
    });
}

/// `ip netns exec NS ROCEV2 run --ip IP -- ARGS...`.
pub fn run_argv(ns: &str, ip: &str, args: &[&str]) -> Vec<String> {
    let mut v = strings(&["ip", "netns", "exec", ns, bin(), "run", "--ip", ip, "--"]);
    v.extend(strings(args));
    v
}

/// The two namespaces of an rdma_cm test at `ip_a` / `ip_b`, after checking its `programs` (name, Debian
/// package) and building the libraries; `None` (with the reason printed) when this machine cannot run it.
pub fn rdmacm_setup(
    tag: &str,
    ip_a: &str,
    ip_b: &str,
    programs: &[(&str, &str)],
) -> Option<NetnsPair> {
    if let Some(why) = netns_unavailable() {
        eprintln!("skipped: {why}");
        return None;
    }
    for (p, pkg) in programs {
        need_program(p, pkg);
    }
    c_libraries();
    let ns = NetnsPair::up(tag, ip_a, ip_b, 1500);
    ns.wait_running();
    Some(ns)
}
