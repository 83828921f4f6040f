//! A traced process's managed runtime: detecting it from the objects it maps, the JVM's
//! gauges and perf map (jcmd in the background), CPython's frames, and what to say of JIT
//! frames left unnamed.
use super::*;

impl Traced {
    /// Detect the target's runtime (once) from the objects it maps (`pymalloc`: CPython's
    /// allocator API is hooked, `--pymalloc`).
    pub(in crate::record) fn detect_runtime(&mut self, objects: &[MappedObject], pymalloc: bool) {
        if self.runtime.is_some() {
            return;
        }
        let rt = crate::runtimes::detect(self.pid, objects, pymalloc);
        self.set_runtime(rt, objects);
    }

    /// The runtime detected in the process (None: none), its notes, gauge and JVM setup.
    pub(in crate::record) fn set_runtime(
        &mut self,
        rt: Option<crate::runtimes::RuntimeInfo>,
        objects: &[MappedObject],
    ) {
        if let Some(rt) = rt {
            self.warnings.extend(rt.notes.iter().cloned());
            self.gauge = crate::runtimes::gauge(self.pid, &rt);
            let jvm = rt.name == crate::recording::Runtime::Jvm;
            self.runtime = Some(rt);
            if jvm {
                self.jvm_setup(objects);
            }
        }
    }

    /// A JVM was detected. With `--jvm-perf-map`: its jcmd, whose first command reads the
    /// flags (is -XX:+PreserveFramePointer on?); without, or with no jcmd to run, that is read
    /// from its command line and environment. A note says when it is off.
    fn jvm_setup(&mut self, objects: &[MappedObject]) {
        use crate::runtimes::{jcmd, jvm};
        if self.jvm_perf_map_on {
            let libjvm = objects.iter().find(|o| crate::runtimes::file_name(&o.path) == "libjvm.so");
            match libjvm.and_then(|o| jcmd::program_for(self.pid, &o.path)) {
                Some(program) => {
                    self.jcmd = Some(jcmd::Jcmd::new(self.pid, program));
                    return;
                }
                None => {
                    self.jcmd_failure_noted = true;
                    self.warnings.push(
                        "--jvm-perf-map: no jcmd to run (neither the target's JDK has bin/jcmd here nor is one on PATH): \
                         Java frames stay unnamed"
                            .into(),
                    );
                }
            }
        }
        self.warnings.extend(jvm::frame_pointer_note_from_args(self.pid));
    }

    /// `--jvm-perf-map`, at every poll: ask for a perf map when stacks with unnamed JIT frames
    /// appeared since the last look, collect the jcmd command that ended (a new perf map names
    /// the stacks' JIT frames), start the next one due. Never blocks.
    pub(in crate::record) fn jvm_tick(&mut self) {
        let Some(j) = self.jcmd.as_mut() else { return };
        if self.stacks.len() > self.jit_scanned {
            if self.stacks[self.jit_scanned..].iter().any(|s| s.frames.iter().skip(1).any(|f| unnamed_jit(f))) {
                j.want_perf_map();
            }
            self.jit_scanned = self.stacks.len();
        }
        if let Some(done) = j.poll() {
            self.jcmd_done(done);
        }
    }

    /// End of the recording (the process still runs): with `--jvm-perf-map` and JIT frames still
    /// unnamed, one last `jcmd PID Compiler.perfmap`, waited for (at most
    /// [`crate::runtimes::jcmd::TIMEOUT`] per command). Then, for every runtime, unnamed JIT frames
    /// are named from the perf map as it is now.
    pub(in crate::record) fn jit_final(&mut self) {
        let unnamed = self.stacks.iter().any(|s| s.frames.iter().skip(1).any(|f| unnamed_jit(f)));
        // A jcmd that never succeeded (no attach) is not waited for again.
        if unnamed
            && (self.jcmd_failure.is_none() || self.perf_maps_written > 0)
            && self.session.end_reason.is_none()
            && procinfo::alive(self.pid)
            && let Some(j) = self.jcmd.as_mut()
        {
            crate::note!(
                "leaktrace: PID {}: asking the JVM for its perf map ({})",
                self.pid,
                crate::runtimes::jcmd::Job::PerfMap.describe(&j.program, self.pid)
            );
            for done in j.finish() {
                self.jcmd_done(done);
            }
        }
        self.symbolizer.name_jit_frames(&mut self.stacks);
        if let Some(failure) = self.jcmd_failure.take()
            && self.perf_maps_written == 0
        {
            self.warnings.push(failure);
        }
        if self.perf_maps_written > 0 {
            let unnamed = self.stacks.iter().flat_map(|s| s.frames.iter().skip(1)).filter(|f| unnamed_jit(f)).count();
            self.warnings.push(format!(
                "Java frames named from the JVM's perf map, written {} time(s) during the recording with `jcmd PID \
                 Compiler.perfmap` (--jvm-perf-map): a frame takes the name of the code at its address when the map \
                 was written{}",
                self.perf_maps_written,
                if unnamed > 0 {
                    format!("; {unnamed} frame(s) stayed unnamed (code freed before the map was written)")
                } else {
                    String::new()
                }
            ));
        }
    }

