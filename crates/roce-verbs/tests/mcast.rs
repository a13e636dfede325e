//! UD multicast through the runtime over `UdpLink` on loopback (127.0.214.30–.39, group 239.214.1.x): `Qp::attach_mcast`
//! joins the IP group on the device's link, every attached QP of every device receives each datagram sent to the group
//! once, a detached QP none; a runtime thread that has gone idle wakes for a group datagram (the link's wait
//! descriptor covers the group socket), in both progress modes.

use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use roce_link::{UdpConfig, UdpLink};
use roce_verbs::*;

const QKEY: u32 = 0x0123_4567;

struct End {
    _ctx: Context,
    pd: Pd,
    cq: Cq,
    qp: Qp,
    mr: Mr,
    buf: MrBuf,
}

/// A device on 127.0.214.`last` whose idle driver would sleep 30 s unless a readiness wake-up ends it.
fn end(mode: ProgressMode, last: u8) -> End {
    let ip = Ipv4Addr::new(127, 0, 214, last);
    let mac = [2, 0, 0, 0, 0x14, last];
    let cfg = EngineConfig {
        mac,
        gids: vec![Gid::from_ipv4(ip.octets())],
        seed: u64::from(last),
        ..EngineConfig::default()
    };
    let rt = RuntimeConfig {
        spin: Duration::from_micros(1),
        yield_for: Duration::from_micros(1),
        park_max: Duration::from_secs(30),
        ..RuntimeConfig::with_mode(mode)
    };
    let ctx = Context::open(cfg, rt, move || {
        let mut u = UdpConfig::new(IpAddr::V4(ip));
        u.local_mac = mac;
        Ok(Box::new(UdpLink::bind(u)?) as SendLink)
    })
    .expect("open udp device");
    let pd = ctx.alloc_pd().expect("pd");
    let cq = ctx.create_cq(64, None, Moderation::default()).expect("cq");
    let cap = QpCap {
        max_send_wr: 16,
        max_recv_wr: 16,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let qp = pd.create_qp(QpType::Ud, &cq, &cq, cap, false).expect("qp");
    qp.ready_ud(QKEY, Psn::new(0)).expect("ud ready");
    let buf = MrBuf::new(16 * 256).expect("buf");
    let mr = pd.reg_mr(&buf, AccessFlags::LOCAL_WRITE).expect("mr");
    End {
        _ctx: ctx,
        pd,
        cq,
        qp,
        mr,
        buf,
    }
}

fn poll_n(cq: &Cq, n: usize, limit: Duration) -> Vec<Wc> {
    let mut out = Vec::new();
    let t = Instant::now();
    let mut wc = [Wc::default(); 16];
    while out.len() < n && t.elapsed() < limit {
        let k = cq.poll(&mut wc);
        out.extend_from_slice(&wc[..k]);
        if k == 0 {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    out
}

fn post_recvs(e: &End, n: u64) {
    for i in 0..n {
        let sg = [e.mr.sge(i * 256, 256)];
        e.qp.post_recv(&[RecvWr {
            wr_id: i,
            sg_list: &sg,
        }])
        .expect("post_recv");
    }
}

fn group_receives(mode: ProgressMode, base: u8, group: Ipv4Addr) {
    let mgid = Gid::from_ipv4(group.octets());
    let tx = end(mode, base);
    let rx: Vec<End> = (1..=2).map(|k| end(mode, base + k)).collect();
    for r in &rx {
        r.qp.attach_mcast(mgid).expect("attach");
        assert_eq!(r.qp.mcast_groups().expect("groups"), vec![mgid]);
        post_recvs(r, 8);
    }
    assert!(
        tx.qp
            .attach_mcast(Gid::from_ipv4([127, 0, 214, base]))
            .is_err_and(|e| e.errno() == libc::EINVAL),
        "a unicast GID"
    );
    let ah = tx
        .pd
        .create_ah(&AhAttr {
            dgid: mgid,
            hop_limit: 1,
            ..AhAttr::default()
        })
        .expect("ah");
    let send = |n: u64| {
        // Let the receivers' drivers go idle first: the datagram must wake them.
        std::thread::sleep(Duration::from_millis(20));
        tx.mr.write(0, &[n as u8; 100]).expect("write");
        let sg = [tx.mr.sge(0, 100)];
        tx.qp
            .post_send(&[SendWr::new(n, SendOp::Send, &sg).signaled().ud(UdDest {
                ah: ah.handle(),
                remote_qpn: roce_wire::Qpn::new(0xFF_FFFF),
                remote_qkey: QKEY,
            })])
            .expect("post_send");
        let wc = poll_n(&tx.cq, 1, Duration::from_secs(10));
        assert_eq!(wc[0].status, WcStatus::Success);
    };
    for n in 0..4 {
        send(n);
        for (k, r) in rx.iter().enumerate() {
            let wc = poll_n(&r.cq, 1, Duration::from_secs(10));
            assert_eq!(wc.len(), 1, "receiver {k}, message {n}");
            assert_eq!(
                (wc[0].status, wc[0].wr_id, wc[0].byte_len, wc[0].src_qp),
                (WcStatus::Success, n, 140, tx.qp.qpn())
            );
            let mut got = vec![0u8; 100];
            r.buf.read(n as usize * 256 + 40, &mut got).expect("read");
            assert_eq!(got, vec![n as u8; 100]);
        }
    }
    // The second receiver detaches: only the first gets the next one.
    rx[1].qp.detach_mcast(mgid).expect("detach");
    assert!(
        rx[1]
            .qp
            .detach_mcast(mgid)
            .is_err_and(|e| e.errno() == libc::EINVAL),
        "not attached any more (rxe: EINVAL)"
    );
    send(4);
    assert_eq!(poll_n(&rx[0].cq, 1, Duration::from_secs(10)).len(), 1);
    assert!(poll_n(&rx[1].cq, 1, Duration::from_millis(300)).is_empty());
    assert_eq!(rx[1].qp.mcast_groups().expect("groups"), vec![]);
}

#[test]
fn group_receives_caller() {
    group_receives(ProgressMode::Caller, 30, Ipv4Addr::new(239, 214, 1, 1));
}

#[test]
fn group_receives_thread() {
    group_receives(ProgressMode::Thread, 35, Ipv4Addr::new(239, 214, 1, 2));
}
