//! Hiding a code in text that may quote the mail it went out in: a relay
//! that refuses a mail at the end of DATA may quote the message back, and
//! the mail carries the code as the templates wrote it, then as the
//! transfer encoding wrote that: escaped for HTML, quoted-printable (its
//! lines folded with soft breaks), or base64 (the body, or RFC 2047
//! encoded words in the subject). The relay may then cut its reply into
//! lines anywhere, which lettre joins with spaces. Text refused in any of
//! those forms must not carry the code on into logs, results and the
//! suppression list.
//!
//! So the text is searched twice: as it is, and as a *view* without its
//! whitespace and soft breaks, where whatever the folding cut is whole
//! again. In the view, the code's textual forms are looked for, and each
//! base64 run and run of encoded words is decoded and hidden if what it
//! holds has the code; nothing else is touched.

use std::ops::Range;

/// `text` with each of `secrets` (a code, the values of a job's
/// variables) hidden (`***`) wherever the mail's forms of it appear, whole
/// or folded. A secret shorter than 4 characters is not searched for: it
/// would hide unrelated text, and one that short guards nothing.
pub(super) fn hide(secrets: &[&str], text: &str) -> String {
    let secrets: Vec<&str> = (secrets.iter().copied())
        .filter(|s| s.chars().count() >= 4)
        .collect();
    if secrets.is_empty() {
        return text.to_owned();
    }
    let htmls: Vec<String> = secrets.iter().map(|s| escape_html(s)).collect();
    let decoded: Vec<&[u8]> = (secrets.iter().map(|s| s.as_bytes()))
        .chain(htmls.iter().map(|h| h.as_bytes()))
        .collect();
    let view = View::of(text);
    let mut spans = Vec::new();
    for (secret, html) in secrets.iter().zip(&htmls) {
        for form in forms(secret, html) {
            spans.extend(text.match_indices(&form).map(|(at, f)| at..at + f.len()));
            // The view has no whitespace: nor may the form looked for there
            // (a secret of several words, cut anywhere).
            let compact: String = form.split_whitespace().collect();
            if compact.is_empty() {
                continue;
            }
            let folded = view.text.match_indices(&compact);
            spans.extend(folded.map(|(at, f)| view.original(at..at + f.len())));
        }
    }
    spans.extend(encoded_words(&view, &decoded));
    spans.extend(base64_runs(text, &view, &decoded));
    replace(text, spans)
}

/// The textual forms of a code in a mail: as written, escaped for HTML (as
/// minijinja escapes), and each of those quoted-printable (upper-case hex
/// as lettre writes it, lower-case as a relay may).
fn forms(code: &str, html: &str) -> Vec<String> {
    let mut forms = vec![code.to_owned(), html.to_owned()];
    for s in [code, html] {
        for escape_spaces in [true, false] {
            let qp = quoted_printable(s, escape_spaces);
            forms.push(lower_hex(&qp));
            forms.push(qp);
        }
    }
    forms.sort();
    forms.dedup();
    forms
}

/// The text without whitespace and without the `=` of quoted-printable
/// soft breaks, with where each of its bytes was.
struct View {
    text: String,
    /// The offset in the original text of each byte of `text`.
    at: Vec<usize>,
}

impl View {
    fn of(original: &str) -> View {
        let mut view = View {
            text: String::with_capacity(original.len()),
            at: Vec::with_capacity(original.len()),
        };
        let mut chars = original.char_indices().peekable();
        let mut last = ' ';
        while let Some((at, c)) = chars.next() {
            // A soft break: `=` at a line's end (or before the space lettre
            // joins a reply's lines with), but not the end of an encoded
            // word (`?=`).
            let soft_break =
                c == '=' && last != '?' && chars.peek().is_some_and(|(_, n)| n.is_whitespace());
            last = c;
            if c.is_whitespace() || soft_break {
                continue;
            }
            view.text.push(c);
            view.at.extend((0..c.len_utf8()).map(|k| at + k));
        }
        view
    }

