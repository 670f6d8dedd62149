//! When a chain loop saves its state and when it stops: the one rule of every loop that
//! runs a chain (minibatch chains apart and stacked, replica exchange's rounds, HMC's
//! iterations), so that each saves on the same occasions and a signal ends each alike.
//!
//! A loop counts its work (updates, or HMC's iterations) and, after each unit (an update,
//! a round, an iteration, an epoch), asks [`Checkpoints::due`]. A state is saved when a
//! signal is pending, at the run's last unit, when the count passed a multiple of the
//! interval, or, where the loop sets one, when the last save is older than its
//! seconds. After the save, [`Due::stop`] turns a pending signal into the error
//! that ends the run (naming the update and the folder to resume from), unless the run
//! had finished anyway.

use std::path::Path;
use std::time::Instant;

use crate::error::{Error, Result};
use crate::signals;

/// A loop's saving rule: every `every` counts, and at least every `seconds` where set.
#[derive(Debug)]
pub(super) struct Checkpoints {
    every: u64,
    seconds: Option<f64>,
    saved: Instant,
}

/// What [`Checkpoints::due`] saw after a unit of work.
#[derive(Debug, Clone, Copy)]
pub(super) struct Due {
    /// The pending signal, if any.
    pub signal: Option<i32>,
    /// Whether the unit was the run's last.
    pub last: bool,
    /// Whether to save the state now.
    pub save: bool,
}

impl Checkpoints {
    /// Saving every `every` counts (at least 1).
    pub fn every(every: u64) -> Self {
        Checkpoints {
            every: every.max(1),
            seconds: None,
            saved: Instant::now(),
        }
    }

    /// Also saving when the last save is `seconds` old (HMC, whose iterations can be long).
    pub fn or_every_seconds(self, seconds: f64) -> Self {
        Checkpoints {
            seconds: Some(seconds),
            ..self
        }
    }

    /// After a unit of work that moved the count from `from` to `to` (`last`: the run's
    /// last), with the signal pending now.
    pub fn due(&self, from: u64, to: u64, last: bool) -> Due {
        self.due_with(from, to, last, signals::pending())
    }

    /// [`Checkpoints::due`] with the pending signal given (replica exchange's ranks agree
    /// on one first).
    pub fn due_with(&self, from: u64, to: u64, last: bool, signal: Option<i32>) -> Due {
        let passed = from / self.every < to / self.every;
        let old = self
            .seconds
            .is_some_and(|s| self.saved.elapsed().as_secs_f64() >= s);
        Due {
            signal,
            last,
            save: signal.is_some() || last || passed || old,
        }
    }

    /// Records that the state was just saved.
    pub fn saved(&mut self) {
        self.saved = Instant::now();
    }
}

impl Due {
    /// After the save: the error that ends the run on a pending signal, unless the run
    /// had finished anyway; `step` and `location` say where it stopped.
    pub fn stop(&self, step: u64, location: &Path) -> Result<()> {
        match (self.signal, self.last) {
            (Some(signal), false) => Err(Error::Interrupted {
                signal,
                step,
                run_dir: location.to_path_buf(),
            }),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Due at each multiple of the interval, at the last unit and on a signal; a signal
    /// stops the run unless it was the last unit.
    #[test]
    fn due_on_the_interval_the_end_and_a_signal() {
        let c = Checkpoints::every(4);
        let saves: Vec<u64> = (0..12)
            .filter(|&n| c.due_with(n, n + 1, n + 1 == 10, None).save)
            .map(|n| n + 1)
            .collect();
        assert_eq!(saves, [4, 8, 10, 12]);
        // A round of several updates passing a multiple is due.
        assert!(c.due_with(2, 5, false, None).save);
        assert!(!c.due_with(4, 7, false, None).save);
        let signalled = c.due_with(0, 1, false, Some(15));
        assert!(signalled.save);
        let e = signalled.stop(1, Path::new("run")).unwrap_err();
        assert!(matches!(
            e,
            Error::Interrupted {
                signal: 15,
                step: 1,
                ..
            }
        ));
        assert!(c
            .due_with(9, 10, true, Some(2))
            .stop(10, Path::new("run"))
            .is_ok());
        // Interval 0 is every unit; an old save is due.
        assert!(Checkpoints::every(0).due_with(6, 7, false, None).save);
        let timed = Checkpoints::every(100).or_every_seconds(0.0);
        assert!(timed.due_with(1, 2, false, None).save);
    }
}
