//! How records are laid out in the log and in the tree: postcard (compact, no field names)
//! behind a format byte. JSON, which earlier versions of the store wrote, always starts with
//! `[`, `{` or `"` and never with a format byte, so a store written by them still reads (a
//! field added since reads as its default). Postcard has no defaults: a record whose layout
//! changed gets a new format byte, and the older layouts read through mirrors (`legacy`).

use allot_core::budget::PersistRecord;
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::legacy::RecordV1;
use crate::error::{Error, Result};

/// The first postcard layout: key records without their excess units.
const POSTCARD_V1: u8 = 0x01;

/// The second: key records with their excess units.
const POSTCARD_V2: u8 = 0x02;

/// The first byte of every encoding written now: the second layout and the `Allocation`
/// record, a new last variant. Records of the second layout are records of this one that
/// never name it, so both read through today's types. Later records were added the same way,
/// as new last variants (`RestoredBefore`, `ClockCorrection`, the fingerprinted
/// `Idempotency`, whose older form keeps its place as `IdempotencyUnfingerprinted`,
/// `KeyCarried`, `StatsUncharged`, `RestoreAwaiting`, `ConfigVersion` and `Boot`): a store
/// written before them reads unchanged; one written since does not read in a version
/// before them (an unknown variant is `Corrupt`, the start refuses rather than guesses).
const POSTCARD_V3: u8 = 0x03;

/// Appends the encoding of one batch of records to `out`.
pub(crate) fn encode_batch_into(out: Vec<u8>, batch: &[PersistRecord]) -> Result<Vec<u8>> {
    encode_into(out, batch, "batch")
}

pub(crate) fn decode_batch(bytes: &[u8]) -> Result<Vec<PersistRecord>> {
    if bytes.first() == Some(&POSTCARD_V1) {
        let old: Vec<RecordV1> = decode_postcard(&bytes[1..], "batch")?;
        return Ok(old.into_iter().map(PersistRecord::from).collect());
    }
    decode(bytes, "batch")
}

pub(crate) fn encode_record(record: &PersistRecord) -> Result<Vec<u8>> {
    encode_into(Vec::new(), record, "record")
}

pub(crate) fn decode_record(bytes: &[u8]) -> Result<PersistRecord> {
    if bytes.first() == Some(&POSTCARD_V1) {
        let old: RecordV1 = decode_postcard(&bytes[1..], "record")?;
        return Ok(old.into());
    }
    decode(bytes, "record")
}

fn encode_into<T: Serialize + ?Sized>(mut out: Vec<u8>, value: &T, what: &str) -> Result<Vec<u8>> {
    out.push(POSTCARD_V3);
    postcard::to_extend(value, out)
        .map_err(|e| Error::Corrupt(format!("cannot encode {what}: {e}")))
}

fn decode<T: DeserializeOwned>(bytes: &[u8], what: &str) -> Result<T> {
    match bytes.first() {
        Some(&(POSTCARD_V2 | POSTCARD_V3)) => decode_postcard(&bytes[1..], what),
        Some(b'[' | b'{' | b'"') => serde_json::from_slice(bytes)
            .map_err(|e| Error::Corrupt(format!("undecodable {what} (JSON): {e}"))),
        Some(other) => Err(Error::Corrupt(format!(
            "{what} in an unknown format (first byte {other:#04x})"
        ))),
        None => Err(Error::Corrupt(format!("empty {what}"))),
    }
}

