//! A scenario in the input format of the HPCC ns-3 simulator (`alibaba-edu/High-Precision-Congestion-Control`,
//! `simulation/scratch/third.cc`), so that a fabric too large for one process runs on that simulator — and the
//! parser of that format, so an export can be read back and checked (`rocev2 sim SCENARIO --export-ns3 DIR`).
//!
//! Three files, all whitespace-separated tokens read in order with C++ `>>` (line breaks carry no meaning):
//!
//! * `topology.txt`: `NODES SWITCHES LINKS`, then the `SWITCHES` switch node ids, then per link
//!   `SRC DST RATE DELAY ERROR_RATE` (RATE an ns-3 `DataRate` string such as `40Gbps`, DELAY an ns-3 `Time` string
//!   such as `1000ns`). Nodes not listed as switches are hosts.
//! * `flow.txt`: `FLOWS`, then per flow `SRC DST PG DPORT SIZE START` — priority group, destination port, the
//!   bytes to write (a 32-bit count in `third.cc`) and the start in seconds; `third.cc` reads the flows in order
//!   and schedules each at its start, so they are sorted by start.
//! * `config.txt`: `KEY VALUE…` pairs; `KMAX_MAP`, `KMIN_MAP`, `PMAX_MAP` take a count and that many
//!   `RATE_BPS VALUE` pairs (Kmin/Kmax in KB of 1000 bytes, `switch-mmu.cc` `ConfigEcn`), `LINK_DOWN` three
//!   values, `BUFFER_SIZE` MiB per switch. `CC_MODE 1` is DCQCN (`rdma-hw.cc`'s ConnectX model, `DCQCN.md`
//!   §2.4). A fourth file, `trace.txt` (`COUNT` then node ids to trace), is opened by `third.cc` too.
//!
//! Mapping (this module writes it; `docs/SIMULATOR.md` "ns-3 export" documents it and what does not carry over,
//! which [`Ns3Export::notes`] lists for the scenario at hand): the senders are nodes `0..N`, the receiver node `N`,
//! the switch node `N + 1`; one link per host to the switch at the scenario's rate and delay; every flow in PG 3
//! to port 100; a backlogged flow writes the bytes the line rate carries between its start and its stop (or the
//! run's end), so it cannot finish early; the DCQCN parameters go to `CC_MODE 1`'s keys as
//! [`Ns3Export::from_scenario`] lists.

use std::fmt::Write as _;
use std::path::Path;

use roce_proto::cc::{DcqcnConfig, Profile};

use crate::scenario::{FlowSpec, MarkAt, Scenario, ScenarioError};

/// Priority group of every exported flow (the data class of the HPCC examples, `mix/flow.txt`).
pub const FLOW_PG: u32 = 3;
/// Destination port of every exported flow (`mix/flow.txt`).
pub const FLOW_DPORT: u32 = 100;

/// One link of `topology.txt`.
#[derive(Clone, Debug, PartialEq)]
pub struct Ns3Link {
    /// Node ids of the two ends.
    pub src: u32,
    /// See `src`.
    pub dst: u32,
    /// Rate, bit/s.
    pub rate_bps: u64,
    /// Propagation delay, ps.
    pub delay_ps: u64,
    /// Packet error rate of the link.
    pub error_rate: f64,
}

/// `topology.txt`.
#[derive(Clone, Debug, PartialEq)]
pub struct Ns3Topology {
    /// Number of nodes (hosts and switches), ids `0..nodes`.
    pub nodes: u32,
    /// Switch node ids.
    pub switches: Vec<u32>,
    /// Links.
    pub links: Vec<Ns3Link>,
}

/// One flow of `flow.txt`.
#[derive(Clone, Debug, PartialEq)]
pub struct Ns3Flow {
    /// Source host node id.
    pub src: u32,
    /// Destination host node id.
    pub dst: u32,
    /// Priority group.
    pub pg: u32,
    /// Destination port.
    pub dport: u32,
    /// Bytes to write.
    pub size: u32,
    /// Start, s.
    pub start_s: f64,
}

/// `config.txt`: each key with its value tokens, in file order.
pub type Ns3Config = Vec<(String, Vec<String>)>;

/// The three files of an export (and `trace.txt`), as text, with what did not carry over.
#[derive(Clone, Debug, PartialEq)]
pub struct Ns3Export {
    /// `topology.txt`.
    pub topology: String,
    /// `flow.txt`.
    pub flow: String,
    /// `config.txt`.
    pub config: String,
    /// `trace.txt`: the switch (packet events are dumped only with `ENABLE_TRACE 1`).
    pub trace: String,
    /// What of this scenario the HPCC simulator does not model or models differently, one sentence each.
    pub notes: Vec<String>,
}

/// Formats a rate in bit/s as an ns-3 `DataRate` string: whole Gb/s as `Gbps`, whole Mb/s as `Mbps`, else `bps`.
fn rate_str(bps: u64) -> String {
    if bps != 0 && bps.is_multiple_of(1_000_000_000) {
        format!("{}Gbps", bps / 1_000_000_000)
    } else if bps != 0 && bps.is_multiple_of(1_000_000) {
        format!("{}Mbps", bps / 1_000_000)
    } else {
        format!("{bps}bps")
    }
}

