//! The engine's narrow seam to `roce-wire` (one concept, one place): frame parsing (`RoceRepr::parse`, ICRC check),
//! emission through per-QP `HeaderTemplate`s, the opcode table, the UDP source-port rule and the RNR timer table all
//! come from `roce-wire`; this module only converts between its reprs and the compact shapes the requester and
//! responder match on.

use core::net::{Ipv4Addr, Ipv6Addr};
use core::time::Duration;

use roce_wire::template::PacketHeader;
use roce_wire::{
    AethRepr, AethSyndrome, AtomicAckEthRepr, AtomicEthRepr, BthRepr, CnpRepr, DethRepr, Ecn,
    EtherType, EthernetAddress, EthernetRepr, ExtRepr, HeaderTemplate, IethRepr, ImmDtRepr, IpRepr,
    Ipv4Repr, Ipv6Repr, Msn, Opcode, ROCE_V2_PORT, RethRepr, RoceRepr, UdpPacket, UdpRepr,
};

use crate::verbs::{AhAttr, Gid};
use crate::{Psn, Qpn};

/// ECN code point CE (IP TOS low two bits `11`, `ROCEV2.md §1.4`).
pub(crate) const ECN_CE: u8 = Ecn::Ce as u8;

/// BTH opcodes as raw bytes for `match` arms, taken from the `roce_wire::Opcode` table (`ROCEV2.md §2.1`); the
/// classification helpers read the same table (one truth for parse, emit and the engine).
#[allow(dead_code)]
pub(crate) mod op {
    use roce_wire::{Direction, MsgPosition, OpKind, Opcode, Transport};

    pub(crate) const SEND_FIRST: u8 = Opcode::RC_SEND_FIRST.0;
    pub(crate) const SEND_MIDDLE: u8 = Opcode::RC_SEND_MIDDLE.0;
    pub(crate) const SEND_LAST: u8 = Opcode::RC_SEND_LAST.0;
    pub(crate) const SEND_LAST_IMM: u8 = Opcode::RC_SEND_LAST_WITH_IMMEDIATE.0;
    pub(crate) const SEND_ONLY: u8 = Opcode::RC_SEND_ONLY.0;
    pub(crate) const SEND_ONLY_IMM: u8 = Opcode::RC_SEND_ONLY_WITH_IMMEDIATE.0;
    pub(crate) const WRITE_FIRST: u8 = Opcode::RC_RDMA_WRITE_FIRST.0;
    pub(crate) const WRITE_MIDDLE: u8 = Opcode::RC_RDMA_WRITE_MIDDLE.0;
    pub(crate) const WRITE_LAST: u8 = Opcode::RC_RDMA_WRITE_LAST.0;
    pub(crate) const WRITE_LAST_IMM: u8 = Opcode::RC_RDMA_WRITE_LAST_WITH_IMMEDIATE.0;
    pub(crate) const WRITE_ONLY: u8 = Opcode::RC_RDMA_WRITE_ONLY.0;
    pub(crate) const WRITE_ONLY_IMM: u8 = Opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE.0;
    pub(crate) const RDMA_READ_REQUEST: u8 = Opcode::RC_RDMA_READ_REQUEST.0;
    pub(crate) const READ_RESPONSE_FIRST: u8 = Opcode::RC_RDMA_READ_RESPONSE_FIRST.0;
    pub(crate) const READ_RESPONSE_MIDDLE: u8 = Opcode::RC_RDMA_READ_RESPONSE_MIDDLE.0;
    pub(crate) const READ_RESPONSE_LAST: u8 = Opcode::RC_RDMA_READ_RESPONSE_LAST.0;
    pub(crate) const READ_RESPONSE_ONLY: u8 = Opcode::RC_RDMA_READ_RESPONSE_ONLY.0;
    pub(crate) const ACKNOWLEDGE: u8 = Opcode::RC_ACKNOWLEDGE.0;
    pub(crate) const ATOMIC_ACKNOWLEDGE: u8 = Opcode::RC_ATOMIC_ACKNOWLEDGE.0;
    pub(crate) const COMPARE_SWAP: u8 = Opcode::RC_COMPARE_SWAP.0;
    pub(crate) const FETCH_ADD: u8 = Opcode::RC_FETCH_ADD.0;
    pub(crate) const ATOMIC_WRITE: u8 = Opcode::RC_ATOMIC_WRITE.0;
    pub(crate) const SEND_LAST_INV: u8 = Opcode::RC_SEND_LAST_WITH_INVALIDATE.0;
    pub(crate) const SEND_ONLY_INV: u8 = Opcode::RC_SEND_ONLY_WITH_INVALIDATE.0;
    pub(crate) const UD_SEND_ONLY: u8 = Opcode::UD_SEND_ONLY.0;
    pub(crate) const UD_SEND_ONLY_IMM: u8 = Opcode::UD_SEND_ONLY_WITH_IMMEDIATE.0;
    pub(crate) const CNP: u8 = Opcode::CNP.0;

