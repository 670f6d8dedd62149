//! The fused step on the CPU: even parts of whole tiles run on [`crate::pool`], inner loops
//! over blocks of 4 elements (one Philox call each) that the compiler vectorises; AVX2+FMA
//! and AVX-512 builds of the same code are chosen by [`super::isa`]. No allocation per step
//! beyond the per-tile partial sums.

use std::cell::{Cell, RefCell};
use std::ops::Range;

use candle_core::{backend::BackendStorage, CpuStorage, InplaceOp2, Layout};

use super::isa::{self, Isa};
use super::noise::{Autovec, Normals};
use super::{buffer::StateBuffer, update, LentUpdate, StepConsts, TensorSums, Update};
use crate::pool::{self, Disjoint};
use crate::rng::NoiseKey;

/// Elements per chunk of the sums: Σv² (and Σα) is summed tile by tile within each chunk,
/// then over chunks in order. Fixed, so the sums do not depend on the number of threads;
/// a multiple of the 256-element tile.
pub const CHUNK: usize = 1 << 15;
const _: () = assert!(CHUNK.is_multiple_of(TILE));
/// Elements whose noise is generated before they are updated (keeps z in L1).
const TILE: usize = 256;

/// Philox blocks per tile.
const BLOCKS: usize = TILE / 4;

/// The normals of elements `4·first_block ..` of a tile, by build `N`.
///
/// # Safety
/// The CPU has the features `N` needs.
#[inline(always)]
unsafe fn normals_tile<N: Normals>(key: &NoiseKey, first_block: u32, z: &mut [[f32; 4]; BLOCKS]) {
    unsafe {
        let counters: [u32; BLOCKS] = std::array::from_fn(|b| first_block.wrapping_add(b as u32));
        N::blocks::<BLOCKS>(key, &counters, z);
    }
}

/// One tile of the element update `update`: (Σv², Σα) after it and Σθ·∇ before it, each
/// summed in eight fixed f64 lanes (vectorisable, and the same order whatever the
/// threads). `momentum` and `alpha` are empty where the rule has no such state. The one
/// dispatch over the element updates on the CPU; each arm's loop is what the compiler
/// vectorises, so the rule is chosen per tile, not per element.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn tile_update<N: Normals>(
    update: Update,
    theta: &mut [f32],
    momentum: &mut [f32],
    alpha: &mut [f32],
    grad: &[f32],
    key: &NoiseKey,
    first_block: u32,
    c: StepConsts,
) -> TensorSums {
    unsafe {
        let n = theta.len();
        let mut blocks = [[0f32; 4]; BLOCKS];
        normals_tile::<N>(key, first_block, &mut blocks);
        let z = blocks.as_flattened_mut();
        // θ·∇ per element, summed after the loop (a sum inside it would not vectorise).
        let mut virial = [0f32; TILE];
        let mut sums = update::tile(
            update,
            theta,
            momentum,
            alpha,
            grad,
            &mut z[..n],
            &mut virial[..n],
            c,
        );
        sums.virial = lanes8(&virial[..n]);
        sums
    }
}

/// How far ahead of the tile being updated its operands are prefetched, in elements.
const PREFETCH_AHEAD: usize = TILE;

/// Asks for the cache lines of `values[from .. from + TILE]` (those that exist): the tile's
/// noise takes long enough that the loads of its update otherwise miss in turn, the
/// hardware prefetcher not running that far ahead of a stream that pauses.
#[inline(always)]
fn prefetch_tile(values: &[f32], from: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        let end = (from + TILE).min(values.len());
        let mut i = from;
        while i < end {
            // SAFETY: i < values.len(); a prefetch never faults anyway.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(values.as_ptr().add(i) as *const i8) };
            i += 16;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (values, from);
}

/// One chunk of a tensor: its slices, the noise key and the chunk's element offset.
struct Chunk<'a> {
    update: Update,
    theta: &'a mut [f32],
    momentum: &'a mut [f32],
    alpha: &'a mut [f32],
    grad: &'a [f32],
    key: &'a NoiseKey,
    offset: usize,
    c: StepConsts,
}

