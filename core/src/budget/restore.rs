//! A start that may have lost what an earlier copy of the region's state admitted: a restored
//! backup, a lost disk (docs/budget.md, "Restores").
//!
//! Neither the agent nor the coordinator can tell such a start from a crash in general, so the
//! operator declares it (`allot agent --restored`), and an agent that opens an empty store
//! asks the coordinator whether it knew the region. Such a start admits nothing from its
//! allowances until the first answer of its boot (which resends every grant and its own
//! entries), and nothing more, ever, in windows that began before the start: the lost copy
//! may have admitted anything there, up to the allowance it held. Closing them makes the
//! overshoot 0 with no new term in the bound. Windows that begin later are normal.

use crate::time::Timestamp;

/// Why a start may have lost state, as the agent knows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RestoreStart {
    /// The operator said so: the store is an old copy (or empty after a lost disk).
    Declared,
    /// The store was empty: a first start, or a lost disk; the coordinator tells which.
    EmptyStore,
}

/// Ids a restored start may hand out per millisecond of clock before its ids could meet
/// those of a copy that started earlier: far above any grant rate an agent sustains.
pub(crate) const IDS_PER_MS: u64 = 1_024;

/// The first lease or slot id a restored start at `now` hands out. Every lineage of the
/// region's state begins with such a start (an empty store is one), so its ids stay below
/// `start_ms * IDS_PER_MS + ids handed out since`; a later restored start begins above them
/// while the region handed out fewer than [`IDS_PER_MS`] a millisecond on average. Below 2^53
/// (exact in JSON numbers) until the year 2248.
pub(crate) fn id_floor(now: Timestamp) -> u64 {
    now.as_unix_millis().saturating_mul(IDS_PER_MS)
}

/// Where a restored start stands.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum Restore {
    /// A start from the region's own state (or one the coordinator did not know).
    #[default]
    Normal,
    /// Waiting for the first answer of this boot: nothing is admitted from allowances.
    Awaiting {
        started_at: Timestamp,
        declared: bool,
    },
    /// Windows that began before `before` admit nothing more.
    Closed { before: Timestamp },
}

/// What admission reads of it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct RestoreGate {
    /// The start of a restore still awaiting its first answer.
    pub awaiting_since: Option<Timestamp>,
    pub closed_before: Option<Timestamp>,
}

impl RestoreGate {
    /// Whether the window starting at `window_start` admits from its allowance.
    pub fn shuts(&self, window_start: Timestamp) -> bool {
        self.is_awaiting() || self.closes(window_start)
    }

    /// Whether the start still awaits its first answer.
    pub fn is_awaiting(&self) -> bool {
        self.awaiting_since.is_some()
    }

    /// Whether the open partition policy may admit in the window starting at `window_start`.
    /// Not in a window closed for good, nor, while the start awaits its first answer, in one
    /// that began before it (the lost copy may have taken that window's open budget too), nor
    /// in any window while the region reads a timebase with no correction known (`clock_unknown`):
    /// its own clock may be any distance behind the one the lost copy read windows on, so a
    /// window it takes for one after its start may be one the copy used (swarm seed 3158568).
    pub fn opens(&self, window_start: Timestamp, clock_unknown: bool) -> bool {
        let awaiting_allows = self
            .awaiting_since
            .is_none_or(|since| window_start >= since && !clock_unknown);
        !self.closes(window_start) && awaiting_allows
    }

    /// Whether the window starting at `window_start` is closed for good (no partition policy
    /// reopens it).
    pub fn closes(&self, window_start: Timestamp) -> bool {
        self.closed_before.is_some_and(|b| window_start < b)
    }
}

impl Restore {
    /// A start at `now` that may be a restore. A region with no coordinator has no one to ask:
    /// a declared restore closes its earlier windows at once, an empty store is a first start.
    pub fn start(now: Timestamp, why: RestoreStart, coordinated: bool) -> Restore {
        match (why, coordinated) {
            (_, true) => Restore::Awaiting {
                started_at: now,
                declared: why == RestoreStart::Declared,
            },
            (RestoreStart::Declared, false) => Restore::Closed { before: now },
            (RestoreStart::EmptyStore, false) => Restore::Normal,
        }
    }

    /// The first answer of the boot arrived: a declared restore, or an empty store the
    /// coordinator knew of, closes the windows that began before the start.
    pub fn on_first_answer(self, known_region: bool) -> Restore {
        match self {
            Restore::Awaiting {
                started_at,
                declared,
            } if declared || known_region => Restore::Closed { before: started_at },
            Restore::Awaiting { .. } => Restore::Normal,
            other => other,
        }
    }

