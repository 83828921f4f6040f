//! A profile store for the `--push` tests: a small HTTP server on the loopback (127.0.0.1)
//! that answers the first request with 503 and stores every request, with the parsers of what
//! Pyroscope's ingest API carries (multipart parts, query parameters).
use std::io::{Read as _, Write as _};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// One request the server received, and the status it answered.
#[derive(Clone, Debug)]
pub struct Received {
    /// The request target (path and query).
    pub target: String,
    pub content_type: String,
    pub body: Vec<u8>,
    /// The status answered.
    pub status: u16,
}

/// Read one HTTP/1.1 request (headers, then Content-Length bytes).
fn read_request(c: &mut TcpStream) -> Option<(String, String, Vec<u8>)> {
    c.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    let head_end = loop {
        let n = c.read(&mut chunk).ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let header = |name: &str| {
        head.lines().find_map(|l| {
            l.split_once(':').filter(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.trim().to_string())
        })
    };
    let len: usize = header("content-length")?.parse().ok()?;
    let mut body = buf[head_end..].to_vec();
    while body.len() < len {
        let n = c.read(&mut chunk).ok()?;
        if n == 0 {
            break;
        }
        body.extend_from_slice(&chunk[..n]);
    }
    let target = head.lines().next()?.split_whitespace().nth(1)?.to_string();
    Some((target, header("content-type").unwrap_or_default(), body))
}

/// Serve on 127.0.0.1 until the test ends: 503 to the first request, 200 to the others.
pub fn start_server() -> (u16, Arc<Mutex<Vec<Received>>>) {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1");
    let port = l.local_addr().unwrap().port();
    let got = Arc::new(Mutex::new(Vec::new()));
    let store = got.clone();
    std::thread::spawn(move || {
        for c in l.incoming() {
            let Ok(mut c) = c else { continue };
            let Some((target, content_type, body)) = read_request(&mut c) else {
                continue;
            };
            let mut v = store.lock().unwrap();
            let status = if v.is_empty() { 503 } else { 200 };
            let reply: &[u8] = if status == 503 {
                b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 8\r\nConnection: close\r\n\r\ntry later"
            } else {
                b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            };
            v.push(Received { target, content_type, body, status });
            drop(v);
            let _ = c.write_all(reply);
        }
    });
    (port, got)
}

/// The part `name` of a multipart/form-data body.
pub fn part<'a>(r: &'a Received, name: &str) -> Option<&'a [u8]> {
    let boundary = r.content_type.split("boundary=").nth(1)?.trim();
    let delim = format!("--{boundary}");
    let d = delim.as_bytes();
    let mut starts: Vec<usize> = r.body.windows(d.len()).enumerate().filter(|(_, w)| *w == d).map(|(i, _)| i).collect();
    starts.push(r.body.len());
    for w in starts.windows(2) {
        let p = &r.body[w[0] + d.len()..w[1]];
        let Some(h) = p.windows(4).position(|x| x == b"\r\n\r\n") else {
            continue;
        };
        let head = String::from_utf8_lossy(&p[..h]);
        if head.contains(&format!("name=\"{name}\"")) {
            let data = &p[h + 4..];
            return Some(data.strip_suffix(b"\r\n").unwrap_or(data));
        }
    }
    None
}

/// A query parameter of a request target, percent-decoded.
pub fn query_param(target: &str, key: &str) -> Option<String> {
    let q = target.split_once('?')?.1;
    let v = q.split('&').find_map(|kv| kv.strip_prefix(&format!("{key}=")))?;
    let bytes = v.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            out.push(u8::from_str_radix(&v[i + 1..i + 3], 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}
