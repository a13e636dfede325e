//! UdpLink over the loopback interface: two links on 127.0.x.1 / 127.0.x.2 (both local on Linux) exchange frames
//! built with roce-wire. Each test uses its own address pair so the tests run in parallel.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::{Duration, Instant as StdInstant};

use roce_link::{Instant, IpIdPolicy, Link, LinkError, UdpConfig, UdpLink};
use roce_wire::{
    BthRepr, Ecn, EtherType, EthernetAddress, EthernetRepr, ExtRepr, IpRepr, Ipv4Repr, Ipv6Repr,
    Opcode, Psn, Qpn, ROCE_V2_PORT, RoceRepr, UdpRepr, icrc, udp_sport,
};

const T0: Instant = Instant::ZERO;

fn cfg(local: IpAddr, mac: u8) -> UdpConfig {
    let mut c = UdpConfig::new(local);
    c.local_mac = [2, 0, 0, 0, 0, mac];
    c.peer_mac = [2, 0, 0, 0, 0, 0x99];
    c.mtu = 14 + 9000;
    c
}

struct F {
    src: IpAddr,
    dst: IpAddr,
    dst_mac: u8,
    sport: u16,
    dscp: u8,
    ecn: Ecn,
    ident: u16,
    ttl: u8,
    psn: u32,
}

fn frame(f: &F, payload: &[u8]) -> Vec<u8> {
    let ip = match (f.src, f.dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => IpRepr::Ipv4(Ipv4Repr {
            src_addr: s,
            dst_addr: d,
            dscp: f.dscp,
            ecn: f.ecn,
            ident: f.ident,
            dont_frag: true,
            ttl: f.ttl,
            protocol: 17,
        }),
        (IpAddr::V6(s), IpAddr::V6(d)) => IpRepr::Ipv6(Ipv6Repr {
            src_addr: s,
            dst_addr: d,
            dscp: f.dscp,
            ecn: f.ecn,
            flow_label: 0,
            next_header: 17,
            hop_limit: f.ttl,
        }),
        _ => panic!("mixed families"),
    };
    let repr = RoceRepr {
        eth: EthernetRepr {
            src_addr: EthernetAddress([2, 0, 0, 0, 0, 0x99]),
            dst_addr: EthernetAddress([2, 0, 0, 0, 0, f.dst_mac]),
            vlan: None,
            ethertype: if f.src.is_ipv4() {
                EtherType::IPV4
            } else {
                EtherType::IPV6
            },
        },
        ip,
        udp: UdpRepr {
            src_port: f.sport,
            dst_port: ROCE_V2_PORT,
        },
        bth: BthRepr {
            opcode: Opcode::RC_SEND_ONLY,
            solicited: false,
            mig_req: false,
            pad_count: ((4 - payload.len() % 4) % 4) as u8,
            pkey: 0xffff,
            fecn: false,
            becn: false,
            dest_qp: Qpn::new(0x12),
            ack_req: true,
            psn: Psn::new(f.psn),
        },
        ext: ExtRepr::NONE,
        payload_len: payload.len(),
    };
    let mut buf = vec![0u8; 14 + 40 + 8 + 12 + payload.len() + 8];
    let n = repr.emit_with_payload(&mut buf, payload).expect("emit");
    buf.truncate(n);
    buf
}

/// Receives on `l` until `want` frames arrived or 2 s passed.
fn recv(l: &mut UdpLink, want: usize) -> Vec<Vec<u8>> {
    let mut got = Vec::new();
    let t = StdInstant::now();
    while got.len() < want && t.elapsed() < Duration::from_secs(2) {
        l.rx_burst(T0, 64, &mut |f: &mut [u8]| got.push(f.to_vec()))
            .expect("rx");
        if got.len() < want {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    // Anything extra that arrives shortly afterwards is also returned (tests check counts).
    std::thread::sleep(Duration::from_millis(20));
    l.rx_burst(T0, 64, &mut |f: &mut [u8]| got.push(f.to_vec()))
        .expect("rx");
    got
}

fn pair(a: IpAddr, b: IpAddr) -> (UdpLink, UdpLink) {
    (
        UdpLink::bind(cfg(a, 0xa)).expect("bind a"),
        UdpLink::bind(cfg(b, 0xb)).expect("bind b"),
    )
}

fn v4(x: u8, y: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, x, y))
}

