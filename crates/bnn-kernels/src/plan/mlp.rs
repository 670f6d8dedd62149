//! The plan of an MLP's update: L linear layers of widths w₀ = D, …, w_L (classes, or
//! one output of a Gaussian likelihood), K chains at batch B. Activations are row-major
//! B × w per chain, so in cuBLAS's column-major terms a layer's output is w × B and its
//! weight W (w_out × w_in, row-major) is w_in × w_out: the forward is Z = Wᵀ·X, the weight
//! gradient ∇W = X·Δᵀ and the input error ΔX = W·Δ, each one strided-batched GEMM over
//! the chains (stride P in θ). Launches: 1 gather, per layer a GEMM, a bias+activation
//! (the output's bias is in the likelihood's kernel), the likelihood, the loss sums, per
//! layer the error's column sums and the weight gradient, per layer but the first the
//! input error, the fused update and its finish: 5L + 3, 13 for one hidden layer.
//!
//! A classifier's held-out sets ([`HeldOut`]) get the forward part alone, outside the
//! update: chunks of R rows, per layer a GEMM (every chain's B the same rows, stride 0)
//! and a bias+activation, the output's softmax into every chain's probabilities; then
//! the fold of those probabilities into every chain's ensemble sums on the device and the
//! tally of the sample's metrics alone and the ensemble's (`kernels/plan_ensemble.h`).

use super::{Act, At, Buf, Elem, Gemm, Op, Plan, TensorTable, SCORE, TALLY};
use crate::update::Update;

/// What the plan of an MLP is built for.
#[derive(Debug, Clone, PartialEq)]
pub struct MlpShape {
    /// w₀ (the input's features), the hidden widths, the outputs.
    pub widths: Vec<usize>,
    /// The hidden layers' activation.
    pub act: Act,
    /// B, rows of a minibatch.
    pub batch: usize,
    /// K, chains stepped together.
    pub chains: usize,
    /// N, rows of the resident training set.
    pub rows: usize,
    /// M, the length of a chain's row of the epoch's index (its minibatches' rows).
    pub epoch_rows: usize,
    /// The element update of the sampler.
    pub update: Update,
    /// A Gaussian likelihood (one output) instead of softmax cross-entropy.
    pub gaussian: bool,
    /// Rows of each held-out set whose class probabilities the plan computes (the test
    /// set, the validation set): a classifier's ensemble on the device.
    pub held_out: Vec<usize>,
}

impl MlpShape {
    /// The parameter tensors' sizes in the model's order: W₁, b₁, W₂, b₂, …
    pub fn tensor_sizes(&self) -> Vec<usize> {
        self.widths
            .windows(2)
            .flat_map(|w| [w[0] * w[1], w[1]])
            .collect()
    }

    /// U, the updates of an epoch: M / B.
    pub fn updates_per_epoch(&self) -> usize {
        self.epoch_rows / self.batch
    }

    /// Linear layers.
    pub fn layers(&self) -> usize {
        self.widths.len() - 1
    }
}

/// The buffers of an MLP's plan, by role.
#[derive(Debug, Clone)]
pub struct MlpBuffers {
    /// The resident training set, N × D.
    pub data: Buf,
    /// Its labels (u32) or a regression's targets (f32), N.
    pub targets: Buf,
    /// The epoch's minibatch rows, K × M.
    pub index: Buf,
    /// The chains' control blocks, K.
    pub control: Buf,
    /// The update's tensor table.
    pub table: Buf,
    /// The minibatch, K × B × D.
    pub x: Buf,
    /// Layer l's output (z, then h in place), K × B × w_l, l = 1..L.
    pub acts: Vec<Buf>,
    /// Layer l's error, K × B × w_l.
    pub deltas: Vec<Buf>,
    /// θ, ∇ (the likelihood's part), K × P.
    pub theta: Buf,
    /// ∇, K × P.
    pub grad: Buf,
    /// v, K × P (rules with a momentum).
    pub momentum: Option<Buf>,
    /// αᵢ or Vᵢ, K × P (rules with a per-element state).
    pub per_element: Option<Buf>,
    /// Per-row loss and arg-max hits, K × B each.
    pub loss: Buf,
    /// Per-row hits.
    pub hit: Buf,
    /// The update's per-chunk sums, K × chunks × 3 (f64).
    pub partials: Buf,
    /// The schedule's η of each of the epoch's updates, K × U (f64), written when an
    /// epoch opens: the finish reads the next update's.
    pub etas: Buf,
}

/// Rows of all K chains in one chunk of a held-out set's forward pass: its activations
/// hold K × R rows, R = this / K (at least 16, at most the largest set's rows).
pub const PREDICT_ROWS: usize = 8192;

