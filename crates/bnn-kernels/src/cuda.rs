//! Launches of the CUDA kernels (`kernels/sampler_step.cu`, compiled to PTX by build.rs)
//! from the fused ops' `cuda_fwd`: one tensor ([`step`]), or one stacked tensor of K
//! chains in one launch ([`stacked_step`]).

use candle_core::cuda_backend::cudarc::driver::{
    CudaSlice, CudaStream, DevicePtrMut, LaunchConfig, PushKernelArg, SyncOnDrop,
};
use candle_core::cuda_backend::{CudaDevice, WrapErr};
use candle_core::{backend::BackendStorage, CudaStorage, Layout};

use super::buffer::StateBuffer;
use super::{LentUpdate, TensorSums};

const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/sampler_step.ptx"));
const MODULE: &str = "bnn_sampler_step";
const THREADS: u32 = 256; // BNN_THREADS in the kernel

/// The launch of `chains` × (a tensor of `n` elements): 4-element blocks over 256 threads,
/// at most 65,535 thread blocks per chain (grid-stride beyond).
fn launch_config(n: u64, chains: u32) -> LaunchConfig {
    let grid = n.div_ceil(4).div_ceil(THREADS as u64).clamp(1, 65_535) as u32;
    LaunchConfig {
        grid_dim: (grid, chains, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// θ's and ∇'s contiguous element ranges, checked to be of one length.
fn ranges(tl: &Layout, gl: &Layout) -> candle_core::Result<((usize, usize), (usize, usize))> {
    let Some(t) = tl.contiguous_offsets() else {
        candle_core::bail!("fused sampler step: parameter is not contiguous");
    };
    let Some(g) = gl.contiguous_offsets() else {
        candle_core::bail!("fused sampler step: gradient is not contiguous");
    };
    if g.1 - g.0 != t.1 - t.0 {
        candle_core::bail!("fused sampler step: gradient of the wrong length");
    }
    Ok((t, g))
}

/// A lent state buffer on the GPU, of `n` values.
fn on_gpu<'b>(
    buffer: Option<&'b mut &mut StateBuffer>,
    n: u64,
    what: &str,
) -> candle_core::Result<&'b mut CudaSlice<f32>> {
    match buffer {
        Some(StateBuffer::Cuda(s)) if s.len() as u64 == n => Ok(s),
        Some(StateBuffer::Cuda(_)) => {
            candle_core::bail!("fused sampler step: {what} of the wrong length")
        }
        _ => candle_core::bail!("fused sampler step: the {what} is not on the GPU"),
    }
}

/// The null device pointer, for a state buffer the rule does not read.
const NULL: u64 = 0;

/// One fused update of the tensor in `theta` (destination) with `grad`, by the update
/// `lane` lends. Returns its sums: Σ v² (0 for SGLD) and, for mSGNHT, Σ α after the update
/// (else 0), and Σθ·∇ before it.
pub fn step(
    theta: &mut CudaStorage,
    theta_layout: &Layout,
    grad: &CudaStorage,
    grad_layout: &Layout,
    lane: &mut LentUpdate<'_>,
) -> candle_core::Result<TensorSums> {
    let ((a, b), (ga, gb)) = ranges(theta_layout, grad_layout)?;
    let n = (b - a) as u64;
    let dev = theta.device().clone();
    let grad = grad.as_cuda_slice::<f32>()?.slice(ga..gb);
    let mut theta = theta.as_cuda_slice_mut::<f32>()?.slice_mut(a..b);
    let (key, c, rule) = (lane.key, lane.consts, lane.update.rule());
    let (has_v, has_alpha) = lane.update.states();
    // [Σv², Σα, Σθ·∇], reduced by the kernel.
    let mut sums = dev.alloc_zeros::<f64>(3)?;
    let func = dev.get_or_load_custom_func("bnn_step_kernel", MODULE, PTX)?;
    let mut builder = func.builder();
    builder.arg(&rule);
    builder.arg(&mut theta);
    match has_v {
        true => builder.arg(on_gpu(lane.momentum.as_mut(), n, "momentum")?),
        false => builder.arg(&NULL),
    };
    match has_alpha {
        true => builder.arg(on_gpu(lane.thermostat.as_mut(), n, "thermostats")?),
        false => builder.arg(&NULL),
    };
    builder.arg(&grad);
    builder.arg(&n);
    builder.arg(&key.param);
    builder.arg(&key.seed);
    builder.arg(&key.step);
    builder.arg(&c.step_size);
    builder.arg(&c.decay);
    builder.arg(&c.post);
    builder.arg(&c.noise_scale);
    builder.arg(&mut sums);
    // SAFETY: the argument list matches `bnn_step_kernel`'s signature; θ, ∇ and every
    // state buffer the rule reads cover `n` floats (the others are null, which the rule
    // does not read), and `sums` three doubles.
    unsafe { builder.launch(launch_config(n, 1)) }.w()?;
    Ok(sums_of(&dev.clone_dtoh(&sums)?)[0])
}

/// Each chain's [Σv², Σα, Σθ·∇] as the kernels reduce them, three doubles a chain.
fn sums_of(raw: &[f64]) -> Vec<TensorSums> {
    raw.chunks_exact(3)
        .map(|s| TensorSums {
            sum_sq: s[0],
            sum_thermostat: s[1],
            virial: s[2],
        })
        .collect()
}

/// The device addresses of each lane's momentum (with `momenta`) and αᵢ (with
/// `thermostats`), each buffer of `n` values, uploaded as tables; and the guards that
/// order `stream`'s use of the buffers, to be dropped after the launch is queued.
type Addresses<'b> = (
    Option<CudaSlice<u64>>,
    Option<CudaSlice<u64>>,
    Vec<SyncOnDrop<'b>>,
);

