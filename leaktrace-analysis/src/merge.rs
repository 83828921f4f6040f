//! One site per call path, whatever the JIT did: stacks whose symbolized frames are the same are
//! merged into one site before anything is analysed.
//!
//! The kernel keys sites by the native stack, addresses and all. A JIT runtime compiles a hot
//! method more than once (the JVM's C1 then C2, a deoptimization and a recompilation; V8's
//! baseline then optimized code), each time at a new address: the same call path then becomes a
//! new stack, and one leak becomes several sites — the older ones stop growing when their code is
//! replaced and look like a cache or flat, and the leak's rate is split between them. Once the
//! JIT frames are named (from the runtime's perf map), such stacks have the same frames, and
//! [`merge_identical_stacks`] folds them into one.
//!
//! Two stacks are the same when they have the same kind, are both complete or both truncated,
//! and their frames are pairwise the same ([`FrameKey`]); and a truncated stack (its walk cut
//! short: a library mapped moments before, whose unwind table was not loaded yet) whose frames
//! are the start of exactly one longer complete stack's is that stack:
//! - native frames of a mapped object: the same object, offset in its file (the address when
//!   the offset is unknown), function and `inlined` flag;
//! - JIT frames (no object) with a name: the same name, once V8's tier marker is left out
//!   (`JS:*f` optimized, `JS:~f` unoptimized, `^` Sparkplug, `+` Maglev, and the older
//!   `LazyCompile:` / `Function:` / `InterpretedFunction:` prefixes read as `JS:`); HotSpot
//!   names every tier of a method alike (`void Ledger.append(long)`). Unnamed JIT frames are
//!   the same only at the same address;
//! - Python frames: the same function, file and line.
//!
//! Lost stacks and stacks without frames are never merged. The cost: two call sites in one JIT
//! method (a perf map has no line numbers) are one site.
//!
//! The kept stack is the group's smallest id among its complete stacks (stable: the same recording gives the same id in
//! report.json, the folded stacks, the flame graphs, `compare` and `check`); its frames (and
//! their addresses) are kept, and [`Recording::merged_stacks`] lists the ids folded into it.
//! Samples are cumulative and sparse (a stack absent from a checkpoint keeps its last totals):
//! at every checkpoint where a member of a group has a sample, the kept stack gets one sample
//! holding the sum of every member's totals as they stand then; resident bytes are the sum of
//! the members' last known figures. Reachability scans' per-site figures are summed the same
//! way. Merging a merged recording changes nothing.

use std::collections::{BTreeMap, HashMap};

use crate::reachability::{Reachability, SiteReach};
use crate::recording::{Frame, FrameKind, Recording, SiteSample, Stack, StackKind};

/// What makes two frames the same frame (see the module rules).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum FrameKey {
    /// Machine code of a mapped object: (object path, offset in the file or address, function,
    /// inlined).
    Native(String, u64, Option<String>, bool),
    /// Named JIT code: the name without V8's tier marker, and the inlined flag.
    Jit(String, bool),
    /// JIT code no perf map names: its address.
    UnnamedJit(u64),
    /// A Python frame: (function, file, line).
    Python(Option<String>, Option<String>, Option<u32>),
}

/// The [`FrameKey`] of one frame.
pub fn frame_key(f: &Frame) -> FrameKey {
    match (f.kind, &f.object, &f.function) {
        (FrameKind::Python, _, _) => FrameKey::Python(f.function.clone(), f.file.clone(), f.line),
        (FrameKind::Native, Some(obj), _) => {
            FrameKey::Native(obj.clone(), f.file_offset.unwrap_or(f.addr), f.function.clone(), f.inlined)
        }
        (FrameKind::Native, None, Some(name)) if !name.is_empty() => {
            FrameKey::Jit(crate::runtimes::node::jit_name(name), f.inlined)
        }
        (FrameKind::Native, None, _) => FrameKey::UnnamedJit(f.addr),
    }
}

