//! SGLD, pSGLD, SGHMC, SGNHT and mSGNHT, each update defined once: [`Dynamics`] keeps the
//! state (θ is the caller's; v, the thermostat α, mSGNHT's αᵢ per element or pSGLD's
//! second moments Vᵢ) and forms each update's coefficients ([`StepConsts`]: η, the
//! momentum kept before and after the kick, σ; or pSGLD's η, β, λ, σ), then lends the
//! update tensor by tensor ([`LentUpdate`]). The fused kernels apply a
//! lent update in one pass per tensor with the noise made inside it (the CPU op, the CUDA
//! kernel, the weight-gradient product's epilogue, the stacked chains' op); with
//! [`Kernel::Composed`] the same lent update is interpreted in candle ops
//! ([`crate::engine::composed::interpret()`]), the reference the kernels are checked
//! against. mSGNHT's per-element thermostats and pSGLD's second moments are the per-element
//! state buffer, on the parameters' device like the momenta.
//!
//! **The updates** (v-form: u = v = p·h, η = h², α = ξ·h, a = A·h of Ding et al. §5.2 /
//! App. F; n parameters, ⊙ element-wise):
//!
//! - SGLD (Welling & Teh 2011): θ ← θ − η∇Ũ(θ) + √(2η) z.
//! - pSGLD (Li, Chen, Carlson & Carin 2016, Alg. 1): V ← βV + (1 − β)∇Ũ⊙∇Ũ,
//!   G = 1 ⊘ (λ + √V), θ ← θ − ηG⊙∇Ũ(θ) + √(2ηG)⊙z, V₀ = 0 (Γ omitted:
//!   [`SamplerParams::Psgld`]).
//! - SGHMC (Chen et al. 2014, eq. 15): v ← v − η∇Ũ(θ) − αv + √(2(α − β̂)η) z; θ ← θ + v
//!   (β̂ = 0 by default; without the noise this is SGD with momentum 1 − α).
//! - SGNHT (Ding et al. 2014, eqs. 5–6, Alg. 2): u ← u − αu − η∇Ũ(θ) + √(2aη) z; θ ← θ + u;
//!   α ← α + uᵀu/n − η. mSGNHT (Gan et al. 2015; Li et al. 2016 §2.1, eq. 2): one αᵢ per
//!   element, α ← α + u⊙u − η and αu element-wise.
//!
//! **The symmetric splitting** A–B–O–B–A (Li et al. 2016 §3; for SGHMC with a constant
//! friction, Chen, Ding & Carin 2015), the gradient taken once per step at the half-step
//! position θ_{t+1/2}:
//!
//! A (h/2): θ ← θ + u/2,  α ← α + (u⊙u − η)/2;   B (h/2): u ← e^{−α/2} ⊙ u;
//! O (h):   u ← u − η∇Ũ(θ_{t+1/2}) + σz;   B (h/2);   A (h/2).
//!
//! The closing A of one step and the opening A of the next use the same u, so they are
//! applied together as one A (h) at the end of an update; `init` applies the very first A
//! (h/2). Between updates the parameters therefore sit at half-step positions, where the
//! next gradient is evaluated and where samples are taken. B–O–B is one element formula,
//! v ← e^{−α/2}(e^{−α/2} v − ηg + σz): the coefficients (decay, post) = (e^{−α/2},
//! e^{−α/2}), against Euler's (1 − α, 1).

use candle_core::{Device, Tensor, Var};

use crate::error::{Error, Result};
use crate::kernels::{
    buffer::StateBuffer, cpu::FusedStepOp, InlineUpdate, LentUpdate, StepConsts, TensorSums, Update,
};
use crate::rng::NoiseKey;
use crate::sampler::state::PsgldState;
use crate::sampler::{
    init_momentum, Clock, Diagnostics, Integrator, Kernel, MsgnhtState, Sampler, SamplerParams,
    SamplerState, SghmcState, SgnhtState, TensorwiseStep,
};

