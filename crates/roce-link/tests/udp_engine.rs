//! Two roce-proto engines talking RC through two UdpLinks over loopback (127.0.38.1 ↔ 127.0.38.2), driven by the
//! wall clock: RDMA WRITE of 256 KiB plus a 4 KiB SEND; the data must arrive intact and both sides complete with
//! success, with no ICRC failure anywhere (backend or engine). The driver transmits with
//! `poll_transmit_gather` / `tx_commit_gather`, so the payloads leave straight from the sender's MR as iovecs; the
//! test counts the user-space payload copies on both sides (issue #9: none on transmit, one on receive).

use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant as StdInstant};

use roce_link::{Instant, Link, LinkError, TxSeg, UdpConfig, UdpLink};
use roce_proto::{
    AccessFlags, AhAttr, Engine, EngineConfig, Gid, Mtu, Psn, QpAttr, QpAttrMask, QpCap,
    QpInitAttr, QpState, QpType, RecvWr, SendOp, SendWr, Sge, Wc, WcStatus,
};

struct Node {
    e: Engine,
    l: UdpLink,
}

fn node(ip: [u8; 4], mac: [u8; 6], seed: u64) -> Node {
    node_with(
        ip,
        mac,
        seed,
        UdpConfig::new(IpAddr::V4(Ipv4Addr::from(ip))).max_tx_sockets,
    )
}

fn node_with(ip: [u8; 4], mac: [u8; 6], seed: u64, max_tx_sockets: usize) -> Node {
    let cfg = EngineConfig {
        mac,
        gids: vec![Gid::from_ipv4(ip)],
        seed,
        ..EngineConfig::default()
    };
    let mut lc = UdpConfig::new(IpAddr::V4(Ipv4Addr::from(ip)));
    lc.local_mac = mac;
    lc.mtu = 14 + cfg.netdev_mtu as usize;
    lc.max_tx_sockets = max_tx_sockets;
    Node {
        e: Engine::new(cfg),
        l: UdpLink::bind(lc).expect("bind"),
    }
}

/// One driver iteration: receive a burst, fire due timers, transmit everything the engine has, flush.
fn pump(n: &mut Node, now: Instant) {
    let Node { e, l } = n;
    l.rx_burst(now, 64, &mut |f: &mut [u8]| e.handle_frame(now, f))
        .expect("rx");
    if e.poll_timeout().is_some_and(|t| t <= now) {
        e.handle_timeout(now);
    }
    loop {
        let buf = match l.tx_buf(now) {
            Ok(b) => b,
            Err(LinkError::Busy) => {
                l.flush(now).expect("flush");
                break;
            }
            Err(x) => panic!("tx_buf: {x:?}"),
        };
        let mut segs = [TxSeg::EMPTY; 8];
        match e.poll_transmit_gather(now, buf, &mut segs) {
            Some(m) => match m.gather {
                None => l.tx_commit(now, m.len).expect("commit"),
                // SAFETY: the pieces point into this engine's MRs; nothing writes or deregisters them before the
                // flush below (the engine is not called again until the next poll_transmit_gather or after it).
                Some(g) => unsafe { l.tx_commit_gather(now, g, &segs) }.expect("commit gather"),
            },
            None => break,
        }
    }
    l.flush(now).expect("flush");
}

