//! `rocev2 stat`: the counters of every rocev2 device running in the caller's network namespace, read live from the
//! processes through their stats endpoints (`roce_verbs::endpoint`), as `rdma statistic` shows an RNIC's (programs
//! in other network namespaces are not shown: their devices are not this namespace's).
//!
//! For each process (pid, process name as `comm`; the command line too in `--json`) and each of its devices:
//! the non-zero port counters, and the three signals
//! the send module's operators watch, over a sampling interval (two snapshots `--interval` apart, default 1 s, so a
//! one-shot report takes that long; in watch mode between refreshes; `--interval 0`: one snapshot at once, without
//! the rates):
//!
//! * **send-queue depth**: send WRs posted and not yet completed, summed over the device's QPs (and per QP);
//! * **retransmission rate**: `Δretransmitted_pkts / Δsent_pkts`, flagged above 5 % — a sign of a lossy or congested
//!   network (go-back-N resends a whole window per loss);
//! * **doorbell rate** and **WQEs per doorbell** (`Δwqes / Δdoorbells`, the average post-list chain): a low figure at
//!   a high rate means the application rings once per WR;
//! * **packets per I/O call**, out (`Δtx_frames / Δflushes`: frames per `flush`, one `sendmmsg` per QP socket) and in
//!   (`Δrx_frames / Δrx_bursts`: frames per `recvmmsg`) — how well doorbell batching and receive bursts amortise the
//!   system calls. These come from the runtime's counters (`roce_verbs::RuntimeStats`, counted where the doorbell
//!   rings and where the pass calls the link), shared by the devices of one runtime (they then show the same
//!   figures);
//! * **link drops**: datagrams the link dropped before the engine saw them (`rx_kernel_drops`: the kernel dropped
//!   them for the link's receive socket, whose buffer was full; `rx_icrc_bad`: too short or a wrong ICRC,
//!   `rx_truncated`, `rx_bad_addr`, `rx_bad_checksum`, `rx_fragments`; `tx_errors`, `tx_invalid`), non-zero ones on a `link` line of
//!   their own (`-a`: every link counter; `--json`: the device's `link` object);
//! * **longest pass gap** (`max_pass_gap_us`, since the runtime started): the longest time the engine went without a
//!   pass while a timer was armed — near the local ACK timeout (67 ms by default), a stalled progress thread or
//!   caller explains timeouts that lost nothing.
//!
//! * **throughput**: bits per second out and in (`Δsent_bytes`, `Δrcvd_bytes`: whole frames), beside packets/s;
//! * **stalls**, flagged `(!)`: local ACK timeouts (`local_ack_timeout_err`: each is a stall of at least the ACK
//!   timeout, whether or not the retransmission rate over the interval shows it), transport retries exhausted, and a
//!   longest pass gap of [`STALL_GAP_US`] or more.
//!
//! Then one block per QP: type, state, PSNs (next, oldest unacknowledged, expected), queue depths, rate controller and
//! its non-zero counters. Each device and QP is named by its port and address (`rocev2_lo/1 127.0.0.2`): the two ends
//! of a `--loopback` run share the device `rocev2_lo` (their QPNs may even meet: each engine draws its own); `--ip`
//! picks one. The
//! report fits the terminal (`COLUMNS`, else the width of the terminal on stdout, else 120 columns), wrapped between
//! fields (a name and its value stay on one line); `--wide` puts each device and QP on one line. `--qp N` prints the engine's dump of QP N instead (state, PSNs, outstanding WRs, retry
//! and timer state, rate controller, counters) for every device that has one, headed by the process and the
//! device's port name; `--pid` narrows to one process.
//! Then one `cm_id` line per rdma_cm id of the process (rocev2's librdmacm; what `rdma resource show cm_id` lists on
//! Linux): local QPN, QP type, rdma_cm state (LISTEN, CONNECT, DISCONNECT, ...), port space, source and destination
//! address:port (`--json`: the runtime's `cm_ids`).
//! `--json` prints one object per sample (with its UTC `time`); `-w SECS` repeats until interrupted, each sample
//! headed by a `--- <UTC time> every SECSs` line.

use std::io::IsTerminal as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use roce_verbs::endpoint::{self, EndpointPath};
use serde_json::{Value, json};

/// Retransmission rate above which a device or QP is flagged.
const RETRANS_FLAG: f64 = 0.05;

/// Longest pass gap (µs) flagged as a stall: about half the default local ACK timeout (67 ms), so a gap that can
/// cause timeouts on its own is pointed at.
pub const STALL_GAP_US: u64 = 30_000;

/// Width of the text report when neither `COLUMNS` nor the terminal says (fits a 120-column terminal).
const DEFAULT_WIDTH: usize = 120;

