//! The host executor of a [`Plan`]: its buffers in host memory, each kernel of
//! `kernels/step_plan.h` run by its host build (`kernels/plan_host.c`, the same bodies over
//! the same work items as the CUDA kernels), each GEMM by the project's matrix kernel
//! through cuBLAS's conventions ([`gemm`]). It is the test double of the CUDA executor:
//! every test of a plan runs here.

use super::executor::span;
use super::{At, Buf, ChainControl, Elem, Executor, Gemm, Op, Plan, TensorTable};
use crate::error::{Error, Result};
use crate::gemm::{product, Mat, Options};

mod ffi {
    use super::{ChainControl, TensorTable};
    extern "C" {
        pub fn bnn_plan_chain_size() -> u64;
        pub fn bnn_plan_table_size() -> u64;
        pub fn bnn_host_plan_consts(c: *mut ChainControl);
        pub fn bnn_host_plan_gather(
            items: u64,
            x: *mut f32,
            data: *const f32,
            index: *const u32,
            ctl: *const ChainControl,
            m: u32,
            b: u32,
            d: u32,
        );
        pub fn bnn_host_plan_bias_act(
            items: u64,
            h: *mut f32,
            z: *const f32,
            bias: *const f32,
            p: u64,
            b: u32,
            w: u32,
            act: i32,
        );
        pub fn bnn_host_plan_softmax_xent(
            items: u64,
            z: *mut f32,
            delta: *mut f32,
            loss: *mut f32,
            hit: *mut f32,
            bias: *const f32,
            p: u64,
            labels: *const u32,
            index: *const u32,
            ctl: *const ChainControl,
            m: u32,
            b: u32,
            classes: u32,
        );
        pub fn bnn_host_plan_softmax_probs(
            items: u64,
            probs: *mut f32,
            z: *const f32,
            bias: *const f32,
            p: u64,
            n: u32,
            r0: u32,
            b: u32,
            classes: u32,
        );
        pub fn bnn_host_plan_ensemble_fold(
            items: u64,
            sum: *mut f64,
            entropy: *mut f64,
            scores: *mut f64,
            probs: *const f32,
            labels: *const u32,
            samples: *const f64,
            n: u32,
            classes: u32,
        );
        pub fn bnn_host_plan_ensemble_tally(
            items: u64,
            totals: *mut f64,
            samples: *mut f64,
            scores: *const f64,
            n: u32,
        );
        pub fn bnn_host_plan_gaussian(
            items: u64,
            z: *mut f32,
            delta: *mut f32,
            loss: *mut f32,
            hit: *mut f32,
            bias: *const f32,
            p: u64,
            targets: *const f32,
            index: *const u32,
            ctl: *const ChainControl,
            m: u32,
            b: u32,
        );
        pub fn bnn_host_plan_backward_columns(
            items: u64,
            delta: *mut f32,
            dh: *const f32,
            a: *const f32,
            grad_bias: *mut f32,
            p: u64,
            b: u32,
            w: u32,
            act: i32,
        );
        pub fn bnn_host_plan_reduce_loss(
            chains: u32,
            ctl: *mut ChainControl,
            loss: *const f32,
            hit: *const f32,
            b: u32,
            gaussian: i32,
        );
        pub fn bnn_host_plan_update(
            chains: u32,
            theta: *mut f32,
            v: *mut f32,
            s1: *mut f32,
            grad: *const f32,
            ctl: *const ChainControl,
            tab: *const TensorTable,
            partials: *mut f64,
        );
        pub fn bnn_host_plan_finish(
            chains: u32,
            ctl: *mut ChainControl,
            partials: *const f64,
            tab: *const TensorTable,
            etas: *const f64,
            b: u32,
            u: u32,
        );
    }
}

/// The sizes of `bnn_plan_chain` and `bnn_plan_table` as the C compiler lays them out:
/// the Rust mirrors must have the same.
pub fn c_layout_sizes() -> (usize, usize) {
    // SAFETY: two functions returning `sizeof`, no arguments.
    unsafe {
        (
            ffi::bnn_plan_chain_size() as usize,
            ffi::bnn_plan_table_size() as usize,
        )
    }
}

/// `c`'s next constants from its state, by the kernels' own formula (`bnn_plan_consts`).
pub fn next_consts(c: &mut ChainControl) {
    // SAFETY: `c` is a valid, exclusive `bnn_plan_chain` (same layout: `c_layout_sizes`).
    unsafe { ffi::bnn_host_plan_consts(c) }
}

