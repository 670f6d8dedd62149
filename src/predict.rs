//! `bnn predict`: the Bayesian model average of a run's samples on a user's images (PNG or
//! JPEG files, or images of an IDX file): class probabilities, the predicted class, the
//! predictive entropy and the mutual information (what the samples disagree on).

use std::path::Path;

use candle_core::Device;
use serde::{Deserialize, Serialize};

use crate::checkpoint::{self, RunManifest};
use crate::data::{idx, Split, NUM_CLASSES};
use crate::ensemble;
use crate::error::{Error, Result};
use crate::model::Network;
use crate::picture::{self, Framing};
use crate::uncertainty;

/// Fashion-MNIST's classes, in label order.
pub const FASHION_CLASSES: [&str; NUM_CLASSES] = [
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
];

/// An image to predict: where it came from, its pixels, what was done to it.
#[derive(Debug, Clone)]
pub struct Input {
    pub name: String,
    pub pixels: Vec<u8>,
    pub notes: Vec<String>,
}

/// The ensemble's prediction for one image.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Prediction {
    pub input: String,
    pub class: usize,
    /// The class's name where the dataset has names (Fashion-MNIST).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub class_name: Option<String>,
    pub probability: f64,
    /// p(y = k | x), averaged over the samples.
    pub probabilities: Vec<f64>,
    /// H[p̄] in nats.
    pub entropy: f64,
    /// H\[p̄\] − mean H\[p_k\]: 0 where every sample agrees.
    pub mutual_information: f64,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

/// Image side of a run's data (square, one channel).
fn side(manifest: &RunManifest) -> Result<usize> {
    if manifest.table.is_some() {
        return Err(Error::Config(format!(
            "bnn predict classifies pictures; the run on {} was trained on a table (`bnn eval --run` scores its test rows)",
            manifest.dataset
        )));
    }
    let s = (manifest.input_dim as f64).sqrt().round() as usize;
    match s * s == manifest.input_dim {
        true => Ok(s),
        false => Err(Error::Config(format!(
            "the run's inputs have {} values, not a square grey image",
            manifest.input_dim
        ))),
    }
}

/// Reads picture files for the run of `manifest`, framed as its dataset's images.
pub fn read_pictures(manifest: &RunManifest, paths: &[impl AsRef<Path>]) -> Result<Vec<Input>> {
    let s = side(manifest)?;
    let framing = match manifest.dataset.starts_with("fashion") {
        true => Framing::Whole,
        false => Framing::Digit,
    };
    paths
        .iter()
        .map(|p| {
            let p = p.as_ref();
            let prepared = picture::load(p, s, s, framing)?;
            Ok(Input {
                name: p.display().to_string(),
                pixels: prepared.pixels,
                notes: prepared.notes,
            })
        })
        .collect()
}

/// Image `index` of the IDX images file `path` (gzipped or not).
pub fn read_idx_image(manifest: &RunManifest, path: &Path, index: usize) -> Result<Input> {
    let s = side(manifest)?;
    let a = idx::read_file(path)?;
    if a.dims.len() != 3 || a.dims[1] != s || a.dims[2] != s {
        return Err(Error::Data(format!(
            "{}: images of shape {:?}, the run's are {s}×{s}",
            path.display(),
            &a.dims[1..]
        )));
    }
    if index >= a.dims[0] {
        return Err(Error::Data(format!(
            "{}: --index {index} but the file has {} images",
            path.display(),
            a.dims[0]
        )));
    }
    Ok(Input {
        name: format!("{}[{index}]", path.display()),
        pixels: a.data[index * s * s..(index + 1) * s * s].to_vec(),
        notes: Vec::new(),
    })
}

/// The model average of every sample of the run in `run_dir` on `inputs`.
pub fn predict(
    run_dir: &Path,
    manifest: &RunManifest,
    inputs: &[Input],
    device: &Device,
) -> Result<Vec<Prediction>> {
    let s = side(manifest)?;
    let split = Split {
        features: Vec::new(),
        values: Vec::new(),
        images: inputs
            .iter()
            .flat_map(|i| i.pixels.iter().copied())
            .collect(),
        labels: vec![0; inputs.len()],
        rows: s,
        cols: s,
        standardization: manifest.standardization.clone().map(std::sync::Arc::new),
    };
    let model = Network::new(
        &manifest.settings.model,
        manifest.input_dim,
        NUM_CLASSES,
        0,
        device,
    )?;
    let n = inputs.len();
    let (mut sum, mut entropy_sum, mut samples) =
        (vec![0f64; n * NUM_CLASSES], vec![0f64; n], 0usize);
    for dir in checkpoint::chain_dirs(run_dir) {
        for path in checkpoint::list_samples(&dir)? {
            let sample = checkpoint::load_sample(&path, device)?;
            model
                .load(&sample.tensors)
                .map_err(|e| Error::Checkpoint(format!("{}: {e}", path.display())))?;
            let probs = ensemble::predict(&model, &split, device)?;
            for (acc, &p) in sum.iter_mut().zip(&probs) {
                *acc += p as f64;
            }
            for (h, row) in entropy_sum.iter_mut().zip(probs.chunks_exact(NUM_CLASSES)) {
                *h += uncertainty::entropy_f32(row);
            }
            samples += 1;
        }
    }
    if samples == 0 {
        return Err(Error::Checkpoint(format!(
            "{}: no samples to predict with",
            run_dir.display()
        )));
    }
    let k = samples as f64;
    let names = manifest
        .dataset
        .starts_with("fashion")
        .then_some(FASHION_CLASSES);
    Ok(inputs
        .iter()
        .enumerate()
        .map(|(i, input)| {
            let p: Vec<f64> = sum[i * NUM_CLASSES..(i + 1) * NUM_CLASSES]
                .iter()
                .map(|s| s / k)
                .collect();
            let class = uncertainty::predicted(&p);
            let entropy = uncertainty::entropy(&p);
            Prediction {
                input: input.name.clone(),
                class,
                class_name: names.map(|n| n[class].to_string()),
                probability: p[class],
                entropy,
                mutual_information: entropy - entropy_sum[i] / k,
                probabilities: p,
                notes: input.notes.clone(),
            }
        })
        .collect())
}

/// The table `bnn predict` prints.
pub fn table(predictions: &[Prediction]) -> String {
    let width = predictions
        .iter()
        .map(|p| p.input.len())
        .max()
        .unwrap_or(5)
        .max(5);
    let mut out = format!(
        "{:width$}  class  p(class)  entropy      MI  p(0) … p(9)\n",
        "image"
    );
    for p in predictions {
        let class = match &p.class_name {
            Some(n) => format!("{} {n}", p.class),
            None => p.class.to_string(),
        };
        let probs: Vec<String> = p.probabilities.iter().map(|q| format!("{q:.3}")).collect();
        out.push_str(&format!(
            "{:width$}  {class:>5}  {:>8.4}  {:>7.4}  {:>6.4}  {}\n",
            p.input,
            p.probability,
            p.entropy,
            p.mutual_information,
            probs.join(" ")
        ));
    }
    out
}
