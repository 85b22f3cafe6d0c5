//! An attacker's and an auditor's view: TLS on every link, hostile input,
//! and no secret in any output.

mod hostile;
mod hygiene;
mod transport;
