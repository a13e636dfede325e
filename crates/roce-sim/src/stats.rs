//! Measurements (`DCQCN.md` §6): per-flow throughput at the receiver in bins, Jain fairness, time-weighted queue
//! statistics of the bottleneck port (the switch egress towards the receiver), CNPs and CE marks — collected by
//! cheap counters on the per-packet path, turned into a [`Summary`] and CSV time series at the end.
//!
//! Throughput counts wire bytes (frame + Ethernet overhead) of the flow's request packets reaching the receiver, so
//! a saturated bottleneck reads as its line rate; `goodput_gbps` scales that by payload / wire size of a full packet.

use std::fmt::Write as _;

use serde::Serialize;

use crate::scenario::Scenario;

/// One flow in one bin.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct FlowBin {
    /// Wire bytes of the flow's data delivered to the receiver in the bin.
    pub bytes: u64,
    /// CNPs that reached the flow's sender in the bin.
    pub cnps: u32,
    /// CE-marked data packets of the flow delivered in the bin.
    pub marks: u32,
    /// The sender QP's rate RC at the end of the bin, bit/s.
    pub rc_bps: f64,
}

/// The bottleneck queue in one bin.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct QueueBin {
    /// Time-weighted mean occupancy, bytes.
    pub mean: f64,
    /// Largest occupancy, bytes.
    pub max: u64,
}

/// Collects per-packet observations.
#[derive(Clone, Debug)]
pub struct Recorder {
    from: u64,
    end: u64,
    bin_ns: u64,
    rate_bps: f64,
    kmax: u64,
    np_ns: u64,
    starts: Vec<u64>,
    stops: Vec<Option<u64>>,
    cur: Vec<FlowBin>,
    /// Closed bins, per flow: `bins[flow][k]`.
    pub bins: Vec<Vec<FlowBin>>,
    /// Closed bins of the bottleneck queue.
    pub qbins: Vec<QueueBin>,
    /// End instant (ns) of each closed bin.
    pub bin_ends: Vec<u64>,
    /// RC of every flow at each `Scenario::rc_sample_us` instant: (ns, bit/s per flow).
    pub rc_samples: Vec<(u64, Vec<f64>)>,
    /// At the same instants: every flow's RT (bit/s) and α, when its controller has them.
    pub rp_samples: Vec<Vec<(Option<u64>, Option<f64>)>>,
    /// Arrival instants (ns) at the sender of every CNP, per flow.
    pub cnp_times: Vec<Vec<u64>>,
    /// Instants (ns) the receiver's NIC put each CNP on its link, per flow.
    pub cnp_sent_times: Vec<Vec<u64>>,
    /// Arrival instants (ns) at the receiver of every CE-marked data packet, per flow.
    pub ce_times: Vec<Vec<u64>>,
    last_bin_end: u64,
    // queue
    q: u64,
    q_since: u64,
    q_bin_int: f64,
    q_bin_max: u64,
    q_win_int: f64,
    q_win_above_kmax: u64,
    q_win_max: u64,
    /// ns spent at each occupancy in 512-byte steps (index = bytes / 512), inside the window.
    q_hist: Vec<u64>,
    // per flow, in the window
    win_bytes: Vec<u64>,
    win_cnps: Vec<u64>,
    all_cnps: Vec<u64>,
    last_cnp: Vec<Option<u64>>,
    last_cnp_sent: Vec<Option<u64>>,
    /// Smallest gap between two CNPs the NP sent for one flow, ns (whole run).
    pub min_cnp_sent_gap_ns: Option<u64>,
    /// Smallest gap between two CNPs of one flow, ns (whole run).
    pub min_cnp_gap_ns: Option<u64>,
    win_marks: u64,
    win_ect: u64,
    win_drops: u64,
    /// Marks and ECT frames over the whole run.
    pub marks: u64,
    /// Drops over the whole run.
    pub drops: u64,
    finished: bool,
}

const Q_STEP: u64 = 512;

