//! A `tower::Layer` for HTTP services (feature `tower`): each request is counted against the
//! target a user closure reads from its parts, at the cost another closure names; admitted
//! requests go on to the inner service, refused ones get the crate's 429 ([`too_many_requests`]).
//!
//! The fast path (a key already seen, a held lease) allocates nothing and boxes nothing: the
//! describe closure borrows its descriptor from the request ([`Descriptor`]), the layer's key
//! cache finds the resolved [`Key`] by a hash of it, and [`Client::try_spend`] decides. Only a
//! request that must wait for the agent (a new key, a lease spent faster than refilled) boxes
//! its wait, and only a key seen for the first time (or evicted) allocates its resolution.

use std::collections::HashMap;
use std::future::Future;
use std::hash::{BuildHasher, BuildHasherDefault, Hasher, RandomState};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use allot_core::headers;
use http::request::Parts;
use http::{HeaderName, HeaderValue, Request, Response, StatusCode};
use tower::{Layer, Service};

use crate::client::{Client, Decision, Key};
use crate::response::{Policy, too_many_requests};
use crate::target::Target;

/// Most descriptor entries one request can name (Envoy's descriptors rarely pass four).
pub const MAX_DESCRIPTOR_ENTRIES: usize = 8;

/// Most resolved keys the layer keeps, over all its cache shards. A full shard is emptied:
/// its keys are resolved again when next seen (an allocation each, nothing lost).
pub const MAX_CACHED_KEYS: usize = 65_536;

/// Independent parts of the key cache, each behind its own mutex (a power of two): two
/// requests contend on it only when their keys share a part.
const CACHE_SHARDS: usize = 64;

/// The Retry-After jitter, as the agent's RLS answers draw it: up to a tenth of the wait, at
/// least up to 1 s, at most 60 s.
const RETRY_AFTER_JITTER_PERCENT: u64 = 10;
const RETRY_AFTER_JITTER_MAX_SECS: u64 = 60;

/// The headers of a refusal.
type Refusal = Vec<(&'static str, String)>;

/// A wait for the agent's answer, boxed (the slow path only).
type Deciding = Pin<Box<dyn Future<Output = Option<Refusal>> + Send>>;

/// What one request is counted against, borrowed from the request: a domain and up to
/// [`MAX_DESCRIPTOR_ENTRIES`] ordered entries (key, value), as [`Target`] names them.
#[derive(Clone, Copy, Debug)]
pub struct Descriptor<'a> {
    domain: &'a str,
    entries: [(&'a str, &'a str); MAX_DESCRIPTOR_ENTRIES],
    len: usize,
    /// More entries were named than fit: the request cannot be counted as described, so its
    /// domain's failure mode decides.
    overflow: bool,
}

impl<'a> Descriptor<'a> {
    pub fn new(domain: &'a str) -> Self {
        Descriptor {
            domain,
            entries: [("", ""); MAX_DESCRIPTOR_ENTRIES],
            len: 0,
            overflow: false,
        }
    }

    /// Adds one entry (order matters, as in Envoy).
    pub fn entry(mut self, key: &'a str, value: &'a str) -> Self {
        match self.entries.get_mut(self.len) {
            Some(slot) => {
                *slot = (key, value);
                self.len += 1;
            }
            None => self.overflow = true,
        }
        self
    }

    pub fn domain(&self) -> &'a str {
        self.domain
    }

    pub fn entries(&self) -> &[(&'a str, &'a str)] {
        &self.entries[..self.len]
    }

    fn to_target(self) -> Target {
        self.entries()
            .iter()
            .fold(Target::new(self.domain), |t, (k, v)| t.entry(*k, *v))
    }

    fn names(&self, target: &Target) -> bool {
        target.domain == self.domain
            && target.entries.len() == self.len
            && target
                .entries
                .iter()
                .zip(self.entries())
                .all(|((k, v), (dk, dv))| k == dk && v == dv)
    }
}

/// The cost of every request when no cost closure is set: one unit.
pub fn one_unit(_: &Parts) -> u64 {
    1
}

/// Resolved keys by a hash of their descriptor, so a request of a known key resolves it with
/// no allocation. Bounded by [`MAX_CACHED_KEYS`].
struct KeyCache {
    hasher: RandomState,
    shards: Box<[Mutex<CacheShard>]>,
}