/// Formats a time in ps as an ns-3 `Time` string (`ns` when whole nanoseconds, else `ps`).
fn time_str(ps: u64) -> String {
    if ps.is_multiple_of(1000) {
        format!("{}ns", ps / 1000)
    } else {
        format!("{ps}ps")
    }
}

/// Parses an ns-3 `DataRate` string with a decimal bit unit (`bps`, `b/s`, `kbps`, `kb/s`, `Kbps`, `Mbps`, `Mb/s`,
/// `Gbps`, `Gb/s`, `Tbps`, `Tb/s`) into bit/s.
///
/// # Errors
/// Another unit, or a number that is not finite and ≥ 0.
pub fn parse_rate(s: &str) -> Result<u64, ScenarioError> {
    let bad = || {
        ScenarioError(format!(
            "rate `{s}`: expected a number and a bit unit such as 40Gbps"
        ))
    };
    let i = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == 'e' || c == '-' || c == '+'))
        .ok_or_else(bad)?;
    let (num, unit) = s.split_at(i);
    let v: f64 = num.parse().map_err(|_| bad())?;
    let mul = match unit {
        "bps" | "b/s" => 1.0,
        "kbps" | "kb/s" | "Kbps" | "Kb/s" => 1e3,
        "Mbps" | "Mb/s" => 1e6,
        "Gbps" | "Gb/s" => 1e9,
        "Tbps" | "Tb/s" => 1e12,
        _ => return Err(bad()),
    };
    let bps = (v * mul).round();
    if !(bps.is_finite() && bps >= 0.0 && bps < u64::MAX as f64) {
        return Err(bad());
    }
    Ok(bps as u64)
}

/// Parses an ns-3 `Time` string (`s`, `ms`, `us`, `ns`, `ps`) into ps.
///
/// # Errors
/// Another unit, or a number that is not finite and ≥ 0.
pub fn parse_time(s: &str) -> Result<u64, ScenarioError> {
    let bad = || {
        ScenarioError(format!(
            "time `{s}`: expected a number and a unit such as 1000ns"
        ))
    };
    let i = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == 'e' || c == '-' || c == '+'))
        .ok_or_else(bad)?;
    let (num, unit) = s.split_at(i);
    let v: f64 = num.parse().map_err(|_| bad())?;
    let mul = match unit {
        "s" => 1e12,
        "ms" => 1e9,
        "us" => 1e6,
        "ns" => 1e3,
        "ps" => 1.0,
        _ => return Err(bad()),
    };
    let ps = (v * mul).round();
    if !(ps.is_finite() && ps >= 0.0 && ps < u64::MAX as f64) {
        return Err(bad());
    }
    Ok(ps as u64)
}

/// Next token of a `third.cc` input file, parsed as `T`, naming `what` in the error.
fn next<'a, T: std::str::FromStr>(
    it: &mut impl Iterator<Item = &'a str>,
    file: &str,
    what: &str,
) -> Result<T, ScenarioError> {
    let tok = it
        .next()
        .ok_or_else(|| ScenarioError(format!("{file}: ends before {what}")))?;
    tok.parse()
        .map_err(|_| ScenarioError(format!("{file}: {what} `{tok}` does not parse")))
}

/// Most nodes, links or flows a parsed file may declare (a count beyond it is refused before anything is
/// allocated).
const MAX_ITEMS: u32 = 1 << 20;

/// Parses `topology.txt` as `third.cc` reads it.
///
/// # Errors
/// A missing or malformed token, a switch or link end outside `0..nodes`, counts above 2²⁰, or tokens left over.
pub fn parse_topology(text: &str) -> Result<Ns3Topology, ScenarioError> {
    let f = "topology.txt";
    let mut it = text.split_whitespace();
    let nodes: u32 = next(&mut it, f, "node count")?;
    let ns: u32 = next(&mut it, f, "switch count")?;
    let nl: u32 = next(&mut it, f, "link count")?;
    if nodes > MAX_ITEMS || ns > nodes || nl > MAX_ITEMS {
        return Err(ScenarioError(format!(
            "{f}: {nodes} nodes, {ns} switches, {nl} links: out of range"
        )));
    }
    let mut switches = Vec::with_capacity(ns as usize);
    for _ in 0..ns {
        let s: u32 = next(&mut it, f, "switch id")?;
        if s >= nodes {
            return Err(ScenarioError(format!("{f}: switch id {s} ≥ {nodes} nodes")));
        }
        switches.push(s);
    }
    let mut links = Vec::with_capacity(nl as usize);
    for _ in 0..nl {
        let src: u32 = next(&mut it, f, "link source")?;
        let dst: u32 = next(&mut it, f, "link destination")?;
        let rate: String = next(&mut it, f, "link rate")?;
        let delay: String = next(&mut it, f, "link delay")?;
        let error_rate: f64 = next(&mut it, f, "link error rate")?;
        if src >= nodes || dst >= nodes {
            return Err(ScenarioError(format!(
                "{f}: link {src}–{dst}: node ≥ {nodes}"
            )));
        }
        links.push(Ns3Link {
            src,
            dst,
            rate_bps: parse_rate(&rate)?,
            delay_ps: parse_time(&delay)?,
            error_rate,
        });
    }
    if let Some(t) = it.next() {
        return Err(ScenarioError(format!(
            "{f}: unexpected `{t}` after the links"
        )));
    }
    Ok(Ns3Topology {
        nodes,
        switches,
        links,
    })
}