/// A held-out set on the device, the forward pass of its rows to every chain's class
/// probabilities, and every chain's ensemble of its samples on it.
#[derive(Debug, Clone)]
pub struct HeldOut {
    /// N, its rows.
    pub rows: usize,
    /// Its features, N × D, written once.
    pub data: Buf,
    /// Its labels, N (u32), written once.
    pub labels: Buf,
    /// Chain k's probabilities of row r at (k·N + r)·classes: K × N × classes.
    pub probs: Buf,
    /// Chunk by chunk of R rows: per layer its product (every chain reading the same
    /// rows: B's stride 0) and bias+activation, the output's softmax into `probs`.
    pub ops: Vec<Op>,
    /// Chain k's ensemble: Σₖ p per example and class (K × N × classes, f64) and Σₖ H(p)
    /// per example (K × N, f64), as `ensemble::Sums` holds them.
    pub sums: (Buf, Buf),
    /// Samples folded in so far, per chain (K, f64).
    pub samples: Buf,
    /// Each row's score alone and in the ensemble (K × 2 × N × [`SCORE`], f64).
    pub scores: Buf,
    /// Per chain its sample's tally and its ensemble's (K × 2 × [`TALLY`], f64): what the
    /// host reads at a kept sample.
    pub tallies: Buf,
    /// After `ops`: the fold of `probs` into the sums and the tallies (2 launches).
    pub fold: Vec<Op>,
}

/// An MLP's plan with its buffers' roles and its tensor table.
#[derive(Debug, Clone)]
pub struct MlpPlan {
    /// The operations and buffers.
    pub plan: Plan,
    /// What it was built for.
    pub shape: MlpShape,
    /// The update's tensor table (the `table` buffer's one value).
    pub table: TensorTable,
    /// The buffers by role.
    pub bufs: MlpBuffers,
    /// The held-out sets of `shape.held_out`, in its order.
    pub held_out: Vec<HeldOut>,
}

impl MlpPlan {
    /// The plan of one update of `shape`.
    pub fn new(shape: MlpShape) -> crate::Result<Self> {
        check(&shape)?;
        let sizes = shape.tensor_sizes();
        let table = TensorTable::new(&sizes, shape.update.rule())?;
        let (k, b, p) = (shape.chains, shape.batch, table.p as usize);
        let mut plan = Plan {
            buffers: Vec::new(),
            ops: Vec::new(),
        };
        let d = shape.widths[0];
        let target_elem = if shape.gaussian { Elem::F32 } else { Elem::U32 };
        let (has_v, has_s) = shape.update.states();
        let bufs = MlpBuffers {
            data: plan.buffer("data", shape.rows * d, Elem::F32),
            targets: plan.buffer("targets", shape.rows, target_elem),
            index: plan.buffer("index", k * shape.epoch_rows, Elem::U32),
            control: plan.buffer("control", k, Elem::Control),
            table: plan.buffer("table", 1, Elem::Table),
            x: plan.buffer("x", k * b * d, Elem::F32),
            acts: (1..shape.widths.len())
                .map(|l| plan.buffer(format!("h{l}"), k * b * shape.widths[l], Elem::F32))
                .collect(),
            deltas: (1..shape.widths.len())
                .map(|l| plan.buffer(format!("δ{l}"), k * b * shape.widths[l], Elem::F32))
                .collect(),
            theta: plan.buffer("θ", k * p, Elem::F32),
            grad: plan.buffer("∇", k * p, Elem::F32),
            momentum: has_v.then(|| plan.buffer("v", k * p, Elem::F32)),
            per_element: has_s.then(|| plan.buffer("αᵢ|Vᵢ", k * p, Elem::F32)),
            loss: plan.buffer("loss", k * b, Elem::F32),
            hit: plan.buffer("hit", k * b, Elem::F32),
            partials: plan.buffer("partials", k * table.chunks() * 3, Elem::F64),
            etas: plan.buffer("η", k * shape.updates_per_epoch(), Elem::F64),
        };
        let mut mlp = MlpPlan {
            plan,
            shape,
            table,
            bufs,
            held_out: Vec::new(),
        };
        mlp.forward();
        mlp.backward();
        mlp.update();
        mlp.predictions();
        Ok(mlp)
    }

    /// θ's place of tensor t (W_l is 2(l − 1), b_l is 2l − 1).
    fn param(&self, t: usize) -> At {
        self.bufs.theta.at(self.table.offsets[t] as usize)
    }

    fn grad_of(&self, t: usize) -> At {
        self.bufs.grad.at(self.table.offsets[t] as usize)
    }

