//! Volume instance identities: the [`VolumeId`] OPENED carries, which a reconnecting initiator
//! compares with the one it had. It may stay the same only while the contents cannot have
//! changed behind the initiator's back.
//!
//! - A RAM volume gets a fresh random id at every start ([`Volume::new`](crate::volume::Volume::new)).
//! - A durable volume keeps its id across a **clean** shutdown only. At a graceful shutdown, after
//!   every registration is gone and the final flush succeeded, [`Store::save`] records the id and
//!   the backing store's [`Fingerprint`] in the state directory. At start, [`Store::take`] reuses
//!   the id if the fingerprint still matches, and removes the record (and syncs the directory)
//!   **before** the volume is served: a crash while serving leaves no record, so the next start
//!   gets a new id and initiators learn that their unflushed writes are gone.
//!
//! Every failure errs towards a new id (that only makes initiators report a loss that may not have
//! happened); a state directory that cannot be used is reported once.

use std::fs::File;
use std::io::{self, Seek as _, SeekFrom};
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use rblk_proto::VolumeId;
use tracing::{debug, info, warn};

/// What identifies a backing store's bytes from outside: device, inode, device number (block
/// devices) and size. A file replaced by another (a restored image, `mv`) or resized differs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fingerprint {
    /// `st_dev`.
    pub dev: u64,
    /// `st_ino`.
    pub ino: u64,
    /// `st_rdev`.
    pub rdev: u64,
    /// Size in bytes (found by seeking to the end: `st_size` is 0 for block devices).
    pub size: u64,
}

impl Fingerprint {
    /// The fingerprint of an open file or block device.
    pub fn of(file: &File) -> io::Result<Fingerprint> {
        let m = file.metadata()?;
        // Every transfer names its offset (io_uring), so moving the file position is harmless.
        let size = (&*file).seek(SeekFrom::End(0))?;
        Ok(Fingerprint { dev: m.dev(), ino: m.ino(), rdev: m.rdev(), size })
    }
}

/// The state directory's records, one file per durable volume.
#[derive(Debug)]
pub struct Store {
    dir: Option<PathBuf>,
    usable: Mutex<Usable>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Usable {
    /// Not created or checked yet: a daemon without durable volumes never touches it.
    Unchecked,
    Yes,
    /// Reported once; from now on every durable volume gets fresh ids.
    No,
}

const HEADER: &str = "rblk volume identity 1";

impl Store {
    /// Records in `dir` (created on first use); None keeps nothing (fresh ids at every start).
    pub fn new(dir: Option<PathBuf>) -> Store {
        Store { dir, usable: Mutex::new(Usable::Unchecked) }
    }

    /// The state directory.
    pub fn dir(&self) -> Option<&Path> {
        self.dir.as_deref()
    }

