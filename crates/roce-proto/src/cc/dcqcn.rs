//! DCQCN reaction point (RP), one per QP: `docs/spec/DCQCN.md` §2.3 (`paper`), §2.4 (`ns3_mlx`), §2.5
//! (`nvidia`). Sans-IO: every input carries `now`; the RP asks for one timer ([`Dcqcn::next_timer`]) and allocates
//! nothing after construction.
//!
//! # What each profile does
//!
//! | rule | `paper` (§2.3) | `ns3_mlx` (§2.4) | `nvidia` (§2.5) |
//! |---|---|---|---|
//! | start | RC = RT = C, no timers (R0) | same (M0) | same; limiter allocated at the first CNP, RC = RT = `rate_to_set_on_first_cnp` or current |
//! | CNP | cut at once: RT ← RC (if clamping), RC ← max(RC(1 − α/2), R_min), α ← (1−g)α + g (R1) | flags α and the next decrease check (M1) | same as `ns3_mlx` |
//! | α | ×(1 − g) every K µs after the last CNP (R2) | every `alpha_tick_us`: (1−g)α + g·[CNP in the tick] (M2) | every `dce_tcp_rtt`: (G/1024)α + (1 − G/1024)·[CNP] |
//! | cut | on the CNP | on the 4-µs grid t₀ + 4.001 + 4k if flagged (M3) | on the `rate_reduce_monitor_period` grid if flagged, RC·max(1 − α·2^(10−rpg_gd), rpg_min_dec_fac %) |
//! | RT clamp | always (R1) | if `clamp_target_always` or an increase since the last cut | if `clamp_tgt_rate`, or the last increase since the last cut was timer-driven and `clamp_tgt_rate_after_time_inc` |
//! | increase | timer T and byte counter B; FR / AI / HAI (i·R_HAI) by (T, BC) vs F (R3–R5) | timer only, one stage counter, constant R_HAI (M4, M5) | timer `rpg_time_reset` and bytes `rpg_byte_reset`, phases as `paper` (i·`rpg_hai_rate`) |
//! | end | never (the rate stays ≤ C) | never | limiter released when RC ≥ `rpg_max_rate` (0 = C): back to the start state |
//!
//! Same-instant order (R6, M6): `paper` CNP, α, rate timer, byte counter; `ns3_mlx`/`nvidia` CNP, α tick, increase
//! timer, decrease check. No profile defines an emergency fast cut, so none is implemented.
//!
//! # Implementation notes
//!
//! * α is evaluated lazily: between CNPs it follows a closed form (one multiplication per elapsed period, or `powi`
//!   after more than [`EXACT_STEPS`] periods), so no α timer runs — with a 1-µs α period that would be a million
//!   timer events per second per QP. Rates and α are `f64` computed in the oracle's order of operations, so
//!   CNP/timer-driven trajectories equal `rp_reference.py`'s to the last bit or within a few ulp.
//! * Once RT = RC = C (fully recovered: every further increase step is a no-op) the rate timer stops; `nvidia`
//!   releases the limiter instead (§2.5). A step that leaves RC one ulp below C counts as recovered.
//! * Time is integer nanoseconds (the oracle uses picoseconds): periods given in µs are rounded to the nanosecond.
//! * The byte counter counts the wire bytes the engine reports through [`Dcqcn::on_tx`] (`DCQCN.md` §7 TB7, §10);
//!   a count that crosses B fires one increase and restarts from 0 (the oracle's transmit-list mode).

use core::fmt;

use super::params::{Ns3MlxParams, NvidiaParams, PaperParams, ParamError, ParamValue};
use crate::time::Instant;

/// α is advanced by repeated multiplication (exactly as the oracle) for up to this many periods, by `powi` beyond
/// (relative difference ~1e-14), so a CNP after a long quiet spell costs a few multiplications, not one per period.
pub const EXACT_STEPS: u64 = 64;

/// The RP profiles (`DCQCN.md` §2.3–§2.5).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Profile {
    /// Zhu et al., SIGCOMM 2015 (§2.3): cut per CNP, α decay timer, timer + byte-counter increase.
    Paper,
    /// HPCC ns-3's model of ConnectX (§2.4, `rdma-hw.cc` CC_MODE 1).
    Ns3Mlx,
    /// NVIDIA ConnectX firmware semantics and parameter names (§2.5).
    Nvidia,
}

impl Profile {
    /// All profiles.
    pub const ALL: [Profile; 3] = [Profile::Paper, Profile::Ns3Mlx, Profile::Nvidia];

