//! The engine's narrow seam to the wire layer: what the requester/responder need from a frame (parse into an
//! `RxPkt`, emit from a per-QP template). INTERIM: implemented locally until `roce-wire` publishes its frame API;
//! every function here is to be replaced by the `roce-wire` equivalent (one concept, one place).

use core::time::Duration;

use crate::verbs::{AhAttr, Gid};
use crate::{Psn, Qpn};

/// ECN code points (IP TOS low two bits, `ROCEV2.md §1.4`).
pub(crate) const ECN_ECT0: u8 = 0b10;
pub(crate) const ECN_CE: u8 = 0b11;

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
    /// Known RC opcodes this engine implements (FLUSH and ATOMIC WRITE are not).
    pub(crate) fn is_valid_rc(o: u8) -> bool {
        Opcode(o).info().is_some_and(|i| {
            i.transport == Transport::Rc && !matches!(i.kind, OpKind::Flush | OpKind::AtomicWrite)
        })
    }
    /// Known UC opcodes (SEND and RDMA WRITE only).
    pub(crate) fn is_valid_uc(o: u8) -> bool {
        Opcode(o)
            .info()
            .is_some_and(|i| i.transport == Transport::Uc)
    }
}

/// RNR NAK timer code → wait (`ROCEV2.md §4.2` table, S04).
pub(crate) fn rnr_timer(code: u8) -> Duration {
    const US: [u64; 32] = [
        655_360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1280, 1920, 2560, 3840,
        5120, 7680, 10240, 15360, 20480, 30720, 40960, 61440, 81920, 122_880, 163_840, 245_760,
        327_680, 491_520,
    ];
    Duration::from_micros(US[(code & 0x1F) as usize])
}

/// UDP source port from both QPNs (`ROCEV2.md §1.4`, `rdma_get_udp_sport`).
pub(crate) fn udp_sport(l: Qpn, r: Qpn, flow_label: u32) -> u16 {
    let mut fl = flow_label & 0xF_FFFF;
    if fl == 0 {
        let mut v = u64::from(l.value()) * u64::from(r.value());
        v ^= v >> 20;
        v ^= v >> 40;
        fl = (v & 0xF_FFFF) as u32;
    }
    (0xC000 | ((fl & 0x3FFF) ^ (fl >> 14))) as u16
}

/// Where a CNP for a UD flow goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PeerAddr {
    pub(crate) qpn: Qpn,
    pub(crate) mac: [u8; 6],
    pub(crate) gid: Gid,
}

/// Extension headers of one packet (received or to send).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Ext {
    /// RETH: VA, R_Key, DMA length.
    pub(crate) reth: Option<(u64, u32, u32)>,
    /// AETH: syndrome, MSN.
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
    fn len(&self) -> usize {
        self.deth.map_or(0, |_| 8)
            + self.reth.map_or(0, |_| 16)
            + self.atomic.map_or(0, |_| 28)
            + self.aeth.map_or(0, |_| 4)
            + self.atomic_ack.map_or(0, |_| 8)
            + self.imm.map_or(0, |_| 4)
            + self.ieth.map_or(0, |_| 4)
            + if self.cnp { 16 } else { 0 }
    }
}

/// Per-packet BTH fields and IP marks.
#[derive(Clone, Copy, Debug)]
pub(crate) struct TxHdr {
    pub(crate) opcode: u8,
    pub(crate) se: bool,
    pub(crate) mig_req: bool,
    pub(crate) ack_req: bool,
    pub(crate) becn: bool,
    pub(crate) dest_qp: Qpn,
    pub(crate) psn: Psn,
    pub(crate) ecn: u8,
    /// DSCP override (CNPs); `None` = the template's.
    pub(crate) dscp: Option<u8>,
}

/// Per-QP (or per-AH) header image: Ethernet + IP + UDP, built once.
#[derive(Clone, Debug)]
pub(crate) struct TxTemplate {
    pub(crate) sport: u16,
    ipv4: bool,
    hdr: [u8; 62],
    hlen: usize,
    tclass: u8,
}

