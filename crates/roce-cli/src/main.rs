//! `rocev2`: command-line front end of the rocev2 software RoCE v2 stack.
//!
//! Subcommands:
//! * `decode FILE [--json]` — print one line per RoCE v2 packet of a pcap/pcapng capture
//!   (see [`decode`]).
//!
//! `perf`, `pingpong` and `stats` will be added as further subcommands.

mod capture;
mod link;

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
    Decode(DecodeArgs),
}

#[derive(Debug, clap::Args)]
struct DecodeArgs {
    /// Capture file (pcap or pcapng; Ethernet, Linux cooked SLL/SLL2 or raw IP).
    file: PathBuf,
    /// Print one JSON object per RoCE packet per line instead of text.
    #[arg(long)]
    json: bool,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Decode(args) => {
            let cap = match capture::CaptureFile::open(&args.file) {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("rocev2: {}: {e}", args.file.display());
                    return ExitCode::from(2);
                }
            };
            let mut n = 0u64;
            let mut scratch = Vec::new();
            let walk = cap.for_each_record(|r| {
                if link::to_ethernet(r.link, r.data, &mut scratch).is_ok() {
                    n += 1;
                    println!(
                        "{n} {:?} {} of {} bytes",
                        r.timestamp,
                        r.data.len(),
                        r.orig_len
                    );
                }
            });
            eprintln!("{n} frames ({:?}, json={})", cap.format(), args.json);
            match walk {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("rocev2: {e}");
                    ExitCode::from(1)
                }
            }
        }
    }
}
