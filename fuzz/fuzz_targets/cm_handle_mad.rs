//! Fuzz target `cm_handle_mad`: arbitrary bytes as a sequence of MADs arriving
//! at a listening CM ([`roce_cm::Cm`]).
//!
//! The input is cut into records: one control byte (bits 0-1: which of three
//! peers sends; bits 2-4: how far the clock moves, 0 .. 7 × 1 ms; bits 5-7:
//! how the application answers a connect request: accept, reject, MRA, or
//! nothing) and up to 256 MAD bytes (a length byte first). After every record
//! the CM's timers run and its outputs are drained, answering events as the
//! control byte says. Must never panic; the connection and transmit caps must
//! hold.

#![no_main]

use core::net::Ipv4Addr;
use core::time::Duration;

use libfuzzer_sys::fuzz_target;
use roce_cm::{AcceptParams, Cm, CmConfig, Event, Peer};
use roce_proto::time::Instant;
use roce_wire::cm::{PortSpace, rej_reason, service_id};
use roce_wire::mad::MAD_LEN;
use roce_wire::{Gid, Psn, Qpn};

fuzz_target!(|data: &[u8]| {
    let mut cm = Cm::new(CmConfig {
        max_connections: 16,
        max_pending_requests: 4,
        max_tx_queue: 8,
        cm_response_timeout: 8,
        packet_life_time: 6,
        ack_delay: 6,
        ..CmConfig::default()
    });
    cm.listen(service_id(PortSpace::Tcp, 1)).unwrap();
    cm.listen(service_id(PortSpace::Udp, 1)).unwrap();
    let peers = [1u8, 2, 3].map(|l| Peer::gsi(Gid::from_ipv4(Ipv4Addr::new(198, 18, 0, l))));
    let mut now = Instant::ZERO;
    let mut rest = data;
    while let [ctl, len, tail @ ..] = rest {
        let n = usize::from(*len).min(tail.len()).min(MAD_LEN);
        let (mad, next) = tail.split_at(n);
        rest = next;
        now += Duration::from_millis(u64::from((ctl >> 2) & 7));
        cm.handle_timeout(now);
        cm.handle_mad(now, peers[usize::from(ctl & 3) % 3], mad);
        while let Some(ev) = cm.poll_event() {
            match (ev, ctl >> 5) {
                (Event::ConnectRequest { id, .. }, 0 | 1) => {
                    let p = AcceptParams {
                        local_qpn: Qpn::new(0x20),
                        starting_psn: Psn::new(0),
                        responder_resources: 1,
                        initiator_depth: 1,
                        rnr_retry_count: 7,
                        srq: false,
                        private_data: b"",
                    };
                    cm.accept(now, id, &p).unwrap();
                }
                (Event::ConnectRequest { id, .. }, 2) => {
                    cm.reject(now, id, rej_reason::CONSUMER_DEFINED, b"")
                        .unwrap();
                }
                (Event::ConnectRequest { id, .. }, 3) => cm.mra(now, id, 10, b"").unwrap(),
                (Event::Disconnected { id, .. }, _) => {
                    let _ = cm.disconnect(now, id, b"");
                }
                (Event::SidrRequest { id, .. }, _) => {
                    cm.sidr_reply(now, id, 0, Qpn::new(0x21), 1, b"").unwrap();
                }
                _ => {}
            }
        }
        let mut buf = [0u8; MAD_LEN];
        let mut sent = 0;
        while cm.poll_transmit(&mut buf).is_some() {
            sent += 1;
        }
        assert!(sent <= 8, "transmit queue beyond its cap");
        assert!(cm.connections() <= 16, "connections beyond the cap");
        let _ = cm.poll_timeout();
    }
});
