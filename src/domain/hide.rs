//! Hiding a code in text that may quote the mail it went out in: a relay
//! that refuses a mail at the end of DATA may quote the message back, and
//! the mail carries the code as the templates wrote it, then as the
//! transfer encoding wrote that: escaped for HTML, quoted-printable (its
//! lines folded with soft breaks), or base64 (the body, or an RFC 2047
//! encoded word in the subject). Text refused in any of those forms must
//! not carry the code on into logs, results and the suppression list.

/// How long a run of base64 characters must be to be taken for an
/// encoded body line (76 characters a line) and hidden whole.
const BASE64_RUN: usize = 40;

/// `text` with `code` hidden (`***`) in each form a mail carries it in
/// (whole, or folded over two lines), and
/// with every base64 run and encoded word (which may carry it where no
/// search can find it) replaced. A code shorter than 4 characters is not
/// searched for: it would hide unrelated text.
pub(super) fn hide(code: &str, text: &str) -> String {
    let text = hide_encoded_words(text);
    let mut text = hide_base64_runs(&text);
    if code.chars().count() >= 4 {
        for form in forms(code) {
            text = text.replace(&form, "***");
            // Folded by a quoted-printable soft break anywhere in it.
            for (at, _) in form.char_indices().skip(1) {
                for soft in SOFT_BREAKS {
                    let folded = format!("{}{soft}{}", &form[..at], &form[at..]);
                    if text.contains(&folded) {
                        text = text.replace(&folded, "***");
                    }
                }
            }
        }
    }
    text
}

/// A quoted-printable soft line break, as a relay's reply may carry it:
/// the line's end as the mail had it, or as lettre joins the lines of a
/// multi-line reply (a space).
const SOFT_BREAKS: [&str; 3] = ["=\r\n", "=\n", "= "];

/// The forms a code takes in a mail: as written, escaped for HTML (as
/// minijinja escapes), and each of those quoted-printable (as lettre
/// encodes: uppercase hex). Longest first, so no form is cut by another.
fn forms(code: &str) -> Vec<String> {
    let html = escape_html(code);
    let mut forms = vec![
        quoted_printable(&html),
        quoted_printable(code),
        html,
        code.to_owned(),
    ];
    forms.sort_by_key(|f| std::cmp::Reverse(f.len()));
    forms.dedup();
    forms
}

/// `s` as minijinja's HTML auto-escaping writes it.
fn escape_html(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#x27;"),
            '/' => out.push_str("&#x2f;"),
            c => out.push(c),
        }
    }
    out
}

/// `s` quoted-printable: each byte outside `!`..=`~`, and `=`, as `=XX`.
fn quoted_printable(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if (b'!'..=b'~').contains(&b) && b != b'=' {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("={b:02X}"));
        }
    }
    out
}

/// `text` with each RFC 2047 encoded word (`=?charset?B|Q?…?=`) replaced
/// by `=?…?=`.
fn hide_encoded_words(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find("=?") {
        let word = &rest[start..];
        // charset ? encoding ? text ?=
        let end = encoded_word_len(word);
        out.push_str(&rest[..start]);
        match end {
            Some(len) => {
                out.push_str("=?…?=");
                rest = &word[len..];
            }
            None => {
                out.push_str("=?");
                rest = &word[2..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// The length of the encoded word `word` begins with, if it begins with one.
fn encoded_word_len(word: &str) -> Option<usize> {
    let (charset, after) = word.strip_prefix("=?")?.split_once('?')?;
    let (encoding, after) = after.split_once('?')?;
    let text = &after[..after.find("?=")?];
    let token = |s: &str| !s.is_empty() && !s.contains(|c: char| c.is_whitespace() || c == '?');
    let word = token(charset)
        && matches!(encoding, "B" | "b" | "Q" | "q")
        && !text.contains(char::is_whitespace);
    word.then_some(2 + charset.len() + 1 + encoding.len() + 1 + text.len() + 2)
}

/// `text` with each run of at least [`BASE64_RUN`] base64 characters
/// replaced by `[base64]`.
fn hide_base64_runs(text: &str) -> String {
    let is_b64 = |c: char| c.is_ascii_alphanumeric() || matches!(c, '+' | '/' | '=');
    let mut out = String::with_capacity(text.len());
    let mut run = String::new();
    let flush = |run: &mut String, out: &mut String| {
        if run.len() >= BASE64_RUN {
            out.push_str("[base64]");
        } else {
            out.push_str(run);
        }
        run.clear();
    };
    for c in text.chars() {
        if is_b64(c) {
            run.push(c);
        } else {
            flush(&mut run, &mut out);
            out.push(c);
        }
    }
    flush(&mut run, &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_form_of_the_code_is_hidden() {
        for (code, quoted) in [
            ("PLAIN4455", "550 5.7.1 your mail said PLAIN4455, refused"),
            ("Zx=9Qp12", "550 5.7.1 > Your code: Zx=3D9Qp12"),
            ("ü8a7b6c5", "550 5.7.1 > Your code: =C3=BC8a7b6c5"),
            ("12<34>&56", "550 5.7.1 > <b>12&lt;34&gt;&amp;56</b>"),
            ("a/b'c\"d", "550 5.7.1 > a&#x2f;b&#x27;c&quot;d"),
            ("<é>&1", "550 5.7.1 > &lt;=C3=A9&gt;&amp;1"),
            ("ZZZZ99887766", "550 5.7.1 > is ZZZZ998=\r\n87766 ok"),
            ("ZZZZ99887766", "550 5.7.1 > is ZZZZ998= 87766 ok"),
            ("Zx=9Qp12", "550 5.7.1 > is Zx=3D9Q=\np12 ok"),
        ] {
            let hidden = hide(code, quoted);
            assert!(hidden.contains("***"), "{code}: {hidden}");
            for form in forms(code) {
                assert!(!hidden.contains(&form), "{code}: {hidden}");
            }
            for piece in ["998", "Q=", "87766", "p12", "4455", "8a7b6c5", "34", "#x2f"] {
                assert!(!hidden.contains(piece), "{code}: {hidden}");
            }
        }
    }

    #[test]
    fn encoded_words_and_base64_runs_are_hidden_whatever_the_code() {
        let subject = "550 5.7.1 > Subject: =?utf-8?b?w7w4YTdiNmM1?= (refused)";
        assert_eq!(
            hide("ü8a7b6c5", subject),
            "550 5.7.1 > Subject: =?…?= (refused)"
        );
        let body = format!(
            "550 5.7.1 > {}\r\n> 5L2g55qE",
            "5L2g55qE6aqM6K+B56CB5piv77yaMTIzNDU2".repeat(2)
        );
        assert_eq!(hide("123456", &body), "550 5.7.1 > [base64]\r\n> 5L2g55qE");
    }

    #[test]
    fn the_rest_of_the_text_is_left_as_it_was() {
        let text = "550 5.1.1 <victim@example.com>: Recipient address rejected: User unknown (=?x)";
        assert_eq!(hide("493817", text), text);
        assert_eq!(
            hide("abc", "abc is too short to hide"),
            "abc is too short to hide"
        );
    }
}
