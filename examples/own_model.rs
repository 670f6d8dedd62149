//! A network of your own, sampled by a `bnn` sampler.
//!
//! The model is written with `candle_nn` layers (784-64-32-10 with tanh: `bnn` has no such
//! preset); SGHMC samples its weights through the `candle_nn::Optimizer` interface; every
//! 20 updates after burn-in the current weights are a posterior sample, whose test-set
//! predictions go into the streaming Bayesian model average; the last sample is kept as a
//! safetensors file in the format of `bnn train`'s run folders.
//!
//! ```sh
//! cargo run --release --example own_model              # 6 epochs on the built-in subset
//! cargo run --release --example own_model -- --epochs 3
//! ```
//!
//! The data are the built-in MNIST subset (10,000 training and 10,000 test images), so the
//! example runs offline; any `bnn_core::data::Dataset` works the same way.

use std::collections::BTreeMap;

use bnn_core::data::{load, LoadOptions};
use bnn_core::ensemble::Accumulator;
use bnn_core::sampler::optim::{OptimizerConfig, Sghmc};
use candle_core::{DType, Device, Module, Tensor, Var};
use candle_nn::{linear, loss, ops, Linear, Optimizer, VarBuilder, VarMap};
use rand::{Rng, SeedableRng};

const PIXELS: usize = 784;
const CLASSES: usize = 10;

/// The user's network: three `candle_nn::Linear` layers with tanh between them.
struct Net {
    layers: [Linear; 3],
}

impl Net {
    fn new(vb: VarBuilder) -> candle_core::Result<Self> {
        Ok(Net {
            layers: [
                linear(PIXELS, 64, vb.pp("a"))?,
                linear(64, 32, vb.pp("b"))?,
                linear(32, CLASSES, vb.pp("c"))?,
            ],
        })
    }

    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let h = self.layers[0].forward(x)?.tanh()?;
        let h = self.layers[1].forward(&h)?.tanh()?;
        self.layers[2].forward(&h)
    }
}

