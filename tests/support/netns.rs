//! A network lab for the tests that run `allot` over a real network: network namespaces joined
//! by veth pairs on one bridge, a blackhole route for the lab's subnet in the root namespace so
//! nothing of it can leave the machine, and a relay that delays each direction of a TCP
//! connection (these kernels have no netem). Dropping the [`Lab`] removes all of it; a lab a
//! killed run left behind (same names) is removed before a new one is made.

// Not every test crate that includes this module uses every helper.
#![allow(dead_code)]

use std::fs::File;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::os::fd::AsRawFd;
use std::process::Command;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio::time::Instant;

/// The bridge's name in the hub namespace.
const BRIDGE: &str = "lab0";
/// The hub's own address on the bridge: `NET.254`.
pub const HUB_OCTET: u8 = 254;
/// Bytes the relay reads at once.
const RELAY_CHUNK_BYTES: usize = 16 * 1024;
/// Chunks in flight per direction of a relayed connection (a full queue makes the reader wait,
/// as a full link would).
const RELAY_QUEUE_CHUNKS: usize = 64;

/// Why no lab can be built here, or `None`: it needs root (namespaces, links and routes) and
/// iproute2's `ip`.
pub fn unavailable() -> Option<String> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Some("not root: network namespaces, links and routes need it".to_owned());
    }
    match Command::new("ip").arg("-V").output() {
        Ok(out) if out.status.success() => None,
        _ => Some("`ip` (iproute2) is not installed".to_owned()),
    }
}

/// Runs `ip ARGS`, returning its stdout; its stderr is the error.
pub fn ip(args: &[&str]) -> Result<String, String> {
    let what = format!("ip {}", args.join(" "));
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("{what}: {e}"))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(format!("{what}: {}", err.trim()));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `program` run inside network namespace `ns`.
pub fn command(ns: &str, program: &str) -> Command {
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", ns, program]);
    cmd
}

/// A namespace on the lab's bridge.
pub struct Host {
    pub ns: String,
    pub addr: Ipv4Addr,
    /// Its veth's end on the bridge, in the hub namespace.
    port: String,
}

/// Namespaces `PREFIX-hub` (the bridge, at `NET.254`) and `PREFIX-NAME` per host, on subnet
/// `NET.0/24`, blackholed in the root namespace. No namespace has a route beyond the subnet.
pub struct Lab {
    prefix: String,
    net: [u8; 3],
    hub: String,
    namespaces: Vec<String>,
    blackhole: Option<String>,
}

impl Lab {
    /// A lab with no host yet. Fails when the subnet is routed on this machine by something
    /// other than a blackhole (a stale lab's).
    pub fn new(prefix: &str, net: [u8; 3]) -> Result<Lab, String> {
        remove_stale(prefix)?;
        let subnet = format!("{}.{}.{}.0/24", net[0], net[1], net[2]);
        let routed = ip(&["route", "show", "exact", &subnet])?;
        if !routed.trim().is_empty() && !routed.trim_start().starts_with("blackhole") {
            return Err(format!(
                "{subnet} is routed here ({}): pick another",
                routed.trim()
            ));
        }
        let mut lab = Lab {
            prefix: prefix.to_owned(),
            net,
            hub: format!("{prefix}-hub"),
            namespaces: Vec::new(),
            blackhole: None,
        };
        ip(&["route", "replace", "blackhole", &subnet])?;
        lab.blackhole = Some(subnet);
        let hub = lab.hub.clone();
        lab.add_namespace(&hub)?;
        let hub_addr = format!("{}/24", lab.addr(HUB_OCTET));
        ip(&["-n", &hub, "link", "add", BRIDGE, "type", "bridge"])?;
        ip(&["-n", &hub, "addr", "add", &hub_addr, "dev", BRIDGE])?;
        ip(&["-n", &hub, "link", "set", BRIDGE, "up"])?;
        Ok(lab)
    }

    /// The hub namespace, where the relays listen.
    pub fn hub(&self) -> &str {
        &self.hub
    }

    /// `NET.octet`.
    pub fn addr(&self, octet: u8) -> Ipv4Addr {
        Ipv4Addr::new(self.net[0], self.net[1], self.net[2], octet)
    }

    /// Namespace `PREFIX-NAME` at `NET.octet`, its `eth0` a veth whose other end is a port of
    /// the bridge.
    pub fn add_host(&mut self, name: &str, octet: u8) -> Result<Host, String> {
        let ns = format!("{}-{name}", self.prefix);
        self.add_namespace(&ns)?;
        // Interface names are at most 15 bytes: `p-` and a short host name.
        let port = format!("p-{name}");
        let hub = self.hub.clone();
        ip(&[
            "-n", &hub, "link", "add", &port, "type", "veth", "peer", "name", "eth0", "netns", &ns,
        ])?;
        ip(&["-n", &hub, "link", "set", &port, "master", BRIDGE])?;
        ip(&["-n", &hub, "link", "set", &port, "up"])?;
        let addr = self.addr(octet);
        ip(&[
            "-n",
            &ns,
            "addr",
            "add",
            &format!("{addr}/24"),
            "dev",
            "eth0",
        ])?;
        ip(&["-n", &ns, "link", "set", "eth0", "up"])?;
        Ok(Host { ns, addr, port })
    }

    /// Cuts (`up: false`) or heals `host`'s link: its port on the bridge goes down, as a cable
    /// pulled at the switch (the host's own interface loses its carrier, its routes stay).
    pub fn set_link(&self, host: &Host, up: bool) -> Result<(), String> {
        let state = if up { "up" } else { "down" };
        ip(&["-n", &self.hub, "link", "set", &host.port, state]).map(drop)
    }

