//! rocev2's connection manager (`roce_verbs::cm::ConnectionManager`, IB CM over QP 1) against Linux's rdma_cm and
//! ib_cm on rxe (kernel 6.1) in a Soft-RoCE guest, both roles, with Debian's unmodified librdmacm examples:
//!
//! * `guest_rdma_server`: the guest runs `rdma_server` (passive, `RDMA_PS_TCP` port 7471); the host connects an
//!   RC QP with a REQ whose private data starts with the rdma_cm address header (`cma_hdr`), sends 16 bytes,
//!   receives rdma_server's 16 bytes, and sees its DREQ.
//! * `guest_rdma_client`: the host listens on the same service ID and accepts; the guest's `rdma_client`
//!   connects, sends 16 bytes, gets 16 back and disconnects.
//! * `guest_udaddy_server` / `guest_udaddy_client`: SIDR against `udaddy` (`RDMA_PS_UDP` port 7174), both roles:
//!   the SIDR_REQ carries the `cma_hdr`, the SIDR_REP the service's UD QPN and `RDMA_UDP_QKEY`; then udaddy's 10
//!   SEND-with-immediate datagrams of 100 bytes each way (immediate = the sender's QPN, the reply address from the
//!   first receive's GRH), checked for length, immediate and source QP.
//! * `guest_ucmatose_client`: the guest's `ucmatose` connects to our listener; 10 messages of 100 bytes each way
//!   (ours first, as cmatose.c's server does), then our DREQ and Linux's DREP.
//! * `guest_rping_client`: the guest's `rping -c -v -V -S 1500` against our listener: we RDMA READ its buffer
//!   and RDMA WRITE the string back (two packets each way at PMTU 1024), rping verifies it; 3 iterations, then
//!   its DREQ.
//! * `rejects`: our listener rejects the guest's `rdma_client` (REJ reason 28 with private data: rdma_connect fails
//!   with ECONNREFUSED) and our CM answers `udaddy`'s SIDR_REQ for an unlistened service with status 1 (udaddy
//!   reports UNREACHABLE, error 1); Linux answers our REQ and SIDR_REQ for an unlistened guest service with REJ
//!   reason 8 and SIDR_REP status 1.
//! * `host_*` ([`PROG_CASES`], the product as users run it): Debian's unmodified `rping -v -V -C 10`, `udaddy`
//!   and `ib_send_bw` / `ib_write_bw` / `ib_read_lat -R` on the host under `rocev2 run --ip 198.18.0.1 --rx
//!   packet` (our libibverbs.so.1 and librdmacm.so.1, built by the test) against the same programs in the guest,
//!   host as server and as client, each judged by the program's own success criteria on both ends; each attempt
//!   starts when the guest holds no rdma_cm id. The perftest cases with the host as client run only when named
//!   in `SOFTROCE_CASES` ([`PERFTEST_CLIENT_RACE`]: perftest 4.5+0.17's second REQ races the TCG guest's second
//!   listen and its retry is broken).
//!
//! The exchange of rdma_server.c / rdma_client.c (rdma-core `librdmacm/examples`, read for facts): one 16-byte
//! SEND each way, the client first; the server posts its receive before accepting; both call `rdma_disconnect` at
//! the end and exit 0 ("end 0").
//!
//! Per case: both sides succeed; the host side's CM and engine refused nothing Linux sent (no CM MAD dropped as
//! malformed, unknown, unmatched or out of state, no frame failing the ICRC, P_Key or Q_Key checks); the capture of the bridge passes `testdata/tools/check_pcap.py` (ICRC of every
//! packet) and contains the CM MADs (REQ, REP, RTU, DREQ, DREP; SIDR_REQ, SIDR_REP for udaddy) as `tshark` sees
//! them, with no expert info of severity warning or error and nothing malformed (when tshark is installed; tshark
//! 4.0 names the SIDR MADs but does not dissect their fields).
//!
//! The host side must run inside namespace `roce-net`: the test re-runs this test binary there (`ip netns exec`)
//! with `ROCEV2_CM_AGENT` set, which makes the otherwise ignored test `host_agent` play that side.
//!
//! Runs when root with `/dev/net/tun`; otherwise it prints a loud SKIPPED line and passes. Artifacts in
//! `target/tmp/rdmacm-interop/<case>/`.

use std::fs;
use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use roce_interop::{Bg, Capture, Guest, HOST_IP, SoftRoce, check_pcap, run, say};

const GUEST: &str = "g1";
const GUEST_IP: &str = "198.18.0.2";
/// rdma_server / rdma_client's default port.
const PORT: u16 = 7471;
/// The bridge's fixed MAC (`softroce-vm netns`) and the guest's (`52:54:` + its IPv4 bytes).
const HOST_MAC: [u8; 6] = [0x52, 0x54, 0xc6, 0x12, 0x00, 0x01];
const GUEST_MAC: [u8; 6] = [0x52, 0x54, 0xc6, 0x12, 0x00, 0x02];
const AGENT_ENV: &str = "ROCEV2_CM_AGENT";
/// PID-file tag of the guest tool (`Guest::spawn_tracked`).
const GUEST_TAG: &str = "rdmacm-case";

// ---------------------------------------------------------------------------------------------------------------
// The host side (runs in the namespace, in a child process of this test binary)
// ---------------------------------------------------------------------------------------------------------------

mod agent {
    use super::*;
    use roce_link::{RxMode, UdpConfig, UdpLink};
    use roce_verbs::cm::{CmEvent, ConnId, ConnectionManager};
    use roce_verbs::*;
    use roce_wire::cm::{CmaHdr, PortSpace, service_id};

    const WAIT: Duration = Duration::from_secs(30);

    pub struct End {
        pub ctx: Context,
        pub cm: ConnectionManager,
        pub pd: Pd,
        pub cq: Cq,
        pub qp: Qp,
        pub buf: MrBuf,
        pub mr: Mr,
    }

    /// The device on 198.18.0.1 (frames received with AF_PACKET: rxe numbers its IPv4 identification, which a UDP
    /// socket would not show and the ICRC covers) and its CM, an RC QP, one CQ, a 4 KiB MR.
    pub fn open() -> End {
        let host: Ipv4Addr = HOST_IP.parse().unwrap();
        let cfg = EngineConfig {
            mac: HOST_MAC,
            gids: vec![Gid::from_ipv4(host.octets())],
            seed: u64::from(std::process::id()),
            ..EngineConfig::default()
        };
        let ctx = Context::open(cfg, RuntimeConfig::default(), move || {
            let u = UdpConfig {
                local_mac: HOST_MAC,
                peer_mac: GUEST_MAC,
                rx: RxMode::Packet,
                ..UdpConfig::new(IpAddr::V4(host))
            };
            Ok(Box::new(UdpLink::bind(u)?) as SendLink)
        })
        .expect("open the device on 198.18.0.1");
        let cm = ConnectionManager::open(&ctx).unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(64, None, Moderation::default()).unwrap();
        let cap = QpCap {
            max_send_wr: 16,
            max_recv_wr: 16,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 16,
        };
        let qp = pd.create_qp(QpType::Rc, &cq, &cq, cap, true).unwrap();
        let buf = MrBuf::new(4096).unwrap();
        let mr = pd.reg_mr(&buf, AccessFlags::LOCAL_WRITE).unwrap();
        End {
            ctx,
            cm,
            pd,
            cq,
            qp,
            buf,
            mr,
        }
    }

    /// Nothing Linux sent was refused: no CM MAD dropped as malformed, unknown, unmatched or out of state, no
    /// frame dropped by the engine's header, ICRC, P_Key or Q_Key checks. A wire incompatibility shows here even
    /// when retries hide it from the exchange. Prints the counters either way.
    pub fn assert_nothing_refused(e: &End) {
        let st = e.cm.stats().unwrap();
        let c = e.ctx.counters().unwrap();
        println!("CM stats {st:?}");
        let cm_drops = [
            ("drop_truncated", st.drop_truncated),
            ("drop_bad_base_version", st.drop_bad_base_version),
            ("drop_bad_class", st.drop_bad_class),
            ("drop_bad_class_version", st.drop_bad_class_version),
            ("drop_bad_method", st.drop_bad_method),
            ("drop_unknown_attr", st.drop_unknown_attr),
            ("drop_malformed", st.drop_malformed),
            ("drop_unmatched", st.drop_unmatched),
            ("drop_forged", st.drop_forged),
            ("drop_wrong_state", st.drop_wrong_state),
            ("drop_bad_transport", st.drop_bad_transport),
            ("engine rx_icrc_encapsulated", c.rx_icrc_encapsulated),
            ("engine drop_malformed", c.drop_malformed),
            ("engine drop_bad_opcode", c.drop_bad_opcode),
            ("engine drop_unknown_qp", c.drop_unknown_qp),
            ("engine drop_wrong_dest_ip", c.drop_wrong_dest_ip),
            ("engine drop_pkey_mismatch", c.drop_pkey_mismatch),
            ("engine drop_qkey_mismatch", c.drop_qkey_mismatch),
        ];
        let bad: Vec<_> = cm_drops.iter().filter(|(_, n)| *n > 0).collect();
        assert!(bad.is_empty(), "refused: {bad:?}");
    }

