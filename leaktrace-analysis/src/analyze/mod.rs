//! Analysis of a recording: how the live (outstanding) bytes of every allocation site and of the
//! whole process moved over time, and whether that movement is a leak.
//!
//! Everything here is a pure function of a [`Recording`](crate::recording::Recording): no root, no target. The method (window
//! choice, least-squares trend, noise floor, classification rules and confidence) is written down
//! in `docs/analysis.md`; the constants of `thresholds.rs` are the numbers it quotes.
//!
//! Vocabulary: a *site* is one call stack ([`Stack`](crate::recording::Stack)) that allocates; its *live bytes* are the
//! bytes allocated from it and not yet freed (only allocations made after the probes were
//! attached are seen, so every site starts near zero at the first checkpoint). *Retention* is
//! live bytes that stay live.
//!
//! Files: this one holds the model ([`Analysis`] and what it contains); `thresholds.rs` the
//! thresholds; `replay.rs` the analysis proper ([`analyze`]: checkpoints into series, the steady window,
//! process figures); `stats.rs` trends and confidence; `site.rs` one site's class; `verdict.rs`
//! the process verdict; `frames.rs` culprits and frame labels; `fixtures.rs` and `tests/` the
//! unit tests' synthetic recordings and the tests (one file per topic).

use std::collections::BTreeMap;

use serde::Serialize;

use crate::recording::{Frame, Runtime, StackKind};
use crate::runtimes::MemoryKind;

pub use thresholds::*;

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

/// The threads behind a site of thread stacks ([`SiteAnalysis::threads`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct ThreadStacks {
    /// Stacks (or per-thread blocks) of threads made by this call path still live at the end:
    /// threads alive, not joined, or their stacks kept by libc for the next thread.
    pub threads: u64,
    /// How many more than at the start of the steady window.
    pub new_threads: i64,
    /// The count keeps growing: at least [`MIN_EVIDENT_BLOCKS`] more over the steady window and
    /// more at the end than at the start of the last quarter (when it has one). Only then can the
    /// site be a leak: threads created and never joined.
    pub growing: bool,
}

impl SiteAnalysis {
    /// The bytes a site is ranked by: [`SiteAnalysis::held_bytes`] (a mapping's resident bytes
    /// where the recording has them, so thread stacks, 8 MiB reservations mostly never touched,
    /// count what they hold; every other site's live bytes).
    pub fn rank_bytes(&self) -> u64 {
        self.held_bytes().0
    }
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
    /// Separate rises of live blocks (runs of checkpoint intervals in which they rose, flat in
    /// between) after the first interval of the span, counted only for a site that never freed a
    /// block and whose live blocks never fell; 0 otherwise. Two or more, the last in the steady
    /// window, make a leak in bursts. For a leak judged by its envelope (live bytes rising in
    /// stairs that only go up), the stairs' steps.
    pub steps: usize,
    /// A cache seen as one abrupt step (one rise within at most two intervals) of never-freed
    /// blocks: not a plateau; its confidence is at most [`SINGLE_STEP_CONFIDENCE`] and the
    /// process verdict it names is inconclusive ("record at least two periods").
    pub single_step: bool,
    /// Growth through the run (the first part grew significantly, the steady window kept at
    /// least half its pace, above the noise floor) whose steady-window slope is not significant:
    /// its 95 % interval is as wide as the slope. The site is not a leak (no leak verdict rests
    /// on such a slope); the process verdict is inconclusive when nothing else decides it
    /// ([`Reason::NotSignificant`]).
    pub not_significant: bool,
    /// Mean age of the site's live blocks at the steady window's last checkpoint, seconds (from
    /// the kernel's birth time of each block); None without birth times (mappings, older
    /// recordings).
    pub mean_age_s: Option<f64>,
    /// One sentence: why this class.
    pub reason: String,
}

