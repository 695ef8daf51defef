//! Log output: tracing to stderr, human-readable or one JSON object per line. The level
//! comes from `ALLOT_LOG` (an `EnvFilter` directive such as `info` or `allot_agent=debug`).

use tracing_subscriber::EnvFilter;

/// Installs the subscriber; a second call does nothing.
pub fn init(json: bool) {
    let filter = EnvFilter::try_from_env("ALLOT_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    let _ = if json {
        builder.json().try_init()
    } else {
        builder.try_init()
    };
}
