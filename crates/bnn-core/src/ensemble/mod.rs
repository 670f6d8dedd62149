//! Bayesian model averaging over posterior samples, streamed: p(y|x) ≈ (1/K) Σ_k
//! softmax(f(x; θ_k)), accumulated one sample at a time so that no sample needs to stay in
//! memory.

use candle_core::{Device, Tensor};
use serde::{Deserialize, Serialize};

use crate::data::{Split, NUM_CLASSES};
use crate::engine::backprop::Backprop;
use crate::engine::planned::FoldTallies;
use crate::error::Result;
use crate::metrics::{self, Label, Metrics};
use crate::model::Network;
use crate::uncertainty::{self, Uncertainty};

mod task;
pub use task::{Ensemble, Prediction};

/// Examples per forward pass when predicting a whole split.
pub(crate) const EVAL_BATCH: usize = 1000;
/// The same for a CNN or a ResNet, whose im2col buffers grow with the batch (25 floats
/// per pixel of the LeNet's first convolution's output: 58 MB at 1000 MNIST images, 15 MB
/// at 256; a ResNet's activations about 1 MB per image and 144 floats per pixel of a
/// 16-channel stage's im2col).
pub(crate) const CNN_EVAL_BATCH: usize = 256;

/// Softmax outputs of `model` on every example of `split` (row-major n × classes). On
/// the CPU the forward pass is the hand-written one of the training step
/// ([`HandPass::forward`](crate::engine::backprop::HandPass::forward)); `bnn train` and `bnn eval` both come here, so they agree
/// exactly.
pub fn predict(model: &Network, split: &Split, device: &Device) -> Result<Vec<f32>> {
    let classes = model.num_classes;
    if device.is_cpu() {
        let mut out = outputs(model, split, device)?;
        for row in out.chunks_exact_mut(classes) {
            // Softmax in f32, as candle's softmax_last_dim computes it.
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            row.iter_mut().for_each(|v| *v = (*v - max).exp());
            let sum: f32 = row.iter().sum();
            row.iter_mut().for_each(|p| *p /= sum);
        }
        return Ok(out);
    }
    predict_with_candle(model, split, device)
}

/// [`predict`] by candle's forward and softmax on `device` (the path off the CPU).
pub fn predict_with_candle(model: &Network, split: &Split, device: &Device) -> Result<Vec<f32>> {
    let mut out = Vec::with_capacity(split.len() * model.num_classes);
    forward_chunks(split, eval_batch(model), |x, rows| {
        let xt = Tensor::from_slice(x, (rows, split.dim()), device)?;
        let probs = candle_nn::ops::softmax_last_dim(&model.forward(&xt)?)?;
        out.extend(probs.flatten_all()?.to_vec1::<f32>()?);
        Ok(())
    })?;
    Ok(out)
}

/// [`predict_with_candle`] of K networks stacked along a chain axis
/// ([`crate::model::stacked::Stacked`], of `like`'s architecture) at once: each chunk of
/// `split` one batched forward for every chain; chain k's probabilities in `[k]`. The
/// chunks are `eval_batch / K` examples (at least 16), so that a chunk of K chains holds
/// about what one chain's does.
pub fn predict_stacked(
    stack: &crate::model::stacked::Stacked,
    like: &Network,
    split: &Split,
    device: &Device,
) -> Result<Vec<Vec<f32>>> {
    let k = stack.chains;
    let mut out = vec![Vec::with_capacity(split.len() * like.num_classes); k];
    let chunk = (eval_batch(like) / k).max(16);
    forward_chunks(split, chunk, |x, rows| {
        let xt = Tensor::from_slice(x, (1, rows, split.dim()), device)?
            .broadcast_as((k, rows, split.dim()))?
            .contiguous()?;
        let probs = candle_nn::ops::softmax_last_dim(&stack.forward(&xt)?)?;
        for (chain, p) in out.iter_mut().zip(probs.to_vec3::<f32>()?) {
            chain.extend(p.into_iter().flatten());
        }
        Ok(())
    })?;
    Ok(out)
}

