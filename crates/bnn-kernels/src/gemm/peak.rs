//! The machine's limit for the products (a roofline's ceiling): the peak rate of
//! multiply-adds on the current kernel path, measured and computed.
//!
//! *Measured*: every thread runs [`CHAINS`] independent chains of vector multiply-adds
//! whose operands never leave the registers, so nothing but the FMA units limits them
//! (12 chains: a multiply-add's latency of 4–5 cycles times 2 pipes needs ≥ 10 in flight;
//! 12 accumulators and 2 operands fit AVX2's 16 registers).
//! *Computed*: clock × lanes × 2 flops (fused) × 2 pipes × threads, the clock measured
//! as a chain of dependent integer adds (one cycle each on every x86-64 core). Two
//! 256-bit FMA pipes is what Haswell and later Intel cores and Zen 1–4 have; for
//! AVX-512 two 512-bit pipes is the Xeon Gold 6xxx / Platinum and Zen 5 figure, one the
//! Xeon Silver, Gold 5xxx and Zen 4 (which splits 512-bit work in two): measured ÷
//! computed near ½ tells such a part.

use std::time::Instant;

use super::simd::{self, Simd};
use crate::isa::{self, Isa};

/// Independent accumulator chains per thread.
pub(super) const CHAINS: usize = 12;
/// Multiply-add iterations (of all chains) per timed run: ≈ 2 ms at 100 GFLOP/s (AVX2).
const ITERS: usize = 100_000;
/// Timed runs; the fastest counts (a shared machine only ever slows a run down, and a
/// second vCPU may be taken away for milliseconds at a time: many short rounds).
const ROUNDS: usize = 31;

/// The peak of the current path on `threads` threads.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Peak {
    /// The kernel path (`avx512`, `avx2`, `portable`).
    pub isa: &'static str,
    /// Threads that ran the loop at once.
    pub threads: usize,
    /// f32 lanes of one vector instruction of the path (the portable path's SSE2 or NEON
    /// vectors: 4).
    pub lanes: usize,
    /// Whether the path's multiply-add is one fused instruction.
    pub fused: bool,
    /// GFLOP/s of the register-only loop, all threads together.
    pub measured_gflop_per_s: f64,
    /// Clock in GHz from the dependent-add chain (x86-64 only).
    pub ghz: Option<f64>,
    /// clock × lanes × 2 × 2 pipes × threads (x86-64 only).
    pub computed_gflop_per_s: Option<f64>,
}

/// Measures the peak of the current path on `threads` threads of the pool.
pub fn peak(threads: usize) -> Peak {
    let isa = isa::current();
    let threads = threads.clamp(1, crate::pool::threads());
    let flops = (ITERS * CHAINS * lanes_of(isa) * 2 * threads) as f64;
    let seconds = fastest_parallel(threads, &|| {
        std::hint::black_box(fma_chains(isa, ITERS));
    });
    let ghz = clock_ghz(threads);
    let lanes = match isa {
        Isa::Portable => 4,
        _ => lanes_of(isa),
    };
    let fused = isa != Isa::Portable || simd::PORTABLE_FUSED;
    Peak {
        isa: isa.name(),
        threads,
        lanes,
        fused,
        measured_gflop_per_s: flops / seconds / 1e9,
        ghz,
        computed_gflop_per_s: ghz
            .map(|g| g * lanes as f64 * if fused { 2.0 } else { 1.0 } * 2.0 * threads as f64),
    }
}

/// The fastest of [`ROUNDS`] timed runs of `f` on `threads` threads of the pool at once,
/// in seconds (after one untimed run). A round in which one thread took two parts (a
/// helper slow to wake, or descheduled on a shared machine) measures half the rate: such
/// rounds count only when no round ran its parts on distinct threads.
fn fastest_parallel(threads: usize, f: &(dyn Fn() + Sync)) -> f64 {
    let round = || {
        let ids = std::sync::Mutex::new(std::collections::HashSet::with_capacity(threads));
        let start = Instant::now();
        crate::pool::run(threads, &|_| {
            f();
            if let Ok(mut ids) = ids.lock() {
                ids.insert(std::thread::current().id());
            }
        });
        let seconds = start.elapsed().as_secs_f64();
        let distinct = ids.into_inner().map_or(0, |ids| ids.len());
        (distinct == threads, seconds)
    };
    round();
    let rounds: Vec<(bool, f64)> = (0..ROUNDS).map(|_| round()).collect();
    let best = |all: bool| {
        rounds
            .iter()
            .filter(|(distinct, _)| all || *distinct)
            .map(|&(_, s)| s)
            .fold(f64::INFINITY, f64::min)
    };
    match best(false) {
        s if s.is_finite() => s,
        _ => best(true),
    }
}

/// Lanes of the path's vector type (the portable one is 8 lanes of two registers) and its
/// register-only loop, [`Simd::fma_chains`].
fn path_of(isa: Isa) -> (usize, unsafe fn(usize) -> f32) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => (simd::Avx512::LANES, simd::Avx512::fma_chains),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => (simd::Avx2::LANES, simd::Avx2::fma_chains),
        _ => (simd::Portable::LANES, simd::Portable::fma_chains),
    }
}

fn lanes_of(isa: Isa) -> usize {
    path_of(isa).0
}

/// [`CHAINS`] × `iters` multiply-adds on path `isa`; returns their sum so that nothing
/// is left out.
pub(super) fn fma_chains(isa: Isa, iters: usize) -> f32 {
    // SAFETY: isa::current never selects a path the CPU lacks.
    unsafe { path_of(isa).1(iters) }
}

/// The body of [`Simd::fma_chains`], compiled with the path's features.
///
/// # Safety
/// The CPU must have path `S`.
#[inline(always)]
pub(super) unsafe fn fma_body<S: Simd>(iters: usize) -> f32 {
    unsafe {
        // x·a + b with a just under 1 and b tiny stays near b/(1 − a): no overflow, no
        // subnormals, and no value the compiler can know.
        let a = S::splat(std::hint::black_box(0.999_999));
        let b = S::splat(std::hint::black_box(1e-7));
        let mut acc = [S::zero(); CHAINS];
        for _ in 0..iters {
            for x in acc.iter_mut() {
                *x = S::fmadd(*x, a, b);
            }
        }
        let mut lanes = [0f32; 16];
        let mut total = 0.0;
        for x in acc {
            S::store(lanes.as_mut_ptr(), x);
            total += lanes[..S::LANES].iter().sum::<f32>();
        }
        total
    }
}

/// The clock in GHz on `threads` threads at once: a chain of 100 dependent adds per
/// loop iteration takes 100 cycles; the loop's own decrement and branch run beside it.
fn clock_ghz(threads: usize) -> Option<f64> {
    #[cfg(target_arch = "x86_64")]
    {
        const LOOPS: u64 = 200_000;
        let seconds = fastest_parallel(threads, &|| {
            let (mut x, mut n) = (0u64, LOOPS);
            // SAFETY: registers only; the flags it changes are declared clobbered (asm!
            // assumes so unless told `preserves_flags`).
            unsafe {
                std::arch::asm!(
                    "2:",
                    ".rept 100",
                    "add {x}, 1",
                    ".endr",
                    "dec {n}",
                    "jnz 2b",
                    x = inout(reg) x,
                    n = inout(reg) n,
                    options(nomem, nostack),
                );
            }
            std::hint::black_box((x, n));
        });
        Some(100.0 * LOOPS as f64 / seconds / 1e9)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = threads;
        None
    }
}
