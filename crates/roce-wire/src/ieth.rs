//! Invalidate Extended Transport Header, 4 bytes (`ROCEV2.md §1.6`): the
//! R_Key the responder invalidates (SEND with invalidate).

use crate::Result;
use crate::field::{self, Field};

mod fld {
    use super::Field;
    pub(crate) const RKEY: Field = 0..4;
}

/// Length of the IETH in bytes.
pub const HEADER_LEN: usize = fld::RKEY.end;

field::fixed_view!(
    /// A read/write view of an IETH.
    Ieth,
    HEADER_LEN
);

impl<T: AsRef<[u8]>> Ieth<T> {
    /// R_Key to invalidate.
    #[inline]
    pub fn rkey(&self) -> u32 {
        field::read_u32(&self.buffer.as_ref()[fld::RKEY])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Ieth<T> {
    /// Sets the R_Key to invalidate.
    #[inline]
    pub fn set_rkey(&mut self, v: u32) {
        field::write_u32(&mut self.buffer.as_mut()[fld::RKEY], v);
    }
}

/// IETH as a value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct IethRepr {
    /// R_Key to invalidate.
    pub rkey: u32,
}

impl IethRepr {
    /// Parses an IETH view.
    ///
    /// # Errors
    /// [`crate::Error::Truncated`] if shorter than 4 bytes.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(h: &Ieth<&T>) -> Result<Self> {
        h.check_len()?;
        Ok(IethRepr { rkey: h.rkey() })
    }
    /// Emitted length: 4.
    pub const fn header_len(&self) -> usize {
        HEADER_LEN
    }
    /// Writes the header (buffer ≥ 4 bytes).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, h: &mut Ieth<T>) {
        h.set_rkey(self.rkey);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Error;

    static BYTES: [u8; 4] = [0x00, 0x00, 0x12, 0x34];
    const REPR: IethRepr = IethRepr { rkey: 0x1234 };

    #[test]
    fn test_deconstruct() {
        assert_eq!(Ieth::new_checked(&BYTES[..]).unwrap().rkey(), 0x1234);
    }
    #[test]
    fn test_construct() {
        let mut buf = [0xffu8; 4];
        Ieth::new_unchecked(&mut buf[..]).set_rkey(0x1234);
        assert_eq!(buf, BYTES);
    }
    #[test]
    fn test_parse() {
        assert_eq!(
            IethRepr::parse(&Ieth::new_unchecked(&BYTES[..])).unwrap(),
            REPR
        );
    }
    #[test]
    fn test_emit() {
        let mut buf = [0u8; 4];
        REPR.emit(&mut Ieth::new_unchecked(&mut buf[..]));
        assert_eq!(buf, BYTES);
    }
    #[test]
    fn test_impossible_len() {
        assert_eq!(
            Ieth::new_checked(&BYTES[..2]).unwrap_err(),
            Error::Truncated
        );
    }
}
