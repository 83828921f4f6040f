//! A streaming reader of the JVM's HPROF heap dumps (`jcmd PID GC.heap_dump FILE`, format
//! "JAVA PROFILE 1.0.2", as HotSpot writes it) keeping only what a path from a GC root needs:
//! the names (STRING, LOAD_CLASS), the classes' fields (CLASS_DUMP), each object's class and
//! its references (INSTANCE_DUMP, OBJ_ARRAY_DUMP; PRIM_ARRAY_DUMP as leaves), the GC roots
//! (ROOT_*) and the threads' stacks (STACK_TRACE, STACK_FRAME) to name a local's method.
//! Then one breadth-first walk from every root gives each object its shortest path from a root;
//! [`Graph::paths_to`] tells it for a class.
//!
//! Memory: about 60 bytes per object plus 24 per reference (a dump of 1 M objects and 3 M
//! references: about 130 MiB); the caller bounds the dump's size. No crate reads HPROF as a
//! stream (`jvm-hprof` maps the whole file), hence this one.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read};
#[cfg(test)]
use std::time::Duration;
use std::time::Instant;

use leaktrace_analysis::holds::RetainerPath;

use super::census::java_name;

/// A reference's label: a field (its name's string id) or an array element.
#[derive(Clone, Copy)]
enum Label {
    Field(u64),
    Element,
}

/// A GC root, as the walk starts from it.
struct Root {
    kind: &'static str,
    /// The root's name: `HoldsJvm.AUDIT`, `local of HoldsJvm.main`, `JNI global`.
    name: String,
    target: u64,
}

/// A class from its CLASS_DUMP.
struct Class {
    super_id: u64,
    /// Instance fields declared by this class: (name string id, basic type).
    fields: Vec<(u64, u8)>,
}

/// An object: its class (a class object's id; primitive arrays: [`prim_class`]) and its
/// references `edges[start..end]`.
pub(super) struct Obj {
    pub(super) class: u64,
    start: u32,
    end: u32,
    /// Shallow bytes, as HotSpot lays it out with 8-byte references (a 16-byte header, the
    /// fields or elements, rounded to 8).
    pub(super) size: u32,
}

/// The heap as read from the dump.
#[derive(Default)]
pub struct Graph {
    id_size: usize,
    strings: HashMap<u64, String>,
    /// Class object id → name string id (LOAD_CLASS); class serial → class object id.
    class_names: HashMap<u64, u64>,
    class_serials: HashMap<u32, u64>,
    classes: HashMap<u64, Class>,
    index: HashMap<u64, u32>,
    objs: Vec<Obj>,
    edges: Vec<(u64, Label)>,
    roots: Vec<Root>,
    /// Instances read before their class's CLASS_DUMP: (object index, field bytes).
    pending: Vec<(u32, Vec<u8>)>,
    /// Stack frames (frame id → "Class.method (line)"), stack traces (serial → frame ids) and
    /// threads (thread serial → stack trace serial).
    frames: HashMap<u64, (u64, u32, i32)>,
    traces: HashMap<u32, Vec<u64>>,
    threads: HashMap<u32, u32>,
    java_frames: Vec<(u64, u32, u32)>,
    /// Classes whose instances own off-heap memory at their `address` (`java.nio.Direct*`, not
    /// their nested classes).
    direct_classes: std::collections::HashSet<u64>,
    /// Direct buffers: (object index, `java.nio.Buffer.address`).
    pub(super) direct: Vec<(u32, u64)>,
}

/// The bytes of a value of HPROF basic type `t` (2: an object id).
fn type_size(t: u8, id_size: usize) -> Option<usize> {
    Some(match t {
        2 => id_size,
        4 | 8 => 1,
        5 | 9 => 2,
        6 | 10 => 4,
        7 | 11 => 8,
        _ => return None,
    })
}

