//! Overload shedding: at most `max_in_flight_calls` gateway calls run at once, over gRPC and
//! HTTP together. A call past it is answered at once, `RESOURCE_EXHAUSTED` on gRPC and 503
//! with `Retry-After: 1` on HTTP, instead of queueing behind the others: a gateway's deadline
//! is short, and a call answered late is worth less than one refused now that the gateway's
//! failure mode can decide. A stream (RLQS) holds its permit only until it is opened; its own
//! caps bound it after.

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
                    answer
                })
            }
            None => {
                let refused = Status::resource_exhausted(self.shed.message()).into_http();
                Box::pin(async move { Ok(refused) })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
