//! pprof heap profiles of a recording: `profile.pb.gz` (Go's heap layout) and `growth.pb.gz`
//! (what grew over the steady window), for `go tool pprof`, Pyroscope, Parca, Grafana.
//!
//! The messages are those of the upstream `profile.proto` (github.com/google/pprof,
//! proto/profile.proto), declared below with prost's derive macros field by field, so the
//! build needs no `protoc`. A profile is the protobuf encoding, gzipped.
//!
//! `profile.pb.gz` holds one sample per site (call stack) with four values, in this order:
//! `alloc_objects/count` (allocations since attach), `alloc_space/bytes` (bytes allocated since
//! attach), `inuse_objects/count` (live blocks at the last checkpoint) and `inuse_space/bytes`
//! (live bytes at the last checkpoint, the default view) — the figures of `report.json`'s
//! `sites[]` (`allocations`, `allocated_bytes`, `live_allocations`, `live_bytes`), for every site
//! of the recording (not capped at 200). In sampled mode the byte values are the weighted
//! estimates the kernel side records (as in report.json) and the object counts count samples;
//! `period` is then the mean sampling distance (`sample_bytes`), otherwise 1; `period_type` is
//! `space/bytes`.
//!
//! `growth.pb.gz` holds, per site whose live bytes grew over the analysis' steady window
//! (`steady_from_s` to `span_to_s`), `growth_objects/count` and `growth_space/bytes`: live
//! blocks and bytes at the end of the window minus at its start. Sites that shrank are left
//! out (as in growth.svg).
//!
//! Stacks: from the culprit frame outwards (the allocator's own frames are left out, as in Go's
//! heap profiles, so the culprit's bytes are its flat bytes in `go tool pprof -top`); one
//! `Location` per distinct (object, address), leaf first in each sample; inlined
//! functions at one address are several `Line`s of one location, innermost first. `Mapping`s
//! are the target's executable mappings recorded in `recording.json` (`mappings`: range, file
//! offset, GNU build ID); for a recording without them (older ones), one per object whose range
//! spans the addresses seen in it, with `file_offset` 0 and no build ID. The functions are
//! symbolized already (`has_functions` is set, so pprof does not try to). Labels per sample: `kind`
//! (malloc/mmap/fault), `memory_kind`, `class`, `runtime` ("native" without one), `pid`
//! (numeric).

use std::collections::HashMap;
use std::io::Write as _;

use prost::Message as _;

use crate::analyze::{Analysis, SiteAnalysis, frame_label};
use crate::recording::{Frame, Recording};

/// File name of the heap profile in a recording directory.
pub const PROFILE_FILE: &str = "profile.pb.gz";
/// File name of the growth profile in a recording directory.
pub const GROWTH_FILE: &str = "growth.pb.gz";

