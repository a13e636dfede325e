//! IPv4 header as used by RoCE v2 (`ROCEV2.md §1.2`, RFC 791): 20 bytes, no
//! options, DF set, protocol 17. Also the ECN code point ([`Ecn`], RFC 3168)
//! shared with IPv6, the header checksum and its incremental update (RFC 1624).

use core::net::Ipv4Addr;

use crate::field::{self, Field};
use crate::{Error, Result};

mod fld {
    use super::Field;
    pub(crate) const VER_IHL: usize = 0;
    pub(crate) const DSCP_ECN: usize = 1;
    pub(crate) const LENGTH: Field = 2..4;
    pub(crate) const IDENT: Field = 4..6;
    pub(crate) const FLG_OFF: Field = 6..8;
    pub(crate) const TTL: usize = 8;
    pub(crate) const PROTOCOL: usize = 9;
    pub(crate) const CHECKSUM: Field = 10..12;
    pub(crate) const SRC: Field = 12..16;
    pub(crate) const DST: Field = 16..20;
}

/// Length of an IPv4 header without options.
pub const HEADER_LEN: usize = fld::DST.end;
/// Offset of the TOS (DSCP + ECN) byte, masked in the ICRC.
pub const TOS_OFFSET: usize = fld::DSCP_ECN;
/// Offset of the TTL byte, masked in the ICRC.
pub const TTL_OFFSET: usize = fld::TTL;
/// Offset of the header checksum, masked in the ICRC.
pub const CHECKSUM_OFFSET: usize = fld::CHECKSUM.start;
/// Offset of the total-length field.
pub const LENGTH_OFFSET: usize = fld::LENGTH.start;
/// IP protocol number of UDP.
pub const PROTOCOL_UDP: u8 = 17;

const DF: u16 = 0x4000;
const MF: u16 = 0x2000;
const OFF_MASK: u16 = 0x1FFF;

/// ECN code point, the low two bits of the IPv4 TOS / IPv6 traffic class
/// (`ROCEV2.md §1.4`, RFC 3168).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Ecn {
    /// 00: not ECN-capable transport.
    #[default]
    NotEct = 0,
    /// 01: ECT(1).
    Ect1 = 1,
    /// 10: ECT(0) — what congestion-controlled RoCE data is sent with.
    Ect0 = 2,
    /// 11: congestion experienced (triggers a CNP, `ROCEV2.md §5`).
    Ce = 3,
}

impl Ecn {
    /// From the low two bits of `v`.
    pub const fn from_bits(v: u8) -> Self {
        match v & 3 {
            0 => Ecn::NotEct,
            1 => Ecn::Ect1,
            2 => Ecn::Ect0,
            _ => Ecn::Ce,
        }
    }
    /// The two-bit code point.
    pub const fn bits(self) -> u8 {
        self as u8
    }
    /// Short name: `not-ect`, `ect1`, `ect0`, `ce`.
    pub const fn name(self) -> &'static str {
        match self {
            Ecn::NotEct => "not-ect",
            Ecn::Ect1 => "ect1",
            Ecn::Ect0 => "ect0",
            Ecn::Ce => "ce",
        }
    }
}

/// Internet checksum (RFC 1071) of `data`: the one's complement of the one's
/// complement sum of its 16-bit big-endian words (an odd tail byte is padded
/// with zero). For an IPv4 header whose checksum field holds the correct
/// value the result is 0.
pub fn checksum(data: &[u8]) -> u16 {
    !fold(sum_words(data))
}

pub(crate) fn sum_words(data: &[u8]) -> u32 {
    let mut sum: u32 = 0;
    let mut chunks = data.chunks_exact(2);
    for c in &mut chunks {
        sum += u32::from(u16::from_be_bytes([c[0], c[1]]));
    }
    if let [last] = chunks.remainder() {
        sum += u32::from(*last) << 8;
    }
    sum
}

