use clap::Parser;

mod cli;
mod commands;

/// Large buffers cache-line aligned for the AVX-512 kernels (see `bnn::alloc`).
#[global_allocator]
static ALLOC: bnn::alloc::CacheLineAligned = bnn::alloc::CacheLineAligned;

fn main() {
    let cli = cli::Cli::parse();
    let level = match (cli.quiet, cli.verbose) {
        (true, _) => "error",
        (false, 0) => "info",
        (false, 1) => "debug",
        (false, _) => "trace",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_env("BNN_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(format!("bnn={level}")));
    // Colour only on a terminal: a log sent to a file or a pipe stays plain text
    // (NO_COLOR set also turns it off, https://no-color.org).
    use std::io::IsTerminal;
    let colour = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(colour)
        .with_target(false)
        .init();
    match commands::run(cli.command, cli.quiet) {
        Ok(json) => println!("{json}"),
        Err(e) => {
            eprintln!("bnn: error: {e}");
            std::process::exit(e.exit_code());
        }
    }
}
