//! Mutual TLS between allot's daemons (D58 in docs/decisions.md): who a peer is comes from its
//! certificate, never from a field of its messages.
//!
//! Every certificate a cluster's CA signs names one peer in a URI subject alternative name,
//! SPIFFE-style: `spiffe://allot/node/2` (a coordinator node), `spiffe://allot/region/eu-west`
//! (a regional agent), `spiffe://allot/gateway/edge-1` (a caller of an agent). A daemon loads
//! its own certificate, key and the CA from files ([`TlsFiles`]); its servers require a client
//! certificate signed by that CA, its clients verify the server's against it, and a handler
//! reads the caller's identity with [`peer_of`]. `allot certs init` writes such a set.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};
use x509_parser::extensions::GeneralName;
use x509_parser::pem::Pem;
use x509_parser::prelude::{FromDer, X509Certificate};

use crate::error::WireError;

/// The trust domain of the identities allot's certificates carry.
pub const TRUST_DOMAIN: &str = "allot";

/// Largest certificate, key or CA file read (a chain of a few certificates is a few KiB).
pub const MAX_PEM_BYTES: u64 = 256 * 1024;

/// Who a certificate says its holder is.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Peer {
    /// A coordinator node, by its raft id.
    Node(u64),
    /// A regional agent, by its region's name.
    Region(String),
    /// A gateway calling an agent, by the name it was issued under.
    Gateway(String),
}

impl Peer {
    /// The URI naming this peer in a certificate.
    pub fn uri(&self) -> String {
        match self {
            Peer::Node(id) => format!("spiffe://{TRUST_DOMAIN}/node/{id}"),
            Peer::Region(r) => format!("spiffe://{TRUST_DOMAIN}/region/{r}"),
            Peer::Gateway(g) => format!("spiffe://{TRUST_DOMAIN}/gateway/{g}"),
        }
    }

    /// The peer a URI names; `None` for any other URI (another trust domain, another kind).
    pub fn from_uri(uri: &str) -> Option<Peer> {
        let path = uri.strip_prefix("spiffe://")?.strip_prefix(TRUST_DOMAIN)?;
        let (kind, name) = path.strip_prefix('/')?.split_once('/')?;
        if name.is_empty() || name.contains('/') {
            return None;
        }
        match kind {
            "node" => name.parse().ok().map(Peer::Node),
            "region" => Some(Peer::Region(name.to_owned())),
            "gateway" => Some(Peer::Gateway(name.to_owned())),
            _ => None,
        }
    }
}

impl fmt::Display for Peer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Peer::Node(id) => write!(f, "node {id}"),
            Peer::Region(r) => write!(f, "region {r}"),
            Peer::Gateway(g) => write!(f, "gateway {g}"),
        }
    }
}

/// The one peer a DER certificate names: exactly one allot URI among its subject alternative
/// names (a certificate naming two peers would let its holder choose).
pub fn peer_in(der: &[u8]) -> Result<Peer, WireError> {
    let (_, cert) = X509Certificate::from_der(der)
        .map_err(|e| WireError::Tls(format!("not an X.509 certificate: {e}")))?;
    let san = cert
        .subject_alternative_name()
        .map_err(|e| WireError::Tls(format!("unreadable subject alternative names: {e}")))?;
    let mut peers = san
        .into_iter()
        .flat_map(|s| s.value.general_names.iter())
        .filter_map(|n| match n {
            GeneralName::URI(uri) => Peer::from_uri(uri),
            _ => None,
        });
    let Some(peer) = peers.next() else {
        return Err(WireError::Tls(format!(
            "the certificate names no spiffe://{TRUST_DOMAIN}/ peer"
        )));
    };
    if peers.next().is_some() {
        return Err(WireError::Tls(
            "the certificate names more than one peer".to_owned(),
        ));
    }
    Ok(peer)
}

