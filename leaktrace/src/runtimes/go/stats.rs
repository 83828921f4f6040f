//! Go's own heap figures read from outside, at every checkpoint (the occupied
//! heap's managed part from the runtime, not only from the Go heap's mappings): `HeapInuse` (bytes
//! in in-use heap spans, what `runtime.ReadMemStats` reports), the bytes the last collection
//! marked live, and the collections so far — read from the process's memory (/proc/PID/mem, no
//! stop) at the addresses of the runtime's globals in its symbol table and the fields' offsets in
//! its DWARF, as the goroutine census reads `runtime.g` (runtimes/go/census.rs):
//!
//! - `HeapInuse`: `runtime.gcController.heapInUse` (Go 1.19), else `runtime.memstats.heapInUse`
//!   (Go 1.20+), else `runtime.mheap_.pagesInUse` × 8 KiB (the runtime's page size);
//! - marked: `runtime.gcController.heapMarked`;
//! - collections: `runtime.memstats.numgc` (a u32);
//! - when the last collection ended: `runtime.memstats.last_gc_unix` (Unix time in ns, the wall
//!   clock, which a time namespace does not shift), against the agent's clock at the sample.
//!
//! A binary built with `-ldflags=-s -w` has neither symbols nor DWARF: no figures, and the
//! managed heap is then measured and judged from the Go heap's sites. `HeapInuse` feeds the
//! occupied heap only (`ManagedHeap::figures_only`); the managed heap's trend is judged on what
//! each collection marked live, placed at the time it ran (`marked_by_last_gc`,
//! `last_collection_ago_s`; `leaktrace_analysis::analyze::managed`).

use std::os::unix::fs::FileExt as _;

use object::{Object as _, ObjectSymbol as _};

use crate::runtimes::HeapGauge;
use leaktrace_analysis::recording::ManagedHeap;

/// The Go runtime's page size (`runtime._PageSize`, 8 KiB on every platform).
const GO_PAGE_BYTES: u64 = 8192;

/// Where each figure is, as loaded (absolute addresses in the target).
#[derive(Clone, Copy, Debug, PartialEq)]
struct Addresses {
    /// `HeapInuse` in bytes, or in pages when `in_pages`.
    heap_inuse: u64,
    in_pages: bool,
    heap_marked: Option<u64>,
    numgc: Option<u64>,
    last_gc_unix: Option<u64>,
}

/// Samples a Go process's `HeapInuse`, last marked bytes and collection count ([`HeapGauge`]).
pub struct GoStatsGauge {
    pid: u32,
    at: Option<Addresses>,
}

impl GoStatsGauge {
    /// The gauge of Go process `pid`; None when its executable has no symbols or DWARF for the
    /// figures (a stripped binary).
    pub fn new(pid: u32) -> Option<GoStatsGauge> {
        let at = addresses(pid).ok()?;
        Some(GoStatsGauge { pid, at: Some(at) })
    }
}

/// Member `field` of structure `ty` at the global `sym`, as loaded: None when either is missing.
fn field(
    syms: &std::collections::HashMap<&str, u64>,
    structs: &std::collections::HashMap<String, crate::runtimes::go::census::Layout>,
    sym: &str,
    ty: &str,
    field: &str,
    bias: u64,
) -> Option<u64> {
    let base = syms.get(sym)?;
    let off = structs.get(ty)?.1.get(field)?;
    Some(base.wrapping_add(bias).wrapping_add(*off))
}

