//! The step plan: a network's whole SG-MCMC update as a fixed list of operations over
//! buffers allocated once, so that an update on a GPU is a dozen launches with no host
//! read and no allocation, and can be captured as a CUDA graph and replayed.
//!
//! A [`Plan`] is data: its buffers ([`BufferSpec`]) and its operations ([`Op`]), each a
//! GEMM in cuBLAS's conventions (column-major, transposes, leading dimensions,
//! strided-batched over K chains) or one kernel of `kernels/step_plan.h` over its grid.
//! Nothing that changes from update to update is in an operation: the Philox step, the
//! constants of the next update, the minibatch's offset, λ/T and the likelihood's scale
//! live in each chain's control block ([`ChainControl`]), a device buffer that the
//! kernels read and the update's last kernel advances. Two executors run a plan: the host
//! one ([`host`], the kernels' sources compiled for the host, the test double) and the
//! CUDA one (feature `cuda`).
//!
//! [`mlp`] builds the plan of an MLP (784-100-10 at batch 100: 13 launches an update,
//! for 1 chain or 64).

#[cfg(feature = "cuda")]
pub mod cuda;
pub mod executor;
pub mod host;
pub mod mlp;

pub use executor::{Executor, Plain};

/// An activation of the plan's kernels (`BNN_ACT_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(i32)]
pub enum Act {
    /// x (an output layer's error sums).
    Identity = 0,
    /// max(0, x).
    Relu = 1,
    /// 1/(1 + e^{−x}).
    Sigmoid = 2,
    /// tanh x.
    Tanh = 3,
}

/// Which bookkeeping the update's last kernel does for a chain (`BNN_PLAN_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum Bookkeeping {
    /// SGLD: fixed constants, no momentum.
    Sgld = 0,
    /// SGHMC: a fixed friction α.
    Sghmc = 1,
    /// SGNHT: α ← α + vᵀv/n − η after every update (Ding et al. 2014, Alg. 2).
    Sgnht = 2,
    /// mSGNHT: one αᵢ per element; the control block keeps their mean.
    Msgnht = 3,
    /// pSGLD: β and λ as the constants.
    Psgld = 4,
}

/// The most parameter tensors a plan's fused update takes (`BNN_PLAN_MAX_TENSORS`).
pub const MAX_TENSORS: usize = 16;
/// Values of a held-out row's score (`BNN_PLAN_SCORE`): hit, ln max(p_y, 10⁻¹²), the
/// Brier sum, the confidence, 1 where finite.
pub const SCORE: usize = 5;
/// Bins of the calibration error (`BNN_PLAN_ECE_BINS`).
pub const ECE_BINS: usize = 15;
/// Values of a tally (`BNN_PLAN_TALLY`): hits, the NLL, the Brier sum, the rows not
/// finite, then per bin its rows, its confidences and its hits.
pub const TALLY: usize = 4 + 3 * ECE_BINS;
/// Threads of an update chunk (`BNN_PLAN_CHUNK`), each one Philox block of 4 elements.
pub const CHUNK: usize = 256;

