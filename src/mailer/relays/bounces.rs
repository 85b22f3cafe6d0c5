//! How far a relay's word that a mailbox does not exist (a 5.1.1) is taken
//! as grounds to suppress the address ([`Runs`]).
//!
//! A relay whose recipient table is broken answers 5.1.1 to every
//! recipient, of every domain, of one (a table broken for one domain, amid
//! normal mail to the others), or of many of them (a directory lookup that
//! fails for every hosted customer domain). Taken at its word, it would
//! suppress everyone who asks for a code for a month. So each relay's
//! 5.1.1s are counted in runs: of different addresses since it last took
//! any mail, per recipient domain since it last took a mail for that
//! domain, and as a share of its latest outcomes. Past [`RUN`] in a run,
//! or past [`SHARE`] of the outcomes, its 5.1.1s suppress nothing, and the
//! suppressions of the run so far are lifted: they were as groundless.
//! Mail the relay takes for a domain ends that domain's run (and any mail
//! ends the relay-wide one), so a code farmer probing made-up mailboxes at
//! a big provider, between its users' real mail, is suppressed address by
//! address. A worker sees only its own sends: the ledger also counts each
//! domain's bounces across workers and restarts, and a 5.1.1 for a domain
//! this relay took mail for lately is vouched for there ([`Word::Taken`]).

use std::collections::HashMap;

use tokio::time::Instant;

/// How many different addresses in a row (of one domain, or of any) a
/// relay may say do not exist, without taking a mail in between, and be
/// believed.
pub(super) const RUN: usize = 5;

/// How many domains' runs, and mails taken, a relay keeps at most: past
/// it, one is forgotten for each new one (a flood of domains cannot grow
/// memory).
const DOMAINS_KEPT: usize = 1024;

/// How many of a relay's latest outcomes (a mail taken, or a 5.1.1) the
/// share of 5.1.1s is judged over.
const OUTCOMES: usize = 100;

/// The share of a relay's latest outcomes that may be 5.1.1s (once there
/// are at least [`SHARE_FROM`] of them) before its word is doubted: a
/// sign-up flow's typos are a few percent; a table broken for many domains,
/// each of too few users for a run, is far more.
const SHARE: f64 = 0.3;

/// How many different addresses refused (5.1.1) among the latest outcomes
/// the share needs to be judged.
const SHARE_FROM: usize = 10;

/// How long a mail taken for a domain vouches for that domain's 5.1.1s
/// (the ledger's count across workers does not doubt them).
const VOUCH_FOR: std::time::Duration = std::time::Duration::from_secs(600);

/// One relay's runs of 5.1.1s.
#[derive(Debug, Default)]
pub(super) struct Runs {
    /// Addresses (as sent) it said do not exist since it last took a mail:
    /// different ones, at most [`RUN`] + 1.
    any: Vec<String>,
    /// The same per recipient domain (lower-case), since it last took a
    /// mail for that domain.
    by_domain: HashMap<String, Vec<String>>,
    /// Its latest outcomes, oldest first: `None` a mail taken, else the
    /// address it said does not exist.
    outcomes: std::collections::VecDeque<Option<String>>,
    /// Whether the share of 5.1.1s is past [`SHARE`] (its run lifted).
    share_doubted: bool,
    /// When it last took a mail for each domain (lower-case).
    taken: HashMap<String, Instant>,
}

