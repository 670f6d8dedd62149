//! Datasets: IDX reading, the registry of known datasets, finding the data folder,
//! fetching, and minibatch assembly without copying the dataset.

pub mod augment;
pub mod fetch;
pub mod idx;
pub mod label_noise;
pub mod registry;
pub mod shift;
pub mod table;
pub mod tabular;
pub mod toy;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::kernels::gemm::NonZero;
pub use registry::{DatasetSpec, FileSpec};
use registry::{TEST_IMAGES, TEST_LABELS, TRAIN_IMAGES, TRAIN_LABELS};

/// Number of classes of every supported dataset.
pub const NUM_CLASSES: usize = 10;

/// Images (`u8`, row-major, `n × dim`) and labels of one split, kept as bytes: a minibatch
/// is scaled to `[0, 1]` (or standardised) as it is gathered, so the dataset is never
/// copied as floats.
#[derive(Debug, Clone)]
pub struct Split {
    /// The images, one byte per pixel, row after row.
    pub images: Vec<u8>,
    /// The labels, one byte per image (classification; empty for regression).
    pub labels: Vec<u8>,
    /// A table's features, already standardised, row-major `len × cols` (then `images` is
    /// empty and `rows` is 1); empty for images.
    pub features: Vec<f32>,
    /// A regression's targets, standardised ([`Task::Regression`]); empty for
    /// classification.
    pub values: Vec<f32>,
    /// Image height.
    pub rows: usize,
    /// Image width.
    pub cols: usize,
    /// Per-pixel standardisation applied by [`Split::gather`] (`--standardize`); `None`:
    /// pixels scaled to `[0, 1]`.
    pub standardization: Option<Arc<Standardization>>,
}

/// Per-pixel standardisation, x = (p/255 − mean) / std, with the training set's mean and
/// standard deviation of each pixel (in `[0, 1]` units) and the deviation floored at
/// `floor` (a pixel that is nearly constant, such as MNIST's blank border, is not blown
/// up). Recorded in `run.json`, so that `bnn eval` applies the same map.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Standardization {
    /// The smallest standard deviation divided by (pixels that never vary).
    pub floor: f32,
    /// Per-pixel mean over the training images.
    pub mean: Vec<f32>,
    /// Per-pixel standard deviation (at least `floor`).
    pub std: Vec<f32>,
}

impl Standardization {
    /// The floor `--standardize` uses.
    pub const DEFAULT_FLOOR: f32 = 0.1;

    /// Each pixel's mean and (population) standard deviation over `split`.
    pub fn of(split: &Split, floor: f32) -> Result<Self> {
        if !(floor > 0.0 && floor.is_finite()) {
            return Err(Error::Config(format!(
                "the standardisation floor must be positive, got {floor}"
            )));
        }
        if split.is_empty() {
            return Err(Error::Data("cannot standardise an empty split".into()));
        }
        let d = split.dim();
        let (mut sum, mut sq) = (vec![0u64; d], vec![0u64; d]);
        for image in split.images.chunks_exact(d) {
            for ((s, q), &p) in sum.iter_mut().zip(&mut sq).zip(image) {
                *s += p as u64;
                *q += (p as u64) * (p as u64);
            }
        }
        // Integer sums are exact: the statistics do not depend on the order of images.
        let n = split.len() as f64;
        let (mut mean, mut std) = (Vec::with_capacity(d), Vec::with_capacity(d));
        for (&s, &q) in sum.iter().zip(&sq) {
            let m = s as f64 / n / 255.0;
            let var = (q as f64 / n / (255.0 * 255.0) - m * m).max(0.0);
            mean.push(m as f32);
            std.push((var.sqrt() as f32).max(floor));
        }
        Ok(Standardization { floor, mean, std })
    }

    fn check(&self, dim: usize) -> Result<()> {
        let ok = self.mean.len() == dim
            && self.std.len() == dim
            && self.std.iter().all(|s| *s > 0.0 && s.is_finite())
            && self.mean.iter().all(|m| m.is_finite());
        if ok {
            Ok(())
        } else {
            Err(Error::Data(format!(
                "the input standardisation does not fit images of {dim} pixels (or has a zero or non-finite deviation)"
            )))
        }
    }
}

