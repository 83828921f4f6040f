//! The occupied-heap-to-RSS ratio with its parts: how much of the process's
//! anonymous RSS the memory in use explains — live native bytes, off-heap bytes, the managed
//! heap's used bytes (after collection where the runtime says so), the runtime's own memory and
//! the allocator's metadata where known. The first figure of every leak checklist: a low ratio
//! with a growing RSS is memory no object holds (allocator retention, fragmentation, untraced
//! memory); a high one sends the hunt to the objects.

use serde::Serialize;

use super::Analysis;
use crate::recording::{Recording, StackKind};

/// Bytes of glibc malloc's chunk header per live block (its size field; the previous chunk's
/// size field lies in the previous block's last word): the allocator metadata counted per live
/// block under glibc. A lower bound: the rounding of each request up to 16 bytes is not known
/// from a site's totals.
pub const GLIBC_CHUNK_HEADER_BYTES: u64 = 8;

/// The occupied heap and its parts at one checkpoint (the last one with memory figures). Bytes.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Occupied {
    /// The checkpoint's time (`t_s` of the recording: seconds since its first checkpoint).
    pub at_s: f64,
    /// RssAnon at that checkpoint.
    pub rss_anon_bytes: u64,
    /// Live bytes of the native-kind malloc sites (all malloc sites without a runtime).
    pub native_bytes: u64,
    /// Off-heap sites: resident bytes of off-heap mappings plus live bytes of off-heap malloc
    /// sites (direct buffers, ArrayBuffer backing stores).
    pub offheap_bytes: u64,
    /// The managed heap's used bytes (see `managed_source`); None without a runtime.
    pub managed_bytes: Option<u64>,
    /// Where `managed_bytes` comes from, for humans: the runtime's own counters (the JVM's
    /// hsperfdata: used bytes of the survivor and old spaces, what the last collection left) or
    /// the managed heap's sites (pages resident, objects malloc'd: garbage not yet collected
    /// included). None without a runtime.
    pub managed_source: Option<String>,
    /// The managed figure is what survived the last collection (the runtime says so).
    pub managed_after_collection: bool,
    /// The runtime's own memory (kind "runtime": JIT code, class metadata, interpreter
    /// structures), as its sites hold it; 0 without a runtime.
    pub runtime_bytes: u64,
    /// The allocator's metadata where known: glibc's chunk headers,
    /// [`GLIBC_CHUNK_HEADER_BYTES`] × live malloc blocks (a lower bound); None for another
    /// allocator (its metadata is not measured).
    pub allocator_metadata_bytes: Option<u64>,
    /// The allocator's own figure of the memory it holds from the system at that time, beside
    /// the parts (not one of them): glibc's Σ `system_mem` of its arenas, read from their
    /// headers; None when not read (another allocator, no `main_arena` symbol).
    pub allocator_own_bytes: Option<u64>,
    /// The sum of the parts.
    pub bytes: u64,
    /// `bytes` / `rss_anon_bytes` (4 decimals); None when RssAnon is 0.
    pub ratio: Option<f64>,
}

/// Value of a time series at `t`: its last point at or before `t` (its first when none is).
fn at(series: &[(f64, u64)], t: f64) -> Option<u64> {
    series.iter().take_while(|p| p.0 <= t + 1e-9).last().or(series.first()).map(|p| p.1)
}

/// The managed heap's figure at `t` and where it comes from: the JVM's after-collection bytes
/// (used − eden, from hsperfdata's spaces), else the managed series of the analysis.
fn managed_at(rec: &Recording, a: &Analysis, t: f64) -> Option<(u64, String, bool)> {
    let rt = a.runtime?;
    let gauge = rec
        .checkpoints
        .iter()
        .filter(|c| c.t_s.is_finite() && c.t_s <= t + 1e-6)
        .filter_map(|c| c.managed.as_ref().map(|m| (c.t_s, m)))
        .max_by(|x, y| x.0.total_cmp(&y.0));
    if let Some((_, m)) = gauge {
        if let Some(after) = super::managed::after_collection_bytes(m) {
            return Some((
                after,
                format!("{}, used after the last collection (survivor and old spaces)", m.source),
                true,
            ));
        }
        if m.figures_only {
            return Some(runtime_figure(m, at(&a.memory.managed_bytes, t)));
        }
        return Some((m.used_bytes, format!("{}, used (garbage not yet collected included)", m.source), false));
    }
    let what = crate::runtimes::rules(rt).managed_from_sites();
    let v = at(&a.memory.managed_bytes, t)?;
    Some((v, format!("{what} (garbage not yet collected included)"), false))
}

