//! A deterministic, seeded, in-memory Ethernet segment connecting N ports on a virtual clock.
//!
//! Model (smoltcp `tests/netsim.rs` style, `STYLE.md` T5): every port has one egress serialiser. A frame
//! committed at `now` starts serialising at `max(now, egress busy until)`, takes
//! `(max(len, 60) + per_frame_overhead) · 8 / bandwidth` (preamble, FCS and inter-frame gap are the overhead),
//! then travels `propagation + U[0, jitter]` and becomes deliverable at its destination port at that arrival
//! instant. An egress queue holding `queue_limit` frames (the one serialising included) drops further frames
//! (drop-tail, counted). Frames are switched by destination MAC; group addresses go to every other port;
//! unknown unicast addresses are dropped and counted.
//!
//! Delivery is arrival-ordered: each port keeps a `BinaryHeap` on `(arrival, sequence)`. With `fifo` set
//! (default) arrivals from one egress never overtake each other (jitter only delays); without it jitter can
//! reorder. [`SimNet::next_event`] / [`Link::poll_at`] report the next arrival so a driver can advance virtual
//! time to `min(engine timeouts, next arrival)`.
//!
//! Ports share the medium through `Arc<Mutex<…>>`, so a port is `Send` (a runtime may drive it from whichever thread
//! holds its progress lock); virtual time still has one driver at a time, and the mutex is uncontended then.

use std::cmp::{Ordering, Reverse};
use std::collections::{BinaryHeap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::pool::FramePool;
use crate::{IcrcCaps, Instant, Link, LinkCaps, LinkError};

/// Most frames per port the segment's queues and frame pool are sized for when a port is added.
const PREALLOC_FRAMES: usize = 1024;

/// Ethernet minimum frame length without FCS (short frames are padded by the MAC).
const ETH_MIN_FRAME: usize = 60;

/// Parameters of a simulated segment.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SimConfig {
    /// Line rate of every egress port in bits per second; 0 = infinite (no serialisation delay, no queuing).
    pub bandwidth_bps: u64,
    /// Bytes added to every frame for serialisation: preamble+SFD 8, FCS 4, inter-frame gap 12 = 24.
    pub per_frame_overhead: usize,
    /// One-way propagation delay.
    pub propagation: Duration,
    /// Extra delay drawn uniformly from `[0, jitter]` per frame.
    pub jitter: Duration,
    /// Keep frames of one egress port in order despite jitter.
    pub fifo: bool,
    /// Frames an egress queue holds (including the one being serialised) before dropping (drop-tail).
    pub queue_limit: usize,
    /// Largest frame in bytes, including the Ethernet header, excluding the FCS.
    pub mtu: usize,
    /// Seed of the jitter RNG.
    pub seed: u64,
}

impl Default for SimConfig {
    /// 100 Gb/s, 1 µs propagation, no jitter, FIFO, 1024-frame queues, 9014-byte MTU (jumbo payload + header).
    fn default() -> Self {
        SimConfig {
            bandwidth_bps: 100_000_000_000,
            per_frame_overhead: 24,
            propagation: Duration::from_micros(1),
            jitter: Duration::ZERO,
            fifo: true,
            queue_limit: 1024,
            mtu: 9014,
            seed: 0,
        }
    }
}

/// Counters of one simulated port.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SimStats {
    /// Frames accepted for transmission.
    pub tx_frames: u64,
    /// Bytes accepted for transmission.
    pub tx_bytes: u64,
    /// Frames delivered to this port's receiver.
    pub rx_frames: u64,
    /// Bytes delivered to this port's receiver.
    pub rx_bytes: u64,
    /// Frames dropped because the egress queue was full.
    pub drops_queue_full: u64,
    /// Frames dropped because no port has their destination MAC, or shorter than an Ethernet header.
    pub drops_unroutable: u64,
}

struct Arrival {
    at: Instant,
    seq: u64,
    frame: Vec<u8>,
}

impl PartialEq for Arrival {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.seq) == (o.at, o.seq)
    }
}
impl Eq for Arrival {}
impl PartialOrd for Arrival {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Arrival {
    fn cmp(&self, o: &Self) -> Ordering {
        (self.at, self.seq).cmp(&(o.at, o.seq))
    }
}

struct PortState {
    mac: [u8; 6],
    busy_until: Instant,
    /// Serialisation finish instants of frames still in the egress queue.
    egress: VecDeque<Instant>,
    last_arrival: Instant,
    rx: BinaryHeap<Reverse<Arrival>>,
    stats: SimStats,
}

struct Core {
    cfg: SimConfig,
    ports: Vec<PortState>,
    pool: FramePool,
    rng: ChaCha8Rng,
    seq: u64,
}

impl Core {
    fn ser_time(&self, len: usize) -> Duration {
        if self.cfg.bandwidth_bps == 0 {
            return Duration::ZERO;
        }
        let bits = (len.max(ETH_MIN_FRAME) + self.cfg.per_frame_overhead) as u128 * 8;
        let ns = bits * 1_000_000_000 / u128::from(self.cfg.bandwidth_bps);
        Duration::from_nanos(u64::try_from(ns).unwrap_or(u64::MAX))
    }

