//! What a Node inspector answers, read with bounds: the inspector is the target's, and so is
//! every byte it sends. `/json/list` is read up to [`MAX_LIST_REPLY`]; a heap snapshot's chunks
//! are joined up to a cap derived from `--heap-dump-max-size` ([`snapshot_text_cap`]); single
//! messages are bounded by the WebSocket's own limits (tungstenite: 64 MiB a message).
//! Pure functions of the bytes received, fuzzed through [`crate::fuzzing`].

use std::io::Read;

use serde_json::Value;

/// Longest `/json/list` reply read (a Node process lists one target, about 600 B).
pub const MAX_LIST_REPLY: u64 = 1 << 20;
/// A snapshot's JSON is about twice the JS heap it describes: up to this many times
/// `--heap-dump-max-size` is read, plus [`SNAPSHOT_TEXT_SLACK`].
const SNAPSHOT_TEXT_PER_HEAP_BYTE: u64 = 8;
const SNAPSHOT_TEXT_SLACK: u64 = 64 << 20;

/// The answer of `NodeCensus::call_collect`: the events' chunks joined, when the first came
/// (seconds after the call was sent), how many.
pub(crate) struct Collected {
    pub text: String,
    pub first_s: Option<f64>,
    pub chunks: u64,
}

/// The HTTP reply to `/json/list`, at most [`MAX_LIST_REPLY`] bytes of it.
pub fn read_list_reply(r: impl Read) -> Vec<u8> {
    let mut reply = Vec::new();
    let _ = r.take(MAX_LIST_REPLY).read_to_end(&mut reply);
    reply
}

/// The first target's WebSocket URL from the HTTP reply to `/json/list`.
pub fn ws_url(reply: &[u8]) -> Result<String, String> {
    let split = reply.windows(4).position(|w| w == b"\r\n\r\n").ok_or("no HTTP answer to /json/list")?;
    let list: Value = serde_json::from_slice(&reply[split + 4..]).map_err(|e| format!("/json/list: {e}"))?;
    let url = list[0]["webSocketDebuggerUrl"].as_str().ok_or("/json/list names no target")?;
    if !url.starts_with("ws://") || url.len() > 4096 {
        return Err(format!("/json/list: not a ws:// URL: {:?}", url.chars().take(80).collect::<String>()));
    }
    Ok(url.to_string())
}

/// Bytes of snapshot JSON read at most for a JS heap limit of `max_heap` bytes.
pub fn snapshot_text_cap(max_heap: u64) -> usize {
    let cap = max_heap.saturating_mul(SNAPSHOT_TEXT_PER_HEAP_BYTE).saturating_add(SNAPSHOT_TEXT_SLACK);
    usize::try_from(cap).unwrap_or(usize::MAX)
}

impl Collected {
    /// One message `v` received while waiting for the answer to call `id` whose result comes
    /// as `event`s: a chunk is joined (an error past `cap` bytes in all); Ok(true) when `v` is
    /// the answer, Err when it is an error or the chunks are over the cap.
    pub(crate) fn absorb(&mut self, v: &Value, method: &str, event: &str, id: u64, cap: usize) -> Result<bool, String> {
        if v["method"] == event {
            self.chunks += 1;
            let chunk = v["params"]["chunk"].as_str().unwrap_or("");
            if self.text.len().saturating_add(chunk.len()) > cap {
                return Err(format!("{method}: the answer is over {cap} B: given up"));
            }
            self.text.push_str(chunk);
            return Ok(false);
        }
        if v["id"] == id {
            if let Some(e) = v.get("error") {
                return Err(format!("{method}: {}", e["message"].as_str().unwrap_or("error")));
            }
            return Ok(true);
        }
        Ok(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_list_reply_read_with_a_cap() {
        let ok = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n[{\"webSocketDebuggerUrl\": \"ws://127.0.0.1:9229/abc\"}]";
        assert_eq!(ws_url(ok).unwrap(), "ws://127.0.0.1:9229/abc");
        assert!(ws_url(b"HTTP/1.1 200 OK\r\n\r\n[{\"webSocketDebuggerUrl\": \"file:///etc\"}]").is_err());
        assert!(ws_url(b"HTTP/1.1 200 OK\r\n\r\n[]").is_err());
        // An inspector that never stops sending: the read ends at the cap.
        let endless = std::io::repeat(b'x');
        assert_eq!(read_list_reply(endless).len() as u64, MAX_LIST_REPLY);
    }

    #[test]
    fn snapshot_chunks_stop_at_the_cap() {
        let mut c = Collected { text: String::new(), first_s: None, chunks: 0 };
        let chunk = serde_json::json!({ "method": "E", "params": { "chunk": "0123456789" } });
        assert_eq!(c.absorb(&chunk, "M", "E", 7, 25), Ok(false));
        assert_eq!(c.absorb(&chunk, "M", "E", 7, 25), Ok(false));
        assert!(c.absorb(&chunk, "M", "E", 7, 25).unwrap_err().contains("over 25 B"));
        assert_eq!(c.text.len(), 20);
        assert_eq!(c.absorb(&serde_json::json!({ "id": 7, "result": {} }), "M", "E", 7, 25), Ok(true));
        assert_eq!(snapshot_text_cap(u64::MAX), usize::MAX);
    }
}
