//! Reading one object: its type, its size, and the objects it refers to, each with the edge's
//! name in Python terms ([`Label`]). Layouts from [`super::layout`].

use super::layout::{self as L, HeapLayout, Managed, flags};
use super::mem::Mem;

/// What leaktrace decodes of a type's instances.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Dict,
    List,
    Tuple,
    Set,
    Func,
    Cell,
    Method,
    Deque,
    Str,
    Bytes,
    Long,
    Type,
    /// Objects that refer to no other object (float, complex): nothing followed.
    Atomic,
    /// Anything else: only its instance dict, and for containers the words of its fixed part
    /// that point at a container of the collector's lists.
    Other,
}

/// A type object, read once.
#[derive(Clone, Debug)]
pub struct TypeInfo {
    pub name: std::rc::Rc<str>,
    pub basicsize: u64,
    pub itemsize: u64,
    pub flags: u64,
    pub dictoffset: i64,
    pub kind: Kind,
    /// `ht_cached_keys` of a heap type (3.11+): the keys of its instances' managed values.
    pub cached_keys: u64,
}

/// An edge: how the referring object holds the referent. `u32` payloads of the string kinds
/// are ids of [`super::walk::Strs`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Label {
    Root(u32),
    /// A live frame's local variable as a root ([`super::frames`]): the pattern's text
    /// ("local `cache` of worker()") and the example's (with the thread and the line).
    Local(u32, u32),
    Attr(u32),
    Key(u32),
    Index(u32),
    Defaults(u32),
    KwDefaults(u32),
    Closure(u32),
    CellContents,
    Func,
    SelfRef,
    DictOf,
    Field(u32),
    SetItem,
    KeyObj,
    /// A generalised index or key (`[…]`), in patterns only.
    Any,
}

impl Label {
    /// The label in a pattern: keys, indices and set members generalised.
    pub fn general(self) -> Label {
        match self {
            Label::Key(_) | Label::Index(_) | Label::SetItem => Label::Any,
            Label::Local(p, _) => Label::Local(p, p),
            l => l,
        }
    }
}

/// Read the type object at `addr`. None: not a readable type.
pub fn read_type(mem: &mut Mem, l: &HeapLayout, addr: u64) -> Option<TypeInfo> {
    let b = mem.bytes(addr, 296)?;
    let at = |o: u64| u64::from_le_bytes(b[o as usize..o as usize + 8].try_into().unwrap());
    let basicsize = at(L::TP_BASICSIZE);
    if !(8..=1 << 20).contains(&basicsize) {
        return None;
    }
    let mut name = mem.cstr(at(L::TP_NAME), 200)?;
    let flags = at(L::TP_FLAGS);
    let mut cached_keys = 0;
    if flags & flags::HEAPTYPE != 0 {
        if l.ht_cached_keys != 0 {
            cached_keys = mem.u64(addr + l.ht_cached_keys).unwrap_or(0);
        }
        let items = dict_items(mem, l, at(L::TP_DICT)).map(|(i, _)| i).unwrap_or_default();
        let module = items
            .iter()
            .find(|(k, _)| read_str(mem, l, *k, 20).as_deref() == Some("__module__"))
            .and_then(|&(_, v)| read_str(mem, l, v, 200));
        // Extension types' names already carry their module (`functools._lru_list_elem`).
        if let Some(m) = module.filter(|m| m != "builtins" && !name.contains('.')) {
            name = format!("{m}.{name}");
        }
    }
    let kind = if flags & flags::DICT_SUBCLASS != 0 {
        Kind::Dict
    } else if flags & flags::LIST_SUBCLASS != 0 {
        Kind::List
    } else if flags & flags::TUPLE_SUBCLASS != 0 {
        Kind::Tuple
    } else if flags & flags::UNICODE_SUBCLASS != 0 {
        Kind::Str
    } else if flags & flags::BYTES_SUBCLASS != 0 {
        Kind::Bytes
    } else if flags & flags::LONG_SUBCLASS != 0 {
        Kind::Long
    } else if flags & flags::TYPE_SUBCLASS != 0 {
        Kind::Type
    } else {
        match name.as_str() {
            "function" => Kind::Func,
            "cell" => Kind::Cell,
            "method" => Kind::Method,
            "set" | "frozenset" => Kind::Set,
            "collections.deque" => Kind::Deque,
            "float" | "complex" | "NoneType" | "ellipsis" | "NotImplementedType" => Kind::Atomic,
            _ => Kind::Other,
        }
    };
    Some(TypeInfo {
        name: name.into(),
        basicsize,
        itemsize: at(L::TP_ITEMSIZE),
        flags,
        dictoffset: at(L::TP_DICTOFFSET) as i64,
        kind,
        cached_keys,
    })
}

