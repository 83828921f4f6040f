//! The recording: every checkpoint of one traced process, saved as `recording.json`.
//!
//! This is the seam between tracing (needs root and a live target) and everything after it
//! (analysis and outputs are pure functions of a [`Recording`], re-run offline by
//! `leaktrace report DIR`). Stacks are symbolized while the target is alive and stored here, so
//! nothing later needs the target or its files.
//!
//! Format stability: `format_version` is bumped on any incompatible change; readers refuse a
//! version they do not know.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// Current value of [`Recording::format_version`].
pub const FORMAT_VERSION: u32 = 1;

/// One recording of one process.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Recording {
    /// [`FORMAT_VERSION`] of the writer.
    pub format_version: u32,
    /// Version of the leaktrace that recorded it.
    pub leaktrace_version: String,
    pub target: Target,
    /// Tracing mode: "exact" (every allocator call), "sampled" (byte-based sampling, weighted
    /// estimates) or "growth" (first-touch page faults by stack, no allocator probes).
    pub mode: Mode,
    /// Sampled mode: mean distance between samples, bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sample_bytes: Option<u64>,
    /// Wall-clock start of the recording, Unix time in ms.
    pub started_unix_ms: u64,
    /// Requested checkpoint interval, seconds.
    pub interval_s: f64,
    /// The unit-of-work function (`--work-probe SYMBOL[@OBJECT]`), if one was given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub work_probe: Option<String>,
    /// Where each probe was placed (the coverage table).
    pub probes: Vec<ProbeInfo>,
    /// Every call stack that some checkpoint refers to, symbolized.
    pub stacks: Vec<Stack>,
    /// Checkpoints in time order. The first is taken right after the probes are attached.
    pub checkpoints: Vec<Checkpoint>,
    /// Why the recording ended: "duration", "signal", "target-exited", "batches-done",
    /// "work-probe-missing".
    pub end_reason: EndReason,
    /// Warnings gathered while recording (e.g. a library the target maps but that was not
    /// probed), shown in the report's caveats.
    #[serde(default)]
    pub warnings: Vec<String>,
    /// Reachability hook: the conservative scan at the end of the recording
    /// (`record --reachability`); None without it, or when the target was gone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reachability: Option<crate::reachability::Reachability>,
    /// Reachability scans taken while recording (`--reachability-every N`: at every Nth
    /// checkpoint), oldest first; the scan at the end is `reachability`. Empty without the
    /// option.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reachability_scans: Vec<crate::reachability::Reachability>,
    /// Python heap censuses (`record --python-heap`), oldest first: at the first
    /// periodic checkpoint, every Nth (`--python-heap-every`) and at the end.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub python_heap: Vec<crate::runtimes::python::heap::PyCensus>,
    /// Hook (pprof mappings): the target's executable mappings with file offsets and
    /// build IDs, by start address; empty in recordings made before it existed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mappings: Vec<ObjectMapping>,
    /// Stacks merged into one site because their symbolized frames are the same (JIT code
    /// compiled again at new addresses: [`crate::merge`]): the kept stack's id (the smallest of
    /// its group) → the ids of the stacks folded into it, ascending. Their samples are summed
    /// into the kept stack's; only its frames (and addresses) are kept. Empty when nothing was
    /// merged.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub merged_stacks: BTreeMap<u32, Vec<u32>>,
    /// `record --heap-census`: what the runtime's own heap tools said at the start
    /// and the end ([`crate::holds`]); None without the option or for a runtime it has no tool for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime_holds: Option<crate::holds::RuntimeHolds>,
    /// Growth mode's escalation: the exact-mode recording of this process taken after
    /// the growth-mode window, when growth mode saw RSS grow through the allocator (pages first
    /// touched inside malloc, which names no holder). Bounded (`record --escalate-for`, default
    /// 10 s); its probes are removed when it ends. None without one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub escalation: Option<Box<Recording>>,
}

