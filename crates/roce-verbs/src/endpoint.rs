//! The stats endpoint: each runtime (device group) of a process answers `rocev2 stat` with the live counters of its
//! devices, what `rdma statistic` reads from the kernel for an RNIC.
//!
//! # Where
//!
//! A Unix stream socket `<run dir>/<pid>.<start>.<n>.sock` (`start`: the process's start time, field 22 of
//! `/proc/<pid>/stat`, in clock ticks after boot; `n` counts the runtimes of the process), created when the
//! runtime starts and removed when it stops (its last [`crate::Context`] is dropped). The run directory is
//! [`run_dir`]: `$ROCEV2_RUN_DIR` if set, else `/run/rocev2` when it can be created (root), else
//! `$XDG_RUNTIME_DIR/rocev2`, else `/tmp/rocev2-<uid>`; readers ([`endpoints`]) look in all of them.
//! A directory is used only when only its owner controls it ([`dir_trusted`]): a real directory (not a symlink),
//! owned by the process's user (a reader also trusts root's), not writable by group or others — so a non-root
//! program skips root's `/run/rocev2` instead of failing to bind there, and another local user who pre-creates
//! `/tmp/rocev2-<uid>` cannot capture or replace the endpoints. Sockets are mode 0600; the endpoint answers only
//! its own user and root (`SO_PEERCRED`), and a reader checks that the socket is served by the process its name
//! says. A socket left by
//! a process that died without dropping its devices is stale: [`endpoints`] removes a socket whose pid is gone, or
//! whose pid now belongs to a process with another start time (the pid was reused), and so does a runtime starting
//! its own endpoint in that directory — so the sockets of runs killed by a signal do not pile up. The pid and start
//! time of a process name it uniquely, so the rule never removes a live endpoint.
//! The run directory is shared by every network namespace of the host, so [`endpoints`] lists only the processes in
//! the reader's own network namespace (as `rdma statistic` shows the devices of its namespace).
//!
//! Opt out per runtime with [`StatsEndpoint::Off`] in [`crate::RuntimeConfig::stats_endpoint`], or for a whole
//! process with the environment variable `ROCEV2_STATS_ENDPOINT=0`.
//!
//! # Protocol (version 1)
//!
//! The client connects, writes one JSON object and a newline, and reads one JSON object (the server then closes):
//!
//! * `{"get": "stats"}` → `{"proto": "rocev2-stats", "v": 1, "pid", "comm", "cmdline", "devices": [DEVICE...]}` (`comm`: the
//!   process name, `/proc/<pid>/comm`; `cmdline`: the arguments joined by spaces) with
//!   DEVICE = `{"index", "gids": [GID as IPv6 text, e.g. "::ffff:198.18.0.1"], "mac", "max_qp", "counters": {NAME: value, ...}, "runtime": {progress,
//!   and every counter of [`crate::RuntimeStats::counters`] by name}, "qps": [QP...]}` and
//!   QP = `{"qpn", "type", "state", "next_psn", "una_psn", "epsn", "msn", "sq_outstanding", "rq_outstanding",
//!   "udp_sport", "rate_bps", "target_bps", "alpha", "limited", "shaped_bps", "counters": {...}}`. Counters are
//!   cumulative; rates are for the reader to compute between two snapshots. A device's counters and its QPs' are
//!   read in one engine call, so they are one instant: the device's are the sum over its QPs plus what belongs to no
//!   QP (and the counts of QPs destroyed before). Devices are read one after another, and the `runtime` counters
//!   (atomics of the engine thread) are not part of that instant. The `runtime` object is the engine
//!   thread's ([`crate::RuntimeStats`]), the same for every device on it.
//!   When the process's rdma_cm ids are known (rocev2's librdmacm registers them with [`set_cm_id_source`]), the
//!   answer also has `"cm_ids": [CM_ID...]`, what `rdma resource show cm_id` lists on Linux (iproute2
//!   `rdma/res-cmid.c`): CM_ID = `{"dev": device index or null, "state": rdma_cm state name (IDLE, ADDR_BOUND,
//!   ADDR_RESOLVED, ROUTE_RESOLVED, LISTEN, CONNECT, DISCONNECT), "ps": "TCP" | "UDP" | "IB" | "IPOIB",
//!   "qp_type": "RC" | "UC" | "UD" | null, "lqpn": N or null, "src": "ADDR:PORT" or null, "dst": "ADDR:PORT" or null}`.
//! * `{"get": "qp", "qpn": N}` → the same envelope with `"devices": [{"index", "gids", "qp": {"qpn", "dump"}}]`, one entry
//!   per device that has QP N; `dump` is the engine's text dump (state, PSNs, queue depths, retry counters and
//!   timers, rate controller, non-zero counters).
//! * anything else → `{"proto": "rocev2-stats", "v": 1, "error": "..."}`.
//!
//! Requests are served one at a time on the endpoint's own thread, each bounded by 2 s in all (reading the request
//! and writing the answer; a client that trickles or stalls is dropped then, and at once when the runtime stops); the
//! counters are taken under the progress lock like every control verb (never on the data path).

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::thread::{JoinHandle, ThreadId};
use std::time::Duration;

