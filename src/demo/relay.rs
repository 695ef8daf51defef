//! A TCP relay between one agent and one coordinator node, which the demo can cut: while cut
//! it closes every connection it carries and refuses new ones, so the agent's sync stream
//! breaks as it would over a failed link, with no root and no network namespace. The agent
//! reaches the node through it with `--coordinator ID=RELAY` (docs/decisions.md, D35), so a
//! redirect to that node comes back through the relay too.

use std::sync::Arc;

use tokio::io::copy_bidirectional;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, watch};

/// Most connections one relay carries at once (an agent holds one sync stream per node, and
/// reconnects after each break).
const MAX_CONNECTIONS: usize = 16;

/// Pause after a failed accept.
const ACCEPT_RETRY: std::time::Duration = std::time::Duration::from_millis(50);

/// A running relay; dropping it stops accepting.
pub struct Relay {
    pub addr: String,
    cut: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Relay {
    /// Listens on a free loopback port and forwards to `target`.
    pub async fn start(target: String) -> Result<Relay, String> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| format!("relay: cannot listen: {e}"))?;
        let addr = listener
            .local_addr()
            .map_err(|e| format!("relay: {e}"))?
            .to_string();
        let (cut, cut_rx) = watch::channel(false);
        let task = tokio::spawn(accept(listener, target, cut_rx));
        Ok(Relay { addr, cut, task })
    }

    /// Cut (`true`) or heal (`false`) the link.
    pub fn set_cut(&self, cut: bool) {
        self.cut.send_replace(cut);
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn accept(listener: TcpListener, target: String, cut: watch::Receiver<bool>) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let Ok((inbound, _)) = listener.accept().await else {
            // Out of descriptors, most likely: wait rather than spin.
            tokio::time::sleep(ACCEPT_RETRY).await;
            continue;
        };
        // Refused while cut: dropped at once, as a link that does not answer.
        if *cut.borrow() {
            continue;
        }
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            continue;
        };
        let (target, cut) = (target.clone(), cut.clone());
        tokio::spawn(async move {
            carry(inbound, &target, cut).await;
            drop(permit);
        });
    }
}

/// Copies both ways until either side closes or the link is cut.
async fn carry(mut inbound: TcpStream, target: &str, mut cut: watch::Receiver<bool>) {
    let Ok(mut outbound) = TcpStream::connect(target).await else {
        return;
    };
    tokio::select! {
        _ = copy_bidirectional(&mut inbound, &mut outbound) => {}
        _ = cut.wait_for(|c| *c) => {}
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    /// An echo server behind the relay answers until the cut, which ends the open
    /// connection and refuses new ones; healed, it answers again.
    #[tokio::test]
    async fn a_cut_closes_the_link_and_a_heal_opens_it() {
        let echo = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let echo_addr = echo.local_addr().expect("addr").to_string();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = echo.accept().await {
                tokio::spawn(async move {
                    let (mut r, mut w) = s.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                });
            }
        });
        let relay = Relay::start(echo_addr).await.expect("relay");
        let mut open = TcpStream::connect(&relay.addr).await.expect("connect");
        assert_eq!(round_trip(&mut open).await, Some(*b"ping"));
        relay.set_cut(true);
        let mut buf = [0u8; 4];
        assert_eq!(open.read(&mut buf).await.ok(), Some(0), "closed by the cut");
        let mut refused = TcpStream::connect(&relay.addr).await.expect("accepted");
        assert_eq!(round_trip(&mut refused).await, None);
        relay.set_cut(false);
        let mut healed = TcpStream::connect(&relay.addr).await.expect("connect");
        assert_eq!(round_trip(&mut healed).await, Some(*b"ping"));
    }

    async fn round_trip(s: &mut TcpStream) -> Option<[u8; 4]> {
        s.write_all(b"ping").await.ok()?;
        let mut buf = [0u8; 4];
        s.read_exact(&mut buf).await.ok()?;
        Some(buf)
    }
}
