//! overdrive-executor
