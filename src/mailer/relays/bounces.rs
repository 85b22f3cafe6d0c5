//! How far a relay's word that a mailbox does not exist (a 5.1.1) is taken
//! as grounds to suppress the address ([`Runs`]).
//!
//! A relay whose recipient table is broken answers 5.1.1 to every
//! recipient, of every domain or of one (a table broken for one domain,
//! amid normal mail to the others). Taken at its word, it would suppress
//! everyone who asks for a code for a month. So each relay's 5.1.1s are
//! counted in runs: of different addresses since it last took any mail,
//! and per recipient domain since it last took a mail for that domain.
//! Past [`RUN`] in either, its 5.1.1s suppress nothing, and the
//! suppressions of the run so far are lifted: they were as groundless.
//! Mail the relay takes for a domain ends that domain's run (and any mail
//! ends the relay-wide one), so a code farmer probing made-up mailboxes at
//! a big provider, between its users' real mail, is suppressed address by
//! address.

use std::collections::HashMap;

/// How many different addresses in a row (of one domain, or of any) a
/// relay may say do not exist, without taking a mail in between, and be
/// believed.
pub(super) const RUN: usize = 5;

/// How many domains' runs a relay keeps at most: past it, one is
/// forgotten for each new one (a flood of domains cannot grow memory).
const DOMAINS_KEPT: usize = 1024;

/// One relay's runs of 5.1.1s.
#[derive(Debug, Default)]
pub(super) struct Runs {
    /// Addresses (as sent) it said do not exist since it last took a mail:
    /// different ones, at most [`RUN`] + 1.
    any: Vec<String>,
    /// The same per recipient domain (lower-case), since it last took a
    /// mail for that domain.
    by_domain: HashMap<String, Vec<String>>,
}

/// What a relay's 5.1.1 is taken for ([`Runs::refused`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Word {
    /// Grounds to suppress the address.
    Taken,
    /// No grounds: the run `of` (a domain, or any) is longer than [`RUN`].
    Doubted {
        /// "of <domain>" or "of any domain".
        of: String,
        /// The addresses before this one whose suppressions are lifted: the
        /// run's, when this 5.1.1 is the one that made it too long (else
        /// none).
        lift: Vec<String>,
    },
}

impl Runs {
    /// The relay took a mail for `recipient`: its domain's run ends, and
    /// the relay-wide one.
    pub(super) fn took(&mut self, recipient: &str) {
        self.any.clear();
        self.by_domain.remove(&domain_of(recipient));
    }

    /// The relay said `recipient` does not exist: what that is taken for.
    pub(super) fn refused(&mut self, recipient: &str) -> Word {
        let domain = domain_of(recipient);
        if !self.by_domain.contains_key(&domain)
            && self.by_domain.len() >= DOMAINS_KEPT
            && let Some(old) = self.by_domain.keys().next().cloned()
        {
            self.by_domain.remove(&old);
        }
        let of_domain = self.by_domain.entry(domain.clone()).or_default();
        let domain_lift = grow(of_domain, recipient);
        let domain_doubted = of_domain.len() > RUN;
        let any_lift = grow(&mut self.any, recipient);
        let any_doubted = self.any.len() > RUN;
        let mut lift: Vec<String> = domain_lift.into_iter().chain(any_lift).collect();
        lift.sort();
        lift.dedup();
        match (domain_doubted, any_doubted) {
            (false, false) => Word::Taken,
            (true, _) => Word::Doubted {
                of: format!("of {domain}"),
                lift,
            },
            (false, true) => Word::Doubted {
                of: "of any domain".into(),
                lift,
            },
        }
    }
}

/// Adds `recipient` to `run` if it is new there and the run is not yet
/// too long; returns the run before it, whose suppressions are to be
/// lifted, when that made it too long.
fn grow(run: &mut Vec<String>, recipient: &str) -> Vec<String> {
    if run.len() > RUN || run.iter().any(|r| r == recipient) {
        return Vec::new();
    }
    run.push(recipient.to_owned());
    match run.len() > RUN {
        true => run[..RUN].to_vec(),
        false => Vec::new(),
    }
}

/// `recipient`'s domain, lower-case.
fn domain_of(recipient: &str) -> String {
    (recipient.rsplit_once('@').map_or(recipient, |(_, d)| d)).to_ascii_lowercase()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_of_one_domain_is_doubted_amid_mail_to_others() {
        let mut runs = Runs::default();
        for n in 0..RUN {
            assert_eq!(runs.refused(&format!("u{n}@broken.example")), Word::Taken);
            // Mail to another domain ends the relay-wide run, not this one.
            runs.took("someone@fine.example");
        }
        let word = runs.refused("u9@broken.example");
        let lifted: Vec<String> = (0..RUN).map(|n| format!("u{n}@broken.example")).collect();
        assert_eq!(
            word,
            Word::Doubted {
                of: "of broken.example".into(),
                lift: lifted
            }
        );
        // Later ones lift nothing more; another domain is taken at its word.
        assert!(
            matches!(runs.refused("u10@BROKEN.example"), Word::Doubted { lift, .. } if lift.is_empty())
        );
        assert_eq!(runs.refused("x@fine.example"), Word::Taken);
        // A mail taken for the domain ends its run.
        runs.took("ok@broken.example");
        assert_eq!(runs.refused("u11@broken.example"), Word::Taken);
    }

    #[test]
    fn a_run_across_domains_is_doubted_until_a_mail_is_taken() {
        let mut runs = Runs::default();
        for n in 0..RUN {
            assert_eq!(runs.refused(&format!("a@d{n}.example")), Word::Taken);
        }
        assert!(
            matches!(runs.refused("a@d9.example"), Word::Doubted { of, lift } if of == "of any domain" && lift.len() == RUN)
        );
        // The same address again adds nothing to a run.
        let mut fresh = Runs::default();
        for _ in 0..10 {
            assert_eq!(fresh.refused("same@x.example"), Word::Taken);
        }
        runs.took("b@d1.example");
        assert_eq!(runs.refused("c@d2.example"), Word::Taken);
    }

    #[test]
    fn domains_kept_are_bounded() {
        let mut runs = Runs::default();
        for n in 0..3 * DOMAINS_KEPT {
            runs.refused(&format!("a@d{n}.example"));
            runs.took("b@elsewhere.example");
        }
        assert!(runs.by_domain.len() <= DOMAINS_KEPT);
    }
}
