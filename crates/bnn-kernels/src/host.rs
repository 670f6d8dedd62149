//! FFI to the host build of `kernels/sampler_math.h` (see `build.rs`), used by the
//! equivalence tests between the CUDA kernels' math and the Rust CPU op.

extern "C" {
    fn bnn_host_normals(seed: u64, step: u64, param: u32, n: u32, out: *mut f32);
    #[allow(clippy::too_many_arguments)]
    fn bnn_host_update(
        rule: i32,
        theta: *mut f32,
        s0: *mut f32,
        s1: *mut f32,
        g: *const f32,
        n: u32,
        seed: u64,
        step: u64,
        param: u32,
        consts: *const f32,
        sums: *mut f64,
    );
}

use super::{StepConsts, TensorSums, Update};
use crate::rng::NoiseKey;

/// The header's normals for elements `0..out.len()` of a noise stream.
pub fn normals(key: NoiseKey, out: &mut [f32]) {
    let n = u32::try_from(out.len()).expect("fewer than 2³² elements");
    // SAFETY: `out` is valid for `n` writes; the C function writes exactly `n` floats.
    unsafe { bnn_host_normals(key.seed, key.step, key.param, n, out.as_mut_ptr()) }
}

/// The header's update of a whole tensor, as the CUDA kernels run it (`bnn_update_blocks`):
/// θ with its momentum (empty for SGLD) and mSGNHT's αᵢ (empty but for the thermostat
/// update); returns (Σv², Σα) after it and Σθ·∇ before it, summed in element order.
pub fn update(
    update: Update,
    theta: &mut [f32],
    momentum: &mut [f32],
    alpha: &mut [f32],
    grad: &[f32],
    key: NoiseKey,
    c: StepConsts,
) -> TensorSums {
    let n = u32::try_from(theta.len()).expect("fewer than 2³² elements");
    assert_eq!(grad.len(), theta.len());
    // The state the rule reads (null pointers for the rest, as the kernels are given).
    let (v, a) = update.states();
    assert!(
        !v || momentum.len() == theta.len(),
        "momentum of the wrong length"
    );
    assert!(
        !a || alpha.len() == theta.len(),
        "thermostats of the wrong length"
    );
    let pointer = |on: bool, b: &mut [f32]| match on {
        true => b.as_mut_ptr(),
        false => std::ptr::null_mut(),
    };
    let consts = [c.step_size, c.decay, c.post, c.noise_scale];
    let mut sums = [0f64; 3];
    // SAFETY: θ and ∇ hold `n` floats, and so do the state buffers passed (checked above;
    // the others are null, which the rule does not read); `consts` is 4 floats and `sums`
    // 3 doubles.
    unsafe {
        bnn_host_update(
            update.rule(),
            theta.as_mut_ptr(),
            pointer(v, momentum),
            pointer(a, alpha),
            grad.as_ptr(),
            n,
            key.seed,
            key.step,
            key.param,
            consts.as_ptr(),
            sums.as_mut_ptr(),
        )
    };
    TensorSums {
        sum_sq: sums[0],
        sum_thermostat: sums[1],
        virial: sums[2],
    }
}