/// What a frame reads as once symbolized, for lists that show stacks by their names (the
/// one-shot "still allocated at exit" list, [`crate::analyze::AtExit`]): a named native frame is
/// its object, function, source file and line (the function alone when there is no line), so
/// two return addresses of one function at the same line (a loop unrolled: two call sites) are
/// the same; a Python frame its function, file and line; any other frame its [`FrameKey`].
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum SymbolKey {
    /// A named native frame: (object, function, file, line); file and line are None without a
    /// line.
    Named(Option<String>, String, Option<String>, Option<u32>),
    /// Any other frame: its [`FrameKey`].
    Frame(FrameKey),
}

/// The [`SymbolKey`] of one frame.
pub fn symbol_key(f: &Frame) -> SymbolKey {
    match (&f.function, f.kind) {
        (Some(name), FrameKind::Native) if !name.is_empty() => {
            let (file, line) = match f.line {
                Some(l) => (f.file.clone(), Some(l)),
                None => (None, None),
            };
            SymbolKey::Named(f.object.clone(), name.clone(), file, line)
        }
        _ => SymbolKey::Frame(frame_key(f)),
    }
}

/// What makes two stacks read alike once symbolized: kind and every frame's [`SymbolKey`]. None
/// for a stack never merged (lost, or without frames).
pub fn symbolic_stack_key(
    kind: StackKind,
    lost: bool,
    frames: &[std::sync::Arc<Frame>],
) -> Option<(StackKind, Vec<SymbolKey>)> {
    if lost || frames.is_empty() {
        return None;
    }
    Some((kind, frames.iter().map(|f| symbol_key(f)).collect()))
}

/// What makes two stacks the same site: kind, truncated or not, and every frame's key. None for
/// a stack never merged (lost, or without frames).
fn stack_key(st: &Stack) -> Option<(StackKind, bool, Vec<FrameKey>)> {
    if st.lost || st.frames.is_empty() {
        return None;
    }
    Some((st.kind, st.truncated.is_some(), st.frames.iter().map(|f| frame_key(f)).collect()))
}

