//! Allow-list patterns (`[scheme://]host[:port]`), the [`Target`] of a URL, and the
//! [`AllowList`] that admits targets.

use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr};

use url::{Host, Url};

use super::address::Reach;
use crate::provider::{ErrorCode, Failure};

/// A scheme the provider speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Scheme {
    Http,
    Https,
}

impl Scheme {
    fn parse(scheme: &str) -> Option<Scheme> {
        match scheme.to_ascii_lowercase().as_str() {
            "http" => Some(Scheme::Http),
            "https" => Some(Scheme::Https),
            _ => None,
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            Scheme::Http => "http",
            Scheme::Https => "https",
        }
    }

    /// The port a URL or a pattern of this scheme means when it names none.
    fn default_port(self) -> u16 {
        match self {
            Scheme::Http => 80,
            Scheme::Https => 443,
        }
    }
}

/// The host part of a pattern.
#[derive(Clone, Debug, PartialEq, Eq)]
enum HostMatch {
    /// Exactly this DNS name: lowercase ASCII (IDNs in punycode), no trailing dot.
    Name(String),
    /// Any DNS name ending in `.` and this suffix; not the suffix itself.
    Subdomains(String),
    /// Any DNS name, never an IP literal: `*` must not quietly admit every address.
    AnyName,
    Ipv4(Ipv4Addr),
    Ipv6(Ipv6Addr),
}

/// The port part of a pattern.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PortMatch {
    /// None written: the default port of the URL's scheme (80 for http, 443 for https).
    Default,
    /// `*`.
    Any,
    Exactly(u16),
}

/// One entry of the `http` provider's allow-list: `[scheme://]host[:port]`.
///
/// - `scheme`: `http` or `https`; omitted, both.
/// - `host`: a DNS name (`api.example.com`), `*.example.com` (any subdomain, at any
///   depth, but not `example.com` itself), `*` (any DNS name, never an IP literal), an
///   IPv4 literal (`10.0.0.5`) or a bracketed IPv6 literal (`[::1]`).
/// - `port`: a number or `*`; omitted, the default port of the URL's scheme (80 for
///   http, 443 for https).
///
/// [`Display`](fmt::Display) writes the pattern back in this syntax, normalised
/// (lowercase, IDNs in punycode), so that it parses to the same pattern.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostPattern {
    scheme: Option<Scheme>,
    host: HostMatch,
    port: PortMatch,
}

impl HostPattern {
    /// Parses `[scheme://]host[:port]`.
    ///
    /// # Errors
    ///
    /// A message naming what is wrong: an empty pattern, a scheme other than http and
    /// https, a path, user information, a misplaced wildcard, a bad port, an IPv6
    /// address without brackets, or a host that is neither a DNS name nor an address.
    pub fn parse(text: &str) -> Result<HostPattern, String> {
        const SYNTAX: &str =
            "a pattern is `[scheme://]host[:port]`, such as `api.example.com` or `https://*.example.com:8443`";
        let text = text.trim();
        if text.is_empty() {
            return Err(format!("empty host pattern; {SYNTAX}"));
        }
        let (scheme, rest) = match text.split_once("://") {
            Some((scheme, rest)) => match Scheme::parse(scheme) {
                Some(parsed) => (Some(parsed), rest),
                None => {
                    return Err(format!(
                        "host pattern `{text}` has the scheme `{scheme}`; the scheme is `http` or `https`, or omitted for both"
                    ));
                }
            },
            None => (None, text),
        };
        if rest.contains(['/', '?', '#']) {
            return Err(format!("host pattern `{text}` has a path; it names a host and a port only: {SYNTAX}"));
        }
        if rest.contains('@') {
            return Err(format!("host pattern `{text}` has user information (`…@`); {SYNTAX}"));
        }
        let (host, port) = split_port(rest).map_err(|e| format!("host pattern `{text}`: {e}"))?;
        let host = parse_host(host).map_err(|e| format!("host pattern `{text}`: {e}"))?;
        let port = match port {
            None => PortMatch::Default,
            Some("*") => PortMatch::Any,
            Some(port) => match port.parse::<u16>() {
                Ok(port) if port != 0 => PortMatch::Exactly(port),
                _ => {
                    return Err(format!(
                        "host pattern `{text}`: the port `{port}` is not `*` or a number from 1 to 65535"
                    ));
                }
            },
        };
        Ok(HostPattern { scheme, host, port })
    }

