//! A small fork-join pool for the training step's parallel regions: helper threads that
//! spin briefly between jobs instead of sleeping.
//!
//! Why not rayon here: one training step at batch 100 is a dozen parallel regions of
//! 10–100 µs each (products, transposes, sampler chunks) separated by short serial
//! parts. rayon's idle workers yield and then sleep on a futex, and waking them costs
//! about as much as the regions themselves (a quarter of all samples in a profile were
//! the scheduler). Here each helper spins for `SPIN` after a job, so back-to-back
//! regions start at once, and parks after that, so an idle process costs nothing.
//!
//! One job at a time: a call made while another job runs (another thread, or a nested
//! call from inside a job) runs its parts serially on the calling thread. Parts are
//! claimed dynamically, so results must not depend on which thread runs a part; the
//! callers index partial results by part.

use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Mutex, OnceLock};
use std::thread::Thread;
use std::time::{Duration, Instant};

/// How long a helper spins for the next job before it parks.
const SPIN: Duration = Duration::from_micros(300);

/// One parallel call: parts `0..parts` of `f`, claimed through `next`.
struct Job {
    f: *const (dyn Fn(usize) + Sync),
    parts: usize,
    next: AtomicUsize,
    done: AtomicUsize,
    /// Set when a part panicked (the panic is caught so that the job still completes and
    /// no thread is left using `f`; `run` panics afterwards).
    panicked: AtomicBool,
}

impl Job {
    /// Claims and runs parts until none is left.
    fn work(&self) {
        loop {
            let i = self.next.fetch_add(1, SeqCst);
            if i >= self.parts {
                return;
            }
            // SAFETY: `f` outlives the job: `run` does not return before every part is
            // done and no helper is inside the job (see `Shared::inside`).
            let part = std::panic::AssertUnwindSafe(|| unsafe { (*self.f)(i) });
            if std::panic::catch_unwind(part).is_err() {
                self.panicked.store(true, SeqCst);
            }
            self.done.fetch_add(1, SeqCst);
        }
    }
}

struct Shared {
    /// The current job, null between jobs.
    job: AtomicPtr<Job>,
    /// Incremented for every job: helpers wait for it to change.
    epoch: AtomicU64,
    /// Helpers currently holding a pointer to the job.
    inside: AtomicUsize,
    /// Helpers parked (they need an unpark to see a new job).
    sleeping: AtomicUsize,
}

struct Pool {
    shared: &'static Shared,
    helpers: Vec<Thread>,
    /// Held for the duration of a job: one job at a time.
    busy: Mutex<()>,
}

fn helper(shared: &'static Shared) {
    // The epoch the pool was made with, not the one at this thread's start: the first
    // job may be published before a new helper runs, and a helper starting from its
    // epoch would never see it (a run whose first job was its chains ran them on one
    // thread: the fault of the sixteenth session's scaling figure).
    let mut seen = 0;
    loop {
        let start = Instant::now();
        let mut spins = 0u32;
        loop {
            if shared.epoch.load(SeqCst) != seen {
                break;
            }
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(64) && start.elapsed() > SPIN {
                shared.sleeping.fetch_add(1, SeqCst);
                // Re-check after announcing the sleep: a job published before this point
                // is seen here; one published after it finds `sleeping` > 0 and unparks.
                if shared.epoch.load(SeqCst) == seen {
                    std::thread::park();
                }
                shared.sleeping.fetch_sub(1, SeqCst);
                break;
            }
            std::hint::spin_loop();
        }
        let epoch = shared.epoch.load(SeqCst);
        if epoch == seen {
            continue; // a spurious unpark
        }
        seen = epoch;
        shared.inside.fetch_add(1, SeqCst);
        let job = shared.job.load(SeqCst);
        if !job.is_null() {
            // SAFETY: the job stays alive while `inside` > 0 (its owner waits for 0 after
            // clearing `job`, and a helper that entered after the clearing sees null).
            unsafe { (*job).work() };
        }
        shared.inside.fetch_sub(1, SeqCst);
    }
}

fn pool() -> &'static Pool {
    static POOL: OnceLock<Pool> = OnceLock::new();
    POOL.get_or_init(|| {
        let shared: &'static Shared = Box::leak(Box::new(Shared {
            job: AtomicPtr::new(std::ptr::null_mut()),
            epoch: AtomicU64::new(0),
            inside: AtomicUsize::new(0),
            sleeping: AtomicUsize::new(0),
        }));
        // The calling thread and helpers: as many as the machine has, or as
        // RAYON_NUM_THREADS says (the variable candle's CPU ops also honour), read here
        // rather than through rayon, which would start a second set of threads.
        let helpers = (1..wanted_threads())
            .filter_map(|i| {
                std::thread::Builder::new()
                    .name(format!("bnn-pool-{i}"))
                    .spawn(move || helper(shared))
                    .ok()
                    .map(|h| h.thread().clone())
            })
            .collect();
        Pool {
            shared,
            helpers,
            busy: Mutex::new(()),
        }
    })
}

/// `RAYON_NUM_THREADS` if it is a positive number, else the machine's parallelism.
fn wanted_threads() -> usize {
    std::env::var("RAYON_NUM_THREADS")
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|&n| n > 0)
        .or_else(|| std::thread::available_parallelism().ok().map(|n| n.get()))
        .unwrap_or(1)
}

/// Threads that take part in a job (the caller included).
pub fn threads() -> usize {
    pool().helpers.len() + 1
}

/// Whether a [`run`] from this point would go parallel: the pool has helpers and no job
/// holds it (a kernel called inside a part of a job runs on its own thread). For
/// reports: another thread may take the pool the moment after.
pub fn free() -> bool {
    let p = pool();
    !p.helpers.is_empty() && p.busy.try_lock().is_ok()
}

