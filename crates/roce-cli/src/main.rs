//! `rocev2`: command-line front end of the rocev2 software RoCE v2 stack.
//!
//! Subcommands:
//! * `decode FILE [--json]` — print one line per RoCE v2 packet of a pcap/pcapng capture
//!   (see [`decode`]).
//!
//! * `perf TEST [ADDRESS] [--loopback]` — perftest-style bandwidth and latency tests over the rocev2
//!   runtime (see [`perf`]).
//!
//! * `pingpong [rc|ud] [SERVER]` — `ibv_rc_pingpong` / `ibv_ud_pingpong` compatible test that interoperates
//!   with the rdma-core tools and Linux Soft-RoCE (see [`pingpong`]).
//!
//! * `devinfo [-d DEV] [-v]` — the devices of this host as `ibv_devinfo` shows them (see [`devinfo`]).
//!
//! * `stat [--json] [-w SECS] [--qp N]` — live counters of every rocev2 device on this host (see [`stat`]).
//!
//! * `run [--ip ADDR] -- PROGRAM ARGS` — runs an unmodified libibverbs program (`ibv_rc_pingpong`, perftest …)
//!   on the rocev2 RNIC through rocev2's `libibverbs.so.1` (see [`run`]).
//!
//! * `bench engine [--json]` — the engine's send-path cost per core on a null link (see [`bench`]).
//!
//! * `cc trace --profile paper|ns3_mlx|nvidia --cnp-us T1,T2,... [--plot FILE.svg]` — the DCQCN reaction point
//!   driven through a CNP schedule, JSON in the schema of `testdata/dcqcn/rp_reference.py` (see [`cc`]).

mod bench;
mod capture;
mod cc;
mod decode;
mod devinfo;
mod link;
mod oob;
mod perf;
mod pingpong;
mod plotfont;
mod run;
mod rxmode;
mod sim;
mod stat;
mod xdplink;

use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Software RoCE v2 toolkit.
#[derive(Debug, Parser)]
#[command(name = "rocev2", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Decode the RoCE v2 packets (UDP port 4791) of a pcap or pcapng capture.
    ///
    /// Prints one line per RoCE packet; other packets are skipped and counted in a
    /// summary on stderr. Exit status: 0 when every RoCE packet is well formed with a
    /// good ICRC, 1 otherwise, 2 when the file cannot be read.
    ///
    /// A line: frame number, seconds since the first frame, source > destination
    /// (IP:UDP port), transport and opcode, then the BTH: qp= destination QPN and psn=
    /// packet sequence number (both 24-bit, in hex as `rocev2 perf --stats` and
    /// `rocev2 stat` print them), A= AckReq bit, pad= pad bytes, len= payload bytes; the
    /// extension headers present (reth, aeth, deth, immdt, ...); the BTH flags that are
    /// set: SE (solicited event), MigReq (path migration state; Mellanox NICs and rocev2
    /// set it on RC, Linux rxe does not; receivers ignore it), FECN, BECN (set in CNPs);
    /// pkey= when not the default 0xffff; icrc=ok or bad (docs/spec/ROCEV2.md §1.5, §3).
    Decode(DecodeArgs),
    /// perftest-style bandwidth/latency tests: `rocev2 perf write-bw --loopback`, server `rocev2 perf send-bw`,
    /// client `rocev2 perf send-bw HOST`.
    Perf(Box<perf::PerfArgs>),
    /// ibv_rc_pingpong / ibv_ud_pingpong compatible test: server `rocev2 pingpong [rc|ud]`, client
    /// `rocev2 pingpong [rc|ud] SERVER`; interoperates with the rdma-core tools (their -g is the index of the
    /// IPv4-mapped GID: 1 on Linux rxe, 0 on rocev2 under `rocev2 run`).
    Pingpong(Box<pingpong::PingpongArgs>),
    /// Run an unmodified libibverbs program (ibv_devinfo, ibv_rc_pingpong, ib_write_bw ...) on the rocev2 RNIC:
    /// `rocev2 run [--ip ADDR] -- PROGRAM ARGS` puts rocev2's libibverbs.so.1 first on LD_LIBRARY_PATH (device
    /// `rocev2_<interface>` on ADDR, GID ::ffff:ADDR) and executes the program.
    Run(run::RunArgs),
    /// Benchmarks: `rocev2 bench engine [--json]` measures the engine's send path per core on a null link.
    Bench(bench::BenchArgs),
    /// The counters of every rocev2 device running in this network namespace, per device and per QP, read live
    /// from the processes (as `rdma statistic`; programs in other namespaces are not shown), with the send-queue depth, retransmission rate (flagged above 5 %), doorbell
    /// rate and WQEs per doorbell; `--qp N` dumps one QP. `-w SECS` watches, `--json` for scripts.
    Stat(stat::StatArgs),
    /// The rocev2 devices of this host (one per network interface with an IP address) as `ibv_devinfo [-v]`
    /// shows RDMA devices: port state, active MTU, GID table with types, limits (-v), programs (of this network
    /// namespace) using each.
    Devinfo(devinfo::DevinfoArgs),
    /// Congestion control: `rocev2 cc trace` drives the DCQCN reaction point through a CNP schedule (JSON in the
    /// schema of testdata/dcqcn/rp_reference.py, optional SVG plot).
    Cc(cc::CcArgs),
    /// Congestion-control simulator: `rocev2 sim SCENARIO.toml [--json] [--csv DIR] [--plot DIR]` runs the
    /// product's engines behind an ECN-marking switch (crates/roce-sim; scenarios E1-E8 in its scenarios/);
    /// `--export-ns3 DIR` writes the scenario as HPCC ns-3 input instead (docs/SIMULATOR.md).
    Sim(sim::SimArgs),
}

