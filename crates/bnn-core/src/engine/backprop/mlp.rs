//! The MLP's forward and backward pass written by hand for the CPU: the fast path of
//! [`crate::potential::pass::Pass::evaluate_then`].
//!
//! Why not candle's autograd: it builds a graph per step, allocates every intermediate
//! and every gradient anew, and computes gradients nobody needs (for the input images,
//! whose matmul alone costs as much as a weight gradient). Here, per step:
//!
//! - forward: Zₖ = Aₖ₋₁·Wₖᵀ (one gemm), then bias and activation in one pass;
//! - loss: log-softmax, NLL, argmax and the output error Δ_L = s·(softmax − onehot) in
//!   one pass over the logits, with s = N/(|S|·T) the likelihood scale of
//!   [`crate::potential`];
//! - backward: ∇Wₖ = Δₖᵀ·Aₖ₋₁ + (λₖ/T)·Wₖ and ∇bₖ = Σ_rows Δₖ + (λₖ/T)·bₖ written straight
//!   into the gradient tensors; Δₖ₋₁ = (Δₖ·Wₖ) ⊙ act′(Aₖ₋₁) only for k > 1 (no input
//!   gradient).
//!
//! All buffers (activations, errors, gradient tensors) are allocated once and reused; a
//! steady-state step allocates only a few small vectors (the parameter views). The
//! gradient tensors are ordinary candle CPU
//! tensors written through an in-place op (candle's only sound way to write a tensor's
//! storage); the samplers read them as usual. The matrix products are
//! [`crate::kernels::gemm::product`]; the first layer skips the minibatch's zero pixels
//! ([`crate::kernels::gemm::NonZero`]).
//!
//! Given a sampler's per-tensor step ([`TensorwiseStep`]), each tensor is updated as soon
//! as its gradient is final, and a large weight tensor's update runs
//! inside its gradient's product ([`crate::kernels::gemm::product_then_update`]): the input error
//! Δₖ·Wₖ is computed first, then ∇Wₖ is completed tile by tile and θ, v updated from the
//! registers, so that ∇Wₖ is never stored and θ is read once.

use super::HandPass;
use candle_core::{CpuStorage, InplaceOp1, Layout, Storage, Tensor};

use crate::error::{Error, Result};
use crate::kernels::gemm::{
    matmul, product, product_then_update, updates_inline, Mat, NonZero, Options, Zeros,
};
use crate::kernels::{OpenUpdate, TensorwiseStep};
use crate::likelihood::{gaussian_error, Targets};
use crate::model::{Activation, Network};
use crate::pool;

/// Layers with at least this many neurons split their forward product by neuron.
const SPLIT_BY_NEURON: usize = 256;

/// Weight tensors at least this large are updated inside their gradient's product
/// ([`OpenUpdate::inline`](crate::kernels::OpenUpdate::inline)). Measured (`bnn bench train`, batch 100, interleaved):
/// 784-400-400-10, whose W₁ and W₂ (314k, 160k elements) with their v and ∇ do not fit a
/// core's L2, runs 5% faster that way (664 → 699 steps/s; the W₁ region 510 → 457 µs),
/// while 784-100-10's W₁ (78k) is 3–5% faster through the separate pass over cached data.
const INLINE_MIN_WEIGHTS: usize = 100_000;

/// Input density (fraction of non-zero inputs) above which the first layer's products run
/// dense: MNIST is 0.19, Fashion-MNIST 0.50 (measured no faster or slower either way),
/// standardised inputs ≈ 1.
const MAX_SKIPPING_DENSITY: f64 = 0.6;

/// Loss statistics of one minibatch.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BatchLoss {
    /// Mean negative log-likelihood per example.
    pub nll: f64,
    /// Examples whose arg-max logit is the label (classification; 0 for regression).
    pub correct: usize,
    /// Σ(f − y)² over the minibatch, in standardised target units (regression; 0 for
    /// classification).
    pub sq_error: f64,
}

