//! `report.md`: the short human report. Verdict first, then the target, the top sites by growth
//! and by live bytes with their call stacks, what is not a leak, caveats, losses and probes.

use std::collections::{BTreeMap, HashSet};
use std::fmt::Write as _;

use crate::analyze::{Analysis, SiteAnalysis, SiteClass};
use crate::recording::{EndReason, Recording, StackKind};
use crate::runtimes::MemoryKind;

use crate::human::{bytes, bytes_signed, exact, exact_signed, rate, seconds};

pub use super::stack::{MAX_FRAMES, frame_line, stack_lines};

fn site_block(md: &mut String, rank: usize, s: &SiteAnalysis, a: &Analysis, unit: Option<&str>) {
    let runtime = a.runtime;
    let e = &s.evidence;
    let _ = writeln!(md, "### {rank}. {} — {} (confidence {:.2})\n", s.function, shown_class(s, a), s.confidence);
    let ci = s.growth_ci95_bytes_per_s.map_or(String::from("n/a"), |c| format!("{c:.0} B/s"));
    // Per unit of work first, when the recording counted units.
    let per_unit = match (s.growth_bytes_per_unit, unit) {
        (Some(u), Some(unit)) => format!(
            "{u:+.0} B per {unit} (±{} at 95 %); ",
            s.growth_ci95_bytes_per_unit.map_or("n/a".to_string(), |c| format!("{c:.0} B"))
        ),
        _ => String::new(),
    };
    let _ = writeln!(
        md,
        "- growth: {per_unit}{} ({:.1} B/s, ±{ci} at 95 %) over {:.0}–{:.0} s; {} ({}) first → last checkpoint",
        rate(s.growth_bytes_per_s),
        s.growth_bytes_per_s,
        e.steady.from_s,
        e.steady.to_s,
        bytes_signed(s.growth_bytes),
        exact_signed(s.growth_bytes)
    );
    // A mapping site counts a region as freed once wholly unmapped; a munmap of part of a
    // region (a JVM or a runtime trimming its reservations) frees bytes without a whole one.
    let freed = match (s.kind, s.frees) {
        (StackKind::Mmap, _) if s.freed_bytes == 0 => "unmapped none".to_string(),
        (StackKind::Mmap, 0) => {
            format!("unmapped {} ({}) in parts of mappings", bytes(s.freed_bytes), exact(s.freed_bytes))
        }
        (StackKind::Mmap, n) => {
            format!("unmapped {} ({}), {n} whole mapping(s) among it", bytes(s.freed_bytes), exact(s.freed_bytes))
        }
        (_, n) => format!("freed {} ({}) in {n}", bytes(s.freed_bytes), exact(s.freed_bytes)),
    };
    let _ = writeln!(
        md,
        "- live at end: {} ({}) in {} block(s); allocated {} ({}) in {} call(s), {freed}",
        bytes(s.live_bytes),
        exact(s.live_bytes),
        s.live_allocations,
        bytes(s.allocated_bytes),
        exact(s.allocated_bytes),
        s.allocations,
    );
    if s.kind == StackKind::Mmap {
        let res = s.resident_bytes.map_or("unknown".to_string(), |r| format!("{} ({})", bytes(r), exact(r)));
        let _ = writeln!(md, "- mapped at end: {} ({}), resident {res}", bytes(s.live_bytes), exact(s.live_bytes));
    }
    let kind = if s.kind == StackKind::Malloc { String::new() } else { format!(" [{} site]", s.kind) };
    let _ = writeln!(md, "- why: {}{kind}", e.reason);
    if let Some(h) = &s.likely_missing_release {
        let _ = writeln!(
            md,
            "- pattern: passes through {} ({}), whose result must be released with {}: likely missing \
             where this site leaks (source: {})",
            h.acquire, h.library, h.release, h.source
        );
    }
    if let Some(l) = super::escalation::first_touch_line(s) {
        let _ = writeln!(md, "{l}");
    }
    if let Some(l) = &s.lookalike {
        let _ = writeln!(md, "- looks like: {} ({}; source: {})", l.name, l.why, l.source);
    }
    if let Some(rt) = runtime {
        let origin = s.origin.clone().unwrap_or_else(|| crate::runtimes::kind_origin(rt, s.memory_kind).to_string());
        let _ = writeln!(md, "- memory kind: {} ({origin})", s.memory_kind);
    }
    md.push_str("\n```\n");
    for l in stack_lines(s) {
        let _ = writeln!(md, "{l}");
    }
    md.push_str("```\n\n");
}

