//! The verdict's sentence: one line for humans, naming the culprit function and its rate for a
//! leak, made from the facts the analysis found ([`Verdict`]'s reason, runtime split and losses).
//! report.md, report.json, the summary and the command line all print this sentence.

use crate::analyze::{Analysis, KindGrowth, KindReason, Losses, Reason, SiteAnalysis, SiteClass, Verdict};
use crate::human::{bytes as hb, rate as hr};
use crate::recording::{Runtime, StackKind};
use crate::runtimes::{MemoryKind, heap_name, kind_origin};
use leaktrace_common::counter::Counter;

mod retention;
use retention::{allocator_parts, beneath_clause, glibc_arenas_clause, glibc_retention_lead, retention_phrase};

/// The verdict of `a` as one line for humans.
pub fn sentence(a: &Analysis) -> String {
    let v: &Verdict = &a.verdict;
    let base = match (&v.by_kind, a.runtime) {
        (Some(KindReason::ManagedLeak), Some(rt)) => match a.kinds.iter().find(|g| g.kind == MemoryKind::Managed) {
            Some(m) => managed_leak(rt, m, a),
            None => reason(a),
        },
        (Some(KindReason::KindLeak { kind, top, label, count }), Some(rt)) => {
            let mut s = kind_leak(rt, *kind, &a.sites[*top], label, *count, &a.kinds);
            if let Some(held) = a.python_holds.as_ref().and_then(crate::runtimes::python::report::retainer_clause) {
                s.push_str(&format!("; {held}"));
            }
            s
        }
        (Some(KindReason::KindGrows { kind }), Some(rt)) => match a.kinds.iter().find(|g| g.kind == *kind) {
            Some(g) => kind_grows(rt, g, a),
            None => reason(a),
        },
        (Some(KindReason::ManagedUnknown), Some(rt)) => {
            let heap = heap_name(rt);
            match a.kinds.iter().find_map(|g| g.collections.as_ref().filter(|_| g.kind == MemoryKind::Managed)) {
                Some(c) => {
                    // A runtime warming up (its JIT's native sites growing) is said too: not a
                    // leak there, though its heap cannot be judged yet.
                    let warm = match a.verdict.reason {
                        Reason::WarmUp { .. } => {
                            format!(
                                "; {}",
                                reason(a).trim_start_matches("no leak: ").trim_start_matches("no leak").trim()
                            )
                        }
                        _ => String::new(),
                    };
                    format!(
                        "{} (the {heap} is judged on what each collection leaves; what it gains between them may be \
                         garbage){warm}; by kind: {}",
                        crate::analyze::managed::unknown_phrase(c, Some(rt)),
                        kind_states(a, rt)
                    )
                }
                None => reason(a),
            }
        }
        (Some(KindReason::ByKind), Some(rt)) => format!("{}; by kind: {}", reason(a), kind_states(a, rt)),
        _ => reason(a),
    };
    // Growth mode's exact window first: it names the function whose blocks grow.
    let base = match escalation_clause(a) {
        Some(clause) => format!("{clause}; growth mode: {base}"),
        None => base,
    };
    let base = match released_at_exit(a) {
        Some(r) => format!("{base}; {r}"),
        None => base,
    };
    let base = match super::plateau::clause(a) {
        Some(p) => format!("{base}; {p}"),
        None => base,
    };
    let base = match &a.scale {
        Some(sc) => format!("{base}; {}", scale_phrase(sc)),
        None => base,
    };
    match &v.losses {
        None => base,
        Some(l) => {
            let why = losses_phrase(a, l);
            // Frees not seen (address_reused) leave blocks live until their address comes
            // back: the growth may be high, not low; calls lost the other way make it low.
            let frees_unseen = l.counters.iter().any(|(c, _)| c == Counter::AddressReused.name());
            let allocs_lost = l.counters.iter().any(|(c, _)| c != Counter::AddressReused.name());
            if l.lower_bound {
                match (allocs_lost, frees_unseen) {
                    (true, false) => format!("{base}; {why}: the growth is a lower bound"),
                    (false, _) => format!("{base}; {why}: live bytes may include blocks freed unseen"),
                    (true, true) => format!(
                        "{base}; {why}: the growth may be higher (allocations lost) or lower (blocks freed unseen)"
                    ),
                }
            } else {
                format!("inconclusive: {why}; without them: {base}")
            }
        }
    }
}

/// "scale: 1.7 MiB a day, 0.4 % of RSS, the cgroup's memory limit (512.0 MiB) reached in 210
/// days at this rate" ("no cgroup memory limit" without one): what a leak's rate means.
pub fn scale_phrase(sc: &crate::analyze::scale::Scale) -> String {
    let share = sc.share_of_rss.map_or(String::new(), |s| format!(", {:.1} % of RSS", s * 100.0));
    let limit = match (sc.memory_limit_bytes, sc.seconds_to_limit) {
        (Some(l), Some(s)) => format!(
            "the cgroup's memory limit ({}) reached in {} at this rate",
            hb(l),
            crate::analyze::scale::duration_words(s)
        ),
        _ => "no cgroup memory limit".to_string(),
    };
    format!("scale: {} a day{share}, {limit}", hb(sc.bytes_per_day.max(0.0) as u64))
}