    /// The original text's bytes that the view's `range` came from (with
    /// whatever whitespace lay between them).
    fn original(&self, range: Range<usize>) -> Range<usize> {
        self.at[range.start]..self.at[range.end - 1] + 1
    }
}

/// The spans of runs of RFC 2047 encoded words (`=?charset?B|Q?…?=`, one
/// after another in the view) whose decoded text holds one of `needles`.
fn encoded_words(view: &View, needles: &[&[u8]]) -> Vec<Range<usize>> {
    let mut words: Vec<(Range<usize>, Vec<u8>)> = Vec::new();
    let mut from = 0;
    while let Some(found) = view.text[from..].find("=?") {
        let start = from + found;
        match encoded_word(&view.text[start..]) {
            Some((len, bytes)) => {
                words.push((start..start + len, bytes));
                from = start + len;
            }
            None => from = start + 2,
        }
    }
    let mut spans = Vec::new();
    let mut run: Option<(Range<usize>, Vec<u8>)> = None;
    for (range, bytes) in words {
        run = match run {
            Some((r, mut held)) if r.end == range.start => {
                held.extend(bytes);
                Some((r.start..range.end, held))
            }
            other => {
                spans.extend(
                    other
                        .filter(|(_, held)| holds(held, needles))
                        .map(|(r, _)| r),
                );
                Some((range, bytes))
            }
        };
    }
    spans.extend(run.filter(|(_, held)| holds(held, needles)).map(|(r, _)| r));
    spans.into_iter().map(|r| view.original(r)).collect()
}

/// The length of the encoded word `word` begins with, and what it holds.
fn encoded_word(word: &str) -> Option<(usize, Vec<u8>)> {
    let (charset, after) = word.strip_prefix("=?")?.split_once('?')?;
    let (encoding, after) = after.split_once('?')?;
    let text = &after[..after.find("?=")?];
    if charset.is_empty() {
        return None;
    }
    let bytes = match encoding {
        "B" | "b" => decode_base64(text.as_bytes()),
        "Q" | "q" => decode_q(text.as_bytes()),
        _ => return None,
    };
    Some((
        2 + charset.len() + 1 + encoding.len() + 1 + text.len() + 2,
        bytes,
    ))
}

/// The spans of runs of base64 characters in the view (at least 8) that,
/// decoded from any of the four alignments, hold one of `needles`, with
/// the padding the view took for a soft break.
fn base64_runs(text: &str, view: &View, needles: &[&[u8]]) -> Vec<Range<usize>> {
    let is_b64 = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'=');
    let bytes = view.text.as_bytes();
    let mut spans = Vec::new();
    let mut start = 0;
    while start < bytes.len() {
        let len = bytes[start..].iter().take_while(|&&b| is_b64(b)).count();
        if len >= 8 {
            let run = &bytes[start..start + len];
            if (0..4).any(|skip| holds(&decode_base64(&run[skip..]), needles)) {
                let span = view.original(start..start + len);
                let padding = text[span.end..].bytes().take_while(|&b| b == b'=').count();
                spans.push(span.start..span.end + padding);
            }
        }
        start += len.max(1);
    }
    spans
}

/// Whether `haystack` holds one of `needles`.
fn holds(haystack: &[u8], needles: &[&[u8]]) -> bool {
    needles
        .iter()
        .any(|n| !n.is_empty() && haystack.windows(n.len()).any(|w| w == *n))
}

/// `s` decoded as base64, leniently: each group of four decoded on its own
/// (a group cut short by `=` gives what it has), anything else skipped.
fn decode_base64(s: &[u8]) -> Vec<u8> {
    let sextet = |c: u8| match c {
        b'A'..=b'Z' => Some(c - b'A'),
        b'a'..=b'z' => Some(c - b'a' + 26),
        b'0'..=b'9' => Some(c - b'0' + 52),
        b'+' => Some(62),
        b'/' => Some(63),
        _ => None,
    };
    let mut out = Vec::with_capacity(s.len() / 4 * 3);
    for group in s.chunks_exact(4) {
        let sextets: Vec<u8> = group.iter().map_while(|&c| sextet(c)).collect();
        let n = (sextets.iter())
            .chain(std::iter::repeat(&0))
            .take(4)
            .fold(0u32, |n, &v| n << 6 | u32::from(v));
        let [_, a, b, c] = n.to_be_bytes();
        out.extend_from_slice(&[a, b, c][..sextets.len().saturating_sub(1)]);
    }
    out
}

