//! Datagram Extended Transport Header, 8 bytes (`ROCEV2.md §1.6`, UD):
//! Q_Key (32), reserved (8), source QPN (24).

use crate::field::{self, Field};
use crate::{Qpn, Result};

mod fld {
    use super::Field;
    pub(crate) const QKEY: Field = 0..4;
    pub(crate) const RESV: usize = 4;
    pub(crate) const SRC_QP: Field = 5..8;
}

/// Length of the DETH in bytes.
pub const HEADER_LEN: usize = fld::SRC_QP.end;

field::fixed_view!(
    /// A read/write view of a DETH.
    Deth,
    HEADER_LEN
);

impl<T: AsRef<[u8]>> Deth<T> {
    /// Q_Key.
    #[inline]
    pub fn qkey(&self) -> u32 {
        field::read_u32(&self.buffer.as_ref()[fld::QKEY])
    }
    /// Source QP number.
    #[inline]
    pub fn src_qp(&self) -> Qpn {
        Qpn::new(field::read_u24(&self.buffer.as_ref()[fld::SRC_QP]))
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Deth<T> {
    /// Sets the Q_Key.
    #[inline]
    pub fn set_qkey(&mut self, v: u32) {
        field::write_u32(&mut self.buffer.as_mut()[fld::QKEY], v);
    }
    /// Sets the source QP number (and clears the reserved byte).
    #[inline]
    pub fn set_src_qp(&mut self, v: Qpn) {
        let b = self.buffer.as_mut();
        b[fld::RESV] = 0;
        field::write_u24(&mut b[fld::SRC_QP], v.value());
    }
}

/// DETH as a value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DethRepr {
    /// Q_Key.
    pub qkey: u32,
    /// Source QP number.
    pub src_qp: Qpn,
}

impl DethRepr {
    /// Parses a DETH view (the reserved byte is ignored).
    ///
    /// # Errors
    /// [`crate::Error::Truncated`] if shorter than 8 bytes.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(h: &Deth<&T>) -> Result<Self> {
        h.check_len()?;
        Ok(DethRepr {
            qkey: h.qkey(),
            src_qp: h.src_qp(),
        })
    }
    /// Emitted length: 8.
    pub const fn header_len(&self) -> usize {
        HEADER_LEN
    }
    /// Writes the header (buffer ≥ 8 bytes; reserved byte 0).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, h: &mut Deth<T>) {
        h.set_qkey(self.qkey);
        h.set_src_qp(self.src_qp);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Error;

    static BYTES: [u8; 8] = [0x11, 0x11, 0x11, 0x11, 0x00, 0x00, 0x01, 0x23];
    const REPR: DethRepr = DethRepr {
        qkey: 0x1111_1111,
        src_qp: Qpn::new(0x123),
    };

    #[test]
    fn test_deconstruct() {
        let h = Deth::new_checked(&BYTES[..]).unwrap();
        assert_eq!(h.qkey(), 0x1111_1111);
        assert_eq!(h.src_qp(), Qpn::new(0x123));
    }
    #[test]
    fn test_construct() {
        let mut buf = [0xffu8; 8];
        let mut h = Deth::new_unchecked(&mut buf[..]);
        h.set_qkey(0x1111_1111);
        h.set_src_qp(Qpn::new(0x123));
        assert_eq!(buf, BYTES);
    }
    #[test]
    fn test_parse() {
        assert_eq!(
            DethRepr::parse(&Deth::new_unchecked(&BYTES[..])).unwrap(),
            REPR
        );
    }
    #[test]
    fn test_emit() {
        let mut buf = [0xffu8; 8];
        REPR.emit(&mut Deth::new_unchecked(&mut buf[..]));
        assert_eq!(buf, BYTES);
    }
    #[test]
    fn test_impossible_len() {
        assert_eq!(
            Deth::new_checked(&BYTES[..7]).unwrap_err(),
            Error::Truncated
        );
    }
}
