//! `overdrive`: runs overdrive's components. Subcommands: `init` (genesis), `ef-tests`
//! (ethereum/tests fixtures), `bench exec` and `bench trie` (measured comparisons against the
//! references).

mod commands;

/// reth ships jemalloc; the system allocator makes cross-thread frees (a worker allocates state
/// changes, the committer frees them) dominate the parallel executor's profile.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "overdrive",
    version,
    about = "Drop-in performance components for reth"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Log filter (RUST_LOG syntax), e.g. `info` or `overdrive=debug`.
    #[arg(long, global = true, default_value = "info", env = "RUST_LOG")]
    log: String,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Build the genesis block of a chain and print its hash and state root.
    Init(commands::init::InitArgs),
    /// Run ethereum/tests BlockchainTests fixtures.
    #[command(name = "ef-tests")]
    EfTests(commands::ef_tests::EfTestsArgs),
    /// Benchmarks: new vs reference, same data, same process.
    #[command(subcommand)]
    Bench(commands::bench::BenchCommand),
}

/// Where the setup scripts put contract artifacts and the mainnet allocation.
fn artifacts_dir() -> std::path::PathBuf {
    std::env::var_os("OVERDRIVE_ARTIFACTS")
        .map(Into::into)
        .unwrap_or_else(|| concat!(env!("CARGO_MANIFEST_DIR"), "/../../build-artifacts").into())
}

/// mimalloc's `purge_delay` option (index in `mi_option_e`, the same in mimalloc v2 and v3).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Sets up the allocator for block processing, before any other thread exists.
///
/// - Freed memory is kept for 10 s before it goes back to the OS (mimalloc's default is 1 s or
///   less). Every block allocates and frees tens of megabytes; returned pages cost the next
///   block a page fault and a zeroed page each again. 10 s is jemalloc's default dirty-page
///   decay, which reth runs with. An operator's `MIMALLOC_PURGE_DELAY` wins.
/// - Transparent huge pages are turned off for the process (`PR_SET_THP_DISABLE`). mimalloc
///   asks for them on its arenas, and on a fragmented host the kernel then compacts memory
///   inside the page fault: `bench exec` saw 5–40 ms stalls at the start or end of about one
///   block in five (a 25–40 ms block), none without. Setting `MIMALLOC_ALLOW_THP` (either
///   value) leaves THP to mimalloc.
fn tune_allocator() {
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
        // SAFETY: `mi_option_set` only stores the value in mimalloc's option table; it is
        // called before any other thread exists, and the option index is a valid one.
        unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, 10_000) };
    }
    #[cfg(target_os = "linux")]
    if std::env::var_os("MIMALLOC_ALLOW_THP").is_none() {
        // SAFETY: PR_SET_THP_DISABLE takes plain integer arguments and only sets a flag of
        // this process; a failure (an old kernel) leaves THP as it was, which is harmless.
        let rc = unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
        if rc != 0 {
            eprintln!("overdrive: could not disable transparent huge pages (prctl failed)");
        }
    }
}

fn main() -> eyre::Result<()> {
    tune_allocator();
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_new(&cli.log)?)
        .with_writer(std::io::stderr)
        .init();
    match cli.command {
        Command::Init(args) => commands::init::run(args),
        Command::EfTests(args) => commands::ef_tests::run(args),
        Command::Bench(cmd) => commands::bench::run(cmd),
    }
}

#[cfg(test)]
mod tests {
    use super::Cli;
    use clap::{CommandFactory, Parser};

    #[test]
    fn cli_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn zero_counts_and_oversized_prefaults_are_refused() {
        let refused = [
            &["bench", "exec", "--threads", "0"][..],
            &["bench", "exec", "--blocks", "0"],
            &["bench", "exec", "--txs", "0"],
            &["bench", "exec", "--repeat", "0"],
            &["bench", "trie", "--threads", "0"],
            &["bench", "trie", "--blocks", "0"],
            &["bench", "trie", "--transfers", "0"],
            &["ef-tests", "x.json", "--threads", "0"],
            &["ef-tests", "x.json", "--trie-threads", "0"],
            &["bench", "exec", "--prefault-heap", "70000"],
            &["bench", "trie", "--prefault-heap", "-1"],
        ];
        for args in refused {
            let argv = std::iter::once("overdrive").chain(args.iter().copied());
            assert!(Cli::try_parse_from(argv).is_err(), "{args:?} was accepted");
        }
        for args in [
            &[
                "bench",
                "exec",
                "--threads",
                "1",
                "--blocks",
                "1",
                "--txs",
                "1",
            ][..],
            &["bench", "trie", "--threads", "1", "--blocks", "1"],
            &["bench", "exec", "--prefault-heap", "0"],
            &["bench", "trie", "--prefault-heap", "65536"],
            &[
                "ef-tests",
                "x.json",
                "--threads",
                "1",
                "--trie-threads",
                "1",
            ],
        ] {
            let argv = std::iter::once("overdrive").chain(args.iter().copied());
            assert!(Cli::try_parse_from(argv).is_ok(), "{args:?} was refused");
        }
    }
}
