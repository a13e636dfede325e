//! `Pair`: two engines joined by an in-memory wire with latency, optional loss/CE marking and packet capture, on a
//! virtual clock (after quinn-proto `tests/util.rs`, STYLE T4).

use std::collections::VecDeque;
use std::time::Duration;

use crate::*;

/// Direction of a frame on the pair's wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Dir {
    AtoB,
    BtoA,
}

pub(crate) type Filter = Box<dyn FnMut(Dir, &mut Vec<u8>) -> bool>;

pub(crate) struct Pair {
    pub a: Engine,
    pub b: Engine,
    pub now: Instant,
    pub latency: Duration,
    wire: VecDeque<(Instant, Dir, Vec<u8>)>,
    /// Returns false to drop a frame; may modify it (CE marking, corruption).
    pub filter: Filter,
    pub captured: Vec<(Instant, Dir, Vec<u8>)>,
    /// Parallel to `captured`: whether the filter dropped the frame.
    pub dropped: Vec<bool>,
    pub tx_buf_len: usize,
}

pub(crate) const MAC_A: [u8; 6] = [2, 0, 0, 0, 0, 1];
pub(crate) const MAC_B: [u8; 6] = [2, 0, 0, 0, 0, 2];
pub(crate) const IP_A: [u8; 4] = [10, 0, 0, 1];
pub(crate) const IP_B: [u8; 4] = [10, 0, 0, 2];

pub(crate) fn cfg(mac: [u8; 6], ip: [u8; 4], seed: u64) -> EngineConfig {
    EngineConfig {
        mac,
        gids: vec![Gid::from_ipv4(ip)],
        seed,
        ..EngineConfig::default()
    }
}

impl Pair {
    pub fn new() -> Pair {
        Self::with_configs(cfg(MAC_A, IP_A, 1), cfg(MAC_B, IP_B, 2))
    }

    pub fn with_configs(a: EngineConfig, b: EngineConfig) -> Pair {
        Pair {
            a: Engine::new(a),
            b: Engine::new(b),
            now: Instant::from_micros(1),
            latency: Duration::from_micros(1),
            wire: VecDeque::new(),
            filter: Box::new(|_, _| true),
            captured: Vec::new(),
            dropped: Vec::new(),
            tx_buf_len: 9000,
        }
    }

    /// Moves every ready frame of both engines onto the wire; returns how many.
    pub fn transmit(&mut self) -> usize {
        let mut n = 0;
        let mut buf = vec![0u8; self.tx_buf_len];
        for dir in [Dir::AtoB, Dir::BtoA] {
            loop {
                let e = if dir == Dir::AtoB {
                    &mut self.a
                } else {
                    &mut self.b
                };
                let Some(meta) = e.poll_transmit(self.now, &mut buf) else {
                    break;
                };
                let mut f = buf[..meta.len].to_vec();
                n += 1;
                self.captured.push((self.now, dir, f.clone()));
                let keep = (self.filter)(dir, &mut f);
                self.dropped.push(!keep);
                if keep {
                    self.wire.push_back((self.now + self.latency, dir, f));
                }
            }
        }
        n
    }

    /// One step: transmit, deliver what is due, fire due timers; when nothing is left at `now`, move the clock to
    /// the next event. Returns false when nothing can happen any more.
    pub fn step(&mut self) -> bool {
        self.step_within(None, false)
    }

    /// [`Pair::step`] whose clock never passes `horizon`, and moves to it over an idle network if
    /// `idle_passes_time` ([`time::next_virtual_instant`]); false once nothing is left to do before it.
    pub fn step_within(&mut self, horizon: Option<Instant>, idle_passes_time: bool) -> bool {
        self.transmit();
        // Deliver frames due now.
        let mut delivered = false;
        while let Some((t, _, _)) = self.wire.front() {
            if *t > self.now {
                break;
            }
            let Some((_, dir, f)) = self.wire.pop_front() else {
                break;
            };
            match dir {
                Dir::AtoB => self.b.handle_frame(self.now, &f),
                Dir::BtoA => self.a.handle_frame(self.now, &f),
            }
            delivered = true;
        }
        if delivered {
            return true;
        }
        self.a.handle_timeout(self.now);
        self.b.handle_timeout(self.now);
        if self.transmit() > 0 {
            return true;
        }
        // Advance the clock to the next event, never past the horizon.
        let next = [
            self.wire.front().map(|w| w.0),
            self.a.poll_timeout(),
            self.b.poll_timeout(),
        ]
        .into_iter()
        .flatten()
        .min();
        match time::next_virtual_instant(self.now, next, horizon, idle_passes_time) {
            Some(t) => {
                self.now = t;
                true
            }
            None => false,
        }
    }

    /// Runs until idle or until `limit` of virtual time has passed, whichever comes first. The clock never passes
    /// `now + limit`: a timer due after it has neither fired nor been jumped over, so a test can observe the state
    /// just before a retransmission.
    pub fn drive_for(&mut self, limit: Duration) {
        self.run_to(self.now + limit, false);
    }

