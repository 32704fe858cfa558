//! `--overdrive.pool`: `overdrive_sendRawTransactions` answers each transaction as
//! `eth_sendRawTransaction` does (hash, or the same error code and text for each of the pool's
//! rules), refuses oversized batches whole, and under concurrent batches from many connections
//! neither loses nor duplicates a transaction, each sender's mined in nonce order.

mod support;

use alloy_consensus::{
    SignableTransaction, Signed, TxEip1559, TxEip4844, TxEip7702, TxEnvelope, TxLegacy,
};
use alloy_eips::eip2718::Encodable2718;
use alloy_primitives::{Address, B256, Bytes, Signature, TxKind, U256, hex};
use overdrive_chain::Fork;
use overdrive_workload::{WorkloadConfig, WorkloadKind};
use secp256k1::{Message, SECP256K1, SecretKey};
use serde_json::{Value, json};
use std::{
    collections::{HashMap, HashSet},
    path::PathBuf,
    time::Duration,
};

const CHAIN_ID: u64 = 1337;

fn sign<T: SignableTransaction<Signature>>(key: B256, tx: T) -> Signed<T> {
    let secret = SecretKey::from_slice(key.as_slice()).unwrap();
    let message = Message::from_digest(tx.signature_hash().0);
    let (id, bytes) = SECP256K1
        .sign_ecdsa_recoverable(&message, &secret)
        .serialize_compact();
    let signature = Signature::new(
        U256::from_be_slice(&bytes[..32]),
        U256::from_be_slice(&bytes[32..]),
        i32::from(id) != 0,
    );
    tx.into_signed(signature)
}

fn hex_of(envelope: TxEnvelope) -> String {
    format!("0x{}", hex::encode(envelope.encoded_2718()))
}

/// A dev chain of the ERC20 workload (its deployer has sent transactions: its nonce is above
/// zero) and a node on it.
struct Node {
    _node: support::KillOnDrop,
    _dir: tempfile::TempDir,
    http: u16,
    metrics: u16,
    workload: overdrive_workload::Workload,
}

fn start(accounts: usize, txs_per_block: usize, blocks: usize, flags: &[&str]) -> Node {
    let workload = overdrive_workload::generate(&WorkloadConfig {
        accounts,
        txs_per_block,
        blocks,
        ..WorkloadConfig::new(WorkloadKind::Erc20)
    })
    .unwrap();
    let chain = overdrive_chain::build(workload.clone(), Fork::Prague).unwrap();
    let dir = support::temp_dir("intake");
    let (genesis, _): (PathBuf, _) = overdrive_chain::write(&chain, dir.path()).unwrap();
    let (http, metrics) = (support::free_port(), support::free_port());
    let node = support::dev_node(&genesis, dir.path(), http, metrics, flags);
    Node {
        _node: node,
        _dir: dir,
        http,
        metrics,
        workload,
    }
}

impl Node {
    fn call(&self, method: &str, params: Value) -> Value {
        support::rpc_response(self.http, method, params).expect("the node answers")
    }

    fn quantity(&self, method: &str, params: Value) -> u128 {
        quantity(&self.call(method, params)["result"])
    }

    /// The latest block's base fee.
    fn base_fee(&self) -> u128 {
        quantity(
            &self.call("eth_getBlockByNumber", json!(["latest", false]))["result"]["baseFeePerGas"],
        )
    }

    fn key(&self, i: usize) -> B256 {
        overdrive_workload::private_key(self.workload.config.seed, i as u64)
    }
}

/// A JSON-RPC quantity (`0x`-prefixed hex).
fn quantity(value: &Value) -> u128 {
    let text = value
        .as_str()
        .unwrap_or_else(|| panic!("not a quantity: {value}"));
    u128::from_str_radix(text.trim_start_matches("0x"), 16).unwrap()
}

/// A transfer of `value` wei with `nonce` and fee cap `max_fee`.
fn transfer(nonce: u64, max_fee: u128, value: U256) -> TxEip1559 {
    TxEip1559 {
        chain_id: CHAIN_ID,
        nonce,
        gas_limit: 21_000,
        max_fee_per_gas: max_fee,
        max_priority_fee_per_gas: 1,
        to: TxKind::Call(Address::with_last_byte(0x77)),
        value,
        input: Bytes::new(),
        access_list: Default::default(),
    }
}