impl Split {
    /// Examples in the split.
    pub fn len(&self) -> usize {
        self.labels.len().max(self.values.len())
    }

    /// Whether it has no example.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether it holds a table's rows (features as floats) rather than images.
    pub fn is_table(&self) -> bool {
        self.images.is_empty() && !self.features.is_empty()
    }

    /// The split of a table: `features` row-major with `cols` per row, and either class
    /// `labels` or regression `values`.
    pub fn of_table(features: Vec<f32>, cols: usize, labels: Vec<u8>, values: Vec<f32>) -> Split {
        Split {
            images: Vec::new(),
            labels,
            features,
            values,
            rows: 1,
            cols,
            standardization: None,
        }
    }

    /// The regression targets at `indices` into `out`.
    pub fn gather_values(&self, indices: &[usize], out: &mut Vec<f32>) {
        out.clear();
        out.extend(indices.iter().map(|&i| self.values[i]));
    }

    /// Pixels per image.
    pub fn dim(&self) -> usize {
        self.rows * self.cols
    }

    /// Writes the images at `indices`, scaled to `[0, 1]` (or standardised), into `x` and
    /// their labels into `y`.
    pub fn gather(&self, indices: &[usize], x: &mut Vec<f32>, y: &mut Vec<u32>) {
        self.gather_into(indices, x, y, None)
    }

    /// [`Split::gather`], recording into `map` which entries of `x` are not zero as each
    /// row is written (the first layer's zero map; the same as `map.record(x, ..)` after).
    pub fn gather_recording(
        &self,
        indices: &[usize],
        x: &mut Vec<f32>,
        y: &mut Vec<u32>,
        map: &mut NonZero,
    ) {
        self.gather_into(indices, x, y, Some(map))
    }

    fn gather_into(
        &self,
        indices: &[usize],
        x: &mut Vec<f32>,
        y: &mut Vec<u32>,
        map: Option<&mut NonZero>,
    ) {
        let d = self.dim();
        y.clear();
        y.extend(
            indices
                .iter()
                .filter_map(|&i| self.labels.get(i))
                .map(|&l| l as u32),
        );
        x.resize(indices.len() * d, 0.0);
        if self.is_table() {
            for (row, &i) in x.chunks_exact_mut(d).zip(indices) {
                row.copy_from_slice(&self.features[i * d..(i + 1) * d]);
            }
            if let Some(map) = map {
                map.record(x, indices.len(), d);
            }
            return;
        }
        let std = self.standardization.as_deref();
        // Row r of x from image indices[r].
        let convert = |r: usize, row: &mut [f32]| {
            // The rows are scattered over the dataset: fetch the next one while this one
            // converts (the hardware prefetcher only follows a row once it runs).
            if let Some(&next) = indices.get(r + 1) {
                crate::kernels::isa::prefetch(&self.images[next * d..(next + 1) * d]);
            }
            let i = indices[r];
            let pixels = &self.images[i * d..(i + 1) * d];
            match std {
                None => {
                    for (o, &px) in row.iter_mut().zip(pixels) {
                        *o = px as f32 / 255.0;
                    }
                }
                Some(s) => {
                    for (((o, &px), &m), &sd) in row.iter_mut().zip(pixels).zip(&s.mean).zip(&s.std)
                    {
                        *o = (px as f32 / 255.0 - m) / sd;
                    }
                }
            }
        };
        // Large minibatches convert on two threads, each its own rows of x.
        match map {
            Some(map) => map.fill_and_record(x, indices.len(), d, convert),
            None => {
                let work = x.len();
                crate::pool::halves(x, d, work, |part, at| {
                    for (r, row) in (at / d..).zip(part.chunks_exact_mut(d)) {
                        convert(r, row);
                    }
                });
            }
        }
    }

    /// Splits off the last `n` examples.
    fn split_off_last(&mut self, n: usize) -> Split {
        let keep = self.len() - n;
        let (features, values) = match self.is_table() {
            true => (
                self.features.split_off(keep * self.dim()),
                self.values.split_off(keep.min(self.values.len())),
            ),
            false => (Vec::new(), Vec::new()),
        };
        Split {
            images: self.images.split_off(keep * self.dim()),
            labels: self.labels.split_off(keep.min(self.labels.len())),
            features,
            values,
            rows: self.rows,
            cols: self.cols,
            standardization: self.standardization.clone(),
        }
    }
}

