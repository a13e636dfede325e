//! Scenarios as data: one TOML (or JSON) document describes a whole run — the N senders → switch → 1 receiver
//! topology, link rates and delays, the switch's buffer and ECN ramp, the DCQCN profile and its parameters, the
//! flows, the seed and the duration (`docs/spec/DCQCN.md` §6 "common setup"; issue #20).
//!
//! ```toml
//! name = "e3_two_flows"
//! seed = 1
//! duration_ms = 60.0
//! measure_from_ms = 20.0
//! [link]                # every link: sender NICs, switch egress ports
//! rate_gbps = 40.0
//! delay_us = 1.0
//! [switch]
//! buffer_bytes = 4000000
//! kmin_bytes = 5000
//! kmax_bytes = 200000
//! pmax = 0.01
//! mark = "enqueue"      # or "dequeue"
//! [cc]
//! profile = "paper"     # paper | ns3_mlx | nvidia | none
//! np_interval_us = 50.0
//! set = { T_us = "55" } # the profile's parameter names (`rocev2 cc trace --list-params`)
//! [[flow]]
//! sender = 0
//! [[flow]]
//! sender = 1
//! start_ms = 0.0
//! ```
//!
//! Unknown keys are errors (a misspelt key must not silently fall back to a default).

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

/// A whole simulation run. Times are in the unit their name says (`_ms`, `_us`); sizes in bytes; rates in Gb/s
/// (10⁹ bit/s).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// Name used in reports and file names.
    pub name: String,
    /// Free text: what the scenario reproduces and how it was scaled.
    #[serde(default)]
    pub description: String,
    /// Seed of every random draw (switch marking, engine seeds, initial PSNs).
    #[serde(default = "default_seed")]
    pub seed: u64,
    /// Simulated time to run, ms.
    pub duration_ms: f64,
    /// Start of the measurement window for throughput, fairness and queue statistics, ms.
    #[serde(default)]
    pub measure_from_ms: f64,
    /// Width of the time-series bins (CSV, per-bin throughput and Jain), ms. DCQCN.md §6 measures in 1-ms bins.
    #[serde(default = "default_bin")]
    pub bin_ms: f64,
    /// Number of sender hosts (hosts `0..senders`); the receiver is host `senders`. Default: the largest
    /// `flow.sender` + 1.
    #[serde(default)]
    pub senders: Option<usize>,
    /// Every link (sender NIC → switch, switch egress → host).
    #[serde(default)]
    pub link: LinkSpec,
    /// The switch.
    #[serde(default)]
    pub switch: SwitchSpec,
    /// Sample every flow's RC (the sender QP's DCQCN rate) every this many µs into `Recorder::rc_samples`
    /// (for comparisons with the oracle's `samples_us_rc_bps`); `None` = only at bin ends.
    #[serde(default)]
    pub rc_sample_us: Option<f64>,
    /// Host (NIC and verbs) settings.
    #[serde(default)]
    pub host: HostSpec,
    /// Congestion control.
    #[serde(default)]
    pub cc: CcSpec,
    /// The flows: one RC QP pair each, sender host → receiver.
    #[serde(rename = "flow")]
    pub flows: Vec<FlowSpec>,
}

fn default_seed() -> u64 {
    1
}
fn default_bin() -> f64 {
    1.0
}

/// A link: rate and one-way propagation delay. A frame occupies the link for (frame + `overhead_bytes`)·8 / rate.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LinkSpec {
    /// Line rate C, Gb/s.
    pub rate_gbps: f64,
    /// Propagation delay, µs.
    pub delay_us: f64,
    /// Bytes a frame occupies on the wire beyond the frame the engine builds: preamble + SFD 8, FCS 4, inter-frame
    /// gap 12 = 24 (IEEE 802.3).
    #[serde(default = "default_overhead")]
    pub overhead_bytes: u32,
}

fn default_overhead() -> u32 {
    24
}

impl Default for LinkSpec {
    fn default() -> Self {
        LinkSpec {
            rate_gbps: 40.0,
            delay_us: 1.0,
            overhead_bytes: 24,
        }
    }
}

/// Where the switch decides a CE mark (`DCQCN.md` §2.1).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MarkAt {
    /// On the arriving packet, with the queue it finds (paper, DCTCP style).
    #[default]
    Enqueue,
    /// On the departing packet, with the bytes left behind it (HPCC ns-3 `SwitchNotifyDequeue`).
    Dequeue,
}

