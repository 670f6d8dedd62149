//! The configurational temperature of a chain: the mean of θ·∇Ũ(θ)/(D·T) over its updates,
//! per parameter tensor and overall, from the virial Σθ·∇ each update's pass already sums
//! ([`crate::sampler::Sampler::virials`]; no pass of its own).
//!
//! Why: by integration by parts E_π[θᵢ ∂ᵢU(θ)] = T for every coordinate of any posterior
//! π ∝ e^{−U/T} whose density vanishes at infinity, so the mean is 1 for a correct
//! sampler. The kinetic energy checks the momenta only: a thermostat holds it at ½ while
//! the positions run too narrow (measured on diabetes' exact posterior at 16× the default
//! step: kinetic energy in band, variance ratios 0.35–0.83, this temperature 0.83), and
//! SGLD has no momentum to check at all.
//!
//! Which updates count: only each epoch's first. The sampler's gradient is a minibatch
//! estimate ∇̃, and θ·∇̃ is an unbiased estimate of θ·∇ only where the minibatch is
//! independent of θ: the epoch's first minibatch comes from a fresh permutation; its later
//! ones come from what the earlier ones left, which θ has followed, and that biases θ·∇̃
//! upward (measured on diabetes at 16× the step: SGNHT read 1.01 with every update
//! counted, 0.76 with the epochs' first, its samples 0.73). The epoch's first update sees θ where the
//! previous epoch left it, which is where `bnn train` keeps its samples.
//!
//! It is a check of the average: a Gaussian posterior's θ·∇U/D is the mean over its
//! eigen-directions of each direction's variance ratio, so directions too hot and too cold
//! can cancel (docs/guide.md, "Choosing a sampler").
//!
//! State: the sums since the last record of `diagnostics.jsonl` and since burn-in, and
//! the records' interval means since burn-in for the standard errors ([`BatchMeans`]);
//! saved with the run so that a resumed run writes the same lines.

use serde::{Deserialize, Serialize};

/// A burn-in block whose mean is known to this standard error is judged in band and
/// closed (`--adapt-step-size`): four of them are the band's half-width.
pub const SETTLED_ERROR: f64 = 0.025;
/// The band outside which the temperature since burn-in warns.
pub const CONFIGURATIONAL_BAND: (f64, f64) = (0.9, 1.1);
/// It warns only this many standard errors from 1 too (the standard error of the mean
/// since burn-in from the records' interval means, see [`ConfigurationalSums`]).
pub const CONFIGURATIONAL_SIGMAS: f64 = 4.0;
/// Records since burn-in before it is judged: an error estimated from fewer is itself
/// too uncertain.
pub const CONFIGURATIONAL_MIN_RECORDS: usize = 10;

/// The temperature of one parameter tensor in a record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TensorConfigurational {
    /// The tensor's name.
    pub tensor: String,
    /// Its elements.
    pub elements: usize,
    /// θ·∇Ũ/(n·T) averaged over the record's interval.
    pub temperature: f64,
    /// Averaged over the updates since burn-in (absent during burn-in).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since_burnin: Option<f64>,
    /// Its standard error (as [`Configurational::standard_error`]): a small tensor's
    /// figure is noisy (its few elements' θ·∇̃ carry the minibatch noise undiluted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub standard_error: Option<f64>,
}

/// The configurational temperature in a line of `diagnostics.jsonl`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Configurational {
    /// Updates counted since the previous record (each epoch's first: the interval the
    /// means below cover).
    pub updates: u64,
    /// θ·∇Ũ/(D·T) over all D parameters, averaged over the interval.
    pub temperature: f64,
    /// Averaged over the updates since burn-in (absent during burn-in).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since_burnin: Option<f64>,
    /// Its standard error from the records' interval means since burn-in ([`BatchMeans`];
    /// absent with fewer than three records).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub standard_error: Option<f64>,
    /// Per parameter tensor.
    pub per_tensor: Vec<TensorConfigurational>,
}

