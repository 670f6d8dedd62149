//! The CUDA path against the CPU path, on a CUDA device (`scripts/gpu-check.sh`: feature
//! `cuda`, `BNN_TEST_CUDA=1`). Without `BNN_TEST_CUDA=1` each test prints that it did not
//! run and passes without touching a device: CI has no GPU and only type-checks this file
//! (`cargo check --tests --features cuda`). With it, a missing device fails the test.
#![cfg(feature = "cuda")]

mod common;

use bnn::sampler::Integrator::{Euler, Splitting};
use bnn::sampler::{self, Integrator, Kernel, SamplerConfig, SamplerKind};
use candle_core::{Device, Tensor, Var};
use rand::{Rng, SeedableRng};

/// The CUDA device when the GPU check is asked for, `None` (said on stderr) otherwise.
fn cuda(test: &str) -> Option<Device> {
    if std::env::var("BNN_TEST_CUDA").as_deref() != Ok("1") {
        eprintln!("{test}: not run (set BNN_TEST_CUDA=1 on a CUDA machine: scripts/gpu-check.sh)");
        return None;
    }
    match Device::new_cuda(0) {
        Ok(d) => Some(d),
        Err(e) => panic!("BNN_TEST_CUDA=1 but no CUDA device 0: {e}"),
    }
}

fn values(t: &Tensor) -> Vec<f32> {
    t.flatten_all().unwrap().to_vec1::<f32>().unwrap()
}

/// Largest |a − b| / max(|a|, |b|, 1e-6) and the count of elements that differ in bits.
fn compare(a: &[f32], b: &[f32]) -> (f32, usize) {
    let rel = a
        .iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs() / x.abs().max(y.abs()).max(1e-6))
        .fold(0f32, f32::max);
    let differ = a
        .iter()
        .zip(b)
        .filter(|(x, y)| x.to_bits() != y.to_bits())
        .count();
    (rel, differ)
}

/// Ten fused steps of every sampler with a CUDA kernel, on the same parameters, gradients
/// and Philox noise on the CPU and the GPU. Tolerance: SGLD and SGHMC bit for bit (the
/// element math is the same f32 operations in the same order, nvcc without FMA
/// contraction); the thermostat samplers feed Σv² (summed in another order on the GPU,
/// with atomics) back into the next step's constants, which may round one f32 ulp apart:
/// 1e-6 relative.
#[test]
fn fused_steps_on_cuda_match_the_cpu() {
    let Some(gpu) = cuda("fused_steps_on_cuda_match_the_cpu") else {
        return;
    };
    let cases: [(SamplerKind, f64, f64, Integrator); 7] = [
        (SamplerKind::Sgld, 0.0, 0.0, Euler),
        (SamplerKind::Sghmc, 0.1, 0.0, Euler),
        (SamplerKind::Sghmc, 0.1, 0.0, Splitting),
        (SamplerKind::Sgnht, 0.0, 0.1, Euler),
        (SamplerKind::Sgnht, 0.0, 0.1, Splitting),
        (SamplerKind::Msgnht, 0.0, 0.1, Euler),
        (SamplerKind::Msgnht, 0.0, 0.1, Splitting),
    ];
    for (kind, friction, diffusion, integrator) in cases {
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        let shapes: [&[usize]; 3] = [&[300, 784], &[300], &[10_007]];
        let (mut cpu_params, mut gpu_params, mut cpu_grads, mut gpu_grads) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for s in shapes {
            let n: usize = s.iter().product();
            let theta: Vec<f32> = (0..n).map(|_| rng.random_range(-1.0..1.0)).collect();
            let grad: Vec<f32> = (0..n).map(|_| rng.random_range(-100.0..100.0)).collect();
            let t = Tensor::from_vec(theta, s, &Device::Cpu).unwrap();
            let g = Tensor::from_vec(grad, s, &Device::Cpu).unwrap();
            cpu_params.push(Var::from_tensor(&t).unwrap());
            gpu_params.push(Var::from_tensor(&t.to_device(&gpu).unwrap()).unwrap());
            gpu_grads.push(g.to_device(&gpu).unwrap());
            cpu_grads.push(g);
        }
        let config = SamplerConfig {
            kind,
            step_size: 2e-5,
            friction,
            noise_estimate: 0.0,
            diffusion,
            integrator,
        };
        let mut on_cpu = sampler::build_with(config, &cpu_params, 11, Kernel::Fused).unwrap();
        let mut on_gpu = sampler::build_with(config, &gpu_params, 11, Kernel::Fused).unwrap();
        for _ in 0..10 {
            on_cpu.step(&cpu_params, &cpu_grads).unwrap();
            on_gpu.step(&gpu_params, &gpu_grads).unwrap();
        }
        let exact = matches!(kind, SamplerKind::Sgld | SamplerKind::Sghmc);
        let (mut worst, mut differ, mut total) = (0f32, 0usize, 0usize);
        for (c, g) in cpu_params.iter().zip(&gpu_params) {
            let (a, b) = (values(c.as_tensor()), values(g.as_tensor()));
            let (rel, n) = compare(&a, &b);
            worst = worst.max(rel);
            differ += n;
            total += a.len();
        }
        let (sc, sg) = (on_cpu.state().unwrap(), on_gpu.state().unwrap());
        for (a, b) in sc.momentum().iter().zip(sg.momentum()) {
            let (rel, n) = compare(&values(a), &values(b));
            worst = worst.max(rel);
            differ += n;
        }
        for (a, b) in sc.thermostats().iter().zip(sg.thermostats()) {
            let (rel, n) = compare(&values(a), &values(b));
            worst = worst.max(rel);
            differ += n;
        }
        println!(
            "gpu-check: fused {kind:?} {integrator:?}: {differ} of {total} parameters' values \
             (θ, v, α) differ in bits, worst relative difference {worst:.2e}"
        );
        if exact {
            assert_eq!(differ, 0, "{kind:?} {integrator:?}: not bit for bit");
        } else {
            assert!(worst <= 1e-6, "{kind:?} {integrator:?}: {worst}");
        }
        let (dc, dg) = (on_cpu.diagnostics(), on_gpu.diagnostics());
        if let (Some(x), Some(y)) = (dc.kinetic_energy, dg.kinetic_energy) {
            assert!(
                (x - y).abs() <= 1e-6 * y.abs(),
                "{kind:?}: kinetic {x} vs {y}"
            );
        }
        if let (Some(x), Some(y)) = (dc.thermostat, dg.thermostat) {
            assert!(
                (x - y).abs() <= 1e-6 * y.abs().max(1e-6),
                "{kind:?}: thermostat {x} vs {y}"
            );
        }
    }
}