/// The runtime split, side by side with RSS: which kind of memory grows, with numbers.
/// "Still allocated at exit": LeakSanitizer's list for a command that exited, each site with its
/// stack (one-time allocations of libc and the runtime left out and counted).
fn at_exit_lines(md: &mut String, a: &Analysis) {
    let Some(x) = &a.at_exit else { return };
    let _ = writeln!(
        md,
        "## Still allocated at exit
"
    );
    let _ = writeln!(
        md,
        "{}.
",
        super::at_exit::at_exit_phrase(a)
    );
    for (k, (&i, &(held_bytes, held_blocks))) in x.sites.iter().zip(&x.held).enumerate() {
        let s = &a.sites[i];
        let folded = match x.folded.get(k).map_or(0, Vec::len) {
            0 => String::new(),
            n => format!(" ({} stacks with these frames at other return addresses)", n + 1),
        };
        let reach = super::at_exit::at_exit_reach(x, k);
        let _ = writeln!(md, "- {} in {} block(s) from {}{reach}{folded}:", bytes(held_bytes), held_blocks, s.function);
        for l in stack_lines(s) {
            let _ = writeln!(md, "    - {l}");
        }
    }
    if !x.sites.is_empty() {
        md.push('\n');
    }
}

/// "Freed at exit": what a launched command's teardown (static destructors, atexit handlers,
/// interpreter finalization) freed, by site; the growth above was judged before it.
fn freed_at_exit_lines(md: &mut String, a: &Analysis) {
    let Some(f) = &a.freed_at_exit else { return };
    let _ = writeln!(md, "## Freed at exit\n");
    let _ = writeln!(md, "{}.\n", super::at_exit::freed_at_exit_phrase(a));
    for &(i, b, c) in &f.sites {
        let s = &a.sites[i];
        let _ =
            writeln!(md, "- freed at exit: {} in {} block(s) from {} ({})", bytes(b), c, s.function, s.class.as_str());
    }
    if !f.sites.is_empty() {
        md.push('\n');
    }
}

fn memory_by_kind(md: &mut String, a: &Analysis) {
    let Some(rt) = a.runtime else { return };
    let heap = crate::runtimes::heap_name(rt);
    let _ = writeln!(md, "## Memory by kind ({rt})\n");
    md.push_str("| memory | start | end | trend over the steady window | grows |\n|---|---|---|---|---|\n");
    let row = |md: &mut String, name: &str, pts: &[(f64, u64)], tr: Option<&crate::analyze::Trend>, g: &str| {
        let (Some(f), Some(l)) = (pts.first(), pts.last()) else { return };
        let trend = tr.map_or("n/a".to_string(), |t| {
            format!(
                "{} ({:.0} B/s, ±{} at 95 %)",
                rate(t.slope_bytes_per_s),
                t.slope_bytes_per_s,
                t.ci95_bytes_per_s.map_or("n/a".into(), |c| format!("{c:.0} B/s"))
            )
        });
        let _ = writeln!(md, "| {name} | {} | {} | {trend} | {g} |", bytes(f.1), bytes(l.1));
    };
    row(md, "RSS (VmRSS)", &a.memory.rss_bytes, None, "");
    row(md, "RSS anon", &a.memory.rss_anon_bytes, a.rss_anon_trend.as_ref(), "");
    row(md, "RSS shmem", &a.memory.rss_shmem_bytes, None, "");
    row(md, "RSS file", &a.memory.rss_file_bytes, None, "");
    for k in &a.kinds {
        let (name, pts) = match k.kind {
            MemoryKind::Managed if k.source == "sites" => {
                (format!("managed: {heap} (its sites)"), &a.memory.managed_bytes)
            }
            MemoryKind::Managed if k.source == crate::analyze::managed::MARKED_SOURCE => (
                format!("managed: {heap} (its sites; judged on what each collection marked live)"),
                &a.memory.managed_bytes,
            ),
            MemoryKind::Managed => (format!("managed: {heap} (used, {})", k.source), &a.memory.managed_bytes),
            MemoryKind::Native => ("native: malloc from native code".to_string(), &a.memory.native_live_bytes),
            MemoryKind::OffHeap => {
                (format!("off-heap: {}", crate::runtimes::kind_origin(rt, k.kind)), &a.memory.offheap_live_bytes)
            }
            MemoryKind::Runtime => {
                (format!("runtime: {}", crate::runtimes::kind_origin(rt, k.kind)), &a.memory.runtime_live_bytes)
            }
        };
        let g = match &k.collections {
            Some(c) if c.trend.is_none() && c.in_window == 0 => "unknown: no collection in the window",
            Some(c) if c.trend.is_none() => "unknown: too few collections",
            Some(c) if c.widened => {
                if k.grows {
                    "**yes** (on the whole span's collections)"
                } else {
                    "no (on the whole span's collections)"
                }
            }
            _ if k.grows => "**yes**",
            _ => "no",
        };
        row(md, &name, pts, Some(&k.trend), g);
    }
    md.push_str(
        "\nMappings count their resident bytes, malloc sites their live bytes; only memory \
         allocated since attach is seen at sites.\n\n",
    );
}

