//! Which instruction-set path the CPU kernels take: AVX-512, AVX2+FMA or portable Rust.
//!
//! Chosen once per process from the CPU's features and capped by `BNN_ISA=avx512|avx2|
//! portable` (as oneDNN's `ONEDNN_MAX_CPU_ISA` caps its kernels), so that every path can
//! be run, tested and timed on a machine that has a better one. A cap above what the CPU
//! has selects the best the CPU has. Tests can run one thread's kernels on another path
//! with [`with`].
//!
//! What differs between paths, and what does not (docs/DESIGN.md, "Kernel paths"): the
//! products sum each element in the same order with fused multiply-adds on avx512 and
//! avx2, so both give the same bits; the portable products use fused multiply-adds only
//! where the compilation target has them (aarch64, or x86-64 built with FMA), otherwise
//! a·b + c in two roundings. The sampler updates and their noise are the same bits on
//! every path.

use std::cell::Cell;
use std::sync::OnceLock;

use crate::error::{Error, Result};

/// The environment variable that caps the path.
pub const ENV: &str = "BNN_ISA";

/// A kernel path, ordered from the most portable to the widest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Isa {
    /// Plain Rust over fixed-width lane arrays that the compiler vectorises (SSE2 on
    /// x86-64, NEON on aarch64).
    Portable,
    /// 256-bit AVX2 with FMA (Intel since Haswell, AMD since Zen).
    Avx2,
    /// 512-bit AVX-512 F/DQ/VL/BW with FMA (Intel Xeon since Skylake-SP, AMD since Zen 4).
    Avx512,
}

impl Isa {
    /// Every path, most portable first.
    pub const ALL: [Isa; 3] = [Isa::Portable, Isa::Avx2, Isa::Avx512];

    /// The name `BNN_ISA` takes and reports show.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Portable => "portable",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
        }
    }

    /// The path named `s` (as [`Isa::name`] writes it).
    pub fn parse(s: &str) -> Option<Isa> {
        Isa::ALL.into_iter().find(|i| i.name() == s.trim())
    }

    /// Whether this CPU can run the path.
    pub fn supported(self) -> bool {
        match self {
            Isa::Portable => true,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => {
                std::arch::is_x86_feature_detected!("avx2")
                    && std::arch::is_x86_feature_detected!("fma")
            }
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => {
                Isa::Avx2.supported()
                    && std::arch::is_x86_feature_detected!("avx512f")
                    && std::arch::is_x86_feature_detected!("avx512dq")
                    && std::arch::is_x86_feature_detected!("avx512vl")
                    && std::arch::is_x86_feature_detected!("avx512bw")
            }
            #[cfg(not(target_arch = "x86_64"))]
            Isa::Avx2 | Isa::Avx512 => false,
        }
    }

    /// The widest path this CPU runs.
    pub fn best() -> Isa {
        static BEST: OnceLock<Isa> = OnceLock::new();
        *BEST.get_or_init(|| {
            Isa::ALL
                .into_iter()
                .rev()
                .find(|i| i.supported())
                .unwrap_or(Isa::Portable)
        })
    }

    /// Every path this CPU runs, most portable first (what the kernel tests iterate over).
    pub fn available() -> Vec<Isa> {
        Isa::ALL.into_iter().filter(|i| i.supported()).collect()
    }
}

impl std::fmt::Display for Isa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The cap `BNN_ISA` sets, if any; an unknown value is an error naming the choices.
pub fn cap_from_env() -> Result<Option<Isa>> {
    match std::env::var(ENV) {
        Err(std::env::VarError::NotPresent) => Ok(None),
        Ok(s) if s.trim().is_empty() => Ok(None),
        Ok(s) => Isa::parse(&s).map(Some).ok_or_else(|| {
            Error::Config(format!(
                "{ENV}={s:?} is not a kernel path: use avx512, avx2 or portable"
            ))
        }),
        Err(e) => Err(Error::Config(format!("{ENV}: {e}"))),
    }
}

/// The path of this process: the best the CPU has, capped by `BNN_ISA`. Decided on first
/// use. (The binary checks `BNN_ISA` with [`cap_from_env`] before anything runs; a bad
/// value that reaches this point is ignored with a warning.)
pub fn selected() -> Isa {
    static SELECTED: OnceLock<Isa> = OnceLock::new();
    *SELECTED.get_or_init(|| {
        let best = Isa::best();
        match cap_from_env() {
            Ok(Some(cap)) => cap.min(best),
            Ok(None) => best,
            Err(e) => {
                tracing::warn!("{e}; using {best}");
                best
            }
        }
    })
}

