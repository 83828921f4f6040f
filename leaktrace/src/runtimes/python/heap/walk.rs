//! The object graph of one census: the containers of the collector's lists, the objects their
//! decoded references reach, and for each object reached from a module its parent and edge
//! (breadth first from the modules: a shortest retaining path).

use std::time::Instant;

use super::decode::{self, Kind, Label, TypeInfo};
use super::layout::{self as L, HeapLayout, Managed, flags};
use super::mem::{FastMap, Mem};
use leaktrace_common::SiteKey;

/// Interned strings (attribute names, key reprs, module names).
#[derive(Default)]
pub struct Strs {
    pub list: Vec<String>,
    by: FastMap<String, u32>,
}

impl Strs {
    pub fn id(&mut self, s: &str) -> u32 {
        if let Some(&i) = self.by.get(s) {
            return i;
        }
        self.list.push(s.to_string());
        self.by.insert(s.to_string(), self.list.len() as u32 - 1);
        self.list.len() as u32 - 1
    }
}

pub const NONE: u32 = u32::MAX;

/// A reference: the referent, the edge's label, and whether it is one of the referrer's own
/// references (false for shortcuts: an instance's attribute, which its dict holds; a function's
/// default, which its `__defaults__` tuple holds).
pub type Edge = (u64, Label, bool);

/// How an object was reached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    /// Not yet decoded.
    Seen,
    /// Reached from a module (has a parent, or is a root).
    Path,
    /// Decoded without a path from a module.
    Unreached,
}

/// One object.
pub struct Node {
    pub addr: u64,
    pub ty: u32,
    pub size: u64,
    pub refcnt: i64,
    pub parent: u32,
    pub label: Label,
    pub sig: u32,
    pub state: State,
    pub gc: bool,
}

/// The graph and what reads it.
pub struct Walk<'m> {
    pub mem: &'m mut Mem,
    pub l: HeapLayout,
    pub nodes: Vec<Node>,
    pub types: Vec<TypeInfo>,
    type_index: FastMap<u64, u32>,
    pub strs: Strs,
    /// References found to each node from decoded objects.
    pub refs_in: Vec<u32>,
    /// Pattern signatures: (parent signature, generalised label) → id; and back.
    pub sigs: Vec<(u32, Label)>,
    sig_index: FastMap<(u32, Label), u32>,
    pub deadline: Instant,
    pub max_objects: usize,
    /// Set when a budget stopped the walk.
    pub out_of_budget: Option<&'static str>,
    /// References that could not be read (not PyObjects, or unmapped).
    pub bad_refs: u64,
    /// The traced live native blocks (address, size, site), sorted by address, read while the
    /// target is stopped; empty when not traced (the object→block edges are then not looked for).
    pub blocks: Vec<(u64, u64, SiteKey)>,
    /// The heap graph's edges: (referrer, referent) node indices, an object's own references.
    pub edges: Vec<(u32, u32)>,
    /// Object → native block edges: (node, index in `blocks`): a word of an object whose layout
    /// is not decoded (an extension type's) that points into a traced block.
    pub owned: Vec<(u32, u32)>,
}

/// Longest fixed part of an object read for references (a `tp_basicsize` is the target's word).
const MAX_FIELDS: u64 = 64 << 10;

/// Longest chain of parents followed up from a node ([`Walk::chain_to`]).
const MAX_CHAIN: usize = 4096;

impl<'m> Walk<'m> {
    /// Node `i`'s chain of parents (the walk's first path to it), root first, at most
    /// [`MAX_CHAIN`] nodes (the root's end cut when longer).
    pub fn chain_to(&self, i: u32) -> Vec<u32> {
        let mut chain = vec![i];
        let mut cur = i;
        while self.nodes[cur as usize].parent != NONE && chain.len() < MAX_CHAIN {
            cur = self.nodes[cur as usize].parent;
            chain.push(cur);
        }
        chain.reverse();
        chain
    }

