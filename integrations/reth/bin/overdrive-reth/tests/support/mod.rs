//! What the end-to-end tests share: datadirs made by the binary, reth's view of them, and
//! conversions from overdrive's generated blocks to reth's.

#![allow(dead_code)]

pub mod imports;

use alloy_consensus::{Block as AlloyBlock, TxEnvelope, transaction::Recovered};
use alloy_genesis::{Genesis, GenesisAccount};
use alloy_primitives::B256;
use overdrive_primitives::MemState;
use reth_chainspec::ChainSpec;
use reth_ethereum_primitives::Block;
use reth_node_builder::NodeTypesWithDBAdapter;
use reth_node_ethereum::EthereumNode;
use reth_primitives_traits::RecoveredBlock;
use reth_provider::ProviderFactory;
use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Output},
    sync::Arc,
    time::{Duration, Instant},
};

/// The reth database of a test.
pub type Factory = ProviderFactory<NodeTypesWithDBAdapter<EthereumNode, reth_db::DatabaseEnv>>;

/// The binary under test.
pub fn overdrive_reth() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_overdrive-reth"));
    command.env("RUST_LOG", "info").env_remove("RUST_BACKTRACE");
    command
}

/// Runs `command` and fails the test with its output when it fails.
pub fn run_ok(command: &mut Command) -> Output {
    let output = command.output().expect("the binary runs");
    assert!(
        output.status.success(),
        "{command:?} failed ({}):\n{}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

/// A temporary directory, removed when dropped.
pub fn temp_dir(label: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("overdrive-reth-{label}-"))
        .tempdir()
        .expect("a temporary directory")
}

/// Writes `genesis` as `genesis.json` in `dir`.
pub fn write_genesis(dir: &Path, genesis: &Genesis) -> PathBuf {
    let path = dir.join("genesis.json");
    std::fs::write(&path, serde_json::to_vec(genesis).unwrap()).unwrap();
    path
}

/// `overdrive-reth init` of a datadir at `datadir` for `genesis_path`.
pub fn init_datadir(genesis_path: &Path, datadir: &Path) {
    run_ok(
        overdrive_reth()
            .arg("init")
            .arg("--chain")
            .arg(genesis_path)
            .arg("--datadir")
            .arg(datadir),
    );
}

/// reth's chain spec for a genesis file, as its CLI parses it.
pub fn reth_spec(genesis_path: &Path) -> Arc<ChainSpec> {
    reth_ethereum_cli::chainspec::chain_value_parser(genesis_path.to_str().unwrap())
        .expect("a chain spec")
}

/// A read-only view of the database in `datadir`.
pub fn open(spec: Arc<ChainSpec>, datadir: &Path) -> Factory {
    // Not watched: a watcher thread would keep the database mapped after the test drops it,
    // and a test that opens many runs out of address space.
    let config = reth_provider::providers::ReadOnlyConfig {
        watch: false,
        ..reth_provider::providers::ReadOnlyConfig::from_datadir(datadir)
    };
    EthereumNode::provider_factory_builder()
        .open_read_only(spec, config, reth_tasks::Runtime::test())
        .expect("the datadir opens")
}

/// A genesis allocation holding `state`.
pub fn alloc(
    state: &MemState,
) -> std::collections::BTreeMap<alloy_primitives::Address, GenesisAccount> {
    state
        .accounts
        .iter()
        .map(|(address, account)| {
            let code = (account.info.code_hash != revm::primitives::KECCAK_EMPTY)
                .then(|| state.code_of(address).original_bytes());
            let storage = (!account.storage.is_empty()).then(|| {
                account
                    .storage
                    .iter()
                    .map(|(slot, value)| (B256::from(*slot), B256::from(*value)))
                    .collect()
            });
            (
                *address,
                GenesisAccount {
                    nonce: Some(account.info.nonce),
                    balance: account.info.balance,
                    code,
                    storage,
                    private_key: None,
                },
            )
        })
        .collect()
}

/// reth's form of a block of overdrive's.
pub fn reth_block(
    block: &AlloyBlock<TxEnvelope>,
    senders: Vec<alloy_primitives::Address>,
) -> RecoveredBlock<Block> {
    let body = block.body.clone();
    let block = Block {
        header: block.header.clone(),
        body: reth_ethereum_primitives::BlockBody {
            transactions: body.transactions.into_iter().map(Into::into).collect(),
            ommers: body.ommers,
            withdrawals: body.withdrawals,
        },
    };
    RecoveredBlock::new_unhashed(block, senders)
}

/// reth's form of a recovered block of overdrive's executor.
pub fn reth_recovered(block: &overdrive_primitives::BlockWithSenders) -> RecoveredBlock<Block> {
    let senders = block.transactions.iter().map(|tx| tx.signer()).collect();
    let alloy = AlloyBlock {
        header: block.header.clone(),
        body: alloy_consensus::BlockBody {
            transactions: block
                .transactions
                .iter()
                .map(|tx: &Recovered<TxEnvelope>| tx.inner().clone())
                .collect(),
            ommers: block.ommers.clone(),
            withdrawals: block.withdrawals.clone().map(Into::into),
        },
    };
    reth_block(&alloy, senders)
}

/// A child process killed when dropped, however the test ends.
pub struct KillOnDrop(pub Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Polls `check` every 200 ms until it gives a value; panics naming `what` after `timeout`.
pub fn wait_for<T>(what: &str, timeout: Duration, mut check: impl FnMut() -> Option<T>) -> T {
    let started = Instant::now();
    loop {
        if let Some(value) = check() {
            return value;
        }
        assert!(started.elapsed() < timeout, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A loopback port that is free now and that no other call in this process has returned.
///
/// Asking the kernel for port 0 and passing the number on races: until the node binds it, the
/// kernel may hand the same port to another test's node or to an outgoing connection (every RPC
/// poll takes an ephemeral port). So the ports come from below the kernel's ephemeral range,
/// each at most once per process, from an offset set by the process id so that two test
/// binaries running at once start in different places.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    const LOWEST: u32 = 10_000;
    let ephemeral = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(32_768);
    let span = ephemeral.saturating_sub(LOWEST).max(1_000);
    let start = std::process::id().wrapping_mul(7_919) % span;
    for _ in 0..span {
        let port = (LOWEST + (start + NEXT.fetch_add(1, Ordering::Relaxed)) % span) as u16;
        let free = std::net::TcpListener::bind(("127.0.0.1", port)).is_ok()
            && std::net::UdpSocket::bind(("127.0.0.1", port)).is_ok();
        if free {
            return port;
        }
    }
    panic!(
        "no free loopback port between {LOWEST} and {}",
        LOWEST + span
    )
}

/// One HTTP request to `127.0.0.1:port` (`body` is POSTed as JSON when given); the response
/// body, or `None` when nothing answers.
pub fn http(port: u16, path: &str, body: Option<&str>) -> Option<String> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream
        .set_read_timeout(Some(std::time::Duration::from_secs(30)))
        .ok()?;
    let request = match body {
        Some(body) => format!(
            "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        ),
        None => format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"),
    };
    stream.write_all(request.as_bytes()).ok()?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response).ok()?;
    let response = String::from_utf8_lossy(&response).into_owned();
    let (head, body) = response.split_once("\r\n\r\n")?;
    if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        // Chunked: size line, data, ... until a zero size.
        let mut out = String::new();
        let mut rest = body;
        while let Some((size, tail)) = rest.split_once("\r\n") {
            let size = usize::from_str_radix(size.trim(), 16).ok()?;
            if size == 0 {
                break;
            }
            out.push_str(tail.get(..size)?);
            rest = tail.get(size + 2..)?;
        }
        return Some(out);
    }
    Some(body.to_string())
}

/// A JSON-RPC call to the node's HTTP endpoint at `port`: its result.
pub fn rpc(port: u16, method: &str, params: serde_json::Value) -> Option<serde_json::Value> {
    rpc_response(port, method, params)?.get("result").cloned()
}

/// A JSON-RPC call to the node's HTTP endpoint at `port`: the whole response (result or
/// error).
pub fn rpc_response(
    port: u16,
    method: &str,
    params: serde_json::Value,
) -> Option<serde_json::Value> {
    let body = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
    serde_json::from_str(&http(port, "/", Some(&body.to_string()))?).ok()
}

/// The blocks' transactions as `eth_sendRawTransaction` takes them (0x-hex EIP-2718), in
/// block order.
pub fn raw_transactions(blocks: &[overdrive_primitives::BlockWithSenders]) -> Vec<String> {
    use alloy_eips::eip2718::Encodable2718;
    blocks
        .iter()
        .flat_map(|b| &b.transactions)
        .map(|tx| {
            format!(
                "0x{}",
                alloy_primitives::hex::encode(tx.inner().encoded_2718())
            )
        })
        .collect()
}

/// Sends raw transactions (0x-hex) with `eth_sendRawTransaction`, in JSON-RPC batches of 100;
/// with `strict`, no transaction may be refused.
pub fn send_raw(port: u16, raw: &[String], strict: bool) {
    for chunk in raw.chunks(100) {
        let batch: Vec<_> = chunk
            .iter()
            .enumerate()
            .map(|(i, tx)| serde_json::json!({"jsonrpc": "2.0", "id": i, "method": "eth_sendRawTransaction", "params": [tx]}))
            .collect();
        let response = http(
            port,
            "/",
            Some(&serde_json::Value::Array(batch).to_string()),
        )
        .expect("the node answers");
        assert!(
            !strict || !response.contains("\"error\""),
            "a transaction was refused: {response}"
        );
    }
}

/// The sum of a Prometheus counter's samples whose labels contain `label`.
pub fn counter(page: &str, name: &str, label: &str) -> f64 {
    page.lines()
        .filter(|l| l.contains(name) && l.contains(label) && !l.starts_with('#'))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// `node` flags that keep a test node off the network and on ports no other test holds: a
/// free P2P and engine port, no discovery, no IPC socket.
pub fn off_network() -> Vec<String> {
    vec![
        "--port".into(),
        free_port().to_string(),
        "--disable-discovery".into(),
        "--authrpc.port".into(),
        free_port().to_string(),
        "--ipcdisable".into(),
    ]
}

/// `overdrive-reth node --dev` on `genesis` with `flags`, its JSON-RPC on `http` and its
/// metrics on `metrics`, logging to `dir/node.log`; returns once the RPC answers.
pub fn dev_node(genesis: &Path, dir: &Path, http: u16, metrics: u16, flags: &[&str]) -> KillOnDrop {
    dev_node_within(genesis, dir, http, metrics, flags, Duration::from_secs(60))
}

/// [`dev_node`], waiting up to `timeout` for the RPC (a large genesis takes a while to write).
pub fn dev_node_within(
    genesis: &Path,
    dir: &Path,
    http: u16,
    metrics: u16,
    flags: &[&str],
    timeout: Duration,
) -> KillOnDrop {
    let log_path = dir.join("node.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let mut node = KillOnDrop(
        overdrive_reth()
            .args(["node", "--dev", "--color", "never", "--chain"])
            .arg(genesis)
            .arg("--datadir")
            .arg(dir.join("data"))
            .args(["--http", "--http.port", &http.to_string()])
            .args(["--http.api", "eth,net,web3,txpool"])
            .args(["--metrics", &format!("127.0.0.1:{metrics}")])
            .args(off_network())
            .args(flags)
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap(),
    );
    // A node that exits, or never answers, says why in its log.
    let log_tail = || imports::tail(&std::fs::read_to_string(&log_path).unwrap_or_default());
    let started = Instant::now();
    while rpc(http, "eth_blockNumber", serde_json::json!([])).is_none() {
        if let Some(status) = node.0.try_wait().unwrap() {
            panic!(
                "the node exited ({status}) before its RPC answered:\n{}",
                log_tail()
            );
        }
        assert!(
            started.elapsed() < timeout,
            "timed out waiting for the node's RPC ({timeout:?}):\n{}",
            log_tail()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    node
}