/// A dataset in memory.
#[derive(Debug, Clone)]
pub struct Dataset {
    /// Registry name (`mnist`, `fashion-mnist`, `mnist-mini`).
    pub name: String,
    /// Where it was read from: a folder, or `built-in`.
    pub source: String,
    /// The training split.
    pub train: Split,
    /// The validation split held out of the training set (`--valid`).
    pub valid: Option<Split>,
    /// The test split.
    pub test: Split,
    /// What is predicted: the classes, or a real value.
    pub task: Task,
    /// For a table read from CSV: where, and how it was split and standardised.
    pub table: Option<tabular::TableOrigin>,
}

/// What a dataset asks to predict.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Task {
    /// One of `classes` labels (0 … classes − 1).
    Classification {
        /// Classes (at least 2).
        classes: usize,
    },
    /// A real value, standardised for training: y_std = (y − mean)/std; predictions are
    /// mapped back, so every metric is in the target's own units.
    Regression {
        /// The training targets' mean.
        mean: f64,
        /// Their (population) standard deviation (1 when not standardised).
        std: f64,
    },
}

impl Task {
    /// The image data sets' task: ten classes.
    pub const TEN_CLASSES: Task = Task::Classification {
        classes: NUM_CLASSES,
    };

    /// The network's outputs: one per class, or one value.
    pub fn outputs(&self) -> usize {
        match self {
            Task::Classification { classes } => *classes,
            Task::Regression { .. } => 1,
        }
    }

    /// Whether it is a regression.
    pub fn is_regression(&self) -> bool {
        matches!(self, Task::Regression { .. })
    }
}

impl Dataset {
    /// Standardises every split's pixels with `s` (computed on the training split).
    pub fn set_standardization(&mut self, s: Option<Standardization>) -> Result<()> {
        if let Some(s) = &s {
            s.check(self.train.dim())?;
        }
        let s = s.map(Arc::new);
        self.train.standardization = s.clone();
        if let Some(v) = self.valid.as_mut() {
            v.standardization = s.clone();
        }
        self.test.standardization = s;
        Ok(())
    }
}

fn split_from_idx(images: idx::IdxArray, labels: idx::IdxArray, origin: &str) -> Result<Split> {
    let bad = |m: String| Error::Data(format!("{origin}: {m}"));
    if images.dims.len() != 3 {
        return Err(bad(format!(
            "images must have 3 dimensions, found {:?}",
            images.dims
        )));
    }
    if labels.dims.len() != 1 {
        return Err(bad(format!(
            "labels must have 1 dimension, found {:?}",
            labels.dims
        )));
    }
    if images.dims[0] != labels.dims[0] {
        return Err(bad(format!(
            "{} images but {} labels",
            images.dims[0], labels.dims[0]
        )));
    }
    if let Some(l) = labels.data.iter().find(|&&l| l as usize >= NUM_CLASSES) {
        return Err(bad(format!("label {l} is not in 0..{NUM_CLASSES}")));
    }
    Ok(Split {
        rows: images.dims[1],
        cols: images.dims[2],
        images: images.data,
        labels: labels.data,
        features: Vec::new(),
        values: Vec::new(),
        standardization: None,
    })
}

/// The name of the registry file whose canonical content has this SHA-256, if any.
fn identify(sha: &str) -> Option<String> {
    registry::ALL.iter().find_map(|d| {
        d.files
            .iter()
            .find(|f| f.raw_sha256 == sha)
            .map(|f| format!("{}/{}", d.name, f.name))
    })
}