impl TxTemplate {
    pub(crate) fn new(smac: [u8; 6], sgid: Gid, av: &AhAttr, sport: u16) -> TxTemplate {
        let mut hdr = [0u8; 62];
        hdr[0..6].copy_from_slice(&av.dmac);
        hdr[6..12].copy_from_slice(&smac);
        let ttl = if av.hop_limit == 0 { 64 } else { av.hop_limit };
        let (ipv4, hlen) = match (sgid.as_ipv4(), av.dgid.as_ipv4()) {
            (Some(s), Some(d)) => {
                hdr[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
                let ip = &mut hdr[14..34];
                ip[0] = 0x45;
                ip[6] = 0x40; // DF
                ip[8] = ttl;
                ip[9] = 17;
                ip[12..16].copy_from_slice(&s);
                ip[16..20].copy_from_slice(&d);
                (true, 42)
            }
            _ => {
                hdr[12..14].copy_from_slice(&0x86DDu16.to_be_bytes());
                let ip = &mut hdr[14..54];
                ip[0] = 0x60;
                ip[6] = 17;
                ip[7] = ttl;
                ip[8..24].copy_from_slice(&sgid.0);
                ip[24..40].copy_from_slice(&av.dgid.0);
                (false, 62)
            }
        };
        let udp = &mut hdr[hlen - 8..hlen];
        udp[0..2].copy_from_slice(&sport.to_be_bytes());
        udp[2..4].copy_from_slice(&4791u16.to_be_bytes());
        TxTemplate {
            sport,
            ipv4,
            hdr,
            hlen,
            tclass: av.traffic_class,
        }
    }

    /// DSCP of data packets from this template.
    pub(crate) fn dscp(&self) -> u8 {
        self.tclass >> 2
    }
}

/// Length of the frame `emit` would write.
pub(crate) fn frame_len(t: &TxTemplate, _h: &TxHdr, ext: &Ext, plen: usize) -> usize {
    let pad = (4 - plen % 4) % 4;
    t.hlen + 12 + ext.len() + plen + pad + 4
}

/// Writes a whole frame into `buf` (which must be at least `frame_len` long); `fill` writes the payload.
#[allow(clippy::too_many_arguments)]
pub(crate) fn emit(
    buf: &mut [u8],
    t: &TxTemplate,
    sport: u16,
    ip_id: u16,
    h: &TxHdr,
    ext: &Ext,
    plen: usize,
    fill: impl FnOnce(&mut [u8]),
) -> usize {
    let pad = (4 - plen % 4) % 4;
    let total = frame_len(t, h, ext, plen);
    let hl = t.hlen;
    buf[..hl].copy_from_slice(&t.hdr[..hl]);
    let udp_len = (total - hl + 8) as u16;
    let tos = (h.dscp.unwrap_or(t.tclass >> 2) << 2) | (h.ecn & 3);
    if t.ipv4 {
        let ip = &mut buf[14..34];
        ip[1] = tos;
        ip[2..4].copy_from_slice(&(udp_len + 20).to_be_bytes());
        ip[4..6].copy_from_slice(&ip_id.to_be_bytes());
        let mut sum = 0u32;
        for c in ip.chunks(2) {
            sum += u32::from(u16::from_be_bytes([c[0], c[1]]));
        }
        while sum > 0xFFFF {
            sum = (sum & 0xFFFF) + (sum >> 16);
        }
        ip[10..12].copy_from_slice(&(!(sum as u16)).to_be_bytes());
    } else {
        let ip = &mut buf[14..54];
        ip[0] = 0x60 | (tos >> 4);
        ip[1] = (tos << 4) & 0xF0;
        ip[4..6].copy_from_slice(&udp_len.to_be_bytes());
    }
    let udp = &mut buf[hl - 8..hl];
    udp[0..2].copy_from_slice(&sport.to_be_bytes());
    udp[4..6].copy_from_slice(&udp_len.to_be_bytes());
    let b = &mut buf[hl..hl + 12];
    b[0] = h.opcode;
    b[1] = (u8::from(h.se) << 7) | (u8::from(h.mig_req) << 6) | ((pad as u8) << 4);
    b[2] = 0xFF;
    b[3] = 0xFF;
    b[4] = u8::from(h.becn) << 6;
    b[5..8].copy_from_slice(&h.dest_qp.value().to_be_bytes()[1..]);
    b[8] = u8::from(h.ack_req) << 7;
    b[9..12].copy_from_slice(&h.psn.value().to_be_bytes()[1..]);
    let mut o = hl + 12;
    if let Some((q, s)) = ext.deth {
        buf[o..o + 4].copy_from_slice(&q.to_be_bytes());
        buf[o + 4..o + 8].copy_from_slice(&s.value().to_be_bytes());
        o += 8;
    }
    if let Some((va, rk, len)) = ext.reth {
        buf[o..o + 8].copy_from_slice(&va.to_be_bytes());
        buf[o + 8..o + 12].copy_from_slice(&rk.to_be_bytes());
        buf[o + 12..o + 16].copy_from_slice(&len.to_be_bytes());
        o += 16;
    }
    if let Some((va, rk, sa, cmp)) = ext.atomic {
        buf[o..o + 8].copy_from_slice(&va.to_be_bytes());
        buf[o + 8..o + 12].copy_from_slice(&rk.to_be_bytes());
        buf[o + 12..o + 20].copy_from_slice(&sa.to_be_bytes());
        buf[o + 20..o + 28].copy_from_slice(&cmp.to_be_bytes());
        o += 28;
    }
    if let Some((syn, msn)) = ext.aeth {
        buf[o] = syn;
        buf[o + 1..o + 4].copy_from_slice(&msn.to_be_bytes()[1..]);
        o += 4;
    }
    if let Some(v) = ext.atomic_ack {
        buf[o..o + 8].copy_from_slice(&v.to_be_bytes());
        o += 8;
    }
    if let Some(v) = ext.imm.or(ext.ieth) {
        buf[o..o + 4].copy_from_slice(&v.to_be_bytes());
        o += 4;
    }
    if ext.cnp {
        buf[o..o + 16].fill(0);
        o += 16;
    }
    fill(&mut buf[o..o + plen]);
    o += plen;
    buf[o..o + pad].fill(0);
    o += pad;
    let crc = icrc(&buf[14..o], t.ipv4);
    buf[o..o + 4].copy_from_slice(&crc.to_le_bytes());
    o + 4
}

fn icrc(l3: &[u8], ipv4: bool) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&[0xFF; 8]);
    let ihl = if ipv4 { 20 } else { 40 };
    let mut hdr = [0u8; 60];
    let n = ihl + 8 + 12;
    hdr[..n].copy_from_slice(&l3[..n]);
    if ipv4 {
        hdr[1] = 0xFF;
        hdr[8] = 0xFF;
        hdr[10] = 0xFF;
        hdr[11] = 0xFF;
    } else {
        hdr[0] |= 0x0F;
        hdr[1] = 0xFF;
        hdr[2] = 0xFF;
        hdr[3] = 0xFF;
        hdr[7] = 0xFF;
    }
    hdr[ihl + 6] = 0xFF;
    hdr[ihl + 7] = 0xFF;
    hdr[ihl + 8 + 4] = 0xFF;
    h.update(&hdr[..n]);
    h.update(&l3[n..]);
    h.finalize()
}

