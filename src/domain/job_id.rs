use std::fmt;

use super::InvalidInput;

/// The producer-chosen idempotency key of a job: 1 to 128 printable
/// characters (no control characters). Two messages with the same id are the
/// same job: the limiter counts it once and it is mailed at most once.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct JobId(String);

impl JobId {
    /// The longest id accepted, in characters.
    pub const MAX_CHARS: usize = 128;

    /// Parses an id. Nothing is trimmed: the id is an opaque key, and a
    /// leading space would make two ids that look alike differ silently, so
    /// surrounding whitespace is refused instead.
    pub fn parse(input: &str) -> Result<Self, InvalidInput> {
        if input.chars().any(char::is_control) {
            return Err(InvalidInput::ControlCharacter { field: "id" });
        }
        if input.trim() != input {
            return Err(InvalidInput::JobIdPadded);
        }
        let n = input.chars().count();
        if n == 0 || n > Self::MAX_CHARS {
            return Err(InvalidInput::JobIdLength {
                max: Self::MAX_CHARS,
            });
        }
        Ok(Self(input.to_owned()))
    }

    /// The id as the producer sent it.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "JobId({:?})", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lengths() {
        assert!(JobId::parse("a").is_ok());
        assert!(JobId::parse(&"é".repeat(128)).is_ok());
        assert!(JobId::parse("").is_err());
        assert!(JobId::parse(&"x".repeat(129)).is_err());
    }

    #[test]
    fn no_control_or_padding() {
        assert!(JobId::parse("a\nb").is_err());
        assert!(JobId::parse("a\0").is_err());
        assert!(JobId::parse(" a").is_err());
        assert!(JobId::parse("a b").is_ok());
    }
}
