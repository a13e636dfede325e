//! `--metrics ADDR`: serves the engine counters in the OpenMetrics text format for Prometheus while a perf run is
//! going on. The engine's counters stay plain `u64`s; each scrape snapshots them on the engine thread and copies
//! them into a fresh prometheus-client registry (zero hot-path cost, `docs/DEPENDENCIES.md`). The HTTP side is a tiny
//! std `TcpListener` responder thread: every request gets the metrics.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use roce_proto::Counters;
use roce_verbs::Context;

type Labels = Vec<(String, String)>;

/// Renders `devices` (label `side`) as OpenMetrics text.
pub fn render(devices: &[(String, Context)]) -> String {
    let mut reg = Registry::with_prefix("rocev2");
    let snaps: Vec<(String, Option<Counters>)> = devices
        .iter()
        .map(|(side, ctx)| (side.clone(), ctx.counters().ok()))
        .collect();
    for name in Counters::NAMES {
        let fam = Family::<Labels, Counter>::default();
        for (side, c) in &snaps {
            if let Some(v) = c.as_ref().and_then(|c| c.get(name)) {
                fam.get_or_create(&vec![("side".to_owned(), side.clone())])
                    .inc_by(v);
            }
        }
        reg.register(*name, format!("engine counter {name}"), fam);
    }
    // The runtime's own counters (`roce_verbs::RuntimeStats`): doorbells and WQEs (WQEs per doorbell), link I/O calls
    // and their packets on both sides (packets per I/O call), posts held back by doorbell batching.
    type Pick = fn(&roce_verbs::RuntimeStats) -> &std::sync::atomic::AtomicU64;
    let runtime: [(&str, &str, Pick); 7] = [
        ("runtime_doorbells", "doorbells rung (post calls)", |r| {
            &r.doorbells
        }),
        ("runtime_wqes", "WQEs posted", |r| &r.wqes),
        (
            "runtime_tx_io_calls",
            "link transmit calls (flushes with frames)",
            |r| &r.flushes,
        ),
        ("runtime_tx_frames", "frames transmitted", |r| &r.tx_frames),
        (
            "runtime_rx_io_calls",
            "link receive calls (bursts with frames)",
            |r| &r.rx_bursts,
        ),
        ("runtime_rx_frames", "frames received", |r| &r.rx_frames),
        (
            "runtime_batched_posts",
            "posts held back by doorbell batching",
            |r| &r.batched_posts,
        ),
    ];
    for (name, help, pick) in runtime {
        let fam = Family::<Labels, Counter>::default();
        for (side, ctx) in devices {
            fam.get_or_create(&vec![("side".to_owned(), side.clone())])
                .inc_by(pick(ctx.runtime_stats()).load(Ordering::Relaxed));
        }
        reg.register(name, help, fam);
    }
    // The longest gap between two passes while a timer was armed (`RuntimeStats::max_pass_gap_us`): a gauge.
    let gap = Family::<Labels, Gauge>::default();
    for (side, ctx) in devices {
        let v = ctx.runtime_stats().max_pass_gap_us.load(Ordering::Relaxed);
        gap.get_or_create(&vec![("side".to_owned(), side.clone())])
            .set(i64::try_from(v).unwrap_or(i64::MAX));
    }
    reg.register(
        "runtime_max_pass_gap_us",
        "longest gap between two engine passes while a timer was armed (µs)",
        gap,
    );
    let mut out = String::new();
    if encode(&mut out, &reg).is_err() {
        out.clear();
    }
    out
}

/// Where the responder finds the devices to export at each scrape (`(side label, device)` pairs; a perf run adds
/// its devices as it opens them).
pub type DeviceSource = Arc<dyn Fn() -> Vec<(String, Context)> + Send + Sync>;

/// The responder thread; stops when dropped.
#[derive(Debug)]
pub struct MetricsServer {
    stop: Arc<AtomicBool>,
    join: Option<JoinHandle<()>>,
    addr: SocketAddr,
}

impl MetricsServer {
    /// Binds `addr` and starts serving the devices `devices` returns at each scrape.
    pub fn start(addr: &str, devices: DeviceSource) -> std::io::Result<MetricsServer> {
        let l = TcpListener::bind(addr)?;
        let local = l.local_addr()?;
        l.set_nonblocking(true)?;
        let stop = Arc::new(AtomicBool::new(false));
        let st = Arc::clone(&stop);
        let join = std::thread::Builder::new()
            .name("rocev2-metrics".into())
            .spawn(move || {
                while !st.load(Ordering::Relaxed) {
                    match l.accept() {
                        Ok((s, _)) => serve(s, &devices()),
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                            std::thread::sleep(Duration::from_millis(20));
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(20)),
                    }
                }
            })?;
        Ok(MetricsServer {
            stop,
            join: Some(join),
            addr: local,
        })
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(j) = self.join.take() {
            let _ = j.join();
        }
    }
}

fn serve(mut s: TcpStream, devices: &[(String, Context)]) {
    let _ = s.set_nonblocking(false);
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    let _ = s.set_write_timeout(Some(Duration::from_secs(2)));
    // Read the request head (up to the blank line or 8 KiB); its content does not matter.
    let mut buf = [0u8; 8192];
    let mut got = 0;
    while got < buf.len() {
        match s.read(&mut buf[got..]) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                got += n;
                if buf[..got].windows(4).any(|w| w == b"\r\n\r\n") {
                    break;
                }
            }
        }
    }
    let body = render(devices);
    let head = format!(
        "HTTP/1.0 200 OK\r\nContent-Type: application/openmetrics-text; version=1.0.0; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let _ = s.write_all(head.as_bytes());
    let _ = s.write_all(body.as_bytes());
}
