//! Whole RoCE v2 frames: Ethernet (+802.1Q) / IPv4 | IPv6 / UDP 4791 / BTH /
//! extension headers / payload / pad / ICRC (`ROCEV2.md §1`).
//!
//! [`RoceRepr::parse`] takes untrusted bytes starting at the destination MAC
//! and returns a [`ParsedFrame`] with every header field, the payload slice
//! and the ICRC status. [`RoceRepr::emit`] writes a whole frame, payload via a
//! closure, ICRC included.

use crate::bth::{self, Bth, BthRepr};
use crate::eth::{EtherType, EthernetFrame, EthernetRepr};
use crate::ext::ExtRepr;
use crate::icrc::{self, ICRC_LEN};
use crate::ipv4::{self, Ecn, Ipv4Packet, Ipv4Repr};
use crate::ipv6::{self, Ipv6Packet, Ipv6Repr};
use crate::udp::{self, ROCE_V2_PORT, UdpPacket, UdpRepr};
use crate::{Error, Result};

/// The IP header of a RoCE v2 frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IpRepr {
    /// IPv4 (RoCE v2 over IPv4-mapped GIDs).
    Ipv4(Ipv4Repr),
    /// IPv6.
    Ipv6(Ipv6Repr),
}

impl IpRepr {
    /// 4 or 6.
    pub const fn version(&self) -> u8 {
        match self {
            IpRepr::Ipv4(_) => 4,
            IpRepr::Ipv6(_) => 6,
        }
    }
    /// Header length: 20 or 40.
    pub const fn header_len(&self) -> usize {
        match self {
            IpRepr::Ipv4(_) => ipv4::HEADER_LEN,
            IpRepr::Ipv6(_) => ipv6::HEADER_LEN,
        }
    }
    /// DSCP.
    pub const fn dscp(&self) -> u8 {
        match self {
            IpRepr::Ipv4(r) => r.dscp,
            IpRepr::Ipv6(r) => r.dscp,
        }
    }
    /// ECN code point.
    pub const fn ecn(&self) -> Ecn {
        match self {
            IpRepr::Ipv4(r) => r.ecn,
            IpRepr::Ipv6(r) => r.ecn,
        }
    }
    /// Sets the ECN code point.
    pub fn set_ecn(&mut self, ecn: Ecn) {
        match self {
            IpRepr::Ipv4(r) => r.ecn = ecn,
            IpRepr::Ipv6(r) => r.ecn = ecn,
        }
    }
    /// TTL (IPv4) or hop limit (IPv6).
    pub const fn hop_limit(&self) -> u8 {
        match self {
            IpRepr::Ipv4(r) => r.ttl,
            IpRepr::Ipv6(r) => r.hop_limit,
        }
    }
    /// The EtherType that carries this header.
    pub const fn ethertype(&self) -> EtherType {
        match self {
            IpRepr::Ipv4(_) => EtherType::IPV4,
            IpRepr::Ipv6(_) => EtherType::IPV6,
        }
    }
    /// Writes the header for `payload_len` bytes of IP payload.
    pub(crate) fn emit(&self, buf: &mut [u8], payload_len: usize) {
        match self {
            IpRepr::Ipv4(r) => r.emit(&mut Ipv4Packet::new_unchecked(buf), payload_len),
            IpRepr::Ipv6(r) => r.emit(&mut Ipv6Packet::new_unchecked(buf), payload_len),
        }
    }
}

/// Every header field of a RoCE v2 frame, without the payload bytes
/// (`ROCEV2.md §1`). `payload_len` excludes the pad and the ICRC.
///
/// Invariants checked by [`RoceRepr::check`] (and therefore by `emit`):
/// `ext` holds exactly the headers the opcode requires; for a known opcode
/// without payload `payload_len` and the pad count are 0; for a known opcode
/// with payload the pad count is `(−payload_len) mod 4`; `eth.ethertype`
/// matches the IP version; the IP length fits 16 bits. Unknown opcodes carry
/// an opaque payload (everything between BTH and ICRC, pad included).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RoceRepr {
    /// Ethernet header.
    pub eth: EthernetRepr,
    /// IP header.
    pub ip: IpRepr,
    /// UDP header.
    pub udp: UdpRepr,
    /// BTH.
    pub bth: BthRepr,
    /// Extension headers.
    pub ext: ExtRepr,
    /// Payload length in bytes (no pad, no ICRC).
    pub payload_len: usize,
}