/// The caller of a request, from the client certificate its connection presented: `Ok(None)`
/// on a plaintext connection (no TLS configured), an error when TLS is on and the certificate
/// names no single peer.
pub fn peer_of<T>(request: &tonic::Request<T>) -> Result<Option<Peer>, WireError> {
    let Some(certs) = request.peer_certs() else {
        return Ok(None);
    };
    let leaf = certs
        .first()
        .ok_or_else(|| WireError::Tls("the connection presented no certificate".to_owned()))?;
    peer_in(leaf.as_ref()).map(Some)
}

/// Where a daemon's certificate, its key and the cluster's CA are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub ca: PathBuf,
}

impl TlsFiles {
    /// All three or none: `Ok(None)` when no file is named.
    pub fn from_flags(
        cert: Option<PathBuf>,
        key: Option<PathBuf>,
        ca: Option<PathBuf>,
    ) -> Result<Option<TlsFiles>, WireError> {
        match (cert, key, ca) {
            (None, None, None) => Ok(None),
            (Some(cert), Some(key), Some(ca)) => Ok(Some(TlsFiles { cert, key, ca })),
            _ => Err(WireError::Tls(
                "--tls-cert, --tls-key and --tls-ca go together: name all three or none".to_owned(),
            )),
        }
    }

    /// Reads and checks the three files (each PEM of the right kind, the certificate naming
    /// one peer): the daemon's TLS, read again whenever the files change.
    pub fn load(&self) -> Result<Tls, WireError> {
        let material = Material::read(self)?;
        Ok(Tls {
            files: self.clone(),
            me: material.me.clone(),
            current: Arc::new(Mutex::new(Current {
                stamp: stamp(self),
                checked: Instant::now(),
                material,
            })),
        })
    }
}

fn read_pem(path: &Path) -> Result<Vec<u8>, WireError> {
    use std::io::Read;
    let file = std::fs::File::open(path)
        .map_err(|e| WireError::Tls(format!("cannot open {}: {e}", path.display())))?;
    let mut bytes = Vec::new();
    file.take(MAX_PEM_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| WireError::Tls(format!("cannot read {}: {e}", path.display())))?;
    if bytes.len() as u64 > MAX_PEM_BYTES {
        return Err(WireError::Tls(format!(
            "{}: larger than {MAX_PEM_BYTES} bytes, not a certificate or key",
            path.display()
        )));
    }
    Ok(bytes)
}

/// The contents of the first PEM block in `bytes`, which must be of a kind `wanted` accepts.
fn first_block(
    path: &Path,
    bytes: &[u8],
    wanted: impl Fn(&str) -> bool,
) -> Result<Vec<u8>, WireError> {
    let bad = |why: String| WireError::Tls(format!("{}: {why}", path.display()));
    let block = Pem::iter_from_buffer(bytes)
        .next()
        .ok_or_else(|| bad("no PEM block".to_owned()))?
        .map_err(|e| bad(format!("not PEM: {e}")))?;
    if !wanted(&block.label) {
        return Err(bad(format!(
            "a PEM block of kind {:?}, not the one expected",
            block.label
        )));
    }
    Ok(block.contents)
}

/// How often a daemon looks at its files' modification times (at a new connection or dial,
/// not more often than this).
pub const RELOAD_CHECK_INTERVAL: Duration = Duration::from_secs(1);

/// A daemon's TLS: its certificate, key and CA as last read, read again when the files change
/// (their modification times or sizes). New connections take the new material; open ones keep
/// theirs. A change that does not load (a half-written file, a certificate naming another
/// peer) is logged and the material before it kept. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Tls {
    files: TlsFiles,
    me: Peer,
    current: Arc<Mutex<Current>>,
}

#[derive(Debug)]
struct Current {
    stamp: Stamp,
    checked: Instant,
    material: Material,
}

/// Each file's modification time and length.
type Stamp = [Option<(SystemTime, u64)>; 3];

