//! What an initiator trusts a target with: which key it may use for an address (the local
//! target's key only for this host's own addresses), and which target identity an address must
//! prove (pinned on first use in [`KNOWN_TARGETS`], as SSH's `known_hosts`, or given with
//! `--target-id`). The exchange itself is in `session.rs`; the proofs in
//! [`rblk_proto::mutual_mac`].

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};

use rblk_fabric::trusted::{self, Last, OFlag};
use rblk_proto::TARGET_ID_LEN;

/// Where the initiator pins target identities by address, when nothing else is named.
pub const KNOWN_TARGETS: &str = "/var/lib/rblk/known_targets";

/// The environment variable that names another pin file (`--known-targets`).
pub const KNOWN_TARGETS_ENV: &str = "RBLK_KNOWN_TARGETS";

/// The largest pin file read: a line is under 100 bytes, so this is about 10,000 targets.
const MAX_KNOWN_TARGETS: u64 = 1 << 20;

/// A target's identity, as `--target-id` and the pin file spell it: 32 hexadecimal digits.
pub fn parse_target_id(text: &str) -> std::result::Result<[u8; TARGET_ID_LEN], String> {
    rblk_proto::from_hex::<TARGET_ID_LEN>(text.trim()).ok_or_else(|| {
        format!("{text:?} is not a target identity: 32 hexadecimal digits (the target's STATE_DIR/target.id)")
    })
}

/// Whether `ip` is one of this host's own addresses (loopback, or an address a socket can
/// bind): where a target's key made on this host may be used.
pub fn is_local_addr(ip: IpAddr) -> bool {
    let ip = ip.to_canonical();
    ip.is_loopback() || UdpSocket::bind(SocketAddr::new(ip, 0)).is_ok()
}

/// Why the pin file says nothing.
#[derive(Debug, PartialEq, Eq)]
pub enum PinError {
    /// This user may not read it (a user other than root, with root's pins in a 0700
    /// directory): pins do not protect this run.
    Unreadable(String),
    /// It is not to be trusted, or does not parse: refuse, do not skip it.
    Bad(String),
}

impl std::fmt::Display for PinError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PinError::Unreadable(t) | PinError::Bad(t) => f.write_str(t),
        }
    }
}

/// What the pin file says of an address.
#[derive(Debug, PartialEq, Eq)]
pub enum Pin {
    /// Nothing yet.
    Unknown,
    /// This identity, from this line.
    Known([u8; TARGET_ID_LEN], usize),
}

/// The pin file's key for an address: its canonical IP and port (`[::ffff:10.0.0.1]:7420` and
/// `10.0.0.1:7420` are one target).
fn addr_key(addr: SocketAddr) -> String {
    SocketAddr::new(addr.ip().to_canonical(), addr.port()).to_string()
}

/// Looks `addr` up in the pin file at `path`: `ADDR:PORT HEX` lines, `#` comments. The file
/// is reached as key files are ([`rblk_fabric::trusted`]): a file, or a directory above it, that
/// someone other than root or this user controls proves nothing and is refused, as is a line
/// that does not parse (it could be the pin that matters).
pub fn lookup(path: &Path, addr: SocketAddr) -> std::result::Result<Pin, PinError> {
    let denied = |e: &dyn std::fmt::Display| PinError::Unreadable(format!("cannot read {}: {e}", path.display()));
    let walked = match trusted::walk(path, Last::Private) {
        Ok(w) => w,
        Err(e) if e.is_not_found() => return Ok(Pin::Unknown),
        Err(trusted::PathError::Io { source, .. }) if source.kind() == std::io::ErrorKind::PermissionDenied => {
            return Err(denied(&source))
        }
        Err(e) => return Err(PinError::Bad(format!("pin file: {e}"))),
    };
    if walked.stat().is_none() {
        return Ok(Pin::Unknown);
    }
    let file = walked.open(OFlag::O_RDONLY).map_err(|e| match e.kind() {
        std::io::ErrorKind::PermissionDenied => denied(&e),
        _ => PinError::Bad(format!("cannot read {}: {e}", path.display())),
    })?;
    let bad = PinError::Bad;
    let mut text = String::new();
    file.take(MAX_KNOWN_TARGETS + 1)
        .read_to_string(&mut text)
        .map_err(|e| bad(format!("cannot read {}: {e}", path.display())))?;
    if text.len() as u64 > MAX_KNOWN_TARGETS {
        return Err(bad(format!("{} is larger than {MAX_KNOWN_TARGETS} bytes: not a pin file", path.display())));
    }
    let key = addr_key(addr);
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let malformed = || bad(format!("{}:{}: not `ADDRESS:PORT TARGET-ID`", path.display(), n + 1));
        let (a, id) = line.split_once(char::is_whitespace).ok_or_else(malformed)?;
        let a: SocketAddr = a.parse().map_err(|_| malformed())?;
        let id = parse_target_id(id).map_err(|e| bad(format!("{}:{}: {e}", path.display(), n + 1)))?;
        if addr_key(a) == key {
            return Ok(Pin::Known(id, n + 1));
        }
    }
    Ok(Pin::Unknown)
}

