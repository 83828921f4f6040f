//! `report.json`: the machine-readable report. Field by field description with units in
//! `docs/report-json.md`; bump [`SCHEMA_VERSION`] on incompatible changes.

use serde_json::{Value, json};

use crate::analyze::{Analysis, SiteAnalysis, Trend, is_allocator};
use crate::recording::{Recording, StackKind};

/// Version of the report.json layout.
pub const SCHEMA_VERSION: u32 = 1;

/// At most this many sites are listed in `sites` (largest live bytes first); the count of the
/// others is in `sites_omitted`.
pub const MAX_SITES: usize = 200;

/// A finite float, or null (JSON has no NaN/inf).
fn num(x: f64) -> Value {
    if x.is_finite() { json!(x) } else { Value::Null }
}

fn opt_num(x: Option<f64>) -> Value {
    x.map_or(Value::Null, num)
}

fn trend(t: &Trend) -> Value {
    json!({
        "n": t.n,
        "from_s": num(t.from_s),
        "to_s": num(t.to_s),
        "slope_bytes_per_s": num(t.slope_bytes_per_s),
        "stderr_bytes_per_s": opt_num(t.stderr_bytes_per_s),
        "ci95_bytes_per_s": opt_num(t.ci95_bytes_per_s),
        "t_stat": opt_num(t.t_stat),
        "significant_growth": t.significant_growth,
    })
}

fn series(pts: &[(f64, u64)]) -> Value {
    Value::Array(pts.iter().map(|(t, b)| json!([num(*t), b])).collect())
}

/// The JSON object of one site.
pub fn site_json(s: &SiteAnalysis) -> Value {
    let frames: Vec<Value> = s
        .frames
        .iter()
        .map(|f| {
            json!({
                "function": f.function,
                "file": f.file,
                "line": f.line,
                "object": f.object,
                "addr": f.addr,
                "addr_hex": format!("{:#x}", f.addr),
                "inlined": f.inlined,
                "allocator": is_allocator(f),
                "file_offset": f.file_offset,
                "build_id": f.build_id,
                "kind": f.kind.as_str(),
            })
        })
        .collect();
    let e = &s.evidence;
    let evidence = json!({
        "steady": trend(&e.steady),
        "early": e.early.as_ref().map_or(Value::Null, trend),
        "late": e.late.as_ref().map_or(Value::Null, trend),
        "noise_floor_bytes_per_s": num(e.noise_floor_bytes_per_s),
        "steady_growth_allocations": e.steady_growth_allocations,
        "peak_live_bytes": e.peak_live_bytes,
        "first_live_bytes": e.first_live_bytes,
        "rise_bytes": num(e.rise_bytes),
        "steady_sd_bytes": num(e.steady_sd_bytes),
        "turnover": opt_num(e.turnover),
        "plateau": e.plateau,
        "steps": e.steps,
        "single_step": e.single_step,
        "mean_age_s": opt_num(e.mean_age_s),
    });
    json!({
        "id": s.id,
        "kind": s.kind,
        "memory_kind": s.memory_kind.as_str(),
        "memory_origin": s.origin,
        "function": s.function,
        "culprit_frame": s.culprit_frame,
        "class": s.class.as_str(),
        "confidence": num(s.confidence),
        "reason": e.reason,
        "frames": frames,
        "live_bytes": s.live_bytes,
        "live_allocations": s.live_allocations,
        "allocated_bytes": s.allocated_bytes,
        "allocations": s.allocations,
        "freed_bytes": s.freed_bytes,
        "frees": s.frees,
        "growth_bytes": s.growth_bytes,
        "growth_bytes_per_s": num(s.growth_bytes_per_s),
        "growth_ci95_bytes_per_s": opt_num(s.growth_ci95_bytes_per_s),
        "growth_bytes_per_unit": opt_num(s.growth_bytes_per_unit),
        "growth_ci95_bytes_per_unit": opt_num(s.growth_ci95_bytes_per_unit),
        "mapped_bytes": if s.kind == StackKind::Mmap { json!(s.live_bytes) } else { Value::Null },
        "resident_bytes": s.resident_bytes,
        "shared_mapping": s.shared_mapping,
        "stack_lost": s.stack_lost,
        "stack_truncated": s.stack_truncated,
        "threads": s.threads,
        "likely_missing_release": s.likely_missing_release,
        "first_touch_in": s.first_touch_in,
        "lookalike": s.lookalike,
        "evidence": evidence,
    })
}

