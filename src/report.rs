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

#[cfg(test)]
mod tests {
    use super::{causes, one_line};

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
}
