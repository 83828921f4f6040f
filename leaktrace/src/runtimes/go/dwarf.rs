//! The Go types and package-level variables of an executable, from its DWARF, for the typed
//! walk of the Go heap ([`super::walk`]): every type DIE the Go linker writes (base types,
//! pointers, structures — slices, strings and interfaces are structures with a Go kind —,
//! arrays, typedefs — maps and channels are typedefs of pointers to the runtime's `hash<K,V>`
//! and `hchan<T>` —, functions), reduced to the shape the walk needs ([`Shape`]), and every
//! CU-level `DW_TAG_variable` with a `DW_OP_addr` location (`main.sessions`).
//!
//! Go's own attributes: `DW_AT_go_kind` (0x2900), `DW_AT_go_elem` (0x2902) and
//! `DW_AT_go_runtime_type` (0x2904: the type's descriptor, an offset from `runtime.types`, or
//! its address), through which an interface's dynamic type word is named.
//!
//! The DWARF is the target's to forge: every count, size and offset is bounded, and a type that
//! does not hold together is walked as holding no pointers.

use std::collections::HashMap;

use std::io::Read as _;

use object::{Object as _, ObjectSection as _, ObjectSegment as _, ObjectSymbol as _};

/// Largest DWARF section decompressed (a Go executable's `.debug_info` is a few MiB): the
/// ELF's own header, which says how large it is, is the target's to forge.
const MAX_DWARF_SECTION: u64 = 256 << 20;
/// Type DIEs read at most.
const MAX_TYPES: usize = 2_000_000;
/// Package variables kept at most.
const MAX_VARIABLES: usize = 200_000;
/// Largest type believed (bytes): a larger one is walked as holding no pointers.
pub const MAX_TYPE_SIZE: u64 = 1 << 30;
/// Nesting of structures and arrays followed when computing shapes.
const MAX_NESTING: u32 = 64;

const DW_AT_GO_KIND: gimli::DwAt = gimli::DwAt(0x2900);
const DW_AT_GO_ELEM: gimli::DwAt = gimli::DwAt(0x2902);
const DW_AT_GO_RUNTIME_TYPE: gimli::DwAt = gimli::DwAt(0x2904);
/// `reflect.Kind` values the Go linker writes in `DW_AT_go_kind`.
const KIND_CHAN: u8 = 18;
const KIND_INTERFACE: u8 = 20;
const KIND_SLICE: u8 = 23;
const KIND_STRING: u8 = 24;

/// Index of a type in [`Types::nodes`]; [`NONE`]: unknown (not followed).
pub type TypeId = u32;
pub const NONE: TypeId = u32::MAX;

/// What the walk does with a value of a type.
#[derive(Clone, Debug, PartialEq)]
pub enum Shape {
    /// Holds no pointer the walk follows (numbers, `unsafe.Pointer`, functions, bad types).
    NoPtr,
    /// A pointer to one value of the type.
    Ptr(TypeId),
    /// `string`: `str` pointer, `len` (bytes, no pointers).
    Str,
    /// `[]T`: `array`, `len`, `cap`.
    Slice(TypeId),
    /// `interface {}` (`eface`: type word first) or a non-empty interface (`iface`: itab first).
    Iface { eface: bool },
    /// `chan T`: a pointer to `hchan<T>` whose buffer holds T.
    Chan { hchan: TypeId, elem: TypeId },
    /// A structure: its fields that hold pointers (offset, type).
    Struct(Vec<(u64, TypeId)>),
    /// `[N]T` holding pointers.
    Array { elem: TypeId, count: u64 },
    /// The runtime's `hash<K,V>` (a map's `hmap`).
    Hash(HashLayout),
    /// The runtime's `bucket<K,V>`.
    Bucket(BucketLayout),
    /// The runtime's `hchan<T>` (its buffer is walked from [`Shape::Chan`]).
    Hchan { qcount: u64, dataqsiz: u64, buf: u64 },
}

/// Where `hmap`'s fields are (bytes from its start) and its buckets' type.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HashLayout {
    pub count: u64,
    pub flags: u64,
    pub b: u64,
    pub buckets: u64,
    pub oldbuckets: u64,
    pub bucket: TypeId,
}

