//! The potential energy U(θ) that the samplers explore: the scaled negative log-posterior
//!
//! U(θ) = −(N/|S|) Σ_{i∈S} log p(yᵢ | xᵢ, θ) − log p(θ),
//!
//! the minibatch estimate Ũ of Chen et al. 2014 (reproduction report, "The Core
//! Algorithms"; tutorial eq. 7), optionally tempered: the samplers target exp(−U/T), so
//! the gradient they receive is ∇Ũ/T.

pub mod pass;

use candle_core::{Tensor, Var};
use rand::SeedableRng;
use rand_distr::Distribution;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::likelihood::{Likelihood, Targets, HALF_LOG_2PI};
use crate::model::Network;

/// How the gradient of the potential is computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum Backward {
    /// The hand-written backward on the CPU, candle's autograd on other devices.
    Auto,
    /// The hand-written forward and backward pass ([`crate::engine::backprop::mlp`]); CPU only.
    Custom,
    /// candle's autograd: the reference implementation.
    Autograd,
    /// The step plan ([`crate::engine::planned`]): an MLP's forward, backward and fused
    /// update of all its chains as one fixed plan of launches over buffers allocated once,
    /// with no host read between two sync points; on the CPU its host executor.
    Plan,
}

impl Backward {
    /// The concrete choice for `device`; an error for `Custom` off the CPU.
    pub fn resolve(self, device: &candle_core::Device) -> Result<Backward> {
        match (self, device.is_cpu()) {
            (Backward::Auto, true) => Ok(Backward::Custom),
            (Backward::Auto, false) => Ok(Backward::Autograd),
            (Backward::Custom, false) => Err(Error::Config(
                "--backward custom runs on the CPU only; use --backward autograd (or auto) \
                 with --device cuda or metal"
                    .into(),
            )),
            (Backward::Plan, false) if !(cfg!(feature = "cuda") && device.is_cuda()) => {
                Err(Error::Config(
                    "--backward plan runs on the CPU (its host executor) and on CUDA (a build \
                     with feature cuda); use --backward autograd (or auto) on this device"
                        .into(),
                ))
            }
            (b, _) => Ok(b),
        }
    }
}

/// The prior on the weights.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum PriorSpec {
    /// θ ~ N(0, std²) for every parameter.
    Gaussian {
        /// σ.
        std: f64,
    },
    /// θ ~ N(0, 1/λ_l) with a precision λ_l per parameter tensor and λ_l ~ Gamma(shape, rate),
    /// resampled by a Gibbs step (as in Chen et al.'s reference code).
    Gamma {
        /// The Gamma's shape α.
        shape: f64,
        /// The Gamma's rate β.
        rate: f64,
    },
}

impl PriorSpec {
    /// The default prior: precisions λ_l ~ Gamma(1, 1) (Chen et al.'s reference code).
    pub const DEFAULT: PriorSpec = PriorSpec::Gamma {
        shape: Self::DEFAULT_SHAPE,
        rate: Self::DEFAULT_RATE,
    };
    /// The Gamma hyper-prior's shape α when not given.
    pub const DEFAULT_SHAPE: f64 = 1.0;
    /// The Gamma hyper-prior's rate β when not given.
    pub const DEFAULT_RATE: f64 = 1.0;
    /// σ of a Gaussian prior asked for without one: N(0, 1).
    pub const DEFAULT_STD: f64 = 1.0;
}

/// The prior's current state: one precision λ per parameter tensor.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Prior {
    /// The prior's form.
    pub spec: PriorSpec,
    /// λ per parameter tensor (fixed for a Gaussian, Gibbs-sampled for a Gamma hyper-prior).
    pub precisions: Vec<f64>,
}

