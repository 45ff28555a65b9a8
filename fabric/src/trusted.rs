//! Paths that no one but root and this user controls: backing stores, key files, the state
//! directory. One walk ([`walk`]) for all of them, as systemd's `chase()` with `CHASE_SAFE` and
//! OpenSSH's `safe_path()` do it.
//!
//! The walk opens every component with `O_PATH | O_NOFOLLOW` from the descriptor of the
//! directory above it and resolves symlinks itself, so what it checks is what it opens:
//!
//! - every directory it passes through is owned by root or this (effective) user and writable
//!   by neither group nor others, except a root-owned sticky directory (`/tmp`), where only an
//!   entry's owner can remove or replace it;
//! - every symlink it follows is owned by root or this user (then `/dev/VG/LV` works, and a link
//!   someone else planted in a directory they may write is refused);
//! - the entry it ends at, when that sits in a sticky directory others may write, is owned by
//!   root or this user too (the kernel's `protected_regular` rule);
//! - [`Last`] says what else the entry itself must be.
//!
//! The caller opens the entry with [`Walked::open`] (or makes it with [`Walked::create`]), from
//! the same directory descriptor, without following a link, and decides what it is from
//! `fstat` of the descriptor it got, never from the name.

use std::ffi::OsString;
use std::fs::File;
use std::os::fd::OwnedFd;
use std::path::{Component, Path, PathBuf};

use nix::errno::Errno;
/// The open flags [`Walked::open`] takes (nix's, so that callers need not depend on nix).
pub use nix::fcntl::OFlag;
use nix::fcntl::{openat, readlinkat};
use nix::sys::stat::{fstat, FileStat, Mode, SFlag};

/// Symlinks followed before the walk gives up (the kernel's own limit).
const MAX_LINKS: u32 = 40;

/// What the walk requires of the entry the path names (directories and links on the way are
/// always checked).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Last {
    /// Nothing more: a backing store (a block device node is typically group-writable, and an
    /// image file may belong to anyone root lets own it).
    Any,
    /// Owned by root or this user and writable by neither group nor others: a directory whose
    /// contents are trusted (the state directory).
    Private,
}

/// Why a path is not trusted, or could not be walked. Each names the component concerned.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PathError {
    /// A component could not be opened or examined.
    #[error("{}: {source}", path.display())]
    Io {
        /// The path up to and including the component.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A directory, link or entry belongs to someone other than root or this user.
    #[error(
        "{} is {what} owned by uid {uid}, neither root nor this user (uid {me}): not trusted (chown it, or use \
         another path)",
        path.display()
    )]
    Owner {
        /// The component.
        path: PathBuf,
        /// What it is: "a directory", "a symlink", ...
        what: &'static str,
        /// Its owner.
        uid: u32,
        /// This (effective) user.
        me: u32,
    },
    /// A directory (or the entry, for [`Last::Private`]) that group or others may write to.
    #[error(
        "{} has mode {mode:04o}: other users may change what is in it (chmod go-w {}, or use another path)",
        path.display(),
        path.display()
    )]
    Writable {
        /// The component.
        path: PathBuf,
        /// Its mode.
        mode: u32,
    },
    /// A component above the last is not a directory.
    #[error("{} is not a directory", path.display())]
    NotDir {
        /// The component.
        path: PathBuf,
    },
    /// More than [`MAX_LINKS`] symlinks.
    #[error("{}: too many levels of symlinks", path.display())]
    Loop {
        /// The path where the walk gave up.
        path: PathBuf,
    },
}

impl PathError {
    /// True when the path (or a directory above it) does not exist.
    pub fn is_not_found(&self) -> bool {
        matches!(self, PathError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound)
    }
}

impl From<PathError> for std::io::Error {
    fn from(e: PathError) -> std::io::Error {
        let kind = match e {
            // The OS's error as it is (callers name the path, and look at the errno).
            PathError::Io { source, .. } => return source,
            PathError::Owner { .. } | PathError::Writable { .. } => std::io::ErrorKind::PermissionDenied,
            PathError::NotDir { .. } => std::io::ErrorKind::NotADirectory,
            PathError::Loop { .. } => std::io::ErrorKind::InvalidInput,
        };
        std::io::Error::new(kind, e)
    }
}

/// Where a [`walk`] ended: the trusted directory holding the entry, and the entry if it exists.
#[derive(Debug)]
pub struct Walked {
    /// The path, links resolved, for messages.
    path: PathBuf,
    dir: OwnedFd,
    name: OsString,
    entry: Option<(OwnedFd, FileStat)>,
}

