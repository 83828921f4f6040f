//! Folded stacks and flame graphs (inferno) of live and grown bytes per call stack.

use inferno::flamegraph::{self, Options, Palette, color::BasicPalette};

use crate::analyze::{Analysis, SiteAnalysis, frame_label};

/// Title of `live.svg`.
pub const LIVE_TITLE: &str = "Live bytes at end of recording";
/// Title of `growth.svg`.
pub const GROWTH_TITLE: &str = "Bytes that became live and stayed live (first → last checkpoint)";

/// A frame label safe for the folded format: ';' separates frames and whitespace/newlines end
/// lines, so ';' becomes ',' and control characters become spaces.
fn clean(label: &str) -> String {
    let s: String = label
        .chars()
        .map(|c| match c {
            ';' => ',',
            c if c.is_control() => ' ',
            c => c,
        })
        .collect();
    let s = s.trim();
    if s.is_empty() { "[unknown]".to_string() } else { s.to_string() }
}

/// The folded stack of one site: outermost frame first, innermost last, inlined frames as their
/// own elements. A site without frames is `[stack lost]` or `[unknown]`.
pub fn folded_stack(site: &SiteAnalysis) -> String {
    if site.frames.is_empty() {
        return if site.stack_lost { "[stack lost]".into() } else { "[unknown]".into() };
    }
    let labels: Vec<String> = site.frames.iter().rev().map(|f| clean(&frame_label(f))).collect();
    labels.join(";")
}

/// `outer;...;inner <live bytes>` for every site with live bytes at the end, largest first.
pub fn folded_live(a: &Analysis) -> String {
    let mut out = String::new();
    for s in a.sites.iter().filter(|s| s.live_bytes > 0) {
        out.push_str(&format!("{} {}\n", folded_stack(s), s.live_bytes));
    }
    out
}

/// `outer;...;inner <growth bytes>` for every site whose live bytes at the last checkpoint exceed
/// those at the first (only the positive part), largest first.
pub fn folded_growth(a: &Analysis) -> String {
    let mut grown: Vec<&SiteAnalysis> = a.sites.iter().filter(|s| s.growth_bytes > 0).collect();
    grown.sort_by(|x, y| y.growth_bytes.cmp(&x.growth_bytes).then(x.id.cmp(&y.id)));
    let mut out = String::new();
    for s in grown {
        out.push_str(&format!("{} {}\n", folded_stack(s), s.growth_bytes));
    }
    out
}

/// Render folded lines as an inferno flame graph (count name "bytes"). With no positive count
/// (inferno refuses empty input) a small placeholder SVG saying `empty_message` is returned.
pub fn flame_svg(folded: &str, title: &str, subtitle: Option<String>, empty_message: &str) -> anyhow::Result<Vec<u8>> {
    let lines: Vec<&str> = folded.lines().filter(|l| !l.trim().is_empty()).collect();
    if lines.is_empty() {
        return Ok(placeholder_svg(title, empty_message).into_bytes());
    }
    let mut opts = Options::default();
    opts.title = title.to_string();
    opts.subtitle = subtitle;
    opts.count_name = "bytes".to_string();
    opts.colors = Palette::Basic(BasicPalette::Mem);
    opts.deterministic = true;
    let mut svg = Vec::new();
    flamegraph::from_lines(&mut opts, lines, &mut svg)
        .map_err(|e| anyhow::anyhow!("cannot draw flame graph \"{title}\": {e}"))?;
    Ok(svg)
}

/// Escape text for XML content and attribute values.
pub fn xml_escape(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&apos;"),
            c if c.is_control() && c != '\n' && c != '\t' => o.push(' '),
            c => o.push(c),
        }
    }
    o
}

/// A minimal valid SVG with a title and one line of text.
pub fn placeholder_svg(title: &str, message: &str) -> String {
    format!(
        "<?xml version=\"1.0\" standalone=\"no\"?>\n\
         <svg version=\"1.1\" width=\"600\" height=\"90\" viewBox=\"0 0 600 90\" \
         xmlns=\"http://www.w3.org/2000/svg\">\n\
         <rect x=\"0\" y=\"0\" width=\"600\" height=\"90\" fill=\"#f8f8f8\"/>\n\
         <text x=\"300\" y=\"30\" font-family=\"monospace\" font-size=\"14\" text-anchor=\"middle\">{}</text>\n\
         <text x=\"300\" y=\"60\" font-family=\"monospace\" font-size=\"12\" text-anchor=\"middle\">{}</text>\n\
         </svg>\n",
        xml_escape(title),
        xml_escape(message)
    )
}
