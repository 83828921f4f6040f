//! `--heap-snapshots` on a Node target: the two heap snapshots taken over the
//! inspector connection ([`NodeCensus`]'s first and second), the headroom refusal, and what is
//! new in the second (constructors with their counts, self and retained sizes, the retainer path
//! of the top growing one and the retained size of the object holding it); parsing and walking
//! a snapshot is `nodesnap.rs`, its dominator tree `nodedom.rs`.

use std::collections::{HashMap, HashSet};
use std::time::Instant;

use leaktrace_analysis::holds::{JsHolder, JsNewObjects, JsSnapshots, RetainerPath, SnapshotCost, Taken};
use serde_json::json;

use super::census::NodeCensus;
use super::dom::Dominators;
use super::snap::{First, Heap, MAX_CONSTRUCTORS, SNAPSHOT_WAIT, cgroup_headroom, parse};

impl NodeCensus {
    /// Take one snapshot (after the headroom and size checks): the heap, its time, the JS heap
    /// used before it, and its costs (`analyse_s` left to the caller).
    fn snapshot(&mut self, max_bytes: u64) -> Result<(Heap, f64, u64, SnapshotCost), String> {
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
        let got = self.call_collect(
            "HeapProfiler.takeHeapSnapshot",
            json!({ "reportProgress": false }),
            "HeapProfiler.addHeapSnapshotChunk",
            (SNAPSHOT_WAIT, super::cdp::snapshot_text_cap(max_bytes)),
        )?;
        let took = clock.elapsed().as_secs_f64();
        let first_chunk_s = got.first_s.unwrap_or(took);
        let parsing = Instant::now();
        let heap = parse(&got.text)?;
        let cost = SnapshotCost {
            first_chunk_s,
            transfer_s: took - first_chunk_s,
            bytes: got.text.len() as u64,
            chunks: got.chunks,
            parse_s: parsing.elapsed().as_secs_f64(),
            analyse_s: 0.0,
        };
        Ok((heap, took, used, cost))
    }

    /// `--heap-snapshots`: the first snapshot, once sampling started. A failure is a note.
    pub(super) fn first_snapshot(&mut self, max_bytes: u64) {
        let at = Instant::now();
        match self.snapshot(max_bytes) {
            Ok((h, took_s, used, mut cost)) => {
                let clock = Instant::now();
                let mut counts: HashMap<String, u64> = HashMap::new();
                let mut ids = HashSet::with_capacity(h.count());
                for i in 0..h.count() {
                    ids.insert(h.field(i, h.n_id));
                    *counts.entry(h.class(i)).or_default() += 1;
                }
                cost.analyse_s = clock.elapsed().as_secs_f64();
                self.first = Some(First { at, took_s, ids, counts, objects: h.count() as u64, used, cost });
            }
            Err(e) => self.census.errors.push(format!("--heap-snapshots: {e}")),
        }
    }

    /// `--heap-snapshots`, at the end: the second snapshot and what is new in it.
    pub(super) fn second_snapshot(&mut self, max_bytes: u64, now_s: &dyn Fn() -> f64) {
        let Some(first) = self.first.take() else { return };
        let t_first = now_s() - first.at.elapsed().as_secs_f64();
        let t = now_s();
        let (h, took_s, used, mut cost) = match self.snapshot(max_bytes) {
            Ok(x) => x,
            Err(e) => {
                self.census.errors.push(format!("--heap-snapshots: {e}"));
                return;
            }
        };
        let clock = Instant::now();
        let new = NewObjects::of(&h, &first);
        let dom = Dominators::of(&h);
        let mut list = new.constructors(&h, &dom, &first);
        // The top growing constructor: the most net growth between the snapshots (a cache
        // that replaces its entries makes as many new objects, and does not grow).
        let top = list
            .iter()
            .filter(|c| !c.constructor.starts_with('(') && c.count_second > c.count_first)
            .max_by_key(|c| (c.count_second - c.count_first, std::cmp::Reverse(c.constructor.clone())));
        let found = top.and_then(|top| top_path(&h, &dom, &new.is_new, top));
        let (path, holder) = found.map_or((None, None), |(p, hd)| (Some(p), Some(hd)));
        list.truncate(MAX_CONSTRUCTORS);
        cost.analyse_s = clock.elapsed().as_secs_f64();
        self.snapshots = Some(JsSnapshots {
            first: Taken { t_s: t_first, took_s: first.took_s, units_of_work: None },
            second: Taken { t_s: t, took_s, units_of_work: None },
            objects_first: first.objects,
            objects_second: h.count() as u64,
            heap_used_first: first.used,
            heap_used_second: used,
            new_objects: list,
            path,
            holder,
            costs: vec![first.cost, cost],
        });
    }
}

