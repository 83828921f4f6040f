//! Output directories and files: the one module through which leaktrace writes (recording.json,
//! the report, check.json, compare's outputs, the summary). leaktrace runs as root and writes
//! where it is told (`--out`) or into a directory it names in the current one, which may be a
//! shared place such as /tmp where another user can plant a symlink or a file. The rules
//! (docs/reliability.md, "Output directory"):
//!
//! - A directory leaktrace names itself (the default timestamped one, a `pid-N` subdirectory)
//!   is made with `mkdir`, exclusively: if anything is at that path already (a directory, a file,
//!   a symlink), a default name takes the next suffix (`NAME-2`, `NAME-3`, …), a subdirectory is
//!   an error. Nothing already there is ever used.
//! - An explicit `--out` that does not exist is made the same way (its missing parents with it).
//!   One that exists is used only when it is a directory (not a symlink to one), owned by the
//!   user running leaktrace, writable by no one else (mode without group/other write), and holds
//!   no earlier run ([`RECORDING_MARKERS`]). Otherwise: a one-line error, nothing written.
//! - The directory is opened once (`O_DIRECTORY|O_NOFOLLOW`) and every file is created relative
//!   to that descriptor: a temporary `.NAME.PID.N.tmp` with `O_CREAT|O_EXCL|O_NOFOLLOW`, written,
//!   fsynced and renamed onto `NAME` (`renameat`, which replaces a link at `NAME` rather than
//!   following it). A reader sees no file or the complete one, never a partial write; on any
//!   error (a full disk, a quota) the temporary is removed and no file appears under `NAME`.
//! - Permissions are set exactly, whatever the umask: directories 0700 and files 0600 by default
//!   (reports carry argv, strings and names read from the targets); `--out-mode 0750` gives
//!   directories that mode and files the same bits without x ([`set_mode`]).
//! - When recording.json cannot be written into its directory, [`save_fallback`] keeps it in a
//!   new file (exclusively created, random name) under `$TMPDIR`, /var/tmp or /tmp.

use std::io::Write;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use anyhow::Context as _;
use rustix::fs::{AtFlags, Mode, OFlags};

/// Output files that mark a directory as holding a recording (or a comparison) already.
pub const RECORDING_MARKERS: &[&str] = &["recording.json", "report.json", "check.json", "compare.json", "summary.json"];

/// The other files a run writes (`report::FILES` but report.json): one of them that is not a
/// symlink (a user's own report.md, say) refuses the directory too, where it would be replaced
/// without a word; a symlink planted at one of these names is replaced, never followed (it holds
/// nothing to lose).
pub const OUTPUT_FILES: &[&str] =
    &["report.md", "stacks.folded", "live.svg", "growth.svg", "memory.svg", "profile.pb.gz", "growth.pb.gz"];

/// Permission bits of the directories leaktrace makes, set exactly (whatever the umask): 0700
/// by default, since reports carry argv, strings and names read from the targets; `--out-mode`
/// ([`set_mode`]) changes it. Files get the same bits without x (0600 by default).
static MODE: AtomicU32 = AtomicU32::new(DEFAULT_MODE);
/// The default of [`MODE`].
pub const DEFAULT_MODE: u32 = 0o700;

/// Set the permission bits of output directories (`--out-mode`, octal); files get them without
/// the x bits. Refused: bits outside 0755 (group or other write would make the directory one
/// leaktrace itself refuses to write into again; set-id and sticky bits are no report's business)
/// and modes without 0700 (leaktrace must write and enter what it makes).
pub fn set_mode(mode: u32) -> anyhow::Result<()> {
    anyhow::ensure!(
        mode & !0o755 == 0 && mode & 0o700 == 0o700,
        "--out-mode {mode:04o}: give octal bits within 0755 that include 0700 (e.g. 0700, 0750, 0755)"
    );
    MODE.store(mode, Ordering::Relaxed);
    Ok(())
}

/// `--out-mode`'s value: octal digits, with or without a leading 0 or 0o.
pub fn parse_mode(s: &str) -> Result<u32, String> {
    let digits = s.strip_prefix("0o").unwrap_or(s);
    u32::from_str_radix(digits, 8).map_err(|_| format!("{s:?} is not an octal mode such as 0700 or 0750"))
}

fn dir_mode() -> u32 {
    MODE.load(Ordering::Relaxed)
}

fn file_mode() -> u32 {
    MODE.load(Ordering::Relaxed) & 0o666
}

