//! Scenario tests: two CMs exchange MADs through the harness channel, clean
//! and lossy / duplicating / reordering, and always reach the same end state.

use core::net::Ipv4Addr;
use core::time::Duration;

use roce_cm::testing::{ChannelConfig, Pair, Side};
use roce_cm::*;
use roce_proto::time::Instant;
use roce_wire::cm::{self, PathRepr, PortSpace, rej_reason, transport_type};
use roce_wire::{Gid, Psn, Qpn};

pub fn fast_config(seed: u64, guid: u64) -> CmConfig {
    CmConfig {
        cm_response_timeout: 8, // 1.05 ms
        packet_life_time: 6,    // 262 µs
        ack_delay: 6,
        max_cm_retries: 15,
        local_ca_guid: guid,
        seed,
        ..CmConfig::default()
    }
}

pub fn peers() -> (Peer, Peer) {
    (
        Peer::gsi(Gid::from_ipv4(Ipv4Addr::new(198, 18, 0, 1))),
        Peer::gsi(Gid::from_ipv4(Ipv4Addr::new(198, 18, 0, 2))),
    )
}

pub fn pair(seed: u64, chan: ChannelConfig) -> Pair {
    let (pa, pb) = peers();
    Pair::new(
        Cm::new(fast_config(seed, 0xa)),
        pa,
        Cm::new(fast_config(seed ^ 0xffff, 0xb)),
        pb,
        chan,
    )
}

pub const SID: u64 = cm::service_id(PortSpace::Tcp, 7471);

pub fn connect_params(private: &[u8]) -> ConnectParams<'_> {
    let (pa, pb) = peers();
    ConnectParams {
        service_id: SID,
        transport: transport_type::RC,
        local_qpn: Qpn::new(0x11),
        starting_psn: Psn::new(100),
        responder_resources: 4,
        initiator_depth: 4,
        retry_count: 7,
        rnr_retry_count: 7,
        path_mtu: 5,
        srq: false,
        packet_life_time: None,
        path: PathRepr {
            local_gid: pa.gid,
            remote_gid: pb.gid,
            hop_limit: 64,
            ..PathRepr::default()
        },
        private_data: private,
    }
}

pub fn accept_params(private: &[u8]) -> AcceptParams<'_> {
    AcceptParams {
        local_qpn: Qpn::new(0x22),
        starting_psn: Psn::new(200),
        responder_resources: 4,
        initiator_depth: 4,
        rnr_retry_count: 7,
        srq: false,
        private_data: private,
    }
}

/// The application policy of a full connection life: B accepts, A sends the
/// RTU then disconnects at once, B answers the DREQ.
fn full_life(side: Side, cm: &mut Cm, now: Instant, ev: &Event) {
    match (side, ev) {
        (Side::B, Event::ConnectRequest { id, .. }) => cm
            .accept(now, *id, &accept_params(b"hello from B"))
            .unwrap(),
        (Side::A, Event::Reply { id, .. }) => cm.rtu(now, *id, b"rtu").unwrap(),
        (Side::A, Event::Established { id }) => cm.disconnect(now, *id, b"bye").unwrap(),
        (
            Side::B,
            Event::Disconnected {
                id,
                cause: Disconnect::Request(_),
            },
        ) => cm.disconnect(now, *id, b"bye too").unwrap(),
        _ => {}
    }
}

fn kinds(p: &Pair, side: Side) -> Vec<&'static str> {
    p.events(side)
        .map(|e| match e {
            Event::ConnectRequest { .. } => "ConnectRequest",
            Event::Reply { .. } => "Reply",
            Event::Established { .. } => "Established",
            Event::Rejected { .. } => "Rejected",
            Event::Disconnected { .. } => "Disconnected",
            Event::TimewaitExit { .. } => "TimewaitExit",
            Event::Unreachable { .. } => "Unreachable",
            Event::SidrRequest { .. } => "SidrRequest",
            Event::SidrReply { .. } => "SidrReply",
        })
        .collect()
}