/// Runs `f` with the pool held, so that every [`run`] inside it runs its parts on this
/// thread, one after another: how a kernel runs inside a part of a job, timed alone.
pub fn serially<R>(f: impl FnOnce() -> R) -> R {
    let _held = pool().busy.lock().unwrap_or_else(|e| e.into_inner());
    f()
}

/// Runs `f(0)`, …, `f(parts − 1)`, in parallel when the pool is free.
pub fn run(parts: usize, f: &(dyn Fn(usize) + Sync)) {
    let p = pool();
    let guard = match p.busy.try_lock() {
        Ok(g) if parts > 1 && !p.helpers.is_empty() => g,
        _ => {
            (0..parts).for_each(f);
            return;
        }
    };
    // SAFETY (lifetime erasure): the pointer is only dereferenced while this call is on
    // the stack (see `Job::work`).
    let f: *const (dyn Fn(usize) + Sync) = unsafe { std::mem::transmute(f) };
    let job = Job {
        f,
        parts,
        next: AtomicUsize::new(0),
        done: AtomicUsize::new(0),
        panicked: AtomicBool::new(false),
    };
    let s = p.shared;
    s.job.store(&job as *const Job as *mut Job, SeqCst);
    s.epoch.fetch_add(1, SeqCst);
    if s.sleeping.load(SeqCst) > 0 {
        p.helpers.iter().for_each(Thread::unpark);
    }
    job.work();
    while job.done.load(SeqCst) < parts {
        std::hint::spin_loop();
    }
    s.job.store(std::ptr::null_mut(), SeqCst);
    while s.inside.load(SeqCst) > 0 {
        std::hint::spin_loop();
    }
    drop(guard);
    if job.panicked.load(SeqCst) {
        panic!("a part of a parallel job panicked");
    }
}

/// Elements of work below which [`halves`] stays on one thread.
pub const PARALLEL_MIN_ELEMENTS: usize = 1 << 15;

/// Applies `f` to `data` in two halves (cut at a multiple of `unit`, e.g. a row) on the
/// pool when the pass does at least [`PARALLEL_MIN_ELEMENTS`] elements of `work`, to all
/// of it on the calling thread otherwise. `f` gets the part and its offset in `data`.
pub fn halves<T: Send>(
    data: &mut [T],
    unit: usize,
    work: usize,
    f: impl Fn(&mut [T], usize) + Sync,
) {
    let units = data.len() / unit.max(1);
    if work < PARALLEL_MIN_ELEMENTS || units < 2 || threads() < 2 {
        f(data, 0);
        return;
    }
    let cut = units.div_ceil(2) * unit;
    let len = data.len();
    let d = Disjoint::new(data);
    run(2, &|p| {
        let (a, b) = if p == 0 { (0, cut) } else { (cut, len) };
        // SAFETY: the two parts get the disjoint ranges 0..cut and cut..len.
        f(unsafe { d.slice(a, b) }, a);
    });
}

/// A raw pointer that parts of one job share, each touching its own disjoint range.
#[derive(Clone, Copy)]
pub struct Disjoint<T>(pub *mut T);

// SAFETY: used only to hand disjoint ranges of one buffer to the parts of a job, while the
// job's caller holds the exclusive borrow of the buffer.
unsafe impl<T> Send for Disjoint<T> {}
unsafe impl<T> Sync for Disjoint<T> {}

impl<T> Disjoint<T> {
    /// Lends `s` to the parts of a parallel region (each writes its own range).
    pub fn new(s: &mut [T]) -> Self {
        Disjoint(s.as_mut_ptr())
    }

    /// The range `start..end` of the buffer as a slice.
    ///
    /// # Safety
    /// `start..end` lies inside the buffer, and no other part of the job touches it.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn slice(&self, start: usize, end: usize) -> &mut [T] {
        unsafe { std::slice::from_raw_parts_mut(self.0.add(start), end - start) }
    }

    /// The pointer `offset` elements on (no access).
    pub fn at(&self, offset: usize) -> *mut T {
        self.0.wrapping_add(offset)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_part_runs_once_including_nested_and_concurrent_calls() {
        let counts: Vec<AtomicUsize> = (0..1000).map(|_| AtomicUsize::new(0)).collect();
        std::thread::scope(|s| {
            for _ in 0..3 {
                s.spawn(|| {
                    for _ in 0..200 {
                        run(10, &|i| {
                            // Nested: runs serially inside the outer job.
                            run(100, &|j| {
                                counts[i * 100 + j].fetch_add(1, SeqCst);
                            });
                        });
                    }
                });
            }
        });
        assert!(counts.iter().all(|c| c.load(SeqCst) == 600));
    }

    #[test]
    fn a_panicking_part_panics_the_caller_and_leaves_the_pool_usable() {
        let r = std::panic::catch_unwind(|| {
            run(8, &|i| {
                if i == 5 {
                    panic!("part 5");
                }
            })
        });
        assert!(r.is_err());
        let sum = AtomicUsize::new(0);
        run(8, &|i| {
            sum.fetch_add(i, SeqCst);
        });
        assert_eq!(sum.load(SeqCst), 28);
    }

    #[test]
    fn parked_helpers_wake_up() {
        let sum = AtomicUsize::new(0);
        run(4, &|i| {
            sum.fetch_add(i, SeqCst);
        });
        std::thread::sleep(SPIN * 4);
        run(4, &|i| {
            sum.fetch_add(i, SeqCst);
        });
        assert_eq!(sum.load(SeqCst), 12);
    }
}
