/* Element-wise math of the fused sampler steps, shared by the CUDA kernels
 * (sampler_step.cu) and by a host build used in tests (host_shim.c), which checks that it
 * gives the same bits as the Rust CPU op (src/kernels/cpu.rs and src/rng.rs).
 *
 * Bit-exactness rules: only IEEE +, −, ×, sqrt and explicit fmaf (each one correctly
 * rounded operation on every platform) in f32, in the order written; no implicit FMA
 * contraction (host: -ffp-contract=off; nvcc: --fmad=false); no libm transcendental
 * (logf/sinf/cosf differ between libraries), but the polynomials below.
 *
 * Noise: Philox-4x32-10 (Salmon et al. 2011) keyed by the seed, counter (element block,
 * parameter id, step low, step high); Box-Muller turns its 4 words into 4 normals for
 * elements 4b..4b+3 of the parameter tensor.
 */
#ifndef BNN_SAMPLER_MATH_H
#define BNN_SAMPLER_MATH_H

#include <stdint.h>
#ifndef __CUDACC__
#include <math.h>
#endif

#ifdef __CUDACC__
#define BNN_HD __host__ __device__ __forceinline__
#else
#define BNN_HD static inline
#endif

BNN_HD void bnn_mulhilo(uint32_t a, uint32_t b, uint32_t *hi, uint32_t *lo) {
    uint64_t p = (uint64_t)a * (uint64_t)b;
    *hi = (uint32_t)(p >> 32);
    *lo = (uint32_t)p;
}

BNN_HD void bnn_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) {
    uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
    uint32_t k0 = key[0], k1 = key[1];
    for (int round = 0; round < 10; ++round) {
        uint32_t hi0, lo0, hi1, lo1;
        bnn_mulhilo(0xD2511F53u, c0, &hi0, &lo0);
        bnn_mulhilo(0xCD9E8D57u, c2, &hi1, &lo1);
        uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
        c0 = n0; c1 = lo1; c2 = n2; c3 = lo0;
        if (round < 9) { k0 += 0x9E3779B9u; k1 += 0xBB67AE85u; }
    }
    out[0] = c0; out[1] = c1; out[2] = c2; out[3] = c3;
}

BNN_HD float bnn_uniform_open0(uint32_t x) {
    return (float)((x >> 8) + 1u) * (1.0f / 16777216.0f);
}

BNN_HD float bnn_bits_to_float(uint32_t b) {
#ifdef __CUDACC__
    return __uint_as_float(b);
#else
    union { uint32_t u; float f; } v; v.u = b; return v.f;
#endif
}

BNN_HD uint32_t bnn_float_to_bits(float f) {
#ifdef __CUDACC__
    return __float_as_uint(f);
#else
    union { uint32_t u; float f; } v; v.f = f; return v.u;
#endif
}

/* ln x for x in (0, 1] (Cephes logf polynomial). */
BNN_HD float bnn_log_unit(float x) {
    uint32_t bits = bnn_float_to_bits(x);
    int e = (int)((bits >> 23) & 0xffu) - 126;
    float m = bnn_bits_to_float((bits & 0x007fffffu) | 0x3f000000u);
    if (m < 0.70710677f) { e -= 1; m = m + m; }
    float xm = m - 1.0f;
    float z = xm * xm;
    float y = 7.0376836e-2f;
    y = fmaf(y, xm, -1.15146103e-1f);
    y = fmaf(y, xm, 1.16769987e-1f);
    y = fmaf(y, xm, -1.24201408e-1f);
    y = fmaf(y, xm, 1.42493228e-1f);
    y = fmaf(y, xm, -1.66680577e-1f);
    y = fmaf(y, xm, 2.00007148e-1f);
    y = fmaf(y, xm, -2.4999994e-1f);
    y = fmaf(y, xm, 3.3333331e-1f);
    y = y * xm * z;
    float ef = (float)e;
    y = fmaf(ef, -2.1219444e-4f, y);
    y = fmaf(-0.5f, z, y);
    return fmaf(ef, 0.6933594f, xm + y);
}

