//! Target discovery: check that a PID is a traceable process, list the ELF objects it maps, and
//! find the allocator entry points to probe in them.
//!
//! Objects are opened through `/proc/PID/map_files/<range>` (the exact file the target mapped,
//! whatever its mount namespace; without CAP_CHECKPOINT_RESTORE/CAP_SYS_ADMIN it cannot be
//! opened), falling back to `/proc/PID/root/<path>` resolved inside the target's root
//! ([`crate::target_fs`]); the (device, inode) of what was opened is checked against
//! `/proc/PID/maps`, so a path inside a container never leads to a host file of the same name.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use object::{Object as _, ObjectSection as _, ObjectSymbol as _};

use crate::allocators::{
    AllocatorFamily, CXX_DELETE, CXX_NEW, FAMILIES, Hook, MALLOC_API, MMAP_HOOK, PYMALLOC_API, RUST_API, WRAPPERS,
};

/// Why a PID cannot be traced. Each message names the PID and says what to do.
#[derive(Debug, thiserror::Error)]
pub enum TargetError {
    #[error("no process with PID {0} (check the PID; it may have exited)")]
    NoSuchProcess(u32),
    #[error("PID {0} is a kernel thread: it has no user-space allocator to trace")]
    KernelThread(u32),
    #[error("PID {0} is a zombie (it exited and waits for its parent to reap it): nothing to trace")]
    Zombie(u32),
    #[error("cannot read /proc/{pid}: {err}")]
    Proc { pid: u32, err: std::io::Error },
    #[error(
        "no allocator entry points (malloc and free) found in PID {pid}: searched {searched}. \
         A fully stripped static binary cannot be traced; rebuild it with symbols or link it dynamically"
    )]
    NoAllocator { pid: u32, searched: String },
}

/// One ELF object mapped by the target (in objects.rs, which the runtimes read too).
pub use crate::objects::MappedObject;

/// An allocator entry point to probe: `hook.function` at file `offset` of `object`.
#[derive(Clone, Debug)]
pub struct ProbePoint {
    pub object: MappedObject,
    /// The symbol probed (with its family prefix, e.g. "je_malloc").
    pub function: String,
    pub hook: Hook,
    /// File offset of the function's first instruction, bytes.
    pub offset: u64,
    /// File offset of the entry probe and of the return probe (`offset` + the placement's delta,
    /// see `placement`).
    pub probe_offset: u64,
    /// Why the probes are where they are.
    pub placement: String,
}

/// Result of scanning a target's objects.
#[derive(Clone, Debug, Default)]
pub struct AllocatorScan {
    pub points: Vec<ProbePoint>,
    /// Objects that were searched (for error messages and the coverage table).
    pub searched: Vec<PathBuf>,
    /// Notes for the report (aliases skipped).
    pub notes: Vec<String>,
    /// Allocator families found, in the order found (an object may have several).
    pub families: Vec<FoundFamily>,
}

/// An allocator family found in an object (the coverage lines).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FoundFamily {
    /// Path of the object as the target maps it.
    pub object: PathBuf,
    pub family: AllocatorFamily,
}

/// Check that `pid` is a live user-space process that can be traced.
pub fn check_pid(pid: u32) -> Result<(), TargetError> {
    let proc_dir = PathBuf::from(format!("/proc/{pid}"));
    let status = match std::fs::read_to_string(proc_dir.join("status")) {
        Ok(s) => s,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(TargetError::NoSuchProcess(pid)),
        Err(err) => return Err(TargetError::Proc { pid, err }),
    };
    // A thread id (not a thread-group leader) also has /proc/TID: accept only process ids.
    let tgid = status_field(&status, "Tgid:").and_then(|v| v.parse::<u32>().ok());
    if tgid.is_some_and(|t| t != pid) {
        return Err(TargetError::NoSuchProcess(pid));
    }
    // A zombie main thread with other threads still running (pthread_exit in main) is a live
    // process: its memory is read through one of them (procinfo::mm_task).
    let zombie = status_field(&status, "State:").is_some_and(|s| s.starts_with('Z') || s.starts_with('X'));
    if zombie && !crate::procinfo::alive(pid) {
        return Err(TargetError::Zombie(pid));
    }
    let mm = crate::procinfo::mm_task(pid);
    let maps = std::fs::read_to_string(format!("/proc/{mm}/maps")).map_err(|err| TargetError::Proc { pid, err })?;
    if maps.trim().is_empty() {
        return Err(TargetError::KernelThread(pid));
    }
    Ok(())
}

