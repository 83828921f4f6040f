//! Node.js detection: a mapped node, nodejs or libnode.so that exports N-API. The frame rules
//! are in `leaktrace_analysis::runtimes::node`.

pub mod cdp;
pub mod census;
pub mod dom;
pub mod guard;
pub mod snap;
pub mod snapshots;

use leaktrace_analysis::runtimes::node::is_node_object;

use super::{RuntimeInfo, RuntimeInstance, RuntimeOptions, file_name};
use crate::holds::census::{CensusOptions, RuntimeCensus};
use crate::objects::MappedObject;
use leaktrace_analysis::recording::Runtime;

/// Detect Node: a mapped object named node/nodejs/libnode.so that exports N-API.
pub fn detect(_pid: u32, objects: &[MappedObject]) -> Option<RuntimeInfo> {
    let obj = objects.iter().find(|o| {
        is_node_object(&file_name(&o.path))
            && crate::discover::function_offsets(&o.open_path, &["napi_create_object"]).is_ok_and(|m| !m.is_empty())
    })?;
    Some(RuntimeInfo {
        name: Runtime::Node,
        version: None,
        notes: vec![format!(
            "Node.js runtime detected ({}): managed = V8 heap pages (resident bytes); off-heap = \
             ArrayBuffer/Buffer backing stores; native = malloc from addons",
            obj.path.display()
        )],
    })
}

/// Node.js ([`super::RuntimeDetector`]).
pub struct Node;

impl super::RuntimeDetector for Node {
    fn detect(&self, pid: u32, objects: &[MappedObject], _opts: RuntimeOptions) -> Option<Box<dyn RuntimeInstance>> {
        Some(Box::new(NodeInstance(detect(pid, objects)?)))
    }
}

/// Node in one process: its JIT frames are named from the perf map node writes itself.
struct NodeInstance(RuntimeInfo);

impl RuntimeInstance for NodeInstance {
    fn info(&self) -> &RuntimeInfo {
        &self.0
    }

    /// Its sampling heap profile (and `--heap-snapshots`), started at attach to a running
    /// process (before its probes), else at the first poll; ended once the probes are detached.
    fn census(&self, pid: u32, opts: CensusOptions, _at_attach: bool) -> Option<Box<dyn RuntimeCensus>> {
        Some(crate::holds::census::node(pid, opts))
    }

    fn unnamed_jit_advice(&self) -> Option<String> {
        Some(
            "JIT frames (JavaScript) are unnamed: start node with --perf-basic-prof (or \
             --perf-basic-prof-only-functions) so it writes /tmp/perf-PID.map, which leaktrace reads"
                .to_string(),
        )
    }
}
