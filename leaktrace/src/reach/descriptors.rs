//! The thread descriptors (glibc's `struct pthread`) of exited threads, kept with their
//! stacks in glibc's stack cache, are roots: they point at the threads' DTVs, which glibc
//! reuses with the stack. Two of their words are not: the thread's argument (`arg`, what
//! `pthread_create` passed: nothing reads it once the thread has run) and, once the thread was
//! joined or detached, its return value (`result`: `pthread_join` handed it over, or nobody
//! can; glibc marks a joined thread by `tid` = −1 and a detached one by `joinid` = itself). Kept, they would hold the argument a thread forgot to free and the result its joiner
//! dropped, which valgrind memcheck and LeakSanitizer call lost (LSan's `create_thread_leak`).
//! A joinable thread's result that no `pthread_join` has collected yet stays a root.
//!
//! The offsets come from libc's own description of `struct pthread` for libthread_db: the
//! exported `_thread_db_pthread_*` symbols (3 × u32 each: bits, count, offset), present in
//! every glibc (stripped or not). `tid` is described; `result` and `joinid` are the two
//! pointers right before `schedparam`, `arg` the pointer right after `start_routine` (glibc's
//! layout since 2.3); the layout is checked against the symbols and nothing is cut when it does
//! not match.

use super::roots::{Region, RootKind};

/// Offsets in `struct pthread` of the words that decide what is cut.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct PthreadFields {
    tid: u64,
    joinid: u64,
    result: u64,
    arg: u64,
}

/// The largest offset believed: `struct pthread` is about 2.3 KiB on x86-64.
const MAX_OFFSET: u32 = 8 << 10;

/// The fields from `_thread_db_pthread_{tid,schedparam_sched_priority,schedpolicy,start_routine}`
/// (each read through `read`, 12 bytes at the symbol's address), checked against glibc's
/// layout: `joinid`, `result` (8 bytes each), `schedparam` (4), `schedpolicy` (4),
/// `start_routine` (8), `arg` (8).
pub(super) fn from_descriptions(read: &dyn Fn(&str) -> Option<[u32; 3]>) -> Option<PthreadFields> {
    let tid = read("_thread_db_pthread_tid")?;
    let prio = read("_thread_db_pthread_schedparam_sched_priority")?;
    let policy = read("_thread_db_pthread_schedpolicy")?;
    let start = read("_thread_db_pthread_start_routine")?;
    let ok = tid[0] == 32
        && tid[1] == 1
        && tid[2] % 4 == 0
        && tid[2] + 4 <= MAX_OFFSET
        && prio[0] == 32
        && policy[0] == 32
        && start[0] == 64
        && [prio[1], policy[1], start[1]] == [1, 1, 1]
        && prio[2] >= 16
        && prio[2] % 8 == 0
        && policy[2] == prio[2] + 4
        && start[2] == policy[2] + 4
        && start[2] + 16 <= MAX_OFFSET;
    ok.then(|| PthreadFields {
        tid: u64::from(tid[2]),
        joinid: u64::from(prio[2] - 16),
        result: u64::from(prio[2] - 8),
        arg: u64::from(start[2] + 8),
    })
}

/// The fields of the libc at `path` (loaded at bias `base`) of process `pid` (its memory
/// through the task `mm`); None for a libc without the descriptions or with another layout.
pub(super) fn pthread_fields(pid: u32, mm: u32, path: &str, base: u64) -> Option<PthreadFields> {
    const NAMES: [&str; 4] = [
        "_thread_db_pthread_tid",
        "_thread_db_pthread_schedparam_sched_priority",
        "_thread_db_pthread_schedpolicy",
        "_thread_db_pthread_start_routine",
    ];
    let addrs = super::symbols::data_addresses(pid, path, base, &NAMES);
    let read = |name: &str| -> Option<[u32; 3]> {
        let addr = addrs[NAMES.iter().position(|n| *n == name)?]?;
        let mut b = [0u8; 12];
        (super::read_remote(mm, &mut b, &[(addr, 12)]) == 12).then(|| {
            let w = |i: usize| u32::from_ne_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
            [w(0), w(4), w(8)]
        })
    };
    from_descriptions(&read)
}

