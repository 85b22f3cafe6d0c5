use std::collections::BTreeMap;
use std::fmt;

use super::{EmailAddress, InvalidInput, IpKey, JobId};

/// A parsed "send a code" job. Every field has passed its parser, so the
/// stages after the edge never see malformed input.
#[derive(Debug, Clone)]
pub struct Job {
    /// The idempotency key.
    pub id: JobId,
    /// Where the code goes.
    pub email: EmailAddress,
    /// Who asked for it, if the producer knows.
    pub ip: Option<IpKey>,
    /// The code itself; never logged.
    pub code: Code,
    /// Which template set to use.
    pub purpose: Name,
    /// The requested locale, if any; the templates stage falls back from it.
    pub locale: Option<Name>,
    /// Extra template variables: rendered as text, never as template code.
    pub vars: Vars,
    /// After this instant the code is useless and is not sent.
    pub expires_at: Option<jiff::Timestamp>,
    /// When the producer made the job: which of two jobs for a mailbox is
    /// the newer, for `supersede`.
    pub created_at: Option<jiff::Timestamp>,
    /// The attempt (sign-up, login, reset) the producer sent it for: only
    /// a newer job of the same session supersedes this one.
    pub session: Option<Session>,
    /// The producer vouches that the mailbox belongs to an existing,
    /// verified account: the domain scope (a defence against catch-all
    /// farming, which makes new accounts) neither counts nor judges it.
    pub known_mailbox: bool,
}

/// Who asked for a code, as the producer names it: the sign-up, login or
/// password-reset attempt (`session`). A job is superseded only by a newer
/// one of the same requester, so a stranger asking for the same mailbox
/// cannot cancel its owner's code. It may be a session token: only its
/// digest is kept (compared, hashed into a key), never the text, and any
/// non-empty string is one (refusing long or odd ones would make an
/// existing producer's jobs invalid).
#[derive(Clone, PartialEq, Eq)]
pub struct Session([u8; 16]);

impl Session {
    /// The session named `text`; none for an empty one.
    pub fn of(text: &str) -> Option<Self> {
        use sha2::Digest;
        if text.is_empty() {
            return None;
        }
        let digest = sha2::Sha256::digest(text.as_bytes());
        let mut out = [0u8; 16];
        out.copy_from_slice(&digest[..16]);
        Some(Self(out))
    }

    /// Its digest: what tells two sessions apart.
    pub fn digest(&self) -> &[u8; 16] {
        &self.0
    }
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Session(…)")
    }
}

impl Job {
    /// The purpose used when a job names none.
    pub const DEFAULT_PURPOSE: &'static str = "verify";

    /// How long a variable's value must be, in characters, to be hidden
    /// in text that may quote the mail ([`Job::hide_in`]): a link or a
    /// token is longer; a shorter value would hide words of a relay's own
    /// reply ("user", "unknown").
    pub const HIDDEN_VAR_CHARS: usize = 8;

    /// `text` (an error from elsewhere, such as a relay that quotes the
    /// rejected mail) with this job's code hidden ([`Code::hide_in`]), and
    /// the values of its variables as the mail shows them (text, and
    /// numbers as written; at least [`Job::HIDDEN_VAR_CHARS`] characters),
    /// in the same forms: a variable may carry a link with a token, which
    /// no log, result or dead letter may show.
    pub fn hide_in(&self, text: &str) -> String {
        let values: Vec<String> = (self.vars.iter())
            .filter_map(|(_, v)| match v {
                VarValue::Text(s) | VarValue::Number(s) => Some(s.clone()),
                VarValue::Integer(n) => Some(n.to_string()),
                VarValue::Float(f) => Some(f.to_string()),
                VarValue::Bool(_) => None,
            })
            .filter(|v| v.chars().count() >= Self::HIDDEN_VAR_CHARS)
            .collect();
        let mut secrets: Vec<&str> = vec![self.code.expose()];
        secrets.extend(values.iter().map(String::as_str));
        super::hide::hide(&secrets, text)
    }
}

/// The verification code: 1 to 64 characters, no whitespace or control
/// characters. Its `Debug` hides it, so a code never reaches a log line.
#[derive(Clone, PartialEq, Eq)]
pub struct Code(String);

impl Code {
    /// The longest code accepted.
    pub const MAX_CHARS: usize = 64;

    /// Parses a code.
    pub fn parse(input: &str) -> Result<Self, InvalidInput> {
        let n = input.chars().count();
        if n == 0 || n > Self::MAX_CHARS {
            return Err(InvalidInput::Field {
                field: "code",
                reason: "must be 1 to 64 characters",
            });
        }
        if input.chars().any(|c| c.is_control() || c.is_whitespace()) {
            return Err(InvalidInput::Field {
                field: "code",
                reason: "must not contain whitespace or control characters",
            });
        }
        Ok(Self(input.to_owned()))
    }

    /// The code, for the one place that needs it: the mail body.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// `text` (an error from elsewhere, such as a relay that quotes the
    /// rejected mail) with this code hidden: as written, escaped for HTML,
    /// quoted-printable (lines unfolded), and every base64 run and encoded
    /// word, which may carry it unsearchably, hidden whole. A code shorter
    /// than 4 characters is not searched for: it would hide unrelated
    /// text, and a code that short guards nothing.
    pub fn hide_in(&self, text: &str) -> String {
        super::hide::hide(&[&self.0], text)
    }
}

impl fmt::Debug for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Code(***)")
    }
}

/// A purpose or locale name: 1 to 64 of `A-Z a-z 0-9 - _`. Nothing else can
/// pass, so a name can never reach outside the template directory or into a
/// header.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Name(String);

