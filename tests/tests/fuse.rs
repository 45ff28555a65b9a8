//! `rblk mount`: a volume as one file in a FUSE filesystem.
//!
//! Host tests (`mem_*`) mount in-process over the in-memory fabric through the library
//! (`rblk_initiator::mount`): they need /dev/fuse and root (or fusermount3), and fail, never skip,
//! without them. Guest tests (`rxe_*`, ignored on hosts) run the real `rblk mount` binary against
//! `rblk-target` over rxe: ext4 on a loop device across two mounts, fio with verification, the
//! data crossing between the FUSE file and `rblk read`/`rblk write`, read-only mounts.

use std::fs::{File, OpenOptions};
use std::io::{BufRead as _, BufReader, ErrorKind, Write as _};
use std::os::unix::fs::FileExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use rblk::fusefs::{self, MountOptions, Mounted};
use rblk_fabric::Fabric;
use rblk_initiator::{OpenMode, Options, Session, Volume};
use rblk_tests::daemon::bin;
use rblk_tests::target::{Spec, Target};

const MIB: u64 = 1 << 20;

fn uri(t: &Target) -> String {
    format!("rblk://{}/v", t.addr())
}

fn open(t: &Target, mode: OpenMode) -> Volume {
    let opts = Options { fabric: t.fabric(), ..Options::default() };
    Session::connect(&uri(t), &opts).expect("connect").open(mode).expect("open")
}

/// A fresh empty directory under /tmp.
fn scratch_dir(tag: &str) -> PathBuf {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("rblk-fuse-{tag}-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create a scratch directory");
    dir
}

/// Deterministic bytes.
fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Host: in-process over the in-memory fabric.
// ---------------------------------------------------------------------------------------------

/// Mounts volume `v` of `t` at a fresh directory. Fails with the reason when FUSE cannot work here.
fn mem_mount(t: &Target, mode: OpenMode, queues: u32) -> Mounted {
    assert!(
        Path::new("/dev/fuse").exists(),
        "these tests mount FUSE on the host and /dev/fuse is missing: load the fuse module (modprobe fuse)"
    );
    let dir = scratch_dir("mem");
    let opts = MountOptions { queues, ..MountOptions::default() };
    fusefs::mount(open(t, mode), &dir, &opts).unwrap_or_else(|e| {
        panic!("mounting FUSE on the host failed (these tests need /dev/fuse and root, or fusermount3): {e}")
    })
}

fn mem_target(size: u64) -> Target {
    Target::start(Fabric::Mem, &Spec { volumes: vec![("v", size)], key: None })
}

/// Unmounts, waits for the session to end, removes the mount point.
fn finish(m: Mounted) -> fusefs::Summary {
    let dir = m.mountpoint().to_owned();
    let summary = m.unmount().expect("unmount and close");
    let _ = std::fs::remove_dir(&dir);
    summary
}

#[test]
fn mem_mount_shows_one_file_sized_like_the_volume() {
    let t = mem_target(16 * MIB);
    let m = mem_mount(&t, OpenMode::ReadWrite, 1);
    assert_eq!(m.file(), m.mountpoint().join("v"));
    let names: Vec<_> = std::fs::read_dir(m.mountpoint()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names, ["v"]);
    let meta = std::fs::metadata(m.file()).unwrap();
    assert!(meta.is_file());
    assert_eq!(meta.len(), 16 * MIB);
    let entry = fusefs::find_mount(m.mountpoint()).unwrap().expect("listed in mountinfo");
    assert!(entry.is_rblk() && entry.source == uri(&t), "{entry:?}");
    let e = fusefs::mount(open(&t, OpenMode::ReadOnly), m.mountpoint(), &MountOptions::default()).unwrap_err();
    assert!(e.to_string().contains("already mounted"), "no second mount on top: {e}");
    // The volume starts zeroed; a read at the end is short, past it empty.
    let f = File::open(m.file()).unwrap();
    let mut buf = vec![1u8; 10000];
    f.read_exact_at(&mut buf, 5 * MIB + 7).unwrap();
    assert!(buf.iter().all(|&b| b == 0));
    assert_eq!(f.read_at(&mut buf, 16 * MIB - 100).unwrap(), 100);
    assert_eq!(f.read_at(&mut buf, 16 * MIB).unwrap(), 0);
    // Nothing else can be created, renamed, removed or resized.
    assert!(File::create(m.mountpoint().join("other")).is_err());
    assert!(std::fs::remove_file(m.file()).is_err());
    assert!(OpenOptions::new().write(true).open(m.file()).unwrap().set_len(MIB).is_err());
    drop(f);
    let summary = finish(m);
    assert!(summary.volatile && summary.errors == 0, "{summary:?}");
}

