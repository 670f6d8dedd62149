//! A convolutional network of `candle_nn::conv2d` layers, sampled by SGNHT.
//!
//! conv 5×5 (1→8) · ReLU · max-pool 2 · conv 5×5 (8→16) · ReLU · max-pool 2 · linear
//! (256→10), written with `candle_nn` as any candle user would; `bnn_core`'s SGNHT (its
//! default splitting integrator and step) samples its weights through the
//! `candle_nn::Optimizer` interface; after a burn-in epoch, every 25 updates the current
//! weights are a posterior sample whose test predictions enter the Bayesian model average.
//! At the end it saves the sampler's state (θ included) and checks that a restored copy
//! continues bit for bit.
//!
//! ```sh
//! cargo run --release --example own_cnn                  # 3 epochs on the built-in subset
//! cargo run --release --example own_cnn -- --epochs 5
//! ```

use bnn_core::data::{load, LoadOptions, Split};
use bnn_core::{init_seeded, vars_by_name, Accumulator, Config, Optimizer, OptimizerState, Sgnht};
use candle_core::{DType, Device, Module, Tensor};
use candle_nn::{conv2d, linear, loss, ops, Conv2d, Conv2dConfig, Linear, VarBuilder, VarMap};
use rand::{Rng, SeedableRng};

/// Test images scored per sample (of 10,000): enough for the ensemble's accuracy to two
/// decimals, few enough for the example to run in CI.
const TEST_IMAGES: usize = 2_000;

struct Cnn {
    conv1: Conv2d,
    conv2: Conv2d,
    out: Linear,
}

impl Cnn {
    fn new(vb: VarBuilder) -> candle_core::Result<Self> {
        let c = Conv2dConfig::default();
        Ok(Cnn {
            conv1: conv2d(1, 8, 5, c, vb.pp("conv1"))?,
            conv2: conv2d(8, 16, 5, c, vb.pp("conv2"))?,
            out: linear(16 * 4 * 4, 10, vb.pp("out"))?,
        })
    }

    /// Logits of images (batch, 784).
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let x = x.reshape((x.dim(0)?, 1, 28, 28))?;
        let h = self.conv1.forward(&x)?.relu()?.max_pool2d(2)?;
        let h = self.conv2.forward(&h)?.relu()?.max_pool2d(2)?;
        self.out.forward(&h.flatten_from(1)?)
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let epochs = epochs_from_args()?;
    let dev = Device::Cpu;
    let data = load("mnist-mini", &LoadOptions::default())?;
    let (train, test) = (&data.train, &data.test);

    let varmap = VarMap::new();
    let net = Cnn::new(VarBuilder::from_varmap(&varmap, DType::F32, &dev))?;
    init_seeded(&varmap, 5)?;
    // SGNHT's defaults: lr = η·N = 0.12 on the mean loss, diffusion 0.1, splitting.
    let config = Config {
        seed: 2,
        ..Config::new(train.len())
    };
    let mut opt = Sgnht::new(vars_by_name(&varmap)?, config)?;

    let rows: Vec<usize> = (0..TEST_IMAGES).collect();
    let test_x = images(test, &rows, &dev)?;
    let mut ensemble = Accumulator::with_classes(&test.labels[..TEST_IMAGES], 10)?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let (mut x, mut y) = (Vec::new(), Vec::new());
    for epoch in 0..epochs {
        let mut order: Vec<usize> = (0..train.len()).collect();
        for i in (1..order.len()).rev() {
            order.swap(i, rng.random_range(0..=i));
        }
        for batch in order.chunks(100) {
            train.gather(batch, &mut x, &mut y);
            let xb = Tensor::from_slice(&x, (batch.len(), 784), &dev)?;
            let yb = Tensor::from_slice(&y, batch.len(), &dev)?;
            opt.backward_step(&loss::cross_entropy(&net.forward(&xb)?, &yb)?)?;
            if epoch >= 1 && opt.steps().is_multiple_of(25) {
                let probs = ops::softmax_last_dim(&net.forward(&test_x)?)?;
                ensemble.add(&probs.flatten_all()?.to_vec1()?)?;
            }
        }
        let d = opt.diagnostics();
        println!(
            "epoch {}: kinetic energy {:.3} (½ at the right temperature), thermostat {:.4}",
            epoch + 1,
            d.kinetic_energy.unwrap_or(f64::NAN),
            d.thermostat.unwrap_or(f64::NAN)
        );
    }
    let m = ensemble
        .metrics()
        .ok_or("no sample was kept: run more than 1 epoch")?;
    let last = ensemble.last_sample.ok_or("no last sample")?;
    println!(
        "{} samples on {TEST_IMAGES} test images: ensemble accuracy {:.4}, NLL {:.4}; the last sample alone {:.4}, NLL {:.4}",
        ensemble.samples(),
        m.accuracy,
        m.nll,
        last.accuracy,
        last.nll
    );
    check_resume(&mut opt, &net, train, &dev)?;
    Ok(())
}

/// Saves the state through a file, takes 5 more updates, restores and takes the same 5
/// again: θ must come out bit for bit the same.
fn check_resume(
    opt: &mut Sgnht,
    net: &Cnn,
    train: &Split,
    dev: &Device,
) -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::temp_dir().join("bnn-own-cnn-state.safetensors");
    opt.state()?.save(&path)?;
    let batch: Vec<usize> = (0..100).collect();
    let xb = images(train, &batch, dev)?;
    let yb = Tensor::new(
        batch
            .iter()
            .map(|&i| train.labels[i] as u32)
            .collect::<Vec<_>>(),
        dev,
    )?;
    let five = |opt: &mut Sgnht| -> Result<Vec<f32>, Box<dyn std::error::Error>> {
        for _ in 0..5 {
            opt.backward_step(&loss::cross_entropy(&net.forward(&xb)?, &yb)?)?;
        }
        Ok(opt.vars()[0].as_tensor().flatten_all()?.to_vec1()?)
    };
    let first = five(opt)?;
    opt.restore(&OptimizerState::load(&path)?)?;
    if five(opt)? != first {
        return Err("the restored sampler did not continue bit for bit".into());
    }
    println!(
        "saved, restored and continued bit for bit: {}",
        path.display()
    );
    Ok(())
}

/// Images `rows` of `split`, scaled to [0, 1], as a (rows, 784) tensor.
fn images(split: &Split, rows: &[usize], dev: &Device) -> candle_core::Result<Tensor> {
    let (mut x, mut y) = (Vec::new(), Vec::new());
    split.gather(rows, &mut x, &mut y);
    Tensor::from_vec(x, (rows.len(), 784), dev)
}

/// `--epochs N` (default 3).
fn epochs_from_args() -> Result<usize, String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.as_slice() {
        [] => Ok(3),
        [flag, n] if flag == "--epochs" => n
            .parse()
            .map_err(|_| format!("--epochs takes a number, got {n:?}")),
        _ => Err("usage: own_cnn [--epochs N]".into()),
    }
}
