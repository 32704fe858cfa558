//! The `--overdrive.*` flags: which components run, and how. Every component is off by default,
//! and with all of them off the node is stock reth.

use crate::{
    merkle::MerkleStageConfig,
    state_root::{Prefetch, StateRootConfig},
};
use clap::{Args, Parser, ValueEnum};
use overdrive_intake::BatchLimits;
use std::ffi::OsString;

/// Which executor runs the blocks a node validates or imports.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, ValueEnum)]
pub enum ExecMode {
    /// reth's own executor, one transaction after the other.
    #[default]
    Sequential,
    /// overdrive's parallel executor (payload building stays reth's).
    Parallel,
}

/// Which state root the engine checks each new block against.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, ValueEnum)]
pub enum StateRootMode {
    /// reth's own (its sparse-trie task, or its synchronous root on small machines).
    #[default]
    Reth,
    /// overdrive's parallel trie, kept in memory (payload building stays reth's).
    Overdrive,
}

/// overdrive's switches, shown under "Overdrive" in `overdrive-reth node --help`.
#[derive(Debug, Clone, PartialEq, Eq, Args)]
#[command(next_help_heading = "Overdrive")]
pub struct OverdriveArgs {
    /// The executor of validated and imported blocks (engine, pipeline, backfill, `import`).
    #[arg(
        long = "overdrive.exec",
        value_enum,
        default_value_t,
        value_name = "MODE"
    )]
    pub exec: ExecMode,

    /// Threads of the parallel executor, the committing thread included [default: the
    /// machine's cores].
    #[arg(long = "overdrive.exec.threads", value_name = "N", value_parser = clap::value_parser!(u16).range(1..))]
    pub exec_threads: Option<u16>,

    /// Validate batches of pooled transactions in parallel by sender, and serve
    /// `overdrive_sendRawTransactions` (a list of raw transactions in one call).
    #[arg(long = "overdrive.pool")]
    pub pool: bool,

    /// Threads that recover senders and validate batches [default: the machine's cores].
    #[arg(long = "overdrive.pool.threads", value_name = "N", value_parser = clap::value_parser!(u16).range(1..))]
    pub pool_threads: Option<u16>,

    /// The most transactions one `overdrive_sendRawTransactions` call may carry.
    #[arg(long = "overdrive.pool.max-batch", value_name = "N", default_value_t = BatchLimits::default().max_txs, value_parser = positive)]
    pub pool_max_batch: usize,

    /// Compute the pipeline's state root (`MerkleExecute`) with the changed storage tries
    /// hashed in parallel and committed in chunks a restart resumes from (`import`).
    #[arg(long = "overdrive.merkle-stage")]
    pub merkle_stage: bool,

    /// Threads hashing storage tries in the merkle stage [default: the machine's cores].
    #[arg(long = "overdrive.merkle-stage.threads", value_name = "N", value_parser = clap::value_parser!(u16).range(1..))]
    pub merkle_threads: Option<u16>,

    /// Changed storage slots hashed and committed per chunk of the merkle stage.
    #[arg(long = "overdrive.merkle-stage.chunk-slots", value_name = "N", default_value_t = MerkleStageConfig::default().chunk_slots, value_parser = clap::value_parser!(u64).range(1..))]
    pub merkle_chunk_slots: u64,

    /// A storage trie with at least this many changed slots is hashed as sixteen subtrees.
    #[arg(long = "overdrive.merkle-stage.split-slots", value_name = "N", default_value_t = MerkleStageConfig::default().split_slots, value_parser = clap::value_parser!(u64).range(1..))]
    pub merkle_split_slots: u64,

    /// Never hand a run to reth's serial merkle stage (by default it takes runs on one thread,
    /// and rebuilds from genesis where no storage trie has split-slots changed slots: there it
    /// is faster).
    #[arg(long = "overdrive.merkle-stage.no-fallback")]
    pub merkle_no_fallback: bool,

    /// The state root of the blocks the engine validates (`node`).
    #[arg(
        long = "overdrive.state-root",
        value_enum,
        default_value_t,
        value_name = "ROOT"
    )]
    pub state_root: StateRootMode,

    /// Threads of overdrive's trie [default: the machine's cores].
    #[arg(long = "overdrive.trie.threads", value_name = "N", value_parser = clap::value_parser!(u16).range(1..))]
    pub trie_threads: Option<u16>,

    /// Memory for overdrive's trie nodes, in MiB [default: the whole trie is kept]. The levels
    /// that do not fit are read back from the hashed state tables when a block changes them;
    /// the root of each trie and its children are kept whatever the budget (0 keeps only
    /// those).
    #[arg(long = "overdrive.trie.cache-mb", value_name = "MIB")]
    pub trie_cache_mb: Option<u32>,

    /// Take what a block's root will read while the block executes, on a thread of its own:
    /// with `--overdrive.trie.cache-mb`, read it back from the database; with the whole trie,
    /// bring its nodes into the cache [auto: where reth streams updates to its own state-root
    /// task: five cores or more, or with `--overdrive.engine.state-root-task`].
    #[arg(
        long = "overdrive.trie.prefetch",
        value_enum,
        default_value_t,
        value_name = "WHEN"
    )]
    pub trie_prefetch: Prefetch,

    /// Hash each block's state updates in rounds while the block executes, so that only what
    /// changed since the last round is hashed after it (the whole trie only; it takes the
    /// engine's stream of updates whatever `--overdrive.trie.prefetch` says, and does the
    /// prefetch's work itself).
    #[arg(long = "overdrive.trie.hash-ahead", conflicts_with = "trie_cache_mb")]
    pub trie_hash_ahead: bool,

    /// Run reth's sparse-trie state-root task on machines with fewer than five cores too
    /// (there reth computes the root on one thread after execution): the engine then streams
    /// each transaction's state updates to whichever state root is on.
    #[arg(long = "overdrive.engine.state-root-task")]
    pub state_root_task: bool,
}

