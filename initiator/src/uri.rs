//! `rblk://HOST[:PORT]/VOLUME`: where a volume lives.

use std::fmt;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs as _};
use std::str::FromStr;

use rblk_proto::{DEFAULT_PORT, MAX_VOLUME_NAME};

use crate::{Error, Result};

const SCHEME: &str = "rblk://";

/// A parsed volume URI: `rblk://HOST[:PORT][,HOST[:PORT]...]/VOLUME`. HOST is a name, an IPv4
/// address or an IPv6 address in brackets; PORT defaults to [`DEFAULT_PORT`]. Several hosts are
/// several addresses (paths) of one target: a session connects through the first that answers,
/// spreads its queues over all of them, and a reconnect tries them in turn.
///
/// ```
/// use rblk_initiator::Uri;
///
/// let uri = Uri::parse("rblk://[fe80::1]:7000/vol0")?;
/// assert_eq!((uri.host(), uri.port(), uri.volume()), ("fe80::1", 7000, "vol0"));
/// assert_eq!(uri.to_string(), "rblk://[fe80::1]:7000/vol0");
/// let two = Uri::parse("rblk://10.0.0.1,10.0.1.1:7000/vol0")?;
/// assert_eq!(two.hosts().count(), 2);
/// assert_eq!(two.to_string(), "rblk://10.0.0.1:7420,10.0.1.1:7000/vol0");
/// # Ok::<(), rblk_initiator::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Uri {
    /// At least one.
    hosts: Vec<(String, u16)>,
    volume: String,
}

/// Most addresses one URI may name.
const MAX_HOSTS: usize = 8;

fn parse_host(authority: &str, bad: &dyn Fn(&str) -> Error) -> Result<(String, u16)> {
    let (host, port) = if let Some(bracketed) = authority.strip_prefix('[') {
        let (host, after) = bracketed.split_once(']').ok_or_else(|| bad("missing ] after the IPv6 address"))?;
        if host.parse::<std::net::Ipv6Addr>().is_err() {
            return Err(bad("the part in brackets is not an IPv6 address"));
        }
        let port = match after {
            "" => None,
            _ => Some(after.strip_prefix(':').ok_or_else(|| bad("unexpected text after ]"))?),
        };
        (host, port)
    } else {
        match authority.split_once(':') {
            Some((_, port)) if port.contains(':') => {
                return Err(bad("IPv6 addresses must be written in brackets, like [fe80::1]"))
            }
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        }
    };
    if host.is_empty() {
        return Err(bad("the host is empty"));
    }
    if host.chars().any(|c| c.is_whitespace() || c.is_control() || "@?#[]".contains(c)) {
        return Err(bad("the host contains characters not allowed in a host name"));
    }
    let port = match port {
        None => DEFAULT_PORT,
        Some(p) if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) => match p.parse::<u16>() {
            Ok(0) | Err(_) => return Err(bad("the port must be between 1 and 65535")),
            Ok(port) => port,
        },
        Some(_) => return Err(bad("the port is not a number")),
    };
    Ok((host.to_owned(), port))
}

impl Uri {
    /// Parses `rblk://HOST[:PORT][,HOST[:PORT]...]/VOLUME`.
    pub fn parse(text: &str) -> Result<Uri> {
        let bad = |reason: &str| Error::Uri { uri: text.to_owned(), reason: reason.to_owned() };
        let scheme = text.get(..SCHEME.len()).filter(|s| s.eq_ignore_ascii_case(SCHEME));
        let rest = match scheme {
            Some(_) => &text[SCHEME.len()..],
            None => return Err(bad("it does not start with rblk://")),
        };
        let (authority, volume) = rest.split_once('/').ok_or_else(|| bad("no /VOLUME after the host"))?;
        // Not part of the volume's name; and a key has no place in a URI (shell history, ps).
        if volume.contains(['?', '#']) {
            return Err(bad(
                "rblk URIs take no ?query or #fragment (pass a key with --key-file or RBLK_KEY_FILE, a host \
                 identity with --host-id)",
            ));
        }
        let hosts = authority.split(',').map(|a| parse_host(a, &bad)).collect::<Result<Vec<_>>>()?;
        if hosts.len() > MAX_HOSTS {
            return Err(bad(&format!("more than {MAX_HOSTS} addresses")));
        }
        if volume.is_empty() {
            return Err(bad("the volume name is empty"));
        }
        if volume.len() > MAX_VOLUME_NAME {
            return Err(bad(&format!("the volume name is longer than {MAX_VOLUME_NAME} bytes")));
        }
        if volume.contains('/') || volume.chars().any(char::is_control) {
            return Err(bad("the volume name contains / or control characters"));
        }
        Ok(Uri { hosts, volume: volume.to_owned() })
    }

