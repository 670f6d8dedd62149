//! What the ensemble does not know, in numbers: entropy of the Bayesian model average and
//! its split into aleatoric and epistemic parts, per-class accuracy, accuracy when the
//! most uncertain predictions are rejected, and how well an uncertainty score tells test
//! images from out-of-distribution ones (AUROC, AUPR; Ovadia et al. 2019).
//!
//! With p̄(x) = (1/K) Σ_k p_k(x) the averaged prediction, the predictive entropy
//! H[p̄(x)] splits into the expected entropy (1/K) Σ_k H[p_k(x)] (aleatoric: what every
//! sample finds ambiguous) and the mutual information between the label and the
//! parameters, H\[p̄\] − (1/K) Σ_k H\[p_k\] ≥ 0 (epistemic: where the samples disagree).
//! Entropies are in nats.

use serde::{Deserialize, Serialize};

/// The fractions of the test set kept, most certain first, at which accuracy-vs-coverage
/// is reported.
pub const COVERAGES: [f64; 10] = [1.0, 0.95, 0.9, 0.85, 0.8, 0.75, 0.7, 0.6, 0.5, 0.4];

/// H\[p\] = −Σ p log p in nats (0 log 0 = 0).
pub fn entropy(row: &[f64]) -> f64 {
    -row.iter()
        .filter(|&&p| p > 0.0)
        .map(|&p| p * p.ln())
        .sum::<f64>()
}

/// The same for single-precision probabilities (one sample's softmax), summed in f64.
pub fn entropy_f32(row: &[f32]) -> f64 {
    -row.iter()
        .filter(|&&p| p > 0.0)
        .map(|&p| p as f64 * (p as f64).ln())
        .sum::<f64>()
}

/// Accuracy on the most certain `coverage` of the examples (by predictive entropy).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct CoveragePoint {
    /// Fraction of examples kept.
    pub coverage: f64,
    /// Accuracy on them.
    pub accuracy: f64,
    /// Largest predictive entropy kept.
    pub max_entropy: f64,
}

/// Uncertainty of a predictive distribution on a labelled set.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Uncertainty {
    /// Mean over examples of H[p̄(x)].
    pub predictive_entropy: f64,
    /// Mean over examples of (1/K) Σ_k H[p_k(x)].
    pub expected_entropy: f64,
    /// Their difference: the epistemic part (0 for one sample).
    pub mutual_information: f64,
    /// Accuracy on the examples of each true class, class 0 first.
    pub per_class_accuracy: Vec<f64>,
    /// Accuracy of the most certain fraction, at each of [`COVERAGES`].
    pub accuracy_vs_coverage: Vec<CoveragePoint>,
    /// The reliability diagram: the ECE's equal-width bins of top-class probability
    /// (bin b holds confidences in (b/15, (b+1)/15]).
    #[serde(default)]
    pub reliability: Vec<ReliabilityBin>,
}

/// One bin of the reliability diagram.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ReliabilityBin {
    /// The bin's upper edge.
    pub upper: f64,
    /// Examples in the bin.
    pub count: usize,
    /// Mean top-class probability in the bin (0 when empty).
    pub confidence: f64,
    /// Share of the bin's predictions that are right (0 when empty).
    pub accuracy: f64,
}

/// Index of the largest probability, the first on ties (argmax).
pub fn predicted(row: &[f64]) -> usize {
    row.iter()
        .enumerate()
        .fold((0, f64::NEG_INFINITY), |(bi, bp), (i, &p)| {
            if p > bp {
                (i, p)
            } else {
                (bi, bp)
            }
        })
        .0
}

