//! Results of `rocev2 perf` runs and their output: perftest-style tables and `--json` objects.
//!
//! Units follow perftest: `MB/sec` is 2^20 bytes per second, `--report_gbits` gives 10^9 bits per second,
//! `MsgRate` is 10^6 messages per second, latencies are microseconds. `t_typical` is the median. `#iterations` is
//! the number of completed messages summed over all QPs (with `-q N`, `N · -n`); bandwidth and message rate are
//! computed from it. Latency tests report half the round trip for SEND/WRITE ping-pongs and the full round trip
//! for READ and atomics, as perftest does.

use std::time::Duration;

use hdrhistogram::Histogram;
use serde_json::{Value, json};

const LINE: &str =
    "---------------------------------------------------------------------------------------";

/// One bandwidth result line.
#[derive(Clone, Debug, PartialEq)]
pub struct BwResult {
    /// Message size in bytes.
    pub size: u64,
    /// Completed messages (all QPs).
    pub iterations: u64,
    /// Elapsed time from the first post to the last completion.
    pub elapsed: Duration,
    /// Peak bandwidth in bytes per second (best of the run's sampled windows).
    pub peak_bps: f64,
}

impl BwResult {
    /// Average bandwidth in bytes per second.
    pub fn avg_bytes_per_sec(&self) -> f64 {
        let s = self.elapsed.as_secs_f64();
        if s > 0.0 {
            (self.size * self.iterations) as f64 / s
        } else {
            0.0
        }
    }

    /// Message rate in Mpps.
    pub fn msg_rate_mpps(&self) -> f64 {
        let s = self.elapsed.as_secs_f64();
        if s > 0.0 {
            self.iterations as f64 / s / 1e6
        } else {
            0.0
        }
    }
}

/// Latency statistics of one size, in nanoseconds.
#[derive(Debug)]
pub struct LatStats {
    hist: Histogram<u64>,
    sum: f64,
    sum_sq: f64,
    min: u64,
    max: u64,
    n: u64,
}

impl LatStats {
    /// Empty statistics (values up to 100 s, 3 significant digits).
    pub fn new() -> LatStats {
        LatStats {
            // Constant bounds that hdrhistogram accepts (1 ns .. 100 s, 3 significant digits).
            hist: Histogram::new_with_bounds(1, 100_000_000_000, 3)
                .expect("constant histogram bounds"),
            sum: 0.0,
            sum_sq: 0.0,
            min: u64::MAX,
            max: 0,
            n: 0,
        }
    }

    /// Records one sample.
    pub fn record(&mut self, ns: u64) {
        let ns = ns.max(1);
        let _ = self.hist.record(ns.min(100_000_000_000));
        self.sum += ns as f64;
        self.sum_sq += (ns as f64) * (ns as f64);
        self.min = self.min.min(ns);
        self.max = self.max.max(ns);
        self.n += 1;
    }

    /// Samples recorded.
    pub fn count(&self) -> u64 {
        self.n
    }

    fn us(ns: f64) -> f64 {
        ns / 1000.0
    }

    /// `(t_min, t_max, t_typical, t_avg, t_stdev, p99, p99.9)` in µs.
    pub fn summary(&self) -> [f64; 7] {
        if self.n == 0 {
            return [0.0; 7];
        }
        let n = self.n as f64;
        let avg = self.sum / n;
        // A bucket's value is its highest equivalent value, which may lie past the largest sample; perftest's
        // quantiles come from the sorted samples themselves, so they never leave [t_min, t_max].
        let q = |p: f64| self.hist.value_at_quantile(p).clamp(self.min, self.max) as f64;
        let var = (self.sum_sq / n - avg * avg).max(0.0);
        [
            Self::us(self.min as f64),
            Self::us(self.max as f64),
            Self::us(q(0.5)),
            Self::us(avg),
            Self::us(var.sqrt()),
            Self::us(q(0.99)),
            Self::us(q(0.999)),
        ]
    }
}

