//! The one chain driver. Every loop that runs a chain is a [`Transition`] that [`drive`]
//! runs to its end: `bnn train`'s minibatch chains (apart or stacked), its replica
//! exchange rounds and its full-batch HMC iterations, and `bnn sample`'s synthetic
//! chains and replicas. A transition does one unit of work and knows how to save its
//! state; the driver alone decides when a state is saved and when a signal ends the run,
//! so every loop saves on the same occasions and a signal stops each alike.
//!
//! A state is saved ([`Checkpoints::due`]) when a signal is pending, at the run's last
//! unit, when the count of units passed a multiple of the interval, or, where the loop
//! sets one, when the last save is older than its seconds. After a save on a signal, the
//! run ends with [`Error::Interrupted`], naming the update and the folder to resume
//! from, unless the run had finished anyway. A chain held in memory (`bnn sample`) has
//! no folder: it saves nothing and catches no signal, whose default action ends it.

use std::path::Path;
use std::time::Instant;

use crate::error::{Error, Result};
use crate::signals;

/// One chain as the driver runs it: a unit of work at a time, counted in units (updates,
/// or HMC's iterations) from [`Transition::done`] to [`Transition::total`].
pub trait Transition {
    /// Units done so far (on resume, those of the earlier runs too).
    fn done(&self) -> u64;
    /// Units of the whole run.
    fn total(&self) -> u64;
    /// The next unit of work: one update, a round of updates and its exchange, or an HMC
    /// iteration; it moves [`Transition::done`] on. `false` when the chain cannot go on
    /// (a synthetic chain left the finite numbers): the run ends there.
    fn advance(&mut self) -> Result<bool>;
    /// Saves the state where the chain stands, to resume from.
    fn save(&mut self) -> Result<()>;
    /// The folder the state is saved in; `None` for a chain held in memory.
    fn folder(&self) -> Option<&Path>;
    /// The signal pending now. Replica exchange's ranks override it to agree on one.
    fn signal(&self) -> Result<Option<i32>> {
        Ok(signals::pending())
    }
    /// Before the run stops on a signal: clears what the chain draws (its progress bar).
    fn stopping(&mut self) {}
}

/// Runs `t` from where it stands to its end, its state saved as `checkpoints` says.
pub fn drive<T: Transition + ?Sized>(t: &mut T, checkpoints: &mut Checkpoints) -> Result<()> {
    while t.done() < t.total() {
        let from = t.done();
        if !t.advance()? {
            return Ok(());
        }
        if t.folder().is_none() {
            continue;
        }
        let to = t.done();
        let last = to >= t.total();
        let due = checkpoints.due(from, to, last, t.signal()?);
        if due.save {
            t.save()?;
            checkpoints.saved();
        }
        if let (Some(signal), false) = (due.signal, last) {
            t.stopping();
            let run_dir = t.folder().map(Path::to_path_buf).unwrap_or_default();
            return Err(Error::Interrupted {
                signal,
                step: to,
                run_dir,
            });
        }
    }
    Ok(())
}

/// A loop's saving rule: every `every` units, and at least every `seconds` where set.
#[derive(Debug)]
pub struct Checkpoints {
    every: u64,
    seconds: Option<f64>,
    saved: Instant,
}

/// What [`Checkpoints::due`] saw after a unit of work.
#[derive(Debug, Clone, Copy)]
pub struct Due {
    /// The pending signal, if any.
    pub signal: Option<i32>,
    /// Whether to save the state now.
    pub save: bool,
}

impl Checkpoints {
    /// Saving every `every` units (at least 1).
    pub fn every(every: u64) -> Self {
        Checkpoints {
            every: every.max(1),
            seconds: None,
            saved: Instant::now(),
        }
    }

    /// The rule of a chain held in memory, which the driver never consults: it has no
    /// folder to save in.
    pub fn in_memory() -> Self {
        Checkpoints::every(u64::MAX)
    }

    /// Also saving when the last save is `seconds` old (HMC, whose iterations can be long).
    pub fn or_every_seconds(self, seconds: f64) -> Self {
        Checkpoints {
            seconds: Some(seconds),
            ..self
        }
    }

