//! The reference updates, composed from ordinary candle tensor ops (one op per term of
//! the papers' equations): what the fused kernels are checked against noise for noise.

pub mod sgd;
pub mod sghmc;
pub mod sgld;
pub mod sgnht;

pub use sgd::ComposedSgd;
pub use sghmc::ComposedSghmc;
pub use sgld::ComposedSgld;
pub use sgnht::ComposedSgnht;