/// Where a bucket's fields are: `tophash [8]uint8`, `keys [8]K`, `values [8]V`, `overflow`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BucketLayout {
    pub tophash: u64,
    pub keys: u64,
    pub key: TypeId,
    pub key_size: u64,
    pub values: u64,
    pub value: TypeId,
    pub value_size: u64,
    pub overflow: u64,
}

/// One type DIE as read.
#[derive(Clone, Debug, Default)]
struct Raw {
    tag: u16,
    name: String,
    size: u64,
    target: Option<u64>,
    go_kind: u8,
    elem: Option<u64>,
    count: u64,
    /// Structure members: name, offset, type (a DIE offset).
    members: Vec<(String, u64, u64)>,
}

/// The executable's types and package variables.
pub struct Types {
    pub names: Vec<String>,
    pub sizes: Vec<u64>,
    pub shapes: Vec<Shape>,
    /// Runtime type descriptor (offset from `runtime.types`) → type.
    pub by_runtime_type: HashMap<u64, TypeId>,
    /// Package variables: name, link address, type.
    pub variables: Vec<(String, u64, TypeId)>,
    /// `runtime.types` and `runtime.etypes` as linked.
    pub types_range: (u64, u64),
    /// A type DIE's offset in `.debug_info` → type (the locals' types, [`super::stack`]).
    pub by_die: HashMap<u64, TypeId>,
}

impl Types {
    /// The runtime type descriptor at `addr` (as loaded, minus the load bias) named.
    pub fn runtime_type(&self, addr: u64) -> TypeId {
        let (lo, hi) = self.types_range;
        if addr < lo || addr >= hi {
            return NONE;
        }
        self.by_runtime_type.get(&(addr - lo)).copied().unwrap_or(NONE)
    }

    /// A type's name as Go writes it (`[]uint8` as `[]byte`).
    pub fn go_name(&self, t: TypeId) -> String {
        self.names.get(t as usize).map_or_else(|| "?".into(), |n| n.replace("[]uint8", "[]byte"))
    }

    pub fn size(&self, t: TypeId) -> u64 {
        self.sizes.get(t as usize).copied().unwrap_or(0)
    }

    pub fn shape(&self, t: TypeId) -> &Shape {
        self.shapes.get(t as usize).unwrap_or(&Shape::NoPtr)
    }
}