fn bring_up(e: &mut Engine, qpn: roce_proto::Qpn, peer_qpn: roce_proto::Qpn, peer: [u8; 4]) {
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    let mut at = QpAttr {
        qp_state: QpState::Init,
        pkey_index: 0,
        port_num: 1,
        qp_access_flags: access,
        ..QpAttr::default()
    };
    e.modify_qp(
        qpn,
        &at,
        QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::ACCESS_FLAGS,
    )
    .expect("init");
    at.qp_state = QpState::Rtr;
    at.ah_attr = AhAttr {
        dgid: Gid::from_ipv4(peer),
        traffic_class: 26 << 2,
        ..AhAttr::default()
    };
    at.path_mtu = Mtu::Mtu4096;
    at.dest_qp_num = peer_qpn;
    at.rq_psn = Psn::new(500);
    at.max_dest_rd_atomic = 4;
    at.min_rnr_timer = 12;
    e.modify_qp(
        qpn,
        &at,
        QpAttrMask::STATE
            | QpAttrMask::AV
            | QpAttrMask::PATH_MTU
            | QpAttrMask::DEST_QPN
            | QpAttrMask::RQ_PSN
            | QpAttrMask::MAX_DEST_RD_ATOMIC
            | QpAttrMask::MIN_RNR_TIMER,
    )
    .expect("rtr");
    at.qp_state = QpState::Rts;
    at.sq_psn = Psn::new(500);
    at.timeout = 14;
    at.retry_cnt = 7;
    at.rnr_retry = 7;
    at.max_rd_atomic = 4;
    e.modify_qp(
        qpn,
        &at,
        QpAttrMask::STATE
            | QpAttrMask::SQ_PSN
            | QpAttrMask::TIMEOUT
            | QpAttrMask::RETRY_CNT
            | QpAttrMask::RNR_RETRY
            | QpAttrMask::MAX_QP_RD_ATOMIC,
    )
    .expect("rts");
}

