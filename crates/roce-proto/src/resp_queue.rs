//! The responder's response queue (`RespCtx::out`): what a QP still has to transmit as a responder, in PSN order
//! (ACKs and NAKs, READ response streams, ATOMIC ACKs; ACKs must not overtake READ responses, `ROCEV2.md §5`), with
//! the number of READ/atomic responses it owes for *new* requests kept beside the items.
//!
//! That count is the responder-resource check of every incoming READ/atomic request (`max_dest_rd_atomic`, IBTA;
//! rxe `check_resource`): kept with the queue, it is one load per request instead of a scan of the queue (the
//! per-packet path does no scans, `docs/ARCHITECTURE.md`). Every change to the items goes through this type, so
//! the count cannot drift from them; debug builds check it against a recount each time it is read.

use std::collections::VecDeque;

use crate::qp::RespItem;

/// Whether `it` is a response owed for a new READ/atomic request: a READ stream or an ATOMIC ACK not sent yet
/// that answers a request executed for the first time. Replays for duplicates are not: a late duplicate (a
/// spurious retransmission, a duplicated packet) can ask again for a request the requester completed long ago,
/// so its replay says nothing about what the requester still has outstanding.
fn owes(it: &RespItem) -> bool {
    matches!(
        it,
        RespItem::Read { replay: false, .. } | RespItem::AtomicAck { replay: false, .. }
    )
}

/// A FIFO of [`RespItem`]s sized at RTR (`RespCtx::out_room`), with the count of items that [`owes`].
#[derive(Debug, Default)]
pub(crate) struct RespQueue {
    items: VecDeque<RespItem>,
    /// Items in `items` for which [`owes`] holds.
    owed: usize,
}

impl RespQueue {
    /// An empty queue with room for `n` items.
    pub(crate) fn with_capacity(n: usize) -> RespQueue {
        RespQueue {
            items: VecDeque::with_capacity(n),
            owed: 0,
        }
    }

    /// Makes room for `n` more items (control path: `modify_qp` to RTR).
    pub(crate) fn reserve(&mut self, n: usize) {
        self.items.reserve(n);
    }

    /// Number of items queued.
    pub(crate) fn len(&self) -> usize {
        self.items.len()
    }

    /// READ streams and ATOMIC ACKs queued and not yet (fully) sent for new requests: the READ/atomic requests the
    /// requester still has outstanding for certain (it cannot have completed one whose response was never sent).
    /// Replays for duplicates are left out (see [`owes`]). O(1).
    pub(crate) fn owed_rd_atomic(&self) -> usize {
        debug_assert_eq!(
            self.owed,
            self.items.iter().filter(|it| owes(it)).count(),
            "owed count drifted from the queue"
        );
        self.owed
    }

    /// The next item to transmit.
    pub(crate) fn front(&self) -> Option<&RespItem> {
        self.items.front()
    }

    /// The items, front first (tests and dumps).
    #[cfg(test)]
    pub(crate) fn iter(&self) -> impl Iterator<Item = &RespItem> {
        self.items.iter()
    }

    /// Queues `it` last. No allocation while the queue is within the room reserved at RTR.
    pub(crate) fn push_back(&mut self, it: RespItem) {
        self.owed += usize::from(owes(&it));
        self.items.push_back(it);
    }

    /// Takes the front item (it was sent, or its stream ended).
    pub(crate) fn pop_front(&mut self) -> Option<RespItem> {
        let it = self.items.pop_front()?;
        self.owed -= usize::from(owes(&it));
        Some(it)
    }

    /// Empties the queue.
    pub(crate) fn clear(&mut self) {
        self.items.clear();
        self.owed = 0;
    }

    /// Keeps the items for which `keep` holds, in order.
    pub(crate) fn retain(&mut self, mut keep: impl FnMut(&RespItem) -> bool) {
        let owed = &mut self.owed;
        self.items.retain(|it| {
            let k = keep(it);
            if !k && owes(it) {
                *owed -= 1;
            }
            k
        });
    }

    /// Removes the first queued READ stream of responder resource `res`, if any (the resource is being reused).
    pub(crate) fn remove_read_of(&mut self, res: u32) {
        let pos = self
            .items
            .iter()
            .position(|it| matches!(*it, RespItem::Read { res: r, .. } if r == res));
        if let Some(it) = pos.and_then(|p| self.items.remove(p)) {
            self.owed -= usize::from(owes(&it));
        }
    }

    /// Applies `f` to the front item (a READ stream advancing by one packet); `None` when the queue is empty.
    pub(crate) fn update_front<R>(&mut self, f: impl FnOnce(&mut RespItem) -> R) -> Option<R> {
        let it = self.items.front_mut()?;
        Some(Self::update(&mut self.owed, it, f))
    }