    fn add_namespace(&mut self, ns: &str) -> Result<(), String> {
        ip(&["netns", "add", ns])?;
        self.namespaces.push(ns.to_owned());
        ip(&["-n", ns, "link", "set", "lo", "up"]).map(drop)
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        // Deleting a namespace deletes the veth ends in it, and with them their peers.
        for ns in self.namespaces.iter().rev() {
            if let Err(e) = ip(&["netns", "del", ns]) {
                eprintln!("lab cleanup: {e}");
            }
        }
        if let Some(subnet) = &self.blackhole
            && let Err(e) = ip(&["route", "del", "blackhole", subnet])
        {
            eprintln!("lab cleanup: {e}");
        }
    }
}

/// Deletes the namespaces named `PREFIX-*` (a killed run's lab); its blackhole route is
/// replaced by the new lab's.
fn remove_stale(prefix: &str) -> Result<(), String> {
    let listed = ip(&["netns", "list"])?;
    let mine = format!("{prefix}-");
    for ns in listed.lines().filter_map(|l| l.split_whitespace().next()) {
        if ns.starts_with(&mine) {
            eprintln!("removing a stale lab namespace: {ns}");
            ip(&["netns", "del", ns])?;
        }
    }
    Ok(())
}

/// Runs `make` on a new thread that first enters network namespace `ns` (the root namespace's
/// when `None`): a socket belongs to the namespace it was created in, whichever thread uses it
/// later.
fn in_netns<T: Send + 'static>(
    ns: Option<&str>,
    make: impl FnOnce() -> io::Result<T> + Send + 'static,
) -> io::Result<T> {
    let Some(ns) = ns else {
        return make();
    };
    let path = format!("/run/netns/{ns}");
    std::thread::spawn(move || {
        let file = File::open(&path)?;
        // SAFETY: the descriptor is open for the call; setns changes only this thread's network
        // namespace, and the thread ends after `make`.
        if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            return Err(io::Error::last_os_error());
        }
        make()
    })
    .join()
    .map_err(|_| io::Error::other("the namespace thread panicked"))?
}

/// An address in a network namespace (`None`: the test's own).
#[derive(Clone, Debug)]
pub struct Endpoint {
    pub ns: Option<String>,
    pub addr: SocketAddr,
}

/// A TCP relay the test owns: it accepts on one endpoint, connects each connection to another
/// and holds every chunk `one_way` before passing it on, in each direction (chunks keep their
/// order and spacing, so the relay adds latency, not a throughput cap). With no delay it is a
/// plain forwarder, e.g. from the test's namespace to a daemon's loopback address in another.
/// Dropping it ends its connections.
pub struct Relay {
    pub addr: SocketAddr,
    _accept: JoinSet<()>,
}

impl Relay {
    pub async fn start(
        listen: Endpoint,
        upstream: Endpoint,
        one_way: Duration,
    ) -> io::Result<Relay> {
        let at = listen.addr;
        let std_listener = in_netns(listen.ns.as_deref(), move || {
            let l = std::net::TcpListener::bind(at)?;
            l.set_nonblocking(true)?;
            Ok(l)
        })?;
        let listener = TcpListener::from_std(std_listener)?;
        let addr = listener.local_addr()?;
        let mut accept = JoinSet::new();
        accept.spawn(accept_loop(listener, upstream, one_way));
        Ok(Relay {
            addr,
            _accept: accept,
        })
    }
}

async fn accept_loop(listener: TcpListener, upstream: Endpoint, one_way: Duration) {
    // Owned here, so that aborting this task ends every connection.
    let mut connections = JoinSet::new();
    loop {
        let Ok((down, _)) = listener.accept().await else {
            // Out of descriptors, say: wait rather than spin.
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        connections.spawn(carry(down, upstream.clone(), one_way));
        // Forget the connections that ended.
        while connections.try_join_next().is_some() {}
    }
}

async fn carry(down: TcpStream, upstream: Endpoint, one_way: Duration) {
    let Ok(socket) = in_netns(upstream.ns.as_deref(), TcpSocket::new_v4) else {
        return;
    };
    // A failed connect drops `down`: the client sees the connection close.
    let Ok(up) = socket.connect(upstream.addr).await else {
        return;
    };
    let _ = down.set_nodelay(true);
    let _ = up.set_nodelay(true);
    let (down_read, down_write) = down.into_split();
    let (up_read, up_write) = up.into_split();
    tokio::join!(
        delayed(down_read, up_write, one_way),
        delayed(up_read, down_write, one_way)
    );
}

/// Copies `from` to `to`, each chunk `one_way` after it was read; ends `to` after the last.
async fn delayed(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, one_way: Duration) {
    let (tx, mut rx) = mpsc::channel::<(Instant, Vec<u8>)>(RELAY_QUEUE_CHUNKS);
    let read = async move {
        let mut buf = vec![0; RELAY_CHUNK_BYTES];
        while let Ok(n @ 1..) = from.read(&mut buf).await {
            if tx
                .send((Instant::now() + one_way, buf[..n].to_vec()))
                .await
                .is_err()
            {
                break;
            }
        }
    };
    let write = async move {
        while let Some((due, chunk)) = rx.recv().await {
            tokio::time::sleep_until(due).await;
            if to.write_all(&chunk).await.is_err() {
                return;
            }
        }
        let _ = to.shutdown().await;
    };
    tokio::join!(read, write);
}
