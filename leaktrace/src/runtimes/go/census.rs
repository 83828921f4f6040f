//! Go's goroutines read from outside (`--heap-census`): the runtime's `allgs` slice, each `g`'s
//! status (`atomicstatus`), wait reason (`waitreason`, named from the runtime's own
//! `waitReasonStrings`), start function (`startpc`, symbolized from the executable's symbol
//! table) and stack (`stack.lo`..`stack.hi`), at the start and at the end of a recording.
//!
//! The layout of `runtime.g` comes from the executable's DWARF (Go 1.19 compresses it: zlib
//! `SHF_COMPRESSED` sections), the addresses from its symbol table: a binary built with
//! `-ldflags=-s -w` has neither, and the census says so. The process is not stopped: the reads
//! (through /proc/PID/mem) race with the scheduler, so a goroutine changing state meanwhile is
//! counted in either state; the counts are exact otherwise.

use std::collections::HashMap;
use std::os::unix::fs::FileExt as _;
use std::time::Instant;

pub(crate) use super::dwarf::{Layout, load_bias, structs};
use leaktrace_analysis::holds::{Census, GoHeapSite, GoroutineGroup, Goroutines, Taken};
use object::{Object as _, ObjectSymbol as _};

/// Goroutines read at most (the rest are left out and the census says so).
pub const MAX_GOROUTINES: usize = 1_000_000;
/// Largest offset of a `runtime.g` field believed from the DWARF (the structure is about 400 B).
const MAX_FIELD_OFFSET: u64 = 4096;
/// Wait reasons read at most (Go 1.19–1.23 have about 40).
const MAX_WAIT_REASONS: u64 = 256;

/// Where the fields of `runtime.g` are, bytes from its start.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct GLayout {
    pub stack: u64,
    pub atomicstatus: u64,
    pub waitreason: u64,
    pub startpc: u64,
}

impl GLayout {
    /// Bytes of a `g` read to see every field.
    fn span(&self) -> u64 {
        [self.stack + 16, self.atomicstatus + 4, self.waitreason + 1, self.startpc + 8].into_iter().max().unwrap_or(0)
    }

    /// Every field within [`MAX_FIELD_OFFSET`] (so [`GLayout::span`] cannot overflow).
    fn check(self) -> Result<GLayout, String> {
        let max = [self.stack, self.atomicstatus, self.waitreason, self.startpc].into_iter().max().unwrap_or(0);
        if max > MAX_FIELD_OFFSET {
            return Err(format!("runtime.g's DWARF puts a field at {max} B (over {MAX_FIELD_OFFSET} B)"));
        }
        Ok(self)
    }
}

/// What the executable says, read once per process.
struct Binary {
    layout: GLayout,
    /// `runtime.allgs` (a slice header) and `runtime.waitReasonStrings` (address, entries), as
    /// linked (add `bias`).
    allgs: u64,
    wait_reasons: Option<(u64, u64)>,
    /// Functions (start, end, name), by start.
    functions: Vec<(u64, u64, String)>,
    /// `runtime.mbuckets` and `runtime.MemProfileRate` (as linked), `runtime.bucket`'s layout:
    /// the heap profile (heap.rs); None in a binary without them.
    mbuckets: Option<u64>,
    mem_profile_rate: Option<u64>,
    bucket: Option<super::heap::BucketLayout>,
    /// Load address minus link address (0 unless position-independent).
    bias: u64,
}

/// The goroutine census of one Go process.
pub struct GoCensus {
    pid: u32,
    binary: Option<Binary>,
    /// The typed walk of the heap from the package variables (None: the executable has no
    /// DWARF for it; the census' errors say so).
    walker: Option<super::walk::Walker>,
    wait_reasons: Vec<String>,
    pub census: Census<Goroutines>,
}

