//! What the tests that run the real Envoy share: the slow-tier gate and finding the binary.

use std::path::PathBuf;

use allot_bench::envoy::find_envoy;
use allot_bench::process::missing_tools_are_errors;

/// The Envoy binary, or `None` when this tier is off or (outside CI) Envoy is missing.
pub fn envoy_or_skip(test: &str) -> Option<PathBuf> {
    if std::env::var("ALLOT_SLOW_TESTS").as_deref() != Ok("1") {
        eprintln!("{test}: skipped (slow tier; set ALLOT_SLOW_TESTS=1)");
        return None;
    }
    match find_envoy() {
        Ok(path) => Some(path),
        Err(e) if missing_tools_are_errors() => panic!("{test}: {e}"),
        Err(e) => {
            eprintln!("{test}: skipped: {e}");
            None
        }
    }
}
