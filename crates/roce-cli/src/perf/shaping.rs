//! The scheduler flags of `rocev2 perf` (issue #12): a per-QP rate limit and bucket depth, the QPs' traffic class
//! and the classes' ETS weights, in our own units and in perftest's.
//!
//! They configure the engine's send scheduler (`roce_proto::sched`, `docs/spec/DCQCN.md §7, §9`) through
//! [`SchedConfig`] when this side opens its device, so they act on this side's QPs only: on the client for
//! `write-bw`/`send-bw`, on the server for `read-bw` (the READ responder sends the data). With `--loopback` both
//! sides take them.
//!
//! * `--rate-limit GBPS`: every QP's rate in Gb/s **on the wire** — whole frames, Ethernet header to ICRC, what the
//!   engine's shaper, DCQCN and the `sent_bytes`/`rcvd_bytes` counters count. The data rate perf reports is lower by
//!   the header share (≈ 5 % at PMTU 1024, ≈ 1.4 % at 4096).
//! * `--rate_limit R --rate_units g|M|p` (perftest, `perftest_parameters.c`): the *message* rate perftest's rate
//!   limiter means — `g` Gb/s of payload (10⁹ bit), `M` MiB/s of payload, `p` messages per second (perftest calls
//!   them pps; default `g`). Converted to a wire rate with the run's message size, path MTU and the test's header
//!   layout, so perf's reported bandwidth comes out at R. Bandwidth tests except atomics, one size (not `-a`), as
//!   perftest's software limiter.
//! * `--burst BYTES`: every QP's token-bucket depth (default 1.5 · BDP, `SchedConfig`); perftest's `--burst_size N`
//!   (messages, only with `--rate_limit`) is N messages' worth of wire bytes.
//! * `--tc N`: the traffic class (0..=7) of this side's QPs; `--tc-weights W0,W1,..`: ETS weights of classes 0, 1, ..
//!   (default all 1).

use std::net::IpAddr;

use clap::{Args, ValueEnum};
use roce_proto::{SchedConfig, TcConfig};

use super::{Conn, LinkKind, Params, PerfArgs, Test};

/// perftest's `--rate_units`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum RateUnits {
    /// Gb/s of message payload (perftest `g`, the default).
    #[default]
    #[value(name = "g")]
    Gbps,
    /// MiB/s of message payload (perftest `M`).
    #[value(name = "M")]
    MiBps,
    /// Messages per second (perftest `p`, "pps").
    #[value(name = "p")]
    Pps,
}

/// Scheduler flags (see the module docs).
#[derive(Clone, Debug, Default, Args)]
pub struct SchedArgs {
    /// Rate limit of every QP of this side, in Gb/s on the wire (whole frames, Ethernet header to ICRC). Not the
    /// same as perftest's --rate_limit (underscore), which limits the message payload rate in --rate_units.
    #[arg(long = "rate-limit", value_name = "GBPS")]
    pub rate_limit: Option<f64>,
    /// Token-bucket depth of every QP of this side in bytes (default 1.5 × BDP: 187,500 at 100 Gb/s × 10 µs; at least
    /// one frame).
    #[arg(long = "burst", value_name = "BYTES")]
    pub burst: Option<u64>,
    /// Traffic class (0..=7) of this side's QPs for the engine's scheduler (the DSCP on the wire is not changed).
    #[arg(long = "tc", value_name = "N", value_parser = clap::value_parser!(u8).range(0..=7))]
    pub tc: Option<u8>,
    /// ETS weights of traffic classes 0, 1, ... (comma-separated; unnamed classes keep weight 1).
    #[arg(long = "tc-weights", value_name = "W0,W1,..", value_delimiter = ',')]
    pub tc_weights: Vec<u32>,
    /// perftest: maximum message rate of every QP, in --rate_units (default Gb/s of payload). Not the same as
    /// --rate-limit (hyphen), which counts whole frames on the wire in Gb/s.
    #[arg(long = "rate_limit", value_name = "RATE")]
    pub pt_rate_limit: Option<f64>,
    /// perftest: units of --rate_limit: g (Gb/s), M (MiB/s), p (messages/s).
    #[arg(long = "rate_units", value_enum, default_value_t = RateUnits::Gbps)]
    pub pt_rate_units: RateUnits,
    /// perftest: messages per burst of the rate limiter (sets the bucket depth; only with --rate_limit).
    #[arg(long = "burst_size", value_name = "MSGS")]
    pub pt_burst_size: Option<u32>,
}

