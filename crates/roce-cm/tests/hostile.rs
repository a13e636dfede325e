//! Transitions one MAD at a time, command refusals, and hostile MADs: wrong
//! class / version / method, truncated, unknown attribute, malformed, forged
//! REJ / DREQ for a live connection, REQ floods, stale connections — always
//! counted drops or correct rejects, never a state change of a live
//! connection, never unbounded state.

use core::net::Ipv4Addr;

use roce_cm::*;
use roce_proto::time::Instant;
use roce_wire::cm::{
    self, CmMessage, DreqRepr, PathRepr, PortSpace, RejRepr, ReqRepr, attr, rej_reason,
    transport_type,
};
use roce_wire::mad::MAD_LEN;
use roce_wire::{CmMad, Gid, Psn, Qpn};

const SID: u64 = cm::service_id(PortSpace::Tcp, 7471);

fn config(seed: u64, guid: u64) -> CmConfig {
    CmConfig {
        cm_response_timeout: 8,
        packet_life_time: 6,
        ack_delay: 6,
        local_ca_guid: guid,
        seed,
        ..CmConfig::default()
    }
}

fn peer(last: u8) -> Peer {
    Peer::gsi(Gid::from_ipv4(Ipv4Addr::new(198, 18, 0, last)))
}

fn connect_params() -> ConnectParams<'static> {
    ConnectParams {
        service_id: SID,
        transport: transport_type::RC,
        local_qpn: Qpn::new(0x11),
        starting_psn: Psn::new(1),
        responder_resources: 1,
        initiator_depth: 1,
        retry_count: 7,
        rnr_retry_count: 7,
        path_mtu: 3,
        srq: false,
        packet_life_time: None,
        path: PathRepr::default(),
        private_data: b"",
    }
}

fn accept_params() -> AcceptParams<'static> {
    AcceptParams {
        local_qpn: Qpn::new(0x22),
        starting_psn: Psn::new(2),
        responder_resources: 1,
        initiator_depth: 1,
        rnr_retry_count: 7,
        srq: false,
        private_data: b"",
    }
}

/// Every MAD `from` has queued, as bytes.
fn drain(from: &mut Cm) -> Vec<[u8; MAD_LEN]> {
    let mut out = Vec::new();
    let mut buf = [0u8; MAD_LEN];
    while from.poll_transmit(&mut buf).is_some() {
        out.push(buf);
    }
    out
}

/// Delivers every queued MAD of `from` to `to`; returns them.
fn pump(from: &mut Cm, from_peer: Peer, to: &mut Cm, now: Instant) -> Vec<[u8; MAD_LEN]> {
    let mads = drain(from);
    for m in &mads {
        to.handle_mad(now, from_peer, m);
    }
    mads
}

fn events(cm: &mut Cm) -> Vec<Event> {
    std::iter::from_fn(|| cm.poll_event()).collect()
}

struct Established {
    a: Cm,
    b: Cm,
    a_id: ConnId,
    b_id: ConnId,
    /// The REQ, REP and RTU that went over the wire.
    req: [u8; MAD_LEN],
    rep: [u8; MAD_LEN],
}

