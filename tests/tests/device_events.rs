//! The RDMA devices' asynchronous events, read by rblk-target over rxe (issue 40 item 1): a
//! test executable of its own, because it takes a link down (of a veth pair it makes, under an
//! rxe device of its own, not the rxe0 the other tests use), and the guest runs executables one
//! at a time.
//!
//! What it would catch: a daemon that reads no asynchronous events (none were read before:
//! a port that went down or a QP the device failed went unnoticed until keepalives or failed
//! completions told), or reads only those of the devices its connections use.
//! `target_reconnect.rs` covers, on the host, what the daemon does with a QP's error.

use std::process::Command;
use std::time::Duration;

use rblk_tests::daemon::Daemon;

/// A veth pair whose first end carries an rxe device, removed when dropped.
struct Flappable {
    netdev: &'static str,
    device: &'static str,
}

fn run(cmd: &str, args: &[&str]) {
    let out = Command::new(cmd).args(args).output().unwrap_or_else(|e| panic!("{cmd}: {e}"));
    assert!(out.status.success(), "{cmd} {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

impl Flappable {
    fn new() -> Flappable {
        let f = Flappable { netdev: "rblkev0", device: "rxe_ev" };
        f.cleanup();
        run("ip", &["link", "add", f.netdev, "type", "veth", "peer", "name", "rblkev1"]);
        run("ip", &["link", "set", "rblkev1", "up"]);
        run("ip", &["link", "set", f.netdev, "up"]);
        run("rdma", &["link", "add", f.device, "type", "rxe", "netdev", f.netdev]);
        f
    }

    fn set(&self, up: bool) {
        run("ip", &["link", "set", self.netdev, if up { "up" } else { "down" }]);
    }

    /// Removes the device and the veth pair. The removal waits until no process holds the
    /// device open: with a daemon left behind by a failed assertion it could wait for ever, so
    /// it runs with a limit.
    fn cleanup(&self) {
        let _ = Command::new("timeout").args(["10", "rdma", "link", "delete", self.device]).output();
        let _ = Command::new("ip").args(["link", "del", self.netdev]).output();
    }
}

impl Drop for Flappable {
    fn drop(&mut self) {
        self.cleanup();
    }
}

#[test]
#[ignore = "needs rxe: run in the guest by scripts/test.sh"]
fn rxe_a_port_going_down_and_up_is_logged() {
    // Listed before the test's device exists: listing opens every device's context in this
    // process, for good, and rxe's device removal waits for every context to close (rxe cannot
    // disassociate one), so this process must never open the test's device.
    let rdma = rblk_tests::rxe::rdma();
    let flap = Flappable::new();
    // Started after the device exists: the daemon opens every device at start.
    let d = Daemon::start(&rdma, &["--volume", "v:1M"]);
    flap.set(false);
    assert!(
        d.wait_log(&["port down", flap.device], Duration::from_secs(10)),
        "the daemon logged no port down for {}",
        flap.device
    );
    flap.set(true);
    assert!(
        d.wait_log(&["port active", flap.device], Duration::from_secs(10)),
        "the daemon logged no port active for {}",
        flap.device
    );
    eprintln!("device_events: {:?}", d.log_lines(&[flap.device]));
    // Gone before the device is removed (see above), whatever happened.
    d.kill();
}
