//! Analysis of a recording: how the live (outstanding) bytes of every allocation site and of the
//! whole process moved over time, and whether that movement is a leak.
//!
//! Everything here is a pure function of a [`Recording`]: no root, no target. The method (window
//! choice, least-squares trend, noise floor, classification rules and confidence) is written down
//! in `docs/analysis.md`; the constants below are the numbers it quotes.
//!
//! Vocabulary: a *site* is one call stack ([`Stack`]) that allocates; its *live bytes* are the
//! bytes allocated from it and not yet freed (only allocations made after the probes were
//! attached are seen, so every site starts near zero at the first checkpoint). *Retention* is
//! live bytes that stay live.

use std::collections::{BTreeMap, HashMap};

use leaktrace_common::counter;
use serde::Serialize;

use crate::allocator_frames::is_allocator_frame;
use crate::recording::{EndReason, Frame, Mode, Recording, Runtime, Stack, StackKind};
use crate::runtimes::MemoryKind;

/// Absolute part of a site's noise floor, bytes per second: growth slower than this is never a
/// leak (64 B/s is one small allocation a second; over an hour it is 225 KiB).
pub const SITE_FLOOR_BYTES_PER_S: f64 = 64.0;
/// Relative part of a site's noise floor: growth that over the whole run adds less than this
/// fraction of the site's peak live bytes is noise (1 %).
pub const SITE_FLOOR_FRACTION: f64 = 0.01;
/// Absolute part of the process (RSS) noise floor, bytes per second: one 4 KiB page a second.
/// RSS moves in pages, so a smaller slope is not measurable.
pub const RSS_FLOOR_BYTES_PER_S: f64 = 4096.0;
/// A site whose cumulative allocated bytes reach this many times its peak live bytes turns its
/// memory over (short-lived blocks): class `temporary` unless it grows.
pub const TEMPORARY_TURNOVER: f64 = 4.0;
/// The steady window needs at least this many checkpoints; with fewer in the last half of the run
/// all checkpoints are used.
pub const MIN_WINDOW_POINTS: usize = 3;
/// The plateau check (last quarter of the run) needs at least this many checkpoints while the
/// process is active; with fewer it is not made (a single partial interval is no plateau).
pub const MIN_PLATEAU_POINTS: usize = 5;
/// A steady-window slope is "plateaued" when the slope over the last quarter of the run is below
/// this fraction of it and not itself significant growth above the noise floor.
pub const PLATEAU_RATIO: f64 = 0.5;
/// Fragmentation: the traced live bytes must grow slower than this fraction of the RSS-anon slope.
pub const FRAGMENTATION_RATIO: f64 = 0.25;
/// |t| values are capped at this value (a perfectly straight line has an infinite t).
pub const T_CAP: f64 = 1e6;
/// Absolute part of the noise floor of a kind's series (managed, off-heap, ...), bytes per
/// second: one page a second (mapped heaps move in pages).
pub const KIND_FLOOR_BYTES_PER_S: f64 = 4096.0;

/// Options of [`analyze`].
#[derive(Clone, Debug, PartialEq)]
pub struct AnalyzeOptions {
    /// How many sites the human report lists per table (by growth, by live bytes).
    pub top: usize,
}

impl Default for AnalyzeOptions {
    fn default() -> Self {
        AnalyzeOptions { top: 10 }
    }
}

/// What one allocation site does with its memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum SiteClass {
    /// Live bytes and live blocks keep growing through the steady window, above the noise floor,
    /// with no plateau.
    Leak,
    /// Live bytes rose (usually early) and then stayed flat: retained, but bounded so far.
    Cache,
    /// Many more bytes allocated than ever live at once (turnover ≥ [`TEMPORARY_TURNOVER`]), live
    /// bytes not growing: short-lived allocations.
    Temporary,
    /// Nothing grows beyond noise.
    Flat,
}

impl SiteClass {
    /// Lower-case name used in reports ("leak", "cache", "temporary", "flat").
    pub fn as_str(self) -> &'static str {
        match self {
            SiteClass::Leak => "leak",
            SiteClass::Cache => "cache",
            SiteClass::Temporary => "temporary",
            SiteClass::Flat => "flat",
        }
    }
}

impl std::fmt::Display for SiteClass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What the process as a whole does with its memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ProcessClass {
    /// At least one site is a [`SiteClass::Leak`].
    Leak,
    /// RSS-anon grows significantly while the traced live bytes stay flat: allocator
    /// fragmentation, or memory that does not come from a traced allocator.
    Fragmentation,
    /// The leaking sites are (mostly) off-heap mappings: anonymous regions the program maps and
    /// never unmaps (not the allocator's, the loader's or a runtime's).
    #[serde(rename = "off-heap")]
    OffHeap,
    /// Only caches grew (rose, then levelled off).
    Cache,
    /// No retained growth, but short-lived allocation churn.
    Temporary,
    /// Nothing grows beyond noise (or too little data to tell; see the confidence).
    Flat,
}

impl ProcessClass {
    /// Lower-case name used in reports.
    pub fn as_str(self) -> &'static str {
        match self {
            ProcessClass::Leak => "leak",
            ProcessClass::Fragmentation => "fragmentation",
            ProcessClass::OffHeap => "off-heap",
            ProcessClass::Cache => "cache",
            ProcessClass::Temporary => "temporary",
            ProcessClass::Flat => "flat",
        }
    }
}

impl std::fmt::Display for ProcessClass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Ordinary least-squares fit of a byte series against time over a window of checkpoints.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Trend {
    /// Number of checkpoints in the fit.
    pub n: usize,
    /// Time of the first checkpoint of the window, seconds since the first checkpoint.
    pub from_s: f64,
    /// Time of the last checkpoint of the window, seconds since the first checkpoint.
    pub to_s: f64,
    /// Least-squares slope, bytes per second (0 when fewer than 2 distinct times).
    pub slope_bytes_per_s: f64,
    /// Standard error of the slope, bytes per second, widened for lag-1 autocorrelation of the
    /// residuals. None with fewer than 3 checkpoints (no error can be estimated).
    pub stderr_bytes_per_s: Option<f64>,
    /// Half-width of the 95 % confidence interval of the slope (Student t with n−2 degrees of
    /// freedom × standard error), bytes per second.
    pub ci95_bytes_per_s: Option<f64>,
    /// slope / standard error, capped at ±[`T_CAP`].
    pub t_stat: Option<f64>,
    /// The whole 95 % confidence interval is above zero.
    pub significant_growth: bool,
}

/// Numbers behind a site's class.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct SiteEvidence {
    /// Live-bytes trend over the steady window (see [`Analysis::steady_from_s`]).
    pub steady: Trend,
    /// Live-bytes trend from the first checkpoint to the start of the steady window (None when
    /// the steady window is the whole run).
    pub early: Option<Trend>,
    /// Live-bytes trend over the last quarter of the run (plateau check; None with fewer than 3
    /// checkpoints there).
    pub late: Option<Trend>,
    /// Growth slower than this is noise, bytes per second: max([`SITE_FLOOR_BYTES_PER_S`],
    /// [`SITE_FLOOR_FRACTION`] × peak live bytes / span duration, and in sampled mode 2 × the
    /// mean sample distance / span duration).
    pub noise_floor_bytes_per_s: f64,
    /// Live blocks at the last checkpoint minus at the start of the steady window.
    pub steady_growth_allocations: i64,
    /// Largest live bytes at any checkpoint.
    pub peak_live_bytes: u64,
    /// Live bytes at the first checkpoint.
    pub first_live_bytes: u64,
    /// Mean live bytes over the steady window minus live bytes at the first checkpoint, bytes.
    pub rise_bytes: f64,
    /// Standard deviation of live bytes over the steady window, bytes.
    pub steady_sd_bytes: f64,
    /// Allocated bytes / peak live bytes (how many times the site's memory was turned over).
    /// None when nothing was allocated.
    pub turnover: Option<f64>,
    /// The steady-window growth stops in the last quarter of the run.
    pub plateau: bool,
    /// One sentence: why this class.
    pub reason: String,
}

/// One allocation site (one call stack) over the recording.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SiteAnalysis {
    /// [`Stack::id`].
    pub id: u32,
    /// "malloc", "mmap" or "fault" ([`Stack::kind`]).
    pub kind: StackKind,
    /// What kind of memory the site holds under the target's runtime
    /// ([`crate::runtimes::classify_site`]): managed, native, off-heap or runtime.
    pub memory_kind: MemoryKind,
    /// Culprit: the innermost frame that is not an allocator frame
    /// ([`is_allocator_frame`]); else the innermost named frame; else `object+0xaddr`.
    pub function: String,
    /// Index into [`SiteAnalysis::frames`] of the culprit frame (None when there are no frames).
    pub culprit_frame: Option<usize>,
    /// The call stack, innermost first (copied from the recording).
    pub frames: Vec<Frame>,
    /// The kernel could not give this site's stack: the bytes are real, their stack unknown.
    pub stack_lost: bool,
    /// Live bytes at the last checkpoint (allocated − freed).
    pub live_bytes: u64,
    /// Live blocks at the last checkpoint.
    pub live_allocations: u64,
    /// Bytes allocated from this site since attach (cumulative, last checkpoint).
    pub allocated_bytes: u64,
    /// Allocations from this site since attach.
    pub allocations: u64,
    /// Bytes of this site's blocks freed since attach.
    pub freed_bytes: u64,
    /// This site's blocks freed since attach.
    pub frees: u64,
    /// Live bytes at the last checkpoint minus at the first, bytes (may be negative).
    pub growth_bytes: i64,
    /// Steady-window least-squares slope of live bytes, bytes per second.
    pub growth_bytes_per_s: f64,
    /// Half-width of its 95 % confidence interval, bytes per second (None: fewer than 3
    /// checkpoints in the window).
    pub growth_ci95_bytes_per_s: Option<f64>,
    /// Steady-window least-squares slope of live bytes against units of work (calls of the work
    /// probe), bytes per unit. None without a work probe, or when it counted no call in the
    /// window.
    pub growth_bytes_per_unit: Option<f64>,
    /// Half-width of its 95 % confidence interval, bytes per unit (None with fewer than 3
    /// checkpoints).
    pub growth_ci95_bytes_per_unit: Option<f64>,
    /// "mmap" sites: bytes of the site's live regions resident in RAM at the last checkpoint
    /// that had the figure (pagemap); `live_bytes` is what is mapped. None for other kinds.
    pub resident_bytes: Option<u64>,
    /// Classification.
    pub class: SiteClass,
    /// How clear the numbers behind `class` are, 0..1.
    pub confidence: f64,
    /// The numbers behind `class`.
    pub evidence: SiteEvidence,
}

/// Time series of the process, each point `(t_s, bytes)` with t_s in seconds since the first
/// checkpoint.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct MemorySeries {
    /// VmRSS at each checkpoint that has memory figures.
    pub rss_bytes: Vec<(f64, u64)>,
    /// RssAnon at each checkpoint that has memory figures.
    pub rss_anon_bytes: Vec<(f64, u64)>,
    /// RssFile at each checkpoint that has memory figures.
    pub rss_file_bytes: Vec<(f64, u64)>,
    /// Sum of the live bytes of the "malloc" sites of native kind (all malloc sites of a target
    /// without a managed runtime), at every checkpoint.
    pub native_live_bytes: Vec<(f64, u64)>,
    /// Sum of the live bytes of all "mmap" sites (off-heap mappings), at every checkpoint.
    pub mmap_live_bytes: Vec<(f64, u64)>,
    /// Growth mode: sum of the bytes of all "fault" sites (pages made resident by first-touch
    /// page faults), at every checkpoint; empty when the recording has no such site.
    pub fault_bytes: Vec<(f64, u64)>,
    /// The runtime's managed heap: the runtime's own used bytes where it has a gauge (the JVM's
    /// hsperfdata, at the checkpoints that have it), else the bytes of the managed-kind sites
    /// (live bytes of malloc sites, resident bytes of mappings). Empty without a runtime.
    pub managed_bytes: Vec<(f64, u64)>,
    /// Off-heap sites: resident bytes of off-heap mappings plus live bytes of off-heap malloc
    /// sites (direct buffers, ArrayBuffer backing stores), at every checkpoint.
    pub offheap_live_bytes: Vec<(f64, u64)>,
    /// Runtime-kind sites (the runtime's and the allocator's own memory), same measure.
    pub runtime_live_bytes: Vec<(f64, u64)>,
    /// Resident bytes the malloc allocator holds from the kernel (brk heap + its own mappings),
    /// at each checkpoint that has the figure (`Checkpoint::allocator`); empty otherwise.
    pub allocator_resident_bytes: Vec<(f64, u64)>,
}

/// How one kind of memory moved over the run (the runtime split of the process series).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct KindGrowth {
    /// Managed, native, off-heap or runtime.
    pub kind: MemoryKind,
    /// Where the figures come from: "hsperfdata" (the runtime's gauge) or "sites".
    pub source: String,
    /// Bytes at the first and last point of the series.
    pub start_bytes: u64,
    pub end_bytes: u64,
    /// Steady-window trend of the series.
    pub trend: Trend,
    /// max([`KIND_FLOOR_BYTES_PER_S`] ([`SITE_FLOOR_BYTES_PER_S`] for native malloc bytes),
    /// [`SITE_FLOOR_FRACTION`] × peak / span duration).
    pub noise_floor_bytes_per_s: f64,
    /// The trend is significant growth above the noise floor.
    pub grows: bool,
}

/// Start and end figures of the process, bytes.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Summary {
    /// VmRSS at the first checkpoint with memory figures.
    pub rss_start_bytes: Option<u64>,
    /// VmRSS at the last checkpoint with memory figures.
    pub rss_end_bytes: Option<u64>,
    /// RssAnon at the first checkpoint with memory figures.
    pub rss_anon_start_bytes: Option<u64>,
    /// RssAnon at the last checkpoint with memory figures.
    pub rss_anon_end_bytes: Option<u64>,
    /// Live bytes of all malloc sites at the first checkpoint.
    pub native_live_start_bytes: u64,
    /// Live bytes of all malloc sites at the last checkpoint.
    pub native_live_end_bytes: u64,
    /// Steady-window slope of the malloc live bytes, bytes per second.
    pub native_growth_bytes_per_s: f64,
    /// Steady-window slope of RssAnon, bytes per second (None without memory figures).
    pub rss_anon_growth_bytes_per_s: Option<f64>,
    /// Allocator resident bytes at the first checkpoint that has the figure.
    pub allocator_resident_start_bytes: Option<u64>,
    /// Allocator resident bytes at the last checkpoint that has the figure.
    pub allocator_resident_end_bytes: Option<u64>,
    /// Steady-window slope of the allocator resident bytes, bytes per second.
    pub allocator_resident_growth_bytes_per_s: Option<f64>,
    /// Steady-window slope of the traced live bytes (every site, malloc and mappings), bytes per
    /// second.
    pub growth_bytes_per_s: f64,
    /// The same against units of work, bytes per unit (None without units of work).
    pub growth_bytes_per_unit: Option<f64>,
    /// Steady-window slope of the native live bytes against units of work, bytes per unit.
    pub native_growth_bytes_per_unit: Option<f64>,
    /// Off-heap bytes ([`MemorySeries::offheap_live_bytes`]) at the first and last checkpoint.
    pub offheap_live_start_bytes: u64,
    pub offheap_live_end_bytes: u64,
    /// Steady-window slope of the off-heap bytes, bytes per second.
    pub offheap_growth_bytes_per_s: f64,
    /// The same against units of work, bytes per unit.
    pub offheap_growth_bytes_per_unit: Option<f64>,
    /// Steady-window slope of RssAnon against units of work, bytes per unit.
    pub rss_anon_growth_bytes_per_unit: Option<f64>,
    /// Occupied heap to RSS: native live bytes / RssAnon at the last checkpoint with memory
    /// figures (None without them). Low values with a growing RSS point at memory the allocator
    /// keeps (fragmentation) or memory that is not traced.
    pub occupied_heap_to_rss_ratio: Option<f64>,
}

