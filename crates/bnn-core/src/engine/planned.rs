//! K MLP chains stepped by the step plan ([`crate::kernels::plan`]): the binding between
//! the library's chain state — a [`Network`]'s θ, a sampler's [`SamplerState`], a
//! [`Potential`]'s λ, T and τ — and the plan's workspace, whose updates then run with no
//! host read until the state is read back. The executor here is the host one, the test
//! double of the CUDA executor: every update of the plan is checked on it against the
//! CPU path (`tests/suite/plan.rs`).
//!
//! The gradient is the hand-written pass's: ∇Ũ/T = s·Σᵢ∇(−log p(yᵢ|xᵢ,θ)) + (λ_t/T)·θ with
//! s = N/(|S|·T) ([`Potential::likelihood_scale`]), the prior's term added in the fused
//! update. What a chain's control block carries is set from the state once and moved by
//! the plan's own kernels after each update (the thermostat, the step counter, the next
//! constants, the minibatch offset), so S updates in a row are one replay.

use candle_core::{Device, DeviceLocation, Tensor};

use crate::engine::dynamics;
use crate::error::{Error, Result};
use crate::kernels::plan::host::{self, HostWorkspace};
use crate::kernels::plan::mlp::{HeldOut, MlpPlan, MlpShape};
use crate::kernels::plan::{Act, Bookkeeping, ChainControl, Executor, Plan, TALLY};
use crate::kernels::Update;
use crate::likelihood::HALF_LOG_2PI;
use crate::model::{Activation, ModelSpec, Network};
use crate::potential::Potential;
use crate::sampler::state::{MsgnhtState, PsgldState, SghmcState, SgnhtState};
use crate::sampler::{Clock, Integrator, SamplerParams, SamplerState};

/// One chain's tallies of a held-out set after [`PlannedChains::fold`]: its sample alone
/// and its ensemble after it, each the `BNN_PLAN_TALLY` values of `metrics::Tally`, over
/// `rows` rows. Plain data: the ensemble's floor makes them metrics.
#[derive(Debug, Clone, PartialEq)]
pub struct FoldTallies {
    /// The sample alone.
    pub alone: [f64; TALLY],
    /// The ensemble with it.
    pub ensemble: [f64; TALLY],
    /// The set's rows.
    pub rows: usize,
}

/// The resident training set: rows of features (N × D, as `Split::gather` writes them),
/// with class labels or a regression's targets.
#[derive(Debug, Clone, Copy)]
pub enum Resident<'a> {
    /// Classification.
    Classes {
        /// N × D features.
        x: &'a [f32],
        /// N labels.
        labels: &'a [u32],
    },
    /// A Gaussian likelihood's (standardised) targets.
    Values {
        /// N × D features.
        x: &'a [f32],
        /// N targets.
        y: &'a [f32],
    },
}

/// A classifier's held-out set (the test set, the validation set) resident on the plan's
/// executor, whose every chain's ensemble the plan keeps there.
#[derive(Debug, Clone, Copy)]
pub struct HeldOutSet<'a> {
    /// N × D features.
    pub x: &'a [f32],
    /// N labels, each below the classes.
    pub labels: &'a [u32],
}

impl Resident<'_> {
    fn rows(&self) -> usize {
        match self {
            Resident::Classes { labels, .. } => labels.len(),
            Resident::Values { y, .. } => y.len(),
        }
    }
}

/// One chain handed to the plan: its network, its sampler's state and parameters, the
/// seed of its noise and its potential.
#[derive(Debug, Clone, Copy)]
pub struct ChainInput<'a> {
    /// θ.
    pub net: &'a Network,
    /// The sampler's parameters (every chain's the same).
    pub params: SamplerParams,
    /// Its state (`Sampler::state`).
    pub state: &'a SamplerState,
    /// The Philox key of its noise.
    pub seed: u64,
    /// λ per tensor, T, τ and N.
    pub potential: &'a Potential,
}

/// Where a chain stands in its epoch: updates run, and the sums of their minibatches'
/// NLL × B, arg-max hits, squared errors and kinetic energies (`Position`'s).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct EpochSums {
    /// Updates run in the epoch.
    pub updates: u64,
    /// Σ mean NLL × B.
    pub nll: f64,
    /// Σ arg-max hits.
    pub correct: f64,
    /// Σ (f − y)² of a regression.
    pub sse: f64,
    /// Σ kinetic energy after each update.
    pub kinetic: f64,
}

