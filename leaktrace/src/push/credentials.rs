//! The credentials and the HTTP client of `--push` (push.rs): a token or `USER:PASSWORD` read
//! from a file with the checks push.rs's docs list, the CA roots of an https store.

use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Longest credential or CA file read.
const MAX_SECRET_FILE: u64 = 64 << 10;
const MAX_CA_FILE: u64 = 4 << 20;
/// Connect timeout of one request; the whole request gets three times this.
const IO_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// A credential read from a file at every push.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PushAuth {
    /// `Authorization: Bearer <the file's line>`.
    Bearer(PathBuf),
    /// `Authorization: Basic base64(<the file's line: USER:PASSWORD>)`.
    Basic(PathBuf),
}

/// A credential file's one line, after the checks of the module docs (`push.rs`).
fn read_secret(path: &Path) -> Result<String, String> {
    use std::io::Read as _;
    use std::os::unix::fs::MetadataExt as _;
    let shown = path.display();
    let f = std::fs::File::open(path).map_err(|e| format!("{shown}: {e}"))?;
    let m = f.metadata().map_err(|e| format!("{shown}: {e}"))?;
    if !m.is_file() {
        return Err(format!("{shown}: not a regular file"));
    }
    if m.mode() & 0o022 != 0 {
        return Err(format!(
            "{shown}: users other than its owner may write it (mode {:o}): refused (chmod go-w)",
            m.mode() & 0o7777
        ));
    }
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    if m.uid() != 0 && m.uid() != me {
        return Err(format!("{shown}: owned by uid {}, neither root nor leaktrace's user: refused", m.uid()));
    }
    let mut text = String::new();
    f.take(MAX_SECRET_FILE + 1).read_to_string(&mut text).map_err(|e| format!("{shown}: {e}"))?;
    if text.len() as u64 > MAX_SECRET_FILE {
        return Err(format!("{shown}: over {MAX_SECRET_FILE} bytes"));
    }
    let line = text.strip_suffix('\n').unwrap_or(&text);
    let line = line.strip_suffix('\r').unwrap_or(line);
    if line.is_empty() || line.chars().any(|c| c.is_control()) {
        return Err(format!("{shown}: expected one non-empty line"));
    }
    Ok(line.to_string())
}

/// `--push-token-file`: a file [`read_secret`] accepts.
pub(super) fn parse_token_file(s: &str) -> Result<PathBuf, String> {
    read_secret(s.as_ref())?;
    Ok(PathBuf::from(s))
}

/// `--push-basic-auth-file`: a file [`read_secret`] accepts, its line `USER:PASSWORD`.
pub(super) fn parse_basic_auth_file(s: &str) -> Result<PathBuf, String> {
    if !read_secret(s.as_ref())?.contains(':') {
        return Err(format!("{s}: expected one line USER:PASSWORD"));
    }
    Ok(PathBuf::from(s))
}

/// `--push-ca`: a PEM file with at least one certificate.
pub(super) fn parse_ca_file(s: &str) -> Result<PathBuf, String> {
    ca_certificates(s.as_ref())?;
    Ok(PathBuf::from(s))
}

/// The certificates of the PEM file `path`.
fn ca_certificates(path: &Path) -> Result<Vec<ureq::tls::Certificate<'static>>, String> {
    use std::io::Read as _;
    let shown = path.display();
    let mut pem = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_CA_FILE).read_to_end(&mut pem))
        .map_err(|e| format!("{shown}: {e}"))?;
    let certs: Vec<_> = ureq::tls::parse_pem(&pem)
        .filter_map(|i| match i {
            Ok(ureq::tls::PemItem::Certificate(c)) => Some(c),
            _ => None,
        })
        .collect();
    if certs.is_empty() {
        return Err(format!("{shown}: no PEM certificate in it"));
    }
    Ok(certs)
}

/// The `Authorization` header's value for `auth`.
pub(super) fn authorization(auth: &PushAuth) -> Result<String, String> {
    use base64::Engine as _;
    Ok(match auth {
        PushAuth::Bearer(f) => format!("Bearer {}", read_secret(f)?),
        PushAuth::Basic(f) => {
            format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(read_secret(f)?.as_bytes()))
        }
    })
}

/// The HTTP client of the push worker: the timeouts, no redirects, non-2xx statuses as
/// answers, the system's roots and `--push-ca`'s certificates for https.
pub(super) fn agent(https: bool, ca: Option<&Path>) -> Result<ureq::Agent, String> {
    let mut roots: Vec<ureq::tls::Certificate<'static>> = Vec::new();
    if https {
        let native = rustls_native_certs::load_native_certs();
        roots.extend(native.certs.iter().map(|c| ureq::tls::Certificate::from_der(c.as_ref()).to_owned()));
        if let Some(ca) = ca {
            roots.extend(ca_certificates(ca)?);
        }
        if roots.is_empty() {
            return Err("no CA certificate: none found on the system, and no --push-ca".into());
        }
    }
    let tls = ureq::tls::TlsConfig::builder().root_certs(ureq::tls::RootCerts::Specific(Arc::new(roots))).build();
    let config = ureq::Agent::config_builder()
        .timeout_connect(Some(IO_TIMEOUT))
        .timeout_global(Some(3 * IO_TIMEOUT))
        .http_status_as_error(false)
        .max_redirects(0)
        .user_agent(format!("leaktrace/{}", env!("CARGO_PKG_VERSION")))
        .tls_config(tls)
        .build();
    Ok(config.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A credential file others may write, or owned by another user, or not one line, is
    /// refused in one line; a basic-auth file is `USER:PASSWORD`, sent base64-encoded.
    #[test]
    fn credential_files_are_checked() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("basic");
        std::fs::write(&f, "12345:glc_token\n").unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
        let ok = f.to_str().unwrap();
        assert_eq!(parse_basic_auth_file(ok).unwrap(), f);
        assert_eq!(authorization(&PushAuth::Basic(f.clone())).unwrap(), "Basic MTIzNDU6Z2xjX3Rva2Vu");
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o646)).unwrap();
        let e = parse_token_file(ok).unwrap_err();
        assert!(e.contains("users other than its owner may write it (mode 646)") && !e.contains('\n'), "{e}");
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o620)).unwrap();
        assert!(parse_token_file(ok).is_err(), "group-writable");
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(parse_token_file(ok).is_ok(), "readable by others is the owner's choice");
        std::fs::write(&f, "a\nb\n").unwrap();
        assert!(parse_token_file(ok).unwrap_err().contains("one non-empty line"));
        std::fs::write(&f, "token-without-colon").unwrap();
        assert!(parse_basic_auth_file(ok).unwrap_err().contains("USER:PASSWORD"));
        if unsafe_geteuid() == 0 {
            std::os::unix::fs::chown(&f, Some(65534), None).unwrap();
            assert!(parse_token_file(ok).unwrap_err().contains("owned by uid 65534"));
        }
        assert!(parse_token_file(dir.path().to_str().unwrap()).unwrap_err().contains("not a regular file"));
        assert!(parse_ca_file(ok).unwrap_err().contains("no PEM certificate"));
    }

    fn unsafe_geteuid() -> u32 {
        // SAFETY: geteuid has no preconditions.
        unsafe { libc::geteuid() }
    }
}
