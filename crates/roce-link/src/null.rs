//! A link that carries frames nowhere: the measuring stand of `rocev2 bench engine`.
//!
//! [`NullLink`] takes frames exactly as a real backend does ([`Link::tx_buf`] / [`Link::tx_commit`] /
//! [`Link::flush`]) and costs as little as a link can: per frame it parses the headers (Ethernet, IP, UDP, BTH:
//! lengths, UDP port 4791, a known opcode) and counts; every `check_every`-th frame (every frame with
//! `check_every = 1`) it also parses the whole frame with [`RoceRepr::parse`](roce_wire::RoceRepr::parse),
//! verifies the ICRC and hands the parsed frame to an optional checker (payload contents). A frame that fails any
//! of these is counted in [`NullStats::bad`]. After a flush the burst stays readable through
//! [`NullLink::flushed`] until the next `tx_buf`, so a test or a benchmark can deliver it to a peer engine (both
//! ends in one thread). Received frames are whatever the owner queued with [`NullLink::inject`].
//!
//! Nothing is allocated after construction (the transmit slots, the receive ring and its buffers are sized then).

use std::collections::VecDeque;

use roce_wire::{
    Bth, EtherType, EthernetFrame, Ipv4Packet, Ipv6Packet, ParsedFrame, ROCE_V2_PORT, RoceRepr,
    UdpPacket, bth, ipv4, ipv6, udp,
};

use crate::{IcrcCaps, Instant, Link, LinkCaps, LinkError, TxGather, TxSeg, linearize};

/// A payload checker: `true` if the parsed frame carries what it should.
pub type FrameCheck = Box<dyn FnMut(&ParsedFrame<'_>) -> bool>;

/// Counters of a [`NullLink`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NullStats {
    /// Frames committed.
    pub tx_frames: u64,
    /// Bytes committed.
    pub tx_bytes: u64,
    /// `flush` calls that handed over at least one frame.
    pub flushes: u64,
    /// Frames committed with [`Link::tx_commit_gather`].
    pub gathered_frames: u64,
    /// Payload bytes this link copied out of gathered pieces (full checks, [`NullLink::linearizing`]).
    pub linearized_bytes: u64,
    /// Frames that got the full check (whole-frame parse, ICRC, checker).
    pub full_checks: u64,
    /// Frames that failed a check (malformed headers, bad ICRC, checker said no).
    pub bad: u64,
    /// Frames delivered by `rx_burst`.
    pub rx_frames: u64,
}

/// The link of `rocev2 bench engine` (see the module docs).
pub struct NullLink {
    mtu: usize,
    /// `burst` transmit slots of `mtu` bytes each.
    slots: Vec<u8>,
    lens: Vec<usize>,
    /// Frames committed in the current burst.
    pending: usize,
    /// Frames of the last flush (readable through [`NullLink::flushed`]).
    flushed: usize,
    check_every: u64,
    check: Option<FrameCheck>,
    /// Copy gathered frames into the slot (so `flushed` can lend them whole).
    linearize: bool,
    rx: VecDeque<Vec<u8>>,
    rx_free: Vec<Vec<u8>>,
    stats: NullStats,
}

