//! Production attach (tests/tests/production.rs): fixtures built with other flags and
//! libraries, C++ names, processes, cgroups, eBPF programs.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use crate::*;

/// Compile `sources` into `output` with the fixtures' flags (`-O1 -g -fno-omit-frame-pointer
/// -Wall`) followed by `extra` (after the sources: libraries, `-static`, `-shared -fPIC`, ...).
pub fn compile_with(compiler: &str, sources: &[&Path], output: &Path, extra: &[&str]) {
    let mut cmd = Command::new(compiler);
    cmd.args(["-O1", "-g", "-fno-omit-frame-pointer", "-Wall", "-o"]).arg(output).args(sources).args(extra);
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {compiler} (is it installed? `cargo xtask setup` installs it): {e}"));
    assert!(
        out.status.success(),
        "compiling {} failed ({}):\n{}\n(`cargo xtask setup` installs the libraries the fixtures link with)",
        output.display(),
        show(&cmd),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A function name without its C++ parameter list: `leak_object(int)` → `leak_object`;
/// C names are returned as they are.
pub fn function_base(name: &str) -> &str {
    if !name.ends_with(')') {
        return name;
    }
    let mut depth = 0usize;
    for (i, c) in name.char_indices().rev() {
        match c {
            ')' => depth += 1,
            '(' => {
                depth -= 1;
                if depth == 0 {
                    return &name[..i];
                }
            }
            _ => {}
        }
    }
    name
}

/// Every site whose culprit is `base`, with or without a C++ parameter list, largest live
/// bytes first.
pub fn sites_named<'a>(report: &'a Report, base: &str) -> Vec<&'a Value> {
    let mut v: Vec<&Value> =
        report.sites().iter().filter(|s| s["function"].as_str().map(function_base) == Some(base)).collect();
    v.sort_by_key(|s| std::cmp::Reverse(u64_of(s, "live_bytes")));
    v
}

/// The site (the largest, if several) whose culprit is `base` (see [`sites_named`]); panics
/// showing all sites.
pub fn site_named<'a>(report: &'a Report, base: &str) -> &'a Value {
    sites_named(report, base).into_iter().next().unwrap_or_else(|| {
        panic!("no site has culprit function {base:?} (with or without parameters); sites:\n{}", report.summary())
    })
}

/// Function names of allocator internals and entry points, as blazesym names them (a test-side
/// approximation of leaktrace's own list): the frames a stack's culprit is searched past.
fn looks_like_allocator(function: &str) -> bool {
    const PREFIXES: &[&str] = &[
        "malloc",
        "calloc",
        "realloc",
        "free",
        "posix_memalign",
        "aligned_alloc",
        "memalign",
        "valloc",
        "pvalloc",
        "__libc_",
        "__GI___libc_",
        "_int_",
        "_mid_memalign",
        "__posix_memalign",
        "tcache_",
        "strdup",
        "__strdup",
        "strndup",
        "__strndup",
        "operator new",
        "operator delete",
        "tc_",
        "je_",
        "tcmalloc::",
    ];
    PREFIXES.iter().any(|p| function.starts_with(p))
}

/// [`recorded_totals`] for the stacks whose culprit is `base`, with or without a C++ parameter
/// list. The culprit is the first frame after the innermost one that is outside the
/// allocator's object or, in the same object (a static executable), not named like an
/// allocator function.
pub fn recorded_totals_named(dir: &Path, base: &str) -> SiteTotals {
    totals_where(dir, |frames| {
        let alloc_obj = frames.first().and_then(|f| f["object"].as_str());
        frames
            .iter()
            .skip(1)
            .find(|f| f["object"].as_str() != alloc_obj || !f["function"].as_str().is_some_and(looks_like_allocator))
            .and_then(|f| f["function"].as_str())
            .map(function_base)
            == Some(base)
    })
}