/// The text report's width: `COLUMNS` when set (40 or more), else the width of the terminal on stdout (an 80-column
/// terminal wrapped the 120-column report mid-field, issue #18), else [`DEFAULT_WIDTH`] (a pipe or a file).
fn width() -> usize {
    let usable = |w: usize| (w >= 40).then_some(w);
    std::env::var("COLUMNS")
        .ok()
        .and_then(|c| c.parse().ok())
        .and_then(usable)
        .or_else(|| {
            console::Term::stdout()
                .size_checked()
                .and_then(|(_rows, cols)| usable(usize::from(cols)))
        })
        .unwrap_or(DEFAULT_WIDTH)
}

/// `rocev2 stat` arguments.
#[derive(Clone, Debug, clap::Args)]
pub struct StatArgs {
    /// Print one JSON object per sample instead of text.
    #[arg(long)]
    pub json: bool,
    /// Watch mode: refresh every SECS seconds until interrupted (rates over each refresh interval).
    #[arg(short = 'w', long = "watch", value_name = "SECS")]
    pub watch: Option<f64>,
    /// Seconds between the two snapshots the rates of a one-shot report come from; 0: one snapshot at once,
    /// counters and queue depths without rates.
    #[arg(long, default_value_t = 1.0, value_name = "SECS")]
    pub interval: f64,
    /// Print the dump of this QP (state, PSNs, outstanding WRs, retry and CC state) instead of the counters.
    #[arg(long, value_name = "QPN", value_parser = parse_qpn)]
    pub qp: Option<u32>,
    /// Only this process.
    #[arg(long)]
    pub pid: Option<u32>,
    /// Only the device with this address (its GID's IP address: `127.0.0.2`, `::ffff:127.0.0.2` or an IPv6 address);
    /// with `--qp`, the one device whose QP is meant when two devices have a QP of that number.
    #[arg(long, value_name = "ADDR")]
    pub ip: Option<std::net::IpAddr>,
    /// Show every counter, zeros included.
    #[arg(short = 'a', long)]
    pub all: bool,
    /// One line per device and per QP, however long (for `grep`/`awk`); without it the report is wrapped to the
    /// terminal's width (`COLUMNS`, else the terminal's, else 120 columns).
    #[arg(long)]
    pub wide: bool,
}

/// A QPN in decimal or 0x hex.
fn parse_qpn(s: &str) -> Result<u32, String> {
    let v = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(h) => u32::from_str_radix(h, 16),
        None => s.parse(),
    };
    v.ok()
        .filter(|&q| q <= 0xFF_FFFF)
        .ok_or_else(|| format!("`{s}` is not a QP number (24 bits, decimal or 0x hex)"))
}

/// How long one endpoint may take to answer.
const QUERY_TIMEOUT: Duration = Duration::from_secs(3);

/// Entry point of `rocev2 stat`.
pub fn run(a: &StatArgs) -> ExitCode {
    let secs = |v: f64, what: &str| {
        Duration::try_from_secs_f64(v)
            .ok()
            .filter(|d| !d.is_zero())
            .ok_or_else(|| format!("{what} {v}: a positive number of seconds"))
    };
    // `--interval 0` (one-shot only): no second snapshot, so no wait and no rates.
    let interval = if a.interval == 0.0 && a.watch.is_none() {
        Ok(Duration::ZERO)
    } else {
        secs(a.interval, "--interval")
    };
    let (interval, watch) = match (interval, a.watch.map(|w| secs(w, "--watch")).transpose()) {
        (Ok(i), Ok(w)) => (i, w),
        (Err(e), _) | (_, Err(e)) => {
            eprintln!("rocev2 stat: {e}");
            return ExitCode::from(2);
        }
    };
    if let Some(qpn) = a.qp {
        return qp_dump(a, qpn);
    }
    let look = Look {
        all: a.all,
        wide: a.wide,
        width: width(),
    };
    let mut prev = snapshot(a.pid);
    let mut t_prev = Instant::now();
    if prev.is_empty() {
        eprintln!("{}", nothing_running());
        if watch.is_none() {
            return ExitCode::from(1);
        }
    }
    let tty = std::io::stdout().is_terminal() && !a.json;
    if watch.is_none() && interval.is_zero() {
        let report = report(&[], &prev, Duration::ZERO, a.ip);
        let out = if a.json {
            format!("{report}\n")
        } else {
            text(&report, &look)
        };
        return emit(&out).unwrap_or_else(|code| code);
    }
    loop {
        std::thread::sleep(watch.unwrap_or(interval));
        let cur = snapshot(a.pid);
        let dt = t_prev.elapsed();
        t_prev = Instant::now();
        let report = report(&prev, &cur, dt, a.ip);
        let mut out = String::new();
        if a.json {
            out = format!("{report}\n");
        } else {
            if tty && watch.is_some() {
                // Clear the screen and home the cursor, as `watch` does.
                out.push_str("\x1b[2J\x1b[H");
            }
            if let Some(w) = watch {
                // Each sample headed by when it was taken, as `watch` heads its screen.
                out.push_str(&format!(
                    "--- {} every {}s\n",
                    report["time"].as_str().unwrap_or("?"),
                    w.as_secs_f64()
                ));
            }
            out.push_str(&text(&report, &look));
        }
        if let Err(code) = emit(&out) {
            return code;
        }
        prev = cur;
        if watch.is_none() {
            return ExitCode::SUCCESS;
        }
    }
}

