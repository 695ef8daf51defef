use proptest::collection::vec;
use proptest::option;
use proptest::prelude::*;

use super::*;

/// Items per generated list: enough to mix kinds, small enough to run many cases.
const LIST_ITEMS: usize = 6;

fn name() -> impl Strategy<Value = String> {
    "[a-z][a-z0-9_=/.-]{0,12}"
}

fn counter() -> impl Strategy<Value = CounterRef> {
    (name(), "[a-z0-9=/]{0,8}", any::<u64>()).prop_map(|(l, k, w)| CounterRef {
        limit: LimitId::new(l),
        key: KeyId::new(k),
        window: WindowIndex(w),
    })
}

fn entry() -> impl Strategy<Value = CounterEntry> {
    (counter(), name(), any::<u64>(), any::<u64>()).prop_map(|(counter, r, g, f)| CounterEntry {
        counter,
        region: RegionId::new(r),
        granted_units: g,
        refunded_units: f,
    })
}

fn demand() -> impl Strategy<Value = DemandReport> {
    (counter(), any::<u64>(), any::<u64>()).prop_map(|(counter, d, a)| DemandReport {
        counter,
        demand_micro_units_per_sec: d,
        allowance_units: a,
    })
}

fn ack() -> impl Strategy<Value = ReleaseAck> {
    (any::<u64>(), counter(), any::<u64>(), any::<u64>()).prop_map(|(id, counter, r, a)| {
        ReleaseAck {
            id,
            counter,
            released_units: r,
            allowance_after_units: a,
        }
    })
}

fn stats() -> impl Strategy<Value = LimitWindowStats> {
    let figures = (
        any::<u64>(),
        0..NANOS_PER_SEC,
        any::<u64>(),
        any::<u64>(),
        any::<u64>(),
        any::<u64>(),
        any::<u64>(),
    )
        .prop_map(|(s, n, f, o, p, c, u)| BoundFigures {
            time_open: Duration::new(s, n),
            fail_open_units: f,
            settle_overage_units: o,
            peak_grant_units_per_sec: p,
            settle_clamped_units: c,
            uncharged_units: u,
        });
    (name(), any::<u64>(), figures).prop_map(|(l, w, figures)| LimitWindowStats {
        limit: LimitId::new(l),
        window: WindowIndex(w),
        figures,
    })
}

fn grant() -> impl Strategy<Value = AllowanceGrant> {
    (counter(), name(), any::<u64>(), any::<u64>()).prop_map(|(counter, r, a, e)| AllowanceGrant {
        counter,
        region: RegionId::new(r),
        allowance_units: a,
        epoch: Epoch(e),
    })
}

fn release() -> impl Strategy<Value = ReleaseRequest> {
    (any::<u64>(), counter(), any::<u64>(), any::<u64>()).prop_map(|(id, counter, u, e)| {
        ReleaseRequest {
            id,
            counter,
            units: u,
            epoch: Epoch(e),
        }
    })
}

fn sync_up() -> impl Strategy<Value = SyncUp> {
    let head = (
        name(),
        any::<u64>(),
        any::<u64>(),
        any::<u64>(),
        any::<u64>(),
    );
    let clock = option::of((any::<i64>(), any::<u64>()).prop_map(|(o, r)| ClockSample {
        offset_nanos: o,
        round_trip_nanos: r,
    }));
    let lists = (
        vec(entry(), 0..LIST_ITEMS),
        vec(demand(), 0..LIST_ITEMS),
        vec(ack(), 0..LIST_ITEMS),
        vec(stats(), 0..LIST_ITEMS),
    );
    let guard = option::of((any::<u64>(), any::<u64>()).prop_map(|(s, u)| ClockGuard {
        since: Timestamp::from_unix_nanos(s),
        max_uncertainty: Duration::from_nanos(u),
    }));
    let clock = (clock, any::<u64>());
    (head, clock, lists, (any::<bool>(), any::<bool>()), guard).prop_map(
        |(
            (r, boot, seq, t0, v),
            (clock, clock_leader_term),
            (entries, demand, release_acks, stats),
            (view_expired, restored),
            clock_guard,
        )| {
            SyncUp {
                region: RegionId::new(r),
                boot,
                seq,
                sent_at: Timestamp::from_unix_nanos(t0),
                config_version: v,
                entries,
                demand,
                release_acks,
                clock,
                clock_leader_term,
                stats,
                view_expired,
                restored,
                clock_guard,
            }
        },
    )
}