impl core::fmt::Debug for NullLink {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("NullLink")
            .field("mtu", &self.mtu)
            .field("burst", &self.lens.len())
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

/// The header walk every frame gets: Ethernet → IP → UDP (port 4791, lengths consistent) → BTH (known opcode).
fn headers_ok(frame: &[u8], len: usize) -> bool {
    let Ok(eth) = EthernetFrame::new_checked(frame) else {
        return false;
    };
    let ip_off = eth.header_len();
    let ip = &frame[ip_off..];
    let (udp_off, ip_end) = match eth.ethertype() {
        EtherType::IPV4 => match Ipv4Packet::new_checked(ip) {
            Ok(p) if p.protocol() == 17 => (
                ip_off + ipv4::HEADER_LEN,
                ip_off + usize::from(p.total_len()),
            ),
            _ => return false,
        },
        EtherType::IPV6 => match Ipv6Packet::new_checked(ip) {
            Ok(p) => (
                ip_off + ipv6::HEADER_LEN,
                ip_off + ipv6::HEADER_LEN + usize::from(p.payload_len()),
            ),
            _ => return false,
        },
        _ => return false,
    };
    if ip_end != len || frame.len() < udp_off + udp::HEADER_LEN + bth::HEADER_LEN {
        return false;
    }
    let u = UdpPacket::new_unchecked(&frame[udp_off..]);
    if u.dst_port() != ROCE_V2_PORT || udp_off + usize::from(u.len()) != ip_end {
        return false;
    }
    Bth::new_unchecked(&frame[udp_off + udp::HEADER_LEN..])
        .opcode()
        .info()
        .is_some()
}

impl NullLink {
    /// A link with `burst` transmit slots of `mtu` bytes (frame length incl. the Ethernet header) and room for
    /// `burst` injected receive frames; every `check_every`-th committed frame gets the full check (0 = never).
    pub fn new(mtu: usize, burst: usize, check_every: u64) -> NullLink {
        let burst = burst.max(1);
        NullLink {
            mtu,
            slots: vec![0; mtu * burst],
            lens: vec![0; burst],
            pending: 0,
            flushed: 0,
            check_every,
            check: None,
            linearize: false,
            rx: VecDeque::with_capacity(burst),
            rx_free: (0..burst).map(|_| Vec::with_capacity(mtu)).collect(),
            stats: NullStats::default(),
        }
    }

    /// Installs a payload checker for the fully checked frames.
    pub fn with_check(mut self, check: FrameCheck) -> NullLink {
        self.check = Some(check);
        self
    }

    /// Copies every gathered frame into its slot (one payload copy, the "wire"), so that [`flushed`](Self::flushed)
    /// can lend it to a peer engine. Without it a gathered frame is only parsed (headers) and, when it is due for
    /// the full check, copied for that.
    pub fn linearizing(mut self) -> NullLink {
        self.linearize = true;
        self
    }

    /// Counters.
    pub fn stats(&self) -> NullStats {
        self.stats
    }

    /// Queues a copy of `frame` for `rx_burst`. [`LinkError::Busy`] when `burst` frames are already queued,
    /// [`LinkError::TooLong`] above the MTU.
    pub fn inject(&mut self, frame: &[u8]) -> Result<(), LinkError> {
        if frame.len() > self.mtu {
            return Err(LinkError::TooLong {
                len: frame.len(),
                mtu: self.mtu,
            });
        }
        let Some(mut b) = self.rx_free.pop() else {
            return Err(LinkError::Busy);
        };
        b.clear();
        b.extend_from_slice(frame);
        self.rx.push_back(b);
        Ok(())
    }

    /// The frames handed over by the last [`flush`](Link::flush), in order (empty once `tx_buf` was called again).
    pub fn flushed(&self) -> impl Iterator<Item = &[u8]> + '_ {
        (0..self.flushed).map(|i| &self.slots[i * self.mtu..i * self.mtu + self.lens[i]])
    }

    fn check_frame(&mut self, i: usize) {
        let frame = &self.slots[i * self.mtu..i * self.mtu + self.lens[i]];
        let mut ok = headers_ok(frame, frame.len());
        let n = self.stats.tx_frames;
        if ok && self.check_every != 0 && n.is_multiple_of(self.check_every) {
            self.stats.full_checks += 1;
            ok = match RoceRepr::parse(frame) {
                Ok(p) => p.icrc_ok && self.check.as_mut().is_none_or(|c| c(&p)),
                Err(_) => false,
            };
        }
        if !ok {
            self.stats.bad += 1;
        }
    }
}

impl Link for NullLink {
    fn caps(&self) -> LinkCaps {
        LinkCaps {
            mtu: self.mtu,
            max_burst: self.lens.len(),
            icrc: IcrcCaps::default(),
            first_qpn: None,
        }
    }

    fn rx_burst(
        &mut self,
        _now: Instant,
        max: usize,
        sink: &mut dyn FnMut(&mut [u8]),
    ) -> Result<usize, LinkError> {
        let mut n = 0;
        while n < max {
            let Some(mut b) = self.rx.pop_front() else {
                break;
            };
            sink(&mut b);
            self.rx_free.push(b);
            n += 1;
        }
        self.stats.rx_frames += n as u64;
        Ok(n)
    }

