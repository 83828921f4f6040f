//! The guardian of a Node inspector leaktrace opened: a small process (leaktrace itself,
//! re-executed from /proc/self/exe with the hidden subcommand `__node-inspector-guard`, started
//! by `node.rs`'s `InspectorGuard`) that outlives the
//! agent. It holds the read end of a pipe; the agent writes `closed` once it closed the
//! inspector itself. When the pipe ends without that word (the agent was killed, even with
//! SIGKILL, or panicked), the guardian closes the inspector: an open inspector is code
//! execution as the target's user for anyone who can reach its port.
//!
//! The guardian is in a session of its own (Ctrl-C on the agent's terminal does not reach it),
//! checks that the PID is still the same process (its start time) and that the port is still
//! its listener on loopback before it speaks to it, and gives up after [`GIVE_UP`].

use std::io::Read as _;
use std::time::{Duration, Instant};

use super::census::{GUARD_SUBCOMMAND as SUBCOMMAND, close_inspector, start_time};

/// The guardian's whole work once the pipe ended, at most.
const GIVE_UP: Duration = Duration::from_secs(300);

/// The guardian's main: `args` are PID, PORT, START_TIME. Returns the exit code.
pub fn main(args: &[String]) -> i32 {
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGPIPE, libc::SIGQUIT] {
        // SAFETY: setting a signal's disposition to ignore.
        unsafe { libc::signal(sig, libc::SIG_IGN) };
    }
    let parsed = (args.first().and_then(|a| a.parse::<u32>().ok()), args.get(1).and_then(|a| a.parse::<u16>().ok()));
    let (Some(pid), Some(port)) = parsed else {
        crate::note!("leaktrace: error: {SUBCOMMAND} PID PORT START_TIME");
        return 2;
    };
    let started = args.get(2).and_then(|a| a.parse::<u64>().ok());
    let mut said = Vec::new();
    let _ = std::io::stdin().take(4096).read_to_end(&mut said);
    if String::from_utf8_lossy(&said).lines().any(|l| l == "closed") {
        return 0;
    }
    if start_time(pid) != started {
        return 0; // the target ended (a PID reused is another process)
    }
    let deadline = Instant::now() + GIVE_UP;
    // Tried again until GIVE_UP: a target that does not answer now (stopped, busy) may later.
    let mut r = close_inspector(pid, port, deadline);
    while r.is_err() && Instant::now() < deadline && start_time(pid) == started {
        std::thread::sleep(Duration::from_millis(500));
        r = close_inspector(pid, port, deadline);
    }
    match r {
        Ok(true) => {
            crate::note!(
                "leaktrace: the Node inspector leaktrace opened on PID {pid} (port {port}) was closed after leaktrace ended"
            );
            0
        }
        Ok(false) => 0,
        Err(e) => {
            crate::note!(
                "leaktrace: error: leaktrace ended with the Node inspector of PID {pid} open on port {port}, and it could not be closed: {e}"
            );
            1
        }
    }
}
