//! UdpLink between two network namespaces joined by a veth pair (`scripts/netns.sh`): the frames Linux puts on
//! the wire, captured with an AF_PACKET socket on the receiving veth, must be byte-for-byte the frames built with
//! roce-wire (IP ID 0, DF, TOS/ECN, TTL, UDP ports, checksum 0, ICRC), and `check_pcap.py` must accept the
//! capture. Root only: skipped with a printed reason otherwise. The namespaces are deleted by a drop guard, also
//! on panic.

use std::net::{IpAddr, Ipv4Addr};
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant as StdInstant};

use roce_link::{Instant, Link, UdpConfig, UdpLink};
use roce_wire::{
    BthRepr, Ecn, EtherType, EthernetAddress, EthernetRepr, ExtRepr, IpRepr, Ipv4Repr, Opcode, Psn,
    Qpn, ROCE_V2_PORT, RoceRepr, UdpRepr, udp_sport,
};

const T0: Instant = Instant::ZERO;

fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Two namespaces from `scripts/netns.sh up`; deleted on drop.
struct NetnsPair {
    a: String,
    b: String,
}

impl NetnsPair {
    fn up(tag: &str) -> Result<NetnsPair, String> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err("not root".into());
        }
        if Command::new("ip").arg("-V").output().is_err() {
            return Err("iproute2 `ip` not found".into());
        }
        let pid = std::process::id();
        let pair = NetnsPair {
            a: format!("rl{tag}{pid}a"),
            b: format!("rl{tag}{pid}b"),
        };
        let out = Command::new("bash")
            .arg(workspace().join("scripts/netns.sh"))
            .args([
                "up",
                &pair.a,
                &pair.b,
                "198.18.1.1/24",
                "198.18.1.2/24",
                "9000",
            ])
            .output()
            .map_err(|e| format!("netns.sh: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "netns.sh up failed: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        Ok(pair)
    }

    fn mac(&self, ns: &str) -> [u8; 6] {
        let out = Command::new("bash")
            .arg(workspace().join("scripts/netns.sh"))
            .args(["mac", ns])
            .output()
            .expect("netns.sh mac");
        let s = String::from_utf8_lossy(&out.stdout);
        let v: Vec<u8> = s
            .trim()
            .split(':')
            .map(|x| u8::from_str_radix(x, 16).expect("mac"))
            .collect();
        v.try_into().expect("6 bytes")
    }
}

impl Drop for NetnsPair {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .arg(workspace().join("scripts/netns.sh"))
            .args(["down", &self.a, &self.b])
            .status();
    }
}

/// Runs `f` on a thread that has joined network namespace `ns`; sockets it creates stay in that namespace.
fn in_netns<T: Send + 'static>(ns: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let path = format!("/run/netns/{ns}");
    std::thread::spawn(move || {
        let file = std::fs::File::open(&path).expect("open netns");
        // SAFETY: `file` is an open namespace file descriptor; setns only changes this thread's namespace.
        let r = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
        assert_eq!(r, 0, "setns {path}: {}", std::io::Error::last_os_error());
        f()
    })
    .join()
    .expect("netns thread")
}

/// An AF_PACKET socket on `veth0` of the current namespace that sees every frame (both directions).
fn capture_socket() -> socket2::Socket {
    let proto = (libc::ETH_P_ALL as u16).to_be() as i32;
    let s = socket2::Socket::new(
        socket2::Domain::PACKET,
        socket2::Type::RAW,
        Some(socket2::Protocol::from(proto)),
    )
    .expect("AF_PACKET socket");
    // SAFETY: the name is a NUL-terminated C string.
    let ifindex = unsafe { libc::if_nametoindex(c"veth0".as_ptr()) };
    assert_ne!(ifindex, 0, "veth0 not found");
    // SAFETY: sockaddr_ll is plain data; zero is a valid value.
    let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    sll.sll_family = libc::AF_PACKET as u16;
    sll.sll_protocol = proto as u16;
    sll.sll_ifindex = ifindex as i32;
    // SAFETY: `sll` is a valid sockaddr_ll and its exact size is passed.
    let r = unsafe {
        libc::bind(
            s.as_raw_fd(),
            (&sll as *const libc::sockaddr_ll).cast(),
            size_of::<libc::sockaddr_ll>() as u32,
        )
    };
    assert_eq!(r, 0, "bind AF_PACKET: {}", std::io::Error::last_os_error());
    s.set_nonblocking(true).expect("nonblocking");
    s
}

