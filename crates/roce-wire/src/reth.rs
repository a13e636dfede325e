//! RDMA Extended Transport Header, 16 bytes (`ROCEV2.md §1.6`, IBTA Vol 1
//! §9.3.3.3): VA (64), R_Key (32), DMA length (32, total message length).

use crate::Result;
use crate::field::{self, Field};

mod fld {
    use super::Field;
    pub(crate) const VA: Field = 0..8;
    pub(crate) const RKEY: Field = 8..12;
    pub(crate) const DMA_LEN: Field = 12..16;
}

/// Length of the RETH in bytes.
pub const HEADER_LEN: usize = fld::DMA_LEN.end;

field::fixed_view!(
    /// A read/write view of a RETH at the start of `buffer`.
    Reth,
    HEADER_LEN
);

impl<T: AsRef<[u8]>> Reth<T> {
    /// Remote virtual address.
    #[inline]
    pub fn va(&self) -> u64 {
        field::read_u64(&self.buffer.as_ref()[fld::VA])
    }
    /// Remote key.
    #[inline]
    pub fn rkey(&self) -> u32 {
        field::read_u32(&self.buffer.as_ref()[fld::RKEY])
    }
    /// DMA length in bytes (whole message).
    #[inline]
    pub fn dma_len(&self) -> u32 {
        field::read_u32(&self.buffer.as_ref()[fld::DMA_LEN])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Reth<T> {
    /// Sets the remote virtual address.
    #[inline]
    pub fn set_va(&mut self, v: u64) {
        field::write_u64(&mut self.buffer.as_mut()[fld::VA], v);
    }
    /// Sets the remote key.
    #[inline]
    pub fn set_rkey(&mut self, v: u32) {
        field::write_u32(&mut self.buffer.as_mut()[fld::RKEY], v);
    }
    /// Sets the DMA length.
    #[inline]
    pub fn set_dma_len(&mut self, v: u32) {
        field::write_u32(&mut self.buffer.as_mut()[fld::DMA_LEN], v);
    }
}

/// RETH as a value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RethRepr {
    /// Remote virtual address of the first byte.
    pub va: u64,
    /// Remote key.
    pub rkey: u32,
    /// Total message length in bytes.
    pub dma_len: u32,
}

impl RethRepr {
    /// Parses a RETH view.
    ///
    /// # Errors
    /// [`crate::Error::Truncated`] if shorter than 16 bytes.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(h: &Reth<&T>) -> Result<Self> {
        h.check_len()?;
        Ok(RethRepr {
            va: h.va(),
            rkey: h.rkey(),
            dma_len: h.dma_len(),
        })
    }
    /// Emitted length: 16.
    pub const fn header_len(&self) -> usize {
        HEADER_LEN
    }
    /// Writes the header (buffer ≥ 16 bytes).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, h: &mut Reth<T>) {
        h.set_va(self.va);
        h.set_rkey(self.rkey);
        h.set_dma_len(self.dma_len);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Error;

    static BYTES: [u8; 16] = [
        0x00, 0x00, 0x7f, 0x00, 0x00, 0x00, 0x10, 0x00, 0x12, 0x34, 0xab, 0xcd, 0x00, 0x00, 0x02,
        0x58,
    ];
    const REPR: RethRepr = RethRepr {
        va: 0x0000_7f00_0000_1000,
        rkey: 0x1234_abcd,
        dma_len: 600,
    };

    #[test]
    fn test_deconstruct() {
        let h = Reth::new_checked(&BYTES[..]).unwrap();
        assert_eq!(h.va(), 0x0000_7f00_0000_1000);
        assert_eq!(h.rkey(), 0x1234_abcd);
        assert_eq!(h.dma_len(), 600);
    }
    #[test]
    fn test_construct() {
        let mut buf = [0xffu8; 16];
        let mut h = Reth::new_unchecked(&mut buf[..]);
        h.set_va(0x0000_7f00_0000_1000);
        h.set_rkey(0x1234_abcd);
        h.set_dma_len(600);
        assert_eq!(buf, BYTES);
    }
    #[test]
    fn test_parse() {
        assert_eq!(
            RethRepr::parse(&Reth::new_unchecked(&BYTES[..])).unwrap(),
            REPR
        );
    }
    #[test]
    fn test_emit() {
        let mut buf = [0u8; 16];
        REPR.emit(&mut Reth::new_unchecked(&mut buf[..]));
        assert_eq!(buf, BYTES);
    }
    #[test]
    fn test_impossible_len() {
        assert_eq!(
            Reth::new_checked(&BYTES[..15]).unwrap_err(),
            Error::Truncated
        );
        assert_eq!(
            RethRepr::parse(&Reth::new_unchecked(&BYTES[..3])).unwrap_err(),
            Error::Truncated
        );
    }
}
