//! `allot certs init DIR`: a development CA and the certificates of a cluster's nodes, its
//! regions and its gateways (D58), each naming its peer in a URI subject alternative name
//! (`allot_proto::tls::Peer`). Run again on the same folder, it signs what is missing with
//! the CA already there and never overwrites a file.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use allot_proto::tls::{Peer, Tls, TlsFiles};
use clap::{Args, Subcommand};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};

#[derive(Subcommand)]
pub enum CertsCommand {
    /// Write a development CA (unless DIR has one) and a certificate with its key for each
    /// node, region and gateway named, as DIR/node-N.pem and DIR/node-N-key.pem (and so on).
    /// Existing files are kept.
    Init(InitArgs),
}

#[derive(Args)]
pub struct InitArgs {
    /// The folder to write to (created if missing).
    dir: PathBuf,
    /// Coordinator node ids.
    #[arg(long, value_delimiter = ',', default_value = "1,2,3")]
    nodes: Vec<u64>,
    /// Region names (the agents' --region).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "eu-west,us-east,ap-south"
    )]
    regions: Vec<String>,
    /// Gateway names (callers of an agent).
    #[arg(long, value_delimiter = ',', default_value = "edge")]
    gateways: Vec<String>,
    /// Host names and IP addresses every certificate is valid for, as servers are dialled.
    #[arg(long, value_delimiter = ',', default_value = "localhost,127.0.0.1")]
    hosts: Vec<String>,
}

pub fn run(cmd: CertsCommand) -> ExitCode {
    let CertsCommand::Init(args) = cmd;
    match init(&args) {
        Ok(written) => {
            for line in written {
                println!("{line}");
            }
            ExitCode::SUCCESS
        }
        Err(msg) => {
            eprintln!("allot: {msg}");
            ExitCode::from(1)
        }
    }
}

/// The CA's file names in the folder.
pub const CA_CERT: &str = "ca.pem";
pub const CA_KEY: &str = "ca-key.pem";

/// The certificate and key file names of `peer`.
pub fn file_names(peer: &Peer) -> (String, String) {
    let stem = match peer {
        Peer::Node(id) => format!("node-{id}"),
        Peer::Region(r) => format!("region-{r}"),
        Peer::Gateway(g) => format!("gateway-{g}"),
    };
    (format!("{stem}.pem"), format!("{stem}-key.pem"))
}

fn init(args: &InitArgs) -> Result<Vec<String>, String> {
    let peers = peers(args)?;
    write_set(&args.dir, &peers, &args.hosts)
}

/// Writes into `dir` the CA (unless there) and a certificate for each of `peers` that has
/// none, valid for `hosts`; returns a line per file written or kept.
pub fn write_set(dir: &Path, peers: &[Peer], hosts: &[String]) -> Result<Vec<String>, String> {
    let hosts = self::hosts(hosts)?;
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let mut written = Vec::new();
    let (ca_pem, ca_key) = ca(dir, &mut written)?;
    let issuer = Issuer::from_ca_cert_pem(&ca_pem, ca_key)
        .map_err(|e| format!("{}: not a usable CA: {e}", dir.join(CA_CERT).display()))?;
    for peer in peers {
        let (cert_name, key_name) = file_names(peer);
        let (cert_path, key_path) = (dir.join(&cert_name), dir.join(&key_name));
        if cert_path.exists() || key_path.exists() {
            written.push(format!("kept {} ({peer})", cert_path.display()));
            continue;
        }
        let key = KeyPair::generate().map_err(|e| format!("key generation: {e}"))?;
        let cert = leaf_params(peer, &hosts)?
            .signed_by(&key, &issuer)
            .map_err(|e| format!("signing {peer}'s certificate: {e}"))?;
        write_new(&key_path, &key.serialize_pem(), true)?;
        write_new(&cert_path, &cert.pem(), false)?;
        written.push(format!("wrote {} ({})", cert_path.display(), peer.uri()));
    }
    Ok(written)
}

/// The folder's CA, made first when it has none: its certificate's PEM and its key.
fn ca(dir: &Path, written: &mut Vec<String>) -> Result<(String, KeyPair), String> {
    let (cert_path, key_path) = (dir.join(CA_CERT), dir.join(CA_KEY));
    match (cert_path.exists(), key_path.exists()) {
        (true, true) => {
            let read = |p: &Path| {
                std::fs::read_to_string(p).map_err(|e| format!("cannot read {}: {e}", p.display()))
            };
            let key = KeyPair::from_pem(&read(&key_path)?)
                .map_err(|e| format!("{}: not a private key: {e}", key_path.display()))?;
            written.push(format!("kept {} (the CA)", cert_path.display()));
            Ok((read(&cert_path)?, key))
        }
        (false, false) => {
            let key = KeyPair::generate().map_err(|e| format!("key generation: {e}"))?;
            let mut params = CertificateParams::new(Vec::<String>::new())
                .map_err(|e| format!("CA parameters: {e}"))?;
            params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
            params
                .distinguished_name
                .push(DnType::CommonName, "allot development CA");
            params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
            let cert = params
                .self_signed(&key)
                .map_err(|e| format!("signing the CA: {e}"))?;
            write_new(&key_path, &key.serialize_pem(), true)?;
            write_new(&cert_path, &cert.pem(), false)?;
            written.push(format!("wrote {} (the CA)", cert_path.display()));
            Ok((cert.pem(), key))
        }
        _ => Err(format!(
            "{} has one of {CA_CERT} and {CA_KEY} but not the other: restore it or use another \
             folder",
            dir.display()
        )),
    }
}