/// Parses `flow.txt` as `third.cc` reads it.
///
/// # Errors
/// A missing or malformed token, a count above 2²⁰, flows not sorted by start, or tokens left over.
pub fn parse_flows(text: &str) -> Result<Vec<Ns3Flow>, ScenarioError> {
    let f = "flow.txt";
    let mut it = text.split_whitespace();
    let n: u32 = next(&mut it, f, "flow count")?;
    if n > MAX_ITEMS {
        return Err(ScenarioError(format!("{f}: {n} flows: out of range")));
    }
    let mut flows: Vec<Ns3Flow> = Vec::with_capacity(n as usize);
    for i in 0..n {
        let fl = Ns3Flow {
            src: next(&mut it, f, "flow source")?,
            dst: next(&mut it, f, "flow destination")?,
            pg: next(&mut it, f, "flow priority group")?,
            dport: next(&mut it, f, "flow port")?,
            size: next(&mut it, f, "flow size")?,
            start_s: next(&mut it, f, "flow start")?,
        };
        if !(fl.start_s.is_finite() && fl.start_s >= 0.0) {
            return Err(ScenarioError(format!(
                "{f}: flow {i}: start {}",
                fl.start_s
            )));
        }
        if flows.last().is_some_and(|p| p.start_s > fl.start_s) {
            return Err(ScenarioError(format!(
                "{f}: flow {i} starts before flow {}: third.cc needs them sorted by start",
                i - 1
            )));
        }
        flows.push(fl);
    }
    if let Some(t) = it.next() {
        return Err(ScenarioError(format!(
            "{f}: unexpected `{t}` after the flows"
        )));
    }
    Ok(flows)
}

/// Number of value tokens after a `config.txt` key (`third.cc`): `None` for the rate maps (a count, then that many
/// pairs). Unknown keys are refused.
fn config_arity(key: &str) -> Option<Option<usize>> {
    Some(match key {
        "KMAX_MAP" | "KMIN_MAP" | "PMAX_MAP" => None,
        "LINK_DOWN" => Some(3),
        "ENABLE_QCN"
        | "USE_DYNAMIC_PFC_THRESHOLD"
        | "CLAMP_TARGET_RATE"
        | "PAUSE_TIME"
        | "DATA_RATE"
        | "LINK_DELAY"
        | "PACKET_PAYLOAD_SIZE"
        | "L2_CHUNK_SIZE"
        | "L2_ACK_INTERVAL"
        | "L2_BACK_TO_ZERO"
        | "TOPOLOGY_FILE"
        | "FLOW_FILE"
        | "TRACE_FILE"
        | "TRACE_OUTPUT_FILE"
        | "SIMULATOR_STOP_TIME"
        | "ALPHA_RESUME_INTERVAL"
        | "RP_TIMER"
        | "EWMA_GAIN"
        | "FAST_RECOVERY_TIMES"
        | "RATE_AI"
        | "RATE_HAI"
        | "ERROR_RATE_PER_LINK"
        | "CC_MODE"
        | "RATE_DECREASE_INTERVAL"
        | "MIN_RATE"
        | "FCT_OUTPUT_FILE"
        | "HAS_WIN"
        | "GLOBAL_T"
        | "MI_THRESH"
        | "VAR_WIN"
        | "FAST_REACT"
        | "U_TARGET"
        | "INT_MULTI"
        | "RATE_BOUND"
        | "ACK_HIGH_PRIO"
        | "DCTCP_RATE_AI"
        | "PFC_OUTPUT_FILE"
        | "ENABLE_TRACE"
        | "BUFFER_SIZE"
        | "QLEN_MON_FILE"
        | "QLEN_MON_START"
        | "QLEN_MON_END"
        | "MULTI_RATE"
        | "SAMPLE_FEEDBACK"
        | "PINT_LOG_BASE"
        | "PINT_PROB" => Some(1),
        _ => return None,
    })
}

/// Parses `config.txt` into its keys and value tokens (the keys `third.cc` knows).
///
/// # Errors
/// An unknown key (`third.cc` would skip it and misread what follows), a key without its values, or a map whose
/// count is not a number below 2²⁰.
pub fn parse_config(text: &str) -> Result<Ns3Config, ScenarioError> {
    let f = "config.txt";
    let mut it = text.split_whitespace();
    let mut out = Vec::new();
    while let Some(key) = it.next() {
        let arity =
            config_arity(key).ok_or_else(|| ScenarioError(format!("{f}: unknown key `{key}`")))?;
        let Some(n) = arity else {
            let pairs: u32 = next(&mut it, f, key)?;
            if pairs > MAX_ITEMS {
                return Err(ScenarioError(format!("{f}: {key} {pairs}: out of range")));
            }
            let mut v = vec![pairs.to_string()];
            for _ in 0..2 * pairs {
                v.push(next(&mut it, f, key)?);
            }
            out.push((key.to_owned(), v));
            continue;
        };
        let mut v = Vec::with_capacity(n);
        for _ in 0..n {
            v.push(next(&mut it, f, key)?);
        }
        out.push((key.to_owned(), v));
    }
    Ok(out)
}

