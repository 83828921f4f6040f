//! `record --heap-dump`: after the JVM's last class histogram, one HPROF heap dump
//! (`jcmd PID GC.heap_dump FILE`, a full GC and a walk of the live objects, the JVM stopped
//! meanwhile), read by [`super::hprof`]: the shortest path from a GC root to the instances of
//! the classes that grew between the histograms. The file is written in the output directory
//! (or, when the JVM cannot write there — another mount namespace or user —, in the JVM's own
//! /tmp, read through /proc/PID/root) and deleted after reading unless `--keep-heap-dump`.
//!
//! Bounds: no dump when the last histogram's live bytes exceed `--heap-dump-max-size` (default
//! [`DEFAULT_MAX_BYTES`]) or the file system has less than twice that free; a file larger than
//! twice the limit is not read; jcmd is killed after `jcmd::TIMEOUT` (30 s); the reading stops
//! after [`READ_TIMEOUT`]. Each refusal or failure is one line in the census' notes.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use leaktrace_analysis::holds::{ClassHistogram, HeapPaths, Taken};

use crate::runtimes::jvm::jcmd::{self, Job, Started};

/// Largest live heap (the last histogram's total bytes) dumped by default.
pub const DEFAULT_MAX_BYTES: u64 = 256 << 20;
/// Longest time spent reading a dump and finding the paths.
pub const READ_TIMEOUT: Duration = Duration::from_secs(60);
/// Classes whose paths are told: the program's fastest-growing class, then the fastest-growing
/// classes by bytes.
const CLASSES: usize = 3;

/// `--heap-dump` and its bounds.
#[derive(Clone, Copy, Debug)]
pub struct DumpOptions {
    /// `--heap-dump`: a JVM's heap dump.
    pub jvm: bool,
    /// `--heap-snapshots`: a Node process's two heap snapshots (`runtimes::node::snap`).
    pub node: bool,
    /// Largest live heap dumped (JS heap used, for Node), bytes.
    pub max_bytes: u64,
    /// Keep the dump in the output directory (`--keep-heap-dump`).
    pub keep: bool,
}

/// The traced process's live blocks, for the off-heap memory direct buffers own: read when the
/// dump has been read (`blocks`, sorted by address; empty without an exact-mode tracer), and a
/// site named (`stack_of`: its stack's id and culprit function with its caller).
pub struct Natives<'a> {
    pub blocks: &'a dyn Fn() -> Vec<crate::reach::blocks::Block>,
    pub stack_of: &'a mut dyn FnMut(leaktrace_common::SiteKey) -> (u32, Option<String>),
}

/// The command-line options (flattened into `record`).
#[derive(clap::Args, Debug, Default)]
pub struct HeapDumpArgs {
    /// On a JVM target (implies --heap-census), after the last class histogram: one heap dump
    /// (jcmd PID GC.heap_dump, a full GC and a stop of the JVM while it writes), read by
    /// leaktrace for the shortest path from a GC root to the instances of the classes that grew
    /// ("HoldsJvm.AUDIT → java.util.ArrayList.elementData → …"); the file is deleted afterwards.
    #[arg(long)]
    pub heap_dump: bool,
    /// Keep the heap dump (heap-PID.hprof in the output directory).
    #[arg(long, requires = "heap_dump")]
    pub keep_heap_dump: bool,
    /// On a Node target (implies --heap-census): two heap snapshots over the inspector, at
    /// attach and at the end (each pauses the process while V8 writes it): the objects new in
    /// the second by constructor and the path from the GC roots to the top growing one. Refused
    /// when the target's memory cgroup has less headroom than twice the JS heap used.
    #[arg(long)]
    pub heap_snapshots: bool,
    /// No JVM dump when its live heap (the last histogram) is larger than this, no Node snapshot
    /// when its JS heap used is (e.g. 512MiB).
    #[arg(long, value_name = "BYTES", default_value = "256MiB", value_parser = parse_size)]
    pub heap_dump_max_size: u64,
}

