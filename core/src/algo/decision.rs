//! The answer every limiting algorithm gives for one request.
//!
//! GCRA, the fixed window and the sliding window counter share this type so that the agent maps
//! any of them onto Envoy's `DescriptorStatus` and the RateLimit headers in one place.

use std::time::Duration;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    Allowed {
        /// Units that would still pass right now, after this request was charged.
        remaining: u64,
        /// Time until the key has its whole quota back if nothing more is admitted; for the
        /// fixed window simply the time to the window's end, as Envoy reports it.
        reset_after: Duration,
    },
    Denied {
        /// The earliest time after which the same request passes, if nothing else is admitted
        /// meanwhile (exact: it passes at `now + retry_after`, not a nanosecond earlier).
        /// `None` when its cost exceeds what the limit can ever admit at once.
        retry_after: Option<Duration>,
        reset_after: Duration,
    },
}

impl Decision {
    pub fn is_allowed(&self) -> bool {
        matches!(self, Decision::Allowed { .. })
    }

    pub fn reset_after(&self) -> Duration {
        match *self {
            Decision::Allowed { reset_after, .. } | Decision::Denied { reset_after, .. } => {
                reset_after
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod testing {
    use proptest::prelude::*;

    use crate::time::Timestamp;

    use super::*;

    /// A denial's retry-after is exact: the same request, decided by `passes_at` on a copy of
    /// the state, passes at `now + retry_after` and not one nanosecond earlier.
    pub(crate) fn check_retry_is_exact(
        now: Timestamp,
        retry_after: Duration,
        passes_at: impl Fn(Timestamp) -> bool,
    ) -> Result<(), TestCaseError> {
        let at = now + retry_after;
        prop_assert!(passes_at(at), "denied at {:?} + {:?}", now, retry_after);
        let just_before = at - Duration::from_nanos(1);
        prop_assert!(!passes_at(just_before), "allowed 1 ns before {:?}", at);
        Ok(())
    }
}
