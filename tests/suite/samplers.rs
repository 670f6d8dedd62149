//! Each sampler's update on a tiny example, against the paper's update written out by hand.

use bnn::engine::dynamics::Dynamics;
use bnn::kernels::buffer::StateBuffer;
use bnn::rng::NoiseKey;
use bnn::sampler::{self, Integrator, Kernel, Sampler, SamplerConfig, SamplerKind, SamplerParams};
use candle_core::{Device, Tensor, Var};

fn var(v: &[f32]) -> Var {
    Var::from_tensor(&Tensor::new(v, &Device::Cpu).unwrap()).unwrap()
}

fn t(v: &[f32]) -> Tensor {
    Tensor::new(v, &Device::Cpu).unwrap()
}

fn values(v: &Var) -> Vec<f32> {
    v.as_tensor().to_vec1::<f32>().unwrap()
}

fn z(seed: u64, step: u64, param: u32, i: usize) -> f64 {
    NoiseKey { seed, step, param }.normal(i) as f64
}

/// The one definition of each update, with both ways of applying it: the fused kernel and
/// the composed reference in candle ops.
const KERNELS: [Kernel; 2] = [Kernel::Fused, Kernel::Composed];

/// A host state buffer of `v`.
fn buffer(v: &[f32]) -> StateBuffer {
    StateBuffer::Host(v.to_vec())
}

/// Buffer `i`'s values.
fn host(b: &[StateBuffer], i: usize) -> Vec<f32> {
    b[i].to_host(&Device::Cpu).unwrap()
}

fn close(a: f32, b: f64) {
    assert!(
        (a as f64 - b).abs() <= 1e-6 * b.abs().max(1e-3),
        "{a} vs expected {b}"
    );
}

fn config(kind: SamplerKind, eta: f64, alpha: f64, beta: f64, a: f64) -> SamplerParams {
    record(kind, eta, alpha, beta, a).params().unwrap()
}

/// The flat record of those settings (Euler), as `run.json` writes it.
fn record(kind: SamplerKind, eta: f64, alpha: f64, beta: f64, a: f64) -> SamplerConfig {
    SamplerConfig {
        kind,
        step_size: eta,
        friction: alpha,
        noise_estimate: beta,
        diffusion: a,
        integrator: Integrator::Euler,
        rms_decay: None,
        rms_damping: None,
    }
}

#[test]
fn sghmc_without_injected_noise_is_literal() {
    // α = β̂ switches the injected noise off: v' = (1−α)v − ηg, θ' = θ + v'.
    // θ = (1, −2), v = (0.5, 0), g = (2, −4), η = 0.1, α = β̂ = 0.5:
    // v' = (0.25 − 0.2, 0 + 0.4) = (0.05, 0.4); θ' = (1.05, −1.6).
    for kernel in KERNELS {
        let p = var(&[1.0, -2.0]);
        let cfg = config(SamplerKind::Sghmc, 0.1, 0.5, 0.5, 0.0);
        let mut s = Dynamics::init(cfg, std::slice::from_ref(&p), 3, kernel).unwrap();
        s.momentum = vec![buffer(&[0.5, 0.0])];
        s.step(std::slice::from_ref(&p), &[t(&[2.0, -4.0])])
            .unwrap();
        let th = values(&p);
        close(th[0], 1.05);
        close(th[1], -1.6);
        let v = host(&s.momentum, 0);
        close(v[0], 0.05);
        close(v[1], 0.4);
    }
}

#[test]
fn sghmc_step_with_noise() {
    // v' = (1−α)v − ηg + √(2(α−β̂)η)·z, with z from the (seed, step, param, element) stream.
    let (eta, alpha, beta, seed) = (0.01, 0.2, 0.05, 11);
    let p0 = [0.3f32, -0.7, 1.1];
    let v0 = [0.02f32, -0.01, 0.0];
    let g = [1.5f32, -0.5, 0.25];
    for kernel in KERNELS {
        let p = var(&p0);
        let cfg = config(SamplerKind::Sghmc, eta, alpha, beta, 0.0);
        let mut s = Dynamics::init(cfg, std::slice::from_ref(&p), seed, kernel).unwrap();
        s.momentum = vec![buffer(&v0)];
        s.step(std::slice::from_ref(&p), &[t(&g)]).unwrap();
        let sigma = (2.0 * (alpha - beta) * eta).sqrt();
        let th = values(&p);
        for i in 0..3 {
            let v = (1.0 - alpha) * v0[i] as f64 - eta * g[i] as f64 + sigma * z(seed, 0, 0, i);
            close(th[i], p0[i] as f64 + v);
        }
        assert_eq!(s.steps(), 1);
        let ke = s.diagnostics().kinetic_energy.unwrap();
        let v = host(&s.momentum, 0);
        let expect = 0.5 * v.iter().map(|&x| (x as f64).powi(2)).sum::<f64>() / (3.0 * eta);
        assert!((ke - expect).abs() < 1e-9 * expect.max(1.0), "{kernel:?}");
    }
}

