//! `rocev2 perf TEST [FLAGS] [ADDRESS]`: perftest-style bandwidth and latency tests over the rocev2 runtime.
//!
//! * no address: server (waits for a client on TCP `-p`, default 18515);
//! * an address: client (connects to the server there);
//! * `--loopback`: both ends in this process, over real UDP sockets on 127.0.0.1 (server) and 127.0.0.2 (client)
//!   (`--loopback-ips` changes the pair, `--link sim` uses the in-memory simulated segment instead).
//!
//! Flags keep perftest's letters and meanings (`-s -n -D -a -q -t -m -I -Q -l -c -p -F --report_gbits
//! --run_infinitely`); see `rocev2 perf --help`. The server follows the client's parameters (sent in the
//! out-of-band hello). Data is verified at the end of every size (unless `--no-verify`): a mismatch is an error
//! and a non-zero exit.
//!
//! Long runs (`-a`, `-D`, `-n` of 10 000 or more) draw a progress line on stderr when it is a terminal and the output
//! is the table (`progress`); result lines on stdout are the same with or without it.
//!
//! Receive mode (`--rx auto|packet|socket`, alias `--rx-mode`): as `rocev2 pingpong` (see `crate::rxmode`); `auto`
//! is `socket` for a peer on this host (so `--loopback`) and `packet` otherwise. A run that fails after frames
//! failed the ICRC check in socket mode says that a Linux rxe peer needs `--rx packet`.

mod bench;
mod compat;
pub mod dcqcn;
pub mod metrics;
pub mod port_mtu;
pub mod progress;
pub mod report;
pub mod shaping;
pub mod udp_stats;

use std::fs::File;
use std::io::BufWriter;
use std::net::{IpAddr, Ipv4Addr, TcpListener};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clap::{Args, ValueEnum};
use roce_link::device::{gid_of, mac_of};
use roce_link::{
    FaultConfig, Faulty, LinkError, Pcap, PcapMode, RxMode, SimConfig, UdpConfig, UdpLink,
};
use roce_proto::{EngineConfig, Mtu, QpType};
use roce_verbs::{Context, Moderation, ProgressMode, RuntimeConfig, SendLink};
use serde_json::{Value, json};

use crate::oob::{Oob, OobError};
use crate::rxmode::{self, RxArg};
use udp_stats::{SharedUdpStats, UdpTap};

/// The perf tests.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Test {
    /// SEND bandwidth (RC, UC, UD).
    SendBw,
    /// RDMA WRITE bandwidth (RC, UC).
    WriteBw,
    /// RDMA READ bandwidth (RC).
    ReadBw,
    /// Atomic FETCH_AND_ADD bandwidth (RC).
    AtomicBw,
    /// SEND ping-pong latency, half round trip (RC, UC, UD).
    SendLat,
    /// RDMA WRITE ping-pong latency, half round trip (RC, UC).
    WriteLat,
    /// RDMA READ latency, full round trip (RC).
    ReadLat,
    /// Atomic FETCH_AND_ADD latency, full round trip (RC).
    AtomicLat,
}

/// What `rocev2 perf` without a test prints: every test with its one-line description and how to start one.
fn test_list() -> String {
    use clap::ValueEnum;
    let mut s = String::from("rocev2 perf: which test? One of:\n");
    for t in Test::value_variants() {
        let help = t
            .to_possible_value()
            .and_then(|v| v.get_help().map(ToString::to_string))
            .unwrap_or_default();
        s.push_str(&format!("  {:<11} {help}\n", t.name()));
    }
    s.push_str(
        "e.g. `rocev2 perf write-bw --loopback` (both ends in this process), `rocev2 perf write-bw` (server) and \
         `rocev2 perf write-bw SERVER` (client); `rocev2 perf --help` lists the flags.\n",
    );
    s
}

impl Test {
    /// The kebab-case name.
    pub fn name(self) -> &'static str {
        match self {
            Test::SendBw => "send-bw",
            Test::WriteBw => "write-bw",
            Test::ReadBw => "read-bw",
            Test::AtomicBw => "atomic-bw",
            Test::SendLat => "send-lat",
            Test::WriteLat => "write-lat",
            Test::ReadLat => "read-lat",
            Test::AtomicLat => "atomic-lat",
        }
    }

    fn from_name(s: &str) -> Option<Test> {
        Test::value_variants()
            .iter()
            .copied()
            .find(|t| t.name() == s)
    }

    /// Bandwidth (true) or latency test.
    pub fn is_bw(self) -> bool {
        matches!(
            self,
            Test::SendBw | Test::WriteBw | Test::ReadBw | Test::AtomicBw
        )
    }

    fn title(self) -> &'static str {
        match self {
            Test::SendBw => "Send BW Test",
            Test::WriteBw => "RDMA_Write BW Test",
            Test::ReadBw => "RDMA_Read BW Test",
            Test::AtomicBw => "Atomic FETCH_AND_ADD BW Test",
            Test::SendLat => "Send Latency Test",
            Test::WriteLat => "RDMA_Write Latency Test",
            Test::ReadLat => "RDMA_Read Latency Test",
            Test::AtomicLat => "Atomic FETCH_AND_ADD Latency Test",
        }
    }

    fn is_atomic(self) -> bool {
        matches!(self, Test::AtomicBw | Test::AtomicLat)
    }
}

/// Connection type (`-c`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
#[value(rename_all = "UPPER")]
pub enum Conn {
    /// Reliable connected.
    Rc,
    /// Unreliable connected.
    Uc,
    /// Unreliable datagram.
    Ud,
}

impl Conn {
    fn name(self) -> &'static str {
        match self {
            Conn::Rc => "RC",
            Conn::Uc => "UC",
            Conn::Ud => "UD",
        }
    }
    fn from_name(s: &str) -> Option<Conn> {
        match s {
            "RC" => Some(Conn::Rc),
            "UC" => Some(Conn::Uc),
            "UD" => Some(Conn::Ud),
            _ => None,
        }
    }
    fn qp_type(self) -> QpType {
        match self {
            Conn::Rc => QpType::Rc,
            Conn::Uc => QpType::Uc,
            Conn::Ud => QpType::Ud,
        }
    }
}

/// `--output`: perftest's reduced verbosity levels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum OutputLevel {
    /// Average bandwidth only.
    Bandwidth,
    /// Message rate only.
    #[value(name = "message_rate", alias = "message-rate")]
    MessageRate,
    /// Average latency only.
    Latency,
}

/// Link used by `--loopback`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LinkKind {
    /// Kernel UDP sockets on port 4791 (`UdpLink`).
    Udp,
    /// The in-memory simulated segment (100 Gb/s, 1 µs), one engine thread for both ends.
    Sim,
    /// AF_XDP on the interface that owns `--ip` (`XdpLink`: an XDP program steers UDP 4791 to the socket); when
    /// it cannot be used (privilege, kernel, interface), a message names the cause and the UDP link is used.
    Xdp,
}