/// Set `fd`'s permission bits exactly to `mode`.
fn chmod(fd: &OwnedFd, mode: u32) -> std::io::Result<()> {
    rustix::fs::fchmod(fd, Mode::from_raw_mode(mode)).map_err(io)
}
/// How many suffixed names a default directory name tries when the plain one is taken.
const DEFAULT_NAME_TRIES: u32 = 100;

/// An output directory, opened once: every file is created relative to its descriptor, so
/// neither a symlink planted at the directory's path nor one at a file's path can redirect a
/// write. Made by [`OutDir::create_named`], [`OutDir::for_out`], [`OutDir::existing`] or
/// [`OutDir::subdir`].
#[derive(Debug)]
pub struct OutDir {
    fd: OwnedFd,
    path: PathBuf,
}

fn io(e: rustix::io::Errno) -> std::io::Error {
    e.into()
}

impl OutDir {
    /// Make a new directory named by leaktrace (a default output directory): `path`, or when
    /// anything is at that path already, `path-2`, `path-3`, … (up to 100 tries). Missing parents
    /// are created. Errors: no name free, or the directory cannot be made, opened or written.
    pub fn create_named(path: &Path) -> anyhow::Result<OutDir> {
        create_parents(path)?;
        for n in 1..=DEFAULT_NAME_TRIES {
            let p = if n == 1 { path.to_path_buf() } else { suffixed(path, n) };
            match rustix::fs::mkdir(&p, Mode::from_raw_mode(dir_mode())) {
                Ok(()) => return OutDir::open_made(&p),
                Err(rustix::io::Errno::EXIST) => continue,
                Err(e) => {
                    return Err(io(e)).with_context(|| format!("cannot create output directory {}", p.display()));
                }
            }
        }
        anyhow::bail!(
            "cannot create output directory {}: it and {} suffixed names exist already",
            path.display(),
            DEFAULT_NAME_TRIES - 1
        )
    }

    /// The directory of an explicit `--out PATH`: made exclusively when nothing is at `path`;
    /// an existing one is used only when it is a real directory (not a symlink) owned by the
    /// effective user, not writable by group or others, and without an earlier run. Errors say
    /// which rule refused it.
    pub fn for_out(path: &Path) -> anyhow::Result<OutDir> {
        create_parents(path)?;
        let dir = match rustix::fs::mkdir(path, Mode::from_raw_mode(dir_mode())) {
            Ok(()) => OutDir::open_made(path)?,
            Err(rustix::io::Errno::EXIST) => OutDir::existing(path)?,
            Err(e) => {
                return Err(io(e)).with_context(|| format!("cannot create output directory {}", path.display()));
            }
        };
        dir.ensure_fresh()?;
        Ok(dir)
    }

    /// An existing directory to write into (`leaktrace report DIR`): opened without following
    /// a symlink at `path`, and accepted only when owned by the effective user and not writable
    /// by group or others, and when files can be created in it.
    pub fn existing(path: &Path) -> anyhow::Result<OutDir> {
        let fd = open_dir(path)?;
        let st = rustix::fs::fstat(&fd).with_context(|| format!("cannot stat {}", path.display()))?;
        let euid = rustix::process::geteuid().as_raw();
        if st.st_uid != euid {
            anyhow::bail!(
                "output directory {} is owned by uid {}, not by the user running leaktrace (uid {euid}): choose another --out",
                path.display(),
                st.st_uid
            );
        }
        if st.st_mode & 0o022 != 0 {
            anyhow::bail!(
                "output directory {} is writable by other users (mode {:o}): choose another --out",
                path.display(),
                st.st_mode & 0o7777
            );
        }
        let dir = OutDir { fd, path: path.to_path_buf() };
        dir.probe_writable()?;
        Ok(dir)
    }

