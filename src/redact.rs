//! What may be shown of a secret: URLs with their passwords hidden, and
//! the types that hold secrets in settings.
//!
//! Settings are logged (`Debug`), quoted in errors and shown by
//! `check-config`; a URL there may carry a password in its userinfo or its
//! query. [`SecretUrl`] and [`Secret`] hold such values so that neither
//! `Debug` nor `Display` can print them: code that needs the value itself
//! reads it explicitly ([`SecretUrl::as_str`], or through `Deref`).

use std::fmt;
use std::ops::Deref;

use serde::Deserialize;

/// A URL that may hold credentials (`amqp.url`, `redis.url`, `smtp.url`,
/// a relay's `url`), or a comma-separated list of them. `Debug` and
/// `Display` show it as [`redact_url`] does; the URL itself, credentials
/// and all, is [`Self::as_str`]. Deserialized exactly as a `String`.
#[derive(Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct SecretUrl(String);

impl SecretUrl {
    /// The URL itself, credentials and all: for connecting, never for
    /// showing.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Deref for SecretUrl {
    type Target = str;

    fn deref(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for SecretUrl {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl From<String> for SecretUrl {
    fn from(url: String) -> Self {
        Self(url)
    }
}

impl From<&str> for SecretUrl {
    fn from(url: &str) -> Self {
        Self(url.to_owned())
    }
}

impl fmt::Debug for SecretUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&redact_url(&self.0), f)
    }
}

impl fmt::Display for SecretUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&redact_url(&self.0))
    }
}

/// A password (already taken out of its URL and percent-decoded): `Debug`
/// shows `"***"`; the value itself is read through `Deref` or `AsRef`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Deref for Secret {
    type Target = str;

    fn deref(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for Secret {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl From<String> for Secret {
    fn from(secret: String) -> Self {
        Self(secret)
    }
}

impl From<&str> for Secret {
    fn from(secret: &str) -> Self {
        Self(secret.to_owned())
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt("***", f)
    }
}

/// A URL with its password hidden, for logs and messages:
/// `scheme://user:***@host...`. Where a password cannot be told apart from
/// the rest (the URL does not parse, or its authority has no `@` but a `:`
/// followed by something that is not a port, as in a mistyped
/// `amqp://guest:secret127.0.0.1:5672`), the whole authority is hidden:
/// `scheme://***/...`.
/// A list of URLs (several nodes, separated by commas) is redacted URL by
/// URL.
pub fn redact_url(url: &str) -> String {
    url_list(url)
        .into_iter()
        .map(|url| hide_query_secrets(&redact_userinfo(url)))
        .collect::<Vec<_>>()
        .join(",")
}

/// The URLs of a comma-separated list, trimmed: it is split only at a comma
/// followed by another `scheme://`, so a comma inside a URL (in a password,
/// or between a cluster URL's hosts) stays where it is.
pub(crate) fn url_list(urls: &str) -> Vec<&str> {
    let starts_url = |s: &str| {
        s.trim_start().split_once("://").is_some_and(|(scheme, _)| {
            !scheme.is_empty()
                && scheme
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c))
        })
    };
    let mut list = Vec::new();
    let mut start = 0;
    for (i, _) in urls.match_indices(',') {
        if starts_url(&urls[i + 1..]) {
            list.push(urls[start..i].trim());
            start = i + 1;
        }
    }
    list.push(urls[start..].trim());
    list
}

/// The values of query parameters that carry credentials (`pass`,
/// `password`, `user`, `username`, as the redis crate reads them for socket
/// URLs), hidden.
fn hide_query_secrets(url: &str) -> String {
    let Some((head, query)) = url.split_once('?') else {
        return url.to_owned();
    };
    let (query, fragment) = match query.split_once('#') {
        Some((q, f)) => (q, Some(f)),
        None => (query, None),
    };
    let pairs: Vec<String> = query
        .split('&')
        .map(|pair| match pair.split_once('=') {
            Some((k, _))
                if [
                    "pass",
                    "password",
                    "user",
                    "username",
                    "sentinel_password",
                    "sentinel_username",
                ]
                .iter()
                .any(|s| k.eq_ignore_ascii_case(s)) =>
            {
                format!("{k}=***")
            }
            _ => pair.to_owned(),
        })
        .collect();
    let mut out = format!("{head}?{}", pairs.join("&"));
    if let Some(f) = fragment {
        out.push('#');
        out.push_str(f);
    }
    out
}