/* sin(2 pi u), cos(2 pi u) for u in [0, 1]. */
BNN_HD void bnn_sincos_turn(float u, float *sn, float *cs) {
    int q = (int)(u * 4.0f + 0.5f);
    float a = (u * 4.0f - (float)q) * 1.5707964f;
    float a2 = a * a;
    float ps = fmaf(fmaf(a2, -1.9515296e-4f, 8.332161e-3f), a2, -1.6666655e-1f);
    float s = fmaf(a * a2, ps, a);
    float pc = fmaf(fmaf(a2, 2.4433157e-5f, -1.3887316e-3f), a2, 4.1666646e-2f);
    float c = fmaf(a2 * a2, pc, fmaf(-0.5f, a2, 1.0f));
    switch (q & 3) {
    case 0: *sn = s; *cs = c; break;
    case 1: *sn = c; *cs = -s; break;
    case 2: *sn = -s; *cs = -c; break;
    default: *sn = -c; *cs = s; break;
    }
}

/* Four standard normals for elements 4*block .. 4*block+3 of parameter `param` at `step`. */
BNN_HD void bnn_normals4(uint64_t seed, uint64_t step, uint32_t param, uint32_t block, float z[4]) {
    uint32_t ctr[4] = {block, param, (uint32_t)step, (uint32_t)(step >> 32)};
    uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    uint32_t r[4];
    bnn_philox4x32_10(ctr, key, r);
    for (int k = 0; k < 2; ++k) {
        float u1 = bnn_uniform_open0(r[2 * k]);
        float u2 = bnn_uniform_open0(r[2 * k + 1]);
        float rad = sqrtf(-2.0f * bnn_log_unit(u1));
        float sn, cs;
        bnn_sincos_turn(u2, &sn, &cs);
        z[2 * k] = rad * cs;
        z[2 * k + 1] = rad * sn;
    }
}

/* Constants of one update, in f32 as the kernels use them. */
typedef struct {
    float step_size;   /* eta */
    float decay;       /* momentum kept before the kick: 1 - alpha (Euler) or exp(-alpha/2) (splitting B) */
    float post;        /* momentum kept after the kick: 1 (Euler) or exp(-alpha/2) (splitting B) */
    float noise_scale; /* sigma: sqrt(2*eta) SGLD, sqrt(2(alpha-beta)eta) SGHMC, sqrt(2 a eta) SGNHT */
} bnn_step_consts;

/* The virial term theta * g of one element, read before its update (theta where g was
 * evaluated): rounded to f32, then summed in double, as the Rust CPU op does. Its sum is
 * the configurational temperature's numerator, E[theta . grad U] = D T. */
BNN_HD float bnn_virial(float theta, float g) {
    return theta * g;
}

/* SGLD (Welling & Teh 2011): theta <- theta - eta g + sigma z. */
BNN_HD void bnn_sgld(float *theta, float g, float z, bnn_step_consts c) {
    *theta = *theta - g * c.step_size + z * c.noise_scale;
}

/* SGHMC (Chen et al. 2014, eq. 15) and SGNHT (Ding et al. 2014, Alg. 2) share the
 * momentum update v <- (1-alpha) v - eta g + sigma z; theta <- theta + v (Euler, post = 1).
 * Their splitting integrators (Li et al. 2016) apply B, O, B and the merged A in the same
 * pass: v <- e^{-alpha/2} (e^{-alpha/2} v - eta g + sigma z); theta <- theta + v.
 * Returns v*v for the kinetic-energy / thermostat reduction. */
BNN_HD float bnn_momentum_step(float *theta, float *v, float g, float z, bnn_step_consts c) {
    float vn = (*v * c.decay - g * c.step_size + z * c.noise_scale) * c.post;
    *v = vn;
    *theta = *theta + vn;
    return vn * vn;
}

/* e^x for the thermostat's damping e^{-alpha/2}: the Rust CPU op's exp_f32
 * (src/kernels/cpu.rs) with the same f32 operations in the same order (Cephes
 * polynomial, 2^n from the exponent bits), within 2 ulp of exp on [-87, 88]. A NaN
 * passes through as in Rust's clamp. */
BNN_HD float bnn_exp(float x) {
    x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
    float n = floorf(x * 1.44269504f + 0.5f);
    float r = (x - n * 0.693359375f) - n * -2.12194440e-4f;
    float p = 1.98756915e-4f;
    p = p * r + 1.39819995e-3f;
    p = p * r + 8.33345190e-3f;
    p = p * r + 4.16657959e-2f;
    p = p * r + 1.66666655e-1f;
    p = p * r + 5.00000012e-1f;
    float y = p * (r * r) + r + 1.0f;
    uint32_t biased = bnn_float_to_bits(n + (127.0f + 8388608.0f)) & 0xffu;
    return y * bnn_bits_to_float(biased << 23);
}

