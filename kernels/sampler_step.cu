// Fused sampler steps on CUDA: one launch updates every parameter tensor of a model.
//
// The tensors are described by a table of segments (pointers and lengths); each thread
// handles one 4-element Philox block of one segment, so that the noise of element i of
// parameter p at step t is the same normal as on the CPU (kernels/sampler_math.h; the
// host build of that header is tested bit for bit against the Rust CPU op). Compile with
// --fmad=false so that no a*b+c is contracted and the device math matches the host.
//
// Per element: reads theta, v, g once and writes theta, v once; the sum of v*v (kinetic
// energy, SGNHT thermostat) is reduced in the same pass, per block in shared memory and
// then with one atomicAdd per block into a double.

#include "sampler_math.h"

struct BnnSegment {
    float *theta;
    float *momentum;     // null for SGLD
    const float *grad;
    unsigned long long len;
    unsigned long long first_block; // first global 4-element block of this segment
    unsigned int param;  // parameter id of the noise stream
};

__device__ static unsigned int bnn_find_segment(const BnnSegment *segs, unsigned int nsegs,
                                               unsigned long long block) {
    unsigned int lo = 0, hi = nsegs;
    while (hi - lo > 1) {
        unsigned int mid = (lo + hi) / 2;
        if (segs[mid].first_block <= block) lo = mid; else hi = mid;
    }
    return lo;
}

extern "C" __global__ void bnn_fused_step(const BnnSegment *segs, unsigned int nsegs,
                                          unsigned long long total_blocks, int kind,
                                          unsigned long long seed, unsigned long long step,
                                          float step_size, float decay, float noise_scale,
                                          double *sum_sq) {
    __shared__ double partial[256];
    bnn_step_consts c = {step_size, decay, noise_scale};
    double local = 0.0;
    for (unsigned long long block = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
         block < total_blocks; block += (unsigned long long)gridDim.x * blockDim.x) {
        const BnnSegment s = segs[bnn_find_segment(segs, nsegs, block)];
        unsigned long long local_block = block - s.first_block;
        float z[4];
        bnn_normals4(seed, step, s.param, (uint32_t)local_block, z);
        for (int k = 0; k < 4; ++k) {
            unsigned long long i = 4 * local_block + k;
            if (i >= s.len) break;
            if (kind == 0) {
                bnn_sgld(&s.theta[i], s.grad[i], z[k], c);
            } else {
                local += (double)bnn_momentum_step(&s.theta[i], &s.momentum[i], s.grad[i], z[k], c);
            }
        }
    }
    partial[threadIdx.x] = local;
    __syncthreads();
    for (unsigned int stride = blockDim.x / 2; stride > 0; stride /= 2) {
        if (threadIdx.x < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
        __syncthreads();
    }
    if (threadIdx.x == 0 && sum_sq != 0) atomicAdd(sum_sq, partial[0]);
}
