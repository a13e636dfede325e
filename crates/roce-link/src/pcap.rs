//! `Pcap<L, W>`: records every frame a link transmits and/or receives into a classic pcap file
//! (smoltcp `phy::PcapWriter`; `pcap-file` 2.0 per `DEPS.md`).
//!
//! The file uses the nanosecond-resolution magic (`0xa1b23c4d`), link type Ethernet (1), snap length 65535, and
//! timestamps taken from the engine clock (`now` of the call that moved the frame), so a capture of a simulated
//! run shows virtual time exactly. Transmitted frames are recorded at `tx_commit` as the engine wrote them
//! (before any decorator *inside* this one alters them); received frames as the inner link delivers them.

use std::io::Write;
use std::time::Duration;

use pcap_file::pcap::{PcapHeader, PcapPacket, PcapWriter};
use pcap_file::{DataLink, Endianness, TsResolution};

use crate::{Instant, Link, LinkCaps, LinkError};

/// Which directions to record.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PcapMode {
    /// Transmitted and received frames.
    #[default]
    Both,
    /// Transmitted frames only.
    TxOnly,
    /// Received frames only.
    RxOnly,
}

impl PcapMode {
    fn tx(self) -> bool {
        self != PcapMode::RxOnly
    }
    fn rx(self) -> bool {
        self != PcapMode::TxOnly
    }
}

/// The capturing decorator.
pub struct Pcap<L, W: Write> {
    inner: L,
    writer: PcapWriter<W>,
    mode: PcapMode,
    records: u64,
    /// Frames that could not be written to the capture (a full disk, a closed pipe). The frame itself goes on:
    /// a capture never changes what the link carries.
    write_errors: u64,
    tx_pending: bool,
}

impl<L, W: Write> core::fmt::Debug for Pcap<L, W> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Pcap")
            .field("mode", &self.mode)
            .field("records", &self.records)
            .finish_non_exhaustive()
    }
}

fn ts(now: Instant) -> Duration {
    Duration::from_nanos(now.as_nanos())
}

impl<L: Link, W: Write> Pcap<L, W> {
    /// Wraps `inner`, writing the pcap global header to `sink` at once.
    ///
    /// Errors: [`LinkError::Capture`] if the header cannot be written.
    pub fn new(inner: L, sink: W, mode: PcapMode) -> Result<Pcap<L, W>, LinkError> {
        let header = PcapHeader {
            version_major: 2,
            version_minor: 4,
            ts_correction: 0,
            ts_accuracy: 0,
            snaplen: 65535,
            datalink: DataLink::ETHERNET,
            ts_resolution: TsResolution::NanoSecond,
            endianness: Endianness::Little,
        };
        let writer = PcapWriter::with_header(sink, header)?;
        Ok(Pcap {
            inner,
            writer,
            mode,
            records: 0,
            write_errors: 0,
            tx_pending: false,
        })
    }

    /// Records written so far.
    pub fn records(&self) -> u64 {
        self.records
    }

    /// Frames the capture could not record (counted as `pcap_write_errors`; the first is logged). The frames were
    /// carried all the same.
    pub fn write_errors(&self) -> u64 {
        self.write_errors
    }

    /// The wrapped link.
    pub fn inner(&self) -> &L {
        &self.inner
    }

    /// The wrapped link, mutably.
    pub fn inner_mut(&mut self) -> &mut L {
        &mut self.inner
    }

    /// Unwraps into the link and the writer (flush the writer if it buffers).
    pub fn into_parts(self) -> (L, W) {
        (self.inner, self.writer.into_writer())
    }
}

fn record<W: Write>(w: &mut PcapWriter<W>, now: Instant, frame: &[u8]) -> Result<(), LinkError> {
    let len = u32::try_from(frame.len()).unwrap_or(u32::MAX);
    w.write_packet(&PcapPacket::new(ts(now), len, frame))?;
    Ok(())
}

/// Records `frame`, counting it in `records` or, when the writer fails, in `errors` (reported as the link counter
/// `pcap_write_errors`; `rocev2 perf` names it after the run).
fn capture<W: Write>(
    w: &mut PcapWriter<W>,
    now: Instant,
    frame: &[u8],
    records: &mut u64,
    errors: &mut u64,
) {
    match record(w, now, frame) {
        Ok(()) => *records += 1,
        Err(_) => *errors += 1,
    }
}

impl<L: Link, W: Write> Link for Pcap<L, W> {
    fn caps(&self) -> LinkCaps {
        self.inner.caps()
    }