    pub fn event(e: &End) -> CmEvent {
        let ev =
            e.cm.get_event(WAIT)
                .unwrap()
                .expect("a CM event within 30 s");
        println!("event: {ev:?}");
        ev
    }

    pub fn poll_one(cq: &Cq) -> Wc {
        let mut wc = [Wc::default(); 1];
        let end = Instant::now() + WAIT;
        while Instant::now() < end {
            if cq.poll(&mut wc) == 1 {
                return wc[0];
            }
            thread::sleep(Duration::from_micros(200));
        }
        panic!("no completion within 30 s");
    }

    /// The 16 bytes this side sends: a recognisable pattern.
    pub fn message() -> [u8; 16] {
        *b"rocev2 cm hello!"
    }

    fn send16(e: &End) {
        e.mr.write(0, &message()).unwrap();
        e.qp.post_send(&[SendWr::new(1, SendOp::Send, &[e.mr.sge(0, 16)]).signaled()])
            .unwrap();
    }

    fn post_recv16(e: &End) {
        e.qp.post_recv(&[RecvWr {
            wr_id: 2,
            sg_list: &[e.mr.sge(1024, 16)],
        }])
        .unwrap();
    }

    fn expect_recv(wc: Wc) {
        assert_eq!(
            (wc.status, wc.opcode, wc.byte_len),
            (WcStatus::Success, WcOpcode::Recv, 16),
            "the peer's 16-byte SEND: {wc:?}"
        );
    }

    fn expect_send(wc: Wc) {
        assert_eq!(
            (wc.status, wc.opcode),
            (WcStatus::Success, WcOpcode::Send),
            "our 16-byte SEND: {wc:?}"
        );
    }

    /// Waits for the peer's DREQ (the CM answers it with a DREP and moves the QP to ERR); timewait's end is not
    /// waited for (it lasts seconds).
    fn expect_disconnected(e: &End, id: ConnId) {
        match event(e) {
            CmEvent::Disconnected { id: d } if d == id => {}
            other => panic!("expected the peer's disconnect, got {other:?}"),
        }
        assert_eq!(e.qp.query().unwrap().qp_state, QpState::Err);
    }

    /// Active side against the guest's `rdma_server`.
    pub fn client() {
        let e = open();
        let guest: Ipv4Addr = GUEST_IP.parse().unwrap();
        let host: Ipv4Addr = HOST_IP.parse().unwrap();
        let hdr = CmaHdr {
            src_port: 40000,
            src_addr: IpAddr::V4(host),
            dst_addr: IpAddr::V4(guest),
        };
        let mut pd = [0u8; roce_wire::cm::CMA_HDR_LEN];
        hdr.emit(&mut pd).unwrap();
        let sid = service_id(PortSpace::Tcp, PORT);
        let id =
            e.cm.connect(
                &e.qp,
                Gid::from_ipv4(guest.octets()),
                GUEST_MAC,
                sid,
                &pd,
                &ConnectOpts::default(),
            )
            .unwrap();
        match event(&e) {
            CmEvent::Established { id: i, .. } => assert_eq!(i, id),
            other => panic!("expected established, got {other:?}"),
        }
        println!("ESTABLISHED with QPN {}", e.qp.query().unwrap().dest_qp_num);
        post_recv16(&e);
        send16(&e);
        let (mut sent, mut got) = (false, false);
        while !(sent && got) {
            let wc = poll_one(&e.cq);
            match wc.opcode {
                WcOpcode::Send => {
                    expect_send(wc);
                    sent = true
                }
                _ => {
                    expect_recv(wc);
                    got = true
                }
            }
        }
        println!(
            "EXCHANGED 16 bytes each way; received {:02x?}",
            &e.buf.to_vec()[1024..1040]
        );
        expect_disconnected(&e, id);
        assert_nothing_refused(&e);
        println!("AGENT OK client");
        drop(e.ctx);
    }

    /// Passive side for the guest's `ucmatose` client (rdma-core `librdmacm/examples/cmatose.c`: the server sends
    /// its 10 messages of 100 bytes first, the client answers with 10, then the server disconnects and the client
    /// waits for DISCONNECTED): here our DREQ meets Linux's DREP.
    pub fn ucma_server() {
        let e = open();
        let sid = service_id(PortSpace::Tcp, PORT);
        e.cm.listen(sid).unwrap();
        println!("LISTENING on service ID {sid:#x}");
        let id = match event(&e) {
            CmEvent::ConnectRequest { id, .. } => id,
            other => panic!("expected a connect request, got {other:?}"),
        };
        e.cm.accept(id, &e.qp, &[], &ConnectOpts::default())
            .unwrap();
        for i in 0..10 {
            e.qp.post_recv(&[RecvWr {
                wr_id: 100 + i,
                sg_list: &[e.mr.sge(1024 + i * 100, 100)],
            }])
            .unwrap();
        }
        match event(&e) {
            CmEvent::Established { id: i, .. } => assert_eq!(i, id),
            other => panic!("expected established, got {other:?}"),
        }
        let msg: Vec<u8> = (0..100u32).map(|i| (i * 5 + 1) as u8).collect();
        e.mr.write(0, &msg).unwrap();
        for i in 0..10 {
            e.qp.post_send(&[SendWr::new(i, SendOp::Send, &[e.mr.sge(0, 100)]).signaled()])
                .unwrap();
        }
        let (mut sent, mut got) = (0, 0);
        while sent < 10 || got < 10 {
            let wc = poll_one(&e.cq);
            match wc.opcode {
                WcOpcode::Send => {
                    expect_send(wc);
                    sent += 1
                }
                _ => {
                    assert_eq!(
                        (wc.status, wc.opcode, wc.byte_len),
                        (WcStatus::Success, WcOpcode::Recv, 100),
                        "{wc:?}"
                    );
                    got += 1
                }
            }
        }
        println!("EXCHANGED 10 messages each way");
        e.cm.disconnect(id).unwrap();
        match event(&e) {
            CmEvent::Disconnected { id: i } => assert_eq!(i, id),
            other => panic!("expected disconnected (the DREP), got {other:?}"),
        }
        let st = e.cm.stats().unwrap();
        assert_eq!(st.timeouts, 0, "the DREQ was answered: {st:?}");
        assert_nothing_refused(&e);
        println!("AGENT OK ucma server");
    }

    /// Passive side for the guest's `rdma_client`.
    pub fn server() {
        let e = open();
        let sid = service_id(PortSpace::Tcp, PORT);
        e.cm.listen(sid).unwrap();
        println!("LISTENING on service ID {sid:#x}");
        let (id, private_data) = match event(&e) {
            CmEvent::ConnectRequest {
                id,
                service_id: s,
                private_data,
                ..
            } => {
                assert_eq!(s, sid);
                (id, private_data)
            }
            other => panic!("expected a connect request, got {other:?}"),
        };
        let hdr = CmaHdr::parse(&private_data).expect("the REQ carries a cma_hdr");
        println!("REQ cma_hdr {hdr:?}");
        assert_eq!(hdr.src_addr, IpAddr::V4(GUEST_IP.parse().unwrap()));
        assert_eq!(hdr.dst_addr, IpAddr::V4(HOST_IP.parse().unwrap()));
        e.cm.accept(id, &e.qp, &[], &ConnectOpts::default())
            .unwrap();
        post_recv16(&e);
        match event(&e) {
            CmEvent::Established { id: i, .. } => assert_eq!(i, id),
            other => panic!("expected established, got {other:?}"),
        }
        println!("ESTABLISHED with QPN {}", e.qp.query().unwrap().dest_qp_num);
        expect_recv(poll_one(&e.cq));
        send16(&e);
        expect_send(poll_one(&e.cq));
        println!(
            "EXCHANGED 16 bytes each way; received {:02x?}",
            &e.buf.to_vec()[1024..1040]
        );
        expect_disconnected(&e, id);
        assert_nothing_refused(&e);
        println!("AGENT OK server");
        drop(e.ctx);
    }
}

/// UD half of the agent.
/// rping's server side (rdma-core `librdmacm/examples/rping.c`, read for facts): per iteration the client SENDs a
/// 16-byte `rping_rdma_info` (buffer address as big-endian u64, rkey and size as big-endian u32) for its start
/// buffer; the server RDMA READs that many bytes, SENDs a 16-byte go-ahead; the client SENDs the info of its RDMA
/// buffer; the server RDMA WRITEs the string it read (with its NUL) there and SENDs a go-ahead; the client (with
/// `-V`) compares the two buffers. After `-C` iterations the client disconnects.
mod rping_agent {
    use super::agent::*;
    use super::*;
    use roce_verbs::cm::CmEvent;
    use roce_verbs::*;
    use roce_wire::cm::{PortSpace, service_id};
    use std::collections::VecDeque;

    /// rping -C on the guest side.
    pub const ITERS: usize = 3;
    const INFO: u64 = 1024;
    const GO: u64 = 1536;
    const DATA: u64 = 2048;

