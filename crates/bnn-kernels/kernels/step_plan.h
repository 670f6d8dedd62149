/* The kernels of the step plan (crates/bnn-kernels/src/plan/): an MLP's whole SG-MCMC
 * update as a fixed list of launches over buffers allocated once. Each kernel is written
 * here once, as the work of one CUDA thread (one element, one row, one column, one chain),
 * `__host__ __device__`: step_plan.cu wraps each in a `__global__` over its grid, and
 * plan_host.c loops the host over the same grid, so that the host executor (the test
 * double of the CUDA one) runs the same arithmetic. Bit-exactness rules as in
 * sampler_math.h: no implicit FMA contraction, no libm transcendental in f32 (the
 * polynomials `bnn_exp` and `bnn_log_unit`).
 *
 * Nothing a kernel reads changes between two launches of a captured graph except through
 * device buffers: the step counter that keys the Philox noise, the constants of the next
 * update, the minibatch's offset, the prior's λ/T and the likelihood's scale are fields of
 * a chain's control block (`bnn_plan_chain`), which the kernels read and the last kernel
 * of an update (`bnn_plan_finish`) advances.
 *
 * Layouts (row-major; K chains stacked along the slowest axis): the resident training set
 * data (N × D) with its labels (N, u32) or targets (N, f32); the epoch's index (K × M,
 * u32: chain k's minibatch rows at offset..offset+B of its row); activations and errors
 * (K × B × w); θ, v, the per-element state and ∇ (K × P, tensor t at offsets[t]).
 */
#ifndef BNN_STEP_PLAN_H
#define BNN_STEP_PLAN_H

#include "sampler_math.h"

#define BNN_PLAN_MAX_TENSORS 16
/* Threads of an update chunk: each one Philox block of 4 elements, so a chunk covers
 * 4 * BNN_PLAN_CHUNK elements of one tensor, and its sums are one fixed tree. */
#define BNN_PLAN_CHUNK 256

/* Activations (Rust: plan::Act). */
#define BNN_ACT_IDENTITY 0
#define BNN_ACT_RELU 1
#define BNN_ACT_SIGMOID 2
#define BNN_ACT_TANH 3

/* Samplers, for the bookkeeping of `bnn_plan_finish` (Rust: plan::Bookkeeping). */
#define BNN_PLAN_SGLD 0      /* SGLD and pSGLD: constants fixed */
#define BNN_PLAN_SGHMC 1     /* a fixed friction */
#define BNN_PLAN_SGNHT 2     /* alpha <- alpha + v.v/n - eta */
#define BNN_PLAN_MSGNHT 3    /* alpha_i per element; the mean for diagnostics */
#define BNN_PLAN_PSGLD 4     /* beta and lambda as the constants */

/* One chain's control block: what changes from update to update, on the device. The Rust
 * mirror is plan::ChainControl (#[repr(C)], its size checked against this one). */
typedef struct {
    uint64_t seed;           /* the Philox key */
    uint64_t step;           /* updates done: the counter of the next update's noise */
    uint64_t updates;        /* updates run in this epoch (not skipped) */
    double eta;              /* the step size of the next update */
    double eta_v;            /* the step size v is scaled for (the last update's) */
    double friction;         /* SGHMC's alpha */
    double diffusion;        /* SGNHT's a */
    double decay, damping;   /* pSGLD's beta and lambda */
    double thermostat;       /* SGNHT's alpha (mSGNHT: the mean alpha_i) */
    double kinetic;          /* 1/2 v.v / (n eta) after the last update */
    double n_params;         /* n */
    double nll_const;        /* a Gaussian likelihood's B (log sqrt(2 pi) - log(tau)/2) */
    double nll;              /* the last minibatch's mean NLL */
    double epoch_nll;        /* the epoch's sums of the minibatches' mean NLL times B, */
    double epoch_correct;    /* arg-max hits, */
    double epoch_sse;        /* and a regression's squared errors, */
    double epoch_kinetic;    /* and the kinetic energies after its updates (momentum rules) */
    double sums[BNN_PLAN_MAX_TENSORS][3]; /* last update, per tensor: v.v, sum alpha, theta.grad */
    double first_virials[BNN_PLAN_MAX_TENSORS]; /* the epoch's first update's theta.grad */
    float consts[4];         /* the next update's bnn_step_consts */
    float prior[BNN_PLAN_MAX_TENSORS]; /* lambda_t / T */
    float scale;             /* N / (B T): the likelihood's factor on its summed gradient */
    float precision;         /* tau, a Gaussian likelihood's noise precision */
    float rescale;           /* sqrt(eta / eta_v): v's factor before the next update */
    uint32_t offset;         /* where the next minibatch starts in the chain's index row */
    uint32_t halted;         /* a loss was not finite: no update since (the host stops the run) */
    uint32_t sampler;        /* BNN_PLAN_* */
    uint32_t splitting;      /* the splitting integrator's constants */
    uint32_t pad;            /* no implicit padding: the host copies the block as bytes */
} bnn_plan_chain;