/// SGLD, pSGLD, SGHMC, SGNHT or mSGNHT: the state, and each update's coefficients lent to the
/// fused kernels or to the composed interpreter.
#[derive(Debug, Clone)]
pub struct Dynamics {
    /// Its hyper-parameters.
    pub params: SamplerParams,
    /// Who applies a lent update: the fused kernels, or candle ops (the reference).
    pub kernel: Kernel,
    /// Seed of the noise.
    pub seed: u64,
    /// Updates done.
    pub step: u64,
    /// v = p·h per parameter tensor, on the parameters' device (empty for SGLD).
    pub momentum: Vec<StateBuffer>,
    device: Device,
    /// SGNHT's α = ξ·h (for mSGNHT: the mean of the per-element thermostats).
    pub thermostat: f64,
    /// The rule's per-element state per parameter tensor: mSGNHT's αᵢ or pSGLD's Vᵢ
    /// (empty otherwise).
    pub per_element: Vec<StateBuffer>,
    n: usize,
    /// Number of parameter tensors.
    tensors: usize,
    kinetic: f64,
    /// Σθ·∇ per tensor of the last update ([`Sampler::virials`]).
    virials: Vec<f64>,
    /// SGHMC with β̂ estimated from each update's minibatch ([`Sampler::estimate_gradient_noise`]).
    estimate_noise: bool,
    /// Elements per tensor.
    sizes: Vec<usize>,
    /// The step in progress ([`TensorwiseStep`]): its update and constants, and each
    /// tensor's sums (added in tensor order at the end, whatever order they came in).
    pending: Option<Pending>,
}

#[derive(Debug, Clone)]
struct Pending {
    update: Update,
    consts: StepConsts,
    sums: Vec<TensorSums>,
    /// With an estimated β̂: each tensor's noise scale √(2(α − β̂_t)η), once reported.
    noise_scales: Vec<Option<f64>>,
}

impl Dynamics {
    /// v ~ N(0, η) from the init stream, thermostat α₀ = a, pSGLD's V₀ = 0; with the
    /// splitting integrator the first A (h/2) applied to θ (and α).
    pub fn init(sampler: SamplerParams, params: &[Var], seed: u64, kernel: Kernel) -> Result<Self> {
        let n = params.iter().map(|p| p.elem_count()).sum();
        let update = update_of(&sampler)?;
        let device = params.first().map_or(Device::Cpu, |p| p.device().clone());
        if kernel == Kernel::Fused && !(device.is_cpu() || device.is_cuda()) {
            return Err(Error::Config(format!(
                "no fused sampler step on {device:?}; use --kernel composed"
            )));
        }
        let (eta, diffusion) = (sampler.step_size(), diffusion_of(&sampler));
        let host: Vec<Vec<f32>> = match update {
            Update::Sgld | Update::Preconditioned => Vec::new(),
            // The composed samplers' initial draw, moved into the sampler's own buffers.
            Update::Momentum | Update::Thermostat { .. } => init_momentum(params, eta, seed)?
                .iter()
                .map(|v| v.flatten_all()?.to_vec1::<f32>())
                .collect::<candle_core::Result<_>>()?,
        };
        let sum_sq: f64 = host
            .iter()
            .flat_map(|m| m.iter())
            .map(|&v| (v as f64) * (v as f64))
            .sum();
        let per_element = per_element_state(update, &host, params, eta, diffusion, &device)?;
        let momentum = host
            .into_iter()
            .map(|m| StateBuffer::new(m, &device))
            .collect::<Result<Vec<_>>>()?;
        let mut s = Dynamics {
            params: sampler,
            kernel,
            seed,
            step: 0,
            momentum,
            device,
            thermostat: diffusion,
            per_element,
            n,
            tensors: params.len(),
            kinetic: 0.0,
            virials: Vec::new(),
            estimate_noise: false,
            sizes: params.iter().map(|p| p.elem_count()).collect(),
            pending: None,
        };
        s.kinetic = s.kinetic_from(sum_sq);
        if sampler.integrator() == Integrator::Splitting {
            // The first A (h/2) of the splitting scheme (the module note): θ ← θ + v/2 and,
            // for SGNHT, α ← α + (vᵀv/n − η)/2.
            for (p, m) in params.iter().zip(&s.momentum) {
                let v = m.to_tensor(p.as_tensor())?;
                p.set(&(p.as_detached_tensor() + (v * 0.5)?)?)?;
            }
            if sampler.kind().is_thermostat() {
                // (For mSGNHT the mean of the αᵢ, whose buffers were set above.)
                s.thermostat += 0.5 * (sum_sq / s.n as f64 - eta);
            }
        }
        Ok(s)
    }

