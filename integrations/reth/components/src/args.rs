//! The `--overdrive.*` flags: which components run, and how. Every component is off by default,
//! and with all of them off the node is stock reth.

use clap::{Args, Parser, ValueEnum};
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

/// overdrive's switches, shown under "Overdrive" in `overdrive-reth node --help`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Args)]
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
}

impl OverdriveArgs {
    /// Whether any component is on (otherwise the node is stock reth).
    pub fn any_on(&self) -> bool {
        self.exec == ExecMode::Parallel
    }

    /// One line for the startup log: each component and whether it is on.
    pub fn summary(&self) -> String {
        match self.exec {
            ExecMode::Sequential => "executor: reth (sequential)".to_string(),
            ExecMode::Parallel => format!(
                "executor: overdrive parallel ({} threads)",
                self.exec_threads()
                    .map_or_else(|| "all".to_string(), |n| n.to_string())
            ),
        }
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
        // Every flag takes a value, inline (`--overdrive.exec=parallel`) or next.
        let inline = text.contains('=');
        ours.push(arg);
        if !inline && let Some(value) = args.next() {
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
        assert_eq!(args.summary(), "executor: reth (sequential)");
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