/// One allocation site (one call stack) over the recording.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SiteAnalysis {
    /// [`Stack::id`](crate::recording::Stack::id).
    pub id: u32,
    /// "malloc", "mmap" or "fault" ([`Stack::kind`](crate::recording::Stack::kind)).
    pub kind: StackKind,
    /// What kind of memory the site holds under the target's runtime
    /// ([`crate::runtimes::classify_site`]): managed, native, off-heap or runtime.
    pub memory_kind: MemoryKind,
    /// Where that kind of memory comes from at this site, in words
    /// ([`crate::runtimes::site_origin`]: "C extension", "libc.so.6 via ctypes", "JNI code");
    /// None for a target without a managed runtime.
    pub origin: Option<String>,
    /// Culprit: the innermost frame that is not an allocator frame
    /// ([`is_allocator_frame`](crate::allocator_frames::is_allocator_frame)); else the innermost named frame; else `object+0xaddr`.
    pub function: String,
    /// Index into [`SiteAnalysis::frames`] of the culprit frame (None when there are no frames).
    pub culprit_frame: Option<usize>,
    /// The call stack, innermost first (copied from the recording).
    pub frames: Vec<std::sync::Arc<Frame>>,
    /// The kernel could not give this site's stack: the bytes are real, their stack unknown.
    pub stack_lost: bool,
    /// Why the stack walk stopped before the outermost frame, when it did (the recording's
    /// `Stack::truncated`): its outer callers are unknown.
    pub stack_truncated: Option<String>,
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
    /// "mmap" sites: the mapping is MAP_SHARED (a memfd, shm_open, shared anonymous memory):
    /// shared memory (RssShmem), not anonymous memory ([`crate::recording::Stack::shared`]).
    pub shared_mapping: bool,
    /// Threads' memory: the site maps thread stacks (or allocates per-thread memory, the TLS
    /// vector) under `pthread_create` ([`crate::runtimes::is_thread_stack`]). A thread stack's
    /// growth figures (`growth_bytes`, `growth_bytes_per_s`, the trends) are of its resident
    /// bytes, not of the mostly untouched stacks it maps. None for other sites.
    pub threads: Option<ThreadStacks>,
    /// The release call this stack likely misses: it passes through an API of the leak-pattern
    /// catalog whose result must be released ([`patterns::release_hint`]). Named in the verdict
    /// when the site leaks.
    pub likely_missing_release: Option<patterns::ReleaseHint>,
    /// Growth mode: this fault site first touched its pages inside the allocator or
    /// an API that hands out malloc'd memory — the named function (`_int_realloc`,
    /// `__getdelim`) — so its pages are "first touched under" [`SiteAnalysis::function`], not
    /// memory that function holds (see `analyze/first_touch.rs`). None for other sites. (No
    /// fault site gets a missing-release hint: a fault names who first wrote a page.)
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_touch_in: Option<String>,
    /// The catalog's look-alike this stack belongs to (an allocator arena, a pymalloc arena, a JIT
    /// code cache, ...: memory retained by design), if any ([`patterns::lookalike`]).
    pub lookalike: Option<patterns::Lookalike>,
    /// Classification.
    pub class: SiteClass,
    /// How clear the numbers behind `class` are, 0..1.
    pub confidence: f64,
    /// The numbers behind `class`.
    pub evidence: SiteEvidence,
}

impl SiteAnalysis {
    /// What the site holds at the end, for ranking sites by size: (bytes, comparable). A malloc
    /// or fault site's live bytes; a mapping's resident bytes where the recording has them
    /// ([`SiteAnalysis::resident_bytes`], pagemap: pages in RAM, comparable with live bytes);
    /// else a mapping's mapped bytes, `comparable` false (virtual: an arena reservation maps
    /// far more than it ever touches, and must not outrank memory actually held).
    pub fn held_bytes(&self) -> (u64, bool) {
        match (self.kind, self.resident_bytes) {
            (StackKind::Mmap, Some(r)) => (r, true),
            (StackKind::Mmap, None) => (self.live_bytes, false),
            _ => (self.live_bytes, true),
        }
    }

    /// What a growth-mode site whose pages came through the allocator measured ([`Self::first_touch_in`]),
    /// for notes: "pages mapped by the allocator (jemalloc) under F" for a mapping the allocator
    /// made (its own extents), "pages first touched under F inside the allocator (_int_realloc)"
    /// for a fault site. None for other sites.
    pub fn through_allocator(&self) -> Option<String> {
        let alloc = self.first_touch_in.as_deref()?;
        Some(if self.kind == StackKind::Mmap {
            format!("pages mapped by the allocator ({alloc}) under {}", self.function)
        } else {
            format!("pages first touched under {} inside the allocator ({alloc})", self.function)
        })
    }

