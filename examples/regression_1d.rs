//! The picture every BNN user draws first, through the library: a 1-D regression whose
//! uncertainty band widens away from the data.
//!
//! Data: y = sin(3x) + ε, ε ~ N(0, 0.1²), 100 points on each of x ∈ [−1, −0.3] and
//! x ∈ [0.3, 1], nothing in between (seeded). Model: a 1-50-50-1 tanh network written
//! with `candle_nn`, a Gaussian likelihood with the noise σ = 0.1 known, a N(0, 1) prior,
//! sampled by SGHMC through the `candle_nn::Optimizer` interface; the samples' predictions
//! on a grid of x ∈ [−2, 2] are streamed into `bnn_core::regression`'s accumulator.
//!
//! ```sh
//! cargo run --release --example regression_1d                   # prints the band
//! cargo run --release --example regression_1d -- band.csv       # and writes it as CSV
//! cargo run --release --example regression_1d -- --seed 2       # another noise seed
//! ```
//!
//! It checks what the picture should show and exits non-zero otherwise: the ensemble's
//! predictive σ at x = 0 (the gap) and at x = ±1.5 (beyond the data) is at least 3× its
//! mean σ over the data.

use bnn_core::{
    init_seeded, vars_by_name, Config, GaussianNoise, Noise, Optimizer, RegressionAccumulator,
    Sghmc, SghmcParams,
};
use candle_core::{DType, Device, Module, Tensor};
use candle_nn::{linear, Linear, VarBuilder, VarMap};
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Normal};

/// The noise of the data, known to the likelihood.
const NOISE_STD: f64 = 0.1;

struct Net {
    layers: [Linear; 3],
}

impl Net {
    fn new(vb: VarBuilder) -> candle_core::Result<Self> {
        Ok(Net {
            layers: [
                linear(1, 50, vb.pp("a"))?,
                linear(50, 50, vb.pp("b"))?,
                linear(50, 1, vb.pp("c"))?,
            ],
        })
    }

    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let h = self.layers[0].forward(x)?.tanh()?;
        let h = self.layers[1].forward(&h)?.tanh()?;
        self.layers[2].forward(&h)
    }
}

/// 100 points on each interval, y = sin(3x) + N(0, 0.1²).
fn toy_data(seed: u64) -> (Vec<f32>, Vec<f32>) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let noise = Normal::new(0.0, NOISE_STD).expect("a positive σ");
    let mut x = Vec::new();
    for (lo, hi) in [(-1.0, -0.3), (0.3, 1.0)] {
        x.extend((0..100).map(|_| rng.random_range(lo..hi)));
    }
    let y = x
        .iter()
        .map(|&v: &f64| (3.0 * v).sin() + noise.sample(&mut rng))
        .collect::<Vec<f64>>();
    (
        x.iter().map(|&v| v as f32).collect(),
        y.iter().map(|&v| v as f32).collect(),
    )
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (seed, out) = args()?;
    let dev = Device::Cpu;
    let (x, y) = toy_data(0);
    let n = x.len();
    let (xt, yt) = (
        Tensor::from_vec(x.clone(), (n, 1), &dev)?,
        Tensor::from_vec(y, (n, 1), &dev)?,
    );

    let varmap = VarMap::new();
    let net = Net::new(VarBuilder::from_varmap(&varmap, DType::F32, &dev))?;
    init_seeded(&varmap, 3)?;
    // lr = η·N on the mean loss; a regression's likelihood is sharper than a
    // classification's by its noise precision (here 100), so a far smaller lr.
    let config = Config {
        dynamics: SghmcParams {
            lr: 1e-3,
            ..Default::default()
        },
        seed,
        ..Config::new(n)
    };
    let mut opt = Sghmc::new(vars_by_name(&varmap)?, config)?;
    // σ known: τ = 1/σ² fixed (`Noise::DEFAULT` would sample it, with `opt.gibbs_step`).
    let noise = GaussianNoise::new(Noise::Fixed { std: NOISE_STD })?;

    let grid: Vec<f32> = (0..=400).map(|i| -2.0 + i as f32 * 0.01).collect();
    let grid_t = Tensor::from_vec(grid.clone(), (grid.len(), 1), &dev)?;
    let mut band = RegressionAccumulator::without_targets(grid.len());
    let (steps, burnin, thin) = (15_000u64, 5_000u64, 50u64);
    for _ in 0..steps {
        // Full batch: the mean NLL of the Gaussian likelihood.
        opt.backward_step(&noise.nll(&net.forward(&xt)?, &yt)?)?;
        if opt.steps() > burnin && opt.steps() % thin == 0 {
            let mean: Vec<f64> = net
                .forward(&grid_t)?
                .flatten_all()?
                .to_vec1::<f32>()?
                .iter()
                .map(|&v| v as f64)
                .collect();
            band.add(&mean, &vec![1.0 / noise.precision; grid.len()])?;
        }
    }
    report(&grid, &band.predictive(), band.samples(), out)
}

/// Prints the predictive σ on the data, in the gap and outside, writes the band as CSV to
/// `out` if given, and fails unless the band widens off the data.
fn report(
    grid: &[f32],
    pred: &[(f64, f64)],
    samples: usize,
    out: Option<String>,
) -> Result<(), Box<dyn std::error::Error>> {
    let sd_at = |x0: f32| {
        let i = grid
            .iter()
            .position(|&g| (g - x0).abs() < 0.005)
            .expect("on the grid");
        pred[i].1.sqrt()
    };
    let on_data: Vec<f64> = grid
        .iter()
        .zip(pred)
        .filter(|(g, _)| (0.3..=1.0).contains(&g.abs()))
        .map(|(_, p)| p.1.sqrt())
        .collect();
    let data_sd = on_data.iter().sum::<f64>() / on_data.len() as f64;
    println!("{samples} samples; predictive σ: {data_sd:.3} on the data (mean),");
    println!(
        "  {:.3} at x = 0 (the gap), {:.3} at x = −1.5, {:.3} at x = 1.5",
        sd_at(0.0),
        sd_at(-1.5),
        sd_at(1.5)
    );
    if let Some(path) = out {
        let mut csv = String::from("x,mean,sd\n");
        for (g, (m, v)) in grid.iter().zip(pred) {
            csv.push_str(&format!("{g},{m},{}\n", v.sqrt()));
        }
        std::fs::write(&path, csv)?;
        println!("band: {path}");
    }
    for x0 in [0.0, -1.5, 1.5] {
        if sd_at(x0) < 3.0 * data_sd {
            return Err(format!(
                "the band does not widen at x = {x0}: σ {:.3} < 3 × {data_sd:.3}",
                sd_at(x0)
            )
            .into());
        }
    }
    Ok(())
}

/// `[--seed N] [CSV]`: the seed of the sampler's noise (default 1) and where to write
/// the band.
fn args() -> Result<(u64, Option<String>), String> {
    let (mut seed, mut out) = (1, None);
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match (a.as_str(), out.is_none()) {
            ("--seed", _) => {
                let n = args.next().ok_or("--seed takes a number")?;
                seed = n
                    .parse()
                    .map_err(|_| format!("--seed takes a number, got {n:?}"))?;
            }
            (_, true) if !a.starts_with('-') => out = Some(a),
            _ => return Err("usage: regression_1d [--seed N] [CSV]".into()),
        }
    }
    Ok((seed, out))
}