/// "released only at exit: the teardown freed 40.0 KiB in 80 block(s) from remember_request": the
/// leaking sites whose blocks the teardown freed (growth was judged before it); None when the
/// verdict is not a leak, or no leaking site freed anything at exit.
fn released_at_exit(a: &Analysis) -> Option<String> {
    let f = a.freed_at_exit.as_ref()?;
    if a.verdict.inconclusive || !matches!(a.verdict.reason, Reason::Leaks { .. }) {
        return None;
    }
    let named: Vec<String> = f
        .sites
        .iter()
        .filter(|&&(i, _, _)| a.sites[i].class == crate::analyze::SiteClass::Leak)
        .take(3)
        .map(|&(i, b, c)| format!("{} in {} block(s) from {}", hb(b), c, a.sites[i].function))
        .collect();
    (!named.is_empty()).then(|| format!("released only at exit: the teardown freed {}", named.join(", ")))
}

/// "stay flat (12 B/s)" for a rate inside the site noise floor's absolute part, "grow far less
/// (62772 B/s)" above it (the verdict has already judged the rate not to be the growth).
fn flat(bytes_per_s: f64) -> String {
    if bytes_per_s.abs() < crate::analyze::SITE_FLOOR_BYTES_PER_S {
        format!("stay flat ({bytes_per_s:.0} B/s)")
    } else {
        format!("grow far less ({bytes_per_s:.0} B/s)")
    }
}

/// "N % of allocator calls were not fully traced (counters; what each means)": a full map
/// (allocations not recorded: raise the limits), returns not seen (`missed_return`), frees not
/// seen (`address_reused`: the block was retired when its address was allocated again; with
/// --pymalloc, an interpreter built with LTO frees inside itself without calling PyObject_Free).
fn losses_phrase(a: &Analysis, l: &Losses) -> String {
    let full = |name: &str| leaktrace_common::counter::by_name(name).is_some_and(|i| i.full);
    let mut parts: Vec<String> = l
        .counters
        .iter()
        .map(|(name, n)| match Counter::from_name(name) {
            Some(Counter::MissedReturn) => format!(
                "missed_return {n}: calls whose return was not seen — longjmp, an exception through the allocator, a \
                 thread ending inside a call"
            ),
            Some(Counter::AddressReused) => {
                let why = if a.pymalloc_hooked {
                    "with --pymalloc, an interpreter built with LTO, as Debian's python3.11, frees inside itself \
                     without calling PyObject_Free"
                } else {
                    "a release inlined into its caller, or made by a function that is not probed"
                };
                format!(
                    "address_reused {n}: blocks whose free was not seen, each retired when its address was allocated \
                     again — {why}"
                )
            }
            _ => format!("{name} {n}"),
        })
        .collect();
    if l.counters.iter().any(|(c, _)| full(c)) {
        parts.push("raise --max-allocs / --max-sites".to_string());
    }
    format!("{:.0} % of allocator calls were not fully traced ({})", l.share * 100.0, parts.join("; "))
}

