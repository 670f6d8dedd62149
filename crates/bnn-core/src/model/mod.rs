//! Network architectures, built from a [`ModelSpec`] (TOML presets in `models/`).
//!
//! Parameters are candle [`Var`]s with stable names (`fc1.weight`, `fc1.bias`, ...) kept in
//! a fixed order, so that a parameter's index (used to key its noise stream) and its name
//! in a checkpoint never change between runs.

pub mod resnet;
pub mod stacked;

use candle_core::{DType, Device, Tensor, Var};
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Non-linearity between layers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum Activation {
    /// max(0, x).
    Relu,
    /// 1/(1 + e^{−x}).
    Sigmoid,
    /// tanh(x): smooth and odd, the usual choice of the 1-D regression pictures (a ReLU
    /// network extrapolates linearly and agrees with itself in a gap between data).
    Tanh,
    /// x·σ(x) (SiLU); ResNets only (the MLP and CNN passes differentiate through the
    /// activation's output, which swish's derivative cannot be written in).
    Swish,
}

impl Activation {
    /// The function applied to `h` in candle's operations (the device and autograd path).
    pub fn apply(self, h: &Tensor) -> Result<Tensor> {
        Ok(match self {
            Activation::Relu => h.relu()?,
            Activation::Sigmoid => candle_nn::ops::sigmoid(h)?,
            Activation::Swish => h.silu()?,
            Activation::Tanh => h.tanh()?,
        })
    }
}

/// The kernels' name for the same function.
impl From<Activation> for crate::kernels::conv::Nonlinearity {
    fn from(a: Activation) -> Self {
        match a {
            Activation::Relu => Self::Relu,
            Activation::Sigmoid => Self::Sigmoid,
            Activation::Swish => Self::Swish,
            Activation::Tanh => Self::Tanh,
        }
    }
}

/// Architecture family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ModelKind {
    /// Fully connected layers.
    Mlp,
    /// LeNet-style: valid convolutions, each followed by the activation and a 2×2 max-pool,
    /// then fully connected layers.
    Cnn,
    /// Residual network ([`resnet`]): stem, stages of basic blocks, average pooling, a
    /// linear head.
    Resnet,
}

/// An architecture: what a preset file in `models/` describes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSpec {
    /// MLP, CNN or ResNet.
    pub kind: ModelKind,
    /// Widths of the hidden fully connected layers, input to output (none for a ResNet,
    /// whose head is linear).
    #[serde(default)]
    pub hidden: Vec<usize>,
    /// The nonlinearity after each hidden layer.
    pub activation: Activation,
    /// CNN only: output channels of each convolution, input to output.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conv: Vec<usize>,
    /// CNN only: side of the square convolution kernels.
    #[serde(default = "default_kernel_size")]
    pub kernel_size: usize,
    /// CNN only: zero pixels added on every side of each convolution's input (2 with a
    /// 5×5 kernel keeps the side, TensorFlow's "same"; 0, the default, is "valid").
    #[serde(default, skip_serializing_if = "is_zero")]
    pub padding: usize,
    /// ResNet only: channels of each stage (16, 32, 64 for the CIFAR ResNets).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stages: Vec<usize>,
    /// ResNet only: basic blocks per stage (depth 6·blocks + 2: 1 for ResNet-8, 3 for
    /// ResNet-20).
    #[serde(default = "default_blocks", skip_serializing_if = "is_one")]
    pub blocks: usize,
    /// ResNet only: the normalisation after each convolution.
    #[serde(default, skip_serializing_if = "is_frn")]
    pub norm: resnet::Norm,
}

/// Bounds of a preset's sizes (see [`ModelSpec::validate`]).
const MAX_WIDTH: usize = 1 << 16;
const MAX_LAYERS: usize = 64;
const MAX_KERNEL: usize = 31;

fn default_kernel_size() -> usize {
    5
}

