//! Shared receive queues ([`Srq`], `ibv_srq`): a thread-safe handle over the engine's SRQ (`roce_proto` `srq`
//! module: IBTA Vol 1 §10.2.9, rxe `rxe_srq.c`).
//!
//! Unlike a QP's receive queue, which is a lock-free ring drained by the passes, an SRQ post is a control verb: it
//! takes the progress lock (blocking), hands the chain to the engine and runs one pass. So a receive posted on an SRQ
//! is in the engine when [`Srq::post_recv`] returns (no [`Qp::sync`](crate::Qp::sync) needed before telling a peer),
//! at the price of contending with the progress lock on every post.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use roce_proto::{PostErrorKind, RecvWr, ResourceError, SrqAttr, SrqAttrMask, SrqHandle};

use crate::handles::{Context, Error, Pd, PostError};

struct SrqInner {
    pd: Pd,
    handle: SrqHandle,
    /// SGEs per WR (fixed at creation).
    max_sge: u32,
    /// Cleared by a successful [`Srq::destroy`], so `Drop` does not destroy again.
    live: AtomicBool,
}

impl std::fmt::Debug for SrqInner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Srq")
            .field("handle", &self.handle)
            .field("max_sge", &self.max_sge)
            .finish_non_exhaustive()
    }
}

impl Drop for SrqInner {
    fn drop(&mut self) {
        if !self.live.load(Ordering::Acquire) {
            return;
        }
        let h = self.handle;
        // Every QP on the SRQ holds a handle, so the last one goes after them: the engine accepts.
        self.pd.context().cast(move |d| {
            if let Err(e) = d.engine.destroy_srq(h) {
                tracing::warn!(error = %e, "destroy_srq failed");
            }
        });
    }
}

/// A shared receive queue (`ibv_srq`). Cheap to clone, `Send + Sync`; keeps its PD alive, and every QP created on it
/// ([`Pd::create_qp_with_srq`]) keeps it alive.
#[derive(Clone, Debug)]
pub struct Srq {
    inner: Arc<SrqInner>,
}

impl Pd {
    /// `ibv_create_srq`: an SRQ with room for `max_wr` receive WRs of up to `max_sge` SGEs each (at most
    /// [`crate::MAX_SGE`] and the device's `max_srq_sge`); the limit is not armed (arm it with [`Srq::modify`]).
    /// The granted attributes are in [`Srq::query`]. Errors: the engine's (`InvalidArgument` for `max_wr` 0 or above
    /// `max_srq_wr`, `max_sge` above `max_srq_sge`; `Exhausted` at `max_srq`), `InvalidArgument` above `MAX_SGE`.
    pub fn create_srq(&self, max_wr: u32, max_sge: u32) -> Result<Srq, Error> {
        if max_sge as usize > crate::MAX_SGE {
            return Err(Error::InvalidArgument("more SGEs than roce_verbs::MAX_SGE"));
        }
        let pd = self.handle();
        let (handle, attr) = self
            .context()
            .call(move |d| d.engine.create_srq(pd, max_wr, max_sge))??;
        Ok(Srq {
            inner: Arc::new(SrqInner {
                pd: self.clone(),
                handle,
                max_sge: attr.max_sge,
                live: AtomicBool::new(true),
            }),
        })
    }
}

impl Srq {
    /// The engine handle (for [`Pd::create_qp_with_srq`] and async events naming the SRQ).
    pub fn handle(&self) -> SrqHandle {
        self.inner.handle
    }

    /// The device of this SRQ.
    pub fn context(&self) -> &Context {
        self.inner.pd.context()
    }

    /// The PD of this SRQ.
    pub fn pd(&self) -> &Pd {
        &self.inner.pd
    }

    /// `ibv_post_srq_recv` of a chain, all or nothing: checked whole (room for every WR, SGEs per WR) under the
    /// progress lock, then posted and one pass run. SGEs naming bad memory are accepted and reported as a
    /// LOC_PROT_ERR completion when a message lands in the WR (as [`Qp::post_recv`](crate::Qp::post_recv)).
    /// Errors: `QueueFull` (`ENOMEM`), `TooManySges`, `SrqGone` after [`Srq::destroy`].
    pub fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<(), PostError> {
        let max_sge = self.inner.max_sge.max(1) as usize;
        if wrs.iter().any(|w| w.sg_list.len() > max_sge) {
            return Err(PostError::TooManySges);
        }
        let h = self.inner.handle;
        let r = self.context().call(move |d| {
            let (Some(attr), Some(out)) = (d.engine.query_srq(h), d.engine.srq_outstanding(h))
            else {
                return Err(PostError::SrqGone);
            };
            let free = attr.max_wr.saturating_sub(out) as usize;
            if free < wrs.len() {
                return Err(PostError::QueueFull {
                    free,
                    wanted: wrs.len(),
                });
            }
            // Checked above: the engine accepts the whole chain.
            d.engine.post_srq_recv(h, wrs).map_err(|e| match e.kind {
                PostErrorKind::TooManySges { .. } => PostError::TooManySges,
                PostErrorKind::QueueFull => PostError::QueueFull {
                    free: 0,
                    wanted: wrs.len() - e.index,
                },
                _ => PostError::SrqGone,
            })
        });
        r.unwrap_or(Err(PostError::SrqGone))
    }

    /// `ibv_modify_srq`: [`SrqAttrMask::MAX_WR`] resizes (not below the WRs posted, at most `max_srq_wr`),
    /// [`SrqAttrMask::LIMIT`] arms the limit event at `attr.srq_limit` (0 disarms; at most `max_wr`). The event is
    /// raised once, when a WR taken from the SRQ leaves fewer than the limit, and disarms it ([`Srq::query`] then
    /// reads 0). Errors: the engine's `InvalidArgument` (EINVAL), nothing changed.
    pub fn modify(&self, attr: &SrqAttr, mask: SrqAttrMask) -> Result<(), Error> {
        let (h, attr) = (self.inner.handle, *attr);
        self.context()
            .call(move |d| d.engine.modify_srq(h, &attr, mask))??;
        Ok(())
    }

    /// `ibv_query_srq`: `max_wr`, `max_sge` and the armed limit (0 if not armed or after it fired).
    pub fn query(&self) -> Result<SrqAttr, Error> {
        let h = self.inner.handle;
        self.context()
            .call(move |d| d.engine.query_srq(h))?
            .ok_or(Error::InvalidArgument("the SRQ is gone"))
    }

    /// Receive WRs posted on the SRQ that no QP has taken yet.
    pub fn outstanding(&self) -> Result<u32, Error> {
        let h = self.inner.handle;
        self.context()
            .call(move |d| d.engine.srq_outstanding(h))?
            .ok_or(Error::InvalidArgument("the SRQ is gone"))
    }

    /// `ibv_destroy_srq`: refused with [`Error::Busy`] (`EBUSY`) while QPs created on it exist (they hold handles
    /// of it), and the SRQ comes back; on success the WRs still posted are discarded without completions and other
    /// handles of it become dead (their posts fail with `SrqGone`).
    pub fn destroy(self) -> Result<(), (Srq, Error)> {
        let h = self.inner.handle;
        match self.context().call(move |d| d.engine.destroy_srq(h)) {
            Ok(Ok(())) => {
                self.inner.live.store(false, Ordering::Release);
                Ok(())
            }
            Ok(Err(ResourceError::Busy(what))) => Err((self, Error::Busy(what))),
            Ok(Err(e)) => Err((self, Error::Resource(e))),
            Err(e) => Err((self, e)),
        }
    }
}
