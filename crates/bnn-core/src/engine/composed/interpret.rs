//! A lent update applied in candle ops: the element formulas of `kernels/sampler_math.h`
//! (and of the CPU op) term by term and in their order, with the noise z of the same
//! key, so that the fused kernels can be checked against it noise for noise. Runs on any
//! device candle has (Metal included, where no fused kernel exists).
//!
//! - SGLD: θ ← (θ − ηg) + σz.
//! - Momentum (SGHMC, SGNHT): v ← ((decay·v − ηg) + σz)·post; θ ← θ + v, with
//!   (decay, post) = (1 − α, 1) for Euler and (e^{−α/2}, e^{−α/2}) for the splitting
//!   B–O–B.
//! - Thermostat (mSGNHT): v ← ((v − v⊙α) − ηg) + σz (Euler) or v ← ((d⊙v − ηg) + σz)⊙d
//!   with d = e^{−α/2} (splitting); θ ← θ + v; α ← α + (v⊙v − η).

use candle_core::{DType, Tensor, Var};

use crate::error::{Error, Result};
use crate::kernels::{buffer::StateBuffer, LentUpdate, TensorSums, Update};
use crate::sampler::noise_like;

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
    let z = noise_like(g, key.seed, key.step, key.param as usize)?;
    let (eta, sigma) = (c.step_size as f64, c.noise_scale as f64);
    let (eta_g, sigma_z) = ((g * eta)?, (z * sigma)?);
    let mut sums = TensorSums {
        virial,
        ..TensorSums::default()
    };
    if update == Update::Sgld {
        param.set(&((theta - eta_g)? + sigma_z)?)?;
        return Ok(sums);
    }
    let momentum = lent(momentum, "momentum")?;
    let v = momentum.to_tensor(g)?;
    let vn = match update {
        Update::Thermostat { splitting } => {
            let thermostat = lent(thermostat, "thermostat")?;
            let alpha = thermostat.to_tensor(g)?;
            let vn = if splitting {
                let d = (&alpha * -0.5)?.exp()?;
                ((((&v * &d)? - eta_g)? + sigma_z)? * d)?
            } else {
                (((&v - (&v * &alpha)?)? - eta_g)? + sigma_z)?
            };
            let alpha = (alpha + (vn.sqr()? - eta)?)?;
            sums.sum_thermostat = sum64(&f64s(&alpha)?)?;
            thermostat.set(&alpha)?;
            vn
        }
        Update::Momentum | Update::Sgld => {
            ((((v * c.decay as f64)? - eta_g)? + sigma_z)? * c.post as f64)?
        }
    };
    param.set(&(theta + &vn)?)?;
    sums.sum_sq = sum64(&f64s(&vn)?.sqr()?)?;
    momentum.set(&vn)?;
    Ok(sums)
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