/// Growth per unit of work (the work probe's calls), when the recording counted units.
fn per_unit_lines(md: &mut String, a: &Analysis) {
    let Some(unit) = a.unit_name() else { return };
    let s = &a.summary;
    let calls = a.units_of_work.map_or(String::new(), |u| format!("; {u} units counted"));
    let Some(total) = s.growth_bytes_per_unit else {
        let _ = writeln!(
            md,
            "- per unit of work (1 unit = 1 {unit}{calls}): no unit counted over the steady window, growth is per second only"
        );
        return;
    };
    let ci = a.traced_unit_trend.and_then(|t| t.ci95_bytes_per_s).map_or("n/a".to_string(), |c| format!("{c:.0} B"));
    let fmt = |x: Option<f64>| x.map_or("n/a".to_string(), |v| format!("{v:+.0} B"));
    let _ = writeln!(
        md,
        "- per unit of work (1 unit = 1 {unit}{calls}): traced live bytes {total:+.0} B per {unit} (±{ci} at 95 %) over the steady window; native {}, off-heap {}, RSS anon {} per {unit}",
        fmt(s.native_growth_bytes_per_unit),
        fmt(s.offheap_growth_bytes_per_unit),
        fmt(s.rss_anon_growth_bytes_per_unit),
    );
}

/// Off-heap mappings (the occupied heap to RSS is at the report's head: `occupied::line`), and
/// in growth mode the allocator's own mappings (jemalloc's extents: heap, not off-heap).
fn offheap_lines(md: &mut String, a: &Analysis) {
    let s = &a.summary;
    let own: Vec<&SiteAnalysis> =
        a.sites.iter().filter(|s| s.kind == StackKind::Mmap && s.first_touch_in.is_some()).collect();
    if let Some(alloc) = own.first().and_then(|s| s.first_touch_in.as_deref()) {
        let held: u64 = own.iter().map(|s| s.held_bytes().0).sum();
        let growth: f64 = own.iter().map(|s| s.growth_bytes_per_s).sum();
        let _ = writeln!(
            md,
            "- the allocator's own mappings ({alloc}, {} site(s): heap growth through the \
             allocator, not off-heap): {} at the end; trend {} over the steady window",
            own.len(),
            bytes(held),
            rate(growth)
        );
    }
    if s.offheap_live_start_bytes > 0 || s.offheap_live_end_bytes > 0 {
        let _ = writeln!(
            md,
            "- off-heap ({}, resident): {} → {}; trend {} over the steady window",
            a.offheap_mappings(),
            bytes(s.offheap_live_start_bytes),
            bytes(s.offheap_live_end_bytes),
            rate(s.offheap_growth_bytes_per_s)
        );
    }
}

