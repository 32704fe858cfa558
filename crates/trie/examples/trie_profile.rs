//! Temporary profiling harness (not part of the deliverable).
use overdrive_trie::bench::profile_only;
fn main() {
    let args: Vec<usize> = std::env::args().skip(1).map(|a| a.parse().unwrap()).collect();
    profile_only(args[0], args[1], args[2]);
}
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
