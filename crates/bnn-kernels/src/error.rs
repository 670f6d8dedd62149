//! The library's error type: every failure a user can cause maps to one clear line.

use std::path::PathBuf;

/// Errors of the `bnn` library. Each message is meant to be printed as the single line a
/// user sees, so it says what went wrong and, where possible, what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An error of candle (a tensor operation, a device).
    #[error("{0}")]
    Candle(#[from] candle_core::Error),

    /// A file operation failed.
    #[error("{path}: {source}")]
    Io {
        /// The file or folder.
        path: PathBuf,
        /// What the operating system said.
        #[source]
        source: std::io::Error,
    },

    /// A file that is not a valid IDX file.
    #[error("{path}: not a valid IDX file: {reason}")]
    Idx {
        /// The file.
        path: String,
        /// What is wrong with it.
        reason: String,
    },

    /// A dataset that is missing, damaged or not what was expected.
    #[error("{0}")]
    Data(String),

    /// A download that failed.
    #[error("{0}")]
    Fetch(String),

    /// A setting, flag or preset that is invalid or inconsistent.
    #[error("{0}")]
    Config(String),

    /// A sample file, saved state or run folder that cannot be used.
    #[error("{0}")]
    Checkpoint(String),

    /// `what`: where it shows, e.g. "first in tensor fc1.weight".
    #[error(
        "the {quantity} became non-finite ({value}) at step {step} (epoch {epoch}), {what}; \
         try a smaller step size, e.g. --step-size {suggestion:e}, or --on-divergence rollback; \
         samples saved so far are valid"
    )]
    Diverged {
        /// The update at which it happened.
        step: u64,
        /// The epoch at which it happened.
        epoch: usize,
        /// Which quantity went non-finite (loss, kinetic energy, parameter).
        quantity: &'static str,
        /// Its value.
        value: f64,
        /// Where (the tensor or the term).
        what: String,
        /// A step size that should not diverge.
        suggestion: f64,
    },

    /// The parameters grew without bound while the loss stayed finite (caught when the
    /// prior's Gibbs step sums θ²).
    #[error(
        "the chain diverged by step {step} (epoch {epoch}): {what} is not finite; \
         try a smaller step size, e.g. --step-size {suggestion:e}, or --on-divergence rollback; \
         samples saved so far are valid"
    )]
    Exploded {
        /// The update at which it happened.
        step: u64,
        /// The epoch at which it happened.
        epoch: usize,
        /// What overflowed.
        what: String,
        /// A step size that should not diverge.
        suggestion: f64,
    },

    /// `--on-divergence rollback` rolled back as often as it may and the chain diverged
    /// again.
    #[error(
        "{cause} (after {rollbacks} rollbacks to the last saved state, each halving the step size: \
         the run stops)"
    )]
    DivergedAgain {
        /// Rollbacks done before this divergence.
        rollbacks: u32,
        /// The last divergence.
        cause: Box<Error>,
    },

    /// SIGINT or SIGTERM arrived: the update in progress was finished and the state saved.
    #[error(
        "stopped by {} after update {step}; the state is saved: continue with \
         `bnn train --resume {}`", signal_name(*signal), run_dir.display()
    )]
    Interrupted {
        /// The signal number (2 SIGINT, 15 SIGTERM).
        signal: i32,
        /// The update after which the state was saved.
        step: u64,
        /// The run folder to resume.
        run_dir: PathBuf,
    },

    /// A write of a run's files failed (no space, a read-only or forbidden folder): the
    /// run stopped with every earlier file as it was.
    #[error(
        "{path}: {source}; the run stopped, its samples so far and its last saved state are intact: {advice}"
    )]
    WriteFailed {
        /// The file or folder.
        path: PathBuf,
        /// What the operating system said.
        #[source]
        source: std::io::Error,
        /// What the user can do (free space, another folder).
        advice: String,
    },

    /// The device ran out of memory part-way (`detail`: what the device said).
    #[error(
        "the device ran out of memory ({detail}): ask for fewer --chains or a smaller \
         --batch-size; the samples and the state saved so far are kept (--resume continues \
         from them)"
    )]
    OutOfDeviceMemory {
        /// The device's own message, its first line.
        detail: String,
    },

    /// A quantity that must be finite is not; the caller knows where in the run.
    #[error("{0} is not finite")]
    NotFinite(String),

    /// A hyper-parameter outside its range, named in the library's words (`step size`,
    /// `friction`); the `bnn` binary names the flag instead ([`Error::for_flag`]).
    #[error("{name} must be {rule}, got {value}")]
    Invalid {
        /// The quantity, as the papers and the library's types call it.
        name: &'static str,
        /// What it must be: "positive and finite", "in [0, 1]".
        rule: String,
        /// The value given.
        value: f64,
    },
}

impl Error {
    /// The process exit status for this error: 128 + the signal for [`Error::Interrupted`]
    /// (130 for SIGINT, 143 for SIGTERM, as a shell reports them), 1 otherwise.
    pub fn exit_code(&self) -> i32 {
        match self {
            Error::Interrupted { signal, .. } => 128 + signal,
            _ => 1,
        }
    }

    /// Whether this is a chain that diverged ([`Error::Diverged`], [`Error::Exploded`]),
    /// which `--on-divergence rollback` may undo.
    pub fn is_divergence(&self) -> bool {
        matches!(self, Error::Diverged { .. } | Error::Exploded { .. })
    }

    /// The error as a user should read it: a device's out-of-memory failure, which candle
    /// reports in the driver's words, becomes [`Error::OutOfDeviceMemory`].
    pub fn explained(self) -> Self {
        match &self {
            Error::Candle(e) if is_out_of_memory(&e.to_string()) => {
                let text = e.to_string();
                Error::OutOfDeviceMemory {
                    detail: text.lines().next().unwrap_or_default().to_string(),
                }
            }
            _ => self,
        }
    }

    /// The error as the command line should say it: an [`Error::Invalid`] names the flag
    /// that sets the quantity (`step size` → `--step-size`); other errors are unchanged.
    pub fn for_flag(self) -> Self {
        match self {
            Error::Invalid { name, rule, value } => Error::Config(format!(
                "--{} must be {rule}, got {value}",
                name.replace(' ', "-")
            )),
            e => e,
        }
    }

    /// Wraps an I/O error with the path it concerns.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            source,
        }
    }
}

/// The library's error inside candle's, so that `?` works in a function returning
/// `candle_core::Result` (a candle user's code). Wrapped without `Error::wrap`'s backtrace,
/// which candle would print as part of the message wherever `RUST_BACKTRACE` is set.
impl From<Error> for candle_core::Error {
    fn from(e: Error) -> Self {
        match e {
            Error::Candle(inner) => inner,
            other => candle_core::Error::Wrapped(Box::new(other)),
        }
    }
}

/// Whether a failure's message is a device running out of memory (the driver's
/// `CUDA_ERROR_OUT_OF_MEMORY`, cuBLAS's failed allocation, Metal's).
pub fn is_out_of_memory(message: &str) -> bool {
    [
        "OUT_OF_MEMORY",
        "ALLOC_FAILED",
        "out of memory",
        "OutOfMemory",
    ]
    .iter()
    .any(|needle| message.contains(needle))
}

/// A signal's name for messages (SIGINT and SIGTERM are the ones the run catches).
fn signal_name(signal: i32) -> String {
    match signal {
        libc::SIGINT => "SIGINT".into(),
        libc::SIGTERM => "SIGTERM".into(),
        s => format!("signal {s}"),
    }
}

/// A result whose error is [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
