//! Atomic file writes: a file is either its old content or its new, whatever happens
//! during the write. Ground floor: imports nothing of ours but the error type.

use std::io::Write;
use std::path::Path;

use crate::error::{Error, Result};

/// Writes `bytes` to `path` through a temporary file in the same folder (`.NAME.tmpPID`),
/// an fsync, a rename and an fsync of the folder: after a crash at any moment `path` is
/// the old content or the new, and once this returns the new content survives a power cut.
///
/// For the resume tests, `BNN_TEST_PAUSE_IN_WRITES_MS` makes it sleep between writing the
/// temporary file and renaming it, so that a kill can land there.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.tmp{}", std::process::id()));
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        if let Some(ms) = std::env::var("BNN_TEST_PAUSE_IN_WRITES_MS")
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
        {
            std::thread::sleep(std::time::Duration::from_millis(ms));
        }
        std::fs::rename(&tmp, path)?;
        // The rename is only durable once the folder's entry is on disk.
        std::fs::File::open(dir)?.sync_all()
    };
    write().map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        Error::io(path, e)
    })
}

/// Bytes free to an unprivileged writer on the file system holding `path` (or its nearest
/// existing ancestor); `None` where the platform or the call cannot say.
pub fn free_bytes(path: &Path) -> Option<u64> {
    let mut at = path;
    while !at.as_os_str().is_empty() && !at.exists() {
        at = at.parent()?;
    }
    if at.as_os_str().is_empty() {
        at = Path::new(".");
    }
    free_bytes_of(at)
}

#[cfg(unix)]
fn free_bytes_of(path: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    // SAFETY: statvfs writes into the zeroed struct it is given and reads the
    // NUL-terminated path, which outlives the call.
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut stat) } != 0 {
        return None;
    }
    Some(stat.f_bavail as u64 * stat.f_frsize as u64)
}

#[cfg(not(unix))]
fn free_bytes_of(_: &Path) -> Option<u64> {
    None
}
