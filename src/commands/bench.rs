//! `bnn bench`: the step, the products and the training step, timed.

use bnn::error::{Error, Result};

use super::json;
use crate::cli::BenchCommand;

/// Runs one `bnn bench` command.
pub(super) fn bench_command(command: BenchCommand) -> Result<String> {
    match command {
        BenchCommand::Step {
            sampler,
            sizes,
            repeats,
        } => {
            if !sampler.is_sampler() || sizes.contains(&0) || repeats == 0 {
                return Err(Error::Config(
                    "bench step needs sgld, sghmc or sgnht, positive sizes and repeats".into(),
                ));
            }
            json(&bnn::bench::step(sampler, &sizes, repeats)?)
        }
        BenchCommand::Gemm { repeats } => {
            let mut rows = Vec::new();
            // (m, n, k): forward (X·Wᵀ, W read in place), weight gradient and input error
            // of the MNIST MLPs.
            for batch in [100, 1000] {
                for (m, n, k, transposed, what) in [
                    (batch, 100, 784, true, "forward 784→100"),
                    (batch, 400, 784, true, "forward 784→400"),
                    (batch, 400, 400, true, "forward 400→400"),
                    (100, 784, batch, false, "weight grad 100×784"),
                    (400, 784, batch, false, "weight grad 400×784"),
                    (400, 400, batch, false, "weight grad 400×400"),
                    (batch, 400, 400, false, "input error 400×400"),
                ] {
                    let (ours, crate_gemm, threads) =
                        bnn::kernels::gemm::bench(m, n, k, transposed, repeats.max(1));
                    rows.push(serde_json::json!({
                        "product": what, "batch": batch, "m": m, "n": n, "k": k,
                        "threads": threads,
                        "bnn_gflop_per_s": ours, "gemm_crate_gflop_per_s": crate_gemm,
                    }));
                }
            }
            let skipping = bnn::bench::zero_skipping(repeats.max(1))?;
            // The ceiling of each thread count the products ran on (measured after them,
            // only for those counts: a large machine would otherwise time every count).
            let mut counts: Vec<usize> = rows
                .iter()
                .filter_map(|r| r["threads"].as_u64())
                .map(|t| t as usize)
                .collect();
            counts.sort_unstable();
            counts.dedup();
            let peaks: Vec<_> = counts.into_iter().map(bnn::kernels::gemm::peak).collect();
            for row in &mut rows {
                let peak = peaks
                    .iter()
                    .find(|p| Some(p.threads as u64) == row["threads"].as_u64());
                if let (Some(p), Some(ours)) = (peak, row["bnn_gflop_per_s"].as_f64()) {
                    row["fraction_of_measured_peak"] = (ours / p.measured_gflop_per_s).into();
                }
            }
            let peaks: Vec<_> = peaks
                .iter()
                .map(|p| {
                    serde_json::json!({
                        "isa": p.isa, "threads": p.threads, "lanes": p.lanes, "fused": p.fused,
                        "measured_gflop_per_s": p.measured_gflop_per_s, "ghz": p.ghz,
                        "computed_gflop_per_s": p.computed_gflop_per_s,
                    })
                })
                .collect();
            json(&serde_json::json!({
                "peak": peaks, "products": rows, "first_layer_zero_skipping": skipping,
            }))
        }
        BenchCommand::Train {
            hidden,
            batch,
            cnn_batch,
            config,
            sampler,
            integrator,
            backward,
            kernel,
            repeats,
            steps,
            chains,
        } => {
            let presets = config
                .iter()
                .map(|p| bnn::model::ModelSpec::from_toml_file(p))
                .collect::<Result<Vec<_>>>()?;
            let cnn_batches = batch_sizes(&cnn_batch)?;
            let hidden = widths(&hidden)?;
            let sizes = || batch.iter().chain(&cnn_batches);
            if sizes().any(|&b| b == 0 || b > 10_000) || repeats == 0 || steps == 0 || chains == 0 {
                return Err(Error::Config(
                    "bench train needs batches in 1..=10000 and positive repeats, steps and chains"
                        .into(),
                ));
            }
            let opts = bnn::bench::TrainBenchOptions {
                hidden,
                batches: batch,
                cnn_batches,
                presets,
                samplers: sampler,
                integrator,
                backward,
                kernel,
                repeats,
                steps,
                chains,
            };
            json(&bnn::bench::train(&opts)?)
        }
    }
}

/// `--cnn-batch`: comma-separated batch sizes ("" for none).
fn batch_sizes(text: &str) -> Result<Vec<usize>> {
    text.split(',')
        .filter(|b| !b.trim().is_empty())
        .map(|b| {
            b.trim().parse::<usize>().map_err(|_| {
                Error::Config(format!(
                    "--cnn-batch: `{b}` is not a batch size (e.g. \"64\")"
                ))
            })
        })
        .collect()
}

/// `--hidden`: `;`-separated networks of `,`-separated positive widths.
fn widths(text: &str) -> Result<Vec<Vec<usize>>> {
    let width = |w: &str| {
        w.trim()
            .parse::<usize>()
            .ok()
            .filter(|&w| w > 0)
            .ok_or_else(|| {
                Error::Config(format!(
                    "--hidden: `{w}` is not a positive width (e.g. \"100;400,400\")"
                ))
            })
    };
    text.split(';')
        .filter(|net| !net.trim().is_empty())
        .map(|net| {
            net.split(',')
                .filter(|w| !w.trim().is_empty())
                .map(width)
                .collect()
        })
        .collect()
}
