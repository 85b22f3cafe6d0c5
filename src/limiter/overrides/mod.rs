//! Overrides: exceptions to the configured limits that support staff and
//! operators add, list and remove at run time (`mailgate overrides`),
//! without a redeploy.
//!
//! An override names one subject (an exact mailbox, a registrable domain,
//! or an IP network) and says what happens to requests that match it:
//! - `allow`: not limited or counted by the subject's own scope (a QA
//!   mailbox, a monitoring network, a big provider's domain); the other
//!   scopes still judge the request, so an allowed network cannot
//!   mail-bomb a victim, nor can anyone spend the relay's quota through an
//!   allowed mailbox from one client;
//! - `deny`: rejected, with `retry_after_ms` the override's remaining
//!   lifetime (or what the other rules say, if longer);
//! - rules of its own, which replace the scope's for that subject (for
//!   every purpose).
//!
//! A deny beats everything. Each override has a required reason and an
//! optional expiry (at most 366 days).
//!
//! They are stored in Redis, and polled by every worker, by the
//! [`OverrideStore`](crate::store::overrides::OverrideStore); here is what
//! they are and how a request finds the one that applies (`Table`).

mod table;
#[cfg(test)]
mod tests;

use std::sync::Arc;

use ipnet::IpNet;

pub(crate) use self::table::{Hit, Table};
use super::Scope;
use crate::domain::Normalization;
use crate::domain::{EmailAddress, IpKey, RegistrableDomain};
use crate::settings::{MAX_PERIOD, Rule};

/// The widest IPv4 network an override may name without `--force` (a /8:
/// 16 777 216 addresses).
pub const WIDEST_V4: u8 = 8;

/// The widest IPv6 network an override may name without `--force` (a /32:
/// a large provider's whole allocation).
pub const WIDEST_V6: u8 = 32;

/// How many addresses `net` holds, in words (`256 addresses`, `every IPv4
/// address (4294967296)`, `2^64 addresses (4294967296 /64 networks)`).
fn coverage(net: &IpNet) -> String {
    let bits = u32::from(net.max_prefix_len() - net.prefix_len());
    let count = if bits < 64 {
        (1u64 << bits).to_string()
    } else {
        format!("2^{bits}")
    };
    let every = net.prefix_len() == 0;
    match net {
        IpNet::V4(_) if every => format!("every IPv4 address ({count})"),
        IpNet::V4(_) if bits == 0 => "one address".into(),
        IpNet::V4(_) => format!("{count} addresses"),
        IpNet::V6(_) if every => "every IPv6 address".into(),
        IpNet::V6(_) if bits <= 64 => format!("{count} addresses (within one /64 network or less)"),
        IpNet::V6(_) => format!("{count} addresses ({} /64 networks)", {
            let nets = bits - 64;
            if nets < 64 {
                (1u64 << nets).to_string()
            } else {
                format!("2^{nets}")
            }
        }),
    }
}

/// At most this many overrides are kept: each one with rules of its own is
/// a rule set a script call may name (`decide.lua` numbers sets with two
/// base-64 digits, 4095 at most, and settings use up to 303).
pub const MAX_OVERRIDES: usize = 3_000;

/// What an override matches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// One mailbox, as the limiter normalizes it.
    Email(EmailAddress),
    /// A registrable domain (the domain scope's subject).
    Domain(RegistrableDomain),
    /// An IP network: every client address in it.
    Net(IpNet),
}

