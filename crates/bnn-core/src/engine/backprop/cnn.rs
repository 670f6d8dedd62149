//! The CNN's forward and backward pass written by hand for the CPU (the convolutional
//! counterpart of [`super::mlp`]): candle's CPU autograd takes 45 ms forward and 223 ms
//! backward for a LeNet-style network at batch 64, PyTorch's whole SGHMC step about 4 ms.
//!
//! Layout: a convolution's input and output are kept channel-major, (C × B × H × W), so
//! that a convolution over the whole minibatch is one matrix product with the im2col
//! matrix (C_in·k² × B·H_o·W_o):
//!
//! - forward: Z = W·cols (C_out × B·H_o·W_o), then bias, 2×2 max-pool and activation in
//!   one pass (the activation is monotone, so act(max z + b) = max act(z + b): the pool
//!   runs on Z and the activation on a quarter of the values);
//! - backward: the pooled error times act′ goes to each window's arg-max (recomputed from
//!   Z, which it overwrites in place: no arg-max buffer), ∇W = ΔZ·colsᵀ + λW, ∇b = Σ ΔZ +
//!   λb, and, except for the first convolution (no input gradient), the input error
//!   col2im(Wᵀ·ΔZ), computed into the im2col buffer once ∇W no longer needs it;
//! - the fully connected head as in [`super::mlp`], whose first layer's input error goes
//!   back to the last convolution's pooled output.
//!
//! The products are [`crate::kernels::gemm::product`]; im2col, col2im and the pool passes split
//! their channels (or rows) over the step's two threads. Buffers are allocated once and
//! grow only when a larger minibatch comes.

use super::HandPass;
use candle_core::Tensor;

use super::mlp::{
    activation_backward, bias_gradient, dense_forward, fc_shapes_match, held, lock_params,
    prepare_grads, softmax_xent, with_data_mut, BatchLoss, CpuView, PassInputs,
};
use crate::error::{Error, Result};
use crate::kernels::gemm::{product, Mat, Options, Zeros};
use crate::kernels::TensorwiseStep;
use crate::model::{Activation, ConvShape, Network};
use crate::pool;

/// Buffers for the forward and backward pass of one CNN, reused across steps.
#[derive(Debug)]
pub struct CnnBackprop {
    convs: Vec<ConvShape>,
    /// Widths of the fully connected layers, flattened features first, classes last.
    widths: Vec<usize>,
    activation: Activation,
    /// Rows the buffers hold.
    capacity: usize,
    /// Per convolution: the im2col matrix (C_in·k² × B·H_o²); the input error's columns
    /// in the backward.
    cols: Vec<Vec<f32>>,
    /// Per convolution: Z before bias and pooling (C_out × B·H_o²); ΔZ in the backward.
    conv_out: Vec<Vec<f32>>,
    /// Per convolution: the pooled activation (C_out × B × H_p²) and its error.
    pooled: Vec<Vec<f32>>,
    pooled_err: Vec<Vec<f32>>,
    /// The last pooled output flattened per example (B × C·H_p², PyTorch's order) and its
    /// error.
    features: Vec<f32>,
    features_err: Vec<f32>,
    /// Outputs of the fully connected layers (after the activation; logits last).
    acts: Vec<Vec<f32>>,
    delta: Vec<f32>,
    delta_prev: Vec<f32>,
    /// ∇Ũ/T per parameter tensor, in the model's order (allocated by the first backward).
    grads: Vec<Tensor>,
}

/// act(v) for the pooled output.
fn activate(v: f32, act: Activation) -> f32 {
    match act {
        Activation::Relu => v.max(0.0),
        Activation::Sigmoid => 1.0 / (1.0 + (-v).exp()),
        Activation::Tanh => v.tanh(),
        // Not monotone, so not after the pool: refused by `CnnBackprop::new`.
        Activation::Swish => unreachable!("the CNN pass refuses swish"),
    }
}

