//! `overdrive`: runs overdrive's components. Subcommands: `init` (genesis), `ef-tests`
//! (ethereum/tests fixtures), `bench exec` and `bench trie` (measured comparisons against the
//! references), `chain export` (generated chains for other clients to import). `--metrics
//! <ADDR>` serves the components' Prometheus metrics meanwhile.

mod allocator;
mod commands;
mod metrics;

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
    /// Serve Prometheus metrics (the executors' and the trie's) at this address, e.g.
    /// `127.0.0.1:9001`, while the command runs.
    #[arg(long, global = true, value_name = "ADDR")]
    metrics: Option<std::net::SocketAddr>,
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
    /// Generated chains for other clients: `chain export`.
    #[command(subcommand)]
    Chain(commands::chain::ChainCommand),
}

/// Where the setup scripts put contract artifacts and the mainnet allocation.
fn artifacts_dir() -> std::path::PathBuf {
    std::env::var_os("OVERDRIVE_ARTIFACTS")
        .map(Into::into)
        .unwrap_or_else(|| concat!(env!("CARGO_MANIFEST_DIR"), "/../../build-artifacts").into())
}

fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            // The cause chain on one line (`{:#}`), without the source locations eyre's debug
            // form adds: those are for whoever debugs overdrive, not for its user.
            eprintln!("Error: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run() -> eyre::Result<()> {
    allocator::tune();
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_new(&cli.log)?)
        .with_writer(std::io::stderr)
        // Colour only on a terminal: a log redirected to a file stays plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    if let Some(addr) = cli.metrics {
        metrics::serve(addr)?;
    }
    match cli.command {
        Command::Init(args) => commands::init::run(args),
        Command::EfTests(args) => commands::ef_tests::run(args),
        Command::Bench(cmd) => commands::bench::run(cmd),
        Command::Chain(cmd) => commands::chain::run(cmd),
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
