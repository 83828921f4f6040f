//! The processes and objects a recording starts from: the PIDs a target specification selects,
//! and the objects a command about to be launched will map (so its allocator is probed before its
//! first allocation).

use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

use anyhow::Context as _;

use crate::discover::{self, MappedObject};
use crate::launch::{self};

use super::*;

/// The directory of the cgroup `path`: as is when absolute, else under the cgroup2 mount of
/// /proc/self/mountinfo (or the v1 memory controller's mount: [`crate::cgroups::resolve`]).
pub fn cgroup_dir(path: &Path) -> PathBuf {
    crate::cgroups::resolve(path)
}

/// The processes of the cgroup v2 directory `dir` and of every cgroup below it, sorted (empty
/// when there is none or `dir` cannot be read). `watch --cgroup` of a node's `kubepods` root:
/// the root holds no process itself, its pods' container cgroups do. Cgroups that vanish while
/// they are walked are skipped.
pub fn cgroup_tree_pids(dir: &Path) -> Vec<u32> {
    let mut pids = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        if let Ok(text) = std::fs::read_to_string(d.join("cgroup.procs")) {
            pids.extend(text.lines().filter_map(|l| l.trim().parse::<u32>().ok()));
        }
        let Ok(entries) = std::fs::read_dir(&d) else { continue };
        dirs.extend(entries.flatten().filter(|e| e.file_type().is_ok_and(|t| t.is_dir())).map(|e| e.path()));
    }
    pids.sort_unstable();
    pids.dedup();
    pids
}

/// The PIDs a target specification selects (not for launch mode). Errors when none.
pub fn resolve_pids(spec: &TargetSpec) -> anyhow::Result<Vec<u32>> {
    let mut pids = match spec {
        TargetSpec::Pid(p) => vec![*p],
        TargetSpec::Pids(v) | TargetSpec::Found(v) => v.clone(),
        TargetSpec::Cgroup(path) => {
            let dir = cgroup_dir(path);
            let procs = dir.join("cgroup.procs");
            let text = std::fs::read_to_string(&procs).with_context(|| {
                format!("cannot read {} (is {} a cgroup directory?)", procs.display(), dir.display())
            })?;
            let pids: Vec<u32> = text.lines().filter_map(|l| l.trim().parse().ok()).collect();
            anyhow::ensure!(!pids.is_empty(), "cgroup {} has no processes", dir.display());
            crate::note!("leaktrace: --cgroup {}: {}", path.display(), crate::cgroups::describe(&dir));
            pids
        }
        TargetSpec::Container(id) => {
            anyhow::ensure!(
                id.len() >= 4,
                "container ID `{id}` is too short to match safely (give at least 4 characters)"
            );
            let mut pids = Vec::new();
            for entry in std::fs::read_dir("/proc")?.flatten() {
                let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
                if pid == std::process::id() {
                    continue;
                }
                if std::fs::read_to_string(entry.path().join("cgroup")).is_ok_and(|c| c.contains(id.as_str())) {
                    pids.push(pid);
                }
            }
            anyhow::ensure!(!pids.is_empty(), "no process belongs to a cgroup matching container ID `{id}`");
            pids
        }
        TargetSpec::Launch(_) => Vec::new(),
    };
    pids.sort_unstable();
    pids.dedup();
    Ok(pids)
}

/// Objects a command about to be launched will use, so that its allocator is probed before its
/// first allocation: its executable (a static binary is its own allocator; a script's
/// interpreter), the shared libraries its dynamic loader will load (asked with `ld.so --list`,
/// honouring LD_PRELOAD and LD_LIBRARY_PATH), and this host's C library as a fallback.
pub(super) fn launch_objects(exe: &Path) -> anyhow::Result<Vec<MappedObject>> {
    let mut out = Vec::new();
    let mut add = |path: &Path| -> anyhow::Result<()> {
        let m = std::fs::metadata(path).with_context(|| format!("cannot stat {}", path.display()))?;
        let dev = (libc::major(m.dev()) as i32, libc::minor(m.dev()) as i32);
        if !out.iter().any(|o: &MappedObject| o.dev == dev && o.inode == m.ino()) {
            out.push(MappedObject {
                path: path.to_path_buf(),
                dev,
                inode: m.ino(),
                open_path: path.to_path_buf(),
                executable: true,
            });
        }
        Ok(())
    };
    let exe = std::fs::canonicalize(exe).unwrap_or_else(|_| exe.to_path_buf());
    let program = script_interpreter(&exe).unwrap_or(exe.clone());
    // A script is not mapped as code (its interpreter runs it): only the interpreter is an
    // object (the script has no unwind table to load, which was told as a warning).
    add(&program)?;
    // A static executable maps no shared library: it is its own allocator (or, fully stripped,
    // has none to find, which must be said rather than probing a libc it never maps).
    let Some(libs) = loader_list(&program, None) else { return Ok(out) };
    for lib in libs {
        let _ = add(&lib);
    }
    for o in discover::mapped_objects(std::process::id())? {
        if leaktrace_analysis::system_libs::is_libc(&o.path.to_string_lossy()) {
            add(&o.path)?;
        }
    }
    Ok(out)
}