/// One chain's control block, `bnn_plan_chain` of `kernels/step_plan.h` field for field:
/// what changes from update to update, in device memory.
#[derive(Debug, Clone, Copy, Default)]
#[repr(C)]
pub struct ChainControl {
    /// The Philox key.
    pub seed: u64,
    /// Updates done: the Philox counter of the next update's noise.
    pub step: u64,
    /// Updates run in this epoch.
    pub updates: u64,
    /// η of the next update.
    pub eta: f64,
    /// The η that v is scaled for (the last update's).
    pub eta_v: f64,
    /// SGHMC's friction α.
    pub friction: f64,
    /// SGNHT's and mSGNHT's a.
    pub diffusion: f64,
    /// pSGLD's β.
    pub decay: f64,
    /// pSGLD's λ.
    pub damping: f64,
    /// SGNHT's α (mSGNHT: the mean αᵢ).
    pub thermostat: f64,
    /// ½vᵀv/(nη) after the last update.
    pub kinetic: f64,
    /// n, the parameters of one chain.
    pub n_params: f64,
    /// A Gaussian likelihood's B·(log √(2π) − ½ log τ).
    pub nll_const: f64,
    /// The last minibatch's mean NLL.
    pub nll: f64,
    /// The epoch's sum of its minibatches' mean NLL times B (`Position::nll_sum`).
    pub epoch_nll: f64,
    /// The epoch's arg-max hits.
    pub epoch_correct: f64,
    /// The epoch's squared errors (a regression).
    pub epoch_sse: f64,
    /// The epoch's sum of the kinetic energies after its updates (momentum rules).
    pub epoch_kinetic: f64,
    /// The last update's Σv², Σα and Σθ·∇ per tensor.
    pub sums: [[f64; 3]; MAX_TENSORS],
    /// Σθ·∇ per tensor of the epoch's first update (the configurational temperature's).
    pub first_virials: [f64; MAX_TENSORS],
    /// The next update's constants (η, decay, post, σ: `bnn_step_consts`).
    pub consts: [f32; 4],
    /// λ_t/T per tensor.
    pub prior: [f32; MAX_TENSORS],
    /// N/(B·T), the factor on the likelihood's summed gradient.
    pub scale: f32,
    /// τ, a Gaussian likelihood's noise precision.
    pub precision: f32,
    /// √(η/η_v): v's factor before the next update (1 where η is unchanged).
    pub rescale: f32,
    /// The next minibatch's first row in the chain's row of the epoch's index.
    pub offset: u32,
    /// 1 once a loss was not finite: no update since.
    pub halted: u32,
    /// [`Bookkeeping`] as its code.
    pub sampler: u32,
    /// 1 for the splitting integrator's constants.
    pub splitting: u32,
    /// Explicit padding: the block has no implicit padding, so it is copied as bytes.
    pub pad: u32,
}

/// The fused update's tensor table, `bnn_plan_table` of `kernels/step_plan.h`.
#[derive(Debug, Clone, Copy, Default)]
#[repr(C)]
pub struct TensorTable {
    /// Tensor t's first element in a chain's P.
    pub offsets: [u64; MAX_TENSORS],
    /// Tensor t's elements.
    pub n: [u64; MAX_TENSORS],
    /// Tensor t's first chunk; entry `tensors` is the chunks in all.
    pub chunk_start: [u32; MAX_TENSORS + 1],
    /// Tensors.
    pub tensors: u32,
    /// The element rule, `Update::rule`.
    pub rule: u32,
    /// Explicit padding before `p`.
    pub pad: u32,
    /// P, the parameters of one chain.
    pub p: u64,
}

impl TensorTable {
    /// The table of tensors of `sizes` elements, laid out one after the other, under
    /// `rule`.
    pub fn new(sizes: &[usize], rule: i32) -> crate::Result<Self> {
        if sizes.len() > MAX_TENSORS {
            return Err(crate::Error::Config(format!(
                "the step plan takes at most {MAX_TENSORS} parameter tensors, not {}",
                sizes.len()
            )));
        }
        let mut t = TensorTable {
            tensors: sizes.len() as u32,
            rule: rule as u32,
            ..TensorTable::default()
        };
        let (mut offset, mut chunk) = (0u64, 0u32);
        for (i, &n) in sizes.iter().enumerate() {
            t.offsets[i] = offset;
            t.n[i] = n as u64;
            t.chunk_start[i] = chunk;
            offset += n as u64;
            chunk += n.div_ceil(4 * CHUNK) as u32;
        }
        t.chunk_start[sizes.len()] = chunk;
        t.p = offset;
        Ok(t)
    }

    /// Chunks in all (the update's grid along x).
    pub fn chunks(&self) -> usize {
        self.chunk_start[self.tensors as usize] as usize
    }
}

/// What a buffer holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Elem {
    /// f32 values.
    F32,
    /// f64 values (the update's partial sums).
    F64,
    /// u32 values (labels, the epoch's index).
    U32,
    /// [`ChainControl`]s, one a chain.
    Control,
    /// One [`TensorTable`].
    Table,
}