impl Target {
    /// Parses `email:<mailbox>`, `domain:<registrable domain>` or
    /// `ip:<address or network>`.
    pub fn parse(input: &str) -> Result<Self, OverrideError> {
        let bad = |why: String| OverrideError::Invalid(why);
        let (kind, value) = input
            .split_once(':')
            .ok_or_else(|| bad(format!("{input:?}: give email:…, domain:… or ip:…")))?;
        match kind {
            "email" => EmailAddress::parse(value)
                .map(Target::Email)
                .map_err(|e| bad(format!("email {value:?}: {e}"))),
            "domain" => RegistrableDomain::parse_exact(value)
                .map(Target::Domain)
                .map_err(|e| bad(format!("domain {value:?}: {e}"))),
            "ip" => {
                let net = match value.parse::<IpNet>() {
                    Ok(net) => net,
                    Err(_) => IpKey::parse(value)
                        .map(|ip| IpNet::from(ip.addr()))
                        .map_err(|_| bad(format!("ip {value:?}: not an address or a network")))?,
                };
                // A v4-mapped v6 network is the v4 network (as client
                // addresses are).
                Ok(Target::Net(canonical(net)))
            }
            _ => Err(bad(format!(
                "{kind:?}: an override matches email:…, domain:… or ip:…"
            ))),
        }
    }

    /// Parses as [`Self::parse`], and refuses what is likely a mistake in
    /// an override being added: a network with host bits set
    /// (`203.0.113.7/0` reads as every client, not the one address), and,
    /// unless `force`, a network wider than [`WIDEST_V4`] or
    /// [`WIDEST_V6`], which would take most clients out of the IP scope (or
    /// lock them all out) at once.
    pub fn parse_to_add(input: &str, force: bool) -> Result<Self, OverrideError> {
        let target = Self::parse(input)?;
        if let Target::Domain(d) = &target
            && d.is_public_suffix()
        {
            return Err(OverrideError::Invalid(format!(
                "domain:{d} is a public suffix: no mailbox counts as it (alice@acme.{d} counts \
                 as acme.{d}); name the registrable domain"
            )));
        }
        let Target::Net(net) = target else {
            return Ok(target);
        };
        let bad = |why: String| Err(OverrideError::Invalid(why));
        let written = input.split_once(':').map_or(input, |(_, v)| v);
        if let Ok(raw) = written.parse::<IpNet>()
            && raw.addr() != raw.network()
        {
            return bad(format!(
                "ip:{written} has host bits set under /{}: it would cover {}, not the one \
                 address; write ip:{} for the network or ip:{} for the address",
                raw.prefix_len(),
                coverage(&canonical(raw)),
                raw.trunc(),
                raw.addr()
            ));
        }
        let widest = match net {
            IpNet::V4(_) => WIDEST_V4,
            IpNet::V6(_) => WIDEST_V6,
        };
        if net.prefix_len() < widest && !force {
            return bad(format!(
                "ip:{net} covers {}; an override wider than /{WIDEST_V4} (IPv4) or /{WIDEST_V6} \
                 (IPv6) needs --force",
                coverage(&net)
            ));
        }
        Ok(target)
    }

    /// What it covers, said for people: a mailbox, a domain's mailboxes, or
    /// how many client addresses.
    pub fn coverage(&self) -> String {
        match self {
            Target::Email(_) => "one mailbox (every spelling the limiter counts as it)".into(),
            Target::Domain(d) => format!("every mailbox at {d} and its subdomains"),
            Target::Net(n) => coverage(n),
        }
    }

    /// The scope whose subject it names.
    pub fn scope(&self) -> Scope {
        match self {
            Target::Email(_) => Scope::Email,
            Target::Domain(_) => Scope::Domain,
            Target::Net(_) => Scope::Ip,
        }
    }

    /// Its field in the hash, one per subject: the same mailbox spelled
    /// twice is one field.
    pub(crate) fn field(&self, norm: &Normalization) -> String {
        match self {
            Target::Email(e) => format!("email:{}", e.mailbox_key(norm)),
            Target::Domain(d) => format!("domain:{d}"),
            Target::Net(n) => format!("ip:{}", n.trunc()),
        }
    }
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Email(e) => write!(f, "email:{e}"),
            Target::Domain(d) => write!(f, "domain:{d}"),
            Target::Net(n) => write!(f, "ip:{}", n.trunc()),
        }
    }
}