/// Sites listed in report.json: every site with live bytes at the end or positive growth, by live
/// bytes descending, at most [`MAX_SITES`]. Returns (listed, omitted count).
pub fn listed_sites(a: &Analysis) -> (Vec<&SiteAnalysis>, usize) {
    let all: Vec<&SiteAnalysis> = a.sites.iter().filter(|s| s.live_bytes > 0 || s.growth_bytes > 0).collect();
    let omitted = all.len().saturating_sub(MAX_SITES);
    (all.into_iter().take(MAX_SITES).collect(), omitted)
}

/// The whole report.json document: the run's figures with [`target_json`], [`verdict_json`],
/// [`at_exit_json`], [`freed_at_exit_json`], [`memory_json`], [`summary_json`],
/// [`drops_json`] and [`probes_json`], then the hooks' sections (reachability, runtime holds,
/// Python heap, escalation). Keys come out sorted (serde_json's map), whatever the order here.
pub fn report_json(rec: &Recording, a: &Analysis) -> Value {
    let (sites, omitted) = listed_sites(a);
    let mut warnings: Vec<String> = rec.warnings.clone();
    warnings.extend(a.warnings.iter().cloned());
    let mut doc = json!({
        "schema": SCHEMA_VERSION,
        "leaktrace_version": rec.leaktrace_version,
        "recording_format_version": rec.format_version,
        "target": target_json(rec),
        "mode": rec.mode,
        "sample_bytes": rec.sample_bytes,
        "started_unix_ms": rec.started_unix_ms,
        "duration_s": num(a.duration_s),
        "interval_s": num(rec.interval_s),
        "checkpoints": a.checkpoints,
        "span_from_s": num(a.span_from_s),
        "span_to_s": num(a.span_to_s),
        "steady_from_s": num(a.steady_from_s),
        "steady_is_whole_run": a.steady_is_whole_run,
        "end_reason": rec.end_reason,
        "work_probe": a.work_probe,
        "units_of_work": a.units_of_work,
        "verdict": verdict_json(rec, a),
        "still_allocated_at_exit": at_exit_json(a),
        "freed_at_exit": freed_at_exit_json(a),
        "sites": sites
            .iter()
            .map(|s| {
                let mut v = site_json(s);
                v["merged_stacks"] = json!(rec.merged_stacks.get(&s.id).cloned().unwrap_or_default());
                v
            })
            .collect::<Vec<_>>(),
        "sites_total": a.sites.len(),
        "sites_omitted": omitted,
        "top_growth": a.top_by_growth().iter().map(|s| s.id).collect::<Vec<_>>(),
        "memory": memory_json(a),
        "summary": summary_json(a),
        "drops": drops_json(a),
        "events": a.events,
        "probes": probes_json(rec),
        "warnings": warnings,
    });
    // Reachability hook: null without `record --reachability`.
    if let Value::Object(m) = &mut doc {
        m.insert("reachability".into(), super::reach::reach_json(rec, a));
        // `--heap-census`: null without it.
        m.insert("runtime_holds".into(), super::holds::holds_json(rec));
        // Python heap hook: null without two censuses.
        m.insert("python_heap".into(), crate::runtimes::python::report::holds_json(a));
        // Every producer's holders, one model: empty without a producer.
        m.insert("what_holds".into(), super::what_holds::json(rec, a));
        // Growth mode's exact window: null without one.
        m.insert("escalation".into(), super::escalation::escalation_json(a));
    }
    doc
}

/// report.json's `target`: the traced process (PIDs, command, exe, how it ended, its execs, its
/// runtime, its cgroup's memory limit).
fn target_json(rec: &Recording) -> Value {
    let t = &rec.target;
    json!({
        "pid": t.pid,
        "nspid": t.nspid,
        "command": t.command.join(" "),
        "argv": t.command,
        "exe": t.exe,
        "launched": t.launched,
        "exit_status": t.exit_status,
        "ended": t.ended,
        "execs": t.execs.iter().map(|e| json!({
            "t_s": num(e.t_s),
            "from": e.from,
            "to": e.to,
            "command": e.command.join(" "),
        })).collect::<Vec<_>>(),
        "runtime": t.runtime,
        "runtime_version": t.runtime_version,
        "memory_limit_bytes": t.memory_limit_bytes,
        "memory_limit_file": t.memory_limit_file,
    })
}