/* The tensor table of the fused update: tensor t has n[t] elements at offsets[t] of a
 * chain's P, and its chunks start at chunk_start[t] (chunk_start[tensors] = all chunks). */
typedef struct {
    uint64_t offsets[BNN_PLAN_MAX_TENSORS];
    uint64_t n[BNN_PLAN_MAX_TENSORS];
    uint32_t chunk_start[BNN_PLAN_MAX_TENSORS + 1];
    uint32_t tensors;
    uint32_t rule;           /* BNN_RULE_* of sampler_math.h */
    uint32_t pad;            /* no implicit padding (p is 8-aligned) */
    uint64_t p;              /* P, parameters per chain */
} bnn_plan_table;

BNN_HD float bnn_plan_activate(int act, float x) {
    switch (act) {
    case BNN_ACT_RELU:
        return x > 0.0f ? x : 0.0f;
    case BNN_ACT_SIGMOID:
        return 1.0f / (1.0f + bnn_exp(-x));
    case BNN_ACT_TANH: {
        /* 1 - 2/(e^{2x} + 1): exact at 0, saturating without overflow (bnn_exp clamps). */
        float e = bnn_exp(x * 2.0f);
        return 1.0f - 2.0f / (e + 1.0f);
    }
    default:
        return x;
    }
}

/* d (the error at the activation's output a) times the activation's derivative, written
 * in its output as the CPU pass does. */
BNN_HD float bnn_plan_act_backward(int act, float d, float a) {
    switch (act) {
    case BNN_ACT_RELU:
        return a > 0.0f ? d : 0.0f;
    case BNN_ACT_SIGMOID:
        return d * (a * (1.0f - a));
    case BNN_ACT_TANH:
        return d * (1.0f - a * a);
    default:
        return d;
    }
}

/* Gather, element e of K x B x D: x[k][r][j] = data[index[k][offset_k + r]][j]. */
BNN_HD void bnn_plan_gather(uint64_t e, float *x, const float *data, const uint32_t *index,
                            const bnn_plan_chain *ctl, uint32_t m, uint32_t b, uint32_t d) {
    uint64_t row = e / d, j = e % d;
    uint32_t k = (uint32_t)(row / b), r = (uint32_t)(row % b);
    uint32_t i = index[(uint64_t)k * m + ctl[k].offset + r];
    x[e] = data[(uint64_t)i * d + j];
}

/* Bias and activation, element e of K x B x w: h = act(z + bias[k][c]), bias chain k's
 * at bias + k * p (θ's stride). In place (h may be z). */
BNN_HD void bnn_plan_bias_act(uint64_t e, float *h, const float *z, const float *bias,
                              uint64_t p, uint32_t b, uint32_t w, int act) {
    uint64_t c = e % w, k = e / ((uint64_t)b * w);
    h[e] = bnn_plan_activate(act, z[e] + bias[k * p + c]);
}

/* Softmax cross-entropy, row e of K x B: logits z + bias (written back into z), the error
 * delta = scale (softmax - onehot) (the CPU pass's f32 operations, exp and log by the
 * polynomials), the row's NLL max + log(sum) - z_y into loss[e] and its arg-max hit into
 * hit[e]. A label out of range gives a NaN loss, which halts the chain. */