fn decode_postcard<T: DeserializeOwned>(bytes: &[u8], what: &str) -> Result<T> {
    postcard::from_bytes(bytes).map_err(|e| Error::Corrupt(format!("undecodable {what}: {e}")))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use allot_core::budget::persist::{AllocationRecord, MetaRecord};
    use allot_core::ids::LeaseId;
    use allot_core::limit::LimitSpec;

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
            PersistRecord::Allocation(AllocationRecord::of(&LimitSpec::simple(
                "api",
                100,
                Duration::from_secs(60),
            ))),
        ]
    }

    #[test]
    fn a_store_written_before_limits_kept_their_allocation_still_reads() {
        // The second layout is the third without its last variant: same bytes, older byte.
        let batch = records()[..3].to_vec();
        let mut bytes = encode_batch_into(Vec::new(), &batch).expect("encoded");
        assert_eq!(bytes[0], POSTCARD_V3);
        bytes[0] = POSTCARD_V2;
        assert_eq!(decode_batch(&bytes).expect("decoded"), batch);
        let mut record = encode_record(&batch[1]).expect("encoded");
        record[0] = POSTCARD_V2;
        assert_eq!(decode_record(&record).expect("decoded"), batch[1]);
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

    /// A key record as the first postcard layout wrote it: today's encoding without the two
    /// excess fields it ends with (both 0 here, one byte each).
    fn key_record_v1_bytes(record: &PersistRecord) -> Vec<u8> {
        let mut bytes = encode_record(record).expect("encoded");
        assert_eq!(bytes.split_off(bytes.len() - 2), vec![0, 0]);
        bytes.remove(0);
        bytes
    }

    #[test]
    fn a_store_written_before_keys_kept_their_excess_still_reads() {
        use allot_core::budget::persist::KeyRecord;
        use allot_core::ids::{KeyId, LimitId};
        use allot_core::time::WindowIndex;
        let key = PersistRecord::Key(KeyRecord {
            limit: LimitId::from("api"),
            key: KeyId::from("t=1"),
            window: WindowIndex(7),
            granted_units: 130,
            refunded_units: 20,
            allowances: Vec::new(),
            rate_tat: None,
            open_rate_tat: None,
            excess_units: 0,
            fail_open_units: 0,
        });
        let mut record = vec![POSTCARD_V1];
        record.extend(key_record_v1_bytes(&key));
        assert_eq!(decode_record(&record).expect("decoded"), key);
        // A batch: its length, then each record in the old layout.
        let meta = records().remove(1);
        let mut batch = vec![POSTCARD_V1, 2];
        batch.extend(key_record_v1_bytes(&key));
        batch.extend(&encode_record(&meta).expect("encoded")[1..]);
        assert_eq!(
            decode_batch(&batch).expect("decoded"),
            vec![key.clone(), meta]
        );
        // And in JSON, the missing fields take their defaults.
        let mut json = serde_json::to_value(&key).expect("json");
        let fields = json["Key"].as_object_mut().expect("a key record");
        fields.remove("excess_units");
        fields.remove("fail_open_units");
        let json = serde_json::to_vec(&json).expect("json");
        assert_eq!(decode_record(&json).expect("decoded"), key);
    }

    /// Idempotency entries written before they kept their request's fingerprint: variant 11
    /// of the layout, then the entry. They read back unchanged (as the unfingerprinted kind),
    /// in postcard and in JSON; entries written now carry the fingerprint and read back too.
    #[test]
    fn idempotency_entries_from_before_fingerprints_still_read() {
        use allot_core::budget::persist::{IdempotencyRecord, UnfingerprintedIdempotencyRecord};
        use allot_core::budget::{Outcome, ReleaseOutcome, RequestFingerprint};
        use allot_core::ids::RequestId;
        use allot_core::time::Timestamp;
        let old = UnfingerprintedIdempotencyRecord {
            request: RequestId(7),
            expires_at: Timestamp::from_unix_millis(1_700_000_300_000),
            outcome: Outcome::Release(ReleaseOutcome { refunded_units: 3 }),
        };
        const OLD_IDEMPOTENCY_VARIANT: u8 = 11;
        let mut bytes = vec![POSTCARD_V3, OLD_IDEMPOTENCY_VARIANT];
        bytes.extend(postcard::to_allocvec(&old).expect("encoded"));
        let read = PersistRecord::IdempotencyUnfingerprinted(old.clone());
        assert_eq!(decode_record(&bytes).expect("decoded"), read);
        bytes[0] = POSTCARD_V2;
        assert_eq!(decode_record(&bytes).expect("decoded"), read);
        let json = serde_json::json!({ "Idempotency": old });
        let json = serde_json::to_vec(&json).expect("json");
        assert_eq!(decode_record(&json).expect("decoded"), read);
        assert_eq!(
            encode_record(&read).expect("encoded")[1],
            OLD_IDEMPOTENCY_VARIANT
        );

        let new = PersistRecord::Idempotency(IdempotencyRecord {
            request: old.request,
            expires_at: old.expires_at,
            outcome: old.outcome,
            fingerprint: RequestFingerprint(0xfeed),
        });
        let bytes = encode_record(&new).expect("encoded");
        assert_eq!(decode_record(&bytes).expect("decoded"), new);
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
