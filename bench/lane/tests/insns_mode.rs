//! `rblk-lane-bench --insns`, the run scripts/insns.sh counts under callgrind, natively (debug
//! build, in-memory fabric). What it would catch: a counted run that hangs, panics or stops
//! early (a write cycle whose FLUSH fails, a lane that stops finishing requests), and arguments
//! it should refuse (an unknown workload, a request count that is not whole cycles).

use std::process::Command;

fn bench(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_rblk-lane-bench")).args(args).output().expect("run rblk-lane-bench")
}

#[test]
fn the_counted_runs_finish_every_request() {
    for w in ["randread-qd1-registered", "randwrite-qd32-registered"] {
        let out = bench(&["--insns", w, "--requests", "256"]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{w}: {stderr}");
        assert_eq!(String::from_utf8_lossy(&out.stdout), format!("{w} 256 requests\n"));
    }
}

#[test]
fn bad_insns_arguments_are_refused_saying_what_is_wanted() {
    for (args, want) in [
        (&["--insns", "randread", "--requests", "256"][..], "expected one of randread-qd32-registered"),
        (&["--insns", "randread-qd1-registered"][..], "--insns needs --requests N, a multiple of 128"),
        (&["--insns", "randread-qd1-registered", "--requests", "100"][..], "a multiple of 128"),
        (&["--insns"][..], "--insns needs a workload"),
    ] {
        let out = bench(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(want), "{args:?}: {stderr}");
    }
}