use roce_proto::{Counters, Qpn};
use serde_json::{Map, Value, json};

use crate::handles::{Context, CtxInner};

/// Protocol tag of every answer.
pub const PROTO: &str = "rocev2-stats";
/// Protocol version.
pub const VERSION: u64 = 1;
/// Environment variable that turns every endpoint of the process off (`0`, `off`, `false`, `no`).
pub const ENV_OFF: &str = "ROCEV2_STATS_ENDPOINT";
/// Environment variable naming the run directory.
pub const ENV_DIR: &str = "ROCEV2_RUN_DIR";

/// Where (whether) a runtime serves its stats endpoint.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum StatsEndpoint {
    /// In [`run_dir`] (the default), unless `ROCEV2_STATS_ENDPOINT=0`.
    #[default]
    RunDir,
    /// In this directory (created if missing).
    Dir(PathBuf),
    /// No endpoint.
    Off,
}

/// The candidate run directories, in the order a writer tries them (see the module docs).
fn candidates() -> Vec<PathBuf> {
    if let Some(d) = std::env::var_os(ENV_DIR).filter(|d| !d.is_empty()) {
        return vec![PathBuf::from(d)];
    }
    let mut v = vec![PathBuf::from("/run/rocev2")];
    if let Some(x) = std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        v.push(Path::new(&x).join("rocev2"));
    }
    v.push(PathBuf::from(format!("/tmp/rocev2-{}", uid())));
    v
}

/// The real user id, from `/proc/self/status` (no libc here); `0` if unreadable.
fn uid() -> u32 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|l| l.split_whitespace().next().map(str::to_owned))
        })
        .and_then(|u| u.parse().ok())
        .unwrap_or(0)
}

/// Whether `dir` is controlled by its owner alone and that owner is one of `owners`: a directory itself (a
/// symlink is refused, whatever it points at), owned by one of `owners`, not writable by group or others.
///
/// # Errors
/// Why not, in words for a warning: it cannot be read, is not a directory, is someone else's, or is writable by others.
pub fn dir_trusted(dir: &Path, owners: &[u32]) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt as _;
    let m = std::fs::symlink_metadata(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    if !m.file_type().is_dir() {
        return Err(format!("{} is not a directory", dir.display()));
    }
    if !owners.contains(&m.uid()) {
        return Err(format!(
            "{} belongs to uid {}, not to this user ({})",
            dir.display(),
            m.uid(),
            uid()
        ));
    }
    if m.mode() & 0o022 != 0 {
        return Err(format!(
            "{} is writable by group or others (mode {:o})",
            dir.display(),
            m.mode() & 0o7777
        ));
    }
    Ok(())
}

