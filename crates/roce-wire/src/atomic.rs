//! Atomic Extended Transport Header (28 bytes) and Atomic ACK Extended
//! Transport Header (8 bytes) (`ROCEV2.md §1.6`, IBTA Vol 1 §9.3.3.4/§9.3.5.3).
//!
//! AtomicETH: VA (64, 8-byte aligned), R_Key (32), Swap-or-Add data (64),
//! Compare data (64). AtomicAckETH: original remote value (64).

use crate::Result;
use crate::field::{self, Field};

mod fld {
    use super::Field;
    pub(crate) const VA: Field = 0..8;
    pub(crate) const RKEY: Field = 8..12;
    pub(crate) const SWAP_ADD: Field = 12..20;
    pub(crate) const COMPARE: Field = 20..28;
    pub(crate) const ORIG: Field = 0..8;
}

/// Length of the AtomicETH in bytes.
pub const ATOMIC_ETH_LEN: usize = fld::COMPARE.end;
/// Length of the AtomicAckETH in bytes.
pub const ATOMIC_ACK_ETH_LEN: usize = fld::ORIG.end;

field::fixed_view!(
    /// A read/write view of an AtomicETH.
    AtomicEth,
    ATOMIC_ETH_LEN
);

impl<T: AsRef<[u8]>> AtomicEth<T> {
    /// Remote virtual address (should be 8-byte aligned).
    #[inline]
    pub fn va(&self) -> u64 {
        field::read_u64(&self.buffer.as_ref()[fld::VA])
    }
    /// Remote key.
    #[inline]
    pub fn rkey(&self) -> u32 {
        field::read_u32(&self.buffer.as_ref()[fld::RKEY])
    }
    /// Swap value (COMPARE & SWAP) or addend (FETCH & ADD).
    #[inline]
    pub fn swap_add(&self) -> u64 {
        field::read_u64(&self.buffer.as_ref()[fld::SWAP_ADD])
    }
    /// Compare value (COMPARE & SWAP; unused by FETCH & ADD).
    #[inline]
    pub fn compare(&self) -> u64 {
        field::read_u64(&self.buffer.as_ref()[fld::COMPARE])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> AtomicEth<T> {
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
    /// Sets the swap/add value.
    #[inline]
    pub fn set_swap_add(&mut self, v: u64) {
        field::write_u64(&mut self.buffer.as_mut()[fld::SWAP_ADD], v);
    }
    /// Sets the compare value.
    #[inline]
    pub fn set_compare(&mut self, v: u64) {
        field::write_u64(&mut self.buffer.as_mut()[fld::COMPARE], v);
    }
}

/// AtomicETH as a value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AtomicEthRepr {
    /// Remote virtual address.
    pub va: u64,
    /// Remote key.
    pub rkey: u32,
    /// Swap value or addend.
    pub swap_add: u64,
    /// Compare value.
    pub compare: u64,
}

impl AtomicEthRepr {
    /// Parses an AtomicETH view.
    ///
    /// # Errors
    /// [`crate::Error::Truncated`] if shorter than 28 bytes.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(h: &AtomicEth<&T>) -> Result<Self> {
        h.check_len()?;
        Ok(AtomicEthRepr {
            va: h.va(),
            rkey: h.rkey(),
            swap_add: h.swap_add(),
            compare: h.compare(),
        })
    }
    /// Emitted length: 28.
    pub const fn header_len(&self) -> usize {
        ATOMIC_ETH_LEN
    }
    /// Writes the header (buffer ≥ 28 bytes).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, h: &mut AtomicEth<T>) {
        h.set_va(self.va);
        h.set_rkey(self.rkey);
        h.set_swap_add(self.swap_add);
        h.set_compare(self.compare);
    }
}

field::fixed_view!(
    /// A read/write view of an AtomicAckETH.
    AtomicAckEth,
    ATOMIC_ACK_ETH_LEN
);

