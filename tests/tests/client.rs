//! The `rblk` client binary over rxe, as a user runs it: device listing, JSON output, and a large
//! write from a pipe in bounded memory.
//!
//! What each would catch:
//! - `devices_name_the_rxe_port_its_link_and_gid_types`: `rblk devices` without the link
//!   layer, MTU, GID types or netdev a RoCE user needs, or JSON that does not parse.
//! - `info_and_stats_speak_json`: `--json` / `-o json` outputs that are not JSON or miss
//!   fields, and `rblk stats` not reporting the target's counters.
//! - `a_128_mib_pipe_is_written_in_bounded_memory`: `rblk write` reading its whole input
//!   before writing (512 MiB of stdin once took 529 MB of RSS), or a streamed write whose data
//!   does not land where it should.
//! - `a_pipe_that_keeps_rblk_waiting_20_s_loses_no_session`: `rblk read` blocked writing to a
//!   pipe drained slowly, or `rblk write` blocked reading one nobody writes, for longer than the
//!   target's 15 s keepalive timeout: without keepalives on every queue pair at least once a
//!   second while it waits (`stdio::Patient`), the target ends the session and the command
//!   fails (`rblk read | od` under TCG did, in the NBD tests).

use std::io::Write as _;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rblk_tests::blockdev::{rblk, rblk_json};
use rblk_tests::daemon::Daemon;

#[test]
#[ignore = "needs rxe: run in the guest by scripts/test.sh"]
fn devices_name_the_rxe_port_its_link_and_gid_types() {
    let rdma = rblk_tests::rxe::rdma();
    let out = Command::new(rblk()).arg("devices").output().expect("run rblk devices");
    let text = String::from_utf8_lossy(&out.stdout);
    eprintln!("{text}");
    assert!(out.status.success());
    let line = text.lines().find(|l| l.starts_with(&rdma.device)).expect("a line for the rxe device");
    assert!(line.contains("Ethernet") && line.contains("RoCE v2"), "{line}");
    assert!(line.contains(&rdma.addr.to_string()), "{line}");
    let all = rblk_json(&["devices", "--json"]);
    let dev = all.as_array().unwrap().iter().find(|d| d["name"] == rdma.device.as_str()).expect("the device");
    let port = &dev["ports"][0];
    assert_eq!(port["link_layer"], "Ethernet");
    assert!(port["active_mtu"].as_u64().is_some_and(|m| (256..=4096).contains(&m)), "{port}");
    assert!(port["netdevs"].as_array().is_some_and(|n| !n.is_empty()), "{port}");
}

#[test]
#[ignore = "needs rxe: run in the guest by scripts/test.sh"]
fn info_and_stats_speak_json() {
    let d = Daemon::start(&rblk_tests::rxe::rdma(), &["--volume", "v:8M"]);
    let uri = format!("rblk://{}/v", d.addr);
    let info = rblk_json(&["info", &uri, "--json"]);
    assert_eq!((info["size"].as_u64(), info["block_size"].as_u64()), (Some(8 << 20), Some(4096)));
    assert_eq!(info["volatile"], true);
    let stats = rblk_json(&["stats", &uri, "-o", "json"]);
    assert_eq!(stats["sessions"], 1, "the query's own session: {stats}");
    assert_eq!(stats["pinned_bytes"], 8 << 20);
    assert!(stats["cpu_user_us"].as_u64().is_some());
}