    /// Completions in arrival order, taken by opcode (a receive may arrive while a send completion is awaited).
    struct Wcs<'a> {
        cq: &'a Cq,
        stash: VecDeque<Wc>,
    }

    impl Wcs<'_> {
        fn next(&mut self, opcode: WcOpcode) -> Wc {
            loop {
                if let Some(i) = self.stash.iter().position(|w| w.opcode == opcode) {
                    let wc = self.stash.remove(i).unwrap();
                    assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
                    return wc;
                }
                let wc = poll_one(self.cq);
                assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
                self.stash.push_back(wc);
            }
        }
    }

    fn post_info_recv(e: &End) {
        e.qp.post_recv(&[RecvWr {
            wr_id: 7,
            sg_list: &[e.mr.sge(INFO, 16)],
        }])
        .unwrap();
    }

    /// Takes the client's next `rping_rdma_info`: (address, rkey, size).
    fn info(e: &End, wcs: &mut Wcs<'_>) -> (u64, u32, u32) {
        let wc = wcs.next(WcOpcode::Recv);
        assert_eq!(wc.byte_len, 16, "rping_rdma_info is 16 bytes");
        let b = e.buf.to_vec();
        let i = INFO as usize;
        let addr = u64::from_be_bytes(b[i..i + 8].try_into().unwrap());
        let rkey = u32::from_be_bytes(b[i + 8..i + 12].try_into().unwrap());
        let size = u32::from_be_bytes(b[i + 12..i + 16].try_into().unwrap());
        post_info_recv(e);
        (addr, rkey, size)
    }

    fn go_ahead(e: &End, wcs: &mut Wcs<'_>) {
        e.qp.post_send(&[SendWr::new(3, SendOp::Send, &[e.mr.sge(GO, 16)]).signaled()])
            .unwrap();
        wcs.next(WcOpcode::Send);
    }

    pub fn server() {
        let e = open();
        let sid = service_id(PortSpace::Tcp, PORT);
        e.cm.listen(sid).unwrap();
        println!("LISTENING on service ID {sid:#x}");
        let id = match event(&e) {
            CmEvent::ConnectRequest { id, .. } => id,
            other => panic!("expected a connect request, got {other:?}"),
        };
        e.cm.accept(id, &e.qp, &[], &ConnectOpts::default())
            .unwrap();
        post_info_recv(&e);
        match event(&e) {
            CmEvent::Established { id: i, .. } => assert_eq!(i, id),
            other => panic!("expected established, got {other:?}"),
        }
        let mut wcs = Wcs {
            cq: &e.cq,
            stash: VecDeque::new(),
        };
        for n in 0..ITERS {
            let (addr, rkey, size) = info(&e, &mut wcs);
            assert!(size as u64 <= 4096 - DATA, "rping -S {size} does not fit");
            e.qp.post_send(&[SendWr::new(
                1,
                SendOp::RdmaRead {
                    remote_addr: addr,
                    rkey: Rkey(rkey),
                },
                &[e.mr.sge(DATA, size)],
            )
            .signaled()])
                .unwrap();
            wcs.next(WcOpcode::RdmaRead);
            let data = e.buf.to_vec()[DATA as usize..(DATA + u64::from(size)) as usize].to_vec();
            let prefix = format!("rdma-ping-{n}: ");
            assert!(
                data.starts_with(prefix.as_bytes()),
                "the start buffer read: {:?}",
                String::from_utf8_lossy(&data[..32.min(data.len())])
            );
            let len = data.iter().position(|&c| c == 0).expect("a C string") + 1;
            go_ahead(&e, &mut wcs);
            let (addr, rkey, _) = info(&e, &mut wcs);
            e.qp.post_send(&[SendWr::new(
                2,
                SendOp::RdmaWrite {
                    remote_addr: addr,
                    rkey: Rkey(rkey),
                },
                &[e.mr.sge(DATA, len as u32)],
            )
            .signaled()])
                .unwrap();
            wcs.next(WcOpcode::RdmaWrite);
            go_ahead(&e, &mut wcs);
            println!("ITERATION {n}: read and wrote back {len} bytes");
        }
        match event(&e) {
            CmEvent::Disconnected { id: i } => assert_eq!(i, id),
            other => panic!("expected the client's disconnect, got {other:?}"),
        }
        assert_nothing_refused(&e);
        println!("AGENT OK rping server");
    }
}

/// The rejecting paths of both CMs.
mod reject_agent {
    use super::agent::*;
    use super::*;
    use roce_verbs::cm::CmEvent;
    use roce_verbs::*;
    use roce_wire::cm::{PortSpace, service_id};

    /// A port nobody listens on in the guest.
    const NOBODY: u16 = 7499;

    /// Listens on rdma_client's service and rejects its REQ with private data; then keeps the CM running for 15 s
    /// (udaddy's SIDR_REQ for an unlistened service is answered by the CM alone, status 1).
    pub fn reject() {
        let e = open();
        let sid = service_id(PortSpace::Tcp, PORT);
        e.cm.listen(sid).unwrap();
        println!("LISTENING on service ID {sid:#x}");
        let id = match event(&e) {
            CmEvent::ConnectRequest { id, .. } => id,
            other => panic!("expected a connect request, got {other:?}"),
        };
        e.cm.reject(id, b"rocev2 says no").unwrap();
        println!("REJECTED");
        if let Some(ev) = e.cm.get_event(Duration::from_secs(15)).unwrap() {
            panic!("no further event expected, got {ev:?}");
        }
        let st = e.cm.stats().unwrap();
        assert!(
            st.rej_no_listener_sent >= 1,
            "udaddy's SIDR_REQ was answered: {st:?}"
        );
        assert_nothing_refused(&e);
        println!("AGENT OK reject");
    }

    /// REQ and SIDR_REQ for a service nobody listens on in the guest: Linux answers with REJ reason 8 (invalid
    /// service ID) and SIDR_REP status 1 (unsupported).
    pub fn probe() {
        let e = open();
        let guest: Ipv4Addr = GUEST_IP.parse().unwrap();
        let gid = Gid::from_ipv4(guest.octets());
        let id =
            e.cm.connect(
                &e.qp,
                gid,
                GUEST_MAC,
                service_id(PortSpace::Tcp, NOBODY),
                &[],
                &ConnectOpts::default(),
            )
            .unwrap();
        match event(&e) {
            CmEvent::Rejected { id: i, reason, .. } => {
                assert_eq!((i, reason), (id, 8), "invalid service ID")
            }
            other => panic!("expected rejected, got {other:?}"),
        }
        let id =
            e.cm.sidr_resolve(gid, GUEST_MAC, service_id(PortSpace::Udp, NOBODY), &[], 0)
                .unwrap();
        match event(&e) {
            CmEvent::SidrRejected { id: i, status, .. } => {
                assert_eq!((i, status), (id, 1), "unsupported service ID")
            }
            other => panic!("expected SIDR rejected, got {other:?}"),
        }
        assert_nothing_refused(&e);
        println!("AGENT OK probe");
    }
}

/// udaddy's defaults (rdma-core `librdmacm/examples/udaddy.c`): port 7174, 10 messages of 100 bytes, sent as SEND
/// with immediate = the sender's QPN; the server answers to that QPN with its own Q_Key, through an address handle
/// made from the first receive's GRH.
mod ud_agent {
    use super::agent::*;
    use super::*;
    use roce_verbs::cm::{CmEvent, RDMA_UDP_QKEY};
    use roce_verbs::*;
    use roce_wire::cm::{CmaHdr, PortSpace, service_id};

    pub const UD_PORT: u16 = 7174;
    const UD_COUNT: u64 = 10;
    const UD_SIZE: u32 = 100;
    /// Receive slot size: the 40-byte GRH area and the message.
    const UD_SLOT: u64 = 40 + UD_SIZE as u64;

