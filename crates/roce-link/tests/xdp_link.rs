//! [`XdpLink`] on a veth pair in a network namespace private to the test thread (`unshare(CLONE_NEWNET)`; the
//! `ip` commands the thread spawns run in it, and it disappears with the thread, veth pair included):
//!
//! * frames committed on one end arrive at the other end's socket byte for byte, except the MAC addresses, which
//!   the link takes from the interface (source) and the kernel's neighbour table (destination);
//! * a UDP frame to another port is passed to the kernel by the XDP program, not delivered to the socket;
//! * the steady state of `tx_buf` / `tx_commit` / `flush` / `rx_burst` allocates nothing (a counting
//!   `#[global_allocator]`, armed in the test thread only).
//!
//! Root only (and a kernel with AF_XDP): skipped with a printed reason otherwise. Addresses 198.18.26.1/.2.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::net::IpAddr;
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};

use roce_link::{Instant, Link, XdpConfig, XdpLink};

struct Counting;

static EVENTS: AtomicU64 = AtomicU64::new(0);

thread_local! {
    static ARMED: Cell<bool> = const { Cell::new(false) };
}

fn note() {
    if ARMED.try_with(Cell::get).unwrap_or(false) {
        EVENTS.fetch_add(1, Ordering::Relaxed);
    }
}

// SAFETY: every method forwards to `System` unchanged; the bookkeeping touches an atomic and a const thread-local.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note();
        // SAFETY: forwarded contract.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note();
        // SAFETY: forwarded contract.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note();
        // SAFETY: forwarded contract.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        note();
        // SAFETY: forwarded contract.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const IP_A: [u8; 4] = [198, 18, 26, 1];
const IP_B: [u8; 4] = [198, 18, 26, 2];

fn ip(args: &str) {
    let out = Command::new("ip")
        .args(args.split_whitespace())
        .output()
        .expect("run ip");
    assert!(
        out.status.success(),
        "ip {args}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn mac_of(ifname: &str) -> [u8; 6] {
    // Not /sys/class/net: sysfs shows the namespace it was mounted in; `ip` runs in this thread's.
    let out = Command::new("ip")
        .args(["-br", "link", "show", ifname])
        .output()
        .expect("ip link show");
    let text = String::from_utf8_lossy(&out.stdout);
    let mac = text.split_whitespace().nth(2).expect("mac column");
    let v: Vec<u8> = mac
        .split(':')
        .map(|x| u8::from_str_radix(x, 16).expect("hex"))
        .collect();
    v.try_into().expect("6 bytes")
}

/// Enters a fresh network namespace (this thread only) with veth `xa` (198.18.26.1) ↔ `xb` (198.18.26.2), MTU
/// 1500, and permanent neighbour entries on each end for the other's address. `Err` = why the test is skipped.
fn private_veth() -> Result<([u8; 6], [u8; 6]), String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err("not root".into());
    }
    // SAFETY: unshare of the calling thread's network namespace; no memory is involved.
    if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
        return Err(format!(
            "unshare(CLONE_NEWNET): {}",
            std::io::Error::last_os_error()
        ));
    }
    if Command::new("ip").arg("-V").output().is_err() {
        return Err("iproute2 `ip` not found".into());
    }
    ip("link set lo up");
    ip("link add xa mtu 1500 type veth peer name xb mtu 1500");
    ip("addr add 198.18.26.1/24 dev xa");
    ip("addr add 198.18.26.2/24 dev xb");
    ip("link set xa up");
    ip("link set xb up");
    let (ma, mb) = (mac_of("xa"), mac_of("xb"));
    let hex = |m: [u8; 6]| {
        m.iter()
            .map(|b| format!("{b:02x}"))
            .collect::<Vec<_>>()
            .join(":")
    };
    ip(&format!(
        "neigh replace 198.18.26.2 lladdr {} dev xa nud permanent",
        hex(mb)
    ));
    ip(&format!(
        "neigh replace 198.18.26.1 lladdr {} dev xb nud permanent",
        hex(ma)
    ));
    Ok((ma, mb))
}

fn link(ifname: &str, local: [u8; 4]) -> Result<XdpLink, String> {
    XdpLink::bind(XdpConfig {
        interface: Some(ifname.to_owned()),
        ..XdpConfig::new(IpAddr::from(local))
    })
    .map_err(|e| {
        let mut s = e.to_string();
        let mut c = std::error::Error::source(&e);
        while let Some(x) = c {
            s.push_str(&format!(": {x}"));
            c = x.source();
        }
        s
    })
}

