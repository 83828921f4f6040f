//! `report.json` of a recording, its lookups by culprit function, and the checks the tests share.

use std::path::{Path, PathBuf};

use crate::*;

/// A parsed `report.json`.
pub struct Report {
    pub dir: PathBuf,
    pub json: Value,
}

impl Report {
    /// Load DIR/report.json.
    pub fn load(dir: &Path) -> Report {
        let path = dir.join("report.json");
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
        let json = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{} is not valid JSON: {e}", path.display()));
        Report { dir: dir.to_path_buf(), json }
    }

    /// `json[a][b]...`, panicking with the path when absent.
    pub fn get(&self, path: &[&str]) -> &Value {
        let mut v = &self.json;
        for key in path {
            v = v.get(key).unwrap_or_else(|| panic!("report.json has no {} ({})", path.join("."), self.dir.display()));
        }
        v
    }

    pub fn sites(&self) -> &[Value] {
        self.get(&["sites"]).as_array().expect("sites is an array")
    }

    /// The culprit functions of the sites classed "leak", in the report's order ("?" for a site
    /// without a function name): what a test lists when it asserts that nothing leaks.
    pub fn leak_functions(&self) -> Vec<&str> {
        self.sites().iter().filter(|s| s["class"] == "leak").map(|s| s["function"].as_str().unwrap_or("?")).collect()
    }

    /// Every site whose culprit is `function`, largest live_bytes first. A demangled C++ name
    /// matches without its parameter list (`leak_new` matches `leak_new(int)`).
    pub fn sites_of(&self, function: &str) -> Vec<&Value> {
        let mut v: Vec<&Value> = self
            .sites()
            .iter()
            .filter(|s| s["function"].as_str().is_some_and(|f| same_function(f, function)))
            .collect();
        v.sort_by_key(|s| std::cmp::Reverse(u64_of(s, "live_bytes")));
        v
    }

    /// The site (the largest, if several) whose culprit is `function` (see [`Report::sites_of`]);
    /// panics showing all sites.
    pub fn site(&self, function: &str) -> &Value {
        self.sites_of(function)
            .into_iter()
            .next()
            .unwrap_or_else(|| panic!("no site has culprit function {function:?}; sites:\n{}", self.summary()))
    }

    /// The site with the largest growth_bytes.
    pub fn largest_growth(&self) -> &Value {
        self.sites()
            .iter()
            .max_by_key(|s| i64_of(s, "growth_bytes"))
            .unwrap_or_else(|| panic!("report has no sites ({})", self.dir.display()))
    }

    /// One line per site, for failure messages.
    pub fn summary(&self) -> String {
        let mut s = String::new();
        for site in self.sites().iter().take(25) {
            let chain: Vec<String> = site["frames"]
                .as_array()
                .map(|fs| {
                    fs.iter()
                        .map(|f| {
                            let name = f["function"].as_str().filter(|n| !n.is_empty()).unwrap_or("?");
                            format!("{name}@{}", object_name(f))
                        })
                        .collect()
                })
                .unwrap_or_default();
            s.push_str(&format!(
                "  {:<24} class={:<9} live={}/{} allocated={}/{} freed={}/{} growth={} ({}/s) lost={} frames=[{}]\n",
                site["function"].as_str().unwrap_or("?"),
                site["class"].as_str().unwrap_or("?"),
                site["live_bytes"],
                site["live_allocations"],
                site["allocated_bytes"],
                site["allocations"],
                site["freed_bytes"],
                site["frees"],
                site["growth_bytes"],
                site["growth_bytes_per_s"],
                site["stack_lost"],
                chain.join(" <- ")
            ));
        }
        if self.sites().len() > 25 {
            s.push_str(&format!("  ... {} sites in all\n", self.sites().len()));
        }
        s.push_str(&format!(
            "  verdict: {}\n  drops: {}\n  events: {}\n",
            self.json["verdict"], self.json["drops"], self.json["events"]
        ));
        s
    }
}

