//! The sampler watched during training (`--log-every N`, default once per epoch): lines of
//! `diagnostics.jsonl` with the minibatch potential energy, the kinetic energy per
//! parameter overall and per parameter tensor, the thermostat's mean and spread, and the
//! configurational temperature ([`super::configurational`]); and one warning when the
//! temperature is out of control, by either measure.
//!
//! Why per tensor: a sampler can hold the overall kinetic energy at its target while some
//! layers are far too hot and others frozen (tried here: scalar SGNHT on MNIST held 0.4–0.6
//! overall and never learnt, where mSGNHT, a thermostat per parameter, did).
//!
//! The kinetic energy per parameter, ½·pᵀp/n with p = v/√η, is ½ in equilibrium: the
//! potential is U/T and the injected noise is that of unit temperature, so a chain in
//! control holds ½ whatever T (docs/DESIGN.md, "Model and potential").

use serde::{Deserialize, Serialize};

use super::configurational::{Configurational, ConfigurationalSums};
use crate::error::Result;
use crate::sampler::{self, Sampler};

/// Where the kinetic energy per parameter sits in equilibrium.
pub const KINETIC_TARGET: f64 = 0.5;
/// The band around the target outside which an epoch's mean warns: [0.8×, 1.25×].
pub const KINETIC_BAND: (f64, f64) = (0.8, 1.25);
/// A tensor's kinetic energy warns only this many standard errors from the target too.
/// The standard error is that of its mean over the epochs since burn-in: the spread
/// ½·√(2/n) of ½·χ²ₙ/n for n independent elements (0.22 for a 10-element bias), times
/// `KINETIC_CORRELATION`, over √(epochs).
pub const KINETIC_SIGMAS: f64 = 4.0;
/// How much more a tensor's snapshots spread than n independent values would: a layer's
/// momenta share their gradient noise. Measured on the default MLP (built-in subset, seed
/// 0, epochs 11–50): 1.27× for fc2.weight (0.028 against 0.022), 1.15× for fc1.bias,
/// 0.94× for fc2.bias; 1.5 leaves a margin.
pub const KINETIC_CORRELATION: f64 = 1.5;
/// A tensor is judged from this many epochs after burn-in on, on its mean over them: one
/// snapshot is not enough (on the built-in subset fc2.weight, 1,000 values, averaged 0.549
/// and one snapshot of 0.634 warned).
pub const KINETIC_MIN_EPOCHS: usize = 3;
/// A thermostat above this multiple of its initial value for a whole epoch warns.
pub const THERMOSTAT_GROWTH: f64 = 10.0;

/// The kinetic energy per parameter of one parameter tensor.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TensorKinetic {
    /// The tensor's name.
    pub tensor: String,
    /// Its elements.
    pub elements: usize,
    /// Its kinetic energy per element.
    pub kinetic_energy: f64,
}

/// One line of `diagnostics.jsonl`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DiagnosticRecord {
    /// Updates done.
    pub step: u64,
    /// The epoch in progress (from 1).
    pub epoch: usize,
    /// Ũ(θ) = N · (mean NLL of the last minibatch) − log p(θ) (untempered).
    pub potential_energy: f64,
    /// Kinetic energy per parameter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kinetic_energy: Option<f64>,
    /// Per tensor.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kinetic_per_tensor: Vec<TensorKinetic>,
    /// SGNHT: the thermostat α (spread 0); mSGNHT: the mean and standard deviation of its
    /// per-parameter thermostats.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thermostat_mean: Option<f64>,
    /// Standard deviation of mSGNHT's ξᵢ.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thermostat_spread: Option<f64>,
    /// Replica runs: the temperature the replica held.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    /// θ·∇Ũ/(D·T) since the previous record and since burn-in, overall and per tensor
    /// (samplers with a fused or composed update; absent for SGD and momentum).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub configurational: Option<Configurational>,
}

/// What a chain needs of its model and potential to fill a record.
pub struct Inputs<'a> {
    /// The parameters' names in order.
    pub names: Vec<String>,
    /// The sampler to read.
    pub sampler: &'a dyn Sampler,
    /// −log p(θ).
    pub prior_energy: f64,
    /// N, training examples.
    pub n_data: usize,
    /// Mean NLL of the last minibatch.
    pub minibatch_nll: f64,
}