/// One buffer of a host workspace.
#[derive(Debug, Clone)]
pub enum HostBuffer {
    /// f32 values.
    F32(Vec<f32>),
    /// f64 values.
    F64(Vec<f64>),
    /// u32 values.
    U32(Vec<u32>),
    /// The chains' control blocks.
    Control(Vec<ChainControl>),
    /// The tensor table.
    Table(Box<TensorTable>),
}

impl HostBuffer {
    fn zeroed(elem: Elem, len: usize) -> Self {
        match elem {
            Elem::F32 => HostBuffer::F32(vec![0.0; len]),
            Elem::F64 => HostBuffer::F64(vec![0.0; len]),
            Elem::U32 => HostBuffer::U32(vec![0; len]),
            Elem::Control => HostBuffer::Control(vec![ChainControl::default(); len]),
            Elem::Table => HostBuffer::Table(Box::default()),
        }
    }

    /// What it holds, for a message.
    fn kind(&self) -> &'static str {
        match self {
            HostBuffer::F32(_) => "f32",
            HostBuffer::F64(_) => "f64",
            HostBuffer::U32(_) => "u32",
            HostBuffer::Control(_) => "control blocks",
            HostBuffer::Table(_) => "a table",
        }
    }

    /// Its bytes.
    fn bytes(&mut self) -> &mut [u8] {
        let size = match self {
            HostBuffer::F32(_) | HostBuffer::U32(_) => 4,
            HostBuffer::F64(_) => 8,
            HostBuffer::Control(_) => std::mem::size_of::<ChainControl>(),
            HostBuffer::Table(_) => std::mem::size_of::<TensorTable>(),
        };
        let (base, len) = self.raw();
        // SAFETY: the buffer's own allocation of `len` elements of `size` bytes, each a
        // `Plain` type (no padding: every byte initialised), borrowed mutably with `self`.
        unsafe { std::slice::from_raw_parts_mut(base, len * size) }
    }

    /// Its first element's address and its length in elements.
    fn raw(&mut self) -> (*mut u8, usize) {
        match self {
            HostBuffer::F32(v) => (v.as_mut_ptr().cast(), v.len()),
            HostBuffer::F64(v) => (v.as_mut_ptr().cast(), v.len()),
            HostBuffer::U32(v) => (v.as_mut_ptr().cast(), v.len()),
            HostBuffer::Control(v) => (v.as_mut_ptr().cast(), v.len()),
            HostBuffer::Table(t) => ((&mut **t as *mut TensorTable).cast(), 1),
        }
    }
}

/// A plan's buffers in host memory, allocated once.
#[derive(Debug, Clone)]
pub struct HostWorkspace {
    /// The buffers, as the plan lists them.
    pub buffers: Vec<HostBuffer>,
}

impl HostWorkspace {
    /// Every buffer of `plan`, zeroed.
    pub fn new(plan: &Plan) -> Self {
        HostWorkspace {
            buffers: plan
                .buffers
                .iter()
                .map(|b| HostBuffer::zeroed(b.elem, b.len))
                .collect(),
        }
    }

    /// Buffer `b`'s f32 values.
    pub fn f32(&mut self, b: Buf) -> &mut [f32] {
        match &mut self.buffers[b.0] {
            HostBuffer::F32(v) => v,
            other => panic!("plan buffer {} is not f32 but {}", b.0, other.kind()),
        }
    }

    /// Buffer `b`'s f64 values.
    pub fn f64(&mut self, b: Buf) -> &mut [f64] {
        match &mut self.buffers[b.0] {
            HostBuffer::F64(v) => v,
            other => panic!("plan buffer {} is not f64 but {}", b.0, other.kind()),
        }
    }

    /// Buffer `b`'s u32 values.
    pub fn u32(&mut self, b: Buf) -> &mut [u32] {
        match &mut self.buffers[b.0] {
            HostBuffer::U32(v) => v,
            other => panic!("plan buffer {} is not u32 but {}", b.0, other.kind()),
        }
    }

    /// Buffer `b`'s control blocks.
    pub fn control(&mut self, b: Buf) -> &mut [ChainControl] {
        match &mut self.buffers[b.0] {
            HostBuffer::Control(v) => v,
            other => panic!(
                "plan buffer {} is not control blocks but {}",
                b.0,
                other.kind()
            ),
        }
    }

