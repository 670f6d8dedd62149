//! CIFAR-style residual networks (He et al. 2016, "basic" blocks of two 3×3
//! convolutions), with filter response normalisation (Singh & Krishnan 2020) in place of
//! batch normalisation: a posterior sample must give the same prediction whatever batch
//! it sees, and FRN normalises each example's channel by its own mean square.
//!
//! Layout: a 3×3 stem convolution to the first stage's width, then `stages` of `blocks`
//! basic blocks each (stride 2 at the first block of every stage after the first, with a
//! 1×1 projection shortcut wherever the shape changes), global average pooling and a
//! linear head. ResNet-8 is one block per stage, ResNet-20 three (depth 6·blocks + 2).
//!
//! A convolution followed by a normalisation:
//! - `norm = "frn"`: no bias (FRN's β is one); ν² = mean over the plane of x², x̂ =
//!   x/√(ν² + ε), y = γ·x̂ + β, then the thresholded linear unit TLU(y) = max(y, τ)
//!   (eqs. 1–3 of Singh & Krishnan), written τ + relu(y − τ) so that a tie y = τ sends
//!   the gradient to y, as candle's relu (derivative 1 at 0) does;
//! - `norm = "none"`: the convolution has a bias.
//!
//! A block: h = act(N₁(conv₁(x))), out = act(N₂(conv₂(h)) + shortcut(x)); the stem:
//! act(N(conv(x))). With FRN the activation follows the TLU, as in the FRN ResNet-20 of
//! Izmailov et al. 2021 (`resnet20_frn_swish`); the projection shortcut is a 1×1
//! convolution with a bias and no normalisation, as there.

use candle_core::Tensor;
use serde::{Deserialize, Serialize};

use super::{Activation, ModelSpec, Param};
use crate::error::{Error, Result};

/// Normalisation after a ResNet's convolutions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Norm {
    /// Filter response normalisation with a thresholded linear unit (FRN + TLU).
    #[default]
    Frn,
    /// None: the convolutions carry a bias.
    None,
}

pub use crate::kernels::conv::{ConvGeometry, FRN_EPSILON};

/// A convolution and where its parameters sit in the network's list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConvLayer {
    /// Its shape.
    pub geometry: ConvGeometry,
    /// Index of its weight in the network's parameters.
    pub weight: usize,
    /// `norm = "none"` and shortcuts.
    pub bias: Option<usize>,
    /// FRN's γ, β, τ at this index and the next two.
    pub frn: Option<usize>,
}

/// A basic block: two 3×3 convolutions and the shortcut (a 1×1 projection where the shape
/// changes, else the identity).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResBlock {
    /// The first 3×3 convolution.
    pub conv1: ConvLayer,
    /// The second 3×3 convolution.
    pub conv2: ConvLayer,
    /// The 1×1 projection where the shape changes (else the identity).
    pub shortcut: Option<ConvLayer>,
}

/// The whole network's layers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResnetLayout {
    /// Channels, height, width of an input image.
    pub image: [usize; 3],
    /// FRN + TLU or none.
    pub norm: Norm,
    /// The nonlinearity.
    pub activation: Activation,
    /// The first convolution.
    pub stem: ConvLayer,
    /// The residual blocks in order.
    pub blocks: Vec<ResBlock>,
    /// Channels of the last stage: the pooled features the head reads.
    pub features: usize,
    /// Index of the classifier's weight in the parameters.
    pub fc_weight: usize,
    /// Output classes.
    pub classes: usize,
}

/// How a parameter tensor starts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Init {
    /// U(−1/√fan_in, 1/√fan_in), PyTorch's default for convolutions and linear layers.
    Uniform {
        /// Inputs of one output: C_in·k² for a convolution.
        fan_in: usize,
    },
    /// Every element this value (FRN: γ = 1, β = τ = 0).
    Constant(f32),
}

/// A parameter to create: name, shape, start.
#[derive(Debug, Clone, PartialEq)]
pub struct ParamPlan {
    /// The parameter's name.
    pub name: String,
    /// Its shape.
    pub shape: Vec<usize>,
    /// How it is initialised.
    pub init: Init,
}

