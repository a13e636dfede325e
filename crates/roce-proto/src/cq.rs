//! Completion queues: a bounded ring per CQ, allocated at `create_cq`. A completion that does not fit is an overrun
//! (IBTA Vol 1 §11.4.2.1 / o11-32: the CQ is then in error): it is lost, the CQ is marked overrun, one
//! `IBV_EVENT_CQ_ERR` async event is raised and the QPs that complete into the CQ go to the error state
//! (`Engine::push_wc`); polling an empty CQ returns 0.

use std::collections::VecDeque;

use crate::verbs::{CqHandle, Wc};

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

impl crate::engine::Engine {
    /// `ibv_resize_cq`: the CQ `cq` holds `depth` completions from now on (more or fewer than before), keeping the
    /// ones queued. `held_elsewhere` counts completions of this CQ the caller holds outside the engine (a runtime's
    /// ring), which must fit too. Errors (nothing changed): `InvalidHandle` (dead CQ), `InvalidArgument` (`depth`
    /// outside 1..=`max_cqe`, or fewer than the completions queued: rxe `rxe_cq.c` `rxe_cq_chk_attr`, the kernel
    /// answers EINVAL). Control path: may allocate.
    pub fn resize_cq(
        &mut self,
        cq: CqHandle,
        depth: u32,
        held_elsewhere: usize,
    ) -> Result<(), crate::ResourceError> {
        if depth == 0 || depth > self.cfg.device.max_cqe {
            return Err(crate::ResourceError::InvalidArgument(
                "cq depth must be 1..=max_cqe",
            ));
        }
        let c = self
            .cq_mut(cq)
            .ok_or(crate::ResourceError::InvalidHandle("cq"))?;
        if c.ring.len().saturating_add(held_elsewhere) > depth as usize {
            return Err(crate::ResourceError::InvalidArgument(
                "cq depth below the completions queued",
            ));
        }
        c.depth = depth as usize;
        let more = c.depth.saturating_sub(c.ring.len());
        c.ring.reserve(more);
        Ok(())
    }
}

impl crate::engine::Engine {
    /// Removes the completions of QP `qpn` still queued on CQ `cq` (for a QP moved to RESET, as the mlx5 provider's
    /// `mlx5_cq_clean` does in rdma-core `providers/mlx5/verbs.c`: a program that resets a QP in ERR and
    /// reconnects it does not then poll the flushed completions of its previous life). Returns how many went;
    /// 0 for a dead CQ. Control path.
    pub fn clean_cq(&mut self, cq: CqHandle, qpn: crate::Qpn) -> usize {
        let Some(c) = self.cq_mut(cq) else {
            return 0;
        };
        let before = c.ring.len();
        c.ring.retain(|wc| wc.qp_num != qpn);
        before - c.ring.len()
    }
}
