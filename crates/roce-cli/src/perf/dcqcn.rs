//! The congestion-control flags of `rocev2 perf` (issue #12), all in one place:
//!
//! * `--dcqcn paper|ns3_mlx|nvidia|off`: the DCQCN reaction point of this side's QPs (`docs/spec/DCQCN.md`
//!   §2.3–§2.5; `roce_proto::cc::Dcqcn`). Its line rate C — the rate before any CNP and the cap of RC/RT — is the
//!   scheduler's port line rate (`SchedConfig::line_rate_bps`, 100 Gb/s) unless `--cc-set line_rate_bps=...`.
//! * `--cc-set NAME=VALUE` (repeatable): a reaction-point parameter by the profile's own name (the oracle's names for
//!   `paper`/`ns3_mlx`, the firmware's for `nvidia`; `rocev2 cc trace --profile P --list-params`), or a
//!   notification-point setting by its firmware name: `min_time_between_cnps` (µs; default 50 for paper, 0 for
//!   ns3_mlx, 4 for nvidia, 50 without `--dcqcn`), `cnp_dscp`, `cnp_802p_prio`. The notification point runs on every
//!   side, with or without `--dcqcn`.
//! * `--rate-log FILE.csv` (`--rate-log-us`, default 100): every QP's rate over time on this side (`--loopback`: the
//!   client's), columns `t_us,qpn,rate_bps,target_bps,alpha,limited,shaped_bps` — RC, RT and α of the reaction point,
//!   whether it is limiting, and the rate the QP's shaper enforces (RC capped by `--rate-limit`); empty = unlimited.
//! * `--ce-rx P`: mark ECN CE on received ECN-capable frames with probability P, as a congested switch queue in front
//!   of this side would (`DCQCN.md` §2.1); this side's notification point answers with CNPs. (`--ce` marks this
//!   side's transmitted frames instead.)

use std::io::{BufWriter, Write as _};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use clap::Args;
use roce_proto::EngineConfig;
use roce_proto::cc::{DcqcnConfig, NpParams, Profile};
use roce_verbs::Context;

/// The flags (see the module docs).
#[derive(Clone, Debug, Default, Args)]
pub struct DcqcnArgs {
    /// DCQCN reaction point of this side's QPs: paper, ns3_mlx or nvidia (docs/spec/DCQCN.md §2.3-§2.5), or off.
    #[arg(long = "dcqcn", value_name = "PROFILE", default_value = "off", value_parser = parse_profile)]
    pub dcqcn: DcqcnChoice,
    /// Set a DCQCN parameter by the profile's name (list: `rocev2 cc trace --profile P --list-params`), or a CNP
    /// setting: min_time_between_cnps (µs), cnp_dscp, cnp_802p_prio. Repeatable.
    #[arg(long = "cc-set", value_name = "NAME=VALUE")]
    pub cc_set: Vec<String>,
    /// Write every QP's rate (RC, RT, alpha, shaped rate) of this side to this CSV file while the test runs.
    #[arg(long = "rate-log", value_name = "FILE.csv")]
    pub rate_log: Option<PathBuf>,
    /// Sampling period of --rate-log in µs.
    #[arg(long = "rate-log-us", value_name = "US", default_value_t = 100)]
    pub rate_log_us: u64,
    /// Mark ECN CE on received ECN-capable frames with this probability (a congested switch in front of this side).
    #[arg(long = "ce-rx", value_name = "P", default_value_t = 0.0)]
    pub ce_rx: f64,
}

/// `--dcqcn`: a profile, or `off` (`None`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DcqcnChoice(pub Option<Profile>);

fn parse_profile(s: &str) -> Result<DcqcnChoice, String> {
    if s == "off" {
        return Ok(DcqcnChoice(None));
    }
    Profile::from_name(s)
        .map(|p| DcqcnChoice(Some(p)))
        .ok_or_else(|| format!("unknown DCQCN profile `{s}` (paper, ns3_mlx, nvidia, off)"))
}

