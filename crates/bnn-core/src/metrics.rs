//! Classification metrics of predictive probabilities: accuracy, negative log-likelihood,
//! expected calibration error and Brier score.

use serde::{Deserialize, Serialize};

/// Number of equal-width confidence bins of the ECE.
pub const ECE_BINS: usize = 15;

/// Metrics of a predictive distribution on a labelled set.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Metrics {
    /// Fraction of examples whose most probable class is the label.
    pub accuracy: f64,
    /// Mean of −log p(yᵢ).
    pub nll: f64,
    /// Σ_b (|B_b|/n)·|acc(B_b) − conf(B_b)| over 15 equal-width bins of the top-class
    /// probability; bin b holds confidences in (b/15, (b+1)/15].
    pub ece: f64,
    /// Mean over examples of Σ_k (p_k − 1[y = k])².
    pub brier: f64,
}

/// Probabilities below this are clamped before the log, so a confident mistake costs a
/// large but finite NLL.
const MIN_PROB: f64 = 1e-12;

/// A class label: any unsigned integer type, so that a table of 300 classes is as welcome
/// as the image data sets' `u8` labels.
pub trait Label: Copy + std::fmt::Display {
    /// The class index.
    fn class(self) -> usize;
}

macro_rules! label {
    ($($t:ty),*) => {$(
        impl Label for $t {
            fn class(self) -> usize {
                self as usize
            }
        }
    )*};
}
label!(u8, u16, u32, usize);

/// Metrics of `probs` (row-major n × classes) against `labels`.
pub fn evaluate<L: Label>(probs: &[f64], labels: &[L], classes: usize) -> Metrics {
    let n = labels.len();
    assert_eq!(
        probs.len(),
        n * classes,
        "probabilities and labels disagree"
    );
    let mut tally = Tally::default();
    for (row, &y) in probs.chunks_exact(classes).zip(labels) {
        tally.add_row(row, y.class());
    }
    tally.metrics(n)
}

/// The sums behind [`Metrics`], over rows in order: what `evaluate` adds up, and what the
/// step plan's ensemble tallies on the device (`kernels/plan_ensemble.h`, the same f64
/// operations in the same order) and hands back as [`Tally::from_values`].
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Tally {
    /// Rows whose first arg-max is the label.
    pub correct: usize,
    /// Σ −ln max(p_y, 10⁻¹²).
    pub nll: f64,
    /// Σ Σ_k (p_k − 1[y = k])².
    pub brier: f64,
    /// Per confidence bin: its rows, their confidences' sum, their hits.
    pub bins: [(usize, f64, usize); ECE_BINS],
}

impl Tally {
    /// Adds the row `row` of label `y`.
    pub fn add_row(&mut self, row: &[f64], y: usize) {
        // First maximum wins ties, like argmax.
        let pred = crate::uncertainty::predicted(row);
        let conf = row[pred];
        let hit = pred == y;
        self.correct += hit as usize;
        self.nll -= row[y].max(MIN_PROB).ln();
        self.brier += row
            .iter()
            .enumerate()
            .map(|(k, &p)| {
                let t = if k == y { 1.0 } else { 0.0 };
                (p - t) * (p - t)
            })
            .sum::<f64>();
        let b = ((conf * ECE_BINS as f64).ceil() as usize).clamp(1, ECE_BINS) - 1;
        let bin = &mut self.bins[b];
        bin.0 += 1;
        bin.1 += conf;
        bin.2 += hit as usize;
    }

    /// The tally of the device's `BNN_PLAN_TALLY` values (hits, NLL, Brier, rows not
    /// finite, then rows, confidences and hits per bin), and its rows not finite.
    pub fn from_values(v: &[f64; 4 + 3 * ECE_BINS]) -> (Self, usize) {
        let count = |x: f64| x as usize;
        let mut t = Tally {
            correct: count(v[0]),
            nll: v[1],
            brier: v[2],
            ..Tally::default()
        };
        for (b, bin) in t.bins.iter_mut().enumerate() {
            *bin = (
                count(v[4 + b]),
                v[4 + ECE_BINS + b],
                count(v[4 + 2 * ECE_BINS + b]),
            );
        }
        (t, count(v[3]))
    }

    /// The metrics of `n` rows so tallied.
    pub fn metrics(&self, n: usize) -> Metrics {
        let nf = n as f64;
        let ece = self
            .bins
            .iter()
            .filter(|b| b.0 > 0)
            .map(|&(rows, conf, hits)| {
                let c = rows as f64;
                (c / nf) * (hits as f64 / c - conf / c).abs()
            })
            .sum();
        Metrics {
            accuracy: self.correct as f64 / nf,
            nll: self.nll / nf,
            ece,
            brier: self.brier / nf,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hand_computed_example() {
        // Three examples, two classes.
        let probs = [0.9, 0.1, 0.3, 0.7, 0.6, 0.4];
        let labels = [0u8, 0, 0];
        let m = evaluate(&probs, &labels, 2);
        assert!((m.accuracy - 2.0 / 3.0).abs() < 1e-12);
        let nll = -(0.9f64.ln() + 0.3f64.ln() + 0.6f64.ln()) / 3.0;
        assert!((m.nll - nll).abs() < 1e-12);
        let brier = (2.0 * 0.01 + 2.0 * 0.49 + 2.0 * 0.16) / 3.0;
        assert!((m.brier - brier).abs() < 1e-12);
        // Confidences 0.9 (bin 13: (13/15, 14/15]), 0.7 (bin 10), 0.6 (bin 8): one each.
        let ece =
            (1.0 / 3.0) * ((1.0f64 - 0.9).abs() + (0.0f64 - 0.7).abs() + (1.0f64 - 0.6).abs());
        assert!((m.ece - ece).abs() < 1e-12, "{} vs {ece}", m.ece);
    }

    #[test]
    fn shared_bin_and_bin_edges() {
        // 0.8 and 0.75 share bin 11 ((11/15, 12/15]); 12/15 exactly stays in bin 11.
        let probs = [0.8, 0.2, 0.25, 0.75, 12.0 / 15.0, 3.0 / 15.0];
        let labels = [0u8, 0, 0];
        let m = evaluate(&probs, &labels, 2);
        let conf: f64 = (0.8 + 0.75 + 12.0 / 15.0) / 3.0;
        let acc: f64 = 2.0 / 3.0;
        assert!((m.ece - (acc - conf).abs()).abs() < 1e-12);
    }

    #[test]
    fn perfect_predictions() {
        let m = evaluate(&[1.0, 0.0, 0.0, 1.0], &[0u8, 1], 2);
        assert_eq!(m.accuracy, 1.0);
        assert_eq!(m.nll, 0.0);
        assert_eq!(m.ece, 0.0);
        assert_eq!(m.brier, 0.0);
    }
}
