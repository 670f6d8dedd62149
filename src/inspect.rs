//! `bnn inspect`: what a run folder or one sample file holds: architecture, sampler and
//! hyper-parameters, samples and steps, tensors (names, shapes, dtypes), sizes on disk and
//! the summary's metrics; as a table for people or JSON for programs.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::checkpoint::{self, RunManifest};
use crate::error::{Error, Result};
use crate::train::configurational::{Configurational, CONFIGURATIONAL_BAND};
use crate::train::diagnostics::DiagnosticRecord;

/// One tensor of a sample file.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    pub shape: Vec<usize>,
    pub dtype: String,
    pub bytes: usize,
}

/// A sample file: its tensors in file order and its metadata.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FileInfo {
    pub path: String,
    pub bytes: u64,
    pub parameters: usize,
    pub tensors: Vec<TensorInfo>,
    pub metadata: BTreeMap<String, String>,
}

/// A run folder.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunInfo {
    pub run_dir: String,
    pub dataset: String,
    pub model: String,
    pub num_params: usize,
    /// Everything the run was trained with, as `run.json` records it.
    pub settings: serde_json::Value,
    /// Samples per chain, in chain order.
    pub samples_per_chain: Vec<usize>,
    pub samples: usize,
    pub steps: Option<u64>,
    /// Bytes on disk: the samples, the resumable state, everything in the folder.
    pub sample_bytes: u64,
    pub state_bytes: u64,
    pub total_bytes: u64,
    /// The first sample's tensors (every sample has the same).
    pub first_sample: Option<FileInfo>,
    /// The test-set metrics of `summary.json`: ensemble and last sample (absent while the
    /// run has not finished).
    pub ensemble: Option<serde_json::Value>,
    pub last_sample: Option<serde_json::Value>,
    /// Each chain's configurational temperature as its last line of `diagnostics.jsonl`
    /// has it (chains without one are left out): (chain, figures).
    pub configurational: Vec<(usize, Configurational)>,
}

/// Reads the header of the safetensors file at `path`, its data checked against the
/// recorded checksum and for non-finite values.
pub fn inspect_file(path: &Path) -> Result<FileInfo> {
    let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    let corrupt =
        |e: String| Error::Checkpoint(format!("{}: not a safetensors sample: {e}", path.display()));
    let checked = crate::checkpoint::open_safetensors(&bytes).map_err(corrupt)?;
    let mut tensors: Vec<(usize, TensorInfo)> = checked
        .tensors
        .tensors()
        .into_iter()
        .map(|(name, view)| {
            let offset = view.data().as_ptr() as usize - bytes.as_ptr() as usize;
            let info = TensorInfo {
                shape: view.shape().to_vec(),
                dtype: format!("{:?}", view.dtype()),
                bytes: view.data().len(),
                name,
            };
            (offset, info)
        })
        .collect();
    tensors.sort_by_key(|(offset, _)| *offset);
    let tensors: Vec<TensorInfo> = tensors.into_iter().map(|(_, t)| t).collect();
    Ok(FileInfo {
        path: path.display().to_string(),
        bytes: bytes.len() as u64,
        parameters: tensors
            .iter()
            .map(|t| t.shape.iter().product::<usize>())
            .sum(),
        tensors,
        metadata: checked.metadata.into_iter().collect(),
    })
}

/// Bytes of every file under `dir`, recursively (0 when it does not exist).
fn bytes_under(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => bytes_under(&e.path()),
            _ => e.metadata().map_or(0, |m| m.len()),
        })
        .sum()
}

