//! Synthetic recordings with known truth, shared by the analysis, report, check and compare
//! tests.

use std::collections::BTreeMap;

use crate::recording::{Checkpoint, Frame, ProcMemory, Recording, SiteSample, Stack, StackKind};

/// A named frame in `object`, optionally with file:line.
pub(crate) fn frame(function: &str, object: &str, file: Option<(&str, u32)>) -> Frame {
    Frame {
        addr: 0x1000 + function.len() as u64 * 0x10,
        object: Some(object.to_string()),
        function: Some(function.to_string()),
        file: file.map(|f| f.0.to_string()),
        line: file.map(|f| f.1),
        inlined: false,
        ..Default::default()
    }
}

/// A stack of `kind` with `frames` (innermost first), neither lost nor truncated.
pub(crate) fn site_stack(id: u32, kind: StackKind, frames: Vec<std::sync::Arc<Frame>>) -> Stack {
    Stack { id, kind, frames, lost: false, truncated: None, shared: false }
}

/// A malloc stack of `function` (in the fixture's executable, server.c:10) calling malloc.
pub(crate) fn server_stack(id: u32, function: &str) -> Stack {
    site_stack(
        id,
        StackKind::Malloc,
        vec![
            frame("malloc", "/lib/x86_64-linux-gnu/libc.so.6", None).into(),
            frame(function, "/opt/server/bin/server", Some(("/build/src/server.c", 10))).into(),
        ],
    )
}

/// Cumulative (alloc_bytes, alloc_count, free_bytes, free_count) of a site at time t.
pub(crate) type SiteFn = Box<dyn Fn(f64) -> (u64, u64, u64, u64)>;

/// A recording with checkpoints at `times`, the given sites and memory figures.
pub(crate) fn recording(
    times: &[f64],
    sites: Vec<(Stack, SiteFn)>,
    memory: &dyn Fn(f64) -> Option<ProcMemory>,
    counters: &dyn Fn(f64) -> BTreeMap<String, u64>,
) -> Recording {
    let checkpoints = times
        .iter()
        .map(|&t| Checkpoint {
            t_s: t,
            memory: memory(t),
            sites: sites
                .iter()
                .map(|(st, f)| {
                    let (ab, ac, fb, fc) = f(t);
                    SiteSample {
                        stack: st.id,
                        alloc_bytes: ab,
                        alloc_count: ac,
                        free_bytes: fb,
                        free_count: fc,
                        ..Default::default()
                    }
                })
                .filter(|s| s.alloc_count > 0)
                .collect(),
            counters: counters(t),
            ..Default::default()
        })
        .collect();
    // Built from JSON so that fields added to the format later (with serde defaults) need no
    // change here.
    let mut rec: Recording = serde_json::from_value(serde_json::json!({
        "format_version": crate::recording::FORMAT_VERSION,
        "leaktrace_version": "test",
        "target": {
            "pid": 4242,
            "nspid": [4242, 7],
            "command": ["./server", "--port", "8080"],
            "exe": "/opt/server/bin/server",
            "launched": true,
            "exit_status": 0,
        },
        "mode": "exact",
        "started_unix_ms": 1_700_000_000_000u64,
        "interval_s": 1.0,
        "probes": [],
        "stacks": [],
        "checkpoints": [],
        "end_reason": "duration",
    }))
    .expect("fixture recording");
    rec.probes = serde_json::from_value(serde_json::json!([
        {"object": "/lib/x86_64-linux-gnu/libc.so.6", "function": "malloc", "kind": "entry", "offset": 0xa0f0},
        {"object": "/lib/x86_64-linux-gnu/libc.so.6", "function": "free", "kind": "entry", "offset": 0xa6e0},
    ]))
    .expect("fixture probes");
    rec.stacks = sites.into_iter().map(|(s, _)| s).collect();
    rec.checkpoints = checkpoints;
    rec
}

const LIBC: &str = "/lib/x86_64-linux-gnu/libc.so.6";
const STDCXX: &str = "/lib/x86_64-linux-gnu/libstdc++.so.6";
const EXE: &str = "/opt/server/bin/server";

