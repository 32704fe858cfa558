use crate::WorkloadError;
use alloy_primitives::{Bytes, hex};
use serde::Deserialize;
use std::path::{Path, PathBuf};

/// Environment variable that overrides where the contract artifacts are read from.
pub const ARTIFACTS_ENV: &str = "OVERDRIVE_ARTIFACTS";

/// The directory the artifacts are read from: `$OVERDRIVE_ARTIFACTS` if set, otherwise
/// `build-artifacts/` at the repository root (where scripts/setup-contracts.sh writes them).
pub fn artifacts_dir() -> PathBuf {
    match std::env::var_os(ARTIFACTS_ENV) {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => {
            // crates/workload -> the repository root.
            let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
            manifest
                .ancestors()
                .nth(2)
                .unwrap_or(manifest)
                .join("build-artifacts")
        }
    }
}

/// Creation and runtime code of one contract.
#[derive(Debug, Clone)]
pub(crate) struct ContractCode {
    pub(crate) creation: Bytes,
    pub(crate) runtime: Bytes,
}

/// The Uniswap V2 contracts, from the published npm builds.
#[derive(Debug, Clone)]
pub(crate) struct UniswapCode {
    pub(crate) factory: ContractCode,
    pub(crate) pair: ContractCode,
    pub(crate) router: ContractCode,
    pub(crate) weth: ContractCode,
}

/// Both shapes the script writes: its own `Token.json` (`bytecode` / `deployedBytecode`,
/// 0x-prefixed) and the verbatim Uniswap builds (same top-level `bytecode`, runtime under
/// `evm.deployedBytecode.object`, no prefix).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ArtifactJson {
    bytecode: String,
    #[serde(default)]
    deployed_bytecode: Option<String>,
    #[serde(default)]
    evm: Option<EvmJson>,
    #[serde(default)]
    storage_layout: Option<Vec<SlotJson>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct EvmJson {
    deployed_bytecode: Option<ObjectJson>,
}

#[derive(Deserialize)]
struct ObjectJson {
    object: String,
}

#[derive(Deserialize)]
struct SlotJson {
    label: String,
    slot: String,
    offset: u64,
}

fn read_json(path: &Path) -> Result<ArtifactJson, WorkloadError> {
    let bytes = std::fs::read(path).map_err(|source| match source.kind() {
        std::io::ErrorKind::NotFound => WorkloadError::MissingArtifacts {
            path: path.to_path_buf(),
        },
        _ => WorkloadError::ArtifactIo {
            path: path.to_path_buf(),
            source,
        },
    })?;
    serde_json::from_slice(&bytes).map_err(|e| WorkloadError::BadArtifact {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })
}

fn decode_hex(path: &Path, field: &str, s: &str) -> Result<Bytes, WorkloadError> {
    let bad = |reason: String| WorkloadError::BadArtifact {
        path: path.to_path_buf(),
        reason,
    };
    let bytes = hex::decode(s.trim()).map_err(|e| bad(format!("{field} is not hex: {e}")))?;
    if bytes.is_empty() {
        return Err(bad(format!("{field} is empty")));
    }
    Ok(bytes.into())
}

fn load_contract(path: &Path) -> Result<(ContractCode, ArtifactJson), WorkloadError> {
    let json = read_json(path)?;
    let runtime = json
        .deployed_bytecode
        .as_deref()
        .or(json
            .evm
            .as_ref()
            .and_then(|e| e.deployed_bytecode.as_ref())
            .map(|o| o.object.as_str()))
        .ok_or_else(|| WorkloadError::BadArtifact {
            path: path.to_path_buf(),
            reason: "no deployed bytecode".into(),
        })?;
    let code = ContractCode {
        creation: decode_hex(path, "bytecode", &json.bytecode)?,
        runtime: decode_hex(path, "deployedBytecode", runtime)?,
    };
    Ok((code, json))
}

/// Loads `Token.json` and checks that its storage layout is the one [`crate::erc20`]'s slot
/// functions assume.
pub(crate) fn load_token(dir: &Path) -> Result<ContractCode, WorkloadError> {
    let path = dir.join("Token.json");
    let (code, json) = load_contract(&path)?;
    let layout = json.storage_layout.unwrap_or_default();
    for (label, slot) in [
        ("_balances", "0"),
        ("_allowances", "1"),
        ("_totalSupply", "2"),
    ] {
        let found = layout.iter().find(|s| s.label == label);
        if !matches!(found, Some(s) if s.slot == slot && s.offset == 0) {
            return Err(WorkloadError::ContractMismatch(format!(
                "{}: `{label}` is not at slot {slot}, which the direct storage writes rely on",
                path.display()
            )));
        }
    }
    Ok(code)
}

/// Loads the four Uniswap V2 builds from `dir/uniswap/`.
pub(crate) fn load_uniswap(dir: &Path) -> Result<UniswapCode, WorkloadError> {
    let load = |name: &str| load_contract(&dir.join("uniswap").join(name)).map(|(code, _)| code);
    Ok(UniswapCode {
        factory: load("UniswapV2Factory.json")?,
        pair: load("UniswapV2Pair.json")?,
        router: load("UniswapV2Router02.json")?,
        weth: load("WETH9.json")?,
    })
}