/// `rocev2 perf` arguments.
#[derive(Clone, Debug, Args)]
pub struct PerfArgs {
    /// Test to run. Without one, `rocev2 perf` lists the tests and exits with status 2.
    #[arg(value_enum)]
    pub test: Option<Test>,
    /// Server address (client mode). Without it (and without --loopback) this side is the server.
    pub address: Option<String>,
    /// Message size in bytes, optionally with K or M (2^10, 2^20) as in perftest (default 65536 for bandwidth, 2
    /// for latency, the MTU for UD bandwidth; atomics are always 8).
    #[arg(short = 's', long, value_parser = parse_size)]
    pub size: Option<u64>,
    /// Iterations per QP (default 5000 for write-bw, 1000 otherwise).
    #[arg(short = 'n', long = "iters")]
    pub iters: Option<u64>,
    /// Run for this many seconds instead of a number of iterations.
    #[arg(short = 'D', long)]
    pub duration: Option<f64>,
    /// Run every size 2 B .. 8 MiB (powers of two; UD: up to the MTU).
    #[arg(short = 'a', long)]
    pub all: bool,
    /// Bidirectional bandwidth: both sides send at once; each side's result is the sum of both directions, as
    /// perftest's (bandwidth tests).
    #[arg(short = 'b', long)]
    pub bidirectional: bool,
    /// IP traffic class of this run's packets (the GRH traffic class: DSCP = value >> 2; the engine sets the ECN
    /// bits), 0 .. 255. perftest's --tclass; its -T/--tos (rdma_cm's TOS) sets the same IPv4 byte here.
    #[arg(short = 'T', long = "tclass", visible_alias = "tos")]
    pub tclass: Option<u8>,
    /// Print only one number per size, as perftest's --output: `bandwidth` (average, in the unit of the table) or
    /// `message_rate` (Mpps) for bandwidth tests, `latency` (average, µs) for latency tests.
    #[arg(long, value_enum)]
    pub output: Option<OutputLevel>,
    /// perftest's dual-port mode: refused (a rocev2 device is one port: one address and its UDP link; run a second
    /// perf pair on a second address instead).
    #[arg(short = 'O', long)]
    pub dualport: bool,
    /// perftest's -i/--ib-port: the port of the device; 1, the only port of a rocev2 device (another value is
    /// refused: pick the device, i.e. the address, with --ip).
    #[arg(short = 'i', long = "ib-port", visible_alias = "ib_port")]
    pub ib_port: Option<u32>,
    /// perftest's -S/--sl: the InfiniBand service level; 0 (another value is refused: on RoCE the SL is the 802.1p
    /// priority of a VLAN tag, and rocev2 sends untagged UDP; -T/--tclass sets the IP traffic class instead).
    #[arg(short = 'S', long = "sl")]
    pub sl: Option<u8>,
    /// perftest's --report-both: with -b, also print each direction's line (this side's sends, the peer's sends)
    /// under the summed one.
    #[arg(long = "report-both", visible_alias = "report_both")]
    pub report_both: bool,
    /// perftest's --cpu_util (CPU use in the report, -D runs): refused, rocev2 perf does not measure it.
    #[arg(long = "cpu_util", visible_alias = "cpu-util")]
    pub cpu_util: bool,
    /// perftest's -z/--com_rdma_cm (exchange the connection data through rdma_cm): refused, `rocev2 perf` exchanges
    /// it over TCP (perftest itself runs with -z on rocev2's librdmacm under `rocev2 run`).
    #[arg(short = 'z', long = "com_rdma_cm", visible_alias = "com-rdma-cm")]
    pub com_rdma_cm: bool,
    /// perftest's -w/--limit_bw (fail the run below a bandwidth): refused, rocev2 perf has no pass/fail limits.
    #[arg(short = 'w', long = "limit_bw", visible_alias = "limit-bw")]
    pub limit_bw: Option<f64>,
    /// perftest's -R/--rdma_cm (connect through the RDMA connection manager): refused (`rocev2 perf`'s two ends
    /// exchange QP numbers, PSNs and keys over TCP, perftest's default out-of-band exchange; perftest itself runs
    /// with -R on rocev2's librdmacm under `rocev2 run`).
    #[arg(short = 'R', long = "rdma_cm", visible_alias = "rdma-cm")]
    pub rdma_cm: bool,
    /// Number of QPs (bandwidth tests).
    #[arg(short = 'q', long = "qp", default_value_t = 1)]
    pub qps: u32,
    /// TX depth: WRs outstanding per QP (default 128 for bandwidth, 1 for latency).
    #[arg(short = 't', long = "tx-depth", visible_alias = "tx_depth")]
    pub tx_depth: Option<u32>,
    /// Path MTU in bytes: 256, 512, 1024, 2048 or 4096. Default: the active MTU of the local RoCE address, the
    /// largest of those at most the MTU of the network device owning it minus 80 (as Linux rxe: 1500 → 1024,
    /// 9000 and loopback → 4096; `--link sim`: 4096). A larger -m is lowered to the active MTU with a note; the two
    /// sides then use the smaller of their MTUs.
    #[arg(short = 'm', long)]
    pub mtu: Option<u32>,
    /// Largest message sent inline (SEND and WRITE; at most 256). Default as perftest's: 220 for write-lat, 236 for
    /// send-lat over RC/UC, 188 for send-lat over UD, 0 otherwise.
    #[arg(short = 'I', long = "inline_size", visible_alias = "inline-size")]
    pub inline_size: Option<u32>,
    /// CQ moderation: request a completion every N WRs (bandwidth; default 100, at most the TX depth). With
    /// -e it is also the completion-channel event count.
    #[arg(short = 'Q', long = "cq-mod", visible_alias = "cq_mod")]
    pub cq_mod: Option<u32>,
    /// Post list: WRs per post_send call (doorbell batch; bandwidth tests).
    #[arg(
        short = 'l',
        long = "post_list",
        visible_alias = "post-list",
        default_value_t = 1
    )]
    pub post_list: u32,
    /// Connection type.
    #[arg(short = 'c', long = "connection", value_enum, default_value = "RC")]
    pub conn: Conn,
    /// Report bandwidth in Gb/s instead of MB/s (2^20 bytes).
    #[arg(long = "report_gbits", visible_alias = "report-gbits")]
    pub report_gbits: bool,
    /// TCP port of the out-of-band exchange.
    #[arg(short = 'p', long, default_value_t = 18515)]
    pub port: u16,
    /// Accepted for perftest compatibility (no CPU-frequency check is made).
    #[arg(short = 'F', long = "CPU-freq")]
    pub cpu_freq: bool,
    /// Put this side's test buffer on 2 MiB huge pages (reserve them first: `echo N > /proc/sys/vm/nr_hugepages`).
    /// Without free huge pages a warning is printed and normal pages are used.
    #[arg(long = "use_hugepages", visible_alias = "use-hugepages")]
    pub use_hugepages: bool,
    /// Bandwidth tests: run until interrupted, printing a line per second (nothing is verified: the run never
    /// ends).
    #[arg(long = "run_infinitely", visible_alias = "run-infinitely")]
    pub run_infinitely: bool,
    /// Wait for completions on a completion channel (events) instead of busy polling.
    #[arg(short = 'e', long = "events")]
    pub events: bool,
    /// Completion-channel moderation period in µs (with -e): an event after -Q completions or this long.
    #[arg(long = "cq-period", default_value_t = 100)]
    pub cq_period_us: u64,
    /// Adaptive completion-channel moderation (with -e).
    #[arg(long = "adaptive-moderation")]
    pub adaptive: bool,
    /// Both ends in this process over UDP on 127.0.0.1 / 127.0.0.2.
    #[arg(long)]
    pub loopback: bool,
    /// Server and client addresses for --loopback (default: the first pair 127.0.0.1,127.0.0.2 / .3,.4 / ...
    /// whose RoCE port 4791 is free, so runs at the same time do not collide).
    #[arg(long = "loopback-ips", value_delimiter = ',')]
    pub loopback_ips: Option<Vec<IpAddr>>,
    /// Link: `udp` (kernel UDP sockets), `xdp` (AF_XDP, falls back to udp with a message naming the cause), `sim`
    /// (--loopback only: the simulated segment).
    #[arg(long, value_enum, default_value = "udp")]
    pub link: LinkKind,
    /// Local address to bind (client: TCP source and RoCE address; server: TCP listen address).
    #[arg(long)]
    pub ip: Option<IpAddr>,
    /// Out-of-band timeout in seconds: bounds the client's connect, each message of the exchange (default 10), and
    /// the server's wait for a client (default: none, a server waits as perftest's does).
    #[arg(long)]
    pub timeout: Option<f64>,
    /// Print one JSON object per size instead of the table (and no progress line: a long run on a terminal
    /// draws one on stderr otherwise).
    #[arg(long)]
    pub json: bool,
    /// Skip the end-of-run data verification.
    #[arg(long = "no-verify")]
    pub no_verify: bool,
    /// Print the engine counters at the end.
    #[arg(long)]
    pub stats: bool,
    /// Serve the engine counters for Prometheus at this address (e.g. 127.0.0.1:9100) while running.
    #[arg(long)]
    pub metrics: Option<String>,
    /// Capture this side's frames (both directions) to a pcap file (--loopback: the client's).
    #[arg(long)]
    pub pcap: Option<PathBuf>,
    /// Drop each transmitted frame with this probability.
    #[arg(long, default_value_t = 0.0)]
    pub loss: f64,
    /// Reorder transmitted frames with this probability.
    #[arg(long, default_value_t = 0.0)]
    pub reorder: f64,
    /// Duplicate transmitted frames with this probability.
    #[arg(long, default_value_t = 0.0)]
    pub dup: f64,
    /// Corrupt (flip an ICRC-covered bit of) transmitted frames with this probability.
    #[arg(long, default_value_t = 0.0)]
    pub corrupt: f64,
    /// Mark ECN CE on transmitted ECN-capable frames with this probability.
    #[arg(long, default_value_t = 0.0)]
    pub ce: f64,
    /// Seed of the fault injector and the engines (initial PSNs, memory keys). Default: a random one per run, so
    /// that PSNs and keys are not the same in every run (as perftest randomises its PSNs: a blind in-window
    /// injection must not be easy); give one to reproduce a fault-injection run exactly.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Testing aid: alter one verified byte (or the atomic counter) just before verification, which must then fail.
    #[arg(long = "debug-corrupt-before-verify", hide = true)]
    pub debug_corrupt: bool,
    /// Pin the progress thread (`--progress thread`) or auto-progress thread (`caller`) to this core.
    #[arg(long = "engine-core")]
    pub engine_core: Option<usize>,
    /// Who drives the RoCE engine: `caller` (run-to-completion: posts and polls drive it in the test threads; an
    /// auto-progress thread covers a passive side) or `thread` (a progress thread per device).
    #[arg(long = "progress", default_value = "caller", value_parser = parse_progress)]
    pub progress: ProgressMode,
    /// Speak perftest's out-of-band exchange (without -R) and put perftest's traffic pattern on the wire, so that
    /// ib_send_bw / ib_write_bw / ib_read_bw / ib_atomic_bw / ib_send_lat / ib_write_lat pair with this side (same
    /// flags on both sides; no parameter exchange).
    #[arg(long = "perftest-compat")]
    pub perftest_compat: bool,
    /// perftest's GID index: accepted; this side always uses the IPv4-mapped GID of its address.
    #[arg(short = 'x', long = "gid-index", visible_alias = "gid_index")]
    pub gid_index: Option<u32>,
    /// perftest's device name: accepted and ignored (the device is the UDP link on the local address).
    #[arg(short = 'd', long = "ib-dev", visible_alias = "ib_dev")]
    pub ib_dev: Option<String>,
    /// Receive path of the UDP link: packet (AF_PACKET, real IP headers, needs CAP_NET_RAW; needed for peers that
    /// number their IPv4 IDs, such as Linux rxe), socket (UDP socket; rocev2 peers), auto (socket when the peer's
    /// address is on this host, otherwise packet, falling back to socket without CAP_NET_RAW).
    #[arg(long = "rx", visible_alias = "rx-mode", value_enum, default_value_t = RxArg::Auto)]
    pub rx: RxArg,
    /// The local ACK timeout exponent of this side's QPs (4.096 µs · 2^N, as perftest's -u; default 14 ≈ 67 ms). Raise
    /// it for a slow peer (rxe in an emulated guest) or a host that stalls processes for longer than 7 timeouts
    /// (`docs/FINDINGS-retry.md`).
    #[arg(short = 'u', long = "qp-timeout", visible_alias = "qp_timeout", default_value_t = 14, value_parser = clap::value_parser!(u8).range(1..=31))]
    pub qp_timeout: u8,
    /// Congestion control: --dcqcn, --cc-set, --rate-log, --rate-log-us, --ce-rx (`perf/dcqcn.rs`).
    #[command(flatten)]
    pub cc: dcqcn::DcqcnArgs,
    /// Scheduler flags: --rate-limit, --burst, --tc, --tc-weights, perftest's --rate_limit/--rate_units/--burst_size.
    #[command(flatten)]
    pub sched: shaping::SchedArgs,
}

