//! The private-address rule: what kind of address an IP is ([`AddressClass`]), which
//! kinds a connection may reach ([`Reach`]), and the [`Resolver`] that enforces it on
//! the very addresses the client connects to.
//!
//! # Why in the resolver
//!
//! Checking a name's addresses first and connecting later lets the name's DNS answer
//! change in between (DNS rebinding: public for the check, `127.0.0.1` for the
//! connection). So the check is made where the client gets the addresses it connects
//! to: the client's resolver returns only those that pass, and none of the others ever
//! reach a socket.
//!
//! # How the resolver knows the hop
//!
//! Whether loopback is allowed depends on the pattern that admitted the URL being
//! connected (`localhost:9000` admits loopback on port 9000 only), but a resolver is
//! given a bare name. So each hop of a request runs inside [`REACH`], a task-local set
//! to what its URL's patterns allow, and the resolver reads it when it is called: the
//! client calls it while connecting, inside the poll of the request's own future. A
//! resolver called outside any hop reaches public addresses only, so a connection the
//! client made on its own could never reach more than a public one.
//!
//! The client pools connections by scheme, host and port, which alone decide a hop's
//! reach (the allow-list is fixed), so a pooled connection is only ever reused for
//! hops that would have been allowed to make it.

use std::error::Error;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use reqwest::dns::{Addrs, Name, Resolve, Resolving};

/// What kind of address an IP is, as far as the private-address rule cares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum AddressClass {
    /// Globally routable unicast: what a DNS name may resolve to.
    Public,
    /// `127.0.0.0/8`, `::1`.
    Loopback,
    /// `10/8`, `172.16/12`, `192.168/16`, `100.64/10` (carrier-grade NAT), `fc00::/7`.
    Private,
    /// `169.254/16` (where clouds keep their metadata services), `fe80::/10`.
    LinkLocal,
    /// `0.0.0.0/8`, `::`: Linux connects them to the local host.
    Unspecified,
    /// `224/4`, `ff00::/8`.
    Multicast,
    /// Everything else that is not global unicast: documentation, benchmarking and
    /// protocol ranges, `240/4`, IPv6 outside `2000::/3`.
    Reserved,
}

impl AddressClass {
    /// The class of `ip`. IPv6 addresses that embed an IPv4 one (mapped, NAT64, 6to4)
    /// have the class of the embedded address, since that is where they lead.
    pub(super) fn of(ip: IpAddr) -> AddressClass {
        match ip {
            IpAddr::V4(ip) => Self::of_v4(ip),
            IpAddr::V6(ip) => Self::of_v6(ip),
        }
    }

    fn of_v4(ip: Ipv4Addr) -> AddressClass {
        let [a, b, c, _] = ip.octets();
        match (a, b, c) {
            (0, ..) => AddressClass::Unspecified,
            (127, ..) => AddressClass::Loopback,
            (10, ..) | (172, 16..=31, _) | (192, 168, _) | (100, 64..=127, _) => AddressClass::Private,
            (169, 254, _) => AddressClass::LinkLocal,
            (224..=239, ..) => AddressClass::Multicast,
            // IETF protocol assignments, TEST-NET-1/2/3, the 6to4 relay, benchmarking,
            // and 240/4 with the broadcast address.
            (192, 0, 0 | 2) | (192, 88, 99) | (198, 18..=19, _) | (198, 51, 100) | (203, 0, 113) | (240..=255, ..) => {
                AddressClass::Reserved
            }
            _ => AddressClass::Public,
        }
    }