/// An executable mapping of the target (a /proc/PID/maps line with `x`), as the symbolizer kept
/// it: the pprof profiles' `Mapping`s.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct ObjectMapping {
    /// First virtual address of the mapping.
    pub start: u64,
    /// First virtual address past it.
    pub end: u64,
    /// File offset mapped at `start`, bytes.
    pub offset: u64,
    /// Path of the object as the target maps it.
    pub path: String,
    /// GNU build ID of the object (its `.note.gnu.build-id`), lower-case hex; None without one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub build_id: Option<String>,
    /// The object exports a `PyInit_*` function: a CPython extension module, whatever its path
    /// (read by the recorder from its dynamic symbols; false, left out of recording.json, for
    /// other objects and in recordings made before it was read).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub python_extension: bool,
}

/// Defines a string-valued enum of the recording: serde names, [`as_str`](Self::as_str) and
/// `Display` give the same lowercase names, so recording.json and the reports keep their text.
/// A variant written `@cfg(PREDICATE) Name = "name"` exists only where the predicate holds (the
/// toy runtime of the unit tests: `@cfg(test)`).
macro_rules! named_enum {
    ($(#[$m:meta])* $name:ident { $($(#[$vm:meta])* $(@cfg($c:meta))? $v:ident = $s:literal),+ $(,)? }) => {
        $(#[$m])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        pub enum $name {
            $($(#[$vm])* $(#[cfg($c)])? #[serde(rename = $s)] $v),+
        }
        impl $name {
            /// Every variant, in declaration order.
            pub const ALL: &'static [$name] = &[$($(#[cfg($c)])? $name::$v),+];

            /// The name in recording.json and the reports.
            pub fn as_str(self) -> &'static str {
                match self { $($(#[cfg($c)])? $name::$v => $s),+ }
            }
        }
        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

named_enum! {
    /// Tracing mode of a recording.
    Mode {
        /// Every allocator call.
        Exact = "exact",
        /// Byte-based sampling: sites are weighted estimates.
        Sampled = "sampled",
        /// No allocator probes: first-touch page faults by stack.
        Growth = "growth",
    }
}

named_enum! {
    /// Why a recording ended.
    EndReason {
        /// `--duration` elapsed.
        Duration = "duration",
        /// SIGINT, SIGTERM or SIGHUP.
        Signal = "signal",
        /// The traced process(es) exited.
        TargetExited = "target-exited",
        /// `check`: the last batch completed.
        BatchesDone = "batches-done",
        /// `--work-probe` was never found in the objects the command maps.
        WorkProbeMissing = "work-probe-missing",
        /// Not ended: a copy of a recording still in progress (a periodic `--push`); never in a
        /// saved recording.json.
        Running = "running",
    }
}

named_enum! {
    /// A managed runtime detected in the target (none: a native program).
    Runtime {
        /// CPython.
        Python = "python",
        /// HotSpot JVM.
        Jvm = "jvm",
        /// Go.
        Go = "go",
        /// Node.js (V8).
        Node = "node",
        /// A toy runtime of the unit tests (runtimes/toy/): what adding a runtime takes.
        @cfg(test) Toy = "toy",
    }
}

named_enum! {
    /// What a recorded call stack allocated. The variants are in the order of their names, so
    /// that sorting by kind sorts as the names do (compare's signatures).
    StackKind {
        /// Growth mode: pages made resident by first-touch page faults.
        Fault = "fault",
        /// malloc-family allocations.
        Malloc = "malloc",
        /// Anonymous mappings (off-heap, or the allocator's own when classified so).
        Mmap = "mmap",
    }
}

named_enum! {
    /// What a probe in the coverage table ([`ProbeInfo`]) does.
    ProbeKind {
        /// At an allocator function's entry: its arguments and the caller's stack.
        Entry = "entry",
        /// At its return: the block it returned.
        Return = "return",
        /// At libc's `exit` or CPython's `Py_FinalizeEx`: the launched command's teardown.
        Teardown = "teardown",
        /// At the `--work-probe` function: a unit of work.
        Work = "work",
    }
}

/// The traced process.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Target {
    /// PID as the host sees it.
    pub pid: u32,
    /// PIDs in each nested PID namespace, outermost first (NSpid of /proc/PID/status); just
    /// `[pid]` outside containers.
    #[serde(default)]
    pub nspid: Vec<u32>,
    /// Command line (argv), from /proc/PID/cmdline or the launch command.
    pub command: Vec<String>,
    /// Path of the executable as the target sees it (/proc/PID/exe).
    pub exe: String,
    /// True when leaktrace started the command (`record -- CMD`), false with `--pid`.
    pub launched: bool,
    /// Managed runtime detected in the target ("python", "jvm", "go", "node"); None: native.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime: Option<Runtime>,
    /// Runtime version when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime_version: Option<String>,
    /// How the launched command ended: exit code, or 128 + signal number (shell convention).
    /// None while running or when attached with --pid.
    pub exit_status: Option<i32>,
    /// How the process ended when it ended during the recording, in words: "killed
    /// by the OOM killer (oom_kill of CGROUP/memory.events went 0 → 1)", "killed by signal 9
    /// (SIGKILL)", "exited with status 3", or, attached with --pid, "exited (its exit status is
    /// visible only to its parent)". None when it outlived the recording or in older recordings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended: Option<String>,
    /// Every `execve` the process made during the recording, in time order: the
    /// image changed there, and the sites before and after belong to different programs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub execs: Vec<ExecChange>,
    /// The memory limit of the target's memory cgroup, bytes: the smallest of its and its
    /// ancestors' cgroup v2 `memory.max` or v1 `memory.limit_in_bytes`, read when the process was
    /// first seen in that cgroup. None: no limit, or none could be read (older recordings).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_limit_bytes: Option<u64>,
    /// The file that set [`Target::memory_limit_bytes`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_limit_file: Option<String>,
}

/// One `execve` of a traced process, seen at the sched:sched_process_exec tracepoint (or, without
/// tracepoints, as a change of /proc/PID/exe).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct ExecChange {
    /// Seconds since the first checkpoint when leaktrace noticed it (within one poll, 100 ms).
    pub t_s: f64,
    /// The executable before (/proc/PID/exe as last read).
    pub from: String,
    /// The executable after.
    pub to: String,
    /// The new command line (/proc/PID/cmdline after the exec).
    pub command: Vec<String>,
}

/// One uprobe placement.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ProbeInfo {
    /// Path of the object as the target maps it (e.g. /lib/x86_64-linux-gnu/libc.so.6).
    pub object: String,
    /// Hooked function, e.g. "malloc".
    pub function: String,
    /// "entry", "return", "teardown" (libc's `exit`, CPython's `Py_FinalizeEx`) or "work" (the
    /// `--work-probe` function).
    pub kind: ProbeKind,
    /// File offset of the probe in the object, bytes.
    pub offset: u64,
    /// Entry probes: where in the function the probe sits and why (e.g. "+9: after the NULL
    /// check ..."), see `placement`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<String>,
}

/// A symbolized call stack. `frames[0]` is the innermost frame (inside the allocator).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Stack {
    /// Index used by [`SiteSample::stack`]; unique within the recording.
    pub id: u32,
    /// "malloc" (malloc-family allocation), "mmap" (off-heap mapping) or "fault" (growth mode:
    /// pages made resident by first-touch page faults).
    pub kind: StackKind,
    /// Innermost first. An address with inlined functions yields several frames: the inlined
    /// callees first (`inlined: true`), then the function the code was inlined into. Shared
    /// (`Arc`): a frame met in many stacks is held once ([`Recording::intern_frames`]; the
    /// symbolizer makes one per address), so memory grows with distinct frames, not with
    /// stacks × depth. Serialized as plain frames.
    pub frames: Vec<Arc<Frame>>,
    /// True when the kernel could not give the stack (map collision or error): the bytes are
    /// real, their call stack is unknown.
    #[serde(default)]
    pub lost: bool,
    /// Why the walk stopped before the outermost frame, when it did: "no unwind info for
    /// libfoo.so+0x1234", "depth limit (127 frames)", "unreadable stack after …", "implausible
    /// frame after …". None: the stack is complete (or lost).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub truncated: Option<String>,
    /// An "mmap" stack whose mapping was MAP_SHARED (a memfd, shm_open, a shared file mapping):
    /// its resident pages are shared memory (RssShmem, or RssFile for a file on disk), not
    /// anonymous memory (RssAnon). False for every other stack, and in recordings made before
    /// the flag was kept.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub shared: bool,
}

/// One frame of a call stack.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq, Hash)]
pub struct Frame {
    /// Virtual address in the target (a return address, except for frame 0).
    pub addr: u64,
    /// Path of the ELF object containing `addr`, as the target maps it.
    pub object: Option<String>,
    /// Demangled function name, when known.
    pub function: Option<String>,
    /// Source file, when debug info is available.
    pub file: Option<String>,
    /// Source line, when debug info is available.
    pub line: Option<u32>,
    /// This frame is a function inlined into the next frame (same address).
    #[serde(default)]
    pub inlined: bool,
    /// Offset of `addr` in the object's file (what addr2line and objdump take), when the object
    /// is known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file_offset: Option<u64>,
    /// GNU build id of the object (hex), when it has one: finds its debug file
    /// (/usr/lib/debug/.build-id/xx/yyyy.debug) on another machine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub build_id: Option<String>,
    /// What code the frame is: machine code (`native`, the default, left out of recording.json)
    /// or an interpreter's frame (`python`: `function` is the code object's qualified name,
    /// `file` and `line` its source file and the line being run; `addr` is the code object's
    /// address and `object` is None).
    #[serde(default, skip_serializing_if = "FrameKind::is_native")]
    pub kind: FrameKind,
}

/// The kind of code a [`Frame`] is.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq, Hash)]
#[serde(rename_all = "lowercase")]
pub enum FrameKind {
    /// Machine code in a mapped object or JIT code.
    #[default]
    Native,
    /// A CPython frame read from the interpreter's frame chain at the allocation.
    Python,
}

impl FrameKind {
    /// True for [`FrameKind::Native`].
    pub fn is_native(&self) -> bool {
        *self == FrameKind::Native
    }

    /// The name in report.json (`native`, `python`).
    pub fn as_str(&self) -> &'static str {
        match self {
            FrameKind::Native => "native",
            FrameKind::Python => "python",
        }
    }
}

/// Memory of the process at a checkpoint, from /proc/PID/status. All values in bytes.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct ProcMemory {
    /// VmRSS: resident set size.
    pub rss_bytes: u64,
    /// RssAnon: resident anonymous memory (heap, anonymous mappings, stacks).
    pub rss_anon_bytes: u64,
    /// RssFile: resident file-backed memory (code, mapped files).
    pub rss_file_bytes: u64,
    /// RssShmem: resident shared memory.
    pub rss_shmem_bytes: u64,
    /// VmSize: total virtual size.
    pub vm_size_bytes: u64,
}

/// Totals of one call-stack site at a checkpoint (cumulative since attach).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct SiteSample {
    /// [`Stack::id`].
    pub stack: u32,
    /// Bytes requested by allocations from this site since attach.
    pub alloc_bytes: u64,
    /// Allocations from this site since attach.
    pub alloc_count: u64,
    /// Bytes of this site's blocks freed since attach.
    pub free_bytes: u64,
    /// This site's blocks freed since attach.
    pub free_count: u64,
    /// Off-heap ("mmap") sites: bytes of the site's live regions resident in RAM (from
    /// /proc/PID/pagemap). None for malloc sites, or when the process was gone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resident_bytes: Option<u64>,
    /// Sum of the birth times of this site's blocks allocated since attach, in ms on the
    /// recording's clock (0 = the first checkpoint, `t_s` × 1000; blocks born before it count
    /// negative); from the kernel's per-block birth times (`AllocInfo::born_ms`, whole
    /// milliseconds). With [`SiteSample::free_born_ms`] it gives the age of the live blocks
    /// ([`SiteSample::live_age_ms`]). None for mappings, fault sites without it, and recordings
    /// made before it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alloc_born_ms: Option<i64>,
    /// The same sum over the site's blocks that were freed (ms, same clock).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub free_born_ms: Option<i64>,
}

