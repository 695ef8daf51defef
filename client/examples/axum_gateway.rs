//! An axum gateway that enforces a per-API-key limit with allot, with no network hop on the
//! request path: each request names its key in the `x-api-key` header, and the layer spends
//! one unit of that key's lease (or `x-batch-size` units, for a batch) before the handler runs.
//! Requests without a key are not counted. See docs/client.md, "The tower layer", for the
//! commands that run it against `allot agent`.
//!
//! ```text
//! cargo run -p allot-client --features tower --example axum_gateway -- \
//!     --agent http://127.0.0.1:7000 --listen 127.0.0.1:8080 --quota 60 --window-secs 60
//! ```
//!
//! `--no-layer` serves the same app without the layer (the benchmark's reference).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use allot_client::{AllotLayer, Client, ClientConfig, Descriptor, Policy};
use axum::extract::Request;
use axum::http::request::Parts;
use axum::routing::get;
use axum::{Router, ServiceExt};
use tower::Layer;

/// The command line; every flag has a default.
struct Args {
    agent: String,
    listen: SocketAddr,
    /// The limit the 429's headers name (the agent's limits file decides; this only says it).
    quota_units: u64,
    window: Duration,
    layer: bool,
}

impl Args {
    fn parse() -> Result<Args, String> {
        let mut args = Args {
            agent: "http://127.0.0.1:7000".to_owned(),
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            quota_units: 60,
            window: Duration::from_secs(60),
            layer: true,
        };
        let mut it = std::env::args().skip(1);
        while let Some(flag) = it.next() {
            let mut value = || it.next().ok_or(format!("{flag} needs a value"));
            match flag.as_str() {
                "--agent" => args.agent = value()?,
                "--listen" => args.listen = value()?.parse().map_err(|e| format!("{e}"))?,
                "--quota" => args.quota_units = value()?.parse().map_err(|e| format!("{e}"))?,
                "--window-secs" => {
                    let secs = value()?.parse().map_err(|e| format!("{e}"))?;
                    args.window = Duration::from_secs(secs);
                }
                "--no-layer" => args.layer = false,
                other => return Err(format!("unknown flag {other}")),
            }
        }
        Ok(args)
    }
}

/// The target a request is counted against: its API key, in the `api` domain.
fn by_api_key(parts: &Parts) -> Option<Descriptor<'_>> {
    let api_key = parts.headers.get("x-api-key")?.to_str().ok()?;
    Some(Descriptor::new("api").entry("api_key", api_key))
}

/// A batch counts as many units as it holds items; any other request as one.
fn batch_size(parts: &Parts) -> u64 {
    parts
        .headers
        .get("x-batch-size")
        .and_then(|v| v.to_str().ok()?.parse().ok())
        .unwrap_or(1)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse()?;
    let app = Router::new().route("/", get(|| async { "hello\n" }));
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    // The ready line scripts wait for.
    println!("axum_gateway listening http={}", listener.local_addr()?);
    if !args.layer {
        axum::serve(listener, app)
            .with_graceful_shutdown(ctrl_c())
            .await?;
        return Ok(());
    }

    let client = Arc::new(Client::start(ClientConfig::new(args.agent))?);
    let policy = Policy {
        name: "per-api-key".to_owned(),
        quota_units: args.quota_units,
        window: Some(args.window),
    };
    let layer = AllotLayer::new(client.clone(), by_api_key)
        .cost(batch_size)
        .policy("api", policy);
    // Around the whole router, once: `Router::layer` would wrap each route, and axum boxes
    // and clones each route's service per request, a cost of its own added to the layer's.
    let app = layer.layer(app);
    axum::serve(listener, ServiceExt::<Request>::into_make_service(app))
        .with_graceful_shutdown(ctrl_c())
        .await?;
    // The server and its layer are gone: give the unused leased units back to the agent.
    if let Some(client) = Arc::into_inner(client) {
        client.shutdown().await;
    }
    Ok(())
}

async fn ctrl_c() {
    // Without a signal handler the server runs until killed, which is fine for an example.
    if tokio::signal::ctrl_c().await.is_err() {
        std::future::pending::<()>().await;
    }
}