/// The single value of `key` in a parsed config.
///
/// # Errors
/// The key is missing or has several values.
pub fn config_value<'a>(cfg: &'a Ns3Config, key: &str) -> Result<&'a str, ScenarioError> {
    match cfg.iter().rev().find(|(k, _)| k == key) {
        Some((_, v)) if v.len() == 1 => Ok(&v[0]),
        _ => Err(ScenarioError(format!(
            "config.txt: no single value for {key}"
        ))),
    }
}

/// The value of a rate map (`KMIN_MAP`, …) for `rate_bps`.
///
/// # Errors
/// The map is missing, malformed, or has no entry for the rate (`third.cc` asserts one per link speed).
pub fn config_map(cfg: &Ns3Config, key: &str, rate_bps: u64) -> Result<f64, ScenarioError> {
    let bad = || {
        ScenarioError(format!(
            "config.txt: {key} has no entry for {rate_bps} bit/s"
        ))
    };
    let (_, v) = cfg.iter().rev().find(|(k, _)| k == key).ok_or_else(bad)?;
    for pair in v[1..].chunks_exact(2) {
        if pair[0].parse::<u64>().ok() == Some(rate_bps) {
            return pair[1].parse().map_err(|_| bad());
        }
    }
    Err(bad())
}

/// Payload bytes a flow of `sc` carries per second at line rate (full PMTU packets: payload over frame + wire
/// overhead, headers of a middle RDMA WRITE packet: Ethernet 14, IPv4 20, UDP 8, BTH 12, ICRC 4).
fn payload_bytes_per_s(sc: &Scenario) -> f64 {
    let mtu = f64::from(sc.host.mtu);
    let wire = mtu + 58.0 + f64::from(sc.link.overhead_bytes);
    sc.link.rate_gbps * 1e9 / 8.0 * mtu / wire
}

/// Bytes an exported backlogged flow writes: what the line rate carries from `start_ms` to `until_ms`, rounded
/// up, at most `u32::MAX` (`third.cc` reads the size as 32 bits).
fn backlog_bytes(sc: &Scenario, start_ms: f64, until_ms: f64) -> u64 {
    let b = (payload_bytes_per_s(sc) * (until_ms - start_ms) / 1e3).ceil();
    (b as u64).clamp(1, u64::from(u32::MAX))
}