/// Read the types and package variables of `file`; an error that says why when it has no
/// DWARF (a binary built with `-ldflags=-w` or `-s -w`).
pub fn read(file: &object::File<'_>) -> Result<Types, String> {
    if section(file, ".debug_info").is_empty() {
        return Err("the executable has no DWARF (built with -ldflags='-s -w' or '-w')".into());
    }
    let owned =
        gimli::DwarfSections::load(|id| Ok::<_, gimli::Error>(section(file, id.name()))).map_err(|e| e.to_string())?;
    let dwarf = owned.borrow(|s| gimli::EndianSlice::new(s, gimli::LittleEndian));
    let err = |e: gimli::Error| format!("DWARF: {e}");
    let mut raws: Vec<Raw> = Vec::new();
    let mut index: HashMap<u64, TypeId> = HashMap::new();
    let mut rtypes: Vec<(u64, u64)> = Vec::new();
    let mut vars: Vec<(String, u64, u64)> = Vec::new();
    let mut units = dwarf.units();
    while let Some(header) = units.next().map_err(err)? {
        let unit = dwarf.unit(header).map_err(err)?;
        let global = |o: gimli::UnitOffset| o.to_debug_info_offset(&unit.header).map(|d| d.0 as u64);
        let reference = |v: Option<gimli::AttributeValue<_>>| match v {
            Some(gimli::AttributeValue::UnitRef(o)) => global(o),
            Some(gimli::AttributeValue::DebugInfoRef(d)) => Some(d.0 as u64),
            _ => None,
        };
        let name_of = |e: &gimli::DebuggingInformationEntry<_>| {
            e.attr_value(gimli::DW_AT_name)
                .and_then(|v| dwarf.attr_string(&unit, v).ok())
                .map(|s| String::from_utf8_lossy(s.slice()).into_owned())
                .unwrap_or_default()
        };
        let mut entries = unit.entries();
        // The type whose members / subranges are being read, and its depth.
        let mut open: Option<(usize, isize)> = None;
        while let Some(e) = entries.next_dfs().map_err(err)? {
            if let Some((i, d)) = open {
                if e.depth() == d + 1 {
                    match e.tag() {
                        gimli::DW_TAG_member => {
                            let at = e.attr_value(gimli::DW_AT_data_member_location).and_then(|v| v.udata_value());
                            if let (Some(at), Some(t)) = (at, reference(e.attr_value(gimli::DW_AT_type))) {
                                raws[i].members.push((name_of(e), at, t));
                            }
                        }
                        gimli::DW_TAG_subrange_type => {
                            let n = e.attr_value(gimli::DW_AT_count).and_then(|v| v.udata_value()).or_else(|| {
                                e.attr_value(gimli::DW_AT_upper_bound).and_then(|v| v.udata_value()).map(|u| u + 1)
                            });
                            raws[i].count = n.unwrap_or(0);
                        }
                        _ => {}
                    }
                    continue;
                }
                if e.depth() > d + 1 {
                    continue;
                }
                open = None;
            }
            let tag = e.tag();
            if tag == gimli::DW_TAG_variable && e.depth() == 1 {
                let addr = match e.attr_value(gimli::DW_AT_location) {
                    Some(gimli::AttributeValue::Exprloc(x)) => {
                        let b = x.0.slice();
                        (b.len() == 9 && b[0] == gimli::DW_OP_addr.0)
                            .then(|| u64::from_le_bytes(b[1..9].try_into().unwrap_or_default()))
                    }
                    _ => None,
                };
                if let (Some(a), Some(t)) = (addr, reference(e.attr_value(gimli::DW_AT_type)))
                    && vars.len() < MAX_VARIABLES
                {
                    vars.push((name_of(e), a, t));
                }
                continue;
            }
            if !matches!(
                tag,
                gimli::DW_TAG_base_type
                    | gimli::DW_TAG_pointer_type
                    | gimli::DW_TAG_structure_type
                    | gimli::DW_TAG_array_type
                    | gimli::DW_TAG_typedef
                    | gimli::DW_TAG_subroutine_type
            ) || raws.len() >= MAX_TYPES
            {
                continue;
            }
            let Some(off) = global(e.offset()) else { continue };
            let raw = Raw {
                tag: tag.0,
                name: name_of(e),
                size: e.attr_value(gimli::DW_AT_byte_size).and_then(|v| v.udata_value()).unwrap_or(0),
                target: reference(e.attr_value(gimli::DW_AT_type)),
                go_kind: e.attr_value(DW_AT_GO_KIND).and_then(|v| v.udata_value()).unwrap_or(0) as u8,
                elem: reference(e.attr_value(DW_AT_GO_ELEM)),
                count: 0,
                members: Vec::new(),
            };
            let id = raws.len() as TypeId;
            if let Some(gimli::AttributeValue::Addr(a)) = e.attr_value(DW_AT_GO_RUNTIME_TYPE)
                && a != 0
            {
                rtypes.push((a, off));
            }
            index.insert(off, id);
            raws.push(raw);
            if matches!(tag, gimli::DW_TAG_structure_type | gimli::DW_TAG_array_type) {
                open = Some((id as usize, e.depth()));
            }
        }
    }
    let (mut types_lo, mut types_hi) = (0, 0);
    for s in file.symbols() {
        match s.name() {
            Ok("runtime.types") => types_lo = s.address(),
            Ok("runtime.etypes") => types_hi = s.address(),
            _ => {}
        }
    }
    let mut by_runtime_type = HashMap::new();
    for (a, off) in rtypes {
        let rel = if a >= types_lo && a < types_hi { a - types_lo } else { a };
        if let Some(&id) = index.get(&off) {
            by_runtime_type.entry(rel).or_insert(id);
        }
    }
    let id_of = |o: Option<u64>| o.and_then(|o| index.get(&o).copied()).unwrap_or(NONE);
    let variables = vars.into_iter().map(|(n, a, t)| (n, a, id_of(Some(t)))).collect();
    let mut t = Types {
        names: raws.iter().map(|r| r.name.clone()).collect(),
        sizes: vec![0; raws.len()],
        shapes: vec![Shape::NoPtr; raws.len()],
        by_runtime_type,
        variables,
        types_range: (types_lo, types_hi.max(types_lo)),
        by_die: HashMap::new(),
    };
    let mut shaper = Shaper { raws: &raws, id_of: &id_of, done: vec![false; raws.len()] };
    for i in 0..raws.len() {
        shaper.shape(&mut t, i as TypeId, 0);
    }
    t.by_die = index;
    Ok(t)
}