/// Applies the flags to this side's engine configuration: the reaction point of new QPs and the notification
/// point's CNP window, DSCP and priority. `cfg.sched.line_rate_bps` is the default line rate of the reaction point.
///
/// # Errors
/// A malformed `NAME=VALUE`, an unknown name, a bad value, a reaction-point parameter without `--dcqcn`, `--ce-rx`
/// outside 0..=1, a `--rate-log-us` below 10.
pub fn apply(a: &DcqcnArgs, cfg: &mut EngineConfig) -> Result<(), String> {
    if !(0.0..=1.0).contains(&a.ce_rx) {
        return Err("--ce-rx must be a probability within 0..1".into());
    }
    if a.rate_log_us < 10 {
        return Err("--rate-log-us must be at least 10".into());
    }
    let interval = a.dcqcn.0.map_or(
        u64::try_from(cfg.cnp_interval.as_micros()).unwrap_or(u64::MAX),
        Profile::default_np_interval_us,
    );
    let mut np = NpParams::defaults(interval as f64);
    np.cnp_dscp = u64::from(cfg.cnp_dscp);
    np.cnp_802p_prio = u64::from(cfg.cnp_prio);
    let mut rp = a
        .dcqcn
        .0
        .map(|p| DcqcnConfig::new(p, cfg.sched.line_rate_bps as f64));
    for kv in &a.cc_set {
        let (k, v) = kv
            .split_once('=')
            .ok_or_else(|| format!("--cc-set {kv}: expected NAME=VALUE"))?;
        let (k, v) = (k.trim(), v.trim());
        if np.set(k, v).map_err(|e| format!("--cc-set: {e}"))? {
            continue;
        }
        match rp.as_mut() {
            Some(c) => c.set(k, v).map_err(|e| format!("--cc-set: {e}"))?,
            None => {
                return Err(format!(
                    "--cc-set {kv}: `{k}` is not a CNP setting (min_time_between_cnps, cnp_dscp, \
                     cnp_802p_prio); reaction-point parameters need --dcqcn paper|ns3_mlx|nvidia"
                ));
            }
        }
    }
    if np.cnp_dscp > 63 || np.cnp_802p_prio > 7 {
        return Err("--cc-set: cnp_dscp must be 0..=63 and cnp_802p_prio 0..=7".into());
    }
    cfg.cnp_interval = Duration::from_micros(np.min_time_between_cnps);
    cfg.cnp_dscp = np.cnp_dscp as u8;
    cfg.cnp_prio = np.cnp_802p_prio as u8;
    cfg.dcqcn = rp;
    Ok(())
}

/// Checks the flags before anything is opened (`sim`: `--loopback --link sim`, whose engines take no DCQCN
/// configuration).
///
/// # Errors
/// As [`apply`]; `--dcqcn`/`--cc-set` on the simulated link.
pub fn validate(a: &DcqcnArgs, sim: bool) -> Result<(), String> {
    apply(a, &mut EngineConfig::default())?;
    if sim && (a.dcqcn.0.is_some() || !a.cc_set.is_empty()) {
        return Err("--dcqcn and --cc-set apply to the UDP link (not --link sim)".into());
    }
    Ok(())
}

/// Runs `f` (this side's test) with `--rate-log` sampling `ctx` meanwhile, when the flag is given and `enabled`
/// (with `--loopback` only the client logs). The log's own error, if any, is reported after `f`'s.
///
/// # Errors
/// `f`'s error, else the log's.
pub fn with_rate_log<R>(
    a: &DcqcnArgs,
    ctx: &Context,
    enabled: bool,
    f: impl FnOnce() -> Result<R, String>,
) -> Result<R, String> {
    let log = match (&a.rate_log, enabled) {
        (Some(p), true) => Some(RateLog::start(
            p,
            ctx.clone(),
            Duration::from_micros(a.rate_log_us),
        )?),
        _ => None,
    };
    let r = f();
    let l = log.map(RateLog::finish).transpose();
    let v = r?;
    l?;
    Ok(v)
}

/// A thread that samples this side's QP rates into a CSV file until [`RateLog::finish`].
pub struct RateLog {
    stop: Arc<AtomicBool>,
    join: Option<JoinHandle<Result<u64, String>>>,
    path: PathBuf,
}

impl RateLog {
    /// Creates `path` and starts sampling `ctx` every `period`.
    ///
    /// # Errors
    /// The file cannot be created, or the thread not spawned.
    pub fn start(path: &Path, ctx: Context, period: Duration) -> Result<RateLog, String> {
        let file = std::fs::File::create(path)
            .map_err(|e| format!("--rate-log {}: {e}", path.display()))?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let join = std::thread::Builder::new()
            .name("rate-log".into())
            .spawn(move || sample_loop(&ctx, BufWriter::new(file), period, &flag))
            .map_err(|e| format!("--rate-log: {e}"))?;
        Ok(RateLog {
            stop,
            join: Some(join),
            path: path.to_owned(),
        })
    }