/// The process-level conclusion.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Verdict {
    /// Class of the process.
    pub class: ProcessClass,
    /// How clear the numbers are, 0..1.
    pub confidence: f64,
    /// One line for humans, naming the culprit function and its rate for a leak.
    pub summary: String,
    /// True when the numbers cannot tell (too few checkpoints, too many allocations lost): the
    /// class is then `flat` only for want of evidence, and the summary starts with
    /// "inconclusive". Set where the verdict is decided.
    pub inconclusive: bool,
}

impl Verdict {
    /// [`Verdict::inconclusive`].
    pub fn is_inconclusive(&self) -> bool {
        self.inconclusive
    }
}

/// Everything [`analyze`] finds in a recording.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Analysis {
    /// Checkpoints used (those with a finite time).
    pub checkpoints: usize,
    /// Last checkpoint time − first checkpoint time, seconds.
    pub duration_s: f64,
    /// Start of the analysed span, seconds since the first checkpoint: the last checkpoint before
    /// the process first allocated or freed (0 unless it was idle at the start).
    pub span_from_s: f64,
    /// End of the analysed span, seconds since the first checkpoint: the last checkpoint, or
    /// when the target exited, the first checkpoint after its last allocation or free.
    pub span_to_s: f64,
    /// Start of the steady window, seconds since the first checkpoint: the last half of the
    /// analysed span, or its start when that half holds fewer than [`MIN_WINDOW_POINTS`]
    /// checkpoints.
    pub steady_from_s: f64,
    /// The steady window fell back to all checkpoints (too few in the last half).
    pub steady_is_whole_run: bool,
    /// Every site of the recording, sorted by live bytes at the end, descending (ties: growth).
    pub sites: Vec<SiteAnalysis>,
    /// Process series.
    pub memory: MemorySeries,
    /// Start/end figures.
    pub summary: Summary,
    /// Steady-window trend of the malloc live bytes.
    pub native_trend: Trend,
    /// Steady-window trend of RssAnon (None without memory figures).
    pub rss_anon_trend: Option<Trend>,
    /// Steady-window trend of the allocator's resident bytes (None without the figure).
    pub allocator_trend: Option<Trend>,
    /// Loss counters (IS_LOSS) at the last checkpoint, by name; every loss counter is present.
    pub drops: BTreeMap<String, u64>,
    /// Sum of [`Analysis::drops`].
    pub drops_total: u64,
    /// Informational counters at the last checkpoint, by name (including unknown names).
    pub events: BTreeMap<String, u64>,
    /// Process conclusion.
    pub verdict: Verdict,
    /// Caveats found while analysing (few checkpoints, missing memory figures, losses...).
    pub warnings: Vec<String>,
    /// [`AnalyzeOptions::top`].
    pub top: usize,
    /// Managed runtime of the target ([`crate::recording::Target::runtime`]); None: native.
    pub runtime: Option<Runtime>,
    /// Each kind of memory (managed, native, off-heap, runtime) over the run; the managed entry
    /// only with a runtime.
    pub kinds: Vec<KindGrowth>,
    /// The work probe of the recording (`SYMBOL[@OBJECT]`); None without one.
    pub work_probe: Option<String>,
    /// Units of work (calls of the work probe) counted from attach to the last checkpoint; None
    /// without a work probe.
    pub units_of_work: Option<u64>,
    /// Steady-window trend of all traced live bytes (every site), bytes per second.
    pub traced_trend: Trend,
    /// Steady-window trend of all traced live bytes against units of work (the slope and its
    /// interval are in bytes per unit, `from_s`/`to_s` in units); None without units of work.
    pub traced_unit_trend: Option<Trend>,
}

impl Analysis {
    /// Up to `top` sites with positive steady-window growth (bytes per second), fastest first.
    pub fn top_by_growth(&self) -> Vec<&SiteAnalysis> {
        let mut v: Vec<&SiteAnalysis> = self
            .sites
            .iter()
            .filter(|s| s.growth_bytes_per_s > 0.0 && (s.growth_bytes > 0 || s.live_bytes > 0))
            .collect();
        v.sort_by(|a, b| {
            class_rank(a.class)
                .cmp(&class_rank(b.class))
                .then(b.growth_bytes_per_s.total_cmp(&a.growth_bytes_per_s))
        });
        v.truncate(self.top);
        v
    }

    /// Up to `top` sites with live bytes at the end, largest first.
    pub fn top_by_live(&self) -> Vec<&SiteAnalysis> {
        self.sites.iter().filter(|s| s.live_bytes > 0).take(self.top).collect()
    }

    /// "call of FUNCTION": what one unit of work is (the work probe without its object), or None
    /// without a work probe.
    pub fn unit_name(&self) -> Option<String> {
        unit_name(self.work_probe.as_deref())
    }

    /// Sites of one class, in [`Analysis::sites`] order.
    pub fn sites_of(&self, class: SiteClass) -> impl Iterator<Item = &SiteAnalysis> {
        self.sites.iter().filter(move |s| s.class == class)
    }
}

/// "call of FUNCTION" for a work probe `SYMBOL[@OBJECT]`.
pub fn unit_name(work_probe: Option<&str>) -> Option<String> {
    let w = work_probe?;
    Some(format!("call of {}", w.split('@').next().unwrap_or(w)))
}

fn class_rank(c: SiteClass) -> u8 {
    match c {
        SiteClass::Leak => 0,
        _ => 1,
    }
}

/// Label of a frame: its function name, else `basename(object)+0xaddr`, else `0xaddr`.
pub fn frame_label(f: &Frame) -> String {
    match (&f.function, &f.object) {
        (Some(func), _) if !func.is_empty() => func.clone(),
        (_, Some(obj)) => format!("{}+{:#x}", basename(obj), f.addr),
        _ => format!("{:#x}", f.addr),
    }
}

