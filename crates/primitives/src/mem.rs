//! Memory helpers: a cache prefetch hint for code that walks large tables, and a heap warm-up
//! for measured work.

/// Asks for the `lines` cache lines at `ptr` ahead of use, so that several misses overlap
/// instead of each waiting until the code reaches its data. A hint only: any address is
/// allowed, and it changes no result.
#[inline(always)]
pub fn prefetch(ptr: *const u8, lines: usize) {
    #[cfg(target_arch = "x86_64")]
    for line in 0..lines {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        // SAFETY: SSE is part of the x86_64 baseline, and a prefetch is only a hint that never
        // faults, whatever the address.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(ptr.wrapping_add(line * 64).cast()) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (ptr, lines);
}

/// Touches `mib` MiB of newly allocated heap memory, then frees it, and returns how long that
/// took.
///
/// A fresh process's heap grows during its first blocks, and every page it grows by costs a
/// page fault: a zeroed page mapped by the kernel, 1–12 µs each on a virtual machine. A block
/// that allocates tens of megabytes of new memory pays thousands of them (measured: 8,000–18,000
/// in a 1-gigagas block, 100 ms and more of it; `BENCHMARKS.md`). A long-running node's heap has
/// stopped growing. An allocator that keeps freed memory for reuse (mimalloc with the purge
/// delay the `overdrive` binary sets, jemalloc's dirty-page decay) hands these pages out again,
/// so that work started right afterwards runs on a warm heap, as a node's does.
///
/// The memory is written, not just allocated: a zeroed allocation may be fresh pages the
/// allocator never touches. An allocation the allocator refuses ends the warm-up early
/// (less memory is warmed) rather than the process.
pub fn prefault_heap(mib: usize) -> std::time::Duration {
    const CHUNK: usize = 4 << 20;
    let start = std::time::Instant::now();
    let mut chunks: Vec<Vec<u8>> = Vec::new();
    for _ in 0..mib.saturating_mul(1 << 20).div_ceil(CHUNK) {
        let mut chunk = Vec::new();
        if chunk.try_reserve_exact(CHUNK).is_err() {
            break;
        }
        chunk.resize(CHUNK, 1u8);
        chunks.push(chunk);
    }
    // All chunks are live at once, so the allocator's footprint reaches `mib` MiB.
    drop(std::hint::black_box(chunks));
    start.elapsed()
}