/// Writes `out` to stdout. `Err` with the exit status when stdout is gone: success when the reader closed the
/// pipe (`rocev2 stat -w 1 | head -3`: stop quietly, as other tools end on SIGPIPE), 1 on any other write error.
/// `print!` would panic instead.
fn emit(out: &str) -> Result<ExitCode, ExitCode> {
    use std::io::Write as _;
    let mut o = std::io::stdout().lock();
    match o.write_all(out.as_bytes()).and_then(|()| o.flush()) {
        Ok(()) => Ok(ExitCode::SUCCESS),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Err(ExitCode::SUCCESS),
        Err(e) => {
            eprintln!("rocev2 stat: writing to stdout: {e}");
            Err(ExitCode::from(1))
        }
    }
}

fn nothing_running() -> String {
    let dirs = endpoint::run_dir()
        .map(|d| d.display().to_string())
        .unwrap_or_else(|| "no run directory".into());
    format!(
        "rocev2 stat: no rocev2 device is running in this network namespace (no stats endpoint in {dirs}; programs \
         in other network namespaces, or started with ROCEV2_STATS_ENDPOINT=0 or another ROCEV2_RUN_DIR, are not seen)"
    )
}

/// One process's answer (or why there is none).
struct Sample {
    ep: EndpointPath,
    answer: Result<Value, String>,
}

fn snapshot(pid: Option<u32>) -> Vec<Sample> {
    endpoint::endpoints()
        .into_iter()
        .filter(|e| pid.is_none_or(|p| p == e.pid))
        .map(|ep| {
            let answer = endpoint::query(&ep.path, &json!({"get": "stats"}), QUERY_TIMEOUT)
                .map_err(|e| e.to_string())
                .and_then(|v| match v.get("error").and_then(Value::as_str) {
                    Some(e) => Err(e.to_owned()),
                    None => Ok(v),
                });
            Sample { ep, answer }
        })
        .collect()
}

fn u(v: &Value, k: &str) -> u64 {
    v.get(k).and_then(Value::as_u64).unwrap_or(0)
}

/// `Δa / Δb` of two counters, `None` when `Δb` is 0.
fn ratio(num: u64, den: u64) -> Option<f64> {
    (den > 0).then(|| num as f64 / den as f64)
}

/// The report of one sample: `{time, interval_s, runtimes: [{pid, endpoint, comm, cmdline, devices: [DEVICE +
/// signals]}]}` (`time`: when it was taken, UTC, ISO 8601; `comm`: the process name), one
/// entry per endpoint (a process has one per runtime), every device with rates against the same device (endpoint,
/// index) in `prev` over `dt` (none for a device that was not there); only the device with address `ip` if given.
fn report(prev: &[Sample], cur: &[Sample], dt: Duration, ip: Option<std::net::IpAddr>) -> Value {
    let secs = dt.as_secs_f64();
    let find_prev = |path: &PathBuf, index: u64| -> Option<&Value> {
        prev.iter()
            .find(|s| &s.ep.path == path)
            .and_then(|s| s.answer.as_ref().ok())
            .and_then(|a| a["devices"].as_array())
            .and_then(|d| d.iter().find(|x| u(x, "index") == index))
    };
    let procs: Vec<Value> = cur
        .iter()
        .map(|s| {
            let mut p = json!({
                "pid": s.ep.pid,
                "endpoint": s.ep.path.display().to_string(),
            });
            match &s.answer {
                Err(e) => p["error"] = json!(e),
                Ok(a) => {
                    p["comm"] = a["comm"].clone();
                    p["cmdline"] = a["cmdline"].clone();
                    let devs: Vec<Value> = a["devices"]
                        .as_array()
                        .map(|d| d.as_slice())
                        .unwrap_or_default()
                        .iter()
                        // An answer is another process's word: a device that is not an object is skipped.
                        .filter(|d| d.is_object())
                        .filter(|d| ip.is_none_or(|ip| device_ip(d) == Some(ip)))
                        .map(|d| {
                            let mut d = d.clone();
                            d["name"] = json!(device_name(&d));
                            let before = find_prev(&s.ep.path, u(&d, "index"));
                            d["signals"] = signals(&d, before, secs);
                            d
                        })
                        .collect();
                    p["devices"] = Value::Array(devs);
                    // The process's rdma_cm ids (rocev2's librdmacm), of the devices shown.
                    if let Some(ids) = a["cm_ids"].as_array() {
                        let shown: Vec<u64> = p["devices"]
                            .as_array()
                            .map(|d| d.iter().map(|d| u(d, "index")).collect())
                            .unwrap_or_default();
                        let ids: Vec<Value> = ids
                            .iter()
                            .filter(|i| i.is_object())
                            .filter(|i| {
                                ip.is_none()
                                    || i["dev"].as_u64().is_some_and(|d| shown.contains(&d))
                            })
                            .cloned()
                            .collect();
                        p["cm_ids"] = Value::Array(ids);
                    }
                }
            }
            p
        })
        .collect();
    json!({ "time": utc_now(), "interval_s": secs, "runtimes": procs })
}