impl SiteSample {
    /// Outstanding (live) bytes: allocated and not yet freed.
    pub fn live_bytes(&self) -> u64 {
        self.alloc_bytes.saturating_sub(self.free_bytes)
    }
    /// Outstanding (live) blocks.
    pub fn live_count(&self) -> u64 {
        self.alloc_count.saturating_sub(self.free_count)
    }
    /// Sum of the ages of the live blocks at `t_s` (seconds on the recording's clock, the time
    /// of the checkpoint this sample belongs to), in ms: live blocks × now − the sum of their
    /// birth times; at least 0 (the kernel's sums are read while they change). None without
    /// birth times. Divided by [`SiteSample::live_count`] it is their mean age.
    pub fn live_age_ms(&self, t_s: f64) -> Option<f64> {
        let born = self.alloc_born_ms?.saturating_sub(self.free_born_ms?);
        Some((self.live_count() as f64 * t_s * 1000.0 - born as f64).max(0.0))
    }
    /// Add `other`'s totals to these (saturating), for two stacks counted as one site; resident
    /// bytes and birth-time sums are summed where either has them.
    pub fn add(&mut self, other: &SiteSample) {
        self.alloc_bytes = self.alloc_bytes.saturating_add(other.alloc_bytes);
        self.alloc_count = self.alloc_count.saturating_add(other.alloc_count);
        self.free_bytes = self.free_bytes.saturating_add(other.free_bytes);
        self.free_count = self.free_count.saturating_add(other.free_count);
        if let Some(r) = other.resident_bytes {
            self.resident_bytes = Some(self.resident_bytes.unwrap_or(0).saturating_add(r));
        }
        if let Some(b) = other.alloc_born_ms {
            self.alloc_born_ms = Some(self.alloc_born_ms.unwrap_or(0).saturating_add(b));
        }
        if let Some(b) = other.free_born_ms {
            self.free_born_ms = Some(self.free_born_ms.unwrap_or(0).saturating_add(b));
        }
    }
}

