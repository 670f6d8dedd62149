//! Downloading and verifying dataset files.
//!
//! The library holds the protocol (mirrors in turn, content checked, atomic write); the
//! transport, an HTTP GET, is the program's: `bnn` installs one ([`install_transport`])
//! so that the library crates carry no HTTP client. Without one, a missing dataset is
//! reported as it is with `--offline`.
//!
//! A download is decompressed and its content checked against the SHA-256 constant of the
//! registry before anything is written; the file is written to a temporary name in the
//! destination folder and renamed, so a folder never holds a half-written file.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use sha2::{Digest, Sha256};

use super::idx::{self, IdxArray};
use super::registry::{DatasetSpec, FileSpec};
use crate::atomic::write_atomic;
use crate::error::{Error, Result};

/// An HTTP GET: the body of `url`, or why not in one line.
pub type Transport = fn(url: &str) -> std::result::Result<Vec<u8>, String>;

static TRANSPORT: OnceLock<Transport> = OnceLock::new();

/// Sets the transport [`fetch`] downloads with, once per process (a second call is
/// ignored: the first program-wide choice stands).
pub fn install_transport(get: Transport) {
    let _ = TRANSPORT.set(get);
}

/// Whether a transport is installed: whether a missing dataset can be downloaded.
pub(crate) fn can_download() -> bool {
    TRANSPORT.get().is_some()
}

/// Hex SHA-256 of an IDX array's uncompressed encoding (header and data), the content
/// the registry's constants are of.
pub(crate) fn idx_sha256_hex(array: &IdxArray) -> String {
    let mut hasher = Sha256::new();
    hasher.update(array.header());
    hasher.update(&array.data);
    hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The path of `file` in `dir`: `name.gz` if present, else the raw `name`, else `None`.
pub(crate) fn locate(dir: &Path, file: &FileSpec) -> Option<PathBuf> {
    let gz = dir.join(format!("{}.gz", file.name));
    if gz.is_file() {
        return Some(gz);
    }
    let raw = dir.join(file.name);
    raw.is_file().then_some(raw)
}

/// Checks that every file of `spec` is in `dir` with the right decompressed content.
/// Returns the checked paths.
pub fn verify(spec: &DatasetSpec, dir: &Path) -> Result<Vec<PathBuf>> {
    let mut checked = Vec::new();
    for file in &spec.files {
        let path = locate(dir, file).ok_or_else(|| {
            Error::Data(format!(
                "{}: missing {}(.gz) for dataset {}",
                dir.display(),
                file.name,
                spec.name
            ))
        })?;
        let got = idx_sha256_hex(&idx::read_file(&path)?);
        if got != file.raw_sha256 {
            return Err(Error::Data(format!(
                "{}: content SHA-256 {got} does not match the canonical {}; delete it and run `bnn data fetch --dataset {}`",
                path.display(),
                file.raw_sha256,
                spec.name
            )));
        }
        checked.push(path);
    }
    Ok(checked)
}

/// Downloads every file of `spec` that `dir` lacks (or holds with the wrong content) from
/// the first of `mirrors` that serves the right content. Returns the number of files
/// downloaded.
pub fn fetch(spec: &DatasetSpec, mirrors: &[String], dir: &Path) -> Result<usize> {
    if mirrors.is_empty() {
        return Err(Error::Fetch(format!(
            "dataset {} has no download mirror",
            spec.name
        )));
    }
    let Some(download) = TRANSPORT.get() else {
        return Err(Error::Fetch(
            "this program has no network transport (bnn_core::data::fetch::install_transport)"
                .to_string(),
        ));
    };
    let mut downloaded = 0;
    for file in &spec.files {
        if let Some(existing) = locate(dir, file) {
            let ok = idx::read_file(&existing)
                .is_ok_and(|array| idx_sha256_hex(&array) == file.raw_sha256);
            if ok {
                continue;
            }
        }
        let mut errors = Vec::new();
        let mut done = false;
        for base in mirrors {
            let url = format!("{}/{}.gz", base.trim_end_matches('/'), file.name);
            tracing::debug!(%url, "downloading");
            let body = match download(&url) {
                Ok(b) => b,
                Err(e) => {
                    errors.push(e);
                    continue;
                }
            };
            let array = match idx::from_bytes(&body, &url) {
                Ok(a) => a,
                Err(e) => {
                    errors.push(e.to_string());
                    continue;
                }
            };
            let got = idx_sha256_hex(&array);
            if got != file.raw_sha256 {
                errors.push(format!(
                    "{url}: content SHA-256 {got} is not the canonical {}",
                    file.raw_sha256
                ));
                continue;
            }
            write_atomic(&dir.join(format!("{}.gz", file.name)), &body)?;
            downloaded += 1;
            done = true;
            break;
        }
        if !done {
            return Err(Error::Fetch(format!(
                "could not download {}.gz of {}: {}",
                file.name,
                spec.name,
                errors.join("; ")
            )));
        }
    }
    Ok(downloaded)
}
