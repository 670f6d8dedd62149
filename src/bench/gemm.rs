//! `bnn bench gemm`: every matrix product and direct convolution of the benchmark
//! models' training steps, found by a census of the kernels a few real steps call
//! ([`crate::kernels::census`]), each against the machine's measured FMA peak.

use std::collections::BTreeMap;

use serde::Serialize;

use super::{bench_stepper, median};
use crate::error::{Error, Result};
use crate::kernels::census::{self, Kernel, Layout, Shape};
use crate::kernels::gemm;
use crate::model::ModelSpec;
use crate::sampler::SamplerKind;

/// A model and batch size whose step `bnn bench gemm` takes apart.
#[derive(Debug, Clone)]
pub struct GemmModel {
    /// The name `--models` selects it by.
    pub name: &'static str,
    pub spec: ModelSpec,
    pub batch: usize,
}

/// The models of the acceptance of the matrix-product work: the MNIST MLPs at batch 100
/// and 1000, LeNet at 64, ResNet-8 and ResNet-20 at 128 (their presets' batch).
pub fn gemm_models() -> Result<Vec<GemmModel>> {
    let mlp = |hidden: Vec<usize>| ModelSpec {
        hidden,
        ..ModelSpec::default()
    };
    let preset = |name: &str, text: &str| ModelSpec::from_toml_str(text, name);
    let resnet8 = preset(
        "models/resnet8.toml",
        include_str!("../../models/resnet8.toml"),
    )?;
    let resnet20 = preset(
        "models/resnet20.toml",
        include_str!("../../models/resnet20.toml"),
    )?;
    let mut models = Vec::new();
    for batch in [100, 1000] {
        models.push(GemmModel {
            name: "mlp-100",
            spec: mlp(vec![100]),
            batch,
        });
        models.push(GemmModel {
            name: "mlp-400-400",
            spec: mlp(vec![400, 400]),
            batch,
        });
    }
    models.push(GemmModel {
        name: "lenet",
        spec: ModelSpec::lenet(),
        batch: 64,
    });
    models.push(GemmModel {
        name: "resnet8",
        spec: resnet8,
        batch: 128,
    });
    models.push(GemmModel {
        name: "resnet20",
        spec: resnet20,
        batch: 128,
    });
    Ok(models)
}

/// One kernel shape of one model's step.
#[derive(Debug, Clone, Serialize)]
pub struct ProductBench {
    /// [`GemmModel::name`].
    pub model: &'static str,
    pub batch: usize,
    /// What it computes, as a product: "A·B", "A·Bᵀ" or "Aᵀ·B"; a direct convolution is
    /// named so, with its im2col product's shape.
    pub product: String,
    #[serde(flatten)]
    pub shape: Shape,
    /// Calls of this shape per training step.
    pub calls_per_step: f64,
    /// GFLOP/s inside the step (median call; with the zero skipping or the fused update
    /// the step uses, counted as the dense product's FLOP).
    pub in_step_gflop_per_s: f64,
    /// Threads the kernel ran on in the step: the pool's, fewer for a small product, one
    /// inside the ResNet's halves of the minibatch (each half runs on its own thread).
    pub threads: usize,
    /// The dense product alone, same shape, layouts and threads, median of `--repeats`
    /// (what a BLAS is compared with); for a direct convolution, its in-step rate.
    pub bnn_gflop_per_s: f64,
    /// The `gemm` crate (candle's CPU matmul) on the dense product; none for a direct
    /// convolution.
    pub gemm_crate_gflop_per_s: Option<f64>,
    /// `bnn_gflop_per_s` over the measured peak of the same thread count.
    pub fraction_of_measured_peak: f64,
}

/// `bnn bench gemm`'s report.
#[derive(Debug, Clone, Serialize)]
pub struct GemmBench {
    /// The measured FMA ceiling of each thread count the products ran on.
    pub peak: Vec<gemm::Peak>,
    pub products: Vec<ProductBench>,
    pub first_layer_zero_skipping: Vec<super::ZeroSkipBench>,
}

/// Steps timed under the census, after one warm-up step.
const CENSUS_STEPS: usize = 3;

