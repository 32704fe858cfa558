//! overdrive-intake: taking transactions into a node in batches instead of one at a time.
//!
//! A node's transaction intake pays per transaction for work that can be shared or spread:
//! sender recovery (one signature check each, independent of the others), validation (one
//! state read per sender, repeated for each of its transactions) and insertion (one pool lock
//! each). This crate holds the parts of a batched intake that do not depend on a node:
//!
//! - [`BatchLimits`]: how many transactions and bytes one batch may hold, checked before any
//!   work is done ([`BatchError`] says which limit and by how much).
//! - [`Intake`]: maps a batch in parallel, in order ([`Intake::map`]), and
//!   runs per-sender work in groups that keep each sender's transactions together and in order,
//!   each group with state of its own such as a database read transaction
//!   ([`Intake::by_sender`]).
//! - [`ReadMemo`]: reads memoised for one batch, so that a sender's account is read once
//!   however many of its transactions the batch holds.
//!
//! The rules a transaction must pass stay the node's: the reth glue runs reth's own decoder,
//! recovery and validator inside these.

mod groups;
mod limits;
mod memo;

pub use groups::{Intake, IntakeConfig, sender_groups};
pub use limits::{BatchError, BatchLimits};
pub use memo::ReadMemo;