/// One checkpoint.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Checkpoint {
    /// Seconds since the first checkpoint.
    pub t_s: f64,
    /// None when the process had already exited (its maps are still read).
    pub memory: Option<ProcMemory>,
    /// The sites whose totals changed since the previous checkpoint (every site with an
    /// allocation since attach at the first one): a site absent from a checkpoint keeps its last
    /// totals. Readers carry totals forward.
    pub sites: Vec<SiteSample>,
    /// Kernel-side counters by name (see `leaktrace_common::counter`), cumulative.
    pub counters: BTreeMap<String, u64>,
    /// `leaktrace check`: this checkpoint closes batch N (0 = the baseline taken at the end of
    /// the warm-up). None for the periodic checkpoints.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch: Option<u32>,
    /// Calls of the work-probe function since attach (units of work); None without --work-probe.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub units_of_work: Option<u64>,
    /// The runtime's own figure for its managed heap (e.g. the JVM's hsperfdata), when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub managed: Option<ManagedHeap>,
    /// The allocator's own memory (heap and arenas) at this checkpoint; None when mappings were
    /// not traced or the process was gone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocator: Option<AllocatorFootprint>,
    /// Taken when a launched command began its teardown (it entered libc's `exit` or CPython's
    /// `Py_FinalizeEx`, and was held stopped while this checkpoint was read): what was live
    /// before static destructors, atexit handlers or interpreter finalization freed anything.
    /// At most one per recording; growth is judged on the checkpoints up to it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub teardown: bool,
}

