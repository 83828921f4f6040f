//! The kinds of [`MapEvent`] the kernel side sends through the `EVENTS` ring buffer, typed
//! (`#[repr(u32)]` with `TryFrom<u32>`, as aya-log-common types its wire kinds), and the
//! [`Event`] the agent decodes each one into: what `MapEvent::addr` means depends on the kind (an
//! address, a child's PID, an "is held" flag, anonymous RSS in KiB), and is read in one place,
//! [`Event::decode`].

use crate::MapEvent;

wire_enum! {
    /// Kind of a [`MapEvent`] (its `kind` field).
    #[repr(u32)]
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    pub enum MapEventKind else UnknownKind {
        /// An anonymous mmap: `addr`, `len`, `prot`, `flags`.
        Mmap = 1,
        /// munmap of [`addr`, `addr + len`).
        Munmap = 2,
        /// mremap of [`old_addr`, `old_addr + old_len`) to [`addr`, `addr + len`).
        Mremap = 3,
        /// brk: the program break is now `addr`.
        Brk = 4,
        /// A traced process (`tgid`) forked: `addr` is the new task's PID (a process, or a thread:
        /// the agent tells them apart).
        Fork = 5,
        /// A traced process (`tgid`) completed an `execve`: its image (executable, libraries,
        /// address space) is new from here on. `addr` 1: the kernel side stopped it (SIGSTOP,
        /// `exec_hold`) until the agent has probed the new image and sends SIGCONT.
        Exec = 6,
        /// A launched command (`tgid`) began its teardown: it called libc's `exit` or the
        /// interpreter's `Py_FinalizeEx` (the kernel side stopped it with SIGSTOP; the agent takes
        /// the teardown checkpoint and sends SIGCONT).
        Teardown = 7,
        /// The OOM killer chose a traced process (`tgid`) as its victim (oom:mark_victim): `addr`
        /// is its anonymous RSS then, KiB (the tracepoint's `anon_rss`).
        OomVictim = 8,
        /// A process that is not traced (or not yet in the kernel's filter) completed an `execve`,
        /// and its parent (`addr`) is a process of a launched tree whose children are followed
        /// (`exec_hold::CHILDREN`): the kernel side stopped it (SIGSTOP) before the new image's
        /// first instruction, until the agent has attached to it and sends SIGCONT.
        ChildExec = 9,
        /// A new process (`tgid`) of a traced parent (`addr`) whose children are held at their
        /// fork (--follow-forks, the kernel side's `FORK_HOLD`): the kernel side stopped it
        /// (SIGSTOP) as its fork returned to it, before its first instruction, until the agent has
        /// attached to it and sends SIGCONT.
        ForkHeld = 10,
    }
}

/// The kinds of [`MapEvent`] as `u32` (the discriminants of [`MapEventKind`]), for the kernel
/// side.
pub mod map_event {
    use super::MapEventKind;

    /// [`MapEventKind::Mmap`].
    pub const MMAP: u32 = MapEventKind::Mmap as u32;
    /// [`MapEventKind::Munmap`].
    pub const MUNMAP: u32 = MapEventKind::Munmap as u32;
    /// [`MapEventKind::Mremap`].
    pub const MREMAP: u32 = MapEventKind::Mremap as u32;
    /// [`MapEventKind::Brk`].
    pub const BRK: u32 = MapEventKind::Brk as u32;
    /// [`MapEventKind::Fork`].
    pub const FORK: u32 = MapEventKind::Fork as u32;
    /// [`MapEventKind::Exec`].
    pub const EXEC: u32 = MapEventKind::Exec as u32;
    /// [`MapEventKind::Teardown`].
    pub const TEARDOWN: u32 = MapEventKind::Teardown as u32;
    /// [`MapEventKind::OomVictim`].
    pub const OOM_VICTIM: u32 = MapEventKind::OomVictim as u32;
    /// [`MapEventKind::ChildExec`].
    pub const CHILD_EXEC: u32 = MapEventKind::ChildExec as u32;
    /// [`MapEventKind::ForkHeld`].
    pub const FORK_HELD: u32 = MapEventKind::ForkHeld as u32;
}