    fn kinetic_from(&self, sum_sq: f64) -> f64 {
        0.5 * sum_sq / (self.n as f64 * self.params.step_size())
    }

    /// (α, σ) of the current step: the friction (SGHMC) or thermostat (SGNHT), and the
    /// injected-noise scale.
    fn friction_and_noise(&self) -> (f64, f64) {
        match self.params {
            SamplerParams::Sgld { step_size } | SamplerParams::Psgld { step_size, .. } => {
                (0.0, (2.0 * step_size).sqrt())
            }
            SamplerParams::Sghmc {
                step_size,
                friction,
                noise_estimate,
                ..
            } => (
                friction,
                (2.0 * (friction - noise_estimate) * step_size).sqrt(),
            ),
            SamplerParams::Sgnht {
                step_size,
                diffusion,
                ..
            }
            | SamplerParams::Msgnht {
                step_size,
                diffusion,
                ..
            } => (self.thermostat, (2.0 * diffusion * step_size).sqrt()),
            // Not built with a fused update (`update_of` refuses them): no step runs.
            SamplerParams::Sgd { .. } | SamplerParams::Momentum { .. } => (0.0, 0.0),
        }
    }

    /// The current step's coefficients ([`StepConsts`]): pSGLD's η, β, λ and σ, or the
    /// others' η, the momentum kept before and after the kick (Euler or splitting, from
    /// their α) and σ.
    fn step_consts(&self) -> StepConsts {
        match self.params {
            SamplerParams::Psgld {
                step_size,
                decay,
                damping,
            } => StepConsts::preconditioned(step_size, decay, damping),
            SamplerParams::Sgld { .. }
            | SamplerParams::Sghmc { .. }
            | SamplerParams::Sgnht { .. }
            | SamplerParams::Msgnht { .. }
            | SamplerParams::Sgd { .. }
            | SamplerParams::Momentum { .. } => {
                let (alpha, sigma) = self.friction_and_noise();
                let eta = self.params.step_size();
                match self.params.integrator() {
                    Integrator::Euler => StepConsts::new(eta, alpha, sigma),
                    Integrator::Splitting => StepConsts::splitting(eta, alpha, sigma),
                }
            }
        }
    }

    /// The momentum of parameter tensor `i` as a tensor shaped like it (diagnostics, tests).
    pub fn momentum_tensor(&self, i: usize, like: &Tensor) -> Result<Tensor> {
        self.momentum[i].to_tensor(like)
    }
}

impl TensorwiseStep for Dynamics {
    fn tensor_count(&self) -> usize {
        self.tensors
    }

    fn open_update(&mut self) -> Result<()> {
        let update = update_of(&self.params)?;
        let consts = self.step_consts();
        let tensors = self.tensors;
        self.pending = Some(Pending {
            update,
            consts,
            sums: vec![TensorSums::default(); tensors],
            noise_scales: vec![None; tensors],
        });
        Ok(())
    }

    fn step_tensor(&mut self, i: usize, p: &Var, g: &Tensor) -> Result<()> {
        if self.kernel == Kernel::Composed {
            let sums = crate::engine::composed::interpret(self.lent(i)?, p, g)?;
            return self.lent_done(i, sums);
        }
        let g = g.detach().contiguous()?;
        let sums = {
            let op = FusedStepOp::new(self.lent(i)?);
            p.as_detached_tensor().inplace_op2(&g, &op)?;
            op.sums.get()
        };
        self.lent_done(i, sums)
    }