    /// A jcmd command ended.
    fn jcmd_done(&mut self, done: crate::runtimes::jcmd::Done) {
        use crate::runtimes::{jcmd, jvm};
        match (done.job, done.result) {
            (jcmd::Job::Flags, Ok(out)) => match jcmd::preserve_frame_pointer(&out) {
                Some(on) => {
                    self.warnings.extend(jvm::frame_pointer_note(on, "jcmd VM.flags: PreserveFramePointer = false"))
                }
                None => self.warnings.extend(jvm::frame_pointer_note_from_args(self.pid)),
            },
            (jcmd::Job::PerfMap, Ok(_)) => {
                self.perf_maps_written += 1;
                self.symbolizer.name_jit_frames(&mut self.stacks);
            }
            // Run by holds/jvm.rs with its own Jcmd, never by this one.
            (jcmd::Job::ClassHistogram | jcmd::Job::HeapDump, Ok(_)) => {}
            (job, Err(why)) => {
                if self.jcmd_failure.is_none() {
                    self.jcmd_failure_noted = true;
                    let program = self.jcmd.as_ref().map(|j| j.program.clone()).unwrap_or_default();
                    self.jcmd_failure = Some(format!(
                        "--jvm-perf-map: `{}` failed ({why}): Java frames stay unnamed (a JVM in another container may \
                         need jcmd run inside it: `jcmd 1 Compiler.perfmap` there, during the recording)",
                        job.describe(&program, self.pid)
                    ));
                }
                if job == jcmd::Job::Flags {
                    self.warnings.extend(jvm::frame_pointer_note_from_args(self.pid));
                }
            }
        }
    }

    /// When the target runs CPython: have the kernel read its Python frames at allocations
    /// (once per program image); a note says why not when they cannot be read.
    pub(in crate::record) fn python_frames(&mut self, tracer: &mut Tracer, objects: &[MappedObject]) {
        if !self.python_frames_on
            || self.python_tried
            || self.runtime.as_ref().is_none_or(|r| r.name != crate::recording::Runtime::Python)
            // Held at an exec: libpython may be among the libraries not mapped yet; the next
            // rescan, once it runs, finds the interpreter.
            || procinfo::stopped(self.pid)
        {
            return;
        }
        self.python_tried = true;
        match crate::pyframes::locate(self.pid, objects) {
            Ok((interp, target)) => match tracer.add_python_target(self.pid, target) {
                Ok(()) => {
                    let (major, minor) = interp.layout.version;
                    let source = match interp.source {
                        crate::pyframes::Source::DebugOffsets => " (offsets from its _Py_DebugOffsets)",
                        crate::pyframes::Source::Table => "",
                    };
                    // Which thread's frames an allocation gets (leaktrace-ebpf/src/python.rs).
                    let whose = if tracer.python_threads_by_fsbase() {
                        "the allocating thread's own, with or without the GIL"
                    } else if (major, minor) >= (3, 11) {
                        "the allocating thread's own, found by its native_thread_id (the kernel's BTF gives no \
                         task fsbase): none in a pid namespace other than the host's"
                    } else {
                        "the GIL holder's, whichever thread allocates (the kernel's BTF gives no task fsbase to tell \
                         threads apart)"
                    };
                    self.warnings.push(format!(
                        "Python frames (function, file, line) read from CPython {major}.{minor}'s frame chain{source} at \
                         each allocation ({whose}), in place of the eval loop's frames"
                    ));
                    self.python = Some(interp);
                }
                Err(e) => self.python_frames_failed(format!("Python frames are not read: {e:#}")),
            },
            Err(why) => self.python_frames_failed(why),
        }
    }

    /// Python frames were wanted (`--python-frames on`, or auto) and cannot be read: one line on
    /// stderr now (the user learns it while recording, not only from the report), and the same
    /// sentence in the report's caveats.
    fn python_frames_failed(&mut self, why: String) {
        crate::note!("leaktrace: PID {}: {why}", self.pid);
        self.warnings.push(why);
    }

    /// When JIT frames (code outside any mapped file) stayed unnamed in a runtime that can write
    /// a perf map, what to run it with so they are named.
    pub(in crate::record) fn jit_note(&self) -> Option<String> {
        let runtime = self.runtime.as_ref()?.name;
        let any_unnamed = self.stacks.iter().flat_map(|s| s.frames.iter().skip(1)).any(|f| unnamed_jit(f));
        if !any_unnamed || self.symbolizer.has_perf_map() || self.jcmd_failure_noted {
            return None;
        }
        match runtime {
            crate::recording::Runtime::Node => Some(
                "JIT frames (JavaScript) are unnamed: start node with --perf-basic-prof (or \
                 --perf-basic-prof-only-functions) so it writes /tmp/perf-PID.map, which leaktrace reads"
                    .to_string(),
            ),
            // Whether -XX:+PreserveFramePointer is on is said in a note of its own when the JVM is
            // found (runtimes::jvm::frame_pointer_note): not repeated here, where it was advice
            // even to a JVM started with the flag.
            crate::recording::Runtime::Jvm => Some(
                "JIT frames (Java) are unnamed: record with --jvm-perf-map (leaktrace then runs `jcmd PID \
                 Compiler.perfmap`, and the JVM writes /tmp/perf-PID.map, which leaktrace reads), or run that \
                 yourself during the recording"
                    .to_string(),
            ),
            _ => None,
        }
    }
}

/// A frame in code outside any mapped file (JIT code) that has no name yet.
fn unnamed_jit(f: &Frame) -> bool {
    f.object.is_none() && f.function.is_none()
}