#[test]
fn sgnht_step_and_thermostat() {
    // Ding et al. Alg. 2: u' = u − αu − ηg + √(2aη)z; θ' = θ + u'; α' = α + u'ᵀu'/n − η,
    // over two parameter tensors sharing one thermostat (n = 3).
    let (eta, a, seed) = (0.04, 0.1, 5);
    let pa0 = [1.0f32, 2.0];
    let pb0 = [-1.0f32];
    let ua = [0.1f32, -0.2];
    let ub = [0.3f32];
    let ga = [0.5f32, 1.0];
    let gb = [-2.0f32];
    for kernel in KERNELS {
        let (pa, pb) = (var(&pa0), var(&pb0));
        let params = [pa.clone(), pb.clone()];
        let cfg = config(SamplerKind::Sgnht, eta, 0.0, 0.0, a);
        let mut s = Dynamics::init(cfg, &params, seed, kernel).unwrap();
        assert_eq!(s.thermostat, a, "α₀ = a");
        s.momentum = vec![buffer(&ua), buffer(&ub)];
        s.step(&params, &[t(&ga), t(&gb)]).unwrap();
        let sigma = (2.0 * a * eta).sqrt();
        let mut sumsq = 0.0;
        let tha = values(&pa);
        for i in 0..2 {
            let u = ua[i] as f64 * (1.0 - a) - eta * ga[i] as f64 + sigma * z(seed, 0, 0, i);
            sumsq += u * u;
            close(tha[i], pa0[i] as f64 + u);
        }
        let u = ub[0] as f64 * (1.0 - a) - eta * gb[0] as f64 + sigma * z(seed, 0, 1, 0);
        sumsq += u * u;
        close(values(&pb)[0], pb0[0] as f64 + u);
        let alpha = a + sumsq / 3.0 - eta;
        assert!(
            (s.thermostat - alpha).abs() < 1e-7,
            "{} vs {alpha}",
            s.thermostat
        );
        assert_eq!(s.diagnostics().thermostat, Some(s.thermostat));
    }
}

#[test]
fn msgnht_splitting_step_by_hand() {
    // Li et al. §3 in v-form, one element, a per-element thermostat. init: A (h/2):
    // θ₀' = θ₀ + u₀/2, α' = a + (u₀² − η)/2. step: B: u₁ = e^{−α'/2} u₀;
    // O: u₂ = u₁ − ηg + √(2aη) z; B: u₃ = e^{−α'/2} u₂; A (h): θ = θ₀' + u₃,
    // α = α' + u₃² − η.
    let (eta, a, seed) = (0.01, 0.2, 21);
    let mut cfg = record(SamplerKind::Msgnht, eta, 0.0, 0.0, a);
    cfg.integrator = Integrator::Splitting;
    let cfg = cfg.params().unwrap();
    for kernel in KERNELS {
        let p = var(&[0.7]);
        let mut s = Dynamics::init(cfg, std::slice::from_ref(&p), seed, kernel).unwrap();
        let u0 = host(&s.momentum, 0)[0] as f64;
        // u₀ ~ N(0, η) from the init stream.
        close(u0 as f32, eta.sqrt() * z(seed, sampler::INIT_STREAM, 0, 0));
        close(values(&p)[0], 0.7 + u0 / 2.0);
        let alpha_half = a + (u0 * u0 - eta) / 2.0;
        let g = 3.0f32;
        s.step(std::slice::from_ref(&p), &[t(&[g])]).unwrap();
        let damp = (-alpha_half / 2.0).exp();
        let z0 = (2.0 * a * eta).sqrt() * z(seed, 0, 0, 0);
        let u3 = ((u0 * damp) - eta * g as f64 + z0) * damp;
        close(values(&p)[0], 0.7 + u0 / 2.0 + u3);
        close(host(&s.momentum, 0)[0], u3);
        close(host(&s.per_element, 0)[0], alpha_half + u3 * u3 - eta);
    }
}

#[test]
fn msgnht_euler_thermostats_are_per_element() {
    // Two elements with different momenta get different thermostats: α_i += u_i² − η.
    let (eta, a, seed) = (0.01, 0.1, 2);
    for kernel in KERNELS {
        let p = var(&[0.0, 0.0]);
        let cfg = config(SamplerKind::Msgnht, eta, 0.0, 0.0, a);
        let mut s = Dynamics::init(cfg, std::slice::from_ref(&p), seed, kernel).unwrap();
        s.momentum = vec![buffer(&[0.5, 0.0])];
        s.step(std::slice::from_ref(&p), &[t(&[0.0, 0.0])]).unwrap();
        let sigma = (2.0 * a * eta).sqrt();
        let u: Vec<f64> = (0..2)
            .map(|i| [0.5, 0.0][i] * (1.0 - a) + sigma * z(seed, 0, 0, i))
            .collect();
        let al = host(&s.per_element, 0);
        close(al[0], a + u[0] * u[0] - eta);
        close(al[1], a + u[1] * u[1] - eta);
    }
}