#[test]
fn v4_bytes_in_equal_bytes_out_with_tos_ecn_ttl() {
    let (a_ip, b_ip) = (v4(31, 1), v4(31, 2));
    let (mut a, mut b) = pair(a_ip, b_ip);
    let ecns = [Ecn::Ect0, Ecn::Ce, Ecn::NotEct, Ecn::Ect1];
    let sizes = [0usize, 1, 16, 63, 1024, 4096, 8000];
    let mut sent = Vec::new();
    for (k, &size) in sizes.iter().enumerate() {
        let payload: Vec<u8> = (0..size).map(|i| (i * 7 + k) as u8).collect();
        let f = frame(
            &F {
                src: a_ip,
                dst: b_ip,
                dst_mac: 0xb,
                sport: udp_sport(Qpn::new(0x11), Qpn::new(0x12), 0),
                dscp: [0, 26, 46, 48][k % 4],
                ecn: ecns[k % 4],
                ident: 0,
                ttl: [64, 1, 255, 17][k % 4],
                psn: k as u32,
            },
            &payload,
        );
        a.transmit(T0, &f).expect("transmit");
        sent.push(f);
    }
    assert_eq!(a.queued(), sizes.len());
    a.flush(T0).expect("flush");
    assert_eq!(a.queued(), 0);
    let got = recv(&mut b, sent.len());
    assert_eq!(got.len(), sent.len(), "stats {:?}", b.stats());
    for (g, s) in got.iter().zip(&sent) {
        assert_eq!(g, s, "rebuilt frame differs from the sent one");
        icrc::verify(&g[14..]).expect("icrc");
    }
    let (sa, sb) = (a.stats(), b.stats());
    assert_eq!(sa.tx_frames, sent.len() as u64);
    assert_eq!(sa.tx_ip_hdr_mismatch, 0);
    assert_eq!(sb.rx_frames, sent.len() as u64);
    assert_eq!(sb.rx_icrc_bad, 0);
    // Both directions count whole frames (they used to count UDP payload out, frames in).
    let frame_bytes: u64 = sent.iter().map(|f| f.len() as u64).sum();
    assert_eq!(sa.tx_bytes, frame_bytes);
    assert_eq!(sb.rx_bytes, frame_bytes);
    // One receive socket plus one source-port socket.
    assert_eq!(sa.tx_sockets, 2);
}

#[test]
fn corrupted_payload_is_counted_and_dropped() {
    let (a_ip, b_ip) = (v4(32, 1), v4(32, 2));
    let (mut a, mut b) = pair(a_ip, b_ip);
    let f = F {
        src: a_ip,
        dst: b_ip,
        dst_mac: 0xb,
        sport: 0xc123,
        dscp: 26,
        ecn: Ecn::Ect0,
        ident: 0,
        ttl: 64,
        psn: 1,
    };
    let good = frame(&f, &[0x55; 100]);
    let mut bad = good.clone();
    bad[14 + 20 + 8 + 12 + 50] ^= 0x01;
    a.transmit(T0, &bad).expect("transmit");
    a.transmit(T0, &good).expect("transmit");
    a.flush(T0).expect("flush");
    let got = recv(&mut b, 1);
    assert_eq!(got, vec![good]);
    assert_eq!(b.stats().rx_icrc_bad, 1);
    assert_eq!(b.stats().rx_frames, 1);
}

