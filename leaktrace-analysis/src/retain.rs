//! "What holds it", one model for every producer: the path from a root to what it holds
//! ([`RetainPath`], typed steps), what a holder retains ([`Retained`], split native / managed /
//! off-heap) and when a holder's count is growth ([`is_growing`]). The native reachability scan
//! ([`crate::reachability`]), the Python census ([`crate::runtimes::python::heap`]) and the
//! runtimes' own tools ([`crate::holds`]: JVM heap dumps, Node heap snapshots, the Go walk)
//! keep their own records in recording.json and turn them into these for report.json and
//! report.md ("What holds it", `report/what_holds.rs`). This module imports none of them.

use serde::{Deserialize, Serialize};

/// The bytes a holder retains in a heap graph (managed objects, and the traced native blocks
/// they point into, as one graph): what would be freed if the holder alone were released (its
/// dominator-tree subtree).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Retained {
    /// The holder's name: a Python container's path up to its first key or index
    /// (`__main__.PENDING`), a JVM root (`App.BUFFERS`).
    pub container: String,
    /// Bytes of traced native blocks it retains.
    pub native: u64,
    /// Bytes of managed objects it retains (itself included).
    pub managed: u64,
    /// Bytes of off-heap buffers it retains (the JVM's direct buffers; none for Python).
    #[serde(default)]
    pub off_heap: u64,
    /// Traced native blocks the holder's objects point into, and their bytes.
    pub blocks: u64,
    pub block_bytes: u64,
    /// The function that allocated most of those blocks (the culprit of their stack), and the
    /// stack's id; with its caller, for reading (`img_alloc_buffer ← decode_batch`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocated_by: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocated_stack: Option<u32>,
    /// The blocks' sites and how many blocks each (the recorder turns the most common into
    /// `allocated_stack`); not saved.
    #[serde(skip)]
    pub sites: Vec<(leaktrace_common::SiteKey, u64)>,
}

impl Retained {
    /// A holder `container` retaining `bytes` (its dominator subtree's split), whose objects point
    /// into `blocks` traced blocks of `block_bytes` bytes from `sites` (site → blocks, any order;
    /// kept most blocks first).
    pub fn of(
        container: String,
        bytes: crate::dominators::Bytes,
        (blocks, block_bytes): (u64, u64),
        sites: impl IntoIterator<Item = (leaktrace_common::SiteKey, u64)>,
    ) -> Retained {
        let mut sites: Vec<(leaktrace_common::SiteKey, u64)> = sites.into_iter().collect();
        sites.sort_by_key(|s| std::cmp::Reverse(s.1));
        Retained {
            container,
            native: bytes.native,
            managed: bytes.managed,
            off_heap: bytes.off_heap,
            blocks,
            block_bytes,
            sites,
            ..Default::default()
        }
    }

    pub fn total(&self) -> u64 {
        self.native.saturating_add(self.managed).saturating_add(self.off_heap)
    }
}

/// A count grows when it gained at least 20 and 5 % of its first value between the first and
/// the last census (objects of a type, objects of a holder, a holder's blocks).
pub fn is_growing(first: u64, last: u64) -> bool {
    last >= first + 20 && (last - first) * 20 >= first
}

/// What a path starts at.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum RootKind {
    /// Native: a global variable (writable data of a mapped object).
    Global,
    /// Native: a slot of a thread's stack.
    Stack,
    /// Native: a register of a stopped thread.
    Register,
    /// Native: heap memory that is no traced block (allocated before attach, the allocator's
    /// own, a thread descriptor).
    Untraced,
    /// Python: a module's global (`__main__.PENDING`).
    ModuleGlobal,
    /// Python: a local variable of a function running in a live thread.
    FrameLocal,
    /// Python: no path from any module or live frame, and more references than the objects
    /// read hold (a reference held by native code; when it grows, a missing `Py_DECREF`).
    Unreferenced,
    /// JVM: a static field (`App.BUFFERS`).
    StaticField,
    /// JVM: a JNI global or local reference.
    JniReference,
    /// JVM: a thread's local, a thread object or its stack.
    ThreadLocal,
    /// Go: a package-level variable (`main.memo`).
    PackageVariable,
    /// Go: a goroutine's local (`main.main.l`).
    GoroutineLocal,
    /// Another GC root of a runtime (a system class, a monitor, V8's `(GC roots)`), named by
    /// the root's `name`.
    GcRoot,
}

