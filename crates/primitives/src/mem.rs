//! A cache prefetch hint for code that walks large tables.

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
