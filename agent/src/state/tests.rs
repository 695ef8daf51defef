use std::path::PathBuf;
use std::time::Duration;

use allot_core::ids::RegionId;
use allot_core::sync::ConfigFiles;

use super::*;
use crate::clock::Clock;
use crate::limits::Source;
use crate::request::RlsDescriptor;
use crate::store::MemoryStore;

fn agent(seed: u64) -> Agent {
    let mut s = Settings::new(RegionId::from("r"), PathBuf::from("unused"));
    s.jitter_seed = Some(seed);
    Agent::open(s, Arc::new(MemoryStore::new())).expect("agent")
}

#[test]
fn retry_after_is_rounded_up_then_stretched_by_at_most_a_tenth() {
    let a = agent(7);
    // 41.2 s rounds up to 42; a tenth of 42 rounds up to 5: 42 ..= 47.
    let draws: Vec<u64> = (0..200)
        .map(|_| a.retry_after_secs(Duration::from_millis(41_200)))
        .collect();
    assert!(draws.iter().all(|s| (42..=47).contains(s)), "{draws:?}");
    assert!(
        draws.iter().any(|s| *s != draws[0]),
        "jitter spreads clients out"
    );
    // Under a second still waits a second, and may wait one more.
    let short = a.retry_after_secs(Duration::from_millis(10));
    assert!((1..=2).contains(&short));
}

/// A day window refused at any time of day says to come back after the next UTC
/// midnight, and at most [`RETRY_AFTER_JITTER_MAX_SECS`] later: the clock is the test's,
/// so every time of day is tried whenever the test runs (00:40 UTC once gave 88,628 s).
#[tokio::test]
async fn a_day_windows_retry_after_is_the_next_midnight_at_any_time_of_day() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("day.yaml");
    std::fs::write(
        &file,
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: day\n      requests_per_unit: 3\n",
    )
    .expect("limits file");
    let day_start_secs = 1_767_225_600; // 2026-01-01T00:00:00Z
    for second_of_day in [1, 59, 2_400, 7_199, 43_200, 86_340, 86_399] {
        let (clock, _) = Clock::manual(Timestamp::from_unix_nanos(
            (day_start_secs + second_of_day) * 1_000_000_000,
        ));
        let mut s = Settings::new(RegionId::from("r"), PathBuf::from("unused"));
        s.config_files = vec![file.clone()];
        s.jitter_seed = Some(second_of_day);
        s.clock = clock;
        let a = Agent::open(s, Arc::new(MemoryStore::new())).expect("agent");
        let ask = [RlsDescriptor {
            entries: vec![("k".into(), "v".into())],
            hits: 4,
        }];
        let checked = a.should_rate_limit("d", &ask).await.expect("check");
        assert!(!checked[0].allowed(), "4 hits against 3 a day are refused");
        let until_midnight = 86_400 - second_of_day;
        for _ in 0..50 {
            let headers = crate::service::headers::rate_limit_headers(&checked, true, |w| {
                a.retry_after_secs(w)
            });
            let retry_after: u64 = headers
                .iter()
                .find(|(name, _)| *name == "Retry-After")
                .and_then(|(_, v)| v.parse().ok())
                .expect("a refusal carries Retry-After");
            assert!(
                (until_midnight..=until_midnight + RETRY_AFTER_JITTER_MAX_SECS)
                    .contains(&retry_after),
                "at second {second_of_day} of the day: Retry-After {retry_after}, \
                 midnight in {until_midnight}"
            );
        }
    }
}

/// Whether 3 hits on `d`/`k=v` are admitted.
async fn allowed(a: &Agent) -> bool {
    let hit = [RlsDescriptor {
        entries: vec![("k".into(), "v".into())],
        hits: 3,
    }];
    a.should_rate_limit("d", &hit).await.expect("check")[0].allowed()
}

/// Region `r`'s settings with one rule, `d`/`k`: 3 a minute (its limits file in `dir`).
fn three_a_minute(dir: &std::path::Path) -> Settings {
    let file = dir.join("limits.yaml");
    std::fs::write(
        &file,
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: minute\n      requests_per_unit: 3\n",
    )
    .expect("limits file");
    let mut s = Settings::new(RegionId::from("r"), PathBuf::from("unused"));
    s.config_files = vec![file];
    s
}

/// Second `s` of minute `m` of 2026.
fn minute(m: u64, s: u64) -> Timestamp {
    Timestamp::from_unix_nanos((1_767_225_600 + m * 60 + s) * 1_000_000_000)
}