impl Elem {
    /// Bytes of one element.
    pub fn bytes(self) -> usize {
        match self {
            Elem::F32 | Elem::U32 => 4,
            Elem::F64 => 8,
            Elem::Control => std::mem::size_of::<ChainControl>(),
            Elem::Table => std::mem::size_of::<TensorTable>(),
        }
    }
}

/// A buffer of the workspace, by its index in [`Plan::buffers`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Buf(pub usize);

/// One buffer: allocated once per run, before the first update.
#[derive(Debug, Clone)]
pub struct BufferSpec {
    /// What it is (`theta`, `act1`, …).
    pub name: String,
    /// Its elements.
    pub len: usize,
    /// Their kind.
    pub elem: Elem,
}

/// A place in a buffer: its element `offset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct At {
    /// The buffer.
    pub buf: Buf,
    /// The first element.
    pub offset: usize,
}

impl Buf {
    /// The buffer from its first element.
    pub fn at(self, offset: usize) -> At {
        At { buf: self, offset }
    }
}

/// A strided-batched GEMM in cuBLAS's conventions: for each of `batch` problems i,
/// C_i ← op(A_i)·op(B_i) (+ C_i with `accumulate`), column-major, C_i (m × n) at
/// c + i·stride_c with leading dimension ldc, op(A_i) (m × k), op(B_i) (k × n).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gemm {
    /// op(A) = Aᵀ.
    pub transa: bool,
    /// op(B) = Bᵀ.
    pub transb: bool,
    /// Rows of C.
    pub m: usize,
    /// Columns of C.
    pub n: usize,
    /// The inner dimension.
    pub k: usize,
    /// A, its leading dimension and its stride between problems.
    pub a: (At, usize, usize),
    /// B, likewise.
    pub b: (At, usize, usize),
    /// C, likewise.
    pub c: (At, usize, usize),
    /// Problems (K chains).
    pub batch: usize,
    /// C ← C + op(A)·op(B) (β = 1) instead of β = 0.
    pub accumulate: bool,
}