#[test]
fn clean_channel_full_connection_life() {
    let mut p = pair(1, ChannelConfig::default());
    p.b.listen(SID).unwrap();
    let now = p.now;
    let b_peer = p.b_peer;
    let id =
        p.a.connect(now, b_peer, &connect_params(b"hello from A"))
            .unwrap();
    assert_eq!(p.a.state(id), Some(State::ReqSent));
    p.run(Instant::from_millis(1000), full_life);
    assert_eq!(
        kinds(&p, Side::A),
        ["Reply", "Established", "Disconnected", "TimewaitExit"]
    );
    assert_eq!(
        kinds(&p, Side::B),
        [
            "ConnectRequest",
            "Established",
            "Disconnected",
            "TimewaitExit"
        ]
    );
    // Private data and parameters crossed intact.
    let req = p
        .events(Side::B)
        .find_map(|e| match e {
            Event::ConnectRequest { req, peer, .. } => Some((*req, *peer)),
            _ => None,
        })
        .unwrap();
    assert_eq!(&req.0.private_data[..12], b"hello from A");
    assert_eq!(req.0.local_qpn, Qpn::new(0x11));
    assert_eq!(req.0.starting_psn, Psn::new(100));
    assert_eq!(req.0.service_id, SID);
    assert_eq!(req.1, p.a_peer);
    let rep = p
        .events(Side::A)
        .find_map(|e| match e {
            Event::Reply { rep, .. } => Some(*rep),
            _ => None,
        })
        .unwrap();
    assert_eq!(&rep.private_data[..12], b"hello from B");
    assert_eq!(rep.local_qpn, Qpn::new(0x22));
    let drep = p.events(Side::A).find_map(|e| match e {
        Event::Disconnected {
            cause: Disconnect::Reply(d),
            ..
        } => Some(*d),
        _ => None,
    });
    assert_eq!(&drep.unwrap().private_data[..7], b"bye too");
    // Nothing lost, nothing retried, nothing left.
    assert_eq!(p.a.stats().retransmits + p.b.stats().retransmits, 0);
    assert_eq!(p.a.connections(), 0);
    assert_eq!(p.b.connections(), 0);
    assert_eq!(p.a.state(id), None);
    // REQ, RTU, DREQ from A; REP, DREP from B.
    assert_eq!(p.a.stats().tx_mads, 3);
    assert_eq!(p.b.stats().tx_mads, 2);
}

#[test]
fn lossy_duplicating_reordering_channel_always_ends_the_same() {
    let mut lost = 0;
    let mut dups = 0;
    let mut retransmits = 0;
    for seed in 0..300u64 {
        let chan = ChannelConfig {
            loss_ppm: 250_000,
            dup_ppm: 200_000,
            min_delay: Duration::from_micros(5),
            max_delay: Duration::from_micros(900),
            seed,
        };
        let mut p = pair(seed, chan);
        p.b.listen(SID).unwrap();
        let (now, b_peer) = (p.now, p.b_peer);
        let a_id = p.a.connect(now, b_peer, &connect_params(b"A")).unwrap();
        // Phase 1: connect, and let every retry run out (the connection
        // stays up: nothing disconnects it).
        p.run(Instant::from_millis(10_000), |side, cm, now, ev| {
            if let (Side::A, Event::Established { .. }) = (side, ev) {
                return;
            }
            full_life(side, cm, now, ev)
        });
        let (a, b) = (kinds(&p, Side::A), kinds(&p, Side::B));
        assert_eq!(a, ["Reply", "Established"], "seed {seed}: A {a:?} B {b:?}");
        assert_eq!(
            b,
            ["ConnectRequest", "Established"],
            "seed {seed}: A {a:?} B {b:?}"
        );
        assert_eq!(p.a.state(a_id), Some(State::Established));
        // Phase 2: A disconnects.
        let now = p.now;
        p.a.disconnect(now, a_id, b"bye").unwrap();
        p.run(Instant::from_millis(20_000), full_life);
        let a = kinds(&p, Side::A);
        let b = kinds(&p, Side::B);
        assert_eq!(
            a,
            ["Reply", "Established", "Disconnected", "TimewaitExit"],
            "seed {seed}: A {a:?} B {b:?}"
        );
        assert_eq!(
            b,
            [
                "ConnectRequest",
                "Established",
                "Disconnected",
                "TimewaitExit"
            ],
            "seed {seed}: A {a:?} B {b:?}"
        );
        // A's DREQ was answered (by B, or by B's CM after its timewait).
        assert!(
            p.events(Side::A).any(|e| matches!(
                e,
                Event::Disconnected {
                    cause: Disconnect::Reply(_),
                    ..
                }
            )),
            "seed {seed}: DREQ unanswered"
        );
        assert_eq!(p.a.connections(), 0, "seed {seed}");
        assert_eq!(p.b.connections(), 0, "seed {seed}");
        assert_eq!(
            p.a.stats().timeouts + p.b.stats().timeouts,
            0,
            "seed {seed}"
        );
        lost += p.lost;
        dups += p.a.stats().duplicates + p.b.stats().duplicates;
        retransmits += p.a.stats().retransmits + p.b.stats().retransmits;
    }
    // The channel really was hostile.
    assert!(lost > 300, "lost {lost}");
    assert!(dups > 300, "duplicates {dups}");
    assert!(retransmits > 300, "retransmits {retransmits}");
}