    /// Parses a target without a volume, `rblk://HOST[:PORT][,HOST[:PORT]...][/]`, for listing
    /// its volumes ([`crate::Session::list`]). A URI with a volume is accepted too (the volume
    /// is then ignored). [`Uri::volume`] is empty when none was given.
    pub fn parse_target(text: &str) -> Result<Uri> {
        let full = if text.trim_end_matches('/').matches('/').count() <= 2 {
            format!("{}/-", text.trim_end_matches('/'))
        } else {
            text.to_owned()
        };
        let mut uri = Uri::parse(&full).map_err(|e| match e {
            Error::Uri { reason, .. } => Error::Uri { uri: text.to_owned(), reason },
            other => other,
        })?;
        if full != text {
            uri.volume.clear();
        }
        Ok(uri)
    }

    /// The (first) host: a name or an IP address (IPv6 without brackets).
    pub fn host(&self) -> &str {
        &self.hosts[0].0
    }

    /// The (first) host's port.
    pub fn port(&self) -> u16 {
        self.hosts[0].1
    }

    /// Every host and port, in the URI's order.
    pub fn hosts(&self) -> impl Iterator<Item = (&str, u16)> {
        self.hosts.iter().map(|(h, p)| (h.as_str(), *p))
    }

    /// The volume's name.
    pub fn volume(&self) -> &str {
        &self.volume
    }

    /// The (first) target address: the host as an IP address, or the first address its name
    /// resolves to.
    pub fn resolve(&self) -> Result<SocketAddr> {
        resolve_one(self.host(), self.port())
    }

    /// One address per host, in the URI's order.
    pub fn resolve_all(&self) -> Result<Vec<SocketAddr>> {
        self.hosts().map(|(h, p)| resolve_one(h, p)).collect()
    }
}

fn resolve_one(host: &str, port: u16) -> Result<SocketAddr> {
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(SocketAddr::new(ip, port));
    }
    let resolve_err = |source| Error::Resolve { host: host.to_owned(), source };
    (host, port)
        .to_socket_addrs()
        .map_err(resolve_err)?
        .next()
        .ok_or_else(|| resolve_err(std::io::Error::other("the name has no address")))
}

impl fmt::Display for Uri {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(SCHEME)?;
        for (i, (host, port)) in self.hosts().enumerate() {
            let sep = if i == 0 { "" } else { "," };
            if host.contains(':') {
                write!(f, "{sep}[{host}]:{port}")?;
            } else {
                write!(f, "{sep}{host}:{port}")?;
            }
        }
        write!(f, "/{}", self.volume)
    }
}

impl FromStr for Uri {
    type Err = Error;

    fn from_str(s: &str) -> Result<Uri> {
        Uri::parse(s)
    }
}

/// Things [`Session::connect`](crate::Session::connect) accepts as a URI: text or a parsed [`Uri`].
pub trait ToUri {
    /// The parsed URI.
    fn to_uri(&self) -> Result<Uri>;
}

impl ToUri for Uri {
    fn to_uri(&self) -> Result<Uri> {
        Ok(self.clone())
    }
}

impl ToUri for str {
    fn to_uri(&self) -> Result<Uri> {
        Uri::parse(self)
    }
}

