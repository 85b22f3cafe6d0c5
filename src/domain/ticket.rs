/// One message lineage: a producer's message and the copies mailgate
/// republishes of it (retries, lease waits). Random (UUID v4), so no other
/// message can guess it; carried in the `x-mailgate-ticket` header, and named
/// in a job's ledger record as the owner of its send.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Ticket(String);

impl Ticket {
    /// A ticket for a message that arrived without one.
    pub fn new() -> Self {
        Self(uuid::Uuid::new_v4().simple().to_string())
    }

    /// A ticket as carried in a header; `None` unless it has a ticket's
    /// shape (32 lowercase hex digits), so a header cannot smuggle anything
    /// else into the ledger.
    pub fn parse(s: &str) -> Option<Self> {
        let ok = s.len() == 32 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
        ok.then(|| Self(s.to_owned()))
    }

    /// The ticket as carried in headers and records.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Default for Ticket {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::Ticket;

    #[test]
    fn tickets_are_fresh_and_parse_back() {
        let (a, b) = (Ticket::new(), Ticket::new());
        assert_ne!(a, b);
        assert_eq!(Ticket::parse(a.as_str()), Some(a));
        for bad in [
            "",
            "x",
            &"A".repeat(32),
            &"0".repeat(33),
            "0123456789abcdef0123456789abcdeg",
        ] {
            assert_eq!(Ticket::parse(bad), None, "{bad}");
        }
    }
}
