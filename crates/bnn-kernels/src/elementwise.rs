//! Per-element passes of the hand-written network passes that need a transcendental:
//! swish's σ(x) = 1/(1 + e^{−x}) with [`exp_f32`] (libm's `expf` is one call per
//! element, 7% of a ResNet-20 step), compiled for each kernel path so that the loop is 8
//! or 16 lanes wide. The same f32 operations on every path, so the same bits.

use super::cpu::exp_f32;
use super::isa::multiversion;
#[cfg(test)]
use super::isa::{self, Isa};

multiversion! {
    /// out\[i\] = x·σ(x) and pre\[i\] ← σ(x) for x = pre\[i\] (the backward reads σ back from
    /// `pre`).
    pub fn swish(pre: &mut [f32], out: &mut [f32]) {
        assert_eq!(pre.len(), out.len(), "swish: buffers of different lengths");
        for (o, v) in out.iter_mut().zip(pre.iter_mut()) {
            let s = 1.0 / (1.0 + exp_f32(-*v));
            *o = *v * s;
            *v = s;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn swish_is_the_same_on_every_path_and_close_to_libm() {
        // x from −100 to 100 (past both clamps of exp_f32) in steps that hit no grid.
        let xs: Vec<f32> = (0..20_011).map(|i| -100.0 + i as f32 * 0.009_995).collect();
        let mut first: Option<(Vec<f32>, Vec<f32>)> = None;
        for path in Isa::available() {
            let (mut pre, mut out) = (xs.clone(), vec![0f32; xs.len()]);
            isa::with(path, || swish(&mut pre, &mut out));
            for ((&x, &o), &s) in xs.iter().zip(&out).zip(&pre) {
                if x.abs() > 80.0 {
                    // Clamped: σ is 1 to the bit above, a negligible number below.
                    assert!(
                        if x > 0.0 { o == x } else { o.abs() < 1e-30 },
                        "swish({x}) = {o}"
                    );
                    continue;
                }
                let want = 1.0 / (1.0 + (-(x as f64)).exp());
                // exp_f32 is within 2 ulp; 1/(1 + e) and x·σ add two roundings.
                assert!(
                    (s as f64 - want).abs() <= 4.0 * f32::EPSILON as f64 * want,
                    "σ({x})"
                );
                let o_want = x as f64 * want;
                assert!(
                    (o as f64 - o_want).abs() <= 5.0 * f32::EPSILON as f64 * o_want.abs(),
                    "swish({x}) = {o}, want {o_want}"
                );
            }
            match &first {
                None => first = Some((pre, out)),
                Some((p0, o0)) => {
                    let same = |a: &[f32], b: &[f32]| {
                        a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
                    };
                    assert!(same(p0, &pre) && same(o0, &out), "{path} differs");
                }
            }
        }
    }
}