/// Last path component of `path` (the whole string when it has no '/').
pub fn basename(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// True when `f` is an allocator-internal frame (by function name).
pub fn is_allocator(f: &Frame) -> bool {
    f.function.as_deref().is_some_and(is_allocator_frame)
}

/// The culprit frame of a stack: innermost non-allocator named frame (for a mapping, also not
/// libc's mmap or syscall wrapper: [`crate::allocator_frames::is_mapping_frame`]); else innermost named
/// frame; else the innermost frame (labelled by object and address). Returns (index, label).
pub fn culprit(stack: &Stack) -> (Option<usize>, String) {
    let named = |f: &Frame| f.function.as_deref().is_some_and(|n| !n.is_empty());
    let wrapper = |f: &Frame| {
        stack.kind == StackKind::Mmap && f.function.as_deref().is_some_and(crate::allocator_frames::is_mapping_frame)
    };
    let idx = stack
        .frames
        .iter()
        .position(|f| named(f) && !is_allocator(f) && !wrapper(f))
        .or_else(|| stack.frames.iter().position(named))
        .or(if stack.frames.is_empty() { None } else { Some(0) });
    match idx {
        Some(i) => (Some(i), frame_label(&stack.frames[i])),
        None if stack.lost => (None, "[stack lost]".to_string()),
        None => (None, "[unknown]".to_string()),
    }
}

/// Two-sided 95 % quantile of Student's t with `df` degrees of freedom.
pub fn t_crit95(df: usize) -> f64 {
    const TABLE: [f64; 30] = [
        12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179,
        2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060,
        2.056, 2.052, 2.048, 2.045, 2.042,
    ];
    match df {
        0 => f64::INFINITY,
        1..=30 => TABLE[df - 1],
        // 1.96 + 2.4/df matches the table within 0.003 at df = 40, 60, 120.
        _ => 1.96 + 2.4 / df as f64,
    }
}

/// Least-squares fit of `(t_s, bytes)` points. See [`Trend`].
pub fn fit(points: &[(f64, f64)]) -> Trend {
    let n = points.len();
    let mut tr = Trend { n, ..Trend::default() };
    if n == 0 {
        return tr;
    }
    tr.from_s = points[0].0;
    tr.to_s = points[n - 1].0;
    let nf = n as f64;
    let mt = points.iter().map(|p| p.0).sum::<f64>() / nf;
    let my = points.iter().map(|p| p.1).sum::<f64>() / nf;
    let sxx: f64 = points.iter().map(|p| (p.0 - mt).powi(2)).sum();
    if n < 2 || sxx.is_nan() || sxx <= 0.0 || !sxx.is_finite() {
        return tr;
    }
    let sxy: f64 = points.iter().map(|p| (p.0 - mt) * (p.1 - my)).sum();
    let slope = sxy / sxx;
    if !slope.is_finite() {
        return tr;
    }
    tr.slope_bytes_per_s = slope;
    if n < 3 {
        return tr;
    }
    let resid: Vec<f64> = points.iter().map(|p| p.1 - (my + slope * (p.0 - mt))).collect();
    let ssr: f64 = resid.iter().map(|e| e * e).sum();
    let syy: f64 = points.iter().map(|p| (p.1 - my).powi(2)).sum();
    // Residuals below float rounding of the data are a perfect fit.
    let ssr = if ssr <= syy * 1e-18 { 0.0 } else { ssr };
    let mut se = (ssr / (nf - 2.0) / sxx).sqrt();
    if n >= 6 && ssr > 0.0 {
        // Checkpoint series are autocorrelated (a burst stays live for several checkpoints);
        // widen the error by sqrt((1+r)/(1-r)), r = lag-1 autocorrelation of the residuals.
        let r: f64 = resid.windows(2).map(|w| w[0] * w[1]).sum::<f64>() / ssr;
        let r = r.clamp(0.0, 0.9);
        se *= ((1.0 + r) / (1.0 - r)).sqrt();
    }
    if !se.is_finite() {
        return tr;
    }
    let ci = t_crit95(n - 2) * se;
    let t = if se > 0.0 {
        (slope / se).clamp(-T_CAP, T_CAP)
    } else if slope == 0.0 {
        0.0
    } else {
        T_CAP.copysign(slope)
    };
    tr.stderr_bytes_per_s = Some(se);
    tr.ci95_bytes_per_s = Some(ci);
    tr.t_stat = Some(t);
    tr.significant_growth = slope > 0.0 && slope - ci > 0.0;
    tr
}

/// Checkpoint windows, as index ranges into the time-sorted checkpoints.
#[derive(Clone, Debug, PartialEq)]
struct Windows {
    /// Last half of the analysed span (or all of it, see `whole_run`).
    steady: std::ops::Range<usize>,
    /// From the first checkpoint of the span to the first checkpoint of the steady window,
    /// inclusive.
    early: Option<std::ops::Range<usize>>,
    /// Last quarter of the span, up to the last checkpoint at which the process was active.
    late: Option<std::ops::Range<usize>>,
    /// The process made no allocation or free during the last quarter: no plateau check was
    /// possible (a site that stopped growing when the process went idle may be a leak or a
    /// filled cache).
    late_idle: bool,
    whole_run: bool,
}

/// Windows over `span` (indexes into the time-sorted `times`); `last_active` is the index of the
/// first checkpoint after the process's last allocation or free (the plateau check ends there:
/// an idle process cannot show a plateau).
fn windows(times: &[f64], span: std::ops::Range<usize>, last_active: usize) -> Windows {
    let (a, b) = (span.start.min(times.len()), span.end.min(times.len()));
    let ts = &times[a..b];
    let whole = Windows { steady: a..b, early: None, late: None, late_idle: false, whole_run: true };
    let (Some(&t0), Some(&t1)) = (ts.first(), ts.last()) else { return whole };
    let dur = t1 - t0;
    let start = a + ts.partition_point(|&t| t < t0 + dur / 2.0);
    if dur.is_nan() || dur <= 0.0 || b - start < MIN_WINDOW_POINTS || start == a {
        return whole;
    }
    let late_start = a + ts.partition_point(|&t| t < t0 + dur * 0.75);
    let late_end = (last_active + 1).clamp(a, b);
    let late = (late_end.saturating_sub(late_start) >= MIN_PLATEAU_POINTS && late_start > start)
        .then_some(late_start..late_end);
    let late_idle = late.is_none() && b.saturating_sub(late_start) >= MIN_PLATEAU_POINTS;
    Windows { steady: start..b, early: Some(a..start + 1), late, late_idle, whole_run: false }
}

/// Index range of the checkpoints whose time lies in `[from, to]` (`times` sorted).
fn time_range(times: &[f64], from: f64, to: f64) -> std::ops::Range<usize> {
    times.partition_point(|&t| t < from)..times.partition_point(|&t| t <= to)
}

fn points(times: &[f64], ys: &[u64], r: std::ops::Range<usize>) -> Vec<(f64, f64)> {
    r.filter_map(|i| Some((*times.get(i)?, *ys.get(i)? as f64))).collect()
}

/// Least-squares fit of `ys` against units of work over the checkpoints `r` that counted them
/// (slope in bytes per unit). None when the window holds fewer than 2 distinct unit counts: no
/// work was done, so no per-unit growth can be measured.
fn unit_fit(units: &[Option<u64>], ys: &[u64], r: std::ops::Range<usize>) -> Option<Trend> {
    let pts: Vec<(f64, f64)> =
        r.filter_map(|i| Some(((*units.get(i)?)? as f64, *ys.get(i)? as f64))).collect();
    let first = pts.first()?.0;
    pts.iter().any(|p| p.0 != first).then(|| fit(&pts))
}

/// Factor for the number of checkpoints in a window: 0.25 below 3, 0.5 at 3, 1 from 10.
fn f_points(n: usize) -> f64 {
    if n < MIN_WINDOW_POINTS {
        0.25
    } else {
        (0.5 + 0.5 * (n - MIN_WINDOW_POINTS) as f64 / 7.0).min(1.0)
    }
}

/// Factor for the strength of a significant slope: 1 − (t_crit / t)².
fn f_tstat(tr: &Trend) -> f64 {
    let crit = t_crit95(tr.n.saturating_sub(2));
    match tr.t_stat {
        Some(t) if t > crit => 1.0 - (crit / t).powi(2),
        _ => 0.0,
    }
}

/// A t statistic for humans: one decimal, "> 1000" for (near-)perfect fits, "n/a" without one.
fn fmt_t(t: Option<f64>) -> String {
    match t {
        Some(t) if t.abs() >= 1000.0 => format!("{}> 1000", if t < 0.0 { "-" } else { "" }),
        Some(t) => format!("= {t:.1}"),
        None => "n/a".to_string(),
    }
}

fn round3(x: f64) -> f64 {
    if x.is_finite() { (x * 1000.0).round() / 1000.0 } else { 0.0 }
}

fn clamp_conf(x: f64) -> f64 {
    round3(if x.is_finite() { x.clamp(0.01, 0.99) } else { 0.01 })
}

/// Per-site series, one entry per time-sorted checkpoint.
struct Series {
    live_bytes: Vec<u64>,
    live_count: Vec<u64>,
    last: crate::recording::SiteSample,
    /// Mappings: resident bytes at the last checkpoint that had the figure.
    resident: Option<u64>,
}

/// Analyse a recording. Never panics on odd input (no checkpoint, one checkpoint, zero duration,
/// missing memory figures, samples that refer to unknown stacks); such cases lower the confidence
/// and add a warning instead.
pub fn analyze(rec: &Recording, opts: &AnalyzeOptions) -> Analysis {
    let mut warnings = Vec::new();

    // Checkpoints in time order, ignoring any with a non-finite time.
    let mut order: Vec<usize> =
        (0..rec.checkpoints.len()).filter(|&i| rec.checkpoints[i].t_s.is_finite()).collect();
    if order.len() != rec.checkpoints.len() {
        warnings.push(format!(
            "{} checkpoint(s) with an invalid time were ignored",
            rec.checkpoints.len() - order.len()
        ));
    }
    order.sort_by(|&a, &b| rec.checkpoints[a].t_s.total_cmp(&rec.checkpoints[b].t_s));
    // Times rounded to the nanosecond: the analysis of a recording in memory and of the same
    // recording read back from JSON must agree to the last bit.
    let times: Vec<f64> =
        order.iter().map(|&i| (rec.checkpoints[i].t_s * 1e9).round() / 1e9).collect();
    let n = times.len();
    let t0 = times.first().copied().unwrap_or(0.0);
    let duration = times.last().map_or(0.0, |t| t - t0).max(0.0);

    // Sites: one per stack, plus any stack id a sample refers to that the recording lacks.
    let mut stacks: Vec<Stack> = rec.stacks.clone();
    let mut index: HashMap<u32, usize> = HashMap::new();
    for (i, s) in stacks.iter().enumerate() {
        index.entry(s.id).or_insert(i);
    }
    if index.len() != stacks.len() {
        warnings.push("the recording has duplicate stack ids; only the first is used".into());
    }
    let mut unknown = 0usize;
    for &ci in &order {
        for s in &rec.checkpoints[ci].sites {
            if let std::collections::hash_map::Entry::Vacant(e) = index.entry(s.stack) {
                e.insert(stacks.len());
                stacks.push(Stack { id: s.stack, kind: StackKind::Malloc, frames: vec![], lost: false });
                unknown += 1;
            }
        }
    }
    if unknown > 0 {
        warnings.push(format!(
            "{unknown} site(s) refer to a stack missing from the recording (shown as [unknown])"
        ));
    }

    let mut series: Vec<Series> = (0..stacks.len())
        .map(|_| Series {
            live_bytes: Vec::with_capacity(n),
            live_count: Vec::with_capacity(n),
            last: Default::default(),
            resident: None,
        })
        .collect();
    let mut resident: Vec<Option<u64>> = vec![None; stacks.len()];
    let mut cur: Vec<crate::recording::SiteSample> = vec![Default::default(); stacks.len()];
    // Allocations + frees of all sites so far, at each checkpoint (process activity).
    let mut activity: Vec<u64> = Vec::with_capacity(n);
    for &ci in &order {
        // Samples are cumulative; a site absent from a later checkpoint keeps its last totals.
        let mut here: HashMap<usize, crate::recording::SiteSample> = HashMap::new();
        for s in &rec.checkpoints[ci].sites {
            let Some(&si) = index.get(&s.stack) else { continue };
            let e = here.entry(si).or_insert_with(|| crate::recording::SiteSample {
                stack: s.stack,
                ..Default::default()
            });
            e.alloc_bytes = e.alloc_bytes.saturating_add(s.alloc_bytes);
            e.alloc_count = e.alloc_count.saturating_add(s.alloc_count);
            e.free_bytes = e.free_bytes.saturating_add(s.free_bytes);
            e.free_count = e.free_count.saturating_add(s.free_count);
            if let Some(r) = s.resident_bytes {
                e.resident_bytes = Some(e.resident_bytes.unwrap_or(0).saturating_add(r));
            }
        }
        for (si, s) in here {
            if s.resident_bytes.is_some() {
                resident[si] = s.resident_bytes;
            }
            cur[si] = s;
        }
        for (si, ser) in series.iter_mut().enumerate() {
            ser.live_bytes.push(cur[si].live_bytes());
            ser.live_count.push(cur[si].live_count());
        }
        activity.push(cur.iter().fold(0u64, |acc, s| {
            acc.saturating_add(s.alloc_count).saturating_add(s.free_count)
        }));
    }

    // The analysed span: from the last idle checkpoint before the first allocation or free to
    // the end; when the target exited, only up to the first checkpoint after its last allocation
    // or free (the idle time before exiting says nothing about growth).
    let changed: Vec<usize> = (1..n).filter(|&k| activity[k] != activity[k - 1]).collect();
    let last_active = changed.last().copied().unwrap_or(n.saturating_sub(1));
    let span_start = changed.first().map_or(0, |&k| k - 1);
    let span_end = if rec.end_reason == EndReason::TargetExited && last_active > span_start {
        last_active + 1
    } else {
        n
    };
    let span = span_start..span_end;
    if span_start > 0 {
        warnings.push(format!(
            "no allocation or free in the first {:.1} s: rates are measured from {:.1} s",
            times[span_start] - t0,
            times[span_start] - t0
        ));
    }
    if span_end < n {
        warnings.push(format!(
            "the target made no allocation or free in its last {:.1} s before exiting: rates are \
             measured up to {:.1} s",
            times[n - 1] - times[span_end - 1],
            times[span_end - 1] - t0
        ));
    }
    let win = windows(&times, span.clone(), last_active);
    let span_duration = match (times.get(span.start), span.end.checked_sub(1).and_then(|e| times.get(e))) {
        (Some(a), Some(b)) => (b - a).max(0.0),
        _ => 0.0,
    };
    let steady_points = win.steady.len();
    if n < MIN_WINDOW_POINTS || steady_points < MIN_WINDOW_POINTS {
        warnings.push(format!(
            "only {} checkpoint(s) to fit: growth cannot be measured (at least \
             {MIN_WINDOW_POINTS} are needed); record longer or with a shorter interval",
            steady_points
        ));
    } else if win.whole_run {
        warnings.push(format!(
            "the last half of the run holds fewer than {MIN_WINDOW_POINTS} checkpoints: the trend \
             is fitted over the whole run, start-up growth included"
        ));
    }
    for (si, ser) in series.iter_mut().enumerate() {
        ser.last = cur[si].clone();
        ser.resident = resident[si];
    }

    // Units of work (calls of the work probe since attach) at each checkpoint.
    let units: Vec<Option<u64>> = order.iter().map(|&i| rec.checkpoints[i].units_of_work).collect();
    let units_of_work = if rec.work_probe.is_some() || units.iter().any(Option::is_some) {
        units.iter().rev().find_map(|u| *u)
    } else {
        None
    };
    if let Some(w) = &rec.work_probe {
        let counted = units.get(win.steady.clone()).is_some_and(|u| {
            let c: Vec<u64> = u.iter().flatten().copied().collect();
            c.first() != c.last()
        });
        if !counted {
            warnings.push(format!(
                "the work probe {w} counted no call over the steady window: growth is given per \
                 second only"
            ));
        }
    }

    // Counters (cumulative: the last checkpoint).
    let mut drops: BTreeMap<String, u64> = BTreeMap::new();
    let mut events: BTreeMap<String, u64> = BTreeMap::new();
    for c in &counter::TABLE {
        if c.is_loss {
            drops.insert(c.name.to_string(), 0);
        } else {
            events.insert(c.name.to_string(), 0);
        }
    }
    if let Some(&last) = order.last() {
        for (k, &v) in &rec.checkpoints[last].counters {
            if let Some(d) = drops.get_mut(k) {
                *d = v;
            } else {
                events.insert(k.clone(), v);
            }
        }
    }
    let drops_total = drops.values().fold(0u64, |a, &b| a.saturating_add(b));
    let allocs = events.get("allocs").copied().unwrap_or(0);
    let loss_ratio = if drops_total == 0 {
        0.0
    } else {
        drops_total as f64 / (allocs as f64 + drops_total as f64)
    };
    let f_drops = (1.0 - 5.0 * loss_ratio).clamp(0.2, 1.0);
    if drops_total > 0 {
        let names: Vec<String> =
            drops.iter().filter(|(_, v)| **v > 0).map(|(k, v)| format!("{k} {v}")).collect();
        warnings.push(format!(
            "{drops_total} event(s) were lost ({}; {:.2} % of recorded allocations): figures may \
             be incomplete",
            names.join(", "),
            loss_ratio * 100.0
        ));
    }

    // Sampled mode: a site's figures move in steps of about one sample.
    let sample_bytes = if rec.mode == Mode::Sampled { rec.sample_bytes.unwrap_or(0) } else { 0 };
    if sample_bytes > 0 {
        warnings.push(format!(
            "sampled mode: per-site figures are estimates from one sample every {sample_bytes} \
             bytes on average; growth below about 2 samples over the run is treated as noise"
        ));
    }

    // What kind of memory each site holds under the target's runtime.
    let runtime = rec.target.runtime;
    let kinds: Vec<MemoryKind> = stacks.iter().map(|st| crate::runtimes::classify_site(runtime, st)).collect();

    // Per-site analysis.
    let ctx = SiteContext { times: &times, units: &units, duration: span_duration, win: &win, f_drops, sample_bytes };
    let mut sites: Vec<SiteAnalysis> = Vec::with_capacity(stacks.len());
    for (si, st) in stacks.iter().enumerate() {
        let ser = &series[si];
        sites.push(analyze_site(st, ser, &ctx, kinds[si]));
    }
    sites.sort_by(|a, b| {
        b.live_bytes.cmp(&a.live_bytes).then(b.growth_bytes.cmp(&a.growth_bytes)).then(a.id.cmp(&b.id))
    });
    let lost_bytes: u64 = sites.iter().filter(|s| s.stack_lost).map(|s| s.live_bytes).sum();
    if lost_bytes > 0 {
        warnings.push(format!(
            "{lost_bytes} live bytes at the end have no call stack (stack lost): they are counted \
             but not attributed"
        ));
    }

    // Process series.
    let mut memory = MemorySeries::default();
    for &ci in &order {
        let c = &rec.checkpoints[ci];
        if let Some(m) = &c.memory {
            let t = (c.t_s * 1e9).round() / 1e9;
            memory.rss_bytes.push((t, m.rss_bytes));
            memory.rss_anon_bytes.push((t, m.rss_anon_bytes));
            memory.rss_file_bytes.push((t, m.rss_file_bytes));
        }
        if let Some(al) = &c.allocator {
            let t = (c.t_s * 1e9).round() / 1e9;
            memory.allocator_resident_bytes.push((t, al.resident_bytes()));
        }
    }
    let mut native = vec![0u64; n];
    let mut mmap = vec![0u64; n];
    let mut fault = vec![0u64; n];
    // malloc sites of a runtime that are not native (managed, off-heap, runtime kinds).
    let mut other_malloc = vec![0u64; n];
    for (si, st) in stacks.iter().enumerate() {
        let target = match st.kind {
            StackKind::Mmap => &mut mmap,
            StackKind::Fault => &mut fault,
            _ if kinds[si] == MemoryKind::Native => &mut native,
            _ => &mut other_malloc,
        };
        for (k, v) in series[si].live_bytes.iter().enumerate() {
            target[k] = target[k].saturating_add(*v);
        }
    }
    if stacks.iter().any(|s| s.kind == StackKind::Fault) {
        memory.fault_bytes = times.iter().copied().zip(fault.iter().copied()).collect();
    }
    memory.native_live_bytes = times.iter().copied().zip(native.iter().copied()).collect();
    memory.mmap_live_bytes = times.iter().copied().zip(mmap.iter().copied()).collect();
    if memory.rss_bytes.len() < n {
        warnings.push(format!(
            "{} of {n} checkpoint(s) have no memory figures (process gone or /proc unreadable)",
            n - memory.rss_bytes.len()
        ));
    }

    let native_trend = fit(&points(&times, &native, win.steady.clone()));
    let traced: Vec<u64> = (0..n)
        .map(|k| native[k].saturating_add(mmap[k]).saturating_add(fault[k]).saturating_add(other_malloc[k]))
        .collect();
    let traced_trend = fit(&points(&times, &traced, win.steady.clone()));
    let (span_from, span_to) = (
        times.get(span.start).copied().unwrap_or(0.0),
        span.end.checked_sub(1).and_then(|e| times.get(e)).copied().unwrap_or(0.0),
    );
    // The runtime split: managed, native, off-heap and runtime series and their trends.
    let by_kind = crate::runtimes::memory_by_kind(rec);
    let with_times = |v: &[(f64, u64)]| -> Vec<(f64, u64)> { times.iter().copied().zip(v.iter().map(|p| p.1)).collect() };
    let gauge: Vec<(f64, u64)> =
        crate::runtimes::gauge_series(rec).into_iter().map(|(t, b)| ((t * 1e9).round() / 1e9, b)).collect();
    let managed_source = if !gauge.is_empty() { "hsperfdata" } else { "sites" };
    if rec.target.runtime.is_some() {
        memory.managed_bytes = if gauge.is_empty() { with_times(&by_kind.managed) } else { gauge };
    }
    memory.offheap_live_bytes = with_times(&by_kind.offheap);
    memory.runtime_live_bytes = with_times(&by_kind.runtime);
    let steady_from = times.get(win.steady.start).copied().unwrap_or(0.0);
    let kind_growth = |kind: MemoryKind, source: &str, pts: &[(f64, u64)]| -> KindGrowth {
        let ts: Vec<f64> = pts.iter().map(|p| p.0).collect();
        let vs: Vec<u64> = pts.iter().map(|p| p.1).collect();
        let trend = fit(&points(&ts, &vs, time_range(&ts, steady_from, span_to)));
        let peak = vs.iter().copied().max().unwrap_or(0);
        // Native bytes are exact malloc sizes (a site's floor); the other series hold pages.
        let abs_floor = if kind == MemoryKind::Native { SITE_FLOOR_BYTES_PER_S } else { KIND_FLOOR_BYTES_PER_S };
        let floor = if span_duration > 0.0 {
            (SITE_FLOOR_FRACTION * peak as f64 / span_duration).max(abs_floor)
        } else {
            abs_floor
        };
        KindGrowth {
            kind,
            source: source.to_string(),
            start_bytes: vs.first().copied().unwrap_or(0),
            end_bytes: vs.last().copied().unwrap_or(0),
            grows: trend.significant_growth && trend.slope_bytes_per_s > floor,
            trend,
            noise_floor_bytes_per_s: floor,
        }
    };
    let mut kind_list = Vec::new();
    if rec.target.runtime.is_some() {
        kind_list.push(kind_growth(MemoryKind::Managed, managed_source, &memory.managed_bytes));
    }
    kind_list.push(kind_growth(MemoryKind::Native, "sites", &memory.native_live_bytes));
    kind_list.push(kind_growth(MemoryKind::OffHeap, "sites", &memory.offheap_live_bytes));
    kind_list.push(kind_growth(MemoryKind::Runtime, "sites", &memory.runtime_live_bytes));

    // Steady-window trend of a process series, over the analysed span.
    let series_trend = |pts: &[(f64, u64)]| -> Option<Trend> {
        if pts.is_empty() {
            return None;
        }
        let mt: Vec<f64> = pts.iter().map(|p| p.0).collect();
        let mv: Vec<u64> = pts.iter().map(|p| p.1).collect();
        let r = time_range(&mt, span_from, span_to);
        let w = windows(&mt, r.clone(), r.end.saturating_sub(1));
        Some(fit(&points(&mt, &mv, w.steady)))
    };
    let rss_anon_trend = series_trend(&memory.rss_anon_bytes);
    let allocator_trend = series_trend(&memory.allocator_resident_bytes);

    // Per unit of work, over the same steady window; off-heap bytes; occupied heap to RSS.
    let traced_unit_trend = unit_fit(&units, &traced, win.steady.clone());
    let native_unit_trend = unit_fit(&units, &native, win.steady.clone());
    let offheap: Vec<u64> = memory.offheap_live_bytes.iter().map(|p| p.1).collect();
    let offheap_trend = fit(&points(&times, &offheap, win.steady.clone()));
    let offheap_unit_trend = unit_fit(&units, &offheap, win.steady.clone());
    let anon: Vec<Option<u64>> =
        order.iter().map(|&i| rec.checkpoints[i].memory.as_ref().map(|m| m.rss_anon_bytes)).collect();
    let anon_units: Vec<Option<u64>> = units.iter().zip(&anon).map(|(u, a)| a.and(*u)).collect();
    let anon_vals: Vec<u64> = anon.iter().map(|a| a.unwrap_or(0)).collect();
    let rss_anon_unit_trend = unit_fit(&anon_units, &anon_vals, win.steady.clone());
    let occupied_heap_to_rss_ratio = (0..n)
        .rev()
        .find_map(|k| anon[k].map(|a| (k, a)))
        .and_then(|(k, a)| (a > 0).then(|| (native[k] as f64 / a as f64 * 1e4).round() / 1e4));

    let summary = Summary {
        rss_start_bytes: memory.rss_bytes.first().map(|p| p.1),
        rss_end_bytes: memory.rss_bytes.last().map(|p| p.1),
        rss_anon_start_bytes: memory.rss_anon_bytes.first().map(|p| p.1),
        rss_anon_end_bytes: memory.rss_anon_bytes.last().map(|p| p.1),
        native_live_start_bytes: native.first().copied().unwrap_or(0),
        native_live_end_bytes: native.last().copied().unwrap_or(0),
        native_growth_bytes_per_s: native_trend.slope_bytes_per_s,
        rss_anon_growth_bytes_per_s: rss_anon_trend.map(|t| t.slope_bytes_per_s),
        allocator_resident_start_bytes: memory.allocator_resident_bytes.first().map(|p| p.1),
        allocator_resident_end_bytes: memory.allocator_resident_bytes.last().map(|p| p.1),
        allocator_resident_growth_bytes_per_s: allocator_trend.map(|t| t.slope_bytes_per_s),
        growth_bytes_per_s: traced_trend.slope_bytes_per_s,
        growth_bytes_per_unit: traced_unit_trend.map(|t| t.slope_bytes_per_s),
        native_growth_bytes_per_unit: native_unit_trend.map(|t| t.slope_bytes_per_s),
        offheap_live_start_bytes: offheap.first().copied().unwrap_or(0),
        offheap_live_end_bytes: offheap.last().copied().unwrap_or(0),
        offheap_growth_bytes_per_s: offheap_trend.slope_bytes_per_s,
        offheap_growth_bytes_per_unit: offheap_unit_trend.map(|t| t.slope_bytes_per_s),
        rss_anon_growth_bytes_per_unit: rss_anon_unit_trend.map(|t| t.slope_bytes_per_s),
        occupied_heap_to_rss_ratio,
    };
    let unit = unit_name(rec.work_probe.as_deref());

    let verdict = process_verdict(&ProcessInput {
        sites: &sites,
        n: steady_points,
        win: &win,
        duration: span_duration,
        native_trend: &native_trend,
        traced_trend: &traced_trend,
        rss_anon_trend: rss_anon_trend.as_ref(),
        rss_anon: &memory.rss_anon_bytes,
        allocator_trend: allocator_trend.as_ref(),
        allocator: &memory.allocator_resident_bytes,
        f_drops,
        unit: unit.as_deref(),
    });
    let verdict = kind_verdict(verdict, rec.target.runtime, &kind_list, &sites, f_drops);
    let verdict = losses_verdict(verdict, &drops, &events);

    Analysis {
        checkpoints: n,
        duration_s: duration,
        span_from_s: span_from - t0,
        span_to_s: span_to - t0,
        steady_from_s: times.get(win.steady.start).map_or(0.0, |t| t - t0),
        steady_is_whole_run: win.whole_run,
        sites,
        memory,
        summary,
        native_trend,
        rss_anon_trend,
        allocator_trend,
        drops,
        drops_total,
        events,
        verdict,
        warnings,
        top: opts.top,
        runtime: rec.target.runtime,
        kinds: kind_list,
        work_probe: rec.work_probe.clone(),
        units_of_work,
        traced_trend,
        traced_unit_trend,
    }
}

/// What every site's analysis shares.
struct SiteContext<'a> {
    /// Checkpoint times, sorted, seconds.
    times: &'a [f64],
    /// Units of work at each checkpoint (None: not counted).
    units: &'a [Option<u64>],
    /// Duration of the analysed span, seconds.
    duration: f64,
    win: &'a Windows,
    /// Confidence factor for losses.
    f_drops: f64,
    /// Sampled mode: mean distance between samples, bytes (0 otherwise).
    sample_bytes: u64,
}