    /// At start, before volume `name` is served: the id recorded at the last clean shutdown if
    /// the backing store's fingerprint (`current`; None if it could not be read) is unchanged,
    /// else a fresh one. The record is removed, durably, before this returns.
    pub fn take(&self, name: &str, current: Option<&Fingerprint>) -> VolumeId {
        let fresh = VolumeId(rblk_fabric::random());
        let Some(path) = self.record(name) else {
            debug!(volume = name, "no state dir: new identity {fresh}");
            return fresh;
        };
        let (kept, why) = match std::fs::read_to_string(&path) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                let why = "no identity was kept (first start, or the last run did not shut down cleanly)";
                info!(volume = name, "new identity {fresh}: {why}");
                return fresh;
            }
            Err(e) => (None, format!("cannot read {}: {e}", path.display())),
            Ok(text) => match (parse(&text), current) {
                (None, _) => (None, format!("{} is not an identity record", path.display())),
                (Some(_), None) => (None, "the backing store cannot be examined".to_owned()),
                (Some((_, was)), Some(now)) if was != *now => {
                    (None, format!("the backing store changed since the clean shutdown (was {was:?}, now {now:?})"))
                }
                (Some((id, _)), Some(_)) => (Some(id), String::new()),
            },
        };
        // Gone before anyone is served: if this run crashes, the next start must not reuse it.
        if let Err(e) = remove_durably(&path) {
            self.unusable(&format!("cannot remove {}: {e}", path.display()));
            info!(volume = name, "new identity {fresh}: the state dir cannot be written");
            return fresh;
        }
        match kept {
            Some(id) => {
                info!(volume = name, "identity {id} kept across the clean shutdown");
                id
            }
            None => {
                info!(volume = name, "new identity {fresh}: {why}");
                fresh
            }
        }
    }

    /// At a clean shutdown, once volume `name` is flushed and nobody can write it: records `id`
    /// with the backing store's fingerprint for the next start. False if nothing was recorded.
    pub fn save(&self, name: &str, current: &Fingerprint, id: VolumeId) -> bool {
        let Some(path) = self.record(name) else { return false };
        let text = format!(
            "{HEADER}\nid {id}\ndev {}\nino {}\nrdev {}\nsize {}\n",
            current.dev, current.ino, current.rdev, current.size
        );
        match rblk_fabric::private::replace(&path, text.as_bytes()) {
            Ok(()) => {
                info!(volume = name, "identity {id} kept for the next start in {}", path.display());
                true
            }
            Err(e) => {
                self.unusable(&format!("cannot write {}: {e}", path.display()));
                false
            }
        }
    }

    /// The record's path, once the directory exists; None without a usable directory.
    fn record(&self, name: &str) -> Option<PathBuf> {
        let dir = self.dir.as_ref()?;
        let mut usable = self.usable.lock().unwrap_or_else(|p| p.into_inner());
        if *usable == Usable::Unchecked {
            // Made if missing, and trusted: a record planted by someone else would be adopted.
            match rblk_fabric::trusted::ensure_dir(dir) {
                Ok(()) => *usable = Usable::Yes,
                Err(e) => {
                    drop(usable);
                    self.unusable(&format!("cannot use {}: {e}", dir.display()));
                    return None;
                }
            }
        }
        (*usable == Usable::Yes).then(|| dir.join(file_name(name)))
    }

    fn unusable(&self, why: &str) {
        let mut usable = self.usable.lock().unwrap_or_else(|p| p.into_inner());
        if *usable != Usable::No {
            *usable = Usable::No;
            warn!(
                "state dir: {why}: durable volumes get a new identity at every start: reconnecting initiators will \
                 report unflushed writes as lost"
            );
        }
    }
}

/// `name` with everything but ASCII letters, digits, `-` and `_` written as `%XX`, so any name
/// is one file of the directory (`..` included) and distinct names get distinct files.
fn file_name(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 9);
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() || b == b'-' || b == b'_' {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out.push_str(".identity");
    out
}

fn parse(text: &str) -> Option<(VolumeId, Fingerprint)> {
    let mut lines = text.lines();
    if lines.next()? != HEADER {
        return None;
    }
    let mut field = |key: &str| lines.next()?.strip_prefix(key)?.strip_prefix(' ');
    let id = VolumeId::from_hex(field("id")?)?;
    let mut number = |key: &str| field(key)?.parse::<u64>().ok();
    let fp = Fingerprint { dev: number("dev")?, ino: number("ino")?, rdev: number("rdev")?, size: number("size")? };
    lines.next().is_none().then_some((id, fp))
}