/// The output columns x of one row of patches whose input column x + j − p falls inside
/// an input of side `h`: [lo, hi) (empty when none does). With p = 0, all of 0..o.
fn inside(o: usize, h: usize, j: usize, p: usize) -> (usize, usize) {
    let lo = p.saturating_sub(j).min(o);
    let hi = (h + p).saturating_sub(j).min(o);
    (lo, hi.max(lo))
}

/// cols[(c·k + i)·k + j][(b·H_o + y)·H_o + x] = a[c][b][y + i − p][x + j − p], zero where
/// that falls in the padding: the patches of a (C_in × B × H × H) input as the columns of
/// a matrix.
fn im2col(a: &[f32], s: &ConvShape, rows: usize, cols: &mut [f32]) {
    let (h, o, k, p) = (s.in_side, s.conv_side, s.kernel, s.pad);
    let n = rows * o * o;
    let cols = &mut cols[..s.patch() * n];
    let work = cols.len();
    pool::halves(cols, n, work, |part, at| {
        for (q, row) in part.chunks_exact_mut(n).enumerate() {
            let r = at / n + q;
            let (c, i, j) = (r / (k * k), r / k % k, r % k);
            let (lo, hi) = inside(o, h, j, p);
            for (b, out) in row.chunks_exact_mut(o * o).enumerate() {
                let plane = &a[(c * rows + b) * h * h..(c * rows + b + 1) * h * h];
                for (y, line) in out.chunks_exact_mut(o).enumerate() {
                    match (y + i).checked_sub(p).filter(|&sy| sy < h && lo < hi) {
                        Some(sy) => {
                            line[..lo].fill(0.0);
                            line[hi..].fill(0.0);
                            let from = sy * h + lo + j - p;
                            line[lo..hi].copy_from_slice(&plane[from..from + hi - lo]);
                        }
                        None => line.fill(0.0),
                    }
                }
            }
        }
    });
}

/// The adjoint of [`im2col`]: da[c][b][y + i − p][x + j − p] = Σ dcols[(c·k + i)·k +
/// j][(b·H_o + y)·H_o + x] over the patches that contain the pixel (the padding's share
/// is dropped).
fn col2im(dcols: &[f32], s: &ConvShape, rows: usize, da: &mut [f32]) {
    let (h, o, k, p) = (s.in_side, s.conv_side, s.kernel, s.pad);
    let n = rows * o * o;
    let plane = rows * h * h;
    let da = &mut da[..s.in_channels * plane];
    pool::halves(da, plane, s.patch() * n, |part, at| {
        part.fill(0.0);
        for (q, channel) in part.chunks_exact_mut(plane).enumerate() {
            let c = at / plane + q;
            for (i, j) in (0..k).flat_map(|i| (0..k).map(move |j| (i, j))) {
                let (lo, hi) = inside(o, h, j, p);
                let row = &dcols[((c * k + i) * k + j) * n..][..n];
                for (b, patch) in row.chunks_exact(o * o).enumerate() {
                    let image = &mut channel[b * h * h..(b + 1) * h * h];
                    for (y, line) in patch.chunks_exact(o).enumerate() {
                        let Some(sy) = (y + i).checked_sub(p).filter(|&sy| sy < h && lo < hi)
                        else {
                            continue;
                        };
                        let from = sy * h + lo + j - p;
                        let dst = &mut image[from..from + hi - lo];
                        dst.iter_mut()
                            .zip(&line[lo..hi])
                            .for_each(|(d, &g)| *d += g);
                    }
                }
            }
        }
    });
}

/// dst[j][i] = src[i][j] for blocks of `inner` elements, src (`outer` × `middle` blocks),
/// dst (`middle` × `outer`): between the convolutions' (C × B × H_p²) layout and the
/// fully connected layers' (B × C·H_p²), both ways.
fn swap_outer(src: &[f32], dst: &mut [f32], outer: usize, middle: usize, inner: usize) {
    let dst = &mut dst[..outer * middle * inner];
    for (j, row) in dst.chunks_exact_mut(outer * inner).enumerate() {
        for (i, block) in row.chunks_exact_mut(inner).enumerate() {
            let at = (i * middle + j) * inner;
            block.copy_from_slice(&src[at..at + inner]);
        }
    }
}

