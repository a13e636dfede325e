//! End-to-end tests of `rocev2 decode`, running the built binary.
//!
//! Reference data comes from `<workspace root>/testdata` (golden vectors, the
//! Soft-RoCE capture and the independent checker `check_pcap.py`).

mod common;

use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use pcap_file::DataLink;
use pcap_file::pcap::{PcapHeader, PcapPacket, PcapWriter};
use pcap_file::pcapng::PcapNgWriter;
use pcap_file::pcapng::blocks::enhanced_packet::EnhancedPacketBlock;
use pcap_file::pcapng::blocks::interface_description::{
    InterfaceDescriptionBlock, InterfaceDescriptionOption,
};
use serde_json::Value;

fn testdata() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata")
}

fn tmp(name: &str) -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("decode-{}-{name}", std::process::id()))
}

fn rocev2(args: &[&str]) -> Output {
    common::output_within(
        Command::new(env!("CARGO_BIN_EXE_rocev2")).args(args),
        common::SHORT,
    )
}

fn decode(path: &Path, json: bool) -> Output {
    let p = path.to_str().expect("utf-8 path");
    if json {
        rocev2(&["decode", "--json", p])
    } else {
        rocev2(&["decode", p])
    }
}

fn stdout_lines(out: &Output) -> Vec<String> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect()
}

fn json_lines(out: &Output) -> Vec<Value> {
    stdout_lines(out)
        .iter()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad JSON line {l:?}: {e}")))
        .collect()
}

struct Vector {
    id: String,
    frame: Vec<u8>,
    v: Value,
}

fn vectors() -> Vec<Vector> {
    let text = std::fs::read_to_string(testdata().join("spec/vectors.json")).expect("vectors.json");
    let doc: Value = serde_json::from_str(&text).expect("vectors.json parses");
    doc["vectors"]
        .as_array()
        .expect("vectors array")
        .iter()
        .map(|v| Vector {
            id: v["id"].as_str().expect("id").to_owned(),
            frame: hex(v["frame_hex"].as_str().expect("frame_hex")),
            v: v.clone(),
        })
        .collect()
}

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}

/// `"0x1f"` or `31` → 31.
fn num(v: &Value) -> u64 {
    match v {
        Value::Number(n) => n.as_u64().expect("unsigned"),
        Value::String(s) => {
            let s = s.trim_start_matches("0x");
            u64::from_str_radix(s, 16).unwrap_or_else(|_| panic!("not a hex number: {v}"))
        }
        _ => panic!("not a number: {v}"),
    }
}

fn write_pcap(path: &Path, frames: &[Vec<u8>]) {
    write_pcap_link(path, DataLink::ETHERNET, 0xffff, frames, usize::MAX);
}

/// A classic pcap with link type `datalink` and snapshot length `snaplen`; frame `i` is
/// stamped 1.25 s + i s and stored cut to `keep` bytes (its original length recorded).
fn write_pcap_link(path: &Path, datalink: DataLink, snaplen: u32, frames: &[Vec<u8>], keep: usize) {
    let header = PcapHeader {
        datalink,
        snaplen,
        ..Default::default()
    };
    let file = std::fs::File::create(path).expect("create pcap");
    let mut w = PcapWriter::with_header(file, header).expect("pcap header");
    for (i, f) in frames.iter().enumerate() {
        let ts = Duration::from_millis(1000 * i as u64 + 250);
        let data = &f[..f.len().min(keep)];
        w.write_packet(&PcapPacket::new(ts, f.len() as u32, data))
            .expect("write packet");
    }
}

