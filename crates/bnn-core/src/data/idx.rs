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
    /// The dimensions, outermost first.
    pub dims: Vec<usize>,
    /// The data, unsigned bytes.
    pub data: Vec<u8>,
}

/// The most data bytes an IDX file may declare (1 GiB): far above the sets this tool
/// reads (MNIST's training images are 47 MB), so that a header can never make the reader
/// take more memory than a real dataset would.
pub const MAX_DATA_BYTES: usize = 1 << 30;

/// Reads an IDX array from `bytes`, gzipped (gzip magic number first) or raw.
pub fn from_bytes(bytes: &[u8], origin: &str) -> Result<IdxArray> {
    if bytes.starts_with(&GZIP_MAGIC) {
        read(flate2::read::MultiGzDecoder::new(bytes), origin)
    } else {
        read(bytes, origin)
    }
}

const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];

/// Reads an IDX array from an uncompressed stream, checking the magic number and the
/// dimensions, and that the data is exactly as long as the dimensions say. Reads at most
/// the declared size plus one byte (a gzip bomb behind a valid header is refused after
/// that many bytes, not after inflating all of it) and never reserves memory by the
/// declared size before the data has arrived.
pub fn read(reader: impl Read, origin: &str) -> Result<IdxArray> {
    let bad = |reason: String| Error::Idx {
        path: origin.to_string(),
        reason,
    };
    let mut reader = reader;
    let mut magic = [0u8; 4];
    let got = read_up_to(&mut reader, &mut magic, origin)?;
    if got < 4 {
        return Err(bad(format!("only {got} bytes, no header")));
    }
    if magic[0] != 0 || magic[1] != 0 {
        return Err(bad(format!(
            "bad magic number {:02x}{:02x}{:02x}{:02x}",
            magic[0], magic[1], magic[2], magic[3]
        )));
    }
    if magic[2] != 0x08 {
        return Err(bad(format!(
            "element type 0x{:02x} is not unsigned byte (0x08)",
            magic[2]
        )));
    }
    let ndim = magic[3] as usize;
    if ndim == 0 {
        return Err(bad("zero dimensions".into()));
    }
    let mut header = vec![0u8; 4 * ndim];
    let got = read_up_to(&mut reader, &mut header, origin)?;
    if got < header.len() {
        return Err(bad(format!("truncated header: {} bytes", 4 + got)));
    }
    let dims: Vec<usize> = header
        .chunks_exact(4)
        .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize)
        .collect();
    let expected = dims
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .filter(|&n| n <= MAX_DATA_BYTES)
        .ok_or_else(|| {
            bad(format!(
                "the header's dimensions {dims:?} declare more than the {} MiB of data this reader accepts",
                MAX_DATA_BYTES >> 20
            ))
        })?;
    let mut data = Vec::new();
    reader
        .take(expected as u64 + 1)
        .read_to_end(&mut data)
        .map_err(|e| bad(format!("corrupt gzip stream ({e})")))?;
    if data.len() < expected {
        return Err(bad(format!(
            "truncated: {} data bytes, the header {dims:?} says {expected}",
            data.len()
        )));
    }
    if data.len() > expected {
        return Err(bad(format!(
            "more data than the {expected} bytes the header {dims:?} announces"
        )));
    }
    Ok(IdxArray { dims, data })
}

/// Fills `buf` as far as the stream goes; the number of bytes read.
fn read_up_to(reader: &mut impl Read, buf: &mut [u8], origin: &str) -> Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match reader.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => {
                return Err(Error::Idx {
                    path: origin.to_string(),
                    reason: format!("corrupt gzip stream ({e})"),
                })
            }
        }
    }
    Ok(got)
}

/// Parses an uncompressed IDX byte buffer (see [`read`]).
pub fn parse(bytes: &[u8], origin: &str) -> Result<IdxArray> {
    read(bytes, origin)
}

/// Reads an IDX file from disk (gzipped or raw), streaming: at most the declared size
/// plus one byte is read, whatever the file's length.
pub fn read_file(path: &Path) -> Result<IdxArray> {
    read(open_maybe_gzipped(path)?, &path.display().to_string())
}

/// The file at `path` as a buffered stream, decompressed where it starts as gzip does.
pub(crate) fn open_maybe_gzipped(path: &Path) -> Result<Box<dyn Read>> {
    let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let mut file = std::io::BufReader::new(file);
    let gzipped = std::io::BufRead::fill_buf(&mut file)
        .map_err(|e| Error::io(path, e))?
        .starts_with(&GZIP_MAGIC);
    Ok(match gzipped {
        true => Box::new(flate2::bufread::MultiGzDecoder::new(file)),
        false => Box::new(file),
    })
}

impl IdxArray {
    /// The array in IDX encoding (uncompressed).
    pub fn encode(&self) -> Vec<u8> {
        encode(&self.dims, &self.data)
    }

    /// The header bytes: magic number and dimensions.
    pub fn header(&self) -> Vec<u8> {
        header(&self.dims)
    }
}

fn header(dims: &[usize]) -> Vec<u8> {
    let mut out = vec![0, 0, 0x08, dims.len() as u8];
    for &d in dims {
        out.extend((d as u32).to_be_bytes());
    }
    out
}

/// Encodes an IDX array of unsigned bytes (used by tests and by the subset builder).
pub fn encode(dims: &[usize], data: &[u8]) -> Vec<u8> {
    let mut out = header(dims);
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
        assert!(e.contains("more data than the 12 bytes"), "{e}");
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
        assert_eq!(from_bytes(&gz, "g").unwrap().encode(), raw);
        let cut = &gz[..gz.len() / 2];
        let e = from_bytes(cut, "g").unwrap_err().to_string();
        assert!(e.contains("corrupt gzip"), "{e}");
    }

    /// A gzip bomb behind a valid header: 64 MiB of zeros after a header that declares
    /// 16 bytes. The reader stops after 17 data bytes; the stream's other 64 MiB are never
    /// inflated (the test would take seconds and 64 MiB otherwise, not milliseconds).
    #[test]
    fn stops_reading_at_the_declared_size() {
        use std::io::Write;
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        enc.write_all(&header(&[4, 2, 2])).unwrap();
        let zeros = vec![0u8; 1 << 20];
        for _ in 0..64 {
            enc.write_all(&zeros).unwrap();
        }
        let gz = enc.finish().unwrap();
        assert!(gz.len() < 1 << 20, "{}", gz.len());
        let e = from_bytes(&gz, "bomb").unwrap_err().to_string();
        assert!(e.contains("more data than the 16 bytes"), "{e}");
    }

    #[test]
    fn refuses_a_declared_size_past_the_limit() {
        let b = header(&[70_000, 128, 128]);
        let e = parse(&b, "big").unwrap_err().to_string();
        assert!(e.contains("declare more than the 1024 MiB"), "{e}");
        let b = header(&[u32::MAX as usize; 3]);
        assert!(parse(&b, "huge").is_err());
    }
}