    /// A new subdirectory `name` (one path component) of this one, made exclusively (`mkdirat`):
    /// an error when anything is there already.
    pub fn subdir(&self, name: &str) -> anyhow::Result<OutDir> {
        let path = self.path.join(name);
        check_name(name)?;
        rustix::fs::mkdirat(&self.fd, name, Mode::from_raw_mode(dir_mode()))
            .map_err(io)
            .with_context(|| format!("cannot create output directory {}", path.display()))?;
        let fd = rustix::fs::openat(
            &self.fd,
            name,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(io)
        .with_context(|| format!("cannot open output directory {}", path.display()))?;
        chmod(&fd, dir_mode()).with_context(|| format!("cannot set the mode of {}", path.display()))?;
        Ok(OutDir { fd, path })
    }

    /// The directory's path as given (for messages and the paths returned by [`OutDir::write`]).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Another handle on the same open directory.
    pub fn try_clone(&self) -> anyhow::Result<OutDir> {
        let fd = self.fd.try_clone().with_context(|| format!("cannot duplicate {}", self.path.display()))?;
        Ok(OutDir { fd, path: self.path.clone() })
    }

    /// Write `data` as the file `name` (one path component) in this directory, atomically:
    /// exclusively created temporary, fsync, `renameat` onto `name`. Returns the file's path.
    /// Errors (a full disk: "No space left on device") name the file; no file is left under
    /// `name` or under the temporary name.
    pub fn write(&self, name: &str, data: &[u8]) -> anyhow::Result<PathBuf> {
        self.write_with(name, |w| w.write_all(data))
    }

    /// [`OutDir::write`] with the content streamed by `fill` (through a buffer) instead of held
    /// whole in memory: a recording of many stacks is hundreds of MB of JSON. Same atomicity and
    /// errors; an error of `fill` leaves no file.
    pub fn write_with(
        &self,
        name: &str,
        fill: impl FnOnce(&mut dyn Write) -> std::io::Result<()>,
    ) -> anyhow::Result<PathBuf> {
        let path = self.path.join(name);
        check_name(name)?;
        let (tmp, fd) = self.create_temp(name).with_context(|| format!("cannot write {}", path.display()))?;
        let result = (|| -> std::io::Result<()> {
            let mut w = std::io::BufWriter::with_capacity(1 << 20, std::fs::File::from(fd));
            fill(&mut w)?;
            let f = w.into_inner().map_err(|e| e.into_error())?;
            f.sync_all()?;
            drop(f);
            rustix::fs::renameat(&self.fd, &tmp, &self.fd, name).map_err(io)
        })();
        if let Err(e) = result {
            let _ = rustix::fs::unlinkat(&self.fd, &tmp, AtFlags::empty());
            return Err(e).with_context(|| format!("cannot write {}", path.display()));
        }
        // The rename is durable once the directory is synced; a failure here loses nothing.
        let _ = rustix::fs::fsync(&self.fd);
        Ok(path)
    }

    /// Error if this directory already holds the outputs of an earlier run: leaktrace never
    /// overwrites a recording, nor leaves old and new files side by side. A marker name taken by
    /// anything (a symlink included) counts; of the other output names (`OUTPUT_FILES`), anything but a
    /// symlink.
    pub fn ensure_fresh(&self) -> anyhow::Result<()> {
        let user_file = |m: &str| {
            rustix::fs::statat(&self.fd, m, AtFlags::SYMLINK_NOFOLLOW)
                .is_ok_and(|st| rustix::fs::FileType::from_raw_mode(st.st_mode) != rustix::fs::FileType::Symlink)
        };
        for m in RECORDING_MARKERS.iter().chain(OUTPUT_FILES.iter().filter(|m| user_file(m))) {
            if rustix::fs::statat(&self.fd, *m, AtFlags::SYMLINK_NOFOLLOW).is_ok() {
                anyhow::bail!(
                    "output directory {} already holds an earlier run ({}, a file leaktrace writes): choose another --out \
                     or remove it",
                    self.path.display(),
                    self.path.join(m).display()
                );
            }
        }
        Ok(())
    }

    /// A fresh temporary file for `name`: `.NAME.PID.N.tmp`, created with O_EXCL|O_NOFOLLOW
    /// (another name is tried when one is taken).
    fn create_temp(&self, name: &str) -> std::io::Result<(String, OwnedFd)> {
        static N: AtomicU32 = AtomicU32::new(0);
        let mut last = std::io::Error::other("no temporary name free");
        for _ in 0..100 {
            let tmp = format!(".{name}.{}.{}.tmp", std::process::id(), N.fetch_add(1, Ordering::Relaxed));
            match rustix::fs::openat(
                &self.fd,
                &tmp,
                OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::from_raw_mode(file_mode()),
            ) {
                Ok(fd) => {
                    if let Err(e) = chmod(&fd, file_mode()) {
                        let _ = rustix::fs::unlinkat(&self.fd, &tmp, AtFlags::empty());
                        return Err(e);
                    }
                    return Ok((tmp, fd));
                }
                Err(rustix::io::Errno::EXIST) => last = io(rustix::io::Errno::EXIST),
                Err(e) => return Err(io(e)),
            }
        }
        Err(last)
    }

    /// A directory leaktrace has just made at `path`: open it without following a link and
    /// check that it is the one made (owned by the effective user, not writable by others) and
    /// that files can be created in it.
    fn open_made(path: &Path) -> anyhow::Result<OutDir> {
        let dir = OutDir::existing(path)?;
        chmod(&dir.fd, dir_mode()).with_context(|| format!("cannot set the mode of {}", path.display()))?;
        Ok(dir)
    }

    /// Create and remove an empty temporary file: an unwritable directory is reported before
    /// anything is recorded.
    fn probe_writable(&self) -> anyhow::Result<()> {
        let (tmp, fd) = self
            .create_temp("leaktrace-write-test")
            .with_context(|| format!("output directory {} is not writable", self.path.display()))?;
        drop(fd);
        let _ = rustix::fs::unlinkat(&self.fd, &tmp, AtFlags::empty());
        Ok(())
    }
}

/// Open `path` as a directory without following a symlink at its last component.
fn open_dir(path: &Path) -> anyhow::Result<OwnedFd> {
    match rustix::fs::open(path, OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC, Mode::empty())
    {
        Ok(fd) => Ok(fd),
        // With O_DIRECTORY a symlink gives ENOTDIR (or ELOOP): say which it is.
        Err(rustix::io::Errno::LOOP | rustix::io::Errno::NOTDIR) => {
            if std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink()) {
                anyhow::bail!(
                    "output directory {} is a symlink: leaktrace does not write through links",
                    path.display()
                )
            }
            anyhow::bail!("output path {} is not a directory", path.display())
        }
        Err(e) => Err(io(e)).with_context(|| format!("cannot open output directory {}", path.display())),
    }
}

