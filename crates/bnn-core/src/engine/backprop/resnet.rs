//! The ResNet's forward and backward pass written by hand for the CPU (the residual
//! counterpart of [`super::cnn`]), on the project's product kernel and thread pool.
//!
//! Layout as in the CNN: activations channel-major, (C × B × H × W), so that a convolution
//! over the whole minibatch is one product with its im2col matrix (C_in·k² × B·H_o·W_o)
//! (a 1×1 convolution at stride 1 would read its input in place; the ResNet's shortcuts
//! are at stride 2). The 3×3 convolutions at stride 1, most of the work, go direct
//! instead (`bnn_kernels::conv::direct`: forward, input error and ∇W without im2col); what
//! follows describes the others, and what both share:
//!
//! - forward: Z = W·cols; FRN per (example, channel) plane (r = 1/√(mean z² + ε), u = τ +
//!   relu(γ·z·r + β − τ)) or the bias; the activation, after the shortcut's sum at a
//!   block's end. Kept for the backward: Z and r of every convolution, the
//!   pre-activation and the output of every activation site;
//! - backward, block by block from the head: the activation's derivative, the shortcut's
//!   gradients, FRN's backward (∂z = r·(∂x̂ − x̂·mean(∂x̂·x̂)), ∂x̂ = γ·∂y, ∂y = ∂u where
//!   y ≥ τ and ∂τ the rest), then ∇W = ∂Z·colsᵀ + λW with the im2col matrix recomputed
//!   into one shared buffer (storing every convolution's would take 0.2–0.5 GB at batch
//!   128) and the input error col2im(Wᵀ·∂Z) computed into that buffer once ∇W no longer
//!   needs it.
//!
//! Per-plane passes split their planes over the pool's two threads; each tensor is
//! handed to the sampler's per-tensor step as soon as its gradient is final and nothing
//! reads it any more (head first, stem last).

use candle_core::Tensor;

use super::mlp::{
    bias_gradient, dense_forward, hand_over, held, lock_params, prepare_grads, softmax_xent,
    with_data_mut, BatchLoss, CpuView,
};
use crate::error::{Error, Result};
use crate::kernels::conv::direct::{self, Direction};
use crate::kernels::conv::ops::{
    activate, activation_backward, add_bias, add_into, chunk_images, chunks, col2im, conv_forward,
    frn_backward, frn_forward, im2row, plane_sums,
};
use crate::kernels::gemm::{product, Mat, Options, Zeros};
use crate::kernels::TensorwiseStep;
use crate::model::resnet::{ConvGeometry, ConvLayer, ResnetLayout};
use crate::model::Network;

/// What a convolution keeps for the backward: its output Z (with the bias where it has
/// one) and, with FRN, r = 1/√(ν² + ε) per (channel, example) plane.
#[derive(Debug, Default)]
struct ConvBuffers {
    z: Vec<f32>,
    r: Vec<f32>,
}

/// An activation site: its input (pre-activation; after a swish, σ of it) and output.
#[derive(Debug, Default)]
struct Site {
    pre: Vec<f32>,
    out: Vec<f32>,
}

/// Where a block's convolutions sit in [`ResnetLayout::convs`] order.
#[derive(Debug, Clone, Copy)]
struct BlockConvs {
    conv1: usize,
    conv2: usize,
    shortcut: Option<usize>,
}

/// Buffers for the forward and backward pass of one ResNet, reused across steps.
#[derive(Debug)]
pub struct ResnetBackprop {
    layout: ResnetLayout,
    convs: Vec<ConvLayer>,
    block_convs: Vec<BlockConvs>,
    /// Rows the buffers hold.
    capacity: usize,
    /// The input, channel-major, for images of more than one channel.
    input: Vec<f32>,
    /// The im2col matrix of the convolution at hand; in the backward its patches as rows
    /// (im2row) for the weight gradient, then its input error's columns.
    cols: Vec<f32>,
    /// The input of a chunk of images transposed to pixels × channels (for im2row).
    input_t: Vec<f32>,
    /// A chunk of images zero-padded, and the weights packed, for the direct 3×3
    /// convolutions ([`direct`]).
    padded: Vec<f32>,
    packed: Vec<f32>,
    /// The direct weight gradient's partial sums per lane, and its ∂Z in whole vectors.
    partial: Vec<f32>,
    wide: Vec<f32>,
    conv: Vec<ConvBuffers>,
    stem: Site,
    /// Per block: act(N₁(conv₁(x))) and act(N₂(conv₂(·)) + shortcut(x)).
    mid: Vec<Site>,
    end: Vec<Site>,
    /// Average-pooled features (B × C) and their error.
    features: Vec<f32>,
    features_err: Vec<f32>,
    logits: Vec<f32>,
    delta: Vec<f32>,
    /// Activation-sized gradient buffers.
    g: [Vec<f32>; 3],
    /// A convolution's weight gradient with the patch in im2row's order (C_out × k²·C_in).
    weight_grad: Vec<f32>,
    /// Per plane: FRN's ∂γ, ∂β, ∂τ sums (or the bias's ∂b in the first).
    plane_sums: Vec<[f64; 3]>,
    /// ∇Ũ/T per parameter tensor, in the model's order (allocated by the first backward).
    grads: Vec<Tensor>,
}

