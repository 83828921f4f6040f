//! The JVM's class histogram (`jcmd PID GC.class_histogram`) at the start and at the end of a
//! recording (`--heap-census`). Run with the same jcmd and the same safety rules as
//! `--jvm-perf-map` (`runtimes/jvm/jcmd.rs`): the target JDK's jcmd when it is the same file in the
//! target's mount namespace, nothing sent before the JVM is attachable (its attach listener is up
//! or it catches SIGQUIT), in the background during the recording, killed after
//! [`jcmd::TIMEOUT`], through the target's own /tmp with its namespace PID.
//!
//! Each histogram forces a full GC: the JVM stops for it (a stop-the-world collection and a heap
//! walk; jcmd's whole run, stated in the report as `took_s`, bounds it). That is why the census
//! is opt-in.

use std::path::{Path, PathBuf};
use std::time::Instant;

use leaktrace_analysis::holds::{Census, ClassCount, ClassHistogram, MAX_CLASSES, Taken};

use crate::runtimes::jvm::jcmd::{self, Jcmd, Job, Started};

/// Where the census of one JVM is.
enum Phase {
    /// The first histogram is not started yet (the JVM is not attachable yet).
    Waiting,
    /// The first histogram runs since this moment (seconds since the recording's start).
    Start(f64),
    /// The first histogram ended (taken or failed).
    Started,
}

/// The class histograms of one JVM.
pub struct JvmCensus {
    pub(super) pid: u32,
    pub(super) jcmd: Option<Jcmd>,
    phase: Phase,
    pub census: Census<ClassHistogram>,
}

impl JvmCensus {
    /// The census of JVM `pid`; the jcmd to run is found from its libjvm.so (as for
    /// `--jvm-perf-map`), else the reason is kept as the census' error.
    pub fn new(pid: u32) -> JvmCensus {
        let mut census = Census::default();
        let jcmd = match libjvm_of(pid) {
            Some(_) => Some(Jcmd::unqueued(pid)),
            None => {
                census.errors.push("no libjvm.so mapped (not HotSpot?): no class histogram".to_string());
                None
            }
        };
        JvmCensus { pid, jcmd, phase: Phase::Waiting, census }
    }

    /// At every poll: start the first histogram once the JVM is attachable, collect it when it
    /// ended. Never blocks. `t_s`: seconds since the recording's start; `units`: units of work so far.
    pub fn tick(&mut self, t_s: f64, units: Option<u64>) {
        let Some(j) = self.jcmd.as_mut() else { return };
        match self.phase {
            Phase::Waiting => match j.run(Job::ClassHistogram) {
                Started::Running => self.phase = Phase::Start(t_s),
                Started::NotNow => {}
                Started::Failed(d) => {
                    self.phase = Phase::Started;
                    self.failed(d.result.err());
                }
            },
            Phase::Start(t0) => {
                if let Some(done) = j.poll() {
                    self.phase = Phase::Started;
                    self.ended(done, Taken { t_s, took_s: t_s - t0, units_of_work: units }, true);
                }
            }
            Phase::Started => {}
        }
    }

    /// End of the recording: wait for the first histogram if it still runs, then take the last
    /// one (when the first was taken and the JVM still runs) and wait for it (at most
    /// [`jcmd::TIMEOUT`]). `now_s` gives the seconds since the recording's start.
    pub fn finish(&mut self, alive: bool, now_s: &dyn Fn() -> f64, units: Option<u64>) {
        let Some(j) = self.jcmd.as_mut() else { return };
        if let Phase::Start(t0) = self.phase
            && let Some(done) = j.wait()
        {
            let t = now_s();
            self.phase = Phase::Started;
            self.ended(done, Taken { t_s: t, took_s: t - t0, units_of_work: units }, true);
        }
        let Some(j) = self.jcmd.as_mut() else { return };
        if self.census.start.is_none() {
            if matches!(self.phase, Phase::Waiting) {
                self.failed(Some(jcmd::NOT_ATTACHABLE.to_string()));
            }
            return;
        }
        if !alive {
            self.census.errors.push("the JVM ended before the last histogram".to_string());
            return;
        }
        crate::note!(
            "leaktrace: PID {}: class histogram (a full GC): {}",
            self.pid,
            Job::ClassHistogram.describe(self.pid)
        );
        let t0 = now_s();
        let clock = Instant::now();
        match j.run(Job::ClassHistogram) {
            Started::Running => {
                if let Some(done) = j.wait() {
                    let taken = Taken { t_s: now_s(), took_s: clock.elapsed().as_secs_f64(), units_of_work: units };
                    self.ended(done, taken, false);
                }
            }
            Started::NotNow => self.failed(Some(format!("jcmd could not be run again at {t0:.1} s"))),
            Started::Failed(d) => self.failed(d.result.err()),
        }
    }

