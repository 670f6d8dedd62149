//! Network architectures, built from a [`ModelSpec`] (TOML presets in `models/`).
//!
//! Parameters are candle [`Var`]s with stable names (`fc1.weight`, `fc1.bias`, ...) kept in
//! a fixed order, so that a parameter's index (used to key its noise stream) and its name
//! in a checkpoint never change between runs.

use candle_core::{DType, Device, Tensor, Var};
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Non-linearity between layers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Activation {
    Relu,
    Sigmoid,
}

/// Architecture family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ModelKind {
    Mlp,
}

/// An architecture: what a preset file in `models/` describes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSpec {
    pub kind: ModelKind,
    /// Widths of the hidden layers, input to output.
    pub hidden: Vec<usize>,
    pub activation: Activation,
}

impl Default for ModelSpec {
    fn default() -> Self {
        ModelSpec {
            kind: ModelKind::Mlp,
            hidden: vec![100],
            activation: Activation::Relu,
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PresetFile {
    model: ModelSpec,
}

impl ModelSpec {
    /// Reads a preset (`[model]` table with `kind`, `hidden`, `activation`).
    pub fn from_toml_file(path: &std::path::Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        let preset: PresetFile = toml::from_str(&text).map_err(|e| {
            Error::Config(format!(
                "{}: not a model preset: {}",
                path.display(),
                e.message()
            ))
        })?;
        preset.model.validate()?;
        Ok(preset.model)
    }

    pub fn validate(&self) -> Result<()> {
        if self.hidden.contains(&0) {
            return Err(Error::Config(format!(
                "hidden widths must be positive, got {:?}",
                self.hidden
            )));
        }
        Ok(())
    }

    /// A short name such as `mlp-400-400-relu`.
    pub fn label(&self) -> String {
        let widths: Vec<String> = self.hidden.iter().map(|w| w.to_string()).collect();
        let act = match self.activation {
            Activation::Relu => "relu",
            Activation::Sigmoid => "sigmoid",
        };
        if widths.is_empty() {
            format!("mlp-{act}")
        } else {
            format!("mlp-{}-{act}", widths.join("-"))
        }
    }
}

/// A named parameter tensor.
#[derive(Debug, Clone)]
pub struct Param {
    pub name: String,
    pub var: Var,
}

/// Multi-layer perceptron: `Linear → act → ... → Linear` to class logits.
#[derive(Debug, Clone)]
pub struct Mlp {
    pub spec: ModelSpec,
    pub input_dim: usize,
    pub num_classes: usize,
    /// `fc{k}.weight` (out × in) and `fc{k}.bias` (out), layer by layer.
    pub params: Vec<Param>,
}

impl Mlp {
    /// A network with PyTorch's default initialisation, U(−1/√fan_in, 1/√fan_in), from `seed`.
    pub fn new(
        spec: &ModelSpec,
        input_dim: usize,
        num_classes: usize,
        seed: u64,
        device: &Device,
    ) -> Result<Self> {
        spec.validate()?;
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut widths = vec![input_dim];
        widths.extend(&spec.hidden);
        widths.push(num_classes);
        let mut params = Vec::new();
        for (k, pair) in widths.windows(2).enumerate() {
            let (fan_in, fan_out) = (pair[0], pair[1]);
            let bound = 1.0 / (fan_in as f32).sqrt();
            let mut draw = |n: usize| -> Vec<f32> {
                (0..n).map(|_| rng.random_range(-bound..bound)).collect()
            };
            let w = Tensor::from_vec(draw(fan_in * fan_out), (fan_out, fan_in), device)?;
            let b = Tensor::from_vec(draw(fan_out), fan_out, device)?;
            params.push(Param {
                name: format!("fc{}.weight", k + 1),
                var: Var::from_tensor(&w)?,
            });
            params.push(Param {
                name: format!("fc{}.bias", k + 1),
                var: Var::from_tensor(&b)?,
            });
        }
        Ok(Mlp {
            spec: spec.clone(),
            input_dim,
            num_classes,
            params,
        })
    }

    /// Class logits for a batch `x` of shape (batch, input_dim).
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let layers = self.params.len() / 2;
        let mut h = x.clone();
        for k in 0..layers {
            let w = self.params[2 * k].var.as_tensor();
            let b = self.params[2 * k + 1].var.as_tensor();
            h = h.matmul(&w.t()?)?.broadcast_add(b)?;
            if k + 1 < layers {
                h = match self.spec.activation {
                    Activation::Relu => h.relu()?,
                    Activation::Sigmoid => candle_nn::ops::sigmoid(&h)?,
                };
            }
        }
        Ok(h)
    }

    pub fn vars(&self) -> Vec<Var> {
        self.params.iter().map(|p| p.var.clone()).collect()
    }

    /// Total number of scalar parameters.
    pub fn num_params(&self) -> usize {
        self.params.iter().map(|p| p.var.elem_count()).sum()
    }

    /// Whether every parameter is finite (a diverged sampler makes them inf or NaN).
    pub fn all_finite(&self) -> Result<bool> {
        for p in &self.params {
            let s = p
                .var
                .as_detached_tensor()
                .abs()?
                .sum_all()?
                .to_scalar::<f32>()?;
            if !s.is_finite() {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Overwrites the parameters with `tensors` (by name), checking every name and shape.
    pub fn load(&self, tensors: &std::collections::HashMap<String, Tensor>) -> Result<()> {
        for p in &self.params {
            let t = tensors.get(&p.name).ok_or_else(|| {
                Error::Checkpoint(format!("checkpoint lacks parameter `{}`", p.name))
            })?;
            if t.dims() != p.var.dims() {
                return Err(Error::Checkpoint(format!(
                    "parameter `{}` has shape {:?} in the checkpoint but {:?} in the model",
                    p.name,
                    t.dims(),
                    p.var.dims()
                )));
            }
            p.var
                .set(&t.to_dtype(DType::F32)?.to_device(p.var.device())?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_names_and_forward() {
        let spec = ModelSpec {
            kind: ModelKind::Mlp,
            hidden: vec![5, 4],
            activation: Activation::Sigmoid,
        };
        let m = Mlp::new(&spec, 6, 3, 1, &Device::Cpu).unwrap();
        let names: Vec<_> = m.params.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "fc1.weight",
                "fc1.bias",
                "fc2.weight",
                "fc2.bias",
                "fc3.weight",
                "fc3.bias"
            ]
        );
        assert_eq!(m.num_params(), 6 * 5 + 5 + 5 * 4 + 4 + 4 * 3 + 3);
        let x = Tensor::ones((2, 6), DType::F32, &Device::Cpu).unwrap();
        assert_eq!(m.forward(&x).unwrap().dims(), &[2, 3]);
        assert_eq!(spec.label(), "mlp-5-4-sigmoid");
    }

    #[test]
    fn preset_parsing_rejects_unknown_keys() {
        let dir = tempfile::tempdir().unwrap();
        let good = dir.path().join("a.toml");
        std::fs::write(
            &good,
            "[model]\nkind = \"mlp\"\nhidden = [400, 400]\nactivation = \"relu\"\n",
        )
        .unwrap();
        assert_eq!(
            ModelSpec::from_toml_file(&good).unwrap().hidden,
            vec![400, 400]
        );
        let bad = dir.path().join("b.toml");
        std::fs::write(
            &bad,
            "[model]\nkind = \"mlp\"\nhiden = [4]\nactivation = \"relu\"\n",
        )
        .unwrap();
        let e = ModelSpec::from_toml_file(&bad).unwrap_err().to_string();
        assert!(e.contains("not a model preset"), "{e}");
    }
}