impl ToUri for String {
    fn to_uri(&self) -> Result<Uri> {
        Uri::parse(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(text: &str) -> (String, u16, String) {
        let u = Uri::parse(text).unwrap_or_else(|e| panic!("{text}: {e}"));
        (u.host().to_owned(), u.port(), u.volume)
    }

    fn err(text: &str) -> String {
        match Uri::parse(text) {
            Ok(u) => panic!("{text} parsed as {u:?}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn accepts() {
        assert_eq!(ok("rblk://10.0.0.1/vol0"), ("10.0.0.1".into(), DEFAULT_PORT, "vol0".into()));
        assert_eq!(ok("rblk://10.0.0.1:7000/vol0"), ("10.0.0.1".into(), 7000, "vol0".into()));
        assert_eq!(ok("RBLK://storage.example/data-1"), ("storage.example".into(), DEFAULT_PORT, "data-1".into()));
        assert_eq!(ok("rblk://[::1]/v"), ("::1".into(), DEFAULT_PORT, "v".into()));
        assert_eq!(ok("rblk://[fe80::1]:1/v"), ("fe80::1".into(), 1, "v".into()));
        let longest = "v".repeat(MAX_VOLUME_NAME);
        assert_eq!(ok(&format!("rblk://h/{longest}")).2, longest);
    }

    #[test]
    fn targets_without_a_volume() {
        for text in ["rblk://10.0.0.1", "rblk://10.0.0.1/", "rblk://[::1]:7000"] {
            let u = Uri::parse_target(text).unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!(u.volume(), "", "{text}");
        }
        assert_eq!(Uri::parse_target("rblk://h:1/v").unwrap().volume(), "v");
        assert!(Uri::parse_target("http://h").is_err());
        assert!(Uri::parse_target("rblk://h:x").is_err());
    }

    #[test]
    fn refuses_with_reasons() {
        assert!(err("http://h/v").contains("does not start with rblk://"));
        assert!(err("rblk://h").contains("no /VOLUME"));
        assert!(err("rblk://h/vol0?key=x").contains("no ?query"), "not a volume named vol0?key=x");
        assert!(err("rblk://h/vol0#frag").contains("no ?query"));
        assert!(err("rblk://h/").contains("volume name is empty"));
        assert!(err("rblk:///v").contains("host is empty"));
        assert!(err("rblk://h:/v").contains("port is not a number"));
        assert!(err("rblk://h:x/v").contains("port is not a number"));
        assert!(err("rblk://h:0/v").contains("between 1 and 65535"));
        assert!(err("rblk://h:65536/v").contains("between 1 and 65535"));
        assert!(err("rblk://fe80::1/v").contains("brackets"));
        assert!(err("rblk://[fe80::1/v").contains("missing ]"));
        assert!(err("rblk://[host]/v").contains("not an IPv6 address"));
        assert!(err("rblk://[::1]x/v").contains("after ]"));
        assert!(err("rblk://h/a/b").contains("contains /"));
        assert!(err(&format!("rblk://h/{}", "v".repeat(MAX_VOLUME_NAME + 1))).contains("longer than 64"));
        assert!(err("rblk://user@h/v").contains("not allowed"));
        assert!(err("rblk").contains("rblk://HOST[:PORT]/VOLUME"));
        assert!(err("rblk://h,/v").contains("host is empty"));
        assert!(err("rblk://h,x:y/v").contains("port is not a number"));
        assert!(err(&format!("rblk://{}h/v", "h,".repeat(MAX_HOSTS))).contains("more than 8 addresses"));
    }

    #[test]
    fn several_hosts() {
        let uri = Uri::parse("rblk://10.0.0.1,[fe80::1]:9,name:7/vol").unwrap();
        let hosts: Vec<_> = uri.hosts().collect();
        assert_eq!(hosts, [("10.0.0.1", DEFAULT_PORT), ("fe80::1", 9), ("name", 7)]);
        assert_eq!((uri.host(), uri.port()), ("10.0.0.1", DEFAULT_PORT));
        assert_eq!(uri.to_string(), "rblk://10.0.0.1:7420,[fe80::1]:9,name:7/vol");
        assert_eq!(Uri::parse(&uri.to_string()).unwrap(), uri);
        let two = Uri::parse("rblk://127.0.0.1:1,[::1]:2/v").unwrap();
        assert_eq!(two.resolve_all().unwrap(), ["127.0.0.1:1".parse().unwrap(), "[::1]:2".parse().unwrap()]);
    }

    #[test]
    fn display_round_trips() {
        for text in ["rblk://10.0.0.1:7420/vol0", "rblk://[fe80::1]:9/x", "rblk://name:1/y"] {
            let uri: Uri = text.parse().unwrap();
            assert_eq!(uri.to_string(), text);
            assert_eq!(Uri::parse(&uri.to_string()).unwrap(), uri);
        }
        assert_eq!(Uri::parse("rblk://h/v").unwrap().to_string(), format!("rblk://h:{DEFAULT_PORT}/v"));
    }

    #[test]
    fn resolves_addresses_and_names() {
        let uri = Uri::parse("rblk://[::1]:9000/v").unwrap();
        assert_eq!(uri.resolve().unwrap(), "[::1]:9000".parse().unwrap());
        let uri = Uri::parse("rblk://localhost:9000/v").unwrap();
        let addr = uri.resolve().unwrap();
        assert!(addr.ip().is_loopback() && addr.port() == 9000, "{addr}");
        assert_eq!("rblk://h/v".to_uri().unwrap(), String::from("rblk://h/v").to_uri().unwrap());
    }
}