#[test]
fn rc_write_and_send_between_engines_over_udp() {
    let (ip_a, ip_b) = ([127, 0, 38, 1], [127, 0, 38, 2]);
    let mut a = node(ip_a, [2, 0, 0, 0, 0x38, 1], 1);
    let mut b = node(ip_b, [2, 0, 0, 0, 0x38, 2], 2);
    let cap = QpCap {
        max_send_wr: 64,
        max_recv_wr: 64,
        max_send_sge: 4,
        max_recv_sge: 4,
        max_inline_data: 64,
    };
    let mk = |e: &mut Engine| {
        let pd = e.alloc_pd().expect("pd");
        let cq = e.create_cq(256).expect("cq");
        let (qpn, _) = e
            .create_qp(&QpInitAttr {
                qp_type: QpType::Rc,
                pd,
                send_cq: cq,
                recv_cq: cq,
                cap,
                sq_sig_all: true,
            })
            .expect("qp");
        (pd, cq, qpn)
    };
    let (pd_a, cq_a, qp_a) = mk(&mut a.e);
    let (pd_b, cq_b, qp_b) = mk(&mut b.e);
    bring_up(&mut a.e, qp_a, qp_b, ip_b);
    bring_up(&mut b.e, qp_b, qp_a, ip_a);

    const W: usize = 256 * 1024;
    const S: usize = 4096;
    let data: Vec<u8> = (0..W + S).map(|i| (i * 31 + i / 4096) as u8).collect();
    let all = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    let src = a.e.reg_mr(pd_a, data.clone(), all).expect("mr a");
    let dst = b.e.reg_mr(pd_b, vec![0u8; W + S], all).expect("mr b");
    let rsge = [Sge {
        addr: dst.addr + W as u64,
        length: S as u32,
        lkey: dst.lkey,
    }];
    b.e.post_recv(
        qp_b,
        &[RecvWr {
            wr_id: 7,
            sg_list: &rsge,
        }],
    )
    .expect("post_recv");
    let wsge = [Sge {
        addr: src.addr,
        length: W as u32,
        lkey: src.lkey,
    }];
    let ssge = [Sge {
        addr: src.addr + W as u64,
        length: S as u32,
        lkey: src.lkey,
    }];
    a.e.post_send(
        qp_a,
        &[
            SendWr::new(
                1,
                SendOp::RdmaWrite {
                    remote_addr: dst.addr,
                    rkey: dst.rkey,
                },
                &wsge,
            ),
            SendWr::new(2, SendOp::Send, &ssge),
        ],
    )
    .expect("post_send");

    let t0 = StdInstant::now();
    let (mut wc_a, mut wc_b) = (Vec::<Wc>::new(), Vec::<Wc>::new());
    let mut buf = [Wc::default(); 16];
    while (wc_a.len() < 2 || wc_b.is_empty()) && t0.elapsed() < Duration::from_secs(10) {
        let now = Instant::from_nanos(t0.elapsed().as_nanos() as u64);
        pump(&mut a, now);
        pump(&mut b, now);
        let n = a.e.poll_cq(cq_a, &mut buf);
        wc_a.extend_from_slice(&buf[..n]);
        let n = b.e.poll_cq(cq_b, &mut buf);
        wc_b.extend_from_slice(&buf[..n]);
    }
    let (sa, sb) = (a.l.stats(), b.l.stats());
    eprintln!("link a {sa:?}\nlink b {sb:?}");
    assert_eq!(wc_a.len(), 2, "A completions {wc_a:?}");
    assert!(
        wc_a.iter().all(|w| w.status == WcStatus::Success),
        "{wc_a:?}"
    );
    assert_eq!(wc_b.len(), 1, "B completions {wc_b:?}");
    assert_eq!(wc_b[0].status, WcStatus::Success);
    assert_eq!(wc_b[0].byte_len, S as u32);
    assert_eq!(b.e.mr_bytes(dst.lkey).expect("mr"), &data[..]);
    assert_eq!(sa.rx_icrc_bad + sb.rx_icrc_bad, 0);
    assert_eq!(a.e.counters().rx_icrc_encapsulated, 0);
    assert_eq!(b.e.counters().rx_icrc_encapsulated, 0);
    assert_eq!(
        sa.tx_invalid + sb.tx_invalid + sa.tx_errors + sb.tx_errors,
        0
    );
    // 256 KiB at PMTU 4096 is 64 packets + the SEND; at least those went through the link.
    assert!(sa.tx_frames >= 65, "{sa:?}");
    // User-space payload copies: none on transmit (the engine read nothing out of the MR; the link handed the
    // pieces to sendmmsg, copying only what a full socket left queued), one on receive (into the MR, at its final
    // offset, by the engine; the kernel's copy into the link's receive buffer is not user space).
    let (ca, cb) = (a.e.payload_copies(), b.e.payload_copies());
    eprintln!("copies a {ca:?}\ncopies b {cb:?}");
    let total = (W + S) as u64;
    assert_eq!(ca.read_from_mr, 0, "transmit payload copied by the engine");
    assert!(ca.gathered >= total, "{ca:?}");
    assert_eq!(sa.tx_gathered_bytes + sa.tx_linearized_bytes, ca.gathered);
    if a.e.counters().retransmitted_pkts == 0 {
        assert_eq!(cb.written_to_mr, total, "one receive copy per payload byte");
        assert_eq!(ca.gathered, total);
    }
}

