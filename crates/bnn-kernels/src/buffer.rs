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
    /// A flat candle tensor on a device no fused kernel runs on (Metal): for the composed
    /// updates, which read and write it with candle ops.
    Tensor(Tensor),
}

impl StateBuffer {
    /// Moves `values` to `device`.
    pub fn new(values: Vec<f32>, device: &Device) -> Result<Self> {
        match device {
            Device::Cpu => Ok(StateBuffer::Host(values)),
            #[cfg(feature = "cuda")]
            Device::Cuda(dev) => Ok(StateBuffer::Cuda(dev.clone_htod(&values)?)),
            #[allow(unreachable_patterns)]
            other => {
                let n = values.len();
                Ok(StateBuffer::Tensor(Tensor::from_vec(values, n, other)?))
            }
        }
    }

    /// Whether a fused kernel can take it (host or CUDA memory).
    pub fn is_fusable(&self) -> bool {
        !matches!(self, StateBuffer::Tensor(_))
    }

    /// Replaces the values by `values`' (as many, on the buffer's device).
    pub fn set(&mut self, values: &Tensor) -> Result<()> {
        let flat = values.flatten_all()?;
        if flat.elem_count() != self.len() {
            return Err(Error::Config(format!(
                "sampler state: {} values for a buffer of {}",
                flat.elem_count(),
                self.len()
            )));
        }
        let device = flat.device().clone();
        *self = match self {
            StateBuffer::Host(_) => StateBuffer::Host(flat.to_vec1::<f32>()?),
            #[cfg(feature = "cuda")]
            StateBuffer::Cuda(_) => StateBuffer::new(flat.to_vec1::<f32>()?, &device)?,
            StateBuffer::Tensor(_) => StateBuffer::Tensor(flat.to_device(&device)?),
        };
        Ok(())
    }

    /// The number of values.
    pub fn len(&self) -> usize {
        match self {
            StateBuffer::Host(v) => v.len(),
            #[cfg(feature = "cuda")]
            StateBuffer::Cuda(s) => s.len(),
            StateBuffer::Tensor(t) => t.elem_count(),
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
            (StateBuffer::Tensor(t), _) => Ok(t.to_vec1::<f32>()?),
            #[cfg(feature = "cuda")]
            (StateBuffer::Cuda(s), Device::Cuda(dev)) => Ok(dev.clone_dtoh(s)?),
            #[allow(unreachable_patterns)]
            _ => Err(Error::Config("sampler state on another device".into())),
        }
    }

    /// The values as a tensor of `like`'s shape and device.
    pub fn to_tensor(&self, like: &Tensor) -> Result<Tensor> {
        if let StateBuffer::Tensor(t) = self {
            return Ok(t.reshape(like.shape())?.to_device(like.device())?);
        }
        let host = self.to_host(like.device())?;
        Ok(Tensor::from_vec(host, like.shape(), like.device())?)
    }

    /// Multiplies every value by `factor` (a step-size change; rare, so through the host).
    pub fn scale(&mut self, factor: f32, device: &Device) -> Result<()> {
        match self {
            StateBuffer::Host(v) => v.iter_mut().for_each(|x| *x *= factor),
            StateBuffer::Tensor(t) => *t = (&*t * factor as f64)?,
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