impl PerfArgs {
    /// The run's seed ([`run`] resolves `--seed`'s default, a random one, before anything uses it).
    pub(crate) fn seed(&self) -> u64 {
        self.seed.unwrap_or(1)
    }
}

/// `-s`: a number (decimal, or 0x hex as perftest's strtol) with an optional K or M suffix (2^10, 2^20).
fn parse_size(s: &str) -> Result<u64, String> {
    let (num, factor) = match s.as_bytes().last() {
        Some(b'K') => (&s[..s.len() - 1], 1u64 << 10),
        Some(b'M') => (&s[..s.len() - 1], 1u64 << 20),
        _ => (s, 1),
    };
    let n = match num.strip_prefix("0x").or_else(|| num.strip_prefix("0X")) {
        Some(h) => u64::from_str_radix(h, 16),
        None => num.parse::<u64>(),
    }
    .map_err(|_| format!("`{s}` is not a size (bytes, or a number with K or M)"))?;
    n.checked_mul(factor)
        .ok_or_else(|| format!("`{s}` is too large"))
}

/// Resolved run parameters, shared by both sides (the client sends them in its hello).
#[derive(Clone, Debug, PartialEq)]
pub struct Params {
    pub test: Test,
    pub conn: Conn,
    pub sizes: Vec<u64>,
    pub iters: u64,
    pub duration: Option<Duration>,
    pub qps: u32,
    pub tx_depth: u32,
    pub mtu: Mtu,
    pub inline: u32,
    pub cq_mod: u32,
    pub post_list: u32,
    pub verify: bool,
    pub infinite: bool,
    /// `--run_infinitely`: a result line per this interval (`-D`, default 5 s).
    pub report_every: Duration,
    /// `-b`: both sides send.
    pub bidir: bool,
    /// `-T`/`--tclass`: the IP traffic class of every packet.
    pub tclass: u8,
    /// Alter verified data before verifying (testing aid, hidden flag).
    pub debug_corrupt: bool,
    /// UD bandwidth without `-s`: the message size is the MTU, lowered to the path MTU once both sides' are known.
    pub ud_size_mtu: bool,
    /// `-u`: this side's local ACK timeout exponent for its QPs (each side its own, as perftest's; not sent to the
    /// peer).
    pub qp_timeout: u8,
}

/// Largest message (`-s`, the end of `-a`): perftest's `MAX_SIZE`.
const MAX_SIZE: u64 = 8 << 20;
/// perftest's `-n` range (`MIN_ITER`, `MAX_ITER`).
const MIN_ITERS: u64 = 5;

/// The inline size without -I, bytes: perftest's defaults (perftest_parameters.h `DEF_INLINE_WRITE` 220,
/// `DEF_INLINE_SEND_RC_UC` 236, `DEF_INLINE_SEND_UD` 188), which its `ctx_set_max_inline` applies to latency tests
/// only; READ, atomic and bandwidth tests send nothing inline.
fn default_inline(t: Test, conn: Conn) -> u32 {
    match (t, conn) {
        (Test::WriteLat, _) => 220,
        (Test::SendLat, Conn::Ud) => 188,
        (Test::SendLat, _) => 236,
        _ => 0,
    }
}
const MAX_ITERS: u64 = 1 << 32;
/// perftest's `-t` range ends at 15000 (`MAX_TX`); the engine's queues hold 16384 WRs.
const MAX_TX_DEPTH: u32 = 15000;
/// perftest's `-Q` range ends at 1024 (`MAX_CQ_MOD`).
const MAX_CQ_MOD: u32 = 1024;
/// perftest's default `-Q`.
const DEFAULT_CQ_MOD: u32 = 100;
/// QPs of one run at most: perftest's limit, and the device's `max_qp` (`roce_proto::DeviceAttr`).
const MAX_QPS: u32 = 16384;
/// Send WRs of one run at most, `-q` × `-t` (each side allocates queues for all of them): without a bound a client
/// could ask a server for 16,384 QPs of 15,000 WRs, tens of GB.
const MAX_RUN_WRS: u64 = 1 << 21;

/// `-q` × `-t` within [`MAX_RUN_WRS`].
fn check_run_wrs(qps: u32, tx_depth: u32) -> Result<(), String> {
    if u64::from(qps) * u64::from(tx_depth) > MAX_RUN_WRS {
        return Err(format!(
            "-q {qps} with -t {tx_depth}: at most {MAX_RUN_WRS} send WRs per run (-q x -t)"
        ));
    }
    Ok(())
}

fn mtu_of(bytes: u32) -> Option<Mtu> {
    port_mtu::parse_flag(bytes).ok()
}

/// UD messages are single packets: with `-a` drops the sizes above `mtu`, otherwise refuses them.
fn fit_ud_sizes(conn: Conn, sizes: &mut Vec<u64>, mtu: Mtu, all: bool) -> Result<(), String> {
    if conn != Conn::Ud {
        return Ok(());
    }
    let m = u64::from(mtu.bytes());
    if all {
        sizes.retain(|&s| s <= m);
    } else if let Some(s) = sizes.iter().find(|&&s| s > m) {
        return Err(format!(
            "UD messages must fit the MTU ({m} bytes; -s {s} does not)"
        ));
    }
    Ok(())
}

/// Caps `p.mtu` by this side's own limits once its local RoCE address `local` is known: its `-m` (a server
/// follows the client's parameters, so this is where its own -m counts) and the active MTU of the device owning
/// `local` (`--loopback`: the loopback device; see [`port_mtu`]). A `-m` above the active MTU gets a note on
/// stderr when `note`; an unknown active MTU leaves `p.mtu` as requested, with a note. The peer does the same and
/// the exchange takes the smaller of the two (`bench.rs`).
///
/// # Errors
/// A UD size that no longer fits (the client's `-a` list is trimmed instead).
fn apply_port_mtu(
    a: &PerfArgs,
    p: &mut Params,
    local: IpAddr,
    is_client: bool,
    note: bool,
) -> Result<(), String> {
    if let Some(own) = a.mtu.and_then(mtu_of) {
        p.mtu = p.mtu.min(own);
    }
    let active = if a.loopback {
        port_mtu::of_loopback()
    } else {
        port_mtu::of_address(local)
    };
    let active = if a.link == LinkKind::Xdp {
        active.map(port_mtu::for_xdp)
    } else {
        active
    };
    match active {
        Ok(act) => {
            let (m, lowered) = port_mtu::cap(p.mtu, &act, local);
            // The server's note is about its own -m only: a client's larger MTU is simply negotiated down.
            let own_flag = a.mtu.is_some_and(|f| f > act.mtu.bytes());
            if let (Some(n), true, true) = (lowered, note, own_flag) {
                eprintln!("rocev2 perf: note: {n}");
            }
            p.mtu = m;
        }
        Err(e) => {
            if note {
                eprintln!(
                    "rocev2 perf: note: the active MTU of {local} is unknown ({e}); using {} bytes",
                    p.mtu.bytes()
                );
            }
        }
    }
    let all = a.all && is_client;
    if p.ud_size_mtu {
        p.sizes = vec![u64::from(p.mtu.bytes())];
    }
    if all && note && p.conn == Conn::Ud {
        eprintln!(
            "rocev2 perf: note: UD messages are single packets: -a stops at the MTU ({} bytes), as in perftest",
            p.mtu.bytes()
        );
    }
    fit_ud_sizes(p.conn, &mut p.sizes, p.mtu, all).map_err(|e| {
        format!(
            "{e}: the active MTU of {local} on this side is {} bytes",
            p.mtu.bytes()
        )
    })
}

