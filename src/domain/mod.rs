//! Parsed domain types. Everything here is built once, at the edge, from
//! untrusted input; once a value of one of these types exists it is known to be
//! well formed, so no later stage validates it again.
//!
//! This module depends on no other module of the crate.

mod dead_reason;
mod email;
mod hide;
mod ip;
mod job;
mod job_id;
mod mail_domain;
mod scope;
mod ticket;

pub use dead_reason::DeadReason;
pub use email::{EmailAddress, Normalization};
pub use ip::IpKey;
pub use job::{Code, Job, Name, Session, VarValue, Vars};
pub use job_id::JobId;
pub use mail_domain::RegistrableDomain;
pub use scope::{Scope, ScopeMap};
pub use ticket::Ticket;

/// The wall clock, ms since the Unix epoch: for publish times and
/// latencies. Limits and leases never use it: they run on the ledger's
/// clock (Redis `TIME`), so workers whose clocks disagree still agree.
pub fn now_ms() -> u64 {
    u64::try_from(jiff::Timestamp::now().as_millisecond()).unwrap_or(0)
}

/// This host's boot clock, ms: `CLOCK_BOOTTIME` on Linux, which no one
/// steps and which counts the time a suspended host slept (elsewhere the
/// monotonic clock).
pub fn boot_ms() -> u64 {
    #[cfg(target_os = "linux")]
    {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid timespec for the call to fill in.
        if unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) } == 0 {
            let secs = u64::try_from(ts.tv_sec).unwrap_or(0);
            let nanos = u64::try_from(ts.tv_nsec).unwrap_or(0);
            return secs.saturating_mul(1000).saturating_add(nanos / 1_000_000);
        }
    }
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    let start = START.get_or_init(std::time::Instant::now);
    u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// Why a piece of input could not become a domain value.
///
/// Each variant is a clear, user-facing reason: the worker copies its text into
/// the `error` field of an `invalid` result, so producers learn what to fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidInput {
    /// The mailbox is empty after trimming.
    #[error("email is empty")]
    EmailEmpty,
    /// The mailbox is longer than SMTP allows (254 octets).
    #[error("email is longer than {max} bytes")]
    EmailTooLong {
        /// The limit that was exceeded.
        max: usize,
    },
    /// A control character (CR, LF, NUL, TAB, ...) would let the address smuggle
    /// headers or SMTP commands.
    #[error("{field} contains a control character")]
    ControlCharacter {
        /// The field that held it.
        field: &'static str,
    },
    /// The mailbox does not have the shape `local@domain`.
    #[error("email is not a valid address: {reason}")]
    EmailSyntax {
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A host name (in the settings or a support tool) is not a valid one.
    #[error("not a valid domain: {0:?}")]
    Domain(String),
    /// A list that matches registrable domains names a sub-domain, which
    /// would match nothing.
    #[error(
        "{given:?} is not a registrable domain: mailboxes under it are counted as {registrable:?}"
    )]
    NotRegistrable {
        /// The name as written.
        given: String,
        /// What it is counted as.
        registrable: String,
    },
    /// The client IP is not an IPv4 or IPv6 address.
    #[error("ip is not an IPv4 or IPv6 address: {0:?}")]
    Ip(String),
    /// The job id starts or ends with whitespace, which would make two ids
    /// that look alike differ.
    #[error("id must not start or end with whitespace")]
    JobIdPadded,
    /// A field breaks its documented limits.
    #[error("{field} {reason}")]
    Field {
        /// The field.
        field: &'static str,
        /// What its value must be.
        reason: &'static str,
    },
    /// A required field is missing.
    #[error("{0} is required")]
    Missing(&'static str),
    /// `expires_at` or `created_at` is not an RFC 3339 timestamp.
    #[error("{field} is not an RFC 3339 timestamp: {value}")]
    Timestamp {
        /// The field.
        field: &'static str,
        /// Its value (the first 64 characters).
        value: String,
    },
    /// The job id is empty or longer than 128 characters.
    #[error("id must be 1 to {max} characters long")]
    JobIdLength {
        /// The limit.
        max: usize,
    },
}
