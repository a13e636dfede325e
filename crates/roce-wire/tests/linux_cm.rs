//! The CM MADs Linux 6.1's ib_cm / rdma_cm sent over rxe (`testdata/interop/captures/rdmacm_rxe.pcap`: only the
//! guest's frames of `crates/roce-interop/tests/rdmacm.rs`, rdma_client, udaddy and the rejecting paths): every
//! frame parses with a good ICRC, every MAD parses as a CM MAD and re-emits byte for byte, and the fields read as
//! `docs/spec/INTEROP.md` §9 describes them (the `cma_hdr`, the REQ's path, SIDR, the REJ reason and the SIDR_REP
//! status Linux sends for a service nobody listens on).

mod common;

use std::net::{IpAddr, Ipv4Addr};

use common::{read_pcap, testdata_dir};
use roce_wire::cm::{CmMad, CmMessage, CmaHdr, PortSpace, service_id};
use roce_wire::*;

const GUEST: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 2);
const HOST: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);

#[test]
fn linux_cm_mads_parse_and_reemit() {
    let (linktype, frames) = read_pcap(&testdata_dir().join("interop/captures/rdmacm_rxe.pcap"));
    assert_eq!(linktype, 1, "Ethernet");
    let mut mads = Vec::new();
    for (i, f) in frames.iter().enumerate() {
        let p = RoceRepr::parse(f).unwrap_or_else(|e| panic!("frame {i}: {e}"));
        assert!(p.icrc_ok, "frame {i}: bad ICRC");
        if p.repr.bth.dest_qp != Qpn::new(1) {
            continue;
        }
        let deth = p.repr.ext.deth.expect("a MAD is a UD SEND with a DETH");
        assert_eq!(deth.qkey, 0x8001_0000, "frame {i}: the GSI Q_Key");
        assert_eq!(deth.src_qp, Qpn::new(1), "frame {i}: from the GSI");
        assert_eq!(p.repr.bth.pkey, 0xffff, "frame {i}");
        assert_eq!(p.payload.len(), 256, "frame {i}: a MAD is 256 bytes");
        let mad = CmMad::parse(p.payload).unwrap_or_else(|e| panic!("frame {i}: {e}"));
        assert_eq!(mad.header.class_version, 2, "frame {i}");
        let mut again = [0u8; 256];
        mad.emit(&mut again).unwrap();
        assert_eq!(&again[..], p.payload, "frame {i}: re-emitted MAD differs");
        mads.push(mad.message);
    }
    let names: Vec<&str> = mads.iter().map(|m| m.name()).collect();
    assert_eq!(
        names,
        [
            "REQ", "RTU", "DREQ", "SIDR_REQ", "REQ", "SIDR_REQ", "REJ", "SIDR_REP"
        ],
        "the guest's MADs in order"
    );
    let cma = |pd: &[u8]| {
        let h = CmaHdr::parse(pd).unwrap();
        assert_eq!(
            (h.src_addr, h.dst_addr),
            (IpAddr::V4(GUEST), IpAddr::V4(HOST))
        );
    };
    let CmMessage::Req(req) = mads[0] else {
        unreachable!()
    };
    // rdma_client's REQ (RDMA_PS_TCP, port 7471).
    assert_eq!(req.service_id, service_id(PortSpace::Tcp, 7471));
    assert_eq!(req.transport_service_type, cm::transport_type::RC);
    assert_eq!(
        (req.primary.local_lid, req.primary.remote_lid),
        (0xffff, 0xffff)
    );
    assert_eq!(req.primary.local_gid, Gid::from_ipv4(GUEST));
    assert_eq!(req.primary.remote_gid, Gid::from_ipv4(HOST));
    assert_eq!(req.primary.hop_limit, 64);
    assert_eq!(req.pkey, 0xffff);
    cma(&req.private_data);
    // udaddy's SIDR_REQ (RDMA_PS_UDP, port 7174).
    let CmMessage::SidrReq(sidr) = mads[3] else {
        unreachable!()
    };
    assert_eq!(sidr.service_id, service_id(PortSpace::Udp, 7174));
    cma(&sidr.private_data);
    // Linux's answers to our REQ and SIDR_REQ for an unlistened service: REJ reason 8, SIDR_REP status 1.
    let CmMessage::Rej(rej) = mads[6] else {
        unreachable!()
    };
    assert_eq!(rej.reason, cm::rej_reason::INVALID_SERVICE_ID);
    let CmMessage::SidrRep(rep) = mads[7] else {
        unreachable!()
    };
    assert_eq!(rep.status, cm::sidr_status::UNSUPPORTED);
}