    /// Lets exactly `d` of virtual time pass (a real-time step): every frame and timer due within it is handled on
    /// time, and the clock ends at `now + d` even if the network goes idle earlier.
    pub fn advance(&mut self, d: Duration) {
        self.run_to(self.now + d, true);
    }

    fn run_to(&mut self, end: Instant, idle_passes_time: bool) {
        let mut guard = 0u64;
        while self.step_within(Some(end), idle_passes_time) {
            guard += 1;
            assert!(guard < 50_000_000, "livelock");
        }
    }

    /// Runs until idle: the clock jumps from event to event (timers included) until nothing is pending, bounded by
    /// 10 s of virtual time.
    pub fn drive(&mut self) {
        let end = self.now + Duration::from_secs(10);
        let mut guard = 0u64;
        while self.now <= end && self.step() {
            guard += 1;
            assert!(guard < 50_000_000, "livelock");
        }
    }
}

/// One end of a connection set up by [`connect`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct End {
    pub pd: PdHandle,
    pub cq: CqHandle,
    pub qpn: Qpn,
}

pub(crate) struct ConnOpts {
    pub qp_type: QpType,
    pub mtu: Mtu,
    pub cap: QpCap,
    pub access: AccessFlags,
    pub a_psn: Psn,
    pub b_psn: Psn,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub min_rnr_timer: u8,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    pub sq_sig_all: bool,
}

impl Default for ConnOpts {
    fn default() -> Self {
        ConnOpts {
            qp_type: QpType::Rc,
            mtu: Mtu::Mtu1024,
            cap: QpCap {
                max_send_wr: 64,
                max_recv_wr: 64,
                max_send_sge: 4,
                max_recv_sge: 4,
                max_inline_data: 256,
            },
            access: AccessFlags::LOCAL_WRITE
                | AccessFlags::REMOTE_WRITE
                | AccessFlags::REMOTE_READ
                | AccessFlags::REMOTE_ATOMIC,
            a_psn: Psn::new(100),
            b_psn: Psn::new(5000),
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 12,
            max_rd_atomic: 4,
            max_dest_rd_atomic: 16,
            sq_sig_all: true,
        }
    }
}

pub(crate) fn make_qp(e: &mut Engine, o: &ConnOpts) -> End {
    let pd = e.alloc_pd().unwrap();
    let cq = e.create_cq(4096).unwrap();
    let (qpn, _) = e
        .create_qp(&QpInitAttr {
            qp_type: o.qp_type,
            pd,
            send_cq: cq,
            recv_cq: cq,
            cap: o.cap,
            sq_sig_all: o.sq_sig_all,
        })
        .unwrap();
    End { pd, cq, qpn }
}

/// RESET→INIT→RTR→RTS for one side of a connected QP.
#[allow(clippy::too_many_arguments)]
pub(crate) fn bring_up(
    e: &mut Engine,
    me: End,
    peer_qpn: Qpn,
    peer_mac: [u8; 6],
    peer_ip: [u8; 4],
    my_psn: Psn,
    peer_psn: Psn,
    o: &ConnOpts,
) {
    let mut at = QpAttr {
        qp_state: QpState::Init,
        pkey_index: 0,
        port_num: 1,
        qp_access_flags: o.access,
        qkey: 0x1111_1111,
        ..QpAttr::default()
    };
    let init_mask = if o.qp_type == QpType::Ud {
        QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::QKEY
    } else {
        QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::ACCESS_FLAGS
    };
    e.modify_qp(me.qpn, &at, init_mask).unwrap();
    at.qp_state = QpState::Rtr;
    at.ah_attr = AhAttr {
        dgid: Gid::from_ipv4(peer_ip),
        dmac: peer_mac,
        traffic_class: 26 << 2,
        ..AhAttr::default()
    };
    at.path_mtu = o.mtu;
    at.dest_qp_num = peer_qpn;
    at.rq_psn = peer_psn;
    at.max_dest_rd_atomic = o.max_dest_rd_atomic;
    at.min_rnr_timer = o.min_rnr_timer;
    let rtr_mask = match o.qp_type {
        QpType::Rc => {
            QpAttrMask::STATE
                | QpAttrMask::AV
                | QpAttrMask::PATH_MTU
                | QpAttrMask::DEST_QPN
                | QpAttrMask::RQ_PSN
                | QpAttrMask::MAX_DEST_RD_ATOMIC
                | QpAttrMask::MIN_RNR_TIMER
        }
        QpType::Uc => {
            QpAttrMask::STATE
                | QpAttrMask::AV
                | QpAttrMask::PATH_MTU
                | QpAttrMask::DEST_QPN
                | QpAttrMask::RQ_PSN
        }
        QpType::Ud => QpAttrMask::STATE,
    };
    e.modify_qp(me.qpn, &at, rtr_mask).unwrap();
    at.qp_state = QpState::Rts;
    at.sq_psn = my_psn;
    at.timeout = o.timeout;
    at.retry_cnt = o.retry_cnt;
    at.rnr_retry = o.rnr_retry;
    at.max_rd_atomic = o.max_rd_atomic;
    let rts_mask = match o.qp_type {
        QpType::Rc => {
            QpAttrMask::STATE
                | QpAttrMask::SQ_PSN
                | QpAttrMask::TIMEOUT
                | QpAttrMask::RETRY_CNT
                | QpAttrMask::RNR_RETRY
                | QpAttrMask::MAX_QP_RD_ATOMIC
        }
        _ => QpAttrMask::STATE | QpAttrMask::SQ_PSN,
    };
    e.modify_qp(me.qpn, &at, rts_mask).unwrap();
}