fn parse_all(spec: &DatasetSpec, bytes: [(&[u8], String); 4], source: String) -> Result<Dataset> {
    let mut arrays = Vec::with_capacity(4);
    for ((b, origin), file) in bytes.into_iter().zip(&spec.files) {
        let array = idx::from_bytes(b, &origin)?;
        // Well-formed but not the canonical content: another dataset's file, or a
        // modified copy. Training on it under this name would mislabel every result.
        let sha = fetch::idx_sha256_hex(&array);
        if sha != file.raw_sha256 {
            let what = identify(&sha)
                .map(|f| format!("it is {f}"))
                .unwrap_or_else(|| "it matches no known dataset".to_string());
            return Err(Error::Data(format!(
                "{origin} is not the canonical {} {} ({what}); check --dataset and --data-dir, or run `bnn data verify --dataset {}`",
                spec.name, file.name, spec.name
            )));
        }
        arrays.push(array);
    }
    let [ti, tl, si, sl]: [idx::IdxArray; 4] = arrays
        .try_into()
        .map_err(|_| Error::Data("internal: expected four IDX files".into()))?;
    let train = split_from_idx(ti, tl, &format!("{source} (train)"))?;
    let test = split_from_idx(si, sl, &format!("{source} (test)"))?;
    if (train.rows, train.cols) != (test.rows, test.cols) {
        return Err(Error::Data(format!(
            "{source}: train images are {}×{} but test images {}×{}",
            train.rows, train.cols, test.rows, test.cols
        )));
    }
    Ok(Dataset {
        name: spec.name.to_string(),
        source,
        train,
        valid: None,
        test,
        task: Task::TEN_CLASSES,
        table: None,
    })
}

/// Reads a dataset from a folder holding its four IDX files (gzipped or raw).
pub fn load_dir(spec: &DatasetSpec, dir: &Path) -> Result<Dataset> {
    let mut contents: Vec<(Vec<u8>, String)> = Vec::new();
    for file in &spec.files {
        let path = fetch::locate(dir, file)
            .ok_or_else(|| Error::Data(format!("{}: missing {}(.gz)", dir.display(), file.name)))?;
        let bytes = std::fs::read(&path).map_err(|e| Error::io(&path, e))?;
        contents.push((bytes, path.display().to_string()));
    }
    let refs = [0, 1, 2, 3].map(|i| (contents[i].0.as_slice(), contents[i].1.clone()));
    parse_all(spec, refs, dir.display().to_string())
}

/// The built-in quick-start subset of MNIST, from the bytes embedded in the binary.
pub fn load_builtin() -> Result<Dataset> {
    let spec = registry::MNIST_MINI;
    let b = registry::mini_bytes();
    let names = [TRAIN_IMAGES, TRAIN_LABELS, TEST_IMAGES, TEST_LABELS]
        .map(|i| (b[i], format!("built-in {}", spec.files[i].name)));
    parse_all(&spec, names, "built-in".to_string())
}

/// Folders searched for `spec`: only `--data-dir` when given (an explicit folder must not
/// be silently replaced by another copy); otherwise `$BNN_DATA_DIR/<dataset>`,
/// `./data/<dataset>`, then the system folders of the dataset.
pub fn candidate_dirs(spec: &DatasetSpec, data_dir: Option<&Path>) -> Vec<PathBuf> {
    if let Some(d) = data_dir {
        return vec![d.to_path_buf()];
    }
    let mut dirs = Vec::new();
    if let Some(env) = std::env::var_os("BNN_DATA_DIR") {
        dirs.push(PathBuf::from(env).join(spec.name));
    }
    dirs.push(PathBuf::from("data").join(spec.name));
    dirs.extend(spec.system_dirs.iter().map(PathBuf::from));
    dirs
}

/// Whether `dir` holds all four files of `spec`.
pub fn is_complete(spec: &DatasetSpec, dir: &Path) -> bool {
    spec.files.iter().all(|f| fetch::locate(dir, f).is_some())
}

/// The folder a download goes to: `--data-dir` if given, else the first candidate.
pub fn download_dir(spec: &DatasetSpec, data_dir: Option<&Path>) -> PathBuf {
    candidate_dirs(spec, data_dir).remove(0)
}

/// How to find or obtain a dataset.
#[derive(Debug, Clone, Default)]
pub struct LoadOptions {
    /// A folder holding the dataset's files (else the standard places are searched).
    pub data_dir: Option<PathBuf>,
    /// Never touch the network.
    pub offline: bool,
    /// Overrides the registry's mirrors.
    pub mirror: Option<String>,
    /// Hold out the last `valid` training examples as a validation set.
    pub valid: usize,
    /// Keep only the first N training examples (after the validation hold-out).
    pub train_limit: Option<usize>,
    /// For `mnist` without `--data-dir`: use the built-in subset when the full set can be
    /// neither found nor fetched.
    pub builtin_fallback: bool,
}

