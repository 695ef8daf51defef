//! Wiring: open the store, restore the machine, start the background tasks and both servers,
//! then on shutdown stop accepting, let in-flight calls finish, flush, and return.

use std::future::Future;
use std::sync::Arc;

use allot_proto::envoy::rlqs::rate_limit_quota_service_server::RateLimitQuotaServiceServer;
use allot_proto::envoy::rls::rate_limit_service_server::RateLimitServiceServer;
use allot_proto::lease::v1::lease_service_server::LeaseServiceServer;
use tokio::net::TcpListener;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::watch;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::TcpListenerStream;

use crate::admin;
use crate::coordinators::Coordinators;
use crate::driver;
use crate::error::{Error, Result};
use allot_proto::tls::{Dialer, Serving, TlsListener, tls_incoming};
use tonic::service::interceptor::InterceptedService;

use crate::callers::LiveCallers;
use crate::grpc_link::{GrpcSyncLink, LinkStatus};
use crate::metrics;
use crate::rlqs::Rlqs;
use crate::service::Authenticate;
use crate::service::lease::LeaseApi;
use crate::service::rls::Rls;
use crate::service::shed::Shed;
use crate::settings::{MAX_MESSAGE_BYTES, MAX_STREAMS_PER_CONNECTION, Settings};
use crate::state::Agent;
use crate::store::{SledStore, Store};
use crate::sync_link::NoCoordinator;

/// The two sockets the agent serves, bound by the caller.
pub struct Listeners {
    /// gRPC: the lease API, Envoy's rate limit service and its rate limit quota service.
    pub grpc: TcpListener,
    /// HTTP: metrics, health, readiness, the key view.
    pub http: TcpListener,
}

/// Runs the agent until `shutdown` completes, then shuts down gracefully. When ready it
/// prints one line on stdout: `ready grpc=ADDR http=ADDR`.
pub async fn run(
    listeners: Listeners,
    settings: Settings,
    shutdown: impl Future<Output = ()>,
) -> Result<()> {
    let handle = metrics::install()?;
    tracing::info!(
        region = %settings.region,
        data = %settings.data_dir.display(),
        durability = %settings.durability,
        "opening the store"
    );
    let store: Arc<dyn Store> = Arc::new(SledStore::open(&settings.data_dir, settings.durability)?);
    let agent = Arc::new(Agent::open(settings, store)?);
    // Registered before anyone can learn the agent is up: SIGHUP's default action kills.
    let hangup = signal(SignalKind::hangup()).map_err(|e| Error::io("SIGHUP handler", e))?;
    let (stop_tx, stop_rx) = watch::channel(false);
    let link = Arc::new(LinkStatus::default());
    let timers = if agent.settings().is_coordinated() {
        let entries = &agent.settings().coordinators;
        tracing::info!(coordinators = ?entries, "syncing with the coordinator cluster");
        let coordinators =
            Coordinators::parse(entries).map_err(|p| Error::Settings(p.join("; ")))?;
        let seed = agent.settings().jitter_seed.unwrap_or_else(|| {
            agent.now().as_unix_nanos() ^ u64::from(std::process::id()).rotate_left(32)
        });
        let dialer = match &agent.settings().tls {
            Some(tls) => Dialer::with_tls(tls),
            None => {
                tracing::warn!(
                    "plaintext link to the coordinators: unauthenticated, and anyone on the \
                     path can read or alter it (--tls-cert, --tls-key and --tls-ca; \
                     `allot certs init` makes a development set)"
                );
                Dialer::plaintext()
            }
        };
        let sync = GrpcSyncLink::start(coordinators, link.clone(), seed, dialer);
        tokio::spawn(driver::timers(agent.clone(), sync, stop_rx.clone()))
    } else {
        tracing::info!("no coordinator: single region, this agent owns every quota");
        tokio::spawn(driver::timers(
            agent.clone(),
            NoCoordinator,
            stop_rx.clone(),
        ))
    };
    let callers = Arc::new(LiveCallers::new(
        agent.settings().callers_file.clone(),
        agent.settings().callers.clone(),
    ));
    let tasks = [
        timers,
        tokio::spawn(driver::flushes(agent.clone(), stop_rx.clone())),
        tokio::spawn(driver::config_reloads(
            agent.clone(),
            callers.clone(),
            hangup,
            stop_rx.clone(),
        )),
    ];
    let grpc_addr = listeners
        .grpc
        .local_addr()
        .map_err(|e| Error::io("gRPC listener", e))?;
    let http_addr = listeners
        .http
        .local_addr()
        .map_err(|e| Error::io("HTTP listener", e))?;
    let shed = Shed::new(agent.settings().max_in_flight_calls);
    let grpc = serve_grpc(
        &agent,
        listeners.grpc,
        shed.clone(),
        callers.clone(),
        stop_rx.clone(),
    );
    let router = admin::router(agent.clone(), link, handle, shed, callers);
    let http_stop = stopped(stop_rx.clone());
    let http = match (&agent.settings().tls, agent.settings().http_tls) {
        (Some(tls), true) => {
            let listener = TlsListener::new(listeners.http, tls.clone());
            let served = axum::serve(listener, router).with_graceful_shutdown(http_stop);
            tokio::spawn(async move { served.await })
        }
        _ => {
            if agent.settings().callers.is_some() {
                tracing::warn!(
                    "callers file on a plaintext HTTP port: the HTTP/JSON lease API's bearer \
                     tokens cross the network in the clear (--http-tls serves it over TLS)"
                );
            }
            let served = axum::serve(listeners.http, router).with_graceful_shutdown(http_stop);
            tokio::spawn(async move { served.await })
        }
    };
    agent.set_ready(true);
    tracing::info!(%grpc_addr, %http_addr, "agent ready");
    println!("ready grpc={grpc_addr} http={http_addr}");

    shutdown.await;
    tracing::info!("shutting down: refusing new calls, finishing those in flight");
    agent.set_ready(false);
    let _ = stop_tx.send(true);
    let grace = agent.settings().shutdown_grace;
    let servers = async {
        if let Ok(Err(e)) = grpc.await {
            tracing::error!(error = %e, "gRPC server");
        }
        let _ = http.await;
    };
    if tokio::time::timeout(grace, servers).await.is_err() {
        tracing::warn!(?grace, "calls still in flight after the grace period");
    }
    for t in tasks {
        let _ = t.await;
    }
    agent.committer().flush().await?;
    driver::checkpoint(&agent).await?;
    tracing::info!("state flushed");
    Ok(())
}