impl GoCensus {
    /// Read the executable of Go process `pid` (its DWARF layout and symbols); a census whose
    /// error says why when it cannot be.
    pub fn new(pid: u32) -> GoCensus {
        let mut census = Census::default();
        let binary = match read_binary(pid) {
            Ok(b) => Some(b),
            Err(e) => {
                census.errors.push(format!("goroutines not read: {e}"));
                None
            }
        };
        let walker = match super::walk::Walker::new(pid) {
            Ok(w) => Some(w),
            Err(e) => {
                census.errors.push(format!("no path from the package variables to the Go heap: {e}"));
                None
            }
        };
        GoCensus { pid, binary, walker, wait_reasons: Vec::new(), census }
    }

    /// Take the first snapshot (once), at `t_s` seconds since the recording's start.
    pub fn tick(&mut self, t_s: f64, units: Option<u64>) {
        if self.binary.is_none() || self.census.start.is_some() || !self.census.errors.is_empty() {
            return;
        }
        match self.snapshot(t_s, units) {
            Ok(g) => self.census.start = Some(g),
            Err(e) => self.census.errors.push(format!("goroutines not read at {t_s:.1} s: {e}")),
        }
    }

    /// Take the last snapshot, when the first was taken and the process still runs.
    pub fn finish(&mut self, alive: bool, t_s: f64, units: Option<u64>) {
        if self.census.start.is_none() {
            return;
        }
        if !alive {
            self.census.errors.push("the process ended before the last goroutine census".into());
            return;
        }
        match self.snapshot(t_s, units) {
            Ok(g) => self.census.end = Some(g),
            Err(e) => self.census.errors.push(format!("goroutines not read at {t_s:.1} s: {e}")),
        }
    }

    fn snapshot(&mut self, t_s: f64, units: Option<u64>) -> Result<Goroutines, String> {
        let clock = Instant::now();
        let b = self.binary.as_ref().ok_or("no layout")?;
        let mem = std::fs::File::open(format!("/proc/{}/mem", self.pid)).map_err(|e| format!("/proc/PID/mem: {e}"))?;
        let read = |addr: u64, len: usize| -> Result<Vec<u8>, String> {
            let mut buf = vec![0u8; len];
            mem.read_exact_at(&mut buf, addr).map_err(|e| format!("read {len} B at {addr:#x}: {e}"))?;
            Ok(buf)
        };
        let u64_at = |b: &[u8], o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap_or_default());
        if self.wait_reasons.is_empty()
            && let Some((addr, n)) = b.wait_reasons
        {
            let table = read(addr.wrapping_add(b.bias), n as usize * 16)?;
            self.wait_reasons = (0..n as usize)
                .map(|i| {
                    let (p, l) = (u64_at(&table, i * 16), u64_at(&table, i * 16 + 8));
                    read(p, l.min(256) as usize).map(|s| String::from_utf8_lossy(&s).into_owned()).unwrap_or_default()
                })
                .collect();
        }
        let header = read(b.allgs.wrapping_add(b.bias), 16)?;
        let (ptr, len) = (u64_at(&header, 0), u64_at(&header, 8) as usize);
        let n = len.min(MAX_GOROUTINES);
        let ptrs = if n == 0 { Vec::new() } else { read(ptr, n * 8)? };
        let span = b.layout.span() as usize;
        let mut groups: HashMap<(u32, u8, u64), (u64, u64)> = HashMap::new();
        for i in 0..n {
            let Ok(g) = read(u64_at(&ptrs, i * 8), span) else { continue };
            let l = &b.layout;
            let status = u32::from_le_bytes(g[l.atomicstatus as usize..][..4].try_into().unwrap_or_default()) & !0x1000;
            if status == 6 {
                continue; // _Gdead: kept by the runtime for reuse.
            }
            let stack = u64_at(&g, l.stack as usize + 8).saturating_sub(u64_at(&g, l.stack as usize));
            let e = groups.entry((status, g[l.waitreason as usize], u64_at(&g, l.startpc as usize))).or_default();
            e.0 += 1;
            e.1 += stack;
        }
        let mut out = Goroutines { taken: Taken { t_s, took_s: 0.0, units_of_work: units }, ..Default::default() };
        for ((status, reason, pc), (count, stack_bytes)) in groups {
            out.total += count;
            out.stack_bytes += stack_bytes;
            let waiting = status == 4;
            out.groups.push(GoroutineGroup {
                state: status_name(status).to_string(),
                wait_reason: waiting
                    .then(|| self.wait_reasons.get(reason as usize).cloned().unwrap_or(format!("reason {reason}"))),
                start_function: function_at(&b.functions, pc.wrapping_sub(b.bias)),
                count,
                stack_bytes,
            });
        }
        out.groups.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.start_function.cmp(&b.start_function)));
        if len > n {
            self.census.errors.push(format!("{len} goroutines: the first {n} read"));
        }
        match heap_profile(self.pid, b, &read) {
            Ok((rate, sites, cut)) => {
                out.mem_profile_rate = rate;
                out.heap = sites;
                if cut {
                    self.census
                        .errors
                        .push(format!("heap profile: the first {} buckets read", super::heap::MAX_BUCKETS));
                }
            }
            Err(e) => self.census.errors.push(format!("heap profile not read at {t_s:.1} s: {e}")),
        }
        if let Some(w) = &self.walker {
            match w.walk(self.pid, super::walk::Budget::default()) {
                Ok(walk) => out.walk = Some(walk),
                Err(e) => self.census.errors.push(format!("Go heap not walked at {t_s:.1} s: {e}")),
            }
        }
        out.taken.took_s = clock.elapsed().as_secs_f64();
        Ok(out)
    }
}

