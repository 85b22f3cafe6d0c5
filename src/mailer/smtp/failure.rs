//! How a session step failed ([`Failed`]: its [`Phase`] and [`Fault`]),
//! and what that means: for the caller, a [`MailError`] by phase
//! ([`Failed::classify`]); for the relay's circuit, whether the failure is
//! the relay's ([`Failed::is_relay_fault`], [`Refusal`]).

use super::Endpoint;
use crate::mailer::MailError;

/// Where a session was when it failed, in the order a session goes
/// through them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Phase {
    /// TCP connect, implicit TLS, the greeting, EHLO.
    Connect,
    /// STARTTLS and the EHLO after it.
    StartTls,
    /// AUTH.
    Auth,
    /// NOOP (health checks only).
    Noop,
    /// MAIL FROM.
    MailFrom,
    /// RCPT TO.
    Rcpt,
    /// The DATA command.
    Data,
    /// Writing the message, before the final dot.
    Message,
    /// The final dot was written (or was being written); waiting for the reply.
    EndOfData,
}

/// What went wrong in one step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Fault {
    /// A 4xx or 5xx reply: the code and the server's text.
    Reply(u16, String),
    /// An I/O error, the connection closed (EOF), or a reply that cannot be
    /// read: the session is unusable.
    Broken(String),
    /// The send deadline passed during the step.
    Deadline,
    /// Found before sending anything: this server cannot do what is needed
    /// (STARTTLS, AUTH, SMTPUTF8, 8BITMIME). The text says what.
    Unsupported(String),
}

impl From<&lettre::transport::smtp::Error> for Fault {
    fn from(e: &lettre::transport::smtp::Error) -> Self {
        match e.status() {
            Some(code) => {
                let text = std::error::Error::source(e).map_or(String::new(), |s| s.to_string());
                Fault::Reply(code.into(), text)
            }
            None if e.is_client() => Fault::Unsupported(e.to_string()),
            None => Fault::Broken(e.to_string()),
        }
    }
}

/// What a 4xx or 5xx reply to RCPT, DATA or the message says it is about.
/// A refusal is this mail's answer, unless it might be the relay's,
/// whatever the mail (a relay that turns every mail away: one answering
/// `452 4.3.1` to every RCPT would fail every job while the standby got
/// none). Such a refusal is only a [`Refusal::Suspect`]: its words and codes
/// can come from a recipient (a domain the relay cannot reach answers
/// `451 4.4.1`, a relay that verifies recipients passes on `4.3.0`), so the
/// relays take it for the relay's only on evidence no recipient can fake
/// ([`crate::mailer::relays`]: a canary address the relay must take, or
/// suspects for several recipient domains in a row with no mail taken
/// between).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::mailer) enum Refusal {
    /// The mail or its mailbox: an unknown user (`X.1.x`), a mailbox full
    /// or disabled (`X.2.x`), a message too big (`X.3.4`) or unfit
    /// (`X.5.x`, `X.6.x`), any other code it cannot be read as the
    /// relay's: this mail's answer.
    Mail,
    /// It might be the relay's: an enhanced status code of the mail system
    /// (`X.3.x` but `X.3.4`), of the network and routing (`4.4.x`; a
    /// `5.4.x` is how some relays refuse a recipient) or of policy
    /// (`X.7.x`: relaying denied, a content filter, throttling); without
    /// one, `454` (SES's "Throttling failure"), a 4xx that says it throttles
    /// (its words read with the addresses the reply quotes taken out), or
    /// a bare `451`, `452` or `554`.
    Suspect,
}