/// Why [`RoceRepr::parse_explained`] rejected a frame: the [`Error`] class
/// plus a short fixed reason such as `"UDP length disagrees with IP length"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Rejection {
    /// The error class ([`RoceRepr::parse`] returns just this).
    pub error: Error,
    /// What exactly was wrong.
    pub reason: &'static str,
}

impl core::fmt::Display for Rejection {
    /// `malformed: pad count larger than payload`.
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{}: {}", self.error, self.reason)
    }
}

const fn rej(error: Error, reason: &'static str) -> Rejection {
    Rejection { error, reason }
}

/// Result of [`RoceRepr::parse`]: all fields plus the payload and the
/// integrity checks that do not make the frame unparseable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParsedFrame<'a> {
    /// Header fields.
    pub repr: RoceRepr,
    /// The payload (pad and ICRC excluded).
    pub payload: &'a [u8],
    /// Offset of the payload in the frame.
    pub payload_offset: usize,
    /// The stored ICRC (decoded little-endian, i.e. the CRC value).
    pub icrc: u32,
    /// Whether the stored ICRC matches the computed one (always `true` under
    /// `cfg(fuzzing)`).
    pub icrc_ok: bool,
    /// Whether the IPv4 header checksum is right (`true` for IPv6). The
    /// checksum is masked out of the ICRC, so a bad value does not affect
    /// `icrc_ok`.
    pub ip_checksum_ok: bool,
    /// The raw UDP checksum (0 from every known RoCE sender).
    pub udp_checksum: u16,
    /// `true` if the UDP checksum is 0 or correct. Linux drops datagrams
    /// with a wrong non-zero checksum (`ROCEV2.md §1.4`); receivers that
    /// mirror it drop frames with `false` here. Does not affect `icrc_ok`.
    pub udp_checksum_ok: bool,
    /// Bytes of the frame used (Ethernet header to ICRC end); anything after
    /// it in the input was Ethernet padding.
    pub frame_len: usize,
}

impl ParsedFrame<'_> {
    /// `Ok(())` if the ICRC is good, else [`Error::BadIcrc`].
    ///
    /// # Errors
    /// [`Error::BadIcrc`].
    pub fn check_icrc(&self) -> Result<()> {
        if self.icrc_ok {
            Ok(())
        } else {
            Err(Error::BadIcrc)
        }
    }
}