/// Header of the result table.
pub fn bw_header(gbits: bool) -> String {
    let unit = if gbits { "Gb/sec" } else { "MB/sec" };
    format!(
        "{LINE}\n #bytes     #iterations    BW peak[{unit}]    BW average[{unit}]   MsgRate[Mpps]"
    )
}

fn bw_unit(bytes_per_sec: f64, gbits: bool) -> f64 {
    if gbits {
        bytes_per_sec * 8.0 / 1e9
    } else {
        bytes_per_sec / (1 << 20) as f64
    }
}

/// The reported figures of a bandwidth result: peak and average in bytes per second, message rate in Mpps.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Figures {
    peak_bps: f64,
    avg_bps: f64,
    mpps: f64,
}

impl BwResult {
    fn figures(&self) -> Figures {
        Figures {
            peak_bps: self.peak_bps,
            avg_bps: self.avg_bytes_per_sec(),
            mpps: self.msg_rate_mpps(),
        }
    }

    /// The result as the peer needs it for a `-b` sum: `{size, iterations, elapsed_s, peak_bps}`.
    pub fn to_json(&self) -> Value {
        json!({
            "size": self.size,
            "iterations": self.iterations,
            "elapsed_s": self.elapsed.as_secs_f64(),
            "peak_bps": self.peak_bps,
        })
    }

    /// The inverse of [`BwResult::to_json`]; `None` for a missing or bad field (a peer's message).
    pub fn from_json(v: &Value) -> Option<BwResult> {
        Some(BwResult {
            size: v.get("size")?.as_u64()?,
            iterations: v.get("iterations")?.as_u64()?,
            elapsed: v
                .get("elapsed_s")?
                .as_f64()
                .and_then(|s| Duration::try_from_secs_f64(s).ok())?,
            peak_bps: v.get("peak_bps")?.as_f64().filter(|x| x.is_finite())?,
        })
    }
}

/// Both directions of a `-b` run added up, as perftest's bidirectional report (its `print_full_bw_report` adds the
/// peer's peak, average and message rate to this side's).
fn sum(own: &BwResult, peer: &BwResult) -> Figures {
    let (a, b) = (own.figures(), peer.figures());
    Figures {
        peak_bps: a.peak_bps + b.peak_bps,
        avg_bps: a.avg_bps + b.avg_bps,
        mpps: a.mpps + b.mpps,
    }
}

/// One table line, in perftest's column layout (its `REPORT_FMT`: left-aligned fields of 7 and 10 characters with
/// the same gaps, so the values sit under the header's words); with `--report_gbits` an average below 0.1 Gb/s gets
/// six decimals, as perftest's `REPORT_FMT_EXT`.
pub fn bw_line(r: &BwResult, gbits: bool) -> String {
    line_of(r.size, r.iterations, r.figures(), gbits)
}

/// The table line of a `-b` run: this side's size and iterations, both directions' figures summed.
pub fn bw_line_sum(own: &BwResult, peer: &BwResult, gbits: bool) -> String {
    line_of(own.size, own.iterations, sum(own, peer), gbits)
}

fn line_of(size: u64, iterations: u64, f: Figures, gbits: bool) -> String {
    let (peak, avg) = (bw_unit(f.peak_bps, gbits), bw_unit(f.avg_bps, gbits));
    if gbits && avg < 0.1 {
        format!(
            " {size:<7}    {iterations}           {peak:<7.6}            {avg:<7.6}            {:<7.6}",
            f.mpps
        )
    } else {
        format!(
            " {size:<7}    {iterations:<10}       {peak:<7.2}            {avg:<7.2}\t\t     {:<7.6}",
            f.mpps
        )
    }
}

/// Closing line of a table.
pub fn footer() -> &'static str {
    LINE
}

/// The `--json` object of a bandwidth result.
pub fn bw_json(test: &str, conn: &str, r: &BwResult, verified: Option<bool>) -> Value {
    json_of(test, conn, r, r.figures(), verified)
}