/// A series of interval means (one per record since burn-in) and the standard error of
/// their mean, treating them as an AR(1) series: s²/n times (1 + ρ)/(1 − ρ), ρ their
/// lag-1 autocorrelation. Why not plain batch means: an interval shorter than the chain's
/// relaxation time leaves consecutive means correlated, and their spread alone then
/// understates the error (SGLD on diabetes, 2,000-update records against a relaxation of
/// 4,400 updates, warned on a run that ended at 1.02).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct BatchMeans {
    /// How many.
    pub count: usize,
    /// Their Σ.
    pub sum: f64,
    /// Σ of their squares.
    pub sq: f64,
    /// Σ of the products of consecutive ones.
    pub lag: f64,
    /// The first.
    pub first: f64,
    /// The last.
    pub last: f64,
}

impl BatchMeans {
    /// Adds the next interval mean.
    pub fn push(&mut self, x: f64) {
        match self.count {
            0 => self.first = x,
            _ => self.lag += self.last * x,
        }
        self.count += 1;
        self.sum += x;
        self.sq += x * x;
        self.last = x;
    }

    /// The standard error of their mean (ρ clamped to [0, 0.95]); from three on.
    pub fn standard_error(&self) -> Option<f64> {
        let b = self.count as f64;
        (self.count >= 3).then(|| {
            let mean = self.sum / b;
            let var = ((self.sq - b * mean * mean) / (b - 1.0)).max(0.0);
            // Σ (x_i − m)(x_{i−1} − m) over the b − 1 pairs, from the raw sums: the pairs'
            // later terms sum to S − x₁, their earlier ones to S − x_b.
            let pairs = 2.0 * self.sum - self.first - self.last;
            let lag = self.lag - mean * pairs + (b - 1.0) * mean * mean;
            let rho = match var > 0.0 {
                true => (lag / ((b - 1.0) * var)).clamp(0.0, 0.95),
                false => 0.0,
            };
            (var / b * (1.0 + rho) / (1.0 - rho)).sqrt()
        })
    }
}

/// The running sums (see the module doc), plain data saved in the run state.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ConfigurationalSums {
    /// Σθ·∇ per tensor since the last record.
    pub interval: Vec<f64>,
    /// Updates in `interval`.
    pub interval_updates: u64,
    /// Σθ·∇ per tensor since burn-in.
    pub since: Vec<f64>,
    /// Updates in `since`.
    pub since_updates: u64,
    /// The records' interval means since burn-in, overall.
    pub batches: BatchMeans,
    /// The same per tensor.
    pub tensor_batches: Vec<BatchMeans>,
    /// During burn-in: the current block of interval means (`--adapt-step-size`).
    #[serde(default)]
    pub burnin_block: BatchMeans,
    /// Burn-in blocks closed since the start or the step size last changed (the first is
    /// skipped).
    #[serde(default)]
    pub burnin_blocks: usize,
    /// The warning was given.
    pub warned: bool,
}

impl ConfigurationalSums {
    /// Adds one update's per-tensor virials (none: a sampler without them; nothing
    /// changes); `sampling`: the update is past burn-in.
    pub fn add(&mut self, virials: &[f64], sampling: bool) {
        if virials.is_empty() {
            return;
        }
        add_into(&mut self.interval, virials);
        self.interval_updates += 1;
        if sampling {
            add_into(&mut self.since, virials);
            self.since_updates += 1;
        }
    }

    /// The record of the interval since the last one, for tensors `tensors` (name and
    /// elements, in order); starts the next interval. `None` when no update in it had
    /// virials. (The sampler's gradient is already that of Ũ/T, so the means need no T.)
    pub fn take_record(&mut self, tensors: &[(String, usize)]) -> Option<Configurational> {
        if self.interval_updates == 0 || self.interval.len() != tensors.len() {
            return None;
        }
        let per =
            |sums: &[f64], updates: u64, i: usize| sums[i] / (tensors[i].1 as f64 * updates as f64);
        let d: usize = tensors.iter().map(|t| t.1).sum();
        let overall =
            |sums: &[f64], updates: u64| sums.iter().sum::<f64>() / (d as f64 * updates as f64);
        let interval = overall(&self.interval, self.interval_updates);
        let sampling = self.since_updates > 0 && self.since.len() == tensors.len();
        if !sampling {
            self.burnin_block.push(interval);
        }
        if sampling {
            self.batches.push(interval);
            self.tensor_batches
                .resize(tensors.len(), BatchMeans::default());
            for (i, b) in self.tensor_batches.iter_mut().enumerate() {
                b.push(per(&self.interval, self.interval_updates, i));
            }
        }
        let record = Configurational {
            updates: self.interval_updates,
            temperature: interval,
            since_burnin: sampling.then(|| overall(&self.since, self.since_updates)),
            standard_error: self.batches.standard_error(),
            per_tensor: tensors
                .iter()
                .enumerate()
                .map(|(i, (name, elements))| TensorConfigurational {
                    tensor: name.clone(),
                    elements: *elements,
                    temperature: per(&self.interval, self.interval_updates, i),
                    since_burnin: sampling.then(|| per(&self.since, self.since_updates, i)),
                    standard_error: self
                        .tensor_batches
                        .get(i)
                        .and_then(BatchMeans::standard_error),
                })
                .collect(),
        };
        self.interval.iter_mut().for_each(|v| *v = 0.0);
        self.interval_updates = 0;
        Some(record)
    }

