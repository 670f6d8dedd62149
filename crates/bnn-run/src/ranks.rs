//! The processes of a run: one, or the ranks of an MPI job (feature `mpi`, Open MPI through
//! rsmpi, started by `mpirun`). The training loop sees only this: which rank it is, how many
//! there are, a barrier, bytes gathered to rank 0 in rank order, and numbers gathered to
//! every rank. Only the thread that made the [`Ranks`] calls MPI (`MPI_THREAD_FUNNELED`):
//! the pool's threads never do.

use crate::error::{Error, Result};

/// This process's place among the run's processes.
pub struct Ranks {
    rank: usize,
    size: usize,
    #[cfg(feature = "mpi")]
    mpi: Option<Mpi>,
}

#[cfg(feature = "mpi")]
struct Mpi {
    // Dropping the universe finalises MPI: it lives as long as the `Ranks`.
    _universe: mpi::environment::Universe,
    world: mpi::topology::SimpleCommunicator,
}

impl Ranks {
    /// One process: rank 0 of 1.
    pub fn single() -> Self {
        Self {
            rank: 0,
            size: 1,
            #[cfg(feature = "mpi")]
            mpi: None,
        }
    }

    /// The MPI world when this process was started by an MPI launcher (Open MPI's or a PMI
    /// one's variables are set), else one process. Without feature `mpi` a launcher's
    /// variables are an error: R copies would each train every chain into the same folder.
    pub fn from_environment() -> Result<Self> {
        let launched = ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"]
            .iter()
            .any(|v| std::env::var_os(v).is_some());
        if !launched {
            return Ok(Self::single());
        }
        Self::init_mpi()
    }

    #[cfg(feature = "mpi")]
    fn init_mpi() -> Result<Self> {
        use mpi::traits::Communicator;
        let (universe, _) = mpi::initialize_with_threading(mpi::Threading::Funneled)
            .ok_or_else(|| Error::Config("MPI was already initialised".into()))?;
        let world = universe.world();
        Ok(Self {
            rank: world.rank() as usize,
            size: world.size() as usize,
            mpi: Some(Mpi {
                _universe: universe,
                world,
            }),
        })
    }

    #[cfg(not(feature = "mpi"))]
    fn init_mpi() -> Result<Self> {
        let size = std::env::var("OMPI_COMM_WORLD_SIZE")
            .or_else(|_| std::env::var("PMI_SIZE"))
            .unwrap_or_default();
        if size.is_empty() || size == "1" {
            return Ok(Self::single());
        }
        Err(Error::Config(format!(
            "started by an MPI launcher ({size} processes) but built without MPI: \
             build with `cargo build --release --features mpi`"
        )))
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Processes in the job.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Whether this is rank 0.
    pub fn is_root(&self) -> bool {
        self.rank == 0
    }

    /// Items `0..count` dealt round-robin: item k belongs to rank k mod R, so that with K
    /// chains on R ranks no rank holds more than ⌈K/R⌉.
    pub fn dealt(&self, count: usize) -> Vec<usize> {
        (0..count)
            .filter(|&k| self.rank_of(k) == self.rank)
            .collect()
    }

    /// The rank that item k is dealt to (see [`Ranks::dealt`]).
    pub fn rank_of(&self, k: usize) -> usize {
        k % self.size
    }

    /// Waits for every rank.
    pub fn barrier(&self) {
        #[cfg(feature = "mpi")]
        if let Some(m) = &self.mpi {
            use mpi::traits::CommunicatorCollectives;
            m.world.barrier();
        }
    }

    /// Each rank's bytes at rank 0, in rank order (`None` on the other ranks).
    pub fn gather(&self, mine: Vec<u8>) -> Option<Vec<Vec<u8>>> {
        #[cfg(feature = "mpi")]
        if let Some(m) = &self.mpi {
            use mpi::traits::{Communicator, Destination, Source};
            if self.rank != 0 {
                m.world.process_at_rank(0).send(&mine[..]);
                return None;
            }
            let mut all = vec![mine];
            for r in 1..self.size {
                let (bytes, _) = m.world.process_at_rank(r as i32).receive_vec::<u8>();
                all.push(bytes);
            }
            return Some(all);
        }
        Some(vec![mine])
    }

    /// Every rank's numbers at every rank, in rank order (MPI_Allgatherv: the lengths
    /// first, then the numbers, exact).
    pub fn all_gather(&self, mine: &[f64]) -> Vec<Vec<f64>> {
        #[cfg(feature = "mpi")]
        if let Some(m) = &self.mpi {
            use mpi::datatype::PartitionMut;
            use mpi::traits::CommunicatorCollectives;
            use mpi::Count;
            let mut counts = vec![0 as Count; self.size];
            m.world
                .all_gather_into(&(mine.len() as Count), &mut counts[..]);
            let displs: Vec<Count> = counts
                .iter()
                .scan(0, |at, &c| {
                    let d = *at;
                    *at += c;
                    Some(d)
                })
                .collect();
            let total = counts.iter().map(|&c| c as usize).sum();
            let mut all = vec![0f64; total];
            {
                let mut parts = PartitionMut::new(&mut all[..], &counts[..], &displs[..]);
                m.world.all_gather_varcount_into(mine, &mut parts);
            }
            return counts
                .iter()
                .zip(&displs)
                .map(|(&c, &d)| all[d as usize..(d + c) as usize].to_vec())
                .collect();
        }
        vec![mine.to_vec()]
    }

    /// Whether `flag` holds on any rank (every rank gets the same answer).
    pub fn any(&self, flag: bool) -> bool {
        self.all_gather(&[f64::from(u8::from(flag))])
            .iter()
            .any(|v| v.first().is_some_and(|&x| x != 0.0))
    }

    /// Stops every rank of the job (MPI_Abort; the launcher names this rank). One process:
    /// exits with `code`.
    pub fn abort(&self, code: i32) -> ! {
        #[cfg(feature = "mpi")]
        if let Some(m) = &self.mpi {
            use mpi::traits::Communicator;
            m.world.abort(code);
        }
        std::process::exit(code)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_process_holds_every_item_and_gathers_its_own() {
        let r = Ranks::single();
        assert_eq!(r.dealt(3), vec![0, 1, 2]);
        assert_eq!(r.gather(vec![7]), Some(vec![vec![7]]));
        assert_eq!(r.all_gather(&[1.5, 2.0]), vec![vec![1.5, 2.0]]);
        assert!(r.any(true) && !r.any(false));
    }

    #[test]
    fn items_are_dealt_round_robin() {
        let deal = |rank, size| {
            Ranks {
                rank,
                size,
                #[cfg(feature = "mpi")]
                mpi: None,
            }
            .dealt(5)
        };
        assert_eq!(deal(0, 2), vec![0, 2, 4]);
        assert_eq!(deal(1, 2), vec![1, 3]);
        assert_eq!(deal(2, 3), vec![2]);
    }
}