/// The root regions of the descriptor [start, end) of a cached thread stack, whose bytes
/// `bytes` start at `bytes_at`: the whole descriptor minus `arg`, and minus `result` when the
/// thread was joined (`tid` −1) or detached (`joinid` the descriptor itself). Without the
/// fields: the whole descriptor.
pub(super) fn roots(start: u64, end: u64, bytes: &[u8], bytes_at: u64, fields: Option<PthreadFields>) -> Vec<Region> {
    let kind = RootKind::Untraced { region: "thread descriptor (glibc stack cache)" };
    let whole = vec![Region { start, end, kind }];
    let Some(f) = fields else { return whole };
    let bytes_of = |off: u64, n: usize| -> Option<&[u8]> {
        let i = usize::try_from(start.checked_add(off)?.checked_sub(bytes_at)?).ok()?;
        bytes.get(i..i.checked_add(n)?)
    };
    let joinid = bytes_of(f.joinid, 8).and_then(|b| b.try_into().ok()).map(u64::from_ne_bytes);
    let tid = bytes_of(f.tid, 4).and_then(|b| b.try_into().ok()).map(i32::from_ne_bytes);
    let (Some(joinid), Some(tid), true) = (joinid, tid, start.saturating_add(f.arg) + 8 <= end) else {
        return whole;
    };
    let mut holes = vec![(start + f.arg, start + f.arg + 8)];
    if tid == -1 || joinid == start {
        holes.push((start + f.result, start + f.result + 8));
    }
    super::allocator::subtract(whole, &holes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn glibc_236(name: &str) -> Option<[u32; 3]> {
        match name {
            "_thread_db_pthread_tid" => Some([32, 1, 720]),
            "_thread_db_pthread_schedparam_sched_priority" => Some([32, 1, 1584]),
            "_thread_db_pthread_schedpolicy" => Some([32, 1, 1588]),
            "_thread_db_pthread_start_routine" => Some([64, 1, 1592]),
            _ => None,
        }
    }

    /// glibc 2.36's descriptions (x86-64): tid 720, joinid 1568, result 1576, arg 1600.
    #[test]
    fn fields_from_glibc_descriptions() {
        let f = from_descriptions(&glibc_236).expect("fields");
        assert_eq!(f, PthreadFields { tid: 720, joinid: 1568, result: 1576, arg: 1600 });
        // Another layout: nothing is cut.
        let moved = |n: &str| if n.ends_with("start_routine") { Some([64, 1, 1600]) } else { glibc_236(n) };
        assert_eq!(from_descriptions(&moved), None);
        assert_eq!(from_descriptions(&|_| None), None);
    }

    /// `arg` is always cut; `result` once joined (tid −1) or detached (joinid = itself), kept
    /// while a join may still collect it.
    #[test]
    fn arg_and_collected_result_cut() {
        let f = from_descriptions(&glibc_236);
        let (pd, end) = (0x10_0000u64, 0x10_0000 + 2304);
        let mut bytes = vec![0u8; 2304];
        let spans = |r: &[Region]| r.iter().map(|r| (r.start - pd, r.end - pd)).collect::<Vec<_>>();
        // Not joined yet: only arg.
        assert_eq!(spans(&roots(pd, end, &bytes, pd, f)), vec![(0, 1600), (1608, 2304)]);
        let both = vec![(0, 1576), (1584, 1600), (1608, 2304)];
        // Joined: glibc sets tid to -1.
        bytes[720..724].copy_from_slice(&(-1i32).to_ne_bytes());
        assert_eq!(spans(&roots(pd, end, &bytes, pd, f)), both);
        // Detached: joinid is the descriptor itself.
        bytes[720..724].copy_from_slice(&0i32.to_ne_bytes());
        bytes[1568..1576].copy_from_slice(&pd.to_ne_bytes());
        assert_eq!(spans(&roots(pd, end, &bytes, pd, f)), both);
        // Bytes that do not cover joinid, or no fields: the whole descriptor.
        assert_eq!(spans(&roots(pd, end, &bytes[..100], pd, f)), vec![(0, 2304)]);
        assert_eq!(spans(&roots(pd, end, &bytes, pd, None)), vec![(0, 2304)]);
    }
}
