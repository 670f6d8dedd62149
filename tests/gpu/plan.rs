//! The step plan's CUDA executor against its host executor (the test double every CPU
//! test of the plan runs on): operation by operation from the same buffers, 50 updates
//! from the same state, graph replay against eager launches, and `bnn train` on CUDA
//! through the plan. Tolerances are at each test.

use bnn::engine::planned::{ChainInput, HeldOutSet, PlannedChains, Resident};
use bnn::ensemble::Folded;
use bnn::kernels::plan::{Elem, Executor, Op, Plan};
use bnn::model::{Activation, ModelSpec, Network};
use bnn::potential::{Potential, Prior, PriorSpec};
use bnn::sampler::{build_with, Integrator, Kernel, SamplerKind, SamplerParams};
use candle_core::Device;

use super::cuda;
use crate::common::plan::{order, params, resident, test_rows, BATCH, ROWS, UPDATES};

/// K chains of 784-`hidden`-10 (`act`) under `p`, their plan on `device`, its epoch open.
fn plan_on(
    device: &Device,
    hidden: &[usize],
    act: Activation,
    k: usize,
    p: SamplerParams,
) -> PlannedChains {
    let spec = ModelSpec {
        hidden: hidden.to_vec(),
        activation: act,
        ..ModelSpec::default()
    };
    let nets: Vec<Network> = (0..k)
        .map(|c| Network::new(&spec, 784, 10, 40 + c as u64, &Device::Cpu).unwrap())
        .collect();
    let states: Vec<_> = nets
        .iter()
        .enumerate()
        .map(|(c, n)| {
            let s = build_with(p, &n.vars(), 900 + c as u64, Kernel::Fused).unwrap();
            s.state().unwrap()
        })
        .collect();
    let potentials: Vec<Potential> = (0..k)
        .map(|c| {
            let mut prior = Prior::new(PriorSpec::DEFAULT, nets[0].params.len()).unwrap();
            prior.precisions = (0..prior.precisions.len())
                .map(|t| 0.5 + t as f64 + 0.25 * c as f64)
                .collect();
            Potential::new(ROWS, 1.0, prior).unwrap()
        })
        .collect();
    let inputs: Vec<ChainInput> = (0..k)
        .map(|c| ChainInput {
            net: &nets[c],
            params: p,
            state: &states[c],
            seed: 900 + c as u64,
            potential: &potentials[c],
        })
        .collect();
    let (x, y) = resident();
    let data = Resident::Classes { x: &x, labels: &y };
    let (test, labels) = test_rows();
    let dims = (BATCH, UPDATES * BATCH);
    let set = HeldOutSet {
        x: &test,
        labels: &labels,
    };
    let mut plan = PlannedChains::on(&inputs, data, &[set], dims, device).unwrap();
    let orders: Vec<Vec<usize>> = (0..k).map(order).collect();
    plan.begin_epoch(&orders.iter().map(|o| o.as_slice()).collect::<Vec<_>>())
        .unwrap();
    plan
}

/// Every buffer's bytes.
fn buffers(plan: &Plan, ws: &mut dyn Executor) -> Vec<Vec<u8>> {
    plan.buffers
        .iter()
        .enumerate()
        .map(|(i, b)| {
            let mut out = vec![0u8; b.len * b.elem.bytes()];
            ws.read_bytes(bnn::kernels::plan::Buf(i), 0, &mut out)
                .unwrap();
            out
        })
        .collect()
}