impl Name {
    /// The longest name accepted.
    pub const MAX_CHARS: usize = 64;

    /// Parses a name; `field` names it in the error.
    pub fn parse(field: &'static str, input: &str) -> Result<Self, InvalidInput> {
        let ok = !input.is_empty()
            && input.len() <= Self::MAX_CHARS
            && input
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if ok {
            Ok(Self(input.to_owned()))
        } else {
            Err(InvalidInput::Field {
                field,
                reason: "may hold only 1 to 64 letters, digits, '-' and '_'",
            })
        }
    }

    /// The name as given.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A template variable's value: text, a number or a truth value.
#[derive(Debug, Clone, PartialEq)]
pub enum VarValue {
    /// Text, at most [`Vars::MAX_VALUE_CHARS`] characters, no control characters.
    Text(String),
    /// A whole number that fits an `i128` and reads back as written, kept
    /// exact (so `12345678901234567890` renders as written, not as a float).
    Integer(i128),
    /// A fraction written in its shortest form (`1.5`, `-0.25`): a float
    /// that renders exactly as written, and templates can compute with it.
    Float(f64),
    /// Any other number (an exponent, `-0`, `1.50`, beyond `i128` or `f64`'s
    /// precision), kept as the producer wrote it and rendered as that text
    /// (templates cannot compute with it).
    Number(String),
    /// A truth value.
    Bool(bool),
}

impl VarValue {
    /// A JSON number, from its text as written: [`VarValue::Integer`] or
    /// [`VarValue::Float`] when that reads back as the same text, else
    /// [`VarValue::Number`].
    pub fn number(text: &str) -> Self {
        if let Ok(n) = text.parse::<i128>()
            && n.to_string() == text
        {
            return VarValue::Integer(n);
        }
        match text.parse::<f64>() {
            Ok(f) if text.contains('.') && f.to_string() == text => VarValue::Float(f),
            _ => VarValue::Number(text.to_owned()),
        }
    }
}

/// Extra template variables, by name. Bounded: at most [`Vars::MAX_VARS`]
/// names matching `[A-Za-z_][A-Za-z0-9_]{0,63}`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Vars(BTreeMap<String, VarValue>);

impl Vars {
    /// Most variables per job.
    pub const MAX_VARS: usize = 32;
    /// Longest text value, in characters.
    pub const MAX_VALUE_CHARS: usize = 1024;

    /// Checks and collects variables.
    pub fn parse(
        entries: impl IntoIterator<Item = (String, VarValue)>,
    ) -> Result<Self, InvalidInput> {
        let mut map = BTreeMap::new();
        for (name, value) in entries {
            let mut chars = name.chars();
            let name_ok = name.len() <= 64
                && chars
                    .next()
                    .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
            if !name_ok {
                return Err(InvalidInput::Field {
                    field: "vars",
                    reason: "names must match [A-Za-z_][A-Za-z0-9_]* and be at most 64 long",
                });
            }
            if let VarValue::Number(n) = &value
                && n.len() > Self::MAX_VALUE_CHARS
            {
                return Err(InvalidInput::Field {
                    field: "vars",
                    reason: "numbers must be at most 1024 characters",
                });
            }
            if let VarValue::Text(t) = &value {
                if t.chars().count() > Self::MAX_VALUE_CHARS {
                    return Err(InvalidInput::Field {
                        field: "vars",
                        reason: "text values must be at most 1024 characters",
                    });
                }
                if t.chars().any(char::is_control) {
                    return Err(InvalidInput::ControlCharacter { field: "vars" });
                }
            }
            map.insert(name, value);
            if map.len() > Self::MAX_VARS {
                return Err(InvalidInput::Field {
                    field: "vars",
                    reason: "at most 32 variables",
                });
            }
        }
        Ok(Self(map))
    }

    /// The variables, by name.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &VarValue)> {
        self.0.iter().map(|(k, v)| (k.as_str(), v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn code_is_never_printed() {
        let c = Code::parse("493817").unwrap();
        assert_eq!(format!("{c:?}"), "Code(***)");
        assert!(Code::parse("").is_err());
        assert!(Code::parse("12 34").is_err());
        assert!(Code::parse("12\r\n").is_err());
        assert!(Code::parse(&"9".repeat(65)).is_err());
    }

    #[test]
    fn names_cannot_traverse_or_inject() {
        for bad in [
            "",
            "../../etc/passwd",
            "a/b",
            "a.b",
            "zh CN",
            "x\r\nBcc: y",
            "é",
        ] {
            assert!(Name::parse("locale", bad).is_err(), "{bad:?}");
        }
        assert!(Name::parse("locale", "zh-CN").is_ok());
        assert!(Name::parse("purpose", "reset_password").is_ok());
    }

    #[test]
    fn vars_are_bounded() {
        let text = |s: &str| VarValue::Text(s.to_owned());
        assert!(Vars::parse([("app_name".to_owned(), text("Acme"))]).is_ok());
        assert!(Vars::parse([("app-name".to_owned(), text("Acme"))]).is_err());
        assert!(Vars::parse([("1x".to_owned(), text("Acme"))]).is_err());
        assert!(Vars::parse([("x".to_owned(), text("a\r\nb"))]).is_err());
        assert!(Vars::parse([("x".to_owned(), text(&"a".repeat(1025)))]).is_err());
        let many = (0..33).map(|i| (format!("v{i}"), VarValue::Bool(true)));
        assert!(Vars::parse(many).is_err());
    }
}