/// The uncertainty of `mean` (row-major n × classes, the averaged prediction) against
/// `labels`, with `expected_entropy[i]` the mean entropy of the samples on example i.
pub fn evaluate<L: crate::metrics::Label>(
    mean: &[f64],
    expected_entropy: &[f64],
    labels: &[L],
    classes: usize,
) -> Uncertainty {
    let n = labels.len();
    assert_eq!(mean.len(), n * classes, "probabilities and labels disagree");
    assert_eq!(
        expected_entropy.len(),
        n,
        "one expected entropy per example"
    );
    let predictive: Vec<f64> = mean.chunks_exact(classes).map(entropy).collect();
    let correct: Vec<bool> = mean
        .chunks_exact(classes)
        .zip(labels)
        .map(|(row, &y)| predicted(row) == y.class())
        .collect();
    let bins = crate::metrics::ECE_BINS;
    let mut reliability: Vec<ReliabilityBin> = (0..bins)
        .map(|b| ReliabilityBin {
            upper: (b + 1) as f64 / bins as f64,
            count: 0,
            confidence: 0.0,
            accuracy: 0.0,
        })
        .collect();
    for (row, &c) in mean.chunks_exact(classes).zip(&correct) {
        let conf = row[predicted(row)];
        // As the ECE bins it (metrics::evaluate).
        let b = ((conf * bins as f64).ceil() as usize).clamp(1, bins) - 1;
        reliability[b].count += 1;
        reliability[b].confidence += conf;
        reliability[b].accuracy += c as usize as f64;
    }
    for r in reliability.iter_mut().filter(|r| r.count > 0) {
        r.confidence /= r.count as f64;
        r.accuracy /= r.count as f64;
    }
    let (mut hits, mut seen) = (vec![0usize; classes], vec![0usize; classes]);
    for (&c, &y) in correct.iter().zip(labels) {
        seen[y.class()] += 1;
        hits[y.class()] += c as usize;
    }
    // Most certain first; ties broken by index so that the order is reproducible.
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&a, &b| predictive[a].total_cmp(&predictive[b]).then(a.cmp(&b)));
    let accuracy_vs_coverage = COVERAGES
        .iter()
        .filter_map(|&coverage| {
            let kept = ((coverage * n as f64).round() as usize).min(n);
            (kept > 0).then(|| CoveragePoint {
                coverage,
                accuracy: order[..kept].iter().filter(|&&i| correct[i]).count() as f64
                    / kept as f64,
                max_entropy: predictive[order[kept - 1]],
            })
        })
        .collect();
    let mean_of = |v: &[f64]| v.iter().sum::<f64>() / n.max(1) as f64;
    let predictive_entropy = mean_of(&predictive);
    let expected = mean_of(expected_entropy);
    Uncertainty {
        predictive_entropy,
        expected_entropy: expected,
        mutual_information: predictive_entropy - expected,
        per_class_accuracy: hits
            .iter()
            .zip(&seen)
            .map(|(&h, &s)| if s > 0 { h as f64 / s as f64 } else { f64::NAN })
            .collect(),
        accuracy_vs_coverage,
        reliability,
    }
}

/// How well a score (larger: more likely out of distribution) separates in- from
/// out-of-distribution examples.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Detection {
    /// Area under the ROC curve: the probability that a random out-of-distribution
    /// example scores higher than a random in-distribution one (ties count half).
    pub auroc: f64,
    /// Area under the precision–recall curve with out-of-distribution as the positive
    /// class, as average precision (each positive's precision at its rank).
    pub aupr: f64,
}