/// Merge the stacks of `rec` whose symbolized frames are the same into one site each (the
/// module rules): stacks, checkpoint samples and reachability figures rewritten, the ids folded
/// in recorded in [`Recording::merged_stacks`], one warning saying how many. Returns how many
/// stacks were folded into another (0: `rec` is untouched). Checkpoints are taken in the order
/// they are stored (a recording that passed [`Recording::validate`] has them in time order).
pub fn merge_identical_stacks(rec: &mut Recording) -> usize {
    // Group by key; the kept stack of a group is its smallest id.
    let mut groups: HashMap<(StackKind, bool, Vec<FrameKey>), Vec<u32>> = HashMap::new();
    let mut cut_short: std::collections::HashSet<u32> = Default::default();
    for st in &rec.stacks {
        if let Some(k) = stack_key(st) {
            if k.1 {
                cut_short.insert(st.id);
            }
            groups.entry(k).or_default().push(st.id);
        }
    }
    // A stack cut short whose frames begin exactly one longer complete stack's frames is that
    // stack's start: the walk stopped early (a library loaded moments before, whose unwind
    // table was not loaded yet), and its blocks are that call path's.
    let truncated: Vec<(StackKind, bool, Vec<FrameKey>)> = groups.keys().filter(|k| k.1).cloned().collect();
    for t in truncated {
        let mut longer =
            groups.keys().filter(|c| !c.1 && c.0 == t.0 && c.2.len() > t.2.len() && c.2.starts_with(&t.2)).cloned();
        if let (Some(c), None) = (longer.next(), longer.next())
            && let Some(ids) = groups.remove(&t)
        {
            groups.entry(c).or_default().extend(ids);
        }
    }
    let mut to_kept: HashMap<u32, u32> = HashMap::new();
    let mut members: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    for mut ids in groups.into_values() {
        ids.sort_unstable();
        ids.dedup();
        if ids.len() < 2 {
            continue;
        }
        // The kept stack is a complete one when the group has any (its frames are kept).
        let kept = ids.iter().copied().find(|id| !cut_short.contains(id)).unwrap_or(ids[0]);
        for &id in &ids {
            to_kept.insert(id, kept);
        }
        members.insert(kept, ids);
    }
    if members.is_empty() {
        return 0;
    }
    let folded = to_kept.len() - members.len();

    // Stacks: the kept one stays where it was; the others go.
    rec.stacks.retain(|st| to_kept.get(&st.id).is_none_or(|&k| k == st.id));
    for (&kept, ids) in &members {
        let entry = rec.merged_stacks.entry(kept).or_default();
        entry.extend(ids.iter().copied().filter(|&id| id != kept));
        // Ids already folded into a stack now folded in turn come along.
        let more: Vec<u32> =
            ids.iter().filter(|&&id| id != kept).filter_map(|id| rec.merged_stacks.remove(id)).flatten().collect();
        let entry = rec.merged_stacks.entry(kept).or_default();
        entry.extend(more);
        entry.sort_unstable();
        entry.dedup();
    }

    // Samples: per member, its totals as they stand; per group, one summed sample where a member
    // has one.
    let mut cur: HashMap<u32, SiteSample> = HashMap::new();
    let mut resident: HashMap<u32, u64> = HashMap::new();
    for cp in &mut rec.checkpoints {
        let mut here: Vec<(u32, SiteSample)> = Vec::new();
        let mut touched: Vec<u32> = Vec::new();
        let mut kept_sites = Vec::with_capacity(cp.sites.len());
        for s in std::mem::take(&mut cp.sites) {
            let Some(&kept) = to_kept.get(&s.stack) else {
                kept_sites.push(s);
                continue;
            };
            if !touched.contains(&kept) {
                touched.push(kept);
            }
            // Duplicate samples of one stack in a checkpoint are summed (as the timeline does).
            match here.iter_mut().find(|(id, _)| *id == s.stack) {
                Some((_, e)) => e.add(&s),
                None => here.push((s.stack, s)),
            }
        }
        for (id, s) in here {
            if let Some(r) = s.resident_bytes {
                resident.insert(id, r);
            }
            cur.insert(id, s);
        }
        for kept in touched {
            let mut sum = SiteSample { stack: kept, ..Default::default() };
            let mut res: Option<u64> = None;
            for id in &members[&kept] {
                if let Some(s) = cur.get(id) {
                    let resident_bytes = sum.resident_bytes;
                    sum.add(s);
                    sum.resident_bytes = resident_bytes;
                }
                if let Some(&r) = resident.get(id) {
                    res = Some(res.unwrap_or(0).saturating_add(r));
                }
            }
            sum.resident_bytes = res;
            kept_sites.push(sum);
        }
        cp.sites = kept_sites;
    }

    // Reachability: per-site figures summed under the kept id.
    for scan in rec.reachability.iter_mut().chain(rec.reachability_scans.iter_mut()) {
        merge_reach(scan, &to_kept);
    }

    let joined =
        to_kept.iter().filter(|&(id, kept)| id != kept && cut_short.contains(id) && !cut_short.contains(kept)).count();
    let cut = if joined > 0 {
        format!(
            "; {joined} of them cut short (a library mapped moments before, its unwind table not loaded yet) and \
             joined to the one complete stack they begin"
        )
    } else {
        String::new()
    };
    rec.warnings.push(format!(
        "{folded} call stack(s) folded into {} site(s) with the same frames at other code addresses (JIT code \
         compiled again: the runtime's recompilation or deoptimization; or another code object for the same Python \
         function and line){cut}; each site's bytes are the sum of its stacks'",
        members.len()
    ));
    folded
}

