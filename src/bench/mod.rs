//! `bnn bench step`: time one sampler update (gradients given) for the fused kernel and
//! the composed candle-op reference, against a plain parallel copy of the same bytes.
//! `bnn bench train`: steps per second of the whole training step. `bnn bench gemm`:
//! every matrix product and direct convolution of the models' steps against the FMA
//! ceiling (`gemm`). `bnn bench plan`: the step plan of an MLP's update (`plan`).

use std::time::Instant;

use candle_core::{Device, Tensor, Var};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use crate::data::NUM_CLASSES;
use crate::error::Result;
use crate::model::{ModelSpec, Network};
use crate::potential::{Backward, Potential, Prior, PriorSpec};
use crate::sampler::{self, Integrator, Kernel, SamplerKind, SamplerParams};
use crate::train::Stepper;

mod gemm;
mod plan;
pub use gemm::{gemm, gemm_models, GemmBench, GemmModel, ProductBench};
pub use plan::{plan, PlanBench};

/// One row of the benchmark.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StepBench {
    pub sampler: String,
    pub params: usize,
    /// The CPU kernel path ([`crate::kernels::isa`]).
    pub isa: String,
    pub threads: usize,
    /// Bytes a fused update moves per parameter (reads and writes).
    pub bytes_per_param: usize,
    pub fused_ns_per_param: f64,
    pub composed_ns_per_param: f64,
    /// composed time / fused time.
    pub fused_speedup: f64,
    pub copy_gb_per_s: f64,
    pub fused_gb_per_s: f64,
    /// fused_gb_per_s / copy_gb_per_s.
    pub fused_fraction_of_copy: f64,
}

fn poisoned() -> crate::error::Error {
    crate::error::Error::Config("a benchmark chain panicked".into())
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

fn time<F: FnMut() -> Result<()>>(repeats: usize, mut f: F) -> Result<f64> {
    f()?; // warm-up: first-touch page faults, thread pool start
    let mut t = Vec::with_capacity(repeats);
    for _ in 0..repeats {
        let s = Instant::now();
        f()?;
        t.push(s.elapsed().as_secs_f64());
    }
    Ok(median(t))
}

/// Benchmarks `kind` at each size in `sizes`, taking the median of `repeats` timings.
pub fn step(kind: SamplerKind, sizes: &[usize], repeats: usize) -> Result<Vec<StepBench>> {
    let mut rows = Vec::new();
    let mut rng = rand::rngs::StdRng::seed_from_u64(0);
    let config = SamplerParams::defaults(kind)?;
    // Bytes moved per parameter: ∇ read, θ and each of the state's arrays read and
    // written, f32 each.
    let bytes_per_param = 4 * (1 + 2 * (1 + kind.state_arrays()));
    for &n in sizes {
        let theta: Vec<f32> = (0..n).map(|_| rng.random_range(-1.0..1.0)).collect();
        let grad: Vec<f32> = (0..n).map(|_| rng.random_range(-1e3..1e3)).collect();
        let grads = [Tensor::from_vec(grad, n, &Device::Cpu)?];
        let mut timings = Vec::new();
        for kernel in [Kernel::Fused, Kernel::Composed] {
            let p = [Var::from_slice(&theta, n, &Device::Cpu)?];
            let mut s = sampler::build_with(config, &p, 1, kernel)?;
            timings.push(time(repeats, || s.step(&p, &grads))?);
        }
        // A parallel copy of as many bytes as the fused update moves (half read, half written).
        let words = n * bytes_per_param / 8;
        let src = vec![1f32; words];
        let mut dst = vec![0f32; words];
        let copy = time(repeats, || {
            const PART: usize = 1 << 16;
            let out = crate::pool::Disjoint::new(&mut dst[..]);
            crate::pool::run(words.div_ceil(PART), &|p| {
                let (a, b) = (p * PART, ((p + 1) * PART).min(words));
                // SAFETY: part p alone writes dst[a..b].
                unsafe { out.slice(a, b) }.copy_from_slice(&src[a..b]);
            });
            Ok(())
        })?;
        let bytes = (n * bytes_per_param) as f64;
        let (fused, composed) = (timings[0], timings[1]);
        rows.push(StepBench {
            sampler: kind.name().to_string(),
            params: n,
            isa: crate::kernels::isa::current().name().to_string(),
            threads: crate::pool::threads(),
            bytes_per_param,
            fused_ns_per_param: fused * 1e9 / n as f64,
            composed_ns_per_param: composed * 1e9 / n as f64,
            fused_speedup: composed / fused,
            copy_gb_per_s: bytes / copy / 1e9,
            fused_gb_per_s: bytes / fused / 1e9,
            fused_fraction_of_copy: copy / fused,
        });
    }
    Ok(rows)
}

/// One row of `bnn bench train`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TrainBench {
    /// Chains stepped side by side; the rates are summed over them.
    pub chains: usize,
    pub model: String,
    pub batch: usize,
    pub sampler: String,
    pub integrator: Integrator,
    pub backward: Backward,
    pub kernel: Kernel,
    /// The CPU kernel path ([`crate::kernels::isa`]).
    pub isa: String,
    pub threads: usize,
    /// Median over the repeats.
    pub steps_per_second: f64,
    pub images_per_second: f64,
    pub ms_per_step: f64,
    /// Multiply-adds × 2 of the step's products: forward, weight gradients, and input
    /// gradients of every layer but the first.
    pub flop_per_step: f64,
    pub gflop_per_second: f64,
    pub repeats: usize,
    pub steps_per_repeat: usize,
}