/// The sentence of the verdict's [`Reason`].
fn reason(a: &Analysis) -> String {
    match &a.verdict.reason {
        Reason::Leaks { offheap, top, count, total_bytes_per_s, also, window_s } => {
            let window = format!("{:.0}–{:.0} s", window_s.0, window_s.1);
            let unit = a.unit_name();
            let (name, other) =
                if *offheap { ("off-heap", "a leak in the malloc heap") } else { ("leak", "an off-heap leak") };
            // Growth mode through the allocator measures growth, not a leak.
            let name = if a.sites[*top].first_touch_in.is_some() { "growth through the allocator" } else { name };
            let escalated = a.escalation.is_some();
            let mut summary = format!("{name}: {}", leak_phrase(&a.sites[*top], unit.as_deref(), &window, escalated));
            if let Some(held) = a.python_holds.as_ref().and_then(crate::runtimes::python::report::retainer_clause) {
                summary.push_str(&format!("; {held}"));
            }
            if *count > 1 {
                summary.push_str(&format!(
                    "; {} leaking {}sites in all, {} in total",
                    count,
                    if *offheap { "mapping " } else { "" },
                    hr(*total_bytes_per_s)
                ));
            }
            if let Some((o, n, total)) = also {
                summary.push_str(&format!(
                    "; also {other}: {}",
                    leak_phrase(&a.sites[*o], unit.as_deref(), &window, escalated)
                ));
                if *n > 1 {
                    summary.push_str(&format!(" ({} sites, {} in total)", n, hr(*total)));
                }
            }
            summary
        }
        Reason::AllocatorRetains { trend, native_bytes_per_s, whole_span, glibc, beneath } => format!(
            "fragmentation: {}the allocator's resident memory ({}) grows {} ({:.0} B/s ± {:.0}) over \
             {} while live native bytes {}: freed memory is kept by the allocator \
             (fragmentation or retention), not leaked{}; knob: {}{}",
            glibc_retention_lead(a, glibc.as_ref()),
            allocator_parts(a),
            hr(trend.slope_bytes_per_s),
            trend.slope_bytes_per_s,
            trend.ci95_bytes_per_s.unwrap_or(0.0),
            if *whole_span {
                "the whole recording (too unsteady between checkpoints to show over the steady window alone)"
            } else {
                "the steady window"
            },
            flat(*native_bytes_per_s),
            glibc_arenas_clause(glibc.as_ref(), a.summary.allocator_family),
            crate::analyze::retention::allocator_and_knob(a.summary.allocator_family).1,
            beneath_clause(a, *beneath, trend.slope_bytes_per_s)
        ),
        Reason::Retention { retention, family } => retention_phrase(retention, *family),
        Reason::ArenasHoldFreed { trend, in_use_bytes_per_s, top, sites_bytes_per_s } => format!(
            "fragmentation: glibc's arenas grow {} ({:.0} B/s ± {:.0}; their headers' system_mem) over the \
             steady window while the bytes glibc counts in use (system_mem − free chunks) {}: \
             the pages first touched under {} ({} in all, growth mode) are freed memory the arenas \
             keep, not a leak; knob: {}",
            hr(trend.slope_bytes_per_s),
            trend.slope_bytes_per_s,
            trend.ci95_bytes_per_s.unwrap_or(0.0),
            flat(*in_use_bytes_per_s),
            a.sites[*top].function,
            hr(*sites_bytes_per_s),
            crate::analyze::retention::allocator_and_knob(None).1
        ),
        Reason::RssOutgrowsTraced { trend, traced_bytes_per_s, heap_flat } => {
            rss_outgrows_phrase(a, trend, traced_bytes_per_s, heap_flat)
        }
        Reason::UntracedShmem { trend, traced_bytes_per_s } => format!(
            "RSS grows and nothing traced explains it: shared memory (RssShmem) grows {} ({:.0} B/s ± \
             {:.0} at 95 %) while traced live bytes {} — shared mappings made before \
             attach or not through a traced call (memfd, shm_open, SysV shm); not \"no leak\"",
            hr(trend.slope_bytes_per_s),
            trend.slope_bytes_per_s,
            trend.ci95_bytes_per_s.unwrap_or(0.0),
            flat(*traced_bytes_per_s)
        ),
        Reason::FileBacked { trend, traced_bytes_per_s, site } => {
            file_backed_phrase(a, trend, traced_bytes_per_s, site)
        }
        Reason::TooShort { checkpoints, duration_s } => {
            format!(
                "inconclusive: too short to classify (its allocations and frees spanned {checkpoints} \
                 checkpoint(s), {duration_s:.1} s); {}",
                super::at_exit::at_exit_phrase(a)
            )
        }
        Reason::ExactWindowCut { end_reason, duration_s, checkpoints } => {
            let how = if end_reason == "duration" {
                format!("too short ({duration_s:.1} s, {checkpoints} checkpoint(s))")
            } else {
                format!("cut after {duration_s:.1} s ({checkpoints} checkpoint(s)): it ended by {end_reason}")
            };
            format!(
                "inconclusive: the exact window was {how}, too little to tell a leak from freed memory the \
                 allocator keeps; record again with a longer --escalate-for, or record --mode exact"
            )
        }
        Reason::TooFewCheckpoints { n } => {
            format!("inconclusive: only {n} checkpoint(s), growth cannot be measured; no leak found")
        }
        Reason::WarmUp { top, count, total_bytes_per_s, rss_anon_bytes_per_s } => {
            warm_up_phrase(a, top, count, total_bytes_per_s, rss_anon_bytes_per_s)
        }
        Reason::Caches { top, count, retained_bytes, single_step: true } => {
            let top = &a.sites[*top];
            format!(
                "inconclusive: {} rose in one step to {} (never freed) and stayed flat; one step is \
                 not a plateau (a leak in bursts looks the same): record at least two periods; {} \
                 cache site(s) retain {} in all",
                top.function,
                hb(top.live_bytes),
                count,
                hb(*retained_bytes)
            )
        }
        Reason::Caches { top, count, retained_bytes, .. } => caches_phrase(a, top, count, retained_bytes),
        Reason::ShortLived { count, freed_bytes, freed_blocks, native_bytes_per_s } => {
            short_lived_phrase(a, count, freed_bytes, freed_blocks, native_bytes_per_s)
        }
        Reason::NotSignificant { top, count } => not_significant_phrase(a, top, count),
        Reason::WarmUpSettled { top, count, bytes_per_s, allocated_bytes_per_s, last_rise_s, last_part_from_s } => {
            let others = if *count > 1 { format!(" and {} other site(s)", count - 1) } else { String::new() };
            format!(
                "inconclusive: warm-up — {}{others} grew {} over the steady window ({:.4} % of the {}/s the \
                 process allocates), reached its last high {last_rise_s:.1} s into the recording and none in \
                 its last third (from {last_part_from_s:.1} s): a structure filled early, not a leak so far; \
                 record longer to see it stay level",
                a.sites[*top].function,
                hr(*bytes_per_s),
                100.0 * bytes_per_s / allocated_bytes_per_s.max(1.0),
                hb(*allocated_bytes_per_s as u64),
            )
        }
        Reason::Flat { native_bytes_per_s } => format!(
            "no leak: no allocation site grows beyond noise (live native bytes {:.0} B/s over the \
             steady window)",
            native_bytes_per_s
        ),
    }
}

