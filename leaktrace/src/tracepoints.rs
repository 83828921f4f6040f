//! The tracepoint record layouts the kernel side reads (`leaktrace_common::tp_field`), from the
//! running kernel's format files: tracefs `events/GROUP/EVENT/format`, lines such as
//! `field:unsigned long len; offset:24; size:8; signed:0;` (tab-separated).

use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};
use leaktrace_common::tp_field;

/// Where tracefs is mounted (the first of its two usual places that has `events/`).
fn tracefs() -> Option<PathBuf> {
    ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"].iter().map(PathBuf::from).find(|p| p.join("events").is_dir())
}

/// (offset, size) of field `name` in a format file's text.
fn field(format: &str, name: &str) -> Option<(u32, u32)> {
    format.lines().find_map(|line| {
        let decl = line.trim().strip_prefix("field:")?.split(';').next()?;
        // The last word of the declaration, without an array suffix (`char parent_comm[16]`).
        let last = decl.split_whitespace().last()?;
        let field_name = last.split('[').next()?;
        if field_name != name {
            return None;
        }
        let num = |key: &str| line.split(key).nth(1)?.split(';').next()?.trim().parse::<u32>().ok();
        Some((num("offset:")?, num("size:")?))
    })
}

/// The offsets of every `tp_field` from the format files under `root` (a tracefs mount).
/// Errors: a missing format file or field, a field whose size is not the one the kernel side
/// reads, or two events that must share an offset (the `sys_exit_*` events' `ret`) disagreeing.
/// An event of [`tp_field::OPTIONAL_EVENTS`] without a format file keeps its default offsets
/// (its program is not attached then).
pub fn offsets_in(root: &Path) -> anyhow::Result<[u32; tp_field::NUM]> {
    let mut out = [u32::MAX; tp_field::NUM];
    // Several fields come from one event: each format file is read once.
    let mut formats: std::collections::HashMap<&str, String> = std::collections::HashMap::new();
    for (index, event, name, size, default) in tp_field::FIELDS {
        let path = root.join("events").join(event).join("format");
        if !formats.contains_key(event) {
            let text = match std::fs::read_to_string(&path) {
                Err(_) if tp_field::OPTIONAL_EVENTS.contains(&event) && !path.exists() => {
                    out[index] = default;
                    continue;
                }
                r => r.with_context(|| format!("reading {}", path.display()))?,
            };
            formats.insert(event, text);
        }
        let (offset, found_size) =
            field(&formats[event], name).with_context(|| format!("no field `{name}` in {}", path.display()))?;
        if found_size != size {
            bail!("{event}: field `{name}` is {found_size} bytes, leaktrace reads {size}");
        }
        if out[index] != u32::MAX && out[index] != offset {
            bail!("{event}: field `{name}` at offset {offset}, other events have it at {}", out[index]);
        }
        out[index] = offset;
    }
    Ok(out)
}

/// The offsets from the running kernel's tracefs; when tracefs cannot be read, this project's
/// kernel's (`tp_field::defaults`) with the reason, for a warning. Errors as [`offsets_in`]
/// when the files are there but do not describe fields leaktrace can read.
pub fn offsets() -> anyhow::Result<([u32; tp_field::NUM], Option<String>)> {
    match tracefs() {
        Some(root) => Ok((offsets_in(&root)?, None)),
        None => Ok((
            tp_field::defaults(),
            Some("tracefs is not mounted: the tracepoint layouts of Linux 6.18 are assumed".to_string()),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The running kernel's files have every field, and (on the kernel this project is built
    /// on) at the offsets the defaults carry.
    #[test]
    fn running_kernel_layouts() {
        let Some(root) = tracefs() else { return };
        let found = offsets_in(&root).unwrap();
        assert!(found.iter().all(|&o| (8..256).contains(&o)), "{found:?}");
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
        if release.starts_with("6.18") {
            assert_eq!(found, tp_field::defaults());
        }
    }

    /// Older kernels' `sched_process_fork` (fixed-size command names): `child_pid` at 44.
    #[test]
    fn parses_fixed_size_arrays_and_data_loc() {
        let old = "\tfield:char parent_comm[16];\toffset:8;\tsize:16;\tsigned:0;\n\
                   \tfield:pid_t parent_pid;\toffset:24;\tsize:4;\tsigned:1;\n\
                   \tfield:char child_comm[16];\toffset:28;\tsize:16;\tsigned:0;\n\
                   \tfield:pid_t child_pid;\toffset:44;\tsize:4;\tsigned:1;\n";
        assert_eq!(field(old, "child_pid"), Some((44, 4)));
        assert_eq!(field(old, "child_comm"), Some((28, 16)));
        let new = "\tfield:__data_loc char[] child_comm;\toffset:16;\tsize:4;\tsigned:0;\n\
                   \tfield:pid_t child_pid;\toffset:20;\tsize:4;\tsigned:1;\n";
        assert_eq!(field(new, "child_pid"), Some((20, 4)));
        assert_eq!(field(new, "parent_pid"), None);
    }

    #[test]
    fn missing_field_is_an_error() {
        let dir = std::env::temp_dir().join(format!("lt-tracefs-{}", std::process::id()));
        let ev = dir.join("events/syscalls/sys_enter_mmap");
        std::fs::create_dir_all(&ev).unwrap();
        std::fs::write(ev.join("format"), "\tfield:unsigned long addr;\toffset:16;\tsize:8;\tsigned:0;\n").unwrap();
        let e = offsets_in(&dir).unwrap_err().to_string();
        assert!(e.contains("no field `len`"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
