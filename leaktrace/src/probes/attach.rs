//! Attaching the probes to a process: entry and return probes at the discovered points
//! (uprobe_multi links or single uprobes), the teardown and work probes, and the exec and fork
//! holds of a traced process.
use super::*;

/// Where one process's probes stood at one moment ([`Tracer::process_mark`]).
pub struct ProcessMark {
    pid: u32,
    /// How many of [`Tracer`]'s links were this process's (they keep their order).
    links: usize,
    attached: std::collections::HashSet<(u32, String, u64, &'static str)>,
}

impl ProcessMark {
    /// The process it marks.
    pub fn pid(&self) -> u32 {
        self.pid
    }
}

impl Tracer {
    /// Where process `pid`'s probes stand now: [`Tracer::detach_process_to`] removes those of
    /// its probes attached since, whatever was attached to or released from other processes
    /// meanwhile (`watch`'s exact window, which runs while other processes come and go).
    pub fn process_mark(&self, pid: u32) -> ProcessMark {
        ProcessMark {
            pid,
            links: self.links.iter().filter(|(p, _)| *p == pid).count(),
            attached: self.attached.iter().filter(|a| a.0 == pid).cloned().collect(),
        }
    }

    /// Detach every probe of the mark's process attached since `mark` (growth mode's exact
    /// window: its allocator probes go, its growth-mode probes stay); returns how many links
    /// went once they are all gone (their removals wait for RCU grace periods together, one
    /// thread each).
    /// A process released meanwhile (`Tracer::release_process`) has none left to detach.
    pub fn detach_process_to(&mut self, mark: ProcessMark) -> usize {
        let (mut mine, others): (Vec<_>, Vec<_>) =
            std::mem::take(&mut self.links).into_iter().partition(|(p, _)| *p == mark.pid);
        let later = mine.split_off(mark.links.min(mine.len()));
        self.links = others;
        self.links.extend(mine);
        let detach = self.take_links(later);
        let n = detach.len();
        std::thread::scope(|s| {
            for link in detach {
                s.spawn(move || drop(link));
            }
        });
        self.attached.retain(|a| a.0 != mark.pid);
        if self.targets.get(&mark.pid, 0).is_ok() {
            self.attached.extend(mark.attached);
        }
        n
    }

    /// Forget process `tgid`'s blocks in the kernel's block tables (its `BLOCKS` slots, found by
    /// their sites, and its `ALLOCS` entries), once its allocator probes are detached: the
    /// blocks an exact window recorded whose frees no probe will see. `watch`'s tracer outlives
    /// its exact windows: left there, they would fill the tables window after window, and a
    /// later window's frees of them would be counted against the old window's sites. A bucket
    /// is rewritten whole: a block another process's exact window placed in it at that very
    /// moment may be lost (its free then counted as one of an untraced block). Returns how many
    /// blocks went. Errors: a map is missing or could not be read or written.
    pub fn forget_blocks(&mut self, tgid: u32) -> anyhow::Result<usize> {
        use leaktrace_common::{AllocInfo, AllocKey, BlockBucket};
        let indices: std::collections::HashSet<u32> = self.site_keys(tgid)?.into_keys().collect();
        let mut n = 0;
        let map = self.ebpf.map_mut("BLOCKS").context("no BLOCKS map")?;
        let mut blocks: aya::maps::Array<&mut MapData, BlockBucket> =
            aya::maps::Array::try_from(map).context("BLOCKS is not an array")?;
        for i in 0..blocks.len() {
            let mut bucket = blocks.get(&i, 0).context("reading the BLOCKS map")?;
            let mut cleared = 0;
            for slot in bucket.slots.iter_mut().filter(|s| s.tag != 0 && indices.contains(&s.info.index)) {
                *slot = Default::default();
                cleared += 1;
            }
            if cleared > 0 {
                blocks.set(i, bucket, 0).context("writing the BLOCKS map")?;
                n += cleared;
            }
        }
        let map = self.ebpf.map_mut("ALLOCS").context("no ALLOCS map")?;
        let mut allocs: HashMap<&mut MapData, AllocKey, AllocInfo> =
            HashMap::try_from(map).context("ALLOCS is not a hash map")?;
        let keys: Vec<AllocKey> = allocs.keys().filter_map(Result::ok).filter(|k| k.tgid == tgid).collect();
        n += keys.iter().filter(|k| allocs.remove(k).is_ok()).count();
        Ok(n)
    }