impl RoceRepr {
    /// Parses a whole frame from untrusted bytes. Never panics.
    ///
    /// The ICRC is located from the IP/UDP lengths, so Ethernet padding after
    /// it is accepted. ICRC and IPv4 header checksum results are reported in
    /// the returned value rather than as errors, so a decoder can still show
    /// the fields of a corrupted frame; receivers must drop frames with
    /// `icrc_ok == false` (`ROCEV2.md §5`).
    ///
    /// # Errors
    /// * [`Error::Truncated`] — the buffer ends before the Ethernet header, or
    ///   before the length the IP header announces.
    /// * [`Error::NotRoce`] — EtherType not IPv4/IPv6, IP protocol not UDP, or
    ///   UDP destination port ≠ 4791.
    /// * [`Error::Malformed`] — bad IP version, IPv4 options or fragment, IP
    ///   and UDP lengths disagree, UDP payload too short for BTH + ICRC or for
    ///   the opcode's extension headers, TVer ≠ 0, payload on an opcode
    ///   without payload, pad count ≠ 0 on such an opcode, BTH..pad not a
    ///   multiple of 4, or pad count larger than the bytes present.
    ///   (`ROCEV2.md §1.7`, §2.2.)
    #[inline]
    pub fn parse(frame: &[u8]) -> Result<ParsedFrame<'_>> {
        Self::parse_explained(frame).map_err(|r| r.error)
    }

    /// [`parse`](Self::parse) with a human-readable reason on rejection (for
    /// decoders, traces and drop counters). Never panics.
    ///
    /// # Errors
    /// As [`parse`](Self::parse), wrapped in a [`Rejection`].
    pub fn parse_explained(frame: &[u8]) -> core::result::Result<ParsedFrame<'_>, Rejection> {
        use Error::{Malformed, NotRoce, Truncated};
        let ethf = EthernetFrame::new_checked(frame).map_err(|e| rej(e, "ethernet header"))?;
        let eth = EthernetRepr::parse(&ethf).map_err(|e| rej(e, "ethernet header"))?;
        let ip_off = eth.header_len();
        let ip_buf = &frame[ip_off..];
        let (ip, ip_hdr_len, ip_payload, ip_checksum_ok) = match eth.ethertype {
            EtherType::IPV4 => {
                let p = Ipv4Packet::new_checked(ip_buf).map_err(|e| match e {
                    Truncated => rej(e, "IPv4 total length exceeds frame"),
                    _ => rej(e, "IPv4 header/total length"),
                })?;
                let r =
                    Ipv4Repr::parse(&p).map_err(|e| rej(e, "IPv4 version, options or fragment"))?;
                if r.protocol != ipv4::PROTOCOL_UDP {
                    return Err(rej(NotRoce, "IP protocol is not UDP"));
                }
                let ok = p.verify_checksum();
                let total = usize::from(p.total_len());
                (
                    IpRepr::Ipv4(r),
                    ipv4::HEADER_LEN,
                    &ip_buf[ipv4::HEADER_LEN..total],
                    ok,
                )
            }
            EtherType::IPV6 => {
                let p = Ipv6Packet::new_checked(ip_buf)
                    .map_err(|e| rej(e, "IPv6 payload length exceeds frame"))?;
                let r = Ipv6Repr::parse(&p).map_err(|e| rej(e, "IPv6 version"))?;
                if r.next_header != ipv4::PROTOCOL_UDP {
                    return Err(rej(NotRoce, "IPv6 next header is not UDP"));
                }
                let end = ipv6::HEADER_LEN + usize::from(p.payload_len());
                (
                    IpRepr::Ipv6(r),
                    ipv6::HEADER_LEN,
                    &ip_buf[ipv6::HEADER_LEN..end],
                    true,
                )
            }
            _ => return Err(rej(NotRoce, "EtherType is not IPv4/IPv6")),
        };
        if ip_payload.len() < udp::HEADER_LEN {
            return Err(rej(Malformed, "IP payload shorter than a UDP header"));
        }
        let udpp = UdpPacket::new_unchecked(ip_payload);
        if udpp.dst_port() != ROCE_V2_PORT {
            return Err(rej(NotRoce, "UDP destination port is not 4791"));
        }
        if usize::from(udpp.len()) != ip_payload.len() {
            return Err(rej(Malformed, "UDP length disagrees with IP length"));
        }
        let udp = UdpRepr::parse(&udpp).map_err(|e| rej(e, "UDP header"))?;
        let udp_payload = &ip_payload[udp::HEADER_LEN..];
        if udp_payload.len() < bth::HEADER_LEN + ICRC_LEN {
            return Err(rej(Malformed, "UDP payload too short for BTH and ICRC"));
        }
        let bth = BthRepr::parse(&Bth::new_unchecked(udp_payload))
            .map_err(|e| rej(e, "BTH TVer is not 0"))?;
        let transport = &udp_payload[bth::HEADER_LEN..udp_payload.len() - ICRC_LEN];
        let ext = ExtRepr::parse(bth.opcode, transport)
            .map_err(|_| rej(Malformed, "too short for the opcode's extension headers"))?;
        let ext_len = ext.byte_len();
        let body = &transport[ext_len..];
        let payload_len = match bth.opcode.info() {
            Some(info) if !info.has_payload() => {
                if !body.is_empty() {
                    return Err(rej(Malformed, "payload on an opcode without payload"));
                }
                if bth.pad_count != 0 {
                    return Err(rej(Malformed, "pad count on an opcode without payload"));
                }
                0
            }
            Some(_) => {
                let pad = usize::from(bth.pad_count);
                if body.len() % 4 != 0 {
                    return Err(rej(Malformed, "BTH..pad not a multiple of 4"));
                }
                if pad > body.len() {
                    return Err(rej(Malformed, "pad count larger than payload"));
                }
                body.len() - pad
            }
            None => body.len(),
        };
        let udp_checksum_ok = match &ip {
            IpRepr::Ipv4(r) => udpp.verify_checksum(r.src_addr.into(), r.dst_addr.into()),
            IpRepr::Ipv6(r) => udpp.verify_checksum(r.src_addr.into(), r.dst_addr.into()),
        };
        // Layout already validated above: IP header + UDP length cover BTH and ICRC.
        let icrc_off = ip_hdr_len + ip_payload.len() - ICRC_LEN;
        let (icrc, computed) =
            icrc::stored_and_computed_at(&frame[ip_off..], ip.version() == 6, icrc_off);
        let icrc_ok = cfg!(fuzzing) || computed == icrc;
        let payload_offset = ip_off + ip_hdr_len + udp::HEADER_LEN + bth::HEADER_LEN + ext_len;
        Ok(ParsedFrame {
            repr: RoceRepr {
                eth,
                ip,
                udp,
                bth,
                ext,
                payload_len,
            },
            payload: &body[..payload_len],
            payload_offset,
            icrc,
            icrc_ok,
            ip_checksum_ok,
            udp_checksum: udpp.checksum(),
            udp_checksum_ok,
            frame_len: ip_off + ip_hdr_len + ip_payload.len(),
        })
    }

    /// Pad bytes after the payload: the BTH pad count for known opcodes, 0 for
    /// unknown opcodes (their pad is part of the opaque payload).
    pub fn pad_len(&self) -> usize {
        if self.bth.opcode.is_known() {
            usize::from(self.bth.pad_count & 3)
        } else {
            0
        }
    }

    /// Length of Ethernet + IP + UDP + BTH + extension headers: the payload
    /// offset in an emitted frame.
    pub fn header_len(&self) -> usize {
        self.eth.header_len()
            + self.ip.header_len()
            + udp::HEADER_LEN
            + bth::HEADER_LEN
            + self.ext.byte_len()
    }

    /// UDP payload length: BTH + extension headers + payload + pad + ICRC.
    pub fn udp_payload_len(&self) -> usize {
        bth::HEADER_LEN + self.ext.byte_len() + self.payload_len + self.pad_len() + ICRC_LEN
    }

    /// Length of the emitted frame in bytes (no Ethernet minimum padding, no
    /// FCS).
    pub fn buffer_len(&self) -> usize {
        self.header_len() + self.payload_len + self.pad_len() + ICRC_LEN
    }

    /// Checks the invariants listed on the type.
    ///
    /// # Errors
    /// [`Error::Malformed`] if one does not hold.
    pub fn check(&self) -> Result<()> {
        if !self.ext.matches(self.bth.opcode) || self.eth.ethertype != self.ip.ethertype() {
            return Err(Error::Malformed);
        }
        if let Some(info) = self.bth.opcode.info() {
            let want_pad = if info.has_payload() {
                ((4 - self.payload_len % 4) % 4) as u8
            } else {
                if self.payload_len != 0 {
                    return Err(Error::Malformed);
                }
                0
            };
            if self.bth.pad_count != want_pad {
                return Err(Error::Malformed);
            }
        }
        let ip_len = match self.ip {
            IpRepr::Ipv4(_) => ipv4::HEADER_LEN + udp::HEADER_LEN + self.udp_payload_len(),
            IpRepr::Ipv6(_) => udp::HEADER_LEN + self.udp_payload_len(),
        };
        if ip_len > usize::from(u16::MAX) {
            return Err(Error::Malformed);
        }
        Ok(())
    }

    /// Emits the whole frame into `frame[..buffer_len()]`: headers, the
    /// payload written by `emit_payload` (given exactly `payload_len` bytes),
    /// zero pad, ICRC. Returns `buffer_len()`. Bytes after it are untouched.
    ///
    /// # Errors
    /// [`Error::Malformed`] if [`check`](Self::check) fails;
    /// [`Error::Truncated`] if `frame` is shorter than `buffer_len()`.
    pub fn emit(&self, frame: &mut [u8], emit_payload: impl FnOnce(&mut [u8])) -> Result<usize> {
        self.check()?;
        let total = self.buffer_len();
        if frame.len() < total {
            return Err(Error::Truncated);
        }
        let frame = &mut frame[..total];
        self.eth
            .emit(&mut EthernetFrame::new_unchecked(&mut *frame));
        let ip_off = self.eth.header_len();
        let udp_off = ip_off + self.ip.header_len();
        let udp_len = udp::HEADER_LEN + self.udp_payload_len();
        self.ip.emit(&mut frame[ip_off..], udp_len);
        self.udp.emit(
            &mut UdpPacket::new_unchecked(&mut frame[udp_off..]),
            self.udp_payload_len(),
        );
        let bth_off = udp_off + udp::HEADER_LEN;
        self.bth
            .emit(&mut Bth::new_unchecked(&mut frame[bth_off..]));
        let ext_off = bth_off + bth::HEADER_LEN;
        let pay_off = ext_off + self.ext.emit(&mut frame[ext_off..])?;
        let pad_off = pay_off + self.payload_len;
        emit_payload(&mut frame[pay_off..pad_off]);
        frame[pad_off..total - ICRC_LEN].fill(0);
        let icrc_off = total - ICRC_LEN - ip_off;
        icrc::fill_at(&mut frame[ip_off..], self.ip.version() == 6, icrc_off);
        Ok(total)
    }

    /// [`emit`](Self::emit) with the payload copied from a slice.
    ///
    /// # Errors
    /// As `emit`; [`Error::Malformed`] if `payload.len() != payload_len`.
    pub fn emit_with_payload(&self, frame: &mut [u8], payload: &[u8]) -> Result<usize> {
        if payload.len() != self.payload_len {
            return Err(Error::Malformed);
        }
        self.emit(frame, |b| b.copy_from_slice(payload))
    }
}