    fn send(&mut self, src: usize, now: Instant, frame: &[u8]) {
        if frame.len() < 14 {
            self.ports[src].stats.drops_unroutable += 1;
            return;
        }
        let ser = self.ser_time(frame.len());
        let limit = self.cfg.queue_limit.max(1);
        let port = &mut self.ports[src];
        while port.egress.front().is_some_and(|&t| t <= now) {
            port.egress.pop_front();
        }
        if port.egress.len() >= limit {
            port.stats.drops_queue_full += 1;
            return;
        }
        let start = now.max(port.busy_until);
        let finish = start + ser;
        if ser > Duration::ZERO {
            port.busy_until = finish;
            port.egress.push_back(finish);
        }
        port.stats.tx_frames += 1;
        port.stats.tx_bytes += frame.len() as u64;
        let jitter_ns = u64::try_from(self.cfg.jitter.as_nanos()).unwrap_or(u64::MAX);
        let jitter = if jitter_ns == 0 {
            0
        } else {
            self.rng.random_range(0..=jitter_ns)
        };
        let mut at = finish + self.cfg.propagation + Duration::from_nanos(jitter);
        if self.cfg.fifo {
            at = at.max(self.ports[src].last_arrival);
        }
        self.ports[src].last_arrival = at;

        let dst_mac: [u8; 6] = [frame[0], frame[1], frame[2], frame[3], frame[4], frame[5]];
        let group = dst_mac[0] & 1 == 1;
        let mut delivered = false;
        for d in 0..self.ports.len() {
            if d == src || !(group || self.ports[d].mac == dst_mac) {
                continue;
            }
            let buf = self.pool.copy_of(frame);
            self.seq += 1;
            self.ports[d].rx.push(Reverse(Arrival {
                at,
                seq: self.seq,
                frame: buf,
            }));
            delivered = true;
        }
        if !delivered {
            self.ports[src].stats.drops_unroutable += 1;
        }
    }
}

/// The shared medium. Cheap to clone (a handle).
#[derive(Clone)]
pub struct SimNet {
    core: Arc<Mutex<Core>>,
}

/// Locks the medium (a panic while it was held leaves plain data behind: keep going).
fn lock(core: &Mutex<Core>) -> MutexGuard<'_, Core> {
    core.lock().unwrap_or_else(|p| p.into_inner())
}

impl core::fmt::Debug for SimNet {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let c = lock(&self.core);
        f.debug_struct("SimNet")
            .field("cfg", &c.cfg)
            .field("ports", &c.ports.len())
            .finish()
    }
}

impl SimNet {
    /// An empty segment.
    pub fn new(cfg: SimConfig) -> SimNet {
        let core = Core {
            cfg,
            ports: Vec::new(),
            pool: FramePool::with_frame_cap(cfg.mtu),
            rng: ChaCha8Rng::seed_from_u64(cfg.seed),
            seq: 0,
        };
        SimNet {
            core: Arc::new(Mutex::new(core)),
        }
    }

    /// Two ports with the given MAC addresses on a new segment.
    pub fn pair(cfg: SimConfig, mac_a: [u8; 6], mac_b: [u8; 6]) -> (SimNet, SimPort, SimPort) {
        let net = SimNet::new(cfg);
        let a = net.add_port(mac_a);
        let b = net.add_port(mac_b);
        (net, a, b)
    }

    /// Attaches a port with station address `mac`.
    pub fn add_port(&self, mac: [u8; 6]) -> SimPort {
        let mut c = lock(&self.core);
        let mtu = c.cfg.mtu;
        // The port's queues and the segment's frame pool are sized up front for `queue_limit` frames (at most
        // PREALLOC_FRAMES), so a workload whose frames in flight stay within that never makes the segment allocate,
        // whatever the threads' timing: a new high-water mark reached only under load would otherwise grow them
        // mid-run. Beyond it they still grow (a starved receiver is not a drop on this medium).
        let pre = c.cfg.queue_limit.clamp(1, PREALLOC_FRAMES);
        c.pool.reserve(pre);
        c.ports.push(PortState {
            mac,
            busy_until: Instant::ZERO,
            egress: VecDeque::with_capacity(pre),
            last_arrival: Instant::ZERO,
            rx: BinaryHeap::with_capacity(pre),
            stats: SimStats::default(),
        });
        SimPort {
            core: Arc::clone(&self.core),
            id: c.ports.len() - 1,
            staging: vec![0; mtu],
            staged: false,
        }
    }

