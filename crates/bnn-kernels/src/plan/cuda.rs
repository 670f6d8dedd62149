//! The CUDA executor of a [`Plan`]: its buffers allocated once on the device, each GEMM a
//! cuBLAS strided-batched SGEMM, each kernel the `__global__` wrapper of its body in
//! `kernels/step_plan.cu` (PTX compiled by build.rs with nvcc, `--fmad=false`), all on one
//! non-blocking stream of its own. An update reads nothing that changes from update to
//! update from its launch arguments (`kernels/step_plan.h`), so the first run captures
//! the plan as CUDA graphs — one of one update and one of [`GRAPH_UPDATES`] — which every
//! later run replays; where capture fails the updates are launched one by one, and
//! [`Executor::describe`] says why.
//!
//! Buffers are addressed by raw device pointers taken once, and launched with them as
//! plain arguments: no cudarc event is recorded inside a capture, and every launch, copy
//! and GEMM is on the one stream, in order.

use std::sync::Arc;

use candle_core::cuda_backend::cudarc::cublas::{result as blas, sys as blas_sys, CudaBlas};
use candle_core::cuda_backend::cudarc::driver::{
    sys, CudaContext, CudaFunction, CudaGraph, CudaModule, CudaSlice, CudaStream, DevicePtr,
    LaunchConfig, PushKernelArg,
};
use candle_core::cuda_backend::cudarc::nvrtc::Ptx;

use super::executor::span;
use super::{Buf, Executor, Gemm, Op, Plan, CHUNK};
use crate::error::{Error, Result};

const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/step_plan.ptx"));
/// Threads of a block of the per-item kernels.
const THREADS: u32 = 256;
/// Updates of the larger captured graph: a run of S updates replays it ⌊S/16⌋ times and
/// the one-update graph for the rest.
pub const GRAPH_UPDATES: usize = 16;
/// cuBLAS's workspace, set once so that a captured GEMM allocates nothing.
const BLAS_WORKSPACE: usize = 32 << 20;

fn cuda_err(what: &str, e: impl std::fmt::Debug) -> Error {
    Error::Config(format!("step plan on CUDA: {what}: {e:?}"))
}

/// The plan's kernels, by name in `step_plan.cu`.
#[derive(Debug)]
struct Kernels {
    gather: CudaFunction,
    bias_act: CudaFunction,
    softmax_xent: CudaFunction,
    softmax_probs: CudaFunction,
    ensemble_fold: CudaFunction,
    ensemble_tally: CudaFunction,
    gaussian: CudaFunction,
    backward_columns: CudaFunction,
    reduce_loss: CudaFunction,
    update: CudaFunction,
    finish: CudaFunction,
}

impl Kernels {
    fn load(module: &Arc<CudaModule>) -> Result<Self> {
        let f = |name: &str| {
            module
                .load_function(&format!("bnn_plan_{name}_kernel"))
                .map_err(|e| cuda_err(name, e))
        };
        Ok(Kernels {
            gather: f("gather")?,
            bias_act: f("bias_act")?,
            softmax_xent: f("softmax_xent")?,
            softmax_probs: f("softmax_probs")?,
            ensemble_fold: f("ensemble_fold")?,
            ensemble_tally: f("ensemble_tally")?,
            gaussian: f("gaussian")?,
            backward_columns: f("backward_columns")?,
            reduce_loss: f("reduce_loss")?,
            update: f("update")?,
            finish: f("finish")?,
        })
    }
}

/// How the updates are launched.
enum Mode {
    /// Not yet tried: the first run captures.
    Untried,
    /// Replayed graphs of the plan whose operations are kept: of one update, and of
    /// [`GRAPH_UPDATES`].
    Graphs(Vec<Op>, CudaGraph, CudaGraph),
    /// Launched one by one, capture having failed for the reason given.
    Eager(String),
}

/// A plan's workspace on a CUDA device.
pub struct CudaWorkspace {
    stream: Arc<CudaStream>,
    blas: CudaBlas,
    kernels: Kernels,
    /// The buffers, as the plan lists them, with their sizes in bytes and their addresses.
    buffers: Vec<CudaSlice<u8>>,
    sizes: Vec<usize>,
    ptrs: Vec<u64>,
    _blas_workspace: CudaSlice<u8>,
    mode: Mode,
}