/// The tiles of one part: each tile's sums into `sums` (one entry per tile).
///
/// # Safety
/// The CPU has the features `N` needs.
#[inline(always)]
unsafe fn chunk_update<N: Normals>(job: Chunk<'_>, sums: &mut [TensorSums]) {
    unsafe {
        let Chunk {
            update,
            theta,
            momentum,
            alpha,
            grad,
            key,
            offset,
            c,
        } = job;
        let thermostat = matches!(update, Update::Thermostat { .. });
        let mut start = 0;
        while start < theta.len() {
            let end = (start + TILE).min(theta.len());
            if !thermostat {
                prefetch_tile(&theta[..], start + PREFETCH_AHEAD);
                prefetch_tile(grad, start + PREFETCH_AHEAD);
                prefetch_tile(&momentum[..], start + PREFETCH_AHEAD);
            }
            // (A state the rule has not stays empty.)
            let m: &mut [f32] = match momentum.is_empty() {
                true => &mut [],
                false => &mut momentum[start..end],
            };
            let a: &mut [f32] = match alpha.is_empty() {
                true => &mut [],
                false => &mut alpha[start..end],
            };
            sums[start / TILE] = tile_update::<N>(
                update,
                &mut theta[start..end],
                m,
                a,
                &grad[start..end],
                key,
                ((offset + start) / 4) as u32,
                c,
            );
            start = end;
        }
    }
}

/// The same code compiled for 256-bit vectors, with FMA so that the noise polynomials'
/// explicit fused multiply-adds are single instructions (Rust never contracts a·b + c on
/// its own, so the rest stays bit-identical to the portable build and the kernel header).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn chunk_update_avx2(job: Chunk<'_>, sums: &mut [TensorSums]) {
    unsafe { chunk_update::<super::noise::Avx2>(job, sums) }
}

/// The same code for 512-bit vectors (16 Philox blocks or normals per instruction).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512dq,avx512vl,avx512bw,avx2,fma")]
unsafe fn chunk_update_avx512(job: Chunk<'_>, sums: &mut [TensorSums]) {
    unsafe { chunk_update::<Autovec>(job, sums) }
}

/// [`chunk_update`] on `isa`'s build.
fn chunk_dispatch(isa: Isa, job: Chunk<'_>, sums: &mut [TensorSums]) {
    match isa {
        // SAFETY: `isa` is at most what the CPU has (isa::current caps at Isa::best).
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe { chunk_update_avx512(job, sums) },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { chunk_update_avx2(job, sums) },
        // SAFETY: the compiler's own loops need nothing beyond the build's baseline.
        _ => unsafe { chunk_update::<Autovec>(job, sums) },
    }
}

/// How many even parts of whole tiles the pool runs a tensor of `n` elements in: one
/// where it is a single chunk (too small to pay for a second thread), else its chunks
/// rounded up to a multiple of the threads. Why not a part per chunk: 784-100-10's W₁ is
/// 2.4 chunks, and the thread that ran two of the three parts took 100 µs of a 130 µs
/// step of it while the other waited (batch 1000, timed per job).
fn parts_of(n: usize) -> usize {
    let chunks = n.div_ceil(CHUNK);
    if chunks <= 1 {
        return 1;
    }
    chunks
        .next_multiple_of(pool::threads())
        .min(n.div_ceil(TILE))
}

/// Part `i` of `parts` over a tensor of `n` elements: its tiles and its elements.
fn part_range(i: usize, parts: usize, n: usize) -> (Range<usize>, Range<usize>) {
    let tiles = n.div_ceil(TILE);
    let (first, last) = (i * tiles / parts, (i + 1) * tiles / parts);
    (first..last, first * TILE..(last * TILE).min(n))
}

/// The tiles' sums added in the fixed order: from zero in tile order within each chunk,
/// then the chunks' sums from zero in order, whatever the parts were.
fn chunk_ordered_sum<T: Copy + Default + std::ops::Add<Output = T>>(tile_sums: &[T]) -> T {
    let chunk = |c: &[T]| c.iter().fold(T::default(), |acc, &t| acc + t);
    tile_sums
        .chunks(CHUNK / TILE)
        .fold(T::default(), |acc, c| acc + chunk(c))
}

