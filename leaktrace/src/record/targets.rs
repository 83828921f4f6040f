//! The processes and objects a recording starts from: the PIDs a target specification selects,
//! and the objects a command about to be launched will map (so its allocator is probed before its
//! first allocation).

use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

use anyhow::Context as _;

use crate::discover::{self, MappedObject};
use crate::launch::{self};

use super::*;

/// The PIDs a target specification selects (not for launch mode). Errors when none.
pub fn resolve_pids(spec: &TargetSpec) -> anyhow::Result<Vec<u32>> {
    let mut pids = match spec {
        TargetSpec::Pid(p) => vec![*p],
        TargetSpec::Pids(v) => v.clone(),
        TargetSpec::Cgroup(path) => {
            let dir = if path.is_absolute() { path.clone() } else { Path::new("/sys/fs/cgroup").join(path) };
            let procs = dir.join("cgroup.procs");
            let text = std::fs::read_to_string(&procs).with_context(|| {
                format!("cannot read {} (is {} a cgroup v2 directory?)", procs.display(), dir.display())
            })?;
            let pids: Vec<u32> = text.lines().filter_map(|l| l.trim().parse().ok()).collect();
            anyhow::ensure!(!pids.is_empty(), "cgroup {} has no processes", dir.display());
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
    add(&exe)?;
    if program != exe {
        add(&program)?;
    }
    // A static executable maps no shared library: it is its own allocator (or, fully stripped,
    // has none to find, which must be said rather than probing a libc it never maps).
    let Some(libs) = loader_list(&program) else { return Ok(out) };
    for lib in libs {
        let _ = add(&lib);
    }
    for o in discover::mapped_objects(std::process::id())? {
        let name = o.path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        if name.starts_with("libc.so") || name.starts_with("libc-") || name.starts_with("libc.musl") {
            add(&o.path)?;
        }
    }
    Ok(out)
}

/// The objects of process `pid` just after an exec (held there by the kernel side, see
/// `Tracer::hold_execs`): what it maps (its executable and the dynamic loader, which has not
/// loaded a library yet) and, as at launch ([`launch_objects`]), the libraries the loader will
/// load for the executable — when its path names the same file in leaktrace's mount namespace
/// (a program in another root gets its mapped objects only; the periodic rescans find the rest).
/// Errors: its maps cannot be read.
pub(super) fn exec_objects(pid: u32) -> Result<Vec<MappedObject>, crate::discover::TargetError> {
    let mut objects = discover::mapped_objects(pid)?;
    let exe = crate::procinfo::exe(pid);
    let same_file = match (std::fs::metadata(&exe), std::fs::metadata(format!("/proc/{pid}/exe"))) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    };
    if same_file && let Ok(more) = launch_objects(Path::new(&exe)) {
        for o in more {
            if !objects.iter().any(|m| m.dev == o.dev && m.inode == o.inode) {
                objects.push(o);
            }
        }
    }
    Ok(objects)
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
/// PT_INTERP); empty on any other failure.
pub(super) fn loader_list(exe: &Path) -> Option<Vec<PathBuf>> {
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
    let Ok(out) =
        std::process::Command::new(&interp).arg("--list").arg(exe).stderr(std::process::Stdio::null()).output()
    else {
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