/// 0, 1, ..., 60 s.
pub(crate) fn times61() -> Vec<f64> {
    (0..=60).map(|t| t as f64).collect()
}

/// Leak of exactly 1000 B/s through operator new (1500 B/s allocated, 500 B/s freed).
pub(crate) fn leak_site() -> (Stack, SiteFn) {
    let mut inl = frame("Session::key", EXE, Some(("src/session.h", 12)));
    inl.inlined = true;
    let stack = Stack {
        id: 1,
        kind: StackKind::Malloc,
        frames: vec![
            frame("malloc", LIBC, None).into(),
            frame("operator new(unsigned long)", STDCXX, None).into(),
            inl.into(),
            frame("Session::remember(std::string const&)", EXE, Some(("/build/src/session.cc", 42))).into(),
            frame("handle_request", EXE, Some(("/build/src/server.cc", 80))).into(),
            frame("main", EXE, Some(("/build/src/main.cc", 10))).into(),
        ],
        lost: false,
        truncated: None,
        shared: false,
    };
    (
        stack,
        Box::new(|t: f64| {
            let t = t as u64;
            (1500 * t, 15 * t, 500 * t, 5 * t)
        }),
    )
}

/// Cache: 50 000 B/s for the first 18 s (30 % of 60 s), then flat. Never freed.
pub(crate) fn cache_site() -> (Stack, SiteFn) {
    let stack = Stack {
        id: 2,
        kind: StackKind::Malloc,
        frames: vec![
            frame("malloc", LIBC, None).into(),
            frame("Cache::fill", EXE, Some(("/build/src/cache.cc", 10))).into(),
            frame("main", EXE, Some(("/build/src/main.cc", 12))).into(),
        ],
        lost: false,
        truncated: None,
        shared: false,
    };
    (
        stack,
        Box::new(|t: f64| {
            let k = (t as u64).min(18);
            (50_000 * k, 50 * k, 0, 0)
        }),
    )
}

/// Temporary: 1 MB/s allocated and freed, 0–2000 B live at any checkpoint.
pub(crate) fn temp_site() -> (Stack, SiteFn) {
    let stack = Stack {
        id: 3,
        kind: StackKind::Malloc,
        frames: vec![
            frame("malloc", LIBC, None).into(),
            frame("parse_line", EXE, Some(("/build/src/parse.c", 5))).into(),
            frame("main", EXE, Some(("/build/src/main.cc", 14))).into(),
        ],
        lost: false,
        truncated: None,
        shared: false,
    };
    (
        stack,
        Box::new(|t: f64| {
            let t = t as u64;
            let live = (t % 3) * 1000;
            (1_000_000 * t + 1000, 1000 * t + 1, 1_000_000 * t + 1000 - live, 1000 * t + 1 - t % 3)
        }),
    )
}

/// RSS following `anon(t)` with 8 MiB of file-backed pages.
pub(crate) fn mem(anon: u64) -> Option<ProcMemory> {
    Some(ProcMemory {
        rss_bytes: anon + (8 << 20),
        rss_anon_bytes: anon,
        rss_file_bytes: 8 << 20,
        rss_shmem_bytes: 0,
        vm_size_bytes: 1 << 30,
    })
}

/// Deterministic pseudo-random numbers in [0, 1).
pub(crate) fn noise(i: u64) -> f64 {
    let mut x = i.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51afd7ed558ccd);
    x ^= x >> 33;
    (x >> 11) as f64 / (1u64 << 53) as f64
}

pub(crate) fn no_counters(_: f64) -> BTreeMap<String, u64> {
    BTreeMap::new()
}

/// Leak + cache + temporary, RSS growing with the leak.
pub(crate) fn mixed() -> Recording {
    recording(
        &times61(),
        vec![leak_site(), cache_site(), temp_site()],
        &|t| mem((20 << 20) + (1000.0 * t) as u64 + (t.min(18.0) * 50_000.0) as u64),
        &no_counters,
    )
}