#[test]
fn nonzero_ip_id_is_detected_dropped_or_repaired() {
    let (a_ip, b_ip) = (v4(33, 1), v4(33, 2));
    let (mut a, mut b) = pair(a_ip, b_ip);
    let mut c = cfg(v4(33, 3), 0xc);
    c.ip_id = IpIdPolicy::Drop;
    let mut d = UdpLink::bind(c).expect("bind");
    let mk = |src| {
        frame(
            &F {
                src,
                dst: b_ip,
                dst_mac: 0xb,
                sport: 0xc200,
                dscp: 0,
                ecn: Ecn::Ect0,
                ident: 0x1234,
                ttl: 64,
                psn: 7,
            },
            b"hello, world",
        )
    };
    // Drop policy: counted, nothing sent.
    d.transmit(T0, &mk(v4(33, 3))).expect("transmit");
    d.flush(T0).expect("flush");
    assert_eq!(d.stats().tx_ip_hdr_mismatch, 1);
    assert_eq!(d.stats().tx_frames, 0);
    // Repair policy: counted, sent with ID 0 and a recomputed ICRC that verifies at the receiver.
    let f = mk(a_ip);
    a.transmit(T0, &f).expect("transmit");
    a.flush(T0).expect("flush");
    assert_eq!(a.stats().tx_ip_hdr_mismatch, 1);
    let got = recv(&mut b, 1);
    assert_eq!(got.len(), 1, "{:?}", b.stats());
    let g = &got[0];
    assert_eq!(&g[14 + 4..14 + 6], &[0, 0], "IP ID on the wire");
    assert_eq!(g[14 + 6] & 0x40, 0x40, "DF");
    assert_eq!(&g[42..g.len() - 4], &f[42..f.len() - 4]);
    assert_ne!(&g[g.len() - 4..], &f[f.len() - 4..], "ICRC was recomputed");
    icrc::verify(&g[14..]).expect("icrc");
}

#[test]
fn per_source_port_sockets_carry_the_port() {
    let (a_ip, b_ip) = (v4(34, 1), v4(34, 2));
    let (mut a, mut b) = pair(a_ip, b_ip);
    let ports = [0xc001u16, 0xd00d, 0xc001, 0xffff, 0xd00d];
    for (k, &sport) in ports.iter().enumerate() {
        let f = frame(
            &F {
                src: a_ip,
                dst: b_ip,
                dst_mac: 0xb,
                sport,
                dscp: 0,
                ecn: Ecn::NotEct,
                ident: 0,
                ttl: 64,
                psn: k as u32,
            },
            &[k as u8; 32],
        );
        a.transmit(T0, &f).expect("transmit");
    }
    a.flush(T0).expect("flush");
    assert_eq!(a.stats().tx_sockets, 1 + 3);
    let got = recv(&mut b, ports.len());
    assert_eq!(got.len(), ports.len());
    // Each frame arrives from the port it was built with (the payload byte says which frame it is); frames of one
    // port keep their order (flush groups by socket, so ports may interleave differently than committed).
    let mut seen: Vec<(u16, u8)> = got
        .iter()
        .map(|g| (u16::from_be_bytes([g[34], g[35]]), g[14 + 20 + 8 + 12]))
        .collect();
    let mut want: Vec<(u16, u8)> = ports
        .iter()
        .enumerate()
        .map(|(k, &p)| (p, k as u8))
        .collect();
    for &p in &[0xc001u16, 0xd00d, 0xffff] {
        let order = |v: &[(u16, u8)]| {
            v.iter()
                .filter(|x| x.0 == p)
                .map(|x| x.1)
                .collect::<Vec<_>>()
        };
        assert_eq!(order(&seen), order(&want), "order of port {p:#x}");
    }
    seen.sort_unstable();
    want.sort_unstable();
    assert_eq!(seen, want);
}