impl Walked {
    /// The entry's status (of its `O_PATH` descriptor: a symlink is never here, the walk
    /// followed or refused it); None when it does not exist (its directory does).
    pub fn stat(&self) -> Option<&FileStat> {
        self.entry.as_ref().map(|(_, st)| st)
    }

    /// The path walked, symlinks resolved.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Opens the entry with `flags` (`O_NOFOLLOW` and `O_CLOEXEC` added) from the directory the
    /// walk checked; refuses an entry replaced since the walk (another device or inode). What
    /// the file is must be decided from `fstat` of the descriptor returned.
    pub fn open(&self, flags: OFlag) -> std::io::Result<File> {
        let fd = openat(&self.dir, self.name.as_os_str(), flags | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC, Mode::empty())?;
        let st = fstat(&fd)?;
        if let Some((_, was)) = &self.entry {
            if (st.st_dev, st.st_ino) != (was.st_dev, was.st_ino) {
                return Err(std::io::Error::other(format!("{} was replaced while being opened", self.path.display())));
            }
        }
        Ok(File::from(fd))
    }

    /// Makes the missing entry: a new file of `mode`, opened for reading and writing
    /// (`O_CREAT | O_EXCL`: nothing that appeared meanwhile is opened).
    pub fn create(&self, mode: u32) -> std::io::Result<File> {
        let flags = OFlag::O_RDWR | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        let fd = openat(&self.dir, self.name.as_os_str(), flags, Mode::from_bits_truncate(mode))?;
        Ok(File::from(fd))
    }
}

/// Walks `path` (relative to the working directory if relative) with the rules of the module
/// docs, and checks the entry it names against `last`. A missing last entry is not an error
/// ([`Walked::stat`] is None); a missing directory above it is ([`PathError::is_not_found`]).
pub fn walk(path: &Path, last: Last) -> Result<Walked, PathError> {
    let me = nix::unistd::geteuid().as_raw();
    let io = |at: &Path, e: Errno| PathError::Io { path: at.to_owned(), source: e.into() };
    let absolute = if path.is_absolute() {
        path.to_owned()
    } else {
        let cwd = std::env::current_dir().map_err(|source| PathError::Io { path: path.to_owned(), source })?;
        cwd.join(path)
    };
    let root =
        || openat(nix::fcntl::AT_FDCWD, "/", OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC, Mode::empty());
    let mut dir = root().map_err(|e| io(Path::new("/"), e))?;
    let mut dir_stat = fstat(&dir).map_err(|e| io(Path::new("/"), e))?;
    check_dir(Path::new("/"), &dir_stat, me)?;
    // Where the walk is, for messages, and what is left to walk, first component first.
    let mut at = PathBuf::from("/");
    let mut todo: Vec<OsString> = components(&absolute);
    todo.reverse();
    let mut links = 0;
    while let Some(name) = todo.pop() {
        if name == ".." {
            dir = openat(&dir, "..", OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC, Mode::empty())
                .map_err(|e| io(&at, e))?;
            at.pop();
            dir_stat = fstat(&dir).map_err(|e| io(&at, e))?;
            check_dir(&at, &dir_stat, me)?;
            continue;
        }
        let here = at.join(&name);
        let is_last = todo.is_empty();
        let fd =
            match openat(&dir, name.as_os_str(), OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC, Mode::empty()) {
                Ok(fd) => fd,
                Err(Errno::ENOENT) if is_last => return Ok(Walked { path: here, dir, name, entry: None }),
                Err(e) => return Err(io(&here, e)),
            };
        let st = fstat(&fd).map_err(|e| io(&here, e))?;
        let kind = SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits());
        let shared = others_may_write(&dir_stat);
        if kind == SFlag::S_IFLNK {
            if st.st_uid != 0 && st.st_uid != me {
                return Err(PathError::Owner { path: here, what: "a symlink", uid: st.st_uid, me });
            }
            links += 1;
            if links > MAX_LINKS {
                return Err(PathError::Loop { path: here });
            }
            let target = readlinkat(&fd, "").map_err(|e| io(&here, e))?;
            let target = PathBuf::from(target);
            if target.is_absolute() {
                dir = root().map_err(|e| io(Path::new("/"), e))?;
                dir_stat = fstat(&dir).map_err(|e| io(Path::new("/"), e))?;
                at = PathBuf::from("/");
            }
            let mut more = components(&target);
            if more.is_empty() {
                return Err(io(&here, Errno::ENOENT));
            }
            more.reverse();
            todo.extend(more);
            continue;
        }
        if shared && st.st_uid != 0 && st.st_uid != me {
            // In a sticky directory that others may write: anyone could have made it.
            return Err(PathError::Owner {
                path: here,
                what: "an entry of a directory others may write to",
                uid: st.st_uid,
                me,
            });
        }
        if is_last {
            if last == Last::Private {
                check_private(&here, &st, me)?;
            }
            return Ok(Walked { path: here, dir, name, entry: Some((fd, st)) });
        }
        if kind != SFlag::S_IFDIR {
            return Err(PathError::NotDir { path: here });
        }
        check_dir(&here, &st, me)?;
        (dir, dir_stat, at) = (fd, st, here);
    }
    // The path was "/" (or only "/" and ".."s): the root directory itself.
    let entry = fstat(&dir).map_err(|e| io(&at, e))?;
    if last == Last::Private {
        check_private(&at, &entry, me)?;
    }
    let again = openat(&dir, ".", OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC, Mode::empty())
        .map_err(|e| io(&at, e))?;
    Ok(Walked { path: at, dir, name: OsString::from("."), entry: Some((again, entry)) })
}