/// The (key, value) pairs of the dict at `dict` and the bytes of its out-of-line tables
/// (keys, unless shared, and values). None: unreadable.
pub fn dict_items(mem: &mut Mem, l: &HeapLayout, dict: u64) -> Option<(Vec<(u64, u64)>, u64)> {
    if dict == 0 {
        return None;
    }
    let h = mem.bytes(dict, 48)?;
    let at = |o: u64| u64::from_le_bytes(h[o as usize..o as usize + 8].try_into().unwrap());
    let (keys, values) = (at(L::MA_KEYS), at(L::MA_VALUES));
    let (pairs, keys_bytes) = keys_items(mem, l, keys, values)?;
    let own_keys = if values == 0 { keys_bytes } else { 8 * pairs.len() as u64 };
    Some((pairs.into_iter().filter(|p| p.1 != 0).collect(), own_keys))
}

/// The entries of a keys object, their values from `values` (a split table) when non-zero;
/// and the keys object's size.
pub fn keys_items(mem: &mut Mem, l: &HeapLayout, keys: u64, values: u64) -> Option<(Vec<(u64, u64)>, u64)> {
    let h = mem.bytes(keys, 40)?;
    let at = |o: usize| u64::from_le_bytes(h[o..o + 8].try_into().unwrap());
    let (n, entries, esize, size, index_bytes) = if l.dict311 {
        let (log2, log2_index, kind) = (h[8], h[9], h[10]);
        if log2 > 40 || log2_index > 43 {
            return None;
        }
        let esize = if kind == 0 { 24 } else { 16 };
        (at(24), keys.wrapping_add(32 + (1u64 << log2_index)), esize, 1u64 << log2, 1u64 << log2_index)
    } else {
        let size = at(8);
        let width = match size {
            0..=0xff => 1,
            0x100..=0xffff => 2,
            0x1_0000..=0xffff_ffff => 4,
            _ => 8,
        };
        (at(32), keys.wrapping_add(40).wrapping_add(size.wrapping_mul(width)), 24, size, size.saturating_mul(width))
    };
    if n > size || n > 1 << 24 {
        return None;
    }
    let table = mem.bytes(entries, (n * esize) as usize)?;
    let vals =
        if values != 0 { Some(mem.bytes(values.wrapping_add(l.values_offset), (n * 8) as usize)?) } else { None };
    let word = |b: &[u8], i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap());
    let mut out = Vec::with_capacity(n as usize);
    for i in 0..n as usize {
        let e = i * esize as usize;
        let key_at = if esize == 24 { e + 8 } else { e };
        let key = word(&table, key_at);
        let value = match &vals {
            Some(v) => word(v, i * 8),
            None => word(&table, key_at + 8),
        };
        if key != 0 {
            out.push((key, value));
        }
    }
    let usable = size.saturating_mul(2) / 3;
    let bytes =
        (if l.dict311 { 32u64 } else { 40 }).saturating_add(index_bytes).saturating_add(usable.saturating_mul(esize));
    Some((out, bytes))
}

/// A str object's text (compact strings only), at most `max` characters.
pub fn read_str(mem: &mut Mem, l: &HeapLayout, s: u64, max: usize) -> Option<String> {
    let h = mem.bytes(s, 40)?;
    let len = u64::from_le_bytes(h[16..24].try_into().unwrap()) as usize;
    let state = u32::from_le_bytes(h[32..36].try_into().unwrap());
    let (kind, compact, ascii) = ((state >> 2) & 7, (state >> 5) & 1, (state >> 6) & 1);
    if compact == 0 || !matches!(kind, 1 | 2 | 4) {
        return None;
    }
    let n = len.min(max);
    let data = s.wrapping_add(if ascii == 1 { l.ascii_header } else { l.compact_header });
    let raw = mem.bytes(data, n * kind as usize)?;
    Some(match kind {
        1 => raw.iter().map(|&c| c as char).collect(),
        2 => raw.chunks_exact(2).filter_map(|c| char::from_u32(u16::from_le_bytes([c[0], c[1]]) as u32)).collect(),
        _ => raw.chunks_exact(4).filter_map(|c| char::from_u32(u32::from_le_bytes(c.try_into().unwrap()))).collect(),
    })
}

