//! DCQCN parameters by name (`docs/spec/DCQCN.md` §3): one struct per profile, every field settable by the
//! name the profile's source uses — the oracle's names (`rp_reference.py`) for `paper` and `ns3_mlx`, the firmware's
//! (`/sys/class/net/<if>/ecn/roce_rp|roce_np/<name>`, mlxconfig) for `nvidia`.

use core::fmt;

/// A parameter value as listed by [`super::DcqcnConfig::params`] (for reports such as the `params` object of
/// `rocev2 cc trace`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ParamValue {
    /// A real number (rates in bit/s, times in µs, gains).
    F64(f64),
    /// A count or an integer setting (bytes, steps, Mb/s, µs, fixed-point fractions).
    U64(u64),
    /// A switch.
    Bool(bool),
}

impl fmt::Display for ParamValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ParamValue::F64(v) => write!(f, "{v}"),
            ParamValue::U64(v) => write!(f, "{v}"),
            ParamValue::Bool(v) => write!(f, "{v}"),
        }
    }
}

/// Why `NAME=VALUE` was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ParamError {
    /// The profile has no parameter of that name; `known` lists the names it has.
    Unknown {
        /// The name given.
        name: String,
        /// The profile.
        profile: &'static str,
        /// Every accepted name.
        known: Vec<&'static str>,
    },
    /// The value does not parse as the parameter's type or is out of its range.
    BadValue {
        /// The parameter.
        name: &'static str,
        /// The value given.
        value: String,
        /// What is accepted.
        expected: &'static str,
    },
}

impl fmt::Display for ParamError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ParamError::Unknown {
                name,
                profile,
                known,
            } => write!(
                f,
                "unknown {profile} parameter `{name}` (known: {})",
                known.join(", ")
            ),
            ParamError::BadValue {
                name,
                value,
                expected,
            } => write!(f, "{name}={value}: expected {expected}"),
        }
    }
}

impl std::error::Error for ParamError {}

/// Parses one parameter value of type `Self` (the oracle's `type(default)(float(v))` conventions: integers may be
/// written as `1e7`; booleans as `1/0/true/false/yes/no`).
pub(crate) trait ParamType: Sized + Copy {
    const EXPECTED: &'static str;
    fn parse(s: &str) -> Option<Self>;
    fn value(self) -> ParamValue;
}

impl ParamType for f64 {
    const EXPECTED: &'static str = "a finite number";
    fn parse(s: &str) -> Option<f64> {
        s.trim().parse::<f64>().ok().filter(|v| v.is_finite())
    }
    fn value(self) -> ParamValue {
        ParamValue::F64(self)
    }
}

impl ParamType for u64 {
    const EXPECTED: &'static str = "a non-negative integer";
    fn parse(s: &str) -> Option<u64> {
        let s = s.trim();
        if let Ok(v) = s.parse::<u64>() {
            return Some(v);
        }
        let f = s.parse::<f64>().ok()?;
        (f.is_finite() && f >= 0.0 && f.fract() == 0.0 && f <= 9.0e15).then_some(f as u64)
    }
    fn value(self) -> ParamValue {
        ParamValue::U64(self)
    }
}

impl ParamType for bool {
    const EXPECTED: &'static str = "1, 0, true, false, yes or no";
    fn parse(s: &str) -> Option<bool> {
        match s.trim().to_ascii_lowercase().as_str() {
            "1" | "true" | "yes" => Some(true),
            "0" | "false" | "no" => Some(false),
            _ => None,
        }
    }
    fn value(self) -> ParamValue {
        ParamValue::Bool(self)
    }
}