/// What the allocator's footprint holds beyond the traced live bytes, as far as it is known: a
/// launched command has no block from before attach, so the rest is freed memory the allocator
/// keeps and its overhead; a process attached to may also hold blocks allocated before attach,
/// and frees of such blocks (`untracked_free`) prove that some exist.
fn allocator_rest(rec: &Recording, a: &Analysis) -> String {
    let pre = a.events.get(leaktrace_common::counter::Counter::UntrackedFree.name()).copied().unwrap_or(0);
    if rec.target.launched {
        "freed memory the allocator keeps and its overhead".to_string()
    } else if pre > 0 {
        format!(
            "blocks allocated before attach and still live ({pre} frees of such blocks were seen), \
             freed memory the allocator keeps and its overhead, in unknown shares"
        )
    } else {
        "blocks allocated before attach and still live, or freed memory the allocator keeps and its \
         overhead; which of them is not known"
            .to_string()
    }
}

/// What RSS anon holds beyond the traced sites, at the end.
fn untraced_line(md: &mut String, rec: &Recording, a: &Analysis) {
    let s = &a.summary;
    let Some(anon) = s.rss_anon_end_bytes else {
        md.push_str("- Memory outside what was traced: unknown (no memory figures at the end).\n");
        return;
    };
    let native = s.native_live_end_bytes;
    // Shared mappings (memfd, shm_open) are resident as RssShmem, not in RSS anon: said apart.
    let shared: u64 = a
        .sites
        .iter()
        .filter(|x| x.shared_mapping && x.memory_kind == MemoryKind::OffHeap)
        .map(|x| x.resident_bytes.unwrap_or(0))
        .sum();
    let offheap = s.offheap_live_end_bytes.saturating_sub(shared);
    let mut parts =
        vec![format!("live native bytes {}", bytes(native)), format!("off-heap mappings {} resident", bytes(offheap))];
    let mut accounted = native.saturating_add(offheap);
    // A runtime's managed heap and the runtime-kind sites (arenas mapped in free(), the loader's
    // and the runtime's own mappings) are traced too.
    let last = |v: &[(f64, u64)]| v.last().map_or(0, |p| p.1);
    let (managed, runtime) = (last(&a.memory.managed_bytes), last(&a.memory.runtime_live_bytes));
    if managed > 0 {
        parts.push(format!("the managed heap {}", bytes(managed)));
    }
    if runtime > 0 {
        parts.push(format!("runtime, allocator and loader mappings {}", bytes(runtime)));
    }
    accounted = accounted.saturating_add(managed).saturating_add(runtime);
    if let Some(fp) = s.allocator_resident_end_bytes {
        // The allocator's footprint holds the traced live bytes and the rest: say what is known
        // of the rest ([`allocator_rest`]).
        // Attached: other mallocs than glibc are found by the blocks in their mappings and, with
        // no managed runtime, by the large anonymous mappings nothing else claims; with a runtime
        // an allocator's mapping where no block began since attach is not found.
        let missed = if rec.target.launched || s.allocator_unclaimed_regions.is_some_and(|n| n > 0) {
            ""
        } else {
            "; a mapping of the allocator where no block began since attach is not counted"
        };
        // Mappings counted by elimination may be the program's own: say so wherever counted.
        let likely = match (s.allocator_unclaimed_regions, s.allocator_unclaimed_resident_end_bytes) {
            (Some(n), Some(res)) if n > 0 => format!(
                "; {} of it in {n} large anonymous mapping(s) from before attach that hold no traced \
                 block, counted as {}'s by elimination: a mapping the program made itself before \
                 attach looks the same",
                bytes(res),
                s.allocator_family.unwrap_or("the allocator")
            ),
            _ => String::new(),
        };
        parts.push(format!(
            "the allocator's other resident memory {} ({}{missed}{likely})",
            bytes(fp.saturating_sub(native)),
            allocator_rest(rec, a)
        ));
        accounted = accounted.saturating_add(fp.saturating_sub(native));
    }
    let besides = if shared > 0 {
        format!(" (besides, shared mappings {} resident: RssShmem, not RSS anon)", bytes(shared))
    } else {
        String::new()
    };
    let _ = writeln!(
        md,
        "- Memory outside what was traced: RSS anon is {} at the end; {}: {} in all; the other {} \
         (thread stacks, memory allocated before attach or by untraced allocators, runtime memory) \
         is not attributed to any stack{besides}.",
        bytes(anon),
        parts.join(", "),
        bytes(accounted.min(anon)),
        bytes(anon.saturating_sub(accounted))
    );
}