/// The runtime's heap profile (heap.rs): `MemProfileRate` and the in-use heap by Go function
/// (empty when the rate is 0), and whether the bucket walk was cut short.
fn heap_profile(
    pid: u32,
    b: &Binary,
    read: &dyn Fn(u64, usize) -> Result<Vec<u8>, String>,
) -> Result<(u64, Vec<GoHeapSite>, bool), String> {
    let (Some(head), Some(rate), Some(layout)) = (b.mbuckets, b.mem_profile_rate, b.bucket) else {
        return Err("no runtime.mbuckets, runtime.MemProfileRate or runtime.bucket in the executable".into());
    };
    let word =
        |a: u64| read(a.wrapping_add(b.bias), 8).map(|v| u64::from_le_bytes(v[..8].try_into().unwrap_or_default()));
    let rate = word(rate)?;
    if rate == 0 {
        return Ok((0, Vec::new(), false));
    }
    // Inlined calls named from DWARF (blazesym), as in the recording's stacks; the symbol table
    // where that finds nothing. The first return address is looked up one byte back too.
    let mut symbolizer = crate::symbolize::StackSymbolizer::new(pid);
    let mut names = |pcs: &[u64]| -> Vec<String> {
        let Some((&first, rest)) = pcs.split_first() else { return Vec::new() };
        let ips: Vec<u64> = std::iter::once(first.saturating_sub(1)).chain(rest.iter().copied()).collect();
        let frames = symbolizer.symbolize(&ips);
        if frames.iter().all(|f| f.function.is_none()) {
            return pcs.iter().map(|&pc| function_at(&b.functions, pc.wrapping_sub(b.bias + 1))).collect();
        }
        frames.iter().map(|f| f.function.clone().unwrap_or_else(|| format!("{:#x}", f.addr))).collect()
    };
    let (sites, cut) = super::heap::read_heap(read, word(head)?, layout, rate, &mut names)?;
    Ok((rate, sites, cut))
}

/// `g.atomicstatus` (the `_Gscan` bit cleared) in words (runtime/runtime2.go).
pub fn status_name(status: u32) -> &'static str {
    match status {
        0 => "idle",
        1 => "runnable",
        2 => "running",
        3 => "syscall",
        4 => "waiting",
        6 => "dead",
        8 => "copystack",
        9 => "preempted",
        _ => "unknown",
    }
}

