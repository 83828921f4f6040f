//! Process facts from /proc: memory figures, command line, executable, namespaced PIDs.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use leaktrace_analysis::recording::ProcMemory;

/// Memory of `pid` from /proc/PID/status (VmRSS, RssAnon, RssFile, RssShmem, VmSize, converted
/// from kB to bytes; through a live thread when the main thread has exited, see [`mm_task`]).
/// None if the process is gone or is a zombie.
pub fn memory(pid: u32) -> Option<ProcMemory> {
    memory_through(pid, mm_task(pid))
}

/// [`memory`] of process `pid` read through task `mm` (its [`mm_task`], when the caller has
/// just found it: one /proc/PID/stat read saved). The reading is kept for [`memory_recent`].
pub fn memory_through(pid: u32, mm: u32) -> Option<ProcMemory> {
    let m = read_memory(mm)?;
    if let Ok(mut recent) = RECENT.lock() {
        let now = Instant::now();
        if recent.len() > 4096 {
            recent.retain(|_, (at, _, _)| now.duration_since(*at) < RECENT_KEPT);
        }
        recent.insert(pid, (now, SystemTime::now(), m.clone()));
    }
    Some(m)
}

/// Readings of [`memory_through`] by PID, with when each was taken: the watch's sampler thread
/// takes the recorder's reading of the same second instead of reading /proc/PID/status again.
static RECENT: Mutex<BTreeMap<u32, (Instant, SystemTime, ProcMemory)>> = Mutex::new(BTreeMap::new());

/// Readings older than this are dropped from [`RECENT`] once it holds many PIDs.
const RECENT_KEPT: Duration = Duration::from_secs(10);

/// Memory of `pid` as read by [`memory_through`] at most `max_age` ago, else read now; with
/// the time of the reading. None if the process is gone or is a zombie.
pub fn memory_recent(pid: u32, max_age: Duration) -> Option<(ProcMemory, SystemTime)> {
    let cached = RECENT.lock().ok().and_then(|r| r.get(&pid).cloned());
    match cached {
        Some((at, when, m)) if at.elapsed() <= max_age => Some((m, when)),
        _ => memory(pid).map(|m| (m, SystemTime::now())),
    }
}

/// /proc/MM/status's memory lines.
fn read_memory(mm: u32) -> Option<ProcMemory> {
    let status = std::fs::read_to_string(format!("/proc/{mm}/status")).ok()?;
    let kb = |name: &str| -> Option<u64> {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_ascii_whitespace().next())
            .and_then(|v| v.parse::<u64>().ok())
            .map(|v| v * 1024)
    };
    Some(ProcMemory {
        rss_bytes: kb("VmRSS:")?,
        rss_anon_bytes: kb("RssAnon:").unwrap_or(0),
        rss_file_bytes: kb("RssFile:").unwrap_or(0),
        rss_shmem_bytes: kb("RssShmem:").unwrap_or(0),
        vm_size_bytes: kb("VmSize:").unwrap_or(0),
    })
}

/// argv of `pid` (empty if unreadable).
pub fn cmdline(pid: u32) -> Vec<String> {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| {
            b.split(|c| *c == 0).filter(|s| !s.is_empty()).map(|s| String::from_utf8_lossy(s).into_owned()).collect()
        })
        .unwrap_or_default()
}

/// Executable path as the target sees it.
pub fn exe(pid: u32) -> String {
    std::fs::read_link(format!("/proc/{}/exe", mm_task(pid))).map(|p| p.display().to_string()).unwrap_or_default()
}

/// NSpid: the PID in each PID namespace, outermost (host) first.
pub fn nspid(pid: u32) -> Vec<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("NSpid:"))
                .map(|v| v.split_ascii_whitespace().filter_map(|x| x.parse().ok()).collect())
        })
        .unwrap_or_else(|| vec![pid])
}

/// The state letter of the task whose /proc/…/stat is at `path` (`R`, `S`, `Z`, …); None if
/// unreadable.
fn task_state(path: &str) -> Option<char> {
    let s = std::fs::read_to_string(path).ok()?;
    s.rsplit_once(')')?.1.split_ascii_whitespace().next()?.chars().next()
}

fn exited(state: Option<char>) -> bool {
    !matches!(state, Some(c) if c != 'Z' && c != 'X')
}

/// Whether thread `tid` of process `pid` has exited (state Z or X, or gone).
pub fn thread_exited(pid: u32, tid: u32) -> bool {
    exited(task_state(&format!("/proc/{pid}/task/{tid}/stat")))
}

