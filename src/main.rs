use clap::FromArgMatches;

mod cli;
mod commands;

/// Large buffers cache-line aligned for the AVX-512 kernels (see `bnn::alloc`).
#[global_allocator]
static ALLOC: bnn::alloc::CacheLineAligned = bnn::alloc::CacheLineAligned;

fn main() {
    // The command line is parsed once: the typed values, and which flags were typed (a
    // preset fills the others; --resume accepts only some).
    let matches = cli::command().get_matches();
    let cli = cli::Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    let given = cli::given_train_flags(&matches);
    let level = match (cli.quiet, cli.verbose) {
        (true, _) => "error",
        (false, 0) => "info",
        (false, 1) => "debug",
        (false, _) => "trace",
    };
    // The program's crate and the library's three: their events are the ones we print.
    let filter = tracing_subscriber::EnvFilter::try_from_env("BNN_LOG").unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new(
            ["bnn", "bnn_kernels", "bnn_core", "bnn_run"]
                .map(|c| format!("{c}={level}"))
                .join(","),
        )
    });
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
    bnn::data::fetch::install_transport(bnn::http::get);
    bnn::progress::install(bnn::terminal::new_bar);
    let ranks = match bnn::ranks::Ranks::from_environment() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("bnn: error: {e}");
            std::process::exit(e.exit_code());
        }
    };
    if ranks.size() > 1 && std::env::var_os("RAYON_NUM_THREADS").is_none() {
        // One thread per rank unless told otherwise: R ranks already fill R cores, and
        // samples must not depend on how the cores are shared. Set before the pool starts.
        std::env::set_var("RAYON_NUM_THREADS", "1");
    }
    let _rank = (ranks.size() > 1).then(|| tracing::info_span!("rank", r = ranks.rank()).entered());
    match commands::run(cli.command, &given, cli.quiet, &ranks) {
        Ok(json) if json.is_empty() => {}
        Ok(json) => println!("{json}"),
        Err(e) => {
            match ranks.size() {
                1 => eprintln!("bnn: error: {e}"),
                n => eprintln!("bnn: error: rank {} of {n}: {e}", ranks.rank()),
            }
            // Several ranks: stops the others at once (mpirun names this rank).
            ranks.abort(e.exit_code());
        }
    }
}