/// A runtime's own figure read for the occupied heap only (Go's `HeapInuse`), counted up to the
/// managed heap's resident pages (`resident`, from its sites) when it exceeds them: a runtime
/// that takes fresh memory as zeroed (Go) leaves the pages of in-use spans never written out of
/// RSS, and the occupied heap is a share of RSS.
fn runtime_figure(m: &crate::recording::ManagedHeap, resident: Option<u64>) -> (u64, String, bool) {
    let hb = crate::human::bytes;
    let marked = m
        .spaces
        .get(super::managed::MARKED_BY_LAST_GC)
        .map(|b| format!("; the last collection marked {} live", hb(*b)));
    let mut source = format!("{}, used (garbage not yet collected included{})", m.source, marked.unwrap_or_default());
    let bytes = match resident {
        Some(r) if r < m.used_bytes => {
            source.push_str(&format!(
                ": {} in use, counted up to the heap's {} resident (pages of in-use spans never written are not in RSS)",
                hb(m.used_bytes),
                hb(r)
            ));
            r
        }
        _ => m.used_bytes,
    };
    (bytes, source, false)
}

/// The occupied heap of `a` at its last checkpoint with memory figures; None without memory
/// figures.
pub fn occupied(rec: &Recording, a: &Analysis) -> Option<Occupied> {
    let &(t, anon) = a.memory.rss_anon_bytes.last()?;
    let native = at(&a.memory.native_live_bytes, t).unwrap_or(0);
    let offheap = at(&a.memory.offheap_live_bytes, t).unwrap_or(0);
    let managed = managed_at(rec, a, t);
    let runtime = if a.runtime.is_some() { at(&a.memory.runtime_live_bytes, t).unwrap_or(0) } else { 0 };
    let glibc = a.summary.allocator_family.is_none();
    let metadata = glibc.then(|| {
        let blocks: u64 = a.sites.iter().filter(|s| s.kind == StackKind::Malloc).map(|s| s.live_allocations).sum();
        blocks * GLIBC_CHUNK_HEADER_BYTES
    });
    let managed_bytes = managed.as_ref().map(|m| m.0);
    let bytes = native
        .saturating_add(offheap)
        .saturating_add(managed_bytes.unwrap_or(0))
        .saturating_add(runtime)
        .saturating_add(metadata.unwrap_or(0));
    Some(Occupied {
        at_s: t,
        rss_anon_bytes: anon,
        native_bytes: native,
        offheap_bytes: offheap,
        managed_after_collection: managed.as_ref().is_some_and(|m| m.2),
        managed_source: managed.map(|m| m.1),
        managed_bytes,
        runtime_bytes: runtime,
        allocator_metadata_bytes: metadata,
        allocator_own_bytes: (!a.memory.allocator_own_bytes.is_empty())
            .then(|| at(&a.memory.allocator_own_bytes, t))
            .flatten(),
        bytes,
        ratio: (anon > 0).then(|| (bytes as f64 / anon as f64 * 1e4).round() / 1e4),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::recording::ManagedHeap;

    /// Go's HeapInuse above the heap's resident pages (spans never written) is counted up to
    /// them, and the source says so; below them it is taken as read, with the marked bytes.
    #[test]
    fn runtime_figure_is_counted_up_to_the_resident_heap() {
        let mut m = ManagedHeap {
            used_bytes: 100 << 20,
            source: "the Go runtime's HeapInuse (read from its memory)".into(),
            figures_only: true,
            ..Default::default()
        };
        m.spaces.insert("marked_by_last_gc".into(), 60 << 20);
        let (b, src, after) = runtime_figure(&m, Some(40 << 20));
        assert_eq!((b, after), (40 << 20, false));
        assert!(src.contains("the last collection marked 60.0 MiB live"), "{src}");
        assert!(src.contains("100.0 MiB in use, counted up to the heap's 40.0 MiB resident"), "{src}");
        let (b, src) = (runtime_figure(&m, Some(200 << 20)).0, runtime_figure(&m, None).1);
        assert_eq!(b, 100 << 20);
        assert!(!src.contains("counted up to"), "{src}");
    }
}