/// The wall-clock time now as UTC ISO 8601 with milliseconds, `2026-12-01T23:05:33.123Z`.
fn utc_now() -> String {
    utc(std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default())
}

/// `t` after the Unix epoch as UTC ISO 8601 with milliseconds.
fn utc(t: Duration) -> String {
    let (days, sod) = (t.as_secs() / 86_400, t.as_secs() % 86_400);
    // Days since 1970-01-01 to a proleptic Gregorian date, over 400-year eras of 146,097 days (H. Hinnant's
    // `civil_from_days`, shifted so a year starts on March 1st and leap days fall at its end).
    let z = days + 719_468;
    let (era, doe) = (z / 146_097, z % 146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = era * 400 + yoe + u64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        sod / 3600,
        sod / 60 % 60,
        sod % 60,
        t.subsec_millis()
    )
}

/// The operators' signals of device `d` since `before` (`secs` earlier): send-queue depth (total and per QP),
/// retransmission rate (and whether it is above 5 %), doorbell rate, WQEs per doorbell, packet rates.
fn signals(d: &Value, before: Option<&Value>, secs: f64) -> Value {
    let qps = d["qps"]
        .as_array()
        .map(|q| q.as_slice())
        .unwrap_or_default();
    let sq_depth: u64 = qps.iter().map(|q| u(q, "sq_outstanding")).sum();
    let gap = u(&d["runtime"], "max_pass_gap_us");
    let Some(b) = before else {
        let total = |k: &str| u(&d["counters"], k);
        return json!({
            "sq_depth": sq_depth,
            "max_pass_gap_us": gap,
            "local_ack_timeouts_total": total("local_ack_timeout_err"),
            "retransmitted_pkts_total": total("retransmitted_pkts"),
            "retry_exceeded_total": total("retry_exceeded_err") + total("retry_rnr_exceeded_err"),
        });
    };
    let dc = |k: &str| u(&d["counters"], k).saturating_sub(u(&b["counters"], k));
    let dr = |k: &str| u(&d["runtime"], k).saturating_sub(u(&b["runtime"], k));
    let retrans = ratio(dc("retransmitted_pkts"), dc("sent_pkts"));
    let total = |k: &str| u(&d["counters"], k);
    let per_qp: Vec<Value> = qps
        .iter()
        .map(|q| {
            let qb = b["qps"]
                .as_array()
                .and_then(|v| v.iter().find(|x| x["qpn"] == q["qpn"]));
            let r = qb.and_then(|qb| {
                let dq = |k: &str| u(&q["counters"], k).saturating_sub(u(&qb["counters"], k));
                ratio(dq("retransmitted_pkts"), dq("sent_pkts"))
            });
            json!({
                "qpn": q["qpn"],
                "sq_depth": u(q, "sq_outstanding"),
                "retrans_rate": r,
                "retrans_flag": r.is_some_and(|r| r > RETRANS_FLAG),
            })
        })
        .collect();
    json!({
        "sq_depth": sq_depth,
        "retrans_rate": retrans,
        "retrans_flag": retrans.is_some_and(|r| r > RETRANS_FLAG),
        "sent_pps": dc("sent_pkts") as f64 / secs,
        "rcvd_pps": dc("rcvd_pkts") as f64 / secs,
        "sent_bps": dc("sent_bytes") as f64 * 8.0 / secs,
        "rcvd_bps": dc("rcvd_bytes") as f64 * 8.0 / secs,
        "local_ack_timeouts": dc("local_ack_timeout_err"),
        "local_ack_timeouts_total": total("local_ack_timeout_err"),
        "retransmitted_pkts_total": total("retransmitted_pkts"),
        "retry_exceeded_total": total("retry_exceeded_err") + total("retry_rnr_exceeded_err"),
        "doorbells_per_s": dr("doorbells") as f64 / secs,
        "wqes_per_doorbell": ratio(dr("wqes"), dr("doorbells")),
        "tx_pkts_per_io": ratio(dr("tx_frames"), dr("flushes")),
        "rx_pkts_per_io": ratio(dr("rx_frames"), dr("rx_bursts")),
        "max_pass_gap_us": gap,
        "qps": per_qp,
    })
}

