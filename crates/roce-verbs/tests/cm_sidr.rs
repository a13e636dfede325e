//! SIDR through the connection manager (`roce_verbs::cm`, UD service resolution, IBTA Vol 1 §12.11), end to end
//! on the simulated pair and over real UDP on 127.0.0.x: a SIDR_REQ with an rdma_cm address header reaches the
//! listener of an `RDMA_PS_UDP` service ID, whose answer (its UD QP and `RDMA_UDP_QKEY`) lets the requester send
//! a verified datagram to it; a rejected SIDR_REQ and one nobody listens for come back with their status; an
//! unanswered one ends as unreachable after the retries; the API refuses answers that could not work.

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use roce_link::{UdpConfig, UdpLink};
use roce_verbs::cm::{CmConfig, CmEvent, ConnectionManager, RDMA_UDP_QKEY};
use roce_verbs::*;
use roce_wire::cm::{CmaHdr, PortSpace, SIDR_REP_PRIVATE_DATA_LEN, SIDR_REQ_PRIVATE_DATA_LEN};

const WAIT: Duration = Duration::from_secs(10);

struct End {
    ctx: Context,
    cm: ConnectionManager,
    pd: Pd,
    cq: Cq,
    qp: Qp,
    mr: Mr,
    buf: MrBuf,
}

fn end(ctx: &Context, cfg: CmConfig) -> End {
    let cm = ConnectionManager::open_with(ctx, cfg).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(64, None, Moderation::default()).unwrap();
    let cap = QpCap {
        max_send_wr: 8,
        max_recv_wr: 8,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 64,
    };
    let qp = pd.create_qp(QpType::Ud, &cq, &cq, cap, true).unwrap();
    qp.ready_ud(RDMA_UDP_QKEY, Psn::new(0)).unwrap();
    let buf = MrBuf::new(8192).unwrap();
    let mr = pd.reg_mr(&buf, AccessFlags::LOCAL_WRITE).unwrap();
    End {
        ctx: ctx.clone(),
        cm,
        pd,
        cq,
        qp,
        mr,
        buf,
    }
}

fn event(e: &End) -> CmEvent {
    e.cm.get_event(WAIT)
        .unwrap()
        .expect("a CM event within the wait")
}

fn poll_one(cq: &Cq) -> Wc {
    let mut wc = [Wc::default(); 1];
    let end = std::time::Instant::now() + WAIT;
    while std::time::Instant::now() < end {
        if cq.poll(&mut wc) == 1 {
            return wc[0];
        }
        std::thread::yield_now();
    }
    panic!("no completion");
}

fn ip_of(g: Gid) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(g.0[12], g.0[13], g.0[14], g.0[15]))
}

/// The rdma_cm address header for a SIDR_REQ from `a` to `b` (port 7174).
fn cma_hdr(a: &End, b: &End) -> Vec<u8> {
    let mut v = vec![0u8; roce_wire::cm::CMA_HDR_LEN];
    CmaHdr {
        src_port: 50000,
        src_addr: ip_of(a.ctx.gid(0).unwrap()),
        dst_addr: ip_of(b.ctx.gid(0).unwrap()),
    }
    .emit(&mut v)
    .unwrap();
    v.extend_from_slice(b"udaddy-like");
    v
}

