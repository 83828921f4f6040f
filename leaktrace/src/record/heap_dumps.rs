//! `--heap-dump` with the tracer at hand: a runtime's heap dump sees the traced live blocks its
//! objects own (the JVM's direct buffers' off-heap memory), and the sites of those blocks are
//! named from the recording's stacks. The first dump at a periodic checkpoint
//! ([`FirstDumpSink`]), the last at the end of the session ([`last_dumps`]).

use std::path::PathBuf;
use std::time::Instant;

use crate::probes::Tracer;
use crate::runtimes::jvm::heapdump::Natives;

use super::sink::{CheckpointSink, SinkCx};
use super::traced::Traced;

/// Run `f` on the census of `t` with its traced blocks (read when asked, sorted by address;
/// none in growth or sampled mode) and a namer of their sites.
fn with_natives(tracer: &Tracer, t: &mut Traced, f: impl FnOnce(&mut crate::holds::HeapCensus, &mut Natives<'_>)) {
    let mut census = std::mem::take(&mut t.census);
    let pid = t.pid;
    let blocks = || match (tracer.live_block_maps(), tracer.site_keys(pid)) {
        (Some(maps), Ok(sites)) => crate::reach::blocks::read(maps, pid, &sites).unwrap_or_default(),
        _ => Vec::new(),
    };
    let mut stack_of = |key| {
        let id = t.stack_for(tracer, key);
        // The program's Java method that allocated (JIT frames named from the perf map), else
        // the native culprit.
        let by = |s: &leaktrace_analysis::recording::Stack| {
            leaktrace_analysis::runtimes::jvm::java_allocated_by(s).unwrap_or_else(|| super::pyheap::allocated_by(s))
        };
        (id, t.stacks.get(id as usize).map(by))
    };
    f(&mut census, &mut Natives { blocks: &blocks, stack_of: &mut stack_of });
    t.census = census;
}

/// End of the session: every census' last heap dump (`--heap-dump`), written in `dir`.
pub(super) fn last_dumps(
    tracer: &Tracer,
    t: &mut Traced,
    dir: &std::path::Path,
    alive: bool,
    (start, units): (Instant, Option<u64>),
) {
    with_natives(tracer, t, |c, n| c.heap_dump(dir, alive, (&|| start.elapsed().as_secs_f64(), units), n));
}

/// `--heap-dump`'s first dump of each traced process, at the first periodic checkpoint its
/// runtime can take it at (the JVM: once its first class histogram was taken).
pub(super) struct FirstDumpSink {
    pub(super) dir: PathBuf,
    /// Processes whose first dump is taken (or that have none to take).
    pub(super) done: std::collections::HashSet<u32>,
    /// The recording's start (the census' clock).
    pub(super) start: Instant,
}

impl CheckpointSink for FirstDumpSink {
    fn name(&self) -> &'static str {
        "first heap dumps"
    }

    fn periodic(&mut self, cx: &SinkCx<'_>, targets: &mut [Traced], _n: u64) {
        for t in targets.iter_mut() {
            if self.done.contains(&t.pid) || !t.census.dumps() || t.session.end_reason.is_some() {
                continue;
            }
            let units = t.checkpoints.last().and_then(|c| c.units_of_work);
            let start = self.start;
            let mut done = false;
            with_natives(cx.tracer, t, |c, n| {
                done = c.first_dump(&self.dir, (&|| start.elapsed().as_secs_f64(), units), n);
            });
            if done {
                self.done.insert(t.pid);
            }
        }
    }
}