    /// (For a fused kernel: none with [`Kernel::Composed`].)
    fn lend_update(&mut self, i: usize) -> Result<Option<LentUpdate<'_>>> {
        if self.kernel == Kernel::Composed {
            return Ok(None);
        }
        self.lent(i).map(Some)
    }

    fn lent_done(&mut self, i: usize, sums: TensorSums) -> Result<()> {
        in_update(&mut self.pending)?.sums[i] = sums;
        Ok(())
    }

    fn inline_update(&mut self, index: usize) -> Result<Option<InlineUpdate<'_>>> {
        if self.kernel == Kernel::Composed {
            return Ok(None);
        }
        let lane = self.lent(index)?;
        let momentum: &mut [f32] = match (lane.update, lane.momentum) {
            (Update::Sgld, _) => &mut [],
            (Update::Momentum, Some(StateBuffer::Host(v))) => v,
            // mSGNHT's per-element thermostats, or state on a GPU: the separate pass.
            #[allow(unreachable_patterns)]
            _ => return Ok(None),
        };
        Ok(Some(InlineUpdate {
            update: lane.update,
            consts: lane.consts,
            key: lane.key,
            momentum,
        }))
    }

    fn inline_done(&mut self, index: usize, sums: TensorSums) -> Result<()> {
        // (The inline updates, SGLD and the momentum step, have no thermostats to sum.)
        self.lent_done(index, sums)
    }

    fn wants_gradient_noise(&self) -> bool {
        self.estimate_noise
    }

    /// Tensor t's noise scale with β̂ estimated (`sampler::estimated_noise_scale`).
    fn gradient_noise(&mut self, t: usize, trace: f64) -> Result<()> {
        let (eta, alpha) = (self.params.step_size(), self.friction_and_noise().0);
        let scale = crate::sampler::estimated_noise_scale(eta, alpha, trace, self.sizes[t]);
        in_update(&mut self.pending)?.noise_scales[t] = Some(scale);
        Ok(())
    }

    fn abandon_update(&mut self) {
        self.pending = None;
    }

    fn close_update(&mut self) -> Result<()> {
        let pending = self
            .pending
            .take()
            .ok_or_else(|| Error::Config("sampler: finish without begin".into()))?;
        if let Some(t) = pending.noise_scales.iter().position(|s| s.is_none()) {
            if self.estimate_noise {
                return Err(crate::sampler::noise_not_reported(t));
            }
        }
        // Summed in tensor order from 0, as a whole-model step sums them.
        let sum_sq = pending.sums.iter().fold(0f64, |a, s| a + s.sum_sq);
        let sum_thermostat = pending.sums.iter().fold(0f64, |a, s| a + s.sum_thermostat);
        self.virials.clear();
        self.virials.extend(pending.sums.iter().map(|s| s.virial));
        if pending.update.states().0 {
            self.kinetic = self.kinetic_from(sum_sq);
        }
        match self.params {
            // Ding et al. Alg. 2: α ← α + uᵀu/n − η, with uᵀu from the same pass.
            SamplerParams::Sgnht { step_size, .. } => {
                self.thermostat += sum_sq / self.n as f64 - step_size;
            }
            SamplerParams::Msgnht { .. } => self.thermostat = sum_thermostat / self.n as f64,
            SamplerParams::Sgld { .. }
            | SamplerParams::Psgld { .. }
            | SamplerParams::Sghmc { .. }
            | SamplerParams::Sgd { .. }
            | SamplerParams::Momentum { .. } => {}
        }
        self.step += 1;
        Ok(())
    }
}

impl Dynamics {
    /// Tensor i's update of the step in progress, with the sampler's buffers of it.
    fn lent(&mut self, i: usize) -> Result<LentUpdate<'_>> {
        let estimate = self.estimate_noise;
        let pending = in_update(&mut self.pending)?;
        let consts = match (estimate, pending.noise_scales[i]) {
            (false, _) => pending.consts,
            (true, Some(scale)) => StepConsts {
                noise_scale: scale as f32,
                ..pending.consts
            },
            (true, None) => return Err(crate::sampler::noise_not_reported(i)),
        };
        Ok(LentUpdate {
            update: pending.update,
            consts,
            key: NoiseKey {
                seed: self.seed,
                step: self.step,
                param: i as u32,
            },
            momentum: self.momentum.get_mut(i),
            thermostat: self.per_element.get_mut(i),
        })
    }
}