/// Checks a directory the state or keys live in: every component trusted as [`walk`] requires,
/// the directory itself too ([`Last::Private`]). Ok(false) when it does not exist yet (what
/// exists above it was checked).
pub fn check_dir_path(path: &Path) -> Result<bool, PathError> {
    match walk(path, Last::Private) {
        Ok(w) => match w.stat() {
            None => Ok(false),
            Some(st) if st.st_mode & SFlag::S_IFMT.bits() == SFlag::S_IFDIR.bits() => Ok(true),
            Some(_) => Err(PathError::NotDir { path: w.path }),
        },
        Err(e) if e.is_not_found() => Ok(false),
        Err(e) => Err(e),
    }
}

/// Makes the directory `path` (and those missing above it) with mode 0755 whatever the umask,
/// then checks it as [`check_dir_path`] does: the state directory before anything is kept in it.
pub fn ensure_dir(path: &Path) -> Result<(), PathError> {
    use std::os::unix::fs::DirBuilderExt as _;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(path)
        .map_err(|source| PathError::Io { path: path.to_owned(), source })?;
    match check_dir_path(path)? {
        true => Ok(()),
        false => Err(PathError::Io { path: path.to_owned(), source: Errno::ENOENT.into() }),
    }
}

/// The names in `path`, `.` dropped, `..` kept (resolved against what the walk opened).
fn components(path: &Path) -> Vec<OsString> {
    path.components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n.to_owned()),
            Component::ParentDir => Some(OsString::from("..")),
            Component::RootDir | Component::CurDir | Component::Prefix(_) => None,
        })
        .collect()
}

/// Group or others may add, remove or rename entries.
fn others_may_write(st: &FileStat) -> bool {
    st.st_mode & 0o022 != 0
}

fn check_dir(path: &Path, st: &FileStat, me: u32) -> Result<(), PathError> {
    if st.st_uid != 0 && st.st_uid != me {
        return Err(PathError::Owner { path: path.to_owned(), what: "a directory", uid: st.st_uid, me });
    }
    let sticky = st.st_mode & libc::S_ISVTX != 0;
    if others_may_write(st) && !(sticky && st.st_uid == 0) {
        return Err(PathError::Writable { path: path.to_owned(), mode: st.st_mode & 0o7777 });
    }
    Ok(())
}