/// Buffers for the forward and backward pass of one MLP, reused across steps.
#[derive(Debug)]
pub struct MlpBackprop {
    /// Layer widths, input first, classes last.
    widths: Vec<usize>,
    activation: Activation,
    /// `acts[k]`: output of layer k+1 (after the activation; logits for the last layer).
    acts: Vec<Vec<f32>>,
    /// The minibatch's non-zero inputs: the first layer's forward product and weight
    /// gradient skip blank pixels.
    input_nonzero: NonZero,
    /// Whether `input_nonzero` was handed out ([`MlpBackprop::next_input_map`]) to be
    /// filled with the next forward pass's input: that pass then takes it as it is.
    input_recorded: bool,
    /// Whether this minibatch has zeros enough for skipping them to pay.
    sparse_input: bool,
    /// Output errors of the current and the previous layer.
    delta: Vec<f32>,
    delta_prev: Vec<f32>,
    /// ∇Ũ/T per parameter tensor, in the model's order; overwritten by each step. Allocated
    /// by the first backward pass (a forward-only use, prediction, never needs them).
    /// A weight tensor updated inside its product ([`OpenUpdate::inline`](crate::kernels::OpenUpdate::inline)) keeps stale
    /// values here.
    grads: Vec<Tensor>,
    /// Per-row Σv² of an inline update.
    row_sums: Vec<f64>,
    /// Whether large weight tensors are updated inside their gradient's product where the
    /// sampler can (default), rather than in a pass of their own.
    pub inline_update: bool,
    /// Weight tensors updated inside their gradient's product so far.
    pub inline_updates: u64,
}

/// Read access to a CPU f32 tensor's contiguous data, holding its storage lock.
pub(super) struct CpuView<'a> {
    guard: candle_core::StorageRef<'a>,
    range: (usize, usize),
}

impl<'a> CpuView<'a> {
    pub(super) fn new(t: &'a Tensor, what: &str) -> Result<Self> {
        let (guard, layout) = t.storage_and_layout();
        let range = layout.contiguous_offsets().ok_or_else(|| {
            Error::Config(format!("{what}: the CPU backward needs contiguous tensors"))
        })?;
        if !matches!(&*guard, Storage::Cpu(CpuStorage::F32(_))) {
            return Err(Error::Config(format!(
                "{what}: the hand-written backward runs on f32 CPU tensors only \
                 (use --backward autograd on other devices)"
            )));
        }
        Ok(CpuView { guard, range })
    }

    pub(super) fn slice(&self) -> &[f32] {
        match &*self.guard {
            Storage::Cpu(CpuStorage::F32(v)) => &v[self.range.0..self.range.1],
            _ => unreachable!("checked in CpuView::new"),
        }
    }
}

/// The input's zero map for layer `k`'s products, where skipping zeros pays (the first
/// layer on sparse inputs). A function of the two fields, not a method, so that it can be
/// used while the activations are borrowed mutably.
fn input_zeros(nonzero: &NonZero, sparse: bool, k: usize) -> Option<&NonZero> {
    (k == 0 && sparse).then_some(nonzero)
}

/// Parameter tensor `t` of a pass, while its read lock is held.
pub(super) fn held<'a>(views: &'a [Option<CpuView<'_>>], t: usize) -> Result<&'a [f32]> {
    views
        .get(t)
        .and_then(Option::as_ref)
        .map(CpuView::slice)
        .ok_or_else(|| Error::Config(format!("internal: parameter tensor {t} is not held")))
}

/// Runs `f` on the f32 data of `t` (contiguous, CPU), mutably: how the backward writes
/// gradients and updates parameters in place without a copy, through candle's in-place
/// op, the only sound way to write a tensor's storage (it holds the storage's write lock).
pub(super) fn with_data_mut<R>(t: &Tensor, f: impl FnOnce(&mut [f32]) -> R) -> Result<R> {
    struct Once<F, R>(std::cell::RefCell<(Option<F>, Option<R>)>);
    impl<F: FnOnce(&mut [f32]) -> R, R> InplaceOp1 for Once<F, R> {
        fn name(&self) -> &'static str {
            "bnn-mlp-write"
        }
        fn cpu_fwd(&self, storage: &mut CpuStorage, layout: &Layout) -> candle_core::Result<()> {
            let CpuStorage::F32(v) = storage else {
                candle_core::bail!("bnn-mlp-write: the MLP's tensors are f32");
            };
            let Some((a, b)) = layout.contiguous_offsets() else {
                candle_core::bail!("bnn-mlp-write: the MLP's tensors are contiguous");
            };
            let mut cell = self.0.borrow_mut();
            if let Some(f) = cell.0.take() {
                cell.1 = Some(f(&mut v[a..b]));
            }
            Ok(())
        }
    }
    let op = Once(std::cell::RefCell::new((Some(f), None)));
    t.inplace_op1(&op)?;
    op.0.into_inner()
        .1
        .ok_or_else(|| Error::Config("internal: in-place op did not run".into()))
}