/// Offset of the first input of pool window (py, px) in an (o × o) plane.
fn window(o: usize, py: usize, px: usize) -> usize {
    2 * py * o + 2 * px
}

/// The first arg-max of a 2×2 window at `i0` of a plane with rows `o` apart.
fn window_argmax(z: &[f32], i0: usize, o: usize) -> usize {
    let mut best = i0;
    for i in [i0 + 1, i0 + o, i0 + o + 1] {
        if z[i] > z[best] {
            best = i;
        }
    }
    best
}

/// pooled[c][b] = act(max-pool(Z[c][b]) + bias[c]).
fn pool_forward(
    z: &[f32],
    bias: &[f32],
    s: &ConvShape,
    rows: usize,
    act: Activation,
    pooled: &mut [f32],
) {
    let (o, p) = (s.conv_side, s.pool_side());
    let pooled = &mut pooled[..s.out_channels * rows * p * p];
    let work = 4 * pooled.len();
    pool::halves(pooled, p * p, work, |part, at| {
        for (q, out) in part.chunks_exact_mut(p * p).enumerate() {
            let plane = at / (p * p) + q;
            let b = bias[plane / rows];
            let zp = &z[plane * o * o..(plane + 1) * o * o];
            for py in 0..p {
                for px in 0..p {
                    let i = window(o, py, px);
                    let m = zp[i].max(zp[i + 1]).max(zp[i + o]).max(zp[i + o + 1]);
                    out[py * p + px] = activate(m + b, act);
                }
            }
        }
    });
}

/// ΔZ from the error of the pooled pre-activation (`err`, already times act′): each
/// window's arg-max (from Z, which this overwrites) gets the window's error, the other
/// inputs (and the row and column an odd side leaves out of every window) zero.
fn pool_backward(z: &mut [f32], err: &[f32], s: &ConvShape, rows: usize) {
    let (o, p) = (s.conv_side, s.pool_side());
    let z = &mut z[..s.out_channels * rows * o * o];
    let work = z.len();
    pool::halves(z, o * o, work, |part, at| {
        for (q, zp) in part.chunks_exact_mut(o * o).enumerate() {
            let plane = at / (o * o) + q;
            let e = &err[plane * p * p..(plane + 1) * p * p];
            for py in 0..p {
                for px in 0..p {
                    let i = window(o, py, px);
                    let best = window_argmax(zp, i, o);
                    for j in [i, i + 1, i + o, i + o + 1] {
                        zp[j] = if j == best { e[py * p + px] } else { 0.0 };
                    }
                }
            }
            if o % 2 == 1 {
                zp[(o - 1) * o..].fill(0.0);
                zp.chunks_exact_mut(o).for_each(|line| line[o - 1] = 0.0);
            }
        }
    });
}

impl CnnBackprop {
    /// Buffers for `model` (a CNN) at minibatches of up to `batch` rows.
    pub fn new(model: &Network, batch: usize) -> Result<Self> {
        if model.convs.is_empty() {
            return Err(Error::Config(
                "internal: the CNN pass was given a network without convolutions".into(),
            ));
        }
        if model.spec.activation == Activation::Swish {
            return Err(Error::Config(
                "a CNN's activation is relu, sigmoid or tanh".into(),
            ));
        }
        let widths = model.fc_widths();
        let mut bp = CnnBackprop {
            convs: model.convs.clone(),
            acts: vec![Vec::new(); widths.len() - 1],
            widths,
            activation: model.spec.activation,
            capacity: 0,
            cols: vec![Vec::new(); model.convs.len()],
            conv_out: vec![Vec::new(); model.convs.len()],
            pooled: vec![Vec::new(); model.convs.len()],
            pooled_err: vec![Vec::new(); model.convs.len()],
            features: Vec::new(),
            features_err: Vec::new(),
            delta: Vec::new(),
            delta_prev: Vec::new(),
            grads: Vec::new(),
        };
        bp.reserve(batch);
        Ok(bp)
    }

