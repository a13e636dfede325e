//! `rocev2 perf --perftest-compat`: the six tests speak perftest's out-of-band exchange ([`PerftestExchange`]) and
//! put perftest's traffic pattern on the wire, so that `ib_send_bw`, `ib_write_bw`, `ib_read_bw`, `ib_atomic_bw`,
//! `ib_send_lat` and `ib_write_lat` (perftest v4.5-0.17, "6.06", without `-R`) pair with `rocev2 perf` in either
//! role, given matching flags (test, `-s`, `-n`, `-q`, `--report_gbits`). There is no parameter exchange: both
//! sides must be started with the same flags, as with perftest itself.
//!
//! # Conversation (per test; `Q` = number of QPs, 1 for the latency tests)
//!
//! After the version / cycle-buffer / cache-line / MTU steps, the same 108-byte QP record is exchanged as a barrier
//! a fixed number of times (facts from perftest `src/*_bw.c`, `*_lat.c` `main`):
//!
//! | test | before the run | after the run |
//! |---|---|---|
//! | write / read / atomic bw | Q, Q, 1 | 1, five report values, close (1 + `done`) |
//! | send bw | Q, 1, Q, 1 (receives are posted before the last) | close (1 + `done`) |
//! | send lat | 1, 1, 1, 1 (receives are posted before the last) | close (1 + `done`) |
//! | write lat | 1, 1, 1, 1 | nothing: both sides just close |
//!
//! The first `Q` records carry each QP's data (the QP is connected after them); each later record must repeat it.
//!
//! # Traffic (what perftest does, `src/perftest_resources.c`)
//!
//! * bw tests: the client is the requester, `-n` messages per QP, at most `-t` outstanding, `-l` per post, every
//!   `-Q`th signaled. The remote address cycles through the peer's buffer in steps of `INC(size)` (the size rounded
//!   up to the cache line) when the size is at most half the cycle buffer, as `increase_rem_addr` does (atomics
//!   always cycle). The server is passive for WRITE/READ/atomic and reports nothing of its own (perftest sends
//!   uninitialised values; this side sends its expected size and count with zero rates) but prints the client's
//!   report. For SEND the server keeps `min(512, -n)` receives posted per QP, reposts until `-n` have arrived, and
//!   prints its own measurement; no reports are exchanged.
//! * send lat: both post receives; the client sends first, each side sends its next message when the peer's has
//!   arrived.
//! * write lat: the **server** writes first. Each side RDMA-WRITEs `-s` bytes whose last byte is its running send
//!   count (mod 256) to the peer's published buffer, then waits until the last byte of its own buffer shows the
//!   peer's next count. rocev2 MRs are owned by the engine, so the wait polls that byte with `Mr::read` (one engine
//!   command per poll) instead of a CPU load; this adds a few µs per poll to the measured latency. (rocev2's own
//!   `write-lat` uses WRITE_WITH_IMM and a receive completion instead; real `ib_write_lat` sends plain WRITEs.)
//!
//! # Buffer and record
//!
//! Like perftest, each QP gets a send half and a receive half of `B = INC(max(size, cycle buffer))` bytes each, in
//! one MR with remote write/read/atomic access; the record publishes the receive half (`vaddr`), the MR's rkey, this
//! side's IPv4-mapped GID, and out_reads = 16 for READ/atomic tests (1 otherwise, as perftest). This side's
//! responder accepts its own out_reads; as initiator it keeps at most `min(16, peer's out_reads)` READ/atomic
//! requests outstanding. The path MTU is the smaller of the two sides' offers: this side offers the active MTU of its
//! address (the netdev MTU − 80 rounded down to an IB MTU, see `port_mtu`; 1024 on a 1500-byte link, as rxe), or a
//! smaller `-m`.
//!
//! # GID check
//!
//! The peer's record must carry the IPv4-mapped GID of the address the TCP connection reached (rxe: run perftest
//! with `-x 1`). An all-zero GID or another address is a clear error and a non-zero exit.
//!
//! # Against Linux rxe
//!
//! rxe numbers its IPv4 IDs, so the UDP socket's rebuilt header would fail the ICRC: use `--rx-mode packet`
//! (AF_PACKET, root). Checked once by hand with `testdata/interop/softroce-vm` (perftest 4.5-0.17 in a TCG guest,
//! rxe MTU 1024, `-x 1 -F -n 200`, rocev2 in the `roce-net` namespace with `--rx-mode packet`): all six tests in
//! both roles ended with exit 0 on both sides and the same numbers printed on both (e.g. ib_write_bw server /
//! rocev2 client 9.45 MB/s average, ib_send_lat typical 4.8–5.2 ms: the guest is emulated). perftest `-x 0` (the
//! link-local GID) was refused by the GID check. The same matrix is the ignored test
//! `tests/perftest_compat.rs::six_tests_against_perftest_on_rxe` (root; it passed in 91 s with `-u 18`; once, at a
//! host load average of 7, the default `-u 14` ended a send-lat run in a retry-exceeded completion because the
//! emulated guest's ACK came later than 7 × 67 ms).
//!
//! # Example
//!
//! ```text
//! guest:  ib_write_bw -d rxe0 -x 1 -F
//! host:   ip netns exec roce-net rocev2 perf write-bw 198.18.0.2 --perftest-compat --ip 198.18.0.1 --rx-mode packet
//! ```

use std::net::{IpAddr, TcpListener};
use std::time::{Duration, Instant};

use roce_link::device::gid_of;
use roce_proto::{Qpn, WcOpcode};
use roce_verbs::{
    AccessFlags, AhAttr, Context, Cq, Gid, Mr, MrBuf, Mtu, ProgressMode, Psn, Qp, QpAttr,
    QpAttrMask, QpCap, QpState, RecvWr, Rkey, SendFlags, SendOp, SendWr, Wc, WcStatus,
};
use serde_json::json;