    /// Position of a packet in its message.
    pub(crate) type Pos = MsgPosition;

    /// Position of an RC/UC opcode (from the table; unknown opcodes count as `Only`).
    pub(crate) fn position(o: u8) -> Pos {
        Opcode(o).info().map_or(MsgPosition::Only, |i| i.position)
    }
    /// SEND family (any transport).
    pub(crate) fn is_send(o: u8) -> bool {
        Opcode(o).info().is_some_and(|i| i.kind == OpKind::Send)
    }
    /// RDMA WRITE family.
    pub(crate) fn is_write(o: u8) -> bool {
        Opcode(o)
            .info()
            .is_some_and(|i| i.kind == OpKind::RdmaWrite)
    }
    /// Responder-to-requester opcodes (READ responses, ACKNOWLEDGE, ATOMIC ACKNOWLEDGE).
    pub(crate) fn is_response(o: u8) -> bool {
        Opcode(o)
            .info()
            .is_some_and(|i| i.direction == Direction::Response)
    }
    /// Known RC opcodes this engine implements (FLUSH is not).
    pub(crate) fn is_valid_rc(o: u8) -> bool {
        Opcode(o)
            .info()
            .is_some_and(|i| i.transport == Transport::Rc && !matches!(i.kind, OpKind::Flush))
    }
    /// Known UC opcodes (SEND and RDMA WRITE only).
    pub(crate) fn is_valid_uc(o: u8) -> bool {
        Opcode(o)
            .info()
            .is_some_and(|i| i.transport == Transport::Uc)
    }
}

/// RNR NAK timer code → wait (`ROCEV2.md §4.2` table via `roce_wire::rnr_timer_us`, S04).
pub(crate) fn rnr_timer(code: u8) -> Duration {
    Duration::from_micros(u64::from(roce_wire::rnr_timer_us(code & 0x1F)))
}

/// UDP source port from both QPNs (`ROCEV2.md §1.4`, `roce_wire::udp_sport`).
pub(crate) fn udp_sport(l: Qpn, r: Qpn, flow_label: u32) -> u16 {
    roce_wire::udp_sport(l, r, flow_label)
}

/// Where a CNP for a UD flow goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PeerAddr {
    pub(crate) qpn: Qpn,
    pub(crate) mac: [u8; 6],
    pub(crate) gid: Gid,
}

/// Extension headers of one packet in the compact form the engine matches on (converted to/from
/// `roce_wire::ExtRepr`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Ext {
    /// RETH: VA, R_Key, DMA length.
    pub(crate) reth: Option<(u64, u32, u32)>,
    /// AETH: syndrome byte, MSN.
    pub(crate) aeth: Option<(u8, u32)>,
    /// AtomicETH: VA, R_Key, swap/add, compare.
    pub(crate) atomic: Option<(u64, u32, u64, u64)>,
    /// AtomicAckETH: original value.
    pub(crate) atomic_ack: Option<u64>,
    /// ImmDt.
    pub(crate) imm: Option<u32>,
    /// IETH: R_Key to invalidate.
    pub(crate) ieth: Option<u32>,
    /// DETH: Q_Key, source QPN.
    pub(crate) deth: Option<(u32, Qpn)>,
    /// CNP body (16 zero bytes).
    pub(crate) cnp: bool,
}