thread_local! {
    /// A path set for this thread by [`with`].
    static OVERRIDE: Cell<Option<Isa>> = const { Cell::new(None) };
}

/// The path the kernels called from this thread take: [`selected`], or the one [`with`]
/// set. Read once per kernel call on the calling thread and handed to its helpers.
pub fn current() -> Isa {
    OVERRIDE.get().unwrap_or_else(selected)
}

/// Runs `f` with this thread's kernels on `isa` (capped at what the CPU has): how tests
/// run every path in one process.
pub fn with<R>(isa: Isa, f: impl FnOnce() -> R) -> R {
    struct Restore(Option<Isa>);
    impl Drop for Restore {
        fn drop(&mut self) {
            OVERRIDE.set(self.0);
        }
    }
    let _restore = Restore(OVERRIDE.replace(Some(isa.min(Isa::best()))));
    f()
}

/// Defines `fn name(args) { body }` compiled three times — for the build's baseline, for
/// AVX2 + FMA and for AVX-512 — and run on [`current`]'s path, so that the compiler's own
/// loops (the per-element and per-plane passes of the hand-written network passes) are
/// 8 or 16 lanes wide where the CPU has them, where an x86-64 build's baseline is SSE2.
/// Rust never contracts a·b + c into a fused multiply-add on its own and vectorises no
/// float reduction it would have to reorder, so every build gives the same bits. What
/// the body calls should be `#[inline(always)]` to be compiled with it.
macro_rules! multiversion {
    ($(#[$meta:meta])* $vis:vis fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $body:block) => {
        $crate::isa::multiversion! {
            $(#[$meta])* $vis fn $name($($arg: $ty),*) -> () $body
        }
    };
    ($(#[$meta:meta])* $vis:vis fn $name:ident($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty
        $body:block) => {
        $(#[$meta])*
        #[allow(clippy::too_many_arguments, clippy::unused_unit)]
        $vis fn $name($($arg: $ty),*) -> $ret {
            #[inline(always)]
            #[allow(clippy::too_many_arguments, clippy::unused_unit)]
            fn body($($arg: $ty),*) -> $ret $body
            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx2,fma")]
            #[allow(clippy::too_many_arguments, clippy::unused_unit)]
            unsafe fn avx2($($arg: $ty),*) -> $ret {
                body($($arg),*)
            }
            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx512f,avx512dq,avx512vl,avx512bw,avx2,fma")]
            #[allow(clippy::too_many_arguments, clippy::unused_unit)]
            unsafe fn avx512($($arg: $ty),*) -> $ret {
                body($($arg),*)
            }
            match $crate::isa::current() {
                // SAFETY: `current` is at most what the CPU has.
                #[cfg(target_arch = "x86_64")]
                $crate::isa::Isa::Avx512 => unsafe { avx512($($arg),*) },
                // SAFETY: as above.
                #[cfg(target_arch = "x86_64")]
                $crate::isa::Isa::Avx2 => unsafe { avx2($($arg),*) },
                _ => body($($arg),*),
            }
        }
    };
}
pub(crate) use multiversion;

/// Asks for the cache lines of `bytes` ahead of their use (no-op off x86-64).
#[inline]
pub fn prefetch(bytes: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    for line in bytes.chunks(64) {
        // SAFETY: a prefetch is a hint; it never faults and the address is inside `bytes`.
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                line.as_ptr() as *const i8
            )
        };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = bytes;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_paths_are_ordered() {
        for isa in Isa::ALL {
            assert_eq!(Isa::parse(isa.name()), Some(isa));
        }
        assert_eq!(Isa::parse("sse"), None);
        assert!(Isa::Portable < Isa::Avx2 && Isa::Avx2 < Isa::Avx512);
        assert!(Isa::Portable.supported());
        assert!(Isa::available().contains(&Isa::best()));
    }

    #[test]
    fn with_caps_this_thread_only_and_restores() {
        let before = current();
        with(Isa::Portable, || {
            assert_eq!(current(), Isa::Portable);
            let other = std::thread::spawn(current).join().expect("thread");
            assert_eq!(other, selected());
            with(Isa::Avx512, || assert_eq!(current(), Isa::best()));
            assert_eq!(current(), Isa::Portable);
        });
        assert_eq!(current(), before);
    }
}
