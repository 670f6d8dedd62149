//! Built-in toy data sets, seeded: the picture every BNN user draws first.
//!
//! `regression-1d`: y = sin(3x) + ε, ε ~ N(0, 0.1²), with x uniform on two separated
//! intervals [−1, −0.3] ∪ [0.3, 1] and nothing in between: a network's predictive band
//! should widen in the gap and beyond ±1, where there is no data.

use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Normal};

use super::table::Table;
use crate::error::{Error, Result};

/// The toys there are.
pub const TOYS: [&str; 1] = ["regression-1d"];

/// The noise σ of `regression-1d`.
pub const REGRESSION_1D_NOISE: f64 = 0.1;

/// Training rows of `regression-1d` (and as many test rows).
pub const REGRESSION_1D_ROWS: usize = 200;

/// The training and test tables of toy `name`, seeded with `seed`.
pub fn make(name: &str, seed: u64) -> Result<(Table, Table)> {
    match name {
        "regression-1d" => Ok((regression_1d(seed, 0), regression_1d(seed, 1))),
        _ => Err(Error::Config(format!(
            "unknown toy `{name}`; the toys: {}",
            TOYS.join(", ")
        ))),
    }
}

/// The truth of `regression-1d`, without noise.
pub(crate) fn regression_1d_mean(x: f64) -> f64 {
    (3.0 * x).sin()
}

fn regression_1d(seed: u64, part: u64) -> Table {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ (0x7019 + part));
    let noise = Normal::new(0.0, REGRESSION_1D_NOISE).expect("a positive σ");
    let (mut x, mut y) = (Vec::new(), Vec::new());
    for _ in 0..REGRESSION_1D_ROWS {
        let u: f64 = rng.random_range(0.3..1.0);
        let v = if rng.random_bool(0.5) { u } else { -u };
        x.push(v);
        y.push(regression_1d_mean(v) + noise.sample(&mut rng));
    }
    Table {
        features: vec!["x".into()],
        target: "y".into(),
        x,
        y,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_toy_leaves_a_gap_and_is_seeded() {
        let (train, test) = make("regression-1d", 3).unwrap();
        assert_eq!(train.rows(), REGRESSION_1D_ROWS);
        assert!(train.x.iter().all(|x| (0.3..=1.0).contains(&x.abs())));
        assert!(train.x.iter().any(|&x| x < 0.0) && train.x.iter().any(|&x| x > 0.0));
        assert_ne!(train.x, test.x);
        assert_eq!(make("regression-1d", 3).unwrap().0, train);
        assert!(make("nope", 0).is_err());
    }
}