/// The run directory this process writes its endpoints to: the first candidate that is this user's alone
/// ([`dir_trusted`]) or can be created as such (mode 0700). A candidate that exists but is not (root's
/// `/run/rocev2` for a normal user, or another user's `/tmp/rocev2-<uid>`) is skipped. `None` when none fits.
pub fn run_dir() -> Option<PathBuf> {
    let me = [uid()];
    candidates().into_iter().find(|d| {
        if std::fs::symlink_metadata(d).is_err() {
            let _ = std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(d);
        }
        match dir_trusted(d, &me) {
            Ok(()) => true,
            Err(why) => {
                tracing::debug!(%why, "not a run directory for this user");
                false
            }
        }
    })
}

/// One endpoint socket found by [`endpoints`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EndpointPath {
    /// The process serving it.
    pub pid: u32,
    /// The socket.
    pub path: PathBuf,
}

/// Every endpoint socket of a live process in the caller's network namespace in the run directories (all
/// candidates, or `$ROCEV2_RUN_DIR`), sorted by pid. A process is in the caller's namespace when its
/// `/proc/<pid>/ns/net` link reads the same as `/proc/self/ns/net`; processes whose link cannot be read (another
/// user's, or no `/proc`) are left out. Sockets whose process is gone are removed (best effort).
pub fn endpoints() -> Vec<EndpointPath> {
    let own_netns = std::fs::read_link("/proc/self/ns/net").ok();
    let mut out = Vec::new();
    for dir in candidates() {
        // Only directories that this user or root controls: sockets in another user's could be anyone's.
        if dir_trusted(&dir, &[uid(), 0]).is_err() {
            continue;
        }
        let Ok(rd) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in rd.flatten() {
            let path = e.path();
            let Some((pid, start)) = path
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.strip_suffix(".sock"))
                .and_then(parse_name)
            else {
                continue;
            };
            if !e.file_type().is_ok_and(|t| t.is_socket()) {
                continue;
            }
            if is_stale(pid, start) {
                let _ = std::fs::remove_file(&path);
            } else {
                let netns = std::fs::read_link(format!("/proc/{pid}/ns/net")).ok();
                if netns.is_some() && netns == own_netns {
                    out.push(EndpointPath { pid, path });
                }
            }
        }
    }
    out.sort_by(|a, b| (a.pid, &a.path).cmp(&(b.pid, &b.path)));
    out.dedup();
    out
}

/// Whether the endpoint socket of `(pid, start)` (its name's fields) outlived its process: the pid is gone, or now
/// names a process started at another time (the pid was reused). A live endpoint is never stale.
fn is_stale(pid: u32, start: Option<u64>) -> bool {
    if !Path::new(&format!("/proc/{pid}")).exists() {
        return true;
    }
    start.is_some_and(|s| start_time(pid).is_some_and(|now| now != s))
}

/// Removes the stale endpoint sockets of `dir` (best effort): those of processes killed by a signal, which never
/// dropped their runtimes. Run when a runtime starts its own endpoint there, so they do not pile up between two
/// `rocev2 stat` runs (which remove them too, [`endpoints`]).
fn remove_stale(dir: &Path) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let path = e.path();
        let Some((pid, start)) = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_suffix(".sock"))
            .and_then(parse_name)
        else {
            continue;
        };
        if e.file_type().is_ok_and(|t| t.is_socket()) && is_stale(pid, start) {
            let _ = std::fs::remove_file(&path);
        }
    }
}

/// `(pid, start time)` of a socket name without `.sock`: `<pid>.<start>.<n>`, or `<pid>.<n>` as written before
/// the start time was part of the name (then only the pid is checked).
fn parse_name(n: &str) -> Option<(u32, Option<u64>)> {
    let parts: Vec<&str> = n.split('.').collect();
    let pid = parts.first()?.parse::<u32>().ok()?;
    match parts.len() {
        2 => Some((pid, None)),
        3 => Some((pid, Some(parts[1].parse().ok()?))),
        _ => None,
    }
}

/// The start time of process `pid` in clock ticks after boot (`/proc/<pid>/stat` field 22, proc(5)); `None` when it
/// cannot be read (the process is gone, or no `/proc`).
fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Field 2 (comm) is in parentheses and may hold spaces or ')': count fields after the last ')', which is
    // followed by field 3 (state); field 22 is the 20th from there.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// Connects to the endpoint at `path` before `deadline`. A listener whose queue is full (a process that does not
