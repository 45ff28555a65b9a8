//! The ublk server's request path without the kernel (`rblk::ublk::path`, run by
//! `rblk-ublk-path-bench` for the instruction count per request), on the host over the
//! in-memory fabric: the server's own tag tasks, fed made-up I/O descriptors.

use libublk::sys;
use rblk_fabric::Fabric;
use rblk_initiator::{Engine, OpenMode, Options, Reconnect, Session};
use rblk_tests::target::{Spec, Target};
use rblk_tests::ublk_path::{insns_region, path, spawn_tags, FakeKernel};

const VOLUME: u64 = 16 << 20;

fn engine(t: &Target, reconnect: Reconnect) -> Engine {
    let opts = Options { fabric: Fabric::Mem, reconnect, ..Options::default() };
    let vol = Session::connect(&format!("rblk://{}/v", t.addr()), &opts).unwrap().open(OpenMode::ReadWrite).unwrap();
    Engine::new(vol, 0).unwrap()
}

/// The instruction gate's region runs exactly N requests, each of which reaches the target as
/// one RDMA READ or WRITE and commits its length. Would catch the region running more or fewer
/// (N and 11N would then not cancel the setup), requests committed without being sent (a path
/// that completes at once, as `--null-io` does), or a tag's buffer not coming back to it.
#[test]
fn the_region_runs_exactly_n_requests_through_the_lane() {
    let t = Target::start(Fabric::Mem, &Spec { volumes: vec![("v", VOLUME)], key: None });
    let e = engine(&t, Reconnect::default());
    for (op, depth) in [(sys::UBLK_IO_OP_READ, 1), (sys::UBLK_IO_OP_WRITE, 32), (sys::UBLK_IO_OP_READ, 32)] {
        let p = path(&e, depth).unwrap();
        let k = FakeKernel::new(op, depth, VOLUME, 7);
        let exe = smol::LocalExecutor::new();
        let tags = spawn_tags(&exe, &p, &k, depth);
        insns_region(&exe, &p, &k, 50);
        let before = e.stats();
        insns_region(&exe, &p, &k, 300);
        let after = e.stats();
        assert_eq!((k.committed(), k.issued()), (350, 350), "op {op} at QD{depth}");
        assert_eq!(k.failed(), (0, None));
        let sent = if op == sys::UBLK_IO_OP_READ { after.reads - before.reads } else { after.writes - before.writes };
        assert_eq!(sent, 300, "op {op} at QD{depth}: each request is one RDMA operation");
        k.stop();
        while exe.try_tick() {}
        for t in tags {
            assert!(smol::block_on(t).is_err(), "a stopped queue ends its tags with QueueIsDown");
        }
    }
}

/// scripts/lib/test_syscalls.py: scripts/ublk-syscalls-rxe.sh's analysis (system calls counted
/// by number from tracefs, per I/O by kind, the table), on a recorded guest log.
#[test]
fn the_syscall_scripts_analysis() {
    rblk_tests::python_unittest("test_syscalls");
}
