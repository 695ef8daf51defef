//! How stored records and raft messages are encoded: a format byte, then postcard.
//!
//! Postcard keeps no field names, so a change to a stored type changes its layout; the format
//! byte lets a later layout be told from this one and the old one still be read (as the
//! agent's store does, docs/decisions.md D18).

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::error::{Error, Result};

/// The layout written today.
pub const FORMAT_V1: u8 = 0x01;

pub fn encode<T: Serialize>(what: &'static str, value: &T) -> Result<Vec<u8>> {
    let mut out = vec![FORMAT_V1];
    postcard::to_io(value, &mut out).map_err(|e| Error::Encode {
        what,
        detail: e.to_string(),
    })?;
    Ok(out)
}

/// Decodes a record written by [`encode`]; anything else is [`Error::Corrupt`].
pub fn decode<T: DeserializeOwned>(what: &'static str, bytes: &[u8]) -> Result<T> {
    match bytes.split_first() {
        Some((&FORMAT_V1, body)) => {
            let (value, rest) =
                postcard::take_from_bytes(body).map_err(|e| Error::corrupt(what, e))?;
            if !rest.is_empty() {
                return Err(Error::corrupt(
                    what,
                    format!("{} bytes after the record", rest.len()),
                ));
            }
            Ok(value)
        }
        Some((format, _)) => Err(Error::corrupt(
            what,
            format!("unknown format byte {format:#04x}"),
        )),
        None => Err(Error::corrupt(what, "empty record")),
    }
}