/// A runtime's managed heap as the runtime itself reports it. Bytes.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct ManagedHeap {
    /// Bytes in use (live objects and garbage not yet collected).
    pub used_bytes: u64,
    /// Bytes the runtime has reserved from the OS for its heap.
    pub committed_bytes: u64,
    /// Per-generation or per-space detail, name → used bytes (e.g. "old" → ...).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub spaces: BTreeMap<String, u64>,
    /// Where the figures come from, e.g. "hsperfdata /tmp/hsperfdata_root/1".
    pub source: String,
    /// Collections the runtime has run since it started (the JVM's young and full collections:
    /// Σ hsperfdata `sun.gc.collector.N.invocations`); None when the runtime does not say.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub collections: Option<u64>,
    /// Seconds from the end of the runtime's last collection to this sample (the JVM's
    /// `sun.gc.collector.N.lastExitTime` against `sun.os.hrt.ticks`): the bytes a collection left
    /// are placed at the time it ran, not at the checkpoint that saw them. None when the runtime
    /// does not say, or no collection ran yet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_collection_ago_s: Option<f64>,
    /// The figures feed the occupied heap's managed part only (Go's `HeapInuse` read from the
    /// process): the managed heap's series and trend stay measured from its sites.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub figures_only: bool,
}

