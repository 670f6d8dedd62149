//! The per-element and per-plane passes of `bnn-core`'s ResNet pass: im2col
//! and its adjoint at any stride and padding, FRN + TLU forward and backward, the
//! activations, on the pool's two threads.

use super::{ConvGeometry, Nonlinearity as Activation, FRN_EPSILON};
use crate::elementwise;
use crate::gemm::{product, transpose, Mat, Options};
use crate::isa::multiversion;
use crate::pool::{self, Disjoint};
use std::ops::Range;

/// Lanes of the partial sums of the per-plane reductions (one AVX2 vector).
const LANES: usize = 8;

/// Runs `f` on the plane ranges of two halves of `planes` planes (one thread when `work`
/// is small); `f` writes only what belongs to its planes.
pub fn split_planes(planes: usize, work: usize, f: &(dyn Fn(std::ops::Range<usize>) + Sync)) {
    if work < pool::PARALLEL_MIN_ELEMENTS || planes < 2 || pool::threads() < 2 {
        f(0..planes);
        return;
    }
    let cut = planes.div_ceil(2);
    pool::run(2, &|p| f(if p == 0 { 0..cut } else { cut..planes }));
}

/// Bytes of im2col matrix a convolution works on at a time: a chunk of the minibatch's
/// images whose columns stay in L2 (512 KiB per core on Zen 3, 1–2 MiB on Xeons) while
/// the product reads them. The whole minibatch's matrix (29 MB for a ResNet-20 stage-1
/// convolution at 64 images) streamed from memory: its products ran at 32 GFLOP/s on one
/// AMD EPYC core, 77 on the L2-resident chunks (bench: 16 × 144 by 144 × 784).
pub const CHUNK_BYTES: usize = 384 << 10;

/// Images per chunk of convolution `g` (see [`CHUNK_BYTES`]), at least one.
pub fn chunk_images(g: &ConvGeometry, rows: usize) -> usize {
    let per_image = g.patch() * g.out_plane() * std::mem::size_of::<f32>();
    (CHUNK_BYTES / per_image.max(1)).clamp(1, rows.max(1))
}

/// The chunks of `rows` images for convolution `g`.
pub fn chunks(g: &ConvGeometry, rows: usize) -> impl Iterator<Item = Range<usize>> {
    let per = chunk_images(g, rows);
    (0..rows)
        .step_by(per)
        .map(move |b0| b0..(b0 + per).min(rows))
}

/// `cols[(c·k + i)·k + j][((b − b₀)·H_o + y)·W_o + x] = a[c][b][y·s + i − p][x·s + j − p]`
/// for the images b of `images`, zero outside the image: the patches of a (C_in × B × H ×
/// W) input (B = `rows`) as columns.
pub fn im2col(a: &[f32], g: &ConvGeometry, rows: usize, images: Range<usize>, cols: &mut [f32]) {
    let n = images.len() * g.out_h * g.out_w;
    let cols = &mut cols[..g.patch() * n];
    let work = cols.len();
    pool::halves(cols, n, work, |part, at| {
        im2col_part(a, g, rows, images.clone(), part, at)
    });
}

multiversion! {
    /// The rows of [`im2col`]'s matrix in `part`, the first of them `at` elements in.
    fn im2col_part(
        a: &[f32],
        g: &ConvGeometry,
        rows: usize,
        images: Range<usize>,
        part: &mut [f32],
        at: usize,
    ) {
        let (k, s, pad) = (g.kernel, g.stride, g.pad);
        let (ih, iw, oh, ow) = (g.in_h, g.in_w, g.out_h, g.out_w);
        let n = images.len() * oh * ow;
        for (q, row) in part.chunks_exact_mut(n).enumerate() {
            let r = at / n + q;
            let (c, i, j) = (r / (k * k), r / k % k, r % k);
            // Output columns whose input column x·s + j − p lies inside the image.
            let x0 = (pad.saturating_sub(j)).div_ceil(s);
            let x1 = ((iw + pad - j).div_ceil(s)).min(ow);
            for (b, out) in images.clone().zip(row.chunks_exact_mut(oh * ow)) {
                let plane = &a[(c * rows + b) * ih * iw..][..ih * iw];
                for (y, line) in out.chunks_exact_mut(ow).enumerate() {
                    let iy = y * s + i;
                    if iy < pad || iy - pad >= ih || x0 >= x1 {
                        line.fill(0.0);
                        continue;
                    }
                    let src = &plane[(iy - pad) * iw..][..iw];
                    line[..x0].fill(0.0);
                    line[x1..].fill(0.0);
                    if s == 1 {
                        let from = x0 + j - pad;
                        copy_short(&mut line[x0..x1], &src[from..from + x1 - x0]);
                    } else {
                        for (x, v) in line[x0..x1].iter_mut().enumerate() {
                            *v = src[(x0 + x) * s + j - pad];
                        }
                    }
                }
            }
        }
    }
}