/// The `--json` object of a `-b` run: both directions' figures summed (as the table line), `bidirectional`
/// true, and the peer's own iteration count as `peer_iterations`.
pub fn bw_json_sum(
    test: &str,
    conn: &str,
    own: &BwResult,
    peer: &BwResult,
    verified: Option<bool>,
) -> Value {
    let mut j = json_of(test, conn, own, sum(own, peer), verified);
    j["bidirectional"] = json!(true);
    j["peer_iterations"] = json!(peer.iterations);
    j
}

fn json_of(test: &str, conn: &str, r: &BwResult, f: Figures, verified: Option<bool>) -> Value {
    json!({
        "test": test,
        "connection": conn,
        "size": r.size,
        "iterations": r.iterations,
        "elapsed_s": r.elapsed.as_secs_f64(),
        "bw_peak_gbps": bw_unit(f.peak_bps, true),
        "bw_avg_gbps": bw_unit(f.avg_bps, true),
        "bw_peak_mbps": bw_unit(f.peak_bps, false),
        "bw_avg_mbps": bw_unit(f.avg_bps, false),
        "msg_rate_mpps": f.mpps,
        "verified": verified,
    })
}

/// Header of the latency table.
pub fn lat_header() -> String {
    format!(
        "{LINE}\n #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] "
    )
}

/// One latency table line, in perftest's column layout: each value starts where perftest's `REPORT_FMT_LAT` puts a
/// small one (columns 1, 9, 23, 38, 51, 71, 88, 104, 128, under the header's), in fixed-width fields with spaces
/// instead of its tabs and `%-7.2f`, so the columns hold for 10,000 µs and more (a latency column is 12 .. 23
/// characters wide; a value wider than that is still followed by a space).
pub fn lat_line(size: u64, s: &LatStats) -> String {
    let [min, max, typ, avg, sd, p99, p999] = s.summary();
    format!(
        " {size:<7} {:<13} {min:<14.2} {max:<12.2} {typ:<19.2} {avg:<16.2} {sd:<15.2} {p99:<23.2} {p999:<7.2}",
        s.count(),
    )
}