fn stamp(files: &TlsFiles) -> Stamp {
    let one = |p: &Path| {
        let m = std::fs::metadata(p).ok()?;
        Some((m.modified().ok()?, m.len()))
    };
    [one(&files.cert), one(&files.key), one(&files.ca)]
}

/// What one read of the files gave.
#[derive(Clone, Debug)]
struct Material {
    me: Peer,
    identity: Identity,
    ca: Certificate,
    /// One server configuration per [`Serving`], in its order.
    servers: [Arc<rustls::ServerConfig>; 3],
}

impl Material {
    fn read(files: &TlsFiles) -> Result<Material, WireError> {
        let cert = read_pem(&files.cert)?;
        let key = read_pem(&files.key)?;
        let ca = read_pem(&files.ca)?;
        let leaf = first_block(&files.cert, &cert, |l| l == "CERTIFICATE")?;
        first_block(&files.key, &key, |l| l.ends_with("PRIVATE KEY"))?;
        first_block(&files.ca, &ca, |l| l == "CERTIFICATE")?;
        let me =
            peer_in(&leaf).map_err(|e| WireError::Tls(format!("{}: {e}", files.cert.display())))?;
        let servers = [Serving::Peers, Serving::Gateways, Serving::AdminHttp]
            .map(|s| server_config(&cert, &key, &ca, s).map(Arc::new));
        let [peers, gateways, admin] = servers;
        Ok(Material {
            me,
            identity: Identity::from_pem(cert, key),
            ca: Certificate::from_pem(ca),
            servers: [peers?, gateways?, admin?],
        })
    }
}

/// What a TLS server serves, which decides whether its clients must present a certificate and
/// which protocol it speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Serving {
    /// The daemons' links (gRPC): a certificate the CA signed, or no connection.
    Peers,
    /// The agent's gateway port (gRPC, D59): a certificate, when presented, must be the CA's;
    /// a client without one may still prove itself with a bearer token.
    Gateways,
    /// A daemon's admin HTTP (HTTP/1.1, D60): a client certificate optional, as above;
    /// changes need the admin token.
    AdminHttp,
}

impl Serving {
    fn index(self) -> usize {
        self as usize
    }
}

/// A server that checks client certificates against the CA.
fn server_config(
    cert: &[u8],
    key: &[u8],
    ca: &[u8],
    serving: Serving,
) -> Result<rustls::ServerConfig, WireError> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let bad = |what: &str, e: String| WireError::Tls(format!("{what}: {e}"));
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert)
        .collect::<Result<_, _>>()
        .map_err(|e| bad("certificate", e.to_string()))?;
    let key = PrivateKeyDer::from_pem_slice(key).map_err(|e| bad("key", e.to_string()))?;
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(ca) {
        let c = c.map_err(|e| bad("CA", e.to_string()))?;
        roots.add(c).map_err(|e| bad("CA", e.to_string()))?;
    }
    let mut verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    );
    if serving != Serving::Peers {
        verifier = verifier.allow_unauthenticated();
    }
    let verifier = verifier.build().map_err(|e| bad("CA", e.to_string()))?;
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| bad("protocol versions", e.to_string()))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)
        .map_err(|e| bad("certificate and key", e.to_string()))?;
    config.alpn_protocols = match serving {
        Serving::Peers | Serving::Gateways => vec![b"h2".to_vec()],
        Serving::AdminHttp => vec![b"http/1.1".to_vec()],
    };
    Ok(config)
}

impl Tls {
    /// Who this daemon's certificate says it is (a reload keeps it).
    pub fn me(&self) -> &Peer {
        &self.me
    }

    /// The server side as the files say now: a client certificate the CA signed is required.
    pub fn server_config(&self) -> Arc<rustls::ServerConfig> {
        self.server_config_for(Serving::Peers)
    }

    /// The server side for `serving` as the files say now.
    pub fn server_config_for(&self, serving: Serving) -> Arc<rustls::ServerConfig> {
        self.fresh().servers[serving.index()].clone()
    }

