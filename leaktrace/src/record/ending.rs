//! How a traced process ended, in words: its exit status or signal (launch mode), and whether
//! the OOM killer took it: the oom:mark_victim tracepoint names a traced process it chooses;
//! without it, the `oom_kill` counter of its memory cgroup (v1 or v2, read when it is first seen
//! there and again at its end).

use crate::launch::{ExitStatus, signal_name};

/// The OOM-kill counter of a process's memory cgroup (`oom_kill`, cgroup v2 or v1), read when
/// the process is first seen in that cgroup and again when it ends.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct OomWatch {
    /// The cgroup's OOM-kill counter file (v2 memory.events, v1 memory.oom_control).
    pub(super) events: std::path::PathBuf,
    /// `oom_kill` when first seen there (kills of this cgroup and its descendants).
    pub(super) baseline: u64,
}

/// The `oom_kill` count of a memory cgroup's event file (cgroup v2 memory.events, v1
/// memory.oom_control: both have an "oom_kill N" line); None when unreadable.
pub(crate) fn oom_kills(events: &std::path::Path) -> Option<u64> {
    let text = std::fs::read_to_string(events).ok()?;
    text.lines().find_map(|l| l.strip_prefix("oom_kill ")).and_then(|v| v.trim().parse().ok())
}

/// The file holding the OOM-kill counter of the memory cgroup `pid` is in: with the memory
/// controller on cgroup v1, MOUNT/PATH/memory.oom_control of the `memory` hierarchy; on v2,
/// MOUNT/PATH/memory.events of the unified hierarchy ("0::PATH"). Mount points come from
/// /proc/self/mountinfo; paths in /proc/PID/cgroup are relative to leaktrace's cgroup
/// namespace, as are those mounts. None without a memory controller.
pub(crate) fn memory_events_of(pid: u32) -> Option<std::path::PathBuf> {
    let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    // (mount point, fs type, super options) of each cgroup mount.
    let mounts: Vec<(&str, &str, &str)> = mountinfo
        .lines()
        .filter_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            let mount_point = left.split(' ').nth(4)?;
            let mut r = right.split(' ');
            let fstype = r.next()?;
            let opts = r.nth(1).unwrap_or("");
            fstype.starts_with("cgroup").then_some((mount_point, fstype, opts))
        })
        .collect();
    let join = |mount: &str, rel: &str, file: &str| {
        std::path::Path::new(mount).join(rel.trim().trim_start_matches('/')).join(file)
    };
    for l in cgroups.lines() {
        let mut f = l.splitn(3, ':');
        let (_, controllers, rel) = (f.next()?, f.next()?, f.next()?);
        if controllers.split(',').any(|c| c == "memory")
            && let Some((m, _, _)) =
                mounts.iter().find(|(_, t, o)| *t == "cgroup" && o.split(',').any(|c| c == "memory"))
        {
            let p = join(m, rel, "memory.oom_control");
            if p.exists() {
                return Some(p);
            }
        }
    }
    let rel = cgroups.lines().find_map(|l| l.strip_prefix("0::"))?;
    mounts
        .iter()
        .filter(|(_, t, _)| *t == "cgroup2")
        .map(|(m, _, _)| join(m, rel, "memory.events"))
        .find(|p| p.exists())
}

/// The memory limit of the memory cgroup whose OOM-kill counter is `events` (from
/// [`memory_events_of`]): the smallest of its and its ancestors' limits up to the hierarchy's
/// mount, cgroup v2 `memory.max` ("max": none) or v1 `memory.limit_in_bytes` (2^60 bytes or more:
/// none), bytes, with the file that set it. None: no limit (or unreadable).
pub(crate) fn memory_limit_of(events: &std::path::Path) -> Option<(u64, std::path::PathBuf)> {
    let file = if events.ends_with("memory.events") { "memory.max" } else { "memory.limit_in_bytes" };
    let mut best: Option<(u64, std::path::PathBuf)> = None;
    for dir in events.parent()?.ancestors() {
        let p = dir.join(file);
        let Ok(text) = std::fs::read_to_string(&p) else { break };
        let limit = text.trim().parse::<u64>().ok().filter(|v| *v < 1 << 60);
        if let Some(v) = limit
            && best.as_ref().is_none_or(|b| v < b.0)
        {
            best = Some((v, p));
        }
    }
    best
}

