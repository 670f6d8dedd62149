//! The step plan's test fixtures, shared by the CPU suite (`tests/suite/plan.rs`,
//! `plan_ensemble.rs`) and the GPU tests (`tests/gpu/plan.rs`): the resident rows, the
//! chains' minibatch orders, the samplers' parameters with an integrator.

use bnn::data::load_builtin;
use bnn::sampler::{Integrator, SamplerKind, SamplerParams};

/// Updates of an epoch in the plan's tests.
pub const UPDATES: usize = 50;
/// B.
pub const BATCH: usize = 100;
/// Training rows held: 2,000 of the subset (an index row repeats them).
pub const ROWS: usize = 2000;

/// The subset's first ROWS training images as f32 rows and their labels.
pub fn resident() -> (Vec<f32>, Vec<u32>) {
    let ds = load_builtin().unwrap();
    let (mut x, mut y) = (Vec::new(), Vec::new());
    ds.train
        .gather(&(0..ROWS).collect::<Vec<_>>(), &mut x, &mut y);
    (x, y)
}

/// The built-in test set's features and labels (MNIST's 10,000 rows), a held-out set.
pub fn test_rows() -> (Vec<f32>, Vec<u32>) {
    let ds = load_builtin().unwrap();
    let all: Vec<usize> = (0..ds.test.len()).collect();
    let (mut x, mut y) = (Vec::new(), Vec::new());
    ds.test.gather(&all, &mut x, &mut y);
    (x, y)
}

/// Chain k's minibatch rows: a fixed permutation walk over ROWS, different per chain.
pub fn order(k: usize) -> Vec<usize> {
    (0..UPDATES * BATCH)
        .map(|i| (i * 7919 + k * 131) % ROWS)
        .collect()
}

/// `kind`'s default parameters with `integrator` (where it has one).
pub fn params(kind: SamplerKind, integrator: Integrator) -> SamplerParams {
    match SamplerParams::defaults(kind).unwrap() {
        SamplerParams::Sghmc {
            step_size,
            friction,
            noise_estimate,
            ..
        } => SamplerParams::Sghmc {
            step_size,
            friction,
            noise_estimate,
            integrator,
        },
        SamplerParams::Sgnht {
            step_size,
            diffusion,
            ..
        } => SamplerParams::Sgnht {
            step_size,
            diffusion,
            integrator,
        },
        SamplerParams::Msgnht {
            step_size,
            diffusion,
            ..
        } => SamplerParams::Msgnht {
            step_size,
            diffusion,
            integrator,
        },
        other => other,
    }
}