pub(crate) fn fold(mut sum: u32) -> u16 {
    while sum > 0xFFFF {
        sum = (sum & 0xFFFF) + (sum >> 16);
    }
    sum as u16
}

/// Incremental checksum update when one 16-bit header word changes from `old`
/// to `new` (RFC 1624 eqn. 3: `HC' = ~(~HC + ~m + m')`). Used by the header
/// template to patch the total length without re-summing the header.
pub const fn checksum_update(old_checksum: u16, old: u16, new: u16) -> u16 {
    let mut sum = (!old_checksum) as u32 + (!old) as u32 + new as u32;
    while sum > 0xFFFF {
        sum = (sum & 0xFFFF) + (sum >> 16);
    }
    !(sum as u16)
}

/// A read/write view of an IPv4 packet at the start of `buffer`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ipv4Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Ipv4Packet<T> {
    /// Wraps a buffer without checks (for emission).
    pub const fn new_unchecked(buffer: T) -> Self {
        Ipv4Packet { buffer }
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

    /// Checks that the header, and the total length it announces, fit in the
    /// buffer (bytes beyond the total length, e.g. Ethernet padding, are
    /// allowed). Setting the IHL or total length invalidates this check.
    ///
    /// # Errors
    /// [`Error::Truncated`] if the buffer is shorter than 20 bytes, the IHL or
    /// the total length; [`Error::Malformed`] if IHL < 5 or total length < IHL.
    pub fn check_len(&self) -> Result<()> {
        let len = self.buffer.as_ref().len();
        if len < HEADER_LEN {
            return Err(Error::Truncated);
        }
        let hl = self.header_len();
        if hl < HEADER_LEN {
            return Err(Error::Malformed);
        }
        if len < hl {
            return Err(Error::Truncated);
        }
        let tl = usize::from(self.total_len());
        if tl < hl {
            return Err(Error::Malformed);
        }
        if len < tl {
            return Err(Error::Truncated);
        }
        Ok(())
    }

    /// Returns the buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }

    /// Version (4).
    pub fn version(&self) -> u8 {
        self.b()[fld::VER_IHL] >> 4
    }
    /// Header length in bytes (IHL × 4).
    pub fn header_len(&self) -> usize {
        usize::from(self.b()[fld::VER_IHL] & 0x0F) * 4
    }
    /// DSCP (6 bits).
    pub fn dscp(&self) -> u8 {
        self.b()[fld::DSCP_ECN] >> 2
    }
    /// ECN code point.
    pub fn ecn(&self) -> Ecn {
        Ecn::from_bits(self.b()[fld::DSCP_ECN])
    }
    /// Total length (header + payload) in bytes.
    pub fn total_len(&self) -> u16 {
        field::read_u16(&self.b()[fld::LENGTH])
    }
    /// Identification.
    pub fn ident(&self) -> u16 {
        field::read_u16(&self.b()[fld::IDENT])
    }
    /// DF flag.
    pub fn dont_frag(&self) -> bool {
        field::read_u16(&self.b()[fld::FLG_OFF]) & DF != 0
    }
    /// MF flag.
    pub fn more_frags(&self) -> bool {
        field::read_u16(&self.b()[fld::FLG_OFF]) & MF != 0
    }
    /// Fragment offset in 8-byte units.
    pub fn frag_offset(&self) -> u16 {
        field::read_u16(&self.b()[fld::FLG_OFF]) & OFF_MASK
    }
    /// TTL.
    pub fn ttl(&self) -> u8 {
        self.b()[fld::TTL]
    }
    /// Protocol (17 = UDP).
    pub fn protocol(&self) -> u8 {
        self.b()[fld::PROTOCOL]
    }
    /// Header checksum field.
    pub fn checksum(&self) -> u16 {
        field::read_u16(&self.b()[fld::CHECKSUM])
    }
    /// Source address.
    pub fn src_addr(&self) -> Ipv4Addr {
        let s = &self.b()[fld::SRC];
        Ipv4Addr::new(s[0], s[1], s[2], s[3])
    }
    /// Destination address.
    pub fn dst_addr(&self) -> Ipv4Addr {
        let s = &self.b()[fld::DST];
        Ipv4Addr::new(s[0], s[1], s[2], s[3])
    }
    /// Whether the header checksum is correct. Always `true` under
    /// `cfg(fuzzing)` (STYLE W6).
    pub fn verify_checksum(&self) -> bool {
        if cfg!(fuzzing) {
            return true;
        }
        checksum(&self.b()[..self.header_len()]) == 0
    }
    /// Payload: bytes from the end of the header to the total length.
    pub fn payload(&self) -> &[u8] {
        &self.b()[self.header_len()..usize::from(self.total_len())]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Ipv4Packet<T> {
    fn bm(&mut self) -> &mut [u8] {
        self.buffer.as_mut()
    }
    /// Sets version and IHL (`header_len` in bytes, multiple of 4).
    pub fn set_version_and_header_len(&mut self, version: u8, header_len: usize) {
        self.bm()[fld::VER_IHL] = (version << 4) | ((header_len / 4) as u8 & 0x0F);
    }
    /// Sets the DSCP (6 bits), keeping ECN.
    pub fn set_dscp(&mut self, v: u8) {
        let b = &mut self.bm()[fld::DSCP_ECN];
        *b = (*b & 0x03) | (v << 2);
    }
    /// Sets the ECN code point, keeping DSCP. Does not update the checksum.
    pub fn set_ecn(&mut self, v: Ecn) {
        let b = &mut self.bm()[fld::DSCP_ECN];
        *b = (*b & !0x03) | v.bits();
    }
    /// Sets the total length.
    pub fn set_total_len(&mut self, v: u16) {
        field::write_u16(&mut self.bm()[fld::LENGTH], v);
    }
    /// Sets the identification.
    pub fn set_ident(&mut self, v: u16) {
        field::write_u16(&mut self.bm()[fld::IDENT], v);
    }
    /// Sets flags and fragment offset (DF, MF, offset in 8-byte units).
    pub fn set_flags_and_offset(&mut self, dont_frag: bool, more_frags: bool, offset: u16) {
        let v = (if dont_frag { DF } else { 0 })
            | (if more_frags { MF } else { 0 })
            | (offset & OFF_MASK);
        field::write_u16(&mut self.bm()[fld::FLG_OFF], v);
    }
    /// Sets the TTL.
    pub fn set_ttl(&mut self, v: u8) {
        self.bm()[fld::TTL] = v;
    }
    /// Sets the protocol.
    pub fn set_protocol(&mut self, v: u8) {
        self.bm()[fld::PROTOCOL] = v;
    }
    /// Sets the checksum field.
    pub fn set_checksum(&mut self, v: u16) {
        field::write_u16(&mut self.bm()[fld::CHECKSUM], v);
    }
    /// Sets the source address.
    pub fn set_src_addr(&mut self, a: Ipv4Addr) {
        self.bm()[fld::SRC].copy_from_slice(&a.octets());
    }
    /// Sets the destination address.
    pub fn set_dst_addr(&mut self, a: Ipv4Addr) {
        self.bm()[fld::DST].copy_from_slice(&a.octets());
    }
    /// Computes and stores the header checksum.
    pub fn fill_checksum(&mut self) {
        self.set_checksum(0);
        let hl = self.header_len();
        let c = checksum(&self.b()[..hl]);
        self.set_checksum(c);
    }
    /// Mutable payload (header end .. total length).
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let (hl, tl) = (self.header_len(), usize::from(self.total_len()));
        &mut self.bm()[hl..tl]
    }
}

/// IPv4 header as a value (RoCE v2 subset: no options, never fragmented).
/// Lengths are not stored: [`Ipv4Repr::emit`] takes the payload length.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ipv4Repr {
    /// Source address.
    pub src_addr: Ipv4Addr,
    /// Destination address.
    pub dst_addr: Ipv4Addr,
    /// DSCP (6 bits).
    pub dscp: u8,
    /// ECN code point.
    pub ecn: Ecn,
    /// Identification (covered by the ICRC).
    pub ident: u16,
    /// DF flag (\[rxe\] sets it, `ROCEV2.md §1.2`).
    pub dont_frag: bool,
    /// TTL.
    pub ttl: u8,
    /// Protocol (17 for RoCE v2).
    pub protocol: u8,
}

