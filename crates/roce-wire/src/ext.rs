//! All extension headers of one packet as a value ([`ExtRepr`]), parsed and
//! emitted in the order the opcode table prescribes (`ROCEV2.md §1.6`, §2.1).

use crate::aeth::{Aeth, AethRepr};
use crate::atomic::{AtomicAckEth, AtomicAckEthRepr, AtomicEth, AtomicEthRepr};
use crate::cnp::{CnpBody, CnpRepr};
use crate::deth::{Deth, DethRepr};
use crate::feth::{Feth, FethRepr};
use crate::ieth::{Ieth, IethRepr};
use crate::immdt::{ImmDt, ImmDtRepr};
use crate::opcode::{ExtHeader, ExtHeaders, Opcode};
use crate::reth::{Reth, RethRepr};
use crate::{Error, Result};

/// The extension headers of a packet. Each field is `Some` exactly when the
/// opcode's table entry lists that header ([`ExtRepr::parse`] guarantees it;
/// emitters check it with [`ExtRepr::matches`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ExtRepr {
    /// DETH (UD).
    pub deth: Option<DethRepr>,
    /// FETH (FLUSH).
    pub feth: Option<FethRepr>,
    /// RETH (RDMA WRITE FIRST/ONLY, READ request, FLUSH, ATOMIC WRITE).
    pub reth: Option<RethRepr>,
    /// AtomicETH (COMPARE & SWAP, FETCH & ADD).
    pub atomic_eth: Option<AtomicEthRepr>,
    /// AETH (ACKNOWLEDGE, READ responses FIRST/LAST/ONLY, ATOMIC ACKNOWLEDGE).
    pub aeth: Option<AethRepr>,
    /// AtomicAckETH (ATOMIC ACKNOWLEDGE).
    pub atomic_ack_eth: Option<AtomicAckEthRepr>,
    /// ImmDt (… WITH_IMMEDIATE).
    pub immdt: Option<ImmDtRepr>,
    /// IETH (SEND … WITH_INVALIDATE).
    pub ieth: Option<IethRepr>,
    /// CNP body.
    pub cnp: Option<CnpRepr>,
}

impl ExtRepr {
    /// No extension headers.
    pub const NONE: ExtRepr = ExtRepr {
        deth: None,
        feth: None,
        reth: None,
        atomic_eth: None,
        aeth: None,
        atomic_ack_eth: None,
        immdt: None,
        ieth: None,
        cnp: None,
    };

    /// The set of headers present.
    pub fn headers(&self) -> ExtHeaders {
        let mut s = ExtHeaders::NONE;
        let mut add = |present: bool, h: ExtHeader| {
            if present {
                s = s.with(h);
            }
        };
        add(self.deth.is_some(), ExtHeader::Deth);
        add(self.feth.is_some(), ExtHeader::Feth);
        add(self.reth.is_some(), ExtHeader::Reth);
        add(self.atomic_eth.is_some(), ExtHeader::AtomicEth);
        add(self.aeth.is_some(), ExtHeader::Aeth);
        add(self.atomic_ack_eth.is_some(), ExtHeader::AtomicAckEth);
        add(self.immdt.is_some(), ExtHeader::ImmDt);
        add(self.ieth.is_some(), ExtHeader::Ieth);
        add(self.cnp.is_some(), ExtHeader::CnpBody);
        s
    }

    /// Total emitted length in bytes.
    pub fn byte_len(&self) -> usize {
        let n = |present: bool, h: ExtHeader| if present { h.byte_len() } else { 0 };
        n(self.deth.is_some(), ExtHeader::Deth)
            + n(self.feth.is_some(), ExtHeader::Feth)
            + n(self.reth.is_some(), ExtHeader::Reth)
            + n(self.atomic_eth.is_some(), ExtHeader::AtomicEth)
            + n(self.aeth.is_some(), ExtHeader::Aeth)
            + n(self.atomic_ack_eth.is_some(), ExtHeader::AtomicAckEth)
            + n(self.immdt.is_some(), ExtHeader::ImmDt)
            + n(self.ieth.is_some(), ExtHeader::Ieth)
            + n(self.cnp.is_some(), ExtHeader::CnpBody)
    }

    /// Whether the headers present are exactly those `opcode` requires
    /// (unknown opcodes require none).
    pub fn matches(&self, opcode: Opcode) -> bool {
        self.headers() == opcode.ext_headers()
    }