fn object_name(frame: &Value) -> &str {
    frame["object"].as_str().and_then(|o| o.rsplit('/').next()).unwrap_or("?")
}

/// `v[key]` as u64 (panics naming the key and showing `v` when absent or not a non-negative
/// integer).
pub fn u64_of(v: &Value, key: &str) -> u64 {
    v[key].as_u64().unwrap_or_else(|| panic!("{key} is not a non-negative integer in {v}"))
}

pub fn i64_of(v: &Value, key: &str) -> i64 {
    v[key].as_i64().unwrap_or_else(|| panic!("{key} is not an integer in {v}"))
}

pub fn f64_of(v: &Value, key: &str) -> f64 {
    v[key].as_f64().unwrap_or_else(|| panic!("{key} is not a number in {v}"))
}

pub fn str_of<'a>(v: &'a Value, key: &str) -> &'a str {
    v[key].as_str().unwrap_or_else(|| panic!("{key} is not a string in {v}"))
}

/// Assert |actual − expected| ≤ tolerance × expected.
pub fn assert_within(what: &str, actual: f64, expected: f64, tolerance: f64, context: &str) {
    assert!(
        (actual - expected).abs() <= tolerance * expected.abs(),
        "{what}: expected {expected} ± {:.0}%, got {actual}\n{context}",
        tolerance * 100.0
    );
}

