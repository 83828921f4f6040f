//! A target process started by the test (attach mode).

use std::io::{BufRead as _, BufReader};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::*;

/// A fixture process started by the test: its stdout lines are read as they come, it is reaped
/// as soon as it exits (so that it does not linger as a zombie), and killed when dropped.
pub struct Target {
    pub pid: u32,
    lines: Receiver<String>,
    status: Arc<Mutex<Option<ExitStatus>>>,
    reaper: Option<JoinHandle<()>>,
}

impl Target {
    pub fn spawn(mut cmd: Command) -> Target {
        let command = show(&cmd);
        cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::inherit());
        let mut child = cmd.spawn().unwrap_or_else(|e| panic!("cannot start {command}: {e}"));
        let pid = child.id();
        let out = child.stdout.take().expect("stdout piped");
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                let _ = tx.send(line);
            }
        });
        let status = Arc::new(Mutex::new(None));
        let st = Arc::clone(&status);
        let reaper = std::thread::spawn(move || {
            let s = child.wait().expect("wait for target");
            *st.lock().unwrap() = Some(s);
        });
        Target { pid, lines, status, reaper: Some(reaper) }
    }

    /// The next stdout line, within `timeout`.
    pub fn next_line(&self, timeout: Duration) -> Option<String> {
        self.lines.recv_timeout(timeout).ok()
    }

    /// Read the "PID <pid>" line and check it names this process.
    pub fn expect_pid_line(&self) {
        let line = self.next_line(Duration::from_secs(10)).expect("the target printed no PID line");
        assert_eq!(line, format!("PID {}", self.pid), "the target's first line");
    }

    pub fn signal(&self, sig: i32) {
        if self.status.lock().unwrap().is_none() {
            // SAFETY: kill has no memory-safety preconditions; the target is not reaped yet.
            unsafe { libc::kill(self.pid as libc::pid_t, sig) };
        }
    }

    pub fn exit_status(&self) -> Option<ExitStatus> {
        *self.status.lock().unwrap()
    }

    /// Wait for the target's exit, at most `timeout`.
    pub fn wait(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some(s) = self.exit_status() {
                return Some(s);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        {
            let status = self.status.lock().unwrap();
            if status.is_none() {
                // SAFETY: as above.
                unsafe { libc::kill(self.pid as libc::pid_t, libc::SIGKILL) };
            }
        }
        if let Some(r) = self.reaper.take() {
            let _ = r.join();
        }
    }
}

/// Whether `pid` listens on a TCP port: a listening socket of its network namespace
/// (/proc/PID/net/tcp and tcp6) that is one of its own descriptors.
pub fn listens(pid: u32) -> bool {
    let inodes: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| {
            d.filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
                .filter_map(|l| l.to_str()?.strip_prefix("socket:[")?.strip_suffix(']').map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    ["tcp", "tcp6"].iter().any(|f| {
        std::fs::read_to_string(format!("/proc/{pid}/net/{f}")).unwrap_or_default().lines().skip(1).any(|l| {
            let c: Vec<&str> = l.split_whitespace().collect();
            c.len() > 9 && c[3] == "0A" && inodes.iter().any(|i| i == c[9])
        })
    })
}