/// Reads the run folder `run_dir`.
pub fn inspect_run(run_dir: &Path) -> Result<RunInfo> {
    let manifest = RunManifest::read(run_dir)?;
    let chains = checkpoint::chain_dirs(run_dir);
    let mut samples_per_chain = Vec::new();
    let (mut sample_bytes, mut state_bytes) = (0, 0);
    let mut first = None;
    let mut configurational = Vec::new();
    for (c, dir) in chains.iter().enumerate() {
        if let Some(t) = last_configurational(dir) {
            configurational.push((c, t));
        }
        let paths = checkpoint::list_samples(dir)?;
        if first.is_none() {
            first = paths.first().cloned();
        }
        samples_per_chain.push(paths.len());
        sample_bytes += bytes_under(&checkpoint::samples_dir(dir));
        state_bytes += bytes_under(&dir.join("state"));
    }
    // Replicas' and stacked chains' states: their two slots.
    for slots in ["replicas", "stacked"] {
        state_bytes += bytes_under(&run_dir.join(slots));
    }
    let summary: Option<serde_json::Value> = match run_dir.join(crate::checkpoint::files::SUMMARY) {
        p if p.is_file() => {
            let text = std::fs::read_to_string(&p).map_err(|e| Error::io(&p, e))?;
            Some(serde_json::from_str(&text).map_err(|e| {
                Error::Checkpoint(format!("{}: not what bnn writes: {e}", p.display()))
            })?)
        }
        _ => None,
    };
    let settings = serde_json::to_value(&manifest.settings)
        .map_err(|e| Error::Checkpoint(format!("serialising the settings: {e}")))?;
    let field = |k: &str| summary.as_ref().and_then(|s| s.get(k)).cloned();
    Ok(RunInfo {
        run_dir: run_dir.display().to_string(),
        dataset: manifest.dataset.clone(),
        model: manifest.settings.model.label(),
        num_params: manifest.num_params,
        settings,
        samples: samples_per_chain.iter().sum(),
        samples_per_chain,
        steps: field("steps").and_then(|v| v.as_u64()),
        sample_bytes,
        state_bytes,
        total_bytes: bytes_under(run_dir),
        first_sample: first.map(|p| inspect_file(&p)).transpose()?,
        // A regression's metrics stand where a classification's do.
        ensemble: field("ensemble")
            .filter(|v| !v.is_null())
            .or_else(|| field("regression")),
        last_sample: field("last_sample")
            .filter(|v| !v.is_null())
            .or_else(|| field("regression_last_sample")),
        configurational,
    })
}

/// The configurational temperature of the last line of `chain`'s `diagnostics.jsonl`
/// that has one (none: no file, or a sampler without it).
fn last_configurational(chain: &Path) -> Option<Configurational> {
    let text = std::fs::read_to_string(chain.join(crate::checkpoint::files::DIAGNOSTICS)).ok()?;
    text.lines().rev().find_map(|l| {
        serde_json::from_str::<DiagnosticRecord>(l)
            .ok()?
            .configurational
    })
}

/// One chain's configurational temperature for people: since burn-in with its standard
/// error, and per tensor (the last interval's during burn-in).
fn configurational_line(c: &Configurational) -> String {
    let mut line = match (c.since_burnin, c.standard_error) {
        (Some(t), Some(se)) => format!("{t:.3} ± {se:.3} since burn-in"),
        (Some(t), None) => format!("{t:.3} since burn-in"),
        _ => format!(
            "{:.3} over the last {} updates (in burn-in)",
            c.temperature, c.updates
        ),
    };
    let (lo, hi) = CONFIGURATIONAL_BAND;
    let t = c.since_burnin.unwrap_or(c.temperature);
    if !(lo..=hi).contains(&t) {
        line.push_str(&format!(" (outside [{lo}, {hi}]: 1 for a correct sampler)"));
    }
    let tensors: Vec<String> = c
        .per_tensor
        .iter()
        .map(|t| {
            let value = t.since_burnin.unwrap_or(t.temperature);
            match t.standard_error.filter(|_| t.since_burnin.is_some()) {
                Some(se) => format!("{} {value:.3} ± {se:.3}", t.tensor),
                None => format!("{} {value:.3}", t.tensor),
            }
        })
        .collect();
    if tensors.len() > 1 {
        line.push_str(&format!("; {}", tensors.join(", ")));
    }
    line
}

/// A settings value for people: an object as `kind key value …`, strings unquoted.
fn words(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Object(m) => {
            let mut parts: Vec<String> = m.get("kind").map(words).into_iter().collect();
            parts.extend(
                m.iter()
                    .filter(|(k, _)| *k != "kind")
                    .map(|(k, v)| format!("{k} {}", words(v))),
            );
            parts.join("  ")
        }
        other => other.to_string(),
    }
}

/// Megabytes, for people.
fn mb(bytes: u64) -> String {
    format!("{:.2} MB", bytes as f64 / 1e6)
}

fn tensor_table(out: &mut String, f: &FileInfo) {
    let width = f
        .tensors
        .iter()
        .map(|t| t.name.len())
        .max()
        .unwrap_or(4)
        .max(6);
    let _ = writeln!(
        out,
        "  {:width$}  {:>16}  {:>5}  {:>10}",
        "tensor", "shape", "dtype", "bytes"
    );
    for t in &f.tensors {
        let shape = format!("{:?}", t.shape);
        let _ = writeln!(
            out,
            "  {:width$}  {:>16}  {:>5}  {:>10}",
            t.name, shape, t.dtype, t.bytes
        );
    }
}

