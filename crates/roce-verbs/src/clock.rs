//! The runtime clock: maps `std::time::Instant` onto the engine's [`roce_proto::time::Instant`] (nanoseconds since
//! a process-wide origin taken at first use), so every runtime and link in the process shares one time base
//! (`STYLE.md` D2).

use std::sync::OnceLock;

use roce_proto::Instant;

static ORIGIN: OnceLock<std::time::Instant> = OnceLock::new();

/// A monotonic clock in engine time. Cheap to copy.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    origin: std::time::Instant,
}

impl Default for Clock {
    fn default() -> Self {
        Clock::new()
    }
}

impl Clock {
    /// The process-wide clock.
    pub fn new() -> Clock {
        Clock {
            origin: *ORIGIN.get_or_init(std::time::Instant::now),
        }
    }

    /// Now, in engine time (ns since the origin; saturates after ~584 years).
    pub fn now(&self) -> Instant {
        Instant::from_nanos(u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX))
    }

    /// The std instant of an engine instant.
    pub fn to_std(&self, t: Instant) -> std::time::Instant {
        self.origin + std::time::Duration::from_nanos(t.as_nanos())
    }
}
