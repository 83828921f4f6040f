//! A profile store for the `--push` tests: a small HTTP server on the loopback (127.0.0.1),
//! or an HTTPS one (rustls, with a certificate the test makes: [`make_certificates`]), that
//! answers the first request with 503 and stores every request, with the parsers of what
//! Pyroscope's ingest API carries (multipart parts, query parameters).
use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// One request the server received, and the status it answered.
#[derive(Clone, Debug)]
pub struct Received {
    /// The request target (path and query).
    pub target: String,
    pub content_type: String,
    /// The `Authorization` header, if any.
    pub authorization: Option<String>,
    pub body: Vec<u8>,
    /// The status answered.
    pub status: u16,
}

/// What [`read_request`] reads: target, content type, authorization, body.
type Request = (String, String, Option<String>, Vec<u8>);

/// Read one HTTP/1.1 request (headers, then Content-Length bytes).
fn read_request(c: &mut impl Read) -> Option<Request> {
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
    Some((target, header("content-type").unwrap_or_default(), header("authorization"), body))
}

/// Serve on 127.0.0.1 until the test ends: 503 to the first request, 200 to the others.
pub fn start_server() -> (u16, Arc<Mutex<Vec<Received>>>) {
    serve(None)
}

/// [`start_server`] over TLS, with the certificate and key of the PEM files `cert` and `key`.
pub fn start_tls_server(cert: &Path, key: &Path) -> (u16, Arc<Mutex<Vec<Received>>>) {
    use rustls::pki_types::pem::PemObject as _;
    let certs: Vec<_> = rustls::pki_types::CertificateDer::pem_file_iter(cert)
        .expect("the certificate file")
        .collect::<Result<_, _>>()
        .expect("PEM certificates");
    let key = rustls::pki_types::PrivateKeyDer::from_pem_file(key).expect("the key file");
    // rustls is built with ring only: its default provider.
    let config = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .expect("the server certificate");
    serve(Some(Arc::new(config)))
}

fn serve(tls: Option<Arc<rustls::ServerConfig>>) -> (u16, Arc<Mutex<Vec<Received>>>) {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1");
    let port = l.local_addr().unwrap().port();
    let got = Arc::new(Mutex::new(Vec::new()));
    let store = got.clone();
    std::thread::spawn(move || {
        for c in l.incoming() {
            let Ok(c) = c else { continue };
            let _ = c.set_read_timeout(Some(Duration::from_secs(10)));
            match &tls {
                None => answer(c, &store),
                Some(cfg) => {
                    let Ok(conn) = rustls::ServerConnection::new(cfg.clone()) else { continue };
                    let mut s = rustls::StreamOwned::new(conn, c);
                    answer(&mut s, &store);
                    s.conn.send_close_notify();
                    let _ = s.flush();
                }
            }
        }
    });
    (port, got)
}

/// Read one request from `c`, store it, answer it (503 to the first request, 200 after).
fn answer(mut c: impl Read + Write, store: &Mutex<Vec<Received>>) {
    let Some((target, content_type, authorization, body)) = read_request(&mut c) else {
        return;
    };
    let mut v = store.lock().unwrap();
    let status = if v.is_empty() { 503 } else { 200 };
    let reply: &[u8] = if status == 503 {
        b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 9\r\nConnection: close\r\n\r\ntry later"
    } else {
        b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    };
    v.push(Received { target, content_type, authorization, body, status });
    drop(v);
    let _ = c.write_all(reply);
    let _ = c.flush();
}

/// A CA and a server certificate for 127.0.0.1 signed by it (EC P-256, one day), made with
/// `openssl` in `dir`: (CA certificate, server certificate, server key), PEM files.
pub fn make_certificates(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    std::fs::create_dir_all(dir).unwrap();
    let run = |args: &[&str]| {
        let o = std::process::Command::new("openssl").current_dir(dir).args(args).output().expect("run openssl");
        assert!(o.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&o.stderr));
    };
    let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];
    run(&[
        &["req", "-x509"][..],
        &ec,
        &["-keyout", "ca.key", "-out", "ca.pem", "-days", "1", "-subj", "/CN=leaktrace test CA"],
    ]
    .concat());
    run(&[&["req"][..], &ec, &["-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=127.0.0.1"]].concat());
    std::fs::write(
        dir.join("server.ext"),
        "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    run(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "1",
        "-extfile",
        "server.ext",
        "-out",
        "server.pem",
    ]);
    (dir.join("ca.pem"), dir.join("server.pem"), dir.join("server.key"))
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