fn positive(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(format!("expected a positive number, got {s:?}")),
    }
}

impl Default for OverdriveArgs {
    fn default() -> Self {
        Self {
            exec: ExecMode::default(),
            exec_threads: None,
            pool: false,
            pool_threads: None,
            pool_max_batch: BatchLimits::default().max_txs,
            merkle_stage: false,
            merkle_threads: None,
            merkle_chunk_slots: MerkleStageConfig::default().chunk_slots,
            merkle_split_slots: MerkleStageConfig::default().split_slots,
            merkle_no_fallback: false,
            state_root: StateRootMode::default(),
            trie_threads: None,
            trie_cache_mb: None,
            trie_prefetch: Prefetch::default(),
            trie_hash_ahead: false,
            state_root_task: false,
        }
    }
}

/// The flags that take no value.
const SWITCHES: &[&str] = &[
    "--overdrive.pool",
    "--overdrive.merkle-stage",
    "--overdrive.merkle-stage.no-fallback",
    "--overdrive.engine.state-root-task",
    "--overdrive.trie.hash-ahead",
];

impl OverdriveArgs {
    /// Whether any component is on (otherwise the node is stock reth).
    pub fn any_on(&self) -> bool {
        self.exec == ExecMode::Parallel
            || self.pool
            || self.merkle_stage
            || self.state_root == StateRootMode::Overdrive
    }

    /// Whether `import` must run overdrive's command (a component there is on).
    pub fn import_on(&self) -> bool {
        self.exec_on() || self.merkle_stage
    }

    /// Whether the parallel executor is on (the components that replace reth's executor).
    pub fn exec_on(&self) -> bool {
        self.exec == ExecMode::Parallel
    }

