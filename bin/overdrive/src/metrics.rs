//! `--metrics <ADDR>`: a Prometheus endpoint, as reth's `--metrics` serves one.
//!
//! The components record through the `metrics` facade (so that inside reth they land in
//! reth's endpoint); this binary installs the Prometheus recorder and answers scrapes on one
//! plain thread. The binary has no async runtime, and a scrape is one small response, so the
//! exporter's own listener (hyper on tokio) would cost more than it serves.

use eyre::WrapErr;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use std::{
    io::{self, Read, Write},
    net::{SocketAddr, TcpListener, TcpStream},
    time::Duration,
};

/// How much of a request is read before answering: a scrape's request line and headers are
/// far shorter, and the rest of a longer request is ignored.
const MAX_REQUEST: usize = 8 * 1024;

/// How long a client may take to send its request, or to take the answer, before it is
/// dropped (the one serving thread is not held by a stalled client).
const CLIENT_TIMEOUT: Duration = Duration::from_secs(5);

/// How long the endpoint waits after a failed `accept` before trying again.
const ACCEPT_RETRY: Duration = Duration::from_millis(100);

/// How often histograms are drained into their summaries when nothing scrapes.
const UPKEEP_EVERY: Duration = Duration::from_secs(5);

/// Installs the Prometheus recorder, describes every component's metrics and serves them at
/// `addr` until the process exits. Returns the address it listens on (`addr` with port 0 gets
/// a free port).
pub fn serve(addr: SocketAddr) -> eyre::Result<SocketAddr> {
    let listener = TcpListener::bind(addr)
        .wrap_err_with(|| format!("cannot listen for metrics scrapes on {addr}"))?;
    let local = listener.local_addr()?;
    let handle = PrometheusBuilder::new()
        .install_recorder()
        .wrap_err("cannot install the Prometheus recorder")?;
    overdrive_executor::describe_metrics();
    overdrive_trie::describe_metrics();

    let upkeep = handle.clone();
    std::thread::Builder::new()
        .name("metrics-upkeep".into())
        .spawn(move || {
            loop {
                std::thread::sleep(UPKEEP_EVERY);
                upkeep.run_upkeep();
            }
        })?;
    std::thread::Builder::new()
        .name("metrics".into())
        .spawn(move || {
            for stream in listener.incoming() {
                match stream {
                    Ok(stream) => {
                        if let Err(e) = answer(stream, &handle) {
                            tracing::debug!(%e, "metrics scrape failed");
                        }
                    }
                    // Out of file descriptors, say: it will not clear at once, so wait a
                    // little rather than spin on it.
                    Err(e) => {
                        tracing::warn!(%e, "metrics endpoint cannot accept a connection");
                        std::thread::sleep(ACCEPT_RETRY);
                    }
                }
            }
        })?;
    tracing::info!(addr = %local, "serving Prometheus metrics");
    Ok(local)
}

/// Answers one request, whatever its path, with the current metrics, and closes the
/// connection.
fn answer(mut stream: TcpStream, handle: &PrometheusHandle) -> io::Result<()> {
    stream.set_read_timeout(Some(CLIENT_TIMEOUT))?;
    stream.set_write_timeout(Some(CLIENT_TIMEOUT))?;
    let mut request = [0u8; MAX_REQUEST];
    let mut len = 0;
    while len < request.len() && !request[..len].windows(4).any(|w| w == b"\r\n\r\n") {
        match stream.read(&mut request[len..])? {
            0 => break,
            n => len += n,
        }
    }
    handle.run_upkeep();
    let body = handle.render();
    write!(
        stream,
        "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n",
        body.len()
    )?;
    stream.write_all(body.as_bytes())?;
    stream.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scrape(addr: SocketAddr, request: &[u8]) -> String {
        let mut stream = TcpStream::connect(addr).unwrap();
        stream.write_all(request).unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).unwrap();
        response
    }

    // The only test in this binary that installs the global recorder (a process has one).
    #[test]
    fn serves_the_components_metrics_and_survives_bad_requests() {
        let addr = serve("127.0.0.1:0".parse().unwrap()).unwrap();
        metrics::counter!("overdrive_executor_blocks_total", "executor" => "test", "path" => "x")
            .increment(3);

        let response = scrape(addr, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(response.starts_with("HTTP/1.1 200 OK\r\n"), "{response}");
        assert!(
            response.contains("overdrive_executor_blocks_total{executor=\"test\",path=\"x\"} 3"),
            "{response}"
        );
        assert!(
            response.contains("# HELP overdrive_executor_blocks_total"),
            "{response}"
        );

        // An oversized request and a client that closes without a request are answered or
        // dropped without taking the endpoint down.
        let oversized = vec![b'a'; 3 * MAX_REQUEST];
        let mut stream = TcpStream::connect(addr).unwrap();
        let _ = stream.write_all(&oversized);
        drop(stream);
        drop(TcpStream::connect(addr).unwrap());
        let response = scrape(addr, b"GET / HTTP/1.0\r\n\r\n");
        assert!(
            response.contains("overdrive_executor_blocks_total"),
            "{response}"
        );

        // The address is taken now: a second endpoint on it is an error, not a panic.
        assert!(serve(addr).is_err());
    }
}