/// One scan's sites under their kept ids: figures summed, the kept stack's retaining chain (else
/// the first member's that has one).
fn merge_reach(scan: &mut Reachability, to_kept: &HashMap<u32, u32>) {
    let mut out: Vec<SiteReach> = Vec::with_capacity(scan.sites.len());
    for s in std::mem::take(&mut scan.sites) {
        let id = to_kept.get(&s.stack).copied().unwrap_or(s.stack);
        match out.iter_mut().find(|o| o.stack == id) {
            Some(o) => {
                o.reachable_bytes = o.reachable_bytes.saturating_add(s.reachable_bytes);
                o.reachable_blocks = o.reachable_blocks.saturating_add(s.reachable_blocks);
                o.unreachable_bytes = o.unreachable_bytes.saturating_add(s.unreachable_bytes);
                o.unreachable_blocks = o.unreachable_blocks.saturating_add(s.unreachable_blocks);
                if (s.stack == id || o.retained_by.is_empty()) && !s.retained_by.is_empty() {
                    o.retained_by = s.retained_by;
                }
            }
            None => out.push(SiteReach { stack: id, ..s }),
        }
    }
    scan.sites = out;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analyze::{AnalyzeOptions, SiteClass, analyze};
    use crate::recording::Checkpoint;
    use crate::runtimes::node::jit_name;

    fn native(function: &str, object: &str, addr: u64) -> Frame {
        Frame {
            addr,
            object: Some(object.into()),
            function: Some(function.into()),
            file_offset: Some(addr - 0x7f00_0000_0000),
            ..Default::default()
        }
    }

    fn jit(name: &str, addr: u64) -> Frame {
        Frame { addr, function: Some(name.into()), ..Default::default() }
    }

    /// The stack of `Unsafe.allocateMemory` called from `stashQuote`, its compiled code at `at`.
    fn stash(id: u32, at: u64) -> Stack {
        Stack {
            id,
            kind: StackKind::Malloc,
            frames: vec![
                native("malloc", "/lib/libc.so.6", 0x7f00_0000_1000).into(),
                native("Unsafe_AllocateMemory0", "/jvm/libjvm.so", 0x7f00_0010_2000).into(),
                jit("void OrderBook.stashQuote(long, boolean)", at).into(),
                jit("Interpreter", 0x7f10_0000_0100).into(),
                native("JavaCalls::call_helper", "/jvm/libjvm.so", 0x7f00_0010_3000).into(),
            ],
            lost: false,
            truncated: None,
            shared: false,
        }
    }

    fn sample(stack: u32, alloc_bytes: u64, free_bytes: u64) -> SiteSample {
        SiteSample {
            stack,
            alloc_bytes,
            alloc_count: alloc_bytes / 4096,
            free_bytes,
            free_count: free_bytes / 4096,
            resident_bytes: None,
            ..Default::default()
        }
    }

    /// A method leaking 409,600 B/s (100 blocks of 4 KiB a second) over 12 s, its code compiled
    /// three times (at 0, 4 and 8 s: stacks 7, 3 and 9, in that order), beside a decoy at the same
    /// call path but another caller (stack 5) that frees what it allocates. Samples are sparse:
    /// a stack whose code was replaced has none after.
    fn recompiled() -> Recording {
        let mut rec = crate::analyze::fixtures::mixed();
        let mut decoy = stash(5, 0x7f10_0000_9000);
        decoy.frames[2] = jit("long OrderBook.scratch(long)", 0x7f10_0000_9000).into();
        rec.stacks = vec![stash(7, 0x7f10_0000_1000), stash(3, 0x7f10_0000_2000), stash(9, 0x7f10_0000_3000), decoy];
        rec.checkpoints = (0..=12u64)
            .map(|t| {
                let bytes = t * 409_600;
                let mut sites = vec![sample(5, bytes, bytes)];
                // Stack 7 runs for 0..4 s, 3 for 4..8 s, 9 for 8..12 s.
                if t <= 4 {
                    sites.push(sample(7, bytes, 0));
                }
                if (5..=8).contains(&t) {
                    sites.push(sample(3, (bytes - 4 * 409_600).min(4 * 409_600), 0));
                }
                if t >= 9 {
                    sites.push(sample(9, bytes - 8 * 409_600, 0));
                }
                Checkpoint { t_s: t as f64, sites, ..Default::default() }
            })
            .collect();
        rec.warnings.clear();
        rec
    }

    #[test]
    fn recompiled_stacks_become_one_leak_at_the_whole_rate() {
        let rec = recompiled();
        // Unmerged: the leak is split, the older code's stacks stop growing.
        let before = analyze(&rec, &AnalyzeOptions { top: 10 });
        let split: Vec<_> = before.sites.iter().filter(|s| s.function.contains("stashQuote")).collect();
        assert_eq!(split.len(), 3, "{split:#?}");
        assert!(split.iter().any(|s| s.class != SiteClass::Leak), "one of the split sites is not called a leak");

        let mut merged = rec.clone();
        assert_eq!(merge_identical_stacks(&mut merged), 2);
        let ids: Vec<u32> = merged.stacks.iter().map(|s| s.id).collect();
        assert_eq!(ids, [3, 5], "the smallest id of the group is kept, in its place; the decoy stays");
        assert_eq!(merged.stacks[0].frames[2].addr, 0x7f10_0000_2000, "the kept stack's own addresses");
        assert_eq!(merged.merged_stacks, BTreeMap::from([(3, vec![7, 9])]));
        // Every checkpoint with a sample of a member has one summed sample of the kept id.
        for (t, cp) in merged.checkpoints.iter().enumerate() {
            let s: Vec<&SiteSample> = cp.sites.iter().filter(|s| s.stack == 3).collect();
            assert_eq!(s.len(), 1, "checkpoint {t}: {:?}", cp.sites);
            assert_eq!(s[0].live_bytes(), t as u64 * 409_600, "checkpoint {t}: totals carried and summed");
            assert_eq!(s[0].alloc_count, t as u64 * 100);
            assert!(!cp.sites.iter().any(|s| s.stack == 7 || s.stack == 9));
        }
        assert!(
            merged.warnings.iter().any(|w| w.starts_with("2 call stack(s) folded into 1 site(s)")),
            "{:?}",
            merged.warnings
        );

        let after = analyze(&merged, &AnalyzeOptions { top: 10 });
        let one: Vec<_> = after.sites.iter().filter(|s| s.function.contains("stashQuote")).collect();
        assert_eq!(one.len(), 1, "{one:#?}");
        assert_eq!(one[0].id, 3);
        assert_eq!(one[0].class, SiteClass::Leak);
        let rate = one[0].growth_bytes_per_s;
        assert!((rate - 409_600.0).abs() < 0.01 * 409_600.0, "rate {rate}");
        assert!(!after.sites.iter().any(|s| s.function.contains("scratch") && s.class == SiteClass::Leak));

        // Idempotent, and what a saved recording reads back as.
        let mut again = merged.clone();
        assert_eq!(merge_identical_stacks(&mut again), 0);
        assert_eq!(again, merged);
        let back = Recording::parse(&serde_json::to_vec(&rec).unwrap()).unwrap();
        assert_eq!(back, merged, "a recording is merged when it is read");
        // ... and its frames shared again: malloc's frame is one Arc in both stacks.
        assert!(std::sync::Arc::ptr_eq(&back.stacks[0].frames[0], &back.stacks[1].frames[0]));
        assert!(!std::sync::Arc::ptr_eq(&back.stacks[0].frames[2], &back.stacks[1].frames[2]), "not the same frame");
    }

    #[test]
    fn frame_keys() {
        // V8's tiers of one function are one frame; other functions, files or unnamed code are not.
        assert_eq!(jit_name("JS:*step /srv/app.js:10:14"), "JS:step /srv/app.js:10:14");
        assert_eq!(jit_name("LazyCompile:~step /srv/app.js:10:14"), "JS:step /srv/app.js:10:14");
        assert_eq!(jit_name("JS:^step /srv/app.js:10:14"), jit_name("JS:+step /srv/app.js:10:14"));
        assert_eq!(jit_name("void Ledger.append(long)"), "void Ledger.append(long)");
        assert_eq!(jit_name("Builtin:ArrayPush"), "Builtin:ArrayPush");
        assert_eq!(frame_key(&jit("JS:*f a.js:1", 1)), frame_key(&jit("JS:~f a.js:1", 2)));
        assert_ne!(frame_key(&jit("JS:*f a.js:1", 1)), frame_key(&jit("JS:*f b.js:1", 1)));
        assert_ne!(
            frame_key(&Frame { addr: 1, ..Default::default() }),
            frame_key(&Frame { addr: 2, ..Default::default() })
        );
        // Native frames: by object and offset, not by name alone.
        assert_ne!(
            frame_key(&native("f", "/a.so", 0x7f00_0000_1000)),
            frame_key(&native("f", "/a.so", 0x7f00_0000_1010))
        );
        // Python frames: function, file and line.
        let py = |line| Frame {
            kind: FrameKind::Python,
            addr: line as u64,
            function: Some("load".into()),
            file: Some("app.py".into()),
            line: Some(line),
            ..Default::default()
        };
        assert_eq!(frame_key(&py(3)), frame_key(&Frame { addr: 99, ..py(3) }));
        assert_ne!(frame_key(&py(3)), frame_key(&py(4)));
    }

    #[test]
    fn sparse_samples_resident_bytes_and_reachability_are_summed() {
        let mut rec = recompiled();
        for st in &mut rec.stacks {
            st.kind = StackKind::Mmap;
        }
        // Stack 7 has a resident figure at 1 s only, stack 3 at 6 s: from 6 s on, both count.
        rec.checkpoints[1].sites.iter_mut().find(|s| s.stack == 7).unwrap().resident_bytes = Some(4096);
        rec.checkpoints[6].sites.iter_mut().find(|s| s.stack == 3).unwrap().resident_bytes = Some(8192);
        rec.reachability = Some(Reachability {
            sites: vec![
                SiteReach { stack: 9, reachable_bytes: 10, reachable_blocks: 1, ..Default::default() },
                SiteReach { stack: 5, unreachable_bytes: 7, ..Default::default() },
                SiteReach { stack: 7, unreachable_bytes: 20, unreachable_blocks: 2, ..Default::default() },
            ],
            ..Default::default()
        });
        merge_identical_stacks(&mut rec);
        let at = |t: usize| rec.checkpoints[t].sites.iter().find(|s| s.stack == 3).unwrap().resident_bytes;
        assert_eq!(at(1), Some(4096));
        assert_eq!(at(6), Some(4096 + 8192));
        assert_eq!(at(10), Some(4096 + 8192), "last known figures carried");
        let reach = &rec.reachability.as_ref().unwrap().sites;
        assert_eq!(reach.len(), 2);
        let r3 = reach.iter().find(|s| s.stack == 3).unwrap();
        assert_eq!((r3.reachable_bytes, r3.unreachable_bytes, r3.unreachable_blocks), (10, 20, 2));
    }

    #[test]
    fn a_stack_cut_short_joins_the_one_complete_stack_it_begins() {
        let mut rec = recompiled();
        // Stack 2: the first three frames of stack 7, cut short (its library had no unwind
        // table yet), with the first second's blocks.
        let mut cut = stash(2, 0x7f10_0000_1000);
        cut.frames.truncate(3);
        cut.truncated = Some("no unwind info".into());
        rec.stacks.push(cut.clone());
        for cp in &mut rec.checkpoints {
            cp.sites.push(sample(2, 409_600, 0));
        }
        // Stacks 7, 3 and 9 fold together; 2 begins them (their frames are the same): into 3,
        // the smallest complete id (not 2), whose frames are kept.
        assert_eq!(merge_identical_stacks(&mut rec), 3);
        assert_eq!(rec.merged_stacks[&3], vec![2, 7, 9]);
        assert_eq!(rec.stacks.iter().find(|s| s.id == 3).unwrap().frames.len(), 5);
        assert!(!rec.stacks.iter().any(|s| s.id == 2));
        let last = rec.checkpoints.last().unwrap();
        let s3 = last.sites.iter().find(|s| s.stack == 3).unwrap();
        assert_eq!(s3.live_bytes(), 12 * 409_600 + 409_600);
        // Two complete stacks it could begin (the decoy has the same first two frames): left alone.
        let mut rec = recompiled();
        let mut cut2 = cut;
        cut2.frames.truncate(2);
        rec.stacks.push(cut2);
        merge_identical_stacks(&mut rec);
        assert!(rec.stacks.iter().any(|s| s.id == 2));
    }

    #[test]
    fn lost_truncated_and_different_kinds_are_not_merged() {
        let mut rec = recompiled();
        rec.stacks[1].truncated = Some("depth limit (127 frames)".into());
        rec.stacks[2].kind = StackKind::Mmap;
        let lost =
            Stack { id: 11, kind: StackKind::Malloc, frames: vec![], lost: true, truncated: None, shared: false };
        rec.stacks.push(lost.clone());
        rec.stacks.push(Stack { id: 12, ..lost });
        assert_eq!(merge_identical_stacks(&mut rec), 0);
        assert!(rec.merged_stacks.is_empty());
    }
}
