//! How records are laid out in the log and in the tree: postcard (compact, no field names)
//! behind a format byte. JSON, which earlier versions of the store wrote, always starts with
//! `[`, `{` or `"` and never with a format byte, so a store written by them still reads.

use allot_core::budget::PersistRecord;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::error::{Error, Result};

/// The first byte of every encoding written now.
const POSTCARD_V1: u8 = 0x01;

/// Appends the encoding of one batch of records to `out`.
pub(crate) fn encode_batch_into(out: Vec<u8>, batch: &[PersistRecord]) -> Result<Vec<u8>> {
    encode_into(out, batch, "batch")
}

pub(crate) fn decode_batch(bytes: &[u8]) -> Result<Vec<PersistRecord>> {
    decode(bytes, "batch")
}

pub(crate) fn encode_record(record: &PersistRecord) -> Result<Vec<u8>> {
    encode_into(Vec::new(), record, "record")
}

pub(crate) fn decode_record(bytes: &[u8]) -> Result<PersistRecord> {
    decode(bytes, "record")
}

fn encode_into<T: Serialize + ?Sized>(mut out: Vec<u8>, value: &T, what: &str) -> Result<Vec<u8>> {
    out.push(POSTCARD_V1);
    postcard::to_extend(value, out)
        .map_err(|e| Error::Corrupt(format!("cannot encode {what}: {e}")))
}

fn decode<T: DeserializeOwned>(bytes: &[u8], what: &str) -> Result<T> {
    match bytes.first() {
        Some(&POSTCARD_V1) => postcard::from_bytes(&bytes[1..])
            .map_err(|e| Error::Corrupt(format!("undecodable {what}: {e}"))),
        Some(b'[' | b'{' | b'"') => serde_json::from_slice(bytes)
            .map_err(|e| Error::Corrupt(format!("undecodable {what} (JSON): {e}"))),
        Some(other) => Err(Error::Corrupt(format!(
            "{what} in an unknown format (first byte {other:#04x})"
        ))),
        None => Err(Error::Corrupt(format!("empty {what}"))),
    }
}

#[cfg(test)]
mod tests {
    use allot_core::budget::persist::MetaRecord;
    use allot_core::ids::LeaseId;

    use super::*;

    fn records() -> Vec<PersistRecord> {
        vec![
            PersistRecord::Reset,
            PersistRecord::Meta(MetaRecord {
                next_lease_id: 7,
                next_slot_id: 3,
                next_seq: 1 << 40,
            }),
            PersistRecord::LeaseEnded { lease: LeaseId(9) },
        ]
    }

    #[test]
    fn batches_and_records_read_back_as_written() {
        let batch = records();
        let bytes = encode_batch_into(Vec::new(), &batch).expect("encoded");
        assert_eq!(decode_batch(&bytes).expect("decoded"), batch);
        for r in &batch {
            assert_eq!(
                &decode_record(&encode_record(r).expect("encoded")).expect("decoded"),
                r
            );
        }
    }

    #[test]
    fn what_earlier_versions_wrote_in_json_still_reads() {
        let batch = records();
        let json = serde_json::to_vec(&batch).expect("json");
        assert_eq!(decode_batch(&json).expect("decoded"), batch);
        for r in &batch {
            let json = serde_json::to_vec(r).expect("json");
            assert_eq!(&decode_record(&json).expect("decoded"), r);
        }
    }

    #[test]
    fn unknown_and_damaged_encodings_are_errors_not_panics() {
        assert!(matches!(decode_record(&[]), Err(Error::Corrupt(_))));
        assert!(matches!(
            decode_record(&[0x7f, 1, 2]),
            Err(Error::Corrupt(_))
        ));
        let mut bytes = encode_record(&records()[1]).expect("encoded");
        bytes.truncate(bytes.len() - 1);
        assert!(matches!(decode_record(&bytes), Err(Error::Corrupt(_))));
    }
}