/// [`Reason::RssOutgrowsTraced`]: RSS anon grows, traced live bytes do not, and the likely cause.
fn rss_outgrows_phrase(
    a: &Analysis,
    trend: &crate::analyze::Trend,
    traced_bytes_per_s: &f64,
    heap_flat: &bool,
) -> String {
    let cause = if *heap_flat {
        format!(
            "the malloc heap's own footprint ({}) does not grow, so the memory comes from \
             elsewhere (an allocator that is not traced, thread stacks, mappings made before \
             attach)",
            allocator_parts(a)
        )
    } else {
        "the allocator holds freed memory (fragmentation) or memory comes from an allocator \
         that is not traced"
            .to_string()
    };
    format!(
        "fragmentation: RSS (anon) grows {} ({:.0} B/s ± {:.0}) over the steady window while \
         traced live bytes {}: {cause} — not a leak of traced allocations",
        hr(trend.slope_bytes_per_s),
        trend.slope_bytes_per_s,
        trend.ci95_bytes_per_s.unwrap_or(0.0),
        flat(*traced_bytes_per_s)
    )
}

/// [`Reason::FileBacked`]: file-backed pages grow, and the traced mapping site holding them if any.
fn file_backed_phrase(
    a: &Analysis,
    trend: &crate::analyze::Trend,
    traced_bytes_per_s: &f64,
    site: &Option<(usize, u64, u64)>,
) -> String {
    let whose = match site {
        Some((i, first, last)) => {
            let s = &a.sites[*i];
            format!(
                "the pages are in mappings made at {} (a traced mapping site: {} mapped, \
                 resident {} → {}): its mapped size {}, its resident pages grow",
                s.function,
                hb(s.live_bytes),
                hb(*first),
                hb(*last),
                if s.growth_bytes_per_s.abs() < trend.slope_bytes_per_s / 4.0 { "does not grow" } else { "grows too" }
            )
        }
        None => "no traced mapping site holds them: files mapped privately (not traced) or \
                 mapped before attach"
            .to_string(),
    };
    format!(
        "RSS grows and nothing traced explains it: file-backed memory (RssFile) grows {} \
         ({:.0} B/s ± {:.0} at 95 %) while traced live bytes {} — pages of mapped files \
         touched over time; {whose}; not \"no leak\"",
        hr(trend.slope_bytes_per_s),
        trend.slope_bytes_per_s,
        trend.ci95_bytes_per_s.unwrap_or(0.0),
        flat(*traced_bytes_per_s)
    )
}

/// [`Reason::WarmUp`]: the runtime's JIT and code-cache sites grow.
fn warm_up_phrase(
    a: &Analysis,
    top: &usize,
    count: &usize,
    total_bytes_per_s: &f64,
    rss_anon_bytes_per_s: &Option<f64>,
) -> String {
    let top = &a.sites[*top];
    let what = top.lookalike.as_ref().map_or("runtime warm-up", |l| l.name.as_str());
    let rss = rss_anon_bytes_per_s.map_or(String::new(), |r| format!("; RSS (anon) {} meanwhile", hr(r)));
    format!(
        "no leak: the runtime is warming up — {count} site(s) of its JIT compilation and code \
         caches grow {} in all over the steady window, largest {} ({}: {what}){rss}; warm-up \
         is not counted as a leak: record after the runtime has warmed up to see it level off",
        hr(*total_bytes_per_s),
        top.function,
        hr(top.growth_bytes_per_s)
    )
}

/// [`Reason::Caches`] (not a single step): the largest cache and what the caches retain.
fn caches_phrase(a: &Analysis, top: &usize, count: &usize, retained_bytes: &u64) -> String {
    let top = &a.sites[*top];
    let holds = match top.threads {
        Some(t) if top.kind == StackKind::Mmap => format!(
            "thread stacks of {} thread(s) made by {} hold {} resident ({} mapped)",
            t.threads,
            top.function,
            hb(top.rank_bytes()),
            hb(top.live_bytes)
        ),
        _ => format!("{} holds {}", top.function, hb(top.live_bytes)),
    };
    format!(
        "no leak: memory rose and levelled off (cache-like retention); largest: {holds} \
         (+{} since the first checkpoint, {:.0} B/s over the steady window); {} cache site(s) \
         retain {} in all",
        hb(top.growth_bytes.max(0) as u64),
        top.growth_bytes_per_s,
        count,
        hb(*retained_bytes)
    )
}

/// [`Reason::ShortLived`]: short-lived allocations, or growth mode's pages faulted in and returned.
fn short_lived_phrase(
    a: &Analysis,
    count: &usize,
    freed_bytes: &u64,
    freed_blocks: &u64,
    native_bytes_per_s: &f64,
) -> String {
    // Growth mode: the temporary fault stacks' pages were faulted in and returned.
    let faults: Vec<&SiteAnalysis> =
        a.sites.iter().filter(|s| s.kind == StackKind::Fault && s.class == SiteClass::Temporary).collect();
    if faults.is_empty() {
        format!(
            "no leak: allocations are short-lived — {} site(s) allocated and freed {} in {} \
             blocks; live native bytes {}",
            count,
            hb(*freed_bytes),
            freed_blocks,
            flat(*native_bytes_per_s)
        )
    } else {
        format!(
            "no leak: pages are faulted in and returned — {} stack(s) faulted in {} in {} pages \
             (growth mode sees no frees: RSS anon does not follow them)",
            faults.len(),
            hb(faults.iter().map(|s| s.allocated_bytes).sum()),
            faults.iter().map(|s| s.allocations).sum::<u64>()
        )
    }
}