/// The record of update `step` in epoch `epoch` (0-based).
pub fn record(step: u64, epoch: usize, inputs: Inputs<'_>) -> Result<DiagnosticRecord> {
    let state = inputs.sampler.state()?;
    let kinetic_per_tensor = state
        .momentum()
        .iter()
        .zip(&inputs.names)
        .map(|(v, name)| {
            Ok(TensorKinetic {
                tensor: name.clone(),
                elements: v.elem_count(),
                kinetic_energy: sampler::kinetic_energy(
                    std::slice::from_ref(v),
                    state.clock().step_size,
                )?,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let kinetic_energy = match state.momentum().is_empty() {
        true => None,
        false => Some(sampler::kinetic_energy(
            state.momentum(),
            state.clock().step_size,
        )?),
    };
    let (thermostat_mean, thermostat_spread) = if !state.thermostats().is_empty() {
        let (mut n, mut sum, mut sq) = (0usize, 0f64, 0f64);
        for t in state.thermostats() {
            for a in t.to_vec1::<f32>()? {
                n += 1;
                sum += a as f64;
                sq += a as f64 * a as f64;
            }
        }
        let mean = sum / n.max(1) as f64;
        (
            Some(mean),
            Some((sq / n.max(1) as f64 - mean * mean).max(0.0).sqrt()),
        )
    } else {
        (state.thermostat(), state.thermostat().map(|_| 0.0))
    };
    Ok(DiagnosticRecord {
        step,
        epoch: epoch + 1,
        potential_energy: inputs.n_data as f64 * inputs.minibatch_nll + inputs.prior_energy,
        kinetic_energy,
        kinetic_per_tensor,
        thermostat_mean,
        thermostat_spread,
        temperature: None,
        configurational: None,
    })
}

/// When a record is due, and the warnings (each once per chain).
#[derive(Debug, Clone)]
pub struct Monitor {
    /// Every this many updates; 0: at each epoch's last update.
    every: u64,
    initial_thermostat: Option<f64>,
    epoch_records: Vec<DiagnosticRecord>,
    /// Per tensor since burn-in: (Σ, epochs) of each epoch's mean kinetic energy.
    window: Vec<(f64, usize)>,
    warned_kinetic: bool,
    warned_thermostat: bool,
    /// Where the warnings say they come from ("", "replica 2: ").
    label: String,
    /// The kinetic energy is checked from this epoch on (0-based; the burn-in's end).
    check_from: usize,
    /// The configurational temperature's sums (saved with the run).
    pub configurational: ConfigurationalSums,
    /// D, the parameters (0: unknown).
    parameters: usize,
}

impl Monitor {
    /// A monitor recording every `every` updates (0: at epoch ends).
    pub fn new(every: usize, initial_thermostat: Option<f64>, label: &str) -> Self {
        Monitor {
            check_from: 0,
            every: every as u64,
            initial_thermostat,
            epoch_records: Vec::new(),
            window: Vec::new(),
            warned_kinetic: false,
            warned_thermostat: false,
            label: label.to_string(),
            configurational: ConfigurationalSums::default(),
            parameters: 0,
        }
    }

    /// Adds one update of epoch `epoch` (0-based): its per-tensor virials.
    pub fn add_virials(&mut self, epoch: usize, virials: &[f64]) {
        self.configurational.add(virials, epoch >= self.check_from);
    }

    /// Fills `record`'s configurational temperature for `tensors` (name, elements), and
    /// warns once when it is out of its band.
    pub fn fill_configurational(
        &mut self,
        record: &mut DiagnosticRecord,
        tensors: &[(String, usize)],
    ) {
        record.configurational = self.configurational.take_record(tensors);
        if let Some(c) = &record.configurational {
            if let Some(w) = self.configurational.warning(c, &self.label) {
                tracing::warn!("{w}");
            }
        }
    }

    /// Checks the kinetic energy only from epoch `epoch` (0-based) on: a chain heats up
    /// in its first updates from its initial point, which burn-in is for.
    pub fn checking_from(mut self, epoch: usize) -> Self {
        self.check_from = epoch;
        self
    }

    /// The model's parameter count D, so that an epoch's overall mean is judged against
    /// its own spread (without it, the band alone judges it).
    pub fn of_parameters(mut self, parameters: usize) -> Self {
        self.parameters = parameters;
        self
    }

    /// Whether update `step` (counted from 1) writes a record; `last_of_epoch`: it ends
    /// its epoch.
    pub fn due(&self, step: u64, last_of_epoch: bool) -> bool {
        match self.every {
            0 => last_of_epoch,
            k => step.is_multiple_of(k),
        }
    }

    /// Keeps `record` (already handed to the sink) for the epoch's checks.
    pub fn record(&mut self, record: DiagnosticRecord) {
        self.epoch_records.push(record);
    }

    /// The end of epoch `epoch` (0-based) whose updates' mean kinetic energy was
    /// `mean_kinetic`: warns once if it is outside the band, or if one tensor's mean over
    /// the epochs since burn-in is outside it beyond chance (`KINETIC_SIGMAS` standard
    /// errors from the target, from `KINETIC_MIN_EPOCHS` epochs on); or if the thermostat
    /// stayed above 10× its initial value at every record of the epoch, or went negative.
    /// Returns the warnings given.
    pub fn end_epoch(
        &mut self,
        epoch: usize,
        mean_kinetic: Option<f64>,
        updates: usize,
    ) -> Vec<String> {
        let records = std::mem::take(&mut self.epoch_records);
        let mut warnings = Vec::new();
        let (lo, hi) = (
            KINETIC_BAND.0 * KINETIC_TARGET,
            KINETIC_BAND.1 * KINETIC_TARGET,
        );
        let outside = |k: f64| !(lo..=hi).contains(&k);
        if !self.warned_kinetic && epoch >= self.check_from {
            let mut hot: Vec<String> = Vec::new();
            if let Some(k) = mean_kinetic.filter(|&k| outside(k) && self.judgeable(updates)) {
                hot.push(format!("overall {k:.3}"));
            }
            for (tensor, mean) in self.hot_tensors(&records, &outside) {
                hot.push(format!("{tensor} {mean:.3}"));
            }
            if !hot.is_empty() {
                self.warned_kinetic = true;
                warnings.push(format!(
                    "{}epoch {}: kinetic energy per parameter out of [{lo:.2}, {hi:.2}] (target {KINETIC_TARGET}; the temperature is out of control: a smaller step size may help): {}",
                    self.label,
                    epoch + 1,
                    hot.join(", ")
                ));
            }
        }
        if !self.warned_thermostat && !records.is_empty() {
            let means: Vec<f64> = records.iter().filter_map(|r| r.thermostat_mean).collect();
            let negative = means.iter().any(|&m| m < 0.0);
            let grown = match self.initial_thermostat {
                Some(a0) if a0 > 0.0 && means.len() == records.len() => {
                    means.iter().all(|&m| m > THERMOSTAT_GROWTH * a0)
                }
                _ => false,
            };
            if negative || grown {
                self.warned_thermostat = true;
                warnings.push(format!(
                    "{}epoch {}: thermostat {} (initial {:?}, last {:.4e}): the sampler fights a gradient noise it does not model",
                    self.label,
                    epoch + 1,
                    if negative { "went negative" } else { "stayed above 10× its initial value for the whole epoch" },
                    self.initial_thermostat,
                    means.last().copied().unwrap_or(f64::NAN)
                ));
            }
        }
        for w in &warnings {
            tracing::warn!("{w}");
        }
        warnings
    }

    /// Whether an epoch's overall mean kinetic energy over `updates` updates is precise
    /// enough to be judged by the band: its standard error (½·√(2/D) per snapshot, times
    /// [`KINETIC_CORRELATION`], over √updates) times [`KINETIC_SIGMAS`] within the band's
    /// lower half-width. Why: a table's model has a dozen parameters and its epochs three
    /// updates, whose mean spreads ±0.18 around ½ — judged by the band, a correct default
    /// run on diabetes warned at 0.35, and with four standard errors still at 1.36 among
    /// 90,000 epochs. Such a run is judged by its tensors' means since burn-in instead.
    fn judgeable(&self, updates: usize) -> bool {
        if self.parameters == 0 || updates == 0 {
            return true;
        }
        let snapshot = KINETIC_CORRELATION * KINETIC_TARGET * (2.0 / self.parameters as f64).sqrt();
        let half_width = KINETIC_TARGET * (1.0 - KINETIC_BAND.0);
        KINETIC_SIGMAS * snapshot / (updates as f64).sqrt() <= half_width
    }

    /// Adds this epoch's records to each tensor's window and returns the tensors whose
    /// mean over the window is out of the band beyond chance, with that mean.
    fn hot_tensors(
        &mut self,
        records: &[DiagnosticRecord],
        outside: &dyn Fn(f64) -> bool,
    ) -> Vec<(String, f64)> {
        let Some(first) = records.first() else {
            return Vec::new();
        };
        self.window.resize(first.kinetic_per_tensor.len(), (0.0, 0));
        let mut hot = Vec::new();
        for (i, t) in first.kinetic_per_tensor.iter().enumerate() {
            let epoch_mean = records
                .iter()
                .filter_map(|r| r.kinetic_per_tensor.get(i))
                .map(|t| t.kinetic_energy)
                .sum::<f64>()
                / records.len() as f64;
            let (sum, m) = &mut self.window[i];
            *sum += epoch_mean;
            *m += 1;
            if *m < KINETIC_MIN_EPOCHS {
                continue;
            }
            let mean = *sum / *m as f64;
            let snapshot = KINETIC_CORRELATION
                * KINETIC_TARGET
                * (2.0 / (t.elements * records.len()) as f64).sqrt();
            let standard_error = snapshot / (*m as f64).sqrt();
            if outside(mean) && (mean - KINETIC_TARGET).abs() > KINETIC_SIGMAS * standard_error {
                hot.push((t.tensor.clone(), mean));
            }
        }
        hot
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(kinetic: &[f64], thermostat: Option<f64>) -> DiagnosticRecord {
        DiagnosticRecord {
            step: 0,
            epoch: 1,
            potential_energy: 0.0,
            kinetic_energy: Some(kinetic.iter().sum::<f64>() / kinetic.len() as f64),
            kinetic_per_tensor: kinetic
                .iter()
                .enumerate()
                .map(|(i, &k)| TensorKinetic {
                    tensor: format!("t{i}"),
                    elements: 1000,
                    kinetic_energy: k,
                })
                .collect(),
            thermostat_mean: thermostat,
            thermostat_spread: thermostat.map(|_| 0.0),
            temperature: None,
            configurational: None,
        }
    }

    /// Ends `epochs` epochs of `m` from `from` (0-based), one record each, the last
    /// record's kinetic energies per tensor from `kinetic(epoch)`; returns the warnings.
    fn run_epochs(
        m: &mut Monitor,
        from: usize,
        epochs: usize,
        kinetic: impl Fn(usize) -> Vec<f64>,
    ) -> Vec<(usize, String)> {
        let mut out = Vec::new();
        for e in from..from + epochs {
            m.epoch_records.push(rec(&kinetic(e), None));
            for w in m.end_epoch(e, Some(0.5), 1) {
                out.push((e, w));
            }
        }
        out
    }

    #[test]
    fn a_hot_tensor_warns_once_though_the_overall_mean_is_in_control() {
        let mut m = Monitor::new(0, None, "");
        let w = run_epochs(&mut m, 0, 6, |_| vec![0.5, 0.9, 0.1]);
        assert_eq!(w.len(), 1, "{w:?}");
        assert_eq!(
            w[0].0,
            KINETIC_MIN_EPOCHS - 1,
            "judged from the third epoch on"
        );
        assert!(
            w[0].1.contains("t1 0.900") && w[0].1.contains("t2 0.100") && !w[0].1.contains("t0")
        );
        // The overall mean is judged at once (it is already a mean over the epoch's
        // updates). The LeNet that motivated the check: 0.62 to 0.74 against 0.5.
        let mut m = Monitor::new(0, None, "");
        assert_eq!(m.end_epoch(0, Some(0.68), 1).len(), 1);
        // Known D: an epoch of 600 updates of 79,510 parameters is judged by the band; one
        // of 3 updates of 11 (a table's epoch, its mean ±0.18 by chance) is not.
        let mut m = Monitor::new(0, None, "").of_parameters(79_510);
        assert_eq!(m.end_epoch(0, Some(0.68), 600).len(), 1);
        let mut m = Monitor::new(0, None, "").of_parameters(11);
        assert!(m.end_epoch(0, Some(1.36), 3).is_empty());
        let mut m = Monitor::new(0, None, "");
        assert!(m.end_epoch(0, Some(0.55), 1).is_empty());
        // A 10-element bias at 0.9 for three epochs: within 4 standard errors (1.5·0.22/√3).
        let mut m = Monitor::new(0, None, "");
        for e in 0..3 {
            let mut r = rec(&[0.5, 0.9], None);
            r.kinetic_per_tensor[1].elements = 10;
            m.epoch_records.push(r);
            assert!(m.end_epoch(e, Some(0.5), 1).is_empty());
        }
        // Burn-in epochs are not checked.
        let mut m = Monitor::new(0, None, "").checking_from(2);
        assert!(m.end_epoch(1, Some(0.9), 1).is_empty());
        assert_eq!(m.end_epoch(2, Some(0.9), 1).len(), 1);
    }

    /// fc2.weight (1,000 values) of the default run (`bnn train`, seed 0), epochs 11–30.
    const SUBSET_FC2: [f64; 20] = [
        0.583, 0.577, 0.533, 0.562, 0.529, 0.548, 0.536, 0.584, 0.575, 0.634, 0.526, 0.568, 0.530,
        0.535, 0.484, 0.542, 0.520, 0.564, 0.553, 0.527,
    ];
    /// The same on the full MNIST (`bnn train --dataset mnist`, seed 0): the output layer
    /// is in fact hot, about twice the target.
    const FULL_FC2: [f64; 20] = [
        2.396, 1.197, 1.442, 1.257, 1.682, 0.999, 1.946, 1.183, 1.551, 1.135, 0.812, 0.868, 1.118,
        0.876, 0.765, 0.738, 0.863, 0.904, 0.815, 0.639,
    ];

    #[test]
    fn one_hot_snapshot_of_a_tensor_in_control_does_not_warn_but_a_hot_layer_does() {
        // The subset's epoch 20 (0.634) warned when each snapshot was judged alone.
        let mut m = Monitor::new(0, None, "").checking_from(10);
        assert!(run_epochs(&mut m, 10, 20, |e| vec![0.53, SUBSET_FC2[e - 10]]).is_empty());
        let mut m = Monitor::new(0, None, "").checking_from(10);
        let w = run_epochs(&mut m, 10, 20, |e| vec![0.53, FULL_FC2[e - 10]]);
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(w[0].1.contains("t1 "), "{w:?}");
    }

    #[test]
    fn thermostat_that_grows_for_an_epoch_or_goes_negative_warns() {
        let mut m = Monitor::new(0, Some(0.01), "");
        m.epoch_records.push(rec(&[0.5], Some(0.5)));
        m.epoch_records.push(rec(&[0.5], Some(0.05)));
        assert!(
            m.end_epoch(0, Some(0.5), 1).is_empty(),
            "not above 10× all epoch"
        );
        m.epoch_records.push(rec(&[0.5], Some(0.2)));
        m.epoch_records.push(rec(&[0.5], Some(0.5)));
        assert_eq!(m.end_epoch(1, Some(0.5), 1).len(), 1);
        let mut m = Monitor::new(0, Some(0.01), "");
        m.epoch_records.push(rec(&[0.5], Some(-0.001)));
        let w = m.end_epoch(0, Some(0.5), 1);
        assert!(w[0].contains("went negative"), "{w:?}");
    }

    #[test]
    fn records_are_due_every_n_updates_or_at_the_epoch_end() {
        let m = Monitor::new(0, None, "");
        assert!(!m.due(5, false) && m.due(6, true));
        let m = Monitor::new(5, None, "");
        assert!(m.due(5, false) && !m.due(6, true) && m.due(10, false));
    }
}