    fn rx_burst(
        &mut self,
        now: Instant,
        max: usize,
        sink: &mut dyn FnMut(&mut [u8]),
    ) -> Result<usize, LinkError> {
        if !self.mode.rx() {
            return self.inner.rx_burst(now, max, sink);
        }
        let Pcap {
            inner,
            writer,
            records,
            write_errors,
            ..
        } = self;
        inner.rx_burst(now, max, &mut |frame: &mut [u8]| {
            capture(writer, now, frame, records, write_errors);
            sink(frame);
        })
    }

    fn tx_buf(&mut self, now: Instant) -> Result<&mut [u8], LinkError> {
        let buf = self.inner.tx_buf(now)?;
        self.tx_pending = true;
        Ok(buf)
    }

    fn tx_commit(&mut self, now: Instant, len: usize) -> Result<(), LinkError> {
        if !self.tx_pending {
            return Err(LinkError::NoTxBuffer);
        }
        if self.mode.tx() {
            let mtu = self.inner.caps().mtu;
            let buf = self.inner.tx_buf(now)?;
            let Some(frame) = buf.get(..len) else {
                return Err(LinkError::TooLong { len, mtu });
            };
            capture(
                &mut self.writer,
                now,
                frame,
                &mut self.records,
                &mut self.write_errors,
            );
        }
        self.tx_pending = false;
        self.inner.tx_commit(now, len)
    }

    fn flush(&mut self, now: Instant) -> Result<(), LinkError> {
        self.tx_pending = false;
        self.inner.flush(now)
    }

    fn poll_at(&self) -> Option<Instant> {
        self.inner.poll_at()
    }

    fn wait_fd(&self) -> Option<std::os::fd::RawFd> {
        self.inner.wait_fd()
    }

