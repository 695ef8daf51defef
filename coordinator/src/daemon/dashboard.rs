//! The dashboard: one static page at `/` of the admin HTTP, shipped inside the binary, with no
//! build step and no library. It reads `/v1/status` once a second (on a follower, the
//! leader's, at the `leader_admin_http` the follower names), keeps the figures in bounded
//! series in the browser, and draws them as SVG. docs/dashboard.md.

use axum::http::header;
use axum::response::IntoResponse;

/// The page, as shipped.
pub const PAGE: &str = include_str!("dashboard.html");

/// The admin API paths the page reads: each is a route of the admin router.
pub const READS: &[&str] = &["/v1/status"];

pub async fn page() -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            // A new binary's page is taken at once, never an old one from a cache.
            (header::CACHE_CONTROL, "no-cache"),
        ],
        PAGE,
    )
}
