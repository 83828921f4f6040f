//! Indexes of the loss and event counters in the `COUNTERS` per-CPU array. The agent sums the
//! per-CPU slots. Every index below [`NUM`] is reported in `report.json` under `drops` (losses)
//! or `events` (informational).
//!
//! [`Counter`] is the typed index (`#[repr(u32)]`, decoded with `TryFrom<u32>` as aya-log-common
//! does for its wire kinds); the `u32` constants below are its discriminants, for the kernel
//! side's `count(counter::X)`. [`TABLE`] gives each one's name in recordings and reports and what
//! it means for the numbers.

wire_enum! {
    /// One loss or event counter: its discriminant is its index in the `COUNTERS` array (and its
    /// order, the table's).
    #[repr(u32)]
    #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
    pub enum Counter else UnknownCounter {
        /// An allocation could not be recorded because the live-allocation map was full (loss).
        AllocsFull = 0,
        /// A call-stack site could not be created because the per-stack map was full (loss).
        SitesFull = 1,
        /// A new call stack could not be stored because the stack map was full. The allocation is
        /// still counted, under its direct caller only (loss of attribution, not of bytes).
        StacksFull = 2,
        /// A call stack was not stored because the walk's per-CPU buffer was reused before it was
        /// copied (the program was preempted), or because a different stack already has its 64-bit
        /// key (loss of attribution, not of bytes: they stay with the direct caller).
        StackError = 3,
        /// No in-flight slot could be had for the thread (the kernel could not allocate its task
        /// storage, or it was busy in a BPF program this one interrupted); the call was not traced
        /// (loss).
        InflightFull = 4,
        /// An entry probe found a stale in-flight record of the same thread whose return was never
        /// seen (longjmp out of the allocator, thread killed mid-call) (loss).
        MissedReturn = 5,
        /// A return probe fired with no in-flight record: the call was entered before the probes
        /// were attached (informational, like allocations made before attach).
        OrphanReturn = 6,
        /// An allocation returned an address that was already live: the free of the old block was not
        /// seen (freed through an entry point that is not hooked). The old block is retired (loss).
        AddressReused = 7,
        /// free() of an address allocated before the probes were attached (informational).
        UntrackedFree = 8,
        /// An allocator call made from inside another hooked allocator call (realloc calling malloc,
        /// a hooked wrapper calling a hooked function) that was folded into the outer call
        /// (informational).
        NestedCall = 9,
        /// Allocator calls that returned NULL / an error and were not recorded (informational).
        FailedAlloc = 10,
        /// Allocations recorded (informational).
        Allocs = 11,
        /// Frees of tracked blocks (informational).
        Frees = 12,
        /// A mapping event could not be queued because the EVENTS ring buffer was full (loss: the
        /// off-heap and allocator-footprint figures miss that mmap/munmap/mremap/brk).
        EventsLost = 13,
        /// Anonymous mappings made outside any allocator call (off-heap) (informational).
        OffheapMaps = 14,
        /// Anonymous mappings made from inside an allocator call (the allocator's own) (informational).
        AllocatorMaps = 15,
        /// Sampled mode: allocations that were sampled (each stands for more bytes) (informational).
        Sampled = 16,
        /// Growth mode: first-touch page faults counted (informational).
        PageFaults = 17,
        /// Stack walks that ended before the outermost frame (no unwind info, depth limit, bad frame,
        /// unreadable stack): the stack's outer callers are unknown; each stored stack says why in
        /// its `end` (loss of attribution, not of bytes).
        StackTruncated = 18,
        /// Frames found by the frame-pointer chain because their code had no unwind row
        /// (informational).
        FpFrames = 19,
        /// Unwind-rule lookups that found the program counter's VMA but no table for its object
        /// (not loaded yet, or it did not fit in the rows map) (informational).
        UnwindNoTable = 20,
        /// Allocator calls whose native stack walk was not made again: the thread's last walk
        /// started from the same registers and every stack word it read still held the same value,
        /// so its frames were taken (informational; see the walk memo in docs/kernel.md).
        WalksReused = 21,
    }
}

/// [`Counter::AllocsFull`].
pub const ALLOCS_FULL: u32 = Counter::AllocsFull as u32;
/// [`Counter::SitesFull`].
pub const SITES_FULL: u32 = Counter::SitesFull as u32;
/// [`Counter::StacksFull`].
pub const STACKS_FULL: u32 = Counter::StacksFull as u32;
/// [`Counter::StackError`].
pub const STACK_ERROR: u32 = Counter::StackError as u32;
/// [`Counter::InflightFull`].
pub const INFLIGHT_FULL: u32 = Counter::InflightFull as u32;
/// [`Counter::MissedReturn`].
pub const MISSED_RETURN: u32 = Counter::MissedReturn as u32;
/// [`Counter::OrphanReturn`].
pub const ORPHAN_RETURN: u32 = Counter::OrphanReturn as u32;
/// [`Counter::AddressReused`].
pub const ADDRESS_REUSED: u32 = Counter::AddressReused as u32;
/// [`Counter::UntrackedFree`].
pub const UNTRACKED_FREE: u32 = Counter::UntrackedFree as u32;
/// [`Counter::NestedCall`].
pub const NESTED_CALL: u32 = Counter::NestedCall as u32;
/// [`Counter::FailedAlloc`].
pub const FAILED_ALLOC: u32 = Counter::FailedAlloc as u32;
/// [`Counter::Allocs`].
pub const ALLOCS: u32 = Counter::Allocs as u32;
/// [`Counter::Frees`].
pub const FREES: u32 = Counter::Frees as u32;
/// [`Counter::EventsLost`].
pub const EVENTS_LOST: u32 = Counter::EventsLost as u32;
/// [`Counter::OffheapMaps`].
pub const OFFHEAP_MAPS: u32 = Counter::OffheapMaps as u32;
/// [`Counter::AllocatorMaps`].
pub const ALLOCATOR_MAPS: u32 = Counter::AllocatorMaps as u32;
/// [`Counter::Sampled`].
pub const SAMPLED: u32 = Counter::Sampled as u32;
/// [`Counter::PageFaults`].
pub const PAGE_FAULTS: u32 = Counter::PageFaults as u32;
/// [`Counter::StackTruncated`].
pub const STACK_TRUNCATED: u32 = Counter::StackTruncated as u32;
/// [`Counter::FpFrames`].
pub const FP_FRAMES: u32 = Counter::FpFrames as u32;
/// [`Counter::UnwindNoTable`].
pub const UNWIND_NO_TABLE: u32 = Counter::UnwindNoTable as u32;
/// [`Counter::WalksReused`].
pub const WALKS_REUSED: u32 = Counter::WalksReused as u32;
/// Number of counters.
pub const NUM: u32 = 22;

