//! The connection manager for callers that move their QPs themselves (`roce_verbs::cm` `connect_qpn` /
//! `accept_qpn` / `establish`, what rocev2's librdmacm uses): the CM exchanges REQ/REP/RTU without touching a QP,
//! the active side sees `ConnectResponse` with the responder's QPN and PSN, and a SEND then works over QPs moved by
//! the caller. And `open_listening`: a REQ that reached a device before its CM existed meets the listen (with
//! `open` then `listen`, the same REQ is rejected with reason 8, invalid service ID).

use std::time::Duration;

use roce_verbs::cm::{CmEvent, ConnectionManager};
use roce_verbs::*;

const WAIT: Duration = Duration::from_secs(10);

struct End {
    ctx: Context,
    _pd: Pd,
    cq: Cq,
    qp: Qp,
    buf: MrBuf,
    mr: Mr,
}

fn end(ctx: &Context) -> End {
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(64, None, Moderation::default()).unwrap();
    let cap = QpCap {
        max_send_wr: 16,
        max_recv_wr: 16,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 64,
    };
    let qp = pd.create_qp(QpType::Rc, &cq, &cq, cap, true).unwrap();
    let buf = MrBuf::new(4096).unwrap();
    let mr = pd.reg_mr(&buf, AccessFlags::LOCAL_WRITE).unwrap();
    End {
        ctx: ctx.clone(),
        _pd: pd,
        cq,
        qp,
        buf,
        mr,
    }
}

fn event(cm: &ConnectionManager) -> CmEvent {
    cm.get_event(WAIT)
        .unwrap()
        .expect("a CM event within the wait")
}

fn endpoint(e: &End, psn: Psn) -> QpEndpoint {
    QpEndpoint {
        qpn: e.qp.qpn(),
        psn,
        gid: e.ctx.gid(0).unwrap(),
        mac: e.ctx.config().mac,
    }
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

const SERVICE: u64 = roce_wire::cm::service_id(roce_wire::cm::PortSpace::Tcp, 20002);

#[test]
fn connect_and_accept_by_qpn_leave_the_qps_to_the_caller() {
    let (ca, cb) = Context::sim_pair(RuntimeConfig::default()).unwrap();
    let (a, b) = (end(&ca), end(&cb));
    let (cm_a, cm_b) = (
        ConnectionManager::open(&ca).unwrap(),
        ConnectionManager::open(&cb).unwrap(),
    );
    cm_b.listen(SERVICE).unwrap();
    let opts = ConnectOpts::default();
    let (id_a, psn_a) = cm_a
        .connect_qpn(
            a.qp.qpn(),
            QpType::Rc,
            cb.gid(0).unwrap(),
            cb.config().mac,
            SERVICE,
            b"req",
            &opts,
        )
        .unwrap();
    let (id_b, rqpn, rpsn) = match event(&cm_b) {
        CmEvent::ConnectRequest {
            id,
            remote_qpn,
            remote_psn,
            private_data,
            ..
        } => {
            assert_eq!(&private_data[..3], b"req");
            (id, remote_qpn, remote_psn)
        }
        e => panic!("expected a connect request, got {e:?}"),
    };
    assert_eq!((rqpn, rpsn), (a.qp.qpn(), psn_a));
    let p = cm_b.request_params(id_b).expect("the REQ's parameters");
    assert_eq!(p.path_mtu, opts.mtu as u8);
    assert_eq!(
        (p.retry_count, p.rnr_retry_count),
        (opts.retry_cnt, opts.rnr_retry)
    );
    // B moves its QP itself, then answers.
    let psn_b = cb.random_psn().unwrap();
    b.qp.connect(&endpoint(&a, psn_a), psn_b, &opts).unwrap();
    cm_b.accept_qpn(id_b, b.qp.qpn(), psn_b, b"rep", &opts)
        .unwrap();
    match event(&cm_a) {
        CmEvent::ConnectResponse {
            id,
            remote_qpn,
            remote_psn,
            private_data,
            ..
        } => {
            assert_eq!(id, id_a);
            assert_eq!((remote_qpn, remote_psn), (b.qp.qpn(), psn_b));
            assert_eq!(&private_data[..3], b"rep");
        }
        e => panic!("expected a connect response, got {e:?}"),
    }
    // The CM left A's QP alone.
    assert_eq!(a.qp.query().unwrap().qp_state, QpState::Reset);
    a.qp.connect(&endpoint(&b, psn_b), psn_a, &opts).unwrap();
    cm_a.establish(id_a).unwrap();
    assert!(matches!(event(&cm_b), CmEvent::Established { id, .. } if id == id_b));
    assert!(matches!(event(&cm_a), CmEvent::Established { id, .. } if id == id_a));
    let msg = b"a SEND over QPs the caller moved";
    b.qp.post_recv(&[RecvWr {
        wr_id: 9,
        sg_list: &[b.mr.sge(0, 256)],
    }])
    .unwrap();
    let data = [&msg[..]];
    a.qp.post_send(&[SendWr::new(1, SendOp::Send, &[]).inline(&data).signaled()])
        .unwrap();
    let wc = poll_one(&b.cq);
    assert_eq!((wc.status, wc.wr_id), (WcStatus::Success, 9));
    assert_eq!(&b.buf.to_vec()[..msg.len()], msg);
    assert_eq!(poll_one(&a.cq).status, WcStatus::Success);
    // A second RTU is refused (the connection is not waiting for one).
    assert!(cm_a.establish(id_a).is_err());
}

/// A's REQ reaches B's device (B's runtime runs, its CM does not exist yet); then B starts its CM with `listen`.
fn request_before_the_cm(open_listening: bool) -> CmEvent {
    let (ca, cb) = Context::sim_pair(RuntimeConfig::default()).unwrap();
    let (a, _b) = (end(&ca), end(&cb));
    let cm_a = ConnectionManager::open(&ca).unwrap();
    cm_a.connect_qpn(
        a.qp.qpn(),
        QpType::Rc,
        cb.gid(0).unwrap(),
        cb.config().mac,
        SERVICE,
        b"",
        &ConnectOpts::default(),
    )
    .unwrap();
    // Let the REQ cross and wait at B's GSI (well inside the CM's first response timeout, ~4 s).
    let t0 = std::time::Instant::now();
    while t0.elapsed() < Duration::from_millis(100) {
        ca.progress();
        cb.progress();
        std::thread::sleep(Duration::from_millis(1));
    }
    if open_listening {
        let (cm_b, _l) = ConnectionManager::open_listening(&cb, SERVICE).unwrap();
        event(&cm_b)
    } else {
        let cm_b = ConnectionManager::open(&cb).unwrap();
        cm_b.listen(SERVICE).unwrap();
        event(&cm_a)
    }
}

#[test]
fn a_request_that_arrived_before_the_cm_meets_open_listening() {
    assert!(matches!(
        request_before_the_cm(true),
        CmEvent::ConnectRequest { .. }
    ));
    // The sequence the library used before (open, then listen): the waiting REQ is rejected as for no listener.
    match request_before_the_cm(false) {
        CmEvent::Rejected { reason, .. } => assert_eq!(reason, 8),
        e => panic!("expected a reject, got {e:?}"),
    }
}
