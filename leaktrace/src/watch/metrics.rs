//! `watch --metrics-listen ADDR`: the Prometheus text exposition format (version 0.0.4) on
//! `GET /metrics`, served by one thread from [`WatchState`] as it is at the scrape. Per process
//! (labels `pid`, `comm`, and `pod`, `namespace`, `container` when it runs in a kubelet pod):
//!
//! - `leaktrace_process_rss_bytes{kind="anon|file|shmem"}`: its last memory sample (bytes,
//!   /proc/PID/status, sampled every second);
//! - `leaktrace_process_growth_bytes_per_second`: the last growth-mode window's steady slope of
//!   RssAnon (the analysis' `rss_anon_trend`, bytes per second);
//! - `leaktrace_process_verdict{verdict="…"}` 1: the last window's verdict (the same analysis
//!   as `record`'s);
//! - `leaktrace_process_escalations_total`, `leaktrace_process_oom_killed`,
//!   `leaktrace_process_lost_events` (events lost in the last window).
//!
//! And for the agent: `leaktrace_agent_cpu_seconds_total`, `leaktrace_agent_resident_bytes`,
//! `leaktrace_watched_processes`, `leaktrace_escalations_running`, `leaktrace_windows_total`,
//! `leaktrace_oom_kills_total`, `leaktrace_escalations_refused_total` (`--max-cpu`).

use std::fmt::Write as _;
use std::io::{Read as _, Write as _};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::state::{Proc, WatchState};

/// Serve the metrics of `state` on `listener` from a background thread, one connection at a
/// time (each bounded by a 2 s read and write timeout), until the process ends.
pub fn serve(listener: TcpListener, state: Arc<Mutex<WatchState>>) {
    let busy = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            // Each connection on its own thread: an idle client (a connection opened and never
            // written to) holds only its own thread until its 2 s timeout, not the next scrape.
            // At most MAX_CONNECTIONS at once; past that a connection is closed at once.
            if busy.fetch_add(1, Ordering::SeqCst) >= MAX_CONNECTIONS {
                busy.fetch_sub(1, Ordering::SeqCst);
                continue;
            }
            let (state, busy) = (state.clone(), busy.clone());
            std::thread::spawn(move || {
                let _ = answer(stream, &state);
                busy.fetch_sub(1, Ordering::SeqCst);
            });
        }
    });
}

/// Connections served at once by the metrics endpoint.
const MAX_CONNECTIONS: usize = 16;

/// One request: `GET /metrics` gets the exposition, anything else 404.
fn answer(mut stream: TcpStream, state: &Mutex<WatchState>) -> std::io::Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    stream.set_write_timeout(Some(Duration::from_secs(2)))?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 1024];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") && buf.len() < 16 * 1024 {
        let n = stream.read(&mut chunk)?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let request = String::from_utf8_lossy(&buf);
    let path = request.split_whitespace().nth(1).unwrap_or("");
    let (status, body) = if path == "/metrics" || path.starts_with("/metrics?") {
        let text = match state.lock() {
            Ok(s) => render(&s, &agent_figures()),
            Err(_) => String::new(),
        };
        ("200 OK", text)
    } else {
        ("404 Not Found", "leaktrace watch serves /metrics\n".to_string())
    };
    write!(
        stream,
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

/// The agent's own figures: CPU seconds (user + system, /proc/self/stat) and resident bytes.
#[derive(Clone, Copy, Debug, Default)]
pub struct AgentFigures {
    pub cpu_seconds: f64,
    pub resident_bytes: u64,
}

/// [`AgentFigures`] of this process now.
pub fn agent_figures() -> AgentFigures {
    let cpu_seconds = std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|s| {
            // Fields after the command's closing parenthesis: utime and stime are the 12th and 13th.
            let rest = s.rsplit_once(')')?.1;
            let f: Vec<&str> = rest.split_whitespace().collect();
            let ticks = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
            // SAFETY: sysconf only reads a constant.
            let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
            Some(ticks / hz)
        })
        .unwrap_or(0.0);
    let resident_bytes = crate::procinfo::memory(std::process::id()).map_or(0, |m| m.rss_bytes);
    AgentFigures { cpu_seconds, resident_bytes }
}

/// A label value escaped as the exposition format wants (backslash, double quote, newline).
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// The label set of a process, without braces: `pid="…",comm="…"[,pod=…,namespace=…,container=…]`.
fn labels(pid: u32, p: &Proc) -> String {
    let mut s = format!("pid=\"{pid}\",comm=\"{}\"", escape(&p.labels.comm));
    for (k, v) in [("pod", &p.labels.pod), ("namespace", &p.labels.namespace), ("container", &p.labels.container)] {
        if let Some(v) = v {
            let _ = write!(s, ",{k}=\"{}\"", escape(v));
        }
    }
    s
}

