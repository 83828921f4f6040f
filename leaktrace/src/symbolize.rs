//! Call stacks → frames, with blazesym.
//!
//! The symbolizer keeps a snapshot of the target's executable mappings and an open file handle
//! for every object it maps (opened through /proc/PID/map_files, i.e. the very file the target
//! mapped, whatever its mount namespace). An address is turned into (object, file offset) with
//! that snapshot and symbolized from the object's ELF/DWARF (`Source::Elf` + `Input::FileOffset`).
//! So stacks can still be symbolized after the target has exited, and PIE executables, shared
//! libraries and containers need nothing special. Demangling (C++, Rust), file:line and inlined
//! functions are enabled.

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::AsRawFd as _;

use blazesym::symbolize::{
    CodeInfo, Input, Symbolized, Symbolizer,
    source::{Elf, Source},
};

use crate::recording::Frame;

/// One executable mapping of the target.
#[derive(Clone, Debug)]
struct Mapping {
    start: u64,
    end: u64,
    /// File offset mapped at `start`.
    offset: u64,
    /// (device, inode) of the object: key of `objects`.
    key: (String, u64),
}

/// An object the target maps, kept open.
struct Object {
    /// Path as the target sees it.
    path: String,
    /// Open handle, so the file can be read after the target exits or unmaps it.
    file: File,
    /// GNU build id (hex), read once when the object is first symbolized.
    build_id: Option<Option<String>>,
}

/// Symbolizes user addresses of one process.
pub struct StackSymbolizer {
    pid: u32,
    symbolizer: Symbolizer,
    maps: Vec<Mapping>,
    objects: HashMap<(String, u64), Object>,
    /// /proc/PID/maps text of the last snapshot, to skip re-parsing when nothing changed.
    last_maps: String,
}

impl StackSymbolizer {
    /// A symbolizer for `pid`, with a first snapshot of its mappings.
    pub fn new(pid: u32) -> Self {
        let symbolizer =
            Symbolizer::builder().enable_code_info(true).enable_inlined_fns(true).enable_demangling(true).build();
        let mut s =
            StackSymbolizer { pid, symbolizer, maps: Vec::new(), objects: HashMap::new(), last_maps: String::new() };
        s.refresh();
        s
    }

    /// Re-read /proc/PID/maps and open objects not seen before. Mappings of earlier snapshots
    /// are kept (newest first wins), so addresses in a library unmapped since stay resolvable.
    /// Does nothing once the process is gone.
    pub fn refresh(&mut self) {
        let Ok(text) = std::fs::read_to_string(format!("/proc/{}/maps", self.pid)) else { return };
        if text == self.last_maps || text.is_empty() {
            return;
        }
        let mut fresh = Vec::new();
        for l in text.lines().filter_map(crate::procinfo::parse_maps_line) {
            if !l.perms.contains('x') || !l.path.starts_with('/') {
                continue;
            }
            let (range, path) = (l.range, &l.path);
            let key = (l.dev.to_string(), l.inode);
            if !self.objects.contains_key(&key) {
                let file = File::open(format!("/proc/{}/map_files/{range}", self.pid))
                    .or_else(|_| File::open(format!("/proc/{}/root{}", self.pid, path.trim_end_matches(" (deleted)"))));
                match file {
                    Ok(file) => {
                        self.objects.insert(key.clone(), Object { path: l.path.clone(), file, build_id: None });
                    }
                    Err(_) => continue,
                }
            }
            fresh.push(Mapping { start: l.start, end: l.end, offset: l.offset, key });
        }
        // Newest snapshot first; older mappings stay behind it for unmapped libraries.
        fresh.append(&mut self.maps);
        self.maps = fresh;
        self.last_maps = text;
    }

    fn locate(&self, addr: u64) -> Option<(&Mapping, u64)> {
        self.maps.iter().find(|m| (m.start..m.end).contains(&addr)).map(|m| (m, addr - m.start + m.offset))
    }