    /// The kind of mapping an "mmap" site makes, for sentences: "shared mappings (MAP_SHARED:
    /// shared memory, RssShmem)" or "anonymous mappings".
    pub fn mapping_kind(&self) -> &'static str {
        if self.shared_mapping { "shared mappings (MAP_SHARED: shared memory, RssShmem)" } else { "anonymous mappings" }
    }
}

/// The order of [`Analysis::sites`]: sites whose [`SiteAnalysis::held_bytes`] are comparable
/// first, most held first; then larger growth, then smaller id.
pub(crate) fn by_held_bytes(a: &SiteAnalysis, b: &SiteAnalysis) -> std::cmp::Ordering {
    let ((ha, ca), (hb, cb)) = (a.held_bytes(), b.held_bytes());
    cb.cmp(&ca).then(hb.cmp(&ha)).then(b.growth_bytes.cmp(&a.growth_bytes)).then(a.id.cmp(&b.id))
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
    /// RssShmem at each checkpoint that has memory figures: shared memory (memfd, shm_open,
    /// MAP_SHARED|MAP_ANONYMOUS, SysV shm) resident in the process.
    pub rss_shmem_bytes: Vec<(f64, u64)>,
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
    /// The allocator's own figure of what it holds from the system: glibc's Σ `system_mem` of
    /// its arenas (`AllocatorFootprint::glibc_system_mem_bytes`), at each checkpoint that read
    /// it; empty when it was not read (another allocator, no `main_arena` symbol).
    pub allocator_own_bytes: Vec<(f64, u64)>,
    /// glibc's own count of the bytes its arenas have in use: Σ `system_mem` − their free bytes
    /// (`AllocatorFootprint::glibc_free_bytes`: top chunks and bins), at each checkpoint that
    /// read both; empty otherwise.
    pub allocator_in_use_bytes: Vec<(f64, u64)>,
}

