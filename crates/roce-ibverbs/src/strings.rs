//! The pure helpers of libibverbs: enum-to-string (`ibv_node_type_str`, `ibv_port_state_str`,
//! `ibv_event_type_str`) and the static-rate conversions (`ibv_rate_to_mult`, `mult_to_ibv_rate`,
//! `ibv_rate_to_mbps`, `mbps_to_ibv_rate`). The strings and numbers are the ones rdma-core 44 answers
//! (`libibverbs/enum_strs.c`, `libibverbs/verbs.c`; enum values from `<infiniband/verbs.h>`): programs print them
//! and compare them, so `tests/c/strings.c` checks every input against Debian's own libibverbs.

use core::ffi::{CStr, c_char, c_int};

versioned! {
    "IBVERBS_1.0": [ibv_rate_to_mult, mult_to_ibv_rate]
    "IBVERBS_1.1": [ibv_node_type_str, ibv_port_state_str, ibv_event_type_str, ibv_rate_to_mbps, mbps_to_ibv_rate]
}

/// `s` for `i` in `0..table.len()` when present, else `"unknown"` (rdma-core's answer out of range).
fn lookup(table: &[Option<&'static CStr>], i: c_int) -> *const c_char {
    usize::try_from(i)
        .ok()
        .and_then(|i| table.get(i).copied().flatten())
        .unwrap_or(c"unknown")
        .as_ptr()
}

/// `ibv_node_type_str(enum ibv_node_type)`: CA 1 … UNSPECIFIED 7; anything else (UNKNOWN -1 …) is `"unknown"`.
#[unsafe(no_mangle)]
pub extern "C" fn rocev2_ibv_node_type_str(node_type: c_int) -> *const c_char {
    const T: [Option<&CStr>; 8] = [
        None,
        Some(c"InfiniBand channel adapter"),
        Some(c"InfiniBand switch"),
        Some(c"InfiniBand router"),
        Some(c"iWARP NIC"),
        Some(c"usNIC"),
        Some(c"usNIC UDP"),
        Some(c"unspecified"),
    ];
    lookup(&T, node_type)
}

/// `ibv_port_state_str(enum ibv_port_state)`: NOP 0 … ACTIVE_DEFER 5.
#[unsafe(no_mangle)]
pub extern "C" fn rocev2_ibv_port_state_str(port_state: c_int) -> *const c_char {
    const T: [Option<&CStr>; 6] = [
        Some(c"no state change (NOP)"),
        Some(c"down"),
        Some(c"init"),
        Some(c"armed"),
        Some(c"active"),
        Some(c"active defer"),
    ];
    lookup(&T, port_state)
}

/// `ibv_event_type_str(enum ibv_event_type)`: CQ_ERR 0 … WQ_FATAL 19.
#[unsafe(no_mangle)]
pub extern "C" fn rocev2_ibv_event_type_str(event: c_int) -> *const c_char {
    const T: [Option<&CStr>; 20] = [
        Some(c"CQ error"),
        Some(c"local work queue catastrophic error"),
        Some(c"invalid request local work queue error"),
        Some(c"local access violation work queue error"),
        Some(c"communication established"),
        Some(c"send queue drained"),
        Some(c"path migrated"),
        Some(c"path migration request error"),
        Some(c"local catastrophic error"),
        Some(c"port active"),
        Some(c"port error"),
        Some(c"LID change"),
        Some(c"P_Key change"),
        Some(c"SM change"),
        Some(c"SRQ catastrophic error"),
        Some(c"SRQ limit reached"),
        Some(c"last WQE reached"),
        Some(c"client reregistration"),
        Some(c"GID table change"),
        Some(c"WQ fatal"),
    ];
    lookup(&T, event)
}

/// `(enum ibv_rate, multiple of 2.5 Gb/s or -1, Mb/s)` for every rate of rdma-core 44's `enum ibv_rate`
/// (`IBV_RATE_MAX` 0 is not a rate). rdma-core 44 gives the rates 14 … 300 Gb/s (enum values 11 … 18) no multiple.
const RATES: [(c_int, c_int, c_int); 23] = [
    (2, 1, 2_500),        // 2.5
    (5, 2, 5_000),        // 5
    (3, 4, 10_000),       // 10
    (6, 8, 20_000),       // 20
    (4, 12, 30_000),      // 30
    (7, 16, 40_000),      // 40
    (8, 24, 60_000),      // 60
    (9, 32, 80_000),      // 80
    (10, 48, 120_000),    // 120
    (11, -1, 14_062),     // 14 (FDR 1x)
    (12, -1, 56_250),     // 56
    (13, -1, 112_500),    // 112
    (14, -1, 168_750),    // 168
    (15, -1, 25_781),     // 25 (EDR 1x)
    (16, -1, 103_125),    // 100
    (17, -1, 206_250),    // 200
    (18, -1, 309_375),    // 300
    (19, 11, 28_125),     // 28
    (20, 20, 53_125),     // 50
    (21, 160, 425_000),   // 400
    (22, 240, 637_500),   // 600
    (23, 320, 850_000),   // 800
    (24, 480, 1_275_000), // 1200
];

/// `IBV_RATE_MAX`: "no rate" in the reverse conversions.
const IBV_RATE_MAX: c_int = 0;

/// `ibv_rate_to_mult(rate)`: the rate as a multiple of 2.5 Gb/s, -1 for an unknown rate.
#[unsafe(no_mangle)]
pub extern "C" fn rocev2_ibv_rate_to_mult(rate: c_int) -> c_int {
    RATES.iter().find(|r| r.0 == rate).map_or(-1, |r| r.1)
}

/// `mult_to_ibv_rate(mult)`: the rate for a multiple of 2.5 Gb/s, `IBV_RATE_MAX` when none.
#[unsafe(no_mangle)]
pub extern "C" fn rocev2_mult_to_ibv_rate(mult: c_int) -> c_int {
    RATES
        .iter()
        .find(|r| r.1 == mult && mult > 0)
        .map_or(IBV_RATE_MAX, |r| r.0)
}

/// `ibv_rate_to_mbps(rate)`: the rate in Mb/s, -1 for an unknown rate.
#[unsafe(no_mangle)]
pub extern "C" fn rocev2_ibv_rate_to_mbps(rate: c_int) -> c_int {
    RATES.iter().find(|r| r.0 == rate).map_or(-1, |r| r.2)
}

/// `mbps_to_ibv_rate(mbps)`: the rate of exactly `mbps` Mb/s, `IBV_RATE_MAX` when none.
#[unsafe(no_mangle)]
pub extern "C" fn rocev2_mbps_to_ibv_rate(mbps: c_int) -> c_int {
    RATES
        .iter()
        .find(|r| r.2 == mbps)
        .map_or(IBV_RATE_MAX, |r| r.0)
}