#[test]
fn same_seed_same_trace() {
    let run = || {
        let chan = ChannelConfig {
            loss_ppm: 300_000,
            dup_ppm: 300_000,
            min_delay: Duration::from_micros(5),
            max_delay: Duration::from_micros(2000),
            seed: 42,
        };
        let mut p = pair(42, chan);
        p.b.listen(SID).unwrap();
        let (now, b_peer) = (p.now, p.b_peer);
        p.a.connect(now, b_peer, &connect_params(b"A")).unwrap();
        p.run(Instant::from_millis(10_000), full_life);
        (p.log.clone(), *p.a.stats(), *p.b.stats())
    };
    assert_eq!(run(), run());
}

#[test]
fn reject_with_private_data_reaches_the_active_side() {
    for (seed, loss) in [(1, 0), (2, 200_000), (3, 200_000), (4, 300_000)] {
        let chan = ChannelConfig {
            loss_ppm: loss,
            dup_ppm: 100_000,
            max_delay: Duration::from_micros(500),
            seed,
            ..ChannelConfig::default()
        };
        let mut p = pair(seed, chan);
        p.b.listen(SID).unwrap();
        let (now, b_peer) = (p.now, p.b_peer);
        p.a.connect(now, b_peer, &connect_params(b"A")).unwrap();
        p.run(Instant::from_millis(10_000), |side, cm, now, ev| {
            if let (Side::B, Event::ConnectRequest { id, .. }) = (side, ev) {
                cm.reject(now, *id, rej_reason::CONSUMER_DEFINED, b"go away")
                    .unwrap();
            }
        });
        let rej = p.events(Side::A).find_map(|e| match e {
            Event::Rejected { rej, .. } => Some(*rej),
            _ => None,
        });
        let rej = rej.unwrap_or_else(|| panic!("seed {seed}: {:?}", kinds(&p, Side::A)));
        assert_eq!(rej.reason, rej_reason::CONSUMER_DEFINED);
        assert_eq!(&rej.private_data[..7], b"go away");
        assert_eq!(kinds(&p, Side::A), ["Rejected"]);
        assert_eq!(p.a.connections(), 0);
        assert_eq!(p.b.connections(), 0);
    }
}

/// The REQ's Local ACK Timeout is `ack_timeout(ack delay, packet lifetime)` (Linux `cm.c` `cm_format_req`), the
/// packet lifetime the caller's (`ConnectParams::packet_life_time`, rdma_cm's `RDMA_OPTION_ID_ACK_TIMEOUT` − 1) or
/// the configuration's; the caller's `path.local_ack_timeout` is not what the REQ carries (issue #17 interop).
#[test]
fn the_req_local_ack_timeout_comes_from_the_packet_lifetime() {
    // ack delay 6 (fast_config): lifetime 6 (config) → 8; lifetime 19 → 20; lifetime 4 → 7.
    for (plt, want) in [(None, 8), (Some(19), 20), (Some(4), 7)] {
        let mut p = pair(7, ChannelConfig::default());
        p.b.listen(SID).unwrap();
        let (now, b_peer) = (p.now, p.b_peer);
        let mut params = connect_params(b"A");
        params.packet_life_time = plt;
        params.path.local_ack_timeout = 3;
        p.a.connect(now, b_peer, &params).unwrap();
        p.run(Instant::from_millis(100), |_, _, _, _| {});
        let got = p.events(Side::B).find_map(|e| match e {
            Event::ConnectRequest { req, .. } => Some(req.primary.local_ack_timeout),
            _ => None,
        });
        assert_eq!(got, Some(want), "packet lifetime {plt:?}");
        assert_eq!(ack_timeout(6, plt.unwrap_or(6)), want);
    }
}

#[test]
fn no_listener_is_rejected_with_invalid_service_id() {
    let mut p = pair(5, ChannelConfig::default());
    let (now, b_peer) = (p.now, p.b_peer);
    p.a.connect(now, b_peer, &connect_params(b"")).unwrap();
    p.run(Instant::from_millis(1000), |_, _, _, _| {});
    let reason = p.events(Side::A).find_map(|e| match e {
        Event::Rejected { rej, .. } => Some(rej.reason),
        _ => None,
    });
    assert_eq!(reason, Some(rej_reason::INVALID_SERVICE_ID));
    assert_eq!(p.b.stats().rej_no_listener_sent, 1);
    assert_eq!(p.b.connections(), 0);
}

