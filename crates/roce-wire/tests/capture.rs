//! The real Soft-RoCE capture (`testdata/interop/captures/rc_pingpong.pcap`,
//! rxe on both ends): every RoCE frame parses with a good ICRC and re-emits
//! byte for byte; everything else is reported as not RoCE.

mod common;

use common::{crosscheck_outer, read_pcap, reemit, testdata_dir};
use roce_wire::*;

#[test]
fn rc_pingpong_capture() {
    let (linktype, frames) = read_pcap(&testdata_dir().join("interop/captures/rc_pingpong.pcap"));
    assert_eq!(linktype, 1, "Ethernet");
    let mut roce = 0;
    let mut not_roce = 0;
    let mut opcodes = std::collections::BTreeMap::new();
    for (i, f) in frames.iter().enumerate() {
        match RoceRepr::parse(f) {
            Ok(p) => {
                roce += 1;
                assert!(p.icrc_ok, "frame {i}: bad ICRC: {p}");
                assert!(p.ip_checksum_ok, "frame {i}");
                assert_eq!(p.udp_checksum, 0, "frame {i}: rxe sends UDP checksum 0");
                assert!(p.udp_checksum_ok, "frame {i}");
                *opcodes.entry(p.repr.bth.opcode.name()).or_insert(0usize) += 1;
                let again = reemit(&p);
                assert_eq!(&again[..], &f[..p.frame_len], "frame {i}: re-emit differs");
                crosscheck_outer(f, &p);
                // The template path reproduces rxe's bytes too.
                let t = HeaderTemplate::from_repr(&p.repr);
                let hdr = PacketHeader {
                    opcode: p.repr.bth.opcode,
                    solicited: p.repr.bth.solicited,
                    ack_req: p.repr.bth.ack_req,
                    psn: p.repr.bth.psn,
                };
                let mut out = vec![0u8; p.frame_len];
                let n = t
                    .emit(&mut out, &hdr, &p.repr.ext, p.payload.len(), |b| {
                        b.copy_from_slice(p.payload)
                    })
                    .unwrap();
                assert_eq!(n, p.frame_len);
                assert_eq!(&out[..], &f[..n], "frame {i}: template output differs");
            }
            Err(Error::NotRoce) => not_roce += 1,
            Err(e) => panic!("frame {i}: {e}"),
        }
    }
    // tools/check_pcap.py reports 1046 RoCE packets in this capture.
    assert_eq!(roce, 1046, "{opcodes:?}");
    assert_eq!(roce + not_roce, frames.len());
    for name in [
        "RC_SEND_FIRST",
        "RC_SEND_MIDDLE",
        "RC_SEND_LAST",
        "RC_ACKNOWLEDGE",
    ] {
        assert!(opcodes.contains_key(name), "{name} missing: {opcodes:?}");
    }
}

#[test]
fn golden_pcap_matches_vectors() {
    let (linktype, frames) = read_pcap(&testdata_dir().join("spec/vectors.pcap"));
    assert_eq!(linktype, 1);
    let vs = common::vectors();
    assert_eq!(frames.len(), vs.len());
    for (f, v) in frames.iter().zip(&vs) {
        assert_eq!(f, &common::hex(v["frame_hex"].as_str().unwrap()));
        let p = RoceRepr::parse(f).unwrap();
        assert!(p.icrc_ok);
    }
}
