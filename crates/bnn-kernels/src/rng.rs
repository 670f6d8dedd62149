//! Counter-based random numbers: Philox-4×32-10 (Salmon et al., "Parallel random numbers:
//! as easy as 1, 2, 3", SC 2011) and Box–Muller Gaussians.
//!
//! The injected noise of every sampler is a pure function of (seed, step, parameter id,
//! element index): the key is the seed, the counter is (element block, parameter id,
//! step low, step high). The same noise therefore comes out whatever the order or the
//! number of threads that produce it, and a kernel on another device can reproduce it.

/// Philox-4×32-10's multipliers and Weyl key increments (Salmon et al. 2011, §3.3); the
/// CPU kernels' vectorised Philox ([`crate::noise`]) uses them too.
pub(crate) const M0: u32 = 0xD251_1F53;
pub(crate) const M1: u32 = 0xCD9E_8D57;
pub(crate) const W0: u32 = 0x9E37_79B9;
pub(crate) const W1: u32 = 0xBB67_AE85;

#[inline(always)]
fn mulhilo(a: u32, b: u32) -> (u32, u32) {
    let p = (a as u64) * (b as u64);
    ((p >> 32) as u32, p as u32)
}

/// Philox-4×32 with 10 rounds: four 32-bit outputs for one 128-bit counter and 64-bit key.
#[inline(always)]
pub fn philox4x32_10(counter: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    let mut c = counter;
    let mut k = key;
    for round in 0..10 {
        let (hi0, lo0) = mulhilo(M0, c[0]);
        let (hi1, lo1) = mulhilo(M1, c[2]);
        c = [hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0];
        if round < 9 {
            k = [k[0].wrapping_add(W0), k[1].wrapping_add(W1)];
        }
    }
    c
}

/// A uniform in (0, 1], from the top 24 bits, so that `ln` never sees zero.
#[inline(always)]
pub fn uniform_open0(x: u32) -> f32 {
    ((x >> 8) + 1) as f32 * (1.0 / 16_777_216.0)
}

/// Natural logarithm for x in (0, 1], in f32 multiplications, additions and explicit fused
/// multiply-adds (Cephes' `logf` polynomial by Horner's rule, within 2 ulp). Written out
/// here, and identically in `kernels/sampler_math.h` (`fmaf`) and the Metal shader
/// (`fma`), so that the CPU op, the host-compiled kernel header and the GPU kernels produce
/// the same bits: each operation is one IEEE-754 rounding everywhere, where a libm `logf`
/// differs between platforms. The fused multiply-adds take a quarter off the noise's cost
/// (one rounding instead of two per Horner step; measured in BENCHMARKS). Branches are
/// written as selects so that the fused CPU op's loops vectorise.
#[allow(clippy::excessive_precision)] // Cephes' published digits, as in the C header
#[inline(always)]
pub fn log_unit(x: f32) -> f32 {
    let bits = x.to_bits();
    let e0 = ((bits >> 23) & 0xff) as i32 - 126;
    let m0 = f32::from_bits((bits & 0x007f_ffff) | 0x3f00_0000);
    let small = m0 < 0.707_106_77;
    let e = if small { e0 - 1 } else { e0 };
    let m = if small { m0 + m0 } else { m0 };
    let x = m - 1.0;
    let z = x * x;
    let mut y: f32 = 7.037_683_6e-2;
    y = y.mul_add(x, -1.151_461_03e-1);
    y = y.mul_add(x, 1.167_699_87e-1);
    y = y.mul_add(x, -1.242_014_08e-1);
    y = y.mul_add(x, 1.424_932_28e-1);
    y = y.mul_add(x, -1.666_805_77e-1);
    y = y.mul_add(x, 2.000_071_48e-1);
    y = y.mul_add(x, -2.499_999_4e-1);
    y = y.mul_add(x, 3.333_333_1e-1);
    y = y * x * z;
    let ef = e as f32;
    y = ef.mul_add(-2.121_944_4e-4, y);
    y = (-0.5f32).mul_add(z, y);
    ef.mul_add(0.693_359_4, x + y)
}

