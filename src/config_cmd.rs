//! `allot config put|get`: the coordinator cluster's limits configuration.
//!
//! `put` loads the files as every daemon will and sends nothing unless they load (every
//! problem printed as file:line:column); then it puts them on the cluster's admin HTTP
//! (`PUT /v1/config`), trying the addresses given in turn until the leader takes them (in
//! rounds, for up to `PUT_RETRY_FOR`, while a leader change is under way), and prints the
//! version committed. Agents take it from the sync stream. `get` prints the version
//! in force and its rules.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use allot_core::sync::{ConfigFile, ConfigFiles};
use clap::{Args, Subcommand};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use allot_agent::limits::read_limits_file;

use crate::check_config::rule_line;

/// Time for one node to answer a put: the leader waits up to 10 s for the commit.
const PUT_TIMEOUT: Duration = Duration::from_secs(15);

/// How long a put goes on trying the nodes in rounds while no node takes it for a reason that
/// may pass: a node down or answering `5xx` (a leader killed, a new one starting), or no
/// leader known (an election). An election takes 1-2 s, the new leader's start a little more.
/// Trying again is safe: a put of the files in force commits nothing (the node answers their
/// version), so a put whose answer was lost lands once.
const PUT_RETRY_FOR: Duration = Duration::from_secs(20);

/// The pause between two rounds of a put.
const PUT_RETRY_PAUSE: Duration = Duration::from_millis(500);

/// Time for one node to answer a read.
const GET_TIMEOUT: Duration = Duration::from_secs(5);

/// Largest answer read: a configuration's files, JSON-escaped, and its limit ids.
const MAX_ANSWER_BYTES: u64 = 16 * 1024 * 1024;

#[derive(Subcommand)]
pub enum ConfigCommand {
    /// Check limits files and put them on the coordinator cluster as a new version; agents
    /// take it from the sync stream. Exits 1 when the files do not load or the cluster refuses
    /// them (nothing changes), 2 when no node took the put.
    Put(PutArgs),
    /// Print the configuration version in force on a coordinator node and its rules.
    Get(GetArgs),
}

/// The nodes a change goes to (`allot config put`, `allot cluster` changes).
#[derive(Args)]
pub struct CoordinatorNodes {
    /// Coordinator nodes' admin HTTP addresses (their --http), tried in turn until the leader
    /// takes the change: give every node's.
    #[arg(
        long,
        env = "ALLOT_COORDINATOR_HTTP",
        default_value = "127.0.0.1:7071",
        value_delimiter = ','
    )]
    pub coordinator: Vec<String>,
}

#[derive(Args)]
pub struct PutArgs {
    /// envoyproxy/ratelimit YAML files, with optional `allot:` blocks.
    #[arg(required = true)]
    files: Vec<PathBuf>,
    #[command(flatten)]
    nodes: CoordinatorNodes,
    /// The version to put at; it must be above the version in force. Default: the next one.
    #[arg(long)]
    version: Option<u64>,
    /// Merge files of the same domain (envoyproxy/ratelimit's MERGE_DOMAIN_CONFIG).
    #[arg(long)]
    merge_domains: bool,
}

#[derive(Args)]
pub struct GetArgs {
    /// A coordinator node's admin HTTP address (its --http).
    #[arg(long, env = "ALLOT_COORDINATOR_HTTP", default_value = "127.0.0.1:7071")]
    coordinator: String,
    /// Print the node's JSON (with the files' texts) as it is.
    #[arg(long)]
    json: bool,
}

pub fn run(cmd: ConfigCommand) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => return fail(2, &format!("cannot start the runtime: {e}")),
    };
    match cmd {
        ConfigCommand::Put(args) => runtime.block_on(put(args)),
        ConfigCommand::Get(args) => runtime.block_on(get(args)),
    }
}

