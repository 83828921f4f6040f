//! Names of global variables: the ELF symbol (object or TLS-less data, from .symtab, else
//! .dynsym) that covers an address of an object's writable data. Files are read through
//! /proc/PID/root so a container's own files are used; each object is read once.

use std::collections::HashMap;

use object::{Object as _, ObjectKind, ObjectSymbol as _, SymbolKind};

/// One object's data symbols: whether it is position-independent (ET_DYN: addresses are
/// relative to its load bias), and (start vaddr, size, name) sorted by start.
type ObjectSymbols = (bool, Vec<(u64, u64, String)>);

/// Data symbols per object path (None: the file could not be read or parsed).
pub(super) struct Symbols {
    pid: u32,
    cache: HashMap<String, Option<ObjectSymbols>>,
}

impl Symbols {
    pub(super) fn new(pid: u32) -> Self {
        Symbols { pid, cache: HashMap::new() }
    }

    /// The symbol covering `addr` in `path` loaded at bias `base`, and the offset in it.
    pub(super) fn lookup(&mut self, path: &str, base: u64, addr: u64) -> Option<(String, u64)> {
        let pid = self.pid;
        let entry = self.cache.entry(path.to_string()).or_insert_with(|| load(pid, path));
        let (dynamic, syms) = entry.as_ref()?;
        let v = if *dynamic { addr.checked_sub(base)? } else { addr };
        let i = syms.partition_point(|s| s.0 <= v);
        let (start, size, name) = syms.get(i.checked_sub(1)?)?;
        (v < start + (*size).max(1)).then(|| (name.clone(), v - start))
    }
}

fn load(pid: u32, path: &str) -> Option<ObjectSymbols> {
    let data = std::fs::read(format!("/proc/{pid}/root{path}")).or_else(|_| std::fs::read(path)).ok()?;
    let file = object::File::parse(&*data).ok()?;
    let dynamic = file.kind() == ObjectKind::Dynamic;
    let mut syms: Vec<(u64, u64, String)> = file
        .symbols()
        .chain(file.dynamic_symbols())
        .filter(|s| s.kind() == SymbolKind::Data && s.address() != 0)
        .filter_map(|s| Some((s.address(), s.size(), s.name().ok()?.to_string())))
        .filter(|s| !s.2.is_empty())
        .collect();
    syms.sort();
    syms.dedup_by_key(|s| s.0);
    Some((dynamic, syms))
}
