//! How much memory a device has free, so that a run that cannot fit is refused before it
//! allocates (one line naming the need and the room), rather than failing part-way.

use candle_core::Device;

/// Bytes free on `device`: the host's available memory (`MemAvailable` of
/// /proc/meminfo) for the CPU, the driver's free figure for a CUDA GPU; `None` where it
/// cannot be told (another system, Metal).
pub fn free_bytes(device: &Device) -> Option<u64> {
    match device {
        Device::Cpu => host_available(),
        #[cfg(feature = "cuda")]
        Device::Cuda(dev) => dev
            .cuda_stream()
            .context()
            .mem_get_info()
            .ok()
            .map(|(free, _total)| free as u64),
        #[allow(unreachable_patterns)]
        _ => None,
    }
}

fn host_available() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    meminfo_available(&text)
}

/// `MemAvailable` of a /proc/meminfo text, in bytes.
fn meminfo_available(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::is_out_of_memory;

    #[test]
    fn reads_meminfo_and_tells_out_of_memory() {
        let text = "MemTotal:       24576000 kB\nMemFree:  100 kB\nMemAvailable:   2048 kB\n";
        assert_eq!(meminfo_available(text), Some(2048 * 1024));
        assert_eq!(meminfo_available("MemTotal: 1 kB\n"), None);
        assert!(
            free_bytes(&Device::Cpu).is_some_and(|b| b > 0),
            "this machine's memory"
        );
        assert!(is_out_of_memory(
            "DriverError(CUDA_ERROR_OUT_OF_MEMORY, \"out of memory\")"
        ));
        assert!(is_out_of_memory("cublas error: CUBLAS_STATUS_ALLOC_FAILED"));
        assert!(!is_out_of_memory("shape mismatch in matmul"));
    }

    /// A device's out-of-memory failure, as candle reports it, reads as one line saying
    /// what to do; other candle errors are left as they are.
    #[test]
    fn out_of_memory_is_explained() {
        let said = "DriverError(CUDA_ERROR_OUT_OF_MEMORY, \"out of memory\")\n  backtrace";
        let e = crate::Error::Candle(candle_core::Error::Msg(said.into())).explained();
        let line = e.to_string();
        assert!(
            matches!(e, crate::Error::OutOfDeviceMemory { .. }),
            "{line}"
        );
        assert_eq!(line.lines().count(), 1, "{line}");
        assert!(
            line.contains("fewer --chains") && line.contains("--resume"),
            "{line}"
        );
        let other = crate::Error::Candle(candle_core::Error::Msg("shape mismatch".into()));
        assert_eq!(other.explained().to_string(), "shape mismatch");
    }
}
