//! Redis, in one place: the connection ([`conn`]) that the ledger, the
//! limiter's support tools and the overrides share, and every Lua script
//! mailgate runs there ([`scripts`]), with one registry that builds each
//! once and can load them all.
//!
//! The store depends on [`crate::domain`] and [`crate::settings`]; the
//! [`crate::ledger`] and the support tools use it.

pub(crate) mod conn;
pub mod scripts;

pub(crate) use self::conn::{Conn, connect};
