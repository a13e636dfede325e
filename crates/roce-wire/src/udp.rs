//! UDP header (RFC 768) with the RoCE v2 port and the Linux source-port rule
//! (`ROCEV2.md §1.4`).

use core::net::IpAddr;

use crate::field::{self, Field};
use crate::{Error, Qpn, Result, ipv4};

mod fld {
    use super::Field;
    pub(crate) const SRC_PORT: Field = 0..2;
    pub(crate) const DST_PORT: Field = 2..4;
    pub(crate) const LENGTH: Field = 4..6;
    pub(crate) const CHECKSUM: Field = 6..8;
}

/// Length of the UDP header.
pub const HEADER_LEN: usize = fld::CHECKSUM.end;
/// Offset of the UDP checksum, masked in the ICRC.
pub const CHECKSUM_OFFSET: usize = fld::CHECKSUM.start;
/// Offset of the UDP length field.
pub const LENGTH_OFFSET: usize = fld::LENGTH.start;
/// IANA RoCE v2 destination port (`ROCEV2.md §1.4`, `ROCE_V2_UDP_DPORT`).
pub const ROCE_V2_PORT: u16 = 4791;
/// Lowest source port of the Linux RoCE range (`IB_ROCE_UDP_ENCAP_VALID_PORT_MIN`).
pub const SPORT_MIN: u16 = 0xC000;

/// A read/write view of a UDP header at the start of `buffer`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdpPacket<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> UdpPacket<T> {
    /// Wraps a buffer without checks (for emission).
    pub const fn new_unchecked(buffer: T) -> Self {
        UdpPacket { buffer }
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

    /// Checks that the header and the announced length fit. Setting the length
    /// invalidates this check.
    ///
    /// # Errors
    /// [`Error::Truncated`] if the buffer is shorter than 8 bytes or than the
    /// length field; [`Error::Malformed`] if the length field is < 8.
    pub fn check_len(&self) -> Result<()> {
        let len = self.buffer.as_ref().len();
        if len < HEADER_LEN {
            return Err(Error::Truncated);
        }
        let l = usize::from(self.len());
        if l < HEADER_LEN {
            return Err(Error::Malformed);
        }
        if len < l {
            return Err(Error::Truncated);
        }
        Ok(())
    }

    /// Returns the buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// Source port.
    pub fn src_port(&self) -> u16 {
        field::read_u16(&self.buffer.as_ref()[fld::SRC_PORT])
    }
    /// Destination port.
    pub fn dst_port(&self) -> u16 {
        field::read_u16(&self.buffer.as_ref()[fld::DST_PORT])
    }
    /// Length (header + payload).
    pub fn len(&self) -> u16 {
        field::read_u16(&self.buffer.as_ref()[fld::LENGTH])
    }
    /// `true` if the length field says there is no payload.
    pub fn is_empty(&self) -> bool {
        usize::from(self.len()) <= HEADER_LEN
    }
    /// Checksum field (0 = none; RoCE senders send 0, `ROCEV2.md §1.4`).
    pub fn checksum(&self) -> u16 {
        field::read_u16(&self.buffer.as_ref()[fld::CHECKSUM])
    }
    /// Payload (8 .. length).
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[HEADER_LEN..usize::from(self.len())]
    }

    /// Whether the checksum is acceptable: 0 ("none", what RoCE senders
    /// use) or the correct RFC 768 / RFC 8200 §8.1 value over the
    /// pseudo-header for `src`/`dst`. Linux drops datagrams with a wrong
    /// non-zero checksum before rxe sees them (`ROCEV2.md §1.4`). Always
    /// `true` under `cfg(fuzzing)`. Requires a successful `check_len`.
    pub fn verify_checksum(&self, src: IpAddr, dst: IpAddr) -> bool {
        if cfg!(fuzzing) || self.checksum() == 0 {
            return true;
        }
        let data = &self.buffer.as_ref()[..usize::from(self.len())];
        let sum = pseudo_header_sum(src, dst, data.len()) + ipv4::sum_words(data);
        // A correct checksum makes the one's complement sum 0xFFFF.
        ipv4::fold(sum) == 0xFFFF
    }
}

/// One's complement sum of the UDP pseudo-header (RFC 768 for IPv4, RFC 8200
/// §8.1 for IPv6); not folded.
fn pseudo_header_sum(src: IpAddr, dst: IpAddr, udp_len: usize) -> u32 {
    let mut sum = u32::from(ipv4::PROTOCOL_UDP);
    match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            sum += ipv4::sum_words(&s.octets()) + ipv4::sum_words(&d.octets());
            sum += udp_len as u32 & 0xFFFF;
        }
        (s, d) => {
            let o = |a: IpAddr| match a {
                IpAddr::V4(x) => x.to_ipv6_mapped().octets(),
                IpAddr::V6(x) => x.octets(),
            };
            sum += ipv4::sum_words(&o(s)) + ipv4::sum_words(&o(d));
            sum += (udp_len as u32 >> 16) + (udp_len as u32 & 0xFFFF);
        }
    }
    sum
}