impl Refusal {
    /// Reads a refusal's code and text (which starts with the enhanced
    /// status code, if the relay sends one: `4.3.1 insufficient system
    /// storage`).
    fn of(code: u16, text: &str) -> Self {
        let enhanced = enhanced(text);
        // The reply's words without the addresses it quotes: a recipient
        // named "throttle" must not read as a relay that throttles.
        let words: String = text
            .split_whitespace()
            .filter(|w| !w.contains('@') && !w.contains('<') && !w.contains('>'))
            .collect::<Vec<_>>()
            .join(" ")
            .to_ascii_lowercase();
        let throttles = ["rate limit", "rate-limit", "throttl", "too many"]
            .iter()
            .any(|w| words.contains(w));
        let transient = (400..500).contains(&code);
        match enhanced {
            Some(p) if p[1] == "3" && p[2] != "4" => Refusal::Suspect,
            Some(p) if p[1] == "4" && transient => Refusal::Suspect,
            Some(p) if p[1] == "7" => Refusal::Suspect,
            None if code == 454 || (transient && throttles) => Refusal::Suspect,
            None if matches!(code, 451 | 452 | 554) => Refusal::Suspect,
            Some(_) | None => Refusal::Mail,
        }
    }
}

/// The enhanced status code a reply's text begins with (RFC 3463: class,
/// subject, detail), if it has one of class 4 or 5.
fn enhanced(text: &str) -> Option<Vec<&str>> {
    text.split_whitespace()
        .next()
        .map(|c| c.split('.').collect::<Vec<_>>())
        .filter(|p| {
            p.len() == 3
                && p.iter()
                    .all(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        })
        .filter(|p| p[0] == "4" || p[0] == "5")
}

/// Whether a 5xx reply's text says the mailbox does not exist: its
/// enhanced status code is `5.1.1`.
fn no_mailbox(text: &str) -> bool {
    enhanced(text).is_some_and(|p| p == ["5", "1", "1"])
}

/// A failed session step: where, and what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(in crate::mailer) struct Failed {
    /// The step it failed in.
    pub(super) phase: Phase,
    /// What went wrong there.
    pub(super) fault: Fault,
}

impl Failed {
    /// A failure found before anything was sent: the server cannot do
    /// what `phase` needs, for the reason `why`.
    pub(super) fn unsupported(phase: Phase, why: String) -> Self {
        Self {
            phase,
            fault: Fault::Unsupported(why),
        }
    }

    /// Whether this is how a parked connection that died while idle fails:
    /// MAIL FROM met a closed or broken connection, or a 421 (the server is
    /// closing it). Nothing of the mail was accepted yet, so a transaction
    /// on a reused connection that fails this way may be tried once more on
    /// a fresh connection.
    pub(in crate::mailer) fn is_stale_connection(&self) -> bool {
        self.phase == Phase::MailFrom
            && matches!(self.fault, Fault::Broken(_) | Fault::Reply(421, _))
    }

    /// Whether this failure is the relay's rather than the mail's, so it
    /// counts against the relay's circuit: every [`MailError::Relay`]
    /// (session setup, MAIL FROM), and, later in the transaction, a 421
    /// (the server is closing the session: it is going down, whatever the
    /// mail), or a connection that broke or went silent (I/O error, EOF,
    /// the deadline), before or after the final dot. A 4xx or 5xx reply to
    /// RCPT, DATA or the message is about the mail and does not count (the
    /// relays judge a [`Refusal::Suspect`] on evidence of their own); nor
    /// does a mail this server cannot take (SMTPUTF8, 8BITMIME).
    pub(in crate::mailer) fn is_relay_fault(&self) -> bool {
        self.phase <= Phase::MailFrom
            || matches!(self.fault, Fault::Reply(421, _))
            || (matches!(self.fault, Fault::Broken(_) | Fault::Deadline) && !self.silent_at_rcpt())
    }

    /// Whether the connection broke or went silent at RCPT: a relay that
    /// checks its recipients as it takes them (their domain, their server)
    /// can stall on a recipient chosen to stall it, so this is only a
    /// suspect ([`Failed::suspect`]), not the relay's at once.
    fn silent_at_rcpt(&self) -> bool {
        self.phase == Phase::Rcpt && matches!(self.fault, Fault::Broken(_) | Fault::Deadline)
    }

    /// Whether this failure might be the relay's rather than the mail's,
    /// for the relays to judge on evidence: a [`Refusal::Suspect`], or a
    /// connection that broke or went silent at RCPT.
    pub(in crate::mailer) fn suspect(&self) -> bool {
        self.refusal() == Some(Refusal::Suspect) || self.silent_at_rcpt()
    }