#[test]
fn unanswered_req_is_retried_then_unreachable() {
    let chan = ChannelConfig {
        loss_ppm: 1_000_000,
        ..ChannelConfig::default()
    };
    let mut p = pair(6, chan);
    p.b.listen(SID).unwrap();
    let (now, b_peer) = (p.now, p.b_peer);
    let id = p.a.connect(now, b_peer, &connect_params(b"")).unwrap();
    p.run(Instant::from_millis(100_000), |_, _, _, _| {});
    assert_eq!(
        p.events(Side::A).collect::<Vec<_>>(),
        [&Event::Unreachable {
            id,
            attr_id: cm::attr::REQ
        }]
    );
    let c = p.a.config();
    let per_try = iba_time(c.packet_life_time) * 2 + iba_time(c.cm_response_timeout);
    // The REQ, 15 retries, then the REJ(Timeout).
    assert_eq!(p.a.stats().retransmits, 15);
    assert_eq!(p.a.stats().tx_mads, 17);
    assert_eq!(p.a.stats().timeouts, 1);
    let gave_up_at = p.log.last().unwrap().0;
    assert_eq!(gave_up_at, Instant::ZERO + per_try * 16);
    assert_eq!(p.a.connections(), 0);
}

#[test]
fn mra_extends_the_active_timeout() {
    let mut p = pair(7, ChannelConfig::default());
    p.b.listen(SID).unwrap();
    let (now, b_peer) = (p.now, p.b_peer);
    let a_id = p.a.connect(now, b_peer, &connect_params(b"")).unwrap();
    let mut b_id = None;
    // B answers with an MRA asking for 4.096 µs × 2^14 ≈ 67 ms.
    p.run(Instant::from_millis(30), |side, cm, now, ev| {
        if let (Side::B, Event::ConnectRequest { id, .. }) = (side, ev) {
            cm.mra(now, *id, 14, b"wait").unwrap();
            b_id = Some(*id);
        }
    });
    // 30 ms is far past A's 1.6 ms REQ timeout: without the MRA it would have
    // retried many times.
    assert_eq!(p.a.state(a_id), Some(State::MraReqRcvd));
    assert_eq!(p.a.stats().retransmits, 0);
    let b_id = b_id.unwrap();
    assert_eq!(p.b.state(b_id), Some(State::MraReqSent));
    let now = p.now;
    p.b.accept(now, b_id, &accept_params(b"")).unwrap();
    p.run(Instant::from_millis(1000), full_life);
    assert_eq!(
        kinds(&p, Side::A),
        ["Reply", "Established", "Disconnected", "TimewaitExit"]
    );
}

#[test]
fn sidr_round_trip() {
    let mut p = pair(8, ChannelConfig::default());
    let sid = cm::service_id(PortSpace::Udp, 7174);
    p.b.listen(sid).unwrap();
    let (now, b_peer) = (p.now, p.b_peer);
    p.a.sidr_request(now, b_peer, sid, b"who is there").unwrap();
    p.run(Instant::from_millis(1000), |side, cm, now, ev| {
        if let (Side::B, Event::SidrRequest { id, req, .. }) = (side, ev) {
            assert_eq!(&req.private_data[..12], b"who is there");
            cm.sidr_reply(
                now,
                *id,
                cm::sidr_status::SUCCESS,
                Qpn::new(0x33),
                0x1234,
                b"me",
            )
            .unwrap();
        }
    });
    let rep = p.events(Side::A).find_map(|e| match e {
        Event::SidrReply { rep, .. } => Some(*rep),
        _ => None,
    });
    let rep = rep.unwrap();
    assert_eq!(rep.status, cm::sidr_status::SUCCESS);
    assert_eq!(rep.qpn, Qpn::new(0x33));
    assert_eq!(rep.qkey, 0x1234);
    assert_eq!(rep.service_id, sid);
    assert_eq!(&rep.private_data[..2], b"me");
    assert_eq!(p.a.connections() + p.b.connections(), 0);
}