impl Recorder {
    /// A recorder for `sc` measuring in [`from`, `end`) ns with bins of `bin_ns`.
    pub fn new(sc: &Scenario, from: u64, end: u64, bin_ns: u64) -> Recorder {
        let n = sc.flows.len();
        Recorder {
            from,
            end,
            bin_ns,
            rate_bps: sc.link.rate_gbps * 1e9,
            kmax: sc.switch.kmax_bytes,
            np_ns: (sc.cc.np_interval_us * 1000.0).round() as u64,
            starts: sc.flows.iter().map(|f| (f.start_ms * 1e6) as u64).collect(),
            stops: sc
                .flows
                .iter()
                .map(|f| f.stop_ms.map(|s| (s * 1e6) as u64))
                .collect(),
            cur: vec![FlowBin::default(); n],
            bins: vec![Vec::new(); n],
            qbins: Vec::new(),
            bin_ends: Vec::new(),
            rc_samples: Vec::new(),
            rp_samples: Vec::new(),
            cnp_times: vec![Vec::new(); n],
            cnp_sent_times: vec![Vec::new(); n],
            ce_times: vec![Vec::new(); n],
            last_bin_end: 0,
            q: 0,
            q_since: 0,
            q_bin_int: 0.0,
            q_bin_max: 0,
            q_win_int: 0.0,
            q_win_above_kmax: 0,
            q_win_max: 0,
            q_hist: Vec::new(),
            win_bytes: vec![0; n],
            win_cnps: vec![0; n],
            all_cnps: vec![0; n],
            last_cnp: vec![None; n],
            last_cnp_sent: vec![None; n],
            min_cnp_sent_gap_ns: None,
            min_cnp_gap_ns: None,
            win_marks: 0,
            win_ect: 0,
            win_drops: 0,
            marks: 0,
            drops: 0,
            finished: false,
        }
    }

    fn in_win(&self, now: u64) -> bool {
        now >= self.from && now < self.end
    }

    /// Integrates the queue from its last change up to `now`.
    fn advance_q(&mut self, now: u64) {
        if now <= self.q_since {
            return;
        }
        let dt = now - self.q_since;
        self.q_bin_int += dt as f64 * self.q as f64;
        let w0 = self.q_since.max(self.from);
        let w1 = now.min(self.end);
        if w1 > w0 {
            let wdt = w1 - w0;
            self.q_win_int += wdt as f64 * self.q as f64;
            if self.q > self.kmax {
                self.q_win_above_kmax += wdt;
            }
            let k = (self.q / Q_STEP) as usize;
            if self.q_hist.len() <= k {
                self.q_hist.resize(k + 1, 0);
            }
            self.q_hist[k] += wdt;
        }
        self.q_since = now;
    }

    /// The bottleneck data queue changed to `bytes` at `now`.
    pub fn on_queue(&mut self, now: u64, bytes: u64) {
        self.advance_q(now);
        self.q = bytes;
        self.q_bin_max = self.q_bin_max.max(bytes);
        if self.in_win(now) {
            self.q_win_max = self.q_win_max.max(bytes);
        }
    }

    /// A data frame of flow `f` (`wire` bytes, CE-marked or not) reached the receiver.
    pub fn on_data(&mut self, now: u64, f: usize, wire: u64, ce: bool) {
        self.cur[f].bytes += wire;
        self.cur[f].marks += u32::from(ce);
        if ce {
            self.ce_times[f].push(now);
        }
        if self.in_win(now) {
            self.win_bytes[f] += wire;
        }
    }

    /// A CNP for flow `f` reached its sender.
    pub fn on_cnp(&mut self, now: u64, f: usize) {
        self.cur[f].cnps += 1;
        self.all_cnps[f] += 1;
        self.cnp_times[f].push(now);
        if self.in_win(now) {
            self.win_cnps[f] += 1;
        }
        if let Some(l) = self.last_cnp[f] {
            let gap = now - l;
            self.min_cnp_gap_ns = Some(self.min_cnp_gap_ns.map_or(gap, |m| m.min(gap)));
        }
        self.last_cnp[f] = Some(now);
    }

    /// The NP (receiver) put a CNP for flow `f` on its link.
    pub fn on_cnp_sent(&mut self, now: u64, f: usize) {
        self.cnp_sent_times[f].push(now);
        if let Some(l) = self.last_cnp_sent[f] {
            let gap = now - l;
            self.min_cnp_sent_gap_ns = Some(self.min_cnp_sent_gap_ns.map_or(gap, |m| m.min(gap)));
        }
        self.last_cnp_sent[f] = Some(now);
    }

    /// The switch marked CE.
    pub fn on_mark(&mut self, now: u64) {
        self.marks += 1;
        if self.in_win(now) {
            self.win_marks += 1;
        }
    }

    /// An ECN-capable data frame went through a marking decision.
    pub fn on_ect(&mut self, now: u64) {
        if self.in_win(now) {
            self.win_ect += 1;
        }
    }