    /// `paper`, `ns3_mlx` or `nvidia`.
    pub fn name(self) -> &'static str {
        match self {
            Profile::Paper => PaperParams::PROFILE,
            Profile::Ns3Mlx => Ns3MlxParams::PROFILE,
            Profile::Nvidia => NvidiaParams::PROFILE,
        }
    }

    /// The profile called `name` (`ns3mlx` and `ns3-mlx` are accepted too).
    pub fn from_name(name: &str) -> Option<Profile> {
        match name {
            "paper" => Some(Profile::Paper),
            "ns3_mlx" | "ns3mlx" | "ns3-mlx" => Some(Profile::Ns3Mlx),
            "nvidia" => Some(Profile::Nvidia),
            _ => None,
        }
    }

    /// The notification point's CNP spacing that goes with the profile (µs, `DCQCN.md` §3 "NP CNP spacing"): 50
    /// per flow (paper), 0 (ns-3 flags every marked packet's ACK), 4 (`min_time_between_cnps`).
    pub fn default_np_interval_us(self) -> u64 {
        match self {
            Profile::Paper => 50,
            Profile::Ns3Mlx => 0,
            Profile::Nvidia => 4,
        }
    }
}

impl fmt::Display for Profile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The parameters of one RP: a profile and its named values (`DCQCN.md` §3).
#[derive(Clone, Debug, PartialEq)]
pub enum DcqcnConfig {
    /// `paper`.
    Paper(PaperParams),
    /// `ns3_mlx`.
    Ns3Mlx(Ns3MlxParams),
    /// `nvidia`.
    Nvidia(NvidiaParams),
}

impl DcqcnConfig {
    /// The defaults of `profile` for a port of `line_rate_bps` bit/s (`ns3_mlx` scales R_AI/R_HAI with it, as
    /// HPCC's `run.py`).
    pub fn new(profile: Profile, line_rate_bps: f64) -> DcqcnConfig {
        match profile {
            Profile::Paper => DcqcnConfig::Paper(PaperParams::defaults(line_rate_bps)),
            Profile::Ns3Mlx => DcqcnConfig::Ns3Mlx(Ns3MlxParams::defaults(line_rate_bps)),
            Profile::Nvidia => DcqcnConfig::Nvidia(NvidiaParams::defaults(line_rate_bps)),
        }
    }

    /// The profile.
    pub fn profile(&self) -> Profile {
        match self {
            DcqcnConfig::Paper(_) => Profile::Paper,
            DcqcnConfig::Ns3Mlx(_) => Profile::Ns3Mlx,
            DcqcnConfig::Nvidia(_) => Profile::Nvidia,
        }
    }

    /// Line rate C in bit/s.
    pub fn line_rate_bps(&self) -> f64 {
        match self {
            DcqcnConfig::Paper(p) => p.line_rate_bps,
            DcqcnConfig::Ns3Mlx(p) => p.line_rate_bps,
            DcqcnConfig::Nvidia(p) => p.line_rate_bps,
        }
    }

