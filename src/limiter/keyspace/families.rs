//! Every family of keys mailgate writes under `redis.key_prefix`, in one
//! list ([`FAMILIES`]): the key builders take their names from here, and a
//! test builds one key of each builder and checks that it belongs to a
//! family, so `mailgate admin purge` (which removes these families and
//! nothing else under the prefix) cannot forget one. The prefix may be
//! shared with an application's own keys: only keys of a family are
//! mailgate's.

/// Job records: `<prefix>job:<id>`.
pub(crate) const JOB: &str = "job:";
/// A mailbox's log: `<prefix>email:<mailbox>`.
pub(crate) const EMAIL: &str = "email:";
/// A client network's log: `<prefix>ip:<network>`.
pub(crate) const IP: &str = "ip:";
/// A domain's log, and its networks' shares of it:
/// `<prefix>domain:<domain>[:net:<network>]`.
pub(crate) const DOMAIN: &str = "domain:";
/// The newest job per requester, mailbox and purpose (`limits.supersede`):
/// `<prefix>newest:<purpose>:<requester>:<mailbox>`.
pub(crate) const NEWEST: &str = "newest:";
/// A suppressed mailbox, every spelling the limiter counts as it (`mailgate
/// suppress add`): `<prefix>sup:<mailbox>`.
pub(crate) const SUPPRESSION: &str = "sup:";
/// An address a relay said does not exist, as it was spelled to the
/// relay: `<prefix>bounced:<address>`.
pub(crate) const BOUNCED: &str = "bounced:";
/// One domain's run of bounces, every worker's, lately (the 5.1.1 guard):
/// `<prefix>bounceruns:<domain>`.
pub(crate) const BOUNCE_RUNS: &str = "bounceruns:";
/// The index of suppressions: `<prefix>suppressed`.
pub(crate) const SUPPRESSION_INDEX: &str = "suppressed";
/// The overrides' hash: `<prefix>overrides`.
pub(crate) const OVERRIDES: &str = "overrides";
/// The log of `limits reset`s, newest first: `<prefix>resets`.
pub(crate) const RESETS: &str = "resets";
/// The clock watch's mark, canary and last refresh (one slot: the braces
/// are a hash tag where the prefix has none).
pub(crate) const CLOCK: [&str; 3] = ["{clock}", "{clock}:canary", "{clock}:since"];
/// What readiness writes and deletes at once: `<prefix>probe`.
pub(crate) const PROBE: &str = "probe";

/// Which keys after the prefix make up a [`Family`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Tail {
    /// Every key that goes on from this (one per job, mailbox, network…).
    Under(&'static str),
    /// These keys alone.
    Exactly(&'static [&'static str]),
}

/// One family of mailgate's keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Family {
    /// What its keys are, for people.
    pub name: &'static str,
    /// Its keys, after the prefix.
    pub tail: Tail,
}

/// Every family of keys mailgate writes, in the order a purge reports them.
pub(crate) const FAMILIES: [Family; 13] = [
    Family {
        name: "job records",
        tail: Tail::Under(JOB),
    },
    Family {
        name: "mailbox logs",
        tail: Tail::Under(EMAIL),
    },
    Family {
        name: "network logs",
        tail: Tail::Under(IP),
    },
    Family {
        name: "domain logs",
        tail: Tail::Under(DOMAIN),
    },
    Family {
        name: "newest jobs",
        tail: Tail::Under(NEWEST),
    },
    Family {
        name: "suppressions",
        tail: Tail::Under(SUPPRESSION),
    },
    Family {
        name: "bounced addresses",
        tail: Tail::Under(BOUNCED),
    },
    Family {
        name: "bounce runs",
        tail: Tail::Under(BOUNCE_RUNS),
    },
    Family {
        name: "suppression index",
        tail: Tail::Exactly(&[SUPPRESSION_INDEX]),
    },
    Family {
        name: "overrides",
        tail: Tail::Exactly(&[OVERRIDES]),
    },
    Family {
        name: "limit resets",
        tail: Tail::Exactly(&[RESETS]),
    },
    Family {
        name: "clock watch",
        tail: Tail::Exactly(&CLOCK),
    },
    Family {
        name: "readiness probe",
        tail: Tail::Exactly(&[PROBE]),
    },
];

/// Which of [`FAMILIES`] `key` belongs to (by its index there), with
/// `prefix` the deployment's `redis.key_prefix`; `None`: not mailgate's
/// (another deployment's, or the application's own).
pub(crate) fn family_of(prefix: &str, key: &[u8]) -> Option<usize> {
    let rest = key.strip_prefix(prefix.as_bytes())?;
    FAMILIES.iter().position(|f| match f.tail {
        Tail::Under(tail) => rest.starts_with(tail.as_bytes()),
        Tail::Exactly(keys) => keys.iter().any(|k| k.as_bytes() == rest),
    })
}

