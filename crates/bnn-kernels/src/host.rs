//! FFI to the host build of `kernels/sampler_math.h` (see `build.rs`), used by the
//! equivalence tests between the CUDA kernels' math and the Rust CPU op.

extern "C" {
    fn bnn_host_normals(seed: u64, step: u64, param: u32, n: u32, out: *mut f32);
    #[allow(clippy::too_many_arguments)]
    fn bnn_host_step(
        kind: i32,
        theta: *mut f32,
        v: *mut f32,
        g: *const f32,
        n: u32,
        seed: u64,
        step: u64,
        param: u32,
        step_size: f32,
        decay: f32,
        post: f32,
        noise_scale: f32,
        virial: *mut f64,
    ) -> f64;
    #[allow(clippy::too_many_arguments)]
    fn bnn_host_thermostat_step(
        theta: *mut f32,
        v: *mut f32,
        alpha: *mut f32,
        g: *const f32,
        n: u32,
        seed: u64,
        step: u64,
        param: u32,
        step_size: f32,
        noise_scale: f32,
        splitting: i32,
        sum_alpha: *mut f64,
        virial: *mut f64,
    ) -> f64;
}

use super::{StepConsts, TensorSums, Update};
use crate::rng::NoiseKey;

/// The header's normals for elements `0..out.len()` of a noise stream.
pub fn normals(key: NoiseKey, out: &mut [f32]) {
    let n = u32::try_from(out.len()).expect("fewer than 2³² elements");
    // SAFETY: `out` is valid for `n` writes; the C function writes exactly `n` floats.
    unsafe { bnn_host_normals(key.seed, key.step, key.param, n, out.as_mut_ptr()) }
}

/// The header's update of a whole tensor; returns Σ v² and Σθ·∇, summed in element order.
pub fn step(
    update: Update,
    theta: &mut [f32],
    momentum: &mut [f32],
    grad: &[f32],
    key: NoiseKey,
    c: StepConsts,
) -> TensorSums {
    let n = u32::try_from(theta.len()).expect("fewer than 2³² elements");
    assert_eq!(grad.len(), theta.len());
    let kind = match update {
        Update::Sgld => 0,
        Update::Momentum => {
            assert_eq!(momentum.len(), theta.len());
            1
        }
        Update::Thermostat { .. } => panic!("the mSGNHT update is `thermostat_step`"),
    };
    let mut virial = 0f64;
    // SAFETY: all three buffers hold `n` floats (checked above; the momentum is only
    // touched for kind 1, where its length is checked); `virial` is one double.
    let sum_sq = unsafe {
        bnn_host_step(
            kind,
            theta.as_mut_ptr(),
            momentum.as_mut_ptr(),
            grad.as_ptr(),
            n,
            key.seed,
            key.step,
            key.param,
            c.step_size,
            c.decay,
            c.post,
            c.noise_scale,
            &mut virial,
        )
    };
    TensorSums {
        sum_sq,
        sum_thermostat: 0.0,
        virial,
    }
}

/// The header's mSGNHT update (per-element thermostat) of a whole tensor; returns
/// (Σv², Σα) after it and Σθ·∇ before it, summed in element order.
pub fn thermostat_step(
    theta: &mut [f32],
    momentum: &mut [f32],
    alpha: &mut [f32],
    grad: &[f32],
    key: NoiseKey,
    c: StepConsts,
    splitting: bool,
) -> TensorSums {
    let n = u32::try_from(theta.len()).expect("fewer than 2³² elements");
    assert!(
        grad.len() == theta.len() && momentum.len() == theta.len() && alpha.len() == theta.len()
    );
    let (mut sum_alpha, mut virial) = (0f64, 0f64);
    // SAFETY: the four buffers hold `n` floats (checked above), `sum_alpha` and `virial`
    // one double each.
    let sum_sq = unsafe {
        bnn_host_thermostat_step(
            theta.as_mut_ptr(),
            momentum.as_mut_ptr(),
            alpha.as_mut_ptr(),
            grad.as_ptr(),
            n,
            key.seed,
            key.step,
            key.param,
            c.step_size,
            c.noise_scale,
            i32::from(splitting),
            &mut sum_alpha,
            &mut virial,
        )
    };
    TensorSums {
        sum_sq,
        sum_thermostat: sum_alpha,
        virial,
    }
}
