//! The first job of a process runs on every pool thread. A helper used to take the epoch
//! at its own start as "seen", so a job published before the new thread first ran (the
//! first job of a process, e.g. the chains of `bnn train --chains K` on the built-in
//! subset) ran on the calling thread alone. Its own test binary: the pool is made by the
//! first call in the process.

use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::Mutex;
use std::time::{Duration, Instant};

#[test]
fn the_first_job_of_a_process_runs_on_two_threads() {
    // Two threads whatever the machine (before the pool exists).
    std::env::set_var("RAYON_NUM_THREADS", "2");
    let started = [AtomicBool::new(false), AtomicBool::new(false)];
    let threads = Mutex::new(Vec::new());
    bnn::pool::run(2, &|p| {
        started[p].store(true, SeqCst);
        threads.lock().unwrap().push(std::thread::current().id());
        // Each part waits (at most 5 s) for the other to start, so that a helper that is
        // awake takes the second part rather than the calling thread after the first.
        let t = Instant::now();
        while !started[1 - p].load(SeqCst) && t.elapsed() < Duration::from_secs(5) {
            std::hint::spin_loop();
        }
    });
    assert_eq!(bnn::pool::threads(), 2);
    let threads = threads.into_inner().unwrap();
    assert_ne!(
        threads[0], threads[1],
        "the two parts of the first job ran on one thread"
    );
}