/// [`redact_url`]'s first step: the password in the userinfo.
fn redact_userinfo(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return "***".to_owned();
    };
    // Everything up to the last '@' may be userinfo, even past a '/', '?'
    // or '#' (a password that holds one, not percent-encoded).
    let (userinfo, rest) = match rest.rsplit_once('@') {
        Some((userinfo, rest)) => (Some(userinfo), rest),
        None => (None, rest),
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let list = scheme.ends_with("+sentinel") || scheme.ends_with("+cluster");
    let hidden = || format!("{scheme}://***{tail}");
    if let Some(userinfo) = userinfo {
        // user[:password]@host: keep the user and the host.
        let user = userinfo.split(':').next().unwrap_or("");
        if !plain_host(authority, list) || user.contains(['/', '?', '#']) {
            return hidden();
        }
        return format!("{scheme}://{user}:***@{authority}{tail}");
    }
    if plain_host(authority, list) {
        return url.to_owned();
    }
    // `host:` and something not a port: it may be `user:password` with
    // the '@' left out, so only what follows the first ':' is hidden.
    match authority.split_once(':') {
        Some((host, _)) if !list && !host.is_empty() && !host.starts_with('[') => {
            format!("{scheme}://{host}:***{tail}")
        }
        _ => hidden(),
    }
}

/// Whether an authority without userinfo is just `host` or `host:port`
/// (an IPv6 host in brackets), or, with `list`, a comma-separated list of
/// them (a sentinel URL's), so it cannot hold a password.
fn plain_host(authority: &str, list: bool) -> bool {
    if list {
        authority.split(',').all(plain_host_one)
    } else {
        plain_host_one(authority)
    }
}

/// [`plain_host`] for one `host[:port]`.
fn plain_host_one(authority: &str) -> bool {
    let after_v6 = match authority.strip_prefix('[') {
        Some(v6) => match v6.split_once(']') {
            Some((_, after)) => after,
            None => return false,
        },
        None => authority,
    };
    let host_end = if authority.starts_with('[') {
        authority.len() - after_v6.len()
    } else {
        0
    };
    let rest = &authority[host_end..];
    match rest.split_once(':') {
        None => true,
        Some((_, port)) => port.bytes().all(|b| b.is_ascii_digit()),
    }
}

