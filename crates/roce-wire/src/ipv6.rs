//! IPv6 header as used by RoCE v2 (`ROCEV2.md §1.3`, RFC 8200): 40 bytes, next
//! header 17 (no extension headers). Traffic class (DSCP + ECN), flow label
//! and hop limit are masked in the ICRC.

use core::net::Ipv6Addr;

use crate::field::{self, Field};
use crate::ipv4::Ecn;
use crate::{Error, Result};

mod fld {
    use super::Field;
    pub(crate) const VER_TC_FLOW: Field = 0..4;
    pub(crate) const PAYLOAD_LEN: Field = 4..6;
    pub(crate) const NEXT_HEADER: usize = 6;
    pub(crate) const HOP_LIMIT: usize = 7;
    pub(crate) const SRC: Field = 8..24;
    pub(crate) const DST: Field = 24..40;
}

/// Length of the fixed IPv6 header.
pub const HEADER_LEN: usize = fld::DST.end;
/// Offset of the hop limit, masked in the ICRC.
pub const HOP_LIMIT_OFFSET: usize = fld::HOP_LIMIT;
/// Offset of the payload-length field.
pub const PAYLOAD_LEN_OFFSET: usize = fld::PAYLOAD_LEN.start;
/// Largest flow label (20 bits).
pub const FLOW_LABEL_MASK: u32 = 0x000F_FFFF;

/// A read/write view of an IPv6 packet at the start of `buffer`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ipv6Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Ipv6Packet<T> {
    /// Wraps a buffer without checks (for emission).
    pub const fn new_unchecked(buffer: T) -> Self {
        Ipv6Packet { buffer }
    }

    /// Wraps a buffer and runs [`check_len`](Self::check_len).
    ///
    /// # Errors
    /// As [`check_len`](Self::check_len).
    pub fn new_checked(buffer: T) -> Result<Self> {
        let p = Self::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    /// Checks that the header and the announced payload fit (trailing bytes
    /// such as Ethernet padding are allowed). Setting the payload length
    /// invalidates this check.
    ///
    /// # Errors
    /// [`Error::Truncated`].
    pub fn check_len(&self) -> Result<()> {
        let len = self.buffer.as_ref().len();
        if len < HEADER_LEN || len < HEADER_LEN + usize::from(self.payload_len()) {
            Err(Error::Truncated)
        } else {
            Ok(())
        }
    }

    /// Returns the buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    fn word0(&self) -> u32 {
        field::read_u32(&self.buffer.as_ref()[fld::VER_TC_FLOW])
    }

    /// Version (6).
    pub fn version(&self) -> u8 {
        (self.word0() >> 28) as u8
    }
    /// Traffic class (DSCP << 2 | ECN).
    pub fn traffic_class(&self) -> u8 {
        (self.word0() >> 20) as u8
    }
    /// DSCP (6 bits).
    pub fn dscp(&self) -> u8 {
        self.traffic_class() >> 2
    }
    /// ECN code point.
    pub fn ecn(&self) -> Ecn {
        Ecn::from_bits(self.traffic_class())
    }
    /// Flow label (20 bits).
    pub fn flow_label(&self) -> u32 {
        self.word0() & FLOW_LABEL_MASK
    }
    /// Payload length in bytes.
    pub fn payload_len(&self) -> u16 {
        field::read_u16(&self.buffer.as_ref()[fld::PAYLOAD_LEN])
    }
    /// Next header (17 = UDP).
    pub fn next_header(&self) -> u8 {
        self.buffer.as_ref()[fld::NEXT_HEADER]
    }
    /// Hop limit.
    pub fn hop_limit(&self) -> u8 {
        self.buffer.as_ref()[fld::HOP_LIMIT]
    }
    /// Source address.
    pub fn src_addr(&self) -> Ipv6Addr {
        let mut a = [0u8; 16];
        a.copy_from_slice(&self.buffer.as_ref()[fld::SRC]);
        Ipv6Addr::from(a)
    }
    /// Destination address.
    pub fn dst_addr(&self) -> Ipv6Addr {
        let mut a = [0u8; 16];
        a.copy_from_slice(&self.buffer.as_ref()[fld::DST]);
        Ipv6Addr::from(a)
    }
    /// Payload (40 .. 40 + payload length).
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[HEADER_LEN..HEADER_LEN + usize::from(self.payload_len())]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Ipv6Packet<T> {
    fn set_word0(&mut self, v: u32) {
        field::write_u32(&mut self.buffer.as_mut()[fld::VER_TC_FLOW], v);
    }
    /// Sets the version nibble.
    pub fn set_version(&mut self, v: u8) {
        let w = self.word0();
        self.set_word0((w & 0x0FFF_FFFF) | (u32::from(v & 0xF) << 28));
    }
    /// Sets the whole traffic class byte.
    pub fn set_traffic_class(&mut self, v: u8) {
        let w = self.word0();
        self.set_word0((w & 0xF00F_FFFF) | (u32::from(v) << 20));
    }
    /// Sets the DSCP, keeping ECN.
    pub fn set_dscp(&mut self, v: u8) {
        let tc = (self.traffic_class() & 0x03) | (v << 2);
        self.set_traffic_class(tc);
    }
    /// Sets the ECN code point, keeping DSCP.
    pub fn set_ecn(&mut self, v: Ecn) {
        let tc = (self.traffic_class() & !0x03) | v.bits();
        self.set_traffic_class(tc);
    }
    /// Sets the flow label (low 20 bits of `v`).
    pub fn set_flow_label(&mut self, v: u32) {
        let w = self.word0();
        self.set_word0((w & !FLOW_LABEL_MASK) | (v & FLOW_LABEL_MASK));
    }
    /// Sets the payload length.
    pub fn set_payload_len(&mut self, v: u16) {
        field::write_u16(&mut self.buffer.as_mut()[fld::PAYLOAD_LEN], v);
    }
    /// Sets the next header.
    pub fn set_next_header(&mut self, v: u8) {
        self.buffer.as_mut()[fld::NEXT_HEADER] = v;
    }
    /// Sets the hop limit.
    pub fn set_hop_limit(&mut self, v: u8) {
        self.buffer.as_mut()[fld::HOP_LIMIT] = v;
    }
    /// Sets the source address.
    pub fn set_src_addr(&mut self, a: Ipv6Addr) {
        self.buffer.as_mut()[fld::SRC].copy_from_slice(&a.octets());
    }
    /// Sets the destination address.
    pub fn set_dst_addr(&mut self, a: Ipv6Addr) {
        self.buffer.as_mut()[fld::DST].copy_from_slice(&a.octets());
    }
}