fn analyze_site(st: &Stack, ser: &Series, ctx: &SiteContext<'_>, memory_kind: MemoryKind) -> SiteAnalysis {
    let SiteContext { times, units, duration, win, f_drops, sample_bytes } = *ctx;
    let (culprit_frame, function) = culprit(st);
    let live = &ser.live_bytes;
    let count = &ser.live_count;
    let first_live = live.first().copied().unwrap_or(0);
    let last_live = live.last().copied().unwrap_or(0);
    let peak = live.iter().copied().max().unwrap_or(0);
    let growth_bytes = (last_live as i128 - first_live as i128).clamp(i64::MIN as i128, i64::MAX as i128) as i64;

    let steady = fit(&points(times, live, win.steady.clone()));
    let per_unit = unit_fit(units, live, win.steady.clone());
    let early = win.early.clone().map(|r| fit(&points(times, live, r)));
    let late = win.late.clone().map(|r| fit(&points(times, live, r)));

    let floor = if duration > 0.0 {
        (SITE_FLOOR_FRACTION * peak as f64 / duration)
            .max(2.0 * sample_bytes as f64 / duration)
            .max(SITE_FLOOR_BYTES_PER_S)
    } else {
        SITE_FLOOR_BYTES_PER_S
    };
    let steady_vals: Vec<f64> = win.steady.clone().filter_map(|i| live.get(i)).map(|&v| v as f64).collect();
    let mean_steady = if steady_vals.is_empty() {
        0.0
    } else {
        steady_vals.iter().sum::<f64>() / steady_vals.len() as f64
    };
    let sd_steady = if steady_vals.len() < 2 {
        0.0
    } else {
        (steady_vals.iter().map(|v| (v - mean_steady).powi(2)).sum::<f64>()
            / (steady_vals.len() - 1) as f64)
            .sqrt()
    };
    let rise = mean_steady - first_live as f64;
    let count_at_start = count.get(win.steady.start).copied().unwrap_or(0);
    let count_end = count.last().copied().unwrap_or(0);
    let steady_growth_allocations =
        (count_end as i128 - count_at_start as i128).clamp(i64::MIN as i128, i64::MAX as i128) as i64;
    let turnover = (ser.last.alloc_bytes > 0).then(|| ser.last.alloc_bytes as f64 / peak.max(1) as f64);

    let grows = steady.significant_growth && steady.slope_bytes_per_s > floor;
    let plateau = grows
        && late.is_some_and(|l| {
            !(l.significant_growth && l.slope_bytes_per_s > floor)
                && l.slope_bytes_per_s < PLATEAU_RATIO * steady.slope_bytes_per_s
        });
    // Live blocks must not fall: either more blocks, or the same blocks enlarged (realloc).
    let count_grew = steady_growth_allocations > 0;
    let enlarged = steady_growth_allocations == 0 && count_end > 0;
    let count_ok = count_grew || enlarged;
    let f_n = f_points(steady.n);
    let f_share = if win.whole_run { 0.6 } else { 1.0 };
    // Bytes the noise floor allows over the whole run.
    let floor_bytes = floor * duration.max(1.0);
    // A cache is growth that levels off: the steady window must be clearly slower than the
    // first part. A steady slope that is merely not significant (few checkpoints) while it
    // keeps the early pace is no evidence of a plateau.
    let flattened = steady.slope_bytes_per_s <= floor
        || early.is_none_or(|e| steady.slope_bytes_per_s < PLATEAU_RATIO * e.slope_bytes_per_s.max(0.0));
    let unresolved = !grows
        && !flattened
        && count_ok
        && steady.slope_bytes_per_s > floor
        && early.is_some_and(|e| e.significant_growth && e.slope_bytes_per_s > floor);
    // Too few checkpoints for any fit (a process traced late, a short run), but live bytes never
    // fell and grew beyond what the noise floor allows: not "no growth".
    let rising = live.len() >= 2 && live.windows(2).all(|w| w[1] >= w[0]);
    let too_short =
        !grows && steady.n < MIN_WINDOW_POINTS && count_grew && rising && growth_bytes as f64 > floor_bytes;

    let (class, confidence, mut reason);
    if too_short {
        class = SiteClass::Leak;
        confidence = clamp_conf(0.5 * f_n * f_share * f_drops);
        reason = format!(
            "live bytes never fell and grew by {} in all, but {} checkpoint(s) are too few \
             to tell a leak from a cache that is still filling; record longer or with a shorter \
             --interval to be sure",
            crate::report::human::bytes(growth_bytes.max(0) as u64),
            live.len()
        );
    } else if unresolved {
        // Grows through the whole run at a steady pace; too few checkpoints in the steady window
        // for significance there: a leak, with the confidence that evidence gives.
        class = SiteClass::Leak;
        let e = early.unwrap_or_default();
        confidence = clamp_conf(0.5 * f_tstat(&e) * f_n * f_share * f_drops);
        reason = format!(
            "live bytes grow through the whole run without levelling off: {:.1} B/s in the first part (t {}), {:.1} B/s over the steady window ({} checkpoints: too few for significance there); record longer or with a shorter --interval to be sure",
            e.slope_bytes_per_s,
            fmt_t(e.t_stat),
            steady.slope_bytes_per_s,
            steady.n
        );
    } else if grows && count_ok && !plateau {
        class = SiteClass::Leak;
        let f_margin = 1.0 - 0.5 * floor / steady.slope_bytes_per_s;
        let f_blocks = if count_grew { 1.0 } else { 0.8 };
        let f_idle = if win.late_idle { 0.6 } else { 1.0 };
        confidence = clamp_conf(
            f_tstat(&steady) * f_n * f_margin * f_share * f_drops * f_blocks * f_idle,
        );
        let blocks = if count_grew {
            format!("live blocks grew by {steady_growth_allocations}")
        } else {
            format!("the same {count_end} live block(s) keep being enlarged (realloc)")
        };
        reason = format!(
            "live bytes grow {:.1} B/s (95 % CI ±{:.1}, t {}, {} checkpoints) over the steady \
             window, above the noise floor of {:.1} B/s, and {blocks}",
            steady.slope_bytes_per_s,
            steady.ci95_bytes_per_s.unwrap_or(0.0),
            fmt_t(steady.t_stat),
            steady.n,
            floor,
        );
        if win.late_idle {
            reason.push_str(
                "; the process made no allocation or free in the last quarter of the run, so \
                 whether the growth would have levelled off (a cache) is unknown",
            );
        }
    } else if turnover.is_some_and(|t| t >= TEMPORARY_TURNOVER) && ser.last.free_count > 0 && !grows {
        class = SiteClass::Temporary;
        let to = turnover.unwrap_or(TEMPORARY_TURNOVER);
        let f_turn = 1.0 - 2.0 / to;
        let f_flat = 1.0 - 0.5 * (steady.slope_bytes_per_s.abs() / floor).min(1.0);
        confidence = clamp_conf(f_turn * f_flat * f_n * f_drops);
        let churn = if peak == 0 {
            "every block was freed before the next checkpoint".to_string()
        } else {
            format!("allocated {to:.1}× its peak live bytes and freed them")
        };
        reason = format!(
            "{churn}: short-lived blocks; live bytes do not grow beyond noise ({:.1} B/s, floor \
             {:.1} B/s)",
            steady.slope_bytes_per_s, floor
        );
    } else if (grows && (plateau || !count_ok))
        || (rise > floor_bytes && rise > 3.0 * sd_steady && growth_bytes > 0 && flattened)
    {
        class = SiteClass::Cache;
        let retained = (growth_bytes.max(0) as f64).max(rise).max(1.0);
        let f_rise = (1.0 - 0.5 * floor_bytes / retained).clamp(0.0, 1.0);
        let steady_span = (steady.to_s - steady.from_s).max(0.0);
        let f_flat = if plateau || (grows && !count_ok) {
            0.5
        } else {
            1.0 - (steady.slope_bytes_per_s.max(0.0) * steady_span / retained).min(1.0) * 0.8
        };
        confidence = clamp_conf(f_rise * f_flat * f_n * f_share * f_drops);
        reason = if grows && !count_ok {
            format!(
                "live bytes grow {:.1} B/s while the number of live blocks falls by {}: fewer, \
                 larger blocks; check that the size is bounded",
                steady.slope_bytes_per_s, -steady_growth_allocations
            )
        } else if plateau {
            format!(
                "live bytes grew ({:.1} B/s over the steady window) but stopped in the last \
                 quarter ({:.1} B/s): levelled off",
                steady.slope_bytes_per_s,
                late.map_or(0.0, |l| l.slope_bytes_per_s)
            )
        } else {
            format!(
                "live bytes rose by {} ({:.0} B), then stayed flat over the steady window ({:.1} \
                 B/s: below the noise floor of {:.1} B/s or not significant)",
                crate::report::human::bytes(rise.max(0.0) as u64),
                rise,
                steady.slope_bytes_per_s,
                floor
            )
        };
    } else {
        class = SiteClass::Flat;
        let f_flat = 1.0 - 0.5 * (steady.slope_bytes_per_s.abs() / floor).min(1.0);
        confidence = clamp_conf(f_flat * f_n * f_drops);
        reason = format!(
            "no growth beyond noise ({:.1} B/s over the steady window, floor {:.1} B/s)",
            steady.slope_bytes_per_s, floor
        );
    }

    SiteAnalysis {
        id: st.id,
        kind: st.kind,
        memory_kind,
        function,
        culprit_frame,
        frames: st.frames.clone(),
        stack_lost: st.lost,
        live_bytes: ser.last.live_bytes(),
        live_allocations: ser.last.live_count(),
        allocated_bytes: ser.last.alloc_bytes,
        allocations: ser.last.alloc_count,
        freed_bytes: ser.last.free_bytes,
        frees: ser.last.free_count,
        growth_bytes,
        growth_bytes_per_s: steady.slope_bytes_per_s,
        growth_ci95_bytes_per_s: steady.ci95_bytes_per_s,
        growth_bytes_per_unit: per_unit.map(|t| t.slope_bytes_per_s),
        growth_ci95_bytes_per_unit: per_unit.and_then(|t| t.ci95_bytes_per_s),
        resident_bytes: if st.kind == StackKind::Mmap { ser.resident } else { None },
        class,
        confidence,
        evidence: SiteEvidence {
            steady,
            early,
            late,
            noise_floor_bytes_per_s: floor,
            steady_growth_allocations,
            peak_live_bytes: peak,
            first_live_bytes: first_live,
            rise_bytes: rise,
            steady_sd_bytes: sd_steady,
            turnover,
            plateau,
            reason,
        },
    }
}