/// Computes [`Types::shapes`] and sizes (typedefs resolved), once per type.
struct Shaper<'a> {
    raws: &'a [Raw],
    id_of: &'a dyn Fn(Option<u64>) -> TypeId,
    done: Vec<bool>,
}

impl Shaper<'_> {
    /// The shape of `id` (computing its parts first); `nesting` bounds the recursion.
    fn shape(&mut self, t: &mut Types, id: TypeId, nesting: u32) -> bool {
        let i = id as usize;
        if i >= self.raws.len() || nesting > MAX_NESTING {
            return false;
        }
        if self.done[i] {
            return t.shapes[i] != Shape::NoPtr;
        }
        self.done[i] = true;
        let raws = self.raws;
        let r = &raws[i];
        let target = (self.id_of)(r.target);
        let (size, shape) = match r.tag {
            x if x == gimli::DW_TAG_pointer_type.0 => {
                (8, if target == NONE { Shape::NoPtr } else { Shape::Ptr(target) })
            }
            x if x == gimli::DW_TAG_subroutine_type.0 => (8, Shape::NoPtr),
            x if x == gimli::DW_TAG_typedef.0 => {
                self.shape(t, target, nesting + 1);
                let size = t.size(target);
                let shape = match (r.go_kind, t.shape(target)) {
                    (KIND_CHAN, Shape::Ptr(h)) => Shape::Chan { hchan: *h, elem: (self.id_of)(r.elem) },
                    (KIND_INTERFACE, _) => {
                        Shape::Iface { eface: t.names.get(target as usize).is_some_and(|n| n == "runtime.eface") }
                    }
                    (_, s) => s.clone(),
                };
                if let Shape::Chan { elem, .. } = shape {
                    self.shape(t, elem, nesting + 1);
                }
                (size, shape)
            }
            x if x == gimli::DW_TAG_array_type.0 => {
                let has = self.shape(t, target, nesting + 1);
                let size = r.size.max(t.size(target).saturating_mul(r.count));
                (size, if has && r.count > 0 { Shape::Array { elem: target, count: r.count } } else { Shape::NoPtr })
            }
            x if x == gimli::DW_TAG_structure_type.0 => (r.size, self.structure(t, id, nesting)),
            _ => (r.size, Shape::NoPtr),
        };
        let ok = size <= MAX_TYPE_SIZE;
        t.sizes[i] = if ok { size } else { 0 };
        t.shapes[i] = if ok { shape } else { Shape::NoPtr };
        t.shapes[i] != Shape::NoPtr
    }

    fn structure(&mut self, t: &mut Types, id: TypeId, nesting: u32) -> Shape {
        let (raws, id_of) = (self.raws, self.id_of);
        let r = &raws[id as usize];
        let member = |n: &str| r.members.iter().find(|m| m.0 == n).map(|m| (m.1, id_of(Some(m.2))));
        match r.go_kind {
            KIND_STRING => return Shape::Str,
            KIND_SLICE => {
                let elem = id_of(r.elem);
                self.shape(t, elem, nesting + 1);
                return Shape::Slice(elem);
            }
            _ => {}
        }
        if r.name.starts_with("hash<")
            && let (Some(c), Some(f), Some(b), Some((bk, bt)), Some(o)) =
                (member("count"), member("flags"), member("B"), member("buckets"), member("oldbuckets"))
        {
            self.shape(t, bt, nesting + 1);
            if let Shape::Ptr(bucket) = *t.shape(bt) {
                self.shape(t, bucket, nesting + 1);
                return Shape::Hash(HashLayout {
                    count: c.0,
                    flags: f.0,
                    b: b.0,
                    buckets: bk,
                    oldbuckets: o.0,
                    bucket,
                });
            }
            return Shape::NoPtr;
        }
        if r.name.starts_with("bucket<")
            && let (Some(th), Some((k, kt)), Some((v, vt)), Some(o)) =
                (member("tophash"), member("keys"), member("values"), member("overflow"))
        {
            for a in [kt, vt] {
                self.shape(t, a, nesting + 1);
            }
            let elem = |a: TypeId, t: &Types| match t.shape(a) {
                Shape::Array { elem, .. } => *elem,
                _ => NONE,
            };
            let (key, value) = (elem(kt, t), elem(vt, t));
            let (key_size, value_size) = (t.size(kt) / 8, t.size(vt) / 8);
            return Shape::Bucket(BucketLayout {
                tophash: th.0,
                keys: k,
                key,
                key_size,
                values: v,
                value,
                value_size,
                overflow: o.0,
            });
        }
        if r.name.starts_with("hchan<")
            && let (Some(q), Some(d), Some(b)) = (member("qcount"), member("dataqsiz"), member("buf"))
        {
            return Shape::Hchan { qcount: q.0, dataqsiz: d.0, buf: b.0 };
        }
        let members: Vec<(u64, TypeId)> = r.members.iter().map(|m| (m.1, id_of(Some(m.2)))).collect();
        let mut fields = Vec::new();
        for (at, ty) in members {
            if self.shape(t, ty, nesting + 1) && at.saturating_add(t.size(ty)) <= r.size {
                fields.push((at, ty));
            }
        }
        if fields.is_empty() { Shape::NoPtr } else { Shape::Struct(fields) }
    }
}