    /// One line for the startup log: each component and whether it is on.
    pub fn summary(&self) -> String {
        let threads = |n: Option<u16>| n.map_or_else(|| "all".to_string(), |n| n.to_string());
        let exec = match self.exec {
            ExecMode::Sequential => "executor: reth (sequential)".to_string(),
            ExecMode::Parallel => format!(
                "executor: overdrive parallel ({} threads)",
                threads(self.exec_threads)
            ),
        };
        let pool = if self.pool {
            format!(
                "pool: overdrive batched ({} threads, batches of at most {})",
                threads(self.pool_threads),
                self.pool_max_batch
            )
        } else {
            "pool: reth".to_string()
        };
        let merkle = if self.merkle_stage {
            format!(
                "merkle stage: overdrive parallel ({} threads{})",
                threads(self.merkle_threads),
                if self.merkle_no_fallback {
                    ", never reth's"
                } else {
                    ", reth's where faster"
                }
            )
        } else {
            "merkle stage: reth".to_string()
        };
        let prefetch = if self.trie_hash_ahead {
            "hashing ahead".to_string()
        } else {
            let prefetch = self.trie_prefetch.to_possible_value();
            format!(
                "prefetch {}",
                prefetch.as_ref().map_or("", |v| v.get_name())
            )
        };
        let root = match self.state_root {
            StateRootMode::Reth => "state root: reth".to_string(),
            StateRootMode::Overdrive => format!(
                "state root: overdrive parallel ({} threads, {}, {prefetch})",
                threads(self.trie_threads),
                match self.trie_cache_mb {
                    Some(mb) => format!("nodes kept to {mb} MiB"),
                    None => "whole trie kept".to_string(),
                }
            ),
        };
        let task = if self.state_root_task {
            "; reth's state-root task on any core count"
        } else {
            ""
        };
        format!("{exec}; {pool}; {merkle}; {root}{task}")
    }

    /// The settings of overdrive's state root, when it is on.
    pub fn state_root_config(&self) -> Option<StateRootConfig> {
        (self.state_root == StateRootMode::Overdrive).then(|| {
            let defaults = StateRootConfig::default();
            StateRootConfig {
                threads: self.trie_threads.map_or(defaults.threads, usize::from),
                cache_mb: self.trie_cache_mb.map(|mb| mb as usize),
                prefetch: self.trie_prefetch,
                hash_ahead: self.trie_hash_ahead,
                ..defaults
            }
        })
    }

    /// The merkle stage's settings from the flags.
    pub fn merkle_config(&self) -> MerkleStageConfig {
        let defaults = MerkleStageConfig::default();
        MerkleStageConfig {
            threads: self.merkle_threads.map_or(defaults.threads, usize::from),
            chunk_slots: self.merkle_chunk_slots,
            split_slots: self.merkle_split_slots,
            fallback: !self.merkle_no_fallback,
            ..defaults
        }
    }

    /// The batch limits of `overdrive_sendRawTransactions`.
    pub fn pool_limits(&self) -> BatchLimits {
        BatchLimits {
            max_txs: self.pool_max_batch,
            ..BatchLimits::default()
        }
    }

    /// `--overdrive.pool.threads`, if given.
    pub fn pool_threads(&self) -> Option<usize> {
        self.pool_threads.map(usize::from)
    }

    /// `--overdrive.exec.threads`, if given.
    pub fn exec_threads(&self) -> Option<usize> {
        self.exec_threads.map(usize::from)
    }
}

/// The flags alone, parsed from the arguments [`split_args`] takes out.
#[derive(Debug, Parser)]
#[command(no_binary_name = true, disable_help_flag = true)]
struct OverdriveOnly {
    #[command(flatten)]
    args: OverdriveArgs,
}

