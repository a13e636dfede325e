//! Engine time: a monotonic instant in nanoseconds, supplied by the caller.
//!
//! The engine never reads a clock (sans-IO, see `docs/ARCHITECTURE.md`): the runner passes `now` into every
//! input and output call. Real drivers map `std::time::Instant` onto this type; the simulated link and the tests
//! advance a virtual clock. Durations are `core::time::Duration`.

use core::fmt;
use core::ops::{Add, AddAssign, Sub};
use core::time::Duration;

/// A point in engine time: nanoseconds since an arbitrary epoch chosen by the driver (`Instant::ZERO` in tests).
///
/// Instants passed to the engine must be monotonically non-decreasing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Instant {
    nanos: u64,
}

impl Instant {
    /// The epoch.
    pub const ZERO: Instant = Instant { nanos: 0 };
    /// The largest representable instant, used as "never".
    pub const MAX: Instant = Instant { nanos: u64::MAX };

    /// An instant `nanos` nanoseconds after the epoch.
    pub const fn from_nanos(nanos: u64) -> Self {
        Instant { nanos }
    }

    /// An instant `micros` microseconds after the epoch (saturating).
    pub const fn from_micros(micros: u64) -> Self {
        Instant {
            nanos: micros.saturating_mul(1_000),
        }
    }

    /// An instant `millis` milliseconds after the epoch (saturating).
    pub const fn from_millis(millis: u64) -> Self {
        Instant {
            nanos: millis.saturating_mul(1_000_000),
        }
    }

    /// Nanoseconds since the epoch.
    pub const fn as_nanos(self) -> u64 {
        self.nanos
    }

    /// Time elapsed from `earlier` to `self`; zero if `earlier` is later.
    pub fn saturating_duration_since(self, earlier: Instant) -> Duration {
        Duration::from_nanos(self.nanos.saturating_sub(earlier.nanos))
    }

    /// `self + d`, saturating at [`Instant::MAX`].
    pub fn saturating_add(self, d: Duration) -> Instant {
        let add = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        Instant {
            nanos: self.nanos.saturating_add(add),
        }
    }
}

impl Add<Duration> for Instant {
    type Output = Instant;
    /// Saturating addition (an instant never wraps).
    fn add(self, d: Duration) -> Instant {
        self.saturating_add(d)
    }
}

impl AddAssign<Duration> for Instant {
    fn add_assign(&mut self, d: Duration) {
        *self = self.saturating_add(d);
    }
}

impl Sub<Instant> for Instant {
    type Output = Duration;
    /// Saturating difference (zero when `rhs` is later).
    fn sub(self, rhs: Instant) -> Duration {
        self.saturating_duration_since(rhs)
    }
}

impl fmt::Display for Instant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}.{:09}s",
            self.nanos / 1_000_000_000,
            self.nanos % 1_000_000_000
        )
    }
}

/// The virtual-clock rule of the simulation harnesses (roce-proto's unit-test `Pair` and roce-tests' `Pair`, one
/// definition for both): when nothing is left to do at `now`, time moves to the earliest pending event
/// (`next_event`: engine `poll_timeout`, frames in flight) — but never past `horizon`, the end of the time the caller
/// asked to let pass. So a run "for 5 ms" ends by 5 ms with every event due by then handled, and a timer due later
/// neither fires nor is jumped over: the test sees the state before it, and the next run fires it on time.
///
/// When nothing at all is pending, the clock moves to the horizon if `idle_passes_time` (a real-time step: the
/// caller lets that much time pass whatever happens), and stays otherwise (the caller runs "until idle").
///
/// Returns the instant to move to, or `None` when the clock stays: idle without a horizon (or without
/// `idle_passes_time`), the horizon reached, or the next event not later than `now`.
pub fn next_virtual_instant(
    now: Instant,
    next_event: Option<Instant>,
    horizon: Option<Instant>,
    idle_passes_time: bool,
) -> Option<Instant> {
    let to = match (next_event, horizon) {
        (Some(t), Some(h)) => t.min(h),
        (Some(t), None) => t,
        (None, Some(h)) if idle_passes_time => h,
        (None, _) => return None,
    };
    (to > now).then_some(to)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn virtual_clock_never_passes_the_horizon() {
        let t = Instant::from_micros;
        for idle in [false, true] {
            let n = |now, next, h| next_virtual_instant(now, next, h, idle);
            assert_eq!(n(t(1), Some(t(5)), None), Some(t(5)));
            assert_eq!(n(t(1), Some(t(5)), Some(t(3))), Some(t(3)));
            assert_eq!(n(t(1), Some(t(2)), Some(t(3))), Some(t(2)));
            assert_eq!(n(t(3), Some(t(9)), Some(t(3))), None);
            assert_eq!(n(t(3), None, None), None);
            assert_eq!(n(t(3), Some(t(3)), None), None);
        }
        assert_eq!(
            next_virtual_instant(t(1), None, Some(t(3)), true),
            Some(t(3))
        );
        assert_eq!(next_virtual_instant(t(1), None, Some(t(3)), false), None);
    }

    #[test]
    fn arithmetic_saturates() {
        let t = Instant::from_micros(5);
        assert_eq!(t.as_nanos(), 5_000);
        assert_eq!((t + Duration::from_nanos(7)).as_nanos(), 5_007);
        assert_eq!(Instant::MAX + Duration::from_secs(1), Instant::MAX);
        assert_eq!(Instant::ZERO - t, Duration::ZERO);
        assert_eq!(t - Instant::ZERO, Duration::from_micros(5));
        assert_eq!(format!("{}", Instant::from_millis(1500)), "1.500000000s");
    }
}