    pub fn new(mem: &'m mut Mem, l: HeapLayout, deadline: Instant, max_objects: usize) -> Walk<'m> {
        Walk {
            mem,
            l,
            nodes: Vec::new(),
            types: Vec::new(),
            type_index: FastMap::default(),
            strs: Strs::default(),
            refs_in: Vec::new(),
            sigs: Vec::new(),
            sig_index: FastMap::default(),
            deadline,
            max_objects,
            out_of_budget: None,
            bad_refs: 0,
            blocks: Vec::new(),
            edges: Vec::new(),
            owned: Vec::new(),
        }
    }

    /// Whether a budget is spent (checked every few hundred objects by the callers).
    pub fn over(&mut self) -> bool {
        if self.out_of_budget.is_none() {
            if self.nodes.len() >= self.max_objects {
                self.out_of_budget = Some("object cap");
            } else if Instant::now() >= self.deadline {
                self.out_of_budget = Some("pause cap");
            }
        }
        self.out_of_budget.is_some()
    }

    /// The type index of the type object at `addr`.
    fn type_of(&mut self, addr: u64) -> Option<u32> {
        if let Some(&i) = self.type_index.get(&addr) {
            return Some(i);
        }
        let t = decode::read_type(self.mem, &self.l, addr)?;
        self.types.push(t);
        let i = self.types.len() as u32 - 1;
        self.type_index.insert(addr, i);
        Some(i)
    }

    /// The node of the object at `addr`, read and added if new. None: not a readable object.
    pub fn node(&mut self, addr: u64, gc: bool) -> Option<u32> {
        // No user-space address is at or above 2^56: offsets added to an object's address
        // cannot wrap.
        if addr & 7 != 0 || !(4096..1 << 56).contains(&addr) {
            return None;
        }
        if let Some(i) = self.mem.object(addr) {
            return Some(i);
        }
        let mut h = [0u8; 48];
        if !self.mem.read(addr, &mut h) {
            if !self.mem.read(addr, &mut h[..24]) {
                return None;
            }
            let _ = self.mem.read(addr + 24, &mut h[24..]);
        }
        let word = |o: usize| u64::from_le_bytes(h[o..o + 8].try_into().unwrap());
        let ty = self.type_of(word(L::OB_TYPE as usize))?;
        let size = decode::object_size(&self.l, &self.types[ty as usize], &h);
        self.nodes.push(Node {
            addr,
            ty,
            size,
            refcnt: word(L::OB_REFCNT as usize) as i64,
            parent: NONE,
            label: Label::Any,
            sig: NONE,
            state: State::Seen,
            gc,
        });
        self.refs_in.push(0);
        let i = self.nodes.len() as u32 - 1;
        self.mem.set_object(addr, i);
        Some(i)
    }

    /// The signature of a child of a node with signature `parent` by edge `label`.
    pub fn sig(&mut self, parent: u32, label: Label) -> u32 {
        let key = (parent, label.general());
        if let Some(&s) = self.sig_index.get(&key) {
            return s;
        }
        self.sigs.push(key);
        let s = self.sigs.len() as u32 - 1;
        self.sig_index.insert(key, s);
        s
    }

    fn str_id(&mut self, s: u64) -> Option<u32> {
        let text = decode::read_str(self.mem, &self.l, s, 40)?;
        Some(self.strs.id(&text))
    }

    /// A dict key in a path: `'text'` for a str (cut to 40 characters), the number for a
    /// small int, `<type>` otherwise.
    fn key_repr(&mut self, k: u64) -> u32 {
        let Some(i) = self.node(k, false) else { return self.strs.id("<?>") };
        let t = self.nodes[i as usize].ty as usize;
        let repr = match self.types[t].kind {
            Kind::Str => decode::read_str(self.mem, &self.l, k, 40).map(|s| format!("{s:?}").replace('"', "'")),
            Kind::Long => self.small_int(k).map(|v| v.to_string()),
            _ => None,
        };
        let repr = repr.unwrap_or_else(|| format!("<{}>", self.types[t].name));
        self.strs.id(&repr)
    }

    /// An int of at most two 30-bit digits.
    fn small_int(&mut self, k: u64) -> Option<i64> {
        let h = self.mem.bytes(k, 32)?;
        let tag = u64::from_le_bytes(h[16..24].try_into().unwrap());
        let (n, neg) =
            if self.l.long_tag { ((tag >> 3) as i64, tag & 3 == 2) } else { ((tag as i64).abs(), (tag as i64) < 0) };
        let d0 = u32::from_le_bytes(h[24..28].try_into().unwrap()) as i64;
        let d1 = u32::from_le_bytes(h[28..32].try_into().unwrap()) as i64;
        let v = match n {
            0 => 0,
            1 => d0,
            2 => d0 | (d1 << 30),
            _ => return None,
        };
        Some(if neg { -v } else { v })
    }

    /// The objects node `i` refers to, with the edges' labels; out-of-line bytes found meanwhile
    /// are added to its size.
    pub fn children(&mut self, i: u32, out: &mut Vec<Edge>) {
        out.clear();
        let (addr, ty) = (self.nodes[i as usize].addr, self.nodes[i as usize].ty as usize);
        let t = self.types[ty].clone();
        let mut extra = 0u64;
        let word = |m: &mut Mem, o: u64| m.u64(addr + o).unwrap_or(0);
        match t.kind {
            Kind::Dict => {
                if let Some((items, bytes)) = decode::dict_items(self.mem, &self.l, addr) {
                    extra = extra.saturating_add(bytes);
                    for (k, v) in items {
                        let r = self.key_repr(k);
                        out.push((v, Label::Key(r), true));
                        out.push((k, Label::KeyObj, true));
                    }
                }
            }
            Kind::List | Kind::Tuple => {
                let n = (word(self.mem, L::OB_SIZE) as i64).clamp(0, 1 << 24) as u64;
                let items = if t.kind == Kind::List { word(self.mem, L::LIST_ITEM) } else { addr + L::TUPLE_ITEM };
                if t.kind == Kind::List {
                    extra += 8 * (word(self.mem, L::LIST_ALLOCATED) as i64).clamp(0, 1 << 24) as u64;
                }
                if let Some(b) = self.mem.bytes(items, 8 * n as usize) {
                    for (k, c) in b.chunks_exact(8).enumerate() {
                        out.push((u64::from_le_bytes(c.try_into().unwrap()), Label::Index(k as u32), true));
                    }
                }
            }
            Kind::Set => self.set_children(addr, out, &mut extra),
            Kind::Func => self.func_children(addr, out),
            Kind::Cell => out.push((word(self.mem, L::CELL_REF), Label::CellContents, true)),
            Kind::Method => {
                out.push((word(self.mem, L::METHOD_SELF), Label::SelfRef, true));
                out.push((word(self.mem, L::METHOD_FUNC), Label::Func, true));
            }
            Kind::Deque => self.deque_children(addr, out),
            Kind::Other => self.field_children(i, addr, &t, out),
            _ => {}
        }
        if t.kind != Kind::Func {
            self.instance_dict(addr, &t, out);
        }
        self.nodes[i as usize].size = self.nodes[i as usize].size.saturating_add(extra);
    }

    fn set_children(&mut self, addr: u64, out: &mut Vec<Edge>, extra: &mut u64) {
        let mask = self.mem.u64(addr + L::SET_MASK).unwrap_or(0);
        let table = self.mem.u64(addr + L::SET_TABLE).unwrap_or(0);
        if mask >= 1 << 24 {
            return;
        }
        if mask > 7 {
            *extra += (mask + 1) * 16;
        }
        if let Some(b) = self.mem.bytes(table, 16 * (mask + 1) as usize) {
            for e in b.chunks_exact(16) {
                let key = u64::from_le_bytes(e[..8].try_into().unwrap());
                let hash = i64::from_le_bytes(e[8..].try_into().unwrap());
                // The dummy of a deleted entry has hash -1.
                if key != 0 && hash != -1 {
                    out.push((key, Label::SetItem, true));
                }
            }
        }
    }

    fn func_children(&mut self, addr: u64, out: &mut Vec<Edge>) {
        let l = self.l;
        let w = |m: &mut Mem, o: u64| m.u64(addr + o).unwrap_or(0);
        let defaults = w(self.mem, l.func_defaults);
        let closure = w(self.mem, l.func_closure);
        let kw = w(self.mem, l.func_kwdefaults);
        let fdict = w(self.mem, l.func_dict);
        for (tuple, mk) in [(defaults, Label::Defaults as fn(u32) -> Label), (closure, Label::Closure)] {
            if tuple == 0 {
                continue;
            }
            let n = (self.mem.u64(tuple.wrapping_add(L::OB_SIZE)).unwrap_or(0) as i64).clamp(0, 256) as u64;
            if let Some(b) = self.mem.bytes(tuple.wrapping_add(L::TUPLE_ITEM), 8 * n as usize) {
                for (k, c) in b.chunks_exact(8).enumerate() {
                    out.push((u64::from_le_bytes(c.try_into().unwrap()), mk(k as u32), false));
                }
            }
        }
        for (d, kwd) in [(kw, true), (fdict, false)] {
            for (k, v) in decode::dict_items(self.mem, &l, d).map(|(i, _)| i).unwrap_or_default() {
                if let Some(s) = self.str_id(k) {
                    out.push((v, if kwd { Label::KwDefaults(s) } else { Label::Attr(s) }, false));
                }
            }
        }
        let qualname = w(self.mem, l.func_qualname);
        for (o, name) in [
            (defaults, "__defaults__"),
            (closure, "__closure__"),
            (kw, "__kwdefaults__"),
            (fdict, "__dict__"),
            (qualname, "__qualname__"),
        ] {
            let s = self.strs.id(name);
            out.push((o, Label::Attr(s), true));
        }
    }

    fn deque_children(&mut self, addr: u64, out: &mut Vec<Edge>) {
        let Some(h) = self.mem.bytes(addr, 56) else { return };
        let at = |o: u64| u64::from_le_bytes(h[o as usize..o as usize + 8].try_into().unwrap());
        let (mut block, right) = (at(L::DEQUE_LEFTBLOCK), at(L::DEQUE_RIGHTBLOCK));
        let (mut idx, ridx) = (at(L::DEQUE_LEFTINDEX), at(L::DEQUE_RIGHTINDEX));
        let n = (at(L::OB_SIZE) as i64).clamp(0, 1 << 24) as u64;
        let mut k = 0u32;
        while (k as u64) < n {
            let Some(b) = self.mem.bytes(block, 8 * (L::DEQUE_BLOCKLEN as usize + 2)) else { return };
            let last = if block == right { ridx } else { L::DEQUE_BLOCKLEN - 1 };
            while idx <= last && idx < L::DEQUE_BLOCKLEN && (k as u64) < n {
                let o = 8 + 8 * idx as usize;
                out.push((u64::from_le_bytes(b[o..o + 8].try_into().unwrap()), Label::Index(k), true));
                idx += 1;
                k += 1;
            }
            if block == right {
                return;
            }
            let o = 8 + 8 * L::DEQUE_BLOCKLEN as usize;
            block = u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
            idx = 0;
        }
    }

    /// The traced block containing `a`, by its index in `blocks`.
    fn block_at(&self, a: u64) -> Option<u32> {
        let i = self.blocks.partition_point(|b| b.0 <= a).checked_sub(1)?;
        let (start, size, _) = self.blocks[i];
        (a < start.saturating_add(size.max(1))).then_some(i as u32)
    }

    /// An object whose layout is not decoded: the words of its fixed part (its whole
    /// `tp_basicsize`, up to [`MAX_FIELDS`]) that point at an object already found, or at memory
    /// whose second word is a type already read (an object's `ob_type`); the other words that
    /// point into a traced native block are edges to that block (node `i` owns it).
    fn field_children(&mut self, i: u32, addr: u64, t: &TypeInfo, out: &mut Vec<Edge>) {
        let len = t.basicsize.min(MAX_FIELDS) as usize & !7;
        let Some(b) = self.mem.bytes(addr, len) else { return };
        for (k, c) in b.chunks_exact(8).enumerate().skip(2) {
            // The instance dict's slot: read (and counted) as `.__dict__` by `instance_dict`.
            if t.dictoffset == 8 * k as i64 {
                continue;
            }
            let w = u64::from_le_bytes(c.try_into().unwrap());
            // Not a user-space address (the bits of a double, a hash): not read.
            if !(4096..1 << 47).contains(&w) || w & 7 != 0 {
                continue;
            }
            let known = self.mem.mapped(w, 16)
                && (self.mem.object(w).is_some()
                    || self.mem.u64(w + L::OB_TYPE).is_some_and(|ty| self.type_index.contains_key(&ty)));
            if known {
                out.push((w, Label::Field(8 * k as u32), true));
            } else if let Some(b) = self.block_at(w) {
                self.owned.push((i, b));
            }
        }
    }

    /// An instance's attributes: its dict (`tp_dictoffset`) or managed dict or values (3.11+).
    fn instance_dict(&mut self, addr: u64, t: &TypeInfo, out: &mut Vec<Edge>) {
        let l = self.l;
        let mut dict = 0;
        let mut values = 0;
        if t.flags & flags::MANAGED_DICT != 0 && l.managed != Managed::None {
            let w = self.mem.u64(addr - 24).unwrap_or(0);
            match l.managed {
                Managed::Split311 => {
                    dict = w;
                    values = if w == 0 { self.mem.u64(addr - 32).unwrap_or(0) } else { 0 };
                }
                Managed::Tagged312 if w & 1 == 1 => values = w.wrapping_add(1),
                Managed::Inline313 if w == 0 && t.flags & flags::INLINE_VALUES != 0 => {
                    // PyDictValues {capacity, size, embedded, valid}: valid == 0 once a dict
                    // took the values over.
                    let valid = self.mem.bytes(addr + 16, 4).is_some_and(|b| b[3] != 0);
                    values = if valid { addr + 16 } else { 0 };
                }
                _ => dict = w,
            }
        } else if t.dictoffset > 0 && t.dictoffset < 1 << 20 {
            dict = self.mem.u64(addr + t.dictoffset as u64).unwrap_or(0);
        }
        let items = if values != 0 && t.cached_keys != 0 {
            decode::keys_items(self.mem, &l, t.cached_keys, values).map(|(i, _)| i)
        } else {
            decode::dict_items(self.mem, &l, dict).map(|(i, _)| i)
        };
        for (k, v) in items.unwrap_or_default() {
            if v == 0 {
                continue;
            }
            // With a dict, the dict holds the attributes (a shortcut edge here).
            let own = dict == 0;
            match self.str_id(k) {
                Some(s) => out.push((v, Label::Attr(s), own)),
                None => out.push((v, Label::Any, own)),
            }
        }
        if dict != 0 {
            out.push((dict, Label::DictOf, true));
        }
    }
}