    /// The parameter names of this profile.
    pub fn names(&self) -> &'static [&'static str] {
        match self {
            DcqcnConfig::Paper(_) => PaperParams::NAMES,
            DcqcnConfig::Ns3Mlx(_) => Ns3MlxParams::NAMES,
            DcqcnConfig::Nvidia(_) => NvidiaParams::NAMES,
        }
    }

    /// Sets parameter `name` (the profile's own name for it, see [`names`](Self::names)) from its text form, then
    /// checks the whole set ([`validate`](Self::validate)).
    ///
    /// # Errors
    /// [`ParamError::Unknown`] for a name the profile does not have; [`ParamError::BadValue`] for a value that does
    /// not parse or leaves the set invalid (the old value is kept).
    pub fn set(&mut self, name: &str, value: &str) -> Result<(), ParamError> {
        let before = self.clone();
        let found = match self {
            DcqcnConfig::Paper(p) => p.set(name, value)?,
            DcqcnConfig::Ns3Mlx(p) => p.set(name, value)?,
            DcqcnConfig::Nvidia(p) => p.set(name, value)?,
        };
        if !found {
            return Err(ParamError::Unknown {
                name: name.to_owned(),
                profile: self.profile().name(),
                known: self.names().to_vec(),
            });
        }
        if let Err(e) = self.validate() {
            *self = before;
            return Err(e);
        }
        Ok(())
    }

    /// `(name, value)` of every parameter, in listing order (control path).
    pub fn params(&self) -> Vec<(&'static str, ParamValue)> {
        match self {
            DcqcnConfig::Paper(p) => p.values(),
            DcqcnConfig::Ns3Mlx(p) => p.values(),
            DcqcnConfig::Nvidia(p) => p.values(),
        }
    }

    /// Checks ranges: a positive line rate, gains and α in 0..=1, positive periods, a floor not above the line
    /// rate, firmware fields within their documented ranges (`DCQCN.md` §3).
    ///
    /// # Errors
    /// [`ParamError::BadValue`] naming the first offending parameter.
    pub fn validate(&self) -> Result<(), ParamError> {
        fn bad(name: &'static str, v: impl fmt::Display, expected: &'static str) -> ParamError {
            ParamError::BadValue {
                name,
                value: v.to_string(),
                expected,
            }
        }
        let line = self.line_rate_bps();
        if line.is_nan() || line < 1e3 {
            return Err(bad("line_rate_bps", line, "at least 1000 bit/s"));
        }
        let unit = |name, v: f64| {
            if (0.0..=1.0).contains(&v) {
                Ok(())
            } else {
                Err(bad(name, v, "a value in 0..=1"))
            }
        };
        // A period of at least 1 ns after rounding to the engine's nanosecond clock.
        let period = |name, us: f64| {
            if us >= 0.001 {
                Ok(())
            } else {
                Err(bad(name, us, "a period of at least 0.001 µs"))
            }
        };
        let rate = |name, v: f64| {
            if (0.0..=line).contains(&v) {
                Ok(())
            } else {
                Err(bad(name, v, "a rate in 0..=line_rate_bps"))
            }
        };
        match self {
            DcqcnConfig::Paper(p) => {
                unit("g", p.g)?;
                unit("alpha_init", p.alpha_init)?;
                period("K_us", p.k_us)?;
                period("T_us", p.t_us)?;
                rate("R_AI_bps", p.r_ai_bps)?;
                rate("R_HAI_bps", p.r_hai_bps)?;
                rate("min_rate_bps", p.min_rate_bps)?;
            }
            DcqcnConfig::Ns3Mlx(p) => {
                unit("g", p.g)?;
                unit("alpha_init", p.alpha_init)?;
                unit("rate_on_first_cnp", p.rate_on_first_cnp)?;
                period("alpha_tick_us", p.alpha_tick_us)?;
                period("dec_period_us", p.dec_period_us)?;
                period("T_us", p.t_us)?;
                rate("R_AI_bps", p.r_ai_bps)?;
                rate("R_HAI_bps", p.r_hai_bps)?;
                rate("min_rate_bps", p.min_rate_bps)?;
            }
            DcqcnConfig::Nvidia(p) => {
                let mbps = line / 1e6;
                let range = |name, v: u64, lo: u64, hi: u64, what| {
                    if (lo..=hi).contains(&v) {
                        Ok(())
                    } else {
                        Err(bad(name, v, what))
                    }
                };
                range("dce_tcp_g", p.dce_tcp_g, 0, 1023, "0..=1023")?;
                range("dce_tcp_rtt", p.dce_tcp_rtt, 1, 131_071, "1..=131071 µs")?;
                range(
                    "initial_alpha_value",
                    p.initial_alpha_value,
                    0,
                    1023,
                    "0..=1023",
                )?;
                range("rpg_min_dec_fac", p.rpg_min_dec_fac, 0, 100, "0..=100 %")?;
                range("rpg_gd", p.rpg_gd, 0, 31, "0..=31")?;
                range(
                    "rate_reduce_monitor_period",
                    p.rate_reduce_monitor_period,
                    1,
                    u64::from(u32::MAX),
                    "at least 1 µs",
                )?;
                range(
                    "rpg_time_reset",
                    p.rpg_time_reset,
                    1,
                    u64::from(u32::MAX),
                    "at least 1 µs",
                )?;
                for (name, v) in [
                    ("rate_to_set_on_first_cnp", p.rate_to_set_on_first_cnp),
                    ("rpg_min_rate", p.rpg_min_rate),
                    ("rpg_max_rate", p.rpg_max_rate),
                    ("rpg_ai_rate", p.rpg_ai_rate),
                    ("rpg_hai_rate", p.rpg_hai_rate),
                ] {
                    if v as f64 > mbps {
                        return Err(bad(name, v, "a rate in Mb/s up to the line rate"));
                    }
                }
            }
        }
        Ok(())
    }
}

/// How a cut treats RT (`DCQCN.md` §2.3 R1, §2.4 M3, §2.5).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Clamp {
    Always,
    /// If an increase happened since the last cut (`ns3_mlx`: `stage ≠ 0`).
    AfterIncrease,
    /// If the last increase since the last cut was timer-driven (`clamp_tgt_rate_after_time_inc`).
    AfterTimeIncrease,
    Never,
}

/// The profile's rules in engine units (ns, bit/s), derived once from a [`DcqcnConfig`].
#[derive(Clone, Debug)]
struct Rules {
    profile: Profile,
    line: f64,
    min_rate: f64,
    /// `nvidia`: RC at or above this releases the limiter.
    release_rate: f64,
    g: f64,
    alpha_init: f64,
    /// α period: K (paper, from the last CNP) or the α tick (grid from the first CNP).
    alpha_period: u64,
    /// Decrease-check period and the offset of the first check after the first CNP (`ns3_mlx`: + 1 ns).
    dec_period: u64,
    dec_first: u64,
    /// Rate-increase timer period.
    t_period: u64,
    /// Byte counter (0: none).
    byte_reset: u64,
    f: u32,
    r_ai: f64,
    r_hai: f64,
    /// Hyper increase adds i·R_HAI with i = min(T, BC) − F (paper, nvidia) or a constant R_HAI (ns3_mlx).
    hai_scaled: bool,
    /// RC ← RC·max(1 − α/cut_div, min_keep).
    cut_div: f64,
    min_keep: f64,
    /// `ns3_mlx`: fraction of RC kept at the first CNP; `nvidia`: RC at the first CNP (None: current).
    first_scale: f64,
    first_rate: Option<f64>,
    clamp: Clamp,
}

