//! Flush Extended Transport Header, 4 bytes (`ROCEV2.md §1.6`, FLUSH opcode
//! 0x1C): bits 5–4 of byte 3 selectivity level, bits 3–0 placement type; the
//! rest reserved. Kept as the raw 32-bit word plus accessors.

use crate::Result;
use crate::field::{self, Field};

mod fld {
    use super::Field;
    pub(crate) const WORD: Field = 0..4;
}

/// Length of the FETH in bytes.
pub const HEADER_LEN: usize = fld::WORD.end;

field::fixed_view!(
    /// A read/write view of a FETH.
    Feth,
    HEADER_LEN
);

impl<T: AsRef<[u8]>> Feth<T> {
    /// The whole 32-bit word.
    #[inline]
    pub fn word(&self) -> u32 {
        field::read_u32(&self.buffer.as_ref()[fld::WORD])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Feth<T> {
    /// Sets the whole 32-bit word.
    #[inline]
    pub fn set_word(&mut self, v: u32) {
        field::write_u32(&mut self.buffer.as_mut()[fld::WORD], v);
    }
}

/// FETH as a value: the raw word.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FethRepr {
    /// Raw 32-bit FETH word.
    pub word: u32,
}

impl FethRepr {
    /// Selectivity level (bits 5–4).
    pub const fn selectivity(&self) -> u8 {
        ((self.word >> 4) & 0x3) as u8
    }
    /// Placement type (bits 3–0).
    pub const fn placement(&self) -> u8 {
        (self.word & 0xF) as u8
    }
    /// Parses a FETH view.
    ///
    /// # Errors
    /// [`crate::Error::Truncated`] if shorter than 4 bytes.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(h: &Feth<&T>) -> Result<Self> {
        h.check_len()?;
        Ok(FethRepr { word: h.word() })
    }
    /// Emitted length: 4.
    pub const fn header_len(&self) -> usize {
        HEADER_LEN
    }
    /// Writes the header (buffer ≥ 4 bytes).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, h: &mut Feth<T>) {
        h.set_word(self.word);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Error;

    static BYTES: [u8; 4] = [0, 0, 0, 0x21];
    const REPR: FethRepr = FethRepr { word: 0x21 };

    #[test]
    fn test_deconstruct() {
        assert_eq!(Feth::new_checked(&BYTES[..]).unwrap().word(), 0x21);
        assert_eq!(REPR.selectivity(), 2);
        assert_eq!(REPR.placement(), 1);
    }
    #[test]
    fn test_construct() {
        let mut buf = [0xffu8; 4];
        Feth::new_unchecked(&mut buf[..]).set_word(0x21);
        assert_eq!(buf, BYTES);
    }
    #[test]
    fn test_parse() {
        assert_eq!(
            FethRepr::parse(&Feth::new_unchecked(&BYTES[..])).unwrap(),
            REPR
        );
    }
    #[test]
    fn test_emit() {
        let mut buf = [0u8; 4];
        REPR.emit(&mut Feth::new_unchecked(&mut buf[..]));
        assert_eq!(buf, BYTES);
    }
    #[test]
    fn test_impossible_len() {
        assert_eq!(
            Feth::new_checked(&BYTES[..1]).unwrap_err(),
            Error::Truncated
        );
    }
}
