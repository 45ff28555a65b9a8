//! `STATE_DIR/admin.toml`: what `rblk-target admin add`, `admin resize` and `admin remove` changed, saved so
//! that a restart, a SIGHUP and a handover keep it (as nvmetcli's `save` and SPDK's
//! `save_config` persist run-time changes).
//!
//! ```toml
//! removed = ["old"]          # volumes of the config file that `admin remove` removed
//!
//! [[volume]]                 # volumes `admin add` added, as [[volume]] in the config file
//! name = "scratch"
//! size = 1073741824
//! allow = { "db1" = "rw" }
//! ```
//!
//! The effective configuration is the config file (and flags), without the `removed` volumes,
//! with the saved ones added ([`Saved::apply_to`]); a volume both in the config file and saved
//! must be the same volume (size and path), else the configuration is refused. The daemon
//! writes the file atomically (a temporary file, fsync, rename, fsync of the directory), mode
//! 0600, and reads it only if it is a regular file (not a symlink) owned by root or the
//! daemon's user, not writable by group or others, at most [`MAX_SIZE`] bytes, with no keys
//! it does not know: anything else is refused with the reason, like a bad config file.

use std::io::Read as _;
use std::os::unix::fs::{MetadataExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};

use crate::config::{File, FileVolume};
pub use crate::errors::{SavedError, MAX_SIZE};

/// The file's name in the state directory.
pub const FILE_NAME: &str = "admin.toml";
/// What `admin add` and `admin remove` changed (see the module docs).
#[derive(Debug, Default, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Saved {
    /// Volumes of the config file removed with `admin remove`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub removed: Vec<String>,
    /// Volumes added with `admin add`.
    #[serde(default, rename = "volume", skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<FileVolume>,
}

impl Saved {
    /// Its path in `state_dir`.
    pub fn path(state_dir: &Path) -> PathBuf {
        state_dir.join(FILE_NAME)
    }

    /// Reads `STATE_DIR/admin.toml` (nothing saved when it does not exist), with the checks of
    /// the module docs.
    pub fn load(state_dir: &Path) -> Result<Saved, SavedError> {
        let path = Saved::path(state_dir);
        let read = |source| SavedError::Read { path: path.clone(), source };
        let file = match std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW).open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Saved::default()),
            Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
                return Err(SavedError::Unsafe { path, why: "it is a symlink".into() })
            }
            Err(e) => return Err(read(e)),
        };
        let meta = file.metadata().map_err(read)?;
        let me = nix::unistd::geteuid().as_raw();
        let why = if !meta.is_file() {
            Some("not a regular file".to_owned())
        } else if meta.uid() != 0 && meta.uid() != me {
            Some(format!("it belongs to uid {}, neither root nor this user (uid {me})", meta.uid()))
        } else if meta.mode() & 0o022 != 0 {
            Some(format!("it has mode {:04o}: group or others may write it (chmod go-w)", meta.mode() & 0o7777))
        } else {
            None
        };
        if let Some(why) = why {
            return Err(SavedError::Unsafe { path, why });
        }
        let mut text = String::new();
        file.take(MAX_SIZE + 1).read_to_string(&mut text).map_err(read)?;
        if text.len() as u64 > MAX_SIZE {
            return Err(SavedError::TooLarge { path });
        }
        let saved: Saved =
            toml::from_str(&text).map_err(|e| SavedError::Parse { path: path.clone(), source: Box::new(e) })?;
        for v in &saved.volumes {
            v.spec().map_err(|e| SavedError::Volume { path: path.clone(), source: Box::new(e) })?;
        }
        Ok(saved)
    }

    /// Writes it to `STATE_DIR/admin.toml` atomically and durably
    /// ([`rblk_fabric::private::replace`]), making the directory (mode 0700) if missing.
    pub fn store(&self, state_dir: &Path) -> Result<(), SavedError> {
        let path = Saved::path(state_dir);
        let write = |source| SavedError::Write { path: path.clone(), source };
        if !state_dir.exists() {
            std::os::unix::fs::DirBuilderExt::mode(std::fs::DirBuilder::new().recursive(true), 0o700)
                .create(state_dir)
                .map_err(write)?;
        }
        let mut text = String::from(
            "# Written by rblk-target: the volumes `rblk-target admin add` added and those `admin remove`\n\
             # removed from the config file. Read at every start, reload and handover.\n",
        );
        text.push_str(&toml::to_string(self).map_err(|e| write(std::io::Error::other(e)))?);
        rblk_fabric::private::replace(&path, text.as_bytes()).map_err(write)
    }

    /// Whether nothing is saved.
    pub fn is_empty(&self) -> bool {
        self.removed.is_empty() && self.volumes.is_empty()
    }

    /// `file` (the config file and flags) with these changes: the removed volumes out, the
    /// added ones in. `state_dir` names the file in errors.
    pub fn apply_to(&self, file: &mut File, state_dir: &Path) -> Result<(), SavedError> {
        file.volumes.retain(|v| !self.removed.contains(&v.name));
        for v in &self.volumes {
            match file.volumes.iter().find(|f| f.name == v.name) {
                // Moved to the config file since: the config file's entry (and allow list) rules.
                Some(f) if same_volume(f, v) => {}
                Some(_) => return Err(SavedError::Conflict { path: Saved::path(state_dir), name: v.name.clone() }),
                None => file.volumes.push(v.clone()),
            }
        }
        Ok(())
    }

    /// What `--print-config` says about it, as TOML comments (empty when nothing is saved).
    pub fn note(&self, state_dir: &Path) -> String {
        if self.is_empty() {
            return String::new();
        }
        let names: Vec<&str> = self.volumes.iter().map(|v| v.name.as_str()).collect();
        format!(
            "# {}: added with `rblk-target admin add`: {}; removed with `admin remove`: {}\n",
            Saved::path(state_dir).display(),
            if names.is_empty() { "none".to_owned() } else { names.join(", ") },
            if self.removed.is_empty() { "none".to_owned() } else { self.removed.join(", ") }
        )
    }

    /// After `admin add` of `v`.
    pub(crate) fn added(&mut self, v: &FileVolume) {
        self.volumes.retain(|s| s.name != v.name);
        self.volumes.push(v.clone());
    }

    /// After `admin resize` of `name` to `size` bytes.
    pub(crate) fn resized(&mut self, name: &str, size: u64) {
        for v in self.volumes.iter_mut().filter(|v| v.name == name) {
            v.size = size.into();
        }
    }

    /// After `admin remove` of `name`.
    pub(crate) fn removed(&mut self, name: &str) {
        let before = self.volumes.len();
        self.volumes.retain(|s| s.name != name);
        if self.volumes.len() == before && !self.removed.iter().any(|r| r == name) {
            self.removed.push(name.to_owned());
        }
    }
}