impl SchedArgs {
    fn any(&self) -> bool {
        self.rate_limit.is_some()
            || self.burst.is_some()
            || self.tc.is_some()
            || !self.tc_weights.is_empty()
            || self.pt_rate_limit.is_some()
            || self.pt_burst_size.is_some()
    }
}

/// Checks the flags against the run (before anything is opened).
///
/// # Errors
/// A message for the user: a rate that is not a positive number, both rate flags, more than eight weights or a
/// zero weight, `--burst_size` without `--rate_limit`, perftest's limiter on a test it does not apply to, the
/// simulated link.
pub fn validate(a: &PerfArgs, p: &Params) -> Result<(), String> {
    let s = &a.sched;
    if !s.any() {
        return Ok(());
    }
    if a.link == LinkKind::Sim && a.loopback {
        return Err(
            "--rate-limit, --burst, --tc and --tc-weights apply to the UDP link (not --link sim)"
                .into(),
        );
    }
    for (flag, v) in [
        ("--rate-limit", s.rate_limit),
        ("--rate_limit", s.pt_rate_limit),
    ] {
        if v.is_some_and(|r| !(r.is_finite() && r > 0.0)) {
            return Err(format!("{flag} must be a positive number"));
        }
    }
    if s.rate_limit.is_some() && s.pt_rate_limit.is_some() {
        return Err("give --rate-limit (wire Gb/s) or perftest's --rate_limit, not both".into());
    }
    if s.tc_weights.len() > 8 {
        return Err("--tc-weights: at most 8 classes".into());
    }
    if s.tc_weights.contains(&0) {
        return Err("--tc-weights: weights must be at least 1".into());
    }
    if s.pt_burst_size.is_some() && s.pt_rate_limit.is_none() {
        // perftest: "Can't enable burst mode when rate limiter is off".
        return Err("--burst_size needs --rate_limit".into());
    }
    if s.pt_burst_size.is_some() && s.burst.is_some() {
        return Err("give --burst (bytes) or --burst_size (messages), not both".into());
    }
    if s.pt_rate_limit.is_some() {
        if !p.test.is_bw() || p.test.is_atomic() {
            // perftest: "SW Rate limiter cann't be executed on non-BW, ATOMIC ... tests".
            return Err(
                "--rate_limit applies to send-bw, write-bw and read-bw (use --rate-limit)".into(),
            );
        }
        if p.sizes.len() != 1 {
            return Err("--rate_limit converts a message rate with the message size: give one -s, not -a (or use --rate-limit)".into());
        }
    }
    Ok(())
}