    /// `links` as values whose drop detaches them (a single uprobe's link taken from its program).
    pub(super) fn take_links(&mut self, links: Vec<(u32, Link)>) -> Vec<Box<dyn Send>> {
        let mut out: Vec<Box<dyn Send>> = Vec::new();
        for (_, link) in links {
            match link {
                Link::Multi(fd) => out.push(Box::new(fd)),
                Link::Single(program, id) => {
                    if let Some(prog) = self.ebpf.program_mut(program).and_then(|p| <&mut UProbe>::try_from(p).ok())
                        && let Ok(link) = prog.take_link(id)
                    {
                        out.push(Box::new(link));
                    }
                }
            }
        }
        out
    }

    /// Attach entry (and return) probes at `points`, for process `pid` only. Points already
    /// attached are skipped. Returns the placements made, for the coverage table.
    ///
    /// With uprobe_multi links, one link per file and program holds every offset of that
    /// program in that file; return programs are attached before entry programs, so that a call
    /// entered while attaching never leaves an in-flight record whose return is never seen.
    /// Errors: the kernel refused a probe (then the probes placed before it stay attached).
    pub fn attach(&mut self, pid: u32, points: &[ProbePoint]) -> anyhow::Result<Vec<ProbeInfo>> {
        std::num::NonZeroU32::new(pid).context("PID 0 cannot be traced")?;
        let (started, links_before) = (std::time::Instant::now(), self.links.len());
        let placed = self.attach_points(pid, points)?;
        log::info!(
            "PID {pid}: {} probes attached with {} links in {:.3} s",
            placed.len(),
            self.links.len() - links_before,
            started.elapsed().as_secs_f64()
        );
        Ok(placed)
    }

