//! Overload shedding: at most `max_in_flight_calls` gateway calls run at once, over gRPC and
//! HTTP together. A call past it is answered at once, `RESOURCE_EXHAUSTED` on gRPC and 503
//! with `Retry-After: 1` on HTTP, instead of queueing behind the others: a gateway's deadline
//! is short, and a call answered late is worth less than one refused now that the gateway's
//! failure mode can decide. A stream (RLQS) holds its permit only until it is opened; its own
//! caps bound it after.
//!
//! The permits are shared fairly: once more than half are in use, a caller already running
//! `max / (callers running + 1)` calls is shed, so one gateway flooding the agent (a retry
//! storm, a bug) cannot take the permits the others need; the `+ 1` keeps room for a caller
//! whose next call has not arrived yet. Below half, nobody is held to a share. A caller is
//! told apart by its `Authorization` header, else its client certificate, else its address
//! (gRPC); anonymous HTTP callers are one caller. The key is hashed with a per-process random
//! key, so nobody can pick a token that lands on another caller's count.
//!
//! A refused call's request body is still read to its end, after the refusal has gone out
//! (`drain.rs` says why): every call's body is wrapped in [`DrainOnDrop`] here, so a call
//! refused by this layer, by the interceptor that names callers, or by tonic itself does not
//! cost its connection.
//!
//! The same layer reads tonic's answer to a message it could not decode (invalid UTF-8 in a
//! string, a malformed field): tonic says `INTERNAL`, which reads as the agent failing; it is
//! the caller's bad input, so the answer says `INVALID_ARGUMENT`, counted as the other
//! malformed requests are.

use std::collections::HashMap;
use std::collections::hash_map::RandomState;
use std::future::Future;
use std::hash::BuildHasher;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use http_body::Body;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tonic::Status;
use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};

use super::drain::DrainOnDrop;
use crate::metrics;

/// The agent's permits for gateway calls, shared by both servers.
#[derive(Clone, Debug)]
pub struct Shed {
    permits: Arc<Semaphore>,
    max: usize,
    /// Calls running per caller key; only keys with one or more (at most `max` entries).
    running: Arc<Mutex<HashMap<u64, usize>>>,
    hasher: RandomState,
}

/// Why a call was shed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shedding {
    /// Every permit is in use.
    Full,
    /// More than half are in use and the caller runs its share: `share` calls.
    OverShare { share: usize },
}

/// A running call's permit and its place in its caller's count, both given back on drop.
#[derive(Debug)]
pub struct Entered {
    _permit: OwnedSemaphorePermit,
    key: u64,
    running: Arc<Mutex<HashMap<u64, usize>>>,
}

impl Drop for Entered {
    fn drop(&mut self) {
        let mut running = self.running.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = running.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                running.remove(&self.key);
            }
        }
    }
}

impl Shed {
    pub fn new(max_in_flight_calls: usize) -> Shed {
        assert!(max_in_flight_calls > 0, "validated in Settings");
        Shed {
            permits: Arc::new(Semaphore::new(max_in_flight_calls)),
            max: max_in_flight_calls,
            running: Arc::new(Mutex::new(HashMap::new())),
            hasher: RandomState::new(),
        }
    }

    /// The key of the caller `headers` and `extensions` name (see the module's comment).
    pub fn caller_key(&self, headers: &http::HeaderMap, extensions: &http::Extensions) -> u64 {
        if let Some(a) = headers.get(http::header::AUTHORIZATION) {
            return self.hasher.hash_one((1u8, a.as_bytes()));
        }
        if let Some(tls) = extensions.get::<TlsConnectInfo<TcpConnectInfo>>() {
            if let Some(leaf) = tls.peer_certs().and_then(|c| c.first().cloned()) {
                return self.hasher.hash_one((2u8, leaf.as_ref()));
            }
            if let Some(addr) = tls.get_ref().remote_addr() {
                return self.hasher.hash_one((3u8, addr.ip()));
            }
        }
        if let Some(addr) = extensions
            .get::<TcpConnectInfo>()
            .and_then(TcpConnectInfo::remote_addr)
        {
            return self.hasher.hash_one((3u8, addr.ip()));
        }
        0
    }

    /// A permit for one call of the caller `key`, or why not (counted, by `server`).
    pub fn try_enter(&self, server: &'static str, key: u64) -> Result<Entered, Shedding> {
        // One lock around the permit and the count: two calls of one caller cannot both see
        // room for one.
        let mut running = self.running.lock().unwrap_or_else(|p| p.into_inner());
        let Ok(permit) = self.permits.clone().try_acquire_owned() else {
            metrics::shed_call(server);
            return Err(Shedding::Full);
        };
        let in_use = self.max - self.permits.available_permits();
        let mine = running.get(&key).copied().unwrap_or(0);
        let others = running.len() - usize::from(mine > 0);
        let share = (self.max / (others + 2)).max(1);
        if in_use * 2 > self.max && mine >= share {
            drop(permit);
            metrics::shed_call(server);
            metrics::shed_over_share(server);
            return Err(Shedding::OverShare { share });
        }
        *running.entry(key).or_insert(0) += 1;
        Ok(Entered {
            _permit: permit,
            key,
            running: Arc::clone(&self.running),
        })
    }

    pub fn message(&self, why: Shedding) -> String {
        match why {
            Shedding::Full => format!(
                "the agent is running its {} calls at once (--max-in-flight-calls): try again \
                 shortly",
                self.max
            ),
            Shedding::OverShare { share } => format!(
                "this caller is running its share ({share}) of the agent's {} calls at once \
                 (--max-in-flight-calls) while others wait: try again shortly",
                self.max
            ),
        }
    }
}

