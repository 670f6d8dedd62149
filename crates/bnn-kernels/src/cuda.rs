//! Launches of the CUDA kernels (`kernels/sampler_step.cu`, compiled to PTX by build.rs)
//! from the fused ops' `cuda_fwd`: one tensor ([`step`]), or one stacked tensor of K
//! chains in one launch ([`stacked_step`]).

use candle_core::cuda_backend::cudarc::driver::{
    CudaSlice, CudaStream, DevicePtrMut, LaunchConfig, PushKernelArg, SyncOnDrop,
};
use candle_core::cuda_backend::{CudaDevice, WrapErr};
use candle_core::{backend::BackendStorage, CudaStorage, Layout};

use super::buffer::StateBuffer;
use super::{LentUpdate, TensorSums, Update};

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
    let cfg = launch_config(n, 1);
    let (key, c) = (lane.key, lane.consts);
    // [Σv², Σα, Σθ·∇], reduced by the kernel.
    let mut sums = dev.alloc_zeros::<f64>(3)?;
    match lane.update {
        Update::Sgld => {
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
            builder.arg(&mut sums);
            // SAFETY: the argument list matches `bnn_sgld_kernel`'s signature, every
            // pointer covers `n` floats and `sums` three doubles.
            unsafe { builder.launch(cfg) }.w()?;
        }
        Update::Momentum => {
            let momentum = on_gpu(lane.momentum.as_mut(), n, "momentum")?;
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
            builder.arg(&mut sums);
            // SAFETY: the argument list matches `bnn_momentum_kernel`'s signature, every
            // pointer covers `n` floats and `sums` three doubles.
            unsafe { builder.launch(cfg) }.w()?;
        }
        Update::Thermostat { splitting } => {
            let momentum = on_gpu(lane.momentum.as_mut(), n, "momentum")?;
            let alpha = on_gpu(lane.thermostat.as_mut(), n, "thermostats")?;
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
            // pointer covers `n` floats and `sums` three doubles.
            unsafe { builder.launch(cfg) }.w()?;
        }
    }
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

/// The device addresses of each lane's momentum and, with `thermostats`, of its αᵢ (each
/// buffer of `n` values), uploaded; and the guards that order `stream`'s use of the
/// buffers, to be dropped after the launch is queued.
type Addresses<'b> = (CudaSlice<u64>, Option<CudaSlice<u64>>, Vec<SyncOnDrop<'b>>);

fn addresses<'b>(
    dev: &CudaDevice,
    stream: &'b CudaStream,
    lanes: &'b mut [LentUpdate<'_>],
    thermostats: bool,
    n: u64,
) -> candle_core::Result<Addresses<'b>> {
    let (mut momenta, mut alphas, mut guards) = (Vec::new(), Vec::new(), Vec::new());
    for lane in lanes.iter_mut() {
        let LentUpdate {
            momentum,
            thermostat,
            ..
        } = lane;
        let (pointer, guard) = on_gpu(momentum.as_mut(), n, "momentum")?.device_ptr_mut(stream);
        momenta.push(pointer);
        guards.push(guard);
        if thermostats {
            let alpha = on_gpu(thermostat.as_mut(), n, "thermostats")?;
            let (pointer, guard) = alpha.device_ptr_mut(stream);
            alphas.push(pointer);
            guards.push(guard);
        }
    }
    let alphas = match thermostats {
        true => Some(dev.clone_htod(&alphas)?),
        false => None,
    };
    Ok((dev.clone_htod(&momenta)?, alphas, guards))
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
    let cfg = launch_config(n, k as u32);
    let seeds = dev.clone_htod(&lanes.iter().map(|l| l.key.seed).collect::<Vec<u64>>())?;
    let thermostat = matches!(update, Update::Thermostat { .. });
    let consts: Vec<f32> = lanes
        .iter()
        .flat_map(|l| {
            let c = l.consts;
            // The thermostat step damps by each element's own αᵢ.
            match thermostat {
                true => [c.step_size, 1.0, 1.0, c.noise_scale],
                false => [c.step_size, c.decay, c.post, c.noise_scale],
            }
        })
        .collect();
    let consts = dev.clone_htod(&consts)?;
    let (param, step) = (lanes[0].key.param, lanes[0].key.step);
    let mut sums = dev.alloc_zeros::<f64>(3 * k)?;
    match update {
        Update::Sgld => {
            let func = dev.get_or_load_custom_func("bnn_sgld_stacked_kernel", MODULE, PTX)?;
            let mut builder = func.builder();
            builder.arg(&mut theta);
            builder.arg(&grad);
            builder.arg(&n);
            builder.arg(&param);
            builder.arg(&seeds);
            builder.arg(&step);
            builder.arg(&consts);
            builder.arg(&mut sums);
            // SAFETY: the argument list matches `bnn_sgld_stacked_kernel`'s signature;
            // θ and ∇ cover K·n floats, `seeds` K values, `consts` 4K, `sums` 3K.
            unsafe { builder.launch(cfg) }.w()?;
        }
        Update::Momentum => {
            let stream = dev.cuda_stream();
            let (momentum, _, _guards) = addresses(&dev, &stream, lanes, false, n)?;
            let func = dev.get_or_load_custom_func("bnn_momentum_stacked_kernel", MODULE, PTX)?;
            let mut builder = func.builder();
            builder.arg(&mut theta);
            builder.arg(&momentum);
            builder.arg(&grad);
            builder.arg(&n);
            builder.arg(&param);
            builder.arg(&seeds);
            builder.arg(&step);
            builder.arg(&consts);
            builder.arg(&mut sums);
            // SAFETY: the argument list matches `bnn_momentum_stacked_kernel`'s signature;
            // θ and ∇ cover K·n floats, each of the K momentum addresses n floats (checked
            // by `addresses`), `sums` 3K doubles.
            unsafe { builder.launch(cfg) }.w()?;
        }
        Update::Thermostat { splitting } => {
            let splitting = i32::from(splitting);
            let stream = dev.cuda_stream();
            let (momentum, alpha, _guards) = addresses(&dev, &stream, lanes, true, n)?;
            let Some(alpha) = alpha else {
                candle_core::bail!("stacked sampler step: no thermostat addresses");
            };
            let func = dev.get_or_load_custom_func("bnn_thermostat_stacked_kernel", MODULE, PTX)?;
            let mut builder = func.builder();
            builder.arg(&mut theta);
            builder.arg(&momentum);
            builder.arg(&alpha);
            builder.arg(&grad);
            builder.arg(&n);
            builder.arg(&param);
            builder.arg(&seeds);
            builder.arg(&step);
            builder.arg(&consts);
            builder.arg(&splitting);
            builder.arg(&mut sums);
            // SAFETY: as the momentum kernel's, and each of the K α addresses covers n
            // floats.
            unsafe { builder.launch(cfg) }.w()?;
        }
    }
    Ok(sums_of(&dev.clone_dtoh(&sums)?))
}
