//! What every user of the optimizers needs from a `candle_nn::VarMap`: its vars in a
//! fixed order (a `VarMap`'s own `all_vars` order is a `HashMap`'s, different from run to
//! run, and the order keys each parameter's noise stream) and a seeded initialisation
//! (candle_nn draws initial weights from an unseeded generator, so no two runs agree).

use candle_core::{Tensor, Var};
use candle_nn::VarMap;
use rand::{Rng, SeedableRng};

/// A `VarMap`'s lock, or candle's error for a poisoned one.
fn locked(
    varmap: &VarMap,
) -> candle_core::Result<std::sync::MutexGuard<'_, std::collections::HashMap<String, Var>>> {
    varmap
        .data()
        .lock()
        .map_err(|_| candle_core::Error::Msg("the VarMap's lock is poisoned".into()))
}

/// The vars of `varmap` sorted by name: the same order on every run.
pub fn vars_by_name(varmap: &VarMap) -> candle_core::Result<Vec<Var>> {
    let map = locked(varmap)?;
    let mut named: Vec<(&String, &Var)> = map.iter().collect();
    named.sort_by(|a, b| a.0.cmp(b.0));
    Ok(named.into_iter().map(|(_, v)| v.clone()).collect())
}

/// The fan-in of var `name` of shape `dims`: the product of all but the first dimension
/// (a linear weight's inputs, a convolution's in-channels × kernel), and for a 1-D var
/// (a bias) its sibling weight's (`x.bias` → `x.weight`) or, without one, its length.
fn fan_in(name: &str, dims: &[usize], shapes: &[(String, Vec<usize>)]) -> usize {
    if dims.len() >= 2 {
        return dims[1..].iter().product();
    }
    let sibling = name
        .strip_suffix("bias")
        .map(|stem| format!("{stem}weight"));
    sibling
        .and_then(|w| shapes.iter().find(|(n, _)| *n == w))
        .filter(|(_, d)| d.len() >= 2)
        .map_or(dims.iter().product(), |(_, d)| d[1..].iter().product())
}

/// Sets every var of `varmap` to U(−1/√fan_in, 1/√fan_in) draws from a generator seeded
/// by `seed`, var after var in name order, so that a model of `candle_nn` layers (linear,
/// conv1d/2d, embeddings) starts from the same weights on every run. The bound is the one
/// candle_nn's `linear` and `conv2d` use for their biases (LeCun-uniform scale).
pub fn init_seeded(varmap: &VarMap, seed: u64) -> candle_core::Result<()> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let shapes: Vec<(String, Vec<usize>)> = {
        let map = locked(varmap)?;
        let mut s: Vec<_> = map
            .iter()
            .map(|(n, v)| (n.clone(), v.dims().to_vec()))
            .collect();
        s.sort();
        s
    };
    for (name, dims) in &shapes {
        let bound = 1.0 / (fan_in(name, dims, &shapes).max(1) as f32).sqrt();
        let n: usize = dims.iter().product();
        let values: Vec<f32> = (0..n).map(|_| rng.random_range(-bound..bound)).collect();
        let var = locked(varmap)?[name].clone();
        let t = Tensor::from_vec(values, dims.as_slice(), var.device())?;
        var.set(&t.to_dtype(var.dtype())?)?;
    }
    Ok(())
}