/// How one kind of memory moved over the run (the runtime split of the process series).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct KindGrowth {
    /// Managed, native, off-heap or runtime.
    pub kind: MemoryKind,
    /// Where the figures come from: "hsperfdata" (the runtime's gauge), "sites", or "gc-marked"
    /// (the sites, the trend judged on what each collection marked live: Go).
    pub source: String,
    /// Bytes at the first and last point of the series.
    pub start_bytes: u64,
    pub end_bytes: u64,
    /// Steady-window trend of the series; for a collected managed heap with at least
    /// [`MIN_WINDOW_POINTS`] post-GC troughs in the window, the trend of those troughs (what
    /// survives collection), not of every point (garbage between collections).
    pub trend: Trend,
    /// Post-GC troughs the trend was fitted on (0: fitted on every point of the window).
    pub troughs: usize,
    /// Bytes per second: max([`KIND_FLOOR_BYTES_PER_S`] ([`SITE_FLOOR_BYTES_PER_S`] for native
    /// malloc bytes), [`SITE_FLOOR_FRACTION`] × peak / span duration), where the peak of the
    /// managed heap is at least the process's peak RSS-anon (a heap summed from sites mapped
    /// since attach is a slice of the heap: a rise under 1 % of RSS-anon is no evidence).
    pub noise_floor_bytes_per_s: f64,
    /// The trend is significant growth above the noise floor (never when its slope is ≤ 0, nor
    /// when the series levelled off).
    pub grows: bool,
    /// Managed heap only: it rose over the steady window (significantly, above the noise floor)
    /// but stayed flat (not significant, or
    /// slower than [`PLATEAU_RATIO`] of the steady slope) through the last quarter of the run,
    /// fitted on its post-GC troughs when collections were seen there: levelled off, not growing.
    pub levelled_off: bool,
    /// Managed heap only, when the runtime counts its collections and says what each left (the
    /// JVM's hsperfdata): the heap judged on them ([`managed::on_collections`]); `trend` and
    /// `grows` are then theirs, and `grows` is false when the trend is unknown.
    pub collections: Option<managed::OnCollections>,
    /// Managed heap seen without its collections (summed from its sites) only: it rose over
    /// the steady window only at the load spikes of a plateau, flat between them, by at most
    /// [`plateau::PLATEAU_DRIFT_SHARE`] of the plateau's steps (the runtime sizing its heap up
    /// for the spikes' objects): the number of rises at spikes; `grows` is then false. None
    /// otherwise.
    pub at_load_spikes: Option<usize>,
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
    /// glibc arena heaps the allocator had at the last checkpoint (found in /proc/PID/maps
    /// whenever they were made), and their resident bytes; None without the figure.
    pub allocator_arena_heaps: Option<u32>,
    pub allocator_arena_resident_end_bytes: Option<u64>,
    /// Other mappings found to hold the allocator's blocks at the last checkpoint (jemalloc's,
    /// mimalloc's, tcmalloc's mmaps, whenever they were made: `AllocatorFootprint::block_regions`)
    /// and their resident bytes; None without the figure.
    pub allocator_block_regions: Option<u32>,
    pub allocator_block_region_resident_end_bytes: Option<u64>,
    /// Large anonymous mappings nothing else claims, counted as the allocator's at the last
    /// checkpoint (memory it held from before attach, likely: `AllocatorFootprint::unclaimed_regions`)
    /// and their resident bytes; None without the figure.
    pub allocator_unclaimed_regions: Option<u32>,
    pub allocator_unclaimed_resident_end_bytes: Option<u64>,
    /// The malloc that is not glibc's among the probed objects ("jemalloc", "tcmalloc",
    /// "mimalloc"), from the probes' object names; None for glibc, musl or an unknown one.
    pub allocator_family: Option<&'static str>,
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
    /// Occupied heap to RSS: the occupied heap ([`Analysis::occupied`]: live native + off-heap +
    /// the managed heap's used bytes + the runtime's own + allocator metadata where known) /
    /// RssAnon at the last checkpoint with memory figures (None without them). Low values with a
    /// growing RSS point at memory the allocator keeps (fragmentation) or memory that is not
    /// traced.
    pub occupied_heap_to_rss_ratio: Option<f64>,
}

/// The process-level conclusion: its class and confidence, and the facts it rests on. The
/// sentence for humans is the renderers' ([`crate::report::verdict::sentence`]).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Verdict {
    /// Class of the process.
    pub class: ProcessClass,
    /// How clear the numbers are, 0..1.
    pub confidence: f64,
    /// True when the numbers cannot tell (too few checkpoints, too many allocations lost): the
    /// class is then `flat` only for want of evidence, and the sentence starts with
    /// "inconclusive". Set where the verdict is decided.
    pub inconclusive: bool,
    /// Why: what the process's memory did.
    pub reason: Reason,
    /// With a managed runtime: which kind of memory leaks, or how each kind moved.
    pub by_kind: Option<KindReason>,
    /// More than 1 % of the allocator calls were lost: the verdict is a lower bound (a leak) or
    /// inconclusive (anything else).
    pub losses: Option<Losses>,
}