/// [`Detection`] of `outside` against `inside` scores. Non-finite scores are an error of
/// the caller (the probabilities were checked finite before).
pub fn detection(inside: &[f64], outside: &[f64]) -> Detection {
    let mut all: Vec<(f64, bool)> = inside
        .iter()
        .map(|&s| (s, false))
        .chain(outside.iter().map(|&s| (s, true)))
        .collect();
    all.sort_by(|a, b| a.0.total_cmp(&b.0));
    // AUROC by the Mann–Whitney U statistic with mid-ranks for ties.
    let (n_in, n_out) = (inside.len() as f64, outside.len() as f64);
    let mut rank_sum_out = 0.0;
    let mut i = 0;
    while i < all.len() {
        let mut j = i;
        while j < all.len() && all[j].0 == all[i].0 {
            j += 1;
        }
        let mid_rank = (i + 1 + j) as f64 / 2.0;
        rank_sum_out += mid_rank * all[i..j].iter().filter(|e| e.1).count() as f64;
        i = j;
    }
    let auroc = (rank_sum_out - n_out * (n_out + 1.0) / 2.0) / (n_in * n_out);
    // Average precision, walking from the highest score down; a group of tied scores is
    // taken at once (its precision is that of the whole group).
    let (mut tp, mut fp, mut aupr) = (0.0, 0.0, 0.0);
    let mut j = all.len();
    while j > 0 {
        let mut i = j;
        while i > 0 && all[i - 1].0 == all[j - 1].0 {
            i -= 1;
        }
        let pos = all[i..j].iter().filter(|e| e.1).count() as f64;
        tp += pos;
        fp += (j - i) as f64 - pos;
        aupr += pos * tp / (tp + fp);
        j = i;
    }
    Detection {
        auroc,
        aupr: aupr / n_out,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entropy_of_uniform_and_certain() {
        assert!((entropy(&[0.25; 4]) - 4f64.ln()).abs() < 1e-12);
        assert_eq!(entropy(&[0.0, 1.0, 0.0]), 0.0);
        assert!((entropy_f32(&[0.5, 0.5]) - 2f64.ln()).abs() < 1e-7);
    }

    /// Two samples that are each certain but disagree: no aleatoric part, all epistemic.
    #[test]
    fn disagreeing_certain_samples_are_all_mutual_information() {
        let mean = [0.5, 0.5];
        let u = evaluate(&mean, &[0.0], &[0u8], 2);
        assert!((u.mutual_information - 2f64.ln()).abs() < 1e-12);
        assert_eq!(u.expected_entropy, 0.0);
        assert_eq!(u.per_class_accuracy[0], 1.0);
        assert!(u.per_class_accuracy[1].is_nan());
    }

    #[test]
    fn rejecting_the_uncertain_raises_accuracy() {
        // Four examples: two certain and right, two uncertain and wrong.
        let mean = [0.9, 0.1, 0.1, 0.9, 0.6, 0.4, 0.45, 0.55];
        let labels = [0u8, 1, 1, 0];
        let u = evaluate(&mean, &[0.0; 4], &labels, 2);
        let at = |c: f64| {
            u.accuracy_vs_coverage
                .iter()
                .find(|p| p.coverage == c)
                .unwrap()
                .accuracy
        };
        assert_eq!(at(1.0), 0.5);
        assert_eq!(at(0.5), 1.0);
        assert_eq!(u.per_class_accuracy, vec![0.5, 0.5]);
        // Reliability: 0.9 twice (right) in (0.867, 0.933]; 0.6 and 0.55 (wrong) in
        // (0.533, 0.6], the ECE's bins.
        let used: Vec<_> = u.reliability.iter().filter(|r| r.count > 0).collect();
        assert_eq!(used.len(), 2, "{used:?}");
        assert_eq!((used[1].count, used[1].accuracy), (2, 1.0));
        assert!((used[1].confidence - 0.9).abs() < 1e-12);
        assert_eq!((used[0].count, used[0].accuracy), (2, 0.0));
        assert!((used[0].confidence - 0.575).abs() < 1e-12);
        // The ECE from these bins is the metrics module's.
        let n = 4.0;
        let ece: f64 = used
            .iter()
            .map(|r| r.count as f64 / n * (r.accuracy - r.confidence).abs())
            .sum();
        let m = crate::metrics::evaluate(&mean, &labels, 2);
        assert!((ece - m.ece).abs() < 1e-12);
    }

    #[test]
    fn detection_of_separated_mixed_and_tied_scores() {
        let d = detection(&[0.1, 0.2], &[0.3, 0.4]);
        assert_eq!((d.auroc, d.aupr), (1.0, 1.0));
        let d = detection(&[0.3, 0.4], &[0.1, 0.2]);
        assert_eq!(d.auroc, 0.0);
        // Every score tied: AUROC one half, AUPR the share of positives.
        let d = detection(&[1.0; 3], &[1.0]);
        assert_eq!((d.auroc, d.aupr), (0.5, 0.25));
        // in {0.1, 0.35}, out {0.3, 0.4}: 3 of 4 pairs ordered; AP = (1/1 + 2/3) / 2.
        let d = detection(&[0.1, 0.35], &[0.3, 0.4]);
        assert!((d.auroc - 0.75).abs() < 1e-12);
        assert!((d.aupr - (1.0 + 2.0 / 3.0) / 2.0).abs() < 1e-12);
    }
}