/// The per-epoch training loss of `metrics.jsonl`, and the summary's steps per second.
fn train(cwd: &std::path::Path, device: &str, data: &str) -> (Vec<f64>, f64) {
    let name = format!("gpu-check-{device}");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_bnn"))
        .args([
            "train",
            "--dataset",
            "mnist",
            "--data-dir",
            data,
            "--offline",
            "--device",
            device,
            "--backward",
            "autograd",
            "--epochs",
            "3",
            "--burnin",
            "1",
            "--thin",
            "200",
            "--seed",
            "0",
            "--no-progress",
            "--quiet",
            "--run-name",
            &name,
        ])
        .current_dir(cwd)
        .output()
        .unwrap();
    assert!(out.status.success(), "{device}: {}", common::stderr(&out));
    let summary = common::last_json(&out);
    let metrics =
        std::fs::read_to_string(cwd.join("checkpoints").join(&name).join("metrics.jsonl")).unwrap();
    let losses = metrics
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["train_nll"]
                .as_f64()
                .unwrap()
        })
        .collect();
    (losses, summary["steps_per_second"].as_f64().unwrap())
}

/// Three epochs of the default MLP on MNIST with SGHMC (candle's autograd on both
/// devices, so that only the device differs): each epoch's mean training loss on the GPU
/// within 1e-3 relative of the CPU's (cuBLAS and the CPU GEMM round differently, and a
/// chain amplifies differences slowly); the throughput of both, as a line.
#[test]
fn short_training_on_cuda_matches_the_cpu() {
    if cuda("short_training_on_cuda_matches_the_cpu").is_none() {
        return;
    }
    // scripts/gpu-check.sh sets BNN_DATA_DIR and BNN_REQUIRE_DATA=1: no data fails here.
    let data = common::real_data("mnist").expect("MNIST under BNN_DATA_DIR");
    let d = tempfile::tempdir().unwrap();
    let (cpu, cpu_rate) = train(d.path(), "cpu", data.to_str().unwrap());
    let (gpu, gpu_rate) = train(d.path(), "cuda", data.to_str().unwrap());
    assert_eq!(cpu.len(), gpu.len());
    for (epoch, (c, g)) in cpu.iter().zip(&gpu).enumerate() {
        let rel = (c - g).abs() / c.abs();
        println!(
            "gpu-check: epoch {} training loss CPU {c:.6} GPU {g:.6} (relative {rel:.1e})",
            epoch + 1
        );
        assert!(rel <= 1e-3, "epoch {}: {c} vs {g}", epoch + 1);
    }
    println!(
        "gpu-check: throughput MLP 784-100-10, batch 100: GPU {gpu_rate:.0} steps/s, CPU {cpu_rate:.0} steps/s"
    );
}