/// The descriptor's hash is already a keyed SipHash: the map uses it as is.
type CacheShard = HashMap<u64, Cached, BuildHasherDefault<AsIs>>;

struct Cached {
    target: Target,
    key: Arc<Key>,
}

/// A hasher that hands a `u64` key back unchanged.
#[derive(Default)]
struct AsIs(u64);

impl Hasher for AsIs {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

/// What the cache and the client made of one request.
enum Spent {
    Decided(Decision),
    /// No held lease decides: wait for the agent.
    Wait(Arc<Key>),
    /// The descriptor names no key the client can hold.
    Unresolvable,
}

impl KeyCache {
    fn new() -> Self {
        KeyCache {
            hasher: RandomState::new(),
            shards: (0..CACHE_SHARDS)
                .map(|_| Mutex::new(CacheShard::default()))
                .collect(),
        }
    }

    fn shard(&self, hash: u64) -> MutexGuard<'_, CacheShard> {
        // Bits the map uses neither for its buckets (the low ones) nor for its tags (the top
        // seven); CACHE_SHARDS is a power of two, so the mask keeps the index in range.
        let index = ((hash >> 32) as usize) & (CACHE_SHARDS - 1);
        // The map is whole after any panic (inserts and clears only): take it over.
        self.shards[index]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Spends `cost_units` of the key `descriptor` names. A known key is decided under the
    /// cache's lock, so the fast path touches no reference count.
    fn spend(&self, client: &Client, descriptor: &Descriptor<'_>, cost_units: u64) -> Spent {
        if descriptor.overflow {
            return Spent::Unresolvable;
        }
        let hash = self
            .hasher
            .hash_one((descriptor.domain, descriptor.entries()));
        if let Some(cached) = self.shard(hash).get(&hash)
            && descriptor.names(&cached.target)
        {
            return spend(client, &cached.key, cost_units);
        }
        // A miss (or a hash shared with another target, which then replaces it): resolve
        // outside the cache's lock, since it allocates and locks a client shard.
        let target = descriptor.to_target();
        let Ok(key) = client.key(&target) else {
            return Spent::Unresolvable;
        };
        let key = Arc::new(key);
        let mut shard = self.shard(hash);
        if shard.len() >= MAX_CACHED_KEYS / CACHE_SHARDS {
            shard.clear();
        }
        shard.insert(
            hash,
            Cached {
                target,
                key: key.clone(),
            },
        );
        drop(shard);
        spend(client, &key, cost_units)
    }
}

fn spend(client: &Client, key: &Arc<Key>, cost_units: u64) -> Spent {
    match client.try_spend(key, cost_units) {
        Some(decision) => Spent::Decided(decision),
        None => Spent::Wait(key.clone()),
    }
}

/// Wraps services so each request is decided by the client before it reaches them.
///
/// `describe` reads the request's target from its parts (`None`: not counted, the request
/// passes); `cost` names its units (default [`one_unit`]). Refusals are answered with the 429
/// of [`too_many_requests`], naming the [`Policy`] set for the target's domain (else only
/// Retry-After); the jitter is drawn here, as the agent draws its own. While the agent is
/// unreachable, requests follow their domain's failure mode as [`Client::spend`] does.
pub struct AllotLayer<D, C = fn(&Parts) -> u64> {
    client: Arc<Client>,
    describe: D,
    cost: C,
    policies: HashMap<String, Policy>,
    keys: Arc<KeyCache>,
}

impl<D: Clone, C: Clone> Clone for AllotLayer<D, C> {
    fn clone(&self) -> Self {
        AllotLayer {
            client: self.client.clone(),
            describe: self.describe.clone(),
            cost: self.cost.clone(),
            policies: self.policies.clone(),
            keys: self.keys.clone(),
        }
    }
}

impl<D> AllotLayer<D>
where
    D: for<'a> Fn(&'a Parts) -> Option<Descriptor<'a>>,
{
    pub fn new(client: Arc<Client>, describe: D) -> Self {
        AllotLayer {
            client,
            describe,
            cost: one_unit,
            policies: HashMap::new(),
            keys: Arc::new(KeyCache::new()),
        }
    }
}