use super::report::{self, BwResult, LatStats};
use super::{Conn, Output, Params, PerfArgs, Test};
use crate::oob::{PerftestExchange, PtBwReport, PtRecord};

/// The cycle buffer this side announces (perftest: the page size).
const CYCLE_BUFFER: u32 = 4096;
/// The cache-line size this side announces (perftest: the L1 data cache line).
const CACHE_LINE: u32 = 64;
/// Receives perftest's SEND receiver keeps posted (`DEF_RX_SEND`), at most `-n`.
const RX_DEPTH: u64 = 512;
/// READ/atomic requests this side's responder accepts per QP (published as out_reads).
const OUT_READS: u8 = 16;
/// How long a passive server waits for the client to finish.
const PASSIVE_WAIT: Duration = Duration::from_secs(3600);
/// A run that makes no progress for this long is aborted.
const STALL: Duration = Duration::from_secs(30);
/// The add value of perftest's FETCH_AND_ADD (`ATOMIC_ADD_VALUE`).
const ATOMIC_ADD: u64 = 1;
/// After its last ping-pong message a write-lat side keeps its QP this long, so the transport ACK of the peer's
/// last WRITE is on the wire before the engine is torn down (there is no closing exchange in ib_write_lat).
const WRITE_LAT_LINGER: Duration = Duration::from_millis(200);

/// `INC(size, cache_line)` of perftest: the size rounded up to the cache line, at least one line.
fn inc(size: u64, cache_line: u64) -> u64 {
    if size > cache_line {
        size.div_ceil(cache_line) * cache_line
    } else {
        cache_line
    }
}

/// The order of record exchanges before the run: QP index of each (see the module docs).
fn pre_run_schedule(test: Test, q: usize) -> Vec<usize> {
    let all = 0..q;
    match test {
        Test::SendBw => all.clone().chain([0]).chain(all).chain([0]).collect(),
        Test::SendLat | Test::WriteLat => vec![0; 4],
        _ => all.clone().chain(all).chain([0]).collect(),
    }
}

fn check_test(a: &PerfArgs, p: &Params) -> Result<(), String> {
    if !matches!(
        p.test,
        Test::SendBw
            | Test::WriteBw
            | Test::ReadBw
            | Test::AtomicBw
            | Test::SendLat
            | Test::WriteLat
    ) {
        return Err(format!(
            "--perftest-compat supports send-bw, write-bw, read-bw, atomic-bw, send-lat and write-lat, not {}",
            p.test.name()
        ));
    }
    let refuse = |what: &str| Err(format!("--perftest-compat: {what} is not supported"));
    if p.conn != Conn::Rc {
        return refuse("-c UC/UD (perftest's default RC only)");
    }
    if a.all {
        return refuse("-a");
    }
    if p.duration.is_some() {
        return refuse("-D");
    }
    if p.infinite {
        return refuse("--run_infinitely");
    }
    if p.bidir {
        return refuse("-b");
    }
    if p.tclass != 0 {
        return refuse("-T/--tclass");
    }
    if a.output.is_some() {
        return refuse("--output");
    }
    if a.loopback {
        return Err(
            "--perftest-compat runs as a server or a client (two processes), not with --loopback"
                .into(),
        );
    }
    if a.events {
        return refuse("-e");
    }
    Ok(())
}

/// Entry point for `--perftest-compat` (client when an address is given, else server).
pub(super) fn run(
    a: &PerfArgs,
    p: &Params,
    out: &Output,
    devices: &super::Devices,
) -> Result<(), String> {
    check_test(a, p)?;
    let timeout = super::oob_timeout(a);
    let mut x = match &a.address {
        Some(host) => {
            PerftestExchange::connect(host, a.port, a.ip, timeout).map_err(|e| match e {
                crate::oob::OobError::Resolve { .. } => e.to_string(),
                _ => format!(
                    "{e} (is a perftest server, or `rocev2 perf --perftest-compat`, running there?)"
                ),
            })?
        }
        None => {
            let ip = a.ip.unwrap_or(IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED));
            let l = TcpListener::bind((ip, a.port))
                .map_err(|e| format!("listening on {ip}:{}: {e}", a.port))?;
            if out.print && !out.json {
                println!(
                    "************************************\n* Waiting for client to connect... *\n************************************"
                );
            }
            PerftestExchange::accept(&l, super::accept_timeout(a), timeout)
                .map_err(|e| e.to_string())?
        }
    };
    let is_client = a.address.is_some();
    let e = |e: crate::oob::OobError| e.to_string();
    let local = x.local_addr().map_err(e)?.ip();
    // Offer the active MTU of the local address (or a smaller -m), as perftest offers its port's active MTU.
    let mut p = p.clone();
    super::apply_port_mtu(a, &mut p, local, is_client, out.print)?;
    let p = &p;
    let version = x.versions().map_err(e)?;
    let (cycle, cache_line) = x.sys_data(CYCLE_BUFFER, CACHE_LINE).map_err(e)?;
    let mtu = mtu_of_enum(x.mtu(p.mtu as u8).map_err(e)?);
    let peer = x.peer_addr().ip();
    let (ctx, link_stats, rx, _link) = super::open_udp(
        a,
        p,
        local,
        peer,
        a.seed().wrapping_mul(2).wrapping_add(u64::from(is_client)),
        true,
    )?;
    devices.add(
        if is_client { "client" } else { "server" },
        &ctx,
        Some(&link_stats),
    );
    let geo = Geometry::new(p, u64::from(cycle), u64::from(cache_line));
    let r = super::dcqcn::with_rate_log(&a.cc, &ctx, true, || {
        session(
            &ctx,
            p,
            &geo,
            &mut x,
            is_client,
            mtu,
            &version,
            a.qp_timeout,
            out,
        )
    });
    super::with_rx_hint(r, rx, &link_stats)
}