/// Whether thread `tid` of process `pid` has not begun to exit: PF_EXITING is not in the flags
/// of its /proc/PID/task/TID/stat (the kernel sets it first thing when a task exits, before the
/// task leaves its cgroups, after which /proc/TID/cgroup reads as the hierarchies' roots), and
/// it is there. A read made before this returns true was made of a task that had not exited.
pub fn thread_not_exiting(pid: u32, tid: u32) -> bool {
    const PF_EXITING: u64 = 0x4;
    let Ok(s) = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat")) else { return false };
    // After the command's closing parenthesis: state, ppid, pgrp, session, tty_nr, tpgid, flags.
    let mut fields = s.rsplit_once(')').map(|(_, rest)| rest.split_ascii_whitespace()).into_iter().flatten();
    let state = fields.next().and_then(|f| f.chars().next());
    let flags = fields.nth(5).and_then(|f| f.parse::<u64>().ok());
    !exited(state) && flags.is_some_and(|f| f & PF_EXITING == 0)
}

/// A thread of process `pid` other than its main thread that has not exited; None if there is
/// none (or the process is gone).
fn other_live_thread(pid: u32) -> Option<u32> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .ok()?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&tid| tid != pid)
        .find(|&tid| !thread_exited(pid, tid))
}

/// True while process `pid` exists and has a thread that has not exited: its main thread, or,
/// when that one has (pthread_exit in main: the leader stays a zombie until the last thread
/// ends), another.
pub fn alive(pid: u32) -> bool {
    live_task(pid).is_some()
}

/// [`alive`] and [`mm_task`] from one read of /proc/PID/stat: the task through which process
/// `pid`'s memory is read while the process is alive, None once it has ended.
pub fn live_task(pid: u32) -> Option<u32> {
    if !exited(task_state(&format!("/proc/{pid}/stat"))) {
        return Some(pid);
    }
    other_live_thread(pid)
}

/// The task through whose /proc directory process `pid`'s memory is read (maps, map_files,
/// root, status memory lines, pagemap, mem): `pid` itself, or, when its main thread has exited
/// while other threads run (the zombie leader's maps and memory lines are empty, its root link
/// gone), one of those threads: /proc/TID shows the process's memory as the leader's did.
/// `pid` when the process is gone.
pub fn mm_task(pid: u32) -> u32 {
    live_task(pid).unwrap_or(pid)
}

/// Whether process `pid` is stopped by a signal (state `T` in /proc/PID/stat: SIGSTOP, or a
/// group stop). False when it is gone or unreadable.
pub fn stopped(pid: u32) -> bool {
    task_state(&format!("/proc/{pid}/stat")) == Some('T')
}

/// One line of /proc/PID/maps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MapsLine<'a> {
    /// "start-end" as written, zero-padded to 8 digits (`00400000-00401000`); its entry in
    /// /proc/PID/map_files is named without the leading zeros: [`crate::target_fs::map_files_name`].
    pub range: &'a str,
    /// Virtual addresses [start, end).
    pub start: u64,
    pub end: u64,
    /// "r-xp" and the like.
    pub perms: &'a str,
    /// File offset mapped at `start`, bytes.
    pub offset: u64,
    /// Device as "major:minor" in hex.
    pub dev: &'a str,
    pub inode: u64,
    /// Path or pseudo-name ("[heap]"); empty for anonymous mappings.
    pub path: String,
}

impl MapsLine<'_> {
    /// An unnamed anonymous mapping (no file, no pseudo-name such as `[heap]` or `[stack]`).
    pub fn is_anonymous(&self) -> bool {
        self.inode == 0 && self.path.is_empty()
    }
}

/// Parse one line of /proc/PID/maps; None for a malformed line.
pub fn parse_maps_line(line: &str) -> Option<MapsLine<'_>> {
    let mut it = line.split_ascii_whitespace();
    let (range, perms, offset, dev, inode) = (it.next()?, it.next()?, it.next()?, it.next()?, it.next()?);
    let (s, e) = range.split_once('-')?;
    Some(MapsLine {
        range,
        start: u64::from_str_radix(s, 16).ok()?,
        end: u64::from_str_radix(e, 16).ok()?,
        perms,
        offset: u64::from_str_radix(offset, 16).ok()?,
        dev,
        inode: inode.parse().ok()?,
        path: it.collect::<Vec<_>>().join(" "),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_lines() {
        let l = parse_maps_line("7f00-7f10 r-xp 00001000 fe:01 1234   /usr/lib/a b.so").unwrap();
        assert_eq!((l.start, l.end, l.offset, l.inode), (0x7f00, 0x7f10, 0x1000, 1234));
        assert_eq!((l.range, l.perms, l.dev, l.path.as_str()), ("7f00-7f10", "r-xp", "fe:01", "/usr/lib/a b.so"));
        assert_eq!(parse_maps_line("5000-6000 rw-p 00000000 00:00 0").unwrap().path, "");
        assert_eq!(parse_maps_line("5000-6000 rw-p 00000000 00:00 0 [heap]").unwrap().path, "[heap]");
        assert!(parse_maps_line("garbage").is_none());
    }
}