/// The patches as rows, channels last: `cols_t[((b − b₀)·H_o + y)·W_o + x][(i·k + j)·C +
/// c] = a[c][b][y·s + i − p][x·s + j − p]` for the images b of `images`, zero outside the
/// image, through `a_t` (the chunk's input transposed to pixels × channels). The weight
/// gradient ∂Z·cols_t then reads this operand in place, where ∂Z·[`im2col`]ᵀ had to
/// transpose all of the (k²·C_in × pixels) matrix in the product's packing (19% of a
/// ResNet-20 step); here only the input (k² times smaller at stride 1) is transposed,
/// and a patch row is k² copies of C contiguous floats.
pub fn im2row(
    a: &[f32],
    g: &ConvGeometry,
    rows: usize,
    images: Range<usize>,
    a_t: &mut [f32],
    cols_t: &mut [f32],
) {
    let ch = g.in_channels;
    let (ih, iw, oh, ow) = (g.in_h, g.in_w, g.out_h, g.out_w);
    let pixels = images.len() * ih * iw;
    let a_t = &mut a_t[..pixels * ch];
    transpose(
        ch,
        pixels,
        &a[images.start * ih * iw..],
        rows * ih * iw,
        a_t,
        ch,
    );
    let a_t = &*a_t;
    let patch = g.patch();
    let cols_t = &mut cols_t[..images.len() * oh * ow * patch];
    let work = cols_t.len();
    pool::halves(cols_t, patch, work, |part, at| {
        im2row_part(a_t, g, part, at)
    });
}

multiversion! {
    /// The rows of [`im2row`]'s matrix in `part`, the first of them `at` elements in.
    fn im2row_part(a_t: &[f32], g: &ConvGeometry, part: &mut [f32], at: usize) {
        let (k, s, pad, ch) = (g.kernel, g.stride, g.pad, g.in_channels);
        let (ih, iw, oh, ow) = (g.in_h, g.in_w, g.out_h, g.out_w);
        let patch = g.patch();
        for (q, row) in part.chunks_exact_mut(patch).enumerate() {
            let pixel = at / patch + q;
            let (b, y, x) = (pixel / (oh * ow), pixel / ow % oh, pixel % ow);
            // Kernel columns j whose input column x·s + j − p lies inside the image.
            let j0 = pad.saturating_sub(x * s);
            let j1 = (iw + pad).saturating_sub(x * s).min(k);
            for (i, part) in row.chunks_exact_mut(k * ch).enumerate() {
                let iy = y * s + i;
                if iy < pad || iy - pad >= ih || j0 >= j1 {
                    part.fill(0.0);
                    continue;
                }
                part[..j0 * ch].fill(0.0);
                part[j1 * ch..].fill(0.0);
                let from = ((b * ih + iy - pad) * iw + x * s + j0 - pad) * ch;
                copy_short(
                    &mut part[j0 * ch..j1 * ch],
                    &a_t[from..from + (j1 - j0) * ch],
                );
            }
        }
    }
}

/// dst ← src for image rows (tens of floats): in 8-float blocks the compiler keeps in
/// registers, where `copy_from_slice` calls memmove, whose call cost as much as the copy
/// (6% of a ResNet-8 step in im2col's row copies, measured with `perf`).
#[inline(always)]
pub fn copy_short(dst: &mut [f32], src: &[f32]) {
    let whole = dst.len() / LANES * LANES;
    for (d, s) in dst[..whole]
        .chunks_exact_mut(LANES)
        .zip(src[..whole].chunks_exact(LANES))
    {
        if let (Ok(d), Ok(s)) = (
            <&mut [f32; LANES]>::try_from(d),
            <&[f32; LANES]>::try_from(s),
        ) {
            *d = *s;
        }
    }
    // The tail in blocks of 4, 2, 1 (a loop would become a memcpy call again).
    let mut k = whole;
    for block in [4, 2, 1] {
        if dst.len() - k >= block {
            dst[k..k + block].copy_from_slice(&src[k..k + block]);
            k += block;
        }
    }
}