/// The checks that every recording of `leaky MODE ITERATIONS RATE` (the whole run traced) must
/// pass: the leak is found with its exact size and culprit, the decoys are not called leaks.
pub fn assert_leaky_report(report: &Report, mode: &str, iterations: u64) {
    let ctx = format!("report {}:\n{}", report.dir.display(), report.summary());
    let culprit = leak_function(mode);

    // The leak: the site with the largest growth, named after the function that called the
    // allocator directly, with the exact leaked size.
    let leak = report.site(&culprit);
    let top = report.largest_growth();
    assert_eq!(top["function"], culprit.as_str(), "the site with the largest growth should be {culprit}\n{ctx}");
    let expected = (iterations * LEAK_BYTES) as f64;
    assert_within(&format!("{culprit} live_bytes"), u64_of(leak, "live_bytes") as f64, expected, 0.10, &ctx);
    assert_within(
        &format!("{culprit} growth per iteration (growth_bytes / {iterations})"),
        i64_of(leak, "growth_bytes") as f64 / iterations as f64,
        LEAK_BYTES as f64,
        0.10,
        &ctx,
    );
    assert_eq!(str_of(leak, "class"), "leak", "class of {culprit}\n{ctx}");
    assert!(f64_of(leak, "growth_bytes_per_s") > 0.0, "{culprit} growth_bytes_per_s should be > 0\n{ctx}");
    let expected_live_allocations = if mode == "realloc" { 1 } else { iterations };
    assert_eq!(u64_of(leak, "live_allocations"), expected_live_allocations, "{culprit} live_allocations\n{ctx}");
    assert!(!leak["stack_lost"].as_bool().unwrap_or(true), "{culprit} stack_lost should be false\n{ctx}");
    assert_culprit_frames(leak, &culprit, "leaky.c", &["run_workload", "main"], &ctx);

    // The bounded cache: full (64 × 512 B) at the end, not a leak.
    let cache = report.site("cache_put");
    assert_ne!(str_of(cache, "class"), "leak", "cache_put must not be classed a leak\n{ctx}");
    let cache_live = u64_of(cache, "live_bytes");
    assert!(
        cache_live as f64 <= CACHE_CAPACITY_BYTES as f64 * 1.10,
        "cache_put live_bytes {cache_live} exceeds the cache capacity {CACHE_CAPACITY_BYTES} (+10%)\n{ctx}"
    );
    assert_within("cache_put live_bytes (a full cache)", cache_live as f64, CACHE_CAPACITY_BYTES as f64, 0.10, &ctx);
    assert_eq!(u64_of(cache, "allocations"), iterations, "cache_put allocations\n{ctx}");
    assert_eq!(u64_of(cache, "frees"), iterations - CACHE_SLOTS, "cache_put frees (evictions)\n{ctx}");

    // Temporary blocks: all freed. report.json lists only sites with live bytes or growth, so
    // temp_work's site may be absent there; recording.json must show all its blocks freed.
    if let Some(temp) = report.sites_of("temp_work").first() {
        assert_ne!(str_of(temp, "class"), "leak", "temp_work must not be classed a leak\n{ctx}");
        assert!(
            u64_of(temp, "live_bytes") <= TEMP_BYTES,
            "temp_work live_bytes should be 0 (at most one block in flight)\n{ctx}"
        );
    }
    let temp = recorded_totals(&report.dir, "temp_work");
    assert_eq!(
        temp,
        SiteTotals {
            alloc_bytes: iterations * TEMP_BYTES,
            alloc_count: iterations,
            free_bytes: iterations * TEMP_BYTES,
            free_count: iterations
        },
        "temp_work totals at the last checkpoint of recording.json\n{ctx}"
    );

    // Nothing lost, everything counted.
    assert_eq!(report.get(&["drops", "total"]).as_u64(), Some(0), "drops.total\n{ctx}");
    let allocs = report.get(&["events", "allocs"]).as_u64().expect("events.allocs");
    assert!(allocs >= 3 * iterations, "events.allocs {allocs} < 3 × {iterations}\n{ctx}");
    let frees = report.get(&["events", "frees"]).as_u64().expect("events.frees");
    assert!(frees >= 2 * iterations - CACHE_SLOTS, "events.frees {frees} < {}\n{ctx}", 2 * iterations - CACHE_SLOTS);

    // Process memory series.
    let rss = report.get(&["memory", "rss_bytes"]).as_array().expect("memory.rss_bytes is an array");
    assert!(!rss.is_empty(), "memory.rss_bytes is empty\n{ctx}");
    assert!(rss.iter().any(|p| p[1].as_u64().unwrap_or(0) > 0), "memory.rss_bytes has no positive value\n{ctx}");
    let native = report.get(&["memory", "native_live_bytes"]).as_array().expect("memory.native_live_bytes");
    let native_max = native.iter().filter_map(|p| p[1].as_u64()).max().unwrap_or(0);
    assert!(
        native_max as f64 >= 0.9 * (expected + CACHE_CAPACITY_BYTES as f64),
        "memory.native_live_bytes peaks at {native_max}, below the leak + cache\n{ctx}"
    );

    let verdict = report.get(&["verdict"]);
    assert!(!str_of(verdict, "class").is_empty() && !str_of(verdict, "summary").is_empty(), "verdict\n{ctx}");
}

/// Totals of one kind of site at the last checkpoint of a recording.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct SiteTotals {
    pub alloc_bytes: u64,
    pub alloc_count: u64,
    pub free_bytes: u64,
    pub free_count: u64,
}

/// Sum, over the stacks of DIR/recording.json whose first frame outside the allocator's object
/// is `function`, of their totals at the last checkpoint.
pub fn recorded_totals(dir: &Path, function: &str) -> SiteTotals {
    totals_where(dir, |frames| {
        let alloc_obj = frames.first().and_then(|f| f["object"].as_str());
        frames.iter().find(|f| f["object"].as_str() != alloc_obj).and_then(|f| f["function"].as_str()) == Some(function)
    })
}

