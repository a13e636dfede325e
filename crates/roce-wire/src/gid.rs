//! [`Gid`]: the 128-bit global identifier of a RoCE v2 port.
//!
//! On RoCE v2 the GID *is* the IP address of the port (`ROCEV2.md §1.2`,
//! IBTA Vol 1 Annex A17.4.5.1): an IPv6 address as it is, an IPv4 address in
//! its IPv4-mapped form `::ffff:a.b.c.d` (bytes 0..10 zero, bytes 10..12
//! `ff ff`, bytes 12..16 the IPv4 address in network order). Linux rxe builds
//! its GID table the same way (`drivers/infiniband/core/roce_gid_mgmt.c`:
//! the IPv4-mapped entry is the one `ibv_*_pingpong -g 1` / perftest `-x 1`
//! select on an IPv4-only netdev).
//!
//! The textual forms supported here are the two the RDMA tools print:
//!
//! * the IPv6 presentation form (`::ffff:198.18.0.1`, `fe80::1`), which is
//!   what `ibv_rc_pingpong` prints after `GID` and what [`Gid`]'s `Display`
//!   writes; [`Gid::from_str`](core::str::FromStr) also accepts a bare IPv4
//!   address and maps it;
//! * 32 lowercase hex digits, the 16 bytes in wire order, as the rdma-core
//!   pingpong exchange carries them (`00000000000000000000ffffc6120001`):
//!   [`Gid::hex`] / [`Gid::parse_hex`].

use core::fmt;
use core::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use core::str::FromStr;

use crate::{Error, Result};

/// A 16-byte GID in wire order (`ROCEV2.md §1.2`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Gid([u8; 16]);

impl Gid {
    /// The all-zero GID. The rdma-core pingpong tools send it when no GID
    /// index (`-g`) is given; on RoCE it cannot address anything.
    pub const ZERO: Gid = Gid([0; 16]);

    /// Wraps 16 bytes in wire order.
    #[inline]
    pub const fn from_bytes(bytes: [u8; 16]) -> Self {
        Gid(bytes)
    }

    /// The 16 bytes in wire order.
    #[inline]
    pub const fn to_bytes(self) -> [u8; 16] {
        self.0
    }

    /// The 16 bytes in wire order, borrowed.
    #[inline]
    pub const fn as_bytes(&self) -> &[u8; 16] {
        &self.0
    }

    /// The IPv4-mapped GID of `addr`: `::ffff:a.b.c.d`.
    #[inline]
    pub const fn from_ipv4(addr: Ipv4Addr) -> Self {
        let o = addr.octets();
        Gid([
            0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, o[0], o[1], o[2], o[3],
        ])
    }

    /// The GID of an IPv6 address: its 16 bytes unchanged.
    #[inline]
    pub const fn from_ipv6(addr: Ipv6Addr) -> Self {
        Gid(addr.octets())
    }

    /// The GID of an IP address: IPv4-mapped for IPv4, unchanged for IPv6.
    #[inline]
    pub const fn from_ip(addr: IpAddr) -> Self {
        match addr {
            IpAddr::V4(a) => Gid::from_ipv4(a),
            IpAddr::V6(a) => Gid::from_ipv6(a),
        }
    }

    /// The IPv4 address if this is an IPv4-mapped GID (`::ffff:a.b.c.d`),
    /// else `None`.
    #[inline]
    pub const fn to_ipv4_mapped(self) -> Option<Ipv4Addr> {
        let b = self.0;
        if b[0] == 0
            && b[1] == 0
            && b[2] == 0
            && b[3] == 0
            && b[4] == 0
            && b[5] == 0
            && b[6] == 0
            && b[7] == 0
            && b[8] == 0
            && b[9] == 0
            && b[10] == 0xff
            && b[11] == 0xff
        {
            Some(Ipv4Addr::new(b[12], b[13], b[14], b[15]))
        } else {
            None
        }
    }

    /// The IP address a RoCE v2 frame to this GID is sent to: the IPv4
    /// address of an IPv4-mapped GID, otherwise the GID as an IPv6 address.
    #[inline]
    pub fn to_ip(self) -> IpAddr {
        match self.to_ipv4_mapped() {
            Some(a) => IpAddr::V4(a),
            None => IpAddr::V6(Ipv6Addr::from(self.0)),
        }
    }

    /// True for the all-zero GID.
    #[inline]
    pub const fn is_zero(self) -> bool {
        u128::from_be_bytes(self.0) == 0
    }

    /// A `Display` adapter writing the 32 lowercase hex digits of the
    /// rdma-core pingpong exchange (bytes in wire order, no separators).
    #[inline]
    pub const fn hex(self) -> GidHex {
        GidHex(self)
    }

