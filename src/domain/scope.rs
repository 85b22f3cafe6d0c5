//! The limiter's scopes, and a map with one value per scope.

use std::fmt;
use std::ops::{Index, IndexMut};

/// What a rate-limit key identifies. Adding a scope is adding a variant
/// here: the compiler then names every place that must learn it
/// ([`ScopeMap`]'s fields, [`Scope::as_str`], the settings' sections, the
/// limiter's `Subject`), and [`Scope::ALL`] cannot be left behind: it
/// sizes [`ScopeMap`]'s iterator, and the build checks that it lists every
/// scope once, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Scope {
    /// A normalized mailbox: stops mail bombing of one victim.
    Email,
    /// A client network: stops one client from farming codes for many mailboxes.
    Ip,
    /// The mailbox's registrable domain: stops a farmer who owns a
    /// catch-all domain from asking for codes to a new mailbox each time.
    Domain,
}

impl Scope {
    /// Every scope, in the order a request is judged (and ties are broken).
    pub const ALL: [Scope; 3] = [Scope::Email, Scope::Ip, Scope::Domain];

    /// Its place in [`Scope::ALL`] (and [`ScopeMap`]'s field order).
    const fn place(self) -> usize {
        match self {
            Scope::Email => 0,
            Scope::Ip => 1,
            Scope::Domain => 2,
        }
    }

    /// The scope's name in keys, results and settings (`limits.<scope>`).
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Email => "email",
            Scope::Ip => "ip",
            Scope::Domain => "domain",
        }
    }
}

// Checked when the crate builds: `ALL` holds each scope at its place, so
// once each. With `ScopeMap::into_iter` sized by `ALL` (one entry per
// field, and a field per scope), a scope missing from `ALL` stops the build.
const _: () = {
    let mut i = 0;
    while i < Scope::ALL.len() {
        assert!(Scope::ALL[i].place() == i, "Scope::ALL out of order");
        i += 1;
    }
};

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One `T` per scope, read and written by [`Scope`] (never by position).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ScopeMap<T> {
    email: T,
    ip: T,
    domain: T,
}

impl<T> ScopeMap<T> {
    /// Each scope's value, made by `f`, called in [`Scope::ALL`] order.
    pub fn from_fn(mut f: impl FnMut(Scope) -> T) -> Self {
        let email = f(Scope::Email);
        let ip = f(Scope::Ip);
        let domain = f(Scope::Domain);
        Self { email, ip, domain }
    }

    /// Each scope with its value, in [`Scope::ALL`] order.
    pub fn iter(&self) -> impl Iterator<Item = (Scope, &T)> {
        Scope::ALL.into_iter().map(move |s| (s, &self[s]))
    }

    /// The values, in [`Scope::ALL`] order.
    pub fn values(&self) -> impl Iterator<Item = &T> {
        Scope::ALL.into_iter().map(move |s| &self[s])
    }

    /// A map of `f` applied to each scope's value.
    pub fn map<U>(self, mut f: impl FnMut(Scope, T) -> U) -> ScopeMap<U> {
        let Self { email, ip, domain } = self;
        ScopeMap {
            email: f(Scope::Email, email),
            ip: f(Scope::Ip, ip),
            domain: f(Scope::Domain, domain),
        }
    }

    /// A map of references to the values.
    pub fn as_ref(&self) -> ScopeMap<&T> {
        ScopeMap::from_fn(|s| &self[s])
    }
}

impl<T> IntoIterator for ScopeMap<T> {
    type Item = (Scope, T);
    type IntoIter = std::array::IntoIter<(Scope, T), { Scope::ALL.len() }>;

    /// Each scope with its value, in [`Scope::ALL`] order.
    fn into_iter(self) -> Self::IntoIter {
        let Self { email, ip, domain } = self;
        [
            (Scope::Email, email),
            (Scope::Ip, ip),
            (Scope::Domain, domain),
        ]
        .into_iter()
    }
}

impl<T> Index<Scope> for ScopeMap<T> {
    type Output = T;

    fn index(&self, scope: Scope) -> &T {
        match scope {
            Scope::Email => &self.email,
            Scope::Ip => &self.ip,
            Scope::Domain => &self.domain,
        }
    }
}

impl<T> IndexMut<Scope> for ScopeMap<T> {
    fn index_mut(&mut self, scope: Scope) -> &mut T {
        match scope {
            Scope::Email => &mut self.email,
            Scope::Ip => &mut self.ip,
            Scope::Domain => &mut self.domain,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_scope_has_its_own_place_and_all_is_in_order() {
        let m = ScopeMap::from_fn(|s| s.as_str());
        for s in Scope::ALL {
            assert_eq!(m[s], s.as_str());
        }
        let order: Vec<Scope> = m.iter().map(|(s, _)| s).collect();
        assert_eq!(order, Scope::ALL);
        let mut n = ScopeMap::<u32>::default();
        n[Scope::Ip] += 2;
        assert_eq!(
            n.map(|_, v| v * 10).values().copied().collect::<Vec<_>>(),
            [0, 20, 0]
        );
    }
}
