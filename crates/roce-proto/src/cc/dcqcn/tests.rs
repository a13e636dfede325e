//! Unit tests of the reaction point: the analytic checks of `DCQCN.md` §5.3/§6 E2 for `paper` and `ns3_mlx`, and one
//! test per `nvidia` rule of §2.5. The full trajectories are compared with `rp_reference.py` by
//! `crates/roce-cli/tests/cc_trace.rs`.

use super::*;

const C: f64 = 40e9;

fn us(x: u64) -> Instant {
    Instant::from_micros(x)
}

fn ns(x: u64) -> Instant {
    Instant::from_nanos(x)
}

/// Runs the RP's own timers up to `end`, collecting the events.
fn run_to(rp: &mut Dcqcn, end: Instant, log: &mut Vec<RpEvent>) {
    while let Some(t) = rp.next_timer().filter(|&t| t <= end) {
        rp.on_timer_with(t, &mut |e| log.push(*e));
    }
}

fn nvidia(set: &[(&str, &str)]) -> Dcqcn {
    let mut c = DcqcnConfig::new(Profile::Nvidia, C);
    for (k, v) in set {
        c.set(k, v).unwrap();
    }
    Dcqcn::new(c)
}

#[test]
fn paper_single_cnp_halves_then_fast_recovers() {
    // DCQCN.md §6 E2 / §5.3 paper S1.
    let mut c = DcqcnConfig::new(Profile::Paper, C);
    c.set("B_bytes", "0").unwrap();
    let mut rp = Dcqcn::new(c);
    assert_eq!(rp.next_timer(), None, "R0: no timers before a CNP");
    let mut log = vec![];
    rp.on_cnp_with(us(100), &mut |e| log.push(*e));
    assert_eq!(rp.rc_bps(), C / 2.0);
    assert_eq!(rp.alpha_at(us(100)), 1.0, "(1-g)·1 + g = 1");
    run_to(&mut rp, us(3000), &mut log);
    let steps: Vec<_> = log
        .iter()
        .filter(|e| e.kind == RpEventKind::Timer)
        .take(6)
        .map(|e| (e.at, e.action, e.rc_bps / C))
        .collect();
    let want = [0.75, 0.875, 0.9375, 0.96875, 0.984375, 0.9921875];
    for (k, (at, action, r)) in steps.iter().enumerate() {
        assert_eq!(*at, us(100 + 55 * (k as u64 + 1)));
        assert_eq!(*r, want[k]);
        let a = if k < 5 {
            RpAction::FastRecovery
        } else {
            RpAction::AdditiveIncrease
        };
        assert_eq!(*action, a);
    }
    // α decays every K = 55 µs after the CNP: (1 − 1/256)^52 at 3 ms (§5.3).
    let a = rp.alpha_at(us(3000));
    assert!((a - (1.0 - 1.0 / 256.0f64).powi(52)).abs() < 1e-12, "{a}");
    // Fully recovered: the rate timer stopped.
    assert_eq!(rp.rc_bps(), C);
    assert_eq!(rp.next_timer(), None);
}

#[test]
fn paper_byte_counter_counts_wire_bytes_while_limited() {
    let mut c = DcqcnConfig::new(Profile::Paper, C);
    c.set("B_bytes", "10000").unwrap();
    let mut rp = Dcqcn::new(c);
    rp.on_tx(us(1), 1_000_000);
    assert_eq!(rp.stages(), (0, 0, 0), "no counting before the first CNP");
    rp.on_cnp(us(10));
    assert_eq!(rp.bytes_to_byte_event(), Some(10_000));
    let mut log = vec![];
    for k in 0..10 {
        rp.on_tx_with(us(11 + k), 1000, &mut |e| log.push(*e));
    }
    assert_eq!(log.len(), 1, "{log:?}");
    assert_eq!(log[0].kind, RpEventKind::Byte);
    assert_eq!(log[0].bc_cnt, 1);
    assert_eq!(log[0].rc_bps, 0.75 * C);
    assert_eq!(rp.bytes_to_byte_event(), Some(10_000));
}

#[test]
fn lazy_alpha_equals_stepwise_updates() {
    let a = Alpha {
        value: 0.75,
        at: Some(us(0)),
        flag: true,
    };
    let g = 1.0 / 256.0;
    let mut step = 0.75;
    for k in 1..=5000u64 {
        step = (1.0 - g) * step + if k == 1 { g } else { 0.0 };
        let lazy = a.after(g, k);
        if k <= EXACT_STEPS {
            assert_eq!(lazy, step, "k={k}");
        } else {
            assert!((lazy - step).abs() <= 1e-12 * step, "k={k}");
        }
    }
    // Due counts: inclusive vs strictly before.
    assert_eq!(a.due(1000, ns(3000), true), 3);
    assert_eq!(a.due(1000, ns(3000), false), 2);
    assert_eq!(a.due(1000, ns(2999), true), 2);
}