fn eip1559(key: B256, tx: TxEip1559) -> String {
    hex_of(sign(key, tx).into())
}

#[test]
fn the_batch_endpoint_answers_as_eth_send_raw_transaction() {
    let node = start(
        64,
        8,
        1,
        &[
            "--dev.block-time",
            "600s",
            "--overdrive.pool",
            "--overdrive.pool.threads",
            "2",
            "--overdrive.pool.max-batch",
            "64",
        ],
    );
    let base_fee = node.base_fee();
    let fee = base_fee * 2 + 1_000_000_000;
    let deployer = overdrive_workload::deployer_key();
    let deployer_address =
        Signed::<TxEip1559>::recover_signer(&sign(deployer, transfer(0, fee, U256::ZERO))).unwrap();
    let deployer_nonce = node.quantity(
        "eth_getTransactionCount",
        json!([deployer_address, "latest"]),
    );
    assert!(deployer_nonce > 0, "the deployer has sent nothing");
    let balance = node.quantity(
        "eth_getBalance",
        json!([node.workload.accounts[1], "latest"]),
    );

    // Already in the pool before the batch: the batch's replacement and duplicate of it.
    let first = eip1559(node.key(3), transfer(0, fee, U256::from(1)));
    assert!(
        node.call("eth_sendRawTransaction", json!([first]))["result"].is_string(),
        "the setup transaction was refused"
    );

    let key = node.key(1);
    let mut refused: Vec<(&str, String)> = vec![
        ("already known", first.clone()),
        (
            "replacement underpriced",
            eip1559(node.key(3), transfer(0, fee, U256::from(2))),
        ),
        (
            "nonce too low",
            eip1559(deployer, transfer(0, fee, U256::ZERO)),
        ),
        (
            "wrong chain id",
            eip1559(
                key,
                TxEip1559 {
                    chain_id: 1,
                    ..transfer(0, fee, U256::ZERO)
                },
            ),
        ),
        (
            "insufficient funds",
            eip1559(key, transfer(0, fee, U256::from(balance))),
        ),
        (
            "intrinsic gas too low",
            eip1559(
                key,
                TxEip1559 {
                    gas_limit: 20_000,
                    ..transfer(0, fee, U256::ZERO)
                },
            ),
        ),
        (
            "tip above fee cap",
            eip1559(
                key,
                TxEip1559 {
                    max_priority_fee_per_gas: fee + 1,
                    ..transfer(0, fee, U256::ZERO)
                },
            ),
        ),
        (
            "gas limit above the block's",
            eip1559(
                key,
                TxEip1559 {
                    gas_limit: 4_000_000_000,
                    ..transfer(0, fee, U256::ZERO)
                },
            ),
        ),
        (
            "fee above the RPC cap",
            eip1559(key, transfer(0, 10u128.pow(17), U256::ZERO)),
        ),
        (
            "oversized input",
            eip1559(
                key,
                TxEip1559 {
                    gas_limit: 30_000_000,
                    input: vec![1u8; 200_000].into(),
                    ..transfer(0, fee, U256::ZERO)
                },
            ),
        ),
        (
            "init code too large",
            eip1559(
                key,
                TxEip1559 {
                    gas_limit: 30_000_000,
                    to: TxKind::Create,
                    input: vec![0u8; 49_153].into(),
                    ..transfer(0, fee, U256::ZERO)
                },
            ),
        ),
        (
            "empty authorization list",
            hex_of(
                sign(
                    key,
                    TxEip7702 {
                        chain_id: CHAIN_ID,
                        nonce: 0,
                        gas_limit: 100_000,
                        max_fee_per_gas: fee,
                        max_priority_fee_per_gas: 1,
                        to: Address::with_last_byte(0x77),
                        ..Default::default()
                    },
                )
                .into(),
            ),
        ),
        (
            "blob transaction without its sidecar",
            hex_of(
                sign(
                    key,
                    TxEip4844 {
                        chain_id: CHAIN_ID,
                        gas_limit: 100_000,
                        max_fee_per_gas: fee,
                        max_priority_fee_per_gas: 1,
                        max_fee_per_blob_gas: fee,
                        blob_versioned_hashes: vec![B256::with_last_byte(1)],
                        ..Default::default()
                    },
                )
                .into(),
            ),
        ),
        ("malformed RLP", "0xdeadbeef".to_string()),
        ("empty", "0x".to_string()),
        ("truncated legacy transaction", {
            let signed = sign(
                key,
                TxLegacy {
                    chain_id: Some(CHAIN_ID),
                    gas_limit: 21_000,
                    gas_price: fee,
                    to: TxKind::Call(Address::ZERO),
                    ..Default::default()
                },
            );
            let mut raw = TxEnvelope::from(signed).encoded_2718();
            raw.truncate(raw.len() - 1);
            format!("0x{}", hex::encode(raw))
        }),
        ("bad signature", {
            let tx = transfer(0, fee, U256::ZERO);
            let bad = Signature::new(U256::ZERO, U256::from(1), false);
            hex_of(tx.into_signed(bad).into())
        }),
    ];
    // Valid transactions, two a sender, between the refused ones: the batch is large enough to
    // be validated in parallel, and each sender's pair lands in one group.
    let mut accepted = Vec::new();
    for account in 10..30 {
        for nonce in 0..2 {
            let raw = eip1559(node.key(account), transfer(nonce, fee, U256::from(7)));
            accepted.push(raw);
        }
    }
    let mut batch = Vec::new();
    let mut expect_refused = HashMap::new();
    for (i, raw) in accepted.iter().enumerate() {
        batch.push(raw.clone());
        if i % 2 == 1
            && let Some((name, raw)) = refused.pop()
        {
            expect_refused.insert(batch.len(), name);
            batch.push(raw);
        }
    }
    for (name, raw) in refused.drain(..) {
        expect_refused.insert(batch.len(), name);
        batch.push(raw);
    }
    assert!(batch.len() <= 64);

    let answer = node.call("overdrive_sendRawTransactions", json!([batch]));
    let results = answer["result"]
        .as_array()
        .unwrap_or_else(|| panic!("{answer}"));
    assert_eq!(results.len(), batch.len());
    for (i, (raw, result)) in batch.iter().zip(results).enumerate() {
        let single = node.call("eth_sendRawTransaction", json!([raw]));
        match expect_refused.get(&i) {
            Some(name) => {
                let error = &result["error"];
                assert!(error.is_object(), "{name}: accepted: {result}");
                assert_eq!(
                    (&error["code"], &error["message"]),
                    (&single["error"]["code"], &single["error"]["message"]),
                    "{name}: the batch and eth_sendRawTransaction differ"
                );
                eprintln!("{name}: {error}");
            }
            None => {
                let hash = result["hash"]
                    .as_str()
                    .unwrap_or_else(|| panic!("refused: {result}"));
                let bytes = hex::decode(raw).unwrap();
                assert_eq!(
                    hash,
                    format!("{}", alloy_primitives::keccak256(&bytes)),
                    "the hash of transaction {i}"
                );
                // In the pool: sending it again is refused as known.
                assert_eq!(
                    single["error"]["message"], "already known",
                    "transaction {i}: {single}"
                );
            }
        }
    }
    let status = node.call("txpool_status", json!([]));
    assert_eq!(
        quantity(&status["result"]["pending"]),
        1 + accepted.len() as u128,
        "{status}"
    );

    // Over the limit: refused whole, with the limit in the message; the node keeps serving.
    let over: Vec<String> = (0..65).map(|_| "0x00".to_string()).collect();
    let answer = node.call("overdrive_sendRawTransactions", json!([over]));
    assert_eq!(answer["error"]["code"], -32602, "{answer}");
    assert_eq!(
        answer["error"]["message"],
        "batch of 65 transactions exceeds the limit of 64"
    );
    let answer = node.call("overdrive_sendRawTransactions", json!(["not a list"]));
    assert!(answer["error"].is_object(), "{answer}");
    let answer = node.call("overdrive_sendRawTransactions", json!([[]]));
    assert_eq!(answer["result"], json!([]));
    assert!(node.call("eth_blockNumber", json!([]))["result"].is_string());

    // The endpoint's metrics, on reth's endpoint: the batch's accepted and refused
    // transactions, and the one call refused whole.
    let page = support::http(node.metrics, "/", None).expect("the metrics endpoint answers");
    let sample = |name: &str| {
        page.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .unwrap_or_else(|| panic!("no {name} in\n{page}"))
    };
    assert_eq!(
        sample("reth_overdrive_intake_transactions_total{result=\"accepted\"}"),
        accepted.len() as f64
    );
    assert_eq!(
        sample("reth_overdrive_intake_transactions_total{result=\"refused\"}"),
        expect_refused.len() as f64
    );
    assert_eq!(sample("reth_overdrive_intake_batches_refused_total"), 1.0);
}

