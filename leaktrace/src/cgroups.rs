//! Where a `--cgroup PATH` is, and what its memory controller says, on every layout of the
//! cgroup file systems: pure cgroup v2 (one `cgroup2` mount, usually /sys/fs/cgroup), hybrid
//! (v1 controllers at /sys/fs/cgroup/CONTROLLER, cgroup2 at /sys/fs/cgroup/unified: systemd's
//! hybrid mode, Ubuntu 20.04, RHEL 8) and v1 only. The mounts come from /proc/self/mountinfo,
//! never from a fixed path.

use std::path::{Path, PathBuf};

/// Upper bound on what is read from /proc/self/mountinfo (a host with thousands of mounts
/// stays well under it).
const MOUNTINFO_MAX_BYTES: u64 = 4 << 20;

/// One cgroup file system mount.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CgroupMount {
    pub point: PathBuf,
    /// A `cgroup2` mount (else cgroup v1).
    pub v2: bool,
    /// The super options (a v1 mount's controllers: `rw,memory`).
    pub options: String,
}

impl CgroupMount {
    /// A v1 mount of the `memory` controller.
    fn v1_memory(&self) -> bool {
        !self.v2 && self.options.split(',').any(|o| o == "memory")
    }
}

/// A mountinfo field with the kernel's octal escapes (`\040` for a space) decoded.
fn unescape(field: &str) -> String {
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let digits = b.get(i + 1..i + 4).filter(|d| d.iter().all(|c| (b'0'..=b'7').contains(c)));
        if b[i] == b'\\'
            && let Some(d) = digits
        {
            out.push(d.iter().fold(0u8, |v, c| v.wrapping_mul(8).wrapping_add(c - b'0')));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The cgroup mounts of a mountinfo text, in its order.
pub fn parse_mounts(mountinfo: &str) -> Vec<CgroupMount> {
    mountinfo
        .lines()
        .filter_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            let point = left.split(' ').nth(4)?;
            let mut r = right.split(' ');
            let fstype = r.next()?;
            let options = r.nth(1).unwrap_or("").to_string();
            matches!(fstype, "cgroup" | "cgroup2").then(|| CgroupMount {
                point: PathBuf::from(unescape(point)),
                v2: fstype == "cgroup2",
                options,
            })
        })
        .collect()
}

/// The cgroup mounts of leaktrace's mount namespace (none when mountinfo cannot be read).
pub fn mounts() -> Vec<CgroupMount> {
    use std::io::Read as _;
    let mut text = String::new();
    if let Ok(f) = std::fs::File::open("/proc/self/mountinfo") {
        let _ = f.take(MOUNTINFO_MAX_BYTES).read_to_string(&mut text);
    }
    parse_mounts(&text)
}

/// The directory `path` names, given the cgroup `mounts`: an absolute path as is; a relative
/// one under the cgroup2 mount (pure v2 or hybrid), else under the v1 memory controller's mount
/// (a v1 memory cgroup named relative on a hybrid or v1 host), else under /sys/fs/cgroup — the
/// first of these that is a cgroup directory (holds `cgroup.procs`), or the first candidate when
/// none is (for the error message).
pub fn resolve_in(path: &Path, mounts: &[CgroupMount]) -> PathBuf {
    if path.is_absolute() {
        return path.to_path_buf();
    }
    let mut roots: Vec<&Path> = mounts.iter().filter(|m| m.v2).map(|m| m.point.as_path()).collect();
    roots.extend(mounts.iter().filter(|m| m.v1_memory()).map(|m| m.point.as_path()));
    roots.push(Path::new("/sys/fs/cgroup"));
    let candidates: Vec<PathBuf> = roots.iter().map(|r| r.join(path)).collect();
    candidates.iter().find(|d| d.join("cgroup.procs").exists()).unwrap_or(&candidates[0]).clone()
}

/// [`resolve_in`] with this namespace's mounts.
pub fn resolve(path: &Path) -> PathBuf {
    resolve_in(path, &mounts())
}

/// A memory cgroup's limit and usage, and the files they were read from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CgroupMemory {
    /// Bytes; None: no limit ("max" on v2, 2^60 or more on v1).
    pub limit: Option<u64>,
    pub usage: u64,
    /// The directory holding them (the cgroup itself, or its v1 memory twin).
    pub dir: PathBuf,
    /// "v2" (memory.max, memory.current) or "v1" (memory.limit_in_bytes, memory.usage_in_bytes).
    pub version: &'static str,
}

/// A small cgroup file's first line, bounded.
fn read_small(p: &Path) -> Option<String> {
    use std::io::Read as _;
    let mut s = String::new();
    std::fs::File::open(p).ok()?.take(4096).read_to_string(&mut s).ok()?;
    Some(s.lines().next().unwrap_or("").trim().to_string())
}

