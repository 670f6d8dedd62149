//! Minibatch noise against an exact posterior: each sampler, through the optimizer
//! interface, on the linear-Gaussian posterior of the diabetes table, whose mean and
//! covariance are known in closed form.
//!
//! Model: y = Xw + b + ε, ε ~ N(0, σ²) with σ = 0.7 (standardised target units), the ten
//! standardised features of `diabetes.csv` (80% training split, seed 0) and a bias, a
//! N(0, 1) prior on all 11 coordinates: the posterior is N(μ, Σ) with
//! Σ = (XᵀX/σ² + I)⁻¹, μ = Σ·Xᵀy/σ². Each line reports, after a tenth of the updates as
//! burn-in, a sample every 5 updates:
//!
//! - the per-coordinate variance ratio (sample variance / Σᵢᵢ), min and max over the 11;
//! - the largest |sample mean − μᵢ| in posterior sd;
//! - the configurational temperature θ·∇U(θ)/D averaged over the samples (∇U the full-data
//!   gradient): E_π[θ·∇U] = D·T for any posterior, by integration by parts, so 1 for a
//!   correct sampler whatever the minibatches.
//!
//! Minibatches are drawn as `bnn train` draws them (a fresh permutation each epoch, batches
//! in turn: `epoch`) or independently with replacement (`iid`), so that the two kinds of
//! gradient noise can be told apart.
//!
//! ```sh
//! BNN_DATA_DIR=../shared/data cargo run --release --example minibatch_posterior -- \
//!     --seed 1 --steps 100000 --batch 100
//! ```
//!
//! Prints CSV: sampler,multiple,minibatches,batch,seed,ratio_min,ratio_max,mean_err_sd,t_config.
//! `--diffusion A` sets the thermostats' a (SGNHT, mSGNHT).

use bnn_core::{
    load_table, Config, GaussianNoise, MsgnhtParams, Noise, Optimizer, Params, Posterior,
    PriorSpec, SgMcmc, SghmcParams, SgldParams, SgnhtParams,
};
use candle_core::{DType, Device, Tensor, Var};
use rand::{Rng, SeedableRng};

/// σ of the likelihood, in standardised target units.
const SIGMA: f64 = 0.7;
/// The step every multiple scales: η = 1.41·10⁻⁵ (`bnn train`'s default for this table),
/// as lr = η·N.
const BASE_ETA: f64 = 1.41e-5;

/// The design matrix (a bias column last) and the targets of the training split.
struct Problem {
    x: Vec<Vec<f64>>,
    y: Vec<f64>,
    mean: Vec<f64>,
    var: Vec<f64>,
}

impl Problem {
    fn load() -> Result<Self, Box<dyn std::error::Error>> {
        let dir = std::env::var("BNN_DATA_DIR").map_err(|_| "set BNN_DATA_DIR")?;
        let path = std::path::Path::new(&dir).join("tabular/diabetes.csv");
        let ds = load_table(path, "progression", 0.2, 0)?;
        let (train, rows) = (&ds.train, (0..ds.train.len()).collect::<Vec<_>>());
        let (mut xs, mut labels, mut ys) = (Vec::new(), Vec::new(), Vec::new());
        train.gather(&rows, &mut xs, &mut labels);
        train.gather_values(&rows, &mut ys);
        let d0 = train.dim();
        let x: Vec<Vec<f64>> = xs
            .chunks_exact(d0)
            .map(|r| r.iter().map(|&v| v as f64).chain([1.0]).collect())
            .collect();
        let y: Vec<f64> = ys.iter().map(|&v| v as f64).collect();
        let d = d0 + 1;
        // The posterior precision XᵀX/σ² + I and Xᵀy/σ².
        let mut a = vec![vec![0.0; d]; d];
        let mut b = vec![0.0; d];
        for (row, &t) in x.iter().zip(&y) {
            for j in 0..d {
                b[j] += row[j] * t / (SIGMA * SIGMA);
                for k in 0..d {
                    a[j][k] += row[j] * row[k] / (SIGMA * SIGMA);
                }
            }
        }
        (0..d).for_each(|j| a[j][j] += 1.0);
        let mean = solve(&a, &b);
        let var = (0..d)
            .map(|j| {
                solve(
                    &a,
                    &(0..d).map(|k| (k == j) as u8 as f64).collect::<Vec<_>>(),
                )[j]
            })
            .collect();
        Ok(Problem { x, y, mean, var })
    }

