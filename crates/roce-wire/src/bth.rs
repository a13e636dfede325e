//! Base Transport Header, 12 bytes (`ROCEV2.md §1.5`, IBTA Vol 1 §9.2).
//!
//! ```text
//! byte 0      OpCode
//! byte 1      SE(7) M(6) PadCnt(5..4) TVer(3..0)
//! bytes 2..4  P_Key
//! byte 4      FECN(7) BECN(6) reserved(5..0)   -- masked (0xFF) in the ICRC
//! bytes 5..8  DestQP (24)
//! byte 8      AckReq(7) reserved(6..0)
//! bytes 9..12 PSN (24)
//! ```

use core::fmt;

use crate::field::{self, Field};
use crate::{Error, Opcode, Psn, Qpn, Result};

mod fld {
    use super::Field;
    pub(crate) const OPCODE: usize = 0;
    pub(crate) const FLAGS: usize = 1;
    pub(crate) const PKEY: Field = 2..4;
    pub(crate) const RESV8A: usize = 4;
    pub(crate) const DEST_QP: Field = 5..8;
    pub(crate) const ACK: usize = 8;
    pub(crate) const PSN: Field = 9..12;
}

/// Length of the BTH in bytes.
pub const HEADER_LEN: usize = fld::PSN.end;
/// Offset of the FECN/BECN/reserved byte that the ICRC masks (`ROCEV2.md §3`).
pub const RESV8A_OFFSET: usize = fld::RESV8A;
/// The default P_Key (full member of the default partition, `ROCEV2.md §1.5`).
pub const DEFAULT_PKEY: u16 = 0xFFFF;

const SE: u8 = 0x80;
const MIG: u8 = 0x40;
const PAD_SHIFT: u8 = 4;
const PAD_MASK: u8 = 0x30;
const TVER_MASK: u8 = 0x0F;
const FECN: u8 = 0x80;
const BECN: u8 = 0x40;
const ACK_REQ: u8 = 0x80;

field::fixed_view!(
    /// A read/write view of a BTH at the start of `buffer`.
    Bth,
    HEADER_LEN
);

