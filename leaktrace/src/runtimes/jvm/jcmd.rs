//! The JVM's diagnostic commands, run with `jcmd` when the user allows it (`--jvm-perf-map`):
//! `VM.flags -all` once (is `-XX:+PreserveFramePointer` on?) and `Compiler.perfmap` (the JVM
//! writes /tmp/perf-PID.map, the names of its JIT code, in its own /tmp) when new unnamed JIT
//! frames appeared, at most [`MAX_PERF_MAP_RUNS`] times and [`PERF_MAP_GAP`] apart, and once more
//! at the end of the recording.
//!
//! One command at a time, in the background: the session polls [`Jcmd::poll`] and is never held
//! up by a JVM that is slow to answer. A command is given [`TIMEOUT`] in all; after
//! [`MAX_FAILURES_IN_A_ROW`] failures no more are started. None is sent before the JVM is
//! [`attachable`].
//!
//! No `jcmd` program is run: leaktrace speaks HotSpot's attach protocol itself ([`super::attach`]:
//! the socket `/tmp/.java_pid<NSPID>` in the target's own root, joined as the JVM's user), so a
//! JDK the target's user controls never runs with leaktrace's rights, and a JVM in another PID,
//! mount or user namespace is reached the same way (JDK 10 and later).

use std::path::PathBuf;
use std::time::{Duration, Instant};

/// A command is given this long in all (the attach, the command, its whole reply).
pub const TIMEOUT: Duration = Duration::from_secs(30);
/// `Compiler.perfmap` runs during a recording at most this many times (the final run is extra).
pub const MAX_PERF_MAP_RUNS: u32 = 20;
/// Least time between the end of one `Compiler.perfmap` run and the start of the next.
pub const PERF_MAP_GAP: Duration = Duration::from_secs(5);
/// After this many failed commands in a row (no attach: `-XX:+DisableAttachMechanism`, another
/// user's JVM, an old JDK), no more are run during the recording.
pub const MAX_FAILURES_IN_A_ROW: u32 = 3;

/// A diagnostic command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Job {
    /// `VM.flags -all`: every flag's value.
    Flags,
    /// `Compiler.perfmap`: write /tmp/perf-PID.map.
    PerfMap,
    /// `GC.class_histogram`: live objects by class, after a full GC (`--heap-census`, runtimes/jvm/census.rs).
    ClassHistogram,
    /// `GC.heap_dump FILE`: an HPROF dump of the live objects, after a full GC (`--heap-dump`,
    /// runtimes/jvm/census.rs); the file is [`Jcmd::dump_path`].
    HeapDump,
}

impl Job {
    fn args(self) -> &'static [&'static str] {
        match self {
            Job::Flags => &["VM.flags", "-all"],
            Job::PerfMap => &["Compiler.perfmap"],
            Job::ClassHistogram => &["GC.class_histogram"],
            Job::HeapDump => &["GC.heap_dump"],
        }
    }

    /// The command as a user would type it with jcmd, for messages (leaktrace sends it through
    /// the JVM's attach socket itself).
    pub fn describe(self, pid: u32) -> String {
        format!("jcmd {pid} {}", self.args().join(" "))
    }
}

/// What [`Jcmd::run`] did.
#[derive(Debug)]
pub enum Started {
    /// The command runs.
    Running,
    /// Not started: another runs, the JVM is not attachable yet, or too many failed.
    NotNow,
    /// It could not be started.
    Failed(Done),
}

/// A command that ended: Ok(stdout) or Err(why, one line).
#[derive(Debug)]
pub struct Done {
    pub job: Job,
    pub result: Result<String, String>,
}

/// A command running on its own thread ([`super::attach::jcmd`], which ends by itself by its
/// deadline).
struct Running {
    job: Job,
    started: Instant,
    thread: std::thread::JoinHandle<Result<String, String>>,
}

