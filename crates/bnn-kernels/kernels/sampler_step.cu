// Fused sampler steps on CUDA, launched from the fused ops' `cuda_fwd`
// (crates/bnn-kernels/src/cuda.rs): one launch per parameter tensor, or, for K chains
// stacked along a leading axis (`--chain-layout stacked`), one launch per tensor for all K
// chains (grid y = chain).
//
// Each thread handles 4-element Philox blocks of the tensor (grid-stride loop), so that
// the noise of element i of parameter p at step t is the same normal as on the CPU
// (kernels/sampler_math.h; its host build is tested bit for bit against the Rust CPU op).
// build.rs compiles with --fmad=false so that no a*b+c is contracted and the device math
// follows the host's.
//
// Per element: SGLD reads theta, g and writes theta; the momentum step reads theta, v, g
// and writes theta, v, all once. The sum of v*v (kinetic energy, SGNHT thermostat) is
// reduced in the same pass: per thread block in shared memory, then one atomicAdd per
// block into a double.
//
// A tensor's update is written once, as one thread's share of it (`*_share`); the
// kernels differ only in where a chain's tensor, state, key and constants are.

#include "sampler_math.h"

#define BNN_THREADS 256

typedef unsigned long long u64;

// The Philox blocks of this thread: first, first + stride, ...
#define BNN_FIRST (blockIdx.x * (u64)blockDim.x + threadIdx.x)
#define BNN_STRIDE ((u64)gridDim.x * blockDim.x)

__device__ void bnn_sgld_share(float *theta, const float *grad, u64 n, unsigned int param,
                               u64 seed, u64 step, bnn_step_consts c) {
    u64 blocks = (n + 3) / 4;
    for (u64 b = BNN_FIRST; b < blocks; b += BNN_STRIDE) {
        float z[4];
        bnn_normals4(seed, step, param, (uint32_t)b, z);
        for (int k = 0; k < 4; ++k) {
            u64 i = 4 * b + k;
            if (i < n) bnn_sgld(&theta[i], grad[i], z[k], c);
        }
    }
}

// Returns this thread's part of sum v^2 after the update.
__device__ double bnn_momentum_share(float *theta, float *momentum, const float *grad, u64 n,
                                     unsigned int param, u64 seed, u64 step,
                                     bnn_step_consts c) {
    double local = 0.0;
    u64 blocks = (n + 3) / 4;
    for (u64 b = BNN_FIRST; b < blocks; b += BNN_STRIDE) {
        float z[4];
        bnn_normals4(seed, step, param, (uint32_t)b, z);
        for (int k = 0; k < 4; ++k) {
            u64 i = 4 * b + k;
            if (i < n) local += (double)bnn_momentum_step(&theta[i], &momentum[i], grad[i], z[k], c);
        }
    }
    return local;
}

// mSGNHT's per-element thermostat step: reads theta, v, alpha, g and writes theta, v,
// alpha once each; this thread's parts of sum v^2 and of the new sum alpha.
__device__ void bnn_thermostat_share(float *theta, float *momentum, float *alpha,
                                     const float *grad, u64 n, unsigned int param, u64 seed,
                                     u64 step, bnn_step_consts c, int splitting, double *sq,
                                     double *al) {
    u64 blocks = (n + 3) / 4;
    for (u64 b = BNN_FIRST; b < blocks; b += BNN_STRIDE) {
        float z[4];
        bnn_normals4(seed, step, param, (uint32_t)b, z);
        for (int k = 0; k < 4; ++k) {
            u64 i = 4 * b + k;
            if (i < n) {
                *sq += (double)bnn_thermostat_step(&theta[i], &momentum[i], &alpha[i], grad[i],
                                                   z[k], c, splitting);
                *al += (double)alpha[i];
            }
        }
    }
}