#[derive(Debug, clap::Args)]
struct DecodeArgs {
    /// Capture file (pcap or pcapng; Ethernet, Linux cooked SLL/SLL2 or raw IP).
    file: PathBuf,
    /// Print one JSON object per RoCE packet per line instead of text.
    ///
    /// Keys — integers: frame, timestamp_ns, opcode, dest_qp, psn, pad, pkey, ip_version,
    /// dscp, ecn, ttl, udp_sport, udp_dport, payload_len, icrc, udp_checksum; booleans:
    /// ack_req, se, mig_req, becn, fecn, icrc_ok, ip_checksum_ok, udp_checksum_ok;
    /// strings: opcode_name, src_ip, dst_ip. When present: vlan {vid, pcp}, reth {va, rkey,
    /// dma_len}, aeth {syndrome, msn}, immdt, ieth, deth {qkey, src_qp}, atomic_eth {va,
    /// rkey, swap_add, compare}, atomic_ack_eth {orig}, feth (integers), and error (string)
    /// for a bad packet. A packet that cannot be parsed has only frame, timestamp_ns,
    /// icrc_ok (null) and error.
    #[arg(long)]
    json: bool,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Decode(args) => decode_cmd(&args),
        Command::Perf(args) => perf::run(&args),
        Command::Pingpong(args) => pingpong::run(&args),
        Command::Stat(args) => stat::run(&args),
        Command::Devinfo(args) => devinfo::run(&args),
        Command::Run(args) => run::run(&args),
        Command::Bench(args) => bench::run(&args),
        Command::Cc(args) => cc::run(&args),
        Command::Sim(args) => sim::run(&args),
    }
}

/// Exit status: 0 all RoCE packets good; 1 some RoCE packet bad, some packet's link
/// layer not decodable, or the file damaged after its header; 2 the file cannot be read
/// at all.
fn decode_cmd(args: &DecodeArgs) -> ExitCode {
    let cap = match capture::CaptureFile::open(&args.file) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("rocev2: {}: {e}", args.file.display());
            return ExitCode::from(2);
        }
    };
    let format = if args.json {
        decode::Format::Json
    } else {
        decode::Format::Text
    };
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let result = decode::run(&cap, format, &mut out).and_then(|r| out.flush().map(|()| r));
    let (summary, damage) = match result {
        Ok(r) => r,
        // A closed pipe (`rocev2 decode f | head`) is not an error worth a message.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => return ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rocev2: writing output: {e}");
            return ExitCode::from(2);
        }
    };
    eprintln!("{}", summary.line());
    if let Some(d) = &damage {
        eprintln!("rocev2: {}: {d}", args.file.display());
    }
    if summary.roce_bad == 0 && summary.link_errors == 0 && damage.is_none() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}