impl Ns3Export {
    /// Writes `sc` in the HPCC ns-3 format. The file names inside `config.txt` are `dir` joined with the file names
    /// (run ns-3 from a directory where `dir` resolves, or give an absolute `dir`).
    ///
    /// DCQCN keys (`CC_MODE 1`, `DCQCN.md` §2.4 and §3) per profile:
    ///
    /// | key | `paper` | `ns3_mlx` | `nvidia` |
    /// |---|---|---|---|
    /// | `EWMA_GAIN` | g | g | 1 − `dce_tcp_g`/1024 |
    /// | `ALPHA_RESUME_INTERVAL` (µs) | K | `alpha_tick_us` | `dce_tcp_rtt` |
    /// | `RATE_DECREASE_INTERVAL` (µs) | N (`np_interval_us`; the paper cuts per CNP) | `dec_period_us` | `rate_reduce_monitor_period` |
    /// | `RP_TIMER` (µs) | T | T | `rpg_time_reset` |
    /// | `FAST_RECOVERY_TIMES` | F | F | `rpg_threshold` |
    /// | `RATE_AI`, `RATE_HAI`, `MIN_RATE` | R_AI, R_HAI, R_min | same | `rpg_ai_rate`, `rpg_hai_rate`, `rpg_min_rate` |
    /// | `CLAMP_TARGET_RATE` | `clamp_target_on_cnp` | `clamp_target_always` | `clamp_tgt_rate` |
    ///
    /// The switch: `KMIN_MAP`/`KMAX_MAP` (KB, rounded to whole KB), `PMAX_MAP`, `BUFFER_SIZE` (MiB, rounded up);
    /// `ENABLE_QCN 0` for `profile = "none"`. `SIMULATOR_STOP_TIME` is the duration, `QLEN_MON_START`/`END` the
    /// measurement window (ns). `PACKET_PAYLOAD_SIZE` is the PMTU, `HAS_WIN 0` and `ACK_HIGH_PRIO 1` as HPCC's
    /// `run.py --cc dcqcn` writes them.
    ///
    /// # Errors
    /// An unknown CC profile or parameter (as [`crate::Sim::new`]), or a value the format cannot hold (Kmin or Kmax
    /// above 2³² KB).
    pub fn from_scenario(sc: &Scenario, dir: &Path) -> Result<Ns3Export, ScenarioError> {
        sc.validate()?;
        let mut notes = Vec::new();
        let rate_bps = (sc.link.rate_gbps * 1e9).round() as u64;
        if (rate_bps as f64 - sc.link.rate_gbps * 1e9).abs() > 0.5 {
            notes.push(format!(
                "link rate {} Gb/s rounded to {rate_bps} bit/s",
                sc.link.rate_gbps
            ));
        }
        let delay_ps = (sc.link.delay_us * 1e6).round() as u64;
        let senders = sc.sender_count() as u32;
        let receiver = senders;
        let switch = senders + 1;

        // topology.txt
        let mut topology = format!("{} 1 {}\n{switch}\n", switch + 1, senders + 1);
        for h in 0..=receiver {
            let _ = writeln!(
                topology,
                "{h} {switch} {} {} 0",
                rate_str(rate_bps),
                time_str(delay_ps)
            );
        }

        // flow.txt, sorted by start (stable: equal starts keep the scenario's order).
        let mut order: Vec<usize> = (0..sc.flows.len()).collect();
        order.sort_by(|&a, &b| sc.flows[a].start_ms.total_cmp(&sc.flows[b].start_ms));
        if order.windows(2).any(|w| w[0] > w[1]) {
            notes.push("flows reordered by start time (third.cc reads them in order)".into());
        }
        let mut flow = format!("{}\n", sc.flows.len());
        for &i in &order {
            let f = &sc.flows[i];
            let size = match (f.bytes, f.stop_ms) {
                (Some(b), _) if b > u64::from(u32::MAX) => {
                    notes.push(format!(
                        "flow {i}: {b} bytes cut to {} (a 32-bit size in third.cc)",
                        u32::MAX
                    ));
                    u64::from(u32::MAX)
                }
                (Some(b), _) => b,
                (None, stop) => {
                    let until = stop.unwrap_or(sc.duration_ms);
                    if stop.is_some() {
                        notes.push(format!(
                            "flow {i}: stop_ms {until} becomes a size (the line-rate bytes until then); ns-3 \
                             keeps sending them after that instant if the flow ran below line rate"
                        ));
                    }
                    let b = backlog_bytes(sc, f.start_ms, until);
                    if b == u64::from(u32::MAX) {
                        notes.push(format!(
                            "flow {i}: backlog cut to {} bytes (a 32-bit size in third.cc): it may end early",
                            u32::MAX
                        ));
                    }
                    b
                }
            };
            if !f.ce_at_us.is_empty() {
                notes.push(format!(
                    "flow {i}: forced CE marks (ce_at_us) have no ns-3 counterpart"
                ));
            }
            let _ = writeln!(
                flow,
                "{} {receiver} {FLOW_PG} {FLOW_DPORT} {size} {}",
                f.sender,
                f.start_ms / 1e3
            );
        }

        // config.txt
        let sw = &sc.switch;
        let kb = |b: u64, what: &str, notes: &mut Vec<String>| -> Result<u32, ScenarioError> {
            if !b.is_multiple_of(1000) {
                notes.push(format!(
                    "switch.{what} {b} B rounded to {} KB (ns-3 takes whole KB of 1000 B)",
                    (b + 500) / 1000
                ));
            }
            u32::try_from((b + 500) / 1000)
                .map_err(|_| ScenarioError(format!("switch.{what} {b}: too large for ns-3")))
        };
        let kmin = kb(sw.kmin_bytes, "kmin_bytes", &mut notes)?;
        let kmax = kb(sw.kmax_bytes, "kmax_bytes", &mut notes)?;
        let mib = sw.buffer_bytes.div_ceil(1 << 20).max(1);
        if mib << 20 != sw.buffer_bytes {
            notes.push(format!(
                "switch.buffer_bytes {} rounded up to {mib} MiB (BUFFER_SIZE is whole MiB)",
                sw.buffer_bytes
            ));
        }
        if sw.mark == MarkAt::Enqueue {
            notes.push(
                "marking at enqueue: HPCC ns-3 marks at dequeue on the bytes left behind (SwitchNotifyDequeue)"
                    .into(),
            );
        }
        notes.push(match sw.pfc {
            Some(p) => format!(
                "PFC XOFF {} / XON {} B per ingress: HPCC ns-3 uses its own dynamic thresholds \
                 (USE_DYNAMIC_PFC_THRESHOLD 1) and headroom",
                p.xoff_bytes, p.xon_bytes
            ),
            None => "no PFC: HPCC ns-3 always runs PFC (dynamic thresholds); with a large buffer it rarely pauses"
                .into(),
        });
        let (qcn, cc) = cc_keys(sc, &mut notes)?;
        let d = |name: &str| dir.join(name).display().to_string();
        let window_ns = |ms: f64| (ms * 1e6).round() as u64;
        let mut config = String::new();
        let mut kv = |k: &str, v: String| {
            let _ = writeln!(config, "{k} {v}");
        };
        kv("ENABLE_QCN", qcn.to_string());
        kv("USE_DYNAMIC_PFC_THRESHOLD", "1".into());
        kv("PACKET_PAYLOAD_SIZE", sc.host.mtu.to_string());
        kv("TOPOLOGY_FILE", d("topology.txt"));
        kv("FLOW_FILE", d("flow.txt"));
        kv("TRACE_FILE", d("trace.txt"));
        kv("TRACE_OUTPUT_FILE", d("mix.tr"));
        kv("FCT_OUTPUT_FILE", d("fct.txt"));
        kv("PFC_OUTPUT_FILE", d("pfc.txt"));
        kv("SIMULATOR_STOP_TIME", format!("{}", sc.duration_ms / 1e3));
        kv("CC_MODE", "1".into());
        for (k, v) in cc {
            kv(k, v);
        }
        kv("DCTCP_RATE_AI", "1000Mb/s".into());
        kv("ERROR_RATE_PER_LINK", "0".into());
        kv("L2_CHUNK_SIZE", "4000".into());
        kv("L2_ACK_INTERVAL", "1".into());
        kv("L2_BACK_TO_ZERO", "0".into());
        kv("HAS_WIN", "0".into());
        kv("GLOBAL_T", "1".into());
        kv("VAR_WIN", "0".into());
        kv("FAST_REACT", "0".into());
        kv("U_TARGET", "0.95".into());
        kv("MI_THRESH", "0".into());
        kv("INT_MULTI", "1".into());
        kv("MULTI_RATE", "0".into());
        kv("SAMPLE_FEEDBACK", "0".into());
        kv("PINT_LOG_BASE", "1.05".into());
        kv("PINT_PROB", "1.0".into());
        kv("RATE_BOUND", "1".into());
        kv("ACK_HIGH_PRIO", "1".into());
        kv("LINK_DOWN", "0 0 0".into());
        kv("ENABLE_TRACE", "0".into());
        kv("KMAX_MAP", format!("1 {rate_bps} {kmax}"));
        kv("KMIN_MAP", format!("1 {rate_bps} {kmin}"));
        kv("PMAX_MAP", format!("1 {rate_bps} {}", sw.pmax));
        kv("BUFFER_SIZE", mib.to_string());
        kv("QLEN_MON_FILE", d("qlen.txt"));
        kv("QLEN_MON_START", window_ns(sc.measure_from_ms).to_string());
        kv("QLEN_MON_END", window_ns(sc.duration_ms).to_string());

        notes.push(format!(
            "frames: ns-3 sends PACKET_PAYLOAD_SIZE {} B payloads with its own headers, not RoCE v2 frames \
             (Ethernet, IPv4, UDP, BTH, RETH, ICRC; {} B wire overhead)",
            sc.host.mtu, sc.link.overhead_bytes
        ));
        notes.push(
            "the NP: ns-3 acknowledges every packet and flags the ACK (no CNP packet, no N-µs spacing, no strict CNP \
             queue beyond ACK_HIGH_PRIO)"
                .into(),
        );
        notes.push(format!(
            "seed {}: ns-3 draws from its own generator; the WR structure (message_bytes {}, wr_depth {}, \
             max_unacked_psns {}) has no counterpart",
            sc.seed, sc.host.message_bytes, sc.host.wr_depth, sc.host.max_unacked_psns
        ));
        Ok(Ns3Export {
            topology,
            flow,
            config,
            trace: format!("1\n{switch}\n"),
            notes,
        })
    }