/// The network's raw outputs on every example of `split` (row-major n × outputs): the
/// logits of a classifier, the standardised mean of a regression.
pub fn outputs(model: &Network, split: &Split, device: &Device) -> Result<Vec<f32>> {
    let mut out = Vec::with_capacity(split.len() * model.num_classes);
    if device.is_cpu() {
        let mut forward = Backprop::new(model, eval_batch(model))?;
        forward_chunks(split, eval_batch(model), |x, rows| {
            out.extend_from_slice(forward.forward(model, x, rows)?);
            Ok(())
        })?;
        return Ok(out);
    }
    forward_chunks(split, eval_batch(model), |x, rows| {
        let xt = Tensor::from_slice(x, (rows, split.dim()), device)?;
        out.extend(model.forward(&xt)?.flatten_all()?.to_vec1::<f32>()?);
        Ok(())
    })?;
    Ok(out)
}

fn eval_batch(model: &Network) -> usize {
    if model.convs.is_empty() && model.resnet.is_none() {
        EVAL_BATCH
    } else {
        CNN_EVAL_BATCH
    }
}

/// Calls `f` with each chunk of `rows` of `split`'s inputs in order (row-major) and its row
/// count.
fn forward_chunks(
    split: &Split,
    rows: usize,
    mut f: impl FnMut(&[f32], usize) -> Result<()>,
) -> Result<()> {
    let (mut x, mut y) = (Vec::new(), Vec::new());
    let indices: Vec<usize> = (0..split.len()).collect();
    for chunk in indices.chunks(rows) {
        split.gather(chunk, &mut x, &mut y);
        f(&x, chunk.len())?;
    }
    Ok(())
}

/// −log p(y | x, θ) of `model` on the examples `idx` of `split`, each alone, in f64 (the
/// labels from `labels` where given): what an exchange of replicas compares.
pub fn example_nll(
    model: &Network,
    split: &Split,
    labels: Option<&[u8]>,
    idx: &[usize],
    device: &Device,
) -> Result<Vec<f64>> {
    let mut out = Vec::with_capacity(idx.len());
    forward_rows(model, split, idx, device, |chunk, logits, y| {
        for ((row, &label), &i) in logits.chunks_exact(model.num_classes).zip(y).zip(chunk) {
            let label = labels.map_or(label, |l| l[i] as u32);
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
            let sum: f64 = row.iter().map(|&v| (v as f64 - max).exp()).sum();
            out.push(max + sum.ln() - row[label as usize] as f64);
        }
    })?;
    Ok(out)
}

/// −log N(yᵢ | f(xᵢ), 1/τ) = ½τ(f(xᵢ) − yᵢ)² − ½ ln τ + ½ ln 2π of a regression `model` on
/// the examples `idx` of `split` (standardised units), each alone, in f64: the
/// regression's [`example_nll`], for an exchange of replicas.
pub fn example_gaussian_nll(
    model: &Network,
    split: &Split,
    idx: &[usize],
    tau: f64,
    device: &Device,
) -> Result<Vec<f64>> {
    let constant = crate::likelihood::HALF_LOG_2PI - 0.5 * tau.ln();
    let mut out = Vec::with_capacity(idx.len());
    forward_rows(model, split, idx, device, |chunk, outputs, _| {
        for (&f, &i) in outputs.iter().zip(chunk) {
            let r = f as f64 - split.values[i] as f64;
            out.push(0.5 * tau * r * r + constant);
        }
    })?;
    Ok(out)
}

/// The outputs of `model` on the examples `idx` of `split`, chunk by chunk: `f(chunk,
/// outputs row-major, the chunk's labels)`.
fn forward_rows(
    model: &Network,
    split: &Split,
    idx: &[usize],
    device: &Device,
    mut f: impl FnMut(&[usize], &[f32], &[u32]),
) -> Result<()> {
    let (mut x, mut y) = (Vec::new(), Vec::new());
    let batch = CNN_EVAL_BATCH;
    let mut forward = if device.is_cpu() {
        Some(Backprop::new(model, batch)?)
    } else {
        None
    };
    for chunk in idx.chunks(batch) {
        split.gather(chunk, &mut x, &mut y);
        match forward.as_mut() {
            Some(fw) => f(chunk, fw.forward(model, &x, chunk.len())?, &y),
            None => {
                let xt = Tensor::from_slice(&x, (chunk.len(), split.dim()), device)?;
                f(
                    chunk,
                    &model.forward(&xt)?.flatten_all()?.to_vec1::<f32>()?,
                    &y,
                );
            }
        }
    }
    Ok(())
}