    fn tx_buf(&mut self, _now: Instant) -> Result<&mut [u8], LinkError> {
        if self.pending == 0 {
            self.flushed = 0;
        }
        if self.pending == self.lens.len() {
            return Err(LinkError::Busy);
        }
        let i = self.pending;
        Ok(&mut self.slots[i * self.mtu..(i + 1) * self.mtu])
    }

    fn tx_commit(&mut self, _now: Instant, len: usize) -> Result<(), LinkError> {
        if self.pending == self.lens.len() {
            return Err(LinkError::NoTxBuffer);
        }
        if len > self.mtu {
            return Err(LinkError::TooLong { len, mtu: self.mtu });
        }
        let i = self.pending;
        self.lens[i] = len;
        self.check_frame(i);
        self.stats.tx_frames += 1;
        self.stats.tx_bytes += len as u64;
        self.pending += 1;
        Ok(())
    }

    unsafe fn tx_commit_gather(
        &mut self,
        _now: Instant,
        g: TxGather,
        segs: &[TxSeg],
    ) -> Result<(), LinkError> {
        if self.pending == self.lens.len() {
            return Err(LinkError::NoTxBuffer);
        }
        let i = self.pending;
        let plen: usize = segs.iter().take(g.segs).map(|p| p.len).sum();
        let len = g.head + plen + g.tail;
        let n = self.stats.tx_frames;
        let full = self.check_every != 0 && n.is_multiple_of(self.check_every);
        let slot = &mut self.slots[i * self.mtu..(i + 1) * self.mtu];
        if self.linearize || full {
            // SAFETY: the pieces are readable now (caller); the slot is this link's own memory.
            unsafe { linearize(slot, g, segs) }?;
            self.stats.linearized_bytes += plen as u64;
            self.stats.gathered_frames += 1;
            self.lens[i] = len;
            self.check_frame(i);
        } else {
            if len > self.mtu {
                return Err(LinkError::TooLong { len, mtu: self.mtu });
            }
            self.stats.gathered_frames += 1;
            self.lens[i] = len;
            // Only the headers are read; the payload's place in the slot holds stale bytes.
            if !headers_ok(&slot[..len], len) {
                self.stats.bad += 1;
            }
        }
        self.stats.tx_frames += 1;
        self.stats.tx_bytes += len as u64;
        self.pending += 1;
        Ok(())
    }

    fn flush(&mut self, _now: Instant) -> Result<(), LinkError> {
        if self.pending > 0 {
            self.stats.flushes += 1;
        }
        self.flushed = self.pending;
        self.pending = 0;
        Ok(())
    }

    fn poll_at(&self) -> Option<Instant> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::vectors;

    #[test]
    fn counts_good_and_bad_frames() {
        let (_, good) = vectors()
            .into_iter()
            .find(|(id, _)| id == "rc_send_only_v4")
            .expect("golden vector");
        let mut l = NullLink::new(256, 4, 1).with_check(Box::new(|p| p.payload.len() == 16));
        let now = Instant::ZERO;
        l.transmit(now, &good).unwrap();
        let mut bad_icrc = good.clone();
        let n = bad_icrc.len();
        bad_icrc[n - 5] ^= 1;
        l.transmit(now, &bad_icrc).unwrap();
        l.transmit(now, &good[..good.len() - 1]).unwrap(); // IP length disagrees
        l.flush(now).unwrap();
        assert_eq!(l.flushed().count(), 3);
        assert_eq!(l.flushed().next(), Some(&good[..]));
        let s = l.stats();
        assert_eq!((s.tx_frames, s.full_checks, s.bad, s.flushes), (3, 2, 2, 1));
        // A checker that refuses makes the frame bad too; only every 2nd frame is fully checked.
        let mut l = NullLink::new(256, 4, 2).with_check(Box::new(|_| false));
        l.transmit(now, &good).unwrap();
        l.transmit(now, &good).unwrap();
        assert_eq!((l.stats().full_checks, l.stats().bad), (1, 1));
        // Busy when every slot is taken; injected frames come back through rx_burst.
        l.transmit(now, &good).unwrap();
        l.transmit(now, &good).unwrap();
        assert!(matches!(l.tx_buf(now), Err(LinkError::Busy)));
        l.inject(&good).unwrap();
        let mut got = 0;
        assert_eq!(l.rx_burst(now, 8, &mut |f| got += f.len()).unwrap(), 1);
        assert_eq!(got, good.len());
    }
}