    /// Applies `f` to the last item (an ACK coalescing with the next one); `None` when the queue is empty.
    pub(crate) fn update_back<R>(&mut self, f: impl FnOnce(&mut RespItem) -> R) -> Option<R> {
        let it = self.items.back_mut()?;
        Some(Self::update(&mut self.owed, it, f))
    }

    fn update<R>(owed: &mut usize, it: &mut RespItem, f: impl FnOnce(&mut RespItem) -> R) -> R {
        let before = owes(it);
        let r = f(it);
        *owed = *owed - usize::from(before) + usize::from(owes(it));
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Psn;

    fn read(res: u32, psn: u32, replay: bool) -> RespItem {
        RespItem::Read {
            res,
            psn: Psn::new(psn),
            offset: 0,
            first: true,
            replay,
        }
    }

    fn atomic(psn: u32, replay: bool) -> RespItem {
        RespItem::AtomicAck {
            psn: Psn::new(psn),
            orig: 0,
            msn: 0,
            replay,
        }
    }

    fn ack(psn: u32, syndrome: u8) -> RespItem {
        RespItem::Ack {
            psn: Psn::new(psn),
            syndrome,
            msn: 0,
        }
    }

    /// The count agrees with a recount after every kind of change: new READ/atomic responses count, replays for
    /// duplicates, ACKs and NAKs do not; sending, superseding, reusing a resource and clearing uncount.
    #[test]
    fn the_owed_count_follows_every_change() {
        let mut q = RespQueue::with_capacity(12);
        let recount = |q: &RespQueue| q.iter().filter(|it| owes(it)).count();
        q.push_back(read(0, 10, false));
        q.push_back(ack(11, 0x1F));
        q.push_back(atomic(12, false));
        q.push_back(read(1, 13, false));
        assert_eq!((q.owed_rd_atomic(), q.len()), (3, 4));
        // Duplicates: replays and a NAK (sequence error) do not count.
        q.push_back(read(0, 10, true));
        q.push_back(atomic(12, true));
        q.push_back(ack(20, 0x60));
        assert_eq!((q.owed_rd_atomic(), q.len()), (3, 7));
        // A READ stream advances in place: still owed until its last packet is taken.
        assert!(
            q.update_front(|it| {
                if let RespItem::Read { psn, first, .. } = it {
                    *psn += 1;
                    *first = false;
                }
            })
            .is_some()
        );
        assert_eq!(q.owed_rd_atomic(), 3);
        // ACK coalescing at the back changes nothing owed.
        q.push_back(ack(21, 0x1F));
        q.update_back(|it| {
            if let RespItem::Ack { psn, .. } = it {
                *psn = Psn::new(22);
            }
        });
        assert_eq!(q.owed_rd_atomic(), 3);
        // Sent: the stream of resource 0 leaves the front.
        assert!(matches!(q.pop_front(), Some(RespItem::Read { res: 0, .. })));
        assert_eq!(q.owed_rd_atomic(), 2);
        // The ACK at the front leaves without changing the count.
        assert!(matches!(q.pop_front(), Some(RespItem::Ack { .. })));
        assert_eq!(q.owed_rd_atomic(), 2);
        // Resource 1 reused: its queued new stream goes.
        q.remove_read_of(1);
        assert_eq!((q.owed_rd_atomic(), recount(&q)), (1, 1));
        // Resource 0 reused: its replay goes, the count does not change.
        q.remove_read_of(0);
        assert_eq!((q.owed_rd_atomic(), recount(&q)), (1, 1));
        q.remove_read_of(7);
        assert_eq!(q.owed_rd_atomic(), 1);
        // A duplicate supersedes everything from its PSN on (`supersede_from`).
        q.push_back(read(2, 30, false));
        q.push_back(read(3, 31, false));
        assert_eq!(q.owed_rd_atomic(), 3);
        q.retain(|it| match *it {
            RespItem::Read { psn, .. } | RespItem::AtomicAck { psn, .. } => {
                psn.diff(Psn::new(31)) < 0
            }
            RespItem::Ack { .. } => true,
        });
        assert_eq!((q.owed_rd_atomic(), recount(&q)), (2, 2));
        // An update that turns an item into one that is owed (or back) is counted too.
        q.push_back(ack(40, 0x1F));
        q.update_back(|it| *it = read(4, 40, false));
        assert_eq!((q.owed_rd_atomic(), recount(&q)), (3, 3));
        q.update_back(|it| *it = ack(40, 0x1F));
        assert_eq!((q.owed_rd_atomic(), recount(&q)), (2, 2));
        q.clear();
        assert_eq!((q.owed_rd_atomic(), q.len()), (0, 0));
        assert!(q.pop_front().is_none() && q.update_front(|_| ()).is_none());
        // Default (what `RespCtx::reset` takes) starts at zero.
        let d = RespQueue::default();
        assert_eq!(d.owed_rd_atomic(), 0);
    }
}
