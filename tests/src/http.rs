//! Plain HTTP/1.0 GETs on the loopback (leaktrace watch's metrics endpoint, Prometheus's API),
//! and a free port to listen on.

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::time::Duration;

/// A free TCP port on the loopback (bound, then released).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port()
}

/// GET `path` from 127.0.0.1:`port`: (status line, body); None when it cannot connect or the
/// answer is not HTTP. Reads time out after 10 s.
pub fn http_get(port: u16, path: &str) -> Option<(String, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let (head, body) = text.split_once("\r\n\r\n")?;
    Some((head.lines().next()?.to_string(), body.to_string()))
}
