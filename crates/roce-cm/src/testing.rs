//! A deterministic two-CM harness: two [`Cm`] instances exchange MAD bytes
//! through an in-memory channel that loses, duplicates, delays and reorders
//! them (seeded), on a virtual clock. For the crate's own scenario tests and
//! for the runtimes built on it.

use core::time::Duration;

use roce_proto::time::Instant;
use roce_wire::mad::MAD_LEN;

use crate::{Cm, Event, Peer};

/// One end of the [`Pair`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The first CM (`Pair::a`).
    A,
    /// The second CM (`Pair::b`).
    B,
}

/// How the channel mistreats MADs: probabilities in parts per million, and a
/// delay drawn uniformly from `min_delay..=max_delay` per copy (different
/// delays reorder).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChannelConfig {
    /// Loss probability (ppm).
    pub loss_ppm: u32,
    /// Probability that a MAD is delivered twice (ppm).
    pub dup_ppm: u32,
    /// Shortest one-way delay.
    pub min_delay: Duration,
    /// Longest one-way delay.
    pub max_delay: Duration,
    /// Seed.
    pub seed: u64,
}

impl Default for ChannelConfig {
    fn default() -> Self {
        ChannelConfig {
            loss_ppm: 0,
            dup_ppm: 0,
            min_delay: Duration::from_micros(10),
            max_delay: Duration::from_micros(10),
            seed: 1,
        }
    }
}

#[derive(Debug, Clone)]
struct InFlight {
    at: Instant,
    seq: u64,
    to: Side,
    from: Peer,
    bytes: [u8; MAD_LEN],
}

/// Two CMs and the channel between them.
#[derive(Debug)]
pub struct Pair {
    /// CM A, reachable at `a_peer`.
    pub a: Cm,
    /// CM B, reachable at `b_peer`.
    pub b: Cm,
    /// A's address as B sees it.
    pub a_peer: Peer,
    /// B's address as A sees it.
    pub b_peer: Peer,
    /// The virtual clock.
    pub now: Instant,
    /// Every event each side produced, in order, with its time.
    pub log: Vec<(Instant, Side, Event)>,
    /// MADs put on the channel, lost, and delivered.
    pub sent: u64,
    /// MADs the channel lost.
    pub lost: u64,
    /// MADs the channel delivered (duplicates included).
    pub delivered: u64,
    /// Every MAD put on the channel (before loss), with the time and the
    /// sending side: what a capture at the senders would show.
    pub capture: Vec<(Instant, Side, [u8; MAD_LEN])>,
    chan: ChannelConfig,
    rng: u64,
    seq: u64,
    flight: Vec<InFlight>,
}

fn splitmix(s: &mut u64) -> u64 {
    *s = s.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *s;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl Pair {
    /// A pair of CMs at `a_peer` / `b_peer` over a channel.
    pub fn new(a: Cm, a_peer: Peer, b: Cm, b_peer: Peer, chan: ChannelConfig) -> Self {
        Pair {
            a,
            b,
            a_peer,
            b_peer,
            now: Instant::ZERO,
            log: Vec::new(),
            sent: 0,
            lost: 0,
            delivered: 0,
            capture: Vec::new(),
            rng: chan.seed,
            chan,
            seq: 0,
            flight: Vec::new(),
        }
    }

    /// The CM of `side`.
    pub fn cm(&mut self, side: Side) -> &mut Cm {
        match side {
            Side::A => &mut self.a,
            Side::B => &mut self.b,
        }
    }

    /// Injects raw bytes as if `from` had sent them to `to` (hostile tests).
    pub fn inject(&mut self, to: Side, from: Peer, bytes: &[u8]) {
        let now = self.now;
        self.cm(to).handle_mad(now, from, bytes);
    }

    fn chance(&mut self, ppm: u32) -> bool {
        (splitmix(&mut self.rng) % 1_000_000) < u64::from(ppm)
    }

    fn delay(&mut self) -> Duration {
        let lo = self.chan.min_delay.as_nanos() as u64;
        let hi = self.chan.max_delay.as_nanos() as u64;
        let span = hi.saturating_sub(lo);
        let extra = if span == 0 {
            0
        } else {
            splitmix(&mut self.rng) % (span + 1)
        };
        Duration::from_nanos(lo + extra)
    }

    /// Moves every queued MAD of both CMs onto the channel.
    fn drain_tx(&mut self) {
        for side in [Side::A, Side::B] {
            let (from, to) = match side {
                Side::A => (self.a_peer, Side::B),
                Side::B => (self.b_peer, Side::A),
            };
            let mut buf = [0u8; MAD_LEN];
            while let Some(t) = self.cm(side).poll_transmit(&mut buf) {
                self.sent += 1;
                self.capture.push((self.now, side, buf));
                if self.chance(self.chan.loss_ppm) {
                    self.lost += 1;
                    continue;
                }
                let copies = if self.chance(self.chan.dup_ppm) { 2 } else { 1 };
                for _ in 0..copies {
                    let at = self.now + self.delay();
                    self.seq += 1;
                    self.flight.push(InFlight {
                        at,
                        seq: self.seq,
                        to,
                        from,
                        bytes: buf,
                    });
                }
                let _ = t;
            }
        }
    }

    /// Drains the events of both CMs into the log, calling `app` on each (the
    /// application's policy: it may issue commands on the CM it is given).
    fn drain_events(&mut self, app: &mut impl FnMut(Side, &mut Cm, Instant, &Event)) {
        loop {
            let mut any = false;
            for side in [Side::A, Side::B] {
                let now = self.now;
                while let Some(ev) = self.cm(side).poll_event() {
                    any = true;
                    app(side, self.cm(side), now, &ev);
                    self.log.push((now, side, ev));
                }
            }
            if !any {
                break;
            }
        }
    }

    /// Runs until nothing is in flight and no timer is pending, or until
    /// `limit` of virtual time; returns the number of steps taken.
    pub fn run(
        &mut self,
        limit: Instant,
        mut app: impl FnMut(Side, &mut Cm, Instant, &Event),
    ) -> usize {
        let mut steps = 0;
        loop {
            self.drain_events(&mut app);
            self.drain_tx();
            let next_flight = self.flight.iter().map(|f| (f.at, f.seq)).min();
            let next_timer = [self.a.poll_timeout(), self.b.poll_timeout()]
                .into_iter()
                .flatten()
                .min();
            let next = match (next_flight.map(|f| f.0), next_timer) {
                (Some(f), Some(t)) => f.min(t),
                (Some(f), None) => f,
                (None, Some(t)) => t,
                (None, None) => return steps,
            };
            if next > limit {
                return steps;
            }
            steps += 1;
            if next > self.now {
                self.now = next;
            }
            // Deliver one due MAD (the earliest) or fire the timers.
            if let Some((at, seq)) = next_flight
                && at <= self.now
            {
                let i = self
                    .flight
                    .iter()
                    .position(|f| f.seq == seq)
                    .expect("present");
                let f = self.flight.swap_remove(i);
                self.delivered += 1;
                let now = self.now;
                self.cm(f.to).handle_mad(now, f.from, &f.bytes);
                continue;
            }
            let now = self.now;
            self.a.handle_timeout(now);
            self.b.handle_timeout(now);
        }
    }

    /// The events of `side` in the log.
    pub fn events(&self, side: Side) -> impl Iterator<Item = &Event> {
        self.log
            .iter()
            .filter(move |(_, s, _)| *s == side)
            .map(|(_, _, e)| e)
    }
}
