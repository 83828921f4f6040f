//! The end of a recording asked by a signal (SIGINT, SIGTERM, SIGHUP) is bounded whatever the
//! target does: once signalled, every exchange with a target's runtime (the Node inspector, the
//! JVM's attach socket, a scan's pause) gets at most [`AFTER_SIGNAL`] more ([`cap`]); a second
//! signal ends leaktrace at once, and so does [`BACKSTOP`] after the first when the end is
//! still not written (a read blocked in the kernel). Ending at once is safe for the targets:
//! the kernel detaches leaktrace's probes and ptrace, and the guardians resume a held launched
//! command and close a Node inspector leaktrace opened.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// What an exchange with a target still gets once a signal asked the recording to end.
pub const AFTER_SIGNAL: Duration = Duration::from_secs(3);
/// The end of the recording after the first signal, at most.
pub const BACKSTOP: Duration = Duration::from_secs(60);

static SIGNALS: AtomicU32 = AtomicU32::new(0);
static SIGNALLED_AT: OnceLock<Instant> = OnceLock::new();

/// Count the signals (alongside the session's own handlers) and start the watchdog thread.
/// Errors are ignored: without it, the session's handlers still end the recording.
pub fn install() {
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: the action only touches an atomic and, at the second signal, calls write(2)
        // and _exit(2): all async-signal-safe.
        let _ = unsafe {
            signal_hook_registry::register(sig, || {
                if SIGNALS.fetch_add(1, Ordering::SeqCst) >= 1 {
                    let msg = b"leaktrace: error: a second signal: ended at once, nothing written\n";
                    libc::write(2, msg.as_ptr().cast(), msg.len());
                    libc::_exit(130);
                }
            })
        };
    }
    let _ = std::thread::Builder::new().name("signal-watch".into()).spawn(|| {
        while SIGNALS.load(Ordering::SeqCst) == 0 {
            std::thread::sleep(Duration::from_millis(50));
        }
        let at = *SIGNALLED_AT.get_or_init(Instant::now);
        std::thread::sleep(BACKSTOP.saturating_sub(at.elapsed()));
        crate::note!(
            "leaktrace: error: the recording did not end within {} s of the signal (a read of the target is blocked): ended without writing",
            BACKSTOP.as_secs()
        );
        // SAFETY: ends the process; nothing of it is used after.
        unsafe { libc::_exit(2) };
    });
}

/// A signal asked the recording to end (also one that came before the session listened).
pub fn signalled() -> bool {
    SIGNALS.load(Ordering::SeqCst) > 0
}

/// `deadline`, or earlier: [`AFTER_SIGNAL`] after the signal that asked the recording to end.
pub fn cap(deadline: Instant) -> Instant {
    if SIGNALS.load(Ordering::SeqCst) == 0 {
        return deadline;
    }
    let at = *SIGNALLED_AT.get_or_init(Instant::now);
    deadline.min(at + AFTER_SIGNAL)
}