/// A position-independent executable's load bias: where its first segment is mapped (the exe's
/// mapping at file offset 0, /proc/PID/maps) minus its link address.
pub(crate) fn load_bias(pid: u32, file: &object::File<'_>) -> Result<u64, String> {
    let link = file.segments().map(|s| s.address()).min().unwrap_or(0) & !0xfff;
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).map_err(|e| e.to_string())?;
    let exe = exe.to_string_lossy();
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).map_err(|e| e.to_string())?;
    maps.lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() >= 6 && f[2] == "00000000" && f[5] == exe).then(|| f[0].split('-').next())?
        })
        .and_then(|s| u64::from_str_radix(s, 16).ok())
        .map(|start| start.wrapping_sub(link))
        .ok_or_else(|| "the executable's mapping is not in /proc/PID/maps".into())
}

/// A DWARF section's bytes, decompressed when the ELF section is `SHF_COMPRESSED` (zlib).
pub(crate) fn section<'a>(file: &object::File<'a>, name: &str) -> std::borrow::Cow<'a, [u8]> {
    let Some(s) = file.section_by_name(name) else { return std::borrow::Cow::Borrowed(&[]) };
    let Ok(c) = s.compressed_data() else { return std::borrow::Cow::Borrowed(&[]) };
    match c.format {
        object::CompressionFormat::None => std::borrow::Cow::Borrowed(c.data),
        object::CompressionFormat::Zlib => {
            // The size the header claims is believed only up to what a section may be; the
            // decompressed bytes must be exactly that many.
            let claimed = c.uncompressed_size;
            if claimed > MAX_DWARF_SECTION {
                return std::borrow::Cow::Borrowed(&[]);
            }
            let mut out = Vec::with_capacity((claimed as usize).min(c.data.len().saturating_mul(4)));
            match flate2::read::ZlibDecoder::new(c.data).take(claimed + 1).read_to_end(&mut out) {
                Ok(n) if n as u64 == claimed => std::borrow::Cow::Owned(out),
                _ => std::borrow::Cow::Borrowed(&[]),
            }
        }
        _ => std::borrow::Cow::Borrowed(&[]),
    }
}