    /// Writes `topology.txt`, `flow.txt`, `config.txt`, `trace.txt` and `NOTES.txt` (what did not carry over) into
    /// `dir`, creating it.
    ///
    /// # Errors
    /// I/O, with the path.
    pub fn write(&self, dir: &Path) -> Result<(), ScenarioError> {
        std::fs::create_dir_all(dir)
            .map_err(|e| ScenarioError(format!("{}: {e}", dir.display())))?;
        let mut notes = String::new();
        for n in &self.notes {
            let _ = writeln!(notes, "- {n}");
        }
        for (name, text) in [
            ("topology.txt", &self.topology),
            ("flow.txt", &self.flow),
            ("config.txt", &self.config),
            ("trace.txt", &self.trace),
            ("NOTES.txt", &notes),
        ] {
            let p = dir.join(name);
            std::fs::write(&p, text).map_err(|e| ScenarioError(format!("{}: {e}", p.display())))?;
        }
        Ok(())
    }
}

/// `config.txt` keys with their values.
type CcKeys = Vec<(&'static str, String)>;

/// `ENABLE_QCN` and the DCQCN keys of `sc.cc` (see [`Ns3Export::from_scenario`]), with notes on what does not map.
fn cc_keys(sc: &Scenario, notes: &mut Vec<String>) -> Result<(u32, CcKeys), ScenarioError> {
    let rate_bps = sc.link.rate_gbps * 1e9;
    let profile = match sc.cc.profile.as_str() {
        "none" => {
            notes.push(
                "cc.profile none: ENABLE_QCN 0 (no marking), DCQCN keys at the paper defaults"
                    .into(),
            );
            None
        }
        p => Some(Profile::from_name(p).ok_or_else(|| {
            ScenarioError(format!(
                "cc.profile `{p}`: expected paper, ns3_mlx, nvidia or none"
            ))
        })?),
    };
    let mut c = DcqcnConfig::new(profile.unwrap_or(Profile::Paper), rate_bps);
    for (k, v) in &sc.cc.set {
        c.set(k, v)
            .map_err(|e| ScenarioError(format!("cc.set: {e}")))?;
    }
    let mbps = |bps: f64| rate_str(bps.round() as u64);
    let b = |v: bool| u32::from(v).to_string();
    let keys = match &c {
        DcqcnConfig::Paper(p) => {
            notes.push(format!(
                "paper profile on CC_MODE 1: the cut comes at the next RATE_DECREASE_INTERVAL ({} µs = N) check, not \
                 at the CNP; α is updated every ALPHA_RESUME_INTERVAL with or without CNPs (the paper only decays \
                 without); the byte counter B = {} B and the i·R_HAI hyper step (constant in ns-3) do not carry over",
                sc.cc.np_interval_us, p.b_bytes
            ));
            if p.alpha_init != 1.0 {
                notes.push(format!(
                    "alpha_init {}: ns-3 sets α = 1 at the first CNP",
                    p.alpha_init
                ));
            }
            vec![
                ("ALPHA_RESUME_INTERVAL", format!("{}", p.k_us)),
                (
                    "RATE_DECREASE_INTERVAL",
                    format!("{}", sc.cc.np_interval_us),
                ),
                ("CLAMP_TARGET_RATE", b(p.clamp_target_on_cnp)),
                ("RP_TIMER", format!("{}", p.t_us)),
                ("EWMA_GAIN", format!("{}", p.g)),
                ("FAST_RECOVERY_TIMES", p.f.to_string()),
                ("RATE_AI", mbps(p.r_ai_bps)),
                ("RATE_HAI", mbps(p.r_hai_bps)),
                ("MIN_RATE", mbps(p.min_rate_bps)),
            ]
        }
        DcqcnConfig::Ns3Mlx(p) => {
            if p.alpha_init != 1.0 || p.rate_on_first_cnp != 1.0 {
                notes.push(format!(
                    "alpha_init {} / rate_on_first_cnp {}: RdmaHw attributes, not config.txt keys (ns-3 defaults 1, 1)",
                    p.alpha_init, p.rate_on_first_cnp
                ));
            }
            vec![
                ("ALPHA_RESUME_INTERVAL", format!("{}", p.alpha_tick_us)),
                ("RATE_DECREASE_INTERVAL", format!("{}", p.dec_period_us)),
                ("CLAMP_TARGET_RATE", b(p.clamp_target_always)),
                ("RP_TIMER", format!("{}", p.t_us)),
                ("EWMA_GAIN", format!("{}", p.g)),
                ("FAST_RECOVERY_TIMES", p.f.to_string()),
                ("RATE_AI", mbps(p.r_ai_bps)),
                ("RATE_HAI", mbps(p.r_hai_bps)),
                ("MIN_RATE", mbps(p.min_rate_bps)),
            ]
        }
        DcqcnConfig::Nvidia(p) => {
            notes.push(format!(
                "nvidia profile on CC_MODE 1: rpg_byte_reset {}, rpg_min_dec_fac {}, rpg_gd {}, \
                 rate_to_set_on_first_cnp {}, initial_alpha_value {}, rpg_max_rate {} and \
                 clamp_tgt_rate_after_time_inc {} do not carry over",
                p.rpg_byte_reset,
                p.rpg_min_dec_fac,
                p.rpg_gd,
                p.rate_to_set_on_first_cnp,
                p.initial_alpha_value,
                p.rpg_max_rate,
                p.clamp_tgt_rate_after_time_inc
            ));
            vec![
                ("ALPHA_RESUME_INTERVAL", p.dce_tcp_rtt.to_string()),
                (
                    "RATE_DECREASE_INTERVAL",
                    p.rate_reduce_monitor_period.to_string(),
                ),
                ("CLAMP_TARGET_RATE", b(p.clamp_tgt_rate)),
                ("RP_TIMER", p.rpg_time_reset.to_string()),
                (
                    "EWMA_GAIN",
                    format!("{}", 1.0 - p.dce_tcp_g as f64 / 1024.0),
                ),
                ("FAST_RECOVERY_TIMES", p.rpg_threshold.to_string()),
                ("RATE_AI", format!("{}Mbps", p.rpg_ai_rate)),
                ("RATE_HAI", format!("{}Mbps", p.rpg_hai_rate)),
                ("MIN_RATE", format!("{}Mbps", p.rpg_min_rate)),
            ]
        }
    };
    Ok((u32::from(profile.is_some()), keys))
}

/// Reads an export back into the scenario it describes (the round trip of `--export-ns3`): the star topology
/// (senders, link rate and delay), the switch's ECN ramp and buffer, the duration and measurement window, and the
/// flows (a flow whose size is at least the line-rate bytes from its start to the end is backlogged). Host and CC
/// settings are left at their defaults: compare those through [`config_value`].
///
/// # Errors
/// A file that does not parse, or a topology other than hosts `0..=N` each linked to one switch at one rate and
/// delay, or flows to another host than the receiver.
pub fn import(topology: &str, flow: &str, config: &str) -> Result<Scenario, ScenarioError> {
    let t = parse_topology(topology)?;
    let flows = parse_flows(flow)?;
    let cfg = parse_config(config)?;
    let bad = |m: String| Err(ScenarioError(m));
    if t.switches.len() != 1 || t.nodes < 3 || t.switches[0] != t.nodes - 1 {
        return bad(format!(
            "topology: expected hosts 0..{} and one switch {}, got switches {:?}",
            t.nodes.saturating_sub(2),
            t.nodes.saturating_sub(1),
            t.switches
        ));
    }
    let sw = t.switches[0];
    let receiver = sw - 1;
    let first = t
        .links
        .first()
        .ok_or_else(|| ScenarioError("topology: no links".into()))?;
    let mut seen = vec![false; sw as usize];
    for l in &t.links {
        if l.dst != sw || l.src >= sw || seen[l.src as usize] {
            return bad(format!(
                "topology: link {}–{} is not host–switch",
                l.src, l.dst
            ));
        }
        seen[l.src as usize] = true;
        if (l.rate_bps, l.delay_ps) != (first.rate_bps, first.delay_ps) {
            return bad("topology: links of different rates or delays".into());
        }
    }
    if seen.contains(&false) {
        return bad("topology: a host without a link".into());
    }
    let num = |k: &str| -> Result<f64, ScenarioError> {
        config_value(&cfg, k)?
            .parse()
            .map_err(|_| ScenarioError(format!("config.txt: {k} is not a number")))
    };
    let duration_ms = (num("SIMULATOR_STOP_TIME")? * 1e9).round() / 1e6;
    let measure_from_ms = num("QLEN_MON_START")? / 1e6;
    let mut sc = Scenario {
        name: "ns3_import".into(),
        description: String::new(),
        seed: 1,
        duration_ms,
        measure_from_ms,
        bin_ms: 1.0,
        senders: Some(receiver as usize),
        link: crate::scenario::LinkSpec {
            rate_gbps: first.rate_bps as f64 / 1e9,
            delay_us: first.delay_ps as f64 / 1e6,
            overhead_bytes: crate::scenario::LinkSpec::default().overhead_bytes,
        },
        switch: crate::scenario::SwitchSpec {
            buffer_bytes: num("BUFFER_SIZE")? as u64 * (1 << 20),
            kmin_bytes: config_map(&cfg, "KMIN_MAP", first.rate_bps)? as u64 * 1000,
            kmax_bytes: config_map(&cfg, "KMAX_MAP", first.rate_bps)? as u64 * 1000,
            pmax: config_map(&cfg, "PMAX_MAP", first.rate_bps)?,
            mark: MarkAt::Dequeue,
            pfc: None,
        },
        rc_sample_us: None,
        host: crate::scenario::HostSpec {
            mtu: num("PACKET_PAYLOAD_SIZE")? as u32,
            ..crate::scenario::HostSpec::default()
        },
        cc: crate::scenario::CcSpec::default(),
        flows: Vec::with_capacity(flows.len()),
    };
    for (i, f) in flows.iter().enumerate() {
        if f.dst != receiver || f.src >= receiver {
            return bad(format!(
                "flow {i}: {} → {}: expected a sender → the receiver {receiver}",
                f.src, f.dst
            ));
        }
        // To the nanosecond: seconds in decimal text do not multiply back exactly.
        let start_ms = (f.start_s * 1e9).round() / 1e6;
        let size = u64::from(f.size);
        let backlogged = size >= backlog_bytes(&sc, start_ms, duration_ms);
        sc.flows.push(FlowSpec {
            sender: f.src as usize,
            start_ms,
            stop_ms: None,
            bytes: (!backlogged).then_some(size),
            ce_at_us: Vec::new(),
        });
    }
    sc.validate()?;
    Ok(sc)
}

/// The parts of a scenario an export carries: senders, link rate and delay, the ECN ramp, duration, measurement
/// window, MTU and the flows (sender, start, size or backlogged), flows sorted by start — for comparing a scenario
/// with its [`import`]ed export.
pub fn carried(sc: &Scenario) -> String {
    let mut flows: Vec<&FlowSpec> = sc.flows.iter().collect();
    flows.sort_by(|a, b| a.start_ms.total_cmp(&b.start_ms));
    let mut s = format!(
        "senders {} link {} Gb/s {} us ramp {} {} {} duration {} ms from {} ms mtu {}\n",
        sc.sender_count(),
        sc.link.rate_gbps,
        sc.link.delay_us,
        sc.switch.kmin_bytes,
        sc.switch.kmax_bytes,
        sc.switch.pmax,
        sc.duration_ms,
        sc.measure_from_ms,
        sc.host.mtu
    );
    for f in flows {
        let _ = writeln!(
            s,
            "flow {} start {} ms bytes {:?}",
            f.sender, f.start_ms, f.bytes
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_and_times_format_and_parse_back() {
        for bps in [40_000_000_000, 100_000_000, 25_500_000_000, 1234] {
            assert_eq!(parse_rate(&rate_str(bps)).unwrap(), bps);
        }
        for ps in [1_000_000, 1500, 0] {
            assert_eq!(parse_time(&time_str(ps)).unwrap(), ps);
        }
        assert_eq!(parse_rate("50Mb/s").unwrap(), 50_000_000);
        assert_eq!(parse_time("0.001ms").unwrap(), 1_000_000);
        assert!(parse_rate("40GB/s").is_err());
        assert!(parse_time("1").is_err());
    }

    #[test]
    fn malformed_files_are_errors_not_panics() {
        for t in [
            "",
            "3 1",
            "3 1 1 2 0 2 40Gbps",
            "3 5 0",
            "4000000000 1 1",
            "3 1 1 7 0 1 40Gbps 1ns 0",
        ] {
            assert!(parse_topology(t).is_err(), "{t:?}");
        }
        for f in [
            "",
            "1 0 1 3 100 5",
            "2 0 1 3 100 5 0.1 0 1 3 100 5 0.0",
            "1 0 1 3 100 -5 0",
        ] {
            assert!(parse_flows(f).is_err(), "{f:?}");
        }
        for c in [
            "NOPE 1",
            "CC_MODE",
            "KMIN_MAP 2 40000000000 5",
            "KMIN_MAP 99999999999",
        ] {
            assert!(parse_config(c).is_err(), "{c:?}");
        }
    }
}
