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
// A tensor's update is written once, in sampler_math.h (`bnn_update_blocks`, one thread's
// share of the tensor, over `bnn_update_element`, the one dispatch over the element
// updates by their rule code); the two kernels differ only in where a chain's tensor,
// state, key and constants are. A new element update needs no change here.

#include "sampler_math.h"

#define BNN_THREADS 256

typedef unsigned long long u64;

// The Philox blocks of this thread: first, first + stride, ...
#define BNN_FIRST (blockIdx.x * (u64)blockDim.x + threadIdx.x)
#define BNN_STRIDE ((u64)gridDim.x * blockDim.x)

// The block's sums of s[0], s[1], s[2] added into out[0], out[1], out[2].
__device__ void bnn_block_sums(const double s[3], double *out) {
    __shared__ double pa[BNN_THREADS];
    __shared__ double pb[BNN_THREADS];
    __shared__ double pc[BNN_THREADS];
    pa[threadIdx.x] = s[0];
    pb[threadIdx.x] = s[1];
    pc[threadIdx.x] = s[2];
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

// One tensor of n elements by the element update `rule`: its state buffers s0 (v) and s1
// (alpha) where the rule has them, else null; [sum v^2, sum alpha, virial] into sums.
extern "C" __global__ void bnn_step_kernel(int rule, float *theta, float *s0, float *s1,
                                         const float *grad, u64 n, unsigned int param, u64 seed,
                                         u64 step, float step_size, float decay, float post,
                                         float noise_scale, double *sums) {
    bnn_step_consts c = {step_size, decay, post, noise_scale};
    double s[3] = {0.0, 0.0, 0.0};
    bnn_update_blocks(rule, theta, s0, s1, grad, n, param, seed, step, c, BNN_FIRST, BNN_STRIDE,
                      s);
    bnn_block_sums(s, sums);
}

// K chains stacked: theta and grad are (K, n) row-major; chain k = blockIdx.y has its
// state buffers at s0[k] and s1[k] (tables of device addresses, null tables where the
// rule has no such state), its seed at seeds[k], its constants (step size, decay, post,
// noise scale) at consts[4k..4k+3], and its sums at sums[3k..3k+2].
extern "C" __global__ void bnn_step_stacked_kernel(int rule, float *theta, const u64 *s0,
                                                 const u64 *s1, const float *grad, u64 n,
                                                 unsigned int param, const u64 *seeds, u64 step,
                                                 const float *consts, double *sums) {
    unsigned int k = blockIdx.y;
    bnn_step_consts c = {consts[4 * k], consts[4 * k + 1], consts[4 * k + 2], consts[4 * k + 3]};
    double s[3] = {0.0, 0.0, 0.0};
    bnn_update_blocks(rule, theta + k * n, s0 ? (float *)s0[k] : 0, s1 ? (float *)s1[k] : 0,
                      grad + k * n, n, param, seeds[k], step, c, BNN_FIRST, BNN_STRIDE, s);
    bnn_block_sums(s, &sums[3 * k]);
}
