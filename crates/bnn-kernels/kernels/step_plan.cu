// The step plan's kernels on CUDA (crates/bnn-kernels/src/plan/): each a grid over the
// work items of its body in step_plan.h, one thread an item; plan_host.c runs the same
// bodies on the host over the same items. No kernel takes a value that changes from update
// to update as an argument: those are read from the chains' control blocks, so that a
// captured CUDA graph of an update (or of S updates) replays correctly. No float atomics:
// an update's sums are fixed per-chunk trees, then one pass in chunk order
// (bnn_plan_finish), so every run gives the same bits.

#include "step_plan.h"

typedef unsigned long long u64;

#define BNN_PLAN_ITEM (blockIdx.x * (u64)blockDim.x + threadIdx.x)

extern "C" __global__ void bnn_plan_gather_kernel(u64 items, float *x, const float *data,
                                                  const uint32_t *index,
                                                  const bnn_plan_chain *ctl, uint32_t m,
                                                  uint32_t b, uint32_t d) {
    u64 e = BNN_PLAN_ITEM;
    if (e < items) bnn_plan_gather(e, x, data, index, ctl, m, b, d);
}

extern "C" __global__ void bnn_plan_bias_act_kernel(u64 items, float *h, const float *z,
                                                    const float *bias, u64 p, uint32_t b,
                                                    uint32_t w, int act) {
    u64 e = BNN_PLAN_ITEM;
    if (e < items) bnn_plan_bias_act(e, h, z, bias, p, b, w, act);
}

extern "C" __global__ void bnn_plan_softmax_xent_kernel(
    u64 items, float *z, float *delta, float *loss, float *hit, const float *bias, u64 p,
    const uint32_t *labels, const uint32_t *index, const bnn_plan_chain *ctl, uint32_t m,
    uint32_t b, uint32_t classes) {
    u64 e = BNN_PLAN_ITEM;
    if (e < items)
        bnn_plan_softmax_xent(e, z, delta, loss, hit, bias, p, labels, index, ctl, m, b, classes);
}

extern "C" __global__ void bnn_plan_softmax_probs_kernel(u64 items, float *probs,
                                                         const float *z, const float *bias,
                                                         u64 p, uint32_t n, uint32_t r0,
                                                         uint32_t b, uint32_t classes) {
    u64 e = BNN_PLAN_ITEM;
    if (e < items) bnn_plan_softmax_probs(e, probs, z, bias, p, n, r0, b, classes);
}

extern "C" __global__ void bnn_plan_gaussian_kernel(u64 items, float *z, float *delta,
                                                    float *loss, float *hit, const float *bias,
                                                    u64 p, const float *targets,
                                                    const uint32_t *index,
                                                    const bnn_plan_chain *ctl, uint32_t m,
                                                    uint32_t b) {
    u64 e = BNN_PLAN_ITEM;
    if (e < items) bnn_plan_gaussian(e, z, delta, loss, hit, bias, p, targets, index, ctl, m, b);
}

extern "C" __global__ void bnn_plan_backward_columns_kernel(u64 items, float *delta,
                                                            const float *dh, const float *a,
                                                            float *grad_bias, u64 p, uint32_t b,
                                                            uint32_t w, int act) {
    u64 e = BNN_PLAN_ITEM;
    if (e < items) bnn_plan_backward_columns(e, delta, dh, a, grad_bias, p, b, w, act);
}

extern "C" __global__ void bnn_plan_reduce_loss_kernel(uint32_t chains, bnn_plan_chain *ctl,
                                                       const float *loss, const float *hit,
                                                       uint32_t b, int gaussian) {
    u64 k = BNN_PLAN_ITEM;
    if (k < chains) bnn_plan_reduce_loss((uint32_t)k, ctl, loss, hit, b, gaussian);
}

// Grid (chunks, K), BNN_PLAN_CHUNK threads: thread t of block (q, k) updates its Philox
// block of chunk q of chain k; the block's sums, one tree, go to partials[k][q].
extern "C" __global__ void bnn_plan_update_kernel(float *theta, float *v, float *s1,
                                                  const float *grad, const bnn_plan_chain *ctl,
                                                  const bnn_plan_table *tab, double *partials) {
    __shared__ double s[3 * BNN_PLAN_CHUNK];
    uint32_t q = blockIdx.x, k = blockIdx.y, t = threadIdx.x;
    bnn_plan_update_thread(k, q, t, theta, v, s1, grad, ctl, tab, &s[3 * t]);
    __syncthreads();
    for (uint32_t stride = BNN_PLAN_CHUNK / 2; stride > 0; stride /= 2) {
        bnn_plan_tree_step(s, t, stride);
        __syncthreads();
    }
    if (t < 3) {
        u64 chunks = tab->chunk_start[tab->tensors];
        partials[3 * ((u64)k * chunks + q) + t] = s[t];
    }
}

extern "C" __global__ void bnn_plan_finish_kernel(uint32_t chains, bnn_plan_chain *ctl,
                                                  const double *partials,
                                                  const bnn_plan_table *tab,
                                                  const double *etas, uint32_t b, uint32_t u) {
    u64 k = BNN_PLAN_ITEM;
    if (k < chains) bnn_plan_finish((uint32_t)k, ctl, partials, tab, etas, b, u);
}

extern "C" __global__ void bnn_plan_ensemble_fold_kernel(u64 items, double *sum, double *entropy,
                                                         double *scores, const float *probs,
                                                         const uint32_t *labels,
                                                         const double *samples, uint32_t n,
                                                         uint32_t classes) {
    u64 e = BNN_PLAN_ITEM;
    if (e < items)
        bnn_plan_ensemble_fold(e, sum, entropy, scores, probs, labels, samples, n, classes);
}

// One thread per chain and tally (alone, ensemble), each summing the rows in row order:
// 2K threads at a kept sample, the price of the host's sums' bits.
extern "C" __global__ void bnn_plan_ensemble_tally_kernel(u64 items, double *totals,
                                                          double *samples,
                                                          const double *scores, uint32_t n) {
    u64 e = BNN_PLAN_ITEM;
    if (e < items) bnn_plan_ensemble_tally(e, totals, samples, scores, n);
}
