//! Harness for the Soft-RoCE interoperability suite (`tests/softroce.rs`) and nothing else: a thin Rust wrapper
//! around `testdata/interop/softroce-vm` (QEMU guests running Linux `rdma_rxe`, see
//! `docs/spec/INTEROP.md`), tcpdump on the namespace bridge, the independent ICRC checker
//! `testdata/tools/check_pcap.py`, and the guest's rxe counters.
//!
//! Shapes:
//! * [`SoftRoce::acquire`] takes an exclusive lock ([`LOCK_FILE`], shared with `scripts/interop-bench.sh`), checks
//!   the prerequisites (root, `/dev/net/tun`, `python3`), runs `softroce-vm build` and clears leftovers with
//!   `softroce-vm teardown`; an `Err` is the reason the suite must be skipped. Dropping it runs `teardown` again
//!   (only namespace `roce-net` and the guests of `$SOFTROCE_DIR/run`).
//! * [`SoftRoce::up`] boots a [`Guest`]; [`Guest::exec`] / [`Guest::spawn`] run commands in it, always with a guest
//!   timeout (`softroce-vm exec -t`).
//! * [`SoftRoce::host_spawn`] runs a host program inside the namespace (`ip netns exec roce-net ...`).
//! * [`Capture`] is tcpdump on the bridge; [`check_pcap`] runs the independent checker on the result.
//! * [`Guest::snapshot`] reads `/sys/class/infiniband/rxe0/ports/1/hw_counters/*`, the guest `eth0` drop counters
//!   and the kernel log; [`Snapshot::delta`] + [`classify`] tell errors from TCG noise.
//!
//! Every child process is started in its own process group and killed by that group id when its handle drops, so
//! a failing test leaves nothing running.
#![warn(missing_docs)]

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::fs::{self, File};
use std::io::{BufRead, BufReader, Write as _};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

/// Lock file serialising every user of namespace `roce-net` on this machine (this suite and
/// `scripts/interop-bench.sh`, which takes it with `flock`).
pub const LOCK_FILE: &str = "/var/tmp/softroce-interop.lock";

/// Host address on the bridge (`SOFTROCE_HOST_CIDR` default of the harness).
pub const HOST_IP: &str = "198.18.0.1";

/// Namespace the harness creates (`SOFTROCE_NETNS` default).
pub const NETNS: &str = "roce-net";

/// Bridge inside [`NETNS`] (`SOFTROCE_BRIDGE` default).
pub const BRIDGE: &str = "roce-br";

/// Write a progress line straight to the process's stderr. The test harness captures `eprintln!` output of passing
/// tests; direct writes to the handle are not captured, so skip reasons and progress stay visible in CI logs.
pub fn say(msg: &str) {
    let mut e = std::io::stderr();
    let _ = writeln!(e, "[softroce] {msg}");
    let _ = e.flush();
}

/// Result of a finished command.
#[derive(Debug, Clone)]
pub struct CmdOutput {
    /// Exit code; `None` when the process was killed by a signal or by our deadline.
    pub rc: Option<i32>,
    /// True when our deadline expired and the process group was killed.
    pub timed_out: bool,
    /// Captured standard output (lossy UTF-8).
    pub stdout: String,
    /// Captured standard error (lossy UTF-8).
    pub stderr: String,
    /// Wall time from spawn to exit.
    pub elapsed: Duration,
}

impl CmdOutput {
    /// True when the command exited with status 0 before its deadline.
    pub fn ok(&self) -> bool {
        self.rc == Some(0) && !self.timed_out
    }

    /// `rc=N` / `timeout` / `signal`, plus the last `lines` lines of stdout and stderr, for failure messages.
    pub fn describe(&self, lines: usize) -> String {
        let mut s = match (self.rc, self.timed_out) {
            (_, true) => format!("TIMEOUT after {:.1}s", self.elapsed.as_secs_f64()),
            (Some(rc), _) => format!("rc={rc} in {:.1}s", self.elapsed.as_secs_f64()),
            (None, _) => "killed by a signal".to_string(),
        };
        for (name, text) in [("stdout", &self.stdout), ("stderr", &self.stderr)] {
            let v: Vec<&str> = text.lines().collect();
            if !v.is_empty() {
                let _ = write!(
                    s,
                    "\n    --- {name} (last {} of {} lines)",
                    lines.min(v.len()),
                    v.len()
                );
                for l in &v[v.len().saturating_sub(lines)..] {
                    let _ = write!(s, "\n    {l}");
                }
            }
        }
        s
    }
}

