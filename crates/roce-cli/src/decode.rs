//! `rocev2 decode`: one line (or JSON object) per RoCE v2 packet of a capture.
//!
//! Every frame goes through [`roce_wire::RoceRepr::parse_explained`]; this module only
//! classifies the outcome, formats it and keeps the counts. Classification:
//! * parsed: a RoCE packet; good when the ICRC (`ROCEV2.md §3`), the IPv4 header
//!   checksum and a non-zero UDP checksum are right;
//! * `Error::NotRoce`: not IP/UDP to port 4791 — skipped and counted;
//! * `Error::Truncated` / `Error::Malformed`: reported with roce-wire's reason as a bad
//!   RoCE packet when the bytes that are present say UDP destination port 4791
//!   (`ROCEV2.md §1.4`), otherwise counted as non-RoCE (e.g. a TCP segment cut by the
//!   capture's snap length).

use std::fmt::Write as _;
use std::io::{self, Write};
use std::net::IpAddr;
use std::time::Duration;

use roce_wire::{
    BthRepr, Error, EtherType, EthernetFrame, IpRepr, Ipv4Packet, Ipv6Packet, ParsedFrame,
    ROCE_V2_PORT, RoceFrame, RoceRepr, UdpPacket, icrc, ipv4, ipv6, udp,
};
use serde_json::{Map, Value, json};

use crate::capture::{CaptureFile, Record};
use crate::link;

/// Output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// One human-readable line per RoCE packet.
    Text,
    /// One JSON object per RoCE packet per line.
    Json,
}

/// Counts over one capture; printed as the summary line on stderr.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Summary {
    /// Packet records read.
    pub records: u64,
    /// RoCE v2 packets (good or bad).
    pub roce: u64,
    /// RoCE packets that are malformed, truncated, or fail the ICRC, the IPv4 header
    /// checksum or a non-zero UDP checksum.
    pub roce_bad: u64,
    /// Packets that are not RoCE v2 (skipped).
    pub non_roce: u64,
    /// Packets whose link layer could not be handled (counted in `non_roce` too).
    pub link_errors: u64,
    /// The first link-layer problem, for the summary.
    pub first_link_error: Option<String>,
}

impl Summary {
    /// The stderr summary line.
    pub fn line(&self) -> String {
        let mut s = format!(
            "{} packets: {} RoCE ({} bad), {} non-RoCE skipped",
            self.records, self.roce, self.roce_bad, self.non_roce
        );
        if let Some(e) = &self.first_link_error {
            let _ = write!(
                s,
                "; {} with link-layer errors (first: {e})",
                self.link_errors
            );
        }
        s
    }
}

/// What one frame turned out to be (a short-lived value on the stack, so the size
/// difference between the variants does not matter).
#[allow(clippy::large_enum_variant)]
enum Outcome<'a> {
    /// A parsed RoCE packet (ICRC possibly bad).
    Roce(ParsedFrame<'a>),
    /// A RoCE packet that could not be parsed, with the reason.
    Bad(String),
    /// Not RoCE v2.
    NotRoce,
}

/// Decodes every record of `cap`, writing one line per RoCE packet to `out`.
/// Returns the counts and, if the file is damaged after its header, the problem.
pub fn run(
    cap: &CaptureFile,
    format: Format,
    out: &mut dyn Write,
) -> io::Result<(Summary, Option<crate::capture::RecordError>)> {
    let mut summary = Summary::default();
    let mut scratch = Vec::new();
    let mut first_ts: Option<Duration> = None;
    let mut io_result = Ok(());
    let walk = cap.for_each_record(|rec| {
        if io_result.is_err() {
            return;
        }
        summary.records += 1;
        let number = summary.records;
        let t0 = *first_ts.get_or_insert(rec.timestamp);
        let frame = match link::to_ethernet(rec.link, rec.data, &mut scratch) {
            Ok(f) => f,
            Err(e) => {
                summary.non_roce += 1;
                summary.link_errors += 1;
                summary
                    .first_link_error
                    .get_or_insert_with(|| e.to_string());
                return;
            }
        };
        let outcome = classify(frame, &rec);
        let line = match &outcome {
            Outcome::NotRoce => {
                summary.non_roce += 1;
                return;
            }
            Outcome::Roce(p) => {
                summary.roce += 1;
                if !frame_ok(p) {
                    summary.roce_bad += 1;
                }
                match format {
                    Format::Text => text_line(number, rec.timestamp, t0, p, frame),
                    Format::Json => json_good(number, rec.timestamp, p, frame).to_string(),
                }
            }
            Outcome::Bad(reason) => {
                summary.roce += 1;
                summary.roce_bad += 1;
                match format {
                    Format::Text => {
                        format!("{} error: {reason}", prefix(number, rec.timestamp, t0))
                    }
                    Format::Json => json_bad(number, rec.timestamp, reason).to_string(),
                }
            }
        };
        io_result = writeln!(out, "{line}");
    });
    io_result?;
    Ok((summary, walk.err()))
}

