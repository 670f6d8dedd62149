//! The fused update of K chains' parameters stacked along a leading chain axis, (K, …):
//! one candle in-place op, whose destination is the stacked θ and whose gradient is the
//! stacked ∇, with chain k's row moved by the update its sampler lends
//! ([`crate::LentUpdate`]: its noise key, constants, momentum and thermostats). On the CPU
//! each row runs the fused step of a tensor alone ([`crate::cpu`]), so a chain's θ and v
//! are the bits it would have apart; on CUDA all K rows are one launch
//! (`bnn_step_stacked_kernel`), where K separate launches would each pay a launch and a read
//! of the sums.

use std::cell::RefCell;

use candle_core::{CpuStorage, InplaceOp2, Layout, Tensor};

use crate::cpu::{lane_step, theta_and_grad};
use crate::error::{Error, Result};
use crate::{LentUpdate, TensorSums};

struct StackedStepOp<'l, 'a> {
    lanes: RefCell<&'l mut [LentUpdate<'a>]>,
    sums: RefCell<Vec<TensorSums>>,
}

/// Updates the stacked θ (K, …) in place from the stacked gradient, chain k's row by
/// `lanes[k]`; returns each chain's sums (Σv² and Σα 0 where the update has none).
pub fn step(
    theta: &Tensor,
    grad: &Tensor,
    lanes: &mut [LentUpdate<'_>],
) -> Result<Vec<TensorSums>> {
    let k = lanes.len();
    if theta.dims().first() != Some(&k) || grad.dims() != theta.dims() {
        return Err(Error::Config(format!(
            "stacked sampler step: θ {:?} and ∇ {:?} for {k} chains",
            theta.dims(),
            grad.dims()
        )));
    }
    let op = StackedStepOp {
        lanes: RefCell::new(lanes),
        sums: RefCell::new(Vec::new()),
    };
    let grad = grad.detach().contiguous()?;
    theta.inplace_op2(&grad, &op)?;
    Ok(op.sums.into_inner())
}

impl InplaceOp2 for StackedStepOp<'_, '_> {
    fn name(&self) -> &'static str {
        "bnn-stacked-sampler-step"
    }

    fn cpu_fwd(
        &self,
        s1: &mut CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> candle_core::Result<()> {
        let (theta, grad) = theta_and_grad(s1, l1, s2, l2)?;
        let mut lanes = self.lanes.borrow_mut();
        let n = theta.len() / lanes.len().max(1);
        if grad.len() != theta.len() || n * lanes.len() != theta.len() {
            candle_core::bail!("stacked sampler step: rows of the wrong length");
        }
        let rows = theta.chunks_exact_mut(n).zip(grad.chunks_exact(n));
        let mut sums = Vec::with_capacity(lanes.len());
        for (lane, (theta, grad)) in lanes.iter_mut().zip(rows) {
            sums.push(lane_step(lane, theta, grad)?);
        }
        *self.sums.borrow_mut() = sums;
        Ok(())
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &mut candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
    ) -> candle_core::Result<()> {
        let mut lanes = self.lanes.borrow_mut();
        *self.sums.borrow_mut() = super::cuda::stacked_step(s1, l1, s2, l2, &mut lanes)?;
        Ok(())
    }
}
