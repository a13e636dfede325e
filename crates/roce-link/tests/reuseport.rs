//! `roce_link::reuseport` in the kernel (`docs/MULTIPROCESS.md`): three UDP sockets bound to one address and port with
//! `SO_REUSEPORT` each join the steering and get distinct slots; datagrams shaped like RoCE v2 packets (a BTH whose
//! DestQP's top byte is a slot) arrive at exactly the socket of their slot; a datagram too short for a BTH, and one
//! for a slot nobody holds, still arrive (at one socket: the kernel's hash choice); a closed socket's slot is free
//! again for the next socket that joins. Skipped with the reason when the kernel refuses BPF (needs CAP_BPF +
//! CAP_NET_ADMIN, or CAP_SYS_ADMIN).

use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsFd;
use std::time::Duration;

use roce_link::reuseport::{self, Joined};
use socket2::{Domain, Socket, Type};

fn bind(addr: SocketAddr) -> UdpSocket {
    let s = Socket::new(Domain::IPV4, Type::DGRAM, None).expect("socket");
    s.set_reuse_port(true).expect("SO_REUSEPORT");
    s.bind(&addr.into()).expect("bind");
    s.set_read_timeout(Some(Duration::from_millis(200)))
        .expect("timeout");
    s.into()
}

/// A 12-byte BTH (SEND_ONLY to `qpn`) followed by the marker `n`.
fn packet(qpn: u32, n: u8) -> Vec<u8> {
    let q = qpn.to_be_bytes();
    vec![0x04, 0, 0xff, 0xff, 0, q[1], q[2], q[3], 0, 0, 0, 1, n]
}

/// Every datagram waiting on `s` (its last byte, the marker).
fn drain(s: &UdpSocket) -> Vec<u8> {
    let mut got = Vec::new();
    let mut buf = [0u8; 64];
    while let Ok(n) = s.recv(&mut buf) {
        got.push(buf[n - 1]);
    }
    got
}

#[test]
fn datagrams_reach_the_socket_owning_their_destination_qp() {
    let first = bind("127.0.91.1:0".parse().expect("addr"));
    let local = first.local_addr().expect("local");
    let j0 = match reuseport::join(first.as_fd(), local) {
        Ok(j) => j,
        Err(e) => {
            eprintln!("skipped: {e}");
            return;
        }
    };
    let second = bind(local);
    let third = bind(local);
    let j1 = reuseport::join(second.as_fd(), local).expect("join 2");
    let j2 = reuseport::join(third.as_fd(), local).expect("join 3");
    let socks = [(&first, &j0), (&second, &j1), (&third, &j2)];
    let slots: Vec<u8> = socks.iter().map(|(_, j)| j.slot).collect();
    assert_eq!(slots, [0, 1, 2], "the lowest free slots, in join order");
    assert_eq!(j0.first_qpn(), 0x11);
    assert_eq!(j2.first_qpn(), 0x2_0000);

    let tx = UdpSocket::bind("127.0.91.2:0").expect("sender");
    for n in 0..30u8 {
        let j: &Joined = socks[usize::from(n % 3)].1;
        let qpn = (u32::from(j.slot) << reuseport::QPN_SHIFT) | 0x11 | u32::from(n);
        tx.send_to(&packet(qpn, n), local).expect("send");
    }
    for (i, (s, _)) in socks.iter().enumerate() {
        let got = drain(s);
        let want: Vec<u8> = (0..30u8).filter(|n| usize::from(n % 3) == i).collect();
        assert_eq!(got, want, "socket of slot {i}");
    }

    // No BTH, and a slot nobody holds: delivered once, somewhere.
    tx.send_to(&[0x04, 0, 100], local).expect("short");
    tx.send_to(&packet(0xc8_0011, 101), local)
        .expect("unclaimed");
    let mut all: Vec<u8> = socks.iter().flat_map(|(s, _)| drain(s)).collect();
    all.sort_unstable();
    assert_eq!(all, [100, 101]);

    // Closing the socket of slot 1 frees the slot: the next joiner gets it, and its datagrams.
    drop(second);
    let fourth = bind(local);
    let j3 = reuseport::join(fourth.as_fd(), local).expect("join 4");
    assert_eq!(j3.slot, 1);
    tx.send_to(&packet(0x1_0011, 7), local).expect("send");
    assert_eq!(drain(&fourth), [7]);
    assert!(drain(&first).is_empty() && drain(&third).is_empty());
}