/// Frames of several source ports (QPs) committed interleaved (A B C A B C ...) go out with one `sendmmsg` per
/// socket per flush, not one per run of equal ports; each port's frames keep their commit order.
#[test]
fn interleaved_source_ports_are_batched_per_socket() {
    let (a_ip, b_ip) = (v4(39, 1), v4(39, 2));
    let (mut a, mut b) = pair(a_ip, b_ip);
    let ports = [0xc101u16, 0xc202, 0xc303];
    let rounds = 8usize;
    let mk = |sport: u16, psn: u32| {
        frame(
            &F {
                src: a_ip,
                dst: b_ip,
                dst_mac: 0xb,
                sport,
                dscp: 0,
                ecn: Ecn::Ect0,
                ident: 0,
                ttl: 64,
                psn,
            },
            &[psn as u8; 16],
        )
    };
    // Warm up: open the three sockets (one call each).
    for &p in &ports {
        a.transmit(T0, &mk(p, 0)).expect("transmit");
    }
    a.flush(T0).expect("flush");
    assert_eq!(a.stats().tx_sendmmsg, 3);
    assert_eq!(recv(&mut b, 3).len(), 3);
    let before = a.stats();
    for r in 1..=rounds as u32 {
        for &p in &ports {
            a.transmit(T0, &mk(p, r)).expect("transmit");
        }
    }
    assert_eq!(a.queued(), rounds * ports.len());
    a.flush(T0).expect("flush");
    assert_eq!(a.queued(), 0);
    let after = a.stats();
    assert_eq!(
        after.tx_frames - before.tx_frames,
        (rounds * ports.len()) as u64
    );
    assert_eq!(
        after.tx_sendmmsg - before.tx_sendmmsg,
        ports.len() as u64,
        "one sendmmsg per socket, not per frame"
    );
    let got = recv(&mut b, rounds * ports.len());
    assert_eq!(got.len(), rounds * ports.len());
    for &p in &ports {
        let psns: Vec<u8> = got
            .iter()
            .filter(|g| u16::from_be_bytes([g[34], g[35]]) == p)
            .map(|g| g[14 + 20 + 8 + 11])
            .collect();
        assert_eq!(psns, (1..=rounds as u8).collect::<Vec<_>>(), "port {p:#x}");
    }
}

#[test]
fn busy_when_batch_full_and_invalid_frames_counted() {
    let (a_ip, b_ip) = (v4(35, 1), v4(35, 2));
    let mut c = cfg(a_ip, 0xa);
    c.burst = 4;
    let mut a = UdpLink::bind(c).expect("bind");
    let mut b = UdpLink::bind(cfg(b_ip, 0xb)).expect("bind");
    let mk = |src, psn| {
        frame(
            &F {
                src,
                dst: b_ip,
                dst_mac: 0xb,
                sport: 0xc300,
                dscp: 0,
                ecn: Ecn::Ect0,
                ident: 0,
                ttl: 64,
                psn,
            },
            &[1, 2, 3, 4],
        )
    };
    // A frame whose source IP is not the bound address cannot be sent as built: counted, dropped.
    a.transmit(T0, &mk(v4(35, 9), 0)).expect("transmit");
    assert_eq!(a.stats().tx_invalid, 1);
    assert_eq!(a.queued(), 0);
    a.transmit(T0, &[0u8; 10])
        .expect("short frame is a counted drop");
    assert_eq!(a.stats().tx_invalid, 2);
    for psn in 0..4 {
        a.transmit(T0, &mk(a_ip, psn)).expect("transmit");
    }
    assert!(matches!(a.tx_buf(T0), Err(LinkError::Busy)));
    assert!(matches!(a.transmit(T0, &mk(a_ip, 4)), Err(LinkError::Busy)));
    a.flush(T0).expect("flush");
    a.transmit(T0, &mk(a_ip, 4)).expect("transmit after flush");
    a.flush(T0).expect("flush");
    let got = recv(&mut b, 5);
    let psns: Vec<u8> = got.iter().map(|g| g[14 + 20 + 8 + 11]).collect();
    assert_eq!(psns, vec![0, 1, 2, 3, 4]);
    // tx_buf then tx_commit with a length beyond the MTU.
    let mtu = a.config().mtu;
    a.tx_buf(T0).expect("buf");
    assert!(matches!(
        a.tx_commit(T0, mtu + 1),
        Err(LinkError::TooLong { .. })
    ));
}

#[test]
fn refused_datagram_is_an_io_error_and_dropped() {
    // A destination the kernel refuses (broadcast without SO_BROADCAST: EACCES) comes back as LinkError::Io with
    // context; the frame is dropped, not retried forever.
    let a_ip = v4(36, 1);
    let mut a = UdpLink::bind(cfg(a_ip, 0xa)).expect("bind");
    let f = frame(
        &F {
            src: a_ip,
            dst: IpAddr::V4(Ipv4Addr::new(255, 255, 255, 255)),
            dst_mac: 0xb,
            sport: 0xc400,
            dscp: 0,
            ecn: Ecn::Ect0,
            ident: 0,
            ttl: 64,
            psn: 0,
        },
        &[0; 8],
    );
    a.transmit(T0, &f).expect("transmit");
    let e = a
        .flush(T0)
        .expect_err("broadcast without SO_BROADCAST is refused");
    let msg = format!("{e}: {:?}", e);
    assert!(matches!(e, LinkError::Io(_)), "{msg}");
    assert!(msg.contains("sendmmsg"), "{msg}");
    assert_eq!(a.queued(), 0);
    assert_eq!(a.stats().tx_errors, 1);
    a.flush(T0).expect("nothing left");
}

