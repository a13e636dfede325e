//! roce-verbs: the application-facing runtime of the rocev2 software RNIC.
//!
//! Each device (a sans-IO [`roce_proto::Engine`] with its [`roce_link::Link`]) sits behind one progress lock, and
//! whichever thread calls drives it (`STYLE-progress-memory.md` §2–3). Handles are `Send + Sync` cheap clones
//! (`STYLE.md` §4.3); any thread may post or poll.
//!
//! # Progress ([`ProgressMode`]; the lock protocol is in `src/progress.rs`)
//!
//! * [`ProgressMode::Caller`] (default, run-to-completion): [`Qp::post_send`] / [`Qp::post_recv`] copy the WRs into
//!   the QP's ring, ring one doorbell per chain and run one bounded pass in the posting thread (an idle QP's packets
//!   leave before the call returns); [`Cq::poll`] reads the CQ ring and, if it is empty, runs a pass (receive,
//!   process, complete) and reads again; [`CompChannel::get_event`] drives passes while it waits. A thread that
//!   finds another one driving hands its work over (the `missed` flag) and returns at once. An auto-progress
//!   thread steps in only when no caller has driven for [`RuntimeConfig::auto_progress`] (1 ms), so a program that
//!   stops calling — a pure RDMA WRITE target, a thread blocked elsewhere — keeps answering; [`Context::progress`]
//!   lets a program drive explicitly.
//! * [`ProgressMode::Thread`]: a progress thread keeps every QP moving (posts ring a doorbell and wake it; polls
//!   read the CQ ring).
//!
//! Control verbs (create/modify/destroy, `reg_mr`, counters) take the progress lock in the calling thread. A pass
//! is bounded ([`RuntimeConfig::tx_budget`] frames out, [`RuntimeConfig::rx_burst`] in), allocates nothing, and
//! touches only QPs and CQs with news.
//!
//! # Memory: the application's own, under the RNIC contract
//!
//! An MR covers memory the application owns and keeps using, as `ibv_reg_mr` does: an [`MrBuf`] (page-aligned,
//! zeroed, optionally on 2 MiB huge pages with [`MrBuf::hugepages`]) registered with [`Pd::reg_mr`], or any memory
//! through `unsafe` [`Pd::reg_mr_raw`] (the C ABI's path). The application fills and reads the buffer by copies
//! through `&self` ([`MrBuf::read`], [`MrBuf::write`]; a slice view only behind `unsafe`, issue #22); the engine
//! reads and writes the same bytes as an RNIC's DMA would — copies of exactly the range a WR or a remote access
//! names, never a reference to the buffer. The MR's address is the memory's own address. All these copies go
//! through one primitive, assembly routines that survive a fault (memory the program unmapped or protected fails
//! the WR with the error an RNIC reports on a translation fault instead of killing the process, issue #21) and are
//! defined even when they run concurrently (issue #22).
//!
//! **The RNIC contract** (IBTA Vol 1 §10.7.2.1, §11.4.1.1; libibverbs `ibv_post_send(3)`): the application does not
//! change a buffer between posting a WR that names it and that WR's completion — the engine may read a send source
//! again until then (go-back-N retransmission) — and does not read a receive or READ target before the completion;
//! bytes a peer may write through an rkey are read only once the peer's protocol says they are there. Breaking it
//! gives a mix of old and new bytes, exactly as with a hardware RNIC (not undefined behaviour: the copies are
//! assembly). What the runtime guarantees in return: the engine co-owns the
//! memory (dropping the `MrBuf` or the last [`Mr`] handle early never frees bytes the engine may touch),
//! [`Mr::dereg`] is refused with [`Error::Busy`] (`EBUSY`) while WRs that name the MR are in flight, and no range
//! outside a registration is ever touched (checked by the engine, and again where the copy happens). The `unsafe`
//! of the crate is in `memory` (with the contract written there once) and `fault` (the copy routines).
//!
//! # Example
//!
//! ```
//! use roce_verbs::*;
//! let (a, b) = Context::sim_pair(RuntimeConfig::default()).unwrap();
//! let pd = a.alloc_pd().unwrap();
//! let cq = a.create_cq(16, None, Moderation::default()).unwrap();
//! let buf = MrBuf::new(64).unwrap();
//! buf.write(0, b"hello").unwrap(); // a copy in: what a SEND of these bytes carries
//! let mr = pd.reg_mr(&buf, AccessFlags::LOCAL_WRITE).unwrap();
//! assert_eq!((mr.length(), mr.addr()), (64, buf.as_ptr() as u64));
//! let mut wcs = [Wc::default(); 4];
//! assert_eq!(cq.poll(&mut wcs), 0);
//! # drop(b);
//! ```
#![warn(missing_docs)]
// All `unsafe` of the crate lives in `memory` (MR memory the application owns) and `fault` (the fault-tolerant
// copy routines and their signal handler), each block with a SAFETY comment,
// plus one block in `runner` that hands gathered payload pieces (pointers into MRs) to the link.
#![deny(unsafe_code)]
#![warn(clippy::undocumented_unsafe_blocks)]