/// A child process in its own process group, with stdout/stderr going to files. Dropping the handle kills the
/// group (SIGKILL) if it is still running.
pub struct Bg {
    child: Option<Child>,
    label: String,
    out: PathBuf,
    err: PathBuf,
    started: Instant,
}

fn kill_group(pid: u32, sig: &str) {
    // Our child is the leader of its own process group (process_group(0)); signal that group by its id.
    let _ = Command::new("kill")
        .args([sig, "--", &format!("-{pid}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

impl Bg {
    /// Start `cmd` in a new process group, stdout/stderr to `<log_prefix>.out` / `.err`.
    pub fn spawn(mut cmd: Command, log_prefix: &Path, label: &str) -> Result<Bg, String> {
        let out = log_prefix.with_extension("out");
        let err = log_prefix.with_extension("err");
        let fo = File::create(&out).map_err(|e| format!("{}: {e}", out.display()))?;
        let fe = File::create(&err).map_err(|e| format!("{}: {e}", err.display()))?;
        cmd.stdin(Stdio::null())
            .stdout(fo)
            .stderr(fe)
            .process_group(0);
        let child = cmd.spawn().map_err(|e| format!("spawn {label}: {e}"))?;
        Ok(Bg {
            child: Some(child),
            label: label.to_string(),
            out,
            err,
            started: Instant::now(),
        })
    }

    /// Process id (= process group id) while running.
    pub fn id(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// True while the process has not exited.
    pub fn running(&mut self) -> bool {
        match self.child.as_mut() {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// Wait until the process exits or `timeout` passes (then SIGKILL to the group). Returns its output.
    pub fn wait(mut self, timeout: Duration) -> CmdOutput {
        let deadline = Instant::now() + timeout;
        let mut timed_out = false;
        let mut status: Option<ExitStatus> = None;
        if let Some(child) = self.child.as_mut() {
            loop {
                match child.try_wait() {
                    Ok(Some(s)) => {
                        status = Some(s);
                        break;
                    }
                    Ok(None) if Instant::now() < deadline => {
                        thread::sleep(Duration::from_millis(50))
                    }
                    Ok(None) => {
                        timed_out = true;
                        kill_group(child.id(), "-KILL");
                        status = child.wait().ok();
                        break;
                    }
                    Err(_) => break,
                }
            }
        }
        // Reap any remaining members of the group (e.g. a socat coprocess of softroce-vm exec).
        if let Some(child) = self.child.take() {
            kill_group(child.id(), "-KILL");
        }
        CmdOutput {
            rc: status.and_then(|s| s.code()),
            timed_out,
            stdout: String::from_utf8_lossy(&fs::read(&self.out).unwrap_or_default()).into_owned(),
            stderr: String::from_utf8_lossy(&fs::read(&self.err).unwrap_or_default()).into_owned(),
            elapsed: self.started.elapsed(),
        }
    }

    /// Current contents of the stdout file (the process may still be writing).
    pub fn stdout_so_far(&self) -> String {
        String::from_utf8_lossy(&fs::read(&self.out).unwrap_or_default()).into_owned()
    }
}

impl Drop for Bg {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            if matches!(child.try_wait(), Ok(None)) {
                say(&format!(
                    "killing leftover process group {} ({})",
                    child.id(),
                    self.label
                ));
                kill_group(child.id(), "-KILL");
            }
            let _ = child.wait();
        }
    }
}

/// Run `cmd` to completion with a deadline, output captured in memory via temporary files under `scratch`.
pub fn run(cmd: Command, scratch: &Path, label: &str, timeout: Duration) -> CmdOutput {
    match Bg::spawn(cmd, scratch, label) {
        Ok(bg) => bg.wait(timeout),
        Err(e) => CmdOutput {
            rc: None,
            timed_out: false,
            stdout: String::new(),
            stderr: e,
            elapsed: Duration::ZERO,
        },
    }
}

fn is_root() -> bool {
    fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .map(|l| l.split_whitespace().nth(2) == Some("0"))
        })
        .unwrap_or(false)
}

/// Exclusive owner of the Soft-RoCE namespace and guests for the lifetime of the value.
pub struct SoftRoce {
    vm: PathBuf,
    testdata: PathBuf,
    scratch: PathBuf,
    _lock: File,
}

impl SoftRoce {
    /// Check prerequisites, take [`LOCK_FILE`] (waiting up to `lock_wait`), run `softroce-vm build` and
    /// `teardown`. `testdata` is the reference data directory (`<checkout>/testdata`), `scratch` a directory for logs.
    /// `Err(reason)`: the environment cannot run the suite (not root, no `/dev/net/tun`, no `python3`, build failed,
    /// lock busy).
    pub fn acquire(
        testdata: &Path,
        scratch: &Path,
        lock_wait: Duration,
    ) -> Result<SoftRoce, String> {
        if !is_root() {
            return Err("not running as root (QEMU taps and network namespaces need root)".into());
        }
        if !Path::new("/dev/net/tun").exists() {
            return Err("/dev/net/tun does not exist (no tap devices for the guests)".into());
        }
        let vm = testdata.join("interop/softroce-vm");
        if !vm.is_file() {
            return Err(format!(
                "{} not found (it is part of the repository: is the checkout complete?)",
                vm.display()
            ));
        }
        if !Command::new("python3")
            .arg("--version")
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
        {
            return Err("python3 not found (needed for check_pcap.py)".into());
        }
        fs::create_dir_all(scratch).map_err(|e| format!("{}: {e}", scratch.display()))?;
        let lock = File::create(LOCK_FILE).map_err(|e| format!("{LOCK_FILE}: {e}"))?;
        let t0 = Instant::now();
        let mut said = false;
        loop {
            match lock.try_lock() {
                Ok(()) => break,
                Err(fs::TryLockError::WouldBlock) => {
                    if !said {
                        say(&format!(
                            "waiting for {LOCK_FILE} (another Soft-RoCE run is active)"
                        ));
                        said = true;
                    }
                    if t0.elapsed() > lock_wait {
                        return Err(format!(
                            "{LOCK_FILE} still held after {}s",
                            lock_wait.as_secs()
                        ));
                    }
                    thread::sleep(Duration::from_secs(2));
                }
                Err(fs::TryLockError::Error(e)) => return Err(format!("lock {LOCK_FILE}: {e}")),
            }
        }
        let me = SoftRoce {
            vm,
            testdata: testdata.to_path_buf(),
            scratch: scratch.to_path_buf(),
            _lock: lock,
        };
        say("softroce-vm build (idempotent; installs qemu etc. with apt on a fresh machine)");
        let b = me.vm_cmd(&["build"], Duration::from_secs(1200));
        if !b.ok() {
            return Err(format!("softroce-vm build failed: {}", b.describe(15)));
        }
        let t = me.vm_cmd(&["teardown"], Duration::from_secs(120));
        if !t.ok() {
            return Err(format!(
                "softroce-vm teardown (clearing leftovers) failed: {}",
                t.describe(10)
            ));
        }
        Ok(me)
    }

    /// The reference data directory (`<checkout>/testdata`).
    pub fn testdata(&self) -> &Path {
        &self.testdata
    }

    /// Path of the `softroce-vm` script.
    pub fn vm_path(&self) -> &Path {
        &self.vm
    }

    /// Run `softroce-vm ARGS...` to completion.
    pub fn vm_cmd(&self, args: &[&str], timeout: Duration) -> CmdOutput {
        let mut c = Command::new(&self.vm);
        c.args(args);
        run(
            c,
            &self.scratch.join("softroce-vm"),
            &format!("softroce-vm {}", args.join(" ")),
            timeout,
        )
    }

    /// Boot guest `name` at `ip` (`softroce-vm up`, about 15 s under TCG on an idle machine).
    pub fn up(&self, name: &str, ip: &str) -> Result<Guest, String> {
        let o = self.vm_cmd(&["up", name, ip], Duration::from_secs(420));
        if !o.ok() {
            let console = self.vm_cmd(&["console", name], Duration::from_secs(10));
            return Err(format!(
                "softroce-vm up {name} {ip} failed: {}\n    console tail:\n{}",
                o.describe(10),
                tail(&console.stdout, 20)
            ));
        }
        Ok(Guest {
            vm: self.vm.clone(),
            scratch: self.scratch.clone(),
            name: name.to_string(),
            ip: ip.to_string(),
            ready_line: o.stdout.trim().to_string(),
            boot_log: o.stderr.trim().to_string(),
        })
    }

    /// A host command run inside [`NETNS`]: `ip netns exec roce-net PROGRAM ARGS...`.
    pub fn host_command<S: AsRef<std::ffi::OsStr>>(&self, program: S, args: &[&str]) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", NETNS]).arg(program).args(args);
        c
    }

    /// Spawn a host command inside [`NETNS`] in the background, logs at `<log_prefix>.out/.err`.
    pub fn host_spawn<S: AsRef<std::ffi::OsStr>>(
        &self,
        program: S,
        args: &[&str],
        log_prefix: &Path,
    ) -> Result<Bg, String> {
        let label = format!("host: {}", args.join(" "));
        Bg::spawn(self.host_command(program, args), log_prefix, &label)
    }

    /// True when something in [`NETNS`] listens on TCP `port` (for server readiness).
    pub fn host_listening(&self, port: u16) -> bool {
        let o = run(
            self.host_command("ss", &["-Hltn"]),
            &self.scratch.join("ss"),
            "ss",
            Duration::from_secs(10),
        );
        listening_in(&o.stdout, port)
    }

    /// True when a UDP socket in [`NETNS`] is bound to `ip:port` (`ss -Hlun`): a program under `rocev2 run`
    /// binds UDP 4791 on its address when it creates its first verbs or rdma_cm object.
    pub fn host_udp_bound(&self, ip: &str, port: u16) -> bool {
        let o = run(
            self.host_command("ss", &["-Hlun"]),
            &self.scratch.join("ss"),
            "ss",
            Duration::from_secs(10),
        );
        let want = format!("{ip}:{port}");
        o.stdout
            .lines()
            .any(|l| l.split_whitespace().nth(3) == Some(want.as_str()))
    }

    /// Drop counters of the host-side tap of guest `name` (`sr-NAME`, in the namespace): `tx_dropped` (frames the
    /// tap could not hand to QEMU) and `rx_dropped`.
    pub fn tap_drops(&self, name: &str) -> BTreeMap<String, u64> {
        let mut m = BTreeMap::new();
        for k in ["tx_dropped", "rx_dropped"] {
            let p = format!("/sys/class/net/sr-{name}/statistics/{k}");
            let o = run(
                self.host_command("cat", &[&p]),
                &self.scratch.join("cat"),
                "cat",
                Duration::from_secs(10),
            );
            if let Ok(v) = o.stdout.trim().parse::<u64>() {
                m.insert(format!("tap.{k}"), v);
            }
        }
        m
    }
}

impl Drop for SoftRoce {
    fn drop(&mut self) {
        let o = self.vm_cmd(&["teardown"], Duration::from_secs(120));
        say(&format!(
            "softroce-vm teardown: {}",
            if o.ok() {
                "done".to_string()
            } else {
                o.describe(5)
            }
        ));
    }
}

fn listening_in(ss_out: &str, port: u16) -> bool {
    let suffix = format!(":{port}");
    ss_out.lines().any(|l| {
        l.split_whitespace()
            .nth(3)
            .is_some_and(|a| a.ends_with(&suffix))
    })
}

fn tail(s: &str, n: usize) -> String {
    let v: Vec<&str> = s.lines().collect();
    v[v.len().saturating_sub(n)..]
        .iter()
        .map(|l| format!("    {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// A running Soft-RoCE guest (stopped by [`SoftRoce`]'s teardown).
pub struct Guest {
    vm: PathBuf,
    scratch: PathBuf,
    /// Guest name (`softroce-vm` NAME).
    pub name: String,
    /// Guest IPv4 address on the bridge.
    pub ip: String,
    /// The `SOFTROCE_READY ...` line printed at boot.
    pub ready_line: String,
    /// `softroce-vm up`'s own log line (boot time, accelerator).
    pub boot_log: String,
}

impl Guest {
    fn exec_command(&self, timeout_s: u64, cmd: &str) -> Command {
        let mut c = Command::new(&self.vm);
        c.args(["exec", "-t", &timeout_s.to_string(), &self.name, cmd]);
        c
    }

    /// Run `cmd` (bash) in the guest; the guest kills it after `timeout_s` (rc 137), the host gives up 15 s later.
    pub fn exec(&self, timeout_s: u64, cmd: &str) -> CmdOutput {
        run(
            self.exec_command(timeout_s, cmd),
            &self.scratch.join(format!("exec-{}", self.name)),
            cmd,
            Duration::from_secs(timeout_s + 30),
        )
    }

    /// Start `cmd` in the guest in the background (guest timeout `timeout_s`); logs at `<log_prefix>.out/.err`.
    pub fn spawn(&self, timeout_s: u64, cmd: &str, log_prefix: &Path) -> Result<Bg, String> {
        Bg::spawn(
            self.exec_command(timeout_s, cmd),
            log_prefix,
            &format!("{}: {cmd}", self.name),
        )
    }

    /// Like [`Guest::spawn`], but the guest shell records the command's PID in `/tmp/<tag>.pid` first (`exec`
    /// keeps the PID), so [`Guest::kill_tracked`] can end exactly that process when the host gives up on it.
    pub fn spawn_tracked(
        &self,
        timeout_s: u64,
        cmd: &str,
        tag: &str,
        log_prefix: &Path,
    ) -> Result<Bg, String> {
        let wrapped = format!("echo $$ > /tmp/{tag}.pid; exec {cmd}");
        Bg::spawn(
            self.exec_command(timeout_s, &wrapped),
            log_prefix,
            &format!("{}: {cmd}", self.name),
        )
    }

    /// SIGKILL the process recorded by [`Guest::spawn_tracked`] under `tag` if it is still running the command
    /// whose program name is `program` (checked in `/proc/PID/cmdline`, so a reused PID is left alone). Returns true
    /// when a process was killed.
    pub fn kill_tracked(&self, tag: &str, program: &str) -> bool {
        let o = self.exec(
            20,
            &format!(
                "f=/tmp/{tag}.pid; [ -f $f ] || exit 0; p=$(cat $f); rm -f $f; \
                 if tr '\\0' ' ' < /proc/$p/cmdline 2>/dev/null | grep -q -- '{program}'; then kill -9 $p && echo killed; fi"
            ),
        );
        o.stdout.contains("killed")
    }

    /// True when something in the guest listens on TCP `port`.
    pub fn listening(&self, port: u16) -> bool {
        listening_in(&self.exec(20, "ss -Hltn").stdout, port)
    }

    /// Copy a host file into the guest (`softroce-vm push`, ≈75 KB/s).
    pub fn push(&self, local: &Path, guest_path: &str, timeout: Duration) -> CmdOutput {
        let mut c = Command::new(&self.vm);
        c.arg("push").arg(&self.name).arg(local).arg(guest_path);
        run(
            c,
            &self.scratch.join(format!("push-{}", self.name)),
            "push",
            timeout,
        )
    }

    /// Read rxe0's port counters, eth0's receive drop counters and the kernel log in one exec.
    pub fn snapshot(&self) -> Result<Snapshot, String> {
        let o = self.exec(
            30,
            "cd /sys/class/infiniband/rxe0/ports/1/hw_counters && for f in *; do echo \"rxe.$f $(cat $f)\"; done; \
             for f in rx_dropped rx_errors rx_missed_errors rx_fifo_errors rx_over_errors; do \
             echo \"eth0.$f $(cat /sys/class/net/eth0/statistics/$f)\"; done; echo '---dmesg'; dmesg",
        );
        if !o.ok() {
            return Err(format!(
                "reading counters in {} failed: {}",
                self.name,
                o.describe(5)
            ));
        }
        let mut counters = BTreeMap::new();
        let mut dmesg = Vec::new();
        let mut in_dmesg = false;
        for l in o.stdout.lines() {
            if in_dmesg {
                dmesg.push(l.to_string());
            } else if l == "---dmesg" {
                in_dmesg = true;
            } else if let Some((k, v)) = l.split_once(' ')
                && let Ok(v) = v.trim().parse::<u64>()
            {
                counters.insert(k.to_string(), v);
            }
        }
        if !counters.contains_key("rxe.rcvd_pkts") {
            return Err(format!(
                "no rxe counters in {}'s output:\n{}",
                self.name,
                tail(&o.stdout, 10)
            ));
        }
        Ok(Snapshot { counters, dmesg })
    }
}

/// Counter values and kernel log of a guest at one moment.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// `rxe.<hw_counter>` and `eth0.<statistic>` (also `tap.*` when merged in by the caller).
    pub counters: BTreeMap<String, u64>,
    /// `dmesg` lines.
    pub dmesg: Vec<String>,
}

impl Snapshot {
    /// Counter increments from `self` (before) to `after`, zero increments omitted; and the kernel log lines
    /// `after` has beyond `self`'s.
    pub fn delta(&self, after: &Snapshot) -> (BTreeMap<String, u64>, Vec<String>) {
        let mut d = BTreeMap::new();
        for (k, v) in &after.counters {
            let before = self.counters.get(k).copied().unwrap_or(0);
            if *v > before {
                d.insert(k.clone(), v - before);
            }
        }
        let new_log = after.dmesg.iter().skip(self.dmesg.len()).cloned().collect();
        (d, new_log)
    }
}

/// How [`classify`] judges counter increments and kernel messages.
#[derive(Debug, Default, Clone)]
pub struct Verdict {
    /// Problems attributable to the peer's packets or to the exchange (the case fails).
    pub errors: Vec<String>,
    /// Expected under TCG or benign (reported, the case passes): retransmissions, duplicates, RNR flow control.
    pub notes: Vec<String>,
}

/// Kernel messages that are not errors: rxe queries the link speed of eth0 (virtio-net reports none) every time
/// a verbs device is opened.
const BENIGN_KERNEL_MESSAGES: &[&str] = &["speed is unknown, defaulting to"];

/// Kernel messages about RDMA / rxe (anything else, e.g. TCG clocksource warnings, is only a note).
const RDMA_KERNEL_WORDS: &[&str] = &[
    "rxe",
    "infiniband",
    "icrc",
    "qp",
    "pkey",
    "qkey",
    "rdma",
    "ib_",
];

/// Judge the increments of one case. rxe 6.1 counter meanings (drivers/infiniband/sw/rxe/rxe_hw_counters.c and
/// where they are incremented):
/// * errors: `out_of_seq_request` (rxe's responder saw a PSN gap from the peer: a skipped PSN, unless frames were
///   dropped on the way, which the `tap.tx_dropped` / `eth0.rx_*` drop counters show), `rcvd_seq_err` (rxe's
///   requester got a PSN-sequence NAK from the peer), `retry_exceeded_err`, `retry_rnr_exceeded_err`,
///   `send_err`, `link_downed`, and any new kernel message about RDMA ([`RDMA_KERNEL_WORDS`]) other than
///   [`BENIGN_KERNEL_MESSAGES`] (rxe logs header, QP, P_Key/Q_Key and ICRC rejections with
///   `pr_warn_ratelimited`);
/// * notes: `duplicate_request` (the peer retransmitted), `completer_retry_err` (rxe retransmitted: ACKs later
///   than the 67 ms timeout are common under TCG), `rcvd_rnr_err` / `send_rnr_err` (RNR NAK flow control),
///   `ack_deferred`; `rdma_sends`, `rdma_recvs`, `sent_pkts`, `rcvd_pkts` are informational.
pub fn classify(delta: &BTreeMap<String, u64>, new_log: &[String]) -> Verdict {
    let mut v = Verdict::default();
    let drops: u64 = delta
        .iter()
        .filter(|(k, _)| k.starts_with("tap.") || k.starts_with("eth0."))
        .map(|(_, n)| n)
        .sum();
    for (k, n) in delta {
        let name = k.as_str();
        match name {
            "rxe.out_of_seq_request" if drops > 0 => v.notes.push(format!(
                "{name} +{n} (with {drops} frames dropped before rxe)"
            )),
            "rxe.out_of_seq_request"
            | "rxe.rcvd_seq_err"
            | "rxe.retry_exceeded_err"
            | "rxe.retry_rnr_exceeded_err"
            | "rxe.send_err"
            | "rxe.link_downed" => v.errors.push(format!("{name} +{n}")),
            "rxe.duplicate_request"
            | "rxe.completer_retry_err"
            | "rxe.rcvd_rnr_err"
            | "rxe.send_rnr_err"
            | "rxe.ack_deferred" => v.notes.push(format!("{name} +{n}")),
            _ if name.starts_with("tap.") || name.starts_with("eth0.") => v
                .notes
                .push(format!("{name} +{n} (frames lost before rxe)")),
            _ => {}
        }
    }
    for l in new_log {
        if BENIGN_KERNEL_MESSAGES.iter().any(|b| l.contains(b)) {
            continue;
        }
        let lower = l.to_ascii_lowercase();
        if RDMA_KERNEL_WORDS.iter().any(|w| lower.contains(w)) {
            v.errors.push(format!("guest kernel: {l}"));
        } else {
            v.notes.push(format!("guest kernel: {l}"));
        }
    }
    v
}

/// tcpdump on [`BRIDGE`] inside [`NETNS`]: UDP 4791 and the TCP exchange (port 18515), 2048-byte snap length
/// (whole frames: the bridge MTU is 1500), 64 MiB ring.
pub struct Capture {
    bg: Option<Bg>,
    /// The pcap file.
    pub path: PathBuf,
    stderr_lines: mpsc::Receiver<String>,
}

impl Capture {
    /// Start capturing to `path`; returns once tcpdump reports it is listening (or after 20 s with an error).
    pub fn start(path: &Path) -> Result<Capture, String> {
        let _ = fs::remove_file(path);
        let mut c = Command::new("ip");
        c.args([
            "netns", "exec", NETNS, "tcpdump", "-i", BRIDGE, "-n", "-U", "-B", "65536", "-s",
            "2048", "-w",
        ])
        .arg(path)
        .arg("udp port 4791 or tcp port 18515")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .process_group(0);
        let mut child = c.spawn().map_err(|e| format!("spawn tcpdump: {e}"))?;
        let (tx, rx) = mpsc::channel();
        if let Some(err) = child.stderr.take() {
            thread::spawn(move || {
                for l in BufReader::new(err).lines().map_while(Result::ok) {
                    if tx.send(l).is_err() {
                        break;
                    }
                }
            });
        }
        let log = path.with_extension("tcpdump");
        let bg = Bg {
            child: Some(child),
            label: "tcpdump".into(),
            out: log.clone(),
            err: log,
            started: Instant::now(),
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(l) if l.contains("listening on") => break,
                Ok(_) => {}
                Err(_) => {
                    return Err(format!(
                        "tcpdump did not start listening on {BRIDGE} within 20 s"
                    ));
                }
            }
        }
        Ok(Capture {
            bg: Some(bg),
            path: path.to_path_buf(),
            stderr_lines: rx,
        })
    }

    /// Stop tcpdump: SIGTERM after 1.5 s, longer than libpcap's 1 s buffer timeout, so every ring block holding
    /// frames has been handed to tcpdump (without `--immediate-mode`, which costs a wakeup per frame and made
    /// tcpdump drop frames on a loaded machine). Returns its summary lines (e.g. `0 packets dropped by kernel`)
    /// and the number of frames the kernel dropped, if reported.
    pub fn stop(mut self) -> (String, u64) {
        thread::sleep(Duration::from_millis(1500));
        let mut summary = String::new();
        if let Some(mut bg) = self.bg.take()
            && let Some(mut child) = bg.child.take()
        {
            kill_group(child.id(), "-TERM");
            let deadline = Instant::now() + Duration::from_secs(10);
            while matches!(child.try_wait(), Ok(None)) && Instant::now() < deadline {
                thread::sleep(Duration::from_millis(50));
            }
            if matches!(child.try_wait(), Ok(None)) {
                kill_group(child.id(), "-KILL");
            }
            let _ = child.wait();
        }
        let mut dropped = 0;
        while let Ok(l) = self.stderr_lines.recv_timeout(Duration::from_millis(300)) {
            if let Some(n) = l.strip_suffix(" packets dropped by kernel") {
                dropped = n.trim().parse().unwrap_or(0);
            }
            summary.push_str(&l);
            summary.push('\n');
        }
        (summary, dropped)
    }
}

/// Outcome of `check_pcap.py --quiet FILE`.
#[derive(Debug, Clone, Default)]
pub struct PcapCheck {
    /// Packets that passed every check.
    pub passed: u64,
    /// Packets with at least one error.
    pub failed: u64,
    /// The `#N BAD ...` lines.
    pub bad: Vec<String>,
    /// Exit status of the checker (0: nothing failed, 1: something failed, 2: file error).
    pub rc: Option<i32>,
}

/// Run the independent checker `testdata/tools/check_pcap.py --quiet` on `pcap` (ICRC, IPv4/UDP/BTH sanity, and with
/// `pmtu` the FIRST/MIDDLE == PMTU rule).
pub fn check_pcap(testdata: &Path, pcap: &Path, pmtu: Option<u32>, scratch: &Path) -> PcapCheck {
    let mut c = Command::new("python3");
    c.arg(testdata.join("tools/check_pcap.py")).arg("--quiet");
    if let Some(p) = pmtu {
        c.arg("--pmtu").arg(p.to_string());
    }
    c.arg(pcap);
    let o = run(c, scratch, "check_pcap.py", Duration::from_secs(300));
    let mut r = PcapCheck {
        rc: o.rc,
        ..PcapCheck::default()
    };
    for l in o.stdout.lines() {
        if l.starts_with('#') && l.contains(" BAD ") {
            r.bad.push(l.to_string());
        } else if let Some((p, f)) = l.split_once(" passed, ") {
            r.passed = p.trim().parse().unwrap_or(0);
            r.failed = f.trim_end_matches(" failed").trim().parse().unwrap_or(0);
        }
    }
    r
}

/// Per-direction summary of a capture, from `rocev2 decode --json` (the project's decoder; the ICRC verdict that
/// counts comes from [`check_pcap`]).
#[derive(Debug, Clone, Default)]
pub struct Traffic {
    /// RoCE packets from `a` to `b`, and from `b` to `a`.
    pub a_to_b: u64,
    /// See [`Traffic::a_to_b`].
    pub b_to_a: u64,
    /// Opcode names seen a→b with counts.
    pub ops_a_to_b: BTreeMap<String, u64>,
    /// Opcode names seen b→a with counts.
    pub ops_b_to_a: BTreeMap<String, u64>,
    /// AETH NAKs (syndrome bits 6:5 = 11) as `"src->dst syndrome 0x.."` with counts.
    pub naks: BTreeMap<String, u64>,
    /// Largest payload seen in any packet.
    pub max_payload: u64,
}

/// Decode `pcap` with the `rocev2` binary (`decode --json`) and count packets between `a` and `b`.
pub fn traffic(
    rocev2: &Path,
    pcap: &Path,
    a: &str,
    b: &str,
    scratch: &Path,
) -> Result<Traffic, String> {
    let mut c = Command::new(rocev2);
    c.arg("decode").arg("--json").arg(pcap);
    let o = run(c, scratch, "rocev2 decode", Duration::from_secs(300));
    if o.rc.is_none() || o.rc == Some(2) {
        return Err(format!(
            "rocev2 decode --json {}: {}",
            pcap.display(),
            o.describe(5)
        ));
    }
    let mut t = Traffic::default();
    for l in o.stdout.lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(l) else {
            continue;
        };
        let src = v.get("src_ip").and_then(|x| x.as_str()).unwrap_or("");
        let dst = v.get("dst_ip").and_then(|x| x.as_str()).unwrap_or("");
        let op = v
            .get("opcode_name")
            .and_then(|x| x.as_str())
            .unwrap_or("?")
            .to_string();
        if let Some(p) = v.get("payload_len").and_then(|x| x.as_u64()) {
            t.max_payload = t.max_payload.max(p);
        }
        if src == a && dst == b {
            t.a_to_b += 1;
            *t.ops_a_to_b.entry(op).or_default() += 1;
        } else if src == b && dst == a {
            t.b_to_a += 1;
            *t.ops_b_to_a.entry(op).or_default() += 1;
        } else {
            continue;
        }
        if let Some(syn) = v
            .get("aeth")
            .and_then(|x| x.get("syndrome"))
            .and_then(|x| x.as_u64())
            && syn & 0x60 == 0x60
        {
            *t.naks
                .entry(format!("{src}->{dst} syndrome 0x{syn:02x}"))
                .or_default() += 1;
        }
    }
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ss_parsing() {
        let out = "LISTEN 0      1            0.0.0.0:18515      0.0.0.0:*\nLISTEN 0 4096 127.0.0.1:22 0.0.0.0:*\n";
        assert!(listening_in(out, 18515));
        assert!(listening_in(out, 22));
        assert!(!listening_in(out, 1851));
        assert!(!listening_in("", 18515));
    }

    #[test]
    fn classify_counters() {
        let mut d = BTreeMap::new();
        d.insert("rxe.duplicate_request".to_string(), 3);
        d.insert("rxe.rcvd_pkts".to_string(), 100);
        let v = classify(
            &d,
            &["[ 1.0] eth0 speed is unknown, defaulting to 1000".to_string()],
        );
        assert!(v.errors.is_empty(), "{v:?}");
        assert_eq!(v.notes.len(), 1);
        d.insert("rxe.out_of_seq_request".to_string(), 1);
        let v = classify(
            &d,
            &["[ 2.0] rdma_rxe: bad ICRC from 198.18.0.1".to_string()],
        );
        assert_eq!(v.errors.len(), 2, "{v:?}");
        d.insert("tap.tx_dropped".to_string(), 2);
        let v = classify(&d, &[]);
        assert!(v.errors.is_empty(), "{v:?}");
    }

    #[test]
    fn snapshot_delta() {
        let mut a = Snapshot::default();
        a.counters.insert("rxe.rcvd_pkts".into(), 10);
        a.dmesg.push("x".into());
        let mut b = a.clone();
        b.counters.insert("rxe.rcvd_pkts".into(), 15);
        b.counters.insert("rxe.sent_pkts".into(), 4);
        b.dmesg.push("y".into());
        let (d, log) = a.delta(&b);
        assert_eq!(d.get("rxe.rcvd_pkts"), Some(&5));
        assert_eq!(d.get("rxe.sent_pkts"), Some(&4));
        assert_eq!(log, vec!["y".to_string()]);
    }
}
