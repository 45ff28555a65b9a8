//! Result files that appear whole or not at all (`--output`, `--json FILE`, `--log`): each is
//! written to a temporary file beside it, created before the run (so that a path that cannot
//! be written fails before minutes of load), and renamed over it only once the run succeeded.
//! A failed or interrupted run removes its temporary files and leaves what was there, the last
//! good result among it (fio truncates `--output` when it starts).

use std::fs::{File, Permissions};
use std::io::{self, Write};
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};

/// One result file being written (see the [module documentation](self)).
#[derive(Debug)]
pub(crate) struct Pending {
    path: PathBuf,
    file: Target,
}

#[derive(Debug)]
enum Target {
    /// A temporary file in the result's directory, renamed over it by [`Pending::commit`].
    Temporary(tempfile::NamedTempFile),
    /// Not a regular file (a terminal, `/dev/stdout`, a FIFO): written to directly, since
    /// renaming over it would replace the device node or pipe.
    Direct(File),
}

impl Pending {
    /// Starts the result file `path`. A symbolic link is followed: the file it names is the one
    /// replaced, the link stays.
    pub(crate) fn create(path: &Path) -> io::Result<Pending> {
        let real = match std::fs::metadata(path) {
            Ok(m) if !m.is_file() => {
                let f = std::fs::OpenOptions::new().write(true).open(path)?;
                return Ok(Pending { path: path.to_owned(), file: Target::Direct(f) });
            }
            Ok(_) => std::fs::canonicalize(path)?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => path.to_owned(),
            Err(e) => return Err(e),
        };
        let dir = match real.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_owned(),
            _ => PathBuf::from("."),
        };
        let name = real.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        // 0666 less the umask, as File::create makes it (tempfile's default is 0600).
        let tmp = tempfile::Builder::new()
            .prefix(&format!(".{name}."))
            .suffix(".tmp")
            .permissions(Permissions::from_mode(0o666))
            .tempfile_in(&dir)?;
        Ok(Pending { path: real, file: Target::Temporary(tmp) })
    }

    /// The file where it will be once committed.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Puts the finished file in place: flushed to the disk, then renamed over the result.
    pub(crate) fn commit(self) -> io::Result<()> {
        match self.file {
            Target::Temporary(tmp) => {
                tmp.as_file().sync_all()?;
                tmp.persist(&self.path).map(drop).map_err(|e| e.error)
            }
            Target::Direct(mut f) => f.flush(),
        }
    }
}

impl Write for Pending {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match &mut self.file {
            Target::Temporary(t) => t.write(buf),
            Target::Direct(f) => f.write(buf),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        match &mut self.file {
            Target::Temporary(t) => t.flush(),
            Target::Direct(f) => f.flush(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("rblk-pending-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn entries(d: &Path) -> Vec<String> {
        let mut v: Vec<String> =
            std::fs::read_dir(d).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        v.sort();
        v
    }

    /// Catches a result written in place (a failed run would leave it empty or partial), a
    /// temporary file left behind, and a link replaced instead of the file it names.
    #[test]
    fn a_result_appears_whole_on_commit_and_a_dropped_one_changes_nothing() {
        let d = dir("commit");
        let out = d.join("r.json");
        std::fs::write(&out, "previous").unwrap();
        let mut p = Pending::create(&out).unwrap();
        p.write_all(b"partial").unwrap();
        assert_eq!(std::fs::read_to_string(&out).unwrap(), "previous", "nothing in place before commit");
        drop(p);
        assert_eq!(std::fs::read_to_string(&out).unwrap(), "previous", "a failed run keeps the last result");
        assert_eq!(entries(&d), ["r.json"], "no temporary file left");

        let mut p = Pending::create(&out).unwrap();
        p.write_all(b"new").unwrap();
        p.commit().unwrap();
        assert_eq!(std::fs::read_to_string(&out).unwrap(), "new");
        assert_eq!(entries(&d), ["r.json"]);
        let mode = std::fs::metadata(&out).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o666 & !umask(), "the mode File::create gives (tempfile's is 0600): {mode:o}");

        let link = d.join("latest.json");
        std::os::unix::fs::symlink("r.json", &link).unwrap();
        let mut p = Pending::create(&link).unwrap();
        p.write_all(b"through the link").unwrap();
        p.commit().unwrap();
        assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink(), "the link stays");
        assert_eq!(std::fs::read_to_string(&out).unwrap(), "through the link");
        let _ = std::fs::remove_dir_all(d);
    }

    /// Catches a device node or pipe replaced by a regular file (`--output /dev/stdout`), and a
    /// missing directory found only after the run.
    #[test]
    fn special_files_are_written_directly_and_bad_paths_fail_at_once() {
        let mut p = Pending::create(Path::new("/dev/null")).unwrap();
        p.write_all(b"x").unwrap();
        p.commit().unwrap();
        let kind = std::fs::metadata("/dev/null").unwrap().file_type();
        assert!(std::os::unix::fs::FileTypeExt::is_char_device(&kind), "/dev/null is still the device");
        assert!(Pending::create(Path::new("/nonexistent-rblk/r.json")).is_err());
    }

    fn umask() -> u32 {
        let old = nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o022));
        nix::sys::stat::umask(old);
        old.bits()
    }
}