/// The files as a configuration, or every problem with them (unreadable files, then the
/// loader's errors in file order).
fn checked_files(args: &PutArgs) -> Result<ConfigFiles, Vec<String>> {
    let mut problems = Vec::new();
    let mut files = Vec::new();
    for path in &args.files {
        let name = path.display().to_string();
        match read_limits_file(path) {
            Ok(text) => files.push(ConfigFile { name, text }),
            Err(p) => problems.push(format!("{name}: {p}")),
        }
    }
    if !problems.is_empty() {
        return Err(problems);
    }
    let config = ConfigFiles {
        version: args.version.unwrap_or(1),
        merge_domains: args.merge_domains,
        files,
    };
    config.check_size().map_err(|p| vec![p])?;
    match config.load() {
        Ok(_) => Ok(config),
        Err(errors) => {
            let mut problems: Vec<String> = errors.iter().map(|e| e.to_string()).collect();
            if errors.omitted() > 0 {
                problems.push(format!("... and {} more errors", errors.omitted()));
            }
            Err(problems)
        }
    }
}

async fn put(args: PutArgs) -> ExitCode {
    if let Err(e) = admin_authorization() {
        return fail(1, &e);
    }
    let files = match checked_files(&args) {
        Ok(f) => f,
        Err(problems) => {
            for p in &problems {
                eprintln!("{p}");
            }
            return fail(
                1,
                &format!(
                    "config put: the limits do not load ({} problem{}): nothing sent",
                    problems.len(),
                    if problems.len() == 1 { "" } else { "s" }
                ),
            );
        }
    };
    let body = json!({
        "version": args.version,
        "merge_domains": files.merge_domains,
        "files": files
            .files
            .iter()
            .map(|f| json!({ "name": f.name, "text": f.text }))
            .collect::<Vec<_>>(),
    })
    .to_string();
    let deadline = tokio::time::Instant::now() + PUT_RETRY_FOR;
    let tried = loop {
        match put_round(&args.nodes.coordinator, &body).await {
            Round::Done(code) => return code,
            Round::Passing(_) if tokio::time::Instant::now() + PUT_RETRY_PAUSE < deadline => {
                tokio::time::sleep(PUT_RETRY_PAUSE).await;
            }
            Round::Passing(tried) | Round::NotTaken(tried) => break tried,
        }
    };
    fail(
        2,
        &format!("config put: no node took it: {}", tried.join("; ")),
    )
}

/// One put to each node in turn.
enum Round {
    /// Taken or refused: the exit code.
    Done(ExitCode),
    /// No node took it, and some failure may pass (a node down or starting, no leader known):
    /// what each node said.
    Passing(Vec<String>),
    /// No node took it, every node naming a leader not given.
    NotTaken(Vec<String>),
}

async fn put_round(nodes: &[String], body: &str) -> Round {
    let mut tried = Vec::new();
    let mut passing = false;
    let mut targets = Targets::new(nodes);
    while let Some(addr) = targets.next() {
        let addr = &addr;
        let answer =
            tokio::time::timeout(PUT_TIMEOUT, request(addr, "PUT", "/v1/config", Some(body)))
                .await
                .unwrap_or_else(|_| Err(format!("no answer in {PUT_TIMEOUT:?}")));
        match answer {
            Ok((200, v)) if v["unchanged"] == true => {
                // The same files were in force: this put's own earlier attempt, whose answer
                // was lost, or a repeat. Nothing new was committed.
                println!(
                    "version {} committed ({} rules) by {addr}: these files were in force, \
                     nothing committed again",
                    v["version"], v["rules"]
                );
                return Round::Done(ExitCode::SUCCESS);
            }
            Ok((200, v)) => {
                println!(
                    "version {} committed ({} rules) by {addr}",
                    v["version"], v["rules"]
                );
                return Round::Done(ExitCode::SUCCESS);
            }
            Ok((421, v)) => {
                // No leader known: an election is under way.
                passing |= v["leader"].is_null();
                targets.follow(addr, &v);
                tried.push(format!(
                    "{addr}: not the leader (leader: node {} at {})",
                    v["leader"],
                    v["leader_address"].as_str().unwrap_or("unknown")
                ));
            }
            Ok((status, v)) if (400..500).contains(&status) => {
                for p in v["problems"].as_array().into_iter().flatten() {
                    eprintln!("{}", p.as_str().unwrap_or_default());
                }
                let error = v["error"].as_str().unwrap_or("refused");
                return Round::Done(fail(1, &format!("config put refused by {addr}: {error}")));
            }
            Ok((status, v)) => {
                passing = true;
                tried.push(format!(
                    "{addr}: {status} {}",
                    v["error"].as_str().unwrap_or("")
                ));
            }
            Err(e) => {
                passing = true;
                tried.push(format!("{addr}: {e}"));
            }
        }
    }
    if passing {
        Round::Passing(tried)
    } else {
        Round::NotTaken(tried)
    }
}