/// A network of IPv4-mapped IPv6 addresses as the IPv4 network.
fn canonical(net: IpNet) -> IpNet {
    match net {
        IpNet::V6(v6) if v6.prefix_len() >= 96 => match v6.addr().to_ipv4_mapped() {
            Some(v4) => ipnet::Ipv4Net::new(v4, v6.prefix_len() - 96)
                .map(IpNet::V4)
                .unwrap_or(net),
            None => net,
        },
        other => other,
    }
}

/// What an override does to the requests it matches.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Not limited or counted by the subject's own scope.
    Allow,
    /// Always rejected while it lasts.
    Deny,
    /// Judged by these rules instead of the scope's.
    Rules(Vec<Rule>),
}

impl Action {
    /// `allow`, `deny` or `rules`: the kind, as metrics and `list` name it.
    pub fn kind(&self) -> &'static str {
        match self {
            Action::Allow => "allow",
            Action::Deny => "deny",
            Action::Rules(_) => "rules",
        }
    }
}

/// One override.
#[derive(Debug, Clone, PartialEq)]
pub struct Override {
    /// What it matches.
    pub target: Target,
    /// What it does.
    pub action: Action,
    /// Why it exists (required: whoever finds it later must know).
    pub reason: String,
    /// When it ends, ms since the epoch; `None`: when removed.
    pub expires_at_ms: Option<u64>,
    /// When it was added, ms since the epoch.
    pub added_at_ms: u64,
}

impl Override {
    /// Checks what the CLI cannot: a reason, rules that settings would
    /// accept (whole milliseconds: the limiter counts no finer), an expiry
    /// in the future and at most [`MAX_PERIOD`] away.
    pub fn check(&self, now_ms: u64) -> Result<(), OverrideError> {
        self.check_shape()?;
        let max = u64::try_from(MAX_PERIOD.as_millis()).unwrap_or(u64::MAX);
        match self.expires_at_ms {
            Some(t) if t <= now_ms => {
                Err(OverrideError::Invalid("the expiry is in the past".into()))
            }
            Some(t) if t - now_ms > max => Err(OverrideError::Invalid(
                "an override lasts at most 366 days (or, without an expiry, until removed)".into(),
            )),
            _ => Ok(()),
        }
    }

    /// What every override must be, however it was written (a hand-made
    /// entry in Redis is checked too, and ignored if it fails: one bad rule
    /// set would fail every script call it rode in).
    pub(crate) fn check_shape(&self) -> Result<(), OverrideError> {
        let bad = |why: &str| Err(OverrideError::Invalid(why.to_owned()));
        if self.reason.trim().is_empty() || self.reason.len() > 500 {
            return bad("an override needs a reason (1 to 500 bytes)");
        }
        if let Action::Rules(rules) = &self.action {
            if rules.is_empty() || rules.len() > 16 {
                return bad("give 1 to 16 rules");
            }
            if (rules.iter()).any(|r| r.max == 0 || r.window_ms() == 0 || r.window > MAX_PERIOD) {
                return bad("each rule needs a max of at least 1 and a window of 1ms to 366 days");
            }
        }
        Ok(())
    }

    /// Whether it still holds at `now_ms`.
    pub fn live(&self, now_ms: u64) -> bool {
        self.expires_at_ms.is_none_or(|t| t > now_ms)
    }
}

/// Why an override could not be read, stored or applied.
#[derive(Debug, Clone, thiserror::Error)]
pub enum OverrideError {
    /// What was asked makes no sense (the message says why).
    #[error("{0}")]
    Invalid(String),
    /// Redis could not be reached or refused (the source).
    #[error("redis")]
    Redis(#[source] Arc<::redis::RedisError>),
    /// Redis refuses mailgate for good: credentials, an ACL, a database it
    /// does not have (the message says which).
    #[error("{0}")]
    Unfit(String),
}

impl From<::redis::RedisError> for OverrideError {
    fn from(e: ::redis::RedisError) -> Self {
        OverrideError::Redis(Arc::new(e))
    }
}