/// The rule's per-element state at the start: pSGLD's V₀ = 0 (Li et al. 2016, Alg. 1);
/// mSGNHT's α = a everywhere, then (splitting) the first A (h/2), α ← α + (v⊙v − η)/2,
/// in the composed sampler's f32 operations, from the initial momenta `host`; none for
/// the others.
fn per_element_state(
    update: Update,
    host: &[Vec<f32>],
    params: &[Var],
    eta: f64,
    diffusion: f64,
    device: &Device,
) -> Result<Vec<StateBuffer>> {
    match update {
        Update::Preconditioned => params
            .iter()
            .map(|p| StateBuffer::new(vec![0f32; p.elem_count()], device))
            .collect(),
        Update::Thermostat { splitting } => {
            let (eta, a) = (eta as f32, diffusion as f32);
            host.iter()
                .map(|v| {
                    let alpha = v
                        .iter()
                        .map(|&v| match splitting {
                            true => a + (v * v - eta) * 0.5,
                            false => a,
                        })
                        .collect();
                    StateBuffer::new(alpha, device)
                })
                .collect()
        }
        Update::Sgld | Update::Momentum => Ok(Vec::new()),
    }
}

/// The update in progress.
fn in_update(pending: &mut Option<Pending>) -> Result<&mut Pending> {
    pending
        .as_mut()
        .ok_or_else(|| Error::Config("sampler: tensor step outside begin/finish".into()))
}

/// The fused element update of `sampler` (also the step plan's, `engine::planned`).
pub(crate) fn update_of(sampler: &SamplerParams) -> Result<Update> {
    match *sampler {
        SamplerParams::Sgld { .. } => Ok(Update::Sgld),
        SamplerParams::Psgld { .. } => Ok(Update::Preconditioned),
        SamplerParams::Sghmc { .. } | SamplerParams::Sgnht { .. } => Ok(Update::Momentum),
        SamplerParams::Msgnht { integrator, .. } => Ok(Update::Thermostat {
            splitting: integrator == Integrator::Splitting,
        }),
        SamplerParams::Sgd { .. } | SamplerParams::Momentum { .. } => Err(Error::Config(format!(
            "no fused kernel for {}; use the composed implementation",
            sampler.kind().name()
        ))),
    }
}

/// a of the thermostat samplers (their α's start); 0 for the others.
fn diffusion_of(sampler: &SamplerParams) -> f64 {
    match *sampler {
        SamplerParams::Sgnht { diffusion, .. } | SamplerParams::Msgnht { diffusion, .. } => {
            diffusion
        }
        SamplerParams::Sgld { .. }
        | SamplerParams::Psgld { .. }
        | SamplerParams::Sghmc { .. }
        | SamplerParams::Sgd { .. }
        | SamplerParams::Momentum { .. } => 0.0,
    }
}

impl Sampler for Dynamics {
    fn params(&self) -> SamplerParams {
        self.params
    }

    fn diagnostics(&self) -> Diagnostics {
        let momentum = !self.momentum.is_empty();
        Diagnostics {
            kinetic_energy: momentum.then_some(self.kinetic),
            thermostat: self
                .params
                .kind()
                .is_thermostat()
                .then_some(self.thermostat),
        }
    }

    fn virials(&self) -> &[f64] {
        &self.virials
    }

    fn estimate_gradient_noise(&mut self) -> Result<()> {
        crate::sampler::only_sghmc_estimates_noise(self.params.kind())?;
        self.estimate_noise = true;
        Ok(())
    }