fn us_to_ns(us: f64) -> u64 {
    (us * 1000.0).round().max(1.0) as u64
}

impl Rules {
    fn new(cfg: &DcqcnConfig) -> Rules {
        match cfg {
            DcqcnConfig::Paper(p) => Rules {
                profile: Profile::Paper,
                line: p.line_rate_bps,
                min_rate: p.min_rate_bps,
                release_rate: p.line_rate_bps,
                g: p.g,
                alpha_init: p.alpha_init,
                alpha_period: us_to_ns(p.k_us),
                dec_period: 0,
                dec_first: 0,
                t_period: us_to_ns(p.t_us),
                byte_reset: p.b_bytes,
                f: p.f.min(u64::from(u32::MAX)) as u32,
                r_ai: p.r_ai_bps,
                r_hai: p.r_hai_bps,
                hai_scaled: true,
                cut_div: 2.0,
                min_keep: 0.0,
                first_scale: 1.0,
                first_rate: None,
                clamp: if p.clamp_target_on_cnp {
                    Clamp::Always
                } else {
                    Clamp::Never
                },
            },
            DcqcnConfig::Ns3Mlx(p) => {
                let dec = us_to_ns(p.dec_period_us);
                Rules {
                    profile: Profile::Ns3Mlx,
                    line: p.line_rate_bps,
                    min_rate: p.min_rate_bps,
                    release_rate: p.line_rate_bps,
                    g: p.g,
                    alpha_init: p.alpha_init,
                    alpha_period: us_to_ns(p.alpha_tick_us),
                    dec_period: dec,
                    // rdma-hw.cc schedules the first check RATE_DECREASE_INTERVAL + 1 ns after the first CNP (M6).
                    dec_first: dec + 1,
                    t_period: us_to_ns(p.t_us),
                    byte_reset: 0,
                    f: p.f.min(u64::from(u32::MAX)) as u32,
                    r_ai: p.r_ai_bps,
                    r_hai: p.r_hai_bps,
                    hai_scaled: false,
                    cut_div: 2.0,
                    min_keep: 0.0,
                    first_scale: p.rate_on_first_cnp,
                    first_rate: None,
                    clamp: if p.clamp_target_always {
                        Clamp::Always
                    } else {
                        Clamp::AfterIncrease
                    },
                }
            }
            DcqcnConfig::Nvidia(p) => {
                let line = p.line_rate_bps;
                let mbps = |v: u64| (v as f64 * 1e6).min(line);
                let dec = p.rate_reduce_monitor_period * 1000;
                Rules {
                    profile: Profile::Nvidia,
                    line,
                    min_rate: mbps(p.rpg_min_rate),
                    release_rate: if p.rpg_max_rate == 0 {
                        line
                    } else {
                        mbps(p.rpg_max_rate)
                    },
                    g: 1.0 - p.dce_tcp_g as f64 / 1024.0,
                    alpha_init: p.initial_alpha_value as f64 / 1024.0,
                    alpha_period: p.dce_tcp_rtt * 1000,
                    dec_period: dec,
                    dec_first: dec,
                    t_period: p.rpg_time_reset * 1000,
                    byte_reset: p.rpg_byte_reset,
                    f: p.rpg_threshold.min(u64::from(u32::MAX)) as u32,
                    r_ai: mbps(p.rpg_ai_rate),
                    r_hai: mbps(p.rpg_hai_rate),
                    hai_scaled: true,
                    // α is a 10-bit fraction and the divisor 2^rpg_gd applies to it: RC·(1 − α·1024/2^rpg_gd).
                    cut_div: 2f64.powi(p.rpg_gd as i32 - 10),
                    min_keep: p.rpg_min_dec_fac as f64 / 100.0,
                    first_scale: 1.0,
                    first_rate: (p.rate_to_set_on_first_cnp > 0)
                        .then(|| mbps(p.rate_to_set_on_first_cnp)),
                    clamp: if p.clamp_tgt_rate {
                        Clamp::Always
                    } else if p.clamp_tgt_rate_after_time_inc {
                        Clamp::AfterTimeIncrease
                    } else {
                        Clamp::Never
                    },
                }
            }
        }
    }
}

/// What kind of RP event happened (the oracle's `event` field).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RpEventKind {
    /// A CNP arrived.
    Cnp,
    /// The rate-increase timer expired (the oracle's `timer` in `paper`, `inc` in `ns3_mlx`).
    Timer,
    /// The byte counter reached its threshold.
    Byte,
    /// A periodic decrease check found a CNP flagged (`ns3_mlx`, `nvidia`).
    Dec,
}