BNN_HD void bnn_plan_softmax_xent(uint64_t e, float *z, float *delta, float *loss, float *hit,
                                  const float *bias, uint64_t p, const uint32_t *labels,
                                  const uint32_t *index, const bnn_plan_chain *ctl,
                                  uint32_t m, uint32_t b, uint32_t classes) {
    uint32_t k = (uint32_t)(e / b), r = (uint32_t)(e % b);
    uint32_t y = labels[index[(uint64_t)k * m + ctl[k].offset + r]];
    float *zr = z + e * classes, *dr = delta + e * classes;
    const float *br = bias + (uint64_t)k * p;
    float max = bnn_bits_to_float(0xff800000u); /* -inf */
    uint32_t arg = 0;
    for (uint32_t j = 0; j < classes; ++j) {
        float v = zr[j] + br[j];
        zr[j] = v;
        if (v > max) { max = v; arg = j; }
    }
    float sum = 0.0f;
    for (uint32_t j = 0; j < classes; ++j) {
        float t = bnn_exp(zr[j] - max);
        dr[j] = t;
        sum += t;
    }
    float scale = ctl[k].scale;
    float inv = scale / sum;
    for (uint32_t j = 0; j < classes; ++j) dr[j] *= inv;
    if (y < classes) {
        dr[y] -= scale;
        loss[e] = max + bnn_log_unit(sum) - zr[y];
    } else {
        loss[e] = bnn_bits_to_float(0x7fc00000u); /* NaN */
    }
    hit[e] = (y < classes && arg == y) ? 1.0f : 0.0f;
}

/* A held-out row's class probabilities, row e of K x b: the rows r0..r0+b of a held-out
 * set of n rows, their logits z (K x b x classes, the output layer's product) plus chain
 * k's bias, their softmax written into probs[k][r0 + r] (K x n x classes). The f32
 * operations of the CPU's ensemble::predict (the max, e^(v - max), one division by the
 * sum), exp by the polynomial; no label: the ensemble's sums are the host's. */
BNN_HD void bnn_plan_softmax_probs(uint64_t e, float *probs, const float *z, const float *bias,
                                   uint64_t p, uint32_t n, uint32_t r0, uint32_t b,
                                   uint32_t classes) {
    uint32_t k = (uint32_t)(e / b), r = (uint32_t)(e % b);
    const float *zr = z + e * classes, *br = bias + (uint64_t)k * p;
    float *out = probs + ((uint64_t)k * n + r0 + r) * classes;
    float max = bnn_bits_to_float(0xff800000u); /* -inf */
    for (uint32_t j = 0; j < classes; ++j) {
        float v = zr[j] + br[j];
        out[j] = v;
        if (v > max) max = v;
    }
    float sum = 0.0f;
    for (uint32_t j = 0; j < classes; ++j) {
        float t = bnn_exp(out[j] - max);
        out[j] = t;
        sum += t;
    }
    for (uint32_t j = 0; j < classes; ++j) out[j] = out[j] / sum;
}

/* A Gaussian likelihood's output error, row e of K x B (one output): f = z + bias,
 * r = f - y, delta = (scale tau) r, loss[e] = r (squared in the reduction). */
BNN_HD void bnn_plan_gaussian(uint64_t e, float *z, float *delta, float *loss, float *hit,
                              const float *bias, uint64_t p, const float *targets,
                              const uint32_t *index, const bnn_plan_chain *ctl, uint32_t m,
                              uint32_t b) {
    uint32_t k = (uint32_t)(e / b), r = (uint32_t)(e % b);
    float t = targets[index[(uint64_t)k * m + ctl[k].offset + r]];
    float f = z[e] + bias[(uint64_t)k * p];
    z[e] = f;
    float res = f - t;
    delta[e] = (ctl[k].scale * ctl[k].precision) * res;
    loss[e] = res;
    hit[e] = 0.0f;
}

/* The activation's backward and the bias gradient's column sums, column e of K x w:
 * delta[k][r][c] = act'(dh[k][r][c]; a[k][r][c]) for every row r (in place where dh is
 * delta), and grad_bias[k * p + c] = sum over r in row order. act IDENTITY: the sums of
 * an output error. */