#[test]
fn ipv6_loopback() {
    let lo6 = IpAddr::V6(Ipv6Addr::LOCALHOST);
    let mut ca = cfg(lo6, 0xa);
    ca.port = 47_911;
    ca.peer_port = 47_912;
    let mut cb = cfg(lo6, 0xb);
    cb.port = 47_912;
    cb.peer_port = 47_911;
    let (mut a, mut b) = match (UdpLink::bind(ca), UdpLink::bind(cb)) {
        (Ok(a), Ok(b)) => (a, b),
        (Err(e), _) | (_, Err(e)) => {
            eprintln!("skipping: IPv6 loopback unavailable: {e:?}");
            return;
        }
    };
    let mut sent = Vec::new();
    for (k, size) in [0usize, 100, 4000].into_iter().enumerate() {
        let mut f = frame(
            &F {
                src: lo6,
                dst: lo6,
                dst_mac: 0xb,
                sport: 0xc500 + k as u16,
                dscp: 26,
                ecn: [Ecn::Ect0, Ecn::Ce, Ecn::NotEct][k],
                ident: 0,
                ttl: 9,
                psn: k as u32,
            },
            &vec![k as u8; size],
        );
        // This pair uses port 47912 instead of 4791: patch the UDP destination port, refresh the ICRC.
        f[14 + 40 + 2..14 + 40 + 4].copy_from_slice(&47_912u16.to_be_bytes());
        icrc::fill(&mut f[14..]).expect("icrc");
        a.transmit(T0, &f).expect("transmit");
        sent.push(f);
    }
    a.flush(T0).expect("flush");
    let got = recv(&mut b, sent.len());
    assert_eq!(got, sent, "{:?}", b.stats());
    assert_eq!(b.stats().rx_icrc_bad, 0);
}

#[test]
fn oversize_received_datagram_is_counted_and_dropped() {
    let (a_ip, b_ip) = (v4(37, 1), v4(37, 2));
    let mut a = UdpLink::bind(cfg(a_ip, 0xa)).expect("bind");
    let mut cb = cfg(b_ip, 0xb);
    cb.mtu = 1514;
    let mut b = UdpLink::bind(cb).expect("bind");
    let mk = |size: usize, psn| {
        frame(
            &F {
                src: a_ip,
                dst: b_ip,
                dst_mac: 0xb,
                sport: 0xc600,
                dscp: 0,
                ecn: Ecn::Ect0,
                ident: 0,
                ttl: 64,
                psn,
            },
            &vec![3; size],
        )
    };
    let fits = mk(1514 - 42 - 16, 1);
    assert_eq!(fits.len(), 1514);
    a.transmit(T0, &mk(2000, 0)).expect("transmit");
    a.transmit(T0, &mk(1514 - 42 - 16 + 4, 2))
        .expect("transmit");
    a.transmit(T0, &fits).expect("transmit");
    a.flush(T0).expect("flush");
    let got = recv(&mut b, 1);
    assert_eq!(got, vec![fits]);
    assert_eq!(b.stats().rx_truncated, 2);
}

#[test]
fn tx_buf_is_stable_until_commit() {
    let a_ip = v4(38, 1);
    let mut a = UdpLink::bind(cfg(a_ip, 0xa)).expect("bind");
    a.tx_buf(T0).expect("buf")[..4].copy_from_slice(&[1, 2, 3, 4]);
    assert_eq!(&a.tx_buf(T0).expect("buf")[..4], &[1, 2, 3, 4]);
    assert!(a.tx_buf(T0).expect("buf").len() >= a.config().mtu);
}

