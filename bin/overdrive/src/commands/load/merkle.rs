//! `overdrive bench merkle`: the pipeline's state root stage (`MerkleExecute`) of reth's
//! `import`, reth's stage against `--overdrive.merkle-stage`, on the same exported chain and
//! binary. The chain is imported in two files, so the stage runs once from genesis (reth
//! rebuilds the trie from the hashed state) and once over the second file's range on top of it
//! (incremental), and each run's time is read from the pipeline's own stage log lines.

use clap::Args;
use eyre::{WrapErr, bail, eyre};
use overdrive_bench::round;
use serde_json::json;
use std::{path::PathBuf, process::Command};

#[derive(Debug, Args)]
pub struct MerkleArgs {
    /// A folder from `overdrive chain export` (genesis.json and chain.rlp).
    #[arg(long)]
    chain: PathBuf,
    /// The overdrive-reth binary (default: $OVERDRIVE_RETH_BIN).
    #[arg(long, value_name = "PATH")]
    reth_bin: Option<PathBuf>,
    /// Threads of overdrive's stage.
    #[arg(long, default_value_t = 2, value_parser = crate::commands::positive)]
    threads: usize,
    /// Never hand a run to reth's stage (`--overdrive.merkle-stage.no-fallback`).
    #[arg(long)]
    no_fallback: bool,
    /// Blocks in the first file [default: half the chain].
    #[arg(long)]
    first: Option<usize>,
    /// Where the datadirs, chain files and logs go.
    #[arg(long, default_value = "merkle-report")]
    out: PathBuf,
    /// End with one JSON line of the figures.
    #[arg(long)]
    json: bool,
}

/// The line overdrive's stage logs when it hands a run to reth's stage.
const HANDED_OVER: &str = "Running reth's merkle stage";

pub fn run(args: MerkleArgs) -> eyre::Result<()> {
    let genesis = args.chain.join("genesis.json");
    let blocks = super::replay::read_chain(&args.chain.join("chain.rlp"))?;
    if blocks.len() < 2 {
        bail!("the chain needs two blocks or more, one for each file");
    }
    let first = args.first.unwrap_or(blocks.len() / 2);
    if first == 0 || first >= blocks.len() {
        bail!(
            "--first must leave blocks in both files (1..{})",
            blocks.len()
        );
    }
    let reth = super::reth_binary(args.reth_bin.clone())?;
    std::fs::create_dir_all(&args.out)?;
    let files = [
        (args.out.join("first.rlp"), &blocks[..first]),
        (args.out.join("second.rlp"), &blocks[first..]),
    ];
    for (path, part) in &files {
        let mut bytes = Vec::new();
        for block in *part {
            alloy_rlp::Encodable::encode(block, &mut bytes);
        }
        std::fs::write(path, bytes)?;
    }
    let threads = args.threads.to_string();
    let mut ours = vec![
        "--overdrive.merkle-stage",
        "--overdrive.merkle-stage.threads",
        &threads,
    ];
    if args.no_fallback {
        ours.push("--overdrive.merkle-stage.no-fallback");
    }
    let modes: [(&str, Vec<&str>); 2] = [("reth", vec![]), ("overdrive", ours)];
    let mut handed_over = 0;
    let mut seconds = Vec::new();
    for (label, flags) in modes {
        let datadir = args.out.join(format!("{label}-data"));
        let _ = std::fs::remove_dir_all(&datadir);
        let init = Command::new(&reth)
            .args(["init", "--color", "never", "--chain"])
            .arg(&genesis)
            .arg("--datadir")
            .arg(&datadir)
            .output()?;
        if !init.status.success() {
            bail!("init failed: {}", String::from_utf8_lossy(&init.stderr));
        }
        let output = Command::new(&reth)
            .args(["import", "--color", "never"])
            .args(&flags)
            .arg("--chain")
            .arg(&genesis)
            .arg("--datadir")
            .arg(&datadir)
            .args(files.iter().map(|(path, _)| path))
            .output()
            .wrap_err("running overdrive-reth import")?;
        let log = String::from_utf8_lossy(&output.stdout);
        let log_path = args.out.join(format!("{label}.log"));
        std::fs::write(&log_path, log.as_bytes())?;
        if !output.status.success() || log.matches("Chain was fully imported").count() != 2 {
            bail!(
                "the {label} import failed ({}); see {}",
                output.status,
                log_path.display()
            );
        }
        let runs = stage_seconds(&log, "MerkleExecute")?;
        if runs.len() != 2 {
            bail!(
                "{}: {} MerkleExecute runs, expected 2",
                log_path.display(),
                runs.len()
            );
        }
        if label == "overdrive" {
            handed_over = log.matches(HANDED_OVER).count();
        }
        println!(
            "{label}: MerkleExecute {:.3} s from genesis (blocks 1..={first}), {:.3} s incremental (blocks {}..={})",
            runs[0],
            runs[1],
            first + 1,
            blocks.len()
        );
        seconds.push(runs);
        let _ = std::fs::remove_dir_all(&datadir);
    }
    let ratio = |i: usize| round(seconds[0][i] / seconds[1][i], 2);
    println!(
        "merkle stage on {} threads: {}x from genesis, {}x incremental (reth's time over overdrive's); {handed_over} of 2 runs handed to reth's stage",
        args.threads,
        ratio(0),
        ratio(1)
    );
    if args.json {
        println!(
            "{}",
            json!({"bench": "merkle", "threads": args.threads, "blocks": blocks.len(), "first": first,
                "reth_s": seconds[0], "overdrive_s": seconds[1],
                "speedup_genesis": ratio(0), "speedup_incremental": ratio(1),
                "handed_to_reth": handed_over})
        );
    }
    Ok(())
}