/// Declares a parameter struct: fields with their public names, types and defaults (the defaults may use the
/// constructor argument `$line`, the line rate in bit/s), `NAMES`, `set(name, value)` and `values()`.
macro_rules! param_struct {
    (
        $(#[$sm:meta])*
        $name:ident ($profile:literal, $line:ident) {
            $( $(#[$m:meta])* $field:ident as $pname:literal : $ty:ty = $default:expr, )*
        }
    ) => {
        $(#[$sm])*
        #[derive(Clone, Debug, PartialEq)]
        pub struct $name {
            $( $(#[$m])* pub $field: $ty, )*
        }

        impl $name {
            /// The parameter names, in listing order.
            pub const NAMES: &'static [&'static str] = &[$($pname),*];

            /// The profile's defaults (`DCQCN.md` §3) for a port of `line_rate_bps` bit/s.
            pub fn defaults($line: f64) -> Self {
                $name { $( $field: $default, )* }
            }

            /// Sets the parameter called `name` from its text form (no range check: see
            /// [`super::DcqcnConfig::set`]). `Ok(false)`: no such parameter.
            ///
            /// # Errors
            /// [`ParamError::BadValue`] when the text does not parse as the parameter's type.
            pub fn set(&mut self, name: &str, value: &str) -> Result<bool, ParamError> {
                match name {
                    $( $pname => {
                        self.$field = <$ty as ParamType>::parse(value).ok_or_else(|| ParamError::BadValue {
                            name: $pname,
                            value: value.to_owned(),
                            expected: <$ty as ParamType>::EXPECTED,
                        })?;
                        Ok(true)
                    } )*
                    _ => Ok(false),
                }
            }

            /// `(name, value)` of every parameter, in listing order.
            pub fn values(&self) -> Vec<(&'static str, ParamValue)> {
                vec![$( ($pname, ParamType::value(self.$field)), )*]
            }

            /// The profile name.
            pub const PROFILE: &'static str = $profile;
        }
    };
}

param_struct! {
    /// `paper` profile (`DCQCN.md` §2.3, rules R0–R7; defaults §3, paper column), named as in `rp_reference.py`.
    PaperParams("paper", line) {
        /// Line rate C (bit/s): the rate of a flow that has seen no CNP, and the cap of RC and RT.
        line_rate_bps as "line_rate_bps": f64 = line,
        /// α EWMA gain g.
        g as "g": f64 = 1.0 / 256.0,
        /// α before the first CNP (α₀).
        alpha_init as "alpha_init": f64 = 1.0,
        /// α decay period K (µs): α ← (1 − g)·α every K µs without a CNP (R2).
        k_us as "K_us": f64 = 55.0,
        /// Rate-increase timer period T (µs, R3).
        t_us as "T_us": f64 = 55.0,
        /// Byte counter B (bytes; 0 disables it, R4).
        b_bytes as "B_bytes": u64 = 10_000_000,
        /// Fast-recovery steps F (R5).
        f as "F": u64 = 5,
        /// Additive-increase step R_AI (bit/s).
        r_ai_bps as "R_AI_bps": f64 = 40e6,
        /// Hyper-increase step R_HAI (bit/s), multiplied by i = min(T, BC) − F (R5).
        r_hai_bps as "R_HAI_bps": f64 = 200e6,
        /// Rate floor R_min (bit/s).
        min_rate_bps as "min_rate_bps": f64 = 100e6,
        /// RT ← RC on every CNP (R1); false never lowers RT.
        clamp_target_on_cnp as "clamp_target_on_cnp": bool = true,
    }
}

param_struct! {
    /// `ns3_mlx` profile (`DCQCN.md` §2.4, rules M0–M7: HPCC ns-3's model of ConnectX, `run.py --cc dcqcn` values),
    /// named as in `rp_reference.py`.
    Ns3MlxParams("ns3_mlx", line) {
        /// Line rate (bit/s).
        line_rate_bps as "line_rate_bps": f64 = line,
        /// α EWMA gain (`EWMA_GAIN`).
        g as "g": f64 = 1.0 / 256.0,
        /// α set at the first CNP.
        alpha_init as "alpha_init": f64 = 1.0,
        /// α update period (`ALPHA_RESUME_INTERVAL`, µs).
        alpha_tick_us as "alpha_tick_us": f64 = 1.0,
        /// Rate-decrease check period (`RATE_DECREASE_INTERVAL`, µs).
        dec_period_us as "dec_period_us": f64 = 4.0,
        /// Rate-increase timer (`RP_TIMER`, µs).
        t_us as "T_us": f64 = 300.0,
        /// Fast-recovery stages (`FAST_RECOVERY_TIMES`).
        f as "F": u64 = 1,
        /// Additive step (`RATE_AI`, bit/s): 5 Mb/s per 25 Gb/s of line rate.
        r_ai_bps as "R_AI_bps": f64 = 5e6 * line / 25e9,
        /// Hyper step (`RATE_HAI`, bit/s, constant): 50 Mb/s per 25 Gb/s of line rate.
        r_hai_bps as "R_HAI_bps": f64 = 50e6 * line / 25e9,
        /// Rate floor (`MIN_RATE`, bit/s).
        min_rate_bps as "min_rate_bps": f64 = 100e6,
        /// Fraction of the current rate kept at the first CNP (`RateOnFirstCnp`).
        rate_on_first_cnp as "rate_on_first_cnp": f64 = 1.0,
        /// `CLAMP_TARGET_RATE`: RT ← RC at every cut; false: only if an increase happened since the last cut.
        clamp_target_always as "clamp_target_always": bool = false,
    }
}

param_struct! {
    /// `nvidia` profile (`DCQCN.md` §2.5 with the §3 NVIDIA column): ConnectX firmware semantics under the firmware's
    /// names. Rates in Mb/s and times in µs as the firmware takes them; α values are 10-bit fixed-point fractions.
    NvidiaParams("nvidia", line) {
        /// Port speed (bit/s): the rate of an unlimited flow and the cap of RC and RT.
        line_rate_bps as "line_rate_bps": f64 = line,
        /// α weight of the old value G (0..=1023): α ← (G/1024)·α + (1 − G/1024)·[CNP seen] (`DCQCN.md` §4.6).
        dce_tcp_g as "dce_tcp_g": u64 = 1019,
        /// α update period (µs).
        dce_tcp_rtt as "dce_tcp_rtt": u64 = 1,
        /// α at the first CNP of a flow (x/1024, 1..=1023).
        initial_alpha_value as "initial_alpha_value": u64 = 1023,
        /// RC and RT at the first CNP (Mb/s); 0 keeps the current rate.
        rate_to_set_on_first_cnp as "rate_to_set_on_first_cnp": u64 = 0,
        /// A cut keeps at least this percentage of the rate (0..=100; 50 = at most −50 %).
        rpg_min_dec_fac as "rpg_min_dec_fac": u64 = 50,
        /// Rate floor (Mb/s).
        rpg_min_rate as "rpg_min_rate": u64 = 1,
        /// The limiter is released when RC reaches this rate (Mb/s); 0 = the port speed.
        rpg_max_rate as "rpg_max_rate": u64 = 0,
        /// Cut RC·(1 − α·1024/2^rpg_gd): 11 gives 1 − α/2.
        rpg_gd as "rpg_gd": u64 = 11,
        /// At most one cut per this period (µs), at the period's end, if a CNP arrived in it.
        rate_reduce_monitor_period as "rate_reduce_monitor_period": u64 = 4,
        /// Rate-increase timer (µs).
        rpg_time_reset as "rpg_time_reset": u64 = 300,
        /// Byte counter (bytes; 0 disables it).
        rpg_byte_reset as "rpg_byte_reset": u64 = 32767,
        /// Stage count after which fast recovery ends (F).
        rpg_threshold as "rpg_threshold": u64 = 1,
        /// Additive-increase step (Mb/s).
        rpg_ai_rate as "rpg_ai_rate": u64 = 5,
        /// Hyper-increase step (Mb/s).
        rpg_hai_rate as "rpg_hai_rate": u64 = 50,
        /// RT ← RC at every cut.
        clamp_tgt_rate as "clamp_tgt_rate": bool = false,
        /// RT ← RC at a cut if the last increase since the previous cut was timer-driven.
        clamp_tgt_rate_after_time_inc as "clamp_tgt_rate_after_time_inc": bool = true,
    }
}

param_struct! {
    /// Notification-point settings, under the firmware's `roce_np` names (`DCQCN.md` §2.2, §3). The engine applies
    /// them through [`crate::EngineConfig`] (`cnp_interval`, `cnp_dscp`, `cnp_prio`); the default interval depends
    /// on the profile ([`super::Profile::default_np_interval_us`]).
    NpParams("np", interval_us) {
        /// Minimum time between two CNPs of one QP (µs); a CE mark inside the window is answered at its end
        /// (`DCQCN.md` §2.2 N1–N3). The firmware applies it per port; here it is per QP.
        min_time_between_cnps as "min_time_between_cnps": u64 = interval_us as u64,
        /// DSCP of CNPs (0..=63).
        cnp_dscp as "cnp_dscp": u64 = 48,
        /// 802.1p priority of CNPs (0..=7), reported in `TxMeta::prio` for the driver/scheduler.
        cnp_802p_prio as "cnp_802p_prio": u64 = 6,
    }
}