/// An Ethernet/IPv4/UDP frame from A to B, UDP destination `dport`, `payload` bytes of pattern `seed`; MACs zero
/// (the link writes them).
fn frame(buf: &mut [u8], dport: u16, payload: usize, seed: u8) -> usize {
    let len = 14 + 20 + 8 + payload;
    let f = &mut buf[..len];
    f[..12].fill(0);
    f[12..14].copy_from_slice(&[0x08, 0x00]);
    let ip_len = (20 + 8 + payload) as u16;
    f[14] = 0x45;
    f[15] = 0;
    f[16..18].copy_from_slice(&ip_len.to_be_bytes());
    f[18..20].copy_from_slice(&[0, 0]);
    f[20..22].copy_from_slice(&[0x40, 0]); // DF
    f[22] = 64;
    f[23] = 17;
    f[24..26].copy_from_slice(&[0, 0]);
    f[26..30].copy_from_slice(&IP_A);
    f[30..34].copy_from_slice(&IP_B);
    let mut sum = 0u32;
    for c in f[14..34].chunks(2) {
        sum += u32::from(u16::from_be_bytes([c[0], c[1]]));
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    f[24..26].copy_from_slice(&(!(sum as u16)).to_be_bytes());
    f[34..36].copy_from_slice(&0xC001u16.to_be_bytes());
    f[36..38].copy_from_slice(&dport.to_be_bytes());
    f[38..40].copy_from_slice(&((8 + payload) as u16).to_be_bytes());
    f[40..42].copy_from_slice(&[0, 0]);
    for (i, b) in f[42..].iter_mut().enumerate() {
        *b = seed.wrapping_add(i as u8);
    }
    len
}

/// Receives on `b` until `want` frames arrived or 2 s passed; calls `check` on each.
fn receive(b: &mut XdpLink, want: usize, check: &mut dyn FnMut(&mut [u8])) -> usize {
    let t0 = std::time::Instant::now();
    let mut got = 0;
    while got < want && t0.elapsed() < std::time::Duration::from_secs(2) {
        got += b.rx_burst(Instant::ZERO, 64, check).expect("rx_burst");
    }
    got
}

fn run() -> Result<(), String> {
    let (mac_a, mac_b) = private_veth()?;
    let mut a = link("xa", IP_A)?;
    let mut b = link("xb", IP_B)?;
    let now = Instant::ZERO;

    // 1. Byte for byte, MACs from the interface and the neighbour table.
    let mut sent = vec![0u8; 1514];
    let n = {
        let buf = a.tx_buf(now).expect("tx_buf");
        let n = frame(buf, 4791, 1000, 7);
        sent[..n].copy_from_slice(&buf[..n]);
        n
    };
    a.tx_commit(now, n).expect("tx_commit");
    a.flush(now).expect("flush");
    let mut seen = Vec::new();
    let got = receive(&mut b, 1, &mut |f| seen.push(f.to_vec()));
    assert_eq!(got, 1, "the RoCE frame did not arrive: {:?}", a.stats());
    let r = &seen[0];
    assert_eq!(r.len(), n);
    assert_eq!(
        &r[0..6],
        &mac_b,
        "destination MAC: the neighbour entry of 198.18.26.2"
    );
    assert_eq!(&r[6..12], &mac_a, "source MAC: the interface's");
    assert_eq!(&r[12..], &sent[12..n], "frame changed on the way");

    // 2. Another UDP port goes to the kernel, not to the socket.
    let n = frame(a.tx_buf(now).expect("tx_buf"), 9999, 100, 1);
    a.tx_commit(now, n).expect("tx_commit");
    a.flush(now).expect("flush");
    std::thread::sleep(std::time::Duration::from_millis(100));
    let got = receive(&mut b, 1, &mut |_| ());
    assert_eq!(got, 0, "a frame to UDP 9999 reached the AF_XDP socket");

    // 3. No allocation in the steady state: bursts of 32 frames, each received before the next burst.
    let burst = |a: &mut XdpLink, b: &mut XdpLink, k: u8| -> usize {
        for i in 0..32u8 {
            let buf = a.tx_buf(now).expect("tx_buf");
            let n = frame(buf, 4791, 64, k.wrapping_add(i));
            a.tx_commit(now, n).expect("tx_commit");
        }
        a.flush(now).expect("flush");
        let mut bytes = 0usize;
        receive(b, 32, &mut |f| bytes += f.len());
        bytes
    };
    for k in 0..50 {
        burst(&mut a, &mut b, k);
    }
    let before = b.stats().rx_frames;
    ARMED.with(|c| c.set(true));
    let mut bytes = 0;
    for k in 0..500u32 {
        bytes += burst(&mut a, &mut b, k as u8);
    }
    ARMED.with(|c| c.set(false));
    let events = EVENTS.load(Ordering::Relaxed);
    let frames = b.stats().rx_frames - before;
    assert!(
        frames >= 500 * 32 * 9 / 10,
        "only {frames} of 16000 frames arrived: {:?}",
        b.stats()
    );
    assert_eq!(bytes as u64, frames * (14 + 20 + 8 + 64));
    assert_eq!(events, 0, "{events} allocator calls in the steady state");
    Ok(())
}

#[test]
fn xdp_link_on_a_private_veth() {
    // A thread of its own: the namespace is the thread's, and goes with it.
    match std::thread::spawn(run).join().expect("test thread") {
        Ok(()) => {}
        Err(why) => eprintln!("SKIPPED (xdp_link): {why}"),
    }
}