    /// Whether `wider` admits every target this pattern admits: how a host checks a
    /// pattern asked for against the patterns it may grant (the service's tenant
    /// policies). Judged on the patterns alone, conservatively: a port written out is
    /// not within a pattern that leaves it to the scheme's default.
    pub fn within(&self, wider: &HostPattern) -> bool {
        let scheme = wider.scheme.is_none() || wider.scheme == self.scheme;
        let port = wider.port == PortMatch::Any || wider.port == self.port;
        let below = |name: &str, suffix: &str| name.strip_suffix(suffix).is_some_and(|rest| rest.ends_with('.'));
        let host = match (&wider.host, &self.host) {
            (HostMatch::AnyName, HostMatch::AnyName | HostMatch::Subdomains(_) | HostMatch::Name(_)) => true,
            (HostMatch::Subdomains(wider), HostMatch::Name(name)) => below(name, wider),
            (HostMatch::Subdomains(wider), HostMatch::Subdomains(suffix)) => suffix == wider || below(suffix, wider),
            (wider, host) => wider == host,
        };
        scheme && port && host
    }

    /// Whether this pattern admits `target`.
    fn admits(&self, target: &Target) -> bool {
        let scheme = self.scheme.is_none_or(|s| s == target.scheme);
        let port = match self.port {
            PortMatch::Default => target.port == target.scheme.default_port(),
            PortMatch::Any => true,
            PortMatch::Exactly(port) => target.port == port,
        };
        let host = match (&self.host, &target.host) {
            (HostMatch::Name(name), TargetHost::Name(host)) => name == host,
            (HostMatch::Subdomains(suffix), TargetHost::Name(host)) => {
                host.strip_suffix(suffix.as_str()).is_some_and(|label| label.len() > 1 && label.ends_with('.'))
            }
            (HostMatch::AnyName, TargetHost::Name(_)) => true,
            (HostMatch::Ipv4(a), TargetHost::Ipv4(b)) => a == b,
            (HostMatch::Ipv6(a), TargetHost::Ipv6(b)) => a == b,
            _ => false,
        };
        scheme && port && host
    }

    /// Whether the pattern is the name `localhost`: the one DNS name whose pattern
    /// admits loopback addresses (see the module docs).
    fn is_localhost(&self) -> bool {
        matches!(&self.host, HostMatch::Name(name) if name == "localhost")
    }
}

impl fmt::Display for HostPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(scheme) = self.scheme {
            write!(f, "{}://", scheme.as_str())?;
        }
        match &self.host {
            HostMatch::Name(name) => f.write_str(name)?,
            HostMatch::Subdomains(suffix) => write!(f, "*.{suffix}")?,
            HostMatch::AnyName => f.write_str("*")?,
            HostMatch::Ipv4(ip) => write!(f, "{ip}")?,
            HostMatch::Ipv6(ip) => write!(f, "[{ip}]")?,
        }
        match self.port {
            PortMatch::Default => Ok(()),
            PortMatch::Any => f.write_str(":*"),
            PortMatch::Exactly(port) => write!(f, ":{port}"),
        }
    }
}

impl std::str::FromStr for HostPattern {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        HostPattern::parse(text)
    }
}

/// `host[:port]` split at the port's colon; a bracketed IPv6 host keeps its brackets.
fn split_port(text: &str) -> Result<(&str, Option<&str>), String> {
    if text.starts_with('[') {
        let Some(end) = text.find(']') else {
            return Err("an IPv6 address opens `[` and never closes it".to_owned());
        };
        let (host, after) = text.split_at(end + 1);
        return match after {
            "" => Ok((host, None)),
            _ => match after.strip_prefix(':') {
                Some(port) => Ok((host, Some(port))),
                None => Err(format!("`{after}` after the address; only `:port` may follow")),
            },
        };
    }
    match text.split_once(':') {
        None => Ok((text, None)),
        Some((_, port)) if port.contains(':') => {
            Err("write an IPv6 address in brackets, such as `[::1]:8080`".to_owned())
        }
        Some((host, port)) => Ok((host, Some(port))),
    }
}