impl HeapDumpArgs {
    /// The options, None without `--heap-dump` or `--heap-snapshots`.
    pub fn options(&self) -> Option<DumpOptions> {
        (self.heap_dump || self.heap_snapshots).then_some(DumpOptions {
            jvm: self.heap_dump,
            node: self.heap_snapshots,
            max_bytes: self.heap_dump_max_size,
            keep: self.keep_heap_dump,
        })
    }
}

fn parse_size(s: &str) -> Result<u64, String> {
    let b = leaktrace_analysis::check::parse_bytes(s)?;
    if !(1.0..=u64::MAX as f64).contains(&b) {
        return Err(format!("`{s}`: a size of at least 1 byte"));
    }
    Ok(b as u64)
}

/// A class of the program rather than of the JDK or an array.
fn application_class(name: &str) -> bool {
    !name.ends_with("[]") && !["java.", "javax.", "jdk.", "sun.", "com.sun."].iter().any(|p| name.starts_with(p))
}

/// The classes to find paths to, from the histograms' growth (fastest bytes first).
pub fn classes_to_explain(growth: &[leaktrace_analysis::holds::Growth]) -> Vec<String> {
    let mut out: Vec<String> =
        growth.iter().find(|g| application_class(&g.name)).map(|g| g.name.clone()).into_iter().collect();
    for g in growth {
        if out.len() >= CLASSES {
            break;
        }
        if !out.contains(&g.name) {
            out.push(g.name.clone());
        }
    }
    out
}

/// Where the JVM writes the dump (a path in its own mount namespace) and where leaktrace reads
/// it: the output directory when the JVM shares leaktrace's mount namespace and runs as root,
/// else the JVM's /tmp.
fn dump_place(pid: u32, dir: &Path) -> (PathBuf, DumpFile) {
    let ns = |p: &str| std::fs::read_link(format!("{p}/ns/mnt")).ok();
    let same_ns = ns(&format!("/proc/{pid}")).is_some_and(|n| Some(n) == ns("/proc/self"));
    let root = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| s.lines().find_map(|l| l.strip_prefix("Uid:")).map(|u| u.split_whitespace().nth(1) == Some("0")))
        .unwrap_or(false);
    let name = format!("heap-{pid}.hprof");
    match std::fs::canonicalize(dir) {
        Ok(d) if same_ns && root => (d.join(&name), DumpFile::Host(d.join(&name))),
        _ => {
            let nspid = crate::procinfo::nspid(pid).last().copied().unwrap_or(pid);
            let name = format!("leaktrace-heap-{nspid}.hprof");
            (Path::new("/tmp").join(&name), DumpFile::InTarget { pid, name })
        }
    }
}

/// The dump file as leaktrace reaches it.
enum DumpFile {
    /// A path of leaktrace's own (its output directory).
    Host(PathBuf),
    /// The file `name` in the target's /tmp, reached inside the target's root only
    /// ([`crate::target_fs`]): /tmp's links resolve there, the file itself must be a regular
    /// file and no link, so a link planted under that name never makes leaktrace read, copy or
    /// delete a file outside the target's root.
    InTarget { pid: u32, name: String },
}

impl DumpFile {
    fn open(&self) -> std::io::Result<std::fs::File> {
        match self {
            DumpFile::Host(p) => std::fs::File::open(p),
            DumpFile::InTarget { pid, name } => {
                crate::target_fs::open(*pid, &Path::new("/tmp").join(name), crate::target_fs::Links::NotLast)
            }
        }
    }

    /// Delete it (the entry in the target's /tmp directory, never what a link points to).
    fn remove(&self) {
        match self {
            DumpFile::Host(p) => {
                let _ = std::fs::remove_file(p);
            }
            DumpFile::InTarget { pid, name } => {
                if let Ok(tmp) = crate::target_fs::open_path(*pid, Path::new("/tmp"), crate::target_fs::Links::InRoot) {
                    let _ = rustix::fs::unlinkat(&tmp, name.as_str(), rustix::fs::AtFlags::empty());
                }
            }
        }
    }

    fn display(&self) -> String {
        match self {
            DumpFile::Host(p) => p.display().to_string(),
            DumpFile::InTarget { pid, name } => format!("/tmp/{name} of process {pid}"),
        }
    }
}