async fn get(args: GetArgs) -> ExitCode {
    let answer = tokio::time::timeout(
        GET_TIMEOUT,
        request(&args.coordinator, "GET", "/v1/config", None),
    )
    .await
    .unwrap_or_else(|_| Err(format!("no answer in {GET_TIMEOUT:?}")));
    let v = match answer {
        Ok((200, v)) => v,
        Ok((status, v)) => {
            return fail(2, &format!("{}: {status} {}", args.coordinator, v["error"]));
        }
        Err(e) => return fail(2, &format!("{}: {e}", args.coordinator)),
    };
    if args.json {
        println!("{v}");
        return ExitCode::SUCCESS;
    }
    print!("{}", summary(&v));
    ExitCode::SUCCESS
}

/// `version N`, then one line per rule as `check-config` prints them (from the files), or the
/// limit ids when the cluster holds limits without their files.
fn summary(v: &Value) -> String {
    let mut out = format!("version {}\n", v["version"]);
    let files: Option<Vec<ConfigFile>> = v["files"].as_array().map(|fs| {
        fs.iter()
            .map(|f| ConfigFile {
                name: f["name"].as_str().unwrap_or_default().to_owned(),
                text: f["text"].as_str().unwrap_or_default().to_owned(),
            })
            .collect()
    });
    let loaded = files.and_then(|files| {
        ConfigFiles {
            version: v["version"].as_u64().unwrap_or(0),
            merge_domains: v["merge_domains"].as_bool().unwrap_or(false),
            files,
        }
        .load()
        .ok()
    });
    match loaded {
        Some(config) => {
            for rule in config.rules() {
                out += &rule_line(rule);
                out.push('\n');
            }
        }
        None => {
            out += "(put without its files: limit ids only)\n";
            for id in v["limits"].as_array().into_iter().flatten() {
                out += &format!("limit={}\n", id.as_str().unwrap_or("?"));
            }
        }
    }
    out
}

/// The admin addresses a change is sent to in turn: the operator's, then each leader's admin
/// address a node named in a `421` (`leader_admin_http`, from the leader's clock probes) that
/// is not among them, each once.
pub(crate) struct Targets {
    addresses: Vec<String>,
    given: usize,
    next: usize,
}

impl Targets {
    /// Leaders followed in one round, at most (each answer names one; leaders change).
    const MAX_FOLLOWED: usize = 8;

    pub(crate) fn new(given: &[String]) -> Targets {
        Targets {
            addresses: given.to_vec(),
            given: given.len(),
            next: 0,
        }
    }

    pub(crate) fn next(&mut self) -> Option<String> {
        let addr = self.addresses.get(self.next)?.clone();
        self.next += 1;
        Some(addr)
    }

    /// A `421`'s body from the node at `from`: its `leader_admin_http`, if new, is tried after
    /// the rest, with `from`'s scheme (nodes serve their admin HTTP alike, D60).
    pub(crate) fn follow(&mut self, from: &str, answer: &Value) {
        let Some(named) = answer["leader_admin_http"].as_str() else {
            return;
        };
        let scheme = if from.starts_with("https://") && !named.contains("://") {
            "https://"
        } else {
            ""
        };
        let leader = &format!("{scheme}{named}");
        if leader.is_empty()
            || self.addresses.iter().any(|a| same_address(a, leader))
            || self.addresses.len() - self.given >= Self::MAX_FOLLOWED
        {
            return;
        }
        self.addresses.push(leader.to_owned());
    }
}

/// `http://h:p/`, `h:p` and `https://h:p` name the same node.
fn same_address(a: &str, b: &str) -> bool {
    let bare = |s: &str| {
        let s = s
            .strip_prefix("https://")
            .or_else(|| s.strip_prefix("http://"))
            .unwrap_or(s);
        s.trim_end_matches('/').to_owned()
    };
    bare(a) == bare(b)
}