struct ProcessInput<'a> {
    sites: &'a [SiteAnalysis],
    n: usize,
    win: &'a Windows,
    duration: f64,
    native_trend: &'a Trend,
    traced_trend: &'a Trend,
    rss_anon_trend: Option<&'a Trend>,
    rss_anon: &'a [(f64, u64)],
    allocator_trend: Option<&'a Trend>,
    allocator: &'a [(f64, u64)],
    f_drops: f64,
    /// What one unit of work is ("call of handle_message"), None without a work probe.
    unit: Option<&'a str>,
}

/// Off-heap program memory: an anonymous mapping that is neither the allocator's, the loader's
/// nor a runtime's ([`crate::runtimes::classify_site`]).
fn is_offheap_mapping(s: &SiteAnalysis) -> bool {
    s.kind == StackKind::Mmap && matches!(s.memory_kind, MemoryKind::OffHeap | MemoryKind::Native)
}

/// Share of traced allocator calls whose bytes were lost (0..1), from the loss counters that
/// leave live bytes incomplete ([`counter::byte_losses`]; the others lose call stacks, never
/// bytes).
pub fn lost_share(drops: &BTreeMap<String, u64>, events: &BTreeMap<String, u64>) -> f64 {
    let lost: u64 = counter::byte_losses().filter_map(|c| drops.get(c.name)).sum();
    let seen = events.get("allocs").copied().unwrap_or(0) + lost;
    if seen == 0 { 0.0 } else { lost as f64 / seen as f64 }
}

/// When more than 1 % of the allocations were lost (a full map), what looks flat or like
/// fragmentation may be untraced memory: such a verdict becomes "inconclusive", and a leak found
/// anyway is said to be a lower bound. The losses are named on the verdict line.
fn losses_verdict(v: Verdict, drops: &BTreeMap<String, u64>, events: &BTreeMap<String, u64>) -> Verdict {
    let share = lost_share(drops, events);
    if share <= 0.01 {
        return v;
    }
    let named: Vec<String> =
        counter::byte_losses().filter_map(|c| drops.get(c.name).filter(|n| **n > 0).map(|n| format!("{} {n}", c.name))).collect();
    let why = format!(
        "{:.0} % of allocator calls were not traced ({}; raise --max-allocs / --max-sites)",
        share * 100.0,
        named.join(", ")
    );
    match v.class {
        ProcessClass::Leak | ProcessClass::OffHeap => Verdict {
            summary: format!("{}; {why}: the growth is a lower bound", v.summary),
            confidence: clamp_conf(v.confidence * (1.0 - share)),
            ..v
        },
        _ => Verdict {
            class: ProcessClass::Flat,
            confidence: clamp_conf(0.1 * (1.0 - share)),
            summary: format!("inconclusive: {why}; without them: {}", v.summary),
            inconclusive: true,
        },
    }
}

/// How a leaking site grows, for the verdict: per unit of work first when measured, then per
/// second, over the steady `window`; what it holds at the end (mapped and resident bytes for a
/// mapping).
fn leak_phrase(s: &SiteAnalysis, unit: Option<&str>, window: &str) -> String {
    use crate::report::human::{bytes as hb, rate as hr};
    let per_s = format!(
        "{} ({:.0} B/s ± {:.0} at 95 %)",
        hr(s.growth_bytes_per_s),
        s.growth_bytes_per_s,
        s.growth_ci95_bytes_per_s.unwrap_or(0.0)
    );
    let map = s.kind == StackKind::Mmap;
    let growth = match (s.growth_bytes_per_unit, unit, map) {
        (Some(u), Some(unit), false) => format!(
            "{} holds {u:.0} B more live bytes per {unit} (± {:.0} at 95 %), {per_s} over the \
             steady window ({window})",
            s.function,
            s.growth_ci95_bytes_per_unit.unwrap_or(0.0)
        ),
        (Some(u), Some(unit), true) => format!(
            "{} maps {u:.0} B per {unit} (± {:.0} at 95 %) in anonymous mappings it never unmaps, \
             {per_s} over the steady window ({window})",
            s.function,
            s.growth_ci95_bytes_per_unit.unwrap_or(0.0)
        ),
        (_, _, false) => format!("{} holds {per_s} more live bytes over the steady window ({window})", s.function),
        (_, _, true) => format!(
            "{} maps {per_s} more in anonymous mappings it never unmaps over the steady window \
             ({window})",
            s.function
        ),
    };
    let held = match (map, s.resident_bytes) {
        (true, Some(r)) => format!("{} ({} B) mapped, {} resident at the end", hb(s.live_bytes), s.live_bytes, hb(r)),
        (true, None) => format!("{} ({} B) mapped at the end", hb(s.live_bytes), s.live_bytes),
        _ => format!("{} ({} B) live at the end", hb(s.live_bytes), s.live_bytes),
    };
    format!("{growth}; {held}")
}

/// Noise floor of a process series (RSS, allocator footprint), bytes per second:
/// max([`RSS_FLOOR_BYTES_PER_S`], [`SITE_FLOOR_FRACTION`] × its peak / span duration).
fn process_floor(series: &[(f64, u64)], duration: f64) -> f64 {
    let peak = series.iter().map(|x| x.1).max().unwrap_or(0);
    if duration > 0.0 {
        (SITE_FLOOR_FRACTION * peak as f64 / duration).max(RSS_FLOOR_BYTES_PER_S)
    } else {
        RSS_FLOOR_BYTES_PER_S
    }
}

fn process_verdict(p: &ProcessInput<'_>) -> Verdict {
    use crate::report::human::{bytes as hb, rate as hr};
    let f_n = f_points(p.native_trend.n);
    let window = format!("{:.0}–{:.0} s", p.native_trend.from_s, p.native_trend.to_s);

    // Leak: the fastest-growing leaking site names the culprit. Off-heap mappings and malloc-heap
    // sites are told apart; the class is the one that grows faster in all, the other is named too.
    let mut leaks: Vec<&SiteAnalysis> = p.sites.iter().filter(|s| s.class == SiteClass::Leak).collect();
    leaks.sort_by(|a, b| b.growth_bytes_per_s.total_cmp(&a.growth_bytes_per_s));
    if !leaks.is_empty() {
        let (maps, heap): (Vec<&SiteAnalysis>, Vec<&SiteAnalysis>) =
            leaks.iter().partition(|s| is_offheap_mapping(s));
        let sum = |v: &[&SiteAnalysis]| v.iter().map(|s| s.growth_bytes_per_s).sum::<f64>();
        let offheap = sum(&maps) > sum(&heap);
        let (first, second) = if offheap { (&maps, &heap) } else { (&heap, &maps) };
        let top = first[0];
        let (class, name, other) = if offheap {
            (ProcessClass::OffHeap, "off-heap", "a leak in the malloc heap")
        } else {
            (ProcessClass::Leak, "leak", "an off-heap leak")
        };
        let mut summary = format!("{name}: {}", leak_phrase(top, p.unit, &window));
        if first.len() > 1 {
            summary.push_str(&format!(
                "; {} leaking {}sites in all, {} in total",
                first.len(),
                if offheap { "mapping " } else { "" },
                hr(sum(first))
            ));
        }
        if let Some(o) = second.first() {
            summary.push_str(&format!("; also {other}: {}", leak_phrase(o, p.unit, &window)));
            if second.len() > 1 {
                summary.push_str(&format!(" ({} sites, {} in total)", second.len(), hr(sum(second))));
            }
        }
        return Verdict { class, confidence: top.confidence, summary, inconclusive: false };
    }

    let share = if p.win.whole_run { 0.6 } else { 1.0 };
    // `grows` grows significantly above its floor while `live` grows slower than a quarter of
    // it. Flat means slow compared with `grows`, whatever its significance: a noisy live slope
    // close to it is not evidence of fragmentation.
    let outgrows = |grows: &Trend, floor: f64, live: &Trend| {
        grows.n >= MIN_WINDOW_POINTS
            && grows.significant_growth
            && grows.slope_bytes_per_s > floor
            && live.slope_bytes_per_s < FRAGMENTATION_RATIO * grows.slope_bytes_per_s
    };
    let gap = |grows: &Trend, live: &Trend| {
        1.0 - (live.slope_bytes_per_s.max(0.0) / grows.slope_bytes_per_s).min(1.0)
    };

    // Fragmentation, measured: the allocator's own resident memory (brk heap and arenas) grows,
    // live malloc bytes do not.
    let alloc_grows = p
        .allocator_trend
        .filter(|at| outgrows(at, process_floor(p.allocator, p.duration), p.native_trend));
    if let Some(at) = alloc_grows {
        let confidence = clamp_conf(
            f_tstat(at) * f_points(at.n) * gap(at, p.native_trend) * share * p.f_drops,
        );
        let summary = format!(
            "fragmentation: the allocator's resident memory (heap and arenas) grows {} ({:.0} B/s \
             ± {:.0}) over the steady window while live native bytes stay flat ({:.0} B/s): freed \
             memory is kept by the allocator (fragmentation or retention), not leaked",
            hr(at.slope_bytes_per_s),
            at.slope_bytes_per_s,
            at.ci95_bytes_per_s.unwrap_or(0.0),
            p.native_trend.slope_bytes_per_s
        );
        return Verdict { class: ProcessClass::Fragmentation, confidence, summary, inconclusive: false };
    }

    // Fragmentation, inferred: RSS-anon grows significantly, traced live bytes do not.
    let rss_grows = p
        .rss_anon_trend
        .filter(|rt| outgrows(rt, process_floor(p.rss_anon, p.duration), p.traced_trend));
    if let Some(rt) = rss_grows {
        // With the allocator's footprint measured (and not growing), the growth is not the
        // malloc heap's.
        let heap_flat = p.allocator_trend.is_some_and(|t| t.n >= MIN_WINDOW_POINTS);
        let cause = if heap_flat {
            "the malloc heap's own footprint does not grow, so the memory comes from elsewhere \
             (an allocator that is not traced, thread stacks, mappings made before attach)"
        } else {
            "the allocator holds freed memory (fragmentation) or memory comes from an allocator \
             that is not traced"
        };
        let f_heap = if heap_flat { 0.7 } else { 1.0 };
        let confidence = clamp_conf(
            (f_tstat(rt) * f_points(rt.n) * gap(rt, p.traced_trend) * share * p.f_drops * f_heap)
                .min(0.8),
        );
        let summary = format!(
            "fragmentation: RSS (anon) grows {} ({:.0} B/s ± {:.0}) over the steady window while \
             traced live bytes stay flat ({:.0} B/s): {cause} — not a leak of traced allocations",
            hr(rt.slope_bytes_per_s),
            rt.slope_bytes_per_s,
            rt.ci95_bytes_per_s.unwrap_or(0.0),
            p.traced_trend.slope_bytes_per_s
        );
        return Verdict { class: ProcessClass::Fragmentation, confidence, summary, inconclusive: false };
    }

    if p.n < MIN_WINDOW_POINTS {
        return Verdict {
            class: ProcessClass::Flat,
            confidence: clamp_conf(0.1 * p.f_drops),
            inconclusive: true,
            summary: format!(
                "inconclusive: only {} checkpoint(s), growth cannot be measured; no leak found",
                p.n
            ),
        };
    }

    // Cache: the largest retained growth among caches names it.
    let mut caches: Vec<&SiteAnalysis> = p.sites.iter().filter(|s| s.class == SiteClass::Cache).collect();
    caches.sort_by_key(|s| std::cmp::Reverse(s.growth_bytes));
    let native_flat_factor = if p.native_trend.significant_growth { 0.7 } else { 1.0 };
    if let Some(top) = caches.first() {
        let total: i64 = caches.iter().map(|s| s.growth_bytes.max(0)).sum();
        let summary = format!(
            "no leak: memory rose and levelled off (cache-like retention); largest: {} holds {} \
             (+{} since the first checkpoint, {:.0} B/s over the steady window); {} cache site(s) \
             retain {} in all",
            top.function,
            hb(top.live_bytes),
            hb(top.growth_bytes.max(0) as u64),
            top.growth_bytes_per_s,
            caches.len(),
            hb(total as u64)
        );
        return Verdict {
            class: ProcessClass::Cache,
            confidence: clamp_conf(top.confidence * native_flat_factor),
            summary,
            inconclusive: false,
        };
    }

    let floor_native = {
        let peak = p.sites.iter().map(|s| s.evidence.peak_live_bytes).sum::<u64>();
        if p.duration > 0.0 {
            (SITE_FLOOR_FRACTION * peak as f64 / p.duration).max(SITE_FLOOR_BYTES_PER_S)
        } else {
            SITE_FLOOR_BYTES_PER_S
        }
    };
    let f_flat = 1.0 - 0.5 * (p.native_trend.slope_bytes_per_s.abs() / floor_native).min(1.0);
    let temps: Vec<&SiteAnalysis> = p.sites.iter().filter(|s| s.class == SiteClass::Temporary).collect();
    if !temps.is_empty() {
        let churn: u64 = temps.iter().map(|s| s.freed_bytes).sum();
        let allocs: u64 = temps.iter().map(|s| s.frees).sum();
        return Verdict {
            class: ProcessClass::Temporary,
            confidence: clamp_conf(f_flat * f_n * p.f_drops),
            inconclusive: false,
            summary: format!(
                "no leak: allocations are short-lived — {} site(s) allocated and freed {} in {} \
                 blocks; live native bytes stay flat ({:.0} B/s)",
                temps.len(),
                hb(churn),
                allocs,
                p.native_trend.slope_bytes_per_s
            ),
        };
    }
    Verdict {
        class: ProcessClass::Flat,
        confidence: clamp_conf(f_flat * f_n * p.f_drops),
        inconclusive: false,
        summary: format!(
            "no leak: no allocation site grows beyond noise (live native bytes {:.0} B/s over the \
             steady window)",
            p.native_trend.slope_bytes_per_s
        ),
    }
}

