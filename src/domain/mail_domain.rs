use std::fmt;

use serde::Deserialize;

use super::email::ascii_domain;
use super::{EmailAddress, InvalidInput, Normalization};

/// The registrable domain of a mailbox: the part of its domain one party
/// owns, by the ICANN section of the public suffix list
/// (`a.b.example.co.uk` → `example.co.uk`), lower-case ASCII. It is what the `domain` scope counts, so a farmer who
/// owns a catch-all domain cannot spread requests over its sub-domains.
///
/// Invariants: a valid host name in lower-case ASCII, equal to its own
/// registrable domain. A name the list has no registrable part for (a
/// public suffix itself, such as `co.uk`) stands for itself.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RegistrableDomain(String);

impl RegistrableDomain {
    /// The registrable domain `email` is delivered to, with googlemail.com
    /// counted as gmail.com when `n` says the two are one.
    pub fn of(email: &EmailAddress, n: &Normalization) -> Self {
        let mut domain = email.domain();
        if n.googlemail_alias && domain == "googlemail.com" {
            domain = "gmail.com";
        }
        Self(registrable(domain).to_owned())
    }

    /// The registrable domain of any host name (`mail.example.com` →
    /// `example.com`), for the support tools.
    pub fn parse(input: &str) -> Result<Self, InvalidInput> {
        let ascii = ascii_domain(input.trim()).ok_or(InvalidInput::Domain(input.to_owned()))?;
        Ok(Self(registrable(&ascii).to_owned()))
    }

    /// A host name that must be a registrable domain itself: a list in the
    /// settings that named `mail.example.com` would match nothing, since
    /// mailboxes are counted under `example.com`.
    pub fn parse_exact(input: &str) -> Result<Self, InvalidInput> {
        let parsed = Self::parse(input)?;
        match ascii_domain(input.trim()) {
            Some(ascii) if ascii == parsed.0 => Ok(parsed),
            _ => Err(InvalidInput::NotRegistrable {
                given: input.to_owned(),
                registrable: parsed.0,
            }),
        }
    }

    /// The domain, lower-case ASCII.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether it is a public suffix itself (`co.uk`, `com`): no mailbox
    /// counts as it (`alice@acme.co.uk` counts as `acme.co.uk`).
    pub fn is_public_suffix(&self) -> bool {
        registrable(&self.0).len() == self.0.len()
            && psl::suffix(self.0.as_bytes()).is_some_and(|s| s.as_bytes().len() == self.0.len())
    }
}

/// The registrable part of a lower-case ASCII host name by the list's ICANN
/// section, or the name itself if it is a public suffix. A suffix of the
/// private section (`github.io`, `duckdns.org`) is a service's domain, not
/// a boundary: the names such services hand out for free count as the
/// service's, so a farmer cannot mint a domain per request.
fn registrable(ascii: &str) -> &str {
    let mut suffix = ascii;
    loop {
        let Some(found) = psl::suffix(suffix.as_bytes()) else {
            return ascii;
        };
        let found_str = &suffix[suffix.len() - found.as_bytes().len()..];
        if found.typ() != Some(psl::Type::Private) {
            suffix = found_str;
            break;
        }
        // A private suffix: look for the ICANN one above it.
        match found_str.split_once('.') {
            Some((_, parent)) => suffix = parent,
            None => return ascii,
        }
    }
    if suffix.len() >= ascii.len() {
        return ascii;
    }
    // One label more than the suffix.
    let head = &ascii[..ascii.len() - suffix.len() - 1];
    let start = head.rfind('.').map_or(0, |i| i + 1);
    &ascii[start..]
}

impl fmt::Display for RegistrableDomain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for RegistrableDomain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RegistrableDomain({})", self.0)
    }
}

impl<'de> Deserialize<'de> for RegistrableDomain {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Self::parse_exact(&s).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(s: &str) -> String {
        RegistrableDomain::of(&EmailAddress::parse(s).unwrap(), &Normalization::default()).0
    }

    #[test]
    fn sub_domains_count_as_their_registrable_domain() {
        assert_eq!(of("x@a.b.example.co.uk"), "example.co.uk");
        assert_eq!(of("x@Mail.Example.COM"), "example.com");
        assert_eq!(of("x@example.com"), "example.com");
        assert_eq!(of("x@mx.qq.com"), "qq.com");
        assert_eq!(of("x@bücher.example"), "xn--bcher-kva.example");
        // A public suffix has no registrable part: it stands for itself.
        assert_eq!(of("x@co.uk"), "co.uk");
        // A private suffix's names count as the service's: free to mint.
        assert_eq!(of("x@alice.github.io"), "github.io");
        assert_eq!(of("x@mx.farm1.duckdns.org"), "duckdns.org");
        assert_eq!(of("x@a.b.c.blogspot.co.uk"), "blogspot.co.uk");
    }

    #[test]
    fn googlemail_counts_as_gmail_when_mailboxes_do() {
        assert_eq!(of("x@googlemail.com"), "gmail.com");
        let n = Normalization {
            googlemail_alias: false,
            ..Normalization::default()
        };
        let e = EmailAddress::parse("x@googlemail.com").unwrap();
        assert_eq!(RegistrableDomain::of(&e, &n).as_str(), "googlemail.com");
    }

    #[test]
    fn settings_name_registrable_domains_exactly() {
        assert_eq!(
            RegistrableDomain::parse_exact("Gmail.com")
                .unwrap()
                .as_str(),
            "gmail.com"
        );
        assert_eq!(
            RegistrableDomain::parse_exact("mail.example.com"),
            Err(InvalidInput::NotRegistrable {
                given: "mail.example.com".into(),
                registrable: "example.com".into()
            })
        );
        assert!(RegistrableDomain::parse("not a domain").is_err());
        assert_eq!(
            RegistrableDomain::parse("a.b.example.co.uk")
                .unwrap()
                .as_str(),
            "example.co.uk"
        );
    }
}