/// `a` resolves `b`'s UDP-port-space service, then sends a datagram to the resolved QP with the resolved Q_Key and
/// address; `b` receives it, verified.
fn resolve_and_send(a: &End, b: &End) {
    let sid = roce_wire::cm::service_id(PortSpace::Udp, 7174);
    let listen = b.cm.listen(sid).unwrap();
    let hdr = cma_hdr(a, b);
    let id_a =
        a.cm.sidr_resolve(b.ctx.gid(0).unwrap(), b.ctx.config().mac, sid, &hdr, 0)
            .unwrap();
    let id_b = match event(b) {
        CmEvent::SidrRequest {
            id,
            listen: l,
            service_id,
            peer,
            private_data,
        } => {
            assert_eq!((l, service_id, peer), (listen, sid, a.ctx.gid(0).unwrap()));
            assert_eq!(private_data.len(), SIDR_REQ_PRIVATE_DATA_LEN);
            assert_eq!(&private_data[..hdr.len()], &hdr[..]);
            let h = CmaHdr::parse(&private_data).unwrap();
            assert_eq!(h.dst_addr, ip_of(b.ctx.gid(0).unwrap()));
            id
        }
        e => panic!("expected a SIDR request, got {e:?}"),
    };
    // B's receive is posted before it answers: the datagram may follow the SIDR_REP at once.
    b.qp.post_recv(&[RecvWr {
        wr_id: 5,
        sg_list: &[b.mr.sge(0, 40 + 256)],
    }])
    .unwrap();
    b.cm.sidr_accept(id_b, &b.qp, RDMA_UDP_QKEY, b"welcome")
        .unwrap();
    let (ah, qpn, qkey) = match event(a) {
        CmEvent::SidrResolved {
            id,
            ah,
            qpn,
            qkey,
            private_data,
        } => {
            assert_eq!(id, id_a);
            assert_eq!(qpn, b.qp.qpn(), "the service's QP");
            assert_eq!(qkey, RDMA_UDP_QKEY);
            assert_eq!(ah.dgid, b.ctx.gid(0).unwrap());
            assert_eq!(ah.dmac, b.ctx.config().mac);
            assert_eq!(private_data.len(), SIDR_REP_PRIVATE_DATA_LEN);
            assert_eq!(&private_data[..7], b"welcome");
            (ah, qpn, qkey)
        }
        e => panic!("expected SIDR resolved, got {e:?}"),
    };
    // The resolved address works: a 200-byte datagram to it arrives whole.
    let ah = a.pd.create_ah(&ah).unwrap();
    let msg: Vec<u8> = (0..200u32).map(|i| (i * 13 + 1) as u8).collect();
    a.mr.write(1024, &msg).unwrap();
    let sg = [a.mr.sge(1024, 200)];
    a.qp.post_send(&[SendWr::new(9, SendOp::Send, &sg).signaled().ud(UdDest {
        ah: ah.handle(),
        remote_qpn: qpn,
        remote_qkey: qkey,
    })])
    .unwrap();
    assert_eq!(poll_one(&a.cq).status, WcStatus::Success);
    let wc = poll_one(&b.cq);
    assert_eq!(
        (wc.status, wc.wr_id, wc.byte_len, wc.src_qp),
        (WcStatus::Success, 5, 240, a.qp.qpn())
    );
    assert_eq!(&b.buf.to_vec()[40..240], &msg[..]);
    b.cm.stop_listen(listen).unwrap();
}

/// A rejected SIDR_REQ (status 2 with the private data), and one for a service nobody listens on (status 1).
fn rejects(a: &End, b: &End) {
    let sid = roce_wire::cm::service_id(PortSpace::Udp, 7175);
    b.cm.listen(sid).unwrap();
    let id =
        a.cm.sidr_resolve(b.ctx.gid(0).unwrap(), b.ctx.config().mac, sid, b"", 0)
            .unwrap();
    let id_b = match event(b) {
        CmEvent::SidrRequest { id, .. } => id,
        e => panic!("expected a SIDR request, got {e:?}"),
    };
    b.cm.sidr_reject(id_b, b"go away").unwrap();
    match event(a) {
        CmEvent::SidrRejected {
            id: i,
            status,
            private_data,
        } => {
            assert_eq!((i, status), (id, 2), "rejected by the service");
            assert_eq!(&private_data[..7], b"go away");
        }
        e => panic!("expected SIDR rejected, got {e:?}"),
    }
    let nobody = roce_wire::cm::service_id(PortSpace::Udp, 7176);
    let id =
        a.cm.sidr_resolve(b.ctx.gid(0).unwrap(), b.ctx.config().mac, nobody, b"", 0)
            .unwrap();
    match event(a) {
        CmEvent::SidrRejected { id: i, status, .. } => {
            assert_eq!((i, status), (id, 1), "unsupported service ID")
        }
        e => panic!("expected SIDR rejected, got {e:?}"),
    }
    assert!(
        b.cm.poll_event().unwrap().is_none(),
        "B's application saw nothing"
    );
}

#[test]
fn sim_pair_sidr_resolves_and_the_datagram_arrives() {
    let (ca, cb) = Context::sim_pair(RuntimeConfig::default()).unwrap();
    let (a, b) = (end(&ca, CmConfig::default()), end(&cb, CmConfig::default()));
    resolve_and_send(&a, &b);
}

#[test]
fn sim_pair_sidr_rejects() {
    let (ca, cb) = Context::sim_pair(RuntimeConfig::default()).unwrap();
    let (a, b) = (end(&ca, CmConfig::default()), end(&cb, CmConfig::default()));
    rejects(&a, &b);
}