/// What the allocator holds from the kernel, whatever is live in it. All values in bytes.
/// Compared with live malloc bytes it shows retention and fragmentation.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct AllocatorFootprint {
    /// Program break heap: current break − start of the heap (from brk events and
    /// /proc/PID/stat start_brk); only the growth since attach is certain to be the allocator's.
    pub heap_bytes: u64,
    /// Resident part of the brk heap (pagemap).
    pub heap_resident_bytes: u64,
    /// Anonymous mappings made inside allocator calls since attach (arenas, large chunks).
    pub mmap_bytes: u64,
    /// Resident part of those mappings (pagemap), outside the arena heaps and block regions
    /// below.
    pub mmap_resident_bytes: u64,
    /// glibc non-main arena heaps found in /proc/PID/maps at this checkpoint, whenever they were
    /// made (64 MiB-aligned anonymous reservations, see leaktrace's `mappings::glibc_arena_heaps`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub arena_heaps: u32,
    /// Their read-write bytes (the part of each 64 MiB reservation in use).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub arena_bytes: u64,
    /// Their resident bytes (pagemap).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub arena_resident_bytes: u64,
    /// Other anonymous mappings found to hold blocks the allocator returned since attach (the
    /// pages where they began, freed ones included), whenever the mappings were made: jemalloc's extents, mimalloc's segments, tcmalloc's
    /// spans when it maps (see leaktrace's `mappings::block_regions`); neither the brk heap nor
    /// the arena heaps above.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub block_regions: u32,
    /// Their mapped bytes.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub block_region_bytes: u64,
    /// Their resident bytes (pagemap), off-heap regions in them left out.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub block_region_resident_bytes: u64,
    /// Large anonymous mappings nothing else claims (no block began in them since attach, not
    /// traced, not a thread stack, at least 1 MiB), counted as the allocator's when its malloc is
    /// jemalloc, mimalloc or tcmalloc and no managed runtime runs: memory it held from before
    /// attach (see leaktrace's `mappings::unclaimed_regions`). Likely, not certain: the program's
    /// own mappings made before attach look the same.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub unclaimed_regions: u32,
    /// Their mapped bytes.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub unclaimed_region_bytes: u64,
    /// Their resident bytes (pagemap).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub unclaimed_region_resident_bytes: u64,
    /// glibc's own figure: Σ `system_mem` of its arenas (bytes they obtained from the system,
    /// resident or not; large chunks served by mmap not included), read from the arena headers
    /// (`main_arena` and its `next` list, leaktrace's `reach::arena_stats`); 0 when not read (another allocator,
    /// no `main_arena` symbol: the recording's warnings say why).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub glibc_system_mem_bytes: u64,
    /// Arenas counted in `glibc_system_mem_bytes`.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub glibc_arenas: u32,
    /// glibc's free bytes in those arenas (their top chunks and the chunks in their bins, read
    /// from the same headers; fastbins and tcaches count as in use): `glibc_system_mem_bytes` −
    /// this is what glibc has in use. 0 when not read (no `main_arena`, or a bin that could not be
    /// followed at this checkpoint).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub glibc_free_bytes: u64,
}

