//! Running leaktrace.

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::os::unix::process::{CommandExt as _, ExitStatusExt as _};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::*;

/// A `leaktrace` command with these arguments.
pub fn leaktrace<I, S>(args: I) -> Command
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    let mut cmd = Command::new(leaktrace_bin());
    cmd.args(args);
    cmd
}

/// How a process ended, with everything it printed.
#[derive(Debug)]
pub struct Output {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
    pub command: String,
}

impl Output {
    /// The (figure, figure) pairs of the stdout lines `WORD A B` a fixture prints to tell its
    /// progress (e.g. "uploads 12.0 36000"), in order; other lines skipped.
    pub fn progress(&self, word: &str) -> Vec<(f64, f64)> {
        self.stdout
            .lines()
            .filter_map(|l| {
                let mut w = l.split_whitespace();
                (w.next()? == word).then_some(())?;
                Some((w.next()?.parse().ok()?, w.next()?.parse().ok()?))
            })
            .collect()
    }

    pub fn code(&self) -> Option<i32> {
        self.status.code()
    }
    /// For failure messages.
    pub fn describe(&self) -> String {
        format!(
            "command: {}\nstatus: {:?} (code {:?}, signal {:?})\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.command,
            self.status,
            self.status.code(),
            self.status.signal(),
            self.stdout,
            self.stderr
        )
    }
    /// Panic (showing everything) unless the process exited with status 0.
    pub fn assert_success(&self) -> &Self {
        assert!(self.status.success(), "leaktrace failed\n{}", self.describe());
        self
    }
}

pub(crate) fn show(cmd: &Command) -> String {
    let mut parts: Vec<String> = cmd
        .get_envs()
        .filter_map(|(k, v)| v.map(|v| format!("{}={}", k.to_string_lossy(), v.to_string_lossy())))
        .collect();
    parts.push(cmd.get_program().to_string_lossy().into_owned());
    parts.extend(cmd.get_args().map(|a| a.to_string_lossy().into_owned()));
    parts.join(" ")
}

/// A running process (leaktrace) in its own process group, whose stdout and stderr are
/// collected; stderr lines are also observable while it runs.
pub struct Running {
    child: Child,
    command: String,
    stdout: Option<JoinHandle<String>>,
    stderr_lines: Arc<Mutex<Vec<String>>>,
    stderr_rx: Receiver<String>,
    stderr_thread: Option<JoinHandle<()>>,
}