/// RoCE v2 frames (UDP to 4791) addressed to `to` read from `s` within `wait` (the socket also sees the
/// namespace's outgoing frames; those are skipped).
fn captured(s: &socket2::Socket, to: Ipv4Addr, want: usize, wait: Duration) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut buf = vec![0u8; 65536];
    let t = StdInstant::now();
    while out.len() < want && t.elapsed() < wait {
        // SAFETY: `buf` is writable for its full length.
        let n = unsafe { libc::recv(s.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n <= 0 {
            std::thread::sleep(Duration::from_micros(200));
            continue;
        }
        let f = &buf[..n as usize];
        let is_roce = f.len() > 42
            && f[12..14] == [0x08, 0x00]
            && f[23] == 17
            && f[30..34] == to.octets()
            && u16::from_be_bytes([f[36], f[37]]) == ROCE_V2_PORT;
        if is_roce {
            out.push(f.to_vec());
        }
    }
    out
}

#[allow(clippy::too_many_arguments)]
fn frame(
    src_mac: [u8; 6],
    dst_mac: [u8; 6],
    src: Ipv4Addr,
    dst: Ipv4Addr,
    ecn: Ecn,
    dscp: u8,
    ttl: u8,
    psn: u32,
    payload: &[u8],
) -> Vec<u8> {
    let repr = RoceRepr {
        eth: EthernetRepr {
            src_addr: EthernetAddress(src_mac),
            dst_addr: EthernetAddress(dst_mac),
            vlan: None,
            ethertype: EtherType::IPV4,
        },
        ip: IpRepr::Ipv4(Ipv4Repr {
            src_addr: src,
            dst_addr: dst,
            dscp,
            ecn,
            ident: 0,
            dont_frag: true,
            ttl,
            protocol: 17,
        }),
        udp: UdpRepr {
            src_port: udp_sport(Qpn::new(0x11 + psn % 3), Qpn::new(0x40), 0),
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
            dest_qp: Qpn::new(0x40),
            ack_req: true,
            psn: Psn::new(psn),
        },
        ext: ExtRepr::NONE,
        payload_len: payload.len(),
    };
    let mut buf = vec![0u8; 64 + payload.len() + 8];
    let n = repr.emit_with_payload(&mut buf, payload).expect("emit");
    buf.truncate(n);
    buf
}

fn recv_all(l: &mut UdpLink, want: usize) -> Vec<Vec<u8>> {
    let mut got = Vec::new();
    let t = StdInstant::now();
    while got.len() < want && t.elapsed() < Duration::from_secs(3) {
        l.rx_burst(T0, 64, &mut |f: &mut [u8]| got.push(f.to_vec()))
            .expect("rx");
        std::thread::sleep(Duration::from_micros(100));
    }
    got
}

fn write_pcap(path: &std::path::Path, frames: &[Vec<u8>]) {
    let file = std::fs::File::create(path).expect("pcap file");
    let mut w = pcap_file::pcap::PcapWriter::new(file).expect("pcap writer");
    for (i, f) in frames.iter().enumerate() {
        w.write_packet(&pcap_file::pcap::PcapPacket::new(
            Duration::from_micros(i as u64),
            f.len() as u32,
            f,
        ))
        .expect("write");
    }
}

#[test]
fn veth_wire_bytes_equal_engine_frames_and_pass_check_pcap() {
    let pair = match NetnsPair::up("w") {
        Ok(p) => p,
        Err(why) => {
            eprintln!("skipping netns test: {why}");
            return;
        }
    };
    let (mac_a, mac_b) = (pair.mac(&pair.a), pair.mac(&pair.b));
    let (ip_a, ip_b) = (Ipv4Addr::new(198, 18, 1, 1), Ipv4Addr::new(198, 18, 1, 2));
    let mk_cfg = move |ip: Ipv4Addr, own: [u8; 6], peer: [u8; 6]| {
        let mut c = UdpConfig::new(IpAddr::V4(ip));
        c.local_mac = own;
        c.peer_mac = peer;
        c.mtu = 14 + 9000;
        c
    };
    let mut a = in_netns(&pair.a, move || {
        UdpLink::bind(mk_cfg(ip_a, mac_a, mac_b)).expect("bind a")
    });
    let (mut b, cap_b) = in_netns(&pair.b, move || {
        (
            UdpLink::bind(mk_cfg(ip_b, mac_b, mac_a)).expect("bind b"),
            capture_socket(),
        )
    });
    let cap_a = in_netns(&pair.a, capture_socket);

    let sizes = [16usize, 64, 1024, 4096, 8900];
    let ecns = [Ecn::Ect0, Ecn::Ce, Ecn::NotEct, Ecn::Ect1, Ecn::Ect0];
    let mut sent_ab = Vec::new();
    for (k, &size) in sizes.iter().enumerate() {
        let payload: Vec<u8> = (0..size).map(|i| (i ^ k) as u8).collect();
        sent_ab.push(frame(
            mac_a,
            mac_b,
            ip_a,
            ip_b,
            ecns[k],
            [26, 0, 46, 48, 10][k],
            [64, 1, 255, 3, 64][k],
            k as u32,
            &payload,
        ));
    }
    // Source-port sockets are created on first use in the caller's namespace: transmit from inside it.
    let frames = sent_ab.clone();
    a = in_netns(&pair.a, move || {
        for f in &frames {
            a.transmit(T0, f).expect("transmit");
        }
        a.flush(T0).expect("flush");
        a
    });
    let wire_ab = captured(&cap_b, ip_b, sent_ab.len(), Duration::from_secs(3));
    let got_b = recv_all(&mut b, sent_ab.len());

    // Reverse direction (B answers), so both ends' sockets are exercised.
    let reply = frame(
        mac_b,
        mac_a,
        ip_b,
        ip_a,
        Ecn::Ect0,
        26,
        64,
        100,
        b"pong pong pong!!",
    );
    // From the wrong namespace, a new source port is refused with a clear error.
    let e = b.transmit(T0, &reply).expect_err("wrong namespace");
    assert!(format!("{e:?}").contains("namespace"), "{e:?}");
    let r = reply.clone();
    b = in_netns(&pair.b, move || {
        b.transmit(T0, &r).expect("transmit");
        b.flush(T0).expect("flush");
        b
    });
    let wire_ba = captured(&cap_a, ip_a, 1, Duration::from_secs(3));
    let got_a = recv_all(&mut a, 1);

    assert_eq!(wire_ab.len(), sent_ab.len(), "captured A->B");
    // `flush` sends one batch per source-port socket, so frames of different ports may leave in another order than
    // committed; within a port the order is kept. A stable sort by UDP source port normalises both sides.
    let by_port = |v: &[Vec<u8>]| {
        let mut v = v.to_vec();
        v.sort_by_key(|f| u16::from_be_bytes([f[34], f[35]]));
        v
    };
    let (wire_ab, got_b, sent_ab) = (by_port(&wire_ab), by_port(&got_b), by_port(&sent_ab));
    for (w, s) in wire_ab.iter().zip(&sent_ab) {
        assert_eq!(w, s, "wire bytes differ from the engine frame");
    }
    assert_eq!(got_b, sent_ab, "B's rebuilt frames; stats {:?}", b.stats());
    assert_eq!(wire_ba, vec![reply.clone()]);
    assert_eq!(got_a, vec![reply]);
    assert_eq!(b.stats().rx_icrc_bad, 0);

    // The independent checker accepts the capture.
    let pcap = std::env::temp_dir().join(format!("udp_netns_{}.pcap", std::process::id()));
    let mut all = wire_ab.clone();
    all.extend(wire_ba);
    write_pcap(&pcap, &all);
    let out = Command::new("python3")
        .arg(workspace().join("testdata/tools/check_pcap.py"))
        .arg("--quiet")
        .arg(&pcap)
        .output();
    let _ = std::fs::remove_file(&pcap);
    match out {
        Ok(o) => {
            let text = String::from_utf8_lossy(&o.stdout);
            assert!(o.status.success(), "check_pcap.py: {text}");
            let last = text.lines().last().unwrap_or("");
            assert!(
                last.contains(&format!("{} passed, 0 failed", all.len())),
                "{last}"
            );
        }
        Err(e) => eprintln!("python3 unavailable, check_pcap.py not run: {e}"),
    }
}