fn status_field<'a>(status: &'a str, name: &str) -> Option<&'a str> {
    status.lines().find_map(|l| l.strip_prefix(name)).map(str::trim)
}

/// The ELF objects (executable and shared libraries) that `pid` maps, once each.
pub fn mapped_objects(pid: u32) -> Result<Vec<MappedObject>, TargetError> {
    // Through a live thread when the main thread has exited (procinfo::mm_task).
    let mm = crate::procinfo::mm_task(pid);
    let maps = std::fs::read_to_string(format!("/proc/{mm}/maps")).map_err(|err| {
        if err.kind() == std::io::ErrorKind::NotFound {
            TargetError::NoSuchProcess(pid)
        } else {
            TargetError::Proc { pid, err }
        }
    })?;
    let mut seen: BTreeMap<(i32, i32, u64), MappedObject> = BTreeMap::new();
    let mut order = Vec::new();
    let lines: Vec<_> = maps.lines().filter_map(crate::procinfo::parse_maps_line).collect();
    let code: std::collections::BTreeSet<(i32, i32, u64)> = lines
        .iter()
        .filter(|l| l.inode != 0 && l.perms.contains('x'))
        .map(|l| {
            let dev = parse_dev(l.dev);
            (dev.0, dev.1, l.inode)
        })
        .collect();
    for l in &lines {
        if !l.path.starts_with('/') || l.inode == 0 || l.offset != 0 {
            continue;
        }
        let dev = parse_dev(l.dev);
        let key = (dev.0, dev.1, l.inode);
        if seen.contains_key(&key) {
            continue;
        }
        let Some(open_path) = open_path(mm, l.range, &l.path, l.dev, l.inode) else { continue };
        let executable = code.contains(&key);
        seen.insert(key, MappedObject { path: PathBuf::from(&l.path), dev, inode: l.inode, open_path, executable });
        order.push(key);
    }
    Ok(order.into_iter().filter_map(|k| seen.remove(&k)).collect())
}

fn parse_dev(dev: &str) -> (i32, i32) {
    let mut it = dev.split(':');
    let major = it.next().and_then(|s| i32::from_str_radix(s, 16).ok()).unwrap_or(0);
    let minor = it.next().and_then(|s| i32::from_str_radix(s, 16).ok()).unwrap_or(0);
    (major, minor)
}

/// A path to the very file mapped at `range` (maps' `dev` and `inode`), for the kernel to attach
/// uprobes by and for later opens: its `/proc/PID/map_files` entry when the agent may open it;
/// else `/proc/PID/root/<path>`, only when the path resolves to that very file (device and
/// inode) both inside the target's root ([`crate::target_fs`]: links stay in that root) and the
/// plain way the kernel resolves it at attach time (an absolute link in the target's root
/// resolves against the agent's root there): a planted link to a host file is never used.
fn open_path(pid: u32, range: &str, path: &str, dev: &str, inode: u64) -> Option<PathBuf> {
    let mapped = format!("/proc/{pid}/map_files/{}", crate::target_fs::map_files_name(range));
    if crate::target_fs::open_mapped(pid, range).is_ok_and(|f| crate::target_fs::same_file(&f, dev, inode)) {
        return Some(PathBuf::from(mapped));
    }
    let inside = crate::target_fs::open(pid, Path::new(path), crate::target_fs::Links::InRoot).ok()?;
    // The path the kernel resolves the plain way. lint-allow: target_fs: checked against `inside`.
    let plain = Path::new(&format!("/proc/{pid}/root")).join(path.strip_prefix('/').unwrap_or(path));
    let same = std::fs::File::open(&plain).is_ok_and(|f| crate::target_fs::same_file(&f, dev, inode));
    (crate::target_fs::same_file(&inside, dev, inode) && same).then_some(plain)
}

