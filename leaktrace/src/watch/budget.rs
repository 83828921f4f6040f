//! The agent's own CPU limit (`watch --max-cpu`): its CPU time (every thread: the windows, the
//! exact windows, the metrics endpoint) over the last minute, as a percentage of one core,
//! counted from after the eBPF programs are loaded (a one-off start-up cost: the verifier).
//! While it is above the limit, no escalation starts (a process due for one keeps its streak
//! and is escalated once the agent is back under the limit); growth-mode tracing goes on.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Over how long the agent's CPU use is averaged.
pub const SPAN: Duration = Duration::from_secs(60);

/// The shortest span judged (a shorter one is mostly the start's attach).
const MIN_SPAN: Duration = Duration::from_secs(5);

/// The agent's CPU time, sampled, against `--max-cpu`.
#[derive(Clone, Debug)]
pub struct CpuBudget {
    /// The limit, percent of one core.
    limit_pct: f64,
    /// (when, the agent's CPU time then in seconds), oldest first, the last [`SPAN`] and one
    /// before it.
    samples: VecDeque<(Instant, f64)>,
}

impl CpuBudget {
    /// A budget of `limit_pct` percent of one core.
    pub fn new(limit_pct: f64) -> CpuBudget {
        CpuBudget { limit_pct, samples: VecDeque::new() }
    }

    /// The limit, percent of one core.
    pub fn limit_pct(&self) -> f64 {
        self.limit_pct
    }

    /// Note the agent's CPU time `cpu_s` (seconds) at `now`; returns its use over the last
    /// minute (percent of one core) when that is above the limit, None when under it or when
    /// fewer than 5 s were sampled.
    pub fn check(&mut self, now: Instant, cpu_s: f64) -> Option<f64> {
        self.samples.push_back((now, cpu_s));
        while self.samples.len() > 2 && now.duration_since(self.samples[1].0) >= SPAN {
            self.samples.pop_front();
        }
        let &(t0, c0) = self.samples.front()?;
        let span = now.duration_since(t0);
        if span < MIN_SPAN {
            return None;
        }
        let pct = (cpu_s - c0).max(0.0) / span.as_secs_f64() * 100.0;
        (pct > self.limit_pct).then_some(pct)
    }
}

/// CPU time (user and system) of this process, every thread, seconds (getrusage; 0 if it
/// fails).
pub fn process_cpu_s() -> f64 {
    // SAFETY: rusage is plain integers (and timevals of integers): all zeros is a valid value.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage writes one rusage into `ru`, which outlives the call.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } != 0 {
        return 0.0;
    }
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn over_the_limit_only_over_a_sampled_span_and_by_the_last_minute() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut b = CpuBudget::new(5.0);
        // 3 s of CPU at the start (attaching): not judged before 5 s of samples.
        assert_eq!(b.check(at(0), 0.0), None);
        assert_eq!(b.check(at(4), 3.0), None, "4 s sampled only");
        // 3 s over 10 s: 30 %, above 5 %.
        let pct = b.check(at(10), 3.0).expect("over the limit");
        assert!((pct - 30.0).abs() < 1e-9, "{pct}");
        // Then 1 % for two minutes: the start leaves the last minute, the use is under again.
        for s in (15..=130).step_by(5) {
            let cpu = 3.0 + (s - 10) as f64 * 0.01;
            let r = b.check(at(s), cpu);
            if s >= 75 {
                assert_eq!(r, None, "at {s} s: {r:?}");
            }
        }
        // 6 % over the last minute is above 5 %.
        let base = 3.0 + 120.0 * 0.01;
        let mut r = None;
        for s in (135..=200).step_by(5) {
            r = b.check(at(s), base + (s - 130) as f64 * 0.06);
        }
        let pct = r.expect("over the limit again");
        assert!((pct - 6.0).abs() < 0.2, "{pct}");
    }

    #[test]
    fn the_process_cpu_time_grows() {
        let a = process_cpu_s();
        let mut x = 0u64;
        for i in 0..20_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        std::hint::black_box(x);
        assert!(process_cpu_s() > a, "no CPU time counted");
    }
}