/// A certificate for both ends of a connection (a node is a raft server and client), naming
/// `peer` and valid for `hosts`.
fn leaf_params(peer: &Peer, hosts: &[SanType]) -> Result<CertificateParams, String> {
    let mut params =
        CertificateParams::new(Vec::<String>::new()).map_err(|e| format!("parameters: {e}"))?;
    params
        .distinguished_name
        .push(DnType::CommonName, peer.to_string());
    let uri = peer
        .uri()
        .try_into()
        .map_err(|e| format!("{peer}: not a valid URI: {e}"))?;
    params.subject_alt_names = hosts.to_vec();
    params.subject_alt_names.push(SanType::URI(uri));
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    Ok(params)
}

fn peers(args: &InitArgs) -> Result<Vec<Peer>, String> {
    let mut peers: Vec<Peer> = args.nodes.iter().map(|n| Peer::Node(*n)).collect();
    peers.extend(args.regions.iter().map(|r| Peer::Region(r.clone())));
    peers.extend(args.gateways.iter().map(|g| Peer::Gateway(g.clone())));
    for peer in &peers {
        if Peer::from_uri(&peer.uri()).as_ref() != Some(peer) {
            return Err(format!(
                "{peer}: a name may not be empty or contain '/', and names only letters, digits \
                 and '-', '_', '.'"
            ));
        }
        let name = match peer {
            Peer::Node(_) => continue,
            Peer::Region(n) | Peer::Gateway(n) => n,
        };
        if !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        {
            return Err(format!(
                "{peer}: names only letters, digits and '-', '_', '.' (it becomes a URI and a \
                 file name)"
            ));
        }
    }
    Ok(peers)
}

fn hosts(hosts: &[String]) -> Result<Vec<SanType>, String> {
    hosts
        .iter()
        .map(|h| match h.parse::<IpAddr>() {
            Ok(ip) => Ok(SanType::IpAddress(ip)),
            Err(_) => h
                .as_str()
                .try_into()
                .map(SanType::DnsName)
                .map_err(|e| format!("--hosts {h}: not a host name: {e}")),
        })
        .collect()
}

/// Writes a file that must not exist yet (a key readable by its owner only).
fn write_new(path: &Path, contents: &str, secret: bool) -> Result<(), String> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mode = if secret { 0o600 } else { 0o644 };
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .map_err(|e| format!("cannot create {}: {e}", path.display()))?;
    file.write_all(contents.as_bytes())
        .and_then(|()| file.sync_all())
        .map_err(|e| format!("cannot write {}: {e}", path.display()))
}

/// The TLS flags of the daemons (`allot agent`, `allot coordinator`): all three or none.
#[derive(Args, Clone, Debug, Default)]
pub struct TlsArgs {
    /// This daemon's certificate (PEM), naming it (a node or a region; `allot certs init`).
    /// With --tls-key and --tls-ca: mutual TLS with the other daemons (docs/security.md).
    #[arg(long, env = "ALLOT_TLS_CERT")]
    tls_cert: Option<PathBuf>,
    /// The certificate's private key (PEM).
    #[arg(long, env = "ALLOT_TLS_KEY")]
    tls_key: Option<PathBuf>,
    /// The CA that signs every daemon's certificate (PEM).
    #[arg(long, env = "ALLOT_TLS_CA")]
    tls_ca: Option<PathBuf>,
}

/// A `--*-sha256 HEX` flag (a token's digest, D60, D63): `None` when not given, the flag
/// named in the error when it is not 64 hex digits.
pub fn digest_flag(flag: &str, hex: Option<&str>) -> Result<Option<[u8; 32]>, String> {
    hex.map(|h| allot_proto::tls::parse_sha256_hex(h).map_err(|e| format!("{flag}: {e}")))
        .transpose()
}

/// The loaded TLS material the flags name; `None` when they name none.
pub fn tls_flags(args: &TlsArgs) -> Result<Option<Tls>, String> {
    let files = TlsFiles::from_flags(
        args.tls_cert.clone(),
        args.tls_key.clone(),
        args.tls_ca.clone(),
    )
    .map_err(|e| e.to_string())?;
    files
        .map(|f| f.load())
        .transpose()
        .map_err(|e| e.to_string())
}
