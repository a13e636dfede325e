//! RoCE v2 CNP body: 16 reserved bytes after the BTH (`ROCEV2.md §6`,
//! Mellanox "RoCEv2 CNP packet format"). Senders write zeros; receivers ignore
//! the content.

use crate::Result;
use crate::field::{self, Field};

mod fld {
    use super::Field;
    pub(crate) const RESERVED: Field = 0..16;
}

/// Length of the CNP body in bytes.
pub const HEADER_LEN: usize = fld::RESERVED.end;

field::fixed_view!(
    /// A read/write view of the 16-byte CNP body.
    CnpBody,
    HEADER_LEN
);

impl<T: AsRef<[u8]>> CnpBody<T> {
    /// The 16 reserved bytes.
    #[inline]
    pub fn reserved(&self) -> &[u8] {
        &self.buffer.as_ref()[fld::RESERVED]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> CnpBody<T> {
    /// Zeroes the 16 reserved bytes.
    #[inline]
    pub fn clear_reserved(&mut self) {
        self.buffer.as_mut()[fld::RESERVED].fill(0);
    }
}

/// The CNP body as a value: it carries no information (reserved bytes are
/// ignored on parse and written as zero).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CnpRepr;

impl CnpRepr {
    /// Parses a CNP body view.
    ///
    /// # Errors
    /// [`crate::Error::Truncated`] if shorter than 16 bytes.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(h: &CnpBody<&T>) -> Result<Self> {
        h.check_len()?;
        Ok(CnpRepr)
    }
    /// Emitted length: 16.
    pub const fn header_len(&self) -> usize {
        HEADER_LEN
    }
    /// Writes 16 zero bytes (buffer ≥ 16 bytes).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, h: &mut CnpBody<T>) {
        h.clear_reserved();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Error;

    static BYTES: [u8; 16] = [0; 16];

    #[test]
    fn test_deconstruct() {
        assert_eq!(
            CnpBody::new_checked(&BYTES[..]).unwrap().reserved(),
            &[0u8; 16]
        );
    }
    #[test]
    fn test_construct() {
        let mut buf = [0xffu8; 16];
        CnpBody::new_unchecked(&mut buf[..]).clear_reserved();
        assert_eq!(buf, BYTES);
    }
    #[test]
    fn test_parse() {
        assert_eq!(
            CnpRepr::parse(&CnpBody::new_unchecked(&BYTES[..])).unwrap(),
            CnpRepr
        );
    }
    #[test]
    fn test_emit() {
        let mut buf = [0x77u8; 16];
        CnpRepr.emit(&mut CnpBody::new_unchecked(&mut buf[..]));
        assert_eq!(buf, BYTES);
    }
    #[test]
    fn test_impossible_len() {
        assert_eq!(
            CnpBody::new_checked(&BYTES[..15]).unwrap_err(),
            Error::Truncated
        );
    }
}
