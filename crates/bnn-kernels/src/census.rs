//! A census of the dense kernels a piece of work calls: every matrix product and direct
//! convolution, with its shape, operand layouts and wall time, recorded while
//! [`record`] runs. `bnn bench gemm` runs training steps under it, so that its report
//! covers exactly the products the steps use (the MLPs', LeNet's and the ResNets'),
//! each measured in place, rather than a list of shapes kept by hand beside the models.
//!
//! Off (one relaxed atomic load per kernel call) unless a census is being taken.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use serde::Serialize;

/// How an operand of a product lies in memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Layout {
    /// Row-major: contiguous along its columns.
    Rows,
    /// The transpose of a row-major matrix: contiguous along its rows.
    Transposed,
    /// Neither.
    Strided,
}

impl Layout {
    /// The layout of an operand with row stride `rs` and column stride `cs`.
    pub fn of(rs: usize, cs: usize) -> Self {
        match (rs, cs) {
            (_, 1) => Layout::Rows,
            (1, _) => Layout::Transposed,
            _ => Layout::Strided,
        }
    }
}

/// Which kernel a [`Call`] ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kernel {
    /// [`crate::gemm::product`].
    Product,
    /// [`crate::gemm::product_then_update`]: the product with the sampler update fused.
    ProductThenUpdate,
    /// [`crate::conv::direct::conv`], forward (z = W ⋆ a).
    DirectForward,
    /// [`crate::conv::direct::conv`], adjoint (the input error).
    DirectAdjoint,
    /// [`crate::conv::direct::weight_grad`].
    DirectWeightGrad,
}

/// The shape of one kernel call, as the product C (m × n) = A (m × k)·B (k × n) it
/// computes (a direct convolution as its im2col product: m output channels, k = C_in·9,
/// n = images·pixels).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct Shape {
    /// The kernel called.
    pub kernel: Kernel,
    /// Rows of C.
    pub m: usize,
    /// Columns of C.
    pub n: usize,
    /// Terms of each element of C.
    pub k: usize,
    /// A's layout (row-major for a direct convolution's weights).
    pub lhs: Layout,
    /// B's layout.
    pub rhs: Layout,
    /// Whether a zero map let the kernel skip terms (`gemm::Zeros`).
    pub skips_zeros: bool,
}

impl Shape {
    /// Floating-point operations of the dense product: 2·m·n·k.
    pub fn flop(&self) -> f64 {
        2.0 * (self.m * self.n * self.k) as f64
    }
}

/// One recorded call.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Call {
    /// What was called.
    pub shape: Shape,
    /// Threads it ran on: 1 inside a part of a parallel job (the ResNet's halves of the
    /// minibatch), where the pool is taken.
    pub threads: usize,
    /// Its wall time.
    pub seconds: f64,
}

static ON: AtomicBool = AtomicBool::new(false);
static CALLS: Mutex<Vec<Call>> = Mutex::new(Vec::new());
/// One census at a time (tests run in parallel threads of one process).
static TAKING: Mutex<()> = Mutex::new(());

/// Runs `f` and returns what it returned with the kernel calls it made, in call order
/// (calls from any thread while it runs, including other work's).
pub fn record<R>(f: impl FnOnce() -> R) -> (R, Vec<Call>) {
    let _one = TAKING.lock().unwrap_or_else(|e| e.into_inner());
    take_calls();
    ON.store(true, Ordering::Release);
    let out = f();
    ON.store(false, Ordering::Release);
    (out, take_calls())
}

fn take_calls() -> Vec<Call> {
    std::mem::take(&mut *CALLS.lock().unwrap_or_else(|e| e.into_inner()))
}

/// A kernel call being timed for the census: records itself when dropped, at the end
/// of the call it was started in.
pub(crate) struct Timing {
    shape: Shape,
    threads: usize,
    start: Instant,
}

/// Starts timing a kernel call while a census is taken, under the shape and threads
/// `entry` gives (asked before the call: the call itself takes the pool); `None`, and
/// nothing asked, otherwise.
#[inline]
pub(crate) fn start(entry: impl FnOnce() -> (Shape, usize)) -> Option<Timing> {
    if !ON.load(Ordering::Relaxed) {
        return None;
    }
    let (shape, threads) = entry();
    Some(Timing {
        shape,
        threads,
        start: Instant::now(),
    })
}

impl Drop for Timing {
    fn drop(&mut self) {
        let call = Call {
            shape: self.shape,
            threads: self.threads,
            seconds: self.start.elapsed().as_secs_f64(),
        };
        CALLS.lock().unwrap_or_else(|e| e.into_inner()).push(call);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gemm::{matmul, Mat};

    #[test]
    fn a_census_records_each_product_with_its_layouts_and_nothing_outside_it() {
        // A shape no other test uses: tests on other threads may run products meanwhile,
        // and a census takes every thread's calls.
        let (m, n, k) = (7, 3, 13);
        let (a, b) = (vec![1f32; m * k], vec![2f32; k * n]);
        let mut c = vec![0f32; m * n];
        matmul(m, n, k, &mut c, false, Mat::rows(&a, k), Mat::rows(&b, n));
        let ((), calls) = record(|| {
            matmul(m, n, k, &mut c, false, Mat::rows(&a, k), Mat::rows(&b, n));
            matmul(
                m,
                n,
                k,
                &mut c,
                true,
                Mat::rows(&a, k),
                Mat::transposed(&b, k),
            );
        });
        matmul(m, n, k, &mut c, false, Mat::rows(&a, k), Mat::rows(&b, n));
        let shapes: Vec<_> = calls
            .iter()
            .map(|c| c.shape)
            .filter(|s| (s.m, s.n, s.k) == (m, n, k))
            .collect();
        let product = |rhs| Shape {
            kernel: Kernel::Product,
            m,
            n,
            k,
            lhs: Layout::Rows,
            rhs,
            skips_zeros: false,
        };
        assert_eq!(shapes, [product(Layout::Rows), product(Layout::Transposed)]);
        assert!(calls.iter().all(|c| c.seconds >= 0.0));
        assert_eq!(product(Layout::Rows).flop(), (2 * m * n * k) as f64);
        // A product run while the pool is held (as inside a part of a job) is on one
        // thread; a large one outside it on the threads the product takes, unless a test
        // on another thread holds the pool at that moment (so that one only bounded).
        let (m, n, k) = (5, 700, 300);
        let (a, b) = (vec![1f32; m * k], vec![2f32; k * n]);
        let mut c = vec![0f32; m * n];
        let mut run = || matmul(m, n, k, &mut c, false, Mat::rows(&a, k), Mat::rows(&b, n));
        let ((), calls) = record(|| {
            crate::pool::serially(&mut run);
            run();
        });
        let threads: Vec<usize> = calls
            .iter()
            .filter(|c| (c.shape.m, c.shape.n, c.shape.k) == (m, n, k))
            .map(|c| c.threads)
            .collect();
        let outside = crate::pool::threads().min(m * n * k / crate::gemm::PARALLEL_MIN_MACS);
        assert_eq!(threads.len(), 2);
        assert_eq!(threads[0], 1);
        assert!((1..=outside.max(1)).contains(&threads[1]), "{threads:?}");
    }
}
