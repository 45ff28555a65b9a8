//! Files and directories only their owner may use, never reached through a symlink: log files,
//! state records and their temporary files, lock files, the directories sockets live in. One
//! place for the flags (`O_NOFOLLOW`, `O_EXCL`, mode 0600) that every such file needs, whatever
//! the umask.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{MetadataExt as _, OpenOptionsExt as _};
use std::path::Path;

/// Opens `path` for appending, creating it with mode 0600 if missing; a symlink at `path` is
/// refused (ELOOP), not followed. An existing file keeps its mode.
pub fn append(path: &Path) -> io::Result<File> {
    OpenOptions::new().create(true).append(true).mode(0o600).custom_flags(libc::O_NOFOLLOW).open(path)
}

/// Creates `path` with mode 0600 for writing; fails if anything exists there (a symlink too).
pub fn create_new(path: &Path) -> io::Result<File> {
    OpenOptions::new().write(true).create_new(true).mode(0o600).custom_flags(libc::O_NOFOLLOW).open(path)
}

/// Opens (creating with mode 0600) `path` for reading and writing, without truncating it or
/// following a symlink: for lock files.
pub fn lock_file(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
}

/// Replaces `path` with `bytes` atomically and durably: written to `PATH.tmp` (made anew with
/// mode 0600, never through a symlink), fsynced, renamed over `path`, and the directory fsynced,
/// so a crash leaves the old file or the new one, never a torn one. A failure removes the
/// temporary file.
pub fn replace(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = std::path::PathBuf::from(tmp);
    let written = (|| {
        // Left by a crash mid-write: made again.
        match std::fs::remove_file(&tmp) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        let mut f = create_new(&tmp)?;
        io::Write::write_all(&mut f, bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        sync_dir(path)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// Makes a creation, rename or removal in `path`'s directory durable.
pub fn sync_dir(path: &Path) -> io::Result<()> {
    File::open(path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."))).and_then(|d| d.sync_all())
}

/// Who may use a directory [`check_dir`] accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DirUse {
    /// Others may read it, but only its owner, this user or root, may write to it (so nobody
    /// else can replace what is made in it): an admin socket's directory.
    OwnerWrites,
    /// Nobody but this user may reach it at all: it is this user's, with no group or other
    /// access (mode 0700 or narrower), for a socket whose every client may read and write a
    /// volume.
    OwnerOnly,
}

/// Checks that `dir`, where a private file or socket is to be made, is a directory (not a
/// symlink to one) that others can use no more than `how` allows; `Err` says why in words and
/// how to fix it.
pub fn check_dir(dir: &Path, how: DirUse) -> Result<(), String> {
    let meta = std::fs::symlink_metadata(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    if !meta.is_dir() {
        return Err(format!("{} is not a directory (a symlink?)", dir.display()));
    }
    let me = nix::unistd::geteuid().as_raw();
    let (owner_ok, forbidden, risk, fix) = match how {
        DirUse::OwnerWrites => (meta.uid() == me || meta.uid() == 0, 0o022, "may write to it", "chmod go-w"),
        DirUse::OwnerOnly => (meta.uid() == me, 0o077, "could reach what is made in it", "chmod 700"),
    };
    if !owner_ok {
        let allowed = if how == DirUse::OwnerWrites { "neither this user nor root" } else { "not this user" };
        return Err(format!("{} belongs to uid {}, {allowed} (uid {me})", dir.display(), meta.uid()));
    }
    let mode = meta.mode() & 0o7777;
    if mode & forbidden != 0 {
        return Err(format!(
            "{} has mode {mode:04o}: other users {risk} ({fix} {}, or choose another directory)",
            dir.display(),
            dir.display()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    /// Would catch a private file that follows a symlink (a planted link would make the
    /// program write where the link points) or takes the umask's mode, and a directory check
    /// that lets a world-writable directory through.
    #[test]
    fn private_files_and_directories() {
        let dir = std::env::temp_dir().join(format!("rblk-private-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        check_dir(&dir, DirUse::OwnerWrites).unwrap();
        assert!(check_dir(&dir, DirUse::OwnerOnly).unwrap_err().contains("mode 0755"), "0755 is not owner-only");
        let old = nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o002));
        let log = dir.join("log");
        append(&log).unwrap();
        nix::sys::stat::umask(old);
        assert_eq!(std::fs::metadata(&log).unwrap().permissions().mode() & 0o777, 0o600);
        let target = dir.join("elsewhere");
        let link = dir.join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        assert_eq!(append(&link).unwrap_err().raw_os_error(), Some(libc::ELOOP), "a symlink is not followed");
        assert!(create_new(&link).is_err() && lock_file(&link).is_err());
        assert!(!target.exists(), "nothing was made through the link");
        assert!(create_new(&log).is_err(), "create_new never opens an existing file");
        assert!(check_dir(&link, DirUse::OwnerWrites).unwrap_err().contains("not a directory"));
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(check_dir(&dir, DirUse::OwnerWrites).unwrap_err().contains("mode 0777"));

        // replace: no symlink followed at the temporary name, mode 0600, old or new only.
        let state = dir.join("state");
        std::fs::write(&state, "old").unwrap();
        let tmp_target = dir.join("tmp-target");
        std::os::unix::fs::symlink(&tmp_target, dir.join("state.tmp")).unwrap();
        replace(&state, b"new").unwrap();
        assert_eq!(std::fs::read_to_string(&state).unwrap(), "new");
        assert!(!tmp_target.exists(), "a link planted at the temporary name is replaced, not followed");
        assert!(!dir.join("state.tmp").exists(), "the temporary file is renamed away");
        assert_eq!(std::fs::metadata(&state).unwrap().permissions().mode() & 0o777, 0o600);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
