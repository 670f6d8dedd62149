//! The element updates of the fused sampler steps, each written once per language: which
//! rules there are ([`Update`]) and their constants ([`StepConsts`]); the rule's formula
//! on a tile of f32 on the CPU (`tile`, inlined into every ISA build of
//! [`crate::cpu`]); and the same formula in candle ops ([`interpret`]), the reference
//! that `--kernel composed` runs on any device. The CUDA kernels' copy is
//! `kernels/sampler_math.h` (`bnn_update_element`), whose host build is checked against
//! `tile` bit for bit. A new rule is a variant here, an arm in each of these two
//! functions and a case in the header.
//!
//! - SGLD: θ ← (θ − ηg) + σz.
//! - Momentum (SGHMC, SGNHT): v ← ((decay·v − ηg) + σz)·post; θ ← θ + v, with
//!   (decay, post) = (1 − α, 1) for Euler and (e^{−α/2}, e^{−α/2}) for the splitting
//!   B–O–B.
//! - Thermostat (mSGNHT): v ← ((v − v⊙α) − ηg) + σz (Euler) or v ← ((d⊙v − ηg) + σz)⊙d
//!   with d = e^{−α/2} (splitting); θ ← θ + v; α ← α + (v⊙v − η).
//! - Preconditioned (pSGLD): V ← βV + (1 − β)(g⊙g); G = 1 ⊘ (λ + √V);
//!   θ ← (θ − (g⊙G)η) + (z⊙√G)σ, with σ = √(2η).

use candle_core::{DType, Tensor, Var};

use crate::buffer::StateBuffer;
use crate::cpu::{exp_f32, lanes8};
use crate::error::{Error, Result};
use crate::{LentUpdate, TensorSums};

/// Which element update a fused op applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Update {
    /// θ ← θ − ηg + σz.
    Sgld,
    /// v ← (1 − α)v − ηg + σz; θ ← θ + v (SGHMC, SGNHT).
    Momentum,
    /// mSGNHT, one thermostat αᵢ per element (Li et al. 2016 eq. 2 in v-form):
    /// v ← (1 − αᵢ)v − ηg + σz (Euler) or v ← dᵢ(dᵢv − ηg + σz) with dᵢ = e^{−αᵢ/2}
    /// (splitting B–O–B); then θ ← θ + v and αᵢ ← αᵢ + vᵢ² − η. On the CPU and on CUDA.
    Thermostat {
        /// The splitting integrator's B–O–B form (else Euler).
        splitting: bool,
    },
    /// pSGLD (Li, Chen, Carlson & Carin 2016, Alg. 1 in v-form), RMSprop's diagonal
    /// preconditioner over one second moment Vᵢ per element: V ← βV + (1 − β)g²,
    /// G = 1/(λ + √V), θ ← θ − ηG·g + √(2ηG)·z (the Γ(θ) term omitted, as in the paper's
    /// experiments). V is the rule's per-element state, β and λ its constants
    /// ([`StepConsts::preconditioned`]).
    Preconditioned,
}

impl Update {
    /// The rule's code in `kernels/sampler_math.h` (`BNN_RULE_*`), where
    /// `bnn_update_element` is the one dispatch over the element updates for the CUDA
    /// kernels and the host shim.
    pub fn rule(self) -> i32 {
        match self {
            Update::Sgld => 0,
            Update::Momentum => 1,
            Update::Thermostat { splitting: false } => 2,
            Update::Thermostat { splitting: true } => 3,
            Update::Preconditioned => 4,
        }
    }

    /// Which state buffers the rule reads and writes besides θ: (the momentum v, the
    /// rule's per-element state: mSGNHT's thermostats α, pSGLD's second moments V). Every
    /// kernel takes both, empty (or null) where false.
    pub fn states(self) -> (bool, bool) {
        match self {
            Update::Sgld => (false, false),
            Update::Momentum => (true, false),
            Update::Thermostat { .. } => (true, true),
            Update::Preconditioned => (false, true),
        }
    }
}

/// Constants of one update in f32, as the kernels use them (`bnn_step_consts`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepConsts {
    /// η.
    pub step_size: f32,
    /// Momentum kept before the kick: 1 − α (Euler) or e^{−α/2} (splitting B); pSGLD's
    /// β, the decay of its second moments.
    pub decay: f32,
    /// Momentum kept after the kick: 1 (Euler) or e^{−α/2} (splitting B); pSGLD's λ, the
    /// damping of its preconditioner.
    pub post: f32,
    /// σ of the injected noise.
    pub noise_scale: f32,
}