fn classify<'a>(frame: &'a [u8], rec: &Record<'_>) -> Outcome<'a> {
    let captured_short = rec.data.len() < rec.orig_len as usize;
    match RoceRepr::parse_explained(frame) {
        Ok(p) => Outcome::Roce(p),
        Err(r) if r.error == Error::NotRoce => Outcome::NotRoce,
        Err(r) => {
            if !udp_dport_is_roce(frame) {
                return Outcome::NotRoce;
            }
            // roce-wire's class and reason, e.g. "malformed: pad count on an opcode
            // without payload".
            let mut reason = r.to_string();
            if captured_short {
                let _ = write!(
                    reason,
                    " (capture kept {} of {} bytes)",
                    rec.data.len(),
                    rec.orig_len
                );
            }
            if let Some(ctx) = bth_context(frame) {
                let _ = write!(reason, "; {ctx}");
            }
            Outcome::Bad(reason)
        }
    }
}

/// Whether the bytes present say IPv4/IPv6 → UDP → destination port 4791, read with
/// roce-wire's views after explicit length checks (used only for frames the full parser
/// rejected, to tell a damaged RoCE packet from some other damaged packet).
fn udp_dport_is_roce(frame: &[u8]) -> bool {
    let Ok(eth) = EthernetFrame::new_checked(frame) else {
        return false;
    };
    let l3 = eth.payload();
    let udp_off = match eth.ethertype() {
        EtherType::IPV4 if l3.len() >= ipv4::HEADER_LEN => {
            let ip = Ipv4Packet::new_unchecked(l3);
            if ip.protocol() != ipv4::PROTOCOL_UDP {
                return false;
            }
            ip.header_len().max(ipv4::HEADER_LEN)
        }
        EtherType::IPV6 if l3.len() >= ipv6::HEADER_LEN => {
            if Ipv6Packet::new_unchecked(l3).next_header() != ipv4::PROTOCOL_UDP {
                return false;
            }
            ipv6::HEADER_LEN
        }
        _ => return false,
    };
    match l3.get(udp_off..udp_off + udp::HEADER_LEN) {
        Some(u) => UdpPacket::new_unchecked(u).dst_port() == ROCE_V2_PORT,
        None => false,
    }
}

/// The BTH fields of a frame the parser rejected, when the BTH bytes are present.
fn bth_context(frame: &[u8]) -> Option<String> {
    let rf = RoceFrame::new(frame).ok()?;
    let bth = rf.bth();
    let repr = BthRepr::parse(&bth).ok()?;
    Some(repr.to_string())
}

/// A parsed frame is good when the ICRC and both checksums are right (a receiver drops
/// it otherwise: rxe for the ICRC, the Linux IP/UDP stack for the checksums,
/// `ROCEV2.md §1.2`, §1.4, §3).
fn frame_ok(p: &ParsedFrame<'_>) -> bool {
    p.icrc_ok && p.ip_checksum_ok && p.udp_checksum_ok
}

fn prefix(number: u64, ts: Duration, t0: Duration) -> String {
    let rel = ts.saturating_sub(t0);
    format!("{number:>5} {}.{:06}", rel.as_secs(), rel.subsec_micros())
}

/// The frame's IP addresses.
fn ips(p: &ParsedFrame<'_>) -> (IpAddr, IpAddr) {
    match p.repr.ip {
        IpRepr::Ipv4(ip) => (ip.src_addr.into(), ip.dst_addr.into()),
        IpRepr::Ipv6(ip) => (ip.src_addr.into(), ip.dst_addr.into()),
    }
}

/// `src:port > dst:port` as tcpdump writes it (IPv6 addresses in brackets).
fn endpoints(p: &ParsedFrame<'_>) -> String {
    let (src, dst) = ips(p);
    let (sp, dp) = (p.repr.udp.src_port, p.repr.udp.dst_port);
    format!(
        "{} > {}",
        std::net::SocketAddr::new(src, sp),
        std::net::SocketAddr::new(dst, dp)
    )
}

