//! The JVM's off-heap retainers (`--heap-dump`: the GC roots' objects that retain direct
//! buffers' native blocks, at the first and the last dump) in report.json
//! (`runtime_holds.off_heap_retainers`) and the verdict (report.md lists them with every other
//! holder, `report/what_holds.rs`).

use serde_json::{Value, json};

use crate::holds::{OffHeapRetainer, RuntimeHolds, off_heap_retainers};
use crate::human::{bytes, number, rate};
use crate::retain::Retained;

fn retained_json(r: &Retained) -> Value {
    json!({
        "native": r.native, "managed": r.managed, "off_heap": r.off_heap, "blocks": r.blocks,
        "block_bytes": r.block_bytes,
    })
}

fn one_json(r: &OffHeapRetainer) -> Value {
    json!({
        "container": r.container,
        "retained_first": retained_json(&r.first),
        "retained_last": retained_json(&r.last),
        "bytes_per_s": r.bytes_per_s,
        "off_heap_per_s": r.off_heap_per_s,
        "leak": r.growing,
        "allocated_by": r.last.allocated_by,
        "allocated_stack": r.last.allocated_stack,
    })
}

/// `runtime_holds.off_heap_retainers`: most growth first.
pub fn json(h: &RuntimeHolds) -> Value {
    Value::Array(off_heap_retainers(h).iter().map(one_json).collect())
}

/// The verdict's holder when a holder's off-heap bytes grew between the dumps:
/// "`App.BUFFERS` retains +765.3 KiB/s off-heap (10.9 MiB in 700 direct buffers' blocks at the
/// last heap dump, allocated by `…`)"; None otherwise.
pub fn sentence(h: &RuntimeHolds) -> Option<String> {
    let r = off_heap_retainers(h).into_iter().next().filter(|r| r.growing)?;
    let by = r.last.allocated_by.as_deref().map_or_else(String::new, |b| format!(", allocated by `{b}`"));
    Some(format!(
        "`{}` retains {} off-heap ({} in {} direct buffers' blocks at the last heap dump{by})",
        r.container,
        rate(r.off_heap_per_s),
        bytes(r.last.off_heap),
        number(r.last.blocks as f64),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::holds::{HeapPaths, Taken};

    fn dump(t_s: f64, list: u64, cache: u64) -> HeapPaths {
        let r = |c: &str, n: u64| Retained {
            container: c.into(),
            off_heap: n * 16384,
            managed: n * 100,
            blocks: n,
            block_bytes: n * 16384,
            ..Default::default()
        };
        HeapPaths {
            taken: Taken { t_s, took_s: 0.1, units_of_work: None },
            retainers: vec![r("App.CACHE", cache), r("App.LIST", list)],
            ..Default::default()
        }
    }

    /// The list grew 100 → 700 blocks in 10 s: a leak, named first and in the verdict; the
    /// cache kept its 200: not a leak.
    #[test]
    fn the_growing_holder_is_the_leak_and_the_cache_is_not() {
        let h = RuntimeHolds {
            jvm_first_dump: Some(dump(2.0, 100, 200)),
            jvm_heap_dump: Some(dump(12.0, 700, 200)),
            ..Default::default()
        };
        let list = off_heap_retainers(&h);
        let got: Vec<(&str, bool)> = list.iter().map(|r| (r.container.as_str(), r.growing)).collect();
        assert_eq!(got, [("App.LIST", true), ("App.CACHE", false)]);
        assert_eq!(list[0].off_heap_per_s, 600.0 * 16384.0 / 10.0);
        let s = sentence(&h).expect("a holder");
        assert!(s.starts_with("`App.LIST` retains +960.0 KiB/s off-heap (10.9 MiB in 700"), "{s}");
        let mut held = Vec::new();
        crate::report::what_holds::jvm_holders(&h, &mut held);
        let m: Vec<String> = held.iter().map(crate::report::what_holds::line).collect();
        assert!(m[0].starts_with("- **`App.LIST`** (GC root, jvm): holds 700 direct buffers' blocks"), "{m:?}");
        assert!(m[0].contains("off-heap 10.9 MiB); **growing** +965.9 KiB/s"), "{m:?}");
        assert!(m[1].contains("**`App.CACHE`**") && m[1].contains("; not growing: not a leak"), "{m:?}");
        let last_only = RuntimeHolds { jvm_heap_dump: Some(dump(12.0, 700, 200)), ..Default::default() };
        assert!(sentence(&last_only).is_none(), "no growth without a first dump");
    }
}
