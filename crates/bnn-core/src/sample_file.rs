//! A posterior sample as a file: f32 tensors by name in the safetensors format with a
//! deterministic header and the SHA-256 of the tensors in its metadata, written atomically
//! and checked when read (the header, the checksum, every value finite). `bnn train`
//! writes its samples so, and a model of the user's own can be kept the same way; Python's
//! `safetensors` reads them.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};

use crate::atomic::write_atomic;
use crate::error::{Error, Result};

/// The metadata key of the SHA-256 of a file's tensors (see `tensors_digest`), written
/// by [`encode_safetensors`] and checked by [`open_safetensors`].
pub const CHECKSUM_KEY: &str = "sha256";

/// Encodes f32 tensors in the safetensors format with a deterministic header: keys sorted
/// (serde_json's map is ordered), data in the order given, header padded with spaces to
/// a multiple of 8 bytes. The `safetensors` crate's writer takes the metadata as a
/// `HashMap`, whose random order would make two identical samples differ byte-wise. The
/// metadata gains [`CHECKSUM_KEY`]: the SHA-256 of the tensor data.
pub fn encode_safetensors(
    tensors: &[(String, Tensor)],
    metadata: &BTreeMap<String, String>,
) -> Result<Vec<u8>> {
    let mut header = serde_json::Map::new();
    let mut data: Vec<u8> = Vec::new();
    let mut table = Vec::with_capacity(tensors.len());
    for (name, t) in tensors {
        let start = data.len();
        // f64 stays f64 (a run state's ensemble sums); everything else is stored as f32.
        let dtype = if t.dtype() == DType::F64 {
            let values = t.flatten_all()?.to_vec1::<f64>()?;
            data.extend(values.iter().flat_map(|v| v.to_le_bytes()));
            "F64"
        } else {
            let values = t.flatten_all()?.to_dtype(DType::F32)?.to_vec1::<f32>()?;
            data.extend(values.iter().flat_map(|v| v.to_le_bytes()));
            "F32"
        };
        header.insert(
            name.clone(),
            serde_json::json!({"dtype": dtype, "shape": t.dims(), "data_offsets": [start, data.len()]}),
        );
        table.push((name.as_str(), dtype, t.dims().to_vec(), start..data.len()));
    }
    let digest = tensors_digest(
        table
            .iter()
            .map(|(n, d, shape, range)| (*n, *d, shape.as_slice(), &data[range.clone()])),
    );
    let mut metadata = metadata.clone();
    metadata.insert(CHECKSUM_KEY.into(), digest);
    header.insert("__metadata__".into(), serde_json::json!(metadata));
    let mut json = serde_json::to_vec(&header)
        .map_err(|e| Error::Checkpoint(format!("serialising header: {e}")))?;
    while json.len() % 8 != 0 {
        json.push(b' ');
    }
    let mut out = Vec::with_capacity(8 + json.len() + data.len());
    out.extend((json.len() as u64).to_le_bytes());
    out.extend(json);
    out.extend(data);
    Ok(out)
}

/// The SHA-256 (hex) of a file's tensors taken in name order, each as its name, dtype,
/// shape and data bytes (lengths prefixed): an edit to the data or to the header's
/// tensor table (a renamed tensor, another shape or dtype) changes it; padding and the
/// metadata's other values do not enter.
fn tensors_digest<'a>(
    tensors: impl Iterator<Item = (&'a str, &'a str, &'a [usize], &'a [u8])>,
) -> String {
    use sha2::{Digest, Sha256};
    let mut tensors: Vec<_> = tensors.collect();
    tensors.sort_by(|a, b| a.0.cmp(b.0));
    let mut hash = Sha256::new();
    let mut put = |bytes: &[u8]| {
        hash.update((bytes.len() as u64).to_le_bytes());
        hash.update(bytes);
    };
    for (name, dtype, shape, data) in tensors {
        put(name.as_bytes());
        put(dtype.as_bytes());
        let dims: Vec<u8> = shape
            .iter()
            .flat_map(|&d| (d as u64).to_le_bytes())
            .collect();
        put(&dims);
        put(data);
    }
    hash.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// A safetensors file parsed and checked: the header is well-formed, the tensor data
/// matches the recorded checksum (files written before checksums were recorded have none
/// and are read as they are), and every F32/F64 value is finite. `Err` carries the
/// reason, for the caller to name the file.
pub struct Checked<'a> {
    /// The tensors, read in place.
    pub tensors: safetensors::SafeTensors<'a>,
    /// The header's metadata.
    pub metadata: HashMap<String, String>,
}

