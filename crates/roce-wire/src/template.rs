//! Per-QP header template (STYLE W8): the Ethernet + IP + UDP + BTH byte image
//! is built once from reprs; per packet only the BTH opcode, flags (SE,
//! PadCnt), AckReq and PSN, the IP and UDP lengths and the IPv4 checksum are
//! patched. The IPv4 checksum is updated incrementally (RFC 1624) from the
//! template's precomputed value. The caller appends extension headers and
//! payload, then [`HeaderTemplate::finish`] zeroes the pad and writes the ICRC.
//!
//! The output is byte-identical to [`RoceRepr::emit`](crate::RoceRepr::emit)
//! for the same field values (proptested in this module).

use crate::bth::{self, Bth, BthRepr};
use crate::eth::{EthernetFrame, EthernetRepr, VLAN_HEADER_LEN};
use crate::ext::ExtRepr;
use crate::frame::{IpRepr, RoceRepr};
use crate::icrc::{self, ICRC_LEN};
use crate::ipv4::{self, Ipv4Packet};
use crate::ipv6::{self, Ipv6Packet};
use crate::opcode::Opcode;
use crate::udp::{self, UdpPacket, UdpRepr};
use crate::{Error, Psn, Qpn, Result};

/// Largest template: 802.1Q Ethernet + IPv6 + UDP + BTH = 78 bytes.
pub const MAX_TEMPLATE_LEN: usize =
    VLAN_HEADER_LEN + ipv6::HEADER_LEN + udp::HEADER_LEN + bth::HEADER_LEN;

/// The per-packet BTH fields a sender chooses. PadCnt is derived from the
/// payload length; P_Key, M, FECN/BECN and DestQP come from the template.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PacketHeader {
    /// Opcode.
    pub opcode: Opcode,
    /// SE bit.
    pub solicited: bool,
    /// AckReq bit.
    pub ack_req: bool,
    /// PSN.
    pub psn: Psn,
}

/// A precomputed Eth/IP/UDP/BTH image plus the offsets of the per-packet
/// fields. Cheap to copy (about 100 bytes); build it when a QP reaches RTR/RTS
/// (or per UD address handle).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeaderTemplate {
    image: [u8; MAX_TEMPLATE_LEN],
    len: u8,
    ip_off: u8,
    udp_off: u8,
    v6: bool,
    /// IPv4 total length and checksum stored in the image (base for RFC 1624).
    base_ip_len: u16,
    base_ip_csum: u16,
    /// ICRC hasher state after the image's masked IP + UDP + BTH headers: [`finish`](Self::finish) derives each
    /// packet's from it by patching only the per-packet fields (`icrc::header_state`).
    icrc_base: u32,
}

impl HeaderTemplate {
    /// Builds the image. Fields of `bth` that vary per packet (opcode, SE,
    /// pad count, AckReq, PSN) are overwritten by [`write_headers`]; the rest
    /// (P_Key, M, FECN, BECN, DestQP) is kept. `eth.ethertype` is taken from
    /// the IP version.
    ///
    /// [`write_headers`]: HeaderTemplate::write_headers
    pub fn new(eth: &EthernetRepr, ip: &IpRepr, udp: &UdpRepr, bth: &BthRepr) -> Self {
        let mut image = [0u8; MAX_TEMPLATE_LEN];
        let eth = EthernetRepr {
            ethertype: ip.ethertype(),
            ..*eth
        };
        eth.emit(&mut EthernetFrame::new_unchecked(&mut image[..]));
        let ip_off = eth.header_len();
        let udp_off = ip_off + ip.header_len();
        let bth_off = udp_off + udp::HEADER_LEN;
        let len = bth_off + bth::HEADER_LEN;
        // Base lengths: an empty packet (BTH + ICRC).
        let base_udp_payload = bth::HEADER_LEN + ICRC_LEN;
        ip.emit(&mut image[ip_off..], udp::HEADER_LEN + base_udp_payload);
        udp.emit(
            &mut UdpPacket::new_unchecked(&mut image[udp_off..]),
            base_udp_payload,
        );
        bth.emit(&mut Bth::new_unchecked(&mut image[bth_off..len]));
        let (v6, base_ip_len, base_ip_csum) = match ip {
            IpRepr::Ipv4(_) => {
                let p = Ipv4Packet::new_unchecked(&image[ip_off..]);
                (false, p.total_len(), p.checksum())
            }
            IpRepr::Ipv6(_) => (true, 0, 0),
        };
        let icrc_base = icrc::header_state_full(&image[ip_off..len], v6);
        HeaderTemplate {
            image,
            len: len as u8,
            ip_off: ip_off as u8,
            udp_off: udp_off as u8,
            v6,
            base_ip_len,
            base_ip_csum,
            icrc_base,
        }
    }