impl Prior {
    /// Initial precisions: 1/std² for the Gaussian prior; the Gamma prior's mean for the
    /// hierarchical one.
    pub fn new(spec: PriorSpec, num_tensors: usize) -> Result<Self> {
        let lambda = match spec {
            PriorSpec::Gaussian { std } if std > 0.0 && std.is_finite() => 1.0 / (std * std),
            PriorSpec::Gamma { shape, rate } if shape > 0.0 && rate > 0.0 => shape / rate,
            _ => {
                return Err(Error::Config(format!(
                    "invalid prior {spec:?}: its parameters must be positive"
                )))
            }
        };
        Ok(Prior {
            spec,
            precisions: vec![lambda; num_tensors],
        })
    }

    /// The prior's part of the energy U(θ, λ) = −log p(θ|λ) − log p(λ), up to a constant:
    /// Σ_l λ_l Σθ_l²/2 − (n_l/2) log λ_l, and for the Gamma hyper-prior also
    /// −(a − 1) log λ_l + b λ_l. Its conditional in λ is what [`Prior::gibbs_step`] draws
    /// from, so replicas that exchange compare this energy.
    pub fn energy(&self, params: &[Var]) -> Result<f64> {
        let mut u = 0.0;
        for (&lambda, p) in self.precisions.iter().zip(params) {
            let n = p.elem_count() as f64;
            let s = p.as_tensor().sqr()?.sum_all()?.to_scalar::<f32>()? as f64;
            u += lambda * s / 2.0 - n / 2.0 * lambda.ln();
            if let PriorSpec::Gamma { shape, rate } = self.spec {
                u += -(shape - 1.0) * lambda.ln() + rate * lambda;
            }
        }
        Ok(u)
    }

    /// Gibbs step for the Gamma hyper-prior at temperature T: the conditional of λ given
    /// θ (n elements, Σθ² = s) under [p(θ|λ) p(λ)]^{1/T} is
    /// Gamma(shape = (a − 1 + n/2)/T + 1, rate = (b + s/2)/T), the usual
    /// Gamma(a + n/2, b + s/2) at T = 1. A no-op for the Gaussian prior.
    pub fn gibbs_step(&mut self, params: &[Var], temperature: f64, seed: u64) -> Result<()> {
        let PriorSpec::Gamma { shape, rate } = self.spec else {
            return Ok(());
        };
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        for (lambda, p) in self.precisions.iter_mut().zip(params) {
            let n = p.elem_count() as f64;
            let s = p.as_tensor().sqr()?.sum_all()?.to_scalar::<f32>()? as f64;
            if !s.is_finite() {
                // θ² overflows f32 long before θ does: a chain that blew up lands here.
                return Err(Error::NotFinite(format!(
                    "the sum of squares of a parameter tensor ({} elements)",
                    p.elem_count()
                )));
            }
            let k = (shape - 1.0 + n / 2.0) / temperature + 1.0;
            let r = (rate + s / 2.0) / temperature;
            let g = rand_distr::Gamma::new(k, 1.0 / r)
                .map_err(|e| Error::Config(format!("Gibbs step for the prior: {e}")))?;
            *lambda = g.sample(&mut rng);
        }
        Ok(())
    }
}

/// The tempered potential of a network on a dataset of `n_data` examples.
#[derive(Debug, Clone)]
pub struct Potential {
    /// N, training examples: the likelihood scale of a minibatch mean.
    pub n_data: usize,
    /// T: the potential is U/T.
    pub temperature: f64,
    /// The prior on the parameters.
    pub prior: Prior,
    /// The likelihood of the task (classification unless set).
    pub likelihood: Likelihood,
    /// τ = 1/σ², the Gaussian likelihood's noise precision in force (fixed, or the last
    /// Gibbs draw); unused by classification.
    pub noise_precision: f64,
}

/// What one gradient evaluation on a minibatch returns.
#[derive(Debug)]
pub struct Evaluation {
    /// Mean negative log-likelihood over the minibatch.
    pub nll: f64,
    /// The minibatch logits (for running accuracy).
    pub logits: Tensor,
    /// ∇Ũ(θ)/T for every parameter tensor, in the model's order.
    pub grads: Vec<Tensor>,
}