    /// A UD QP with rdma_cm's Q_Key for the UDP port space, ready, with `UD_COUNT` receives posted.
    fn ud_qp(e: &End, pd: &Pd) -> Qp {
        let cap = QpCap {
            max_send_wr: 16,
            max_recv_wr: 16,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        let qp = pd.create_qp(QpType::Ud, &e.cq, &e.cq, cap, false).unwrap();
        qp.ready_ud(RDMA_UDP_QKEY, Psn::new(0)).unwrap();
        for i in 0..UD_COUNT {
            qp.post_recv(&[RecvWr {
                wr_id: 100 + i,
                sg_list: &[e.mr.sge(i * UD_SLOT, UD_SLOT as u32)],
            }])
            .unwrap();
        }
        qp
    }

    /// Sends `UD_COUNT` messages of `UD_SIZE` bytes with immediate = our QPN (as udaddy does), the last signaled.
    fn send_all(e: &End, qp: &Qp, dest: UdDest) {
        let msg: Vec<u8> = (0..UD_SIZE).map(|i| (i * 3 + 7) as u8).collect();
        e.mr.write(3000, &msg).unwrap();
        for i in 0..UD_COUNT {
            let sg = [e.mr.sge(3000, UD_SIZE)];
            let mut wr = SendWr::new(
                i,
                SendOp::SendWithImm {
                    imm: qp.qpn().value(),
                },
                &sg,
            )
            .ud(dest);
            if i == UD_COUNT - 1 {
                wr = wr.signaled();
            }
            // The send queue holds 16: wait for room is not needed for 10.
            qp.post_send(&[wr]).unwrap();
        }
    }

    /// Takes `UD_COUNT` receive completions (and any send completion); returns the first receive.
    fn recv_all(e: &End) -> Wc {
        let mut first = None;
        let mut got = 0;
        while got < UD_COUNT {
            let wc = poll_one(&e.cq);
            assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
            if wc.opcode == WcOpcode::Recv {
                assert_eq!(wc.byte_len, 40 + UD_SIZE, "{wc:?}");
                assert!(wc.wc_flags.names().any(|n| n == "WITH_IMM"), "{wc:?}");
                assert_eq!(
                    wc.imm_data,
                    wc.src_qp.value(),
                    "udaddy's immediate is its QPN: {wc:?}"
                );
                first.get_or_insert(wc);
                got += 1;
            }
        }
        first.unwrap()
    }

    /// Active side against the guest's `udaddy` server: SIDR, then 10 datagrams each way.
    pub fn client() {
        let e = open();
        let pd = &e.pd;
        let qp = ud_qp(&e, pd);
        let guest: Ipv4Addr = GUEST_IP.parse().unwrap();
        let mut hdr = [0u8; roce_wire::cm::CMA_HDR_LEN];
        CmaHdr {
            src_port: 40001,
            src_addr: IpAddr::V4(HOST_IP.parse().unwrap()),
            dst_addr: IpAddr::V4(guest),
        }
        .emit(&mut hdr)
        .unwrap();
        let sid = service_id(PortSpace::Udp, UD_PORT);
        let id =
            e.cm.sidr_resolve(Gid::from_ipv4(guest.octets()), GUEST_MAC, sid, &hdr, 0)
                .unwrap();
        let (ah, qpn, qkey) = match event(&e) {
            CmEvent::SidrResolved {
                id: i,
                ah,
                qpn,
                qkey,
                ..
            } => {
                assert_eq!(i, id);
                (ah, qpn, qkey)
            }
            other => panic!("expected SIDR resolved, got {other:?}"),
        };
        assert_eq!(qkey, RDMA_UDP_QKEY, "Linux cma.c announces RDMA_UDP_QKEY");
        println!("RESOLVED QPN {qpn} Q_Key {qkey:#x}");
        let ah = pd.create_ah(&ah).unwrap();
        send_all(
            &e,
            &qp,
            UdDest {
                ah: ah.handle(),
                remote_qpn: qpn,
                remote_qkey: qkey,
            },
        );
        let first = recv_all(&e);
        assert_eq!(first.src_qp, qpn, "the replies come from the resolved QP");
        assert_nothing_refused(&e);
        println!("AGENT OK ud client");
    }

    /// Passive side for the guest's `udaddy -s 198.18.0.1`: answer its SIDR_REQ, take its 10 datagrams, reply.
    pub fn server() {
        let e = open();
        let pd = &e.pd;
        let qp = ud_qp(&e, pd);
        let sid = service_id(PortSpace::Udp, UD_PORT);
        e.cm.listen(sid).unwrap();
        println!("LISTENING on service ID {sid:#x}");
        let (id, private_data) = match event(&e) {
            CmEvent::SidrRequest {
                id,
                service_id: s,
                private_data,
                ..
            } => {
                assert_eq!(s, sid);
                (id, private_data)
            }
            other => panic!("expected a SIDR request, got {other:?}"),
        };
        let hdr = CmaHdr::parse(&private_data).expect("the SIDR_REQ carries a cma_hdr");
        println!("SIDR_REQ cma_hdr {hdr:?}");
        assert_eq!(hdr.dst_addr, IpAddr::V4(HOST_IP.parse().unwrap()));
        e.cm.sidr_accept(id, &qp, RDMA_UDP_QKEY, &[]).unwrap();
        let first = recv_all(&e);
        // The reply address from the first receive's GRH area (an IPv4 header in its last 20 bytes).
        let slot = (first.wr_id - 100) * UD_SLOT;
        let grh = &e.buf.to_vec()[slot as usize..slot as usize + 40];
        let src = Ipv4Addr::new(grh[32], grh[33], grh[34], grh[35]);
        assert_eq!(src, GUEST_IP.parse::<Ipv4Addr>().unwrap(), "GRH source");
        let ah = pd
            .create_ah(&AhAttr {
                dgid: Gid::from_ipv4(src.octets()),
                dmac: GUEST_MAC,
                hop_limit: 64,
                ..AhAttr::default()
            })
            .unwrap();
        send_all(
            &e,
            &qp,
            UdDest {
                ah: ah.handle(),
                remote_qpn: roce_wire::Qpn::new(first.imm_data),
                remote_qkey: RDMA_UDP_QKEY,
            },
        );
        let wc = poll_one(&e.cq);
        assert_eq!(
            (wc.status, wc.opcode),
            (WcStatus::Success, WcOpcode::Send),
            "{wc:?}"
        );
        assert_nothing_refused(&e);
        println!("AGENT OK ud server");
    }
}

/// The host side of a case, when this binary was started for it (`ROCEV2_CM_AGENT=client|server`); does nothing
/// otherwise (ignored in ordinary runs).
#[test]
#[ignore = "the host side of tests/rdmacm.rs, started by rdmacm_interop inside namespace roce-net"]
fn host_agent() {
    match std::env::var(AGENT_ENV).as_deref() {
        Ok("client") => agent::client(),
        Ok("server") => agent::server(),
        Ok("ud-client") => ud_agent::client(),
        Ok("ud-server") => ud_agent::server(),
        Ok("ucma-server") => agent::ucma_server(),
        Ok("reject") => reject_agent::reject(),
        Ok("rping-server") => rping_agent::server(),
        Ok("probe") => reject_agent::probe(),
        _ => {}
    }
}

// ---------------------------------------------------------------------------------------------------------------
// The driver
// ---------------------------------------------------------------------------------------------------------------

fn spawn_agent(sr: &SoftRoce, role: &str, dir: &Path) -> Result<Bg, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut c = sr.host_command(
        &exe,
        &[
            "--ignored",
            "--exact",
            "host_agent",
            "--nocapture",
            "--test-threads",
            "1",
        ],
    );
    c.env(AGENT_ENV, role);
    Bg::spawn(c, &dir.join("host"), &format!("host agent ({role})"))
}

/// Waits until the guest's rdma_cm has a listening id (`rdma resource show cm_id`).
fn wait_guest_listen(g: &Guest, server: &mut Bg) -> Result<(), String> {
    let end = Instant::now() + Duration::from_secs(60);
    while Instant::now() < end {
        if !server.running() {
            return Err("the guest's server program exited before listening".into());
        }
        let o = g.exec(20, "rdma resource show cm_id");
        if o.stdout.contains("LISTEN") {
            return Ok(());
        }
        thread::sleep(Duration::from_millis(500));
    }
    Err("the guest's server program did not listen within 60 s".into())
}

fn wait_host_listen(host: &mut Bg) -> Result<(), String> {
    let end = Instant::now() + Duration::from_secs(60);
    while Instant::now() < end {
        if host.stdout_so_far().contains("LISTENING") {
            return Ok(());
        }
        if !host.running() {
            return Err("the host agent exited before listening".into());
        }
        thread::sleep(Duration::from_millis(100));
    }
    Err("the host agent did not listen within 60 s".into())
}

/// CM attributes (`infiniband.mad.attributeid`) a connection's exchange must contain.
const CM_MADS: &[(u16, &str)] = &[
    (0x0010, "REQ"),
    (0x0013, "REP"),
    (0x0014, "RTU"),
    (0x0015, "DREQ"),
    (0x0016, "DREP"),
];

/// CM attributes of a SIDR exchange.
const SIDR_MADS: &[(u16, &str)] = &[(0x0017, "SIDR_REQ"), (0x0018, "SIDR_REP")];

/// tshark's view of the CM MADs in `pcap`: the attribute IDs of the CM-class MADs it dissected, and its expert
/// infos of severity warning or error on packets to QP 1 (the MADs). Data packets are not judged here: tshark
/// 4.0's payload heuristics call perftest's 4-byte SENDs "Malformed Packet: RPCoRDMA" whichever side sent them
/// (rxe's too; `INTEROP.md §6`), and their ICRC is `check_pcap.py`'s business. `None` when tshark is not
/// installed.
fn tshark_cm(pcap: &Path, dir: &Path) -> Option<(Vec<u16>, Vec<String>)> {
    Command::new("tshark").arg("--version").output().ok()?;
    let mut c = Command::new("tshark");
    c.arg("-r")
        .arg(pcap)
        .args(["-Y", "infiniband.mad.mgmtclass == 0x07", "-T", "fields"])
        .args(["-e", "infiniband.mad.attributeid"]);
    let o = run(
        c,
        &dir.join("tshark-cm"),
        "tshark",
        Duration::from_secs(120),
    );
    let attrs = o
        .stdout
        .lines()
        .filter_map(|l| {
            let l = l.trim();
            let v = l.trim_start_matches("0x");
            u16::from_str_radix(v, 16).ok().or_else(|| l.parse().ok())
        })
        .collect();
    let mut c = Command::new("tshark");
    c.arg("-r")
        .arg(pcap)
        .args([
            "-Y",
            "infiniband.bth.destqp == 1 && (_ws.expert.severity >= \"Warning\" || _ws.malformed)",
        ])
        .args([
            "-T",
            "fields",
            "-e",
            "frame.number",
            "-e",
            "_ws.expert.message",
        ]);
    let o2 = run(
        c,
        &dir.join("tshark-expert"),
        "tshark",
        Duration::from_secs(120),
    );
    let mut warnings: Vec<String> = o2
        .stdout
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(str::to_string)
        .collect();
    if !o2.ok() {
        warnings.push(format!("tshark failed: {}", o2.describe(5)));
    }
    let _ = fs::write(
        dir.join("tshark.txt"),
        format!("{}\n---\n{}", o.stdout, o2.stdout),
    );
    Some((attrs, warnings))
}