impl Params {
    /// The parameters of `a`, checked as perftest checks them (its ranges and refusals; an error names the flag),
    /// and the notes to print for what was adjusted (where perftest adjusts too).
    fn from_args(a: &PerfArgs) -> Result<(Params, Vec<String>), String> {
        let t = a.test.ok_or_else(|| "no test given".to_string())?;
        // Without -m the largest; capped by the active MTU once the local address is known (`apply_port_mtu`).
        let mtu = a
            .mtu
            .map(port_mtu::parse_flag)
            .transpose()?
            .unwrap_or(Mtu::Mtu4096);
        match (t, a.conn) {
            (Test::SendBw | Test::SendLat, _) => {}
            (Test::WriteBw | Test::WriteLat, Conn::Rc | Conn::Uc) => {}
            (_, Conn::Rc) => {}
            _ => {
                return Err(format!(
                    "{} does not run over {} (as in perftest)",
                    t.name(),
                    a.conn.name()
                ));
            }
        }
        let mut notes = Vec::new();
        if a.loopback
            && let Some(addr) = &a.address
        {
            return Err(format!(
                "--loopback runs both ends in this process; it takes no server address (got `{addr}`; \
                 drop it, or drop --loopback to run a client)"
            ));
        }
        if let Some(s) = a.size
            && !(1..=MAX_SIZE).contains(&s)
        {
            return Err(format!(
                "-s {s}: the message size must be 1 .. {MAX_SIZE} bytes"
            ));
        }
        if t.is_atomic() && a.size.is_some_and(|s| s != 8) {
            return Err(format!(
                "-s {}: the message size cannot be changed for atomic tests (always 8 bytes, as in perftest)",
                a.size.unwrap_or(0)
            ));
        }
        if a.all && a.duration.is_some() {
            return Err("-D cannot run on all sizes (-a), as in perftest".into());
        }
        if a.all && t.is_atomic() {
            notes.push("atomic tests have one size (8 bytes): -a runs that size".into());
        }
        let default_size = if t.is_bw() { 65536 } else { 2 };
        // UD bandwidth without -s: the 65536-byte default does not fit a packet; perftest then uses the MTU (lowered
        // to the path MTU once both sides' are known). Latency keeps its 2-byte default.
        let ud_size_mtu = a.conn == Conn::Ud && a.size.is_none() && !a.all && t.is_bw();
        let mut sizes: Vec<u64> = if a.all {
            (1..=23).map(|i| 1u64 << i).collect()
        } else if ud_size_mtu {
            vec![u64::from(mtu.bytes())]
        } else {
            vec![a.size.unwrap_or(default_size)]
        };
        if t.is_atomic() {
            sizes = vec![8];
        }
        fit_ud_sizes(a.conn, &mut sizes, mtu, a.all)?;
        let iters = a
            .iters
            .unwrap_or(if t == Test::WriteBw { 5000 } else { 1000 });
        if let Some(t) = a.timeout
            && !(t.is_finite() && t > 0.0 && Duration::try_from_secs_f64(t).is_ok())
        {
            return Err(format!("--timeout {t}: a positive number of seconds"));
        }
        if !(MIN_ITERS..=MAX_ITERS).contains(&iters) {
            return Err(format!(
                "-n {iters}: the iteration count must be {MIN_ITERS} .. {MAX_ITERS}, as in perftest"
            ));
        }
        let duration = match a.duration {
            Some(d) if d.is_finite() && d > 0.0 => {
                Some(Duration::try_from_secs_f64(d).map_err(|_| format!("-D {d}: too large"))?)
            }
            Some(_) => return Err("-D must be a positive number of seconds".into()),
            None => None,
        };
        if !(1..=MAX_QPS).contains(&a.qps) {
            return Err(format!(
                "-q {}: the number of QPs must be 1 .. {MAX_QPS}",
                a.qps
            ));
        }
        if !t.is_bw() && a.qps > 1 {
            return Err(format!(
                "-q {}: multiple QPs are only available in bandwidth tests, as in perftest",
                a.qps
            ));
        }
        let qps = a.qps;
        let tx_depth = a.tx_depth.unwrap_or(if t.is_bw() { 128 } else { 1 });
        if !(1..=MAX_TX_DEPTH).contains(&tx_depth) {
            return Err(format!(
                "-t {tx_depth}: the TX depth must be 1 .. {MAX_TX_DEPTH}, as in perftest"
            ));
        }
        check_run_wrs(qps, tx_depth)?;
        if a.inline_size.is_some() && matches!(t, Test::ReadBw | Test::ReadLat)
            || t.is_atomic() && a.inline_size.is_some()
        {
            return Err(
                "-I: inline data is not available on READ and atomic tests, as in perftest".into(),
            );
        }
        let inline = a.inline_size.unwrap_or_else(|| default_inline(t, a.conn));
        if inline > roce_verbs::MAX_INLINE as u32 {
            return Err(format!(
                "-I {inline}: at most {} bytes inline",
                roce_verbs::MAX_INLINE
            ));
        }
        if let Some(q) = a.cq_mod
            && !(1..=MAX_CQ_MOD).contains(&q)
        {
            return Err(format!(
                "-Q {q}: CQ moderation must be 1 .. {MAX_CQ_MOD}, as in perftest"
            ));
        }
        if a.post_list == 0 {
            return Err("-l 0: the post list must be at least 1".into());
        }
        let post_list = a.post_list;
        let mut cq_mod = a.cq_mod.unwrap_or(DEFAULT_CQ_MOD);
        if post_list > 1 {
            if !t.is_bw() {
                return Err(
                    "-l: a post list is supported in bandwidth tests only, as in perftest".into(),
                );
            }
            if post_list > tx_depth {
                return Err(format!(
                    "-l {post_list}: a post list cannot be longer than the TX depth ({tx_depth})"
                ));
            }
            if a.duration.is_none()
                && !a.run_infinitely
                && !iters.is_multiple_of(u64::from(post_list))
            {
                return Err(format!(
                    "-n {iters}: the number of iterations must be a multiple of the post list size ({post_list}), as in \
                     perftest"
                ));
            }
            match a.cq_mod {
                None => {
                    cq_mod = post_list;
                    notes.push(format!(
                        "post list requested: CQ moderation will be the size of the post list ({post_list})"
                    ));
                }
                Some(q) if !post_list.is_multiple_of(q) => {
                    return Err(format!(
                        "-l {post_list} -Q {q}: the post list size must be a multiple of the CQ moderation, as in \
                         perftest"
                    ));
                }
                Some(_) => {}
            }
        }
        if cq_mod > tx_depth {
            if let Some(q) = a.cq_mod {
                notes.push(format!(
                    "-Q {q} is larger than the TX depth: CQ moderation lowered to {tx_depth} (as perftest does)"
                ));
            }
            cq_mod = tx_depth;
        }
        for p in [a.loss, a.reorder, a.dup, a.corrupt, a.ce] {
            if !(0.0..=1.0).contains(&p) {
                return Err("fault probabilities must be within 0..1".into());
            }
        }
        if a.dualport {
            return Err(
                "-O/--dualport: a rocev2 device has one port (one address and its UDP link); to load two, run a \
                 second perf pair on a second address"
                    .into(),
            );
        }
        if let Some(ip) = a.ip
            && let Err(e) = roce_link::udp::interface_of(ip)
            && e.kind() == std::io::ErrorKind::AddrNotAvailable
        {
            // Said before any socket is bound: otherwise the client's "connecting to ...: Cannot assign requested
            // address (is a rocev2 perf server running there?)" blames the server (fresh-user finding).
            return Err(format!(
                "--ip {ip}: {e}; --ip takes an address of this host (the local end), the server's address is the \
                 positional argument"
            ));
        }
        if let Some(port) = a.ib_port.filter(|&p| p != 1) {
            return Err(format!(
                "-i/--ib-port {port}: a rocev2 device has one port, 1 (its address and UDP link); to use another \
                 device, give its address with --ip"
            ));
        }
        if let Some(sl) = a.sl.filter(|&s| s != 0) {
            return Err(format!(
                "-S/--sl {sl}: the service level selects an InfiniBand virtual lane, on RoCE the 802.1p priority of a \
                 VLAN tag; rocev2 sends untagged UDP, so only 0 applies (-T/--tclass sets the IP traffic class, DSCP)"
            ));
        }
        if a.report_both && !a.bidirectional {
            return Err(
                "--report-both: reports the two directions of a bidirectional run separately; add -b".into(),
            );
        }
        if a.cpu_util {
            return Err(
                "--cpu_util: perftest's CPU utilisation report (-D runs) is not measured by rocev2 perf; run it under \
                 `time` (user + sys against the elapsed time) or watch it with `top`"
                    .into(),
            );
        }
        if a.com_rdma_cm {
            return Err(
                "-z/--com_rdma_cm: rocev2 perf's ends exchange the connection data over TCP (perftest's default), \
                 not through the RDMA connection manager: run without -z; to use rdma_cm, run perftest itself on \
                 rocev2's librdmacm: `rocev2 run --ip ADDRESS -- ib_send_bw -z ...` (docs/RDMACM.md)"
                    .into(),
            );
        }
        if let Some(w) = a.limit_bw {
            return Err(format!(
                "-w/--limit_bw {w}: perftest's pass/fail limit on the average bandwidth is not implemented; compare \
                 the printed average (or the --json bw_avg fields) with your limit instead"
            ));
        }
        if a.rdma_cm {
            return Err(
                "-R/--rdma_cm: rocev2 perf's ends exchange their QP numbers, PSNs and keys over TCP (perftest's \
                 default without -R): run without -R; to connect through rdma_cm, run perftest itself on rocev2's \
                 librdmacm: `rocev2 run --ip ADDRESS -- ib_send_bw -R ...` (README, docs/RDMACM.md)"
                    .into(),
            );
        }
        if a.bidirectional && !t.is_bw() {
            return Err(
                "-b: bidirectional is only available in bandwidth tests, as in perftest".into(),
            );
        }
        if a.bidirectional && a.run_infinitely {
            return Err("-b with --run_infinitely is not supported (a run never ends to exchange both results)".into());
        }
        match (a.output, t.is_bw()) {
            (Some(OutputLevel::Latency), true) => {
                return Err(
                    "--output for bandwidth tests can be: bandwidth, message_rate (as in perftest)"
                        .into(),
                );
            }
            (Some(OutputLevel::Bandwidth | OutputLevel::MessageRate), false) => {
                return Err("--output for latency tests can be: latency (as in perftest)".into());
            }
            _ => {}
        }
        // --run_infinitely: -D is the report interval, 5 s without it (perftest's DEF_DURATION).
        let (duration, report_every) = match (a.run_infinitely, duration) {
            (true, d) => (None, d.unwrap_or(Duration::from_secs(5))),
            (false, d) => (d, Duration::from_secs(5)),
        };
        Ok((
            Params {
                test: t,
                conn: a.conn,
                sizes,
                iters,
                duration,
                qps,
                tx_depth,
                mtu,
                inline,
                cq_mod,
                post_list,
                verify: !a.no_verify,
                infinite: a.run_infinitely,
                report_every,
                bidir: a.bidirectional,
                tclass: a.tclass.unwrap_or(0),
                debug_corrupt: a.debug_corrupt,
                ud_size_mtu,
                qp_timeout: a.qp_timeout,
            },
            notes,
        ))
    }