/// The diagnostic commands of one JVM (host PID `pid`).
pub struct Jcmd {
    pid: u32,
    running: Option<Running>,
    /// `VM.flags -all` still to run.
    flags_pending: bool,
    /// A `Compiler.perfmap` run is wanted (new unnamed JIT frames).
    perf_map_wanted: bool,
    /// `Compiler.perfmap` runs started during the recording.
    pub perf_map_runs: u32,
    /// When the last `Compiler.perfmap` run ended.
    last_perf_map: Option<Instant>,
    /// The JVM can be attached to ([`attachable`]), seen once.
    ready: bool,
    /// Commands that failed since the last one that succeeded.
    failures_in_a_row: u32,
    /// The file [`Job::HeapDump`] writes (a path in the JVM's own mount namespace).
    pub dump_path: PathBuf,
}

impl Jcmd {
    /// The commands for JVM `pid`; `VM.flags -all` is queued first.
    pub fn new(pid: u32) -> Jcmd {
        Jcmd {
            pid,
            running: None,
            flags_pending: true,
            perf_map_wanted: false,
            perf_map_runs: 0,
            last_perf_map: None,
            ready: false,
            failures_in_a_row: 0,
            dump_path: PathBuf::new(),
        }
    }

    /// The commands for JVM `pid` with nothing queued: the caller starts each with [`Jcmd::run`].
    pub fn unqueued(pid: u32) -> Jcmd {
        Jcmd { flags_pending: false, ..Jcmd::new(pid) }
    }

    /// Start `job` now, unless a command is in progress, the JVM is not [`attachable`] yet, or
    /// [`MAX_FAILURES_IN_A_ROW`] failed in a row. A started command's end is collected by
    /// [`Jcmd::poll`] or [`Jcmd::wait`].
    pub fn run(&mut self, job: Job) -> Started {
        if self.running.is_some() || self.failures_in_a_row >= MAX_FAILURES_IN_A_ROW {
            return Started::NotNow;
        }
        if !self.ready {
            self.ready = attachable(self.pid);
            if !self.ready {
                return Started::NotNow;
            }
        }
        match self.start(job) {
            Some(done) => Started::Failed(done),
            None => Started::Running,
        }
    }

    /// Wait for the command in progress (at most [`TIMEOUT`]); None: none was running.
    pub fn wait(&mut self) -> Option<Done> {
        self.reap(true)
    }

    /// Ask for a `Compiler.perfmap` run (started by [`Jcmd::poll`] when the bounds allow).
    pub fn want_perf_map(&mut self) {
        self.perf_map_wanted = true;
    }

    /// A command in progress (or queued).
    pub fn busy(&self) -> bool {
        self.running.is_some() || self.flags_pending
    }

    /// Collect the command that ended (or kill the one past [`TIMEOUT`]), then start the next
    /// one due. Never blocks.
    pub fn poll(&mut self) -> Option<Done> {
        if let Some(done) = self.reap(false) {
            return Some(done);
        }
        if self.running.is_some() || self.failures_in_a_row >= MAX_FAILURES_IN_A_ROW {
            return None;
        }
        if !self.ready {
            self.ready = attachable(self.pid);
            if !self.ready {
                return None;
            }
        }
        if self.flags_pending {
            self.flags_pending = false;
            return self.start(Job::Flags);
        }
        if self.perf_map_wanted
            && self.perf_map_runs < MAX_PERF_MAP_RUNS
            && self.last_perf_map.is_none_or(|t| t.elapsed() >= PERF_MAP_GAP)
        {
            self.perf_map_wanted = false;
            self.perf_map_runs += 1;
            return self.start(Job::PerfMap);
        }
        None
    }

    /// End of the recording: wait for the command in progress, then run `Compiler.perfmap` once
    /// more (whatever the bounds) and wait for it. Returns what ended, in order.
    pub fn finish(&mut self) -> Vec<Done> {
        let mut out: Vec<Done> = self.reap(true).into_iter().collect();
        self.flags_pending = false;
        self.perf_map_wanted = false;
        if !(self.ready || attachable(self.pid)) {
            out.push(Done { job: Job::PerfMap, result: Err(NOT_ATTACHABLE.to_string()) });
            return out;
        }
        out.extend(self.start(Job::PerfMap));
        out.extend(self.reap(true));
        out
    }