    fn state(&self) -> Result<SamplerState> {
        if self.pending.is_some() {
            return Err(Error::Config(
                "sampler state asked for in the middle of a step".into(),
            ));
        }
        let host = |buffers: &[StateBuffer]| -> Result<Vec<Tensor>> {
            buffers
                .iter()
                .map(|b| {
                    let v = b.to_host(&self.device)?;
                    let n = v.len();
                    Ok(Tensor::from_vec(v, n, &Device::Cpu)?)
                })
                .collect()
        };
        let clock = Clock {
            step: self.step,
            step_size: self.params.step_size(),
        };
        let (momentum, kinetic) = (host(&self.momentum)?, self.kinetic);
        Ok(match self.params {
            SamplerParams::Sgnht { .. } => SamplerState::Sgnht(SgnhtState {
                clock,
                momentum,
                thermostat: self.thermostat,
                kinetic,
            }),
            SamplerParams::Msgnht { .. } => SamplerState::Msgnht(MsgnhtState {
                clock,
                momentum,
                thermostats: host(&self.per_element)?,
                mean_thermostat: self.thermostat,
                kinetic,
            }),
            SamplerParams::Sgld { .. } => SamplerState::Sgld(clock),
            SamplerParams::Psgld { .. } => SamplerState::Psgld(PsgldState {
                clock,
                second_moment: host(&self.per_element)?,
            }),
            SamplerParams::Sghmc { .. } => SamplerState::Sghmc(SghmcState {
                clock,
                momentum,
                kinetic,
            }),
            SamplerParams::Sgd { .. } | SamplerParams::Momentum { .. } => {
                return Err(Error::Config(format!(
                    "no fused state for {}",
                    self.params.kind().name()
                )))
            }
        })
    }

    fn restore(&mut self, state: &SamplerState) -> Result<()> {
        let no_buffers: &[Tensor] = &[];
        let (momentum, per_element, thermostat) = match (self.params, state) {
            (SamplerParams::Sgld { .. }, SamplerState::Sgld(_)) => (no_buffers, no_buffers, None),
            (SamplerParams::Psgld { .. }, SamplerState::Psgld(s)) => {
                (no_buffers, &s.second_moment[..], None)
            }
            (SamplerParams::Sghmc { .. }, SamplerState::Sghmc(s)) => {
                (&s.momentum[..], no_buffers, None)
            }
            (SamplerParams::Sgnht { .. }, SamplerState::Sgnht(s)) => {
                (&s.momentum[..], no_buffers, Some(s.thermostat))
            }
            (SamplerParams::Msgnht { .. }, SamplerState::Msgnht(s)) => {
                (&s.momentum[..], &s.thermostats[..], Some(s.mean_thermostat))
            }
            (params, _) => return Err(state.refuse(params.kind().name())),
        };
        let device = self.device.clone();
        load_buffers(momentum, &mut self.momentum, "momentum", &device)?;
        load_buffers(per_element, &mut self.per_element, "per-element", &device)?;
        if let Some(alpha) = thermostat {
            self.thermostat = alpha;
        }
        let clock = state.clock();
        self.kinetic = state.kinetic();
        self.step = clock.step;
        self.params = self.params.with_step_size(clock.step_size);
        Ok(())
    }

    fn steps(&self) -> u64 {
        self.step
    }

    fn set_step_size(&mut self, step_size: f64) -> Result<()> {
        let factor = (step_size / self.params.step_size()).sqrt() as f32;
        for m in &mut self.momentum {
            m.scale(factor, &self.device)?;
        }
        self.params = self.params.with_step_size(step_size);
        Ok(())
    }
}

/// Replaces `own`'s buffers by the saved flat tensors `saved`, checking every size first so
/// that a refused state leaves `own` as it was.
fn load_buffers(
    saved: &[Tensor],
    own: &mut [StateBuffer],
    what: &str,
    device: &Device,
) -> Result<()> {
    if saved.len() != own.len() {
        return Err(Error::Checkpoint(format!(
            "the saved state has {} {what} tensors, the sampler {}",
            saved.len(),
            own.len()
        )));
    }
    let mut values = Vec::with_capacity(saved.len());
    for (s, o) in saved.iter().zip(own.iter()) {
        let v = s.flatten_all()?.to_vec1::<f32>()?;
        if v.len() != o.len() {
            return Err(Error::Checkpoint(format!(
                "a saved {what} tensor has {} values, the sampler's {}",
                v.len(),
                o.len()
            )));
        }
        values.push(v);
    }
    for (v, o) in values.into_iter().zip(own.iter_mut()) {
        *o = StateBuffer::new(v, device)?;
    }
    Ok(())
}
