//! Posterior samples on disk: one safetensors file per sample (tensor names are the
//! model's parameter names; the metadata says where the sample comes from), and the run
//! manifest `run.json`. Every file is written through a temporary name and a rename, so a
//! run cut off at any moment leaves only complete samples behind.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use serde::{Deserialize, Serialize};

use crate::atomic::write_atomic;
use crate::error::{Error, Result};

/// `run.json`: everything needed to rebuild the model and reread the data of a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunManifest {
    /// The `bnn` version that made the run.
    pub bnn_version: String,
    /// The dataset's name.
    pub dataset: String,
    /// Folder the data came from, or `built-in`.
    pub data_source: String,
    /// Training examples held out for validation.
    pub valid: usize,
    /// Training examples used.
    pub train_examples: usize,
    /// Features of an input.
    pub input_dim: usize,
    /// The network's outputs: classes, or 1 for a regression.
    pub num_classes: usize,
    /// What is predicted (absent in image runs: ten classes).
    #[serde(default = "ten_classes", skip_serializing_if = "is_ten_classes")]
    pub task: crate::data::Task,
    /// A table's CSV origin, split and standardisation (absent for images).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub table: Option<crate::data::tabular::TableOrigin>,
    /// Parameters of the network.
    pub num_params: usize,
    /// The hyper-parameters (flattened: the keys of older runs).
    #[serde(flatten)]
    pub settings: crate::settings::Settings,
    /// The per-pixel input standardisation of `--standardize` (absent: pixels in [0, 1]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub standardization: Option<crate::data::Standardization>,
    /// The `bnn train` command line that started the run; `--resume` re-reads it.
    #[serde(default)]
    pub command_line: Vec<String>,
}

fn ten_classes() -> crate::data::Task {
    crate::data::Task::TEN_CLASSES
}

fn is_ten_classes(t: &crate::data::Task) -> bool {
    *t == crate::data::Task::TEN_CLASSES
}

impl RunManifest {
    /// Writes `RUN/run.json` atomically.
    pub fn write(&self, run_dir: &Path) -> Result<()> {
        let json = serde_json::to_string_pretty(self)
            .map_err(|e| Error::Checkpoint(format!("serialising run.json: {e}")))?;
        write_atomic(&run_dir.join("run.json"), json.as_bytes())
    }

    /// Reads `RUN/run.json`.
    pub fn read(run_dir: &Path) -> Result<Self> {
        let path = run_dir.join("run.json");
        let text = std::fs::read_to_string(&path).map_err(|e| {
            Error::Checkpoint(format!(
                "{}: cannot read the run manifest ({e}); is {} a folder made by `bnn train`?",
                path.display(),
                run_dir.display()
            ))
        })?;
        serde_json::from_str(&text).map_err(|e| {
            Error::Checkpoint(format!("{}: corrupt run manifest: {e}", path.display()))
        })
    }
}

/// The folder of chain `k` of a multi-chain run.
pub fn chain_dir(run_dir: &Path, k: usize) -> PathBuf {
    run_dir.join(format!("chain-{k}"))
}

/// The chains' folders of a run, in chain order: `chain-0`, `chain-1`, … if there are any,
/// else the run's own folder (a single-chain run).
pub fn chain_dirs(run_dir: &Path) -> Vec<PathBuf> {
    let mut k = 0;
    let mut dirs = Vec::new();
    while chain_dir(run_dir, k).is_dir() {
        dirs.push(chain_dir(run_dir, k));
        k += 1;
    }
    if dirs.is_empty() {
        dirs.push(run_dir.to_path_buf());
    }
    dirs
}

/// Every sample of a run, its chains' in chain order, each chain's in step order; an error
/// if there is none.
pub fn run_sample_paths(run_dir: &Path) -> Result<Vec<PathBuf>> {
    let mut all = Vec::new();
    for chain in chain_dirs(run_dir) {
        all.extend(list_samples(&chain)?);
    }
    if all.is_empty() {
        return Err(Error::Checkpoint(format!(
            "{}: no samples",
            run_dir.display()
        )));
    }
    Ok(all)
}

/// The folder holding the samples of a run.
pub fn samples_dir(run_dir: &Path) -> PathBuf {
    run_dir.join("samples")
}

