//! Reading pcap and pcapng capture files.
//!
//! The whole file is read into memory and walked with `pcap-file`'s slice parsers, so a
//! damaged file can be reported precisely (which record, why) instead of through an I/O
//! error from a buffered reader.
//!
//! The format is chosen by the first four bytes (the magic number):
//! * `a1b2c3d4` / `a1b23c4d` in either byte order: classic pcap (micro- / nanosecond
//!   timestamps);
//! * `0a0d0d0a`: pcapng (Section Header Block).
//!
//! Two `pcap-file` 2.0.0 behaviours are worked around here:
//! * its checked pcap record parser rejects records whose original length exceeds the
//!   snapshot length (every record of a capture taken with `-s 128` of longer frames), so
//!   records are read raw and validated here;
//! * its pcapng Enhanced Packet Block reader treats the 64-bit timestamp as nanoseconds
//!   whatever the interface's `if_tsresol`; the raw tick count is recovered and scaled by
//!   the interface's resolution (default 10^-6 s, pcapng spec §4.2).

use std::fmt;
use std::time::Duration;

use pcap_file::DataLink;
use pcap_file::pcap::PcapParser;
use pcap_file::pcapng::blocks::interface_description::InterfaceDescriptionOption;
use pcap_file::pcapng::{Block, PcapNgParser};
use pcap_file::{PcapError, TsResolution};

/// Link-layer header type of a capture (the pcap `LINKTYPE_*` value).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkType {
    /// `LINKTYPE_ETHERNET` (1): frames start at the destination MAC.
    Ethernet,
    /// `LINKTYPE_LINUX_SLL` (113): 16-byte Linux "cooked" header.
    LinuxSll,
    /// `LINKTYPE_LINUX_SLL2` (276): 20-byte Linux "cooked" v2 header.
    LinuxSll2,
    /// `LINKTYPE_RAW` (101), `LINKTYPE_IPV4` (228), `LINKTYPE_IPV6` (229): packets start at
    /// the IP header.
    RawIp,
    /// Anything else (the numeric `LINKTYPE_*` value).
    Unsupported(u32),
}

impl LinkType {
    fn from_datalink(link: DataLink) -> Self {
        match link {
            DataLink::ETHERNET => LinkType::Ethernet,
            DataLink::LINUX_SLL => LinkType::LinuxSll,
            DataLink::LINUX_SLL2 => LinkType::LinuxSll2,
            DataLink::RAW | DataLink::IPV4 | DataLink::IPV6 => LinkType::RawIp,
            other => LinkType::Unsupported(u32::from(other)),
        }
    }
}

impl fmt::Display for LinkType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LinkType::Ethernet => f.write_str("Ethernet (1)"),
            LinkType::LinuxSll => f.write_str("Linux cooked SLL (113)"),
            LinkType::LinuxSll2 => f.write_str("Linux cooked SLL2 (276)"),
            LinkType::RawIp => f.write_str("raw IP"),
            LinkType::Unsupported(n) => write!(f, "LINKTYPE {n}"),
        }
    }
}

/// Why a capture file cannot be read at all (exit status 2).
#[derive(Debug)]
pub enum OpenError {
    /// The file could not be read (missing, permission, ...).
    Io(std::io::Error),
    /// Fewer bytes than the smallest file header.
    TooShort(usize),
    /// The magic number is neither pcap nor pcapng.
    NotACapture(u32),
    /// The pcap global header or pcapng Section Header Block is invalid.
    BadHeader(String),
}

impl fmt::Display for OpenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OpenError::Io(e) => write!(f, "{e}"),
            OpenError::TooShort(n) => {
                write!(f, "file too short for a pcap/pcapng header ({n} bytes)")
            }
            OpenError::NotACapture(m) => {
                write!(f, "not a pcap or pcapng file (magic 0x{m:08x})")
            }
            OpenError::BadHeader(s) => write!(f, "bad capture header: {s}"),
        }
    }
}

/// One captured packet.
#[derive(Debug, Clone, Copy)]
pub struct Record<'a> {
    /// Time stamp since the Unix epoch.
    pub timestamp: Duration,
    /// Link-layer type of `data`.
    pub link: LinkType,
    /// Captured bytes (`data.len()` may be less than `orig_len` when the capture was
    /// snap-length limited).
    pub data: &'a [u8],
    /// Length of the packet on the wire.
    pub orig_len: u32,
}

/// A problem inside the file after its header (the records before it are still decoded).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordError {
    /// Byte offset of the damaged record or block in the file.
    pub offset: usize,
    /// What is wrong.
    pub reason: String,
}

impl fmt::Display for RecordError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "damaged capture at byte {}: {}",
            self.offset, self.reason
        )
    }
}

/// Capture container format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Classic libpcap.
    Pcap,
    /// pcapng.
    PcapNg,
}