fn mtu_of_enum(e: u8) -> Mtu {
    match e {
        1 => Mtu::Mtu256,
        2 => Mtu::Mtu512,
        3 => Mtu::Mtu1024,
        4 => Mtu::Mtu2048,
        _ => Mtu::Mtu4096,
    }
}

/// Buffer geometry shared with the peer (perftest's `BUFF_SIZE`, `INC`).
#[derive(Clone, Copy, Debug)]
struct Geometry {
    /// Message size.
    size: u64,
    /// Negotiated cycle buffer.
    cycle: u64,
    /// Negotiated cache line.
    cache_line: u64,
    /// Bytes of each half per QP.
    half: u64,
    /// QPs.
    q: usize,
}

impl Geometry {
    fn new(p: &Params, cycle: u64, cache_line: u64) -> Geometry {
        let size = p.sizes.first().copied().unwrap_or(8);
        let cache_line = cache_line.clamp(1, 4096);
        let cycle = cycle.clamp(cache_line, 1 << 20);
        Geometry {
            size,
            cycle,
            cache_line,
            half: inc(size.max(cycle), cache_line),
            q: p.qps.max(1) as usize,
        }
    }
    fn tx_off(&self, i: usize) -> u64 {
        self.half * i as u64
    }
    fn rx_off(&self, i: usize) -> u64 {
        self.half * (self.q + i) as u64
    }
    fn mr_len(&self) -> u64 {
        2 * self.half * self.q as u64
    }
    /// Offset of the `n`th remote access from the peer's vaddr (`increase_rem_addr`).
    fn remote_step(&self, test: Test, n: u64) -> u64 {
        let step = inc(self.size, self.cache_line);
        if test == Test::AtomicBw || self.size <= self.cycle / 2 {
            (n % (self.cycle / step).max(1)) * step
        } else {
            0
        }
    }
}

struct Sess<'a> {
    p: &'a Params,
    g: Geometry,
    cq: Cq,
    mr: Mr,
    /// The registered memory, read and written in place.
    buf: MrBuf,
    qps: Vec<Qp>,
    mine: Vec<PtRecord>,
    remote: Vec<PtRecord>,
    wcs: Vec<Wc>,
}

impl Sess<'_> {
    fn poll(&mut self) -> usize {
        let n = self.cq.poll(&mut self.wcs);
        // Caller progress: the empty poll ran a pass here; Thread progress: let the progress thread have the CPU.
        if n == 0 && self.cq.context().progress_mode() == ProgressMode::Thread {
            std::thread::yield_now();
        }
        n
    }

    fn post_recv(&self, i: usize, id: u64) -> Result<(), String> {
        let sge = [self.mr.sge(self.g.rx_off(i), self.g.size as u32)];
        self.qps[i]
            .post_recv(&[RecvWr {
                wr_id: ((i as u64) << 32) | (id & 0xffff_ffff),
                sg_list: &sge,
            }])
            .map_err(|e| format!("post_recv: {e}"))
    }
}

fn wc_error(wc: &Wc) -> String {
    format!(
        "work completion error: {} (wr_id {:#x}, QP {}, opcode {:?})",
        wc.status, wc.wr_id, wc.qp_num, wc.opcode
    )
}

/// The peer's GID must be the GID of the address we reached it at (see the module docs).
fn check_peer_gid(gid: [u8; 16], peer: IpAddr) -> Result<(), String> {
    let g = Gid(gid);
    if gid == [0; 16] {
        return Err(format!(
            "the peer at {peer} sent an all-zero GID: with perftest give the index of its IPv4-mapped RoCE v2 GID \
             (`-x 1` on rxe)"
        ));
    }
    if g != gid_of(peer) {
        return Err(format!(
            "the peer's GID {g} is not {}, the GID of {peer} where it was reached: with perftest give the index of \
             that GID (`-x 1` on rxe; `ibv_devinfo -v` lists the table)",
            gid_of(peer)
        ));
    }
    Ok(())
}

/// RESET→INIT→RTR→RTS towards `r`: this side's responder accepts `OUT_READS` (or 1) READ/atomics as published;
/// as initiator it uses at most the peer's out_reads (perftest `ctx_modify_qp_to_rtr`/`_rts`).
fn connect_qp(
    qp: &Qp,
    r: &PtRecord,
    my: &PtRecord,
    mtu: Mtu,
    peer_mac: [u8; 6],
    qp_timeout: u8,
) -> Result<(), String> {
    let e = |what: &'static str| move |e: roce_verbs::Error| format!("{what}: {e}");
    let init = QpAttr {
        qp_state: QpState::Init,
        pkey_index: 0,
        port_num: 1,
        qp_access_flags: AccessFlags::REMOTE_WRITE
            | AccessFlags::REMOTE_READ
            | AccessFlags::REMOTE_ATOMIC,
        ..QpAttr::default()
    };
    qp.modify(
        &init,
        QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::ACCESS_FLAGS,
    )
    .map_err(e("QP to INIT"))?;
    let rtr = QpAttr {
        qp_state: QpState::Rtr,
        ah_attr: AhAttr {
            dgid: Gid(r.gid),
            hop_limit: 64,
            dmac: peer_mac,
            ..AhAttr::default()
        },
        path_mtu: mtu,
        dest_qp_num: Qpn::new(r.qpn & 0xff_ffff),
        rq_psn: Psn::new(r.psn & 0xff_ffff),
        max_dest_rd_atomic: my.out_reads.clamp(1, 255) as u8,
        min_rnr_timer: 1,
        ..QpAttr::default()
    };
    qp.modify(
        &rtr,
        QpAttrMask::STATE
            | QpAttrMask::AV
            | QpAttrMask::PATH_MTU
            | QpAttrMask::DEST_QPN
            | QpAttrMask::RQ_PSN
            | QpAttrMask::MAX_DEST_RD_ATOMIC
            | QpAttrMask::MIN_RNR_TIMER,
    )
    .map_err(e("QP to RTR"))?;
    let rts = QpAttr {
        qp_state: QpState::Rts,
        sq_psn: Psn::new(my.psn),
        timeout: qp_timeout,
        retry_cnt: 7,
        rnr_retry: 7,
        max_rd_atomic: r.out_reads.clamp(1, u32::from(OUT_READS)) as u8,
        ..QpAttr::default()
    };
    qp.modify(
        &rts,
        QpAttrMask::STATE
            | QpAttrMask::SQ_PSN
            | QpAttrMask::TIMEOUT
            | QpAttrMask::RETRY_CNT
            | QpAttrMask::RNR_RETRY
            | QpAttrMask::MAX_QP_RD_ATOMIC,
    )
    .map_err(e("QP to RTS"))
}