/// Checks a case's capture; returns the problems.
fn check_capture(sr: &SoftRoce, pcap: &Path, dir: &Path, mads: &[(u16, &str)]) -> Vec<String> {
    let mut p = Vec::new();
    let chk = check_pcap(sr.testdata(), pcap, Some(1024), &dir.join("check_pcap"));
    say(&format!(
        "    check_pcap.py: {} passed, {} failed",
        chk.passed, chk.failed
    ));
    for l in chk.bad.iter().take(20) {
        p.push(format!("check_pcap.py: {l}"));
    }
    if chk.rc != Some(0) {
        p.push(format!("check_pcap.py exit status {:?}", chk.rc));
    }
    match tshark_cm(pcap, dir) {
        None => say("    tshark not installed: dissection not checked"),
        Some((attrs, warnings)) => {
            say(&format!("    tshark: CM MAD attributes {attrs:x?}"));
            for (a, name) in mads {
                if !attrs.contains(a) {
                    p.push(format!("tshark saw no CM {name} MAD"));
                }
            }
            for w in warnings.iter().take(20) {
                p.push(format!("tshark expert info: {w}"));
            }
        }
    }
    p
}

fn case_guest_server(sr: &SoftRoce, g: &Guest, out: &Path) -> Vec<String> {
    let dir = out.join("guest_rdma_server");
    let _ = fs::create_dir_all(&dir);
    let mut p = Vec::new();
    let cap = match Capture::start(&dir.join("capture.pcap")) {
        Ok(c) => c,
        Err(e) => return vec![e],
    };
    let mut server = match g.spawn_tracked(
        90,
        &format!("rdma_server -s {GUEST_IP} -p {PORT}"),
        GUEST_TAG,
        &dir.join("guest"),
    ) {
        Ok(b) => b,
        Err(e) => return vec![e],
    };
    if let Err(e) = wait_guest_listen(g, &mut server) {
        g.kill_tracked(GUEST_TAG, "rdma_server");
        return vec![e, server.wait(Duration::from_secs(5)).describe(10)];
    }
    let host = match spawn_agent(sr, "client", &dir) {
        Ok(b) => b,
        Err(e) => return vec![e],
    };
    let h = host.wait(Duration::from_secs(90));
    let s = server.wait(Duration::from_secs(30));
    if s.timed_out || s.rc.is_none() {
        g.kill_tracked(GUEST_TAG, "rdma_server");
    }
    let (_, dropped) = cap.stop();
    say(&format!(
        "    host: {}",
        h.describe(6).replace('\n', "\n    ")
    ));
    say(&format!(
        "    guest: {}",
        s.describe(6).replace('\n', "\n    ")
    ));
    if !h.ok() || !h.stdout.contains("AGENT OK client") {
        p.push(format!("host side failed: {}", h.describe(25)));
    }
    if !s.ok() || !s.stdout.contains("end 0") {
        p.push(format!("rdma_server failed: {}", s.describe(10)));
    }
    if dropped > 0 {
        say(&format!("    tcpdump dropped {dropped} frames"));
    }
    p.extend(check_capture(sr, &dir.join("capture.pcap"), &dir, CM_MADS));
    p
}

fn case_guest_client(sr: &SoftRoce, g: &Guest, out: &Path) -> Vec<String> {
    let dir = out.join("guest_rdma_client");
    let _ = fs::create_dir_all(&dir);
    let mut p = Vec::new();
    let cap = match Capture::start(&dir.join("capture.pcap")) {
        Ok(c) => c,
        Err(e) => return vec![e],
    };
    let mut host = match spawn_agent(sr, "server", &dir) {
        Ok(b) => b,
        Err(e) => return vec![e],
    };
    if let Err(e) = wait_host_listen(&mut host) {
        return vec![e, host.wait(Duration::from_secs(5)).describe(20)];
    }
    let c = g.exec(60, &format!("rdma_client -s {HOST_IP} -p {PORT}"));
    let h = host.wait(Duration::from_secs(60));
    let (_, dropped) = cap.stop();
    say(&format!(
        "    host: {}",
        h.describe(6).replace('\n', "\n    ")
    ));
    say(&format!(
        "    guest: {}",
        c.describe(6).replace('\n', "\n    ")
    ));
    if !h.ok() || !h.stdout.contains("AGENT OK server") {
        p.push(format!("host side failed: {}", h.describe(25)));
    }
    if !c.ok() || !c.stdout.contains("end 0") {
        p.push(format!("rdma_client failed: {}", c.describe(10)));
    }
    if dropped > 0 {
        say(&format!("    tcpdump dropped {dropped} frames"));
    }
    p.extend(check_capture(sr, &dir.join("capture.pcap"), &dir, CM_MADS));
    p
}

fn case_guest_udaddy_server(sr: &SoftRoce, g: &Guest, out: &Path) -> Vec<String> {
    let dir = out.join("guest_udaddy_server");
    let _ = fs::create_dir_all(&dir);
    let mut p = Vec::new();
    let cap = match Capture::start(&dir.join("capture.pcap")) {
        Ok(c) => c,
        Err(e) => return vec![e],
    };
    let mut server = match g.spawn_tracked(
        90,
        &format!("udaddy -b {GUEST_IP}"),
        GUEST_TAG,
        &dir.join("guest"),
    ) {
        Ok(b) => b,
        Err(e) => return vec![e],
    };
    if let Err(e) = wait_guest_listen(g, &mut server) {
        g.kill_tracked(GUEST_TAG, "udaddy");
        return vec![e, server.wait(Duration::from_secs(5)).describe(10)];
    }
    let host = match spawn_agent(sr, "ud-client", &dir) {
        Ok(b) => b,
        Err(e) => return vec![e],
    };
    let h = host.wait(Duration::from_secs(90));
    let s = server.wait(Duration::from_secs(30));
    if s.timed_out || s.rc.is_none() {
        g.kill_tracked(GUEST_TAG, "udaddy");
    }
    let (_, dropped) = cap.stop();
    say(&format!(
        "    host: {}",
        h.describe(6).replace('\n', "\n    ")
    ));
    say(&format!(
        "    guest: {}",
        s.describe(6).replace('\n', "\n    ")
    ));
    if !h.ok() || !h.stdout.contains("AGENT OK ud client") {
        p.push(format!("host side failed: {}", h.describe(25)));
    }
    if !s.ok() || !s.stdout.contains("return status 0") {
        p.push(format!("udaddy (server) failed: {}", s.describe(10)));
    }
    if dropped > 0 {
        say(&format!("    tcpdump dropped {dropped} frames"));
    }
    p.extend(check_capture(
        sr,
        &dir.join("capture.pcap"),
        &dir,
        SIDR_MADS,
    ));
    p
}

fn case_guest_udaddy_client(sr: &SoftRoce, g: &Guest, out: &Path) -> Vec<String> {
    let dir = out.join("guest_udaddy_client");
    let _ = fs::create_dir_all(&dir);
    let mut p = Vec::new();
    let cap = match Capture::start(&dir.join("capture.pcap")) {
        Ok(c) => c,
        Err(e) => return vec![e],
    };
    let mut host = match spawn_agent(sr, "ud-server", &dir) {
        Ok(b) => b,
        Err(e) => return vec![e],
    };
    if let Err(e) = wait_host_listen(&mut host) {
        return vec![e, host.wait(Duration::from_secs(5)).describe(20)];
    }
    let c = g.exec(60, &format!("udaddy -s {HOST_IP}"));
    let h = host.wait(Duration::from_secs(60));
    let (_, dropped) = cap.stop();
    say(&format!(
        "    host: {}",
        h.describe(6).replace('\n', "\n    ")
    ));
    say(&format!(
        "    guest: {}",
        c.describe(6).replace('\n', "\n    ")
    ));
    if !h.ok() || !h.stdout.contains("AGENT OK ud server") {
        p.push(format!("host side failed: {}", h.describe(25)));
    }
    if !c.ok() || !c.stdout.contains("return status 0") {
        p.push(format!("udaddy (client) failed: {}", c.describe(10)));
    }
    if dropped > 0 {
        say(&format!("    tcpdump dropped {dropped} frames"));
    }
    p.extend(check_capture(
        sr,
        &dir.join("capture.pcap"),
        &dir,
        SIDR_MADS,
    ));
    p
}