/// `s` decoded as an encoded word's Q encoding (`_` a space, `=XX` a byte).
fn decode_q(s: &[u8]) -> Vec<u8> {
    let hex = |c: u8| {
        char::from(c)
            .to_digit(16)
            .and_then(|d| u8::try_from(d).ok())
    };
    let mut out = Vec::with_capacity(s.len());
    let mut i = 0;
    while i < s.len() {
        match (
            s[i],
            s.get(i + 1).copied().and_then(hex),
            s.get(i + 2).copied().and_then(hex),
        ) {
            (b'=', Some(h), Some(l)) => {
                out.push(h << 4 | l);
                i += 3;
            }
            (b'_', _, _) => {
                out.push(b' ');
                i += 1;
            }
            (c, _, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    out
}

/// `text` with each of `spans` (merged where they touch) replaced by `***`.
fn replace(text: &str, mut spans: Vec<Range<usize>>) -> String {
    spans.sort_by_key(|r| (r.start, r.end));
    let mut out = String::with_capacity(text.len());
    // The end of the last span hidden, once one is.
    let mut done: Option<usize> = None;
    for span in spans {
        match done {
            Some(end) if span.start <= end => done = Some(end.max(span.end)),
            _ => {
                out.push_str(&text[done.unwrap_or(0)..span.start]);
                out.push_str("***");
                done = Some(span.end);
            }
        }
    }
    out.push_str(&text[done.unwrap_or(0)..]);
    out
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

/// `s` quoted-printable: each byte outside `!`..=`~`, and `=`, as `=XX`;
/// a space as `=20` with `escape_spaces`, else as itself (as lettre writes
/// one inside a line).
fn quoted_printable(s: &str, escape_spaces: bool) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if ((b'!'..=b'~').contains(&b) && b != b'=') || (b == b' ' && !escape_spaces) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("={b:02X}"));
        }
    }
    out
}