/// A (198.18.0.1) connects to B (198.18.0.2), one MAD at a time, checking
/// each transition.
fn establish() -> Established {
    let now = Instant::ZERO;
    let mut a = Cm::new(config(1, 0xa));
    let mut b = Cm::new(config(2, 0xb));
    let listen = b.listen(SID).unwrap();
    let a_id = a.connect(now, peer(2), &connect_params()).unwrap();
    assert_eq!(a.state(a_id), Some(State::ReqSent));
    assert!(a.poll_timeout().is_some());
    let req = pump(&mut a, peer(1), &mut b, now);
    assert_eq!(req.len(), 1);
    let ev = events(&mut b);
    let [
        Event::ConnectRequest {
            id: b_id,
            listen: l,
            peer: p,
            req: r,
        },
    ] = ev.as_slice()
    else {
        panic!("{ev:?}")
    };
    assert_eq!((*l, *p, r.local_qpn), (listen, peer(1), Qpn::new(0x11)));
    let b_id = *b_id;
    assert_eq!(b.state(b_id), Some(State::ReqRcvd));
    assert_eq!(b.poll_timeout(), None);
    b.accept(now, b_id, &accept_params()).unwrap();
    assert_eq!(b.state(b_id), Some(State::RepSent));
    assert!(b.poll_timeout().is_some());
    let rep = pump(&mut b, peer(2), &mut a, now);
    assert_eq!(a.state(a_id), Some(State::RepRcvd));
    assert_eq!(a.poll_timeout(), None);
    assert!(matches!(events(&mut a).as_slice(), [Event::Reply { id, .. }] if *id == a_id));
    a.rtu(now, a_id, b"").unwrap();
    assert_eq!(a.state(a_id), Some(State::Established));
    assert_eq!(events(&mut a), [Event::Established { id: a_id }]);
    pump(&mut a, peer(1), &mut b, now);
    assert_eq!(b.state(b_id), Some(State::Established));
    assert_eq!(events(&mut b), [Event::Established { id: b_id }]);
    assert_eq!(b.poll_timeout(), None);
    assert_eq!(a.remote_comm_id(a_id), b.local_comm_id(b_id));
    assert_eq!(b.remote_comm_id(b_id), a.local_comm_id(a_id));
    Established {
        a,
        b,
        a_id,
        b_id,
        req: req[0],
        rep: rep[0],
    }
}

fn tid_of(mad: &[u8; MAD_LEN]) -> u64 {
    CmMad::parse(mad).unwrap().header.tid
}

fn mad_bytes(tid: u64, msg: CmMessage) -> [u8; MAD_LEN] {
    let mut b = [0u8; MAD_LEN];
    CmMad::new(tid, 0, msg).emit(&mut b).unwrap();
    b
}

/// Asserts the connection pair is untouched: both established, nothing
/// queued, no event.
fn assert_untouched(e: &mut Established) {
    assert_eq!(e.a.state(e.a_id), Some(State::Established));
    assert_eq!(e.b.state(e.b_id), Some(State::Established));
    assert!(drain(&mut e.a).is_empty());
    assert!(events(&mut e.a).is_empty());
    assert!(events(&mut e.b).is_empty());
}

#[test]
fn one_mad_at_a_time_transitions() {
    let mut e = establish();
    let now = Instant::from_millis(1);
    // Disconnect: DREQ_SENT -> DREQ_RCVD -> DREP -> TIMEWAIT on both.
    e.a.disconnect(now, e.a_id, b"").unwrap();
    assert_eq!(e.a.state(e.a_id), Some(State::DreqSent));
    pump(&mut e.a, peer(1), &mut e.b, now);
    assert_eq!(e.b.state(e.b_id), Some(State::DreqRcvd));
    assert!(matches!(
        events(&mut e.b).as_slice(),
        [Event::Disconnected {
            cause: Disconnect::Request(_),
            ..
        }]
    ));
    e.b.disconnect(now, e.b_id, b"").unwrap();
    assert_eq!(e.b.state(e.b_id), Some(State::Timewait));
    let drep = pump(&mut e.b, peer(2), &mut e.a, now);
    assert_eq!(e.a.state(e.a_id), Some(State::Timewait));
    assert!(matches!(
        events(&mut e.a).as_slice(),
        [Event::Disconnected {
            cause: Disconnect::Reply(_),
            ..
        }]
    ));
    // A duplicate DREQ in timewait gets the stored DREP again, byte for byte.
    let dreq = {
        e.a.handle_timeout(now);
        // Rebuild A's DREQ from what B knows: replay the DREP's mirror.
        let d = CmMad::parse(&drep[0]).unwrap();
        let CmMessage::Drep(drep_msg) = d.message else {
            panic!()
        };
        mad_bytes(
            d.header.tid,
            CmMessage::Dreq(DreqRepr {
                local_comm_id: drep_msg.remote_comm_id,
                remote_comm_id: drep_msg.local_comm_id,
                remote_qpn_eecn: Qpn::new(0x22),
                ..DreqRepr::default()
            }),
        )
    };
    let dups = e.b.stats().duplicates;
    e.b.handle_mad(now, peer(1), &dreq);
    assert_eq!(e.b.stats().duplicates, dups + 1);
    assert_eq!(drain(&mut e.b), drep);
    assert_eq!(e.b.stats().drep_for_unknown, 0);
    // Timewait ends: both released, TimewaitExit, ids stale.
    let later = Instant::from_millis(100);
    e.a.handle_timeout(later);
    e.b.handle_timeout(later);
    assert_eq!(events(&mut e.a), [Event::TimewaitExit { id: e.a_id }]);
    assert_eq!(events(&mut e.b), [Event::TimewaitExit { id: e.b_id }]);
    assert_eq!(e.a.state(e.a_id), None);
    assert_eq!(e.a.connections() + e.b.connections(), 0);
    assert_eq!(e.a.disconnect(later, e.a_id, b""), Err(CmError::UnknownId));
    // Now the same DREQ names nothing: B answers with a DREP built from it.
    e.b.handle_mad(later, peer(1), &dreq);
    assert_eq!(e.b.stats().drep_for_unknown, 1);
    let reply = drain(&mut e.b);
    assert_eq!(reply.len(), 1);
    assert_eq!(tid_of(&reply[0]), tid_of(&dreq));
}