impl Ext {
    fn to_repr(self) -> ExtRepr {
        ExtRepr {
            deth: self.deth.map(|(qkey, src_qp)| DethRepr { qkey, src_qp }),
            feth: None,
            reth: self
                .reth
                .map(|(va, rkey, dma_len)| RethRepr { va, rkey, dma_len }),
            atomic_eth: self
                .atomic
                .map(|(va, rkey, swap_add, compare)| AtomicEthRepr {
                    va,
                    rkey,
                    swap_add,
                    compare,
                }),
            aeth: self.aeth.map(|(s, m)| AethRepr {
                syndrome: AethSyndrome::from_byte(s),
                msn: Msn::new(m),
            }),
            atomic_ack_eth: self
                .atomic_ack
                .map(|orig_value| AtomicAckEthRepr { orig_value }),
            immdt: self.imm.map(|imm_data| ImmDtRepr { imm_data }),
            ieth: self.ieth.map(|rkey| IethRepr { rkey }),
            cnp: self.cnp.then_some(CnpRepr),
        }
    }

    fn from_repr(e: &ExtRepr) -> Ext {
        Ext {
            reth: e.reth.map(|r| (r.va, r.rkey, r.dma_len)),
            aeth: e.aeth.map(|a| (a.syndrome.to_byte(), a.msn.value())),
            atomic: e.atomic_eth.map(|a| (a.va, a.rkey, a.swap_add, a.compare)),
            atomic_ack: e.atomic_ack_eth.map(|a| a.orig_value),
            imm: e.immdt.map(|i| i.imm_data),
            ieth: e.ieth.map(|i| i.rkey),
            deth: e.deth.map(|d| (d.qkey, d.src_qp)),
            cnp: e.cnp.is_some(),
        }
    }
}

/// Which of a QP's header images a frame uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TxClass {
    /// Requests and READ responses: ECT(0) (if configured), DSCP from the traffic class.
    Data,
    /// ACK / NAK / ATOMIC ACK: Not-ECT.
    Ctrl,
    /// CNP: DSCP `cnp_dscp`, BECN = 1, M = 0, PSN 0 (`ROCEV2.md §6`).
    Cnp,
}

/// Per-packet BTH fields.
#[derive(Clone, Copy, Debug)]
pub(crate) struct TxHdr {
    pub(crate) class: TxClass,
    pub(crate) opcode: u8,
    pub(crate) se: bool,
    pub(crate) ack_req: bool,
    pub(crate) psn: Psn,
    /// UD: destination QP of this WR (the AH template has none).
    pub(crate) dest_qp: Option<Qpn>,
}

/// Per-QP (or per-AH) header images (`roce_wire::HeaderTemplate`, STYLE W8), built once at RTR/RTS or `create_ah`.
///
/// IPv4 identification of every frame the engine sends: 0, with DF set. This is what Linux writes for an
/// unconnected UDP socket with `IP_PMTUDISC_DO` (`docs/spec/INTEROP.md` §6), so a UDP-socket link
/// sends exactly the bytes the ICRC was computed over; with DF the value is free (RFC 6864).
pub(crate) const IPV4_IDENT: u16 = 0;

/// The IPv4 identification is fixed per image: DF is set, so the value is free (RFC 6864), and since the ID is
/// ICRC-covered a fixed value makes every retransmission byte-identical to the original (S05, go-back-N).
#[derive(Clone, Debug)]
pub(crate) struct TxTemplate {
    pub(crate) sport: u16,
    dscp: u8,
    ecn_data: Ecn,
    data: HeaderTemplate,
    ctrl: HeaderTemplate,
    cnp: HeaderTemplate,
}

