//! HotSpot JVM (checked on OpenJDK 17, Serial and G1 collectors).
//!
//! - Managed: the Java heap, measured by the JVM itself: used and committed bytes per
//!   generation and space from its hsperfdata file (the PerfData shared memory that jstat reads,
//!   `/tmp/hsperfdata_<user>/<pid as the JVM sees it>`), sampled at every checkpoint. The
//!   mappings that commit the heap (libjvm frames of the heap and the collectors) are managed
//!   sites too, but the series comes from the gauge.
//! - Off-heap: `Unsafe.allocateMemory` — direct ByteBuffers and every library that uses Unsafe —
//!   reaches malloc through `Unsafe_AllocateMemory0` → `os::malloc` (libjvm is built with frame
//!   pointers, so the frames are there).
//! - Runtime: any other malloc or mapping from libjvm or from the JDK's own native libraries
//!   (libjava, libzip, libnio, ...): the JVM's native memory (metaspace, code cache, GC data
//!   structures, thread stacks, compiler arenas) — what `-XX:NativeMemoryTracking` reports.
//! - Native: malloc from any other library — JNI code — and malloc by libjvm inside a JNI
//!   function (`jni_*`) called by such a library (`GetStringUTFChars`'s copy): a runtime-wrapper
//!   allocation made for a non-runtime library is that library's.
//!
//! PerfData layout (OpenJDK `runtime/perfMemory.hpp`): a prologue {magic 0xcafec0c0 as bytes
//! CA FE C0 C0; byte_order (0 big, 1 little); major, minor; accessible; used; overflow;
//! mod_time_stamp (8 bytes); entry_offset; num_entries}, then `num_entries` entries {entry_length,
//! name_offset, vector_length, data_type, flags, data_units, data_variability, data_offset},
//! with the NUL-terminated name and the data at the given offsets from the entry's start.
//! Units (`perfData.hpp`): 1 none, 2 bytes, 3 ticks, 4 events, 5 string, 6 hertz.

use super::{MemoryKind, callers, first_caller, function, is_thread_stack, object_name};
use crate::recording::{Frame, Stack, StackKind};

/// Functions of libjvm that commit or manage the Java heap (substrings).
const HEAP_CODE: &[&str] = &[
    "ReservedHeapSpace",
    "Universe::reserve_heap",
    "Generation",
    "CollectedHeap",
    "G1",
    "PSVirtualSpace",
    "PSOldGen",
    "PSYoungGen",
    "MutableSpace",
    "ParallelScavengeHeap",
    "Shenandoah",
    "ZPhysicalMemory",
    "ZPageAllocator",
    "HeapRegion",
    "CardTable",
    "MarkBitMap",
];

/// Names of the JDK's own native libraries (besides libjvm), for installs outside /lib/jvm/.
const JDK_LIBS: &[&str] = &[
    "libjava.so",
    "libjimage.so",
    "libzip.so",
    "libnio.so",
    "libnet.so",
    "libverify.so",
    "libmanagement.so",
    "libmanagement_ext.so",
    "libjsig.so",
    "libextnet.so",
    "libsctp.so",
    "libinstrument.so",
    "libprefs.so",
    "librmi.so",
    "libattach.so",
    "libjdwp.so",
    "libdt_socket.so",
    "libj2pkcs11.so",
    "libj2gss.so",
    "libsyslookup.so",
    "libawt.so",
    "libawt_headless.so",
    "libawt_xawt.so",
    "libfontmanager.so",
    "liblcms.so",
    "libjavajpeg.so",
    "libmlib_image.so",
    "libsplashscreen.so",
    "libjsound.so",
    "libsaproc.so",
];

/// The os::malloc/os::realloc overloads that Unsafe's native methods call.
fn is_unsafe_wrapper(name: &str) -> bool {
    name == "os::malloc(unsigned long, MEMFLAGS)" || name == "os::realloc(void*, unsigned long, MEMFLAGS)"
}

