//! Each sampler's state between two updates, as a type of its own: what
//! [`Sampler::state`](super::Sampler::state) gives and
//! [`Sampler::restore`](super::Sampler::restore) takes back, bit for bit.
//!
//! The dynamics differ in their auxiliary variables, so the states do (in the v-form of
//! the module [`super`]): SGLD has none besides θ; SGHMC adds the momentum v = p·h (Chen
//! et al. 2014 eq. 15); SGNHT adds v and one thermostat α = ξ·h (Ding et al. 2014
//! Alg. 2); mSGNHT adds v and one thermostat αᵢ per element (Li et al. 2016 eq. 2);
//! pSGLD adds one second moment Vᵢ per element (Li, Chen, Carlson & Carin 2016). SGD
//! keeps SGLD's state and SGD with momentum SGHMC's. A state of one family restored into a
//! sampler of another is refused.
//!
//! Tensors are flat (one per parameter tensor, in parameter order) and on the host. A state
//! is saved as safetensors: [`SamplerState::tensors`] names them (`momentum/i`,
//! `thermostat/i`, `second_moment/i`) and [`StateScalars`] (serde) holds the rest; [`SamplerState::save`] and
//! [`SamplerState::load`] put both in one file.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{DType, Device, Tensor};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Where a chain is: updates done (the step counter of the noise stream) and η in use (a
/// schedule changes it; momenta are scaled with it).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Clock {
    /// Updates done.
    pub step: u64,
    /// η = h².
    pub step_size: f64,
}

/// SGHMC's (and SGD with momentum's) state: the momentum v = p·h.
#[derive(Debug, Clone)]
pub struct SghmcState {
    /// Updates done and η.
    pub clock: Clock,
    /// v per parameter tensor.
    pub momentum: Vec<Tensor>,
    /// ½·vᵀv/(n·η) as last reported (0 for SGD with momentum).
    pub kinetic: f64,
}

/// SGNHT's state: the momentum and the scalar thermostat α = ξ·h.
#[derive(Debug, Clone)]
pub struct SgnhtState {
    /// Updates done and η.
    pub clock: Clock,
    /// v per parameter tensor.
    pub momentum: Vec<Tensor>,
    /// α = ξ·h, shared by every element.
    pub thermostat: f64,
    /// ½·vᵀv/(n·η) as last reported.
    pub kinetic: f64,
}

/// mSGNHT's state: the momentum and one thermostat αᵢ per element.
#[derive(Debug, Clone)]
pub struct MsgnhtState {
    /// Updates done and η.
    pub clock: Clock,
    /// v per parameter tensor.
    pub momentum: Vec<Tensor>,
    /// αᵢ per parameter tensor, shaped like v.
    pub thermostats: Vec<Tensor>,
    /// The mean of the αᵢ as last reported (diagnostics only; the update uses the αᵢ).
    pub mean_thermostat: f64,
    /// ½·vᵀv/(n·η) as last reported.
    pub kinetic: f64,
}

/// pSGLD's state: the second moment V of the gradient per element, RMSprop's average.
#[derive(Debug, Clone)]
pub struct PsgldState {
    /// Updates done and η.
    pub clock: Clock,
    /// V per parameter tensor, shaped like θ.
    pub second_moment: Vec<Tensor>,
}

/// A sampler's state, one variant per family of dynamics.
#[derive(Debug, Clone)]
pub enum SamplerState {
    /// SGLD and SGD: nothing besides θ.
    Sgld(Clock),
    /// SGHMC and SGD with momentum.
    Sghmc(SghmcState),
    /// SGNHT.
    Sgnht(SgnhtState),
    /// mSGNHT.
    Msgnht(MsgnhtState),
    /// pSGLD.
    Psgld(PsgldState),
}

/// The scalars of a state and how many tensors of each kind go beside them (serde: the
/// JSON part of a saved state).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StateScalars {
    /// Updates done.
    pub step: u64,
    /// η.
    pub step_size: f64,
    /// SGNHT's α, or mSGNHT's mean αᵢ; none for the others.
    pub thermostat: Option<f64>,
    /// The kinetic energy per parameter last reported (0 without momentum).
    pub kinetic: f64,
    /// Tensors `momentum/0…`.
    pub momentum_tensors: usize,
    /// Tensors `thermostat/0…` (mSGNHT).
    pub thermostat_tensors: usize,
    /// Tensors `second_moment/0…` (pSGLD).
    #[serde(default)]
    pub second_moment_tensors: usize,
}