/// A light read-only view of a RoCE v2 frame that already passed
/// [`RoceRepr::parse`] (or was emitted by this crate): offsets are derived
/// from the Ethernet and IP version fields only, so the engine can re-read the
/// BTH or an extension header without re-parsing the whole frame.
#[derive(Debug, Clone, Copy)]
pub struct RoceFrame<'a> {
    frame: &'a [u8],
    bth_off: usize,
}

impl<'a> RoceFrame<'a> {
    /// Wraps a frame, checking only that it is long enough to reach the BTH
    /// end.
    ///
    /// # Errors
    /// [`Error::Truncated`]; [`Error::NotRoce`] if the EtherType is not IP.
    pub fn new(frame: &'a [u8]) -> Result<Self> {
        let eth = EthernetFrame::new_checked(frame)?;
        let ip_len = match eth.ethertype() {
            EtherType::IPV4 => ipv4::HEADER_LEN,
            EtherType::IPV6 => ipv6::HEADER_LEN,
            _ => return Err(Error::NotRoce),
        };
        let bth_off = eth.header_len() + ip_len + udp::HEADER_LEN;
        if frame.len() < bth_off + bth::HEADER_LEN {
            return Err(Error::Truncated);
        }
        Ok(RoceFrame { frame, bth_off })
    }