/// FLOP of one training step of an MLP with `widths` (input first) at `batch`.
pub fn mlp_step_flop(widths: &[usize], batch: usize) -> f64 {
    let products: Vec<f64> = widths.windows(2).map(|w| (w[0] * w[1]) as f64).collect();
    let all: f64 = products.iter().sum();
    let input_grads: f64 = products.iter().skip(1).sum();
    2.0 * batch as f64 * (2.0 * all + input_grads)
}

/// What `bnn bench train` measures.
#[derive(Debug, Clone)]
pub struct TrainBenchOptions {
    pub hidden: Vec<Vec<usize>>,
    pub batches: Vec<usize>,
    /// Batch sizes of the LeNet-style CNN (`models/lenet.toml`); empty: no CNN.
    pub cnn_batches: Vec<usize>,
    /// Architectures timed at each of `batches` besides (`bnn bench train --config`).
    pub presets: Vec<ModelSpec>,
    pub samplers: Vec<SamplerKind>,
    pub integrator: Integrator,
    pub backward: Backward,
    pub kernel: Kernel,
    pub repeats: usize,
    /// Updates per timed repeat at batch 100 (scaled by 100/batch, at least 10).
    pub steps: usize,
    /// Independent chains stepped side by side on the pool (one per pool thread), as
    /// `bnn train --chains`; the rate reported is summed over them.
    pub chains: usize,
}

/// Steps per second of the whole training step (gather, forward, backward, update) on
/// MNIST-shaped data (the built-in subset: real images, nothing to download), after a
/// warm-up repeat; the median of `repeats`.
pub fn train(opts: &TrainBenchOptions) -> Result<Vec<TrainBench>> {
    let ds = crate::data::load_builtin()?;
    let mut runs: Vec<(ModelSpec, usize)> = Vec::new();
    for hidden in &opts.hidden {
        let spec = ModelSpec {
            hidden: hidden.clone(),
            ..ModelSpec::default()
        };
        runs.extend(opts.batches.iter().map(|&b| (spec.clone(), b)));
    }
    runs.extend(opts.cnn_batches.iter().map(|&b| (ModelSpec::lenet(), b)));
    for spec in &opts.presets {
        runs.extend(opts.batches.iter().map(|&b| (spec.clone(), b)));
    }
    let mut rows = Vec::new();
    for (spec, batch) in runs {
        for &kind in &opts.samplers {
            rows.push(train_row(opts, &ds, &spec, batch, kind)?);
        }
    }
    Ok(rows)
}