#[test]
fn mem_unaligned_writes_read_back_and_reach_the_target() {
    let t = mem_target(16 * MIB);
    let m = mem_mount(&t, OpenMode::ReadWrite, 2);
    let f = OpenOptions::new().read(true).write(true).open(m.file()).unwrap();
    let mut model = vec![0u8; (16 * MIB) as usize];
    let mut rng = noise(7, 4096).into_iter().cycle();
    let mut next = || u64::from(rng.next().unwrap());
    // Offsets and lengths of every alignment, some spanning several blocks, some inside one.
    for i in 0..200u64 {
        let len = match i % 4 {
            0 => 1 + next() % 64,
            1 => 4000 + next() * 37,
            2 => 4096 * (1 + next() % 3),
            _ => 100_000 + next() * 997,
        } as usize;
        let offset = (next() << 16 | next() << 8 | next()) % (16 * MIB - len as u64);
        let data = noise(i, len);
        f.write_all_at(&data, offset).unwrap();
        model[offset as usize..offset as usize + len].copy_from_slice(&data);
        if i % 50 == 49 {
            f.sync_all().unwrap();
        }
    }
    // A write running past the end is short; one starting at the end is refused.
    assert_eq!(f.write_at(&[0xEE; 300], 16 * MIB - 100).unwrap(), 100);
    model[(16 * MIB - 100) as usize..].fill(0xEE);
    let e = f.write_at(&[1], 16 * MIB).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(28), "ENOSPC past the end: {e}");

    let mut back = vec![0u8; model.len()];
    for (i, chunk) in back.chunks_mut(777_777).enumerate() {
        f.read_exact_at(chunk, (i * 777_777) as u64).unwrap();
    }
    assert!(back == model, "the file reads back what was written");

    // fsync sends a FLUSH only when something was written since the last one.
    f.sync_all().unwrap();
    let before = m.volume_file().stats();
    f.sync_all().unwrap();
    f.sync_data().unwrap();
    let after = m.volume_file().stats();
    assert_eq!(after.flushes, before.flushes, "no FLUSH without writes: {before:?} -> {after:?}");
    assert!(after.flushes >= 4 && after.read_modify_writes > 0, "{after:?}");
    drop(f);

    // Another session sees the same bytes: they are in the target, not in a cache.
    let mut other = open(&t, OpenMode::ReadOnly);
    let mut direct = vec![0u8; model.len()];
    other.read_at(&mut direct, 0).unwrap();
    assert!(direct == model, "the target holds what the file showed");
    // And the file sees what the other session writes.
    let mut writer = open(&t, OpenMode::ReadWrite);
    writer.write_at(&noise(99, 8192), 4 * MIB).unwrap();
    let mut seen = vec![0u8; 8192];
    File::open(m.file()).unwrap().read_exact_at(&mut seen, 4 * MIB).unwrap();
    assert_eq!(seen, noise(99, 8192));
    let summary = finish(m);
    assert_eq!(summary.errors, 1, "only the write past the end failed: {summary:?}");
}