#[test]
fn ns3_mlx_first_cnp_cuts_4001_ns_later_with_decayed_alpha() {
    // DCQCN.md §2.4 M1-M3, §5.3 ns3_mlx S1.
    let mut rp = Dcqcn::new(DcqcnConfig::new(Profile::Ns3Mlx, C));
    let mut log = vec![];
    rp.on_cnp_with(us(100), &mut |e| log.push(*e));
    assert_eq!(log[0].action, RpAction::FirstCnp);
    assert_eq!(rp.rc_bps(), C, "no cut on the CNP itself");
    run_to(&mut rp, us(200), &mut log);
    let cut = log.iter().find(|e| e.action == RpAction::Cut).unwrap();
    assert_eq!(cut.at, ns(104_001));
    let a4 = (1.0 - 1.0 / 256.0f64).powi(4);
    assert!((cut.rc_bps - C * (1.0 - a4 / 2.0)).abs() < 1e-3);
    // Later CNPs are cut on the same 4-µs grid, 1 ns after the CNP when it sits on a grid point.
    rp.on_cnp_with(us(300), &mut |e| log.push(*e));
    run_to(&mut rp, us(310), &mut log);
    let cuts: Vec<_> = log
        .iter()
        .filter(|e| e.action == RpAction::Cut)
        .map(|e| e.at)
        .collect();
    assert_eq!(cuts, vec![ns(104_001), ns(300_001)]);
}

#[test]
fn profile_names_and_parameter_errors() {
    for p in Profile::ALL {
        assert_eq!(Profile::from_name(p.name()), Some(p));
    }
    let mut c = DcqcnConfig::new(Profile::Paper, C);
    assert!(matches!(
        c.set("rpg_gd", "11"),
        Err(ParamError::Unknown { .. })
    ));
    assert!(matches!(c.set("g", "2"), Err(ParamError::BadValue { .. })));
    assert!(matches!(c.set("F", "x"), Err(ParamError::BadValue { .. })));
    c.set("F", "1e1").unwrap();
    assert!(c.params().contains(&("F", ParamValue::U64(10))));
    let mut n = DcqcnConfig::new(Profile::Nvidia, C);
    assert!(matches!(
        n.set("dce_tcp_g", "1024"),
        Err(ParamError::BadValue { .. })
    ));
    assert!(matches!(
        n.set("K_us", "5"),
        Err(ParamError::Unknown { .. })
    ));
    assert_eq!(n.names().len(), n.params().len());
}

// ------------------------------------------------------------------------------------------ nvidia, one per §2.5 rule

#[test]
fn nvidia_first_cnp_allocates_the_limiter_at_rate_to_set_on_first_cnp() {
    // 0 (default): keep the current rate (full speed).
    let mut rp = nvidia(&[]);
    assert!(!rp.is_limited());
    rp.on_cnp(us(10));
    assert!(rp.is_limited());
    assert_eq!((rp.rc_bps(), rp.rt_bps()), (C, C));
    // A set value becomes RC and RT at once.
    let mut rp = nvidia(&[("rate_to_set_on_first_cnp", "10000")]);
    rp.on_cnp(us(10));
    assert_eq!((rp.rc_bps(), rp.rt_bps()), (10e9, 10e9));
}

#[test]
fn nvidia_alpha_is_resampled_every_dce_tcp_rtt_from_the_cnp_bit() {
    // α ← (G/1024)·α + (1 − G/1024) with a CNP in the period, (G/1024)·α without (DCQCN.md §4.6).
    let mut rp = nvidia(&[("dce_tcp_rtt", "2"), ("dce_tcp_g", "1000")]);
    let keep = 1000.0 / 1024.0;
    rp.on_cnp(us(0));
    let a0 = 1023.0 / 1024.0;
    assert_eq!(rp.alpha_at(us(0)), a0, "initial_alpha_value");
    // No CNP in (0, 2]: one decay at 2 µs.
    assert_eq!(rp.alpha_at(us(2)), keep * a0);
    assert_eq!(rp.alpha_at(us(3)), keep * a0);
    // A CNP at 5 µs: the update at 6 µs adds 1 − G/1024, later ones decay.
    rp.on_cnp(us(5));
    let a4 = keep * keep * a0;
    let a6 = keep * a4 + (1.0 - keep);
    assert_eq!(rp.alpha_at(us(6)), a6);
    assert_eq!(rp.alpha_at(us(8)), keep * a6);
}