/// What a relay's 5.1.1 is taken for ([`Runs::refused`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Word {
    /// Grounds to suppress the address; `vouched`: the relay took a mail
    /// for its domain within [`VOUCH_FOR`] (the domain takes mail here).
    Taken {
        /// The relay took mail for the domain lately.
        vouched: bool,
    },
    /// No grounds: a run is longer than [`RUN`], or the share past
    /// [`SHARE`].
    Doubted {
        /// Which, for people: "more than 5 mailboxes of <domain> in a
        /// row", "… of any domain …", or the share.
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
        let domain = domain_of(recipient);
        self.any.clear();
        self.by_domain.remove(&domain);
        self.outcome(None);
        if !self.taken.contains_key(&domain)
            && self.taken.len() >= DOMAINS_KEPT
            && let Some(old) = self.taken.keys().next().cloned()
        {
            self.taken.remove(&old);
        }
        self.taken.insert(domain, Instant::now());
    }

    /// Records one outcome among the latest [`OUTCOMES`]; whether the share
    /// of 5.1.1s among them is past [`SHARE`].
    fn outcome(&mut self, refused: Option<String>) -> bool {
        self.outcomes.push_back(refused);
        if self.outcomes.len() > OUTCOMES {
            self.outcomes.pop_front();
        }
        // Different addresses: one refused again and again (two workers'
        // copies) is one.
        let refused: std::collections::HashSet<&String> = self.outcomes.iter().flatten().collect();
        let refused = refused.len();
        let past = refused >= SHARE_FROM && refused as f64 > SHARE * self.outcomes.len() as f64;
        if !past {
            self.share_doubted = false;
        }
        past
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
        let share_doubted = self.outcome(Some(recipient.to_owned()));
        let mut share_lift = Vec::new();
        if share_doubted && !self.share_doubted {
            // The first 5.1.1 past the share: the window's others lifted.
            self.share_doubted = true;
            share_lift = (self.outcomes.iter().flatten())
                .filter(|a| *a != recipient)
                .cloned()
                .collect();
        }
        let mut lift: Vec<String> = (domain_lift.into_iter())
            .chain(any_lift)
            .chain(share_lift)
            .collect();
        lift.sort();
        lift.dedup();
        match (domain_doubted, any_doubted, share_doubted) {
            (false, false, false) => Word::Taken {
                vouched: (self.taken.get(&domain)).is_some_and(|at| at.elapsed() < VOUCH_FOR),
            },
            (true, ..) => Word::Doubted {
                of: format!("more than {RUN} mailboxes of {domain} in a row"),
                lift,
            },
            (false, true, _) => Word::Doubted {
                of: format!("more than {RUN} mailboxes of any domain in a row"),
                lift,
            },
            (false, false, true) => Word::Doubted {
                of: format!(
                    "more than {:.0} % of its latest {OUTCOMES} mailboxes, of many domains,",
                    SHARE * 100.0
                ),
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
            assert!(matches!(
                runs.refused(&format!("u{n}@broken.example")),
                Word::Taken { .. }
            ));
            // Mail to another domain ends the relay-wide run, not this one.
            runs.took("someone@fine.example");
        }
        let word = runs.refused("u9@broken.example");
        let lifted: Vec<String> = (0..RUN).map(|n| format!("u{n}@broken.example")).collect();
        assert_eq!(
            word,
            Word::Doubted {
                of: "more than 5 mailboxes of broken.example in a row".into(),
                lift: lifted
            }
        );
        // Later ones lift nothing more; another domain is taken at its word.
        assert!(
            matches!(runs.refused("u10@BROKEN.example"), Word::Doubted { lift, .. } if lift.is_empty())
        );
        assert_eq!(
            runs.refused("x@fine.example"),
            Word::Taken { vouched: true }
        );
        // A mail taken for the domain ends its run.
        runs.took("ok@broken.example");
        assert!(matches!(
            runs.refused("u11@broken.example"),
            Word::Taken { .. }
        ));
    }

    #[test]
    fn a_run_across_domains_is_doubted_until_a_mail_is_taken() {
        let mut runs = Runs::default();
        for n in 0..RUN {
            assert_eq!(
                runs.refused(&format!("a@d{n}.example")),
                Word::Taken { vouched: false }
            );
        }
        assert!(
            matches!(runs.refused("a@d9.example"), Word::Doubted { of, lift } if of.contains("of any domain") && lift.len() == RUN)
        );
        // The same address again adds nothing to a run.
        let mut fresh = Runs::default();
        for _ in 0..10 {
            assert!(matches!(
                fresh.refused("same@x.example"),
                Word::Taken { .. }
            ));
        }
        runs.took("b@d1.example");
        assert!(matches!(runs.refused("c@d2.example"), Word::Taken { .. }));
    }

    /// A table broken for many domains, each of too few users for a run,
    /// amid mail to others: doubted once 5.1.1s are past the share of the
    /// latest outcomes, and the window's suppressions lifted.
    #[test]
    fn a_share_of_refusals_over_many_domains_is_doubted() {
        let mut runs = Runs::default();
        let mut doubted = None;
        for n in 0..40 {
            let word = runs.refused(&format!("u{}@d{}.example", n % 4, n / 4));
            runs.took("someone@fine.example");
            if doubted.is_none() && matches!(word, Word::Doubted { .. }) {
                doubted = Some((n, word));
            }
        }
        let Some((n, Word::Doubted { of, lift })) = doubted else {
            panic!("never doubted")
        };
        assert_eq!(n, SHARE_FROM - 1, "{of}");
        assert!(of.contains("many domains"), "{of}");
        assert_eq!(lift.len(), SHARE_FROM - 1);
        // A few percent of typos amid mail is believed.
        let mut runs = Runs::default();
        for n in 0..200 {
            match n % 20 {
                0 => assert!(matches!(
                    runs.refused(&format!("typo{n}@d{n}.example")),
                    Word::Taken { .. }
                )),
                _ => runs.took(&format!("u{n}@d{n}.example")),
            }
        }
    }

    #[test]
    fn domains_kept_are_bounded() {
        let mut runs = Runs::default();
        for n in 0..3 * DOMAINS_KEPT {
            runs.refused(&format!("a@d{n}.example"));
            runs.took("b@elsewhere.example");
        }
        assert!(runs.by_domain.len() <= DOMAINS_KEPT);
        assert!(runs.taken.len() <= DOMAINS_KEPT + 1);
    }
}