/// The adjoint of [`im2col`] over the images of `images`: `da[c][b][y·s + i − p][x·s + j −
/// p] += dcols[…]` over the patches that contain the pixel, onto `da` as it is
/// (`accumulate`) or onto zeros.
pub fn col2im(
    dcols: &[f32],
    g: &ConvGeometry,
    rows: usize,
    images: Range<usize>,
    da: &mut [f32],
    accumulate: bool,
) {
    let n = images.len() * g.out_h * g.out_w;
    let image = g.in_h * g.in_w;
    assert!(
        da.len() >= g.in_channels * rows * image && dcols.len() >= g.patch() * n,
        "col2im: buffers too small"
    );
    let dp = Disjoint::new(da);
    split_planes(g.in_channels, g.patch() * n, &|channels| {
        for c in channels {
            let start = (c * rows + images.start) * image;
            // SAFETY: channel c's images of the chunk belong to this part alone (inside
            // `da`, checked above).
            let part = unsafe { dp.slice(start, start + images.len() * image) };
            col2im_channel(dcols, g, n, c, part, accumulate);
        }
    });
}

multiversion! {
    /// [`col2im`] for channel `c`: its `n` columns' images in `part`.
    fn col2im_channel(
        dcols: &[f32],
        g: &ConvGeometry,
        n: usize,
        c: usize,
        part: &mut [f32],
        accumulate: bool,
    ) {
        let (k, s, pad) = (g.kernel, g.stride, g.pad);
        let (ih, iw, oh, ow) = (g.in_h, g.in_w, g.out_h, g.out_w);
        let image = ih * iw;
        if !accumulate {
            part.fill(0.0);
        }
        for (i, j) in (0..k).flat_map(|i| (0..k).map(move |j| (i, j))) {
            let row = &dcols[((c * k + i) * k + j) * n..][..n];
            let x0 = (pad.saturating_sub(j)).div_ceil(s);
            let x1 = ((iw + pad - j).div_ceil(s)).min(ow);
            if x0 >= x1 {
                continue;
            }
            for (b, patch) in row.chunks_exact(oh * ow).enumerate() {
                let image = &mut part[b * image..][..image];
                for (y, line) in patch.chunks_exact(ow).enumerate() {
                    let iy = y * s + i;
                    if iy < pad || iy - pad >= ih {
                        continue;
                    }
                    let dst = &mut image[(iy - pad) * iw..][..iw];
                    if s == 1 {
                        let from = x0 + j - pad;
                        dst[from..from + x1 - x0]
                            .iter_mut()
                            .zip(&line[x0..x1])
                            .for_each(|(d, &v)| *d += v);
                    } else {
                        for (x, &v) in line[x0..x1].iter().enumerate() {
                            dst[(x0 + x) * s + j - pad] += v;
                        }
                    }
                }
            }
        }
    }
}

/// Z (C_out × B·H_o·W_o) = W·im2col(a), a chunk of images at a time (see [`CHUNK_BYTES`]).
pub fn conv_forward(
    a: &[f32],
    g: &ConvGeometry,
    rows: usize,
    w: &[f32],
    cols: &mut [f32],
    z: &mut [f32],
) {
    let plane = g.out_plane();
    let n = rows * plane;
    let k = g.patch();
    let z = &mut z[..g.out_channels * n];
    for images in chunks(g, rows) {
        let (at, width) = (images.start * plane, images.len() * plane);
        im2col(a, g, rows, images, cols);
        product(
            g.out_channels,
            width,
            k,
            &mut z[at..],
            Mat::rows(w, k),
            Mat::rows(&cols[..k * width], width),
            Options {
                dst_stride: Some(n),
                ..Options::default()
            },
        );
    }
}

/// Adds `b[c]` to every element of channel c (`channel` elements each: B planes).
pub fn add_bias(z: &mut [f32], bias: &[f32], channel: usize) {
    let work = z.len();
    pool::halves(z, channel, work, |part, at| {
        for (q, zc) in part.chunks_exact_mut(channel).enumerate() {
            let b = bias[at / channel + q];
            zc.iter_mut().for_each(|v| *v += b);
        }
    });
}