    /// Buffer `b`'s tensor table.
    pub fn table(&mut self, b: Buf) -> &mut TensorTable {
        match &mut self.buffers[b.0] {
            HostBuffer::Table(t) => t,
            other => panic!("plan buffer {} is not a table but {}", b.0, other.kind()),
        }
    }

    /// The address of `at` as a `T` pointer, `T`'s size that of the buffer's elements.
    fn ptr<T>(&mut self, at: At) -> *mut T {
        let (base, len) = self.buffers[at.buf.0].raw();
        assert!(
            at.offset <= len,
            "plan: offset {} past buffer {}",
            at.offset,
            at.buf.0
        );
        // SAFETY: `offset` ≤ the buffer's length (checked), in elements of its type, which
        // the caller names as T.
        unsafe { base.cast::<T>().add(at.offset) }
    }

    fn p<T>(&mut self, b: Buf) -> *mut T {
        self.ptr(b.at(0))
    }

    fn opt(&mut self, b: Option<Buf>) -> *mut f32 {
        b.map_or(std::ptr::null_mut(), |b| self.p(b))
    }
}

impl Executor for HostWorkspace {
    fn write_bytes(&mut self, b: Buf, offset: usize, bytes: &[u8]) -> Result<()> {
        let all = self.buffers[b.0].bytes();
        let r = span(b, offset, bytes.len(), all.len())?;
        all[r].copy_from_slice(bytes);
        Ok(())
    }

    fn read_bytes(&mut self, b: Buf, offset: usize, out: &mut [u8]) -> Result<()> {
        let all = self.buffers[b.0].bytes();
        let r = span(b, offset, out.len(), all.len())?;
        out.copy_from_slice(&all[r]);
        Ok(())
    }

    fn run(&mut self, plan: &Plan, updates: usize) -> Result<()> {
        for _ in 0..updates {
            run(plan, self)?;
        }
        Ok(())
    }

    fn run_ops(&mut self, plan: &Plan, ops: &[Op]) -> Result<()> {
        of_plan(plan, self)?;
        for op in ops {
            run_op(op, self);
        }
        Ok(())
    }

    fn describe(&self) -> String {
        "host".into()
    }
}

/// Runs `plan`'s operations once (one update) on `ws`, which must be `plan`'s workspace.
pub fn run(plan: &Plan, ws: &mut HostWorkspace) -> Result<()> {
    of_plan(plan, ws)?;
    for op in &plan.ops {
        run_op(op, ws);
    }
    Ok(())
}

/// An error unless `ws` holds `plan`'s buffers.
fn of_plan(plan: &Plan, ws: &HostWorkspace) -> Result<()> {
    match ws.buffers.len() == plan.buffers.len() {
        true => Ok(()),
        false => Err(Error::Config("plan: a workspace of another plan".into())),
    }
}

fn u(x: usize) -> u32 {
    u32::try_from(x).expect("a plan's dimensions fit in u32 (MlpShape's check)")
}

fn run_op(op: &Op, ws: &mut HostWorkspace) {
    // SAFETY (every call below): each pointer is the start (or a checked offset) of a
    // buffer of the plan's workspace of the element type the kernel reads; the plan's
    // builder sized every buffer for the items and strides its operation covers
    // (`mlp::MlpPlan`), and the host kernels touch nothing else. Buffers a kernel updates
    // in place are passed once as mutable and once as read (the C code's aliasing is
    // allowed: no `restrict`).
    unsafe {
        match *op {
            Op::Gemm(g) => gemm(&g, ws),
            Op::Gather {
                bufs: [x, data, index, ctl],
                dims: [m, b, d, k],
            } => ffi::bnn_host_plan_gather(
                (k * b * d) as u64,
                ws.p(x),
                ws.p(data),
                ws.p(index),
                ws.p(ctl),
                u(m),
                u(b),
                u(d),
            ),
            Op::BiasAct {
                h,
                bias,
                dims: [p, b, w, k],
                act,
            } => {
                let hp = ws.p::<f32>(h);
                ffi::bnn_host_plan_bias_act(
                    (k * b * w) as u64,
                    hp,
                    hp,
                    ws.ptr(bias),
                    p as u64,
                    u(b),
                    u(w),
                    act as i32,
                )
            }
            Op::BackwardColumns {
                bufs: [delta, a],
                grad_bias,
                dims: [p, b, w, k],
                act,
            } => {
                let dp = ws.p::<f32>(delta);
                ffi::bnn_host_plan_backward_columns(
                    (k * w) as u64,
                    dp,
                    dp,
                    ws.p(a),
                    ws.ptr(grad_bias),
                    p as u64,
                    u(b),
                    u(w),
                    act as i32,
                )
            }
            Op::ReduceLoss {
                bufs: [loss, hit, ctl],
                dims: [b, k],
                gaussian,
            } => ffi::bnn_host_plan_reduce_loss(
                u(k),
                ws.p(ctl),
                ws.p(loss),
                ws.p(hit),
                u(b),
                gaussian as i32,
            ),
            Op::SoftmaxXent { .. } | Op::Gaussian { .. } | Op::SoftmaxProbs { .. } => {
                likelihood(op, ws)
            }
            Op::Update { .. } | Op::Finish { .. } => update(op, ws),
            Op::EnsembleFold { .. } | Op::EnsembleTally { .. } => ensemble(op, ws),
        }
    }
}

