"""Unit tests of the shell library the measurement scripts share: target.sh's waits (wait_lines,
wait_for, wait_socket), proc_ticks and oneline, and script.sh's with_guest_lock and guest_tee,
each run in bash on the host. Run from tests/tests/scriptlint.rs (cargo test), or:
cd scripts/lib && python3 -m unittest test_shlib"""
import os
import socket
import subprocess
import tempfile
import time
import unittest

LIB = os.path.dirname(os.path.abspath(__file__))


def bash(script, env=None, timeout=60):
    """Runs script in bash with script.sh and target.sh sourced: (status, stdout, stderr, seconds)."""
    head = (f"set -uo pipefail\nSCRIPT_NAME=test REPO_ROOT=${{REPO_ROOT:-{os.path.dirname(os.path.dirname(LIB))}}}\n"
            f"source {LIB}/script.sh\nsource {LIB}/target.sh\n")
    t0 = time.monotonic()
    run = subprocess.run(["bash", "-c", head + script], capture_output=True, text=True, timeout=timeout,
                         env={**os.environ, **(env or {})})
    return run.returncode, run.stdout, run.stderr, time.monotonic() - t0


class Waits(unittest.TestCase):
    def test_wait_lines_sees_the_nth_line(self):
        with tempfile.TemporaryDirectory() as d:
            f = os.path.join(d, "out")
            rc, out, err, _ = bash(f"(sleep 0.3; echo held 1 >>{f}; echo other >>{f}; echo held 2 >>{f}) &\n"
                                   f"wait_lines {f} '^held' 2 10; echo rc=$?; grep -c . {f}")
        self.assertEqual((out, err), ("rc=0\n3\n", ""))

    def test_wait_lines_times_out_by_the_clock(self):
        with tempfile.TemporaryDirectory() as d:
            f = os.path.join(d, "out")
            rc, out, err, secs = bash(f"echo held >{f}; wait_lines {f} '^held' 2 1; echo rc=$?\n"
                                      f"wait_for {d}/missing ready 1; echo rc=$?")
        self.assertEqual((out, err), ("rc=1\nrc=1\n", ""))
        self.assertGreaterEqual(secs, 1.0)

    def test_a_process_that_exits_ends_the_wait(self):
        with tempfile.TemporaryDirectory() as d:
            f = os.path.join(d, "out")
            rc, out, _, secs = bash(f": >{f}; sleep 0.2 & wait_for {f} '^held' 30 $!; echo rc=$?\n"
                                    f"(echo held >{f}; sleep 0.2) & wait_for {f} '^held' 30 $!; echo rc=$?")
        self.assertEqual(out, "rc=1\nrc=0\n")
        self.assertLess(secs, 10)

    def test_wait_socket(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "nbd.sock")
            proc = subprocess.Popen(["bash", "-c", f"source {LIB}/target.sh; wait_socket {path} 10; echo rc=$?"],
                                    stdout=subprocess.PIPE, text=True)
            time.sleep(0.3)
            s = socket.socket(socket.AF_UNIX)
            s.bind(path)
            s.listen()
            out, _ = proc.communicate(timeout=30)
            s.close()
            self.assertEqual(out, "rc=0\n")
            rc, out, _, _ = bash(f"wait_socket {d}/none 1; echo rc=$?; touch {d}/file; wait_socket {d}/file 1; echo rc=$?")
        self.assertEqual(out, "rc=1\nrc=1\n")


class Processes(unittest.TestCase):
    def test_proc_ticks_reads_fields_after_the_last_parenthesis(self):
        with tempfile.TemporaryDirectory() as d:
            odd = os.path.join(d, "x) (y z")  # comm "x) (y z": spaces and parentheses
            os.symlink("/bin/bash", odd)
            # A process that spins for 0.5 s of CPU, then stopped so its ticks hold still.
            rc, out, err, _ = bash(f"'{odd}' -c 'end=$((SECONDS + 2)); while ((SECONDS < end)); do :; done' & p=$!\n"
                                   "sleep 0.7; kill -STOP $p; sleep 0.1\n"
                                   "proc_ticks $p; read -r -a f <<<\"$(sed 's/.*) //' /proc/$p/stat)\"\n"
                                   "echo $((f[11] + f[12])); kill -KILL $p; wait $p 2>/dev/null\n"
                                   "proc_ticks 999999999; echo rc=$?")
        lines = out.split()
        self.assertEqual(len(lines), 3, out + err)
        self.assertEqual(lines[0], lines[1])
        self.assertGreater(int(lines[0]), 10)  # at 100 Hz, most of 0.7 s
        self.assertEqual((lines[2], err), ("rc=1", ""))

    def test_oneline(self):
        with tempfile.TemporaryDirectory() as d:
            f, g = os.path.join(d, "a"), os.path.join(d, "b")
            with open(f, "w") as h:
                h.write("first\r\n\tsecond\n\n")
            with open(g, "w") as h:
                h.write("third\n")
            rc, out, err, _ = bash(f"oneline 100 {f} {g} {d}/none; oneline 8 {f}; printf 'a\\nb\\n' | oneline 100")
        self.assertEqual((out, err), ("first second third \nfirst se\na b \n", ""))


class Guest(unittest.TestCase):
    def test_with_guest_lock_takes_the_lock_or_none(self):
        with tempfile.TemporaryDirectory() as d:
            lock = os.path.join(d, "guest.lock")
            probe = f"flock -n {lock} true && echo free || echo held"
            rc, out, _, _ = bash(f"touch {lock}; with_guest_lock bash -c '{probe}'", env={"RBLK_GUEST_LOCK": lock})
            self.assertEqual(out, "held\n")
            rc, out, _, _ = bash(f"with_guest_lock bash -c '{probe}'", env={"RBLK_GUEST_LOCK": ""})
            self.assertEqual(out, "free\n")
            # A caller that holds the lock already: no second wait (which would never end).
            rc, out, _, secs = bash(f"flock {lock} bash -c 'source {LIB}/script.sh; with_guest_lock echo ran'",
                                    env={"RBLK_GUEST_LOCK": lock}, timeout=30)
            self.assertEqual((rc, out), (0, "ran\n"))

    def test_guest_tee_runs_rxe_guest_with_the_binaries_and_keeps_its_output(self):
        with tempfile.TemporaryDirectory() as d:
            os.makedirs(os.path.join(d, "scripts"))
            fake = os.path.join(d, "scripts", "rxe-guest.sh")
            with open(fake, "w") as f:
                f.write('#!/bin/bash\necho "bins=$RBLK_BIN_DIR mem=${RXE_GUEST_MEM:-} args=$*"\nexit 3\n')
            os.chmod(fake, 0o755)
            log = os.path.join(d, "guest.log")
            rc, out, _, _ = bash(f"BIN_DIR=/b RXE_GUEST_MEM=8G guest_tee {log} --disk x:1G s.sh --in-guest 2; echo rc=$?",
                                 env={"REPO_ROOT": d, "RBLK_GUEST_LOCK": ""})
            with open(log) as f:
                self.assertEqual(f.read(), "bins=/b mem=8G args=--disk x:1G s.sh --in-guest 2\n")
        self.assertEqual(out, "bins=/b mem=8G args=--disk x:1G s.sh --in-guest 2\nrc=3\n")


if __name__ == "__main__":
    unittest.main()