impl<D, C> AllotLayer<D, C> {
    /// Names each request's cost in units (0 is read as 1, as by [`Client::spend`]).
    pub fn cost<C2>(self, cost: C2) -> AllotLayer<D, C2>
    where
        C2: Fn(&Parts) -> u64,
    {
        AllotLayer {
            client: self.client,
            describe: self.describe,
            cost,
            policies: self.policies,
            keys: self.keys,
        }
    }

    /// The policy a refusal of `domain` names in its headers (as the limits file names it).
    pub fn policy(mut self, domain: impl Into<String>, policy: Policy) -> Self {
        self.policies.insert(domain.into(), policy);
        self
    }
}

impl<S, D: Clone, C: Clone> Layer<S> for AllotLayer<D, C> {
    type Service = AllotService<S, D, C>;

    fn layer(&self, inner: S) -> Self::Service {
        AllotService {
            inner,
            shared: Arc::new(Shared {
                client: self.client.clone(),
                describe: self.describe.clone(),
                cost: self.cost.clone(),
                policies: self.policies.clone(),
                keys: self.keys.clone(),
                jitter: AtomicU64::new(jitter_seed()),
            }),
        }
    }
}

/// What every clone of one [`AllotService`] shares.
struct Shared<D, C> {
    client: Arc<Client>,
    describe: D,
    cost: C,
    policies: HashMap<String, Policy>,
    keys: Arc<KeyCache>,
    /// A splitmix64 counter for the Retry-After jitter (refusals only).
    jitter: AtomicU64,
}

/// What the layer does with one request, decided in `call`.
enum Verdict {
    Pass,
    Refuse(Refusal),
    /// No held lease decides: wait for the agent.
    Wait(Arc<Key>, u64),
}

impl<D, C> Shared<D, C>
where
    D: for<'a> Fn(&'a Parts) -> Option<Descriptor<'a>>,
    C: Fn(&Parts) -> u64,
{
    fn verdict(&self, parts: &Parts) -> Verdict {
        let Some(descriptor) = (self.describe)(parts) else {
            return Verdict::Pass;
        };
        let cost_units = (self.cost)(parts);
        let domain = descriptor.domain;
        match self.keys.spend(&self.client, &descriptor, cost_units) {
            Spent::Decided(decision) => self.answer(decision, domain),
            Spent::Wait(key) => Verdict::Wait(key, cost_units),
            Spent::Unresolvable => {
                let decision = self.client.failure_mode_decision(domain);
                self.answer(decision, domain)
            }
        }
    }
}

impl<D, C> Shared<D, C> {
    fn answer(&self, decision: Decision, domain: &str) -> Verdict {
        match self.refusal(decision, domain) {
            None => Verdict::Pass,
            Some(headers) => Verdict::Refuse(headers),
        }
    }

    /// The headers of the 429 for `decision`, `None` when it admitted.
    fn refusal(&self, decision: Decision, domain: &str) -> Option<Refusal> {
        let jitter_secs = match decision {
            Decision::Denied { retry_after } => self.draw_jitter_secs(retry_after),
            Decision::Unavailable { allowed: false } => self.draw_jitter_secs(Duration::ZERO),
            _ => return None,
        };
        match (self.policies.get(domain), decision) {
            (Some(policy), _) => too_many_requests(decision, policy, jitter_secs),
            // No policy to name: the wait alone, never earlier than the refusal's.
            (None, Decision::Denied { retry_after }) => {
                let secs = headers::effective_secs(false, Some(retry_after), retry_after);
                Some(vec![("Retry-After", (secs + jitter_secs).to_string())])
            }
            (None, _) => Some(headers::rate_limit_headers(&[], true, |wait| {
                wait.as_secs() + jitter_secs
            })),
        }
    }

    fn draw_jitter_secs(&self, wait: Duration) -> u64 {
        let base = wait.as_secs().max(1);
        let spread = (base * RETRY_AFTER_JITTER_PERCENT)
            .div_ceil(100)
            .clamp(1, RETRY_AFTER_JITTER_MAX_SECS);
        let draw = splitmix64(
            self.jitter
                .fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed),
        );
        draw % (spread + 1)
    }
}

/// Seeds the jitter differently in each process and each service.
fn jitter_seed() -> u64 {
    RandomState::new().hash_one(0u8)
}

fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A 429 with `headers`, whatever the body type (its default: empty for axum's and hyper's).
fn refusal_response<RB: Default>(headers: Refusal) -> Response<RB> {
    let mut response = Response::new(RB::default());
    *response.status_mut() = StatusCode::TOO_MANY_REQUESTS;
    let map = response.headers_mut();
    for (name, value) in headers {
        // Every name and value the helper builds is plain ASCII; a value that were not would
        // be left out rather than the refusal turned into an error.
        if let Ok(value) = HeaderValue::try_from(value) {
            map.append(HeaderName::from_static(lower_case(name)), value);
        }
    }
    response
}

/// The helper's header names as `http` wants them (lower case, for `from_static`).
fn lower_case(name: &'static str) -> &'static str {
    match name {
        "RateLimit-Policy" => "ratelimit-policy",
        "RateLimit" => "ratelimit",
        "X-RateLimit-Limit" => "x-ratelimit-limit",
        "X-RateLimit-Remaining" => "x-ratelimit-remaining",
        "X-RateLimit-Reset" => "x-ratelimit-reset",
        _ => "retry-after",
    }
}

/// The service [`AllotLayer`] makes.
pub struct AllotService<S, D, C> {
    inner: S,
    shared: Arc<Shared<D, C>>,
}

impl<S: Clone, D, C> Clone for AllotService<S, D, C> {
    fn clone(&self) -> Self {
        AllotService {
            inner: self.inner.clone(),
            shared: self.shared.clone(),
        }
    }
}

impl<S, D, C, B, RB> Service<Request<B>> for AllotService<S, D, C>
where
    S: Service<Request<B>, Response = Response<RB>> + Clone,
    D: for<'a> Fn(&'a Parts) -> Option<Descriptor<'a>> + Send + Sync + 'static,
    C: Fn(&Parts) -> u64 + Send + Sync + 'static,
    RB: Default,
{
    type Response = Response<RB>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, S, B, RB>;

    /// Ready when the inner service is: the layer itself never holds a request back.
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let (parts, body) = request.into_parts();
        let verdict = self.shared.verdict(&parts);
        let request = Request::from_parts(parts, body);
        let state = match verdict {
            Verdict::Pass => State::Inner {
                future: self.inner.call(request),
            },
            Verdict::Refuse(headers) => State::Refused {
                response: refusal_response(headers),
            },
            Verdict::Wait(key, cost_units) => {
                // The service made ready by poll_ready goes with the request; this service
                // keeps a clone, to be made ready for the next one.
                let clone = self.inner.clone();
                let ready = std::mem::replace(&mut self.inner, clone);
                let shared = self.shared.clone();
                State::Deciding {
                    decision: Box::pin(async move {
                        let decision = shared.client.spend(&key, cost_units).await;
                        shared.refusal(decision, key.domain())
                    }),
                    pending: Some((ready, request)),
                }
            }
        };
        ResponseFuture { state }
    }
}

pin_project_lite::pin_project! {
    /// The answer of an [`AllotService`]: the inner service's, or a 429.
    pub struct ResponseFuture<F, S, B, RB> {
        #[pin]
        state: State<F, S, B, RB>,
    }
}

pin_project_lite::pin_project! {
    #[project = StateProj]
    enum State<F, S, B, RB> {
        Inner { #[pin] future: F },
        Refused { response: Response<RB> },
        Deciding { decision: Deciding, pending: Option<(S, Request<B>)> },
    }
}

impl<F, S, B, RB, E> Future for ResponseFuture<F, S, B, RB>
where
    F: Future<Output = Result<Response<RB>, E>>,
    S: Service<Request<B>, Response = Response<RB>, Error = E, Future = F>,
    RB: Default,
{
    type Output = Result<Response<RB>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut state = self.project().state;
        loop {
            match state.as_mut().project() {
                StateProj::Inner { future } => return future.poll(cx),
                StateProj::Refused { response } => {
                    return Poll::Ready(Ok(std::mem::take(response)));
                }
                StateProj::Deciding { decision, pending } => {
                    let refusal = ready!(decision.as_mut().poll(cx));
                    let next = match (refusal, pending.take()) {
                        (None, Some((mut inner, request))) => State::Inner {
                            future: inner.call(request),
                        },
                        (Some(headers), _) => State::Refused {
                            response: refusal_response(headers),
                        },
                        // Polled again after it answered: nothing left to send.
                        (None, None) => State::Refused {
                            response: internal_error(),
                        },
                    };
                    state.set(next);
                }
            }
        }
    }
}

