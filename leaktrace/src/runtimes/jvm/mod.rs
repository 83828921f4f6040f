//! JVM detection (a mapped libjvm.so; the version from <java.home>/release) and its heap gauge:
//! the Java heap as the JVM itself reports it in its hsperfdata file; per process, with
//! `--jvm-perf-map`, its jcmd and the perf map that names its JIT frames. The frame rules are in
//! `leaktrace_analysis::runtimes::jvm`.
//!
//! PerfData layout (OpenJDK `runtime/perfMemory.hpp`): a prologue {magic 0xcafec0c0 as bytes
//! CA FE C0 C0; byte_order (0 big, 1 little); major, minor; accessible; used; overflow;
//! mod_time_stamp (8 bytes); entry_offset; num_entries}, then `num_entries` entries {entry_length,
//! name_offset, vector_length, data_type, flags, data_units, data_variability, data_offset},
//! with the NUL-terminated name and the data at the given offsets from the entry's start.
//! Units (`perfData.hpp`): 1 none, 2 bytes, 3 ticks, 4 events, 5 string, 6 hertz.

pub mod attach;
pub mod census;
pub mod heapdump;
pub mod hprof;
pub mod jcmd;
pub mod retain;

use std::collections::BTreeMap;
use std::path::Path;

use super::{HeapGauge, Process, RuntimeInfo, RuntimeInstance, RuntimeOptions, file_name, unnamed_jit};
use crate::holds::census::{CensusOptions, JvmHolds, RuntimeCensus};
use crate::objects::MappedObject;
use crate::probes::Tracer;
use leaktrace_analysis::recording::ManagedHeap;
use leaktrace_analysis::recording::Runtime;