/// Whether `model`'s parameters from tensor `first` on are exactly the fully connected
/// layers of `widths` (input first): a weight (out × in) and a bias (out) per layer.
pub(super) fn fc_shapes_match(model: &Network, widths: &[usize], first: usize) -> bool {
    let layers = widths.len().saturating_sub(1);
    model.params.len() == first + 2 * layers
        && (0..layers).all(|k| {
            let (i, o) = (widths[k], widths[k + 1]);
            model.params[first + 2 * k].var.dims() == [o, i]
                && model.params[first + 2 * k + 1].var.dims() == [o]
        })
}

/// Read-locks every parameter of `model` for a pass (options, so that a layer's locks can
/// be released before its parameters are written).
pub(super) fn lock_params(model: &Network) -> Result<Vec<Option<CpuView<'_>>>> {
    model
        .params
        .iter()
        .map(|p| Ok(Some(CpuView::new(p.var.as_tensor(), &p.name)?)))
        .collect()
}

/// Checks one prior precision per parameter tensor, and allocates the gradient tensors on
/// the first backward pass.
pub(super) fn prepare_grads(
    model: &Network,
    prior_precision: &[f64],
    grads: &mut Vec<Tensor>,
) -> Result<()> {
    if prior_precision.len() != model.params.len() {
        return Err(Error::Config(format!(
            "{} prior precisions for {} parameter tensors",
            prior_precision.len(),
            model.params.len()
        )));
    }
    if grads.is_empty() {
        *grads = model
            .params
            .iter()
            .map(|p| Ok(Tensor::zeros(p.var.shape(), p.var.dtype(), p.var.device())?))
            .collect::<Result<Vec<_>>>()?;
    }
    Ok(())
}

/// One fully connected layer's forward: out (rows × fan_out) = act(input·Wᵀ + b), with W
/// (fan_out × fan_in) row-major; `zeros` of the input, if known.
pub(super) fn dense_forward(
    out: &mut [f32],
    input: &[f32],
    w: &[f32],
    bias: &[f32],
    rows: usize,
    act: Option<Activation>,
    zeros: Zeros<'_>,
) {
    let fan_out = bias.len();
    let fan_in = w.len() / fan_out.max(1);
    // Many neurons: split by output neuron (each thread packs and multiplies its half of
    // W). Few: halves of whole vectors would be uneven (100 → 64 + 36), so the product
    // splits the batch instead. B = Wᵀ is read straight from W, packed panel by panel
    // inside the product (no transposed copy of W).
    let opts = Options {
        split_columns: fan_out >= SPLIT_BY_NEURON,
        zeros,
        ..Options::default()
    };
    let (x, wt) = (Mat::rows(input, fan_in), Mat::transposed(w, fan_in));
    let out = &mut out[..rows * fan_out];
    product(rows, fan_out, fan_in, out, x, wt, opts);
    pool::halves(out, fan_out, out.len(), |half, _| {
        bias_activation(half, bias, act)
    });
}

/// ∇b = λ_b·b + Σ_rows Δ for a layer's error Δ (rows × b.len()); large ones in two halves of
/// the columns.
pub(super) fn bias_gradient(g: &mut [f32], b: &[f32], lb: f32, delta: &[f32]) {
    let fan_out = b.len();
    let sum_columns = |half: &mut [f32], at: usize| {
        let n = half.len();
        half.iter_mut()
            .zip(&b[at..at + n])
            .for_each(|(g, &b)| *g = lb * b);
        for row in delta.chunks_exact(fan_out) {
            half.iter_mut()
                .zip(&row[at..at + n])
                .for_each(|(g, &d)| *g += d);
        }
    };
    pool::halves(g, 16, delta.len(), sum_columns);
}

