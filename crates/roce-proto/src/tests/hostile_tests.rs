//! Forged and misdirected input a third party can put on the wire (issue #10): the engine must check who sent a
//! packet before it acts on it, and count what it refuses.

use super::util::*;
use crate::*;

/// A connected pair that has exchanged one SEND, so a frame B→A (the ACK) is captured as a template. A runs a
/// DCQCN reaction point (`DCQCN.md` §2.3), so a CNP it accepts is acted on (`rp_cnp_handled`, rate cut).
fn pair_with_ack() -> (Pair, End, End, Vec<u8>) {
    let rp = DcqcnConfig::new(cc::Profile::Paper, 10e9);
    let mut p = Pair::with_configs(
        EngineConfig {
            dcqcn: Some(rp),
            ..cfg(MAC_A, IP_A, 1)
        },
        cfg(MAC_B, IP_B, 2),
    );
    let (a, b) = connect(&mut p, &ConnOpts::default());
    p.b.post_recv(
        b.qpn,
        &[RecvWr {
            wr_id: 1,
            sg_list: &[],
        }],
    )
    .unwrap();
    p.a.post_send(a.qpn, &[SendWr::new(1, SendOp::Send, &[])])
        .unwrap();
    p.drive();
    let ack = p
        .captured
        .iter()
        .find(|c| c.1 == Dir::BtoA && c.2[42] == 0x11)
        .expect("an ACK from B")
        .2
        .clone();
    (p, a, b, ack)
}

/// A CNP (`ROCEV2.md §6`) to `dest_qp` re-emitted from `template`, with the IPv4 source address `src`.
fn cnp_from(template: &[u8], src: [u8; 4], dest_qp: Qpn) -> Vec<u8> {
    reemit(
        template,
        |r| {
            if let roce_wire::IpRepr::Ipv4(ip) = &mut r.ip {
                ip.src_addr = src.into();
            }
            r.bth.opcode = roce_wire::Opcode(0x81);
            r.bth.becn = true;
            r.bth.ack_req = false;
            r.bth.psn = Psn::new(0);
            r.bth.dest_qp = dest_qp;
            r.ext = roce_wire::ExtRepr {
                cnp: Some(roce_wire::CnpRepr),
                ..roce_wire::ExtRepr::NONE
            };
        },
        &[],
    )
}

/// A CNP is acted on only if it comes from the QP's connected peer (`ROCEV2.md §5` receive filtering: "IP
/// source/destination not equal to the QP's address vector (RC/UC)" → drop, before any processing): a third host
/// could otherwise throttle a connection blind once DCQCN cuts the rate on CNPs. Refused CNPs count as
/// `drop_wrong_peer` on the port and the QP; a CNP to a QP that is not connected yet counts as `drop_unknown_qp`.
#[test]
fn cnp_from_a_third_host_is_dropped_not_handled() {
    let (mut p, a, _b, ack) = pair_with_ack();
    let now = p.now;
    let forged = cnp_from(&ack, [10, 0, 0, 3], a.qpn);
    p.a.handle_frame(now, &forged);
    assert_eq!(p.a.counters().rp_cnp_handled, 0, "forged CNP acted on");
    assert_eq!(p.a.qp_counters(a.qpn).unwrap().rp_cnp_handled, 0);
    assert!(
        !p.a.qp_rate(a.qpn, now).unwrap().limited,
        "forged CNP cut the rate"
    );
    assert_eq!(p.a.counters().drop_wrong_peer, 1);
    assert_eq!(p.a.qp_counters(a.qpn).unwrap().drop_wrong_peer, 1);

    // The same CNP from the connected peer is handled.
    let genuine = cnp_from(&ack, IP_B, a.qpn);
    p.a.handle_frame(now, &genuine);
    assert_eq!(p.a.counters().rp_cnp_handled, 1);
    assert_eq!(p.a.qp_counters(a.qpn).unwrap().rp_cnp_handled, 1);
    assert!(p.a.qp_rate(a.qpn, now).unwrap().limited);

    // A QP still in RESET accepts nothing, CNPs included.
    let idle = make_qp(&mut p.a, &ConnOpts::default());
    let to_idle = cnp_from(&ack, IP_B, idle.qpn);
    p.a.handle_frame(now, &to_idle);
    assert_eq!(p.a.counters().rp_cnp_handled, 1);
    assert_eq!(p.a.qp_counters(idle.qpn).unwrap().drop_unknown_qp, 1);
}
