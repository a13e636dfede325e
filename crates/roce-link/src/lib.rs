//! roce-link: the [`Link`] trait that moves whole Ethernet frames between a RoCE v2 engine and a medium, the
//! deterministic simulated link ([`sim`]), and decorators that wrap any link: fault injection ([`fault::Faulty`])
//! and pcap capture ([`pcap::Pcap`]).
//!
//! # Shape (`STYLE.md` D1–D4)
//!
//! The trait is batch-oriented and leaves buffer ownership with the link (smoltcp `phy::Device`, ixy.rs
//! `rx_batch`/`tx_batch`):
//!
//! * **receive**: [`Link::rx_burst`] lends up to `max` received frames, one at a time, to a caller closure
//!   (`&mut [u8]`, starting at the destination MAC, no FCS). A ring backend (AF_PACKET, AF_XDP) lends its ring
//!   slot; nothing is copied or allocated per frame.
//! * **transmit**: [`Link::tx_buf`] borrows the next free transmit buffer (at least [`LinkCaps::mtu`] bytes), the
//!   engine writes a frame into it (`Engine::poll_transmit(now, buf)`), and [`Link::tx_commit`] queues its first
//!   `len` bytes. A link that cannot take a frame now answers `tx_buf` with [`LinkError::Busy`]; the driver then
//!   does not ask the engine for a frame, so back-pressure never costs a PSN (`SCENARIOS.md` S05).
//!   [`Link::flush`] is the doorbell: one `sendmmsg`, one XDP TX wake-up per burst.
//! * **time**: the simulated link and the decorators that hold frames report the next instant at which they
//!   have something to deliver through [`Link::poll_at`]; a driver loop sleeps (or advances virtual time) to the
//!   minimum of that and the engine's `poll_timeout()`.
//!
//! Time is the engine's [`Instant`] (nanoseconds, supplied by the driver); links never read a clock.
//!
//! * **readiness**: a link whose frames arrive on a file descriptor names it in [`Link::wait_fd`]; a driver with
//!   nothing to do blocks on it (with [`wait::Waiter`], which other threads can ring) until a frame arrives or its
//!   next deadline, instead of polling.
//!
//! # The `tx_buf` contract
//!
//! Between a `tx_buf` and the matching `tx_commit`, calling `tx_buf` again returns **the same buffer with its
//! contents intact**. Decorators rely on this to look at (and modify) the frame in `tx_commit`. A `tx_buf` that
//! is never committed is simply reused by the next `tx_buf`, and abandoned by `flush`.
#![warn(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

pub mod devfs;
pub mod device;
pub mod fault;
pub mod null;
pub mod pcap;
mod pool;
pub mod reuseport;
pub mod sim;
pub mod udp;
pub mod wait;
pub mod xdp;

pub use fault::{Fault, FaultConfig, FaultStats, Faulty, GilbertElliott};
pub use null::{NullLink, NullStats};
pub use pcap::{Pcap, PcapMode};
pub use roce_proto::time::Instant;
pub use roce_proto::{TxGather, TxSeg};
pub use sim::{SimConfig, SimNet, SimPort, SimStats};
pub use udp::{IpIdPolicy, RxMode, UdpConfig, UdpLink, UdpStats};
pub use wait::{MAX_WAIT_FDS, Semaphore, Waiter, Woken};
pub use xdp::{XdpConfig, XdpLink, XdpStats};

/// What the backend does about the RoCE v2 ICRC (`STYLE.md` W6, `ROCEV2.md §3`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IcrcCaps {
    /// The backend verified the ICRC of every frame it delivers (and dropped bad ones); the engine may skip its
    /// own check.
    pub rx_verified: bool,
    /// The backend computes the ICRC of transmitted frames itself; the engine may leave the field unset.
    pub tx_computed: bool,
}

/// Capabilities of a link (smoltcp `DeviceCapabilities`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LinkCaps {
    /// Largest frame in bytes, **including** the 14-byte Ethernet header (and VLAN tags), excluding the FCS.
    /// Every buffer returned by [`Link::tx_buf`] is at least this long.
    pub mtu: usize,
    /// Largest number of frames the backend handles in one receive burst / one flush.
    pub max_burst: usize,
    /// ICRC offloads.
    pub icrc: IcrcCaps,
    /// The first QPN of the range this link receives, when the kernel steers packets among several processes on
    /// one address by destination QPN ([`reuseport`], `docs/MULTIPROCESS.md`): the engine behind the link must
    /// number its QPs inside `first_qpn ..= first_qpn | (2^QPN_SHIFT - 1)` ([`reuseport::QPN_SHIFT`];
    /// `roce_proto::EngineConfig::first_qpn` and `last_qpn`; `roce_verbs::Context::open` applies them).
    /// `None`: the link receives every QPN.
    pub first_qpn: Option<u32>,
}

