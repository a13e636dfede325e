//! Immediate Data header, 4 bytes (`ROCEV2.md §1.6`). The 32-bit value is
//! opaque; it is read and written big-endian (verbs already hold it in network
//! order, so `imm_data` equals the verbs `imm_data` as a big-endian integer).

use crate::Result;
use crate::field::{self, Field};

mod fld {
    use super::Field;
    pub(crate) const IMM: Field = 0..4;
}

/// Length of the ImmDt header in bytes.
pub const HEADER_LEN: usize = fld::IMM.end;

field::fixed_view!(
    /// A read/write view of an ImmDt header.
    ImmDt,
    HEADER_LEN
);

impl<T: AsRef<[u8]>> ImmDt<T> {
    /// Immediate data (bytes 0..4, big-endian).
    #[inline]
    pub fn imm_data(&self) -> u32 {
        field::read_u32(&self.buffer.as_ref()[fld::IMM])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> ImmDt<T> {
    /// Sets the immediate data.
    #[inline]
    pub fn set_imm_data(&mut self, v: u32) {
        field::write_u32(&mut self.buffer.as_mut()[fld::IMM], v);
    }
}

/// ImmDt as a value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ImmDtRepr {
    /// Immediate data.
    pub imm_data: u32,
}

impl ImmDtRepr {
    /// Parses an ImmDt view.
    ///
    /// # Errors
    /// [`crate::Error::Truncated`] if shorter than 4 bytes.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(h: &ImmDt<&T>) -> Result<Self> {
        h.check_len()?;
        Ok(ImmDtRepr {
            imm_data: h.imm_data(),
        })
    }
    /// Emitted length: 4.
    pub const fn header_len(&self) -> usize {
        HEADER_LEN
    }
    /// Writes the header (buffer ≥ 4 bytes).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, h: &mut ImmDt<T>) {
        h.set_imm_data(self.imm_data);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Error;

    static BYTES: [u8; 4] = [0xde, 0xad, 0xbe, 0xef];
    const REPR: ImmDtRepr = ImmDtRepr {
        imm_data: 0xdead_beef,
    };

    #[test]
    fn test_deconstruct() {
        assert_eq!(
            ImmDt::new_checked(&BYTES[..]).unwrap().imm_data(),
            0xdead_beef
        );
    }
    #[test]
    fn test_construct() {
        let mut buf = [0u8; 4];
        ImmDt::new_unchecked(&mut buf[..]).set_imm_data(0xdead_beef);
        assert_eq!(buf, BYTES);
    }
    #[test]
    fn test_parse() {
        assert_eq!(
            ImmDtRepr::parse(&ImmDt::new_unchecked(&BYTES[..])).unwrap(),
            REPR
        );
    }
    #[test]
    fn test_emit() {
        let mut buf = [0u8; 4];
        REPR.emit(&mut ImmDt::new_unchecked(&mut buf[..]));
        assert_eq!(buf, BYTES);
    }
    #[test]
    fn test_impossible_len() {
        assert_eq!(
            ImmDt::new_checked(&BYTES[..3]).unwrap_err(),
            Error::Truncated
        );
    }
}