fn text_line(number: u64, ts: Duration, t0: Duration, p: &ParsedFrame<'_>, frame: &[u8]) -> String {
    // The addresses, then roce-wire's one-line printer, e.g. `10.0.0.1:49152 > 10.0.0.2:4791 RC SEND_FIRST
    // qp=0x000012 psn=0x000064 A=0 pad=0 len=256 icrc=ok`; a failed ICRC gets the stored and computed values appended.
    let mut line = format!("{} {} {p}", prefix(number, ts, t0), endpoints(p));
    if !p.icrc_ok {
        let _ = write!(line, " ({})", icrc_mismatch(p, frame));
    }
    line
}

/// `"stored 0x…, computed 0x…"` for a frame whose ICRC failed.
fn icrc_mismatch(p: &ParsedFrame<'_>, frame: &[u8]) -> String {
    let ip = &frame[p.repr.eth.header_len()..];
    match icrc::compute(ip) {
        Ok(c) => format!("ICRC stored 0x{:08x}, computed 0x{c:08x}", p.icrc),
        Err(e) => format!("ICRC stored 0x{:08x}, not computable: {e}", p.icrc),
    }
}

fn json_good(number: u64, ts: Duration, p: &ParsedFrame<'_>, frame: &[u8]) -> Value {
    let r = &p.repr;
    let mut o = Map::new();
    o.insert("frame".into(), json!(number));
    o.insert("timestamp_ns".into(), json!(ts_ns(ts)));
    o.insert("opcode".into(), json!(r.bth.opcode.0));
    o.insert("opcode_name".into(), json!(r.bth.opcode.to_string()));
    o.insert("dest_qp".into(), json!(r.bth.dest_qp.value()));
    o.insert("psn".into(), json!(r.bth.psn.value()));
    o.insert("ack_req".into(), json!(r.bth.ack_req));
    o.insert("se".into(), json!(r.bth.solicited));
    o.insert("mig_req".into(), json!(r.bth.mig_req));
    o.insert("becn".into(), json!(r.bth.becn));
    o.insert("fecn".into(), json!(r.bth.fecn));
    o.insert("pad".into(), json!(r.bth.pad_count));
    o.insert("pkey".into(), json!(r.bth.pkey));
    let (src, dst) = ips(p);
    o.insert("ip_version".into(), json!(r.ip.version()));
    o.insert("src_ip".into(), json!(src.to_string()));
    o.insert("dst_ip".into(), json!(dst.to_string()));
    o.insert("dscp".into(), json!(r.ip.dscp()));
    o.insert("ecn".into(), json!(r.ip.ecn().bits()));
    o.insert("ttl".into(), json!(r.ip.hop_limit()));
    o.insert("udp_sport".into(), json!(r.udp.src_port));
    o.insert("udp_dport".into(), json!(r.udp.dst_port));
    o.insert("payload_len".into(), json!(r.payload_len));
    o.insert("icrc".into(), json!(p.icrc));
    o.insert("icrc_ok".into(), json!(p.icrc_ok));
    o.insert("ip_checksum_ok".into(), json!(p.ip_checksum_ok));
    o.insert("udp_checksum".into(), json!(p.udp_checksum));
    o.insert("udp_checksum_ok".into(), json!(p.udp_checksum_ok));
    if let Some(v) = r.eth.vlan {
        o.insert("vlan".into(), json!({ "vid": v.vid, "pcp": v.pcp }));
    }
    let e = &r.ext;
    if let Some(h) = e.reth {
        o.insert(
            "reth".into(),
            json!({ "va": h.va, "rkey": h.rkey, "dma_len": h.dma_len }),
        );
    }
    if let Some(h) = e.aeth {
        o.insert(
            "aeth".into(),
            json!({ "syndrome": h.syndrome.to_byte(), "msn": h.msn.value() }),
        );
    }
    if let Some(h) = e.immdt {
        o.insert("immdt".into(), json!(h.imm_data));
    }
    if let Some(h) = e.ieth {
        o.insert("ieth".into(), json!(h.rkey));
    }
    if let Some(h) = e.deth {
        o.insert(
            "deth".into(),
            json!({ "qkey": h.qkey, "src_qp": h.src_qp.value() }),
        );
    }
    if let Some(h) = e.atomic_eth {
        o.insert(
            "atomic_eth".into(),
            json!({ "va": h.va, "rkey": h.rkey, "swap_add": h.swap_add, "compare": h.compare }),
        );
    }
    if let Some(h) = e.atomic_ack_eth {
        o.insert("atomic_ack_eth".into(), json!({ "orig": h.orig_value }));
    }
    if let Some(h) = e.feth {
        o.insert("feth".into(), json!(h.word));
    }
    let mut errors = Vec::new();
    if !p.icrc_ok {
        errors.push(icrc_mismatch(p, frame));
    }
    if !p.ip_checksum_ok {
        errors.push("bad IPv4 header checksum".to_owned());
    }
    if !p.udp_checksum_ok {
        errors.push(format!("bad UDP checksum 0x{:04x}", p.udp_checksum));
    }
    if !errors.is_empty() {
        o.insert("error".into(), json!(errors.join("; ")));
    }
    Value::Object(o)
}

