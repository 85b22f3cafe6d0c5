use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::InvalidInput;

/// A client IP address in canonical form: an IPv4-mapped IPv6 address
/// (`::ffff:203.0.113.7`) is stored as the IPv4 address it maps, so a client
/// cannot double its quota by switching notation.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct IpKey(IpAddr);

impl IpKey {
    /// Parses an IPv4 or IPv6 address (surrounding spaces trimmed; control characters refused).
    pub fn parse(input: &str) -> Result<Self, InvalidInput> {
        if input.chars().any(char::is_control) {
            return Err(InvalidInput::ControlCharacter { field: "ip" });
        }
        let trimmed = input.trim();
        let ip: IpAddr = trimmed
            .parse()
            .map_err(|_| InvalidInput::Ip(trimmed.chars().take(64).collect()))?;
        Ok(Self::from(ip))
    }

    /// The address, canonical (never IPv4-mapped IPv6).
    pub fn addr(&self) -> IpAddr {
        self.0
    }

    /// The network this address is limited as: the address masked to
    /// `v4_prefix` bits (IPv4) or `v6_prefix` bits (IPv6), written
    /// `addr/prefix`. One IPv6 customer usually holds a whole /64, so that is
    /// the usual IPv6 grouping; prefixes above the address width are clamped.
    pub fn network(&self, v4_prefix: u8, v6_prefix: u8) -> String {
        match self.0 {
            IpAddr::V4(v4) => {
                let p = v4_prefix.min(32);
                let mask = u32::MAX.checked_shl(32 - u32::from(p)).unwrap_or(0);
                format!("{}/{p}", Ipv4Addr::from(u32::from(v4) & mask))
            }
            IpAddr::V6(v6) => {
                let p = v6_prefix.min(128);
                let mask = u128::MAX.checked_shl(128 - u32::from(p)).unwrap_or(0);
                format!("{}/{p}", Ipv6Addr::from(u128::from(v6) & mask))
            }
        }
    }
}

impl From<IpAddr> for IpKey {
    fn from(ip: IpAddr) -> Self {
        match ip {
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => Self(IpAddr::V4(v4)),
                None => Self(IpAddr::V6(v6)),
            },
            v4 => Self(v4),
        }
    }
}

impl fmt::Display for IpKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl fmt::Debug for IpKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "IpKey({})", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mapped_ipv6_is_ipv4() {
        let a = IpKey::parse("::ffff:203.0.113.7").unwrap();
        let b = IpKey::parse("203.0.113.7").unwrap();
        assert_eq!(a, b);
        assert_eq!(a.network(32, 64), "203.0.113.7/32");
    }

    #[test]
    fn ipv6_groups_by_prefix() {
        let a = IpKey::parse("2001:db8:1:2:aaaa::1").unwrap();
        let b = IpKey::parse("2001:db8:1:2:ffff:ffff:ffff:ffff").unwrap();
        let c = IpKey::parse("2001:db8:1:3::1").unwrap();
        assert_eq!(a.network(32, 64), "2001:db8:1:2::/64");
        assert_eq!(a.network(32, 64), b.network(32, 64));
        assert_ne!(a.network(32, 64), c.network(32, 64));
        assert_eq!(a.network(32, 48), c.network(32, 48));
    }

    #[test]
    fn ipv4_prefix_is_configurable() {
        let a = IpKey::parse("203.0.113.7").unwrap();
        assert_eq!(a.network(24, 64), "203.0.113.0/24");
        assert_eq!(a.network(0, 64), "0.0.0.0/0");
        assert_eq!(a.network(99, 200), "203.0.113.7/32");
    }

    #[test]
    fn bad_ips_are_errors() {
        for s in [
            "",
            "1.2.3",
            "300.1.1.1",
            "example.com",
            "1.2.3.4\r\n",
            "fe80::1%eth0",
        ] {
            assert!(IpKey::parse(s).is_err(), "{s:?}");
        }
    }
}