    /// Start `job`; Some when it could not be started.
    fn start(&mut self, job: Job) -> Option<Done> {
        let done = self.spawn(job);
        if done.is_some() {
            self.failures_in_a_row += 1;
        }
        done
    }

    fn spawn(&mut self, job: Job) -> Option<Done> {
        let mut line = job.args().join(" ");
        if job == Job::HeapDump {
            line = format!("{line} {}", self.dump_path.display());
        }
        let (pid, started) = (self.pid, Instant::now());
        let deadline = started + TIMEOUT;
        let spawned = std::thread::Builder::new()
            .name("jvm-attach".into())
            .spawn(move || super::attach::jcmd(pid, &line, deadline));
        match spawned {
            Ok(thread) => {
                self.running = Some(Running { job, started, thread });
                None
            }
            Err(e) => {
                if job == Job::PerfMap {
                    self.last_perf_map = Some(Instant::now());
                }
                Some(Done { job, result: Err(format!("cannot start a thread: {e}")) })
            }
        }
    }

    /// The running command, if it ended (with `wait`: once it ends; its thread ends by
    /// [`TIMEOUT`], a thread still there a second later is left and the command counted failed).
    fn reap(&mut self, wait: bool) -> Option<Done> {
        loop {
            let r = self.running.as_ref()?;
            let overdue = Instant::now() >= crate::stopping::cap(r.started + TIMEOUT + Duration::from_secs(1));
            if !r.thread.is_finished() && !overdue {
                if !wait {
                    return None;
                }
                std::thread::sleep(Duration::from_millis(20));
                continue;
            }
            let r = self.running.take()?;
            let result = if r.thread.is_finished() {
                r.thread.join().unwrap_or_else(|_| Err("the attach thread panicked".into()))
            } else {
                Err(format!("timed out after {} s", TIMEOUT.as_secs()))
            };
            if r.job == Job::PerfMap {
                self.last_perf_map = Some(Instant::now());
            }
            let result = match result {
                Ok(out) if out.lines().any(exception_line) => Err(first_error_line(&out, "")),
                other => other,
            };
            self.failures_in_a_row = if result.is_ok() { 0 } else { self.failures_in_a_row + 1 };
            return Some(Done { job: r.job, result });
        }
    }
}

pub use super::attach::{NOT_ATTACHABLE, catches_sigquit};

/// Whether an attach request may be sent to JVM `pid`: its attach listener is up (the socket
/// /tmp/.java_pid<NSPID> in its root), or it catches SIGQUIT (the `SigCgt` mask of
/// /proc/PID/status), which is how a client asks it to start the listener. A JVM still starting, or
/// run with -Xrs, does not: SIGQUIT's default action would end it (the check JDK 20's attach
/// makes itself, JDK-8292695; JDK 17's does not).
pub fn attachable(pid: u32) -> bool {
    super::attach::listener_up(pid) || catches_sigquit(pid)
}

/// The line of jcmd's output that says what went wrong (an exception's message), else the last
/// non-empty line of stderr or stdout.
pub fn first_error_line(stdout: &str, stderr: &str) -> String {
    let lines = || stdout.lines().chain(stderr.lines()).map(str::trim).filter(|l| !l.is_empty());
    lines().find(|l| exception_line(l)).or_else(|| lines().next_back()).unwrap_or("no output").to_string()
}

/// A line where jcmd reports a Java exception (`com.sun.tools.attach.AttachNotSupportedException:
/// ...`, `java.lang.IllegalArgumentException: Unknown diagnostic command`), not a flag whose name
/// has "Exception" in it.
fn exception_line(l: &str) -> bool {
    l.split_whitespace().next().is_some_and(|w| (w.ends_with("Exception:") || w.ends_with("Error:")) && w.contains('.'))
}

