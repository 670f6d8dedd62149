// Fused sampler steps on CUDA, launched from the `cuda_fwd` of the fused op
// (src/kernels/cuda.rs), one launch per parameter tensor.
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

#include "sampler_math.h"

#define BNN_THREADS 256

extern "C" __global__ void bnn_sgld_kernel(float *theta, const float *grad,
                                         unsigned long long n, unsigned int param,
                                         unsigned long long seed, unsigned long long step,
                                         float step_size, float noise_scale) {
    bnn_step_consts c = {step_size, 1.0f, 1.0f, noise_scale};
    unsigned long long blocks = (n + 3) / 4;
    for (unsigned long long b = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
         b < blocks; b += (unsigned long long)gridDim.x * blockDim.x) {
        float z[4];
        bnn_normals4(seed, step, param, (uint32_t)b, z);
        for (int k = 0; k < 4; ++k) {
            unsigned long long i = 4 * b + k;
            if (i < n) bnn_sgld(&theta[i], grad[i], z[k], c);
        }
    }
}

extern "C" __global__ void bnn_momentum_kernel(float *theta, float *momentum, const float *grad,
                                             unsigned long long n, unsigned int param,
                                             unsigned long long seed, unsigned long long step,
                                             float step_size, float decay, float post,
                                             float noise_scale, double *sum_sq) {
    __shared__ double partial[BNN_THREADS];
    bnn_step_consts c = {step_size, decay, post, noise_scale};
    double local = 0.0;
    unsigned long long blocks = (n + 3) / 4;
    for (unsigned long long b = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
         b < blocks; b += (unsigned long long)gridDim.x * blockDim.x) {
        float z[4];
        bnn_normals4(seed, step, param, (uint32_t)b, z);
        for (int k = 0; k < 4; ++k) {
            unsigned long long i = 4 * b + k;
            if (i < n) local += (double)bnn_momentum_step(&theta[i], &momentum[i], grad[i], z[k], c);
        }
    }
    partial[threadIdx.x] = local;
    __syncthreads();
    for (unsigned int stride = BNN_THREADS / 2; stride > 0; stride /= 2) {
        if (threadIdx.x < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
        __syncthreads();
    }
    if (threadIdx.x == 0) atomicAdd(sum_sq, partial[0]);
}

// mSGNHT's per-element thermostat step: reads theta, v, alpha, g and writes theta, v,
// alpha once each; reduces sum v^2 into sums[0] and the new sum alpha into sums[1].
extern "C" __global__ void bnn_thermostat_kernel(float *theta, float *momentum, float *alpha,
                                               const float *grad, unsigned long long n,
                                               unsigned int param, unsigned long long seed,
                                               unsigned long long step, float step_size,
                                               float noise_scale, int splitting,
                                               double *sums) {
    __shared__ double partial_sq[BNN_THREADS];
    __shared__ double partial_alpha[BNN_THREADS];
    bnn_step_consts c = {step_size, 1.0f, 1.0f, noise_scale};
    double sq = 0.0, al = 0.0;
    unsigned long long blocks = (n + 3) / 4;
    for (unsigned long long b = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
         b < blocks; b += (unsigned long long)gridDim.x * blockDim.x) {
        float z[4];
        bnn_normals4(seed, step, param, (uint32_t)b, z);
        for (int k = 0; k < 4; ++k) {
            unsigned long long i = 4 * b + k;
            if (i < n) {
                sq += (double)bnn_thermostat_step(&theta[i], &momentum[i], &alpha[i], grad[i],
                                                  z[k], c, splitting);
                al += (double)alpha[i];
            }
        }
    }
    partial_sq[threadIdx.x] = sq;
    partial_alpha[threadIdx.x] = al;
    __syncthreads();
    for (unsigned int stride = BNN_THREADS / 2; stride > 0; stride /= 2) {
        if (threadIdx.x < stride) {
            partial_sq[threadIdx.x] += partial_sq[threadIdx.x + stride];
            partial_alpha[threadIdx.x] += partial_alpha[threadIdx.x + stride];
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        atomicAdd(&sums[0], partial_sq[0]);
        atomicAdd(&sums[1], partial_alpha[0]);
    }
}
