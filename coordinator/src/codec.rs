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