/// A convolution named `name` of geometry `g`: its weight, then its bias (no
/// normalisation) or its FRN's γ, β, τ, appended to `plans`; the layer indexes them.
fn conv(name: &str, g: ConvGeometry, norm: Norm, plans: &mut Vec<ParamPlan>) -> ConvLayer {
    let weight = plans.len();
    let fan_in = g.patch();
    plans.push(ParamPlan {
        name: format!("{name}.weight"),
        shape: vec![g.out_channels, g.in_channels, g.kernel, g.kernel],
        init: Init::Uniform { fan_in },
    });
    let (mut bias, mut frn) = (None, None);
    match norm {
        Norm::None => {
            bias = Some(plans.len());
            plans.push(ParamPlan {
                name: format!("{name}.bias"),
                shape: vec![g.out_channels],
                init: Init::Uniform { fan_in },
            });
        }
        Norm::Frn => {
            frn = Some(plans.len());
            for (what, value) in [("gamma", 1.0), ("beta", 0.0), ("tau", 0.0)] {
                plans.push(ParamPlan {
                    name: format!("{name}.frn.{what}"),
                    shape: vec![g.out_channels],
                    init: Init::Constant(value),
                });
            }
        }
    }
    ConvLayer {
        geometry: g,
        weight,
        bias,
        frn,
    }
}

impl ResnetLayout {
    /// The layers of `spec` (a ResNet) on images of shape `image` with `classes` outputs,
    /// and the parameters to create, in the network's order.
    pub fn new(
        spec: &ModelSpec,
        image: [usize; 3],
        classes: usize,
    ) -> Result<(Self, Vec<ParamPlan>)> {
        let [channels, h, w] = image;
        if channels == 0 || h == 0 || w == 0 {
            return Err(Error::Config(format!(
                "a ResNet needs images, got shape {image:?}"
            )));
        }
        let mut plans = Vec::new();
        let widths = &spec.stages;
        let stem = conv(
            "stem",
            ConvGeometry::new(channels, widths[0], 3, 1, [h, w]),
            spec.norm,
            &mut plans,
        );
        let (mut c_in, mut hw) = (widths[0], [h, w]);
        let mut blocks = Vec::new();
        for (s, &width) in widths.iter().enumerate() {
            for b in 0..spec.blocks {
                let stride = if s > 0 && b == 0 { 2 } else { 1 };
                let name = format!("stage{}.block{}", s + 1, b + 1);
                let g1 = ConvGeometry::new(c_in, width, 3, stride, hw);
                let conv1 = conv(&format!("{name}.conv1"), g1, spec.norm, &mut plans);
                let g2 = ConvGeometry::new(width, width, 3, 1, [g1.out_h, g1.out_w]);
                let conv2 = conv(&format!("{name}.conv2"), g2, spec.norm, &mut plans);
                let shortcut = (stride != 1 || c_in != width).then(|| {
                    let g = ConvGeometry::new(c_in, width, 1, stride, hw);
                    conv(&format!("{name}.shortcut"), g, Norm::None, &mut plans)
                });
                blocks.push(ResBlock {
                    conv1,
                    conv2,
                    shortcut,
                });
                (c_in, hw) = (width, [g1.out_h, g1.out_w]);
            }
        }
        let fc_weight = plans.len();
        plans.push(ParamPlan {
            name: "fc.weight".into(),
            shape: vec![classes, c_in],
            init: Init::Uniform { fan_in: c_in },
        });
        plans.push(ParamPlan {
            name: "fc.bias".into(),
            shape: vec![classes],
            init: Init::Uniform { fan_in: c_in },
        });
        let layout = ResnetLayout {
            image,
            norm: spec.norm,
            activation: spec.activation,
            stem,
            blocks,
            features: c_in,
            fc_weight,
            classes,
        };
        Ok((layout, plans))
    }

    /// Every convolution, in the order of the forward pass (stem; per block conv₁, conv₂,
    /// shortcut).
    pub fn convs(&self) -> Vec<ConvLayer> {
        let mut all = vec![self.stem];
        for b in &self.blocks {
            all.extend([b.conv1, b.conv2]);
            all.extend(b.shortcut);
        }
        all
    }

    /// Class logits for a batch `x` (batch × C·H·W) from candle ops: the device path, and
    /// on the CPU the autograd reference of the hand-written pass.
    pub fn forward(&self, params: &[Param], x: &Tensor) -> Result<Tensor> {
        let [c, h, w] = self.image;
        let a = self.body(params, x.reshape((x.dim(0)?, c, h, w))?, 1)?;
        let pooled = a.mean(3)?.mean(2)?;
        let (fw, fb) = (
            params[self.fc_weight].var.as_tensor(),
            params[self.fc_weight + 1].var.as_tensor(),
        );
        Ok(pooled.matmul(&fw.t()?)?.broadcast_add(fb)?)
    }

