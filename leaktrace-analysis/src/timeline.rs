//! The one timeline of a recording: its checkpoints sorted once, and every site's cumulative
//! totals replayed into dense series (one value per checkpoint), each stack classified once. The
//! analysis, the runtime split, `check` and `compare` all read it instead of replaying the
//! checkpoints themselves.
//!
//! Replay rules: checkpoints with a non-finite time are left out; the others are taken in time
//! order (a stable sort: equal times keep their recorded order). Samples are cumulative and
//! sparse: a site absent from a checkpoint keeps its last totals, and duplicate samples of one
//! stack in a checkpoint are summed. A sample whose stack the recording lacks gets a placeholder
//! stack (kind malloc, no frames); of duplicate stack ids only the first stack is used.

use std::collections::{BTreeMap, HashMap};

use crate::recording::{Recording, SiteSample, Stack, StackKind};
use crate::runtimes::MemoryKind;

/// A recording's checkpoints in time order and every site's series over them.
#[derive(Clone, Debug)]
pub struct Timeline {
    /// Index into `Recording::checkpoints` of each checkpoint used, in time order.
    pub order: Vec<usize>,
    /// Their times as recorded, seconds since the first checkpoint.
    pub raw_times: Vec<f64>,
    /// The same rounded to the nanosecond, so that a recording in memory and the same recording
    /// read back from JSON give the same analysis to the last bit.
    pub times: Vec<f64>,
    /// The recording's stacks, then a placeholder for each stack id a sample refers to that the
    /// recording lacks. Series below are indexed like this.
    pub stacks: Vec<Stack>,
    /// Stack id → index into [`Timeline::stacks`] (the first stack with that id).
    pub index: HashMap<u32, usize>,
    /// The recording has several stacks with one id.
    pub duplicate_ids: bool,
    /// How many placeholder stacks were added (samples referring to unknown stacks).
    pub unknown_stacks: usize,
    /// What kind of memory each stack holds under the target's runtime (classified once).
    pub kinds: Vec<MemoryKind>,
    /// Per stack, per checkpoint: live (allocated − freed) bytes.
    pub live_bytes: Vec<Vec<u64>>,
    /// Per stack, per checkpoint: live blocks.
    pub live_count: Vec<Vec<u64>>,
    /// Per stack, per checkpoint: the resident bytes of its mappings last read at or before the
    /// checkpoint (None before the first figure, and for malloc sites).
    pub resident: Vec<Vec<Option<u64>>>,
    /// Per stack: per checkpoint, the sum of its live blocks' birth times in ms on the
    /// recording's clock (`SiteSample::alloc_born_ms − free_born_ms`; their ages sum to live
    /// blocks × `raw_times[k]` × 1000 − this); None for a stack whose samples carry no birth
    /// times (mappings, older recordings).
    pub live_born_ms: Vec<Option<Vec<i64>>>,
    /// Per stack: the first checkpoint (position in [`Timeline::order`]) with a sample of it.
    pub first_seen: Vec<Option<usize>>,
    /// Per stack: its totals at the last checkpoint.
    pub last: Vec<SiteSample>,
    /// Per checkpoint: allocations + frees of all sites so far, plus the calls the kernel side
    /// could not record (full maps) and frees of untracked blocks (the process's activity).
    pub activity: Vec<u64>,
}