#[test]
fn duplicate_req_while_rep_sent_resends_the_rep() {
    let now = Instant::ZERO;
    let mut a = Cm::new(config(1, 0xa));
    let mut b = Cm::new(config(2, 0xb));
    b.listen(SID).unwrap();
    a.connect(now, peer(2), &connect_params()).unwrap();
    let req = pump(&mut a, peer(1), &mut b, now);
    let Some(Event::ConnectRequest { id, .. }) = b.poll_event() else {
        panic!()
    };
    // While the application decides, a duplicate REQ gets an MRA (rdma_cm's
    // delayed MRA, service timeout 24), and the next one the same MRA.
    b.handle_mad(now, peer(1), &req[0]);
    let mra = drain(&mut b);
    assert_eq!(mra.len(), 1);
    let CmMessage::Mra(m) = CmMad::parse(&mra[0]).unwrap().message else {
        panic!()
    };
    assert_eq!(
        (m.service_timeout, m.message_mraed),
        (24, cm::msg_response::REQ)
    );
    assert_eq!(b.state(id), Some(State::MraReqSent));
    b.handle_mad(now, peer(1), &req[0]);
    assert_eq!(drain(&mut b), mra);
    assert_eq!(b.stats().duplicates, 2);
    // The MRA reaches A: it now waits 4.096 µs × 2^24 + 2 × packet lifetime.
    a.handle_mad(now, peer(2), &mra[0]);
    assert_eq!(a.poll_timeout(), Some(now + iba_time(24) + iba_time(6) * 2));
    b.accept(now, id, &accept_params()).unwrap();
    let rep = drain(&mut b);
    b.handle_mad(now, peer(1), &req[0]);
    assert_eq!(drain(&mut b), rep);
    assert_eq!(b.stats().duplicates, 3);
    assert!(b.poll_event().is_none());
    // Without the option a duplicate is only counted.
    let mut c = Cm::new(CmConfig {
        mra_on_duplicate_req: None,
        ..config(3, 0xc)
    });
    c.listen(SID).unwrap();
    c.handle_mad(now, peer(1), &req[0]);
    c.handle_mad(now, peer(1), &req[0]);
    assert!(drain(&mut c).is_empty());
    assert_eq!(c.stats().duplicates, 1);
}