/// Issue #21: more QPs than `max_tx_sockets` (here 48 QPs a side over 4 sockets). Each QP writes 8 KiB (two
/// gathered 4 KiB packets) and 100 bytes (a linear frame) into its own part of the peer's MR; the ACKs come back the
/// same way. QPs past the fourth source port share sockets, so their frames get the shared port and a recomputed
/// ICRC; before, every one of their frames failed (`tx_errors`) and no QP past the cap completed.
#[test]
fn more_qps_than_tx_sockets_share_them() {
    const N: usize = 48;
    const W: usize = 8192;
    const S: usize = 100;
    let (ip_a, ip_b) = ([127, 0, 202, 11], [127, 0, 202, 12]);
    let mut a = node_with(ip_a, [2, 0, 0, 0, 0xca, 1], 11, 4);
    let mut b = node_with(ip_b, [2, 0, 0, 0, 0xca, 2], 12, 4);
    let cap = QpCap {
        max_send_wr: 8,
        max_recv_wr: 8,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let all = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    let pd_a = a.e.alloc_pd().expect("pd");
    let pd_b = b.e.alloc_pd().expect("pd");
    let cq_a = a.e.create_cq(4 * N as u32).expect("cq");
    let cq_b = b.e.create_cq(4 * N as u32).expect("cq");
    let qp = |e: &mut Engine, pd, cq| {
        e.create_qp(&QpInitAttr {
            qp_type: QpType::Rc,
            pd,
            send_cq: cq,
            recv_cq: cq,
            cap,
            sq_sig_all: true,
        })
        .expect("qp")
        .0
    };
    let qa: Vec<_> = (0..N).map(|_| qp(&mut a.e, pd_a, cq_a)).collect();
    let qb: Vec<_> = (0..N).map(|_| qp(&mut b.e, pd_b, cq_b)).collect();
    for (&x, &y) in qa.iter().zip(&qb) {
        bring_up(&mut a.e, x, y, ip_b);
        bring_up(&mut b.e, y, x, ip_a);
    }
    let per = W + S;
    let data: Vec<u8> = (0..N * per).map(|i| (i * 7 + i / 251) as u8).collect();
    let src = a.e.reg_mr(pd_a, data.clone(), all).expect("mr a");
    let dst = b.e.reg_mr(pd_b, vec![0u8; N * per], all).expect("mr b");
    for (k, &q) in qa.iter().enumerate() {
        let base = (k * per) as u64;
        let wsge = [Sge {
            addr: src.addr + base,
            length: W as u32,
            lkey: src.lkey,
        }];
        let ssge = [Sge {
            addr: src.addr + base + W as u64,
            length: S as u32,
            lkey: src.lkey,
        }];
        let op = |off: u64| SendOp::RdmaWrite {
            remote_addr: dst.addr + base + off,
            rkey: dst.rkey,
        };
        a.e.post_send(
            q,
            &[
                SendWr::new(2 * k as u64, op(0), &wsge),
                SendWr::new(2 * k as u64 + 1, op(W as u64), &ssge),
            ],
        )
        .expect("post_send");
    }
    let t0 = StdInstant::now();
    let mut wc_a = Vec::<Wc>::new();
    let mut buf = [Wc::default(); 64];
    while wc_a.len() < 2 * N && t0.elapsed() < Duration::from_secs(20) {
        let now = Instant::from_nanos(t0.elapsed().as_nanos() as u64);
        pump(&mut a, now);
        pump(&mut b, now);
        let n = a.e.poll_cq(cq_a, &mut buf);
        wc_a.extend_from_slice(&buf[..n]);
    }
    let (sa, sb) = (a.l.stats(), b.l.stats());
    eprintln!("link a {sa:?}\nlink b {sb:?}");
    assert_eq!(
        sa.tx_errors + sb.tx_errors + sa.tx_invalid + sb.tx_invalid,
        0
    );
    assert_eq!(wc_a.len(), 2 * N, "completions");
    assert!(
        wc_a.iter().all(|w| w.status == WcStatus::Success),
        "{wc_a:?}"
    );
    assert_eq!(b.e.mr_bytes(dst.lkey).expect("mr"), &data[..]);
    assert_eq!(sa.rx_icrc_bad + sb.rx_icrc_bad, 0);
    assert_eq!(a.e.counters().rx_icrc_encapsulated, 0);
    assert_eq!(b.e.counters().rx_icrc_encapsulated, 0);
    assert_eq!((sa.tx_sockets, sb.tx_sockets), (1 + 4, 1 + 4));
    assert!(
        sa.tx_sport_shared > 0 && sb.tx_sport_shared > 0,
        "{sa:?} {sb:?}"
    );
    // Shared frames with gathered payload were copied into the link (the rewrite recomputes the ICRC over it).
    assert!(sa.tx_linearized_bytes > 0, "{sa:?}");
}
