//! The occupied heap to RSS with its parts: one line for report.md's head and
//! the `summary.occupied` object of report.json.

use serde_json::{Value, json};

use crate::analyze::Analysis;
use crate::analyze::occupied::Occupied;
use crate::human::bytes;

/// "Occupied heap to RSS anon: 61.2 % (20.1 MiB of 32.8 MiB at t=29.0 s) = native 1.2 MiB +
/// off-heap 0 B + managed 18.0 MiB (…) + runtime 0.8 MiB + allocator metadata ≥ 96.0 KiB (glibc
/// chunk headers)", or None without memory figures.
pub fn line(a: &Analysis) -> Option<String> {
    let o = a.occupied.as_ref()?;
    let pct = o.ratio.map_or("n/a (RSS anon is 0)".to_string(), |r| format!("{:.1} %", r * 100.0));
    let mut parts = vec![format!("native {}", bytes(o.native_bytes)), format!("off-heap {}", bytes(o.offheap_bytes))];
    if let (Some(m), Some(src)) = (o.managed_bytes, &o.managed_source) {
        let heap = a.runtime.map_or("managed heap", crate::runtimes::heap_name);
        parts.push(format!("managed {} ({heap}: {src})", bytes(m)));
    }
    if a.runtime.is_some() {
        parts.push(format!("runtime {}", bytes(o.runtime_bytes)));
    }
    parts.push(match o.allocator_metadata_bytes {
        Some(m) => format!("allocator metadata ≥ {} (glibc chunk headers, 8 B a live block)", bytes(m)),
        None => "allocator metadata not measured".to_string(),
    });
    let own = o.allocator_own_bytes.map_or(String::new(), |b| {
        format!("; glibc's arenas hold {} from the system (their headers' system_mem)", bytes(b))
    });
    Some(format!(
        "Occupied heap to RSS anon: **{pct}** ({} of {} at t={:.1} s) = {}{own}",
        bytes(o.bytes),
        bytes(o.rss_anon_bytes),
        o.at_s,
        parts.join(" + ")
    ))
}

/// report.json's `summary.occupied`: [`Occupied`] as documented in docs/report-json.md; null
/// without memory figures.
pub fn json(o: Option<&Occupied>) -> Value {
    let Some(o) = o else { return Value::Null };
    json!({
        "at_s": o.at_s,
        "rss_anon_bytes": o.rss_anon_bytes,
        "occupied_bytes": o.bytes,
        "ratio": o.ratio,
        "native_bytes": o.native_bytes,
        "offheap_bytes": o.offheap_bytes,
        "managed_bytes": o.managed_bytes,
        "managed_source": o.managed_source,
        "managed_after_collection": o.managed_after_collection,
        "runtime_bytes": o.runtime_bytes,
        "allocator_metadata_bytes": o.allocator_metadata_bytes,
        "allocator_own_bytes": o.allocator_own_bytes,
    })
}