/// What the RP did (the oracle's `action` field).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RpAction {
    /// The rate was cut.
    Cut,
    /// `ns3_mlx`/`nvidia`: the first CNP of the flow set up the limiter; the cut follows at the next check.
    FirstCnp,
    /// `ns3_mlx`/`nvidia`: a CNP was noted for the next α update and decrease check.
    CnpFlagged,
    /// RC ← (RT + RC)/2.
    FastRecovery,
    /// RT += R_AI, then fast recovery.
    AdditiveIncrease,
    /// RT += (i·)R_HAI, then fast recovery.
    HyperIncrease,
}

impl RpAction {
    /// The oracle's name.
    pub fn name(self) -> &'static str {
        match self {
            RpAction::Cut => "cut",
            RpAction::FirstCnp => "first_cnp",
            RpAction::CnpFlagged => "cnp_flagged",
            RpAction::FastRecovery => "fast_recovery",
            RpAction::AdditiveIncrease => "additive_increase",
            RpAction::HyperIncrease => "hyper_increase",
        }
    }
}

/// One RP event with the state after it (what `rocev2 cc trace` logs).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RpEvent {
    /// When.
    pub at: Instant,
    /// What happened.
    pub kind: RpEventKind,
    /// What the RP did.
    pub action: RpAction,
    /// RC after the event (bit/s).
    pub rc_bps: f64,
    /// RT after the event (bit/s).
    pub rt_bps: f64,
    /// α after the event.
    pub alpha: f64,
    /// Timer stage count since the last cut (`paper`, `nvidia`).
    pub t_cnt: u32,
    /// Byte-counter stage count since the last cut (`paper`, `nvidia`).
    pub bc_cnt: u32,
    /// Stage counter (`ns3_mlx`).
    pub stage: u32,
    /// The limiter is engaged (has seen a CNP and not been released).
    pub limited: bool,
}

/// Which increase last happened since the last cut (for [`Clamp::AfterTimeIncrease`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum LastInc {
    None,
    Timer,
    Byte,
}

/// Lazily evaluated α: `value` as of `at`; further updates at `at + k·period` (k ≥ 1). `paper` re-anchors at each
/// CNP (R2: K µs *without* a CNP); `ns3_mlx`/`nvidia` keep the grid of the first CNP and apply a pending CNP flag
/// at the next tick (M2).
#[derive(Clone, Copy, Debug)]
struct Alpha {
    value: f64,
    at: Option<Instant>,
    flag: bool,
}

impl Alpha {
    /// Updates due at or before `t` (`inclusive`) or strictly before `t`.
    fn due(&self, period: u64, t: Instant, inclusive: bool) -> u64 {
        let Some(at) = self.at else { return 0 };
        let (a, t) = (at.as_nanos(), t.as_nanos());
        if t <= a || period == 0 {
            return 0;
        }
        let d = t - a;
        if inclusive {
            d / period
        } else {
            (d - 1) / period
        }
    }

    /// The value after `n` updates with gain `g` (the first one applies the pending flag).
    fn after(&self, g: f64, n: u64) -> f64 {
        if n == 0 {
            return self.value;
        }
        let keep = 1.0 - g;
        let mut a = keep * self.value + if self.flag { g } else { 0.0 };
        let rest = n - 1;
        if rest <= EXACT_STEPS {
            for _ in 0..rest {
                a *= keep;
            }
        } else {
            a *= keep.powi(rest.min(i32::MAX as u64) as i32);
        }
        a
    }

    fn advance(&mut self, g: f64, period: u64, t: Instant, inclusive: bool) {
        let n = self.due(period, t, inclusive);
        if n > 0 {
            self.value = self.after(g, n);
            self.flag = false;
            if let Some(at) = self.at.as_mut() {
                *at = Instant::from_nanos(at.as_nanos() + n * period);
            }
        }
    }
}

/// A DCQCN reaction point for one QP. Create it from a [`DcqcnConfig`]; feed it CNPs ([`on_cnp`](Self::on_cnp)),
/// transmitted wire bytes ([`on_tx`](Self::on_tx)) and its timer ([`on_timer`](Self::on_timer) when
/// [`next_timer`](Self::next_timer) is due); read RC with [`rate_bps`](Self::rate_bps). The `*_with` variants report
/// every event to an observer (used by `rocev2 cc trace`); the engine uses the plain ones through
/// [`super::RateController`]. No method allocates.
#[derive(Clone)]
pub struct Dcqcn {
    cfg: DcqcnConfig,
    rules: Rules,
    rc: f64,
    rt: f64,
    alpha: Alpha,
    t_cnt: u32,
    bc_cnt: u32,
    stage: u32,
    bytes_acc: u64,
    last_inc: LastInc,
    /// A CNP has been seen (and, `nvidia`, the limiter not released since).
    limited: bool,
    /// The rate timer and byte counter run (a cut happened and the rate has not fully recovered).
    increasing: bool,
    next_inc: Option<Instant>,
    /// `ns3_mlx`/`nvidia`: a CNP arrived since the last decrease check; the check is due at `next_dec`.
    dec_flag: bool,
    next_dec: Option<Instant>,
    /// First decrease-check instant of the grid (`ns3_mlx`/`nvidia`).
    dec_grid: Instant,
    cnps: u64,
    cuts: u64,
    increases: u64,
}

