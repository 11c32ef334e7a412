//! Which destinations a run may reach: host rules, the server's policy, a principal's
//! narrowing and a request's subset. Pure: no I/O, no DNS.
//!
//! A rule names a host ("api.example.com"), every subdomain of one ("*.example.com", which
//! does not cover "example.com" itself) or a literal address ("127.0.0.1", "[::1]"), with
//! the ports it allows ("host:443", "host:80,443"; 80 and 443 when none is named).

use crate::host::Host;
use crate::secrets::Secret;
use ipnet::IpNet;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

/// The ports of a rule that names none.
const DEFAULT_PORTS: [u16; 2] = [80, 443];
/// The longest rule text accepted (a DNS name is at most 253 characters).
const MAX_RULE_LEN: usize = 512;
/// The most ports one rule may list.
const MAX_PORTS: usize = 64;
/// The most entries a request's `network.allow` may have.
const MAX_REQUESTED: usize = 256;

/// Why a rule could not be read or a request asked for more than its policy.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    #[error("invalid network rule {rule:?}: {why}")]
    InvalidRule { rule: String, why: &'static str },
    #[error("{host} is not allowed by this principal's network policy")]
    NotAllowed { host: String },
}

/// What a rule matches, before its ports.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Pattern {
    /// One DNS name, lower case, without a trailing dot.
    Exact(String),
    /// Every name below this suffix (not the suffix itself).
    Subdomains(String),
    /// One literal address.
    Address(IpAddr),
}

impl Pattern {
    /// Whether every host this pattern matches is matched by `other` too.
    fn within(&self, other: &Pattern) -> bool {
        match (self, other) {
            (a, b) if a == b => true,
            (Pattern::Exact(name), Pattern::Subdomains(suffix)) => is_below(name, suffix),
            (Pattern::Subdomains(inner), Pattern::Subdomains(outer)) => is_below(inner, outer),
            _ => false,
        }
    }

    fn matches_host(&self, host: &Host) -> bool {
        match (self, host) {
            (Pattern::Exact(rule), Host::Name(name)) => rule == name,
            (Pattern::Subdomains(suffix), Host::Name(name)) => is_below(name, suffix),
            (Pattern::Address(rule), Host::Address(addr)) => rule == addr,
            _ => false,
        }
    }
}

impl fmt::Display for Pattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Pattern::Exact(name) => f.write_str(name),
            Pattern::Subdomains(suffix) => write!(f, "*.{suffix}"),
            Pattern::Address(IpAddr::V4(v4)) => write!(f, "{v4}"),
            Pattern::Address(IpAddr::V6(v6)) => write!(f, "[{v6}]"),
        }
    }
}

/// Whether `name` is a proper subdomain of `suffix` ("a.b.c" of "b.c"; "b.c" is not).
fn is_below(name: &str, suffix: &str) -> bool {
    name.len() > suffix.len() + 1 && name.ends_with(suffix) && name.as_bytes()[name.len() - suffix.len() - 1] == b'.'
}

/// One allowed destination: a host pattern and its ports.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct HostRule {
    pattern: Pattern,
    /// Sorted, without duplicates, never empty.
    ports: Vec<u16>,
    /// The canonical text ("*.example.com:443"), for messages and the configuration.
    text: String,
}

impl HostRule {
    /// Reads "host", "*.suffix", "1.2.3.4", "[::1]", each with an optional ":port[,port]".
    pub fn parse(s: &str) -> Result<HostRule, PolicyError> {
        let invalid = |why| PolicyError::InvalidRule {
            rule: s.chars().take(MAX_RULE_LEN).collect(),
            why,
        };
        if s.len() > MAX_RULE_LEN {
            return Err(invalid("too long"));
        }
        let s = s.trim();
        let (host, ports) = split_ports(s).ok_or_else(|| invalid("bad host or port syntax"))?;
        let ports = match ports {
            None => DEFAULT_PORTS.to_vec(),
            Some(list) => parse_ports(list).ok_or_else(|| invalid("ports must be 1 to 65535, comma-separated"))?,
        };
        let pattern = if let Some(suffix) = host.strip_prefix("*.") {
            match Host::parse(suffix) {
                Some(Host::Name(suffix)) => Pattern::Subdomains(suffix),
                _ => return Err(invalid("a wildcard must be followed by a DNS name")),
            }
        } else {
            match Host::parse(host) {
                Some(Host::Name(name)) => Pattern::Exact(name),
                Some(Host::Address(addr)) => Pattern::Address(addr),
                None => return Err(invalid("not a DNS name or an IP address")),
            }
        };
        Ok(HostRule::from_parts(pattern, ports))
    }