/// Where to look for what holds a growing managed heap (leaktrace sees the runtime's allocator,
/// not the code that keeps the objects reachable).
fn heap_tool(runtime: Runtime) -> &'static str {
    match runtime {
        Runtime::Python => "tracemalloc or a heap dump (objgraph, guppy) shows which objects",
        Runtime::Jvm => "a class histogram (jcmd PID GC.class_histogram) or a heap dump shows which objects",
        Runtime::Go => "the heap profile (pprof) shows which allocations",
        Runtime::Node => "a heap snapshot (--heapsnapshot-signal or the inspector) shows which objects",
    }
}

/// For a target with a managed runtime, name the kind of memory that grows ("native leak in
/// parse_record (C extension), Python heap flat"), with the other kinds' trends; a managed heap
/// that grows significantly is a leak even without a leaking site (the JVM's heap is seen only
/// through its gauge). Without a runtime the verdict is unchanged.
fn kind_verdict(v: Verdict, runtime: Option<Runtime>, kinds: &[KindGrowth], sites: &[SiteAnalysis], f_drops: f64) -> Verdict {
    use crate::report::human::{bytes as hb, rate as hr};
    let Some(rt) = runtime else { return v };
    let heap = crate::runtimes::heap_name(rt);
    let label = |k: MemoryKind| if k == MemoryKind::Managed { heap.to_string() } else { k.as_str().to_string() };
    let state = |g: &KindGrowth| {
        if g.grows {
            format!("{} grows {}", label(g.kind), hr(g.trend.slope_bytes_per_s))
        } else {
            format!("{} flat ({})", label(g.kind), hr(g.trend.slope_bytes_per_s))
        }
    };
    let others = |except: MemoryKind| -> String {
        kinds
            .iter()
            .filter(|g| g.kind != except && (g.kind != MemoryKind::Runtime || g.grows))
            .map(state)
            .collect::<Vec<_>>()
            .join(", ")
    };
    // The kind that leaks: the fastest-growing series among managed, native and off-heap (runtime
    // only when nothing else grows: glibc's arenas, counted there, fill as native leaks grow);
    // without a growing series, the kind whose leaking sites grow fastest in all.
    let managed = kinds.iter().find(|g| g.kind == MemoryKind::Managed);
    let mut growing: Vec<&KindGrowth> = kinds.iter().filter(|g| g.grows && g.kind != MemoryKind::Runtime).collect();
    if growing.is_empty() {
        growing = kinds.iter().filter(|g| g.grows).collect();
    }
    growing.sort_by(|a, b| b.trend.slope_bytes_per_s.total_cmp(&a.trend.slope_bytes_per_s));
    let has_leak_site = |k: MemoryKind| sites.iter().any(|s| s.class == SiteClass::Leak && s.memory_kind == k);
    let mut rates: Vec<(MemoryKind, f64)> = Vec::new();
    for s in sites.iter().filter(|s| s.class == SiteClass::Leak) {
        match rates.iter_mut().find(|(k, _)| *k == s.memory_kind) {
            Some((_, r)) => *r += s.growth_bytes_per_s,
            None => rates.push((s.memory_kind, s.growth_bytes_per_s)),
        }
    }
    rates.sort_by(|a, b| b.1.total_cmp(&a.1));
    let leak_kind = match growing.iter().find(|g| g.kind == MemoryKind::Managed || has_leak_site(g.kind)) {
        Some(g) => Some(g.kind),
        None => rates.first().map(|(k, _)| *k),
    };
    match leak_kind {
        Some(MemoryKind::Managed) => {
            let Some(m) = managed else { return v };
            let site_conf = sites
                .iter()
                .filter(|s| s.class == SiteClass::Leak && s.memory_kind == MemoryKind::Managed)
                .map(|s| s.confidence)
                .fold(0.0f64, f64::max);
            let gauge_conf = if m.grows { f_tstat(&m.trend) * f_points(m.trend.n) * f_drops } else { 0.0 };
            let source = if m.source == "sites" { String::new() } else { format!(", {}", m.source) };
            Verdict {
                class: ProcessClass::Leak,
                confidence: clamp_conf(site_conf.max(gauge_conf)),
                inconclusive: false,
                summary: format!(
                    "managed leak: the {heap} grows {} ({:.0} B/s ± {:.0} at 95 %{source}) over the \
                     steady window to {}; {}. leaktrace sees the runtime's allocator, not the code \
                     that keeps the objects: {}",
                    hr(m.trend.slope_bytes_per_s),
                    m.trend.slope_bytes_per_s,
                    m.trend.ci95_bytes_per_s.unwrap_or(0.0),
                    hb(m.end_bytes),
                    others(MemoryKind::Managed),
                    heap_tool(rt)
                ),
            }
        }
        Some(k) => {
            let mut of_kind: Vec<&SiteAnalysis> =
                sites.iter().filter(|s| s.class == SiteClass::Leak && s.memory_kind == k).collect();
            of_kind.sort_by(|a, b| b.growth_bytes_per_s.total_cmp(&a.growth_bytes_per_s));
            let Some(top) = of_kind.first() else { return v };
            let stack = Stack { id: top.id, kind: top.kind, frames: top.frames.clone(), lost: top.stack_lost };
            let name = crate::runtimes::site_label(Some(rt), k, &stack).unwrap_or_else(|| top.function.clone());
            let mut summary = format!(
                "{k} leak in {} ({}), {}: {} holds {} more live bytes ({:.0} B/s ± {:.0} at 95 %) \
                 over the steady window; {} ({} B) live at the end",
                name,
                crate::runtimes::kind_origin(rt, k),
                others(k),
                top.function,
                hr(top.growth_bytes_per_s),
                top.growth_bytes_per_s,
                top.growth_ci95_bytes_per_s.unwrap_or(0.0),
                hb(top.live_bytes),
                top.live_bytes
            );
            if of_kind.len() > 1 {
                summary.push_str(&format!("; {} leaking {k} sites in all", of_kind.len()));
            }
            // Off-heap mappings that leak keep their class (the runtime split names the kind).
            let class = if k == MemoryKind::OffHeap && v.class == ProcessClass::OffHeap {
                ProcessClass::OffHeap
            } else {
                ProcessClass::Leak
            };
            Verdict { class, confidence: top.confidence, summary, inconclusive: false }
        }
        None => {
            let all = kinds
                .iter()
                .filter(|g| g.kind != MemoryKind::Runtime || g.grows)
                .map(state)
                .collect::<Vec<_>>()
                .join(", ");
            Verdict { summary: format!("{}; by kind: {all}", v.summary), ..v }
        }
    }
}

/// Synthetic recordings with known truth, shared by the analysis and report tests.
#[cfg(test)]
pub(crate) mod fixtures {
    use std::collections::BTreeMap;

    use crate::recording::{Checkpoint, Frame, ProcMemory, Recording, SiteSample, Stack, StackKind};

    /// A named frame in `object`, optionally with file:line.
    pub fn frame(function: &str, object: &str, file: Option<(&str, u32)>) -> Frame {
        Frame {
            addr: 0x1000 + function.len() as u64 * 0x10,
            object: Some(object.to_string()),
            function: Some(function.to_string()),
            file: file.map(|f| f.0.to_string()),
            line: file.map(|f| f.1),
            inlined: false,
        }
    }

    /// Cumulative (alloc_bytes, alloc_count, free_bytes, free_count) of a site at time t.
    pub type SiteFn = Box<dyn Fn(f64) -> (u64, u64, u64, u64)>;

    /// A recording with checkpoints at `times`, the given sites and memory figures.
    pub fn recording(
        times: &[f64],
        sites: Vec<(Stack, SiteFn)>,
        memory: &dyn Fn(f64) -> Option<ProcMemory>,
        counters: &dyn Fn(f64) -> BTreeMap<String, u64>,
    ) -> Recording {
        let checkpoints = times
            .iter()
            .map(|&t| Checkpoint {
                t_s: t,
                memory: memory(t),
                sites: sites
                    .iter()
                    .map(|(st, f)| {
                        let (ab, ac, fb, fc) = f(t);
                        SiteSample {
                            stack: st.id,
                            alloc_bytes: ab,
                            alloc_count: ac,
                            free_bytes: fb,
                            free_count: fc,
                            ..Default::default()
                        }
                    })
                    .filter(|s| s.alloc_count > 0)
                    .collect(),
                counters: counters(t),
                ..Default::default()
            })
            .collect();
        // Built from JSON so that fields added to the format later (with serde defaults) need no
        // change here.
        let mut rec: Recording = serde_json::from_value(serde_json::json!({
            "format_version": crate::recording::FORMAT_VERSION,
            "leaktrace_version": "test",
            "target": {
                "pid": 4242,
                "nspid": [4242, 7],
                "command": ["./server", "--port", "8080"],
                "exe": "/opt/server/bin/server",
                "launched": true,
                "exit_status": 0,
            },
            "mode": "exact",
            "started_unix_ms": 1_700_000_000_000u64,
            "interval_s": 1.0,
            "probes": [],
            "stacks": [],
            "checkpoints": [],
            "end_reason": "duration",
        }))
        .expect("fixture recording");
        rec.probes = serde_json::from_value(serde_json::json!([
            {"object": "/lib/x86_64-linux-gnu/libc.so.6", "function": "malloc", "kind": "entry", "offset": 0xa0f0},
            {"object": "/lib/x86_64-linux-gnu/libc.so.6", "function": "free", "kind": "entry", "offset": 0xa6e0},
        ]))
        .expect("fixture probes");
        rec.stacks = sites.into_iter().map(|(s, _)| s).collect();
        rec.checkpoints = checkpoints;
        rec
    }

    const LIBC: &str = "/lib/x86_64-linux-gnu/libc.so.6";
    const STDCXX: &str = "/lib/x86_64-linux-gnu/libstdc++.so.6";
    const EXE: &str = "/opt/server/bin/server";

    /// 0, 1, ..., 60 s.
    pub fn times61() -> Vec<f64> {
        (0..=60).map(|t| t as f64).collect()
    }

    /// Leak of exactly 1000 B/s through operator new (1500 B/s allocated, 500 B/s freed).
    pub fn leak_site() -> (Stack, SiteFn) {
        let mut inl = frame("Session::key", EXE, Some(("src/session.h", 12)));
        inl.inlined = true;
        let stack = Stack {
            id: 1,
            kind: StackKind::Malloc,
            frames: vec![
                frame("malloc", LIBC, None),
                frame("operator new(unsigned long)", STDCXX, None),
                inl,
                frame("Session::remember(std::string const&)", EXE, Some(("/build/src/session.cc", 42))),
                frame("handle_request", EXE, Some(("/build/src/server.cc", 80))),
                frame("main", EXE, Some(("/build/src/main.cc", 10))),
            ],
            lost: false,
        };
        (stack, Box::new(|t: f64| {
            let t = t as u64;
            (1500 * t, 15 * t, 500 * t, 5 * t)
        }))
    }

    /// Cache: 50 000 B/s for the first 18 s (30 % of 60 s), then flat. Never freed.
    pub fn cache_site() -> (Stack, SiteFn) {
        let stack = Stack {
            id: 2,
            kind: StackKind::Malloc,
            frames: vec![
                frame("malloc", LIBC, None),
                frame("Cache::fill", EXE, Some(("/build/src/cache.cc", 10))),
                frame("main", EXE, Some(("/build/src/main.cc", 12))),
            ],
            lost: false,
        };
        (stack, Box::new(|t: f64| {
            let k = (t as u64).min(18);
            (50_000 * k, 50 * k, 0, 0)
        }))
    }

    /// Temporary: 1 MB/s allocated and freed, 0–2000 B live at any checkpoint.
    pub fn temp_site() -> (Stack, SiteFn) {
        let stack = Stack {
            id: 3,
            kind: StackKind::Malloc,
            frames: vec![
                frame("malloc", LIBC, None),
                frame("parse_line", EXE, Some(("/build/src/parse.c", 5))),
                frame("main", EXE, Some(("/build/src/main.cc", 14))),
            ],
            lost: false,
        };
        (stack, Box::new(|t: f64| {
            let t = t as u64;
            let live = (t % 3) * 1000;
            (1_000_000 * t + 1000, 1000 * t + 1, 1_000_000 * t + 1000 - live, 1000 * t + 1 - t % 3)
        }))
    }

    /// RSS following `anon(t)` with 8 MiB of file-backed pages.
    pub fn mem(anon: u64) -> Option<ProcMemory> {
        Some(ProcMemory {
            rss_bytes: anon + (8 << 20),
            rss_anon_bytes: anon,
            rss_file_bytes: 8 << 20,
            rss_shmem_bytes: 0,
            vm_size_bytes: 1 << 30,
        })
    }

    /// Deterministic pseudo-random numbers in [0, 1).
    pub fn noise(i: u64) -> f64 {
        let mut x = i.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        x ^= x >> 33;
        x = x.wrapping_mul(0xff51afd7ed558ccd);
        x ^= x >> 33;
        (x >> 11) as f64 / (1u64 << 53) as f64
    }

    pub fn no_counters(_: f64) -> BTreeMap<String, u64> {
        BTreeMap::new()
    }

