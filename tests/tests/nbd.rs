//! `rblk nbd` over rxe in the guest, with real NBD clients: qemu-io and qemu-img, the kernel's
//! nbd-client with ext4 and fio, data crossing between NBD and `rblk read`/`rblk write`, and a
//! raw client for bad requests and the one-client rule. The protocol's own unit tests (every
//! option and command against an in-memory device) run on the host with the `rblk` binary's tests.

use std::io::{BufRead as _, BufReader, Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use rblk_fabric::Fabric;
use rblk_tests::daemon::bin;
use rblk_tests::sh;
use rblk_tests::target::{Spec, Target};

const MIB: u64 = 1 << 20;
const NBD: &str = "/dev/nbd0";

fn target(size: u64) -> Target {
    Target::start(Fabric::Verbs, &Spec { volumes: vec![("v", size)], key: None })
}

fn uri(t: &Target) -> String {
    format!("rblk://{}/v", t.addr())
}

/// A fresh path under /tmp.
fn scratch(tag: &str) -> PathBuf {
    static N: AtomicU32 = AtomicU32::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let path = std::env::temp_dir().join(format!("rblk-nbd-{tag}-{}-{n}", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let _ = std::fs::remove_dir_all(&path);
    path
}

/// `rblk nbd` as a child process.
struct Server {
    child: Child,
    listen: String,
    socket: Option<PathBuf>,
    log: Arc<Mutex<String>>,
}

impl Server {
    /// Starts `rblk nbd URI --listen LISTEN ARGS...` (no --listen for "": the default private
    /// socket) and waits for its listening line.
    fn start(t: &Target, listen: &str, args: &[&str]) -> Server {
        let listen_args = if listen.is_empty() { vec![] } else { vec!["--listen", listen] };
        let (child, line, log, rx) = Server::spawn(t, &[&listen_args[..], args].concat());
        let socket = match listen {
            "" => line.strip_prefix("nbd+unix:///?socket=").map(PathBuf::from),
            _ => listen.strip_prefix("unix:").map(PathBuf::from),
        };
        let server = Server { child, listen: listen.to_owned(), socket, log };
        // Exactly one stdout line, the export's NBD URI (the rest is on stderr).
        assert_eq!(line, server.url(), "the one stdout line is the NBD URI");
        assert!(rx.recv_timeout(Duration::from_millis(500)).is_err(), "a second stdout line after {line:?}");
        server
    }

    /// Starts `rblk nbd URI --nbd-device DEV ARGS...` and waits for its one stdout line, the
    /// device it connected.
    fn device(t: &Target, dev: &str, args: &[&str]) -> (Server, String) {
        let (child, line, log, rx) = Server::spawn(t, &[&["--nbd-device", dev][..], args].concat());
        let server = Server { child, listen: String::new(), socket: None, log };
        assert!(rx.recv_timeout(Duration::from_millis(200)).is_err(), "a second stdout line after {line:?}");
        (server, line)
    }

    /// `rblk nbd URI ARGS...`, its stderr logged, and its first stdout line.
    fn spawn(t: &Target, args: &[&str]) -> (Child, String, Arc<Mutex<String>>, mpsc::Receiver<String>) {
        let mut child = Command::new(bin("rblk"))
            .args(["nbd", &uri(t)])
            .args(args)
            .env("RUST_LOG", std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn rblk nbd (is RBLK_BIN_DIR right?)");
        let log = Arc::new(Mutex::new(String::new()));
        let stderr = child.stderr.take().unwrap();
        let sink = Arc::clone(&log);
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                eprintln!("[rblk nbd] {line}");
                let mut log = sink.lock().unwrap();
                log.push_str(&line);
                log.push('\n');
            }
        });
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                eprintln!("[rblk nbd stdout] {line}");
                let _ = tx.send(line);
            }
        });
        let line = match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(line) => line,
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                // Give the stderr thread a moment to log why.
                std::thread::sleep(Duration::from_millis(200));
                panic!("rblk nbd {args:?} printed no line on stdout in 60 s:\n{}", log.lock().unwrap());
            }
        };
        (child, line, log, rx)
    }

    /// On a fresh unix socket.
    fn unix(t: &Target, args: &[&str]) -> Server {
        Server::start(t, &format!("unix:{}", scratch("sock").display()), args)
    }

    fn socket(&self) -> &Path {
        self.socket.as_deref().expect("a unix socket")
    }

    /// The NBD URI for qemu.
    fn url(&self) -> String {
        match &self.socket {
            Some(path) => format!("nbd+unix:///?socket={}", path.display()),
            None => format!("nbd://{}", self.listen.trim_start_matches("tcp:")),
        }
    }

    /// Waits (up to 30 s) until its log has a line containing `needle`.
    fn logged(&self, needle: &str) -> bool {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !self.log.lock().unwrap().contains(needle) {
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        true
    }

    /// SIGTERM; it must exit 0 and remove its socket.
    fn stop(mut self) {
        let status = self.terminate();
        assert!(status.success(), "rblk nbd exited with {status} after SIGTERM");
        if let Some(socket) = &self.socket {
            assert!(!socket.exists(), "rblk nbd left its socket {} behind", socket.display());
        }
    }

    fn terminate(&mut self) -> ExitStatus {
        let _ = Command::new("kill").arg("-TERM").arg(self.child.id().to_string()).status();
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        panic!("rblk nbd did not exit within 60 s of SIGTERM");
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Attaches the kernel's NBD client to `server` as /dev/nbd0 with `block_size`.
fn attach(server: &Server, block_size: u32) {
    // A test that failed earlier may have left nbd0 attached: one failure, not a cascade.
    if Path::new("/sys/block/nbd0/pid").exists() {
        eprintln!("{NBD} is still attached from an earlier test: detaching it");
        detach();
    }
    sh(&format!("nbd-client -unix {} {NBD} -block-size {block_size}", server.socket().display()));
    let size_file = "/sys/block/nbd0/size";
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::fs::read_to_string(size_file).unwrap_or_default().trim() == "0" {
        assert!(Instant::now() < deadline, "{NBD} has no size 30 s after nbd-client");
        std::thread::sleep(Duration::from_millis(100));
    }
    let lbs = std::fs::read_to_string("/sys/block/nbd0/queue/logical_block_size").unwrap_or_default();
    eprintln!("{NBD} attached: logical block size {}", lbs.trim());
}

fn detach() {
    sh(&format!("nbd-client -d {NBD}"));
    let deadline = Instant::now() + Duration::from_secs(30);
    while Path::new("/sys/block/nbd0/pid").exists() {
        assert!(Instant::now() < deadline, "{NBD} still connected 30 s after nbd-client -d");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Runs qemu-io on `url` with each of `cmds`; fails on any failed command or pattern mismatch.
fn qemu_io(url: &str, extra: &[&str], cmds: &[String]) -> String {
    let mut args: Vec<String> = vec!["-f".into(), "raw".into()];
    args.extend(extra.iter().map(|s| (*s).to_owned()));
    for c in cmds {
        args.push("-c".into());
        args.push(c.clone());
    }
    args.push(url.into());
    let out = Command::new("qemu-io").args(&args).stdin(Stdio::null()).output().expect("run qemu-io");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(
        out.status.success() && !text.contains("failed") && !text.contains("error"),
        "qemu-io {args:?} ({}):\n{text}",
        out.status
    );
    text
}

#[test]
#[ignore = "needs rxe: run in the guest by scripts/test.sh"]
fn qemu_io_writes_and_reads_patterns_at_many_offsets_and_sizes() {
    let t = target(64 * MIB);
    let server = Server::unix(&t, &[]);
    let url = server.url();
    let k = 1024u64;
    // (pattern, offset, length): aligned and not, small and large, up to the last byte.
    let writes: [(u8, u64, u64); 9] = [
        (0xab, 0, 64 * k),
        (0x11, MIB, MIB),
        (0x22, 3 * MIB, 8 * MIB),
        (0x33, 16 * MIB + 512, 4 * k),
        (0x44, 17 * MIB + 1, 3000),
        (0x55, 18 * MIB + 4095, 2),
        (0x66, 19 * MIB + 100, 300 * k + 7),
        (0x77, 64 * MIB - 8 * k, 4 * k),
        (0x88, 64 * MIB - 1, 1),
    ];
    let mut cmds: Vec<String> = writes.iter().map(|(p, o, l)| format!("write -P {p:#x} {o} {l}")).collect();
    cmds.extend(writes.iter().map(|(p, o, l)| format!("read -P {p:#x} {o} {l}")));
    // What the unaligned writes must not have touched around them.
    cmds.extend([
        format!("read -P 0 {} 512", 16 * MIB),
        format!("read -P 0 {} 1", 17 * MIB),
        format!("read -P 0 {} {}", 17 * MIB + 3001, 4 * k),
        format!("read -P 0 {} 4095", 18 * MIB),
        format!("read -P 0 {} 100", 19 * MIB),
        format!("read -P 0 {} {}", 64 * MIB - 4 * k, 4 * k - 1),
    ]);
    let out = qemu_io(&url, &[], &cmds);
    assert_eq!(out.matches("wrote ").count(), writes.len(), "{out}");
    // An overwrite inside an earlier pattern, then both around it, in a second qemu-io run.
    let cmds = [
        format!("write -P 0xcd {} 1000", MIB + 10),
        format!("read -P 0x11 {MIB} 10"),
        format!("read -P 0xcd {} 1000", MIB + 10),
        format!("read -P 0x11 {} {}", MIB + 1010, MIB - 1010),
        "write -z 0 64k".to_owned(),
        "read -P 0 0 64k".to_owned(),
        "flush".to_owned(),
    ];
    qemu_io(&url, &[], &cmds);
    server.stop();
}

#[test]
#[ignore = "needs rxe: run in the guest by scripts/test.sh"]
fn qemu_img_converts_and_compares_a_64m_image_and_rblk_read_agrees() {
    let t = target(64 * MIB);
    let server = Server::unix(&t, &[]);
    let url = server.url();
    let (img, back) = (scratch("img"), scratch("back"));
    let started = Instant::now();
    sh(&format!(
        "head -c 64M /dev/urandom > {img}
         qemu-img convert -n -f raw -O raw {img} '{url}'
         qemu-img compare -f raw -F raw {img} '{url}'",
        img = img.display()
    ));
    eprintln!("64 MiB converted and compared through NBD in {:?}", started.elapsed());
    // The same bytes, read straight from the volume with the rblk client.
    sh(&format!(
        "{rblk} read {uri} --offset 0 --length 64M --output {back}
         cmp {img} {back}",
        rblk = bin("rblk").display(),
        uri = uri(&t),
        img = img.display(),
        back = back.display()
    ));
    server.stop();
    let _ = std::fs::remove_file(img);
    let _ = std::fs::remove_file(back);
}

#[test]
#[ignore = "needs rxe: run in the guest by scripts/test.sh"]
fn kernel_client_keeps_ext4_files_across_a_detach_and_a_fresh_server_and_fstrim_trims() {
    let t = target(128 * MIB);
    let (mnt, sums) = (scratch("mnt"), scratch("sums"));
    std::fs::create_dir_all(&mnt).unwrap();
    let server = Server::unix(&t, &[]);
    attach(&server, 4096);
    sh(&format!(
        "mkfs.ext4 -q -F {NBD}
         mount {NBD} {mnt}
         for i in $(seq 1 24); do head -c $((i * 37 * 1024 + i)) /dev/urandom > {mnt}/f$i; done
         head -c 16M /dev/urandom > {mnt}/big
         mkdir {mnt}/dir && cp {mnt}/f3 {mnt}/dir/copy
         (cd {mnt} && sha256sum f* big dir/copy > {sums})
         sync
         umount {mnt}",
        mnt = mnt.display(),
        sums = sums.display()
    ));
    detach();
    server.stop();

    let server = Server::unix(&t, &[]);
    attach(&server, 4096);
    // Then TRIM (issue 41): fstrim with a 16 MiB file deleted trims, and the rest is intact.
    let trimmed = sh(&format!(
        "mount {NBD} {mnt}
         (cd {mnt} && sha256sum --quiet -c {sums})
         test $(ls {mnt}/f* | wc -l) = 24
         rm {mnt}/big; sync; fstrim -v {mnt}
         (cd {mnt} && grep -v ' big$' {sums} | sha256sum --quiet -c -)
         umount {mnt}
         fsck.ext4 -n -f {NBD}",
        mnt = mnt.display(),
        sums = sums.display()
    ));
    assert!(trimmed.contains("trimmed"), "fstrim over NBD trims: {trimmed}");
    detach();
    server.stop();
    let _ = std::fs::remove_dir(&mnt);
    let _ = std::fs::remove_file(&sums);
}

/// fio's summary lines (job, IOPS, latency).
fn fio(args: &str) -> String {
    sh(&format!("fio --filename={NBD} --direct=1 --ioengine=libaio --group_reporting {args}"))
}

#[test]
#[ignore = "needs rxe: run in the guest by scripts/test.sh"]
fn fio_verifies_through_the_kernel_client_and_randread_iops_are_measured() {
    let t = target(128 * MIB);
    let server = Server::unix(&t, &[]);
    attach(&server, 4096);
    // 8 MiB: 2048 verified 4 KiB writes, 8 deep, prove what 32 MiB did at a quarter of the
    // guest's time.
    fio("--name=verify --rw=randwrite --bs=4k --size=8M --iodepth=8 \
         --verify=crc32c --do_verify=1 --verify_fatal=1 --randrepeat=1");
    // Fill what the measurement reads, then 5 s of 4 KiB random reads, 32 deep.
    fio("--name=fill --rw=write --bs=1M --size=16M --iodepth=4");
    let out = fio("--name=randread --rw=randread --bs=4k --size=16M --iodepth=32 --runtime=5 --time_based");
    for line in out.lines().filter(|l| l.contains("IOPS=") || l.contains(" lat (") || l.contains("clat (")) {
        eprintln!("nbd 4k randread qd32: {}", line.trim());
    }
    detach();

    // 512-byte logical blocks: the kernel sends requests smaller than the volume's 4 KiB
    // blocks, which the server read-modify-writes. Mixed sizes, verified.
    attach(&server, 512);
    fio("--name=rmw --rw=randwrite --bsrange=512-64k --blockalign=512 --offset=64M --size=4M --iodepth=8 \
         --verify=crc32c --do_verify=1 --verify_fatal=1 --randrepeat=1");
    detach();
    server.stop();
}

#[test]
#[ignore = "needs rxe: run in the guest by scripts/test.sh"]
fn data_crosses_between_nbd_and_rblk_read_and_write() {
    let t = target(64 * MIB);
    let rblk = bin("rblk");
    let (a, b, back) = (scratch("a"), scratch("b"), scratch("back"));
    let server = Server::unix(&t, &[]);
    // NBD (qemu-io, then the kernel) writes; rblk read reads.
    qemu_io(&server.url(), &[], &[format!("write -P 0x5c {} {}", 4 * MIB, MIB)]);
    attach(&server, 4096);
    sh(&format!(
        "head -c 4M /dev/urandom > {a}
         dd if={a} of={NBD} bs=1M seek=8 oflag=direct status=none
         {rblk} read {uri} --offset 4M --length 1M | od -An -tx1 -v | tr -s ' \\n' '\\n\\n' | sort -u | grep -v '^$' > {back}
         test \"$(cat {back})\" = 5c
         {rblk} read {uri} --offset 8M --length 4M --output {back}
         cmp {a} {back}",
        a = a.display(),
        back = back.display(),
        rblk = rblk.display(),
        uri = uri(&t),
    ));
    // rblk write writes; NBD (the kernel with O_DIRECT, and qemu-io) reads.
    sh(&format!(
        "head -c 2M /dev/urandom > {b}
         {rblk} write {uri} --offset 20M --input {b}
         dd if={NBD} of={back} bs=1M skip=20 count=2 iflag=direct status=none
         cmp {b} {back}
         head -c 1M /dev/zero | tr '\\0' '\\347' > {a}
         {rblk} write {uri} --offset 30M --input {a}",
        a = a.display(),
        b = b.display(),
        back = back.display(),
        rblk = rblk.display(),
        uri = uri(&t),
    ));
    detach();
    qemu_io(&server.url(), &["-r"], &[format!("read -P 0xe7 {} {}", 30 * MIB, MIB)]);
    server.stop();
    for f in [a, b, back] {
        let _ = std::fs::remove_file(f);
    }
}

// ---- rblk nbd --nbd-device: the kernel's client through netlink, no nbd-client ----

/// `/sys/block/NAME/size`: 512-byte sectors, 0 while disconnected; None without the device.
fn sectors(dev: &str) -> Option<u64> {
    let name = dev.trim_start_matches("/dev/");
    std::fs::read_to_string(format!("/sys/block/{name}/size")).ok()?.trim().parse().ok()
}

/// Waits up to `secs` for `dev`'s size to be `want` sectors.
fn wait_sectors(dev: &str, want: u64, secs: u64) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while sectors(dev) != Some(want) {
        assert!(Instant::now() < deadline, "{dev} has {:?} sectors after {secs} s, not {want}", sectors(dev));
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Frees /dev/nbd0 if an earlier test left it connected: one failure, not a cascade.
fn free_nbd0() {
    if Path::new("/sys/block/nbd0/pid").exists() {
        eprintln!("{NBD} is still connected from an earlier test: disconnecting it");
        detach();
    }
}

/// `rblk nbd URI --nbd-device /dev/nbd0` connects the kernel's client itself (no nbd-client):
/// the device has the volume's size, what dd writes with O_DIRECT reads back through the device
/// and through another session (`rblk read`); the volume grown by a reload of the target grows
/// the device at once (NBD_CMD_RECONFIGURE: `blockdev --getsize64`), and a write past the old end
/// reads back both ways; a second server for the same device is refused naming who holds it;
/// SIGTERM disconnects it (size 0) with exit 0. Catches a connect whose attributes the driver
/// refuses or reads wrongly (size, block size, the socket), a grow that stops at the initiator or
/// is refused by the driver, a device resized before the request checks allow its new range, a
/// device left connected at exit, and the busy device's words.
#[test]
#[ignore = "needs rxe: run in the guest by scripts/test.sh"]
fn nbd_device_connects_through_netlink_grows_and_sigterm_disconnects_it() {
    let volume = |size: &str| format!("[[volume]]\nname = \"v\"\nsize = \"{size}\"\n");
    let t = Target::start_with_config(Fabric::Verbs, &volume("32M"));
    free_nbd0();
    let started = Instant::now();
    let (mut server, line) = Server::device(&t, NBD, &[]);
    assert_eq!(line, NBD, "the one stdout line is the device");
    wait_sectors(NBD, 32 * MIB / 512, 5);
    assert_eq!(sh(&format!("blockdev --getsize64 {NBD}")).trim(), (32 * MIB).to_string());
    eprintln!("{NBD} connected {} ms after the start", started.elapsed().as_millis());

    let (a, back) = (scratch("a"), scratch("back"));
    let write_and_read = |at_mib: u64| {
        sh(&format!(
            "head -c 1M /dev/urandom > {a}
             dd if={a} of={NBD} bs=256K seek={seek} oflag=direct status=none
             dd if={NBD} of={back} bs=256K skip={seek} count=4 iflag=direct status=none
             cmp {a} {back}
             {rblk} read {uri} --offset {at_mib}M --length 1M --output {back}
             cmp {a} {back}",
            a = a.display(),
            back = back.display(),
            seek = at_mib * 4,
            rblk = bin("rblk").display(),
            uri = uri(&t),
        ))
    };
    write_and_read(8);

    let asked = Instant::now();
    t.reload(&volume("96M")).expect("the reload grows v");
    wait_sectors(NBD, 96 * MIB / 512, 10);
    eprintln!("{NBD} grew {} ms after the reload was asked for", asked.elapsed().as_millis());
    assert_eq!(sh(&format!("blockdev --getsize64 {NBD}")).trim(), (96 * MIB).to_string());
    assert!(server.logged(&format!("{NBD} grew to 96 MiB")), "no 'grew' line");
    write_and_read(32);

    // The device is taken: the second server says by whom, and changes nothing.
    let out = Command::new(bin("rblk"))
        .args(["nbd", &uri(&t), "--nbd-device", NBD])
        .stdin(Stdio::null())
        .output()
        .expect("run rblk nbd");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "a second rblk nbd on {NBD}: {err}");
    let words = format!("{NBD} is in use (connected by pid {})", server.child.id());
    assert!(err.contains(&words), "wanted {words:?} in:\n{err}");
    assert!(out.stdout.is_empty(), "nothing on stdout when refused");
    assert_eq!(sectors(NBD), Some(96 * MIB / 512), "the refused server left {NBD} alone");

    let status = server.terminate();
    assert!(status.success(), "rblk nbd --nbd-device exited with {status} after SIGTERM");
    wait_sectors(NBD, 0, 5);
    assert!(!Path::new("/sys/block/nbd0/pid").exists(), "{NBD} still connected after rblk nbd exited");
    assert!(server.logged(&format!("{NBD} disconnected")), "no 'disconnected' line");
    for f in [a, back] {
        let _ = std::fs::remove_file(f);
    }
}

/// `rblk nbd --nbd-device auto -o json` (the device the driver picked, in one JSON line) killed
/// (SIGKILL) while dd writes: the device stays connected
/// (the driver keeps its socket, dead: new I/O fails with EIO, I/O in flight waits, as the
/// driver has no request timeout here), the next server for that device is told it is still
/// connected for a process that has exited and how to free it, and `nbd-client -d` frees it:
/// dd then fails instead of hanging, and the size is 0. Catches a busy error that does not say
/// what to do, or a device that cannot be freed.
#[test]
#[ignore = "needs rxe: run in the guest by scripts/test.sh"]
fn a_killed_nbd_device_server_leaves_a_device_the_next_one_says_how_to_free() {
    let t = target(16 * MIB);
    free_nbd0();
    let (mut server, line) = Server::device(&t, "auto", &["-o", "json"]);
    let json: serde_json::Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{line:?}: {e}"));
    let dev = json["device"].as_str().unwrap_or_else(|| panic!("no device in {line}")).to_owned();
    assert!(dev.starts_with("/dev/nbd"), "auto gave {dev:?}");
    assert_eq!(json["size"], 16 * MIB, "{line}");
    assert_eq!(json["block_size"], 4096, "{line}");
    assert_eq!(json["pid"], server.child.id(), "{line}");
    assert_eq!(json["uri"], uri(&t), "{line}");
    wait_sectors(&dev, 16 * MIB / 512, 5);
    let mut dd = Command::new("bash")
        .args([
            "-c",
            &format!("for i in $(seq 1000); do dd if=/dev/zero of={dev} bs=1M count=16 oflag=direct status=none || exit 1; done"),
        ])
        .stdin(Stdio::null())
        .spawn()
        .expect("run dd");
    std::thread::sleep(Duration::from_millis(300));
    let pid = server.child.id();
    server.child.kill().expect("SIGKILL rblk nbd");
    server.child.wait().expect("reap rblk nbd");

    let out = Command::new(bin("rblk"))
        .args(["nbd", &uri(&t), "--nbd-device", &dev])
        .stdin(Stdio::null())
        .output()
        .expect("run rblk nbd");
    let err = String::from_utf8_lossy(&out.stderr);
    let words =
        format!("{dev} is in use (connected by pid {pid}, which has exited; `nbd-client -d {dev}` disconnects it)");
    assert!(!out.status.success() && err.contains(&words), "wanted {words:?} in:\n{err}");

    sh(&format!("nbd-client -d {dev}"));
    wait_sectors(&dev, 0, 10);
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = dd.try_wait().unwrap() {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = dd.kill();
            panic!("dd on {dev} still runs 10 s after nbd-client -d");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(!status.success(), "dd kept writing to {dev} with its server killed");
}

// ---- a raw NBD client ----

trait Stream: Read + Write {}
impl<T: Read + Write> Stream for T {}

struct Raw {
    s: Box<dyn Stream>,
    size: u64,
    flags: u16,
}

fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes(b[..4].try_into().unwrap())
}

impl Raw {
    /// Greeting, flags and NBD_OPT_GO for the default export; the option error (reply type
    /// and message) if refused.
    fn connect(mut s: Box<dyn Stream>) -> Result<Raw, (u32, String)> {
        let mut greeting = [0u8; 18];
        s.read_exact(&mut greeting).unwrap();
        assert_eq!(&greeting[..16], b"NBDMAGICIHAVEOPT");
        s.write_all(&3u32.to_be_bytes()).unwrap();
        let mut go = 0x4948_4156_454f_5054u64.to_be_bytes().to_vec();
        go.extend(7u32.to_be_bytes());
        go.extend(8u32.to_be_bytes());
        go.extend([0, 0, 0, 0, 0, 1, 0, 3]); // no name, one info request: block size
        s.write_all(&go).unwrap();
        let (mut size, mut flags) = (0, 0);
        loop {
            let mut hdr = [0u8; 20];
            s.read_exact(&mut hdr).unwrap();
            let mut data = vec![0; be32(&hdr[16..]) as usize];
            s.read_exact(&mut data).unwrap();
            match be32(&hdr[12..]) {
                1 => return Ok(Raw { s, size, flags }),
                3 if data[..2] == [0, 0] => {
                    size = u64::from_be_bytes(data[2..10].try_into().unwrap());
                    flags = u16::from_be_bytes([data[10], data[11]]);
                }
                3 => {}
                err => return Err((err, String::from_utf8_lossy(&data).into_owned())),
            }
        }
    }

    fn unix(path: &Path) -> Result<Raw, (u32, String)> {
        Raw::connect(Box::new(UnixStream::connect(path).expect("connect to rblk nbd")))
    }

    /// Sends a request; returns the reply's error and, for successful reads, the data.
    fn call(&mut self, kind: u16, offset: u64, len: u32, data: &[u8]) -> (u32, Vec<u8>) {
        let mut req = 0x2560_9513u32.to_be_bytes().to_vec();
        req.extend(0u16.to_be_bytes());
        req.extend(kind.to_be_bytes());
        req.extend(42u64.to_be_bytes());
        req.extend(offset.to_be_bytes());
        req.extend(len.to_be_bytes());
        req.extend(data);
        self.s.write_all(&req).unwrap();
        let mut reply = [0u8; 16];
        self.s.read_exact(&mut reply).unwrap();
        assert_eq!(be32(&reply), 0x6744_6698);
        assert_eq!(u64::from_be_bytes(reply[8..].try_into().unwrap()), 42);
        let err = be32(&reply[4..]);
        let mut back = Vec::new();
        if kind == 0 && err == 0 {
            back = vec![0; len as usize];
            self.s.read_exact(&mut back).unwrap();
        }
        (err, back)
    }

    fn disconnect(mut self) {
        let mut req = 0x2560_9513u32.to_be_bytes().to_vec();
        req.extend([0, 0, 0, 2]);
        req.extend([0; 20]);
        self.s.write_all(&req).unwrap();
        let mut rest = Vec::new();
        let _ = self.s.read_to_end(&mut rest);
        assert!(rest.is_empty(), "nothing after NBD_CMD_DISC");
    }
}

#[test]
#[ignore = "needs rxe: run in the guest by scripts/test.sh"]
fn bad_requests_get_error_replies_and_the_server_keeps_serving() {
    let t = target(16 * MIB);
    let server = Server::unix(&t, &[]);
    let mut c = Raw::unix(server.socket()).expect("GO");
    assert_eq!(c.size, 16 * MIB);
    let (trim, fast_zero) = (1 << 5, 1 << 11);
    assert_eq!(
        c.flags & (0x4f | trim | fast_zero),
        0x4d | trim | fast_zero,
        "HAS_FLAGS, FLUSH, FUA, TRIM, WRITE_ZEROES, FAST_ZERO; not read-only: {:#x}",
        c.flags
    );
    assert_eq!(c.call(1, 0, 8192, &[7; 8192]).0, 0);
    assert_eq!(c.call(0, 16 * MIB, 4096, &[]).0, 22, "read past the end: EINVAL");
    assert_eq!(c.call(0, 16 * MIB - 4096, 8192, &[]).0, 22, "read across the end: EINVAL");
    assert_eq!(c.call(0, u64::MAX - 4095, 4096, &[]).0, 22, "read whose end overflows: EINVAL");
    assert_eq!(c.call(1, 16 * MIB - 512, 1024, &[9; 1024]).0, 28, "write across the end: ENOSPC");
    assert_eq!(c.call(4, 16 * MIB, 4096, &[]).0, 28, "TRIM past the end: ENOSPC");
    assert_eq!(c.call(1, 12288, 4096, &[5; 4096]).0, 0);
    assert_eq!(c.call(4, 12288, 4096, &[]).0, 0, "TRIM");
    assert_eq!(c.call(0, 12288, 4096, &[]).1, vec![0; 4096], "a trimmed block reads zeros");
    assert_eq!(c.call(0x77, 0, 0, &[]).0, 22, "unknown command: EINVAL");
    // Still serving: an unaligned write read-modify-writes inside the first block.
    assert_eq!(c.call(1, 1000, 100, &[1; 100]).0, 0);
    let (err, data) = c.call(0, 0, 8192, &[]);
    assert_eq!(err, 0);
    let mut want = vec![7u8; 8192];
    want[1000..1100].fill(1);
    assert!(data == want, "the unaligned write changed exactly its 100 bytes");
    assert_eq!(c.call(3, 0, 0, &[]).0, 0, "FLUSH");
    c.disconnect();
    // A bad magic ends that connection only.
    let mut c = Raw::unix(server.socket()).expect("GO");
    c.s.write_all(&[0xde; 28]).unwrap();
    let mut rest = Vec::new();
    let _ = c.s.read_to_end(&mut rest);
    assert!(rest.is_empty());
    let mut c = Raw::unix(server.socket()).expect("GO after a bad client");
    assert_eq!(c.call(0, 1000, 100, &[]).1, vec![1; 100]);
    c.disconnect();
    assert!(server.logged("protocol violation"), "the bad magic is logged");
    server.stop();
}

#[test]
#[ignore = "needs rxe: run in the guest by scripts/test.sh"]
fn a_second_client_is_refused_unless_shared() {
    let t = target(16 * MIB);
    let server = Server::unix(&t, &[]);
    let mut first = Raw::unix(server.socket()).expect("the first client");
    let refused = Raw::unix(server.socket()).err().expect("a second client is refused");
    assert_eq!(refused.0, 0x8000_0002, "NBD_REP_ERR_POLICY: {refused:?}");
    assert!(refused.1.contains("--shared"), "{refused:?}");
    assert!(server.logged("refusing a second NBD client"), "an error line says so");
    assert_eq!(first.call(1, 0, 4096, &[3; 4096]).0, 0, "the first client carries on");
    first.disconnect();
    // The slot is free again once the first client has gone.
    let deadline = Instant::now() + Duration::from_secs(30);
    let again = loop {
        match Raw::unix(server.socket()) {
            Ok(c) => break c,
            Err(e) if Instant::now() < deadline => {
                eprintln!("still busy: {e:?}");
                std::thread::sleep(Duration::from_millis(200));
            }
            Err(e) => panic!("the export stays busy after its client left: {e:?}"),
        }
    };
    again.disconnect();
    server.stop();

    // --shared: two clients at once, each its own session; multi-conn is advertised.
    let server = Server::unix(&t, &["--shared"]);
    let (mut a, mut b) = (Raw::unix(server.socket()).unwrap(), Raw::unix(server.socket()).unwrap());
    assert_ne!(a.flags & (1 << 8), 0, "CAN_MULTI_CONN with --shared");
    assert_eq!(a.call(1, 8192, 4096, &[5; 4096]).0, 0);
    assert_eq!(a.call(3, 0, 0, &[]).0, 0);
    assert_eq!(b.call(0, 8192, 4096, &[]).1, vec![5; 4096]);
    a.disconnect();
    b.disconnect();
    server.stop();
}

/// Would catch a default that listens where other users reach it (it was TCP on 127.0.0.1), a
/// socket that takes the umask's mode, and a stdout line other than the NBD URI.
#[test]
#[ignore = "needs rxe: run in the guest by scripts/test.sh"]
fn the_default_listen_is_a_private_unix_socket() {
    use std::os::unix::fs::PermissionsExt as _;
    let t = target(16 * MIB);
    let server = Server::start(&t, "", &[]);
    let sock = server.socket().to_owned();
    assert_eq!(sock, Path::new("/run/rblk/nbd/v.sock"), "root's default socket");
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!((mode(&sock), mode(sock.parent().unwrap())), (0o600, 0o700));
    qemu_io(&server.url(), &[], &["write -P 0x5a 0 4096".into(), "read -P 0x5a 0 4096".into()]);
    server.stop();
    assert!(!sock.exists(), "the socket is removed at exit");
}

#[test]
#[ignore = "needs rxe: run in the guest by scripts/test.sh"]
fn a_read_only_export_over_tcp() {
    let t = target(16 * MIB);
    sh(&format!("head -c 1M /dev/zero | tr '\\0' '\\021' | {} write {} --offset 1M", bin("rblk").display(), uri(&t)));
    let port = 20000 + (std::process::id() % 20000) as u16;
    let server = Server::start(&t, &format!("tcp:127.0.0.1:{port}"), &["--read-only"]);
    assert!(server.logged("every user of this host can read and write"), "loopback TCP is warned about");
    qemu_io(&server.url(), &["-r"], &[format!("read -P 0x11 {MIB} {MIB}")]);
    let s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let mut c = Raw::connect(Box::new(s)).expect("GO");
    assert_ne!(c.flags & 2, 0, "READ_ONLY flag");
    assert_eq!(c.call(1, 0, 4096, &[1; 4096]).0, 1, "a write is EPERM");
    assert_eq!(c.call(0, MIB, 4096, &[]).1, vec![0x11; 4096]);
    c.disconnect();
    server.stop();
}
