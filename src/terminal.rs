//! The progress bars `bnn` draws on the terminal (installed into
//! `bnn_run::progress`): indicatif, which the library crates do not depend on.

use bnn_run::progress::ProgressBar;

struct Bar(indicatif::ProgressBar);

impl ProgressBar for Bar {
    fn set_position(&self, pos: u64) {
        self.0.set_position(pos);
    }
    fn set_message(&self, msg: String) {
        self.0.set_message(msg);
    }
    fn finish_and_clear(&self) {
        self.0.finish_and_clear();
    }
}

/// A bar of `len` steps: `label [=====>    ] pos/len rate eta message`.
pub fn new_bar(len: u64, label: &str) -> Box<dyn ProgressBar> {
    let bar = indicatif::ProgressBar::new(len);
    let style = indicatif::ProgressStyle::with_template(
        "{prefix} [{bar:30}] {pos}/{len} {per_sec} eta {eta} {msg}",
    )
    .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
    .progress_chars("=> ");
    bar.set_style(style);
    bar.set_prefix(label.to_string());
    Box::new(Bar(bar))
}
