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
//! - Native: malloc from any other library — JNI code.
//!
//! PerfData layout (OpenJDK `runtime/perfMemory.hpp`): a prologue {magic 0xcafec0c0 as bytes
//! CA FE C0 C0; byte_order (0 big, 1 little); major, minor; accessible; used; overflow;
//! mod_time_stamp (8 bytes); entry_offset; num_entries}, then `num_entries` entries {entry_length,
//! name_offset, vector_length, data_type, flags, data_units, data_variability, data_offset},
//! with the NUL-terminated name and the data at the given offsets from the entry's start.
//! Units (`perfData.hpp`): 1 none, 2 bytes, 3 ticks, 4 events, 5 string, 6 hertz.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::{HeapGauge, MemoryKind, RuntimeInfo, callers, file_name, first_caller, function, is_thread_stack, object_name};
use crate::discover::MappedObject;
use crate::recording::{Frame, ManagedHeap, Stack};

/// Detect a JVM: a mapped libjvm.so.
pub fn detect(pid: u32, objects: &[MappedObject]) -> Option<RuntimeInfo> {
    let jvm = objects.iter().find(|o| file_name(&o.path) == "libjvm.so")?;
    // <java.home>/lib/server/libjvm.so; <java.home>/release holds JAVA_VERSION="17.0.15".
    let version = jvm.path.parent().and_then(Path::parent).and_then(Path::parent).and_then(|home| {
        let root = PathBuf::from(format!("/proc/{pid}/root"));
        let release = std::fs::read_to_string(root.join(home.strip_prefix("/").unwrap_or(home)).join("release")).ok()?;
        release.lines().find_map(|l| l.strip_prefix("JAVA_VERSION=")).map(|v| v.trim_matches('"').to_string())
    });
    let mut notes = vec![format!(
        "JVM detected ({}): managed = Java heap used bytes from hsperfdata; off-heap = \
         Unsafe.allocateMemory (direct buffers); runtime = the JVM's own native memory; native = \
         JNI libraries",
        jvm.path.display()
    )];
    let cmdline = crate::procinfo::cmdline(pid);
    if cmdline.iter().any(|a| a == "-XX:-UsePerfData" || a == "-XX:+PerfDisableSharedMem") {
        notes.push(
            "the JVM runs with -XX:-UsePerfData or -XX:+PerfDisableSharedMem: no hsperfdata file, \
             so the Java heap is not measured (only its mappings are seen)"
                .into(),
        );
    }
    Some(RuntimeInfo { name: "jvm".into(), version, notes })
}

/// Functions of libjvm that commit or manage the Java heap (substrings).
const HEAP_CODE: &[&str] = &[
    "ReservedHeapSpace", "Universe::reserve_heap", "Generation", "CollectedHeap", "G1", "PSVirtualSpace",
    "PSOldGen", "PSYoungGen", "MutableSpace", "ParallelScavengeHeap", "Shenandoah", "ZPhysicalMemory",
    "ZPageAllocator", "HeapRegion", "CardTable", "MarkBitMap",
];

/// Names of the JDK's own native libraries (besides libjvm), for installs outside /lib/jvm/.
const JDK_LIBS: &[&str] = &[
    "libjava.so", "libjimage.so", "libzip.so", "libnio.so", "libnet.so", "libverify.so", "libmanagement.so",
    "libmanagement_ext.so", "libjsig.so", "libextnet.so", "libsctp.so", "libinstrument.so", "libprefs.so",
    "librmi.so", "libattach.so", "libjdwp.so", "libdt_socket.so", "libj2pkcs11.so", "libj2gss.so",
    "libsyslookup.so", "libawt.so", "libawt_headless.so", "libawt_xawt.so", "libfontmanager.so",
    "liblcms.so", "libjavajpeg.so", "libmlib_image.so", "libsplashscreen.so", "libjsound.so", "libsaproc.so",
];

/// The os::malloc/os::realloc overloads that Unsafe's native methods call.
fn is_unsafe_wrapper(name: &str) -> bool {
    name == "os::malloc(unsigned long, MEMFLAGS)" || name == "os::realloc(void*, unsigned long, MEMFLAGS)"
}

/// A better name than the innermost frame for a site of `kind` (e.g. the Unsafe entry point
/// rather than os::malloc).
pub fn site_label(kind: MemoryKind, stack: &Stack) -> Option<String> {
    if kind != MemoryKind::OffHeap || stack.kind != "malloc" {
        return None;
    }
    match callers(stack).find(|f| function(f).starts_with("Unsafe_")) {
        Some(f) => Some(format!("{} (Unsafe.allocateMemory: direct buffers)", function(f))),
        None => Some("Unsafe.allocateMemory (direct buffers; stack lost after os::malloc)".to_string()),
    }
}