/// How a process ended, in words: `status` is its exit status when leaktrace is its parent
/// (launch mode; None when attached); `watched` when oom:mark_victim is attached (then it names
/// every process the OOM killer chooses, and `victim` is this one's anonymous RSS, KiB, when it
/// was chosen); `oom` the cgroup's `oom_kill` count (before, after) when known. With the
/// tracepoint, a rise of the counter without this process named is another kill in its cgroup
/// (another process, or a thread of this one whose leader had exited: the killer then marks the
/// thread), said as such, never as this process's. Without it: a SIGKILL while the cgroup's
/// count rose is the OOM killer's; attached, a rise is all that can be known.
pub(super) fn ending(
    status: Option<ExitStatus>,
    watched: bool,
    victim: Option<u64>,
    oom: Option<(&std::path::Path, u64, u64)>,
) -> String {
    let oom_note = |(events, before, after): (&std::path::Path, u64, u64)| {
        format!("oom_kill of {} went {before} → {after}", events.display())
    };
    let oom_fired = oom.filter(|(_, before, after)| after > before);
    if let Some(kib) = victim {
        return format!("killed by the OOM killer (oom:mark_victim chose it at anon-rss {kib} KiB)");
    }
    if watched {
        let other = oom_fired.map(|o| {
            format!(
                "; its cgroup's OOM killer fired meanwhile ({}) and oom:mark_victim did not name it: another \
                 process of the cgroup, or a thread of this one whose main thread had exited",
                oom_note(o)
            )
        });
        let other = other.unwrap_or_default();
        return match status {
            Some(ExitStatus::Signal(s)) => format!("killed by signal {s} ({}){other}", signal_name(s)),
            Some(ExitStatus::Code(c)) => format!("exited with status {c}{other}"),
            None => format!(
                "exited (an attached process's exit status is visible only to its parent; the OOM killer did not \
                 choose it){other}"
            ),
        };
    }
    match (status, oom_fired) {
        (Some(ExitStatus::Signal(9)), Some(o)) => format!("killed by the OOM killer ({})", oom_note(o)),
        (Some(ExitStatus::Signal(s)), _) => format!("killed by signal {s} ({})", signal_name(s)),
        (Some(ExitStatus::Code(c)), _) => format!("exited with status {c}"),
        (None, Some(o)) => format!(
            "ended while its cgroup's OOM killer fired ({}): most likely killed by the OOM killer (an attached process's exit status is visible only to its parent)",
            oom_note(o)
        ),
        (None, None) => {
            "exited (an attached process's exit status is visible only to its parent; its cgroup's OOM killer did not fire)"
                .to_string()
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn how_a_process_ended_is_told_from_status_and_oom_counter() {
        use super::ending;
        use crate::launch::ExitStatus;
        let ev = std::path::Path::new("/sys/fs/cgroup/x/memory.events");
        assert!(
            ending(Some(ExitStatus::Signal(9)), false, None, Some((ev, 0, 1)))
                .starts_with("killed by the OOM killer (oom_kill of /sys/fs/cgroup/x/memory.events went 0 → 1)")
        );
        // Without the tracepoint: SIGKILL without a new OOM kill is someone's kill -9.
        assert_eq!(ending(Some(ExitStatus::Signal(9)), false, None, Some((ev, 2, 2))), "killed by signal 9 (SIGKILL)");
        assert_eq!(ending(Some(ExitStatus::Signal(31)), false, None, None), "killed by signal 31 (SIGSYS)");
        assert_eq!(ending(Some(ExitStatus::Code(3)), false, None, Some((ev, 0, 1))), "exited with status 3");
        assert!(ending(None, false, None, Some((ev, 4, 5))).contains("most likely killed by the OOM killer"));
        assert!(ending(None, false, None, None).starts_with("exited (an attached process's exit status"));
        // oom:mark_victim named it: the OOM killer's, whether the counter was read in time
        // (a process moved into its cgroup and killed before the agent saw the move) or not.
        let named = "killed by the OOM killer (oom:mark_victim chose it at anon-rss 48128 KiB)";
        assert_eq!(ending(Some(ExitStatus::Signal(9)), true, Some(48_128), Some((ev, 3, 3))), named);
        assert_eq!(ending(Some(ExitStatus::Signal(9)), true, Some(48_128), Some((ev, 0, 1))), named);
        assert_eq!(
            ending(None, true, Some(512), None),
            "killed by the OOM killer (oom:mark_victim chose it at anon-rss 512 KiB)"
        );
        // Watched and not named: another kill in its cgroup is never this process's (a kill -9
        // of it, a clean exit after a child's OOM kill).
        let k = ending(Some(ExitStatus::Signal(9)), true, None, Some((ev, 5, 6)));
        assert!(
            k.starts_with("killed by signal 9 (SIGKILL); its cgroup's OOM killer fired meanwhile (oom_kill of"),
            "{k}"
        );
        assert!(!k.contains("killed by the OOM killer"), "{k}");
        let e = ending(None, true, None, Some((ev, 9, 10)));
        assert!(e.starts_with("exited (an attached process's exit status is visible only to its parent; the OOM killer did not choose it); its cgroup's OOM killer fired meanwhile"), "{e}");
        assert!(!e.contains("most likely"), "{e}");
        assert_eq!(ending(Some(ExitStatus::Code(0)), true, None, None), "exited with status 0");
    }

    #[test]
    fn oom_kill_counter_is_read_from_v1_and_v2_files() {
        let dir = std::env::temp_dir().join(format!("leaktrace-oom-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let v2 = dir.join("memory.events");
        std::fs::write(&v2, "low 0\nhigh 0\nmax 12\noom 2\noom_kill 1\noom_group_kill 0\n").unwrap();
        let v1 = dir.join("memory.oom_control");
        std::fs::write(&v1, "oom_kill_disable 0\nunder_oom 0\noom_kill 7\n").unwrap();
        assert_eq!(super::oom_kills(&v2), Some(1));
        assert_eq!(super::oom_kills(&v1), Some(7));
        assert_eq!(super::oom_kills(&dir.join("absent")), None);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// The tightest limit up the hierarchy wins; "max" and v1's 2^63 − 4096 are no limit.
    #[test]
    fn memory_limit_is_the_smallest_up_the_hierarchy() {
        let root = std::env::temp_dir().join(format!("leaktrace-limit-{}", std::process::id()));
        let leaf = root.join("a/b");
        std::fs::create_dir_all(&leaf).unwrap();
        std::fs::write(root.join("memory.max"), "max\n").unwrap();
        std::fs::write(root.join("a/memory.max"), "1073741824\n").unwrap();
        std::fs::write(leaf.join("memory.max"), "max\n").unwrap();
        let (limit, file) = super::memory_limit_of(&leaf.join("memory.events")).expect("a limit");
        assert_eq!(limit, 1 << 30);
        assert_eq!(file, root.join("a/memory.max"));
        std::fs::write(root.join("a/memory.max"), "max\n").unwrap();
        assert_eq!(super::memory_limit_of(&leaf.join("memory.events")), None);
        std::fs::write(leaf.join("memory.limit_in_bytes"), "9223372036854771712\n").unwrap();
        assert_eq!(super::memory_limit_of(&leaf.join("memory.oom_control")), None);
        std::fs::write(leaf.join("memory.limit_in_bytes"), "536870912\n").unwrap();
        assert_eq!(super::memory_limit_of(&leaf.join("memory.oom_control")).map(|l| l.0), Some(512 << 20));
        let _ = std::fs::remove_dir_all(&root);
    }
}