fn check_private(path: &Path, st: &FileStat, me: u32) -> Result<(), PathError> {
    if st.st_uid != 0 && st.st_uid != me {
        return Err(PathError::Owner { path: path.to_owned(), what: "an entry", uid: st.st_uid, me });
    }
    if others_may_write(st) {
        return Err(PathError::Writable { path: path.to_owned(), mode: st.st_mode & 0o7777 });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::{lchown, symlink, PermissionsExt as _};

    use super::*;

    /// A uid that is neither root nor this user (the host tests run as root).
    const OTHER: u32 = 4321;

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("rblk-trusted-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        chmod(&d, 0o755);
        d
    }

    fn chmod(path: &Path, mode: u32) {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    fn refused(path: &Path, last: Last) -> String {
        walk(path, last).map(|w| w.path().display().to_string()).expect_err("refused").to_string()
    }

    /// Would catch a symlink followed whoever made it: a link another user planted in a
    /// directory they may write to (a root-owned sticky one, as /tmp, or one of their own)
    /// would make the daemon serve or read whatever it points at. An `/dev/VG/LV`-style chain
    /// of root-owned links in root-owned directories must still work, relative links and `..`
    /// included.
    #[test]
    fn links_are_followed_only_when_root_or_this_user_made_them() {
        let d = dir("links");
        let victim = d.join("victim");
        std::fs::write(&victim, b"secret").unwrap();
        // A sticky world-writable directory, as /tmp: root's own links in it are fine.
        let public = d.join("public");
        std::fs::create_dir(&public).unwrap();
        chmod(&public, 0o1777);
        let planted = public.join("v.img");
        symlink(&victim, &planted).unwrap();
        assert_eq!(walk(&planted, Last::Any).unwrap().path(), victim, "root's link in a sticky directory");
        lchown(&planted, Some(OTHER), None).unwrap();
        let e = refused(&planted, Last::Any);
        assert!(e.contains("v.img is a symlink owned by uid 4321") && e.contains("not trusted"), "{e}");
        // A file another user made there is refused as well (they could read or change it).
        let theirs = public.join("theirs.img");
        std::fs::write(&theirs, b"").unwrap();
        std::os::unix::fs::chown(&theirs, Some(OTHER), None).unwrap();
        assert!(refused(&theirs, Last::Any).contains("uid 4321"));
        // Without the sticky bit anyone may replace root's link too.
        chmod(&public, 0o777);
        lchown(&planted, Some(0), None).unwrap();
        let e = refused(&planted, Last::Any);
        assert!(e.contains("public has mode 0777") && e.contains("chmod go-w"), "{e}");
        // A directory of another user's, even one only they may write to.
        chmod(&public, 0o755);
        std::os::unix::fs::chown(&public, Some(OTHER), None).unwrap();
        assert!(refused(&planted, Last::Any).contains("public is a directory owned by uid 4321"));
        // /dev/VG/LV -> ../dm-0: a root-owned chain, with a relative target and `..`.
        let dev = d.join("dev");
        std::fs::create_dir_all(dev.join("vg")).unwrap();
        std::fs::write(dev.join("dm-0"), b"lv").unwrap();
        symlink("../dm-0", dev.join("vg/lv")).unwrap();
        symlink(dev.join("vg"), d.join("vg-link")).unwrap();
        let w = walk(&d.join("vg-link/lv"), Last::Any).unwrap();
        assert_eq!(w.path(), dev.join("dm-0"));
        let mut text = String::new();
        std::io::Read::read_to_string(&mut w.open(OFlag::O_RDONLY).unwrap(), &mut text).unwrap();
        assert_eq!(text, "lv");
        // A loop of links ends.
        symlink(d.join("b"), d.join("a")).unwrap();
        symlink(d.join("a"), d.join("b")).unwrap();
        assert!(refused(&d.join("a"), Last::Any).contains("too many levels of symlinks"));
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// Would catch an open that does not use what the walk checked: an entry replaced after the
    /// walk (by a block device, say, whose kind the caller would then misjudge) must be
    /// refused, not opened.
    #[test]
    fn an_entry_replaced_after_the_walk_is_not_opened() {
        let d = dir("swap");
        let path = d.join("v.img");
        std::fs::write(&path, b"file").unwrap();
        let w = walk(&path, Last::Any).unwrap();
        let other = d.join("other");
        std::fs::write(&other, b"other").unwrap();
        std::fs::rename(&other, &path).unwrap();
        let e = w.open(OFlag::O_RDONLY).unwrap_err();
        assert!(e.to_string().contains("replaced while being opened"), "{e}");
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// Would catch a state directory trusted whoever may write to it (a key or an identity
    /// record planted in it would be adopted), or one that does not exist yet refused.
    #[test]
    fn a_private_directory_is_owned_and_closed() {
        let d = dir("private");
        let state = d.join("state");
        assert!(!check_dir_path(&state).unwrap(), "missing: made later");
        assert!(!check_dir_path(&state.join("deeper")).unwrap(), "missing: made later");
        ensure_dir(&state).unwrap();
        assert_eq!(std::fs::metadata(&state).unwrap().permissions().mode() & 0o7777, 0o755);
        assert!(check_dir_path(&state).unwrap());
        for mode in [0o775, 0o1777, 0o757] {
            chmod(&state, mode);
            let e = check_dir_path(&state).unwrap_err().to_string();
            assert!(e.contains(&format!("mode {mode:04o}")), "{e}");
        }
        chmod(&state, 0o700);
        std::os::unix::fs::chown(&state, Some(OTHER), None).unwrap();
        assert!(check_dir_path(&state).unwrap_err().to_string().contains("owned by uid 4321"));
        std::fs::write(d.join("file"), b"").unwrap();
        assert!(check_dir_path(&d.join("file")).unwrap_err().to_string().contains("is not a directory"));
        std::fs::remove_dir_all(&d).unwrap();
    }
}
