//! How stored records and raft messages are encoded: a format byte, then postcard.
//!
//! Postcard keeps no field names, so a change to a stored type changes its layout; the format
//! byte lets a later layout be told from this one and the old one still be read (as the
//! agent's store does, docs/decisions.md D18).

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::error::{Error, Result};

/// The layout of every record but the snapshot state, and of the snapshot state before it
/// kept the configuration's files.
pub const FORMAT_V1: u8 = 0x01;

/// The snapshot state's layout since it keeps the configuration's files
/// (`ClusterState::config_files`); format 1 states still read.
pub const FORMAT_V2: u8 = 0x02;

/// The snapshot state's layout since the table keeps removed regions
/// (`AllowanceTable::removed`); format 2 and 1 states still read.
pub const FORMAT_V3: u8 = 0x03;

/// The snapshot state's layout since the clock samples name their clock
/// (`ClusterState::clock_source`); format 3, 2 and 1 states still read.
pub const FORMAT_V4: u8 = 0x04;

/// The snapshot state's layout since the table records the version each region was heard on
/// (`AllowanceTable::recorded_version`); formats 4 to 1 still read.
pub const FORMAT_V5: u8 = 0x05;

/// The snapshot state's layout since it keeps the regions' boots (`ClusterState::boots`);
/// formats 5 to 1 still read.
pub const FORMAT_V6: u8 = 0x06;

pub fn encode<T: Serialize>(what: &'static str, value: &T) -> Result<Vec<u8>> {
    encode_as(FORMAT_V1, what, value)
}

/// Encodes `value` behind the format byte `format`.
pub fn encode_as<T: Serialize>(format: u8, what: &'static str, value: &T) -> Result<Vec<u8>> {
    let mut out = vec![format];
    postcard::to_io(value, &mut out).map_err(|e| Error::Encode {
        what,
        detail: e.to_string(),
    })?;
    Ok(out)
}

/// Decodes a record written by [`encode`]; anything else is [`Error::Corrupt`].
pub fn decode<T: DeserializeOwned>(what: &'static str, bytes: &[u8]) -> Result<T> {
    match split_format(what, bytes)? {
        (FORMAT_V1, body) => decode_body(what, body),
        (format, _) => Err(unknown_format(what, format)),
    }
}

/// A record's format byte and the body behind it.
pub fn split_format<'a>(what: &'static str, bytes: &'a [u8]) -> Result<(u8, &'a [u8])> {
    match bytes.split_first() {
        Some((&format, body)) => Ok((format, body)),
        None => Err(Error::corrupt(what, "empty record")),
    }
}

/// Decodes a whole body as `T`: bytes left after it are damage.
pub fn decode_body<T: DeserializeOwned>(what: &'static str, body: &[u8]) -> Result<T> {
    let (value, rest) = postcard::take_from_bytes(body).map_err(|e| Error::corrupt(what, e))?;
    if !rest.is_empty() {
        return Err(Error::corrupt(
            what,
            format!("{} bytes after the record", rest.len()),
        ));
    }
    Ok(value)
}

pub fn unknown_format(what: &'static str, format: u8) -> Error {
    Error::corrupt(what, format!("unknown format byte {format:#04x}"))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use allot_core::ids::LimitId;
    use allot_core::limit::{
        Algorithm, ConcurrencyCap, Consistency, FailureMode, LimitSpec, PartitionPolicy, Quota,
        RateCap, RegionWeights,
    };
    use allot_core::time::Window;
    use serde::Serialize;

    use super::*;

    /// A limit as records held it before `algorithm` existed: the fields in their order.
    #[derive(Serialize)]
    struct LimitSpecBeforeAlgorithm {
        id: LimitId,
        quota: Quota,
        consistency: Consistency,
        weights: RegionWeights,
        partition_policy: PartitionPolicy,
        rate_cap: Option<RateCap>,
        concurrency: Option<ConcurrencyCap>,
        failure_mode: FailureMode,
        enabled: bool,
        shadow_mode: bool,
        detailed_metric: bool,
        name: Option<String>,
        replaces: Vec<String>,
        max_settle_overage_ppm: u64,
    }

    #[test]
    fn limits_stored_before_the_algorithm_existed_read_as_fixed_windows() {
        let window = Window::new(Duration::from_secs(60));
        let old = LimitSpecBeforeAlgorithm {
            id: LimitId::new("api/tenant"),
            quota: Quota::Units { units: 100, window },
            consistency: Consistency::Strict,
            weights: RegionWeights::default(),
            partition_policy: PartitionPolicy::Closed,
            rate_cap: None,
            concurrency: None,
            failure_mode: FailureMode::Closed,
            enabled: true,
            shadow_mode: false,
            detailed_metric: true,
            name: Some("n".into()),
            replaces: vec!["m".into()],
            max_settle_overage_ppm: 7,
        };
        let bytes = encode("limits", &vec![old]).expect("encodes");
        let read: Vec<LimitSpec> = decode("limits", &bytes).expect("the old layout reads");
        let mut want = LimitSpec::simple("api/tenant", 100, Duration::from_secs(60));
        want.partition_policy = PartitionPolicy::Closed;
        want.failure_mode = FailureMode::Closed;
        want.detailed_metric = true;
        want.name = Some("n".into());
        want.replaces = vec!["m".into()];
        want.max_settle_overage_ppm = 7;
        assert_eq!(read, vec![want.clone()]);
        assert_eq!(
            encode("limits", &vec![want.clone()]).expect("encodes"),
            bytes,
            "a limit without an RLQS fallback allowance keeps the old layout (D69)"
        );
        // A sliding limit goes through the same layout and comes back sliding.
        let sliding = LimitSpec {
            algorithm: Algorithm::SlidingWindow,
            ..want
        };
        let bytes = encode("limits", &vec![sliding.clone(), sliding.clone()]).expect("encodes");
        let read: Vec<LimitSpec> = decode("limits", &bytes).expect("reads");
        assert_eq!(read, vec![sliding.clone(), sliding.clone()]);
        // An RLQS fallback allowance (D69) comes back with its algorithm.
        let with_fallback = LimitSpec {
            rlqs_fallback_units: 12,
            ..sliding
        };
        let bytes = encode("limits", &vec![with_fallback.clone()]).expect("encodes");
        let read: Vec<LimitSpec> = decode("limits", &bytes).expect("reads");
        assert_eq!(read, vec![with_fallback]);
    }
}
