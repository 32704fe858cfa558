pub fn run(_: BenchCommand) -> eyre::Result<()> { Ok(()) }
#[derive(Debug, clap::Subcommand)] pub enum BenchCommand {}
