use clap::Args;
use eyre::{WrapErr, bail};
use overdrive_primitives::{ChainSpec, MemState};
use std::path::PathBuf;

#[derive(Debug, Args)]
pub struct InitArgs {
    /// `mainnet`, `dev`, or a path to a geth-style genesis.json.
    #[arg(long, default_value = "dev")]
    chain: String,
    /// Data directory to initialise.
    #[arg(long)]
    datadir: PathBuf,
}

/// Computes the genesis block, records it in the data directory, prints hash and root.
///
/// Re-running on the same directory with the same chain is a no-op; a different chain is
/// refused so a data directory never mixes two chains.
pub fn run(args: InitArgs) -> eyre::Result<()> {
    let spec = match args.chain.as_str() {
        "mainnet" => {
            let alloc = crate::artifacts_dir().join("mainnet-alloc.json");
            if alloc.exists() {
                ChainSpec::mainnet_with_alloc_file(&alloc)?
            } else {
                ChainSpec::mainnet()
            }
        }
        other => ChainSpec::load(other)?,
    };
    if spec.genesis.alloc.is_empty() && spec.expected_genesis_hash.is_some() {
        bail!(
            "the `{}` preset ships its fork schedule but not its genesis allocation; \
             run scripts/setup-genesis.sh or pass its genesis.json with --chain FILE",
            args.chain
        );
    }
    let state = MemState::from_alloc(&spec.genesis.alloc);
    let state_root = overdrive_trie::reference::state_root(&state);
    let header = spec.genesis_header(state_root);
    let hash = header.hash_slow();
    if let Some(expected) = spec.expected_genesis_hash
        && expected != hash
    {
        bail!("computed genesis hash {hash} differs from the known {expected}");
    }

    std::fs::create_dir_all(&args.datadir)
        .wrap_err_with(|| format!("cannot create {}", args.datadir.display()))?;
    let marker = args.datadir.join("genesis-hash");
    match std::fs::read_to_string(&marker) {
        Ok(existing) if existing.trim() != hash.to_string() => bail!(
            "{} already holds chain with genesis {}, not {hash}",
            args.datadir.display(),
            existing.trim()
        ),
        Ok(_) => tracing::info!(datadir = %args.datadir.display(), "already initialised"),
        Err(_) => {
            let genesis = serde_json::to_vec_pretty(&spec.genesis)?;
            std::fs::write(args.datadir.join("genesis.json"), genesis)?;
            std::fs::write(&marker, format!("{hash}\n"))?;
            tracing::info!(datadir = %args.datadir.display(), "initialised");
        }
    }
    println!("chain id:          {}", spec.chain_id);
    println!("genesis hash:      {hash}");
    println!("genesis state root: {state_root}");
    Ok(())
}