/// Issue 41 on FUSE: `fallocate --punch-hole` zeroes exactly its range, its whole blocks by a
/// DISCARD and its partial edges by writes, cut at the end of the file; `--zero-range` zeroes
/// exactly its range; plain allocation changes nothing; a range past the end fails EFBIG.
/// Catches a punch or zero that is refused (EOPNOTSUPP, as before), that zeroes whole blocks
/// around unaligned edges or leaves them, and a punch that writes zeros instead of discarding.
#[test]
fn mem_fallocate_punches_and_zeroes_exactly_their_ranges() {
    let t = mem_target(4 * MIB);
    let m = mem_mount(&t, OpenMode::ReadWrite, 1);
    let mut model = noise(41, (4 * MIB) as usize);
    std::fs::OpenOptions::new().write(true).open(m.file()).unwrap().write_all_at(&model, 0).unwrap();
    let file = m.file().to_str().unwrap().to_owned();
    let fallocate = |args: &[&str]| {
        let out = Command::new("fallocate").args(args).arg(&file).output().expect("run fallocate");
        (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    // 100 bytes into block 1 to 10 bytes into block 5: blocks 2-4 discarded, the edges written.
    let (offset, len) = (4096 + 100, 4 * 4096 - 90);
    assert!(fallocate(&["--punch-hole", "--offset", &offset.to_string(), "--length", &len.to_string()]).0);
    model[offset..offset + len].fill(0);
    let (offset, len) = (MIB as usize + 7, 3 * 4096);
    assert!(fallocate(&["--zero-range", "--offset", &offset.to_string(), "--length", &len.to_string()]).0);
    model[offset..offset + len].fill(0);
    // A punch running past the end is cut there; plain allocation inside changes nothing.
    let tail = (4 * MIB - 4096) as usize;
    assert!(fallocate(&["--punch-hole", "--offset", &tail.to_string(), "--length", "1M"]).0);
    model[tail..].fill(0);
    assert!(fallocate(&["--keep-size", "--offset", "0", "--length", "1M"]).0);
    let (ok, err) = fallocate(&["--zero-range", "--offset", &(4 * MIB).to_string(), "--length", "4096"]);
    assert!(!ok && err.contains("File too large"), "zeroing past the end: {err}");
    let mut back = vec![0u8; model.len()];
    File::open(m.file()).unwrap().read_exact_at(&mut back, 0).unwrap();
    let first_wrong = back.iter().zip(&model).position(|(a, b)| a != b);
    assert_eq!(first_wrong, None, "the file differs from the model");
    let stats = m.volume_file().stats();
    assert_eq!((stats.discards, stats.discarded_bytes), (2, 3 * 4096 + 4096), "two punches discarded: {stats:?}");
    finish(m);
}

#[test]
fn mem_concurrent_writes_into_shared_blocks_keep_every_byte() {
    let tag = |p: u64| (p % 255) as u8 + 1;
    let t = mem_target(4 * MIB);
    let m = mem_mount(&t, OpenMode::ReadWrite, 4);
    // 4 threads write interleaved 100-byte pieces: every block is shared by several writers,
    // each piece is a read-modify-write, and none may undo another's.
    let threads = 4u64;
    let pieces = 400u64;
    std::thread::scope(|s| {
        for w in 0..threads {
            let file = m.file().to_owned();
            s.spawn(move || {
                let f = OpenOptions::new().write(true).open(file).unwrap();
                for p in (w..pieces).step_by(threads as usize) {
                    f.write_all_at(&[tag(p); 100], p * 100).unwrap();
                }
            });
        }
    });
    let mut back = vec![0u8; (pieces * 100) as usize];
    File::open(m.file()).unwrap().read_exact_at(&mut back, 0).unwrap();
    for p in 0..pieces {
        let piece = &back[(p * 100) as usize..][..100];
        assert!(piece.iter().all(|&b| b == tag(p)), "piece {p} lost: {:?}", &piece[..8]);
    }
    finish(m);
}

#[test]
fn mem_read_only_mount_refuses_writes() {
    let t = mem_target(4 * MIB);
    {
        let mut w = open(&t, OpenMode::ReadWrite);
        w.write_at(&noise(3, 4096), 0).unwrap();
        w.close().unwrap();
    }
    let m = mem_mount(&t, OpenMode::ReadOnly, 1);
    let meta = std::fs::metadata(m.file()).unwrap();
    assert!(meta.permissions().readonly());
    let e = OpenOptions::new().write(true).open(m.file()).unwrap_err();
    assert!(
        matches!(e.raw_os_error(), Some(30 | 13)),
        "opening for write must fail with EROFS or EACCES, got {e} ({:?})",
        e.kind()
    );
    let mut back = vec![0u8; 4096];
    File::open(m.file()).unwrap().read_exact_at(&mut back, 0).unwrap();
    assert_eq!(back, noise(3, 4096));
    // The library refuses too, whatever the kernel lets through.
    let e = m.volume_file().write_at(&[1], 0).unwrap_err();
    assert!(e.to_string().contains("read-only"), "{e}");
    finish(m);
}

#[test]
fn mem_unmount_refuses_what_is_not_an_rblk_mount() {
    let dir = scratch_dir("not-mounted");
    let e = fusefs::unmount(&dir).unwrap_err();
    assert!(matches!(e, fusefs::Error::NotMounted { .. }) && e.to_string().contains("is not an rblk mount"), "{e}");
    let e = fusefs::unmount(Path::new("/proc")).unwrap_err();
    assert!(e.to_string().contains("proc"), "says what is mounted there instead: {e}");
    std::fs::remove_dir(&dir).unwrap();
}

#[test]
fn mem_external_umount_ends_the_session_cleanly() {
    let t = mem_target(4 * MIB);
    let m = mem_mount(&t, OpenMode::ReadWrite, 1);
    std::fs::write(m.file(), b"x").map(drop).unwrap_or_else(|e| {
        // O_TRUNC is ignored (as by a block device), so this is a 1-byte write at 0.
        panic!("writing through the file: {e}")
    });
    let dir = m.mountpoint().to_owned();
    let (tx, rx) = mpsc::channel();
    let waiter = std::thread::spawn(move || tx.send(m.wait().map(|s| s.stats)).unwrap());
    let out = Command::new("umount").arg(&dir).output().expect("run umount");
    assert!(out.status.success(), "umount: {}", String::from_utf8_lossy(&out.stderr));
    let stats = rx.recv_timeout(Duration::from_secs(30)).expect("the session ends").expect("cleanly");
    assert_eq!(stats.writes, 1);
    waiter.join().unwrap();
    let mut back = vec![0u8; 4096];
    open(&t, OpenMode::ReadOnly).read_at(&mut back, 0).unwrap();
    assert_eq!(back[..2], *b"x\0");
    std::fs::remove_dir(&dir).unwrap();
}

/// Issue 43, trap 6: `rblk umount` printed `rblk: unmounted DIR` on stdout, where only results
/// go (it has none). Would catch a status line back on stdout, or none said at all.
#[test]
fn mem_rblk_umount_says_what_it_did_on_stderr_only() {
    let t = mem_target(4 * MIB);
    let m = mem_mount(&t, OpenMode::ReadOnly, 1);
    let dir = m.mountpoint().to_owned();
    let (tx, rx) = mpsc::channel();
    let waiter = std::thread::spawn(move || tx.send(m.wait().map(drop)).unwrap());
    let out = rblk(&["umount", dir.to_str().unwrap()]);
    assert!(out.status.success(), "rblk umount failed");
    assert!(out.stdout.is_empty(), "status on stdout: {:?}", String::from_utf8_lossy(&out.stdout));
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(text.contains(&format!("rblk: unmounted {}", dir.display())), "{text}");
    rx.recv_timeout(Duration::from_secs(30)).expect("the session ends").expect("cleanly");
    waiter.join().unwrap();
    std::fs::remove_dir(&dir).unwrap();
}

#[test]
fn mem_a_finished_mount_leaves_the_next_one_on_its_path_alone() {
    let t = mem_target(4 * MIB);
    let a = mem_mount(&t, OpenMode::ReadOnly, 1);
    let dir = a.mountpoint().to_owned();
    let out = Command::new("umount").arg(&dir).output().expect("run umount");
    assert!(out.status.success(), "umount: {}", String::from_utf8_lossy(&out.stderr));
    // B mounts on the same path before A's server has noticed and cleaned up.
    let b = fusefs::mount(open(&t, OpenMode::ReadOnly), &dir, &MountOptions::default()).expect("mount B");
    a.wait().expect("A ends cleanly");
    assert!(fusefs::find_mount(&dir).unwrap().is_some_and(|m| m.is_rblk()), "A's cleanup unmounted B");
    assert_eq!(std::fs::metadata(b.file()).expect("B's file").len(), 4 * MIB);
    finish(b);
}

/// Grows volume `v` of the in-process target `t` to `size` bytes, as a reload with a larger
/// `size` does.
fn mem_grow(t: &Target, size: u64) {
    let Target::InProcess(r) = t else { panic!("mem_grow needs the in-process target") };
    let cfg = rblk_target::server::Config {
        listen: r.local_addr(),
        fabric: Fabric::Mem,
        volumes: vec![rblk_target::config::VolumeSpec { name: "v".into(), size, path: None }],
        ..rblk_target::server::Config::default()
    };
    let report = r.reload(cfg).expect("the reload grows the volume");
    assert!(report.grown.iter().any(|(n, _, s)| n == "v" && *s == size), "not grown: {report:?}");
}

/// `stat -f`'s total bytes of the filesystem at `path`.
fn statfs_bytes(path: &Path) -> u64 {
    let out = sh("stat", &["-f", "--format=%b %S", path.to_str().unwrap()]);
    let (blocks, bsize) = out.trim().split_once(' ').expect("stat -f: blocks and block size");
    blocks.parse::<u64>().unwrap() * bsize.parse::<u64>().unwrap()
}

/// Issue 44: a grown volume's file shows its new size at once (within 100 ms of the library
/// hearing the target's RESIZED). The kernel caches the file's attributes for 60 s (the TTL);
/// `rblk mount` invalidates the inode when the engine's resize hook runs. Would catch that invalidation removed (the cached 16 MiB stays for a
/// minute: checked), the resize hook not registered or its size not passed on, the file's size
/// not read from the engine's current size, reads or writes past the old end clamped to the old
/// size (short reads, EFBIG), and statfs not following.
#[test]
fn mem_a_grown_volume_shows_its_new_size_at_once() {
    let t = mem_target(16 * MIB);
    let m = mem_mount(&t, OpenMode::ReadWrite, 2);
    let f = OpenOptions::new().read(true).write(true).open(m.file()).unwrap();
    let before = noise(1, 8192);
    f.write_all_at(&before, 16 * MIB - 8192).unwrap();
    let mut buf = vec![0u8; 4096];
    assert_eq!(f.read_at(&mut buf, 16 * MIB).unwrap(), 0, "nothing past the end yet");
    // Cached by the kernel from here on (TTL 60 s): a read or a write would invalidate the
    // attributes, so none comes until the file has shown the new size.
    assert_eq!(std::fs::metadata(m.file()).unwrap().len(), 16 * MIB);
    assert_eq!(statfs_bytes(m.mountpoint()), 16 * MIB);

    mem_grow(&t, 48 * MIB);
    // An idle mount's library hears RESIZED at its next housekeeping tick (every 2 s) or I/O:
    // tick here until it has, then time the file from there.
    let deadline = Instant::now() + Duration::from_secs(5);
    while m.volume_file().size() != 48 * MIB {
        assert!(Instant::now() < deadline, "the library never learnt the grow");
        m.volume_file().tick().expect("tick");
        std::thread::sleep(Duration::from_millis(1));
    }
    let start = Instant::now();
    let mut len = 0;
    while start.elapsed() < Duration::from_secs(5) {
        len = std::fs::metadata(m.file()).unwrap().len();
        if len == 48 * MIB {
            break;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    let took = start.elapsed();
    assert_eq!(len, 48 * MIB, "stat still shows the old size {took:?} after the library learnt the grow");
    assert!(took < Duration::from_millis(100), "stat showed the new size only {took:?} after the library learnt it");
    assert_eq!(statfs_bytes(m.mountpoint()), 48 * MIB);
    assert_eq!(m.volume_file().size(), 48 * MIB);

    // Through the descriptor opened before the grow: across the old end, and far past it.
    let across = noise(2, 3 * 4096 + 100);
    f.write_all_at(&across, 16 * MIB - 4096).unwrap();
    let far = noise(3, 100_000);
    f.write_all_at(&far, 48 * MIB - 100_000).unwrap();
    f.sync_all().unwrap();
    let mut back = vec![0u8; 8192];
    f.read_exact_at(&mut back, 16 * MIB - 8192).unwrap();
    assert_eq!(back[..4096], before[..4096], "the bytes before the old end");
    let mut back = vec![0u8; across.len()];
    f.read_exact_at(&mut back, 16 * MIB - 4096).unwrap();
    assert!(back == across, "the write across the old end reads back");
    let mut back = vec![0u8; far.len()];
    f.read_exact_at(&mut back, 48 * MIB - 100_000).unwrap();
    assert!(back == far, "the write at the new end reads back");
    assert_eq!(f.read_at(&mut buf, 48 * MIB).unwrap(), 0, "nothing past the new end");
    // And at the target: a fresh session reads what went past the old end.
    let mut vol = open(&t, OpenMode::ReadOnly);
    assert_eq!(vol.size(), 48 * MIB);
    let mut back = vec![0u8; 25 * 4096];
    vol.read_at(&mut back, 48 * MIB - 25 * 4096).unwrap();
    assert!(back[25 * 4096 - 100_000..] == far, "the target holds the write at the new end");
    drop(vol);
    drop(f);
    let summary = finish(m);
    assert_eq!(summary.errors, 0, "{summary:?}");
}

// ---------------------------------------------------------------------------------------------
// Guest: the rblk binary against rblk-target over rxe.
// ---------------------------------------------------------------------------------------------

fn device() -> String {
    rblk_tests::rxe::rdma().device
}

fn rxe_target(size: u64) -> Target {
    Target::start(Fabric::Verbs, &Spec { volumes: vec![("v", size)], key: None })
}

fn show(what: &str, out: &Output) {
    eprintln!("$ {what} -> {}", out.status);
    eprint!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
}

/// Runs a command, echoes its output, fails the test unless it succeeds.
fn sh(program: &str, args: &[&str]) -> String {
    let out =
        Command::new(program).args(args).stdin(Stdio::null()).output().unwrap_or_else(|e| {
            panic!("{program}: {e} (is it installed? scripts/deps.sh installs what the tests need)")
        });
    show(&format!("{program} {}", args.join(" ")), &out);
    assert!(out.status.success(), "{program} {} failed", args.join(" "));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn rblk(args: &[&str]) -> Output {
    let out = Command::new(bin("rblk")).args(args).stdin(Stdio::null()).output().expect("run rblk (RBLK_BIN_DIR?)");
    show(&format!("rblk {}", args.join(" ")), &out);
    out
}

/// `rblk mount`'s one stdout line under `-o json`: (file, loop device, pid).
fn mounted_json(line: &str) -> (PathBuf, Option<String>, u32) {
    let v: serde_json::Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{line:?} is not JSON: {e}"));
    let file = PathBuf::from(v["file"].as_str().expect("the file's path"));
    assert!(file.starts_with(v["mountpoint"].as_str().expect("the mount point")), "{line}");
    let pid = v["pid"].as_u64().expect("the serving pid") as u32;
    (file, v["loop_device"].as_str().map(str::to_owned), pid)
}

/// `rblk mount --daemon`: returns (file, loop device, pid). Checks the text form's one stdout
/// line (the path to do I/O on) and the JSON form's.
fn mount_daemon(t: &Target, mnt: &Path, extra: &[&str]) -> (PathBuf, Option<String>, u32) {
    let (u, dev) = (uri(t), device());
    let mut args = vec!["mount", &u, mnt.to_str().unwrap(), "--daemon", "--device", &dev, "-o", "json"];
    args.extend_from_slice(extra);
    let out = rblk(&args);
    assert!(out.status.success(), "rblk mount --daemon failed");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 1, "stdout must be exactly one line: {text:?}");
    mounted_json(lines[0])
}

fn wait_gone(pid: u32) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while Path::new(&format!("/proc/{pid}")).exists() {
        assert!(Instant::now() < deadline, "the background rblk mount (pid {pid}) did not exit after rblk umount");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn umount_rblk(mnt: &Path) {
    let out = rblk(&["umount", mnt.to_str().unwrap()]);
    assert!(out.status.success(), "rblk umount failed");
    assert!(out.stdout.is_empty(), "rblk umount's status belongs on stderr");
}

/// A foreground `rblk mount`, its stdout read until it says where the file is.
struct Foreground {
    child: Child,
    file: PathBuf,
    mnt: PathBuf,
}

impl Foreground {
    fn start(t: &Target, mnt: &Path, extra: &[&str]) -> Foreground {
        let mut child = Command::new(bin("rblk"))
            .args(["mount", &uri(t)])
            .arg(mnt)
            .args(["--device", &device()])
            .args(extra)
            .args(["-o", "json"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run rblk mount");
        let (stdout, stderr) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                eprintln!("[rblk mount] {line}");
            }
        });
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                eprintln!("[rblk mount] {line}");
                let _ = tx.send(line);
            }
        });
        let line = rx.recv_timeout(Duration::from_secs(120)).unwrap_or_else(|_| {
            let _ = child.kill();
            panic!("rblk mount did not report its file")
        });
        let (file, _, pid) = mounted_json(&line);
        assert_eq!(pid, child.id(), "the foreground process serves");
        assert!(rx.recv_timeout(Duration::from_millis(500)).is_err(), "a second stdout line after {line:?}");
        Foreground { child, file, mnt: mnt.to_owned() }
    }

    /// `rblk umount`, then the server must exit 0.
    fn stop(mut self) {
        umount_rblk(&self.mnt);
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                assert!(status.success(), "rblk mount exited with {status} after rblk umount");
                return;
            }
            assert!(Instant::now() < deadline, "rblk mount did not exit after rblk umount");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Foreground {
    /// SIGTERM: the server unmounts, flushes and exits 0.
    fn terminate(mut self) {
        let pid = self.child.id().to_string();
        sh("kill", &["-TERM", &pid]);
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                assert!(status.success(), "rblk mount exited with {status} after SIGTERM");
                break;
            }
            assert!(Instant::now() < deadline, "rblk mount did not exit after SIGTERM");
            std::thread::sleep(Duration::from_millis(100));
        }
        assert!(fusefs::find_mount(&self.mnt).unwrap().is_none(), "SIGTERM unmounted it");
    }
}