    fn attach_points(&mut self, pid: u32, points: &[ProbePoint]) -> anyhow::Result<Vec<ProbeInfo>> {
        // (program, kind, point), return probes first.
        let mut todo: Vec<(&'static str, ProbeKind, &ProbePoint)> = Vec::new();
        for pass in [ProbeKind::Return, ProbeKind::Entry] {
            for p in points {
                let program = match pass {
                    ProbeKind::Return => match p.hook.return_program {
                        Some(r) => r.name,
                        None => continue,
                    },
                    _ => p.hook.entry_program.name,
                };
                let key = (pid, p.object.path.display().to_string(), p.offset, program);
                if self.attached.contains(&key) {
                    continue;
                }
                todo.push((program, pass, p));
            }
        }
        let mut placed = Vec::new();
        if self.single_why.is_none() {
            // Group by (kind, file, program), in first-seen order (return groups come first).
            let mut groups: Vec<(ProbeKind, &std::path::Path, &'static str, Vec<&ProbePoint>)> = Vec::new();
            for &(program, kind, p) in &todo {
                match groups.iter_mut().find(|g| g.0 == kind && g.1 == p.object.open_path && g.2 == program) {
                    Some(g) => g.3.push(p),
                    None => groups.push((kind, &p.object.open_path, program, vec![p])),
                }
            }
            for (kind, open_path, program, group) in groups {
                let mut offsets: Vec<u64> = group.iter().map(|p| p.probe_offset).collect();
                offsets.sort_unstable();
                offsets.dedup();
                let functions = || group.iter().map(|p| p.function.as_str()).collect::<Vec<_>>().join(", ");
                let link = self
                    .attach_multi(program, open_path, &offsets, pid, kind == ProbeKind::Return)
                    .with_context(|| {
                        format!(
                            "cannot place uprobes on {} in {} (PID {pid})",
                            functions(),
                            group[0].object.path.display()
                        )
                    })?;
                self.links.push((pid, Link::Multi(link)));
                for p in group {
                    let object = p.object.path.display().to_string();
                    self.attached.insert((pid, object.clone(), p.offset, program));
                    placed.push(probe_info(p, object, kind));
                }
            }
            return Ok(placed);
        }
        let scope = UProbeScope::OneProcess(std::num::NonZeroU32::new(pid).context("PID 0 cannot be traced")?);
        for (program, kind, p) in todo {
            let object = p.object.path.display().to_string();
            let prog: &mut UProbe = self
                .ebpf
                .program_mut(program)
                .with_context(|| format!("eBPF program {program} missing"))?
                .try_into()?;
            // Both probes at the placement: it only skips instructions every call runs and
            // that leave the return address at the stack pointer (see `placement`).
            let link = prog
                .attach(p.probe_offset, &p.object.open_path, scope)
                .with_context(|| format!("cannot place a uprobe on {} in {} (PID {pid})", p.function, object))?;
            self.links.push((pid, Link::Single(program, link)));
            self.attached.insert((pid, object.clone(), p.offset, program));
            placed.push(probe_info(p, object, kind));
        }
        Ok(placed)
    }

    /// A uprobe_multi link of `program` at `offsets` of the file `open_path`, for `pid`.
    fn attach_multi(
        &mut self,
        program: &str,
        open_path: &std::path::Path,
        offsets: &[u64],
        pid: u32,
        ret: bool,
    ) -> anyhow::Result<std::os::fd::OwnedFd> {
        use std::os::fd::{AsFd as _, AsRawFd as _};
        let prog: &mut UProbe =
            self.ebpf.program_mut(program).with_context(|| format!("eBPF program {program} missing"))?.try_into()?;
        let fd = prog.fd()?.as_fd().as_raw_fd();
        Ok(crate::uprobe_multi::attach(fd, open_path, offsets, pid, ret)?)
    }

    /// One probe of `program` (an entry program) at file `offset` of `open_path` in `pid`, by
    /// whichever way probes are attached.
    fn attach_one(
        &mut self,
        program: &'static str,
        open_path: &std::path::Path,
        offset: u64,
        pid: u32,
    ) -> anyhow::Result<()> {
        if self.single_why.is_none() {
            let link = self.attach_multi(program, open_path, &[offset], pid, false)?;
            self.links.push((pid, Link::Multi(link)));
            return Ok(());
        }
        let scope = UProbeScope::OneProcess(std::num::NonZeroU32::new(pid).context("PID 0 cannot be traced")?);
        let prog: &mut UProbe =
            self.ebpf.program_mut(program).with_context(|| format!("eBPF program {program} missing"))?.try_into()?;
        let link = prog.attach(offset, open_path, scope)?;
        self.links.push((pid, Link::Single(program, link)));
        Ok(())
    }

    /// Put a teardown probe (`teardown_enter`) on `function` at file `offset` of `object` (opened
    /// through `open_path`) in process `pid`: libc's `exit` or CPython's `Py_FinalizeEx`. It
    /// acts only while the process is watched ([`Tracer::watch_teardown`]).
    pub fn attach_teardown_probe(
        &mut self,
        pid: u32,
        object: &str,
        open_path: &std::path::Path,
        function: &str,
        offset: u64,
    ) -> anyhow::Result<ProbeInfo> {
        self.attach_one(program::TEARDOWN_ENTER.name, open_path, offset, pid)
            .with_context(|| format!("cannot place the teardown probe on {function} in {object}"))?;
        Ok(ProbeInfo {
            object: object.to_string(),
            function: function.to_string(),
            kind: ProbeKind::Teardown,
            offset,
            placement: None,
        })
    }

    /// Watch (`on`) or stop watching the teardown of process `tgid`: while watched, its first
    /// call of a teardown probe's function stops it (SIGSTOP) and queues a
    /// `map_event::TEARDOWN` event; the entry is then gone (one stop per process).
    pub fn watch_teardown(&mut self, tgid: u32, on: bool) -> anyhow::Result<()> {
        if on {
            self.teardown.insert(tgid, 0, 0).context("adding the target to the TEARDOWN map")
        } else {
            match self.teardown.remove(&tgid) {
                Ok(()) | Err(aya::maps::MapError::KeyNotFound) => Ok(()),
                Err(e) => Err(e).context("removing the target from the TEARDOWN map"),
            }
        }
    }

    /// Stop launched process `tgid` at each of its execs after the first `pass` (the launch's own
    /// exec of the command is let through), and with `children` also untraced children of it
    /// at their exec (the kernel side's `sched_process_exec`: SIGSTOP before the new image runs,
    /// a `MapEvent` EXEC or CHILD_EXEC for the agent, which probes the image and sends SIGCONT).
    /// Errors: the EXEC_HOLD map is full or refused the update.
    pub fn hold_execs(&mut self, tgid: u32, pass: u32, children: bool) -> anyhow::Result<()> {
        let bits = (pass & leaktrace_common::exec_hold::PASS_MASK)
            | if children { leaktrace_common::exec_hold::CHILDREN } else { 0 };
        self.exec_hold.insert(tgid, bits, 0).context("adding the process to the EXEC_HOLD map")
    }

    /// Stop holding `tgid`'s execs (and its children's); an exec already held still comes
    /// through as an event. Errors: the map refused the removal.
    pub fn release_execs(&mut self, tgid: u32) -> anyhow::Result<()> {
        match self.exec_hold.remove(&tgid) {
            Ok(()) | Err(aya::maps::MapError::KeyNotFound) => Ok(()),
            Err(e) => Err(e).context("removing the process from the EXEC_HOLD map"),
        }
    }

    /// Hold (`on`) or stop holding the new child processes of `tgid` at their fork: while held,
    /// a child stops (SIGSTOP) as its `clone`/`clone3`/`fork`/`vfork` returns to it, before its
    /// first instruction, and a `map_event::FORK_HELD` event is queued; the agent attaches to
    /// it and sends SIGCONT (--follow-forks). Errors: the FORK_HOLD map is full or refused.
    pub fn hold_forks(&mut self, tgid: u32, on: bool) -> anyhow::Result<()> {
        if on {
            return self.fork_hold.insert(tgid, 1, 0).context("adding the process to the FORK_HOLD map");
        }
        match self.fork_hold.remove(&tgid) {
            Ok(()) | Err(aya::maps::MapError::KeyNotFound) => Ok(()),
            Err(e) => Err(e).context("removing the process from the FORK_HOLD map"),
        }
    }

    /// The GC probes in process `pid`: `gc_full_enter` at file offset `finish` (a full
    /// collection's end) and `gc_limit_enter` at `limit` (the size it left) of the object opened
    /// through `open_path`; the process's `GC_FULL` entry is made first.
    pub fn attach_gc_probes(
        &mut self,
        pid: u32,
        open_path: &std::path::Path,
        finish: u64,
        limit: u64,
    ) -> anyhow::Result<()> {
        self.watch_gc(pid)?;
        self.attach_one(program::GC_LIMIT_ENTER.name, open_path, limit, pid)?;
        self.attach_one(program::GC_FULL_ENTER.name, open_path, finish, pid)
    }

    /// Count calls of the function at file `offset` of `object` (opened through `open_path`) in
    /// process `pid` as units of work.
    pub fn attach_work_probe(
        &mut self,
        pid: u32,
        object: &str,
        open_path: &std::path::Path,
        offset: u64,
    ) -> anyhow::Result<ProbeInfo> {
        self.attach_one(program::WORK_ENTER.name, open_path, offset, pid)
            .with_context(|| format!("cannot place the work probe at offset {offset:#x} of {object}"))?;
        Ok(ProbeInfo {
            object: object.to_string(),
            function: String::new(),
            kind: ProbeKind::Work,
            offset,
            placement: None,
        })
    }
}

/// The coverage-table line of a probe of `kind` (entry or return) placed at `p`.
fn probe_info(p: &ProbePoint, object: String, kind: ProbeKind) -> ProbeInfo {
    ProbeInfo {
        object,
        function: p.function.clone(),
        kind,
        offset: p.probe_offset,
        placement: Some(p.placement.clone()),
    }
}