/// A site's class as report.md shows it. Growth mode measures pages first touched by
/// stack, never a free: a fault site, or a mapping the allocator made, that the rules class as
/// a leak is shown as "grows (pages first touched)", and as "kept by the allocator" when the
/// verdict is fragmentation (glibc's arenas keep freed memory: not a leak). Other sites: their
/// class.
pub fn shown_class(s: &SiteAnalysis, a: &Analysis) -> String {
    let growth_site = s.kind == StackKind::Fault || s.first_touch_in.is_some();
    match (s.class, growth_site) {
        (SiteClass::Leak, true) if a.verdict.class == crate::analyze::ProcessClass::Fragmentation => {
            "kept by the allocator (fragmentation)".to_string()
        }
        (SiteClass::Leak, true) => "grows (pages first touched)".to_string(),
        (c, _) => c.to_string(),
    }
}

/// The whole report.md: the verdict, the measurement, what was held at exit, the top sites by
/// growth and by live bytes, the hooks' sections, what is not a leak, caveats and losses, probes.
pub fn report_md(rec: &Recording, a: &Analysis) -> String {
    let mut md = String::new();
    let v = &a.verdict;
    let _ = writeln!(md, "# leaktrace report\n");
    // A heap too seldom collected to judge is inconclusive, not flat: its headline says so.
    let shown = if v.inconclusive && v.by_kind == Some(crate::analyze::KindReason::ManagedUnknown) {
        "inconclusive".to_string()
    } else {
        v.class.to_string()
    };
    // Summaries may start with the class ("leak: ..."): said once.
    let class_prefix = format!("{shown}: ");
    let summary = super::verdict::sentence(a);
    let said = summary.strip_prefix(class_prefix.as_str()).unwrap_or(&summary);
    let _ = writeln!(md, "**Verdict: {shown}** (confidence {:.2}) — {said}\n", v.confidence);
    // Growth mode sees no live blocks: an occupied heap of 0 % would say nothing true.
    if let Some(line) = super::occupied::line(a).filter(|_| rec.mode != crate::recording::Mode::Growth) {
        let _ = writeln!(md, "{line}\n");
    }
    super::holds::holder_line(&mut md, rec);

    measurement_lines(&mut md, rec, a);
    at_exit_lines(&mut md, a);
    freed_at_exit_lines(&mut md, a);
    top_sites(&mut md, a);

    // Growth mode's exact window.
    super::escalation::escalation_md(&mut md, a);
    // What holds it: every producer's holders, then the reachability scan's, the Python
    // census's and the runtimes' own figures.
    super::what_holds::md(&mut md, rec, a);

    not_a_leak(&mut md, a);
    caveats(&mut md, rec, a);
    losses(&mut md, a);
    probes(&mut md, rec);
    md
}