    /// The switch dropped a frame.
    pub fn on_drop(&mut self, now: u64) {
        self.drops += 1;
        if self.in_win(now) {
            self.win_drops += 1;
        }
    }

    /// Closes the bin ending at `now`; `q` is the queue now, `rc` every flow's RC.
    pub fn close_bin(&mut self, now: u64, q: u64, rc: &[f64]) {
        if now <= self.last_bin_end {
            return;
        }
        self.advance_q(now);
        let dt = (now - self.last_bin_end) as f64;
        self.qbins.push(QueueBin {
            mean: self.q_bin_int / dt,
            max: self.q_bin_max,
        });
        self.q_bin_int = 0.0;
        self.q_bin_max = q;
        for (f, b) in self.cur.iter_mut().enumerate() {
            b.rc_bps = rc[f];
            self.bins[f].push(*b);
            *b = FlowBin::default();
        }
        self.bin_ends.push(now);
        self.last_bin_end = now;
    }

    /// Final integration at the end of the run.
    pub fn finish(&mut self, end: u64) {
        if !self.finished {
            self.advance_q(end);
            self.finished = true;
        }
    }

    /// The queue depth (bytes) below which fraction `p` of the time was spent: the upper edge of the histogram
    /// bucket that reaches `p`, but never above the largest depth seen (a bucket's edge can exceed it: `rocev2 sim`
    /// printed a p99 above the max).
    fn percentile(&self, p: f64) -> f64 {
        let total: u64 = self.q_hist.iter().sum();
        if total == 0 {
            return 0.0;
        }
        let want = (p * total as f64).ceil() as u64;
        let mut acc = 0;
        let mut edge = (self.q_hist.len() as u64 * Q_STEP) as f64;
        for (k, &t) in self.q_hist.iter().enumerate() {
            acc += t;
            if acc >= want {
                edge = ((k as u64 + 1) * Q_STEP) as f64;
                break;
            }
        }
        edge.min(self.q_win_max as f64)
    }

    /// Flows active (started, not stopped) for the whole of bin `k`.
    fn active_in_bin(&self, k: usize) -> Vec<usize> {
        let t1 = self.bin_ends[k];
        let t0 = if k == 0 { 0 } else { self.bin_ends[k - 1] };
        (0..self.starts.len())
            .filter(|&f| self.starts[f] <= t0 && self.stops[f].is_none_or(|s| s >= t1))
            .collect()
    }

    /// Per-bin Jain index over the flows active in the bin (1 for fewer than two).
    pub fn bin_jain(&self, k: usize) -> f64 {
        let dt = (self.bin_ends[k] - if k == 0 { 0 } else { self.bin_ends[k - 1] }) as f64;
        let xs: Vec<f64> = self
            .active_in_bin(k)
            .iter()
            .map(|&f| self.bins[f][k].bytes as f64 / dt)
            .collect();
        jain(&xs)
    }

