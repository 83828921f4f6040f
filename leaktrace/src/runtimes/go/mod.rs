//! Go detection: the executable was built by the Go toolchain (its build info). The frame
//! rules are in `leaktrace_analysis::runtimes::go`.

pub mod census;
pub mod dwarf;
pub mod heap;
pub mod names;
pub mod stack;
pub mod stats;
pub mod walk;

use std::path::Path;

use object::{Object as _, ObjectSection as _};

use super::{RuntimeInfo, RuntimeInstance, RuntimeOptions};
use crate::holds::census::{CensusOptions, RuntimeCensus};
use crate::objects::MappedObject;
use crate::runtimes::go::census::GoCensus;
use leaktrace_analysis::recording::{ManagedHeap, Runtime};

/// The Go toolchain version that built `path` ("go1.19.8"), or Some(None) for a Go binary whose
/// version cannot be read; None when `path` is not a Go binary.
pub fn go_binary_version(path: &Path) -> Option<Option<String>> {
    // Read lazily: only the headers and, for Go binaries, one small section are read.
    let cache = object::read::ReadCache::new(std::fs::File::open(path).ok()?);
    let file = object::File::parse(&cache).ok()?;
    let is_go = file.section_by_name(".go.buildinfo").is_some() || file.section_by_name(".gopclntab").is_some();
    if !is_go {
        return None;
    }
    let version = file.section_by_name(".go.buildinfo").and_then(|s| s.data().ok()).and_then(buildinfo_version);
    Some(version)
}

/// True when `path` is an executable built by the Go toolchain.
pub fn is_go_binary(path: &Path) -> bool {
    go_binary_version(path).is_some()
}

/// The version string of a `.go.buildinfo` section (Go 1.18+: "\xff Go buildinf:", pointer
/// size, flags; with flag 2 the version follows at offset 32 as a varint-prefixed string).
fn buildinfo_version(d: &[u8]) -> Option<String> {
    if d.len() < 33 || &d[..14] != b"\xff Go buildinf:" || d[15] & 2 == 0 {
        return None;
    }
    let (mut len, mut shift, mut i) = (0usize, 0, 32);
    loop {
        let b = *d.get(i)?;
        len |= ((b & 0x7f) as usize) << shift;
        i += 1;
        if b & 0x80 == 0 {
            break;
        }
        shift += 7;
        if shift > 28 {
            return None;
        }
    }
    let v = d.get(i..i + len)?;
    Some(String::from_utf8_lossy(v).into_owned())
}

/// Detect Go: the executable (the first mapped object) was built by the Go toolchain.
pub fn detect(_pid: u32, objects: &[MappedObject]) -> Option<RuntimeInfo> {
    let exe = objects.first()?;
    let version = go_binary_version(&exe.open_path)?;
    Some(RuntimeInfo {
        name: Runtime::Go,
        version: version.map(|v| v.trim_start_matches("go").to_string()),
        notes: vec![format!(
            "Go runtime detected ({}): managed = the Go heap's mappings (resident bytes); native = \
             malloc from C code called through cgo",
            exe.path.display()
        )],
    })
}

/// Go ([`super::RuntimeDetector`]).
pub struct Go;

impl super::RuntimeDetector for Go {
    fn detect(&self, pid: u32, objects: &[MappedObject], _opts: RuntimeOptions) -> Option<Box<dyn RuntimeInstance>> {
        let info = detect(pid, objects)?;
        Some(Box::new(GoInstance { info, stats: stats::GoStatsGauge::new(pid) }))
    }
}

/// Go in one process: its own figures (`HeapInuse`, marked bytes, collections: [`stats`];
/// None for a stripped binary), for the occupied heap only (its heap is measured from its
/// mappings' sites).
struct GoInstance {
    info: RuntimeInfo,
    stats: Option<stats::GoStatsGauge>,
}

impl RuntimeInstance for GoInstance {
    fn info(&self) -> &RuntimeInfo {
        &self.info
    }

    /// Its goroutines, made at the first poll (reads the executable's DWARF then).
    fn census(&self, pid: u32, _opts: CensusOptions, at_attach: bool) -> Option<Box<dyn RuntimeCensus>> {
        (!at_attach).then(|| Box::new(GoCensus::new(pid)) as Box<dyn RuntimeCensus>)
    }

    /// Go's own figures: `HeapInuse`, marked `figures_only` (the occupied heap's managed part),
    /// and what the last collection marked live, with the collections so far and when the last
    /// ended (the heap's trend, judged on its collections).
    fn heap(&mut self, _kernel: &dyn super::KernelFigures) -> Option<ManagedHeap> {
        use super::HeapGauge as _;
        self.stats.as_mut()?.sample()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buildinfo() {
        let mut d = b"\xff Go buildinf:".to_vec();
        d.extend_from_slice(&[8, 2]);
        d.resize(32, 0);
        d.push(8);
        d.extend_from_slice(b"go1.19.8");
        d.extend_from_slice(&[0; 8]);
        assert_eq!(buildinfo_version(&d).as_deref(), Some("go1.19.8"));
        d[15] = 0;
        assert_eq!(buildinfo_version(&d), None);
        assert_eq!(buildinfo_version(b"short"), None);
    }
}