/// `text` with every mailbox in it masked to its first character and domain
/// (`john@example.com` → `j***@example.com`), for log lines that quote
/// other systems' messages (SMTP replies often quote the recipient).
pub fn mask_emails(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find('@') {
        let is_local = |c: char| c.is_alphanumeric() || "!#$%&'*+-/=?^_`{|}~.".contains(c);
        // A quoted local part (`"jane q doe"@…`) is hidden whole.
        let quoted = rest[..at]
            .strip_suffix('"')
            .and_then(|inner| inner.rfind('"'));
        let start = quoted.unwrap_or_else(|| {
            rest[..at]
                .char_indices()
                .rev()
                .take_while(|(_, c)| is_local(*c))
                .last()
                .map_or(at, |(i, _)| i)
        });
        out.push_str(&rest[..start]);
        if quoted.is_some() {
            out.push_str("\"***\"");
        } else if start < at {
            let first = rest[start..].chars().next().unwrap_or('*');
            out.push(first);
            out.push_str("***");
        }
        out.push('@');
        rest = &rest[at + 1..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_redacted() {
        assert_eq!(
            redact_url("amqp://guest:secret@mq:5672/%2f"),
            "amqp://guest:***@mq:5672/%2f"
        );
        assert_eq!(
            redact_url("redis://127.0.0.1:6379/0"),
            "redis://127.0.0.1:6379/0"
        );
        // No '@': the password runs into the host; all after the first ':'
        // is hidden, so a bad port shows its host.
        assert_eq!(
            redact_url("amqp://guest:S3cretPw127.0.0.1:5672/%2f"),
            "amqp://guest:***/%2f"
        );
        assert_eq!(
            redact_url("smtp://relay.example:25x"),
            "smtp://relay.example:***"
        );
        assert_eq!(redact_url("S3cret"), "***");
        assert_eq!(redact_url("redis://[::1]:6379/0"), "redis://[::1]:6379/0");
        assert_eq!(
            redact_url("smtp://u:p%40ss@mail.example.com?tls=required"),
            "smtp://u:***@mail.example.com?tls=required"
        );
        // A password holding '/', '?', '#' or '@' (not percent-encoded).
        for (url, shown) in [
            (
                "amqp://guest:Xk9p/Qr7sLm2@127.0.0.1:5672/%2f",
                "amqp://guest:***@127.0.0.1:5672/%2f",
            ),
            (
                "redis://:Xk9p?Qr7sLm2@127.0.0.1:6379/0",
                "redis://:***@127.0.0.1:6379/0",
            ),
            (
                "smtp://user:8462/Qr#7@s@127.0.0.1:2525",
                "smtp://user:***@127.0.0.1:2525",
            ),
        ] {
            assert_eq!(redact_url(url), shown);
        }
        // Credentials in the query, as the redis crate reads them for sockets.
        assert_eq!(
            redact_url("redis+unix:///tmp/x.sock?db=1&user=u&pass=SEKRET1"),
            "redis+unix:///tmp/x.sock?db=1&user=***&pass=***"
        );
    }

    #[test]
    fn secrets_print_redacted_and_read_whole() {
        let url = SecretUrl::from("amqp://guest:Zq8pXk2m@mq:5672/%2f");
        assert_eq!(format!("{url:?}"), r#""amqp://guest:***@mq:5672/%2f""#);
        assert_eq!(url.to_string(), "amqp://guest:***@mq:5672/%2f");
        assert_eq!(url.as_str(), "amqp://guest:Zq8pXk2m@mq:5672/%2f");
        let password = Some(Secret::from("Zq8pXk2m"));
        assert_eq!(format!("{password:?}"), r#"Some("***")"#);
        assert_eq!(password.as_deref(), Some("Zq8pXk2m"));
    }

    proptest::proptest! {
        /// However a URL is shaped, its printed form never shows the password.
        #[test]
        fn no_printed_url_shows_its_password(
            scheme in "(amqp|amqps|redis|rediss|redis\\+sentinel|redis\\+cluster|smtp|smtps|x)",
            user in "[a-zA-Z0-9._~%!$&'()*+,;=-]{0,12}",
            password in "[a-zA-Z0-9._~%!$&'()*+,;=:/?#@-]{5,24}[a-zA-Z._~%!$&'()*+,;=/?#-]",
            host in "[a-z0-9.-]{0,12}",
            port in proptest::option::of(0u32..70000),
            tail in "[a-zA-Z0-9/%?=&#@:._-]{0,20}",
            at in proptest::bool::ANY,
        ) {
            let port = port.map(|p| format!(":{p}")).unwrap_or_default();
            let sep = if at { "@" } else { "" };
            let url = format!("{scheme}://{user}:{password}{sep}{host}{port}{tail}");
            let shown = redact_url(&url);
            // A password is a secret only where it could be one: at least
            // six characters not all found elsewhere in the URL by chance.
            let elsewhere = format!("{scheme}://{user}:{sep}{host}{port}{tail}");
            proptest::prop_assume!(!elsewhere.contains(&password));
            // Without an '@', a "password" holding '/', '?' or '#' is a
            // host, port and path by the URL's own syntax (`amqp://guest:5/x`
            // is host guest, port 5, vhost x): nothing marks it secret.
            proptest::prop_assume!(at || !password.contains(['/', '?', '#', '@']));
            // Nor is one holding ',' in a Sentinel or cluster URL: the next
            // host.
            proptest::prop_assume!(at || !scheme.contains('+') || !password.contains(','));
            proptest::prop_assert!(!shown.contains(&password), "{url} -> {shown}");
        }
    }

    #[test]
    fn masks_mailboxes_in_text() {
        assert_eq!(
            mask_emails("SMTP 550: <john.doe+x@example.com> unknown, cc a@b.c"),
            "SMTP 550: <j***@example.com> unknown, cc a***@b.c"
        );
        assert_eq!(mask_emails("no address here"), "no address here");
        assert_eq!(
            mask_emails(r#"SMTP 550 <"quoted.rcpt victim"@example.com> unknown"#),
            r#"SMTP 550 <"***"@example.com> unknown"#
        );
        assert_eq!(mask_emails("@start"), "@start");
    }
}