    fn from_parts(pattern: Pattern, ports: Vec<u16>) -> HostRule {
        let text = if ports == DEFAULT_PORTS {
            pattern.to_string()
        } else {
            let list: Vec<String> = ports.iter().map(u16::to_string).collect();
            format!("{pattern}:{}", list.join(","))
        };
        HostRule { pattern, ports, text }
    }

    /// The rule's canonical text.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The ports this rule allows, ascending.
    pub fn ports(&self) -> &[u16] {
        &self.ports
    }

    /// Whether a client may reach `host` (as a request target names it) on `port`.
    pub fn allows(&self, host: &str, port: u16) -> bool {
        Host::parse(host).is_some_and(|h| self.matches(&h) && self.ports.contains(&port))
    }

    pub(crate) fn matches(&self, host: &Host) -> bool {
        self.pattern.matches_host(host)
    }

    /// The rule matching what both rules match, if any. Patterns are nested or disjoint,
    /// so the intersection is the narrower of the two.
    fn intersect(&self, other: &HostRule) -> Option<HostRule> {
        let pattern = if self.pattern.within(&other.pattern) {
            self.pattern.clone()
        } else if other.pattern.within(&self.pattern) {
            other.pattern.clone()
        } else {
            return None;
        };
        let ports: Vec<u16> = self.ports.iter().copied().filter(|p| other.ports.contains(p)).collect();
        (!ports.is_empty()).then(|| HostRule::from_parts(pattern, ports))
    }
}

/// Splits "host[:ports]" (with "[v6]" brackets kept on the host). A bare IPv6 address
/// (two colons or more, no brackets) has no ports.
fn split_ports(s: &str) -> Option<(&str, Option<&str>)> {
    if s.starts_with('[') {
        let end = s.find(']')?;
        let (host, rest) = s.split_at(end + 1);
        return match rest {
            "" => Some((host, None)),
            _ => Some((host, Some(rest.strip_prefix(':')?))),
        };
    }
    if s.matches(':').count() > 1 {
        return Some((s, None));
    }
    match s.split_once(':') {
        Some((host, ports)) => Some((host, Some(ports))),
        None => Some((s, None)),
    }
}

fn parse_ports(list: &str) -> Option<Vec<u16>> {
    let mut ports = Vec::new();
    for item in list.split(',') {
        let port: u16 = item.trim().parse().ok()?;
        if port == 0 {
            return None;
        }
        ports.push(port);
    }
    ports.sort_unstable();
    ports.dedup();
    (!ports.is_empty() && ports.len() <= MAX_PORTS).then_some(ports)
}

impl FromStr for HostRule {
    type Err = PolicyError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        HostRule::parse(s)
    }
}

impl TryFrom<String> for HostRule {
    type Error = PolicyError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        HostRule::parse(&s)
    }
}

impl From<HostRule> for String {
    fn from(rule: HostRule) -> String {
        rule.text
    }
}

impl fmt::Display for HostRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// The bounds of one run's egress.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    /// Upstream connections the run may attempt in all: those the policy allows count
    /// (whether or not they then resolve and connect), those it refuses do not.
    pub max_connections: u32,
    /// Bytes the run may send upstream, over all its connections.
    pub max_bytes_out: u64,
    /// Bytes the run may receive from upstream, over all its connections.
    pub max_bytes_in: u64,
    /// Seconds one connection to the proxy may last, tunnel or request included.
    pub max_connection_seconds: u32,
}

/// What a principal may reach: the server's rules, narrowed by the principal's own if any.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Policy {
    pub rules: Vec<HostRule>,
    /// Addresses that egress would refuse (loopback, private, ...) but the configuration
    /// names explicitly, so that a rule's name may resolve to them.
    pub allow_addresses: Vec<IpNet>,
}