    /// A client presenting this daemon's certificate and verifying the server's against the
    /// CA (the server's name is the address's host, which its certificate must name), as the
    /// files say now.
    pub fn client(&self) -> ClientTlsConfig {
        let m = self.fresh();
        ClientTlsConfig::new()
            .identity(m.identity)
            .ca_certificate(m.ca)
    }

    fn fresh(&self) -> Material {
        let mut current = self.current.lock().unwrap_or_else(|p| p.into_inner());
        if current.checked.elapsed() < RELOAD_CHECK_INTERVAL {
            return current.material.clone();
        }
        current.checked = Instant::now();
        let now = stamp(&self.files);
        if now == current.stamp {
            return current.material.clone();
        }
        match Material::read(&self.files) {
            Ok(m) if m.me == self.me => {
                tracing::info!(cert = %self.files.cert.display(), "TLS files changed: reloaded");
                current.stamp = now;
                current.material = m;
            }
            Ok(m) => tracing::warn!(
                cert = %self.files.cert.display(),
                names = %m.me,
                "TLS files changed to a certificate of another peer: kept the one before"
            ),
            // Not stamped: a file still being written is read again at the next check.
            Err(e) => {
                tracing::warn!(error = %e, "TLS files changed but do not load: kept the ones before")
            }
        }
        current.material.clone()
    }
}

/// Accepts connections on `listener` and hands on those whose TLS handshake completes, each
/// with the server configuration in force when it arrived (so replaced files apply to the
/// next connection). At most `MAX_HANDSHAKES` handshakes run at once, each within
/// `HANDSHAKE_TIMEOUT`; a failed one is logged at debug and dropped.
pub fn tls_incoming(
    listener: tokio::net::TcpListener,
    tls: Tls,
    serving: Serving,
) -> tokio_stream::wrappers::ReceiverStream<
    std::io::Result<tokio_rustls::server::TlsStream<tokio::net::TcpStream>>,