#[allow(clippy::too_many_arguments)]
fn session(
    ctx: &Context,
    p: &Params,
    g: &Geometry,
    x: &mut PerftestExchange,
    is_client: bool,
    mtu: Mtu,
    version: &str,
    qp_timeout: u8,
    out: &Output,
) -> Result<(), String> {
    let e = |what: &'static str| move |e: roce_verbs::Error| format!("{what}: {e}");
    let oe = |e: crate::oob::OobError| e.to_string();
    let test = p.test;
    let q = g.q;
    let sends = matches!(test, Test::SendBw | Test::SendLat);
    let rx_want = if sends {
        RX_DEPTH.min(p.iters).max(1) as u32
    } else {
        1
    };
    let pd = ctx.alloc_pd().map_err(e("alloc_pd"))?;
    let tx_depth = p.tx_depth.max(1);
    // The CQ holds what can be queued at once (as `bench::CqPlan`, issue #21): per QP the signalled sends in flight
    // (`bw_client` signals one in `-Q`: at most `tx_depth / cq_mod + 2`; the latency loops every one) plus the
    // receives posted, within `max_cqe`; a SEND receiver's ring shrinks to fit (the sender meets it with RNR).
    let send = if test.is_bw() {
        (tx_depth / p.cq_mod.clamp(1, tx_depth) + 2).min(tx_depth)
    } else {
        tx_depth
    };
    let max_cqe = ctx.query_device().max_cqe;
    let room = max_cqe.saturating_sub(64) / (q as u32).max(1);
    let rx_depth = rx_want.min(room.saturating_sub(send));
    if rx_depth == 0 {
        return Err(format!(
            "-q {q} with -t {tx_depth} and -Q {}: {} completions per QP do not fit one CQ of the device's max_cqe \
             {max_cqe}",
            p.cq_mod,
            send + 1
        ));
    }
    let cq = ctx
        .create_cq(q as u32 * (send + rx_depth) + 64, None, Default::default())
        .map_err(e("create_cq"))?;
    let buf =
        MrBuf::new(g.mr_len() as usize).map_err(|e| format!("allocating the test buffer: {e}"))?;
    let mr = pd
        .reg_mr(
            &buf,
            AccessFlags::LOCAL_WRITE
                | AccessFlags::REMOTE_WRITE
                | AccessFlags::REMOTE_READ
                | AccessFlags::REMOTE_ATOMIC,
        )
        .map_err(e("reg_mr"))?;
    let inline = if test == Test::WriteLat || test == Test::SendLat {
        p.inline
            .max(g.size.min(roce_verbs::MAX_INLINE as u64) as u32)
            .min(roce_verbs::MAX_INLINE as u32)
    } else {
        p.inline
    };
    let cap = QpCap {
        max_send_wr: tx_depth.max(16),
        max_recv_wr: rx_depth,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: inline,
    };
    let gid = ctx.gid(0).unwrap_or_default();
    let out_reads = if matches!(test, Test::ReadBw | Test::AtomicBw) {
        u32::from(OUT_READS)
    } else {
        1
    };
    let mut qps = Vec::new();
    let mut mine = Vec::new();
    for i in 0..q {
        let qp = pd
            .create_qp(p.conn.qp_type(), &cq, &cq, cap, false)
            .map_err(e("create_qp"))?;
        let psn = ctx.random_psn().map_err(e("random_psn"))?;
        mine.push(PtRecord {
            lid: 0,
            out_reads,
            qpn: qp.qpn().value(),
            psn: psn.value(),
            rkey: mr.rkey().0,
            vaddr: mr.addr() + g.rx_off(i),
            gid: gid.0,
            srqn: 0,
        });
        qps.push(qp);
    }
    let peer_ip = x.peer_addr().ip();
    let peer_mac = super::mac_of(peer_ip);
    let schedule = pre_run_schedule(test, q);
    let (setup, barriers) = schedule.split_at(q);
    let mut remote = Vec::new();
    for &i in setup {
        remote.push(x.handshake(&mine[i], x.timeout()).map_err(oe)?);
    }
    check_peer_gid(remote[0].gid, peer_ip)?;
    for i in 0..q {
        connect_qp(&qps[i], &remote[i], &mine[i], mtu, peer_mac, qp_timeout)?;
    }
    if out.print {
        banner(p, g, &mine[0], &remote[0], mtu, version, x, is_client, out);
    }
    let mut s = Sess {
        p,
        g: *g,
        cq,
        mr,
        buf,
        qps,
        mine,
        remote,
        wcs: vec![Wc::default(); 64],
    };
    let (last, middle) = barriers.split_last().ok_or("empty barrier schedule")?;
    for &i in middle {
        barrier(&s, x, i, x.timeout())?;
    }
    // Receives before the last barrier (perftest's SEND receivers post theirs there too).
    let mut rx_posted = vec![0u64; q];
    if (test == Test::SendBw && !is_client) || test == Test::SendLat {
        for (i, posted) in rx_posted.iter_mut().enumerate() {
            for _ in 0..rx_depth {
                s.post_recv(i, *posted)?;
                *posted += 1;
            }
            s.qps[i]
                .sync()
                .map_err(|e| format!("handing receives to the engine: {e}"))?;
        }
    }
    barrier(&s, x, *last, x.timeout())?;
    if out.print && !out.json {
        println!(
            "{}",
            if test.is_bw() {
                report::bw_header(out.gbits)
            } else {
                report::lat_header()
            }
        );
    }
    let close_rec = s.mine[0];
    match (test, is_client) {
        (Test::WriteBw | Test::ReadBw | Test::AtomicBw, true) => {
            let r = bw_client(&mut s)?;
            barrier(&s, x, 0, x.timeout())?;
            let mine = PtBwReport {
                size: r.size,
                iters: r.iterations,
                bw_peak: unit(r.peak_bps, out.gbits),
                bw_avg: unit(r.avg_bytes_per_sec(), out.gbits),
                msg_rate: r.msg_rate_mpps(),
            };
            x.bw_reports(&mine).map_err(oe)?;
            emit_bw(out, test, &r);
        }
        (Test::WriteBw | Test::ReadBw | Test::AtomicBw, false) => {
            barrier(&s, x, 0, PASSIVE_WAIT)?;
            let mine = PtBwReport {
                size: g.size,
                iters: p.iters * q as u64,
                bw_peak: 0.0,
                bw_avg: 0.0,
                msg_rate: 0.0,
            };
            let theirs = x.bw_reports(&mine).map_err(oe)?;
            emit_peer_bw(out, test, &theirs);
        }
        (Test::SendBw, true) => {
            let r = bw_client(&mut s)?;
            emit_bw(out, test, &r);
        }
        (Test::SendBw, false) => {
            let r = send_bw_server(&mut s, &mut rx_posted)?;
            emit_bw(out, test, &r);
        }
        (Test::SendLat, _) => {
            let st = send_lat(&mut s, is_client, &mut rx_posted)?;
            emit_lat(out, test, g.size, p.iters, &st);
        }
        (Test::WriteLat, _) => {
            let st = write_lat(&mut s, is_client)?;
            emit_lat(out, test, g.size, p.iters, &st);
            std::thread::sleep(WRITE_LAT_LINGER);
        }
        _ => return Err(format!("{} is not a perftest-compatible test", test.name())),
    }
    if out.print && !out.json {
        println!("{}", report::footer());
    }
    if test != Test::WriteLat {
        x.close(&close_rec).map_err(oe)?;
    }
    Ok(())
}