/// A wall clock stepped back (an NTP step, a VM resumed from a snapshot) into a window the
/// agent had left: the agent's reading holds where the clock stood until the clock catches up,
/// and admits nothing of the old window again (the key's counter stays in the later one).
#[tokio::test]
async fn a_clock_stepped_back_into_a_window_admits_nothing_again() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut s = three_a_minute(dir.path());
    let (clock, cell) = Clock::manual(minute(0, 10));
    s.clock = clock;
    let a = Agent::open(s, Arc::new(MemoryStore::new())).expect("agent");
    assert!(allowed(&a).await, "minute 0: 3 of 3");
    cell.store(minute(1, 5).as_unix_nanos(), Ordering::Relaxed);
    assert!(allowed(&a).await, "minute 1: 3 of 3");
    // Back 30 s, into minute 0: the reading stays in minute 1, whose 3 are spent.
    cell.store(minute(0, 35).as_unix_nanos(), Ordering::Relaxed);
    assert!(
        !allowed(&a).await,
        "a clock stepped back admits minute 0 again"
    );
    assert_eq!(a.now(), minute(1, 5), "held where the clock stood");
    // Once the clock is past where it stood it reads on, and minute 2 is fresh.
    cell.store(minute(2, 1).as_unix_nanos(), Ordering::Relaxed);
    assert!(allowed(&a).await, "minute 2: 3 of 3");
}

/// The same across a restart: a clock stepped back while the agent was down reads on from
/// the latest time the store was written at, not from where the clock now stands.
#[tokio::test]
async fn a_restart_on_a_clock_stepped_back_reads_on_from_the_store() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut s = three_a_minute(dir.path());
    let (clock, cell) = Clock::manual(minute(0, 10));
    s.clock = clock;
    let store = Arc::new(MemoryStore::new());
    let a = Agent::open(s.clone(), store.clone()).expect("agent");
    assert!(allowed(&a).await, "minute 0: 3 of 3");
    cell.store(minute(1, 5).as_unix_nanos(), Ordering::Relaxed);
    assert!(allowed(&a).await, "minute 1: 3 of 3");
    drop(a);
    // Down, and the clock stepped back 30 s meanwhile, into minute 0.
    cell.store(minute(0, 35).as_unix_nanos(), Ordering::Relaxed);
    let again = Agent::open(s, store).expect("restarted");
    assert_eq!(again.now(), minute(1, 5), "held at the store's time");
    assert!(!allowed(&again).await, "minute 1's 3 are spent");
    cell.store(minute(2, 1).as_unix_nanos(), Ordering::Relaxed);
    assert!(allowed(&again).await, "minute 2: 3 of 3");
}

/// The agent counts time from its start (D73): a wall clock that steps since is published and
/// logged, not followed. Here the agent's own clock started 10 s behind the wall clock.
#[tokio::test]
async fn how_far_the_wall_clock_stepped_since_the_start_is_published() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut s = three_a_minute(dir.path());
    s.clock = Clock::SinceStart {
        wall: crate::clock::now() - Duration::from_secs(10),
        boot_nanos: crate::clock::since_boot_nanos(),
    };
    let a = Agent::open(s.clone(), Arc::new(MemoryStore::new())).expect("agent");
    let apart = a.note_wall_clock().expect("counted from its start");
    assert!((9.0..11.0).contains(&apart), "{apart}");
    assert!(a.on_timer().await.is_ok());
    // A test's manual clock is its owner's: nothing to compare.
    let (manual, _) = Clock::manual(Timestamp::from_unix_nanos(1_767_225_600_000_000_000));
    s.clock = manual;
    let m = Agent::open(s, Arc::new(MemoryStore::new())).expect("agent");
    assert_eq!(m.note_wall_clock(), None);
}

