//! What a job's live record says to a request for its id, before the
//! limiter is asked: the one reading of a record's state, shared by the
//! memory ledger and the Redis ledger's snapshot (which reads a record with
//! the job's scope logs in one snapshot, and answers what writes nothing
//! without running the ledger's script). `ledger.lua`'s `from_record`
//! reads a record the same way where it writes.

use super::{JobState, Verdict};

/// A live record as a request for its id sees it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Held {
    /// Where its send stands.
    pub state: JobState,
    /// The record was made for the same job (its fingerprint is the
    /// request's): else the id is another job's.
    pub same_job: bool,
    /// The asking lineage owns it (its ticket is the record's).
    pub mine: bool,
    /// The owner's final result was confirmed.
    pub answered: bool,
    /// When the job was admitted, ms.
    pub admitted_at: u64,
    /// Until when its owner holds the send, ms (0: released).
    pub lease_until: u64,
}

/// What a live record answers to a request for its id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Standing {
    /// The request is answered so, and nothing is written.
    Answered(Verdict),
    /// Its send began and its owner vanished (the lease lapsed): the record
    /// becomes unknown, never resent, and the request is answered
    /// [`Verdict::Unknown`], `by_owner` if the asker owns it.
    Vanished,
    /// An admission nobody holds: the asking lineage resumes it, or it is
    /// refunded (the asker's own, expired or superseded). A write.
    Lapsed,
    /// Another lineage's refund: the request is decided afresh, as if
    /// there were no record.
    Afresh,
}

/// What record `held` answers at `now` to a request whose own expiry has
/// passed if `expired`.
pub(crate) fn standing(held: Held, expired: bool, now: u64) -> Standing {
    let Held {
        state,
        mine,
        answered,
        admitted_at: admitted_at_ms,
        lease_until,
        ..
    } = held;
    let verdict = match state {
        _ if !held.same_job => Verdict::Conflict,
        JobState::Refunded(how) if mine => Verdict::Finished { how, answered },
        JobState::Sent => Verdict::Sent {
            admitted_at_ms,
            by_owner: mine,
            answered,
        },
        JobState::Unknown => Verdict::Unknown {
            by_owner: mine,
            answered,
        },
        JobState::Admitted | JobState::Sending if lease_until > now => Verdict::Busy {
            lease_left_ms: lease_until - now,
        },
        JobState::Sending => return Standing::Vanished,
        // Another message of the job, and too late for it: the owner's own
        // copy judges its admission by its own expiry.
        JobState::Admitted if expired && !mine => Verdict::Expired,
        JobState::Admitted => return Standing::Lapsed,
        JobState::Refunded(_) => return Standing::Afresh,
    };
    Standing::Answered(verdict)
}