/// The guest's `ucmatose` client against our listener; we disconnect (DREQ from us, DREP from Linux).
fn case_guest_ucmatose_client(sr: &SoftRoce, g: &Guest, out: &Path) -> Vec<String> {
    let dir = out.join("guest_ucmatose_client");
    let _ = fs::create_dir_all(&dir);
    let mut p = Vec::new();
    let cap = match Capture::start(&dir.join("capture.pcap")) {
        Ok(c) => c,
        Err(e) => return vec![e],
    };
    let mut host = match spawn_agent(sr, "ucma-server", &dir) {
        Ok(b) => b,
        Err(e) => return vec![e],
    };
    if let Err(e) = wait_host_listen(&mut host) {
        return vec![e, host.wait(Duration::from_secs(5)).describe(20)];
    }
    let c = g.exec(60, &format!("ucmatose -s {HOST_IP} -p {PORT}"));
    let h = host.wait(Duration::from_secs(60));
    let (_, dropped) = cap.stop();
    say(&format!(
        "    host: {}",
        h.describe(6).replace('\n', "\n    ")
    ));
    say(&format!(
        "    guest: {}",
        c.describe(6).replace('\n', "\n    ")
    ));
    if !h.ok() || !h.stdout.contains("AGENT OK ucma server") {
        p.push(format!("host side failed: {}", h.describe(25)));
    }
    if !c.ok() || !c.stdout.contains("return status 0") {
        p.push(format!("ucmatose (client) failed: {}", c.describe(10)));
    }
    if dropped > 0 {
        say(&format!("    tcpdump dropped {dropped} frames"));
    }
    p.extend(check_capture(sr, &dir.join("capture.pcap"), &dir, CM_MADS));
    p
}

/// The guest's `rping -c -v -V` against our listener: RDMA READ of its buffer and RDMA WRITE back (1500 bytes, two
/// packets each way at PMTU 1024), verified by rping itself; it disconnects (DREQ from Linux).
fn case_guest_rping_client(sr: &SoftRoce, g: &Guest, out: &Path) -> Vec<String> {
    let dir = out.join("guest_rping_client");
    let _ = fs::create_dir_all(&dir);
    let mut p = Vec::new();
    let cap = match Capture::start(&dir.join("capture.pcap")) {
        Ok(c) => c,
        Err(e) => return vec![e],
    };
    let mut host = match spawn_agent(sr, "rping-server", &dir) {
        Ok(b) => b,
        Err(e) => return vec![e],
    };
    if let Err(e) = wait_host_listen(&mut host) {
        return vec![e, host.wait(Duration::from_secs(5)).describe(20)];
    }
    let c = g.exec(
        60,
        &format!(
            "rping -c -a {HOST_IP} -p {PORT} -C {} -S 1500 -v -V",
            rping_agent::ITERS
        ),
    );
    let h = host.wait(Duration::from_secs(60));
    let (_, dropped) = cap.stop();
    say(&format!(
        "    host: {}",
        h.describe(6).replace('\n', "\n    ")
    ));
    say(&format!(
        "    guest: {}",
        c.describe(4).replace('\n', "\n    ")
    ));
    if !h.ok() || !h.stdout.contains("AGENT OK rping server") {
        p.push(format!("host side failed: {}", h.describe(25)));
    }
    let last = format!("ping data: rdma-ping-{}: ", rping_agent::ITERS - 1);
    if !c.ok() || !c.stdout.contains(&last) {
        p.push(format!("rping (client) failed: {}", c.describe(10)));
    }
    if dropped > 0 {
        say(&format!("    tcpdump dropped {dropped} frames"));
    }
    p.extend(check_capture(sr, &dir.join("capture.pcap"), &dir, CM_MADS));
    p
}

/// Both CMs' rejections: the guest's rdma_client is rejected by our listener (REJ reason 28 with private data) and
/// its udaddy gets SIDR_REP status 1 from our CM; our REQ and SIDR_REQ to an unlistened guest service get REJ
/// reason 8 and SIDR_REP status 1 from Linux.
fn case_rejects(sr: &SoftRoce, g: &Guest, out: &Path) -> Vec<String> {
    let dir = out.join("rejects");
    let _ = fs::create_dir_all(&dir);
    let mut p = Vec::new();
    let cap = match Capture::start(&dir.join("capture.pcap")) {
        Ok(c) => c,
        Err(e) => return vec![e],
    };
    let mut host = match spawn_agent(sr, "reject", &dir) {
        Ok(b) => b,
        Err(e) => return vec![e],
    };
    if let Err(e) = wait_host_listen(&mut host) {
        return vec![e, host.wait(Duration::from_secs(5)).describe(20)];
    }
    let c = g.exec(30, &format!("rdma_client -s {HOST_IP} -p {PORT}"));
    let u = g.exec(30, &format!("udaddy -s {HOST_IP}"));
    let h = host.wait(Duration::from_secs(60));
    let probe_dir = dir.join("probe");
    let _ = fs::create_dir_all(&probe_dir);
    let probe = spawn_agent(sr, "probe", &probe_dir).map(|b| b.wait(Duration::from_secs(60)));
    let (_, dropped) = cap.stop();
    say(&format!(
        "    rdma_client: {}",
        c.describe(4).replace('\n', "\n    ")
    ));
    say(&format!(
        "    udaddy: {}",
        u.describe(4).replace('\n', "\n    ")
    ));
    if !h.ok() || !h.stdout.contains("AGENT OK reject") {
        p.push(format!("host listener failed: {}", h.describe(25)));
    }
    // librdmacm turns the REJECTED event into ECONNREFUSED: rdma_client reports the failed rdma_connect and exits
    // non-zero ("end -1").
    if c.ok() || !c.stderr.contains("rdma_connect: Connection refused") {
        p.push(format!("rdma_client was not refused: {}", c.describe(10)));
    }
    // udaddy prints the UNREACHABLE event with the SIDR_REP's status (1: unsupported service ID).
    if u.ok() || !u.stdout.contains("RDMA_CM_EVENT_UNREACHABLE, error: 1") {
        p.push(format!(
            "udaddy did not report UNREACHABLE: {}",
            u.describe(10)
        ));
    }
    match probe {
        Ok(o) if o.ok() && o.stdout.contains("AGENT OK probe") => {}
        Ok(o) => p.push(format!("host probe failed: {}", o.describe(25))),
        Err(e) => p.push(e),
    }
    if dropped > 0 {
        say(&format!("    tcpdump dropped {dropped} frames"));
    }
    p.extend(check_capture(
        sr,
        &dir.join("capture.pcap"),
        &dir,
        &[
            (0x0010, "REQ"),
            (0x0012, "REJ"),
            (0x0017, "SIDR_REQ"),
            (0x0018, "SIDR_REP"),
        ],
    ));
    p
}

// ---------------------------------------------------------------------------------------------------------------
// The product on the host: Debian's unmodified programs under `rocev2 run`
// ---------------------------------------------------------------------------------------------------------------

/// The `rocev2` binary of this test's profile, with `libroce_ibverbs.so` and `libroce_rdmacm.so` beside it (what
/// `rocev2 run` preloads), built once per test binary (`cargo build -p roce-cli -p roce-ibverbs -p roce-rdmacm`, a
/// no-op when fresh). `Err`: the build failed or left a file missing.
fn product() -> Result<std::path::PathBuf, String> {
    static BUILT: std::sync::OnceLock<Result<std::path::PathBuf, String>> =
        std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| {
            let mut cmd = Command::new(env!("CARGO"));
            cmd.args([
                "build",
                "-p",
                "roce-cli",
                "-p",
                "roce-ibverbs",
                "-p",
                "roce-rdmacm",
            ]);
            if !cfg!(debug_assertions) {
                cmd.arg("--release");
            }
            let o = cmd
                .current_dir(env!("CARGO_MANIFEST_DIR"))
                .output()
                .map_err(|e| format!("run cargo build: {e}"))?;
            if !o.status.success() {
                return Err(format!(
                    "cargo build -p roce-cli -p roce-ibverbs -p roce-rdmacm failed:\n{}",
                    String::from_utf8_lossy(&o.stderr)
                ));
            }
            // This binary is <target>/<profile>/deps/rdmacm-<hash>.
            let exe = std::env::current_exe().map_err(|e| e.to_string())?;
            let dir = exe
                .parent()
                .and_then(Path::parent)
                .ok_or("no profile directory")?;
            for f in ["rocev2", "libroce_ibverbs.so", "libroce_rdmacm.so"] {
                if !dir.join(f).is_file() {
                    return Err(format!("{} missing after the build", dir.join(f).display()));
                }
            }
            Ok(dir.join("rocev2"))
        })
        .clone()
}

/// Which end runs the program's server role.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum ServerOn {
    Host,
    Guest,
}