/// The exposition text of `state` and the agent's figures.
pub fn render(state: &WatchState, agent: &AgentFigures) -> String {
    let mut out = String::new();
    let mut family = |name: &str, kind: &str, help: &str, rows: Vec<(String, String)>| {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for (l, v) in rows {
            if l.is_empty() {
                let _ = writeln!(out, "{name} {v}");
            } else {
                let _ = writeln!(out, "{name}{{{l}}} {v}");
            }
        }
    };
    let live = || state.procs.iter().filter(|(_, p)| !p.gone);
    let mut rss = Vec::new();
    for (pid, p) in live() {
        if let Some(s) = p.series.back() {
            for (kind, v) in [("anon", s.rss_anon), ("file", s.rss_file), ("shmem", s.rss_shmem)] {
                rss.push((format!("{},kind=\"{kind}\"", labels(*pid, p)), v.to_string()));
            }
        }
    }
    family(
        "leaktrace_process_rss_bytes",
        "gauge",
        "Resident memory of a watched process by kind, bytes (/proc/PID/status).",
        rss,
    );
    let verdicts = || live().filter_map(|(pid, p)| p.verdict.as_ref().map(|v| (*pid, p, v)));
    family(
        "leaktrace_process_growth_bytes_per_second",
        "gauge",
        "Steady slope of RssAnon over the last growth-mode window, bytes per second.",
        verdicts().map(|(pid, p, v)| (labels(pid, p), format!("{:.1}", v.growth_bytes_per_s))).collect(),
    );
    family(
        "leaktrace_process_verdict",
        "gauge",
        "The last window's verdict (the same rules as leaktrace record), as the verdict label.",
        verdicts()
            .map(|(pid, p, v)| (format!("{},verdict=\"{}\"", labels(pid, p), escape(&v.class)), "1".into()))
            .collect(),
    );
    family(
        "leaktrace_process_lost_events",
        "gauge",
        "Events lost in the last window (the analysis' losses).",
        verdicts().map(|(pid, p, v)| (labels(pid, p), v.lost_events.to_string())).collect(),
    );
    family(
        "leaktrace_process_escalations_total",
        "counter",
        "Exact windows taken on the process.",
        live().map(|(pid, p)| (labels(*pid, p), p.escalations.to_string())).collect(),
    );
    family(
        "leaktrace_process_oom_killed",
        "gauge",
        "1 when the OOM killer took the process.",
        state.procs.iter().map(|(pid, p)| (labels(*pid, p), u8::from(p.oom_killed).to_string())).collect(),
    );
    let one = |v: String| vec![(String::new(), v)];
    family(
        "leaktrace_agent_cpu_seconds_total",
        "counter",
        "CPU time of leaktrace itself, seconds.",
        one(format!("{:.2}", agent.cpu_seconds)),
    );
    family(
        "leaktrace_agent_resident_bytes",
        "gauge",
        "Resident memory of leaktrace itself, bytes.",
        one(agent.resident_bytes.to_string()),
    );
    family("leaktrace_watched_processes", "gauge", "Processes watched now.", one(live().count().to_string()));
    family("leaktrace_escalations_running", "gauge", "Exact windows running now.", one(state.escalating.to_string()));
    family("leaktrace_windows_total", "counter", "Growth-mode windows completed.", one(state.windows.to_string()));
    family("leaktrace_oom_kills_total", "counter", "OOM kills of watched processes.", one(state.oom_kills.to_string()));
    family(
        "leaktrace_escalations_refused_total",
        "counter",
        "Escalations refused because the agent's CPU was above --max-cpu.",
        one(state.escalations_refused.to_string()),
    );
    out
}

#[cfg(test)]
mod tests {
    use super::super::state::{Labels, Sample, WindowVerdict};
    use super::*;

    #[test]
    fn exposition_has_labels_values_and_escapes() {
        let mut s = WatchState::default();
        let labels = Labels {
            comm: "we\"ird".into(),
            pod: Some("web-1".into()),
            namespace: Some("shop".into()),
            container: None,
        };
        let mut p = Proc::new(labels, std::time::Instant::now());
        p.push_sample(Sample { unix_ms: 1, rss_anon: 4096, rss_file: 8192, rss_shmem: 0 });
        p.set_verdict(WindowVerdict {
            class: "leak".into(),
            sentence: String::new(),
            growth_bytes_per_s: 1234.56,
            lost_events: 3,
        });
        s.procs.insert(7, p);
        let text = render(&s, &AgentFigures { cpu_seconds: 1.5, resident_bytes: 10 });
        let l = r#"pid="7",comm="we\"ird",pod="web-1",namespace="shop""#;
        for line in [
            format!("leaktrace_process_rss_bytes{{{l},kind=\"anon\"}} 4096"),
            format!("leaktrace_process_rss_bytes{{{l},kind=\"file\"}} 8192"),
            format!("leaktrace_process_growth_bytes_per_second{{{l}}} 1234.6"),
            format!("leaktrace_process_verdict{{{l},verdict=\"leak\"}} 1"),
            format!("leaktrace_process_lost_events{{{l}}} 3"),
            "leaktrace_agent_cpu_seconds_total 1.50".to_string(),
            "leaktrace_watched_processes 1".to_string(),
            "# TYPE leaktrace_process_escalations_total counter".to_string(),
        ] {
            assert!(text.lines().any(|x| x == line), "no line {line} in\n{text}");
        }
    }
}