/// The gateway-facing gRPC server: plaintext, or TLS with the agent's certificate and a
/// client certificate optional (`--gateway-tls`); every call named by the callers file when
/// there is one (D59).
fn serve_grpc(
    agent: &Arc<Agent>,
    listener: TcpListener,
    shed: Shed,
    callers: Arc<LiveCallers>,
    stop: watch::Receiver<bool>,
) -> tokio::task::JoinHandle<std::result::Result<(), tonic::transport::Error>> {
    let auth = Authenticate { callers };
    let router = tonic::transport::Server::builder()
        .max_concurrent_streams(MAX_STREAMS_PER_CONNECTION)
        .layer(shed)
        .add_service(InterceptedService::new(
            LeaseServiceServer::new(LeaseApi::new(agent.clone()))
                .max_decoding_message_size(MAX_MESSAGE_BYTES),
            auth.clone(),
        ))
        .add_service(InterceptedService::new(
            RateLimitServiceServer::new(Rls::new(agent.clone()))
                .max_decoding_message_size(MAX_MESSAGE_BYTES),
            auth.clone(),
        ))
        .add_service(InterceptedService::new(
            RateLimitQuotaServiceServer::new(Rlqs::new(agent.clone()))
                .max_decoding_message_size(MAX_MESSAGE_BYTES),
            auth,
        ));
    let settings = agent.settings();
    match (&settings.tls, settings.gateway_tls) {
        (Some(tls), true) => {
            let incoming = tls_incoming(listener, tls.clone(), Serving::Gateways);
            tokio::spawn(router.serve_with_incoming_shutdown(incoming, stopped(stop)))
        }
        _ => {
            if settings.callers.is_some() {
                tracing::warn!(
                    "callers file on a plaintext gateway port: bearer tokens cross the network \
                     in the clear (--gateway-tls serves the port over TLS)"
                );
            }
            let incoming = TcpListenerStream::new(listener).map(|conn| {
                // Answers are one small frame each: without this, Nagle holds them back.
                conn.and_then(|s| s.set_nodelay(true).map(|()| s))
            });
            tokio::spawn(router.serve_with_incoming_shutdown(incoming, stopped(stop)))
        }
    }
}

async fn stopped(mut stop: watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}