/// A coordinated agent's default shares were computed over the regions named at start:
/// a reload naming others would split quotas differently from the coordinator's table.
#[tokio::test]
async fn a_coordinated_reload_that_renames_the_regions_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("limits.yaml");
    let limits = |weights: &str| {
        format!(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {{unit: day, requests_per_unit: 10}}\n    allot: {{weights: {weights}}}\n"
        )
    };
    std::fs::write(&file, limits("{r: 0.5, s: 0.5}")).expect("limits file");
    let mut s = Settings::new(RegionId::from("r"), PathBuf::from("unused"));
    s.config_files = vec![file.clone()];
    s.coordinators = vec!["127.0.0.1:7000".into()];
    let a = Agent::open(s, Arc::new(MemoryStore::new())).expect("agent");
    std::fs::write(&file, limits("{r: 0.6, s: 0.4}")).expect("limits file");
    assert!(a.reload("test").await, "same regions, other weights");
    assert_eq!(a.limits().version, 2);
    std::fs::write(&file, limits("{r: 0.5, t: 0.5}")).expect("limits file");
    assert!(!a.reload("test").await, "other regions");
    assert_eq!(a.limits().version, 2);
}

/// The cluster's configuration replaces the agent's files (its version, not a load
/// count), is kept for the next start, and stops local reloads; an older version, or one
/// naming other regions, changes nothing.
#[tokio::test]
async fn the_clusters_configuration_wins_is_kept_and_stops_local_reloads() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("limits.yaml");
    let limits = |quota: u64, weights: &str| {
        format!(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {{unit: day, requests_per_unit: {quota}}}\n    allot: {{weights: {weights}}}\n"
        )
    };
    let cluster = |version: u64, text: String| ConfigFiles {
        version,
        merge_domains: false,
        files: vec![allot_core::sync::ConfigFile {
            name: "cluster.yaml".into(),
            text,
        }],
    };
    std::fs::write(&file, limits(10, "{r: 0.5, s: 0.5}")).expect("limits file");
    let mut s = Settings::new(RegionId::from("r"), dir.path().to_path_buf());
    s.config_files = vec![file.clone()];
    s.coordinators = vec!["127.0.0.1:7000".into()];
    let a = Agent::open(s.clone(), Arc::new(MemoryStore::new())).expect("agent");
    assert_eq!(a.limits().source, Source::Files);
    assert!(
        a.take_cluster_config(cluster(3, limits(40, "{r: 0.5, s: 0.5}")))
            .await
    );
    let l = a.limits();
    assert_eq!((l.version, l.source), (3, Source::Cluster));
    let rule = l.rules().next().expect("a rule");
    assert_eq!(rule.quota_units, 40);
    assert_eq!(a.lock().config_version(), 3);
    // Older or the same: nothing. Other regions: refused.
    assert!(
        !a.take_cluster_config(cluster(2, limits(5, "{r: 0.5, s: 0.5}")))
            .await
    );
    assert!(
        !a.take_cluster_config(cluster(3, limits(5, "{r: 0.5, s: 0.5}")))
            .await
    );
    assert!(
        !a.take_cluster_config(cluster(4, limits(5, "{r: 0.5, t: 0.5}")))
            .await
    );
    assert_eq!(a.limits().version, 3);
    // The local files no longer reload.
    assert!(!a.reload("test").await);
    assert_eq!(a.limits().version, 3);
    drop(a);
    // A restart starts from the kept cluster configuration, not the files.
    let a = Agent::open(s, Arc::new(MemoryStore::new())).expect("agent");
    let l = a.limits();
    assert_eq!((l.version, l.source), (3, Source::Cluster));
    assert_eq!(l.rules().next().map(|r| r.quota_units), Some(40));
}

#[test]
fn the_same_seed_gives_the_same_jitter() {
    let (a, b) = (agent(3), agent(3));
    let wait = Duration::from_secs(100);
    let da: Vec<u64> = (0..20).map(|_| a.retry_after_secs(wait)).collect();
    let db: Vec<u64> = (0..20).map(|_| b.retry_after_secs(wait)).collect();
    assert_eq!(da, db);
}

#[tokio::test]
async fn an_answer_is_given_only_once_its_records_are_in_the_store() {
    let store = MemoryStore::new();
    let a = Agent::open(
        Settings::new(RegionId::from("r"), PathBuf::from("unused")),
        Arc::new(store.clone()),
    )
    .expect("agent");
    let target = Target {
        domain: "default".into(),
        entries: vec![("generic_key".into(), "k".into())],
    };
    let checked = a.acquire(&target, 5, None).await.expect("acquire");
    assert!(checked.allowed());
    // The embedded default allows 6000 per minute for generic_key: 5 are on record.
    let granted: u64 = store
        .load()
        .expect("load")
        .iter()
        .filter_map(|r| match r {
            PersistRecord::Key(k) if k.key.as_str() == "generic_key=k" => Some(k.granted_units),
            _ => None,
        })
        .sum();
    assert_eq!(granted, 5);
}