    /// The segment's configuration.
    pub fn config(&self) -> SimConfig {
        lock(&self.core).cfg
    }

    /// The earliest arrival at any port.
    pub fn next_event(&self) -> Option<Instant> {
        let c = lock(&self.core);
        c.ports
            .iter()
            .filter_map(|p| p.rx.peek().map(|a| a.0.at))
            .min()
    }

    /// Frames in flight (not yet received) over all ports.
    pub fn in_flight(&self) -> usize {
        lock(&self.core).ports.iter().map(|p| p.rx.len()).sum()
    }

    /// Counters of port `id` (ports are numbered in creation order from 0).
    pub fn stats(&self, id: usize) -> Option<SimStats> {
        lock(&self.core).ports.get(id).map(|p| p.stats)
    }
}

/// One station on a [`SimNet`]; implements [`Link`].
pub struct SimPort {
    core: Arc<Mutex<Core>>,
    id: usize,
    staging: Vec<u8>,
    staged: bool,
}

impl core::fmt::Debug for SimPort {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("SimPort")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

impl SimPort {
    /// Index of this port on its segment.
    pub fn id(&self) -> usize {
        self.id
    }

    /// Counters of this port.
    pub fn stats(&self) -> SimStats {
        lock(&self.core).ports[self.id].stats
    }
}

impl Link for SimPort {
    fn caps(&self) -> LinkCaps {
        LinkCaps {
            mtu: self.staging.len(),
            max_burst: 64,
            icrc: IcrcCaps::default(),
            first_qpn: None,
        }
    }

    fn rx_burst(
        &mut self,
        now: Instant,
        max: usize,
        sink: &mut dyn FnMut(&mut [u8]),
    ) -> Result<usize, LinkError> {
        let mut n = 0;
        while n < max {
            let frame = {
                let mut c = lock(&self.core);
                let port = &mut c.ports[self.id];
                match port.rx.peek() {
                    Some(Reverse(a)) if a.at <= now => {}
                    _ => break,
                }
                let Some(Reverse(a)) = port.rx.pop() else {
                    break;
                };
                port.stats.rx_frames += 1;
                port.stats.rx_bytes += a.frame.len() as u64;
                a.frame
            };
            let mut frame = frame;
            sink(&mut frame);
            lock(&self.core).pool.put(frame);
            n += 1;
        }
        Ok(n)
    }

    fn tx_buf(&mut self, _now: Instant) -> Result<&mut [u8], LinkError> {
        self.staged = true;
        Ok(&mut self.staging)
    }

    fn tx_commit(&mut self, now: Instant, len: usize) -> Result<(), LinkError> {
        if !self.staged {
            return Err(LinkError::NoTxBuffer);
        }
        let Some(frame) = self.staging.get(..len) else {
            return Err(LinkError::TooLong {
                len,
                mtu: self.staging.len(),
            });
        };
        self.staged = false;
        lock(&self.core).send(self.id, now, frame);
        Ok(())
    }

    fn flush(&mut self, _now: Instant) -> Result<(), LinkError> {
        self.staged = false;
        Ok(())
    }