impl std::fmt::Debug for CudaWorkspace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaWorkspace")
            .field("buffers", &self.sizes.len())
            .field("mode", &self.describe())
            .finish()
    }
}

// SAFETY: the workspace is used from one thread at a time (`&mut self` for every launch);
// cudarc's stream, module and cuBLAS handle are themselves Send, the graphs are only
// launched through `&mut self`.
unsafe impl Send for CudaWorkspace {}

impl CudaWorkspace {
    /// `plan`'s buffers, zeroed, on CUDA device `ordinal`, with its kernels loaded.
    pub fn new(plan: &Plan, ordinal: usize) -> Result<Self> {
        let ctx = CudaContext::new(ordinal).map_err(|e| cuda_err("context", e))?;
        let stream = ctx.new_stream().map_err(|e| cuda_err("stream", e))?;
        let module = ctx
            .load_module(Ptx::from_src(PTX))
            .map_err(|e| cuda_err("loading step_plan.ptx", e))?;
        let kernels = Kernels::load(&module)?;
        let blas = CudaBlas::new(stream.clone()).map_err(|e| cuda_err("cuBLAS", e))?;
        let alloc = |bytes: usize| {
            stream
                .alloc_zeros::<u8>(bytes.max(1))
                .map_err(|e| cuda_err("allocation", e))
        };
        let blas_workspace = alloc(BLAS_WORKSPACE)?;
        let address = |s: &CudaSlice<u8>| {
            let (p, _record) = s.device_ptr(&stream);
            p
        };
        // SAFETY: the handle is cudarc's, the workspace a live allocation of that size
        // kept as long as the handle (both fields of the workspace).
        unsafe {
            blas_sys::cublasSetWorkspace_v2(
                *blas.handle(),
                address(&blas_workspace) as *mut std::ffi::c_void,
                BLAS_WORKSPACE,
            )
            .result()
            .map_err(|e| cuda_err("cuBLAS workspace", e))?;
        }
        let sizes: Vec<usize> = plan
            .buffers
            .iter()
            .map(|b| b.len * b.elem.bytes())
            .collect();
        let buffers = sizes
            .iter()
            .map(|&n| alloc(n))
            .collect::<Result<Vec<_>>>()?;
        let ptrs = buffers.iter().map(address).collect();
        stream
            .synchronize()
            .map_err(|e| cuda_err("synchronize", e))?;
        Ok(CudaWorkspace {
            stream,
            blas,
            kernels,
            buffers,
            sizes,
            ptrs,
            _blas_workspace: blas_workspace,
            mode: Mode::Untried,
        })
    }

    /// The device address of element `offset` of buffer `b` (elements of `size` bytes).
    fn at(&self, b: Buf, offset: usize, size: usize) -> u64 {
        self.ptrs[b.0] + (offset * size) as u64
    }

    fn p(&self, b: Buf) -> u64 {
        self.ptrs[b.0]
    }

    fn opt(&self, b: Option<Buf>) -> u64 {
        b.map_or(0, |b| self.p(b))
    }

    /// One update, every operation queued on the stream (captured, when capturing).
    fn queue_update(&mut self, plan: &Plan) -> Result<()> {
        for op in &plan.ops {
            self.queue(op)?;
        }
        Ok(())
    }

    /// `n` updates queued as one capture: the graph that replays them.
    fn capture(&mut self, plan: &Plan, n: usize) -> Result<CudaGraph> {
        let mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
        self.stream
            .begin_capture(mode)
            .map_err(|e| cuda_err("begin capture", e))?;
        let queued = (0..n).try_for_each(|_| self.queue_update(plan));
        // The capture is ended whatever happened, so the stream leaves capture mode.
        let ended = self
            .stream
            .end_capture(sys::CUgraphInstantiate_flags(0))
            .map_err(|e| cuda_err("end capture", e));
        queued?;
        ended?.ok_or_else(|| cuda_err("end capture", "no graph"))
    }