/// Bytes on the wire (whole frames, Ethernet header to ICRC) of one data message of `size` bytes of test `t` over
/// `conn` at path MTU `pmtu` (`ROCEV2.md §3`, IBTA 9.2–9.4): one frame per PMTU of payload, each Ethernet 14 + IPv4
/// 20 (IPv6 40) + UDP 8 + BTH 12 + the payload padded to 4 bytes + ICRC 4; plus RETH 16 on the first packet of a
/// WRITE, DETH 8 on a UD SEND, AETH 4 on the first and last READ response packets (once for a single one).
pub fn wire_bytes_per_message(t: Test, conn: Conn, size: u64, pmtu: u32, ipv6: bool) -> u64 {
    let ip = if ipv6 {
        roce_wire::ipv6::HEADER_LEN
    } else {
        roce_wire::ipv4::HEADER_LEN
    } as u64;
    let per_pkt = roce_wire::eth::HEADER_LEN as u64
        + ip
        + roce_wire::udp::HEADER_LEN as u64
        + roce_wire::bth::HEADER_LEN as u64
        + roce_wire::ICRC_LEN as u64;
    let m = u64::from(pmtu).max(1);
    let pkts = size.div_ceil(m).max(1);
    // Every packet but the last is full (a multiple of 4); the last is padded.
    let payload = (pkts - 1) * m + (size - (pkts - 1) * m).div_ceil(4) * 4;
    let ext = match (t, conn) {
        (Test::WriteBw | Test::WriteLat, _) => roce_wire::reth::HEADER_LEN as u64,
        (Test::SendBw | Test::SendLat, Conn::Ud) => roce_wire::deth::HEADER_LEN as u64,
        (Test::ReadBw | Test::ReadLat, _) => roce_wire::aeth::HEADER_LEN as u64 * pkts.min(2),
        _ => 0,
    };
    pkts * per_pkt + payload + ext
}

/// The engine's scheduler configuration for this side: per-QP limit and depth, traffic class, class weights.
/// `local` decides the IP header size of the conversions; `p` is the run (on the server, the client's parameters).
pub fn sched_config(a: &PerfArgs, p: &Params, local: IpAddr) -> SchedConfig {
    let s = &a.sched;
    let mut c = SchedConfig::default();
    let size = p.sizes.first().copied().unwrap_or(1).max(1);
    let per_msg = wire_bytes_per_message(p.test, p.conn, size, p.mtu.bytes(), local.is_ipv6());
    let wire_bps = |bps: f64| (bps.round() as u64).max(1);
    c.qp_rate_limit_bps = match (s.rate_limit, s.pt_rate_limit) {
        (Some(g), _) => Some(wire_bps(g * 1e9)),
        (None, Some(r)) => {
            let factor = per_msg as f64 / size as f64;
            Some(wire_bps(match s.pt_rate_units {
                RateUnits::Gbps => r * 1e9 * factor,
                RateUnits::MiBps => r * 1_048_576.0 * 8.0 * factor,
                RateUnits::Pps => r * per_msg as f64 * 8.0,
            }))
        }
        (None, None) => None,
    };
    c.qp_burst_bytes = s.burst.or(s.pt_burst_size.map(|n| u64::from(n) * per_msg));
    c.qp_tc = s.tc.unwrap_or(0);
    for (k, &w) in s.tc_weights.iter().enumerate().take(c.tcs.len()) {
        c.tcs[k] = TcConfig {
            weight: w,
            ..c.tcs[k]
        };
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_bytes_follow_the_header_layout() {
        // One 4096-byte WRITE at PMTU 1024 over IPv4: 4 frames of 58 + 1024, RETH on the first.
        assert_eq!(
            wire_bytes_per_message(Test::WriteBw, Conn::Rc, 4096, 1024, false),
            4 * (58 + 1024) + 16
        );
        // A 1-byte SEND is padded to 4; UD adds DETH; IPv6 adds 20 per packet.
        assert_eq!(
            wire_bytes_per_message(Test::SendBw, Conn::Rc, 1, 1024, false),
            58 + 4
        );
        assert_eq!(
            wire_bytes_per_message(Test::SendBw, Conn::Ud, 1, 1024, true),
            78 + 4 + 8
        );
        // READ responses: AETH on FIRST and LAST (ONLY: once); 3000 B at 1024 → 1024 + 1024 + 952.
        assert_eq!(
            wire_bytes_per_message(Test::ReadBw, Conn::Rc, 3000, 1024, false),
            3 * 58 + 3000 + 8
        );
        assert_eq!(
            wire_bytes_per_message(Test::ReadBw, Conn::Rc, 100, 1024, false),
            58 + 100 + 4
        );
    }
}