impl SamplerState {
    /// The family's name, for messages.
    pub fn family(&self) -> &'static str {
        match self {
            SamplerState::Sgld(_) => "SGLD/SGD",
            SamplerState::Sghmc(_) => "SGHMC/momentum",
            SamplerState::Sgnht(_) => "SGNHT",
            SamplerState::Msgnht(_) => "mSGNHT",
            SamplerState::Psgld(_) => "pSGLD",
        }
    }

    /// Updates done and η.
    pub fn clock(&self) -> Clock {
        match self {
            SamplerState::Sgld(c) => *c,
            SamplerState::Sghmc(s) => s.clock,
            SamplerState::Sgnht(s) => s.clock,
            SamplerState::Msgnht(s) => s.clock,
            SamplerState::Psgld(s) => s.clock,
        }
    }

    /// v per parameter tensor; empty without momentum.
    pub fn momentum(&self) -> &[Tensor] {
        match self {
            SamplerState::Sgld(_) | SamplerState::Psgld(_) => &[],
            SamplerState::Sghmc(s) => &s.momentum,
            SamplerState::Sgnht(s) => &s.momentum,
            SamplerState::Msgnht(s) => &s.momentum,
        }
    }

    /// mSGNHT's αᵢ per parameter tensor; empty for the others.
    pub fn thermostats(&self) -> &[Tensor] {
        match self {
            SamplerState::Msgnht(s) => &s.thermostats,
            _ => &[],
        }
    }

    /// SGNHT's α or mSGNHT's mean αᵢ.
    pub fn thermostat(&self) -> Option<f64> {
        match self {
            SamplerState::Sgnht(s) => Some(s.thermostat),
            SamplerState::Msgnht(s) => Some(s.mean_thermostat),
            _ => None,
        }
    }

    /// pSGLD's V per parameter tensor; empty for the others.
    pub fn second_moments(&self) -> &[Tensor] {
        match self {
            SamplerState::Psgld(s) => &s.second_moment,
            _ => &[],
        }
    }

    /// The kinetic energy per parameter last reported (0 without momentum).
    pub fn kinetic(&self) -> f64 {
        match self {
            SamplerState::Sgld(_) | SamplerState::Psgld(_) => 0.0,
            SamplerState::Sghmc(s) => s.kinetic,
            SamplerState::Sgnht(s) => s.kinetic,
            SamplerState::Msgnht(s) => s.kinetic,
        }
    }

    /// The scalars, for the JSON part of a saved state.
    pub fn scalars(&self) -> StateScalars {
        let clock = self.clock();
        StateScalars {
            step: clock.step,
            step_size: clock.step_size,
            thermostat: self.thermostat(),
            kinetic: self.kinetic(),
            momentum_tensors: self.momentum().len(),
            thermostat_tensors: self.thermostats().len(),
            second_moment_tensors: self.second_moments().len(),
        }
    }

    /// The tensors by the names a saved state gives them.
    pub fn tensors(&self) -> Vec<(String, Tensor)> {
        let named = |what: &str, ts: &[Tensor]| {
            ts.iter()
                .enumerate()
                .map(|(i, t)| (format!("{what}/{i}"), t.clone()))
                .collect::<Vec<_>>()
        };
        let mut all = named("momentum", self.momentum());
        all.extend(named("thermostat", self.thermostats()));
        all.extend(named("second_moment", self.second_moments()));
        all
    }

    /// The state of `scalars`, its tensors looked up by name; the family follows from what
    /// is there (thermostat tensors: mSGNHT; a scalar thermostat: SGNHT; momenta: SGHMC;
    /// second moments alone: pSGLD).
    pub fn from_parts(
        scalars: &StateScalars,
        mut tensor: impl FnMut(&str) -> Result<Tensor>,
    ) -> Result<Self> {
        let mut list = |what: &str, n: usize| -> Result<Vec<Tensor>> {
            (0..n).map(|i| tensor(&format!("{what}/{i}"))).collect()
        };
        let momentum = list("momentum", scalars.momentum_tensors)?;
        let thermostats = list("thermostat", scalars.thermostat_tensors)?;
        let second_moment = list("second_moment", scalars.second_moment_tensors)?;
        let clock = Clock {
            step: scalars.step,
            step_size: scalars.step_size,
        };
        if !second_moment.is_empty() {
            if !(momentum.is_empty() && thermostats.is_empty()) {
                return Err(Error::Checkpoint(
                    "a saved state has second moments beside a momentum or thermostats".into(),
                ));
            }
            return Ok(SamplerState::Psgld(PsgldState {
                clock,
                second_moment,
            }));
        }
        let kinetic = scalars.kinetic;
        Ok(match (momentum.is_empty(), thermostats.is_empty()) {
            (true, true) => SamplerState::Sgld(clock),
            (true, false) => {
                return Err(Error::Checkpoint(
                    "a saved state has thermostats but no momentum".into(),
                ))
            }
            (false, false) => {
                let mean_thermostat = match scalars.thermostat {
                    Some(mean) => mean,
                    None => mean_of(&thermostats)?,
                };
                SamplerState::Msgnht(MsgnhtState {
                    clock,
                    momentum,
                    thermostats,
                    mean_thermostat,
                    kinetic,
                })
            }
            (false, true) => match scalars.thermostat {
                Some(thermostat) => SamplerState::Sgnht(SgnhtState {
                    clock,
                    momentum,
                    thermostat,
                    kinetic,
                }),
                None => SamplerState::Sghmc(SghmcState {
                    clock,
                    momentum,
                    kinetic,
                }),
            },
        })
    }

    /// Its tensors and its scalars as F64/I64 tensors (`scalar/…`), by the names a saved
    /// state gives them, so that any safetensors reader sees them and they come back bit
    /// for bit.
    pub fn named_tensors(&self) -> Result<HashMap<String, Tensor>> {
        let s = self.scalars();
        let f64s = |v: f64| Tensor::new(&[v], &Device::Cpu);
        let mut map: HashMap<String, Tensor> = self.tensors().into_iter().collect();
        let mut counts = vec![
            s.step as i64,
            s.momentum_tensors as i64,
            s.thermostat_tensors as i64,
        ];
        // A fourth count only where there are second moments: the other states' files stay
        // as they were.
        if s.second_moment_tensors > 0 {
            counts.push(s.second_moment_tensors as i64);
        }
        map.insert("scalar/counts".into(), Tensor::new(counts, &Device::Cpu)?);
        map.insert("scalar/step_size".into(), f64s(s.step_size)?);
        map.insert("scalar/kinetic".into(), f64s(s.kinetic)?);
        if let Some(a) = s.thermostat {
            map.insert("scalar/thermostat".into(), f64s(a)?);
        }
        Ok(map)
    }

    /// Writes the state to a safetensors file ([`SamplerState::named_tensors`]).
    pub fn save(&self, path: &Path) -> Result<()> {
        candle_core::safetensors::save(&self.named_tensors()?, path)?;
        Ok(())
    }

    /// Reads a state written by [`SamplerState::save`].
    pub fn load(path: &Path) -> Result<Self> {
        SamplerState::from_file(&SavedFile::read(path, "a sampler state")?)
    }

    /// The state in a file's `scalar/…`, `momentum/i`, `thermostat/i` and
    /// `second_moment/i` tensors.
    pub(crate) fn from_file(file: &SavedFile) -> Result<Self> {
        let scalars = StateScalars::from_file(file)?;
        SamplerState::from_parts(&scalars, |name| file.get(name))
    }

    /// The error for restoring this state into a sampler of the family `want`.
    pub(crate) fn refuse(&self, want: &str) -> Error {
        Error::Checkpoint(format!(
            "a saved {} state cannot be restored into a {want} sampler",
            self.family()
        ))
    }
}

