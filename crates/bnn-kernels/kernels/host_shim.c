/* Host build of the CUDA kernels' element math, for the equivalence test against the
 * Rust CPU op (tests/kernel_equivalence.rs). Same loops as sampler_step.cu, one thread. */
#include <math.h>
#include "sampler_math.h"

void bnn_host_normals(uint64_t seed, uint64_t step, uint32_t param, uint32_t n, float *out) {
    for (uint32_t b = 0; 4 * b < n; ++b) {
        float z[4];
        bnn_normals4(seed, step, param, b, z);
        for (uint32_t k = 0; k < 4 && 4 * b + k < n; ++k) out[4 * b + k] = z[k];
    }
}

/* kind: 0 = SGLD, 1 = momentum step (SGHMC/SGNHT). Returns the sum of v*v in double and
 * writes the virial sum theta . g to *virial, both accumulated in element order (the Rust
 * op sums in fixed lanes and chunks, so the sums agree to rounding, the elements bit for
 * bit). */
double bnn_host_step(int kind, float *theta, float *v, const float *g, uint32_t n, uint64_t seed,
                     uint64_t step, uint32_t param, float step_size, float decay, float post,
                     float noise_scale, double *virial) {
    bnn_step_consts c = {step_size, decay, post, noise_scale};
    double sum = 0.0, vir = 0.0;
    for (uint32_t b = 0; 4 * b < n; ++b) {
        float z[4];
        bnn_normals4(seed, step, param, b, z);
        for (uint32_t k = 0; k < 4 && 4 * b + k < n; ++k) {
            uint32_t i = 4 * b + k;
            vir += (double)bnn_virial(theta[i], g[i]);
            if (kind == 0) bnn_sgld(&theta[i], g[i], z[k], c);
            else sum += (double)bnn_momentum_step(&theta[i], &v[i], g[i], z[k], c);
        }
    }
    *virial = vir;
    return sum;
}

/* mSGNHT's per-element thermostat step (splitting: 0 Euler, 1 B-O-B). Returns the sum of
 * v*v and writes the sum of the new alpha to *sum_alpha and the virial to *virial, all in
 * element order. */
double bnn_host_thermostat_step(float *theta, float *v, float *alpha, const float *g, uint32_t n,
                                uint64_t seed, uint64_t step, uint32_t param, float step_size,
                                float noise_scale, int splitting, double *sum_alpha,
                                double *virial) {
    bnn_step_consts c = {step_size, 1.0f, 1.0f, noise_scale};
    double sq = 0.0, al = 0.0, vir = 0.0;
    for (uint32_t b = 0; 4 * b < n; ++b) {
        float z[4];
        bnn_normals4(seed, step, param, b, z);
        for (uint32_t k = 0; k < 4 && 4 * b + k < n; ++k) {
            uint32_t i = 4 * b + k;
            vir += (double)bnn_virial(theta[i], g[i]);
            sq += (double)bnn_thermostat_step(&theta[i], &v[i], &alpha[i], g[i], z[k], c, splitting);
            al += (double)alpha[i];
        }
    }
    *sum_alpha = al;
    *virial = vir;
    return sq;
}