/// Each run of `stage` in a pipeline log, in seconds: from its first "Preparing stage" line to
/// its "Finished stage" line (a chunked stage prepares once per chunk).
fn stage_seconds(log: &str, stage: &str) -> eyre::Result<Vec<f64>> {
    let tag = format!("stage={stage} ");
    let mut runs = Vec::new();
    let mut started = None;
    for line in log.lines().filter(|line| line.contains(&tag)) {
        let at = || timestamp(line).ok_or_else(|| eyre!("no timestamp in {line:?}"));
        if line.contains("Preparing stage") && started.is_none() {
            started = Some(at()?);
        } else if line.contains("Finished stage") {
            let begin = started
                .take()
                .ok_or_else(|| eyre!("{stage} finished before it started"))?;
            let mut seconds = at()? - begin;
            if seconds < 0.0 {
                seconds += 86_400.0;
            }
            runs.push(seconds);
        }
    }
    Ok(runs)
}

/// Seconds since midnight of a reth log line's RFC 3339 UTC timestamp
/// (`2026-11-27T19:27:00.907196Z  INFO ...`).
fn timestamp(line: &str) -> Option<f64> {
    let time = line
        .split_whitespace()
        .next()?
        .split('T')
        .nth(1)?
        .strip_suffix('Z')?;
    let mut parts = time.split(':');
    let hours: f64 = parts.next()?.parse().ok()?;
    let minutes: f64 = parts.next()?.parse().ok()?;
    let seconds: f64 = parts.next()?.parse().ok()?;
    Some(hours * 3600.0 + minutes * 60.0 + seconds)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stage_runs_are_read_from_the_pipeline_log() {
        let log = "\
2026-11-27T19:27:00.500000Z  INFO Preparing stage pipeline_stages=8/13 stage=MerkleExecute checkpoint=0 target=4
2026-11-27T19:27:00.600000Z  INFO Hashed storage tries from_block=1 to_block=4
2026-11-27T19:27:00.700000Z  INFO Preparing stage pipeline_stages=8/13 stage=MerkleExecute checkpoint=0 target=4
2026-11-27T19:27:01.750000Z  INFO Finished stage pipeline_stages=8/13 stage=MerkleExecute checkpoint=4 target=4
2026-11-27T19:27:01.800000Z  INFO Finished stage pipeline_stages=9/13 stage=MerkleExecuteX checkpoint=4 target=4
2026-11-27T23:59:59.000000Z  INFO Preparing stage pipeline_stages=8/13 stage=MerkleExecute checkpoint=4 target=8
2026-11-28T00:00:01.500000Z  INFO Finished stage pipeline_stages=8/13 stage=MerkleExecute checkpoint=8 target=8
";
        let runs = stage_seconds(log, "MerkleExecute").unwrap();
        assert_eq!(runs.len(), 2);
        assert!((runs[0] - 1.25).abs() < 1e-6, "{runs:?}");
        assert!((runs[1] - 2.5).abs() < 1e-6, "{runs:?}");
        assert!(stage_seconds("x Finished stage stage=MerkleExecute ", "MerkleExecute").is_err());
    }
}
