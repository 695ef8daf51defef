//! Who may call the agent's gateway-facing APIs, and for which domains (D59,
//! docs/security.md). A callers file names each caller, how it proves who it is (a client
//! certificate naming `spiffe://allot/gateway/NAME`, or a bearer token, stored as its SHA-256),
//! and the domains it may spend. With one configured, every call of the lease API, RLS, RLQS
//! and the HTTP/JSON lease API must come from a named caller (`UNAUTHENTICATED` otherwise),
//! and a caller outside its domains gets `PERMISSION_DENIED`.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime};

use allot_core::algo::gcra::{Gcra, GcraState};
use allot_core::limit::RateCap;
use allot_core::time::Timestamp;

use allot_proto::tls::{self, Peer};
use serde::Deserialize;

use crate::error::{Error, Result};

/// Largest callers file read.
pub const MAX_CALLERS_FILE_BYTES: u64 = 1024 * 1024;
/// Most callers one file may name.
pub const MAX_CALLERS: usize = 10_000;

/// One named caller and its scope.
#[derive(Debug)]
pub struct Caller {
    pub name: String,
    /// `None`: every domain (`"*"` in the file).
    domains: Option<BTreeSet<String>>,
    /// `max_calls_per_sec`: its share of the agent, a GCRA with a second's burst.
    rate: Option<CallRate>,
}

#[derive(Debug)]
struct CallRate {
    per_sec: u64,
    gcra: Gcra,
    state: Mutex<GcraState>,
}

impl PartialEq for Caller {
    fn eq(&self, other: &Caller) -> bool {
        self.name == other.name && self.domains == other.domains
    }
}

impl Caller {
    /// Takes one call from the caller's rate, if it has one: `Err(per_sec)` when it is past it.
    pub fn take_call(&self) -> std::result::Result<(), u64> {
        let Some(rate) = &self.rate else {
            return Ok(());
        };
        let now = Timestamp::from_unix_nanos(monotonic_nanos());
        let mut state = rate.state.lock().unwrap_or_else(|p| p.into_inner());
        if rate.gcra.check(&mut state, now, 1).is_allowed() {
            Ok(())
        } else {
            Err(rate.per_sec)
        }
    }

    /// Whether this caller may spend `domain`'s quotas.
    pub fn may(&self, domain: &str) -> bool {
        self.domains.as_ref().is_none_or(|d| d.contains(domain))
    }

    /// Whether this caller may act on a lease or slot of `limit`, whose id is
    /// `DOMAIN/DESCRIPTOR PATH` (core/src/config/model.rs). A domain named with a `/` in it
    /// also covers the domains it is a prefix of: they cannot be told apart from the id.
    pub fn may_limit(&self, limit: &str) -> bool {
        self.domains.as_ref().is_none_or(|ds| {
            ds.iter().any(|d| {
                limit
                    .strip_prefix(d.as_str())
                    .is_some_and(|rest| rest.starts_with('/'))
            })
        })
    }
}