/// Adds the bias to every row of `z` (rows × width) and applies the activation.
pub(super) fn bias_activation(z: &mut [f32], bias: &[f32], act: Option<Activation>) {
    for row in z.chunks_exact_mut(bias.len()) {
        match act {
            None => row.iter_mut().zip(bias).for_each(|(v, b)| *v += b),
            Some(Activation::Relu) => row
                .iter_mut()
                .zip(bias)
                .for_each(|(v, b)| *v = (*v + b).max(0.0)),
            Some(Activation::Sigmoid) => row
                .iter_mut()
                .zip(bias)
                .for_each(|(v, b)| *v = 1.0 / (1.0 + (-(*v + b)).exp())),
            Some(Activation::Tanh) => row
                .iter_mut()
                .zip(bias)
                .for_each(|(v, b)| *v = (*v + b).tanh()),
            Some(Activation::Swish) => row.iter_mut().zip(bias).for_each(|(v, b)| {
                let z = *v + b;
                *v = z / (1.0 + (-z).exp())
            }),
        }
    }
}

/// Multiplies the back-propagated error by the activation's derivative, written in terms
/// of the activation's output a: relu′ = [a > 0], sigmoid′ = a(1 − a), tanh′ = 1 − a².
pub(super) fn activation_backward(delta: &mut [f32], a: &[f32], act: Activation) {
    match act {
        // A select rather than a branch, so that it vectorises.
        Activation::Relu => delta
            .iter_mut()
            .zip(a)
            .for_each(|(d, &a)| *d = if a > 0.0 { *d } else { 0.0 }),
        Activation::Sigmoid => delta
            .iter_mut()
            .zip(a)
            .for_each(|(d, &a)| *d *= a * (1.0 - a)),
        Activation::Tanh => delta
            .iter_mut()
            .zip(a)
            .for_each(|(d, &a)| *d *= 1.0 - a * a),
        // swish′ is not a function of swish's output: refused by `MlpBackprop::new`.
        Activation::Swish => unreachable!("the MLP pass refuses swish"),
    }
}

/// Softmax cross-entropy over rows of `logits`: returns the summed NLL and the number of
/// correct arg-maxes, and writes `scale·(softmax − onehot)` into `delta`.
pub(super) fn softmax_xent(
    logits: &[f32],
    labels: &[u32],
    classes: usize,
    scale: f32,
    delta: &mut [f32],
) -> Result<(f64, usize)> {
    let mut nll = 0f64;
    let mut correct = 0;
    for ((z, d), &y) in logits
        .chunks_exact(classes)
        .zip(delta.chunks_exact_mut(classes))
        .zip(labels)
    {
        let y = y as usize;
        if y >= classes {
            return Err(Error::Config(format!(
                "label {y} out of range for {classes} classes"
            )));
        }
        let (mut arg, mut max) = (0, f32::NEG_INFINITY);
        for (j, &v) in z.iter().enumerate() {
            if v > max {
                (arg, max) = (j, v);
            }
        }
        let mut sum = 0f32;
        for (dj, &v) in d.iter_mut().zip(z) {
            *dj = (v - max).exp();
            sum += *dj;
        }
        nll += (max + sum.ln() - z[y]) as f64;
        let inv = scale / sum;
        d.iter_mut().for_each(|dj| *dj *= inv);
        d[y] -= scale;
        correct += usize::from(arg == y);
    }
    Ok((nll, correct))
}