/// What the process's memory did, with the figures the verdict names. Sites are referred to by
/// their position in [`Analysis::sites`].
#[derive(Clone, Debug, PartialEq, Serialize)]
pub enum Reason {
    /// Sites leak. The sites of the faster-growing group in all (off-heap mappings when
    /// `offheap`, else the malloc heap) name the class; the other group is named too.
    Leaks {
        /// The mapping sites grow faster than the heap sites.
        offheap: bool,
        /// The fastest leaking site of that group, its number of sites and their summed growth
        /// (bytes per second).
        top: usize,
        count: usize,
        total_bytes_per_s: f64,
        /// The other group's fastest site, number of sites and summed growth, if it leaks too.
        also: Option<(usize, usize, f64)>,
        /// The steady window, seconds since the first checkpoint.
        window_s: (f64, f64),
    },
    /// The allocator's resident memory grows while live native bytes stay flat.
    AllocatorRetains {
        /// The allocator's resident bytes over the steady window, or over the whole span when
        /// `whole_span`.
        trend: Trend,
        /// Slope of the live native bytes over the same window, bytes per second.
        native_bytes_per_s: f64,
        /// The steady window alone did not show the growth significantly; the whole analysed
        /// span did (and it did not level off through the last quarter).
        whole_span: bool,
        /// glibc's own figures over the same window, when its arena headers were read.
        glibc: Option<retention::GlibcArenas>,
        /// Leaking sites whose growth is beneath the allocator's (less than
        /// [`verdict::HEADLINE_SHARE`] of it): the fastest, how many and their summed growth,
        /// bytes per second. They are listed beneath the retention with their share.
        beneath: Option<(usize, usize, f64)>,
    },
    /// Decided on the whole recording: the allocator's resident memory rose (in steps or
    /// steadily) while every traced site's live bytes stayed flat or fell back after each peak
    /// ([`retention::retention`]).
    Retention {
        /// The figures and the steps.
        retention: retention::Retention,
        /// The probed allocator library (jemalloc, tcmalloc, mimalloc); None for the C library's
        /// malloc.
        family: Option<&'static str>,
    },
    /// Growth mode (no malloc probes): the fault sites' pages are glibc's arenas growing while
    /// glibc's own count of its bytes in use stays flat ([`verdict::arenas_hold_freed`]): freed
    /// memory the arenas keep, not a leak.
    ArenasHoldFreed {
        /// Σ `system_mem` of glibc's arenas over the steady window.
        trend: Trend,
        /// Slope of glibc's bytes in use (system_mem − free chunks) over the same window,
        /// bytes per second.
        in_use_bytes_per_s: f64,
        /// The fastest-growing fault site (its index in [`Analysis::sites`]) and the summed
        /// growth of the leaking fault sites, bytes per second.
        top: usize,
        sites_bytes_per_s: f64,
    },
    /// RSS (anon) grows while the traced live bytes stay flat.
    RssOutgrowsTraced {
        /// RssAnon over the steady window.
        trend: Trend,
        /// Slope of the traced live bytes, bytes per second.
        traced_bytes_per_s: f64,
        /// The allocator's footprint was measured and does not grow: the memory is not the
        /// malloc heap's.
        heap_flat: bool,
    },
    /// The command exited before its run had a shape (fewer than [`MIN_SHAPE_CHECKPOINTS`]
    /// checkpoints in the analysed span, or a span shorter than [`MIN_SHAPE_SECONDS`]): what it
    /// still held at exit is listed instead
    /// ([`Analysis::at_exit`]).
    TooShort {
        /// Checkpoints in the analysed span.
        checkpoints: usize,
        /// Duration of the analysed span, seconds.
        duration_s: f64,
    },
    /// Resident shared memory (RssShmem) grows while nothing traced explains it: not "no leak".
    UntracedShmem {
        /// RssShmem over the steady window.
        trend: Trend,
        /// Slope of the traced live bytes (heap and mappings), bytes per second.
        traced_bytes_per_s: f64,
    },
    /// Resident file-backed memory (RssFile) grows while the traced live bytes do not: pages of
    /// mapped files touched over time (a file mapped shared and written, a file mapped and
    /// read). Not "no leak".
    FileBacked {
        /// RssFile over the steady window.
        trend: Trend,
        /// Slope of the traced live bytes (heap and mappings), bytes per second.
        traced_bytes_per_s: f64,
        /// The traced mapping site whose resident bytes grew most, when it explains at least half
        /// of RssFile's growth ([`FILE_SITE_SHARE`]): (its index in [`Analysis::sites`], its
        /// resident bytes at the start and at the end of the analysed span). None: the pages are
        /// in mappings no traced call made (private file mappings, mappings made before attach).
        site: Option<(usize, u64, u64)>,
    },
    /// Growth mode's exact window (escalation) was cut before its end (a signal, the
    /// target exiting) or is too short to judge ([`first_touch::MIN_EXACT_WINDOW_S`],
    /// [`first_touch::MIN_EXACT_CHECKPOINTS`]): what its few checkpoints fit is no verdict.
    ExactWindowCut {
        /// Why the window's recording ended ("signal", "target-exited", "duration").
        end_reason: String,
        /// Its length, seconds, and checkpoints.
        duration_s: f64,
        checkpoints: usize,
    },
    /// Too few checkpoints to measure growth.
    TooFewCheckpoints {
        /// Checkpoints in the steady window.
        n: usize,
    },
    /// No site leaks, but sites of a runtime's warm-up (JIT compilation, code caches: catalog
    /// look-alikes marked `warm_up`) grow significantly: the runtime is still compiling.
    WarmUp {
        /// The fastest-growing warm-up site, the number of such sites and their summed growth
        /// over the steady window (bytes per second).
        top: usize,
        count: usize,
        total_bytes_per_s: f64,
        /// RssAnon's slope over the steady window, bytes per second, when measured.
        rss_anon_bytes_per_s: Option<f64>,
    },
    /// Memory rose and levelled off at cache sites.
    Caches {
        /// The cache site that grew most, the number of cache sites, and the bytes they retain.
        top: usize,
        count: usize,
        retained_bytes: u64,
        /// The top cache is one step of never-freed blocks ([`SiteEvidence::single_step`]): the
        /// verdict is inconclusive.
        single_step: bool,
    },
    /// Allocations are short-lived.
    ShortLived {
        /// Temporary sites, the bytes and blocks they freed, the slope of live native bytes.
        count: usize,
        freed_bytes: u64,
        freed_blocks: u64,
        native_bytes_per_s: f64,
    },
    /// No site leaks, but sites grew through the run at slopes that are not significant over
    /// the steady window (95 % intervals as wide as the slopes: [`SiteEvidence::not_significant`]):
    /// inconclusive, never a leak.
    NotSignificant {
        /// The fastest such site and the number of them.
        top: usize,
        count: usize,
    },
    /// No site leaks: the sites that grew are warm-up ([`settled::settle_warm_up`]): together a
    /// sliver of the allocation rate, none reaching a new high in the last third of the span.
    /// Inconclusive, never a leak.
    WarmUpSettled {
        /// The fastest such site (by held bytes) and the number of them.
        top: usize,
        count: usize,
        /// Their growth over the steady window and the process's allocation rate, bytes/s.
        bytes_per_s: f64,
        allocated_bytes_per_s: f64,
        /// Their last new high and the start of the last third, seconds since the span's start.
        last_rise_s: f64,
        last_part_from_s: f64,
    },
    /// No site grows beyond noise.
    Flat {
        /// Slope of the live native bytes, bytes per second.
        native_bytes_per_s: f64,
    },
}

