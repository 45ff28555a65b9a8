//! Key files, read and made the same way by the target and the initiator: one line of at least
//! [`MIN_KEY_LEN`] bytes (trailing whitespace is not part of the key), in a file that neither
//! group nor others can read, owned by root or this user, on a path only they control (OpenSSH
//! refuses such private keys too, and checks the path with `safe_path()`). [`generate`] writes 64 hex
//! digits (256 random bits) with mode 0600 and never replaces a file.
//!
//! Errors are `io::Error`s (the callers' errors name the path); those that are not the system's
//! carry a [`KeyError`] that says how to fix the file.

use std::io::{self, Read as _, Write as _};
use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::Path;

use crate::trusted;

/// The shortest key accepted: one observed AUTH allows an offline guess of the key, so it must
/// carry at least 256 bits if it is random (and more if it is not).
pub const MIN_KEY_LEN: usize = 32;

/// Bytes of randomness in a generated key (written as twice as many hex digits).
const GENERATED_BYTES: usize = 32;

/// What is wrong with a key file that could be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// Nothing but whitespace.
    #[error("the file is empty; make a key with `rblk-target gen-key FILE`")]
    Empty,
    /// Fewer than [`MIN_KEY_LEN`] bytes.
    #[error(
        "the key has {0} bytes, fewer than {MIN_KEY_LEN}; make one with `rblk-target gen-key FILE` (64 hex digits)"
    )]
    Short(usize),
    /// Group or others may read it.
    #[error("the key file has mode {0:04o}: group or others may read it; chmod 600 it")]
    Mode(u32),
    /// Not a regular file.
    #[error("the key file is not a regular file")]
    NotFile,
    /// Owned by someone other than root or this user, who could change the key.
    #[error("the key file belongs to uid {uid}, neither root nor this user (uid {me}); chown it")]
    Owner {
        /// Its owner.
        uid: u32,
        /// This (effective) user.
        me: u32,
    },
}

impl From<KeyError> for io::Error {
    fn from(e: KeyError) -> io::Error {
        let kind = match e {
            KeyError::Mode(_) | KeyError::Owner { .. } => io::ErrorKind::PermissionDenied,
            _ => io::ErrorKind::InvalidData,
        };
        io::Error::new(kind, e)
    }
}

/// The key in a key file's bytes: trailing whitespace removed (the newline an editor adds), at
/// least [`MIN_KEY_LEN`] bytes left.
pub fn key_from_bytes(bytes: &[u8]) -> Result<Vec<u8>, KeyError> {
    match bytes.trim_ascii_end() {
        [] => Err(KeyError::Empty),
        key if key.len() < MIN_KEY_LEN => Err(KeyError::Short(key.len())),
        key => Ok(key.to_vec()),
    }
}

/// Reads a key file: a regular file that group and others cannot read, owned by root or this
/// (effective) user, reached through directories and links that only they control
/// ([`trusted::walk`]), holding a key that [`key_from_bytes`] accepts. Mode, owner and contents
/// are those of the one open file.
pub fn read(path: &Path) -> io::Result<Vec<u8>> {
    let walked = trusted::walk(path, trusted::Last::Any)?;
    let mut file = walked.open(nix::fcntl::OFlag::O_RDONLY | nix::fcntl::OFlag::O_NONBLOCK)?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(KeyError::NotFile.into());
    }
    let mode = meta.permissions().mode() & 0o7777;
    if mode & 0o077 != 0 {
        return Err(KeyError::Mode(mode).into());
    }
    let me = nix::unistd::geteuid().as_raw();
    if meta.uid() != 0 && meta.uid() != me {
        return Err(KeyError::Owner { uid: meta.uid(), me }.into());
    }
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes)?;
    Ok(key_from_bytes(&bytes)?)
}

/// Writes a new key to `path`: 64 hex digits and a newline, mode 0600, created with
/// `O_CREAT|O_EXCL` (an existing file is an `AlreadyExists` error, never replaced).
pub fn generate(path: &Path) -> io::Result<()> {
    let mut random = [0u8; GENERATED_BYTES];
    getrandom::fill(&mut random).map_err(|e| io::Error::other(format!("the OS random source failed: {e}")))?;
    let mut text = rblk_proto::to_hex(&random);
    text.push('\n');
    let mut file = crate::private::create_new(path)?;
    let written = file.write_all(text.as_bytes()).and_then(|()| file.sync_all());
    if let Err(e) = written {
        // A half-written key would be refused at every later start: leave none.
        let _ = std::fs::remove_file(path);
        return Err(e);
    }
    Ok(())
}

/// The key at `path`, made first with [`generate`] if there is no file: `(key, true)` when it
/// was made now. An existing file is read as it is and never replaced, even when it is refused.
pub fn read_or_generate(path: &Path) -> io::Result<(Vec<u8>, bool)> {
    let created = match generate(path) {
        Ok(()) => true,
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => false,
        Err(e) => return Err(e),
    };
    Ok((read(path)?, created))
}