/// The function whose code holds `pc` (link address), else its address in hex.
fn function_at(functions: &[(u64, u64, String)], pc: u64) -> String {
    let i = functions.partition_point(|f| f.0 <= pc);
    match i.checked_sub(1).map(|i| &functions[i]) {
        Some((start, end, name)) if pc < *end || *start == pc => name.clone(),
        _ => format!("{pc:#x}"),
    }
}

/// The executable of `pid` (through /proc/PID/exe: a container's own file): `runtime.g`'s
/// layout, the symbols, the load bias.
fn read_binary(pid: u32) -> Result<Binary, String> {
    let data = std::fs::read(format!("/proc/{pid}/exe")).map_err(|e| format!("/proc/{pid}/exe: {e}"))?;
    let file = object::File::parse(&*data).map_err(|e| format!("not an ELF file: {e}"))?;
    let mut b = parse_binary(&file)?;
    if file.kind() == object::ObjectKind::Dynamic {
        b.bias = load_bias(pid, &file)?;
    }
    Ok(b)
}

/// What [`read_binary`] reads of an executable, its load bias left at 0 (a pure function of
/// the file's bytes: fuzzed through [`crate::fuzzing`]).
fn parse_binary(file: &object::File<'_>) -> Result<Binary, String> {
    let mut allgs = None;
    let mut wait_reasons = None;
    let (mut mbuckets, mut mem_profile_rate) = (None, None);
    let mut functions = Vec::new();
    for s in file.symbols() {
        let Ok(name) = s.name() else { continue };
        match name {
            "runtime.allgs" => allgs = Some(s.address()),
            "runtime.waitReasonStrings" => wait_reasons = Some((s.address(), (s.size() / 16).min(MAX_WAIT_REASONS))),
            "runtime.mbuckets" => mbuckets = Some(s.address()),
            "runtime.MemProfileRate" => mem_profile_rate = Some(s.address()),
            _ if s.kind() == object::SymbolKind::Text && s.address() != 0 => {
                functions.push((s.address(), s.address().saturating_add(s.size()), name.to_string()))
            }
            _ => {}
        }
    }
    let allgs = allgs.ok_or("no symbol runtime.allgs (a stripped binary, or not Go)")?;
    functions.sort_by_key(|f| f.0);
    let structs = structs(file, &["runtime.g", "runtime.bucket"])?;
    let (_, g) = structs.get("runtime.g").ok_or("no runtime.g in DWARF (built with -ldflags=-w?)")?;
    let get = |n: &str| g.get(n).copied().ok_or(format!("runtime.g has no member {n} in DWARF"));
    let layout = GLayout {
        stack: get("stack")?,
        atomicstatus: get("atomicstatus")?,
        waitreason: get("waitreason")?,
        startpc: get("startpc")?,
    }
    .check()?;
    let bucket = structs.get("runtime.bucket").and_then(|(size, m)| {
        Some(super::heap::BucketLayout { size: *size, allnext: *m.get("allnext")?, nstk: *m.get("nstk")? })
    });
    Ok(Binary { layout, allgs, wait_reasons, functions, bias: 0, mbuckets, mem_profile_rate, bucket })
}

/// [`parse_binary`] for the fuzz targets: whether it read a layout.
pub(crate) fn parse_binary_for_fuzzing(file: &object::File<'_>) -> bool {
    parse_binary(file).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn functions_by_address() {
        let f = vec![(0x1000, 0x1100, "main.handle".to_string()), (0x1100, 0x1180, "main.main".to_string())];
        assert_eq!(function_at(&f, 0x1000), "main.handle");
        assert_eq!(function_at(&f, 0x10ff), "main.handle");
        assert_eq!(function_at(&f, 0x1100), "main.main");
        assert_eq!(function_at(&f, 0x2000), "0x2000");
        assert_eq!(function_at(&f, 0x10), "0x10");
        assert_eq!(status_name(4 & !0x1000), "waiting");
    }
}
