//! 24-bit identifier newtypes carried in transport headers: [`Psn`], [`Qpn`],
//! [`Msn`].
//!
//! PSN arithmetic follows `ROCEV2.md §2.3` (IBTA Vol 1 §9.7.1): sequence
//! numbers live modulo 2^24 and are ordered with a signed 24-bit difference,
//! `cmp(a, b) = ((a − b) << 8) as i32`, which is only meaningful while the two
//! values are less than 2^23 apart.

use core::cmp::Ordering;
use core::fmt;

/// Mask of a 24-bit field.
pub const U24_MASK: u32 = 0x00FF_FFFF;

/// Packet sequence number: 24 bits, wrapping (`ROCEV2.md §1.5`, §2.3).
///
/// `Psn` deliberately does not implement `Ord`: the window comparison is not
/// transitive over the whole space. Use [`Psn::window_cmp`],
/// [`Psn::precedes`], [`Psn::follows`] and [`Psn::diff`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Psn(u32);

impl Psn {
    /// PSN 0.
    pub const ZERO: Psn = Psn(0);
    /// The largest PSN, 0xFFFFFF; its successor is [`Psn::ZERO`].
    pub const MAX: Psn = Psn(U24_MASK);
    /// Half the PSN space (2^23): the comparison window.
    pub const WINDOW: u32 = 1 << 23;

    /// Creates a PSN from the low 24 bits of `value` (upper bits are dropped).
    #[inline]
    pub const fn new(value: u32) -> Self {
        Psn(value & U24_MASK)
    }

    /// Creates a PSN, or `None` if `value` does not fit in 24 bits.
    #[inline]
    pub const fn new_checked(value: u32) -> Option<Self> {
        if value > U24_MASK {
            None
        } else {
            Some(Psn(value))
        }
    }

    /// The 24-bit value.
    #[inline]
    pub const fn value(self) -> u32 {
        self.0
    }

    /// `self + n` modulo 2^24.
    #[inline]
    #[must_use]
    pub const fn wrapping_add(self, n: u32) -> Self {
        Psn(self.0.wrapping_add(n) & U24_MASK)
    }

    /// `self − n` modulo 2^24.
    #[inline]
    #[must_use]
    pub const fn wrapping_sub(self, n: u32) -> Self {
        Psn(self.0.wrapping_sub(n) & U24_MASK)
    }

    /// The successor, `self + 1` modulo 2^24.
    #[inline]
    #[must_use]
    pub const fn next(self) -> Self {
        self.wrapping_add(1)
    }

    /// Signed distance `self − other` in the range −2^23 ..= 2^23 − 1
    /// (`ROCEV2.md §2.3`: `((a − b) << 8) as i32`, scaled back down).
    /// Positive means `self` comes after `other`.
    #[inline]
    pub const fn diff(self, other: Psn) -> i32 {
        ((self.0.wrapping_sub(other.0) << 8) as i32) >> 8
    }

    /// Forward distance from `self` to `later`: `(later − self) mod 2^24`.
    #[inline]
    pub const fn distance_to(self, later: Psn) -> u32 {
        later.0.wrapping_sub(self.0) & U24_MASK
    }

    /// Window comparison (`ROCEV2.md §2.3`): `Greater` if `self` follows
    /// `other` by less than 2^23, `Less` if it precedes it, `Equal` if equal.
    /// Two PSNs exactly 2^23 apart compare as `Less` (the sign bit of the
    /// 24-bit difference is set).
    #[inline]
    pub const fn window_cmp(self, other: Psn) -> Ordering {
        let d = self.diff(other);
        if d > 0 {
            Ordering::Greater
        } else if d < 0 {
            Ordering::Less
        } else {
            Ordering::Equal
        }
    }

    /// `true` if `self` comes strictly before `other` (within the window).
    #[inline]
    pub const fn precedes(self, other: Psn) -> bool {
        self.diff(other) < 0
    }

    /// `true` if `self` comes strictly after `other` (within the window).
    #[inline]
    pub const fn follows(self, other: Psn) -> bool {
        self.diff(other) > 0
    }
}

impl fmt::Display for Psn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl core::ops::Add<u32> for Psn {
    type Output = Psn;
    /// Wrapping addition modulo 2^24.
    #[inline]
    fn add(self, rhs: u32) -> Psn {
        self.wrapping_add(rhs)
    }
}

impl core::ops::Sub<u32> for Psn {
    type Output = Psn;
    /// Wrapping subtraction modulo 2^24.
    #[inline]
    fn sub(self, rhs: u32) -> Psn {
        self.wrapping_sub(rhs)
    }
}

impl core::ops::AddAssign<u32> for Psn {
    #[inline]
    fn add_assign(&mut self, rhs: u32) {
        *self = self.wrapping_add(rhs);
    }
}

/// Queue pair number: 24 bits (`ROCEV2.md §1.5` DestQP, §1.6 DETH source QP).
/// QPN 0 and 1 are the special SMI/GSI QPs in IBTA; RoCE data QPs use ≥ 2.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Qpn(u32);

impl Qpn {
    /// The largest QPN, 0xFFFFFF.
    pub const MAX: Qpn = Qpn(U24_MASK);