/// One barrier record exchange with QP `i`'s record; the peer's must repeat what it sent at setup.
fn barrier(s: &Sess<'_>, x: &mut PerftestExchange, i: usize, wait: Duration) -> Result<(), String> {
    let r = x.handshake(&s.mine[i], wait).map_err(|e| e.to_string())?;
    if r != s.remote[i] {
        return Err(format!(
            "the peer's QP record changed between barriers ({:?} then {:?}): do both sides run the same test with \
             the same -q?",
            s.remote[i], r
        ));
    }
    Ok(())
}

/// Bytes per second in the report unit: MB/s (2^20 bytes) or Gb/s.
fn unit(bps: f64, gbits: bool) -> f64 {
    if gbits {
        bps * 8.0 / 1e9
    } else {
        bps / f64::from(1u32 << 20)
    }
}

/// The requester loop of the bw tests (client): `-n` operations per QP, perftest's addressing and moderation.
fn bw_client(s: &mut Sess<'_>) -> Result<BwResult, String> {
    let p = s.p;
    let test = p.test;
    let q = s.g.q;
    let iters = p.iters;
    let size = if test == Test::AtomicBw { 8 } else { s.g.size };
    let tx_depth = u64::from(p.tx_depth.max(1));
    let post_list = u64::from(p.post_list.max(1)).min(tx_depth);
    let cq_mod = u64::from(p.cq_mod.max(1)).min(tx_depth);
    let mut posted = vec![0u64; q];
    let mut completed = vec![0u64; q];
    let mut samples: Vec<(Duration, u64)> = Vec::new();
    let t0 = Instant::now();
    let mut last_progress = Instant::now();
    let mut wrs_sge = Vec::with_capacity(post_list as usize);
    loop {
        for i in 0..q {
            while posted[i] < iters
                && posted[i] - completed[i] + post_list.min(iters - posted[i]) <= tx_depth
            {
                let n = post_list.min(iters - posted[i]);
                wrs_sge.clear();
                for k in 0..n {
                    wrs_sge.push((posted[i] + k, [s.mr.sge(s.g.tx_off(i), size as u32)]));
                }
                let rem = s.remote[i];
                let wrs: Vec<SendWr<'_>> = wrs_sge
                    .iter()
                    .map(|(idx, sge)| {
                        let addr = rem.vaddr.wrapping_add(s.g.remote_step(test, *idx));
                        let rkey = Rkey(rem.rkey);
                        let op = match test {
                            Test::WriteBw => SendOp::RdmaWrite {
                                remote_addr: addr,
                                rkey,
                            },
                            Test::ReadBw => SendOp::RdmaRead {
                                remote_addr: addr,
                                rkey,
                            },
                            Test::AtomicBw => SendOp::AtomicFetchAndAdd {
                                remote_addr: addr,
                                rkey,
                                add: ATOMIC_ADD,
                            },
                            _ => SendOp::Send,
                        };
                        let inline = matches!(test, Test::WriteBw | Test::SendBw)
                            && size <= u64::from(p.inline);
                        let mut wr =
                            SendWr::new(((i as u64) << 32) | *idx, op, sge).flags(if inline {
                                SendFlags::INLINE
                            } else {
                                SendFlags::EMPTY
                            });
                        if (idx + 1) % cq_mod == 0 || idx + 1 == iters {
                            wr = wr.signaled();
                        }
                        wr
                    })
                    .collect();
                s.qps[i]
                    .post_send(&wrs)
                    .map_err(|e| format!("post_send: {e}"))?;
                posted[i] += n;
            }
        }
        let n = s.poll();
        if n > 0 {
            last_progress = Instant::now();
            for wc in &s.wcs[..n] {
                if wc.status != WcStatus::Success {
                    return Err(wc_error(wc));
                }
                let i = (wc.wr_id >> 32) as usize;
                if let Some(c) = completed.get_mut(i) {
                    *c = (*c).max((wc.wr_id & 0xffff_ffff) + 1);
                }
            }
            samples.push((t0.elapsed(), completed.iter().sum()));
        } else if last_progress.elapsed() > STALL {
            return Err(format!(
                "no completion for {STALL:?} ({} of {} done)",
                completed.iter().sum::<u64>(),
                iters * q as u64
            ));
        }
        if completed.iter().all(|&c| c >= iters) {
            break;
        }
    }
    let elapsed = t0.elapsed();
    let total = iters * q as u64;
    let peak = super::bench::peak_bps(&samples, size, elapsed);
    let r = BwResult {
        size,
        iterations: total,
        elapsed,
        peak_bps: 0.0,
    };
    let avg = r.avg_bytes_per_sec();
    Ok(BwResult {
        peak_bps: peak.max(avg),
        ..r
    })
}

