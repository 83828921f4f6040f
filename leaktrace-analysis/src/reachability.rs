//! Reachability of the traced live blocks at the end of a recording (`record --reachability`):
//! which blocks nothing points at any more ("lost") and, for those still pointed at, the chain
//! of pointers from a root that keeps a representative block alive. Made by the recorder's
//! conservative scan (`leaktrace/src/reach/`, described in `docs/reachability.md`), stored in
//! recording.json, rendered by `report/reach.rs`. Only addresses, sizes, offsets and symbols are
//! kept: never memory contents.

use serde::{Deserialize, Serialize};

use crate::retain::{RetainPath, RetainStep, Root, RootKind};

/// One reachability scan of one process.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Reachability {
    /// When the scan ran, seconds since the first checkpoint.
    pub t_s: f64,
    /// How long the target's threads were stopped, milliseconds (from the first thread stopped
    /// to the last one resumed; includes reading the block list from the kernel).
    pub pause_ms: f64,
    /// Threads stopped (each one's registers and stack are roots).
    pub threads: u32,
    /// False when the scan stopped early (the pause cap, `--reachability-max-pause`): blocks not
    /// reached by then count as unreachable, so "lost" figures are not conclusive.
    pub complete: bool,
    /// Why the scan is incomplete, or other notes (one line each).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
    /// Traced live blocks at the scan (from the kernel's ALLOCS map, this process only).
    pub blocks: u64,
    /// Their bytes (requested sizes).
    pub block_bytes: u64,
    /// Bytes of roots scanned: thread stacks (stack pointer − 128 up to the stack's end),
    /// registers, and the writable data of mapped objects (.data, .bss, relro).
    pub root_bytes_scanned: u64,
    /// Bytes of memory scanned as roots that is heap but no traced block: the brk heap and
    /// anonymous writable mappings (arenas, blocks allocated before attach, runtime heaps),
    /// minus traced blocks.
    pub untraced_bytes_scanned: u64,
    /// Bytes of reached (marked) traced blocks scanned for further pointers.
    pub block_bytes_scanned: u64,
    /// Per site (stack), sites with at least one live block at the scan, by stack id.
    pub sites: Vec<SiteReach>,
}

/// Reachability of one site's live blocks.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct SiteReach {
    /// The site: `Stack::id` in the recording.
    pub stack: u32,
    /// Bytes of this site's blocks that some scanned word points into (start or interior).
    pub reachable_bytes: u64,
    /// Those blocks.
    pub reachable_blocks: u64,
    /// Bytes of this site's blocks nothing scanned points at ("lost": a forgotten free).
    pub unreachable_bytes: u64,
    /// Those blocks.
    pub unreachable_blocks: u64,
    /// For a site with reachable blocks: the holders of one representative block (the one with
    /// the shortest chain), root first; the last link points at the block itself.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub retained_by: Vec<Link>,
}

/// One holder in a retaining chain.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Link {
    /// A global variable (writable data of a mapped object).
    Global {
        /// Symbol containing the pointer (None: no symbol covers it).
        symbol: Option<String>,
        /// Offset of the pointer in the symbol (or in the object's segment without a symbol).
        offset: u64,
        /// Path of the object as the target maps it.
        object: String,
    },
    /// A slot of a thread's stack.
    Stack {
        /// Thread id (host TID).
        thread: u32,
        /// Function whose frame holds the slot, when it can be told (best effort: the nearest
        /// return address below the slot, or the thread's instruction pointer).
        function: Option<String>,
    },
    /// A register of a stopped thread.
    Register {
        /// Thread id (host TID).
        thread: u32,
        /// Register name ("rax", ...).
        register: String,
    },
    /// Heap memory that is no traced block (allocated before attach, or the allocator's own).
    Untraced {
        /// The mapping: "[heap]" or "anonymous".
        region: String,
        /// Address of the pointer's word.
        addr: u64,
    },
    /// Links left out of a long chain (the root and the links nearest the block are kept).
    Elided {
        /// How many.
        links: u64,
    },
    /// A traced block.
    Block {
        /// The block's site (`Stack::id`).
        stack: u32,
        /// Culprit function of that site (for reading; the stack id is authoritative).
        site_function: Option<String>,
        /// Offset in the block of the word that points to the next link, bytes.
        offset: u64,
    },
}