/// The table `bnn inspect --file` prints.
pub fn file_table(f: &FileInfo) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "file        {}", f.path);
    let _ = writeln!(out, "size        {} ({} bytes)", mb(f.bytes), f.bytes);
    let _ = writeln!(out, "parameters  {}", f.parameters);
    for (k, v) in &f.metadata {
        let _ = writeln!(out, "metadata    {k} = {v}");
    }
    tensor_table(&mut out, f);
    out
}

/// The sampler and its settings as recorded; HMC's minibatch-sampler fields (friction,
/// diffusion, …) mean nothing, so its own are shown instead.
fn sampler_line(s: &serde_json::Value) -> String {
    let get = |k: &str| s.get(k).map_or("-".to_string(), words);
    let sampler = s.get("sampler");
    match sampler.and_then(|v| v.get("kind")).and_then(|k| k.as_str()) {
        Some("hmc") => {
            let eps = sampler
                .and_then(|v| v.get("step_size"))
                .map_or("-".into(), words);
            format!(
                "hmc  first step_size {eps} (adapted in burn-in)  {}",
                get("hmc")
            )
        }
        _ => get("sampler"),
    }
}

/// An ensemble's figures: RMSE, NLL and coverage for a regression, accuracy, NLL and ECE
/// for classes.
fn metric_line(v: &Option<serde_json::Value>) -> String {
    match v {
        Some(m) if m.get("rmse").is_some() => format!(
            "RMSE {:.4}  NLL {:.4}  95% coverage {:.4}",
            m["rmse"].as_f64().unwrap_or(f64::NAN),
            m["nll"].as_f64().unwrap_or(f64::NAN),
            m["coverage"][2].as_f64().unwrap_or(f64::NAN)
        ),
        Some(m) => format!(
            "accuracy {:.4}  NLL {:.4}  ECE {:.4}",
            m["accuracy"].as_f64().unwrap_or(f64::NAN),
            m["nll"].as_f64().unwrap_or(f64::NAN),
            m["ece"].as_f64().unwrap_or(f64::NAN)
        ),
        None => "-".into(),
    }
}

/// The table `bnn inspect --run` prints.
pub fn run_table(r: &RunInfo) -> String {
    let mut out = String::new();
    let s = &r.settings;
    let get = |k: &str| s.get(k).map_or("-".to_string(), words);
    let _ = writeln!(out, "run          {}", r.run_dir);
    let _ = writeln!(out, "dataset      {}", r.dataset);
    let _ = writeln!(
        out,
        "model        {} ({} parameters)",
        r.model, r.num_params
    );
    let _ = writeln!(out, "sampler      {}", sampler_line(s));
    let _ = writeln!(
        out,
        "prior        {}   temperature {}",
        get("prior"),
        get("temperature")
    );
    let _ = writeln!(
        out,
        "schedule     epochs {}  batch {}  burn-in {}  thin {}  decay at {}  cycles {}  seed {}  chains {}",
        get("epochs"),
        get("batch_size"),
        get("burnin"),
        get("thin"),
        get("decay_at"),
        get("cycles"),
        get("seed"),
        get("chains")
    );
    let per_chain = match r.samples_per_chain.len() {
        1 => String::new(),
        _ => format!(" ({:?} per chain)", r.samples_per_chain),
    };
    let _ = writeln!(out, "samples      {}{per_chain}", r.samples);
    let _ = writeln!(
        out,
        "steps        {}",
        r.steps.map_or("- (not finished)".into(), |s| s.to_string())
    );
    let _ = writeln!(
        out,
        "on disk      samples {}, state {}, whole folder {}",
        mb(r.sample_bytes),
        mb(r.state_bytes),
        mb(r.total_bytes)
    );
    for (chain, c) in &r.configurational {
        let which = match r.samples_per_chain.len() {
            1 => String::new(),
            _ => format!(" (chain {chain})"),
        };
        let _ = writeln!(out, "θ·∇Ũ/(D·T)   {}{which}", configurational_line(c));
    }
    let _ = writeln!(out, "ensemble     {}", metric_line(&r.ensemble));
    let _ = writeln!(out, "last sample  {}", metric_line(&r.last_sample));
    if let Some(f) = &r.first_sample {
        let _ = writeln!(out, "first sample {} ({})", f.path, mb(f.bytes));
        tensor_table(&mut out, f);
    }
    out
}
