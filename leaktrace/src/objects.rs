//! One ELF object a target maps: what target discovery (`discover`) lists and the runtimes'
//! detection (`runtimes`) reads, in a module of its own so that each can use it without the
//! other (`discover` asks `runtimes::go` whether an object is a Go program).

use std::path::PathBuf;

/// One ELF object mapped by the target.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MappedObject {
    /// Path as the target sees it (from /proc/PID/maps).
    pub path: PathBuf,
    /// Device and inode from /proc/PID/maps.
    pub dev: (i32, i32),
    pub inode: u64,
    /// A path through which the agent can open this exact file (map_files or root).
    pub open_path: PathBuf,
    /// Whether the process maps any part of it executable (code: a frame can be in it). Data
    /// files (locale archives, a JVM's hsperfdata, caches) are mapped read-only or read-write.
    pub executable: bool,
}
