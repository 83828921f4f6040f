//! Reading a recording.json ([`Recording::load`], [`Recording::parse`]): a size cap, the format
//! version, the recording's shape and [`Recording::validate`], then what every reader wants
//! done once: stacks with the same frames merged ([`crate::merge`]) and frames interned. Apart
//! from recording.rs (the format) so that the format does not depend on the merge, which reads
//! it.

use serde::Deserialize;

use crate::recording::{FORMAT_VERSION, Recording};

/// Largest recording.json leaktrace reads by default, bytes (1 GiB); the environment variable
/// `LEAKTRACE_MAX_RECORDING_BYTES` sets another cap ([`max_recording_bytes`]). The cap bounds
/// what `report` and `compare` read and hold: the file, then the parsed recording (measured:
/// about 3.6 times the file's size at the peak, for a 650 MB recording of a long `--pymalloc`
/// run). A larger file (or one that claims to be, such as a sparse 10 GB file) is refused before
/// anything is read.
pub const MAX_RECORDING_BYTES: u64 = 1 << 30;

/// The cap on the size of a recording.json read by [`Recording::load`], bytes:
/// `LEAKTRACE_MAX_RECORDING_BYTES` when set to a number, else [`MAX_RECORDING_BYTES`].
pub fn max_recording_bytes() -> u64 {
    std::env::var("LEAKTRACE_MAX_RECORDING_BYTES")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(MAX_RECORDING_BYTES)
}

impl Recording {
    /// Read and check `recording.json`: at most [`max_recording_bytes`], valid JSON, a
    /// [`FORMAT_VERSION`] this leaktrace reads, the recording's shape, then
    /// [`Recording::validate`]. Errors are one line and name the file (and, for a version
    /// mismatch, both versions).
    pub fn load(path: &std::path::Path) -> anyhow::Result<Recording> {
        Recording::load_limited(path, max_recording_bytes())
    }

    /// [`Recording::load`] with another size cap, bytes.
    pub fn load_limited(path: &std::path::Path, max_bytes: u64) -> anyhow::Result<Recording> {
        use anyhow::Context as _;
        use std::io::Read as _;
        use std::os::unix::fs::OpenOptionsExt as _;
        // O_NONBLOCK: a FIFO (or a device) planted as recording.json is opened at once and refused
        // below, never waited on; on a regular file the flag changes nothing.
        let nonblock = (rustix::fs::OFlags::NONBLOCK | rustix::fs::OFlags::NOCTTY).bits() as i32;
        let f = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(nonblock)
            .open(path)
            .with_context(|| format!("cannot read recording {}", path.display()))?;
        let meta = f.metadata().with_context(|| format!("cannot read recording {}", path.display()))?;
        anyhow::ensure!(meta.is_file(), "{} is not a regular file", path.display());
        if meta.len() > max_bytes {
            anyhow::bail!(
                "{} is {} bytes, more than the {} bytes leaktrace reads from a recording (LEAKTRACE_MAX_RECORDING_BYTES sets another cap)",
                path.display(),
                meta.len(),
                max_bytes
            );
        }
        // The file may grow while it is read: never read more than the cap (+1, to tell).
        let mut data = Vec::with_capacity(meta.len() as usize);
        f.take(max_bytes + 1)
            .read_to_end(&mut data)
            .with_context(|| format!("cannot read recording {}", path.display()))?;
        anyhow::ensure!(
            data.len() as u64 <= max_bytes,
            "{} grew past the {max_bytes} bytes leaktrace reads from a recording",
            path.display()
        );
        Recording::parse(&data).with_context(|| path.display().to_string())
    }

    /// Parse and check the bytes of a recording.json (see [`Recording::load`]). Errors are one
    /// line, without the file's name.
    pub fn parse(data: &[u8]) -> anyhow::Result<Recording> {
        /// Only the version, the rest skipped (nothing of it is kept).
        #[derive(Deserialize)]
        struct Version {
            format_version: Option<serde_json::Value>,
        }
        let v: Version = serde_json::from_slice(data).map_err(|e| anyhow::anyhow!("not valid JSON: {e}"))?;
        let ver = v.format_version.as_ref().and_then(|x| x.as_u64());
        if ver != Some(FORMAT_VERSION as u64) {
            anyhow::bail!(
                "recording format {} is not supported (this leaktrace reads format {FORMAT_VERSION})",
                v.format_version.map_or_else(|| "(none)".to_string(), |x| x.to_string())
            );
        }
        let mut rec: Recording =
            serde_json::from_slice(data).map_err(|e| anyhow::anyhow!("not a leaktrace recording: {e}"))?;
        rec.validate().map_err(|e| anyhow::anyhow!("inconsistent recording: {e}"))?;
        // Recordings written before the merge existed (or by another writer) get it here.
        crate::merge::merge_identical_stacks(&mut rec);
        rec.intern_frames();
        Ok(rec)
    }
}
