//! `--link xdp` of `rocev2 perf` and `rocev2 pingpong`: the AF_XDP link ([`roce_link::XdpLink`]) when it can be
//! used, otherwise a message naming the cause (no privilege, no kernel support, no such interface, another XDP
//! program on the interface) and the UDP link, so the run completes ([`roce_link::xdp::open_or_explain`], which
//! the `libibverbs.so.1` under `rocev2 run --link xdp` uses too).

use std::net::IpAddr;
use std::time::Duration;

use roce_link::xdp::{XdpChoice, open_or_explain as choose};
use roce_link::{LinkError, XdpLink};

/// How long a new AF_XDP link waits for the kernel's neighbour entry of the peer before traffic starts (the
/// first frames without one would be dropped and retransmitted).
const RESOLVE_WAIT: Duration = Duration::from_secs(1);

/// Opens an AF_XDP link on the interface that owns `local`, with the neighbour entry of `peer` resolved, and says
/// so on stderr (`TOOL: AF_XDP link on IF ...`); when AF_XDP cannot be used prints
/// `TOOL: --link xdp: AF_XDP cannot be used (CAUSE); using the UDP link` and returns `Ok(None)` (the caller then
/// opens its UDP link).
///
/// # Errors
///
/// Another process owns UDP 4791 on `local` (one process per address over AF_XDP).
pub fn open_or_explain(
    tool: &str,
    local: IpAddr,
    peer: IpAddr,
) -> Result<Option<Box<XdpLink>>, LinkError> {
    Ok(match choose(local, Some(peer), RESOLVE_WAIT)? {
        XdpChoice::Xdp(l, lines) => {
            for line in lines {
                eprintln!("{tool}: {line}");
            }
            Some(l)
        }
        XdpChoice::Udp(line) => {
            eprintln!("{tool}: {line}");
            None
        }
    })
}