/// `qp` with the hex digits of its `=XX` escapes in lower case.
fn lower_hex(qp: &str) -> String {
    let mut out = String::with_capacity(qp.len());
    let mut escape = 0;
    for c in qp.chars() {
        if c == '=' {
            escape = 2;
            out.push(c);
        } else if escape > 0 {
            escape -= 1;
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use base64::Engine as _;
    use base64::engine::general_purpose::STANDARD;

    use super::*;

    /// Asserts `code` is hidden in `quoted`, and no piece of it is left.
    fn hidden(code: &str, quoted: &str) -> String {
        let out = hide(&[code], quoted);
        assert!(out.contains("***"), "{code}: {out}");
        assert!(!View::of(&out).text.contains(code), "{code}: {out}");
        out
    }

    #[test]
    fn every_form_of_the_code_is_hidden_whole_or_folded() {
        for (code, quoted) in [
            ("PLAIN4455", "550 5.7.1 your mail said PLAIN4455, refused"),
            ("Zx=9Qp12", "550 5.7.1 > Your code: Zx=3D9Qp12"),
            ("ü8a7b6c5", "550 5.7.1 > Your code: =C3=BC8a7b6c5"),
            ("12<34>&56", "550 5.7.1 > <b>12&lt;34&gt;&amp;56</b>"),
            ("a/b'c\"d", "550 5.7.1 > a&#x2f;b&#x27;c&quot;d"),
            ("<é>&1", "550 5.7.1 > &lt;=C3=A9&gt;&amp;1"),
            ("Zé1=Q9x/", "550 5.7.1 rejected: Z=c3=a91=3dQ9x&#x2f;"),
            ("ZZZZ99887766", "550 5.7.1 > is ZZZZ998=\r\n87766 ok"),
            ("ZZZZ99887766", "550 5.7.1 > is ZZZZ998= 87766 ok"),
            ("Zx=9Qp12", "550 5.7.1 > is Zx=3D9Q=\np12 ok"),
            ("482915", "5.7.1 rejected content: ...48 29 15 end"),
            ("abc=", "550 your code abc= was refused"),
        ] {
            let out = hidden(code, quoted);
            for piece in [
                "998", "87766", "p12", "4455", "8a7b6c5", "34", "#x2f", "Q9x", "48 29",
            ] {
                assert!(!out.contains(piece), "{code}: {out}");
            }
        }
    }

    #[test]
    fn base64_and_encoded_words_holding_the_code_are_hidden_even_cut_up() {
        let line = STANDARD.encode("验证码：736251\r\n\r\n如果不是您本人操作，请忽略。");
        let (a, b) = line.split_at(30);
        let out = hidden("736251", &format!("550 5.7.1 > {a} {b} (end)"));
        assert_eq!(out, "550 5.7.1 > *** (end)");
        // A body line the code begins, the next line ends.
        let body = STANDARD.encode("0123456789ab Your code: 736251 thanks");
        let (a, b) = body.split_at(28);
        hidden("736251", &format!("550 > {a}\r\n550 > {b}"));
        // A subject lettre folded into two words, cut inside the code.
        let subject = "=?utf-8?b?6aqM6K+B56CB77yaNzM2?= =?utf-8?b?MjUx?=";
        let out = hidden("736251", &format!("550 > Subject: {subject} (refused)"));
        assert_eq!(out, "550 > Subject: *** (refused)");
        // One word cut by the relay's reply lines; and Q encoding.
        hidden("736251", "550 > =?utf-8?b?6aqM6K+B56C B77yaNzM2MjUx?=");
        hidden("736251", "550 > =?utf-8?q?code_=37=33=36251?=");
    }

    #[test]
    fn every_secret_is_hidden_in_every_form() {
        let link = "https://app.example/verify?token=tok_5ecret_value";
        let html = escape_html(link);
        let quoted = format!(
            "554 5.7.1 refused: code 493817 at {} and {}",
            quoted_printable(&html, true),
            STANDARD.encode(format!("open {link} now"))
        );
        let out = hide(&["493817", link], &quoted);
        assert!(!out.contains("493817") && !out.contains("5ecret"), "{out}");
        assert!(!out.contains("tok_"), "{out}");
        assert!(out.starts_with("554 5.7.1 refused: code ***"), "{out}");
        // Words with spaces, which quoted-printable keeps as they are, cut
        // by a soft break anywhere.
        let name = "Zürich Büro geheim 98765";
        for quoted in [
            "550 5.1.1 > Hello Z=C3=BCrich B=C3=BCro geheim 98765, here",
            "550 5.1.1 > Hello Z=C3=BCrich B=C3=BCro gehe= im 98765, here",
            "550 5.1.1 > Hello Zürich Büro geheim 98765, here",
        ] {
            let out = hide(&[name], quoted);
            assert!(!out.contains("geheim") && !out.contains("gehe"), "{out}");
            assert_eq!(out, "550 5.1.1 > Hello ***, here");
        }
    }

    #[test]
    fn the_rest_of_the_text_is_left_as_it_was() {
        for text in [
            "550 5.1.1 <victim@example.com>: Recipient address rejected: User unknown (=?x)",
            "550 5.1.1 <badxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx@example.net>: unknown",
            "550 5.7.1 > Subject: =?utf-8?b?6aqM6K+B56CB77ya?= and V2VsY29tZSB0byBBY21lIQ==",
        ] {
            assert_eq!(hide(&["493817"], text), text);
        }
        assert_eq!(
            hide(&["abc"], "abc is too short to hide"),
            "abc is too short to hide"
        );
    }
}