fn addresses<'b>(
    dev: &CudaDevice,
    stream: &'b CudaStream,
    lanes: &'b mut [LentUpdate<'_>],
    (momenta, thermostats): (bool, bool),
    n: u64,
) -> candle_core::Result<Addresses<'b>> {
    let (mut vs, mut alphas, mut guards) = (Vec::new(), Vec::new(), Vec::new());
    for lane in lanes.iter_mut() {
        let LentUpdate {
            momentum,
            thermostat,
            ..
        } = lane;
        if momenta {
            let v = on_gpu(momentum.as_mut(), n, "momentum")?;
            let (pointer, guard) = v.device_ptr_mut(stream);
            vs.push(pointer);
            guards.push(guard);
        }
        if thermostats {
            let alpha = on_gpu(thermostat.as_mut(), n, "thermostats")?;
            let (pointer, guard) = alpha.device_ptr_mut(stream);
            alphas.push(pointer);
            guards.push(guard);
        }
    }
    let table = |on: bool, pointers: &[u64]| -> candle_core::Result<Option<CudaSlice<u64>>> {
        Ok(match on {
            true => Some(dev.clone_htod(pointers)?),
            false => None,
        })
    };
    Ok((table(momenta, &vs)?, table(thermostats, &alphas)?, guards))
}

/// One fused update of K chains' tensors stacked in `theta` (K, …), destination, with
/// their gradients `grad` (K, …), in one launch: chain k's row by the update `lanes[k]`
/// lends (its noise key, constants and state buffers). Returns each chain's sums.
pub fn stacked_step(
    theta: &mut CudaStorage,
    theta_layout: &Layout,
    grad: &CudaStorage,
    grad_layout: &Layout,
    lanes: &mut [LentUpdate<'_>],
) -> candle_core::Result<Vec<TensorSums>> {
    let ((a, b), (ga, gb)) = ranges(theta_layout, grad_layout)?;
    let k = lanes.len();
    let Some(update) = lanes.first().map(|l| l.update) else {
        return Ok(Vec::new());
    };
    if lanes
        .iter()
        .any(|l| l.update != update || l.key.step != lanes[0].key.step)
    {
        candle_core::bail!("stacked sampler step: the chains' updates differ");
    }
    if (b - a) % k != 0 {
        candle_core::bail!("stacked sampler step: {} values for {k} chains", b - a);
    }
    let n = ((b - a) / k) as u64;
    let dev = theta.device().clone();
    let grad = grad.as_cuda_slice::<f32>()?.slice(ga..gb);
    let mut theta = theta.as_cuda_slice_mut::<f32>()?.slice_mut(a..b);
    let seeds = dev.clone_htod(&lanes.iter().map(|l| l.key.seed).collect::<Vec<u64>>())?;
    let consts: Vec<f32> = lanes
        .iter()
        .flat_map(|l| {
            let c = l.consts;
            [c.step_size, c.decay, c.post, c.noise_scale]
        })
        .collect();
    let consts = dev.clone_htod(&consts)?;
    let (param, step, rule) = (lanes[0].key.param, lanes[0].key.step, update.rule());
    let mut sums = dev.alloc_zeros::<f64>(3 * k)?;
    let stream = dev.cuda_stream();
    let (momenta, alphas, _guards) = addresses(&dev, &stream, lanes, update.states(), n)?;
    let func = dev.get_or_load_custom_func("bnn_step_stacked_kernel", MODULE, PTX)?;
    let mut builder = func.builder();
    builder.arg(&rule);
    builder.arg(&mut theta);
    match &momenta {
        Some(table) => builder.arg(table),
        None => builder.arg(&NULL),
    };
    match &alphas {
        Some(table) => builder.arg(table),
        None => builder.arg(&NULL),
    };
    builder.arg(&grad);
    builder.arg(&n);
    builder.arg(&param);
    builder.arg(&seeds);
    builder.arg(&step);
    builder.arg(&consts);
    builder.arg(&mut sums);
    // SAFETY: the argument list matches `bnn_step_stacked_kernel`'s signature; θ and ∇
    // cover K·n floats, `seeds` K values, `consts` 4K, `sums` 3K doubles, and each table
    // the rule reads K addresses of n floats (checked by `addresses`; the others null).
    unsafe { builder.launch(launch_config(n, k as u32)) }.w()?;
    Ok(sums_of(&dev.clone_dtoh(&sums)?))
}