/// FRN and TLU on every (channel, example) plane of `z` (C × B planes of `plane`
/// elements): r = 1/√(mean z² + ε) into `r`, u = τ + relu(γ·z·r + β − τ) into `u`.
#[allow(clippy::too_many_arguments)]
pub fn frn_forward(
    z: &[f32],
    rows: usize,
    plane: usize,
    gamma: &[f32],
    beta: &[f32],
    tau: &[f32],
    r: &mut [f32],
    u: &mut [f32],
) {
    let planes = gamma.len() * rows;
    let (rp, up) = (Disjoint::new(r), Disjoint::new(u));
    split_planes(planes, planes * plane, &|range| {
        for q in range {
            let c = q / rows;
            let zp = &z[q * plane..][..plane];
            // SAFETY: plane q's entries of r and u belong to this part alone.
            let (r, u) = unsafe { (rp.slice(q, q + 1), up.slice(q * plane, (q + 1) * plane)) };
            frn_forward_plane(zp, gamma[c], beta[c], tau[c], &mut r[0], u);
        }
    });
}

multiversion! {
    /// [`frn_forward`] on one plane `zp`: r into `r`, u into `u`.
    fn frn_forward_plane(zp: &[f32], gamma: f32, beta: f32, tau: f32, r: &mut f32, u: &mut [f32]) {
        let plane = zp.len();
        let mut acc = [0f32; LANES];
        let whole = plane / LANES * LANES;
        for c8 in zp[..whole].chunks_exact(LANES) {
            for i in 0..LANES {
                acc[i] += c8[i] * c8[i];
            }
        }
        let tail: f32 = zp[whole..].iter().map(|&v| v * v).sum();
        let mean_square = (acc.iter().sum::<f32>() + tail) / plane as f32;
        let rq = 1.0 / (mean_square + FRN_EPSILON).sqrt();
        *r = rq;
        let gr = gamma * rq;
        for (u, &v) in u.iter_mut().zip(zp) {
            *u = tau + (gr * v + beta - tau).max(0.0);
        }
    }
}

/// ∂u → ∂z in place on every plane of `grad` (FRN and TLU's backward), with each plane's
/// sums ∂γ = Σ ∂y·x̂, ∂β = Σ ∂y, ∂τ = Σ ∂u·`[y < τ]` into `sums`.
#[allow(clippy::too_many_arguments)]
pub fn frn_backward(
    z: &[f32],
    r: &[f32],
    rows: usize,
    plane: usize,
    gamma: &[f32],
    beta: &[f32],
    tau: &[f32],
    grad: &mut [f32],
    sums: &mut [[f64; 3]],
) {
    let planes = gamma.len() * rows;
    let (gp, sp) = (Disjoint::new(grad), Disjoint::new(sums));
    split_planes(planes, planes * plane, &|range| {
        for q in range {
            let c = q / rows;
            let zp = &z[q * plane..][..plane];
            // SAFETY: plane q's gradients and sums belong to this part alone.
            let (g, s) = unsafe { (gp.slice(q * plane, (q + 1) * plane), sp.slice(q, q + 1)) };
            s[0] = frn_backward_plane(zp, r[q], gamma[c], beta[c], tau[c], g);
        }
    });
}

multiversion! {
    /// [`frn_backward`] on one plane: ∂u → ∂z in `g` in place; returns (∂γ, ∂β, ∂τ).
    fn frn_backward_plane(
        zp: &[f32],
        rq: f32,
        gm: f32,
        bt: f32,
        t: f32,
        g: &mut [f32],
    ) -> [f64; 3] {
        let plane = zp.len();
        let gr = gm * rq;
        // Lane-wise partial sums (∂γ, ∂β, ∂τ, ∂x̂·x̂) so that the loop vectorises; a
        // select rather than a branch for TLU's mask.
        let mut acc = [[0f32; LANES]; 4];
        let mut lane = |i: usize, g: &mut f32, v: f32| {
            let xhat = v * rq;
            // The forward's comparison, to the bit.
            let gy = if gr * v + bt - t >= 0.0 { *g } else { 0.0 };
            acc[2][i] += *g - gy;
            acc[0][i] += gy * xhat;
            acc[1][i] += gy;
            *g = gm * gy;
            acc[3][i] += *g * xhat;
        };
        let whole = plane / LANES * LANES;
        let (body, tail) = g.split_at_mut(whole);
        for (gc, zc) in body.chunks_exact_mut(LANES).zip(zp.chunks_exact(LANES)) {
            for i in 0..LANES {
                lane(i, &mut gc[i], zc[i]);
            }
        }
        for (g, &v) in tail.iter_mut().zip(&zp[whole..]) {
            lane(0, g, v);
        }
        let [dgamma, dbeta, dtau, dot] = acc.map(|a| a.iter().sum::<f32>());
        let mean = dot / plane as f32;
        for (g, &v) in g.iter_mut().zip(zp) {
            *g = rq * (*g - v * rq * mean);
        }
        [dgamma as f64, dbeta as f64, dtau as f64]
    }
}