/// Free bytes of the file system holding `dir` (None: unknown).
fn free_bytes(dir: &Path) -> Option<u64> {
    let c = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).ok()?;
    // SAFETY: statvfs is plain data, for which all zero bytes are a valid value.
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a NUL-terminated path and a statvfs the call fills.
    (unsafe { libc::statvfs(c.as_ptr(), &mut s) } == 0).then(|| s.f_bavail as u64 * s.f_frsize as u64)
}

impl super::census::JvmCensus {
    /// `--heap-dump`: after [`Self::finish`], one dump of JVM `pid` and the paths to the classes
    /// that grew; its notes go in the census' errors. `dir`: the output directory.
    pub fn heap_dump(
        &mut self,
        dir: &Path,
        o: DumpOptions,
        now_s: &dyn Fn() -> f64,
        units: Option<u64>,
        natives: &mut Natives<'_>,
    ) -> Option<HeapPaths> {
        let Some(end) = self.census.end.clone() else {
            self.census.errors.push("--heap-dump: no dump (the last class histogram was not taken)".into());
            return None;
        };
        let classes = classes_to_explain(&self.census.growth());
        if classes.is_empty() {
            self.census.errors.push("--heap-dump: no dump (no class grew between the histograms)".into());
            return None;
        }
        if let Some(why) = refusal(&end, dir, o) {
            self.census.errors.push(format!("--heap-dump: no dump: {why}"));
            return None;
        }
        self.dump_and_read(dir, o, (now_s, units), &classes, natives)
    }

    /// `--heap-dump`'s first dump, early in the recording: only its off-heap retainers. None
    /// before the first class histogram was taken, or when refused or failed (the reason in the
    /// census' errors).
    pub fn first_heap_dump(
        &mut self,
        dir: &Path,
        o: DumpOptions,
        now_s: &dyn Fn() -> f64,
        units: Option<u64>,
        natives: &mut Natives<'_>,
    ) -> Option<HeapPaths> {
        let start = self.census.start.clone()?;
        if let Some(why) = refusal(&start, dir, o) {
            self.census.errors.push(format!("--heap-dump: no first dump: {why}"));
            return None;
        }
        self.dump_and_read(dir, o, (now_s, units), &[], natives)
    }

    /// Dump the heap, read the paths to `classes` and the off-heap retainers.
    fn dump_and_read(
        &mut self,
        dir: &Path,
        o: DumpOptions,
        (now_s, units): (&dyn Fn() -> f64, Option<u64>),
        classes: &[String],
        natives: &mut Natives<'_>,
    ) -> Option<HeapPaths> {
        let (inside, file) = dump_place(self.pid, dir);
        file.remove();
        let t0 = now_s();
        let clock = Instant::now();
        let result = self.run_dump(&inside);
        let taken = Taken { t_s: t0, took_s: clock.elapsed().as_secs_f64(), units_of_work: units };
        let out = result.and_then(|()| read_paths(&file, o, classes, taken, natives));
        let kept = if o.keep && out.is_ok() { keep(&file, dir, self.pid, o) } else { None };
        if kept.is_none() {
            file.remove();
        }
        match out {
            Ok(mut p) => {
                p.kept = kept.map(|k| k.display().to_string());
                Some(p)
            }
            Err(e) => {
                self.census.errors.push(format!("--heap-dump: {e}"));
                None
            }
        }
    }

    /// Run `jcmd PID GC.heap_dump FILE` and wait for it (at most `jcmd::TIMEOUT`).
    fn run_dump(&mut self, inside: &Path) -> Result<(), String> {
        let pid = self.pid;
        let j = self.jcmd.as_mut().ok_or("no jcmd to run")?;
        j.dump_path = inside.to_path_buf();
        let cmd = format!("{} {}", Job::HeapDump.describe(pid), inside.display());
        crate::note!("leaktrace: PID {pid}: heap dump (a full GC, the JVM stopped while it writes): {cmd}");
        let done = match j.run(Job::HeapDump) {
            Started::Running => j.wait().ok_or("jcmd did not run")?,
            Started::NotNow => return Err(format!("`{cmd}` could not be run now")),
            Started::Failed(d) => d,
        };
        match done.result {
            Ok(out) if out.contains("Heap dump file created") => Ok(()),
            Ok(out) => Err(format!("`{cmd}`: {}", jcmd::first_error_line(&out, ""))),
            Err(e) => Err(format!("`{cmd}` failed: {e}")),
        }
    }
}

