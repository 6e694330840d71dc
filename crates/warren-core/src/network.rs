//! Network policy: the rules an `allowlist` sandbox's egress is checked
//! against. Pure parsing and matching; the node's proxy does the I/O.
//!
//! A rule is `HOST:PORT`, where HOST is an exact name (`pypi.org`), a
//! wildcard (`*.example.com`: any subdomain, not the apex), an IPv4 address
//! or an IPv4 CIDR (`10.0.0.0/8`). Deny rules win over allow rules. IP
//! addresses are reachable only through an address or CIDR rule, and names
//! that resolve to a non-public address only when such a rule covers it.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr};

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RuleError {
    #[error("network rule {0:?} must be HOST:PORT, e.g. \"pypi.org:443\", \"*.example.com:443\" or \"10.0.0.0/8:5000\"")]
    Shape(String),
    #[error("network rule {0:?}: the port must be a number from 1 to 65535")]
    Port(String),
    #[error("network rule {0:?}: {1}")]
    Host(String, String),
    /// The rule's host is neither a host name nor an IPv4 address.
    #[error("network rule {rule:?}: {source}")]
    HostName { rule: String, source: HostError },
}

/// Why a host a client wrote is neither a host name nor an IP address
/// ([`normalize_host`]); each message quotes the host as written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostError {
    /// `[...]` around something that is not an IPv6 address. The parser's
    /// own words ("invalid IPv6 address syntax") say no more than this
    /// message, so they stay in the source only.
    #[error("{host:?} is not a valid IPv6 address")]
    Ipv6 {
        host: String,
        source: std::net::AddrParseError,
    },
    /// A `:` outside brackets, in what is not an IPv6 address either.
    #[error("{host:?} is not a valid host")]
    Colon {
        host: String,
        source: std::net::AddrParseError,
    },
    #[error("{0:?} is not ASCII: write internationalised names in punycode (xn--...)")]
    NotAscii(String),
    #[error("{0:?} is not a valid host name (1 to 253 characters)")]
    Length(String),
    #[error("{0:?} is not a valid host name: labels are 1-63 letters, digits, '-' or '_'")]
    Label(String),
    /// Some resolvers would read it as an address.
    #[error("{0:?} is neither a valid IPv4 address nor a host name")]
    NumericLabel(String),
}

/// What a client asked to reach, after normalisation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Name(String),
    Ip(IpAddr),
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Name(n) => f.write_str(n),
            Target::Ip(IpAddr::V6(ip)) => write!(f, "[{ip}]"),
            Target::Ip(ip) => write!(f, "{ip}"),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Host {
    Exact(String),
    /// `*.x`, stored as `.x`.
    Suffix(String),
    Net {
        base: u32,
        prefix: u8,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Rule {
    text: String,
    allow: bool,
    host: Host,
    port: u16,
}

/// The outcome of a check, with the rule that decided it (if any) and a
/// reason a person can act on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Verdict {
    pub allowed: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,
    pub reason: String,
}

impl Verdict {
    fn allow(rule: &Rule) -> Verdict {
        Verdict {
            allowed: true,
            rule: Some(rule.text.clone()),
            reason: format!("allowed by rule {}", rule.text),
        }
    }
    fn open(reason: String) -> Verdict {
        Verdict {
            allowed: true,
            rule: None,
            reason,
        }
    }
    fn deny(rule: Option<&Rule>, reason: String) -> Verdict {
        Verdict {
            allowed: false,
            rule: rule.map(|r| r.text.clone()),
            reason,
        }
    }
}

/// A parsed, immutable policy. Policy changes build a new one.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Policy {
    rules: Vec<Rule>,
    /// Open egress: any public name or address on any port, unless a deny
    /// rule says otherwise.
    open: bool,
}

/// The label (value `true`) a node carries when its operator permits open
/// egress: placement sends `open` sandboxes only to such nodes.
pub const EGRESS_OPEN_LABEL: &str = "warren.dev/egress-open";

/// The ports an open sandbox's transparent path listens on besides those
/// its rules name: a client that ignores the proxy settings reaches the web
/// (`HTTP_PROXY`/`HTTPS_PROXY` carry every other port).
pub const OPEN_PORTS: [u16; 2] = [80, 443];

impl Policy {
    /// Parses allow and deny rules; `defaults` (the node's global allowlist)
    /// are merged into the allow rules.
    pub fn parse(
        allow: &[String],
        deny: &[String],
        defaults: &[String],
    ) -> Result<Policy, RuleError> {
        let mut rules = Vec::new();
        for text in allow.iter().chain(defaults) {
            rules.push(parse_rule(text, true)?);
        }
        for text in deny {
            rules.push(parse_rule(text, false)?);
        }
        Ok(Policy { rules, open: false })
    }

