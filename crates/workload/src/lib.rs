//! overdrive-workload