impl Ipv4Repr {
    /// Parses a checked view. The checksum is not verified here (it is masked
    /// out of the ICRC; see [`Ipv4Packet::verify_checksum`]).
    ///
    /// # Errors
    /// As [`Ipv4Packet::check_len`]; [`Error::Malformed`] if the version is
    /// not 4, the header has options (RoCE v2 never sends them and \[rxe\]
    /// assumes a 20-byte header), or the packet is a fragment.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(p: &Ipv4Packet<&T>) -> Result<Self> {
        p.check_len()?;
        if p.version() != 4 || p.header_len() != HEADER_LEN {
            return Err(Error::Malformed);
        }
        if p.more_frags() || p.frag_offset() != 0 {
            return Err(Error::Malformed);
        }
        Ok(Ipv4Repr {
            src_addr: p.src_addr(),
            dst_addr: p.dst_addr(),
            dscp: p.dscp(),
            ecn: p.ecn(),
            ident: p.ident(),
            dont_frag: p.dont_frag(),
            ttl: p.ttl(),
            protocol: p.protocol(),
        })
    }

    /// Header length: 20.
    pub const fn header_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the 20-byte header for a payload of `payload_len` bytes,
    /// including the checksum. The buffer must hold at least 20 bytes.
    /// `payload_len` must be ≤ 65515 (the total length is truncated to 16 bits
    /// otherwise).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Ipv4Packet<T>, payload_len: usize) {
        p.set_version_and_header_len(4, HEADER_LEN);
        p.bm()[fld::DSCP_ECN] = (self.dscp << 2) | self.ecn.bits();
        p.set_total_len((HEADER_LEN + payload_len) as u16);
        p.set_ident(self.ident);
        p.set_flags_and_offset(self.dont_frag, false, 0);
        p.set_ttl(self.ttl);
        p.set_protocol(self.protocol);
        p.set_src_addr(self.src_addr);
        p.set_dst_addr(self.dst_addr);
        p.set_checksum(0);
        let c = checksum(&p.b()[..HEADER_LEN]);
        p.set_checksum(c);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // From vector rc_send_only_v4 (ROCEV2.md §3).
    static BYTES: [u8; 20] = [
        0x45, 0x6a, 0x00, 0x3c, 0x01, 0x00, 0x40, 0x00, 0x40, 0x11, 0xb5, 0x43, 0xc0, 0x00, 0x02,
        0x01, 0xc0, 0x00, 0x02, 0x02,
    ];
    const REPR: Ipv4Repr = Ipv4Repr {
        src_addr: Ipv4Addr::new(192, 0, 2, 1),
        dst_addr: Ipv4Addr::new(192, 0, 2, 2),
        dscp: 26,
        ecn: Ecn::Ect0,
        ident: 0x0100,
        dont_frag: true,
        ttl: 64,
        protocol: 17,
    };

    fn with_payload() -> [u8; 60] {
        let mut b = [0u8; 60];
        b[..20].copy_from_slice(&BYTES);
        b
    }

    #[test]
    fn test_deconstruct() {
        let buf = with_payload();
        let p = Ipv4Packet::new_checked(&buf[..]).unwrap();
        assert_eq!(p.version(), 4);
        assert_eq!(p.header_len(), 20);
        assert_eq!(p.dscp(), 26);
        assert_eq!(p.ecn(), Ecn::Ect0);
        assert_eq!(p.total_len(), 60);
        assert_eq!(p.ident(), 0x0100);
        assert!(p.dont_frag());
        assert!(!p.more_frags());
        assert_eq!(p.frag_offset(), 0);
        assert_eq!(p.ttl(), 64);
        assert_eq!(p.protocol(), 17);
        assert_eq!(p.checksum(), 0xb543);
        assert!(p.verify_checksum());
        assert_eq!(p.payload().len(), 40);
    }
    #[test]
    fn test_construct() {
        let mut buf = [0u8; 20];
        let mut p = Ipv4Packet::new_unchecked(&mut buf[..]);
        p.set_version_and_header_len(4, 20);
        p.set_dscp(26);
        p.set_ecn(Ecn::Ect0);
        p.set_total_len(60);
        p.set_ident(0x0100);
        p.set_flags_and_offset(true, false, 0);
        p.set_ttl(64);
        p.set_protocol(17);
        p.set_src_addr(Ipv4Addr::new(192, 0, 2, 1));
        p.set_dst_addr(Ipv4Addr::new(192, 0, 2, 2));
        p.fill_checksum();
        assert_eq!(buf, BYTES);
    }
    #[test]
    fn test_parse() {
        let buf = with_payload();
        assert_eq!(
            Ipv4Repr::parse(&Ipv4Packet::new_unchecked(&buf[..])).unwrap(),
            REPR
        );
    }
    #[test]
    fn test_emit() {
        let mut buf = [0u8; 20];
        REPR.emit(&mut Ipv4Packet::new_unchecked(&mut buf[..]), 40);
        assert_eq!(buf, BYTES);
    }
    #[test]
    fn test_impossible_len() {
        assert_eq!(
            Ipv4Packet::new_checked(&BYTES[..19]).unwrap_err(),
            Error::Truncated
        );
        // total length 60 but only 20 bytes present
        assert_eq!(
            Ipv4Packet::new_checked(&BYTES[..]).unwrap_err(),
            Error::Truncated
        );
        let mut b = with_payload();
        b[0] = 0x44; // IHL 4
        assert_eq!(
            Ipv4Packet::new_checked(&b[..]).unwrap_err(),
            Error::Malformed
        );
        let mut b = with_payload();
        b[2..4].copy_from_slice(&10u16.to_be_bytes());
        assert_eq!(
            Ipv4Packet::new_checked(&b[..]).unwrap_err(),
            Error::Malformed
        );
        let mut b = with_payload();
        b[0] = 0x46; // options
        assert_eq!(
            Ipv4Repr::parse(&Ipv4Packet::new_unchecked(&b[..])).unwrap_err(),
            Error::Malformed
        );
        let mut b = with_payload();
        b[6] = 0x20; // MF
        assert_eq!(
            Ipv4Repr::parse(&Ipv4Packet::new_unchecked(&b[..])).unwrap_err(),
            Error::Malformed
        );
    }

    #[test]
    fn ecn_accessors() {
        let mut buf = with_payload();
        let mut p = Ipv4Packet::new_unchecked(&mut buf[..]);
        for e in [Ecn::NotEct, Ecn::Ect1, Ecn::Ect0, Ecn::Ce] {
            p.set_ecn(e);
            assert_eq!(p.ecn(), e);
            assert_eq!(p.dscp(), 26);
        }
    }

    #[test]
    fn incremental_checksum_matches_full() {
        let mut buf = with_payload();
        let mut p = Ipv4Packet::new_unchecked(&mut buf[..]);
        for new_len in [20u16, 21, 1500, 4136, 65535] {
            let old_c = p.checksum();
            let old_len = p.total_len();
            p.set_total_len(new_len);
            let inc = checksum_update(old_c, old_len, new_len);
            p.fill_checksum();
            assert_eq!(inc, p.checksum(), "len {new_len}");
        }
    }
}