/// The size of a str object (compact layouts).
fn str_size(l: &HeapLayout, h: &[u8]) -> u64 {
    let len = u64::from_le_bytes(h[16..24].try_into().unwrap());
    let state = u32::from_le_bytes(h[32..36].try_into().unwrap());
    let (kind, ascii) = (((state >> 2) & 7) as u64, (state >> 6) & 1);
    // The length is the target's: sizes saturate.
    if ascii == 1 {
        l.ascii_header.saturating_add(len).saturating_add(1)
    } else {
        l.compact_header.saturating_add(len.saturating_add(1).saturating_mul(kind.max(1)))
    }
}

/// An object's bytes (see `PyCensus` docs) from its first bytes `h` (at least 48 when the
/// object is that large); the out-of-line tables of dicts, lists and sets are added by the
/// caller as they are decoded.
pub fn object_size(l: &HeapLayout, t: &TypeInfo, h: &[u8]) -> u64 {
    let word = |o: usize| h.get(o..o + 8).map_or(0, |b| u64::from_le_bytes(b.try_into().unwrap()));
    let mut n = match t.kind {
        Kind::Str if h.len() >= 36 => str_size(l, h),
        Kind::Long if l.long_tag => t.basicsize.saturating_add(t.itemsize.saturating_mul((word(16) >> 3).min(1 << 24))),
        // `ob_size` (types whose field there is not a size count as their fixed part).
        _ if t.itemsize > 0 => match (word(16) as i64).unsigned_abs() {
            n if n <= 1 << 32 => t.basicsize.saturating_add(t.itemsize.saturating_mul(n)),
            _ => t.basicsize,
        },
        _ => t.basicsize,
    };
    if t.flags & flags::HAVE_GC != 0 {
        n = n.saturating_add(L::GC_HEAD);
    }
    if t.flags & flags::MANAGED_DICT != 0 && l.managed != Managed::None {
        n = n.saturating_add(16);
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(buf: &mut [u64], byte_off: usize, v: u64) {
        buf[byte_off / 8] = v;
    }

    /// A 3.11 unicode-keyed dict {"bus": A, "_x": B} and its key, laid out in this process's
    /// memory and read back through process_vm_readv: the items, the keys object's size, the
    /// key's text.
    #[test]
    fn reads_a_311_dict_and_its_str_keys_from_memory() {
        let l = super::super::layout::for_version((3, 11)).unwrap();
        let mut bus = vec![0u64; 8];
        put(&mut bus, 16, 3);
        // state: kind 1 (bits 2-4), compact (bit 5), ascii (bit 6).
        put(&mut bus, 32, (1 << 2) | (1 << 5) | (1 << 6));
        put(&mut bus, 48, u64::from_le_bytes(*b"bus\0\0\0\0\0"));
        let mut x = bus.clone();
        put(&mut x, 16, 2);
        put(&mut x, 48, u64::from_le_bytes(*b"_x\0\0\0\0\0\0"));
        let (bus_at, x_at) = (bus.as_ptr() as u64, x.as_ptr() as u64);
        let mut keys = vec![0u64; 9];
        // dk_log2_size 3, dk_log2_index_bytes 3, dk_kind 1 (unicode), two entries.
        keys[1] = 3 | (3 << 8) | (1 << 16);
        put(&mut keys, 24, 2);
        put(&mut keys, 32, u64::from_le_bytes([0, 1, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff]));
        let entries = [bus_at, 0xa000, x_at, 0xb000];
        keys[5..9].copy_from_slice(&entries);
        let mut dict = vec![0u64; 6];
        put(&mut dict, 16, 2);
        put(&mut dict, 32, keys.as_ptr() as u64);
        let mut mem = Mem::new(std::process::id(), 1 << 20);
        let (items, size) = dict_items(&mut mem, &l, dict.as_ptr() as u64).expect("dict");
        assert_eq!(items, vec![(bus_at, 0xa000), (x_at, 0xb000)]);
        // 32 B of header, 8 B of indices, 5 usable entries of 16 B.
        assert_eq!(size, 32 + 8 + 5 * 16);
        assert_eq!(read_str(&mut mem, &l, bus_at, 40).as_deref(), Some("bus"));
        assert_eq!(read_str(&mut mem, &l, x_at, 1).as_deref(), Some("_"));
        drop((bus, x, keys, dict));
    }
}