/// A capture file held in memory.
#[derive(Debug)]
pub struct CaptureFile {
    bytes: Vec<u8>,
    format: Format,
}

const PCAPNG_MAGIC: u32 = 0x0a0d_0d0a;
const PCAP_MAGICS: [u32; 4] = [0xa1b2_c3d4, 0xd4c3_b2a1, 0xa1b2_3c4d, 0x4d3c_b2a1];

impl CaptureFile {
    /// Reads `path` and checks its file header.
    pub fn open(path: &std::path::Path) -> Result<Self, OpenError> {
        let bytes = std::fs::read(path).map_err(OpenError::Io)?;
        Self::from_bytes(bytes)
    }

    /// Wraps in-memory capture bytes, checking the magic number and file header.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Self, OpenError> {
        let magic_bytes: [u8; 4] = match bytes.get(..4).and_then(|b| b.try_into().ok()) {
            Some(m) => m,
            None => return Err(OpenError::TooShort(bytes.len())),
        };
        let magic = u32::from_be_bytes(magic_bytes);
        let format = if magic == PCAPNG_MAGIC {
            Format::PcapNg
        } else if PCAP_MAGICS.contains(&magic) {
            Format::Pcap
        } else {
            return Err(OpenError::NotACapture(magic));
        };
        match format {
            Format::Pcap => {
                if bytes.len() < 24 {
                    return Err(OpenError::TooShort(bytes.len()));
                }
                PcapParser::new(&bytes).map_err(|e| OpenError::BadHeader(e.to_string()))?;
            }
            Format::PcapNg => {
                PcapNgParser::new(&bytes).map_err(|e| OpenError::BadHeader(ng_error(&e)))?;
            }
        }
        Ok(CaptureFile { bytes, format })
    }

    /// Calls `f` for every packet record in file order; stops at the first damaged
    /// record or block and returns its description.
    pub fn for_each_record(&self, mut f: impl FnMut(Record<'_>)) -> Result<(), RecordError> {
        match self.format {
            Format::Pcap => self.walk_pcap(&mut f),
            Format::PcapNg => self.walk_pcapng(&mut f),
        }
    }

    fn walk_pcap(&self, f: &mut impl FnMut(Record<'_>)) -> Result<(), RecordError> {
        let total = self.bytes.len();
        let (mut rest, parser) = PcapParser::new(&self.bytes).map_err(|e| RecordError {
            offset: 0,
            reason: e.to_string(),
        })?;
        let header = parser.header();
        let link = LinkType::from_datalink(header.datalink);
        while !rest.is_empty() {
            let offset = total - rest.len();
            let (next, raw) = parser.next_raw_packet(rest).map_err(|e| RecordError {
                offset,
                reason: match e {
                    PcapError::IncompleteBuffer => {
                        "record extends past the end of the file (truncated capture)".into()
                    }
                    other => other.to_string(),
                },
            })?;
            let nanos = match header.ts_resolution {
                TsResolution::MicroSecond => u64::from(raw.ts_frac) * 1000,
                TsResolution::NanoSecond => u64::from(raw.ts_frac),
            };
            let timestamp =
                Duration::from_secs(u64::from(raw.ts_sec)) + Duration::from_nanos(nanos);
            f(Record {
                timestamp,
                link,
                data: &raw.data,
                orig_len: raw.orig_len,
            });
            rest = next;
        }
        Ok(())
    }

    fn walk_pcapng(&self, f: &mut impl FnMut(Record<'_>)) -> Result<(), RecordError> {
        let total = self.bytes.len();
        let (mut rest, mut parser) = PcapNgParser::new(&self.bytes).map_err(|e| RecordError {
            offset: 0,
            reason: ng_error(&e),
        })?;
        while !rest.is_empty() {
            let offset = total - rest.len();
            let (next, block) = parser.next_block(rest).map_err(|e| RecordError {
                offset,
                reason: ng_error(&e),
            })?;
            match block {
                Block::EnhancedPacket(epb) => {
                    let iface = parser
                        .interfaces()
                        .get(epb.interface_id as usize)
                        .ok_or_else(|| RecordError {
                            offset,
                            reason: format!(
                                "packet block names interface {} which was not described",
                                epb.interface_id
                            ),
                        })?;
                    // pcap-file stores the raw 64-bit tick count as nanoseconds.
                    let ticks = epb.timestamp.as_nanos();
                    f(Record {
                        timestamp: scale_ticks(ticks, tsresol(&iface.options)),
                        link: LinkType::from_datalink(iface.linktype),
                        data: &epb.data,
                        orig_len: epb.original_len,
                    });
                }
                Block::SimplePacket(spb) => {
                    let iface = parser.interfaces().first().ok_or_else(|| RecordError {
                        offset,
                        reason: "simple packet block before any interface description".into(),
                    })?;
                    f(Record {
                        timestamp: Duration::ZERO,
                        link: LinkType::from_datalink(iface.linktype),
                        data: &spb.data,
                        orig_len: spb.original_len,
                    });
                }
                Block::Packet(pb) => {
                    let iface = parser
                        .interfaces()
                        .get(usize::from(pb.interface_id))
                        .ok_or_else(|| RecordError {
                            offset,
                            reason: format!(
                                "packet block names interface {} which was not described",
                                pb.interface_id
                            ),
                        })?;
                    f(Record {
                        timestamp: scale_ticks(u128::from(pb.timestamp), tsresol(&iface.options)),
                        link: LinkType::from_datalink(iface.linktype),
                        data: &pb.data,
                        orig_len: pb.original_len,
                    });
                }
                _ => {}
            }
            rest = next;
        }
        Ok(())
    }
}

fn ng_error(e: &PcapError) -> String {
    match e {
        PcapError::IncompleteBuffer => "block extends past the end of the file (truncated)".into(),
        other => other.to_string(),
    }
}

/// The `if_tsresol` option of an interface: `(base, exponent)` meaning one tick is
/// `base^-exponent` seconds; base 10 or 2 (pcapng spec §4.2). Default 10^-6.
fn tsresol(options: &[InterfaceDescriptionOption<'_>]) -> (u32, u32) {
    for opt in options {
        if let InterfaceDescriptionOption::IfTsResol(v) = opt {
            let exp = u32::from(*v & 0x7f);
            return if *v & 0x80 != 0 { (2, exp) } else { (10, exp) };
        }
    }
    (10, 6)
}

/// Converts a tick count at resolution `base^-exp` seconds to a `Duration` (saturating).
fn scale_ticks(ticks: u128, (base, exp): (u32, u32)) -> Duration {
    let per_sec: u128 = match u128::from(base).checked_pow(exp) {
        Some(p) if p > 0 => p,
        _ => return Duration::ZERO,
    };
    let secs = ticks / per_sec;
    let frac = ticks % per_sec;
    let nanos = frac.saturating_mul(1_000_000_000) / per_sec;
    let secs = u64::try_from(secs).unwrap_or(u64::MAX);
    // `nanos < 1e9` because `frac < per_sec`.
    Duration::new(secs, u32::try_from(nanos).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tick_scaling() {
        assert_eq!(scale_ticks(1_500_000, (10, 6)), Duration::from_millis(1500));
        assert_eq!(
            scale_ticks(1_500_000_000, (10, 9)),
            Duration::from_millis(1500)
        );
        assert_eq!(scale_ticks(3, (2, 1)), Duration::from_millis(1500));
        assert_eq!(scale_ticks(5, (10, 200)), Duration::ZERO);
    }

    #[test]
    fn rejects_short_and_foreign_files() {
        assert!(matches!(
            CaptureFile::from_bytes(vec![1, 2]),
            Err(OpenError::TooShort(2))
        ));
        assert!(matches!(
            CaptureFile::from_bytes(b"hello world, this is text".to_vec()),
            Err(OpenError::NotACapture(0x6865_6c6c))
        ));
        // pcap magic but the global header is cut short.
        assert!(matches!(
            CaptureFile::from_bytes(vec![0xd4, 0xc3, 0xb2, 0xa1, 2, 0, 4, 0]),
            Err(OpenError::TooShort(8))
        ));
    }

    #[test]
    fn truncated_record_is_reported_after_good_ones() {
        let mut file = Vec::new();
        file.extend_from_slice(&[0xd4, 0xc3, 0xb2, 0xa1, 2, 0, 4, 0]);
        file.extend_from_slice(&[0; 8]);
        file.extend_from_slice(&65535u32.to_le_bytes());
        file.extend_from_slice(&1u32.to_le_bytes());
        // one complete 4-byte record
        for v in [7u32, 500_000, 4, 4] {
            file.extend_from_slice(&v.to_le_bytes());
        }
        file.extend_from_slice(&[1, 2, 3, 4]);
        // a record claiming 100 bytes with only 3 present
        for v in [8u32, 0, 100, 100] {
            file.extend_from_slice(&v.to_le_bytes());
        }
        file.extend_from_slice(&[1, 2, 3]);
        let cap = CaptureFile::from_bytes(file).expect("header is valid");
        let mut seen = Vec::new();
        let err = cap
            .for_each_record(|r| seen.push((r.timestamp, r.data.to_vec(), r.link)))
            .expect_err("second record is truncated");
        assert_eq!(
            seen,
            vec![(
                Duration::from_millis(7500),
                vec![1, 2, 3, 4],
                LinkType::Ethernet
            )]
        );
        assert_eq!(err.offset, 24 + 16 + 4);
    }
}