/// accept: stopped, or its endpoint thread stuck) refuses a non-blocking connect with `EAGAIN` until a slot frees;
/// that is retried until the deadline.
fn connect(
    path: &Path,
    deadline: std::time::Instant,
    timeout: Duration,
) -> std::io::Result<UnixStream> {
    use socket2::{Domain, SockAddr, Socket, Type};
    let addr = SockAddr::unix(path)?;
    loop {
        let s = Socket::new(Domain::UNIX, Type::STREAM, None)?;
        s.set_nonblocking(true)?;
        match s.connect(&addr) {
            Ok(()) => {
                s.set_nonblocking(false)?;
                return Ok(s.into());
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if std::time::Instant::now() >= deadline {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        format!(
                            "its listen queue stayed full for {timeout:?} (the process does not serve its stats \
                             endpoint: stopped or stuck?)"
                        ),
                    ));
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => return Err(e),
        }
    }
}

/// Largest answer [`query`] accepts (a device with 10,000 QPs answers about 8 MB).
pub const MAX_ANSWER: usize = 64 << 20;

/// Sends `request` to the endpoint at `path` and returns its answer; the whole exchange (writing the request,
/// reading the answer) is bounded by `timeout` and the answer by [`MAX_ANSWER`] bytes, so that a stalled,
/// trickling or endless answer ends in an error, not a hang or a growing buffer.
///
/// # Errors
/// Connecting, writing or reading failed, no connection or no whole answer came within `timeout` (`TimedOut`; a
/// listener whose queue stays full is not waited on longer), the answer is
/// longer than [`MAX_ANSWER`], not JSON, or not a version-[`VERSION`] `rocev2-stats` object (`InvalidData`).
pub fn query(path: &Path, request: &Value, timeout: Duration) -> std::io::Result<Value> {
    use std::io::{Error, ErrorKind};
    let deadline = std::time::Instant::now() + timeout;
    let left = || {
        let d = deadline.saturating_duration_since(std::time::Instant::now());
        if d.is_zero() {
            Err(Error::new(
                ErrorKind::TimedOut,
                format!("no whole answer within {timeout:?}"),
            ))
        } else {
            Ok(d)
        }
    };
    let mut s = connect(path, deadline, timeout)?;
    // The socket must be served by the process its name says (a stale name over a socket of another process, or a
    // socket planted under a live process's name, is not read).
    let named = path
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_suffix(".sock"))
        .and_then(parse_name)
        .map(|(pid, _)| pid);
    if let Some(named) = named {
        let cred = rustix::net::sockopt::socket_peercred(&s)?;
        let served = cred.pid.as_raw_nonzero().get();
        if i64::from(served) != i64::from(named) {
            return Err(Error::new(
                ErrorKind::PermissionDenied,
                format!("the socket is served by pid {served}, not by pid {named} its name says"),
            ));
        }
    }
    s.set_write_timeout(Some(left()?))?;
    let mut line = request.to_string();
    line.push('\n');
    s.write_all(line.as_bytes())?;
    let mut answer = Vec::new();
    let mut chunk = [0u8; 64 * 1024];
    loop {
        s.set_read_timeout(Some(left()?))?;
        let n = match std::io::Read::read(&mut s, &mut chunk) {
            Ok(n) => n,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                left()?;
                continue;
            }
            Err(e) => return Err(e),
        };
        if let Some(i) = chunk[..n].iter().position(|&b| b == b'\n') {
            answer.extend_from_slice(&chunk[..i]);
            break;
        }
        answer.extend_from_slice(&chunk[..n]);
        if n == 0 {
            break;
        }
        if answer.len() > MAX_ANSWER {
            return Err(Error::new(
                ErrorKind::InvalidData,
                format!("answer longer than {MAX_ANSWER} bytes"),
            ));
        }
    }
    let v: Value =
        serde_json::from_slice(&answer).map_err(|e| Error::new(ErrorKind::InvalidData, e))?;
    if v.get("proto").and_then(Value::as_str) != Some(PROTO) {
        return Err(Error::new(
            ErrorKind::InvalidData,
            "not a rocev2-stats answer",
        ));
    }
    if v.get("v").and_then(Value::as_u64) != Some(VERSION) {
        return Err(Error::new(
            ErrorKind::InvalidData,
            format!(
                "stats protocol version {}, this reader speaks {VERSION}",
                v["v"]
            ),
        ));
    }
    Ok(v)
}