    /// Offset of the BTH.
    pub fn bth_offset(&self) -> usize {
        self.bth_off
    }

    /// The BTH view.
    pub fn bth(&self) -> Bth<&'a [u8]> {
        Bth::new_unchecked(&self.frame[self.bth_off..])
    }

    /// Bytes after the BTH (extension headers, payload, pad, ICRC, and any
    /// Ethernet padding).
    pub fn after_bth(&self) -> &'a [u8] {
        &self.frame[self.bth_off + bth::HEADER_LEN..]
    }

    /// The whole frame.
    pub fn as_bytes(&self) -> &'a [u8] {
        self.frame
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{AethSyndrome, CnpRepr, IethRepr, Msn, Opcode, Psn, Qpn, RethRepr};

    /// An ACK sent by Linux rxe, taken from
    /// `testdata/interop/captures/rc_pingpong.pcap` (guest to guest):
    /// Ethernet 52:54:c6:12:00:03 -> 52:54:c6:12:00:02, IPv4 198.18.0.3 ->
    /// 198.18.0.2 (TOS 0, ID 0x48e1, DF, TTL 64), UDP 0xc121 -> 4791 csum 0,
    /// BTH ACKNOWLEDGE QP 0x000011 PSN 0x7835f3, AETH 0x1f MSN 1,
    /// ICRC wire bytes 69 fc a5 15.
    static RXE_ACK: [u8; 62] = [
        0x52, 0x54, 0xc6, 0x12, 0x00, 0x02, 0x52, 0x54, 0xc6, 0x12, 0x00, 0x03, 0x08,
        0x00, // eth
        0x45, 0x00, 0x00, 0x30, 0x48, 0xe1, 0x40, 0x00, 0x40, 0x11, 0x65, 0xb2, // ipv4
        0xc6, 0x12, 0x00, 0x03, 0xc6, 0x12, 0x00, 0x02, //
        0xc1, 0x21, 0x12, 0xb7, 0x00, 0x1c, 0x00, 0x00, // udp
        0x11, 0x00, 0xff, 0xff, 0x00, 0x00, 0x00, 0x11, 0x00, 0x78, 0x35, 0xf3, // bth
        0x1f, 0x00, 0x00, 0x01, // aeth
        0x69, 0xfc, 0xa5, 0x15, // icrc
    ];

    /// The `cnp` vector of `vectors.json` (`ROCEV2.md §6`): 192.0.2.2 ->
    /// 192.0.2.1, TOS 0xc0 (DSCP 48), BTH 0x81 with BECN, QP 0x000011,
    /// 16 zero bytes, ICRC 0xd9306dee.
    static CNP: [u8; 74] = [
        0x02, 0x00, 0x00, 0x00, 0x00, 0x01, 0x02, 0x00, 0x00, 0x00, 0x00, 0x02, 0x08,
        0x00, // eth
        0x45, 0xc0, 0x00, 0x3c, 0x01, 0x1a, 0x40, 0x00, 0x40, 0x11, 0xb4, 0xd3, // ipv4
        0xc0, 0x00, 0x02, 0x02, 0xc0, 0x00, 0x02, 0x01, //
        0xc1, 0x32, 0x12, 0xb7, 0x00, 0x28, 0x00, 0x00, // udp
        0x81, 0x00, 0xff, 0xff, 0x40, 0x00, 0x00, 0x11, 0x00, 0x00, 0x00, 0x00, // bth
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, // cnp body
        0xee, 0x6d, 0x30, 0xd9, // icrc
    ];

    #[test]
    fn rxe_ack_golden() {
        let p = RoceRepr::parse(&RXE_ACK).unwrap();
        assert!(p.icrc_ok && p.ip_checksum_ok && p.udp_checksum_ok);
        assert_eq!(p.icrc, 0x15a5_fc69);
        let r = &p.repr;
        assert_eq!(r.bth.opcode, Opcode::RC_ACKNOWLEDGE);
        assert_eq!(r.bth.dest_qp, Qpn::new(0x11));
        assert_eq!(r.bth.psn, Psn::new(0x7835f3));
        let aeth = r.ext.aeth.unwrap();
        assert_eq!(aeth.syndrome, AethSyndrome::ACK);
        assert_eq!(aeth.msn, Msn::new(1));
        assert_eq!(r.udp.src_port, 0xc121);
        assert_eq!(r.payload_len, 0);
        let mut out = [0u8; 62];
        assert_eq!(r.emit(&mut out, |_| {}).unwrap(), 62);
        assert_eq!(out, RXE_ACK);
    }

    #[test]
    fn cnp_golden() {
        let p = RoceRepr::parse(&CNP).unwrap();
        assert!(p.icrc_ok);
        assert_eq!(p.icrc, 0xd930_6dee);
        let r = &p.repr;
        assert_eq!(r.bth.opcode, Opcode::CNP);
        assert!(r.bth.becn && !r.bth.fecn && !r.bth.ack_req);
        assert_eq!(r.ext.cnp, Some(CnpRepr));
        assert_eq!(r.ip.dscp(), 48);
        assert_eq!(r.buffer_len(), 74);
        let mut out = [0u8; 74];
        r.emit(&mut out, |_| {}).unwrap();
        assert_eq!(out, CNP);
        // Light view.
        let v = RoceFrame::new(&CNP).unwrap();
        assert_eq!(v.bth_offset(), 42);
        assert!(v.bth().becn());
        assert_eq!(v.after_bth().len(), 20);
        assert_eq!(v.as_bytes().len(), 74);
    }

    /// SEND ONLY with invalidate carrying a memory window's R_Key in its IETH (`ROCEV2.md` §1.6, §2.1: the 4-byte IETH right
    /// after the BTH): 192.0.2.1 -> 192.0.2.2, QP 0x000012, PSN 5, AckReq, 13-byte payload (PadCnt 3), IETH R_Key
    /// 0x80000a17. Bytes laid out by hand; the ICRC (0x5ca40264) computed separately and verified with the
    /// independent checker `testdata/tools/check_pcap.py --strict` (its output: `RC_SEND_ONLY_WITH_INVALIDATE …
    /// icrc=6402a45c`, `1 passed`).
    static SEND_ONLY_INV: [u8; 78] = [
        0x02, 0x00, 0x00, 0x00, 0x00, 0x02, 0x02, 0x00, 0x00, 0x00, 0x00, 0x01, 0x08,
        0x00, // eth
        0x45, 0x00, 0x00, 0x40, 0x00, 0x01, 0x40, 0x00, 0x40, 0x11, 0xb6, 0xa8, // ipv4
        0xc0, 0x00, 0x02, 0x01, 0xc0, 0x00, 0x02, 0x02, 0xc1, 0x32, 0x12, 0xb7, 0x00, 0x2c, 0x00,
        0x00, // udp
        0x17, 0x30, 0xff, 0xff, 0x00, 0x00, 0x00, 0x12, 0x80, 0x00, 0x00, 0x05, // bth
        0x80, 0x00, 0x0a, 0x17, // ieth
        0x72, 0x6f, 0x63, 0x65, 0x76, 0x32, 0x20, 0x77, 0x69, 0x6e, 0x64, 0x6f,
        0x77, // payload
        0x00, 0x00, 0x00, // pad
        0x64, 0x02, 0xa4, 0x5c, // icrc
    ];

    /// RDMA ATOMIC WRITE (opcode 0x1D, `ROCEV2.md` §2.1; IBTA Vol 1 1.5): RETH (VA 0x7f0000001040, R_Key 0x13c, DMA length 8) and the 8
    /// payload bytes `rocev2!!`, PSN 6, AckReq; made and checked as [`SEND_ONLY_INV`] (`check_pcap.py`:
    /// `RC_ATOMIC_WRITE … icrc=22f03b50`).
    static ATOMIC_WRITE: [u8; 82] = [
        0x02, 0x00, 0x00, 0x00, 0x00, 0x02, 0x02, 0x00, 0x00, 0x00, 0x00, 0x01, 0x08,
        0x00, // eth
        0x45, 0x00, 0x00, 0x44, 0x00, 0x01, 0x40, 0x00, 0x40, 0x11, 0xb6, 0xa4, // ipv4
        0xc0, 0x00, 0x02, 0x01, 0xc0, 0x00, 0x02, 0x02, 0xc1, 0x32, 0x12, 0xb7, 0x00, 0x30, 0x00,
        0x00, // udp
        0x1d, 0x00, 0xff, 0xff, 0x00, 0x00, 0x00, 0x12, 0x80, 0x00, 0x00, 0x06, // bth
        0x00, 0x00, 0x7f, 0x00, 0x00, 0x00, 0x10, 0x40, 0x00, 0x00, 0x01, 0x3c, 0x00, 0x00, 0x00,
        0x08, // reth
        0x72, 0x6f, 0x63, 0x65, 0x76, 0x32, 0x21, 0x21, // payload
        0x22, 0xf0, 0x3b, 0x50, // icrc
    ];

    #[test]
    fn send_only_with_invalidate_golden() {
        let p = RoceRepr::parse(&SEND_ONLY_INV).unwrap();
        assert!(p.icrc_ok && p.ip_checksum_ok);
        assert_eq!(p.icrc, 0x5ca4_0264);
        let r = &p.repr;
        assert_eq!(r.bth.opcode, Opcode::RC_SEND_ONLY_WITH_INVALIDATE);
        assert_eq!((r.bth.dest_qp, r.bth.psn), (Qpn::new(0x12), Psn::new(5)));
        assert!(r.bth.ack_req);
        assert_eq!(r.bth.pad_count, 3);
        assert_eq!(r.ext.ieth, Some(IethRepr { rkey: 0x8000_0a17 }));
        assert_eq!(r.payload_len, 13);
        assert_eq!(p.payload, b"rocev2 window");
        let mut out = [0u8; 78];
        assert_eq!(
            r.emit(&mut out, |b| b.copy_from_slice(b"rocev2 window"))
                .unwrap(),
            78
        );
        assert_eq!(out, SEND_ONLY_INV);
        // The IETH is the 4 bytes after the BTH.
        assert_eq!(&SEND_ONLY_INV[54..58], &0x8000_0a17u32.to_be_bytes());
    }

    #[test]
    fn atomic_write_golden() {
        let p = RoceRepr::parse(&ATOMIC_WRITE).unwrap();
        assert!(p.icrc_ok && p.ip_checksum_ok);
        assert_eq!(p.icrc, 0x503b_f022);
        let r = &p.repr;
        assert_eq!(r.bth.opcode, Opcode::RC_ATOMIC_WRITE);
        assert_eq!(
            r.ext.reth,
            Some(RethRepr {
                va: 0x7f00_0000_1040,
                rkey: 0x13c,
                dma_len: 8
            })
        );
        assert_eq!(p.payload, b"rocev2!!");
        let mut out = [0u8; 82];
        assert_eq!(
            r.emit(&mut out, |b| b.copy_from_slice(b"rocev2!!"))
                .unwrap(),
            82
        );
        assert_eq!(out, ATOMIC_WRITE);
    }

    #[test]
    fn light_view_rejects() {
        assert_eq!(
            RoceFrame::new(&RXE_ACK[..50]).unwrap_err(),
            Error::Truncated
        );
        let mut arp = RXE_ACK;
        arp[12] = 0x08;
        arp[13] = 0x06;
        assert_eq!(RoceFrame::new(&arp).unwrap_err(), Error::NotRoce);
    }

    #[test]
    fn explained_reasons() {
        let r = RoceRepr::parse_explained(&RXE_ACK[..61]).unwrap_err();
        assert_eq!(r.error, Error::Truncated);
        assert_eq!(
            std::format!("{r}"),
            "truncated: IPv4 total length exceeds frame"
        );
    }
}