/// The messages of pprof's `profile.proto` (package `perftools.profiles`), same field numbers.
pub mod proto {
    /// A profile: samples, their stacks, and the tables they index.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Profile {
        #[prost(message, repeated, tag = "1")]
        pub sample_type: Vec<ValueType>,
        #[prost(message, repeated, tag = "2")]
        pub sample: Vec<Sample>,
        #[prost(message, repeated, tag = "3")]
        pub mapping: Vec<Mapping>,
        #[prost(message, repeated, tag = "4")]
        pub location: Vec<Location>,
        #[prost(message, repeated, tag = "5")]
        pub function: Vec<Function>,
        /// String table; entry 0 must be "".
        #[prost(string, repeated, tag = "6")]
        pub string_table: Vec<String>,
        #[prost(int64, tag = "7")]
        pub drop_frames: i64,
        #[prost(int64, tag = "8")]
        pub keep_frames: i64,
        /// Start of the profile, ns since the Unix epoch.
        #[prost(int64, tag = "9")]
        pub time_nanos: i64,
        /// Duration of the profile, ns.
        #[prost(int64, tag = "10")]
        pub duration_nanos: i64,
        #[prost(message, optional, tag = "11")]
        pub period_type: Option<ValueType>,
        #[prost(int64, tag = "12")]
        pub period: i64,
        /// Indexes into the string table.
        #[prost(int64, repeated, tag = "13")]
        pub comment: Vec<i64>,
        /// Index into the string table of the type of the preferred sample value.
        #[prost(int64, tag = "14")]
        pub default_sample_type: i64,
    }

    /// A value's type and unit (string table indexes).
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ValueType {
        #[prost(int64, tag = "1")]
        pub r#type: i64,
        #[prost(int64, tag = "2")]
        pub unit: i64,
    }

    /// A call stack (leaf first) with one value per sample type, and labels.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Sample {
        #[prost(uint64, repeated, tag = "1")]
        pub location_id: Vec<u64>,
        #[prost(int64, repeated, tag = "2")]
        pub value: Vec<i64>,
        #[prost(message, repeated, tag = "3")]
        pub label: Vec<Label>,
    }

    /// A key with a string (`str`) or numeric (`num`, `num_unit`) value.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Label {
        #[prost(int64, tag = "1")]
        pub key: i64,
        #[prost(int64, tag = "2")]
        pub str: i64,
        #[prost(int64, tag = "3")]
        pub num: i64,
        #[prost(int64, tag = "4")]
        pub num_unit: i64,
    }

    /// An object mapped into the process.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Mapping {
        #[prost(uint64, tag = "1")]
        pub id: u64,
        #[prost(uint64, tag = "2")]
        pub memory_start: u64,
        #[prost(uint64, tag = "3")]
        pub memory_limit: u64,
        #[prost(uint64, tag = "4")]
        pub file_offset: u64,
        #[prost(int64, tag = "5")]
        pub filename: i64,
        #[prost(int64, tag = "6")]
        pub build_id: i64,
        #[prost(bool, tag = "7")]
        pub has_functions: bool,
        #[prost(bool, tag = "8")]
        pub has_filenames: bool,
        #[prost(bool, tag = "9")]
        pub has_line_numbers: bool,
        #[prost(bool, tag = "10")]
        pub has_inline_frames: bool,
    }

    /// An instruction address and the functions (inlined first) it is in.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Location {
        #[prost(uint64, tag = "1")]
        pub id: u64,
        #[prost(uint64, tag = "2")]
        pub mapping_id: u64,
        #[prost(uint64, tag = "3")]
        pub address: u64,
        #[prost(message, repeated, tag = "4")]
        pub line: Vec<Line>,
        #[prost(bool, tag = "5")]
        pub is_folded: bool,
    }

    /// A source line of a function.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Line {
        #[prost(uint64, tag = "1")]
        pub function_id: u64,
        #[prost(int64, tag = "2")]
        pub line: i64,
        #[prost(int64, tag = "3")]
        pub column: i64,
    }

    /// A function (string table indexes).
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Function {
        #[prost(uint64, tag = "1")]
        pub id: u64,
        #[prost(int64, tag = "2")]
        pub name: i64,
        #[prost(int64, tag = "3")]
        pub system_name: i64,
        #[prost(int64, tag = "4")]
        pub filename: i64,
        #[prost(int64, tag = "5")]
        pub start_line: i64,
    }
}

use proto::{Function, Label, Line, Location, Mapping, Profile, Sample, ValueType};

/// A location's identity: object, address, and its (function, line) list.
type LocationKey = (Option<String>, u64, Vec<(String, u32)>);

/// Live (bytes, blocks) per stack id.
type LiveByStack = HashMap<u32, (u64, u64)>;

/// Builds a [`Profile`]: interns strings, functions, locations and mappings.
struct Builder {
    p: Profile,
    strings: HashMap<String, i64>,
    functions: HashMap<(String, String), u64>,
    locations: HashMap<LocationKey, u64>,
    /// Index in `p.mapping` by object path (synthetic mappings) or by `path@start` (recorded).
    mappings: HashMap<String, usize>,
    /// The recording's executable mappings ([`Recording::mappings`]), by start address.
    known: Vec<crate::recording::ObjectMapping>,
}

impl Builder {
    fn new(rec: &Recording) -> Builder {
        let mut b = Builder {
            p: Profile::default(),
            strings: HashMap::new(),
            functions: HashMap::new(),
            locations: HashMap::new(),
            mappings: HashMap::new(),
            known: rec.mappings.clone(),
        };
        b.s("");
        b
    }

    /// Index of `s` in the string table.
    fn s(&mut self, s: &str) -> i64 {
        if let Some(&i) = self.strings.get(s) {
            return i;
        }
        let i = self.p.string_table.len() as i64;
        self.p.string_table.push(s.to_string());
        self.strings.insert(s.to_string(), i);
        i
    }

