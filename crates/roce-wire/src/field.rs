//! Shared helpers for field offsets (STYLE W2): range aliases and big-endian
//! accessors, including the 24-bit ones used by QPN, PSN and MSN fields.
//!
//! Every helper indexes its slice directly; callers only pass slices whose
//! length was established by a `check_len` (or by a computed emit length), so
//! the indexing cannot fail (see the panic contract in the crate docs).

/// A byte range of a fixed-size field within a header.
pub(crate) type Field = core::ops::Range<usize>;
/// The remainder of a buffer from an offset on.
#[allow(dead_code)]
pub(crate) type Rest = core::ops::RangeFrom<usize>;

/// Reads a big-endian 16-bit value from the first two bytes of `b`.
#[inline]
pub(crate) fn read_u16(b: &[u8]) -> u16 {
    u16::from_be_bytes([b[0], b[1]])
}

/// Writes `v` big-endian into the first two bytes of `b`.
#[inline]
pub(crate) fn write_u16(b: &mut [u8], v: u16) {
    b[..2].copy_from_slice(&v.to_be_bytes());
}

/// Reads a big-endian 24-bit value from the first three bytes of `b`.
#[inline]
pub(crate) fn read_u24(b: &[u8]) -> u32 {
    u32::from_be_bytes([0, b[0], b[1], b[2]])
}

/// Writes the low 24 bits of `v` big-endian into the first three bytes of `b`
/// (the top byte of `v` is ignored).
#[inline]
pub(crate) fn write_u24(b: &mut [u8], v: u32) {
    let bytes = v.to_be_bytes();
    b[..3].copy_from_slice(&bytes[1..]);
}

/// Reads a big-endian 32-bit value from the first four bytes of `b`.
#[inline]
pub(crate) fn read_u32(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

/// Writes `v` big-endian into the first four bytes of `b`.
#[inline]
pub(crate) fn write_u32(b: &mut [u8], v: u32) {
    b[..4].copy_from_slice(&v.to_be_bytes());
}

/// Reads a big-endian 64-bit value from the first eight bytes of `b`.
#[inline]
pub(crate) fn read_u64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_be_bytes(a)
}

/// Writes `v` big-endian into the first eight bytes of `b`.
#[inline]
pub(crate) fn write_u64(b: &mut [u8], v: u64) {
    b[..8].copy_from_slice(&v.to_be_bytes());
}

/// Generates the common part of a fixed-length header view: the struct,
/// `new_unchecked`, `new_checked`, `check_len`, `into_inner` and `HEADER_LEN`
/// handling (STYLE W1/W3).
macro_rules! fixed_view {
    ($(#[$meta:meta])* $name:ident, $len:expr) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub struct $name<T: AsRef<[u8]>> {
            buffer: T,
        }

        impl<T: AsRef<[u8]>> $name<T> {
            /// Wraps a buffer without checking its length. Accessors may panic
            /// if the buffer is shorter than the header; use only on buffers
            /// whose length the caller computed (emission).
            #[inline]
            pub const fn new_unchecked(buffer: T) -> Self {
                Self { buffer }
            }

            /// Wraps a buffer and checks that it holds the whole header
            /// (`check_len`). Use this for untrusted input.
            ///
            /// # Errors
            /// [`crate::Error::Truncated`] if the buffer is too short.
            #[inline]
            pub fn new_checked(buffer: T) -> crate::Result<Self> {
                let v = Self::new_unchecked(buffer);
                v.check_len()?;
                Ok(v)
            }

            /// Checks that the buffer holds the whole header, after which no
            /// accessor panics.
            ///
            /// # Errors
            /// [`crate::Error::Truncated`] if the buffer is too short.
            #[inline]
            pub fn check_len(&self) -> crate::Result<()> {
                if self.buffer.as_ref().len() < $len {
                    Err(crate::Error::Truncated)
                } else {
                    Ok(())
                }
            }

            /// Returns the underlying buffer.
            #[inline]
            pub fn into_inner(self) -> T {
                self.buffer
            }

            /// Length of this header in bytes.
            #[inline]
            pub const fn header_len(&self) -> usize {
                $len
            }
        }
    };
}
pub(crate) use fixed_view;
