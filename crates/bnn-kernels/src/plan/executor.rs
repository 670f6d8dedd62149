//! What runs a [`Plan`]: its buffers allocated once, values copied in and out between
//! updates, and S updates at a time. The host executor ([`super::host::HostWorkspace`])
//! and the CUDA one (`super::cuda::CudaWorkspace`, feature `cuda`) are the two; the
//! binding of a chain's state to a plan (`bnn_core::engine::planned`) sees only this.

use super::{Buf, ChainControl, Op, Plan, TensorTable};
use crate::error::{Error, Result};

/// Values a plan's buffers hold, copied as their bytes.
///
/// # Safety
/// Every bit pattern of the type's size is a valid value and the type has no padding
/// bytes (`ChainControl` and `TensorTable` carry explicit `pad` fields; their sizes are
/// checked against the C layouts in the tests).
pub unsafe trait Plain: Copy + Default + 'static {}
// SAFETY: primitive numbers: any bits, no padding.
unsafe impl Plain for f32 {}
// SAFETY: as above.
unsafe impl Plain for f64 {}
// SAFETY: as above.
unsafe impl Plain for u32 {}
// SAFETY: #[repr(C)] of u64, f64, f32 and u32 fields with an explicit pad: no padding.
unsafe impl Plain for ChainControl {}
// SAFETY: as above.
unsafe impl Plain for TensorTable {}

/// A plan's workspace on the host or a device.
pub trait Executor: std::fmt::Debug + Send {
    /// Copies `bytes` into buffer `b` from its byte `offset`.
    fn write_bytes(&mut self, b: Buf, offset: usize, bytes: &[u8]) -> Result<()>;
    /// Copies buffer `b`'s bytes from `offset` into `out` (a host read: on a device it
    /// waits for the updates queued before it).
    fn read_bytes(&mut self, b: Buf, offset: usize, out: &mut [u8]) -> Result<()>;
    /// `updates` updates of `plan`, whose workspace this is, with no host read between
    /// them; returns when they are done.
    fn run(&mut self, plan: &Plan, updates: usize) -> Result<()>;
    /// `ops`, operations over `plan`'s buffers that are not its update (a held-out set's
    /// forward pass, `mlp::MlpPlan::predictions`), once each in order, launched one by
    /// one; returns when they are done.
    fn run_ops(&mut self, plan: &Plan, ops: &[Op]) -> Result<()>;
    /// Which executor ran, for the log and the summary: `host`, `cuda graph`, or `cuda
    /// eager` with why capture failed.
    fn describe(&self) -> String;
    /// Launches the updates one by one from now on, never as a captured graph (what a
    /// failed capture falls back to; the GPU tests compare the two). The host executor
    /// has nothing to capture.
    fn force_eager(&mut self) {}
    /// Readies `plan`'s updates before the first run (the CUDA executor captures its
    /// graphs, so that no run's time includes a capture). The host executor has nothing
    /// to ready.
    fn prepare(&mut self, _plan: &Plan) -> Result<()> {
        Ok(())
    }
}

impl dyn Executor + '_ {
    /// Writes `values` into buffer `b` from its element `at`.
    pub fn write<T: Plain>(&mut self, b: Buf, at: usize, values: &[T]) -> Result<()> {
        let size = std::mem::size_of::<T>();
        // SAFETY: `T: Plain` has no padding, so each of its bytes is initialised.
        let bytes = unsafe {
            std::slice::from_raw_parts(values.as_ptr().cast::<u8>(), std::mem::size_of_val(values))
        };
        self.write_bytes(b, at * size, bytes)
    }

    /// `n` values of buffer `b` from its element `at`.
    pub fn read<T: Plain>(&mut self, b: Buf, at: usize, n: usize) -> Result<Vec<T>> {
        let size = std::mem::size_of::<T>();
        let mut out = vec![T::default(); n];
        // SAFETY: `T: Plain`: any bytes written into `out` form valid values.
        let bytes =
            unsafe { std::slice::from_raw_parts_mut(out.as_mut_ptr().cast::<u8>(), size * n) };
        self.read_bytes(b, at * size, bytes)?;
        Ok(out)
    }

    /// Chain k's control block in buffer `b`.
    pub fn control(&mut self, b: Buf, k: usize) -> Result<ChainControl> {
        Ok(self.read::<ChainControl>(b, k, 1)?[0])
    }

    /// Writes chain k's control block into buffer `b`.
    pub fn set_control(&mut self, b: Buf, k: usize, c: &ChainControl) -> Result<()> {
        self.write(b, k, std::slice::from_ref(c))
    }
}

/// The byte range `offset..offset + len` of a buffer of `size` bytes, or an error.
pub(crate) fn span(
    b: Buf,
    offset: usize,
    len: usize,
    size: usize,
) -> Result<std::ops::Range<usize>> {
    match offset.checked_add(len) {
        Some(end) if end <= size => Ok(offset..end),
        _ => Err(Error::Config(format!(
            "plan: bytes {offset}..+{len} past buffer {} of {size}",
            b.0
        ))),
    }
}