    /// Frames for `ips` (innermost first; `ips[0]` is the instruction the probe hit, the others
    /// are return addresses, looked up at `ip - 1` so the line is that of the call). An address
    /// with inlined calls yields several frames, innermost first. Never fails: what cannot be
    /// resolved keeps its address (and object, when known).
    pub fn symbolize(&mut self, ips: &[u64]) -> Vec<Frame> {
        if ips.iter().any(|ip| self.locate(*ip).is_none()) {
            self.refresh();
        }
        // Group by object so each object is asked once.
        let mut by_object: HashMap<(String, u64), Vec<(usize, u64)>> = HashMap::new();
        for (i, &ip) in ips.iter().enumerate() {
            let probe_addr = if i == 0 { ip } else { ip.saturating_sub(1) };
            if let Some((m, off)) = self.locate(probe_addr) {
                by_object.entry(m.key.clone()).or_default().push((i, off));
            }
        }
        let mut per_ip: Vec<Vec<Frame>> =
            ips.iter().map(|&ip| vec![Frame { addr: ip, ..Default::default() }]).collect();
        for (key, items) in by_object {
            let Some(obj) = self.objects.get_mut(&key) else { continue };
            let fd_path = format!("/proc/self/fd/{}", obj.file.as_raw_fd());
            let build_id = obj.build_id.get_or_insert_with(|| read_build_id(&fd_path)).clone();
            let obj = &*obj;
            let offsets: Vec<u64> = items.iter().map(|(_, o)| *o).collect();
            let src = Source::Elf(Elf::new(fd_path));
            let results = self.symbolizer.symbolize(&src, Input::FileOffset(&offsets)).unwrap_or_default();
            for (j, (i, off)) in items.iter().enumerate() {
                let ip = ips[*i];
                let object = Some(obj.path.clone());
                // The offset of the instruction itself (a return address's frame is looked up
                // one byte back, inside the call; the label gives the return address's offset).
                let file_offset = Some(if *i == 0 { *off } else { off + 1 });
                let build_id = build_id.clone();
                let frames = match results.get(j) {
                    Some(Symbolized::Sym(sym)) => {
                        let mut v = Vec::new();
                        // blazesym lists inlined callees outermost first, each with the location
                        // inside itself; emit them innermost first.
                        for f in sym.inlined.iter().rev() {
                            let (file, line) = code_location(f.code_info.as_ref());
                            v.push(Frame {
                                addr: ip,
                                object: object.clone(),
                                function: Some(f.name.to_string()),
                                file,
                                line,
                                inlined: true,
                                file_offset,
                                build_id: build_id.clone(),
                            });
                        }
                        let (file, line) = code_location(sym.code_info.as_deref());
                        v.push(Frame {
                            addr: ip,
                            object,
                            function: Some(sym.name.to_string()),
                            file,
                            line,
                            inlined: false,
                            file_offset,
                            build_id,
                        });
                        v
                    }
                    _ => vec![Frame { addr: ip, object, file_offset, build_id, ..Default::default() }],
                };
                per_ip[*i] = frames;
            }
        }
        per_ip.into_iter().flatten().collect()
    }
}

fn code_location(ci: Option<&CodeInfo<'_>>) -> (Option<String>, Option<u32>) {
    match ci {
        Some(ci) => (Some(ci.to_path().display().to_string()), ci.line),
        None => (None, None),
    }
}

/// The GNU build id of the ELF file at `path`, as lowercase hex (None: unreadable, not ELF, or
/// no build-id note).
fn read_build_id(path: &str) -> Option<String> {
    use object::Object as _;
    let data = std::fs::read(path).ok()?;
    let obj = object::File::parse(&*data).ok()?;
    let id = obj.build_id().ok()??;
    Some(id.iter().map(|b| format!("{b:02x}")).collect())
}

/// Where a frame's object and offset are, as `object+0xOFFSET`, for messages.
pub fn frame_location(f: &Frame) -> String {
    let object = f.object.as_deref().map(|o| o.rsplit('/').next().unwrap_or(o)).unwrap_or("[unknown object]");
    match f.file_offset {
        Some(off) => format!("{object}+{off:#x}"),
        None => format!("{object}@{:#x}", f.addr),
    }
}