    fn poll_at(&self) -> Option<Instant> {
        lock(&self.core).ports[self.id].rx.peek().map(|a| a.0.at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: [u8; 6] = [2, 0, 0, 0, 0, 1];
    const B: [u8; 6] = [2, 0, 0, 0, 0, 2];

    fn frame(dst: [u8; 6], tag: u8, len: usize) -> Vec<u8> {
        let mut f = vec![tag; len];
        f[..6].copy_from_slice(&dst);
        f
    }

    fn drain(p: &mut SimPort, now: Instant) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        p.rx_burst(now, usize::MAX, &mut |f| out.push(f.to_vec()))
            .unwrap();
        out
    }

    #[test]
    fn serialisation_and_propagation_delay() {
        // 1 Gb/s: a 1000-byte frame + 24 overhead = 8192 ns on the wire, + 1 µs propagation.
        let cfg = SimConfig {
            bandwidth_bps: 1_000_000_000,
            ..SimConfig::default()
        };
        let (net, mut a, mut b) = SimNet::pair(cfg, A, B);
        a.transmit(Instant::ZERO, &frame(B, 1, 1000)).unwrap();
        a.transmit(Instant::ZERO, &frame(B, 2, 1000)).unwrap();
        assert_eq!(net.next_event(), Some(Instant::from_nanos(8192 + 1000)));
        assert!(drain(&mut b, Instant::from_nanos(9191)).is_empty());
        assert_eq!(drain(&mut b, Instant::from_nanos(9192))[0][6], 1);
        // The second waits behind the first on the serialiser.
        assert_eq!(b.poll_at(), Some(Instant::from_nanos(2 * 8192 + 1000)));
        assert_eq!(drain(&mut b, Instant::from_millis(1)).len(), 1);
        assert_eq!(a.stats().tx_frames, 2);
        assert_eq!(b.stats().rx_frames, 2);
        assert!(drain(&mut a, Instant::from_millis(1)).is_empty());
    }

    #[test]
    fn drop_tail_queue_is_counted() {
        let cfg = SimConfig {
            bandwidth_bps: 1_000_000_000,
            queue_limit: 4,
            ..SimConfig::default()
        };
        let (_net, mut a, mut b) = SimNet::pair(cfg, A, B);
        for i in 0..10 {
            a.transmit(Instant::ZERO, &frame(B, i, 500)).unwrap();
        }
        assert_eq!(a.stats().drops_queue_full, 6);
        let got = drain(&mut b, Instant::from_millis(1));
        assert_eq!(
            got.iter().map(|f| f[6]).collect::<Vec<_>>(),
            vec![0, 1, 2, 3]
        );
        // Once the queue drained, frames are accepted again.
        a.transmit(Instant::from_millis(1), &frame(B, 9, 500))
            .unwrap();
        assert_eq!(a.stats().drops_queue_full, 6);
    }

    #[test]
    fn jitter_is_deterministic_and_fifo_keeps_order() {
        let run = |fifo: bool| {
            let cfg = SimConfig {
                jitter: Duration::from_micros(5),
                fifo,
                seed: 7,
                ..SimConfig::default()
            };
            let (_net, mut a, mut b) = SimNet::pair(cfg, A, B);
            for i in 0..200u8 {
                a.transmit(Instant::from_nanos(u64::from(i) * 10), &frame(B, i, 64))
                    .unwrap();
            }
            drain(&mut b, Instant::from_millis(1))
                .iter()
                .map(|f| f[6])
                .collect::<Vec<u8>>()
        };
        let in_order: Vec<u8> = (0..200).collect();
        assert_eq!(run(true), in_order);
        let shuffled = run(false);
        assert_ne!(
            shuffled, in_order,
            "5 µs jitter on 10 ns spacing must reorder"
        );
        assert_eq!(shuffled, run(false), "same seed, same order");
        let mut sorted = shuffled.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, in_order);
    }

    #[test]
    fn switching_by_mac() {
        let net = SimNet::new(SimConfig {
            bandwidth_bps: 0,
            ..SimConfig::default()
        });
        let mut a = net.add_port(A);
        let mut b = net.add_port(B);
        let mut c = net.add_port([2, 0, 0, 0, 0, 3]);
        a.transmit(Instant::ZERO, &frame(B, 1, 64)).unwrap();
        a.transmit(Instant::ZERO, &frame([0xff; 6], 2, 64)).unwrap();
        a.transmit(Instant::ZERO, &frame([2, 9, 9, 9, 9, 9], 3, 64))
            .unwrap();
        a.transmit(Instant::ZERO, &[1, 2, 3]).unwrap();
        assert_eq!(net.in_flight(), 3);
        let t = Instant::from_micros(1);
        assert_eq!(
            drain(&mut b, t).iter().map(|f| f[6]).collect::<Vec<_>>(),
            vec![1, 2]
        );
        assert_eq!(
            drain(&mut c, t).iter().map(|f| f[6]).collect::<Vec<_>>(),
            vec![2]
        );
        assert_eq!(a.stats().drops_unroutable, 2);
        assert_eq!(net.next_event(), None);
    }

    #[test]
    fn tx_buf_contract() {
        let (_net, mut a, mut b) = SimNet::pair(SimConfig::default(), A, B);
        assert!(matches!(
            a.tx_commit(Instant::ZERO, 10),
            Err(LinkError::NoTxBuffer)
        ));
        a.tx_buf(Instant::ZERO).unwrap()[..64].copy_from_slice(&frame(B, 5, 64));
        // Re-borrow: same contents.
        assert_eq!(a.tx_buf(Instant::ZERO).unwrap()[6], 5);
        let mtu = a.caps().mtu;
        assert!(matches!(
            a.tx_commit(Instant::ZERO, mtu + 1),
            Err(LinkError::TooLong { .. })
        ));
        a.tx_commit(Instant::ZERO, 64).unwrap();
        assert!(a.transmit(Instant::ZERO, &vec![0; mtu + 1]).is_err());
        assert_eq!(drain(&mut b, Instant::from_millis(1)).len(), 1);
    }
}