impl Timeline {
    /// Sort and replay `rec` once. Never fails: odd input (no checkpoint, unknown stacks) gives
    /// empty or placeholder entries that [`Timeline::duplicate_ids`] and
    /// [`Timeline::unknown_stacks`] report.
    pub fn new(rec: &Recording) -> Timeline {
        let mut order: Vec<usize> =
            (0..rec.checkpoints.len()).filter(|&i| rec.checkpoints[i].t_s.is_finite()).collect();
        order.sort_by(|&a, &b| rec.checkpoints[a].t_s.total_cmp(&rec.checkpoints[b].t_s));
        let raw_times: Vec<f64> = order.iter().map(|&i| rec.checkpoints[i].t_s).collect();
        let times: Vec<f64> = raw_times.iter().map(|t| (t * 1e9).round() / 1e9).collect();
        let n = order.len();

        let mut stacks: Vec<Stack> = rec.stacks.clone();
        let mut index: HashMap<u32, usize> = HashMap::new();
        for (i, s) in stacks.iter().enumerate() {
            index.entry(s.id).or_insert(i);
        }
        let duplicate_ids = index.len() != stacks.len();
        let mut unknown_stacks = 0usize;
        for &ci in &order {
            for s in &rec.checkpoints[ci].sites {
                if let std::collections::hash_map::Entry::Vacant(e) = index.entry(s.stack) {
                    e.insert(stacks.len());
                    stacks.push(Stack {
                        id: s.stack,
                        kind: StackKind::Malloc,
                        frames: vec![],
                        lost: false,
                        truncated: None,
                        shared: false,
                    });
                    unknown_stacks += 1;
                }
            }
        }
        let mut kinds: Vec<MemoryKind> = crate::runtimes::classify_sites(rec.target.runtime, &stacks);
        // A mapping the allocator made (jemalloc's extents) is not the program's
        // off-heap memory. Growth mode: it is the heap growing through the allocator, native
        // memory. Exact and sampled modes: the allocator's own, as glibc's arenas are — its
        // blocks are counted at the malloc sites.
        let growth = rec.mode == crate::recording::Mode::Growth;
        for (k, st) in kinds.iter_mut().zip(&stacks) {
            if *k == MemoryKind::OffHeap && crate::frame_origin::mapped_by_allocator(st).is_some() {
                *k = if growth { MemoryKind::Native } else { MemoryKind::Runtime };
            }
        }

        let m = stacks.len();
        let mut live_bytes: Vec<Vec<u64>> = (0..m).map(|_| Vec::with_capacity(n)).collect();
        let mut live_count: Vec<Vec<u64>> = (0..m).map(|_| Vec::with_capacity(n)).collect();
        let mut resident: Vec<Vec<Option<u64>>> = (0..m).map(|_| Vec::with_capacity(n)).collect();
        let mut born: Vec<Vec<i64>> = (0..m).map(|_| Vec::with_capacity(n)).collect();
        let mut has_born = vec![false; m];
        let mut first_seen: Vec<Option<usize>> = vec![None; m];
        let mut known_resident: Vec<Option<u64>> = vec![None; m];
        let mut cur: Vec<SiteSample> = vec![Default::default(); m];
        let mut activity: Vec<u64> = Vec::with_capacity(n);
        for (k, &ci) in order.iter().enumerate() {
            let mut here: HashMap<usize, SiteSample> = HashMap::new();
            for s in &rec.checkpoints[ci].sites {
                let Some(&si) = index.get(&s.stack) else { continue };
                let e = here.entry(si).or_insert_with(|| SiteSample { stack: s.stack, ..Default::default() });
                e.add(s);
            }
            for (si, s) in here {
                if s.resident_bytes.is_some() {
                    known_resident[si] = s.resident_bytes;
                }
                first_seen[si].get_or_insert(k);
                cur[si] = s;
            }
            for si in 0..m {
                live_bytes[si].push(cur[si].live_bytes());
                live_count[si].push(cur[si].live_count());
                resident[si].push(known_resident[si]);
                let b = &cur[si];
                has_born[si] |= b.alloc_born_ms.is_some();
                born[si].push(b.alloc_born_ms.unwrap_or(0).saturating_sub(b.free_born_ms.unwrap_or(0)));
            }
            // Calls the kernel side could not record (a full map) and frees of blocks it never
            // saw are the process at work too: a run whose ALLOCS map filled is not idle.
            let unrecorded: u64 = leaktrace_common::counter::TABLE
                .iter()
                .filter(|c| c.full || c.counter == leaktrace_common::counter::Counter::UntrackedFree)
                .filter_map(|c| rec.checkpoints[ci].counters.get(c.name))
                .fold(0u64, |acc, v| acc.saturating_add(*v));
            activity.push(
                cur.iter()
                    .fold(0u64, |acc, s| acc.saturating_add(s.alloc_count).saturating_add(s.free_count))
                    .saturating_add(unrecorded),
            );
        }
        let live_born_ms = born.into_iter().zip(has_born).map(|(b, has)| has.then_some(b)).collect();
        Timeline {
            order,
            raw_times,
            times,
            stacks,
            index,
            duplicate_ids,
            unknown_stacks,
            kinds,
            live_bytes,
            live_count,
            resident,
            live_born_ms,
            first_seen,
            last: cur,
            activity,
        }
    }