/// report.md's "Measurement": per unit of work, the target and how it ran, then
/// [`memory_lines`].
fn measurement_lines(md: &mut String, rec: &Recording, a: &Analysis) {
    // Target and run.
    let t = &rec.target;
    let _ = writeln!(md, "## Measurement\n");
    per_unit_lines(md, a);
    let ns = if t.nspid.len() > 1 {
        format!(" (in its namespace: {})", t.nspid.last().copied().unwrap_or(t.pid))
    } else {
        String::new()
    };
    let _ = writeln!(md, "- pid: {}{ns}", t.pid);
    let _ = writeln!(md, "- command: `{}`", t.command.join(" ").replace('`', "'"));
    let _ = writeln!(md, "- exe: {}", t.exe);
    if let Some(rt) = &t.runtime {
        let v = t.runtime_version.as_deref().map(|v| format!(" {v}")).unwrap_or_default();
        let _ = writeln!(md, "- runtime: {rt}{v}");
    }
    let how = if t.launched {
        match t.exit_status {
            // The recording ended first (duration, signal, check's last batch): leaktrace stopped
            // the command (SIGTERM, then SIGKILL), which is what the status says.
            Some(st) if rec.end_reason != EndReason::TargetExited && st > 128 => {
                format!(
                    "launched by leaktrace and stopped by it when the recording ended (killed by signal {})",
                    st - 128
                )
            }
            Some(st) if st > 128 => format!("launched by leaktrace, killed by signal {}", st - 128),
            Some(st) => format!("launched by leaktrace, exited with status {st}"),
            None => "launched by leaktrace".to_string(),
        }
    } else {
        "attached to a running process".to_string()
    };
    let mode = match (rec.mode.as_str(), rec.sample_bytes) {
        ("sampled", Some(b)) => format!("sampled (one sample every {b} B on average: figures are estimates)"),
        (m, _) => m.to_string(),
    };
    let _ = writeln!(md, "- {how}; mode {mode}");
    // A launched command's plain exit is in the line above already; kills and attached ends are not.
    if let Some(ended) = t.ended.as_ref().filter(|e| !t.launched || !e.starts_with("exited")) {
        let _ = writeln!(md, "- the process ended during the recording: {ended}");
    }
    for e in &t.execs {
        let _ = writeln!(
            md,
            "- at t={:.1}s the process exec'd `{}` (was `{}`): the image changed there; sites before and after belong to different programs",
            e.t_s,
            e.command.join(" ").replace('`', "'"),
            e.from.replace('`', "'"),
        );
    }
    let _ = writeln!(
        md,
        "- duration: {} ({} checkpoints, every {} s{}), ended by: {}",
        seconds(a.duration_s),
        a.checkpoints,
        rec.interval_s,
        match rec.checkpoints.len() {
            n if n > a.checkpoints && a.freed_at_exit.is_some() => format!("; up to the teardown, of {n} recorded"),
            n if n > a.checkpoints => format!("; of {n} recorded"),
            _ => String::new(),
        },
        rec.end_reason
    );
    memory_lines(md, a);
}

/// report.md's figures of the process: RSS and its parts, the allocator's footprint, live native
/// bytes, off-heap, then the memory by kind.
fn memory_lines(md: &mut String, a: &Analysis) {
    let s = &a.summary;
    match (s.rss_start_bytes, s.rss_end_bytes) {
        (Some(b), Some(e)) => {
            let _ = writeln!(md, "- RSS: {} ({}) → {} ({})", bytes(b), exact(b), bytes(e), exact(e));
        }
        _ => {
            let _ = writeln!(md, "- RSS: not available");
        }
    }
    if let (Some(b), Some(e)) = (s.rss_anon_start_bytes, s.rss_anon_end_bytes) {
        let tr = a
            .rss_anon_trend
            .map_or(String::new(), |t| format!("; trend {} over the steady window", rate(t.slope_bytes_per_s)));
        let _ = writeln!(md, "- RSS anon: {} → {}{tr}", bytes(b), bytes(e));
    }
    // RSS split by kind (RssAnon / RssShmem / RssFile of /proc/PID/status), first → last.
    let ends = |v: &[(f64, u64)]| v.first().zip(v.last()).map(|(f, l)| (f.1, l.1));
    if let (Some(an), Some(sh), Some(fi)) =
        (ends(&a.memory.rss_anon_bytes), ends(&a.memory.rss_shmem_bytes), ends(&a.memory.rss_file_bytes))
    {
        let _ = writeln!(
            md,
            "- RSS by kind: anon {} → {}, shmem {} → {}, file {} → {}",
            bytes(an.0),
            bytes(an.1),
            bytes(sh.0),
            bytes(sh.1),
            bytes(fi.0),
            bytes(fi.1)
        );
    }
    if let (Some(b), Some(e)) = (s.allocator_resident_start_bytes, s.allocator_resident_end_bytes) {
        let _ = writeln!(
            md,
            "- allocator resident (heap, arenas and the allocator's mappings): {} → {}; trend {} over the steady window",
            bytes(b),
            bytes(e),
            rate(s.allocator_resident_growth_bytes_per_s.unwrap_or(0.0))
        );
    }
    let _ = writeln!(
        md,
        "- live native bytes (malloc, allocated since attach): {} ({}) → {} ({}); trend {} ({:.1} B/s, ±{} at 95 %) over {:.0}–{:.0} s",
        bytes(s.native_live_start_bytes),
        exact(s.native_live_start_bytes),
        bytes(s.native_live_end_bytes),
        exact(s.native_live_end_bytes),
        rate(s.native_growth_bytes_per_s),
        s.native_growth_bytes_per_s,
        a.native_trend.ci95_bytes_per_s.map_or("n/a".to_string(), |c| format!("{c:.0} B/s")),
        a.native_trend.from_s,
        a.native_trend.to_s,
    );
    offheap_lines(md, a);
    md.push('\n');
    memory_by_kind(md, a);
}