fn parse_host(host: &str) -> Result<HostMatch, String> {
    if host.is_empty() {
        return Err("no host".to_owned());
    }
    if let Some(inner) = host.strip_prefix('[') {
        let inner = inner.strip_suffix(']').unwrap_or(inner);
        return inner.parse().map(HostMatch::Ipv6).map_err(|_| format!("`{host}` is not an IPv6 address"));
    }
    if host == "*" {
        return Ok(HostMatch::AnyName);
    }
    if let Some(suffix) = host.strip_prefix("*.")
        && !suffix.contains('*')
    {
        return match dns_name(suffix)? {
            HostMatch::Name(suffix) => Ok(HostMatch::Subdomains(suffix)),
            _ => Err(format!("`{host}`: a wildcard stands for labels of a DNS name, not part of an address")),
        };
    }
    if host.contains('*') {
        return Err(format!("`{host}`: a wildcard stands only for whole leading labels: `*` or `*.example.com`"));
    }
    dns_name(host)
}

/// A DNS name (or an IPv4 address in any form a URL accepts) as a URL's host would be
/// normalised, so that patterns and URLs compare equal exactly when a URL parser would
/// say they name the same host.
fn dns_name(name: &str) -> Result<HostMatch, String> {
    let url = Url::parse(&format!("http://{name}/")).map_err(|e| format!("`{name}` is not a host name: {e}"))?;
    match url.host() {
        Some(Host::Domain(domain)) => {
            let domain = domain.strip_suffix('.').unwrap_or(domain);
            let valid = |label: &str| {
                !label.is_empty() && label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            };
            if domain.split('.').all(valid) {
                Ok(HostMatch::Name(domain.to_owned()))
            } else {
                Err(format!("`{name}` is not a host name: a name is labels of letters, digits, `-` and `_`"))
            }
        }
        Some(Host::Ipv4(ip)) => Ok(HostMatch::Ipv4(ip)),
        Some(Host::Ipv6(ip)) => Ok(HostMatch::Ipv6(ip)),
        None => Err(format!("`{name}` is not a host name")),
    }
}

/// The host of a URL, normalised like a pattern's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum TargetHost {
    Name(String),
    Ipv4(Ipv4Addr),
    Ipv6(Ipv6Addr),
}

impl fmt::Display for TargetHost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TargetHost::Name(name) => f.write_str(name),
            TargetHost::Ipv4(ip) => write!(f, "{ip}"),
            TargetHost::Ipv6(ip) => write!(f, "[{ip}]"),
        }
    }
}

/// Where a URL connects: what the allow-list is checked against.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Target {
    pub(super) scheme: Scheme,
    pub(super) host: TargetHost,
    pub(super) port: u16,
}

impl Target {
    /// The target of `url`.
    ///
    /// # Errors
    ///
    /// `invalid` for a scheme other than http and https, or a URL without a host.
    pub(super) fn of(url: &Url) -> Result<Target, Failure> {
        let invalid = |message: String| Failure::new(ErrorCode::Invalid, message);
        let scheme = Scheme::parse(url.scheme())
            .ok_or_else(|| invalid(format!("unsupported scheme `{}` in `{url}`; only http and https", url.scheme())))?;
        let host = match url.host() {
            Some(Host::Domain(name)) => TargetHost::Name(name.strip_suffix('.').unwrap_or(name).to_owned()),
            Some(Host::Ipv4(ip)) => TargetHost::Ipv4(ip),
            Some(Host::Ipv6(ip)) => TargetHost::Ipv6(ip),
            None => return Err(invalid(format!("`{url}` has no host"))),
        };
        let port = url.port().unwrap_or(scheme.default_port());
        Ok(Target { scheme, host, port })
    }

    /// `scheme://host[:port]/`, the port only when it is not the scheme's default: for
    /// messages, without the URL's path and credentials.
    pub(super) fn origin(&self) -> String {
        format!("{}://{}/", self.scheme.as_str(), self.grant())
    }

    /// The pattern that admits this target: `host`, with `:port` when it is not the
    /// scheme's default.
    pub(super) fn grant(&self) -> String {
        if self.port == self.scheme.default_port() {
            self.host.to_string()
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }

    /// Whether the target is the same origin as `other`'s: a redirect between origins
    /// drops the credentials the first was given.
    pub(super) fn same_origin(&self, other: &Target) -> bool {
        self == other
    }
}

/// The patterns an [`Http`](super::Http) admits.
#[derive(Clone, Debug, Default)]
pub(super) struct AllowList(Vec<HostPattern>);

impl AllowList {
    pub(super) fn new(patterns: Vec<HostPattern>) -> Self {
        AllowList(patterns)
    }