    /// Number of checkpoints used.
    pub fn len(&self) -> usize {
        self.order.len()
    }

    /// No checkpoint with a finite time.
    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    /// Live bytes at every checkpoint of every stack seen so far, by stack id: (index into
    /// `Recording::checkpoints`, stack id → live bytes), in time order. Stacks no sample has
    /// named yet are absent.
    pub fn live_by_stack(&self) -> Vec<(usize, BTreeMap<u32, u64>)> {
        self.order
            .iter()
            .enumerate()
            .map(|(k, &ci)| {
                let here: BTreeMap<u32, u64> = self
                    .index
                    .iter()
                    .filter(|&(_, &si)| self.first_seen[si].is_some_and(|f| f <= k))
                    .map(|(&id, &si)| (id, self.live_bytes[si][k]))
                    .collect();
                (ci, here)
            })
            .collect()
    }
}

// ----------------------------------------------------------------------------------------------
// Series by kind (the timeline summed by the runtimes' memory kinds)

/// Bytes of each kind at every checkpoint of a [`Timeline`] (time order), `(t_s, bytes)`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct KindSeries {
    /// Managed-kind sites; for the JVM use [`gauge_series`] instead.
    pub managed: Vec<(f64, u64)>,
    /// Native-kind malloc sites (live bytes).
    pub native: Vec<(f64, u64)>,
    /// Off-heap sites.
    pub offheap: Vec<(f64, u64)>,
    /// Runtime-kind sites, glibc's arena heaps mapped in free() left out (their blocks are
    /// counted at their malloc sites).
    pub runtime: Vec<(f64, u64)>,
    /// The part of `managed` in the runtime's young generation (V8's semi-space pages:
    /// [`crate::runtimes::node::is_young_generation`]), bounded by the runtime's configuration (V8's
    /// `--max-semi-space-size`): resized under allocation pressure, never a leak.
    pub managed_young: Vec<(f64, u64)>,
}

/// What a site holds at a checkpoint: a malloc site its live bytes; a mapping its resident
/// bytes (virtual sizes of runtimes' reservations, e.g. the JVM's 1 GiB class space or Go's
/// 64 MiB arenas, say nothing about memory use), falling back to the last resident figure known,
/// then to its live (mapped) bytes when none was ever read.
pub fn memory_by_kind(tl: &Timeline) -> KindSeries {
    let mut out = KindSeries::default();
    for (k, &t) in tl.raw_times.iter().enumerate() {
        let mut sums = [0u64; 4];
        let mut young = 0u64;
        for (si, st) in tl.stacks.iter().enumerate() {
            if tl.first_seen[si].is_none_or(|f| f > k) {
                continue;
            }
            let is_map = st.kind == StackKind::Mmap;
            // glibc's arena heaps mapped in free() hold blocks counted at their malloc sites
            // (and the heaps themselves in the allocator's resident figure): not runtime memory
            // of their own. A worker thread's leak counted twice ("runtime grows" at its rate).
            if is_map && crate::runtimes::is_malloc_arena_mapping(st) {
                continue;
            }
            let live = tl.live_bytes[si][k];
            let bytes = if is_map { tl.resident[si][k].unwrap_or(live) } else { live };
            // A native mapping is one the allocator made (growth mode: jemalloc's extents,
            // [`Timeline::kinds`]): heap, counted with native memory, not off-heap.
            let i = match tl.kinds[si] {
                MemoryKind::Managed => 0,
                MemoryKind::Native => 1,
                MemoryKind::OffHeap => 2,
                MemoryKind::Runtime => 3,
            };
            sums[i] = sums[i].saturating_add(bytes);
            if i == 0 && crate::runtimes::node::is_young_generation(st) {
                young = young.saturating_add(bytes);
            }
        }
        out.managed_young.push((t, young));
        out.managed.push((t, sums[0]));
        out.native.push((t, sums[1]));
        out.offheap.push((t, sums[2]));
        out.runtime.push((t, sums[3]));
    }
    out
}

