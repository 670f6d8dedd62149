//! Reader for the IDX format of MNIST and Fashion-MNIST (raw or gzipped).
//!
//! Format: two zero bytes, a type byte (0x08 = unsigned byte), the number of dimensions,
//! then one big-endian u32 per dimension, then the data in row-major order.

use std::io::Read;
use std::path::Path;

use crate::error::{Error, Result};

/// An IDX array of unsigned bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdxArray {
    pub dims: Vec<usize>,
    pub data: Vec<u8>,
}

/// Decompresses `bytes` if they start with the gzip magic number, else returns them as is.
pub fn maybe_gunzip(bytes: &[u8], origin: &str) -> Result<Vec<u8>> {
    if bytes.starts_with(&[0x1f, 0x8b]) {
        let mut out = Vec::with_capacity(bytes.len() * 4);
        flate2::read::MultiGzDecoder::new(bytes)
            .read_to_end(&mut out)
            .map_err(|e| Error::Idx {
                path: origin.to_string(),
                reason: format!("corrupt gzip stream ({e})"),
            })?;
        Ok(out)
    } else {
        Ok(bytes.to_vec())
    }
}

/// Parses an IDX byte buffer (already decompressed), checking the magic number, the
/// dimensions and that the data length is exactly the product of the dimensions.
pub fn parse(bytes: &[u8], origin: &str) -> Result<IdxArray> {
    let bad = |reason: String| Error::Idx {
        path: origin.to_string(),
        reason,
    };
    if bytes.len() < 4 {
        return Err(bad(format!("only {} bytes, no header", bytes.len())));
    }
    if bytes[0] != 0 || bytes[1] != 0 {
        return Err(bad(format!(
            "bad magic number {:02x}{:02x}{:02x}{:02x}",
            bytes[0], bytes[1], bytes[2], bytes[3]
        )));
    }
    if bytes[2] != 0x08 {
        return Err(bad(format!(
            "element type 0x{:02x} is not unsigned byte (0x08)",
            bytes[2]
        )));
    }
    let ndim = bytes[3] as usize;
    if ndim == 0 {
        return Err(bad("zero dimensions".into()));
    }
    let header = 4 + 4 * ndim;
    if bytes.len() < header {
        return Err(bad(format!("truncated header: {} bytes", bytes.len())));
    }
    let dims: Vec<usize> = (0..ndim)
        .map(|i| {
            let o = 4 + 4 * i;
            u32::from_be_bytes([bytes[o], bytes[o + 1], bytes[o + 2], bytes[o + 3]]) as usize
        })
        .collect();
    let expected = dims
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| bad(format!("dimensions {dims:?} overflow")))?;
    let got = bytes.len() - header;
    if got < expected {
        return Err(bad(format!(
            "truncated: {got} data bytes, the header {dims:?} says {expected}"
        )));
    }
    if got > expected {
        return Err(bad(format!(
            "{} trailing bytes after the {expected} the header {dims:?} announces",
            got - expected
        )));
    }
    Ok(IdxArray {
        dims,
        data: bytes[header..].to_vec(),
    })
}

/// Reads an IDX file from disk (gzipped or raw).
pub fn read_file(path: &Path) -> Result<IdxArray> {
    let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    let origin = path.display().to_string();
    parse(&maybe_gunzip(&bytes, &origin)?, &origin)
}

/// Encodes an IDX array of unsigned bytes (used by tests and by the subset builder).
pub fn encode(dims: &[usize], data: &[u8]) -> Vec<u8> {
    let mut out = vec![0, 0, 0x08, dims.len() as u8];
    for &d in dims {
        out.extend((d as u32).to_be_bytes());
    }
    out.extend_from_slice(data);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn images(n: usize) -> Vec<u8> {
        encode(&[n, 2, 3], &(0..n * 6).map(|i| i as u8).collect::<Vec<_>>())
    }

    #[test]
    fn parses_valid_images_and_labels() {
        let a = parse(&images(4), "x").unwrap();
        assert_eq!(a.dims, vec![4, 2, 3]);
        assert_eq!(a.data.len(), 24);
        assert_eq!(a.data[23], 23);
        let l = parse(&encode(&[3], &[7, 8, 9]), "y").unwrap();
        assert_eq!(l.dims, vec![3]);
        assert_eq!(l.data, vec![7, 8, 9]);
    }

    #[test]
    fn rejects_truncated_data() {
        let mut b = images(4);
        b.pop();
        let e = parse(&b, "f").unwrap_err().to_string();
        assert!(e.contains("truncated: 23 data bytes"), "{e}");
    }

    #[test]
    fn rejects_truncated_header() {
        let b = images(4);
        let e = parse(&b[..9], "f").unwrap_err().to_string();
        assert!(e.contains("truncated header"), "{e}");
        assert!(parse(&b[..2], "f").is_err());
    }

    #[test]
    fn rejects_trailing_bytes() {
        let mut b = images(2);
        b.push(0);
        let e = parse(&b, "f").unwrap_err().to_string();
        assert!(e.contains("1 trailing bytes"), "{e}");
    }

    #[test]
    fn rejects_bad_magic_and_type() {
        let mut b = images(2);
        b[0] = 1;
        assert!(parse(&b, "f")
            .unwrap_err()
            .to_string()
            .contains("bad magic"));
        let mut b = images(2);
        b[2] = 0x0d; // float
        assert!(parse(&b, "f")
            .unwrap_err()
            .to_string()
            .contains("element type"));
        let mut b = images(2);
        b[3] = 0;
        assert!(parse(&b, "f")
            .unwrap_err()
            .to_string()
            .contains("zero dimensions"));
    }

    #[test]
    fn gzip_round_trip_and_corrupt_gzip() {
        use std::io::Write;
        let raw = images(3);
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        enc.write_all(&raw).unwrap();
        let gz = enc.finish().unwrap();
        assert_eq!(maybe_gunzip(&gz, "g").unwrap(), raw);
        let cut = &gz[..gz.len() / 2];
        let e = maybe_gunzip(cut, "g").unwrap_err().to_string();
        assert!(e.contains("corrupt gzip"), "{e}");
    }
}