/// Computes the UDP checksum for `udp` (header + payload, checksum field
/// ignored) between `src` and `dst`. Returns 0xFFFF instead of 0 (RFC 768:
/// 0 means "no checksum"). RoCE senders normally send 0 instead; this is for
/// tests and for peers that insist on checksums.
pub fn checksum(src: IpAddr, dst: IpAddr, udp: &[u8]) -> u16 {
    let mut sum = pseudo_header_sum(src, dst, udp.len());
    if udp.len() >= HEADER_LEN {
        // Everything but the checksum field itself.
        sum += ipv4::sum_words(&udp[..fld::CHECKSUM.start]);
        sum += ipv4::sum_words(&udp[fld::CHECKSUM.end..]);
    } else {
        sum += ipv4::sum_words(udp);
    }
    let c = !ipv4::fold(sum);
    if c == 0 { 0xFFFF } else { c }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> UdpPacket<T> {
    /// Sets the source port.
    pub fn set_src_port(&mut self, v: u16) {
        field::write_u16(&mut self.buffer.as_mut()[fld::SRC_PORT], v);
    }
    /// Sets the destination port.
    pub fn set_dst_port(&mut self, v: u16) {
        field::write_u16(&mut self.buffer.as_mut()[fld::DST_PORT], v);
    }
    /// Sets the length.
    pub fn set_len(&mut self, v: u16) {
        field::write_u16(&mut self.buffer.as_mut()[fld::LENGTH], v);
    }
    /// Sets the checksum field.
    pub fn set_checksum(&mut self, v: u16) {
        field::write_u16(&mut self.buffer.as_mut()[fld::CHECKSUM], v);
    }
}

/// UDP header as a value. The checksum is always emitted as 0 (\[rxe\] and HW
/// send 0 over IPv4 and IPv6; the ICRC protects the packet, `ROCEV2.md §1.4`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct UdpRepr {
    /// Source port (flow entropy; see [`udp_sport`]).
    pub src_port: u16,
    /// Destination port ([`ROCE_V2_PORT`]).
    pub dst_port: u16,
}

impl UdpRepr {
    /// Parses a checked view (the checksum is not verified).
    ///
    /// # Errors
    /// As [`UdpPacket::check_len`].
    pub fn parse<T: AsRef<[u8]> + ?Sized>(p: &UdpPacket<&T>) -> Result<Self> {
        p.check_len()?;
        Ok(UdpRepr {
            src_port: p.src_port(),
            dst_port: p.dst_port(),
        })
    }

    /// Header length: 8.
    pub const fn header_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the header for a payload of `payload_len` bytes, checksum 0.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut UdpPacket<T>, payload_len: usize) {
        p.set_src_port(self.src_port);
        p.set_dst_port(self.dst_port);
        p.set_len((HEADER_LEN + payload_len) as u16);
        p.set_checksum(0);
    }
}

/// Flow label derived from the two QPNs when the address handle has none
/// (`ROCEV2.md §1.4`, Linux `rdma_calc_flow_label`): `v = lqpn × rqpn` (64-bit),
/// `v ^= v >> 20; v ^= v >> 40`, low 20 bits. Symmetric in the two QPNs.
pub const fn flow_label_from_qpns(lqpn: Qpn, rqpn: Qpn) -> u32 {
    let mut v = (lqpn.value() as u64) * (rqpn.value() as u64);
    v ^= v >> 20;
    v ^= v >> 40;
    (v & 0xF_FFFF) as u32
}

/// UDP source port from a 20-bit flow label (`ROCEV2.md §1.4`, Linux
/// `rdma_flow_label_to_udp_sport`): `0xC000 | ((fl & 0x3FFF) ^ (fl >> 14))`.
pub const fn flow_label_to_udp_sport(flow_label: u32) -> u16 {
    let fl = flow_label & 0xF_FFFF;
    let fl_low = fl & 0x3FFF;
    let fl_high = fl & 0xFC000;
    SPORT_MIN | ((fl_low ^ (fl_high >> 14)) as u16)
}

/// UDP source port for a QP pair (`ROCEV2.md §1.4`, Linux
/// `rdma_get_udp_sport`): if `flow_label` is 0 it is first derived with
/// [`flow_label_from_qpns`]; the result is in 0xC000..=0xFFFF and the same
/// in both directions. Examples: QPNs 0x11/0x12 → 49458; 0x123/0x456 → 60881.
pub const fn udp_sport(lqpn: Qpn, rqpn: Qpn, flow_label: u32) -> u16 {
    let fl = if flow_label & 0xF_FFFF == 0 {
        flow_label_from_qpns(lqpn, rqpn)
    } else {
        flow_label
    };
    flow_label_to_udp_sport(fl)
}