fn sync_down() -> impl Strategy<Value = SyncDown> {
    let head = (
        any::<u64>(),
        any::<u64>(),
        any::<u64>(),
        any::<u64>(),
        any::<u64>(),
    );
    let lists = (
        vec(entry(), 0..LIST_ITEMS),
        vec(grant(), 0..LIST_ITEMS),
        vec(release(), 0..LIST_ITEMS),
    );
    let flags = (any::<bool>(), any::<bool>());
    let reach = option::of(any::<u64>().prop_map(Timestamp::from_unix_nanos));
    (head, lists, flags, option::of(config_files()), reach).prop_map(
        |(
            (seq, term, t1, t2, v),
            (entries, grants, release_requests),
            (known_region, below_default_left),
            config,
            earlier_boot_clock_reach,
        )| {
            SyncDown {
                reply_to_seq: seq,
                leader_term: term,
                received_at: Timestamp::from_unix_nanos(t1),
                sent_at: Timestamp::from_unix_nanos(t2),
                config_version: v,
                entries,
                grants,
                release_requests,
                known_region,
                config,
                below_default_left,
                earlier_boot_clock_reach,
            }
        },
    )
}

/// Any configuration the wire accepts: its texts are not YAML, which the receiver's loader
/// (not the conversion) refuses.
fn config_files() -> impl Strategy<Value = ConfigFiles> {
    let file = (name(), ".{0,40}").prop_map(|(name, text)| ConfigFile { name, text });
    (1..u64::MAX, any::<bool>(), vec(file, 1..4)).prop_map(|(version, merge_domains, files)| {
        ConfigFiles {
            version,
            merge_domains,
            files,
        }
    })
}

proptest! {
    #[test]
    fn sync_up_round_trips(up in sync_up()) {
        let wire = sync_up_to_wire(up.clone());
        // Through the encoded bytes too: what a peer really receives.
        let bytes = prost::Message::encode_to_vec(&wire);
        let decoded: pb::SyncUp = prost::Message::decode(bytes.as_slice()).expect("decodes");
        prop_assert_eq!(sync_up_from_wire(decoded), Ok(up));
    }

    #[test]
    fn sync_down_round_trips(down in sync_down()) {
        let wire = sync_down_to_wire(down.clone());
        let bytes = prost::Message::encode_to_vec(&wire);
        let decoded: pb::SyncDown = prost::Message::decode(bytes.as_slice()).expect("decodes");
        prop_assert_eq!(sync_down_from_wire(decoded), Ok(down));
    }

    /// The byte helpers are the same encoding: a SyncUp through them comes back whole.
    #[test]
    fn sync_up_bytes_round_trip(up in sync_up()) {
        let bytes = encode_sync_up(up.clone());
        prop_assert_eq!(decode_sync_up(&bytes), Ok(up));
    }

    /// And a SyncDown.
    #[test]
    fn sync_down_bytes_round_trip(down in sync_down()) {
        let bytes = encode_sync_down(down.clone());
        prop_assert_eq!(decode_sync_down(&bytes), Ok(down));
    }

    /// Any bytes at all: decoding may fail, converting may fail, neither panics.
    #[test]
    fn garbage_never_panics(bytes in vec(any::<u8>(), 0..256)) {
        if let Ok(up) = <pb::SyncUp as prost::Message>::decode(bytes.as_slice()) {
            let _ = sync_up_from_wire(up);
        }
        if let Ok(down) = <pb::SyncDown as prost::Message>::decode(bytes.as_slice()) {
            let _ = sync_down_from_wire(down);
        }
        let _ = decode_sync_up(&bytes);
        let _ = decode_sync_down(&bytes);
    }
}

fn wire_counter() -> Option<pb::CounterRef> {
    Some(pb::CounterRef {
        limit: "api/t".to_owned(),
        key: "t=1".to_owned(),
        window: 7,
    })
}

fn wire_entry() -> pb::CounterEntry {
    pb::CounterEntry {
        counter: wire_counter(),
        region: "eu".to_owned(),
        granted_units: 3,
        refunded_units: 1,
    }
}

fn wire_up() -> pb::SyncUp {
    pb::SyncUp {
        region: "eu".to_owned(),
        entries: vec![wire_entry(), wire_entry()],
        ..pb::SyncUp::default()
    }
}

