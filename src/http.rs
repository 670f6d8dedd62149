//! The HTTP transport `bnn` installs for dataset downloads
//! (`bnn_core::data::fetch::install_transport`): the library crates carry no HTTP client.

use std::io::Read;
use std::time::Duration;

/// Largest download accepted (the biggest canonical file is ~26 MB gzipped).
const MAX_DOWNLOAD: u64 = 256 << 20;

/// GET `url`: its body, or the error in one line.
pub fn get(url: &str) -> Result<Vec<u8>, String> {
    let agent = ureq::AgentBuilder::new()
        .timeout_connect(Duration::from_secs(15))
        .timeout_read(Duration::from_secs(120))
        .build();
    let resp = agent.get(url).call().map_err(|e| e.to_string())?;
    let mut body = Vec::new();
    resp.into_reader()
        .take(MAX_DOWNLOAD)
        .read_to_end(&mut body)
        .map_err(|e| format!("reading {url}: {e}"))?;
    Ok(body)
}