fn same_volume(a: &FileVolume, b: &FileVolume) -> bool {
    a.size.bytes().ok() == b.size.bytes().ok() && a.path == b.path
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;
    use rblk_fabric::Chain;

    fn dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("rblk-saved-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn volume(name: &str, size: &str) -> FileVolume {
        FileVolume { name: name.into(), size: size.into(), ..FileVolume::default() }
    }

    /// Catches admin changes that do not survive a restart (not written, or not read back), a
    /// removal of a volume that `admin add` added that leaves it listed as removed, and a write
    /// that is not atomic: it must go through a temporary file renamed over the old one (the
    /// inode changes; a torn write would leave half a file for the next start), with mode 0600.
    #[test]
    fn saved_changes_round_trip_atomically() {
        let d = dir("round-trip");
        assert_eq!(Saved::load(&d).unwrap(), Saved::default(), "no file: nothing saved");
        let mut s = Saved::default();
        s.added(&volume("a", "1M"));
        s.removed("from-config");
        s.store(&d).unwrap();
        let path = Saved::path(&d);
        let ino = std::fs::metadata(&path).unwrap().ino();
        assert_eq!(std::fs::metadata(&path).unwrap().mode() & 0o777, 0o600);
        assert_eq!(Saved::load(&d).unwrap(), s);
        s.removed("a");
        s.store(&d).unwrap();
        assert_ne!(std::fs::metadata(&path).unwrap().ino(), ino, "replaced by a rename, not rewritten in place");
        assert!(!d.join("admin.toml.tmp").exists());
        let back = Saved::load(&d).unwrap();
        assert!(back.volumes.is_empty() && back.removed == ["from-config"], "{back:?}");

        let mut file = File { volumes: vec![volume("from-config", "1M"), volume("kept", "1M")], ..File::default() };
        let mut s = back;
        s.added(&volume("b", "2M"));
        s.added(&volume("kept", "1048576"));
        s.apply_to(&mut file, &d).unwrap();
        let names: Vec<&str> = file.volumes.iter().map(|v| v.name.as_str()).collect();
        assert_eq!(names, ["kept", "b"], "removed out, added in, the same volume in both kept once");
        s.added(&volume("kept", "2M"));
        let err = s.apply_to(&mut file, &d).unwrap_err();
        assert!(matches!(err, SavedError::Conflict { ref name, .. } if name == "kept"), "{err}");
        std::fs::remove_dir_all(d).unwrap();
    }

    /// Catches an admin.toml read whoever wrote it: a file group or others may write, a
    /// symlink (to a file someone else controls), another user's file, one with keys the
    /// daemon does not know or a bad volume, and one too large, each refused with the reason.
    #[test]
    fn a_hostile_or_malformed_file_is_refused() {
        let d = dir("hostile");
        let path = Saved::path(&d);
        let write = |text: &str, mode: u32| {
            let _ = std::fs::remove_file(&path);
            std::fs::write(&path, text).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        };
        let refused = || Chain(&Saved::load(&d).unwrap_err()).to_string();
        write("[[volume]]\nname = \"a\"\nsize = \"1M\"\n", 0o600);
        Saved::load(&d).expect("a good file");
        write("[[volume]]\nname = \"a\"\nsize = \"1M\"\n", 0o666);
        assert!(refused().contains("mode 0666") && refused().contains("admin.toml"), "{}", refused());
        write("removed = []\nconfirm = true\n", 0o600);
        assert!(refused().contains("unknown field `confirm`"), "{}", refused());
        write("[[volume]]\nname = \"a\"\nsize = \"1M\"\nextra = 1\n", 0o600);
        assert!(refused().contains("unknown field `extra`"), "{}", refused());
        write("[[volume]]\nname = \"a b\"\nsize = \"1M\"\n", 0o600);
        assert!(refused().contains("volume a b"), "{}", refused());
        write(&format!("removed = [{}]\n", vec!["\"x\""; (MAX_SIZE / 4) as usize].join(",")), 0o600);
        assert!(refused().contains("larger than"), "{}", refused());
        let elsewhere = d.join("elsewhere.toml");
        std::fs::write(&elsewhere, "").unwrap();
        let _ = std::fs::remove_file(&path);
        std::os::unix::fs::symlink(&elsewhere, &path).unwrap();
        assert!(refused().contains("symlink"), "{}", refused());
        if nix::unistd::geteuid().is_root() {
            write("", 0o600);
            std::os::unix::fs::chown(&path, Some(65534), None).unwrap();
            assert!(refused().contains("belongs to uid 65534"), "{}", refused());
        }
        std::fs::remove_dir_all(d).unwrap();
    }
}