    /// The logits (K, B, classes) of K networks whose parameters are stacked along a
    /// leading chain axis (`params[i]` shaped (K, …)), chain k on its own minibatch `x[k]`
    /// (K, B, C·H·W): chain k's channels are group k of every convolution (a grouped
    /// convolution over K groups), FRN normalises each channel of each image as it does
    /// alone, and the head is one batched product; the same operations as
    /// [`ResnetLayout::forward`] per chain.
    pub fn forward_stacked(&self, params: &[Param], x: &Tensor) -> Result<Tensor> {
        let (k, b, _) = x.dims3()?;
        let [c, h, w] = self.image;
        let a = x.transpose(0, 1)?.contiguous()?.reshape((b, k * c, h, w))?;
        let a = self.body(params, a, k)?;
        // (B, K·C) → (K, B, C).
        let pooled = a
            .mean(3)?
            .mean(2)?
            .reshape((b, k, self.features))?
            .transpose(0, 1)?
            .contiguous()?;
        let (fw, fb) = (
            params[self.fc_weight].var.as_tensor(),
            params[self.fc_weight + 1].var.as_tensor(),
        );
        Ok(pooled
            .matmul(&fw.transpose(1, 2)?)?
            .broadcast_add(&fb.unsqueeze(1)?)?)
    }

    /// The stem and the residual blocks on `a` (batch × chains·C × H × W).
    fn body(&self, params: &[Param], mut a: Tensor, chains: usize) -> Result<Tensor> {
        a = self.activate(&self.conv_norm(params, &a, &self.stem, chains)?)?;
        for b in &self.blocks {
            if b.conv1.geometry.stride > 1 {
                a = even_out_parity(a)?;
            }
            let y = self.activate(&self.conv_norm(params, &a, &b.conv1, chains)?)?;
            let y = self.conv_norm(params, &y, &b.conv2, chains)?;
            let s = match &b.shortcut {
                Some(l) => self.conv_norm(params, &a, l, chains)?,
                None => a.clone(),
            };
            a = self.activate(&(y + s)?)?;
        }
        Ok(a)
    }

    fn activate(&self, h: &Tensor) -> Result<Tensor> {
        self.activation.apply(h)
    }

    /// Convolution `l` (with its bias or FRN + TLU) of `chains` networks at once: their
    /// kernels (chains·C_out × C_in × k × k) applied group by group (one group, the plain
    /// convolution, for one network).
    fn conv_norm(
        &self,
        params: &[Param],
        a: &Tensor,
        l: &ConvLayer,
        chains: usize,
    ) -> Result<Tensor> {
        let g = &l.geometry;
        let c = chains * g.out_channels;
        let channel = |i: usize| params[i].var.as_tensor().reshape((1, c, 1, 1));
        let weight = params[l.weight].var.as_tensor();
        let kernel = weight.reshape((c, g.in_channels, g.kernel, g.kernel))?;
        let mut z = a.conv2d(&kernel, g.pad, g.stride, 1, chains)?;
        if let Some(b) = l.bias {
            z = z.broadcast_add(&channel(b)?)?;
        }
        if let Some(f) = l.frn {
            let nu2 = z.sqr()?.mean_keepdim(3)?.mean_keepdim(2)?;
            let xhat = z.broadcast_div(&(nu2 + FRN_EPSILON as f64)?.sqrt()?)?;
            let y = xhat
                .broadcast_mul(&channel(f)?)?
                .broadcast_add(&channel(f + 1)?)?;
            let tau = channel(f + 2)?;
            z = y.broadcast_sub(&tau)?.relu()?.broadcast_add(&tau)?;
        }
        Ok(z)
    }
}

/// `a` (batch × C × H × W) with a zero row or column appended where H and W differ in
/// parity, so that both are even: the input of a stride-2 convolution, whose outputs
/// stay the same (the appended zeros are the padding that the last output read anyway,
/// and a 1×1 shortcut skips them). Why: candle's convolution backward gives the input's
/// gradient one output padding for both sides, taken from the height, and fails on a
/// 6×5 input ("shape mismatch in add").
fn even_out_parity(a: Tensor) -> Result<Tensor> {
    let (_, _, h, w) = a.dims4()?;
    Ok(match (h % 2, w % 2) {
        (0, 1) => a.pad_with_zeros(3, 0, 1)?,
        (1, 0) => a.pad_with_zeros(2, 0, 1)?,
        _ => a,
    })
}