/// The mean of every element of `tensors`, summed in f64.
pub(crate) fn mean_of(tensors: &[Tensor]) -> Result<f64> {
    let (mut sum, mut n) = (0f64, 0usize);
    for t in tensors {
        for a in t.flatten_all()?.to_vec1::<f32>()? {
            sum += a as f64;
            n += 1;
        }
    }
    Ok(sum / n.max(1) as f64)
}

/// A saved state's safetensors file, read on the host: its tensors by name, and errors
/// that name the file.
pub(crate) struct SavedFile {
    path: std::path::PathBuf,
    map: HashMap<String, Tensor>,
}

impl SavedFile {
    /// Reads `path`, a file of `what` ("a sampler state").
    pub(crate) fn read(path: &Path, what: &str) -> Result<Self> {
        let map = candle_core::safetensors::load(path, &Device::Cpu).map_err(|e| {
            Error::Checkpoint(format!("{}: cannot read {what} ({e})", path.display()))
        })?;
        Ok(SavedFile {
            path: path.to_path_buf(),
            map,
        })
    }

    /// The error `message` about this file.
    pub(crate) fn error(&self, message: String) -> Error {
        Error::Checkpoint(format!("{}: {message}", self.path.display()))
    }

    /// The tensor `name`.
    pub(crate) fn get(&self, name: &str) -> Result<Tensor> {
        self.map
            .get(name)
            .cloned()
            .ok_or_else(|| self.error(format!("no tensor `{name}`")))
    }

    /// How many tensors are named `prefix/0`, `prefix/1`, ….
    pub(crate) fn count(&self, prefix: &str) -> usize {
        (0..)
            .take_while(|i| self.map.contains_key(&format!("{prefix}/{i}")))
            .count()
    }

    /// The first value of tensor `name` in f64.
    pub(crate) fn scalar(&self, name: &str) -> Result<f64> {
        let v = self.get(name)?.to_dtype(DType::F64)?.to_vec1::<f64>()?;
        v.first()
            .copied()
            .ok_or_else(|| self.error(format!("`{name}` is empty")))
    }
}

impl StateScalars {
    /// The scalars of a saved state from its `scalar/…` tensors.
    fn from_file(file: &SavedFile) -> Result<Self> {
        let counts = file.get("scalar/counts")?.to_vec1::<i64>()?;
        let count = |i: usize| -> Result<u64> {
            counts
                .get(i)
                .and_then(|&c| u64::try_from(c).ok())
                .ok_or_else(|| file.error("`scalar/counts` is not three or four counts".into()))
        };
        Ok(StateScalars {
            step: count(0)?,
            step_size: file.scalar("scalar/step_size")?,
            thermostat: match file.get("scalar/thermostat") {
                Ok(_) => Some(file.scalar("scalar/thermostat")?),
                Err(_) => None,
            },
            kinetic: file.scalar("scalar/kinetic")?,
            momentum_tensors: count(1)? as usize,
            thermostat_tensors: count(2)? as usize,
            second_moment_tensors: match counts.len() {
                3 => 0,
                _ => count(3)? as usize,
            },
        })
    }
}