impl Potential {
    /// The potential of `n_data` examples at `temperature` under `prior`.
    pub fn new(n_data: usize, temperature: f64, prior: Prior) -> Result<Self> {
        if !(temperature > 0.0 && temperature.is_finite()) {
            return Err(Error::Config(format!(
                "--temperature must be positive, got {temperature}"
            )));
        }
        Ok(Potential {
            n_data,
            temperature,
            prior,
            likelihood: Likelihood::Categorical,
            noise_precision: 1.0,
        })
    }

    /// The same potential under `likelihood`, τ at its starting value.
    pub fn with_likelihood(mut self, likelihood: Likelihood) -> Result<Self> {
        if let Some(noise) = likelihood.noise() {
            self.noise_precision = noise.initial_precision()?;
        }
        self.likelihood = likelihood;
        Ok(self)
    }

    /// The minibatch's targets as the likelihood reads them: `labels` for classification,
    /// `values` with τ for regression.
    pub fn targets<'a>(&self, labels: &'a [u32], values: &'a [f32]) -> Targets<'a> {
        match self.likelihood {
            Likelihood::Categorical => Targets::Classes(labels),
            Likelihood::Gaussian { .. } => Targets::Values {
                y: values,
                precision: self.noise_precision,
            },
        }
    }

    /// The Gibbs step of the noise precision τ given the training residuals' sum of
    /// squares `sse` ([`crate::likelihood::Noise::gibbs_draw`]); a no-op for classification
    /// and a fixed σ.
    pub fn noise_gibbs_step(&mut self, sse: f64, seed: u64) -> Result<()> {
        if let Some(noise) = self.likelihood.noise() {
            if let Some(tau) = noise.gibbs_draw(sse, self.n_data, self.temperature, seed)? {
                self.noise_precision = tau;
            }
        }
        Ok(())
    }

    /// s = N/(|S|·T): the factor on Σ_{i∈S} ∇(−log p(yᵢ|xᵢ,θ)) in ∇Ũ/T, as the
    /// hand-written passes apply it (with [`Potential::inverse_temperature`] on the
    /// prior's λθ). Autograd's paths form N·mean first and divide the sum by T
    /// ([`tempered_gradient`]): the two scales of ∇Ũ/T, each defined here once.
    pub fn likelihood_scale(&self, batch: usize) -> f64 {
        self.n_data as f64 / (batch as f64 * self.temperature)
    }

    /// 1/T: the factor on the prior's λθ in ∇Ũ/T (and on the whole of U in HMC's Ũ/T).
    pub fn inverse_temperature(&self) -> f64 {
        1.0 / self.temperature
    }

    /// Gradient of the tempered minibatch potential: autograd on the likelihood term
    /// (N/|S|)·Σ −log p(y|x,θ) = N · mean, plus the prior's λθ, all divided by T.
    /// For regression `y` holds the (standardised) targets as f32 and the NLL is the
    /// Gaussian's at τ.
    pub fn evaluate(&self, model: &Network, x: &Tensor, y: &Tensor) -> Result<Evaluation> {
        let logits = model.forward(x)?;
        let nll = match self.likelihood {
            Likelihood::Categorical => candle_nn::loss::cross_entropy(&logits, y)?,
            Likelihood::Gaussian { .. } => {
                let tau = self.noise_precision;
                let r = (logits.flatten_all()? - y)?;
                let constant = HALF_LOG_2PI - 0.5 * tau.ln();
                ((r.sqr()?.mean_all()? * (0.5 * tau))? + constant)?
            }
        };
        let scaled = (&nll * self.n_data as f64)?;
        let store = scaled.backward()?;
        let mut grads = Vec::with_capacity(model.params.len());
        for (p, &lambda) in model.params.iter().zip(&self.prior.precisions) {
            let g = store
                .get(&p.var)
                .ok_or_else(|| Error::Config(format!("no gradient for parameter `{}`", p.name)))?;
            // Detached: the gradient must not carry the autograd graph into the sampler
            // state, or every step's graph stays alive through the momentum.
            let prior = (p.var.as_detached_tensor() * lambda)?;
            grads.push(tempered_gradient(&g.detach(), &prior, self.temperature)?);
        }
        Ok(Evaluation {
            nll: nll.to_scalar::<f32>()? as f64,
            logits: logits.detach(),
            grads,
        })
    }
}