/// A rate for people: "12.3k" etc.
fn human(x: f64) -> String {
    match x {
        x if x >= 1e9 => format!("{:.2}G", x / 1e9),
        x if x >= 1e6 => format!("{:.2}M", x / 1e6),
        x if x >= 1e3 => format!("{:.1}k", x / 1e3),
        x => format!("{x:.0}"),
    }
}

fn pct(r: Option<f64>, flag: bool) -> String {
    match r {
        None => "-".into(),
        Some(r) if flag => format!(
            "{:.2} % (!) above 5 %: lossy or congested network",
            r * 100.0
        ),
        Some(r) => format!("{:.2} %", r * 100.0),
    }
}

/// `name value` pairs of a counters object (non-zero ones unless `all`), on one line, each pair a field of
/// [`block`] (two spaces apart).
fn counters_line(c: &Value, all: bool) -> String {
    c.as_object()
        .map(|m| {
            m.iter()
                .filter(|(_, v)| all || v.as_u64() != Some(0))
                .map(|(k, v)| format!("{k} {v}"))
                .collect::<Vec<_>>()
                .join(FIELD)
        })
        .unwrap_or_default()
}

/// The link's own counters (`roce_link::Link::counters`) of what it dropped before the engine saw it, the non-zero
/// ones (all of them, traffic counters too, with `all`).
fn link_drops_line(c: &Value, all: bool) -> String {
    c.as_object()
        .map(|m| {
            m.iter()
                .filter(|(k, v)| {
                    all || (roce_link::udp::UdpStats::DROP_NAMES.contains(&k.as_str())
                        && v.as_u64() != Some(0))
                })
                .map(|(k, v)| format!("{k} {v}"))
                .collect::<Vec<_>>()
                .join(FIELD)
        })
        .unwrap_or_default()
}

/// A device's name (`rocev2_lo`): the device of the interface its first GID's address is on
/// ([`roce_link::udp::device_name`], the name `rocev2 devinfo` lists), looked up in this network namespace (the one
/// whose programs `rocev2 stat` lists).
fn device_name(d: &Value) -> String {
    let gid = d["gids"][0].as_str().unwrap_or("?");
    match gid.parse::<std::net::Ipv6Addr>() {
        Ok(v6) => roce_link::udp::device_name(
            v6.to_ipv4_mapped()
                .map_or(std::net::IpAddr::V6(v6), std::net::IpAddr::V4),
        ),
        Err(_) => format!("rocev2_{gid}"),
    }
}

/// The IP address of a device's first GID (the IPv4 address of an IPv4-mapped GID).
fn device_ip(d: &Value) -> Option<std::net::IpAddr> {
    let v6 = d["gids"][0].as_str()?.parse::<std::net::Ipv6Addr>().ok()?;
    Some(
        v6.to_ipv4_mapped()
            .map_or(std::net::IpAddr::V6(v6), std::net::IpAddr::V4),
    )
}

/// A device's port 1 and address in the text report, `rocev2_lo/1 127.0.0.2`: the port as `rdma statistic` names a
/// link (`rxe0/1`), the address to tell apart devices of one interface (both ends of a `--loopback` run).
fn link_name(d: &Value) -> String {
    format!(
        "{}/1 {}",
        d["name"]
            .as_str()
            .map_or_else(|| device_name(d), str::to_owned),
        device_ip(d).map_or_else(|| "?".to_owned(), |ip| ip.to_string())
    )
}

/// How the text report looks: every counter or the non-zero ones, one line per object or wrapped to `width`
/// columns.
#[derive(Clone, Copy, Debug)]
struct Look {
    all: bool,
    wide: bool,
    width: usize,
}

/// What separates the fields of a report line ([`block`]): a field is a name with its value (`retrans 0.00 %`,
/// `next_psn 0x593c21`) and is never split between two lines unless it is longer than a line on its own.
const FIELD: &str = "  ";

