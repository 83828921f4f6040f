//! The node's container runtime asked through the CRI (the kubelet's own gRPC API):
//! `ListPodSandbox` and `ListContainers` over the runtime's UNIX socket give, for each container
//! ID, its pod's name, namespace and UID and its container name, and the IDs of the sandboxes.
//!
//! Sockets tried, first that answers: `--cri-socket` ([`set_socket`]), `$LEAKTRACE_CRI_SOCKET`
//! (colon-separated), then
//! [`SOCKETS`] (containerd, k3s's containerd, CRI-O). Each call is bounded (2 s, 16 MiB).
//! The answers are the runtime's, trusted as the kubelet trusts them; nothing here comes from
//! a target.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, bail};

/// The runtimes' usual CRI sockets.
pub const SOCKETS: &[&str] =
    &["/run/containerd/containerd.sock", "/run/k3s/containerd/containerd.sock", "/run/crio/crio.sock"];

/// Longest one call may take, and the largest answer read.
const CALL_TIMEOUT: Duration = Duration::from_secs(2);
const MAX_REPLY: usize = 16 << 20;

/// A container as the runtime names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CriContainer {
    pub pod: String,
    pub namespace: String,
    pub pod_uid: String,
    pub container: String,
}

/// What the runtime said: its containers by ID, and its sandboxes' IDs.
#[derive(Debug, Default)]
pub struct CriView {
    pub socket: PathBuf,
    pub containers: HashMap<String, CriContainer>,
    pub sandboxes: HashSet<String>,
}

static SOCKET: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();

/// The runtime's socket given on the command line (`--cri-socket`), tried first.
pub fn set_socket(path: PathBuf) {
    let _ = SOCKET.set(path);
}

/// The socket paths to try, in order.
pub fn socket_candidates() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = SOCKET.get().cloned().into_iter().collect();
    v.extend(
        std::env::var("LEAKTRACE_CRI_SOCKET")
            .map(|s| s.split(':').filter(|p| !p.is_empty()).map(PathBuf::from).collect::<Vec<_>>())
            .unwrap_or_default(),
    );
    v.extend(SOCKETS.iter().map(PathBuf::from));
    v
}

/// The view of the first socket that answers; None when none does (the reasons are logged).
pub fn query() -> Option<CriView> {
    for socket in socket_candidates() {
        if !socket.exists() {
            continue;
        }
        match query_socket(&socket) {
            Ok(v) => return Some(v),
            Err(e) => log::debug!("CRI at {}: {e:#}", socket.display()),
        }
    }
    None
}

/// `ListPodSandbox` and `ListContainers` on `socket`.
pub fn query_socket(socket: &Path) -> anyhow::Result<CriView> {
    let socket_owned = socket.to_path_buf();
    // Its own thread and runtime: callers may or may not be inside one already.
    let (sandboxes, containers) = std::thread::spawn(move || -> anyhow::Result<_> {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        rt.block_on(async {
            let s = unary(&socket_owned, "ListPodSandbox", Vec::new()).await?;
            let c = unary(&socket_owned, "ListContainers", Vec::new()).await?;
            Ok((s, c))
        })
    })
    .join()
    .map_err(|_| anyhow::anyhow!("the CRI client thread panicked"))??;
    let sandboxes: pb::ListPodSandboxResponse =
        prost::Message::decode(sandboxes.as_slice()).context("ListPodSandbox answer")?;
    let containers: pb::ListContainersResponse =
        prost::Message::decode(containers.as_slice()).context("ListContainers answer")?;
    Ok(view(socket, sandboxes, containers))
}

fn view(socket: &Path, sandboxes: pb::ListPodSandboxResponse, containers: pb::ListContainersResponse) -> CriView {
    let pods: HashMap<&str, &pb::PodSandboxMetadata> =
        sandboxes.items.iter().filter_map(|s| Some((s.id.as_str(), s.metadata.as_ref()?))).collect();
    let mut out = CriView { socket: socket.to_path_buf(), ..Default::default() };
    for c in &containers.items {
        let Some(meta) = pods.get(c.pod_sandbox_id.as_str()) else { continue };
        out.containers.insert(
            c.id.clone(),
            CriContainer {
                pod: meta.name.clone(),
                namespace: meta.namespace.clone(),
                pod_uid: meta.uid.clone(),
                container: c.metadata.as_ref().map(|m| m.name.clone()).unwrap_or_default(),
            },
        );
    }
    out.sandboxes = sandboxes.items.into_iter().map(|s| s.id).collect();
    out
}

/// One unary call of `runtime.v1.RuntimeService/METHOD` (gRPC over HTTP/2 on a UNIX socket);
/// the answer's protobuf bytes.
async fn unary(socket: &Path, method: &str, request: Vec<u8>) -> anyhow::Result<Vec<u8>> {
    tokio::time::timeout(CALL_TIMEOUT, unary_inner(socket, method, request))
        .await
        .map_err(|_| anyhow::anyhow!("no answer to {method} in {CALL_TIMEOUT:?}"))?
}

async fn unary_inner(socket: &Path, method: &str, request: Vec<u8>) -> anyhow::Result<Vec<u8>> {
    let stream = tokio::net::UnixStream::connect(socket).await.context("connect")?;
    let (client, connection) = h2::client::Builder::new()
        .initial_window_size(MAX_REPLY as u32)
        .initial_connection_window_size(MAX_REPLY as u32)
        .handshake::<_, bytes::Bytes>(stream)
        .await
        .context("HTTP/2 handshake")?;
    let driver = tokio::spawn(async move {
        let _ = connection.await;
    });
    let result = call(client, method, request).await;
    driver.abort();
    result
}

