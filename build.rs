//! Compiles the CUDA kernels' element math (`kernels/sampler_math.h`) for the host, so
//! that tests can check it against the Rust CPU op bit for bit.

fn main() {
    println!("cargo:rerun-if-changed=kernels/sampler_math.h");
    println!("cargo:rerun-if-changed=kernels/host_shim.c");
    cc::Build::new()
        .file("kernels/host_shim.c")
        .include("kernels")
        .opt_level(2)
        // Bit-exactness with the Rust op: no contraction of a*b+c into FMA, no fast math.
        .flag("-ffp-contract=off")
        .flag_if_supported("-fno-fast-math")
        .warnings(true)
        .extra_warnings(true)
        .warnings_into_errors(true)
        .compile("bnn_kernel_host");
}