impl Policy {
    /// A run's grant: the request's `network.allow` entries (None: all of the policy),
    /// each of which the policy must cover, port by port (else `NotAllowed` naming the
    /// entry; an entry that is not a rule at all gives `InvalidRule`).
    pub fn grant(&self, requested: Option<&[String]>, limits: Limits) -> Result<Grant, PolicyError> {
        let rules = match requested {
            None => self.rules.clone(),
            Some(entries) => {
                if entries.len() > MAX_REQUESTED {
                    return Err(PolicyError::InvalidRule {
                        rule: format!("{} entries", entries.len()),
                        why: "a request may name at most 256 hosts",
                    });
                }
                let mut rules = Vec::with_capacity(entries.len());
                for entry in entries {
                    let rule = HostRule::parse(entry)?;
                    if !self.covers(&rule) {
                        let host = entry.chars().take(MAX_RULE_LEN).collect();
                        return Err(PolicyError::NotAllowed { host });
                    }
                    rules.push(rule);
                }
                rules
            }
        };
        Ok(Grant {
            rules,
            allow_addresses: self.allow_addresses.clone(),
            limits,
            secrets: Vec::new(),
        })
    }

    /// Whether every host and port `rule` matches is matched by some rule of the policy.
    fn covers(&self, rule: &HostRule) -> bool {
        rule.ports.iter().all(|port| {
            self.rules
                .iter()
                .any(|own| rule.pattern.within(&own.pattern) && own.ports.contains(port))
        })
    }

    /// This policy narrowed by a principal's rules: what both allow. The addresses stay
    /// the server's (a principal cannot add any).
    pub fn narrowed(&self, principal_rules: &[HostRule]) -> Policy {
        let mut rules: Vec<HostRule> = Vec::new();
        for own in &self.rules {
            for theirs in principal_rules {
                if let Some(both) = own.intersect(theirs) {
                    if !rules.contains(&both) {
                        rules.push(both);
                    }
                }
            }
        }
        Policy {
            rules,
            allow_addresses: self.allow_addresses.clone(),
        }
    }

    /// Whether the policy allows any destination at all.
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }
}

/// What one run may reach, with its bounds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    pub rules: Vec<HostRule>,
    pub allow_addresses: Vec<IpNet>,
    pub limits: Limits,
    /// The secrets the run may use (the server decides, never a request): a `CONNECT` to
    /// one of their hosts is intercepted when the run has an `Interceptor`.
    pub secrets: Vec<Secret>,
}

impl Grant {
    /// Whether some rule allows `host`; then whether one allows it on `port`.
    pub(crate) fn check(&self, host: &Host, port: u16) -> HostCheck {
        let mut host_known = false;
        for rule in &self.rules {
            if rule.matches(host) {
                if rule.ports.contains(&port) {
                    return HostCheck::Allowed;
                }
                host_known = true;
            }
        }
        if host_known {
            HostCheck::PortNotAllowed
        } else {
            HostCheck::HostNotAllowed
        }
    }

