//! overdrive-bench: the measurement machinery of `overdrive bench`, kept out of the component
//! crates so that a component carries no benchmark code.
//!
//! - [`trie`]: the `bench trie` workload, overdrive's trie against a full `HashBuilder`
//!   rebuild and a reth-style serial incremental root, with its co-run yardstick and cache
//!   eviction.
//! - [`process_cpu_time`] (behind every `cpu_ratio`) and [`core_round_trip`] /
//!   [`RoundTrips`]: the state of the machine a parallel figure was taken in.
//! - [`prefault_heap`]: warms a fresh process's heap before measured work, as a long-running
//!   node's is; [`available_mib`], [`resident_mib`]: memory to plan a run by.
//! - [`round`]: a figure to the decimals a report prints.

mod cores;
mod error;
mod mem;
pub mod trie;

pub use cores::{ROUND_TRIPS, RoundTrips, core_round_trip, process_cpu_time};
pub use error::BenchError;
pub use mem::{available_mib, prefault_heap, resident_mib};

/// `x` to `digits` decimals: the figures a report prints, without float noise in the last
/// places (`97.02098500000001`).
pub fn round(x: f64, digits: i32) -> f64 {
    let scale = 10f64.powi(digits);
    (x * scale).round() / scale
}