/// Pins `id` for `addr`: appends one line (one `write` with `O_APPEND`, so concurrent initiators
/// do not interleave), making the file (0644) and its directory (0755) if they are missing,
/// through the same checked walk as [`lookup`].
pub fn pin(path: &Path, addr: SocketAddr, id: &[u8; TARGET_ID_LEN]) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        trusted::ensure_dir(dir).map_err(std::io::Error::other)?;
    }
    let walked = trusted::walk(path, Last::Private).map_err(std::io::Error::other)?;
    let mut f = match walked.stat() {
        Some(_) => walked.open(OFlag::O_WRONLY | OFlag::O_APPEND)?,
        None => walked.create(0o644)?,
    };
    f.write_all(format!("{} {}\n", addr_key(addr), rblk_proto::to_hex(id)).as_bytes())?;
    f.sync_all()
}

/// The pin file to use: `flag`, else [`KNOWN_TARGETS_ENV`], else [`KNOWN_TARGETS`]; `none`
/// pins nothing (identities are then checked only against `--target-id`).
pub fn known_targets_path(flag: Option<&Path>) -> Option<PathBuf> {
    let env = std::env::var_os(KNOWN_TARGETS_ENV).filter(|v| !v.is_empty());
    let path = flag.map(Path::to_owned).or(env.map(PathBuf::from)).unwrap_or_else(|| PathBuf::from(KNOWN_TARGETS));
    (path != Path::new("none")).then_some(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Would catch: a pin for one port or address matching another, a mapped IPv6 spelling
    /// treated as a different target, a pin file others can write accepted, or a line that does
    /// not parse skipped (it could be the pin that matters).
    #[test]
    fn pins_by_address_and_refuses_files_others_control() {
        let dir = std::env::temp_dir().join(format!("rblk-pins-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let path = dir.join("sub/known_targets");
        let a: SocketAddr = "10.0.0.1:7420".parse().unwrap();
        assert_eq!(lookup(&path, a), Ok(Pin::Unknown), "no file yet");
        pin(&path, a, &[1; TARGET_ID_LEN]).unwrap();
        pin(&path, "10.0.0.1:7421".parse().unwrap(), &[2; TARGET_ID_LEN]).unwrap();
        assert_eq!(lookup(&path, a), Ok(Pin::Known([1; TARGET_ID_LEN], 1)));
        assert_eq!(lookup(&path, "[::ffff:10.0.0.1]:7420".parse().unwrap()), Ok(Pin::Known([1; TARGET_ID_LEN], 1)));
        assert_eq!(lookup(&path, "10.0.0.1:7421".parse().unwrap()), Ok(Pin::Known([2; TARGET_ID_LEN], 2)));
        assert_eq!(lookup(&path, "10.0.0.2:7420".parse().unwrap()), Ok(Pin::Unknown));
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
        assert!(lookup(&path, a).is_err(), "a pin file others may write");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        std::fs::write(&path, "10.0.0.1:7420 nothex\n").unwrap();
        assert!(matches!(lookup(&path, a), Err(PinError::Bad(t)) if t.contains(":1: ")), "a bad line is an error");
        assert!(parse_target_id("00112233445566778899aabbccddeeff").is_ok());
        assert!(parse_target_id("0011").is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn local_addresses() {
        assert!(is_local_addr("127.0.0.1".parse().unwrap()));
        assert!(is_local_addr("::1".parse().unwrap()));
        // TEST-NET-3: never an address of this host.
        assert!(!is_local_addr("203.0.113.7".parse().unwrap()));
    }
}