fn default_blocks() -> usize {
    1
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

fn is_one(n: &usize) -> bool {
    *n == 1
}

fn is_frn(n: &resnet::Norm) -> bool {
    *n == resnet::Norm::Frn
}

/// The spatial shape of a CNN's layers on square single-channel images of side `side`:
/// for each convolution, (input channels, input side, output side before pooling).
pub(crate) fn conv_shapes(spec: &ModelSpec, side: usize) -> Result<Vec<ConvShape>> {
    let (mut channels, mut side_in) = (1, side);
    let mut shapes = Vec::with_capacity(spec.conv.len());
    let (k, pad) = (spec.kernel_size, spec.padding);
    for (l, &out) in spec.conv.iter().enumerate() {
        let padded = side_in + 2 * pad;
        if padded < k || (padded - k + 1) < 2 {
            return Err(Error::Config(format!(
                "convolution {} ({k}×{k} kernel, padding {pad}, then 2×2 pooling) does not fit its {side_in}×{side_in} input: \
                 use fewer convolutions or a smaller kernel_size",
                l + 1,
            )));
        }
        let conv_side = padded - k + 1;
        shapes.push(ConvShape {
            in_channels: channels,
            out_channels: out,
            kernel: k,
            pad,
            in_side: side_in,
            conv_side,
        });
        channels = out;
        side_in = conv_side / 2;
    }
    Ok(shapes)
}

/// One convolution of a CNN (stride 1, `pad` zeros on every side) and its 2×2 max-pool
/// (floor).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConvShape {
    /// Input channels.
    pub in_channels: usize,
    /// Output channels.
    pub out_channels: usize,
    /// Side of the square kernel.
    pub kernel: usize,
    /// Zero pixels added on every side of the input.
    pub pad: usize,
    /// Side of the (square) input.
    pub in_side: usize,
    /// Side of the convolution's output; the pooled output's is half of it (floor).
    pub conv_side: usize,
}

impl ConvShape {
    /// Side of the max-pooling window.
    pub(crate) fn pool_side(&self) -> usize {
        self.conv_side / 2
    }
    /// Inputs of one output pixel: C_in·k².
    pub fn patch(&self) -> usize {
        self.in_channels * self.kernel * self.kernel
    }
    /// Elements of one example's pooled output.
    pub(crate) fn pooled_len(&self) -> usize {
        self.out_channels * self.pool_side() * self.pool_side()
    }
}

/// The side of a square image of `dim` pixels.
pub(crate) fn image_side(dim: usize) -> Result<usize> {
    let side = (dim as f64).sqrt().round() as usize;
    if side * side != dim {
        return Err(Error::Config(format!(
            "a CNN needs square images; this dataset has {dim} pixels per image"
        )));
    }
    Ok(side)
}

