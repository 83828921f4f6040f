//! `--heap-snapshots` on a Node target (issue 33): the two heap snapshots taken over the
//! inspector connection ([`NodeCensus`]'s first and second), the headroom refusal, and what is
//! new in the second (constructors, the retainer path of the top growing one); parsing and
//! walking a snapshot is `nodesnap.rs`.

use std::collections::{HashMap, HashSet};
use std::time::Instant;

use leaktrace_analysis::holds::{JsNewObjects, JsSnapshots, RetainerPath, Taken};
use serde_json::json;

use super::node::NodeCensus;
use super::nodesnap::{First, Heap, MAX_CONSTRUCTORS, SNAPSHOT_WAIT, cgroup_headroom, parse};

impl NodeCensus {
    /// Take one snapshot (after the headroom and size checks): the heap, its time and the JS
    /// heap used before it.
    fn snapshot(&mut self, max_bytes: u64) -> Result<(Heap, f64, u64), String> {
        let usage = self.call("Runtime.getHeapUsage", json!({}))?;
        let used = usage["usedSize"].as_f64().unwrap_or(0.0) as u64;
        if used > max_bytes {
            return Err(format!("the JS heap used is {used} B, over --heap-dump-max-size {max_bytes} B: no snapshot"));
        }
        if let Some((room, dir)) = cgroup_headroom(self.pid)
            && room < 2 * used
        {
            return Err(format!(
                "refused: the memory cgroup {} has {room} B of headroom (limit − usage), under twice the JS heap used (2 × {used} B) that a snapshot may need",
                dir.display()
            ));
        }
        let clock = Instant::now();
        let text = self.call_collect(
            "HeapProfiler.takeHeapSnapshot",
            json!({ "reportProgress": false }),
            "HeapProfiler.addHeapSnapshotChunk",
            SNAPSHOT_WAIT,
        )?;
        let took = clock.elapsed().as_secs_f64();
        Ok((parse(&text)?, took, used))
    }

    /// `--heap-snapshots`: the first snapshot, once sampling started. A failure is a note.
    pub(super) fn first_snapshot(&mut self, max_bytes: u64) {
        let at = Instant::now();
        match self.snapshot(max_bytes) {
            Ok((h, took_s, used)) => {
                let mut counts: HashMap<String, u64> = HashMap::new();
                let mut ids = HashSet::with_capacity(h.count());
                for i in 0..h.count() {
                    ids.insert(h.field(i, h.n_id));
                    *counts.entry(h.class(i)).or_default() += 1;
                }
                self.first = Some(First { at, took_s, ids, counts, objects: h.count() as u64, used });
            }
            Err(e) => self.census.errors.push(format!("--heap-snapshots: {e}")),
        }
    }

    /// `--heap-snapshots`, at the end: the second snapshot and what is new in it.
    pub(super) fn second_snapshot(&mut self, max_bytes: u64, now_s: &dyn Fn() -> f64) {
        let Some(first) = self.first.take() else { return };
        let t_first = now_s() - first.at.elapsed().as_secs_f64();
        let t = now_s();
        let (h, took_s, used) = match self.snapshot(max_bytes) {
            Ok(x) => x,
            Err(e) => {
                self.census.errors.push(format!("--heap-snapshots: {e}"));
                return;
            }
        };
        let mut new: HashMap<String, (u64, u64, u64)> = HashMap::new();
        let mut is_new = vec![false; h.count()];
        for (i, fresh) in is_new.iter_mut().enumerate() {
            let e = new.entry(h.class(i)).or_default();
            e.2 += 1;
            if !first.ids.contains(&h.field(i, h.n_id)) {
                *fresh = true;
                e.0 += 1;
                e.1 += h.field(i, h.n_size);
            }
        }
        let mut list: Vec<JsNewObjects> = new
            .into_iter()
            .filter(|(_, v)| v.0 > 0)
            .map(|(c, (count, self_bytes, count_second))| JsNewObjects {
                count_first: first.counts.get(&c).copied().unwrap_or(0),
                constructor: c,
                count,
                self_bytes,
                count_second,
            })
            .collect();
        list.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.constructor.cmp(&b.constructor)));
        // The top growing constructor: the most net growth between the snapshots (a cache
        // that replaces its entries makes as many new objects, and does not grow).
        let top = list
            .iter()
            .filter(|c| !c.constructor.starts_with('(') && c.count_second > c.count_first)
            .max_by_key(|c| (c.count_second - c.count_first, std::cmp::Reverse(c.constructor.clone())));
        let path = top.and_then(|top| {
            let (parent, seen) = h.walk();
            let want = |i: usize| is_new[i] && h.class(i) == top.constructor;
            let held = (0..h.count()).filter(|&i| want(i) && seen[i]).count() as u64;
            let obj = (0..h.count()).filter(|&i| want(i) && seen[i]).min_by_key(|&i| h.path(&parent, i).len())?;
            Some(RetainerPath {
                class: top.constructor.clone(),
                instances: top.count,
                held,
                root_kind: "(GC roots)".into(),
                path: h.path(&parent, obj),
            })
        });
        list.truncate(MAX_CONSTRUCTORS);
        self.snapshots = Some(JsSnapshots {
            first: Taken { t_s: t_first, took_s: first.took_s, units_of_work: None },
            second: Taken { t_s: t, took_s, units_of_work: None },
            objects_first: first.objects,
            objects_second: h.count() as u64,
            heap_used_first: first.used,
            heap_used_second: used,
            new_objects: list,
            path,
        });
    }
}