/// The callers file, loaded.
#[derive(Debug, Default)]
pub struct Callers {
    by_certificate: HashMap<String, Arc<Caller>>,
    by_token: HashMap<[u8; 32], Arc<Caller>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileJson {
    callers: Vec<EntryJson>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EntryJson {
    name: String,
    /// It proves its name with a client certificate naming `spiffe://allot/gateway/NAME`.
    #[serde(default)]
    certificate: bool,
    /// Or with `Authorization: Bearer TOKEN`: the token's SHA-256, in hex.
    token_sha256: Option<String>,
    domains: Vec<String>,
    /// Most calls a second this caller may make (a second's worth at once); absent: no cap.
    max_calls_per_sec: Option<u64>,
}

/// Why a call was not let through.
#[derive(Debug, PartialEq, Eq)]
pub enum Refusal {
    /// No certificate or token of a named caller.
    Unauthenticated,
    /// A named caller, outside its domains: `what` is `domain NAME` or `limit ID`.
    OutOfScope { caller: String, what: String },
    /// A named caller past its `max_calls_per_sec`.
    OverRate { caller: String, per_sec: u64 },
}

impl Callers {
    /// Reads and checks a callers file (JSON; YAML's flow style reads the same).
    pub fn load(path: &Path) -> Result<Callers> {
        use std::io::Read;
        let bad = |why: String| Error::Config(format!("{}: {why}", path.display()));
        let file = std::fs::File::open(path).map_err(|e| bad(format!("cannot open: {e}")))?;
        let mut text = String::new();
        file.take(MAX_CALLERS_FILE_BYTES + 1)
            .read_to_string(&mut text)
            .map_err(|e| bad(format!("cannot read: {e}")))?;
        if text.len() as u64 > MAX_CALLERS_FILE_BYTES {
            return Err(bad(format!("larger than {MAX_CALLERS_FILE_BYTES} bytes")));
        }
        Callers::parse(&text).map_err(bad)
    }

    /// Every problem of the file, joined.
    pub fn parse(text: &str) -> std::result::Result<Callers, String> {
        let file: FileJson = serde_json::from_str(text).map_err(|e| e.to_string())?;
        if file.callers.len() > MAX_CALLERS {
            return Err(format!("more than {MAX_CALLERS} callers"));
        }
        let mut callers = Callers::default();
        let mut names = BTreeSet::new();
        let mut problems = Vec::new();
        for (i, entry) in file.callers.into_iter().enumerate() {
            let at = format!("callers[{i}] ({})", entry.name);
            if !names.insert(entry.name.clone()) {
                problems.push(format!("{at}: the name is used twice"));
            }
            if let Err(why) = callers.add(entry) {
                problems.push(format!("{at}: {why}"));
            }
        }
        if problems.is_empty() {
            Ok(callers)
        } else {
            Err(problems.join("; "))
        }
    }

    fn add(&mut self, entry: EntryJson) -> std::result::Result<(), String> {
        if entry.name.is_empty() {
            return Err("an empty name".to_owned());
        }
        if entry.domains.is_empty() || entry.domains.iter().any(String::is_empty) {
            return Err("`domains` lists no domain, or an empty one (\"*\": every domain)".into());
        }
        let digest = entry
            .token_sha256
            .as_deref()
            .map(|h| tls::parse_sha256_hex(h).map_err(|e| format!("token_sha256 {e}")))
            .transpose()?;
        if !entry.certificate && digest.is_none() {
            return Err(
                "neither `certificate: true` nor `token_sha256`: it could never call".into(),
            );
        }
        let domains = (!entry.domains.iter().any(|d| d == "*"))
            .then(|| entry.domains.iter().cloned().collect());
        if entry.max_calls_per_sec == Some(0) {
            return Err("max_calls_per_sec is 0: it could never call".into());
        }
        let rate = entry.max_calls_per_sec.map(|per_sec| CallRate {
            per_sec,
            gcra: Gcra::new(RateCap {
                units: per_sec,
                per: Duration::from_secs(1),
                burst: per_sec,
            }),
            state: Mutex::new(GcraState::default()),
        });
        let caller = Arc::new(Caller {
            name: entry.name.clone(),
            domains,
            rate,
        });
        if let Some(d) = digest
            && self.by_token.insert(d, caller.clone()).is_some()
        {
            return Err("the same token as another caller".to_owned());
        }
        if entry.certificate {
            self.by_certificate.insert(entry.name, caller);
        }
        Ok(())
    }

    /// The caller a connection's certificate or a call's `authorization` value names.
    pub fn identify(
        &self,
        peer: Option<&Peer>,
        authorization: Option<&str>,
    ) -> Option<Arc<Caller>> {
        if let Some(Peer::Gateway(name)) = peer
            && let Some(c) = self.by_certificate.get(name)
        {
            return Some(c.clone());
        }
        let token = tls::bearer(authorization?)?;
        self.by_token.get(&tls::token_sha256(token)).cloned()
    }
}

/// The callers file in force: read again when it changes on disk (polled with the limits
/// files) or on SIGHUP. A new version that does not load is logged and counted, and the one
/// before stays in force: a typo must not lock every gateway out, nor let every caller in.
#[derive(Debug, Default)]
pub struct LiveCallers {
    path: Option<PathBuf>,
    stamp: Mutex<Option<(SystemTime, u64)>>,
    current: RwLock<Option<Arc<Callers>>>,
}

impl LiveCallers {
    /// `path` and what was read from it at start (`None`, `None`: no callers file, everyone
    /// passes).
    pub fn new(path: Option<PathBuf>, loaded: Option<Arc<Callers>>) -> LiveCallers {
        let stamp = path.as_deref().and_then(stamp_of);
        LiveCallers {
            path,
            stamp: Mutex::new(stamp),
            current: RwLock::new(loaded),
        }
    }

    /// The callers in force; `None`: no callers file.
    pub fn get(&self) -> Option<Arc<Callers>> {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Whether the file's modification time or length changed since it was last read.
    pub fn changed(&self) -> bool {
        let Some(path) = &self.path else {
            return false;
        };
        *self.stamp.lock().unwrap_or_else(|p| p.into_inner()) != stamp_of(path)
    }

    /// Reads the file again; false (the callers before kept) when it does not load.
    pub fn reload(&self, why: &str) -> bool {
        let Some(path) = &self.path else {
            return true;
        };
        *self.stamp.lock().unwrap_or_else(|p| p.into_inner()) = stamp_of(path);
        match Callers::load(path) {
            Ok(callers) => {
                tracing::info!(why, file = %path.display(), "callers file reloaded");
                crate::metrics::callers_reload(true);
                *self.current.write().unwrap_or_else(|p| p.into_inner()) = Some(Arc::new(callers));
                true
            }
            Err(e) => {
                tracing::warn!(why, error = %e, "callers file does not load: kept the one before");
                crate::metrics::callers_reload(false);
                false
            }
        }
    }
}

/// Nanoseconds on a clock that never goes back, for the callers' rates.
fn monotonic_nanos() -> u64 {
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    // Past zero, so that a fresh GCRA state (TAT 0) reads as idle.
    let since = START.get_or_init(Instant::now).elapsed() + Duration::from_secs(1);
    u64::try_from(since.as_nanos()).unwrap_or(u64::MAX)
}

fn stamp_of(path: &Path) -> Option<(SystemTime, u64)> {
    let m = std::fs::metadata(path).ok()?;
    Some((m.modified().ok()?, m.len()))
}

/// Checks a named caller (or none, when no callers file is configured) against `domain`.
pub fn check(caller: Option<&Arc<Caller>>, domain: &str) -> std::result::Result<(), Refusal> {
    match caller {
        Some(c) if !c.may(domain) => Err(Refusal::OutOfScope {
            caller: c.name.clone(),
            what: format!("domain {domain}"),
        }),
        _ => Ok(()),
    }
}

/// Checks a named caller against the limit of a lease or slot it names.
pub fn check_limit(caller: Option<&Arc<Caller>>, limit: &str) -> std::result::Result<(), Refusal> {
    match caller {
        Some(c) if !c.may_limit(limit) => Err(Refusal::OutOfScope {
            caller: c.name.clone(),
            what: format!("limit {limit}"),
        }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(d: [u8; 32]) -> String {
        d.iter().map(|b| format!("{b:02x}")).collect()
    }

    #[test]
    fn a_token_or_a_certificate_names_its_caller_and_its_domains_bound_it() {
        let text = format!(
            r#"{{"callers": [
                {{"name": "edge", "certificate": true, "domains": ["shop"]}},
                {{"name": "py", "token_sha256": "{}", "domains": ["*"]}}
            ]}}"#,
            hex(tls::token_sha256("s3cret"))
        );
        let callers = Callers::parse(&text).expect("valid");
        let edge = callers
            .identify(Some(&Peer::Gateway("edge".into())), None)
            .expect("the certificate names edge");
        assert!(edge.may("shop") && !edge.may("llm"));
        assert!(edge.may_limit("shop/api_key") && !edge.may_limit("shopping/api_key"));
        assert!(!edge.may_limit("shop") && !edge.may_limit("llm/shop/x"));
        assert_eq!(
            check(Some(&edge), "llm"),
            Err(Refusal::OutOfScope {
                caller: "edge".into(),
                what: "domain llm".into()
            })
        );
        let py = callers
            .identify(None, Some("Bearer s3cret"))
            .expect("the token");
        assert!(py.may("anything"));
        assert_eq!(callers.identify(None, Some("Bearer wrong")), None);
        assert_eq!(
            callers.identify(None, Some("s3cret")),
            None,
            "not a bearer value"
        );
        // A gateway certificate of a name the file lists only with a token is no proof.
        assert_eq!(
            callers.identify(Some(&Peer::Gateway("py".into())), None),
            None
        );
        assert_eq!(
            callers.identify(Some(&Peer::Region("edge".into())), None),
            None
        );
    }

    #[test]
    fn a_capped_caller_takes_a_seconds_burst_then_is_refused() {
        let callers = Callers::parse(&format!(
            r#"{{"callers": [{{"name": "c", "token_sha256": "{}", "domains": ["*"],
                               "max_calls_per_sec": 3}}]}}"#,
            hex(tls::token_sha256("t"))
        ))
        .expect("valid");
        let c = callers.identify(None, Some("Bearer t")).expect("named");
        for i in 0..3 {
            assert_eq!(c.take_call(), Ok(()), "call {i} of the burst");
        }
        assert_eq!(c.take_call(), Err(3));
        assert!(Callers::parse(
            r#"{"callers": [{"name": "z", "certificate": true, "domains": ["*"], "max_calls_per_sec": 0}]}"#
        )
        .is_err());
    }

    #[test]
    fn every_problem_of_a_callers_file_is_named() {
        let err = Callers::parse(
            r#"{"callers": [
                {"name": "a", "domains": ["shop"]},
                {"name": "a", "certificate": true, "domains": []},
                {"name": "b", "token_sha256": "xyz", "domains": ["shop"]}
            ]}"#,
        )
        .unwrap_err();
        assert!(err.contains("callers[0] (a): neither"), "{err}");
        assert!(
            err.contains("callers[1] (a): the name is used twice"),
            "{err}"
        );
        assert!(err.contains("callers[1] (a): `domains`"), "{err}");
        assert!(err.contains("callers[2] (b): token_sha256"), "{err}");
        assert!(Callers::parse(r#"{"callers": [], "extra": 1}"#).is_err());
    }
}