fn internal_error<RB: Default>() -> Response<RB> {
    let mut response = Response::new(RB::default());
    *response.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
    response
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::sync::atomic::{AtomicBool, AtomicUsize};
    use std::task::Waker;

    use allot_core::gateway::{LeaseDenial, LeaseGrant};
    use allot_core::ids::LeaseId;
    use allot_core::limit::FailureMode;
    use tower::ServiceExt;

    use super::*;
    use crate::config::ClientConfig;

    /// Longest a test waits for the layer's slow path to ask: a bound on a hang.
    const PATIENCE: Duration = Duration::from_secs(10);

    /// The inner service: counts its calls, ready only when told.
    #[derive(Clone)]
    struct Inner {
        ready: Arc<AtomicBool>,
        calls: Arc<AtomicUsize>,
    }

    impl Inner {
        fn new() -> Self {
            Inner {
                ready: Arc::new(AtomicBool::new(true)),
                calls: Arc::new(AtomicUsize::new(0)),
            }
        }
    }

    impl Service<Request<String>> for Inner {
        type Response = Response<String>;
        type Error = Infallible;
        type Future = std::future::Ready<Result<Response<String>, Infallible>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
            if self.ready.load(Ordering::SeqCst) {
                Poll::Ready(Ok(()))
            } else {
                Poll::Pending
            }
        }

        fn call(&mut self, _: Request<String>) -> Self::Future {
            self.calls.fetch_add(1, Ordering::SeqCst);
            std::future::ready(Ok(Response::new(String::new())))
        }
    }

    fn by_api_key(parts: &Parts) -> Option<Descriptor<'_>> {
        let value = parts.headers.get("x-api-key")?.to_str().ok()?;
        Some(Descriptor::new("api").entry("api_key", value))
    }

    fn cost_header(parts: &Parts) -> u64 {
        parts
            .headers
            .get("x-cost")
            .and_then(|v| v.to_str().ok()?.parse().ok())
            .unwrap_or(1)
    }

    /// A client with no driver: the tests answer its lease requests by hand.
    fn detached(failure_mode: FailureMode) -> Arc<Client> {
        let mut config = ClientConfig::new("http://127.0.0.1:1");
        config.failure_mode = failure_mode;
        // No refill, so a lease granted by hand is all there is.
        config.gateway.refill_threshold_percent = 0;
        let (client, _stopped) = Client::detached(config).expect("client");
        Arc::new(client)
    }

    fn request(api_key: Option<&str>, cost: u64) -> Request<String> {
        let mut builder = Request::builder().uri("/").header("x-cost", cost);
        if let Some(k) = api_key {
            builder = builder.header("x-api-key", k);
        }
        builder.body(String::new()).expect("request")
    }

    fn policy() -> Policy {
        Policy {
            name: "per-key".into(),
            quota_units: 10,
            window: Some(Duration::from_secs(60)),
        }
    }

    fn key(client: &Client, api_key: &str) -> Key {
        client
            .key(&Target::new("api").entry("api_key", api_key))
            .expect("key")
    }

    fn grant(client: &Client, key: &Key, units: u64) -> usize {
        client.answer_lease_requests(key, |gateway, now, wanted| {
            let grant = LeaseGrant {
                lease: LeaseId(1),
                units,
                ttl: Duration::from_secs(60),
                remaining_units: 1_000,
            };
            gateway.handle_lease_granted(now, wanted.ticket, grant);
        })
    }

    fn header<'a>(response: &'a Response<String>, name: &str) -> &'a str {
        response
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
    }

    #[tokio::test]
    async fn a_request_with_no_descriptor_passes_to_the_inner_service() {
        let client = detached(FailureMode::Closed);
        let inner = Inner::new();
        let service = AllotLayer::new(client, by_api_key).layer(inner.clone());
        let response = service.oneshot(request(None, 1)).await.expect("answer");
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(inner.calls.load(Ordering::SeqCst), 1);
    }

    /// A held lease admits at the closure's cost; a key the agent refused gets the 429 with
    /// the domain's policy, its wait and a jitter that only adds; the inner service never
    /// sees the refused request.
    #[tokio::test]
    async fn a_held_lease_admits_at_its_cost_and_a_refused_key_gets_the_429() {
        let client = detached(FailureMode::Open);
        let inner = Inner::new();
        let service = AllotLayer::new(client.clone(), by_api_key)
            .cost(cost_header)
            .policy("api", policy())
            .layer(inner.clone());
        let a = key(&client, "a");
        assert_eq!(client.try_spend(&a, 1), None, "no lease yet");
        assert_eq!(grant(&client, &a, 10), 1);
        let response = service.clone().oneshot(request(Some("a"), 4)).await;
        assert_eq!(response.expect("answer").status(), StatusCode::OK);
        assert_eq!(client.held_units(&a), 6, "4 of 10 spent");

        let b = key(&client, "b");
        assert_eq!(client.try_spend(&b, 1), None);
        let retry_after = Duration::from_millis(29_500);
        client.answer_lease_requests(&b, |gateway, now, wanted| {
            gateway.handle_lease_denied(now, wanted.ticket, LeaseDenial { retry_after });
        });
        let response = service
            .oneshot(request(Some("b"), 1))
            .await
            .expect("answer");
        assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(
            header(&response, "ratelimit-policy"),
            r#""per-key";q=10;w=60"#
        );
        assert_eq!(header(&response, "x-ratelimit-remaining"), "0");
        // 29.5 s rounds up to 30; the jitter adds up to a tenth (3 s).
        let retry: u64 = header(&response, "retry-after").parse().expect("seconds");
        assert!((30..=33).contains(&retry), "Retry-After {retry}");
        assert_eq!(
            inner.calls.load(Ordering::SeqCst),
            1,
            "only the admitted call"
        );
    }

    /// A request with no lease to spend waits for the agent's answer (the boxed slow path),
    /// then reaches the service made ready before it.
    #[tokio::test]
    async fn a_request_without_a_lease_waits_for_the_grant() {
        let client = detached(FailureMode::Closed);
        let inner = Inner::new();
        let service = AllotLayer::new(client.clone(), by_api_key).layer(inner.clone());
        let waiting = tokio::spawn(service.oneshot(request(Some("c"), 1)));
        let c = key(&client, "c");
        let deadline = tokio::time::Instant::now() + PATIENCE;
        while grant(&client, &c, 5) == 0 {
            assert!(tokio::time::Instant::now() < deadline, "no lease request");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let response = waiting.await.expect("task").expect("answer");
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(inner.calls.load(Ordering::SeqCst), 1);
        assert_eq!(client.held_units(&c), 4);
    }

    /// The agent unreachable and no lease held: a closed domain answers 429 with a short
    /// Retry-After and nothing else, an open one passes; both counted.
    #[tokio::test]
    async fn without_the_agent_the_failure_mode_decides() {
        for (mode, status) in [
            (FailureMode::Closed, StatusCode::TOO_MANY_REQUESTS),
            (FailureMode::Open, StatusCode::OK),
        ] {
            let client = detached(mode);
            let service = AllotLayer::new(client.clone(), by_api_key)
                .policy("api", policy())
                .layer(Inner::new());
            let d = key(&client, "d");
            assert_eq!(client.try_spend(&d, 1), None);
            client.answer_lease_requests(&d, |gateway, now, wanted| {
                gateway.handle_agent_unavailable(now, wanted.ticket);
            });
            let response = service
                .oneshot(request(Some("d"), 1))
                .await
                .expect("answer");
            assert_eq!(response.status(), status, "{mode:?}");
            if mode == FailureMode::Closed {
                let names: Vec<_> = response.headers().keys().collect();
                assert_eq!(names, ["retry-after"]);
                assert!(["1", "2"].contains(&header(&response, "retry-after")));
            }
            let stats = client.stats();
            assert_eq!(stats.failed_open + stats.failed_closed, 1);
        }
    }

    /// Counts the allocations of the thread that makes them (the tests below run their
    /// requests on their own thread, with no runtime).
    mod counting {
        use std::alloc::{GlobalAlloc, Layout, System};
        use std::cell::Cell;

        thread_local! {
            pub static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
        }

        pub struct Counting;

        // SAFETY: every call is forwarded to the system allocator unchanged; the count is a
        // thread-local Cell with no destructor, so counting itself never allocates.
        unsafe impl GlobalAlloc for Counting {
            unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
                let _ = ALLOCATIONS.try_with(|c| c.set(c.get() + 1));
                // SAFETY: the caller's contract, passed on.
                unsafe { System.alloc(layout) }
            }

            unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
                // SAFETY: the caller's contract, passed on.
                unsafe { System.dealloc(ptr, layout) }
            }
        }

        #[global_allocator]
        static GLOBAL: Counting = Counting;

        pub fn count() -> u64 {
            ALLOCATIONS.with(Cell::get)
        }
    }

    /// Requests of a key already seen, spent from a held lease, allocate nothing in the layer
    /// (the describe and cost closures, the key cache, the decision, the inner call), as the
    /// client's own `try_spend` allocates nothing.
    #[test]
    fn the_fast_path_allocates_nothing() {
        const REQUESTS: usize = 1_000;
        let client = detached(FailureMode::Closed);
        let mut service = AllotLayer::new(client.clone(), by_api_key)
            .cost(cost_header)
            .layer(Inner::new());
        let a = key(&client, "a");
        assert_eq!(client.try_spend(&a, 1), None);
        grant(&client, &a, 1_000_000);
        let mut cx = Context::from_waker(Waker::noop());
        let mut requests: Vec<_> = (0..=REQUESTS).map(|_| request(Some("a"), 1)).collect();
        let mut serve = |request| {
            assert!(service.poll_ready(&mut cx).is_ready());
            let mut future = std::pin::pin!(service.call(request));
            match future.as_mut().poll(&mut cx) {
                Poll::Ready(Ok(response)) => response.status(),
                other => panic!("{other:?}"),
            }
        };
        // The first request resolves the key into the layer's cache (this allocates).
        assert_eq!(serve(requests.pop().expect("one")), StatusCode::OK);
        let before = counting::count();
        for request in requests.drain(..) {
            assert_eq!(serve(request), StatusCode::OK);
        }
        let layer_allocations = counting::count() - before;
        let before = counting::count();
        for _ in 0..REQUESTS {
            assert_eq!(client.try_spend(&a, 1), Some(Decision::Allowed));
        }
        let client_allocations = counting::count() - before;
        assert_eq!((layer_allocations, client_allocations), (0, 0));
    }

    #[test]
    fn the_layer_is_ready_exactly_when_its_inner_service_is() {
        let client_config = ClientConfig::new("http://127.0.0.1:1");
        let (client, _stopped) = Client::detached(client_config).expect("client");
        let inner = Inner::new();
        let mut service = AllotLayer::new(Arc::new(client), by_api_key).layer(inner.clone());
        let mut cx = Context::from_waker(Waker::noop());
        inner.ready.store(false, Ordering::SeqCst);
        assert!(service.poll_ready(&mut cx).is_pending());
        inner.ready.store(true, Ordering::SeqCst);
        assert!(matches!(service.poll_ready(&mut cx), Poll::Ready(Ok(()))));
    }

    #[test]
    fn a_descriptor_names_the_target_it_resolves_to() {
        let d = Descriptor::new("api")
            .entry("user", "a")
            .entry("route", "/x");
        let t = d.to_target();
        assert_eq!(
            t,
            Target::new("api").entry("user", "a").entry("route", "/x")
        );
        assert!(d.names(&t));
        assert!(!Descriptor::new("api").entry("user", "a").names(&t));
        assert!(
            !Descriptor::new("api")
                .entry("user", "b")
                .entry("route", "/x")
                .names(&t)
        );
    }

    #[test]
    fn a_descriptor_past_its_most_entries_says_so() {
        let d = (0..=MAX_DESCRIPTOR_ENTRIES).fold(Descriptor::new("d"), |d, _| d.entry("k", "v"));
        assert!(d.overflow);
        assert_eq!(d.entries().len(), MAX_DESCRIPTOR_ENTRIES);
    }

    #[test]
    fn the_helpers_header_names_all_have_their_lower_case_form() {
        let policy = Policy {
            name: "p".into(),
            quota_units: 1,
            window: Some(Duration::from_secs(60)),
        };
        let denied = Decision::Denied {
            retry_after: Duration::from_secs(3),
        };
        let headers = too_many_requests(denied, &policy, 0).expect("a refusal");
        for (name, _) in headers {
            assert_eq!(lower_case(name), name.to_ascii_lowercase());
        }
    }
}