impl<T: AsRef<[u8]>> AtomicAckEth<T> {
    /// The original remote value before the atomic operation.
    #[inline]
    pub fn orig_value(&self) -> u64 {
        field::read_u64(&self.buffer.as_ref()[fld::ORIG])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> AtomicAckEth<T> {
    /// Sets the original remote value.
    #[inline]
    pub fn set_orig_value(&mut self, v: u64) {
        field::write_u64(&mut self.buffer.as_mut()[fld::ORIG], v);
    }
}

/// AtomicAckETH as a value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AtomicAckEthRepr {
    /// Original remote value.
    pub orig_value: u64,
}

impl AtomicAckEthRepr {
    /// Parses an AtomicAckETH view.
    ///
    /// # Errors
    /// [`crate::Error::Truncated`] if shorter than 8 bytes.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(h: &AtomicAckEth<&T>) -> Result<Self> {
        h.check_len()?;
        Ok(AtomicAckEthRepr {
            orig_value: h.orig_value(),
        })
    }
    /// Emitted length: 8.
    pub const fn header_len(&self) -> usize {
        ATOMIC_ACK_ETH_LEN
    }
    /// Writes the header (buffer ≥ 8 bytes).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, h: &mut AtomicAckEth<T>) {
        h.set_orig_value(self.orig_value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Error;

    static ETH_BYTES: [u8; 28] = [
        0x00, 0x00, 0x7f, 0x00, 0x00, 0x00, 0x40, 0x00, // va
        0x12, 0x34, 0xab, 0xcd, // rkey
        0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11, // swap
        0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, // compare
    ];
    const ETH_REPR: AtomicEthRepr = AtomicEthRepr {
        va: 0x0000_7f00_0000_4000,
        rkey: 0x1234_abcd,
        swap_add: 0x1111_1111_1111_1111,
        compare: 0x2222_2222_2222_2222,
    };
    static ACK_BYTES: [u8; 8] = [1, 2, 3, 4, 5, 6, 7, 8];
    const ACK_REPR: AtomicAckEthRepr = AtomicAckEthRepr {
        orig_value: 0x0102_0304_0506_0708,
    };

    #[test]
    fn test_deconstruct() {
        let h = AtomicEth::new_checked(&ETH_BYTES[..]).unwrap();
        assert_eq!(h.va(), ETH_REPR.va);
        assert_eq!(h.rkey(), ETH_REPR.rkey);
        assert_eq!(h.swap_add(), ETH_REPR.swap_add);
        assert_eq!(h.compare(), ETH_REPR.compare);
        assert_eq!(
            AtomicAckEth::new_checked(&ACK_BYTES[..])
                .unwrap()
                .orig_value(),
            0x0102_0304_0506_0708
        );
    }
    #[test]
    fn test_construct() {
        let mut buf = [0u8; 28];
        let mut h = AtomicEth::new_unchecked(&mut buf[..]);
        h.set_va(ETH_REPR.va);
        h.set_rkey(ETH_REPR.rkey);
        h.set_swap_add(ETH_REPR.swap_add);
        h.set_compare(ETH_REPR.compare);
        assert_eq!(buf, ETH_BYTES);
        let mut buf = [0u8; 8];
        AtomicAckEth::new_unchecked(&mut buf[..]).set_orig_value(0x0102_0304_0506_0708);
        assert_eq!(buf, ACK_BYTES);
    }
    #[test]
    fn test_parse() {
        assert_eq!(
            AtomicEthRepr::parse(&AtomicEth::new_unchecked(&ETH_BYTES[..])).unwrap(),
            ETH_REPR
        );
        assert_eq!(
            AtomicAckEthRepr::parse(&AtomicAckEth::new_unchecked(&ACK_BYTES[..])).unwrap(),
            ACK_REPR
        );
    }
    #[test]
    fn test_emit() {
        let mut buf = [0u8; 28];
        ETH_REPR.emit(&mut AtomicEth::new_unchecked(&mut buf[..]));
        assert_eq!(buf, ETH_BYTES);
        let mut buf = [0u8; 8];
        ACK_REPR.emit(&mut AtomicAckEth::new_unchecked(&mut buf[..]));
        assert_eq!(buf, ACK_BYTES);
    }
    #[test]
    fn test_impossible_len() {
        assert_eq!(
            AtomicEth::new_checked(&ETH_BYTES[..27]).unwrap_err(),
            Error::Truncated
        );
        assert_eq!(
            AtomicAckEth::new_checked(&ACK_BYTES[..7]).unwrap_err(),
            Error::Truncated
        );
    }
}