    fn counters(&self, f: &mut dyn FnMut(&'static str, u64)) {
        self.inner.counters(f);
        f("pcap_write_errors", self.write_errors);
    }

    fn steer_service(&self, service_id: u64, listen: bool) -> std::io::Result<()> {
        self.inner.steer_service(service_id, listen)
    }

    fn join_multicast(&mut self, group: std::net::IpAddr, join: bool) -> std::io::Result<()> {
        self.inner.join_multicast(group, join)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fault::{Fault, FaultConfig, Faulty};
    use crate::sim::{SimConfig, SimNet};
    use crate::testutil::{check_pcap, vectors};
    use pcap_file::pcap::PcapReader;

    fn tmp(name: &str) -> std::path::PathBuf {
        std::env::temp_dir().join(format!("roce-link-{}-{name}.pcap", std::process::id()))
    }

    /// Every golden vector sent A→B over the sim link; A records TX, B records RX.
    /// A writer that takes the 24-byte global header and then fails every write, as `/dev/full` does.
    struct FullAfterHeader(usize);

    impl Write for FullAfterHeader {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            if self.0 >= 24 {
                return Err(std::io::Error::from_raw_os_error(28));
            }
            let n = buf.len().min(24 - self.0);
            self.0 += n;
            Ok(n)
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// Breaker finding: a capture that could not be written (`--pcap /dev/full`) made `tx_commit` return before
    /// sending, so the run lost every frame and failed with RETRY_EXC_ERR. The frames are carried and the failures
    /// counted (`pcap_write_errors`), both ways.
    #[test]
    fn a_capture_that_cannot_be_written_never_drops_a_frame() {
        let cfg = SimConfig {
            bandwidth_bps: 0,
            ..SimConfig::default()
        };
        let (_net, a, b) = SimNet::pair(cfg, [2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2]);
        let mut a = Pcap::new(a, FullAfterHeader(0), PcapMode::TxOnly).unwrap();
        let mut b = Pcap::new(b, FullAfterHeader(0), PcapMode::Both).unwrap();
        let mut f = vectors()[0].1.clone();
        f[..6].copy_from_slice(&[2, 0, 0, 0, 0, 2]);
        for i in 0..3u64 {
            a.transmit(Instant::from_nanos(1000 + i), &f).unwrap();
        }
        let mut got = 0;
        while let Some(t) = b.poll_at() {
            got += b.rx_burst(t, usize::MAX, &mut |_| {}).unwrap();
        }
        assert_eq!(got, 3, "every frame carried");
        assert_eq!((a.write_errors(), b.write_errors()), (3, 3));
        let mut n = 0;
        a.counters(&mut |k, v| {
            if k == "pcap_write_errors" {
                n = v;
            }
        });
        assert_eq!(n, 3);
    }

    #[test]
    fn capture_passes_reader_and_checker() {
        let cfg = SimConfig {
            bandwidth_bps: 0,
            ..SimConfig::default()
        };
        let (_net, a, b) = SimNet::pair(cfg, [2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2]);
        let mut a = Pcap::new(a, Vec::new(), PcapMode::TxOnly).unwrap();
        let mut b = Pcap::new(b, Vec::new(), PcapMode::Both).unwrap();
        let vs = vectors();
        let mut sent = Vec::new();
        for (i, (_, f)) in vs.iter().enumerate() {
            // The vectors are addressed to 02:00:00:00:00:02 (or another unicast); force B's MAC.
            let mut f = f.clone();
            f[..6].copy_from_slice(&[2, 0, 0, 0, 0, 2]);
            a.transmit(Instant::from_nanos(1_000_000_007 + i as u64 * 1000), &f)
                .unwrap();
            sent.push(f);
        }
        let mut rx_times = Vec::new();
        let mut t = Instant::ZERO;
        while let Some(next) = b.poll_at() {
            t = next;
            b.rx_burst(t, usize::MAX, &mut |_| {}).unwrap();
            rx_times.push(t);
        }
        assert!(t > Instant::from_secs_1());
        assert_eq!(a.records(), vs.len() as u64);
        assert_eq!(b.records(), vs.len() as u64);
        let (_, abytes) = a.into_parts();
        let (_, bbytes) = b.into_parts();
        // Nanosecond magic, little endian.
        assert_eq!(&abytes[..4], &0xa1b2_3c4du32.to_le_bytes());
        for (bytes, first_ts) in [(&abytes, 1_000_000_007u64), (&bbytes, 1_000_001_007)] {
            let mut r = PcapReader::new(&bytes[..]).unwrap();
            let mut n = 0;
            while let Some(p) = r.next_packet() {
                let p = p.unwrap();
                assert_eq!(&p.data[..], &sent[n][..]);
                if n == 0 {
                    assert_eq!(p.timestamp.as_nanos(), u128::from(first_ts));
                }
                n += 1;
            }
            assert_eq!(n, sent.len());
        }
        let path = tmp("vectors");
        std::fs::write(&path, &bbytes).unwrap();
        if let Some((ok, last)) = check_pcap(&path) {
            assert!(ok, "check_pcap: {last}");
            assert_eq!(last, format!("{} passed, 0 failed", vs.len()));
        }
        let _ = std::fs::remove_file(&path);
    }

    trait Secs {
        fn from_secs_1() -> Instant;
    }
    impl Secs for Instant {
        fn from_secs_1() -> Instant {
            Instant::from_millis(1000)
        }
    }

    /// CE marking keeps the ICRC valid; corruption is caught by the independent checker.
    #[test]
    fn ce_marked_frames_pass_corrupted_fail() {
        let vs = vectors();
        let run = |fault: Fault| {
            let (_net, a, b) =
                SimNet::pair(SimConfig::default(), [2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2]);
            let mut a = Pcap::new(
                Faulty::new(a, FaultConfig::default(), FaultConfig::default(), 1),
                Vec::new(),
                PcapMode::TxOnly,
            )
            .unwrap();
            let mut b = Pcap::new(b, Vec::new(), PcapMode::RxOnly).unwrap();
            a.inner_mut()
                .script_tx(std::iter::repeat_n(fault, vs.len()));
            for (_, f) in &vs {
                let mut f = f.clone();
                f[..6].copy_from_slice(&[2, 0, 0, 0, 0, 2]);
                a.transmit(Instant::ZERO, &f).unwrap();
            }
            b.rx_burst(Instant::from_millis(1), usize::MAX, &mut |_| {})
                .unwrap();
            let stats = a.inner().tx_stats();
            (stats, b.into_parts().1)
        };
        let (ce, bytes) = run(Fault::MarkCe);
        assert!(ce.ce_marked > 0);
        let path = tmp("ce");
        std::fs::write(&path, &bytes).unwrap();
        if let Some((ok, last)) = check_pcap(&path) {
            assert!(
                ok,
                "CE-marked frames must keep a valid ICRC and IPv4 checksum: {last}"
            );
        }
        let (cor, bytes) = run(Fault::Corrupt);
        std::fs::write(&path, &bytes).unwrap();
        if let Some((ok, last)) = check_pcap(&path) {
            assert!(!ok);
            assert_eq!(
                last,
                format!("0 passed, {} failed", cor.corrupted),
                "every corrupted frame is caught"
            );
        }
        let _ = std::fs::remove_file(&path);
    }
}