/// IPv6 header as a value (no extension headers). The payload length is not
/// stored: [`Ipv6Repr::emit`] takes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ipv6Repr {
    /// Source address.
    pub src_addr: Ipv6Addr,
    /// Destination address.
    pub dst_addr: Ipv6Addr,
    /// DSCP (6 bits).
    pub dscp: u8,
    /// ECN code point.
    pub ecn: Ecn,
    /// Flow label (20 bits; \[rxe\] sends 0).
    pub flow_label: u32,
    /// Next header (17 for RoCE v2).
    pub next_header: u8,
    /// Hop limit.
    pub hop_limit: u8,
}

impl Ipv6Repr {
    /// Parses a checked view.
    ///
    /// # Errors
    /// As [`Ipv6Packet::check_len`]; [`Error::Malformed`] if the version is
    /// not 6.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(p: &Ipv6Packet<&T>) -> Result<Self> {
        p.check_len()?;
        if p.version() != 6 {
            return Err(Error::Malformed);
        }
        Ok(Ipv6Repr {
            src_addr: p.src_addr(),
            dst_addr: p.dst_addr(),
            dscp: p.dscp(),
            ecn: p.ecn(),
            flow_label: p.flow_label(),
            next_header: p.next_header(),
            hop_limit: p.hop_limit(),
        })
    }

    /// Header length: 40.
    pub const fn header_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the 40-byte header for a payload of `payload_len` bytes (≤ 65535).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Ipv6Packet<T>, payload_len: usize) {
        let tc = (self.dscp << 2) | self.ecn.bits();
        p.set_word0((6u32 << 28) | (u32::from(tc) << 20) | (self.flow_label & FLOW_LABEL_MASK));
        p.set_payload_len(payload_len as u16);
        p.set_next_header(self.next_header);
        p.set_hop_limit(self.hop_limit);
        p.set_src_addr(self.src_addr);
        p.set_dst_addr(self.dst_addr);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // From vector rc_send_only_v6 (tclass 0x6a, flow label 0, payload 40, hop 64).
    static BYTES: [u8; 40] = [
        0x66, 0xa0, 0x00, 0x00, 0x00, 0x28, 0x11, 0x40, //
        0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x01, //
        0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x02,
    ];
    const REPR: Ipv6Repr = Ipv6Repr {
        src_addr: Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1),
        dst_addr: Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 2),
        dscp: 26,
        ecn: Ecn::Ect0,
        flow_label: 0,
        next_header: 17,
        hop_limit: 64,
    };

    fn with_payload() -> [u8; 80] {
        let mut b = [0u8; 80];
        b[..40].copy_from_slice(&BYTES);
        b
    }

    #[test]
    fn test_deconstruct() {
        let buf = with_payload();
        let p = Ipv6Packet::new_checked(&buf[..]).unwrap();
        assert_eq!(p.version(), 6);
        assert_eq!(p.traffic_class(), 0x6a);
        assert_eq!(p.dscp(), 26);
        assert_eq!(p.ecn(), Ecn::Ect0);
        assert_eq!(p.flow_label(), 0);
        assert_eq!(p.payload_len(), 40);
        assert_eq!(p.next_header(), 17);
        assert_eq!(p.hop_limit(), 64);
        assert_eq!(p.src_addr(), REPR.src_addr);
        assert_eq!(p.dst_addr(), REPR.dst_addr);
        assert_eq!(p.payload().len(), 40);
    }
    #[test]
    fn test_construct() {
        let mut buf = [0u8; 40];
        let mut p = Ipv6Packet::new_unchecked(&mut buf[..]);
        p.set_version(6);
        p.set_dscp(26);
        p.set_ecn(Ecn::Ect0);
        p.set_flow_label(0x12345);
        p.set_flow_label(0);
        p.set_payload_len(40);
        p.set_next_header(17);
        p.set_hop_limit(64);
        p.set_src_addr(REPR.src_addr);
        p.set_dst_addr(REPR.dst_addr);
        assert_eq!(buf, BYTES);
    }
    #[test]
    fn test_parse() {
        let buf = with_payload();
        assert_eq!(
            Ipv6Repr::parse(&Ipv6Packet::new_unchecked(&buf[..])).unwrap(),
            REPR
        );
    }
    #[test]
    fn test_emit() {
        let mut buf = [0u8; 40];
        REPR.emit(&mut Ipv6Packet::new_unchecked(&mut buf[..]), 40);
        assert_eq!(buf, BYTES);
    }
    #[test]
    fn test_impossible_len() {
        assert_eq!(
            Ipv6Packet::new_checked(&BYTES[..39]).unwrap_err(),
            Error::Truncated
        );
        assert_eq!(
            Ipv6Packet::new_checked(&BYTES[..]).unwrap_err(),
            Error::Truncated
        );
        let mut b = with_payload();
        b[0] = 0x46;
        assert_eq!(
            Ipv6Repr::parse(&Ipv6Packet::new_unchecked(&b[..])).unwrap_err(),
            Error::Malformed
        );
    }
    #[test]
    fn flow_label_and_tc_independent() {
        let mut buf = with_payload();
        let mut p = Ipv6Packet::new_unchecked(&mut buf[..]);
        p.set_flow_label(0xFFFFF);
        p.set_ecn(Ecn::Ce);
        assert_eq!(p.flow_label(), 0xFFFFF);
        assert_eq!(p.dscp(), 26);
        assert_eq!(p.version(), 6);
        assert_eq!(p.ecn(), Ecn::Ce);
    }
}