    /// Whether it failed at RCPT (before any of the message was offered):
    /// a canary recipient can tell whether such a refusal is the relay's.
    pub(in crate::mailer) fn at_rcpt(&self) -> bool {
        self.phase == Phase::Rcpt
    }

    /// How a 4xx or 5xx reply to RCPT, DATA or the message reads; `None`
    /// for any other failure. See [`Refusal`].
    pub(in crate::mailer) fn refusal(&self) -> Option<Refusal> {
        let Fault::Reply(code, text) = &self.fault else {
            return None;
        };
        if self.phase < Phase::Rcpt || *code == 421 {
            return None;
        }
        Some(Refusal::of(*code, text))
    }

    /// The error for the caller, by phase:
    ///
    /// | phase | 4xx | 5xx | I/O, EOF, deadline | unsupported |
    /// |---|---|---|---|---|
    /// | connect, STARTTLS, AUTH, NOOP, MAIL FROM | Relay | Relay | Relay | Relay |
    /// | RCPT, DATA | Transient | Permanent | Transient | Permanent |
    /// | the message, before the final dot | – | – | Transient | – |
    /// | end of data (the dot was written) | Transient | Permanent | **Unknown** | – |
    ///
    /// A refusal the relays find to be the relay's ([`Refusal::Suspect`],
    /// on evidence) becomes a relay failure there.
    pub(in crate::mailer) fn classify(&self, endpoint: &Endpoint) -> MailError {
        let text = self.describe(endpoint);
        match (self.phase, &self.fault) {
            (Phase::Connect | Phase::StartTls | Phase::Auth | Phase::Noop | Phase::MailFrom, _) => {
                MailError::Relay(format!("relay: {text}"))
            }
            // 5.1.1: "bad destination mailbox address", the recipient's
            // own server's word that the mailbox does not exist.
            (_, Fault::Reply(code, reply)) if *code >= 500 && no_mailbox(reply) => {
                MailError::NoMailbox {
                    text,
                    relay: String::new(),
                    vouched: false,
                }
            }
            (_, Fault::Reply(code, _)) if *code >= 500 => MailError::Permanent(text),
            (_, Fault::Reply(..)) => MailError::Transient(text),
            (Phase::EndOfData, _) => MailError::Unknown(format!(
                "delivery unknown: {text}; the server may have the mail"
            )),
            (_, Fault::Unsupported(_)) => MailError::Permanent(text),
            (_, Fault::Broken(_) | Fault::Deadline) => MailError::Transient(text),
        }
    }