/// A pcapng with one Ethernet interface. With `ns_ticks` the interface declares
/// `if_tsresol` = 9 (1 ns ticks); without it the option is absent, which means 1 µs ticks
/// (pcapng spec). Frame `i` is stamped 1.25 s + i s either way.
fn write_pcapng(path: &Path, frames: &[Vec<u8>], ns_ticks: bool) {
    let file = std::fs::File::create(path).expect("create pcapng");
    let mut w = PcapNgWriter::new(file).expect("pcapng section");
    let idb = InterfaceDescriptionBlock {
        linktype: DataLink::ETHERNET,
        snaplen: 0xffff,
        options: if ns_ticks {
            vec![InterfaceDescriptionOption::IfTsResol(9)]
        } else {
            vec![]
        },
    };
    w.write_pcapng_block(idb).expect("idb");
    for (i, f) in frames.iter().enumerate() {
        let ms = 1000 * i as u64 + 250;
        let epb = EnhancedPacketBlock {
            interface_id: 0,
            // pcap-file 2.0 writes `timestamp.as_nanos()` as the raw tick count.
            timestamp: if ns_ticks {
                Duration::from_millis(ms)
            } else {
                Duration::from_nanos(ms * 1000)
            },
            original_len: f.len() as u32,
            data: Cow::Borrowed(f),
            options: vec![],
        };
        w.write_pcapng_block(epb).expect("epb");
    }
}

/// Extension-header fields: (key in `vectors.json` "ext", object in our JSON, key inside
/// it — empty for a top-level integer).
const EXT_FIELDS: &[(&str, &str, &str)] = &[
    ("reth_va", "reth", "va"),
    ("reth_rkey", "reth", "rkey"),
    ("reth_dmalen", "reth", "dma_len"),
    ("aeth_syndrome", "aeth", "syndrome"),
    ("aeth_msn", "aeth", "msn"),
    ("immdt", "immdt", ""),
    ("deth_qkey", "deth", "qkey"),
    ("deth_src_qp", "deth", "src_qp"),
    ("atomic_va", "atomic_eth", "va"),
    ("atomic_rkey", "atomic_eth", "rkey"),
    ("swap", "atomic_eth", "swap_add"),
    ("add", "atomic_eth", "swap_add"),
    ("compare", "atomic_eth", "compare"),
];

/// Field-by-field comparison of one `--json` object with its `vectors.json` entry.
fn check_vector(vec: &Vector, got: &Value) {
    let id = &vec.id;
    let bth = &vec.v["bth"];
    let ext = &vec.v["ext"];
    let eq = |key: &str, want: u64| {
        assert_eq!(got[key].as_u64(), Some(want), "{id}: {key} in {got}");
    };
    let flag = |key: &str, want: &Value| {
        assert_eq!(
            got[key].as_bool(),
            Some(num(want) == 1),
            "{id}: {key} in {got}"
        );
    };
    eq("opcode", num(&bth["opcode"]));
    assert_eq!(got["opcode_name"], bth["opcode_name"], "{id}: opcode_name");
    eq("dest_qp", num(&bth["dest_qp"]));
    eq("psn", num(&bth["psn"]));
    flag("ack_req", &bth["ackreq"]);
    flag("se", &bth["se"]);
    flag("mig_req", &bth["m"]);
    flag("becn", &bth["becn"]);
    flag("fecn", &bth["fecn"]);
    eq("pad", num(&bth["padcnt"]));
    eq("pkey", num(&bth["pkey"]));
    eq("ip_version", num(&vec.v["ip_version"]));
    eq("ecn", num(&vec.v["ip_tos_or_tclass"]) & 3);
    eq("udp_sport", num(&vec.v["udp_sport"]));
    eq("payload_len", num(&vec.v["payload_len"]));
    assert_eq!(got["icrc_ok"], Value::Bool(true), "{id}: icrc_ok");
    assert!(
        got.get("error").is_none(),
        "{id}: unexpected error in {got}"
    );
    assert!(
        got.get("vlan").is_none(),
        "{id}: no VLAN tag in the vectors"
    );

    // Addresses, read straight from the frame bytes (untagged Ethernet, no IP options).
    let f = &vec.frame;
    let (src, dst) = if num(&vec.v["ip_version"]) == 4 {
        let a = |o: usize| std::net::Ipv4Addr::new(f[o], f[o + 1], f[o + 2], f[o + 3]).to_string();
        (a(26), a(30))
    } else {
        let a = |o: usize| {
            let b: [u8; 16] = f[o..o + 16].try_into().expect("16 bytes");
            std::net::Ipv6Addr::from(b).to_string()
        };
        (a(22), a(38))
    };
    assert_eq!(got["src_ip"].as_str(), Some(src.as_str()), "{id}: src_ip");
    assert_eq!(got["dst_ip"].as_str(), Some(dst.as_str()), "{id}: dst_ip");

    // Extension headers: every field the vector describes, and no header it does not.
    for (vec_key, obj, key) in EXT_FIELDS {
        let Some(want) = ext.get(*vec_key) else {
            continue;
        };
        let have = if key.is_empty() {
            &got[*obj]
        } else {
            &got[*obj][*key]
        };
        assert_eq!(
            have.as_u64(),
            Some(num(want)),
            "{id}: {obj}.{key} ({vec_key})"
        );
    }
    for obj in [
        "reth",
        "aeth",
        "immdt",
        "deth",
        "atomic_eth",
        "atomic_ack_eth",
        "ieth",
    ] {
        let described = EXT_FIELDS
            .iter()
            .any(|(vec_key, o, _)| *o == obj && ext.get(*vec_key).is_some());
        assert_eq!(got.get(obj).is_some(), described, "{id}: {obj} in {got}");
    }
}