/// report.md's two lists of retaining stacks: the top sites by growth, then by live bytes at the
/// end (a table, then the blocks of the sites not shown already).
fn top_sites(md: &mut String, a: &Analysis) {
    let unit = a.unit_name();

    // Top sites.
    let mut shown: HashSet<u32> = HashSet::new();
    let growth = a.top_by_growth();
    let _ = writeln!(md, "## Retaining stacks: top {} sites by growth (steady-window slope of live bytes)\n", a.top);
    if growth.is_empty() {
        md.push_str("No site's live bytes grow.\n\n");
    }
    for (i, site) in growth.iter().enumerate() {
        site_block(md, i + 1, site, a, unit.as_deref());
        shown.insert(site.id);
    }
    let live = a.top_by_live();
    let _ = writeln!(md, "## Retaining stacks: top {} sites by live bytes at the end\n", a.top);
    if live.is_empty() {
        md.push_str("No traced allocation is live at the end.\n\n");
    } else {
        if live.iter().any(|s| s.kind == StackKind::Mmap) {
            md.push_str(
                "Mappings are ranked by their resident bytes (mapped bytes are virtual: a reservation may never be \
             touched); a mapping whose resident bytes are unknown comes last, by mapped bytes.\n\n",
            );
        }
        md.push_str("| # | live | blocks | growth | class | function |\n|---|---|---|---|---|---|\n");
        for (i, site) in live.iter().enumerate() {
            let held = match (site.kind, site.resident_bytes) {
                (StackKind::Mmap, Some(r)) => {
                    format!("resident {} ({}), mapped {}", bytes(r), exact(r), bytes(site.live_bytes))
                }
                (StackKind::Mmap, None) => {
                    format!("mapped {} ({}), resident unknown", bytes(site.live_bytes), exact(site.live_bytes))
                }
                _ => format!("{} ({})", bytes(site.live_bytes), exact(site.live_bytes)),
            };
            let _ = writeln!(
                md,
                "| {} | {held} | {} | {} | {} | {} |",
                i + 1,
                site.live_allocations,
                rate(site.growth_bytes_per_s),
                shown_class(site, a),
                site.function.replace('|', "\\|")
            );
        }
        md.push('\n');
        for (i, site) in live.iter().enumerate() {
            if shown.contains(&site.id) {
                continue;
            }
            site_block(md, i + 1, site, a, unit.as_deref());
        }
    }
}

/// report.md's "Not a leak": caches (rose, then levelled off) and temporary churn.
fn not_a_leak(md: &mut String, a: &Analysis) {
    // Not a leak.
    let caches: Vec<&SiteAnalysis> = a.sites_of(SiteClass::Cache).take(a.top).collect();
    let temps: Vec<&SiteAnalysis> = {
        let mut v: Vec<&SiteAnalysis> = a.sites_of(SiteClass::Temporary).collect();
        v.sort_by_key(|s| std::cmp::Reverse(s.allocated_bytes));
        v.truncate(a.top);
        v
    };
    let _ = writeln!(md, "## Not a leak\n");
    if caches.is_empty() && temps.is_empty() {
        md.push_str("No cache or temporary sites.\n\n");
    }
    if !caches.is_empty() {
        md.push_str("Caches (rose, then levelled off):\n\n");
        for c in &caches {
            // Thread stacks are judged by what is resident, not by the stacks they map.
            let holds = match c.threads {
                Some(t) if c.kind == crate::recording::StackKind::Mmap => format!(
                    "thread stacks of {} thread(s) hold {} resident ({} mapped)",
                    t.threads,
                    bytes(c.rank_bytes()),
                    bytes(c.live_bytes)
                ),
                _ => format!("holds {} ({})", bytes(c.live_bytes), exact(c.live_bytes)),
            };
            let _ = writeln!(
                md,
                "- {}: {holds}; rose {} since the first checkpoint, then {:.1} B/s over the steady \
                 window",
                c.function,
                bytes(c.evidence.rise_bytes.max(0.0) as u64),
                c.growth_bytes_per_s,
            );
        }
        md.push('\n');
    }
    if !temps.is_empty() {
        md.push_str("Temporary churn (allocated and freed):\n\n");
        for c in &temps {
            let held = if c.evidence.peak_live_bytes == 0 {
                "never live at a checkpoint".to_string()
            } else {
                format!(
                    "peak live {}, live at end {} ({:.0}× turnover)",
                    bytes(c.evidence.peak_live_bytes),
                    bytes(c.live_bytes),
                    c.evidence.turnover.unwrap_or(0.0)
                )
            };
            let _ = writeln!(
                md,
                "- {}: allocated {} ({}) in {} calls, {held}",
                c.function,
                bytes(c.allocated_bytes),
                exact(c.allocated_bytes),
                c.allocations,
            );
        }
        md.push('\n');
    }
}

