//! Launches of the CUDA kernels (`kernels/sampler_step.cu`, compiled to PTX by build.rs)
//! from the fused op's `cuda_fwd`.

use candle_core::cuda_backend::cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};
use candle_core::cuda_backend::WrapErr;
use candle_core::{backend::BackendStorage, CudaStorage, Layout};

use super::{StepConsts, Update};
use crate::rng::NoiseKey;

const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/sampler_step.ptx"));
const MODULE: &str = "bnn_sampler_step";
const THREADS: u32 = 256; // BNN_THREADS in the kernel

/// One fused update of the tensor in `theta` (destination) with `grad`; `momentum` is
/// `None` for SGLD, `thermostat` holds mSGNHT's αᵢ. Returns Σ v² (0 for SGLD) and, for
/// mSGNHT, Σ α after the update (else 0).
#[allow(clippy::too_many_arguments)]
pub fn step(
    update: Update,
    theta: &mut CudaStorage,
    theta_layout: &Layout,
    grad: &CudaStorage,
    grad_layout: &Layout,
    momentum: Option<&mut CudaSlice<f32>>,
    thermostat: Option<&mut CudaSlice<f32>>,
    key: NoiseKey,
    c: StepConsts,
) -> candle_core::Result<(f64, f64)> {
    let Some((a, b)) = theta_layout.contiguous_offsets() else {
        candle_core::bail!("fused sampler step: parameter is not contiguous");
    };
    let Some((ga, gb)) = grad_layout.contiguous_offsets() else {
        candle_core::bail!("fused sampler step: gradient is not contiguous");
    };
    let n = (b - a) as u64;
    if gb - ga != b - a {
        candle_core::bail!("fused sampler step: gradient of the wrong length");
    }
    let dev = theta.device().clone();
    let grad = grad.as_cuda_slice::<f32>()?.slice(ga..gb);
    let mut theta = theta.as_cuda_slice_mut::<f32>()?.slice_mut(a..b);
    let blocks = n.div_ceil(4);
    let grid = blocks.div_ceil(THREADS as u64).clamp(1, 65_535) as u32;
    let cfg = LaunchConfig {
        grid_dim: (grid, 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    match (update, momentum) {
        (Update::Sgld, _) => {
            let func = dev.get_or_load_custom_func("bnn_sgld_kernel", MODULE, PTX)?;
            let mut builder = func.builder();
            builder.arg(&mut theta);
            builder.arg(&grad);
            builder.arg(&n);
            builder.arg(&key.param);
            builder.arg(&key.seed);
            builder.arg(&key.step);
            builder.arg(&c.step_size);
            builder.arg(&c.noise_scale);
            // SAFETY: the argument list matches `bnn_sgld_kernel`'s signature and every
            // pointer covers `n` floats.
            unsafe { builder.launch(cfg) }.w()?;
            Ok((0.0, 0.0))
        }
        (Update::Momentum, Some(momentum)) => {
            if momentum.len() as u64 != n {
                candle_core::bail!("fused sampler step: momentum of the wrong length");
            }
            let mut sum = dev.alloc_zeros::<f64>(1)?;
            let func = dev.get_or_load_custom_func("bnn_momentum_kernel", MODULE, PTX)?;
            let mut builder = func.builder();
            builder.arg(&mut theta);
            builder.arg(momentum);
            builder.arg(&grad);
            builder.arg(&n);
            builder.arg(&key.param);
            builder.arg(&key.seed);
            builder.arg(&key.step);
            builder.arg(&c.step_size);
            builder.arg(&c.decay);
            builder.arg(&c.post);
            builder.arg(&c.noise_scale);
            builder.arg(&mut sum);
            // SAFETY: the argument list matches `bnn_momentum_kernel`'s signature, every
            // pointer covers `n` floats and `sum` one double.
            unsafe { builder.launch(cfg) }.w()?;
            Ok((dev.clone_dtoh(&sum)?[0], 0.0))
        }
        (Update::Momentum, None) => {
            candle_core::bail!("fused sampler step: the momentum is not on the GPU")
        }
        (Update::Thermostat { splitting }, Some(momentum)) => {
            let Some(alpha) = thermostat else {
                candle_core::bail!("fused sampler step: the thermostats are not on the GPU")
            };
            if momentum.len() as u64 != n || alpha.len() as u64 != n {
                candle_core::bail!("fused sampler step: sampler state of the wrong length");
            }
            let mut sums = dev.alloc_zeros::<f64>(2)?;
            let splitting = i32::from(splitting);
            let func = dev.get_or_load_custom_func("bnn_thermostat_kernel", MODULE, PTX)?;
            let mut builder = func.builder();
            builder.arg(&mut theta);
            builder.arg(momentum);
            builder.arg(alpha);
            builder.arg(&grad);
            builder.arg(&n);
            builder.arg(&key.param);
            builder.arg(&key.seed);
            builder.arg(&key.step);
            builder.arg(&c.step_size);
            builder.arg(&c.noise_scale);
            builder.arg(&splitting);
            builder.arg(&mut sums);
            // SAFETY: the argument list matches `bnn_thermostat_kernel`'s signature, every
            // pointer covers `n` floats and `sums` two doubles.
            unsafe { builder.launch(cfg) }.w()?;
            let sums = dev.clone_dtoh(&sums)?;
            Ok((sums[0], sums[1]))
        }
        (Update::Thermostat { .. }, None) => {
            candle_core::bail!("fused sampler step: the momentum is not on the GPU")
        }
    }
}