fn ip_repr(
    sgid: Gid,
    dgid: Gid,
    dscp: u8,
    ecn: Ecn,
    hop_limit: u8,
    flow_label: u32,
    ident: u16,
) -> IpRepr {
    match (sgid.as_ipv4(), dgid.as_ipv4()) {
        (Some(s), Some(d)) => IpRepr::Ipv4(Ipv4Repr {
            src_addr: Ipv4Addr::from(s),
            dst_addr: Ipv4Addr::from(d),
            dscp,
            ecn,
            ident,
            dont_frag: true,
            ttl: hop_limit,
            protocol: 17,
        }),
        _ => IpRepr::Ipv6(Ipv6Repr {
            src_addr: Ipv6Addr::from(sgid.0),
            dst_addr: Ipv6Addr::from(dgid.0),
            dscp,
            ecn,
            flow_label: flow_label & 0xF_FFFF,
            next_header: 17,
            hop_limit,
        }),
    }
}

impl TxTemplate {
    /// Images for packets from `smac`/`sgid` to the path `av`, destination QP `dest_qp`, UDP source port `sport`.
    /// `mig_req` is BTH.M of data/ACK packets (1 on RC, S12). `ident` is the IPv4 identification of this QP.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        smac: [u8; 6],
        sgid: Gid,
        av: &AhAttr,
        sport: u16,
        dest_qp: Qpn,
        mig_req: bool,
        ecn_data: bool,
        cnp_dscp: u8,
        ident: u16,
    ) -> TxTemplate {
        let eth = EthernetRepr {
            src_addr: EthernetAddress(smac),
            dst_addr: EthernetAddress(av.dmac),
            vlan: None,
            ethertype: EtherType::IPV4,
        };
        let hop = if av.hop_limit == 0 { 64 } else { av.hop_limit };
        let dscp = av.traffic_class >> 2;
        let udp = UdpRepr {
            src_port: sport,
            dst_port: ROCE_V2_PORT,
        };
        let bth = BthRepr {
            opcode: Opcode(0),
            solicited: false,
            mig_req,
            pad_count: 0,
            pkey: 0xFFFF,
            fecn: false,
            becn: false,
            dest_qp,
            ack_req: false,
            psn: Psn::new(0),
        };
        let ecn_data = if ecn_data { Ecn::Ect0 } else { Ecn::NotEct };
        let ip = |dscp, ecn| ip_repr(sgid, av.dgid, dscp, ecn, hop, av.flow_label, ident);
        let data = HeaderTemplate::new(&eth, &ip(dscp, ecn_data), &udp, &bth);
        let ctrl = HeaderTemplate::new(&eth, &ip(dscp, Ecn::NotEct), &udp, &bth);
        let cnp_bth = BthRepr {
            mig_req: false,
            becn: true,
            ..bth
        };
        let cnp = HeaderTemplate::new(&eth, &ip(cnp_dscp & 0x3F, Ecn::NotEct), &udp, &cnp_bth);
        TxTemplate {
            sport,
            dscp,
            ecn_data,
            data,
            ctrl,
            cnp,
        }
    }

    /// DSCP and ECN code point of a frame of class `c` (for `TxMeta`).
    pub(crate) fn marks(&self, c: TxClass, cnp_dscp: u8) -> (u8, u8) {
        match c {
            TxClass::Data => (self.dscp, self.ecn_data as u8),
            TxClass::Ctrl => (self.dscp, Ecn::NotEct as u8),
            TxClass::Cnp => (cnp_dscp & 0x3F, Ecn::NotEct as u8),
        }
    }

    fn image(&self, c: TxClass) -> &HeaderTemplate {
        match c {
            TxClass::Data => &self.data,
            TxClass::Ctrl => &self.ctrl,
            TxClass::Cnp => &self.cnp,
        }
    }
}

/// Length of the frame [`emit`] would write.
pub(crate) fn frame_len(t: &TxTemplate, h: &TxHdr, ext: &Ext, plen: usize) -> usize {
    t.image(h.class).frame_len(ext.to_repr().byte_len(), plen)
}

