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
// and writes theta, v, all once. The sums (sums[0] = v*v for the kinetic energy and the
// SGNHT thermostat, sums[1] = the new alpha for mSGNHT, sums[2] = the virial theta*g
// before the update, for the configurational temperature) are reduced in the same pass:
// per thread block in shared memory, then one atomicAdd per block and sum into a double.
//
// A tensor's update is written once, as one thread's share of it (`*_share`); the
// kernels differ only in where a chain's tensor, state, key and constants are.

#include "sampler_math.h"

#define BNN_THREADS 256

typedef unsigned long long u64;

// The Philox blocks of this thread: first, first + stride, ...
#define BNN_FIRST (blockIdx.x * (u64)blockDim.x + threadIdx.x)
#define BNN_STRIDE ((u64)gridDim.x * blockDim.x)

// This thread's part of sum theta*g (before the update).
__device__ double bnn_sgld_share(float *theta, const float *grad, u64 n, unsigned int param,
                                 u64 seed, u64 step, bnn_step_consts c) {
    double vir = 0.0;
    u64 blocks = (n + 3) / 4;
    for (u64 b = BNN_FIRST; b < blocks; b += BNN_STRIDE) {
        float z[4];
        bnn_normals4(seed, step, param, (uint32_t)b, z);
        for (int k = 0; k < 4; ++k) {
            u64 i = 4 * b + k;
            if (i < n) {
                vir += (double)bnn_virial(theta[i], grad[i]);
                bnn_sgld(&theta[i], grad[i], z[k], c);
            }
        }
    }
    return vir;
}

// This thread's part of sum v^2 after the update (returned) and of sum theta*g before it.
__device__ double bnn_momentum_share(float *theta, float *momentum, const float *grad, u64 n,
                                     unsigned int param, u64 seed, u64 step,
                                     bnn_step_consts c, double *vir) {
    double local = 0.0;
    u64 blocks = (n + 3) / 4;
    for (u64 b = BNN_FIRST; b < blocks; b += BNN_STRIDE) {
        float z[4];
        bnn_normals4(seed, step, param, (uint32_t)b, z);
        for (int k = 0; k < 4; ++k) {
            u64 i = 4 * b + k;
            if (i < n) {
                *vir += (double)bnn_virial(theta[i], grad[i]);
                local += (double)bnn_momentum_step(&theta[i], &momentum[i], grad[i], z[k], c);
            }
        }
    }
    return local;
}

// mSGNHT's per-element thermostat step: reads theta, v, alpha, g and writes theta, v,
// alpha once each; this thread's parts of sum v^2, of the new sum alpha and of sum
// theta*g before the update.
__device__ void bnn_thermostat_share(float *theta, float *momentum, float *alpha,
                                     const float *grad, u64 n, unsigned int param, u64 seed,
                                     u64 step, bnn_step_consts c, int splitting, double *sq,
                                     double *al, double *vir) {
    u64 blocks = (n + 3) / 4;
    for (u64 b = BNN_FIRST; b < blocks; b += BNN_STRIDE) {
        float z[4];
        bnn_normals4(seed, step, param, (uint32_t)b, z);
        for (int k = 0; k < 4; ++k) {
            u64 i = 4 * b + k;
            if (i < n) {
                *vir += (double)bnn_virial(theta[i], grad[i]);
                *sq += (double)bnn_thermostat_step(&theta[i], &momentum[i], &alpha[i], grad[i],
                                                   z[k], c, splitting);
                *al += (double)alpha[i];
            }
        }
    }
}