/// ∇Ũ/T of one tensor as autograd's paths form it: (∇ + λθ)/T from the likelihood's
/// gradient at N·mean (`likelihood`) and the prior's `prior_term` λθ, in that order, so
/// that [`Potential::evaluate`], [`evaluate_stacked`] and the optimizers
/// ([`crate::optim`]) give the same bits.
pub fn tempered_gradient(
    likelihood: &Tensor,
    prior_term: &Tensor,
    temperature: f64,
) -> Result<Tensor> {
    let inv_t = 1.0 / temperature;
    Ok(((likelihood + prior_term)? * inv_t)?)
}

/// What one gradient evaluation of K stacked chains returns, chain k in row k.
#[derive(Debug)]
pub struct StackedEvaluation {
    /// Each chain's mean negative log-likelihood over its minibatch.
    pub nll: Vec<f64>,
    /// Each chain's minibatch examples classified right (0 for a regression).
    pub correct: Vec<usize>,
    /// Each chain's sum of squared errors on its minibatch (0 for classification).
    pub sq_error: Vec<f64>,
    /// ∇Ũ(θ_k)/T per parameter tensor, stacked (K, …) as the parameters are.
    pub grads: Vec<Tensor>,
}

/// The first of `k` stacked chains' potentials, once they are checked to be `k` and to
/// share the temperature and the data set size.
fn shared_potential<'a>(potentials: &[&'a Potential], k: usize) -> Result<&'a Potential> {
    let first = potentials
        .first()
        .filter(|_| potentials.len() == k)
        .ok_or_else(|| {
            Error::Config(format!(
                "{} potentials for {k} stacked chains",
                potentials.len()
            ))
        })?;
    if potentials
        .iter()
        .any(|p| p.temperature != first.temperature || p.n_data != first.n_data)
    {
        return Err(Error::Config(
            "stacked chains share one temperature and one dataset".into(),
        ));
    }
    Ok(first)
}