/// Running sums of predictive probabilities over posterior samples: the Bayesian model
/// average p̄(y|x) = (1/K) Σ_k p(y|x, θ_k), streamed, for any model with any number of
/// classes (feed it each sample's softmax, row-major examples × classes).
#[derive(Debug, Clone)]
pub struct Accumulator {
    labels: Vec<u32>,
    classes: usize,
    sum: Vec<f64>,
    /// Per example, Σ_k H[p_k(x)]: the samples' entropies, for the mutual information.
    entropy_sum: Vec<f64>,
    samples: usize,
    /// Metrics of the running ensemble after each sample (1, 2, ..., K samples).
    pub history: Vec<Metrics>,
    /// Metrics of the last sample alone.
    pub last_sample: Option<Metrics>,
    /// The test NLL of each sample alone, in order (the chains' convergence diagnostics).
    sample_nll: Vec<f64>,
    /// Samples were folded in elsewhere ([`Accumulator::add_folded`]) since the sums here
    /// were last set: until [`Accumulator::set_sums`], nothing is computed from them.
    sums_behind: bool,
}

/// One sample folded into an ensemble whose sums live elsewhere (the step plan's, on its
/// executor), computed there with this module's arithmetic: the sample's own metrics and
/// the ensemble's after it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Folded {
    /// The sample alone.
    pub alone: Metrics,
    /// The ensemble with it.
    pub ensemble: Metrics,
    /// Rows whose probabilities were not all finite (a diverged sample).
    pub non_finite_rows: usize,
}

// The step plan's tallies are `metrics::Tally`'s values.
const _: () = assert!(crate::kernels::plan::TALLY == 4 + 3 * metrics::ECE_BINS);

impl Folded {
    /// The sample and its ensemble as the step plan's tallies give them.
    pub fn of_tallies(t: &FoldTallies) -> Self {
        let (alone, non_finite_rows) = metrics::Tally::from_values(&t.alone);
        let (ensemble, _) = metrics::Tally::from_values(&t.ensemble);
        Folded {
            alone: alone.metrics(t.rows),
            ensemble: ensemble.metrics(t.rows),
            non_finite_rows,
        }
    }
}

/// What an [`Accumulator`] holds besides its sums, as plain data (a run's saved state).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AccumulatorState {
    /// Samples averaged so far.
    pub samples: usize,
    /// The ensemble's metrics after each sample.
    pub history: Vec<Metrics>,
    /// The last sample's own metrics.
    pub last_sample: Option<Metrics>,
    /// Each sample's own NLL, in order.
    #[serde(default)]
    pub sample_nll: Vec<f64>,
}

/// An [`Accumulator`]'s running sums, saved with a run's state: Σ_k p_k(x) (n × classes)
/// and Σ_k H[p_k(x)] (n).
#[derive(Debug, Clone, PartialEq)]
pub struct Sums {
    /// Σₖ pₖ per example and class (f64).
    pub probability: Vec<f64>,
    /// Σₖ H(pₖ) per example (entropy of each sample's prediction).
    pub entropy: Vec<f64>,
}

/// The ensemble after k samples, for `bnn eval`'s accuracy-versus-samples curve.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EnsembleAfter {
    /// Samples averaged.
    pub samples: usize,
    /// Accuracy of the ensemble.
    pub accuracy: f64,
    /// Mean negative log-likelihood of the ensemble.
    pub nll: f64,
}

/// How far a row's sum may be from 1: an f32 softmax over c classes rounds each of its c
/// terms by at most 2⁻²⁴ relative, so even 10⁵ classes stay far inside 10⁻³, while logits
/// (or unnormalised scores) miss by far more.
const SIMPLEX_TOLERANCE: f64 = 1e-3;

/// Refuses `probs` (rows of `classes`) unless every row is a probability vector: entries
/// in [0, 1] and a sum within [`SIMPLEX_TOLERANCE`] of 1.
fn check_simplex(probs: &[f32], classes: usize) -> Result<()> {
    for (i, row) in probs.chunks_exact(classes).enumerate() {
        let sum: f64 = row.iter().map(|&p| p as f64).sum();
        let outside = row.iter().find(|&&p| !(0.0..=1.0).contains(&p));
        if outside.is_some() || (sum - 1.0).abs() > SIMPLEX_TOLERANCE {
            let what = match outside {
                Some(p) => format!("holds {p}"),
                None => format!("sums to {sum:.4}"),
            };
            return Err(crate::error::Error::Config(format!(
                "row {i} of the prediction {what}: the ensemble takes probabilities, each row \
                 on the simplex (softmax of the logits, not the logits)"
            )));
        }
    }
    Ok(())
}