/// Totals at the end of the recording in `dir`, summed over the stacks whose frames satisfy
/// `select` (frames innermost first, as in recording.json).
pub fn totals_where(dir: &Path, select: impl Fn(&[Value]) -> bool) -> SiteTotals {
    let path = dir.join("recording.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let rec: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let ids: Vec<u64> = rec["stacks"]
        .as_array()
        .expect("recording.stacks")
        .iter()
        .filter(|st| select(st["frames"].as_array().map(Vec::as_slice).unwrap_or_default()))
        .filter_map(|st| st["id"].as_u64())
        .collect();
    let mut t = SiteTotals::default();
    for s in latest_samples(&rec).values() {
        if ids.contains(&s["stack"].as_u64().unwrap_or(u64::MAX)) {
            t.alloc_bytes += u64_of(s, "alloc_bytes");
            t.alloc_count += u64_of(s, "alloc_count");
            t.free_bytes += u64_of(s, "free_bytes");
            t.free_count += u64_of(s, "free_count");
        }
    }
    t
}

/// The site's frames: the innermost is in the allocator; the culprit frame (first non-allocator
/// frame) is `culprit`, in `file` with a line number; `callers` follow it, in this order.
pub fn assert_culprit_frames(site: &Value, culprit: &str, file: &str, callers: &[&str], ctx: &str) {
    let frames = site["frames"].as_array().unwrap_or_else(|| panic!("site has no frames array\n{ctx}"));
    assert!(!frames.is_empty(), "{culprit}: empty frames\n{ctx}");
    assert_eq!(frames[0]["allocator"].as_bool(), Some(true), "{culprit}: frames[0] should be the allocator\n{ctx}");
    let idx = frames
        .iter()
        .position(|f| f["allocator"].as_bool() == Some(false))
        .unwrap_or_else(|| panic!("{culprit}: no non-allocator frame\n{ctx}"));
    let f = &frames[idx];
    let name = f["function"].as_str().unwrap_or("");
    assert!(same_function(name, culprit), "{culprit}: first non-allocator frame is {name:?}\n{ctx}");
    let f_file = f["file"].as_str().unwrap_or("");
    assert!(f_file.ends_with(file), "{culprit}: frame file {f_file:?} should end with {file}\n{ctx}");
    assert!(f["line"].as_u64().unwrap_or(0) > 0, "{culprit}: frame has no line number\n{ctx}");
    let names: Vec<&str> = frames[idx + 1..].iter().filter_map(|f| f["function"].as_str()).collect();
    let mut pos = 0;
    for caller in callers {
        match names[pos..].iter().position(|n| same_function(n, caller)) {
            Some(p) => pos += p + 1,
            None => {
                panic!("{culprit}: caller {caller} missing after it in the stack {names:?}\n{ctx}")
            }
        }
    }
}

/// Assert the recording directory holds all nine outputs ([`OUTPUT_FILES`]), non-empty.
pub fn assert_outputs_exist(dir: &Path) {
    for name in OUTPUT_FILES {
        let p = dir.join(name);
        let len = std::fs::metadata(&p).map(|m| m.len()).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        assert!(len > 0, "{} is empty", p.display());
    }
}

/// The rate in B/s that a verdict's summary gives right after `after` ("… grows 800.0 KiB/s
/// (819200 B/s ± 1200 at 95 %)"): the number before the first " B/s" that follows it.
pub fn summary_rate(summary: &str, after: &str) -> Option<f64> {
    let rest = &summary[summary.find(after)? + after.len()..];
    let rest = &rest[rest.find('(')? + 1..];
    rest[..rest.find(" B/s")?].trim().parse().ok()
}

/// The verdict of a load-spike plateau: not a leak, and its summary names
/// the steps ("at load spikes at t=") and "a plateau raised by load, not a leak". Returns the
/// verdict and its summary.
pub fn assert_plateau_verdict<'r>(r: &'r Report, ctx: &str) -> (&'r Value, &'r str) {
    let verdict = r.get(&["verdict"]);
    let class = str_of(verdict, "class");
    assert!(class != "leak" && class != "off-heap", "{ctx}");
    let summary = str_of(verdict, "summary");
    assert!(summary.contains("at load spikes at t="), "{ctx}");
    assert!(summary.contains("a plateau raised by load, not a leak"), "{ctx}");
    (verdict, summary)
}