#[test]
fn nvidia_cuts_at_most_once_per_rate_reduce_monitor_period() {
    let mut rp = nvidia(&[("rate_reduce_monitor_period", "10")]);
    let mut log = vec![];
    // Ten CNPs inside the first period: one cut, at its end.
    for k in 0..10 {
        rp.on_cnp_with(us(100 + k), &mut |e| log.push(*e));
    }
    run_to(&mut rp, us(135), &mut log);
    let cuts: Vec<_> = log
        .iter()
        .filter(|e| e.action == RpAction::Cut)
        .map(|e| e.at)
        .collect();
    assert_eq!(cuts, vec![us(110)]);
    // A CNP later is cut at the end of its period (grid 110 + 10k), not at once.
    rp.on_cnp_with(us(143), &mut |e| log.push(*e));
    assert_eq!(rp.next_timer(), Some(us(150)));
    run_to(&mut rp, us(200), &mut log);
    let cuts: Vec<_> = log
        .iter()
        .filter(|e| e.action == RpAction::Cut)
        .map(|e| e.at)
        .collect();
    assert_eq!(cuts, vec![us(110), us(150)]);
}

#[test]
fn nvidia_cut_is_rc_times_one_minus_alpha_over_gd_bounded_by_min_dec_fac_and_min_rate() {
    // rpg_gd = 11 ⇒ 1 − α/2; α at the cut = initial 1023/1024 decayed 4 times (dce_tcp_rtt = 1, period 4).
    let mut rp = nvidia(&[]);
    rp.on_cnp(us(0));
    rp.on_timer(us(4));
    let keep: f64 = 1019.0 / 1024.0;
    let a = (1023.0 / 1024.0) * keep.powi(4);
    assert!(
        (rp.rc_bps() - C * (1.0 - a / 2.0)).abs() < 1.0,
        "{}",
        rp.rc_bps()
    );
    // rpg_gd = 10 ⇒ 1 − α (a ~100 % cut) — bounded by rpg_min_dec_fac = 50 ⇒ 50 %.
    let mut rp = nvidia(&[("rpg_gd", "10")]);
    rp.on_cnp(us(0));
    rp.on_timer(us(4));
    assert_eq!(rp.rc_bps(), C * 0.5);
    // rpg_gd = 12 ⇒ 1 − α/4.
    let mut rp = nvidia(&[("rpg_gd", "12")]);
    rp.on_cnp(us(0));
    rp.on_timer(us(4));
    assert!((rp.rc_bps() - C * (1.0 - a / 4.0)).abs() < 1.0);
    // rpg_min_rate floors the cut (Mb/s).
    let mut rp = nvidia(&[("rate_to_set_on_first_cnp", "100"), ("rpg_min_rate", "80")]);
    rp.on_cnp(us(0));
    rp.on_timer(us(4));
    assert_eq!(rp.rc_bps(), 80e6);
}

#[test]
fn nvidia_increases_by_timer_and_byte_counter_with_threshold_phases() {
    // F = rpg_threshold = 1: FR while max(T, BC) ≤ 1, AI while min(T, BC) ≤ 1 < max, HAI (i·rpg_hai_rate) when both
    // exceed it.
    let mut rp = nvidia(&[
        ("rpg_byte_reset", "1000"),
        ("rpg_time_reset", "100"),
        ("rate_to_set_on_first_cnp", "20000"),
    ]);
    let mut log = vec![];
    rp.on_cnp(us(0));
    rp.on_timer(us(4)); // cut
    let (rc0, rt0) = (rp.rc_bps(), rp.rt_bps());
    assert_eq!(rt0, 20e9, "no clamp: no increase before the first cut");
    rp.on_tx_with(us(5), 1000, &mut |e| log.push(*e)); // BC = 1: FR
    assert_eq!(log[0].action, RpAction::FastRecovery);
    assert_eq!(rp.rc_bps(), (rt0 + rc0) / 2.0);
    rp.on_tx_with(us(6), 1000, &mut |e| log.push(*e)); // BC = 2 > F, T = 0: AI
    assert_eq!(log[1].action, RpAction::AdditiveIncrease);
    assert_eq!(rp.rt_bps(), rt0 + 5e6);
    run_to(&mut rp, us(104), &mut log); // T = 1 at 104 µs: min(T, BC) = 1 ≤ F: AI
    assert_eq!(log[2].kind, RpEventKind::Timer);
    assert_eq!(log[2].action, RpAction::AdditiveIncrease);
    run_to(&mut rp, us(204), &mut log); // T = 2: min = 2 > F: HAI with i = 1
    assert_eq!(log[3].action, RpAction::HyperIncrease);
    assert_eq!(rp.rt_bps(), rt0 + 2.0 * 5e6 + 50e6);
    rp.on_tx_with(us(205), 1000, &mut |e| log.push(*e)); // BC = 3, T = 2: i = 1
    rp.on_tx_with(us(206), 1000, &mut |e| log.push(*e)); // BC = 4
    run_to(&mut rp, us(304), &mut log); // T = 3: i = min(3, 4) − 1 = 2
    assert_eq!(
        rp.rt_bps(),
        rt0 + 2.0 * 5e6 + 50e6 + 50e6 + 50e6 + 2.0 * 50e6
    );
}