/// Applies one fused update to a whole parameter tensor (`theta`, its `momentum` — empty
/// for SGLD — its per-element thermostats `alpha` — empty but for mSGNHT — and its
/// gradient), with noise from `key`. Returns (Σv², Σα) after the update and Σθ·∇ before
/// it, each summed per chunk and then over chunks in order.
pub fn step(
    update: Update,
    theta: &mut [f32],
    momentum: &mut [f32],
    alpha: &mut [f32],
    grad: &[f32],
    key: NoiseKey,
    c: StepConsts,
) -> TensorSums {
    let n = theta.len();
    assert_eq!(n, grad.len(), "gradient of the wrong length");
    let (has_v, has_alpha) = update.states();
    assert!(
        !has_v || momentum.len() == n,
        "momentum of the wrong length"
    );
    assert!(
        !has_alpha || alpha.len() == n,
        "thermostats of the wrong length"
    );
    let parts = parts_of(n);
    let mut tile_sums = vec![TensorSums::default(); n.div_ceil(TILE)];
    let isa = isa::current();
    let (t, m, al, s) = (
        Disjoint::new(theta),
        Disjoint::new(momentum),
        Disjoint::new(alpha),
        Disjoint::new(&mut tile_sums),
    );
    pool::run(parts, &|i| {
        let (tiles, elements) = part_range(i, parts, n);
        let (first, last) = (elements.start, elements.end);
        // SAFETY: part i alone touches its elements of θ, v and α, and its tiles' sums.
        let (theta, momentum, alpha, sums) = unsafe {
            (
                t.slice(first, last),
                if has_v { m.slice(first, last) } else { &mut [] },
                if has_alpha {
                    al.slice(first, last)
                } else {
                    &mut []
                },
                s.slice(tiles.start, tiles.end),
            )
        };
        let job = Chunk {
            update,
            theta,
            momentum,
            alpha,
            grad: &grad[first..last],
            key: &key,
            offset: first,
            c,
        };
        chunk_dispatch(isa, job, sums);
    });
    // (Σv² ≥ +0, so starting the chunks' sum from +0 rather than −0 changes no bit.)
    chunk_ordered_sum(&tile_sums)
}

/// e^x in plain f32 operations that vectorise (libm's `expf` is a call per element):
/// Cody–Waite reduction x = n·ln 2 + r, Cephes' `expf` polynomial on |r| ≤ ln2/2 (within
/// 2 ulp of the true value), and 2ⁿ assembled in the exponent bits. x is clamped to
/// [−87, 88], where 2ⁿ stays a normal number (the splitting scheme's damping e^{−α/2}
/// needs nothing outside it).
#[allow(clippy::excessive_precision)] // Cephes' published digits
#[inline(always)]
pub fn exp_f32(x: f32) -> f32 {
    let x = x.clamp(-87.0, 88.0);
    let n = (x * std::f32::consts::LOG2_E + 0.5).floor();
    let r = (x - n * 0.693_359_375) - n * -2.121_944_4e-4;
    let mut p = 1.987_569_15e-4;
    p = p * r + 1.398_199_95e-3;
    p = p * r + 8.333_451_9e-3;
    p = p * r + 4.166_579_59e-2;
    p = p * r + 1.666_666_55e-1;
    p = p * r + 5.000_000_12e-1;
    let y = p * (r * r) + r + 1.0;
    // n + 127 in [1, 254]: its low 8 bits by the 2²³ trick (no float→int conversion).
    let biased = (n + (127.0 + 8_388_608.0)).to_bits() & 0xff;
    y * f32::from_bits(biased << 23)
}

/// Σ of `values` in eight fixed f64 lanes, added up at the end: vectorisable, and the
/// same order whatever the threads.
#[inline(always)]
pub(crate) fn lanes8(values: &[f32]) -> f64 {
    let mut lanes = [0f64; 8];
    let full = values.chunks_exact(8);
    let rest = full.remainder();
    for ch in full {
        for l in 0..8 {
            lanes[l] += ch[l] as f64;
        }
    }
    for (l, &v) in rest.iter().enumerate() {
        lanes[l] += v as f64;
    }
    lanes.iter().sum()
}

/// The fused step as a candle in-place op on (θ, ∇Ũ): θ is the destination (the `Var`'s
/// storage), the gradient a distinct source, the sampler's state buffers of the tensor
/// lent for this call.
pub struct FusedStepOp<'a> {
    /// The update and the buffers it moves.
    pub lane: RefCell<LentUpdate<'a>>,
    /// The update's sums, set by the op.
    pub sums: Cell<TensorSums>,
}