/// A `u32` that is no [`Counter`]'s index (the value itself).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UnknownCounter(pub u32);

impl Counter {
    /// Every counter, in index order.
    pub const ALL: [Counter; NUM as usize] = {
        let mut all = [Counter::AllocsFull; NUM as usize];
        let mut i = 0;
        while i < NUM as usize {
            all[i] = TABLE[i].counter;
            i += 1;
        }
        all
    };

    /// Its entry in [`TABLE`].
    pub const fn info(self) -> &'static Info {
        &TABLE[self as usize]
    }

    /// Its name in recordings (`Checkpoint::counters`) and reports (`drops`, `events`).
    pub const fn name(self) -> &'static str {
        self.info().name
    }

    /// The counter named `name` in recordings and reports, if there is one.
    pub fn from_name(name: &str) -> Option<Counter> {
        by_name(name).map(|i| i.counter)
    }
}

/// What one counter means for the numbers: its name in recordings and reports, whether it is a
/// loss, and which kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Info {
    /// The counter (its index in the `COUNTERS` array is `counter as u32`).
    pub counter: Counter,
    /// Name in recordings (`Checkpoint::counters`) and reports (`drops`, `events`).
    pub name: &'static str,
    /// A loss (reported under `drops`, lowers the verdict's confidence); else an
    /// informational event (`events`).
    pub is_loss: bool,
    /// A loss after which live bytes are incomplete (allocations or frees not recorded); the
    /// other losses lose call stacks, never bytes.
    pub loses_bytes: bool,
    /// A map or buffer was full: the run was sized too small (`--max-allocs`, `--max-sites`),
    /// whatever the share of calls lost.
    pub full: bool,
}

const fn info(counter: Counter, name: &'static str, is_loss: bool, loses_bytes: bool, full: bool) -> Info {
    Info { counter, name, is_loss, loses_bytes, full }
}

/// Every counter, by index: the one table the agent, the analysis and `check` read.
pub const TABLE: [Info; NUM as usize] = {
    use Counter::*;
    [
        info(AllocsFull, "allocs_map_full", true, true, true),
        info(SitesFull, "sites_map_full", true, true, true),
        info(StacksFull, "stacks_map_full", true, false, true),
        info(StackError, "stack_error", true, false, false),
        info(InflightFull, "inflight_map_full", true, true, true),
        info(MissedReturn, "missed_return", true, true, false),
        info(OrphanReturn, "orphan_return", false, false, false),
        info(AddressReused, "address_reused", true, true, false),
        info(UntrackedFree, "untracked_free", false, false, false),
        info(NestedCall, "nested_call", false, false, false),
        info(FailedAlloc, "failed_alloc", false, false, false),
        info(Allocs, "allocs", false, false, false),
        info(Frees, "frees", false, false, false),
        info(EventsLost, "map_events_lost", true, true, true),
        info(OffheapMaps, "offheap_maps", false, false, false),
        info(AllocatorMaps, "allocator_maps", false, false, false),
        info(Sampled, "sampled_allocs", false, false, false),
        info(PageFaults, "page_faults", false, false, false),
        info(StackTruncated, "stack_truncated", false, false, false),
        info(FpFrames, "fp_frames", false, false, false),
        info(UnwindNoTable, "unwind_no_table", false, false, false),
        info(WalksReused, "walks_reused", false, false, false),
    ]
};

/// Name of each counter in recordings and reports, by index ([`TABLE`]'s names).
pub const NAMES: [&str; NUM as usize] = {
    let mut names = [""; NUM as usize];
    let mut i = 0;
    while i < NUM as usize {
        names[i] = TABLE[i].name;
        i += 1;
    }
    names
};

/// True for the counters that are losses (reported under `drops`); the others are
/// informational events ([`TABLE`]'s `is_loss`).
pub const IS_LOSS: [bool; NUM as usize] = {
    let mut loss = [false; NUM as usize];
    let mut i = 0;
    while i < NUM as usize {
        loss[i] = TABLE[i].is_loss;
        i += 1;
    }
    loss
};

/// The counter named `name`, if there is one.
pub fn by_name(name: &str) -> Option<&'static Info> {
    TABLE.iter().find(|c| c.name == name)
}

/// Counters whose loss leaves live bytes incomplete, in index order.
pub fn byte_losses() -> impl Iterator<Item = &'static Info> {
    TABLE.iter().filter(|c| c.loses_bytes)
}