/// Why no dump is taken (None: it may be).
fn refusal(end: &ClassHistogram, dir: &Path, o: DumpOptions) -> Option<String> {
    if end.total_bytes > o.max_bytes {
        return Some(format!(
            "the live heap is {} B (last histogram), over --heap-dump-max-size {} B",
            end.total_bytes, o.max_bytes
        ));
    }
    let need = 2 * end.total_bytes + (16 << 20);
    match free_bytes(dir) {
        Some(f) if f < need => Some(format!("{f} B free where the output goes, under the {need} B a dump may need")),
        _ => None,
    }
}

/// Read the dump at `file` and the paths to `classes`.
fn read_paths(
    file: &DumpFile,
    o: DumpOptions,
    classes: &[String],
    taken: Taken,
    natives: &mut Natives<'_>,
) -> Result<HeapPaths, String> {
    let clock = Instant::now();
    let f = file.open().map_err(|e| format!("cannot open the dump {}: {e}", file.display()))?;
    let file_bytes = f.metadata().map(|m| m.len()).unwrap_or(0);
    if file_bytes > 2 * o.max_bytes {
        return Err(format!("the dump is {file_bytes} B, over twice --heap-dump-max-size: not read"));
    }
    let g = super::hprof::read(f, clock + READ_TIMEOUT).map_err(|e| format!("reading {}: {e}", file.display()))?;
    let paths = g.paths_to(classes);
    let mut retainers = super::retain::retainers(&g, &(natives.blocks)());
    for r in &mut retainers {
        if let Some(&(key, _)) = r.sites.first() {
            let (id, by) = (natives.stack_of)(key);
            (r.allocated_stack, r.allocated_by) = (Some(id), by);
        }
        r.sites.clear();
    }
    let parse_s = clock.elapsed().as_secs_f64();
    Ok(HeapPaths { taken, file_bytes, kept: None, objects: g.objects(), parse_s, paths, retainers })
}

/// Keep the dump in `dir` (moved there when the JVM wrote it elsewhere); its path.
fn keep(file: &DumpFile, dir: &Path, pid: u32, o: DumpOptions) -> Option<PathBuf> {
    let to = std::fs::canonicalize(dir).ok()?.join(format!("heap-{pid}.hprof"));
    if matches!(file, DumpFile::Host(p) if *p == to) {
        return Some(to);
    }
    // At most the size read_paths accepts: the file is the target's and may grow meanwhile.
    let mut from = std::io::Read::take(file.open().ok()?, 2 * o.max_bytes);
    let mut out = {
        use std::os::unix::fs::OpenOptionsExt as _;
        std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&to).ok()?
    };
    std::io::copy(&mut from, &mut out).ok()?;
    file.remove();
    Some(to)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_heap_over_the_limit_is_not_dumped() {
        let h = ClassHistogram { total_bytes: 300 << 20, ..Default::default() };
        let o = DumpOptions { jvm: true, node: false, max_bytes: DEFAULT_MAX_BYTES, keep: false };
        let why = refusal(&h, Path::new("/tmp"), o).expect("refused");
        assert!(why.contains("over --heap-dump-max-size 268435456 B"), "{why}");
        let small = ClassHistogram { total_bytes: 1 << 20, ..Default::default() };
        assert_eq!(refusal(&small, Path::new("/tmp"), o), None);
    }

    #[test]
    fn the_program_class_is_explained_first() {
        let g = |name: &str| leaktrace_analysis::holds::Growth {
            name: name.into(),
            count_start: 0,
            count_end: 1,
            bytes_start: 0,
            bytes_end: 1,
            count_per_s: 1.0,
            bytes_per_s: 1.0,
            count_per_unit: None,
            bytes_per_unit: None,
        };
        let v = classes_to_explain(&[g("byte[]"), g("java.lang.String"), g("App$Rec"), g("int[]")]);
        assert_eq!(v, ["App$Rec", "byte[]", "java.lang.String"]);
    }
}
