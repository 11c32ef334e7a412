//! A destination as a client names it, read from a request target.

use std::fmt;
use std::net::IpAddr;

/// A destination as a client names it: a DNS name or a literal address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Host {
    Name(String),
    Address(IpAddr),
}

impl Host {
    /// Reads a host as found in a request target (brackets around IPv6 allowed). Names are
    /// lower-cased and lose a trailing dot; None for anything that is not a DNS name.
    pub(crate) fn parse(s: &str) -> Option<Host> {
        let bare = s.strip_prefix('[').and_then(|s| s.strip_suffix(']'));
        if let Some(inner) = bare {
            return inner
                .parse::<std::net::Ipv6Addr>()
                .ok()
                .map(|a| Host::Address(a.into()));
        }
        if let Ok(addr) = s.parse::<IpAddr>() {
            return Some(Host::Address(addr));
        }
        let name = s.strip_suffix('.').unwrap_or(s).to_ascii_lowercase();
        valid_name(&name).then_some(Host::Name(name))
    }
}

impl fmt::Display for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Host::Name(name) => f.write_str(name),
            Host::Address(addr) => write!(f, "{addr}"),
        }
    }
}

/// A DNS name of labels of letters, digits, '-' and '_' (1 to 63 each, 253 in all).
fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        })
}