/// Create the missing parents of `path` (the user's choice of place; its last component is
/// made by the caller, exclusively).
fn create_parents(path: &Path) -> anyhow::Result<()> {
    let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) else { return Ok(()) };
    // The nearest part of the path that exists must be a directory (else create_dir_all says
    // only "File exists").
    if let Some(existing) =
        parent.ancestors().find(|a| !a.as_os_str().is_empty() && std::fs::symlink_metadata(a).is_ok())
        && !existing.is_dir()
    {
        anyhow::bail!(
            "cannot create output directory {}: {} exists and is not a directory",
            parent.display(),
            existing.display()
        );
    }
    use std::os::unix::fs::DirBuilderExt as _;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(dir_mode())
        .create(parent)
        .with_context(|| format!("cannot create output directory {}", parent.display()))
}

fn suffixed(path: &Path, n: u32) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(format!("-{n}"));
    PathBuf::from(s)
}

/// A file name must be one plain path component.
fn check_name(name: &str) -> anyhow::Result<()> {
    anyhow::ensure!(
        !name.is_empty() && name != "." && name != ".." && !name.contains('/'),
        "internal error: output file name {name:?} is not one path component"
    );
    Ok(())
}

/// Keep `data` (a recording that could not be written where it belongs) in a new file
/// `PREFIX-XXXXXX.json` under `$TMPDIR`, then /var/tmp, then /tmp (the first that takes it),
/// created exclusively with a random name and mode 0600. Returns its path. Errors list every
/// place tried.
pub fn save_fallback(prefix: &str, data: &[u8]) -> anyhow::Result<PathBuf> {
    let mut places: Vec<PathBuf> = Vec::new();
    if let Some(t) = std::env::var_os("TMPDIR").filter(|t| !t.is_empty()) {
        places.push(t.into());
    }
    for p in ["/var/tmp", "/tmp"] {
        if !places.iter().any(|q| q == Path::new(p)) {
            places.push(p.into());
        }
    }
    let mut errors = Vec::new();
    for dir in &places {
        let result = (|| -> std::io::Result<PathBuf> {
            let mut f = tempfile::Builder::new().prefix(&format!("{prefix}-")).suffix(".json").tempfile_in(dir)?;
            f.write_all(data)?;
            f.as_file().sync_all()?;
            let (_, path) = f.keep().map_err(|e| e.error)?;
            Ok(path)
        })();
        match result {
            Ok(p) => return Ok(p),
            Err(e) => errors.push(format!("{}: {e}", dir.display())),
        }
    }
    anyhow::bail!("no temporary place took it ({})", errors.join("; "))
}

/// The current time broken down (`tm_year` counts from 1900, `tm_mon` from 0): in UTC when
/// `utc`, else in the local time zone.
pub fn calendar_now(utc: bool) -> libc::tm {
    // SAFETY: time(2) with a null pointer only returns the time.
    let now = unsafe { libc::time(std::ptr::null_mut()) };
    // SAFETY: libc::tm is plain data (integers and a pointer the all-zero value makes null).
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    if utc {
        // SAFETY: gmtime_r only reads `now` and writes the local `tm`.
        unsafe { libc::gmtime_r(&now, &mut tm) };
    } else {
        // SAFETY: localtime_r only reads `now` and writes the local `tm`.
        unsafe { libc::localtime_r(&now, &mut tm) };
    }
    tm
}

