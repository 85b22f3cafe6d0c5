//! Why a message went to the dead-letter queue, as one word that the
//! `x-mailgate-reason` header carries and `mailgate dead` filters by.

/// Why a message is a dead letter. The words ([`DeadReason::as_str`]) are
/// part of the contract: operators filter and alert on them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DeadReason {
    /// It cannot be answered: not a JSON object, or no usable `id`.
    Unreadable,
    /// It failed on every attempt (`max_attempts` transient failures); its
    /// `failed` result was published first.
    Failed,
    /// Its result could not be delivered: neither its `reply_to` nor the
    /// results queue took it.
    Unanswerable,
    /// RabbitMQ refused mailgate's copy of it (a retry or a lease wait).
    Refused,
    /// The worker panicked processing it (a bug).
    Panic,
    /// RabbitMQ dead-lettered it at a quorum queue's delivery limit: it was
    /// handed out again and again without being settled (it took workers
    /// down with it). Never written by mailgate; read from `x-death`.
    DeliveryLimit,
    /// Put there by something else than mailgate or RabbitMQ's delivery
    /// limit (an operator's move, a policy), or by a version before the
    /// reason header whose error text says nothing known.
    Other,
}

impl DeadReason {
    /// Every reason, in the order `mailgate dead` lists them.
    pub const ALL: [DeadReason; 7] = [
        DeadReason::Unreadable,
        DeadReason::Failed,
        DeadReason::Unanswerable,
        DeadReason::Refused,
        DeadReason::Panic,
        DeadReason::DeliveryLimit,
        DeadReason::Other,
    ];

    /// The reason's word, as headers and commands write it.
    pub fn as_str(self) -> &'static str {
        match self {
            DeadReason::Unreadable => "unreadable",
            DeadReason::Failed => "failed",
            DeadReason::Unanswerable => "unanswerable",
            DeadReason::Refused => "refused",
            DeadReason::Panic => "panic",
            DeadReason::DeliveryLimit => "delivery_limit",
            DeadReason::Other => "other",
        }
    }

    /// The reason named `word`, if it is one.
    pub fn parse(word: &str) -> Option<DeadReason> {
        DeadReason::ALL.into_iter().find(|r| r.as_str() == word)
    }

    /// The reason of a dead letter written before the reason header existed,
    /// from its error text (`x-mailgate-error`): the texts those versions
    /// wrote begin so.
    pub fn from_error_text(error: &str) -> DeadReason {
        if error.starts_with("gave up after ") {
            DeadReason::Failed
        } else if error.starts_with("its result could not be delivered") {
            DeadReason::Unanswerable
        } else if error.starts_with("rabbitmq refused its copy") {
            DeadReason::Refused
        } else if error.starts_with("mailgate panicked") {
            DeadReason::Panic
        } else if [
            "not a JSON object",
            "unusable id",
            "id must be",
            "id is required",
        ]
        .iter()
        .any(|p| error.starts_with(p))
        {
            DeadReason::Unreadable
        } else {
            DeadReason::Other
        }
    }
}

impl std::fmt::Display for DeadReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_parse_back() {
        for r in DeadReason::ALL {
            assert_eq!(DeadReason::parse(r.as_str()), Some(r));
        }
        assert_eq!(DeadReason::parse("gave_up"), None);
        assert_eq!(
            DeadReason::from_error_text("gave up after 5 attempts: 451"),
            DeadReason::Failed
        );
        assert_eq!(
            DeadReason::from_error_text("not a JSON object: EOF"),
            DeadReason::Unreadable
        );
        assert_eq!(
            DeadReason::from_error_text("moved by hand"),
            DeadReason::Other
        );
    }
}