/// Labels of any unsigned type as the u32 class indices an accumulator keeps (its
/// constructors have checked them against the class count, at most 2³²).
fn class_indices<L: Label>(labels: &[L]) -> Vec<u32> {
    labels.iter().map(|&y| y.class() as u32).collect()
}

impl Accumulator {
    /// An accumulator for the ten classes of the image data sets.
    pub fn new(labels: &[u8]) -> Self {
        Self::empty(labels, NUM_CLASSES)
    }

    /// The labels it scores against.
    pub fn labels(&self) -> &[u32] {
        &self.labels
    }

    /// An accumulator for `classes` classes (at least 2, at most 2³²; every label below
    /// it), with labels of any unsigned type.
    pub fn with_classes<L: Label>(labels: &[L], classes: usize) -> Result<Self> {
        if classes < 2 {
            return Err(crate::error::Error::Config(format!(
                "an ensemble needs at least 2 classes, got {classes}"
            )));
        }
        if classes > u32::MAX as usize {
            return Err(crate::error::Error::Config(format!(
                "an ensemble takes at most 2^32 classes, got {classes}"
            )));
        }
        if let Some(&y) = labels.iter().find(|&&y| y.class() >= classes) {
            return Err(crate::error::Error::Config(format!(
                "label {y} is not one of {classes} classes"
            )));
        }
        Ok(Self::empty(labels, classes))
    }

    fn empty<L: Label>(labels: &[L], classes: usize) -> Self {
        Accumulator {
            labels: class_indices(labels),
            classes,
            sum: vec![0.0; labels.len() * classes],
            entropy_sum: vec![0.0; labels.len()],
            samples: 0,
            history: Vec::new(),
            last_sample: None,
            sample_nll: Vec::new(),
            sums_behind: false,
        }
    }

    /// The number of classes.
    pub fn classes(&self) -> usize {
        self.classes
    }

    /// Folds in the predictive probabilities of one sample (examples × classes, each row
    /// summing to 1); a prediction of another size, or rows that are not probabilities
    /// (logits, say), are refused.
    pub fn add(&mut self, probs: &[f32]) -> Result<()> {
        if probs.len() != self.sum.len() {
            return Err(crate::error::Error::Config(format!(
                "a prediction of {} values for {} examples of {} classes",
                probs.len(),
                self.labels.len(),
                self.classes
            )));
        }
        check_simplex(probs, self.classes)?;
        for (s, &p) in self.sum.iter_mut().zip(probs) {
            *s += p as f64;
        }
        for (h, row) in self
            .entropy_sum
            .iter_mut()
            .zip(probs.chunks_exact(self.classes))
        {
            *h += uncertainty::entropy_f32(row);
        }
        self.samples += 1;
        let single: Vec<f64> = probs.iter().map(|&p| p as f64).collect();
        let alone = metrics::evaluate(&single, &self.labels, self.classes);
        self.sample_nll.push(alone.nll);
        self.last_sample = Some(alone);
        let m = metrics::evaluate(&self.mean_now(), &self.labels, self.classes);
        self.history.push(m);
        Ok(())
    }

    /// Counts one sample whose probabilities were folded into this ensemble's sums where
    /// they live ([`Folded`]): its metrics alone and the ensemble's join the history as
    /// [`Accumulator::add`] would have computed them; the sums here stand still until
    /// [`Accumulator::set_sums`] brings them (a checkpoint, the end).
    pub fn add_folded(&mut self, f: &Folded) {
        self.samples += 1;
        self.sample_nll.push(f.alone.nll);
        self.last_sample = Some(f.alone);
        self.history.push(f.ensemble);
        self.sums_behind = true;
    }

    /// The running sums as they stand where the samples were folded (of the sizes this
    /// accumulator's examples and classes give).
    pub fn set_sums(&mut self, sums: Sums) -> Result<()> {
        if sums.probability.len() != self.sum.len() || sums.entropy.len() != self.entropy_sum.len()
        {
            return Err(crate::error::Error::Config(format!(
                "ensemble sums of {} + {} values for {} examples of {} classes",
                sums.probability.len(),
                sums.entropy.len(),
                self.labels.len(),
                self.classes
            )));
        }
        self.sum = sums.probability;
        self.entropy_sum = sums.entropy;
        self.sums_behind = false;
        Ok(())
    }