#[test]
fn sghmc_splitting_step_by_hand() {
    // init: θ' = θ + v₀/2; step: v = e^{−α/2}(e^{−α/2} v₀ − ηg + √(2αη) z); θ = θ' + v.
    let (eta, alpha, seed) = (0.04, 0.3, 6);
    let mut cfg = record(SamplerKind::Sghmc, eta, alpha, 0.0, 0.0);
    cfg.integrator = Integrator::Splitting;
    let cfg = cfg.params().unwrap();
    for kernel in KERNELS {
        let p = var(&[1.0]);
        let mut s = Dynamics::init(cfg, std::slice::from_ref(&p), seed, kernel).unwrap();
        let v0 = host(&s.momentum, 0)[0] as f64;
        close(values(&p)[0], 1.0 + v0 / 2.0);
        s.step(std::slice::from_ref(&p), &[t(&[-2.0])]).unwrap();
        let d = (-alpha / 2.0).exp();
        let v = (v0 * d + eta * 2.0 + (2.0 * alpha * eta).sqrt() * z(seed, 0, 0, 0)) * d;
        close(values(&p)[0], 1.0 + v0 / 2.0 + v);
    }
}

#[test]
fn sgld_step() {
    // θ' = θ − ηg + √(2η)z.
    let (eta, seed) = (0.005, 9);
    let p0 = [0.5f32, -0.25];
    let g = [4.0f32, 2.0];
    let p = var(&p0);
    let mut s = sampler::build(
        config(SamplerKind::Sgld, eta, 0.0, 0.0, 0.0),
        std::slice::from_ref(&p),
        seed,
    )
    .unwrap();
    s.step(std::slice::from_ref(&p), &[t(&g)]).unwrap();
    let th = values(&p);
    for i in 0..2 {
        close(
            th[i],
            p0[i] as f64 - eta * g[i] as f64 + (2.0 * eta).sqrt() * z(seed, 0, 0, i),
        );
    }
    // The second step uses the next stream.
    s.step(std::slice::from_ref(&p), &[t(&[0.0, 0.0])]).unwrap();
    let th2 = values(&p);
    close(th2[0], th[0] as f64 + (2.0 * eta).sqrt() * z(seed, 1, 0, 0));
}

#[test]
fn sgd_and_momentum_steps() {
    // SGD: θ' = θ − ηg: (1, 2) − 0.1·(10, −10) = (0, 3).
    let p = var(&[1.0, 2.0]);
    let mut s = sampler::build(
        config(SamplerKind::Sgd, 0.1, 0.0, 0.0, 0.0),
        std::slice::from_ref(&p),
        0,
    )
    .unwrap();
    s.step(std::slice::from_ref(&p), &[t(&[10.0, -10.0])])
        .unwrap();
    let th = values(&p);
    close(th[0], 0.0);
    close(th[1], 3.0);
    // Momentum, α = 0.1: v₁ = −ηg = (−1, 1), θ₁ = (0, 3); v₂ = 0.9·v₁ − ηg = (−1.9, 1.9),
    // θ₂ = (−1.9, 4.9).
    let p = var(&[1.0, 2.0]);
    let mut s = sampler::build(
        config(SamplerKind::Momentum, 0.1, 0.1, 0.0, 0.0),
        std::slice::from_ref(&p),
        0,
    )
    .unwrap();
    s.step(std::slice::from_ref(&p), &[t(&[10.0, -10.0])])
        .unwrap();
    s.step(std::slice::from_ref(&p), &[t(&[10.0, -10.0])])
        .unwrap();
    let th = values(&p);
    close(th[0], -1.9);
    close(th[1], 4.9);
}

#[test]
fn invalid_hyperparameters_are_rejected() {
    let p = var(&[0.0]);
    for (cfg, needle) in [
        (
            record(SamplerKind::Sghmc, -1.0, 0.1, 0.0, 0.0),
            "step size must be positive",
        ),
        (
            record(SamplerKind::Sghmc, 1e-6, 1.5, 0.0, 0.0),
            "friction must be in",
        ),
        (
            record(SamplerKind::Momentum, 1e-6, 0.0, 0.0, 0.0),
            "friction must be in",
        ),
        (
            record(SamplerKind::Sghmc, 1e-6, 0.1, 0.2, 0.0),
            "noise estimate must be in",
        ),
        (
            record(SamplerKind::Sgnht, 1e-6, 0.0, 0.0, -0.1),
            "diffusion must be non-negative",
        ),
        (
            SamplerConfig {
                integrator: Integrator::Splitting,
                ..record(SamplerKind::Sgld, 1e-6, 0.0, 0.0, 0.0)
            },
            "the splitting integrator applies to",
        ),
    ] {
        let e = cfg
            .params()
            .and_then(|c| sampler::build(c, std::slice::from_ref(&p), 0))
            .err()
            .expect("must fail")
            .to_string();
        assert!(e.contains(needle) && !e.contains("--"), "{e}");
    }
}

