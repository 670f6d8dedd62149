//! The integration tests that can share one process, one module per area: one test
//! program to compile and link instead of one per file. Those that need a process of their
//! own stay apart: `disk` (mounts file systems), `docs` (a CI step of its own), `gpu` and
//! `mpi` (features), `pool_first_job` (the first job of a fresh process).

#[path = "../common/mod.rs"]
mod common;

mod backprop;
mod chain_sink;
mod cli_errors;
mod compare;
mod determinism;
mod divergence;
mod eval_memory;
mod fetch;
mod inspect;
mod isa;
mod kernel_equivalence;
mod minibatch_posterior;
mod optimizer;
mod plan;
mod plan_ensemble;
mod plot;
mod posterior;
mod potential;
mod predict;
mod presets;
mod properties;
mod regression;
mod resnet;
mod resume;
mod samplers;
mod stacked;
mod synthetic;
mod table;
mod train;
mod uncertainty;