impl fmt::Debug for Dcqcn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "dcqcn {} rc={:.0} rt={:.0} alpha={:.6} limited={} cnps={} cuts={} incs={}",
            self.rules.profile,
            self.rc,
            self.rt,
            self.alpha.value,
            self.limited,
            self.cnps,
            self.cuts,
            self.increases
        )?;
        match self.rules.profile {
            Profile::Ns3Mlx => write!(f, " stage={}", self.stage)?,
            _ => write!(
                f,
                " T={} BC={} bytes={}",
                self.t_cnt, self.bc_cnt, self.bytes_acc
            )?,
        }
        if let Some(t) = self.next_inc {
            write!(f, " next_inc={t}")?;
        }
        if let Some(t) = self.next_dec {
            write!(f, " next_dec={t}")?;
        }
        Ok(())
    }
}

impl Dcqcn {
    /// A reaction point in its start state (RC = RT = C, `DCQCN.md` R0/M0). The configuration should have passed
    /// [`DcqcnConfig::validate`] (`set` guarantees it); out-of-range values are not rejected here.
    pub fn new(cfg: DcqcnConfig) -> Dcqcn {
        let rules = Rules::new(&cfg);
        let line = rules.line;
        let alpha_init = rules.alpha_init;
        Dcqcn {
            cfg,
            rules,
            rc: line,
            rt: line,
            alpha: Alpha {
                value: alpha_init,
                at: None,
                flag: false,
            },
            t_cnt: 0,
            bc_cnt: 0,
            stage: 0,
            bytes_acc: 0,
            last_inc: LastInc::None,
            limited: false,
            increasing: false,
            next_inc: None,
            dec_flag: false,
            next_dec: None,
            dec_grid: Instant::ZERO,
            cnps: 0,
            cuts: 0,
            increases: 0,
        }
    }

    /// Back to the start state (QP reset).
    pub fn reset(&mut self) {
        *self = Dcqcn::new(self.cfg.clone());
    }

    /// The configuration.
    pub fn config(&self) -> &DcqcnConfig {
        &self.cfg
    }

    /// The profile.
    pub fn profile(&self) -> Profile {
        self.rules.profile
    }

    /// Current rate RC (bit/s).
    pub fn rc_bps(&self) -> f64 {
        self.rc
    }

    /// Target rate RT (bit/s).
    pub fn rt_bps(&self) -> f64 {
        self.rt
    }

    /// Line rate C (bit/s).
    pub fn line_rate_bps(&self) -> f64 {
        self.rules.line
    }

    /// RC as an integer rate for a shaper (bit/s, at least 1).
    pub fn rate_bps(&self) -> u64 {
        (self.rc as u64).max(1)
    }

    /// α as it stands at `now` (updates due at or before `now` applied; nothing is changed).
    pub fn alpha_at(&self, now: Instant) -> f64 {
        let n = self.alpha.due(self.rules.alpha_period, now, true);
        self.alpha.after(self.rules.g, n)
    }

    /// Whether the limiter is engaged (a CNP was seen and, `nvidia`, the limiter not released since).
    pub fn is_limited(&self) -> bool {
        self.limited
    }

    /// Stage counters `(T, BC, stage)`.
    pub fn stages(&self) -> (u32, u32, u32) {
        (self.t_cnt, self.bc_cnt, self.stage)
    }

    /// CNPs received, cuts and increase steps made since creation or reset.
    pub fn event_counts(&self) -> (u64, u64, u64) {
        (self.cnps, self.cuts, self.increases)
    }

    /// Bytes still to transmit before the byte counter fires, or `None` when it does not run (profile without one,
    /// B = 0, or no cut to recover from).
    pub fn bytes_to_byte_event(&self) -> Option<u64> {
        (self.increasing && self.rules.byte_reset > 0)
            .then(|| self.rules.byte_reset.saturating_sub(self.bytes_acc).max(1))
    }