    /// Takes a last sample, closes the file and returns the number of rows written.
    ///
    /// # Errors
    /// Writing failed, or the engine stopped answering.
    pub fn finish(mut self) -> Result<u64, String> {
        self.stop.store(true, Ordering::Release);
        let r = match self.join.take().map(JoinHandle::join) {
            Some(Ok(r)) => r,
            Some(Err(_)) => Err("the rate-log thread panicked".into()),
            None => Ok(0),
        };
        r.map_err(|e| format!("--rate-log {}: {e}", self.path.display()))
    }
}

impl Drop for RateLog {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(j) = self.join.take() {
            let _ = j.join();
        }
    }
}

fn sample_loop(
    ctx: &Context,
    mut out: BufWriter<std::fs::File>,
    period: Duration,
    stop: &AtomicBool,
) -> Result<u64, String> {
    let io = |e: std::io::Error| e.to_string();
    writeln!(out, "t_us,qpn,rate_bps,target_bps,alpha,limited,shaped_bps").map_err(io)?;
    let opt = |v: Option<u64>| v.map_or(String::new(), |x| x.to_string());
    let mut t0 = None;
    let mut rows = 0u64;
    loop {
        // The last sample is taken after the stop request, so the log ends with the final state.
        let last = stop.load(Ordering::Acquire);
        let (now, qps) = ctx.qp_rates().map_err(|e| e.to_string())?;
        let t0 = *t0.get_or_insert(now);
        let t_us = (now - t0).as_nanos() as f64 / 1000.0;
        for q in qps {
            let m = q.controller;
            writeln!(
                out,
                "{t_us:.3},{},{},{},{},{},{}",
                q.qpn.value(),
                opt(m.rate_bps),
                opt(m.target_bps),
                m.alpha.map_or(String::new(), |a| format!("{a:.6}")),
                u8::from(m.limited),
                opt(q.shaped_bps)
            )
            .map_err(io)?;
            rows += 1;
        }
        if last {
            break;
        }
        std::thread::sleep(period);
    }
    out.flush().map_err(io)?;
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(dcqcn: Option<Profile>, sets: &[&str]) -> DcqcnArgs {
        DcqcnArgs {
            dcqcn: DcqcnChoice(dcqcn),
            cc_set: sets.iter().map(|s| (*s).to_owned()).collect(),
            rate_log_us: 100,
            ..DcqcnArgs::default()
        }
    }

    #[test]
    fn flags_configure_the_reaction_and_notification_points() {
        let mut cfg = EngineConfig::default();
        apply(&args(None, &[]), &mut cfg).unwrap();
        assert!(cfg.dcqcn.is_none());
        assert_eq!(cfg.cnp_interval, Duration::from_micros(50));
        // nvidia: its NP window (4 µs) and firmware names; line rate from the scheduler.
        let mut cfg = EngineConfig::default();
        apply(
            &args(
                Some(Profile::Nvidia),
                &["rpg_time_reset=100", "cnp_dscp=26", "cnp_802p_prio=3"],
            ),
            &mut cfg,
        )
        .unwrap();
        assert_eq!(cfg.cnp_interval, Duration::from_micros(4));
        assert_eq!((cfg.cnp_dscp, cfg.cnp_prio), (26, 3));
        let rp = cfg.dcqcn.as_ref().unwrap();
        assert_eq!(rp.line_rate_bps(), cfg.sched.line_rate_bps as f64);
        assert!(
            rp.params()
                .contains(&("rpg_time_reset", roce_proto::cc::ParamValue::U64(100)))
        );
        // paper with an explicit window and line rate.
        let mut cfg = EngineConfig::default();
        apply(
            &args(
                Some(Profile::Paper),
                &["min_time_between_cnps=20", "line_rate_bps=2e9", "B_bytes=0"],
            ),
            &mut cfg,
        )
        .unwrap();
        assert_eq!(cfg.cnp_interval, Duration::from_micros(20));
        assert_eq!(cfg.dcqcn.unwrap().line_rate_bps(), 2e9);
        // Errors name the flag.
        for (a, want) in [
            (args(None, &["K_us=5"]), "need --dcqcn"),
            (
                args(Some(Profile::Paper), &["rpg_gd=1"]),
                "unknown paper parameter",
            ),
            (args(Some(Profile::Paper), &["g"]), "expected NAME=VALUE"),
            (args(None, &["cnp_dscp=64"]), "cnp_dscp must be"),
        ] {
            let e = apply(&a, &mut EngineConfig::default()).unwrap_err();
            assert!(e.contains(want), "{e}");
        }
        assert_eq!(parse_profile("off"), Ok(DcqcnChoice(None)));
        assert!(parse_profile("dctcp").is_err());
    }
}
