/* The step plan's ensemble on the device (crates/bnn-kernels/src/plan/mlp.rs, `HeldOut`):
 * at a kept sample, every chain's class probabilities of a held-out set (K x N x classes,
 * written by bnn_plan_softmax_probs) are folded into that chain's running sums, and the
 * sample's metrics alone and the ensemble's after it are tallied into a small block per
 * chain, which is all the host reads; the sums themselves are read at a checkpoint and
 * at the end. The arithmetic is the host's `ensemble::Accumulator::add` and
 * `metrics::evaluate` (Rust) operation for operation, in f64, so that the host executor
 * gives their bits: Σp += p and ΣH += -Σ p ln p per example, the mean Σp/s, the first
 * arg-max, -ln max(p_y, 1e-12), the Brier sum, the confidence's bin of 15, each summed
 * over the examples in row order. ln is f64 libm on the host, CUDA's log (within 1 ulp)
 * on the device. Included by step_plan.h. */
#ifndef BNN_PLAN_ENSEMBLE_H
#define BNN_PLAN_ENSEMBLE_H

/* A row's score: arg-max hit, ln max(p_y, 1e-12), Brier sum, confidence, and 1 where
 * all its probabilities are finite. */
#define BNN_PLAN_SCORE 5
/* Bins of the calibration error (metrics::ECE_BINS). */
#define BNN_PLAN_ECE_BINS 15
/* A tally: hits, the NLL sum, the Brier sum, the rows not finite, then per bin its rows,
 * its confidences' sum and its hits (the Rust `metrics::Tally`). */
#define BNN_PLAN_TALLY (4 + 3 * BNN_PLAN_ECE_BINS)

/* The score of one row: its probabilities p[j] (f32, the sample's) or sum[j] / samples
 * (f64, the ensemble's mean) when sum is given, against label y, into out. */
BNN_HD void bnn_plan_score_row(double *out, const float *p, const double *sum, double samples,
                               uint32_t y, uint32_t classes) {
    uint32_t arg = 0;
    double best = (double)bnn_bits_to_float(0xff800000u); /* -inf */
    double brier = -0.0, finite = 1.0;
    for (uint32_t j = 0; j < classes; ++j) {
        double v = sum ? sum[j] / samples : (double)p[j];
        if (v > best) { best = v; arg = j; }
        double t = j == y ? 1.0 : 0.0;
        brier += (v - t) * (v - t);
        if (!(v - v == 0.0)) finite = 0.0; /* NaN or infinite */
    }
    double py = sum ? sum[y] / samples : (double)p[y];
    out[0] = arg == y ? 1.0 : 0.0;
    out[1] = log(py > 1e-12 ? py : 1e-12);
    out[2] = brier;
    out[3] = sum ? sum[arg] / samples : (double)p[arg];
    out[4] = finite;
}

/* Fold, row e of K x n: chain k's probabilities of row r added to its sums (sum, K x n x
 * classes; entropy, K x n), then the row's score alone into scores[k][0][r] and in the
 * ensemble of samples[k] + 1 samples into scores[k][1][r] (scores: K x 2 x n x SCORE). */
BNN_HD void bnn_plan_ensemble_fold(uint64_t e, double *sum, double *entropy, double *scores,
                                   const float *probs, const uint32_t *labels,
                                   const double *samples, uint32_t n, uint32_t classes) {
    uint32_t k = (uint32_t)(e / n), r = (uint32_t)(e % n);
    const float *p = probs + e * classes;
    double *s = sum + e * classes;
    double h = -0.0;
    for (uint32_t j = 0; j < classes; ++j) {
        s[j] += (double)p[j];
        if (p[j] > 0.0f) h += (double)p[j] * log((double)p[j]);
    }
    entropy[e] += -h;
    double *alone = scores + ((uint64_t)k * 2 * n + r) * BNN_PLAN_SCORE;
    bnn_plan_score_row(alone, p, 0, 0.0, labels[r], classes);
    bnn_plan_score_row(alone + (uint64_t)n * BNN_PLAN_SCORE, 0, s, samples[k] + 1.0, labels[r],
                       classes);
}

/* Tally, item e of K x 2 (chain e / 2; its sample alone, then its ensemble): the n rows'
 * scores summed in row order into totals[e] (BNN_PLAN_TALLY values); the ensemble's item
 * counts the sample into samples[k]. */
BNN_HD void bnn_plan_ensemble_tally(uint64_t e, double *totals, double *samples,
                                    const double *scores, uint32_t n) {
    double t[BNN_PLAN_TALLY];
    for (uint32_t i = 0; i < BNN_PLAN_TALLY; ++i) t[i] = 0.0;
    const double *sc = scores + e * n * BNN_PLAN_SCORE;
    for (uint32_t r = 0; r < n; ++r, sc += BNN_PLAN_SCORE) {
        double hit = sc[0], conf = sc[3];
        t[0] += hit;
        t[1] -= sc[1];
        t[2] += sc[2];
        t[3] += 1.0 - sc[4];
        /* The bin of (b/15, (b+1)/15] holding the confidence (a NaN in the first). */
        double c = ceil(conf * (double)BNN_PLAN_ECE_BINS);
        uint32_t b = !(c >= 1.0) ? 0u : c >= (double)BNN_PLAN_ECE_BINS ? BNN_PLAN_ECE_BINS - 1
                                                                         : (uint32_t)c - 1u;
        t[4 + b] += 1.0;
        t[4 + BNN_PLAN_ECE_BINS + b] += conf;
        t[4 + 2 * BNN_PLAN_ECE_BINS + b] += hit;
    }
    for (uint32_t i = 0; i < BNN_PLAN_TALLY; ++i) totals[e * BNN_PLAN_TALLY + i] = t[i];
    if (e % 2 == 1) samples[e / 2] += 1.0;
}

#endif
