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
    time::{Duration, Instant},
};

/// How much of a request is read before answering: a scrape's request line and headers are
/// far shorter, and the rest of a longer request is ignored.
const MAX_REQUEST: usize = 8 * 1024;

/// How long a client may take to send its request (in all, however it trickles in), and to
/// take the answer: the one serving thread is held by a stalled client for at most this.
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
                        if let Err(e) = answer(stream, &handle, CLIENT_TIMEOUT) {
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
/// connection. The request gets at most `timeout` to arrive: past it, or once its head (up to
/// a blank line) or `MAX_REQUEST` bytes are in, the metrics are sent anyway, since nothing in
/// the request changes them.
fn answer(mut stream: TcpStream, handle: &PrometheusHandle, timeout: Duration) -> io::Result<()> {
    read_request_head(&mut stream, Instant::now() + timeout)?;
    handle.run_upkeep();
    let body = handle.render();
    // A scrape's body fits the socket's send buffer, so this does not wait on the client
    // unless it stopped reading with the buffer full; the timeout bounds that.
    stream.set_write_timeout(Some(timeout))?;
    write!(
        stream,
        "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n",
        body.len()
    )?;
    stream.write_all(body.as_bytes())?;
    stream.flush()
}

/// Reads from `stream` until the request head ends (`\r\n\r\n`, or `\n\n` from a client that
/// writes bare newlines), the client stops sending, `MAX_REQUEST` bytes are in, or `deadline`
/// passes. The read timeout is reset to what is left before each read, so a client that
/// trickles bytes cannot hold the serving thread past the deadline.
fn read_request_head(stream: &mut TcpStream, deadline: Instant) -> io::Result<()> {
    let mut request = [0u8; MAX_REQUEST];
    let mut len = 0;
    while len < request.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        stream.set_read_timeout(Some(left))?;
        let n = match stream.read(&mut request[len..]) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                break;
            }
            Err(e) => return Err(e),
        };
        // Only the new bytes and the three before them can complete the terminator.
        let seen = &request[len.saturating_sub(3)..len + n];
        len += n;
        if seen.windows(4).any(|w| w == b"\r\n\r\n") || seen.windows(2).any(|w| w == b"\n\n") {
            break;
        }
    }
    Ok(())
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

    /// Answers one connection on a listener of its own, with a recorder that is not
    /// installed, and returns what the client read and how long the server took.
    fn answer_one(timeout: Duration, client: impl FnOnce(TcpStream) + Send) -> (String, Duration) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let handle = PrometheusBuilder::new().build_recorder().handle();
        std::thread::scope(|scope| {
            let server = scope.spawn(move || {
                let (stream, _) = listener.accept().unwrap();
                let started = Instant::now();
                answer(stream, &handle, timeout).unwrap();
                started.elapsed()
            });
            let mut stream = TcpStream::connect(addr).unwrap();
            client(stream.try_clone().unwrap());
            let mut response = String::new();
            stream.read_to_string(&mut response).unwrap();
            (response, server.join().unwrap())
        })
    }

    #[test]
    fn a_request_ending_in_bare_newlines_is_answered_at_once() {
        let (response, took) = answer_one(Duration::from_secs(30), |mut s| {
            s.write_all(b"GET / HTTP/1.0\n\n").unwrap();
        });
        assert!(response.starts_with("HTTP/1.1 200 OK\r\n"), "{response}");
        assert!(took < Duration::from_secs(10), "{took:?}");
    }

    #[test]
    fn a_trickling_client_is_answered_at_the_deadline() {
        let timeout = Duration::from_millis(300);
        let (response, took) = answer_one(timeout, |mut s| {
            // A byte every 50 ms, never ending the head, then silence with the connection
            // open: each read alone is well inside the timeout, the whole request is not.
            for _ in 0..5 {
                s.write_all(b"G").unwrap();
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        assert!(response.starts_with("HTTP/1.1 200 OK\r\n"), "{response}");
        assert!(took >= timeout && took < 3 * timeout, "{took:?}");
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