    /// The same rules with open egress (`NetworkMode::Open`).
    pub fn open(mut self) -> Policy {
        self.open = true;
        self
    }

    pub fn is_open(&self) -> bool {
        self.open
    }

    /// Checks a connection to `target:port` as the client named it.
    pub fn check(&self, target: &Target, port: u16) -> Verdict {
        let matching = |allow: bool| {
            self.rules
                .iter()
                .find(|r| r.allow == allow && r.port == port && r.matches(target))
        };
        if let Some(rule) = matching(false) {
            return Verdict::deny(
                Some(rule),
                format!("{target}:{port} is denied by rule {}", rule.text),
            );
        }
        if let Target::Ip(IpAddr::V6(_)) = target {
            return Verdict::deny(
                None,
                format!("{target}:{port}: IPv6 does not leave the sandbox"),
            );
        }
        if let Some(rule) = matching(true) {
            return Verdict::allow(rule);
        }
        if self.open {
            match target {
                Target::Name(_) => return Verdict::open(format!("{target}:{port}: open egress")),
                Target::Ip(IpAddr::V4(ip)) if is_public(*ip) => {
                    return Verdict::open(format!(
                        "{target}:{port}: open egress to a public address"
                    ))
                }
                _ => {}
            }
        }
        let reason = match target {
            Target::Ip(_) => format!(
                "{target}:{port}: an IP address is reachable only through an address or CIDR rule"
            ),
            Target::Name(_) => format!("no rule allows {target}:{port}"),
        };
        Verdict::deny(None, reason)
    }

    /// Checks an address a name resolved to: non-public addresses (private,
    /// loopback, link-local, metadata, ...) need an address or CIDR rule, so
    /// a name cannot be pointed at the inside (DNS rebinding). A `pinned`
    /// address is the operator's own mapping of the name (not a DNS answer)
    /// and passes unless a deny rule covers it.
    pub fn check_resolved(&self, name: &str, ip: IpAddr, port: u16, pinned: bool) -> Verdict {
        let target = Target::Ip(ip);
        let covering = |allow: bool| {
            self.rules.iter().find(|r| {
                r.allow == allow
                    && r.port == port
                    && matches!(r.host, Host::Net { .. })
                    && r.matches(&target)
            })
        };
        if let Some(rule) = covering(false) {
            return Verdict::deny(
                Some(rule),
                format!("{name} resolves to {ip}, denied by rule {}", rule.text),
            );
        }
        let IpAddr::V4(v4) = ip else {
            return Verdict::deny(
                None,
                format!("{name} resolves to {ip}: IPv6 does not leave the sandbox"),
            );
        };
        if is_public(v4) || pinned {
            return Verdict {
                allowed: true,
                rule: None,
                reason: format!(
                    "{name} resolves to {} address {ip}",
                    if pinned {
                        "the node's pinned"
                    } else {
                        "public"
                    }
                ),
            };
        }
        match covering(true) {
            Some(rule) => Verdict::allow(rule),
            None => Verdict::deny(
                None,
                format!("{name} resolves to non-public address {ip}; only an address or CIDR rule allows that"),
            ),
        }
    }

    /// Whether some allow rule names this host (on any port), which is what
    /// the sandbox's DNS stub answers for.
    pub fn names(&self, name: &str) -> bool {
        if self.open {
            return true;
        }
        let target = Target::Name(name.to_string());
        let allowed_on = |port| self.check(&target, port).allowed;
        self.rules
            .iter()
            .filter(|r| r.allow && !matches!(r.host, Host::Net { .. }))
            .any(|r| r.matches(&target) && allowed_on(r.port))
    }

    /// Every port some allow rule names: the ports the sandbox's transparent
    /// path listens on.
    pub fn ports(&self) -> BTreeSet<u16> {
        let open = if self.open { &OPEN_PORTS[..] } else { &[] };
        self.rules
            .iter()
            .filter(|r| r.allow)
            .map(|r| r.port)
            .chain(open.iter().copied())
            .collect()
    }

    pub fn is_empty(&self) -> bool {
        self.rules.is_empty() && !self.open
    }
}

impl Rule {
    fn matches(&self, target: &Target) -> bool {
        match (&self.host, target) {
            (Host::Exact(h), Target::Name(n)) => h == n,
            (Host::Suffix(s), Target::Name(n)) => n.len() > s.len() && n.ends_with(s.as_str()),
            (Host::Net { base, prefix }, Target::Ip(IpAddr::V4(ip))) => {
                let mask = if *prefix == 0 {
                    0
                } else {
                    u32::MAX << (32 - prefix)
                };
                u32::from(*ip) & mask == *base
            }
            _ => false,
        }
    }
}