impl<'a> FusedStepOp<'a> {
    /// The op of one lent update.
    pub fn new(lane: LentUpdate<'a>) -> Self {
        FusedStepOp {
            lane: RefCell::new(lane),
            sums: Cell::new(TensorSums::default()),
        }
    }
}

/// θ (the destination) and ∇ of a fused op as the f32 ranges their layouts cover.
pub(crate) fn theta_and_grad<'s>(
    s1: &'s mut CpuStorage,
    l1: &Layout,
    s2: &'s CpuStorage,
    l2: &Layout,
) -> candle_core::Result<(&'s mut [f32], &'s [f32])> {
    let dtype = s1.dtype();
    let (CpuStorage::F32(theta), CpuStorage::F32(grad)) = (s1, s2) else {
        candle_core::bail!("fused sampler step: parameters must be f32, got {dtype:?}");
    };
    let (Some((a, b)), Some((ga, gb))) = (l1.contiguous_offsets(), l2.contiguous_offsets()) else {
        candle_core::bail!("fused sampler step: a tensor is not contiguous");
    };
    Ok((&mut theta[a..b], &grad[ga..gb]))
}

/// The lent update `lane` of the tensor `theta` (its gradient `grad`) on the CPU, and its
/// sums. One definition for a tensor alone and for each chain's row of a stacked
/// tensor ([`crate::stacked::step`]).
pub(crate) fn lane_step(
    lane: &mut LentUpdate<'_>,
    theta: &mut [f32],
    grad: &[f32],
) -> candle_core::Result<TensorSums> {
    let m: &mut [f32] = match lane.momentum.as_deref_mut() {
        None => &mut [],
        Some(StateBuffer::Host(v)) => v,
        Some(_) => candle_core::bail!("fused sampler step: the momentum is not on the CPU"),
    };
    let alpha: &mut [f32] = match lane.thermostat.as_deref_mut() {
        None => &mut [],
        Some(StateBuffer::Host(a)) => a,
        Some(_) => {
            candle_core::bail!("fused sampler step: the per-element state is not on the CPU")
        }
    };
    if lane.update.states().1 && alpha.is_empty() {
        candle_core::bail!("fused sampler step: no per-element state buffer lent");
    }
    Ok(step(
        lane.update,
        theta,
        m,
        alpha,
        grad,
        lane.key,
        lane.consts,
    ))
}

impl InplaceOp2 for FusedStepOp<'_> {
    fn name(&self) -> &'static str {
        "bnn-fused-sampler-step"
    }

    fn cpu_fwd(
        &self,
        s1: &mut CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> candle_core::Result<()> {
        let (theta, grad) = theta_and_grad(s1, l1, s2, l2)?;
        self.sums
            .set(lane_step(&mut self.lane.borrow_mut(), theta, grad)?);
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
        let mut lane = self.lane.borrow_mut();
        self.sums.set(super::cuda::step(s1, l1, s2, l2, &mut lane)?);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::exp_f32;

    #[test]
    fn exp_f32_is_within_two_ulp_of_exp() {
        // Every 97th float in [−87, 88] plus the edges and the damping range of the
        // thermostat; the reference in f64, rounded.
        let mut x = -87.0f32;
        let mut checked = 0;
        let check = |x: f32| {
            let want = (x as f64).exp();
            let got = exp_f32(x) as f64;
            let ulp = (want as f32).abs() * f32::EPSILON;
            assert!(
                (got - want).abs() <= 2.0 * ulp as f64,
                "exp({x}) = {got}, want {want}"
            );
        };
        while x <= 88.0 {
            check(x);
            checked += 1;
            x = f32::from_bits(if x < 0.0 {
                x.to_bits() - 97 * 4096
            } else {
                x.to_bits() + 97 * 4096
            });
            if x.abs() < 1e-30 {
                x = 1e-30;
            }
        }
        for x in [
            0.0,
            -0.0,
            1e-8,
            -1e-8,
            -0.05,
            -0.5,
            -2.0,
            std::f32::consts::LN_2,
            88.0,
            -87.0,
        ] {
            check(x);
        }
        assert!(checked > 1000, "{checked}");
        // Outside the range: clamped, finite, monotone; NaN stays NaN.
        assert_eq!(exp_f32(-200.0), exp_f32(-87.0));
        assert!(exp_f32(200.0).is_finite());
        assert!(exp_f32(f32::NAN).is_nan());
    }
}