// The block's sums of (a, b, c) added into out[0], out[1], out[2].
__device__ void bnn_block_sums(double a, double b, double c, double *out) {
    __shared__ double pa[BNN_THREADS];
    __shared__ double pb[BNN_THREADS];
    __shared__ double pc[BNN_THREADS];
    pa[threadIdx.x] = a;
    pb[threadIdx.x] = b;
    pc[threadIdx.x] = c;
    __syncthreads();
    for (unsigned int stride = BNN_THREADS / 2; stride > 0; stride /= 2) {
        if (threadIdx.x < stride) {
            pa[threadIdx.x] += pa[threadIdx.x + stride];
            pb[threadIdx.x] += pb[threadIdx.x + stride];
            pc[threadIdx.x] += pc[threadIdx.x + stride];
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        atomicAdd(&out[0], pa[0]);
        atomicAdd(&out[1], pb[0]);
        atomicAdd(&out[2], pc[0]);
    }
}

extern "C" __global__ void bnn_sgld_kernel(float *theta, const float *grad, u64 n,
                                         unsigned int param, u64 seed, u64 step,
                                         float step_size, float noise_scale, double *sums) {
    bnn_step_consts c = {step_size, 1.0f, 1.0f, noise_scale};
    double vir = bnn_sgld_share(theta, grad, n, param, seed, step, c);
    bnn_block_sums(0.0, 0.0, vir, sums);
}

extern "C" __global__ void bnn_momentum_kernel(float *theta, float *momentum, const float *grad,
                                             u64 n, unsigned int param, u64 seed, u64 step,
                                             float step_size, float decay, float post,
                                             float noise_scale, double *sums) {
    bnn_step_consts c = {step_size, decay, post, noise_scale};
    double vir = 0.0;
    double local = bnn_momentum_share(theta, momentum, grad, n, param, seed, step, c, &vir);
    bnn_block_sums(local, 0.0, vir, sums);
}

// Reduces sum v^2 into sums[0], the new sum alpha into sums[1] and the virial into sums[2].
extern "C" __global__ void bnn_thermostat_kernel(float *theta, float *momentum, float *alpha,
                                               const float *grad, u64 n, unsigned int param,
                                               u64 seed, u64 step, float step_size,
                                               float noise_scale, int splitting,
                                               double *sums) {
    bnn_step_consts c = {step_size, 1.0f, 1.0f, noise_scale};
    double sq = 0.0, al = 0.0, vir = 0.0;
    bnn_thermostat_share(theta, momentum, alpha, grad, n, param, seed, step, c, splitting, &sq,
                         &al, &vir);
    bnn_block_sums(sq, al, vir, sums);
}

// K chains stacked: theta and grad are (K, n) row-major; chain k = blockIdx.y has its
// state buffers at momentum[k] (and alpha[k]), its seed at seeds[k], its constants
// (step size, decay, post, noise scale) at consts[4k..4k+3], and its sums at
// sums[3k..3k+2].
__device__ bnn_step_consts bnn_chain_consts(const float *consts, unsigned int k) {
    bnn_step_consts c = {consts[4 * k], consts[4 * k + 1], consts[4 * k + 2], consts[4 * k + 3]};
    return c;
}

extern "C" __global__ void bnn_sgld_stacked_kernel(float *theta, const float *grad, u64 n,
                                                 unsigned int param, const u64 *seeds,
                                                 u64 step, const float *consts,
                                                 double *sums) {
    unsigned int k = blockIdx.y;
    double vir = bnn_sgld_share(theta + k * n, grad + k * n, n, param, seeds[k], step,
                                bnn_chain_consts(consts, k));
    bnn_block_sums(0.0, 0.0, vir, &sums[3 * k]);
}

extern "C" __global__ void bnn_momentum_stacked_kernel(float *theta, const u64 *momentum,
                                                     const float *grad, u64 n,
                                                     unsigned int param, const u64 *seeds,
                                                     u64 step, const float *consts,
                                                     double *sums) {
    unsigned int k = blockIdx.y;
    double vir = 0.0;
    double local = bnn_momentum_share(theta + k * n, (float *)momentum[k], grad + k * n, n, param,
                                      seeds[k], step, bnn_chain_consts(consts, k), &vir);
    bnn_block_sums(local, 0.0, vir, &sums[3 * k]);
}

extern "C" __global__ void bnn_thermostat_stacked_kernel(float *theta, const u64 *momentum,
                                                       const u64 *alpha, const float *grad,
                                                       u64 n, unsigned int param,
                                                       const u64 *seeds, u64 step,
                                                       const float *consts, int splitting,
                                                       double *sums) {
    unsigned int k = blockIdx.y;
    double sq = 0.0, al = 0.0, vir = 0.0;
    bnn_thermostat_share(theta + k * n, (float *)momentum[k], (float *)alpha[k], grad + k * n, n,
                         param, seeds[k], step, bnn_chain_consts(consts, k), splitting, &sq, &al,
                         &vir);
    bnn_block_sums(sq, al, vir, &sums[3 * k]);
}
