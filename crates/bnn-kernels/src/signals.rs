//! SIGINT and SIGTERM as a flag the training loop polls between updates, so that a run
//! interrupted by Ctrl-C or a scheduler finishes its update, saves its state and exits
//! (130 / 143) instead of dying mid-write. Ground floor: imports nothing of ours.

use std::sync::atomic::{AtomicI32, Ordering};

/// The signal received, 0 if none.
static RECEIVED: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(signal: libc::c_int) {
    // Only an atomic store: async-signal-safe.
    RECEIVED.store(signal, Ordering::SeqCst);
}

/// Catches SIGINT and SIGTERM from now on (a second one still only sets the flag; the
/// loop reacts within one update).
pub fn install() {
    #[cfg(unix)]
    // SAFETY: `on_signal` is an `extern "C" fn(c_int)` that only stores to an atomic.
    unsafe {
        let handler = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
        libc::signal(libc::SIGINT, handler);
        libc::signal(libc::SIGTERM, handler);
    }
}

/// The signal caught since [`install`], if any.
pub fn pending() -> Option<i32> {
    match RECEIVED.load(Ordering::SeqCst) {
        0 => None,
        s => Some(s),
    }
}