/// The objects of process `pid` held at its exec by the kernel side (see `Tracer::hold_execs`;
/// the process is stopped): what it maps (its executable and the dynamic loader, which has not
/// loaded a library yet) and the libraries the loader will load for the executable, listed by
/// that loader ([`loader_list`] with [`Confined`]: only the very loader the process maps, a
/// root-owned file no one else can write, run with the process's user and group and its
/// `LD_LIBRARY_PATH` / `LD_PRELOAD`, never a program the target picked). A process that runs
/// (not held), or whose root is not leaktrace's (chroot, container), gets its mapped objects
/// only: the rescans find the rest. Errors: its maps cannot be read.
pub(super) fn exec_objects(pid: u32) -> Result<Vec<MappedObject>, crate::discover::TargetError> {
    let mut objects = discover::mapped_objects(pid)?;
    if !crate::procinfo::stopped(pid) {
        return Ok(objects);
    }
    let same = |a: &str, b: &str| match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    };
    let exe = crate::procinfo::exe(pid);
    if !same(&format!("/proc/{pid}/root"), "/") || !same(&exe, &format!("/proc/{pid}/exe")) {
        return Ok(objects);
    }
    let Some(confined) = Confined::of(pid, &objects) else { return Ok(objects) };
    let libs = loader_list(Path::new(&exe), Some(&confined)).unwrap_or_default();
    for lib in libs {
        let Ok(m) = std::fs::metadata(&lib) else { continue };
        let dev = (libc::major(m.dev()) as i32, libc::minor(m.dev()) as i32);
        if !objects.iter().any(|o| o.dev == dev && o.inode == m.ino()) {
            objects.push(MappedObject { path: lib.clone(), dev, inode: m.ino(), open_path: lib, executable: true });
        }
    }
    Ok(objects)
}

/// How [`loader_list`] runs a loader for a process that is not leaktrace's own command: the
/// loader must be `loader` (device, inode: the one the process maps), and it runs as `uid` /
/// `gid` with only `env` (the process's loader variables).
pub(super) struct Confined {
    loader: (u64, u64),
    uid: u32,
    gid: u32,
    env: Vec<(String, String)>,
}

impl Confined {
    /// For process `pid`, whose `objects` include its dynamic loader (ld-*.so: the mapped object
    /// whose name starts with `ld-`); None when there is none or its status is unreadable.
    fn of(pid: u32, objects: &[MappedObject]) -> Option<Confined> {
        let ld = objects.iter().find(|o| o.path.file_name().is_some_and(|n| n.to_string_lossy().starts_with("ld-")))?;
        let m = std::fs::metadata(&ld.open_path).ok()?;
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        let id = |key: &str| -> Option<u32> {
            status.lines().find_map(|l| l.strip_prefix(key))?.split_ascii_whitespace().next()?.parse().ok()
        };
        let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
        let env = environ
            .split(|b| *b == 0)
            .filter_map(|kv| {
                let kv = String::from_utf8_lossy(kv);
                let (k, v) = kv.split_once('=')?;
                matches!(k, "LD_LIBRARY_PATH" | "LD_PRELOAD").then(|| (k.to_string(), v.to_string()))
            })
            .collect();
        Some(Confined { loader: (m.dev(), m.ino()), uid: id("Uid:")?, gid: id("Gid:")?, env })
    }
}

/// The interpreter of a `#!` script (resolved through PATH for `#!/usr/bin/env NAME`).
pub(super) fn script_interpreter(exe: &Path) -> Option<PathBuf> {
    use std::io::Read as _;
    let mut head = [0u8; 256];
    let n = std::fs::File::open(exe).ok()?.read(&mut head).ok()?;
    let line = head[..n].strip_prefix(b"#!")?;
    let line = String::from_utf8_lossy(line.split(|c| *c == b'\n').next()?).into_owned();
    let mut words = line.split_ascii_whitespace();
    let interp = PathBuf::from(words.next()?);
    let interp = if interp.file_name().is_some_and(|n| n == "env") {
        launch::resolve_command(Path::new(words.next()?)).ok()?
    } else {
        interp
    };
    Some(std::fs::canonicalize(&interp).unwrap_or(interp))
}