/// report.md's "Caveats": memory outside what was traced, the warnings, and what leaktrace
/// cannot see.
fn caveats(md: &mut String, rec: &Recording, a: &Analysis) {
    // Caveats.
    let _ = writeln!(md, "## Caveats\n");
    untraced_line(md, rec, a);
    for w in rec.warnings.iter().chain(a.warnings.iter()) {
        let _ = writeln!(md, "- {w}");
    }
    md.push_str(
        "- Only allocations made after the probes were attached are seen; blocks allocated before \
         are invisible (their frees count as untracked_free).\n\
         - Live bytes are the sizes callers asked for; RSS also holds allocator overhead, freed \
         memory the allocator keeps, code, stacks and memory from untraced allocators.\n\
         - A site is called a leak only when its live bytes and live blocks keep growing through \
         the last half of the run, significantly and above a noise floor; memory that merely did \
         not fall is not a leak.\n\n",
    );
}

/// report.md's "Losses": the loss counters, the truncated stacks and their reasons, the events.
fn losses(md: &mut String, a: &Analysis) {
    let _ = writeln!(md, "### Losses\n");
    if a.drops_total == 0 {
        md.push_str("Nothing was dropped: every loss counter is zero.\n\n");
    } else {
        let _ = writeln!(md, "{} event(s) lost in total:\n", a.drops_total);
        md.push_str("| counter | count |\n|---|---|\n");
        for (k, v) in a.drops_by_name() {
            let _ = writeln!(md, "| {k} | {v} |");
        }
        md.push('\n');
    }
    // Truncated stacks lose attribution, not bytes: the sites whose walk stopped early, with
    // their live bytes and why.
    let truncated: Vec<&SiteAnalysis> = a.sites.iter().filter(|s| s.stack_truncated.is_some()).collect();
    if !truncated.is_empty() {
        let live: u64 = truncated.iter().map(|s| s.live_bytes).sum();
        let _ = writeln!(
            md,
            "{} site(s) have a truncated stack (their outer callers are unknown), holding {} live at the end:\n",
            truncated.len(),
            bytes(live)
        );
        let mut reasons: BTreeMap<&str, usize> = BTreeMap::new();
        for s in &truncated {
            *reasons.entry(s.stack_truncated.as_deref().unwrap_or_default()).or_default() += 1;
        }
        let mut reasons: Vec<(&str, usize)> = reasons.into_iter().collect();
        reasons.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
        for (why, n) in reasons.iter().take(10) {
            let _ = writeln!(md, "- {n} × {why}");
        }
        md.push('\n');
    }
    let ev: Vec<String> = a.events.iter().map(|(k, v)| format!("{k} {v}")).collect();
    if !ev.is_empty() {
        let _ = writeln!(md, "Events: {}.\n", ev.join(", "));
    }
}

/// report.md's "Probes": each attached probe.
fn probes(md: &mut String, rec: &Recording) {
    let _ = writeln!(md, "## Probes\n");
    if rec.probes.is_empty() {
        md.push_str("No probe recorded.\n");
    } else {
        md.push_str("| object | function | kind | offset | placement |\n|---|---|---|---|---|\n");
        for p in &rec.probes {
            let _ = writeln!(
                md,
                "| {} | {} | {} | {:#x} | {} |",
                p.object,
                p.function,
                p.kind,
                p.offset,
                p.placement.as_deref().unwrap_or("").replace('|', "\\|")
            );
        }
    }
}