impl<S> tower::Layer<S> for Shed {
    type Service = ShedService<S>;

    fn layer(&self, inner: S) -> ShedService<S> {
        ShedService {
            inner,
            shed: self.clone(),
        }
    }
}

/// The gRPC server's service behind [`Shed`].
#[derive(Clone, Debug)]
pub struct ShedService<S> {
    inner: S,
    shed: Shed,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, B> tower::Service<http::Request<B>> for ShedService<S>
where
    S: tower::Service<http::Request<DrainOnDrop<B>>, Response = http::Response<tonic::body::Body>>,
    S::Future: Send + 'static,
    B: Body + Send + Unpin + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<Result<S::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let key = self
            .shed
            .caller_key(request.headers(), request.extensions());
        match self.shed.try_enter("grpc", key) {
            Ok(entered) => {
                let answer = self.inner.call(request.map(DrainOnDrop::new));
                Box::pin(async move {
                    let answer = answer.await;
                    drop(entered);
                    answer.map(decode_failure_is_invalid_argument)
                })
            }
            Err(why) => {
                let refused = Status::resource_exhausted(self.shed.message(why)).into_http();
                // Dropped unread: drained in the background (`drain.rs`).
                drop(DrainOnDrop::new(request.into_body()));
                Box::pin(async move { Ok(refused) })
            }
        }
    }
}

/// tonic's status for a request it could not decode, as it writes it in a trailers-only answer.
const DECODE_FAILURE_PREFIXES: [&[u8]; 2] = [b"failed%20to%20decode", b"failed to decode"];

fn decode_failure_is_invalid_argument<B>(mut answer: http::Response<B>) -> http::Response<B> {
    let headers = answer.headers();
    let internal = headers.get("grpc-status").is_some_and(|s| s == "13");
    let undecodable = headers.get("grpc-message").is_some_and(|m| {
        DECODE_FAILURE_PREFIXES
            .iter()
            .any(|p| m.as_bytes().starts_with(p))
    });
    if internal && undecodable {
        let invalid_argument = http::HeaderValue::from_static("3");
        answer.headers_mut().insert("grpc-status", invalid_argument);
        metrics::invalid_request("decode");
    }
    answer
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_undecodable_request_turns_internal_into_invalid_argument() {
        let answer = |status: &'static str, message: &'static str| {
            let mut a = http::Response::new(());
            a.headers_mut()
                .insert("grpc-status", http::HeaderValue::from_static(status));
            a.headers_mut()
                .insert("grpc-message", http::HeaderValue::from_static(message));
            decode_failure_is_invalid_argument(a).headers()["grpc-status"].clone()
        };
        let bad_utf8 = "failed%20to%20decode%20Protobuf%20message:%20invalid%20string";
        assert_eq!(answer("13", bad_utf8), "3");
        assert_eq!(
            answer("13", "store%20failed"),
            "13",
            "a real internal error stays"
        );
        assert_eq!(answer("8", bad_utf8), "8");
    }

    #[test]
    fn permits_past_the_cap_are_refused_and_come_back_when_dropped() {
        let shed = Shed::new(2);
        let a = shed.try_enter("test", 1).expect("first");
        let _b = shed.try_enter("test", 2).expect("second");
        assert_eq!(shed.try_enter("test", 3).err(), Some(Shedding::Full));
        drop(a);
        assert!(
            shed.try_enter("test", 3).is_ok(),
            "a permit back, a call in"
        );
    }

    #[test]
    fn past_half_a_caller_is_held_to_its_share_and_room_stays_for_others() {
        let shed = Shed::new(8);
        // Alone, a caller runs up to half (8 / (0 + 2)), then is shed with permits left.
        let mut flood: Vec<Entered> = (0..4).map(|_| shed.try_enter("t", 1).unwrap()).collect();
        assert_eq!(
            shed.try_enter("t", 1).err(),
            Some(Shedding::OverShare { share: 4 })
        );
        // Another caller gets in; the first, now one of two, keeps what it runs (8 / 3 = 2
        // is its share, it runs 4) and gets no more.
        let quiet = shed.try_enter("t", 2).expect("room for another caller");
        assert!(shed.try_enter("t", 1).is_err());
        // A third caller too: what is left is theirs.
        let third = shed.try_enter("t", 3).expect("room for a third");
        drop(quiet);
        drop(third);
        // Below half in use, no share applies.
        flood.truncate(1);
        let more: Vec<Entered> = (0..3).map(|_| shed.try_enter("t", 1).unwrap()).collect();
        assert_eq!(more.len(), 3);
        // Counts go back to nothing when the calls end.
        drop(more);
        drop(flood);
        assert!(shed.running.lock().unwrap().is_empty());
    }

    #[test]
    fn callers_are_told_apart_by_token_then_certificate_then_address() {
        let shed = Shed::new(4);
        let mut headers = http::HeaderMap::new();
        let ext = http::Extensions::new();
        assert_eq!(shed.caller_key(&headers, &ext), 0, "anonymous");
        headers.insert(http::header::AUTHORIZATION, "Bearer a".parse().unwrap());
        let a = shed.caller_key(&headers, &ext);
        headers.insert(http::header::AUTHORIZATION, "Bearer b".parse().unwrap());
        let b = shed.caller_key(&headers, &ext);
        assert_ne!(a, b);
        assert_ne!(a, 0);
        // Another process keys the same token otherwise.
        let other = Shed::new(4);
        assert_ne!(other.caller_key(&headers, &ext), b);
    }
}
