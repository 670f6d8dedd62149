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
        BenchCommand::Gemm { repeats, models } => json(&bnn::bench::gemm(repeats, &models)?),
        BenchCommand::Plan {
            hidden,
            batch,
            chains,
            sampler,
        } => {
            if hidden.contains(&0) || chains.contains(&0) || !(1..=10_000).contains(&batch) {
                return Err(Error::Config(
                    "bench plan needs positive widths and chains and a batch in 1..=10000".into(),
                ));
            }
            let params = bnn::sampler::SamplerParams::defaults(sampler)?;
            json(&bnn::bench::plan(&hidden, batch, &chains, params)?)
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