impl StepConsts {
    /// The Euler update: v ← (1 − α)v − ηg + σz.
    pub fn new(step_size: f64, friction: f64, noise_scale: f64) -> Self {
        StepConsts {
            step_size: step_size as f32,
            decay: (1.0 - friction) as f32,
            post: 1.0,
            noise_scale: noise_scale as f32,
        }
    }

    /// pSGLD's update ([`Update::Preconditioned`]): η, the second moments' decay β, the
    /// damping λ, and σ = √(2η) (the preconditioner √G multiplies it per element).
    pub fn preconditioned(step_size: f64, decay: f64, damping: f64) -> Self {
        StepConsts {
            step_size: step_size as f32,
            decay: decay as f32,
            post: damping as f32,
            noise_scale: (2.0 * step_size).sqrt() as f32,
        }
    }

    /// The splitting update B–O–B: v ← e^{−α/2}(e^{−α/2} v − ηg + σz).
    pub fn splitting(step_size: f64, friction: f64, noise_scale: f64) -> Self {
        let damp = (-friction / 2.0).exp() as f32;
        StepConsts {
            step_size: step_size as f32,
            decay: damp,
            post: damp,
            noise_scale: noise_scale as f32,
        }
    }
}

/// One tile of the rule `update` on the CPU: θ (and the rule's states `momentum` and
/// `alpha`, its per-element state, empty where it has none) updated from `grad` with the normals `z`, `virial` set to θ·∇
/// before the update; the sums Σv² and Σα after it (the virial the caller sums). Each arm
/// is one loop the compiler vectorises, so the rule is chosen per tile, not per element.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn tile(
    update: Update,
    theta: &mut [f32],
    momentum: &mut [f32],
    alpha: &mut [f32],
    grad: &[f32],
    z: &mut [f32],
    virial: &mut [f32],
    c: StepConsts,
) -> TensorSums {
    let mut sums = TensorSums::default();
    match update {
        Update::Thermostat { splitting } => {
            thermostat_tile(theta, momentum, alpha, grad, z, virial, c, splitting);
            // z holds v², and `alpha` the new α.
            sums.sum_sq = lanes8(z);
            sums.sum_thermostat = lanes8(alpha);
        }
        Update::Sgld => {
            for (((t, &g), &z), w) in theta.iter_mut().zip(grad).zip(z.iter()).zip(virial) {
                *w = *t * g;
                *t = *t - g * c.step_size + z * c.noise_scale;
            }
        }
        Update::Momentum => {
            for ((((t, m), &g), z), w) in theta
                .iter_mut()
                .zip(momentum.iter_mut())
                .zip(grad)
                .zip(z.iter_mut())
                .zip(virial)
            {
                *w = *t * g;
                let vn = (*m * c.decay - g * c.step_size + *z * c.noise_scale) * c.post;
                *m = vn;
                *t += vn;
                *z = vn * vn;
            }
            sums.sum_sq = lanes8(z);
        }
        Update::Preconditioned => {
            let (beta, keep, lambda) = (c.decay, 1.0 - c.decay, c.post);
            for ((((t, s), &g), &z), w) in theta
                .iter_mut()
                .zip(alpha.iter_mut())
                .zip(grad)
                .zip(z.iter())
                .zip(virial)
            {
                *w = *t * g;
                let vn = *s * beta + (g * g) * keep;
                *s = vn;
                let gi = 1.0 / (vn.sqrt() + lambda);
                *t = (*t - (g * gi) * c.step_size) + (z * gi.sqrt()) * c.noise_scale;
            }
        }
    }
    sums
}

/// The per-element-thermostat update of one tile ([`Update::Thermostat`]), with the
/// composed mSGNHT's f32 operations in its order (e^{−α/2} by [`exp_f32`]): θ, v and α
/// updated, `z` overwritten by v² and `virial` by θ·∇ before the update.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn thermostat_tile(
    theta: &mut [f32],
    momentum: &mut [f32],
    alpha: &mut [f32],
    grad: &[f32],
    z: &mut [f32],
    virial: &mut [f32],
    c: StepConsts,
    splitting: bool,
) {
    for (((((t, m), a), &g), z), w) in theta
        .iter_mut()
        .zip(momentum.iter_mut())
        .zip(alpha.iter_mut())
        .zip(grad)
        .zip(z.iter_mut())
        .zip(virial.iter_mut())
    {
        *w = *t * g;
        let v = if splitting {
            let d = exp_f32(*a * -0.5);
            ((*m * d - g * c.step_size) + *z * c.noise_scale) * d
        } else {
            ((*m - *m * *a) - g * c.step_size) + *z * c.noise_scale
        };
        *m = v;
        *t += v;
        *a += v * v - c.step_size;
        *z = v * v;
    }
}