    /// The graphs of `plan` on its first run (again for another plan on the same
    /// buffers, as a test runs one operation at a time), or the reason they could not be
    /// made.
    fn capture_graphs(&mut self, plan: &Plan) {
        match &self.mode {
            Mode::Graphs(ops, ..) if *ops == plan.ops => return,
            Mode::Eager(_) => return,
            Mode::Graphs(..) | Mode::Untried => {}
        }
        let graphs = self.capture(plan, 1).and_then(|one| {
            let many = self.capture(plan, GRAPH_UPDATES)?;
            // Their resources on the device now, not at the first (timed) replay.
            for g in [&one, &many] {
                g.upload().map_err(|e| cuda_err("graph upload", e))?;
            }
            Ok((one, many))
        });
        self.mode = match graphs {
            Ok((one, many)) => Mode::Graphs(plan.ops.clone(), one, many),
            Err(e) => {
                tracing::warn!("step plan: CUDA graph capture failed ({e}): launching eagerly");
                Mode::Eager(format!("graph capture failed: {e}"))
            }
        };
    }

    fn queue(&mut self, op: &Op) -> Result<()> {
        match *op {
            Op::Gemm(g) => self.gemm(&g),
            Op::Update {
                bufs: [theta, grad, table, partials, ctl],
                states: (v, s1),
                dims: [k, chunks],
            } => {
                let args = [
                    self.p(theta),
                    self.opt(v),
                    self.opt(s1),
                    self.p(grad),
                    self.p(ctl),
                    self.p(table),
                    self.p(partials),
                ];
                let cfg = LaunchConfig {
                    grid_dim: (chunks as u32, k as u32, 1),
                    block_dim: (CHUNK as u32, 1, 1),
                    shared_mem_bytes: 0,
                };
                let mut b = self.stream.launch_builder(&self.kernels.update);
                for a in &args {
                    b.arg(a);
                }
                // SAFETY: the kernel's seven pointer parameters, each a buffer of the plan
                // sized for its grid by `mlp::MlpPlan` (null for a state the rule has not).
                unsafe { b.launch(cfg) }
                    .map(|_| ())
                    .map_err(|e| cuda_err("update", e))
            }
            _ => self.queue_items(op),
        }
    }