/// One device's or QP's block: a head line and indented detail lines, each line made of fields separated by
/// [`FIELD`] and printed one space apart. `--wide` joins the lines into one line; otherwise each line is wrapped to
/// `width` columns between fields (a field longer than a line between words), continuation lines indented below
/// their line.
fn block(o: &mut String, lines: &[String], look: &Look) {
    use std::fmt::Write as _;
    let fields = |l: &str| -> Vec<String> {
        l.split(FIELD)
            .map(str::trim)
            .filter(|f| !f.is_empty())
            .map(str::to_owned)
            .collect()
    };
    if look.wide {
        let joined: Vec<String> = lines.iter().map(|l| fields(l).join(" ")).collect();
        let _ = writeln!(o, "{}", joined.join("  "));
        return;
    }
    let cols = |s: &str| s.chars().count();
    for (i, l) in lines.iter().enumerate() {
        let (first, cont) = if i == 0 {
            ("", "    ")
        } else {
            ("    ", "        ")
        };
        let mut cur = String::from(first);
        // Appends `piece` to the line, after a space unless the line is still empty.
        let push = |cur: &mut String, piece: &str| {
            if !cur.trim().is_empty() {
                cur.push(' ');
            }
            cur.push_str(piece);
        };
        let empty = |cur: &String| cur.trim().is_empty();
        let fits = |cur: &String, n: usize| cols(cur) + usize::from(!empty(cur)) + n <= look.width;
        for field in fields(l) {
            if fits(&cur, cols(&field)) {
                push(&mut cur, &field);
                continue;
            }
            if !empty(&cur) {
                let _ = writeln!(o, "{}", cur.trim_end());
                cur = String::from(cont);
                if fits(&cur, cols(&field)) {
                    push(&mut cur, &field);
                    continue;
                }
            }
            // Longer than a line: between words; a unit never starts a line ("0.00" and "%" move together).
            let words: Vec<&str> = field.split(' ').filter(|w| !w.is_empty()).collect();
            for (k, word) in words.iter().enumerate() {
                let unit = *word == "%";
                let need = cols(word) + if words.get(k + 1) == Some(&"%") { 2 } else { 0 };
                if !unit && !empty(&cur) && !fits(&cur, need) {
                    let _ = writeln!(o, "{}", cur.trim_end());
                    cur = String::from(cont);
                }
                push(&mut cur, word);
            }
        }
        let _ = writeln!(o, "{}", cur.trim_end());
    }
}

/// `12.3 Gb/s` from bits per second.
fn gbps(bps: f64) -> String {
    format!("{:.2} Gb/s", bps / 1e9)
}

/// The `(!)` lines of a device's signals: local ACK timeouts (each a stall of at least the timeout), exhausted
/// retries, a long pass gap. Empty when nothing stalled.
fn stall_lines(s: &Value) -> Vec<String> {
    let mut v = Vec::new();
    let total = u(s, "local_ack_timeouts_total");
    if total > 0 {
        let now = s["local_ack_timeouts"]
            .as_u64()
            .map(|n| format!(", {n} in this interval"))
            .unwrap_or_default();
        v.push(format!(
            "(!) {total} local ACK timeout{} since start{now}: the peer (or this side's progress) went silent for at \
             least the ACK timeout each time; {} packets retransmitted since start",
            if total == 1 { "" } else { "s" },
            u(s, "retransmitted_pkts_total")
        ));
    }
    let exhausted = u(s, "retry_exceeded_total");
    if exhausted > 0 {
        v.push(format!(
            "(!) {exhausted} WR{} failed with retries exhausted (RETRY_EXC_ERR / RNR_RETRY_EXC_ERR)",
            if exhausted == 1 { "" } else { "s" }
        ));
    }
    let gap = u(s, "max_pass_gap_us");
    if gap >= STALL_GAP_US {
        v.push(format!(
            "(!) longest pass gap {} ms: the engine went that long without a pass while a timer was armed (a \
             stalled progress thread or caller)",
            gap / 1000
        ));
    }
    v
}