/// [`Potential::evaluate`] of K chains in one computation: chain k's network is row k of
/// `model`, its minibatch row k of `x` (K, B, input_dim) and of `y` (K, B: class indices
/// as u32, or a regression's standardised targets as f32), its potential `potentials[k]`
/// (its own prior precisions and noise precision; one temperature for all). Autograd runs
/// once on Σ_k N·NLL_k: the chains share no parameter, so the gradient's row k is chain
/// k's alone, and the prior's λ_k θ_k and the 1/T are added after, as in
/// [`Potential::evaluate`], so that row k matches the chain evaluated by itself up to the
/// summation order of the batched products.
pub fn evaluate_stacked(
    potentials: &[&Potential],
    model: &crate::model::stacked::Stacked,
    x: &Tensor,
    y: &Tensor,
) -> Result<StackedEvaluation> {
    let k = model.chains;
    let first = shared_potential(potentials, k)?;
    let dev = x.device();
    let per_chain = |f: &dyn Fn(&Potential) -> f64| -> Result<Tensor> {
        let v: Vec<f32> = potentials.iter().map(|p| f(p) as f32).collect();
        Ok(Tensor::from_vec(v, k, dev)?)
    };
    let logits = model.forward(x)?;
    let (nll, quality) = match first.likelihood {
        Likelihood::Categorical => {
            let (_, b, _) = logits.dims3()?;
            let log_p = candle_nn::ops::log_softmax(&logits, candle_core::D::Minus1)?;
            let picked = log_p.gather(&y.unsqueeze(2)?, 2)?.squeeze(2)?;
            let nll = picked.sum(1)?.affine(-1.0 / b as f64, 0.0)?;
            let hits = logits
                .detach()
                .argmax(2)?
                .eq(y)?
                .to_dtype(candle_core::DType::F32)?;
            (nll, hits.sum(1)?)
        }
        Likelihood::Gaussian { .. } => {
            let r = (logits.squeeze(2)? - y)?;
            let tau = per_chain(&|p| 0.5 * p.noise_precision)?;
            let constant = per_chain(&|p| HALF_LOG_2PI - 0.5 * p.noise_precision.ln())?;
            let nll = r.sqr()?.mean(1)?.mul(&tau)?.add(&constant)?;
            (nll, r.detach().sqr()?.sum(1)?)
        }
    };
    let store = (nll.sum_all()? * first.n_data as f64)?.backward()?;
    let mut grads = Vec::with_capacity(model.params.len());
    for (t, p) in model.params.iter().enumerate() {
        let g = store
            .get(&p.var)
            .ok_or_else(|| Error::Config(format!("no gradient for parameter `{}`", p.name)))?;
        let mut shape = vec![1; p.var.rank()];
        shape[0] = k;
        let lambda = per_chain(&|q| q.prior.precisions[t])?.reshape(shape)?;
        let prior = p.var.as_detached_tensor().broadcast_mul(&lambda)?;
        grads.push(tempered_gradient(&g.detach(), &prior, first.temperature)?);
    }
    // One read of the device per evaluation: the NLLs and the accuracy or squared error.
    let host = Tensor::stack(&[nll.detach(), quality], 0)?.to_dtype(candle_core::DType::F64)?;
    let host = host.to_vec2::<f64>()?;
    let categorical = first.likelihood.is_categorical();
    Ok(StackedEvaluation {
        nll: host[0].clone(),
        correct: match categorical {
            true => host[1].iter().map(|&c| c as usize).collect(),
            false => vec![0; k],
        },
        sq_error: match categorical {
            true => vec![0.0; k],
            false => host[1].clone(),
        },
        grads,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The prior's energy is the one the Gibbs step and the gradient assume: in θ its
    /// derivative is λθ (central difference), and in λ it is least at the mode
    /// (a − 1 + n/2)/(b + Σθ²/2) of the Gibbs conditional at T = 1.
    #[test]
    fn prior_energy_matches_its_gradient_and_gibbs_conditional() {
        let dev = candle_core::Device::Cpu;
        let theta = [0.3f32, -1.2, 0.7, 2.0];
        let var = |t: &[f32]| Var::from_slice(t, t.len(), &dev).unwrap();
        let (a, b) = (2.0, 0.5);
        let mut prior = Prior::new(PriorSpec::Gamma { shape: a, rate: b }, 1).unwrap();
        prior.precisions = vec![1.7];
        let h = 1e-2f32;
        let mut up = theta;
        up[1] += h;
        let mut down = theta;
        down[1] -= h;
        let slope = (prior.energy(&[var(&up)]).unwrap() - prior.energy(&[var(&down)]).unwrap())
            / (2.0 * h as f64);
        let expected = 1.7 * theta[1] as f64;
        assert!((slope - expected).abs() < 1e-4, "{slope} vs {expected}");
        let s: f64 = theta.iter().map(|&x| (x as f64).powi(2)).sum();
        let mode = (a - 1.0 + 2.0) / (b + s / 2.0);
        let energy_at = |lambda: f64| {
            let mut p = prior.clone();
            p.precisions = vec![lambda];
            p.energy(&[var(&theta)]).unwrap()
        };
        let (e, left, right) = (
            energy_at(mode),
            energy_at(mode * 0.99),
            energy_at(mode * 1.01),
        );
        assert!(e < left && e < right, "{left} {e} {right}");
    }
}