impl MlpBackprop {
    /// Buffers for `model` at minibatches of up to `batch` rows (more rows grow them once).
    pub fn new(model: &Network, batch: usize) -> Result<Self> {
        if !model.convs.is_empty() {
            return Err(Error::Config(
                "internal: the MLP pass was given a CNN (use backprop::Backprop)".into(),
            ));
        }
        if model.spec.activation == Activation::Swish {
            return Err(Error::Config(
                "an MLP's activation is relu, sigmoid or tanh".into(),
            ));
        }
        let mut widths = vec![model.input_dim];
        widths.extend(&model.spec.hidden);
        widths.push(model.num_classes);
        let max_width = widths.iter().copied().max().unwrap_or(0);
        Ok(MlpBackprop {
            acts: widths[1..].iter().map(|w| vec![0.0; batch * w]).collect(),
            delta: vec![0.0; batch * max_width],
            delta_prev: vec![0.0; batch * max_width],
            activation: model.spec.activation,
            input_nonzero: NonZero::default(),
            input_recorded: false,
            sparse_input: false,
            widths,
            grads: Vec::new(),
            row_sums: Vec::new(),
            inline_update: true,
            inline_updates: 0,
        })
    }

    fn check(&self, model: &Network, x: &[f32], rows: usize) -> Result<()> {
        if !fc_shapes_match(model, &self.widths, 0) {
            return Err(Error::Config(
                "the backward buffers were built for another model".into(),
            ));
        }
        if x.len() != rows * self.widths[0] {
            return Err(Error::Config(format!(
                "a minibatch of {rows} rows needs {} inputs, got {}",
                rows * self.widths[0],
                x.len()
            )));
        }
        Ok(())
    }