pub(crate) fn connect(p: &mut Pair, o: &ConnOpts) -> (End, End) {
    let ea = make_qp(&mut p.a, o);
    let eb = make_qp(&mut p.b, o);
    bring_up(&mut p.a, ea, eb.qpn, MAC_B, IP_B, o.a_psn, o.b_psn, o);
    bring_up(&mut p.b, eb, ea.qpn, MAC_A, IP_A, o.b_psn, o.a_psn, o);
    (ea, eb)
}

/// Registers an MR filled with `fill(i)` bytes.
pub(crate) fn mr(e: &mut Engine, pd: PdHandle, len: usize, fill: impl Fn(usize) -> u8) -> MrInfo {
    let buf: Vec<u8> = (0..len).map(fill).collect();
    e.reg_mr(
        pd,
        buf,
        AccessFlags::LOCAL_WRITE
            | AccessFlags::REMOTE_WRITE
            | AccessFlags::REMOTE_READ
            | AccessFlags::REMOTE_ATOMIC,
    )
    .unwrap()
}

pub(crate) fn sge(m: &MrInfo, off: u64, len: u32) -> Sge {
    Sge {
        addr: m.addr + off,
        length: len,
        lkey: m.lkey,
    }
}

pub(crate) fn poll_all(e: &mut Engine, cq: CqHandle) -> Vec<Wc> {
    let mut out = Vec::new();
    let mut buf = [Wc::default(); 64];
    loop {
        let n = e.poll_cq(cq, &mut buf);
        if n == 0 {
            return out;
        }
        out.extend_from_slice(&buf[..n]);
    }
}

/// Opcode and PSN of a captured frame (IPv4 only).
pub(crate) fn bth_of(f: &[u8]) -> (u8, u32, bool) {
    let b = &f[42..54];
    (
        b[0],
        u32::from_be_bytes([0, b[9], b[10], b[11]]),
        b[8] & 0x80 != 0,
    )
}

/// Re-emits `template` (a captured frame) with a different opcode, PSN, extension headers and payload — for
/// injecting hand-made requests (`roce_wire::RoceRepr`, so the ICRC is right).
pub(crate) fn craft(
    template: &[u8],
    opcode: u8,
    psn: u32,
    ext: roce_wire::ExtRepr,
    payload: &[u8],
) -> Vec<u8> {
    reemit(
        template,
        |r| {
            r.bth.opcode = roce_wire::Opcode(opcode);
            r.bth.psn = Psn::new(psn);
            r.bth.ack_req = true;
            r.ext = ext;
        },
        payload,
    )
}

/// Re-emits `template` (a captured frame) after `edit` changed any header field (addresses, BTH, extension
/// headers), with `payload` and a correct pad count, IP checksum and ICRC — for forging packets a third party
/// could send.
pub(crate) fn reemit(
    template: &[u8],
    edit: impl FnOnce(&mut roce_wire::RoceRepr),
    payload: &[u8],
) -> Vec<u8> {
    let p = roce_wire::RoceRepr::parse(template).unwrap();
    let mut r = p.repr;
    edit(&mut r);
    r.bth.pad_count = ((4 - payload.len() % 4) % 4) as u8;
    r.payload_len = payload.len();
    let mut out = vec![0u8; r.buffer_len()];
    r.emit(&mut out, |b| b.copy_from_slice(payload)).unwrap();
    out
}

/// Counters an engine may count on the port without any QP (`stats.rs`): drops before a QP is known, and port/CQ
/// events.
const PORT_LEVEL: &[&str] = &[
    "rx_icrc_encapsulated",
    "drop_malformed",
    "drop_wrong_dest_ip",
    "drop_pkey_mismatch",
    "drop_unknown_qp",
    "link_downed",
    "cq_overflow",
    "port_shaper_credit_lost_bytes",
];

/// The counters' contract (`stats.rs`): the port set is the sum over the (live) QPs plus what belongs to no QP —
/// equal for every counter except [`PORT_LEVEL`], where the port may count more.
pub(crate) fn assert_counters_add_up(e: &Engine) {
    for &name in Counters::NAMES {
        let port = e.counters().get(name).unwrap_or(0);
        let sum: u64 = e
            .qpns()
            .map(|q| e.qp_counters(q).and_then(|c| c.get(name)).unwrap_or(0))
            .sum();
        if PORT_LEVEL.contains(&name) {
            assert!(port >= sum, "{name}: port {port} < sum over QPs {sum}");
        } else {
            assert_eq!(port, sum, "{name}: port counter is not the sum over QPs");
        }
    }
}