async fn call(
    client: h2::client::SendRequest<bytes::Bytes>,
    method: &str,
    request: Vec<u8>,
) -> anyhow::Result<Vec<u8>> {
    let mut client = client.ready().await?;
    let req = http::Request::builder()
        .method("POST")
        .uri(format!("http://localhost/runtime.v1.RuntimeService/{method}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())?;
    let (response, mut send) = client.send_request(req, false)?;
    let mut framed = Vec::with_capacity(5 + request.len());
    framed.push(0);
    framed.extend_from_slice(&(request.len() as u32).to_be_bytes());
    framed.extend_from_slice(&request);
    send.send_data(framed.into(), true)?;
    let (parts, mut body) = response.await?.into_parts();
    let mut data = Vec::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk?;
        if data.len() + chunk.len() > MAX_REPLY {
            bail!("{method}: answer over {MAX_REPLY} bytes");
        }
        data.extend_from_slice(&chunk);
        let _ = body.flow_control().release_capacity(chunk.len());
    }
    let trailers = body.trailers().await?.unwrap_or_default();
    let status = |h: &http::HeaderMap| h.get("grpc-status").and_then(|v| v.to_str().ok()).map(str::to_string);
    let code = status(&trailers).or_else(|| status(&parts.headers)).unwrap_or_default();
    if code != "0" {
        let msg = trailers.get("grpc-message").or(parts.headers.get("grpc-message"));
        bail!("{method}: gRPC status {code:?} {}", msg.and_then(|m| m.to_str().ok()).unwrap_or(""));
    }
    if data.len() < 5 || data[0] != 0 {
        bail!("{method}: not one uncompressed gRPC message ({} bytes)", data.len());
    }
    let len = u32::from_be_bytes([data[1], data[2], data[3], data[4]]) as usize;
    if data.len() != 5 + len {
        bail!("{method}: message of {len} bytes in {} bytes", data.len() - 5);
    }
    Ok(data.split_off(5))
}

/// The fields of CRI v1's api.proto that leaktrace reads (numbers as there).
mod pb {
    #[derive(Clone, PartialEq, prost::Message)]
    pub(super) struct ListPodSandboxResponse {
        #[prost(message, repeated, tag = "1")]
        pub(super) items: Vec<PodSandbox>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub(super) struct PodSandbox {
        #[prost(string, tag = "1")]
        pub(super) id: String,
        #[prost(message, optional, tag = "2")]
        pub(super) metadata: Option<PodSandboxMetadata>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub(super) struct PodSandboxMetadata {
        #[prost(string, tag = "1")]
        pub(super) name: String,
        #[prost(string, tag = "2")]
        pub(super) uid: String,
        #[prost(string, tag = "3")]
        pub(super) namespace: String,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub(super) struct ListContainersResponse {
        #[prost(message, repeated, tag = "1")]
        pub(super) items: Vec<Container>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub(super) struct Container {
        #[prost(string, tag = "1")]
        pub(super) id: String,
        #[prost(string, tag = "2")]
        pub(super) pod_sandbox_id: String,
        #[prost(message, optional, tag = "3")]
        pub(super) metadata: Option<ContainerMetadata>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub(super) struct ContainerMetadata {
        #[prost(string, tag = "1")]
        pub(super) name: String,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn containers_named_by_their_sandbox() {
        let meta = |name: &str, uid: &str, ns: &str| {
            Some(pb::PodSandboxMetadata { name: name.into(), uid: uid.into(), namespace: ns.into() })
        };
        let sandboxes = pb::ListPodSandboxResponse {
            items: vec![
                pb::PodSandbox { id: "s1".into(), metadata: meta("web", "u1", "shop") },
                pb::PodSandbox { id: "s2".into(), metadata: meta("db", "u2", "data") },
            ],
        };
        let c = |id: &str, sandbox: &str, name: &str| pb::Container {
            id: id.into(),
            pod_sandbox_id: sandbox.into(),
            metadata: Some(pb::ContainerMetadata { name: name.into() }),
        };
        let containers = pb::ListContainersResponse {
            items: vec![c("c1", "s1", "app"), c("c2", "s1", "sidecar"), c("c3", "gone", "orphan")],
        };
        // Through the wire format, as the runtime sends them.
        let sandboxes = prost::Message::decode(prost::Message::encode_to_vec(&sandboxes).as_slice()).unwrap();
        let containers = prost::Message::decode(prost::Message::encode_to_vec(&containers).as_slice()).unwrap();
        let v = view(Path::new("/run/x.sock"), sandboxes, containers);
        assert_eq!(
            v.containers["c2"],
            CriContainer {
                pod: "web".into(),
                namespace: "shop".into(),
                pod_uid: "u1".into(),
                container: "sidecar".into()
            }
        );
        assert!(!v.containers.contains_key("c3"), "a container of an unknown sandbox is left out");
        assert_eq!(v.sandboxes, HashSet::from(["s1".to_string(), "s2".to_string()]));
    }

    #[test]
    fn no_socket_answers() {
        let e = query_socket(Path::new("/nonexistent/cri.sock")).unwrap_err();
        assert!(format!("{e:#}").contains("connect"), "{e:#}");
    }
}