/// A running endpoint; stopped (thread joined, socket removed) by [`Endpoint::stop`].
#[derive(Debug)]
pub(crate) struct Endpoint {
    path: PathBuf,
    stop: Arc<AtomicBool>,
    join: Option<JoinHandle<()>>,
    thread: ThreadId,
    /// The process that started it: a `fork`ed child inherits the struct but neither the thread nor the socket's
    /// ownership, so its `stop` must not remove the parent's socket.
    pid: u32,
}

/// The devices an endpoint reports: weak, so it never keeps a runtime alive.
pub(crate) type DeviceList = Arc<Mutex<Vec<Weak<CtxInner>>>>;

/// Runtimes started by this process (the `<n>` of the socket name).
static RUNTIMES: AtomicU64 = AtomicU64::new(0);

/// Starts the endpoint `cfg` asks for, serving `devices`; `None` when it is off or cannot be created (a warning
/// is logged: the runtime works without it).
pub(crate) fn start(cfg: &StatsEndpoint, devices: DeviceList) -> Option<Endpoint> {
    let off =
        std::env::var(ENV_OFF).is_ok_and(|v| matches!(v.trim(), "0" | "off" | "false" | "no"));
    let dir = match cfg {
        StatsEndpoint::Off => return None,
        _ if off => return None,
        StatsEndpoint::RunDir => run_dir()?,
        StatsEndpoint::Dir(d) => {
            let _ = std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(d);
            if let Err(why) = dir_trusted(d, &[uid()]) {
                tracing::warn!(%why, "no stats endpoint");
                return None;
            }
            d.clone()
        }
    };
    remove_stale(&dir);
    let n = RUNTIMES.fetch_add(1, Ordering::Relaxed);
    let pid = std::process::id();
    let path = match start_time(pid) {
        Some(start) => dir.join(format!("{pid}.{start}.{n}.sock")),
        None => dir.join(format!("{pid}.{n}.sock")),
    };
    let _ = std::fs::remove_file(&path);
    let listener = match UnixListener::bind(&path).and_then(|l| {
        // Only this user may connect (the directory is this user's alone too; the mode does not follow the umask).
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
        l.set_nonblocking(true)?;
        Ok(l)
    }) {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "no stats endpoint");
            return None;
        }
    };
    let stop = Arc::new(AtomicBool::new(false));
    let st = Arc::clone(&stop);
    let (started_tx, started_rx) = std::sync::mpsc::sync_channel::<()>(1);
    let join = std::thread::Builder::new()
        .name("rocev2-stats".into())
        .spawn(move || {
            let _ = started_tx.send(());
            serve(&listener, &st, &devices)
        })
        .ok()?;
    // Running before `open` returns: its start-up (which allocates) never lands in the application's steady state.
    let _ = started_rx.recv();
    let thread = join.thread().id();
    Some(Endpoint {
        path,
        stop,
        join: Some(join),
        thread,
        pid,
    })
}

impl Endpoint {
    /// The socket's path.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Stops the thread (joined unless this is it: the last device handle can be dropped by a request in flight)
    /// and removes the socket.
    pub(crate) fn stop(mut self) {
        if std::process::id() != self.pid {
            // A forked child: the endpoint, its thread and its socket are the parent's (breaker finding: the child's
            // `ibv_close_device` removed the parent's socket, then panicked joining a thread it does not have).
            std::mem::forget(self.join.take());
            return;
        }
        self.stop.store(true, Ordering::Relaxed);
        let _ = std::fs::remove_file(&self.path);
        if let Some(j) = self.join.take()
            && std::thread::current().id() != self.thread
        {
            let _ = j.join();
        }
    }
}

