use std::fmt;

use serde::Deserialize;

use super::InvalidInput;

/// Longest address SMTP can carry (RFC 5321: a 256-octet path minus `<>`).
const MAX_ADDRESS: usize = 254;
/// Longest local part (RFC 5321 §4.5.3.1.1).
const MAX_LOCAL: usize = 64;

/// A syntactically valid mailbox `local@domain`.
///
/// Invariants, established by [`EmailAddress::parse`]:
/// - no control character anywhere (so CR/LF can never reach a header);
/// - the local part is a dot-atom or a quoted string (RFC 5321, with UTF-8
///   allowed as in RFC 6531), at most 64 bytes;
/// - the domain is a valid host name of at least two labels; its ASCII
///   (punycode, lower-case) form is kept for delivery and for rate-limit keys,
///   so `bücher.example` and `xn--bcher-kva.example` are one domain.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct EmailAddress {
    /// `local@ascii-domain`, the form we deliver to.
    address: String,
    /// Byte index of the `@` in `address`.
    at: usize,
}

/// Which equivalences collapse different spellings of one mailbox into one
/// rate-limit key. Each step can be switched off; all are on by default,
/// because a mail bomber will use every spelling a provider accepts.
///
/// The domain is always compared case-insensitively and in its ASCII form,
/// and surrounding whitespace is always trimmed: neither can name a different
/// mailbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Normalization {
    /// Lower-case the local part (`John@x` = `john@x`).
    pub lowercase: bool,
    /// Drop a `+tag` from the local part (`john+spam@x` = `john@x`).
    pub strip_plus_tag: bool,
    /// Remove the dots of a gmail.com local part (`j.o.hn@gmail.com` = `john@gmail.com`).
    pub gmail_dots: bool,
    /// Treat googlemail.com as gmail.com.
    pub googlemail_alias: bool,
}

impl Default for Normalization {
    fn default() -> Self {
        Self {
            lowercase: true,
            strip_plus_tag: true,
            gmail_dots: true,
            googlemail_alias: true,
        }
    }
}

impl EmailAddress {
    /// Parses a mailbox as a producer sent it. Surrounding spaces are
    /// trimmed; everything else that is not a plain mailbox (display names,
    /// comments, domain literals, control characters) is refused.
    pub fn parse(input: &str) -> Result<Self, InvalidInput> {
        // Control characters are refused before trimming: a trailing CR/LF is
        // a sign of header splicing upstream, not padding.
        if input.chars().any(char::is_control) {
            return Err(InvalidInput::ControlCharacter { field: "email" });
        }
        let input = input.trim();
        if input.is_empty() {
            return Err(InvalidInput::EmailEmpty);
        }
        if input.len() > MAX_ADDRESS {
            return Err(InvalidInput::EmailTooLong { max: MAX_ADDRESS });
        }
        let syntax = |reason| InvalidInput::EmailSyntax { reason };
        let (local, domain) = input.rsplit_once('@').ok_or(syntax("no @"))?;
        if local.is_empty() {
            return Err(syntax("empty local part"));
        }
        if local.len() > MAX_LOCAL {
            return Err(syntax("local part longer than 64 bytes"));
        }
        if local.starts_with('"') {
            quoted_content(local).ok_or(syntax("bad quoted local part"))?;
        } else if !is_dot_atom(local) {
            return Err(syntax("local part has a character that needs quoting"));
        }
        let domain = ascii_domain(domain).ok_or(syntax("bad domain"))?;
        let address = format!("{local}@{domain}");
        if address.len() > MAX_ADDRESS {
            return Err(InvalidInput::EmailTooLong { max: MAX_ADDRESS });
        }
        Ok(Self {
            at: local.len(),
            address,
        })
    }

    /// The address to deliver to: the local part as given, the domain in
    /// lower-case ASCII.
    pub fn as_str(&self) -> &str {
        &self.address
    }