/// The shared-buffer switch: one FIFO per egress port for data (ECN ramp, tail drop) plus a strict-priority queue
/// for CNPs (DSCP `cnp_dscp`), never marked (`DCQCN.md` §2.1: ns-3 never marks queue 0).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SwitchSpec {
    /// Shared buffer over all egress queues, bytes; a frame that does not fit is dropped (tail drop).
    pub buffer_bytes: u64,
    /// ECN ramp start (no mark at or below), bytes.
    pub kmin_bytes: u64,
    /// ECN ramp end (mark every ECN-capable packet above), bytes.
    pub kmax_bytes: u64,
    /// Marking probability at Kmax.
    pub pmax: f64,
    /// Enqueue or dequeue marking.
    #[serde(default)]
    pub mark: MarkAt,
    /// PFC pause towards the senders (optional; `None` = lossless only as far as the buffer goes).
    #[serde(default)]
    pub pfc: Option<PfcSpec>,
}

/// Priority flow control, simplified (IEEE 802.1Qbb with one lossless class; every frame a sender sends is data):
/// when the bytes the switch holds from one ingress port exceed `xoff_bytes` it pauses that port's sender, and
/// resumes it once they fall below `xon_bytes`. A pause or resume takes effect at the sender one propagation delay
/// later (the 64-byte PAUSE frame's own serialisation is not modelled); a paused sender finishes the frame it is
/// serialising and then sends nothing.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PfcSpec {
    /// Pause above this many bytes buffered from one ingress port.
    pub xoff_bytes: u64,
    /// Resume below this many.
    pub xon_bytes: u64,
}

impl Default for SwitchSpec {
    fn default() -> Self {
        SwitchSpec {
            buffer_bytes: 4_000_000,
            kmin_bytes: 5_000,
            kmax_bytes: 200_000,
            pmax: 0.01,
            mark: MarkAt::Enqueue,
            pfc: None,
        }
    }
}

/// Host (engine) settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostSpec {
    /// Path MTU of every QP, bytes (256, 512, 1024, 2048 or 4096).
    pub mtu: u32,
    /// Size of each RDMA WRITE WR a flow posts, bytes.
    pub message_bytes: u32,
    /// WRs a flow keeps posted at once.
    pub wr_depth: u32,
    /// Maximum unacknowledged PSNs per QP (the engine's window, `EngineConfig::max_unacked_psns`).
    pub max_unacked_psns: u32,
}

impl Default for HostSpec {
    fn default() -> Self {
        HostSpec {
            mtu: 1024,
            message_bytes: 65_536,
            wr_depth: 8,
            max_unacked_psns: 1024,
        }
    }
}

/// Congestion control of every QP.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CcSpec {
    /// `paper`, `ns3_mlx`, `nvidia` (`roce_proto::cc::Profile`) or `none` (line rate, CNPs ignored).
    pub profile: String,
    /// Notification point window N between two CNPs of one QP, µs (`EngineConfig::cnp_interval`).
    pub np_interval_us: f64,
    /// Parameter overrides by the profile's names (`DcqcnConfig::set`).
    #[serde(default)]
    pub set: BTreeMap<String, String>,
}

impl Default for CcSpec {
    fn default() -> Self {
        CcSpec {
            profile: "paper".into(),
            np_interval_us: 50.0,
            set: BTreeMap::new(),
        }
    }
}

/// One flow: an RC QP on `sender` connected to a QP on the receiver; the sender keeps RDMA WRITEs posted.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FlowSpec {
    /// Sender host index.
    pub sender: usize,
    /// First WR posted at, ms.
    #[serde(default)]
    pub start_ms: f64,
    /// No WR posted from this instant on (backlogged flows stop here), ms.
    #[serde(default)]
    pub stop_ms: Option<f64>,
    /// Bytes to send; `None` = backlogged until `stop_ms` or the end.
    #[serde(default)]
    pub bytes: Option<u64>,
    /// Impulses: at each instant (µs) the switch CE-marks the flow's next ECN-capable data packet whatever the
    /// queue, so the receiver's NP answers with one real CNP (`DCQCN.md` §6 E2, the impulse response of the RP).
    #[serde(default)]
    pub ce_at_us: Vec<f64>,
}

/// A scenario that cannot run, with the reason.
#[derive(Debug)]
pub struct ScenarioError(pub String);

impl std::fmt::Display for ScenarioError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ScenarioError {}

