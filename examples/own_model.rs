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
//! example runs offline; any `bnn_core::data::Dataset` works the same way (`--dataset
//! mnist` reads the full set from `BNN_DATA_DIR`). `lr` is the step on the mean loss
//! (η·N), so the default serves both sizes: `--lr X` to try another, `--seed S` for
//! another chain.
//!
//! It uses `bnn-core` alone: the optimizer, the ensemble, the seeded initialisation and
//! the sample file are all there.

use std::collections::BTreeMap;

use bnn_core::data::{load, LoadOptions};
use bnn_core::{init_seeded, vars_by_name, Accumulator, Config, Optimizer, Sghmc, SghmcParams};
use candle_core::{DType, Device, Module, Tensor};
use candle_nn::{linear, loss, ops, Linear, VarBuilder, VarMap};
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

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse()?;
    let dev = Device::Cpu;
    let data = load(&args.dataset, &LoadOptions::default())?;
    let (train, test) = (&data.train, &data.test);

    let varmap = VarMap::new();
    let net = Net::new(VarBuilder::from_varmap(&varmap, DType::F32, &dev))?;
    // candle_nn draws initial weights from an unseeded RNG: set them from a seeded one so
    // that every run of the example gives the same numbers.
    init_seeded(&varmap, 3)?;
    // lr = η·N, the step on the mean minibatch loss: the same for 10,000 images or 60,000.
    let config = Config {
        dynamics: SghmcParams {
            lr: args.lr,
            ..Default::default()
        },
        seed: args.seed,
        ..Config::new(train.len())
    };
    // The vars sorted by name: a fixed order, which keys each parameter's noise.
    let mut opt = Sghmc::new(vars_by_name(&varmap)?, config)?;

    let test_x = Tensor::from_vec(all_images(test), (test.len(), PIXELS), &dev)?;
    let mut ensemble = Accumulator::with_classes(&test.labels, CLASSES)?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let (mut x, mut y) = (Vec::new(), Vec::new());
    for epoch in 0..args.epochs {
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

    save_last_sample(&varmap, &dev)
}

/// The last sample as a posterior-sample file (readable by `bnn_core::load_sample` and
/// Python's safetensors), its tensors by the VarMap's names; read back.
fn save_last_sample(varmap: &VarMap, dev: &Device) -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::temp_dir().join("bnn-own-model-sample.safetensors");
    let tensors: Vec<(String, Tensor)> = {
        let map = varmap
            .data()
            .lock()
            .map_err(|_| "the VarMap's lock is poisoned")?;
        let mut named: Vec<_> = map
            .iter()
            .map(|(n, v)| (n.clone(), v.as_detached_tensor()))
            .collect();
        named.sort_by(|a, b| a.0.cmp(&b.0));
        named
    };
    let meta = BTreeMap::from([("model".to_string(), "784-64-32-10 tanh".to_string())]);
    bnn_core::write_sample_file(&path, &tensors, &meta)?;
    let back = bnn_core::load_sample(&path, dev)?;
    println!(
        "last sample: {} ({} tensors)",
        path.display(),
        back.tensors.len()
    );
    Ok(())
}

/// The command line: `[--epochs N] [--lr X] [--seed S] [--dataset NAME]`.
struct Args {
    epochs: usize,
    lr: f64,
    seed: u64,
    dataset: String,
}

impl Args {
    fn parse() -> Result<Self, String> {
        let mut a = Args {
            epochs: 6,
            lr: SghmcParams::default().lr,
            seed: 1,
            dataset: "mnist-mini".into(),
        };
        let mut it = std::env::args().skip(1);
        let usage =
            "usage: own_model [--epochs N] [--lr X] [--seed S] [--dataset mnist-mini|mnist]";
        while let Some(flag) = it.next() {
            let value = it.next().ok_or(usage)?;
            let bad = |_| format!("{flag} takes a number, got {value:?}");
            match flag.as_str() {
                "--epochs" => a.epochs = value.parse().map_err(bad)?,
                "--lr" => {
                    a.lr = value
                        .parse()
                        .map_err(|_| format!("--lr takes a number, got {value:?}"))?
                }
                "--seed" => a.seed = value.parse().map_err(bad)?,
                "--dataset" => a.dataset = value,
                _ => return Err(usage.into()),
            }
        }
        Ok(a)
    }
}

/// Every image of `split`, scaled to [0, 1], row after row.
fn all_images(split: &bnn_core::data::Split) -> Vec<f32> {
    let rows: Vec<usize> = (0..split.len()).collect();
    let (mut x, mut y) = (Vec::new(), Vec::new());
    split.gather(&rows, &mut x, &mut y);
    x
}