    /// The local part as given (possibly quoted).
    pub fn local(&self) -> &str {
        &self.address[..self.at]
    }

    /// The domain, lower-case ASCII (punycode for IDN).
    pub fn domain(&self) -> &str {
        &self.address[self.at + 1..]
    }

    /// This address as mail servers take it, for the suppression list: a
    /// quoted local part's content (RFC 5321 §4.1.2: `"jane"@x` is
    /// `jane@x`), its ASCII letters lower-cased, `@`, the domain. Nothing
    /// else is folded (no `+tag`, no Unicode case, no provider's aliases),
    /// unlike [`EmailAddress::mailbox_key`]: a server's "no such mailbox"
    /// is about the address it was given, whose spelling an attacker
    /// chooses.
    pub fn address_key(&self) -> String {
        let raw = self.local();
        let local = match raw.starts_with('"') {
            // Parsing checked the quoting; the raw text if that changed.
            true => quoted_content(raw).unwrap_or_else(|| raw.to_owned()),
            false => raw.to_owned(),
        };
        let mut key = local.to_ascii_lowercase();
        key.push('@');
        key.push_str(self.domain());
        key
    }

    /// The rate-limit identity of this mailbox: every spelling that reaches the
    /// same inbox (under the steps `n` switches on) yields the same key.
    pub fn mailbox_key(&self, n: &Normalization) -> String {
        let mut key = String::with_capacity(self.address.len());
        self.push_mailbox_key(n, &mut key);
        key
    }

    /// Appends [`EmailAddress::mailbox_key`] to `out` (saves an allocation
    /// where the key is part of a longer string).
    pub fn push_mailbox_key(&self, n: &Normalization, out: &mut String) {
        let mut domain = self.domain();
        if n.googlemail_alias && domain == "googlemail.com" {
            domain = "gmail.com";
        }
        // A quoted local part whose content is a plain dot-atom is the same
        // mailbox as the unquoted one (RFC 5321 §4.1.2); compare contents.
        let raw = self.local();
        let unquoted;
        let mut local = raw;
        if raw.starts_with('"') {
            // Parsing checked the quoting, so this cannot fail; fall back to
            // the raw text rather than panic if that ever changed.
            unquoted = quoted_content(raw).unwrap_or_else(|| raw.to_owned());
            local = &unquoted;
        }
        if n.strip_plus_tag
            && let Some(i) = local.find('+').filter(|&i| i > 0)
        {
            local = &local[..i];
        }
        let drop_dots = n.gmail_dots && domain == "gmail.com";
        let chars = local.chars().filter(|&c| !(drop_dots && c == '.'));
        match (n.lowercase, local.is_ascii()) {
            (false, _) => out.extend(chars),
            (true, true) => out.extend(chars.map(|c| c.to_ascii_lowercase())),
            // Unicode's full case folding, as a case-insensitive mail
            // system compares: `ſ` is `s`, `ß` is `ss`, `ﬁ` is `fi`, and
            // `Σ`, `σ` and `ς` are one letter (lower-casing alone leaves
            // each of those a spelling of its own).
            (true, false) => out.extend(caseless::Caseless::default_case_fold(chars)),
        }
        out.push('@');
        out.push_str(domain);
    }
}

impl fmt::Display for EmailAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.address)
    }
}

impl fmt::Debug for EmailAddress {
    /// Debug output masks the local part: addresses are personal data and
    /// must not end up in logs by accident.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let local = self.local();
        let first = local.chars().next().unwrap_or('?');
        write!(f, "EmailAddress({first}***@{})", self.domain())
    }
}

/// RFC 5322 `atext`, extended with any non-ASCII character (RFC 6531).
fn is_atext(c: char) -> bool {
    c.is_ascii_alphanumeric() || "!#$%&'*+-/=?^_`{|}~".contains(c) || !c.is_ascii()
}

fn is_dot_atom(s: &str) -> bool {
    !s.is_empty()
        && s.split('.')
            .all(|atom| !atom.is_empty() && atom.chars().all(is_atext))
}

