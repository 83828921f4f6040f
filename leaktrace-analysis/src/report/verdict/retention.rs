//! The verdict's sentences for allocator retention: which allocator keeps freed memory, glibc's
//! own arena figures, what its resident memory is made of, and the leak listed beneath it.

use crate::analyze::Analysis;
use crate::human::{bytes as hb, rate as hr};

/// The lead of the allocator's retention under glibc: "allocator retention by glibc's per-thread
/// arenas (5 arenas): " when its arena headers were read and thread arenas exist, "allocator
/// retention: " otherwise.
pub(super) fn glibc_retention_lead(a: &Analysis, glibc: Option<&crate::analyze::retention::GlibcArenas>) -> String {
    match glibc {
        Some(g) if a.summary.allocator_family.is_none() && g.arenas > 1 => {
            format!("allocator retention by glibc's per-thread arenas ({} arenas, main_arena's included): ", g.arenas)
        }
        _ => "allocator retention: ".to_string(),
    }
}

/// glibc's own figures read from its arena headers, as malloc_info would show them: "; glibc's
/// own figure, from its arena headers: system_mem 13.2 MiB → 41.3 MiB (+953.0 KiB/s), 400.0 KiB
/// in use and 40.9 MiB retained (free chunks and top) at the end", or why it is missing under glibc.
pub(super) fn glibc_arenas_clause(
    glibc: Option<&crate::analyze::retention::GlibcArenas>,
    family: Option<&str>,
) -> String {
    match (glibc, family) {
        (Some(g), None) => {
            let held = match (g.in_use_end_bytes, g.retained_end_bytes) {
                (Some(u), Some(r)) => {
                    format!(", {} in use and {} retained (free chunks and top) at the end", hb(u), hb(r))
                }
                _ => ", its bins not followed at the end (bytes in use not read)".to_string(),
            };
            format!(
                "; glibc's own figure, from its arena headers: system_mem {} → {} ({}){held}",
                hb(g.system_mem_start_bytes),
                hb(g.system_mem_end_bytes),
                hr(g.system_mem_bytes_per_s)
            )
        }
        (None, None) => "; glibc's arena headers were not read (see the warnings; libc6-dbg gives main_arena): \
                         the figure is the resident pages of its heaps"
            .to_string(),
        _ => String::new(),
    }
}

/// The leaking sites beneath the allocator's retention, with their share of its growth:
/// "; beneath it, a smaller live growth: leak: remember_request +18.4 KiB/s (5 % of the
/// growth)".
pub(super) fn beneath_clause(a: &Analysis, beneath: Option<(usize, usize, f64)>, grows: f64) -> String {
    let Some((top, count, total)) = beneath else { return String::new() };
    let site = &a.sites[top];
    let others = if count > 1 { format!(" ({count} leaking sites, {} in total)", hr(total)) } else { String::new() };
    format!(
        "; beneath it, a smaller live growth: leak: {} {}{others} ({:.0} % of the allocator's growth)",
        site.function,
        hr(site.growth_bytes_per_s),
        100.0 * total / grows.max(1.0)
    )
}

/// What the allocator's resident figure is made of: "brk heap and 8 glibc arena heap(s), 150.0
/// MiB resident at the end, 120.0 MiB of it in the arenas", "brk heap and 3 jemalloc mapping(s)
/// holding its blocks, 90.0 MiB resident at the end, 89.0 MiB in the mappings holding its blocks" (or "brk
/// heap and its mappings" when neither was found).
pub(super) fn allocator_parts(a: &Analysis) -> String {
    let s = &a.summary;
    let end = s.allocator_resident_end_bytes.unwrap_or(0);
    let mut parts = Vec::new();
    let mut of_it = Vec::new();
    if let (Some(n), Some(arena)) = (s.allocator_arena_heaps, s.allocator_arena_resident_end_bytes)
        && n > 0
    {
        parts.push(format!("{n} glibc arena heap(s)"));
        of_it.push(format!("{} of it in the arenas", hb(arena)));
    }
    if let (Some(n), Some(res)) = (s.allocator_block_regions, s.allocator_block_region_resident_end_bytes)
        && n > 0
    {
        parts.push(format!("{n} {} mapping(s) holding its blocks", s.allocator_family.unwrap_or("allocator")));
        of_it.push(format!("{} in the mappings holding its blocks", hb(res)));
    }
    if let (Some(n), Some(res)) = (s.allocator_unclaimed_regions, s.allocator_unclaimed_resident_end_bytes)
        && n > 0
    {
        parts.push(format!(
            "{n} other anonymous mapping(s) from before attach, likely {}'s (no block began in them since)",
            s.allocator_family.unwrap_or("the allocator")
        ));
        of_it.push(format!("{} in the mappings from before attach", hb(res)));
    }
    if parts.is_empty() {
        return format!("brk heap and its mappings, {} resident at the end", hb(end));
    }
    format!("brk heap and {}, {} resident at the end, {}", parts.join(" and "), hb(end), of_it.join(", "))
}

/// The allocator-retention sentence: which allocator, what it holds beyond live bytes, how its
/// footprint rose (the steps: time and bytes, the live bytes at each), what live bytes did, the
/// knob that returns the memory, and the allocator's own figure (or why it was not read).
pub(super) fn retention_phrase(r: &crate::analyze::retention::Retention, family: Option<&str>) -> String {
    let (name, knob) = crate::analyze::retention::allocator_and_knob(family);
    let how = if r.steps.len() >= 2 {
        let listed: Vec<String> = r
            .steps
            .iter()
            .take(6)
            .map(|s| format!("at {:.1} s +{} (live {})", s.t_s, hb(s.bytes), hb(s.live_bytes)))
            .collect();
        let more = if r.steps.len() > 6 { format!(", and {} more", r.steps.len() - 6) } else { String::new() };
        format!("in {} steps ({}{more})", r.steps.len(), listed.join(", "))
    } else {
        "steadily".to_string()
    };
    let live = if r.live_peak_bytes > 2 * r.live_late_bytes + (1 << 20) {
        format!("fall back after each peak (peak {}, {} between peaks)", hb(r.live_peak_bytes), hb(r.live_late_bytes))
    } else {
        format!("stay flat ({} → {})", hb(r.live_start_bytes), hb(r.live_late_bytes))
    };
    format!(
        "allocator retention (fragmentation): {name} hold {} beyond live bytes — the allocator's resident memory \
         rose {} → {} (peak {}) over the whole recording, {how}, while live bytes (native, off-heap and managed) \
         {live}: freed memory the allocator keeps, not a leak; knob: {knob} ({})",
        hb(r.held_beyond_live_bytes),
        hb(r.footprint_start_bytes),
        hb(r.footprint_late_bytes),
        hb(r.footprint_peak_bytes),
        crate::analyze::retention::own_figures_clause(r.own.as_ref(), family),
    )
}