impl Running {
    /// Spawn `cmd` (stdout and stderr piped, stdin from `stdin` or /dev/null).
    pub fn spawn(mut cmd: Command, stdin: Option<&[u8]>) -> Running {
        let command = show(&cmd);
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).process_group(0);
        cmd.stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() });
        let mut child = cmd.spawn().unwrap_or_else(|e| panic!("cannot start {command}: {e}"));
        if let Some(data) = stdin {
            let mut pipe = child.stdin.take().expect("stdin piped");
            let data = data.to_vec();
            std::thread::spawn(move || {
                let _ = pipe.write_all(&data);
                // dropping the pipe closes it: the reader sees end of file
            });
        }
        let mut out = child.stdout.take().expect("stdout piped");
        let stdout = std::thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = out.read_to_end(&mut buf);
            String::from_utf8_lossy(&buf).into_owned()
        });
        let err = child.stderr.take().expect("stderr piped");
        let stderr_lines = Arc::new(Mutex::new(Vec::new()));
        let (tx, stderr_rx) = channel();
        let lines = Arc::clone(&stderr_lines);
        let stderr_thread = std::thread::spawn(move || {
            for line in BufReader::new(err).lines() {
                let Ok(line) = line else { break };
                lines.lock().unwrap().push(line.clone());
                let _ = tx.send(line);
            }
        });
        Running { child, command, stdout: Some(stdout), stderr_lines, stderr_rx, stderr_thread: Some(stderr_thread) }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// stderr so far.
    pub fn stderr_so_far(&self) -> String {
        self.stderr_lines.lock().unwrap().join("\n")
    }

    /// Wait until a stderr line starts with `prefix`. Err (with stderr so far) on timeout or when
    /// the process closed its stderr first.
    pub fn wait_for_stderr_line(&mut self, prefix: &str, timeout: Duration) -> Result<String, String> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.stderr_rx.recv_timeout(left) {
                Ok(line) if line.starts_with(prefix) => return Ok(line),
                Ok(_) => {}
                Err(RecvTimeoutError::Timeout) => {
                    return Err(format!(
                        "no stderr line starting with {prefix:?} within {timeout:?} from {}\nstderr so far:\n{}",
                        self.command,
                        self.stderr_so_far()
                    ));
                }
                Err(RecvTimeoutError::Disconnected) => {
                    let status = self.child.wait().ok();
                    return Err(format!(
                        "{} ended ({status:?}) before printing a stderr line starting with {prefix:?}\nstderr:\n{}",
                        self.command,
                        self.stderr_so_far()
                    ));
                }
            }
        }
    }

    /// Send a signal to the process.
    pub fn signal(&self, sig: i32) {
        // SAFETY: kill has no memory-safety preconditions; the pid is our unreaped child.
        unsafe { libc::kill(self.child.id() as libc::pid_t, sig) };
    }

    fn kill_group(&mut self) {
        // SAFETY: as above; the child leads its own process group (process_group(0)).
        unsafe { libc::kill(-(self.child.id() as libc::pid_t), libc::SIGKILL) };
        let _ = self.child.kill();
    }

    /// Wait for the end (at most `timeout`, else kill it with its process group and panic with
    /// its stderr).
    pub fn wait(mut self, timeout: Duration) -> Output {
        let deadline = Instant::now() + timeout;
        let status = loop {
            match self.child.try_wait().expect("try_wait") {
                Some(status) => break status,
                None if Instant::now() >= deadline => {
                    self.kill_group();
                    let _ = self.child.wait();
                    std::thread::sleep(Duration::from_millis(100));
                    panic!("timed out after {timeout:?}, killed: {}\nstderr:\n{}", self.command, self.stderr_so_far());
                }
                None => std::thread::sleep(Duration::from_millis(20)),
            }
        };
        // A child left behind by leaktrace could hold the pipes open: give the readers a moment,
        // then kill the group.
        let grace = Instant::now() + Duration::from_secs(5);
        while !self.stdout.as_ref().unwrap().is_finished() && Instant::now() < grace {
            std::thread::sleep(Duration::from_millis(20));
        }
        if !self.stdout.as_ref().unwrap().is_finished() {
            // SAFETY: as above.
            unsafe { libc::kill(-(self.child.id() as libc::pid_t), libc::SIGKILL) };
        }
        let stdout = self.stdout.take().unwrap().join().unwrap_or_default();
        if let Some(t) = self.stderr_thread.take() {
            let _ = t.join();
        }
        Output { status, stdout, stderr: self.stderr_so_far(), command: self.command.clone() }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.kill_group();
            let _ = self.child.wait();
        }
    }
}

/// Run `cmd` to its end (see [`Running::wait`]).
pub fn run(cmd: Command, stdin: Option<&[u8]>, timeout: Duration) -> Output {
    Running::spawn(cmd, stdin).wait(timeout)
}

/// `leaktrace record --interval 250ms --out OUT [extra...] -- TARGET...`, to its end, in
/// TARGET's working directory when it has one.
pub fn record_launch(out: &OutDir, extra: &[&str], target: Command) -> Output {
    let mut cmd = leaktrace(["record", "--interval", "250ms", "--out"]);
    cmd.arg(&out.path).args(extra).arg("--");
    for (k, v) in target.get_envs() {
        match v {
            Some(v) => cmd.env(k, v),
            None => cmd.env_remove(k),
        };
    }
    cmd.arg(target.get_program()).args(target.get_args());
    // The command runs where leaktrace runs (it launches it): in the target's directory when
    // one is given (node's is a temporary one, for the files V8 writes there).
    if let Some(dir) = target.get_current_dir() {
        cmd.current_dir(dir);
    }
    run(cmd, None, TIMEOUT)
}

/// The "PID <pid>" line every fixture prints first.
pub fn pid_line(stdout: &str) -> Option<u32> {
    stdout.lines().next()?.strip_prefix("PID ")?.trim().parse().ok()
}

/// leaktrace did not panic (no "panicked" on its stderr).
pub fn assert_no_panic(o: &Output) {
    assert!(!o.stderr.contains("panicked"), "leaktrace panicked\n{}", o.describe());
}

/// Exit code 2, one `leaktrace: error:` line mentioning each of `mentions`, nothing attached,
/// no panic.
pub fn assert_error(o: &Output, mentions: &[&str]) -> String {
    assert_no_panic(o);
    assert_eq!(o.code(), Some(2), "exit code\n{}", o.describe());
    let errors: Vec<&str> = o.stderr.lines().filter(|l| l.starts_with("leaktrace: error:")).collect();
    assert_eq!(errors.len(), 1, "exactly one 'leaktrace: error:' line expected\n{}", o.describe());
    for m in mentions {
        assert!(errors[0].contains(m), "the error line should mention {m:?}: {}", errors[0]);
    }
    assert!(
        !o.stderr.lines().any(|l| l.starts_with("leaktrace: attached")),
        "it attached before failing\n{}",
        o.describe()
    );
    errors[0].to_string()
}