    /// The summary of the run.
    pub fn summary(&self, sc: &Scenario) -> Summary {
        let win_s = (self.end - self.from) as f64 / 1e9;
        let mtu = f64::from(sc.host.mtu);
        // Full data packet: Eth 14 + IPv4 20 + UDP 8 + BTH 12 + payload + ICRC 4 (+ wire overhead).
        let wire_pkt = 14.0 + 20.0 + 8.0 + 12.0 + mtu + 4.0 + f64::from(sc.link.overhead_bytes);
        let flows: Vec<FlowSummary> = (0..self.win_bytes.len())
            .map(|f| {
                let gbps = self.win_bytes[f] as f64 * 8.0 / win_s / 1e9;
                FlowSummary {
                    flow: f,
                    sender: sc.flows[f].sender,
                    throughput_gbps: gbps,
                    goodput_gbps: gbps * mtu / wire_pkt,
                    cnps: self.all_cnps[f],
                    cnps_per_ms: self.win_cnps[f] as f64 / (win_s * 1e3),
                }
            })
            .collect();
        let tputs: Vec<f64> = flows.iter().map(|f| f.throughput_gbps).collect();
        let total: f64 = tputs.iter().sum();
        let win_bins: Vec<usize> = (0..self.bin_ends.len())
            .filter(|&k| k > 0 && self.bin_ends[k - 1] >= self.from || k == 0 && self.from == 0)
            .collect();
        let mean_bin_jain = if win_bins.is_empty() {
            1.0
        } else {
            win_bins.iter().map(|&k| self.bin_jain(k)).sum::<f64>() / win_bins.len() as f64
        };
        let win_ns = (self.end - self.from) as f64;
        Summary {
            scenario: sc.name.clone(),
            measure_ms: [self.from as f64 / 1e6, self.end as f64 / 1e6],
            flows,
            jain: jain(&tputs),
            mean_bin_jain,
            utilisation: total * 1e9 / self.rate_bps,
            queue_mean_bytes: self.q_win_int / win_ns,
            queue_p50_bytes: self.percentile(0.50),
            queue_p95_bytes: self.percentile(0.95),
            queue_p99_bytes: self.percentile(0.99),
            queue_max_bytes: self.q_win_max,
            above_kmax_fraction: self.q_win_above_kmax as f64 / win_ns,
            cnps: self.all_cnps.iter().sum(),
            cnps_per_ms_per_flow: if self.win_cnps.is_empty() {
                0.0
            } else {
                self.win_cnps.iter().sum::<u64>() as f64
                    / (win_s * 1e3)
                    / self.win_cnps.len() as f64
            },
            min_cnp_gap_us: self.min_cnp_gap_ns.map(|g| g as f64 / 1e3),
            min_cnp_sent_gap_us: self.min_cnp_sent_gap_ns.map(|g| g as f64 / 1e3),
            np_interval_us: self.np_ns as f64 / 1e3,
            marks: self.win_marks,
            ect_frames: self.win_ect,
            mark_fraction: if self.win_ect == 0 {
                0.0
            } else {
                self.win_marks as f64 / self.win_ect as f64
            },
            drops: self.win_drops,
            converge_ms: self.converge_ms(),
        }
    }

    /// Time from the last flow start until the per-bin Jain index has been ≥ 0.95 for 5 consecutive bins (`DCQCN.md`
    /// §6 E4), ms; `None` if never.
    pub fn converge_ms(&self) -> Option<f64> {
        let last = *self.starts.iter().max()?;
        let mut run = 0;
        for k in 0..self.bin_ends.len() {
            let t0 = if k == 0 { 0 } else { self.bin_ends[k - 1] };
            if t0 < last {
                continue;
            }
            if self.bin_jain(k) >= 0.95 {
                run += 1;
                if run == 5 {
                    let first =
                        self.bin_ends[k + 1 - 5] - self.bin_ns.min(self.bin_ends[k + 1 - 5]);
                    return Some(first.saturating_sub(last) as f64 / 1e6);
                }
            } else {
                run = 0;
            }
        }
        None
    }

    /// The time series as CSV: one row per bin and flow (`t_ms,flow,rate_gbps,rc_gbps,cnps,marks`), and one per bin
    /// for the queue (`t_ms,queue_mean_bytes,queue_max_bytes`). Fixed formatting: byte-identical for equal runs.
    pub fn csv(&self) -> (String, String) {
        let mut flows = String::from("t_ms,flow,rate_gbps,rc_gbps,cnps,marks\n");
        let mut queue = String::from("t_ms,queue_mean_bytes,queue_max_bytes\n");
        for (k, &t) in self.bin_ends.iter().enumerate() {
            let dt = (t - if k == 0 { 0 } else { self.bin_ends[k - 1] }) as f64;
            for (f, b) in self.bins.iter().enumerate() {
                let b = b[k];
                let _ = writeln!(
                    flows,
                    "{:.3},{f},{:.4},{:.4},{},{}",
                    t as f64 / 1e6,
                    b.bytes as f64 * 8.0 / dt,
                    b.rc_bps / 1e9,
                    b.cnps,
                    b.marks
                );
            }
            let q = self.qbins[k];
            let _ = writeln!(queue, "{:.3},{:.1},{}", t as f64 / 1e6, q.mean, q.max);
        }
        (flows, queue)
    }
}

/// Jain's fairness index (Σx)² / (n·Σx²); 1 for fewer than two values or all zero.
pub fn jain(xs: &[f64]) -> f64 {
    if xs.len() < 2 {
        return 1.0;
    }
    let s: f64 = xs.iter().sum();
    let s2: f64 = xs.iter().map(|x| x * x).sum();
    if s2 == 0.0 {
        1.0
    } else {
        s * s / (xs.len() as f64 * s2)
    }
}