fn is_jvm_code(f: &Frame) -> bool {
    let o = object_name(f);
    o == "libjvm.so" || JDK_LIBS.contains(&o) || f.object.as_deref().is_some_and(|p| p.contains("/lib/jvm/"))
}

/// The JVM's rules (None: the default for the site's kind).
pub fn classify(stack: &Stack) -> Option<MemoryKind> {
    match stack.kind.as_str() {
        "malloc" => {
            if callers(stack).take(8).any(|f| {
                let n = function(f);
                n.starts_with("Unsafe_AllocateMemory") || n.starts_with("Unsafe_ReallocateMemory")
            }) {
                return Some(MemoryKind::OffHeap);
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
        "mmap" => {
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

// ----------------------------------------------------------------------------------------------
// hsperfdata

/// One PerfData counter.
#[derive(Clone, Debug, PartialEq)]
pub enum PerfValue {
    Long(i64),
    Str(String),
}

/// Parse a PerfData buffer into name → value (longs and strings; other types are skipped).
/// None when the buffer is not PerfData or not yet accessible.
pub fn parse_perfdata(data: &[u8]) -> Option<BTreeMap<String, PerfValue>> {
    if data.len() < 32 || data[..4] != [0xca, 0xfe, 0xc0, 0xc0] {
        return None;
    }
    let little = match data[4] {
        0 => false,
        1 => true,
        _ => return None,
    };
    if data[7] == 0 {
        return None; // not accessible yet (the JVM is still initialising it)
    }
    let i32_at = |off: usize| -> Option<i32> {
        let b: [u8; 4] = data.get(off..off + 4)?.try_into().ok()?;
        Some(if little { i32::from_le_bytes(b) } else { i32::from_be_bytes(b) })
    };
    let i64_at = |off: usize| -> Option<i64> {
        let b: [u8; 8] = data.get(off..off + 8)?.try_into().ok()?;
        Some(if little { i64::from_le_bytes(b) } else { i64::from_be_bytes(b) })
    };
    let entry_offset = usize::try_from(i32_at(24)?).ok()?;
    let num_entries = usize::try_from(i32_at(28)?).ok()?;
    let mut out = BTreeMap::new();
    let mut off = entry_offset;
    for _ in 0..num_entries {
        let len = usize::try_from(i32_at(off)?).ok()?;
        if len < 20 || off + len > data.len() {
            break;
        }
        let name_off = usize::try_from(i32_at(off + 4)?).ok()?;
        let vector_len = usize::try_from(i32_at(off + 8)?).ok()?;
        let dtype = data[off + 12];
        let data_off = usize::try_from(i32_at(off + 16)?).ok()?;
        let name_bytes = data.get(off + name_off..off + len)?;
        let name_end = name_bytes.iter().position(|&b| b == 0).unwrap_or(name_bytes.len());
        let name = String::from_utf8_lossy(&name_bytes[..name_end]).into_owned();
        match (dtype, vector_len) {
            (b'J', 0) => {
                if let Some(v) = i64_at(off + data_off) {
                    out.insert(name, PerfValue::Long(v));
                }
            }
            (b'B', n) if n > 0 => {
                let raw = data.get(off + data_off..(off + data_off + n).min(off + len)).unwrap_or(&[]);
                let end = raw.iter().position(|&b| b == 0).unwrap_or(raw.len());
                out.insert(name, PerfValue::Str(String::from_utf8_lossy(&raw[..end]).into_owned()));
            }
            _ => {}
        }
        off += len;
    }
    Some(out)
}

/// The Java heap from PerfData counters: used = Σ `sun.gc.generation.N.space.M.used`, committed =
/// Σ `sun.gc.generation.N.capacity`, spaces by `generation name.space name` (e.g. "new.eden",
/// "old.old"). None without any space counter.
pub fn heap_from_counters(c: &BTreeMap<String, PerfValue>, source: &str) -> Option<ManagedHeap> {
    let long = |k: &str| match c.get(k) {
        Some(PerfValue::Long(v)) => Some((*v).max(0) as u64),
        _ => None,
    };
    let string = |k: &str| match c.get(k) {
        Some(PerfValue::Str(s)) => Some(s.clone()),
        _ => None,
    };
    let mut heap = ManagedHeap { source: source.to_string(), ..Default::default() };
    let mut any = false;
    for g in 0..4 {
        let gp = format!("sun.gc.generation.{g}");
        let Some(cap) = long(&format!("{gp}.capacity")) else { continue };
        heap.committed_bytes += cap;
        let gname = string(&format!("{gp}.name")).unwrap_or_else(|| g.to_string());
        for s in 0..8 {
            let sp = format!("{gp}.space.{s}");
            let Some(used) = long(&format!("{sp}.used")) else { continue };
            any = true;
            heap.used_bytes += used;
            let sname = string(&format!("{sp}.name")).unwrap_or_else(|| s.to_string());
            *heap.spaces.entry(format!("{gname}.{sname}")).or_default() += used;
        }
    }
    any.then_some(heap)
}

/// Reads the target JVM's hsperfdata file at every checkpoint. The file is found through the
/// target's own mappings (the JVM maps it), so it is the right one inside a container too, and
/// read through /proc/PID/map_files (or /proc/PID/root) even if /tmp was cleaned.
pub struct HsPerfGauge {
    pid: u32,
    /// (path the target maps, path to open).
    file: Option<(String, PathBuf)>,
}

impl HsPerfGauge {
    pub fn new(pid: u32) -> HsPerfGauge {
        HsPerfGauge { pid, file: None }
    }

    fn locate(&self) -> Option<(String, PathBuf)> {
        let maps = std::fs::read_to_string(format!("/proc/{}/maps", self.pid)).ok()?;
        for line in maps.lines() {
            let mut it = line.split_ascii_whitespace();
            let range = it.next()?;
            let path: String = it.skip(4).collect::<Vec<_>>().join(" ");
            if !path.contains("/hsperfdata_") {
                continue;
            }
            let path = path.trim_end_matches(" (deleted)").to_string();
            let candidates = [
                PathBuf::from(format!("/proc/{}/map_files/{range}", self.pid)),
                Path::new(&format!("/proc/{}/root", self.pid)).join(path.trim_start_matches('/')),
            ];
            if let Some(p) = candidates.into_iter().find(|p| p.exists()) {
                return Some((path, p));
            }
        }
        None
    }
}

impl HeapGauge for HsPerfGauge {
    fn sample(&mut self) -> Option<ManagedHeap> {
        if self.file.is_none() {
            self.file = self.locate();
        }
        let (shown, open) = self.file.as_ref()?;
        let data = match std::fs::read(open) {
            Ok(d) => d,
            Err(_) => {
                self.file = None;
                return None;
            }
        };
        heap_from_counters(&parse_perfdata(&data)?, &format!("hsperfdata {shown}"))
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{LIBC, st};
    use super::*;

    const JVM: &str = "/usr/lib/jvm/java-17-openjdk-amd64/lib/server/libjvm.so";

    #[test]
    fn rules() {
        let direct = st("malloc", &[("__GI___libc_malloc", LIBC), ("os::malloc(unsigned long, MEMFLAGS)", JVM), ("Unsafe_AllocateMemory0", JVM)]);
        assert_eq!(classify(&direct), Some(MemoryKind::OffHeap));
        let own = st("malloc", &[("malloc", LIBC), ("os::malloc(unsigned long, MEMFLAGS, NativeCallStack const&)", JVM), ("Arena::grow", JVM)]);
        assert_eq!(classify(&own), Some(MemoryKind::Runtime));
        let zip = st("malloc", &[("malloc", LIBC), ("Java_java_util_zip_Inflater_init", "/usr/lib/jvm/java-17-openjdk-amd64/lib/libzip.so")]);
        assert_eq!(classify(&zip), Some(MemoryKind::Runtime));
        let jni = st("malloc", &[("malloc", LIBC), ("Java_com_acme_Codec_decode", "/opt/app/libcodec.so")]);
        assert_eq!(classify(&jni), Some(MemoryKind::Native));
        let heap = st("mmap", &[("__GI___mmap64", LIBC), ("os::pd_commit_memory(char*, unsigned long, unsigned long, bool)", JVM), ("VirtualSpace::expand_by(unsigned long, bool)", JVM), ("CardGeneration::grow_by(unsigned long)", JVM)]);
        assert_eq!(classify(&heap), Some(MemoryKind::Managed));
        let code = st("mmap", &[("__GI___mmap64", LIBC), ("os::pd_reserve_memory(unsigned long, bool)", JVM), ("CodeCache::initialize_heaps()", JVM)]);
        assert_eq!(classify(&code), Some(MemoryKind::Runtime));
        let thread = st("mmap", &[("__GI___mmap64", LIBC), ("allocate_stack", LIBC), ("__pthread_create_2_1", LIBC)]);
        assert_eq!(classify(&thread), Some(MemoryKind::Runtime));
        let mut lost = st("malloc", &[("os::malloc(unsigned long, MEMFLAGS)", JVM)]);
        lost.lost = true;
        assert_eq!(classify(&lost), Some(MemoryKind::OffHeap));
        assert!(site_label(MemoryKind::OffHeap, &lost).unwrap().contains("Unsafe.allocateMemory"));
        assert_eq!(site_label(MemoryKind::OffHeap, &direct).as_deref(), Some("Unsafe_AllocateMemory0 (Unsafe.allocateMemory: direct buffers)"));
    }

    /// A PerfData buffer with the given counters, in the JVM's layout.
    fn perfdata(little: bool, counters: &[(&str, PerfValue)]) -> Vec<u8> {
        let w32 = |v: i32| if little { v.to_le_bytes() } else { v.to_be_bytes() };
        let mut entries = Vec::new();
        for (name, value) in counters {
            let name_off = 20usize;
            let mut name_bytes = name.as_bytes().to_vec();
            name_bytes.push(0);
            let data_off = (name_off + name_bytes.len()).div_ceil(8) * 8;
            let (dtype, vlen, data): (u8, i32, Vec<u8>) = match value {
                PerfValue::Long(v) => (b'J', 0, if little { v.to_le_bytes().to_vec() } else { v.to_be_bytes().to_vec() }),
                PerfValue::Str(s) => {
                    let mut d = s.as_bytes().to_vec();
                    d.resize(s.len() + 8, 0);
                    (b'B', d.len() as i32, d)
                }
            };
            let len = (data_off + data.len()).div_ceil(8) * 8;
            let mut e = vec![0u8; len];
            e[0..4].copy_from_slice(&w32(len as i32));
            e[4..8].copy_from_slice(&w32(name_off as i32));
            e[8..12].copy_from_slice(&w32(vlen));
            e[12] = dtype;
            e[14] = if dtype == b'J' { 2 } else { 5 };
            e[15] = 3;
            e[16..20].copy_from_slice(&w32(data_off as i32));
            e[name_off..name_off + name_bytes.len()].copy_from_slice(&name_bytes);
            e[data_off..data_off + data.len()].copy_from_slice(&data);
            entries.push(e);
        }
        let mut buf = vec![0xca, 0xfe, 0xc0, 0xc0, u8::from(little), 2, 0, 1];
        buf.extend_from_slice(&w32(0)); // used
        buf.extend_from_slice(&w32(0)); // overflow
        buf.extend_from_slice(&[0; 8]); // mod_time_stamp
        buf.extend_from_slice(&w32(32)); // entry_offset
        buf.extend_from_slice(&w32(counters.len() as i32));
        for e in entries {
            buf.extend(e);
        }
        buf
    }

    #[test]
    fn hsperfdata_heap_both_byte_orders() {
        use PerfValue::*;
        let counters = [
            ("sun.gc.generation.0.name", Str("new".into())),
            ("sun.gc.generation.0.capacity", Long(22_347_776)),
            ("sun.gc.generation.0.space.0.name", Str("eden".into())),
            ("sun.gc.generation.0.space.0.used", Long(2_516_264)),
            ("sun.gc.generation.0.space.1.name", Str("s0".into())),
            ("sun.gc.generation.0.space.1.used", Long(1000)),
            ("sun.gc.generation.1.name", Str("old".into())),
            ("sun.gc.generation.1.capacity", Long(44_761_088)),
            ("sun.gc.generation.1.space.0.name", Str("old".into())),
            ("sun.gc.generation.1.space.0.used", Long(7_000_000)),
            ("sun.gc.metaspace.capacity", Long(123)),
        ];
        for little in [true, false] {
            let buf = perfdata(little, &counters);
            let c = parse_perfdata(&buf).expect("parsed");
            assert_eq!(c["sun.gc.generation.0.space.0.name"], Str("eden".into()));
            let h = heap_from_counters(&c, "test").expect("heap");
            assert_eq!(h.used_bytes, 2_516_264 + 1000 + 7_000_000);
            assert_eq!(h.committed_bytes, 22_347_776 + 44_761_088);
            assert_eq!(h.spaces["new.eden"], 2_516_264);
            assert_eq!(h.spaces["old.old"], 7_000_000);
        }
        let mut bad = perfdata(true, &counters);
        bad[0] = 0;
        assert!(parse_perfdata(&bad).is_none());
        let mut inaccessible = perfdata(true, &counters);
        inaccessible[7] = 0;
        assert!(parse_perfdata(&inaccessible).is_none());
        // Truncated: never panics.
        let full = perfdata(true, &counters);
        for n in 0..full.len() {
            let _ = parse_perfdata(&full[..n]);
        }
    }

    #[test]
    fn reads_own_jvm_layout_if_a_jvm_runs_here() {
        // A real file is checked by the end-to-end tests; here only that the parser tolerates
        // whatever hsperfdata files exist on this machine.
        if let Ok(rd) = std::fs::read_dir("/tmp") {
            for d in rd.flatten().filter(|d| d.file_name().to_string_lossy().starts_with("hsperfdata_")) {
                for f in std::fs::read_dir(d.path()).into_iter().flatten().flatten() {
                    if let Ok(data) = std::fs::read(f.path()) {
                        let _ = parse_perfdata(&data).and_then(|c| heap_from_counters(&c, "x"));
                    }
                }
            }
        }
    }
}