/// Writes a whole frame into `buf` (at least [`frame_len`] bytes): template headers, extension headers, payload via
/// `fill`, pad, ICRC. `sport` overrides the image's UDP source port (UD: the QP's port on a shared AH image).
/// `None` only if `buf` is too short or the lengths do not fit (callers check `frame_len` first).
#[allow(clippy::too_many_arguments)]
pub(crate) fn emit(
    buf: &mut [u8],
    t: &TxTemplate,
    sport: u16,
    h: &TxHdr,
    ext: &Ext,
    plen: usize,
    fill: impl FnOnce(&mut [u8]),
) -> Option<usize> {
    let (img, head, total) = emit_head(buf, t, sport, h, ext, plen)?;
    fill(&mut buf[head..head + plen]);
    img.finish(buf, total).ok()?;
    Some(total)
}

/// Like [`emit`] for a payload the link gathers: writes the headers and extension headers (`buf[..head]`), then
/// pad + ICRC at `buf[head..head + tail]`, the ICRC covering the payload that `hash` feeds the hasher (from MR
/// memory, in place). Returns `(head, tail, frame length)`; `buf` must still be long enough for the whole frame.
#[allow(clippy::too_many_arguments)]
pub(crate) fn emit_gather(
    buf: &mut [u8],
    t: &TxTemplate,
    sport: u16,
    h: &TxHdr,
    ext: &Ext,
    plen: usize,
    hash: impl FnOnce(&mut crc32fast::Hasher),
) -> Option<(usize, usize, usize)> {
    let (img, head, total) = emit_head(buf, t, sport, h, ext, plen)?;
    let mut hasher = img
        .icrc_hasher(&buf[..head], head - img.header_len())
        .ok()?;
    hash(&mut hasher);
    let tail = img.write_trailer(&mut buf[head..], plen, hasher).ok()?;
    Some((head, tail, total))
}

/// Template headers (with per-packet fields) and extension headers into `buf`: `(image, head length, frame
/// length)`. Nothing is written if `buf` is shorter than the whole frame.
fn emit_head<'t>(
    buf: &mut [u8],
    t: &'t TxTemplate,
    sport: u16,
    h: &TxHdr,
    ext: &Ext,
    plen: usize,
) -> Option<(&'t HeaderTemplate, usize, usize)> {
    let img = t.image(h.class);
    // Most data packets (SEND/WRITE MIDDLE and LAST, SEND ONLY) carry no extension header: skip the conversion.
    let ext = if *ext == Ext::default() {
        ExtRepr::NONE
    } else {
        ext.to_repr()
    };
    let ext_len = ext.byte_len();
    let ph = PacketHeader {
        opcode: Opcode(h.opcode),
        solicited: h.se,
        ack_req: h.ack_req,
        psn: h.psn,
    };
    let total = img.write_headers(buf, &ph, ext_len, plen).ok()?;
    if let Some(q) = h.dest_qp {
        roce_wire::Bth::new_unchecked(&mut buf[img.bth_offset()..]).set_dest_qp(q);
    }
    if sport != t.sport {
        let udp_off = img.bth_offset() - roce_wire::udp::HEADER_LEN;
        UdpPacket::new_unchecked(&mut buf[udp_off..]).set_src_port(sport);
    }
    let hl = img.header_len();
    if ext_len > 0 {
        ext.emit(&mut buf[hl..hl + ext_len]).ok()?;
    }
    Some((img, hl + ext_len, total))
}

/// Why a frame was not accepted by the parser.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ParseError {
    /// Not RoCE v2, truncated or inconsistent (`roce_wire::Error`).
    Malformed,
    /// ICRC mismatch (S20).
    BadIcrc,
}

/// A parsed, ICRC-verified RoCE v2 packet.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RxPkt<'a> {
    pub(crate) src_mac: [u8; 6],
    pub(crate) src_gid: Gid,
    pub(crate) dst_gid: Gid,
    pub(crate) ecn: u8,
    pub(crate) opcode: u8,
    pub(crate) pkey: u16,
    pub(crate) dest_qp: Qpn,
    pub(crate) ack_req: bool,
    pub(crate) psn: Psn,
    pub(crate) ext: Ext,
    pub(crate) payload: &'a [u8],
    /// The IP header bytes (copied into the UD GRH area).
    pub(crate) ip_header: &'a [u8],
}

