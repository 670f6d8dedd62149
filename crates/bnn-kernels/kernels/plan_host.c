/* The step plan's kernels on the host: each loops the bodies of step_plan.h over the work
 * items its CUDA kernel (step_plan.cu) gives one thread each, in item order, so that the
 * host executor (crates/bnn-kernels/src/plan/host.rs) is the CUDA executor's test double.
 * The update's chunks reduce their threads' sums by the same tree as the kernel's shared
 * memory. */
#include <math.h>
#include <stdlib.h>
#include "step_plan.h"

uint64_t bnn_plan_chain_size(void) { return sizeof(bnn_plan_chain); }
uint64_t bnn_plan_table_size(void) { return sizeof(bnn_plan_table); }

void bnn_host_plan_gather(uint64_t items, float *x, const float *data, const uint32_t *index,
                          const bnn_plan_chain *ctl, uint32_t m, uint32_t b, uint32_t d) {
    for (uint64_t e = 0; e < items; ++e) bnn_plan_gather(e, x, data, index, ctl, m, b, d);
}

void bnn_host_plan_bias_act(uint64_t items, float *h, const float *z, const float *bias,
                            uint64_t p, uint32_t b, uint32_t w, int act) {
    for (uint64_t e = 0; e < items; ++e) bnn_plan_bias_act(e, h, z, bias, p, b, w, act);
}

void bnn_host_plan_softmax_xent(uint64_t items, float *z, float *delta, float *loss, float *hit,
                                const float *bias, uint64_t p, const uint32_t *labels,
                                const uint32_t *index, const bnn_plan_chain *ctl, uint32_t m,
                                uint32_t b, uint32_t classes) {
    for (uint64_t e = 0; e < items; ++e)
        bnn_plan_softmax_xent(e, z, delta, loss, hit, bias, p, labels, index, ctl, m, b, classes);
}

void bnn_host_plan_softmax_probs(uint64_t items, float *probs, const float *z,
                                 const float *bias, uint64_t p, uint32_t n, uint32_t r0,
                                 uint32_t b, uint32_t classes) {
    for (uint64_t e = 0; e < items; ++e)
        bnn_plan_softmax_probs(e, probs, z, bias, p, n, r0, b, classes);
}

void bnn_host_plan_gaussian(uint64_t items, float *z, float *delta, float *loss, float *hit,
                            const float *bias, uint64_t p, const float *targets,
                            const uint32_t *index, const bnn_plan_chain *ctl, uint32_t m,
                            uint32_t b) {
    for (uint64_t e = 0; e < items; ++e)
        bnn_plan_gaussian(e, z, delta, loss, hit, bias, p, targets, index, ctl, m, b);
}

void bnn_host_plan_backward_columns(uint64_t items, float *delta, const float *dh,
                                    const float *a, float *grad_bias, uint64_t p, uint32_t b,
                                    uint32_t w, int act) {
    for (uint64_t e = 0; e < items; ++e)
        bnn_plan_backward_columns(e, delta, dh, a, grad_bias, p, b, w, act);
}

void bnn_host_plan_reduce_loss(uint32_t chains, bnn_plan_chain *ctl, const float *loss,
                               const float *hit, uint32_t b, int gaussian) {
    for (uint32_t k = 0; k < chains; ++k) bnn_plan_reduce_loss(k, ctl, loss, hit, b, gaussian);
}

/* Every chunk of every chain: its threads' sums, then the kernel's tree. */
void bnn_host_plan_update(uint32_t chains, float *theta, float *v, float *s1, const float *grad,
                          const bnn_plan_chain *ctl, const bnn_plan_table *tab,
                          double *partials) {
    double s[3 * BNN_PLAN_CHUNK];
    uint32_t chunks = tab->chunk_start[tab->tensors];
    for (uint32_t k = 0; k < chains; ++k) {
        for (uint32_t q = 0; q < chunks; ++q) {
            for (uint32_t t = 0; t < BNN_PLAN_CHUNK; ++t)
                bnn_plan_update_thread(k, q, t, theta, v, s1, grad, ctl, tab, &s[3 * t]);
            for (uint32_t stride = BNN_PLAN_CHUNK / 2; stride > 0; stride /= 2)
                for (uint32_t t = 0; t < BNN_PLAN_CHUNK; ++t) bnn_plan_tree_step(s, t, stride);
            double *out = partials + 3 * ((uint64_t)k * chunks + q);
            out[0] = s[0];
            out[1] = s[1];
            out[2] = s[2];
        }
    }
}

void bnn_host_plan_finish(uint32_t chains, bnn_plan_chain *ctl, const double *partials,
                          const bnn_plan_table *tab, const double *etas, uint32_t b,
                          uint32_t u) {
    for (uint32_t k = 0; k < chains; ++k) bnn_plan_finish(k, ctl, partials, tab, etas, b, u);
}

/* The next constants of one chain (the host sets a chain's state, then asks). */
void bnn_host_plan_consts(bnn_plan_chain *c) { bnn_plan_consts(c); }

void bnn_host_plan_ensemble_fold(uint64_t items, double *sum, double *entropy, double *scores,
                                 const float *probs, const uint32_t *labels,
                                 const double *samples, uint32_t n, uint32_t classes) {
    for (uint64_t e = 0; e < items; ++e)
        bnn_plan_ensemble_fold(e, sum, entropy, scores, probs, labels, samples, n, classes);
}

void bnn_host_plan_ensemble_tally(uint64_t items, double *totals, double *samples,
                                  const double *scores, uint32_t n) {
    for (uint64_t e = 0; e < items; ++e) bnn_plan_ensemble_tally(e, totals, samples, scores, n);
}
