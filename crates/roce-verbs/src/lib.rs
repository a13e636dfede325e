//! roce-verbs: the application-facing runtime of the rocev2 software RNIC — threads, not sans-IO.
//!
//! An **engine thread** owns the sans-IO [`roce_proto::Engine`] of a device together with its
//! [`roce_link::Link`] and drives it (`STYLE.md` D1, loop described in the `runner` module docs). Applications use
//! thread-safe handles whose verbs forward to that thread (`STYLE.md` §4.3, §10):
//!
//! * data path: [`Qp::post_send`] / [`Qp::post_recv`] copy the work requests into the QP's lock-free SPSC rings
//!   (rtrb) and ring **one doorbell per posted chain** (a release store, plus an unpark only when the engine thread
//!   is parked); completions come back through a per-CQ ring, [`Cq::poll`] `(&mut [Wc]) -> usize` (0 = empty);
//! * control path (create/modify/destroy, `reg_mr`, counters): a command queue; the caller waits for
//!   the answer (bounded by [`COMMAND_TIMEOUT`]);
//! * completion channels with CQ moderation ([`CompChannel`], [`Moderation`]): `req_notify` + a blocking
//!   `get_event(timeout)`.
//!
//! # Memory: the application's own, under the RNIC contract
//!
//! An MR covers memory the application owns and keeps using, as `ibv_reg_mr` does: an [`MrBuf`] (page-aligned,
//! zeroed, optionally on 2 MiB huge pages with [`MrBuf::hugepages`]) registered with [`Pd::reg_mr`], or any memory
//! through `unsafe` [`Pd::reg_mr_raw`] (the C ABI's path). The application fills and reads the buffer as a slice;
//! the engine reads and writes the same bytes as an RNIC's DMA would — raw copies of exactly the range a WR or a
//! remote access names, never a reference to the whole buffer. The MR's address is the memory's own address.
//!
//! **The RNIC contract** (IBTA Vol 1 §10.7.2.1, §11.4.1.1; libibverbs `ibv_post_send(3)`): the application does not
//! change a buffer between posting a WR that names it and that WR's completion — the engine may read a send source
//! again until then (go-back-N retransmission) — and does not read a receive or READ target before the completion;
//! bytes a peer may write through an rkey are read only once the peer's protocol says they are there. Breaking it is
//! a data race, exactly as with a hardware RNIC. What the runtime guarantees in return: the engine co-owns the
//! memory (dropping the `MrBuf` or the last [`Mr`] handle early never frees bytes the engine may touch),
//! [`Mr::dereg`] is refused with [`Error::Busy`] (`EBUSY`) while WRs that name the MR are in flight, and no range
//! outside a registration is ever touched (checked by the engine, and again where the copy happens). All `unsafe`
//! of the crate is in one module (`memory`), with the contract written there once.
//!
//! # Example
//!
//! ```
//! use roce_verbs::*;
//! let (a, b) = Context::sim_pair(RuntimeConfig::default()).unwrap();
//! let pd = a.alloc_pd().unwrap();
//! let cq = a.create_cq(16, None, Moderation::default()).unwrap();
//! let mut buf = MrBuf::new(64).unwrap();
//! buf[..5].copy_from_slice(b"hello"); // ordinary stores: what a SEND of these bytes carries
//! let mr = pd.reg_mr(&buf, AccessFlags::LOCAL_WRITE).unwrap();
//! assert_eq!((mr.length(), mr.addr()), (64, buf.as_ptr() as u64));
//! let mut wcs = [Wc::default(); 4];
//! assert_eq!(cq.poll(&mut wcs), 0);
//! # drop(b);
//! ```
#![warn(missing_docs)]
// All `unsafe` of the crate lives in `memory` (MR memory the application owns), each block with a SAFETY comment,
// plus one block in `runner` that hands gathered payload pieces (pointers into MRs) to the link.
#![deny(unsafe_code)]
#![warn(clippy::undocumented_unsafe_blocks)]

mod channel;
mod clock;
pub mod endpoint;
mod handles;
mod hugepage;
#[allow(unsafe_code)]
mod memory;
mod runner;
mod wqe;

pub use channel::{CompChannel, Moderation};
pub use clock::Clock;
pub use endpoint::StatsEndpoint;
pub use handles::{
    Ah, COMMAND_TIMEOUT, ConnectOpts, Context, Cq, Error, Mr, Pd, PostError, Qp, QpEndpoint,
    QpRate, QpSnapshot,
};
pub use hugepage::{HUGE_PAGE_SIZE, HugePageBuffer, HugePagePolicy};
pub use memory::{MrBuf, PAGE_SIZE};
pub use roce_proto::{
    AccessFlags, AhAttr, Counters, EngineConfig, Gid, MrBuffer, MrMemory, Mtu, Psn, QpAttr,
    QpAttrMask, QpCap, QpInfo, QpState, QpType, RateMetrics, RecvWr, Rkey, SendFlags, SendOp,
    SendWr, Sge, UdDest, Wc, WcOpcode, WcStatus,
};
pub use runner::{RuntimeConfig, RuntimeStats};
pub use wqe::{MAX_INLINE, MAX_SGE};
