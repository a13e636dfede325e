//! `--stats` for the UDP backend: the [`UdpLink`] counters (ICRC failures, oversize datagrams, ...) live on the
//! engine thread, inside the link the runtime owns. [`UdpTap`] wraps the link and mirrors its [`UdpStats`] into a
//! [`SharedUdpStats`] the application thread can read. The mirror is refreshed after a receive burst or a flush
//! only when a counter changed (one compare of the counters per call, relaxed stores; no lock, no allocation).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use roce_link::{Instant, Link, LinkCaps, LinkError, UdpLink, UdpStats};

/// A copy of a [`UdpLink`]'s counters, readable from any thread (values may lag by one burst).
#[derive(Debug, Default)]
pub struct SharedUdpStats {
    values: [AtomicU64; 16],
}

impl SharedUdpStats {
    /// `(name, value)` pairs, named as the [`UdpStats`] fields.
    pub fn iter(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        UdpStats::NAMES
            .iter()
            .zip(&self.values)
            .map(|(n, v)| (*n, v.load(Ordering::Relaxed)))
    }
}

/// A [`UdpLink`] that publishes its counters to a [`SharedUdpStats`].
pub struct UdpTap {
    link: UdpLink,
    shared: Arc<SharedUdpStats>,
    last: UdpStats,
}

impl UdpTap {
    /// Wraps `link`; its counters appear in `shared`.
    pub fn new(link: UdpLink, shared: Arc<SharedUdpStats>) -> UdpTap {
        let mut t = UdpTap {
            link,
            shared,
            last: UdpStats::default(),
        };
        t.publish(true);
        t
    }

    fn publish(&mut self, force: bool) {
        let s = self.link.stats();
        if force || s != self.last {
            for (dst, v) in self.shared.values.iter().zip(s.values()) {
                dst.store(v, Ordering::Relaxed);
            }
            self.last = s;
        }
    }
}

impl Link for UdpTap {
    fn caps(&self) -> LinkCaps {
        self.link.caps()
    }
    fn rx_burst(
        &mut self,
        now: Instant,
        max: usize,
        sink: &mut dyn FnMut(&mut [u8]),
    ) -> Result<usize, LinkError> {
        let r = self.link.rx_burst(now, max, sink);
        self.publish(false);
        r
    }
    fn tx_buf(&mut self, now: Instant) -> Result<&mut [u8], LinkError> {
        self.link.tx_buf(now)
    }
    fn tx_commit(&mut self, now: Instant, len: usize) -> Result<(), LinkError> {
        self.link.tx_commit(now, len)
    }
    fn flush(&mut self, now: Instant) -> Result<(), LinkError> {
        let r = self.link.flush(now);
        self.publish(false);
        r
    }
    fn counters(&self, f: &mut dyn FnMut(&'static str, u64)) {
        self.link.counters(f)
    }
    fn poll_at(&self) -> Option<Instant> {
        self.link.poll_at()
    }
    fn wait_fd(&self) -> Option<std::os::fd::RawFd> {
        self.link.wait_fd()
    }
}
