//! Label noise (`--permute-labels p`, Luo et al. 2018 §4.2): the labels of a random
//! fraction p of the training examples are permuted among those examples, which makes the
//! posterior rugged while keeping each class's share of the labels.

use rand::seq::SliceRandom;
use rand::SeedableRng;

/// `labels` with those of round(p·n) examples, drawn at random, permuted among them
/// (a uniformly random permutation: an example may keep its own label). `seed` decides
/// which examples and how.
pub fn permute_labels(labels: &[u8], fraction: f64, seed: u64) -> Vec<u8> {
    let mut out = labels.to_vec();
    let k = ((fraction.clamp(0.0, 1.0) * labels.len() as f64).round() as usize).min(labels.len());
    if k < 2 {
        return out;
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut index: Vec<usize> = (0..labels.len()).collect();
    let (chosen, _) = index.partial_shuffle(&mut rng, k);
    let mut moved: Vec<u8> = chosen.iter().map(|&i| labels[i]).collect();
    moved.shuffle(&mut rng);
    for (&i, &l) in chosen.iter().zip(&moved) {
        out[i] = l;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only the chosen examples change, the label counts stay, a seed repeats itself, and
    /// p = 0.3 relabels about 0.3·(1 − Σ share²) of ten balanced classes (0.27 here).
    #[test]
    fn permutes_a_fraction_and_keeps_the_counts() {
        let labels: Vec<u8> = (0..10_000).map(|i| (i % 10) as u8).collect();
        let noisy = permute_labels(&labels, 0.3, 7);
        assert_eq!(noisy, permute_labels(&labels, 0.3, 7));
        assert_ne!(noisy, permute_labels(&labels, 0.3, 8));
        let count = |l: &[u8], c: u8| l.iter().filter(|&&x| x == c).count();
        for c in 0..10 {
            assert_eq!(count(&noisy, c), count(&labels, c));
        }
        let changed = labels.iter().zip(&noisy).filter(|(a, b)| a != b).count();
        // Expected 0.3·0.9·10000 = 2700; binomial-like spread ≈ √(3000·0.09) ≈ 16.
        assert!((2600..=2800).contains(&changed), "{changed}");
        assert_eq!(permute_labels(&labels, 0.0, 7), labels);
    }
}