    /// During burn-in with `--adapt-step-size`, after each record: the mean and standard
    /// error of the current block of records when it is out of [`CONFIGURATIONAL_BAND`]
    /// beyond [`CONFIGURATIONAL_SIGMAS`] standard errors (the step should be halved). A
    /// block is judged from [`CONFIGURATIONAL_MIN_RECORDS`] records on, and grows until
    /// it is out of band or known to within [`SETTLED_ERROR`] (then a new one starts): a
    /// sequential test, so that a step slightly too large is caught once enough records
    /// show it. The first block after the start or a halving is not judged: the chain is
    /// still settling from where it started or from the old step.
    pub fn burnin_verdict(&mut self) -> Option<(f64, f64)> {
        let block = &self.burnin_block;
        if block.count < CONFIGURATIONAL_MIN_RECORDS {
            return None;
        }
        let (t, se) = (block.sum / block.count as f64, block.standard_error()?);
        if self.burnin_blocks == 0 {
            self.burnin_block = BatchMeans::default();
            self.burnin_blocks = 1;
            return None;
        }
        let (lo, hi) = CONFIGURATIONAL_BAND;
        if !(lo..=hi).contains(&t) && (t - 1.0).abs() > CONFIGURATIONAL_SIGMAS * se {
            self.burnin_block = BatchMeans::default();
            self.burnin_blocks = 0;
            return Some((t, se));
        }
        if se <= SETTLED_ERROR {
            self.burnin_block = BatchMeans::default();
            self.burnin_blocks += 1;
        }
        None
    }

    /// The warning `record` calls for, once per chain: its temperature since burn-in
    /// outside [`CONFIGURATIONAL_BAND`] beyond [`CONFIGURATIONAL_SIGMAS`] standard errors,
    /// from [`CONFIGURATIONAL_MIN_RECORDS`] records on. `label` says which chain.
    pub fn warning(&mut self, record: &Configurational, label: &str) -> Option<String> {
        let (Some(t), Some(se)) = (record.since_burnin, record.standard_error) else {
            return None;
        };
        let (lo, hi) = CONFIGURATIONAL_BAND;
        if self.warned
            || self.batches.count < CONFIGURATIONAL_MIN_RECORDS
            || (lo..=hi).contains(&t)
            || (t - 1.0).abs() <= CONFIGURATIONAL_SIGMAS * se
        {
            return None;
        }
        self.warned = true;
        let how = if t > 1.0 {
            "too wide: the step's discretisation or the gradient noise heats the positions"
        } else {
            "too narrow: the thermostat cools the positions to absorb the gradient noise"
        };
        Some(format!(
            "{label}configurational temperature θ·∇Ũ/(D·T) = {t:.3} ± {se:.3} since burn-in, outside [{lo}, {hi}] (1 for a correct sampler, whatever the kinetic energy says): the positions are sampled {how}; a smaller step size (a quarter, or --adapt-step-size) should bring it back"
        ))
    }
}