/// Packages of the JDK's own classes: their JIT frames are the runtime's, not the program's.
const JDK_PACKAGES: &[&str] = &["java.", "javax.", "jdk.", "sun.", "com.sun."];

/// True for a JIT frame named from HotSpot's perf map (`jcmd PID Compiler.perfmap`: a compiled
/// method's external name, `RETURN_TYPE CLASS.METHOD(PARAMETER TYPES)`, e.g.
/// `void com.acme.Ledger.appendRecord(long)`) whose class is the program's, not the JDK's
/// ([`JDK_PACKAGES`]). The perf map's other entries (`Interpreter`, `StubRoutines (1)`, adapters)
/// are not methods.
pub fn is_user_java_frame(f: &Frame) -> bool {
    if f.object.is_some() || f.kind != crate::recording::FrameKind::Native {
        return false;
    }
    let Some((_ret, method)) = f.function.as_deref().and_then(|n| n.split_once(' ')) else { return false };
    let Some((path, params)) = method.split_once('(') else { return false };
    let Some((class, name)) = path.rsplit_once('.') else { return false };
    params.ends_with(')')
        && !class.is_empty()
        && !name.is_empty()
        && !class.contains(' ')
        && !JDK_PACKAGES.iter().any(|p| class.starts_with(p))
}

/// A perf-map method name without its return type: `DirectHolds.frame(int, long)` for
/// `java.nio.ByteBuffer DirectHolds.frame(int, long)`.
fn java_method(f: &Frame) -> &str {
    let n = function(f);
    n.split_once(' ').filter(|(_, m)| m.contains('(')).map_or(n, |(_, m)| m)
}

/// Who allocated an off-heap block, in Java: the first of the program's Java methods on the
/// stack (JIT code named from the perf map), past libjvm's allocator frames and the JDK's own
/// classes (`Unsafe.allocateMemory`, `DirectByteBuffer.<init>`, `Bits.reserveMemory`,
/// `ByteBuffer.allocateDirect`), with its caller when that is the program's Java too:
/// `DirectHolds.frame(int, long) ← DirectHolds.main(java.lang.String[])`. None when no Java
/// method of the program is named (no perf map, or only interpreted frames).
pub fn java_allocated_by(stack: &Stack) -> Option<String> {
    let i = stack.frames.iter().position(|f| is_user_java_frame(f))?;
    let by = java_method(&stack.frames[i]);
    Some(match stack.frames.get(i + 1).filter(|f| is_user_java_frame(f)) {
        Some(caller) => format!("{by} ← {}", java_method(caller)),
        None => by.to_string(),
    })
}

/// A better name than the innermost frame for a site of `kind` (e.g. the Unsafe entry point
/// rather than os::malloc; the program's Java method that called Unsafe, when the stack has it).
pub fn site_label(kind: MemoryKind, stack: &Stack) -> Option<String> {
    if kind != MemoryKind::OffHeap || stack.kind != StackKind::Malloc {
        return None;
    }
    if let Some(f) = stack.frames.iter().find(|f| is_user_java_frame(f)) {
        return Some(format!("{} (Unsafe.allocateMemory)", function(f)));
    }
    match callers(stack).find(|f| function(f).starts_with("Unsafe_")) {
        Some(f) => Some(format!("{} (Unsafe.allocateMemory: direct buffers)", function(f))),
        None => Some("Unsafe.allocateMemory (direct buffers; stack lost after os::malloc)".to_string()),
    }
}

/// True for a frame of libjvm or of the JDK's own native libraries (by name, or installed under a
/// `/lib/jvm/` directory).
pub(crate) fn is_jvm_code(f: &Frame) -> bool {
    let o = object_name(f);
    o == "libjvm.so" || JDK_LIBS.contains(&o) || f.object.as_deref().is_some_and(|p| p.contains("/lib/jvm/"))
}

