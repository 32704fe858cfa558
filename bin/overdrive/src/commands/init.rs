use clap::Args;
use eyre::{WrapErr, bail};
use overdrive_primitives::{ChainParams, MemState};
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
                ChainParams::mainnet_with_alloc_file(&alloc)?
            } else {
                ChainParams::mainnet()
            }
        }
        other => ChainParams::load(other)?,
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
        // Only a missing marker means a fresh datadir: one that cannot be read says nothing
        // about which chain is there, and overwriting it could switch the datadir's chain.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let genesis = serde_json::to_vec_pretty(&spec.genesis)?;
            write_atomically(&args.datadir.join("genesis.json"), &genesis)?;
            // The marker last: a datadir counts as initialised only once all of it is there.
            write_atomically(&marker, format!("{hash}\n").as_bytes())?;
            tracing::info!(datadir = %args.datadir.display(), "initialised");
        }
        Err(e) => return Err(e).wrap_err_with(|| format!("cannot read {}", marker.display())),
    }
    println!("chain id:          {}", spec.chain_id);
    println!("genesis hash:      {hash}");
    println!("genesis state root: {state_root}");
    Ok(())
}

/// Writes `bytes` to `path` through a temporary file renamed over it, so that a process
/// killed meanwhile leaves the old file or the new one, never a truncated one.
fn write_atomically(path: &std::path::Path, bytes: &[u8]) -> eyre::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = std::path::PathBuf::from(tmp);
    std::fs::write(&tmp, bytes).wrap_err_with(|| format!("cannot write {}", tmp.display()))?;
    std::fs::rename(&tmp, path)
        .wrap_err_with(|| format!("cannot rename {} to {}", tmp.display(), path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn datadir(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("overdrive-init-{name}-{}", std::process::id()));
        std::fs::remove_dir_all(&dir).ok();
        dir
    }

    fn init(chain: &str, datadir: &std::path::Path) -> eyre::Result<()> {
        run(InitArgs {
            chain: chain.to_string(),
            datadir: datadir.to_path_buf(),
        })
    }

    #[test]
    fn initialises_once_and_refuses_another_chain() {
        let dir = datadir("chains");
        init("dev", &dir).unwrap();
        let genesis = std::fs::read(dir.join("genesis.json")).unwrap();
        let marker = std::fs::read_to_string(dir.join("genesis-hash")).unwrap();
        assert!(marker.starts_with("0x") && marker.ends_with('\n'));
        assert!(!dir.join("genesis-hash.tmp").exists() && !dir.join("genesis.json.tmp").exists());
        // The same chain again: a no-op.
        init("dev", &dir).unwrap();
        // The written genesis.json loads back as the same chain.
        init(dir.join("genesis.json").to_str().unwrap(), &dir).unwrap();

        let other = dir.join("other.json");
        std::fs::write(
            &other,
            r#"{"config": {"chainId": 7}, "gasLimit": "0x1c9c380", "alloc": {}}"#,
        )
        .unwrap();
        let e = init(other.to_str().unwrap(), &dir).unwrap_err();
        assert!(e.to_string().contains("already holds chain"), "{e}");
        assert_eq!(std::fs::read(dir.join("genesis.json")).unwrap(), genesis);
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn an_unreadable_marker_is_an_error_and_overwrites_nothing() {
        let dir = datadir("marker");
        std::fs::create_dir_all(dir.join("genesis-hash")).unwrap();
        let e = init("dev", &dir).unwrap_err();
        assert!(format!("{e:#}").contains("genesis-hash"), "{e:#}");
        assert!(!dir.join("genesis.json").exists());

        std::fs::remove_dir_all(dir.join("genesis-hash")).unwrap();
        std::fs::write(dir.join("genesis-hash"), [0xff, 0xfe]).unwrap();
        assert!(init("dev", &dir).is_err());
        assert!(!dir.join("genesis.json").exists());
        std::fs::remove_dir_all(&dir).ok();
    }
}
