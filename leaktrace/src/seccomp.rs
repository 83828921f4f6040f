//! The uretprobe/seccomp hazard: on x86-64 kernels 6.11 to 6.13, a uretprobe
//! returns to the traced function through a new `uretprobe` system call made from the
//! kernel's `[uprobes]` trampoline. seccomp filters written before it existed (Docker's,
//! Kubernetes' RuntimeDefault, systemd's SystemCallFilter=, any allow-list) do not list it, so
//! the first traced return kills the process (SIGSYS) or fails it. Kernel 6.14 lets that call
//! through seccomp unfiltered ("seccomp: passthrough uretprobe systemcall without filtering");
//! some 6.12/6.13 stable releases have the fix too, which `--allow-seccomp-risk` is for.
//!
//! Before attaching, leaktrace reads the kernel release and the target's `Seccomp:` field of
//! /proc/PID/status and refuses the dangerous combination with a one-line error.

use anyhow::bail;

/// Kernel versions (major, minor) whose uretprobes return through the `uretprobe` syscall that
/// seccomp filters see: [6.11, 6.14).
pub const RISKY_FROM: (u32, u32) = (6, 11);
/// The first version that lets the `uretprobe` syscall through seccomp.
pub const FIXED_IN: (u32, u32) = (6, 14);

/// `(major, minor)` of a kernel release string such as "6.12.9-amd64" or "6.13.0-rc2"; None
/// when it does not start with two dot-separated numbers.
pub fn parse_release(release: &str) -> Option<(u32, u32)> {
    let mut it = release.trim().split(|c: char| !c.is_ascii_digit());
    let major = it.next()?.parse().ok()?;
    let minor = it.next()?.parse().ok()?;
    Some((major, minor))
}

/// Why tracing with return probes would endanger the target, or None when it is safe.
///
/// `arch` is the machine (`std::env::consts::ARCH`: "x86_64", "aarch64", ...), `release` the
/// kernel release (/proc/sys/kernel/osrelease), `seccomp` the target's `Seccomp:` mode from
/// /proc/PID/status (0 none, 1 strict, 2 filter; None when unknown). Only x86-64 has the
/// `uretprobe` syscall; strict mode (1) allows only read/write/exit/sigreturn and is left
/// alone here as no allocator-tracing target runs under it. An unparsable release is treated
/// as safe (it names no risky version).
pub fn uretprobe_risk(arch: &str, release: &str, seccomp: Option<u32>) -> Option<String> {
    if arch != "x86_64" || seccomp != Some(2) {
        return None;
    }
    let v = parse_release(release)?;
    if v < RISKY_FROM || v >= FIXED_IN {
        return None;
    }
    Some(format!(
        "kernel {} on x86-64 returns from uretprobes through the `uretprobe` syscall, which seccomp filters of \
         kernels {}.{}–{}.{} block: the target would be killed at its first traced return",
        release.trim(),
        RISKY_FROM.0,
        RISKY_FROM.1,
        FIXED_IN.0,
        FIXED_IN.1 - 1
    ))
}

/// The `Seccomp:` mode of `pid` (0 none, 1 strict, 2 filter); None when /proc does not say.
pub fn seccomp_mode(pid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find_map(|l| l.strip_prefix("Seccomp:")).and_then(|v| v.trim().parse().ok())
}

/// Refuse to place return probes in `pid` when this kernel would kill it for them (see the
/// module docs). `allow` (`--allow-seccomp-risk`) turns the refusal into a warning on stderr.
/// Errors: one line naming the PID, its seccomp mode, the kernel and the way out.
pub fn check_target(pid: u32, allow: bool) -> anyhow::Result<()> {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let Some(why) = uretprobe_risk(std::env::consts::ARCH, &release, seccomp_mode(pid)) else { return Ok(()) };
    if allow {
        crate::note!(
            "leaktrace: warning: PID {pid} runs under a seccomp filter and {why} (--allow-seccomp-risk given)"
        );
        return Ok(());
    }
    bail!(
        "PID {pid} runs under a seccomp filter (Seccomp: 2) and {why}; not attaching (use --mode growth, which \
         places no return probes, or --allow-seccomp-risk if this kernel has the seccomp uretprobe passthrough fix)"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn releases_parse() {
        assert_eq!(parse_release("6.12.9-amd64"), Some((6, 12)));
        assert_eq!(parse_release("6.13.0-rc2\n"), Some((6, 13)));
        assert_eq!(parse_release("6.18"), Some((6, 18)));
        assert_eq!(parse_release("5.15.0-105-generic"), Some((5, 15)));
        assert_eq!(parse_release("weird"), None);
        assert_eq!(parse_release("6"), None);
    }

    #[test]
    fn only_x86_64_kernels_6_11_to_6_13_with_a_filter_are_refused() {
        for risky in ["6.11.0", "6.11.10-200.fc40.x86_64", "6.12.9-amd64", "6.13.0-rc2", "6.13.12"] {
            let why = uretprobe_risk("x86_64", risky, Some(2))
                .unwrap_or_else(|| panic!("{risky} with a seccomp filter should be refused"));
            assert!(why.contains("uretprobe") && why.contains(risky), "{why}");
        }
        for safe in ["6.10.14", "6.14.0", "6.18.1-amd64", "5.15.0-105-generic", "7.0.0", "nonsense"] {
            assert_eq!(
                uretprobe_risk("x86_64", safe, Some(2)),
                None,
                "{safe} has no uretprobe syscall in seccomp's way"
            );
        }
        // No filter, strict mode, or an unknown mode: nothing to refuse.
        for mode in [Some(0), Some(1), None] {
            assert_eq!(uretprobe_risk("x86_64", "6.12.9", mode), None, "mode {mode:?}");
        }
        // The syscall exists on x86-64 only.
        assert_eq!(uretprobe_risk("aarch64", "6.12.9", Some(2)), None);
    }

    #[test]
    fn own_seccomp_mode_is_read() {
        // 0 outside containers; 2 inside a container with a seccomp profile.
        assert!(matches!(seccomp_mode(std::process::id()), Some(0..=2)));
        assert_eq!(seccomp_mode(u32::MAX), None);
    }
}