> {
    let (tx, rx) = tokio::sync::mpsc::channel(MAX_HANDSHAKES);
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_HANDSHAKES));
    tokio::spawn(async move {
        loop {
            let Ok(permit) = slots.clone().acquire_owned().await else {
                return;
            };
            let tcp = tokio::select! {
                accepted = listener.accept() => accepted,
                () = tx.closed() => return,
            };
            let tcp = match tcp {
                Ok((tcp, _)) => tcp,
                Err(e) => {
                    tracing::debug!(error = %e, "accept failed");
                    continue;
                }
            };
            // Heartbeats and votes are one small frame each: without this, Nagle holds them
            // back behind the peer's delayed acknowledgement.
            let _ = tcp.set_nodelay(true);
            let acceptor = tokio_rustls::TlsAcceptor::from(tls.server_config_for(serving));
            let tx = tx.clone();
            tokio::spawn(async move {
                let shaken = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await;
                drop(permit);
                match shaken {
                    Ok(Ok(stream)) => {
                        let _ = tx.send(Ok(stream)).await;
                    }
                    Ok(Err(e)) => tracing::debug!(error = %e, "TLS handshake failed"),
                    Err(_) => tracing::debug!("TLS handshake timed out"),
                }
            });
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}

#[cfg(feature = "axum")]
/// An HTTP port's connections (axum's `Listener`) once their TLS handshake completes
/// (`tls_incoming`: bounded handshakes, the files in force at each connection).
pub struct TlsListener {
    incoming: tokio_stream::wrappers::ReceiverStream<
        std::io::Result<tokio_rustls::server::TlsStream<tokio::net::TcpStream>>,
    >,
    local: std::net::SocketAddr,
}

#[cfg(feature = "axum")]
impl TlsListener {
    pub fn new(listener: tokio::net::TcpListener, tls: Tls) -> TlsListener {
        let local = listener
            .local_addr()
            .unwrap_or_else(|_| std::net::SocketAddr::from(([0, 0, 0, 0], 0)));
        TlsListener {
            incoming: tls_incoming(listener, tls, Serving::AdminHttp),
            local,
        }
    }
}

#[cfg(feature = "axum")]
impl axum::serve::Listener for TlsListener {
    type Io = tokio_rustls::server::TlsStream<tokio::net::TcpStream>;
    type Addr = std::net::SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        use tokio_stream::StreamExt;
        loop {
            match self.incoming.next().await {
                Some(Ok(stream)) => {
                    let peer = stream.get_ref().0.peer_addr().unwrap_or(self.local);
                    return (stream, peer);
                }
                Some(Err(e)) => tracing::debug!(error = %e, "admin connection failed"),
                // The acceptor ended (the listener failed): serve nothing more.
                None => std::future::pending().await,
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
    }
}

/// Most TLS handshakes in progress at once on one listener.
pub const MAX_HANDSHAKES: usize = 256;
/// Longest a handshake may take.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// How a daemon dials the others: plaintext, or TLS with its certificate. One per process
/// (a daemon has one identity), cloned into each client.
#[derive(Clone, Debug, Default)]
pub struct Dialer {
    tls: Option<Tls>,
}

impl Dialer {
    pub fn plaintext() -> Dialer {
        Dialer::default()
    }

    pub fn with_tls(tls: &Tls) -> Dialer {
        Dialer {
            tls: Some(tls.clone()),
        }
    }

    pub fn is_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// An endpoint for `host:port`: `https` with this daemon's certificate, or `http`.
    pub fn endpoint(&self, addr: &str) -> Result<Endpoint, WireError> {
        let bad = |e: tonic::transport::Error| WireError::Tls(format!("address {addr}: {e}"));
        match &self.tls {
            Some(tls) => Endpoint::from_shared(format!("https://{addr}"))
                .and_then(|e| e.tls_config(tls.client()))
                .map_err(bad),
            None => Endpoint::from_shared(format!("http://{addr}")).map_err(bad),
        }
    }
}

/// A TLS connection to `addr` (`HOST:PORT`) for the CLI's admin HTTP calls: the server's
/// certificate is checked against the CA in `ca` and must name `HOST`; no client certificate.
pub async fn connect_admin(
    addr: &str,
    ca: &Path,
) -> Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>, WireError> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, ServerName};
    let bad = |e: String| WireError::Tls(format!("{addr}: {e}"));
    let pem = read_pem(ca)?;
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(&pem) {
        let c = c.map_err(|e| bad(format!("{}: {e}", ca.display())))?;
        roots
            .add(c)
            .map_err(|e| bad(format!("{}: {e}", ca.display())))?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| bad(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let name = ServerName::try_from(host.to_owned()).map_err(|e| bad(e.to_string()))?;
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| bad(format!("cannot connect: {e}")))?;
    tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .map_err(|e| bad(format!("TLS: {e}")))
}

/// The SHA-256 of a bearer token, as callers files and `--admin-token-sha256` hold it (D59): a
/// file or a flag may be read by more people than should hold the token, and a token is
/// random, so a plain digest suffices.
pub fn token_sha256(token: &str) -> [u8; 32] {
    let digest = ring::digest::digest(&ring::digest::SHA256, token.as_bytes());
    let mut out = [0u8; 32];
    out.copy_from_slice(digest.as_ref());
    out
}

/// A SHA-256 digest written as 64 hex digits.
pub fn parse_sha256_hex(hex: &str) -> Result<[u8; 32], String> {
    let bad = || format!("{hex:?} is not a SHA-256 digest: 64 hex digits");
    if hex.len() != 64 || !hex.is_ascii() {
        return Err(bad());
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
    }
    Ok(out)
}

/// The token of an `authorization: Bearer TOKEN` value; `None` for any other value.
pub fn bearer(authorization: &str) -> Option<&str> {
    let token = authorization.strip_prefix("Bearer ")?.trim();
    (!token.is_empty()).then_some(token)
}

/// The SHA-256 of the bearer token an HTTP request's `authorization` header carries, if it
/// carries one: what the admin HTTP of either daemon compares with its configured digests.
pub fn bearer_sha256(headers: &tonic::codegen::http::HeaderMap) -> Option<[u8; 32]> {
    let value = headers.get(tonic::codegen::http::header::AUTHORIZATION)?;
    bearer(value.to_str().ok()?).map(token_sha256)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_tokens_and_digests_read_only_in_their_exact_forms() {
        assert_eq!(bearer("Bearer abc"), Some("abc"));
        assert_eq!(bearer("Bearer  abc "), Some("abc"));
        assert_eq!(bearer("bearer abc"), None);
        assert_eq!(bearer("abc"), None);
        assert_eq!(bearer("Bearer "), None);
        // printf %s abc | sha256sum
        let abc = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
        assert_eq!(parse_sha256_hex(abc), Ok(token_sha256("abc")));
        assert_eq!(
            parse_sha256_hex(&abc.to_uppercase()),
            Ok(token_sha256("abc"))
        );
        assert!(parse_sha256_hex(&abc[..63]).is_err());
        assert!(parse_sha256_hex(&format!("{}g", &abc[..63])).is_err());
        assert!(parse_sha256_hex(&format!("{}é", &abc[..62])).is_err());
    }

    #[test]
    fn a_uri_names_a_peer_only_in_the_trust_domain_and_in_one_of_the_kinds() {
        for peer in [
            Peer::Node(3),
            Peer::Region("eu-west".into()),
            Peer::Gateway("edge-1".into()),
        ] {
            assert_eq!(Peer::from_uri(&peer.uri()), Some(peer));
        }
        for uri in [
            "spiffe://other/region/eu-west",
            "spiffe://allot/region/",
            "spiffe://allot/region/eu/west",
            "spiffe://allot/node/two",
            "spiffe://allot/tenant/42",
            "https://allot/region/eu-west",
            "spiffe://allotx/region/eu-west",
        ] {
            assert_eq!(Peer::from_uri(uri), None, "{uri}");
        }
    }

    fn cert_naming(uris: &[&str]) -> Vec<u8> {
        let mut params = rcgen::CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
        for uri in uris {
            let uri = (*uri).try_into().unwrap();
            params.subject_alt_names.push(rcgen::SanType::URI(uri));
        }
        let key = rcgen::KeyPair::generate().unwrap();
        params.self_signed(&key).unwrap().der().to_vec()
    }

    #[test]
    fn a_certificate_names_its_peer_only_when_it_names_exactly_one() {
        let one = cert_naming(&["https://example.com/", "spiffe://allot/region/eu-west"]);
        assert_eq!(peer_in(&one), Ok(Peer::Region("eu-west".into())));
        let two = cert_naming(&["spiffe://allot/region/a", "spiffe://allot/node/1"]);
        assert!(
            peer_in(&two)
                .unwrap_err()
                .to_string()
                .contains("more than one")
        );
        let none = cert_naming(&["spiffe://other/region/a"]);
        assert!(
            peer_in(&none)
                .unwrap_err()
                .to_string()
                .contains("no spiffe://allot/")
        );
        assert!(peer_in(b"not DER").is_err());
    }

    #[test]
    fn only_all_three_files_or_none_are_accepted() {
        let p = |s: &str| Some(PathBuf::from(s));
        assert_eq!(TlsFiles::from_flags(None, None, None), Ok(None));
        assert!(
            TlsFiles::from_flags(p("c"), p("k"), p("a"))
                .unwrap()
                .is_some()
        );
        let err = TlsFiles::from_flags(p("c"), None, p("a")).unwrap_err();
        assert!(err.to_string().contains("all three"), "{err}");
    }
}
