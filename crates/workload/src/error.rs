use std::path::PathBuf;

/// Why a workload could not be generated.
#[derive(Debug, thiserror::Error)]
pub enum WorkloadError {
    /// A configuration value is out of range.
    #[error("invalid workload config: {0}")]
    InvalidConfig(String),
    /// A workload kind name that does not exist.
    #[error(
        "unknown workload {0:?}: expected transfer, erc20, uniswap, hybrid, chained, allowance, \
         router, compute or exchange"
    )]
    UnknownKind(String),
    /// The contract artifacts have not been built.
    #[error(
        "contract artifact {path} is missing: run scripts/setup-contracts.sh (or point \
         OVERDRIVE_ARTIFACTS at a directory it built)"
    )]
    MissingArtifacts {
        /// The file that was looked for.
        path: PathBuf,
    },
    /// An artifact file could not be read.
    #[error("cannot read contract artifact {path}: {source}")]
    ArtifactIo {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// An artifact file is not what scripts/setup-contracts.sh writes.
    #[error(
        "contract artifact {path} is malformed: {reason}; rerun scripts/setup-contracts.sh --force"
    )]
    BadArtifact {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The contracts do not behave the way the generator relies on (storage layout, pair
    /// addresses, deployed code).
    #[error("contract check failed: {0}")]
    ContractMismatch(String),
    /// A setup transaction (deployment, pair creation, liquidity) did not succeed.
    #[error("genesis setup step `{step}` failed: {reason}")]
    Setup {
        /// Which step.
        step: String,
        /// The EVM's result or error.
        reason: String,
    },
}