/// The second snapshot's objects by constructor, and which are new (their ids not in the first).
pub(crate) struct NewObjects {
    pub(crate) is_new: Vec<bool>,
    /// Node → its constructor's index in `names`.
    class_of: Vec<u32>,
    names: Vec<String>,
}

impl NewObjects {
    pub(crate) fn of(h: &Heap, first: &First) -> NewObjects {
        let mut index: HashMap<String, u32> = HashMap::new();
        let mut names = Vec::new();
        let mut class_of = Vec::with_capacity(h.count());
        let mut is_new = Vec::with_capacity(h.count());
        for i in 0..h.count() {
            let c = h.class(i);
            let k = *index.entry(c.clone()).or_insert_with(|| {
                names.push(c);
                names.len() as u32 - 1
            });
            class_of.push(k);
            is_new.push(!first.ids.contains(&h.field(i, h.n_id)));
        }
        NewObjects { is_new, class_of, names }
    }

    /// The constructors with new objects: counts, self and retained sizes, most new first.
    pub(crate) fn constructors(&self, h: &Heap, dom: &Dominators, first: &First) -> Vec<JsNewObjects> {
        let groups: Vec<Option<u32>> =
            self.class_of.iter().zip(&self.is_new).map(|(&c, &fresh)| fresh.then_some(c)).collect();
        let retained = dom.retained_by_group(&groups, self.names.len());
        let mut list: Vec<JsNewObjects> = self
            .names
            .iter()
            .map(|c| JsNewObjects { count_first: first.counts.get(c).copied().unwrap_or(0), ..Default::default() })
            .collect();
        for (i, &c) in self.class_of.iter().enumerate() {
            let e = &mut list[c as usize];
            e.count_second += 1;
            if self.is_new[i] {
                e.count += 1;
                e.self_bytes = e.self_bytes.saturating_add(h.self_size(i));
            }
        }
        for (k, e) in list.iter_mut().enumerate() {
            e.constructor = self.names[k].clone();
            e.retained_bytes = retained[k];
        }
        list.retain(|e| e.count > 0);
        list.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.constructor.cmp(&b.constructor)));
        list
    }
}

/// The shortest retainer path from the GC roots to one new instance of `top`, and the object
/// holding that instance with its retained size.
pub(crate) fn top_path(
    h: &Heap,
    dom: &Dominators,
    is_new: &[bool],
    top: &JsNewObjects,
) -> Option<(RetainerPath, JsHolder)> {
    let (parent, seen) = h.walk();
    let want = |i: usize| is_new[i] && seen[i] && h.class(i) == top.constructor;
    let held = (0..h.count()).filter(|&i| want(i)).count() as u64;
    let obj = (0..h.count()).filter(|&i| want(i)).min_by_key(|&i| h.path(&parent, i).len())?;
    let path = h.path(&parent, obj);
    let (by, _) = parent[obj]?;
    let mut holder = JsHolder {
        // The path's step for the holder: the one before the last edge's label and the class.
        name: path.len().checked_sub(3).map_or_else(|| h.class(by), |k| path[k].clone()),
        self_bytes: h.self_size(by),
        retained_bytes: dom.retained(by),
        ..Default::default()
    };
    let mut counted = HashSet::new();
    for to in h.targets(by) {
        if h.class(to) == top.constructor && counted.insert(to) {
            holder.instances += 1;
            holder.instances_retained_bytes = holder.instances_retained_bytes.saturating_add(dom.retained(to));
        }
    }
    let path = RetainerPath {
        class: top.constructor.clone(),
        instances: top.count,
        held,
        root_kind: "(GC roots)".into(),
        path,
    };
    Some((path, holder))
}