/// The row of `spec` at `batch` under `kind`: `opts.chains` steppers timed together.
fn train_row(
    opts: &TrainBenchOptions,
    ds: &crate::data::Dataset,
    spec: &ModelSpec,
    batch: usize,
    kind: SamplerKind,
) -> Result<TrainBench> {
    let n = ds.train.len();
    let mut config = kind.defaults();
    config.integrator = opts.integrator;
    let chains = opts.chains.max(1);
    let mut steppers = Vec::with_capacity(chains);
    let mut flop = 0.0;
    for k in 0..chains {
        let seed = crate::rng::chain_seed(0, k);
        let (stepper, step) =
            bench_stepper(spec, ds, config, (opts.kernel, opts.backward), seed, batch)?;
        if k == 0 {
            flop = step;
        }
        steppers.push(std::sync::Mutex::new((stepper, 0usize)));
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    let mut order: Vec<usize> = (0..n).collect();
    order.shuffle(&mut rng);
    let steps = (opts.steps * 100 / batch).max(10);
    let one = |(stepper, cursor): &mut (Stepper, usize)| -> Result<()> {
        for _ in 0..steps {
            if *cursor + batch > n {
                *cursor = 0;
            }
            stepper.step(&ds.train, None, &order[*cursor..*cursor + batch], None)?;
            *cursor += batch;
        }
        Ok(())
    };
    let run = || -> Result<()> {
        if chains == 1 {
            let mut s = steppers[0].lock().map_err(|_| poisoned())?;
            return one(&mut s);
        }
        // One chain per pool job: each chain's own products then run serially.
        let failed = std::sync::Mutex::new(None);
        crate::pool::run(chains, &|k| {
            let result = steppers[k]
                .lock()
                .map_err(|_| poisoned())
                .and_then(|mut s| one(&mut s));
            if let (Err(e), Ok(mut f)) = (result, failed.lock()) {
                *f = Some(e);
            }
        });
        match failed.into_inner().ok().flatten() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    };
    let secs = time(opts.repeats, run)?;
    let backward = steppers[0].lock().map_err(|_| poisoned())?.0.backward;
    let steps = steps * chains;
    let sps = steps as f64 / secs;
    Ok(TrainBench {
        model: spec.label(),
        batch,
        sampler: kind.name().to_string(),
        integrator: config.integrator,
        backward,
        kernel: opts.kernel,
        isa: crate::kernels::isa::current().name().to_string(),
        threads: crate::pool::threads(),
        steps_per_second: sps,
        images_per_second: sps * batch as f64,
        ms_per_step: 1e3 / sps,
        flop_per_step: flop,
        gflop_per_second: flop * sps / 1e9,
        repeats: opts.repeats,
        steps_per_repeat: steps,
        chains,
    })
}

/// The stepper of one benchmark chain of `spec` at `batch` on `ds`'s training images
/// (a Gamma(1, 1) hyper-prior), with its update kernel and backward pass, and the FLOP
/// of its step.
fn bench_stepper(
    spec: &ModelSpec,
    ds: &crate::data::Dataset,
    config: crate::sampler::SamplerConfig,
    (kernel, backward): (Kernel, Backward),
    seed: u64,
    batch: usize,
) -> Result<(Stepper, f64)> {
    let model = Network::new(spec, ds.train.dim(), NUM_CLASSES, seed, &Device::Cpu)?;
    let flop = step_flop(&model, batch);
    let prior = Prior::new(PriorSpec::DEFAULT, model.params.len())?;
    let potential = Potential::new(ds.train.len(), 1.0, prior)?;
    let stepper = Stepper::new(
        &model,
        potential,
        config.params()?,
        kernel,
        backward,
        seed,
        batch,
    )?;
    Ok((stepper, flop))
}

/// FLOP of one training step of `model` at `batch`: the products of the forward, of the
/// weight gradients and of the input errors of every layer but the first.
pub fn step_flop(model: &Network, batch: usize) -> f64 {
    if let Some(r) = &model.resnet {
        // Every convolution's three products but the stem's input error; the head's.
        let conv: f64 = r
            .convs()
            .iter()
            .enumerate()
            .map(|(l, c)| {
                let g = c.geometry;
                let macs = (g.out_channels * g.patch() * g.out_plane()) as f64;
                let passes = if l == 0 { 2.0 } else { 3.0 };
                2.0 * batch as f64 * passes * macs
            })
            .sum();
        return conv + 2.0 * batch as f64 * 3.0 * (r.features * r.classes) as f64;
    }
    let conv: f64 = model
        .convs
        .iter()
        .enumerate()
        .map(|(l, s)| {
            let macs = (s.out_channels * s.patch() * s.conv_side * s.conv_side) as f64;
            let passes = if l == 0 { 2.0 } else { 3.0 };
            2.0 * batch as f64 * passes * macs
        })
        .sum();
    let widths = model.fc_widths();
    let fc = if model.convs.is_empty() {
        mlp_step_flop(&widths, batch)
    } else {
        // The first fully connected layer's input error is needed (for the convolutions).
        let all: f64 = widths.windows(2).map(|w| (w[0] * w[1]) as f64).sum();
        2.0 * batch as f64 * 3.0 * all
    };
    conv + fc
}

/// One first-layer product on real MNIST pixels, dense and skipping the zero pixels.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ZeroSkipBench {
    pub product: String,
    pub batch: usize,
    /// Fraction of the minibatch's pixels that are not zero.
    pub input_density: f64,
    pub dense_us: f64,
    pub skipping_us: f64,
    /// dense time / skipping time.
    pub speedup: f64,
}

