//! The initiator library against rblk-target: concurrent initiators, checks before posting,
//! a client killed mid-write, and the target's CPU during pure data I/O. Scenarios that do not
//! need separate processes run on both fabrics (`mem::*` on the host, `rxe::*` in the guest).

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rblk_fabric::Fabric;
use rblk_initiator::{Error, OpenMode, Options, Session, Volume};
use rblk_tests::daemon::bin;
use rblk_tests::target::{Spec, Target};
use rblk_tests::workload::{self, Region};

const MIB: u64 = 1 << 20;

fn uri(t: &Target, volume: &str) -> String {
    format!("rblk://{}/{volume}", t.addr())
}

fn options(t: &Target) -> Options {
    Options { fabric: t.fabric(), ..Options::default() }
}

fn open(t: &Target, volume: &str, mode: OpenMode) -> Volume {
    Session::connect(&uri(t, volume), &options(t)).expect("connect").open(mode).expect("open")
}

fn barrier_dir(tag: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("rblk-barrier-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

const A: Region = Region { offset: 0, len: 8 * MIB, seed: 0xA11CE };
const B: Region = Region { offset: 8 * MIB, len: 8 * MIB, seed: 0xB0B };

rblk_tests::on_both_fabrics!(
    bad_requests_are_refused_before_anything_is_posted,
    two_writers_with_four_queues_each_verify_both_regions
);

fn bad_requests_are_refused_before_anything_is_posted(fabric: Fabric) {
    let t = Target::start(fabric, &Spec { volumes: vec![("v", 4 * MIB)], key: None });
    match Session::connect(&uri(&t, "nope"), &options(&t)).and_then(|s| s.open(OpenMode::ReadOnly)) {
        Err(e) => assert!(e.to_string().contains("nope"), "unknown volume: {e}"),
        Ok(_) => panic!("opened a volume that does not exist"),
    }
    let mut vol = open(&t, "v", OpenMode::ReadWrite);
    let mut buf = vec![0u8; 8192];
    let cases: [(&str, u64, usize); 5] = [
        ("past the end", 4 * MIB, 4096),
        ("straddling the end", 4 * MIB - 4096, 8192),
        ("zero length", 0, 0),
        ("misaligned offset", 512, 4096),
        ("misaligned length", 0, 1000),
    ];
    for (what, offset, len) in cases {
        let r = vol.read_at(&mut buf[..len], offset);
        assert!(matches!(r, Err(Error::Invalid { .. })), "read {what}: {r:?}");
        let w = vol.write_at(&buf[..len], offset);
        assert!(matches!(w, Err(Error::Invalid { .. })), "write {what}: {w:?}");
    }
    let mut q = vol.queue(4).unwrap();
    assert!(matches!(q.submit_read(u64::MAX - 4095, 4096, 1), Err(Error::Invalid { .. })));
    assert!(matches!(q.submit_write(4 * MIB, &buf[..4096], 2), Err(Error::Invalid { .. })));
    // Nothing reached the NIC: the connection still works (one bad access would have killed it).
    vol.write_at(&[0x5a; 8192], 4 * MIB - 8192).unwrap();
    let mut back = vec![0u8; 8192];
    vol.read_at(&mut back, 4 * MIB - 8192).unwrap();
    assert!(back.iter().all(|&b| b == 0x5a));
    q.submit_read(0, 4096, 3).unwrap();
    let mut done = [rblk_initiator::Done::default()];
    assert_eq!(q.wait(&mut done, Instant::now() + Duration::from_secs(30)).unwrap(), 1);
    assert!(done[0].is_ok());

    let mut ro = open(&t, "v", OpenMode::ReadOnly);
    let w = ro.write_at(&[0; 4096], 0);
    assert!(matches!(w, Err(Error::Invalid { .. })), "write on a read-only open: {w:?}");
    ro.read_at(&mut back[..4096], 0).unwrap();
}

fn two_writers_with_four_queues_each_verify_both_regions(fabric: Fabric) {
    let t = Target::start(fabric, &Spec { volumes: vec![("v", 16 * MIB)], key: None });
    let barrier = barrier_dir(&format!("{fabric:?}"));
    match fabric {
        Fabric::Mem => {
            // One process here: two threads stand in for the two initiator processes.
            let (va, vb) = (open(&t, "v", OpenMode::ReadWrite), open(&t, "v", OpenMode::ReadWrite));
            std::thread::scope(|s| {
                let a = s.spawn(|| workload::pair(&va, A, B, &barrier));
                let b = s.spawn(|| workload::pair(&vb, B, A, &barrier));
                a.join().unwrap().expect("writer A");
                b.join().unwrap().expect("writer B");
            });
        }
        Fabric::Verbs => {
            let spawn = |mine: Region, other: Region| {
                Command::new(bin("rblk-test-client"))
                    .args(["pair", &uri(&t, "v"), "--mine", &mine.to_string(), "--other", &other.to_string()])
                    .arg("--barrier")
                    .arg(&barrier)
                    .stdin(Stdio::null())
                    .spawn()
                    .expect("spawn rblk-test-client")
            };
            let (mut a, mut b) = (spawn(A, B), spawn(B, A));
            assert!(a.wait().unwrap().success(), "initiator process A failed");
            assert!(b.wait().unwrap().success(), "initiator process B failed");
        }
    }
    let _ = std::fs::remove_dir_all(barrier);
}

#[test]
#[ignore = "needs rxe: run in the guest by scripts/test.sh"]
fn a_writer_killed_mid_write_harms_no_one_and_its_registration_goes() {
    let t = Target::start(Fabric::Verbs, &Spec { volumes: vec![("v", 16 * MIB)], key: None });
    let mut mine = open(&t, "v", OpenMode::ReadWrite);
    let base = mine.stats().unwrap();
    let pin_base = t.vm_pin_kb().expect("a daemon process has VmPin");
    let mut victim = Command::new(bin("rblk-test-client"))
        .args(["hammer", &uri(&t, "v"), "--region", &B.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn rblk-test-client");
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(victim.stdout.take().unwrap()), &mut line).unwrap();
    assert_eq!(line.trim(), "hammering");
    // With memory windows (rxe has them) the victim's session gets windows over the volume's one
    // registration, not a registration of its own.
    let during = mine.stats().unwrap();
    assert_eq!((during.registrations, during.pinned_bytes), (base.registrations, base.pinned_bytes));
    assert!(during.windows > base.windows, "the victim's QPs have windows: {during:?} vs {base:?}");

    let verified_io = |vol: &Volume, seed: u64| {
        let r = Region { seed, ..A };
        workload::run(workload::queues(vol, 2, 16), r, false).expect("write while the other writer runs");
        workload::run(workload::queues(vol, 2, 16), r, true).expect("verify while the other writer runs");
    };
    verified_io(&mine, 1);
    Command::new("kill").args(["-KILL", &victim.id().to_string()]).status().unwrap();
    let status = victim.wait().unwrap();
    assert!(!status.success());
    for seed in 2..5 {
        verified_io(&mine, seed);
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let s = mine.stats().unwrap();
        // VmPin also counts each live connection's control buffers: it returns to the baseline
        // once the killed client's connections and our finished queues are all torn down.
        let pin = t.vm_pin_kb().unwrap();
        if (s.registrations, s.pinned_bytes, s.windows) == (base.registrations, base.pinned_bytes, base.windows)
            && pin == pin_base
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the killed client's windows linger: {s:?} vs {base:?}; VmPin {pin} kB vs {pin_base} kB"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
#[ignore = "needs rxe: run in the guest by scripts/test.sh"]
fn the_target_cpu_stays_idle_during_pure_data_io() {
    let t = Target::start(Fabric::Verbs, &Spec { volumes: vec![("v", 64 * MIB)], key: None });
    let mut vol = open(&t, "v", OpenMode::ReadWrite);
    let mut q = vol.queue_with(16, 4096).unwrap();
    let before = vol.stats().unwrap();
    let started = Instant::now();
    let mut done: Vec<rblk_initiator::Done> = std::iter::repeat_with(Default::default).take(16).collect();
    let (mut ios, mut outstanding, mut x) = (0u64, 0u32, 0x2545_F491_4F6C_DD1Du64);
    let data = [0xa5u8; 4096];
    while started.elapsed() < Duration::from_secs(5) || outstanding > 0 {
        while outstanding < 16 && started.elapsed() < Duration::from_secs(5) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let offset = (x % (64 * MIB / 4096)) * 4096;
            if x & 1 == 0 {
                q.submit_read(offset, 4096, offset).unwrap();
            } else {
                q.submit_write(offset, &data, offset).unwrap();
            }
            outstanding += 1;
        }
        let n = q.wait(&mut done, Instant::now() + Duration::from_secs(30)).unwrap();
        for d in &mut done[..n] {
            d.result.as_ref().unwrap();
            d.release();
        }
        outstanding -= n as u32;
        ios += n as u64;
    }
    let wall = started.elapsed();
    let after = vol.stats().unwrap();
    let cpu_us = (after.cpu_user_us + after.cpu_system_us) - (before.cpu_user_us + before.cpu_system_us);
    let share = cpu_us as f64 / wall.as_micros() as f64;
    eprintln!(
        "{ios} I/Os in {wall:?} ({:.0} IOPS); target CPU {cpu_us} us = {:.3}% of one core",
        ios as f64 / wall.as_secs_f64(),
        share * 100.0
    );
    assert!(ios > 1000, "too little I/O to judge: {ios}");
    assert!(share < 0.05, "target used {:.2}% of a core during pure data I/O", share * 100.0);
}
