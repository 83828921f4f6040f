//! Names of global variables: the ELF symbol (object or TLS-less data, from .symtab, else
//! .dynsym) that covers an address of an object's writable data. Files are read inside the
//! target's root ([`crate::target_fs`]) so a container's own files are used, and never the host
//! file of the same name; each object is read once. A stripped
//! object's local symbols (libc's `main_arena`, `_IO_stdfile_1_lock`) come from its detached
//! debug file when one is installed (e.g. libc6-dbg): /usr/lib/debug/.build-id/xx/yyyy.debug,
//! found by the object's build ID.

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

    /// The data symbol `name` of `path` loaded at bias `base`: (absolute address, size).
    pub(super) fn find(&mut self, path: &str, base: u64, name: &str) -> Option<(u64, u64)> {
        let pid = self.pid;
        let entry = self.cache.entry(path.to_string()).or_insert_with(|| load(pid, path));
        let (dynamic, syms) = entry.as_ref()?;
        let (start, size, _) = syms.iter().find(|s| s.2 == name)?;
        Some((if *dynamic { base + start } else { *start }, *size))
    }
}

/// The address of the function `name` in the object `path` loaded at bias `base` (its symbol
/// tables, .symtab or .dynsym: libc's `exit` is exported); None when it is not there.
pub(super) fn function_address(pid: u32, path: &str, base: u64, name: &str) -> Option<u64> {
    let data = read_object(pid, path)?;
    let file = object::File::parse(&*data).ok()?;
    let dynamic = file.kind() == ObjectKind::Dynamic;
    let sym = file
        .dynamic_symbols()
        .chain(file.symbols())
        .find(|s| s.kind() == SymbolKind::Text && s.address() != 0 && s.name() == Ok(name))?;
    Some(if dynamic { base + sym.address() } else { sym.address() })
}

/// The addresses of the data objects `names` in the object `path` loaded at bias `base` (its
/// symbol tables, each name looked up on its own: objects with equal contents may share an
/// address); None for a name that is not there.
pub(super) fn data_addresses(pid: u32, path: &str, base: u64, names: &[&str]) -> Vec<Option<u64>> {
    let Some(data) = read_object(pid, path) else { return vec![None; names.len()] };
    let Ok(file) = object::File::parse(&*data) else { return vec![None; names.len()] };
    let dynamic = file.kind() == ObjectKind::Dynamic;
    let syms = data_symbols(&file);
    names.iter().map(|n| syms.iter().find(|s| s.2 == *n).map(|s| if dynamic { base + s.0 } else { s.0 })).collect()
}

/// The bytes of the detached debug file of the object `data` (by its build ID), read through
/// the target's root; None when it has no build ID or no such file is installed.
fn debug_file(pid: u32, file: &object::File<'_>) -> Option<Vec<u8>> {
    let id = file.build_id().ok()??;
    let (first, rest) = id.split_first()?;
    let hex: String = rest.iter().map(|b| format!("{b:02x}")).collect();
    let rel = format!("/usr/lib/debug/.build-id/{first:02x}/{hex}.debug");
    read_object(pid, &rel)
}

/// The bytes of the file holding `path`'s DWARF: its detached debug file (by build ID) when one
/// is installed in the target's root, else the object itself when it has `.debug_info`; None
/// when neither has it.
pub(super) fn dwarf_of(pid: u32, path: &str) -> Option<Vec<u8>> {
    let data = read_object(pid, path)?;
    let file = object::File::parse(&*data).ok()?;
    if let Some(dbg) = debug_file(pid, &file) {
        return Some(dbg);
    }
    file.section_by_name(".debug_info").is_some().then_some(data)
}

/// An object file of process `pid`, read inside its root (never the host file of the same
/// name): links resolve in the target's root, regular files only, at most 1 GiB.
fn read_object(pid: u32, path: &str) -> Option<Vec<u8>> {
    use crate::target_fs::{Links, caps, read};
    read(pid, std::path::Path::new(path), Links::InRoot, caps::ELF).ok()
}

/// Data symbols (start, size, name) of an ELF object's symbol tables.
fn data_symbols(file: &object::File<'_>) -> Vec<(u64, u64, String)> {
    file.symbols()
        .chain(file.dynamic_symbols())
        .filter(|s| s.kind() == SymbolKind::Data && s.address() != 0)
        .filter_map(|s| Some((s.address(), s.size(), s.name().ok()?.to_string())))
        .filter(|s| !s.2.is_empty())
        .collect()
}

fn load(pid: u32, path: &str) -> Option<ObjectSymbols> {
    let data = read_object(pid, path)?;
    let file = object::File::parse(&*data).ok()?;
    let dynamic = file.kind() == ObjectKind::Dynamic;
    let mut syms = data_symbols(&file);
    // A stripped object (no .symtab): its debug file's symbols, same addresses.
    if file.section_by_name(".symtab").is_none()
        && let Some(dbg) = debug_file(pid, &file)
        && let Ok(d) = object::File::parse(&*dbg)
    {
        syms.extend(data_symbols(&d));
    }
    syms.sort();
    syms.dedup_by_key(|s| s.0);
    Some((dynamic, syms))
}
