//! Property tests: mutated and random MADs never panic the CM, keep its state
//! within the caps, and MADs from a third host never touch an established
//! connection.

use core::net::Ipv4Addr;

use proptest::prelude::*;
use roce_cm::testing::{ChannelConfig, Pair, Side};
use roce_cm::*;
use roce_proto::time::Instant;
use roce_wire::Gid;
use roce_wire::cm::{PathRepr, PortSpace, transport_type};
use roce_wire::mad::MAD_LEN;
use roce_wire::{Psn, Qpn};

const SID: u64 = roce_wire::cm::service_id(PortSpace::Tcp, 1);

fn peer(last: u8) -> Peer {
    Peer::gsi(Gid::from_ipv4(Ipv4Addr::new(198, 18, 0, last)))
}

fn cfg(seed: u64) -> CmConfig {
    CmConfig {
        cm_response_timeout: 8,
        packet_life_time: 6,
        ack_delay: 6,
        max_connections: 32,
        max_pending_requests: 8,
        max_tx_queue: 64,
        local_ca_guid: seed,
        seed,
        ..CmConfig::default()
    }
}

/// Two CMs with one established connection, and the genuine MADs of a
/// whole connection life (to mutate).
fn established() -> (Pair, ConnId, ConnId, Vec<[u8; MAD_LEN]>) {
    let mut p = Pair::new(
        Cm::new(cfg(1)),
        peer(1),
        Cm::new(cfg(2)),
        peer(2),
        ChannelConfig::default(),
    );
    p.b.listen(SID).unwrap();
    let params = ConnectParams {
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
    };
    let (now, b_peer) = (p.now, p.b_peer);
    let a_id = p.a.connect(now, b_peer, &params).unwrap();
    let mut b_id = None;
    p.run(Instant::from_millis(100), |side, cm, now, ev| {
        match (side, ev) {
            (Side::B, Event::ConnectRequest { id, .. }) => {
                b_id = Some(*id);
                let ap = AcceptParams {
                    local_qpn: Qpn::new(0x22),
                    starting_psn: Psn::new(2),
                    responder_resources: 1,
                    initiator_depth: 1,
                    rnr_retry_count: 7,
                    srq: false,
                    private_data: b"",
                };
                cm.accept(now, *id, &ap).unwrap()
            }
            (Side::A, Event::Reply { id, .. }) => cm.rtu(now, *id, b"").unwrap(),
            _ => {}
        }
    });
    let mut mads: Vec<[u8; MAD_LEN]> = p.capture.iter().map(|c| c.2).collect();
    // Also the REQ and REJ of a rejected attempt, for more message types.
    let mut q = Pair::new(
        Cm::new(cfg(3)),
        peer(1),
        Cm::new(cfg(4)),
        peer(2),
        ChannelConfig::default(),
    );
    q.b.listen(SID).unwrap();
    let (now, qb) = (q.now, q.b_peer);
    q.a.connect(now, qb, &params).unwrap();
    q.run(Instant::from_millis(100), |side, cm, now, ev| {
        if let (Side::B, Event::ConnectRequest { id, .. }) = (side, ev) {
            cm.reject(now, *id, roce_wire::cm::rej_reason::CONSUMER_DEFINED, b"x")
                .unwrap();
        }
    });
    mads.extend(q.capture.iter().map(|c| c.2));
    (p, a_id, b_id.unwrap(), mads)
}

#[derive(Debug, Clone)]
enum Input {
    /// A genuine MAD with bytes changed: (which, [(offset, xor)]), from which
    /// host, to which side, after how many µs.
    Mutated(usize, Vec<(usize, u8)>, u8, bool, u32),
    /// A genuine MAD cut short.
    Truncated(usize, usize, u8, bool),
    /// Random bytes.
    Random(Vec<u8>, u8, bool),
}