/// Errors of [`Link`] operations (`STYLE.md` X1, X2).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LinkError {
    /// No transmit buffer is free now (ring full, socket would block, injected back-pressure). Nothing was
    /// consumed; retry after [`Link::flush`] or later.
    #[error("link busy: no transmit buffer free")]
    Busy,
    /// A frame longer than [`LinkCaps::mtu`] (or longer than the buffer it was written into).
    #[error("frame of {len} bytes exceeds the link MTU of {mtu} bytes")]
    TooLong {
        /// Frame length in bytes.
        len: usize,
        /// Link MTU in bytes (incl. Ethernet header).
        mtu: usize,
    },
    /// [`Link::tx_commit`] without a preceding [`Link::tx_buf`].
    #[error("tx_commit without a buffer from tx_buf")]
    NoTxBuffer,
    /// An operating-system error of a real backend.
    #[error("link I/O error")]
    Io(#[from] std::io::Error),
    /// Writing a capture record failed.
    #[error("capture write failed")]
    Capture(#[from] pcap_file::PcapError),
}

/// A medium that carries whole Ethernet frames (see the crate docs for the call protocol).
pub trait Link {
    /// Capabilities of this link.
    fn caps(&self) -> LinkCaps;

    /// Lends up to `max` frames that have arrived by `now` to `sink`, one call per frame, in arrival order.
    /// Returns the number of frames taken from the medium. A decorator may deliver a frame more than once
    /// (duplication) or deliver frames it held back earlier, so `sink` can be called more often than the
    /// returned count.
    fn rx_burst(
        &mut self,
        now: Instant,
        max: usize,
        sink: &mut dyn FnMut(&mut [u8]),
    ) -> Result<usize, LinkError>;

    /// Borrows the next free transmit buffer (at least [`LinkCaps::mtu`] bytes). [`LinkError::Busy`] is
    /// back-pressure. Calling it again before [`tx_commit`](Self::tx_commit) returns the same buffer, contents
    /// intact.
    fn tx_buf(&mut self, now: Instant) -> Result<&mut [u8], LinkError>;

    /// Queues the first `len` bytes of the buffer from the last [`tx_buf`](Self::tx_buf) as one frame,
    /// departing at `now`. Errors: [`LinkError::NoTxBuffer`], [`LinkError::TooLong`].
    fn tx_commit(&mut self, now: Instant, len: usize) -> Result<(), LinkError>;

    /// Pushes queued frames to the medium (the doorbell). Frames a backend could not hand over stay queued.
    /// A buffer taken with [`tx_buf`](Self::tx_buf) and not committed is abandoned (a driver calls `flush`
    /// after the engine had nothing more to send into it).
    fn flush(&mut self, now: Instant) -> Result<(), LinkError>;

    /// The earliest instant at which this link will have something to do without new input (a frame arrives,
    /// a held frame is released), if known. Real backends that are driven by readiness return `None`.
    fn poll_at(&self) -> Option<Instant>;

    /// A file descriptor that becomes readable (`POLLIN`) when [`rx_burst`](Self::rx_burst) has a frame to deliver,
    /// so that a driver with nothing to do can block on it ([`wait::Waiter::wait`]) until a frame arrives or its
    /// next deadline (the engine's `poll_timeout` and [`poll_at`](Self::poll_at)) instead of polling.
    ///
    /// `None` (the default) when waiting on a descriptor is not enough to see this link's next work: a link with no
    /// descriptor (the simulated and null links), or one that has work no readiness announces right now (frames
    /// queued after back-pressure, which only a later [`flush`](Self::flush) sends). The driver then polls. A
    /// decorator passes its inner link's answer on (frames it holds back are announced by `poll_at`).
    fn wait_fd(&self) -> Option<std::os::fd::RawFd> {
        None
    }

    /// Calls `f` with each of this link's own counters (`name`, value): above all the datagrams it dropped before
    /// the engine could see them (bad ICRC, truncated, wrong address family, ...), which no engine counter shows.
    /// The stats endpoint reports them as the device's `link` counters (`rocev2 stat`). Control path. The default
    /// has none; a decorator passes its inner link's on.
    fn counters(&self, f: &mut dyn FnMut(&'static str, u64)) {
        let _ = f;
    }

    /// Steers the connection requests (CM REQ and SIDR_REQ MADs on QP 1) for `service_id` to this link's process
    /// (`listen` true: a listen starts) or ends that (`listen` false), on an address several processes share
    /// ([`reuseport`]: [`reuseport::Joined::claim_service`], `docs/MULTIPROCESS.md`, QP 1). Control path. The default,
    /// for links that receive everything sent to their address, has nothing to steer; a decorator passes it on.
    ///
    /// Errors: `AddrInUse` when another running process of the address listens on `service_id`.
    fn steer_service(&self, service_id: u64, listen: bool) -> std::io::Result<()> {
        let _ = (service_id, listen);
        Ok(())
    }

    /// Joins (`join` true) or leaves the IP multicast group `group` on this link's address, so that frames sent to
    /// the group reach [`rx_burst`](Self::rx_burst) (a UD QP attached to a multicast GID, `roce_proto::mcast`; the
    /// IGMP/MLD join Linux's rdma_cm makes for RoCE). The driver joins when the first QP of the port attaches to the
    /// group and leaves when the last one detaches. Control path. The default, for links whose medium already
    /// delivers group-addressed frames to every port (the simulated link floods them), has nothing to do; a
    /// decorator passes it on.
    ///
    /// Errors: the backend's (see [`UdpLink::join_group`]).
    fn join_multicast(&mut self, group: std::net::IpAddr, join: bool) -> std::io::Result<()> {
        let _ = (group, join);
        Ok(())
    }

    /// Queues a gathered frame ([`roce_proto::Engine::poll_transmit_gather`]): the first `g.head` bytes of the
    /// buffer from the last [`tx_buf`](Self::tx_buf), then `segs[..g.segs]`, then `g.tail` bytes of the buffer at
    /// offset `g.head`. The default linearises it into the buffer (one copy of the payload) and calls
    /// [`tx_commit`](Self::tx_commit), which is what decorators (fault injection, pcap) and links that cannot
    /// gather get; [`UdpLink`] hands the pieces to `sendmmsg` as iovecs instead.
    ///
    /// # Safety
    ///
    /// Each of `segs[..g.segs]` must be readable for its `len` bytes until the next [`flush`](Self::flush) of
    /// this link returns (the engine guarantees it while the driver does not call `handle_frame` or deregister
    /// memory before that flush). A link never keeps a piece past `flush`: what it could not send, it copies into
    /// its own buffers first.
    unsafe fn tx_commit_gather(
        &mut self,
        now: Instant,
        g: TxGather,
        segs: &[TxSeg],
    ) -> Result<(), LinkError> {
        let buf = self.tx_buf(now)?;
        // SAFETY: the caller guarantees the pieces are readable now.
        let len = unsafe { linearize(buf, g, segs) }?;
        self.tx_commit(now, len)
    }

    /// Convenience: copies `frame` into a transmit buffer and commits it.
    fn transmit(&mut self, now: Instant, frame: &[u8]) -> Result<(), LinkError> {
        let mtu = self.caps().mtu;
        let buf = self.tx_buf(now)?;
        let Some(dst) = buf.get_mut(..frame.len()) else {
            return Err(LinkError::TooLong {
                len: frame.len(),
                mtu,
            });
        };
        dst.copy_from_slice(frame);
        self.tx_commit(now, frame.len())
    }
}

impl<L: Link + ?Sized> Link for Box<L> {
    fn caps(&self) -> LinkCaps {
        (**self).caps()
    }
    fn rx_burst(
        &mut self,
        now: Instant,
        max: usize,
        sink: &mut dyn FnMut(&mut [u8]),
    ) -> Result<usize, LinkError> {
        (**self).rx_burst(now, max, sink)
    }
    fn tx_buf(&mut self, now: Instant) -> Result<&mut [u8], LinkError> {
        (**self).tx_buf(now)
    }
    fn tx_commit(&mut self, now: Instant, len: usize) -> Result<(), LinkError> {
        (**self).tx_commit(now, len)
    }
    fn flush(&mut self, now: Instant) -> Result<(), LinkError> {
        (**self).flush(now)
    }
    unsafe fn tx_commit_gather(
        &mut self,
        now: Instant,
        g: TxGather,
        segs: &[TxSeg],
    ) -> Result<(), LinkError> {
        // SAFETY: the caller's guarantee is passed on unchanged.
        unsafe { (**self).tx_commit_gather(now, g, segs) }
    }
    fn poll_at(&self) -> Option<Instant> {
        (**self).poll_at()
    }
    fn wait_fd(&self) -> Option<std::os::fd::RawFd> {
        (**self).wait_fd()
    }
    fn counters(&self, f: &mut dyn FnMut(&'static str, u64)) {
        (**self).counters(f)
    }
    fn steer_service(&self, service_id: u64, listen: bool) -> std::io::Result<()> {
        (**self).steer_service(service_id, listen)
    }
    fn join_multicast(&mut self, group: std::net::IpAddr, join: bool) -> std::io::Result<()> {
        (**self).join_multicast(group, join)
    }
}

/// Makes the gathered frame `g` contiguous in `buf` (whose first `g.head + g.tail` bytes hold its headers and
/// trailer, see [`Link::tx_commit_gather`]): moves the trailer behind the payload and copies the pieces in. Returns
/// the frame length. [`LinkError::TooLong`] if the frame does not fit `buf` or `segs` has fewer than `g.segs`
/// pieces (nothing copied).
///
/// # Safety
///
/// Each of `segs[..g.segs]` must be readable for its `len` bytes and must not overlap `buf`.
pub unsafe fn linearize(buf: &mut [u8], g: TxGather, segs: &[TxSeg]) -> Result<usize, LinkError> {
    let pieces = segs.get(..g.segs).ok_or(LinkError::TooLong {
        len: usize::MAX,
        mtu: buf.len(),
    })?;
    // Checked: the lengths are the caller's (a wrapped sum would pass the length check).
    let len = pieces
        .iter()
        .try_fold(0usize, |a, s| a.checked_add(s.len))
        .and_then(|plen| g.head.checked_add(plen)?.checked_add(g.tail));
    let Some(len) = len.filter(|&l| l <= buf.len()) else {
        return Err(LinkError::TooLong {
            len: len.unwrap_or(usize::MAX),
            mtu: buf.len(),
        });
    };
    let plen = len - g.head - g.tail;
    buf.copy_within(g.head..g.head + g.tail, g.head + plen);
    // SAFETY: the caller guarantees every piece is readable and disjoint from `buf`.
    unsafe { copy_pieces(&mut buf[g.head..g.head + plen], pieces) };
    Ok(len)
}

/// Copies the pieces one after the other into `dst` (exactly their total length).
///
/// # Safety
///
/// As [`linearize`].
pub(crate) unsafe fn copy_pieces(dst: &mut [u8], pieces: &[TxSeg]) {
    let mut at = 0usize;
    for p in pieces {
        let Some(d) = at.checked_add(p.len).and_then(|end| dst.get_mut(at..end)) else {
            return;
        };
        // SAFETY: `p.ptr` is readable for `p.len` bytes (caller), `d` is exactly `p.len` writable bytes of `dst`,
        // and the two do not overlap (caller).
        unsafe { core::ptr::copy_nonoverlapping(p.ptr, d.as_mut_ptr(), p.len) };
        at += p.len;
    }
}

/// The earlier of two optional instants (`None` = never).
pub fn min_instant(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(x), Some(y)) => Some(x.min(y)),
        (x, None) => x,
        (None, y) => y,
    }
}

#[cfg(test)]
pub(crate) mod testutil {
    //! Golden frames from `testdata/spec/vectors.json` and the independent checker `check_pcap.py`.
    use std::path::PathBuf;

    pub(crate) fn testdata() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata")
    }

    fn unhex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
            .collect()
    }

    /// `(id, frame)` for every golden vector.
    pub(crate) fn vectors() -> Vec<(String, Vec<u8>)> {
        let text =
            std::fs::read_to_string(testdata().join("spec/vectors.json")).expect("vectors.json");
        let v: serde_json::Value = serde_json::from_str(&text).expect("json");
        v["vectors"]
            .as_array()
            .expect("vectors")
            .iter()
            .map(|x| {
                (
                    x["id"].as_str().unwrap_or("").to_owned(),
                    unhex(x["frame_hex"].as_str().expect("hex")),
                )
            })
            .collect()
    }

    /// Runs `check_pcap.py` on `file`; `None` if python3 is unavailable, else `(exit ok, last line)`.
    pub(crate) fn check_pcap(file: &std::path::Path) -> Option<(bool, String)> {
        let out = std::process::Command::new("python3")
            .arg(testdata().join("tools/check_pcap.py"))
            .arg("--quiet")
            .arg(file)
            .output()
            .ok()?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let last = text.lines().last().unwrap_or("").to_owned();
        Some((out.status.success(), last))
    }
}
