//! The CLI's connection to a node's admin HTTP: plaintext for `HOST:PORT` (or
//! `http://HOST:PORT`), TLS for `https://HOST:PORT`, the node's certificate checked against
//! the CA file in `ALLOT_TLS_CA` (a node run with `--admin-tls`, D60).

use std::path::PathBuf;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

/// A connection either way.
pub trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// Connects to `addr`; also answers the `HOST:PORT` to put in the `Host` header.
pub async fn connect(addr: &str) -> Result<(Box<dyn Io>, String), String> {
    if let Some(host_port) = addr.strip_prefix("https://") {
        let host_port = host_port.trim_end_matches('/');
        let ca = std::env::var_os("ALLOT_TLS_CA")
            .map(PathBuf::from)
            .ok_or_else(|| {
                format!(
                    "{addr}: an https address needs ALLOT_TLS_CA, the CA file its certificate is \
                 checked against"
                )
            })?;
        let stream = allot_proto::tls::connect_admin(host_port, &ca)
            .await
            .map_err(|e| e.to_string())?;
        return Ok((Box::new(stream), host_port.to_owned()));
    }
    let host_port = addr
        .strip_prefix("http://")
        .unwrap_or(addr)
        .trim_end_matches('/');
    let stream = TcpStream::connect(host_port)
        .await
        .map_err(|e| format!("cannot connect to {host_port}: {e}"))?;
    Ok((Box::new(stream), host_port.to_owned()))
}
