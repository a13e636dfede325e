//! `--link xdp` of `rocev2 perf` and `rocev2 pingpong`: the AF_XDP link ([`roce_link::XdpLink`]) when it can be
//! used, otherwise a message naming the cause (no privilege, no kernel support, no such interface, another XDP
//! program on the interface) and the UDP link, so the run completes.

use std::net::IpAddr;
use std::time::Duration;

use roce_link::{XdpConfig, XdpLink};

/// How long a new AF_XDP link waits for the kernel's neighbour entry of the peer before traffic starts (the
/// first frames without one would be dropped and retransmitted).
const RESOLVE_WAIT: Duration = Duration::from_secs(1);

/// The error and its sources, joined with ": ".
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

/// Opens an AF_XDP link on the interface that owns `local`, with the neighbour entry of `peer` resolved; on
/// failure prints `TOOL: --link xdp: AF_XDP cannot be used (CAUSE); using the UDP link` on stderr and returns
/// `None` (the caller then opens its UDP link).
pub fn open_or_explain(tool: &str, local: IpAddr, peer: IpAddr) -> Option<XdpLink> {
    if local.is_loopback() {
        // `lo` has no neighbour table to address frames with, and both ends of a loopback run share it.
        eprintln!(
            "{tool}: --link xdp: AF_XDP cannot be used on a loopback address ({local}); using the UDP link"
        );
        return None;
    }
    match XdpLink::bind(XdpConfig::new(local)) {
        Ok(mut l) => {
            if !peer.is_unspecified() && !l.resolve(peer, RESOLVE_WAIT) {
                eprintln!(
                    "{tool}: --link xdp: no neighbour entry for {peer} on {} yet; the first frames wait for it",
                    l.interface()
                );
            }
            eprintln!(
                "{tool}: AF_XDP link on {} ({} receive queue(s), {} mode)",
                l.interface(),
                l.queues(),
                if l.zero_copy() { "zero-copy" } else { "copy" }
            );
            Some(l)
        }
        Err(e) => {
            eprintln!(
                "{tool}: --link xdp: AF_XDP cannot be used ({}); using the UDP link",
                chain(&e)
            );
            None
        }
    }
}