/// The output layer's kernels of `run_op`: the likelihoods, and a held-out set's softmax.
fn likelihood(op: &Op, ws: &mut HostWorkspace) {
    // SAFETY: as in `run_op`.
    unsafe {
        match *op {
            Op::SoftmaxXent {
                bufs: [z, delta, loss, hit, labels, index, ctl],
                bias,
                dims: [p, m, b, classes, k],
            } => ffi::bnn_host_plan_softmax_xent(
                (k * b) as u64,
                ws.p(z),
                ws.p(delta),
                ws.p(loss),
                ws.p(hit),
                ws.ptr(bias),
                p as u64,
                ws.p(labels),
                ws.p(index),
                ws.p(ctl),
                u(m),
                u(b),
                u(classes),
            ),
            Op::SoftmaxProbs {
                bufs: [probs, z],
                bias,
                dims: [p, n, r0, b, classes, k],
            } => ffi::bnn_host_plan_softmax_probs(
                (k * b) as u64,
                ws.p(probs),
                ws.p(z),
                ws.ptr(bias),
                p as u64,
                u(n),
                u(r0),
                u(b),
                u(classes),
            ),
            Op::Gaussian {
                bufs: [z, delta, loss, hit, targets, index, ctl],
                bias,
                dims: [p, m, b, k],
            } => ffi::bnn_host_plan_gaussian(
                (k * b) as u64,
                ws.p(z),
                ws.p(delta),
                ws.p(loss),
                ws.p(hit),
                ws.ptr(bias),
                p as u64,
                ws.p(targets),
                ws.p(index),
                ws.p(ctl),
                u(m),
                u(b),
            ),
            _ => unreachable!("run_op dispatches only these here"),
        }
    }
}

/// A held-out set's fold into the ensembles and its tallies, of `run_op`.
fn ensemble(op: &Op, ws: &mut HostWorkspace) {
    // SAFETY: as in `run_op`.
    unsafe {
        match *op {
            Op::EnsembleFold {
                bufs: [sum, entropy, scores, probs, labels, samples],
                dims: [n, classes, k],
            } => ffi::bnn_host_plan_ensemble_fold(
                (k * n) as u64,
                ws.p(sum),
                ws.p(entropy),
                ws.p(scores),
                ws.p(probs),
                ws.p(labels),
                ws.p(samples),
                u(n),
                u(classes),
            ),
            Op::EnsembleTally {
                bufs: [totals, samples, scores],
                dims: [n, k],
            } => ffi::bnn_host_plan_ensemble_tally(
                (2 * k) as u64,
                ws.p(totals),
                ws.p(samples),
                ws.p(scores),
                u(n),
            ),
            _ => unreachable!("run_op dispatches only these here"),
        }
    }
}

/// The fused update and its finish of `run_op`.
fn update(op: &Op, ws: &mut HostWorkspace) {
    // SAFETY: as in `run_op`.
    unsafe {
        match *op {
            Op::Update {
                bufs: [theta, grad, table, partials, ctl],
                states: (v, s1),
                dims: [k, _],
            } => {
                let (vp, sp) = (ws.opt(v), ws.opt(s1));
                ffi::bnn_host_plan_update(
                    u(k),
                    ws.p(theta),
                    vp,
                    sp,
                    ws.p(grad),
                    ws.p(ctl),
                    ws.p(table),
                    ws.p(partials),
                )
            }
            Op::Finish {
                bufs: [ctl, partials, table, etas],
                dims: [b, k, per_epoch],
            } => ffi::bnn_host_plan_finish(
                u(k),
                ws.p(ctl),
                ws.p(partials),
                ws.p(table),
                ws.p(etas),
                u(b),
                u(per_epoch),
            ),
            _ => unreachable!("run_op dispatches only these here"),
        }
    }
}