impl ResnetBackprop {
    /// Buffers for `model` (a ResNet) at minibatches of up to `batch` rows.
    pub fn new(model: &Network, batch: usize) -> Result<Self> {
        let layout = model.resnet.clone().ok_or_else(|| {
            Error::Config("internal: the ResNet pass was given another network".into())
        })?;
        let convs = layout.convs();
        let mut block_convs = Vec::with_capacity(layout.blocks.len());
        let mut at = 1;
        for b in &layout.blocks {
            let shortcut = b.shortcut.map(|_| at + 2);
            block_convs.push(BlockConvs {
                conv1: at,
                conv2: at + 1,
                shortcut,
            });
            at += 2 + usize::from(shortcut.is_some());
        }
        let blocks = layout.blocks.len();
        let mut bp = ResnetBackprop {
            conv: (0..convs.len()).map(|_| ConvBuffers::default()).collect(),
            convs,
            block_convs,
            capacity: 0,
            input: Vec::new(),
            cols: Vec::new(),
            input_t: Vec::new(),
            padded: Vec::new(),
            packed: Vec::new(),
            partial: Vec::new(),
            wide: Vec::new(),
            stem: Site::default(),
            mid: (0..blocks).map(|_| Site::default()).collect(),
            end: (0..blocks).map(|_| Site::default()).collect(),
            features: Vec::new(),
            features_err: Vec::new(),
            logits: Vec::new(),
            delta: Vec::new(),
            g: Default::default(),
            weight_grad: Vec::new(),
            plane_sums: Vec::new(),
            grads: Vec::new(),
            layout,
        };
        bp.reserve(batch);
        Ok(bp)
    }

    /// The gradients of the last backward pass, in the model's order (empty before the
    /// first), overwritten in place by the next.
    pub fn grads(&self) -> &[Tensor] {
        &self.grads
    }

    /// Grows the buffers to `rows` (once; no-op afterwards).
    fn reserve(&mut self, rows: usize) {
        if rows <= self.capacity {
            return;
        }
        let [c, h, w] = self.layout.image;
        if c > 1 {
            self.input.resize(rows * c * h * w, 0.0);
        }
        let (mut widest_cols, mut widest_act, mut planes, mut widest_input) = (0, 0, 0, 0);
        let (mut widest_padded, mut widest_packed) = (0, 0);
        let (mut widest_partial, mut widest_wide) = (0, 0);
        for (l, conv) in self.convs.iter().enumerate() {
            let g = conv.geometry;
            if direct::applies(&g) {
                for d in [Direction::Forward, Direction::Adjoint] {
                    widest_padded = widest_padded.max(direct::padded_len(&g, d, rows));
                }
                widest_packed = widest_packed.max(direct::packed_len(&g));
                widest_partial = widest_partial.max(direct::partial_len(&g));
                widest_wide = widest_wide.max(direct::wide_len(&g, rows));
            }
            let out = g.out_channels * rows * g.out_plane();
            let images = chunk_images(&g, rows);
            widest_cols = widest_cols.max(g.patch() * images * g.out_plane());
            widest_input = widest_input.max(g.in_channels * images * g.in_plane());
            widest_act = widest_act.max(out).max(g.in_channels * rows * g.in_plane());
            planes = planes.max(g.out_channels * rows);
            self.conv[l].z.resize(out, 0.0);
            if conv.frn.is_some() {
                self.conv[l].r.resize(g.out_channels * rows, 0.0);
            }
        }
        let site = |s: &mut Site, g: &ConvGeometry| {
            let n = g.out_channels * rows * g.out_plane();
            s.pre.resize(n, 0.0);
            s.out.resize(n, 0.0);
        };
        site(&mut self.stem, &self.layout.stem.geometry);
        for (b, block) in self.layout.blocks.iter().enumerate() {
            site(&mut self.mid[b], &block.conv1.geometry);
            site(&mut self.end[b], &block.conv2.geometry);
        }
        self.cols.resize(widest_cols, 0.0);
        self.input_t.resize(widest_input, 0.0);
        self.padded.resize(widest_padded, 0.0);
        self.packed.resize(widest_packed, 0.0);
        self.partial.resize(widest_partial, 0.0);
        self.wide.resize(widest_wide, 0.0);
        for g in &mut self.g {
            g.resize(widest_act, 0.0);
        }
        self.plane_sums.resize(planes, [0.0; 3]);
        let widest_weight = self
            .convs
            .iter()
            .map(|c| c.geometry.patch() * c.geometry.out_channels);
        self.weight_grad
            .resize(widest_weight.max().unwrap_or(0), 0.0);
        let (features, classes) = (self.layout.features, self.layout.classes);
        self.features.resize(rows * features, 0.0);
        self.features_err.resize(rows * features, 0.0);
        self.logits.resize(rows * classes, 0.0);
        self.delta.resize(rows * classes, 0.0);
        self.capacity = rows;
    }