#[test]
fn concurrent_batches_lose_and_duplicate_nothing() {
    let node = start(120, 200, 4, &["--dev.block-time", "1s", "--overdrive.pool"]);
    let txs: Vec<(String, String, Address)> = node
        .workload
        .blocks
        .iter()
        .flat_map(|b| &b.transactions)
        .map(|tx| {
            (
                format!("{}", tx.hash()),
                format!("0x{}", hex::encode(tx.inner().encoded_2718())),
                tx.signer(),
            )
        })
        .collect();
    // Six connections, each sender's transactions on one of them in nonce order; two more
    // send every transaction again at the same time.
    let mut lanes: Vec<Vec<usize>> = vec![Vec::new(); 6];
    for (i, (_, _, sender)) in txs.iter().enumerate() {
        lanes[usize::from(sender.0[19]) % 6].push(i);
    }
    lanes.push((0..txs.len()).collect());
    lanes.push((0..txs.len()).rev().collect());
    let answers: Vec<Vec<(usize, Value)>> = std::thread::scope(|scope| {
        let handles: Vec<_> = lanes
            .iter()
            .map(|lane| {
                let (txs, http) = (&txs, node.http);
                scope.spawn(move || {
                    let mut out = Vec::new();
                    for chunk in lane.chunks(50) {
                        let raw: Vec<&str> = chunk.iter().map(|&i| txs[i].1.as_str()).collect();
                        let answer = support::rpc_response(
                            http,
                            "overdrive_sendRawTransactions",
                            json!([raw]),
                        )
                        .expect("the node answers");
                        let results = answer["result"].as_array().expect("a result list");
                        out.extend(chunk.iter().copied().zip(results.iter().cloned()));
                    }
                    out
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut accepted = vec![0; txs.len()];
    for (i, result) in answers.into_iter().flatten() {
        match result["hash"].as_str() {
            Some(hash) => {
                assert_eq!(hash, txs[i].0);
                accepted[i] += 1;
            }
            None => {
                let message = result["error"]["message"].as_str().unwrap();
                assert!(
                    ["already known", "nonce too low"].contains(&message),
                    "transaction {i}: {result}"
                );
            }
        }
    }
    assert!(
        accepted.iter().all(|&n| n == 1),
        "each transaction is accepted exactly once: {accepted:?}"
    );

    let last = &txs.last().unwrap().0;
    support::wait_for(
        "every transaction to be mined",
        Duration::from_secs(120),
        || {
            support::rpc(node.http, "eth_getTransactionReceipt", json!([last]))
                .filter(|r| !r.is_null())
        },
    );
    support::wait_for("the rest to be mined", Duration::from_secs(60), || {
        txs.iter()
            .all(|(hash, _, _)| {
                support::rpc(node.http, "eth_getTransactionReceipt", json!([hash]))
                    .is_some_and(|r| !r.is_null())
            })
            .then_some(())
    });
    let head = node.quantity("eth_blockNumber", json!([])) as u64;
    let mut seen = HashSet::new();
    let mut next_nonce: HashMap<String, u64> = HashMap::new();
    for number in 1..=head {
        let block = node.call(
            "eth_getBlockByNumber",
            json!([format!("{number:#x}"), true]),
        );
        for tx in block["result"]["transactions"].as_array().unwrap() {
            let hash = tx["hash"].as_str().unwrap().to_string();
            assert!(seen.insert(hash.clone()), "{hash} mined twice");
            let from = tx["from"].as_str().unwrap().to_lowercase();
            let nonce = quantity(&tx["nonce"]) as u64;
            let expected = next_nonce.entry(from.clone()).or_insert(nonce);
            assert_eq!(nonce, *expected, "{from}'s transactions out of nonce order");
            *expected += 1;
        }
    }
    assert_eq!(seen.len(), txs.len());
}

/// A small deterministic generator (xorshift), so that a failing batch can be replayed.
struct Draw(u64);

impl Draw {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// Random batches (nonces in and out of order, repeated with and without the price bump,
/// balances exceeded, wrong chain ids, too little gas, three transaction types, bytes that do
/// not decode) get the same answer, transaction by transaction, from overdrive's batch
/// endpoint as from stock reth taking them one `eth_sendRawTransaction` at a time, and leave
/// the two pools holding the same transactions.
#[test]
fn random_batches_match_stock_reth_one_by_one() {
    let flags = ["--dev.block-time", "600s"];
    let stock = start(64, 8, 1, &flags);
    let ours = start(
        64,
        8,
        1,
        &[
            "--dev.block-time",
            "600s",
            "--overdrive.pool",
            "--overdrive.pool.threads",
            "3",
        ],
    );
    let base_fee = stock.base_fee();
    let balance = stock.quantity(
        "eth_getBalance",
        json!([stock.workload.accounts[0], "latest"]),
    );
    let gwei = 1_000_000_000u128;
    for seed in [1u64, 2, 3] {
        let mut draw = Draw(0x9e37_79b9_7f4a_7c15 ^ seed);
        let mut batch = Vec::new();
        for _ in 0..300 {
            if draw.chance(3) {
                let junk: Vec<u8> = (0..draw.below(40)).map(|_| draw.next() as u8).collect();
                batch.push(format!("0x{}", hex::encode(junk)));
                continue;
            }
            let sender = 12 * (seed as usize - 1) + draw.below(12) as usize;
            let key = stock.key(sender);
            let nonce = draw.below(5);
            let tip = [1, 2 * gwei, 3 * gwei, 3 * gwei + gwei / 3][draw.below(4) as usize];
            let max_fee = base_fee * 2 + tip;
            let value = if draw.chance(8) {
                U256::from(balance)
            } else {
                U256::from(draw.below(1000))
            };
            let gas_limit = if draw.chance(5) { 20_000 } else { 21_000 };
            let chain_id = if draw.chance(5) { 1 } else { CHAIN_ID };
            let to = TxKind::Call(Address::with_last_byte(draw.below(4) as u8));
            let raw = match draw.below(3) {
                0 => eip1559(
                    key,
                    TxEip1559 {
                        chain_id,
                        nonce,
                        gas_limit,
                        max_fee_per_gas: max_fee,
                        max_priority_fee_per_gas: tip,
                        to,
                        value,
                        ..Default::default()
                    },
                ),
                1 => hex_of(
                    sign(
                        key,
                        TxLegacy {
                            chain_id: Some(chain_id),
                            nonce,
                            gas_price: max_fee,
                            gas_limit,
                            to,
                            value,
                            input: Bytes::new(),
                        },
                    )
                    .into(),
                ),
                _ => hex_of(
                    sign(
                        key,
                        alloy_consensus::TxEip2930 {
                            chain_id,
                            nonce,
                            gas_price: max_fee,
                            gas_limit,
                            to,
                            value,
                            ..Default::default()
                        },
                    )
                    .into(),
                ),
            };
            batch.push(raw);
        }

        let answer = ours.call("overdrive_sendRawTransactions", json!([batch]));
        let results = answer["result"]
            .as_array()
            .unwrap_or_else(|| panic!("{answer}"));
        let (mut accepted, mut refused) = (0, 0);
        for (i, (raw, result)) in batch.iter().zip(results).enumerate() {
            let single = stock.call("eth_sendRawTransaction", json!([raw]));
            let theirs = match single.get("result") {
                Some(hash) => json!({"hash": hash}),
                None => json!({"error": {"code": single["error"]["code"],
                    "message": single["error"]["message"]}}),
            };
            assert_eq!(result, &theirs, "seed {seed}, transaction {i}: {raw}");
            if result.get("hash").is_some() {
                accepted += 1;
            } else {
                refused += 1;
            }
        }
        assert!(
            accepted > 30 && refused > 30,
            "seed {seed}: a batch should mix both ({accepted} accepted, {refused} refused)"
        );
        let content = |node: &Node| {
            let content = node.call("txpool_content", json!([]))["result"].clone();
            let mut held = Vec::new();
            for pool in ["pending", "queued"] {
                for (sender, txs) in content[pool].as_object().unwrap() {
                    for (nonce, tx) in txs.as_object().unwrap() {
                        held.push((
                            pool,
                            sender.to_lowercase(),
                            nonce.clone(),
                            tx["hash"].as_str().unwrap().to_string(),
                        ));
                    }
                }
            }
            held.sort();
            held
        };
        assert_eq!(
            content(&ours),
            content(&stock),
            "seed {seed}: the pools differ"
        );
    }
}