/// Every sampler, fused and composed, both integrators: a sampler restored from another's
/// state (on the parameters saved with it) makes the same next updates, bit for bit, and
/// reports the same diagnostics. Includes a step-size change before the state is taken.
#[test]
fn a_restored_state_continues_bit_for_bit() {
    let shapes: [&[usize]; 2] = [&[3, 5], &[5]];
    let grads = |step: usize| -> Vec<Tensor> {
        shapes
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let n: usize = s.iter().product();
                let v: Vec<f32> = (0..n)
                    .map(|j| ((step * 31 + i * 7 + j) as f32 * 0.37).sin())
                    .collect();
                Tensor::from_vec(v, *s, &Device::Cpu).unwrap()
            })
            .collect()
    };
    let fresh = || -> Vec<Var> {
        shapes
            .iter()
            .map(|s| {
                Var::from_tensor(&Tensor::ones(*s, candle_core::DType::F32, &Device::Cpu).unwrap())
                    .unwrap()
            })
            .collect()
    };
    let bits = |vars: &[Var]| -> Vec<u32> {
        vars.iter()
            .flat_map(|v| {
                v.as_tensor()
                    .flatten_all()
                    .unwrap()
                    .to_vec1::<f32>()
                    .unwrap()
            })
            .map(f32::to_bits)
            .collect()
    };
    for kind in [
        SamplerKind::Sgld,
        SamplerKind::Psgld,
        SamplerKind::Sghmc,
        SamplerKind::Sgnht,
        SamplerKind::Msgnht,
        SamplerKind::Sgd,
        SamplerKind::Momentum,
    ] {
        for integrator in [Integrator::Euler, Integrator::Splitting] {
            let cfg = SamplerConfig {
                integrator,
                ..kind.defaults()
            };
            let Ok(cfg) = cfg.params() else {
                continue; // splitting only where it applies
            };
            for kernel in [sampler::Kernel::Fused, sampler::Kernel::Composed] {
                let what = format!("{} {integrator:?} {kernel:?}", kind.name());
                let params = fresh();
                let mut a = sampler::build_with(cfg, &params, 9, kernel).unwrap();
                for s in 0..3 {
                    a.step(&params, &grads(s)).unwrap();
                }
                a.set_step_size(cfg.step_size() * 0.5).unwrap();
                a.step(&params, &grads(3)).unwrap();
                let state = a.state().unwrap();
                let saved: Vec<Tensor> = params
                    .iter()
                    .map(|p| p.as_tensor().copy().unwrap())
                    .collect();

                // Another sampler, built (its init may move the parameters: splitting's first
                // half-step), then given the saved parameters and state.
                let other = fresh();
                let mut b = sampler::build_with(cfg, &other, 9, kernel).unwrap();
                for (p, s) in other.iter().zip(&saved) {
                    p.set(s).unwrap();
                }
                b.restore(&state).unwrap();
                assert_eq!(b.steps(), 4, "{what}");
                for s in 4..7 {
                    a.step(&params, &grads(s)).unwrap();
                    b.step(&other, &grads(s)).unwrap();
                }
                assert_eq!(bits(&params), bits(&other), "{what}: parameters");
                let (da, db) = (a.diagnostics(), b.diagnostics());
                assert_eq!(
                    da.kinetic_energy.map(f64::to_bits),
                    db.kinetic_energy.map(f64::to_bits),
                    "{what}"
                );
                assert_eq!(
                    da.thermostat.map(f64::to_bits),
                    db.thermostat.map(f64::to_bits),
                    "{what}"
                );
                // And the restore really carried something: a sampler that was not restored
                // drifts apart (all but SGD, whose update has no state beyond η).
                if kind != SamplerKind::Sgd {
                    let third = fresh();
                    let mut c = sampler::build_with(cfg, &third, 9, kernel).unwrap();
                    for (p, s) in third.iter().zip(&saved) {
                        p.set(s).unwrap();
                    }
                    c.set_step_size(cfg.step_size() * 0.5).unwrap();
                    for s in 4..7 {
                        c.step(&third, &grads(s)).unwrap();
                    }
                    assert_ne!(
                        bits(&params),
                        bits(&third),
                        "{what}: the state made no difference"
                    );
                }
            }
        }
    }
}