#[test]
fn vectors_pcap_matches_vectors_json() {
    let vecs = vectors();
    let out = decode(&testdata().join("spec/vectors.pcap"), true);
    assert_eq!(
        out.status.code(),
        Some(0),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let objs = json_lines(&out);
    assert_eq!(objs.len(), vecs.len(), "one JSON object per vector");
    for (vec, got) in vecs.iter().zip(&objs) {
        check_vector(vec, got);
    }
}

#[test]
fn text_lines_name_addresses_and_ports() {
    // The text lines omitted them; each now carries what --json reports, tcpdump style.
    let file = testdata().join("spec/vectors.pcap");
    let text = stdout_lines(&decode(&file, false));
    let json = stdout_lines(&decode(&file, true));
    assert_eq!(text.len(), json.len());
    for (t, j) in text.iter().zip(&json) {
        let v: Value = serde_json::from_str(j).expect("json");
        let sock = |ip: &Value, port: &Value| {
            let ip: std::net::IpAddr = ip.as_str().expect("ip").parse().expect("ip");
            std::net::SocketAddr::new(ip, port.as_u64().expect("port") as u16).to_string()
        };
        let want = format!(
            " {} > {} ",
            sock(&v["src_ip"], &v["udp_sport"]),
            sock(&v["dst_ip"], &v["udp_dport"])
        );
        assert!(t.contains(&want), "{want:?} missing from {t:?}");
    }
}

#[test]
fn vectors_text_output_is_one_line_per_packet() {
    let vecs = vectors();
    let out = decode(&testdata().join("spec/vectors.pcap"), false);
    assert_eq!(out.status.code(), Some(0));
    let lines = stdout_lines(&out);
    assert_eq!(lines.len(), vecs.len());
    let first_send = lines
        .iter()
        .find(|l| l.contains("SEND_FIRST"))
        .expect("a SEND_FIRST line");
    // rc_send_first: RC SEND_FIRST to QP 0x12, PSN 100, 256 bytes.
    for part in [
        "RC SEND_FIRST",
        "qp=0x000012",
        "psn=0x000064",
        "len=256",
        "icrc=ok",
    ] {
        assert!(
            first_send.contains(part),
            "{part:?} missing from {first_send:?}"
        );
    }
    assert!(lines.iter().all(|l| l.contains("icrc=ok")), "{lines:#?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("24 RoCE"), "summary on stderr: {stderr}");
}

/// PSNs are printed in hex like QPNs (and like `rocev2 perf --stats` and `rocev2 stat`), and the BTH MigReq bit is
/// spelled out, not a bare `M` (issue #18 item 9); `decode --help` explains the flags of a line.
#[test]
fn text_psn_is_hex_and_migreq_is_named() {
    let mut frame = vector("rc_send_first");
    // BTH byte 1 bit 6 = MigReq (docs/spec/ROCEV2.md §1.5); the ICRC covers it, so refill it.
    frame[14 + 20 + 8 + 1] |= 0x40;
    roce_wire::icrc::fill(&mut frame[14..]).expect("ICRC refill");
    let path = tmp("migreq.pcap");
    write_pcap(&path, &[frame]);
    let out = decode(&path, false);
    let _ = std::fs::remove_file(&path);
    assert_eq!(out.status.code(), Some(0));
    let lines = stdout_lines(&out);
    assert_eq!(lines.len(), 1, "{lines:#?}");
    let l = &lines[0];
    assert!(l.contains(" psn=0x000064 "), "PSN 100 in hex: {l}");
    assert!(l.contains(" MigReq "), "MigReq named: {l}");
    assert!(!l.contains(" M "), "no bare M: {l}");
    let help = rocev2(&["decode", "--help"]);
    let help = String::from_utf8_lossy(&help.stdout);
    for word in ["MigReq", "SE", "BECN", "psn=", "hex"] {
        assert!(help.contains(word), "decode --help explains {word}: {help}");
    }
}

#[test]
fn pcapng_copy_decodes_like_pcap() {
    let vecs = vectors();
    let frames: Vec<Vec<u8>> = vecs.iter().map(|v| v.frame.clone()).collect();
    let classic = tmp("vectors.pcap");
    write_pcap(&classic, &frames);
    let b = decode(&classic, true);
    std::fs::remove_file(&classic).ok();
    assert_eq!(b.status.code(), Some(0));
    let b = json_lines(&b);
    for ns_ticks in [true, false] {
        let ng = tmp(&format!("vectors-{ns_ticks}.pcapng"));
        write_pcapng(&ng, &frames, ns_ticks);
        let a = decode(&ng, true);
        std::fs::remove_file(&ng).ok();
        let err = String::from_utf8_lossy(&a.stderr);
        assert_eq!(a.status.code(), Some(0), "{err}");
        let a = json_lines(&a);
        assert_eq!(a.len(), vecs.len());
        for ((vec, x), y) in vecs.iter().zip(&a).zip(&b) {
            check_vector(vec, x);
            // Same fields and the same time stamps (if_tsresol honoured).
            assert_eq!(x, y, "{}: pcapng and pcap decode differently", vec.id);
        }
        assert_eq!(a[2]["timestamp_ns"].as_u64(), Some(2_250_000_000));
    }
}

/// Decodes a capture of a good frame followed by `frame`: exit status 1, the good frame
/// reported good, the bad one reported with every string of `reasons` in its text line
/// and `json_reason` in its JSON `error`.
fn corrupt_case(name: &str, frame: Vec<u8>, reasons: &[&str], json_reason: &str) {
    let path = tmp(name);
    write_pcap(&path, &[vectors()[0].frame.clone(), frame]);
    let text = decode(&path, false);
    let json = decode(&path, true);
    std::fs::remove_file(&path).ok();
    assert_eq!(text.status.code(), Some(1), "{name}: exit status");
    assert_eq!(json.status.code(), Some(1), "{name}: exit status (json)");
    let lines = stdout_lines(&text);
    assert_eq!(lines.len(), 2, "{name}: {lines:#?}");
    assert!(
        lines[0].contains("icrc=ok"),
        "{name}: good frame first: {lines:#?}"
    );
    let objs = json_lines(&json);
    assert_eq!(objs.len(), 2);
    assert!(objs[0].get("error").is_none());
    let bad = &objs[1];
    let err = bad["error"].as_str().unwrap_or_default();
    assert!(
        err.contains(json_reason),
        "{name}: expected {json_reason:?} in {bad}"
    );
    for reason in reasons {
        assert!(
            lines[1].contains(reason),
            "{name}: expected {reason:?} in {:?}",
            lines[1]
        );
    }
}

fn vector(id: &str) -> Vec<u8> {
    vectors()
        .into_iter()
        .find(|v| v.id == id)
        .unwrap_or_else(|| panic!("vector {id}"))
        .frame
}

#[test]
fn flipped_payload_bit_fails_icrc() {
    let mut f = vector("rc_send_first");
    f[42 + 12 + 100] ^= 0x10;
    // Values confirmed by testdata/tools/check_pcap.py ("wire f663b16e expected
    // f7811c60", printed byte-swapped).
    corrupt_case(
        "flip.pcap",
        f,
        &["icrc=bad", "ICRC stored 0x6eb163f6, computed 0x601c81f7"],
        "ICRC stored 0x6eb163f6, computed 0x601c81f7",
    );
}

#[test]
fn wrong_pad_count_is_reported() {
    // An ACK carries no payload, so PadCnt must be 0 (ROCEV2.md §1.7).
    let mut f = vector("rc_ack");
    f[42 + 1] |= 0x30;
    corrupt_case(
        "pad.pcap",
        f,
        &[
            "malformed: pad count on an opcode without payload",
            "RC_ACKNOWLEDGE",
            "pad=3",
        ],
        "malformed: pad count on an opcode without payload",
    );
}

#[test]
fn wrong_udp_checksum_is_reported() {
    // The UDP checksum is masked out of the ICRC (ROCEV2.md §3), but Linux drops a
    // datagram whose non-zero checksum is wrong (§1.4).
    let mut f = vector("rc_send_only_v4");
    f[40..42].copy_from_slice(&[0x12, 0x34]);
    corrupt_case(
        "udpcsum.pcap",
        f,
        &["icrc=ok udpcsum=bad"],
        "bad UDP checksum 0x1234",
    );
}

#[test]
fn truncated_frame_is_reported() {
    let mut f = vector("rc_send_first");
    f.truncate(f.len() - 40);
    corrupt_case(
        "trunc.pcap",
        f,
        &[
            "truncated: IPv4 total length exceeds frame",
            "RC_SEND_FIRST",
        ],
        "truncated: IPv4 total length exceeds frame",
    );
}

#[test]
fn missing_and_garbage_files_exit_2() {
    let out = rocev2(&["decode", "/nonexistent/rocev2-no-such-file.pcap"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "one-line reason: {err}");
    assert!(err.contains("No such file"), "{err}");

    let garbage = tmp("garbage.pcap");
    std::fs::write(&garbage, b"this is not a capture file at all\n").expect("write");
    let out = decode(&garbage, false);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "one-line reason: {err}");
    assert!(err.contains("not a pcap"), "{err}");

    // A pcap magic number followed by a cut-off global header.
    std::fs::write(&garbage, [0xd4, 0xc3, 0xb2, 0xa1, 2, 0, 4, 0, 0, 0]).expect("write");
    let out = decode(&garbage, true);
    std::fs::remove_file(&garbage).ok();
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty());
}

/// The number of RoCE packets `check_pcap.py` accepted ("N passed, M failed").
fn check_pcap_counts(path: &Path) -> (u64, u64) {
    let out = Command::new("python3")
        .arg(testdata().join("tools/check_pcap.py"))
        .arg("--quiet")
        .arg(path)
        .output()
        .expect("python3 runs check_pcap.py");
    let text = String::from_utf8_lossy(&out.stdout);
    let last = text.lines().last().unwrap_or_default().to_owned();
    let words: Vec<&str> = last.split_whitespace().collect();
    match words.as_slice() {
        [p, "passed,", f, "failed", ..] => (p.parse().expect("count"), f.parse().expect("count")),
        _ => panic!("unexpected check_pcap.py output: {text}"),
    }
}

#[test]
fn softroce_capture_every_icrc_good() {
    let cap = testdata().join("interop/captures/rc_pingpong.pcap");
    let out = decode(&cap, true);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let objs = json_lines(&out);
    assert!(!objs.is_empty());
    for o in &objs {
        assert_eq!(o["icrc_ok"], Value::Bool(true), "{o}");
        assert!(o.get("error").is_none(), "{o}");
    }
    // Same packet count as the independent checker, which also passes them all.
    let (passed, failed) = check_pcap_counts(&cap);
    assert_eq!((objs.len() as u64, 0), (passed, failed));
}

#[test]
fn unsupported_link_type_is_named() {
    let path = tmp("linktype.pcap");
    write_pcap_link(
        &path,
        DataLink::IEEE802_11,
        0xffff,
        &[vector("rc_ack")],
        usize::MAX,
    );
    let out = decode(&path, false);
    std::fs::remove_file(&path).ok();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("unsupported link type"), "{err}");
    assert_ne!(out.status.code(), Some(0));
}