    /// Samples were folded in elsewhere since the sums were last set.
    pub fn sums_behind(&self) -> bool {
        self.sums_behind
    }

    fn mean_now(&self) -> Vec<f64> {
        let k = self.samples as f64;
        self.sum.iter().map(|s| s / k).collect()
    }

    /// The running sums and the rest of the state, to save (the sums as they stand here:
    /// an owner that folds elsewhere sets them first, [`Accumulator::sums_behind`]).
    pub fn state(&self) -> (AccumulatorState, Sums) {
        (
            AccumulatorState {
                samples: self.samples,
                history: self.history.clone(),
                last_sample: self.last_sample,
                sample_nll: self.sample_nll.clone(),
            },
            Sums {
                probability: self.sum.clone(),
                entropy: self.entropy_sum.clone(),
            },
        )
    }

    /// An accumulator for `labels` continuing from a saved state.
    /// The number of classes is the saved sums' per example.
    pub fn restore<L: Label>(labels: &[L], state: AccumulatorState, sums: Sums) -> Result<Self> {
        let classes = match labels.len() {
            0 => NUM_CLASSES,
            n => sums.probability.len() / n,
        };
        if classes < 2
            || sums.probability.len() != labels.len() * classes
            || sums.entropy.len() != labels.len()
            || labels.iter().any(|&y| y.class() >= classes)
        {
            return Err(crate::error::Error::Checkpoint(format!(
                "the saved ensemble has {} + {} sums, which do not fit {} examples",
                sums.probability.len(),
                sums.entropy.len(),
                labels.len()
            )));
        }
        Ok(Accumulator {
            labels: class_indices(labels),
            classes,
            sum: sums.probability,
            entropy_sum: sums.entropy,
            samples: state.samples,
            history: state.history,
            last_sample: state.last_sample,
            sample_nll: state.sample_nll,
            sums_behind: false,
        })
    }

    /// The NLL of each sample alone, in the order added.
    pub fn sample_nll(&self) -> &[f64] {
        &self.sample_nll
    }