#[test]
fn commands_in_the_wrong_state_are_refused() {
    let now = Instant::ZERO;
    let mut a = Cm::new(config(1, 0xa));
    let id = a.connect(now, peer(2), &connect_params()).unwrap();
    assert_eq!(
        a.accept(now, id, &accept_params()),
        Err(CmError::InvalidState(State::ReqSent))
    );
    assert_eq!(
        a.rtu(now, id, b""),
        Err(CmError::InvalidState(State::ReqSent))
    );
    assert_eq!(
        a.disconnect(now, id, b""),
        Err(CmError::InvalidState(State::ReqSent))
    );
    assert_eq!(
        a.reject(now, id, rej_reason::CONSUMER_DEFINED, b""),
        Err(CmError::InvalidState(State::ReqSent))
    );
    let long = [0u8; 93];
    let mut p = connect_params();
    p.private_data = &long;
    assert_eq!(
        a.connect(now, peer(2), &p),
        Err(CmError::PrivateDataTooLong { max: 92 })
    );
    let mut p = connect_params();
    p.transport = transport_type::RD;
    assert_eq!(a.connect(now, peer(2), &p), Err(CmError::InvalidArgument));
    a.listen(SID).unwrap();
    assert_eq!(a.listen(SID), Err(CmError::ServiceIdInUse));
    // destroy of a pending REQ sends a REJ (Timeout) and forgets it.
    drain(&mut a);
    a.destroy(now, id);
    let rej = drain(&mut a);
    let CmMessage::Rej(r) = CmMad::parse(&rej[0]).unwrap().message else {
        panic!()
    };
    assert_eq!(r.reason, rej_reason::TIMEOUT);
    assert_eq!(a.state(id), None);
    assert_eq!(a.rtu(now, id, b""), Err(CmError::UnknownId));
}

#[test]
fn time_encoding() {
    assert_eq!(iba_time(0).as_nanos(), 4096);
    assert_eq!(iba_time(20).as_nanos(), 4096 << 20);
    assert_eq!(iba_time(31), iba_time(200));
    // Linux cm_ack_timeout examples.
    assert_eq!(ack_timeout(6, 6), 8);
    assert_eq!(ack_timeout(15, 16), 17);
    assert_eq!(ack_timeout(20, 3), 20);
    assert_eq!(ack_timeout(17, 16), 18);
    assert_eq!(ack_timeout(31, 31), 31);
}

#[test]
fn hostile_headers_are_counted_drops() {
    let mut e = establish();
    let now = Instant::from_millis(1);
    let good = e.rep;
    type Mutate = fn(&mut [u8; MAD_LEN]);
    type Counter = fn(&CmStats) -> u64;
    let cases: [(Mutate, Counter); 8] = [
        (|m| m[0] = 2, |s| s.drop_bad_base_version),
        (|m| m[1] = 0x03, |s| s.drop_bad_class),
        (|m| m[2] = 1, |s| s.drop_bad_class_version),
        (|m| m[3] = 0x81, |s| s.drop_bad_method),
        (|m| m[17] = 0x19, |s| s.drop_unknown_attr), // LAP
        (|m| m[17] = 0x1a, |s| s.drop_unknown_attr), // APR
        (|m| m[17] = 0x01, |s| s.drop_unknown_attr), // ClassPortInfo
        (|m| m[16] = 0xff, |s| s.drop_unknown_attr),
    ];
    for (mutate, counter) in cases {
        let mut m = good;
        mutate(&mut m);
        let before = counter(e.a.stats());
        e.a.handle_mad(now, peer(2), &m);
        assert_eq!(counter(e.a.stats()), before + 1);
    }
    // Truncated at every length.
    for n in 0..MAD_LEN {
        e.a.handle_mad(now, peer(2), &good[..n]);
    }
    assert_eq!(e.a.stats().drop_truncated, MAD_LEN as u64);
    // A REJ whose ARI length points past its area.
    let mut rej = mad_bytes(
        1,
        CmMessage::Rej(RejRepr {
            remote_comm_id: e.a.local_comm_id(e.a_id).unwrap(),
            ..RejRepr::default()
        }),
    );
    rej[24 + 9] = 100 << 1;
    e.a.handle_mad(now, peer(2), &rej);
    assert_eq!(e.a.stats().drop_malformed, 1);
    assert_untouched(&mut e);
    let s = e.a.stats();
    assert_eq!(s.rx_mads, 1 + 8 + MAD_LEN as u64 + 1);
}