#[test]
fn sidr_without_listener_is_unsupported() {
    let mut p = pair(9, ChannelConfig::default());
    let (now, b_peer) = (p.now, p.b_peer);
    p.a.sidr_request(now, b_peer, 1234, b"").unwrap();
    p.run(Instant::from_millis(1000), |_, _, _, _| {});
    let status = p.events(Side::A).find_map(|e| match e {
        Event::SidrReply { rep, .. } => Some(rep.status),
        _ => None,
    });
    assert_eq!(status, Some(cm::sidr_status::UNSUPPORTED));
}

#[test]
fn timewait_lasts_the_local_ack_timeout() {
    let mut p = pair(10, ChannelConfig::default());
    p.b.listen(SID).unwrap();
    let (now, b_peer) = (p.now, p.b_peer);
    p.a.connect(now, b_peer, &connect_params(b"")).unwrap();
    p.run(Instant::from_millis(1000), full_life);
    let c = p.a.config();
    let tw = iba_time(ack_timeout(c.ack_delay, c.packet_life_time));
    let at = |side: Side, f: fn(&Event) -> bool| {
        p.log
            .iter()
            .find(|(_, s, e)| *s == side && f(e))
            .map(|(t, _, _)| *t)
            .unwrap()
    };
    let disc = at(Side::A, |e| matches!(e, Event::Disconnected { .. }));
    let exit = at(Side::A, |e| matches!(e, Event::TimewaitExit { .. }));
    assert_eq!(exit - disc, tw);
}

#[test]
fn destroy_of_an_established_connection_disconnects_the_peer() {
    let mut p = pair(11, ChannelConfig::default());
    p.b.listen(SID).unwrap();
    let (now, b_peer) = (p.now, p.b_peer);
    let a_id = p.a.connect(now, b_peer, &connect_params(b"")).unwrap();
    p.run(Instant::from_millis(1000), |side, cm, now, ev| {
        match (side, ev) {
            (Side::B, Event::ConnectRequest { id, .. }) => {
                cm.accept(now, *id, &accept_params(b"")).unwrap()
            }
            (Side::A, Event::Reply { id, .. }) => cm.rtu(now, *id, b"").unwrap(),
            (Side::A, Event::Established { id }) => cm.destroy(now, *id),
            (
                Side::B,
                Event::Disconnected {
                    id,
                    cause: Disconnect::Request(_),
                },
            ) => cm.disconnect(now, *id, b"").unwrap(),
            _ => {}
        }
    });
    // A sees no event after destroy; B is disconnected and leaves timewait.
    assert_eq!(kinds(&p, Side::A), ["Reply", "Established"]);
    assert_eq!(
        kinds(&p, Side::B),
        [
            "ConnectRequest",
            "Established",
            "Disconnected",
            "TimewaitExit"
        ]
    );
    assert_eq!(p.a.state(a_id), None);
    assert_eq!(p.a.connections() + p.b.connections(), 0);
}

#[test]
fn passive_side_that_never_answers_is_rejected_by_the_active_timeout() {
    let (pa, pb) = peers();
    let quiet = CmConfig {
        mra_on_duplicate_req: None,
        ..fast_config(13, 0xb)
    };
    let mut p = Pair::new(
        Cm::new(fast_config(12, 0xa)),
        pa,
        Cm::new(quiet),
        pb,
        ChannelConfig::default(),
    );
    p.b.listen(SID).unwrap();
    let (now, b_peer) = (p.now, p.b_peer);
    let a_id = p.a.connect(now, b_peer, &connect_params(b"")).unwrap();
    p.run(Instant::from_millis(10_000), |_, _, _, _| {});
    // A gave up with a REJ (Timeout); B, still deciding, sees it as Rejected.
    assert_eq!(
        p.events(Side::A).collect::<Vec<_>>(),
        [&Event::Unreachable {
            id: a_id,
            attr_id: cm::attr::REQ
        }]
    );
    assert_eq!(kinds(&p, Side::B), ["ConnectRequest", "Rejected"]);
    let reason = p.events(Side::B).find_map(|e| match e {
        Event::Rejected { rej, .. } => Some(rej.reason),
        _ => None,
    });
    assert_eq!(reason, Some(rej_reason::TIMEOUT));
    assert_eq!(p.b.stats().duplicates, 15);
    assert_eq!(p.a.connections() + p.b.connections(), 0);
}

