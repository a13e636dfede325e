//! UdpLink multicast groups (`UdpLink::join_group`, `Link::join_multicast`): a frame sent to an IP multicast group
//! reaches every link that joined the group — links on other addresses and links sharing one address
//! (`UdpConfig::share`, docs/MULTIPROCESS.md: the group socket is outside the address's reuseport steering, so every
//! process gets a copy) — once each, rebuilt with the group as destination; a link that left or never joined gets
//! none. Addresses 127.0.214.0/24, groups 239.214.0.0/16 (each test its own).

use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant as StdInstant};

use roce_link::{Instant, Link, UdpConfig, UdpLink};
use roce_wire::{
    BthRepr, DethRepr, Ecn, EtherType, EthernetAddress, EthernetRepr, ExtRepr, IpRepr, Ipv4Repr,
    Opcode, Psn, Qpn, ROCE_V2_PORT, RoceRepr, UdpRepr,
};

const T0: Instant = Instant::ZERO;

fn ip(last: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, 214, last))
}

/// A UD SEND ONLY from `src` to `group` (or a unicast address), DestQP the multicast QP, payload `[n; 32]`.
fn frame(src: IpAddr, group: IpAddr, n: u8) -> Vec<u8> {
    let (IpAddr::V4(s), IpAddr::V4(d)) = (src, group) else {
        panic!("IPv4 only");
    };
    let repr = RoceRepr {
        eth: EthernetRepr {
            src_addr: EthernetAddress([2, 0, 0, 0, 0, 1]),
            dst_addr: EthernetAddress([1, 0, 0x5e, 0x56, 0, 1]),
            vlan: None,
            ethertype: EtherType::IPV4,
        },
        ip: IpRepr::Ipv4(Ipv4Repr {
            src_addr: s,
            dst_addr: d,
            dscp: 0,
            ecn: Ecn::NotEct,
            ident: 0,
            dont_frag: true,
            ttl: 1,
            protocol: 17,
        }),
        udp: UdpRepr {
            src_port: 0xc214,
            dst_port: ROCE_V2_PORT,
        },
        bth: BthRepr {
            opcode: Opcode::UD_SEND_ONLY,
            solicited: false,
            mig_req: false,
            pad_count: 0,
            pkey: 0xffff,
            fecn: false,
            becn: false,
            dest_qp: Qpn::new(0xFF_FFFF),
            ack_req: false,
            psn: Psn::new(u32::from(n)),
        },
        ext: ExtRepr {
            deth: Some(DethRepr {
                qkey: 0x0123_4567,
                src_qp: Qpn::new(0x11),
            }),
            ..ExtRepr::NONE
        },
        payload_len: 32,
    };
    let mut buf = vec![0u8; 256];
    let len = repr.emit_with_payload(&mut buf, &[n; 32]).expect("emit");
    buf.truncate(len);
    buf
}

/// Whether `fd` becomes readable within 2 s.
fn readable(fd: std::os::fd::RawFd) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd for the call.
    unsafe { libc::poll(&mut p, 1, 2000) == 1 }
}

/// Receives on `l` until `want` frames arrived or 2 s passed, then whatever follows within 50 ms.
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
    std::thread::sleep(Duration::from_millis(50));
    l.rx_burst(T0, 64, &mut |f: &mut [u8]| got.push(f.to_vec()))
        .expect("rx");
    got
}

fn send(tx: &mut UdpLink, src: IpAddr, group: IpAddr, range: std::ops::Range<u8>) {
    for n in range {
        tx.transmit(T0, &frame(src, group, n)).expect("commit");
    }
    tx.flush(T0).expect("flush");
    assert_eq!(tx.queued(), 0);
}

/// The rebuilt frames carry the group as IPv4 destination and the payloads sent, in order.
fn check(got: &[Vec<u8>], group: IpAddr, range: std::ops::Range<u8>, who: &str) {
    let IpAddr::V4(g) = group else { unreachable!() };
    let want: Vec<u8> = range.collect();
    let seen: Vec<u8> = got.iter().map(|f| f[f.len() - 4 - 1]).collect();
    assert_eq!(seen, want, "{who}: one copy of every frame");
    for f in got {
        assert_eq!(
            &f[14 + 16..14 + 20],
            &g.octets(),
            "{who}: destination is the group"
        );
    }
}

#[test]
fn every_joined_link_gets_one_copy_of_each_group_frame() {
    let group: IpAddr = "239.214.0.1".parse().expect("group");
    let mut tx = UdpLink::bind(UdpConfig::new(ip(1))).expect("bind sender");
    let mut b = UdpLink::bind(UdpConfig::new(ip(2))).expect("bind b");
    let mut c = UdpLink::bind(UdpConfig::new(ip(3))).expect("bind c");
    let mut d = UdpLink::bind(UdpConfig::new(ip(4))).expect("bind d (never joins)");
    let plain_fd = b.wait_fd();
    b.join_multicast(group, true).expect("b joins");
    b.join_multicast(group, true)
        .expect("joining twice does nothing");
    c.join_multicast(group, true).expect("c joins");
    assert_eq!(b.groups().collect::<Vec<_>>(), vec![group]);
    assert_ne!(b.wait_fd(), plain_fd, "an epoll set over both sockets");
    assert!(
        b.join_multicast("127.0.214.9".parse().expect("ip"), true)
            .is_err(),
        "not a group"
    );

    send(&mut tx, ip(1), group, 0..5);
    assert!(readable(b.wait_fd().expect("fd")), "b's wait fd wakes");
    check(&recv(&mut b, 5), group, 0..5, "b");
    check(&recv(&mut c, 5), group, 0..5, "c");
    assert!(recv(&mut d, 0).is_empty(), "d never joined");

    c.join_multicast(group, false).expect("c leaves");
    assert_eq!(c.groups().count(), 0);
    assert_eq!(c.wait_fd(), Some(c.rx_fd()), "back to the receive socket");
    send(&mut tx, ip(1), group, 5..8);
    check(&recv(&mut b, 3), group, 5..8, "b");
    assert!(recv(&mut c, 0).is_empty(), "c left");
    // Unicast still arrives beside the group.
    let u = frame(ip(1), ip(2), 9);
    tx.transmit(T0, &u).expect("unicast");
    tx.flush(T0).expect("flush");
    assert_eq!(recv(&mut b, 1).len(), 1, "unicast to b");
}

/// Two links sharing one address (two processes of one device, docs/MULTIPROCESS.md) each get every group frame:
/// the kernel's reuseport steering picks one socket per unicast datagram, but group sockets are bound with
/// SO_REUSEADDR to the group and multicast delivery copies to each. Needs the BPF steering (root); skipped otherwise.
#[test]
fn links_sharing_an_address_each_get_every_group_frame() {
    let group: IpAddr = "239.214.0.2".parse().expect("group");
    let cfg = || UdpConfig {
        share: true,
        ..UdpConfig::new(ip(12))
    };
    let mut a = UdpLink::bind(cfg()).expect("first link");
    if a.shared().is_none() {
        eprintln!("skipped: {}", a.share_error().unwrap_or("not shared"));
        return;
    }
    let mut b = UdpLink::bind(cfg()).expect("second link on the same address");
    a.join_multicast(group, true).expect("a joins");
    b.join_multicast(group, true).expect("b joins");
    let mut tx = UdpLink::bind(UdpConfig::new(ip(11))).expect("bind sender");
    send(&mut tx, ip(11), group, 0..6);
    check(&recv(&mut a, 6), group, 0..6, "a");
    check(&recv(&mut b, 6), group, 0..6, "b");
}