/// 30 % loss, duplicates and reordering: the SIDR_REQ is re-sent until answered and the datagram path resolves.
/// The responder keeps no state once it has answered (Linux `cm.c` `ib_send_cm_sidr_rep` forgets the request
/// too), so a SIDR_REQ re-sent because its SIDR_REP was lost reaches B's application again: B answers every one;
/// duplicates of a request still pending reach it once.
#[test]
fn lossy_sim_pair_sidr_resolves_through_retries() {
    use roce_link::{FaultConfig, Faulty};
    let mut seed = 10;
    let wrap = move |l: SendLink| -> Result<SendLink, roce_link::LinkError> {
        seed += 1;
        let f = FaultConfig {
            loss: 0.3,
            duplicate: 0.2,
            reorder: 0.1,
            ..FaultConfig::default()
        };
        Ok(Box::new(Faulty::new(l, f, FaultConfig::default(), seed)))
    };
    let (ca, cb) = Context::sim_pair_with(
        RuntimeConfig::default(),
        roce_link::sim::SimConfig::default(),
        wrap,
    )
    .unwrap();
    // Retries every ≈ 68 ms (4.096 µs · (2 · 2^6 + 2^14)), 15 of them: about a second for B's application to
    // answer, so a loaded machine does not turn a slow answer into Unreachable.
    let cfg = CmConfig {
        packet_life_time: 6,
        cm_response_timeout: 14,
        max_cm_retries: 15,
        ..CmConfig::default()
    };
    let (a, b) = (end(&ca, cfg), end(&cb, cfg));
    let sid = roce_wire::cm::service_id(PortSpace::Udp, 9);
    b.cm.listen(sid).unwrap();
    let mut answered = 0;
    // Several resolutions, so some SIDR_REQ or SIDR_REP is surely lost on the way.
    for _ in 0..5 {
        let id =
            a.cm.sidr_resolve(cb.gid(0).unwrap(), cb.config().mac, sid, b"", 0)
                .unwrap();
        let end = std::time::Instant::now() + WAIT;
        let ev = loop {
            assert!(std::time::Instant::now() < end, "no answer for A");
            while let Some(e) = b.cm.poll_event().unwrap() {
                match e {
                    CmEvent::SidrRequest { id, .. } => {
                        b.cm.sidr_accept(id, &b.qp, RDMA_UDP_QKEY, b"").unwrap();
                        answered += 1;
                    }
                    e => panic!("expected a SIDR request, got {e:?}"),
                }
            }
            if let Some(e) = a.cm.get_event(Duration::from_millis(1)).unwrap() {
                break e;
            }
        };
        match ev {
            CmEvent::SidrResolved { id: i, qpn, .. } => {
                assert_eq!((i, qpn), (id, b.qp.qpn()))
            }
            e => panic!("expected SIDR resolved, got {e:?}"),
        }
    }
    assert!(answered >= 5);
    assert!(
        a.cm.stats().unwrap().retransmits > 0,
        "the loss made A retry"
    );
}

/// Nobody answers (the listener's application never does, its CM has no time to either): after the retries the
/// requester hears Unreachable.
#[test]
fn unanswered_sidr_is_unreachable() {
    let (ca, cb) = Context::sim_pair(RuntimeConfig::default()).unwrap();
    let cfg = CmConfig {
        packet_life_time: 4,
        cm_response_timeout: 6,
        max_cm_retries: 2,
        ..CmConfig::default()
    };
    let (a, b) = (end(&ca, cfg), end(&cb, cfg));
    let sid = roce_wire::cm::service_id(PortSpace::Udp, 11);
    b.cm.listen(sid).unwrap();
    let id =
        a.cm.sidr_resolve(cb.gid(0).unwrap(), cb.config().mac, sid, b"", 0)
            .unwrap();
    match event(&b) {
        CmEvent::SidrRequest { .. } => {}
        e => panic!("expected a SIDR request, got {e:?}"),
    }
    match event(&a) {
        CmEvent::Unreachable { id: i } => assert_eq!(i, id),
        e => panic!("expected unreachable, got {e:?}"),
    }
    assert_eq!(a.cm.stats().unwrap().retransmits, 2);
}

