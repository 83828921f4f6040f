//! The live status of a recording on stderr, updated at every checkpoint.
//!
//! On a terminal: one line, redrawn in place (`\r`, erase line) at each checkpoint:
//!
//! ```text
//! [  12.3s/30s] PID 1234: RSS 41.2 MiB (+1.2 MiB/s), live 12.0 MiB (+1.1 MiB/s), occupied 34 % of RSS anon; fastest: leak_malloc +1.0 MiB/s; lost 0
//! ```
//!
//! elapsed / `--duration` (just elapsed without one); RSS (VmRSS) and traced live bytes of all
//! traced processes with their trend (change per second over the last [`TREND_WINDOW_S`]
//! seconds, or since the start when shorter); the occupied heap to RSS anon (malloc sites' live
//! bytes and mapping sites' resident bytes, glibc's arena heaps left out, / RssAnon); the site (culprit function) whose live bytes grew
//! fastest since the first checkpoint, with its rate (bytes per second since the first
//! checkpoint); and the events lost so far (the loss counters, `leaktrace_common::counter`).
//!
//! When stderr is not a terminal: the same text as a plain line (`leaktrace: status: ...`) at
//! most every [`PLAIN_EVERY_S`] seconds. `--quiet`: nothing.

use std::cell::Cell;
use std::collections::{HashMap, VecDeque};
use std::io::Write as _;
use std::time::Duration;

use leaktrace_analysis::recording::{Checkpoint, SiteSample, Stack};

/// Trend window: live bytes and RSS per second are measured against the checkpoint at least this
/// many seconds old (the first one while the recording is shorter).
pub const TREND_WINDOW_S: f64 = 10.0;
/// Plain status lines (stderr not a terminal) are printed at most this often, seconds.
pub const PLAIN_EVERY_S: f64 = 10.0;

/// How the status is shown.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StatusMode {
    /// One line redrawn in place (stderr is a terminal).
    Redraw,
    /// A plain line at most every [`PLAIN_EVERY_S`] s.
    Plain,
    /// Nothing (`--quiet`).
    Off,
}

impl StatusMode {
    /// Redraw on a terminal, plain lines otherwise; Off when `enabled` is false.
    pub fn for_stderr(enabled: bool) -> StatusMode {
        // SAFETY: isatty only reads the descriptor's state.
        match (enabled, unsafe { libc::isatty(2) } == 1) {
            (false, _) => StatusMode::Off,
            (true, true) => StatusMode::Redraw,
            (true, false) => StatusMode::Plain,
        }
    }
}

/// What one traced process contributes to a status line.
pub struct ProcessStatus<'a> {
    pub pid: u32,
    /// Live bytes at this checkpoint (all traced sites).
    pub live_bytes: u64,
    /// VmRSS at this checkpoint (0 when unreadable).
    pub rss_bytes: u64,
    /// Symbolized stacks of the process (index = stack id).
    pub stacks: &'a [Stack],
    /// Latest totals per stack id.
    pub last_samples: &'a HashMap<u32, SiteSample>,
    /// The first checkpoint (its site totals are the baseline of "fastest").
    pub first: Option<&'a Checkpoint>,
    /// The checkpoint just taken (its counters give the losses).
    pub latest: Option<&'a Checkpoint>,
}

/// The status line's state across checkpoints.
pub struct Status {
    mode: StatusMode,
    duration: Option<Duration>,
    /// (t_s, live, rss) of recent checkpoints, oldest first.
    history: VecDeque<(f64, u64, u64)>,
    last_plain: Option<f64>,
    /// A redrawn line is on the screen.
    drawn: Cell<bool>,
    /// Growth mode: the bytes are pages first touched by stack ("touched"), not live blocks, and
    /// no occupied-heap share is shown (it needs live blocks).
    growth: bool,
}

impl Status {
    pub fn new(mode: StatusMode, duration: Option<Duration>) -> Status {
        Status { mode, duration, history: VecDeque::new(), last_plain: None, drawn: Cell::new(false), growth: false }
    }