    /// θ·∇U(θ)/D with the full-data potential U = Σ(xθ − y)²/(2σ²) + |θ|²/2.
    fn configurational_temperature(&self, theta: &[f64]) -> f64 {
        let d = theta.len();
        let mut grad: Vec<f64> = theta.to_vec();
        for (row, &t) in self.x.iter().zip(&self.y) {
            let r: f64 = row.iter().zip(theta).map(|(a, b)| a * b).sum::<f64>() - t;
            for k in 0..d {
                grad[k] += r * row[k] / (SIGMA * SIGMA);
            }
        }
        theta.iter().zip(&grad).map(|(a, b)| a * b).sum::<f64>() / d as f64
    }
}

/// Solves a·x = b (a symmetric positive definite) by Gaussian elimination.
fn solve(a: &[Vec<f64>], b: &[f64]) -> Vec<f64> {
    let (mut a, mut b, n) = (a.to_vec(), b.to_vec(), b.len());
    for i in 0..n {
        let pivot = a[i].clone();
        for j in i + 1..n {
            let f = a[j][i] / pivot[i];
            for (ajk, &aik) in a[j].iter_mut().zip(&pivot).skip(i) {
                *ajk -= f * aik;
            }
            b[j] -= f * b[i];
        }
    }
    let mut x = vec![0.0; n];
    for i in (0..n).rev() {
        let s: f64 = (i + 1..n).map(|k| a[i][k] * x[k]).sum();
        x[i] = (b[i] - s) / a[i][i];
    }
    x
}

/// What one run measured.
struct Measured {
    ratio_min: f64,
    ratio_max: f64,
    mean_err: f64,
    t_config: f64,
}

/// The command line.
struct Args {
    seed: u64,
    steps: usize,
    batch: usize,
    multiples: Vec<f64>,
    /// The thermostats' diffusion a (default 0.1, `bnn train`'s).
    diffusion: f64,
}

/// One chain of `steps` updates of the sampler of `dynamics`.
fn run<P: Params>(p: &Problem, dynamics: P, iid: bool, a: &Args) -> candle_core::Result<Measured> {
    let (n, d, dev) = (p.x.len(), p.x[0].len(), Device::Cpu);
    let w = Var::zeros((d, 1), DType::F32, &dev)?;
    let posterior = Posterior {
        prior: PriorSpec::Gaussian { std: 1.0 },
        ..Posterior::new(n)
    };
    let config = Config {
        dynamics,
        posterior,
        seed: a.seed,
        ..Config::new(n)
    };
    let mut opt = SgMcmc::<P>::new(vec![w.clone()], config)?;
    let noise = GaussianNoise::new(Noise::Fixed { std: SIGMA })?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(a.seed ^ 0x5eed);
    let (mut order, mut next) = ((0..n).collect::<Vec<usize>>(), n);
    let (mut s1, mut s2, mut count, mut t_sum) = (vec![0.0; d], vec![0.0; d], 0.0, 0.0);
    for t in 0..a.steps {
        let rows: Vec<usize> = if iid {
            (0..a.batch).map(|_| rng.random_range(0..n)).collect()
        } else {
            if next + a.batch > n {
                for i in (1..n).rev() {
                    order.swap(i, rng.random_range(0..=i));
                }
                next = 0;
            }
            next += a.batch;
            order[next - a.batch..next].to_vec()
        };
        let xb: Vec<f32> = rows
            .iter()
            .flat_map(|&i| p.x[i].iter().map(|&v| v as f32))
            .collect();
        let yb: Vec<f32> = rows.iter().map(|&i| p.y[i] as f32).collect();
        let pred = Tensor::from_vec(xb, (a.batch, d), &dev)?.matmul(w.as_tensor())?;
        let target = Tensor::from_vec(yb, (a.batch, 1), &dev)?;
        opt.backward_step(&noise.nll(&pred, &target)?)?;
        if t >= a.steps / 10 && t % 5 == 0 {
            let theta: Vec<f64> = w
                .as_tensor()
                .flatten_all()?
                .to_vec1::<f32>()?
                .iter()
                .map(|&v| v as f64)
                .collect();
            t_sum += p.configurational_temperature(&theta);
            for k in 0..d {
                s1[k] += theta[k];
                s2[k] += theta[k] * theta[k];
            }
            count += 1.0;
        }
    }
    let ratios: Vec<f64> = (0..d)
        .map(|k| (s2[k] / count - (s1[k] / count).powi(2)) / p.var[k])
        .collect();
    Ok(Measured {
        ratio_min: ratios.iter().cloned().fold(f64::INFINITY, f64::min),
        ratio_max: ratios.iter().cloned().fold(0.0, f64::max),
        mean_err: (0..d)
            .map(|k| ((s1[k] / count - p.mean[k]) / p.var[k].sqrt()).abs())
            .fold(0.0, f64::max),
        t_config: t_sum / count,
    })
}