/// report.json's `verdict`: class, confidence, the sentence, the runtime's own answer
/// (`--heap-census`), the leak's scale and the load-spike plateau.
fn verdict_json(rec: &Recording, a: &Analysis) -> Value {
    json!({
        "class": a.verdict.class.as_str(),
        "confidence": num(a.verdict.confidence),
        "summary": super::verdict::sentence(a),
        "inconclusive": a.verdict.inconclusive,
        // `--heap-census`: the runtime's own answer, null without it.
        "holder": super::holds::holder_sentence(rec),
        "scale": a.scale,
        "plateau": a.plateau,
    })
}

/// report.json's `still_allocated_at_exit`: what a command held when it exited (null
/// otherwise), site by site with its stack.
fn at_exit_json(a: &Analysis) -> Value {
    a.at_exit.as_ref().map_or(Value::Null, |x| {
        json!({
            "live_bytes": x.live_bytes,
            "live_allocations": x.live_allocations,
            "one_time_sites": x.one_time_sites,
            "one_time_bytes": x.one_time_bytes,
            "sites": x.sites.iter().zip(&x.held).enumerate().map(|(k, (&i, &(live_bytes, live_allocations)))| {
                let s = &a.sites[i];
                json!({
                    "id": s.id,
                    "function": s.function,
                    "live_bytes": live_bytes,
                    "live_allocations": live_allocations,
                    "folded_ids": x.folded.get(k).cloned().unwrap_or_default(),
                    "reachable_bytes": x.reach.get(k).copied().flatten().map(|r| r.0),
                    "unreachable_bytes": x.reach.get(k).copied().flatten().map(|r| r.1),
                    "stack": s.frames.iter().map(|f| crate::analyze::frame_label(f)).collect::<Vec<_>>(),
                })
            }).collect::<Vec<_>>(),
        })
    })
}

/// report.json's `freed_at_exit`: what the process freed in its teardown (null without one).
fn freed_at_exit_json(a: &Analysis) -> Value {
    a.freed_at_exit.as_ref().map_or(Value::Null, |f| {
        json!({
            "teardown_s": num(f.teardown_s),
            "bytes": f.bytes,
            "blocks": f.blocks,
            "sites": f.sites.iter().map(|&(i, b, c)| {
                let s = &a.sites[i];
                json!({
                    "id": s.id,
                    "function": s.function,
                    "bytes": b,
                    "blocks": c,
                    "class": s.class.as_str(),
                })
            }).collect::<Vec<_>>(),
        })
    })
}

/// report.json's `memory`: the process series, (time s, bytes) points each.
fn memory_json(a: &Analysis) -> Value {
    json!({
        "rss_bytes": series(&a.memory.rss_bytes),
        "rss_anon_bytes": series(&a.memory.rss_anon_bytes),
        "rss_file_bytes": series(&a.memory.rss_file_bytes),
        "rss_shmem_bytes": series(&a.memory.rss_shmem_bytes),
        "native_live_bytes": series(&a.memory.native_live_bytes),
        "mmap_live_bytes": series(&a.memory.mmap_live_bytes),
        "fault_bytes": series(&a.memory.fault_bytes),
        "managed_bytes": series(&a.memory.managed_bytes),
        "offheap_live_bytes": series(&a.memory.offheap_live_bytes),
        "runtime_live_bytes": series(&a.memory.runtime_live_bytes),
        "allocator_resident_bytes": series(&a.memory.allocator_resident_bytes),
        "allocator_footprint_bytes": series(&a.memory.allocator_resident_bytes),
    })
}