    /// Parses exactly 32 hex digits (either case), the 16 bytes in wire
    /// order, as [`Gid::hex`] writes them.
    ///
    /// # Errors
    ///
    /// [`Error::Truncated`] if `s` is not 32 characters long,
    /// [`Error::Malformed`] if a character is not a hex digit.
    pub fn parse_hex(s: &str) -> Result<Self> {
        let s = s.as_bytes();
        if s.len() != 32 {
            return Err(Error::Truncated);
        }
        let mut out = [0u8; 16];
        for (i, pair) in s.chunks_exact(2).enumerate() {
            let hi = hex_val(pair[0]).ok_or(Error::Malformed)?;
            let lo = hex_val(pair[1]).ok_or(Error::Malformed)?;
            out[i] = (hi << 4) | lo;
        }
        Ok(Gid(out))
    }
}

fn hex_val(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

impl From<Ipv4Addr> for Gid {
    fn from(a: Ipv4Addr) -> Self {
        Gid::from_ipv4(a)
    }
}

impl From<Ipv6Addr> for Gid {
    fn from(a: Ipv6Addr) -> Self {
        Gid::from_ipv6(a)
    }
}

impl From<IpAddr> for Gid {
    fn from(a: IpAddr) -> Self {
        Gid::from_ip(a)
    }
}

impl From<[u8; 16]> for Gid {
    fn from(b: [u8; 16]) -> Self {
        Gid(b)
    }
}

impl fmt::Display for Gid {
    /// The IPv6 presentation form, as `ibv_rc_pingpong` prints it:
    /// `::ffff:198.18.0.1` for an IPv4-mapped GID, `::` for zero.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&Ipv6Addr::from(self.0), f)
    }
}

impl FromStr for Gid {
    type Err = Error;

    /// Accepts the IPv6 presentation form (`::ffff:198.18.0.1`, `fe80::1`)
    /// or a bare IPv4 address (mapped, `198.18.0.1` → `::ffff:198.18.0.1`).
    ///
    /// # Errors
    ///
    /// [`Error::Malformed`] if `s` is neither.
    fn from_str(s: &str) -> Result<Self> {
        if let Ok(a) = s.parse::<Ipv4Addr>() {
            return Ok(Gid::from_ipv4(a));
        }
        s.parse::<Ipv6Addr>()
            .map(Gid::from_ipv6)
            .map_err(|_| Error::Malformed)
    }
}

/// [`Gid::hex`]'s `Display` adapter: 32 lowercase hex digits.
#[derive(Debug, Clone, Copy)]
pub struct GidHex(Gid);

impl fmt::Display for GidHex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in self.0.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::string::ToString;

    #[test]
    fn ipv4_mapped_round_trip() {
        let g = Gid::from_ipv4(Ipv4Addr::new(198, 18, 0, 1));
        assert_eq!(
            g.to_bytes(),
            [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 198, 18, 0, 1]
        );
        assert_eq!(g.to_string(), "::ffff:198.18.0.1");
        assert_eq!(g.hex().to_string(), "00000000000000000000ffffc6120001");
        assert_eq!(g.to_ipv4_mapped(), Some(Ipv4Addr::new(198, 18, 0, 1)));
        assert_eq!(g.to_ip(), IpAddr::V4(Ipv4Addr::new(198, 18, 0, 1)));
        assert_eq!("::ffff:198.18.0.1".parse::<Gid>(), Ok(g));
        assert_eq!("198.18.0.1".parse::<Gid>(), Ok(g));
        assert_eq!(Gid::parse_hex("00000000000000000000FFFFC6120001"), Ok(g));
    }

    #[test]
    fn zero_and_ipv6() {
        assert!(Gid::ZERO.is_zero());
        assert_eq!(Gid::ZERO.to_string(), "::");
        assert_eq!(Gid::ZERO.to_ipv4_mapped(), None);
        let ll: Gid = "fe80::5054:c6ff:fe12:2".parse().unwrap();
        assert!(!ll.is_zero());
        assert_eq!(ll.to_ipv4_mapped(), None);
        assert_eq!(ll.to_string(), "fe80::5054:c6ff:fe12:2");
        assert_eq!(Gid::parse_hex(&ll.hex().to_string()), Ok(ll));
        // ::ffff:0:0/96 only; the deprecated IPv4-compatible form is not mapped.
        let compat = Gid::from_bytes([0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4]);
        assert_eq!(compat.to_ipv4_mapped(), None);
    }

    #[test]
    fn bad_text() {
        assert_eq!(Gid::parse_hex(""), Err(Error::Truncated));
        assert_eq!(Gid::parse_hex(&"0".repeat(31)), Err(Error::Truncated));
        assert_eq!(Gid::parse_hex(&"0".repeat(33)), Err(Error::Truncated));
        assert_eq!(
            Gid::parse_hex("0000000000000000000000000000000g"),
            Err(Error::Malformed)
        );
        let non_ascii = std::format!("{}é", "0".repeat(30));
        assert_eq!(non_ascii.len(), 32);
        assert_eq!(Gid::parse_hex(&non_ascii), Err(Error::Malformed));
        assert_eq!("not a gid".parse::<Gid>(), Err(Error::Malformed));
    }
}