/// Times the first layer's two products (forward X·W₁ᵀ and weight gradient Δᵀ·X) on
/// minibatches of the built-in MNIST images, with and without skipping zero pixels
/// (`gemm::Zeros`); the median of `repeats`.
pub fn zero_skipping(repeats: usize) -> Result<Vec<ZeroSkipBench>> {
    use crate::kernels::gemm::{product, Mat, NonZero, Options, Zeros};
    let ds = crate::data::load_builtin()?;
    let d = ds.train.dim();
    let mut rows = Vec::new();
    let mut rng = rand::rngs::StdRng::seed_from_u64(2);
    for batch in [100, 1000] {
        let mut idx: Vec<usize> = (0..ds.train.len()).collect();
        idx.shuffle(&mut rng);
        let (mut x, mut y) = (Vec::new(), Vec::new());
        ds.train.gather(&idx[..batch], &mut x, &mut y);
        let mut nz = NonZero::default();
        nz.record(&x, batch, d);
        for hidden in [100, 400] {
            let w: Vec<f32> = (0..d * hidden)
                .map(|_| rng.random_range(-0.1..0.1))
                .collect();
            let delta: Vec<f32> = (0..batch * hidden)
                .map(|_| rng.random_range(-1.0..1.0))
                .collect();
            let mut out = vec![0f32; batch * hidden.max(d)];
            let mut grad = vec![0f32; hidden * d];
            let mut pair =
                |what: String, run: &mut dyn FnMut(&mut [f32], Zeros<'_>)| -> Result<()> {
                    let mut us = [0f64; 2];
                    for (t, zeros) in us.iter_mut().zip([Zeros::Unknown, Zeros::Lhs(&nz)]) {
                        *t = 1e6
                            * time(repeats, || {
                                run(&mut out, zeros);
                                Ok(())
                            })?;
                    }
                    rows.push(ZeroSkipBench {
                        product: what,
                        batch,
                        input_density: nz.density(),
                        dense_us: us[0],
                        skipping_us: us[1],
                        speedup: us[0] / us[1],
                    });
                    Ok(())
                };
            pair(format!("forward 784→{hidden}"), &mut |c, zeros| {
                let opts = Options {
                    zeros,
                    ..Options::default()
                };
                product(
                    batch,
                    hidden,
                    d,
                    c,
                    Mat::rows(&x, d),
                    // W (hidden × 784) read in place as Wᵀ, as the step does.
                    Mat::transposed(&w, d),
                    opts,
                )
            })?;
            pair(format!("weight grad {hidden}×784"), &mut |_, zeros| {
                // The same map, as the right operand's: images blank in a tile's pixels.
                let zeros = match zeros {
                    Zeros::Lhs(z) => Zeros::Rhs(z),
                    other => other,
                };
                let opts = Options {
                    zeros,
                    ..Options::default()
                };
                let lhs = Mat::transposed(&delta, hidden);
                product(hidden, d, batch, &mut grad, lhs, Mat::rows(&x, d), opts)
            })?;
        }
    }
    Ok(rows)
}
