//! A small JSON-RPC client over plain HTTP/1.1, one request per connection: enough to drive any
//! node's `eth_` API on a local or remote address without an HTTP stack.

use eyre::{WrapErr, bail, eyre};
use serde_json::{Value, json};
use std::{
    io::{Read, Write},
    net::{TcpStream, ToSocketAddrs},
    time::Duration,
};

/// How long one request may take before it counts as failed.
const TIMEOUT: Duration = Duration::from_secs(60);

/// A JSON-RPC endpoint, `http://HOST:PORT[/PATH]`.
#[derive(Clone)]
pub struct Rpc {
    host: String,
    path: String,
    /// A fresh `Authorization: Bearer` token for each request (the Engine API's JWT).
    bearer: Option<std::sync::Arc<dyn Fn() -> String + Send + Sync>>,
}

impl Rpc {
    /// Parses `url`; only plain `http://` is supported.
    pub fn new(url: &str) -> eyre::Result<Self> {
        let rest = url
            .strip_prefix("http://")
            .ok_or_else(|| eyre!("--rpc {url:?}: only http:// URLs are supported"))?;
        let (host, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/"),
        };
        if host.is_empty() {
            bail!("--rpc {url:?} names no host");
        }
        let host = if host.contains(':') {
            host.to_string()
        } else {
            format!("{host}:80")
        };
        Ok(Self {
            host,
            path: path.to_string(),
            bearer: None,
        })
    }

    /// Authenticates every request with a token from `token`.
    pub fn with_bearer(mut self, token: impl Fn() -> String + Send + Sync + 'static) -> Self {
        self.bearer = Some(std::sync::Arc::new(token));
        self
    }

    /// Calls `method`; its `result`, or its `error` as an error.
    pub fn call(&self, method: &str, params: Value) -> eyre::Result<Value> {
        let body = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
        let response: Value = serde_json::from_str(&self.post(&body.to_string())?)
            .wrap_err_with(|| format!("{method}: the answer is not JSON"))?;
        match (response.get("result"), response.get("error")) {
            (_, Some(error)) => bail!("{method}: {}", error_message(error)),
            (Some(result), None) => Ok(result.clone()),
            (None, None) => bail!("{method}: an answer with neither result nor error"),
        }
    }

    /// Sends `calls` (method, params) as one JSON-RPC batch; each call's result or error
    /// message, in the order given.
    pub fn batch(&self, calls: &[(&str, Value)]) -> eyre::Result<Vec<Result<Value, String>>> {
        let body: Vec<Value> = calls
            .iter()
            .enumerate()
            .map(|(id, (method, params))| {
                json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})
            })
            .collect();
        let response: Value = serde_json::from_str(&self.post(&Value::Array(body).to_string())?)
            .wrap_err("a batch's answer is not JSON")?;
        let Value::Array(answers) = response else {
            bail!(
                "a batch was answered by one object: {}",
                error_text(&response)
            );
        };
        let mut out = vec![Err("no answer".to_string()); calls.len()];
        for answer in answers {
            let id = answer
                .get("id")
                .and_then(Value::as_u64)
                .map(|id| id as usize);
            let Some(slot) = id.and_then(|id| out.get_mut(id)) else {
                bail!("a batch answer with an unknown id: {answer}");
            };
            *slot = match (answer.get("result"), answer.get("error")) {
                (_, Some(error)) => Err(error_message(error)),
                (Some(result), None) => Ok(result.clone()),
                (None, None) => Err("neither result nor error".to_string()),
            };
        }
        Ok(out)
    }

    /// Sends raw transactions in one `overdrive_sendRawTransactions` call; each one's hash or
    /// error message, in the order given.
    pub fn send_raw_transactions(&self, raw: &[&str]) -> eyre::Result<Vec<Result<Value, String>>> {
        let results = self.call("overdrive_sendRawTransactions", json!([raw]))?;
        let Value::Array(results) = results else {
            bail!("overdrive_sendRawTransactions answered {results}, not a list");
        };
        if results.len() != raw.len() {
            bail!(
                "overdrive_sendRawTransactions answered {} results for {} transactions",
                results.len(),
                raw.len()
            );
        }
        Ok(results
            .into_iter()
            .map(|result| match (result.get("hash"), result.get("error")) {
                (_, Some(error)) => Err(error_message(error)),
                (Some(hash), None) => Ok(hash.clone()),
                (None, None) => Err("neither hash nor error".to_string()),
            })
            .collect())
    }

    fn post(&self, body: &str) -> eyre::Result<String> {
        let address = self
            .host
            .to_socket_addrs()
            .wrap_err_with(|| format!("cannot resolve {}", self.host))?
            .next()
            .ok_or_else(|| eyre!("{} resolves to nothing", self.host))?;
        let mut stream = TcpStream::connect_timeout(&address, TIMEOUT)
            .wrap_err_with(|| format!("cannot connect to {}", self.host))?;
        stream.set_read_timeout(Some(TIMEOUT))?;
        stream.set_write_timeout(Some(TIMEOUT))?;
        stream.set_nodelay(true)?;
        let auth = self.bearer.as_ref().map_or_else(String::new, |token| {
            format!("Authorization: Bearer {}\r\n", token())
        });
        let request = format!(
            "POST {} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n{auth}Connection: close\r\n\r\n",
            self.path,
            self.host,
            body.len()
        );
        stream.write_all(request.as_bytes())?;
        stream.write_all(body.as_bytes())?;
        let mut response = Vec::new();
        stream
            .read_to_end(&mut response)
            .wrap_err_with(|| format!("reading the answer of {}", self.host))?;
        parse_response(&response)
    }
}

