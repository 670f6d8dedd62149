//! The convolution passes of the ResNet models on the CPU: im2col and col2im, direct 3×3
//! convolutions, FRN + TLU and the activations, on the planes of a batch. `bnn-core`'s
//! ResNet backward (`backprop::resnet`) composes them with the matrix product.

pub mod direct;
pub mod ops;

/// FRN's ε, added to the mean square (Singh & Krishnan use 1e-6 for planes larger than
/// 1×1).
pub const FRN_EPSILON: f32 = 1e-6;

/// The shape of one convolution (square kernel, zero padding kernel/2: "same" at stride 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConvGeometry {
    /// C_in, planes of the input.
    pub in_channels: usize,
    /// C_out, planes of the output.
    pub out_channels: usize,
    /// k, the side of the square kernel.
    pub kernel: usize,
    /// s, the stride.
    pub stride: usize,
    /// p = k/2, the zero padding on each side.
    pub pad: usize,
    /// Input height.
    pub in_h: usize,
    /// Input width.
    pub in_w: usize,
    /// Output height, (H + 2p − k)/s + 1.
    pub out_h: usize,
    /// Output width, (W + 2p − k)/s + 1.
    pub out_w: usize,
}

impl ConvGeometry {
    /// A convolution of `in_channels` planes of `in_hw` pixels to `out_channels`, with a
    /// `kernel`×`kernel` kernel at `stride`.
    pub fn new(
        in_channels: usize,
        out_channels: usize,
        kernel: usize,
        stride: usize,
        in_hw: [usize; 2],
    ) -> Self {
        let pad = kernel / 2;
        let out = |n: usize| (n + 2 * pad - kernel) / stride + 1;
        ConvGeometry {
            in_channels,
            out_channels,
            kernel,
            stride,
            pad,
            in_h: in_hw[0],
            in_w: in_hw[1],
            out_h: out(in_hw[0]),
            out_w: out(in_hw[1]),
        }
    }
    /// Inputs of one output pixel: C_in·k².
    pub fn patch(&self) -> usize {
        self.in_channels * self.kernel * self.kernel
    }
    /// Pixels of one input plane.
    pub fn in_plane(&self) -> usize {
        self.in_h * self.in_w
    }
    /// Pixels of one output plane.
    pub fn out_plane(&self) -> usize {
        self.out_h * self.out_w
    }
}

/// The element-wise nonlinearity after a convolution (`bnn-core`'s `model::Activation`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Nonlinearity {
    /// max(0, x).
    Relu,
    /// 1/(1 + e^{−x}).
    Sigmoid,
    /// x·σ(x).
    Swish,
    /// tanh(x).
    Tanh,
}