/// Defined function symbols of an ELF file: name → file offset of the first instruction.
/// Reads both the dynamic and the static symbol table. Errors name the file.
pub fn function_offsets(path: &Path, wanted: &[&str]) -> anyhow::Result<BTreeMap<String, u64>> {
    let wanted: std::collections::HashSet<&str> = wanted.iter().copied().collect();
    use anyhow::Context as _;
    // Read on demand (headers and the symbol tables only), not the whole file: libraries can be
    // hundreds of megabytes.
    let data =
        object::ReadCache::new(std::fs::File::open(path).with_context(|| format!("cannot read {}", path.display()))?);
    let file = object::File::parse(&data).with_context(|| format!("{} is not an ELF object", path.display()))?;
    let mut out = BTreeMap::new();
    for sym in file.dynamic_symbols().chain(file.symbols()) {
        if sym.is_undefined() || sym.kind() != object::SymbolKind::Text || sym.address() == 0 {
            continue;
        }
        let Ok(name) = sym.name() else { continue };
        // Versioned names (malloc@@GLIBC_2.2.5) are reported without the version by object.
        let name = name.split('@').next().unwrap_or(name);
        if !wanted.contains(&name) || out.contains_key(name) {
            continue;
        }
        let Some(index) = sym.section_index() else { continue };
        let Ok(section) = file.section_by_index(index) else { continue };
        let Some((file_off, _)) = section.file_range() else { continue };
        out.insert(name.to_string(), sym.address() - section.address() + file_off);
    }
    Ok(out)
}

/// [`function_offsets`] of `obj` for [`scan_allocators`]' names (`wanted`, the same list each
/// time), read once per file: `leaktrace watch` attaches to every process of a node, and 50
/// processes map the same libc (reading its symbol tables was 40 % of the agent's CPU). Files are
/// known by (device, inode, size, mtime); None: not an ELF object (also remembered). At most
/// [`OFFSETS_CACHED`] files are kept (then the cache starts again).
fn allocator_offsets(obj: &MappedObject, wanted: &[&str]) -> Option<std::sync::Arc<BTreeMap<String, u64>>> {
    use std::os::unix::fs::MetadataExt as _;
    type Cache = std::collections::HashMap<(i32, i32, u64, u64, i64), Option<std::sync::Arc<BTreeMap<String, u64>>>>;
    static CACHE: std::sync::Mutex<Option<Cache>> = std::sync::Mutex::new(None);
    let meta = std::fs::metadata(&obj.open_path).ok()?;
    let key = (obj.dev.0, obj.dev.1, obj.inode, meta.size(), meta.mtime() * 1_000_000_000 + meta.mtime_nsec());
    if let Some(hit) = CACHE.lock().ok()?.get_or_insert_default().get(&key) {
        return hit.clone();
    }
    let offsets = function_offsets(&obj.open_path, wanted).ok().map(std::sync::Arc::new);
    let mut cache = CACHE.lock().ok()?;
    let cache = cache.get_or_insert_default();
    if cache.len() >= OFFSETS_CACHED {
        cache.clear();
    }
    cache.insert(key, offsets.clone());
    offsets
}

/// Files whose allocator symbols [`allocator_offsets`] keeps.
const OFFSETS_CACHED: usize = 4096;

/// The first 32 bytes of code at file `offset` of `path`.
fn read_code(path: &Path, offset: u64) -> Option<Vec<u8>> {
    use std::os::unix::fs::FileExt as _;
    let f = std::fs::File::open(path).ok()?;
    let mut buf = vec![0u8; 64];
    let n = f.read_at(&mut buf, offset).ok()?;
    buf.truncate(n);
    Some(buf)
}