/// With a managed runtime, the kind of memory that leaks (or none).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub enum KindReason {
    /// The managed heap grows ([`Analysis::kinds`]'s managed entry has the figures).
    ManagedLeak,
    /// Sites of `kind` leak: the fastest is `top`, named `label` (the runtime's name for it, or
    /// its culprit function), among `count` leaking sites of that kind.
    KindLeak { kind: MemoryKind, top: usize, label: String, count: usize },
    /// The series of `kind` (native or off-heap) grows significantly above its floor while no
    /// site of it is a leak (each within its noise: one arena mapped and being filled, many small
    /// sites): not "no leak". The class is off-heap for off-heap memory, leak for native.
    KindGrows { kind: MemoryKind },
    /// The managed heap is judged on its collections and fewer than two ran
    /// ([`managed::unknown`]), and no other kind leaks: inconclusive, never "no leak".
    ManagedUnknown,
    /// No kind leaks: the verdict names how each kind moved.
    ByKind,
}

/// Allocator calls lost beyond 1 %.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Losses {
    /// Share of the traced allocator calls whose bytes were lost, 0..1.
    pub share: f64,
    /// The byte-losing counters that are not zero, (name, count), in counter order.
    pub counters: Vec<(String, u64)>,
    /// A leak was found anyway: its growth is a lower bound (else the verdict is inconclusive).
    pub lower_bound: bool,
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
    /// A leak verdict's scale: bytes a day, share of RSS, time to the cgroup's memory limit
    /// ([`scale::scale`]). None when the verdict is not a leak.
    pub scale: Option<scale::Scale>,
    /// The occupied heap and its parts against RSS anon at the last checkpoint with memory
    /// figures ([`occupied::occupied`]); None without memory figures.
    pub occupied: Option<occupied::Occupied>,
    /// RSS raised in steps by load spikes and flat between them ([`plateau::plateau`]); None
    /// when it was not.
    pub plateau: Option<plateau::Plateau>,
    /// When the target exited (`end_reason` "target-exited"): what it still held at its last
    /// checkpoint, LeakSanitizer-style. None while the target was still running at the end.
    pub at_exit: Option<AtExit>,
    /// A launched command whose teardown was caught (libc's `exit` or CPython's
    /// `Py_FinalizeEx` entered): what the teardown freed, by site. The rest of the analysis
    /// covers the checkpoints up to the teardown. None when no teardown was caught.
    pub freed_at_exit: Option<FreedAtExit>,
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
    /// Every site of the recording, sorted by what it holds at the end
    /// ([`SiteAnalysis::held_bytes`]: live bytes, a mapping's resident bytes), descending
    /// (ties: growth); mappings whose resident bytes are unknown come after the others, by
    /// mapped bytes.
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
    /// Loss counters (IS_LOSS) at the last checkpoint; every loss counter is present. Serialized,
    /// and listed in report.json and report.md, by the counter's name in name order
    /// ([`Analysis::drops_by_name`]).
    #[serde(serialize_with = "verdict::serialize_drops")]
    pub drops: BTreeMap<leaktrace_common::counter::Counter, u64>,
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
    /// CPython's allocator API was hooked (`--pymalloc`: the recording's probes include
    /// `PyObject_Malloc`'s entry), so blocks pymalloc serves from its arenas have their own
    /// stacks; false without it (arena growth is then all the Python heap shows).
    pub pymalloc_hooked: bool,
    /// Growth by type between the Python heap censuses (`record --python-heap`) and
    /// what holds the growing types; None without two censuses.
    pub python_holds: Option<crate::runtimes::python::heap::Holds>,
    /// The runtime's own census (`record --heap-census`) in one clause: the growing
    /// class (and its path from a GC root with `--heap-dump`), JS function or goroutine group
    /// (`report::holds::holder_sentence`); None without one.
    pub runtime_holder: Option<String>,
    /// The work probe of the recording (`SYMBOL[@OBJECT]`); None without one.
    pub work_probe: Option<String>,
    /// Growth mode's escalation: the analysis of the exact-mode window taken on this
    /// process after the growth-mode window ([`Recording::escalation`]); None without one.
    ///
    /// [`Recording::escalation`]: crate::recording::Recording::escalation
    pub escalation: Option<Box<Analysis>>,
    /// Units of work (calls of the work probe) counted from attach to the last checkpoint; None
    /// without a work probe.
    pub units_of_work: Option<u64>,
    /// Steady-window trend of all traced live bytes (every site), bytes per second.
    pub traced_trend: Trend,
    /// Steady-window trend of all traced live bytes against units of work (the slope and its
    /// interval are in bytes per unit, `from_s`/`to_s` in units); None without units of work.
    pub traced_unit_trend: Option<Trend>,
}

