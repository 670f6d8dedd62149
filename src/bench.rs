//! `bnn bench step`: time one sampler update (gradients given) for the fused kernel and
//! the composed candle-op reference, against a plain parallel copy of the same bytes.

use std::time::Instant;

use candle_core::{Device, Tensor, Var};
use rand::{Rng, SeedableRng};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::sampler::{self, Kernel, SamplerKind};

/// One row of the benchmark.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StepBench {
    pub sampler: String,
    pub params: usize,
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
    let config = kind.defaults();
    let bytes_per_param = match kind {
        SamplerKind::Sgld => 12,
        _ => 20,
    };
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
            dst.par_chunks_mut(1 << 16)
                .zip(src.par_chunks(1 << 16))
                .for_each(|(d, s)| d.copy_from_slice(s));
            Ok(())
        })?;
        let bytes = (n * bytes_per_param) as f64;
        let (fused, composed) = (timings[0], timings[1]);
        rows.push(StepBench {
            sampler: kind.name().to_string(),
            params: n,
            threads: rayon::current_num_threads(),
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