impl EpochSums {
    /// The sums a chain's control block holds.
    pub fn of(c: &ChainControl) -> Self {
        EpochSums {
            updates: c.updates,
            nll: c.epoch_nll,
            correct: c.epoch_correct,
            sse: c.epoch_sse,
            kinetic: c.epoch_kinetic,
        }
    }
}

/// K chains of one MLP in one plan's workspace, on the host or a device.
#[derive(Debug)]
pub struct PlannedChains {
    mlp: MlpPlan,
    ws: Box<dyn Executor>,
    params: SamplerParams,
    spec: ModelSpec,
    /// Updates run in the open epoch (every chain's: they move in step), kept on the host
    /// so that a run needs no read of the device to know where the epoch stands.
    epoch_updates: usize,
    /// The device's η table as last written (K × U), and each chain's η of its next
    /// update as the device holds it: the host writes only what changes.
    etas: Vec<f64>,
    next_eta: Vec<f64>,
}

/// The executor of `plan` for `device`: the host one on the CPU, the CUDA one on a CUDA
/// device (feature `cuda`).
fn executor_on(plan: &Plan, device: &Device) -> Result<Box<dyn Executor>> {
    match device.location() {
        DeviceLocation::Cpu => Ok(Box::new(HostWorkspace::new(plan))),
        #[cfg(feature = "cuda")]
        DeviceLocation::Cuda { gpu_id } => Ok(Box::new(
            crate::kernels::plan::cuda::CudaWorkspace::new(plan, gpu_id)?,
        )),
        other => Err(Error::Config(format!(
            "the step plan runs on the CPU (its host executor) or on CUDA (a build with \
             feature cuda), not on {other:?}"
        ))),
    }
}

/// The plan's element rule for `params` (the fused kernels' own, `Dynamics`'); an error for
/// a sampler the plan does not run.
pub fn update_of(params: &SamplerParams) -> Result<Update> {
    Ok(rule_of(params)?.0)
}

/// The plan's element rule and bookkeeping for `params`; an error for a sampler the plan
/// does not run (the MAP baselines, which have no fused update, and SGHMC with β̂).
fn rule_of(params: &SamplerParams) -> Result<(Update, Bookkeeping)> {
    let refused = || {
        Error::Config(format!(
            "the step plan runs sgld, psgld, sghmc (without a noise estimate), sgnht and msgnht, not {}",
            params.kind().name()
        ))
    };
    let book = match *params {
        SamplerParams::Sgld { .. } => Bookkeeping::Sgld,
        SamplerParams::Psgld { .. } => Bookkeeping::Psgld,
        SamplerParams::Sghmc { noise_estimate, .. } if noise_estimate != 0.0 => {
            return Err(refused())
        }
        SamplerParams::Sghmc { .. } => Bookkeeping::Sghmc,
        SamplerParams::Sgnht { .. } => Bookkeeping::Sgnht,
        SamplerParams::Msgnht { .. } => Bookkeeping::Msgnht,
        SamplerParams::Sgd { .. } | SamplerParams::Momentum { .. } => return Err(refused()),
    };
    Ok((dynamics::update_of(params)?, book))
}

/// Whether the plan runs `net` under `params`: an MLP of relu, sigmoid or tanh, and a
/// sampler with a fused update (not the MAP baselines, not SGHMC with β̂); an error saying
/// why not.
pub fn supports(net: &Network, params: &SamplerParams) -> Result<()> {
    if !net.convs.is_empty() || net.resnet.is_some() {
        return Err(Error::Config(
            "the step plan runs MLPs (a CNN or ResNet keeps candle)".into(),
        ));
    }
    act_of(net.spec.activation)?;
    rule_of(params).map(|_| ())
}

/// The plan's activation of an MLP's.
fn act_of(a: Activation) -> Result<Act> {
    match a {
        Activation::Relu => Ok(Act::Relu),
        Activation::Sigmoid => Ok(Act::Sigmoid),
        Activation::Tanh => Ok(Act::Tanh),
        Activation::Swish => Err(Error::Config(
            "the step plan's MLPs use relu, sigmoid or tanh".into(),
        )),
    }
}

