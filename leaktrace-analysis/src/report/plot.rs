//! `memory.svg`: a small hand-written line plot of RSS, RSS-anon and live native bytes over time.

use std::fmt::Write as _;

use crate::analyze::Analysis;

use super::flame::xml_escape;

const W: f64 = 800.0;
const H: f64 = 440.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 80.0;
/// Legend entries per row, their width and the row height, px.
const LEGEND_COLUMNS: usize = 3;
const LEGEND_WIDTH: f64 = 233.0;
const LEGEND_ROW: f64 = 18.0;

/// One plotted series: legend name, colour, points (t_s, bytes).
type Line<'a> = (&'a str, &'a str, &'a [(f64, u64)]);

/// A "nice" step (1, 2 or 5 × 10^k) close to `raw`.
fn nice_step(raw: f64) -> f64 {
    if raw.is_nan() || raw <= 0.0 || !raw.is_finite() {
        return 1.0;
    }
    let p = 10f64.powf(raw.log10().floor());
    let m = raw / p;
    let k = if m <= 1.0 {
        1.0
    } else if m <= 2.0 {
        2.0
    } else if m <= 5.0 {
        5.0
    } else {
        10.0
    };
    k * p
}

/// Unit (divisor, name) for a maximum value in bytes.
fn unit_for(max: f64) -> (f64, &'static str) {
    const KIB: f64 = 1024.0;
    if max >= KIB * KIB * KIB {
        (KIB * KIB * KIB, "GiB")
    } else if max >= KIB * KIB {
        (KIB * KIB, "MiB")
    } else if max >= KIB {
        (KIB, "KiB")
    } else {
        (1.0, "B")
    }
}

fn fmt_tick(v: f64, step: f64) -> String {
    if step >= 1.0 || v == 0.0 {
        format!("{v:.0}")
    } else {
        let decimals = (-step.log10().floor()) as usize;
        format!("{v:.decimals$}")
    }
}

