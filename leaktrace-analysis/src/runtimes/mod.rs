//! Managed runtimes (Python, JVM, Go, Node): the rules that tell the runtime's managed heap
//! apart from native allocations and off-heap mappings, as pure functions of a recorded stack.
//!
//! Runtime knowledge lives here, in one module per runtime, not in conditionals across the code:
//! each module's value implements [`RuntimeRules`], and [`rules`] finds it.
//! Detection (which runtime a live target runs, its heap gauge) is the recorder's job, in
//! `leaktrace::runtimes`. Site classification ([`classify_site`]) is applied at analysis time, so
//! `leaktrace report DIR` redoes it. The rules, and how each was checked on a real runtime, are
//! written down in `docs/runtimes.md`.
//!
//! Frames: `frames[0]` is inside the allocator (or libc's mmap), `frames[1]` is the direct caller
//! (read at the stack pointer on entry: always right), deeper frames come from a frame-pointer
//! walk that may stop early or be wrong in code built without frame pointers (libpython, cgo's C
//! wrappers). Every rule therefore decides on the nearest frames it can.

use crate::allocator_frames::is_allocator_frame;
use crate::recording::{Frame, Runtime, Stack, StackKind};
use std::sync::Arc;

pub mod go;
pub mod jvm;
pub mod node;
pub mod python;
#[cfg(test)]
pub mod toy;

/// What kind of memory a site holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum MemoryKind {
    /// The runtime's managed heap (Python objects, Java heap, Go heap, V8 heap).
    Managed,
    /// malloc-family allocations from native code (C extensions, JNI, cgo, addons, plain C).
    Native,
    /// Memory outside the allocator and the managed heap: anonymous mappings, direct buffers,
    /// ArrayBuffer backing stores.
    OffHeap,
    /// The runtime's own bookkeeping (JVM's native memory, interpreter internals).
    Runtime,
}

impl MemoryKind {
    /// Name used in reports: "managed", "native", "off-heap", "runtime".
    pub fn as_str(self) -> &'static str {
        match self {
            MemoryKind::Managed => "managed",
            MemoryKind::Native => "native",
            MemoryKind::OffHeap => "off-heap",
            MemoryKind::Runtime => "runtime",
        }
    }
}

impl std::fmt::Display for MemoryKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One managed runtime's rules, the analysis' whole knowledge of it: which memory a recorded
/// stack holds, what to call it, and the words the verdict and the reports use. One value per
/// runtime, in the runtime's own module ([`python::Python`], [`jvm::Jvm`], [`go::Go`],
/// [`node::Node`]); [`rules`] finds it. A new runtime is one module implementing this trait and
/// its line in [`rules`] (with its `Runtime` variant in recording.rs).
pub trait RuntimeRules: Sync {
    /// The kind of memory a site of this runtime holds, from its stack; None: the default for
    /// the site's kind (mappings off-heap, the rest native). The rules every runtime shares
    /// (glibc's arenas, the loader's mappings) are applied before, by [`classify_site`].
    fn classify(&self, stack: &Stack) -> Option<MemoryKind>;

    /// What the stacks say together, after each was classified ([`classify_sites`]): `kinds[i]`
    /// is `stacks[i]`'s kind, changed in place. By default nothing.
    fn classify_together(&self, _stacks: &[Stack], _kinds: &mut [MemoryKind]) {}

    /// A better label than the culprit frame for a site of `kind` (None: the culprit frame).
    fn site_label(&self, _kind: MemoryKind, _stack: &Stack) -> Option<String> {
        None
    }

    /// True for the runtime's bookkeeping of its managed heap's pages ([`follows_managed_heap`]).
    fn follows_managed_heap(&self, _frames: &[Arc<Frame>]) -> bool {
        false
    }

    /// Human name of the managed heap ("Python heap", "Java heap", ...).
    fn heap_name(&self) -> &'static str;

    /// What memory of `kind` usually is in this runtime, for verdicts ("C extension").
    fn kind_origin(&self, kind: MemoryKind) -> &'static str;

    /// What one site's memory of `kind` is, in words ([`site_origin`]); by default
    /// [`RuntimeRules::kind_origin`].
    fn site_origin(
        &self,
        kind: MemoryKind,
        _frames: &[Arc<Frame>],
        _extensions: &std::collections::HashSet<String>,
    ) -> String {
        self.kind_origin(kind).to_string()
    }