/// Detect a JVM: a mapped libjvm.so.
pub fn detect(pid: u32, objects: &[MappedObject]) -> Option<RuntimeInfo> {
    let jvm = objects.iter().find(|o| file_name(&o.path) == "libjvm.so")?;
    // <java.home>/lib/server/libjvm.so; <java.home>/release holds JAVA_VERSION="17.0.15".
    let version = jvm.path.parent().and_then(Path::parent).and_then(Path::parent).and_then(|home| {
        use crate::target_fs::{Links, caps, read_to_string};
        let release = read_to_string(pid, &home.join("release"), Links::InRoot, caps::SMALL_TEXT).ok()?;
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
    Some(RuntimeInfo { name: Runtime::Jvm, version, notes })
}

// ----------------------------------------------------------------------------------------------
// -XX:+PreserveFramePointer

/// `java` launcher options whose value is the next argument.
const TWO_TOKEN_OPTIONS: &[&str] = &[
    "-cp",
    "-classpath",
    "--class-path",
    "-p",
    "--module-path",
    "--upgrade-module-path",
    "--add-modules",
    "--limit-modules",
    "--add-exports",
    "--add-opens",
    "--add-reads",
    "--patch-module",
    "--enable-native-access",
];

/// Whether `-XX:+PreserveFramePointer` is set for a JVM started with `argv` and the environment
/// `env` (NAME=VALUE strings), from the places HotSpot reads options from, in its order:
/// JAVA_TOOL_OPTIONS, JDK_JAVA_OPTIONS (the `java` launcher puts it before its arguments), the
/// command line, _JAVA_OPTIONS; the last setting wins. None when none of them sets it (the
/// default: off on x86-64). Options in @argfiles or -XX:Flags/-XX:VMOptionsFile files are not read.
pub fn preserve_frame_pointer_arg(argv: &[String], env: &[String]) -> Option<bool> {
    let var = |name: &str| {
        env.iter().filter_map(|e| e.strip_prefix(name)?.strip_prefix('=')).next_back().unwrap_or("").to_string()
    };
    let setting = |a: &str| match a {
        "-XX:+PreserveFramePointer" => Some(true),
        "-XX:-PreserveFramePointer" => Some(false),
        _ => None,
    };
    let tool = var("JAVA_TOOL_OPTIONS");
    let jdk = var("JDK_JAVA_OPTIONS");
    let underscore = var("_JAVA_OPTIONS");
    // Arguments after the main class (or -jar FILE, -m MODULE) are the program's, not the JVM's.
    let mut jvm_args = Vec::new();
    let mut it = argv.iter().skip(1);
    while let Some(a) = it.next() {
        if TWO_TOKEN_OPTIONS.contains(&a.as_str()) {
            it.next();
            continue;
        }
        if !a.starts_with('-') || matches!(a.as_str(), "-jar" | "-m" | "--module") {
            break;
        }
        jvm_args.push(a.as_str());
    }
    tool.split_whitespace()
        .chain(jdk.split_whitespace())
        .chain(jvm_args)
        .chain(underscore.split_whitespace())
        .filter_map(setting)
        .next_back()
}

/// The note for a JVM whose JIT code keeps no frame pointers, or None when
/// `-XX:+PreserveFramePointer` is on. `source` says where the value was read.
pub fn frame_pointer_note(on: bool, source: &str) -> Option<String> {
    (!on).then(|| {
        format!(
            "the JVM runs without -XX:+PreserveFramePointer ({source}): its JIT-compiled Java code uses %rbp as an \
             ordinary register, so stacks stop at, or go wrong after, the first compiled Java frame; start it with \
             -XX:+PreserveFramePointer to walk through Java frames (interpreted frames keep %rbp either way)"
        )
    })
}

/// The environment of `pid` (NAME=VALUE strings); empty when unreadable.
pub fn environ(pid: u32) -> Vec<String> {
    std::fs::read(format!("/proc/{pid}/environ"))
        .map(|b| {
            b.split(|&c| c == 0).filter(|v| !v.is_empty()).map(|v| String::from_utf8_lossy(v).into_owned()).collect()
        })
        .unwrap_or_default()
}

/// [`frame_pointer_note`] from the command line and environment of `pid`
/// ([`preserve_frame_pointer_arg`]).
pub fn frame_pointer_note_from_args(pid: u32) -> Option<String> {
    let argv = crate::procinfo::cmdline(pid);
    match preserve_frame_pointer_arg(&argv, &environ(pid)) {
        Some(on) => frame_pointer_note(on, "-XX:-PreserveFramePointer given"),
        None => frame_pointer_note(
            false,
            "not on its command line nor in JAVA_TOOL_OPTIONS, JDK_JAVA_OPTIONS or _JAVA_OPTIONS; off by default",
        ),
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
            // The data must lie inside its own entry.
            (b'J', 0) if data_off.checked_add(8).is_some_and(|end| end <= len) => {
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
/// "old.old"), collections = Σ `sun.gc.collector.N.invocations` (young and full). None without
/// any space counter.
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
    // Young and full collections so far (the collectors' invocation counts).
    let counts: Vec<u64> = (0..4).filter_map(|n| long(&format!("sun.gc.collector.{n}.invocations"))).collect();
    heap.collections = (!counts.is_empty()).then(|| counts.iter().sum());
    heap.last_collection_ago_s = last_collection_ago_s(c);
    any.then_some(heap)
}

/// Seconds from the end of the JVM's last collection to the counters' last sample: the
/// high-resolution clock now (`sun.os.hrt.ticks`, sampled by the JVM every 50 ms) minus the
/// latest `sun.gc.collector.N.lastExitTime` (same clock), over `sun.os.hrt.frequency` ticks a
/// second. None when no collector ran yet, or the figures make no sense (the file is the
/// target's to forge: a negative or absurd interval is dropped, never trusted).
pub fn last_collection_ago_s(c: &BTreeMap<String, PerfValue>) -> Option<f64> {
    let long = |k: &str| match c.get(k) {
        Some(PerfValue::Long(v)) => Some(*v),
        _ => None,
    };
    let freq = long("sun.os.hrt.frequency").filter(|&f| f > 0)?;
    let now = long("sun.os.hrt.ticks")?;
    let last = (0..4).filter_map(|n| long(&format!("sun.gc.collector.{n}.lastExitTime"))).filter(|&t| t > 0).max()?;
    // The collection may end after the clock's last sample (up to its 50 ms interval): at most
    // that much in the future is "just now".
    let ago = (now as f64 - last as f64) / freq as f64;
    (-0.1..=1e7).contains(&ago).then_some(ago.max(0.0))
}

/// Reads the target JVM's hsperfdata file at every checkpoint. The file is found through the
/// target's own mappings (the JVM maps it), so it is the right one inside a container too, and
/// read through /proc/PID/map_files (or its path inside the target's root while it is still the
/// file mapped: [`crate::target_fs::open_mapped_or_path`]) even if /tmp was cleaned; at most
/// [`crate::target_fs::caps::HSPERFDATA`] bytes.
pub struct HsPerfGauge {
    pid: u32,
    /// The mapping: path the target maps, and what opens it.
    file: Option<(String, MappedFile)>,
}

/// A mapped file as found in /proc/PID/maps: (task whose maps it is in, range, dev, inode).
type MappedFile = (u32, String, String, u64);

impl HsPerfGauge {
    pub fn new(pid: u32) -> HsPerfGauge {
        HsPerfGauge { pid, file: None }
    }

    fn locate(&self) -> Option<(String, MappedFile)> {
        let mm = crate::procinfo::mm_task(self.pid);
        let maps = std::fs::read_to_string(format!("/proc/{mm}/maps")).ok()?;
        let l = maps.lines().filter_map(crate::procinfo::parse_maps_line).find(|l| l.path.contains("/hsperfdata_"))?;
        let path = l.path.trim_end_matches(" (deleted)").to_string();
        Some((path, (mm, l.range.to_string(), l.dev.to_string(), l.inode)))
    }
}

impl HeapGauge for HsPerfGauge {
    fn sample(&mut self) -> Option<ManagedHeap> {
        if self.file.is_none() {
            self.file = self.locate();
        }
        let (shown, (mm, range, dev, inode)) = self.file.as_ref()?;
        let read = crate::target_fs::open_mapped_or_path(*mm, range, shown, dev, *inode)
            .and_then(|f| crate::target_fs::read_capped(f, crate::target_fs::caps::HSPERFDATA, shown));
        let data = match read {
            Ok(d) => d,
            Err(_) => {
                self.file = None;
                return None;
            }
        };
        heap_from_counters(&parse_perfdata(&data)?, &format!("hsperfdata {shown}"))
    }
}

/// The HotSpot JVM: libjvm mapped ([`super::RuntimeDetector`]).
pub struct Jvm;

impl super::RuntimeDetector for Jvm {
    fn detect(&self, pid: u32, objects: &[MappedObject], opts: RuntimeOptions) -> Option<Box<dyn RuntimeInstance>> {
        let info = detect(pid, objects)?;
        Some(Box::new(JvmInstance {
            pid,
            info,
            gauge: HsPerfGauge::new(pid),
            perf_map_on: opts.jvm_perf_map,
            set_up: false,
            jcmd: None,
            jit_scanned: 0,
            perf_maps_written: 0,
            jcmd_failure_noted: false,
            jcmd_failure: None,
        }))
    }
}

/// A JVM in one process: its heap gauge (hsperfdata) and, with `--jvm-perf-map`, its jcmd,
/// which writes the perf map that names its JIT frames.
struct JvmInstance {
    pid: u32,
    info: RuntimeInfo,
    /// The Java heap, sampled at every checkpoint.
    gauge: HsPerfGauge,
    /// `--jvm-perf-map`: leaktrace may run jcmd on it.
    perf_map_on: bool,
    /// [`JvmInstance::set_up`] ran (at the first sync of its mappings).
    set_up: bool,
    /// Its diagnostic commands (`--jvm-perf-map` and a jcmd to run).
    jcmd: Option<jcmd::Jcmd>,
    /// Stacks already looked at for unnamed JIT frames (by index in the recording's stacks).
    jit_scanned: usize,
    /// `jcmd PID Compiler.perfmap` runs that succeeded.
    perf_maps_written: u32,
    /// A jcmd problem is reported (no jcmd, or a command failed): no other note asks for a map.
    jcmd_failure_noted: bool,
    /// The first failed command's caveat, given at the end unless a perf map was written after all.
    jcmd_failure: Option<String>,
}

impl RuntimeInstance for JvmInstance {
    fn info(&self) -> &RuntimeInfo {
        &self.info
    }

    /// Its class histograms (and `--heap-dump`), made at the first poll: jcmd is not run before
    /// the JVM is attachable.
    fn census(&self, pid: u32, opts: CensusOptions, at_attach: bool) -> Option<Box<dyn RuntimeCensus>> {
        (!at_attach).then(|| Box::new(JvmHolds::new(pid, opts)) as Box<dyn RuntimeCensus>)
    }

    fn sync_mappings(&mut self, _tracer: &mut Tracer, objects: &[MappedObject], warnings: &mut Vec<String>) {
        if !std::mem::replace(&mut self.set_up, true) {
            self.set_up(objects, warnings);
        }
    }

    /// The Java heap from the JVM's hsperfdata ([`HsPerfGauge`]).
    fn heap(&mut self, _kernel: &dyn super::KernelFigures) -> Option<ManagedHeap> {
        self.gauge.sample()
    }

    /// `--jvm-perf-map`, at every poll: ask for a perf map when stacks with unnamed JIT frames
    /// (or frames named from a map older than they are) appeared since the last look, collect the jcmd command that ended (a new perf map names
    /// the stacks' JIT frames), start the next one due. Never blocks.
    fn tick(&mut self, p: Process<'_>) {
        let Some(j) = self.jcmd.as_mut() else { return };
        if p.stacks.len() > self.jit_scanned {
            let stale = |f: &leaktrace_analysis::recording::Frame| unnamed_jit(f) || p.symbolizer.is_provisional(f);
            if p.stacks[self.jit_scanned..].iter().any(|s| s.frames.iter().skip(1).any(|f| stale(f))) {
                j.want_perf_map();
            }
            self.jit_scanned = p.stacks.len();
        }
        if let Some(done) = j.poll() {
            self.jcmd_done(done, p);
        }
    }

    /// With `--jvm-perf-map` and JIT frames still unnamed, one last `jcmd PID
    /// Compiler.perfmap`, waited for (at most [`jcmd::TIMEOUT`] per command). Then unnamed JIT
    /// frames are named from the perf map as it is now, and a note says how many.
    fn finish(&mut self, mut p: Process<'_>, running: bool) {
        let unnamed =
            p.stacks.iter().any(|s| s.frames.iter().skip(1).any(|f| unnamed_jit(f) || p.symbolizer.is_provisional(f)));
        // A jcmd that never succeeded (no attach) is not waited for again.
        if unnamed
            && (self.jcmd_failure.is_none() || self.perf_maps_written > 0)
            && running
            && let Some(j) = self.jcmd.as_mut()
        {
            crate::note!(
                "leaktrace: PID {}: asking the JVM for its perf map ({})",
                self.pid,
                jcmd::Job::PerfMap.describe(self.pid)
            );
            for done in j.finish() {
                self.jcmd_done(done, p.reborrow());
            }
        }
        p.symbolizer.name_jit_frames(p.stacks);
        if let Some(failure) = self.jcmd_failure.take()
            && self.perf_maps_written == 0
        {
            p.warnings.push(failure);
        }
        if self.perf_maps_written > 0 {
            let unnamed = p.stacks.iter().flat_map(|s| s.frames.iter().skip(1)).filter(|f| unnamed_jit(f)).count();
            p.warnings.push(format!(
                "Java frames named from the JVM's perf map, written {} time(s) during the recording with `jcmd PID \
                 Compiler.perfmap` (--jvm-perf-map): a frame takes the name of the code at its address when the map \
                 was written{}",
                self.perf_maps_written,
                if unnamed > 0 {
                    format!("; {unnamed} frame(s) stayed unnamed (code freed before the map was written)")
                } else {
                    String::new()
                }
            ));
        }
    }

    // Whether -XX:+PreserveFramePointer is on is said in a note of its own when the JVM is found
    // (frame_pointer_note): not repeated here, where it was advice even to a JVM started with
    // the flag. A jcmd problem already reported asks for no map either.
    fn unnamed_jit_advice(&self) -> Option<String> {
        (!self.jcmd_failure_noted).then(|| {
            "JIT frames (Java) are unnamed: record with --jvm-perf-map (leaktrace then runs `jcmd PID \
             Compiler.perfmap`, and the JVM writes /tmp/perf-PID.map, which leaktrace reads), or run that \
             yourself during the recording"
                .to_string()
        })
    }
}

impl JvmInstance {
    /// The JVM was detected. With `--jvm-perf-map`: its jcmd, whose first command reads the
    /// flags (is -XX:+PreserveFramePointer on?); without, or with no jcmd to run, that is read
    /// from its command line and environment. A note says when it is off.
    fn set_up(&mut self, objects: &[MappedObject], warnings: &mut Vec<String>) {
        if self.perf_map_on {
            // HotSpot (its libjvm.so is mapped): its attach socket is spoken to directly.
            if objects.iter().any(|o| file_name(&o.path) == "libjvm.so") {
                self.jcmd = Some(jcmd::Jcmd::new(self.pid));
                return;
            }
            self.jcmd_failure_noted = true;
            warnings.push("--jvm-perf-map: no libjvm.so mapped (not HotSpot?): Java frames stay unnamed".into());
        }
        warnings.extend(frame_pointer_note_from_args(self.pid));
    }

    /// A jcmd command ended.
    fn jcmd_done(&mut self, done: jcmd::Done, p: Process<'_>) {
        match (done.job, done.result) {
            (jcmd::Job::Flags, Ok(out)) => match jcmd::preserve_frame_pointer(&out) {
                Some(on) => p.warnings.extend(frame_pointer_note(on, "jcmd VM.flags: PreserveFramePointer = false")),
                None => p.warnings.extend(frame_pointer_note_from_args(self.pid)),
            },
            (jcmd::Job::PerfMap, Ok(_)) => {
                self.perf_maps_written += 1;
                p.symbolizer.name_jit_frames(p.stacks);
            }
            // Run by runtimes/jvm/census.rs with its own Jcmd, never by this one.
            (jcmd::Job::ClassHistogram | jcmd::Job::HeapDump, Ok(_)) => {}
            (job, Err(why)) => {
                if self.jcmd_failure.is_none() {
                    self.jcmd_failure_noted = true;
                    self.jcmd_failure = Some(format!(
                        "--jvm-perf-map: `{}` failed ({why}): Java frames stay unnamed (a JVM in another container may \
                         need jcmd run inside it: `jcmd 1 Compiler.perfmap` there, during the recording)",
                        job.describe(self.pid)
                    ));
                }
                if job == jcmd::Job::Flags {
                    p.warnings.extend(frame_pointer_note_from_args(self.pid));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
                PerfValue::Long(v) => {
                    (b'J', 0, if little { v.to_le_bytes().to_vec() } else { v.to_be_bytes().to_vec() })
                }
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
    fn preserve_frame_pointer_from_arguments_and_environment() {
        let argv = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let env = |e: &[&str]| e.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let on = argv(&["java", "-Xmx1g", "-XX:+PreserveFramePointer", "-cp", ".", "Main"]);
        assert_eq!(preserve_frame_pointer_arg(&on, &[]), Some(true));
        assert_eq!(preserve_frame_pointer_arg(&argv(&["java", "-cp", ".", "Main"]), &[]), None);
        // The program's own arguments are not the JVM's.
        let late = argv(&["java", "-cp", "/app", "Main", "-XX:+PreserveFramePointer"]);
        assert_eq!(preserve_frame_pointer_arg(&late, &[]), None);
        let jar = argv(&["java", "-jar", "app.jar", "-XX:+PreserveFramePointer"]);
        assert_eq!(preserve_frame_pointer_arg(&jar, &[]), None);
        let tool = env(&["HOME=/root", "JAVA_TOOL_OPTIONS=-Xss1m -XX:+PreserveFramePointer"]);
        assert_eq!(preserve_frame_pointer_arg(&argv(&["java", "Main"]), &tool), Some(true));
        // The command line overrides JAVA_TOOL_OPTIONS; _JAVA_OPTIONS overrides both.
        let off = argv(&["java", "-XX:-PreserveFramePointer", "Main"]);
        assert_eq!(preserve_frame_pointer_arg(&off, &tool), Some(false));
        let both = env(&["JAVA_TOOL_OPTIONS=-XX:+PreserveFramePointer", "_JAVA_OPTIONS=-XX:-PreserveFramePointer"]);
        assert_eq!(preserve_frame_pointer_arg(&on, &both), Some(false));
        assert!(frame_pointer_note(true, "x").is_none());
        assert!(frame_pointer_note(false, "x").unwrap().contains("-XX:+PreserveFramePointer"));
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
            ("sun.gc.collector.0.invocations", Long(5)),
            ("sun.gc.collector.1.invocations", Long(2)),
            ("sun.gc.collector.0.lastExitTime", Long(7_000_000_000)),
            ("sun.gc.collector.1.lastExitTime", Long(9_500_000_000)),
            ("sun.os.hrt.ticks", Long(10_000_000_000)),
            ("sun.os.hrt.frequency", Long(1_000_000_000)),
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
            assert_eq!(h.collections, Some(7));
            assert_eq!(h.last_collection_ago_s, Some(0.5), "the latest collector's end, 0.5 s before the clock");
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
    fn forged_collection_times_are_dropped() {
        use PerfValue::Long;
        let c = |last: i64, now: i64, freq: i64| {
            [
                ("sun.gc.collector.0.lastExitTime".to_string(), Long(last)),
                ("sun.os.hrt.ticks".to_string(), Long(now)),
                ("sun.os.hrt.frequency".to_string(), Long(freq)),
            ]
            .into_iter()
            .collect::<BTreeMap<_, _>>()
        };
        assert_eq!(last_collection_ago_s(&c(1_000, 3_000, 1_000)), Some(2.0));
        assert_eq!(last_collection_ago_s(&c(0, 3_000, 1_000)), None, "no collection yet");
        assert_eq!(last_collection_ago_s(&c(9_000, 3_000, 1_000)), None, "in the future");
        assert_eq!(last_collection_ago_s(&c(1_000, 3_000, 0)), None, "no clock");
        assert_eq!(last_collection_ago_s(&c(1, i64::MAX, 1)), None, "absurd");
        // A long whose data offset points past its entry is not read.
        let mut buf = perfdata(true, &[("sun.gc.collector.0.invocations", Long(3))]);
        buf[32 + 16..32 + 20].copy_from_slice(&1000i32.to_le_bytes());
        assert!(parse_perfdata(&buf).expect("parsed").is_empty());
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