fn gid_of_v4(a: Ipv4Addr) -> Gid {
    Gid::from_ipv4(a.octets())
}

/// Parses and ICRC-checks an Ethernet frame (`roce_wire::RoceRepr::parse`, masked-field ICRC, `ROCEV2.md §3`).
pub(crate) fn parse(frame: &[u8]) -> Result<RxPkt<'_>, ParseError> {
    let p = RoceRepr::parse(frame).map_err(|_| ParseError::Malformed)?;
    if !p.icrc_ok {
        return Err(ParseError::BadIcrc);
    }
    let r = &p.repr;
    let (src_gid, dst_gid) = match &r.ip {
        IpRepr::Ipv4(i) => (gid_of_v4(i.src_addr), gid_of_v4(i.dst_addr)),
        IpRepr::Ipv6(i) => (Gid(i.src_addr.octets()), Gid(i.dst_addr.octets())),
    };
    let ip_off = r.eth.header_len();
    let ip_header = frame
        .get(ip_off..ip_off + r.ip.header_len())
        .ok_or(ParseError::Malformed)?;
    Ok(RxPkt {
        src_mac: r.eth.src_addr.0,
        src_gid,
        dst_gid,
        ecn: r.ip.ecn() as u8,
        opcode: r.bth.opcode.0,
        pkey: r.bth.pkey,
        dest_qp: r.bth.dest_qp,
        ack_req: r.bth.ack_req,
        psn: r.bth.psn,
        ext: Ext::from_repr(&r.ext),
        payload: p.payload,
        ip_header,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        let s: String = s.split_whitespace().collect();
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    /// `ROCEV2.md §3` worked example `rc_send_only_v4`: parse, and re-emit byte-identically through the template.
    #[test]
    fn golden_send_only_parses_and_reemits() {
        let f = hex(
            "020000000002 020000000001 0800 456a003c010040004011b543c0000201c0000202 c13212b700280000
             0400ffff0000001280000000 000102030405060708090a0b0c0d0e0f 966aa432",
        );
        let p = parse(&f).unwrap();
        assert_eq!(
            (p.opcode, p.dest_qp, p.psn, p.ack_req),
            (op::SEND_ONLY, Qpn::new(0x12), Psn::new(0), true)
        );
        assert_eq!(p.payload, &f[54..70]);
        let av = AhAttr {
            dgid: Gid::from_ipv4([192, 0, 2, 2]),
            dmac: [2, 0, 0, 0, 0, 2],
            traffic_class: 0x68,
            ..AhAttr::default()
        };
        let t = TxTemplate::new(
            [2, 0, 0, 0, 0, 1],
            Gid::from_ipv4([192, 0, 2, 1]),
            &av,
            0xc132,
            Qpn::new(0x12),
            false,
            true,
            48,
            0x0100,
        );
        let h = TxHdr {
            class: TxClass::Data,
            opcode: op::SEND_ONLY,
            se: false,
            ack_req: true,
            psn: Psn::new(0),
            dest_qp: None,
        };
        let mut buf = [0u8; 128];
        let n = emit(&mut buf, &t, 0xc132, &h, &Ext::default(), 16, |o| {
            o.copy_from_slice(&f[54..70])
        })
        .unwrap();
        assert_eq!(&buf[..n], &f[..]);
        // A flipped payload bit is a bad ICRC; a changed TTL/TOS is not (S20).
        let mut bad = f.clone();
        bad[60] ^= 1;
        assert_eq!(parse(&bad).unwrap_err(), ParseError::BadIcrc);
        let mut hop = f.clone();
        hop[14 + 8] = 3;
        hop[15] = 0x6b;
        assert!(parse(&hop).is_ok());
    }
}
