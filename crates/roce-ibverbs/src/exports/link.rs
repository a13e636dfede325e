//! The link a device opens: the UDP link, or with `rocev2 run --link xdp` (`roce_link::device::ENV_LINK`) the
//! AF_XDP link, through the same choice `rocev2 perf --link xdp` makes (`roce_link::xdp::open_or_explain`): when
//! AF_XDP cannot be used here (no privilege, no kernel support, a loopback address, another XDP program on the
//! interface) the program is told why on stderr and runs over UDP; when another process owns the address the
//! device is refused (one process per address over AF_XDP, docs/DEVICE.md "Link").

use std::time::Duration;

use roce_link::device::{DeviceLink, DeviceSpec, ENV_PCAP};
use roce_link::xdp::{XdpChoice, open_or_explain};
use roce_link::{LinkError, Pcap, PcapMode, UdpConfig, UdpLink};
use roce_verbs::SendLink;

/// Opens the link of `spec` (on the runtime's thread, when the device's runtime starts); `udp` is the UDP link's
/// configuration, used unless the AF_XDP link opens. The lines of the choice go to stderr, prefixed
/// `rocev2 libibverbs: `. With `roce_link::device::ENV_PCAP` (`rocev2 run --pcap FILE`) the link is wrapped in a
/// capture of both directions to that file, unbuffered.
///
/// No peer is known when a program opens its device, so no neighbour entry is resolved ahead: frames to a peer
/// whose entry the kernel has not resolved yet are dropped and counted while the kernel resolves it, and RC
/// retransmits them (the programs' out-of-band TCP exchange usually resolves it first).
///
/// # Errors
///
/// The UDP link's bind errors; [`LinkError::Io`] of kind `AddrInUse` when `--link xdp` finds the address taken;
/// the capture file cannot be created or written.
pub(super) fn open(spec: &DeviceSpec, udp: UdpConfig) -> Result<SendLink, LinkError> {
    let link = open_bare(spec, udp)?;
    let Some(file) = std::env::var_os(ENV_PCAP) else {
        return Ok(link);
    };
    let sink = std::fs::File::create(&file).map_err(|e| {
        LinkError::Io(std::io::Error::new(
            e.kind(),
            format!("{ENV_PCAP}: creating {}: {e}", file.to_string_lossy()),
        ))
    })?;
    Ok(Box::new(Pcap::new(link, sink, PcapMode::Both)?))
}

/// The link of `spec` without the capture.
fn open_bare(spec: &DeviceSpec, udp: UdpConfig) -> Result<SendLink, LinkError> {
    if spec.link == DeviceLink::Xdp {
        match open_or_explain(spec.ip, None, Duration::ZERO)? {
            XdpChoice::Xdp(l, lines) => {
                for line in lines {
                    eprintln!("rocev2 libibverbs: {line}");
                }
                return Ok(l);
            }
            XdpChoice::Udp(line) => eprintln!("rocev2 libibverbs: {line}"),
        }
    }
    UdpLink::bind(udp).map(|l| Box::new(l) as SendLink)
}