    /// Where to look for what holds a growing managed heap (leaktrace sees the runtime's
    /// allocator, not the code that keeps the objects reachable): the runtime's own tool.
    fn heap_tool(&self) -> &'static str;

    /// What the managed heap's figure is when it comes from the sites (no gauge of the runtime's
    /// own): "its sites: V8 heap pages resident".
    fn managed_from_sites(&self) -> &'static str;

    /// Culprit rules ([`crate::analyze::culprit`]), read for every stack whatever the target's
    /// runtime: true for a frame of the program's own code that this runtime names (a JIT
    /// frame from its perf map, an interpreter's frame of the program): memory the runtime
    /// allocated for that code is that frame's. By default none.
    fn is_program_code_frame(&self, _f: &Frame) -> bool {
        false
    }

    /// Culprit rules: true for a frame of this runtime's garbage collector. A page the collector
    /// maps holds what survived, not what the function that triggered the collection allocated:
    /// no program frame beyond it names the stack. By default none.
    fn is_collector_frame(&self, _f: &Frame) -> bool {
        false
    }

    /// Culprit rules: when `frames[first]`, the culprit's first candidate, is this runtime's
    /// bridge to C code (cgo's own malloc for `C.CString`), the index of the runtime's function
    /// that called through it (`nameable`: the frames that can be named). By default None.
    fn bridge_caller(
        &self,
        _frames: &[Arc<Frame>],
        _first: usize,
        _nameable: &dyn Fn(&Frame) -> bool,
    ) -> Option<usize> {
        None
    }

    /// Culprit rules: true when `f`, the first frame outside the allocator of a malloc stack,
    /// is this runtime's code allocating for a caller through its C API (CPython's
    /// `PyBytes_FromStringAndSize`): a native extension's frame met before the program's frame
    /// is then the culprit (the object it made and never released). By default none.
    fn is_allocating_api_frame(&self, _f: &Frame) -> bool {
        false
    }
}

/// Every runtime's rules, in [`Runtime::ALL`]'s order: the culprit rules read them all, since a
/// stack's frames say whose code they are whatever runtime the target was detected to run.
pub fn all() -> impl Iterator<Item = &'static dyn RuntimeRules> {
    Runtime::ALL.iter().map(|&rt| rules(rt))
}

/// The rules of `runtime`: the one place where the runtimes are registered.
pub fn rules(runtime: Runtime) -> &'static dyn RuntimeRules {
    match runtime {
        Runtime::Python => &python::Python,
        Runtime::Jvm => &jvm::Jvm,
        Runtime::Go => &go::Go,
        Runtime::Node => &node::Node,
        #[cfg(test)]
        Runtime::Toy => &toy::Toy,
    }
}

/// Classify a recorded site of a target running `runtime` (None: a native program).
pub fn classify_site(runtime: Option<Runtime>, stack: &Stack) -> MemoryKind {
    if stack.kind == StackKind::Mmap && is_malloc_arena_mapping(stack) {
        // glibc's own arenas, mapped inside free() (tcache set-up on a thread's first call),
        // where no allocator call is in flight: what lives there is counted at malloc sites.
        return MemoryKind::Runtime;
    }
    if stack.kind == StackKind::Mmap && is_loader_mapping(stack) {
        // The dynamic loader's own mappings: zero-filled .bss of the objects it loads
        // (_dl_map_segments under _dl_map_object), its start-up allocator (__minimal_malloc).
        // Made once per loaded object, whatever the runtime: not the program's off-heap memory.
        return MemoryKind::Runtime;
    }
    let rule = runtime.and_then(|rt| rules(rt).classify(stack));
    rule.unwrap_or(match stack.kind {
        StackKind::Mmap => MemoryKind::OffHeap,
        _ => MemoryKind::Native,
    })
}

/// Classify every recorded site of a target running `runtime` ([`classify_site`] for each), with
/// what the stacks say together: in a Python target whose arena function has no name (Debian's
/// static python3.11), the call site that maps arenas is learnt from the stacks where an
/// allocator frame shows it ([`python::arena_call_sites`]), and every mapping made from that
/// call site is the Python heap's too (arenas mapped below an unnamed interpreter function).
pub fn classify_sites(runtime: Option<Runtime>, stacks: &[Stack]) -> Vec<MemoryKind> {
    let mut kinds: Vec<MemoryKind> = stacks.iter().map(|st| classify_site(runtime, st)).collect();
    if let Some(rt) = runtime {
        rules(rt).classify_together(stacks, &mut kinds);
    }
    kinds
}