/// [`Reason::NotSignificant`]: the top site whose steady slope's interval includes zero.
fn not_significant_phrase(a: &Analysis, top: &usize, count: &usize) -> String {
    let s = &a.sites[*top];
    let e = &s.evidence;
    format!(
        "inconclusive: not significant — {} grew {} in the first part, then {} ± {} over the steady window \
         (95 % interval, {} checkpoints: as wide as the slope); no leak verdict rests on a slope whose \
         interval includes zero: record longer or under steadier load to tell a leak from scatter; {} \
         site(s) like it",
        s.function,
        hr(e.early.map_or(0.0, |x| x.slope_bytes_per_s)),
        hr(e.steady.slope_bytes_per_s),
        hr(e.steady.ci95_bytes_per_s.unwrap_or(f64::INFINITY)).trim_start_matches('+'),
        e.steady.n,
        count
    )
}

/// How each kind moved ([`state`]; the runtime's own memory only when it grows).
fn kind_states(a: &Analysis, rt: Runtime) -> String {
    a.kinds
        .iter()
        .filter(|g| g.kind != MemoryKind::Runtime || g.grows)
        .map(|g| state(rt, g))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A kind's name in the verdict: the runtime's heap for managed memory, else the kind.
fn kind_label(rt: Runtime, k: MemoryKind) -> String {
    if k == MemoryKind::Managed { heap_name(rt).to_string() } else { k.as_str().to_string() }
}

/// "native grows +1.0 KiB/s", "V8 heap rose and levelled off (+2.1 MiB/s over the steady
/// window, flat in the last quarter)", "V8 heap rose only at the load spikes (3 rise(s),
/// +19.1 KiB/s over the steady window, flat between them: part of the plateau)", "V8 heap flat (+4.8 KiB/s, below its noise floor of
/// +37.5 KiB/s)", "Python heap flat (+457.7 KiB/s ± 1.1 MiB/s at 95 %: not told apart from
/// zero)" or "Python heap flat (+0 B/s)". A positive rate called flat always says why (below
/// the noise floor, or its 95 % interval reaches zero); one that cannot say why is not printed.
fn state(rt: Runtime, g: &KindGrowth) -> String {
    let slope = g.trend.slope_bytes_per_s;
    // What prints as at least "+1 B/s".
    let positive = slope >= 0.5;
    if g.grows {
        format!("{} grows {}", kind_label(rt, g.kind), hr(g.trend.slope_bytes_per_s))
    } else if let Some(c) = g.collections.as_ref().filter(|c| c.trend.is_none()) {
        // Judged on its collections and none (or one) ran: unknown, never flat.
        crate::analyze::managed::unknown_state(&kind_label(rt, g.kind), c)
    } else if let Some(rises) = g.at_load_spikes {
        format!(
            "{} rose only at the load spikes ({rises} rise(s), {} over the steady window, flat between them: part of the plateau)",
            kind_label(rt, g.kind),
            hr(g.trend.slope_bytes_per_s)
        )
    } else if g.levelled_off {
        format!(
            "{} rose and levelled off ({} over the steady window, flat in the last quarter)",
            kind_label(rt, g.kind),
            hr(g.trend.slope_bytes_per_s)
        )
    } else if positive && g.trend.significant_growth && slope < g.noise_floor_bytes_per_s {
        format!(
            "{} flat ({}, below its noise floor of {})",
            kind_label(rt, g.kind),
            hr(slope),
            hr(g.noise_floor_bytes_per_s)
        )
    } else if positive && !g.trend.significant_growth {
        match g.trend.ci95_bytes_per_s {
            Some(ci) => format!(
                "{} flat ({} ± {} at 95 %: not told apart from zero)",
                kind_label(rt, g.kind),
                hr(slope),
                hr(ci.abs()).trim_start_matches('+')
            ),
            None => format!("{} flat ({}, too few points to tell from zero)", kind_label(rt, g.kind), hr(slope)),
        }
    } else if positive {
        format!("{} flat", kind_label(rt, g.kind))
    } else {
        format!("{} flat ({})", kind_label(rt, g.kind), hr(slope))
    }
}

/// The states of the kinds other than `except` (runtime memory only when it grows).
fn others(rt: Runtime, kinds: &[KindGrowth], except: MemoryKind) -> String {
    kinds
        .iter()
        .filter(|g| g.kind != except && (g.kind != MemoryKind::Runtime || g.grows))
        .map(|g| state(rt, g))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The managed heap grows. When its leaking sites are named after the program's own code (a
/// JavaScript function from Node's perf map, a Python line or an extension with `--pymalloc`:
/// [`crate::analyze::is_program_frame`]), the fastest-growing such culprit is named with its rate,
/// summed over its sites.
fn managed_leak(rt: Runtime, m: &KindGrowth, a: &Analysis) -> String {
    let heap = heap_name(rt);
    let source = match m.source.as_str() {
        "sites" => String::new(),
        crate::analyze::managed::MARKED_SOURCE => ", live bytes marked by each collection".to_string(),
        s => format!(", {s}"),
    };
    let head = format!(
        "managed leak: the {heap} grows {} ({:.0} B/s ± {:.0} at 95 %{source}) over the \
         steady window to {}; {}",
        hr(m.trend.slope_bytes_per_s),
        m.trend.slope_bytes_per_s,
        m.trend.ci95_bytes_per_s.unwrap_or(0.0),
        hb(m.end_bytes),
        others(rt, &a.kinds, MemoryKind::Managed),
    );
    match managed_culprit(a) {
        Some((function, rate, n)) => format!(
            "{head}; its leaking sites are allocated under {function}: {} ({rate:.0} B/s) in {n} \
             site(s). {}",
            hr(rate),
            what_keeps(rt, a, "leaktrace sees the code that grew the heap, not which objects keep it: ")
        ),
        None if rt == Runtime::Python && !a.pymalloc_hooked && arenas_grow(a) => format!(
            "{head}. pymalloc's arenas (_PyObject_ArenaMmap) grow and pymalloc was not hooked: \
             record with --pymalloc (or run the target with PYTHONMALLOC=malloc) to name the \
             function and line that allocate; {}",
            what_keeps(rt, a, "")
        ),
        None => format!(
            "{head}. {}",
            what_keeps(rt, a, "leaktrace sees the runtime's allocator, not the code that keeps the objects: ")
        ),
    }
}

/// True when pymalloc's arenas hold the Python heap's growth: the Python heap's mapping sites
/// (under CPython's rules every managed mapping is an arena, made under `_PyObject_ArenaMmap`
/// or its kin: [`crate::runtimes::python::classify`]) grew since the first checkpoint, by at
/// least half of what the managed sites grew in all. Arenas come 1 MiB at a time (3.11): a
/// Python heap growing tens of KiB a second maps one every many seconds, so what they grew over
/// the recording says it, not their slope over the steady window.
fn arenas_grow(a: &Analysis) -> bool {
    let managed = a.sites.iter().filter(|s| s.memory_kind == MemoryKind::Managed);
    let (mut arenas, mut all) = (0i64, 0i64);
    for s in managed {
        all += s.growth_bytes.max(0);
        if s.kind == StackKind::Mmap {
            arenas += s.growth_bytes.max(0);
        }
    }
    arenas > 0 && 2 * arenas >= all
}

/// The culprit of the managed heap's leaking sites that are named after the program's own code
/// ([`crate::analyze::is_program_frame`]; not a pymalloc arena), the one whose sites grow fastest in all: (its label,
/// their summed steady-window growth in bytes per second, how many sites). None when no leaking
/// managed site is.
fn managed_culprit(a: &Analysis) -> Option<(&str, f64, usize)> {
    let mut by_function: Vec<(&str, f64, usize)> = Vec::new();
    // A pymalloc arena holds every caller's objects: not named after the Python line that
    // happened to map it.
    let arena = |s: &SiteAnalysis| a.runtime == Some(Runtime::Python) && s.kind == StackKind::Mmap;
    let named = a.sites.iter().filter(|s| {
        s.class == SiteClass::Leak
            && s.memory_kind == MemoryKind::Managed
            && !arena(s)
            && s.culprit_frame.and_then(|i| s.frames.get(i)).is_some_and(|f| crate::analyze::is_program_frame(f))
    });
    for s in named {
        match by_function.iter_mut().find(|(f, _, _)| *f == s.function) {
            Some((_, rate, n)) => {
                *rate += s.growth_bytes_per_s;
                *n += 1;
            }
            None => by_function.push((&s.function, s.growth_bytes_per_s, 1)),
        }
    }
    by_function.into_iter().filter(|(_, rate, _)| *rate > 0.0).max_by(|x, y| x.1.total_cmp(&y.1))
}

/// A kind's series grows while none of its sites is a leak: "off-heap grows +41.9 KiB/s (42858
/// B/s ± 20558 at 95 %) over the steady window to 124.0 KiB, though no site of it grows beyond
/// its own noise ...; Python heap flat (0 B/s), native flat (0 B/s)".
fn kind_grows(rt: Runtime, g: &KindGrowth, a: &Analysis) -> String {
    let kinds = &a.kinds;
    let what = if g.kind == MemoryKind::OffHeap { a.offheap_mappings() } else { "malloc from native code" };
    format!(
        "{} grows {} ({:.0} B/s ± {:.0} at 95 %) over the steady window to {} ({what}), though \
         no site of it grows beyond its own noise (growth spread over many sites, or a mapping \
         filled page by page); {}: not \"no leak\" — record longer to name the site",
        g.kind,
        hr(g.trend.slope_bytes_per_s),
        g.trend.slope_bytes_per_s,
        g.trend.ci95_bytes_per_s.unwrap_or(0.0),
        hb(g.end_bytes),
        others(rt, kinds, g.kind)
    )
}

/// Sites of kind `k` leak; `top` is the fastest of `count`.
fn kind_leak(
    rt: Runtime,
    k: MemoryKind,
    top: &SiteAnalysis,
    label: &str,
    count: usize,
    kinds: &[KindGrowth],
) -> String {
    let mut summary = format!(
        "{k} leak in {} ({}), {}: {} holds {} more live bytes ({:.0} B/s ± {:.0} at 95 %) \
         over the steady window; {} ({} B) live at the end",
        label,
        top.origin.as_deref().unwrap_or(kind_origin(rt, k)),
        others(rt, kinds, k),
        top.function,
        hr(top.growth_bytes_per_s),
        top.growth_bytes_per_s,
        top.growth_ci95_bytes_per_s.unwrap_or(0.0),
        hb(top.live_bytes),
        top.live_bytes
    );
    if let Some(h) = &top.likely_missing_release {
        summary.push_str(&format!("; it passes through {} ({}): likely missing {}", h.acquire, h.library, h.release));
    }
    if count > 1 {
        summary.push_str(&format!("; {count} leaking {k} sites in all"));
    }
    summary
}

/// The exact window's conclusion (growth mode's escalation), to lead the verdict:
/// its leaking site's phrase, or its own sentence when nothing leaked in it. None without one.
fn escalation_clause(a: &Analysis) -> Option<String> {
    let e = a.escalation.as_deref()?;
    let head = format!("exact window of {:.0} s after growth mode", e.duration_s);
    Some(match &e.verdict.reason {
        Reason::Leaks { top, window_s, .. } if e.verdict.class == crate::analyze::ProcessClass::Leak => {
            let window = format!("{:.0}–{:.0} s of the window", window_s.0, window_s.1);
            format!("leak ({head}): {}", leak_phrase(&e.sites[*top], e.unit_name().as_deref(), &window, true))
        }
        _ => format!("{head}: {}", sentence(e)),
    })
}

/// A growth-mode fault site that touched its pages inside the allocator, or a mapping the
/// allocator made (jemalloc's extents): what it measures, "pages first touched under
/// F" / "pages mapped by the allocator under F", that growth mode cannot tell a leak from freed
/// memory the allocator keeps, and — without an exact window (`escalated` false) — where to get
/// the holder.
fn first_touch_phrase(s: &SiteAnalysis, alloc: &str, per_s: &str, window: &str, escalated: bool) -> String {
    let how = if s.kind == StackKind::Mmap {
        let (held, resident) = s.held_bytes();
        format!(
            "pages mapped by the allocator ({alloc}) under {} grow {per_s} over the steady window ({window}): \
             the allocator maps memory for the blocks it hands out, so this is heap growth through it, \
             not memory the program maps itself; {} ({held} B) {} at the end",
            s.function,
            hb(held),
            if resident { "resident" } else { "mapped" }
        )
    } else {
        format!(
            "pages first touched under {} grow {per_s} over the steady window ({window}), touched inside \
             the allocator ({alloc}): growth mode charges a page to whoever asked malloc for memory when \
             its heap reached a new page, not to the blocks that hold it; {} ({} B) resident at the end",
            s.function,
            hb(s.live_bytes),
            s.live_bytes
        )
    };
    let advice = if escalated {
        ""
    } else {
        "; an exact window names the allocating function (growth mode escalates unless --no-escalate, \
         or record --mode exact)"
    };
    format!("{how}; growth mode cannot tell leaked blocks from freed memory the allocator keeps{advice}")
}

/// How a leaking site grows, for the verdict: per unit of work first when measured, then per
/// second, over the steady `window`; what it holds at the end (mapped and resident bytes for a
/// mapping).
fn leak_phrase(s: &SiteAnalysis, unit: Option<&str>, window: &str, escalated: bool) -> String {
    let per_s = match s.growth_ci95_bytes_per_s {
        // A leak in steps: its rate is its envelope's, which has no interval.
        None if s.evidence.steps > 0 => format!(
            "{} ({:.0} B/s, the envelope of {} steps)",
            hr(s.growth_bytes_per_s),
            s.growth_bytes_per_s,
            s.evidence.steps
        ),
        ci => {
            format!("{} ({:.0} B/s ± {:.0} at 95 %)", hr(s.growth_bytes_per_s), s.growth_bytes_per_s, ci.unwrap_or(0.0))
        }
    };
    if let Some(alloc) = &s.first_touch_in {
        return first_touch_phrase(s, alloc, &per_s, window, escalated);
    }
    let map = s.kind == StackKind::Mmap;
    match s.threads {
        Some(t) if map => {
            return format!(
                "thread stacks: {} threads not joined, created by {} through pthread_create ({:+} \
                 over the steady window, {window}); their stacks grow {per_s} in resident bytes; {} \
                 mapped, {} resident at the end",
                t.threads,
                s.function,
                t.new_threads,
                hb(s.live_bytes),
                hb(s.rank_bytes())
            );
        }
        Some(t) => {
            return format!(
                "{} holds {per_s} more live bytes over the steady window ({window}) of per-thread memory \
                 that pthread_create allocates: {} threads not joined; {} ({} B) live at the end",
                s.function,
                t.threads,
                hb(s.live_bytes),
                s.live_bytes
            );
        }
        None => {}
    }
    let growth = match (s.growth_bytes_per_unit, unit, map) {
        (Some(u), Some(unit), false) => format!(
            "{} holds {u:.0} B more live bytes per {unit} (± {:.0} at 95 %), {per_s} over the \
             steady window ({window})",
            s.function,
            s.growth_ci95_bytes_per_unit.unwrap_or(0.0)
        ),
        (Some(u), Some(unit), true) => format!(
            "{} maps {u:.0} B per {unit} (± {:.0} at 95 %) in {} it never unmaps, \
             {per_s} over the steady window ({window})",
            s.function,
            s.mapping_kind(),
            s.growth_ci95_bytes_per_unit.unwrap_or(0.0)
        ),
        (_, _, false) => format!("{} holds {per_s} more live bytes over the steady window ({window})", s.function),
        (_, _, true) => format!(
            "{} maps {per_s} more in {} it never unmaps over the steady window \
             ({window})",
            s.function,
            s.mapping_kind()
        ),
    };
    let held = match (map, s.resident_bytes) {
        (true, Some(r)) => format!("{} ({} B) mapped, {} resident at the end", hb(s.live_bytes), s.live_bytes, hb(r)),
        (true, None) => format!("{} ({} B) mapped at the end", hb(s.live_bytes), s.live_bytes),
        _ => format!("{} ({} B) live at the end", hb(s.live_bytes), s.live_bytes),
    };
    match &s.likely_missing_release {
        Some(h) => {
            format!("{growth}; {held}; it passes through {} ({}): likely missing {}", h.acquire, h.library, h.release)
        }
        None => format!("{growth}; {held}"),
    }
}

/// What keeps the growing managed heap: the Python heap censuses' holder when
/// there is one, else the runtime's own census (class, path from a GC root, JS
/// function, goroutine group), else `prefix` and where to look ([`heap_tool`]).
fn what_keeps(rt: Runtime, a: &Analysis, prefix: &str) -> String {
    match a.python_holds.as_ref().and_then(crate::runtimes::python::report::verdict_clause) {
        Some(held) => held,
        None => match &a.runtime_holder {
            Some(h) => format!("what holds it (the runtime's own census): {h}"),
            None => format!("{prefix}{}", heap_tool(rt)),
        },
    }
}

/// Where to look for what holds a growing managed heap (leaktrace sees the runtime's allocator,
/// not the code that keeps the objects reachable).
fn heap_tool(runtime: Runtime) -> &'static str {
    crate::runtimes::rules(runtime).heap_tool()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analyze::Trend;

    fn kind(slope: f64, ci95: Option<f64>, significant: bool, floor: f64) -> KindGrowth {
        KindGrowth {
            kind: MemoryKind::Managed,
            source: String::new(),
            start_bytes: 0,
            end_bytes: 0,
            trend: Trend {
                n: 8,
                slope_bytes_per_s: slope,
                ci95_bytes_per_s: ci95,
                significant_growth: significant,
                ..Default::default()
            },
            troughs: 0,
            noise_floor_bytes_per_s: floor,
            grows: false,
            levelled_off: false,
            collections: None,
            at_load_spikes: None,
        }
    }

    /// A positive rate called flat says why, or is not printed (a 3.7 run's "Python heap
    /// flat (+457.7 KiB/s)").
    #[test]
    fn a_positive_rate_called_flat_says_why() {
        let py = Runtime::Python;
        let s = state(py, &kind(468_685.0, Some(1_200_000.0), false, 50_000.0));
        assert_eq!(s, "Python heap flat (+457.7 KiB/s ± 1.1 MiB/s at 95 %: not told apart from zero)");
        let s = state(py, &kind(468_685.0, None, false, 50_000.0));
        assert_eq!(s, "Python heap flat (+457.7 KiB/s, too few points to tell from zero)");
        let s = state(py, &kind(4_915.0, Some(100.0), true, 38_400.0));
        assert_eq!(s, "Python heap flat (+4.8 KiB/s, below its noise floor of +37.5 KiB/s)");
        // Significant and above the floor, yet not growing (the classification said otherwise):
        // no rate without its reason.
        assert_eq!(state(py, &kind(468_685.0, Some(100.0), true, 50_000.0)), "Python heap flat");
        assert_eq!(state(py, &kind(0.0, Some(100.0), false, 50_000.0)), "Python heap flat (0 B/s)");
        assert_eq!(state(py, &kind(-2048.0, Some(100.0), true, 50_000.0)), "Python heap flat (-2.0 KiB/s)");
    }

    /// A 40 B/s leak reads per day, with its share of RSS and the time to the
    /// cgroup's limit (years when it would take years), or "no cgroup memory limit".
    #[test]
    fn scale_reads_per_day_and_to_the_limit() {
        let mut sc = crate::analyze::scale::Scale {
            bytes_per_s: 40.0,
            bytes_per_day: 40.0 * 86_400.0,
            held_bytes: 1200,
            share_of_rss: Some(1200.0 / (120 << 20) as f64),
            memory_limit_bytes: None,
            seconds_to_limit: None,
        };
        assert_eq!(scale_phrase(&sc), "scale: 3.3 MiB a day, 0.0 % of RSS, no cgroup memory limit");
        sc.memory_limit_bytes = Some(8 << 30);
        sc.seconds_to_limit = Some(((8u64 << 30) - (120 << 20)) as f64 / 40.0);
        assert_eq!(
            scale_phrase(&sc),
            "scale: 3.3 MiB a day, 0.0 % of RSS, the cgroup's memory limit (8.0 GiB) reached in 6.7 years at this rate"
        );
    }
}