fn json_bad(number: u64, ts: Duration, reason: &str) -> Value {
    json!({ "frame": number, "timestamp_ns": ts_ns(ts), "icrc_ok": null, "error": reason })
}

fn ts_ns(ts: Duration) -> u64 {
    u64::try_from(ts.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use std::borrow::Cow;

    use pcap_file::DataLink;
    use pcap_file::pcapng::PcapNgWriter;
    use pcap_file::pcapng::blocks::enhanced_packet::EnhancedPacketBlock;
    use pcap_file::pcapng::blocks::interface_description::InterfaceDescriptionBlock;

    use super::*;

    /// The README's demo capture (19 RoCE frames of every kind, see
    /// `tests/example_capture.rs`).
    const EXAMPLE: &[u8] = include_bytes!("../../../examples/capture.pcap");

    /// The same frames as a pcapng file.
    fn example_pcapng() -> Vec<u8> {
        let cap = CaptureFile::from_bytes(EXAMPLE.to_vec()).expect("example is a capture");
        let mut frames = Vec::new();
        cap.for_each_record(|r| frames.push(r.data.to_vec()))
            .expect("example is intact");
        let mut w = PcapNgWriter::new(Vec::new()).expect("section header");
        w.write_pcapng_block(InterfaceDescriptionBlock {
            linktype: DataLink::ETHERNET,
            snaplen: 0xffff,
            options: vec![],
        })
        .expect("interface");
        for f in &frames {
            w.write_pcapng_block(EnhancedPacketBlock {
                interface_id: 0,
                timestamp: Duration::from_micros(1),
                original_len: f.len() as u32,
                data: Cow::Borrowed(f),
                options: vec![],
            })
            .expect("packet");
        }
        w.into_inner()
    }

    fn decode_bytes(bytes: Vec<u8>, format: Format) -> Option<(Summary, bool)> {
        let cap = CaptureFile::from_bytes(bytes).ok()?;
        let (summary, damage) = run(&cap, format, &mut io::sink()).expect("sink never fails");
        Some((summary, damage.is_some()))
    }

    #[test]
    fn intact_example_is_all_good() {
        for (bytes, name) in [(EXAMPLE.to_vec(), "pcap"), (example_pcapng(), "pcapng")] {
            let (s, damaged) = decode_bytes(bytes, Format::Json).expect(name);
            assert!(!damaged, "{name}");
            assert_eq!(
                (s.records, s.roce, s.roce_bad, s.non_roce),
                (19, 19, 0, 0),
                "{name}"
            );
        }
    }

    /// Damaged capture files (random byte changes anywhere, including the file and record
    /// headers, and random truncation) never make the decoder panic, and every record is
    /// accounted for.
    #[test]
    fn mutated_captures_never_panic() {
        // xorshift64: deterministic, no dependency.
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let originals = [EXAMPLE.to_vec(), example_pcapng()];
        let mut decoded = 0;
        for i in 0..3000 {
            let mut bytes = originals[i % 2].clone();
            for _ in 0..1 + next() % 4 {
                let at = (next() % bytes.len() as u64) as usize;
                bytes[at] ^= 1 << (next() % 8);
            }
            if next() % 4 == 0 {
                let keep = (next() % bytes.len() as u64) as usize;
                bytes.truncate(keep);
            }
            let format = if i % 3 == 0 {
                Format::Text
            } else {
                Format::Json
            };
            if let Some((s, _)) = decode_bytes(bytes, format) {
                assert_eq!(s.records, s.roce + s.non_roce);
                assert!(s.roce_bad <= s.roce);
                decoded += 1;
            }
        }
        // Most mutations leave the file header intact, so the records were walked.
        assert!(decoded > 2000, "{decoded}");
    }
}