/// The text form of a report, in `rdma statistic`'s spirit: a `link` block per device, a `qp` block per QP.
fn text(r: &Value, look: &Look) -> String {
    use std::fmt::Write as _;
    let all = look.all;
    let mut o = String::new();
    let procs = r["runtimes"]
        .as_array()
        .map(|v| v.as_slice())
        .unwrap_or_default();
    if procs.is_empty() {
        let _ = writeln!(o, "{}", nothing_running());
    }
    let opt = |x: &Value, f: &dyn Fn(f64) -> String| x.as_f64().map_or_else(|| "-".into(), f);
    for p in procs {
        let pid = u(p, "pid");
        let cmd = p["comm"].as_str().unwrap_or("?");
        if let Some(e) = p["error"].as_str() {
            let _ = writeln!(o, "pid {pid}: no answer from {}: {e}", p["endpoint"]);
            continue;
        }
        for d in p["devices"]
            .as_array()
            .map(|v| v.as_slice())
            .unwrap_or_default()
        {
            let name = link_name(d);
            if let Some(e) = d["error"].as_str() {
                let _ = writeln!(o, "link {name} pid {pid}: {e}");
                continue;
            }
            let s = &d["signals"];
            let mut lines = vec![
                format!("link {name}{FIELD}pid {pid}{FIELD}comm {cmd}"),
                format!(
                    "out {} {} pkt/s  in {} {} pkt/s  sq_depth {}  retrans {}  max_pass_gap_us {}",
                    opt(&s["sent_bps"], &gbps),
                    opt(&s["sent_pps"], &human),
                    opt(&s["rcvd_bps"], &gbps),
                    opt(&s["rcvd_pps"], &human),
                    u(s, "sq_depth"),
                    pct(s["retrans_rate"].as_f64(), s["retrans_flag"] == true),
                    u(s, "max_pass_gap_us"),
                ),
                format!(
                    "doorbells {}/s  wqes/doorbell {}  per I/O call {} out {} in",
                    opt(&s["doorbells_per_s"], &human),
                    opt(&s["wqes_per_doorbell"], &|x| format!("{x:.2}")),
                    opt(&s["tx_pkts_per_io"], &|x| format!("{x:.2}")),
                    opt(&s["rx_pkts_per_io"], &|x| format!("{x:.2}")),
                ),
            ];
            lines.extend(stall_lines(s));
            lines.push(format!("counters {}", counters_line(&d["counters"], all)));
            let drops = link_drops_line(&d["link"], all);
            if !drops.is_empty() {
                lines.push(format!("link {drops}"));
            }
            block(&mut o, &lines, look);
            let sig_qps = s["qps"]
                .as_array()
                .map(|v| v.as_slice())
                .unwrap_or_default();
            for q in d["qps"]
                .as_array()
                .map(|v| v.as_slice())
                .unwrap_or_default()
            {
                let qs = sig_qps.iter().find(|x| x["qpn"] == q["qpn"]);
                let rate = match (q["rate_bps"].as_u64(), q["limited"] == true) {
                    (Some(r), l) => format!(
                        "{FIELD}cc_rate {}b/s{}",
                        human(r as f64),
                        if l { " (limited)" } else { "" }
                    ),
                    (None, _) => String::new(),
                };
                let mut lines = vec![format!(
                    "qp {:#x} {name}  type {}  state {}  sq {}  rq {}  next_psn {:#x}  una_psn {:#x}  epsn {:#x}  \
                     retrans {}{rate}",
                    u(q, "qpn"),
                    q["type"].as_str().unwrap_or("?"),
                    q["state"].as_str().unwrap_or("?"),
                    u(q, "sq_outstanding"),
                    u(q, "rq_outstanding"),
                    u(q, "next_psn"),
                    u(q, "una_psn"),
                    u(q, "epsn"),
                    pct(
                        qs.and_then(|x| x["retrans_rate"].as_f64()),
                        qs.is_some_and(|x| x["retrans_flag"] == true)
                    ),
                )];
                let c = counters_line(&q["counters"], all);
                if !c.is_empty() {
                    lines.push(format!("counters {c}"));
                }
                block(&mut o, &lines, look);
            }
        }
        for i in p["cm_ids"]
            .as_array()
            .map(|v| v.as_slice())
            .unwrap_or_default()
        {
            let lqpn = i["lqpn"]
                .as_u64()
                .map_or_else(|| "-".to_owned(), |q| format!("{q:#x}"));
            let line = format!(
                "cm_id pid {pid} comm {cmd}  lqpn {lqpn}  qp-type {}  state {}  ps {}  src-addr {}  dst-addr {}",
                i["qp_type"].as_str().unwrap_or("-"),
                i["state"].as_str().unwrap_or("?"),
                i["ps"].as_str().unwrap_or("?"),
                i["src"].as_str().unwrap_or("-"),
                i["dst"].as_str().unwrap_or("-"),
            );
            block(&mut o, &[line], look);
        }
    }
    o
}