/// What a command still held when it exited, by site, apart from libc's and the runtime's own
/// one-time allocations ([`is_one_time_site`]: stdio buffers, the loader, locale and
/// atexit tables, stacks entirely inside system libraries, runtime memory).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct AtExit {
    /// Indexes into [`Analysis::sites`] of the sites with live bytes at exit, largest first; one
    /// entry per symbolized stack: sites whose frames read the same
    /// ([`crate::merge::symbolic_stack_key`]: function, file and line, whatever the return
    /// address) are one entry, listed under the one that held most.
    pub sites: Vec<usize>,
    /// Per entry of `sites`: (live bytes, live blocks) after exit, summed over the entry's sites
    /// (the figures of the last checkpoint, after exit).
    pub held: Vec<(u64, u64)>,
    /// Per entry of `sites`: the ids ([`SiteAnalysis::id`]) of the other sites folded into it
    /// (same symbolized frames, other return addresses), ascending; empty when none.
    pub folded: Vec<Vec<u32>>,
    /// Per entry of `sites`: (reachable bytes, unreachable bytes) of the entry's sites at the
    /// reachability scan at exit (`record --reachability`); None without a scan, or when the
    /// scan saw none of the entry's blocks.
    pub reach: Vec<Option<(u64, u64)>>,
    /// Sum of their live bytes, bytes.
    pub live_bytes: u64,
    /// Sum of their live blocks.
    pub live_allocations: u64,
    /// Sites left out as one-time allocations of libc or the runtime, and their live bytes.
    pub one_time_sites: usize,
    /// Live bytes of the sites left out, bytes.
    pub one_time_bytes: u64,
}