/// Shared libraries the dynamic loader will load for `exe` (PT_INTERP run with `--list`, which
/// resolves without running the program). None for a static executable (an ELF file without
/// PT_INTERP); empty on any other failure. `confined`: for a program leaktrace was not told to
/// run (a launched command's exec'd image), PT_INTERP must be that loader, owned by root and
/// writable by no one else, and it runs with that user, group and environment.
pub(super) fn loader_list(exe: &Path, confined: Option<&Confined>) -> Option<Vec<PathBuf>> {
    use object::read::elf::ProgramHeader as _;
    // Read on demand (the program headers and PT_INTERP), not the whole file.
    let Ok(file) = std::fs::File::open(exe) else { return Some(Vec::new()) };
    let data = object::ReadCache::new(file);
    let data = &data;
    let Ok(elf) = object::read::elf::ElfFile64::<object::Endianness, _>::parse(data) else { return Some(Vec::new()) };
    let endian = elf.endian();
    let interp = elf.elf_program_headers().iter().find_map(|ph| {
        (ph.p_type(endian) == object::elf::PT_INTERP)
            .then(|| ph.data(endian, data).ok())
            .flatten()
            .map(|d| String::from_utf8_lossy(d.split(|c| *c == 0).next().unwrap_or(d)).into_owned())
    });
    let interp = interp?;
    let mut cmd = std::process::Command::new(&interp);
    cmd.arg("--list").arg(exe).stderr(std::process::Stdio::null());
    if let Some(c) = confined {
        use std::os::unix::process::CommandExt as _;
        let Ok(m) = std::fs::metadata(&interp) else { return Some(Vec::new()) };
        if (m.dev(), m.ino()) != c.loader || m.uid() != 0 || m.mode() & 0o022 != 0 {
            return Some(Vec::new());
        }
        cmd.env_clear().envs(c.env.iter().map(|(k, v)| (k, v))).uid(c.uid).gid(c.gid);
    }
    let Ok(out) = cmd.output() else {
        return Some(Vec::new());
    };
    let libs = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let path = match l.split_once("=> ") {
                Some((_, rest)) => rest,
                None => l.trim_start(),
            };
            let path = path.split(" (").next()?.trim();
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect();
    Some(libs)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A confined loader run happens only for the loader named (device, inode): the system's
    /// ld.so lists /bin/true's libc; any other file named as the process's loader runs nothing.
    #[test]
    fn confined_loader_list_runs_only_the_mapped_loader() {
        let exe = Path::new("/bin/true");
        let Some(Some(interp)) = loader_interp(exe) else { return };
        let m = std::fs::metadata(&interp).expect("the loader");
        // SAFETY: getuid(2) takes nothing and cannot fail.
        let uid = unsafe { libc::getuid() };
        // SAFETY: getgid(2) takes nothing and cannot fail.
        let gid = unsafe { libc::getgid() };
        let ok = Confined { loader: (m.dev(), m.ino()), uid, gid, env: Vec::new() };
        let libs = loader_list(exe, Some(&ok)).expect("a dynamic executable");
        assert!(
            libs.iter().any(|l| l.file_name().is_some_and(|n| n.to_string_lossy().starts_with("libc.so"))),
            "{libs:?}"
        );
        let other = std::fs::metadata(exe).expect("/bin/true");
        let wrong = Confined { loader: (other.dev(), other.ino()), uid, gid, env: Vec::new() };
        assert_eq!(loader_list(exe, Some(&wrong)), Some(Vec::new()));
    }

    /// A kubelet-style tree (no process in the roots, containers below) gives every container's
    /// processes, each once, sorted; a directory that is no cgroup gives none.
    #[test]
    fn cgroup_tree_pids_walks_every_cgroup_below() {
        let root = tempfile::tempdir().expect("tempdir");
        let kubepods = root.path().join("kubepods");
        for (dir, procs) in [
            ("", ""),
            ("burstable", ""),
            ("burstable/podA", ""),
            ("burstable/podA/c1", "30\n10\n"),
            ("burstable/podA/c2", "20\n"),
            ("besteffort/podB/c3", "40\n10\n"),
        ] {
            let d = kubepods.join(dir);
            std::fs::create_dir_all(&d).expect("mkdir");
            std::fs::write(d.join("cgroup.procs"), procs).expect("cgroup.procs");
        }
        assert_eq!(cgroup_tree_pids(&kubepods), vec![10, 20, 30, 40]);
        assert_eq!(cgroup_tree_pids(&kubepods.join("burstable/podA/c2")), vec![20]);
        assert!(cgroup_tree_pids(&root.path().join("nothing")).is_empty());
    }

    /// PT_INTERP of `exe`: None when unreadable, Some(None) for a static executable.
    fn loader_interp(exe: &Path) -> Option<Option<String>> {
        use object::read::elf::ProgramHeader as _;
        let data = std::fs::read(exe).ok()?;
        let elf = object::read::elf::ElfFile64::<object::Endianness>::parse(&*data).ok()?;
        let endian = elf.endian();
        Some(elf.elf_program_headers().iter().find_map(|ph| {
            (ph.p_type(endian) == object::elf::PT_INTERP)
                .then(|| ph.data(endian, &*data).ok())
                .flatten()
                .map(|d| String::from_utf8_lossy(d.split(|c| *c == 0).next().unwrap_or(d)).into_owned())
        }))
    }
}