impl Drop for Foreground {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Unmounts what a failed test left behind.
struct Cleanup(Vec<PathBuf>);

impl Drop for Cleanup {
    fn drop(&mut self) {
        if std::thread::panicking() {
            for path in self.0.iter().rev() {
                let _ = Command::new("umount").arg(path).status();
                let _ = Command::new(bin("rblk")).arg("umount").arg(path).status();
            }
        }
    }
}

#[test]
#[ignore = "needs rxe: run in the guest by scripts/test.sh"]
fn rxe_ext4_on_the_loop_device_survives_a_remount_and_fstrim() {
    let t = rxe_target(256 * MIB);
    let dir = scratch_dir("ext4");
    let (mnt, fsdir) = (dir.join("mnt"), dir.join("fs"));
    std::fs::create_dir_all(&mnt).unwrap();
    std::fs::create_dir_all(&fsdir).unwrap();
    let _cleanup = Cleanup(vec![mnt.clone(), fsdir.clone()]);

    let (file, dev, pid) = mount_daemon(&t, &mnt, &["--loop"]);
    assert_eq!(std::fs::metadata(&file).unwrap().len(), 256 * MIB);
    let dev = dev.expect("--loop prints the loop device");
    let backing = sh("losetup", &["--noheadings", "--output", "BACK-FILE,DIO", &dev]);
    assert!(backing.contains(file.to_str().unwrap()), "{dev} is backed by the file: {backing}");
    sh("mkfs.ext4", &["-q", "-F", "-E", "nodiscard", &dev]);
    sh("mount", &[&dev, fsdir.to_str().unwrap()]);

    // 50 files of random sizes, their checksums kept outside the volume.
    let mut sizes = noise(50, 100).into_iter();
    let mut names = Vec::new();
    for i in 0..50u64 {
        let (a, b) = (u64::from(sizes.next().unwrap()), u64::from(sizes.next().unwrap()));
        let len = match i % 5 {
            0 => a,                   // tiny
            1 => a * 4096 + b,        // up to 1 MiB, unaligned
            2 => (a % 4) * 4096,      // whole blocks (or empty)
            _ => a * 97 + b * 13 + 1, // tens of KiB
        };
        let name = format!("f{i:02}");
        std::fs::write(fsdir.join(&name), noise(1000 + i, len as usize)).unwrap();
        names.push(name);
    }
    let mut args = vec!["sha256sum"];
    args.extend(names.iter().map(String::as_str));
    let sums = Command::new("sh")
        .arg("-c")
        .arg(format!("cd {} && {}", fsdir.display(), args.join(" ")))
        .output()
        .expect("sha256sum");
    assert!(sums.status.success());
    let list = dir.join("SHA256SUMS");
    std::fs::write(&list, &sums.stdout).unwrap();
    sh("sync", &[]);
    sh("umount", &[fsdir.to_str().unwrap()]);
    umount_rblk(&mnt);
    wait_gone(pid);
    assert!(fusefs::find_mount(&mnt).unwrap().is_none(), "unmounted");
    assert!(fusefs::loops_backed_by(&mnt).unwrap().is_empty(), "the loop device is detached");

    // A fresh mount, a fresh loop device: the files are all there.
    let (_, dev, pid) = mount_daemon(&t, &mnt, &["--loop"]);
    let dev = dev.expect("loop device");
    sh("e2fsck", &["-f", "-n", &dev]);
    sh("mount", &[&dev, fsdir.to_str().unwrap()]);
    let check = Command::new("sh")
        .arg("-c")
        .arg(format!("cd {} && sha256sum --check --quiet {}", fsdir.display(), list.display()))
        .output()
        .expect("sha256sum --check");
    show("sha256sum --check", &check);
    assert!(check.status.success(), "checksums differ after the remount");

    // fstrim with files deleted (issue 41): the loop device's discards arrive as punches of the
    // FUSE file, which become DISCARDs; what is left still checks.
    let trim = sh("sh", &["-c", &format!("rm {0}/f0*; sync; fstrim -v {0}", fsdir.display())]);
    assert!(trim.contains("trimmed"), "fstrim over the loop device: {trim}");
    let kept = Command::new("sh")
        .arg("-c")
        .arg(format!("cd {} && grep -v ' f0' {} | sha256sum --check --quiet -", fsdir.display(), list.display()))
        .output()
        .expect("sha256sum --check");
    assert!(kept.status.success(), "the files kept differ after fstrim");

    // While ext4 is mounted on the loop device, rblk umount refuses and changes nothing.
    let out = rblk(&["umount", mnt.to_str().unwrap()]);
    assert!(!out.status.success());
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(text.contains(&dev) && text.contains("mounted at"), "says why: {text}");
    assert!(fusefs::find_mount(&mnt).unwrap().is_some(), "still mounted");

    sh("umount", &[fsdir.to_str().unwrap()]);
    umount_rblk(&mnt);
    wait_gone(pid);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 44 on 6.12, in CI: a grown volume's loop device follows with `losetup -c`, and ext4 on
/// it grows online. Nothing stats the file meanwhile: `losetup -c` reads the inode's size
/// without asking the filesystem (before Linux 6.15), so this would catch the server not
/// refreshing that size itself after invalidating the inode (the loop device keeps 64 MiB), the
/// invalidation missing, the session not hearing the grow, and I/O past the old end failing or
/// landing elsewhere (a MiB written there through the loop device and read back, resize2fs,
/// the files written before and after, e2fsck). Kept small for CI's guest time.
#[test]
#[ignore = "needs rxe: run in the guest by scripts/test.sh"]
fn rxe_a_grown_volumes_loop_device_follows_with_losetup_c() {
    let config = |size: &str| format!("[[volume]]\nname = \"v\"\nsize = \"{size}\"\n");
    let t = Target::start_with_config(Fabric::Verbs, &config("64M"));
    let dir = scratch_dir("grow");
    let (mnt, fsdir) = (dir.join("mnt"), dir.join("fs"));
    std::fs::create_dir_all(&mnt).unwrap();
    std::fs::create_dir_all(&fsdir).unwrap();
    let _cleanup = Cleanup(vec![mnt.clone(), fsdir.clone()]);
    let (file, dev, pid) = mount_daemon(&t, &mnt, &["--loop"]);
    let dev = dev.expect("--loop prints the loop device");
    let (fs, sums, one) = (
        fsdir.display().to_string(),
        dir.join("SHA256SUMS").display().to_string(),
        dir.join("one-mib").display().to_string(),
    );
    let bash = |script: &str| sh("bash", &["-c", &format!("set -euo pipefail\n{script}")]);
    bash(&format!(
        "mkfs.ext4 -q -F -E nodiscard {dev}; mount {dev} {fs}
         head -c 1048577 /dev/urandom > {fs}/before; (cd {fs} && sha256sum before > {sums}); sync"
    ));
    let loop_size = || bash(&format!("blockdev --getsize64 {dev}")).trim().parse::<u64>().unwrap();
    assert_eq!(loop_size(), 64 * MIB);

    let asked = Instant::now();
    t.reload(&config("96M")).expect("the reload grows the volume");
    // An idle mount hears the grow at its next housekeeping tick (2 s) at the latest.
    let mut size = 0;
    while size != 96 * MIB && asked.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(100));
        sh("losetup", &["-c", &dev]);
        size = loop_size();
    }
    assert_eq!(size, 96 * MIB, "{dev} still has {size} bytes {:?} after the grow", asked.elapsed());
    eprintln!("the loop device had the new size {:?} after the grow", asked.elapsed());
    assert_eq!(std::fs::metadata(&file).unwrap().len(), 96 * MIB);

