//! The process's allocator and how it is tuned for block processing.

/// reth ships jemalloc; the system allocator makes cross-thread frees (a worker allocates state
/// changes, the committer frees them) dominate the parallel executor's profile.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// mimalloc's `purge_delay` option (index in `mi_option_e`, the same in mimalloc v2 and v3).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Sets up the allocator for block processing, before any other thread exists.
///
/// - Freed memory is kept for 10 s before it goes back to the OS (mimalloc's default: 10 ms in
///   the v2 this build links, 1 s in v3). Every block allocates and frees tens of megabytes;
///   returned pages cost the next block a page fault and a zeroed page each again. 10 s is jemalloc's default dirty-page
///   decay, which reth runs with. An operator's `MIMALLOC_PURGE_DELAY` wins.
/// - Transparent huge pages are turned off for the process (`PR_SET_THP_DISABLE`). mimalloc
///   asks for them on its arenas, and on a fragmented host the kernel then compacts memory
///   inside the page fault: `bench exec` saw 5–40 ms stalls at the start or end of about one
///   block in five (a 25–40 ms block), none without. Setting `MIMALLOC_ALLOW_THP` (either
///   value) leaves THP to mimalloc.
pub(crate) fn tune() {
    set_purge_delay(10_000);
    #[cfg(target_os = "linux")]
    if std::env::var_os("MIMALLOC_ALLOW_THP").is_none() {
        // SAFETY: PR_SET_THP_DISABLE takes plain integer arguments and only sets a flag of
        // this process; a failure (an old kernel) leaves THP as it was, which is harmless.
        let rc = unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
        if rc != 0 {
            eprintln!("overdrive: could not disable transparent huge pages (prctl failed)");
        }
    }
}

/// Keeps every freed page with the process until it exits, for a benchmark that measures
/// blocks on a warm heap (`--prefault-heap`). A benchmark's blocks are a second or more apart
/// (it runs the references too) and its set-up frees gigabytes; with the 10 s delay, pages
/// freed long before went back to the OS in the middle of the measured blocks: the two-thread
/// trie took 100–1,800 page faults a block at 1M accounts (after a 1 GiB prefault), and 0–500
/// with purging off. Call it before other threads exist. An operator's `MIMALLOC_PURGE_DELAY`
/// wins.
pub(crate) fn keep_freed_memory() {
    set_purge_delay(-1);
}

fn set_purge_delay(ms: std::ffi::c_long) {
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
        // SAFETY: `mi_option_set` only stores the value in mimalloc's option table; it is
        // called before any other thread exists, and the option index is a valid one.
        unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, ms) };
    }
}