/// A better label than the culprit frame for a site of `kind`, where a runtime knows one (the
/// JVM's Unsafe entry point instead of os::malloc). None: the culprit frame is the label.
pub fn site_label(runtime: Option<Runtime>, kind: MemoryKind, stack: &Stack) -> Option<String> {
    runtime.and_then(|rt| rules(rt).site_label(kind, stack))
}

/// True for the runtime's bookkeeping of its managed heap's pages, allocated once per page the
/// heap maps (Node: a stack through `v8::internal::MemoryAllocator::AllocatePage`, e.g. V8's
/// per-page free-list categories): it grows and levels off with the heap, and is judged with it.
pub fn follows_managed_heap(runtime: Runtime, frames: &[Arc<Frame>]) -> bool {
    rules(runtime).follows_managed_heap(frames)
}

/// Human name of a runtime's managed heap ("Python heap", "Java heap", ...).
pub fn heap_name(runtime: Runtime) -> &'static str {
    rules(runtime).heap_name()
}

/// What native and off-heap memory usually is in a runtime, for verdicts ("C extension").
pub fn kind_origin(runtime: Runtime, kind: MemoryKind) -> &'static str {
    match kind {
        MemoryKind::Managed => "managed heap",
        _ => rules(runtime).kind_origin(kind),
    }
}

/// What a site's memory is in a runtime, in words, for the verdict and report.md ("C extension",
/// "libc.so.6 via ctypes"): [`kind_origin`], except a Python target's native memory, named from
/// the site's stack ([`python::native_origin`]: a system library called through ctypes is not a
/// C extension). `extensions`: paths of the objects the recorder saw export a `PyInit_*`
/// function.
pub fn site_origin(
    runtime: Runtime,
    kind: MemoryKind,
    frames: &[Arc<Frame>],
    extensions: &std::collections::HashSet<String>,
) -> String {
    rules(runtime).site_origin(kind, frames, extensions)
}

// ----------------------------------------------------------------------------------------------
// Frame helpers shared by the per-runtime rules

/// Prefixes of a managed runtime's native-interface functions, through which a program's native
/// library asks the runtime for memory on its behalf: HotSpot's JNI functions (`jni_GetStringUTFChars`,
/// `jni_NewGlobalRef`, ...) and Node's N-API (`napi_create_string_utf8`, ...).
const NATIVE_INTERFACE_ENTRIES: &[&str] = &["jni_", "napi_"];

/// Index of the native library's frame that called into a runtime's native interface
/// ([`NATIVE_INTERFACE_ENTRIES`]) on the way to this allocation: the frame right after an entry
/// frame of the runtime's own object, when it is nameable (function or object known) and is
/// neither the runtime's code (its executable, libjvm and the JDK's own libraries) nor allocator
/// code; the frames before the entry must all be allocator,
/// system or runtime code (the runtime's allocator wrapper: `os::malloc`, `AllocateHeap`).
/// A runtime-wrapper allocation made for a non-runtime library is that library's native memory
/// (a JNI library's `GetStringUTFChars` never released). None otherwise.
pub fn native_interface_caller(frames: &[Arc<Frame>]) -> Option<usize> {
    let inner = |f: &Frame| {
        f.function.is_none() && f.object.is_none()
            || crate::frame_origin::is_allocator(f)
            || crate::frame_origin::is_system_frame(f)
            || crate::frame_origin::is_runtime_frame(f)
    };
    for (i, f) in frames.iter().enumerate().take(16) {
        let entry = crate::frame_origin::is_runtime_frame(f)
            && f.function.as_deref().is_some_and(|n| NATIVE_INTERFACE_ENTRIES.iter().any(|p| n.starts_with(p)));
        if entry {
            let c = frames.get(i + 1)?;
            let nameable = c.function.as_deref().is_some_and(|n| !n.is_empty()) || c.object.is_some();
            // A JNI library may be installed in a system directory (Debian's /usr/lib/*/jni/);
            // the JDK's own libraries (libjava, libzip, ...) are the runtime's.
            let runtime_library = jvm::is_jvm_code(c);
            return (nameable
                && !runtime_library
                && !crate::frame_origin::is_runtime_frame(c)
                && !crate::frame_origin::is_allocator(c))
            .then_some(i + 1);
        }
        if !inner(f) {
            return None;
        }
    }
    None
}

/// Last path component of a frame's object ("" when unknown).
pub(crate) fn object_name(f: &Frame) -> &str {
    f.object.as_deref().map(|o| o.rsplit('/').next().unwrap_or(o)).unwrap_or("")
}