/// The synthetic class of class objects (`java.lang.Class`).
const CLASS_OBJECT: u64 = u64::MAX - 12;

/// The synthetic class id of a primitive array of basic type `t`.
fn prim_class(t: u8) -> u64 {
    u64::MAX - t as u64
}

fn prim_name(t: u8) -> &'static str {
    match t {
        4 => "boolean[]",
        5 => "char[]",
        6 => "float[]",
        7 => "double[]",
        8 => "byte[]",
        9 => "short[]",
        10 => "int[]",
        11 => "long[]",
        _ => "?[]",
    }
}

/// A cursor over one record's bytes.
struct Cur<'a> {
    b: &'a [u8],
    at: usize,
    id: usize,
}

impl Cur<'_> {
    fn take(&mut self, n: usize) -> anyhow::Result<&[u8]> {
        let end = self.at.checked_add(n).ok_or_else(|| anyhow::anyhow!("a record ends early"))?;
        let s = self.b.get(self.at..end).ok_or_else(|| anyhow::anyhow!("a record ends early"))?;
        self.at += n;
        Ok(s)
    }
    fn u1(&mut self) -> anyhow::Result<u8> {
        Ok(self.take(1)?[0])
    }
    fn u2(&mut self) -> anyhow::Result<u16> {
        Ok(u16::from_be_bytes(self.take(2)?.try_into()?))
    }
    fn u4(&mut self) -> anyhow::Result<u32> {
        Ok(u32::from_be_bytes(self.take(4)?.try_into()?))
    }
    fn id(&mut self) -> anyhow::Result<u64> {
        let n = self.id;
        let s = self.take(n)?;
        Ok(s.iter().fold(0u64, |a, &b| (a << 8) | b as u64))
    }
    fn done(&self) -> bool {
        self.at >= self.b.len()
    }
}

/// Superclasses followed from a class at most: deeper is a cycle (a class its own superclass,
/// directly or not) or a forged dump; Java's deepest hierarchies are a few dozen classes.
const MAX_SUPERCLASSES: usize = 256;
/// Bytes of a record read at a time: a record's buffer grows with the bytes really read, so a
/// header that claims 4 GiB in a small file costs no more than the file.
const READ_STEP: usize = 1 << 20;

/// Read a dump from `r`, giving up after `deadline` (an error: the caller says so).
pub fn read(r: impl Read, deadline: Instant) -> anyhow::Result<Graph> {
    let mut r = BufReader::with_capacity(1 << 20, r);
    let mut head = Vec::new();
    // The format name ends with a NUL within a few bytes; a file without one is not read whole.
    (&mut r).take(64).read_until(0, &mut head)?;
    if !head.starts_with(b"JAVA PROFILE 1.0") {
        anyhow::bail!("not an HPROF heap dump (it starts {:?})", String::from_utf8_lossy(&head[..head.len().min(20)]));
    }
    let mut fixed = [0u8; 12];
    r.read_exact(&mut fixed)?;
    let id_size = u32::from_be_bytes(fixed[..4].try_into()?) as usize;
    if id_size != 4 && id_size != 8 {
        anyhow::bail!("HPROF identifier size {id_size} (4 or 8 expected)");
    }
    let mut g = Graph { id_size, ..Default::default() };
    let mut body = Vec::new();
    let mut records = 0u64;
    loop {
        let mut h = [0u8; 9];
        match r.read_exact(&mut h) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => break,
            Err(e) => return Err(e.into()),
        }
        let len = u32::from_be_bytes(h[5..9].try_into()?) as usize;
        read_record(&mut r, len, &mut body)?;
        g.record(h[0], &body)?;
        records += 1;
        if records.is_multiple_of(64) && Instant::now() > deadline {
            anyhow::bail!("reading the dump took longer than its time limit");
        }
    }
    g.finish(deadline)?;
    Ok(g)
}

