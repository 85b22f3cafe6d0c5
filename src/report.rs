//! How an error is shown to a person or a log: with its causes.
//!
//! mailgate's errors say what failed at their own level ("redis",
//! "rabbitmq", "cannot load settings") and keep what caused it as their
//! `source()`, so a caller can still tell the two apart (the store judges
//! an outage by the Redis error itself). Their `Display` alone is then only
//! half the story: whatever shows one to an operator, a producer or a log
//! shows [`one_line`] instead.

use std::error::Error;

/// `error`, then its source, then that one's source, and so on.
pub fn causes<'a>(
    error: &'a (dyn Error + 'static),
) -> impl Iterator<Item = &'a (dyn Error + 'static)> {
    std::iter::successors(Some(error), |&e| e.source())
}

/// `error` and its causes on one line, "outer: cause: cause", skipping a
/// cause whose text the line already holds (some libraries repeat their
/// source in their own message).
pub fn one_line(error: &(dyn Error + 'static)) -> String {
    let mut line = String::new();
    for cause in causes(error) {
        let text = cause.to_string();
        if line.contains(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line
}

/// `text` (parts separated by ": ") without a run of parts that repeats
/// the run just before it: clients repeat their sources in their own
/// messages ("IO error: reset: IO error: reset: reset"), which reads as
/// three failures where there is one. Parts said again later, apart, stay.
pub fn without_repeats(text: &str) -> String {
    let mut parts: Vec<&str> = text.split(": ").collect();
    let mut i = 0;
    while i < parts.len() {
        let repeated =
            (1..=(parts.len() - i) / 2).find(|&k| parts[i..i + k] == parts[i + k..i + 2 * k]);
        match repeated {
            Some(k) => drop(parts.drain(i + k..i + 2 * k)),
            None => i += 1,
        }
    }
    parts.join(": ")
}

#[cfg(test)]
mod tests {
    use super::{causes, one_line, without_repeats};

    /// An error with a message of its own and, maybe, a source.
    #[derive(Debug, thiserror::Error)]
    #[error("{text}")]
    struct Layer {
        text: &'static str,
        #[source]
        below: Option<Box<Layer>>,
    }

    fn chain(texts: &[&'static str]) -> Layer {
        let mut below = None;
        for text in texts.iter().rev() {
            below = Some(Box::new(Layer { text, below }));
        }
        *below.expect("at least one layer")
    }

    #[test]
    fn each_cause_follows_on_one_line() {
        let e = chain(&["redis", "connection refused", "os error 111"]);
        assert_eq!(causes(&e).count(), 3);
        assert_eq!(one_line(&e), "redis: connection refused: os error 111");
        assert_eq!(one_line(&chain(&["alone"])), "alone");
    }

    /// Guards against a cause said twice when a library quotes its source
    /// in its own message (lapin's "IO error: <the io::Error>").
    #[test]
    fn a_cause_the_line_already_holds_is_skipped() {
        let e = chain(&["rabbitmq", "IO error: reset by peer", "reset by peer"]);
        assert_eq!(one_line(&e), "rabbitmq: IO error: reset by peer");
    }

    #[test]
    fn repeated_parts_of_an_error_are_said_once() {
        assert_eq!(
            without_repeats(
                "rabbitmq: IO error: Connection reset by peer (os error 104): IO error: \
                 Connection reset by peer (os error 104): Connection reset by peer (os error 104)"
            ),
            "rabbitmq: IO error: Connection reset by peer (os error 104)"
        );
        assert_eq!(
            without_repeats("Connection error: Connection error: invalid peer certificate: X"),
            "Connection error: invalid peer certificate: X"
        );
        assert_eq!(without_repeats("plain"), "plain");
        // Said again apart: kept (it is another part's cause).
        assert_eq!(without_repeats("A: x: B: x"), "A: x: B: x");
    }
}