/// The target's memory, as the walks read it ([`super::walk`], [`super::stack`]).
pub trait Memory {
    /// Fill `out` with `len` bytes at `addr`; false when they cannot be read.
    fn read(&mut self, addr: u64, len: usize, out: &mut Vec<u8>) -> bool;
    /// Bytes read from the target so far.
    fn bytes_read(&self) -> u64;
}

/// Package variables and functions whose locals are walked: all but the runtime's own (its
/// heap metadata, its goroutines) and the toolchain's internal packages.
pub fn is_program_root(name: &str) -> bool {
    !["runtime.", "runtime/", "internal/", "go.", "go:", "type.", "type:"].iter().any(|p| name.starts_with(p))
}

/// A structure's byte size and its members' offsets by name.
pub(crate) type Layout = (u64, HashMap<String, u64>);

/// Byte size and member offsets of the structures `names` (Go's names: `runtime.g`), from the
/// executable's DWARF; a structure not found is absent from the map.
pub(crate) fn structs(file: &object::File<'_>, names: &[&str]) -> Result<HashMap<String, Layout>, String> {
    let owned =
        gimli::DwarfSections::load(|id| Ok::<_, gimli::Error>(section(file, id.name()))).map_err(|e| e.to_string())?;
    let dwarf = owned.borrow(|s| gimli::EndianSlice::new(s, gimli::LittleEndian));
    let err = |e: gimli::Error| format!("DWARF: {e}");
    let name_of = |unit: &gimli::Unit<_>, e: &gimli::DebuggingInformationEntry<_>| {
        e.attr_value(gimli::DW_AT_name)
            .and_then(|v| dwarf.attr_string(unit, v).ok())
            .map(|s| String::from_utf8_lossy(s.slice()).into_owned())
    };
    let mut found = HashMap::new();
    let mut units = dwarf.units();
    while let Some(header) = units.next().map_err(err)? {
        let unit = dwarf.unit(header).map_err(err)?;
        let mut entries = unit.entries();
        while let Some(e) = entries.next_dfs().map_err(err)? {
            if e.tag() != gimli::DW_TAG_structure_type {
                continue;
            }
            let Some(name) = name_of(&unit, e).filter(|n| names.contains(&n.as_str()) && !found.contains_key(n)) else {
                continue;
            };
            // A C unit that only names the structure declares it (no members): not its layout.
            if e.attr_value(gimli::DW_AT_declaration).is_some() {
                continue;
            }
            let size = e.attr_value(gimli::DW_AT_byte_size).and_then(|v| v.udata_value()).unwrap_or(0);
            let depth = e.depth();
            let mut members = HashMap::new();
            while let Some(m) = entries.next_dfs().map_err(err)? {
                if m.depth() <= depth {
                    break;
                }
                if m.tag() != gimli::DW_TAG_member || m.depth() != depth + 1 {
                    continue;
                }
                let at = m.attr_value(gimli::DW_AT_data_member_location).and_then(|v| v.udata_value());
                if let (Some(n), Some(at)) = (name_of(&unit, m), at) {
                    members.insert(n, at);
                }
            }
            found.insert(name, (size, members));
            if found.len() == names.len() {
                return Ok(found);
            }
        }
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runtime_types_named_by_offset_only_inside_the_section() {
        let t = Types {
            names: vec!["[]uint8".into()],
            sizes: vec![24],
            shapes: vec![Shape::Slice(NONE)],
            by_runtime_type: HashMap::from([(0x6560, 0)]),
            variables: Vec::new(),
            types_range: (0x488000, 0x4c0ba3),
            by_die: HashMap::new(),
        };
        assert_eq!(t.runtime_type(0x488000 + 0x6560), 0);
        assert_eq!(t.runtime_type(0x6560), NONE);
        assert_eq!(t.runtime_type(0x4c0ba3), NONE);
        assert_eq!(t.go_name(0), "[]byte");
        assert_eq!(t.go_name(7), "?");
    }
}
