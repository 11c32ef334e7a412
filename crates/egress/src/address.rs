//! Which addresses egress refuses to connect to, whatever name led to them: everything
//! that is not a public unicast address, so that no allowed name (or a name that changes
//! its answer) can reach the host's own services, its network or a cloud metadata service.
//! Pure: no I/O.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The address itself, or the IPv4 address an IPv4-mapped IPv6 address stands for (the
/// kernel connects "::ffff:127.0.0.1" to 127.0.0.1).
pub(crate) fn canonical(addr: IpAddr) -> IpAddr {
    match addr {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => addr,
        },
        v4 => v4,
    }
}

/// Why egress refuses `addr` ("a private address"), or None for a public unicast address.
pub fn refused_kind(addr: IpAddr) -> Option<&'static str> {
    match addr {
        IpAddr::V4(v4) => refused_v4(v4),
        IpAddr::V6(v6) => refused_v6(v6),
    }
}

fn in_v4(addr: Ipv4Addr, net: [u8; 4], prefix: u32) -> bool {
    let mask = if prefix == 0 { 0 } else { u32::MAX << (32 - prefix) };
    u32::from(addr) & mask == u32::from(Ipv4Addr::from(net)) & mask
}

fn refused_v4(a: Ipv4Addr) -> Option<&'static str> {
    const TABLE: &[([u8; 4], u32, &str)] = &[
        ([0, 0, 0, 0], 8, "an unspecified address"),
        ([127, 0, 0, 0], 8, "a loopback address"),
        ([10, 0, 0, 0], 8, "a private address"),
        ([172, 16, 0, 0], 12, "a private address"),
        ([192, 168, 0, 0], 16, "a private address"),
        ([100, 64, 0, 0], 10, "a shared (CGNAT) address"),
        // 169.254.169.254 is the metadata service of most clouds.
        ([169, 254, 0, 0], 16, "a link-local address"),
        ([192, 0, 0, 0], 24, "a reserved address"),
        ([192, 0, 2, 0], 24, "a documentation address"),
        ([198, 51, 100, 0], 24, "a documentation address"),
        ([203, 0, 113, 0], 24, "a documentation address"),
        ([198, 18, 0, 0], 15, "a benchmarking address"),
        ([192, 88, 99, 0], 24, "a reserved address"),
        ([224, 0, 0, 0], 4, "a multicast address"),
        // 240/4 includes the broadcast address 255.255.255.255.
        ([240, 0, 0, 0], 4, "a reserved address"),
    ];
    TABLE
        .iter()
        .find(|(net, prefix, _)| in_v4(a, *net, *prefix))
        .map(|(_, _, kind)| *kind)
}

fn in_v6(addr: Ipv6Addr, net: [u16; 8], prefix: u32) -> bool {
    let mask = if prefix == 0 { 0 } else { u128::MAX << (128 - prefix) };
    u128::from(addr) & mask == u128::from(Ipv6Addr::from(net)) & mask
}

/// The IPv4 address in the low 32 bits.
fn low_v4(a: Ipv6Addr) -> Ipv4Addr {
    Ipv4Addr::from((u128::from(a) & 0xffff_ffff) as u32)
}