/// The names of the vars in a fixed order: the order keys each parameter's noise stream.
const NAMES: [&str; 6] = [
    "a.weight", "a.bias", "b.weight", "b.bias", "c.weight", "c.bias",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let epochs = epochs_from_args()?;
    let dev = Device::Cpu;
    let data = load("mnist-mini", &LoadOptions::default())?;
    let (train, test) = (&data.train, &data.test);

    let mut varmap = VarMap::new();
    let net = Net::new(VarBuilder::from_varmap(&varmap, DType::F32, &dev))?;
    // candle_nn draws initial weights from an unseeded RNG: set them from a seeded one so
    // that every run of the example gives the same numbers.
    seeded_init(&mut varmap, 3)?;
    let vars: Vec<Var> = NAMES
        .iter()
        .map(|n| varmap.data().lock().map(|m| m[*n].clone()))
        .collect::<Result<_, _>>()
        .map_err(|_| "the VarMap's lock is poisoned")?;

    // N = 10,000 training images: the drift is η·N·∇(mean loss), and the default η is
    // tuned for N = 60,000, so η is scaled by 6.
    let mut config = OptimizerConfig {
        seed: 1,
        ..OptimizerConfig::new(train.len())
    };
    config.sampler.step_size = 1.2e-5;
    let mut opt = Sghmc::new(vars, config)?;

    let test_x = Tensor::from_vec(all_images(test), (test.len(), PIXELS), &dev)?;
    let mut ensemble = Accumulator::with_classes(&test.labels, CLASSES)?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let (mut x, mut y) = (Vec::new(), Vec::new());
    for epoch in 0..epochs {
        let mut order: Vec<usize> = (0..train.len()).collect();
        for i in (1..order.len()).rev() {
            order.swap(i, rng.random_range(0..=i));
        }
        for batch in order.chunks(100) {
            train.gather(batch, &mut x, &mut y);
            let xb = Tensor::from_slice(&x, (batch.len(), PIXELS), &dev)?;
            let yb = Tensor::from_slice(&y, batch.len(), &dev)?;
            opt.backward_step(&loss::cross_entropy(&net.forward(&xb)?, &yb)?)?;
            // After two epochs of burn-in, a posterior sample every 20 updates.
            if epoch >= 2 && opt.steps().is_multiple_of(20) {
                let probs = ops::softmax_last_dim(&net.forward(&test_x)?)?;
                ensemble.add(&probs.flatten_all()?.to_vec1()?)?;
            }
        }
        if let Some(m) = ensemble.metrics() {
            println!(
                "epoch {}: {} samples, ensemble accuracy {:.4}, NLL {:.4}",
                epoch + 1,
                ensemble.samples(),
                m.accuracy,
                m.nll
            );
        }
    }
    let m = ensemble
        .metrics()
        .ok_or("no sample was kept: run more than 2 epochs")?;
    let last = ensemble.last_sample.ok_or("no last sample")?;
    println!(
        "{} samples: ensemble accuracy {:.4}, NLL {:.4}, ECE {:.4}; the last sample alone {:.4}, NLL {:.4}",
        ensemble.samples(),
        m.accuracy,
        m.nll,
        m.ece,
        last.accuracy,
        last.nll
    );

    // The last sample as a posterior-sample file (readable by `bnn_run::checkpoint::
    // load_sample` and Python's safetensors).
    let path = std::env::temp_dir().join("bnn-own-model-sample.safetensors");
    let tensors: Vec<(String, Tensor)> = NAMES
        .iter()
        .zip(opt.vars())
        .map(|(n, v)| (n.to_string(), v.as_detached_tensor()))
        .collect();
    let meta = BTreeMap::from([("model".to_string(), "784-64-32-10 tanh".to_string())]);
    bnn_run::checkpoint::write_sample_file(&path, &tensors, &meta)?;
    println!("last sample: {}", path.display());
    Ok(())
}

/// `--epochs N` (default 6).
fn epochs_from_args() -> Result<usize, String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.as_slice() {
        [] => Ok(6),
        [flag, n] if flag == "--epochs" => n
            .parse()
            .map_err(|_| format!("--epochs takes a number, got {n:?}")),
        _ => Err("usage: own_model [--epochs N]".into()),
    }
}

/// Every image of `split`, scaled to [0, 1], row after row.
fn all_images(split: &bnn_core::data::Split) -> Vec<f32> {
    let rows: Vec<usize> = (0..split.len()).collect();
    let (mut x, mut y) = (Vec::new(), Vec::new());
    split.gather(&rows, &mut x, &mut y);
    x
}

/// Sets each var to U(−1/√fan_in, 1/√fan_in) draws from a seeded RNG (the bound
/// candle_nn's `linear` uses for its bias).
fn seeded_init(varmap: &mut VarMap, seed: u64) -> candle_core::Result<()> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    for name in NAMES {
        let shape: Vec<usize> = varmap
            .data()
            .lock()
            .map_err(|_| candle_core::Error::Msg("poisoned VarMap".into()))?[name]
            .dims()
            .to_vec();
        // Weights are (out, in); a bias is (out,) and takes the fan-in of its weight.
        let fan_in = match shape.as_slice() {
            [_, i] => *i,
            _ => varmap
                .data()
                .lock()
                .map_err(|_| candle_core::Error::Msg("poisoned VarMap".into()))?
                [&name.replace("bias", "weight")]
                .dims()[1],
        };
        let bound = 1.0 / (fan_in as f32).sqrt();
        let n: usize = shape.iter().product();
        let values: Vec<f32> = (0..n).map(|_| rng.random_range(-bound..bound)).collect();
        varmap.set_one(name, Tensor::from_vec(values, shape, &Device::Cpu)?)?;
    }
    Ok(())
}