/// A `SCAN … MATCH` pattern for every key that begins with `text`: its
/// glob characters (`*`, `?`, `[`, `]`, `\`) escaped, then `*`.
pub(crate) fn match_under(text: &str) -> String {
    let mut pattern = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            pattern.push('\\');
        }
        pattern.push(c);
    }
    pattern.push('*');
    pattern
}

/// The suppression index's key.
pub(crate) fn suppression_index_key(prefix: &str) -> String {
    format!("{prefix}{SUPPRESSION_INDEX}")
}

/// The overrides' hash key.
pub(crate) fn overrides_key(prefix: &str) -> String {
    format!("{prefix}{OVERRIDES}")
}

/// The log of `limits reset`s' key.
pub(crate) fn resets_key(prefix: &str) -> String {
    format!("{prefix}{RESETS}")
}

/// The clock watch's keys: the mark, the canary, and its last refresh.
pub(crate) fn clock_keys(prefix: &str) -> [String; 3] {
    CLOCK.map(|tail| format!("{prefix}{tail}"))
}

/// The readiness probe's key.
pub(crate) fn probe_key(prefix: &str) -> String {
    format!("{prefix}{PROBE}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{EmailAddress, IpKey, JobId, Name, RegistrableDomain, Session};
    use crate::limiter::keyspace::Keyspace;
    use crate::limiter::{Request, Subject};
    use crate::settings::LimitSettings;

    /// One key of every builder, under `prefix`.
    fn every_key(prefix: &str) -> Vec<String> {
        let limits = LimitSettings {
            supersede: true,
            ..LimitSettings::default()
        };
        let keys = Keyspace::new(prefix, &limits);
        let id = JobId::parse("j-1").expect("an id");
        let email = EmailAddress::parse("Who+x@Example.com").expect("a mailbox");
        let ip = IpKey::parse("203.0.113.7").expect("an address");
        let domain = RegistrableDomain::of(&email, &limits.normalize);
        let purpose = Name::parse("purpose", "login").expect("a purpose");
        let session = Session::of("s");
        let req = Request {
            id: &id,
            email: &email,
            ip: Some(&ip),
            purpose: Some(&purpose),
            session: session.as_ref(),
            known_mailbox: false,
        };
        let domain_key = keys.key_of(Subject::Domain(&domain));
        let mut all = vec![
            keys.record_key(&id),
            keys.key_of(Subject::Email(&email)),
            keys.key_of(Subject::Ip(&ip)),
            keys.key_of(Subject::Share(&domain, &ip)),
            keys.share_key(&domain_key, &ip),
            domain_key,
            keys.suppression_key(&email),
            keys.bounce_key(&email),
            keys.bounce_run_key(email.domain()),
            keys.latest_key(&req).expect("supersede is on"),
            suppression_index_key(prefix),
            overrides_key(prefix),
            resets_key(prefix),
            probe_key(prefix),
        ];
        all.extend(clock_keys(prefix));
        all
    }

    #[test]
    fn every_key_mailgate_builds_is_of_one_family() {
        for prefix in ["mailgate:", "{mg}:", "", "a*[x]?\\:"] {
            let mut seen = std::collections::BTreeSet::new();
            for key in every_key(prefix) {
                let family = family_of(prefix, key.as_bytes());
                assert!(family.is_some(), "{key:?} is of no family");
                seen.extend(family);
            }
            assert_eq!(seen.len(), FAMILIES.len(), "a family no builder makes");
        }
    }

    #[test]
    fn keys_of_others_under_the_prefix_are_not_mailgate_s() {
        for key in [
            "app:session:1",
            "app:x:job:1",
            "app:jobs",
            "app:suppressed2",
            "app:{clock}x",
            "app:overrides:1",
            "app",
            "other:job:1",
        ] {
            assert_eq!(family_of("app:", key.as_bytes()), None, "{key}");
        }
        assert_eq!(family_of("app:", b"app:job:"), Some(0));
    }

    #[test]
    fn a_pattern_matches_the_prefix_as_written() {
        assert_eq!(match_under("app:"), "app:*");
        assert_eq!(match_under("{mg}:"), "{mg}:*");
        assert_eq!(match_under("a*b?[c]\\:"), "a\\*b\\?\\[c\\]\\\\:*");
    }
}