    /// The same status for a growth-mode recording: "touched" (resident pages first touched by
    /// stack) instead of "live", and no occupied-heap share.
    pub fn growth_mode(self, growth: bool) -> Status {
        Status { growth, ..self }
    }

    /// Show the status at a checkpoint taken `t_s` seconds into the recording.
    pub fn update(&mut self, t_s: f64, procs: &[ProcessStatus<'_>]) {
        if self.mode == StatusMode::Off || procs.is_empty() {
            return;
        }
        let text = self.text(t_s, procs);
        let mut err = std::io::stderr().lock();
        match self.mode {
            StatusMode::Redraw => {
                // A line longer than the terminal would wrap, and only its last row be redrawn.
                let text: String = match terminal_columns() {
                    Some(cols) if cols > 1 => text.chars().take(cols - 1).collect(),
                    _ => text,
                };
                let _ = write!(err, "\r\x1b[2K{text}");
                self.drawn.set(true);
            }
            StatusMode::Plain => {
                if self.last_plain.is_none_or(|p| t_s - p >= PLAIN_EVERY_S) {
                    self.last_plain = Some(t_s);
                    let _ = writeln!(err, "leaktrace: status: {text}");
                }
            }
            StatusMode::Off => {}
        }
        let _ = err.flush();
    }

    /// Erase a redrawn line (before other output, and at the end).
    #[allow(clippy::print_stderr, reason = "the status line is the terminal's, drawn on stderr")]
    pub fn clear(&self) {
        if self.drawn.replace(false) {
            eprint!("\r\x1b[2K");
            let _ = std::io::stderr().flush();
        }
    }

    /// The status text (no prefix, no newline); records this checkpoint in the trend history.
    pub fn text(&mut self, t_s: f64, procs: &[ProcessStatus<'_>]) -> String {
        let live: u64 = procs.iter().map(|p| p.live_bytes).sum();
        let rss: u64 = procs.iter().map(|p| p.rss_bytes).sum();
        self.history.push_back((t_s, live, rss));
        // Keep one point at least TREND_WINDOW_S old as the base.
        while self.history.len() > 2 && t_s - self.history[1].0 >= TREND_WINDOW_S {
            self.history.pop_front();
        }
        let (t0, live0, rss0) = self.history[0];
        let dt = t_s - t0;
        let rate = |now: u64, then: u64| -> String {
            if dt <= 0.0 {
                return String::new();
            }
            format!(" ({}/s)", signed_human((now as f64 - then as f64) / dt))
        };
        let elapsed = match self.duration {
            Some(d) => format!("{t_s:6.1}s/{}", humantime::format_duration(Duration::from_secs(d.as_secs().max(1)))),
            None => format!("{t_s:6.1}s"),
        };
        let who = match procs {
            [p] => format!("PID {}", p.pid),
            _ => format!("{} processes", procs.len()),
        };
        let mut s = format!(
            "[{elapsed}] {who}: RSS {}{}, {} {}{}",
            human(rss),
            rate(rss, rss0),
            if self.growth { "touched" } else { "live" },
            human(live),
            rate(live, live0)
        );
        if let Some((occupied, anon)) = occupied(procs).filter(|&(_, anon)| anon > 0 && !self.growth) {
            s.push_str(&format!(", occupied {:.0} % of RSS anon", occupied as f64 * 100.0 / anon as f64));
        }
        if let Some((name, per_s)) = fastest_site(procs, t_s) {
            s.push_str(&format!("; fastest: {name} {}/s", signed_human(per_s)));
        }
        let lost: u64 = procs
            .iter()
            .filter_map(|p| p.latest)
            .map(|c| {
                leaktrace_common::counter::TABLE
                    .iter()
                    .filter(|i| i.is_loss)
                    .map(|i| c.counters.get(i.name).copied().unwrap_or(0))
                    .sum::<u64>()
            })
            .sum();
        s.push_str(&format!("; lost {lost}"));
        s
    }
}

/// Width of the terminal on stderr, in columns (None when unknown).
fn terminal_columns() -> Option<usize> {
    // SAFETY: TIOCGWINSZ writes a winsize into the given struct.
    let mut ws: libc::winsize = unsafe { std::mem::zeroed() };
    // SAFETY: TIOCGWINSZ writes one winsize into the local `ws`.
    let ok = unsafe { libc::ioctl(2, libc::TIOCGWINSZ, &mut ws) } == 0;
    (ok && ws.ws_col > 0).then_some(ws.ws_col as usize)
}

/// The culprit function whose live bytes grew most since the first checkpoint, and that growth
/// per second of `t_s`. None before any growth.
/// The occupied heap and RSS anon of the processes at their latest checkpoint, bytes: live bytes
/// of the malloc sites plus the resident bytes of the mapping sites (their mapped bytes when none
/// was read), glibc's arena heaps left out (their blocks are counted at their malloc sites). The
/// report's figure splits it by kind and takes the runtime's own figure for a managed heap where
/// it has one. None when no process has memory figures.
fn occupied(procs: &[ProcessStatus<'_>]) -> Option<(u64, u64)> {
    let mut out: Option<(u64, u64)> = None;
    for p in procs {
        let Some(m) = p.latest.and_then(|c| c.memory.as_ref()) else { continue };
        let mut bytes = 0u64;
        for (id, s) in p.last_samples {
            let st = p
                .stacks
                .get(*id as usize)
                .filter(|st| st.id == *id)
                .or_else(|| p.stacks.iter().find(|st| st.id == *id));
            let map = st.filter(|st| st.kind != leaktrace_analysis::recording::StackKind::Malloc);
            if map.is_some_and(leaktrace_analysis::runtimes::is_malloc_arena_mapping) {
                continue;
            }
            let live = s.live_bytes();
            bytes = bytes.saturating_add(if map.is_some() { s.resident_bytes.unwrap_or(live) } else { live });
        }
        let (o, a) = out.unwrap_or((0, 0));
        out = Some((o.saturating_add(bytes), a.saturating_add(m.rss_anon_bytes)));
    }
    out
}

fn fastest_site(procs: &[ProcessStatus<'_>], t_s: f64) -> Option<(String, f64)> {
    if t_s <= 0.0 {
        return None;
    }
    let mut best: Option<(i128, &Stack)> = None;
    for p in procs {
        let mut first: HashMap<u32, u64> = HashMap::new();
        if let Some(c) = p.first {
            for s in &c.sites {
                *first.entry(s.stack).or_default() += s.live_bytes();
            }
        }
        for (id, s) in p.last_samples {
            let growth = s.live_bytes() as i128 - first.get(id).copied().unwrap_or(0) as i128;
            if growth > 0
                && best.is_none_or(|(g, _)| growth > g)
                && let Some(st) = p
                    .stacks
                    .get(*id as usize)
                    .filter(|st| st.id == *id)
                    .or_else(|| p.stacks.iter().find(|st| st.id == *id))
            {
                best = Some((growth, st));
            }
        }
    }
    best.map(|(g, st)| (leaktrace_analysis::analyze::culprit(st).1, g as f64 / t_s))
}

/// Bytes with a binary unit, one decimal (leaktrace-analysis's `human::bytes`).
fn human(b: u64) -> String {
    leaktrace_analysis::human::bytes(b)
}

/// `+1.2 MiB` / `-3 B`.
fn signed_human(v: f64) -> String {
    let sign = if v < 0.0 { "-" } else { "+" };
    format!("{sign}{}", human(v.abs().round() as u64))
}

#[cfg(test)]
mod tests {
    use super::*;
    use leaktrace_analysis::recording::Frame;

    fn stack(id: u32, f: &str) -> Stack {
        Stack {
            id,
            kind: leaktrace_analysis::recording::StackKind::Malloc,
            frames: vec![
                Frame { function: Some("malloc".into()), object: Some("/lib/libc.so.6".into()), ..Default::default() }
                    .into(),
                Frame { function: Some(f.into()), object: Some("/bin/x".into()), ..Default::default() }.into(),
            ],
            lost: false,
            truncated: None,
            shared: false,
        }
    }

    fn sample(stack: u32, live: u64) -> SiteSample {
        SiteSample { stack, alloc_bytes: live, alloc_count: 1, ..Default::default() }
    }

    #[test]
    fn line_has_trends_fastest_and_losses() {
        let stacks = vec![stack(0, "cache_put"), stack(1, "leak_malloc")];
        let first = Checkpoint { t_s: 0.0, sites: vec![sample(0, 1000), sample(1, 0)], ..Default::default() };
        let mut latest = Checkpoint { t_s: 4.0, ..Default::default() };
        latest.counters.insert("missed_return".into(), 3);
        latest.counters.insert("allocs".into(), 1000);
        let mut last = HashMap::new();
        last.insert(0, sample(0, 2000));
        last.insert(1, sample(1, 4096));
        let mut st = Status::new(StatusMode::Plain, Some(Duration::from_secs(30)));
        let p = |live, rss| ProcessStatus {
            pid: 42,
            live_bytes: live,
            rss_bytes: rss,
            stacks: &stacks,
            last_samples: &last,
            first: Some(&first),
            latest: Some(&latest),
        };
        let t0 = st.text(0.0, &[p(1000, 1 << 20)]);
        assert!(t0.starts_with("[   0.0s/30s] PID 42: RSS 1.0 MiB, live 1000 B"), "{t0}");
        let t = st.text(4.0, &[p(6096, (1 << 20) + 8192)]);
        assert_eq!(
            t,
            "[   4.0s/30s] PID 42: RSS 1.0 MiB (+2.0 KiB/s), live 6.0 KiB (+1.2 KiB/s); fastest: leak_malloc +1.0 KiB/s; lost 3"
        );
        // With memory figures: the occupied heap (6,096 B live) against RSS anon (12,192 B).
        let mut with_memory = latest.clone();
        with_memory.memory =
            Some(leaktrace_analysis::recording::ProcMemory { rss_anon_bytes: 12_192, ..Default::default() });
        let t = st.text(5.0, &[ProcessStatus { latest: Some(&with_memory), ..p(6096, (1 << 20) + 8192) }]);
        assert!(t.contains("live 6.0 KiB (+1019 B/s), occupied 50 % of RSS anon; fastest"), "{t}");
    }

    /// Growth mode measures resident pages first touched by stack, not live blocks:
    /// the line says "touched" and shows no occupied-heap share.
    #[test]
    fn growth_mode_says_touched_not_live() {
        let stacks = vec![stack(0, "handle_request")];
        let mut latest = Checkpoint { t_s: 2.0, ..Default::default() };
        latest.memory =
            Some(leaktrace_analysis::recording::ProcMemory { rss_anon_bytes: 1 << 20, ..Default::default() });
        let last = HashMap::from([(0, sample(0, 8192))]);
        let mut st = Status::new(StatusMode::Plain, None).growth_mode(true);
        let p = ProcessStatus {
            pid: 7,
            live_bytes: 8192,
            rss_bytes: 2 << 20,
            stacks: &stacks,
            last_samples: &last,
            first: None,
            latest: Some(&latest),
        };
        let t = st.text(2.0, &[p]);
        assert!(t.starts_with("[   2.0s] PID 7: RSS 2.0 MiB, touched 8.0 KiB"), "{t}");
        assert!(!t.contains("live") && !t.contains("occupied"), "{t}");
    }

    #[test]
    fn trend_window_slides() {
        let mut st = Status::new(StatusMode::Plain, None);
        let none: HashMap<u32, SiteSample> = HashMap::new();
        let p = |live| ProcessStatus {
            pid: 1,
            live_bytes: live,
            rss_bytes: 0,
            stacks: &[],
            last_samples: &none,
            first: None,
            latest: None,
        };
        for k in 0..=30u64 {
            st.text(k as f64, &[p(k * 100)]);
        }
        // The base is the newest point at least 10 s old: t = 20 → 100 B/s.
        let t = st.text(31.0, &[p(3100)]);
        assert!(t.contains("live 3.0 KiB (+100 B/s)"), "{t}");
        assert!(t.starts_with("[  31.0s] PID 1: RSS 0 B"), "{t}");
    }
}