// The block's sums of (a, b) added into out[0], out[1] (b only where out_b is set).
__device__ void bnn_block_sums(double a, double b, double *out_a, double *out_b) {
    __shared__ double pa[BNN_THREADS];
    __shared__ double pb[BNN_THREADS];
    pa[threadIdx.x] = a;
    pb[threadIdx.x] = b;
    __syncthreads();
    for (unsigned int stride = BNN_THREADS / 2; stride > 0; stride /= 2) {
        if (threadIdx.x < stride) {
            pa[threadIdx.x] += pa[threadIdx.x + stride];
            pb[threadIdx.x] += pb[threadIdx.x + stride];
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        atomicAdd(out_a, pa[0]);
        if (out_b) atomicAdd(out_b, pb[0]);
    }
}

extern "C" __global__ void bnn_sgld_kernel(float *theta, const float *grad, u64 n,
                                         unsigned int param, u64 seed, u64 step,
                                         float step_size, float noise_scale) {
    bnn_step_consts c = {step_size, 1.0f, 1.0f, noise_scale};
    bnn_sgld_share(theta, grad, n, param, seed, step, c);
}

extern "C" __global__ void bnn_momentum_kernel(float *theta, float *momentum, const float *grad,
                                             u64 n, unsigned int param, u64 seed, u64 step,
                                             float step_size, float decay, float post,
                                             float noise_scale, double *sum_sq) {
    bnn_step_consts c = {step_size, decay, post, noise_scale};
    double local = bnn_momentum_share(theta, momentum, grad, n, param, seed, step, c);
    bnn_block_sums(local, 0.0, sum_sq, 0);
}

// Reduces sum v^2 into sums[0] and the new sum alpha into sums[1].
extern "C" __global__ void bnn_thermostat_kernel(float *theta, float *momentum, float *alpha,
                                               const float *grad, u64 n, unsigned int param,
                                               u64 seed, u64 step, float step_size,
                                               float noise_scale, int splitting,
                                               double *sums) {
    bnn_step_consts c = {step_size, 1.0f, 1.0f, noise_scale};
    double sq = 0.0, al = 0.0;
    bnn_thermostat_share(theta, momentum, alpha, grad, n, param, seed, step, c, splitting, &sq,
                         &al);
    bnn_block_sums(sq, al, &sums[0], &sums[1]);
}

// K chains stacked: theta and grad are (K, n) row-major; chain k = blockIdx.y has its
// state buffers at momentum[k] (and alpha[k]), its seed at seeds[k], its constants
// (step size, decay, post, noise scale) at consts[4k..4k+3], and its sums at sums[2k],
// sums[2k+1].
__device__ bnn_step_consts bnn_chain_consts(const float *consts, unsigned int k) {
    bnn_step_consts c = {consts[4 * k], consts[4 * k + 1], consts[4 * k + 2], consts[4 * k + 3]};
    return c;
}

extern "C" __global__ void bnn_sgld_stacked_kernel(float *theta, const float *grad, u64 n,
                                                 unsigned int param, const u64 *seeds,
                                                 u64 step, const float *consts) {
    unsigned int k = blockIdx.y;
    bnn_sgld_share(theta + k * n, grad + k * n, n, param, seeds[k], step,
                   bnn_chain_consts(consts, k));
}

extern "C" __global__ void bnn_momentum_stacked_kernel(float *theta, const u64 *momentum,
                                                     const float *grad, u64 n,
                                                     unsigned int param, const u64 *seeds,
                                                     u64 step, const float *consts,
                                                     double *sums) {
    unsigned int k = blockIdx.y;
    double local = bnn_momentum_share(theta + k * n, (float *)momentum[k], grad + k * n, n, param,
                                      seeds[k], step, bnn_chain_consts(consts, k));
    bnn_block_sums(local, 0.0, &sums[2 * k], 0);
}

extern "C" __global__ void bnn_thermostat_stacked_kernel(float *theta, const u64 *momentum,
                                                       const u64 *alpha, const float *grad,
                                                       u64 n, unsigned int param,
                                                       const u64 *seeds, u64 step,
                                                       const float *consts, int splitting,
                                                       double *sums) {
    unsigned int k = blockIdx.y;
    double sq = 0.0, al = 0.0;
    bnn_thermostat_share(theta + k * n, (float *)momentum[k], (float *)alpha[k], grad + k * n, n,
                         param, seeds[k], step, bnn_chain_consts(consts, k), splitting, &sq, &al);
    bnn_block_sums(sq, al, &sums[2 * k], &sums[2 * k + 1]);
}
