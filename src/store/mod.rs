//! Redis, in one place: the connection (`conn`) that the ledger, the
//! limiter's support tools and the overrides share; every Lua script
//! mailgate runs there ([`scripts`]), with one registry that builds each
//! once and can load them all; and the overrides' storage and polling
//! ([`overrides`]).
//!
//! The store depends on [`crate::domain`] and [`crate::settings`], and,
//! for the overrides, on the limiter's override types and its keyspace
//! (how the limiter counts a subject, and the table it judges by); the
//! [`crate::ledger`], the worker and the support tools use it.

mod cluster;
pub(crate) mod conn;
mod error;
pub mod overrides;
pub mod scripts;
mod sentinel;

pub(crate) use self::conn::{Conn, OLDEST_REDIS, ScanNode, connect};
pub use self::error::StoreError;
