use overdrive_trie::TrieError;

/// Why a benchmark could not run or could not trust its figures.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// The configuration cannot be run (zero blocks, more memory than the machine has, ...).
    #[error("invalid benchmark configuration: {0}")]
    InvalidConfig(String),
    /// The compared implementations disagreed, or a measured run broke an assumption.
    #[error("benchmark invariant broken: {0}")]
    Invariant(&'static str),
    /// The component under measurement failed.
    #[error(transparent)]
    Trie(#[from] TrieError),
}