    /// Layer l's input (l = 1: the minibatch) with its width.
    fn input(&self, l: usize) -> (Buf, usize) {
        match l {
            1 => (self.bufs.x, self.shape.widths[0]),
            _ => (self.bufs.acts[l - 2], self.shape.widths[l - 1]),
        }
    }

    fn forward(&mut self) {
        let s = &self.shape;
        let (k, b, p, m) = (s.chains, s.batch, self.table.p as usize, s.epoch_rows);
        let bf = &self.bufs;
        let gather = Op::Gather {
            bufs: [bf.x, bf.data, bf.index, bf.control],
            dims: [m, b, s.widths[0], k],
        };
        let mut ops = vec![gather];
        let layers = s.layers();
        for l in 1..=layers {
            let (input, w_in) = self.input(l);
            let w_out = s.widths[l];
            let h = self.bufs.acts[l - 1];
            ops.push(self.product(l, (input.at(0), b * w_in), h, b));
            let bias = self.param(2 * l - 1);
            if l < layers {
                ops.push(Op::BiasAct {
                    h,
                    bias,
                    dims: [p, b, w_out, k],
                    act: s.act,
                });
                continue;
            }
            let bf = &self.bufs;
            let delta = bf.deltas[l - 1];
            let bufs = [h, delta, bf.loss, bf.hit, bf.targets, bf.index, bf.control];
            ops.push(match s.gaussian {
                true => Op::Gaussian {
                    bufs,
                    bias,
                    dims: [p, m, b, k],
                },
                false => Op::SoftmaxXent {
                    bufs,
                    bias,
                    dims: [p, m, b, w_out, k],
                },
            });
            ops.push(Op::ReduceLoss {
                bufs: [bf.loss, bf.hit, bf.control],
                dims: [b, k],
                gaussian: s.gaussian,
            });
        }
        self.plan.ops.extend(ops);
    }

    /// Layer l's product of `rows` rows of `input` (its stride between chains) into `h`:
    /// Z = Wᵀ·X for every chain at once.
    fn product(&self, l: usize, (input, stride): (At, usize), h: Buf, rows: usize) -> Op {
        let (w_in, w_out) = (self.shape.widths[l - 1], self.shape.widths[l]);
        Op::Gemm(Gemm {
            transa: true,
            transb: false,
            m: w_out,
            n: rows,
            k: w_in,
            a: (self.param(2 * (l - 1)), w_in, self.table.p as usize),
            b: (input, w_in, stride),
            c: (h.at(0), w_out, rows * w_out),
            batch: self.shape.chains,
            accumulate: false,
        })
    }

    /// The held-out sets' buffers and forward passes, chunk by chunk; their activations'
    /// buffers shared (the sets are predicted one after the other).
    fn predictions(&mut self) {
        let s = self.shape.clone();
        let Some(&most) = s.held_out.iter().max() else {
            return;
        };
        let (k, d, classes) = (s.chains, s.widths[0], s.widths[s.layers()]);
        let r = (PREDICT_ROWS / k).max(16).min(most);
        let acts: Vec<Buf> = (1..s.widths.len())
            .map(|l| {
                self.plan
                    .buffer(format!("p{l}"), k * r * s.widths[l], Elem::F32)
            })
            .collect();
        for (i, &n) in s.held_out.iter().enumerate() {
            let data = self.plan.buffer(format!("held-out {i}"), n * d, Elem::F32);
            let probs = self
                .plan
                .buffer(format!("probs {i}"), k * n * classes, Elem::F32);
            let mut ops = Vec::new();
            for r0 in (0..n).step_by(r) {
                let rows = r.min(n - r0);
                ops.extend(self.forward_rows(data.at(r0 * d), &acts, rows, (probs, n, r0)));
            }
            let mut buf =
                |what: &str, len, elem| self.plan.buffer(format!("{what} {i}"), len, elem);
            let labels = buf("held-out labels", n, Elem::U32);
            let sums = (
                buf("Σp", k * n * classes, Elem::F64),
                buf("ΣH", k * n, Elem::F64),
            );
            let samples = buf("samples", k, Elem::F64);
            let scores = buf("scores", k * 2 * n * SCORE, Elem::F64);
            let tallies = buf("tallies", k * 2 * TALLY, Elem::F64);
            let fold = vec![
                Op::EnsembleFold {
                    bufs: [sums.0, sums.1, scores, probs, labels, samples],
                    dims: [n, classes, k],
                },
                Op::EnsembleTally {
                    bufs: [tallies, samples, scores],
                    dims: [n, k],
                },
            ];
            self.held_out.push(HeldOut {
                rows: n,
                data,
                labels,
                probs,
                ops,
                sums,
                samples,
                scores,
                tallies,
                fold,
            });
        }
    }