#[test]
#[ignore = "needs rxe: run in the guest by scripts/test.sh"]
fn a_128_mib_pipe_is_written_in_bounded_memory() {
    // 128 MiB, not the 512 of the finding, to keep CI's guest time down (512 MiB took 124 s
    // here, debug build under TCG, with a peak RSS of 22 MiB): buffering it whole would still
    // take twice the bound.
    const LEN: u64 = 128 << 20;
    let d = Daemon::start(&rblk_tests::rxe::rdma(), &["--volume", "v:132M"]);
    let uri = format!("rblk://{}/v", d.addr);
    let byte = |i: u64| (i.wrapping_mul(0x9e37_79b9) >> 13) as u8;
    let mut child = Command::new(rblk())
        .args(["write", &uri, "--offset", "4096"])
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run rblk write");
    let pid = child.id();
    let mut stdin = child.stdin.take().unwrap();
    let feeder = std::thread::spawn(move || {
        let mut chunk = vec![0u8; 1 << 20];
        for mb in 0..LEN >> 20 {
            for (k, b) in chunk.iter_mut().enumerate() {
                *b = byte((mb << 20) + k as u64);
            }
            stdin.write_all(&chunk).expect("feed rblk write");
        }
    });
    // VmHWM is the process's peak RSS so far: the last reading before it exits bounds it.
    let (mut peak_kb, start) = (0u64, Instant::now());
    while child.try_wait().unwrap().is_none() {
        if let Ok(s) = std::fs::read_to_string(format!("/proc/{pid}/status")) {
            let hwm = s
                .lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok());
            peak_kb = peak_kb.max(hwm.unwrap_or(0));
        }
        assert!(start.elapsed() < Duration::from_secs(300), "rblk write of 128 MiB took over 5 minutes");
        std::thread::sleep(Duration::from_millis(20));
    }
    feeder.join().unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains(&format!("wrote {LEN} bytes at offset 4096")), "{stderr}");
    eprintln!("client: 128 MiB from a pipe in {:?}, peak RSS {} MiB", start.elapsed(), peak_kb >> 10);
    assert!(peak_kb > 0 && peak_kb < 64 << 10, "peak RSS {peak_kb} kB: not bounded");
    // The last MiB landed where it belongs.
    let back = Command::new(rblk())
        .args(["read", &uri, "--offset", &(4096 + LEN - (1 << 20)).to_string(), "--length", "1M"])
        .output()
        .unwrap();
    assert!(back.status.success());
    let want: Vec<u8> = (LEN - (1 << 20)..LEN).map(byte).collect();
    assert!(back.stdout == want, "the last MiB read back differs");
}

#[test]
#[ignore = "needs rxe: run in the guest by scripts/test.sh"]
fn a_pipe_that_keeps_rblk_waiting_20_s_loses_no_session() {
    let d = Daemon::start(&rblk_tests::rxe::rdma(), &["--volume", "v:8M"]);
    let uri = format!("rblk://{}/v", d.addr);
    // Both at once: a write whose input pauses 20 s after its first MiB (no byte to read for
    // 20 s), and a read of 2 MiB into a pipe drained 64 KiB every 0.7 s (a pipe holds 64 KiB:
    // rblk read waits on it for 22 s, never a whole second at a time). Then both landed.
    let dir = std::env::temp_dir().join(format!("rblk-patient-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let script = format!(
        "set -euo pipefail
         head -c 2M /dev/urandom > {d}/pattern
         {rblk} write {uri} --offset 0 --input {d}/pattern
         {{ head -c 1M {d}/other; sleep 20; tail -c 1M {d}/other; }} | {rblk} write {uri} --offset 4M &
         writer=$!
         {rblk} read {uri} --length 2M | for i in $(seq 32); do dd bs=64k count=1 iflag=fullblock status=none; sleep 0.7; done > {d}/back
         cmp {d}/pattern {d}/back
         wait $writer
         {rblk} read {uri} --offset 4M --length 2M --output {d}/back
         cmp {d}/other {d}/back",
        d = dir.display(),
        rblk = rblk(),
    );
    std::fs::write(
        dir.join("other"),
        (0..2u32 << 20).map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8).collect::<Vec<u8>>(),
    )
    .unwrap();
    let started = Instant::now();
    let out = Command::new("bash").arg("-c").arg(&script).output().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        out.status.success(),
        "a pipe that kept rblk waiting {:?}: {}",
        started.elapsed(),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(started.elapsed() >= Duration::from_secs(20), "the pipes did not make rblk wait");
}