    /// Leak + cache + temporary, RSS growing with the leak.
    pub fn mixed() -> Recording {
        recording(
            &times61(),
            vec![leak_site(), cache_site(), temp_site()],
            &|t| mem((20 << 20) + (1000.0 * t) as u64 + (t.min(18.0) * 50_000.0) as u64),
            &no_counters,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::fixtures::*;
    use super::*;

    fn site(a: &Analysis, id: u32) -> &SiteAnalysis {
        a.sites.iter().find(|s| s.id == id).expect("site")
    }

    #[test]
    fn leak_cache_temporary() {
        let a = analyze(&mixed(), &AnalyzeOptions::default());
        let leak = site(&a, 1);
        assert_eq!(leak.class, SiteClass::Leak, "{:?}", leak.evidence);
        assert!((leak.growth_bytes_per_s - 1000.0).abs() <= 10.0, "{}", leak.growth_bytes_per_s);
        assert_eq!(leak.function, "Session::key", "inlined frame is the innermost non-allocator frame");
        assert_eq!(leak.culprit_frame, Some(2));
        assert_eq!(leak.live_bytes, 60_000);
        assert_eq!(leak.growth_bytes, 60_000);
        assert!(leak.confidence > 0.8, "{}", leak.confidence);

        let cache = site(&a, 2);
        assert_eq!(cache.class, SiteClass::Cache, "{:?}", cache.evidence);
        assert_eq!(cache.live_bytes, 900_000);
        assert!(cache.growth_bytes_per_s.abs() < 1.0);

        let temp = site(&a, 3);
        assert_eq!(temp.class, SiteClass::Temporary, "{:?}", temp.evidence);

        assert_eq!(a.verdict.class, ProcessClass::Leak);
        assert!(a.verdict.summary.contains("Session::key"), "{}", a.verdict.summary);
        assert!(a.verdict.summary.contains("+1000 B/s"), "{}", a.verdict.summary);
        assert!(!a.verdict.summary.contains("malloc"));
        assert!(!a.verdict.summary.contains("operator new"));
        assert_eq!(a.duration_s, 60.0);
        assert_eq!(a.steady_from_s, 30.0);
        assert_eq!(a.memory.native_live_bytes.len(), 61);
        assert_eq!(a.summary.native_live_end_bytes, 60_000 + 900_000);
        assert_eq!(a.summary.rss_start_bytes, Some((20 << 20) + (8 << 20)));
        // Sorted by live bytes.
        assert_eq!(a.sites[0].id, 2);
        assert_eq!(a.top_by_growth()[0].id, 1);
    }

    #[test]
    fn culprit_skips_allocator_frames() {
        let (mut st, _) = leak_site();
        st.frames.remove(2); // drop the inlined frame
        assert_eq!(culprit(&st).1, "Session::remember(std::string const&)");
        // Only allocator frames: the innermost named one.
        st.frames.truncate(2);
        assert_eq!(culprit(&st), (Some(0), "malloc".to_string()));
        // No names: object basename + address.
        let st = Stack {
            id: 9,
            kind: StackKind::Malloc,
            frames: vec![Frame { addr: 0x4a2f, object: Some("/usr/bin/app".into()), ..Default::default() }],
            lost: false,
        };
        assert_eq!(culprit(&st).1, "app+0x4a2f");
        let st = Stack { id: 9, kind: StackKind::Malloc, frames: vec![], lost: true };
        assert_eq!(culprit(&st), (None, "[stack lost]".to_string()));
        // A mapping: libc's mmap wrapper or syscall(2) (a raw syscall(SYS_mmap, ...)) is not the
        // culprit, its caller is.
        for wrapper in ["__GI___mmap64", "mmap64", "syscall"] {
            let frames = vec![frame(wrapper, "/lib/x86_64-linux-gnu/libc.so.6", None), frame("map_buffers", "/usr/bin/app", None)];
            let st = Stack { id: 9, kind: StackKind::Mmap, frames: frames.clone(), lost: false };
            assert_eq!(culprit(&st), (Some(1), "map_buffers".to_string()), "{wrapper}");
            // In a malloc site they are functions like others.
            let st = Stack { id: 9, kind: StackKind::Malloc, frames, lost: false };
            assert_eq!(culprit(&st), (Some(0), wrapper.to_string()));
        }
    }

    #[test]
    fn leak_rate_within_one_percent_with_noise() {
        // 1000 B/s leak in 100-byte blocks at irregular checkpoint times with jitter.
        let times: Vec<f64> = (0..=120).map(|i| i as f64 * 0.5 + noise(i) * 0.05).collect();
        let (st, _) = leak_site();
        let f: SiteFn = Box::new(|t: f64| {
            let n = (t * 10.0) as u64; // 10 allocations of 100 B per second
            (100 * n, n, 0, 0)
        });
        let r = recording(&times, vec![(st, f)], &|_| None, &no_counters);
        let a = analyze(&r, &AnalyzeOptions::default());
        let s = &a.sites[0];
        assert_eq!(s.class, SiteClass::Leak);
        assert!((s.growth_bytes_per_s - 1000.0).abs() < 10.0, "{}", s.growth_bytes_per_s);
        assert!(s.growth_ci95_bytes_per_s.unwrap() < 50.0);
        assert_eq!(a.verdict.class, ProcessClass::Leak);
        assert!(a.warnings.iter().any(|w| w.contains("no memory figures")));
    }

    #[test]
    fn irregular_leak_is_a_leak() {
        // Each second leaks between 0 and 2000 bytes (mean 1000) in 100-byte blocks.
        let (st, _) = leak_site();
        let f: SiteFn = Box::new(|t: f64| {
            let blocks: u64 = (1..=t as u64).map(|i| (noise(i + 500) * 21.0) as u64).sum();
            (100 * blocks + 4000, blocks + 40, 4000, 40)
        });
        let r = recording(&times61(), vec![(st, f)], &|_| None, &no_counters);
        let a = analyze(&r, &AnalyzeOptions::default());
        let s = &a.sites[0];
        assert_eq!(s.class, SiteClass::Leak, "{:?}", s.evidence);
        assert!((s.growth_bytes_per_s - 1000.0).abs() < 200.0, "{}", s.growth_bytes_per_s);
        assert_eq!(a.verdict.class, ProcessClass::Leak);
    }

    #[test]
    fn short_steady_growth_is_a_leak_not_a_cache() {
        // Five checkpoints of a short run (as with the default 1 s interval): the leak keeps its
        // pace, the steady window has three points with a slight slowdown at the end. Not a cache.
        let times = [0.0, 1.83, 2.85, 3.87, 4.37];
        let (stack, _) = leak_site();
        let live = |t: f64| -> u64 { if t < 4.0 { (t * 500_000.0) as u64 } else { 2_000_000 } };
        let f: SiteFn = Box::new(move |t| (live(t) + 1000, (live(t) / 1000) + 1, 0, 0));
        let r = recording(&times, vec![(stack, f)], &|_| mem(10 << 20), &no_counters);
        let a = analyze(&r, &AnalyzeOptions::default());
        assert_eq!(a.sites[0].class, SiteClass::Leak, "{:?}", a.sites[0].evidence);
        assert_eq!(a.verdict.class, ProcessClass::Leak, "{}", a.verdict.summary);
        assert!(a.verdict.confidence < 0.6, "little evidence, modest confidence: {}", a.verdict.confidence);
    }

    #[test]
    fn growth_seen_at_too_few_checkpoints_is_a_low_confidence_leak_not_flat() {
        // A child traced late: three checkpoints, 400 KB more at the last one (the steady window,
        // the last half, has two points). No fit can be significant, but "no growth" would be
        // wrong.
        let times = [0.0, 1.0, 2.0];
        let (stack, _) = leak_site();
        let f: SiteFn = Box::new(|t| if t < 1.5 { (400_000, 400, 0, 0) } else { (800_000, 800, 0, 0) });
        let r = recording(&times, vec![(stack, f)], &|_| mem(10 << 20), &no_counters);
        let a = analyze(&r, &AnalyzeOptions::default());
        let s = &a.sites[0];
        assert_eq!(s.class, SiteClass::Leak, "{}", s.evidence.reason);
        assert!(s.evidence.reason.contains("too few"), "{}", s.evidence.reason);
        assert!(s.confidence < 0.3, "{}", s.confidence);
        assert_eq!(a.verdict.class, ProcessClass::Leak, "{}", a.verdict.summary);
        assert!(a.verdict.confidence < 0.3, "{} {}", a.verdict.confidence, a.verdict.summary);

        // The same three checkpoints with nothing growing, or growth that went back down, or
        // bytes that grew while live blocks fell (fewer, larger blocks): not a leak.
        for f in [
            Box::new(|_t: f64| (400_000u64, 400u64, 0u64, 0u64)) as SiteFn,
            Box::new(|t: f64| match t as u64 {
                0 => (400_000, 400, 0, 0),
                1 => (800_000, 800, 0, 0),
                _ => (802_000, 802, 400_000, 400),
            }),
            Box::new(|t: f64| if t < 1.5 { (400_000, 400, 0, 0) } else { (1_000_000, 500, 200_000, 400) }),
        ] {
            let (stack, _) = leak_site();
            let r = recording(&times, vec![(stack, f)], &|_| mem(10 << 20), &no_counters);
            let a = analyze(&r, &AnalyzeOptions::default());
            assert_ne!(a.sites[0].class, SiteClass::Leak, "{}", a.sites[0].evidence.reason);
        }
    }

    #[test]
    fn allocations_lost_make_a_flat_verdict_inconclusive() {
        let r = recording(&times61(), vec![cache_site()], &|_| mem(10 << 20), &|_| {
            BTreeMap::from([("allocs".to_string(), 100), ("allocs_map_full".to_string(), 900)])
        });
        let a = analyze(&r, &AnalyzeOptions::default());
        assert_eq!(a.verdict.class, ProcessClass::Flat);
        assert!(a.verdict.summary.starts_with("inconclusive: 90 %"), "{}", a.verdict.summary);
        assert!(a.verdict.summary.contains("allocs_map_full 900"), "{}", a.verdict.summary);
    }

    #[test]
    fn cache_only_is_not_a_leak() {
        let r = recording(&times61(), vec![cache_site()], &|t| mem((10 << 20) + (t.min(18.0) * 50_000.0) as u64), &no_counters);
        let a = analyze(&r, &AnalyzeOptions::default());
        assert_eq!(a.sites[0].class, SiteClass::Cache);
        assert_eq!(a.verdict.class, ProcessClass::Cache, "{}", a.verdict.summary);
        assert!(a.verdict.summary.contains("Cache::fill"));
    }

    #[test]
    fn late_plateau_is_a_cache() {
        // Grows for the first 65 % of the run, then flat: the steady-window trend is not
        // significant once the autocorrelation of the residuals is accounted for.
        let (st, _) = cache_site();
        let f: SiteFn = Box::new(|t: f64| {
            let k = (t as u64).min(39);
            (50_000 * k, 50 * k, 0, 0)
        });
        let r = recording(&times61(), vec![(st, f)], &|_| None, &no_counters);
        let a = analyze(&r, &AnalyzeOptions::default());
        assert_eq!(a.sites[0].class, SiteClass::Cache, "{:?}", a.sites[0].evidence);
        assert_ne!(a.verdict.class, ProcessClass::Leak);
        // Grows for the first 75 % while the process keeps working: the steady window sees
        // significant growth, the last quarter sees none: a plateau.
        let grow45 = || -> SiteFn {
            Box::new(|t: f64| {
                let k = (t as u64).min(45);
                (50_000 * k, 50 * k, 0, 0)
            })
        };
        let (st, _) = cache_site();
        let r = recording(&times61(), vec![(st.clone(), grow45()), temp_site()], &|_| None, &no_counters);
        let a = analyze(&r, &AnalyzeOptions::default());
        let c = site(&a, 2);
        assert!(c.evidence.steady.significant_growth);
        assert!(c.evidence.plateau);
        assert_eq!(c.class, SiteClass::Cache, "{:?}", c.evidence);
        assert_eq!(a.verdict.class, ProcessClass::Cache);
        // The same growth, but the whole process goes idle when it stops: growth per unit of
        // work never levelled off, so it stays a leak, with a lower confidence and a caveat.
        let r = recording(&times61(), vec![(st, grow45())], &|_| None, &no_counters);
        let a = analyze(&r, &AnalyzeOptions::default());
        let c = site(&a, 2);
        assert_eq!(c.class, SiteClass::Leak, "{:?}", c.evidence);
        assert!(c.confidence < 0.6, "{}", c.confidence);
        assert!(c.evidence.reason.contains("no allocation or free in the last quarter"));
    }

    #[test]
    fn rss_growth_with_flat_live_is_fragmentation() {
        let (st, _) = cache_site();
        let f: SiteFn = Box::new(|_| (1 << 20, 10, 0, 0));
        let r = recording(
            &times61(),
            vec![(st, f)],
            &|t| mem((50 << 20) + (100_000.0 * t) as u64 + (noise(t as u64) * 8192.0) as u64),
            &no_counters,
        );
        let a = analyze(&r, &AnalyzeOptions::default());
        assert_eq!(a.sites[0].class, SiteClass::Flat, "{:?}", a.sites[0].evidence);
        assert_eq!(a.verdict.class, ProcessClass::Fragmentation, "{}", a.verdict.summary);
        assert!(a.verdict.confidence <= 0.8);
    }

    #[test]
    fn allocator_footprint_growth_with_flat_live_is_fragmentation() {
        // Churn with flat live bytes; the allocator's resident heap grows 50 KB/s, RSS does not.
        let mut r = recording(&times61(), vec![temp_site()], &|_| mem(40 << 20), &no_counters);
        for c in &mut r.checkpoints {
            c.allocator = Some(crate::recording::AllocatorFootprint {
                heap_bytes: 1 << 30,
                heap_resident_bytes: (1 << 20) + (50_000.0 * c.t_s) as u64,
                ..Default::default()
            });
        }
        let a = analyze(&r, &AnalyzeOptions::default());
        assert_eq!(a.verdict.class, ProcessClass::Fragmentation, "{}", a.verdict.summary);
        assert!(a.verdict.summary.contains("allocator's resident memory"));
        assert!(a.verdict.confidence > 0.8, "{}", a.verdict.confidence);
        assert_eq!(a.memory.allocator_resident_bytes.len(), 61);
        assert_eq!(a.summary.allocator_resident_end_bytes, Some((1 << 20) + 3_000_000));

        // RSS grows but the allocator's footprint is flat: memory from elsewhere.
        let mut r = recording(&times61(), vec![temp_site()], &|t| mem((40 << 20) + (100_000.0 * t) as u64), &no_counters);
        for c in &mut r.checkpoints {
            c.allocator = Some(crate::recording::AllocatorFootprint {
                heap_resident_bytes: 1 << 20,
                ..Default::default()
            });
        }
        let a = analyze(&r, &AnalyzeOptions::default());
        assert_eq!(a.verdict.class, ProcessClass::Fragmentation, "{}", a.verdict.summary);
        assert!(a.verdict.summary.contains("footprint does not grow"), "{}", a.verdict.summary);
        assert!(a.verdict.confidence <= 0.8);
    }

    #[test]
    fn noise_around_flat_line_is_flat() {
        let (st, _) = cache_site();
        let f: SiteFn = Box::new(|t: f64| {
            let i = t as u64;
            let nz = (noise(i + 1000) * 20_000.0) as u64;
            (1_000_000 + 20_000 * i + nz, 100 + 2 * i + nz / 10_000, 20_000 * i, 2 * i)
        });
        let r = recording(
            &times61(),
            vec![(st, f)],
            &|t| mem((30 << 20) + (noise(t as u64 + 7) * 16384.0) as u64),
            &no_counters,
        );
        let a = analyze(&r, &AnalyzeOptions::default());
        assert_eq!(a.sites[0].class, SiteClass::Flat, "{:?}", a.sites[0].evidence);
        assert_eq!(a.verdict.class, ProcessClass::Flat, "{}", a.verdict.summary);
    }

    #[test]
    fn step_noise_without_trend_is_never_a_leak() {
        // A live level that goes up and down by whole blocks: did not fall by the end, but does
        // not grow either.
        for seed in 0..20u64 {
            let (st, _) = cache_site();
            let f: SiteFn = Box::new(move |t: f64| {
                let i = t as u64;
                let live_blocks = 50 + (noise(seed * 1000 + i) * 10.0) as u64;
                let allocs = 100 * i + 60;
                (allocs * 4096, allocs, (allocs - live_blocks) * 4096, allocs - live_blocks)
            });
            let r = recording(&times61(), vec![(st, f)], &|_| None, &no_counters);
            let a = analyze(&r, &AnalyzeOptions::default());
            assert_ne!(a.sites[0].class, SiteClass::Leak, "seed {seed}: {:?}", a.sites[0].evidence);
            assert_ne!(a.verdict.class, ProcessClass::Leak);
        }
    }

    #[test]
    fn drops_and_events() {
        let r = recording(&times61(), vec![leak_site()], &|_| None, &|t| {
            let mut m = BTreeMap::new();
            m.insert("allocs".to_string(), (15.0 * t) as u64);
            m.insert("frees".to_string(), (5.0 * t) as u64);
            m.insert("allocs_map_full".to_string(), if t >= 30.0 { 5 } else { 0 });
            m.insert("stacks_map_full".to_string(), 2);
            m.insert("untracked_free".to_string(), 3);
            m.insert("some_future_counter".to_string(), 1);
            m
        });
        let a = analyze(&r, &AnalyzeOptions::default());
        assert_eq!(a.drops_total, 7);
        assert_eq!(a.drops["allocs_map_full"], 5);
        assert_eq!(a.drops["missed_return"], 0);
        assert_eq!(a.drops.len(), 8);
        assert_eq!(a.events["untracked_free"], 3);
        assert_eq!(a.events["allocs"], 900);
        assert_eq!(a.events["some_future_counter"], 1);
        assert!(a.warnings.iter().any(|w| w.contains("lost")));
        // Losses lower the confidence of the leak.
        let clean = analyze(&recording(&times61(), vec![leak_site()], &|_| None, &no_counters), &AnalyzeOptions::default());
        assert!(a.sites[0].confidence < clean.sites[0].confidence);
    }

    #[test]
    fn odd_inputs_do_not_panic() {
        let empty = recording(&[0.0], vec![], &|_| None, &no_counters);
        let a = analyze(&empty, &AnalyzeOptions::default());
        assert_eq!(a.verdict.class, ProcessClass::Flat);
        assert!(a.verdict.confidence < 0.5);
        assert_eq!(a.duration_s, 0.0);

        let none = recording(&[], vec![leak_site()], &|_| None, &no_counters);
        let a = analyze(&none, &AnalyzeOptions::default());
        assert_eq!(a.checkpoints, 0);
        assert_eq!(a.sites.len(), 1);

        // Two checkpoints at the same time, one with a NaN time, a sample for an unknown stack.
        let mut r = recording(&[5.0, 5.0, 6.0], vec![leak_site(), temp_site()], &|t| mem(t as u64), &no_counters);
        r.checkpoints[2].t_s = f64::NAN;
        r.checkpoints[1].sites.push(crate::recording::SiteSample { stack: 77, alloc_bytes: 10, alloc_count: 1, ..Default::default() });
        r.checkpoints[0].memory = None;
        let a = analyze(&r, &AnalyzeOptions::default());
        assert_eq!(a.checkpoints, 2);
        assert!(a.sites.iter().any(|s| s.id == 77 && s.function == "[unknown]"));
        assert!(a.sites.iter().all(|s| s.growth_bytes_per_s.is_finite()));

        // Zero duration with many checkpoints.
        let r = recording(&[1.0; 10], vec![leak_site()], &|_| None, &no_counters);
        let a = analyze(&r, &AnalyzeOptions::default());
        assert_eq!(a.sites[0].growth_bytes_per_s, 0.0);
        assert_ne!(a.verdict.class, ProcessClass::Leak);
    }

    #[test]
    fn runtime_split_names_the_growing_kind() {
        const LIBPY: &str = "/usr/lib/libpython3.11.so.1.0";
        let ext = Stack {
            id: 1,
            kind: StackKind::Malloc,
            frames: vec![frame("malloc", "/lib/x86_64-linux-gnu/libc.so.6", None), frame("parse_record", "/tmp/libcleak.so", None)],
            lost: false,
        };
        let objs = Stack {
            id: 2,
            kind: StackKind::Malloc,
            frames: vec![frame("malloc", "/lib/x86_64-linux-gnu/libc.so.6", None), frame("_PyObject_Malloc", LIBPY, None)],
            lost: false,
        };
        let leak: SiteFn = Box::new(|t: f64| (1000 * (t as u64 + 1), t as u64 + 1, 0, 0));
        let steady: SiteFn = Box::new(|t: f64| (50_000 + 100_000 * t as u64, 50 + 100 * t as u64, 100_000 * t as u64, 100 * t as u64));
        let mut r = recording(&times61(), vec![(ext, leak), (objs, steady)], &|t| mem((10 << 20) + (1000.0 * t) as u64), &no_counters);
        r.target.runtime = Some(Runtime::Python);
        let a = analyze(&r, &AnalyzeOptions::default());
        assert_eq!(site(&a, 1).memory_kind, MemoryKind::Native);
        assert_eq!(site(&a, 2).memory_kind, MemoryKind::Managed);
        assert_eq!(a.verdict.class, ProcessClass::Leak);
        assert!(a.verdict.summary.starts_with("native leak in parse_record (C extension), Python heap flat"), "{}", a.verdict.summary);
        assert_eq!(a.memory.managed_bytes.last().map(|p| p.1), Some(50_000));
        assert_eq!(a.memory.native_live_bytes.last().map(|p| p.1), Some(61_000));
        let managed = a.kinds.iter().find(|k| k.kind == MemoryKind::Managed).unwrap();
        assert!(!managed.grows);
        assert!(a.kinds.iter().find(|k| k.kind == MemoryKind::Native).unwrap().grows);

        // The same recording without a runtime: no managed series, verdict as before.
        r.target.runtime = None;
        let a = analyze(&r, &AnalyzeOptions::default());
        assert!(a.memory.managed_bytes.is_empty());
        assert!(a.verdict.summary.starts_with("leak: "), "{}", a.verdict.summary);
        assert_eq!(a.summary.native_live_end_bytes, 61_000 + 50_000);
    }

    /// Units of work at time t: an accelerating load (5 t² calls), so the rate per second
    /// varies while the growth per call does not.
    fn units_at(t: f64) -> u64 {
        (5.0 * t * t) as u64
    }

    /// A recording whose leak is exactly 20 B per unit of work, with `handle_request` as the
    /// work probe.
    fn per_unit_recording() -> Recording {
        let (st, _) = leak_site();
        let f: SiteFn = Box::new(|t: f64| {
            let u = units_at(t);
            (20 * u, u, 0, 0)
        });
        let mut r = recording(&times61(), vec![(st, f), cache_site()], &|t| mem((20 << 20) + 25 * units_at(t)), &no_counters);
        r.work_probe = Some("handle_request@/opt/server/bin/server".into());
        for c in &mut r.checkpoints {
            c.units_of_work = Some(units_at(c.t_s));
        }
        r
    }

    #[test]
    fn growth_per_unit_of_work() {
        let a = analyze(&per_unit_recording(), &AnalyzeOptions::default());
        let leak = site(&a, 1);
        assert_eq!(leak.class, SiteClass::Leak, "{:?}", leak.evidence);
        let per_unit = leak.growth_bytes_per_unit.expect("per unit");
        assert!((per_unit - 20.0).abs() < 0.01, "{per_unit}");
        assert!(leak.growth_ci95_bytes_per_unit.unwrap() < 0.1);
        // Per second, the same leak grows with the load: 20 × 10 t B/s, about 9 KB/s at 45 s.
        assert!(leak.growth_bytes_per_s > 5000.0, "{}", leak.growth_bytes_per_s);
        assert_eq!(site(&a, 2).growth_bytes_per_unit.map(|u| u.abs() < 0.01), Some(true));
        assert_eq!(a.units_of_work, Some(18_000));
        assert_eq!(a.unit_name().as_deref(), Some("call of handle_request"));
        let s = &a.summary;
        assert!((s.growth_bytes_per_unit.unwrap() - 20.0).abs() < 0.01);
        assert!((s.native_growth_bytes_per_unit.unwrap() - 20.0).abs() < 0.01);
        assert!((s.rss_anon_growth_bytes_per_unit.unwrap() - 25.0).abs() < 0.1);
        assert_eq!(s.offheap_growth_bytes_per_unit, Some(0.0));
        assert_eq!(a.verdict.class, ProcessClass::Leak);
        assert!(
            a.verdict.summary.starts_with("leak: Session::key holds 20 B more live bytes per call of handle_request (± 0 at 95 %), +"),
            "{}",
            a.verdict.summary
        );
        // Occupied heap: 360 000 + 900 000 live bytes in 20 MiB + 450 000 B of RSS anon.
        let ratio = s.occupied_heap_to_rss_ratio.unwrap();
        assert!((ratio - 1_260_000.0 / (20_971_520.0 + 450_000.0)).abs() < 1e-4, "{ratio}");

        // Without a work probe: per second only.
        let mut r = per_unit_recording();
        r.work_probe = None;
        for c in &mut r.checkpoints {
            c.units_of_work = None;
        }
        let a = analyze(&r, &AnalyzeOptions::default());
        assert!(a.sites.iter().all(|s| s.growth_bytes_per_unit.is_none()));
        assert_eq!(a.summary.growth_bytes_per_unit, None);
        assert_eq!(a.units_of_work, None);
        assert!(a.verdict.summary.starts_with("leak: Session::key holds +"), "{}", a.verdict.summary);

        // A work probe that counted nothing in the steady window: per second, with a warning.
        let mut r = per_unit_recording();
        for c in &mut r.checkpoints {
            c.units_of_work = Some(7);
        }
        let a = analyze(&r, &AnalyzeOptions::default());
        assert!(a.sites.iter().all(|s| s.growth_bytes_per_unit.is_none()));
        assert!(a.warnings.iter().any(|w| w.contains("counted no call")), "{:?}", a.warnings);
    }

    /// An off-heap mapping site: `function` maps `bytes_per_s` (in 16 KiB regions) and never
    /// unmaps, through `wrapper` (libc's mmap64 or syscall).
    fn mapping_site(id: u32, function: &str, wrapper: &str, bytes_per_s: u64) -> (Stack, SiteFn) {
        const LIBC: &str = "/lib/x86_64-linux-gnu/libc.so.6";
        const EXE: &str = "/opt/server/bin/server";
        let stack = Stack {
            id,
            kind: StackKind::Mmap,
            frames: vec![frame(wrapper, LIBC, None), frame(function, EXE, Some(("/build/src/buf.c", 7))), frame("main", EXE, None)],
            lost: false,
        };
        (stack, Box::new(move |t: f64| {
            let n = (t as u64) * bytes_per_s / 16384;
            (n * 16384, n, 0, 0)
        }))
    }

    /// The dynamic loader's mapping of a library's .bss at start: 1 MiB, never unmapped.
    fn loader_site() -> (Stack, SiteFn) {
        const LD: &str = "/lib64/ld-linux-x86-64.so.2";
        let stack = Stack {
            id: 9,
            kind: StackKind::Mmap,
            frames: vec![frame("__mmap64", LD, None), frame("_dl_map_segments", LD, None), frame("_dl_map_object", LD, None)],
            lost: false,
        };
        (stack, Box::new(|_| (1 << 20, 1, 0, 0)))
    }

    #[test]
    fn growing_mappings_are_off_heap() {
        let mut r = recording(
            &times61(),
            vec![mapping_site(5, "map_buffers", "mmap64", 32768), mapping_site(6, "map_raw", "syscall", 16384), loader_site(), temp_site()],
            &|t| mem((20 << 20) + 49152 * t as u64),
            &no_counters,
        );
        // Resident: half of map_buffers' pages, all of map_raw's.
        for c in &mut r.checkpoints {
            for s in &mut c.sites {
                s.resident_bytes = Some(if s.stack == 5 { s.alloc_bytes / 2 } else { s.alloc_bytes });
            }
        }
        let a = analyze(&r, &AnalyzeOptions::default());
        let m = site(&a, 5);
        assert_eq!(m.function, "map_buffers", "the culprit is the caller of libc's mmap");
        assert_eq!(m.culprit_frame, Some(1));
        assert_eq!(m.class, SiteClass::Leak, "{:?}", m.evidence);
        assert!((m.growth_bytes_per_s - 32768.0).abs() < 400.0, "{}", m.growth_bytes_per_s);
        assert_eq!(m.resident_bytes, Some(60 * 32768 / 2));
        let raw = site(&a, 6);
        assert_eq!(raw.function, "map_raw", "the caller of syscall(SYS_mmap, ...)");
        assert_eq!(raw.class, SiteClass::Leak);
        let ld = site(&a, 9);
        assert_eq!(ld.memory_kind, MemoryKind::Runtime);
        assert_ne!(ld.class, SiteClass::Leak);
        assert!(site(&a, 3).resident_bytes.is_none(), "malloc sites have no resident figure");
        // Off-heap bytes are the program's mappings, resident: not the loader's.
        assert_eq!(a.memory.offheap_live_bytes.last().map(|p| p.1), Some(60 * 32768 / 2 + 60 * 16384));
        assert_eq!(a.memory.mmap_live_bytes.last().map(|p| p.1), Some(60 * 49152 + (1 << 20)));

        assert_eq!(a.verdict.class, ProcessClass::OffHeap, "{}", a.verdict.summary);
        assert_eq!(serde_json::to_value(a.verdict.class).unwrap(), "off-heap");
        assert!(
            a.verdict.summary.starts_with("off-heap: map_buffers maps +32.0 KiB/s (32768 B/s ± "),
            "{}",
            a.verdict.summary
        );
        assert!(a.verdict.summary.contains("in anonymous mappings it never unmaps"), "{}", a.verdict.summary);
        assert!(a.verdict.summary.contains("1.9 MiB (1966080 B) mapped, 960.0 KiB resident at the end"), "{}", a.verdict.summary);
        assert!(a.verdict.summary.contains("2 leaking mapping sites in all, +48.0 KiB/s in total"), "{}", a.verdict.summary);
        assert!(!a.verdict.summary.contains("also"), "{}", a.verdict.summary);

        // A native leak next to it: the faster one gives the class, the other is named too.
        let r = recording(&times61(), vec![mapping_site(5, "map_buffers", "mmap64", 16384), leak_site()], &|_| None, &no_counters);
        let a = analyze(&r, &AnalyzeOptions::default());
        assert_eq!(a.verdict.class, ProcessClass::OffHeap);
        assert!(a.verdict.summary.contains("; also a leak in the malloc heap: Session::key holds +1000 B/s"), "{}", a.verdict.summary);
        // The native leak the larger: 100 B blocks at 50 000 B/s.
        let big: SiteFn = Box::new(|t: f64| {
            let n = 500 * t as u64;
            (100 * n, n, 0, 0)
        });
        let (st, _) = leak_site();
        let r = recording(&times61(), vec![mapping_site(5, "map_buffers", "mmap64", 16384), (st, big)], &|_| None, &no_counters);
        let a = analyze(&r, &AnalyzeOptions::default());
        assert_eq!(a.verdict.class, ProcessClass::Leak);
        assert!(a.verdict.summary.starts_with("leak: Session::key holds"), "{}", a.verdict.summary);
        assert!(a.verdict.summary.contains("; also an off-heap leak: map_buffers maps +16.0 KiB/s"), "{}", a.verdict.summary);
    }

    #[test]
    fn fit_matches_known_line() {
        let pts: Vec<(f64, f64)> = (0..10).map(|i| (i as f64, 3.0 * i as f64 + 7.0)).collect();
        let t = fit(&pts);
        assert!((t.slope_bytes_per_s - 3.0).abs() < 1e-9);
        assert_eq!(t.ci95_bytes_per_s, Some(0.0));
        assert!(t.significant_growth);
        let flat: Vec<(f64, f64)> = (0..10).map(|i| (i as f64, 5.0)).collect();
        let t = fit(&flat);
        assert_eq!(t.slope_bytes_per_s, 0.0);
        assert!(!t.significant_growth);
        assert_eq!(fit(&[(1.0, 2.0)]).slope_bytes_per_s, 0.0);
        assert_eq!(fit(&[(1.0, 2.0), (2.0, 4.0)]).stderr_bytes_per_s, None);
        assert_eq!(t_crit95(1), 12.706);
        assert!((t_crit95(60) - 2.0).abs() < 0.01);
    }
}
