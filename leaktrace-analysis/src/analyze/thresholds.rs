//! The analysis's thresholds: the numbers docs/analysis.md quotes, each with its unit and why it
//! is what it is. Re-exported from [`crate::analyze`].

/// Absolute part of a site's noise floor, bytes per second: growth slower than this is never a
/// leak (64 B/s is one small allocation a second; over an hour it is 225 KiB).
pub const SITE_FLOOR_BYTES_PER_S: f64 = 64.0;
/// Relative part of a site's noise floor: growth that over the whole run adds less than this
/// fraction of the site's peak live bytes is noise (1 %).
pub const SITE_FLOOR_FRACTION: f64 = 0.01;
/// Absolute part of the process (RSS) noise floor, bytes per second: one 4 KiB page a second.
/// RSS moves in pages, so a smaller slope is not measurable.
pub const RSS_FLOOR_BYTES_PER_S: f64 = 4096.0;
/// A site growing slower than [`SITE_FLOOR_BYTES_PER_S`] is still a leak when its blocks are the
/// evidence: none ever freed, live blocks never falling, and at least this many new live blocks
/// over the steady window (with a significant fit).
pub const MIN_EVIDENT_BLOCKS: i64 = 3;
/// The same evidence for a site whose other blocks are freed (a leak on an error path shares its
/// call stack with the normal path's freed blocks): at least this many more live blocks over the
/// steady window, never falling by more than [`IN_FLIGHT_BLOCKS`] from one checkpoint to the
/// next (blocks of the normal path in flight when a checkpoint reads the site).
pub const MIN_EVIDENT_SHARED_BLOCKS: i64 = 10;
/// Blocks of a churning site that may be in flight (allocated, about to be freed) when a
/// checkpoint reads it.
pub const IN_FLIGHT_BLOCKS: u64 = 2;
/// In growth mode a fault site is a leak only with at least this many more pages over the steady
/// window: one page faulted late by a stack seen once (a walk cut short) is no evidence.
pub const MIN_FAULT_LEAK_PAGES: i64 = 3;
/// A bounded cache that keeps evicting holds its blocks for at least this long (or a checkpoint
/// interval, if shorter), seconds; blocks of a request in flight live for less.
pub const CACHE_MIN_LIFETIME_S: f64 = 0.25;
/// A site whose live blocks grow is not retaining them when, at the end of the steady window,
/// their ages sum to less than this share of what its new blocks would hold had each been kept
/// since it came (new blocks × window / 2), and their mean age stayed below one checkpoint
/// interval through the window's later half: more blocks in flight at once (rising concurrency),
/// class temporary.
pub const YOUNG_AGE_SHARE: f64 = 0.25;
/// Highest confidence of a cache seen as a single step of never-freed blocks (a leak in bursts
/// looks the same until a second period is recorded).
pub const SINGLE_STEP_CONFIDENCE: f64 = 0.2;
/// A command that exited with fewer checkpoints than this in its analysed span ran too short to
/// have a shape: its verdict is "inconclusive: too short to classify", followed by what it still
/// held when it exited ([`AtExit`](super::AtExit)).
pub const MIN_SHAPE_CHECKPOINTS: usize = 5;
/// Steps a site's live bytes must rise in, each to a new high-water mark and never falling, to
/// be a leak judged by its envelope (`analyze/envelope.rs`).
pub const MIN_ENVELOPE_STEPS: usize = 3;
/// A command that exited after an analysed span shorter than this (seconds) ran too short to
/// judge growth, however many checkpoints a fast `--interval` took in it: its steady window (the
/// last half) is under 0.75 s, where start-up, one batch of work and a leak all read as the same
/// rise. Same verdict as [`MIN_SHAPE_CHECKPOINTS`].
pub const MIN_SHAPE_SECONDS: f64 = 1.5;
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

/// Share of RssFile's growth over the analysed span that a traced mapping site's resident
/// growth must explain for the file-backed verdict ([`Reason::FileBacked`](super::Reason::FileBacked)) to name it.
pub const FILE_SITE_SHARE: f64 = 0.5;
/// |t| values are capped at this value (a perfectly straight line has an infinite t).
pub const T_CAP: f64 = 1e6;
/// Absolute part of the noise floor of a kind's series (managed, off-heap, ...), bytes per
/// second: one page a second (mapped heaps move in pages).
pub const KIND_FLOOR_BYTES_PER_S: f64 = 4096.0;