/// `UdpConfig::share`: two links on one address both bind, in different slots, and tell their engines where their
/// QPNs start (`LinkCaps::first_qpn`); a link without it cannot bind beside them.
#[test]
fn udp_links_share_an_address_in_different_slots() {
    use roce_link::{Link, UdpConfig, UdpLink};
    let ip = "127.0.92.1".parse().expect("ip");
    let cfg = || UdpConfig {
        share: true,
        ..UdpConfig::new(ip)
    };
    let a = UdpLink::bind(cfg()).expect("first link");
    let Some(ja) = a.shared() else {
        eprintln!("skipped: {}", a.share_error().unwrap_or("not shared"));
        return;
    };
    let b = UdpLink::bind(cfg()).expect("second link on the same address");
    let jb = b.shared().expect("second link shared");
    assert_ne!(ja.slot, jb.slot);
    assert_eq!(a.caps().first_qpn, Some(ja.first_qpn()));
    assert_eq!(b.caps().first_qpn, Some(jb.first_qpn()));
    let alone = UdpLink::bind(UdpConfig::new(ip));
    assert!(
        alone.is_err(),
        "a link that does not share binds beside them"
    );
}

/// Another local user cannot deny an address's sharing by squatting the name that serialises finding the map (issue
/// #21 finding): any user may bind any abstract Unix socket name, so a lock there could be held forever by an
/// unprivileged squatter (every join then waited 10 s and failed). The lock is a file lock in a directory only the
/// joining user controls. Here user `nobody` holds the old abstract name `@<map name>.lock` (and a name with
/// `.lock` swapped for anything else would do the same); a join still succeeds at once. Needs root (to run the
/// squatter as `nobody`) and BPF; skipped otherwise.
#[test]
fn a_squatted_lock_name_does_not_block_joining() {
    let sock = bind("127.0.92.1:0".parse().expect("addr"));
    let local = sock.local_addr().expect("local");
    let netns = std::fs::metadata("/proc/self/ns/net")
        .map(|m| std::os::unix::fs::MetadataExt::ino(&m))
        .unwrap_or(0);
    let name = format!("{}.lock", reuseport::map_name(local, netns));
    let squat = format!(
        "import socket,time\ns=socket.socket(socket.AF_UNIX,socket.SOCK_DGRAM)\ns.bind('\\0{name}')\n\
         print('bound',flush=True)\ntime.sleep(20)\n"
    );
    let mut squatter = match std::process::Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "/usr/bin/python3",
            "-c",
        ])
        .arg(&squat)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
    {
        Ok(c) => c,
        Err(e) => {
            eprintln!("skipped: cannot run a squatter as another user: {e}");
            return;
        }
    };
    let mut line = String::new();
    let _ = std::io::BufRead::read_line(
        &mut std::io::BufReader::new(squatter.stdout.take().expect("stdout")),
        &mut line,
    );
    if line.trim() != "bound" {
        let _ = squatter.kill();
        let out = squatter.wait_with_output().expect("wait");
        eprintln!(
            "skipped: the squatter did not start (not root?): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        return;
    }
    let t0 = std::time::Instant::now();
    let r = reuseport::join(sock.as_fd(), local);
    let took = t0.elapsed();
    let _ = squatter.kill();
    let _ = squatter.wait();
    match r {
        Ok(j) => assert_eq!(j.slot, 0),
        Err(e) if e.to_string().contains("locking") => {
            panic!("a squatter of {name} denied the join after {took:?}: {e}")
        }
        Err(e) => {
            eprintln!("skipped: {e}");
            return;
        }
    }
    assert!(took < Duration::from_secs(2), "join took {took:?}");
}