    fn to_json(&self) -> Value {
        json!({
            "test": self.test.name(),
            "conn": self.conn.name(),
            "sizes": self.sizes,
            "iters": self.iters,
            "duration_s": self.duration.map(|d| d.as_secs_f64()),
            "qps": self.qps,
            "tx_depth": self.tx_depth,
            "mtu": self.mtu.bytes(),
            "inline": self.inline,
            "cq_mod": self.cq_mod,
            "post_list": self.post_list,
            "verify": self.verify,
            "infinite": self.infinite,
            "report_every_s": self.report_every.as_secs_f64(),
            "bidir": self.bidir,
            "tclass": self.tclass,
            "debug_corrupt": self.debug_corrupt,
            "ud_size_mtu": self.ud_size_mtu,
        })
    }

    fn from_json(v: &Value) -> Result<Params, String> {
        let u = |f: &str| {
            v.get(f)
                .and_then(Value::as_u64)
                .ok_or_else(|| format!("client parameters: bad `{f}`"))
        };
        let u32f = |f: &str| {
            u(f).and_then(|x| u32::try_from(x).map_err(|_| format!("client parameters: bad `{f}`")))
        };
        // A value outside what the client itself accepts is refused (the client is told why), never clamped.
        let ranged = |f: &str, lo: u32, hi: u32| {
            u32f(f).and_then(|x| {
                if (lo..=hi).contains(&x) {
                    Ok(x)
                } else {
                    Err(format!(
                        "client parameters: `{f}` {x} is outside {lo} .. {hi}"
                    ))
                }
            })
        };
        let test = v
            .get("test")
            .and_then(Value::as_str)
            .and_then(Test::from_name)
            .ok_or("client parameters: bad `test`")?;
        let conn = v
            .get("conn")
            .and_then(Value::as_str)
            .and_then(Conn::from_name)
            .ok_or("client parameters: bad `conn`")?;
        let sizes: Vec<u64> = v
            .get("sizes")
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_u64).collect())
            .unwrap_or_default();
        if sizes.is_empty() || sizes.iter().any(|&s| s == 0 || s > MAX_SIZE) {
            return Err("client parameters: bad `sizes`".into());
        }
        let p = Params {
            test,
            conn,
            sizes,
            iters: u("iters")?.max(1),
            duration: v
                .get("duration_s")
                .and_then(Value::as_f64)
                .filter(|d| d.is_finite() && *d > 0.0)
                // A hostile client's `duration_s: 1e300` must not panic `Duration::from_secs_f64`.
                .map(|d| {
                    Duration::try_from_secs_f64(d)
                        .map_err(|_| "client parameters: bad `duration_s`")
                })
                .transpose()?,
            qps: ranged("qps", 1, MAX_QPS)?,
            tx_depth: ranged("tx_depth", 1, MAX_TX_DEPTH)?,
            mtu: mtu_of(u32f("mtu")?).ok_or("client parameters: bad `mtu`")?,
            inline: ranged("inline", 0, roce_verbs::MAX_INLINE as u32)?,
            cq_mod: ranged("cq_mod", 1, MAX_TX_DEPTH)?,
            post_list: ranged("post_list", 1, MAX_TX_DEPTH)?,
            verify: v.get("verify").and_then(Value::as_bool).unwrap_or(true),
            infinite: v.get("infinite").and_then(Value::as_bool).unwrap_or(false),
            report_every: v
                .get("report_every_s")
                .and_then(Value::as_f64)
                .filter(|d| d.is_finite() && *d > 0.0)
                .and_then(|d| Duration::try_from_secs_f64(d).ok())
                .unwrap_or(Duration::from_secs(5)),
            bidir: v.get("bidir").and_then(Value::as_bool).unwrap_or(false),
            tclass: v
                .get("tclass")
                .map(|t| {
                    t.as_u64()
                        .and_then(|t| u8::try_from(t).ok())
                        .ok_or("client parameters: bad `tclass`")
                })
                .transpose()?
                .unwrap_or(0),
            debug_corrupt: v
                .get("debug_corrupt")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            ud_size_mtu: v
                .get("ud_size_mtu")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            // Local to each side: the server sets its own (`server_session`).
            qp_timeout: roce_verbs::ConnectOpts::default().timeout,
        };
        check_run_wrs(p.qps, p.tx_depth).map_err(|e| format!("client parameters: {e}"))?;
        Ok(p)
    }
}

/// Output options of one side.
#[derive(Clone, Debug)]
pub struct Output {
    /// Print tables / JSON (false for the in-process server of --loopback).
    pub print: bool,
    pub json: bool,
    pub gbits: bool,
    /// Wait on a completion channel with this moderation (`-e`).
    pub events: Option<Moderation>,
    /// Register the test buffer on huge pages (`--use_hugepages`).
    pub hugepages: bool,
    /// The banner's link type: the link the side opened ([`open_udp`]), or the simulated segment.
    pub link: String,
    /// `--output`: one number per size instead of the tables.
    pub level: Option<OutputLevel>,
    /// The progress line of a long run on a terminal (set by the client side, `bench::run_side`).
    pub progress: Option<progress::Progress>,
    /// `--report-both`: a `-b` table also shows each direction's line.
    pub report_both: bool,
}

/// The device name in banners: the device of the local RoCE address's interface, as `rocev2 devinfo` and `rocev2
/// stat` name it ([`roce_link::udp::device_name`], `rocev2_lo`), with the address.
fn devinfo_name(ctx: &Context) -> String {
    let gid = ctx.gid(0).unwrap_or_default();
    let addr = match gid.as_ipv4() {
        Some(v4) => IpAddr::V4(Ipv4Addr::from(v4)),
        None => IpAddr::V6(std::net::Ipv6Addr::from(gid.0)),
    };
    format!("{} ({addr})", roce_link::udp::device_name(addr))
}