#[test]
fn a_missing_counter_is_named() {
    let mut up = wire_up();
    up.entries[1].counter = None;
    assert_eq!(
        sync_up_from_wire(up),
        Err(WireError::Missing("entries[1].counter".to_owned()))
    );
}

#[test]
fn empty_names_are_refused() {
    let mut up = wire_up();
    up.region.clear();
    assert!(matches!(
        sync_up_from_wire(up),
        Err(WireError::OutOfRange { field, .. }) if field == "region"
    ));
    let mut up = wire_up();
    if let Some(c) = up.entries[0].counter.as_mut() {
        c.limit.clear();
    }
    let err = sync_up_from_wire(up).expect_err("refused").to_string();
    assert_eq!(err, "entries[0].counter.limit: must not be empty");
    let down = pb::SyncDown {
        grants: vec![pb::AllowanceGrant {
            counter: wire_counter(),
            ..pb::AllowanceGrant::default()
        }],
        ..pb::SyncDown::default()
    };
    let err = sync_down_from_wire(down).expect_err("refused").to_string();
    assert_eq!(err, "grants[0].region: must not be empty");
}

#[test]
fn out_of_range_values_are_refused() {
    let mut up = wire_up();
    up.stats = vec![pb::LimitWindowStats {
        limit: "api/t".to_owned(),
        window: 1,
        figures: Some(pb::BoundFigures {
            time_open_subsec_nanos: NANOS_PER_SEC,
            ..pb::BoundFigures::default()
        }),
    }];
    let err = sync_up_from_wire(up).expect_err("refused").to_string();
    assert_eq!(
        err,
        "stats[0].figures.time_open_subsec_nanos: 1000000000 is not below one second"
    );
    let mut up = wire_up();
    up.stats = vec![pb::LimitWindowStats {
        limit: "api/t".to_owned(),
        window: 1,
        figures: None,
    }];
    assert_eq!(
        sync_up_from_wire(up),
        Err(WireError::Missing("stats[0].figures".to_owned()))
    );
    let mut up = wire_up();
    up.entries = vec![wire_entry(); MAX_ITEMS_PER_MESSAGE + 1];
    let err = sync_up_from_wire(up).expect_err("refused").to_string();
    assert!(err.starts_with("entries: 4097 items"), "{err}");
}

fn wire_config() -> pb::ConfigFiles {
    pb::ConfigFiles {
        version: 2,
        merge_domains: false,
        files: vec![pb::ConfigFile {
            name: "limits.yaml".to_owned(),
            text: "domain: d\n".to_owned(),
        }],
    }
}

fn down_with(config: pb::ConfigFiles) -> Result<SyncDown> {
    sync_down_from_wire(pb::SyncDown {
        config: Some(config),
        ..pb::SyncDown::default()
    })
}

#[test]
fn a_configuration_outside_its_bounds_is_refused_and_named() {
    let down = down_with(wire_config()).expect("converts");
    assert_eq!(down.config.map(|c| c.version), Some(2));
    let mut c = wire_config();
    c.version = 0;
    let err = down_with(c).expect_err("refused").to_string();
    assert_eq!(err, "config.version: must be above 0");
    let mut c = wire_config();
    c.files.clear();
    let err = down_with(c).expect_err("refused").to_string();
    assert_eq!(err, "config.files: a configuration needs at least one file");
    let mut c = wire_config();
    c.files[0].name.clear();
    let err = down_with(c).expect_err("refused").to_string();
    assert_eq!(err, "config.files: file 0 has no name");
    let mut c = wire_config();
    c.files[0].text = "#".repeat(allot_core::sync::MAX_CONFIG_BYTES);
    let err = down_with(c).expect_err("refused").to_string();
    assert!(
        err.starts_with("config.files: 196619 bytes of limits text"),
        "{err}"
    );
    let mut c = wire_config();
    c.files = vec![c.files[0].clone(); allot_core::sync::MAX_CONFIG_FILES + 1];
    let err = down_with(c).expect_err("refused").to_string();
    assert_eq!(err, "config.files: 65 files, above the most, 64");
}

#[test]
fn bytes_that_are_no_message_are_refused_as_malformed() {
    // A field tag with wire type 7, which protobuf does not have.
    let got = decode_sync_up(&[0x0f]);
    assert!(matches!(got, Err(WireError::Malformed(_))), "{got:?}");
}