#[test]
fn forged_rej_and_dreq_cannot_tear_down_a_live_connection() {
    let mut e = establish();
    let now = Instant::from_millis(1);
    let a_local = e.a.local_comm_id(e.a_id).unwrap();
    let b_local = e.b.local_comm_id(e.b_id).unwrap();
    let setup_tid = tid_of(&e.req);
    let rej = |tid, local, remote| {
        mad_bytes(
            tid,
            CmMessage::Rej(RejRepr {
                local_comm_id: local,
                remote_comm_id: remote,
                reason: rej_reason::CONSUMER_DEFINED,
                ..RejRepr::default()
            }),
        )
    };
    // Right IDs and TID, but from a third host.
    e.a.handle_mad(now, peer(66), &rej(setup_tid, b_local, a_local));
    // From the peer, wrong TID.
    e.a.handle_mad(now, peer(2), &rej(setup_tid ^ 1, b_local, a_local));
    // From the peer, wrong sender comm ID.
    e.a.handle_mad(now, peer(2), &rej(setup_tid, b_local ^ 1, a_local));
    assert_eq!(e.a.stats().drop_forged, 3);
    // Right everything: a REJ in ESTABLISHED is not a valid transition.
    e.a.handle_mad(now, peer(2), &rej(setup_tid, b_local, a_local));
    assert_eq!(e.a.stats().drop_wrong_state, 1);
    // Unknown comm ID.
    e.a.handle_mad(now, peer(2), &rej(setup_tid, b_local, a_local ^ 0x5555));
    assert_eq!(e.a.stats().drop_unmatched, 1);

    let dreq = |local, remote, qpn| {
        mad_bytes(
            77,
            CmMessage::Dreq(DreqRepr {
                local_comm_id: local,
                remote_comm_id: remote,
                remote_qpn_eecn: Qpn::new(qpn),
                ..DreqRepr::default()
            }),
        )
    };
    let forged = e.b.stats().drop_forged;
    // Wrong host, wrong QPN, wrong sender comm ID.
    e.b.handle_mad(now, peer(66), &dreq(a_local, b_local, 0x22));
    e.b.handle_mad(now, peer(1), &dreq(a_local, b_local, 0x23));
    e.b.handle_mad(now, peer(1), &dreq(a_local ^ 1, b_local, 0x22));
    assert_eq!(e.b.stats().drop_forged, forged + 3);
    assert!(drain(&mut e.b).is_empty());
    assert_untouched(&mut e);
    // The genuine DREQ works.
    e.b.handle_mad(now, peer(1), &dreq(a_local, b_local, 0x22));
    assert_eq!(e.b.state(e.b_id), Some(State::DreqRcvd));
}

#[test]
fn req_flood_is_bounded_and_counted() {
    let now = Instant::ZERO;
    let mut b = Cm::new(CmConfig {
        max_pending_requests: 16,
        max_connections: 64,
        max_tx_queue: 32,
        ..config(2, 0xb)
    });
    b.listen(SID).unwrap();
    let flood = |i: u32, sid: u64| {
        mad_bytes(
            u64::from(i),
            CmMessage::Req(ReqRepr {
                local_comm_id: i + 1,
                service_id: sid,
                local_qpn: Qpn::new(i & 0xff_ffff),
                local_ca_guid: u64::from(i),
                transport_service_type: transport_type::RC,
                ..ReqRepr::default()
            }),
        )
    };
    for i in 0..10_000u32 {
        b.handle_mad(now, peer((i % 200) as u8 + 3), &flood(i, SID));
    }
    assert_eq!(b.connections(), 16);
    assert_eq!(b.stats().drop_over_cap, 10_000 - 16);
    assert_eq!(events(&mut b).len(), 16);
    assert!(drain(&mut b).is_empty());
    // REQs for a service nobody listens on: one REJ each, but the queue is
    // bounded when nobody drains it.
    for i in 0..1_000u32 {
        b.handle_mad(now, peer(9), &flood(20_000 + i, SID + 1));
    }
    assert_eq!(b.stats().rej_no_listener_sent, 1_000);
    assert_eq!(drain(&mut b).len(), 32);
    assert_eq!(b.stats().drop_tx_full, 1_000 - 32);
    assert_eq!(b.connections(), 16);
}