    fn ended(&mut self, done: jcmd::Done, taken: Taken, first: bool) {
        match done.result {
            Ok(out) => match parse_histogram(&out) {
                Some(mut h) => {
                    h.taken = taken;
                    if first {
                        self.census.start = Some(h);
                    } else {
                        self.census.end = Some(h);
                    }
                }
                None => self.failed(Some("jcmd GC.class_histogram printed no histogram".to_string())),
            },
            Err(why) => self.failed(Some(why)),
        }
    }

    fn failed(&mut self, why: Option<String>) {
        self.census.errors.push(format!(
            "`{}` failed: {}",
            Job::ClassHistogram.describe(self.pid),
            why.unwrap_or_else(|| "no reason given".into())
        ));
    }
}

/// The libjvm.so that `pid` maps (from /proc/PID/maps).
fn libjvm_of(pid: u32) -> Option<PathBuf> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
    maps.lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| p.ends_with("/libjvm.so"))
        .map(|p| Path::new(p).to_path_buf())
}

/// A JVM class name as Java spells it: `[B` → `byte[]`, `[[Ljava.lang.Object;` →
/// `java.lang.Object[][]`; other names unchanged.
pub fn java_name(descriptor: &str) -> String {
    let dims = descriptor.bytes().take_while(|&b| b == b'[').count();
    if dims == 0 {
        return descriptor.to_string();
    }
    let elem = &descriptor[dims..];
    let base = match elem {
        "B" => "byte",
        "C" => "char",
        "D" => "double",
        "F" => "float",
        "I" => "int",
        "J" => "long",
        "S" => "short",
        "Z" => "boolean",
        _ => elem.strip_prefix('L').and_then(|e| e.strip_suffix(';')).unwrap_or(elem),
    };
    format!("{base}{}", "[]".repeat(dims))
}

/// The output of `jcmd PID GC.class_histogram` (lines `   1:   5208   1234567  [B (java.base@17)`
/// and `Total   12345   1234567`): the [`MAX_CLASSES`] largest classes by bytes and the totals;
/// None without a `Total` line (not a histogram). `taken` is left at its default.
pub fn parse_histogram(out: &str) -> Option<ClassHistogram> {
    let mut h = ClassHistogram::default();
    let mut total = false;
    for line in out.lines() {
        let mut it = line.split_whitespace();
        let Some(first) = it.next() else { continue };
        if first == "Total" {
            h.total_instances = it.next()?.parse().ok()?;
            h.total_bytes = it.next()?.parse().ok()?;
            total = true;
            continue;
        }
        if !first.ends_with(':') || first[..first.len() - 1].parse::<u64>().is_err() {
            continue;
        }
        let (Some(Ok(instances)), Some(Ok(bytes)), Some(class)) =
            (it.next().map(str::parse::<u64>), it.next().map(str::parse::<u64>), it.next())
        else {
            continue;
        };
        h.classes.push(ClassCount { class: java_name(class), instances, bytes });
    }
    h.classes.sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.class.cmp(&b.class)));
    h.classes.truncate(MAX_CLASSES);
    total.then_some(h)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_jdk17_histogram_is_parsed() {
        let out = "12345:\n num     #instances         #bytes  class name (module)\n-------------------------------------------------------\n   1:         20512        2298648  [B (java.base@17.0.12)\n   2:         10011         240264  HoldsJvm$AuditRecord\n   3:           588         157728  [Ljava.lang.Object; (java.base@17.0.12)\n   4:             2             64  [[I (java.base@17.0.12)\nTotal         31113        2696704\n";
        let h = parse_histogram(out).expect("a histogram");
        assert_eq!(h.total_instances, 31113);
        assert_eq!(h.total_bytes, 2696704);
        let names: Vec<&str> = h.classes.iter().map(|c| c.class.as_str()).collect();
        assert_eq!(names, ["byte[]", "HoldsJvm$AuditRecord", "java.lang.Object[]", "int[][]"]);
        assert_eq!(h.classes[1].instances, 10011);
        assert_eq!(h.classes[1].bytes, 240264);
        assert!(parse_histogram("12345:\nCommand executed successfully\n").is_none());
    }
}