    fn describe(&self, endpoint: &Endpoint) -> String {
        let phase = match (self.phase, &self.fault) {
            (Phase::Connect, Fault::Reply(..)) => format!("the greeting or EHLO of {endpoint}"),
            (Phase::Connect, _) => format!("connecting to {endpoint}"),
            (Phase::StartTls, _) => format!("STARTTLS with {endpoint}"),
            (Phase::Auth, _) => format!("AUTH with {endpoint}"),
            (Phase::Noop, _) => format!("NOOP to {endpoint}"),
            (Phase::MailFrom, _) => "MAIL FROM".into(),
            (Phase::Rcpt, _) => "RCPT".into(),
            (Phase::Data, _) => "DATA".into(),
            (Phase::Message, _) => "writing the message".into(),
            (Phase::EndOfData, _) => "end of data".into(),
        };
        match &self.fault {
            Fault::Reply(code, text) => format!("SMTP {code} to {phase}: {text}"),
            // Plaintext where the TLS handshake should be, after the relay
            // agreed to STARTTLS: the port is right, so never advise a URL
            // without TLS (the session fails; nothing was sent).
            Fault::Broken(text)
                if self.phase == Phase::StartTls && text.contains("InvalidContentType") =>
            {
                format!(
                    "{phase}: the relay agreed to STARTTLS, then sent plaintext instead of \
                     the TLS handshake: something on the path is tampering with the session, \
                     or the relay is broken"
                )
            }
            Fault::Broken(text) => {
                // lettre repeats its sources ("Connection error: Connection
                // error: …"); a TLS failure is said with what to set.
                let table = &endpoint.tls_table;
                let text = crate::tls::explain(text, table, crate::tls::ClientCert::NotTaken)
                    .unwrap_or_else(|| crate::report::without_repeats(text));
                format!("{phase}: {text}")
            }
            Fault::Deadline => format!(
                "{phase}: the send deadline of {} passed",
                humantime::format_duration(endpoint.timeout)
            ),
            Fault::Unsupported(text) => text.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::session::tests::endpoint;
    use super::*;

    #[test]
    fn refusals_that_might_be_the_relays_are_suspects() {
        use Refusal::*;
        for (code, text, want) in [
            (452, "4.3.1 insufficient system storage", Suspect),
            (451, "4.3.0 other or undefined mail system status", Suspect),
            (554, "5.3.0 other mail system problem", Suspect),
            (451, "4.4.1 no answer from host", Suspect),
            (
                454,
                "Throttling failure: Maximum sending rate exceeded.",
                Suspect,
            ),
            (451, "4.7.1 rate limit exceeded", Suspect),
            (450, "too many messages, slow down", Suspect),
            (421, "4.7.28 rate limited, try later", Suspect),
            (554, "5.7.1 message refused by the content filter", Suspect),
            (451, "4.7.1 greylisted, try again later", Suspect),
            (
                450,
                "4.1.1 <throttle1@farm.example>: Recipient address rejected",
                Mail,
            ),
            (451, "<too.many@x.example> temporarily deferred", Suspect),
            (550, "<too.many@x.example> no such user", Mail),
            (550, "5.4.1 Recipient address rejected: Access denied", Mail),
            (552, "5.3.4 message too big for system", Mail),
            (552, "5.2.2 mailbox full", Mail),
            (550, "5.1.1 no such user", Mail),
            (550, "no such user", Mail),
            (451, "local error", Suspect),
            (452, "insufficient storage", Suspect),
            (554, "transaction failed", Suspect),
            (554, "5.x.y not a code", Suspect),
        ] {
            assert_eq!(Refusal::of(code, text), want, "{code} {text}");
        }
        // Suspects are the mail's answer until the relays find otherwise:
        // no relay failure, nothing against the circuit.
        let suspect = Failed {
            phase: Phase::Rcpt,
            fault: Fault::Reply(451, "4.4.1 no answer from host".into()),
        };
        assert_eq!(suspect.refusal(), Some(Suspect));
        assert!(!suspect.is_relay_fault());
        assert_eq!(class(Phase::Rcpt, suspect.fault), "transient");
    }

    fn class(phase: Phase, fault: Fault) -> &'static str {
        match (Failed { phase, fault }).classify(&endpoint("smtp://h")) {
            MailError::Relay(_) => "relay",
            MailError::Transient(_) => "transient",
            MailError::Permanent(_) => "permanent",
            MailError::NoMailbox { .. } | MailError::Untrusted { .. } => "no mailbox",
            MailError::Unknown(_) => "unknown",
            MailError::Config(_) | MailError::Address(_) => "other",
        }
    }

    #[test]
    fn failures_are_classified_by_phase() {
        use Phase::*;
        let reply = |c| Fault::Reply(c, "x".into());
        let broken = || Fault::Broken("network error".into());
        let unsupported = || Fault::Unsupported("x".into());
        for phase in [Connect, StartTls, Auth, Noop, MailFrom] {
            for fault in [
                reply(421),
                reply(550),
                broken(),
                Fault::Deadline,
                unsupported(),
            ] {
                assert_eq!(class(phase, fault.clone()), "relay", "{phase:?} {fault:?}");
            }
        }
        for phase in [Rcpt, Data, EndOfData] {
            assert_eq!(class(phase, reply(451)), "transient", "{phase:?}");
            assert_eq!(class(phase, reply(550)), "permanent", "{phase:?}");
        }
        for phase in [Rcpt, Data, Message] {
            assert_eq!(class(phase, broken()), "transient", "{phase:?}");
            assert_eq!(class(phase, Fault::Deadline), "transient", "{phase:?}");
        }
        assert_eq!(class(Rcpt, unsupported()), "permanent");
        assert_eq!(class(Data, unsupported()), "permanent");
        assert_eq!(class(EndOfData, broken()), "unknown");
        assert_eq!(class(EndOfData, Fault::Deadline), "unknown");
        // Only the recipient's server's 5.1.1 says the mailbox does not
        // exist; any other 5xx, a 4.1.1 or a 5.1.1 during the session's
        // setup says nothing of it.
        let said = |c, t: &str| Fault::Reply(c, t.into());
        for phase in [Rcpt, Data, EndOfData] {
            assert_eq!(class(phase, said(550, "5.1.1 no such user")), "no mailbox");
            assert_eq!(class(phase, said(550, "5.1.10 null MX")), "permanent");
            assert_eq!(class(phase, said(550, "5.7.1 relay denied")), "permanent");
            assert_eq!(class(phase, said(550, "no such user 5.1.1")), "permanent");
            assert_eq!(class(phase, said(450, "4.1.1 try later")), "transient");
        }
        assert_eq!(class(MailFrom, said(550, "5.1.1 sender")), "relay");
    }

    #[test]
    fn texts_name_the_code_and_the_phase() {
        let e = endpoint("smtp://mail.example.com:587");
        let rcpt = Failed {
            phase: Phase::Rcpt,
            fault: Fault::Reply(550, "5.1.1 no such user".into()),
        };
        assert_eq!(
            rcpt.classify(&e).to_string(),
            "SMTP 550 to RCPT: 5.1.1 no such user"
        );
        let late = Failed {
            phase: Phase::EndOfData,
            fault: Fault::Deadline,
        };
        assert_eq!(
            late.classify(&e).to_string(),
            "delivery unknown: end of data: the send deadline of 1s passed; the server may have the mail"
        );
        let tls = Failed::unsupported(
            Phase::StartTls,
            format!("STARTTLS required but not offered by {e}"),
        );
        assert_eq!(
            tls.classify(&e).to_string(),
            "relay: STARTTLS required but not offered by mail.example.com:587"
        );
    }

    #[test]
    fn relay_faults_are_the_sessions_never_the_mails() {
        use Phase::*;
        let f = |phase, fault| Failed { phase, fault }.is_relay_fault();
        for phase in [Connect, StartTls, Auth, Noop, MailFrom] {
            assert!(f(phase, Fault::Reply(550, "x".into())), "{phase:?}");
            assert!(f(phase, Fault::Unsupported("x".into())), "{phase:?}");
        }
        for phase in [Rcpt, Data, EndOfData] {
            assert!(!f(phase, Fault::Reply(451, "x".into())), "{phase:?}");
            assert!(!f(phase, Fault::Reply(550, "x".into())), "{phase:?}");
            assert!(f(phase, Fault::Reply(421, "x".into())), "{phase:?}");
        }
        for phase in [Data, Message, EndOfData] {
            assert!(f(phase, Fault::Broken("eof".into())), "{phase:?}");
            assert!(f(phase, Fault::Deadline), "{phase:?}");
        }
        // Silent at RCPT: a suspect, which a recipient can cause.
        for fault in [Fault::Broken("eof".into()), Fault::Deadline] {
            let failed = Failed { phase: Rcpt, fault };
            assert!(!failed.is_relay_fault() && failed.suspect(), "{failed:?}");
        }
        assert!(!f(Rcpt, Fault::Unsupported("SMTPUTF8".into())));
        assert!(!f(Data, Fault::Unsupported("8BITMIME".into())));
    }

    #[test]
    fn only_a_dead_connection_at_mail_from_is_stale() {
        let f = |phase, fault| Failed { phase, fault }.is_stale_connection();
        assert!(f(Phase::MailFrom, Fault::Broken("eof".into())));
        assert!(f(Phase::MailFrom, Fault::Reply(421, "bye".into())));
        assert!(!f(Phase::MailFrom, Fault::Reply(451, "later".into())));
        assert!(!f(Phase::MailFrom, Fault::Deadline));
        assert!(!f(Phase::Rcpt, Fault::Broken("eof".into())));
    }
}