/// Faults of this side's link: `(transmitted frames, received frames)`.
fn fault_config(a: &PerfArgs) -> Option<(FaultConfig, FaultConfig)> {
    if a.loss == 0.0
        && a.reorder == 0.0
        && a.dup == 0.0
        && a.corrupt == 0.0
        && a.ce == 0.0
        && a.cc.ce_rx == 0.0
    {
        return None;
    }
    let tx = FaultConfig {
        loss: a.loss,
        corrupt: a.corrupt,
        ce_mark: a.ce,
        reorder: a.reorder,
        reorder_depth: 3,
        reorder_max_hold: Duration::from_millis(1),
        duplicate: a.dup,
        ..FaultConfig::default()
    };
    let rx = FaultConfig {
        ce_mark: a.cc.ce_rx,
        ..FaultConfig::default()
    };
    Some((tx, rx))
}

fn engine_cfg(ip: IpAddr, seed: u64) -> EngineConfig {
    EngineConfig {
        mac: mac_of(ip),
        gids: vec![gid_of(ip)],
        seed,
        ..EngineConfig::default()
    }
}

fn wrap_link(
    base: SendLink,
    faults: Option<(FaultConfig, FaultConfig)>,
    seed: u64,
    pcap: Option<&PathBuf>,
) -> Result<SendLink, LinkError> {
    let mut l = base;
    if let Some((tx, rx)) = faults {
        l = Box::new(Faulty::new(l, tx, rx, seed));
    }
    if let Some(p) = pcap {
        let file = File::create(p).map_err(LinkError::Io)?;
        l = Box::new(Pcap::new(l, BufWriter::new(file), PcapMode::Both)?);
    }
    Ok(l)
}

fn runtime_cfg(a: &PerfArgs) -> RuntimeConfig {
    RuntimeConfig {
        pin_core: a.engine_core,
        ..RuntimeConfig::with_mode(a.progress)
    }
}

/// `--progress caller|thread`.
pub fn parse_progress(s: &str) -> Result<ProgressMode, String> {
    s.parse()
}

/// Receive buffer of the UDP link for a run of `p`: room for two of its largest messages (the kernel counts each
/// datagram with its overhead), at least the link's default 4 MiB and at most 64 MiB. A UC/UD message whose packets
/// overflow the buffer while the engine thread is not scheduled is lost for good, so a sweep up to 8 MiB needs more
/// than the default (`UdpConfig::socket_buffer`).
fn socket_buffer(p: &Params) -> usize {
    let largest = p.sizes.iter().copied().max().unwrap_or(0);
    usize::try_from(largest.saturating_mul(2))
        .unwrap_or(usize::MAX)
        .clamp(4 << 20, 64 << 20)
}

/// The banner's link type over the UDP link (kernel sockets on UDP 4791).
const LINK_UDP: &str = "Ethernet (RoCE v2, UDP 4791) on the UDP link (kernel sockets)";

/// The banner's link type after `--link xdp` fell back to the UDP link (the cause is on stderr, printed by
/// [`crate::xdplink::open_or_explain`]).
const LINK_XDP_FALLBACK: &str = "Ethernet (RoCE v2, UDP 4791) on the UDP link (kernel sockets): --link xdp fell \
                                 back, AF_XDP cannot be used (the cause is on stderr)";

/// The banner's link type over the AF_XDP link on `interface`.
fn link_xdp(interface: &str, zero_copy: bool) -> String {
    format!(
        "Ethernet (RoCE v2, UDP 4791) on the AF_XDP link ({interface}, {} mode)",
        if zero_copy { "zero-copy" } else { "copy" }
    )
}

/// Opens a device on a UdpLink bound to `local`, frames from `peer` (decorated per the flags; receive mode per
/// `--rx`; receive buffer per [`socket_buffer`]), or on an AF_XDP link with `--link xdp` when it can be used; also
/// returns the UDP link's counters for `--stats`, the receive mode in use, and the banner's link type naming the
/// link actually opened (`--link xdp` falls back to the UDP link when AF_XDP cannot be used).
fn open_udp(
    a: &PerfArgs,
    p: &Params,
    local: IpAddr,
    peer: IpAddr,
    seed: u64,
    pcap: bool,
) -> Result<(Context, Arc<SharedUdpStats>, RxMode, String), String> {
    let faults = fault_config(a);
    let pcap = if pcap { a.pcap.clone() } else { None };
    let link_stats = Arc::new(SharedUdpStats::default());
    let mut cfg = engine_cfg(local, seed);
    cfg.sched = shaping::sched_config(a, p, local);
    dcqcn::apply(&a.cc, &mut cfg)?;
    // Which link the factory opened (it runs inside `Context::open`, before it returns).
    let used = Arc::new(Mutex::new(String::new()));
    let open = |rx: RxMode| {
        let ucfg = UdpConfig {
            local_mac: mac_of(local),
            peer_mac: mac_of(peer),
            rx,
            socket_buffer: Some(socket_buffer(p)),
            ..UdpConfig::new(local)
        };
        let tap_stats = Arc::clone(&link_stats);
        let pcap = pcap.clone();
        let xdp = a.link == LinkKind::Xdp;
        let want_xdp = xdp;
        let used = Arc::clone(&used);
        Context::open(cfg.clone(), runtime_cfg(a), move || {
            let xdp = if xdp {
                crate::xdplink::open_or_explain("rocev2 perf", local, peer)?
            } else {
                None
            };
            if let Ok(mut u) = used.lock() {
                *u = match &xdp {
                    Some(l) => link_xdp(l.interface(), l.zero_copy()),
                    None if want_xdp => LINK_XDP_FALLBACK.to_owned(),
                    None => LINK_UDP.to_owned(),
                };
            }
            let base: SendLink = match xdp {
                Some(l) => l,
                None => Box::new(UdpTap::new(UdpLink::bind(ucfg)?, tap_stats)),
            };
            wrap_link(base, faults, seed ^ 0x5eed, pcap.as_ref())
        })
    };
    rxmode::open(a.rx, peer, "rocev2 perf", open)
        .map(|(c, rx)| {
            let link = used.lock().map(|u| u.clone()).unwrap_or_default();
            (c, Arc::clone(&link_stats), rx, link)
        })
        .map_err(|e| {
            let chain = source_chain(&e);
            let hint = if chain.contains("in use") && a.loopback {
                " (another RoCE stack or rocev2 run owns this address and port; with --loopback, choose a free pair \
                 with --loopback-ips A,B, or leave it out to get one)"
                    .to_owned()
            } else if chain.contains("in use") {
                format!(
                    " ({}; or run both ends in one process with --loopback)",
                    roce_link::device::in_use_hint(local, None)
                )
            } else {
                String::new()
            };
            format!("opening the RoCE device on {local} (UDP 4791): {e}: {chain}{hint}")
        })
}

/// Adds the `--rx packet` hint to a failed run whose UDP link (in socket mode) counted frames with a bad ICRC.
fn with_rx_hint(r: Result<(), String>, rx: RxMode, link: &SharedUdpStats) -> Result<(), String> {
    r.map_err(|e| {
        let bad = link
            .iter()
            .find(|(n, _)| *n == "rx_icrc_bad")
            .map_or(0, |(_, v)| v);
        match rxmode::icrc_hint(rx, bad) {
            Some(h) => format!("{e} ({bad} received frames failed the ICRC check; {h})"),
            None => e,
        }
    })
}

fn source_chain(e: &dyn std::error::Error) -> String {
    let mut s = String::new();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(&c.to_string());
        s.push_str("; ");
        cur = c.source();
    }
    s.trim_end_matches("; ").to_owned()
}

/// `--timeout` as a duration, 10 s when not given (checked positive in [`Params::from_args`]).
fn oob_timeout(a: &PerfArgs) -> Duration {
    a.timeout
        .and_then(|t| Duration::try_from_secs_f64(t).ok())
        .filter(|d| !d.is_zero())
        .unwrap_or(Duration::from_secs(10))
}

/// How long a server waits for its client: `--timeout` if given, otherwise for as long as it takes (perftest).
fn accept_timeout(a: &PerfArgs) -> Option<Duration> {
    a.timeout.map(|_| oob_timeout(a))
}

