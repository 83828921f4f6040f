//! What a launched command still held when it exited (LeakSanitizer's list, with what the
//! reachability scan at exit found of each entry) and what its teardown freed, in words.

use crate::analyze::Analysis;
use crate::human::bytes as hb;

/// What the reachability scan at exit found of entry `k` of the list at exit: ", all
/// unreachable (lost)", ", all reachable", ", 1.0 KiB unreachable (lost), 2.0 KiB reachable"; empty
/// without a scan.
pub fn at_exit_reach(x: &crate::analyze::AtExit, k: usize) -> String {
    match x.reach.get(k).copied().flatten() {
        None => String::new(),
        Some((0, u)) if u > 0 => ", all unreachable (lost)".to_string(),
        Some((r, 0)) if r > 0 => ", all reachable".to_string(),
        Some((r, u)) => format!(", {} unreachable (lost), {} reachable", hb(u), hb(r)),
    }
}

/// What the command still held when it exited, LeakSanitizer-style: "still allocated when the
/// command exited: 29.3 KiB in 1 block from main (leaker.c:12), ...; 2 one-time allocations of
/// libc and the runtime (1.0 KiB) not listed". Up to five sites are named, each
/// with what the reachability scan at exit found of it (", all unreachable (lost)").
pub fn at_exit_phrase(a: &Analysis) -> String {
    let Some(x) = &a.at_exit else { return "the target did not exit".to_string() };
    let one_time = if x.one_time_sites > 0 {
        format!(
            "; {} one-time allocation site(s) of libc and the runtime ({}) not listed",
            x.one_time_sites,
            hb(x.one_time_bytes)
        )
    } else {
        String::new()
    };
    if x.sites.is_empty() {
        return format!("nothing was still allocated when the command exited{one_time}");
    }
    let named: Vec<String> = x
        .sites
        .iter()
        .take(5)
        .enumerate()
        .map(|(k, &i)| {
            let s = &a.sites[i];
            let at = s
                .culprit_frame
                .and_then(|k| s.frames.get(k))
                // A Python frame's label already carries its file and line.
                .filter(|f| f.kind != crate::recording::FrameKind::Python)
                .and_then(|f| Some(format!(" ({}:{})", crate::analyze::basename(f.file.as_deref()?), f.line?)))
                .unwrap_or_default();
            let (b, c) = x.held.get(k).copied().unwrap_or((s.live_bytes, s.live_allocations));
            format!("{} in {} block(s) from {}{at}{}", hb(b), c, s.function, at_exit_reach(x, k))
        })
        .collect();
    let more = if x.sites.len() > 5 { format!(" and {} more site(s)", x.sites.len() - 5) } else { String::new() };
    // One site holding it all: named once ("64.0 MiB in 64 block(s), all from leak_block").
    if x.sites.len() == 1 && x.held.first().is_none_or(|&(b, c)| b == x.live_bytes && c == x.live_allocations) {
        let all = named[0].rsplit_once(" from ").map_or(named[0].as_str(), |(_, f)| f);
        return format!(
            "still allocated when the command exited: {} in {} block(s), all from {all}{one_time}",
            hb(x.live_bytes),
            x.live_allocations
        );
    }
    format!(
        "still allocated when the command exited: {} in {} block(s): {}{more}{one_time}",
        hb(x.live_bytes),
        x.live_allocations,
        named.join(", ")
    )
}

/// What a launched command's teardown freed: "the teardown (from 12.3 s) freed 40.0 KiB in 80
/// block(s): 40.0 KiB in 80 block(s) from remember_request, ...". Up to three
/// sites are named; empty when no teardown was caught.
pub fn freed_at_exit_phrase(a: &Analysis) -> String {
    let Some(f) = &a.freed_at_exit else { return String::new() };
    if f.sites.is_empty() {
        return format!("the teardown (from {:.1} s) freed nothing traced", f.teardown_s);
    }
    let named: Vec<String> = f
        .sites
        .iter()
        .take(3)
        .map(|&(i, b, c)| format!("{} in {} block(s) from {}", hb(b), c, a.sites[i].function))
        .collect();
    let more = if f.sites.len() > 3 { format!(" and {} more site(s)", f.sites.len() - 3) } else { String::new() };
    format!(
        "the teardown (exit handlers, static destructors, interpreter finalization, from {:.1} s) freed {} in {} block(s): {}{more}",
        f.teardown_s,
        hb(f.bytes),
        f.blocks,
        named.join(", ")
    )
}
