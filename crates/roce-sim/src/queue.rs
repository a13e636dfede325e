//! The simulator's event queue: pending events in a total order by (virtual instant in ns, insertion sequence), so
//! two events of one instant run in the order they were scheduled and a run is a pure function of its scenario.
//!
//! The order is exactly that of a binary heap keyed on (instant, sequence) — the simulator's queue before this one —
//! but most events are due within a few µs (a frame's serialisation, 0.2 µs at 40 Gb/s; a link's propagation, 1 µs),
//! so those live in a timing wheel of [`WHEEL_NS`] one-ns slots covering [now, now + `WHEEL_NS`): push is O(1), pop
//! finds the next non-empty slot in a bitmap. Each slot is a FIFO list; every entry in it has the same instant (the
//! window is shorter than the wheel) and was pushed in sequence order, so the list is already sorted. Events further
//! out (shaper departures of slow flows, the DCQCN timers, retransmission timeouts, bins) go to a binary heap that is
//! never merged into the wheel: a pop takes the smaller of the two heads. The wheel is 4 µs (32 KiB of slot heads):
//! a 65-µs wheel that also held the 55-µs DCQCN timers spent more on cache misses in its 512 KiB of slots than it
//! saved on the heap (64:1 incast profile, 2026-12-03).

use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// Slots of the wheel (one per ns): events due less than this many ns ahead of the last popped instant.
pub const WHEEL_NS: u64 = 1 << 12;
const MASK: u64 = WHEEL_NS - 1;
const WORDS: usize = (WHEEL_NS / 64) as usize;
const NIL: u32 = u32::MAX;

/// A pending event: due at `at` ns, the `seq`-th pushed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry<E> {
    /// Due instant, ns.
    pub at: u64,
    /// Insertion sequence (1, 2, …): the tie-break among events of one instant.
    pub seq: u64,
    /// The event.
    pub ev: E,
}

/// A heap entry ordered by (at, seq) only.
struct Far<E>(Entry<E>);

impl<E> PartialEq for Far<E> {
    fn eq(&self, o: &Self) -> bool {
        (self.0.at, self.0.seq) == (o.0.at, o.0.seq)
    }
}
impl<E> Eq for Far<E> {}
impl<E> PartialOrd for Far<E> {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl<E> Ord for Far<E> {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (self.0.at, self.0.seq).cmp(&(o.0.at, o.0.seq))
    }
}

struct Node<E> {
    entry: Entry<E>,
    next: u32,
}

/// The queue. Events must not be due before the last popped instant (the simulator never schedules into the past);
/// one that is goes to the heap and still pops first, as a binary heap would pop it.
pub struct EventQueue<E: Copy> {
    /// Per slot: first and last node of its FIFO (`NIL` when empty).
    slots: Vec<(u32, u32)>,
    /// Bit per slot: non-empty.
    bits: Vec<u64>,
    nodes: Vec<Node<E>>,
    /// Free-list head in `nodes`.
    free: u32,
    /// Entries in the wheel.
    in_wheel: usize,
    /// The last popped instant: every wheel entry is due in [base, base + WHEEL_NS).
    base: u64,
    far: BinaryHeap<Reverse<Far<E>>>,
    seq: u64,
}

impl<E: Copy> Default for EventQueue<E> {
    fn default() -> Self {
        Self::new()
    }
}

impl<E: Copy> EventQueue<E> {
    /// An empty queue at instant 0.
    pub fn new() -> Self {
        EventQueue {
            slots: vec![(NIL, NIL); WHEEL_NS as usize],
            bits: vec![0; WORDS],
            nodes: Vec::new(),
            free: NIL,
            in_wheel: 0,
            base: 0,
            far: BinaryHeap::new(),
            seq: 0,
        }
    }

    /// Pending events.
    pub fn len(&self) -> usize {
        self.in_wheel + self.far.len()
    }

    /// No pending event.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Schedules `ev` at `at` ns, after every event already scheduled for that instant.
    pub fn push(&mut self, at: u64, ev: E) {
        self.seq += 1;
        let entry = Entry {
            at,
            seq: self.seq,
            ev,
        };
        if at < self.base || at - self.base >= WHEEL_NS {
            self.far.push(Reverse(Far(entry)));
            return;
        }
        let node = Node { entry, next: NIL };
        let n = if self.free != NIL {
            let n = self.free;
            self.free = self.nodes[n as usize].next;
            self.nodes[n as usize] = node;
            n
        } else {
            self.nodes.push(node);
            (self.nodes.len() - 1) as u32
        };
        let s = (at & MASK) as usize;
        let (head, tail) = self.slots[s];
        if head == NIL {
            self.slots[s] = (n, n);
            self.bits[s / 64] |= 1 << (s % 64);
        } else {
            self.nodes[tail as usize].next = n;
            self.slots[s].1 = n;
        }
        self.in_wheel += 1;
    }