    /// The forward pass of `rows` held-out rows at `x` (every chain's input) through the
    /// activations `acts`, their softmax into rows r0.. of `probs` (of a set of n rows).
    fn forward_rows(&self, x: At, acts: &[Buf], rows: usize, to: (Buf, usize, usize)) -> Vec<Op> {
        let (s, p) = (&self.shape, self.table.p as usize);
        let (probs, n, r0) = to;
        let mut ops = Vec::new();
        for l in 1..=s.layers() {
            let w_out = s.widths[l];
            let input = match l {
                1 => (x, 0),
                _ => (acts[l - 2].at(0), rows * s.widths[l - 1]),
            };
            ops.push(self.product(l, input, acts[l - 1], rows));
            let bias = self.param(2 * l - 1);
            ops.push(match l < s.layers() {
                true => Op::BiasAct {
                    h: acts[l - 1],
                    bias,
                    dims: [p, rows, w_out, s.chains],
                    act: s.act,
                },
                false => Op::SoftmaxProbs {
                    bufs: [probs, acts[l - 1]],
                    bias,
                    dims: [p, n, r0, rows, w_out, s.chains],
                },
            });
        }
        ops
    }

    fn backward(&mut self) {
        let s = self.shape.clone();
        let (k, b, p) = (s.chains, s.batch, self.table.p as usize);
        for l in (1..=s.layers()).rev() {
            let (input, w_in) = self.input(l);
            let w_out = s.widths[l];
            let delta = self.bufs.deltas[l - 1];
            let (act, a) = match l == s.layers() {
                true => (Act::Identity, delta),
                false => (s.act, self.bufs.acts[l - 1]),
            };
            self.plan.ops.push(Op::BackwardColumns {
                bufs: [delta, a],
                grad_bias: self.grad_of(2 * l - 1),
                dims: [p, b, w_out, k],
                act,
            });
            self.plan.ops.push(Op::Gemm(Gemm {
                transa: false,
                transb: true,
                m: w_in,
                n: w_out,
                k: b,
                a: (input.at(0), w_in, b * w_in),
                b: (delta.at(0), w_out, b * w_out),
                c: (self.grad_of(2 * (l - 1)), w_in, p),
                batch: k,
                accumulate: false,
            }));
            if l > 1 {
                self.plan.ops.push(Op::Gemm(Gemm {
                    transa: false,
                    transb: false,
                    m: w_in,
                    n: b,
                    k: w_out,
                    a: (self.param(2 * (l - 1)), w_in, p),
                    b: (delta.at(0), w_out, b * w_out),
                    c: (self.bufs.deltas[l - 2].at(0), w_in, b * w_in),
                    batch: k,
                    accumulate: false,
                }));
            }
        }
    }

    fn update(&mut self) {
        let bf = &self.bufs;
        let (k, chunks) = (self.shape.chains, self.table.chunks());
        self.plan.ops.push(Op::Update {
            bufs: [bf.theta, bf.grad, bf.table, bf.partials, bf.control],
            states: (bf.momentum, bf.per_element),
            dims: [k, chunks],
        });
        self.plan.ops.push(Op::Finish {
            bufs: [bf.control, bf.partials, bf.table, bf.etas],
            dims: [self.shape.batch, k, self.shape.updates_per_epoch()],
        });
    }
}

fn check(s: &MlpShape) -> crate::Result<()> {
    let bad = |why: String| Err(crate::Error::Config(format!("step plan: {why}")));
    if s.widths.len() < 2 || s.widths.contains(&0) {
        return bad(format!("widths {:?}", s.widths));
    }
    if s.batch == 0 || s.chains == 0 || s.epoch_rows < s.batch {
        return bad(format!(
            "batch {}, chains {}, epoch rows {}",
            s.batch, s.chains, s.epoch_rows
        ));
    }
    if s.gaussian && s.widths.last() != Some(&1) {
        return bad("a Gaussian likelihood has one output".into());
    }
    if s.gaussian && !s.held_out.is_empty() {
        return bad("a regression's held-out Gaussians are candle's, not the plan's".into());
    }
    if s.held_out.contains(&0) {
        return bad("an empty held-out set".into());
    }
    let most = s.held_out.iter().copied().max().unwrap_or(0);
    if u32::try_from(s.chains * s.epoch_rows).is_err() || u32::try_from(s.rows.max(most)).is_err() {
        return bad("more than 2³² rows".into());
    }
    Ok(())
}