/// Applies `lane` to θ = `param` with gradient `grad`; its sums as the fused op reports
/// them (Σv² and Σα after the update, Σθ·∇ before it), in f64.
pub fn interpret(lane: LentUpdate<'_>, param: &Var, grad: &Tensor) -> Result<TensorSums> {
    let LentUpdate {
        update,
        consts: c,
        key,
        momentum,
        thermostat,
    } = lane;
    let g = &grad.detach(); // keep autograd history out of the sampler state
    let theta = param.as_detached_tensor();
    let virial = sum64(&(f64s(&theta)? * f64s(g)?)?)?;
    let z = key.normals_like(g)?;
    let (eta, sigma) = (c.step_size as f64, c.noise_scale as f64);
    // ηg and σz of the unpreconditioned rules (pSGLD scales both per element).
    let kick = || -> Result<(Tensor, Tensor)> { Ok(((g * eta)?, (&z * sigma)?)) };
    let mut sums = TensorSums {
        virial,
        ..TensorSums::default()
    };
    match update {
        Update::Sgld => {
            let (eta_g, sigma_z) = kick()?;
            param.set(&((theta - eta_g)? + sigma_z)?)?
        }
        Update::Momentum => {
            let momentum = lent(momentum, "momentum")?;
            let v = momentum.to_tensor(g)?;
            let (eta_g, sigma_z) = kick()?;
            let vn = ((((v * c.decay as f64)? - eta_g)? + sigma_z)? * c.post as f64)?;
            sums.sum_sq = move_by(param, &theta, momentum, &vn)?;
        }
        Update::Thermostat { splitting } => {
            let (momentum, thermostat) =
                (lent(momentum, "momentum")?, lent(thermostat, "thermostat")?);
            let (v, alpha) = (momentum.to_tensor(g)?, thermostat.to_tensor(g)?);
            let (eta_g, sigma_z) = kick()?;
            let vn = if splitting {
                let d = (&alpha * -0.5)?.exp()?;
                ((((&v * &d)? - eta_g)? + sigma_z)? * d)?
            } else {
                (((&v - (&v * &alpha)?)? - eta_g)? + sigma_z)?
            };
            let alpha = (alpha + (vn.sqr()? - eta)?)?;
            sums.sum_thermostat = sum64(&f64s(&alpha)?)?;
            thermostat.set(&alpha)?;
            sums.sum_sq = move_by(param, &theta, momentum, &vn)?;
        }
        Update::Preconditioned => {
            let second = lent(thermostat, "second-moment")?;
            let keep = (1.0 - c.decay) as f64;
            let vn = ((second.to_tensor(g)? * c.decay as f64)? + (g.sqr()? * keep)?)?;
            let gi = (vn.sqrt()? + c.post as f64)?.recip()?;
            let drift = ((g * &gi)? * eta)?;
            let noise = ((&z * gi.sqrt()?)? * sigma)?;
            param.set(&((theta - drift)? + noise)?)?;
            second.set(&vn)?;
        }
    }
    Ok(sums)
}

/// θ ← θ + v' and v ← v' (the momentum rules' last step); Σv'² in f64.
fn move_by(param: &Var, theta: &Tensor, momentum: &mut StateBuffer, vn: &Tensor) -> Result<f64> {
    param.set(&(theta + vn)?)?;
    momentum.set(vn)?;
    sum64(&f64s(vn)?.sqr()?)
}

/// The lent state buffer, which this update must have.
fn lent<'b>(buffer: Option<&'b mut StateBuffer>, what: &str) -> Result<&'b mut StateBuffer> {
    buffer.ok_or_else(|| Error::Config(format!("composed update: no {what} buffer lent")))
}

fn f64s(t: &Tensor) -> Result<Tensor> {
    Ok(t.to_dtype(DType::F64)?)
}

fn sum64(t: &Tensor) -> Result<f64> {
    Ok(t.sum_all()?.to_scalar::<f64>()?)
}