/* mSGNHT (Li et al. 2016, eq. 2 in v-form), one thermostat alpha_i per element:
 * Euler      v <- (v - v alpha_i) - eta g + sigma z,
 * splitting  v <- d (d v - eta g + sigma z), d = e^{-alpha_i/2} (B-O-B);
 * then theta <- theta + v and alpha_i <- alpha_i + (v^2 - eta). Returns v^2. */
BNN_HD float bnn_thermostat_step(float *theta, float *v, float *alpha, float g, float z,
                                 bnn_step_consts c, int splitting) {
    float m = *v, a = *alpha, vn;
    if (splitting) {
        float d = bnn_exp(a * -0.5f);
        vn = ((m * d - g * c.step_size) + z * c.noise_scale) * d;
    } else {
        vn = ((m - m * a) - g * c.step_size) + z * c.noise_scale;
    }
    *v = vn;
    *theta = *theta + vn;
    *alpha = a + (vn * vn - c.step_size);
    return vn * vn;
}

/* pSGLD (Li, Chen, Carlson & Carin 2016, Alg. 1 in v-form), one second moment V_i per
 * element (s): V <- beta V + (1 - beta) g^2, G = 1 / (lambda + sqrt(V)),
 * theta <- (theta - (g G) eta) + (z sqrt(G)) sigma, sigma = sqrt(2 eta); beta and lambda
 * come as c.decay and c.post. The Gamma(theta) term is omitted, as in the paper. */
BNN_HD void bnn_preconditioned_step(float *theta, float *s, float g, float z,
                                    bnn_step_consts c) {
    float vn = *s * c.decay + (g * g) * (1.0f - c.decay);
    *s = vn;
    float gi = 1.0f / (sqrtf(vn) + c.post);
    *theta = (*theta - (g * gi) * c.step_size) + (z * sqrtf(gi)) * c.noise_scale;
}

/* Which element update: the codes of the Rust `Update::rule` (crates/bnn-kernels/src/update.rs). */
#define BNN_RULE_SGLD 0
#define BNN_RULE_MOMENTUM 1
#define BNN_RULE_THERMOSTAT_EULER 2
#define BNN_RULE_THERMOSTAT_SPLITTING 3
#define BNN_RULE_PRECONDITIONED 4

/* The one dispatch over the element updates: element `theta` with its state (s0: the
 * momentum v, s1: the per-element state, mSGNHT's alpha or pSGLD's V; a rule without
 * them is given null), gradient g and
 * normal z. Adds v^2 after the update to sums[0], the new alpha to sums[1] and the virial
 * theta*g before it to sums[2]. A new element update is a rule code here and in Rust. */
BNN_HD void bnn_update_element(int rule, float *theta, float *s0, float *s1, float g, float z,
                               bnn_step_consts c, double sums[3]) {
    sums[2] += (double)bnn_virial(*theta, g);
    switch (rule) {
    case BNN_RULE_SGLD:
        bnn_sgld(theta, g, z, c);
        break;
    case BNN_RULE_MOMENTUM:
        sums[0] += (double)bnn_momentum_step(theta, s0, g, z, c);
        break;
    case BNN_RULE_PRECONDITIONED:
        bnn_preconditioned_step(theta, s1, g, z, c);
        break;
    default: /* BNN_RULE_THERMOSTAT_EULER, BNN_RULE_THERMOSTAT_SPLITTING */
        sums[0] += (double)bnn_thermostat_step(theta, s0, s1, g, z, c,
                                               rule == BNN_RULE_THERMOSTAT_SPLITTING);
        sums[1] += (double)*s1;
        break;
    }
}

/* The update of the Philox blocks first, first + stride, ... of a tensor of n elements
 * (parameter `param` at `step`): one CUDA thread's share of it (first = its index, stride
 * = the grid's threads), or the whole tensor on the host (0, 1). s0 and s1 as above, of n
 * values each where the rule has them. */
BNN_HD void bnn_update_blocks(int rule, float *theta, float *s0, float *s1, const float *grad,
                              uint64_t n, uint32_t param, uint64_t seed, uint64_t step,
                              bnn_step_consts c, uint64_t first, uint64_t stride,
                              double sums[3]) {
    uint64_t blocks = (n + 3) / 4;
    for (uint64_t b = first; b < blocks; b += stride) {
        float z[4];
        bnn_normals4(seed, step, param, (uint32_t)b, z);
        for (int k = 0; k < 4; ++k) {
            uint64_t i = 4 * b + k;
            if (i < n) {
                bnn_update_element(rule, &theta[i], s0 ? &s0[i] : 0, s1 ? &s1[i] : 0, grad[i],
                                   z[k], c, sums);
            }
        }
    }
}

#endif
