//! The source address the kernel would use towards a destination (`rdma_resolve_addr` without a source): a UDP
//! socket `connect`ed to the destination and read back with `getsockname` — the kernel's route lookup, no packet
//! sent. One small module so a netlink `RTM_GETROUTE` / `RTM_GETNEIGH` lookup (`docs/RDMACM.md` §5: the output
//! interface, the neighbour's MAC) can replace it; on UDP links the MAC is not needed (the kernel routes by IP).

use std::net::{IpAddr, SocketAddr, UdpSocket};

/// The local address of the route to `dst`, or the error of the lookup (`ENETUNREACH` and the like).
pub fn source_for(dst: IpAddr) -> std::io::Result<IpAddr> {
    let any: IpAddr = match dst {
        IpAddr::V4(_) => IpAddr::from([0u8; 4]),
        IpAddr::V6(_) => IpAddr::from([0u16; 8]),
    };
    let s = UdpSocket::bind(SocketAddr::new(any, 0))?;
    // Any port: connecting a UDP socket only looks the route up.
    s.connect(SocketAddr::new(dst, 9))?;
    Ok(s.local_addr()?.ip())
}