/// One case of an unmodified rdma_cm program on both ends: the host side is Debian's program under
/// `rocev2 run --ip 198.18.0.1 --rx packet` in namespace `roce-net` (AF_PACKET receive: rxe numbers its IPv4
/// identification, which the ICRC covers), the guest side the same program on Linux's rdma_cm and rxe.
struct ProgCase {
    name: &'static str,
    server_on: ServerOn,
    /// Command lines, split on whitespace for the host; `{S}` is the server's address.
    server: &'static str,
    client: &'static str,
    /// The program's own success criteria on one side's output (`client` tells which role); `Err` = the problem.
    judge: fn(&roce_interop::CmdOutput, bool) -> Result<(), String>,
    /// CM attributes the capture must contain.
    mads: &'static [(u16, &'static str)],
    /// `Some(why)`: the case runs only when named in `SOFTROCE_CASES`; `why` is printed in the default run.
    only_when_named: Option<&'static str>,
}

/// rping with `-v -V`: exit 0 and `RPING_COUNT` pings printed (each verified with `-V`: a mismatch ends rping
/// with status 1).
const RPING_COUNT: usize = 10;

fn judge_rping(o: &roce_interop::CmdOutput, _client: bool) -> Result<(), String> {
    let pings = o
        .stdout
        .lines()
        .filter(|l| l.contains("ping data: rdma-ping-"))
        .count();
    if !o.ok() || pings != RPING_COUNT {
        return Err(format!("{pings} of {RPING_COUNT} pings printed"));
    }
    Ok(())
}

/// perftest with `-R`: exit 0, its header says the data exchange went through rdma_cm, and the client printed a
/// result row for 4096-byte messages.
fn judge_perftest(o: &roce_interop::CmdOutput, client: bool) -> Result<(), String> {
    if !o.ok() {
        return Err("exit status".into());
    }
    let cm = o
        .stdout
        .lines()
        .any(|l| l.contains("Data ex. method") && l.trim_end().ends_with("rdma_cm"));
    if !cm {
        return Err("the header does not say `Data ex. method : rdma_cm`".into());
    }
    if client {
        let mut rows = o
            .stdout
            .lines()
            .skip_while(|l| !l.trim_start().starts_with("#bytes"));
        rows.next();
        let row: Vec<&str> = rows
            .next()
            .map(|l| l.split_whitespace().collect())
            .unwrap_or_default();
        if row.first() != Some(&"4096") {
            return Err(format!("no result row for 4096 bytes: {row:?}"));
        }
    }
    Ok(())
}

/// udaddy: `return status 0` (every call succeeded and every datagram arrived) and no unexpected event.
fn judge_udaddy(o: &roce_interop::CmdOutput, _client: bool) -> Result<(), String> {
    if !o.ok() || !o.stdout.contains("return status 0") || o.stdout.contains("udaddy: event:") {
        return Err("no `return status 0`".into());
    }
    Ok(())
}

/// REQ, REP and RTU (perftest may end its connections by destroying them: DREQ/DREP are not required).
const CONNECT_MADS: &[(u16, &str)] = &[(0x0010, "REQ"), (0x0013, "REP"), (0x0014, "RTU")];

const RPING_SERVER: &str = "rping -s -a {S} -C 10 -S 1500 -v -V";
const RPING_CLIENT: &str = "rping -c -a {S} -C 10 -S 1500 -v -V";

/// Why the perftest cases with the host as client run only when named. perftest 4.5+0.17 (Debian 12, the guest's
/// and the host's) connects a second time (its test QPs) right after the handshake over its first connection,
/// while the server creates the listener for that second connection only after the handshake: the host client
/// (rocev2 answers address and route resolution at once, as Linux does for a known neighbour) sends its second REQ
/// ≈6 ms after the guest's last handshake SEND, before the TCG guest has listened, and Linux's CM rejects it with
/// reason 8 (no listener yet; `Event: RDMA_CM_EVENT_REJECTED; error: 8.`), as it would reject a fast Linux
/// client. perftest's retry of that REJ is broken in 4.5+0.17 (`rdma_cm_client_connection` destroys the ids,
/// their channel and the node array, then connects again with the destroyed ids: rocev2 answers EAGAIN/EINVAL,
/// Linux's librdmacm would use freed memory; fixed upstream in perftest 3d9d8d0, "Fix crashes and logical flaws
/// in RDMA CM connection retry"), so the run fails. Measured 2026-12-03: 3 of 3 `ib_send_bw -R` runs refused so
/// in a guest doing nothing else; the first connection, the handshake data and the DREQ at exit were right each
/// time (REQ/REP/RTU, DREQ answered by Linux's DREP when the guest server was ended).
const PERFTEST_CLIENT_RACE: &str = "perftest 4.5+0.17's CM retry is broken and its second REQ races the TCG \
     guest's second listen (REJ 8): docs/TESTING.md, Soft-RoCE interop";

/// The cases of the product, each with the host as server and as client. The perftest host-client cases run
/// only when named ([`PERFTEST_CLIENT_RACE`]), and last, so a guest they leave busy cannot spoil the others.
///
/// Under TCG the guest's rxe was once seen taking 540 ms to ACK the first SEND after perftest set up its second
/// connection; the host's QP then retransmitted every 67 ms (local ACK timeout 14, before the QP took the
/// timeout the CM exchanged, docs/RDMACM.md §7.1) and gave up after 7 retries (status 12). Such a run fails; it
/// is not retried.
const PROG_CASES: &[ProgCase] = &[
    ProgCase {
        name: "host_rping_client",
        server_on: ServerOn::Guest,
        server: RPING_SERVER,
        client: RPING_CLIENT,
        judge: judge_rping,
        only_when_named: None,
        mads: CM_MADS,
    },
    ProgCase {
        name: "host_udaddy_client",
        server_on: ServerOn::Guest,
        server: "udaddy -b {S}",
        client: "udaddy -s {S}",
        judge: judge_udaddy,
        only_when_named: None,
        mads: SIDR_MADS,
    },
    ProgCase {
        name: "host_rping_server",
        server_on: ServerOn::Host,
        server: RPING_SERVER,
        client: RPING_CLIENT,
        judge: judge_rping,
        only_when_named: None,
        mads: CM_MADS,
    },
    ProgCase {
        name: "host_send_bw_server",
        server_on: ServerOn::Host,
        server: "ib_send_bw -R -s 4096 -n 200",
        client: "ib_send_bw -R -s 4096 -n 200 {S}",
        judge: judge_perftest,
        only_when_named: None,
        mads: CONNECT_MADS,
    },
    ProgCase {
        name: "host_write_bw_server",
        server_on: ServerOn::Host,
        server: "ib_write_bw -R -s 4096 -n 200",
        client: "ib_write_bw -R -s 4096 -n 200 {S}",
        judge: judge_perftest,
        only_when_named: None,
        mads: CONNECT_MADS,
    },
    ProgCase {
        name: "host_read_lat_server",
        server_on: ServerOn::Host,
        server: "ib_read_lat -R -s 4096 -n 100",
        client: "ib_read_lat -R -s 4096 -n 100 {S}",
        judge: judge_perftest,
        only_when_named: None,
        mads: CONNECT_MADS,
    },
    ProgCase {
        name: "host_udaddy_server",
        server_on: ServerOn::Host,
        server: "udaddy -b {S}",
        client: "udaddy -s {S}",
        judge: judge_udaddy,
        only_when_named: None,
        mads: SIDR_MADS,
    },
    ProgCase {
        name: "host_send_bw_client",
        server_on: ServerOn::Guest,
        server: "ib_send_bw -R -s 4096 -n 200",
        client: "ib_send_bw -R -s 4096 -n 200 {S}",
        judge: judge_perftest,
        only_when_named: Some(PERFTEST_CLIENT_RACE),
        mads: CONNECT_MADS,
    },
    ProgCase {
        name: "host_write_bw_client",
        server_on: ServerOn::Guest,
        server: "ib_write_bw -R -s 4096 -n 200",
        client: "ib_write_bw -R -s 4096 -n 200 {S}",
        judge: judge_perftest,
        only_when_named: Some(PERFTEST_CLIENT_RACE),
        mads: CONNECT_MADS,
    },
    ProgCase {
        name: "host_read_lat_client",
        server_on: ServerOn::Guest,
        server: "ib_read_lat -R -s 4096 -n 100",
        client: "ib_read_lat -R -s 4096 -n 100 {S}",
        judge: judge_perftest,
        only_when_named: Some(PERFTEST_CLIENT_RACE),
        mads: CONNECT_MADS,
    },
];

/// Starts `cmdline` on the host under `rocev2 run --ip HOST_IP --rx packet` in the namespace.
fn host_prog(sr: &SoftRoce, cmdline: &str, dir: &Path, label: &str) -> Result<Bg, String> {
    let rocev2 = product()?;
    let mut args = vec!["run", "--ip", HOST_IP, "--rx", "packet", "--"];
    args.extend(cmdline.split_whitespace());
    sr.host_spawn(&rocev2, &args, &dir.join(label))
}