/// Largest scenario file read (a scenario is a few kilobytes; `/dev/zero` must not be read whole).
pub const MAX_FILE_BYTES: u64 = 1 << 20;
/// Most sender hosts (the issue's largest study is 1,024 flows).
pub const MAX_SENDERS: usize = 1024;
/// Most flows.
pub const MAX_FLOWS: usize = 4096;
/// Most time bins or rate samples a run records (each costs memory per flow).
pub const MAX_SAMPLES: f64 = 1e6;
/// Most bytes of message buffers (message_bytes × wr_depth per flow, summed over the flows).
pub const MAX_BUFFER_BYTES: u64 = 4 << 30;

impl Scenario {
    /// Reads a scenario file: `.json` as JSON, anything else as TOML.
    ///
    /// # Errors
    /// I/O, syntax, unknown keys, or an invalid value ([`Scenario::validate`]).
    pub fn load(path: &Path) -> Result<Scenario, ScenarioError> {
        use std::io::Read as _;
        let io = |e: std::io::Error| ScenarioError(format!("{}: {e}", path.display()));
        let mut text = String::new();
        std::fs::File::open(path)
            .map_err(io)?
            .take(MAX_FILE_BYTES + 1)
            .read_to_string(&mut text)
            .map_err(io)?;
        if text.len() as u64 > MAX_FILE_BYTES {
            return Err(ScenarioError(format!(
                "{}: longer than {MAX_FILE_BYTES} bytes: not a scenario",
                path.display()
            )));
        }
        let s = if path.extension().is_some_and(|e| e == "json") {
            Scenario::from_json(&text)
        } else {
            Scenario::from_toml(&text)
        };
        s.map_err(|e| ScenarioError(format!("{}: {e}", path.display())))
    }

    /// Parses and validates TOML.
    ///
    /// # Errors
    /// Syntax, unknown keys, invalid values.
    pub fn from_toml(text: &str) -> Result<Scenario, ScenarioError> {
        let s: Scenario = toml::from_str(text).map_err(|e| ScenarioError(e.to_string()))?;
        s.validate()?;
        Ok(s)
    }

    /// Parses and validates JSON.
    ///
    /// # Errors
    /// Syntax, unknown keys, invalid values.
    pub fn from_json(text: &str) -> Result<Scenario, ScenarioError> {
        let s: Scenario = serde_json::from_str(text).map_err(|e| ScenarioError(e.to_string()))?;
        s.validate()?;
        Ok(s)
    }

    /// An N:1 incast with `DCQCN.md` §6's common setup (the shipped E5 and E8 at other N): `n` backlogged senders
    /// from 0 → one switch (4 MB buffer, ECN ramp 5 KB / 200 KB / 1 %, enqueue marking, no PFC) → one receiver,
    /// 40 Gb/s and 1 µs per link, the paper profile with N = 50 µs, seed 1, run `duration_ms` and measured from its
    /// first third. Used by the speed benchmark (`benches/speed.rs`).
    ///
    /// # Errors
    /// `n` is 0 or above [`MAX_SENDERS`], or `duration_ms` is not > 0.
    pub fn incast(n: usize, duration_ms: f64) -> Result<Scenario, ScenarioError> {
        let s = Scenario {
            name: format!("incast_{n}"),
            description: format!("{n}:1 incast, DCQCN.md §6 common setup, {duration_ms} ms"),
            seed: 1,
            duration_ms,
            measure_from_ms: duration_ms / 3.0,
            bin_ms: 1.0,
            senders: Some(n),
            link: LinkSpec::default(),
            switch: SwitchSpec::default(),
            rc_sample_us: None,
            host: HostSpec::default(),
            cc: CcSpec::default(),
            flows: (0..n)
                .map(|sender| FlowSpec {
                    sender,
                    start_ms: 0.0,
                    stop_ms: None,
                    bytes: None,
                    ce_at_us: Vec::new(),
                })
                .collect(),
        };
        s.validate()?;
        Ok(s)
    }

    /// Number of sender hosts.
    pub fn sender_count(&self) -> usize {
        self.senders
            .unwrap_or_else(|| self.flows.iter().map(|f| f.sender + 1).max().unwrap_or(0))
    }