impl Link {
    /// A short human label: `g_sessions (server)`, `registry_add's block (+16)`,
    /// `thread 1234's stack (in main)`, `register rax of thread 1234`, `untraced heap`.
    pub fn label(&self) -> String {
        match self {
            Link::Global { symbol, offset, object } => {
                let obj = object.rsplit('/').next().unwrap_or(object);
                match symbol {
                    Some(s) if *offset == 0 => format!("{s} ({obj})"),
                    Some(s) => format!("{s}+{offset} ({obj})"),
                    None => format!("writable data of {obj} (+{offset:#x})"),
                }
            }
            Link::Stack { thread, function } => match function {
                Some(f) => format!("thread {thread}'s stack (frame of {f})"),
                None => format!("thread {thread}'s stack"),
            },
            Link::Register { thread, register } => format!("register {register} of thread {thread}"),
            Link::Untraced { region, .. } => format!("untraced heap memory ({region})"),
            Link::Elided { links } => format!("… {links} more block(s) …"),
            Link::Block { stack, site_function, offset } => match site_function {
                Some(f) => format!("{f}'s block (+{offset})"),
                None => format!("site {stack}'s block (+{offset})"),
            },
        }
    }
}

impl Link {
    /// The link as a step of a [`RetainPath`]: a root for the scan's roots, a native block for
    /// a traced block on the way.
    pub fn step(&self) -> RetainStep {
        let root = |kind| Root::named(kind, self.label(), "native");
        match self {
            Link::Global { symbol, offset, object } => RetainStep::Root(Root {
                symbol: symbol.clone(),
                offset: Some(*offset),
                object: Some(object.clone()),
                ..root(RootKind::Global)
            }),
            Link::Stack { thread, function } => {
                RetainStep::Root(Root { thread: Some(*thread), function: function.clone(), ..root(RootKind::Stack) })
            }
            Link::Register { thread, register } => RetainStep::Root(Root {
                thread: Some(*thread),
                register: Some(register.clone()),
                ..root(RootKind::Register)
            }),
            Link::Untraced { region, addr } => {
                RetainStep::Root(Root { region: Some(region.clone()), addr: Some(*addr), ..root(RootKind::Untraced) })
            }
            Link::Elided { links } => RetainStep::Elided { steps: *links },
            Link::Block { stack, site_function, offset } => RetainStep::Native {
                stack: Some(*stack),
                allocated_by: site_function.clone(),
                bytes: None,
                offset: Some(*offset),
            },
        }
    }
}

impl SiteReach {
    /// What holds a representative block of the site, as a [`RetainPath`]: the chain's links,
    /// then the site's block itself (`site_function`: the site's culprit). Empty when no chain
    /// was kept (every block lost).
    pub fn retain_path(&self, site_function: Option<String>) -> RetainPath {
        if self.retained_by.is_empty() {
            return RetainPath::default();
        }
        let mut steps: Vec<RetainStep> = self.retained_by.iter().map(Link::step).collect();
        steps.push(RetainStep::Native {
            stack: Some(self.stack),
            allocated_by: site_function,
            bytes: None,
            offset: None,
        });
        RetainPath(steps)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chain_reads_root_first() {
        let links = vec![
            Link::Global { symbol: Some("g_sessions".into()), offset: 0, object: "/srv/server".into() },
            Link::Block { stack: 3, site_function: Some("registry_add".into()), offset: 16 },
        ];
        assert_eq!(links[1].label(), "registry_add's block (+16)");
        let j = serde_json::to_value(&links[0]).unwrap();
        assert_eq!(j["kind"], "global");
        assert_eq!(j["symbol"], "g_sessions");
        let site = SiteReach { stack: 3, reachable_blocks: 1, retained_by: links, ..Default::default() };
        let p = serde_json::to_value(site.retain_path(Some("registry_add".into()))).unwrap();
        assert_eq!((p[0]["step"].as_str(), p[0]["kind"].as_str()), (Some("root"), Some("global")));
        assert_eq!((p[0]["symbol"].as_str(), p[0]["name"].as_str()), (Some("g_sessions"), Some("g_sessions (server)")));
        assert_eq!((p[1]["step"].as_str(), p[1]["offset"].as_u64()), (Some("native"), Some(16)));
        assert_eq!((p[2]["stack"].as_u64(), p[2]["offset"].as_u64()), (Some(3), None));
    }
}