/// The message that tells a user how to get a missing dataset.
pub fn missing_message(spec: &DatasetSpec, searched: &[PathBuf], why: &str) -> String {
    let list = searched
        .iter()
        .map(|d| d.display().to_string())
        .collect::<Vec<_>>()
        .join(", ");
    let mut msg = format!(
        "dataset {} not found (searched {list}){why}; run `bnn data fetch --dataset {}` on a machine with network, \
         or set BNN_DATA_DIR to a folder holding {}/ with the four IDX files",
        spec.name, spec.name, spec.name
    );
    if let Some(pkg) = spec.apt_package {
        msg.push_str(&format!(", or `apt install {pkg}`"));
    }
    msg
}

/// Finds (or fetches) and reads a dataset by name.
pub fn load(name: &str, opts: &LoadOptions) -> Result<Dataset> {
    let spec = registry::lookup(name).ok_or_else(|| {
        let known: Vec<_> = registry::ALL.iter().map(|d| d.name).collect();
        Error::Config(format!(
            "unknown dataset `{name}`; known datasets: {}",
            known.join(", ")
        ))
    })?;
    let mut ds = if spec.name == registry::MNIST_MINI.name {
        match &opts.data_dir {
            Some(dir) => load_dir(&spec, dir)?,
            None => load_builtin()?,
        }
    } else {
        locate_or_fetch(&spec, opts)?
    };
    if opts.valid > 0 {
        if opts.valid >= ds.train.len() {
            return Err(Error::Config(format!(
                "--valid {} leaves no training data ({} training examples)",
                opts.valid,
                ds.train.len()
            )));
        }
        ds.valid = Some(ds.train.split_off_last(opts.valid));
    }
    if let Some(n) = opts.train_limit {
        let have = ds.train.len();
        if n == 0 || n > have {
            return Err(Error::Config(format!(
                "--train-limit {n}: there are {have} training examples; give 1 to {have}"
            )));
        }
        // The rest is dropped: split_off_last hands it back as a split of its own.
        let _ = ds.train.split_off_last(have - n);
    }
    Ok(ds)
}