    bash(&format!(
        "head -c 1048576 /dev/urandom > {one}
         dd if={one} of={dev} bs=1M seek=95 oflag=direct status=none
         dd if={dev} bs=1M skip=95 count=1 iflag=direct status=none | cmp - {one}
         dd if={file} bs=1M skip=95 count=1 iflag=direct status=none | cmp - {one}
         resize2fs {dev}
         test $(df --output=size -B1M {fs} | tail -1) -gt 80
         head -c 1048578 /dev/urandom > {fs}/after; (cd {fs} && sha256sum after >> {sums}); sync; umount {fs}
         e2fsck -fn {dev}; mount {dev} {fs}; (cd {fs} && sha256sum --check --quiet {sums}); umount {fs}",
        file = file.display()
    ));
    umount_rblk(&mnt);
    wait_gone(pid);
    let _ = std::fs::remove_dir_all(&dir);
}

/// fio's summary line for the reads or writes of its output.
fn fio_line(out: &str, what: &str) -> String {
    out.lines().find(|l| l.trim_start().starts_with(what)).map(|l| l.trim().to_owned()).unwrap_or_default()
}

#[test]
#[ignore = "needs rxe: run in the guest by scripts/test.sh"]
fn rxe_fio_verifies_through_the_file() {
    let t = rxe_target(64 * MIB);
    let dir = scratch_dir("fio");
    let fg = Foreground::start(&t, &dir, &["--queues", "2"]);
    let file = fg.file.to_str().unwrap().to_owned();
    let common = ["--fallocate=none", "--group_reporting"];
    let out = sh(
        "fio",
        &[
            "--name=v",
            &format!("--filename={file}"),
            "--rw=randwrite",
            "--bs=4k",
            // 1024 verified 4 KiB writes, each a FUSE round trip: the same proof as 16 MiB's
            // 4096, in a quarter of the guest's time.
            "--size=4M",
            "--iodepth=4",
            "--ioengine=psync",
            "--verify=crc32c",
            "--do_verify=1",
            "--verify_fatal=1",
            common[0],
            common[1],
        ],
    );
    assert!(!out.contains("verify: bad"), "fio found corrupt data");
    // The figure for the issue: 4 KiB random reads through FUSE, 5 s, O_DIRECT.
    for (label, engine, depth) in [("psync qd1", "psync", "1"), ("libaio qd16", "libaio", "16")] {
        let out = sh(
            "fio",
            &[
                "--name=r",
                &format!("--filename={file}"),
                "--rw=randread",
                "--bs=4k",
                "--size=64M",
                "--direct=1",
                &format!("--ioengine={engine}"),
                &format!("--iodepth={depth}"),
                "--time_based",
                "--runtime=5",
                common[0],
                common[1],
            ],
        );
        // Straight to stdout, past libtest's capture: the figure is wanted from passing runs.
        let line = format!("FUSE 4k randread ({label}, 2 queues): {}\n", fio_line(&out, "read:"));
        std::io::stdout().write_all(line.as_bytes()).unwrap();
    }
    fg.stop();
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
#[ignore = "needs rxe: run in the guest by scripts/test.sh"]
fn rxe_data_crosses_between_the_file_and_rblk_read_write() {
    let t = rxe_target(64 * MIB);
    let dir = scratch_dir("cross");
    let (mnt, work) = (dir.join("mnt"), dir.join("work"));
    std::fs::create_dir_all(&mnt).unwrap();
    std::fs::create_dir_all(&work).unwrap();
    let fg = Foreground::start(&t, &mnt, &[]);
    let file = fg.file.to_str().unwrap().to_owned();

    // dd into the file at an unaligned offset, fsync; rblk read sees it.
    let (offset, len) = (3 * MIB + 1234, 300_001usize);
    let data = noise(11, len);
    let src = work.join("src");
    std::fs::write(&src, &data).unwrap();
    sh(
        "dd",
        &[
            &format!("if={}", src.display()),
            &format!("of={file}"),
            "bs=64k",
            &format!("seek={offset}"),
            "oflag=seek_bytes",
            "conv=notrunc,fsync",
            "status=none",
        ],
    );
    let (start, end) = (offset / 4096 * 4096, (offset + len as u64).div_ceil(4096) * 4096);
    let out = work.join("out");
    let read = rblk(&[
        "read",
        &uri(&t),
        "--offset",
        &start.to_string(),
        "--length",
        &(end - start).to_string(),
        "--output",
        out.to_str().unwrap(),
        "--device",
        &device(),
    ]);
    assert!(read.status.success());
    let got = std::fs::read(&out).unwrap();
    assert!(got[(offset - start) as usize..][..len] == data[..], "rblk read sees what dd wrote through FUSE");
    assert!(got[..(offset - start) as usize].iter().all(|&b| b == 0), "the bytes before are untouched");

    // rblk write; the file shows it at once (no page cache), at any offset.
    let data = noise(12, MIB as usize);
    std::fs::write(&src, &data).unwrap();
    let write = rblk(&["write", &uri(&t), "--offset", "8M", "--input", src.to_str().unwrap(), "--device", &device()]);
    assert!(write.status.success());
    let f = File::open(&fg.file).unwrap();
    let mut back = vec![0u8; MIB as usize];
    f.read_exact_at(&mut back, 8 * MIB).unwrap();
    assert!(back == data, "the FUSE file sees what rblk write wrote");
    let mut piece = vec![0u8; 5000];
    f.read_exact_at(&mut piece, 8 * MIB + 777).unwrap();
    assert!(piece[..] == data[777..5777]);
    drop(f);
    fg.stop();
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
#[ignore = "needs rxe: run in the guest by scripts/test.sh"]
fn rxe_read_only_mount_refuses_writes_and_sigterm_unmounts() {
    let t = rxe_target(16 * MIB);
    let dir = scratch_dir("ro");
    let fg = Foreground::start(&t, &dir, &["--read-only"]);
    let e = OpenOptions::new().write(true).open(&fg.file).unwrap_err();
    assert!(matches!(e.raw_os_error(), Some(30 | 13)), "EROFS or EACCES, got {e}");
    assert!(e.kind() == ErrorKind::ReadOnlyFilesystem || e.kind() == ErrorKind::PermissionDenied, "{e}");
    let dd = Command::new("dd")
        .args(["if=/dev/zero", &format!("of={}", fg.file.display()), "bs=4k", "count=1", "conv=notrunc"])
        .output()
        .unwrap();
    show("dd into a read-only mount", &dd);
    assert!(!dd.status.success());
    let text = String::from_utf8_lossy(&dd.stderr);
    assert!(text.contains("Read-only file system") || text.contains("Permission denied"), "{text}");
    // Reading works.
    let mut buf = vec![1u8; 4096];
    File::open(&fg.file).unwrap().read_exact_at(&mut buf, 0).unwrap();
    assert!(buf.iter().all(|&b| b == 0));
    fg.terminate();
    let _ = std::fs::remove_dir_all(&dir);
}