/// The unescaped content of a quoted string `"..."`, or `None` if it is not one.
fn quoted_content(s: &str) -> Option<String> {
    let inner = s.strip_prefix('"')?.strip_suffix('"')?;
    let mut out = String::with_capacity(inner.len());
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => out.push(chars.next()?),
            '"' => return None,
            c => out.push(c),
        }
    }
    if out.is_empty() { None } else { Some(out) }
}

/// The lower-case ASCII form of a host name, or `None` if it is not a valid
/// one with at least two labels (`user@localhost` is not a deliverable
/// address for a sign-up flow). A top-level label of digits alone is
/// refused (RFC 3696 §2): `1.2.3.04` is an IP address in disguise, which a
/// relay may deliver to, and each of its spellings would count as a domain
/// of its own (an address has dozens of spellings).
pub(super) fn ascii_domain(domain: &str) -> Option<String> {
    let ascii = idna::domain_to_ascii_strict(domain).ok()?;
    let labels_ok = ascii.split('.').all(|l| {
        !l.is_empty()
            && l.len() <= 63
            && !l.starts_with('-')
            && !l.ends_with('-')
            && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
    });
    let tld_ok = ascii
        .rsplit('.')
        .next()
        .is_some_and(|tld| !tld.chars().all(|c| c.is_ascii_digit()));
    // What a resolver's inet_aton reads as an IPv4 address: up to four
    // numbers, decimal, octal or hex (`0x1.0x2.0x3.0x4`).
    let number = |l: &str| match l.strip_prefix("0x") {
        Some(hex) => hex.chars().all(|c| c.is_ascii_hexdigit()),
        None => l.chars().all(|c| c.is_ascii_digit()),
    };
    let ipv4 = ascii.split('.').count() <= 4 && ascii.split('.').all(number);
    let tld_ok = tld_ok && !ipv4;
    (labels_ok && tld_ok && ascii.contains('.') && ascii.len() <= 253).then_some(ascii)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(s: &str) -> String {
        EmailAddress::parse(s)
            .unwrap()
            .mailbox_key(&Normalization::default())
    }

    #[test]
    fn spellings_of_one_mailbox_share_a_key() {
        let k = key("john@gmail.com");
        for s in [
            "  John@Gmail.com ",
            "j.o.h.n@gmail.com",
            "John.Doe+x@gmail.com".replace(".Doe", "").as_str(),
            "john+newsletter@googlemail.com",
            "J.OHN+a+b@GoogleMail.COM",
            "\"john\"@gmail.com",
        ] {
            assert_eq!(key(s), k, "{s}");
        }
    }

    /// Unicode's full case folding, as a case-insensitive mail system
    /// compares local parts: each of these is one mailbox.
    #[test]
    fn unicode_spellings_fold_as_a_mail_system_folds_them() {
        for (a, b) in [
            ("sally@corp.example", "\u{17f}ally@corp.example"),
            ("\u{3b1}\u{3c2}@corp.example", "\u{391}\u{3a3}@corp.example"),
            ("\u{3b1}\u{3c2}@corp.example", "\u{3b1}\u{3c3}@corp.example"),
            ("fiona@corp.example", "\u{fb01}ona@corp.example"),
            ("strasse@corp.example", "stra\u{df}e@corp.example"),
            ("strasse@corp.example", "STRA\u{1e9e}E@corp.example"),
            ("j\u{f6}hn@corp.example", "J\u{d6}HN@corp.example"),
            ("kim@corp.example", "\u{212a}im@corp.example"),
        ] {
            assert_eq!(key(a), key(b), "{a} {b}");
        }
        assert_ne!(key("sally@corp.example"), key("salty@corp.example"));
    }

    #[test]
    fn an_ip_address_in_disguise_is_not_a_domain() {
        for s in [
            "u@1.2.3.4",
            "u@1.2.3.04",
            "u@1.2.772",
            "u@1.131844",
            "u@0x1.0x2.0x3.4",
            "u@0x1.0x2.0x3.0x4",
            "u@0x7f.1",
        ] {
            assert!(EmailAddress::parse(s).is_err(), "{s}");
        }
        // Digits elsewhere are fine, and a top-level label may hold them.
        assert!(EmailAddress::parse("u@123.example.com").is_ok());
        assert!(EmailAddress::parse("u@0x1.example").is_ok());
        assert!(EmailAddress::parse("u@mail.xn--p1ai").is_ok());
    }

    #[test]
    fn dots_matter_outside_gmail() {
        assert_ne!(key("j.ohn@example.com"), key("john@example.com"));
        assert_eq!(key("J.Ohn+x@Example.com"), "j.ohn@example.com");
    }

    #[test]
    fn each_step_can_be_switched_off() {
        let a = EmailAddress::parse("J.Ohn+x@googlemail.com").unwrap();
        let off = Normalization {
            lowercase: false,
            strip_plus_tag: false,
            gmail_dots: false,
            googlemail_alias: false,
        };
        assert_eq!(a.mailbox_key(&off), "J.Ohn+x@googlemail.com");
        let only_alias = Normalization {
            googlemail_alias: true,
            ..off
        };
        assert_eq!(a.mailbox_key(&only_alias), "J.Ohn+x@gmail.com");
        let only_dots = Normalization {
            googlemail_alias: true,
            gmail_dots: true,
            ..off
        };
        assert_eq!(a.mailbox_key(&only_dots), "JOhn+x@gmail.com");
    }

    #[test]
    fn idn_domains_are_one_domain() {
        assert_eq!(
            key("User@Bücher.example"),
            key("user@xn--bcher-kva.example")
        );
        assert_eq!(
            EmailAddress::parse("a@BÜCHER.example").unwrap().domain(),
            "xn--bcher-kva.example"
        );
    }

    #[test]
    fn unicode_local_parts_are_lower_cased() {
        assert_eq!(key("ÜSER@example.com"), key("üser@example.com"));
    }

    #[test]
    fn quoted_local_parts() {
        let a = EmailAddress::parse("\"john doe\"@example.com").unwrap();
        assert_eq!(a.as_str(), "\"john doe\"@example.com");
        assert_eq!(
            a.mailbox_key(&Normalization::default()),
            "john doe@example.com"
        );
        assert!(EmailAddress::parse("\"a@b\"@example.com").is_ok());
        assert!(EmailAddress::parse("\"unterminated@example.com").is_err());
    }

    #[test]
    fn rejects_what_is_not_a_plain_mailbox() {
        for s in [
            "",
            "   ",
            "no-at.example.com",
            "@example.com",
            "user@",
            "user@localhost",
            "user@exa mple.com",
            "a b@example.com",
            "user@example.com\r\nBcc: victim@example.com",
            "user\n@example.com",
            "Name <user@example.com>",
            "user@[127.0.0.1]",
            ".user@example.com",
            "us..er@example.com",
            "user@-example.com",
            "user@example..com",
        ] {
            assert!(EmailAddress::parse(s).is_err(), "{s:?} should be invalid");
        }
        let long_local = format!("{}@example.com", "a".repeat(65));
        assert!(EmailAddress::parse(&long_local).is_err());
        let long = format!("a@{}.com", "b".repeat(260));
        assert!(EmailAddress::parse(&long).is_err());
    }

    #[test]
    fn crlf_is_a_control_character_error() {
        assert_eq!(
            EmailAddress::parse("a@example.com\r\nBcc: x@y.z"),
            Err(InvalidInput::ControlCharacter { field: "email" })
        );
    }

    #[test]
    fn debug_masks_the_mailbox() {
        let a = EmailAddress::parse("secret.person@example.com").unwrap();
        assert_eq!(format!("{a:?}"), "EmailAddress(s***@example.com)");
    }
}
