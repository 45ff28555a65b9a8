//! `scripts/timeline-rxe.sh`'s analysis (`scripts/lib/timeline.py`, through `--redraw`) on a
//! synthetic trace and on a recorded guest log, on the host: bash and python3, no guest. What it
//! would catch: the split of the RDMA leg at rxe's first work item lost, a post whose work item ran
//! on a vCPU that was idle (halted) counted as busy or the other way round, the idle time before
//! the post measured from the wrong switch, any figure of the table or summary.json no longer what
//! the script made before its analysis moved out of its heredoc (issue 45), and `--redraw` no
//! longer reaching the analysis.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::Command;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).parent().expect("the workspace root").to_path_buf()
}

/// scripts/lib/test_timeline.py and test_timeline_table.py: the unit tests of each function of
/// timeline.py, timeline_trace.py and timeline_table.py (each table row and summary.json field,
/// the trace parser, the windows and boundaries, malformed logs).
#[test]
fn the_timeline_analysis_passes_its_unit_tests() {
    rblk_tests::python_unittest("test_timeline");
    rblk_tests::python_unittest("test_timeline_table");
}

/// The script's `--redraw` on the recorded log: the table on stdout and in table.txt as the old
/// analysis made it, summary.json beside it.
#[test]
fn timeline_rxe_redraws_its_table_and_summary_from_a_recorded_log() {
    let r = rblk_tests::redraw("timeline-rxe.sh", Some(&rblk_tests::testdata("timeline-guest.log")), |_| {});
    let text = &r.table;
    let want = std::fs::read_to_string(rblk_tests::testdata("timeline-table.txt")).unwrap();
    assert_eq!(*text, want);
    let doc = &r.summary;
    let old: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(rblk_tests::testdata("timeline-summary.json")).unwrap()).unwrap();
    assert_eq!(doc["paths"], old["paths"]);
    assert_eq!(doc["kprobes"], old["kprobes"]);
}

/// One line of ftrace's text output.
fn line(out: &mut String, comm: &str, pid: u32, cpu: u32, us: u64, event: &str, fields: &str) {
    let secs = 10.0 + us as f64 / 1e6;
    writeln!(out, "{:>16}-{pid:<6} [{cpu:03}] d..2. {secs:.6}: {event}: {fields}", comm).unwrap();
}

fn switch(out: &mut String, cpu: u32, us: u64, from: (&str, u32), to: (&str, u32)) {
    let fields = format!(
        "prev_comm={} prev_pid={} prev_prio=120 prev_state=I ==> next_comm={} next_pid={} next_prio=120",
        from.0, from.1, to.0, to.1
    );
    line(out, from.0, from.1, cpu, us, "sched_switch", &fields);
}

/// rblk-bench (pid 100, vCPU 1) posts a READ every 200 us; rxe's worker runs on vCPU 0. Even
/// I/Os find vCPU 0 idle since the previous one's end (115 us): it is woken 40 us after the post
/// and the item starts at 45 us. Odd I/Os find it running another task: the item starts at 10 us.
fn trace(ios: u64) -> String {
    let mut t = String::new();
    let idle = ("swapper/0", 0);
    let worker = ("kworker/u8:1", 31);
    let busy = ("stress", 77);
    for i in 0..ios {
        let at = i * 200;
        if i % 2 == 1 {
            switch(&mut t, 0, at.saturating_sub(5), idle, busy);
        }
        line(&mut t, "rblk-bench", 100, 1, at, "rxe_post_send", "(rxe_post_send+0x4/0x860 [rdma_rxe])");
        let start = if i % 2 == 0 {
            switch(&mut t, 0, at + 40, idle, worker);
            at + 45
        } else {
            at + 10
        };
        let who = if i % 2 == 0 { worker } else { busy };
        let item = "work struct 00000000aa: function do_work [rdma_rxe]";
        line(&mut t, who.0, who.1, 0, start, "workqueue_execute_start", item);
        line(&mut t, who.0, who.1, 0, at + 80, "rxe_cq_post", "(rxe_cq_post+0x4/0x1e0 [rdma_rxe])");
        switch(&mut t, 0, at + 85, who, idle);
    }
    t
}

#[test]
fn the_timeline_tells_an_rxe_worker_woken_from_idle_from_one_that_was_busy() {
    let dir = std::env::temp_dir().join(format!("rblk-timeline-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let raw = dir.join("trace.txt");
    std::fs::write(&raw, trace(21)).unwrap();
    // The guest's log: the trace gzipped and in base64 between markers, as the guest sends it.
    let log = dir.join("guest.log");
    let script = r#"
import base64, gzip, sys
raw, log = sys.argv[1], sys.argv[2]
body = base64.encodebytes(gzip.compress(open(raw, "rb").read())).decode()
with open(log, "w") as f:
    f.write("@@meta kprobes rxe_post_send rxe_cq_post\n@@meta trace_clock mono\n")
    f.write("@@path bench tids 100\n@@path bench server 100\n@@trace bench\n")
    f.write(body)
    f.write("@@endtrace bench\n@@meta complete yes\n")
"#;
    let st = Command::new("python3").arg("-c").arg(script).arg(&raw).arg(&log).status().expect("python3");
    assert!(st.success());
    let out = dir.join("out");
    let run = Command::new("bash")
        .arg(repo().join("scripts/timeline-rxe.sh"))
        .arg("--redraw")
        .arg(&log)
        .arg(&out)
        .output()
        .expect("bash");
    let text = String::from_utf8_lossy(&run.stdout);
    assert!(run.status.success(), "{text}\n{}", String::from_utf8_lossy(&run.stderr));
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    let bench = &doc["paths"]["bench"];
    // 21 posts make 20 windows (post -> next post); 1..=18 are analysed (each needs a neighbour
    // on both sides): 9 of each kind.
    assert_eq!(bench["ios"], 18, "{bench}");
    let w = &bench["rxe_worker"];
    assert_eq!(w["idle_share"], 0.5, "{w}");
    assert_eq!(w["from_idle_us"]["median_us"], 45.0, "{w}");
    assert_eq!(w["from_busy_us"]["median_us"], 10.0, "{w}");
    assert_eq!(w["idle_before_post_us"]["median_us"], 115.0, "{w}");
    let stage = |name: &str| {
        bench["stages"].as_array().unwrap().iter().find(|s| s["stage"] == name).cloned().unwrap_or_default()
    };
    // post -> item: 45 and 10 us, nine of each, so the median is their mean; item -> CQE: 35
    // and 70 us.
    assert_eq!(stage("rxe's first work item starts (workqueue_execute_start)")["median_us"], 27.5);
    assert_eq!(stage("CQE posted (rxe_cq_post)")["median_us"], 52.5);
    assert!(text.contains("idle at the post for 50% of I/Os"), "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}