/// One operation of a plan: a GEMM, or a kernel of `kernels/step_plan.h` over its grid.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// The product of a layer (`bnn_plan_*` has none: cuBLAS, or the host's GEMM).
    Gemm(Gemm),
    /// x ← the minibatch's rows of the resident data (K × B × D items).
    Gather {
        /// x, data, the epoch's index, the control blocks.
        bufs: [Buf; 4],
        /// The index's row length M, the batch B, the features D, the chains K.
        dims: [usize; 4],
    },
    /// h ← act(z + bias) in place (K × B × w items).
    BiasAct {
        /// h (= z), the bias's first element in θ.
        h: Buf,
        /// The layer's bias in θ.
        bias: At,
        /// P, B, w, K.
        dims: [usize; 4],
        /// The activation.
        act: Act,
    },
    /// Softmax cross-entropy with its error and per-row loss (K × B items).
    SoftmaxXent {
        /// z, delta, loss, hit, labels, index, control blocks.
        bufs: [Buf; 7],
        /// The output bias in θ.
        bias: At,
        /// P, M, B, classes, K.
        dims: [usize; 5],
    },
    /// A held-out chunk's class probabilities: softmax(z + bias) into its rows of the
    /// set's K × N × classes (K × rows items). Not an update's: the ensemble's forward.
    SoftmaxProbs {
        /// probs (K × N × classes), z (K × rows × classes).
        bufs: [Buf; 2],
        /// The output bias in θ.
        bias: At,
        /// P, N (the set's rows), the chunk's first row, its rows, classes, K.
        dims: [usize; 6],
    },
    /// A held-out set's probabilities folded into every chain's ensemble: Σp and ΣH per
    /// example, and each row's score alone and in the ensemble (K × N items).
    EnsembleFold {
        /// Σp (K × N × classes, f64), ΣH (K × N, f64), the scores (K × 2 × N ×
        /// [`SCORE`], f64), probs (K × N × classes), the labels (N), the samples so far
        /// (K, f64).
        bufs: [Buf; 6],
        /// N, classes, K.
        dims: [usize; 3],
    },
    /// Each chain's scores summed in row order into its two tallies ([`TALLY`] values
    /// each: the sample alone, the ensemble), its sample counted (K × 2 items).
    EnsembleTally {
        /// The tallies (K × 2 × [`TALLY`], f64), the samples (K, f64), the scores.
        bufs: [Buf; 3],
        /// N, K.
        dims: [usize; 2],
    },
    /// A Gaussian likelihood's error and residual (K × B items).
    Gaussian {
        /// z, delta, loss, hit, targets, index, control blocks.
        bufs: [Buf; 7],
        /// The output bias in θ.
        bias: At,
        /// P, M, B, K.
        dims: [usize; 4],
    },
    /// delta ← act′ ⊙ dh (in place) and the bias gradient's column sums (K × w items).
    BackwardColumns {
        /// delta (= dh), the activations a (delta itself for the identity).
        bufs: [Buf; 2],
        /// The bias's gradient.
        grad_bias: At,
        /// P, B, w, K.
        dims: [usize; 4],
        /// The activation whose derivative multiplies (identity at the output).
        act: Act,
    },
    /// The minibatch's loss into the control blocks; a non-finite one halts (K items).
    ReduceLoss {
        /// loss, hit, control blocks.
        bufs: [Buf; 3],
        /// B, K.
        dims: [usize; 2],
        /// The rows hold residuals of a Gaussian likelihood.
        gaussian: bool,
    },
    /// The fused update of every tensor of every chain ((chunks, K) blocks of [`CHUNK`]).
    Update {
        /// θ, ∇, the table, the partial sums, the control blocks.
        bufs: [Buf; 5],
        /// The momentum v and the per-element state (αᵢ or Vᵢ), where the rule has them.
        states: (Option<Buf>, Option<Buf>),
        /// K, chunks.
        dims: [usize; 2],
    },
    /// The update's sums, the samplers' bookkeeping and the next constants (K items).
    Finish {
        /// control blocks, partial sums, the table, the epoch's η table (K × U).
        bufs: [Buf; 4],
        /// B, K, U (updates per epoch).
        dims: [usize; 3],
    },
}

impl Op {
    /// A short name for the plan's table.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Gemm(_) => "gemm",
            Op::Gather { .. } => "gather",
            Op::BiasAct { .. } => "bias+act",
            Op::SoftmaxXent { .. } => "softmax-xent",
            Op::SoftmaxProbs { .. } => "softmax",
            Op::EnsembleFold { .. } => "ensemble-fold",
            Op::EnsembleTally { .. } => "ensemble-tally",
            Op::Gaussian { .. } => "gaussian",
            Op::BackwardColumns { .. } => "act'+bias-sums",
            Op::ReduceLoss { .. } => "loss-sums",
            Op::Update { .. } => "update",
            Op::Finish { .. } => "finish",
        }
    }
}

/// A plan: buffers allocated once and the operations of one update, in order.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The workspace.
    pub buffers: Vec<BufferSpec>,
    /// One update's operations, each one launch.
    pub ops: Vec<Op>,
}

impl Plan {
    /// A new buffer of `len` elements of `elem`.
    pub fn buffer(&mut self, name: impl Into<String>, len: usize, elem: Elem) -> Buf {
        self.buffers.push(BufferSpec {
            name: name.into(),
            len,
            elem,
        });
        Buf(self.buffers.len() - 1)
    }

    /// Launches per update: one per operation.
    pub fn launches(&self) -> usize {
        self.ops.len()
    }

    /// Bytes of the workspace.
    pub fn workspace_bytes(&self) -> usize {
        self.buffers.iter().map(|b| b.len * b.elem.bytes()).sum()
    }
}

pub mod traffic;

#[cfg(test)]
mod tests;