/// perftest's SEND bw server: count `-n` receives per QP (reposting while fewer are posted), timed from the first
/// arrival to the last.
fn send_bw_server(s: &mut Sess<'_>, rx_posted: &mut [u64]) -> Result<BwResult, String> {
    let q = s.g.q;
    let iters = s.p.iters;
    let mut got = vec![0u64; q];
    let mut first: Option<Instant> = None;
    let mut samples: Vec<(Duration, u64)> = Vec::new();
    let start = Instant::now();
    let mut last_progress = Instant::now();
    while got.iter().any(|&g| g < iters) {
        let n = s.poll();
        if n == 0 {
            if last_progress.elapsed() > STALL {
                return Err(format!(
                    "no message for {STALL:?} ({} of {} received)",
                    got.iter().sum::<u64>(),
                    iters * q as u64
                ));
            }
            continue;
        }
        last_progress = Instant::now();
        let t_first = *first.get_or_insert_with(Instant::now);
        for k in 0..n {
            let wc = s.wcs[k];
            if wc.status != WcStatus::Success {
                return Err(wc_error(&wc));
            }
            if wc.opcode != WcOpcode::Recv {
                continue;
            }
            let i = (wc.wr_id >> 32) as usize;
            if i >= q {
                continue;
            }
            got[i] += 1;
            if wc.byte_len as u64 != s.g.size {
                return Err(format!(
                    "received a {}-byte message, expected {} (is the peer's -s the same?)",
                    wc.byte_len, s.g.size
                ));
            }
            if rx_posted[i] < iters {
                s.post_recv(i, rx_posted[i])?;
                rx_posted[i] += 1;
            }
        }
        samples.push((t_first.elapsed(), got.iter().sum()));
    }
    let t_first = first.unwrap_or(start);
    let elapsed = t_first.elapsed();
    let r = BwResult {
        size: s.g.size,
        iterations: iters * q as u64,
        elapsed,
        peak_bps: 0.0,
    };
    let peak = super::bench::peak_bps(&samples, s.g.size, elapsed).max(r.avg_bytes_per_sec());
    Ok(BwResult {
        peak_bps: peak,
        ..r
    })
}

/// Waits for one completion of `kind` (receive or send), failing on an error completion or a stall. Completions of
/// the other kind seen meanwhile are counted in `other`.
fn wait_wc(s: &mut Sess<'_>, want_recv: bool, other: &mut u64) -> Result<Wc, String> {
    let t0 = Instant::now();
    loop {
        let n = s.poll();
        for k in 0..n {
            let wc = s.wcs[k];
            if wc.status != WcStatus::Success {
                return Err(wc_error(&wc));
            }
            let is_recv = matches!(wc.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm);
            if is_recv == want_recv {
                // Keep any completions polled after this one for the next call.
                if k + 1 < n {
                    let rest: Vec<Wc> = s.wcs[k + 1..n].to_vec();
                    for w in rest {
                        let r = matches!(w.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm);
                        if w.status != WcStatus::Success {
                            return Err(wc_error(&w));
                        }
                        if r != want_recv {
                            *other += 1;
                        } else {
                            return Err("two completions at once in a ping-pong test".into());
                        }
                    }
                }
                return Ok(wc);
            }
            *other += 1;
        }
        if t0.elapsed() > STALL {
            return Err(format!(
                "no {} within {STALL:?}",
                if want_recv {
                    "message from the peer"
                } else {
                    "send completion"
                }
            ));
        }
    }
}