/// Entry point of `rocev2 perf`.
pub fn run(a: &PerfArgs) -> ExitCode {
    if a.test.is_none() {
        eprint!("{}", test_list());
        return ExitCode::from(2);
    }
    // One seed for the whole run: the one given, or a random one.
    let a = &PerfArgs {
        seed: Some(a.seed.unwrap_or_else(rand::random)),
        ..a.clone()
    };
    let params = match Params::from_args(a)
        .and_then(|(p, notes)| shaping::validate(a, &p).map(|()| (p, notes)))
    {
        Ok((p, notes)) => {
            for n in notes {
                eprintln!("rocev2 perf: note: {n}");
            }
            p
        }
        Err(e) => {
            eprintln!("rocev2 perf: {e}");
            return ExitCode::from(2);
        }
    };
    if let Err(e) = dcqcn::validate(&a.cc, a.loopback && a.link == LinkKind::Sim) {
        eprintln!("rocev2 perf: {e}");
        return ExitCode::from(2);
    }
    let out = Output {
        print: true,
        level: a.output,
        progress: None,
        link: if a.loopback && a.link == LinkKind::Sim {
            "simulated segment (in memory, --link sim; 100 Gb/s, 1 us)"
        } else {
            LINK_UDP
        }
        .to_owned(),
        json: a.json,
        gbits: a.report_gbits,
        report_both: a.report_both,
        hugepages: a.use_hugepages,
        events: a.events.then(|| Moderation {
            count: params.cq_mod,
            period: Duration::from_micros(a.cq_period_us),
            adaptive: a.adaptive,
        }),
    };
    if a.ib_dev.is_some() && !a.json {
        eprintln!("rocev2 perf: -d is ignored (the device is the UDP link on the local address)");
    }
    if a.gid_index.is_some() && !a.json {
        eprintln!(
            "rocev2 perf: -x is accepted; the GID in use is the IPv4-mapped GID of the local address"
        );
    }
    let devices = Devices::default();
    let metrics = match start_metrics(a, &devices) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("rocev2 perf: {e}");
            return ExitCode::from(1);
        }
    };
    let r = if a.perftest_compat {
        compat::run(a, &params, &out, &devices)
    } else if a.loopback {
        loopback(a, &params, &out, &devices)
    } else if let Some(addr) = &a.address {
        client(a, &params, addr, &out, None, &devices)
    } else {
        server(a, &out, None, &devices)
    };
    drop(metrics);
    if a.stats {
        devices.print_stats(a.json);
    }
    devices.warn_stalls();
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rocev2 perf: {e}");
            ExitCode::from(1)
        }
    }
}

/// `--stats`: the non-zero engine counters and UDP link counters (to stderr with `--json`, so stdout stays JSON).
fn print_stats(side: &str, ctx: &Context, link: Option<&SharedUdpStats>, json: bool) {
    match ctx.counters() {
        Ok(c) => {
            let mut text = format!("engine counters ({side}):\n");
            for (name, v) in c.iter() {
                if v != 0 {
                    text.push_str(&format!("  {name:<32} {v}\n"));
                }
            }
            text.push_str(&format!(
                "runtime ({side}, {:?} progress):",
                ctx.progress_mode()
            ));
            for (name, v) in ctx.runtime_stats().counters() {
                text.push_str(&format!(" {name} {v}"));
            }
            text.push('\n');
            if let Some(l) = link {
                // Taken on the engine thread (`Link::counters`: the UDP link reads the kernel's drop count now, so
                // drops at the very end of the run are in); the mirror, which lags, only if that call fails.
                let pairs: Vec<(&str, u64)> = match ctx.stats_snapshot() {
                    Ok(s) if !s.link.is_empty() => s.link,
                    _ => l.iter().collect(),
                };
                text.push_str(&format!("udp link counters ({side}):\n"));
                for (name, v) in pairs.into_iter().filter(|(_, v)| *v != 0) {
                    text.push_str(&format!("  {name:<32} {v}\n"));
                }
            }
            if json {
                eprint!("{text}");
            } else {
                print!("{text}");
            }
        }
        Err(e) => eprintln!("rocev2 perf: counters of the {side}: {e}"),
    }
}

fn loopback(a: &PerfArgs, params: &Params, out: &Output, devices: &Devices) -> Result<(), String> {
    // The claim on an automatically chosen pair lives as long as the run (see `free_loopback_pair`).
    let _claim: Option<std::os::unix::net::UnixDatagram>;
    let (srv_ip, cli_ip) = match a.loopback_ips.as_deref() {
        Some([s, c]) => (*s, *c),
        Some(_) => return Err("--loopback-ips takes two addresses".into()),
        None if a.link == LinkKind::Sim => (
            Ipv4Addr::new(127, 0, 0, 1).into(),
            Ipv4Addr::new(127, 0, 0, 2).into(),
        ),
        None => {
            let (s, c, claim) = free_loopback_pair()?;
            _claim = Some(claim);
            (s, c)
        }
    };
    let timeout = oob_timeout(a);
    let listener =
        TcpListener::bind((srv_ip, 0)).map_err(|e| format!("listening on {srv_ip}: {e}"))?;
    let port = listener.local_addr().map_err(|e| e.to_string())?.port();
    let sim = if a.link == LinkKind::Sim {
        let faults = fault_config(a);
        let pcap = a.pcap.clone();
        let seed = a.seed();
        let mut n = 0u64;
        let (c_srv, c_cli) =
            Context::sim_pair_with(runtime_cfg(a), SimConfig::default(), move |l| {
                n += 1;
                let cap = if n == 2 { pcap.as_ref() } else { None };
                wrap_link(l, faults, seed.wrapping_add(n), cap)
            })
            .map_err(|e| format!("opening the simulated devices: {e}"))?;
        Some((c_srv, c_cli))
    } else {
        None
    };
    let srv_args = a.clone();
    let srv_sim = sim.as_ref().map(|(s, _)| s.clone());
    let srv_out = Output {
        print: false,
        ..out.clone()
    };
    let srv_devices = devices.clone();
    let server = std::thread::Builder::new()
        .name("perf-server".into())
        .spawn(move || {
            let mut o =
                Oob::accept(&listener, Some(timeout), timeout).map_err(|e| e.to_string())?;
            server_session(&srv_args, &srv_out, &mut o, srv_sim, &srv_devices)
        })
        .map_err(|e| e.to_string())?;
    let mut client_args = a.clone();
    client_args.port = port;
    client_args.ip = Some(cli_ip);
    let cr = client(
        &client_args,
        params,
        &srv_ip.to_string(),
        out,
        sim.map(|(_, c)| c),
        devices,
    );
    let sr = server
        .join()
        .unwrap_or_else(|_| Err("the server thread panicked".into()));
    match (cr, sr) {
        (Ok(()), Ok(())) => Ok(()),
        (Err(c), _) => Err(c),
        (Ok(()), Err(s)) => Err(format!("server side: {s}")),
    }
}

/// The first pair 127.0.0.(2k+1), 127.0.0.(2k+2) that no other `--loopback` run has claimed and whose RoCE port
/// (UDP 4791) is free on both addresses (probed by binding). The claim is an abstract Unix socket named after the
/// pair (`rocev2-loopback-127.0.0.1`, in this network namespace, as the addresses are), returned to be held for the
/// whole run: two runs started at the same instant used to probe the same free pair and then both bind it, one failing
/// with "Address already in use"; the kernel lets only one bind the name, and drops the claim when the process ends.
/// Not the first pair gets a note on stderr.
fn free_loopback_pair() -> Result<(IpAddr, IpAddr, std::os::unix::net::UnixDatagram), String> {
    use std::os::linux::net::SocketAddrExt as _;
    let free = |ip: Ipv4Addr| std::net::UdpSocket::bind((ip, roce_wire::ROCE_V2_PORT)).is_ok();
    let claim = |ip: Ipv4Addr| {
        std::os::unix::net::SocketAddr::from_abstract_name(format!("rocev2-loopback-{ip}"))
            .and_then(|a| std::os::unix::net::UnixDatagram::bind_addr(&a))
            .ok()
    };
    for k in 0..127u8 {
        let (s, c) = (
            Ipv4Addr::new(127, 0, 0, 2 * k + 1),
            Ipv4Addr::new(127, 0, 0, 2 * k + 2),
        );
        let Some(held) = claim(s) else { continue };
        if free(s) && free(c) {
            if k > 0 {
                eprintln!(
                    "rocev2 perf: note: UDP port 4791 of 127.0.0.1/127.0.0.2 is in use (another run?); using {s} and {c} \
                     (--loopback-ips chooses the pair)"
                );
            }
            return Ok((s.into(), c.into(), held));
        }
    }
    Err("no loopback address pair 127.0.0.x with a free UDP port 4791; choose one with --loopback-ips A,B".into())
}

fn server(
    a: &PerfArgs,
    out: &Output,
    sim: Option<Context>,
    devices: &Devices,
) -> Result<(), String> {
    let ip = a.ip.unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED));
    let listener = TcpListener::bind((ip, a.port))
        .map_err(|e| format!("listening on {ip}:{}: {e}", a.port))?;
    if out.print && !out.json && out.level.is_none() {
        println!(
            "************************************\n* Waiting for client to connect... *\n************************************"
        );
    }
    // Wait for a client (no longer than --timeout if given); once one is connected, every read is bounded by
    // --timeout.
    let mut o =
        Oob::accept(&listener, accept_timeout(a), oob_timeout(a)).map_err(|e| e.to_string())?;
    server_session(a, out, &mut o, sim, devices)
}

