//! Data augmentation (`--augment [shift-flip|shift|flip]`): each training image of a
//! minibatch moved by a random shift of up to 2 pixels in each direction (the blank
//! border fills in) and, for datasets whose mirror images are the same class
//! (Fashion-MNIST's clothes, not digits), mirrored left–right with probability 1/2; or
//! only one of the two. Applied to the bytes before scaling or standardisation, so that
//! a standardised pixel is standardised where it lands.
//!
//! This changes the likelihood: the posterior is over a model of the augmented data, one
//! of the explanations offered for the "cold posterior" effect (Wenzel et al. 2020;
//! Izmailov et al. 2021 found that without augmentation T = 1 is not worse). Off by
//! default; the run records it.

use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use super::Split;
use crate::error::{Error, Result};

/// What `--augment` asks for (a run records it; `augment = true` in older runs and
/// presets reads as `shift-flip`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
#[serde(rename_all = "kebab-case", try_from = "Spelling")]
pub enum Augmentation {
    /// No augmentation: the likelihood of the data as they are.
    #[default]
    None,
    /// Shifts, and flips where mirror images keep their class (`--augment` alone).
    ShiftFlip,
    /// Shifts only.
    Shift,
    /// Left–right flips only (datasets whose mirror images keep their class).
    Flip,
}

/// How a run file or preset may spell an [`Augmentation`]: a name, or the boolean of
/// the runs made before there was a choice.
#[derive(Deserialize)]
#[serde(untagged)]
enum Spelling {
    Bool(bool),
    Name(String),
}

impl TryFrom<Spelling> for Augmentation {
    type Error = String;
    fn try_from(s: Spelling) -> std::result::Result<Self, String> {
        Ok(match s {
            Spelling::Bool(false) => Augmentation::None,
            Spelling::Bool(true) => Augmentation::ShiftFlip,
            Spelling::Name(n) => match n.as_str() {
                "none" => Augmentation::None,
                "shift-flip" => Augmentation::ShiftFlip,
                "shift" => Augmentation::Shift,
                "flip" => Augmentation::Flip,
                _ => {
                    return Err(format!(
                        "augment = {n:?}: expected \"shift-flip\", \"shift\", \"flip\", \"none\" or a boolean"
                    ))
                }
            },
        })
    }
}

impl Augmentation {
    /// Whether it leaves images unchanged.
    pub fn is_none(&self) -> bool {
        *self == Augmentation::None
    }

    /// What a minibatch of dataset `name` gets (`None`: no augmentation); an error for
    /// flips alone on a dataset whose mirror images change class.
    pub fn for_dataset(self, name: &str) -> Result<Option<Augment>> {
        let mirrors = name.starts_with("fashion");
        Ok(match self {
            Augmentation::None => None,
            Augmentation::ShiftFlip => Some(Augment {
                shift: true,
                flip: mirrors,
            }),
            Augmentation::Shift => Some(Augment {
                shift: true,
                flip: false,
            }),
            Augmentation::Flip if mirrors => Some(Augment {
                shift: false,
                flip: true,
            }),
            Augmentation::Flip => {
                return Err(Error::Config(format!(
                    "--augment flip on {name}: a mirrored digit is not the same digit; use --augment shift"
                )))
            }
        })
    }
}

/// Largest shift, in pixels, in each direction.
pub const MAX_SHIFT: i64 = 2;

/// What an augmented minibatch gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Augment {
    /// Shift by up to [`MAX_SHIFT`] pixels in each direction.
    pub shift: bool,
    /// Mirror left–right with probability 1/2.
    pub flip: bool,
}

/// As [`Split::gather`], each image shifted and/or mirrored at random: the draws of row
/// k from a generator seeded `seed`, in row order, so that a minibatch's augmentation is
/// fixed by the seed. Shifts are drawn whether or not they are applied, so that flips
/// alone fall on the same images as with shifts.
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
        let (dy, dx) = (
            rng.random_range(-MAX_SHIFT..=MAX_SHIFT),
            rng.random_range(-MAX_SHIFT..=MAX_SHIFT),
        );
        let (dy, dx) = if aug.shift { (dy, dx) } else { (0, 0) };
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
            features: Vec::new(),
            values: Vec::new(),
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
        for flip in [false, true] {
            let aug = Augment { shift: true, flip };
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
        let both = Augment {
            shift: true,
            flip: true,
        };
        gather_augmented(&s, &idx, both, 7, &mut again, &mut y);
        assert_eq!(again, x);
        // Flips alone: the blob stays in its row and is mirrored or not, nothing else.
        let flips = Augment {
            shift: false,
            flip: true,
        };
        gather_augmented(&s, &idx, flips, 7, &mut again, &mut y);
        let mut mirrored = img;
        for line in mirrored.chunks_exact_mut(6) {
            line.reverse();
        }
        let (plain, mirror) = (scaled(&img), scaled(&mirrored));
        let mut count = [0; 2];
        for row in again.chunks_exact(36) {
            let is_mirror = row == mirror.as_slice();
            assert!(is_mirror || row == plain.as_slice());
            count[is_mirror as usize] += 1;
        }
        // 400 fair coin flips: each side within 200 ± 5σ (σ = 10).
        assert!(count.iter().all(|&c| (150..=250).contains(&c)), "{count:?}");
    }

    fn scaled(img: &[u8]) -> Vec<f32> {
        img.iter().map(|&p| p as f32 / 255.0).collect()
    }

    #[test]
    fn spellings_and_datasets() {
        let read = |s: &str| serde_json::from_str::<Augmentation>(s);
        assert_eq!(read("true").unwrap(), Augmentation::ShiftFlip);
        assert_eq!(read("false").unwrap(), Augmentation::None);
        assert_eq!(read("\"flip\"").unwrap(), Augmentation::Flip);
        assert!(read("\"rotate\"").is_err());
        assert_eq!(
            serde_json::to_string(&Augmentation::ShiftFlip).unwrap(),
            "\"shift-flip\""
        );
        let digits = Augmentation::ShiftFlip
            .for_dataset("mnist")
            .unwrap()
            .unwrap();
        assert!(digits.shift && !digits.flip);
        let clothes = Augmentation::Flip
            .for_dataset("fashion-mnist")
            .unwrap()
            .unwrap();
        assert!(!clothes.shift && clothes.flip);
        assert!(Augmentation::Flip.for_dataset("mnist").is_err());
        assert_eq!(Augmentation::None.for_dataset("mnist").unwrap(), None);
    }
}