    /// The ensemble of several chains' samples: their sums added in the order given (so
    /// that `bnn eval`, pooling the same way, gets the same bits). Its history is the
    /// first part's; its last sample, the last part's.
    pub fn pooled<'a>(parts: impl IntoIterator<Item = &'a Accumulator>) -> Result<Accumulator> {
        let mut parts = parts.into_iter();
        let Some(first) = parts.next() else {
            return Err(crate::error::Error::Config("no chains to pool".into()));
        };
        let mut pooled = first.clone();
        let behind = || {
            crate::error::Error::Config(
                "pooling an ensemble whose sums were not brought back from where they were folded"
                    .into(),
            )
        };
        if first.sums_behind {
            return Err(behind());
        }
        for p in parts {
            if p.sums_behind {
                return Err(behind());
            }
            if p.sum.len() != pooled.sum.len() || p.classes != pooled.classes {
                return Err(crate::error::Error::Config(
                    "chains evaluated on different sets".into(),
                ));
            }
            for (s, &x) in pooled.sum.iter_mut().zip(&p.sum) {
                *s += x;
            }
            for (s, &x) in pooled.entropy_sum.iter_mut().zip(&p.entropy_sum) {
                *s += x;
            }
            pooled.samples += p.samples;
            pooled.sample_nll.extend(&p.sample_nll);
            if p.samples > 0 {
                pooled.last_sample = p.last_sample;
            }
        }
        Ok(pooled)
    }

    /// Samples added so far.
    pub fn samples(&self) -> usize {
        self.samples
    }

    /// Metrics of the averaged prediction; `None` before the first sample.
    pub fn metrics(&self) -> Option<Metrics> {
        if self.samples == 0 {
            return None;
        }
        if self.sums_behind {
            // The last sample's fold computed exactly this where the sums live.
            return self.history.last().copied();
        }
        Some(metrics::evaluate(
            &self.mean_now(),
            &self.labels,
            self.classes,
        ))
    }

    /// The averaged prediction, row-major n × classes; `None` before the first sample
    /// (and while the sums are behind: [`Accumulator::sums_behind`]).
    pub fn mean(&self) -> Option<Vec<f64>> {
        (self.samples > 0 && !self.sums_behind).then(|| self.mean_now())
    }

    /// Entropies, mutual information, per-class accuracy and accuracy-vs-coverage of the
    /// averaged prediction; `None` before the first sample.
    pub fn uncertainty(&self) -> Option<Uncertainty> {
        let mean = self.mean()?;
        let k = self.samples as f64;
        let expected: Vec<f64> = self.entropy_sum.iter().map(|h| h / k).collect();
        Some(uncertainty::evaluate(
            &mean,
            &expected,
            &self.labels,
            self.classes,
        ))
    }

    /// Per example, (predictive entropy, mutual information) of the averaged prediction:
    /// the ensemble's scores for telling out-of-distribution inputs apart.
    pub fn example_scores(&self) -> Option<(Vec<f64>, Vec<f64>)> {
        let mean = self.mean()?;
        let k = self.samples as f64;
        let predictive: Vec<f64> = mean
            .chunks_exact(self.classes)
            .map(uncertainty::entropy)
            .collect();
        let mi = predictive
            .iter()
            .zip(&self.entropy_sum)
            .map(|(h, s)| h - s / k)
            .collect();
        Some((predictive, mi))
    }

    /// The accuracy and NLL of the ensemble after each number of samples.
    pub fn progress(&self) -> Vec<EnsembleAfter> {
        self.history
            .iter()
            .enumerate()
            .map(|(i, m)| EnsembleAfter {
                samples: i + 1,
                accuracy: m.accuracy,
                nll: m.nll,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Samples folded elsewhere: the history grows as `add`'s would, nothing is computed
    /// from the stale sums (no mean, no pooling) until they are set, and then the
    /// accumulator is `add`'s.
    #[test]
    fn folded_samples_wait_for_their_sums() {
        let labels = [0u8, 1, 1];
        let samples = [
            vec![0.7f32, 0.3, 0.4, 0.6, 0.2, 0.8],
            vec![0.5f32, 0.5, 0.1, 0.9, 0.6, 0.4],
        ];
        let mut added = Accumulator::with_classes(&labels, 2).unwrap();
        let mut folded = added.clone();
        for p in &samples {
            added.add(p).unwrap();
            folded.add_folded(&Folded {
                alone: added.last_sample.unwrap(),
                ensemble: *added.history.last().unwrap(),
                non_finite_rows: 0,
            });
            assert!(folded.sums_behind());
            assert_eq!(folded.metrics(), added.metrics());
            assert!(folded.mean().is_none() && folded.uncertainty().is_none());
            assert!(Accumulator::pooled([&folded, &added]).is_err());
        }
        let wrong = Sums {
            probability: vec![0.0; 4],
            entropy: vec![0.0; 3],
        };
        assert!(folded.set_sums(wrong).is_err());
        folded.set_sums(added.state().1).unwrap();
        assert!(!folded.sums_behind());
        assert_eq!(folded.mean(), added.mean());
        assert_eq!(folded.sample_nll(), added.sample_nll());
        assert!(Accumulator::pooled([&folded, &added]).is_ok());
    }

    /// The average of two samples' predictions, element by element, in f64.
    fn average(p1: &[f32], p2: &[f32]) -> Vec<f64> {
        p1.iter()
            .zip(p2)
            .map(|(&x, &y)| (x as f64 + y as f64) / 2.0)
            .collect()
    }

    #[test]
    fn any_number_of_classes_and_a_wrong_size_refused() {
        let labels = [2u8, 0];
        let mut a = Accumulator::with_classes(&labels, 3).unwrap();
        let p1 = [0.1f32, 0.2, 0.7, 0.6, 0.3, 0.1];
        let p2 = [0.3f32, 0.3, 0.4, 0.2, 0.2, 0.6];
        a.add(&p1).unwrap();
        a.add(&p2).unwrap();
        let mean = average(&p1, &p2);
        let m = a.metrics().unwrap();
        assert_eq!(m.nll, metrics::evaluate(&mean, &labels, 3).nll);
        // Averaged: row 0 (0.2, 0.25, 0.55) → 2; row 1 (0.4, 0.25, 0.35) → 0, though the
        // second sample alone says 2.
        assert_eq!(m.accuracy, 1.0);
        assert_eq!(a.last_sample.unwrap().accuracy, 0.5);
        assert!(a.add(&p1[..5]).is_err());
        assert!(
            Accumulator::with_classes(&labels, 2).is_err(),
            "label 2 of 2 classes"
        );
        assert!(Accumulator::with_classes(&labels, 1).is_err());
        let (state, sums) = a.state();
        assert_eq!(
            Accumulator::restore(&labels, state, sums)
                .unwrap()
                .classes(),
            3
        );
    }

    #[test]
    fn accumulator_equals_direct_average() {
        let labels = [3u8, 7];
        let mut a = Accumulator::new(&labels);
        let mut p1 = vec![0.0f32; 20];
        let mut p2 = vec![0.0f32; 20];
        p1[3] = 0.6;
        p1[4] = 0.4;
        p1[10 + 7] = 0.2;
        p1[10 + 1] = 0.8;
        p2[3] = 0.2;
        p2[5] = 0.8;
        p2[10 + 7] = 1.0;
        a.add(&p1).unwrap();
        a.add(&p2).unwrap();
        let mean = average(&p1, &p2);
        let direct = metrics::evaluate(&mean, &labels, NUM_CLASSES);
        assert_eq!(a.metrics().unwrap(), direct);
        // Mean: example 0 → class 3 (0.4 plus f32 rounding) over class 5 (0.4); example 1 → 7.
        assert_eq!(direct.accuracy, 1.0);
        assert!((direct.nll - -(0.4f64.ln() + 0.6f64.ln()) / 2.0).abs() < 1e-6);
        assert_eq!(a.history.len(), 2);
        assert_eq!(a.last_sample.unwrap().accuracy, 0.5); // p2 alone: class 5 for example 0
        assert_eq!(a.history[0].accuracy, 0.5);
    }

    /// Each example's −log p(y|x, θ) from the hand-written forward (CPU) averages to the
    /// minibatch NLL of candle's cross-entropy on the same examples, and a relabelled
    /// example is scored against its new label.
    #[test]
    fn example_gaussian_nll_is_the_gaussian_density_row_by_row() {
        // 7 rows of 3 features, targets chosen apart from the untrained net's outputs.
        let features: Vec<f32> = (0..21).map(|i| (i as f32 * 0.37).sin()).collect();
        let values: Vec<f32> = (0..7).map(|i| i as f32 * 0.5 - 1.0).collect();
        let split = Split::of_table(features, 3, vec![0; 7], values.clone());
        let spec = crate::model::ModelSpec::default();
        let model = Network::new(&spec, 3, 1, 5, &Device::Cpu).unwrap();
        let f = outputs(&model, &split, &Device::Cpu).unwrap();
        let (tau, idx) = (2.5, [6, 0, 3]);
        let nll = example_gaussian_nll(&model, &split, &idx, tau, &Device::Cpu).unwrap();
        for (&i, got) in idx.iter().zip(&nll) {
            let r = f[i] as f64 - values[i] as f64;
            // −ln of the normal density with variance 1/τ, written out.
            let want = -((tau / std::f64::consts::TAU).sqrt() * (-0.5 * tau * r * r).exp()).ln();
            assert!((got - want).abs() < 1e-12, "row {i}: {got} vs {want}");
        }
    }

    #[test]
    fn example_nll_agrees_with_the_minibatch_loss() {
        let ds = crate::data::load_builtin().unwrap();
        let model = Network::new(
            &crate::model::ModelSpec::default(),
            784,
            10,
            3,
            &Device::Cpu,
        )
        .unwrap();
        let idx: Vec<usize> = (0..300).map(|i| i * 7).collect();
        let nll = example_nll(&model, &ds.train, None, &idx, &Device::Cpu).unwrap();
        let (mut x, mut y) = (Vec::new(), Vec::new());
        ds.train.gather(&idx, &mut x, &mut y);
        let xt = Tensor::from_slice(&x, (idx.len(), 784), &Device::Cpu).unwrap();
        let yt = Tensor::from_slice(&y, idx.len(), &Device::Cpu).unwrap();
        let logits = model.forward(&xt).unwrap();
        let reference = candle_nn::loss::cross_entropy(&logits, &yt)
            .unwrap()
            .to_scalar::<f32>()
            .unwrap() as f64;
        let mean = nll.iter().sum::<f64>() / nll.len() as f64;
        assert!((mean - reference).abs() < 1e-5, "{mean} vs {reference}");
        let mut labels = ds.train.labels.clone();
        labels[idx[0]] = (labels[idx[0]] + 1) % 10;
        let relabelled = example_nll(&model, &ds.train, Some(&labels), &idx, &Device::Cpu).unwrap();
        assert_ne!(relabelled[0], nll[0]);
        assert_eq!(relabelled[1..], nll[1..]);
    }
}