/// The body of an HTTP/1.1 response; an error for a status other than 200.
fn parse_response(response: &[u8]) -> eyre::Result<String> {
    let text = String::from_utf8_lossy(response);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| eyre!("a truncated HTTP answer ({} bytes)", response.len()))?;
    let status = head.lines().next().unwrap_or_default();
    if status.split_whitespace().nth(1) != Some("200") {
        bail!(
            "HTTP {status}: {}",
            body.chars().take(200).collect::<String>()
        );
    }
    if !head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        return Ok(body.to_string());
    }
    let mut rest = body;
    let mut out = String::new();
    loop {
        let (size, after) = rest
            .split_once("\r\n")
            .ok_or_else(|| eyre!("a truncated chunked answer"))?;
        let size = usize::from_str_radix(size.trim(), 16)
            .wrap_err_with(|| format!("bad chunk size {size:?}"))?;
        if size == 0 {
            return Ok(out);
        }
        let chunk = after
            .get(..size)
            .ok_or_else(|| eyre!("a chunk shorter than its size"))?;
        out.push_str(chunk);
        rest = after[size..].trim_start_matches("\r\n");
    }
}

fn error_message(error: &Value) -> String {
    error
        .get("message")
        .and_then(Value::as_str)
        .map_or_else(|| error.to_string(), str::to_string)
}

fn error_text(response: &Value) -> String {
    response
        .get("error")
        .map_or_else(|| response.to_string(), error_message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let rpc = Rpc::new("http://127.0.0.1:8545").unwrap();
        assert_eq!(
            (rpc.host.as_str(), rpc.path.as_str()),
            ("127.0.0.1:8545", "/")
        );
        let rpc = Rpc::new("http://node/rpc").unwrap();
        assert_eq!((rpc.host.as_str(), rpc.path.as_str()), ("node:80", "/rpc"));
        assert!(Rpc::new("https://node").is_err());
        assert!(Rpc::new("http:///x").is_err());
    }

    #[test]
    fn responses() {
        let plain = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n[]";
        assert_eq!(parse_response(plain).unwrap(), "[]");
        let chunked =
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\n[1,\r\n2\r\n2]\r\n0\r\n\r\n";
        assert_eq!(parse_response(chunked).unwrap(), "[1,2]");
        assert!(parse_response(b"HTTP/1.1 503 Busy\r\n\r\nlater").is_err());
        assert!(parse_response(b"HTTP/1.1 200").is_err());
        let short = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nff\r\nab";
        assert!(parse_response(short).is_err());
    }
}