mod channel;
mod clock;
pub mod cm;
pub mod endpoint;
#[allow(unsafe_code)]
mod fault;
mod handles;
mod hugepage;
#[allow(unsafe_code)]
mod memory;
mod mw;
mod progress;
mod runner;
mod srq;
mod sync;
mod wqe;

pub use channel::{CompChannel, Moderation};
pub use clock::Clock;
pub use endpoint::StatsEndpoint;
pub use fault::{FAULT_TOLERANT, memory_faults};
pub use handles::{
    Ah, ConnectOpts, Context, Cq, Error, Mr, Pd, PostError, Qp, QpEndpoint, QpRate, QpSnapshot,
    SendLink, StatsSnapshot, device_attr,
};
pub use hugepage::{HUGE_PAGE_SIZE, HugePageBuffer, HugePagePolicy};
pub use memory::{MrBuf, PAGE_SIZE};
pub use mw::Mw;

/// `ibv_device_attr.device_cap_flags` of every rocev2 device (`<infiniband/verbs.h>` `enum ibv_device_cap_flags`):
/// `IBV_DEVICE_MEM_WINDOW` (bit 17) and `IBV_DEVICE_MEM_WINDOW_TYPE_2B` (bit 24), for memory windows of type 1 and
/// 2B ([`Mw`]); no other bit is claimed. The one value behind the C library's `ibv_query_device` and
/// `rocev2 devinfo -v`.
pub const DEVICE_CAP_FLAGS: u32 = (1 << 17) | (1 << 24);

/// The names `ibv_devinfo -v` prints under `device_cap_flags` for the bits of [`DEVICE_CAP_FLAGS`], lowest bit
/// first (rdma-core `libibverbs/examples/devinfo.c`).
pub const DEVICE_CAP_FLAG_NAMES: [(u32, &str); 2] =
    [(1 << 17, "MEM_WINDOW"), (1 << 24, "MEM_WINDOW_TYPE_2B")];
pub use roce_proto::{
    AccessFlags, AhAttr, AsyncEvent, AsyncEventType, Counters, EngineConfig, Gid, MrBuffer,
    MrMemory, Mtu, MwType, Psn, QpAttr, QpAttrMask, QpCap, QpInfo, QpState, QpType, RateMetrics,
    RecvWr, Rkey, SendFlags, SendOp, SendWr, Sge, SrqAttr, SrqAttrMask, SrqHandle, UdDest, Wc,
    WcOpcode, WcStatus,
};
pub use runner::{AsyncHandler, ProgressMode, RuntimeConfig, RuntimeStats};
pub use srq::Srq;
pub use wqe::{MAX_INLINE, MAX_SGE};