/// report.json's `summary`: start and end figures and growth rates (per second and per unit of
/// work), by kind of memory, off-heap, the allocator's footprint and the occupied heap.
fn summary_json(a: &Analysis) -> Value {
    let s = &a.summary;
    let by_kind: Vec<Value> = a
        .kinds
        .iter()
        .map(|k| {
            json!({
                "kind": k.kind.as_str(),
                "source": k.source,
                "start_bytes": k.start_bytes,
                "end_bytes": k.end_bytes,
                "growth_bytes_per_s": num(k.trend.slope_bytes_per_s),
                "growth_ci95_bytes_per_s": opt_num(k.trend.ci95_bytes_per_s),
                "noise_floor_bytes_per_s": num(k.noise_floor_bytes_per_s),
                "post_gc_troughs": k.troughs,
                "grows": k.grows,
                "levelled_off": k.levelled_off,
                "at_load_spikes": k.at_load_spikes,
                "collections": k.collections,
            })
        })
        .collect();
    let mut summary = json!({
        "rss_start_bytes": s.rss_start_bytes,
        "rss_end_bytes": s.rss_end_bytes,
        "rss_anon_start_bytes": s.rss_anon_start_bytes,
        "rss_anon_end_bytes": s.rss_anon_end_bytes,
        "native_live_start_bytes": s.native_live_start_bytes,
        "native_live_end_bytes": s.native_live_end_bytes,
        "native_growth_bytes_per_s": num(s.native_growth_bytes_per_s),
        "native_growth_ci95_bytes_per_s": opt_num(a.native_trend.ci95_bytes_per_s),
        "rss_anon_growth_bytes_per_s": opt_num(s.rss_anon_growth_bytes_per_s),
        "rss_anon_growth_ci95_bytes_per_s": opt_num(a.rss_anon_trend.and_then(|t| t.ci95_bytes_per_s)),
        "by_kind": by_kind,
        "allocator_resident_start_bytes": s.allocator_resident_start_bytes,
        "allocator_resident_end_bytes": s.allocator_resident_end_bytes,
        "allocator_resident_growth_bytes_per_s": opt_num(s.allocator_resident_growth_bytes_per_s),
    });
    // Growth of the traced live bytes, per second and per unit of work; off-heap; occupied heap
    // (a second object: one json! of everything exceeds the macro recursion limit).
    let more = json!({
        "growth_bytes_per_s": num(s.growth_bytes_per_s),
        "growth_ci95_bytes_per_s": opt_num(a.traced_trend.ci95_bytes_per_s),
        "growth_bytes_per_unit": opt_num(s.growth_bytes_per_unit),
        "growth_ci95_bytes_per_unit": opt_num(a.traced_unit_trend.and_then(|t| t.ci95_bytes_per_s)),
        "native_growth_bytes_per_unit": opt_num(s.native_growth_bytes_per_unit),
        "offheap_live_start_bytes": s.offheap_live_start_bytes,
        "offheap_live_end_bytes": s.offheap_live_end_bytes,
        "offheap_growth_bytes_per_s": num(s.offheap_growth_bytes_per_s),
        "offheap_growth_bytes_per_unit": opt_num(s.offheap_growth_bytes_per_unit),
        "rss_anon_growth_bytes_per_unit": opt_num(s.rss_anon_growth_bytes_per_unit),
        "occupied_heap_to_rss_ratio": opt_num(s.occupied_heap_to_rss_ratio),
        "occupied": super::occupied::json(a.occupied.as_ref()),
    });
    if let (Value::Object(summary), Value::Object(more)) = (&mut summary, more) {
        summary.extend(more);
    }
    summary
}

/// report.json's `drops`: every loss counter by its name, and their `total`.
fn drops_json(a: &Analysis) -> Value {
    let mut drops = serde_json::Map::new();
    for (k, v) in a.drops_by_name() {
        drops.insert(k.into(), json!(v));
    }
    drops.insert("total".into(), json!(a.drops_total));
    Value::Object(drops)
}

/// report.json's `probes`: each attached probe (object, function, entry or return, offset,
/// placement).
fn probes_json(rec: &Recording) -> Vec<Value> {
    rec.probes
        .iter()
        .map(|p| {
            json!({
                "object": p.object,
                "function": p.function,
                "kind": p.kind,
                "offset": p.offset,
                "placement": p.placement,
            })
        })
        .collect()
}
