//! Overload shedding: at most `max_in_flight_calls` gateway calls run at once, over gRPC and
//! HTTP together. A call past it is answered at once, `RESOURCE_EXHAUSTED` on gRPC and 503
//! with `Retry-After: 1` on HTTP, instead of queueing behind the others: a gateway's deadline
//! is short, and a call answered late is worth less than one refused now that the gateway's
//! failure mode can decide. A stream (RLQS) holds its permit only until it is opened; its own
//! caps bound it after.
//!
//! The same layer reads tonic's answer to a message it could not decode (invalid UTF-8 in a
//! string, a malformed field): tonic says `INTERNAL`, which reads as the agent failing; it is
//! the caller's bad input, so the answer says `INVALID_ARGUMENT`, counted as the other
//! malformed requests are.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tonic::Status;

use crate::metrics;

/// The agent's permits for gateway calls, shared by both servers.
#[derive(Clone, Debug)]
pub struct Shed {
    permits: Arc<Semaphore>,
    max: usize,
}

impl Shed {
    pub fn new(max_in_flight_calls: usize) -> Shed {
        assert!(max_in_flight_calls > 0, "validated in Settings");
        Shed {
            permits: Arc::new(Semaphore::new(max_in_flight_calls)),
            max: max_in_flight_calls,
        }
    }

    /// A permit for one call, or `None` when `max` calls are running (counted).
    pub fn try_enter(&self, over: &'static str) -> Option<OwnedSemaphorePermit> {
        let permit = self.permits.clone().try_acquire_owned().ok();
        if permit.is_none() {
            metrics::shed_call(over);
        }
        permit
    }

    pub fn message(&self) -> String {
        format!(
            "the agent is running its {} calls at once (--max-in-flight-calls): try again shortly",
            self.max
        )
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
    S: tower::Service<http::Request<B>, Response = http::Response<tonic::body::Body>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<Result<S::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        match self.shed.try_enter("grpc") {
            Some(permit) => {
                let answer = self.inner.call(request);
                Box::pin(async move {
                    let answer = answer.await;
                    drop(permit);
                    answer.map(decode_failure_is_invalid_argument)
                })
            }
            None => {
                let refused = Status::resource_exhausted(self.shed.message()).into_http();
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
        let a = shed.try_enter("test").expect("first");
        let _b = shed.try_enter("test").expect("second");
        assert!(shed.try_enter("test").is_none(), "a third at once is shed");
        drop(a);
        assert!(shed.try_enter("test").is_some(), "a permit back, a call in");
    }
}