    /// Grows the buffers to `rows` (once; no-op afterwards).
    fn reserve(&mut self, rows: usize) {
        if rows <= self.capacity {
            return;
        }
        for (l, s) in self.convs.iter().enumerate() {
            let n = rows * s.conv_side * s.conv_side;
            self.cols[l].resize(s.patch() * n, 0.0);
            self.conv_out[l].resize(s.out_channels * n, 0.0);
            self.pooled[l].resize(rows * s.pooled_len(), 0.0);
            self.pooled_err[l].resize(rows * s.pooled_len(), 0.0);
        }
        self.features.resize(rows * self.widths[0], 0.0);
        self.features_err.resize(rows * self.widths[0], 0.0);
        for (a, w) in self.acts.iter_mut().zip(&self.widths[1..]) {
            a.resize(rows * w, 0.0);
        }
        let widest = self.widths.iter().copied().max().unwrap_or(0);
        self.delta.resize(rows * widest, 0.0);
        self.delta_prev.resize(rows * widest, 0.0);
        self.capacity = rows;
    }

    fn check(&self, model: &Network, x: &[f32], rows: usize) -> Result<()> {
        let conv_ok = model.convs == self.convs
            && self.convs.iter().enumerate().all(|(l, s)| {
                model.params[2 * l].var.dims()
                    == [s.out_channels, s.in_channels, s.kernel, s.kernel]
                    && model.params[2 * l + 1].var.dims() == [s.out_channels]
            });
        if !(conv_ok && fc_shapes_match(model, &self.widths, 2 * self.convs.len())) {
            return Err(Error::Config(
                "the backward buffers were built for another model".into(),
            ));
        }
        let pixels = self.convs[0].in_side * self.convs[0].in_side;
        if x.len() != rows * pixels {
            return Err(Error::Config(format!(
                "a minibatch of {rows} images needs {} inputs, got {}",
                rows * pixels,
                x.len()
            )));
        }
        Ok(())
    }

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