#[test]
fn raw_ip_capture_decodes() {
    let vecs = vectors();
    let path = tmp("rawip.pcap");
    let packets: Vec<Vec<u8>> = vecs.iter().map(|v| v.frame[14..].to_vec()).collect();
    write_pcap_link(&path, DataLink::RAW, 0xffff, &packets, usize::MAX);
    let out = decode(&path, true);
    std::fs::remove_file(&path).ok();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let objs = json_lines(&out);
    assert_eq!(objs.len(), vecs.len());
    for (v, o) in vecs.iter().zip(&objs) {
        check_vector(v, o);
    }
}

#[test]
fn non_roce_packets_are_skipped_and_counted() {
    let good = vector("rc_send_only_v4");
    // Same frame to UDP port 53: not RoCE v2 (ROCEV2.md §1.4: RoCE is UDP dst 4791).
    let mut dns = good.clone();
    dns[36..38].copy_from_slice(&53u16.to_be_bytes());
    // An ARP request (EtherType 0x0806).
    let mut arp = vec![0xff; 6];
    arp.extend_from_slice(&[2, 0, 0, 0, 0, 1, 0x08, 0x06]);
    arp.extend_from_slice(&[0, 1, 8, 0, 6, 4, 0, 1]);
    arp.resize(60, 0);
    let path = tmp("mixed.pcap");
    write_pcap(&path, &[arp, good, dns]);
    let out = decode(&path, false);
    std::fs::remove_file(&path).ok();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines = stdout_lines(&out);
    assert_eq!(lines.len(), 1, "{lines:#?}");
    assert!(lines[0].contains("RC SEND_ONLY"), "{lines:#?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("1 RoCE") && err.contains("2 non-RoCE"),
        "{err}"
    );
}