/// File name of the sample taken after `step` updates.
pub fn sample_path(run_dir: &Path, step: u64) -> PathBuf {
    samples_dir(run_dir).join(format!("sample-{step:08}.safetensors"))
}

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

/// A state file read back (`RUN/state/*.safetensors`: a chain's state between two
/// updates): checked as [`open_safetensors`] says, the JSON of its `state` metadata at the
/// format version its reader expects, and its tensors decoded on the CPU by name.
pub struct StateFile<S> {
    /// The `state` JSON.
    pub scalars: S,
    tensors: HashMap<String, Option<Tensor>>,
    path: PathBuf,
    what: &'static str,
}

impl<S: serde::de::DeserializeOwned> StateFile<S> {
    /// Reads the `what` (e.g. "run state") at `path`, whose JSON must say `"version":
    /// version`; `hint` follows the reason when the file cannot be read at all.
    pub fn read(path: &Path, what: &'static str, version: u32, hint: &str) -> Result<Self> {
        let bytes = std::fs::read(path).map_err(|e| {
            Error::Checkpoint(format!(
                "{}: cannot read the {what} ({e}); {hint}",
                path.display()
            ))
        })?;
        let corrupt =
            |e: String| Error::Checkpoint(format!("{}: corrupt {what}: {e}", path.display()));
        let checked = open_safetensors(&bytes).map_err(corrupt)?;
        let json = checked
            .metadata
            .get("state")
            .ok_or_else(|| corrupt("no `state` metadata".into()))?;
        let value: serde_json::Value =
            serde_json::from_str(json).map_err(|e| corrupt(e.to_string()))?;
        let found = value.get("version").and_then(serde_json::Value::as_u64);
        if found != Some(u64::from(version)) {
            let found = found.map_or("none".to_string(), |v| v.to_string());
            return Err(corrupt(format!(
                "format version {found}, this bnn reads {version}"
            )));
        }
        let scalars = serde_json::from_value(value).map_err(|e| corrupt(e.to_string()))?;
        let mut tensors = HashMap::new();
        for (name, view) in checked.tensors.tensors() {
            tensors.insert(name, decode_tensor(&view, &Device::Cpu)?);
        }
        Ok(StateFile {
            scalars,
            tensors,
            path: path.to_path_buf(),
            what,
        })
    }
}

impl<S> StateFile<S> {
    /// The error for a file whose content is not what it should be.
    pub fn corrupt(&self, why: &str) -> Error {
        Error::Checkpoint(format!(
            "{}: corrupt {}: {why}",
            self.path.display(),
            self.what
        ))
    }

    /// The tensor `name` (F32 or F64).
    pub fn tensor(&self, name: &str) -> Result<Tensor> {
        match self.tensors.get(name) {
            Some(Some(t)) => Ok(t.clone()),
            Some(None) => Err(self.corrupt(&format!("tensor `{name}` is neither F32 nor F64"))),
            None => Err(self.corrupt(&format!("no tensor `{name}`"))),
        }
    }

    /// The tensor `name`, flat, in f64.
    pub fn vector(&self, name: &str) -> Result<Vec<f64>> {
        Ok(self
            .tensor(name)?
            .flatten_all()?
            .to_dtype(DType::F64)?
            .to_vec1::<f64>()?)
    }
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

/// The sample files of a run, ordered by step.
pub fn list_samples(run_dir: &Path) -> Result<Vec<PathBuf>> {
    Ok(list_samples_by_step(run_dir)?
        .into_iter()
        .map(|(_, p)| p)
        .collect())
}

/// The sample files of a run with the step each was taken after, ordered by step.
pub fn list_samples_by_step(run_dir: &Path) -> Result<Vec<(u64, PathBuf)>> {
    let dir = samples_dir(run_dir);
    let entries = std::fs::read_dir(&dir)
        .map_err(|e| Error::Checkpoint(format!("{}: cannot list samples ({e})", dir.display())))?;
    let mut found: Vec<(u64, PathBuf)> = Vec::new();
    for entry in entries {
        let path = entry.map_err(|e| Error::io(&dir, e))?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if let Some(step) = name
            .strip_prefix("sample-")
            .and_then(|s| s.strip_suffix(".safetensors"))
            .and_then(|s| s.parse::<u64>().ok())
        {
            found.push((step, path));
        }
    }
    found.sort();
    Ok(found)
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
