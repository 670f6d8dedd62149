//! Progress bars of long work, drawn by the program: the `bnn` binary installs a
//! terminal bar ([`install`]); a library user gets none unless they install one, so the
//! library crates carry no terminal code.

use std::sync::OnceLock;

/// A bar of `len` steps that the training loop moves.
pub trait ProgressBar {
    /// Steps done so far.
    fn set_position(&self, pos: u64);
    /// The text after the bar (rates, losses, diagnostics).
    fn set_message(&self, msg: String);
    /// Removes the bar (the log lines that follow are not mixed with it).
    fn finish_and_clear(&self);
}

/// Makes a bar of `len` steps whose label is `label` (e.g. `epoch 3/20`).
pub type NewBar = fn(len: u64, label: &str) -> Box<dyn ProgressBar>;

static NEW_BAR: OnceLock<NewBar> = OnceLock::new();

/// Sets how bars are drawn, once per process (a second call is ignored).
pub fn install(new_bar: NewBar) {
    let _ = NEW_BAR.set(new_bar);
}

/// A bar of `len` steps labelled `label`: drawn if `show` and a drawer is installed,
/// otherwise one that draws nothing.
pub fn bar(show: bool, len: u64, label: &str) -> Box<dyn ProgressBar> {
    match NEW_BAR.get() {
        Some(new_bar) if show => new_bar(len, label),
        _ => Box::new(Hidden),
    }
}

struct Hidden;

impl ProgressBar for Hidden {
    fn set_position(&self, _: u64) {}
    fn set_message(&self, _: String) {}
    fn finish_and_clear(&self) {}
}