/// `UdpStats::rx_wait_max_us`: a datagram left in the receive socket is measured from the kernel's receive timestamp
/// (`SO_TIMESTAMPNS`) to the `recvmmsg` that reads it — at least as long as the test left it there.
#[test]
fn time_in_the_receive_socket_is_measured() {
    let (a_ip, b_ip) = (v4(41, 1), v4(41, 2));
    let (mut a, mut b) = pair(a_ip, b_ip);
    let f = F {
        src: a_ip,
        dst: b_ip,
        dst_mac: 0xb,
        sport: 0xc123,
        dscp: 0,
        ecn: Ecn::NotEct,
        ident: 0,
        ttl: 64,
        psn: 1,
    };
    a.transmit(T0, &frame(&f, &[7; 64])).expect("transmit");
    a.flush(T0).expect("flush");
    assert_eq!(b.stats().rx_wait_max_us, 0);
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(recv(&mut b, 1).len(), 1, "{:?}", b.stats());
    let w = b.stats().rx_wait_max_us;
    assert!((50_000..60_000_000).contains(&w), "waited {w} µs");
}

/// Issue #21: past `max_tx_sockets` a new source port used to fail every frame (`tx_errors`), so a process with more
/// QPs than sockets could not send. Now the new ports share the open sockets: every frame arrives with a valid ICRC,
/// from one of the `max_tx_sockets` bound ports, and each original port always leaves from the same one (a QP keeps
/// its ECMP path, `ROCEV2.md §1.4`).
#[test]
fn source_ports_past_max_tx_sockets_share_sockets() {
    let (a_ip, b_ip) = (v4(202, 1), v4(202, 2));
    let mut ca = cfg(a_ip, 0xa);
    ca.max_tx_sockets = 4;
    let mut a = UdpLink::bind(ca).expect("bind a");
    let mut b = UdpLink::bind(cfg(b_ip, 0xb)).expect("bind b");
    // 20 distinct ports, each sent twice (second round after the cap was reached), payload byte = port index.
    let ports: Vec<u16> = (0..20u16).map(|k| 0xc000 + k * 0x2b1).collect();
    let mut sent = Vec::new();
    for round in 0..2u32 {
        for (k, &sport) in ports.iter().enumerate() {
            let f = frame(
                &F {
                    src: a_ip,
                    dst: b_ip,
                    dst_mac: 0xb,
                    sport,
                    dscp: 0,
                    ecn: Ecn::NotEct,
                    ident: 0,
                    ttl: 64,
                    psn: round * 100 + k as u32,
                },
                &[k as u8; 40],
            );
            a.transmit(T0, &f).expect("transmit");
            sent.push(f);
            if a.queued() >= 16 {
                a.flush(T0).expect("flush");
            }
        }
    }
    a.flush(T0).expect("flush");
    let sa = a.stats();
    assert_eq!(sa.tx_errors, 0, "{sa:?}");
    assert_eq!(sa.tx_frames, sent.len() as u64, "{sa:?}");
    assert_eq!(sa.tx_sockets, 1 + 4, "{sa:?}");
    assert_eq!(sa.tx_sport_shared, 2 * 16, "{sa:?}");
    let got = recv(&mut b, sent.len());
    assert_eq!(got.len(), sent.len(), "{:?}", b.stats());
    assert_eq!(b.stats().rx_icrc_bad, 0);
    let mut wire_port: Vec<Option<u16>> = vec![None; ports.len()];
    for g in &got {
        icrc::verify(&g[14..]).expect("icrc");
        let k = usize::from(g[14 + 20 + 8 + 12]);
        let p = u16::from_be_bytes([g[34], g[35]]);
        assert!(
            ports[..4].contains(&p),
            "port {p:#x} is not a bound socket's"
        );
        if k < 4 {
            assert_eq!(p, ports[k], "the first ports keep their own sockets");
        }
        assert_eq!(
            *wire_port[k].get_or_insert(p),
            p,
            "port index {k} changed socket"
        );
    }
    // The payload and BTH are untouched by the rewrite.
    for g in &got {
        let k = usize::from(g[14 + 20 + 8 + 12]);
        assert!(
            g[14 + 20 + 8 + 12..g.len() - 4]
                .iter()
                .all(|&x| x == k as u8)
        );
    }
}