/// (sin 2πu, cos 2πu) for u in [0, 1], by reduction to the nearest quarter turn and
/// Cephes' `sinf`/`cosf` polynomials on [−π/4, π/4]; same remarks as [`log_unit`].
#[allow(clippy::excessive_precision)] // Cephes' published digits, as in the C header
#[inline(always)]
pub fn sincos_turn(u: f32) -> (f32, f32) {
    // q = (int)(u·4 + 0.5) for u·4 + 0.5 in [0.5, 4.5], as floor, then its low bits by the
    // 2²³ trick: no float→int conversion, whose saturating form does not vectorise.
    let qf = (u * 4.0 + 0.5).floor();
    let q = (qf + 8_388_608.0).to_bits() & 3;
    let a = (u * 4.0 - qf) * std::f32::consts::FRAC_PI_2;
    let a2 = a * a;
    let ps = a2
        .mul_add(-1.951_529_6e-4, 8.332_161e-3)
        .mul_add(a2, -1.666_665_5e-1);
    let s = (a * a2).mul_add(ps, a);
    let pc = a2
        .mul_add(2.443_315_7e-5, -1.388_731_6e-3)
        .mul_add(a2, 4.166_664_6e-2);
    let c = (a2 * a2).mul_add(pc, (-0.5f32).mul_add(a2, 1.0));
    let odd = q & 1 != 0;
    let (s1, c1) = if odd { (c, -s) } else { (s, c) };
    if q & 2 != 0 {
        (-s1, -c1)
    } else {
        (s1, c1)
    }
}

/// Two standard normals from two uniforms (Box–Muller).
#[inline(always)]
pub fn box_muller(a: u32, b: u32) -> (f32, f32) {
    let u1 = uniform_open0(a);
    let u2 = uniform_open0(b);
    let r = (-2.0 * log_unit(u1)).sqrt();
    let (s, c) = sincos_turn(u2);
    (r * c, r * s)
}

// Every seed stream of the project, in one place. A run seeded s draws its initial
// weights from `StdRng` seeded s itself, its injected noise from Philox keyed by s
// ([`NoiseKey`]), and the rest from the streams below, so that no two draws share one.

/// Separates the seeds of a run's chains (`--chains`).
const CHAIN_STREAM: u64 = 0x4348_4149_4e00_0000;
/// The minibatch order: `StdRng` seeded s ^ SHUFFLE_STREAM, one shuffle per epoch.
pub const SHUFFLE_STREAM: u64 = 0x5348_5546_464c_4500;
/// The prior's Gibbs step at the end of epoch e: `StdRng` seeded s ^ GIBBS_STREAM ^ e.
pub const GIBBS_STREAM: u64 = 0x4749_4242_5300_0000;
/// A regression's noise-precision Gibbs step at the end of epoch e: `StdRng` seeded
/// s ^ GIBBS_STREAM ^ e ^ NOISE_GIBBS_STREAM.
pub const NOISE_GIBBS_STREAM: u64 = 0x4e4f_4953_4500_0000;
/// The initial momenta: the noise stream at this step index, outside any update's.
pub const INIT_STREAM: u64 = u64::MAX;
/// The data of the synthetic Gaussian-mean potential (`bnn sample`): s ^ this.
pub const SYNTHETIC_DATA_STREAM: u64 = 0xDA7A;
/// The synthetic potentials' minibatch draws: s ^ this.
pub const SYNTHETIC_NOISE_STREAM: u64 = 0xBA7C;
/// The synthetic potentials' gradient noise (Philox keyed by s ^ this).
pub const SYNTHETIC_GRADIENT_STREAM: u64 = 0x6E01_5E00;
/// Replica exchange: pair choice, energy noise and the test's draws, `StdRng` from s ^ this.
pub const EXCHANGE_STREAM: u64 = 0x4558_4348_0000_0000;
/// Separates HMC's streams (see [`hmc_iteration_seed`]).
const HMC_STREAM: u64 = 0x484d_4300_0000_0000;