/// Waits until the host program has bound UDP 4791 on [`HOST_IP`] (its first rdma_cm call that needs the device
/// starts the runtime), then half a second more for its `rdma_listen`.
fn wait_host_bound(sr: &SoftRoce, server: &mut Bg) -> Result<(), String> {
    let end = Instant::now() + Duration::from_secs(60);
    while Instant::now() < end {
        if !server.running() {
            return Err("the host program exited before binding UDP 4791".into());
        }
        if sr.host_udp_bound(HOST_IP, 4791) {
            thread::sleep(Duration::from_millis(500));
            return Ok(());
        }
        thread::sleep(Duration::from_millis(200));
    }
    Err("the host program did not bind UDP 4791 within 60 s".into())
}

/// Waits (at most 90 s) until the guest's rdma_cm holds no id (`rdma resource show cm_id` prints nothing), so a
/// case starts with no connection, listen or port left by the previous one: a guest program that was ended
/// releases its ids while the kernel closes its `rdma_cm` descriptor, and a new server's `rdma_bind_addr` fails
/// while the old listen still holds the port. `Err` names what is still there.
fn wait_guest_quiet(g: &Guest) -> Result<(), String> {
    let end = Instant::now() + Duration::from_secs(90);
    loop {
        let o = g.exec(20, "rdma resource show cm_id");
        if o.ok() && o.stdout.trim().is_empty() {
            return Ok(());
        }
        if Instant::now() >= end {
            return Err(format!(
                "the guest still holds rdma_cm ids after 90 s: {}",
                o.describe(10)
            ));
        }
        thread::sleep(Duration::from_millis(500));
    }
}

/// One run of a [`ProgCase`]: (server output, client output), or the reason it could not run.
fn prog_attempt(
    sr: &SoftRoce,
    g: &Guest,
    case: &ProgCase,
    dir: &Path,
    attempt: u32,
) -> Result<(roce_interop::CmdOutput, roce_interop::CmdOutput), String> {
    let server_ip = match case.server_on {
        ServerOn::Host => HOST_IP,
        ServerOn::Guest => GUEST_IP,
    };
    let server = case.server.replace("{S}", server_ip);
    let client = case.client.replace("{S}", server_ip);
    let program = server.split_whitespace().next().unwrap_or_default();
    wait_guest_quiet(g)?;
    match case.server_on {
        ServerOn::Host => {
            let mut s = host_prog(sr, &server, dir, &format!("host-server-{attempt}"))?;
            if let Err(e) = wait_host_bound(sr, &mut s) {
                return Err(format!(
                    "{e}: {}",
                    s.wait(Duration::from_secs(5)).describe(20)
                ));
            }
            let c = g.exec(150, &client);
            let s = s.wait(Duration::from_secs(60));
            Ok((s, c))
        }
        ServerOn::Guest => {
            let log = dir.join(format!("guest-server-{attempt}"));
            let mut s = g.spawn_tracked(180, &server, GUEST_TAG, &log)?;
            if let Err(e) = wait_guest_listen(g, &mut s) {
                g.kill_tracked(GUEST_TAG, program);
                return Err(format!(
                    "{e}: {}",
                    s.wait(Duration::from_secs(5)).describe(10)
                ));
            }
            let c = host_prog(sr, &client, dir, &format!("host-client-{attempt}"))?
                .wait(Duration::from_secs(150));
            // A server whose client failed waits for a connection that never comes: 5 s, not 60.
            let s = s.wait(Duration::from_secs(if c.ok() { 60 } else { 5 }));
            if s.timed_out || s.rc.is_none() {
                g.kill_tracked(GUEST_TAG, program);
            }
            Ok((s, c))
        }
    }
}

/// A [`ProgCase`]: both programs succeed by their own criteria, rocev2's librdmacm printed no complaint, and the
/// capture passes [`check_capture`].
///
/// perftest's `-R` client connects a second time right after the handshake over its first connection, while the
/// server creates the listener for that second connection only then: when the host client (rocev2 answers address
/// and route resolution at once) is faster than the guest server under TCG, Linux's CM rejects it with reason 8
/// (no listener yet, `Event: RDMA_CM_EVENT_REJECTED; error: 8.`), as it would reject a fast Linux client. Such a
/// run is started over, at most five times (two of three runs were refused so here), with a note.
fn case_prog(sr: &SoftRoce, g: &Guest, case: &ProgCase, out: &Path) -> Vec<String> {
    let dir = out.join(case.name);
    let _ = fs::create_dir_all(&dir);
    let mut p = Vec::new();
    for attempt in 1..=5 {
        let cap = match Capture::start(&dir.join("capture.pcap")) {
            Ok(c) => c,
            Err(e) => return vec![e],
        };
        let r = prog_attempt(sr, g, case, &dir, attempt);
        let (_, dropped) = cap.stop();
        let (s, c) = match r {
            Ok(x) => x,
            Err(e) => return vec![e],
        };
        let host_is_client = case.server_on == ServerOn::Guest;
        let (host, guest) = if host_is_client { (&c, &s) } else { (&s, &c) };
        say(&format!(
            "    host: {}",
            host.describe(4).replace('\n', "\n    ")
        ));
        say(&format!(
            "    guest: {}",
            guest.describe(4).replace('\n', "\n    ")
        ));
        let early =
            format!("{}{}", c.stdout, c.stderr).contains("Event: RDMA_CM_EVENT_REJECTED; error: 8");
        if early && attempt < 5 {
            say(&format!(
                "    note: the client was faster than the server's second listen (attempt {attempt}); again"
            ));
            let _ = fs::rename(
                dir.join("capture.pcap"),
                dir.join(format!("capture-{attempt}.pcap")),
            );
            continue;
        }
        for (side, o, client) in [("server", &s, false), ("client", &c, true)] {
            if let Err(e) = (case.judge)(o, client) {
                let who = if client == host_is_client {
                    "host"
                } else {
                    "guest"
                };
                p.push(format!("{who} {side} failed ({e}): {}", o.describe(15)));
            }
        }
        if host.stderr.contains("rocev2 librdmacm") {
            p.push(format!(
                "rocev2's librdmacm complained: {}",
                host.describe(15)
            ));
        }
        if dropped > 0 {
            say(&format!("    tcpdump dropped {dropped} frames"));
        }
        p.extend(check_capture(
            sr,
            &dir.join("capture.pcap"),
            &dir,
            case.mads,
        ));
        break;
    }
    p
}

#[test]
fn rdmacm_interop() {
    if std::env::var_os(AGENT_ENV).is_some() {
        return;
    }
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let testdata = crate_dir.join("../../testdata");
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("rdmacm-interop");
    let _ = fs::create_dir_all(&out);
    let sr = match SoftRoce::acquire(&testdata, &out.join("scratch"), Duration::from_secs(1800)) {
        Ok(s) => s,
        Err(reason) => {
            say("######################################################################");
            say(&format!("SKIPPED: rdma_cm interop suite not run: {reason}"));
            say("######################################################################");
            return;
        }
    };
    let g = sr.up(GUEST, GUEST_IP).unwrap_or_else(|e| panic!("{e}"));
    say(&format!("{} | {}", g.boot_log, g.ready_line));
    let only = std::env::var("SOFTROCE_CASES").unwrap_or_default();
    let mut failed = Vec::new();
    type CaseFn = fn(&SoftRoce, &Guest, &Path) -> Vec<String>;
    let cases: [(&str, CaseFn); 7] = [
        ("guest_rdma_server", case_guest_server),
        ("guest_rdma_client", case_guest_client),
        ("guest_udaddy_server", case_guest_udaddy_server),
        ("guest_udaddy_client", case_guest_udaddy_client),
        ("guest_ucmatose_client", case_guest_ucmatose_client),
        ("guest_rping_client", case_guest_rping_client),
        ("rejects", case_rejects),
    ];
    enum Driver {
        Agent(CaseFn),
        Prog(&'static ProgCase),
    }
    let agent_cases = cases.iter().map(|(name, f)| (*name, Driver::Agent(*f)));
    // The `host_*` cases (Debian's programs on our librdmacm against the guest's) are part of the default run,
    // except those whose `only_when_named` says why they run only when named in SOFTROCE_CASES.
    if only.is_empty() {
        for c in PROG_CASES {
            if let Some(why) = c.only_when_named {
                say(&format!("{} not run unless named: {why}", c.name));
            }
        }
    }
    let prog_cases = PROG_CASES
        .iter()
        .filter(|c| !only.is_empty() || c.only_when_named.is_none())
        .map(|c| (c.name, Driver::Prog(c)));
    for (name, driver) in agent_cases.chain(prog_cases) {
        if !only.is_empty() && !only.split(',').any(|s| name.contains(s)) {
            continue;
        }
        let t0 = Instant::now();
        say(&format!("case {name}"));
        let problems = match driver {
            Driver::Agent(f) => f(&sr, &g, &out),
            Driver::Prog(c) => case_prog(&sr, &g, c, &out),
        };
        say(&format!(
            "{} {name} ({:.1}s)",
            if problems.is_empty() { "ok  " } else { "FAIL" },
            t0.elapsed().as_secs_f64()
        ));
        for pr in &problems {
            say(&format!("    problem: {pr}"));
        }
        if !problems.is_empty() {
            failed.push((name, problems));
        }
    }
    drop(sr);
    assert!(
        failed.is_empty(),
        "rdma_cm interop cases failed: {failed:#?}"
    );
}
