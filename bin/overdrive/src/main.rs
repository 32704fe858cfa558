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

fn main() -> eyre::Result<()> {
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
