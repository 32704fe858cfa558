//! The memory side of a measurement: a heap warmed up before the timed work, and how much
//! memory the machine has left and this process holds.

/// Touches `mib` MiB of newly allocated heap memory (rounded up to 4 MiB chunks), then frees
/// it. Returns how many MiB it touched and how long that took.
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
/// allocator never touches. It never takes more than half of the memory the kernel reports
/// available (Linux), so that an oversized request warms less memory instead of waking the
/// out-of-memory killer; an allocation the allocator refuses also ends it early.
pub fn prefault_heap(mib: usize) -> (usize, std::time::Duration) {
    const CHUNK_MIB: usize = 4;
    let start = std::time::Instant::now();
    if mib == 0 {
        return (0, start.elapsed());
    }
    let mib = capped(mib, available_mib());
    let mut chunks: Vec<Vec<u8>> = Vec::new();
    for _ in 0..mib.div_ceil(CHUNK_MIB) {
        let mut chunk = Vec::new();
        if chunk.try_reserve_exact(CHUNK_MIB << 20).is_err() {
            break;
        }
        chunk.resize(CHUNK_MIB << 20, 1u8);
        chunks.push(chunk);
    }
    let touched = chunks.len() * CHUNK_MIB;
    // All chunks are live at once, so the allocator's footprint reaches `touched` MiB.
    drop(std::hint::black_box(chunks));
    (touched, start.elapsed())
}

/// `mib`, but at most half of `available` MiB when that is known.
fn capped(mib: usize, available: Option<usize>) -> usize {
    available.map_or(mib, |available| mib.min(available / 2))
}

/// `MemAvailable` of `/proc/meminfo`, in MiB (`None` where there is no such file).
pub fn available_mib() -> Option<usize> {
    kib_field("/proc/meminfo", "MemAvailable:").map(|kib| kib / 1024)
}

/// This process's resident memory (`VmRSS` of `/proc/self/status`), in MiB (`None` where there
/// is no such file): what long set-ups log, so that a run's memory can be planned.
pub fn resident_mib() -> Option<usize> {
    kib_field("/proc/self/status", "VmRSS:").map(|kib| kib / 1024)
}

/// The KiB figure on the line of `file` that starts with `field`.
fn kib_field(file: &str, field: &str) -> Option<usize> {
    let text = std::fs::read_to_string(file).ok()?;
    let line = text.lines().find(|l| l.starts_with(field))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefault_touches_what_is_asked() {
        assert_eq!(prefault_heap(0).0, 0);
        // Whole chunks: 5 MiB asked is two 4 MiB chunks (unless this machine has < 16 MiB free).
        if available_mib().is_none_or(|available| available >= 16) {
            assert_eq!(prefault_heap(5).0, 8);
        }
    }

    #[test]
    fn prefault_takes_at_most_half_of_the_available_memory() {
        assert_eq!(capped(1024, None), 1024);
        assert_eq!(capped(1024, Some(4096)), 1024);
        assert_eq!(capped(1024, Some(1000)), 500);
        assert_eq!(capped(usize::MAX, Some(0)), 0);
    }

    #[test]
    fn available_and_resident_memory_are_read_on_linux() {
        if cfg!(target_os = "linux") {
            assert!(available_mib().is_some_and(|mib| mib > 0));
            // 64 MiB more held and written shows in the resident figure (half of it, should
            // another test free memory meanwhile).
            let before = resident_mib().expect("VmRSS");
            let held = std::hint::black_box(vec![1u8; 64 << 20]);
            assert!(
                resident_mib().is_some_and(|mib| mib >= before + 32),
                "{before}"
            );
            drop(held);
        }
        assert_eq!(kib_field("/nonexistent", "VmRSS:"), None);
    }
}