fn input() -> impl Strategy<Value = Input> {
    let host = prop_oneof![Just(1u8), Just(2u8), Just(66u8)];
    prop_oneof![
        (
            any::<usize>(),
            proptest::collection::vec((0usize..MAD_LEN, 1u8..=255), 1..6),
            host.clone(),
            any::<bool>(),
            0u32..3000
        )
            .prop_map(|(w, m, h, s, t)| Input::Mutated(w, m, h, s, t)),
        (any::<usize>(), 0usize..MAD_LEN, host.clone(), any::<bool>())
            .prop_map(|(w, n, h, s)| Input::Truncated(w, n, h, s)),
        (
            proptest::collection::vec(any::<u8>(), 0..300),
            host,
            any::<bool>()
        )
            .prop_map(|(b, h, s)| Input::Random(b, h, s)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Whatever arrives, from whomever: no panic, caps hold, and the
    /// established connection survives everything the third host sends.
    #[test]
    fn hostile_sequences(inputs in proptest::collection::vec(input(), 1..60)) {
        let (mut p, a_id, b_id, mads) = established();
        let mut now = p.now;
        for inp in inputs {
            let (bytes, host, to_a, dt): (Vec<u8>, u8, bool, u32) = match inp {
                Input::Mutated(w, muts, h, s, t) => {
                    let mut m = mads[w % mads.len()];
                    for (o, x) in muts {
                        m[o] ^= x;
                    }
                    (m.to_vec(), h, s, t)
                }
                Input::Truncated(w, n, h, s) => (mads[w % mads.len()][..n].to_vec(), h, s, 0),
                Input::Random(b, h, s) => (b, h, s, 0),
            };
            now += core::time::Duration::from_micros(u64::from(dt));
            let side = if to_a { Side::A } else { Side::B };
            let cm = p.cm(side);
            cm.handle_mad(now, peer(host), &bytes);
            cm.handle_timeout(now);
            let mut buf = [0u8; MAD_LEN];
            while cm.poll_transmit(&mut buf).is_some() {}
            while cm.poll_event().is_some() {}
            prop_assert!(cm.connections() <= 32);
        }
        let _ = (a_id, b_id);
    }

    /// Only the third host talks: the established connection is untouched.
    #[test]
    fn third_host_never_touches_the_connection(inputs in proptest::collection::vec(input(), 1..60)) {
        let (mut p, a_id, b_id, mads) = established();
        let mut now = p.now;
        for inp in inputs {
            let (bytes, to_a, dt) = match inp {
                Input::Mutated(w, muts, _, s, t) => {
                    let mut m = mads[w % mads.len()];
                    for (o, x) in muts {
                        m[o] ^= x;
                    }
                    (m.to_vec(), s, t)
                }
                Input::Truncated(w, n, _, s) => (mads[w % mads.len()][..n].to_vec(), s, 0),
                Input::Random(b, _, s) => (b, s, 0),
            };
            now += core::time::Duration::from_micros(u64::from(dt));
            let side = if to_a { Side::A } else { Side::B };
            p.cm(side).handle_mad(now, peer(66), &bytes);
            // Also the genuine MADs replayed verbatim by the third host.
            let genuine = mads[dt as usize % mads.len()];
            p.cm(side).handle_mad(now, peer(66), &genuine);
            p.cm(side).handle_timeout(now);
        }
        prop_assert_eq!(p.a.state(a_id), Some(State::Established));
        prop_assert_eq!(p.b.state(b_id), Some(State::Established));
        for side in [Side::A, Side::B] {
            while let Some(ev) = p.cm(side).poll_event() {
                let touches = match ev {
                    Event::Established { id }
                    | Event::Rejected { id, .. }
                    | Event::Disconnected { id, .. }
                    | Event::TimewaitExit { id }
                    | Event::Unreachable { id, .. } => id == a_id || id == b_id,
                    _ => false,
                };
                prop_assert!(!touches, "event {:?} for the live connection", ev);
            }
        }
    }
}