/// The runtime's own managed-heap figures (used bytes) at the checkpoints that have them, in time
/// order. Empty when the runtime has no gauge, or one whose figures feed the occupied heap only
/// (`ManagedHeap::figures_only`).
pub fn gauge_series(rec: &Recording) -> Vec<(f64, u64)> {
    let mut v: Vec<(f64, u64)> = rec
        .checkpoints
        .iter()
        .filter(|c| c.t_s.is_finite())
        .filter_map(|c| c.managed.as_ref().filter(|m| !m.figures_only).map(|m| (c.t_s, m.used_bytes)))
        .collect();
    v.sort_by(|a, b| a.0.total_cmp(&b.0));
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analyze::fixtures::frame;
    use crate::recording::{Checkpoint, Runtime};

    fn sample(stack: u32, alloc: u64, free: u64, resident: Option<u64>) -> SiteSample {
        SiteSample {
            stack,
            alloc_bytes: alloc,
            alloc_count: alloc / 10,
            free_bytes: free,
            free_count: free / 10,
            resident_bytes: resident,
            ..Default::default()
        }
    }

    #[test]
    fn sorted_once_sparse_totals_carried_and_unknown_stacks_named() {
        let mut rec = crate::analyze::fixtures::mixed();
        rec.target.runtime = Some(Runtime::Python);
        let arena = Stack {
            id: 50,
            kind: StackKind::Mmap,
            frames: vec![
                frame("__mmap64", "/lib/libc.so.6", None).into(),
                frame("_PyObject_ArenaMmap", "/lib/libpython3.11.so", None).into(),
            ],
            lost: false,
            truncated: None,
            shared: false,
        };
        rec.stacks = vec![arena.clone(), Stack { frames: vec![], ..arena }];
        let cp = |t: f64, sites: Vec<SiteSample>| Checkpoint { t_s: t, sites, ..Default::default() };
        rec.checkpoints = vec![
            cp(2.0, vec![sample(50, 300, 0, None)]),
            cp(0.0, vec![sample(50, 100, 0, Some(4096)), sample(50, 20, 10, None)]),
            cp(f64::NAN, vec![sample(50, 999, 0, None)]),
            cp(1.0, vec![sample(7, 40, 0, None)]),
        ];
        let tl = Timeline::new(&rec);
        assert_eq!(tl.order, [1, 3, 0], "time order, the NaN checkpoint left out");
        assert_eq!(tl.times, [0.0, 1.0, 2.0]);
        assert!(tl.duplicate_ids);
        assert_eq!(tl.unknown_stacks, 1);
        assert_eq!(tl.stacks.len(), 3);
        assert_eq!((tl.stacks[2].id, tl.stacks[2].kind), (7, StackKind::Malloc));
        let arena = tl.index[&50];
        assert_eq!(arena, 0, "the first stack of a duplicated id");
        assert_eq!(tl.kinds[arena], MemoryKind::Managed, "classified once, under the runtime");
        assert_eq!(tl.live_bytes[arena], [110, 110, 300], "duplicates summed, totals carried, then replaced");
        assert_eq!(tl.resident[arena], [Some(4096), Some(4096), Some(4096)], "last resident figure carried");
        assert_eq!(tl.live_bytes[2], [0, 40, 40]);
        assert_eq!(tl.first_seen, [Some(0), None, Some(1)]);
        assert_eq!(tl.last[arena].alloc_bytes, 300);
        assert_eq!(tl.activity, [12 + 1, 12 + 1 + 4, 30 + 4], "allocations + frees so far");
        let live = tl.live_by_stack();
        assert_eq!(live.iter().map(|(ci, _)| *ci).collect::<Vec<_>>(), [1, 3, 0]);
        assert_eq!(live[0].1, BTreeMap::from([(50, 110)]), "stack 7 not seen yet");
        assert_eq!(live[2].1, BTreeMap::from([(7, 40), (50, 300)]));
    }
}
