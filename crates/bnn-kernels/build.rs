//! The kernel sources live in this crate's `kernels/` folder (the project's top-level
//! `kernels/` links to it), so that the packaged crate carries them.
//!
//! 1. Compiles the CUDA kernels' element math (`kernels/sampler_math.h`) for the host, so
//!    that tests check it against the Rust CPU op bit for bit.
//! 2. With feature `cuda`: compiles `kernels/sampler_step.cu` and `kernels/step_plan.cu`
//!    (the step plan's kernels, whose host build is `plan_host.c`) to PTX with nvcc (from
//!    `$CUDA_ROOT/bin` or `PATH`), for compute capability `$CUDA_COMPUTE_CAP` (default
//!    80), warnings as errors, no FMA contraction.

use std::path::PathBuf;
use std::process::Command;

/// The crate's `kernels/` folder.
fn sources() -> PathBuf {
    PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR")).join("kernels")
}

fn main() {
    let k = sources();
    println!(
        "cargo:rerun-if-changed={}",
        k.join("sampler_math.h").display()
    );
    for f in [
        "host_shim.c",
        "plan_host.c",
        "step_plan.h",
        "plan_ensemble.h",
    ] {
        println!("cargo:rerun-if-changed={}", k.join(f).display());
    }
    cc::Build::new()
        .file(k.join("host_shim.c"))
        .file(k.join("plan_host.c"))
        .include(&k)
        .opt_level(2)
        // Bit-exactness with the Rust op: no contraction of a*b+c into FMA, no fast math.
        .flag("-ffp-contract=off")
        .flag_if_supported("-fno-fast-math")
        .warnings(true)
        .extra_warnings(true)
        .warnings_into_errors(true)
        .compile("bnn_kernel_host");

    if std::env::var_os("CARGO_FEATURE_CUDA").is_some() {
        compile_ptx();
    }
}

fn compile_ptx() {
    for name in ["sampler_step", "step_plan"] {
        compile_one_ptx(name);
    }
}

/// `kernels/{name}.cu` to `$OUT_DIR/{name}.ptx`.
fn compile_one_ptx(name: &str) {
    let k = sources();
    let cu = k.join(format!("{name}.cu"));
    println!("cargo:rerun-if-changed={}", cu.display());
    println!("cargo:rerun-if-env-changed=CUDA_COMPUTE_CAP");
    println!("cargo:rerun-if-env-changed=CUDA_ROOT");
    let nvcc = std::env::var_os("CUDA_ROOT")
        .map(|r| PathBuf::from(r).join("bin/nvcc"))
        .filter(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from("nvcc"));
    let cap = std::env::var("CUDA_COMPUTE_CAP").unwrap_or_else(|_| "80".to_string());
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR")).join(format!("{name}.ptx"));
    let status = Command::new(&nvcc)
        .args(["--ptx", &format!("-arch=sm_{cap}"), "--fmad=false"])
        .args(["-Werror", "all-warnings"])
        .arg(format!("-I{}", k.display()))
        .arg(&cu)
        .arg("-o")
        .arg(&out)
        .status()
        .unwrap_or_else(|e| panic!("feature `cuda` needs nvcc ({}): {e}", nvcc.display()));
    assert!(status.success(), "nvcc failed on kernels/{name}.cu");
}
