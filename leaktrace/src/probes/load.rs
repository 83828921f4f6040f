//! Loading the object into the kernel: its programs, tracepoints, sampling table and unwind
//! rows; the clocks the kernel side counts birth times by; the helper that closes the
//! tracepoints' last descriptors after leaktrace exits.
use super::*;

/// Write `rows` into the `UNWIND_ROWS` array from index `first`: with BPF_MAP_UPDATE_BATCH
/// (one system call per 64 Ki rows; Linux 5.6+), else one update per row (a libcrypto has ~90 000
/// rows, ~0.1 s that way).
pub(super) fn write_rows(map: &mut aya::maps::Map, first: u32, rows: &[UnwindRow]) -> anyhow::Result<()> {
    use std::os::fd::{AsFd as _, AsRawFd as _};
    let aya::maps::Map::Array(data) = &*map else { anyhow::bail!("UNWIND_ROWS is not an array map") };
    let fd = data.fd().as_fd().as_raw_fd() as u32;
    let mut batched = true;
    for (c, chunk) in rows.chunks(1 << 16).enumerate() {
        let base = first + (c << 16) as u32;
        let keys: Vec<u32> = (0..chunk.len() as u32).map(|i| base + i).collect();
        let mut attr = crate::bpf_batch::Attr {
            keys: keys.as_ptr() as u64,
            values: chunk.as_ptr() as u64,
            count: chunk.len() as u32,
            map_fd: fd,
            ..Default::default()
        };
        // SAFETY: attr points at keys and values that live across the call, of the map's key
        // (u32) and value (UnwindRow, repr(C), 8 bytes) sizes; the kernel reads `count` of each.
        let r = unsafe { crate::bpf_batch::run(crate::bpf_batch::UPDATE, &mut attr) };
        if r.is_err() || attr.count as usize != chunk.len() {
            batched = false;
            break;
        }
    }
    if !batched {
        let mut arr: aya::maps::Array<&mut MapData, UnwindRow> = aya::maps::Array::try_from(&mut *map)?;
        for (i, r) in rows.iter().enumerate() {
            arr.set(first + i as u32, *r, 0)?;
        }
    }
    Ok(())
}

/// Load the uprobe programs (for uprobe_multi links if `multi`) and the tracepoint programs
/// (`page_fault_user` only if `growth`) of the program table (`leaktrace_common::program`), on
/// as many threads as there are CPUs: the verifier runs for each program (~0.1–0.5 s each here),
/// and for root's programs it runs in parallel. Returns the programs that failed, by name.
pub(super) fn load_programs(ebpf: &mut Ebpf, multi: bool, growth: bool) -> StdHashMap<&'static str, anyhow::Error> {
    let uprobes: Vec<&'static str> = uprobe_programs().map(|p| p.name).collect();
    let tracepoints: Vec<&'static str> =
        tracepoint_programs(growth).map(|(_, name)| name).chain([program::OOM_MARK_VICTIM.name]).collect();
    let mut errors = StdHashMap::new();
    let mut queue: Vec<(&'static str, &mut Program)> = Vec::new();
    for (name, prog) in ebpf.programs_mut() {
        if let Some(n) = uprobes.iter().chain(&tracepoints).find(|n| **n == name) {
            queue.push((n, prog));
        }
    }
    for n in uprobes.iter().chain(&tracepoints) {
        if !queue.iter().any(|(q, _)| q == n) {
            errors.insert(*n, anyhow::anyhow!("eBPF program {n} missing from the object"));
        }
    }
    let queue = std::sync::Mutex::new(queue);
    let found = std::sync::Mutex::new(errors);
    let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1).min(8);
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                loop {
                    let Some((name, prog)) = queue.lock().unwrap_or_else(|e| e.into_inner()).pop() else { break };
                    let r = match prog {
                        Program::UProbe(p) if multi => p.load_multi(),
                        Program::UProbe(p) => p.load(),
                        Program::TracePoint(p) => p.load(),
                        _ => Err(aya::programs::ProgramError::UnexpectedProgramType),
                    };
                    if let Err(e) = r {
                        found.lock().unwrap_or_else(|e| e.into_inner()).insert(name, e.into());
                    }
                }
            });
        }
    });
    found.into_inner().unwrap_or_else(|e| e.into_inner())
}