/// The seed of iteration `iteration`'s momentum and accept draws in an HMC chain seeded
/// `seed`: a stream per iteration, so that a resumed chain draws what it would have.
pub fn hmc_iteration_seed(seed: u64, iteration: u64) -> u64 {
    splitmix64(seed ^ HMC_STREAM ^ iteration.rotate_left(32))
}
/// Seeds the label noise of `--permute-labels` (see [`label_noise_seed`]).
const LABEL_NOISE_STREAM: u64 = 0x4c41_4245_4c00_0000;

/// The seed of epoch `epoch`'s label permutation in a run seeded `seed` (the run's seed:
/// every chain and replica of a run sees the same labels, the same posterior).
pub fn label_noise_seed(seed: u64, epoch: usize) -> u64 {
    splitmix64(seed ^ LABEL_NOISE_STREAM ^ epoch as u64)
}

/// Separates the augmentation of each minibatch (`--augment`).
const AUGMENT_STREAM: u64 = 0x4155_474d_0000_0000;

/// The seed of the augmentation of update `step` of a chain seeded `seed`.
pub fn augment_seed(seed: u64, step: u64) -> u64 {
    splitmix64(seed ^ AUGMENT_STREAM ^ step.rotate_left(24))
}

/// The seed of exchange round `round` of a run seeded `seed` (its minibatches, the
/// estimate's added noise, the compensation draws, random pairs).
pub fn exchange_round_seed(seed: u64, round: u64) -> u64 {
    splitmix64(seed ^ EXCHANGE_STREAM ^ round.rotate_left(32))
}

/// The seed of pair (i, i+1)'s try in exchange round `round` (its minibatch, the
/// estimate's added noise, the compensation draw): each pair its own stream, so that the
/// pairs of a round are estimated side by side.
pub fn exchange_pair_seed(seed: u64, round: u64, i: usize) -> u64 {
    splitmix64(exchange_round_seed(seed, round) ^ (i as u64).wrapping_add(1))
}

/// Separates the seeds of replica rounds (see [`replica_round_seed`]).
const REPLICA_STREAM: u64 = 0x5245_504c_0000_0000;

/// The seed of replica `r`'s sampler in exchange round `round` (its momentum re-draw and
/// noise for that round), a SplitMix64 mix apart from every chain seed.
pub fn replica_round_seed(seed: u64, r: usize, round: u64) -> u64 {
    splitmix64(seed ^ REPLICA_STREAM ^ ((r as u64) << 40) ^ round)
}

/// The seed of chain `k` of a run seeded `seed`: chain 0 has the run's seed (so `--chains
/// 1` is the single-chain run), the others a SplitMix64 mix of the seed and k, which
/// does not depend on the number of chains.
pub fn chain_seed(seed: u64, k: usize) -> u64 {
    if k == 0 {
        return seed;
    }
    splitmix64(seed ^ CHAIN_STREAM.wrapping_add(k as u64))
}

/// SplitMix64's output step (Steele, Lea & Flood 2014): a bijective mix of 64 bits.
fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The noise stream of one parameter tensor at one step.
#[derive(Debug, Clone, Copy)]
pub struct NoiseKey {
    /// The run's (or chain's) seed.
    pub seed: u64,
    /// The update counter.
    pub step: u64,
    /// The parameter tensor's index.
    pub param: u32,
}

impl NoiseKey {
    /// Four standard normals for elements `4·block .. 4·block + 3`.
    #[inline(always)]
    pub fn normals4(&self, block: u32) -> [f32; 4] {
        let r = philox4x32_10(
            [
                block,
                self.param,
                self.step as u32,
                (self.step >> 32) as u32,
            ],
            [self.seed as u32, (self.seed >> 32) as u32],
        );
        let (z0, z1) = box_muller(r[0], r[1]);
        let (z2, z3) = box_muller(r[2], r[3]);
        [z0, z1, z2, z3]
    }

    /// The standard normal for element `i`.
    pub fn normal(&self, i: usize) -> f32 {
        self.normals4((i / 4) as u32)[i % 4]
    }

