//! A `node --dev` of `overdrive-reth` for `--compare`: started on free local ports with a
//! transaction pool and block gas limit that do not cap the load, stopped with SIGTERM (then
//! SIGKILL) when the run is over or the command fails.

use super::rpc::Rpc;
use eyre::{WrapErr, bail};
use std::{
    path::Path,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

/// How long a node may take to answer JSON-RPC after it starts, and on top of that for each
/// MiB of its genesis file (a new node writes the genesis state and its trie before it answers:
/// minutes for millions of accounts).
const STARTUP: Duration = Duration::from_secs(120);
const STARTUP_PER_GENESIS_MIB: Duration = Duration::from_secs(1);
/// How long a node may take to shut down after SIGTERM before it is killed.
const SHUTDOWN: Duration = Duration::from_secs(60);

pub struct DevNodeConfig<'a> {
    pub binary: &'a Path,
    pub genesis: &'a Path,
    pub datadir: &'a Path,
    pub log: &'a Path,
    pub gas_limit: u64,
    pub block_time: usize,
    /// The components' switches (none: stock reth).
    pub flags: &'a [&'a str],
    /// A node fed through the Engine API with this secret, instead of a `--dev` node mining
    /// its own blocks (`gas_limit` and `block_time` then do not apply).
    pub jwt: Option<&'a Path>,
}

pub struct DevNode {
    child: Option<Child>,
    http: u16,
    metrics: u16,
    auth: u16,
}

/// Where a node spends its time, from reth's metrics (sums of histograms, in seconds): the
/// stage's name, the metric, and a label the sample must carry.
pub const STAGES: [(&str, &str, &str); 7] = [
    (
        "intake (eth_sendRawTransaction)",
        "reth_rpc_server_calls_time_seconds_sum",
        "method=\"eth_sendRawTransaction\"",
    ),
    (
        "intake (overdrive_sendRawTransactions)",
        "reth_rpc_server_calls_time_seconds_sum",
        "method=\"overdrive_sendRawTransactions\"",
    ),
    (
        "build (payload resolve)",
        "reth_payloads_resolve_duration_seconds_sum",
        "",
    ),
    (
        "validation (newPayload, total)",
        "reth_sync_block_validation_total_duration_sum",
        "",
    ),
    (
        "execution",
        "reth_sync_execution_execution_histogram_sum",
        "",
    ),
    (
        "state root",
        "reth_sync_block_validation_state_root_histogram_sum",
        "",
    ),
    (
        "persistence",
        "reth_consensus_engine_persistence_save_blocks_duration_seconds_sum",
        "",
    ),
];