fn addresses(pid: u32) -> Result<Addresses, String> {
    let data = std::fs::read(format!("/proc/{pid}/exe")).map_err(|e| format!("/proc/{pid}/exe: {e}"))?;
    let file = object::File::parse(&*data).map_err(|e| format!("not an ELF file: {e}"))?;
    let wanted = ["runtime.gcController", "runtime.memstats", "runtime.mheap_"];
    let syms: std::collections::HashMap<&str, u64> =
        file.symbols().filter_map(|s| s.name().ok().filter(|n| wanted.contains(n)).map(|n| (n, s.address()))).collect();
    if syms.is_empty() {
        return Err("no runtime symbols (a stripped binary)".into());
    }
    let structs =
        crate::runtimes::go::census::structs(&file, &["runtime.gcControllerState", "runtime.mstats", "runtime.mheap"])?;
    let bias = if file.kind() == object::ObjectKind::Dynamic {
        crate::runtimes::go::census::load_bias(pid, &file)?
    } else {
        0
    };
    let f = |sym: &str, ty: &str, name: &str| field(&syms, &structs, sym, ty, name, bias);
    let (heap_inuse, in_pages) = match f("runtime.gcController", "runtime.gcControllerState", "heapInUse")
        .or_else(|| f("runtime.memstats", "runtime.mstats", "heapInUse"))
    {
        Some(a) => (a, false),
        None => (f("runtime.mheap_", "runtime.mheap", "pagesInUse").ok_or("no HeapInuse field in DWARF")?, true),
    };
    Ok(Addresses {
        heap_inuse,
        in_pages,
        heap_marked: f("runtime.gcController", "runtime.gcControllerState", "heapMarked"),
        numgc: f("runtime.memstats", "runtime.mstats", "numgc"),
        last_gc_unix: f("runtime.memstats", "runtime.mstats", "last_gc_unix"),
    })
}

impl HeapGauge for GoStatsGauge {
    fn sample(&mut self) -> Option<ManagedHeap> {
        let at = self.at?;
        let mem = std::fs::File::open(format!("/proc/{}/mem", self.pid)).ok()?;
        let read = |addr: u64, n: usize| -> Option<u64> {
            let mut b = [0u8; 8];
            mem.read_exact_at(&mut b[..n], addr).ok()?;
            Some(u64::from_le_bytes(b))
        };
        let raw = read(at.heap_inuse, 8)?;
        let used = if at.in_pages { raw.saturating_mul(GO_PAGE_BYTES) } else { raw };
        let mut heap = ManagedHeap {
            used_bytes: used,
            source: "the Go runtime's HeapInuse (read from its memory)".into(),
            collections: at.numgc.and_then(|a| read(a, 4)),
            figures_only: true,
            ..Default::default()
        };
        if let Some(marked) = at.heap_marked.and_then(|a| read(a, 8)) {
            heap.spaces.insert("marked_by_last_gc".into(), marked);
        }
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).ok();
        heap.last_collection_ago_s = at
            .last_gc_unix
            .and_then(|a| read(a, 8))
            .zip(now)
            .and_then(|(last, now)| last_collection_ago_s(last, now.as_nanos()));
        Some(heap)
    }
}

/// Seconds from the end of the last collection (`last_gc_unix`, Unix time in ns as the runtime
/// wrote it) to `now_ns` (Unix time in ns). None before the first collection (0), or when the
/// figure makes no sense (the target's memory is the target's to forge: a time in the future
/// beyond a clock's jitter, or absurdly old, is dropped, never trusted).
fn last_collection_ago_s(last_gc_unix: u64, now_ns: u128) -> Option<f64> {
    if last_gc_unix == 0 {
        return None;
    }
    let ago = (now_ns as f64 - last_gc_unix as f64) / 1e9;
    (-0.1..=1e7).contains(&ago).then_some(ago.max(0.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn last_collection_time_bounded() {
        let now: u128 = 1_800_000_000 * 1_000_000_000;
        let at = |ago_s: f64| (now as f64 - ago_s * 1e9) as u64;
        assert_eq!(last_collection_ago_s(0, now), None, "no collection yet");
        assert!((last_collection_ago_s(at(1.5), now).unwrap() - 1.5).abs() < 1e-6);
        assert_eq!(last_collection_ago_s(at(-0.05), now), Some(0.0), "within the clocks' jitter: just now");
        assert_eq!(last_collection_ago_s(at(-5.0), now), None, "in the future: forged");
        assert_eq!(last_collection_ago_s(1, now), None, "decades ago: forged");
        assert_eq!(last_collection_ago_s(u64::MAX, now), None);
    }
}