/// A `kind` that is no [`MapEventKind`] (the value itself).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UnknownKind(pub u32);

/// One kernel event of process `MapEvent::tgid`, decoded: each kind with what its fields mean.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// An mmap, munmap, mremap or brk (the kind says which): applied as is to the process's
    /// address space, which reads `addr`, `len`, `old_addr`, `old_len`, `owner` and `site`.
    Mapping(MapEventKind),
    /// The process forked `child` (a process or a thread: the agent tells them apart).
    Fork {
        /// The new task's PID.
        child: u32,
    },
    /// The process completed an `execve`.
    Exec {
        /// The kernel side stopped it (SIGSTOP) until the agent has probed the new image.
        held: bool,
    },
    /// The process began its teardown (libc `exit`, `Py_FinalizeEx`); the kernel side stopped
    /// it.
    Teardown,
    /// The OOM killer chose the process as its victim.
    OomVictim {
        /// Its anonymous RSS then, KiB (the tracepoint's `anon_rss`).
        anon_kib: u64,
    },
    /// An untraced child of a followed launched tree completed an `execve`; the kernel side
    /// stopped it.
    ChildExec {
        /// The child's parent, a traced process.
        parent: u32,
    },
    /// A new process of a traced parent whose children are held at their fork
    /// (--follow-forks); the kernel side stopped it as its fork returned to it.
    ForkHeld {
        /// The new process's parent, a traced process.
        parent: u32,
    },
}

impl Event {
    /// Decode `ev` by its kind. Err: a kind the kernel side never sends.
    pub fn decode(ev: &MapEvent) -> Result<Event, UnknownKind> {
        use MapEventKind::*;
        Ok(match MapEventKind::try_from(ev.kind)? {
            k @ (Mmap | Munmap | Mremap | Brk) => Event::Mapping(k),
            Fork => Event::Fork { child: ev.addr as u32 },
            Exec => Event::Exec { held: ev.addr == 1 },
            Teardown => Event::Teardown,
            OomVictim => Event::OomVictim { anon_kib: ev.addr },
            ChildExec => Event::ChildExec { parent: ev.addr as u32 },
            ForkHeld => Event::ForkHeld { parent: ev.addr as u32 },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_round_trip_and_decode_their_addr() {
        for v in 1..=10 {
            assert_eq!(MapEventKind::try_from(v).map(|k| k as u32), Ok(v));
        }
        assert_eq!(MapEventKind::try_from(0), Err(UnknownKind(0)));
        assert_eq!(MapEventKind::try_from(11), Err(UnknownKind(11)));
        let ev = |kind, addr| MapEvent { kind, tgid: 7, addr, ..Default::default() };
        assert_eq!(Event::decode(&ev(map_event::FORK, 42)), Ok(Event::Fork { child: 42 }));
        assert_eq!(Event::decode(&ev(map_event::EXEC, 1)), Ok(Event::Exec { held: true }));
        assert_eq!(Event::decode(&ev(map_event::EXEC, 0)), Ok(Event::Exec { held: false }));
        assert_eq!(Event::decode(&ev(map_event::OOM_VICTIM, 5120)), Ok(Event::OomVictim { anon_kib: 5120 }));
        assert_eq!(Event::decode(&ev(map_event::CHILD_EXEC, 3)), Ok(Event::ChildExec { parent: 3 }));
        assert_eq!(Event::decode(&ev(map_event::TEARDOWN, 0)), Ok(Event::Teardown));
        assert_eq!(Event::decode(&ev(map_event::BRK, 0x1000)), Ok(Event::Mapping(MapEventKind::Brk)));
        assert_eq!(Event::decode(&ev(99, 0)), Err(UnknownKind(99)));
    }
}