fn f64s(bytes: &[u8]) -> Vec<f64> {
    bytes
        .chunks_exact(8)
        .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// Operation `op` (number i) run alone on CUDA and on the host from the same buffers (the
/// host's copied to the device first): every buffer bit for bit, but as
/// [`each_plan_kernel_on_cuda_is_the_host_executors_bit_for_bit`] allows for a GEMM and
/// the finish's constants; `control` is the control blocks' buffer.
fn same_op(
    host: &mut PlannedChains,
    gpu: &mut PlannedChains,
    (i, op): (usize, &Op),
    control: usize,
) {
    let plan = host.plan().clone();
    let before = buffers(&plan, host.workspace());
    for (b, bytes) in before.iter().enumerate() {
        gpu.workspace()
            .write_bytes(bnn::kernels::plan::Buf(b), 0, bytes)
            .unwrap();
    }
    let one = std::slice::from_ref(op);
    host.workspace().run_ops(&plan, one).unwrap();
    gpu.workspace().run_ops(&plan, one).unwrap();
    let (h, g) = (
        buffers(&plan, host.workspace()),
        buffers(&plan, gpu.workspace()),
    );
    for (b, spec) in plan.buffers.iter().enumerate() {
        if h[b] == g[b] {
            continue;
        }
        let what = format!("op {i} ({}) buffer {}", op.name(), spec.name);
        match op {
            Op::Gemm(_) => {
                let (x, y) = (f32s(&h[b]), f32s(&g[b]));
                let scale = x.iter().map(|v| v.abs()).fold(1e-30f32, f32::max);
                let worst = x
                    .iter()
                    .zip(&y)
                    .map(|(a, c)| (a - c).abs())
                    .fold(0f32, f32::max);
                assert!(worst <= 1e-5 * scale, "{what}: {worst} of {scale}");
            }
            Op::Finish { .. } if b == control => {
                let (c, d) = (host.control(0).unwrap(), gpu.control(0).unwrap());
                assert_eq!(
                    (c.step, c.thermostat, c.kinetic),
                    (d.step, d.thermostat, d.kinetic)
                );
                for (x, y) in c.consts.iter().zip(&d.consts) {
                    assert!(x.to_bits().abs_diff(y.to_bits()) <= 1, "{what}: {x} vs {y}");
                }
            }
            // ln in f64: CUDA's log and glibc's may be an ulp apart, so the entropies,
            // the scores and their row-order sums are, by at most ~1e-16 a row; Σp
            // (additions alone) must match to the bit.
            Op::EnsembleFold { .. } | Op::EnsembleTally { .. }
                if spec.elem == Elem::F64 && !spec.name.starts_with("Σp") =>
            {
                let (x, y) = (f64s(&h[b]), f64s(&g[b]));
                let scale = x.iter().map(|v| v.abs()).fold(1e-300f64, f64::max);
                let worst = x
                    .iter()
                    .zip(&y)
                    .map(|(a, c)| (a - c).abs())
                    .fold(0f64, f64::max);
                assert!(worst <= 1e-12 * scale, "{what}: {worst} of {scale}");
            }
            _ => panic!("{what} differs between CUDA and the host"),
        }
    }
}

/// Each operation of one update of 784-100-10 (K = 3, SGNHT with the splitting
/// integrator, so every state buffer is live) and of the test set's forward pass, run
/// alone on CUDA and on the host from
/// the same buffers (the host's copied to the device before each): every buffer of every
/// kernel bit for bit (the same f32 operations, nvcc without FMA contraction, the same
/// polynomials for exp and log; the update's sums the same fixed trees), except the
/// finish's f32 constants, which may be one ulp apart (CUDA's double `exp` and glibc's
/// before the rounding to f32); a GEMM (cuBLAS against the host's kernel, other
/// summation orders) within 1e-5 of the output's largest value.
#[test]
fn each_plan_kernel_on_cuda_is_the_host_executors_bit_for_bit() {
    let Some(dev) = cuda("each_plan_kernel_on_cuda_is_the_host_executors_bit_for_bit") else {
        return;
    };
    let p = params(SamplerKind::Sgnht, Integrator::Splitting);
    let mut host = plan_on(&Device::Cpu, &[100], Activation::Relu, 3, p);
    let mut gpu = plan_on(&dev, &[100], Activation::Relu, 3, p);
    let plan = host.plan().clone();
    let control = plan
        .buffers
        .iter()
        .position(|b| b.name == "control")
        .unwrap();
    for (i, op) in plan.ops.iter().enumerate() {
        same_op(&mut host, &mut gpu, (i, op), control);
    }
    // The test set's forward pass, operation by operation (chunks of 2,730 rows at K = 3),
    // then its fold into the ensembles and the tallies.
    let held = &host.held_out()[0];
    let prediction: Vec<Op> = held.ops.iter().chain(&held.fold).cloned().collect();
    for (i, op) in prediction.iter().enumerate() {
        same_op(&mut host, &mut gpu, (i, op), control);
    }
    // The whole prediction from the same θ: only the GEMMs' orders part the two.
    for (b, bytes) in buffers(&plan, host.workspace()).iter().enumerate() {
        gpu.workspace()
            .write_bytes(bnn::kernels::plan::Buf(b), 0, bytes)
            .unwrap();
    }
    let (h, g) = (host.predict(0).unwrap(), gpu.predict(0).unwrap());
    let worst = h
        .iter()
        .flatten()
        .zip(g.iter().flatten())
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(worst <= 1e-5, "test-set probabilities {worst} apart");
    // The sample folded on each: probabilities 1e-5 apart move the NLL by about that
    // (relative) and may flip a near-tie's arg-max (one row is 1e-4 of the accuracy).
    let (h, g) = (host.fold(0).unwrap(), gpu.fold(0).unwrap());
    for (a, b) in h.iter().zip(&g) {
        let (a, b) = (Folded::of_tallies(a), Folded::of_tallies(b));
        for (x, y) in [(a.alone, b.alone), (a.ensemble, b.ensemble)] {
            assert!((x.nll - y.nll).abs() <= 1e-4 * x.nll, "{x:?} vs {y:?}");
            assert!((x.accuracy - y.accuracy).abs() <= 2e-4, "{x:?} vs {y:?}");
        }
    }
    println!(
        "gpu-check: plan kernels on CUDA = host executor, {} operations of an update \
         and {} of the test set's prediction",
        plan.ops.len(),
        prediction.len()
    );
}

/// ‖a − b‖ / ‖b‖.
fn relative(a: &[f32], b: &[f32]) -> f64 {
    let sq = |f: &dyn Fn(usize) -> f64| (0..b.len()).map(f).sum::<f64>().sqrt();
    sq(&|i| (a[i] as f64 - b[i] as f64).powi(2)) / sq(&|i| (b[i] as f64).powi(2))
}

fn theta(plan: &mut PlannedChains) -> Vec<f32> {
    let theta = plan
        .plan()
        .buffers
        .iter()
        .position(|b| b.name == "θ")
        .unwrap();
    let n = plan.plan().buffers[theta].len;
    plan.workspace()
        .read::<f32>(bnn::kernels::plan::Buf(theta), 0, n)
        .unwrap()
}

/// 50 updates of K = 4 chains of 784-400-400-10 from the same state on CUDA (graphs) and
/// on the host: θ within 1e-5 relative with tanh, for SGHMC and both SGNHT integrators;
/// with ReLU within 1e-3 (a pre-activation within rounding of the kink parts the two, as
/// on the CPU: tests/suite/plan.rs). The GPU's run is its graphs'.
#[test]
fn fifty_plan_updates_on_cuda_follow_the_host_executor() {
    let Some(dev) = cuda("fifty_plan_updates_on_cuda_follow_the_host_executor") else {
        return;
    };
    let cases = [
        (SamplerKind::Sghmc, Integrator::Euler),
        (SamplerKind::Sgnht, Integrator::Euler),
        (SamplerKind::Sgnht, Integrator::Splitting),
    ];
    for (act, bar) in [(Activation::Tanh, 1e-5), (Activation::Relu, 1e-3)] {
        for &(kind, integrator) in &cases {
            let p = params(kind, integrator);
            let mut host = plan_on(&Device::Cpu, &[400, 400], act, 4, p);
            let mut gpu = plan_on(&dev, &[400, 400], act, 4, p);
            host.run(UPDATES).unwrap();
            gpu.run(UPDATES).unwrap();
            let rel = relative(&theta(&mut gpu), &theta(&mut host));
            println!(
                "gpu-check: plan {kind:?} {integrator:?} {act:?} on {}: θ after 50 updates \
                 within {rel:.2e} of the host executor",
                gpu.executor()
            );
            assert!(rel <= bar, "{kind:?} {integrator:?} {act:?}: {rel:.2e}");
            assert!(
                gpu.executor().starts_with("cuda graphs"),
                "{}",
                gpu.executor()
            );
        }
    }
}

/// The captured graphs replay what eager launches do, bit for bit: 37 updates (two
/// 16-update graphs and five 1-update ones) against 37 updates launched one by one.
#[test]
fn plan_graphs_replay_eager_launches_bit_for_bit() {
    let Some(dev) = cuda("plan_graphs_replay_eager_launches_bit_for_bit") else {
        return;
    };
    let p = params(SamplerKind::Sgnht, Integrator::Splitting);
    let mut graphs = plan_on(&dev, &[100], Activation::Relu, 4, p);
    let mut eager = plan_on(&dev, &[100], Activation::Relu, 4, p);
    eager.workspace().force_eager();
    graphs.run(37).unwrap();
    eager.run(37).unwrap();
    let plan = graphs.plan().clone();
    assert!(buffers(&plan, graphs.workspace()) == buffers(&plan, eager.workspace()));
    println!(
        "gpu-check: plan on {} = {} after 37 updates, bit for bit",
        graphs.executor(),
        eager.executor()
    );
}

/// `bnn train --device cuda` runs an MLP through the plan (summary.json says so and
/// names the executor), and its ensemble is the host executor's run of the same seed
/// within 1e-3 relative NLL (the GEMMs' summation orders part the chains slowly; the
/// CPU path and the host executor agree to 2e-5 here: tests/suite/resume.rs). Prints
/// the plan's updates per second.
#[test]
fn training_on_cuda_runs_the_plan() {
    if cuda("training_on_cuda_runs_the_plan").is_none() {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let run = |name: &str, device: &str| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_bnn"))
            .args([
                "train",
                "--dataset",
                "mnist-mini",
                "--offline",
                "--device",
                device,
                "--backward",
                if device == "cuda" { "auto" } else { "plan" },
                "--sampler",
                "sgnht",
                "--epochs",
                "3",
                "--burnin",
                "1",
                "--thin",
                "20",
                "--chains",
                "2",
                "--no-progress",
                "--quiet",
                "--run-name",
                name,
            ])
            .current_dir(d.path())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{device}: {}",
            super::common::stderr(&out)
        );
        super::common::last_json(&out)
    };
    let (gpu, host) = (run("cuda", "cuda"), run("host", "cpu"));
    assert_eq!(gpu["backward_used"], "plan");
    let executor = gpu["executor"].as_str().unwrap().to_string();
    assert!(executor.starts_with("cuda graphs"), "{executor}");
    let nll = |s: &serde_json::Value| s["ensemble"]["nll"].as_f64().unwrap();
    let rel = (nll(&gpu) - nll(&host)).abs() / nll(&host);
    println!(
        "gpu-check: bnn train through the plan on {executor}: ensemble NLL {:.6} vs host \
         {:.6} ({rel:.1e}), {:.0} chain-updates/s",
        nll(&gpu),
        nll(&host),
        gpu["steps_per_second"].as_f64().unwrap()
    );
    assert!(rel <= 1e-3, "{rel}");
}