    fn forward_with(
        &mut self,
        views: &[Option<CpuView<'_>>],
        x: &[f32],
        rows: usize,
    ) -> Result<()> {
        let act = self.activation;
        for (l, s) in self.convs.iter().enumerate() {
            let input = if l == 0 { x } else { &self.pooled[l - 1][..] };
            im2col(input, s, rows, &mut self.cols[l]);
            let n = rows * s.conv_side * s.conv_side;
            let (w, k) = (held(views, 2 * l)?, s.patch());
            product(
                s.out_channels,
                n,
                k,
                &mut self.conv_out[l],
                Mat::rows(w, k),
                Mat::rows(&self.cols[l], n),
                Options::default(),
            );
            let bias = held(views, 2 * l + 1)?;
            pool_forward(&self.conv_out[l], bias, s, rows, act, &mut self.pooled[l]);
        }
        // Flatten per example in PyTorch's (C, H, W) order: (C × B × H_p²) → (B × C·H_p²).
        let last = self.convs[self.convs.len() - 1];
        let (channels, pp) = (last.out_channels, last.pool_side() * last.pool_side());
        let pooled = &self.pooled[self.convs.len() - 1];
        swap_outer(pooled, &mut self.features, channels, rows, pp);
        let convs = self.convs.len();
        let layers = self.widths.len() - 1;
        for k in 0..layers {
            let (before, after) = self.acts.split_at_mut(k);
            let input = if k == 0 {
                &self.features[..]
            } else {
                &before[k - 1][..]
            };
            let act = (k + 1 < layers).then_some(self.activation);
            let (w, b) = (
                held(views, 2 * (convs + k))?,
                held(views, 2 * (convs + k) + 1)?,
            );
            dense_forward(&mut after[0], input, w, b, rows, act, Zeros::Unknown);
        }
        Ok(())
    }

    /// Dense layer `k` of the head: ∇W and ∇b (the prior's term added as they are stored)
    /// and the input error for the layer below (for the first: of the flattened features).
    /// Returns the index of its weight tensor.
    fn dense_backward(
        &mut self,
        k: usize,
        pass: &PassInputs<'_>,
        views: &[Option<CpuView<'_>>],
    ) -> Result<usize> {
        let (rows, convs) = (pass.rows, self.convs.len());
        let prior = |t: usize| pass.prior(t);
        let (fan_in, fan_out) = (self.widths[k], self.widths[k + 1]);
        let t = 2 * (convs + k);
        let input = if k == 0 {
            &self.features[..rows * fan_in]
        } else {
            &self.acts[k - 1][..rows * fan_in]
        };
        let delta = &self.delta[..rows * fan_out];
        let w = held(views, t)?;
        let opts = Options {
            addend: Some((w, prior(t))),
            ..Options::default()
        };
        with_data_mut(&self.grads[t], |g| {
            let (dt, a) = (Mat::transposed(delta, fan_out), Mat::rows(input, fan_in));
            product(fan_out, fan_in, rows, g, dt, a, opts)
        })?;
        let b = held(views, t + 1)?;
        let lb = prior(t + 1);
        with_data_mut(&self.grads[t + 1], |g| bias_gradient(g, b, lb, delta))?;
        // The input error Δ·W (for the first layer: of the flattened features).
        let prev = if k == 0 {
            &mut self.features_err[..rows * fan_in]
        } else {
            &mut self.delta_prev[..rows * fan_in]
        };
        let opts = Options::default();
        product(
            rows,
            fan_in,
            fan_out,
            prev,
            Mat::rows(delta, fan_out),
            Mat::rows(w, fan_in),
            opts,
        );
        if k > 0 {
            let act = self.activation;
            pool::halves(prev, 1, prev.len(), |half, at| {
                activation_backward(half, &input[at..at + half.len()], act)
            });
            std::mem::swap(&mut self.delta, &mut self.delta_prev);
        }
        Ok(t)
    }

    /// Convolution `l` (with its activation and pooling): ∇W and ∇b, and where `l > 0` the
    /// input error folded back onto the previous pooled output.
    fn conv_backward(
        &mut self,
        l: usize,
        pass: &PassInputs<'_>,
        views: &[Option<CpuView<'_>>],
    ) -> Result<()> {
        let rows = pass.rows;
        let prior = |t: usize| pass.prior(t);
        let s = self.convs[l];
        let n = rows * s.conv_side * s.conv_side;
        let len = rows * s.pooled_len();
        let act = self.activation;
        let err = &mut self.pooled_err[l][..len];
        let a = &self.pooled[l][..len];
        pool::halves(err, 1, len, |half, at| {
            activation_backward(half, &a[at..at + half.len()], act)
        });
        pool_backward(&mut self.conv_out[l], err, &s, rows);
        let dz = &self.conv_out[l][..s.out_channels * n];
        let (t, k) = (2 * l, s.patch());
        let w = held(views, t)?;
        let opts = Options {
            addend: Some((w, prior(t))),
            ..Options::default()
        };
        let cols = &mut self.cols[l];
        with_data_mut(&self.grads[t], |g| {
            let (lhs, rhs) = (Mat::rows(dz, n), Mat::transposed(&cols[..k * n], n));
            product(s.out_channels, k, n, g, lhs, rhs, opts)
        })?;
        let b = held(views, t + 1)?;
        let lb = prior(t + 1);
        let plane = rows * s.pool_side() * s.pool_side();
        with_data_mut(&self.grads[t + 1], |g| {
            for ((g, &b), e) in g.iter_mut().zip(b).zip(err.chunks_exact(plane)) {
                *g = lb * b + e.iter().sum::<f32>();
            }
        })?;
        if l > 0 {
            // The input error: columns Wᵀ·ΔZ (into the im2col buffer, which ∇W no
            // longer needs), folded back onto the previous pooled output.
            let lhs = Mat::transposed(w, k);
            product(
                k,
                n,
                s.out_channels,
                cols,
                lhs,
                Mat::rows(dz, n),
                Options::default(),
            );
            let (before, _) = self.pooled_err.split_at_mut(l);
            col2im(cols, &s, rows, &mut before[l - 1]);
        }
        Ok(())
    }
}

impl HandPass for CnnBackprop {
    /// The gradients of the last backward pass, in the model's order (empty before the
    /// first), overwritten in place by the next.
    fn grads(&self) -> &[Tensor] {
        &self.grads
    }

    /// Forward pass on `rows` images `x` (row-major); returns the logits (rows × classes).
    fn forward(&mut self, model: &Network, x: &[f32], rows: usize) -> Result<&[f32]> {
        let views = self.prepare(model, x, rows)?;
        self.forward_with(&views, x, rows)?;
        let classes = self.widths[self.widths.len() - 1];
        Ok(&self.acts[self.acts.len() - 1][..rows * classes])
    }

    /// Forward and backward pass on a minibatch, as [`super::mlp::MlpBackprop::loss_and_grad_then`]:
    /// the mean NLL and correct count; ∇ = `likelihood_scale`·Σᵢ∇(−log p(yᵢ|xᵢ,θ)) +
    /// `prior_factor`·`prior_precision[t]`·θ_t into [`CnnBackprop::grads`]; given a
    /// sampler's `step`, each tensor updated once its gradient is final and θ_t no longer
    /// read (last layer first). No update when the loss is not finite.
    #[allow(clippy::too_many_arguments)]
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
        let rows = labels.len();
        prepare_grads(model, prior_precision, &mut self.grads)?;
        let mut views = self.prepare(model, x, rows)?;
        self.forward_with(&views, x, rows)?;
        let convs = self.convs.len();
        let layers = self.widths.len() - 1;
        let classes = self.widths[layers];
        let (nll, correct) = softmax_xent(
            &self.acts[layers - 1][..rows * classes],
            labels,
            classes,
            likelihood_scale as f32,
            &mut self.delta[..rows * classes],
        )?;

        let mut step = match step.filter(|_| nll.is_finite()) {
            Some(s) => Some(crate::kernels::begin(s)?),
            None => None,
        };
        // Updates tensors `ts` once nothing reads them any more.
        let mut hand_over =
            |views: &mut [Option<CpuView<'_>>], grads: &[Tensor], ts: [usize; 2]| {
                let Some(step) = step.as_mut() else {
                    return Ok(());
                };
                super::mlp::hand_over(step, views, model, grads, ts)
            };

        let pass = PassInputs {
            model,
            x,
            rows,
            prior_precision,
            prior_factor,
            // (The convolutions' per-example gradients are not formed: no noise estimate.)
            noise_fpc: None,
        };
        // The fully connected head.
        for k in (0..layers).rev() {
            let t = self.dense_backward(k, &pass, &views)?;
            hand_over(&mut views, &self.grads, [t, t + 1])?;
        }

        // Back to the last pooled output, in its (C × B × H_p²) layout.
        let last = self.convs[convs - 1];
        let (channels, pp) = (last.out_channels, last.pool_side() * last.pool_side());
        swap_outer(
            &self.features_err,
            &mut self.pooled_err[convs - 1],
            rows,
            channels,
            pp,
        );

        for l in (0..convs).rev() {
            self.conv_backward(l, &pass, &views)?;
            hand_over(&mut views, &self.grads, [2 * l, 2 * l + 1])?;
        }
        if let Some(step) = step {
            step.finish()?;
        }
        Ok(BatchLoss {
            nll: nll / rows.max(1) as f64,
            correct,
            sq_error: 0.0,
        })
    }
}
