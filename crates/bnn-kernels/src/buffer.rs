//! A sampler state buffer (the momentum of one parameter tensor) on the device that holds
//! the parameters. Plain data owned by the sampler; lent to the fused op for one call.

use candle_core::{Device, Tensor};

use crate::error::{Error, Result};

/// A sampler's per-element state (momenta, thermostats) where its kernel runs.
#[derive(Debug, Clone)]
pub enum StateBuffer {
    /// In host memory, for the CPU op.
    Host(Vec<f32>),
    /// In device memory, for the CUDA kernel.
    #[cfg(feature = "cuda")]
    Cuda(candle_core::cuda_backend::cudarc::driver::CudaSlice<f32>),
}

impl StateBuffer {
    /// Moves `values` to `device`.
    pub fn new(values: Vec<f32>, device: &Device) -> Result<Self> {
        match device {
            Device::Cpu => Ok(StateBuffer::Host(values)),
            #[cfg(feature = "cuda")]
            Device::Cuda(dev) => Ok(StateBuffer::Cuda(dev.clone_htod(&values)?)),
            #[allow(unreachable_patterns)]
            other => Err(Error::Config(format!(
                "no fused sampler state on {other:?}; use --kernel composed"
            ))),
        }
    }

    /// The number of values.
    pub fn len(&self) -> usize {
        match self {
            StateBuffer::Host(v) => v.len(),
            #[cfg(feature = "cuda")]
            StateBuffer::Cuda(s) => s.len(),
        }
    }

    /// Whether it holds no element.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The values, copied to the host.
    pub fn to_host(&self, device: &Device) -> Result<Vec<f32>> {
        match (self, device) {
            (StateBuffer::Host(v), _) => Ok(v.clone()),
            #[cfg(feature = "cuda")]
            (StateBuffer::Cuda(s), Device::Cuda(dev)) => Ok(dev.clone_dtoh(s)?),
            #[allow(unreachable_patterns)]
            _ => Err(Error::Config("sampler state on another device".into())),
        }
    }

    /// The values as a tensor of `like`'s shape and device.
    pub fn to_tensor(&self, like: &Tensor) -> Result<Tensor> {
        let host = self.to_host(like.device())?;
        Ok(Tensor::from_vec(host, like.shape(), like.device())?)
    }

    /// Multiplies every value by `factor` (a step-size change; rare, so through the host).
    pub fn scale(&mut self, factor: f32, device: &Device) -> Result<()> {
        match self {
            StateBuffer::Host(v) => v.iter_mut().for_each(|x| *x *= factor),
            #[cfg(feature = "cuda")]
            StateBuffer::Cuda(_) => {
                let mut host = self.to_host(device)?;
                host.iter_mut().for_each(|x| *x *= factor);
                *self = StateBuffer::new(host, device)?;
            }
        }
        let _ = device;
        Ok(())
    }
}