#[cfg(test)]
mod tests {
    use super::*;

    static BYTES: [u8; 8] = [0xc1, 0x32, 0x12, 0xb7, 0x00, 0x28, 0x00, 0x00];
    const REPR: UdpRepr = UdpRepr {
        src_port: 0xc132,
        dst_port: ROCE_V2_PORT,
    };

    fn with_payload() -> [u8; 40] {
        let mut b = [0u8; 40];
        b[..8].copy_from_slice(&BYTES);
        b
    }

    #[test]
    fn test_deconstruct() {
        let buf = with_payload();
        let p = UdpPacket::new_checked(&buf[..]).unwrap();
        assert_eq!(p.src_port(), 49458);
        assert_eq!(p.dst_port(), 4791);
        assert_eq!(p.len(), 40);
        assert_eq!(p.checksum(), 0);
        assert_eq!(p.payload().len(), 32);
    }
    #[test]
    fn test_construct() {
        let mut buf = [0xffu8; 8];
        let mut p = UdpPacket::new_unchecked(&mut buf[..]);
        p.set_src_port(49458);
        p.set_dst_port(4791);
        p.set_len(40);
        p.set_checksum(0);
        assert_eq!(buf, BYTES);
    }
    #[test]
    fn test_parse() {
        let buf = with_payload();
        assert_eq!(
            UdpRepr::parse(&UdpPacket::new_unchecked(&buf[..])).unwrap(),
            REPR
        );
    }
    #[test]
    fn test_emit() {
        let mut buf = [0xffu8; 8];
        REPR.emit(&mut UdpPacket::new_unchecked(&mut buf[..]), 32);
        assert_eq!(buf, BYTES);
    }
    #[test]
    fn test_impossible_len() {
        assert_eq!(
            UdpPacket::new_checked(&BYTES[..7]).unwrap_err(),
            Error::Truncated
        );
        assert_eq!(
            UdpPacket::new_checked(&BYTES[..]).unwrap_err(),
            Error::Truncated
        );
        let mut b = with_payload();
        b[5] = 7;
        assert_eq!(
            UdpPacket::new_checked(&b[..]).unwrap_err(),
            Error::Malformed
        );
    }

    #[test]
    fn checksum_v4_v6() {
        use core::net::{Ipv4Addr, Ipv6Addr};
        let mut buf = with_payload();
        buf[8..12].copy_from_slice(&[1, 2, 3, 4]);
        let (s4, d4) = (
            IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1)),
            IpAddr::V4(Ipv4Addr::new(192, 0, 2, 2)),
        );
        let s6 = IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1));
        let d6 = IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 2));
        // Zero means "none" and is accepted.
        assert!(UdpPacket::new_unchecked(&buf[..]).verify_checksum(s4, d4));
        for (s, d) in [(s4, d4), (s6, d6)] {
            let c = checksum(s, d, &buf);
            UdpPacket::new_unchecked(&mut buf[..]).set_checksum(c);
            assert!(UdpPacket::new_unchecked(&buf[..]).verify_checksum(s, d));
            // Recomputing with the field filled gives the same value.
            assert_eq!(checksum(s, d, &buf), c);
            buf[20] ^= 1;
            assert!(!UdpPacket::new_unchecked(&buf[..]).verify_checksum(s, d));
            buf[20] ^= 1;
            UdpPacket::new_unchecked(&mut buf[..]).set_checksum(0);
        }
    }

    #[test]
    fn sport_rule_vectors() {
        assert_eq!(
            flow_label_from_qpns(Qpn::new(0x11), Qpn::new(0x12)),
            0x00132
        );
        assert_eq!(udp_sport(Qpn::new(0x11), Qpn::new(0x12), 0), 49458);
        assert_eq!(udp_sport(Qpn::new(0x12), Qpn::new(0x11), 0), 49458);
        assert_eq!(udp_sport(Qpn::new(0x123), Qpn::new(0x456), 0), 60881);
        assert_eq!(udp_sport(Qpn::new(0x123), Qpn::new(0x456), 0), 0xEDD1);
        // explicit flow label wins over the QPN hash
        // fl 0x4003: low 14 bits 0x0003, high 6 bits 0x1 -> 0xC000 | (3 ^ 1)
        assert_eq!(udp_sport(Qpn::new(1), Qpn::new(2), 0x4003), 0xC002);
        for fl in [0u32, 1, 0x3FFF, 0x4000, 0xFFFFF] {
            assert!(flow_label_to_udp_sport(fl) >= SPORT_MIN);
        }
    }
}