#[test]
fn active_side_that_never_sends_the_rtu_is_given_up_by_the_passive_side() {
    let mut p = pair(14, ChannelConfig::default());
    p.b.listen(SID).unwrap();
    let (now, b_peer) = (p.now, p.b_peer);
    p.a.connect(now, b_peer, &connect_params(b"")).unwrap();
    p.run(Instant::from_millis(10_000), |side, cm, now, ev| {
        if let (Side::B, Event::ConnectRequest { id, .. }) = (side, ev) {
            cm.accept(now, *id, &accept_params(b"")).unwrap();
        }
    });
    assert_eq!(kinds(&p, Side::A), ["Reply", "Rejected"]);
    assert_eq!(kinds(&p, Side::B), ["ConnectRequest", "Unreachable"]);
    assert!(p.events(Side::B).any(|e| matches!(
        e,
        Event::Unreachable {
            attr_id: cm::attr::REP,
            ..
        }
    )));
    // The REP went out 16 times; A ignored the 15 duplicates (no RTU yet).
    assert_eq!(p.b.stats().retransmits, 15);
    assert_eq!(p.a.stats().duplicates, 15);
    assert_eq!(p.a.connections() + p.b.connections(), 0);
}

#[test]
fn unanswered_dreq_times_out_into_timewait() {
    let mut p = pair(15, ChannelConfig::default());
    p.b.listen(SID).unwrap();
    let (now, b_peer) = (p.now, p.b_peer);
    p.a.connect(now, b_peer, &connect_params(b"")).unwrap();
    // B never answers the DREQ.
    p.run(Instant::from_millis(10_000), |side, cm, now, ev| {
        match (side, ev) {
            (Side::B, Event::ConnectRequest { id, .. }) => {
                cm.accept(now, *id, &accept_params(b"")).unwrap()
            }
            (Side::A, Event::Reply { id, .. }) => cm.rtu(now, *id, b"").unwrap(),
            (Side::A, Event::Established { id }) => cm.disconnect(now, *id, b"").unwrap(),
            _ => {}
        }
    });
    assert_eq!(
        kinds(&p, Side::A),
        ["Reply", "Established", "Disconnected", "TimewaitExit"]
    );
    assert!(p.events(Side::A).any(|e| matches!(
        e,
        Event::Disconnected {
            cause: Disconnect::Timeout,
            ..
        }
    )));
    assert_eq!(
        kinds(&p, Side::B),
        ["ConnectRequest", "Established", "Disconnected"]
    );
    assert_eq!(p.b.stats().duplicates, 15);
    assert_eq!(p.a.connections(), 0);
    // B still waits for its application's DREP.
    assert_eq!(p.b.connections(), 1);
}

/// A REQ from the QP of a connection the passive side still holds in timewait is a new connection, not a stale
/// one: Linux `cm_enter_timewait` takes the connection's remote QPN (and id) out of its tables
/// (`cm_cleanup_timewait`), so only live connections make a REQ stale. A peer may reuse a QP number soon (rocev2's
/// engine did at once until it allocated QPNs cyclically; librdmacm's `rstream` closes a connection and opens the
/// next between its latency and bandwidth runs).
#[test]
fn reconnect_from_the_same_qp_while_the_peer_is_in_timewait() {
    let mut p = pair(12, ChannelConfig::default());
    p.b.listen(SID).unwrap();
    let (now, b_peer) = (p.now, p.b_peer);
    p.a.connect(now, b_peer, &connect_params(b"")).unwrap();
    let mut round = 0;
    p.run(Instant::from_millis(1000), |side, cm, now, ev| {
        match (side, ev) {
            (Side::B, Event::ConnectRequest { id, .. }) => {
                cm.accept(now, *id, &accept_params(b"")).unwrap()
            }
            (Side::A, Event::Reply { id, .. }) => cm.rtu(now, *id, b"").unwrap(),
            (Side::A, Event::Established { id }) => {
                round += 1;
                if round == 1 {
                    cm.disconnect(now, *id, b"").unwrap();
                }
            }
            (
                Side::B,
                Event::Disconnected {
                    id,
                    cause: Disconnect::Request(_),
                },
            ) => cm.disconnect(now, *id, b"").unwrap(),
            // A got B's DREP: B is in timewait now; connect again from the same QP.
            (Side::A, Event::Disconnected { .. }) => {
                cm.connect(now, b_peer, &connect_params(b"")).unwrap();
            }
            _ => {}
        }
    });
    assert_eq!(
        kinds(&p, Side::B)
            .into_iter()
            .filter(|k| *k == "ConnectRequest")
            .count(),
        2,
        "B: {:?}",
        kinds(&p, Side::B)
    );
    assert_eq!(round, 2, "A: {:?}", kinds(&p, Side::A));
    assert!(!kinds(&p, Side::A).contains(&"Rejected"));
}
