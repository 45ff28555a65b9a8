//! How to reach a target: fabric, device, key and timeouts.

use std::fmt;
use std::path::Path;
use std::time::Duration;

use rblk_fabric::Fabric;

use crate::{Error, Result};

/// Default deadline for each control exchange (connect, HELLO, AUTH, OPEN, FLUSH, ...).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// Default deadline for each synchronous data operation ([`Volume::read_at`](crate::Volume::read_at)
/// and [`Volume::write_at`](crate::Volume::write_at) chunks).
pub const DEFAULT_IO_TIMEOUT: Duration = Duration::from_secs(30);

/// Connection options. `Options::default()` reaches a target without a key over real verbs.
#[derive(Clone)]
pub struct Options {
    /// Which fabric: real verbs, or (feature `mem`) the in-memory fabric.
    pub fabric: Fabric,
    /// Only use this RDMA device (the address decides the device; this only checks it).
    pub device: Option<String>,
    /// The pre-shared key, when the target requires one (see [`Options::key_from_file`]).
    pub key: Option<Vec<u8>>,
    /// Deadline for each control exchange.
    pub timeout: Duration,
    /// Deadline for each synchronous data operation.
    pub io_timeout: Duration,
    /// How long waits spin on the completion queue before sleeping. A queue with at most two
    /// operations in flight spins longer, adaptively (twice its usual wait, up to 1 ms), so that
    /// depth-1 I/O does not pay a wakeup each time.
    pub spin: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            fabric: Fabric::default(),
            device: None,
            key: None,
            timeout: DEFAULT_TIMEOUT,
            io_timeout: DEFAULT_IO_TIMEOUT,
            spin: rblk_fabric::policy::SPIN,
        }
    }
}

// Never print the key.
impl fmt::Debug for Options {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Options")
            .field("fabric", &self.fabric)
            .field("device", &self.device)
            .field("key", &self.key.as_ref().map(|_| "<redacted>"))
            .field("timeout", &self.timeout)
            .field("io_timeout", &self.io_timeout)
            .field("spin", &self.spin)
            .finish()
    }
}

impl Options {
    /// Reads a key file: its bytes, without trailing whitespace (the newline an editor adds),
    /// exactly as rblk-target reads its `--key-file`. An empty key is an error.
    pub fn key_from_file(path: impl AsRef<Path>) -> Result<Vec<u8>> {
        let path = path.as_ref();
        let err = |source| Error::KeyFile { path: path.to_owned(), source };
        let key = std::fs::read(path).map_err(err)?;
        let key = key.trim_ascii_end();
        if key.is_empty() {
            return Err(err(std::io::Error::other("the file is empty")));
        }
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            if std::fs::metadata(path).is_ok_and(|m| m.permissions().mode() & 0o077 != 0) {
                tracing::warn!(path = %path.display(), "the key file is readable by other users; chmod 600 it");
            }
        }
        Ok(key.to_vec())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_files() {
        let dir = std::env::temp_dir().join(format!("rblk-initiator-key-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("key");
        std::fs::write(&path, b"s3cret\n").unwrap();
        assert_eq!(Options::key_from_file(&path).unwrap(), b"s3cret");
        std::fs::write(&path, b"a b\r\n\n").unwrap();
        assert_eq!(Options::key_from_file(&path).unwrap(), b"a b");
        std::fs::write(&path, b"\n").unwrap();
        let e = Options::key_from_file(&path).unwrap_err();
        assert!(e.to_string().contains("empty"), "{e}");
        let e = Options::key_from_file(dir.join("missing")).unwrap_err();
        assert!(matches!(e, Error::KeyFile { .. }) && e.to_string().contains("missing"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn debug_hides_the_key() {
        let opts = Options { key: Some(b"s3cret".to_vec()), ..Options::default() };
        let text = format!("{opts:?}");
        assert!(!text.contains("s3cret") && text.contains("redacted"), "{text}");
    }
}