#[test]
fn snaplen_cut_frame_is_reported_with_capture_lengths() {
    let path = tmp("snaplen.pcap");
    write_pcap_link(
        &path,
        DataLink::ETHERNET,
        128,
        &[vector("rc_send_first")],
        128,
    );
    let out = decode(&path, false);
    std::fs::remove_file(&path).ok();
    assert_eq!(out.status.code(), Some(1));
    let lines = stdout_lines(&out);
    assert_eq!(lines.len(), 1);
    assert!(
        lines[0]
            .contains("truncated: IPv4 total length exceeds frame (capture kept 128 of 314 bytes)"),
        "{lines:?}"
    );
}

#[test]
fn linux_cooked_capture_decodes() {
    // `tcpdump -i any` style: 16-byte SLL header (packet type "outgoing", ARPHRD_ETHER,
    // 6-byte source address, protocol) instead of the Ethernet header.
    let vecs = vectors();
    let path = tmp("sll.pcap");
    let packets: Vec<Vec<u8>> = vecs
        .iter()
        .map(|v| {
            let mut pkt = vec![0, 4, 0, 1, 0, 6];
            pkt.extend_from_slice(&v.frame[6..12]);
            pkt.extend_from_slice(&[0, 0]);
            pkt.extend_from_slice(&v.frame[12..]);
            pkt
        })
        .collect();
    write_pcap_link(&path, DataLink::LINUX_SLL, 0xffff, &packets, usize::MAX);
    let out = decode(&path, true);
    std::fs::remove_file(&path).ok();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let objs = json_lines(&out);
    assert_eq!(objs.len(), vecs.len());
    for (v, o) in vecs.iter().zip(&objs) {
        check_vector(v, o);
    }
}

#[test]
fn tcp_capture_has_no_roce_packets() {
    // perftest's TCP out-of-band exchange: 41 packets, none of them RoCE.
    let cap = testdata().join("interop/captures/perftest_tcp_exchange.pcap");
    let out = decode(&cap, false);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(out.stdout.is_empty());
    assert!(
        err.contains("41 packets: 0 RoCE (0 bad), 41 non-RoCE"),
        "{err}"
    );
    assert_eq!(check_pcap_counts(&cap), (0, 0));
}

#[test]
fn snaplen_cut_non_roce_packet_is_not_reported() {
    // A long TCP segment cut to 60 bytes by the snap length fails IP length checks just
    // like a cut RoCE packet, but it is not RoCE: skipped, exit 0.
    let mut tcp = vector("rc_send_first");
    tcp[14 + 9] = 6;
    let path = tmp("tcpcut.pcap");
    write_pcap_link(&path, DataLink::ETHERNET, 60, &[tcp], 60);
    let out = decode(&path, false);
    std::fs::remove_file(&path).ok();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(out.stdout.is_empty());
    assert!(err.contains("0 RoCE (0 bad), 1 non-RoCE"), "{err}");
}
