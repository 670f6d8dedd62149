//! Step-size schedules and the sampling window: step decay (Li et al. 2016), cyclical
//! cosine cycles (Zhang et al. 2020) and polynomial decay (Welling & Teh 2011), which
//! combine; and which updates keep a sample (burn-in, thinning, the late part of a cycle).

use serde::{Deserialize, Serialize};

/// A run's schedule: part of its configuration, `run.json` and `summary.json` (flattened
/// into them: the same keys as before it was a type of its own). The base step size η is
/// the sampler's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Schedule {
    /// Step decay: η × `decay_factor` from each of these epochs on (0-based).
    pub decay_at: Vec<usize>,
    /// The factor η is multiplied by at each `decay_at` epoch.
    pub decay_factor: f64,
    /// Cosine cycles over the run (0: none); samples only in the last `sample_fraction`.
    pub cycles: usize,
    /// The fraction at the end of each cycle in which samples are kept.
    pub sample_fraction: f64,
    /// η_t = η·(b/(b + t))^γ with γ = `poly_gamma` (0: none), b = `poly_steps` (absent
    /// from runs older than the option: none).
    #[serde(default)]
    pub poly_gamma: f64,
    /// The polynomial decay's step scale (η_t = η(1 + t/steps)^−γ).
    #[serde(default = "default_poly_steps")]
    pub poly_steps: f64,
    /// Epochs before the first sample; a sample every `thin` updates after them.
    pub burnin: usize,
    /// Keep every `thin`-th update after burn-in.
    pub thin: usize,
}

fn default_poly_steps() -> f64 {
    1000.0
}

impl Schedule {
    /// η during `epoch` (0-based) under the step-decay schedule, from the base η.
    pub fn step_size_at(&self, eta: f64, epoch: usize) -> f64 {
        let decays = self.decay_at.iter().filter(|&&e| e <= epoch).count();
        eta * self.decay_factor.powi(decays as i32)
    }

    /// Position in the current cycle, in [0, 1), of update `step` (0-based) out of
    /// `total`; `None` without a cyclical schedule.
    pub(crate) fn cycle_position(&self, step: u64, total: u64) -> Option<f64> {
        if self.cycles == 0 {
            return None;
        }
        let len = total.div_ceil(self.cycles as u64).max(1);
        Some((step % len) as f64 / len as f64)
    }

    /// η of update `step` in `epoch` from the base η: the step decay, times the cosine factor
    /// ½(1 + cos(π r)) of a cyclical schedule at cycle position r.
    pub fn step_size_of(&self, eta: f64, step: u64, total: u64, epoch: usize) -> f64 {
        let mut base = self.step_size_at(eta, epoch);
        if self.poly_gamma > 0.0 {
            base *= (self.poly_steps / (self.poly_steps + step as f64)).powf(self.poly_gamma);
        }
        match self.cycle_position(step, total) {
            Some(r) => base * 0.5 * (1.0 + (std::f64::consts::PI * r).cos()),
            None => base,
        }
    }

    /// How many samples a chain of `epochs` epochs of `batches` updates keeps.
    pub fn samples_kept(&self, batches: usize, epochs: usize) -> u64 {
        let total = (batches * epochs) as u64;
        (1..=total)
            .filter(|&step| self.keeps_sample(step, total, ((step - 1) / batches as u64) as usize))
            .count() as u64
    }

    /// Whether the sample after update `step` (1-based count) may be kept.
    pub fn keeps_sample(&self, step: u64, total: u64, epoch: usize) -> bool {
        let in_window = self
            .cycle_position(step - 1, total)
            .is_none_or(|r| r >= 1.0 - self.sample_fraction);
        epoch >= self.burnin && step.is_multiple_of(self.thin as u64) && in_window
    }
}

/// A small schedule for examples and tests: burn-in 2 epochs, every 5th update, constant
/// step size.
pub fn example() -> Schedule {
    Schedule {
        decay_at: vec![],
        decay_factor: 0.5,
        cycles: 0,
        sample_fraction: 0.25,
        poly_gamma: 0.0,
        poly_steps: 1000.0,
        burnin: 2,
        thin: 5,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schedule() -> Schedule {
        example()
    }

    #[test]
    fn step_decay() {
        let mut c = schedule();
        c.decay_at = vec![3, 6];
        let eta = 2e-6;
        assert_eq!(c.step_size_at(eta, 2), eta);
        assert_eq!(c.step_size_at(eta, 3), eta * 0.5);
        assert_eq!(c.step_size_at(eta, 9), eta * 0.25);
    }

    #[test]
    fn cyclical_schedule_and_sampling_window() {
        let mut c = schedule();
        c.cycles = 2;
        let eta = 2e-6;
        // 100 updates in all: two cycles of 50.
        assert_eq!(c.step_size_of(eta, 0, 100, 0), eta);
        assert!((c.step_size_of(eta, 25, 100, 0) - eta / 2.0).abs() < 1e-18);
        assert_eq!(c.step_size_of(eta, 50, 100, 0), eta);
        assert!(c.step_size_of(eta, 49, 100, 0) < eta * 1e-2);
        // Samples only in the last quarter of a cycle (positions ≥ 0.75), after burn-in,
        // on multiples of thin: updates 40 and 45 (positions 0.78 and 0.88), not 35.
        assert!(c.keeps_sample(40, 100, 3));
        assert!(c.keeps_sample(45, 100, 3));
        assert!(!c.keeps_sample(35, 100, 3));
        assert!(!c.keeps_sample(41, 100, 3));
        assert!(!c.keeps_sample(40, 100, 1), "burn-in");
        c.cycles = 0;
        assert!(c.keeps_sample(35, 100, 3));
    }

    #[test]
    fn polynomial_decay() {
        let mut c = schedule();
        c.poly_gamma = 0.55;
        c.poly_steps = 100.0;
        let eta = 2e-6;
        assert_eq!(c.step_size_of(eta, 0, 1000, 0), eta);
        // t = 300: (100/400)^0.55.
        let want = eta * 0.25f64.powf(0.55);
        assert!((c.step_size_of(eta, 300, 1000, 0) - want).abs() < 1e-18);
    }
}