impl PlannedChains {
    /// The plan of `chains` (one architecture, one sampler) at minibatches of `batch` rows
    /// of `data`, an epoch's index holding `epoch_rows` rows per chain, its workspace on
    /// the host loaded with each chain's θ, state and potential.
    pub fn new(
        chains: &[ChainInput<'_>],
        data: Resident<'_>,
        batch: usize,
        epoch_rows: usize,
    ) -> Result<Self> {
        Self::on(chains, data, &[], (batch, epoch_rows), &Device::Cpu)
    }

    /// [`PlannedChains::new`] with the workspace on `device` (the CUDA executor on a CUDA
    /// device) and `held_out` sets of a classifier (features as the training set's)
    /// resident beside the training set, whose class probabilities
    /// [`PlannedChains::predict`] computes and [`PlannedChains::fold`] folds into every
    /// chain's ensemble there (empty ones at first); `(batch, epoch_rows)` as `new`'s.
    pub fn on(
        chains: &[ChainInput<'_>],
        data: Resident<'_>,
        held_out: &[HeldOutSet<'_>],
        (batch, epoch_rows): (usize, usize),
        device: &Device,
    ) -> Result<Self> {
        let first = chains
            .first()
            .ok_or_else(|| Error::Config("step plan: no chain".into()))?;
        let net = first.net;
        supports(net, &first.params)?;
        let (update, _) = rule_of(&first.params)?;
        let d = net.fc_widths()[0];
        let classes = *net.fc_widths().last().unwrap_or(&0);
        for set in held_out {
            if set.x.is_empty() || set.x.len() != set.labels.len() * d {
                return Err(Error::Config(format!(
                    "step plan: a held-out set that is not one row of {d} features a label"
                )));
            }
            if let Some(y) = set.labels.iter().find(|&&y| y as usize >= classes) {
                return Err(Error::Config(format!(
                    "step plan: held-out label {y} is not one of {classes} classes"
                )));
            }
        }
        let shape = MlpShape {
            held_out: held_out.iter().map(|set| set.labels.len()).collect(),
            widths: net.fc_widths(),
            act: act_of(net.spec.activation)?,
            batch,
            chains: chains.len(),
            rows: data.rows(),
            epoch_rows,
            update,
            gaussian: matches!(data, Resident::Values { .. }),
        };
        let shape_u = shape.updates_per_epoch();
        let mlp = MlpPlan::new(shape)?;
        let mut ws = executor_on(&mlp.plan, device)?;
        let b = &mlp.bufs;
        ws.write(b.table, 0, std::slice::from_ref(&mlp.table))?;
        match data {
            Resident::Classes { x, labels } => {
                ws.write(b.data, 0, x)?;
                ws.write(b.targets, 0, labels)?;
            }
            Resident::Values { x, y } => {
                ws.write(b.data, 0, x)?;
                ws.write(b.targets, 0, y)?;
            }
        }
        for (held, set) in mlp.held_out.iter().zip(held_out) {
            ws.write(held.data, 0, set.x)?;
            ws.write(held.labels, 0, set.labels)?;
        }
        let mut planned = PlannedChains {
            mlp,
            ws,
            params: first.params,
            spec: net.spec.clone(),
            epoch_updates: 0,
            etas: vec![0.0; chains.len() * shape_u],
            next_eta: vec![0.0; chains.len()],
        };
        for (k, c) in chains.iter().enumerate() {
            planned.load(k, c)?;
        }
        planned.ws.prepare(&planned.mlp.plan)?;
        Ok(planned)
    }

    /// The plan.
    pub fn plan(&self) -> &Plan {
        &self.mlp.plan
    }

    /// The held-out sets and their forward passes, in `on`'s order.
    pub fn held_out(&self) -> &[HeldOut] {
        &self.mlp.held_out
    }

    /// P, parameters per chain.
    fn p(&self) -> usize {
        self.mlp.table.p as usize
    }

    /// Chain k's θ, sampler state and potential into the workspace (a restore, or a test
    /// that steps the plan from another computation's state); where it stands in the open
    /// epoch (its offset and the epoch's sums) is kept.
    pub fn load(&mut self, k: usize, c: &ChainInput<'_>) -> Result<()> {
        if c.net.spec != self.spec || c.params != self.params {
            return Err(Error::Config(
                "step plan: chains of different networks or samplers".into(),
            ));
        }
        let p = self.p();
        let theta: Vec<f32> = flat(c.net.params.iter().map(|q| q.var.as_tensor()))?;
        if theta.len() != p {
            return Err(Error::Config(format!(
                "step plan: {} parameters for {p}",
                theta.len()
            )));
        }
        let b = self.mlp.bufs.clone();
        self.ws.write(b.theta, k * p, &theta)?;
        let s = c.state;
        if let Some(v) = b.momentum {
            self.ws.write(v, k * p, &flat(s.momentum().iter())?)?;
        }
        if let Some(e) = b.per_element {
            let own = match s {
                SamplerState::Psgld(_) => s.second_moments(),
                _ => s.thermostats(),
            };
            self.ws.write(e, k * p, &flat(own.iter())?)?;
        }
        let (_, book) = rule_of(&c.params)?;
        let clock = s.clock();
        let mut ctl = ChainControl {
            seed: c.seed,
            step: clock.step,
            eta: clock.step_size,
            eta_v: clock.step_size,
            thermostat: s.thermostat().unwrap_or(0.0),
            kinetic: s.kinetic(),
            n_params: p as f64,
            sampler: book as u32,
            splitting: (c.params.integrator() == Integrator::Splitting) as u32,
            ..ChainControl::default()
        };
        match c.params {
            SamplerParams::Sghmc { friction, .. } => ctl.friction = friction,
            SamplerParams::Sgnht { diffusion, .. } | SamplerParams::Msgnht { diffusion, .. } => {
                ctl.diffusion = diffusion
            }
            SamplerParams::Psgld { decay, damping, .. } => {
                (ctl.decay, ctl.damping) = (decay, damping)
            }
            // SGLD has no constant of its own; the MAP baselines are refused by `rule_of`.
            SamplerParams::Sgld { .. }
            | SamplerParams::Sgd { .. }
            | SamplerParams::Momentum { .. } => {}
        }
        let old = self.ws.control(b.control, k)?;
        (ctl.offset, ctl.updates) = (old.offset, old.updates);
        (ctl.epoch_nll, ctl.epoch_correct, ctl.epoch_sse) =
            (old.epoch_nll, old.epoch_correct, old.epoch_sse);
        ctl.epoch_kinetic = old.epoch_kinetic;
        self.ws.set_control(b.control, k, &ctl)?;
        self.next_eta[k] = ctl.eta;
        self.set_potential(k, c.potential)?;
        Ok(())
    }

    /// Chain k's λ/T per tensor, the likelihood's scale and τ from `potential` (after a
    /// Gibbs step: written between updates, never read back).
    pub fn set_potential(&mut self, k: usize, potential: &Potential) -> Result<()> {
        let batch = self.mlp.shape.batch;
        let tensors = self.mlp.table.tensors as usize;
        if potential.prior.precisions.len() != tensors {
            return Err(Error::Config(
                "step plan: a prior of another network".into(),
            ));
        }
        let mut c = self.ws.control(self.mlp.bufs.control, k)?;
        for (t, &lambda) in potential.prior.precisions.iter().enumerate() {
            c.prior[t] = (potential.inverse_temperature() * lambda) as f32;
        }
        c.scale = potential.likelihood_scale(batch) as f32;
        let tau = potential.noise_precision;
        c.precision = tau as f32;
        c.nll_const = batch as f64 * (HALF_LOG_2PI - 0.5 * tau.ln());
        host::next_consts(&mut c);
        self.ws.set_control(self.mlp.bufs.control, k, &c)
    }

    /// Chain k's η for the open epoch's updates from `etas[0]` = η of its next update
    /// on (at most the epoch's remaining updates; the rest keep their η): the schedule's,
    /// read by the plan's finish after each update, so that S updates under a moving η
    /// are still one replay. A host write between updates, as a Gibbs step's.
    pub fn set_step_sizes(&mut self, k: usize, etas: &[f64]) -> Result<()> {
        let (u, done) = (self.mlp.shape.updates_per_epoch(), self.epoch_updates);
        if etas.len() > u - done.min(u) {
            return Err(Error::Config(format!(
                "step plan: {} step sizes for the epoch's {} updates left",
                etas.len(),
                u - done.min(u)
            )));
        }
        // Only what changed is written, and the control block only where the next η
        // itself changed (the device's η is the table's entry there): so where a run stops
        // to look changes nothing of what the device computes.
        let row = k * u + done;
        let mirror = &mut self.etas[row..row + etas.len()];
        if mirror != etas {
            mirror.copy_from_slice(etas);
            self.ws.write(self.mlp.bufs.etas, row, etas)?;
        }
        if let Some(&next) = etas.first() {
            if next != self.next_eta[k] {
                self.next_eta[k] = next;
                let mut c = self.ws.control(self.mlp.bufs.control, k)?;
                c.eta = next;
                host::next_consts(&mut c);
                self.ws.set_control(self.mlp.bufs.control, k, &c)?;
            }
        }
        Ok(())
    }

    /// Opens an epoch: chain k's minibatches are the rows `orders[k][..epoch_rows]`, in
    /// order; the offsets and the epoch's sums start again, and each chain's η table
    /// holds its η in force for every update until [`PlannedChains::set_step_sizes`].
    pub fn begin_epoch(&mut self, orders: &[&[usize]]) -> Result<()> {
        let (k, m) = (self.mlp.shape.chains, self.mlp.shape.epoch_rows);
        if orders.len() != k || orders.iter().any(|o| o.len() < m) {
            return Err(Error::Config(format!(
                "step plan: {k} orders of {m} rows wanted"
            )));
        }
        let index: Vec<u32> = orders
            .iter()
            .flat_map(|o| o[..m].iter().map(|&i| i as u32))
            .collect();
        let b = self.mlp.bufs.clone();
        self.ws.write(b.index, 0, &index)?;
        let u = self.mlp.shape.updates_per_epoch();
        let mut controls = self.ws.read::<ChainControl>(b.control, 0, k)?;
        let mut etas = Vec::with_capacity(k * u);
        for c in &mut controls {
            (c.offset, c.updates) = (0, 0);
            (c.epoch_nll, c.epoch_correct, c.epoch_sse) = (0.0, 0.0, 0.0);
            c.epoch_kinetic = 0.0;
            etas.extend(std::iter::repeat_n(c.eta, u));
        }
        self.ws.write(b.control, 0, &controls)?;
        self.ws.write(b.etas, 0, &etas)?;
        self.next_eta = controls.iter().map(|c| c.eta).collect();
        self.etas = etas;
        self.epoch_updates = 0;
        Ok(())
    }

    /// Chain k resumed `sums.updates` updates into the epoch opened by
    /// [`PlannedChains::begin_epoch`], with the epoch's sums saved then.
    pub fn resume_epoch(&mut self, k: usize, sums: &EpochSums) -> Result<()> {
        let (b, u) = (self.mlp.shape.batch, self.mlp.shape.updates_per_epoch());
        if sums.updates as usize > u {
            return Err(Error::Checkpoint(format!(
                "step plan: {} updates into an epoch of {u}",
                sums.updates
            )));
        }
        let mut c = self.ws.control(self.mlp.bufs.control, k)?;
        (c.updates, c.offset) = (sums.updates, (sums.updates as usize * b) as u32);
        (c.epoch_nll, c.epoch_correct) = (sums.nll, sums.correct);
        (c.epoch_sse, c.epoch_kinetic) = (sums.sse, sums.kinetic);
        // The chains move in step: each resumed at the same place.
        self.epoch_updates = sums.updates as usize;
        self.ws.set_control(self.mlp.bufs.control, k, &c)
    }

    /// Whether the rule has a momentum, whose kinetic energy each update reports.
    pub fn has_momentum(&self) -> bool {
        self.mlp.bufs.momentum.is_some()
    }

    /// The virials per tensor of the open epoch's first update in control block `c`.
    pub fn first_virials_of(&self, c: &ChainControl) -> Vec<f64> {
        c.first_virials[..self.mlp.table.tensors as usize].to_vec()
    }

    /// `updates` updates of every chain, no host read between them.
    pub fn run(&mut self, updates: usize) -> Result<()> {
        let per_epoch = self.mlp.shape.updates_per_epoch();
        if self.epoch_updates + updates > per_epoch {
            return Err(Error::Config(format!(
                "step plan: {updates} updates past the epoch's {per_epoch} minibatches"
            )));
        }
        self.ws.run(&self.mlp.plan, updates)?;
        self.epoch_updates += updates;
        // Each finish took its next η from the table, but the epoch's last.
        let u = self.mlp.shape.updates_per_epoch();
        if self.epoch_updates < u {
            for (k, next) in self.next_eta.iter_mut().enumerate() {
                *next = self.etas[k * u + self.epoch_updates];
            }
        }
        Ok(())
    }

    /// Chain k's control block (one read of the device, for a progress line or an epoch's
    /// end).
    pub fn control(&mut self, k: usize) -> Result<ChainControl> {
        self.ws.control(self.mlp.bufs.control, k)
    }

    /// Every chain's control block, in one read.
    pub fn controls(&mut self) -> Result<Vec<ChainControl>> {
        let k = self.mlp.shape.chains;
        self.ws.read(self.mlp.bufs.control, 0, k)
    }

    /// Every chain's class probabilities of held-out set `set` (in `on`'s order) at its θ
    /// now: the set's forward pass on the executor, then one read of K × N × classes;
    /// chain k's N × classes in `[k]`.
    pub fn predict(&mut self, set: usize) -> Result<Vec<Vec<f32>>> {
        let mlp = &self.mlp;
        let held = held(mlp, set)?;
        self.ws.run_ops(&mlp.plan, &held.ops)?;
        let per_chain = held.rows * classes_of(mlp);
        let all = self
            .ws
            .read::<f32>(held.probs, 0, mlp.shape.chains * per_chain)?;
        Ok(all.chunks_exact(per_chain).map(<[f32]>::to_vec).collect())
    }

    /// Every chain's sample at its θ now folded into its ensemble of held-out set `set`
    /// on the executor (the set's forward pass, the fold, the tallies: no probability
    /// leaves it), then one read of K × 2 tallies; chain k's in `[k]`
    /// (`ensemble::Folded::of_tallies` makes them metrics).
    pub fn fold(&mut self, set: usize) -> Result<Vec<FoldTallies>> {
        let mlp = &self.mlp;
        let held = held(mlp, set)?;
        self.ws.run_ops(&mlp.plan, &held.ops)?;
        self.ws.run_ops(&mlp.plan, &held.fold)?;
        let (k, rows) = (mlp.shape.chains, held.rows);
        let all = self.ws.read::<f64>(held.tallies, 0, k * 2 * TALLY)?;
        let values = |v: &[f64]| -> [f64; TALLY] { v.try_into().expect("TALLY values") };
        Ok(all
            .chunks_exact(2 * TALLY)
            .map(|chain| FoldTallies {
                alone: values(&chain[..TALLY]),
                ensemble: values(&chain[TALLY..]),
                rows,
            })
            .collect())
    }

    /// Chain k's ensemble sums of held-out set `set` as they stand on the executor (a
    /// checkpoint's, the end's read): Σₖ p (N × classes) and Σₖ H(p) (N), as
    /// `ensemble::Sums` holds them.
    pub fn ensemble_sums(&mut self, set: usize, k: usize) -> Result<(Vec<f64>, Vec<f64>)> {
        let held = held(&self.mlp, set)?;
        let (n, classes) = (held.rows, classes_of(&self.mlp));
        let ((sum, entropy), per) = (held.sums, n * classes);
        Ok((
            self.ws.read(sum, k * per, per)?,
            self.ws.read(entropy, k * n, n)?,
        ))
    }

    /// Chain k's ensemble of held-out set `set` set to the sums `(Σp, ΣH)` of `samples`
    /// samples (a restored run's; a fresh one's are empty).
    pub fn restore_ensemble(
        &mut self,
        set: usize,
        k: usize,
        (probability, entropy): (&[f64], &[f64]),
        samples: usize,
    ) -> Result<()> {
        let held = held(&self.mlp, set)?;
        let (n, classes) = (held.rows, classes_of(&self.mlp));
        let ((sum, entropy_buf), count) = (held.sums, held.samples);
        if probability.len() != n * classes || entropy.len() != n {
            return Err(Error::Config(format!(
                "step plan: ensemble sums of {} + {} values for {n} rows of {classes} classes",
                probability.len(),
                entropy.len()
            )));
        }
        self.ws.write(sum, k * n * classes, probability)?;
        self.ws.write(entropy_buf, k * n, entropy)?;
        self.ws.write(count, k, &[samples as f64])
    }

    /// Which executor runs the plan (`host`, `cuda graphs …`, `cuda eager …`).
    pub fn executor(&self) -> String {
        self.ws.describe()
    }

    /// The plan's workspace, to copy buffers in and out and run parts of the plan (the GPU
    /// tests compare the executors operation by operation).
    pub fn workspace(&mut self) -> &mut dyn Executor {
        self.ws.as_mut()
    }

    /// Chain k's θ, in the network's order and shapes, into `net`.
    pub fn read_theta(&mut self, k: usize, net: &Network) -> Result<()> {
        let p = self.p();
        let theta = self.ws.read::<f32>(self.mlp.bufs.theta, k * p, p)?;
        let mut at = 0;
        for q in &net.params {
            let n = q.var.elem_count();
            let t = Tensor::from_slice(&theta[at..at + n], q.var.shape(), q.var.device())?;
            q.var.set(&t)?;
            at += n;
        }
        Ok(())
    }

    /// Chain k's sampler state as the plan holds it (`Sampler::restore` takes it back).
    pub fn state(&mut self, k: usize) -> Result<SamplerState> {
        let (p, b) = (self.p(), self.mlp.bufs.clone());
        let c = self.control(k)?;
        let sizes = self.mlp.shape.tensor_sizes();
        let mut split = |buf| -> Result<Vec<Tensor>> {
            let all = self.ws.read::<f32>(buf, k * p, p)?;
            let mut at = 0;
            sizes
                .iter()
                .map(|&n| {
                    at += n;
                    Ok(Tensor::from_slice(&all[at - n..at], n, &Device::Cpu)?)
                })
                .collect()
        };
        // The η that v is scaled for, as a sampler's clock holds it (the next update's η
        // is the schedule's, set again when the chain is loaded).
        let clock = Clock {
            step: c.step,
            step_size: c.eta_v,
        };
        let momentum = match b.momentum {
            Some(v) => split(v)?,
            None => Vec::new(),
        };
        Ok(match self.params {
            SamplerParams::Sgld { .. } => SamplerState::Sgld(clock),
            SamplerParams::Psgld { .. } => SamplerState::Psgld(PsgldState {
                clock,
                second_moment: split(b.per_element.expect("pSGLD's V"))?,
            }),
            SamplerParams::Sghmc { .. } => SamplerState::Sghmc(SghmcState {
                clock,
                momentum,
                kinetic: c.kinetic,
            }),
            SamplerParams::Sgnht { .. } => SamplerState::Sgnht(SgnhtState {
                clock,
                momentum,
                thermostat: c.thermostat,
                kinetic: c.kinetic,
            }),
            SamplerParams::Msgnht { .. } => SamplerState::Msgnht(MsgnhtState {
                clock,
                momentum,
                thermostats: split(b.per_element.expect("mSGNHT's αᵢ"))?,
                mean_thermostat: c.thermostat,
                kinetic: c.kinetic,
            }),
            SamplerParams::Sgd { .. } | SamplerParams::Momentum { .. } => {
                unreachable!("refused by rule_of")
            }
        })
    }
}

/// The values of `tensors` one after the other, as f32 on the host.
fn flat<'t>(tensors: impl Iterator<Item = &'t Tensor>) -> Result<Vec<f32>> {
    let mut out = Vec::new();
    for t in tensors {
        out.extend(t.flatten_all()?.to_vec1::<f32>()?);
    }
    Ok(out)
}

/// Held-out set `set` of `mlp`.
fn held(mlp: &MlpPlan, set: usize) -> Result<&HeldOut> {
    mlp.held_out
        .get(set)
        .ok_or_else(|| Error::Config(format!("step plan: no held-out set {set}")))
}

/// The classes of `mlp`'s output layer.
fn classes_of(mlp: &MlpPlan) -> usize {
    mlp.shape.widths[mlp.shape.layers()]
}