/// A default output directory name: `leaktrace-{what}-YYYYmmdd-HHMMSS` in local time, relative to
/// the current directory (e.g. `leaktrace-1234-20261130-002600`). Made with
/// [`OutDir::create_named`].
pub fn timestamped_dir(what: &str) -> std::path::PathBuf {
    let tm = calendar_now(false);
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "leaktrace-output-test-{}-{name}-{}",
            std::process::id(),
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos())
        ));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
        d
    }

    #[test]
    fn a_symlink_at_a_file_name_is_replaced_not_followed() {
        let d = scratch("link");
        let victim = d.join("victim");
        std::fs::write(&victim, b"precious").unwrap();
        let out = OutDir::for_out(&d.join("out")).unwrap();
        std::os::unix::fs::symlink(&victim, d.join("out/report.md")).unwrap();
        out.write("report.md", b"new").unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious", "the link's target is untouched");
        assert!(!std::fs::symlink_metadata(d.join("out/report.md")).unwrap().file_type().is_symlink());
        assert_eq!(std::fs::read(d.join("out/report.md")).unwrap(), b"new");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_symlink_or_file_at_the_directory_path_is_refused_or_skipped() {
        let d = scratch("dirlink");
        let elsewhere = scratch("elsewhere");
        std::os::unix::fs::symlink(&elsewhere, d.join("out")).unwrap();
        let e = OutDir::for_out(&d.join("out")).unwrap_err();
        assert!(format!("{e:#}").contains("is a symlink"), "{e:#}");
        std::fs::write(d.join("file"), b"x").unwrap();
        let e = OutDir::for_out(&d.join("file")).unwrap_err();
        assert!(format!("{e:#}").contains("not a directory"), "{e:#}");
        // A default name taken by a link gets a suffix; the link's target stays empty.
        let named = OutDir::create_named(&d.join("out")).unwrap();
        assert_eq!(named.path(), d.join("out-2"));
        named.write("recording.json", b"{}").unwrap();
        assert_eq!(std::fs::read_dir(&elsewhere).unwrap().count(), 0);
        std::fs::remove_dir_all(&d).unwrap();
        std::fs::remove_dir_all(&elsewhere).unwrap();
    }

    #[test]
    fn an_existing_out_must_be_private_and_fresh() {
        let d = scratch("existing");
        let open = d.join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = OutDir::for_out(&open).unwrap_err();
        assert!(format!("{e:#}").contains("writable by other users"), "{e:#}");
        let used = d.join("used");
        std::fs::create_dir(&used).unwrap();
        std::os::unix::fs::symlink("/nonexistent", used.join("recording.json")).unwrap();
        let e = OutDir::for_out(&used).unwrap_err();
        assert!(format!("{e:#}").contains("already holds an earlier run"), "{e:#}");
        let ok = d.join("ok");
        std::fs::create_dir(&ok).unwrap();
        OutDir::for_out(&ok).unwrap().write("a", b"1").unwrap();
        assert_eq!(std::fs::read_dir(&ok).unwrap().count(), 1, "no temporary left behind");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn subdirectories_are_made_exclusively() {
        let d = scratch("sub");
        let out = OutDir::for_out(&d.join("out")).unwrap();
        std::os::unix::fs::symlink("/", d.join("out/pid-1")).unwrap();
        let e = out.subdir("pid-1").unwrap_err();
        assert!(format!("{e:#}").contains("File exists"), "{e:#}");
        out.subdir("pid-2").unwrap().write("x", b"1").unwrap();
        assert_eq!(std::fs::read(d.join("out/pid-2/x")).unwrap(), b"1");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn every_output_file_marks_an_earlier_run() {
        for f in crate::report::FILES {
            assert!(
                RECORDING_MARKERS.contains(&f) || OUTPUT_FILES.contains(&f),
                "{f} is written by a run but not checked before one"
            );
        }
        let dir = std::env::temp_dir().join(format!("lt-out-user-report-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        std::fs::write(dir.join("report.md"), "my notes").unwrap();
        let Err(e) = OutDir::for_out(&dir) else { panic!("a directory with the user's report.md was accepted") };
        assert!(format!("{e:#}").contains("report.md"), "{e:#}");
        assert_eq!(std::fs::read_to_string(dir.join("report.md")).unwrap(), "my notes");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