/// The frame's function name ("" when unknown).
pub(crate) fn function(f: &Frame) -> &str {
    f.function.as_deref().unwrap_or("")
}

/// The C library (glibc or musl) or the dynamic loader ([`crate::system_libs::is_system_library`]).
pub(crate) fn is_libc(f: &Frame) -> bool {
    crate::system_libs::is_system_library(object_name(f))
}

/// The dynamic loader (ld.so): mappings of loaded objects' .bss and its own allocations.
pub(crate) fn is_loader(f: &Frame) -> bool {
    crate::system_libs::is_loader(object_name(f))
}

/// The callers of the allocation, nearest first: every frame after frame 0 that is not an
/// allocator frame or wrapper (malloc, operator new, strdup, ...). For mmap sites libc frames
/// are kept (pthread_create, the allocator's arena code tell where a mapping comes from). A lost
/// stack holds only the direct caller, as its frame 0.
pub(crate) fn callers(stack: &Stack) -> impl Iterator<Item = &Frame> {
    let skip = if stack.lost { 0 } else { 1 };
    stack.frames.iter().skip(skip).map(|f| &**f).filter(|f| !f.function.as_deref().is_some_and(is_allocator_frame))
}

/// The nearest caller outside libc and the loader: the code that asked for the memory.
pub(crate) fn first_caller(stack: &Stack) -> Option<&Frame> {
    callers(stack).find(|f| !is_libc(f))
}

/// glibc malloc's own mappings (arena heaps), recognised by their nearest frames.
pub fn is_malloc_arena_mapping(stack: &Stack) -> bool {
    const ARENA: &[&str] = &["alloc_new_heap", "new_heap", "_int_new_arena", "arena_get2", "sysmalloc", "tcache_init"];
    callers(stack).take(3).any(|f| is_libc(f) && ARENA.contains(&function(f)))
}

/// A mapping made by the dynamic loader (ld.so), recognised by its nearest frames: the mmap
/// wrapper or a caller in ld.so (the loader has its own mmap), or the loader's mapping functions
/// by name (_dl_map_segments, _dl_map_object*, __minimal_malloc) where the object is unknown.
fn is_loader_mapping(stack: &Stack) -> bool {
    stack.frames.iter().take(4).any(|f| {
        let name = function(f);
        is_loader(f) || name == "__minimal_malloc" || name.starts_with("_dl_map_")
    })
}