/// Clients served at once at most; a connection beyond them is closed at once (the client sees EOF and may retry)
/// instead of queueing behind slow ones.
const MAX_CLIENTS: usize = 8;

/// Accepts clients and serves each in a thread of its own (at most [`MAX_CLIENTS`] at once, each bounded by
/// [`REQUEST_BOUND`]), so a client that trickles its request or does not read its answer delays no other reader
/// (issue #21: one at a time, a slowloris client stalled `rocev2 stat` for everyone). Only this user's and root's
/// connections get a thread (`SO_PEERCRED`, checked here first). The handler threads are not joined: one of them
/// may drop the last handle of a device, whose teardown joins this thread; each ends within [`SLICE`] of `stop`.
fn serve(l: &UnixListener, stop: &Arc<AtomicBool>, devices: &DeviceList) {
    let active = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let me = uid();
    while !stop.load(Ordering::Relaxed) {
        match l.accept() {
            Ok((s, _)) => {
                match rustix::net::sockopt::socket_peercred(&s) {
                    Ok(c) if c.uid.as_raw() == me || c.uid.is_root() => {}
                    _ => continue,
                }
                if active.fetch_add(1, Ordering::AcqRel) >= MAX_CLIENTS {
                    active.fetch_sub(1, Ordering::AcqRel);
                    continue;
                }
                let (stop, devices, done) =
                    (Arc::clone(stop), Arc::clone(devices), Arc::clone(&active));
                let spawned = std::thread::Builder::new()
                    .name("rocev2-stats-client".into())
                    .spawn(move || {
                        answer(s, &stop, &devices);
                        done.fetch_sub(1, Ordering::AcqRel);
                    });
                if spawned.is_err() {
                    active.fetch_sub(1, Ordering::AcqRel);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// Largest request line read.
const MAX_REQUEST: usize = 4096;

/// Time bound of one whole request, reading the request and writing the answer together: a client that trickles
/// its request or reads the answer slowly is dropped when it runs out, so it can keep other readers waiting (and
/// the runtime's teardown, which joins this thread) for at most this long.
const REQUEST_BOUND: Duration = Duration::from_secs(2);

/// Longest single blocking socket call, so that a stop request is seen while a client stalls.
const SLICE: Duration = Duration::from_millis(50);

/// Time left before `deadline` for one blocking call (at most [`SLICE`]); `None` when the deadline passed or the
/// endpoint is stopping.
fn slice_left(deadline: std::time::Instant, stop: &AtomicBool) -> Option<Duration> {
    let left = deadline.saturating_duration_since(std::time::Instant::now());
    (!stop.load(Ordering::Relaxed) && !left.is_zero()).then(|| left.min(SLICE))
}

/// Reads one request line (without the newline) of at most [`MAX_REQUEST`] bytes before `deadline`; `None` if the
/// client sent none in time (or the endpoint is stopping).
fn read_request(
    s: &mut UnixStream,
    deadline: std::time::Instant,
    stop: &AtomicBool,
) -> Option<String> {
    let mut buf = Vec::with_capacity(256);
    let mut chunk = [0u8; 512];
    loop {
        if let Some(i) = buf.iter().position(|&b| b == b'\n') {
            buf.truncate(i);
            break;
        }
        if buf.len() >= MAX_REQUEST {
            buf.truncate(MAX_REQUEST);
            break;
        }
        let t = slice_left(deadline, stop)?;
        s.set_read_timeout(Some(t)).ok()?;
        let want = chunk.len().min(MAX_REQUEST - buf.len());
        match std::io::Read::read(s, &mut chunk[..want]) {
            Ok(0) => break,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock
                        | std::io::ErrorKind::TimedOut
                        | std::io::ErrorKind::Interrupted
                ) => {}
            Err(_) => return None,
        }
    }
    Some(String::from_utf8_lossy(&buf).into_owned())
}

/// Writes `bytes` before `deadline` (given up when the client does not read them in time).
fn write_answer(
    s: &mut UnixStream,
    mut bytes: &[u8],
    deadline: std::time::Instant,
    stop: &AtomicBool,
) {
    while !bytes.is_empty() {
        let Some(t) = slice_left(deadline, stop) else {
            return;
        };
        if s.set_write_timeout(Some(t)).is_err() {
            return;
        }
        match s.write(bytes) {
            Ok(0) => return,
            Ok(n) => bytes = &bytes[n..],
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock
                        | std::io::ErrorKind::TimedOut
                        | std::io::ErrorKind::Interrupted
                ) => {}
            Err(_) => return,
        }
    }
}

fn answer(mut s: UnixStream, stop: &AtomicBool, devices: &DeviceList) {
    let deadline = std::time::Instant::now() + REQUEST_BOUND;
    if s.set_nonblocking(false).is_err() {
        return;
    }
    // Only this user and root reach here (the answer holds PSNs and keys' traffic counters): `serve` checked.
    let Some(line) = read_request(&mut s, deadline, stop) else {
        return;
    };
    // Upgrade outside the lock: a request may hold the last handle of a device whose drop takes the lock.
    let live: Vec<Context> = devices
        .lock()
        .map(|v| {
            v.iter()
                .filter_map(Weak::upgrade)
                .map(Context::from_inner)
                .collect()
        })
        .unwrap_or_default();
    let mut stats = false;
    let body = match serde_json::from_str::<Value>(line.trim()) {
        Ok(req) => {
            stats = req.get("get").and_then(Value::as_str) == Some("stats");
            respond(&req, &live)
        }
        Err(e) => Err(format!("not a JSON request: {e}")),
    };
    let mut out = envelope();
    match body {
        Ok(devs) => out["devices"] = Value::Array(devs),
        Err(e) => out["error"] = json!(e),
    }
    if stats && let Some(ids) = cm_ids() {
        out["cm_ids"] = ids;
    }
    let mut text = out.to_string();
    text.push('\n');
    // Let the devices go before writing: a client that does not read its answer must not keep a runtime (and its
    // UDP port) alive that the application has closed; closing it stops this endpoint, which ends the write.
    drop(live);
    write_answer(&mut s, text.as_bytes(), deadline, stop);
}

/// What answers for the process's rdma_cm ids: a JSON array as text (module docs, `cm_ids`), or `None`.
pub type CmIdSource = Box<dyn Fn() -> Option<String> + Send + Sync>;

/// Each process has its own (`roce_fork`): the stats thread holds this lock while the source answers, and a child
/// forked at that instant would otherwise wait for ever in its first rdma_cm call (breaker finding).
static CM_IDS: roce_fork::ForkLocal<Option<CmIdSource>> = roce_fork::ForkLocal::new(|| None);

/// Registers the source of the `cm_ids` of every `stats` answer of this process (replacing an earlier one).
/// rocev2's librdmacm does, through roce-ibverbs' private table. Its text is parsed here; text that is not a JSON
/// array is left out of the answer.
pub fn set_cm_id_source(f: CmIdSource) {
    *CM_IDS.lock() = Some(f);
}

fn cm_ids() -> Option<Value> {
    let g = CM_IDS.lock();
    let text = (g.as_ref()?)()?;
    serde_json::from_str::<Value>(&text)
        .ok()
        .filter(Value::is_array)
}

fn envelope() -> Value {
    json!({
        "proto": PROTO,
        "v": VERSION,
        "pid": std::process::id(),
        "comm": comm(),
        "cmdline": std::env::args().collect::<Vec<_>>().join(" "),
    })
}

/// The process name as the kernel keeps it (`/proc/self/comm`, at most 15 bytes; what `ps`, `top` and `rdma
/// statistic` show as comm); the file name of `argv[0]` if that cannot be read.
fn comm() -> String {
    std::fs::read_to_string("/proc/self/comm")
        .map(|c| c.trim_end_matches('\n').to_owned())
        .unwrap_or_else(|_| {
            std::env::args()
                .next()
                .and_then(|a| {
                    Path::new(&a)
                        .file_name()
                        .map(|f| f.to_string_lossy().into_owned())
                })
                .unwrap_or_default()
        })
}

fn respond(req: &Value, devices: &[Context]) -> Result<Vec<Value>, String> {
    match req.get("get").and_then(Value::as_str) {
        Some("stats") => Ok(devices
            .iter()
            .map(|c| device_stats(c).unwrap_or_else(|e| json!({ "index": c.index(), "error": e })))
            .collect()),
        Some("qp") => {
            let qpn = req
                .get("qpn")
                .and_then(Value::as_u64)
                .and_then(|q| u32::try_from(q).ok())
                .ok_or("`qp` needs a numeric `qpn`")?;
            let mut v = Vec::new();
            for c in devices {
                match c.qp_dump(Qpn::new(qpn)) {
                    Ok(Some(dump)) => {
                        v.push(json!({
                            "index": c.index(),
                            "gids": gid_texts(c),
                            "qp": { "qpn": qpn, "dump": dump },
                        }));
                    }
                    Ok(None) => {}
                    Err(e) => v.push(json!({ "index": c.index(), "error": e.to_string() })),
                }
            }
            Ok(v)
        }
        _ => Err(
            "unknown request (expected {\"get\": \"stats\"} or {\"get\": \"qp\", \"qpn\": N})"
                .into(),
        ),
    }
}

fn counters_json(c: &Counters) -> Value {
    Value::Object(
        c.iter()
            .map(|(k, v)| (k.to_owned(), json!(v)))
            .collect::<Map<_, _>>(),
    )
}

/// The device's GIDs as IPv6 text (`::ffff:198.18.0.1`).
fn gid_texts(c: &Context) -> Vec<String> {
    c.config()
        .gids
        .iter()
        .map(|g| std::net::Ipv6Addr::from(g.0).to_string())
        .collect()
}

fn device_stats(c: &Context) -> Result<Value, String> {
    // One engine call: the device's counters and its QPs' at one instant.
    let snap = c.stats_snapshot().map_err(|e| e.to_string())?;
    let (counters, qps) = (&snap.counters, &snap.qps);
    let link: Map<String, Value> = snap
        .link
        .iter()
        .map(|&(n, v)| (n.to_owned(), json!(v)))
        .collect();
    let cfg = c.config();
    let mut runtime = Map::new();
    runtime.insert(
        "progress".into(),
        json!(format!("{:?}", c.progress_mode()).to_lowercase()),
    );
    for (name, v) in c.runtime_stats().counters() {
        runtime.insert(name.into(), json!(v));
    }
    let mac: Vec<String> = cfg.mac.iter().map(|b| format!("{b:02x}")).collect();
    Ok(json!({
        "index": c.index(),
        "gids": gid_texts(c),
        "mac": mac.join(":"),
        "max_qp": c.query_device().max_qp,
        "counters": counters_json(counters),
        "link": link,
        "runtime": runtime,
        "qps": qps.iter().map(|q| json!({
            "qpn": q.qpn.value(),
            "type": q.info.qp_type.name(),
            "state": q.info.state.name(),
            "next_psn": q.info.next_psn.value(),
            "una_psn": q.info.una_psn.value(),
            "epsn": q.info.epsn.value(),
            "msn": q.info.msn,
            "sq_outstanding": q.info.sq_outstanding,
            "rq_outstanding": q.info.rq_outstanding,
            "udp_sport": q.info.udp_sport,
            "rate_bps": q.rate.and_then(|r| r.rate_bps),
            "target_bps": q.rate.and_then(|r| r.target_bps),
            "alpha": q.rate.and_then(|r| r.alpha),
            "limited": q.rate.is_some_and(|r| r.limited),
            "shaped_bps": q.shaped_bps,
            "counters": counters_json(&q.counters),
        })).collect::<Vec<_>>(),
    }))
}