/// Call `f` every 20 ms until it returns Some, at most `timeout`.
pub fn wait_for<T>(timeout: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The children of process `pid` (of all its threads), from /proc/PID/task/*/children.
pub fn children_of(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for t in tasks.flatten() {
        if let Ok(text) = std::fs::read_to_string(t.path().join("children")) {
            out.extend(text.split_ascii_whitespace().filter_map(|p| p.parse::<u32>().ok()));
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}

/// /proc/PID/comm, without the newline.
pub fn comm_of(pid: u32) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/comm")).ok().map(|s| s.trim_end().to_string())
}

/// True while `pid` exists and is not a zombie.
pub fn process_alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(')').and_then(|(_, rest)| rest.split_ascii_whitespace().next().map(str::to_string)))
        .is_some_and(|st| st != "Z" && st != "X")
}

/// Where the cgroup v2 hierarchy is mounted (/proc/self/mountinfo): /sys/fs/cgroup on a
/// unified system, /sys/fs/cgroup/unified on a hybrid one. Err saying why there is none.
pub fn cgroup2_mount() -> Result<PathBuf, String> {
    let info = std::fs::read_to_string("/proc/self/mountinfo")
        .map_err(|e| format!("cannot read /proc/self/mountinfo: {e}"))?;
    let mut found: Vec<PathBuf> = info
        .lines()
        .filter_map(|l| {
            let (pre, post) = l.split_once(" - ")?;
            if post.split_ascii_whitespace().next()? != "cgroup2" {
                return None;
            }
            pre.split_ascii_whitespace().nth(4).map(PathBuf::from)
        })
        .collect();
    // Prefer the usual places.
    found.sort_by_key(|p| !p.starts_with("/sys/fs/cgroup"));
    found.into_iter().next().ok_or_else(|| {
        "no cgroup v2 hierarchy is mounted on this machine (no cgroup2 line in \
         /proc/self/mountinfo)"
            .to_string()
    })
}

/// A new, empty cgroup v2 directory; its processes are killed and the directory removed when
/// dropped.
pub struct TempCgroup {
    pub path: PathBuf,
}

impl TempCgroup {
    /// Err when there is no cgroup v2 hierarchy, or the directory cannot be created.
    pub fn new(name: &str) -> Result<TempCgroup, String> {
        static N: AtomicU32 = AtomicU32::new(0);
        let root = cgroup2_mount()?;
        let path =
            root.join(format!("leaktrace-test-{}-{name}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed)));
        std::fs::create_dir(&path).map_err(|e| format!("cannot create the cgroup {}: {e}", path.display()))?;
        Ok(TempCgroup { path })
    }

    /// Move process `pid` into this cgroup.
    pub fn add(&self, pid: u32) {
        let procs = self.path.join("cgroup.procs");
        std::fs::write(&procs, pid.to_string())
            .unwrap_or_else(|e| panic!("cannot move PID {pid} into {}: {e}", procs.display()));
    }

    /// The processes in this cgroup now.
    pub fn procs(&self) -> Vec<u32> {
        std::fs::read_to_string(self.path.join("cgroup.procs"))
            .map(|t| t.lines().filter_map(|l| l.trim().parse().ok()).collect())
            .unwrap_or_default()
    }
}

impl Drop for TempCgroup {
    fn drop(&mut self) {
        for pid in self.procs() {
            // SAFETY: kill has no memory-safety preconditions; these are the test's processes.
            unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
        }
        // A cgroup can be removed once its last process is gone (reaped by its parent).
        let removed = wait_for(Duration::from_secs(5), || std::fs::remove_dir(&self.path).ok());
        if removed.is_none() {
            eprintln!("cgroup {} could not be removed", self.path.display());
        }
    }
}

/// IDs of the eBPF programs that process `pid` holds file descriptors to (the `prog_id:` line of
/// /proc/PID/fdinfo/N).
pub fn bpf_prog_ids_of(pid: u32) -> Vec<u32> {
    let mut ids = Vec::new();
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fdinfo")) else {
        return ids;
    };
    for fd in fds.flatten() {
        if let Ok(text) = std::fs::read_to_string(fd.path()) {
            ids.extend(
                text.lines().filter_map(|l| l.strip_prefix("prog_id:")).filter_map(|v| v.trim().parse::<u32>().ok()),
            );
        }
    }
    ids.sort_unstable();
    ids.dedup();
    ids
}

/// Every loaded eBPF program as `bpftool prog show -j` lists it: (id, PIDs holding it). The
/// PIDs are empty when this bpftool is built without that feature (no `pids` field).
pub fn bpftool_progs() -> Vec<(u32, Vec<u32>)> {
    let out = Command::new("bpftool")
        .args(["prog", "show", "-j"])
        .output()
        .unwrap_or_else(|e| panic!("cannot run bpftool (is it installed? `cargo xtask setup` installs it): {e}"));
    assert!(out.status.success(), "bpftool prog show -j failed: {}", String::from_utf8_lossy(&out.stderr));
    let v: Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("bpftool prog show -j printed no JSON: {e}"));
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|p| {
                    let id = p["id"].as_u64()? as u32;
                    let pids = p["pids"]
                        .as_array()
                        .map(|ps| ps.iter().filter_map(|x| x["pid"].as_u64().map(|n| n as u32)).collect())
                        .unwrap_or_default();
                    Some((id, pids))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// True when the reported function name `reported` is `wanted`, or is the demangled C++ name of
/// `wanted` with its parameter list (`leak_new(int)`, `ns::f(char const*) const`).
pub fn same_function(reported: &str, wanted: &str) -> bool {
    reported == wanted || reported.strip_prefix(wanted).is_some_and(|rest| rest.starts_with('('))
}

/// The latest sample of every stack in a recording: checkpoints list only the sites whose totals
/// changed, so a site's totals at the end are its last sample in any checkpoint.
pub fn latest_samples(rec: &Value) -> std::collections::BTreeMap<u64, Value> {
    let mut out = std::collections::BTreeMap::new();
    for c in rec["checkpoints"].as_array().expect("recording has checkpoints") {
        for s in c["sites"].as_array().expect("checkpoint.sites") {
            out.insert(s["stack"].as_u64().unwrap_or(u64::MAX), s.clone());
        }
    }
    out
}