/// Random bytes from the OS (nonces, tokens, identities): the project's one source of them.
/// Panics if the OS source fails, which leaves nothing safe to do.
pub fn random<const N: usize>() -> [u8; N] {
    let mut b = [0u8; N];
    getrandom::fill(&mut b).expect("the OS random source failed");
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("rblk-keyfile-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        // Whatever the umask: read() refuses a key in a directory others may write to.
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
        d
    }

    fn write(path: &Path, bytes: &[u8], mode: u32) {
        std::fs::write(path, bytes).unwrap();
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    fn key_error(e: &io::Error) -> Option<&KeyError> {
        e.get_ref().and_then(|e| e.downcast_ref::<KeyError>())
    }

    /// Would catch: short keys accepted (an offline guess after one observed AUTH), or the
    /// trailing newline counted as key.
    #[test]
    fn short_and_empty_keys_are_refused() {
        let d = dir("short");
        let p = d.join("k");
        write(&p, &[b'x'; 31], 0o600);
        let e = read(&p).unwrap_err();
        assert_eq!(key_error(&e), Some(&KeyError::Short(31)));
        assert!(e.to_string().contains("gen-key"), "says how to make one: {e}");
        write(&p, b"\n", 0o600);
        assert_eq!(key_error(&read(&p).unwrap_err()), Some(&KeyError::Empty));
        write(&p, &[[b'y'; 32].as_slice(), b" \r\n\n"].concat(), 0o600);
        assert_eq!(read(&p).unwrap(), [b'y'; 32]);
        std::fs::remove_dir_all(d).unwrap();
    }

    /// Would catch: a key file that group or others can read accepted (OpenSSH refuses one).
    #[test]
    fn readable_by_others_is_refused() {
        let d = dir("mode");
        let p = d.join("k");
        for mode in [0o644, 0o640, 0o604, 0o660] {
            write(&p, &[b'k'; 40], mode);
            let e = read(&p).unwrap_err();
            assert_eq!(key_error(&e), Some(&KeyError::Mode(mode)), "{mode:o}");
            assert!(e.to_string().contains("chmod 600"), "{e}");
        }
        write(&p, &[b'k'; 40], 0o400);
        assert_eq!(read(&p).unwrap(), [b'k'; 40]);
        std::fs::remove_dir_all(d).unwrap();
    }

    /// Would catch: a key file only its mode is checked for, so that a 0600 key owned by
    /// another user (who may rewrite it) is adopted, or one reached through a symlink that user
    /// planted in a directory they may write to (OpenSSH's `safe_path()` refuses both).
    #[test]
    fn a_key_someone_else_controls_is_refused() {
        let d = dir("owner");
        let p = d.join("k");
        write(&p, &[b'k'; 40], 0o600);
        std::os::unix::fs::chown(&p, Some(4321), None).unwrap();
        let e = read(&p).unwrap_err();
        assert_eq!(key_error(&e), Some(&KeyError::Owner { uid: 4321, me: 0 }));
        assert!(e.to_string().contains("chown"), "{e}");
        std::os::unix::fs::chown(&p, Some(0), None).unwrap();
        let public = d.join("public");
        std::fs::create_dir(&public).unwrap();
        std::fs::set_permissions(&public, std::fs::Permissions::from_mode(0o1777)).unwrap();
        let link = public.join("k");
        std::os::unix::fs::symlink(&p, &link).unwrap();
        assert_eq!(read(&link).unwrap(), [b'k'; 40], "root's own link");
        std::os::unix::fs::lchown(&link, Some(4321), None).unwrap();
        let e = read(&link).unwrap_err();
        assert!(e.to_string().contains("symlink owned by uid 4321"), "{e}");
        std::fs::remove_dir_all(d).unwrap();
    }

    /// Would catch: a generated key that is not 64 hex digits and a newline in mode 0600, or a
    /// generator that overwrites an existing file (an operator's key, or one copied to hosts).
    #[test]
    fn generate_writes_0600_and_never_overwrites() {
        let d = dir("gen");
        let p = d.join("k");
        generate(&p).unwrap();
        let text = std::fs::read_to_string(&p).unwrap();
        assert_eq!(text.len(), 65, "{text:?}");
        assert!(text.ends_with('\n') && text[..64].bytes().all(|b| b.is_ascii_hexdigit()), "{text:?}");
        assert_eq!(std::fs::metadata(&p).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(read(&p).unwrap(), text.trim_end().as_bytes());
        assert_eq!(generate(&p).unwrap_err().kind(), io::ErrorKind::AlreadyExists);
        assert_eq!(std::fs::read_to_string(&p).unwrap(), text, "unchanged");
        let other = d.join("k2");
        generate(&other).unwrap();
        assert_ne!(std::fs::read_to_string(&other).unwrap(), text, "random");
        std::fs::remove_dir_all(d).unwrap();
    }

    /// Would catch: an existing bad key file (short, readable by others, unreadable) replaced
    /// by a new key instead of refused: hosts holding the old key would be locked out silently.
    #[test]
    fn read_or_generate_keeps_an_existing_bad_file() {
        let d = dir("ensure");
        let p = d.join("target.key");
        let (key, created) = read_or_generate(&p).unwrap();
        assert!(created && key.len() == 64);
        assert_eq!(read_or_generate(&p).unwrap(), (key, false), "the same key at the next start");
        for (bytes, mode) in [(&b"short\n"[..], 0o600), (&[b'a'; 64][..], 0o644)] {
            write(&p, bytes, mode);
            assert!(read_or_generate(&p).is_err());
            assert_eq!(std::fs::read(&p).unwrap(), bytes, "not replaced");
        }
        std::fs::remove_dir_all(d).unwrap();
    }
}