impl RootKind {
    /// In words, for report.md.
    pub fn words(self) -> &'static str {
        match self {
            RootKind::Global => "global",
            RootKind::Stack => "thread stack",
            RootKind::Register => "register",
            RootKind::Untraced => "untraced memory",
            RootKind::ModuleGlobal => "module global",
            RootKind::FrameLocal => "frame local",
            RootKind::Unreferenced => "no root found",
            RootKind::StaticField => "static field",
            RootKind::JniReference => "JNI reference",
            RootKind::ThreadLocal => "thread local",
            RootKind::PackageVariable => "package variable",
            RootKind::GoroutineLocal => "goroutine local",
            RootKind::GcRoot => "GC root",
        }
    }
}

/// A path's root. The native scan's roots keep what locates them (`symbol`, `object`,
/// `thread`, `function`, `register`, `region`, `addr`); a runtime's roots are named by `name`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Root {
    pub kind: RootKind,
    /// The root as the report writes it: `g_sessions (server)`, `__main__.PENDING`,
    /// `HoldsJvm.AUDIT`, `main.memo`.
    pub name: String,
    /// `native`, `python`, `jvm`, `go`, `node`.
    pub runtime: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub symbol: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub object: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offset: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thread: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub function: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub register: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub addr: Option<u64>,
}

impl Root {
    /// A runtime's root: `kind`, named `name`.
    pub fn named(kind: RootKind, name: impl Into<String>, runtime: &str) -> Root {
        Root {
            kind,
            name: name.into(),
            runtime: runtime.into(),
            symbol: None,
            object: None,
            offset: None,
            thread: None,
            function: None,
            register: None,
            region: None,
            addr: None,
        }
    }
}

/// How an edge goes from one object to the next.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum EdgeKind {
    /// An attribute or field (`.bus`, `java.util.ArrayList.elementData`, `auditTrail`).
    Field,
    /// A dict or map key (`['ack:17']`).
    Key,
    /// A list, tuple or array index (`[17]`).
    Index,
    /// Anything else the runtime names (`.<+0x48>`: a word at that offset of an object whose
    /// layout is not decoded; a closure's cell; V8's internal edges).
    Other,
}

impl EdgeKind {
    /// The kind of a Python or V8 edge label: `.x` a field, `[0]` an index, `['k']` a key.
    pub fn of_label(label: &str) -> EdgeKind {
        if let Some(inner) = label.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            return if !inner.is_empty() && inner.bytes().all(|b| b.is_ascii_digit()) {
                EdgeKind::Index
            } else {
                EdgeKind::Key
            };
        }
        if label.starts_with(".<") || label.contains("__closure__") || label.contains("cell_contents") {
            return EdgeKind::Other;
        }
        EdgeKind::Field
    }
}

/// One step of a retaining path.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(tag = "step", rename_all = "snake_case")]
pub enum RetainStep {
    /// Where the path starts (always the first step).
    Root(Root),
    /// The edge taken to the next step.
    Edge {
        #[serde(rename = "edge_kind")]
        kind: EdgeKind,
        /// As the runtime writes it: `.bus`, `['ack:17']`, `[0]`, `java.util.ArrayList.elementData`.
        edge: String,
    },
    /// A managed object of a runtime.
    Object {
        runtime: String,
        #[serde(rename = "type")]
        type_name: String,
    },
    /// A traced native block: its site (`sites[].id`), the site's culprit function, its size
    /// when known, and the offset of the word pointing to the next step (None for the last).
    Native {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        stack: Option<u32>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        allocated_by: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        bytes: Option<u64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        offset: Option<u64>,
    },
    /// Steps left out of a long path (the root and the steps nearest the end are kept).
    Elided { steps: u64 },
}

/// A retaining path, root first; the last step is what is held.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(transparent)]
pub struct RetainPath(pub Vec<RetainStep>);

impl RetainPath {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The root, when the path has one.
    pub fn root(&self) -> Option<&Root> {
        match self.0.first() {
            Some(RetainStep::Root(r)) => Some(r),
            _ => None,
        }
    }