#[test]
fn nvidia_target_clamp_follows_clamp_tgt_rate_and_after_time_inc() {
    // Default (clamp_tgt_rate 0, after_time_inc 1): RT ← RC only if the last increase was timer-driven.
    let run = |set: &[(&str, &str)], timer_last: bool| {
        let mut rp = nvidia(
            &[
                &[
                    ("rpg_byte_reset", "1000"),
                    ("rpg_time_reset", "100"),
                    ("rate_to_set_on_first_cnp", "20000"),
                ],
                set,
            ]
            .concat(),
        );
        rp.on_cnp(us(0));
        rp.on_timer(us(4));
        // Timer increase at 104 µs, or a byte-counter increase at 50 µs; then a CNP before the next one.
        let (inc, cnp, cut) = if timer_last {
            (us(104), us(110), us(112))
        } else {
            (us(50), us(61), us(64))
        };
        if timer_last {
            rp.on_timer(inc);
        } else {
            rp.on_tx(inc, 1000);
        }
        let rc_before = rp.rc_bps();
        rp.on_cnp(cnp);
        assert_eq!(rp.next_timer(), Some(cut));
        rp.on_timer(cut);
        (rc_before, rp.rt_bps())
    };
    let (rc, rt) = run(&[], true);
    assert_eq!(rt, rc, "timer-driven increase: clamped");
    let (rc, rt) = run(&[], false);
    assert!(rt > rc, "byte-driven increase: RT kept ({rt} vs {rc})");
    let (rc, rt) = run(&[("clamp_tgt_rate", "1")], false);
    assert_eq!(rt, rc, "clamp_tgt_rate = 1: always");
    let (rc, rt) = run(&[("clamp_tgt_rate_after_time_inc", "0")], true);
    assert!(rt > rc, "no clamp at all");
}

#[test]
fn nvidia_releases_the_limiter_at_rpg_max_rate() {
    let mut rp = nvidia(&[("rpg_max_rate", "39000"), ("rpg_byte_reset", "0")]);
    let mut log = vec![];
    rp.on_cnp(us(0));
    run_to(&mut rp, us(100_000), &mut log);
    assert!(!rp.is_limited(), "{rp:?}");
    assert_eq!(rp.rc_bps(), C, "released: unlimited again");
    assert_eq!(rp.next_timer(), None);
    let release = log.iter().position(|e| e.rc_bps >= 39e9).unwrap();
    assert_eq!(release, log.len() - 1, "nothing after the release");
    // The next CNP is a first CNP again (α restarts at initial_alpha_value).
    let mut first = vec![];
    rp.on_cnp_with(us(200_000), &mut |e| first.push(*e));
    assert_eq!(first[0].action, RpAction::FirstCnp);
    assert_eq!(first[0].alpha, 1023.0 / 1024.0);
}

#[test]
fn rates_stay_within_floor_and_line_under_cnp_storms() {
    // DCQCN.md §6 E7.4/5 for every profile.
    for p in Profile::ALL {
        let mut rp = Dcqcn::new(DcqcnConfig::new(p, C));
        let mut t = 0u64;
        let mut check = |e: &RpEvent| {
            assert!(e.rc_bps <= C && e.rt_bps <= C, "{p}: {e:?}");
            assert!(e.rc_bps >= 1e6 * 0.999, "{p}: {e:?}");
            assert!((0.0..=1.0).contains(&e.alpha), "{p}: {e:?}");
        };
        for k in 0..2000u64 {
            t += 7 + (k * 13) % 50;
            rp.on_cnp_with(us(t), &mut check);
            rp.on_tx_with(
                us(t) + core::time::Duration::from_nanos(500),
                4096,
                &mut check,
            );
            if let Some(d) = rp.next_timer().filter(|&d| d <= us(t + 3)) {
                rp.on_timer_with(d, &mut check);
            }
        }
    }
}