    fn of_v6(ip: Ipv6Addr) -> AddressClass {
        if let Some(v4) = ip.to_ipv4_mapped() {
            return Self::of_v4(v4);
        }
        let segments = ip.segments();
        let embedded = |high: u16, low: u16| Ipv4Addr::from((u32::from(high) << 16) | u32::from(low));
        match segments {
            [0, 0, 0, 0, 0, 0, 0, 0] => AddressClass::Unspecified,
            [0, 0, 0, 0, 0, 0, 0, 1] => AddressClass::Loopback,
            // NAT64's well-known prefix, 64:ff9b::/96.
            [0x64, 0xff9b, 0, 0, 0, 0, high, low] => Self::of_v4(embedded(high, low)),
            // 6to4, 2002::/16: the IPv4 address is in the next 32 bits.
            [0x2002, high, low, ..] => Self::of_v4(embedded(high, low)),
            [first, ..] if first & 0xfe00 == 0xfc00 => AddressClass::Private,
            [first, ..] if first & 0xffc0 == 0xfe80 => AddressClass::LinkLocal,
            [first, ..] if first & 0xff00 == 0xff00 => AddressClass::Multicast,
            // Outside global unicast 2000::/3; IETF protocol assignments 2001::/23 (Teredo
            // among them); documentation 2001:db8::/32 and 3fff::/20.
            [first, ..] if first & 0xe000 != 0x2000 => AddressClass::Reserved,
            [0x2001, second, ..] if second < 0x200 || second == 0xdb8 => AddressClass::Reserved,
            [first, ..] if first & 0xfff0 == 0x3ff0 => AddressClass::Reserved,
            _ => AddressClass::Public,
        }
    }

    /// For messages: "a loopback address".
    pub(super) fn describe(self) -> &'static str {
        match self {
            AddressClass::Public => "a public address",
            AddressClass::Loopback => "a loopback address",
            AddressClass::Private => "a private-network address",
            AddressClass::LinkLocal => "a link-local address",
            AddressClass::Unspecified => "an unspecified address",
            AddressClass::Multicast => "a multicast address",
            AddressClass::Reserved => "a reserved address",
        }
    }
}

/// Which addresses a DNS name admitted by the allow-list may resolve to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Reach {
    /// Public addresses only: what any pattern of a DNS name admits.
    Public,
    /// Public and loopback addresses: the pattern `localhost` (with its scheme and port).
    Loopback,
}

impl Reach {
    pub(super) fn permits(self, class: AddressClass) -> bool {
        match self {
            Reach::Public => class == AddressClass::Public,
            Reach::Loopback => matches!(class, AddressClass::Public | AddressClass::Loopback),
        }
    }
}

tokio::task_local! {
    /// What the hop being connected may reach: set around each hop's request (see the
    /// module docs).
    pub(super) static REACH: Reach;
}

/// A name resolved only to addresses its hop may not reach. The request that sees it
/// in its error's sources fails `denied`.
#[derive(Debug)]
pub(super) struct Refused {
    pub(super) address: IpAddr,
    pub(super) class: AddressClass,
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "the name resolves only to refused addresses, such as {} ({})", self.address, self.class.describe())
    }
}

impl Error for Refused {}

/// The system's resolver (`getaddrinfo`, so `/etc/hosts` and the system's DNS
/// settings apply), less the addresses the hop may not reach.
pub(super) struct Resolver;