fn locate_or_fetch(spec: &DatasetSpec, opts: &LoadOptions) -> Result<Dataset> {
    let dirs = candidate_dirs(spec, opts.data_dir.as_deref());
    if let Some(dir) = dirs.iter().find(|d| is_complete(spec, d)) {
        return load_dir(spec, dir);
    }
    let why = if opts.offline {
        " and --offline forbids downloading".to_string()
    } else if !fetch::can_download() {
        " and this program cannot download".to_string()
    } else {
        let target = download_dir(spec, opts.data_dir.as_deref());
        let mirrors: Vec<String> = match &opts.mirror {
            Some(m) => vec![m.clone()],
            None => spec.mirrors.iter().map(|s| s.to_string()).collect(),
        };
        tracing::debug!(dataset = spec.name, dir = %target.display(), "dataset not found, downloading");
        match fetch::fetch(spec, &mirrors, &target) {
            Ok(_) => return load_dir(spec, &target),
            Err(e) => format!(" and downloading failed ({e})"),
        }
    };
    if opts.builtin_fallback && spec.name == registry::MNIST.name && opts.data_dir.is_none() {
        // The first run of a new user lands here: one line, the reasons at -v.
        tracing::debug!("{}", missing_message(spec, &dirs, &why));
        eprintln!(
            "bnn: full MNIST not found{}; training on the built-in subset (10,000 training and 10,000 test images of MNIST; -v says why)",
            if opts.offline { "" } else { " nor downloadable" }
        );
        return load_builtin();
    }
    Err(Error::Data(missing_message(spec, &dirs, &why)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(images: Vec<u8>, cols: usize) -> Split {
        let n = images.len() / cols;
        Split {
            images,
            labels: vec![0; n],
            features: Vec::new(),
            values: Vec::new(),
            rows: 1,
            cols,
            standardization: None,
        }
    }

    #[test]
    fn standardization_uses_each_pixels_mean_and_floored_deviation() {
        // Pixel 0: 0 and 255 (mean 0.5, std 0.5); pixel 1: 51 twice (std 0 → floor);
        // pixel 2: 0 and 51 (mean 0.1, std 0.1, just above a floor of 0.05).
        let s = split(vec![0, 51, 0, 255, 51, 51], 3);
        let st = Standardization::of(&s, 0.05).unwrap();
        let close = |a: f32, b: f32| (a - b).abs() < 1e-6;
        assert!(close(st.mean[0], 0.5) && close(st.std[0], 0.5));
        assert!(close(st.mean[1], 0.2) && close(st.std[1], 0.05));
        assert!(close(st.mean[2], 0.1) && close(st.std[2], 0.1));

        let mut ds = Dataset {
            name: "t".into(),
            source: "t".into(),
            train: s.clone(),
            valid: None,
            test: s,
            task: Task::TEN_CLASSES,
            table: None,
        };
        ds.set_standardization(Some(st.clone())).unwrap();
        let (mut x, mut y) = (Vec::new(), Vec::new());
        ds.test.gather(&[1, 0], &mut x, &mut y);
        let want = [1.0, 0.0, 1.0, -1.0, 0.0, -1.0];
        for (g, w) in x.iter().zip(want) {
            assert!(close(*g, w), "{x:?}");
        }
        // Without it, pixels in [0, 1].
        ds.set_standardization(None).unwrap();
        ds.test.gather(&[1], &mut x, &mut y);
        assert_eq!(x, vec![1.0, 0.2, 0.2]);
    }

    #[test]
    fn gather_recording_maps_the_rows_it_writes() {
        // 50 images of 784 pixels, a fifth of them blank: 39,200 floats, past the size
        // that the gather cuts between two threads; indices out of order and repeated.
        let (n, d) = (50, 784);
        let images: Vec<u8> = (0..n * d)
            .map(|i| {
                if (i * 7919) % 5 == 0 {
                    0
                } else {
                    (i % 251) as u8 + 1
                }
            })
            .collect();
        let mut s = split(images, d);
        let idx: Vec<usize> = (0..n).map(|i| (i * 17 + 3) % n).chain([4, 4]).collect();
        let standardized = Standardization::of(&s, 0.05).unwrap();
        let table = Split::of_table(
            vec![0.0, 1.5, -2.0, 0.0, 0.0, 3.0],
            3,
            vec![0, 1],
            Vec::new(),
        );
        for (label, part, idx) in [
            ("pixels", s.clone(), &idx[..]),
            (
                "standardised",
                {
                    s.standardization = Some(Arc::new(standardized));
                    s
                },
                &idx[..],
            ),
            ("table", table, &[1, 0, 1][..]),
            ("one row", split(vec![0, 3, 0], 3), &[0][..]),
        ] {
            let (mut x, mut y, mut map) = (Vec::new(), Vec::new(), NonZero::default());
            part.gather_recording(idx, &mut x, &mut y, &mut map);
            let (mut x2, mut y2) = (Vec::new(), Vec::new());
            part.gather(idx, &mut x2, &mut y2);
            assert!(
                x.iter().zip(&x2).all(|(a, b)| a.to_bits() == b.to_bits()),
                "{label}"
            );
            assert_eq!((x.len(), &y), (x2.len(), &y2), "{label}");
            let mut want = NonZero::default();
            want.record(&x, idx.len(), part.dim());
            assert_eq!(map, want, "{label}");
            // Standardised pixels are (almost) never exactly zero; the others have zeros.
            let density = map.density();
            assert!(
                density > 0.0 && (density < 1.0 || label == "standardised"),
                "{label}"
            );
        }
    }

    #[test]
    fn standardization_rejects_bad_input() {
        let s = split(vec![1, 2, 3, 4], 2);
        assert!(Standardization::of(&s, 0.0).is_err());
        assert!(Standardization::of(&split(vec![], 2), 0.1).is_err());
        let mut st = Standardization::of(&s, 0.1).unwrap();
        let mut ds = Dataset {
            name: "t".into(),
            source: "t".into(),
            train: split(vec![1, 2, 3], 3),
            valid: None,
            test: split(vec![1, 2, 3], 3),
            task: Task::TEN_CLASSES,
            table: None,
        };
        // Two pixels' statistics for three-pixel images.
        assert!(ds.set_standardization(Some(st.clone())).is_err());
        st.mean.push(0.0);
        st.std.push(0.0);
        assert!(ds.set_standardization(Some(st)).is_err());
    }
}
