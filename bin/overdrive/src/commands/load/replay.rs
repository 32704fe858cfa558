//! `overdrive bench replay`: an exported chain replayed into a fresh node through the Engine
//! API (`engine_newPayloadV4` then `engine_forkchoiceUpdatedV3`, block by block), as a
//! consensus client would feed it, with reth's executor and with overdrive's. It measures the
//! engine's validation path alone: no transaction pool, no RPC intake, no payload building.

use super::{node, rpc::Rpc};
use alloy_consensus::{Block, TxEnvelope};
use alloy_primitives::B256;
use alloy_rpc_types_engine::ExecutionPayloadV3;
use base64::{Engine as _, engine::general_purpose::URL_SAFE_NO_PAD};
use clap::Args;
use eyre::{WrapErr, bail, eyre};
use hmac::{Hmac, Mac};
use overdrive_bench::round;
use serde_json::{Value, json};
use std::{
    path::{Path, PathBuf},
    time::Instant,
};

#[derive(Debug, Args)]
pub struct ReplayArgs {
    /// A folder from `overdrive chain export` (genesis.json and chain.rlp).
    #[arg(long)]
    chain: PathBuf,
    /// The overdrive-reth binary (default: $OVERDRIVE_RETH_BIN).
    #[arg(long, value_name = "PATH")]
    reth_bin: Option<PathBuf>,
    /// Threads of overdrive's executor.
    #[arg(long, default_value_t = 2, value_parser = crate::commands::positive)]
    threads: usize,
    /// Where the nodes' datadirs and logs go.
    #[arg(long, default_value = "replay-report")]
    out: PathBuf,
    /// End with one JSON line of the figures.
    #[arg(long)]
    json: bool,
}

/// One node's replay.
struct Replayed {
    blocks: usize,
    gas: u64,
    seconds: f64,
}

pub fn run(args: ReplayArgs) -> eyre::Result<()> {
    let genesis = args.chain.join("genesis.json");
    let blocks = read_chain(&args.chain.join("chain.rlp"))?;
    let reth = super::reth_binary(args.reth_bin.clone())?;
    std::fs::create_dir_all(&args.out)?;
    let threads = args.threads.to_string();
    let mut results = Vec::new();
    for (label, flags) in super::stock_and_overdrive(&threads, false) {
        let datadir = args.out.join(format!("{label}-data"));
        let _ = std::fs::remove_dir_all(&datadir);
        std::fs::create_dir_all(&datadir)?;
        let secret: [u8; 32] = rand::random();
        let jwt_path = datadir.join("jwt.hex");
        std::fs::write(&jwt_path, alloy_primitives::hex::encode(secret))?;
        let node = node::DevNode::start(&node::DevNodeConfig {
            binary: &reth,
            genesis: &genesis,
            datadir: &datadir,
            log: &args.out.join(format!("{label}.log")),
            gas_limit: 0,
            block_time: 0,
            flags: &flags,
            jwt: Some(&jwt_path),
        })?;
        let engine = Rpc::new(&node.engine_url())?.with_bearer(move || jwt(&secret));
        let replayed = replay(&engine, &blocks);
        node.stop();
        let replayed = replayed.wrap_err_with(|| format!("replaying into the {label} node"))?;
        println!(
            "{label}: {} blocks, {:.1} Mgas in {:.2} s: {:.1} Mgas/s",
            replayed.blocks,
            replayed.gas as f64 / 1e6,
            replayed.seconds,
            replayed.gas as f64 / 1e6 / replayed.seconds
        );
        results.push(replayed);
        let _ = std::fs::remove_dir_all(&datadir);
    }
    let gas_per_s = |r: &Replayed| r.gas as f64 / r.seconds;
    let (stock, overdrive) = (gas_per_s(&results[0]), gas_per_s(&results[1]));
    let speedup = round(overdrive / stock, 2);
    println!("replay: {speedup}x overdrive over stock");
    if args.json {
        println!(
            "{}",
            json!({"bench": "replay", "blocks": results[0].blocks,
                "stock_mgas_per_s": round(stock / 1e6, 2),
                "overdrive_mgas_per_s": round(overdrive / 1e6, 2), "speedup": speedup})
        );
    }
    Ok(())
}

pub(super) fn read_chain(path: &Path) -> eyre::Result<Vec<Block<TxEnvelope>>> {
    let bytes = std::fs::read(path).wrap_err_with(|| format!("reading {}", path.display()))?;
    let mut rest = bytes.as_slice();
    let mut blocks = Vec::new();
    while !rest.is_empty() {
        let block = alloy_rlp::Decodable::decode(&mut rest).map_err(|e| {
            eyre!(
                "{}: block {} does not decode: {e}",
                path.display(),
                blocks.len() + 1
            )
        })?;
        blocks.push(block);
    }
    Ok(blocks)
}

/// Sends every block as a payload and makes it the head; times the whole.
fn replay(engine: &Rpc, blocks: &[Block<TxEnvelope>]) -> eyre::Result<Replayed> {
    let started = Instant::now();
    let mut gas = 0;
    for block in blocks {
        let hash = block.header.hash_slow();
        let payload = ExecutionPayloadV3::from_block_unchecked(hash, block);
        let beacon_root = block.header.parent_beacon_block_root.unwrap_or_default();
        // Generated chains carry no EIP-7685 requests.
        let status = engine.call(
            "engine_newPayloadV4",
            json!([
                payload,
                Vec::<B256>::new(),
                beacon_root,
                Vec::<String>::new()
            ]),
        )?;
        if status["status"] != "VALID" {
            bail!(
                "block {}: newPayload answered {status}",
                block.header.number
            );
        }
        let state =
            json!({"headBlockHash": hash, "safeBlockHash": hash, "finalizedBlockHash": hash});
        let updated = engine.call("engine_forkchoiceUpdatedV3", json!([state, Value::Null]))?;
        if updated["payloadStatus"]["status"] != "VALID" {
            bail!(
                "block {}: forkchoiceUpdated answered {updated}",
                block.header.number
            );
        }
        gas += block.header.gas_used;
    }
    Ok(Replayed {
        blocks: blocks.len(),
        gas,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// An Engine API token: HS256 over `{"iat": now}` with the node's secret.
fn jwt(secret: &[u8; 32]) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    jwt_at(secret, now)
}

fn jwt_at(secret: &[u8; 32], now: u64) -> String {
    let header = URL_SAFE_NO_PAD.encode(r#"{"alg":"HS256","typ":"JWT"}"#);
    let claims = URL_SAFE_NO_PAD.encode(format!(r#"{{"iat":{now}}}"#));
    let signing_input = format!("{header}.{claims}");
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(secret).expect("any key length");
    mac.update(signing_input.as_bytes());
    let signature = URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes());
    format!("{signing_input}.{signature}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_hs256_jwts() {
        let secret = [7u8; 32];
        let token = jwt_at(&secret, 1_700_000_000);
        let parts: Vec<&str> = token.split('.').collect();
        assert_eq!(parts[0], "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9");
        assert_eq!(
            URL_SAFE_NO_PAD.decode(parts[1]).unwrap(),
            br#"{"iat":1700000000}"#
        );
        let mut mac = Hmac::<sha2::Sha256>::new_from_slice(&secret).unwrap();
        mac.update(format!("{}.{}", parts[0], parts[1]).as_bytes());
        mac.verify_slice(&URL_SAFE_NO_PAD.decode(parts[2]).unwrap())
            .expect("the signature is the secret's");
        assert_ne!(jwt_at(&[8u8; 32], 1_700_000_000), token);
    }
}
