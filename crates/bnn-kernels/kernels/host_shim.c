/* Host build of the CUDA kernels' element math, for the equivalence test against the
 * Rust CPU op (tests/kernel_equivalence.rs): the kernels' own `bnn_update_blocks`, on one
 * thread over the whole tensor. */
#include <math.h>
#include "sampler_math.h"

void bnn_host_normals(uint64_t seed, uint64_t step, uint32_t param, uint32_t n, float *out) {
    for (uint32_t b = 0; 4 * b < n; ++b) {
        float z[4];
        bnn_normals4(seed, step, param, b, z);
        for (uint32_t k = 0; k < 4 && 4 * b + k < n; ++k) out[4 * b + k] = z[k];
    }
}

/* The update `rule` (the BNN_RULE_* codes) of a whole tensor; s0 and s1 are null where the
 * rule has no such state. Writes [sum v^2, sum alpha, virial] to sums, accumulated in
 * element order (the Rust op sums in fixed lanes and chunks, so the sums agree to
 * rounding, the elements bit for bit). */
void bnn_host_update(int rule, float *theta, float *s0, float *s1, const float *g, uint32_t n,
                     uint64_t seed, uint64_t step, uint32_t param, const float consts[4],
                     double sums[3]) {
    bnn_step_consts c = {consts[0], consts[1], consts[2], consts[3]};
    sums[0] = sums[1] = sums[2] = 0.0;
    bnn_update_blocks(rule, theta, s0, s1, g, n, param, seed, step, c, 0, 1, sums);
}