/// The `len` bytes of one record into `body`, read [`READ_STEP`] at a time (its memory is what
/// the file holds, not what the header claims).
fn read_record(r: &mut impl Read, len: usize, body: &mut Vec<u8>) -> anyhow::Result<()> {
    body.clear();
    while body.len() < len {
        let at = body.len();
        let step = (len - at).min(READ_STEP);
        body.resize(at + step, 0);
        r.read_exact(&mut body[at..])
            .map_err(|e| anyhow::anyhow!("a record of {len} B ends after {at} B or more: {e}"))?;
    }
    Ok(())
}

impl Graph {
    fn cur<'a>(&self, b: &'a [u8]) -> Cur<'a> {
        Cur { b, at: 0, id: self.id_size }
    }

    /// One top-level record.
    fn record(&mut self, tag: u8, b: &[u8]) -> anyhow::Result<()> {
        let mut c = self.cur(b);
        match tag {
            0x01 => {
                let id = c.id()?;
                self.strings.insert(id, String::from_utf8_lossy(&b[c.at..]).into_owned());
            }
            0x02 => {
                let serial = c.u4()?;
                let class = c.id()?;
                c.u4()?;
                let name = c.id()?;
                self.class_names.insert(class, name);
                self.class_serials.insert(serial, class);
            }
            0x04 => {
                let frame = c.id()?;
                let method = c.id()?;
                c.id()?;
                c.id()?;
                let class_serial = c.u4()?;
                let line = c.u4()? as i32;
                self.frames.insert(frame, (method, class_serial, line));
            }
            0x05 => {
                let serial = c.u4()?;
                c.u4()?;
                let n = c.u4()?;
                let frames = (0..n).map(|_| c.id()).collect::<anyhow::Result<Vec<u64>>>()?;
                self.traces.insert(serial, frames);
            }
            0x0C | 0x1C => self.heap_segment(b)?,
            _ => {}
        }
        Ok(())
    }

    /// The sub-records of a HEAP_DUMP or HEAP_DUMP_SEGMENT record.
    fn heap_segment(&mut self, b: &[u8]) -> anyhow::Result<()> {
        let mut c = self.cur(b);
        while !c.done() {
            let tag = c.u1()?;
            match tag {
                0xFF => self.root("unknown root", c.id()?),
                0x01 => {
                    let obj = c.id()?;
                    c.id()?;
                    self.root("JNI global", obj);
                }
                0x02 => {
                    let obj = c.id()?;
                    c.take(8)?;
                    self.root("JNI local", obj);
                }
                0x03 => {
                    let obj = c.id()?;
                    let thread = c.u4()?;
                    let depth = c.u4()?;
                    self.java_frames.push((obj, thread, depth));
                }
                0x04 => {
                    let obj = c.id()?;
                    c.u4()?;
                    self.root("native stack", obj);
                }
                0x05 => self.root("system class", c.id()?),
                0x06 => {
                    let obj = c.id()?;
                    c.u4()?;
                    self.root("thread block", obj);
                }
                0x07 => self.root("monitor", c.id()?),
                0x08 => {
                    let obj = c.id()?;
                    let thread = c.u4()?;
                    let trace = c.u4()?;
                    self.threads.insert(thread, trace);
                    self.root("thread", obj);
                }
                0x20 => self.class_dump(&mut c)?,
                0x21 => {
                    let id = c.id()?;
                    c.u4()?;
                    let class = c.id()?;
                    let n = c.u4()? as usize;
                    let data = c.take(n)?;
                    let i = self.object(id, class, n);
                    if self.classes.contains_key(&class) {
                        self.instance_edges(i, data)?;
                    } else {
                        self.pending.push((i, data.to_vec()));
                    }
                }
                0x22 => {
                    let id = c.id()?;
                    c.u4()?;
                    let n = c.u4()?;
                    let class = c.id()?;
                    let i = self.object(id, class, (n as usize).saturating_mul(self.id_size));
                    for _ in 0..n {
                        let to = c.id()?;
                        if to != 0 {
                            self.edges.push((to, Label::Element));
                        }
                    }
                    self.objs[i as usize].end = self.edges.len() as u32;
                }
                0x23 => {
                    let id = c.id()?;
                    c.u4()?;
                    let n = c.u4()? as usize;
                    let t = c.u1()?;
                    let size = type_size(t, self.id_size).ok_or_else(|| anyhow::anyhow!("array of basic type {t}"))?;
                    let bytes = n.checked_mul(size).ok_or_else(|| anyhow::anyhow!("an array of {n} elements"))?;
                    c.take(bytes)?;
                    self.object(id, prim_class(t), bytes);
                }
                t => anyhow::bail!("unknown heap dump sub-record 0x{t:02x}"),
            }
        }
        Ok(())
    }

    fn root(&mut self, kind: &'static str, target: u64) {
        self.roots.push(Root { kind, name: kind.to_string(), target });
    }

    /// A new object with no references yet; its index.
    fn object(&mut self, id: u64, class: u64, bytes: usize) -> u32 {
        let i = self.objs.len() as u32;
        let at = self.edges.len() as u32;
        let size = (16 + bytes.min(u32::MAX as usize - 32)).next_multiple_of(8) as u32;
        self.objs.push(Obj { class, start: at, end: at, size });
        self.index.insert(id, i);
        i
    }

    fn class_dump(&mut self, c: &mut Cur<'_>) -> anyhow::Result<()> {
        let id = c.id()?;
        c.u4()?;
        let super_id = c.id()?;
        for _ in 0..5 {
            c.id()?;
        }
        c.u4()?;
        for _ in 0..c.u2()? {
            c.u2()?;
            let t = c.u1()?;
            c.take(type_size(t, self.id_size).ok_or_else(|| anyhow::anyhow!("constant of basic type {t}"))?)?;
        }
        let i = self.object(id, CLASS_OBJECT, 0);
        // The buffers themselves, not their `Deallocator` (`$`), whose `address` is the Cleaner's
        // bookkeeping (reached from `Cleaner.first`'s list, it would share every block).
        if self.class_name(id).starts_with("java.nio.Direct") && !self.class_name(id).contains('$') {
            self.direct_classes.insert(id);
        }
        for _ in 0..c.u2()? {
            let name = c.id()?;
            let t = c.u1()?;
            if t == 2 {
                let to = c.id()?;
                if to != 0 {
                    let field = self.strings.get(&name).cloned().unwrap_or_default();
                    self.roots.push(Root {
                        kind: "static field",
                        name: format!("{}.{field}", self.class_name(id)),
                        target: to,
                    });
                }
            } else {
                c.take(type_size(t, self.id_size).ok_or_else(|| anyhow::anyhow!("static of basic type {t}"))?)?;
            }
        }
        let mut fields = Vec::new();
        for _ in 0..c.u2()? {
            let name = c.id()?;
            fields.push((name, c.u1()?));
        }
        self.objs[i as usize].end = self.edges.len() as u32;
        self.classes.insert(id, Class { super_id, fields });
        Ok(())
    }

    /// The references of instance `i` from its field bytes (its class's fields first, then its
    /// superclass's). `Reference.referent` is not followed: weak, soft and phantom references
    /// do not keep an object alive.
    fn instance_edges(&mut self, i: u32, data: &[u8]) -> anyhow::Result<()> {
        let mut c = self.cur(data);
        let start = self.edges.len() as u32;
        let mut class = self.objs[i as usize].class;
        let direct = self.direct_classes.contains(&class);
        let mut depth = 0;
        while let Some(k) = self.classes.get(&class) {
            depth += 1;
            if depth > MAX_SUPERCLASSES {
                anyhow::bail!(
                    "class {} has more than {MAX_SUPERCLASSES} superclasses (a superclass cycle?)",
                    self.class_name(self.objs[i as usize].class)
                );
            }
            let weak = self.class_name(class) == "java.lang.ref.Reference";
            for &(name, t) in &k.fields {
                if t == 2 {
                    let to = c.id()?;
                    let referent = weak && self.strings.get(&name).is_some_and(|n| n == "referent");
                    if to != 0 && !referent {
                        self.edges.push((to, Label::Field(name)));
                    }
                } else if direct && t == 11 && self.strings.get(&name).is_some_and(|n| n == "address") {
                    let a = u64::from_be_bytes(c.take(8)?.try_into()?);
                    self.direct.push((i, a));
                } else {
                    c.take(type_size(t, self.id_size).ok_or_else(|| anyhow::anyhow!("field of basic type {t}"))?)?;
                }
            }
            class = k.super_id;
        }
        let o = &mut self.objs[i as usize];
        (o.start, o.end) = (start, self.edges.len() as u32);
        Ok(())
    }

    /// End of the file: the instances read before their class, the locals' roots named.
    fn finish(&mut self, deadline: Instant) -> anyhow::Result<()> {
        for (k, (i, data)) in std::mem::take(&mut self.pending).into_iter().enumerate() {
            self.instance_edges(i, &data)?;
            if k % 4096 == 4095 && Instant::now() > deadline {
                anyhow::bail!("reading the dump took longer than its time limit");
            }
        }
        for (obj, thread, depth) in std::mem::take(&mut self.java_frames) {
            let name = self.frame_name(thread, depth).map_or_else(|| "local".to_string(), |m| format!("local of {m}"));
            self.roots.push(Root { kind: "thread local", name, target: obj });
        }
        // Ties go to the first root: static fields, then JNI globals, then locals, then the rest.
        let order = |k: &str| match k {
            "static field" => 0,
            "JNI global" => 1,
            "thread local" => 2,
            _ => 3,
        };
        self.roots.sort_by_key(|r| order(r.kind));
        Ok(())
    }

    /// The method of frame `depth` of thread `thread`'s stack: `HoldsJvm.main`.
    fn frame_name(&self, thread: u32, depth: u32) -> Option<String> {
        let trace = self.traces.get(self.threads.get(&thread)?)?;
        let &(method, class_serial, _) = self.frames.get(trace.get(depth as usize)?)?;
        let class = self.class_serials.get(&class_serial).map(|&c| self.class_name(c)).unwrap_or_default();
        Some(format!("{class}.{}", self.strings.get(&method)?))
    }

    /// A class's name as Java spells it (`java.util.ArrayList`, `java.lang.Object[]`).
    fn class_name(&self, class: u64) -> String {
        if class == CLASS_OBJECT {
            return "java.lang.Class".to_string();
        }
        if class > u64::MAX - 16 {
            return prim_name((u64::MAX - class) as u8).to_string();
        }
        match self.class_names.get(&class).and_then(|n| self.strings.get(n)) {
            Some(n) => java_name(&n.replace('/', ".")),
            None => format!("class@{class:#x}"),
        }
    }

    /// The objects in the dump, by index.
    pub(super) fn objs(&self) -> &[Obj] {
        &self.objs
    }

    /// The indices of the objects object `i` refers to (weak referents left out).
    pub(super) fn references(&self, i: u32) -> impl Iterator<Item = u32> + '_ {
        let o = &self.objs[i as usize];
        self.edges[o.start as usize..o.end as usize].iter().filter_map(|(to, _)| self.index.get(to).copied())
    }

    /// The GC roots, static fields first: (kind, name, the object's index).
    pub(super) fn root_objects(&self) -> impl Iterator<Item = (&str, &str, u32)> + '_ {
        self.roots.iter().filter_map(|r| Some((r.kind, r.name.as_str(), *self.index.get(&r.target)?)))
    }

    /// The class name of object `i`.
    pub(super) fn class_of(&self, i: u32) -> String {
        self.class_name(self.objs[i as usize].class)
    }

    /// Objects in the dump.
    pub fn objects(&self) -> u64 {
        self.objs.len() as u64
    }

    /// The shortest path from a GC root to an instance of each of `classes` (Java names), for
    /// the root whose shortest paths reach most of the class's instances; a class absent from
    /// the dump, or reached from no root, is left out.
    pub fn paths_to(&self, classes: &[String]) -> Vec<RetainerPath> {
        let (parent, root_of) = self.walk();
        let mut out = Vec::new();
        for want in classes {
            let mut by_root: HashMap<u32, (u64, u32)> = HashMap::new();
            let mut instances = 0u64;
            for (i, o) in self.objs.iter().enumerate() {
                if self.class_name(o.class) != *want {
                    continue;
                }
                instances += 1;
                if root_of[i] != u32::MAX {
                    by_root.entry(root_of[i]).or_insert((0, i as u32)).0 += 1;
                }
            }
            let Some((&root, &(held, obj))) = by_root.iter().max_by_key(|(r, (n, _))| (*n, std::cmp::Reverse(**r)))
            else {
                continue;
            };
            let r = &self.roots[root as usize];
            out.push(RetainerPath {
                class: want.clone(),
                instances,
                held,
                root_kind: r.kind.to_string(),
                path: self.path(&parent, r, obj),
            });
        }
        out
    }

    /// Breadth first from every root: each object's parent (object index and label; roots:
    /// `u32::MAX`) and the root its shortest path starts at (`u32::MAX`: not reached).
    #[allow(clippy::type_complexity)]
    fn walk(&self) -> (Vec<(u32, Option<Label>)>, Vec<u32>) {
        let n = self.objs.len();
        let mut parent = vec![(u32::MAX, None); n];
        let mut root_of = vec![u32::MAX; n];
        let mut queue = std::collections::VecDeque::new();
        for (k, r) in self.roots.iter().enumerate() {
            if let Some(&i) = self.index.get(&r.target)
                && root_of[i as usize] == u32::MAX
            {
                root_of[i as usize] = k as u32;
                queue.push_back(i);
            }
        }
        while let Some(i) = queue.pop_front() {
            let o = &self.objs[i as usize];
            for &(to, label) in &self.edges[o.start as usize..o.end as usize] {
                if let Some(&j) = self.index.get(&to)
                    && root_of[j as usize] == u32::MAX
                {
                    root_of[j as usize] = root_of[i as usize];
                    parent[j as usize] = (i, Some(label));
                    queue.push_back(j);
                }
            }
        }
        (parent, root_of)
    }

    /// The steps from root `r` to object `obj`.
    fn path(&self, parent: &[(u32, Option<Label>)], r: &Root, obj: u32) -> Vec<String> {
        let mut chain = vec![obj];
        while let (p, Some(_)) = parent[*chain.last().unwrap_or(&obj) as usize] {
            chain.push(p);
            if chain.len() > self.objs.len() {
                break;
            }
        }
        chain.reverse();
        let mut steps = vec![r.name.clone()];
        for w in chain.windows(2) {
            let from = &self.objs[w[0] as usize];
            let step = match parent[w[1] as usize].1 {
                Some(Label::Field(name)) => {
                    format!("{}.{}", self.class_name(from.class), self.strings.get(&name).map_or("?", String::as_str))
                }
                _ => self.class_name(from.class),
            };
            steps.push(step);
        }
        steps.push(self.class_name(self.objs[obj as usize].class));
        steps
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A small HPROF file written the way HotSpot writes one (8-byte ids).
    pub(in crate::runtimes::jvm) struct Dump(pub(in crate::runtimes::jvm) Vec<u8>);

    impl Dump {
        pub(in crate::runtimes::jvm) fn new() -> Dump {
            let mut b = b"JAVA PROFILE 1.0.2\0".to_vec();
            b.extend(8u32.to_be_bytes());
            b.extend(0u64.to_be_bytes());
            Dump(b)
        }
        pub(in crate::runtimes::jvm) fn record(&mut self, tag: u8, body: &[u8]) {
            self.0.push(tag);
            self.0.extend(0u32.to_be_bytes());
            self.0.extend((body.len() as u32).to_be_bytes());
            self.0.extend(body);
        }
        pub(in crate::runtimes::jvm) fn string(&mut self, id: u64, s: &str) {
            let mut b = id.to_be_bytes().to_vec();
            b.extend(s.as_bytes());
            self.record(0x01, &b);
        }
        pub(in crate::runtimes::jvm) fn load_class(&mut self, serial: u32, class: u64, name: u64) {
            let mut b = serial.to_be_bytes().to_vec();
            b.extend(class.to_be_bytes());
            b.extend(0u32.to_be_bytes());
            b.extend(name.to_be_bytes());
            self.record(0x02, &b);
        }
    }

    pub(in crate::runtimes::jvm) fn id(b: &mut Vec<u8>, v: u64) {
        b.extend(v.to_be_bytes());
    }

    /// CLASS_DUMP of `class` (super `sup`) with object statics and instance fields.
    pub(in crate::runtimes::jvm) fn class_dump(
        b: &mut Vec<u8>,
        class: u64,
        sup: u64,
        statics: &[(u64, u64)],
        fields: &[(u64, u8)],
    ) {
        b.push(0x20);
        id(b, class);
        b.extend(0u32.to_be_bytes());
        id(b, sup);
        for _ in 0..5 {
            id(b, 0);
        }
        b.extend(16u32.to_be_bytes());
        b.extend(0u16.to_be_bytes());
        b.extend((statics.len() as u16).to_be_bytes());
        for &(name, v) in statics {
            id(b, name);
            b.push(2);
            id(b, v);
        }
        b.extend((fields.len() as u16).to_be_bytes());
        for &(name, t) in fields {
            id(b, name);
            b.push(t);
        }
    }

    pub(in crate::runtimes::jvm) fn instance(b: &mut Vec<u8>, obj: u64, class: u64, data: &[u8]) {
        b.push(0x21);
        id(b, obj);
        b.extend(0u32.to_be_bytes());
        id(b, class);
        b.extend((data.len() as u32).to_be_bytes());
        b.extend(data);
    }

    /// `App.CACHE` → a Box whose `items` array holds two Recs (each with a byte[] `data` and an
    /// int); a third Rec held by a JNI global only; a fourth only by a weak reference (not a
    /// path); a Rec instance read before its class (HotSpot never does, a dump may).
    #[test]
    fn shortest_paths_from_a_static_field() {
        let mut d = Dump::new();
        for (i, s) in [
            "App",
            "Box",
            "[Ljava/lang/Object;",
            "Rec",
            "java/lang/ref/Reference",
            "CACHE",
            "items",
            "data",
            "n",
            "referent",
        ]
        .iter()
        .enumerate()
        {
            d.string(1 + i as u64, s);
        }
        for (k, c) in [100u64, 101, 102, 103, 104].iter().enumerate() {
            d.load_class(k as u32 + 1, *c, k as u64 + 1);
        }
        let mut h = Vec::new();
        let rec = |data: u64| [data.to_be_bytes().as_slice(), &7u32.to_be_bytes()].concat();
        instance(&mut h, 402, 103, &rec(0));
        class_dump(&mut h, 100, 0, &[(6, 200)], &[]);
        class_dump(&mut h, 101, 0, &[], &[(7, 2)]);
        class_dump(&mut h, 102, 0, &[], &[]);
        class_dump(&mut h, 103, 0, &[], &[(8, 2), (9, 10)]);
        class_dump(&mut h, 104, 0, &[], &[(10, 2)]);
        instance(&mut h, 200, 101, &300u64.to_be_bytes());
        h.push(0x22);
        id(&mut h, 300);
        h.extend(0u32.to_be_bytes());
        h.extend(3u32.to_be_bytes());
        id(&mut h, 102);
        for v in [400u64, 401, 0] {
            id(&mut h, v);
        }
        instance(&mut h, 400, 103, &rec(500));
        instance(&mut h, 401, 103, &rec(0));
        instance(&mut h, 403, 103, &rec(0));
        instance(&mut h, 600, 104, &403u64.to_be_bytes());
        h.push(0x23);
        id(&mut h, 500);
        h.extend(0u32.to_be_bytes());
        h.extend(4u32.to_be_bytes());
        h.push(8);
        h.extend([1, 2, 3, 4]);
        h.push(0x01);
        id(&mut h, 402);
        id(&mut h, 9999);
        h.push(0xFF);
        id(&mut h, 600);
        d.record(0x1C, &h);
        d.record(0x2C, &[]);
        let g = read(d.0.as_slice(), Instant::now() + Duration::from_secs(5)).expect("a dump");
        assert_eq!(g.objects(), 13);
        let p = g.paths_to(&["Rec".into(), "byte[]".into(), "Nothing".into()]);
        assert_eq!(p.len(), 2, "a class absent from the dump has no path");
        assert_eq!((p[0].instances, p[0].held, p[0].root_kind.as_str()), (4, 2, "static field"));
        assert_eq!(p[0].path, ["App.CACHE", "Box.items", "java.lang.Object[]", "Rec"]);
        assert_eq!(p[1].path, ["App.CACHE", "Box.items", "java.lang.Object[]", "Rec.data", "byte[]"]);
        assert_eq!(p[1].describe(), "App.CACHE → Box.items → java.lang.Object[] → Rec.data → byte[]");
        let mut bad = d.0.clone();
        bad[0] = b'X';
        assert!(read(bad.as_slice(), Instant::now() + Duration::from_secs(5)).is_err());
        let cut = &d.0[..d.0.len() - 20];
        assert!(read(cut, Instant::now() + Duration::from_secs(5)).is_err(), "a truncated dump is an error");
    }

    /// A class that is its own superclass, and two classes each the other's: an instance of
    /// either is an error at once, not an endless walk up the hierarchy.
    #[test]
    fn a_superclass_cycle_is_an_error() {
        for (a_super, b_super) in [(100u64, 0u64), (101, 100)] {
            let mut d = Dump::new();
            d.string(1, "Loop");
            d.load_class(1, 100, 1);
            let mut h = Vec::new();
            class_dump(&mut h, 100, a_super, &[], &[]);
            class_dump(&mut h, 101, b_super, &[], &[]);
            instance(&mut h, 200, 100, &[]);
            d.record(0x1C, &h);
            let clock = Instant::now();
            let e = read(d.0.as_slice(), Instant::now() + Duration::from_secs(5)).err().expect("an error");
            assert!(e.to_string().contains("superclass cycle"), "{e}");
            assert!(clock.elapsed() < Duration::from_secs(1));
        }
    }

    /// A record header that claims 4 GiB in a file of a few bytes: an error saying where it ends.
    #[test]
    fn a_record_longer_than_the_file_is_an_error() {
        let mut d = Dump::new();
        d.0.push(0x1C);
        d.0.extend(0u32.to_be_bytes());
        d.0.extend(u32::MAX.to_be_bytes());
        d.0.extend([0x05, 0, 0]);
        let e = read(d.0.as_slice(), Instant::now() + Duration::from_secs(5)).err().expect("an error");
        assert!(e.to_string().contains("ends after"), "{e}");
        let e = read(&[b'J'; 4096][..], Instant::now() + Duration::from_secs(5)).err().expect("an error");
        assert!(e.to_string().contains("not an HPROF"), "{e}");
    }
}
