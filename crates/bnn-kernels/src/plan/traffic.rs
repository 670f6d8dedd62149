//! What each operation of a plan moves: the bytes it reads and writes at least once (an
//! operand read twice from cache counts once), from its dimensions alone, for `bnn bench
//! plan`'s table.

use super::{Elem, Op, Plan, SCORE, TALLY};

const F: usize = 4;

impl Op {
    /// Bytes the operation reads and writes, each operand once.
    pub fn bytes(&self, plan: &Plan) -> usize {
        let control = |k: usize| k * Elem::Control.bytes();
        match self {
            Op::Gemm(g) => {
                let c = g.m * g.n * if g.accumulate { 2 } else { 1 };
                F * g.batch * (g.m * g.k + g.k * g.n + c)
            }
            Op::Gather {
                dims: [_, b, d, k], ..
            } => k * b * (2 * F * d + F) + control(*k),
            Op::BiasAct {
                dims: [_, b, w, k], ..
            } => k * (2 * F * b * w + F * w),
            Op::SoftmaxXent {
                dims: [_, _, b, classes, k],
                ..
            } => k * b * (3 * F * classes + 4 * F) + k * F * classes + control(*k),
            Op::SoftmaxProbs {
                dims: [_, _, _, b, classes, k],
                ..
            } => k * b * 2 * F * classes + k * F * classes,
            // Σp read and written, probs read, ΣH read and written, the labels, two scores.
            Op::EnsembleFold {
                dims: [n, classes, k],
                ..
            } => k * n * (2 * 8 * classes + F * classes + 2 * 8 + 2 * 8 * SCORE) + F * n + 8 * k,
            Op::EnsembleTally { dims: [n, k], .. } => {
                k * 2 * (8 * n * SCORE + 8 * TALLY) + 2 * 8 * k
            }
            Op::Gaussian {
                dims: [_, _, b, k], ..
            } => k * b * 6 * F + control(*k),
            Op::BackwardColumns {
                dims: [_, b, w, k],
                act,
                ..
            } => {
                let reads = if *act == super::Act::Identity { 1 } else { 2 };
                k * (F * b * w * (reads + 1) + F * w)
            }
            Op::ReduceLoss { dims: [b, k], .. } => k * b * 2 * F + 2 * control(*k),
            Op::Update {
                bufs: [theta, ..],
                states,
                dims: [k, chunks],
            } => {
                let elems = plan.buffers[theta.0].len;
                let per =
                    3 * F + 2 * F * (states.0.is_some() as usize + states.1.is_some() as usize);
                elems * per + k * chunks * 24 + control(*k)
            }
            Op::Finish {
                dims: [_, k, _],
                bufs: [_, partials, _, _],
            } => plan.buffers[partials.0].len * 8 + k * 8 + 2 * control(*k),
        }
    }
}

/// One row of a plan's table: the operation, its launch's work items and its bytes.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Row {
    /// The operation's name.
    pub op: &'static str,
    /// What it computes, in the plan's terms.
    pub what: String,
    /// Bytes read and written.
    pub bytes: usize,
}

impl Plan {
    /// The plan's table: one row per launch.
    pub fn rows(&self) -> Vec<Row> {
        self.ops
            .iter()
            .map(|op| Row {
                op: op.name(),
                what: self.describe(op),
                bytes: op.bytes(self),
            })
            .collect()
    }

    fn describe(&self, op: &Op) -> String {
        let name = |b: super::Buf| self.buffers[b.0].name.as_str();
        match op {
            Op::Gemm(g) => format!(
                "{}{} = {}{}·{}{} ({}×{}×{}, ×{})",
                name(g.c.0.buf),
                if g.accumulate { " +" } else { "" },
                name(g.a.0.buf),
                if g.transa { "ᵀ" } else { "" },
                name(g.b.0.buf),
                if g.transb { "ᵀ" } else { "" },
                g.m,
                g.n,
                g.k,
                g.batch
            ),
            Op::Gather { bufs, dims, .. } => format!(
                "{} ← rows of {} ({}×{})",
                name(bufs[0]),
                name(bufs[1]),
                dims[1],
                dims[2]
            ),
            Op::BiasAct { h, act, .. } => format!("{} ← {:?}({} + b)", name(*h), act, name(*h)),
            Op::SoftmaxXent { bufs, .. } => {
                format!("{}, loss ← softmax-xent({})", name(bufs[1]), name(bufs[0]))
            }
            Op::SoftmaxProbs { bufs, dims, .. } => format!(
                "{} rows {}..{} ← softmax({} + b)",
                name(bufs[0]),
                dims[2],
                dims[2] + dims[3],
                name(bufs[1])
            ),
            Op::EnsembleFold { bufs, .. } => format!(
                "{}, {} += {}; scores alone and in the ensemble",
                name(bufs[0]),
                name(bufs[1]),
                name(bufs[3])
            ),
            Op::EnsembleTally { bufs, .. } => {
                format!(
                    "{} ← Σ rows of {}; samples + 1",
                    name(bufs[0]),
                    name(bufs[2])
                )
            }
            Op::Gaussian { bufs, .. } => {
                format!("{}, residual ← Gaussian({})", name(bufs[1]), name(bufs[0]))
            }
            Op::BackwardColumns { bufs, act, .. } => format!(
                "{} ← {:?}′ ⊙ {}; ∇b = Σ rows",
                name(bufs[0]),
                act,
                name(bufs[0])
            ),
            Op::ReduceLoss { .. } => "NLL, hits → control; not finite → halt".to_string(),
            Op::Update { .. } => {
                "θ, v, α ← fused update of every tensor (prior λθ/T in)".to_string()
            }
            Op::Finish { .. } => {
                "Σv², Σα, Σθ·∇; thermostat; step, offset, next η and constants".to_string()
            }
        }
    }
}