/// One HTTP/1.1 request on a fresh connection: the status code and the body as JSON (`null`
/// when it is not JSON).
pub(crate) async fn request(
    addr: &str,
    method: &str,
    path: &str,
    body: Option<&str>,
) -> Result<(u16, Value), String> {
    let (mut s, host) = crate::admin_http::connect(addr).await?;
    let body = body.unwrap_or("");
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n{}\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        authorization(method)?,
        body.len()
    );
    s.write_all(req.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let mut resp = Vec::new();
    s.take(MAX_ANSWER_BYTES)
        .read_to_end(&mut resp)
        .await
        .map_err(|e| e.to_string())?;
    let resp = String::from_utf8_lossy(&resp);
    let (head, body) = resp
        .split_once("\r\n\r\n")
        .ok_or_else(|| "not an HTTP answer".to_owned())?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("not an HTTP answer: {head}"))?;
    Ok((status, serde_json::from_str(body).unwrap_or(Value::Null)))
}

/// `Authorization: Bearer TOKEN\r\n` when ALLOT_ADMIN_TOKEN is set (a coordinator started
/// with --admin-token-sha256 needs it for changes; D60), else nothing. Read from the
/// environment only, so the token never shows in a process list.
pub(crate) fn admin_authorization() -> Result<String, String> {
    bearer_from("ALLOT_ADMIN_TOKEN")
}

/// The header a call of `method` carries: a read, ALLOT_READ_TOKEN when set (a daemon started
/// with --read-token-sha256 needs it, D63), else the admin token (which a coordinator also
/// takes for reads); a change, the admin token.
pub(crate) fn authorization(method: &str) -> Result<String, String> {
    let read = matches!(method, "GET" | "HEAD");
    if read && std::env::var_os("ALLOT_READ_TOKEN").is_some() {
        return bearer_from("ALLOT_READ_TOKEN");
    }
    admin_authorization()
}

fn bearer_from(var: &str) -> Result<String, String> {
    match std::env::var(var) {
        Ok(t) if t.bytes().all(|b| b.is_ascii_graphic()) && !t.is_empty() => {
            Ok(format!("Authorization: Bearer {t}\r\n"))
        }
        Ok(_) => Err(format!("{var} must be printable ASCII with no spaces")),
        Err(_) => Ok(String::new()),
    }
}

pub(crate) fn fail(code: u8, msg: &str) -> ExitCode {
    eprintln!("allot: {msg}");
    ExitCode::from(code)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn all(t: &mut Targets) -> Vec<String> {
        std::iter::from_fn(|| t.next()).collect()
    }

    #[test]
    fn a_named_leader_is_tried_after_the_given_nodes_once() {
        let mut t = Targets::new(&["a:1".to_owned(), "b:2".to_owned()]);
        assert_eq!(t.next().as_deref(), Some("a:1"));
        t.follow("a:1", &json!({"leader": 3, "leader_admin_http": "c:3"}));
        t.follow("a:1", &json!({"leader": 3, "leader_admin_http": "c:3"}));
        // One of the given nodes, however it is written, is not tried twice.
        t.follow(
            "a:1",
            &json!({"leader": 2, "leader_admin_http": "https://b:2/"}),
        );
        t.follow("a:1", &json!({"leader": null, "leader_admin_http": null}));
        t.follow("a:1", &json!({"leader": 1, "leader_admin_http": ""}));
        assert_eq!(all(&mut t), vec!["b:2", "c:3"]);
    }

    #[test]
    fn a_leader_named_by_a_node_over_https_is_tried_over_https() {
        let mut t = Targets::new(&["https://a:1".to_owned()]);
        t.next();
        t.follow("https://a:1", &json!({"leader_admin_http": "c:3"}));
        assert_eq!(all(&mut t), vec!["https://c:3"]);
    }

    #[test]
    fn followed_leaders_are_capped() {
        let mut t = Targets::new(&["a:1".to_owned()]);
        for i in 0..100 {
            t.follow("a:1", &json!({ "leader_admin_http": format!("n:{i}") }));
        }
        assert_eq!(all(&mut t).len(), 1 + Targets::MAX_FOLLOWED);
    }
}
