//! `mailgate probe`: ask the local worker's `/readyz`, for container
//! health checks.

use anyhow::{Context as _, anyhow};

use crate::settings::Settings;

/// A plain HTTP/1.1 GET of `path` at `addr`: `(status, body)`. Enough for
/// probing mailgate's own endpoint without an HTTP client dependency.
pub async fn http_get(addr: std::net::SocketAddr, path: &str) -> anyhow::Result<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr)
        .await
        .with_context(|| format!("connecting to {addr}"))?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await?;
    let text = String::from_utf8_lossy(&raw);
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| anyhow!("not an HTTP response from {addr}"))?;
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    Ok((status, body))
}

/// How long `probe` waits for `/readyz` (it checks Redis and, at most every
/// few seconds, SMTP, each bounded by its own timeout).
const PROBE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Asks this host's worker (at `[http] listen`) whether it is ready, for
/// container health checks. Prints the report; returns whether it is.
pub async fn probe(settings: &Settings) -> anyhow::Result<bool> {
    let mut addr = settings.http.listen;
    if addr.ip().is_unspecified() {
        addr.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
    }
    // A health check must answer: a worker that accepts and never replies
    // is as unhealthy as one that is gone.
    let asked = tokio::time::timeout(PROBE_TIMEOUT, http_get(addr, "/readyz"));
    let (status, body) = asked
        .await
        .unwrap_or_else(|_| anyhow::bail!("no answer within {PROBE_TIMEOUT:?}"))
        .with_context(|| {
            format!("no worker answers at {addr} (is `mailgate worker` running? [http] listen)")
        })?;
    print!("{body}");
    Ok(status == 200)
}