fn remove_durably(path: &Path) -> io::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    rblk_fabric::private::sync_dir(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    /// A fresh directory with a 1 MiB backing file in it.
    fn setup() -> (PathBuf, PathBuf) {
        static N: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "rblk-identity-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        let backing = dir.join("backing.img");
        File::create(&backing).unwrap().set_len(1 << 20).unwrap();
        (dir, backing)
    }

    fn fp(path: &Path) -> Fingerprint {
        Fingerprint::of(&File::open(path).unwrap()).unwrap()
    }

    /// One run of the daemon: start (take), then a clean shutdown (save) or a crash (nothing).
    fn run(state: &Path, backing: &Path, clean: bool) -> VolumeId {
        let store = Store::new(Some(state.to_owned()));
        let id = store.take("v", Some(&fp(backing)));
        assert!(!store.record("v").unwrap().exists(), "no record while serving");
        if clean {
            assert!(store.save("v", &fp(backing), id));
        }
        id
    }

    #[test]
    fn kept_across_clean_shutdowns_only() {
        let (dir, backing) = setup();
        let state = dir.join("state");
        let a = run(&state, &backing, true);
        assert_eq!(run(&state, &backing, true), a, "a clean shutdown keeps the identity");
        assert_eq!(run(&state, &backing, false), a, "this run started after a clean shutdown");
        let b = run(&state, &backing, true);
        assert_ne!(b, a, "after a crash (a run without clean shutdown) the identity is new");
        assert_eq!(run(&state, &backing, true), b);
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn a_replaced_or_resized_backing_store_gets_a_new_identity() {
        let (dir, backing) = setup();
        let a = run(&dir, &backing, true);
        // Same size and contents, another inode.
        let copy = dir.join("copy.img");
        std::fs::copy(&backing, &copy).unwrap();
        std::fs::rename(&copy, &backing).unwrap();
        let b = run(&dir, &backing, true);
        assert_ne!(b, a, "another inode");
        assert_eq!(run(&dir, &backing, true), b);
        File::options().write(true).open(&backing).unwrap().set_len(2 << 20).unwrap();
        assert_ne!(run(&dir, &backing, true), b, "another size");
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn garbage_records_give_new_identities_and_are_removed() {
        let (dir, backing) = setup();
        let a = run(&dir, &backing, true);
        let store = Store::new(Some(dir.clone()));
        let record = store.record("v").unwrap();
        let good = std::fs::read_to_string(&record).unwrap();
        for bad in [
            "garbage".to_owned(),
            good.replace("id ", "id x"),
            good.replace(HEADER, "rblk volume identity 2"),
            format!("{good}extra\n"),
            good.lines().take(3).collect::<Vec<_>>().join("\n"),
        ] {
            std::fs::write(&record, bad.as_bytes()).unwrap();
            assert_ne!(store.take("v", Some(&fp(&backing))), a, "{bad:?}");
            assert!(!record.exists(), "the bad record is removed");
        }
        std::fs::write(&record, good.as_bytes()).unwrap();
        assert_eq!(store.take("v", Some(&fp(&backing))), a, "the good record parses");
        std::fs::write(&record, good.as_bytes()).unwrap();
        assert_ne!(store.take("v", None), a, "a backing store that cannot be examined");
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn an_unusable_state_dir_gives_fresh_identities() {
        let (dir, backing) = setup();
        // A directory below a regular file cannot be created.
        let store = Store::new(Some(backing.join("state")));
        let a = store.take("v", Some(&fp(&backing)));
        assert!(!store.save("v", &fp(&backing), a));
        assert_ne!(store.take("v", Some(&fp(&backing))), a);
        let none = Store::new(None);
        let b = none.take("v", Some(&fp(&backing)));
        assert!(!none.save("v", &fp(&backing), b));
        assert_ne!(none.take("v", Some(&fp(&backing))), b);
        let _ = std::fs::remove_dir_all(dir);
    }

    /// Would catch a state directory used whoever may write to it: a record planted there (by
    /// another user, in a world-writable directory) would give a volume the identity its
    /// initiators know after contents changed behind their back.
    #[test]
    fn a_state_dir_others_may_write_is_not_used() {
        use std::os::unix::fs::PermissionsExt as _;
        let (dir, backing) = setup();
        let state = dir.join("state");
        let store = Store::new(Some(state.clone()));
        let a = store.take("v", Some(&fp(&backing)));
        assert!(store.save("v", &fp(&backing), a));
        std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o777)).unwrap();
        let store = Store::new(Some(state));
        assert_ne!(store.take("v", Some(&fp(&backing))), a, "the record in a world-writable directory");
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn file_names_are_escaped() {
        assert_eq!(file_name("vol-0_a"), "vol-0_a.identity");
        assert_eq!(file_name(".."), "%2E%2E.identity");
        assert_eq!(file_name("a/b%"), "a%2Fb%25.identity");
        assert_ne!(file_name("a.b"), file_name("a%2Eb"));
    }
}