    fn value_type(&mut self, ty: &str, unit: &str) -> ValueType {
        ValueType { r#type: self.s(ty), unit: self.s(unit) }
    }

    fn function(&mut self, name: &str, file: &str) -> u64 {
        if let Some(&id) = self.functions.get(&(name.to_string(), file.to_string())) {
            return id;
        }
        let id = self.p.function.len() as u64 + 1;
        let f = Function { id, name: self.s(name), system_name: self.s(name), filename: self.s(file), start_line: 0 };
        self.p.function.push(f);
        self.functions.insert((name.to_string(), file.to_string()), id);
        id
    }

    /// Mapping of `object`, widened to cover `addr`.
    fn mapping(&mut self, object: &str, addr: u64, frames: &[&Frame]) -> u64 {
        // A recorded mapping of this object holding the address (a return address may be the
        // first byte past its call, so `addr - 1` counts too).
        if let Some(k) = self.known.iter().find(|k| k.path == object && (k.start..=k.end).contains(&addr)).cloned() {
            let key = format!("{}@{:x}", k.path, k.start);
            let idx = match self.mappings.get(&key) {
                Some(&i) => i,
                None => {
                    let m = Mapping {
                        memory_start: k.start,
                        memory_limit: k.end,
                        file_offset: k.offset,
                        filename: self.s(&k.path),
                        build_id: self.s(k.build_id.as_deref().unwrap_or("")),
                        has_functions: true,
                        has_inline_frames: true,
                        ..Default::default()
                    };
                    self.p.mapping.push(m);
                    self.mappings.insert(key, self.p.mapping.len() - 1);
                    self.p.mapping.len() - 1
                }
            };
            let m = &mut self.p.mapping[idx];
            m.has_filenames |= frames.iter().any(|f| f.file.is_some());
            m.has_line_numbers |= frames.iter().any(|f| f.line.is_some());
            return idx as u64 + 1;
        }
        // No recorded mapping: one per object, spanning the addresses seen in it.
        let idx = match self.mappings.get(object) {
            Some(&i) => i,
            None => {
                let m = Mapping {
                    id: 0,
                    memory_start: addr,
                    memory_limit: addr.saturating_add(1),
                    filename: self.s(object),
                    has_functions: true,
                    has_inline_frames: true,
                    ..Default::default()
                };
                self.p.mapping.push(m);
                self.mappings.insert(object.to_string(), self.p.mapping.len() - 1);
                self.p.mapping.len() - 1
            }
        };
        let m = &mut self.p.mapping[idx];
        m.memory_start = m.memory_start.min(addr);
        m.memory_limit = m.memory_limit.max(addr.saturating_add(1));
        m.has_filenames |= frames.iter().any(|f| f.file.is_some());
        m.has_line_numbers |= frames.iter().any(|f| f.line.is_some());
        idx as u64 + 1
    }

    /// Location of one address: `frames` are the inlined functions first, then the function
    /// they were inlined into (all at the same address).
    fn location(&mut self, frames: &[&Frame]) -> u64 {
        let outer = frames[frames.len() - 1];
        let lines: Vec<(String, u32)> = frames.iter().map(|f| (clean(&frame_label(f)), f.line.unwrap_or(0))).collect();
        let key = (outer.object.clone(), outer.addr, lines.clone());
        if let Some(&id) = self.locations.get(&key) {
            return id;
        }
        let mapping_id = match &outer.object {
            Some(o) => self.mapping(o, outer.addr, frames),
            None => 0,
        };
        let line = frames
            .iter()
            .zip(&lines)
            .map(|(f, (name, l))| Line {
                function_id: self.function(name, f.file.as_deref().unwrap_or("")),
                line: *l as i64,
                column: 0,
            })
            .collect();
        let id = self.p.location.len() as u64 + 1;
        self.p.location.push(Location { id, mapping_id, address: outer.addr, line, is_folded: false });
        self.locations.insert(key, id);
        id
    }

    /// A location with no address for a stack that has no frames ("[stack lost]", "[unknown]").
    fn pseudo_location(&mut self, name: &str) -> u64 {
        let key = (None, 0, vec![(name.to_string(), 0)]);
        if let Some(&id) = self.locations.get(&key) {
            return id;
        }
        let function_id = self.function(name, "");
        let id = self.p.location.len() as u64 + 1;
        self.p.location.push(Location {
            id,
            line: vec![Line { function_id, line: 0, column: 0 }],
            ..Default::default()
        });
        self.locations.insert(key, id);
        id
    }

    /// Location ids of a site's stack, leaf first, from the culprit frame on: the allocator's
    /// own frames (malloc, operator new, ...) are left out, as Go's heap profiles leave out
    /// the runtime's, so that `-top` ranks the code that allocates.
    fn stack(&mut self, site: &SiteAnalysis) -> Vec<u64> {
        if site.frames.is_empty() {
            return vec![self.pseudo_location(if site.stack_lost { "[stack lost]" } else { "[unknown]" })];
        }
        let mut ids = Vec::new();
        let mut group: Vec<&Frame> = Vec::new();
        let from = site.culprit_frame.unwrap_or(0).min(site.frames.len() - 1);
        for f in &site.frames[from..] {
            group.push(f);
            if !f.inlined {
                ids.push(self.location(&group));
                group.clear();
            }
        }
        if !group.is_empty() {
            ids.push(self.location(&group));
        }
        ids
    }

    fn labels(&mut self, rec: &Recording, site: &SiteAnalysis) -> Vec<Label> {
        let runtime = rec.target.runtime.map_or("native", |r| r.as_str());
        let mut out = Vec::new();
        for (k, v) in [
            ("kind", site.kind.as_str()),
            ("memory_kind", site.memory_kind.as_str()),
            ("class", site.class.as_str()),
            ("runtime", runtime),
        ] {
            out.push(Label { key: self.s(k), str: self.s(v), ..Default::default() });
        }
        out.push(Label { key: self.s("pid"), num: rec.target.pid as i64, ..Default::default() });
        out
    }

    /// Header fields shared by both profiles; `types` are (type, unit), the last is the default.
    fn header(&mut self, rec: &Recording, a: &Analysis, types: &[(&str, &str)], comment: &str) {
        self.p.sample_type = types.iter().map(|(t, u)| self.value_type(t, u)).collect();
        self.p.default_sample_type = self.p.sample_type.last().map_or(0, |v| v.r#type);
        self.p.period_type = Some(self.value_type("space", "bytes"));
        self.p.period = match (rec.mode.as_str(), rec.sample_bytes) {
            ("sampled", Some(n)) if n > 0 => n as i64,
            _ => 1,
        };
        self.p.time_nanos = (rec.started_unix_ms as i64).saturating_mul(1_000_000);
        self.p.duration_nanos = (a.duration_s * 1e9).round() as i64;
        let c = format!(
            "leaktrace {}: pid {} {}; {comment}",
            rec.leaktrace_version,
            rec.target.pid,
            rec.target.command.join(" ")
        );
        let c = self.s(&c);
        self.p.comment.push(c);
        let mode = format!("mode {}", rec.mode);
        let mode = self.s(&mode);
        self.p.comment.push(mode);
    }

    /// The mapping of the target's executable first (pprof takes mapping 1 as the main binary),
    /// then renumbered ids.
    fn finish(mut self, exe: &str) -> Profile {
        if let Some(pos) = self.p.mapping.iter().position(|m| self.p.string_table[m.filename as usize] == exe)
            && pos != 0
        {
            let n = self.p.mapping.len() as u64;
            // Swap ids 1 and pos+1 in the locations.
            let (a, b) = (1u64, pos as u64 + 1);
            for l in &mut self.p.location {
                if l.mapping_id == a {
                    l.mapping_id = b;
                } else if l.mapping_id == b {
                    l.mapping_id = a;
                }
            }
            self.p.mapping.swap(0, pos);
            debug_assert!(n >= b);
        }
        for (i, m) in self.p.mapping.iter_mut().enumerate() {
            m.id = i as u64 + 1;
        }
        self.p
    }
}

/// A frame label without control characters; empty labels become "[unknown]".
fn clean(label: &str) -> String {
    let s: String = label.chars().map(|c| if c.is_control() { ' ' } else { c }).collect();
    let s = s.trim();
    if s.is_empty() { "[unknown]".to_string() } else { s.to_string() }
}

/// The heap profile: every site with any allocation or live byte, values `[alloc_objects,
/// alloc_space, inuse_objects, inuse_space]` (counts, bytes), default `inuse_space`.
pub fn heap_profile(rec: &Recording, a: &Analysis) -> Profile {
    let mut b = Builder::new(rec);
    b.header(
        rec,
        a,
        &[("alloc_objects", "count"), ("alloc_space", "bytes"), ("inuse_objects", "count"), ("inuse_space", "bytes")],
        "heap profile: allocations since attach and live at the last checkpoint",
    );
    for site in &a.sites {
        let value = [site.allocations, site.allocated_bytes, site.live_allocations, site.live_bytes]
            .map(|v| i64::try_from(v).unwrap_or(i64::MAX));
        if value.iter().all(|&v| v == 0) {
            continue;
        }
        let location_id = b.stack(site);
        let label = b.labels(rec, site);
        b.p.sample.push(Sample { location_id, value: value.to_vec(), label });
    }
    b.finish(&rec.target.exe)
}

/// Live (bytes, blocks) per stack id at the checkpoints that open and close the steady window
/// of `a` (first checkpoint at or after `steady_from_s`, last at or before `span_to_s`).
fn steady_window_live(rec: &Recording, a: &Analysis) -> (LiveByStack, LiveByStack) {
    let mut order: Vec<usize> = (0..rec.checkpoints.len()).collect();
    order.sort_by(|&x, &y| rec.checkpoints[x].t_s.total_cmp(&rec.checkpoints[y].t_s));
    let t0 = order.first().map_or(0.0, |&i| rec.checkpoints[i].t_s);
    let mut cur: LiveByStack = HashMap::new();
    let mut start: Option<LiveByStack> = None;
    let mut end = HashMap::new();
    for &ci in &order {
        let c = &rec.checkpoints[ci];
        let t = c.t_s - t0;
        if t > a.span_to_s + 1e-6 {
            break;
        }
        // Cumulative totals; several samples of one stack in a checkpoint add up.
        let mut here: HashMap<u32, crate::recording::SiteSample> = HashMap::new();
        for s in &c.sites {
            let e = here.entry(s.stack).or_default();
            e.alloc_bytes = e.alloc_bytes.saturating_add(s.alloc_bytes);
            e.alloc_count = e.alloc_count.saturating_add(s.alloc_count);
            e.free_bytes = e.free_bytes.saturating_add(s.free_bytes);
            e.free_count = e.free_count.saturating_add(s.free_count);
        }
        for (id, s) in here {
            cur.insert(id, (s.live_bytes(), s.live_count()));
        }
        if start.is_none() && t >= a.steady_from_s - 1e-6 {
            start = Some(cur.clone());
        }
        end = cur.clone();
    }
    (start.unwrap_or_default(), end)
}

/// The growth profile: per site, live blocks and bytes gained over the steady window (end −
/// start, sites that grew only), values `[growth_objects, growth_space]`, default
/// `growth_space`.
pub fn growth_profile(rec: &Recording, a: &Analysis) -> Profile {
    let mut b = Builder::new(rec);
    let comment = format!(
        "growth profile: live bytes gained from {:.1} s to {:.1} s (the steady window)",
        a.steady_from_s, a.span_to_s
    );
    b.header(rec, a, &[("growth_objects", "count"), ("growth_space", "bytes")], &comment);
    let (start, end) = steady_window_live(rec, a);
    for site in &a.sites {
        let (b0, n0) = start.get(&site.id).copied().unwrap_or((0, 0));
        let (b1, n1) = end.get(&site.id).copied().unwrap_or((0, 0));
        if b1 <= b0 {
            continue;
        }
        let value = vec![n1.saturating_sub(n0) as i64, (b1 - b0) as i64];
        let location_id = b.stack(site);
        let label = b.labels(rec, site);
        b.p.sample.push(Sample { location_id, value, label });
    }
    b.finish(&rec.target.exe)
}

/// Protobuf encoding of `p`, gzipped (what `go tool pprof` reads).
pub fn encode_gz(p: &Profile) -> Vec<u8> {
    let raw = p.encode_to_vec();
    let mut gz = flate2::write::GzEncoder::new(Vec::with_capacity(raw.len() / 2), flate2::Compression::default());
    // Writing to a Vec cannot fail.
    gz.write_all(&raw).expect("gzip into memory");
    gz.finish().expect("gzip into memory")
}

/// Decode a profile written by [`encode_gz`] (gzipped or not). Errors say what is wrong.
pub fn decode(data: &[u8]) -> anyhow::Result<Profile> {
    let raw = if data.starts_with(&[0x1f, 0x8b]) {
        let mut out = Vec::new();
        std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(data), &mut out)
            .map_err(|e| anyhow::anyhow!("profile is not valid gzip: {e}"))?;
        out
    } else {
        data.to_vec()
    };
    Profile::decode(raw.as_slice()).map_err(|e| anyhow::anyhow!("profile is not a pprof Profile: {e}"))
}

/// One profile holding the samples of several (one per traced process), for the summary
/// directory of a multi-process recording: every sample keeps its `pid` label, so
/// `go tool pprof -tagfocus pid=N` selects one process and `-tagroot pid` splits the graph by
/// process. Mappings, locations and functions are kept per input profile (processes map the same
/// library at different addresses), renumbered 1..n; strings are shared. The header (sample
/// types, period, default type) is the first profile's; `time_nanos` is the earliest start and
/// `duration_nanos` spans to the latest end.
///
/// Errors: no profile, or profiles whose sample types (names and units, in order) differ.
pub fn merge(profiles: &[Profile]) -> anyhow::Result<Profile> {
    let Some(first) = profiles.first() else { anyhow::bail!("no profile to merge") };
    let types = |p: &Profile| -> Vec<(String, String)> {
        let s = |i: i64| p.string_table.get(i as usize).cloned().unwrap_or_default();
        p.sample_type.iter().map(|v| (s(v.r#type), s(v.unit))).collect()
    };
    let want = types(first);
    let mut out = Profile { string_table: vec![String::new()], ..Default::default() };
    let mut strings: HashMap<String, i64> = HashMap::from([(String::new(), 0)]);
    let mut intern = |out: &mut Profile, s: &str| -> i64 {
        if let Some(&i) = strings.get(s) {
            return i;
        }
        let i = out.string_table.len() as i64;
        out.string_table.push(s.to_string());
        strings.insert(s.to_string(), i);
        i
    };
    let (mut start, mut end) = (i64::MAX, i64::MIN);
    for (n, p) in profiles.iter().enumerate() {
        if types(p) != want {
            anyhow::bail!("profile {} has sample types {:?}, the first has {:?}", n + 1, types(p), want);
        }
        let s = |i: i64| p.string_table.get(i as usize).map_or("", String::as_str);
        let mut remap = |out: &mut Profile, i: i64| intern(out, s(i));
        let (mapping_base, location_base, function_base) =
            (out.mapping.len() as u64, out.location.len() as u64, out.function.len() as u64);
        // Ids are renumbered by position: the inputs' ids are 1..n in order (as Builder writes
        // them), and a reference to an id that is not there stays 0 ("none").
        let mapping_id: HashMap<u64, u64> =
            p.mapping.iter().enumerate().map(|(i, m)| (m.id, mapping_base + i as u64 + 1)).collect();
        let location_id: HashMap<u64, u64> =
            p.location.iter().enumerate().map(|(i, l)| (l.id, location_base + i as u64 + 1)).collect();
        let function_id: HashMap<u64, u64> =
            p.function.iter().enumerate().map(|(i, f)| (f.id, function_base + i as u64 + 1)).collect();
        for m in &p.mapping {
            let mut m = m.clone();
            m.id = mapping_id[&m.id];
            m.filename = remap(&mut out, m.filename);
            m.build_id = remap(&mut out, m.build_id);
            out.mapping.push(m);
        }
        for f in &p.function {
            let mut f = f.clone();
            f.id = function_id[&f.id];
            f.name = remap(&mut out, f.name);
            f.system_name = remap(&mut out, f.system_name);
            f.filename = remap(&mut out, f.filename);
            out.function.push(f);
        }
        for l in &p.location {
            let mut l = l.clone();
            l.id = location_id[&l.id];
            l.mapping_id = mapping_id.get(&l.mapping_id).copied().unwrap_or(0);
            for line in &mut l.line {
                line.function_id = function_id.get(&line.function_id).copied().unwrap_or(0);
            }
            out.location.push(l);
        }
        for smp in &p.sample {
            let mut smp = smp.clone();
            smp.location_id = smp.location_id.iter().filter_map(|id| location_id.get(id).copied()).collect();
            for l in &mut smp.label {
                l.key = remap(&mut out, l.key);
                l.str = remap(&mut out, l.str);
                l.num_unit = remap(&mut out, l.num_unit);
            }
            out.sample.push(smp);
        }
        for &c in &p.comment {
            let c = remap(&mut out, c);
            if !out.comment.contains(&c) {
                out.comment.push(c);
            }
        }
        if p.time_nanos != 0 {
            start = start.min(p.time_nanos);
            end = end.max(p.time_nanos.saturating_add(p.duration_nanos));
        }
    }
    out.sample_type = first
        .sample_type
        .iter()
        .map(|v| ValueType {
            r#type: intern(&mut out, &first.string_table[v.r#type as usize]),
            unit: intern(&mut out, &first.string_table[v.unit as usize]),
        })
        .collect();
    if let Some(pt) = &first.period_type {
        let (t, u) = (first.string_table[pt.r#type as usize].clone(), first.string_table[pt.unit as usize].clone());
        out.period_type = Some(ValueType { r#type: intern(&mut out, &t), unit: intern(&mut out, &u) });
    }
    out.period = first.period;
    let default = first.string_table.get(first.default_sample_type as usize).cloned().unwrap_or_default();
    out.default_sample_type = intern(&mut out, &default);
    if start != i64::MAX {
        out.time_nanos = start;
        out.duration_nanos = end - start;
    }
    Ok(out)
}

/// `(profile.pb.gz, growth.pb.gz)` bytes of an analysed recording: the hook of
/// [`crate::report::render_all`].
pub fn profiles(rec: &Recording, a: &Analysis) -> (Vec<u8>, Vec<u8>) {
    (encode_gz(&heap_profile(rec, a)), encode_gz(&growth_profile(rec, a)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analyze::fixtures::*;
    use crate::analyze::{AnalyzeOptions, analyze};

    fn string(p: &Profile, i: i64) -> &str {
        &p.string_table[i as usize]
    }

    /// Leaf function name of a sample.
    fn leaf(p: &Profile, s: &Sample) -> String {
        let loc = &p.location[s.location_id[0] as usize - 1];
        let f = &p.function[loc.line[0].function_id as usize - 1];
        string(p, f.name).to_string()
    }

    /// Function names of a sample, leaf first, inlined lines expanded.
    fn names(p: &Profile, s: &Sample) -> Vec<String> {
        s.location_id
            .iter()
            .flat_map(|&l| p.location[l as usize - 1].line.iter())
            .map(|l| string(p, p.function[l.function_id as usize - 1].name).to_string())
            .collect()
    }

    #[test]
    fn heap_profile_matches_the_analysis() {
        let rec = mixed();
        let a = analyze(&rec, &AnalyzeOptions::default());
        let p = decode(&encode_gz(&heap_profile(&rec, &a))).unwrap();
        let types: Vec<(&str, &str)> =
            p.sample_type.iter().map(|v| (string(&p, v.r#type), string(&p, v.unit))).collect();
        assert_eq!(
            types,
            [
                ("alloc_objects", "count"),
                ("alloc_space", "bytes"),
                ("inuse_objects", "count"),
                ("inuse_space", "bytes")
            ]
        );
        assert_eq!(string(&p, p.default_sample_type), "inuse_space");
        let pt = p.period_type.as_ref().unwrap();
        assert_eq!((string(&p, pt.r#type), string(&p, pt.unit), p.period), ("space", "bytes", 1));
        assert_eq!(p.string_table[0], "");
        // Every site with values is a sample with the analysis' figures.
        for site in a.sites.iter().filter(|s| s.allocated_bytes > 0 || s.live_bytes > 0) {
            let want = vec![
                site.allocations as i64,
                site.allocated_bytes as i64,
                site.live_allocations as i64,
                site.live_bytes as i64,
            ];
            let sample = p.sample.iter().find(|s| s.value == want);
            assert!(sample.is_some(), "no sample {want:?} for {}", site.function);
            let sample = sample.unwrap();
            let labels: HashMap<&str, &str> =
                sample.label.iter().filter(|l| l.str != 0).map(|l| (string(&p, l.key), string(&p, l.str))).collect();
            assert_eq!(labels["class"], site.class.as_str());
            assert_eq!(labels["memory_kind"], site.memory_kind.as_str());
            assert_eq!(labels["runtime"], "native");
            assert!(sample.label.iter().any(|l| string(&p, l.key) == "pid" && l.num == rec.target.pid as i64));
            // Leaf first, from the culprit: the allocator's frames are left out.
            let from = site.culprit_frame.unwrap();
            assert_eq!(names(&p, sample).first().map(String::as_str), site.frames[from].function.as_deref());
            assert_eq!(names(&p, sample).len(), site.frames.len() - from);
            assert!(!names(&p, sample).iter().any(|n| n == "malloc"));
        }
        // The inlined Session::key is a second Line of Session::remember's location.
        let leak = p.sample.iter().find(|s| names(&p, s).iter().any(|n| n == "Session::key")).unwrap();
        let loc = leak
            .location_id
            .iter()
            .map(|&l| &p.location[l as usize - 1])
            .find(|l| l.line.len() == 2)
            .expect("a location with an inlined line");
        assert_eq!(string(&p, p.function[loc.line[0].function_id as usize - 1].name), "Session::key");
        assert_eq!(string(&p, p.function[loc.line[0].function_id as usize - 1].filename), "src/session.h");
        assert_eq!(loc.line[0].line, 12);
        // Mappings cover their locations; ids are 1..n.
        for (i, m) in p.mapping.iter().enumerate() {
            assert_eq!(m.id, i as u64 + 1);
            assert!(m.has_functions);
        }
        for l in &p.location {
            if l.mapping_id != 0 {
                let m = &p.mapping[l.mapping_id as usize - 1];
                assert!(m.memory_start <= l.address && l.address < m.memory_limit);
            }
        }
        assert_eq!(leaf(&p, &p.sample[0]), a.sites[0].function);
    }

    #[test]
    fn recorded_mappings_give_offsets_and_build_ids() {
        let mut rec = mixed();
        // Every object of the fixture's frames, each mapped at a fixed range around its frames.
        let mut objects: Vec<(String, u64, u64)> = Vec::new();
        for st in &rec.stacks {
            for f in &st.frames {
                if let Some(o) = &f.object {
                    match objects.iter_mut().find(|(p, _, _)| p == o) {
                        Some(e) => {
                            e.1 = e.1.min(f.addr);
                            e.2 = e.2.max(f.addr);
                        }
                        None => objects.push((o.clone(), f.addr, f.addr)),
                    }
                }
            }
        }
        rec.mappings = objects
            .iter()
            .map(|(p, lo, hi)| crate::recording::ObjectMapping {
                start: lo & !0xfff,
                end: (hi | 0xfff) + 1,
                offset: 0x1000,
                path: p.clone(),
                build_id: Some(format!("{:040x}", p.len() * 7919 + *lo as usize)),
                ..Default::default()
            })
            .collect();
        let a = analyze(&rec, &AnalyzeOptions::default());
        let p = heap_profile(&rec, &a);
        assert!(!p.mapping.is_empty());
        for m in &p.mapping {
            let k = rec
                .mappings
                .iter()
                .find(|k| k.start == m.memory_start && k.path == string(&p, m.filename))
                .expect("a recorded mapping");
            assert_eq!((m.memory_limit, m.file_offset), (k.end, 0x1000));
            assert_eq!(string(&p, m.filename), k.path);
            assert_eq!(string(&p, m.build_id), k.build_id.as_deref().unwrap());
        }
        for l in &p.location {
            if l.mapping_id != 0 {
                let m = &p.mapping[l.mapping_id as usize - 1];
                assert!(m.memory_start <= l.address && l.address <= m.memory_limit);
            }
        }
    }

    #[test]
    fn growth_profile_holds_the_steady_window_gain() {
        let rec = mixed();
        let a = analyze(&rec, &AnalyzeOptions::default());
        let p = decode(&encode_gz(&growth_profile(&rec, &a))).unwrap();
        assert_eq!(string(&p, p.default_sample_type), "growth_space");
        // The leak (1000 B/s) is the only site that grows over the steady window (30 s → 60 s).
        let grown: Vec<(String, i64)> = p.sample.iter().map(|s| (names(&p, s).join(";"), s.value[1])).collect();
        let leak = grown.iter().find(|(n, _)| n.contains("Session::key")).expect("the leak");
        assert_eq!(a.steady_from_s, 30.0);
        assert_eq!(leak.1, 30 * 1000, "{grown:?}");
        assert!(!grown.iter().any(|(n, _)| n.contains("Cache::fill")), "{grown:?}");
    }

    #[test]
    fn sampled_period_and_lost_stacks() {
        let mut rec = mixed();
        rec.mode = crate::recording::Mode::Sampled;
        rec.sample_bytes = Some(524288);
        rec.stacks.push(crate::recording::Stack {
            id: 99,
            kind: crate::recording::StackKind::Malloc,
            frames: vec![],
            lost: true,
            truncated: None,
            shared: false,
        });
        for c in &mut rec.checkpoints {
            c.sites.push(crate::recording::SiteSample {
                stack: 99,
                alloc_bytes: 777,
                alloc_count: 1,
                ..Default::default()
            });
        }
        let a = analyze(&rec, &AnalyzeOptions::default());
        let p = heap_profile(&rec, &a);
        assert_eq!(p.period, 524288);
        let lost = p.sample.iter().find(|s| leaf(&p, s) == "[stack lost]").unwrap();
        assert_eq!(lost.value, vec![1, 777, 1, 777]);
    }

    #[test]
    fn merged_profile_keeps_every_process_apart() {
        let one = mixed();
        let mut two = mixed();
        two.target.pid = 5151;
        let p1 = heap_profile(&one, &analyze(&one, &AnalyzeOptions::default()));
        let p2 = heap_profile(&two, &analyze(&two, &AnalyzeOptions::default()));
        let m = decode(&encode_gz(&merge(&[p1.clone(), p2.clone()]).unwrap())).unwrap();
        assert_eq!(m.sample.len(), p1.sample.len() + p2.sample.len());
        assert_eq!(m.mapping.len(), p1.mapping.len() + p2.mapping.len());
        assert_eq!(string(&m, m.default_sample_type), "inuse_space");
        assert_eq!(m.sample_type.len(), 4);
        // Every sample's stack and values are those of its own process (found by its pid label).
        for (pid, p) in [(one.target.pid, &p1), (5151, &p2)] {
            let mine: Vec<&Sample> = m
                .sample
                .iter()
                .filter(|s| s.label.iter().any(|l| string(&m, l.key) == "pid" && l.num == pid as i64))
                .collect();
            assert_eq!(mine.len(), p.sample.len(), "pid {pid}");
            for (a, b) in mine.iter().zip(&p.sample) {
                assert_eq!(a.value, b.value);
                assert_eq!(names(&m, a), names(p, b));
                for &l in &a.location_id {
                    let loc = &m.location[l as usize - 1];
                    assert_eq!(loc.id, l);
                    if loc.mapping_id != 0 {
                        let map = &m.mapping[loc.mapping_id as usize - 1];
                        assert!(map.memory_start <= loc.address && loc.address <= map.memory_limit);
                    }
                }
            }
        }
        // Profiles of different kinds are not merged.
        let g = growth_profile(&one, &analyze(&one, &AnalyzeOptions::default()));
        assert!(merge(&[p1, g]).unwrap_err().to_string().contains("sample types"));
        assert!(merge(&[]).is_err());
    }
}