/// Find the allocator entry points in the objects `pid` maps. An object that defines
/// `{prefix}malloc` and `{prefix}free` for a family of [`FAMILIES`] is an allocator (glibc, musl,
/// jemalloc, tcmalloc, mimalloc, or a statically linked executable): its malloc API is probed,
/// and its own C++ operator new/delete if it defines them. Without any family, Rust's allocator
/// shims are probed. Functions that share an address with one already chosen (glibc's memalign
/// is aligned_alloc, tcmalloc's malloc is tc_malloc) are probed once. With `pymalloc`, CPython's
/// allocator API ([`PYMALLOC_API`]) is probed too, in the object that defines it.
pub fn scan_allocators(pid: u32, objects: &[MappedObject], pymalloc: bool) -> Result<AllocatorScan, TargetError> {
    let mut names: Vec<String> = Vec::new();
    for fam in FAMILIES {
        names.extend(MALLOC_API.iter().map(|h| format!("{}{}", fam.prefix, h.function)));
    }
    names.extend(
        CXX_NEW
            .iter()
            .chain(CXX_DELETE)
            .chain(WRAPPERS)
            .chain(RUST_API)
            .chain([&MMAP_HOOK])
            .chain(PYMALLOC_API)
            .map(|h| h.function.to_string()),
    );
    let wanted: Vec<&str> = names.iter().map(String::as_str).collect();
    let mut scan = AllocatorScan::default();
    let mut rust_candidates = Vec::new();
    for obj in objects {
        scan.searched.push(obj.path.clone());
        let Some(offsets) = allocator_offsets(obj, &wanted) else { continue };
        let mut used: BTreeMap<u64, String> = BTreeMap::new();
        let mut add = |scan: &mut AllocatorScan, hook: &Hook, function: String| {
            let Some(&offset) = offsets.get(&function) else { return };
            if let Some(first) = used.get(&offset) {
                if first != &function {
                    scan.notes.push(format!(
                        "{}: {function} is the same function as {first} (offset {offset:#x}), probed once",
                        obj.path.display()
                    ));
                }
                return;
            }
            used.insert(offset, function.clone());
            let placed = match read_code(&obj.open_path, offset) {
                // The NULL-check rule only for functions without a return probe: the return probe
                // goes where the entry probe goes, and must see every call.
                Some(code) => {
                    crate::placement::place(&code, hook.null_is_noop && hook.return_program.is_none(), hook.args_read())
                }
                None => crate::placement::Placement { delta: 0, note: "entry (code unreadable)".to_string() },
            };
            scan.points.push(ProbePoint {
                object: obj.clone(),
                function,
                hook: *hook,
                offset,
                probe_offset: offset + placed.delta,
                placement: placed.note,
            });
        };
        let mut is_allocator = false;
        for fam in FAMILIES {
            let (m, f) = (format!("{}malloc", fam.prefix), format!("{}free", fam.prefix));
            if !(offsets.contains_key(&m) && offsets.contains_key(&f)) {
                continue;
            }
            is_allocator = true;
            scan.families.push(FoundFamily { object: obj.path.clone(), family: AllocatorFamily::Malloc(*fam) });
            for hook in MALLOC_API {
                add(&mut scan, hook, format!("{}{}", fam.prefix, hook.function));
            }
            if fam.prefix.is_empty() {
                add(&mut scan, &MMAP_HOOK, MMAP_HOOK.function.to_string());
                for hook in WRAPPERS {
                    add(&mut scan, hook, hook.function.to_string());
                }
            }
        }
        // The C++ runtime's operator new (libstdc++, libc++) calls malloc from code built without
        // frame pointers: at malloc's entry the frame-pointer walk skips operator new's caller,
        // the function that did `new`. So operator new is probed wherever it is defined (the
        // malloc inside is folded into it); operator delete only where the object is the
        // allocator (elsewhere the free inside it is enough).
        let mut cxx_new = false;
        for hook in CXX_NEW {
            if offsets.contains_key(hook.function) {
                cxx_new = true;
                add(&mut scan, hook, hook.function.to_string());
            }
        }
        if pymalloc && offsets.contains_key("PyObject_Malloc") && offsets.contains_key("PyObject_Free") {
            scan.families.push(FoundFamily { object: obj.path.clone(), family: AllocatorFamily::Pymalloc });
            for hook in PYMALLOC_API {
                add(&mut scan, hook, hook.function.to_string());
            }
        }
        if is_allocator {
            for hook in CXX_DELETE {
                add(&mut scan, hook, hook.function.to_string());
            }
        } else if cxx_new {
            scan.families.push(FoundFamily { object: obj.path.clone(), family: AllocatorFamily::CxxNew });
        } else if RUST_API.iter().all(|h| offsets.contains_key(h.function)) {
            rust_candidates.push((obj.clone(), offsets.clone()));
        }
    }
    if scan.points.is_empty() {
        // No malloc family anywhere: a Rust program with its own global allocator.
        for (obj, offsets) in rust_candidates {
            scan.families.push(FoundFamily { object: obj.path.clone(), family: AllocatorFamily::RustShims });
            for hook in RUST_API {
                if let Some(&offset) = offsets.get(hook.function) {
                    scan.points.push(ProbePoint {
                        object: obj.clone(),
                        function: hook.function.to_string(),
                        hook: *hook,
                        offset,
                        probe_offset: offset,
                        placement: "entry".to_string(),
                    });
                }
            }
        }
    }
    if scan.points.is_empty() {
        // A Go program without cgo has no malloc: its heap is mapped by the runtime with raw
        // mmap syscalls, which the syscall tracepoints see without any allocator probe.
        if let Some(go) = objects.iter().find(|o| crate::runtimes::go::is_go_binary(&o.open_path)) {
            scan.notes.push(format!(
                "{}: a Go program without a C allocator (no cgo): no malloc probe; the Go heap is \
                 traced through its mmap/munmap syscalls",
                go.path.display()
            ));
            return Ok(scan);
        }
        let searched = if scan.searched.is_empty() {
            "no mapped ELF objects".to_string()
        } else {
            scan.searched.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
        };
        return Err(TargetError::NoAllocator { pid, searched });
    }
    Ok(scan)
}

