//! Command-line configuration of the daemon.

use std::net::SocketAddr;

/// A size with an optional binary suffix: `4096`, `64k`, `64M`, `1G`, `1T` (powers of 1024).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (digits, suffix) = s.split_at(split);
    let n: u64 = digits.parse().map_err(|_| format!("{s:?} is not a size (examples: 4096, 64k, 64M, 1G)"))?;
    let shift = match suffix.to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => return Err(format!("{s:?}: unknown size suffix {suffix:?} (use k, M, G or T)")),
    };
    n.checked_mul(1 << shift).ok_or_else(|| format!("{s:?} is too large"))
}

/// `--volume NAME:SIZE[:PATH]`: a RAM volume, or a durable one backed by the file or block
/// device at PATH (everything after the second colon).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeSpec {
    /// Name initiators open it by.
    pub name: String,
    /// Size in bytes.
    pub size: u64,
    /// Backing store, for a durable volume.
    pub path: Option<std::path::PathBuf>,
}

impl std::str::FromStr for VolumeSpec {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let (name, rest) = s
            .split_once(':')
            .ok_or_else(|| format!("{s:?}: expected NAME:SIZE[:PATH], e.g. vol0:1G or v:1G:/srv/v.img"))?;
        let (size, path) = match rest.split_once(':') {
            Some((_, "")) => return Err(format!("{s:?}: empty backing path after the second colon")),
            Some((size, path)) => (size, Some(std::path::PathBuf::from(path))),
            None => (rest, None),
        };
        if name.is_empty() || name.len() > 64 || !name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)) {
            return Err(format!("{name:?}: a volume name is 1-64 characters of A-Z a-z 0-9 - _ ."));
        }
        let size = parse_size(size)?;
        if size == 0 || size % 4096 != 0 {
            return Err(format!("{s:?}: the size must be a non-zero multiple of 4096"));
        }
        Ok(VolumeSpec { name: name.to_owned(), size, path })
    }
}

/// `--listen ADDR[:PORT]`, IPv6 in brackets; the port defaults to the protocol's.
pub fn parse_listen(s: &str) -> Result<SocketAddr, String> {
    if let Ok(a) = s.parse::<SocketAddr>() {
        return Ok(a);
    }
    let ip = s.trim_start_matches('[').trim_end_matches(']');
    ip.parse::<std::net::IpAddr>()
        .map(|ip| SocketAddr::new(ip, rblk_proto::DEFAULT_PORT))
        .map_err(|_| format!("{s:?}: expected ADDR or ADDR:PORT, e.g. 10.0.0.1, 10.0.0.1:7420, [fe80::1]:7420"))
}

/// Reads a pre-shared key file: its bytes without trailing whitespace (so `echo key > file`
/// works); an empty key is refused.
pub fn read_key_file(path: &std::path::Path) -> Result<Vec<u8>, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("reading key file {}: {e}", path.display()))?;
    key_from_bytes(&bytes).ok_or_else(|| format!("key file {} is empty", path.display()))
}

/// A key from a key file's bytes: trailing whitespace removed; None when nothing is left.
pub fn key_from_bytes(bytes: &[u8]) -> Option<Vec<u8>> {
    let key = bytes.trim_ascii_end();
    (!key.is_empty()).then(|| key.to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64k"), Ok(64 << 10));
        assert_eq!(parse_size("64M"), Ok(64 << 20));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert!(parse_size("1X").is_err());
        assert!(parse_size("").is_err());
        assert!(parse_size("99999999999T").is_err());
    }

    #[test]
    fn volumes_and_addresses() {
        assert_eq!("v:64M".parse(), Ok(VolumeSpec { name: "v".into(), size: 64 << 20, path: None }));
        let d: VolumeSpec = "d:1G:/srv/a:b.img".parse().unwrap();
        assert_eq!(d.path.as_deref(), Some(std::path::Path::new("/srv/a:b.img")));
        assert!("d:1G:".parse::<VolumeSpec>().is_err());
        assert!("v".parse::<VolumeSpec>().is_err());
        assert!("v:100".parse::<VolumeSpec>().is_err());
        assert!("a b:1G".parse::<VolumeSpec>().is_err());
        assert_eq!(parse_listen("10.0.0.1").unwrap().port(), rblk_proto::DEFAULT_PORT);
        assert_eq!(parse_listen("10.0.0.1:9").unwrap().port(), 9);
        assert_eq!(parse_listen("[::1]:9").unwrap().port(), 9);
        assert!(parse_listen("[::1]").unwrap().is_ipv6());
        assert!(parse_listen("nope").is_err());
    }
}