    /// A path of string labels as the JVM's heap dump and V8's snapshot write it: the root,
    /// then fields (`Class.field`, `name (Class)`), indices (`[17]`) and array classes
    /// (`java.lang.Object[]`), then the class of what is held.
    pub fn of_labels(runtime: &str, root: RootKind, labels: &[String]) -> RetainPath {
        let mut steps = Vec::new();
        let Some((first, rest)) = labels.split_first() else { return RetainPath(steps) };
        steps.push(RetainStep::Root(Root::named(root, first.clone(), runtime)));
        let object = |t: &str| RetainStep::Object { runtime: runtime.into(), type_name: t.into() };
        for (k, l) in rest.iter().enumerate() {
            if k + 1 == rest.len() || l.ends_with("[]") {
                steps.push(object(l));
            } else if let Some((edge, class)) = l.strip_suffix(')').and_then(|x| x.rsplit_once(" (")) {
                steps.push(RetainStep::Edge { kind: EdgeKind::of_label(edge), edge: edge.into() });
                steps.push(object(class));
            } else if l.starts_with('[') {
                steps.push(RetainStep::Edge { kind: EdgeKind::of_label(l), edge: l.clone() });
            } else {
                steps.push(RetainStep::Edge { kind: EdgeKind::Field, edge: l.clone() });
            }
        }
        RetainPath(steps)
    }

    /// The path in one line, root first:
    /// `__main__.PENDING (module global) → ['k'] → img.Buffer → native block of img_alloc (3.0 KiB)`.
    pub fn text(&self) -> String {
        let mut parts: Vec<String> = Vec::new();
        for s in &self.0 {
            let part = match s {
                RetainStep::Root(r) => format!("{} ({})", r.name, r.kind.words()),
                RetainStep::Edge { edge, .. } => edge.clone(),
                RetainStep::Object { type_name, .. } => type_name.clone(),
                RetainStep::Native { stack, allocated_by, bytes, offset } => {
                    let by = allocated_by.clone().or_else(|| stack.map(|s| format!("site {s}")));
                    let mut t = by.map_or_else(|| "native block".to_string(), |f| format!("native block of {f}"));
                    if let Some(b) = bytes {
                        t.push_str(&format!(" ({})", crate::human::bytes(*b)));
                    }
                    if let Some(o) = offset {
                        t.push_str(&format!(" +{o}"));
                    }
                    t
                }
                RetainStep::Elided { steps: 0 } => "…".to_string(),
                RetainStep::Elided { steps } => format!("… {steps} more …"),
            };
            parts.push(part);
        }
        parts.join(" → ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_become_typed_steps() {
        let labels: Vec<String> =
            ["HoldsJvm.AUDIT", "java.util.ArrayList.elementData", "java.lang.Object[]", "HoldsJvm$AuditRecord"]
                .map(String::from)
                .into();
        let p = RetainPath::of_labels("jvm", RootKind::StaticField, &labels);
        assert_eq!(p.root().map(|r| r.name.as_str()), Some("HoldsJvm.AUDIT"));
        assert_eq!(
            p.text(),
            "HoldsJvm.AUDIT (static field) → java.util.ArrayList.elementData → java.lang.Object[] → HoldsJvm$AuditRecord"
        );
        let j = serde_json::to_value(&p).unwrap();
        assert_eq!(j[0]["step"], "root");
        assert_eq!(j[0]["kind"], "static_field");
        assert_eq!(j[1]["step"], "edge");
        assert_eq!(j[1]["edge_kind"], "field");
        assert_eq!(j[2]["type"], "java.lang.Object[]");
        let back: RetainPath = serde_json::from_value(j).unwrap();
        assert_eq!(back, p);

        let node: Vec<String> = ["(GC roots)", "auditTrail (Array)", "[17]", "AuditEntry"].map(String::from).into();
        let p = RetainPath::of_labels("node", RootKind::GcRoot, &node);
        let j = serde_json::to_value(&p).unwrap();
        assert_eq!((j[1]["edge"].as_str(), j[2]["type"].as_str()), (Some("auditTrail"), Some("Array")));
        assert_eq!((j[3]["edge_kind"].as_str(), j[4]["type"].as_str()), (Some("index"), Some("AuditEntry")));
    }

    #[test]
    fn edge_kinds() {
        assert_eq!(EdgeKind::of_label("[17]"), EdgeKind::Index);
        assert_eq!(EdgeKind::of_label("['ack:17']"), EdgeKind::Key);
        assert_eq!(EdgeKind::of_label("[…]"), EdgeKind::Key);
        assert_eq!(EdgeKind::of_label(".bus"), EdgeKind::Field);
        assert_eq!(EdgeKind::of_label(".<+0x48>"), EdgeKind::Other);
    }

    #[test]
    fn growth_needs_20_and_5_percent() {
        assert!(is_growing(100, 120) && !is_growing(100, 119) && !is_growing(1000, 1040) && is_growing(0, 20));
    }
}