/// The API refuses answers that could not work: an RC QP, a QP not ready, a Q_Key the QP does not have, a SIDR
/// answer to a connection request, private data too long, a bad source GID index.
#[test]
fn sidr_answers_that_cannot_work_are_refused() {
    let (ca, cb) = Context::sim_pair(RuntimeConfig::default()).unwrap();
    let (a, b) = (end(&ca, CmConfig::default()), end(&cb, CmConfig::default()));
    let sid = roce_wire::cm::service_id(PortSpace::Udp, 12);
    b.cm.listen(sid).unwrap();
    assert!(matches!(
        a.cm.sidr_resolve(cb.gid(0).unwrap(), cb.config().mac, sid, b"", 9),
        Err(Error::InvalidArgument(_))
    ));
    assert!(
        a.cm.sidr_resolve(
            cb.gid(0).unwrap(),
            cb.config().mac,
            sid,
            &[0; SIDR_REQ_PRIVATE_DATA_LEN + 1],
            0
        )
        .is_err()
    );
    a.cm.sidr_resolve(cb.gid(0).unwrap(), cb.config().mac, sid, b"", 0)
        .unwrap();
    let id_b = match event(&b) {
        CmEvent::SidrRequest { id, .. } => id,
        e => panic!("expected a SIDR request, got {e:?}"),
    };
    let rc =
        b.pd.create_qp(QpType::Rc, &b.cq, &b.cq, b.qp.cap(), true)
            .unwrap();
    assert!(matches!(
        b.cm.sidr_accept(id_b, &rc, RDMA_UDP_QKEY, b""),
        Err(Error::InvalidArgument(_))
    ));
    let fresh =
        b.pd.create_qp(QpType::Ud, &b.cq, &b.cq, b.qp.cap(), true)
            .unwrap();
    assert!(matches!(
        b.cm.sidr_accept(id_b, &fresh, RDMA_UDP_QKEY, b""),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        b.cm.sidr_accept(id_b, &b.qp, 0x1111, b""),
        Err(Error::InvalidArgument(_))
    ));
    assert!(
        b.cm.sidr_accept(
            id_b,
            &b.qp,
            RDMA_UDP_QKEY,
            &[0; SIDR_REP_PRIVATE_DATA_LEN + 1]
        )
        .is_err()
    );
    // After all the refusals the request is still pending and can be answered.
    b.cm.sidr_accept(id_b, &b.qp, RDMA_UDP_QKEY, b"").unwrap();
    assert!(matches!(event(&a), CmEvent::SidrResolved { .. }));
    // A connection request cannot be answered with SIDR.
    let rc_a =
        a.pd.create_qp(QpType::Rc, &a.cq, &a.cq, a.qp.cap(), true)
            .unwrap();
    let tcp = roce_wire::cm::service_id(PortSpace::Tcp, 12);
    b.cm.listen(tcp).unwrap();
    a.cm.connect(
        &rc_a,
        cb.gid(0).unwrap(),
        cb.config().mac,
        tcp,
        b"",
        &ConnectOpts::default(),
    )
    .unwrap();
    let req = match event(&b) {
        CmEvent::ConnectRequest { id, .. } => id,
        e => panic!("expected a connect request, got {e:?}"),
    };
    assert!(b.cm.sidr_accept(req, &b.qp, RDMA_UDP_QKEY, b"").is_err());
    assert!(b.cm.sidr_reject(req, b"").is_err());
}

fn udp_ctx(last: u8, ip: Ipv4Addr) -> Context {
    let mac = [2, 0, 0, 0, 0x21, last];
    let cfg = EngineConfig {
        mac,
        gids: vec![Gid::from_ipv4(ip.octets())],
        seed: u64::from(last),
        ..EngineConfig::default()
    };
    Context::open(cfg, RuntimeConfig::default(), move || {
        let mut u = UdpConfig::new(IpAddr::V4(ip));
        u.local_mac = mac;
        Ok(Box::new(UdpLink::bind(u)?) as SendLink)
    })
    .expect("open udp device")
}

#[test]
fn udp_loopback_sidr_resolves_sends_and_rejects() {
    let ca = udp_ctx(1, Ipv4Addr::new(127, 0, 78, 1));
    let cb = udp_ctx(2, Ipv4Addr::new(127, 0, 78, 2));
    let (a, b) = (end(&ca, CmConfig::default()), end(&cb, CmConfig::default()));
    resolve_and_send(&a, &b);
    rejects(&a, &b);
}