impl DevNode {
    /// Starts the node and waits until it answers `eth_blockNumber`.
    pub fn start(config: &DevNodeConfig<'_>) -> eyre::Result<Self> {
        let log = std::fs::File::create(config.log)
            .wrap_err_with(|| format!("creating {}", config.log.display()))?;
        let http = free_port()?;
        let metrics = free_port()?;
        let auth = free_port()?;
        let mut command = Command::new(config.binary);
        command.arg("node");
        match config.jwt {
            None => {
                // A block gas limit and a pool that do not cap the load.
                let gas_limit = config.gas_limit.to_string();
                let big = "100000000";
                let size = "100000";
                command
                    .args([
                        "--dev",
                        "--dev.block-time",
                        &format!("{}s", config.block_time),
                    ])
                    .args([
                        "--builder.gaslimit",
                        &gas_limit,
                        "--txpool.gas-limit",
                        &gas_limit,
                    ])
                    .args([
                        "--txpool.pending-max-count",
                        big,
                        "--txpool.pending-max-size",
                        size,
                    ])
                    .args([
                        "--txpool.queued-max-count",
                        big,
                        "--txpool.queued-max-size",
                        size,
                    ])
                    .args([
                        "--txpool.basefee-max-count",
                        big,
                        "--txpool.basefee-max-size",
                        size,
                    ])
                    .args(["--txpool.max-account-slots", big])
                    .arg("--txpool.disable-transactions-backup");
            }
            Some(secret) => {
                command.arg("--authrpc.jwtsecret").arg(secret);
            }
        }
        let child = command
            .arg("--chain")
            .arg(config.genesis)
            .arg("--datadir")
            .arg(config.datadir)
            .args([
                "--http",
                "--http.port",
                &http.to_string(),
                "--http.api",
                "eth,net,web3,txpool",
            ])
            .args(["--port", &free_port()?.to_string(), "--disable-discovery"])
            .args(["--authrpc.port", &auth.to_string(), "--ipcdisable"])
            .args(["--rpc.max-connections", "10000"])
            .args(["--metrics", &format!("127.0.0.1:{metrics}")])
            .args(["--color", "never"])
            .args(config.flags)
            .stdout(log.try_clone()?)
            .stderr(log)
            .stdin(Stdio::null())
            .spawn()
            .wrap_err_with(|| format!("starting {}", config.binary.display()))?;
        let mut node = Self {
            child: Some(child),
            http,
            metrics,
            auth,
        };
        let rpc = Rpc::new(&node.rpc_url())?;
        let genesis_mib = std::fs::metadata(config.genesis).map_or(0, |m| m.len() >> 20);
        let startup = STARTUP + STARTUP_PER_GENESIS_MIB * genesis_mib as u32;
        let started = Instant::now();
        while rpc.call("eth_blockNumber", serde_json::json!([])).is_err() {
            if let Some(status) = node
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                bail!(
                    "the node exited with {status} before answering; see {}",
                    config.log.display()
                );
            }
            if started.elapsed() > startup {
                bail!(
                    "the node did not answer within {startup:?}; see {}",
                    config.log.display()
                );
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        Ok(node)
    }

    /// CPU seconds (user and system) the node has used so far, from `/proc`.
    pub fn cpu_seconds(&self) -> Option<f64> {
        let pid = self.child.as_ref()?.id();
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // Fields after the command name, which is in parentheses and may hold spaces.
        let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
        let ticks: u64 =
            fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
        // SAFETY: sysconf has no preconditions.
        let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
        (per_second > 0).then(|| ticks as f64 / per_second as f64)
    }

    /// The most resident memory the node has held so far, in MiB, from `/proc` (`VmHWM`).
    pub fn peak_memory_mib(&self) -> Option<f64> {
        let pid = self.child.as_ref()?.id();
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        peak_kib(&status).map(|kib| kib as f64 / 1024.0)
    }

    /// The seconds each of [`STAGES`] has taken so far (0 for a metric not exported yet).
    pub fn stage_seconds(&self) -> eyre::Result<Vec<f64>> {
        let page = self.metrics_page()?;
        Ok(STAGES
            .iter()
            .map(|(_, metric, label)| metric_sum(&page, metric, label))
            .collect())
    }

    /// The node's metrics page now (Prometheus text; [`metric_sum`] reads it).
    pub fn metrics_page(&self) -> eyre::Result<String> {
        http_get(self.metrics)
    }

    pub fn engine_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.auth)
    }

    pub fn rpc_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.http)
    }

    /// SIGTERM, then SIGKILL after [`SHUTDOWN`].
    pub fn stop(mut self) {
        self.shut_down();
    }

    fn shut_down(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        // SAFETY: signalling our own child by its pid.
        unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
        let started = Instant::now();
        while started.elapsed() < SHUTDOWN {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

impl Drop for DevNode {
    fn drop(&mut self) {
        self.shut_down();
    }
}

/// `VmHWM` of a `/proc/PID/status` page, in KiB.
fn peak_kib(status: &str) -> Option<u64> {
    let line = status.lines().find(|line| line.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// The sum of the samples of `metric` carrying `label` ("" for any) on a Prometheus text page
/// (0 for a metric not exported yet).
pub fn metric_sum(page: &str, metric: &str, label: &str) -> f64 {
    page.lines()
        .filter(|line| line.starts_with(metric) && line.contains(label))
        .filter(|line| line[metric.len()..].starts_with([' ', '{']))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        // Not `sum()`: a float sum of nothing is -0.
        .fold(0.0, |total, value| total + value)
}

/// The body of `GET /` on a local port.
fn http_get(port: u16) -> eyre::Result<String> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    write!(
        stream,
        "GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    Ok(response
        .split_once("\r\n\r\n")
        .map_or(response.clone(), |(_, body)| body.to_string()))
}

/// A local port nothing listens on now.
fn free_port() -> eyre::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

#[cfg(test)]
mod tests {
    use super::{metric_sum, peak_kib};

    #[test]
    fn the_peak_is_read_from_the_status_page() {
        let status = "Name:\toverdrive-reth\nVmPeak:\t 9000000 kB\nVmHWM:\t  812345 kB\nVmRSS:\t 700000 kB\n";
        assert_eq!(peak_kib(status), Some(812_345));
        assert_eq!(peak_kib("Name:\tx\nVmRSS:\t1 kB\n"), None);
    }

    #[test]
    fn metric_sums_add_the_samples_with_the_label() {
        let page = "# TYPE reth_trie_cursor_operations summary\n\
            reth_trie_cursor_operations{type=\"state\",operation=\"seek\",quantile=\"0.5\"} 9\n\
            reth_trie_cursor_operations_sum{type=\"state\",operation=\"seek\"} 120\n\
            reth_trie_cursor_operations_sum{type=\"state\",operation=\"next\"} 30.5\n\
            reth_trie_cursor_operations_sum{type=\"storage\",operation=\"seek\"} 7\n\
            reth_trie_cursor_operations_sum_other 1000\n\
            reth_trie_cursor_operations_count{type=\"state\",operation=\"seek\"} 4\n\
            reth_payloads_resolve_duration_seconds_sum 2.5\n";
        let sum = |metric, label| metric_sum(page, metric, label);
        assert_eq!(
            sum("reth_trie_cursor_operations_sum", "type=\"state\""),
            150.5
        );
        assert_eq!(
            sum("reth_trie_cursor_operations_sum", "type=\"storage\""),
            7.0
        );
        assert_eq!(sum("reth_trie_cursor_operations_sum", ""), 157.5);
        assert_eq!(sum("reth_payloads_resolve_duration_seconds_sum", ""), 2.5);
        assert!(sum("reth_not_exported_sum", "").to_bits() == 0.0f64.to_bits());
    }
}