/// A function whose calls count as units of work: `SYMBOL` or `SYMBOL@OBJECT`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkProbeSpec {
    /// Symbol as in the object's symbol table (`nm`), e.g. `handle_request` or a mangled name.
    pub symbol: String,
    /// Object to look in: a path, or a substring of the path / file name (e.g. `libfoo`).
    /// None: the executable first, then every mapped object.
    pub object: Option<String>,
}

impl std::str::FromStr for WorkProbeSpec {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let (symbol, object) = match s.split_once('@') {
            Some((sym, obj)) => (sym, Some(obj.to_string())),
            None => (s, None),
        };
        if symbol.is_empty() || object.as_deref() == Some("") {
            return Err(format!("`{s}` is not SYMBOL or SYMBOL@OBJECT"));
        }
        Ok(WorkProbeSpec { symbol: symbol.to_string(), object })
    }
}

impl std::fmt::Display for WorkProbeSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.object {
            Some(o) => write!(f, "{}@{o}", self.symbol),
            None => write!(f, "{}", self.symbol),
        }
    }
}

/// The functions whose entry marks the start of a process's teardown among `objects`: (object,
/// function, file offset). libc's `exit` (atexit handlers, C++ static destructors and
/// `__libc_freeres`-like cleanup run inside it), looked for in libc objects only (glibc's
/// libc.so.6, musl's libc), and CPython's (`runtimes::python::names::TEARDOWN_FUNCTION`), looked for
/// in the objects that may hold its interpreter, so only those symbol tables are read.
pub fn find_teardown_functions(objects: &[MappedObject]) -> Vec<(MappedObject, &'static str, u64)> {
    let mut out = Vec::new();
    for o in objects {
        let name = o.path.file_name().map(|n| n.to_string_lossy().to_string()).unwrap_or_default();
        let libc = leaktrace_analysis::system_libs::is_libc(&name);
        let python = crate::runtimes::python::names::may_hold_interpreter(&name);
        for (wanted, function) in [(libc, "exit"), (python, crate::runtimes::python::names::TEARDOWN_FUNCTION)] {
            if !wanted {
                continue;
            }
            if let Some(off) = function_offsets(&o.open_path, &[function]).ok().and_then(|m| m.get(function).copied()) {
                out.push((o.clone(), function, off));
            }
        }
    }
    out
}

/// Find the work-probe function among `objects` (in order): the object and the file offset of
/// the function's first instruction.
pub fn find_work_function(spec: &WorkProbeSpec, objects: &[MappedObject]) -> Option<(MappedObject, u64)> {
    objects
        .iter()
        .filter(|o| match &spec.object {
            None => true,
            Some(want) => {
                let p = o.path.to_string_lossy();
                p == want.as_str() || p.contains(want.as_str())
            }
        })
        .find_map(|o| {
            let offsets = function_offsets(&o.open_path, &[spec.symbol.as_str()]).ok()?;
            offsets.get(&spec.symbol).map(|off| (o.clone(), *off))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_libc_has_allocator() {
        let me = std::process::id();
        check_pid(me).unwrap();
        let objs = mapped_objects(me).unwrap();
        assert!(objs.iter().any(|o| o.path.to_string_lossy().contains("libc.so")));
        let scan = scan_allocators(me, &objs, false).unwrap();
        let names: Vec<_> = scan.points.iter().map(|p| p.function.as_str()).collect();
        assert!(names.contains(&"malloc") && names.contains(&"free"), "{names:?}");
        let libc = scan.points.iter().find(|p| p.function == "malloc").unwrap().object.path.clone();
        let fams: Vec<String> =
            scan.families.iter().filter(|f| f.object == libc).map(|f| f.family.to_string()).collect();
        assert_eq!(fams, ["malloc"], "the coverage line names libc's family as before");
        // glibc's free is probed after its NULL check, on an emulated instruction.
        let free = scan.points.iter().find(|p| p.function == "free").unwrap();
        assert!(free.probe_offset > free.offset, "{}", free.placement);
    }

    #[test]
    fn bad_pids() {
        assert!(matches!(check_pid(u32::MAX - 1), Err(TargetError::NoSuchProcess(_))));
        assert!(matches!(check_pid(2), Err(TargetError::KernelThread(2))));
    }
}
