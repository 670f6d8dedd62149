// Fused sampler step on Metal: the same element math as sampler_math.h, for one
// parameter tensor per dispatch (one thread per 4-element Philox block).
// Metal has no 64-bit floats: the sum of v*v is reduced in f32 per threadgroup.
// Status: source only. It has not been compiled here (no Metal toolchain on Linux) and
// is not wired into the Rust code yet.
#include <metal_stdlib>
using namespace metal;

struct StepArgs {
    uint n;
    uint param;
    uint seed_lo, seed_hi;
    uint step_lo, step_hi;
    float step_size, decay, post, noise_scale;
    int kind;
};

static inline void mulhilo(uint a, uint b, thread uint &hi, thread uint &lo) {
    hi = mulhi(a, b);
    lo = a * b;
}

static inline void philox(thread uint c[4], uint k0, uint k1) {
    for (int r = 0; r < 10; ++r) {
        uint hi0, lo0, hi1, lo1;
        mulhilo(0xD2511F53u, c[0], hi0, lo0);
        mulhilo(0xCD9E8D57u, c[2], hi1, lo1);
        uint n0 = hi1 ^ c[1] ^ k0, n2 = hi0 ^ c[3] ^ k1;
        c[0] = n0; c[1] = lo1; c[2] = n2; c[3] = lo0;
        if (r < 9) { k0 += 0x9E3779B9u; k1 += 0xBB67AE85u; }
    }
}

static inline float log_unit(float x) {
    uint bits = as_type<uint>(x);
    int e = int((bits >> 23) & 0xffu) - 126;
    float m = as_type<float>((bits & 0x007fffffu) | 0x3f000000u);
    if (m < 0.70710677f) { e -= 1; m = m + m; }
    float xm = m - 1.0f, z = xm * xm, y = 7.0376836e-2f;
    y = fma(y, xm, -1.15146103e-1f); y = fma(y, xm, 1.16769987e-1f);
    y = fma(y, xm, -1.24201408e-1f); y = fma(y, xm, 1.42493228e-1f);
    y = fma(y, xm, -1.66680577e-1f); y = fma(y, xm, 2.00007148e-1f);
    y = fma(y, xm, -2.4999994e-1f);  y = fma(y, xm, 3.3333331e-1f);  y = y * xm * z;
    float ef = float(e);
    y = fma(ef, -2.1219444e-4f, y); y = fma(-0.5f, z, y);
    return fma(ef, 0.6933594f, xm + y);
}

static inline float2 sincos_turn(float u) {
    int q = int(u * 4.0f + 0.5f);
    float a = (u * 4.0f - float(q)) * 1.5707964f, a2 = a * a;
    float s = fma(a * a2, fma(fma(a2, -1.9515296e-4f, 8.332161e-3f), a2, -1.6666655e-1f), a);
    float c = fma(a2 * a2, fma(fma(a2, 2.4433157e-5f, -1.3887316e-3f), a2, 4.1666646e-2f),
                  fma(-0.5f, a2, 1.0f));
    switch (q & 3) {
    case 0: return float2(s, c);
    case 1: return float2(c, -s);
    case 2: return float2(-s, -c);
    default: return float2(-c, s);
    }
}

kernel void bnn_fused_step(device float *theta [[buffer(0)]],
                           device float *momentum [[buffer(1)]],
                           device const float *grad [[buffer(2)]],
                           constant StepArgs &args [[buffer(3)]],
                           device atomic_float *sum_sq [[buffer(4)]],
                           uint block [[thread_position_in_grid]]) {
    if (4 * block >= args.n) return;
    uint c[4] = {block, args.param, args.step_lo, args.step_hi};
    philox(c, args.seed_lo, args.seed_hi);
    float z[4];
    for (int k = 0; k < 2; ++k) {
        float u1 = float((c[2 * k] >> 8) + 1u) * (1.0f / 16777216.0f);
        float u2 = float((c[2 * k + 1] >> 8) + 1u) * (1.0f / 16777216.0f);
        float rad = sqrt(-2.0f * log_unit(u1));
        float2 sc = sincos_turn(u2);
        z[2 * k] = rad * sc.y;
        z[2 * k + 1] = rad * sc.x;
    }
    float local = 0.0f;
    for (uint k = 0; k < 4 && 4 * block + k < args.n; ++k) {
        uint i = 4 * block + k;
        if (args.kind == 0) {
            theta[i] = theta[i] - grad[i] * args.step_size + z[k] * args.noise_scale;
        } else {
            float vn = (momentum[i] * args.decay - grad[i] * args.step_size + z[k] * args.noise_scale) * args.post;
            momentum[i] = vn;
            theta[i] = theta[i] + vn;
            local += vn * vn;
        }
    }
    atomic_fetch_add_explicit(sum_sq, local, memory_order_relaxed);
}
