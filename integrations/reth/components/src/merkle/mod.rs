//! `--overdrive.merkle-stage`: reth's `MerkleExecute` pipeline stage with the changed storage
//! tries hashed in parallel (one huge trie cut into its subtrees) and committed in chunks a
//! restart resumes from, then the account trie hashed as its subtrees in parallel.
//!
//! Every hash is computed by reth's own trie code (`StorageRoot`, `StateRoot`) over reth's
//! tables, so the rows written are reth's; what this module adds is the order and the threads.

mod progress;
mod stage;
mod subtree;

pub use progress::{PROGRESS_ID, Progress};
pub use stage::{MerkleStageConfig, ParallelMerkleStage};
pub use subtree::{Side, Subtree, SubtreeKeys, SubtreeNodes};
