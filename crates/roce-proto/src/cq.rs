//! Completion queues: a bounded ring per CQ, allocated at `create_cq`. A completion that does not fit is an overrun
//! (IBTA Vol 1 §11.4.2.1 / o11-32: the CQ is then in error): it is lost, the CQ is marked overrun, one
//! `IBV_EVENT_CQ_ERR` async event is raised and the QPs that complete into the CQ go to the error state
//! (`Engine::push_wc`); polling an empty CQ returns 0.

use std::collections::VecDeque;

use crate::verbs::Wc;

#[derive(Debug)]
pub(crate) struct Cq {
    pub(crate) ring: VecDeque<Wc>,
    pub(crate) depth: usize,
    pub(crate) users: u32,
    /// On the engine's ready list (`Engine::poll_ready_cq`).
    pub(crate) ready: bool,
    /// A completion did not fit: the CQ is in error (every later completion is lost and counted too).
    pub(crate) overrun: bool,
}

impl Cq {
    pub(crate) fn new(depth: usize) -> Self {
        Cq {
            ring: VecDeque::with_capacity(depth),
            depth,
            users: 0,
            ready: false,
            overrun: false,
        }
    }

    /// Queues `wc`; false on overrun.
    pub(crate) fn push(&mut self, wc: Wc) -> bool {
        if self.overrun || self.ring.len() >= self.depth {
            return false;
        }
        self.ring.push_back(wc);
        true
    }

    pub(crate) fn poll(&mut self, out: &mut [Wc]) -> usize {
        let n = out.len().min(self.ring.len());
        for (slot, wc) in out.iter_mut().zip(self.ring.drain(..n)) {
            *slot = wc;
        }
        n
    }
}