fn parse_rule(text: &str, allow: bool) -> Result<Rule, RuleError> {
    let shape = || RuleError::Shape(text.to_string());
    let (host, port) = text.trim().rsplit_once(':').ok_or_else(shape)?;
    if host.is_empty() || host.contains(':') || host.starts_with('[') {
        // IPv6 never leaves a sandbox, so there is nothing to allow.
        return Err(RuleError::Host(
            text.into(),
            "IPv6 rules are not supported: IPv6 does not leave the sandbox".into(),
        ));
    }
    let port: u16 = port
        .parse()
        .ok()
        .filter(|p| *p != 0)
        .ok_or_else(|| RuleError::Port(text.to_string()))?;
    let bad = |why: &str| RuleError::Host(text.to_string(), why.to_string());
    let host_name = |source| RuleError::HostName {
        rule: text.to_string(),
        source,
    };
    let host = if let Some((addr, prefix)) = host.split_once('/') {
        let addr: Ipv4Addr = addr.parse().map_err(|_| bad("a CIDR is an IPv4 address in dotted form, a '/' and a prefix length, e.g. 10.0.0.0/8"))?;
        let prefix: u8 = prefix
            .parse()
            .ok()
            .filter(|p| *p <= 32)
            .ok_or_else(|| bad("the prefix length must be 0 to 32"))?;
        let mask = if prefix == 0 {
            0
        } else {
            u32::MAX << (32 - prefix)
        };
        if u32::from(addr) & !mask != 0 {
            return Err(bad("the address has bits set beyond the prefix length"));
        }
        Host::Net {
            base: u32::from(addr),
            prefix,
        }
    } else if let Some(suffix) = host.strip_prefix("*.") {
        match normalize_host(suffix).map_err(host_name)? {
            Target::Name(n) if n.contains('.') => Host::Suffix(format!(".{n}")),
            Target::Name(_) => {
                return Err(bad(
                    "a wildcard needs at least two labels after '*.', e.g. *.example.com",
                ))
            }
            Target::Ip(_) => return Err(bad("a wildcard cannot cover an IP address")),
        }
    } else {
        match normalize_host(host).map_err(host_name)? {
            Target::Name(n) => Host::Exact(n),
            Target::Ip(IpAddr::V4(ip)) => Host::Net {
                base: u32::from(ip),
                prefix: 32,
            },
            Target::Ip(IpAddr::V6(_)) => return Err(bad("IPv6 does not leave the sandbox")),
        }
    };
    Ok(Rule {
        text: text.trim().to_string(),
        allow,
        host,
        port,
    })
}

/// Normalises a host as a client wrote it: lower case, no trailing dot, and
/// every spelling of an IPv4 address (`127.1`, `2130706433`, `0x7f.0.0.1`,
/// octal) read the way `inet_aton` reads it, so an address never passes as a
/// name. Non-ASCII names must be given in punycode.
pub fn normalize_host(raw: &str) -> Result<Target, HostError> {
    let host = raw.trim();
    if let Some(inner) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        return inner
            .parse::<std::net::Ipv6Addr>()
            .map(|ip| match ip.to_ipv4_mapped() {
                Some(v4) => Target::Ip(IpAddr::V4(v4)),
                None => Target::Ip(IpAddr::V6(ip)),
            })
            .map_err(|source| HostError::Ipv6 {
                host: raw.to_string(),
                source,
            });
    }
    if host.contains(':') {
        return host
            .parse::<std::net::Ipv6Addr>()
            .map(|ip| Target::Ip(IpAddr::V6(ip)))
            .map_err(|source| HostError::Colon {
                host: raw.to_string(),
                source,
            });
    }
    let host = host.strip_suffix('.').unwrap_or(host).to_ascii_lowercase();
    if !host.is_ascii() {
        return Err(HostError::NotAscii(raw.to_string()));
    }
    if host.is_empty() || host.len() > 253 {
        return Err(HostError::Length(raw.to_string()));
    }
    if let Some(ip) = inet_aton(&host) {
        return Ok(Target::Ip(IpAddr::V4(ip)));
    }
    for label in host.split('.') {
        let ok = !label.is_empty()
            && label.len() <= 63
            && label
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            && !label.starts_with('-')
            && !label.ends_with('-');
        if !ok {
            return Err(HostError::Label(raw.to_string()));
        }
    }
    // A name whose last label is numeric would be read as an address by some
    // resolvers; refuse it rather than guess.
    if host
        .rsplit('.')
        .next()
        .is_some_and(|l| l.bytes().all(|b| b.is_ascii_digit()) || l.starts_with("0x"))
    {
        return Err(HostError::NumericLabel(raw.to_string()));
    }
    Ok(Target::Name(host))
}