    /// Creates a QPN from the low 24 bits of `value` (upper bits are dropped).
    #[inline]
    pub const fn new(value: u32) -> Self {
        Qpn(value & U24_MASK)
    }

    /// Creates a QPN, or `None` if `value` does not fit in 24 bits.
    #[inline]
    pub const fn new_checked(value: u32) -> Option<Self> {
        if value > U24_MASK {
            None
        } else {
            Some(Qpn(value))
        }
    }

    /// The 24-bit value.
    #[inline]
    pub const fn value(self) -> u32 {
        self.0
    }
}

impl fmt::Display for Qpn {
    /// Formats as Wireshark does: `0x` and six hex digits.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "0x{:06x}", self.0)
    }
}

/// Message sequence number carried in the AETH: 24 bits, wrapping
/// (`ROCEV2.md §4.3`). Comparison uses the same window rule as [`Psn`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Msn(u32);

impl Msn {
    /// MSN 0.
    pub const ZERO: Msn = Msn(0);

    /// Creates an MSN from the low 24 bits of `value` (upper bits are dropped).
    #[inline]
    pub const fn new(value: u32) -> Self {
        Msn(value & U24_MASK)
    }

    /// Creates an MSN, or `None` if `value` does not fit in 24 bits.
    #[inline]
    pub const fn new_checked(value: u32) -> Option<Self> {
        if value > U24_MASK {
            None
        } else {
            Some(Msn(value))
        }
    }

    /// The 24-bit value.
    #[inline]
    pub const fn value(self) -> u32 {
        self.0
    }

    /// `self + n` modulo 2^24.
    #[inline]
    #[must_use]
    pub const fn wrapping_add(self, n: u32) -> Self {
        Msn(self.0.wrapping_add(n) & U24_MASK)
    }

    /// Signed distance `self − other` (−2^23 ..= 2^23 − 1), as for [`Psn::diff`].
    #[inline]
    pub const fn diff(self, other: Msn) -> i32 {
        ((self.0.wrapping_sub(other.0) << 8) as i32) >> 8
    }
}

impl fmt::Display for Msn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn wrap_examples() {
        assert_eq!(Psn::MAX + 1, Psn::ZERO);
        assert_eq!(Psn::ZERO - 1, Psn::MAX);
        assert!(Psn::MAX.precedes(Psn::ZERO));
        assert!(Psn::ZERO.follows(Psn::MAX));
        assert_eq!(Psn::ZERO.diff(Psn::MAX), 1);
        assert_eq!(Psn::MAX.diff(Psn::ZERO), -1);
        assert_eq!(Psn::new(0x1_000_005), Psn::new(5));
        assert_eq!(Psn::new_checked(0x1_000_000), None);
        assert_eq!(Psn::MAX.distance_to(Psn::new(2)), 3);
        assert_eq!(Psn::new(10).window_cmp(Psn::new(10)), Ordering::Equal);
        assert_eq!(Qpn::new(0xAB_000012).value(), 0x12);
        assert_eq!(Msn::new(U24_MASK).wrapping_add(1), Msn::ZERO);
        assert_eq!(format!("{}", Qpn::new(0x12)), "0x000012");
    }

    proptest! {
        #[test]
        fn add_sub_roundtrip(a in 0u32..=U24_MASK, n in 0u32..=U24_MASK) {
            let p = Psn::new(a);
            prop_assert_eq!((p + n) - n, p);
            prop_assert_eq!(p.distance_to(p + n), n);
            prop_assert!((p + n).value() <= U24_MASK);
        }

        #[test]
        fn ordering_within_window(a in 0u32..=U24_MASK, n in 1u32..Psn::WINDOW) {
            let p = Psn::new(a);
            let q = p + n;
            prop_assert!(p.precedes(q));
            prop_assert!(q.follows(p));
            prop_assert!(!q.precedes(p));
            prop_assert_eq!(q.diff(p), n as i32);
            prop_assert_eq!(p.diff(q), -(n as i32));
            prop_assert_eq!(q.window_cmp(p), Ordering::Greater);
            prop_assert_eq!(p.window_cmp(q), Ordering::Less);
        }

        #[test]
        fn matches_reference_formula(a in 0u32..=U24_MASK, b in 0u32..=U24_MASK) {
            // ROCEV2.md §2.3: cmp(a,b) = (int32)((a - b) << 8)
            let reference = (a.wrapping_sub(b) << 8) as i32;
            let d = Psn::new(a).diff(Psn::new(b));
            prop_assert_eq!(d.signum(), reference.signum());
            prop_assert_eq!(d.wrapping_shl(8), reference);
        }

        #[test]
        fn antisymmetric(a in 0u32..=U24_MASK, b in 0u32..=U24_MASK) {
            let (p, q) = (Psn::new(a), Psn::new(b));
            if p.diff(q) != -(1 << 23) {
                prop_assert_eq!(p.diff(q), -q.diff(p));
            }
            prop_assert_eq!(p.precedes(q) as u8 + p.follows(q) as u8 + (p == q) as u8, 1);
        }
    }
}