    /// Whether the configuration names `addr` explicitly.
    pub(crate) fn address_named(&self, addr: IpAddr) -> bool {
        let addr = crate::address::canonical(addr);
        self.allow_addresses.iter().any(|net| net.contains(&addr))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HostCheck {
    Allowed,
    HostNotAllowed,
    PortNotAllowed,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(list: &[&str]) -> Vec<HostRule> {
        list.iter().map(|s| HostRule::parse(s).unwrap()).collect()
    }

    fn policy(list: &[&str]) -> Policy {
        Policy {
            rules: rules(list),
            allow_addresses: vec![],
        }
    }

    const LIMITS: Limits = Limits {
        max_connections: 1,
        max_bytes_out: 1,
        max_bytes_in: 1,
        max_connection_seconds: 1,
    };

    fn strings(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn rules_parse_to_canonical_text() {
        assert_eq!(HostRule::parse("API.Example.com.").unwrap().as_str(), "api.example.com");
        assert_eq!(
            HostRule::parse("*.example.com:443").unwrap().as_str(),
            "*.example.com:443"
        );
        assert_eq!(HostRule::parse("h:443,80").unwrap().as_str(), "h");
        assert_eq!(HostRule::parse("h:8080,443,8080").unwrap().ports(), &[443, 8080]);
        assert_eq!(HostRule::parse("[::1]:8080").unwrap().as_str(), "[::1]:8080");
        assert_eq!(HostRule::parse("::1").unwrap().as_str(), "[::1]");
        assert_eq!(HostRule::parse("127.0.0.1:9").unwrap().as_str(), "127.0.0.1:9");
        for bad in [
            "",
            "*",
            "*.",
            "a..b",
            "h:0",
            "h:x",
            "h:",
            "a b",
            "*.1.2.3.4x:",
            "[::1",
            "h:70000",
            "a*.b",
        ] {
            assert!(HostRule::parse(bad).is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn wildcard_covers_subdomains_not_the_apex() {
        let p = policy(&["*.example.com"]);
        assert!(p.grant(Some(&strings(&["a.b.example.com"])), LIMITS).is_ok());
        assert!(p.grant(Some(&strings(&["*.b.example.com:443"])), LIMITS).is_ok());
        let err = p.grant(Some(&strings(&["example.com"])), LIMITS).unwrap_err();
        assert_eq!(
            err,
            PolicyError::NotAllowed {
                host: "example.com".into()
            }
        );
        assert!(p.grant(Some(&strings(&["badexample.com"])), LIMITS).is_err());
        let rule = &p.rules[0];
        assert!(rule.allows("x.example.com", 443));
        assert!(!rule.allows("example.com", 443));
        assert!(!rule.allows("x.example.com", 22));
    }

    #[test]
    fn request_subset_is_granted_and_more_is_refused_naming_the_host() {
        let p = policy(&["api.example.com:443", "files.example.org"]);
        let grant = p
            .grant(Some(&strings(&["api.example.com:443", "files.example.org:80"])), LIMITS)
            .unwrap();
        assert_eq!(grant.rules.len(), 2);
        assert_eq!(p.grant(None, LIMITS).unwrap().rules, p.rules);
        // Port 80 of api.example.com is not in the policy, nor is another host.
        for (asked, host) in [
            ("api.example.com", "api.example.com"),
            ("api.other.com", "api.other.com"),
        ] {
            let err = p
                .grant(Some(&strings(&["files.example.org", asked])), LIMITS)
                .unwrap_err();
            assert_eq!(err, PolicyError::NotAllowed { host: host.into() });
            assert!(err.to_string().contains(host), "{err}");
        }
        let err = p.grant(Some(&strings(&["api example.com"])), LIMITS).unwrap_err();
        assert!(matches!(err, PolicyError::InvalidRule { .. }), "{err:?}");
        assert!(err.to_string().contains("\"api example.com\""), "{err}");
        let many: Vec<String> = (0..257).map(|_| "files.example.org".to_string()).collect();
        assert!(matches!(
            p.grant(Some(&many), LIMITS),
            Err(PolicyError::InvalidRule { .. })
        ));
        assert!(p.grant(Some(&many[..256]), LIMITS).is_ok());
        // Ports may be covered by two rules of the same host.
        let p = policy(&["h:80", "h:443"]);
        assert!(p.grant(Some(&strings(&["h"])), LIMITS).is_ok());
    }

    #[test]
    fn narrowing_keeps_what_both_allow() {
        let server = policy(&["*.example.com", "api.example.org:443", "other.net"]);
        let narrowed = server.narrowed(&rules(&["a.example.com:443,8443", "*.example.org", "nothere.com"]));
        let texts: Vec<&str> = narrowed.rules.iter().map(HostRule::as_str).collect();
        assert_eq!(texts, ["a.example.com:443", "api.example.org:443"]);
        assert!(narrowed.grant(Some(&strings(&["a.example.com:443"])), LIMITS).is_ok());
        assert!(narrowed.grant(Some(&strings(&["b.example.com:443"])), LIMITS).is_err());
        assert!(narrowed.grant(Some(&strings(&["other.net"])), LIMITS).is_err());
        assert!(server.narrowed(&[]).is_empty());
    }

    #[test]
    fn grant_checks_hosts_and_ports() {
        let grant = policy(&["a.example.com:443", "127.0.0.1:8080"])
            .grant(None, LIMITS)
            .unwrap();
        let host = |s| Host::parse(s).unwrap();
        assert_eq!(grant.check(&host("A.example.com."), 443), HostCheck::Allowed);
        assert_eq!(grant.check(&host("a.example.com"), 22), HostCheck::PortNotAllowed);
        assert_eq!(grant.check(&host("b.example.com"), 443), HostCheck::HostNotAllowed);
        assert_eq!(grant.check(&host("127.0.0.1"), 8080), HostCheck::Allowed);
        assert_eq!(
            grant.check(&host("[::ffff:127.0.0.1]"), 8080),
            HostCheck::HostNotAllowed
        );
    }
}