/// `inet_aton`'s reading of an IPv4 address: one to four parts, each
/// decimal, octal (leading 0) or hex (0x); the last part fills the rest.
fn inet_aton(s: &str) -> Option<Ipv4Addr> {
    let parts: Vec<&str> = s.split('.').collect();
    if parts.is_empty() || parts.len() > 4 {
        return None;
    }
    let mut nums = Vec::with_capacity(parts.len());
    for p in &parts {
        let v = if let Some(hex) = p.strip_prefix("0x").or_else(|| p.strip_prefix("0X")) {
            if hex.is_empty() {
                0
            } else {
                u64::from_str_radix(hex, 16).ok()?
            }
        } else if p.len() > 1 && p.starts_with('0') {
            u64::from_str_radix(&p[1..], 8).ok()?
        } else {
            if p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            p.parse::<u64>().ok()?
        };
        nums.push(v);
    }
    let (last, head) = nums.split_last()?;
    if head.iter().any(|v| *v > 255) {
        return None;
    }
    let rest_bits = 8 * (4 - head.len() as u32);
    if rest_bits < 64 && *last >= 1u64 << rest_bits {
        return None;
    }
    let mut value: u64 = 0;
    for (i, v) in head.iter().enumerate() {
        value |= v << (24 - 8 * i as u32);
    }
    value |= last;
    u32::try_from(value).ok().map(Ipv4Addr::from)
}