/// `sidr_accept_qpn` (librdmacm's path: the caller moved its UD QP itself): the SIDR_REP names the QPN and Q_Key
/// given, with the private data; the exchange is then over (a second answer, or one for a connection request, is
/// refused).
#[test]
fn sim_pair_sidr_accept_by_qpn() {
    let (ca, cb) = Context::sim_pair(RuntimeConfig::default()).unwrap();
    let (a, b) = (end(&ca, CmConfig::default()), end(&cb, CmConfig::default()));
    let sid = roce_wire::cm::service_id(PortSpace::Udp, 7176);
    b.cm.listen(sid).unwrap();
    let hdr = cma_hdr(&a, &b);
    let id_a =
        a.cm.sidr_resolve(cb.gid(0).unwrap(), cb.config().mac, sid, &hdr, 0)
            .unwrap();
    let id_b = match event(&b) {
        CmEvent::SidrRequest { id, .. } => id,
        e => panic!("expected a SIDR request, got {e:?}"),
    };
    b.cm.sidr_accept_qpn(id_b, b.qp.qpn(), RDMA_UDP_QKEY, b"by-qpn")
        .unwrap();
    match event(&a) {
        CmEvent::SidrResolved {
            id,
            qpn,
            qkey,
            private_data,
            ..
        } => {
            assert_eq!((id, qpn, qkey), (id_a, b.qp.qpn(), RDMA_UDP_QKEY));
            assert_eq!(&private_data[..6], b"by-qpn");
        }
        e => panic!("expected SIDR resolved, got {e:?}"),
    }
    assert!(
        b.cm.sidr_accept_qpn(id_b, b.qp.qpn(), RDMA_UDP_QKEY, b"")
            .is_err(),
        "answered already"
    );
    let long = [0u8; SIDR_REP_PRIVATE_DATA_LEN + 1];
    a.cm.sidr_resolve(cb.gid(0).unwrap(), cb.config().mac, sid, &hdr, 0)
        .unwrap();
    let id_b = match event(&b) {
        CmEvent::SidrRequest { id, .. } => id,
        e => panic!("expected a SIDR request, got {e:?}"),
    };
    assert!(
        b.cm.sidr_accept_qpn(id_b, b.qp.qpn(), RDMA_UDP_QKEY, &long)
            .is_err(),
        "137 bytes of SIDR_REP private data"
    );
    let rc_a =
        a.pd.create_qp(QpType::Rc, &a.cq, &a.cq, a.qp.cap(), true)
            .unwrap();
    let tcp = roce_wire::cm::service_id(PortSpace::Tcp, 13);
    b.cm.listen(tcp).unwrap();
    a.cm.connect(
        &rc_a,
        cb.gid(0).unwrap(),
        cb.config().mac,
        tcp,
        b"",
        &ConnectOpts::default(),
    )
    .unwrap();
    let req = match event(&b) {
        CmEvent::ConnectRequest { id, .. } => id,
        e => panic!("expected a connect request, got {e:?}"),
    };
    assert!(
        b.cm.sidr_accept_qpn(req, b.qp.qpn(), RDMA_UDP_QKEY, b"")
            .is_err()
    );
}

/// `destroy` of our SIDR_REQ while it waits for its answer (rdma_destroy_id of a UD id in librdmacm): no more
/// re-sends and no event, where the same exchange left alone ends Unreachable after its retries.
#[test]
fn destroyed_sidr_request_is_not_resent() {
    let (ca, cb) = Context::sim_pair(RuntimeConfig::default()).unwrap();
    // Response timeout 4.096 µs · 2^15 ≈ 134 ms (+ 2 packet lifetimes of ≈ 1 ms): two retries take about 0.4 s.
    let cfg = CmConfig {
        packet_life_time: 8,
        cm_response_timeout: 15,
        max_cm_retries: 2,
        ..CmConfig::default()
    };
    let (a, b) = (end(&ca, cfg), end(&cb, cfg));
    let sid = roce_wire::cm::service_id(PortSpace::Udp, 12);
    b.cm.listen(sid).unwrap();
    let id =
        a.cm.sidr_resolve(cb.gid(0).unwrap(), cb.config().mac, sid, b"", 0)
            .unwrap();
    let req = match event(&b) {
        CmEvent::SidrRequest { id, .. } => id,
        e => panic!("expected a SIDR request, got {e:?}"),
    };
    a.cm.destroy(id).unwrap();
    assert_eq!(
        a.cm.get_event(Duration::from_secs(1)).unwrap(),
        None,
        "no event after destroy"
    );
    assert_eq!(a.cm.stats().unwrap().retransmits, 0);
    // A late answer is dropped (no event), and destroying again is harmless.
    b.cm.sidr_accept(req, &b.qp, RDMA_UDP_QKEY, b"").unwrap();
    assert_eq!(a.cm.get_event(Duration::from_millis(200)).unwrap(), None);
    a.cm.destroy(id).unwrap();
    // The same exchange left alone: Unreachable after the two retries.
    let id =
        a.cm.sidr_resolve(cb.gid(0).unwrap(), cb.config().mac, sid, b"", 0)
            .unwrap();
    assert!(matches!(event(&b), CmEvent::SidrRequest { .. }));
    match event(&a) {
        CmEvent::Unreachable { id: i } => assert_eq!(i, id),
        e => panic!("expected unreachable, got {e:?}"),
    }
    assert_eq!(a.cm.stats().unwrap().retransmits, 2);
}