/// Takes the `--overdrive.*` flags (and their values) out of a command line.
///
/// reth's subcommands other than `node` have no extension flags; the launcher takes overdrive's
/// out before reth parses the rest, so that `import`, `stage` and `re-execute` accept them too.
/// Returns the command line without them and the flags, parsed.
pub fn split_args(
    args: impl IntoIterator<Item = OsString>,
) -> Result<(Vec<OsString>, OverdriveArgs), clap::Error> {
    let mut rest = Vec::new();
    let mut ours = Vec::new();
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        let text = arg.to_string_lossy();
        if text == "--" {
            rest.push(arg);
            rest.extend(args.by_ref());
            break;
        }
        if !text.starts_with("--overdrive.") {
            rest.push(arg);
            continue;
        }
        // Every flag but the switches takes a value, inline (`--overdrive.exec=parallel`) or
        // next.
        let takes_next = !text.contains('=') && !SWITCHES.contains(&text.as_ref());
        ours.push(arg);
        if takes_next && let Some(value) = args.next() {
            ours.push(value);
        }
    }
    let parsed = OverdriveOnly::try_parse_from(ours)?;
    Ok((rest, parsed.args))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(line: &str) -> Result<(Vec<String>, OverdriveArgs), clap::Error> {
        split_args(line.split_whitespace().map(OsString::from)).map(|(rest, args)| {
            (
                rest.into_iter().map(|a| a.into_string().unwrap()).collect(),
                args,
            )
        })
    }

    #[test]
    fn flags_come_out_wherever_they_stand() {
        let (rest, args) = split(
            "overdrive-reth import --overdrive.exec parallel --chain g.json --overdrive.exec.threads=3 chain.rlp",
        )
        .unwrap();
        assert_eq!(
            rest,
            ["overdrive-reth", "import", "--chain", "g.json", "chain.rlp"]
        );
        assert_eq!(args.exec, ExecMode::Parallel);
        assert_eq!(args.exec_threads(), Some(3));
        assert!(args.any_on());
    }

    #[test]
    fn no_flags_is_stock_reth() {
        let (rest, args) = split("overdrive-reth node --dev").unwrap();
        assert_eq!(rest, ["overdrive-reth", "node", "--dev"]);
        assert_eq!(args, OverdriveArgs::default());
        assert!(!args.any_on());
        assert_eq!(
            args.summary(),
            "executor: reth (sequential); pool: reth; merkle stage: reth; state root: reth"
        );
    }

    #[test]
    fn the_pool_switch_takes_no_value() {
        let (rest, args) = split(
            "overdrive-reth node --overdrive.pool --dev --overdrive.pool.threads 3 --overdrive.pool.max-batch=500",
        )
        .unwrap();
        assert_eq!(rest, ["overdrive-reth", "node", "--dev"]);
        assert!(args.pool && args.any_on() && !args.exec_on());
        assert_eq!(args.pool_threads(), Some(3));
        assert_eq!(args.pool_limits().max_txs, 500);
        assert_eq!(
            args.summary(),
            "executor: reth (sequential); pool: overdrive batched (3 threads, batches of at most 500); merkle stage: reth; state root: reth"
        );
        assert!(split("overdrive-reth node --overdrive.pool.max-batch 0").is_err());
    }

    #[test]
    fn the_merkle_stage_switch_takes_no_value() {
        let (rest, args) = split(
            "overdrive-reth import --overdrive.merkle-stage chain.rlp --overdrive.merkle-stage.threads 2 --overdrive.merkle-stage.chunk-slots=10",
        )
        .unwrap();
        assert_eq!(rest, ["overdrive-reth", "import", "chain.rlp"]);
        assert!(args.merkle_stage && args.import_on() && !args.exec_on());
        let config = args.merkle_config();
        assert_eq!((config.threads, config.chunk_slots), (2, 10));
        assert_eq!(config.split_slots, MerkleStageConfig::default().split_slots);
        assert!(config.fallback);
        assert!(args.summary().ends_with(
            "merkle stage: overdrive parallel (2 threads, reth's where faster); state root: reth"
        ));
        let (rest, args) = split(
            "overdrive-reth import --overdrive.merkle-stage.no-fallback chain.rlp --overdrive.merkle-stage",
        )
        .unwrap();
        assert_eq!(rest, ["overdrive-reth", "import", "chain.rlp"]);
        assert!(args.merkle_stage && !args.merkle_config().fallback);
        assert!(split("overdrive-reth import --overdrive.merkle-stage.chunk-slots 0").is_err());
    }

    #[test]
    fn the_state_root_takes_a_value() {
        let (rest, args) = split(
            "overdrive-reth node --overdrive.state-root overdrive --dev --overdrive.trie.threads=3",
        )
        .unwrap();
        assert_eq!(rest, ["overdrive-reth", "node", "--dev"]);
        assert!(args.any_on() && !args.import_on());
        assert_eq!(args.state_root_config().map(|c| c.threads), Some(3));
        assert_eq!(args.state_root_config().and_then(|c| c.cache_mb), None);
        assert!(args.summary().ends_with(
            "state root: overdrive parallel (3 threads, whole trie kept, prefetch auto)"
        ));
        let (_, args) = split(
            "overdrive-reth node --overdrive.state-root overdrive --overdrive.trie.cache-mb 512",
        )
        .unwrap();
        assert_eq!(args.state_root_config().and_then(|c| c.cache_mb), Some(512));
        assert!(
            args.summary()
                .ends_with("nodes kept to 512 MiB, prefetch auto)")
        );
        let (_, args) = split(
            "overdrive-reth node --overdrive.state-root overdrive --overdrive.trie.prefetch on",
        )
        .unwrap();
        assert_eq!(
            args.state_root_config().map(|c| c.prefetch),
            Some(Prefetch::On)
        );
        assert!(split("overdrive-reth node --overdrive.trie.prefetch sometimes").is_err());
        let (rest, args) = split(
            "overdrive-reth node --overdrive.state-root overdrive --overdrive.trie.hash-ahead --dev",
        )
        .unwrap();
        assert_eq!(rest, ["overdrive-reth", "node", "--dev"]);
        assert!(args.state_root_config().is_some_and(|c| c.hash_ahead));
        assert!(args.summary().ends_with("whole trie kept, hashing ahead)"));
        assert!(
            split("overdrive-reth node --overdrive.trie.hash-ahead --overdrive.trie.cache-mb 64")
                .is_err()
        );
        assert!(split("overdrive-reth node --overdrive.trie.cache-mb lots").is_err());
        let (_, args) = split("overdrive-reth node --overdrive.state-root reth").unwrap();
        assert_eq!(args.state_root_config(), None);
        assert!(!args.state_root_task);
        let (rest, args) =
            split("overdrive-reth node --overdrive.engine.state-root-task --dev").unwrap();
        assert_eq!(rest, ["overdrive-reth", "node", "--dev"]);
        assert!(args.state_root_task && !args.any_on());
        assert!(
            args.summary()
                .ends_with("state root: reth; reth's state-root task on any core count")
        );
        assert!(split("overdrive-reth node --overdrive.state-root fast").is_err());
        assert!(split("overdrive-reth node --overdrive.trie.threads 0").is_err());
    }

    #[test]
    fn bad_values_are_errors() {
        assert!(split("overdrive-reth node --overdrive.exec fast").is_err());
        assert!(split("overdrive-reth node --overdrive.exec.threads 0").is_err());
        assert!(split("overdrive-reth node --overdrive.nothing 1").is_err());
        assert!(split("overdrive-reth node --overdrive.exec").is_err());
    }

    #[test]
    fn arguments_after_a_double_dash_stay() {
        let (rest, args) = split("overdrive-reth node -- --overdrive.exec parallel").unwrap();
        assert_eq!(
            rest,
            [
                "overdrive-reth",
                "node",
                "--",
                "--overdrive.exec",
                "parallel"
            ]
        );
        assert_eq!(args.exec, ExecMode::Sequential);
    }
}