impl Default for ModelSpec {
    fn default() -> Self {
        ModelSpec {
            kind: ModelKind::Mlp,
            hidden: vec![100],
            activation: Activation::Relu,
            conv: Vec::new(),
            kernel_size: default_kernel_size(),
            padding: 0,
            stages: Vec::new(),
            blocks: default_blocks(),
            norm: resnet::Norm::Frn,
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PresetFile {
    model: ModelSpec,
    /// The training defaults, read by `settings::Preset` (not the model's business).
    #[serde(default)]
    #[allow(dead_code)]
    train: Option<toml::Value>,
}

impl ModelSpec {
    /// Reads a preset (`[model]` table with `kind`, `hidden`, `activation`).
    pub fn from_toml_file(path: &std::path::Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        Self::from_toml_str(&text, &path.display().to_string())
    }

    /// The `[model]` table of preset text `text`, validated; `origin` names it in errors.
    pub fn from_toml_str(text: &str, origin: &str) -> Result<Self> {
        let preset: PresetFile = toml::from_str(text)
            .map_err(|e| Error::Config(format!("{origin}: not a model preset: {}", e.message())))?;
        preset.model.validate()?;
        Ok(preset.model)
    }

    /// The LeNet-style CNN of `models/lenet.toml` (embedded, so that `bnn bench train`
    /// runs it from any directory).
    pub fn lenet() -> Self {
        let preset: PresetFile = toml::from_str(include_str!("../../models/lenet.toml"))
            .expect("models/lenet.toml is a valid preset (tested)");
        preset.model
    }

    /// Refuses a spec that cannot be built, in one line naming the field.
    pub fn validate(&self) -> Result<()> {
        if self.kind != ModelKind::Resnet && !self.stages.is_empty() {
            return Err(Error::Config("`stages` is for kind = \"resnet\"".into()));
        }
        if self.kind != ModelKind::Resnet && self.activation == Activation::Swish {
            return Err(Error::Config(
                "activation = \"swish\" is for kind = \"resnet\"; use relu or sigmoid".into(),
            ));
        }
        // Far past any network this tool trains, so that a preset cannot ask for an
        // allocation that takes the machine down before anything is checked.
        let widths = self.hidden.iter().chain(&self.conv).chain(&self.stages);
        if let Some(w) = widths.clone().find(|&&w| w > MAX_WIDTH) {
            return Err(Error::Config(format!(
                "a layer of width or channel count {w}: at most {MAX_WIDTH}"
            )));
        }
        if widths.count() > MAX_LAYERS || self.blocks > MAX_LAYERS {
            return Err(Error::Config(format!(
                "more than {MAX_LAYERS} layers, stages or blocks per stage"
            )));
        }
        if self.kernel_size > MAX_KERNEL {
            return Err(Error::Config(format!(
                "kernel_size {}: at most {MAX_KERNEL}",
                self.kernel_size
            )));
        }
        if self.hidden.contains(&0) {
            return Err(Error::Config(format!(
                "hidden widths must be positive, got {:?}",
                self.hidden
            )));
        }
        self.validate_kind()
    }

    /// Refuses fields that the spec's kind does not take, or takes otherwise.
    fn validate_kind(&self) -> Result<()> {
        match self.kind {
            ModelKind::Mlp if !self.conv.is_empty() => Err(Error::Config(
                "`conv` is for kind = \"cnn\"; an MLP has no convolutions".into(),
            )),
            ModelKind::Cnn if self.conv.is_empty() || self.conv.contains(&0) => {
                Err(Error::Config(format!(
                    "a CNN needs at least one convolution with a positive channel count, \
                     got conv = {:?}",
                    self.conv
                )))
            }
            ModelKind::Cnn if self.kernel_size == 0 => {
                Err(Error::Config("kernel_size must be positive".into()))
            }
            ModelKind::Cnn if self.padding >= self.kernel_size => Err(Error::Config(format!(
                "padding {} must be smaller than kernel_size {} (2 keeps a 5×5 \
                 convolution's side)",
                self.padding, self.kernel_size
            ))),
            _ if self.kind != ModelKind::Cnn && self.padding != 0 => {
                Err(Error::Config("`padding` is for kind = \"cnn\"".into()))
            }
            ModelKind::Resnet if self.stages.is_empty() || self.stages.contains(&0) => {
                Err(Error::Config(format!(
                    "a ResNet needs at least one stage with a positive channel count, got \
                     stages = {:?}",
                    self.stages
                )))
            }
            ModelKind::Resnet if self.blocks == 0 => Err(Error::Config(
                "a ResNet needs at least one block per stage (blocks = 1 is ResNet-8)".into(),
            )),
            ModelKind::Resnet if !self.hidden.is_empty() || !self.conv.is_empty() => {
                Err(Error::Config(
                    "a ResNet takes `stages`, `blocks` and `norm`, not `hidden` or `conv` \
                     (its head is linear)"
                        .into(),
                ))
            }
            ModelKind::Resnet
                if matches!(self.activation, Activation::Sigmoid | Activation::Tanh) =>
            {
                Err(Error::Config(
                    "a ResNet's activation is relu or swish".into(),
                ))
            }
            _ => Ok(()),
        }
    }

    /// A short name such as `mlp-400-400-relu`.
    pub fn label(&self) -> String {
        let widths: Vec<String> = self.hidden.iter().map(|w| w.to_string()).collect();
        let act = match self.activation {
            Activation::Relu => "relu",
            Activation::Sigmoid => "sigmoid",
            Activation::Swish => "swish",
            Activation::Tanh => "tanh",
        };
        let mut parts = Vec::new();
        match self.kind {
            ModelKind::Resnet => {
                parts.push(format!("resnet{}", 6 * self.blocks + 2));
                parts.extend(self.stages.iter().map(|c| c.to_string()));
                parts.push(
                    match self.norm {
                        resnet::Norm::Frn => "frn",
                        resnet::Norm::None => "nonorm",
                    }
                    .to_string(),
                );
            }
            ModelKind::Mlp => parts.push("mlp".to_string()),
            ModelKind::Cnn => {
                parts.push(match self.padding {
                    0 => format!("cnn{}", self.kernel_size),
                    p => format!("cnn{}p{p}", self.kernel_size),
                });
                parts.push(
                    self.conv
                        .iter()
                        .map(|c| format!("c{c}"))
                        .collect::<Vec<_>>()
                        .join("-"),
                );
            }
        }
        parts.extend(widths);
        parts.push(act.to_string());
        parts.join("-")
    }
}

/// A named parameter tensor.
#[derive(Debug, Clone)]
pub struct Param {
    /// The parameter's name (`fc1.weight`, …): its key in sample files.
    pub name: String,
    /// Its values.
    pub var: Var,
}

/// 2×2 max-pooling with stride 2 (a trailing odd row or column dropped, as PyTorch does),
/// written with reshapes and reductions so that its backward is right. Why not candle's
/// `max_pool2d`: its backward (candle 0.11) multiplies the gradient by the window's
/// fraction of maxima (1/4 for a unique maximum) where it should divide by their count,
/// and spreads it by nearest-neighbour upsampling, which misplaces it when a side is odd.
/// Nor a plain max reduction: its backward gives every tied maximum the whole gradient,
/// and ties are common (a blank patch of an image gives four equal outputs). Here the
/// output is Σ mask·x / Σ mask over the window, mask = [x = max] held constant, so the
/// gradient is split evenly among tied maxima (PyTorch gives it all to the first; the
/// sum, and so every bias gradient, is the same).
fn max_pool2(h: &Tensor) -> Result<Tensor> {
    let (b, c, rows, cols) = h.dims4()?;
    let (pr, pc) = (rows / 2, cols / 2);
    let windows = h
        .narrow(2, 0, 2 * pr)?
        .narrow(3, 0, 2 * pc)?
        .contiguous()?
        .reshape((b, c, pr, 2, pc, 2))?;
    let max = windows.max_keepdim(5)?.max_keepdim(3)?;
    let mask = windows.broadcast_eq(&max)?.to_dtype(h.dtype())?.detach();
    let count = mask.sum_keepdim(5)?.sum_keepdim(3)?;
    let pooled = (windows * &mask)?
        .sum_keepdim(5)?
        .sum_keepdim(3)?
        .broadcast_div(&count)?;
    Ok(pooled.reshape((b, c, pr, pc))?)
}

/// A classifier network: an MLP (`Linear → act → ... → Linear`) or a CNN (`Conv → act →
/// MaxPool(2)`, repeated, then the same fully connected layers) to class logits.
#[derive(Debug, Clone)]
pub struct Network {
    /// The architecture.
    pub spec: ModelSpec,
    /// Input features (pixels × channels).
    pub input_dim: usize,
    /// Output classes.
    pub num_classes: usize,
    /// CNN only: the convolutions' shapes (empty for an MLP).
    pub convs: Vec<ConvShape>,
    /// `conv{k}.weight` (C_out × C_in × k × k) and `conv{k}.bias` (C_out), then `fc{k}.weight`
    /// (out × in) and `fc{k}.bias` (out), layer by layer; a ResNet's as
    /// [`resnet::ResnetLayout::new`] lists them.
    pub params: Vec<Param>,
    /// ResNet only: its layers and where their parameters are.
    pub resnet: Option<resnet::ResnetLayout>,
}

impl Network {
    /// A network with PyTorch's default initialisation, U(−1/√fan_in, 1/√fan_in), from `seed`
    /// (fan_in = C_in·k² for a convolution).
    pub fn new(
        spec: &ModelSpec,
        input_dim: usize,
        num_classes: usize,
        seed: u64,
        device: &Device,
    ) -> Result<Self> {
        spec.validate()?;
        if spec.kind == ModelKind::Resnet {
            // The IDX datasets' images: one channel, square.
            let side = image_side(input_dim)?;
            return Network::for_images(spec, [1, side, side], num_classes, seed, device);
        }
        let convs = match spec.kind {
            ModelKind::Cnn => conv_shapes(spec, image_side(input_dim)?)?,
            _ => Vec::new(),
        };
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut params = Vec::new();
        let mut push = |name: String, shape: Vec<usize>, fan_in: usize| -> Result<()> {
            let bound = 1.0 / (fan_in as f32).sqrt();
            let n = shape.iter().product();
            let data: Vec<f32> = (0..n).map(|_| rng.random_range(-bound..bound)).collect();
            let t = Tensor::from_vec(data, shape, device)?;
            params.push(Param {
                name,
                var: Var::from_tensor(&t)?,
            });
            Ok(())
        };
        for (k, c) in convs.iter().enumerate() {
            let shape = vec![c.out_channels, c.in_channels, c.kernel, c.kernel];
            push(format!("conv{}.weight", k + 1), shape, c.patch())?;
            push(
                format!("conv{}.bias", k + 1),
                vec![c.out_channels],
                c.patch(),
            )?;
        }
        let mut widths = vec![convs.last().map_or(input_dim, ConvShape::pooled_len)];
        widths.extend(&spec.hidden);
        widths.push(num_classes);
        for (k, pair) in widths.windows(2).enumerate() {
            let (fan_in, fan_out) = (pair[0], pair[1]);
            push(format!("fc{}.weight", k + 1), vec![fan_out, fan_in], fan_in)?;
            push(format!("fc{}.bias", k + 1), vec![fan_out], fan_in)?;
        }
        Ok(Network {
            spec: spec.clone(),
            input_dim,
            num_classes,
            convs,
            params,
            resnet: None,
        })
    }

    /// A ResNet on images of `image` = [channels, height, width] (inputs row-major, C·H·W
    /// per example), its parameters as [`resnet::ResnetLayout::new`] lists them, drawn
    /// from `seed` as [`Network::new`] draws an MLP's.
    pub fn for_images(
        spec: &ModelSpec,
        image: [usize; 3],
        num_classes: usize,
        seed: u64,
        device: &Device,
    ) -> Result<Self> {
        spec.validate()?;
        if spec.kind != ModelKind::Resnet {
            return Err(Error::Config(
                "internal: Network::for_images builds ResNets".into(),
            ));
        }
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let (layout, plans) = resnet::ResnetLayout::new(spec, image, num_classes)?;
        let mut params = Vec::with_capacity(plans.len());
        for plan in plans {
            let n = plan.shape.iter().product();
            let data: Vec<f32> = match plan.init {
                resnet::Init::Uniform { fan_in } => {
                    let bound = 1.0 / (fan_in as f32).sqrt();
                    (0..n).map(|_| rng.random_range(-bound..bound)).collect()
                }
                resnet::Init::Constant(v) => vec![v; n],
            };
            let t = Tensor::from_vec(data, plan.shape, device)?;
            params.push(Param {
                name: plan.name,
                var: Var::from_tensor(&t)?,
            });
        }
        Ok(Network {
            spec: spec.clone(),
            input_dim: image.iter().product(),
            num_classes,
            convs: Vec::new(),
            params,
            resnet: Some(layout),
        })
    }

    /// Widths of the fully connected layers, their input (the flattened pooled output of
    /// the last convolution for a CNN) first, classes last.
    pub fn fc_widths(&self) -> Vec<usize> {
        let mut widths = vec![self
            .convs
            .last()
            .map_or(self.input_dim, ConvShape::pooled_len)];
        widths.extend(&self.spec.hidden);
        widths.push(self.num_classes);
        widths
    }

    fn activate(&self, h: &Tensor) -> Result<Tensor> {
        self.spec.activation.apply(h)
    }

    /// Class logits for a batch `x` of shape (batch, input_dim) (a CNN's images row-major).
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if let Some(r) = &self.resnet {
            return r.forward(&self.params, x);
        }
        let mut h = x.clone();
        let convs = self.convs.len();
        if let Some(first) = self.convs.first() {
            h = h.reshape((x.dim(0)?, 1, first.in_side, first.in_side))?;
            for k in 0..convs {
                let w = self.params[2 * k].var.as_tensor();
                let b = self.params[2 * k + 1].var.as_tensor();
                let z = h
                    .conv2d(w, self.convs[k].pad, 1, 1, 1)?
                    .broadcast_add(&b.reshape((1, b.dim(0)?, 1, 1))?)?;
                h = max_pool2(&self.activate(&z)?)?;
            }
            h = h.flatten_from(1)?;
        }
        let layers = self.params.len() / 2 - convs;
        for k in 0..layers {
            let w = self.params[2 * (convs + k)].var.as_tensor();
            let b = self.params[2 * (convs + k) + 1].var.as_tensor();
            h = h.matmul(&w.t()?)?.broadcast_add(b)?;
            if k + 1 < layers {
                h = self.activate(&h)?;
            }
        }
        Ok(h)
    }

    /// The parameters' `Var`s in parameter order.
    pub fn vars(&self) -> Vec<Var> {
        self.params.iter().map(|p| p.var.clone()).collect()
    }

    /// Total number of scalar parameters.
    pub fn num_params(&self) -> usize {
        self.params.iter().map(|p| p.var.elem_count()).sum()
    }

    /// Whether every parameter is finite (a diverged sampler makes them inf or NaN).
    pub fn all_finite(&self) -> Result<bool> {
        Ok(self.first_non_finite()?.is_none())
    }

    /// The name of the first parameter tensor (in the model's order) holding a value that
    /// is not finite (or so large that its absolute sum overflows f32).
    pub fn first_non_finite(&self) -> Result<Option<String>> {
        for p in &self.params {
            let s = p
                .var
                .as_detached_tensor()
                .abs()?
                .sum_all()?
                .to_scalar::<f32>()?;
            if !s.is_finite() {
                return Ok(Some(p.name.clone()));
            }
        }
        Ok(None)
    }

    /// Overwrites the parameters with `tensors` (by name), checking every name and shape.
    pub fn load(&self, tensors: &std::collections::HashMap<String, Tensor>) -> Result<()> {
        for p in &self.params {
            let t = tensors.get(&p.name).ok_or_else(|| {
                Error::Checkpoint(format!("checkpoint lacks parameter `{}`", p.name))
            })?;
            if t.dims() != p.var.dims() {
                return Err(Error::Checkpoint(format!(
                    "parameter `{}` has shape {:?} in the checkpoint but {:?} in the model",
                    p.name,
                    t.dims(),
                    p.var.dims()
                )));
            }
            p.var
                .set(&t.to_dtype(DType::F32)?.to_device(p.var.device())?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_names_and_forward() {
        let spec = ModelSpec {
            kind: ModelKind::Mlp,
            hidden: vec![5, 4],
            activation: Activation::Sigmoid,
            ..ModelSpec::default()
        };
        let m = Network::new(&spec, 6, 3, 1, &Device::Cpu).unwrap();
        let names: Vec<_> = m.params.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "fc1.weight",
                "fc1.bias",
                "fc2.weight",
                "fc2.bias",
                "fc3.weight",
                "fc3.bias"
            ]
        );
        assert_eq!(m.num_params(), 6 * 5 + 5 + 5 * 4 + 4 + 4 * 3 + 3);
        let x = Tensor::ones((2, 6), DType::F32, &Device::Cpu).unwrap();
        assert_eq!(m.forward(&x).unwrap().dims(), &[2, 3]);
        assert_eq!(spec.label(), "mlp-5-4-sigmoid");
    }

    #[test]
    fn preset_parsing_rejects_unknown_keys() {
        let dir = tempfile::tempdir().unwrap();
        let good = dir.path().join("a.toml");
        std::fs::write(
            &good,
            "[model]\nkind = \"mlp\"\nhidden = [400, 400]\nactivation = \"relu\"\n",
        )
        .unwrap();
        assert_eq!(
            ModelSpec::from_toml_file(&good).unwrap().hidden,
            vec![400, 400]
        );
        let bad = dir.path().join("b.toml");
        std::fs::write(
            &bad,
            "[model]\nkind = \"mlp\"\nhiden = [4]\nactivation = \"relu\"\n",
        )
        .unwrap();
        let e = ModelSpec::from_toml_file(&bad).unwrap_err().to_string();
        assert!(e.contains("not a model preset"), "{e}");
    }

    #[test]
    fn lenet_preset_shapes_and_invalid_cnns() {
        let spec = ModelSpec::lenet();
        assert_eq!(spec.label(), "cnn5p2-c6-c16-120-84-relu");
        let m = Network::new(&spec, 784, 10, 0, &Device::Cpu).unwrap();
        let shapes: Vec<_> = m.params.iter().map(|p| p.var.dims().to_vec()).collect();
        assert_eq!(shapes[0], [6, 1, 5, 5]);
        assert_eq!(shapes[2], [16, 6, 5, 5]);
        // Padded by 2: 28 → 28 → 14 → 14 → 7: 16·7·7 = 784 features.
        assert_eq!(shapes[4], [120, 784]);
        assert_eq!(m.num_params(), 107_786);
        // Unpadded: 28 → 24 → 12 → 8 → 4, 256 features.
        let valid = Network::new(
            &ModelSpec {
                padding: 0,
                ..spec.clone()
            },
            784,
            10,
            0,
            &Device::Cpu,
        )
        .unwrap();
        assert_eq!(valid.params[4].var.dims(), [120, 256]);
        assert_eq!(valid.num_params(), 44_426);
        let x = Tensor::ones((3, 784), DType::F32, &Device::Cpu).unwrap();
        assert_eq!(m.forward(&x).unwrap().dims(), &[3, 10]);

        let err = |spec: ModelSpec, dim: usize| {
            Network::new(&spec, dim, 10, 0, &Device::Cpu)
                .unwrap_err()
                .to_string()
        };
        let e = err(
            ModelSpec {
                conv: vec![4],
                ..ModelSpec::default()
            },
            784,
        );
        assert!(e.contains("kind = \"cnn\""), "{e}");
        let e = err(
            ModelSpec {
                conv: vec![],
                ..spec.clone()
            },
            784,
        );
        assert!(e.contains("at least one convolution"), "{e}");
        // Unpadded, a third 5×5 convolution meets a 4×4 map; padded, the fifth a 1×1 one
        // (28 → 14 → 7 → 3 → 1 through the pools).
        let e = err(
            ModelSpec {
                conv: vec![6, 16, 32],
                padding: 0,
                ..spec.clone()
            },
            784,
        );
        assert!(e.contains("convolution 3"), "{e}");
        let e = err(
            ModelSpec {
                conv: vec![6, 16, 32, 32, 32],
                ..spec.clone()
            },
            784,
        );
        assert!(e.contains("convolution 5"), "{e}");
        let e = err(spec, 780);
        assert!(e.contains("square images"), "{e}");
    }
}