fn server_session(
    a: &PerfArgs,
    out: &Output,
    o: &mut Oob,
    sim: Option<Context>,
    devices: &Devices,
) -> Result<(), String> {
    let hello = o.hello(None).map_err(|e| e.to_string())?;
    let mut params = match Params::from_json(&hello) {
        Ok(p) => Params {
            qp_timeout: a.qp_timeout,
            ..p
        },
        Err(e) => {
            o.send_error(&e);
            return Err(e);
        }
    };
    let (ctx, link) = match sim {
        Some(c) => (c, None),
        None => {
            let local = o.local_addr().map_err(|e| e.to_string())?.ip();
            let peer = o.peer_addr().ip();
            if let Err(e) = apply_port_mtu(a, &mut params, local, false, out.print) {
                o.send_error(&e);
                return Err(e);
            }
            match open_udp(
                a,
                &params,
                local,
                peer,
                a.seed().wrapping_mul(2),
                a.address.is_none() && !a.loopback,
            ) {
                Ok((c, s, rx, name)) => (c, Some((s, rx, name))),
                Err(e) => {
                    o.send_error(&e);
                    return Err(e);
                }
            }
        }
    };
    devices.add("server", &ctx, link.as_ref().map(|(s, _, _)| s));
    let out = &link_named(out, link.as_ref().map(|(_, _, n)| n));
    let mut r = dcqcn::with_rate_log(&a.cc, &ctx, !a.loopback, || {
        bench::run_side(&ctx, &params, o, false, out)
    });
    if let Some((s, rx, _)) = &link {
        r = with_rx_hint(r, *rx, s);
    }
    r
}

/// One device of this run, with its UDP link's counters.
struct RunDevice {
    side: &'static str,
    ctx: Context,
    link: Option<Arc<SharedUdpStats>>,
}

/// The devices of this run (one; two with `--loopback`), added by each side as it opens its own: `--metrics`
/// exports all of them while the run goes on, `--stats` prints them once the run has ended, client first.
#[derive(Clone, Default)]
pub(crate) struct Devices(Arc<Mutex<Vec<RunDevice>>>);

impl Devices {
    fn add(&self, side: &'static str, ctx: &Context, link: Option<&Arc<SharedUdpStats>>) {
        if let Ok(mut v) = self.0.lock() {
            v.push(RunDevice {
                side,
                ctx: ctx.clone(),
                link: link.cloned(),
            });
        }
    }

    /// `(side, device)` pairs, client first.
    fn list(&self) -> Vec<(String, Context)> {
        let mut v: Vec<(String, Context)> = self
            .0
            .lock()
            .map(|v| {
                v.iter()
                    .map(|d| (d.side.to_owned(), d.ctx.clone()))
                    .collect()
            })
            .unwrap_or_default();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }

    /// Says on stderr, for every device of the run whose capture could not be written, how many frames went
    /// uncaptured, and for every device that had local ACK timeouts, how many and what they mean: each
    /// is a stall of at least the ACK timeout that the bandwidth or latency figures hide (a run with one still
    /// completes, after go-back-N). Silent when there were none.
    fn warn_stalls(&self) {
        let Ok(mut v) = self.0.lock() else { return };
        v.sort_by_key(|d| d.side);
        for d in v.iter() {
            // A capture that could not be written (`--pcap` on a full disk): the run went on, uncaptured.
            if let Ok(snap) = d.ctx.stats_snapshot()
                && let Some(&(_, n)) = snap.link.iter().find(|(k, _)| *k == "pcap_write_errors")
                && n > 0
            {
                eprintln!(
                    "rocev2 perf: note: the {}'s capture could not be written for {n} frame{} (they were carried, \
                     not captured: is the disk full?)",
                    d.side,
                    if n == 1 { "" } else { "s" }
                );
            }
            let Ok(c) = d.ctx.counters() else { continue };
            let n = c.local_ack_timeout_err;
            if n > 0 {
                eprintln!(
                    "rocev2 perf: note: the {} had {n} local ACK timeout{} ({} packets retransmitted): each is a \
                     stall of at least the ACK timeout (-u) in which the peer's ACKs did not come — a lost packet, \
                     or a side that did not run for that long (`--stats` shows the counters)",
                    d.side,
                    if n == 1 { "" } else { "s" },
                    c.retransmitted_pkts
                );
            }
        }
    }

    /// `--stats` for every device, client first (the order is fixed, whichever side ended first).
    fn print_stats(&self, json: bool) {
        let Ok(mut v) = self.0.lock() else { return };
        v.sort_by_key(|d| d.side);
        for d in v.iter() {
            print_stats(d.side, &d.ctx, d.link.as_deref(), json);
        }
    }
}

/// `--metrics ADDR`: serves the devices of this run while it goes on.
fn start_metrics(
    a: &PerfArgs,
    devices: &Devices,
) -> Result<Option<metrics::MetricsServer>, String> {
    let Some(addr) = &a.metrics else {
        return Ok(None);
    };
    let d = devices.clone();
    let m = metrics::MetricsServer::start(addr, Arc::new(move || d.list()))
        .map_err(|e| format!("--metrics {addr}: {e}"))?;
    eprintln!(
        "rocev2 perf: serving metrics on http://{}/metrics",
        m.addr()
    );
    Ok(Some(m))
}

fn client(
    a: &PerfArgs,
    params: &Params,
    host: &str,
    out: &Output,
    sim: Option<Context>,
    devices: &Devices,
) -> Result<(), String> {
    let timeout = oob_timeout(a);
    let mut o = Oob::connect(host, a.port, a.ip, timeout).map_err(|e| match &e {
        // A name that does not resolve says so; a refused or unanswered connect asks about the server.
        OobError::Io { .. } | OobError::Timeout { .. } => {
            format!("{e} (is a `rocev2 perf` server running there?)")
        }
        _ => e.to_string(),
    })?;
    let mut params = params.clone();
    // `--link sim`: the simulated segment carries 4096-byte packets; otherwise cap by the local device.
    if sim.is_none() {
        let local = o.local_addr().map_err(|e| e.to_string())?.ip();
        if let Err(e) = apply_port_mtu(a, &mut params, local, true, out.print) {
            o.send_error(&e);
            return Err(e);
        }
    }
    let params = &params;
    o.hello(Some(params.to_json())).map_err(|e| e.to_string())?;
    let (ctx, link) = match sim {
        Some(c) => (c, None),
        None => {
            let local = o.local_addr().map_err(|e| e.to_string())?.ip();
            let peer = o.peer_addr().ip();
            match open_udp(
                a,
                params,
                local,
                peer,
                a.seed().wrapping_mul(2).wrapping_add(1),
                true,
            ) {
                Ok((c, s, rx, name)) => (c, Some((s, rx, name))),
                Err(e) => {
                    o.send_error(&e);
                    return Err(e);
                }
            }
        }
    };
    devices.add("client", &ctx, link.as_ref().map(|(s, _, _)| s));
    let out = &link_named(out, link.as_ref().map(|(_, _, n)| n));
    let mut r = dcqcn::with_rate_log(&a.cc, &ctx, true, || {
        bench::run_side(&ctx, params, &mut o, true, out)
    });
    if let Some((s, rx, _)) = &link {
        r = with_rx_hint(r, *rx, s);
    }
    r
}

/// `out` with the banner's link type of the link a side opened (`None`: the simulated segment, as `out` says).
fn link_named(out: &Output, link: Option<&String>) -> Output {
    Output {
        link: link.map_or_else(|| out.link.clone(), Clone::clone),
        ..out.clone()
    }
}

/// The banner of either side, perftest's header block (printed by `bench::run_side` once the exchange has settled
/// the MTU both sides use; the address block follows it). `link` names the link (`--link`).
fn print_banner(p: &Params, ctx: &Context, o: &Oob, link: &str) {
    let gid = ctx.gid(0).unwrap_or_default();
    println!("{}", report::footer());
    println!("                    {}", p.test.title());
    println!(
        " Dual-port       : OFF\t\tDevice         : {}",
        devinfo_name(ctx)
    );
    println!(
        " Number of qps   : {}\t\tTransport type : IB (RoCE v2, rocev2 software RNIC)",
        p.qps
    );
    println!(
        " Connection type : {}\t\tUsing SRQ      : OFF",
        p.conn.name()
    );
    println!(" TX depth        : {}", p.tx_depth);
    if p.test.is_bw() {
        println!(" CQ Moderation   : {}", p.cq_mod);
        println!(" Post List       : {}", p.post_list);
    }
    println!(" Mtu             : {}[B]", p.mtu.bytes());
    println!(" Link type       : {link}");
    println!(" GID index       : 0 ({gid})");
    println!(" Max inline data : {}[B]", p.inline);
    if p.tclass != 0 {
        println!(" Traffic class   : {} (DSCP {})", p.tclass, p.tclass >> 2);
    }
    // Who is on the other end, in the user's terms (perftest's programs need --perftest-compat instead).
    let peer = match o.format() {
        crate::oob::OobFormat::Rocev2V1 => {
            "rocev2 perf; perftest's ib_* programs pair with --perftest-compat"
        }
    };
    println!(" Peer            : {} ({peer})", o.peer_addr());
    println!(
        " Data verification : {}",
        if p.verify { "ON" } else { "OFF" }
    );
}
