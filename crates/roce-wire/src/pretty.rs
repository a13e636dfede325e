//! One-line, tcpdump-like rendering of RoCE v2 frames (STYLE W7), e.g.
//!
//! ```text
//! RC SEND_FIRST qp=0x000012 psn=0x000064 A=0 pad=0 len=256 icrc=ok
//! RC RDMA_WRITE_FIRST qp=0x000012 psn=0x0000c8 A=0 pad=0 len=256 reth(va=0x7f0000001000 rkey=0x1234abcd len=600) icrc=ok
//! RC ACKNOWLEDGE qp=0x000011 psn=0x000067 A=0 pad=0 len=0 aeth(nak seq msn=5) icrc=ok
//! malformed: IPv4 total length exceeds frame (truncated, len=40)
//! not RoCE v2: UDP destination port is not 4791 (len=74)
//! ```
//!
//! [`PrettyFrame`] never panics on arbitrary bytes (it only calls
//! [`RoceRepr::parse`]).

use core::fmt;

use crate::frame::{ParsedFrame, RoceRepr};
use crate::ipv4::Ecn;
use crate::{Error, ExtRepr};

impl fmt::Display for ExtRepr {
    /// Space-separated extension header summaries (empty if none).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut sep = "";
        let mut next = |f: &mut fmt::Formatter<'_>| -> fmt::Result {
            f.write_str(sep)?;
            sep = " ";
            Ok(())
        };
        if let Some(d) = &self.deth {
            next(f)?;
            write!(f, "deth(qkey=0x{:08x} src_qp={})", d.qkey, d.src_qp)?;
        }
        if let Some(x) = &self.feth {
            next(f)?;
            write!(f, "feth(0x{:08x})", x.word)?;
        }
        if let Some(r) = &self.reth {
            next(f)?;
            write!(
                f,
                "reth(va=0x{:x} rkey=0x{:08x} len={})",
                r.va, r.rkey, r.dma_len
            )?;
        }
        if let Some(a) = &self.atomic_eth {
            next(f)?;
            write!(
                f,
                "atomic(va=0x{:x} rkey=0x{:08x} swap_add=0x{:x} cmp=0x{:x})",
                a.va, a.rkey, a.swap_add, a.compare
            )?;
        }
        if let Some(a) = &self.aeth {
            next(f)?;
            write!(f, "aeth({a})")?;
        }
        if let Some(a) = &self.atomic_ack_eth {
            next(f)?;
            write!(f, "atomic_ack(orig=0x{:x})", a.orig_value)?;
        }
        if let Some(i) = &self.immdt {
            next(f)?;
            write!(f, "immdt=0x{:08x}", i.imm_data)?;
        }
        if let Some(i) = &self.ieth {
            next(f)?;
            write!(f, "ieth(rkey=0x{:08x})", i.rkey)?;
        }
        Ok(())
    }
}

impl fmt::Display for RoceRepr {
    /// The transport part of the line (no ICRC status).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = &self.bth;
        match b.opcode.info() {
            Some(i) if i.op_name() == i.transport.name() => f.write_str(i.name)?,
            Some(i) => write!(f, "{} {}", i.transport.name(), i.op_name())?,
            None => write!(f, "{}", b.opcode)?,
        }
        write!(
            f,
            " qp={} psn=0x{:06x} A={} pad={} len={}",
            b.dest_qp,
            b.psn.value(),
            u8::from(b.ack_req),
            b.pad_count,
            self.payload_len
        )?;
        if !self.ext.headers().is_empty()
            && self.ext.headers() != crate::ExtHeaders::NONE.with(crate::ExtHeader::CnpBody)
        {
            write!(f, " {}", self.ext)?;
        }
        if b.solicited {
            f.write_str(" SE")?;
        }
        if b.mig_req {
            f.write_str(" MigReq")?;
        }
        if b.fecn {
            f.write_str(" FECN")?;
        }
        if b.becn {
            f.write_str(" BECN")?;
        }
        if b.pkey != crate::bth::DEFAULT_PKEY {
            write!(f, " pkey=0x{:04x}", b.pkey)?;
        }
        if self.ip.ecn() == Ecn::Ce {
            f.write_str(" ecn=ce")?;
        }
        Ok(())
    }
}

impl fmt::Display for ParsedFrame<'_> {
    /// `RC SEND_FIRST qp=0x000012 psn=0x000064 A=0 pad=0 len=256 icrc=ok`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} icrc={}",
            self.repr,
            if self.icrc_ok { "ok" } else { "bad" }
        )?;
        if !self.ip_checksum_ok {
            f.write_str(" ipcsum=bad")?;
        }
        if !self.udp_checksum_ok {
            f.write_str(" udpcsum=bad")?;
        }
        Ok(())
    }
}

/// Displays arbitrary bytes as one line: the parsed frame, or the reason it
/// could not be parsed, with the reason from [`RoceRepr::parse_explained`]
/// (`malformed: pad count larger than payload (malformed, len=62)`,
/// `not RoCE v2: UDP destination port is not 4791 (len=74)`).
#[derive(Debug, Clone, Copy)]
pub struct PrettyFrame<'a>(pub &'a [u8]);

impl fmt::Display for PrettyFrame<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match RoceRepr::parse_explained(self.0) {
            Ok(p) => write!(f, "{p}"),
            Err(r) if r.error == Error::NotRoce => {
                write!(f, "not RoCE v2: {} (len={})", r.reason, self.0.len())
            }
            Err(r) => write!(
                f,
                "malformed: {} ({}, len={})",
                r.reason,
                r.error,
                self.0.len()
            ),
        }
    }
}