fn is_zero<T: Default + PartialEq>(v: &T) -> bool {
    *v == T::default()
}

impl AllocatorFootprint {
    /// Resident bytes held by the allocator: brk heap, arena heaps, the mappings holding its
    /// blocks, the unclaimed mappings counted as its, and its other mappings.
    pub fn resident_bytes(&self) -> u64 {
        self.heap_resident_bytes
            + self.arena_resident_bytes
            + self.block_region_resident_bytes
            + self.unclaimed_region_resident_bytes
            + self.mmap_resident_bytes
    }
}

impl Recording {
    /// Share equal frames between stacks (one `Arc` per distinct frame), as the recorder does:
    /// a recording read from JSON has a copy of each frame per stack. Returns the number of
    /// distinct frames.
    pub fn intern_frames(&mut self) -> usize {
        let mut seen: std::collections::HashSet<Arc<Frame>> = std::collections::HashSet::new();
        for st in &mut self.stacks {
            for f in &mut st.frames {
                match seen.get(f) {
                    Some(k) => *f = Arc::clone(k),
                    None => {
                        seen.insert(Arc::clone(f));
                    }
                }
            }
        }
        seen.len()
    }

    /// Check what the JSON's shape cannot: every number of seconds finite and not negative,
    /// checkpoints in time order, stack ids unique, every site sample, reachability site and
    /// stack reference naming a stack of the recording, and no site freeing more bytes than it
    /// allocated (free counts may exceed alloc counts: a mapping unmapped in pieces is freed
    /// more than once). Errors: the first inconsistency, one line.
    pub fn validate(&self) -> anyhow::Result<()> {
        fn seconds(what: &str, x: f64) -> anyhow::Result<()> {
            anyhow::ensure!(x.is_finite() && x >= 0.0, "{what} is {x}, not a finite number of seconds >= 0");
            Ok(())
        }
        seconds("interval_s", self.interval_s)?;
        let mut ids = std::collections::BTreeSet::new();
        for st in &self.stacks {
            anyhow::ensure!(ids.insert(st.id), "stack id {} appears twice", st.id);
        }
        let mut last = 0.0f64;
        for (i, cp) in self.checkpoints.iter().enumerate() {
            seconds(&format!("checkpoint {i}'s t_s"), cp.t_s)?;
            anyhow::ensure!(cp.t_s >= last, "checkpoint {i} is at {} s, before the one before it ({last} s)", cp.t_s);
            last = cp.t_s;
            for site in &cp.sites {
                anyhow::ensure!(
                    ids.contains(&site.stack),
                    "checkpoint {i} refers to stack {}, which the recording does not have",
                    site.stack
                );
                anyhow::ensure!(
                    site.free_bytes <= site.alloc_bytes,
                    "checkpoint {i}: stack {} freed {} bytes but allocated only {}",
                    site.stack,
                    site.free_bytes,
                    site.alloc_bytes
                );
            }
        }
        if let Some(r) = &self.reachability {
            seconds("reachability t_s", r.t_s)?;
            anyhow::ensure!(r.pause_ms.is_finite() && r.pause_ms >= 0.0, "reachability pause_ms is {}", r.pause_ms);
            for site in &r.sites {
                anyhow::ensure!(
                    ids.contains(&site.stack),
                    "the reachability scan refers to stack {}, which the recording does not have",
                    site.stack
                );
            }
        }
        Ok(())
    }
}