/// Attach the syscall tracepoints, mounting tracefs at /sys/kernel/tracing first if it is not.
/// The programs were loaded by [`load_programs`] (its errors in `load_errors`); the links are
/// added to `links`.
pub(super) fn attach_tracepoints(
    ebpf: &mut Ebpf,
    load_errors: &mut StdHashMap<&'static str, anyhow::Error>,
    links: &mut Vec<(&'static str, TracePointLinkId)>,
) -> anyhow::Result<()> {
    ensure_tracefs()?;
    for (category, name) in tracepoint_programs(false) {
        attach_tracepoint(ebpf, load_errors, links, category, name)?;
    }
    Ok(())
}

/// Attach the loaded tracepoint program `name` to tracepoint `category:name`.
pub(super) fn attach_tracepoint(
    ebpf: &mut Ebpf,
    load_errors: &mut StdHashMap<&'static str, anyhow::Error>,
    links: &mut Vec<(&'static str, TracePointLinkId)>,
    category: &str,
    name: &'static str,
) -> anyhow::Result<()> {
    if let Some(e) = load_errors.remove(name) {
        return Err(e.context(format!("loading eBPF program {name}")));
    }
    let prog: &mut TracePoint =
        ebpf.program_mut(name).with_context(|| format!("eBPF program {name} missing"))?.try_into()?;
    let id = prog.attach(category, name).with_context(|| format!("attaching to tracepoint {category}:{name}"))?;
    links.push((name, id));
    Ok(())
}

/// Sampled mode: write the exponential and weight tables (each process's mean distance is in its
/// `TARGETS` entry).
pub(super) fn fill_sampling(ebpf: &mut Ebpf) -> anyhow::Result<()> {
    use leaktrace_common::sampling::*;
    let mut arr: aya::maps::Array<_, u64> =
        aya::maps::Array::try_from(ebpf.map_mut("SAMPLING").context("SAMPLING map missing")?)?;
    let scale = (1u64 << SHIFT) as f64;
    for i in 0..TABLE {
        let u = (i as f64 + 0.5) / TABLE as f64;
        arr.set(EXP_BASE + i, (-u.ln() * scale) as u64, 0)?;
        let x = i as f64 * 8.0 / TABLE as f64;
        let g = if x == 0.0 { 1.0 } else { x / (1.0 - (-x).exp()) };
        arr.set(WEIGHT_BASE + i, (g * scale) as u64, 0)?;
    }
    Ok(())
}

/// What the mode the tracer is loaded for needs besides the programs: sampled mode's tables,
/// growth mode's page-fault tracepoint.
pub(super) fn prepare_mode(
    ebpf: &mut Ebpf,
    mode: Mode,
    load_errors: &mut StdHashMap<&'static str, anyhow::Error>,
    links: &mut Vec<(&'static str, TracePointLinkId)>,
) -> anyhow::Result<()> {
    match mode {
        Mode::Exact => Ok(()),
        Mode::Sampled => fill_sampling(ebpf),
        Mode::Growth => attach_page_faults(ebpf, load_errors, links),
    }
}

/// Growth mode: count first-touch page faults (exceptions:page_fault_user).
pub(super) fn attach_page_faults(
    ebpf: &mut Ebpf,
    load_errors: &mut StdHashMap<&'static str, anyhow::Error>,
    links: &mut Vec<(&'static str, TracePointLinkId)>,
) -> anyhow::Result<()> {
    ensure_tracefs()?;
    let program::Kind::Tracepoint { group } = program::PAGE_FAULT_USER.kind else {
        unreachable!("a tracepoint program")
    };
    attach_tracepoint(ebpf, load_errors, links, group, program::PAGE_FAULT_USER.name)
}

fn ensure_tracefs() -> anyhow::Result<()> {
    let dir = std::path::Path::new("/sys/kernel/tracing");
    let populated = |d: &std::path::Path| d.read_dir().map(|mut e| e.next().is_some()).unwrap_or(false);
    if populated(dir) || populated(std::path::Path::new("/sys/kernel/debug/tracing")) {
        return Ok(());
    }
    // SAFETY: mount(2) with NUL-terminated string literals (alive for the call) and no data.
    let r = unsafe {
        libc::mount(c"nodev".as_ptr(), c"/sys/kernel/tracing".as_ptr(), c"tracefs".as_ptr(), 0, std::ptr::null())
    };
    if r != 0 {
        anyhow::bail!(
            "tracefs is not mounted and mounting it at /sys/kernel/tracing failed: {}",
            std::io::Error::last_os_error()
        );
    }
    Ok(())
}

/// The kernel's jiffies tied to the monotonic clock, for the birth times the kernel side takes
/// (`now_ms` in leaktrace-ebpf: a load of jiffies is cheaper than a clock read).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct JiffyClock {
    /// Jiffies when the monotonic clock read the time base.
    pub(super) at_base: u64,
    /// Milliseconds per jiffy (1000 / HZ), 16.16 fixed point.
    pub(super) ms_q16: u64,
}

impl JiffyClock {
    /// From /proc/timer_list (`now at N nsecs`: the monotonic clock; `jiffies: J`, read just
    /// after) and `base_ns`, a monotonic time: HZ is the candidate for which J counted from the
    /// kernel's INITIAL_JIFFIES (2^32 - 300 HZ) matches the clock within 2 s + 1 %. None when
    /// the file lacks either line or no HZ fits.
    pub(super) fn parse(timer_list: &str, base_ns: u64) -> Option<Self> {
        let field = |prefix: &str| {
            timer_list
                .lines()
                .find_map(|l| l.strip_prefix(prefix))
                .and_then(|r| r.split_whitespace().next()?.parse::<u64>().ok())
        };
        let now_ns = field("now at ")?;
        let jiffies = field("jiffies: ")?;
        let secs = now_ns as f64 / 1e9;
        let hz = [100u64, 250, 300, 1000, 24, 32, 48, 64, 128, 256, 512, 1024, 1200].into_iter().find(|&hz| {
            let initial = (1u64 << 32) - 300 * hz;
            let up = jiffies.wrapping_sub(initial) as f64 / hz as f64;
            (up - secs).abs() <= 2.0 + secs * 0.01
        })?;
        let back = (now_ns as i128 - base_ns as i128) * hz as i128 / 1_000_000_000;
        Some(JiffyClock { at_base: (jiffies as i128 - back) as u64, ms_q16: (1000 << 16) / hz })
    }
}

/// Hand `fds` to a helper process that closes them, then exits: a grandchild (its parent, the
/// child, exits at once and is reaped here), so it is no child of this process and nothing waits
/// for it. It closes every other descriptor first (stdin, stdout and stderr too: a reader of
/// leaktrace's output sees its end when leaktrace exits). False when it could not be made.
///
/// The children only make async-signal-safe system calls (fork, getpid, getppid, nanosleep,
/// close_range, close, _exit), as a child of a multi-threaded process must.
pub(super) fn close_after_exit(fds: &[std::os::fd::RawFd]) -> bool {
    let mut keep: Vec<u32> = fds.iter().filter(|&&f| f >= 0).map(|&f| f as u32).collect();
    keep.sort_unstable();
    keep.dedup();
    // SAFETY: fork; the child below makes only async-signal-safe calls before _exit.
    let child = unsafe { libc::fork() };
    if child < 0 {
        return false;
    }
    if child == 0 {
        // SAFETY: async-signal-safe calls only (see above); `keep` was built before the fork.
        unsafe {
            let me = libc::getpid();
            if libc::fork() != 0 {
                libc::_exit(0);
            }
            // Until the child has exited: were its copies of the descriptors the last ones, its
            // exit would remove the tracepoints while leaktrace waits for it (at most 2 s).
            let tick = libc::timespec { tv_sec: 0, tv_nsec: 1_000_000 };
            for _ in 0..2000 {
                if libc::getppid() != me {
                    break;
                }
                libc::nanosleep(&tick, std::ptr::null_mut());
            }
            let mut from = 0u32;
            for &k in &keep {
                if k > from {
                    libc::syscall(libc::SYS_close_range, from, k - 1, 0);
                }
                from = k + 1;
            }
            libc::syscall(libc::SYS_close_range, from, u32::MAX, 0);
            for &k in &keep {
                libc::close(k as i32);
            }
            libc::_exit(0);
        }
    }
    let mut status = 0;
    // SAFETY: waits for the child just made; status is a local.
    unsafe { libc::waitpid(child, &mut status, 0) };
    libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0
}

/// CLOCK_MONOTONIC in ns: the clock of the kernel side's `bpf_ktime_get_ns`.
pub(super) fn monotonic_now_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec, which `ts` is.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Kernels before 5.11 charge BPF maps to RLIMIT_MEMLOCK; lift it (harmless on newer ones).
pub(super) fn raise_memlock() {
    let lim = libc::rlimit { rlim_cur: libc::RLIM_INFINITY, rlim_max: libc::RLIM_INFINITY };
    // SAFETY: setrlimit(2) reads one rlimit, the local `lim`.
    unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &lim) };
}

#[cfg(test)]
mod jiffy_tests {
    use super::JiffyClock;

    #[test]
    fn jiffies_tied_to_the_monotonic_clock_from_timer_list() {
        // A 6.18 kernel with HZ=250, 22717.2 s after boot (its /proc/timer_list, shortened).
        let t = "Timer List Version: v0.10\nHRTIMER_MAX_CLOCK_BASES: 8\nnow at 22717210107474 nsecs\n\n                 cpu: 0\n  .idle_jiffies   : 4300571531\njiffies: 4300571584\n";
        // The base 1 s before the file's now: 250 jiffies before.
        let j = JiffyClock::parse(t, 22716210107474).unwrap();
        assert_eq!(j, JiffyClock { at_base: 4300571334, ms_q16: 4 << 16 });
        // HZ=1000 and 100 at the same uptime.
        let up = 22717u64;
        for hz in [1000u64, 100] {
            let jf = (1u64 << 32) - 300 * hz + up * hz;
            let t = format!("now at {} nsecs\njiffies: {jf}\n", up * 1_000_000_000);
            assert_eq!(JiffyClock::parse(&t, up * 1_000_000_000).unwrap().ms_q16, (1000 << 16) / hz);
        }
        // No jiffies line, or counts that fit no HZ.
        assert_eq!(JiffyClock::parse("now at 5 nsecs\n", 0), None);
        assert_eq!(JiffyClock::parse("now at 22717210107474 nsecs\njiffies: 17\n", 0), None);
    }
}