/// A GEMM of cuBLAS's conventions on the project's kernel: column-major C (m × n, ldc)
/// is row-major Cᵀ (n × m, row stride ldc) = op(B)ᵀ·op(A)ᵀ, whose operands are the
/// column-major A and B read with swapped strides.
fn gemm(g: &Gemm, ws: &mut HostWorkspace) {
    let (a, b, c) = (g.a, g.b, g.c);
    assert!(
        c.0.buf != a.0.buf && c.0.buf != b.0.buf,
        "plan: a GEMM writes a buffer it reads"
    );
    let span = |ld: usize, rows: usize, cols: usize| match cols {
        0 => 0,
        _ => ld * (cols - 1) + rows,
    };
    let (ar, ac) = if g.transa { (g.k, g.m) } else { (g.m, g.k) };
    let (br, bc) = if g.transb { (g.n, g.k) } else { (g.k, g.n) };
    let (a_len, b_len, c_len) = (span(a.1, ar, ac), span(b.1, br, bc), span(c.1, g.m, g.n));
    for i in 0..g.batch {
        let a_data = span_of(ws, a.0, i * a.2, a_len);
        let b_data = span_of(ws, b.0, i * b.2, b_len);
        let c_data = span_of(ws, c.0, i * c.2, c_len);
        // SAFETY: each span lies inside its buffer (`span_of` checks), and C's buffer is
        // neither A's nor B's (asserted above), so the one slice written aliases no other.
        let (a_data, b_data, dst) = unsafe {
            (
                std::slice::from_raw_parts(a_data, a_len),
                std::slice::from_raw_parts(b_data, b_len),
                std::slice::from_raw_parts_mut(c_data, c_len),
            )
        };
        let lhs = match g.transb {
            false => Mat {
                data: b_data,
                rs: b.1,
                cs: 1,
            },
            true => Mat {
                data: b_data,
                rs: 1,
                cs: b.1,
            },
        };
        let rhs = match g.transa {
            false => Mat {
                data: a_data,
                rs: a.1,
                cs: 1,
            },
            true => Mat {
                data: a_data,
                rs: 1,
                cs: a.1,
            },
        };
        let opts = Options {
            accumulate: g.accumulate,
            dst_stride: (c.1 != g.m).then_some(c.1),
            ..Options::default()
        };
        product(g.n, g.m, g.k, dst, lhs, rhs, opts);
    }
}

/// The address of `len` f32 values of the buffer at `at` plus `extra` elements, checked
/// to lie inside it.
fn span_of(ws: &mut HostWorkspace, at: At, extra: usize, len: usize) -> *mut f32 {
    let v = ws.f32(at.buf);
    let start = at.offset + extra;
    assert!(
        start + len <= v.len(),
        "plan: a GEMM operand past its buffer"
    );
    v[start..start + len].as_mut_ptr()
}

/// The reference GEMM: cuBLAS's definition written as loops, in f64 (the tests' check of
/// [`gemm`]'s conventions).
#[allow(clippy::too_many_arguments)]
pub fn reference_gemm(
    (transa, transb): (bool, bool),
    (m, n, k): (usize, usize, usize),
    a: &[f32],
    lda: usize,
    b: &[f32],
    ldb: usize,
    c: &mut [f32],
    ldc: usize,
    accumulate: bool,
) {
    for j in 0..n {
        for i in 0..m {
            let mut s = 0f64;
            for p in 0..k {
                let av = if transa {
                    a[p + i * lda]
                } else {
                    a[i + p * lda]
                };
                let bv = if transb {
                    b[j + p * ldb]
                } else {
                    b[p + j * ldb]
                };
                s += av as f64 * bv as f64;
            }
            let old = if accumulate {
                c[i + j * ldc] as f64
            } else {
                0.0
            };
            c[i + j * ldc] = (old + s) as f32;
        }
    }
}