    fn prepare<'m>(
        &mut self,
        model: &'m Network,
        x: &[f32],
        rows: usize,
    ) -> Result<Vec<Option<CpuView<'m>>>> {
        if model.resnet.as_ref() != Some(&self.layout) {
            return Err(Error::Config(
                "the backward buffers were built for another model".into(),
            ));
        }
        let pixels: usize = self.layout.image.iter().product();
        if x.len() != rows * pixels {
            return Err(Error::Config(format!(
                "a minibatch of {rows} images needs {} inputs, got {}",
                rows * pixels,
                x.len()
            )));
        }
        self.reserve(rows);
        lock_params(model)
    }

    /// Forward pass on `rows` images `x` (row-major, C·H·W each); returns the logits
    /// (rows × classes).
    pub fn forward(&mut self, model: &Network, x: &[f32], rows: usize) -> Result<&[f32]> {
        let views = self.prepare(model, x, rows)?;
        self.forward_with(&views, x, rows)?;
        Ok(&self.logits[..rows * self.layout.classes])
    }

    /// N(conv(a)) of convolution `l` into `u` (Z and r kept).
    fn conv_norm(
        &mut self,
        views: &[Option<CpuView<'_>>],
        l: usize,
        a: Source,
        rows: usize,
        u: PreActivation,
    ) -> Result<()> {
        let layer = self.convs[l];
        let g = layer.geometry;
        // The input and the outputs are distinct buffers: the outputs are taken out while
        // the input is read (no copy).
        let mut buffers = std::mem::take(&mut self.conv[l]);
        let mut cols = std::mem::take(&mut self.cols);
        let mut out = self.take_target(u);
        let w = held(views, layer.weight)?;
        if direct::applies(&g) {
            let (mut padded, mut packed) = (
                std::mem::take(&mut self.padded),
                std::mem::take(&mut self.packed),
            );
            let a = self.source(a);
            let (p, q, z) = (&mut padded, &mut packed, &mut buffers.z);
            direct::conv(a, &g, Direction::Forward, rows, w, p, q, z, false);
            (self.padded, self.packed) = (padded, packed);
        } else {
            conv_forward(self.source(a), &g, rows, w, &mut cols, &mut buffers.z);
        }
        self.cols = cols;
        let n = g.out_channels * rows * g.out_plane();
        if let Some(b) = layer.bias {
            add_bias(&mut buffers.z[..n], held(views, b)?, rows * g.out_plane());
        }
        match layer.frn {
            Some(f) => frn_forward(
                &buffers.z[..n],
                rows,
                g.out_plane(),
                held(views, f)?,
                held(views, f + 1)?,
                held(views, f + 2)?,
                &mut buffers.r,
                &mut out[..n],
            ),
            None => out[..n].copy_from_slice(&buffers.z[..n]),
        }
        self.put_target(u, out);
        self.conv[l] = buffers;
        Ok(())
    }

    fn source(&self, a: Source) -> &[f32] {
        match a {
            Source::Input => &self.input,
            Source::Stem => &self.stem.out,
            Source::Mid(b) => &self.mid[b].out,
            Source::End(b) => &self.end[b].out,
        }
    }

    fn take_target(&mut self, t: PreActivation) -> Vec<f32> {
        match t {
            PreActivation::Stem => std::mem::take(&mut self.stem.pre),
            PreActivation::Mid(b) => std::mem::take(&mut self.mid[b].pre),
            PreActivation::End(b) => std::mem::take(&mut self.end[b].pre),
        }
    }

    fn put_target(&mut self, t: PreActivation, v: Vec<f32>) {
        match t {
            PreActivation::Stem => self.stem.pre = v,
            PreActivation::Mid(b) => self.mid[b].pre = v,
            PreActivation::End(b) => self.end[b].pre = v,
        }
    }

    fn forward_with(
        &mut self,
        views: &[Option<CpuView<'_>>],
        x: &[f32],
        rows: usize,
    ) -> Result<()> {
        to_channel_major(&mut self.input, x, rows, self.layout.image);
        let act = self.layout.activation;
        self.conv_norm(views, 0, Source::Input, rows, PreActivation::Stem)?;
        let stem = &mut self.stem;
        activate(&mut stem.pre, &mut stem.out, act);
        for b in 0..self.block_convs.len() {
            self.block_forward(views, b, rows)?;
        }
        let last = &self.end[self.end.len() - 1].out;
        let g = self.layout.blocks[self.layout.blocks.len() - 1]
            .conv2
            .geometry;
        let channels = g.out_channels;
        average_pool(&mut self.features, last, rows, channels, g.out_plane());
        let t = self.layout.fc_weight;
        dense_forward(
            &mut self.logits,
            &self.features[..rows * channels],
            held(views, t)?,
            held(views, t + 1)?,
            rows,
            None,
            Zeros::Unknown,
        );
        Ok(())
    }

    /// Residual block `b`'s forward: conv–norm–activation twice, the shortcut (its
    /// projection, or the block's input itself) added before the last activation.
    fn block_forward(
        &mut self,
        views: &[Option<CpuView<'_>>],
        b: usize,
        rows: usize,
    ) -> Result<()> {
        let act = self.layout.activation;
        let bc = self.block_convs[b];
        let input = Source::block_input(b);
        self.conv_norm(views, bc.conv1, input, rows, PreActivation::Mid(b))?;
        let mid = &mut self.mid[b];
        activate(&mut mid.pre, &mut mid.out, act);
        self.conv_norm(views, bc.conv2, Source::Mid(b), rows, PreActivation::End(b))?;
        let g = self.convs[bc.conv2].geometry;
        let n = g.out_channels * rows * g.out_plane();
        if let Some(s) = bc.shortcut {
            self.conv_norm_shortcut(views, s, input, rows)?;
            let sc = &self.conv[s].z[..n];
            add_into(&mut self.end[b].pre[..n], sc);
        } else {
            let mut pre = std::mem::take(&mut self.end[b].pre);
            add_into(&mut pre[..n], &self.source(input)[..n]);
            self.end[b].pre = pre;
        }
        let end = &mut self.end[b];
        activate(&mut end.pre[..n], &mut end.out[..n], act);
        Ok(())
    }

    /// The shortcut's 1×1 projection with its bias, into its Z.
    fn conv_norm_shortcut(
        &mut self,
        views: &[Option<CpuView<'_>>],
        l: usize,
        a: Source,
        rows: usize,
    ) -> Result<()> {
        let layer = self.convs[l];
        let g = layer.geometry;
        let mut buffers = std::mem::take(&mut self.conv[l]);
        let mut cols = std::mem::take(&mut self.cols);
        conv_forward(
            self.source(a),
            &g,
            rows,
            held(views, layer.weight)?,
            &mut cols,
            &mut buffers.z,
        );
        self.cols = cols;
        if let Some(b) = layer.bias {
            let n = g.out_channels * rows * g.out_plane();
            add_bias(&mut buffers.z[..n], held(views, b)?, rows * g.out_plane());
        }
        self.conv[l] = buffers;
        Ok(())
    }

    /// Forward and backward pass on a minibatch, as
    /// [`super::HandPass::loss_and_grad_then`]: the mean NLL and correct count; ∇
    /// = `likelihood_scale`·Σᵢ∇(−log p(yᵢ|xᵢ,θ)) + `prior_factor`·`prior_precision[t]`·θ_t
    /// into [`ResnetBackprop::grads`]; given a sampler's `step`, each tensor updated once
    /// its gradient is final and θ_t no longer read. No update when the loss is not finite.
    #[allow(clippy::too_many_arguments)]
    pub fn loss_and_grad_then(
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
        let classes = self.layout.classes;
        let (nll, correct) = softmax_xent(
            &self.logits[..rows * classes],
            labels,
            classes,
            likelihood_scale as f32,
            &mut self.delta[..rows * classes],
        )?;
        let prior = |t: usize| (prior_factor * prior_precision[t]) as f32;
        let mut step = match step.filter(|_| nll.is_finite()) {
            Some(s) => Some(crate::kernels::begin(s)?),
            None => None,
        };
        let grads = self.grads.clone();
        let mut hand_over = |views: &mut Vec<Option<CpuView<'_>>>, ts: &[usize]| match step.as_mut()
        {
            Some(step) => hand_over(step, views, model, &grads, ts.iter().copied()),
            None => Ok(()),
        };

        let t = self.head_backward(&views, rows, &grads, prior)?;
        let features = self.layout.features;
        hand_over(&mut views, &[t, t + 1])?;
        // The last block's output error: the features' error spread over each plane.
        let last = self.layout.blocks[self.layout.blocks.len() - 1]
            .conv2
            .geometry;
        let mut g = std::mem::take(&mut self.g);
        let err = &self.features_err[..rows * features];
        spread_over_planes(&mut g[0], err, rows, last.out_plane());
        for bi in (0..self.block_convs.len()).rev() {
            self.block_backward(bi, &mut views, rows, &mut g, &grads, prior, &mut hand_over)?;
            g.swap(0, 2);
        }
        let ts = self.stem_backward(&views, rows, &mut g[0], &grads, prior)?;
        hand_over(&mut views, &ts)?;
        self.g = g;
        if let Some(step) = step {
            step.finish()?;
        }
        Ok(BatchLoss {
            nll: nll / rows.max(1) as f64,
            correct,
            sq_error: 0.0,
        })
    }

    /// The stem's backward from its output error `g0`: through its activation, its
    /// normalisation and its convolution (no input error: the input is the data).
    /// Returns the tensors it finished.
    fn stem_backward(
        &mut self,
        views: &[Option<CpuView<'_>>],
        rows: usize,
        g0: &mut [f32],
        grads: &[Tensor],
        prior: impl Fn(usize) -> f32 + Copy,
    ) -> Result<Vec<usize>> {
        let stem = self.convs[0].geometry;
        let n = stem.out_channels * rows * stem.out_plane();
        let (pre, out) = (&self.stem.pre[..n], &self.stem.out[..n]);
        activation_backward(&mut g0[..n], pre, out, self.layout.activation);
        let stem = (0, Source::Input);
        self.conv_norm_backward(views, stem, rows, &mut g0[..n], (None, false), grads, prior)
    }

    /// The head: ∇W = Δᵀ·F + λW, ∇b, and the features' error Δ·W. Returns the index of
    /// its weight tensor.
    fn head_backward(
        &mut self,
        views: &[Option<CpuView<'_>>],
        rows: usize,
        grads: &[Tensor],
        prior: impl Fn(usize) -> f32,
    ) -> Result<usize> {
        let classes = self.layout.classes;
        let (t, features) = (self.layout.fc_weight, self.layout.features);
        let delta = &self.delta[..rows * classes];
        let w = held(views, t)?;
        let opts = Options {
            addend: Some((w, prior(t))),
            ..Options::default()
        };
        let f = &self.features[..rows * features];
        with_data_mut(&grads[t], |g| {
            product(
                classes,
                features,
                rows,
                g,
                Mat::transposed(delta, classes),
                Mat::rows(f, features),
                opts,
            )
        })?;
        let (b, lb) = (held(views, t + 1)?, prior(t + 1));
        with_data_mut(&grads[t + 1], |g| bias_gradient(g, b, lb, delta))?;
        product(
            rows,
            features,
            classes,
            &mut self.features_err[..rows * features],
            Mat::rows(delta, classes),
            Mat::rows(w, features),
            Options::default(),
        );
        Ok(t)
    }

    /// Residual block `bi`, backwards: from the error of its output (`g[0]`) through the
    /// shortcut, conv2 and conv1 to the error of its input (`g[2]`), handing each tensor to
    /// `hand_over` as soon as nothing reads it any more.
    #[allow(clippy::too_many_arguments)]
    fn block_backward(
        &mut self,
        bi: usize,
        views: &mut Vec<Option<CpuView<'_>>>,
        rows: usize,
        g: &mut [Vec<f32>; 3],
        grads: &[Tensor],
        prior: impl Fn(usize) -> f32 + Copy,
        hand_over: &mut impl FnMut(&mut Vec<Option<CpuView<'_>>>, &[usize]) -> Result<()>,
    ) -> Result<()> {
        let act = self.layout.activation;
        let bc = self.block_convs[bi];
        let input = Source::block_input(bi);
        let g2 = self.convs[bc.conv2].geometry;
        let n_out = g2.out_channels * rows * g2.out_plane();
        let g1 = self.convs[bc.conv1].geometry;
        let n_in = g1.in_channels * rows * g1.in_plane();
        let [g_out, g_mid, g_in] = g;
        let end = &self.end[bi];
        activation_backward(
            &mut g_out[..n_out],
            &end.pre[..n_out],
            &end.out[..n_out],
            act,
        );
        // The shortcut: its gradients and its part of the block input's error.
        match bc.shortcut {
            Some(s) => {
                let ts = self.conv_backward(
                    views,
                    s,
                    input,
                    rows,
                    &mut g_out[..n_out],
                    Some(&mut g_in[..n_in]),
                    false,
                    grads,
                    prior,
                )?;
                hand_over(views, &ts)?;
            }
            None => g_in[..n_in].copy_from_slice(&g_out[..n_out]),
        }
        let n_mid = g1.out_channels * rows * g1.out_plane();
        // conv2 writes the middle's error afresh; conv1 adds its part of the input's onto
        // the shortcut's.
        let (conv2, mid_err) = (
            (bc.conv2, Source::Mid(bi)),
            (Some(&mut g_mid[..n_mid]), false),
        );
        let g_conv2 = &mut g_out[..n_out];
        let ts = self.conv_norm_backward(views, conv2, rows, g_conv2, mid_err, grads, prior)?;
        hand_over(views, &ts)?;
        let mid = &self.mid[bi];
        let (pre, out) = (&mid.pre[..n_mid], &mid.out[..n_mid]);
        activation_backward(&mut g_mid[..n_mid], pre, out, act);
        let (conv1, in_err) = ((bc.conv1, input), (Some(&mut g_in[..n_in]), true));
        let g_conv1 = &mut g_mid[..n_mid];
        let ts = self.conv_norm_backward(views, conv1, rows, g_conv1, in_err, grads, prior)?;
        hand_over(views, &ts)?;
        Ok(())
    }

    /// Convolution `l` and its normalisation, backwards, from the error `g_out` of its
    /// normalised output: the normalisation's ∂u → ∂Z in place, then the convolution's
    /// gradients and, with `input_err`, its input error (onto what is there with
    /// `accumulate`) from `input`. Returns the tensors it finished.
    #[allow(clippy::too_many_arguments)]
    fn conv_norm_backward(
        &mut self,
        views: &[Option<CpuView<'_>>],
        (l, input): (usize, Source),
        rows: usize,
        g_out: &mut [f32],
        (input_err, accumulate): (Option<&mut [f32]>, bool),
        grads: &[Tensor],
        prior: impl Fn(usize) -> f32 + Copy,
    ) -> Result<Vec<usize>> {
        let ts = self.norm_backward(views, l, rows, g_out, grads, prior)?;
        let mut done = self.conv_backward(
            views, l, input, rows, g_out, input_err, accumulate, grads, prior,
        )?;
        done.extend(ts);
        Ok(done)
    }

    /// The normalisation's backward of convolution `l`: ∂u → ∂Z in place, and the
    /// gradients of γ, β, τ (FRN) or of the bias. Returns the tensors it finished.
    fn norm_backward(
        &mut self,
        views: &[Option<CpuView<'_>>],
        l: usize,
        rows: usize,
        grad: &mut [f32],
        grads: &[Tensor],
        prior: impl Fn(usize) -> f32,
    ) -> Result<Vec<usize>> {
        let layer = self.convs[l];
        let g = layer.geometry;
        let (channels, plane) = (g.out_channels, g.out_plane());
        let sums = &mut self.plane_sums[..channels * rows];
        let buffers = &self.conv[l];
        let (first, count) = match (layer.frn, layer.bias) {
            (Some(f), _) => {
                frn_backward(
                    &buffers.z,
                    &buffers.r,
                    rows,
                    plane,
                    held(views, f)?,
                    held(views, f + 1)?,
                    held(views, f + 2)?,
                    grad,
                    sums,
                );
                (f, 3)
            }
            (None, Some(b)) => {
                plane_sums(grad, plane, sums);
                (b, 1)
            }
            (None, None) => return Ok(Vec::new()),
        };
        for k in 0..count {
            let t = first + k;
            let (theta, lt) = (held(views, t)?, prior(t));
            with_data_mut(&grads[t], |gr| {
                for (c, (gr, &th)) in gr.iter_mut().zip(theta).enumerate() {
                    let s: f64 = sums[c * rows..(c + 1) * rows].iter().map(|s| s[k]).sum();
                    *gr = lt * th + s as f32;
                }
            })?;
        }
        Ok((first..first + count).collect())
    }

    /// Convolution `l`'s backward from ∂Z (`grad`): ∇W = ∂Z·colsᵀ + λW (and, for a
    /// shortcut, its bias's gradient Σ ∂Z), and the input error col2im(Wᵀ·∂Z) into
    /// `input_err` (onto what is there with `accumulate`). Returns the tensors it
    /// finished.
    #[allow(clippy::too_many_arguments)]
    fn conv_backward(
        &mut self,
        views: &[Option<CpuView<'_>>],
        l: usize,
        input: Source,
        rows: usize,
        grad: &mut [f32],
        input_err: Option<&mut [f32]>,
        accumulate: bool,
        grads: &[Tensor],
        prior: impl Fn(usize) -> f32,
    ) -> Result<Vec<usize>> {
        let layer = self.convs[l];
        let g = layer.geometry;
        let k = g.patch();
        let t = layer.weight;
        let w = held(views, t)?;
        let dz = &grad[..g.out_channels * rows * g.out_plane()];
        let mut weight_grad = std::mem::take(&mut self.weight_grad);
        let wg = &mut weight_grad[..g.out_channels * k];
        let direct = self.conv_products(&g, input, rows, w, dz, wg, input_err, accumulate);
        let stored = with_data_mut(&grads[t], |gr| {
            weight_grad_with_prior(gr, w, wg, &g, direct, prior(t))
        });
        self.weight_grad = weight_grad;
        stored?;
        let mut done = vec![t];
        if let (Some(b), None) = (layer.bias, layer.frn) {
            if self.block_convs.iter().any(|bc| bc.shortcut == Some(l)) {
                let sums = &mut self.plane_sums[..g.out_channels * rows];
                plane_sums(dz, g.out_plane(), sums);
                let (theta, lb) = (held(views, b)?, prior(b));
                with_data_mut(&grads[b], |gr| {
                    for (c, (gr, &th)) in gr.iter_mut().zip(theta).enumerate() {
                        let s: f64 = sums[c * rows..(c + 1) * rows].iter().map(|s| s[0]).sum();
                        *gr = lb * th + s as f32;
                    }
                })?;
                done.push(b);
            }
        }
        Ok(done)
    }

    /// A convolution's two products of its backward: its weights' data gradient ∂Z·colsᵀ
    /// into `wg` and, with `input_err`, the input error col2im(Wᵀ·∂Z). Returns whether the
    /// direct 3×3 path ran, which leaves `wg` in W's own patch order.
    ///
    /// A 3×3 stride-1 convolution computes both directly (resnet_direct). Otherwise a
    /// chunk of images at a time (see bnn_kernels::conv::ops::CHUNK_BYTES): its patches
    /// as rows (im2row), its part of ∇W (C_out × k, patch in (i, j, c) order) =
    /// ∂Z·cols_t, summed over the chunks in order (the product packs only ∂Z and reads
    /// cols_t in place), and its input error col2im(Wᵀ·∂Z) through the same buffer.
    #[allow(clippy::too_many_arguments)]
    fn conv_products(
        &mut self,
        g: &ConvGeometry,
        input: Source,
        rows: usize,
        w: &[f32],
        dz: &[f32],
        wg: &mut [f32],
        mut input_err: Option<&mut [f32]>,
        accumulate: bool,
    ) -> bool {
        let (c_out, k, plane) = (g.out_channels, g.patch(), g.out_plane());
        let n = rows * plane;
        let direct = direct::applies(g);
        if direct {
            let (mut p, mut q, mut r) = (
                std::mem::take(&mut self.padded),
                std::mem::take(&mut self.partial),
                std::mem::take(&mut self.wide),
            );
            let a = self.source(input);
            direct::weight_grad(a, dz, g, rows, &mut p, &mut q, &mut r, wg);
            (self.padded, self.partial, self.wide) = (p, q, r);
            if let Some(err) = input_err {
                let (p, q) = (&mut self.padded, &mut self.packed);
                direct::conv(dz, g, Direction::Adjoint, rows, w, p, q, err, accumulate);
            }
            return true;
        }
        let mut cols = std::mem::take(&mut self.cols);
        let mut input_t = std::mem::take(&mut self.input_t);
        for (c, images) in chunks(g, rows).enumerate() {
            let (at, width) = (images.start * plane, images.len() * plane);
            let source = self.source(input);
            im2row(source, g, rows, images.clone(), &mut input_t, &mut cols);
            let dz_chunk = Mat {
                data: &dz[at..],
                rs: n,
                cs: 1,
            };
            let options = Options {
                accumulate: c > 0,
                ..Options::default()
            };
            let patches = Mat::rows(&cols[..width * k], k);
            product(c_out, k, width, wg, dz_chunk, patches, options);
            if let Some(err) = input_err.as_deref_mut() {
                let into = &mut cols[..k * width];
                let wt = Mat::transposed(w, k);
                product(k, width, c_out, into, wt, dz_chunk, Options::default());
                col2im(&cols, g, rows, images, err, accumulate);
            }
        }
        self.cols = cols;
        self.input_t = input_t;
        false
    }
}

/// A convolution weight's gradient `gr` = its data part `wg` + λ·W (λ = `lw`, the
/// prior's precision), from `wg` in im2row's (i, j, c) patch order, or, after the direct
/// path, in W's own (c, i, j).
fn weight_grad_with_prior(
    gr: &mut [f32],
    w: &[f32],
    wg: &[f32],
    g: &ConvGeometry,
    direct: bool,
    lw: f32,
) {
    let (k, taps, c_in) = (g.patch(), g.kernel * g.kernel, g.in_channels);
    let rows = gr.chunks_exact_mut(k).zip(w.chunks_exact(k));
    for ((row, w), from) in rows.zip(wg.chunks_exact(k)) {
        for (q, (gq, &wq)) in row.iter_mut().zip(w).enumerate() {
            let at = if direct {
                q
            } else {
                q % taps * c_in + q / taps
            };
            *gq = from[at] + lw * wq;
        }
    }
}

/// The last block's output error `g0` (C × B × plane) from the features' error `err`
/// (B × C): global average pooling's adjoint spreads each over its plane.
fn spread_over_planes(g0: &mut [f32], err: &[f32], rows: usize, plane: usize) {
    let features = err.len() / rows.max(1);
    for ch in 0..features {
        for b in 0..rows {
            let e = err[b * features + ch] / plane as f32;
            g0[(ch * rows + b) * plane..][..plane].fill(e);
        }
    }
}

/// `x`'s `rows` images (B × C·H·W) channel-major into `input` (C × B × H·W), as the
/// convolutions read them; one channel is already so.
fn to_channel_major(input: &mut Vec<f32>, x: &[f32], rows: usize, [c, h, w]: [usize; 3]) {
    if c == 1 {
        input.clear();
        input.extend_from_slice(x);
        return;
    }
    for (ch, dst) in input.chunks_exact_mut(rows * h * w).take(c).enumerate() {
        for (b, plane) in dst.chunks_exact_mut(h * w).enumerate() {
            plane.copy_from_slice(&x[(b * c + ch) * h * w..][..h * w]);
        }
    }
}

/// Global average pooling: `features[b][c]` = the mean of plane (c, b) of `last`.
fn average_pool(features: &mut [f32], last: &[f32], rows: usize, channels: usize, plane: usize) {
    for (b, f) in features.chunks_exact_mut(channels).take(rows).enumerate() {
        for (ch, v) in f.iter_mut().enumerate() {
            let p = &last[(ch * rows + b) * plane..][..plane];
            *v = p.iter().sum::<f32>() / plane as f32;
        }
    }
}

/// Which buffer a convolution reads.
#[derive(Debug, Clone, Copy)]
enum Source {
    Input,
    Stem,
    Mid(usize),
    End(usize),
}

impl Source {
    /// What residual block `b` reads: the stem's output, or the block before's.
    fn block_input(b: usize) -> Source {
        match b {
            0 => Source::Stem,
            b => Source::End(b - 1),
        }
    }
}

/// Which pre-activation a convolution's normalised output goes to.
#[derive(Debug, Clone, Copy)]
enum PreActivation {
    Stem,
    Mid(usize),
    End(usize),
}