impl<T: AsRef<[u8]>> Bth<T> {
    #[inline]
    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }

    /// The opcode (byte 0).
    #[inline]
    pub fn opcode(&self) -> Opcode {
        Opcode(self.b()[fld::OPCODE])
    }

    /// SE: solicited event.
    #[inline]
    pub fn solicited(&self) -> bool {
        self.b()[fld::FLAGS] & SE != 0
    }

    /// M: migration request (APM state).
    #[inline]
    pub fn mig_req(&self) -> bool {
        self.b()[fld::FLAGS] & MIG != 0
    }

    /// PadCnt: number of pad bytes after the payload (0–3).
    #[inline]
    pub fn pad_count(&self) -> u8 {
        (self.b()[fld::FLAGS] & PAD_MASK) >> PAD_SHIFT
    }

    /// TVer: transport header version (must be 0).
    #[inline]
    pub fn tver(&self) -> u8 {
        self.b()[fld::FLAGS] & TVER_MASK
    }

    /// P_Key.
    #[inline]
    pub fn pkey(&self) -> u16 {
        field::read_u16(&self.b()[fld::PKEY])
    }

    /// FECN bit.
    #[inline]
    pub fn fecn(&self) -> bool {
        self.b()[fld::RESV8A] & FECN != 0
    }

    /// BECN bit (set in CNPs).
    #[inline]
    pub fn becn(&self) -> bool {
        self.b()[fld::RESV8A] & BECN != 0
    }

    /// Destination QP number.
    #[inline]
    pub fn dest_qp(&self) -> Qpn {
        Qpn::new(field::read_u24(&self.b()[fld::DEST_QP]))
    }

    /// AckReq bit.
    #[inline]
    pub fn ack_req(&self) -> bool {
        self.b()[fld::ACK] & ACK_REQ != 0
    }

    /// Packet sequence number.
    #[inline]
    pub fn psn(&self) -> Psn {
        Psn::new(field::read_u24(&self.b()[fld::PSN]))
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Bth<T> {
    #[inline]
    fn bm(&mut self) -> &mut [u8] {
        self.buffer.as_mut()
    }

    #[inline]
    fn set_bit(&mut self, idx: usize, mask: u8, on: bool) {
        let b = &mut self.bm()[idx];
        *b = if on { *b | mask } else { *b & !mask };
    }

    /// Sets the opcode.
    #[inline]
    pub fn set_opcode(&mut self, v: Opcode) {
        self.bm()[fld::OPCODE] = v.0;
    }

    /// Sets SE.
    #[inline]
    pub fn set_solicited(&mut self, v: bool) {
        self.set_bit(fld::FLAGS, SE, v);
    }

    /// Sets M.
    #[inline]
    pub fn set_mig_req(&mut self, v: bool) {
        self.set_bit(fld::FLAGS, MIG, v);
    }

    /// Sets PadCnt (low two bits of `v`).
    #[inline]
    pub fn set_pad_count(&mut self, v: u8) {
        let b = &mut self.bm()[fld::FLAGS];
        *b = (*b & !PAD_MASK) | ((v << PAD_SHIFT) & PAD_MASK);
    }

    /// Sets TVer (low four bits of `v`).
    #[inline]
    pub fn set_tver(&mut self, v: u8) {
        let b = &mut self.bm()[fld::FLAGS];
        *b = (*b & !TVER_MASK) | (v & TVER_MASK);
    }

    /// Sets the P_Key.
    #[inline]
    pub fn set_pkey(&mut self, v: u16) {
        field::write_u16(&mut self.bm()[fld::PKEY], v);
    }

    /// Sets FECN.
    #[inline]
    pub fn set_fecn(&mut self, v: bool) {
        self.set_bit(fld::RESV8A, FECN, v);
    }

    /// Sets BECN.
    #[inline]
    pub fn set_becn(&mut self, v: bool) {
        self.set_bit(fld::RESV8A, BECN, v);
    }

    /// Sets the destination QP.
    #[inline]
    pub fn set_dest_qp(&mut self, v: Qpn) {
        field::write_u24(&mut self.bm()[fld::DEST_QP], v.value());
    }

    /// Sets AckReq.
    #[inline]
    pub fn set_ack_req(&mut self, v: bool) {
        self.set_bit(fld::ACK, ACK_REQ, v);
    }

    /// Sets the PSN.
    #[inline]
    pub fn set_psn(&mut self, v: Psn) {
        field::write_u24(&mut self.bm()[fld::PSN], v.value());
    }

    /// Clears the reserved bits (byte 4 bits 5–0, byte 8 bits 6–0).
    #[inline]
    pub fn clear_reserved(&mut self) {
        self.bm()[fld::RESV8A] &= FECN | BECN;
        self.bm()[fld::ACK] &= ACK_REQ;
    }
}

/// The BTH as a value (`ROCEV2.md §1.5`). TVer is not stored: [`BthRepr::parse`]
/// rejects TVer ≠ 0 (`ROCEV2.md §2.2`, \[rxe\] drops such packets) and
/// [`BthRepr::emit`] writes 0. Reserved bits are ignored on parse and written
/// as 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BthRepr {
    /// OpCode.
    pub opcode: Opcode,
    /// SE (solicited event).
    pub solicited: bool,
    /// M (migration request).
    pub mig_req: bool,
    /// PadCnt (0–3).
    pub pad_count: u8,
    /// P_Key (normally [`DEFAULT_PKEY`]).
    pub pkey: u16,
    /// FECN.
    pub fecn: bool,
    /// BECN (1 only in CNPs).
    pub becn: bool,
    /// Destination QP.
    pub dest_qp: Qpn,
    /// AckReq.
    pub ack_req: bool,
    /// PSN.
    pub psn: Psn,
}

impl BthRepr {
    /// Parses a checked BTH view.
    ///
    /// # Errors
    /// [`Error::Truncated`] if the view is shorter than 12 bytes;
    /// [`Error::Malformed`] if TVer ≠ 0.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(bth: &Bth<&T>) -> Result<Self> {
        bth.check_len()?;
        if bth.tver() != 0 {
            return Err(Error::Malformed);
        }
        Ok(BthRepr {
            opcode: bth.opcode(),
            solicited: bth.solicited(),
            mig_req: bth.mig_req(),
            pad_count: bth.pad_count(),
            pkey: bth.pkey(),
            fecn: bth.fecn(),
            becn: bth.becn(),
            dest_qp: bth.dest_qp(),
            ack_req: bth.ack_req(),
            psn: bth.psn(),
        })
    }

    /// Length of the emitted header: 12.
    pub const fn header_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes all 12 bytes (TVer and reserved bits 0). The buffer must be at
    /// least 12 bytes long (panics otherwise).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, bth: &mut Bth<T>) {
        let b = bth.bm();
        b[fld::OPCODE] = self.opcode.0;
        b[fld::FLAGS] = (if self.solicited { SE } else { 0 })
            | (if self.mig_req { MIG } else { 0 })
            | ((self.pad_count << PAD_SHIFT) & PAD_MASK);
        field::write_u16(&mut b[fld::PKEY], self.pkey);
        b[fld::RESV8A] = (if self.fecn { FECN } else { 0 }) | (if self.becn { BECN } else { 0 });
        field::write_u24(&mut b[fld::DEST_QP], self.dest_qp.value());
        b[fld::ACK] = if self.ack_req { ACK_REQ } else { 0 };
        field::write_u24(&mut b[fld::PSN], self.psn.value());
    }
}