fn refused_v6(a: Ipv6Addr) -> Option<&'static str> {
    if a.is_unspecified() {
        return Some("an unspecified address");
    }
    if a.is_loopback() {
        return Some("a loopback address");
    }
    // Forms that carry an IPv4 address: judged by that address, and refused even when it
    // is public where the form itself is deprecated or tunnels (IPv4-compatible, 6to4,
    // Teredo), since their path is not the public IPv6 internet's.
    if let Some(v4) = a.to_ipv4_mapped() {
        return refused_v4(v4);
    }
    if in_v6(a, [0; 8], 96) {
        return Some(refused_v4(low_v4(a)).unwrap_or("a deprecated IPv4-compatible address"));
    }
    // NAT64 (64:ff9b::/96) reaches the embedded IPv4 address through a gateway.
    if in_v6(a, [0x64, 0xff9b, 0, 0, 0, 0, 0, 0], 96) {
        return refused_v4(low_v4(a));
    }
    const TABLE: &[([u16; 8], u32, &str)] = &[
        ([0x64, 0xff9b, 1, 0, 0, 0, 0, 0], 48, "a local NAT64 address"),
        ([0x100, 0, 0, 0, 0, 0, 0, 0], 64, "a discard address"),
        ([0x2001, 0xdb8, 0, 0, 0, 0, 0, 0], 32, "a documentation address"),
        ([0x3fff, 0, 0, 0, 0, 0, 0, 0], 20, "a documentation address"),
        // Includes Teredo (2001::/32) and benchmarking (2001:2::/48).
        ([0x2001, 0, 0, 0, 0, 0, 0, 0], 23, "a reserved address"),
        ([0x2002, 0, 0, 0, 0, 0, 0, 0], 16, "a 6to4 address"),
        ([0xfc00, 0, 0, 0, 0, 0, 0, 0], 7, "a private (unique local) address"),
        ([0xfe80, 0, 0, 0, 0, 0, 0, 0], 10, "a link-local address"),
        ([0xfec0, 0, 0, 0, 0, 0, 0, 0], 10, "a site-local address"),
        ([0xff00, 0, 0, 0, 0, 0, 0, 0], 8, "a multicast address"),
    ];
    if let Some((_, _, kind)) = TABLE.iter().find(|(net, prefix, _)| in_v6(a, *net, *prefix)) {
        return Some(kind);
    }
    // Only 2000::/3 is allocated for global unicast.
    if !in_v6(a, [0x2000, 0, 0, 0, 0, 0, 0, 0], 3) {
        return Some("a reserved address");
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind(s: &str) -> Option<&'static str> {
        refused_kind(s.parse().unwrap())
    }

    #[test]
    fn public_addresses_pass() {
        for s in [
            "1.1.1.1",
            "8.8.8.8",
            "93.184.215.14",
            "172.32.0.1",
            "100.128.0.1",
            "2606:4700::1111",
            "2a00:1450::1",
        ] {
            assert_eq!(kind(s), None, "{s}");
        }
    }

    #[test]
    fn internal_addresses_are_refused() {
        let cases = [
            ("127.0.0.1", "a loopback address"),
            ("127.255.1.2", "a loopback address"),
            ("0.0.0.0", "an unspecified address"),
            ("10.0.0.5", "a private address"),
            ("172.16.3.4", "a private address"),
            ("172.31.255.255", "a private address"),
            ("192.168.1.1", "a private address"),
            ("100.64.0.1", "a shared (CGNAT) address"),
            ("100.127.255.255", "a shared (CGNAT) address"),
            ("169.254.169.254", "a link-local address"),
            ("224.0.0.1", "a multicast address"),
            ("255.255.255.255", "a reserved address"),
            ("192.0.2.1", "a documentation address"),
            ("198.18.0.1", "a benchmarking address"),
            ("::", "an unspecified address"),
            ("::1", "a loopback address"),
            ("::ffff:127.0.0.1", "a loopback address"),
            ("::ffff:169.254.169.254", "a link-local address"),
            ("::ffff:10.1.2.3", "a private address"),
            ("::127.0.0.1", "a loopback address"),
            ("::8.8.8.8", "a deprecated IPv4-compatible address"),
            ("64:ff9b::a9fe:a9fe", "a link-local address"),
            ("fe80::1", "a link-local address"),
            ("fd00::1", "a private (unique local) address"),
            ("fc12::1", "a private (unique local) address"),
            ("ff02::1", "a multicast address"),
            ("2001:db8::1", "a documentation address"),
            ("2001::1", "a reserved address"),
            ("2002:7f00:1::", "a 6to4 address"),
            ("4000::1", "a reserved address"),
        ];
        for (s, want) in cases {
            assert_eq!(kind(s), Some(want), "{s}");
        }
    }

    #[test]
    fn mapped_addresses_are_matched_as_ipv4() {
        assert_eq!(
            canonical("::ffff:127.0.0.1".parse().unwrap()),
            "127.0.0.1".parse::<IpAddr>().unwrap()
        );
        assert_eq!(canonical("::1".parse().unwrap()), "::1".parse::<IpAddr>().unwrap());
    }
}