/// perftest's SEND ping-pong (`run_iter_lat_send`): the client sends first, the server answers each message; a
/// sample is half the time from a send to the arrival of the peer's next message.
fn send_lat(s: &mut Sess<'_>, is_client: bool, rx_posted: &mut [u64]) -> Result<LatStats, String> {
    let iters = s.p.iters;
    let size = s.g.size;
    let mut st = LatStats::new();
    let payload = vec![0x5au8; size as usize];
    let inline = size <= u64::from(s.qps[0].cap().max_inline_data);
    let mut sends_done = 0u64;
    let mut rcnt = 0u64;
    let mut scnt = 0u64;
    let mut t_post: Option<Instant> = None;
    while scnt < iters || rcnt < iters {
        if rcnt < iters && !(is_client && scnt == 0) {
            let wc = wait_wc(s, true, &mut sends_done)?;
            if let Some(t) = t_post.take() {
                st.record((t.elapsed().as_nanos() / 2) as u64);
            }
            if u64::from(wc.byte_len) != size {
                return Err(format!(
                    "received a {}-byte message, expected {size} (is the peer's -s the same?)",
                    wc.byte_len
                ));
            }
            rcnt += 1;
            if rx_posted[0] < iters {
                s.post_recv(0, rx_posted[0])?;
                rx_posted[0] += 1;
            }
        }
        if scnt < iters {
            let sge = [s.mr.sge(s.g.tx_off(0), size as u32)];
            let data = [payload.as_slice()];
            let mut wr = SendWr::new(scnt, SendOp::Send, &sge).signaled();
            if inline {
                wr = wr
                    .inline(&data)
                    .flags(SendFlags::INLINE | SendFlags::SIGNALED);
            }
            t_post = Some(Instant::now());
            s.qps[0]
                .post_send(&[wr])
                .map_err(|e| format!("post_send: {e}"))?;
            scnt += 1;
        }
    }
    // Every send must complete (acknowledged) before the closing exchange.
    let mut none = 0u64;
    while sends_done < scnt {
        wait_wc(s, false, &mut none)?;
        sends_done += 1;
    }
    Ok(st)
}

/// perftest's WRITE ping-pong (see the module docs): the server writes first; a side's count is the last byte of its
/// message, and the peer's arrival is seen in the last byte of this side's buffer.
fn write_lat(s: &mut Sess<'_>, is_client: bool) -> Result<LatStats, String> {
    let iters = s.p.iters;
    let size = s.g.size;
    let mut st = LatStats::new();
    let inline = size <= u64::from(s.qps[0].cap().max_inline_data);
    let mut payload = vec![0x5au8; size as usize];
    let poll_off = (s.g.rx_off(0) + size - 1) as usize;
    let post_off = (s.g.tx_off(0) + size - 1) as usize;
    let rem = s.remote[0];
    let mut scnt = 0u64;
    let mut rcnt = 0u64;
    let mut t_post: Option<Instant> = None;
    let mut none = 0u64;
    while scnt < iters || rcnt < iters {
        if rcnt < iters && (is_client || scnt != 0) {
            rcnt += 1;
            let want = rcnt as u8;
            let t0 = Instant::now();
            loop {
                // A volatile read of the byte the peer's WRITE lands on: each pass really reads memory.
                let mut b = [0u8; 1];
                s.buf
                    .read_volatile(poll_off, &mut b)
                    .map_err(|e| format!("polling the WRITE target: {e}"))?;
                if b[0] == want {
                    break;
                }
                if t0.elapsed() > STALL {
                    return Err(format!(
                        "the peer's WRITE #{rcnt} did not arrive within {STALL:?}"
                    ));
                }
                // Nothing polls a CQ while waiting on memory: drive the engine here (Caller progress), or leave the
                // CPU to the progress thread.
                let ctx = s.cq.context();
                if ctx.progress_mode() == ProgressMode::Caller {
                    ctx.progress();
                } else {
                    std::thread::yield_now();
                }
            }
            if let Some(t) = t_post.take() {
                st.record((t.elapsed().as_nanos() / 2) as u64);
            }
        }
        if scnt < iters {
            scnt += 1;
            let mark = scnt as u8;
            let sge = [s.mr.sge(s.g.tx_off(0), size as u32)];
            let op = SendOp::RdmaWrite {
                remote_addr: rem.vaddr,
                rkey: Rkey(rem.rkey),
            };
            if let Some(last) = payload.last_mut() {
                *last = mark;
            }
            let data = [payload.as_slice()];
            let wr = if inline {
                SendWr::new(scnt, op, &sge)
                    .inline(&data)
                    .flags(SendFlags::INLINE | SendFlags::SIGNALED)
            } else {
                s.buf
                    .write(post_off, &[mark])
                    .map_err(|e| format!("marking the WRITE source: {e}"))?;
                SendWr::new(scnt, op, &sge).signaled()
            };
            t_post = Some(Instant::now());
            s.qps[0]
                .post_send(&[wr])
                .map_err(|e| format!("post_send: {e}"))?;
            wait_wc(s, false, &mut none)?;
        }
    }
    Ok(st)
}

fn emit_bw(out: &Output, test: Test, r: &BwResult) {
    if !out.print {
        return;
    }
    if out.json {
        let mut j = report::bw_json(test.name(), "RC", r, None);
        j["perftest_compat"] = json!(true);
        println!("{j}");
    } else {
        println!("{}", report::bw_line(r, out.gbits));
    }
}