/// A CM MAD on QP 1 shaped as on the wire: BTH (12 bytes, SEND_ONLY to QP 1), DETH (8), the MAD header (24: class
/// `class`, attribute `attr`), then MAD data with `comm` at bytes 0..4 (LocalCommID / RequestID), `remote` at 4..8
/// (RemoteCommID) and `service` at 8..16 (a REQ's / SIDR_REQ's ServiceID); the marker `n` last.
fn mad(class: u8, attr: u16, comm: u32, remote: u32, service: u64, n: u8) -> Vec<u8> {
    let mut p = vec![0x64, 0, 0xff, 0xff, 0, 0, 0, 1, 0, 0, 0, 1]; // BTH: UD SEND_ONLY, DestQP 1
    p.extend([0x80, 0x01, 0, 0, 0, 0, 0, 1]); // DETH: GSI Q_Key, SrcQP 1
    let mut h = [0u8; 24];
    h[0] = 1;
    h[1] = class;
    h[2] = 2;
    h[3] = 3;
    h[16..18].copy_from_slice(&attr.to_be_bytes());
    p.extend(h);
    p.extend(comm.to_be_bytes());
    p.extend(remote.to_be_bytes());
    p.extend(service.to_be_bytes());
    p.push(n);
    p
}

/// QP 1 on a shared address (`docs/MULTIPROCESS.md`, QP 1): a REQ or SIDR_REQ reaches the socket whose process
/// claimed its ServiceID; every other CM MAD the socket whose slot is the first byte of its RemoteCommID (SIDR_REP:
/// RequestID); a REQ for a service nobody claimed, and a MAD of another class, still arrive once (the kernel's
/// choice). A second claim of a claimed service by a live process is refused; after a release another socket may
/// claim it.
#[test]
fn cm_mads_on_qp1_reach_the_process_owning_their_service_or_comm_id() {
    const REQ: u16 = 0x0010;
    const REP: u16 = 0x0013;
    const DREQ: u16 = 0x0015;
    const SIDR_REQ: u16 = 0x0017;
    const SIDR_REP: u16 = 0x0018;
    let first = bind("127.0.203.41:0".parse().expect("addr"));
    let local = first.local_addr().expect("local");
    let j0 = match reuseport::join(first.as_fd(), local) {
        Ok(j) => j,
        Err(e) => {
            eprintln!("skipped: {e}");
            return;
        }
    };
    let second = bind(local);
    let third = bind(local);
    let j1 = reuseport::join(second.as_fd(), local).expect("join 2");
    let j2 = reuseport::join(third.as_fd(), local).expect("join 3");
    assert_eq!([j0.slot, j1.slot, j2.slot], [0, 1, 2]);
    let socks = [&first, &second, &third];
    let (s1, s2) = (0x0106_1c6f_u64, 0x0106_1c70_u64); // RDMA_PS_TCP ports 7279, 7280
    j1.claim_service(s1).expect("claim s1");
    j2.claim_service(s2).expect("claim s2");

    let tx = UdpSocket::bind("127.0.203.42:0").expect("sender");
    let send = |p: Vec<u8>| {
        tx.send_to(&p, local).expect("send");
    };
    send(mad(7, REQ, 0xdead_0001, 0, s1, 1));
    send(mad(7, SIDR_REQ, 0xdead_0002, 0, s2, 2));
    send(mad(7, REQ, 0xdead_0003, 0, s2, 3));
    send(mad(7, REP, 0xbeef_0001, 0x0200_1234, 0, 4));
    send(mad(7, DREQ, 0xbeef_0002, 0x0100_5678, 0, 5));
    send(mad(7, SIDR_REP, 0x0200_9abc, 0, 0, 6));
    send(mad(7, REP, 0xbeef_0003, 0x0000_4321, 0, 7));
    let got: Vec<Vec<u8>> = socks.iter().map(|s| drain(s)).collect();
    assert_eq!(got, [vec![7], vec![1, 5], vec![2, 3, 4, 6]]);

    // A service nobody claimed, another class, another QP's slot: once each, somewhere.
    send(mad(7, REQ, 0xdead_0004, 0, 0x0106_0001, 8));
    send(mad(4, REQ, 0xdead_0005, 0, s1, 9));
    let mut all: Vec<u8> = socks.iter().flat_map(|s| drain(s)).collect();
    all.sort_unstable();
    assert_eq!(all, [8, 9]);

    // One process: its own slot's claim again is fine; the service moves when its claimer releases it.
    j1.claim_service(s1).expect("claim again");
    j1.release_service(s1);
    j2.claim_service(s1).expect("claim after release");
    send(mad(7, REQ, 0xdead_0006, 0, s1, 10));
    assert_eq!(drain(&third), [10]);
    j2.release_service(s1);
    j2.release_service(s2);
}