/// Takes a census of the kernels of each model's SGHMC step in `models` (names of
/// [`gemm_models`]; empty: all), times each dense product alone (median of `repeats`),
/// then the FMA peak of each thread count they ran on, and the first layer's zero skipping.
pub fn gemm(repeats: usize, models: &[String]) -> Result<GemmBench> {
    let repeats = repeats.max(1);
    let all = gemm_models()?;
    if let Some(bad) = models.iter().find(|m| !all.iter().any(|g| g.name == *m)) {
        let names: Vec<_> = all.iter().map(|g| g.name).collect();
        return Err(Error::Config(format!(
            "bench gemm: no model `{bad}`; choose from {}",
            names.join(", ")
        )));
    }
    let ds = crate::data::load_builtin()?;
    let mut rows = Vec::new();
    let mut alone: BTreeMap<(Shape, usize), (f64, f64)> = BTreeMap::new();
    for model in all
        .iter()
        .filter(|g| models.is_empty() || models.iter().any(|m| m == g.name))
    {
        for (shape, threads, calls, seconds) in step_census(model, &ds)? {
            let in_step = shape.flop() / seconds / 1e9;
            let (ours, crate_gemm) = match shape.kernel {
                Kernel::Product | Kernel::ProductThenUpdate => {
                    let dense = Shape {
                        kernel: Kernel::Product,
                        skips_zeros: false,
                        ..shape
                    };
                    *alone.entry((dense, threads)).or_insert_with(|| {
                        let (m, n, k) = (shape.m, shape.n, shape.k);
                        let time = || gemm::bench(m, n, k, shape.lhs, shape.rhs, repeats);
                        // On one thread where the step ran it on one (inside the ResNet's
                        // halves of the minibatch). The `gemm` crate keeps its own threads.
                        if threads == 1 {
                            crate::pool::serially(time)
                        } else {
                            time()
                        }
                    })
                }
                _ => (in_step, f64::NAN),
            };
            rows.push(ProductBench {
                model: model.name,
                batch: model.batch,
                product: describe(&shape),
                shape,
                calls_per_step: calls,
                in_step_gflop_per_s: in_step,
                threads,
                bnn_gflop_per_s: ours,
                gemm_crate_gflop_per_s: Some(crate_gemm).filter(|g| g.is_finite()),
                fraction_of_measured_peak: f64::NAN,
            });
        }
    }
    let first_layer_zero_skipping = super::zero_skipping(repeats)?;
    let mut counts: Vec<usize> = rows.iter().map(|r| r.threads).collect();
    counts.sort_unstable();
    counts.dedup();
    let peaks: Vec<gemm::Peak> = counts.into_iter().map(gemm::peak).collect();
    for row in &mut rows {
        if let Some(p) = peaks.iter().find(|p| p.threads == row.threads) {
            row.fraction_of_measured_peak = row.bnn_gflop_per_s / p.measured_gflop_per_s;
        }
    }
    Ok(GemmBench {
        peak: peaks,
        products: rows,
        first_layer_zero_skipping,
    })
}

/// The kernel shapes of `model`'s step, in order of first call: (shape, threads, calls per
/// step, median seconds of a call).
fn step_census(
    model: &GemmModel,
    ds: &crate::data::Dataset,
) -> Result<Vec<(Shape, usize, f64, f64)>> {
    let config = SamplerKind::Sghmc.defaults();
    let how = (
        crate::sampler::Kernel::Fused,
        crate::potential::Backward::Auto,
    );
    let (mut stepper, _) = bench_stepper(&model.spec, ds, config, how, 0, model.batch)?;
    let n = ds.train.len();
    let batches: Vec<Vec<usize>> = (0..=CENSUS_STEPS)
        .map(|s| {
            (0..model.batch)
                .map(|i| (s * model.batch + i) % n)
                .collect()
        })
        .collect();
    stepper.step(&ds.train, None, &batches[0], None)?;
    let (done, calls) = census::record(|| -> Result<()> {
        for b in &batches[1..] {
            stepper.step(&ds.train, None, b, None)?;
        }
        Ok(())
    });
    done?;
    let mut order: Vec<(Shape, usize)> = Vec::new();
    let mut times: BTreeMap<(Shape, usize), Vec<f64>> = BTreeMap::new();
    for call in calls {
        let key = (call.shape, call.threads);
        let t = times.entry(key).or_default();
        if t.is_empty() {
            order.push(key);
        }
        t.push(call.seconds);
    }
    Ok(order
        .into_iter()
        .map(|key| {
            let t = times.remove(&key).unwrap_or_default();
            let calls = t.len() as f64 / CENSUS_STEPS as f64;
            (key.0, key.1, calls, median(t))
        })
        .collect())
}

/// "A·Bᵀ" and the like, or the direct convolution's pass.
fn describe(s: &Shape) -> String {
    let side = |l: Layout, name: &str| match l {
        Layout::Transposed => format!("{name}ᵀ"),
        _ => name.to_string(),
    };
    let product = format!("{}·{}", side(s.lhs, "A"), side(s.rhs, "B"));
    match s.kernel {
        Kernel::Product if s.skips_zeros => format!("{product}, skipping zeros"),
        Kernel::Product => product,
        Kernel::ProductThenUpdate => format!("{product}, then the update"),
        Kernel::DirectForward => "direct conv, forward".into(),
        Kernel::DirectAdjoint => "direct conv, input error".into(),
        Kernel::DirectWeightGrad => "direct conv, weight grad".into(),
    }
}