    /// Admits `target` or denies it, naming the pattern that would admit it. Admitted,
    /// the [`Reach`] says which addresses its name may resolve to.
    ///
    /// # Errors
    ///
    /// `denied` when no pattern admits the target.
    pub(super) fn admit(&self, target: &Target) -> Result<Reach, Failure> {
        let mut admitting = self.0.iter().filter(|pattern| pattern.admits(target)).peekable();
        if admitting.peek().is_none() {
            return Err(Failure::new(
                ErrorCode::Denied,
                format!(
                    "{} is not allowed: no --allow-host pattern matches {}:{} (grant it with --allow-host {})",
                    target.origin(),
                    target.host,
                    target.port,
                    target.grant(),
                ),
            ));
        }
        Ok(if admitting.any(HostPattern::is_localhost) { Reach::Loopback } else { Reach::Public })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pattern(text: &str) -> HostPattern {
        HostPattern::parse(text).unwrap_or_else(|e| panic!("`{text}` should parse: {e}"))
    }

    fn target(url: &str) -> Target {
        Target::of(&Url::parse(url).unwrap()).unwrap()
    }

    #[test]
    fn a_pattern_is_within_another_when_it_admits_nothing_more() {
        let within =
            |narrow: &str, wide: &str| HostPattern::parse(narrow).unwrap().within(&HostPattern::parse(wide).unwrap());
        assert!(within("api.example.com", "api.example.com"));
        assert!(within("api.example.com", "*.example.com") && within("*.eu.example.com", "*.example.com"));
        assert!(within("*.example.com", "*.example.com") && within("*.example.com", "*"));
        assert!(within("https://api.example.com:8443", "api.example.com:*"));
        assert!(!within("example.com", "*.example.com") && !within("badexample.com", "*.example.com"));
        assert!(!within("10.0.0.5", "*") && within("10.0.0.5", "10.0.0.5") && !within("*", "*.example.com"));
        assert!(
            !within("api.example.com", "https://api.example.com") && !within("api.example.com:81", "api.example.com")
        );
        assert!(!within("api.example.com:*", "api.example.com:443"));
    }

    fn admits(pattern_text: &str, url: &str) -> bool {
        pattern(pattern_text).admits(&target(url))
    }

    #[test]
    fn patterns_parse_and_display_back() {
        for text in [
            "example.com",
            "http://example.com",
            "https://example.com:8443",
            "*.example.com",
            "*",
            "*:*",
            "https://*:443",
            "10.0.0.5",
            "127.0.0.1:8080",
            "[::1]",
            "[::1]:*",
            "http://[2001:db8::1]:80",
            "localhost",
            "under_score.example",
        ] {
            assert_eq!(pattern(text).to_string(), text);
            assert_eq!(pattern(&pattern(text).to_string()), pattern(text));
        }
        assert_eq!(pattern(" HTTPS://API.Example.COM. ").to_string(), "https://api.example.com");
        assert_eq!(pattern("bücher.example").to_string(), "xn--bcher-kva.example");
        assert_eq!(pattern("[0:0::1]").to_string(), "[::1]");
        assert_eq!(pattern("127.1").to_string(), "127.0.0.1", "as a URL parser reads it");
    }

    #[test]
    fn bad_patterns_say_what_is_wrong() {
        let error = |text: &str| HostPattern::parse(text).expect_err(text);
        assert!(error("").contains("empty host pattern"));
        assert!(error("   ").contains("empty host pattern"));
        assert!(error("ftp://example.com").contains("the scheme `ftp`"));
        assert!(error("example.com/api").contains("has a path"));
        assert!(error("https://example.com/").contains("has a path"));
        assert!(error("example.com?x").contains("has a path"));
        assert!(error("user:pw@example.com").contains("user information"));
        assert!(error("example.com:0").contains("the port `0`"));
        assert!(error("example.com:http").contains("the port `http`"));
        assert!(error("example.com:").contains("the port ``"));
        assert!(error("example.com:99999").contains("the port `99999`"));
        assert!(error("::1").contains("in brackets"));
        assert!(error("[::1").contains("never closes"));
        assert!(error("[::1]x").contains("only `:port` may follow"));
        assert!(error("[example.com]").contains("is not an IPv6 address"));
        assert!(error("[fe80::1%eth0]").contains("is not an IPv6 address"));
        assert!(error("api.*.example.com").contains("whole leading labels"));
        assert!(error("*example.com").contains("whole leading labels"));
        assert!(error("*.*.example.com").contains("whole leading labels"));
        assert!(error("*.10.0.0.1").contains("not part of an address"));
        assert!(error("exa mple.com").contains("not a host name"));
        assert!(error("a..b").contains("not a host name"));
        assert!(error("a!b.example").contains("not a host name"));
        assert!(error(":80").contains("no host"));
    }

    #[test]
    fn names_match_exactly_and_wildcards_match_subdomains_only() {
        assert!(admits("example.com", "http://example.com/x"));
        assert!(admits("example.com", "https://EXAMPLE.com./x"));
        assert!(!admits("example.com", "http://www.example.com/"));
        assert!(!admits("example.com", "http://example.com.evil.test/"));
        assert!(admits("*.example.com", "https://api.example.com/"));
        assert!(admits("*.example.com", "https://a.b.example.com/"));
        assert!(!admits("*.example.com", "https://example.com/"), "not the apex");
        assert!(!admits("*.example.com", "https://badexample.com/"));
        assert!(admits("*", "https://anything.test/"));
        assert!(admits("*", "http://localhost/"), "a name: the resolver decides about its addresses");
    }

    #[test]
    fn wildcards_never_match_ip_literals() {
        for url in ["http://127.0.0.1/", "http://10.0.0.1/", "http://[::1]/", "http://2130706433/", "http://0x7f.1/"] {
            assert!(!admits("*", url), "{url}");
            assert!(!admits("*:*", url), "{url}");
        }
        assert!(admits("127.0.0.1", "http://2130706433/"), "the same address however the URL writes it");
        assert!(admits("[::1]:8080", "http://[0::1]:8080/"));
        assert!(!admits("127.0.0.1", "http://[::ffff:127.0.0.1]/"), "another literal");
        assert!(!admits("127.0.0.1", "http://127.0.0.2/"));
    }

    #[test]
    fn ports_and_schemes() {
        assert!(admits("example.com", "http://example.com/"));
        assert!(admits("example.com", "https://example.com/"));
        assert!(!admits("example.com", "http://example.com:443/"), "the default port of the URL's scheme");
        assert!(!admits("example.com", "http://example.com:8080/"));
        assert!(admits("example.com:8080", "http://example.com:8080/"));
        assert!(admits("example.com:8080", "https://example.com:8080/"));
        assert!(admits("example.com:*", "http://example.com:1/"));
        assert!(admits("https://example.com", "https://example.com:443/"));
        assert!(!admits("https://example.com", "http://example.com/"));
        assert!(!admits("http://example.com:*", "https://example.com/"));
        assert!(admits("http://example.com:80", "http://example.com/"));
    }

    #[test]
    fn targets_reject_other_schemes_and_hostless_urls() {
        let failure = |url: &str| Target::of(&Url::parse(url).unwrap()).unwrap_err();
        assert_eq!(failure("ftp://example.com/").code, ErrorCode::Invalid);
        assert!(failure("file:///etc/passwd").message.contains("unsupported scheme `file`"));
        assert!(failure("data:text/plain,hi").message.contains("unsupported scheme"));
    }

    #[test]
    fn the_allow_list_denies_with_the_grant_and_reaches_loopback_only_for_localhost() {
        let list = AllowList::new(vec![pattern("*:*"), pattern("localhost:9000"), pattern("127.0.0.1:8080")]);
        assert_eq!(list.admit(&target("http://example.com/")), Ok(Reach::Public));
        assert_eq!(list.admit(&target("http://localhost:9000/")), Ok(Reach::Loopback));
        assert_eq!(list.admit(&target("http://localhost:9001/")), Ok(Reach::Public), "admitted by `*:*` only");
        assert_eq!(list.admit(&target("http://127.0.0.1:8080/")), Ok(Reach::Public));
        let denied = list.admit(&target("http://user:secret@127.0.0.1:8081/path?q")).unwrap_err();
        assert_eq!(
            denied.to_string(),
            "denied: http://127.0.0.1:8081/ is not allowed: no --allow-host pattern matches 127.0.0.1:8081 \
             (grant it with --allow-host 127.0.0.1:8081)"
        );
        let empty = AllowList::default();
        let denied = empty.admit(&target("http://other.test:8080/")).unwrap_err();
        assert_eq!(
            denied.to_string(),
            "denied: http://other.test:8080/ is not allowed: no --allow-host pattern matches other.test:8080 \
             (grant it with --allow-host other.test:8080)"
        );
        let denied = empty.admit(&target("https://[::1]/")).unwrap_err();
        assert!(denied.message.ends_with("matches [::1]:443 (grant it with --allow-host [::1])"), "{denied}");
    }
}