/// The server of write/read/atomic bw prints the client's report, as perftest's server does.
fn emit_peer_bw(out: &Output, test: Test, r: &PtBwReport) {
    if !out.print {
        return;
    }
    if out.json {
        println!(
            "{}",
            json!({
                "test": test.name(),
                "conn": "RC",
                "side": "server",
                "source": "peer report",
                "perftest_compat": true,
                "size": r.size,
                "iterations": r.iters,
                "unit": if out.gbits { "Gb/s" } else { "MB/s" },
                "bw_peak": r.bw_peak,
                "bw_avg": r.bw_avg,
                "msg_rate_mpps": r.msg_rate,
            })
        );
    } else {
        println!(
            " {:<10} {:<12} {:<18.2} {:<18.2} {:.6}",
            r.size, r.iters, r.bw_peak, r.bw_avg, r.msg_rate
        );
    }
}

/// A latency result; `iterations` is the message count each way (`-n`), `samples` the recorded half round trips
/// (one fewer on the side that answers last, as perftest's own `iters - 1` deltas).
fn emit_lat(out: &Output, test: Test, size: u64, iters: u64, st: &LatStats) {
    if !out.print {
        return;
    }
    if out.json {
        let mut j = report::lat_json(test.name(), "RC", size, st, None);
        j["perftest_compat"] = json!(true);
        j["samples"] = json!(st.count());
        j["iterations"] = json!(iters);
        println!("{j}");
    } else {
        println!("{}", report::lat_line(size, st));
    }
}

#[allow(clippy::too_many_arguments)]
fn banner(
    p: &Params,
    g: &Geometry,
    mine: &PtRecord,
    remote: &PtRecord,
    mtu: Mtu,
    version: &str,
    x: &PerftestExchange,
    is_client: bool,
    out: &Output,
) {
    let text = format!(
        "{footer}\n                    {title} (perftest-compatible)\n \
         Role            : {role}\n \
         Number of qps   : {qps}\t\tTransport type : IB (RoCE v2, rocev2 software RNIC)\n \
         Connection type : RC\t\tUsing SRQ      : OFF\n \
         TX depth        : {txd}\n \
         Mtu             : {mtu}[B]\n \
         Link type       : Ethernet (UDP 4791)\n \
         Message size    : {size}[B]   Iterations : {iters}\n \
         Cycle buffer    : {cycle}[B]   Cache line : {cl}[B]\n \
         Peer            : {peer} (perftest exchange, peer version {version} = {vnum})\n \
         local address: QPN {lq:#08x} PSN {lp:#08x} RKey {lr:#010x} VAddr {lv:#018x} out_reads {lo}\n \
         GID: {lg}\n \
         remote address: QPN {rq:#08x} PSN {rp:#08x} RKey {rr:#010x} VAddr {rv:#018x} out_reads {ro}\n \
         GID: {rg}",
        footer = report::footer(),
        title = p.test.title(),
        role = if is_client { "client" } else { "server" },
        qps = g.q,
        txd = p.tx_depth,
        mtu = mtu.bytes(),
        size = g.size,
        iters = p.iters,
        cycle = g.cycle,
        cl = g.cache_line,
        peer = x.peer_addr(),
        vnum = x.remote_version(),
        lq = mine.qpn,
        lp = mine.psn,
        lr = mine.rkey,
        lv = mine.vaddr,
        lo = mine.out_reads,
        lg = Gid(mine.gid),
        rq = remote.qpn,
        rp = remote.psn,
        rr = remote.rkey,
        rv = remote.vaddr,
        ro = remote.out_reads,
        rg = Gid(remote.gid),
    );
    if out.json {
        eprintln!("{text}");
    } else {
        println!("{text}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedules_match_perftest_mains() {
        assert_eq!(pre_run_schedule(Test::WriteBw, 1), vec![0, 0, 0]);
        assert_eq!(pre_run_schedule(Test::ReadBw, 2), vec![0, 1, 0, 1, 0]);
        assert_eq!(pre_run_schedule(Test::SendBw, 1), vec![0, 0, 0, 0]);
        assert_eq!(pre_run_schedule(Test::SendBw, 2), vec![0, 1, 0, 0, 1, 0]);
        assert_eq!(pre_run_schedule(Test::SendLat, 1), vec![0; 4]);
        assert_eq!(pre_run_schedule(Test::WriteLat, 1), vec![0; 4]);
    }

    #[test]
    fn remote_addresses_stay_in_the_published_buffer() {
        for (size, test) in [
            (2u64, Test::WriteBw),
            (64, Test::WriteBw),
            (1000, Test::ReadBw),
            (2048, Test::WriteBw),
            (2049, Test::WriteBw),
            (65536, Test::WriteBw),
            (8, Test::AtomicBw),
        ] {
            let g = Geometry {
                size,
                cycle: 4096,
                cache_line: 64,
                half: inc(size.max(4096), 64),
                q: 1,
            };
            for n in 0..1000 {
                let off = g.remote_step(test, n);
                assert!(off + size <= g.half, "size {size} n {n} off {off}");
            }
        }
        assert_eq!(inc(2, 64), 64);
        assert_eq!(inc(65, 64), 128);
        assert_eq!(inc(65536, 64), 65536);
    }

    #[test]
    fn gid_mismatch_is_an_error() {
        let ip: IpAddr = "198.18.0.2".parse().expect("ip");
        assert!(check_peer_gid(Gid::from_ipv4([198, 18, 0, 2]).0, ip).is_ok());
        let e = check_peer_gid([0; 16], ip).expect_err("zero");
        assert!(e.contains("all-zero") && e.contains("-x 1"), "{e}");
        let mut ll = [0u8; 16];
        ll[0] = 0xfe;
        ll[1] = 0x80;
        let e = check_peer_gid(ll, ip).expect_err("link-local");
        assert!(e.contains("198.18.0.2"), "{e}");
    }
}