impl fmt::Display for BthRepr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} qp={} psn=0x{:06x} A={} pad={}",
            self.opcode,
            self.dest_qp,
            self.psn.value(),
            u8::from(self.ack_req),
            self.pad_count
        )?;
        if self.solicited {
            f.write_str(" SE")?;
        }
        if self.mig_req {
            f.write_str(" MigReq")?;
        }
        if self.fecn {
            f.write_str(" FECN")?;
        }
        if self.becn {
            f.write_str(" BECN")?;
        }
        if self.pkey != DEFAULT_PKEY {
            write!(f, " pkey=0x{:04x}", self.pkey)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // SEND ONLY w/ IMM, SE=1, PadCnt=1, P_Key 0xffff, BECN, QP 0x123456, A=1, PSN 0xabcdef
    static BYTES: [u8; 12] = [
        0x05, 0x90, 0xff, 0xff, 0x40, 0x12, 0x34, 0x56, 0x80, 0xab, 0xcd, 0xef,
    ];

    fn repr() -> BthRepr {
        BthRepr {
            opcode: Opcode::RC_SEND_ONLY_WITH_IMMEDIATE,
            solicited: true,
            mig_req: false,
            pad_count: 1,
            pkey: 0xffff,
            fecn: false,
            becn: true,
            dest_qp: Qpn::new(0x123456),
            ack_req: true,
            psn: Psn::new(0xabcdef),
        }
    }

    #[test]
    fn test_deconstruct() {
        let b = Bth::new_checked(&BYTES[..]).unwrap();
        assert_eq!(b.opcode(), Opcode::RC_SEND_ONLY_WITH_IMMEDIATE);
        assert!(b.solicited());
        assert!(!b.mig_req());
        assert_eq!(b.pad_count(), 1);
        assert_eq!(b.tver(), 0);
        assert_eq!(b.pkey(), 0xffff);
        assert!(!b.fecn());
        assert!(b.becn());
        assert_eq!(b.dest_qp(), Qpn::new(0x123456));
        assert!(b.ack_req());
        assert_eq!(b.psn(), Psn::new(0xabcdef));
    }

    #[test]
    fn test_construct() {
        let mut buf = [0xAAu8; 12];
        let mut b = Bth::new_unchecked(&mut buf[..]);
        b.set_opcode(Opcode::RC_SEND_ONLY_WITH_IMMEDIATE);
        b.set_solicited(true);
        b.set_mig_req(false);
        b.set_pad_count(1);
        b.set_tver(0);
        b.set_pkey(0xffff);
        b.set_fecn(false);
        b.set_becn(true);
        b.set_dest_qp(Qpn::new(0x123456));
        b.set_ack_req(true);
        b.set_psn(Psn::new(0xabcdef));
        b.clear_reserved();
        assert_eq!(buf, BYTES);
    }

    #[test]
    fn test_parse() {
        let b = Bth::new_checked(&BYTES[..]).unwrap();
        assert_eq!(BthRepr::parse(&b).unwrap(), repr());
    }

    #[test]
    fn test_emit() {
        let mut buf = [0x55u8; 12];
        repr().emit(&mut Bth::new_unchecked(&mut buf[..]));
        assert_eq!(buf, BYTES);
    }

    #[test]
    fn test_impossible_len() {
        assert_eq!(
            Bth::new_checked(&BYTES[..11]).unwrap_err(),
            Error::Truncated
        );
        let mut bad = BYTES;
        bad[1] |= 0x01; // TVer = 1
        let b = Bth::new_checked(&bad[..]).unwrap();
        assert_eq!(BthRepr::parse(&b).unwrap_err(), Error::Malformed);
    }
}