#[test]
fn stale_req_is_rejected_and_the_live_connection_kept() {
    let mut e = establish();
    let now = Instant::from_millis(1);
    // A REQ from A's GID, CA GUID and QPN with a new comm ID: A's QP 0x11 is
    // still connected at B.
    let mut req = CmMad::parse(&e.req).unwrap();
    let CmMessage::Req(ref mut r) = req.message else {
        panic!()
    };
    r.local_comm_id ^= 0x0f0f;
    let mut bytes = [0u8; MAD_LEN];
    req.emit(&mut bytes).unwrap();
    e.b.handle_mad(now, peer(1), &bytes);
    assert_eq!(e.b.stats().rej_stale_sent, 1);
    let rej = drain(&mut e.b);
    let CmMessage::Rej(r) = CmMad::parse(&rej[0]).unwrap().message else {
        panic!()
    };
    assert_eq!(r.reason, rej_reason::STALE_CONN);
    // The REJ names the stale REQ's comm ID, so it cannot touch A's live one.
    e.a.handle_mad(now, peer(2), &rej[0]);
    assert_eq!(e.a.stats().drop_unmatched, 1);
    assert_untouched(&mut e);
    // The original REQ again (A's own comm ID) is a plain duplicate.
    e.b.handle_mad(now, peer(1), &e.req);
    assert_eq!(e.b.stats().duplicates, 1);
    assert!(drain(&mut e.b).is_empty());
    let _ = attr::REQ;
}

/// Processes sharing one address (`docs/MULTIPROCESS.md`, QP 1): with `comm_id_prefix`, every local comm ID this CM
/// makes — active (REQ), passive (REP) and SIDR request IDs — has the prefix as its most significant byte, the byte
/// the kernel's steering program reads from the `RemoteCommID` (`RequestID`) of the MADs that come back.
#[test]
fn local_comm_ids_carry_the_configured_prefix() {
    let t0 = Instant::from_nanos(0);
    let mut a = Cm::new(CmConfig {
        comm_id_prefix: Some(0xab),
        ..config(1, 0xa)
    });
    let mut b = Cm::new(CmConfig {
        comm_id_prefix: Some(0x01),
        ..config(2, 0xb)
    });
    b.listen(SID).expect("listen");
    let mut seen_passive = 0;
    for i in 0..64 {
        // A QP of its own each time (the same remote QP again would be a stale connection).
        let p = ConnectParams {
            local_qpn: Qpn::new(0x100 + i),
            ..connect_params()
        };
        let id = a.connect(t0, peer(2), &p).expect("connect");
        assert_eq!(a.local_comm_id(id).map(|c| c >> 24), Some(0xab), "REQ {i}");
        let s = a.sidr_request(t0, peer(2), SID, b"").expect("sidr");
        assert_eq!(a.local_comm_id(s).map(|c| c >> 24), Some(0xab), "SIDR {i}");
        let mut buf = [0u8; MAD_LEN];
        while let Some(t) = a.poll_transmit(&mut buf) {
            let _ = t;
            b.handle_mad(t0, peer(1), &buf);
        }
        while let Some(ev) = b.poll_event() {
            if let Event::ConnectRequest { id, .. } = ev {
                assert_eq!(b.local_comm_id(id).map(|c| c >> 24), Some(0x01));
                seen_passive += 1;
            }
        }
    }
    assert_eq!(seen_passive, 64);
    // Without a prefix the IDs use all 32 bits.
    let mut c = Cm::new(config(3, 0xc));
    let tops: std::collections::HashSet<u32> = (0..64)
        .filter_map(|_| {
            let id = c.connect(t0, peer(2), &connect_params()).ok()?;
            c.local_comm_id(id).map(|v| v >> 24)
        })
        .collect();
    assert!(tops.len() > 8, "{tops:?}");
}