    /// The instant at which [`on_timer`](Self::on_timer) has work (rate-increase timer or decrease check).
    pub fn next_timer(&self) -> Option<Instant> {
        match (self.next_inc, self.next_dec) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn event(&self, at: Instant, kind: RpEventKind, action: RpAction) -> RpEvent {
        // A CNP comes before an α update of the same instant (R6, M6): its event shows α without that update.
        let n = self
            .alpha
            .due(self.rules.alpha_period, at, kind != RpEventKind::Cnp);
        RpEvent {
            at,
            kind,
            action,
            rc_bps: self.rc,
            rt_bps: self.rt,
            alpha: self.alpha.after(self.rules.g, n),
            t_cnt: self.t_cnt,
            bc_cnt: self.bc_cnt,
            stage: self.stage,
            limited: self.limited,
        }
    }

    /// Processes the timers due before `t` (or at `t` when `inclusive`), in the profile's same-instant order.
    fn run_timers(&mut self, t: Instant, inclusive: bool, obs: &mut impl FnMut(&RpEvent)) {
        loop {
            let due = |d: Option<Instant>| d.filter(|&d| d < t || (inclusive && d == t));
            // Increase timer before decrease check at the same instant (M6).
            let (inc, dec) = (due(self.next_inc), due(self.next_dec));
            match (inc, dec) {
                (Some(i), Some(d)) if i <= d => self.on_inc(i, obs),
                (_, Some(d)) => self.on_dec(d, obs),
                (Some(i), None) => self.on_inc(i, obs),
                (None, None) => return,
            }
        }
    }

    /// Input: a CNP for this QP at `now` (`DCQCN.md` R1 / M1 / §2.5).
    pub fn on_cnp(&mut self, now: Instant) {
        self.on_cnp_with(now, &mut |_| {});
    }

    /// [`on_cnp`](Self::on_cnp), reporting events to `obs`.
    pub fn on_cnp_with(&mut self, now: Instant, obs: &mut impl FnMut(&RpEvent)) {
        // Timers due strictly before the CNP run first; one due at `now` comes after it (R6, M6).
        self.run_timers(now, false, obs);
        self.cnps += 1;
        let r = &self.rules;
        let (g, period) = (r.g, r.alpha_period);
        match r.profile {
            Profile::Paper => {
                self.alpha.advance(g, period, now, false);
                if r.clamp == Clamp::Always {
                    self.rt = self.rc;
                }
                self.rc = self.cut_rate();
                self.alpha.value = (1.0 - g) * self.alpha.value + g;
                self.alpha.at = Some(now);
                self.cuts += 1;
                self.restart_increase(now);
                self.limited = true;
                obs(&self.event(now, RpEventKind::Cnp, RpAction::Cut));
            }
            Profile::Ns3Mlx | Profile::Nvidia => {
                self.dec_flag = true;
                let first = match r.profile {
                    Profile::Ns3Mlx => self.alpha.at.is_none(),
                    _ => !self.limited,
                };
                if first {
                    // M1 / §2.5: the limiter starts here; α starts at its initial value on a fresh grid; the first
                    // decrease check is one period (+1 ns in ns-3) later.
                    self.alpha = Alpha {
                        value: r.alpha_init,
                        at: Some(now),
                        flag: false,
                    };
                    self.dec_grid = now + core::time::Duration::from_nanos(r.dec_first);
                    self.next_dec = Some(self.dec_grid);
                    self.rc = match r.first_rate {
                        Some(rate) => rate,
                        None => self.rc * r.first_scale,
                    };
                    self.rt = self.rc;
                    self.limited = true;
                    obs(&self.event(now, RpEventKind::Cnp, RpAction::FirstCnp));
                } else {
                    self.alpha.advance(g, period, now, false);
                    self.alpha.flag = true;
                    if self.next_dec.is_none() {
                        self.next_dec = Some(self.next_dec_at(now));
                    }
                    obs(&self.event(now, RpEventKind::Cnp, RpAction::CnpFlagged));
                }
            }
        }
    }

    /// The first decrease-check grid instant at or after `t`.
    fn next_dec_at(&self, t: Instant) -> Instant {
        let (g0, p) = (self.dec_grid.as_nanos(), self.rules.dec_period.max(1));
        let t = t.as_nanos();
        if t <= g0 {
            return self.dec_grid;
        }
        Instant::from_nanos(g0 + (t - g0).div_ceil(p) * p)
    }

    /// RC after a cut with the current α (R1, M3, §2.5).
    fn cut_rate(&self) -> f64 {
        let r = &self.rules;
        let factor = (1.0 - self.alpha.value / r.cut_div).max(r.min_keep);
        (self.rc * factor).max(r.min_rate)
    }

    /// After a cut: stage counters and byte count to 0, the increase timer restarts (R1, M3).
    fn restart_increase(&mut self, now: Instant) {
        self.t_cnt = 0;
        self.bc_cnt = 0;
        self.stage = 0;
        self.bytes_acc = 0;
        self.last_inc = LastInc::None;
        self.increasing = true;
        self.next_inc = Some(now + core::time::Duration::from_nanos(self.rules.t_period));
    }

    /// Decrease check (M3, §2.5).
    fn on_dec(&mut self, t: Instant, obs: &mut impl FnMut(&RpEvent)) {
        self.next_dec = None;
        if !self.dec_flag {
            return;
        }
        let (g, period) = (self.rules.g, self.rules.alpha_period);
        // The α update of the same instant comes first (M6).
        self.alpha.advance(g, period, t, true);
        let clamp = match self.rules.clamp {
            Clamp::Always => true,
            Clamp::AfterIncrease => self.stage != 0 || self.last_inc != LastInc::None,
            Clamp::AfterTimeIncrease => self.last_inc == LastInc::Timer,
            Clamp::Never => false,
        };
        if clamp {
            self.rt = self.rc;
        }
        self.rc = self.cut_rate();
        self.dec_flag = false;
        self.cuts += 1;
        self.restart_increase(t);
        obs(&self.event(t, RpEventKind::Dec, RpAction::Cut));
    }

    /// Rate-increase timer (R3, M4).
    fn on_inc(&mut self, t: Instant, obs: &mut impl FnMut(&RpEvent)) {
        self.next_inc = Some(t + core::time::Duration::from_nanos(self.rules.t_period));
        self.increases += 1;
        let action = if self.rules.profile == Profile::Ns3Mlx {
            let f = self.rules.f;
            let action = if self.stage < f {
                RpAction::FastRecovery
            } else if self.stage == f {
                self.rt = (self.rt + self.rules.r_ai).min(self.rules.line);
                RpAction::AdditiveIncrease
            } else {
                self.rt = (self.rt + self.rules.r_hai).min(self.rules.line);
                RpAction::HyperIncrease
            };
            let before = self.rc;
            self.rc = self.rc / 2.0 + self.rt / 2.0;
            self.stage = self.stage.saturating_add(1);
            self.settle(before);
            action
        } else {
            self.t_cnt = self.t_cnt.saturating_add(1);
            self.last_inc = LastInc::Timer;
            self.increase()
        };
        obs(&self.event(t, RpEventKind::Timer, action));
        self.maybe_release();
    }

    /// Increase step of `paper`/`nvidia` (R5): phase from the two stage counters (already incremented).
    fn increase(&mut self) -> RpAction {
        let r = &self.rules;
        let (t, bc, f) = (self.t_cnt, self.bc_cnt, r.f);
        let action = if t.max(bc) <= f {
            RpAction::FastRecovery
        } else if t.min(bc) > f {
            let step = if r.hai_scaled {
                f64::from(t.min(bc) - f) * r.r_hai
            } else {
                r.r_hai
            };
            self.rt = (self.rt + step).min(r.line);
            RpAction::HyperIncrease
        } else {
            self.rt = (self.rt + r.r_ai).min(r.line);
            RpAction::AdditiveIncrease
        };
        let before = self.rc;
        self.rc = ((self.rt + self.rc) / 2.0).min(self.rules.line);
        self.settle(before);
        action
    }

    /// A step that cannot move RC any more (RT = C and RC unchanged, i.e. one ulp below C) lands on C.
    fn settle(&mut self, before: f64) {
        if self.rt >= self.rules.line && self.rc == before {
            self.rc = self.rules.line;
        }
    }

    /// After an increase: fully recovered ⇒ stop the rate timer and byte counter (`paper`, `ns3_mlx`: every
    /// further step would be a no-op) or release the limiter (`nvidia`, §2.5: RC reached `rpg_max_rate`).
    fn maybe_release(&mut self) {
        let r = &self.rules;
        match r.profile {
            Profile::Nvidia if self.rc >= r.release_rate => {
                let counts = (self.cnps, self.cuts, self.increases);
                self.reset();
                (self.cnps, self.cuts, self.increases) = counts;
            }
            Profile::Nvidia => {}
            _ if self.rc >= r.line && self.rt >= r.line => {
                self.increasing = false;
                self.next_inc = None;
                self.bytes_acc = 0;
            }
            _ => {}
        }
    }

    /// Input: a data packet of `bytes` wire bytes left at `now` (R4: byte counter; `DCQCN.md` §7 TB7).
    pub fn on_tx(&mut self, now: Instant, bytes: u64) {
        self.on_tx_with(now, bytes, &mut |_| {});
    }

    /// [`on_tx`](Self::on_tx), reporting events to `obs`.
    pub fn on_tx_with(&mut self, now: Instant, bytes: u64, obs: &mut impl FnMut(&RpEvent)) {
        self.run_timers(now, true, obs);
        if !self.increasing || self.rules.byte_reset == 0 {
            return;
        }
        self.bytes_acc = self.bytes_acc.saturating_add(bytes);
        if self.bytes_acc >= self.rules.byte_reset {
            self.bytes_acc = 0;
            self.increases += 1;
            self.bc_cnt = self.bc_cnt.saturating_add(1);
            self.last_inc = LastInc::Byte;
            let action = self.increase();
            obs(&self.event(now, RpEventKind::Byte, action));
            self.maybe_release();
        }
    }

    /// Timer input: runs everything due at or before `now`.
    pub fn on_timer(&mut self, now: Instant) {
        self.on_timer_with(now, &mut |_| {});
    }

    /// [`on_timer`](Self::on_timer), reporting events to `obs`.
    pub fn on_timer_with(&mut self, now: Instant, obs: &mut impl FnMut(&RpEvent)) {
        self.run_timers(now, true, obs);
    }
}

#[cfg(test)]
mod tests;
