//! Mail: the mailer against real in-process SMTP servers, several relays
//! behind circuit breakers, and the shipped templates.

mod mailer;
mod relays;
mod templates;