fn add_into(sums: &mut Vec<f64>, values: &[f64]) {
    if sums.len() != values.len() {
        sums.clear();
        sums.resize(values.len(), 0.0);
    }
    for (s, v) in sums.iter_mut().zip(values) {
        *s += v;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tensors() -> Vec<(String, usize)> {
        vec![("w".into(), 3), ("b".into(), 1)]
    }

    #[test]
    fn records_average_the_interval_and_the_run_since_burn_in() {
        let mut s = ConfigurationalSums::default();
        // Burn-in: θ·∇ = (3, 1) per update, D = 4: temperature 1.
        s.add(&[3.0, 1.0], false);
        s.add(&[3.0, 1.0], false);
        let r = s.take_record(&tensors()).unwrap();
        assert_eq!((r.updates, r.temperature, r.since_burnin), (2, 1.0, None));
        // Sampling: (3, 1) and (0, 0) average to (1.5, 0.5) per update: ½.
        s.add(&[3.0, 1.0], true);
        s.add(&[0.0, 0.0], true);
        let r = s.take_record(&tensors()).unwrap();
        assert_eq!(r.temperature, 0.5);
        assert_eq!(r.since_burnin, Some(0.5));
        assert_eq!(r.per_tensor[0].temperature, 0.5);
        assert_eq!(r.per_tensor[1].since_burnin, Some(0.5));
        // Nothing since: no record; a sampler without virials adds nothing.
        s.add(&[], true);
        assert!(s.take_record(&tensors()).is_none());
    }

    #[test]
    fn warns_once_out_of_band_beyond_its_error_and_not_within_it() {
        // Batches alternating 1.25 and 1.35 around 1.3: far beyond the error, warns once.
        let mut s = ConfigurationalSums::default();
        let mut warnings = 0;
        for i in 0..10 {
            let t = if i % 2 == 0 { 1.25 } else { 1.35 };
            s.add(&[3.0 * t, t], true);
            let r = s.take_record(&tensors()).unwrap();
            warnings += usize::from(s.warning(&r, "").is_some());
            if i < CONFIGURATIONAL_MIN_RECORDS - 1 {
                assert_eq!(warnings, 0, "record {i}");
            }
        }
        assert_eq!(warnings, 1);
        // Batches spread ±1 around 1.3: the error (0.33 after 10) covers the distance.
        let mut s = ConfigurationalSums::default();
        for i in 0..10 {
            let t = if i % 2 == 0 { 0.3 } else { 2.3 };
            s.add(&[3.0 * t, t], true);
            let r = s.take_record(&tensors()).unwrap();
            assert!(s.warning(&r, "").is_none(), "record {i}: {r:?}");
        }
        // A slow drift (consecutive means correlated, 1.3 → 0.9 in steps of 0.04): the
        // spread alone would call 1.1 ± 0.04 out of band; the lag correlation widens it.
        let mut s = ConfigurationalSums::default();
        for i in 0..11 {
            let t = 1.3 - 0.04 * i as f64;
            s.add(&[3.0 * t, t], true);
            let r = s.take_record(&tensors()).unwrap();
            let plain = (0.0166f64).sqrt() / (i as f64 + 1.0).sqrt();
            if let Some(se) = r.standard_error.filter(|_| i == 10) {
                assert!(se > 2.0 * plain, "{se} against {plain}");
            }
        }
        // Burn-in blocks: the first is skipped, a hot second one calls for a smaller
        // step, after which the count starts again.
        let mut s = ConfigurationalSums::default();
        let mut verdicts = Vec::new();
        for i in 0..40 {
            let t = if i % 2 == 0 { 1.28 } else { 1.32 };
            s.add(&[3.0 * t, t], false);
            s.take_record(&tensors()).unwrap();
            verdicts.push(s.burnin_verdict().is_some());
        }
        let at: Vec<usize> = (0..40).filter(|&i| verdicts[i]).collect();
        assert_eq!(at, vec![19, 39], "{verdicts:?}");
        // In band and settled: blocks close without a verdict.
        let mut s = ConfigurationalSums::default();
        for i in 0..40 {
            let t = if i % 2 == 0 { 1.01 } else { 0.99 };
            s.add(&[3.0 * t, t], false);
            s.take_record(&tensors()).unwrap();
            assert!(s.burnin_verdict().is_none());
        }
        assert!(s.burnin_blocks >= 3, "{}", s.burnin_blocks);
        // In band: never.
        let mut s = ConfigurationalSums::default();
        for _ in 0..10 {
            s.add(&[3.05, 1.05], true);
            let r = s.take_record(&tensors()).unwrap();
            assert!(s.warning(&r, "").is_none());
        }
    }
}