BNN_HD void bnn_plan_backward_columns(uint64_t e, float *delta, const float *dh,
                                      const float *a, float *grad_bias, uint64_t p, uint32_t b,
                                      uint32_t w, int act) {
    uint64_t k = e / w, c = e % w;
    float sum = 0.0f;
    for (uint32_t r = 0; r < b; ++r) {
        uint64_t i = (k * b + r) * w + c;
        float d = act == BNN_ACT_IDENTITY ? dh[i] : bnn_plan_act_backward(act, dh[i], a[i]);
        delta[i] = d;
        sum += d;
    }
    grad_bias[k * p + c] = sum;
}

/* The minibatch's loss, chain k: sums of the rows in row order into the control block;
 * a loss that is not finite halts the chain (no update now or later: the host reads the
 * flag at the epoch's end and stops the run, as it does today on the CPU). */
BNN_HD void bnn_plan_reduce_loss(uint32_t k, bnn_plan_chain *ctl, const float *loss,
                                 const float *hit, uint32_t b, int gaussian) {
    bnn_plan_chain *c = &ctl[k];
    double sum = 0.0, hits = 0.0, sse = 0.0;
    for (uint32_t r = 0; r < b; ++r) {
        double v = (double)loss[(uint64_t)k * b + r];
        if (gaussian) {
            sse += v * v;
        } else {
            sum += v;
        }
        hits += (double)hit[(uint64_t)k * b + r];
    }
    if (gaussian) sum = 0.5 * (double)c->precision * sse + c->nll_const;
    double nll = sum / (double)b;
    c->nll = nll;
    if (!(nll - nll == 0.0)) c->halted = 1; /* NaN or infinite */
    if (c->halted) return;
    c->epoch_nll += nll * (double)b; /* as the host's Position::nll_sum */
    c->epoch_correct += hits;
    c->epoch_sse += sse;
}

/* The sums of one thread of an update chunk, s[3 * t ...], reduced as one fixed tree
 * (the CUDA kernel's shared-memory tree, the same additions in the same order). */
BNN_HD void bnn_plan_tree_step(double *s, uint32_t t, uint32_t stride) {
    if (t < stride) {
        s[3 * t] += s[3 * (t + stride)];
        s[3 * t + 1] += s[3 * (t + stride) + 1];
        s[3 * t + 2] += s[3 * (t + stride) + 2];
    }
}

/* The fused update, thread t of chunk `chunk` of chain k: its Philox block of the
 * chunk's tensor, the gradient g + (lambda_t / T) theta (the prior's term), the element
 * update by the table's rule with the chain's constants; its sums into out[0..3]. Nothing
 * moves while the chain is halted. */
BNN_HD void bnn_plan_update_thread(uint32_t k, uint32_t chunk, uint32_t t, float *theta,
                                   float *v, float *s1, const float *grad,
                                   const bnn_plan_chain *ctl, const bnn_plan_table *tab,
                                   double out[3]) {
    out[0] = out[1] = out[2] = 0.0;
    const bnn_plan_chain *c = &ctl[k];
    if (c->halted) return;
    uint32_t ti = 0;
    while (ti + 1 < tab->tensors && tab->chunk_start[ti + 1] <= chunk) ++ti;
    uint64_t block = (uint64_t)(chunk - tab->chunk_start[ti]) * BNN_PLAN_CHUNK + t;
    uint64_t n = tab->n[ti], base = (uint64_t)k * tab->p + tab->offsets[ti];
    if (4 * block >= n) return;
    bnn_step_consts sc = {c->consts[0], c->consts[1], c->consts[2], c->consts[3]};
    float prior = c->prior[ti], rescale = c->rescale;
    float z[4];
    bnn_normals4(c->seed, c->step, ti, (uint32_t)block, z);
    for (int q = 0; q < 4; ++q) {
        uint64_t i = 4 * block + q;
        if (i < n) {
            uint64_t at = base + i;
            float g = grad[at] + prior * theta[at];
            /* A new eta keeps the momentum p = v / sqrt(eta) of the dynamics: v is rescaled
             * first, in f32, as Dynamics::set_step_size does on the host. */
            if (v && rescale != 1.0f) v[at] = v[at] * rescale;
            bnn_update_element((int)tab->rule, &theta[at], v ? &v[at] : 0, s1 ? &s1[at] : 0,
                               g, z[q], sc, out);
        }
    }
}