    /// Checks `model` and `x` against the buffers, grows them to `rows` if needed, and
    /// read-locks the parameters for the pass (options, so that a layer's locks can be
    /// released before its parameters are written).
    fn prepare<'m>(
        &mut self,
        model: &'m Network,
        x: &[f32],
        rows: usize,
    ) -> Result<Vec<Option<CpuView<'m>>>> {
        self.check(model, x, rows)?;
        self.reserve(rows);
        lock_params(model)
    }

    /// Grows the activation and error buffers to `rows` (once; no-op afterwards).
    fn reserve(&mut self, rows: usize) {
        for (a, w) in self.acts.iter_mut().zip(&self.widths[1..]) {
            if a.len() < rows * w {
                a.resize(rows * w, 0.0);
            }
        }
        let max_width = self.widths.iter().copied().max().unwrap_or(0);
        for d in [&mut self.delta, &mut self.delta_prev] {
            if d.len() < rows * max_width {
                d.resize(rows * max_width, 0.0);
            }
        }
    }

    fn forward_with(
        &mut self,
        views: &[Option<CpuView<'_>>],
        x: &[f32],
        rows: usize,
    ) -> Result<()> {
        let layers = self.widths.len() - 1;
        // The map the minibatch's gather recorded, where it did (a map of another shape
        // cannot be this input's).
        let recorded = std::mem::take(&mut self.input_recorded)
            && self.input_nonzero.shape() == (rows, self.widths[0]);
        if !recorded {
            self.input_nonzero.record(x, rows, self.widths[0]);
        }
        // Standardised inputs have (almost) no zeros: the lists would be full.
        self.sparse_input = self.input_nonzero.density() <= MAX_SKIPPING_DENSITY;
        for k in 0..layers {
            let (before, after) = self.acts.split_at_mut(k);
            let input = if k == 0 { x } else { &before[k - 1][..] };
            let zeros = input_zeros(&self.input_nonzero, self.sparse_input, k)
                .map_or(Zeros::Unknown, Zeros::Lhs);
            let act = (k + 1 < layers).then_some(self.activation);
            let (w, b) = (held(views, 2 * k)?, held(views, 2 * k + 1)?);
            dense_forward(&mut after[0], input, w, b, rows, act, zeros);
        }
        Ok(())
    }

    /// Forward and backward pass on a minibatch: the mean NLL and correct count, and
    /// ∇ = `likelihood_scale`·Σᵢ∇(−log p(yᵢ|xᵢ,θ)) + `prior_factor`·`prior_precision[t]`·θ_t
    /// written into [`MlpBackprop::grads`] for each parameter tensor t.
    pub fn loss_and_grad(
        &mut self,
        model: &Network,
        x: &[f32],
        labels: &[u32],
        likelihood_scale: f64,
        prior_precision: &[f64],
        prior_factor: f64,
    ) -> Result<BatchLoss> {
        self.loss_and_grad_then(
            model,
            x,
            labels,
            likelihood_scale,
            prior_precision,
            prior_factor,
            None,
        )
    }

    /// Layer `k`'s part of the backward pass: ∇W and ∇b (the prior's term added as they
    /// are stored), the input error for the layer below, and the sampler's updates of the
    /// layer's tensors as soon as nothing reads them any more (W inside its gradient's
    /// product where the sampler offers it).
    fn backward_layer(
        &mut self,
        k: usize,
        pass: &PassInputs<'_>,
        views: &mut [Option<CpuView<'_>>],
        step: &mut Option<OpenUpdate<'_, dyn TensorwiseStep + '_>>,
    ) -> Result<()> {
        let (model, x, rows) = (pass.model, pass.x, pass.rows);
        let (fan_in, fan_out) = (self.widths[k], self.widths[k + 1]);
        // The layer's input: the data, or the activations of the layer below.
        let below = if k == 0 { x } else { &self.acts[k - 1] };
        let input = &below[..rows * fan_in];
        let delta = &self.delta[..rows * fan_out];
        if let (Some(step), Some(fpc)) = (step.as_mut(), pass.noise_fpc) {
            report_gradient_noise(step, k, delta, input, rows, fpc)?;
        }
        let prior = |t: usize| (pass.prior_factor * pass.prior_precision[t]) as f32;
        let (lw, lb) = (prior(2 * k), prior(2 * k + 1));
        let zeros = input_zeros(&self.input_nonzero, self.sparse_input, k)
            .map_or(Zeros::Unknown, Zeros::Rhs);
        let (delta_t, input_mat) = (Mat::transposed(delta, fan_out), Mat::rows(input, fan_in));
        // The sampler may update W inside its gradient's product; then everything that
        // reads W (the input error) runs first.
        let inline = match step.as_mut() {
            Some(step) if self.inline_update && inline_pays(rows, fan_in, fan_out) => {
                step.inline(2 * k)?
            }
            _ => None,
        };
        let updated_inline = inline.is_some();
        if !updated_inline {
            // ∇W = Δᵀ·A + λW, the prior term added as the product is stored.
            let w = held(views, 2 * k)?;
            let opts = Options {
                addend: Some((w, lw)),
                zeros,
                ..Options::default()
            };
            with_data_mut(&self.grads[2 * k], |g| {
                product(fan_out, fan_in, rows, g, delta_t, input_mat, opts)
            })?;
        }
        let b = held(views, 2 * k + 1)?;
        with_data_mut(&self.grads[2 * k + 1], |g| bias_gradient(g, b, lb, delta))?;
        if k > 0 {
            let prev = &mut self.delta_prev[..rows * fan_in];
            let w = held(views, 2 * k)?;
            input_error(prev, delta, w, input, fan_out, self.activation);
        }
        if let Some(update) = inline {
            // Nothing reads W any more: release it, and run its gradient's product with
            // the update in the epilogue (the gradient tensor holds partial sums only).
            views[2 * k] = None;
            let theta = model.params[2 * k].var.as_detached_tensor();
            let row_sums = &mut self.row_sums;
            let sums = with_data_mut(&self.grads[2 * k], |scratch| {
                with_data_mut(&theta, |theta| {
                    product_then_update(
                        fan_out, fan_in, rows, scratch, delta_t, input_mat, zeros, theta, lw,
                        update, row_sums,
                    )
                })
            })??;
            if let Some(step) = step.as_mut() {
                step.updated(2 * k, sums)?;
                self.inline_updates += 1;
            }
        }
        if k > 0 {
            std::mem::swap(&mut self.delta, &mut self.delta_prev);
        }
        if let Some(step) = step.as_mut() {
            // Nothing below reads this layer's parameters: release them, then update
            // them from their final gradients.
            let first = if updated_inline { 2 * k + 1 } else { 2 * k };
            hand_over(step, views, model, &self.grads, first..2 * k + 2)?;
        }
        Ok(())
    }
}

/// Releases the views of tensors `ts`, which nothing reads any more, and hands them to
/// the sampler with their final gradients: every hand-written pass's step, as soon as a
/// layer is done.
pub(super) fn hand_over(
    step: &mut OpenUpdate<'_, dyn TensorwiseStep + '_>,
    views: &mut [Option<CpuView<'_>>],
    model: &Network,
    grads: &[Tensor],
    ts: impl IntoIterator<Item = usize>,
) -> Result<()> {
    for t in ts {
        views[t] = None;
        step.tensor(t, &model.params[t].var, &grads[t])?;
    }
    Ok(())
}

/// Whether updating a `fan_out` × `fan_in` weight inside its gradient's product pays:
/// rows of whole Philox blocks, a minibatch, and enough weights
/// ([`INLINE_MIN_WEIGHTS`]).
fn inline_pays(rows: usize, fan_in: usize, fan_out: usize) -> bool {
    rows > 0 && updates_inline(fan_in) && fan_in * fan_out >= INLINE_MIN_WEIGHTS
}

/// Gives the sampler the gradient-noise traces of layer `k`'s W and b in this minibatch
/// (from its per-example gradients, `fpc` the finite-population correction) where it
/// asks for them.
fn report_gradient_noise(
    step: &mut OpenUpdate<'_, dyn TensorwiseStep + '_>,
    k: usize,
    delta: &[f32],
    input: &[f32],
    rows: usize,
    fpc: f64,
) -> Result<()> {
    if step.wants_gradient_noise() {
        let (weights, bias) = gradient_noise(delta, input, rows, fpc);
        step.gradient_noise(2 * k, weights)?;
        step.gradient_noise(2 * k + 1, bias)?;
    }
    Ok(())
}

/// The error of a layer's input, `prev` = (Δ·W) ⊙ f'(input) for its `fan_out` × fan-in
/// weights `w`, the activation `act`'s derivative taken at the input it was given.
fn input_error(
    prev: &mut [f32],
    delta: &[f32],
    w: &[f32],
    input: &[f32],
    fan_out: usize,
    act: Activation,
) {
    let fan_in = w.len() / fan_out.max(1);
    let rows = prev.len() / fan_in.max(1);
    let (d, w) = (Mat::rows(delta, fan_out), Mat::rows(w, fan_in));
    matmul(rows, fan_in, fan_out, prev, false, d, w);
    pool::halves(prev, 1, prev.len(), |half, at| {
        activation_backward(half, &input[at..at + half.len()], act)
    });
}

impl HandPass for MlpBackprop {
    /// The gradients of the last [`MlpBackprop::loss_and_grad`], in the model's order
    /// (empty before the first). They are overwritten in place by the next call.
    fn grads(&self) -> &[Tensor] {
        &self.grads
    }

    /// Forward pass on `rows` inputs `x` (row-major); returns the logits (rows × classes).
    fn forward(&mut self, model: &Network, x: &[f32], rows: usize) -> Result<&[f32]> {
        let views = self.prepare(model, x, rows)?;
        self.forward_with(&views, x, rows)?;
        let classes = *self.widths.last().unwrap_or(&0);
        Ok(&self.acts[self.acts.len() - 1][..rows * classes])
    }

    /// The zero map of the first layer's input, for the gather of the next minibatch to
    /// record as it writes the rows ([`crate::data::Split::gather_recording`]): the next
    /// forward pass takes it as the map of its input instead of reading the input again.
    /// The caller fills it with exactly that input.
    fn next_input_map(&mut self) -> Option<&mut NonZero> {
        self.input_recorded = true;
        Some(&mut self.input_nonzero)
    }

    fn set_inline_update(&mut self, on: bool) {
        self.inline_update = on;
    }

    fn inline_updates(&self) -> u64 {
        self.inline_updates
    }

    fn loss_and_grad_then(
        &mut self,
        model: &Network,
        x: &[f32],
        labels: &[u32],
        likelihood_scale: f64,
        prior_precision: &[f64],
        prior_factor: f64,
        step: Option<&mut dyn TensorwiseStep>,
    ) -> Result<BatchLoss> {
        let prior = (prior_precision, prior_factor);
        self.targets_then(
            model,
            x,
            Targets::Classes(labels),
            likelihood_scale,
            prior,
            step,
        )
    }

    /// [`MlpBackprop::loss_and_grad_then`] for any task: `targets` are class indices
    /// (softmax cross-entropy) or real values (Gaussian NLL at their noise precision τ,
    /// Δ = s·τ·(f − y), one output); `prior` is (λ per tensor, factor).
    fn targets_then(
        &mut self,
        model: &Network,
        x: &[f32],
        targets: Targets<'_>,
        likelihood_scale: f64,
        (prior_precision, prior_factor): (&[f64], f64),
        step: Option<&mut dyn TensorwiseStep>,
    ) -> Result<BatchLoss> {
        let rows = targets.len();
        prepare_grads(model, prior_precision, &mut self.grads)?;
        let mut views = self.prepare(model, x, rows)?;
        self.forward_with(&views, x, rows)?;

        let layers = self.widths.len() - 1;
        let outputs = self.widths[layers];
        let out = &self.acts[layers - 1][..rows * outputs];
        let delta = &mut self.delta[..rows * outputs];
        let scale = likelihood_scale as f32;
        let (nll, correct, sq_error) = match targets {
            Targets::Classes(labels) => {
                let (nll, correct) = softmax_xent(out, labels, outputs, scale, delta)?;
                (nll, correct, 0.0)
            }
            Targets::Values { y, precision } => {
                let (nll, sse) = gaussian_error(out, y, precision, scale, delta)?;
                (nll, 0, sse)
            }
        };
        let mut step = match step.filter(|_| nll.is_finite()) {
            Some(s) => Some(crate::kernels::begin(s)?),
            None => None,
        };

        // N = s·B·T from the likelihood's scale s = N/(B·T) and the prior's factor 1/T.
        let n = likelihood_scale * rows as f64 / prior_factor;
        let pass = PassInputs {
            model,
            x,
            rows,
            prior_precision,
            prior_factor,
            noise_fpc: Some(((n - rows as f64) / (n - 1.0).max(1.0)).max(0.0)),
        };
        for k in (0..layers).rev() {
            self.backward_layer(k, &pass, &mut views, &mut step)?;
        }
        if let Some(step) = step {
            step.finish()?;
        }
        Ok(BatchLoss {
            nll: nll / rows.max(1) as f64,
            correct,
            sq_error,
        })
    }
}

/// What every layer of one backward pass reads: the model, the minibatch, its size, and
/// the prior's precisions with their factor.
#[derive(Clone, Copy)]
pub(super) struct PassInputs<'a> {
    pub model: &'a Network,
    pub x: &'a [f32],
    pub rows: usize,
    pub prior_precision: &'a [f64],
    pub prior_factor: f64,
    /// The finite-population factor (N − B)/(N − 1) of a minibatch's gradient noise, where
    /// the pass reports it to the sampler ([`gradient_noise`]); None where it does not.
    pub noise_fpc: Option<f64>,
}

/// tr V̂ of a layer's weight and bias gradients from the minibatch's per-example
/// contributions c_i (Chen et al. 2014 §3.2's empirical Fisher): the weight gradient is
/// Σ_i δ_i x_iᵀ, so ‖c_i‖² = ‖δ_i‖²·‖x_i‖² and the bias's ‖c_i‖² = ‖δ_i‖² (δ carries
/// the likelihood's scale N/(B·T)). Var(Σ_i c_i) ≈ fpc · Σ_i ‖c_i‖²: B draws, each
/// contributing its variance; the squared mean left in Σ‖c_i‖² is ‖∇‖²/B, at equilibrium
/// (the data's gradient balancing the prior's) a fraction 1/B of the noise or less.
pub(super) fn gradient_noise(delta: &[f32], input: &[f32], rows: usize, fpc: f64) -> (f64, f64) {
    let (fan_out, fan_in) = (delta.len() / rows.max(1), input.len() / rows.max(1));
    let (mut weights, mut bias) = (0f64, 0f64);
    for (d, x) in delta.chunks_exact(fan_out).zip(input.chunks_exact(fan_in)) {
        let dd: f64 = d.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
        let xx: f64 = x.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
        weights += dd * xx;
        bias += dd;
    }
    (fpc * weights, fpc * bias)
}

impl PassInputs<'_> {
    /// The prior's factor times λ of parameter tensor `t`: ∇ of its term.
    pub fn prior(&self, t: usize) -> f32 {
        (self.prior_factor * self.prior_precision[t]) as f32
    }
}
