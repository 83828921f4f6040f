//! Writing output files atomically: a reader sees the old file or the complete new one, never a
//! partial write (temporary file in the same directory, fsync, rename).

use std::io::Write as _;
use std::path::Path;

use anyhow::Context as _;

/// Write `data` to `path` atomically. Errors name the file.
pub fn write_atomic(path: &Path, data: &[u8]) -> anyhow::Result<()> {
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let name = path.file_name().context("output path has no file name")?.to_string_lossy();
    let tmp = dir.join(format!(".{name}.tmp.{}", std::process::id()));
    let result = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(data)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result.with_context(|| format!("cannot write {}", path.display()))
}

/// Output files that mark a directory as holding a recording (or a comparison) already.
pub const RECORDING_MARKERS: &[&str] = &["recording.json", "report.json", "check.json", "compare.json", "summary.json"];

/// Error if `dir` already holds the outputs of an earlier run: leaktrace never overwrites a
/// recording, nor leaves old and new files side by side.
pub fn ensure_fresh_dir(dir: &Path) -> anyhow::Result<()> {
    if let Some(old) = RECORDING_MARKERS.iter().map(|m| dir.join(m)).find(|p| p.exists()) {
        anyhow::bail!(
            "output directory {} already holds an earlier run ({}): choose another --out or remove it",
            dir.display(),
            old.display()
        );
    }
    Ok(())
}

/// Create `dir` (and parents) and check that files can be created in it. Used before attaching,
/// so that an unwritable --out is reported before anything is recorded.
pub fn ensure_writable_dir(dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create output directory {}", dir.display()))?;
    let probe = dir.join(format!(".leaktrace-write-test.{}", std::process::id()));
    std::fs::write(&probe, b"").with_context(|| format!("output directory {} is not writable", dir.display()))?;
    let _ = std::fs::remove_file(&probe);
    Ok(())
}

/// A default output directory name: `leaktrace-{what}-YYYYmmdd-HHMMSS` in local time, relative to
/// the current directory (e.g. `leaktrace-1234-20261130-002600`).
pub fn timestamped_dir(what: &str) -> std::path::PathBuf {
    // SAFETY: time and localtime_r only write to the given locals.
    let now = unsafe { libc::time(std::ptr::null_mut()) };
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    unsafe { libc::localtime_r(&now, &mut tm) };
    std::path::PathBuf::from(format!(
        "leaktrace-{what}-{:04}{:02}{:02}-{:02}{:02}{:02}",
        tm.tm_year + 1900,
        tm.tm_mon + 1,
        tm.tm_mday,
        tm.tm_hour,
        tm.tm_min,
        tm.tm_sec
    ))
}
