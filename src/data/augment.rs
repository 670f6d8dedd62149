//! Data augmentation (`--augment`): each training image of a minibatch moved by a random
//! shift of up to 2 pixels in each direction (the blank border fills in) and, for
//! datasets whose mirror images are the same class (Fashion-MNIST's clothes, not digits),
//! mirrored left–right with probability 1/2. Applied to the bytes before scaling or
//! standardisation, so that a standardised pixel is standardised where it lands.
//!
//! This changes the likelihood: the posterior is over a model of the augmented data, one
//! of the explanations offered for the "cold posterior" effect (Wenzel et al. 2020;
//! Izmailov et al. 2021 found that without augmentation T = 1 is not worse). Off by
//! default; the run records it.

use rand::{Rng, SeedableRng};

use super::Split;

/// Largest shift, in pixels, in each direction.
pub const MAX_SHIFT: i64 = 2;

/// What an augmented minibatch gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Augment {
    /// Mirror left–right with probability 1/2.
    pub flip: bool,
}

impl Augment {
    /// The augmentation for dataset `name`: flips only where a mirror image keeps its
    /// class (Fashion-MNIST).
    pub fn for_dataset(name: &str) -> Self {
        Augment {
            flip: name.starts_with("fashion"),
        }
    }
}

/// As [`Split::gather`], each image shifted (and maybe mirrored) at random: the draws of
/// row k from a generator seeded `seed`, in row order, so that a minibatch's
/// augmentation is fixed by the seed.
pub fn gather_augmented(
    split: &Split,
    indices: &[usize],
    aug: Augment,
    seed: u64,
    x: &mut Vec<f32>,
    y: &mut Vec<u32>,
) {
    let (rows, cols) = (split.rows, split.cols);
    let d = rows * cols;
    y.clear();
    y.extend(indices.iter().map(|&i| split.labels[i] as u32));
    x.resize(indices.len() * d, 0.0);
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut moved = vec![0u8; d];
    let std = split.standardization.as_deref();
    for (out, &i) in x.chunks_exact_mut(d).zip(indices) {
        let dy = rng.random_range(-MAX_SHIFT..=MAX_SHIFT);
        let dx = rng.random_range(-MAX_SHIFT..=MAX_SHIFT);
        let flip = aug.flip && rng.random::<bool>();
        let image = &split.images[i * d..(i + 1) * d];
        for (r, line) in moved.chunks_exact_mut(cols).enumerate() {
            for (c, px) in line.iter_mut().enumerate() {
                let c = if flip { cols - 1 - c } else { c };
                let (sr, sc) = (r as i64 - dy, c as i64 - dx);
                let inside = (0..rows as i64).contains(&sr) && (0..cols as i64).contains(&sc);
                *px = if inside {
                    image[sr as usize * cols + sc as usize]
                } else {
                    0
                };
            }
        }
        match std {
            None => out
                .iter_mut()
                .zip(&moved)
                .for_each(|(o, &p)| *o = p as f32 / 255.0),
            Some(s) => {
                for (((o, &p), &m), &sd) in out.iter_mut().zip(&moved).zip(&s.mean).zip(&s.std) {
                    *o = (p as f32 / 255.0 - m) / sd;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(images: Vec<u8>, n: usize) -> Split {
        Split {
            images,
            labels: vec![3; n],
            rows: 6,
            cols: 6,
            standardization: None,
        }
    }

    /// A blob inside the 2-pixel margin keeps its mass under every shift and flip; the
    /// shifts cover −2..=2 in both directions and flips happen only where asked for.
    #[test]
    fn shifts_keep_the_image_and_cover_the_range() {
        let mut img = [0u8; 36];
        img[2 * 6 + 2] = 255;
        img[3 * 6 + 3] = 51;
        let s = split(img.repeat(400), 400);
        let idx: Vec<usize> = (0..400).collect();
        let (mut x, mut y) = (Vec::new(), Vec::new());
        let mut seen = std::collections::HashSet::new();
        for aug in [Augment { flip: false }, Augment { flip: true }] {
            gather_augmented(&s, &idx, aug, 7, &mut x, &mut y);
            for row in x.chunks_exact(36) {
                let mass: f32 = row.iter().sum();
                assert!((mass - 306.0 / 255.0).abs() < 1e-6, "{mass}");
                let at = row.iter().position(|&v| v == 1.0).unwrap();
                let (r, c) = (at / 6, at % 6);
                // The bright pixel's partner (one down, one right, or left if mirrored).
                let partner = row[(r + 1) * 6 + if c + 1 < 6 { c + 1 } else { 0 }] > 0.0;
                seen.insert((aug.flip, r, c, partner));
            }
            assert_eq!(y, vec![3; 400]);
        }
        // Unmirrored: the bright pixel lands on every (2 + dy, 2 + dx), its partner right.
        for r in 0..5 {
            for c in 0..5 {
                assert!(
                    seen.contains(&(false, r, c, true)),
                    "({r}, {c}) not reached"
                );
            }
        }
        assert!(!seen.iter().any(|&(flip, _, _, partner)| !flip && !partner));
        // Mirrored images occur with flips on: the partner then lies to the left.
        assert!(seen.iter().any(|&(flip, _, _, partner)| flip && !partner));
        // The same seed, the same minibatch.
        let mut again = Vec::new();
        gather_augmented(&s, &idx, Augment { flip: true }, 7, &mut again, &mut y);
        assert_eq!(again, x);
    }
}
