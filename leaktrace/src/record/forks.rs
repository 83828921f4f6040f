//! --follow-forks from the fork itself: the traced processes' new children are held as their
//! fork returns to them (the kernel side's `FORK_HOLD`, docs/reliability.md) until followed.

use crate::launch;
use crate::probes::Tracer;

use super::traced::Traced;

/// Hold the new children of every process in `targets` at their fork (`Tracer::hold_forks`);
/// unless a guardian runs already (a launched command's), fork one that resumes the targets'
/// process groups if leaktrace dies while a child is held. Failures are warnings on stderr: a
/// child not held is followed from the agent's next poll, as before.
pub(super) fn hold_children(tracer: &mut Tracer, targets: &[Traced], guardian: &mut Option<launch::Guardian>) {
    if guardian.is_none() {
        let pids: Vec<u32> = targets.iter().map(|t| t.pid).collect();
        match launch::Guardian::for_groups(&pids) {
            Ok(g) => *guardian = Some(g),
            Err(e) => {
                crate::note!(
                    "leaktrace: warning: {e:#}: children held at their fork stay stopped if leaktrace is killed"
                )
            }
        }
    }
    for t in targets {
        if let Err(e) = tracer.hold_forks(t.pid, true) {
            crate::note!("leaktrace: warning: {e:#}: PID {}'s children run unprobed until the next poll", t.pid);
        }
    }
}