/// What a launched command's teardown (static destructors, atexit handlers, interpreter
/// finalization) freed: live bytes at the teardown checkpoint minus live bytes after exit.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct FreedAtExit {
    /// When the teardown began, seconds since the first checkpoint.
    pub teardown_s: f64,
    /// Bytes and blocks freed during the teardown, all sites.
    pub bytes: u64,
    pub blocks: u64,
    /// (index into [`Analysis::sites`], bytes, blocks) of each site that freed, most bytes first.
    pub sites: Vec<(usize, u64, u64)>,
}

impl FreedAtExit {
    /// Bytes and blocks site `i` (index into [`Analysis::sites`]) freed during the teardown.
    pub fn of_site(&self, i: usize) -> Option<(u64, u64)> {
        self.sites.iter().find(|f| f.0 == i).map(|f| (f.1, f.2))
    }
}

impl Analysis {
    /// What the program's off-heap mappings are, for sentences: "anonymous mappings made by the
    /// program", "shared mappings made by the program (MAP_SHARED: shared memory, RssShmem)" when
    /// every off-heap mapping site that holds or grows is shared, or "anonymous and shared
    /// mappings made by the program (RssAnon and RssShmem)" when both are.
    pub fn offheap_mappings(&self) -> &'static str {
        let maps = self.sites.iter().filter(|s| {
            s.kind == StackKind::Mmap
                && s.memory_kind == crate::runtimes::MemoryKind::OffHeap
                && (s.live_bytes > 0 || s.growth_bytes_per_s > 0.0)
        });
        let (mut shared, mut anon) = (false, false);
        for s in maps {
            if s.shared_mapping {
                shared = true;
            } else {
                anon = true;
            }
        }
        match (shared, anon) {
            (true, false) => "shared mappings made by the program (MAP_SHARED: shared memory, RssShmem)",
            (true, true) => "anonymous and shared mappings made by the program (RssAnon and RssShmem)",
            _ => "anonymous mappings made by the program",
        }
    }

    /// Up to `top` sites with positive steady-window growth (bytes per second), fastest first.
    pub fn top_by_growth(&self) -> Vec<&SiteAnalysis> {
        let mut v: Vec<&SiteAnalysis> = self
            .sites
            .iter()
            .filter(|s| s.growth_bytes_per_s > 0.0 && (s.growth_bytes > 0 || s.live_bytes > 0))
            .collect();
        v.sort_by(|a, b| {
            class_rank(a.class).cmp(&class_rank(b.class)).then(b.growth_bytes_per_s.total_cmp(&a.growth_bytes_per_s))
        });
        v.truncate(self.top);
        v
    }

    /// Up to `top` sites with live bytes at the end, in [`Analysis::sites`] order (most held
    /// first: a mapping by its resident bytes).
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

mod callers;
mod collected;
mod envelope;
mod finalization;
pub mod first_touch;
mod frames;
mod kinds;
pub mod managed;
pub mod occupied;
pub mod patterns;
pub mod plateau;
mod replay;
pub mod retention;
pub mod scale;
mod settled;
mod site;
mod stats;
mod thresholds;
mod verdict;

#[cfg(test)]
pub(crate) mod fixtures;
#[cfg(test)]
mod tests;

pub use frames::{
    basename, culprit, frame_label, is_allocator, is_one_time_site, is_program_frame, native_interface_caller,
};
pub use replay::{analyze, analyze_timeline, steady_window};
pub use stats::{fit, t_crit95};
pub use verdict::lost_share;

use site::*;
use stats::*;
use verdict::*;