/// A thread's memory made by the C library's thread creation: a thread stack (glibc's
/// `allocate_stack` under `pthread_create`, musl's `pthread_create`), or the per-thread block
/// pthread_create allocates (the TLS vector, `allocate_dtv` under `allocate_stack`): one of the
/// three nearest callers is libc's `allocate_stack`, `__pthread_create_2_1`, `__pthread_create`
/// or `pthread_create` (any symbol version).
pub fn is_thread_stack(stack: &Stack) -> bool {
    callers(stack).take(3).any(|f| {
        let name = function(f);
        is_libc(f)
            && (matches!(name, "allocate_stack" | "__pthread_create_2_1" | "__pthread_create")
                || name.split('@').next() == Some("pthread_create"))
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::recording::Recording;
    use crate::timeline::{Timeline, memory_by_kind};

    /// A frame of `function` in `object`.
    pub(crate) fn fr(function: &str, object: &str) -> Frame {
        Frame { addr: 0x1000, object: Some(object.into()), function: Some(function.into()), ..Default::default() }
    }

    /// A stack of `kind` with these (function, object) frames, innermost first.
    pub(crate) fn st(kind: &str, frames: &[(&str, &str)]) -> Stack {
        Stack {
            id: 1,
            kind: serde_json::from_value(serde_json::json!(kind)).expect("malloc, mmap or fault"),
            frames: frames.iter().map(|(f, o)| Arc::new(fr(f, o))).collect(),
            lost: false,
            truncated: None,
            shared: false,
        }
    }

    pub(crate) const LIBC: &str = "/usr/lib/x86_64-linux-gnu/libc.so.6";

    #[test]
    fn lost_stacks_are_classified_by_their_direct_caller() {
        let mut s = st("malloc", &[("_PyObject_Malloc", "/usr/lib/libpython3.11.so.1.0")]);
        s.lost = true;
        assert_eq!(classify_site(Some(Runtime::Python), &s), MemoryKind::Managed);
    }

    #[test]
    fn native_targets_keep_the_simple_rule() {
        let m = st("malloc", &[("malloc", LIBC), ("parse", "/usr/bin/app")]);
        assert_eq!(classify_site(None, &m), MemoryKind::Native);
        let o = st("mmap", &[("__GI___mmap64", LIBC), ("map_buffers", "/usr/bin/app")]);
        assert_eq!(classify_site(None, &o), MemoryKind::OffHeap);
    }

    #[test]
    fn glibc_arenas_mapped_inside_free_are_not_off_heap() {
        let s = st("mmap", &[("__GI___mmap64", LIBC), ("alloc_new_heap", LIBC)]);
        for rt in [None, Some(Runtime::Python), Some(Runtime::Jvm), Some(Runtime::Go), Some(Runtime::Node)] {
            assert_eq!(classify_site(rt, &s), MemoryKind::Runtime, "{rt:?}");
        }
    }

    #[test]
    fn loader_mappings_are_not_off_heap() {
        const LD: &str = "/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2";
        // .bss of a library loaded by dlopen: ld.so's own mmap, under _dl_map_segments.
        let bss = st(
            "mmap",
            &[("__mmap64", LD), ("_dl_map_segments", LD), ("_dl_map_object_from_fd", LD), ("_dl_map_object", LD)],
        );
        // The loader's start-up allocator.
        let minimal = st("mmap", &[("__mmap64", LD), ("__minimal_malloc", LD), ("_dl_important_hwcaps", LD)]);
        // Symbols only (object unknown).
        let mut named = st("mmap", &[("mmap64", ""), ("_dl_map_object_from_fd", "")]);
        for f in &mut named.frames {
            Arc::make_mut(f).object = None;
        }
        for rt in [None, Some(Runtime::Python), Some(Runtime::Jvm), Some(Runtime::Go), Some(Runtime::Node)] {
            for s in [&bss, &minimal, &named] {
                assert_eq!(classify_site(rt, s), MemoryKind::Runtime, "{rt:?}: {s:?}");
            }
        }
        // The program's own mapping, through libc, stays off-heap; a malloc site from the loader
        // is not a mapping.
        let own = st("mmap", &[("mmap64", LIBC), ("map_buffers", "/usr/bin/app"), ("main", "/usr/bin/app")]);
        assert_eq!(classify_site(None, &own), MemoryKind::OffHeap);
        let tls = st("malloc", &[("malloc", LIBC), ("_dl_allocate_tls", LD), ("pthread_create", LIBC)]);
        assert_eq!(classify_site(None, &tls), MemoryKind::Native);
    }

    #[test]
    fn series_use_resident_bytes_of_mappings() {
        use crate::recording::{Checkpoint, SiteSample};
        let mut rec: Recording = serde_json::from_value(serde_json::json!({
            "format_version": crate::recording::FORMAT_VERSION, "leaktrace_version": "t",
            "target": {"pid": 1, "command": [], "exe": "/usr/bin/python3.11", "launched": true,
                       "exit_status": null, "runtime": "python"},
            "mode": "exact", "started_unix_ms": 0, "interval_s": 1.0, "probes": [], "stacks": [],
            "checkpoints": [], "end_reason": "duration"
        }))
        .unwrap();
        let mut arena =
            st("mmap", &[("__GI___mmap64", LIBC), ("_PyObject_ArenaMmap", "/usr/lib/libpython3.11.so.1.0")]);
        arena.id = 1;
        let mut ext = st("malloc", &[("malloc", LIBC), ("parse_record", "/tmp/libx.so")]);
        ext.id = 2;
        rec.stacks = vec![arena, ext];
        for (t, res) in [(0.0, Some(4096u64)), (1.0, Some(8192)), (2.0, None)] {
            rec.checkpoints.push(Checkpoint {
                t_s: t,
                sites: vec![
                    SiteSample {
                        stack: 1,
                        alloc_bytes: 1 << 20,
                        alloc_count: 1,
                        resident_bytes: res,
                        ..Default::default()
                    },
                    SiteSample { stack: 2, alloc_bytes: 1000 * (t as u64 + 1), alloc_count: 1, ..Default::default() },
                ],
                ..Default::default()
            });
        }
        let k = memory_by_kind(&Timeline::new(&rec));
        assert_eq!(k.managed, vec![(0.0, 4096), (1.0, 8192), (2.0, 8192)]);
        assert_eq!(k.native, vec![(0.0, 1000), (1.0, 2000), (2.0, 3000)]);
        assert!(k.offheap.iter().all(|p| p.1 == 0));
    }
}