    /// Parses the extension headers `opcode` requires from `buf`, the bytes
    /// right after the BTH. Unknown opcodes yield [`ExtRepr::NONE`].
    ///
    /// # Errors
    /// [`Error::Truncated`] if `buf` is shorter than the headers.
    pub fn parse(opcode: Opcode, buf: &[u8]) -> Result<Self> {
        let set = opcode.ext_headers();
        let mut r = ExtRepr::NONE;
        if set.is_empty() {
            return Ok(r);
        }
        if buf.len() < set.byte_len() {
            return Err(Error::Truncated);
        }
        // Straight-line, in wire order (ExtHeader declaration order).
        let mut off = 0;
        let mut take = |h: ExtHeader| -> Option<&[u8]> {
            if set.contains(h) {
                let b = &buf[off..off + h.byte_len()];
                off += h.byte_len();
                Some(b)
            } else {
                None
            }
        };
        if let Some(b) = take(ExtHeader::Deth) {
            r.deth = Some(DethRepr::parse(&Deth::new_unchecked(b))?);
        }
        if let Some(b) = take(ExtHeader::Feth) {
            r.feth = Some(FethRepr::parse(&Feth::new_unchecked(b))?);
        }
        if let Some(b) = take(ExtHeader::Reth) {
            r.reth = Some(RethRepr::parse(&Reth::new_unchecked(b))?);
        }
        if let Some(b) = take(ExtHeader::AtomicEth) {
            r.atomic_eth = Some(AtomicEthRepr::parse(&AtomicEth::new_unchecked(b))?);
        }
        if let Some(b) = take(ExtHeader::Aeth) {
            r.aeth = Some(AethRepr::parse(&Aeth::new_unchecked(b))?);
        }
        if let Some(b) = take(ExtHeader::AtomicAckEth) {
            r.atomic_ack_eth = Some(AtomicAckEthRepr::parse(&AtomicAckEth::new_unchecked(b))?);
        }
        if let Some(b) = take(ExtHeader::ImmDt) {
            r.immdt = Some(ImmDtRepr::parse(&ImmDt::new_unchecked(b))?);
        }
        if let Some(b) = take(ExtHeader::Ieth) {
            r.ieth = Some(IethRepr::parse(&Ieth::new_unchecked(b))?);
        }
        if let Some(b) = take(ExtHeader::CnpBody) {
            r.cnp = Some(CnpRepr::parse(&CnpBody::new_unchecked(b))?);
        }
        Ok(r)
    }

    /// Writes the present headers in wire order into `buf` and returns the
    /// number of bytes written ([`byte_len`](Self::byte_len)).
    ///
    /// # Errors
    /// [`Error::Truncated`] if `buf` is shorter than `byte_len()`.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        let total = self.byte_len();
        if total == 0 {
            return Ok(0);
        }
        if buf.len() < total {
            return Err(Error::Truncated);
        }
        // Straight-line, in wire order (ExtHeader declaration order).
        let mut off = 0;
        let mut next = |h: ExtHeader| {
            let r = off..off + h.byte_len();
            off += h.byte_len();
            r
        };
        if let Some(x) = &self.deth {
            x.emit(&mut Deth::new_unchecked(&mut buf[next(ExtHeader::Deth)]));
        }
        if let Some(x) = &self.feth {
            x.emit(&mut Feth::new_unchecked(&mut buf[next(ExtHeader::Feth)]));
        }
        if let Some(x) = &self.reth {
            x.emit(&mut Reth::new_unchecked(&mut buf[next(ExtHeader::Reth)]));
        }
        if let Some(x) = &self.atomic_eth {
            x.emit(&mut AtomicEth::new_unchecked(
                &mut buf[next(ExtHeader::AtomicEth)],
            ));
        }
        if let Some(x) = &self.aeth {
            x.emit(&mut Aeth::new_unchecked(&mut buf[next(ExtHeader::Aeth)]));
        }
        if let Some(x) = &self.atomic_ack_eth {
            x.emit(&mut AtomicAckEth::new_unchecked(
                &mut buf[next(ExtHeader::AtomicAckEth)],
            ));
        }
        if let Some(x) = &self.immdt {
            x.emit(&mut ImmDt::new_unchecked(&mut buf[next(ExtHeader::ImmDt)]));
        }
        if let Some(x) = &self.ieth {
            x.emit(&mut Ieth::new_unchecked(&mut buf[next(ExtHeader::Ieth)]));
        }
        if let Some(x) = &self.cnp {
            x.emit(&mut CnpBody::new_unchecked(
                &mut buf[next(ExtHeader::CnpBody)],
            ));
        }
        Ok(total)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{AethSyndrome, Msn};

    #[test]
    fn roundtrip_atomic_ack() {
        let r = ExtRepr {
            aeth: Some(AethRepr {
                syndrome: AethSyndrome::ACK,
                msn: Msn::new(3),
            }),
            atomic_ack_eth: Some(AtomicAckEthRepr { orig_value: 0x55 }),
            ..ExtRepr::NONE
        };
        assert!(r.matches(Opcode::RC_ATOMIC_ACKNOWLEDGE));
        assert!(!r.matches(Opcode::RC_ACKNOWLEDGE));
        let mut buf = [0u8; 12];
        assert_eq!(r.emit(&mut buf).unwrap(), 12);
        assert_eq!(buf, [0x1f, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0, 0x55]);
        assert_eq!(
            ExtRepr::parse(Opcode::RC_ATOMIC_ACKNOWLEDGE, &buf).unwrap(),
            r
        );
        assert_eq!(
            ExtRepr::parse(Opcode::RC_ATOMIC_ACKNOWLEDGE, &buf[..11]),
            Err(Error::Truncated)
        );
        assert_eq!(r.emit(&mut [0u8; 11]), Err(Error::Truncated));
        assert_eq!(ExtRepr::parse(Opcode(0x15), &buf).unwrap(), ExtRepr::NONE);
    }
}