/// Why a frame was not accepted by the parser.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ParseError {
    Malformed,
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
    pub(crate) tver: u8,
    pub(crate) pkey: u16,
    pub(crate) dest_qp: Qpn,
    pub(crate) ack_req: bool,
    pub(crate) psn: Psn,
    pub(crate) ext: Ext,
    pub(crate) payload: &'a [u8],
    pub(crate) ip_header: &'a [u8],
}

fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}
fn be64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_be_bytes(a)
}

pub(crate) fn parse(frame: &[u8]) -> Result<RxPkt<'_>, ParseError> {
    use ParseError::Malformed as M;
    if frame.len() < 14 {
        return Err(M);
    }
    let mut src_mac = [0u8; 6];
    src_mac.copy_from_slice(&frame[6..12]);
    let et = u16::from_be_bytes([frame[12], frame[13]]);
    let l3 = &frame[14..];
    let (ipv4, ihl, ecn, src_gid, dst_gid, l3_len) = match et {
        0x0800 => {
            if l3.len() < 20 || l3[0] != 0x45 || l3[9] != 17 {
                return Err(M);
            }
            let tl = u16::from_be_bytes([l3[2], l3[3]]) as usize;
            let s = Gid::from_ipv4([l3[12], l3[13], l3[14], l3[15]]);
            let d = Gid::from_ipv4([l3[16], l3[17], l3[18], l3[19]]);
            (true, 20, l3[1] & 3, s, d, tl)
        }
        0x86DD => {
            if l3.len() < 40 || l3[0] >> 4 != 6 || l3[6] != 17 {
                return Err(M);
            }
            let pl = u16::from_be_bytes([l3[4], l3[5]]) as usize;
            let mut s = [0u8; 16];
            let mut d = [0u8; 16];
            s.copy_from_slice(&l3[8..24]);
            d.copy_from_slice(&l3[24..40]);
            (false, 40, (l3[1] >> 4) & 3, Gid(s), Gid(d), pl + 40)
        }
        _ => return Err(M),
    };
    if l3_len > l3.len() || l3_len < ihl + 8 + 12 + 4 {
        return Err(M);
    }
    let l3 = &l3[..l3_len];
    let udp = &l3[ihl..ihl + 8];
    if u16::from_be_bytes([udp[2], udp[3]]) != 4791
        || u16::from_be_bytes([udp[4], udp[5]]) as usize != l3_len - ihl
    {
        return Err(M);
    }
    let body_end = l3_len - 4;
    let want = u32::from_le_bytes([
        l3[body_end],
        l3[body_end + 1],
        l3[body_end + 2],
        l3[body_end + 3],
    ]);
    if cfg!(not(fuzzing)) && icrc(&l3[..body_end], ipv4) != want {
        return Err(ParseError::BadIcrc);
    }
    let bth = &l3[ihl + 8..ihl + 20];
    let opcode = bth[0];
    let pad = ((bth[1] >> 4) & 3) as usize;
    let tver = bth[1] & 0xF;
    let pkey = u16::from_be_bytes([bth[2], bth[3]]);
    let dest_qp = Qpn::new(be32(&[0, bth[5], bth[6], bth[7]]));
    let ack_req = bth[8] & 0x80 != 0;
    let psn = Psn::new(be32(&[0, bth[9], bth[10], bth[11]]));
    let mut rest = &l3[ihl + 20..body_end];
    let mut ext = Ext::default();
    let take = |rest: &mut &'_ [u8], n: usize| -> Result<(), ParseError> {
        if rest.len() < n { Err(M) } else { Ok(()) }
    };
    let low = opcode & 0x1F;
    let class = opcode >> 5;
    if opcode == op::CNP {
        take(&mut rest, 16)?;
        ext.cnp = true;
        rest = &rest[16..];
    } else if class == 3 {
        if !(opcode == op::UD_SEND_ONLY || opcode == op::UD_SEND_ONLY_IMM) {
            return Err(M);
        }
        take(&mut rest, 8)?;
        ext.deth = Some((be32(rest), Qpn::new(be32(&rest[4..]))));
        rest = &rest[8..];
        if opcode == op::UD_SEND_ONLY_IMM {
            take(&mut rest, 4)?;
            ext.imm = Some(be32(rest));
            rest = &rest[4..];
        }
    } else if class <= 1 {
        if matches!(
            low,
            op::WRITE_FIRST | op::WRITE_ONLY | op::WRITE_ONLY_IMM | op::RDMA_READ_REQUEST
        ) {
            take(&mut rest, 16)?;
            ext.reth = Some((be64(rest), be32(&rest[8..]), be32(&rest[12..])));
            rest = &rest[16..];
        }
        if matches!(low, op::COMPARE_SWAP | op::FETCH_ADD) {
            take(&mut rest, 28)?;
            ext.atomic = Some((
                be64(rest),
                be32(&rest[8..]),
                be64(&rest[12..]),
                be64(&rest[20..]),
            ));
            rest = &rest[28..];
        }
        if matches!(
            low,
            op::READ_RESPONSE_FIRST
                | op::READ_RESPONSE_LAST
                | op::READ_RESPONSE_ONLY
                | op::ACKNOWLEDGE
                | op::ATOMIC_ACKNOWLEDGE
        ) {
            take(&mut rest, 4)?;
            ext.aeth = Some((rest[0], be32(&[0, rest[1], rest[2], rest[3]])));
            rest = &rest[4..];
        }
        if low == op::ATOMIC_ACKNOWLEDGE {
            take(&mut rest, 8)?;
            ext.atomic_ack = Some(be64(rest));
            rest = &rest[8..];
        }
        if matches!(
            low,
            op::SEND_LAST_IMM | op::SEND_ONLY_IMM | op::WRITE_LAST_IMM | op::WRITE_ONLY_IMM
        ) {
            take(&mut rest, 4)?;
            ext.imm = Some(be32(rest));
            rest = &rest[4..];
        }
        if matches!(low, op::SEND_LAST_INV | op::SEND_ONLY_INV) {
            take(&mut rest, 4)?;
            ext.ieth = Some(be32(rest));
            rest = &rest[4..];
        }
    }
    if pad > rest.len() {
        return Err(M);
    }
    let payload = &rest[..rest.len() - pad];
    Ok(RxPkt {
        src_mac,
        src_gid,
        dst_gid,
        ecn,
        opcode,
        tver,
        pkey,
        dest_qp,
        ack_req,
        psn,
        ext,
        payload,
        ip_header: &frame[14..14 + ihl],
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

    /// `ROCEV2.md §3` worked example `rc_send_only_v4`.
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
        );
        let h = TxHdr {
            opcode: op::SEND_ONLY,
            se: false,
            mig_req: false,
            ack_req: true,
            becn: false,
            dest_qp: Qpn::new(0x12),
            psn: Psn::new(0),
            ecn: ECN_ECT0,
            dscp: None,
        };
        let mut buf = [0u8; 128];
        let n = emit(&mut buf, &t, 0xc132, 0x0100, &h, &Ext::default(), 16, |o| {
            o.copy_from_slice(&f[54..70])
        });
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