    /// Fills `out` with the normals of elements `0..out.len()`.
    pub fn fill(&self, out: &mut [f32]) {
        for (block, chunk) in out.chunks_mut(4).enumerate() {
            let z = self.normals4(block as u32);
            chunk.copy_from_slice(&z[..chunk.len()]);
        }
    }

    /// The normals of a tensor shaped like `like`, on its device: [`NoiseKey::fill`]'s.
    pub fn normals_like(&self, like: &candle_core::Tensor) -> crate::Result<candle_core::Tensor> {
        let mut z = vec![0f32; like.elem_count()];
        self.fill(&mut z);
        Ok(candle_core::Tensor::from_vec(
            z,
            like.shape(),
            like.device(),
        )?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Known-answer vectors of Random123's `kat_vectors` for philox4x32_10.
    #[test]
    fn philox_known_answers() {
        assert_eq!(
            philox4x32_10([0, 0, 0, 0], [0, 0]),
            [0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8]
        );
        assert_eq!(
            philox4x32_10([u32::MAX; 4], [u32::MAX; 2]),
            [0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd]
        );
        assert_eq!(
            philox4x32_10(
                [0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344],
                [0xa4093822, 0x299f31d0]
            ),
            [0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1]
        );
    }

    /// Moments of 4·10⁶ normals: the standard error of the mean is 5e-4 and of the
    /// variance 7e-4, so ±3e-3 is over four standard errors; the tail mass beyond 3σ
    /// (0.27%) has a standard error of 2.6e-5.
    #[test]
    fn gaussian_moments_and_tails() {
        let key = NoiseKey {
            seed: 42,
            step: 7,
            param: 3,
        };
        let mut z = vec![0f32; 4_000_000];
        key.fill(&mut z);
        let n = z.len() as f64;
        let mean = z.iter().map(|&x| x as f64).sum::<f64>() / n;
        let var = z.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / n;
        let kurt = z.iter().map(|&x| (x as f64 - mean).powi(4)).sum::<f64>() / n / var.powi(2);
        let tail = z.iter().filter(|&&x| x.abs() > 3.0).count() as f64 / n;
        assert!(mean.abs() < 3e-3, "mean {mean}");
        assert!((var - 1.0).abs() < 3e-3, "var {var}");
        assert!((kurt - 3.0).abs() < 2e-2, "kurtosis {kurt}");
        assert!((tail - 0.0026998).abs() < 1.5e-4, "tail {tail}");
        assert_eq!(key.normal(1234567), z[1234567]);
    }

    #[test]
    fn polynomial_math_matches_libm() {
        let mut worst_log = 0f32;
        let mut worst_trig = 0f32;
        for i in 1..=100_000u32 {
            let u = i as f32 / 100_000.0;
            worst_log = worst_log.max((log_unit(u) - u.ln()).abs() / u.ln().abs().max(1e-6));
            let (s, c) = sincos_turn(u);
            let t = std::f32::consts::TAU * u;
            worst_trig = worst_trig.max((s - t.sin()).abs()).max((c - t.cos()).abs());
        }
        // The smallest uniform, 2⁻²⁴, and the edges of the reduction.
        let tiny = 1.0 / 16_777_216.0f32;
        assert!((log_unit(tiny) - tiny.ln()).abs() < 1e-5);
        assert_eq!(log_unit(1.0), 0.0);
        assert!(worst_log < 1e-6, "log relative error {worst_log}");
        // libm's own sin(2πu) carries the rounding of 2πu (~3e-7·2π).
        assert!(worst_trig < 2e-6, "sin/cos absolute error {worst_trig}");
    }

    #[test]
    fn streams_differ_by_step_param_and_seed() {
        let a = NoiseKey {
            seed: 1,
            step: 0,
            param: 0,
        }
        .normals4(0);
        let b = NoiseKey {
            seed: 1,
            step: 1,
            param: 0,
        }
        .normals4(0);
        let c = NoiseKey {
            seed: 1,
            step: 0,
            param: 1,
        }
        .normals4(0);
        let d = NoiseKey {
            seed: 2,
            step: 0,
            param: 0,
        }
        .normals4(0);
        assert_ne!(a, b);
        assert_ne!(a, c);
        assert_ne!(a, d);
    }
}