/// The JVM's rules (None: the default for the site's kind).
pub fn classify(stack: &Stack) -> Option<MemoryKind> {
    match stack.kind {
        StackKind::Malloc => {
            if callers(stack).take(8).any(|f| {
                let n = function(f);
                n.starts_with("Unsafe_AllocateMemory") || n.starts_with("Unsafe_ReallocateMemory")
            }) {
                return Some(MemoryKind::OffHeap);
            }
            if super::native_interface_caller(&stack.frames).is_some() {
                // JNI code's memory allocated by libjvm on its behalf (GetStringUTFChars,
                // GetByteArrayElements copies, ...): the JNI library's, not the JVM's own.
                return Some(MemoryKind::Native);
            }
            let f = first_caller(stack)?;
            if stack.lost && is_unsafe_wrapper(function(f)) {
                // Only the direct caller is known. The two-argument os::malloc (os::realloc) with
                // the three-argument one inlined is what Unsafe_AllocateMemory0
                // (Unsafe_ReallocateMemory0) calls; few other callers use it. Stacks are lost
                // when the walk runs into JIT code without frame pointers
                // (-XX:+PreserveFramePointer keeps most of them).
                return Some(MemoryKind::OffHeap);
            }
            Some(if is_jvm_code(f) { MemoryKind::Runtime } else { MemoryKind::Native })
        }
        StackKind::Mmap => {
            if is_thread_stack(stack) {
                // Every Java thread and every JVM thread is created by libjvm (os::create_thread);
                // the walk rarely gets past glibc's pthread_create, which has no frame pointers.
                return Some(MemoryKind::Runtime);
            }
            let f = first_caller(stack)?;
            if !is_jvm_code(f) {
                return None;
            }
            if callers(stack).take(12).any(|f| HEAP_CODE.iter().any(|h| function(f).contains(h))) {
                Some(MemoryKind::Managed)
            } else {
                Some(MemoryKind::Runtime)
            }
        }
        _ => None,
    }
}

/// HotSpot's rules ([`super::RuntimeRules`]).
pub struct Jvm;

impl super::RuntimeRules for Jvm {
    fn classify(&self, stack: &Stack) -> Option<MemoryKind> {
        classify(stack)
    }

    fn site_label(&self, kind: MemoryKind, stack: &Stack) -> Option<String> {
        site_label(kind, stack)
    }