fn parse() -> Result<Args, String> {
    let mut a = Args {
        seed: 1,
        steps: 100_000,
        batch: 100,
        multiples: vec![1.0, 4.0, 16.0, 36.0],
        diffusion: SgnhtParams::default().diffusion,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let v = it.next().ok_or(format!("{flag} takes a value"))?;
        let bad = |_: std::num::ParseIntError| format!("{flag}: not a number: {v}");
        match flag.as_str() {
            "--seed" => a.seed = v.parse().map_err(bad)?,
            "--steps" => a.steps = v.parse().map_err(bad)?,
            "--batch" => a.batch = v.parse().map_err(bad)?,
            "--diffusion" => {
                a.diffusion = v.parse().map_err(|_| format!("--diffusion: not a number: {v}"))?
            }
            "--multiples" => {
                a.multiples = v.split(',').map(|m| m.parse().map_err(|_| format!("--multiples: {m}"))).collect::<Result<_, _>>()?
            }
            _ => return Err("usage: minibatch_posterior [--seed S] [--steps N] [--batch B] [--multiples 1,4,16,36] [--diffusion A]".into()),
        }
    }
    Ok(a)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let a = parse()?;
    let p = Problem::load()?;
    let n = p.x.len();
    println!("sampler,multiple,minibatches,batch,seed,ratio_min,ratio_max,mean_err_sd,t_config");
    for &m in &a.multiples {
        let lr = BASE_ETA * m * n as f64;
        for iid in [false, true] {
            let rows = [
                ("sgld", run(&p, SgldParams { lr }, iid, &a)?),
                (
                    "sghmc",
                    run(
                        &p,
                        SghmcParams {
                            lr,
                            ..Default::default()
                        },
                        iid,
                        &a,
                    )?,
                ),
                (
                    "sgnht",
                    run(
                        &p,
                        SgnhtParams {
                            lr,
                            diffusion: a.diffusion,
                            ..Default::default()
                        },
                        iid,
                        &a,
                    )?,
                ),
                (
                    "msgnht",
                    run(
                        &p,
                        MsgnhtParams {
                            lr,
                            diffusion: a.diffusion,
                            ..Default::default()
                        },
                        iid,
                        &a,
                    )?,
                ),
            ];
            for (name, r) in rows {
                let kind = if iid { "iid" } else { "epoch" };
                println!(
                    "{name},{m},{kind},{},{},{:.3},{:.3},{:.3},{:.3}",
                    a.batch, a.seed, r.ratio_min, r.ratio_max, r.mean_err, r.t_config
                );
            }
        }
    }
    Ok(())
}