/// Whether an address is on the public internet: not private, loopback,
/// link-local (cloud metadata), shared, documentation, multicast or reserved.
pub fn is_public(ip: Ipv4Addr) -> bool {
    const BLOCKED: &[(u32, u8)] = &[
        (0x0000_0000, 8),  // 0.0.0.0/8
        (0x0A00_0000, 8),  // 10/8
        (0x6440_0000, 10), // 100.64/10 (carrier-grade NAT)
        (0x7F00_0000, 8),  // loopback
        (0xA9FE_0000, 16), // link-local, incl. 169.254.169.254 metadata
        (0xAC10_0000, 12), // 172.16/12
        (0xC000_0000, 24), // 192.0.0/24
        (0xC000_0200, 24), // TEST-NET-1
        (0xC0A8_0000, 16), // 192.168/16
        (0xC612_0000, 15), // 198.18/15 (benchmarking)
        (0xC633_6400, 24), // TEST-NET-2
        (0xCB00_7100, 24), // TEST-NET-3
        (0xE000_0000, 4),  // multicast
        (0xF000_0000, 4),  // reserved, incl. broadcast
    ];
    let v = u32::from(ip);
    !BLOCKED
        .iter()
        .any(|(base, prefix)| v & (u32::MAX << (32 - prefix)) == *base)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(allow: &[&str], deny: &[&str]) -> Policy {
        let v = |x: &[&str]| x.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        Policy::parse(&v(allow), &v(deny), &[]).expect("policy")
    }
    fn name(n: &str) -> Target {
        Target::Name(n.into())
    }

    #[test]
    fn every_spelling_of_an_address_is_an_address() {
        let lo = Target::Ip(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1)));
        for s in [
            "127.0.0.1",
            "127.1",
            "2130706433",
            "0x7f000001",
            "0x7f.1",
            "0177.0.0.1",
            "127.0.1",
            "[::ffff:127.0.0.1]",
            "127.0.0.1.",
        ] {
            assert_eq!(normalize_host(s), Ok(lo.clone()), "{s}");
        }
        assert_eq!(normalize_host("Example.COM."), Ok(name("example.com")));
        assert!(normalize_host("1.2.3.256").is_err());
        assert!(normalize_host("a..b").is_err());
        assert!(normalize_host("bücher.de").is_err());
        assert!(normalize_host("foo.123").is_err());
        // The messages quote the host as written; the parser's error stays
        // reachable as the source.
        let bad_v6 = normalize_host("[zz]").expect_err("not an address");
        assert_eq!(bad_v6.to_string(), r#""[zz]" is not a valid IPv6 address"#);
        assert!(std::error::Error::source(&bad_v6).is_some());
        assert!(matches!(
            normalize_host("[::1]"),
            Ok(Target::Ip(IpAddr::V6(_)))
        ));
    }

    #[test]
    fn open_egress_reaches_public_names_and_addresses_but_not_the_inside() {
        let pol = p(&["10.1.0.0/16:5432"], &["evil.test:443"]).open();
        let ip = |a, b, c, d| Target::Ip(IpAddr::V4(Ipv4Addr::new(a, b, c, d)));
        assert!(pol.check(&name("pypi.org"), 8443).allowed);
        assert!(pol.names("anything.test"));
        assert!(pol.check(&ip(1, 1, 1, 1), 53).allowed);
        assert!(!pol.check(&name("evil.test"), 443).allowed);
        // Internal and metadata addresses still need an address rule.
        assert!(!pol.check(&ip(169, 254, 169, 254), 80).allowed);
        assert!(!pol.check(&ip(10, 2, 0, 1), 5432).allowed);
        assert!(pol.check(&ip(10, 1, 0, 1), 5432).allowed);
        assert!(
            !pol.check_resolved(
                "x.test",
                IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1)),
                443,
                false
            )
            .allowed
        );
        assert_eq!(pol.ports(), BTreeSet::from([80, 443, 5432]));
        assert!(!p(&[], &[]).check(&name("pypi.org"), 443).allowed);
    }

    #[test]
    fn deny_wins_and_wildcards_exclude_the_apex() {
        let pol = p(
            &["*.example.com:443", "pypi.org:443"],
            &["evil.example.com:443"],
        );
        assert!(pol.check(&name("a.example.com"), 443).allowed);
        assert!(pol.check(&name("a.b.example.com"), 443).allowed);
        assert!(!pol.check(&name("example.com"), 443).allowed);
        assert!(!pol.check(&name("evil.example.com"), 443).allowed);
        assert!(!pol.check(&name("pypi.org"), 80).allowed);
        assert!(!pol.check(&name("notpypi.org"), 443).allowed);
        let v = pol.check(&name("evil.example.com"), 443);
        assert_eq!(v.rule.as_deref(), Some("evil.example.com:443"));
    }

    #[test]
    fn addresses_need_an_address_rule() {
        let pol = p(&["pypi.org:443", "10.1.0.0/16:5000"], &[]);
        let ip = |a, b, c, d| Target::Ip(IpAddr::V4(Ipv4Addr::new(a, b, c, d)));
        assert!(!pol.check(&ip(151, 101, 0, 223), 443).allowed);
        assert!(pol.check(&ip(10, 1, 2, 3), 5000).allowed);
        assert!(!pol.check(&ip(10, 2, 0, 1), 5000).allowed);
        assert!(!pol.check(&Target::Ip("::1".parse().unwrap()), 443).allowed);
        assert!(
            pol.check_resolved("pypi.org", "151.101.0.223".parse().unwrap(), 443, false)
                .allowed
        );
        assert!(
            !pol.check_resolved("pypi.org", "169.254.169.254".parse().unwrap(), 443, false)
                .allowed
        );
        assert!(
            !pol.check_resolved("pypi.org", "127.0.0.1".parse().unwrap(), 443, false)
                .allowed
        );
        assert!(
            pol.check_resolved("data", "10.1.9.9".parse().unwrap(), 5000, false)
                .allowed
        );
    }

    #[test]
    fn pinned_addresses_pass_unless_denied() {
        let pol = p(&["data.internal:5000"], &["10.9.0.0/16:5000"]);
        let ip = |s: &str| s.parse::<IpAddr>().expect("ip");
        assert!(
            !pol.check_resolved("data.internal", ip("10.1.0.5"), 5000, false)
                .allowed
        );
        assert!(
            pol.check_resolved("data.internal", ip("10.1.0.5"), 5000, true)
                .allowed
        );
        assert!(
            !pol.check_resolved("data.internal", ip("10.9.0.5"), 5000, true)
                .allowed
        );
    }

    #[test]
    fn bad_rules_say_what_is_wrong() {
        for bad in [
            "pypi.org",
            "pypi.org:0",
            "pypi.org:http",
            ":443",
            "*.com:443",
            "10.0.0.1/8:1",
            "[::1]:443",
            "a b:1",
        ] {
            assert!(Policy::parse(&[bad.into()], &[], &[]).is_err(), "{bad}");
        }
    }

    #[test]
    fn names_and_ports_feed_the_dns_stub_and_listeners() {
        let pol = p(
            &["a.test:443", "*.b.test:80", "10.0.0.0/8:5000"],
            &["x.b.test:80"],
        );
        assert!(pol.names("a.test"));
        assert!(pol.names("y.b.test"));
        assert!(!pol.names("x.b.test"));
        assert!(!pol.names("c.test"));
        assert_eq!(
            pol.ports().into_iter().collect::<Vec<_>>(),
            vec![80, 443, 5000]
        );
    }
}