    /// Builds the template from the headers of a whole-frame repr.
    pub fn from_repr(repr: &RoceRepr) -> Self {
        Self::new(&repr.eth, &repr.ip, &repr.udp, &repr.bth)
    }

    /// Length of the image (Ethernet .. BTH end); extension headers start here.
    pub fn header_len(&self) -> usize {
        usize::from(self.len)
    }

    /// Offset of the IP header.
    pub fn ip_offset(&self) -> usize {
        usize::from(self.ip_off)
    }

    /// Offset of the UDP header (e.g. to patch the source port per UD WR).
    pub fn udp_offset(&self) -> usize {
        usize::from(self.udp_off)
    }

    /// Offset of the BTH.
    pub fn bth_offset(&self) -> usize {
        usize::from(self.udp_off) + udp::HEADER_LEN
    }

    /// The image bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.image[..self.header_len()]
    }

    /// Pad count for a payload of `payload_len` bytes: `(−len) mod 4`.
    pub const fn pad_for(payload_len: usize) -> usize {
        (4 - payload_len % 4) % 4
    }

    /// Frame length for `ext_len` bytes of extension headers and
    /// `payload_len` bytes of payload (pad and ICRC included).
    pub fn frame_len(&self, ext_len: usize, payload_len: usize) -> usize {
        self.header_len() + ext_len + payload_len + Self::pad_for(payload_len) + ICRC_LEN
    }

    /// Changes the destination QP in the image (UD: per work request).
    pub fn set_dest_qp(&mut self, qpn: Qpn) {
        let off = self.bth_offset();
        Bth::new_unchecked(&mut self.image[off..]).set_dest_qp(qpn);
        let (ip, end) = (self.ip_offset(), self.header_len());
        self.icrc_base = icrc::header_state_full(&self.image[ip..end], self.v6);
    }

    /// Copies the image into `frame` and patches the per-packet fields.
    /// PadCnt is set to `(−payload_len) mod 4`, which is what every known
    /// payload-carrying opcode needs (`ROCEV2.md §1.7`); emit frames with
    /// unknown opcodes through [`RoceRepr::emit`] instead.
    /// Afterwards the caller writes `ext_len` bytes of extension headers at
    /// `header_len()` and the payload right after them, then calls
    /// [`finish`](Self::finish). Returns the frame length.
    ///
    /// # Errors
    /// [`Error::Truncated`] if `frame` is shorter than the frame length;
    /// [`Error::Malformed`] if the lengths do not fit the 16-bit IP/UDP length
    /// fields.
    pub fn write_headers(
        &self,
        frame: &mut [u8],
        hdr: &PacketHeader,
        ext_len: usize,
        payload_len: usize,
    ) -> Result<usize> {
        let total = self.frame_len(ext_len, payload_len);
        if frame.len() < total {
            return Err(Error::Truncated);
        }
        let hl = self.header_len();
        let udp_len = total - usize::from(self.udp_off);
        let ip_total = total - usize::from(self.ip_off);
        if ip_total > usize::from(u16::MAX) {
            return Err(Error::Malformed);
        }
        frame[..hl].copy_from_slice(&self.image[..hl]);
        let ip_off = usize::from(self.ip_off);
        if self.v6 {
            let mut p = Ipv6Packet::new_unchecked(&mut frame[ip_off..]);
            p.set_payload_len(udp_len as u16);
        } else {
            let mut p = Ipv4Packet::new_unchecked(&mut frame[ip_off..]);
            let new_len = ip_total as u16;
            p.set_total_len(new_len);
            p.set_checksum(ipv4::checksum_update(
                self.base_ip_csum,
                self.base_ip_len,
                new_len,
            ));
        }
        UdpPacket::new_unchecked(&mut frame[usize::from(self.udp_off)..]).set_len(udp_len as u16);
        let mut b = Bth::new_unchecked(&mut frame[self.bth_offset()..hl]);
        b.set_opcode(hdr.opcode);
        b.set_solicited(hdr.solicited);
        b.set_pad_count(Self::pad_for(payload_len) as u8);
        b.set_ack_req(hdr.ack_req);
        b.set_psn(hdr.psn);
        Ok(total)
    }

    /// Zeroes the pad bytes (count taken from the BTH in `frame`) and writes
    /// the ICRC of `frame[..frame_len]`.
    ///
    /// The masked headers are not hashed again: their CRC comes from the
    /// template's precomputed state, patched for the per-packet fields
    /// [`write_headers`](Self::write_headers) writes (lengths, BTH opcode,
    /// flags, AckReq, PSN) and for a changed BTH DestQP or UDP source port
    /// (UD). Any other header byte must be left as the template wrote it
    /// (debug builds assert the result against a full hash).
    ///
    /// # Errors
    /// [`Error::Truncated`] / [`Error::Malformed`] if `frame` does not hold a
    /// frame written by [`write_headers`](Self::write_headers) of `frame_len`
    /// bytes (the IP length field must match `frame_len`).
    pub fn finish(&self, frame: &mut [u8], frame_len: usize) -> Result<()> {
        if frame.len() < frame_len || frame_len < self.header_len() + ICRC_LEN {
            return Err(Error::Truncated);
        }
        let pad = usize::from(Bth::new_unchecked(&frame[self.bth_offset()..]).pad_count());
        let icrc_off = frame_len - ICRC_LEN;
        if icrc_off < self.header_len() + pad {
            return Err(Error::Malformed);
        }
        let ip_off = usize::from(self.ip_off);
        // The IP length written by write_headers must agree with frame_len.
        let ip_end = if self.v6 {
            ip_off
                + ipv6::HEADER_LEN
                + usize::from(Ipv6Packet::new_unchecked(&frame[ip_off..]).payload_len())
        } else {
            ip_off + usize::from(Ipv4Packet::new_unchecked(&frame[ip_off..]).total_len())
        };
        if ip_end != frame_len {
            return Err(Error::Malformed);
        }
        // Pad (0-3 bytes) as one 4-byte store that may run into the ICRC field, written right after.
        frame[icrc_off - pad..icrc_off - pad + ICRC_LEN].copy_from_slice(&[0; ICRC_LEN]);
        let ip = &mut frame[ip_off..frame_len];
        let state = icrc::header_state(self.icrc_base, &self.image[ip_off..], ip, self.v6);
        debug_assert_eq!(state, icrc::header_state_full(ip, self.v6));
        icrc::fill_from(ip, self.v6, state, icrc_off - ip_off);
        Ok(())
    }

    /// For a frame whose payload is not stored after its headers (a link
    /// gathers it from elsewhere): the ICRC hasher after the masked headers
    /// and the `ext_len` extension-header bytes at
    /// [`header_len`](Self::header_len) of `frame`, which
    /// [`write_headers`](Self::write_headers) wrote (same rule as
    /// [`finish`](Self::finish) for the other header bytes). Feed it the
    /// payload, then call [`write_trailer`](Self::write_trailer).
    ///
    /// # Errors
    /// [`Error::Truncated`] if `frame` is shorter than the headers + `ext_len`.
    pub fn icrc_hasher(&self, frame: &[u8], ext_len: usize) -> Result<crc32fast::Hasher> {
        let (ip_off, hl) = (usize::from(self.ip_off), self.header_len());
        let head = frame.get(ip_off..hl + ext_len).ok_or(Error::Truncated)?;
        let state = icrc::header_state(self.icrc_base, &self.image[ip_off..], head, self.v6);
        debug_assert_eq!(state, icrc::header_state_full(head, self.v6));
        let mut h = crc32fast::Hasher::new_with_initial(state);
        h.update(&head[hl - ip_off..]);
        Ok(h)
    }

    /// Writes the pad of a `payload_len`-byte payload (zeros) and the ICRC,
    /// finalised from `h` (which has seen headers and payload, see
    /// [`icrc_hasher`](Self::icrc_hasher)), at `out[..]`. Returns the bytes
    /// written: pad + [`ICRC_LEN`].
    ///
    /// # Errors
    /// [`Error::Truncated`] if `out` is shorter than that.
    pub fn write_trailer(
        &self,
        out: &mut [u8],
        payload_len: usize,
        mut h: crc32fast::Hasher,
    ) -> Result<usize> {
        let pad = Self::pad_for(payload_len);
        let t = out.get_mut(..pad + ICRC_LEN).ok_or(Error::Truncated)?;
        t[..pad].fill(0);
        h.update(&t[..pad]);
        t[pad..].copy_from_slice(&h.finalize().to_le_bytes());
        Ok(pad + ICRC_LEN)
    }

    /// One-call emit: headers, `ext`, payload from `emit_payload` (given
    /// exactly `payload_len` bytes), pad, ICRC. Returns the frame length.
    ///
    /// # Errors
    /// [`Error::Malformed`] if `ext` does not match `hdr.opcode`, or the
    /// opcode carries no payload and `payload_len` ≠ 0; otherwise as
    /// [`write_headers`](Self::write_headers).
    pub fn emit(
        &self,
        frame: &mut [u8],
        hdr: &PacketHeader,
        ext: &ExtRepr,
        payload_len: usize,
        emit_payload: impl FnOnce(&mut [u8]),
    ) -> Result<usize> {
        if !ext.matches(hdr.opcode) || (payload_len != 0 && !hdr.opcode.has_payload()) {
            return Err(Error::Malformed);
        }
        let ext_len = ext.byte_len();
        let total = self.write_headers(frame, hdr, ext_len, payload_len)?;
        let hl = self.header_len();
        ext.emit(&mut frame[hl..hl + ext_len])?;
        let pay = hl + ext_len;
        emit_payload(&mut frame[pay..pay + payload_len]);
        self.finish(frame, total)?;
        Ok(total)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::eth::{EtherType, EthernetAddress};
    use crate::ipv4::{Ecn, Ipv4Repr};
    use crate::udp::ROCE_V2_PORT;
    use crate::{AethRepr, AethSyndrome, Msn};
    use core::net::Ipv4Addr;

    fn template() -> HeaderTemplate {
        let eth = EthernetRepr {
            src_addr: EthernetAddress([2, 0, 0, 0, 0, 1]),
            dst_addr: EthernetAddress([2, 0, 0, 0, 0, 2]),
            vlan: None,
            ethertype: EtherType::IPV6, // corrected from the IP version
        };
        let ip = IpRepr::Ipv4(Ipv4Repr {
            src_addr: Ipv4Addr::new(192, 0, 2, 1),
            dst_addr: Ipv4Addr::new(192, 0, 2, 2),
            dscp: 26,
            ecn: Ecn::Ect0,
            ident: 7,
            dont_frag: true,
            ttl: 64,
            protocol: 17,
        });
        let udp = UdpRepr {
            src_port: 0xc132,
            dst_port: ROCE_V2_PORT,
        };
        let bth = BthRepr {
            opcode: Opcode::RC_SEND_ONLY,
            solicited: false,
            mig_req: false,
            pad_count: 0,
            pkey: 0xffff,
            fecn: false,
            becn: false,
            dest_qp: Qpn::new(0x12),
            ack_req: false,
            psn: Psn::ZERO,
        };
        HeaderTemplate::new(&eth, &ip, &udp, &bth)
    }

    const HDR: PacketHeader = PacketHeader {
        opcode: Opcode::RC_SEND_ONLY,
        solicited: true,
        ack_req: true,
        psn: Psn::new(5),
    };

    #[test]
    fn layout_and_emit() {
        let t = template();
        assert_eq!(
            (
                t.ip_offset(),
                t.udp_offset(),
                t.bth_offset(),
                t.header_len()
            ),
            (14, 34, 42, 54)
        );
        assert_eq!(&t.as_bytes()[12..14], &[0x08, 0x00]);
        assert_eq!(t.frame_len(0, 5), 54 + 5 + 3 + 4);
        let mut f = [0u8; 80];
        let n = t
            .emit(&mut f, &HDR, &ExtRepr::NONE, 5, |b| {
                b.copy_from_slice(b"hello")
            })
            .unwrap();
        assert_eq!(n, 66);
        let p = RoceRepr::parse(&f[..n]).unwrap();
        assert!(p.icrc_ok && p.ip_checksum_ok);
        assert_eq!(p.repr.bth.pad_count, 3);
        assert_eq!(p.repr.bth.psn, Psn::new(5));
        assert!(p.repr.bth.solicited && p.repr.bth.ack_req);
        assert_eq!(p.payload, b"hello");
    }

    #[test]
    fn gathered_trailer_matches_finish() {
        let t = template();
        for plen in [0usize, 1, 5, 64, 301] {
            let payload: std::vec::Vec<u8> = (0..plen).map(|i| i as u8 ^ 0x5a).collect();
            let mut f = [0u8; 512];
            let n = t
                .emit(&mut f, &HDR, &ExtRepr::NONE, plen, |b| {
                    b.copy_from_slice(&payload)
                })
                .unwrap();
            let mut g = [0u8; 512];
            t.write_headers(&mut g, &HDR, 0, plen).unwrap();
            let hl = t.header_len();
            let mut h = t.icrc_hasher(&g, 0).unwrap();
            h.update(&payload[..plen / 2]);
            h.update(&payload[plen / 2..]);
            let mut tail = [0u8; 8];
            let k = t.write_trailer(&mut tail, plen, h).unwrap();
            assert_eq!(hl + plen + k, n);
            assert_eq!(&g[..hl], &f[..hl], "plen {plen}");
            assert_eq!(&tail[..k], &f[hl + plen..n], "plen {plen}: pad + ICRC");
        }
    }

    #[test]
    fn set_dest_qp() {
        let mut t = template();
        t.set_dest_qp(Qpn::new(0x456));
        let mut f = [0u8; 80];
        let n = t.emit(&mut f, &HDR, &ExtRepr::NONE, 0, |_| {}).unwrap();
        assert_eq!(
            RoceRepr::parse(&f[..n]).unwrap().repr.bth.dest_qp,
            Qpn::new(0x456)
        );
    }

    #[test]
    fn errors() {
        let t = template();
        let mut f = [0u8; 80];
        // Buffer too short.
        assert_eq!(
            t.write_headers(&mut f[..60], &HDR, 0, 8),
            Err(Error::Truncated)
        );
        // Extension headers that do not match the opcode.
        let aeth = ExtRepr {
            aeth: Some(AethRepr {
                syndrome: AethSyndrome::ACK,
                msn: Msn::ZERO,
            }),
            ..ExtRepr::NONE
        };
        assert_eq!(
            t.emit(&mut f, &HDR, &aeth, 0, |_| {}),
            Err(Error::Malformed)
        );
        // Payload on an opcode without payload.
        let ack = PacketHeader {
            opcode: Opcode::RC_ACKNOWLEDGE,
            ..HDR
        };
        assert_eq!(
            t.emit(&mut f, &ack, &aeth, 4, |_| {}),
            Err(Error::Malformed)
        );
        // finish with a length that disagrees with the IP header.
        let n = t.write_headers(&mut f, &HDR, 0, 8).unwrap();
        assert_eq!(t.finish(&mut f, n + 4), Err(Error::Malformed));
        assert_eq!(t.finish(&mut f, 10), Err(Error::Truncated));
        t.finish(&mut f, n).unwrap();
        assert!(RoceRepr::parse(&f[..n]).unwrap().icrc_ok);
        // IP length limit.
        let mut big = [0u8; 8];
        assert_eq!(
            t.write_headers(&mut big, &HDR, 0, 70_000),
            Err(Error::Truncated)
        );
    }
}