    /// The wheel's first non-empty slot (the earliest instant in the wheel).
    fn first_slot(&self) -> Option<usize> {
        if self.in_wheel == 0 {
            return None;
        }
        let start = (self.base & MASK) as usize;
        let (w0, b0) = (start / 64, start % 64);
        let first = self.bits[w0] & (!0u64 << b0);
        if first != 0 {
            return Some(w0 * 64 + first.trailing_zeros() as usize);
        }
        for k in 1..=WORDS {
            let w = (w0 + k) % WORDS;
            let word = if w == w0 {
                // Wrapped all the way: the slots before `start` in the first word.
                self.bits[w] & !(!0u64 << b0)
            } else {
                self.bits[w]
            };
            if word != 0 {
                return Some(w * 64 + word.trailing_zeros() as usize);
            }
        }
        None
    }

    /// The next event (smallest (at, seq)) without removing it.
    pub fn peek(&self) -> Option<Entry<E>> {
        let wheel = self
            .first_slot()
            .map(|s| self.nodes[self.slots[s].0 as usize].entry);
        let far = self.far.peek().map(|r| r.0.0);
        match (wheel, far) {
            (Some(w), Some(f)) => Some(if (f.at, f.seq) < (w.at, w.seq) { f } else { w }),
            (w, f) => w.or(f),
        }
    }

    /// Removes and returns the next event; its instant becomes the queue's present.
    pub fn pop(&mut self) -> Option<Entry<E>> {
        self.pop_due(u64::MAX)
    }

    /// Removes and returns the next event if it is due at or before `t` ns (one search of the wheel, where
    /// [`peek`](Self::peek) then [`pop`](Self::pop) make two).
    pub fn pop_due(&mut self, t: u64) -> Option<Entry<E>> {
        let slot = self.first_slot();
        let wheel = slot.map(|s| self.nodes[self.slots[s].0 as usize].entry);
        let take_far = match (wheel, self.far.peek()) {
            (Some(w), Some(f)) => (f.0.0.at, f.0.0.seq) < (w.at, w.seq),
            (None, Some(_)) => true,
            (_, None) => false,
        };
        let e = if take_far {
            if self.far.peek()?.0.0.at > t {
                return None;
            }
            self.far.pop().map(|r| r.0.0)
        } else {
            let s = slot?;
            if wheel?.at > t {
                return None;
            }
            let n = self.slots[s].0;
            let next = self.nodes[n as usize].next;
            if next == NIL {
                self.slots[s] = (NIL, NIL);
                self.bits[s / 64] &= !(1 << (s % 64));
            } else {
                self.slots[s].0 = next;
            }
            self.nodes[n as usize].next = self.free;
            self.free = n;
            self.in_wheel -= 1;
            wheel
        }?;
        self.base = self.base.max(e.at);
        Some(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{RngExt, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    /// The queue pops exactly as a binary heap on (at, seq) does, over random pushes near and far (ties, the wheel's
    /// edge, far events overtaking near ones, wrap-around of the wheel) interleaved with pops.
    #[test]
    fn pops_in_the_order_of_a_heap_on_instant_and_sequence() {
        for seed in 0..20 {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let mut q = EventQueue::<u32>::new();
            let mut heap = BinaryHeap::new();
            let (mut seq, mut now, mut popped) = (0u64, 0u64, 0);
            for i in 0..20_000u32 {
                let pushes = rng.random_range(0..3);
                for _ in 0..pushes {
                    let d = match rng.random_range(0..6) {
                        0 => 0,
                        1 => rng.random_range(0..4),
                        2 => rng.random_range(0..2_000),
                        3 => WHEEL_NS - 1 - rng.random_range(0..2),
                        4 => WHEEL_NS + rng.random_range(0..3),
                        _ => rng.random_range(0..5 * WHEEL_NS),
                    };
                    seq += 1;
                    q.push(now + d, i);
                    heap.push(Reverse((now + d, seq, i)));
                }
                if rng.random_range(0..5) == 0 {
                    // Not due yet: nothing is taken.
                    if let Some(&Reverse((at, _, _))) = heap.peek()
                        && at > now
                    {
                        assert_eq!(q.pop_due(at - 1), None);
                    }
                }
                if rng.random_range(0..5) < 2 {
                    let a = if rng.random_range(0..2) == 0 {
                        q.pop()
                    } else {
                        q.pop_due(heap.peek().map_or(0, |r: &Reverse<(u64, u64, u32)>| r.0.0))
                    }
                    .map(|e| (e.at, e.seq, e.ev));
                    let b = heap.pop().map(|r| r.0);
                    assert_eq!(a, b, "seed {seed} step {i}");
                    if let Some(e) = a {
                        now = e.0;
                        popped += 1;
                    }
                }
                assert_eq!(q.len(), heap.len());
                assert_eq!(
                    q.peek().map(|e| (e.at, e.seq, e.ev)),
                    heap.peek().map(|r| r.0)
                );
            }
            while let Some(r) = heap.pop() {
                assert_eq!(q.pop().map(|e| (e.at, e.seq, e.ev)), Some(r.0));
            }
            assert!(q.is_empty() && q.pop().is_none());
            assert!(popped > 1000);
        }
    }
}
