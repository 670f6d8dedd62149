//! A global allocator that aligns every large block to a cache line.
//!
//! Why: the parameters, momenta, gradients and activation buffers are plain `Vec<f32>`s
//! (candle's CPU storage among them), which the system allocator aligns to 16 bytes. The
//! AVX-512 kernels read and write them 64 bytes at a time, so on a 16-byte boundary every
//! vector access touches two cache lines, and where a buffer happens to land decided the
//! speed of a run: two builds of the same step differed by 3% with W₂ 0 or 48 bytes past
//! a line. With every large block aligned, 784-400-400-10 at batch 100 runs 8–10% faster
//! than either (interleaved, `docs/BENCHMARKS.md`).
//! Blocks of at least [`LARGE`] bytes are allocated 64-byte aligned; small ones are left
//! as they are.

use std::alloc::{GlobalAlloc, Layout, System};

/// Blocks at least this large (bytes) are cache-line aligned.
pub const LARGE: usize = 4096;
const LINE: usize = 64;

/// [`System`], with blocks of [`LARGE`] bytes or more aligned to 64 bytes.
pub struct CacheLineAligned;

fn adjust(layout: Layout) -> Layout {
    if layout.size() >= LARGE && layout.align() < LINE {
        // Fails only for sizes within 64 bytes of isize::MAX: the original layout then
        // (`adjust` stays a function of the layout, as dealloc needs).
        Layout::from_size_align(layout.size(), LINE).unwrap_or(layout)
    } else {
        layout
    }
}

// SAFETY: every call forwards to `System` with one layout per block, the same at
// allocation and at release (`adjust` is a function of the size and alignment, and
// `realloc` moves a block whose adjusted alignment changes).
unsafe impl GlobalAlloc for CacheLineAligned {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        unsafe { System.alloc(adjust(layout)) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        unsafe { System.alloc_zeroed(adjust(layout)) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, adjust(layout)) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        unsafe {
            let old = adjust(layout);
            let Ok(requested) = Layout::from_size_align(new_size, layout.align()) else {
                return std::ptr::null_mut();
            };
            let new = adjust(requested);
            if old.align() == new.align() {
                return System.realloc(ptr, old, new_size);
            }
            let moved = System.alloc(new);
            if !moved.is_null() {
                std::ptr::copy_nonoverlapping(ptr, moved, layout.size().min(new_size));
                System.dealloc(ptr, old);
            }
            moved
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn large_blocks_are_aligned_and_contents_survive_realloc() {
        let a = CacheLineAligned;
        unsafe {
            let small = Layout::from_size_align(100, 4).unwrap();
            let p = a.alloc(small);
            assert!(!p.is_null());
            for i in 0..100 {
                *p.add(i) = i as u8;
            }
            // Small → large: moved to an aligned block, contents kept.
            let q = a.realloc(p, small, 10_000);
            assert_eq!(q as usize % LINE, 0);
            assert!((0..100).all(|i| *q.add(i) == i as u8));
            let large = Layout::from_size_align(10_000, 4).unwrap();
            // Large → larger: stays aligned.
            let r = a.realloc(q, large, 50_000);
            assert_eq!(r as usize % LINE, 0);
            assert!((0..100).all(|i| *r.add(i) == i as u8));
            // Large → small: contents kept.
            let larger = Layout::from_size_align(50_000, 4).unwrap();
            let s = a.realloc(r, larger, 50);
            assert!((0..50).all(|i| *s.add(i) == i as u8));
            a.dealloc(s, Layout::from_size_align(50, 4).unwrap());
            let z = a.alloc_zeroed(large);
            assert_eq!(z as usize % LINE, 0);
            assert!((0..10_000).all(|i| *z.add(i) == 0));
            a.dealloc(z, large);
        }
    }
}