impl Resolve for Resolver {
    fn resolve(&self, name: Name) -> Resolving {
        // Read now, while the hop's future is being polled; the lookup below runs later.
        let reach = REACH.try_with(|reach| *reach).unwrap_or(Reach::Public);
        let host = name.as_str().to_owned();
        Box::pin(async move {
            let found: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let (kept, refused): (Vec<SocketAddr>, Vec<SocketAddr>) =
                found.into_iter().partition(|addr| reach.permits(AddressClass::of(addr.ip())));
            if let (true, Some(first)) = (kept.is_empty(), refused.first()) {
                let address = first.ip();
                return Err(Box::new(Refused { address, class: AddressClass::of(address) }) as _);
            }
            tracing::trace!(host, ?kept, ?refused, "resolved");
            Ok(Box::new(kept.into_iter()) as Addrs)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn class(ip: &str) -> AddressClass {
        AddressClass::of(ip.parse().unwrap())
    }

    #[test]
    fn ipv4_classes() {
        for ip in ["8.8.8.8", "1.1.1.1", "93.184.216.34", "172.32.0.1", "100.128.0.1", "192.0.1.1", "198.20.0.1"] {
            assert_eq!(class(ip), AddressClass::Public, "{ip}");
        }
        assert_eq!(class("127.0.0.1"), AddressClass::Loopback);
        assert_eq!(class("127.255.0.9"), AddressClass::Loopback);
        for ip in ["10.1.2.3", "172.16.0.1", "172.31.255.255", "192.168.1.1", "100.64.0.1", "100.127.255.255"] {
            assert_eq!(class(ip), AddressClass::Private, "{ip}");
        }
        assert_eq!(class("169.254.169.254"), AddressClass::LinkLocal);
        assert_eq!(class("0.0.0.0"), AddressClass::Unspecified);
        assert_eq!(class("0.1.2.3"), AddressClass::Unspecified);
        assert_eq!(class("224.0.0.1"), AddressClass::Multicast);
        for ip in
            ["255.255.255.255", "240.0.0.1", "192.0.2.1", "198.51.100.1", "203.0.113.1", "198.18.0.1", "192.0.0.8"]
        {
            assert_eq!(class(ip), AddressClass::Reserved, "{ip}");
        }
    }

    #[test]
    fn ipv6_classes_follow_embedded_ipv4() {
        assert_eq!(class("2606:4700:4700::1111"), AddressClass::Public);
        assert_eq!(class("::1"), AddressClass::Loopback);
        assert_eq!(class("::"), AddressClass::Unspecified);
        assert_eq!(class("fd00::1"), AddressClass::Private);
        assert_eq!(class("fc00::1"), AddressClass::Private);
        assert_eq!(class("fe80::1"), AddressClass::LinkLocal);
        assert_eq!(class("ff02::1"), AddressClass::Multicast);
        assert_eq!(class("::ffff:127.0.0.1"), AddressClass::Loopback);
        assert_eq!(class("::ffff:10.0.0.1"), AddressClass::Private);
        assert_eq!(class("::ffff:8.8.8.8"), AddressClass::Public);
        assert_eq!(class("64:ff9b::a9fe:a9fe"), AddressClass::LinkLocal, "NAT64 of 169.254.169.254");
        assert_eq!(class("2002:7f00:1::"), AddressClass::Loopback, "6to4 of 127.0.0.1");
        assert_eq!(class("2002:808:808::1"), AddressClass::Public);
        assert_eq!(class("::127.0.0.1"), AddressClass::Reserved, "IPv4-compatible, deprecated");
        assert_eq!(class("2001:db8::1"), AddressClass::Reserved);
        assert_eq!(class("2001::1"), AddressClass::Reserved, "Teredo");
        assert_eq!(class("3fff::1"), AddressClass::Reserved);
        assert_eq!(class("100::1"), AddressClass::Reserved);
        assert_eq!(class("4000::1"), AddressClass::Reserved);
    }

    #[test]
    fn reach_admits_loopback_only_for_localhost_patterns() {
        assert!(Reach::Public.permits(AddressClass::Public));
        assert!(!Reach::Public.permits(AddressClass::Loopback));
        assert!(Reach::Loopback.permits(AddressClass::Loopback));
        assert!(!Reach::Loopback.permits(AddressClass::Private));
        assert!(!Reach::Loopback.permits(AddressClass::LinkLocal));
        assert!(!Reach::Loopback.permits(AddressClass::Unspecified));
    }

    fn resolve(reach: Option<Reach>, name: &str) -> Result<Vec<SocketAddr>, String> {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let name: Name = name.parse().unwrap();
        let lookup = async {
            let resolving = match reach {
                Some(reach) => REACH.sync_scope(reach, || Resolver.resolve(name)),
                None => Resolver.resolve(name),
            };
            resolving.await.map(Iterator::collect).map_err(|e| e.to_string())
        };
        runtime.block_on(lookup)
    }

    #[test]
    fn the_resolver_filters_what_it_returns_by_the_hop_reach() {
        // `localhost` is in every system's hosts file, so no DNS is asked.
        let refused = resolve(Some(Reach::Public), "localhost").unwrap_err();
        assert!(refused.contains("such as 127.0.0.1 (a loopback address)") || refused.contains("::1"), "{refused}");
        let found = resolve(Some(Reach::Loopback), "localhost").unwrap();
        assert!(!found.is_empty() && found.iter().all(|a| a.ip().is_loopback()), "{found:?}");
        assert!(resolve(None, "localhost").is_err(), "outside a hop: public addresses only");
    }
}