/// out = act(pre); for swish, pre is overwritten with σ(pre), which is what the
/// backward needs with out (swish′ = σ·(1 − out) + out): no exp in the backward.
pub fn activate(pre: &mut [f32], out: &mut [f32], act: impl Into<Activation>) {
    let act = act.into();
    let work = out.len();
    let (pp, op) = (Disjoint::new(pre), Disjoint::new(out));
    let cut = (work.div_ceil(2)).div_ceil(16) * 16;
    let body = |range: std::ops::Range<usize>| {
        // SAFETY: each part gets its own range of both buffers.
        let (pre, out) = unsafe {
            (
                pp.slice(range.start, range.end),
                op.slice(range.start, range.end),
            )
        };
        match act {
            Activation::Relu => out
                .iter_mut()
                .zip(pre)
                .for_each(|(o, &mut v)| *o = v.max(0.0)),
            Activation::Swish => elementwise::swish(pre, out),
            Activation::Sigmoid => out
                .iter_mut()
                .zip(pre)
                .for_each(|(o, &mut v)| *o = 1.0 / (1.0 + (-v).exp())),
            Activation::Tanh => out
                .iter_mut()
                .zip(pre)
                .for_each(|(o, &mut v)| *o = v.tanh()),
        }
    };
    if work < pool::PARALLEL_MIN_ELEMENTS || pool::threads() < 2 {
        body(0..work);
    } else {
        pool::run(2, &|p| {
            body(if p == 0 {
                0..cut.min(work)
            } else {
                cut.min(work)..work
            })
        });
    }
}

/// grad ⊙= act′ at the site: relu′ = [pre ≥ 0] (as candle's); swish′ = σ·(1 − out) + out
/// with σ where [`activate`] left it (in `pre`), as candle's; sigmoid′ = out·(1 − out);
/// tanh′ = 1 − out².
pub fn activation_backward(grad: &mut [f32], pre: &[f32], out: &[f32], act: impl Into<Activation>) {
    let act = act.into();
    let work = grad.len();
    pool::halves(grad, 1 << 12, work, |part, at| {
        let pre = &pre[at..at + part.len()];
        let out = &out[at..at + part.len()];
        activation_backward_part(part, pre, out, act)
    });
}

multiversion! {
    /// [`activation_backward`] on one part.
    fn activation_backward_part(part: &mut [f32], pre: &[f32], out: &[f32], act: Activation) {
        match act {
            Activation::Relu => part
                .iter_mut()
                .zip(pre)
                .for_each(|(g, &v)| *g = if v >= 0.0 { *g } else { 0.0 }),
            Activation::Swish => part
                .iter_mut()
                .zip(pre.iter().zip(out))
                .for_each(|(g, (&s, &o))| *g *= s * (1.0 - o) + o),
            Activation::Sigmoid => part
                .iter_mut()
                .zip(out)
                .for_each(|(g, &o)| *g *= o * (1.0 - o)),
            Activation::Tanh => part.iter_mut().zip(out).for_each(|(g, &o)| *g *= 1.0 - o * o),
        }
    }
}

/// Per channel of `grad` (C × B planes): Σ over its planes, into `sums[q][0]` per plane.
pub fn plane_sums(grad: &[f32], plane: usize, sums: &mut [[f64; 3]]) {
    for (s, g) in sums.iter_mut().zip(grad.chunks_exact(plane)) {
        *s = [g.iter().sum::<f32>() as f64, 0.0, 0.0];
    }
}

/// dst += src.
pub fn add_into(dst: &mut [f32], src: &[f32]) {
    let work = dst.len();
    pool::halves(dst, 1 << 12, work, |part, at| {
        add_part(part, &src[at..at + part.len()])
    });
}

multiversion! {
    /// dst += src on one part.
    fn add_part(dst: &mut [f32], src: &[f32]) {
        dst.iter_mut().zip(src).for_each(|(d, &s)| *d += s)
    }
}