    fn heap_name(&self) -> &'static str {
        "Java heap"
    }

    fn kind_origin(&self, kind: MemoryKind) -> &'static str {
        match kind {
            MemoryKind::Native => "JNI code",
            MemoryKind::OffHeap => "direct buffers / Unsafe",
            MemoryKind::Runtime => "the JVM's own native memory",
            MemoryKind::Managed => "managed heap",
        }
    }

    fn heap_tool(&self) -> &'static str {
        "a class histogram (jcmd PID GC.class_histogram) or a heap dump shows which objects"
    }

    fn managed_from_sites(&self) -> &'static str {
        "its sites: Java heap pages resident"
    }

    /// A JIT frame of the program's own classes named from HotSpot's perf map
    /// ([`is_user_java_frame`]).
    fn is_program_code_frame(&self, f: &Frame) -> bool {
        f.object.is_none() && is_user_java_frame(f)
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{LIBC, fr, st};
    use super::*;

    const JVM: &str = "/usr/lib/jvm/java-17-openjdk-amd64/lib/server/libjvm.so";

    #[test]
    fn rules() {
        let direct = st(
            "malloc",
            &[
                ("__GI___libc_malloc", LIBC),
                ("os::malloc(unsigned long, MEMFLAGS)", JVM),
                ("Unsafe_AllocateMemory0", JVM),
            ],
        );
        assert_eq!(classify(&direct), Some(MemoryKind::OffHeap));
        let own = st(
            "malloc",
            &[
                ("malloc", LIBC),
                ("os::malloc(unsigned long, MEMFLAGS, NativeCallStack const&)", JVM),
                ("Arena::grow", JVM),
            ],
        );
        assert_eq!(classify(&own), Some(MemoryKind::Runtime));
        let zip = st(
            "malloc",
            &[
                ("malloc", LIBC),
                ("Java_java_util_zip_Inflater_init", "/usr/lib/jvm/java-17-openjdk-amd64/lib/libzip.so"),
            ],
        );
        assert_eq!(classify(&zip), Some(MemoryKind::Runtime));
        let jni = st("malloc", &[("malloc", LIBC), ("Java_com_acme_Codec_decode", "/opt/app/libcodec.so")]);
        assert_eq!(classify(&jni), Some(MemoryKind::Native));
        // GetStringUTFChars's copy, malloc'd by libjvm's wrapper for a JNI library: native, and
        // the JNI function is the culprit; the same call from the JDK's libjava is the JVM's.
        let wrapped = |caller: (&'static str, &'static str)| {
            st(
                "malloc",
                &[
                    ("__GI___libc_malloc", LIBC),
                    ("os::malloc(unsigned long, MEMFLAGS, NativeCallStack const&)", JVM),
                    ("AllocateHeap(unsigned long, MEMFLAGS, AllocFailStrategy::AllocFailEnum)", JVM),
                    ("jni_GetStringUTFChars", JVM),
                    caller,
                    ("", ""),
                ],
            )
        };
        let mine = wrapped(("Java_JniLeak_parse", "/tmp/app/libjnileak.so"));
        assert_eq!(classify(&mine), Some(MemoryKind::Native));
        assert_eq!(crate::analyze::culprit(&mine), (Some(4), "Java_JniLeak_parse".to_string()));
        let stripped = wrapped(("", "/usr/lib/x86_64-linux-gnu/jni/libcodec.so"));
        assert_eq!(classify(&stripped), Some(MemoryKind::Native));
        assert_eq!(crate::analyze::culprit(&stripped).0, Some(4));
        let jdk =
            wrapped(("Java_java_io_UnixFileSystem_canonicalize0", "/usr/lib/jvm/java-17-openjdk-amd64/lib/libjava.so"));
        assert_eq!(classify(&jdk), Some(MemoryKind::Runtime));
        assert_eq!(crate::analyze::culprit(&jdk).0, Some(1));
        let heap = st(
            "mmap",
            &[
                ("__GI___mmap64", LIBC),
                ("os::pd_commit_memory(char*, unsigned long, unsigned long, bool)", JVM),
                ("VirtualSpace::expand_by(unsigned long, bool)", JVM),
                ("CardGeneration::grow_by(unsigned long)", JVM),
            ],
        );
        assert_eq!(classify(&heap), Some(MemoryKind::Managed));
        let code = st(
            "mmap",
            &[
                ("__GI___mmap64", LIBC),
                ("os::pd_reserve_memory(unsigned long, bool)", JVM),
                ("CodeCache::initialize_heaps()", JVM),
            ],
        );
        assert_eq!(classify(&code), Some(MemoryKind::Runtime));
        let thread = st("mmap", &[("__GI___mmap64", LIBC), ("allocate_stack", LIBC), ("__pthread_create_2_1", LIBC)]);
        assert_eq!(classify(&thread), Some(MemoryKind::Runtime));
        let mut lost = st("malloc", &[("os::malloc(unsigned long, MEMFLAGS)", JVM)]);
        lost.lost = true;
        assert_eq!(classify(&lost), Some(MemoryKind::OffHeap));
        assert!(site_label(MemoryKind::OffHeap, &lost).unwrap().contains("Unsafe.allocateMemory"));
        assert_eq!(
            site_label(MemoryKind::OffHeap, &direct).as_deref(),
            Some("Unsafe_AllocateMemory0 (Unsafe.allocateMemory: direct buffers)")
        );
    }

    /// A JIT frame named from a perf map (no object).
    fn jit(name: &str) -> Frame {
        Frame { addr: 0x7f00_0000_1000, function: Some(name.into()), ..Default::default() }
    }

    #[test]
    fn java_frames_from_the_perf_map() {
        assert!(is_user_java_frame(&jit("void Ledger.appendRecord(long)")));
        assert!(is_user_java_frame(&jit("java.lang.Object com.acme.Cache$Entry.load(java.lang.String, int)")));
        assert!(!is_user_java_frame(&jit("long jdk.internal.misc.Unsafe.allocateMemory0(long)")));
        assert!(!is_user_java_frame(&jit("void java.util.ArrayList.add(java.lang.Object)")));
        assert!(!is_user_java_frame(&jit("Interpreter")));
        assert!(!is_user_java_frame(&jit("StubRoutines (1)")));
        assert!(!is_user_java_frame(&jit("JS:*step /srv/app.js:10")));
        assert!(
            !is_user_java_frame(&fr("void Ledger.appendRecord(long)", JVM)),
            "a frame with an object is not JIT code"
        );
        // Unsafe.allocateMemory from the program's method: off-heap, named after that method.
        let mut s = st(
            "malloc",
            &[
                ("malloc", LIBC),
                ("os::malloc(unsigned long, MEMFLAGS, NativeCallStack const&)", JVM),
                ("os::malloc(unsigned long, MEMFLAGS)", JVM),
                ("Unsafe_AllocateMemory0", JVM),
            ],
        );
        s.frames.push(jit("long jdk.internal.misc.Unsafe.allocateMemory0(long)").into());
        s.frames.push(jit("void Ledger.appendRecord(long)").into());
        s.frames.push(jit("Interpreter").into());
        assert_eq!(java_allocated_by(&s).as_deref(), Some("Ledger.appendRecord(long)"));
        assert_eq!(classify(&s), Some(MemoryKind::OffHeap));
        assert_eq!(crate::analyze::culprit(&s), (Some(5), "void Ledger.appendRecord(long)".to_string()));
        assert_eq!(
            site_label(MemoryKind::OffHeap, &s).as_deref(),
            Some("void Ledger.appendRecord(long) (Unsafe.allocateMemory)")
        );
    }

    /// A direct buffer allocated by the program's method through the JDK's classes (the
    /// ByteBuffer.allocateDirect frame inlined, as C1 does): named after the program's method
    /// and its Java caller, past libjvm and the JDK; no program method named: None.
    #[test]
    fn direct_buffers_are_allocated_by_the_programs_java_method() {
        let mut s = st(
            "malloc",
            &[
                ("__GI___libc_malloc", LIBC),
                ("os::malloc(unsigned long, MEMFLAGS)", JVM),
                ("Unsafe_AllocateMemory0", JVM),
            ],
        );
        for n in [
            "long jdk.internal.misc.Unsafe.allocateMemory0(long)",
            "Interpreter",
            "void java.nio.DirectByteBuffer.<init>(int)",
            "java.nio.ByteBuffer DirectHolds.frame(int, long)",
        ] {
            s.frames.push(jit(n).into());
        }
        let jdk_only = s.clone();
        s.frames.push(jit("void DirectHolds.main(java.lang.String[])").into());
        assert_eq!(
            java_allocated_by(&s).as_deref(),
            Some("DirectHolds.frame(int, long) ← DirectHolds.main(java.lang.String[])")
        );
        let mut interpreted_main = jdk_only.clone();
        interpreted_main.frames.push(jit("Interpreter").into());
        assert_eq!(java_allocated_by(&interpreted_main).as_deref(), Some("DirectHolds.frame(int, long)"));
        let mut no_program = jdk_only;
        no_program.frames.pop();
        assert_eq!(java_allocated_by(&no_program), None);
    }
}