    /// After a unit of work that moved the count from `from` to `to` (`last`: the run's
    /// last), with `signal` pending.
    pub fn due(&self, from: u64, to: u64, last: bool, signal: Option<i32>) -> Due {
        let passed = from / self.every < to / self.every;
        let old = self
            .seconds
            .is_some_and(|s| self.saved.elapsed().as_secs_f64() >= s);
        Due {
            signal,
            save: signal.is_some() || last || passed || old,
        }
    }

    /// Records that the state was just saved.
    pub fn saved(&mut self) {
        self.saved = Instant::now();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    /// Due at each multiple of the interval, at the last unit and on a signal.
    #[test]
    fn due_on_the_interval_the_end_and_a_signal() {
        let c = Checkpoints::every(4);
        let saves: Vec<u64> = (0..12)
            .filter(|&n| c.due(n, n + 1, n + 1 == 10, None).save)
            .map(|n| n + 1)
            .collect();
        assert_eq!(saves, [4, 8, 10, 12]);
        // A round of several updates passing a multiple is due.
        assert!(c.due(2, 5, false, None).save);
        assert!(!c.due(4, 7, false, None).save);
        assert!(c.due(0, 1, false, Some(15)).save);
        // Interval 0 is every unit; an old save is due.
        assert!(Checkpoints::every(0).due(6, 7, false, None).save);
        let timed = Checkpoints::every(100).or_every_seconds(0.0);
        assert!(timed.due(1, 2, false, None).save);
    }

    /// A chain of `total` units of `per` updates, signalled after unit `signal_at`, in a
    /// folder or in memory; it records where it saved.
    struct Counter {
        done: u64,
        total: u64,
        per: u64,
        signal_at: Option<u64>,
        folder: Option<PathBuf>,
        saves: Vec<u64>,
        stopped: bool,
    }

    impl Transition for Counter {
        fn done(&self) -> u64 {
            self.done
        }
        fn total(&self) -> u64 {
            self.total
        }
        fn advance(&mut self) -> Result<bool> {
            self.done = (self.done + self.per).min(self.total);
            Ok(true)
        }
        fn save(&mut self) -> Result<()> {
            self.saves.push(self.done);
            Ok(())
        }
        fn folder(&self) -> Option<&Path> {
            self.folder.as_deref()
        }
        fn signal(&self) -> Result<Option<i32>> {
            Ok(self.signal_at.filter(|&s| self.done >= s).map(|_| 15))
        }
        fn stopping(&mut self) {
            self.stopped = true;
        }
    }

    fn counter(total: u64, per: u64, signal_at: Option<u64>, folder: bool) -> Counter {
        Counter {
            done: 0,
            total,
            per,
            signal_at,
            folder: folder.then(|| PathBuf::from("run")),
            saves: Vec::new(),
            stopped: false,
        }
    }

    /// Saves on the interval and at the end; rounds of three updates save at the round
    /// that passed each multiple.
    #[test]
    fn the_driver_saves_on_the_interval_and_at_the_end() {
        let mut c = counter(10, 1, None, true);
        drive(&mut c, &mut Checkpoints::every(4)).unwrap();
        assert_eq!((c.done, c.saves.as_slice()), (10, &[4, 8, 10][..]));
        let mut rounds = counter(10, 3, None, true);
        drive(&mut rounds, &mut Checkpoints::every(4)).unwrap();
        assert_eq!(rounds.saves, [6, 9, 10]);
        assert!(!rounds.stopped);
    }

    /// A signal saves, clears the bar and stops with the error naming the unit and the
    /// folder; one at the last unit ends the run as usual; a chain in memory neither saves
    /// nor stops.
    #[test]
    fn a_signal_saves_then_stops_unless_the_run_is_done() {
        let mut c = counter(10, 1, Some(3), true);
        let e = drive(&mut c, &mut Checkpoints::every(100)).unwrap_err();
        assert!(
            matches!(e, Error::Interrupted { signal: 15, step: 3, ref run_dir } if run_dir == Path::new("run"))
        );
        assert_eq!((c.saves.as_slice(), c.stopped), (&[3][..], true));
        let mut at_end = counter(10, 1, Some(10), true);
        drive(&mut at_end, &mut Checkpoints::every(100)).unwrap();
        assert_eq!(at_end.saves, [10]);
        let mut in_memory = counter(10, 1, Some(3), false);
        drive(&mut in_memory, &mut Checkpoints::every(1)).unwrap();
        assert_eq!((in_memory.done, in_memory.saves.len()), (10, 0));
    }
}