    /// Checks ranges: positive finite rates and durations, Kmin ≤ Kmax, Pmax in [0, 1], a supported MTU, flows on
    /// existing senders with start < stop.
    ///
    /// # Errors
    /// The first problem found, naming the key.
    pub fn validate(&self) -> Result<(), ScenarioError> {
        let bad = |m: String| Err(ScenarioError(m));
        let pos = |v: f64| v.is_finite() && v > 0.0;
        if !pos(self.duration_ms) {
            return bad(format!("duration_ms {}: expected > 0", self.duration_ms));
        }
        if !(self.measure_from_ms.is_finite()
            && (0.0..self.duration_ms).contains(&self.measure_from_ms))
        {
            return bad(format!(
                "measure_from_ms {}: expected 0 ≤ x < duration_ms",
                self.measure_from_ms
            ));
        }
        if self.rc_sample_us.is_some_and(|v| !pos(v)) {
            return bad("rc_sample_us: expected > 0".into());
        }
        if let Some(v) = self.rc_sample_us
            && self.duration_ms * 1e3 / v > MAX_SAMPLES
        {
            return bad(format!(
                "rc_sample_us {v}: more than {MAX_SAMPLES} samples over duration_ms"
            ));
        }
        if !pos(self.bin_ms) {
            return bad(format!("bin_ms {}: expected > 0", self.bin_ms));
        }
        if self.duration_ms / self.bin_ms > MAX_SAMPLES {
            return bad(format!(
                "bin_ms {}: more than {MAX_SAMPLES} bins over duration_ms",
                self.bin_ms
            ));
        }
        if !pos(self.link.rate_gbps) || self.link.rate_gbps > 10_000.0 {
            return bad(format!(
                "link.rate_gbps {}: expected 0 < x ≤ 10000",
                self.link.rate_gbps
            ));
        }
        if !(self.link.delay_us.is_finite() && self.link.delay_us >= 0.0) {
            return bad(format!(
                "link.delay_us {}: expected ≥ 0",
                self.link.delay_us
            ));
        }
        let sw = &self.switch;
        if sw.kmin_bytes > sw.kmax_bytes {
            return bad(format!(
                "switch.kmin_bytes {} > kmax_bytes {}",
                sw.kmin_bytes, sw.kmax_bytes
            ));
        }
        if let Some(p) = sw.pfc
            && (p.xon_bytes > p.xoff_bytes || p.xoff_bytes >= sw.buffer_bytes)
        {
            return bad(format!(
                "switch.pfc: expected xon_bytes {} ≤ xoff_bytes {} < buffer_bytes {}",
                p.xon_bytes, p.xoff_bytes, sw.buffer_bytes
            ));
        }
        if !(0.0..=1.0).contains(&sw.pmax) {
            return bad(format!("switch.pmax {}: expected 0 ≤ x ≤ 1", sw.pmax));
        }
        if !matches!(self.host.mtu, 256 | 512 | 1024 | 2048 | 4096) {
            return bad(format!(
                "host.mtu {}: expected 256, 512, 1024, 2048 or 4096",
                self.host.mtu
            ));
        }
        if self.host.message_bytes == 0 || self.host.wr_depth == 0 {
            return bad("host.message_bytes and host.wr_depth must be > 0".into());
        }
        if !(self.cc.np_interval_us.is_finite() && self.cc.np_interval_us >= 0.0) {
            return bad(format!(
                "cc.np_interval_us {}: expected ≥ 0",
                self.cc.np_interval_us
            ));
        }
        if self.flows.is_empty() {
            return bad("no [[flow]]".into());
        }
        if self.flows.len() > MAX_FLOWS {
            return bad(format!("{} flows: at most {MAX_FLOWS}", self.flows.len()));
        }
        let n = self.sender_count();
        if n > MAX_SENDERS {
            return bad(format!("senders {n}: at most {MAX_SENDERS}"));
        }
        let per_flow =
            u64::from(self.host.message_bytes).saturating_mul(u64::from(self.host.wr_depth));
        if per_flow.saturating_mul(self.flows.len() as u64) > MAX_BUFFER_BYTES {
            return bad(format!(
                "host.message_bytes × host.wr_depth × flows: more than {MAX_BUFFER_BYTES} bytes of buffers"
            ));
        }
        for (i, f) in self.flows.iter().enumerate() {
            if f.sender >= n {
                return bad(format!("flow {i}: sender {} ≥ senders {n}", f.sender));
            }
            if !(f.start_ms.is_finite() && f.start_ms >= 0.0) {
                return bad(format!("flow {i}: start_ms {}: expected ≥ 0", f.start_ms));
            }
            if let Some(s) = f.stop_ms
                && !(s.is_finite() && s > f.start_ms)
            {
                return bad(format!("flow {i}: stop_ms {s}: expected > start_ms"));
            }
            if f.ce_at_us.iter().any(|t| !(t.is_finite() && *t >= 0.0)) {
                return bad(format!("flow {i}: ce_at_us: expected times ≥ 0"));
            }
            if f.bytes == Some(0) {
                return bad(format!("flow {i}: bytes 0"));
            }
        }
        Ok(())
    }
}