/// Parses and checks `bytes` (see [`Checked`]).
pub fn open_safetensors(bytes: &[u8]) -> std::result::Result<Checked<'_>, String> {
    let tensors = safetensors::SafeTensors::deserialize(bytes).map_err(|e| e.to_string())?;
    let (_, header) = safetensors::SafeTensors::read_metadata(bytes).map_err(|e| e.to_string())?;
    let metadata = header.metadata().clone().unwrap_or_default();
    if let Some(recorded) = metadata.get(CHECKSUM_KEY) {
        let views = tensors.tensors();
        let dtypes: Vec<String> = views
            .iter()
            .map(|(_, v)| format!("{:?}", v.dtype()))
            .collect();
        let got = tensors_digest(
            views
                .iter()
                .zip(&dtypes)
                .map(|((n, v), d)| (n.as_str(), d.as_str(), v.shape(), v.data())),
        );
        if &got != recorded {
            return Err(format!(
                "checksum mismatch: the tensors' SHA-256 is {got}, the file records {recorded} \
                 (the file was changed or damaged after it was written)"
            ));
        }
    }
    for (name, view) in tensors.tensors() {
        let data = view.data();
        let bad = match view.dtype() {
            safetensors::Dtype::F32 => data
                .chunks_exact(4)
                .map(|b| f64::from(f32::from_le_bytes([b[0], b[1], b[2], b[3]])))
                .enumerate()
                .find(|(_, v)| !v.is_finite()),
            safetensors::Dtype::F64 => data
                .chunks_exact(8)
                .map(|b| f64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]))
                .enumerate()
                .find(|(_, v)| !v.is_finite()),
            _ => None,
        };
        if let Some((i, v)) = bad {
            return Err(format!("tensor `{name}` holds {v} at element {i}"));
        }
    }
    Ok(Checked { tensors, metadata })
}

/// Writes the parameters of any model as one posterior-sample file at `path`: f32
/// tensors by name, `metadata`, and the SHA-256 of the tensors that [`load_sample`]
/// checks; through a temporary file and a rename, so that a crash leaves the old file or
/// the new one, never a part.
pub fn write_sample_file(
    path: &Path,
    tensors: &[(String, Tensor)],
    metadata: &BTreeMap<String, String>,
) -> Result<()> {
    let bytes = encode_safetensors(tensors, metadata)?;
    write_atomic(path, &bytes)
}

/// A sample read back: its tensors by name and its metadata.
pub struct Sample {
    /// The file it came from.
    pub path: PathBuf,
    /// The tensors by name.
    pub tensors: HashMap<String, Tensor>,
    /// The header's metadata (model, step, hashes).
    pub metadata: HashMap<String, String>,
}

/// Reads one sample file, checked as [`open_safetensors`] says.
pub fn load_sample(path: &Path, device: &Device) -> Result<Sample> {
    let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    let corrupt = |e: String| Error::Checkpoint(format!("{}: corrupt sample: {e}", path.display()));
    let checked = open_safetensors(&bytes).map_err(corrupt)?;
    let mut tensors = HashMap::new();
    for (name, view) in checked.tensors.tensors() {
        if view.dtype() != safetensors::Dtype::F32 {
            return Err(corrupt(format!(
                "tensor `{name}` is {:?}, not F32",
                view.dtype()
            )));
        }
        let t = decode_tensor(&view, device)?.ok_or_else(|| corrupt(format!("tensor `{name}`")))?;
        tensors.insert(name, t);
    }
    Ok(Sample {
        path: path.to_path_buf(),
        tensors,
        metadata: checked.metadata,
    })
}

/// A little-endian F32 or F64 safetensors view as a tensor on `device` (`None` for any
/// other dtype): what [`encode_safetensors`] writes, read back.
pub fn decode_tensor(
    view: &safetensors::tensor::TensorView<'_>,
    device: &Device,
) -> Result<Option<Tensor>> {
    let data = view.data();
    Ok(Some(match view.dtype() {
        safetensors::Dtype::F32 => {
            let v: Vec<f32> = data
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
            Tensor::from_vec(v, view.shape(), device)?
        }
        safetensors::Dtype::F64 => {
            let v: Vec<f64> = data
                .chunks_exact(8)
                .map(|b| f64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]))
                .collect();
            Tensor::from_vec(v, view.shape(), device)?
        }
        _ => return Ok(None),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encoded_samples_read_back_and_are_deterministic() {
        let dev = Device::Cpu;
        let a = Tensor::new(&[[1f32, 2.0, 3.0], [4.0, 5.0, 6.0]], &dev).unwrap();
        let b = Tensor::new(&[-0.5f32], &dev).unwrap();
        let tensors = vec![("w".to_string(), a), ("b".to_string(), b)];
        let meta: BTreeMap<String, String> =
            (0..20).map(|i| (format!("k{i}"), i.to_string())).collect();
        let bytes = encode_safetensors(&tensors, &meta).unwrap();
        assert_eq!(bytes, encode_safetensors(&tensors, &meta).unwrap());
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.safetensors");
        std::fs::write(&path, &bytes).unwrap();
        let s = load_sample(&path, &dev).unwrap();
        assert_eq!(
            s.tensors["w"].to_vec2::<f32>().unwrap(),
            vec![vec![1., 2., 3.], vec![4., 5., 6.]]
        );
        assert_eq!(s.tensors["b"].to_vec1::<f32>().unwrap(), vec![-0.5]);
        // The 20 keys given and the checksum.
        assert_eq!(s.metadata.len(), 21);
        assert!(s.metadata.contains_key(CHECKSUM_KEY));
        assert_eq!(s.metadata["k7"], "7");
    }
}