/// The `--json` object of a latency result.
pub fn lat_json(test: &str, conn: &str, size: u64, s: &LatStats, verified: Option<bool>) -> Value {
    let [min, max, typ, avg, sd, p99, p999] = s.summary();
    json!({
        "test": test,
        "connection": conn,
        "size": size,
        "iterations": s.count(),
        "t_min_us": min,
        "t_max_us": max,
        "t_typical_us": typ,
        "t_avg_us": avg,
        "t_stdev_us": sd,
        "p99_us": p99,
        "p999_us": p999,
        "verified": verified,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// perftest takes t_typical and the percentiles from the sorted samples, so they lie within [t_min, t_max];
    /// hdrhistogram's bucket values are the bucket's highest equivalent value, which can exceed the largest sample.
    #[test]
    fn quantiles_lie_within_min_and_max() {
        let mut l = LatStats::new();
        for ns in [
            34_050, 35_000, 36_000, 38_810, 39_000, 40_000, 41_000, 42_000, 43_000, 222_000,
        ] {
            l.record(ns);
        }
        let [min, max, typ, _, _, p99, p999] = l.summary();
        for q in [typ, p99, p999] {
            assert!((min..=max).contains(&q), "{q} outside [{min}, {max}]");
        }
        assert_eq!((p99, p999), (max, max));
    }

    #[test]
    fn bw_units() {
        let r = BwResult {
            size: 1 << 20,
            iterations: 1000,
            elapsed: Duration::from_secs(1),
            peak_bps: 2.0 * (1u64 << 30) as f64,
        };
        assert_eq!(bw_unit(r.avg_bytes_per_sec(), false), 1000.0);
        assert!((bw_unit(r.avg_bytes_per_sec(), true) - 8.388608).abs() < 1e-9);
        assert!((r.msg_rate_mpps() - 0.001).abs() < 1e-12);
        let line = bw_line(&r, false);
        assert!(
            line.contains("2048.00") && line.contains("1000.00"),
            "{line}"
        );
    }

    #[test]
    fn lines_have_perftest_layout() {
        // The strings perftest prints for these values (its REPORT_FMT / REPORT_FMT_EXT / REPORT_FMT_LAT, checked
        // with C-style printf).
        let r = BwResult {
            size: 65536,
            iterations: 5000,
            elapsed: Duration::from_secs(1),
            peak_bps: 1234.5678 * (1 << 20) as f64,
        };
        assert_eq!(
            bw_line(&r, false),
            " 65536      5000             1234.57            312.50 \t\t     0.005000"
        );
        let slow = BwResult {
            size: 2,
            iterations: 5,
            elapsed: Duration::from_secs(1),
            peak_bps: 10.0,
        };
        assert_eq!(
            bw_line(&slow, true),
            " 2          5           0.000000            0.000000            0.000005"
        );
        let mut s = LatStats::new();
        for v in [1000u64, 2000, 3000] {
            s.record(v);
        }
        assert_eq!(
            lat_line(2, &s),
            " 2       3             1.00           3.00         2.00                2.00             0.82            3.00                    3.00   "
        );
    }

    /// Where each value of a latency line starts once tabs are expanded (8 columns), and the tokens.
    fn value_columns(line: &str) -> Vec<(usize, String)> {
        let mut expanded = String::new();
        for ch in line.chars() {
            if ch == '\t' {
                expanded.push(' ');
                while !expanded.len().is_multiple_of(8) {
                    expanded.push(' ');
                }
            } else {
                expanded.push(ch);
            }
        }
        let mut out = Vec::new();
        let mut start = None;
        for (i, ch) in expanded.char_indices().chain([(expanded.len(), ' ')]) {
            match (ch == ' ', start) {
                (false, None) => start = Some(i),
                (true, Some(s)) => {
                    out.push((s, expanded[s..i].to_owned()));
                    start = None;
                }
                _ => {}
            }
        }
        out
    }

    /// The columns of the latency table hold for any value: perftest's positions for small values (its
    /// REPORT_FMT_LAT: 1, 9, 23, 38, 51, 71, 88, 104, 128), and the same positions at ≥ 10,000 µs, where perftest's
    /// `%-7.2f` fields (and our copy of them) overflowed and pushed every later column right.
    #[test]
    fn latency_columns_hold_for_large_values() {
        let want = [1, 9, 23, 38, 51, 71, 88, 104, 128];
        for (size, iters, base_ns) in [
            (2u64, 1000u64, 1_000u64),
            (8_388_608, 1000, 10_000_000),
            (65536, 100_000, 123_456_789),
        ] {
            let mut s = LatStats::new();
            for i in 0..iters {
                s.record(base_ns + (i % 97) * base_ns / 10);
            }
            let line = lat_line(size, &s);
            let cols = value_columns(&line);
            let starts: Vec<usize> = cols.iter().map(|c| c.0).collect();
            assert_eq!(starts, want, "{line:?}: {cols:?}");
            assert_eq!(cols[0].1, size.to_string());
            assert_eq!(cols[1].1, iters.to_string());
        }
        let header: Vec<usize> = value_columns(lat_header().lines().nth(1).unwrap_or_default())
            .iter()
            .map(|c| c.0)
            .collect();
        assert!(header.len() >= 9, "{header:?}");
    }

    #[test]
    fn latency_summary() {
        let mut s = LatStats::new();
        for v in 1..=1000u64 {
            s.record(v * 1000);
        }
        let [min, max, typ, avg, _sd, p99, p999] = s.summary();
        assert_eq!(min, 1.0);
        assert_eq!(max, 1000.0);
        assert!((typ - 500.0).abs() < 1.0, "{typ}");
        assert!((avg - 500.5).abs() < 1e-9);
        assert!((p99 - 990.0).abs() < 1.0, "{p99}");
        assert!((p999 - 999.0).abs() < 1.0, "{p999}");
    }
}