/// `PreserveFramePointer`'s value in the output of `jcmd PID VM.flags -all` (lines such as
/// `     bool PreserveFramePointer                     = false    {product} {default}`); None
/// when the flag is not listed.
pub fn preserve_frame_pointer(flags: &str) -> Option<bool> {
    flags.lines().find_map(|l| {
        let mut it = l.split_whitespace();
        let (_ty, name, eq, value) = (it.next()?, it.next()?, it.next()?, it.next()?);
        (name == "PreserveFramePointer" && eq == "=").then(|| value == "true")
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    #[test]
    fn preserve_frame_pointer_from_vm_flags() {
        let on = "1234:\n     bool PrintWarnings                            = true                                      {product} {default}\n     bool PreserveFramePointer                     = true                                      {product} {command line}\n";
        assert_eq!(preserve_frame_pointer(on), Some(true));
        let off = "     bool PreserveFramePointer                     = false                                     {product} {default}\n";
        assert_eq!(preserve_frame_pointer(off), Some(false));
        let noisy = "     bool ShowCodeDetailsInExceptionMessages       = true    {manageable} {default}\n";
        assert!(!noisy.lines().any(exception_line));
        assert_eq!(preserve_frame_pointer("1234:\nCommand executed successfully\n"), None);
    }

    #[test]
    fn a_process_that_would_die_of_sigquit_is_not_attachable() {
        // A child with SIGQUIT at its default action (sleep): no attach request may be sent.
        let mut child = Command::new("sleep").arg("30").spawn().expect("sleep");
        assert!(!attachable(child.id()));
        let mut j = Jcmd::new(child.id());
        assert!(j.poll().is_none());
        assert!(j.running.is_none(), "nothing started");
        let done = j.finish();
        assert_eq!(done.len(), 1);
        assert_eq!(done[0].result.as_ref().unwrap_err(), NOT_ATTACHABLE);
        let _ = child.kill();
        let _ = child.wait();
        // A process that catches SIGQUIT (a shell trapping it) is.
        let mut trap = Command::new("sh").args(["-c", "trap 'echo' QUIT; sleep 30 & wait"]).spawn().expect("sh");
        let deadline = Instant::now() + Duration::from_secs(10);
        while !attachable(trap.id()) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(attachable(trap.id()), "a shell trapping SIGQUIT catches it");
        let _ = trap.kill();
        let _ = trap.wait();
    }

    #[test]
    fn error_line_names_the_exception() {
        let out = "1234:\ncom.sun.tools.attach.AttachNotSupportedException: Unable to open socket file /proc/1234/root/tmp/.java_pid1: target process 1234 doesn't respond within 10500ms or HotSpot VM not loaded\n\tat jdk.attach/sun.tools.attach.VirtualMachineImpl.<init>(VirtualMachineImpl.java:100)\n";
        assert!(first_error_line(out, "").starts_with("com.sun.tools.attach.AttachNotSupportedException: Unable"));
        assert_eq!(first_error_line("", "boom\n\n"), "boom");
        assert_eq!(first_error_line("", ""), "no output");
    }

    /// Poll `j` until a command ended (at most 20 s).
    fn ended(j: &mut Jcmd) -> Done {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(d) = j.poll() {
                return d;
            }
            assert!(Instant::now() < deadline, "the command never ended");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    #[test]
    fn a_gone_jvm_is_an_error_in_the_background_not_a_hang() {
        let mut j = Jcmd::new(999_999_999);
        j.ready = true;
        assert!(j.poll().is_none(), "started, not collected yet");
        assert!(j.busy());
        let done = ended(&mut j);
        assert_eq!(done.job, Job::Flags);
        assert!(done.result.unwrap_err().contains("/proc/999999999/status"));
        assert!(!j.busy());
        j.want_perf_map();
        assert!(j.poll().is_none(), "the perf map run starts");
        assert_eq!(ended(&mut j).job, Job::PerfMap);
        assert_eq!(j.perf_map_runs, 1);
        j.want_perf_map();
        assert!(j.poll().is_none(), "the next run waits PERF_MAP_GAP");
        assert!(j.running.is_none());
        j.last_perf_map = None;
        assert!(j.poll().is_none(), "a third try starts");
        assert!(ended(&mut j).result.is_err());
        j.last_perf_map = None;
        j.want_perf_map();
        assert!(
            j.poll().is_none() && j.running.is_none(),
            "no fourth try after {MAX_FAILURES_IN_A_ROW} failures in a row"
        );
        let all = j.finish();
        assert_eq!(all.len(), 1);
        assert_eq!(all[0].job, Job::PerfMap);
    }
}
