//! What the tests that run the `allot` binary share.

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, ChildStderr, Command, Stdio};

/// A started `allot` daemon that printed its ready line (`... grpc=ADDR http=ADDR`).
pub struct Ready {
    pub child: Child,
    pub grpc: String,
    pub http: String,
    /// Held so the process never blocks on a full stderr pipe.
    pub stderr: Option<ChildStderr>,
}

/// Spawns `cmd` (logging at info, stdout and stderr piped) and waits for its first line, the
/// ready line. A process that prints anything else first is killed, and the test fails with
/// its stderr.
pub fn spawn_ready(mut cmd: Command, what: &str) -> Ready {
    let mut child = cmd
        .env("ALLOT_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the allot binary starts");
    let stdout = child.stdout.take().expect("stdout");
    let line = BufReader::new(stdout)
        .lines()
        .next()
        .and_then(|l| l.ok())
        .unwrap_or_default();
    let addr = |name: &str| {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(&format!("{name}=")))
            .map(str::to_owned)
    };
    let (Some(grpc), Some(http)) = (addr("grpc"), addr("http")) else {
        let mut err = String::new();
        if let Some(mut e) = child.stderr.take() {
            let _ = child.kill();
            let _ = e.read_to_string(&mut err);
        }
        panic!("{what} did not become ready: {line:?}\n{err}");
    };
    let stderr = child.stderr.take();
    Ready {
        child,
        grpc,
        http,
        stderr,
    }
}