/// `--qp N`: every device (of `--pid`, if given) that has QP N, with its dump.
fn qp_dump(a: &StatArgs, qpn: u32) -> ExitCode {
    let eps: Vec<EndpointPath> = endpoint::endpoints()
        .into_iter()
        .filter(|e| a.pid.is_none_or(|p| p == e.pid))
        .collect();
    if eps.is_empty() {
        eprintln!("{}", nothing_running());
        return ExitCode::from(1);
    }
    let mut found = Vec::new();
    for ep in &eps {
        match endpoint::query(&ep.path, &json!({"get": "qp", "qpn": qpn}), QUERY_TIMEOUT) {
            Ok(v) => {
                for d in v["devices"]
                    .as_array()
                    .map(|v| v.as_slice())
                    .unwrap_or_default()
                    .iter()
                    .filter(|d| a.ip.is_none_or(|ip| device_ip(d) == Some(ip)))
                {
                    found.push(json!({
                        "pid": ep.pid,
                        "comm": v["comm"],
                        "cmdline": v["cmdline"],
                        "index": d["index"],
                        "device": link_name(d),
                        "gid": d["gids"][0],
                        "qpn": qpn,
                        "dump": d["qp"]["dump"],
                        "error": d["error"],
                    }));
                }
            }
            Err(e) => eprintln!("rocev2 stat: pid {}: {e}", ep.pid),
        }
    }
    if found.is_empty() {
        eprintln!(
            "rocev2 stat: no running device has QP {qpn:#x}{}{}",
            a.pid.map(|p| format!(" in pid {p}")).unwrap_or_default(),
            a.ip.map(|ip| format!(" at {ip}")).unwrap_or_default()
        );
        return ExitCode::from(1);
    }
    use std::fmt::Write as _;
    let mut out = String::new();
    if a.json {
        let _ = writeln!(out, "{}", Value::Array(found));
    } else {
        for f in &found {
            let _ = writeln!(
                out,
                "pid {} ({}) device {} gid {} QP {qpn:#x}:",
                f["pid"],
                f["comm"].as_str().unwrap_or("?"),
                f["device"].as_str().unwrap_or("?"),
                f["gid"].as_str().unwrap_or("?"),
            );
            match (f["dump"].as_str(), f["error"].as_str()) {
                (Some(d), _) => {
                    for l in d.lines() {
                        let _ = writeln!(out, "  {l}");
                    }
                }
                (None, Some(e)) => {
                    let _ = writeln!(out, "  error: {e}");
                }
                _ => {}
            }
        }
    }
    emit(&out).unwrap_or_else(|code| code)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A device sample as the stats endpoint answers (only what the report reads).
    fn device(sent_bytes: u64, timeouts: u64, gap_us: u64) -> Value {
        json!({
            "index": 0,
            "gids": ["::ffff:127.0.0.2"],
            "counters": {
                "sent_bytes": sent_bytes,
                "sent_pkts": sent_bytes / 1000,
                "local_ack_timeout_err": timeouts,
                "retransmitted_pkts": 128 * timeouts,
                "a_long_counter_name_to_wrap": 123_456_789,
                "another_long_counter_name": 987_654_321,
                "yet_another_counter_name_here": 555_555_555,
            },
            "runtime": { "max_pass_gap_us": gap_us },
            "qps": [{ "qpn": 0x11, "type": "RC", "state": "RTS", "counters": {} }],
        })
    }

    fn sample(d: Value) -> Sample {
        Sample {
            ep: EndpointPath {
                pid: 7,
                path: "/run/rocev2/7.sock".into(),
            },
            answer: Ok(json!({ "comm": "prog", "devices": [d] })),
        }
    }

    /// Issue #18 item 6: throughput in Gb/s; a stall (local ACK timeout) flagged even when it happened before the
    /// interval (the retransmission rate over the interval then reads 0 %); a long pass gap flagged; no line
    /// over the width unless `--wide`, which puts each device on one line.
    #[test]
    fn text_report_shows_throughput_flags_stalls_and_fits_the_width() {
        let prev = [sample(device(1_000_000, 1, 67_000))];
        let cur = [sample(device(1_000_000 + 250_000_000, 1, 67_000))];
        let r = report(&prev, &cur, Duration::from_secs(1), None);
        let look = Look {
            all: false,
            wide: false,
            width: 80,
        };
        let t = text(&r, &look);
        assert!(
            t.starts_with("link rocev2_lo/1 127.0.0.2 pid 7 comm prog\n"),
            "{t}"
        );
        // The words, whatever the wrapping.
        let flat = t.split_whitespace().collect::<Vec<_>>().join(" ");
        for want in [
            "out 2.00 Gb/s 250.0k pkt/s",
            "(!) 1 local ACK timeout since start, 0 in this interval",
            "128 packets retransmitted",
            "(!) longest pass gap 67 ms",
        ] {
            assert!(flat.contains(want), "`{want}` not in:\n{t}");
        }
        assert!(t.lines().all(|l| l.chars().count() <= 80), "{t}");
        assert!(
            !t.lines().any(|l| l.trim_start().starts_with('%')),
            "a line starts with its unit:\n{t}"
        );
        let wide = text(&r, &Look { wide: true, ..look });
        assert_eq!(
            wide.lines().count(),
            2,
            "one device line, one QP line:\n{wide}"
        );
        // Nothing to flag: no `(!)`.
        let quiet = [sample(device(5_000, 0, 100))];
        let t = text(&report(&quiet, &quiet, Duration::from_secs(1), None), &look);
        assert!(!t.contains("(!)"), "{t}");
        // `--ip` keeps only the device at that address.
        let r = report(
            &prev,
            &cur,
            Duration::from_secs(1),
            Some("127.0.0.3".parse().unwrap()),
        );
        assert!(!text(&r, &look).contains("link "), "{r}");
    }

    #[test]
    fn utc_dates_across_leap_days_and_centuries() {
        let day = |d: u64, s: u64| utc(Duration::from_secs(d * 86_400 + s));
        assert_eq!(day(0, 0), "1970-01-01T00:00:00.000Z");
        assert_eq!(day(59, 3_661), "1970-03-01T01:01:01.000Z");
        assert_eq!(day(11_016, 86_399), "2000-02-29T23:59:59.000Z");
        assert_eq!(day(19_782, 0), "2024-02-29T00:00:00.000Z");
        assert_eq!(day(20_424, 0), "2025-12-02T00:00:00.000Z");
        assert_eq!(day(47_541, 0), "2100-03-01T00:00:00.000Z");
        assert_eq!(
            utc(Duration::from_millis(1_500)),
            "1970-01-01T00:00:01.500Z"
        );
    }
}