/// One flow's result in the measurement window.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct FlowSummary {
    /// Flow index (scenario order).
    pub flow: usize,
    /// Sender host.
    pub sender: usize,
    /// Wire throughput at the receiver, Gb/s.
    pub throughput_gbps: f64,
    /// Payload throughput (full packets), Gb/s.
    pub goodput_gbps: f64,
    /// CNPs that reached the sender, whole run.
    pub cnps: u64,
    /// CNPs per ms in the window.
    pub cnps_per_ms: f64,
}

/// The result of a run (`rocev2 sim --json`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Summary {
    /// Scenario name.
    pub scenario: String,
    /// Measurement window, ms.
    pub measure_ms: [f64; 2],
    /// Per flow.
    pub flows: Vec<FlowSummary>,
    /// Jain index of the flows' mean throughputs.
    pub jain: f64,
    /// Mean over the window's bins of the per-bin Jain index (flows active for the whole bin).
    pub mean_bin_jain: f64,
    /// Σ throughput / line rate.
    pub utilisation: f64,
    /// Bottleneck queue, time-weighted, bytes.
    pub queue_mean_bytes: f64,
    /// Percentiles (512-byte resolution, upper bucket edge), bytes.
    pub queue_p50_bytes: f64,
    /// 95th percentile.
    pub queue_p95_bytes: f64,
    /// 99th percentile.
    pub queue_p99_bytes: f64,
    /// Largest occupancy in the window, bytes.
    pub queue_max_bytes: u64,
    /// Fraction of the window with the queue above Kmax.
    pub above_kmax_fraction: f64,
    /// CNPs over the whole run, all flows.
    pub cnps: u64,
    /// CNPs per ms per flow in the window.
    pub cnps_per_ms_per_flow: f64,
    /// Smallest gap between two CNPs of one flow at the sender (after the switch), µs.
    pub min_cnp_gap_us: Option<f64>,
    /// Smallest gap between two CNPs of one flow as the NP sent them, µs.
    pub min_cnp_sent_gap_us: Option<f64>,
    /// The NP window N, µs.
    pub np_interval_us: f64,
    /// CE marks in the window.
    pub marks: u64,
    /// ECN-capable data frames that met a marking decision in the window.
    pub ect_frames: u64,
    /// marks / ect_frames.
    pub mark_fraction: f64,
    /// Tail drops in the window.
    pub drops: u64,
    /// Convergence time after the last flow start (per-bin Jain ≥ 0.95 for 5 bins), ms.
    pub converge_ms: Option<f64>,
}

impl Summary {
    /// The summary table for a terminal.
    pub fn table(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "scenario {}  window {:.1}..{:.1} ms",
            self.scenario, self.measure_ms[0], self.measure_ms[1]
        );
        let _ = writeln!(s, "flow sender  tput Gb/s  goodput Gb/s   CNPs  CNP/ms");
        for f in &self.flows {
            let _ = writeln!(
                s,
                "{:>4} {:>6} {:>10.3} {:>13.3} {:>6} {:>7.2}",
                f.flow, f.sender, f.throughput_gbps, f.goodput_gbps, f.cnps, f.cnps_per_ms
            );
        }
        let _ = writeln!(
            s,
            "jain {:.4}  mean per-bin jain {:.4}  utilisation {:.2} %",
            self.jain,
            self.mean_bin_jain,
            self.utilisation * 100.0
        );
        let _ = writeln!(
            s,
            "queue mean {:.1} KB  p50 {:.1} KB  p95 {:.1} KB  p99 {:.1} KB  max {:.1} KB  above Kmax {:.2} %",
            self.queue_mean_bytes / 1e3,
            self.queue_p50_bytes / 1e3,
            self.queue_p95_bytes / 1e3,
            self.queue_p99_bytes / 1e3,
            self.queue_max_bytes as f64 / 1e3,
            self.above_kmax_fraction * 100.0
        );
        let _ = writeln!(
            s,
            "CNPs {} ({:.2}/ms/flow, min gap sent {} / received {})  marks {} of {} ECT ({:.3} %)  drops {}  converge {}",
            self.cnps,
            self.cnps_per_ms_per_flow,
            self.min_cnp_sent_gap_us
                .map_or("-".into(), |g| format!("{g:.3} µs")),
            self.min_cnp_gap_us
                .map_or("-".into(), |g| format!("{g:.3} µs")),
            self.marks,
            self.ect_frames,
            self.mark_fraction * 100.0,
            self.drops,
            self.converge_ms
                .map_or("-".into(), |c| format!("{c:.1} ms"))
        );
        s
    }
}