    /// Windows that began before this stay closed (persisted, `PersistRecord::RestoredBefore`).
    pub fn closed_before(&self) -> Option<Timestamp> {
        match *self {
            Restore::Normal | Restore::Awaiting { .. } => None,
            Restore::Closed { before } => Some(before),
        }
    }

    /// A closing read back from the store: kept across the restart, unless a later one holds.
    /// It ends a wait read before it: the restore it recorded was answered. `before` at zero
    /// closes nothing (a start the coordinator did not know).
    pub fn keep_closed(&mut self, before: Timestamp) {
        if self.is_awaiting() {
            *self = Restore::Normal;
        }
        if before > Timestamp::ZERO && self.closed_before().is_none_or(|b| b < before) {
            *self = Restore::Closed { before };
        }
    }

    /// A wait read back from the store: the restored start was not answered before the
    /// region went down again, so the store still holds the restored copy, not the region's
    /// own latest state, and the restart waits for its own first answer as that start would
    /// have, closing the same windows once answered.
    pub fn keep_awaiting(&mut self, started_at: Timestamp, declared: bool) {
        *self = Restore::Awaiting {
            started_at,
            declared,
        };
    }

    /// Whether the window starting at `window_start` began before a restored start (one
    /// that is closed, or will be once answered): the lost copy may have admitted up to what
    /// it held there, so none of it may be released to another region.
    pub fn keeps_held(&self, window_start: Timestamp) -> bool {
        match *self {
            Restore::Normal => false,
            Restore::Awaiting { started_at, .. } => window_start < started_at,
            Restore::Closed { before } => window_start < before,
        }
    }

    /// The start was dated on a clock since corrected to read `start` then: it moves later,
    /// never earlier. Returns whether it moved (it must be persisted).
    pub fn start_no_earlier_than(&mut self, start: Timestamp) -> bool {
        match self {
            Restore::Awaiting { started_at, .. } if *started_at < start => {
                *started_at = start;
                true
            }
            Restore::Closed { before } if *before < start => {
                *before = start;
                true
            }
            Restore::Normal | Restore::Awaiting { .. } | Restore::Closed { .. } => false,
        }
    }

    /// The start of a restore still awaiting its first answer.
    pub fn awaiting_since(&self) -> Option<Timestamp> {
        match *self {
            Restore::Awaiting { started_at, .. } => Some(started_at),
            Restore::Normal | Restore::Closed { .. } => None,
        }
    }

    pub fn is_awaiting(&self) -> bool {
        matches!(self, Restore::Awaiting { .. })
    }

    pub fn gate(&self) -> RestoreGate {
        match *self {
            Restore::Normal => RestoreGate::default(),
            Restore::Awaiting { started_at, .. } => RestoreGate {
                awaiting_since: Some(started_at),
                closed_before: None,
            },
            Restore::Closed { before } => RestoreGate {
                awaiting_since: None,
                closed_before: Some(before),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: u64) -> Timestamp {
        Timestamp::from_unix_millis(v)
    }

    #[test]
    fn a_declared_restore_closes_earlier_windows_after_the_first_answer_whatever_it_says() {
        let r = Restore::start(ms(5_000), RestoreStart::Declared, true);
        assert!(r.gate().shuts(ms(10_000)), "nothing until the answer");
        let r = r.on_first_answer(false);
        assert!(r.gate().closes(ms(4_000)));
        assert!(
            !r.gate().shuts(ms(5_000)),
            "a window starting at the start is normal"
        );
    }

    #[test]
    fn an_empty_store_is_a_first_start_unless_the_coordinator_knew_the_region() {
        let r = Restore::start(ms(5_000), RestoreStart::EmptyStore, true);
        assert_eq!(r.on_first_answer(false), Restore::Normal);
        assert_eq!(
            r.on_first_answer(true),
            Restore::Closed { before: ms(5_000) }
        );
    }

    #[test]
    fn windows_before_a_restored_start_keep_what_is_held_while_awaiting_and_once_closed() {
        let r = Restore::start(ms(5_000), RestoreStart::Declared, true);
        assert!(r.keeps_held(ms(4_000)), "awaiting: the window will close");
        assert!(
            !r.keeps_held(ms(5_000)),
            "a window starting at the start is normal"
        );
        let r = r.on_first_answer(false);
        assert!(r.keeps_held(ms(4_000)));
        assert!(!r.keeps_held(ms(6_000)));
        assert!(!Restore::Normal.keeps_held(ms(0)));
    }

    #[test]
    fn without_a_coordinator_a_declared_restore_closes_at_once() {
        let r = Restore::start(ms(5_000), RestoreStart::Declared, false);
        assert!(r.gate().closes(ms(0)));
        assert_eq!(
            Restore::start(ms(5_000), RestoreStart::EmptyStore, false),
            Restore::Normal
        );
    }
}