/* The constants of chain c's next update from its state (Dynamics::step_consts in Rust):
 * f64 arithmetic rounded to f32 once, as StepConsts::{new, splitting, preconditioned};
 * and v's factor for a new eta (Dynamics::set_step_size's). */
BNN_HD void bnn_plan_consts(bnn_plan_chain *c) {
    double eta = c->eta, alpha = 0.0, sigma = sqrt(2.0 * eta);
    c->rescale = eta == c->eta_v ? 1.0f : (float)sqrt(eta / c->eta_v);
    switch (c->sampler) {
    case BNN_PLAN_PSGLD:
        c->consts[0] = (float)eta;
        c->consts[1] = (float)c->decay;
        c->consts[2] = (float)c->damping;
        c->consts[3] = (float)sigma;
        return;
    case BNN_PLAN_SGHMC:
        alpha = c->friction;
        sigma = sqrt(2.0 * alpha * eta);
        break;
    case BNN_PLAN_SGNHT:
    case BNN_PLAN_MSGNHT:
        alpha = c->thermostat;
        sigma = sqrt(2.0 * c->diffusion * eta);
        break;
    default:
        break;
    }
    c->consts[0] = (float)eta;
    c->consts[3] = (float)sigma;
    if (c->splitting) {
        float damp = (float)exp(-alpha / 2.0);
        c->consts[1] = damp;
        c->consts[2] = damp;
    } else {
        c->consts[1] = (float)(1.0 - alpha);
        c->consts[2] = 1.0f;
    }
}

/* The update's end, chain k: each tensor's sums from its chunks' partials (K x chunks x
 * 3, chunk order), the kinetic energy, SGNHT's alpha (Ding et al. Alg. 2) or mSGNHT's
 * mean, the step counter, the next minibatch's offset, the next update's eta from the
 * epoch's table (etas: K x u, the schedule's eta of each of the epoch's u updates, written
 * by the host when the epoch opens) and the next constants: what Dynamics::close_update
 * and the schedule do on the host. A halted chain stands still. */
BNN_HD void bnn_plan_finish(uint32_t k, bnn_plan_chain *ctl, const double *partials,
                            const bnn_plan_table *tab, const double *etas, uint32_t b,
                            uint32_t u) {
    bnn_plan_chain *c = &ctl[k];
    if (c->halted) return;
    uint32_t chunks = tab->chunk_start[tab->tensors];
    double sum_sq = 0.0, sum_alpha = 0.0;
    for (uint32_t t = 0; t < tab->tensors; ++t) {
        double s[3] = {0.0, 0.0, 0.0};
        for (uint32_t q = tab->chunk_start[t]; q < tab->chunk_start[t + 1]; ++q) {
            const double *pq = partials + 3 * ((uint64_t)k * chunks + q);
            s[0] += pq[0];
            s[1] += pq[1];
            s[2] += pq[2];
        }
        c->sums[t][0] = s[0];
        c->sums[t][1] = s[1];
        c->sums[t][2] = s[2];
        sum_sq += s[0];
        sum_alpha += s[1];
    }
    int momentum = tab->rule == BNN_RULE_MOMENTUM || tab->rule == BNN_RULE_THERMOSTAT_EULER ||
                   tab->rule == BNN_RULE_THERMOSTAT_SPLITTING;
    if (momentum) {
        c->kinetic = 0.5 * sum_sq / (c->n_params * c->eta);
        c->epoch_kinetic += c->kinetic;
    }
    /* The configurational temperature counts the epoch's first minibatch alone (drawn
     * independently of theta): kept for the host's read at its next look. */
    if (c->updates == 0)
        for (uint32_t t = 0; t < tab->tensors; ++t) c->first_virials[t] = c->sums[t][2];
    if (c->sampler == BNN_PLAN_SGNHT) c->thermostat += sum_sq / c->n_params - c->eta;
    if (c->sampler == BNN_PLAN_MSGNHT) c->thermostat = sum_alpha / c->n_params;
    c->step += 1;
    c->updates += 1;
    c->offset += b;
    c->eta_v = c->eta;
    if (c->updates < u) c->eta = etas[(uint64_t)k * u + c->updates];
    bnn_plan_consts(c);
}

#include "plan_ensemble.h"

#endif