/// The plot as an SVG document. Series: VmRSS, RssAnon (when memory figures exist) and the live
/// bytes of native malloc sites (always), plus off-heap mmap live bytes when any; with a managed
/// runtime, the managed heap and the off-heap bytes of the runtime split. `subtitle` is shown
/// under the title (e.g. the command).
pub fn memory_svg(a: &Analysis, subtitle: &str) -> String {
    let series: Vec<Line<'_>> = [
        ("RSS (VmRSS)", "#1f77b4", a.memory.rss_bytes.as_slice()),
        ("RSS anon (RssAnon)", "#ff7f0e", a.memory.rss_anon_bytes.as_slice()),
        ("live native bytes (malloc)", "#2ca02c", a.memory.native_live_bytes.as_slice()),
        ("live mmap bytes (all traced mappings)", "#9467bd", a.memory.mmap_live_bytes.as_slice()),
        ("first-touch fault bytes", "#8c564b", a.memory.fault_bytes.as_slice()),
        ("managed heap", "#d62728", a.memory.managed_bytes.as_slice()),
        ("off-heap (resident mappings, direct buffers)", "#17becf", a.memory.offheap_live_bytes.as_slice()),
        ("allocator resident", "#e377c2", a.memory.allocator_resident_bytes.as_slice()),
    ]
    .into_iter()
    // With a managed runtime, mapped (virtual) bytes are dominated by reservations (a JVM's
    // class space, Go's arenas): the runtime split shows resident off-heap bytes instead.
    .filter(|(name, _, _)| !(name.starts_with("live mmap") && a.runtime.is_some()))
    // Without a runtime, off-heap bytes (program mappings, not the loader's) are plotted when
    // there are any, besides all traced mappings.
    .filter(|(name, _, pts)| {
        !pts.is_empty()
            && (!(name.starts_with("live mmap") || name.starts_with("off-heap")) || pts.iter().any(|p| p.1 > 0))
    })
    .collect();

    let t_max = series.iter().flat_map(|s| s.2.iter().map(|p| p.0)).filter(|t| t.is_finite()).fold(0.0f64, f64::max);
    let t_max = if t_max > 0.0 { t_max } else { 1.0 };
    let y_max_bytes = series.iter().flat_map(|s| s.2.iter().map(|p| p.1)).max().unwrap_or(0) as f64;
    let (div, unit) = unit_for(y_max_bytes);
    let y_max_u = (y_max_bytes / div).max(1e-9);
    let y_step = nice_step(y_max_u / 5.0);
    let y_top = ((y_max_u / y_step).ceil() * y_step).max(y_step);
    let x_step = nice_step(t_max / 8.0);
    let x_right = ((t_max / x_step).ceil() * x_step).max(x_step);

    let pw = W - LEFT - RIGHT;
    let ph = H - TOP - BOTTOM;
    let x = |t: f64| LEFT + (t / x_right).clamp(0.0, 1.0) * pw;
    let y = |b: f64| TOP + ph - ((b / div) / y_top).clamp(0.0, 1.0) * ph;

    let legend_rows = series.len().div_ceil(LEGEND_COLUMNS).max(1);
    let total_h = H + LEGEND_ROW * (legend_rows - 1) as f64;
    let mut s = String::new();
    let _ = writeln!(s, "<?xml version=\"1.0\" standalone=\"no\"?>");
    let _ = writeln!(
        s,
        "<svg version=\"1.1\" width=\"{W}\" height=\"{total_h}\" viewBox=\"0 0 {W} {total_h}\" xmlns=\"http://www.w3.org/2000/svg\" font-family=\"sans-serif\" font-size=\"12\">"
    );
    let _ = writeln!(s, "<rect x=\"0\" y=\"0\" width=\"{W}\" height=\"{total_h}\" fill=\"white\"/>");
    let _ = writeln!(
        s,
        "<text x=\"{}\" y=\"18\" text-anchor=\"middle\" font-size=\"15\">Process memory over time</text>",
        W / 2.0
    );
    if !subtitle.is_empty() {
        let sub: String = subtitle.chars().take(110).collect();
        let _ = writeln!(
            s,
            "<text x=\"{}\" y=\"33\" text-anchor=\"middle\" font-size=\"11\" fill=\"#555\">{}</text>",
            W / 2.0,
            xml_escape(&sub)
        );
    }
    // Grid and ticks.
    let mut v = 0.0;
    let mut guard = 0;
    while v <= y_top + y_step * 1e-6 && guard < 100 {
        let yy = y(v * div);
        let _ = writeln!(
            s,
            "<line x1=\"{LEFT}\" y1=\"{yy:.1}\" x2=\"{:.1}\" y2=\"{yy:.1}\" stroke=\"#ddd\"/>\n<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
            LEFT + pw,
            LEFT - 6.0,
            yy + 4.0,
            fmt_tick(v, y_step)
        );
        v += y_step;
        guard += 1;
    }
    let mut t = 0.0;
    guard = 0;
    while t <= x_right + x_step * 1e-6 && guard < 100 {
        let xx = x(t);
        let _ = writeln!(
            s,
            "<line x1=\"{xx:.1}\" y1=\"{TOP}\" x2=\"{xx:.1}\" y2=\"{:.1}\" stroke=\"#eee\"/>\n<text x=\"{xx:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>",
            TOP + ph,
            TOP + ph + 16.0,
            fmt_tick(t, x_step)
        );
        t += x_step;
        guard += 1;
    }
    // Axes and labels.
    let _ = writeln!(
        s,
        "<line x1=\"{LEFT}\" y1=\"{TOP}\" x2=\"{LEFT}\" y2=\"{:.1}\" stroke=\"black\"/>\n<line x1=\"{LEFT}\" y1=\"{:.1}\" x2=\"{:.1}\" y2=\"{:.1}\" stroke=\"black\"/>",
        TOP + ph,
        TOP + ph,
        LEFT + pw,
        TOP + ph
    );
    let _ = writeln!(
        s,
        "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">time since first checkpoint (s)</text>",
        LEFT + pw / 2.0,
        TOP + ph + 36.0
    );
    let _ = writeln!(
        s,
        "<text x=\"18\" y=\"{:.1}\" text-anchor=\"middle\" transform=\"rotate(-90 18 {:.1})\">memory ({unit})</text>",
        TOP + ph / 2.0,
        TOP + ph / 2.0
    );
    if series.is_empty() {
        let _ = writeln!(
            s,
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">no data</text>",
            LEFT + pw / 2.0,
            TOP + ph / 2.0
        );
    }
    // Lines, then the legend.
    for (name, color, pts) in &series {
        let coords: Vec<String> =
            pts.iter().filter(|p| p.0.is_finite()).map(|p| format!("{:.1},{:.1}", x(p.0), y(p.1 as f64))).collect();
        if coords.len() == 1 {
            let _ = writeln!(
                s,
                "<circle cx=\"{}\" cy=\"{}\" r=\"3\" fill=\"{color}\"><title>{}</title></circle>",
                coords[0].split(',').next().unwrap_or("0"),
                coords[0].split(',').nth(1).unwrap_or("0"),
                xml_escape(name)
            );
        } else if !coords.is_empty() {
            let _ = writeln!(
                s,
                "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"2\" points=\"{}\"><title>{}</title></polyline>",
                coords.join(" "),
                xml_escape(name)
            );
        }
    }
    // Legend under the time axis, LEGEND_COLUMNS entries a row (the picture grows by a row's
    // height for each row past the first).
    for (i, (name, color, _)) in series.iter().enumerate() {
        let lx = LEFT + LEGEND_WIDTH * (i % LEGEND_COLUMNS) as f64;
        let ly = H - 16.0 + LEGEND_ROW * (i / LEGEND_COLUMNS) as f64;
        let _ = writeln!(
            s,
            "<line x1=\"{lx:.1}\" y1=\"{ly:.1}\" x2=\"{:.1}\" y2=\"{ly:.1}\" stroke=\"{color}\" stroke-width=\"3\"/>\n<text x=\"{:.1}\" y=\"{:.1}\" font-size=\"11\">{}</text>",
            lx + 18.0,
            lx + 23.0,
            ly + 4.0,
            xml_escape(name)
        );
    }
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps() {
        assert_eq!(nice_step(0.0), 1.0);
        assert_eq!(nice_step(3.0), 5.0);
        assert_eq!(nice_step(12.0), 20.0);
        assert_eq!(nice_step(0.07), 0.1);
        assert_eq!(fmt_tick(0.2, 0.1), "0.2");
        assert_eq!(unit_for(5.0 * 1048576.0).1, "MiB");
    }
}