    /// The per-item kernels: one thread an item of the op's grid.
    fn queue_items(&mut self, op: &Op) -> Result<()> {
        let mut args = Args::default();
        let (func, items) = match *op {
            Op::Gather {
                bufs: [x, data, index, ctl],
                dims: [m, b, d, k],
            } => {
                let items = (k * b * d) as u64;
                args.u64(items)
                    .ptrs(&[self.p(x), self.p(data), self.p(index), self.p(ctl)]);
                args.u32s(&[m, b, d]);
                (&self.kernels.gather, items)
            }
            Op::BiasAct {
                h,
                bias,
                dims: [p, b, w, k],
                act,
            } => {
                let items = (k * b * w) as u64;
                let hp = self.p(h);
                args.u64(items)
                    .ptrs(&[hp, hp, self.at(bias.buf, bias.offset, 4)]);
                args.u64(p as u64).u32s(&[b, w]).i32(act as i32);
                (&self.kernels.bias_act, items)
            }
            Op::SoftmaxXent {
                bufs: [z, delta, loss, hit, labels, index, ctl],
                bias,
                dims: [p, m, b, classes, k],
            } => {
                let items = (k * b) as u64;
                let at = self.at(bias.buf, bias.offset, 4);
                args.u64(items)
                    .ptrs(&[self.p(z), self.p(delta), self.p(loss), self.p(hit), at]);
                args.u64(p as u64)
                    .ptrs(&[self.p(labels), self.p(index), self.p(ctl)]);
                args.u32s(&[m, b, classes]);
                (&self.kernels.softmax_xent, items)
            }
            Op::SoftmaxProbs {
                bufs: [probs, z],
                bias,
                dims: [p, n, r0, b, classes, k],
            } => {
                let items = (k * b) as u64;
                let at = self.at(bias.buf, bias.offset, 4);
                args.u64(items).ptrs(&[self.p(probs), self.p(z), at]);
                args.u64(p as u64).u32s(&[n, r0, b, classes]);
                (&self.kernels.softmax_probs, items)
            }
            Op::EnsembleFold {
                bufs: [sum, entropy, scores, probs, labels, samples],
                dims: [n, classes, k],
            } => {
                let items = (k * n) as u64;
                args.u64(items).ptrs(&[
                    self.p(sum),
                    self.p(entropy),
                    self.p(scores),
                    self.p(probs),
                    self.p(labels),
                    self.p(samples),
                ]);
                args.u32s(&[n, classes]);
                (&self.kernels.ensemble_fold, items)
            }
            Op::EnsembleTally {
                bufs: [totals, samples, scores],
                dims: [n, k],
            } => {
                let items = (2 * k) as u64;
                args.u64(items)
                    .ptrs(&[self.p(totals), self.p(samples), self.p(scores)]);
                args.u32s(&[n]);
                (&self.kernels.ensemble_tally, items)
            }
            Op::Gaussian {
                bufs: [z, delta, loss, hit, targets, index, ctl],
                bias,
                dims: [p, m, b, k],
            } => {
                let items = (k * b) as u64;
                let at = self.at(bias.buf, bias.offset, 4);
                args.u64(items)
                    .ptrs(&[self.p(z), self.p(delta), self.p(loss), self.p(hit), at]);
                args.u64(p as u64)
                    .ptrs(&[self.p(targets), self.p(index), self.p(ctl)]);
                args.u32s(&[m, b]);
                (&self.kernels.gaussian, items)
            }
            Op::BackwardColumns {
                bufs: [delta, a],
                grad_bias,
                dims: [p, b, w, k],
                act,
            } => {
                let items = (k * w) as u64;
                let dp = self.p(delta);
                let gb = self.at(grad_bias.buf, grad_bias.offset, 4);
                args.u64(items).ptrs(&[dp, dp, self.p(a), gb]);
                args.u64(p as u64).u32s(&[b, w]).i32(act as i32);
                (&self.kernels.backward_columns, items)
            }
            Op::ReduceLoss {
                bufs: [loss, hit, ctl],
                dims: [b, k],
                gaussian,
            } => {
                args.u32s(&[k])
                    .ptrs(&[self.p(ctl), self.p(loss), self.p(hit)]);
                args.u32s(&[b]).i32(gaussian as i32);
                (&self.kernels.reduce_loss, k as u64)
            }
            Op::Finish {
                bufs: [ctl, partials, table, etas],
                dims: [b, k, u],
            } => {
                args.u32s(&[k])
                    .ptrs(&[self.p(ctl), self.p(partials), self.p(table), self.p(etas)]);
                args.u32s(&[b, u]);
                (&self.kernels.finish, k as u64)
            }
            Op::Gemm(_) | Op::Update { .. } => unreachable!("queue launches these"),
        };
        let cfg = LaunchConfig {
            grid_dim: (items.div_ceil(THREADS as u64).max(1) as u32, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.stream.launch_builder(func);
        args.push_to(&mut b);
        // SAFETY: the arguments are the kernel's parameters in order and of their C types
        // (`step_plan.cu`); every pointer is a buffer of the plan (or an offset into one
        // that the plan's builder checked) sized for the op's items.
        unsafe { b.launch(cfg) }
            .map(|_| ())
            .map_err(|e| cuda_err(op.name(), e))
    }

    /// A plan GEMM on cuBLAS: its conventions are cuBLAS's own.
    fn gemm(&mut self, g: &Gemm) -> Result<()> {
        let op = |t: bool| match t {
            true => blas_sys::cublasOperation_t::CUBLAS_OP_T,
            false => blas_sys::cublasOperation_t::CUBLAS_OP_N,
        };
        let (alpha, beta) = (1.0f32, if g.accumulate { 1.0f32 } else { 0.0 });
        let i = |x: usize| x as i32;
        let l = |x: usize| x as i64;
        let (a, b, c) = (g.a, g.b, g.c);
        // SAFETY: A, B and C lie inside their buffers for all `batch` problems (the plan's
        // builder sized them); alpha and beta are host scalars read when the call is
        // queued (cuBLAS's host pointer mode), so a captured GEMM keeps their values.
        unsafe {
            blas::sgemm_strided_batched(
                *self.blas.handle(),
                op(g.transa),
                op(g.transb),
                i(g.m),
                i(g.n),
                i(g.k),
                &alpha,
                self.at(a.0.buf, a.0.offset, 4) as *const f32,
                i(a.1),
                l(a.2),
                self.at(b.0.buf, b.0.offset, 4) as *const f32,
                i(b.1),
                l(b.2),
                &beta,
                self.at(c.0.buf, c.0.offset, 4) as *mut f32,
                i(c.1),
                l(c.2),
                i(g.batch),
            )
        }
        .map_err(|e| cuda_err("GEMM", e))
    }
}

impl Executor for CudaWorkspace {
    fn write_bytes(&mut self, b: Buf, offset: usize, bytes: &[u8]) -> Result<()> {
        let r = span(b, offset, bytes.len(), self.sizes[b.0])?;
        let mut dst = self.buffers[b.0].slice_mut(r);
        self.stream
            .memcpy_htod(bytes, &mut dst)
            .map_err(|e| cuda_err("copy to the device", e))
    }

    fn read_bytes(&mut self, b: Buf, offset: usize, out: &mut [u8]) -> Result<()> {
        let r = span(b, offset, out.len(), self.sizes[b.0])?;
        let src = self.buffers[b.0].slice(r);
        self.stream
            .memcpy_dtoh(&src, out)
            .map_err(|e| cuda_err("copy from the device", e))?;
        self.stream
            .synchronize()
            .map_err(|e| cuda_err("synchronize", e))
    }

    fn run(&mut self, plan: &Plan, updates: usize) -> Result<()> {
        if self.sizes.len() != plan.buffers.len() {
            return Err(Error::Config("plan: a workspace of another plan".into()));
        }
        self.capture_graphs(plan);
        match &self.mode {
            Mode::Graphs(_, one, many) => {
                for _ in 0..updates / GRAPH_UPDATES {
                    many.launch().map_err(|e| cuda_err("graph launch", e))?;
                }
                for _ in 0..updates % GRAPH_UPDATES {
                    one.launch().map_err(|e| cuda_err("graph launch", e))?;
                }
            }
            Mode::Eager(_) | Mode::Untried => {
                for _ in 0..updates {
                    self.queue_update(plan)?;
                }
            }
        }
        // Done when it returns: the caller times the updates and may read the host next.
        self.stream
            .synchronize()
            .map_err(|e| cuda_err("synchronize", e))
    }

    fn run_ops(&mut self, plan: &Plan, ops: &[Op]) -> Result<()> {
        if self.sizes.len() != plan.buffers.len() {
            return Err(Error::Config("plan: a workspace of another plan".into()));
        }
        for op in ops {
            self.queue(op)?;
        }
        self.stream
            .synchronize()
            .map_err(|e| cuda_err("synchronize", e))
    }

    fn force_eager(&mut self) {
        self.mode = Mode::Eager("as asked".into());
    }

    fn prepare(&mut self, plan: &Plan) -> Result<()> {
        self.capture_graphs(plan);
        self.stream
            .synchronize()
            .map_err(|e| cuda_err("synchronize", e))
    }

    fn describe(&self) -> String {
        match &self.mode {
            Mode::Untried => "cuda".into(),
            Mode::Graphs(..) => format!("cuda graphs (1 and {GRAPH_UPDATES} updates)"),
            Mode::Eager(why) => format!("cuda eager ({why})"),
        }
    }
}

/// A kernel's arguments as plain values, in order.
#[derive(Default)]
struct Args {
    values: Vec<Arg>,
}

enum Arg {
    U64(u64),
    U32(u32),
    I32(i32),
}

impl Args {
    fn u64(&mut self, v: u64) -> &mut Self {
        self.values.push(Arg::U64(v));
        self
    }

    /// Device pointers, as 64-bit values.
    fn ptrs(&mut self, ps: &[u64]) -> &mut Self {
        self.values.extend(ps.iter().map(|&p| Arg::U64(p)));
        self
    }

    /// Dimensions as the kernels' `uint32_t` (the plan's builder checked they fit).
    fn u32s(&mut self, xs: &[usize]) -> &mut Self {
        self.values.extend(xs.iter().map(|&x| Arg::U32(x as u32)));
        self
    }

    fn i32(&mut self, v: i32) -> &mut Self {
        self.values.push(Arg::I32(v));
        self
    }

    fn push_to<'a>(&'a self, b: &mut candle_core::cuda_backend::cudarc::driver::LaunchArgs<'a>) {
        for v in &self.values {
            match v {
                Arg::U64(x) => b.arg(x),
                Arg::U32(x) => b.arg(x),
                Arg::I32(x) => b.arg(x),
            };
        }
    }
}