/// The memory limit and usage of cgroup directory `dir`: its v2 files, or its v1 ones (a path
/// in the v1 memory hierarchy); for a cgroup2 directory without the memory controller (a hybrid
/// host, where memory is a v1 controller), the v1 memory cgroup of the same relative path, when
/// there is one. None: no memory controller for it.
pub fn memory_in(dir: &Path, mounts: &[CgroupMount]) -> Option<CgroupMemory> {
    let v2 = |d: &Path| {
        let usage = read_small(&d.join("memory.current"))?.parse().ok()?;
        let limit = read_small(&d.join("memory.max"))?;
        Some(CgroupMemory { limit: limit.parse().ok(), usage, dir: d.to_path_buf(), version: "v2" })
    };
    let v1 = |d: &Path| {
        let usage = read_small(&d.join("memory.usage_in_bytes"))?.parse().ok()?;
        let limit = read_small(&d.join("memory.limit_in_bytes"))?.parse::<u64>().ok().filter(|v| *v < 1 << 60);
        Some(CgroupMemory { limit, usage, dir: d.to_path_buf(), version: "v1" })
    };
    if let Some(m) = v2(dir).or_else(|| v1(dir)) {
        return Some(m);
    }
    let rel = mounts.iter().filter(|m| m.v2).find_map(|m| dir.strip_prefix(&m.point).ok())?;
    mounts.iter().filter(|m| m.v1_memory()).find_map(|m| v1(&m.point.join(rel)))
}

/// [`memory_in`] with this namespace's mounts.
pub fn memory(dir: &Path) -> Option<CgroupMemory> {
    memory_in(dir, &mounts())
}

/// "cgroup DIR (memory limit 256.0 MiB, usage 1.2 MiB: v1 memory.limit_in_bytes in DIR2)": where
/// a `--cgroup` resolved to and what its memory controller says, for the agent's first note.
pub fn describe(dir: &Path) -> String {
    let mib = |b: u64| format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64);
    match memory(dir) {
        Some(m) => {
            let limit = m.limit.map_or_else(|| "none".to_string(), mib);
            let files = if m.version == "v2" {
                "memory.max, memory.current"
            } else {
                "memory.limit_in_bytes, memory.usage_in_bytes"
            };
            format!(
                "cgroup {} (memory limit {limit}, usage {}: cgroup {} {files} in {})",
                dir.display(),
                mib(m.usage),
                m.version,
                m.dir.display()
            )
        }
        None => format!("cgroup {} (no memory controller found for it)", dir.display()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID: &str = "\
25 30 0:22 / /sys rw,nosuid - sysfs sysfs rw
31 25 0:26 / /sys/fs/cgroup ro - tmpfs tmpfs ro,mode=755
32 31 0:27 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw,nsdelegate
35 31 0:30 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory
36 31 0:31 / /sys/fs/cgroup/cpu\\040x rw - cgroup cgroup rw,cpu
";

    #[test]
    fn mounts_of_a_hybrid_host() {
        let m = parse_mounts(HYBRID);
        assert_eq!(m.len(), 3);
        assert!(m[0].v2 && m[0].point == Path::new("/sys/fs/cgroup/unified"));
        assert!(m[1].v1_memory() && !m[2].v1_memory());
        assert_eq!(m[2].point, Path::new("/sys/fs/cgroup/cpu x"), "octal escapes decoded");
    }

    /// A relative path goes under the cgroup2 mount when it is a cgroup there, else under the v1
    /// memory mount, never plainly under /sys/fs/cgroup first; an absolute path stays.
    #[test]
    fn relative_paths_resolve_against_the_mounts() {
        let root = tempfile::tempdir().unwrap();
        let (v2, mem) = (root.path().join("unified"), root.path().join("memory"));
        for d in [v2.join("svc"), mem.join("svc"), mem.join("only-v1")] {
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("cgroup.procs"), "").unwrap();
        }
        let mounts = vec![
            CgroupMount { point: v2.clone(), v2: true, options: "rw".into() },
            CgroupMount { point: mem.clone(), v2: false, options: "rw,memory".into() },
        ];
        assert_eq!(resolve_in(Path::new("svc"), &mounts), v2.join("svc"));
        assert_eq!(resolve_in(Path::new("only-v1"), &mounts), mem.join("only-v1"));
        assert_eq!(resolve_in(Path::new("none"), &mounts), v2.join("none"));
        assert_eq!(resolve_in(Path::new("/abs/x"), &mounts), PathBuf::from("/abs/x"));
        // A cgroup2 directory without memory files takes the v1 memory twin's figures.
        std::fs::write(mem.join("svc/memory.usage_in_bytes"), "4096\n").unwrap();
        std::fs::write(mem.join("svc/memory.limit_in_bytes"), "268435456\n").unwrap();
        let m = memory_in(&v2.join("svc"), &mounts).expect("the v1 twin");
        assert_eq!((m.limit, m.usage, m.version), (Some(256 << 20), 4096, "v1"));
        assert_eq!(m.dir, mem.join("svc"));
        std::fs::write(mem.join("svc/memory.limit_in_bytes"), "9223372036854771712\n").unwrap();
        assert_eq!(memory_in(&mem.join("svc"), &mounts).map(|m| m.limit), Some(None));
        std::fs::write(v2.join("svc/memory.current"), "8192\n").unwrap();
        std::fs::write(v2.join("svc/memory.max"), "max\n").unwrap();
        let m = memory_in(&v2.join("svc"), &mounts).expect("v2 files");
        assert_eq!((m.limit, m.usage, m.version), (None, 8192, "v2"));
        assert!(memory_in(&v2.join("none"), &mounts).is_none());
    }
}
