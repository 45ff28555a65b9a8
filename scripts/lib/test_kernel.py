"""Unit tests of kernel.py (run by tests/tests/ublk.rs)."""

import contextlib
import io
import json
import os
import tempfile
import unittest

import kernel

T0 = 1796612400.0

# rxe-guest.sh's stderr as kernel-rxe.sh stamps it: a first boot that downloads the kernel.
STDERR_FIRST = f"""{T0 + 1.5:.6f} rxe-guest: fetching linux-base-7.3.4+deb13-amd64 linux-binary-7.3.4+deb13-amd64 linux-modules-7.3.4+deb13-amd64 from trixie-backports
{T0 + 2.0:.6f} Get:1 http://deb.debian.org/debian trixie-backports/main amd64 linux-base-7.3.4+deb13-amd64
{T0 + 61.0:.6f} rxe-guest: rxe0 ACTIVE after 25.0 s (kernel 7.3.4+deb13-amd64)
{T0 + 90.0:.6f} rxe-guest: guest command exited with status 0 after 90.0 s
""".splitlines()

GUEST = f"""@@meta guest_started {T0:.6f}
@@kernel 7.3.4+deb13-amd64
@@rxe link rxe0/1 state ACTIVE physical_state LINK_UP netdev rxe-veth0
@@ublk features 0xfff SUPPORT_ZERO_COPY URING_CMD_COMP_IN_TASK UPDATE_SIZE
@@ublk update_size yes

@@test-start ublk two_volumes 100.0

running 1 test
test two_volumes_attached_at_once_stay_apart ... ok <7.512s>

test result: ok. 1 passed; 0 failed; 0 ignored; 0 measured; 12 filtered out; finished in 7.51s

@@test-end 0 108.25
@@meta guest_ended {T0 + 91.0:.6f}
""".splitlines()


class Boot(unittest.TestCase):
    def test_a_first_boot_counts_the_download_in_the_preparation(self):
        b = kernel.boot(STDERR_FIRST, T0)
        self.assertEqual(b["kernel"], "7.3.4+deb13-amd64")
        self.assertEqual(b["fetched"], ["linux-base-7.3.4+deb13-amd64", "linux-binary-7.3.4+deb13-amd64",
                                        "linux-modules-7.3.4+deb13-amd64"])
        self.assertEqual((b["total_s"], b["qemu_to_rxe_s"], b["prepare_s"]), (61.0, 25.0, 36.0))
        self.assertEqual(b["exit_status"], 0)

    def test_a_cached_boot_fetches_nothing(self):
        b = kernel.boot([f"{T0 + 27.0:.6f} rxe-guest: rxe0 ACTIVE after 26.5 s (kernel 7.3.4+deb13-amd64)"], T0)
        self.assertIsNone(b["fetched"])
        self.assertEqual((b["total_s"], b["prepare_s"]), (27.0, 0.5))

    def test_a_boot_that_panicked_and_was_booted_again(self):
        lines = [STDERR_FIRST[0],
                 f"{T0 + 20.0:.6f} rxe-guest: the guest kernel panicked while booting, before CMD ran (x): booting again",
                 STDERR_FIRST[2]]
        b = kernel.boot(lines, T0)
        self.assertEqual((b["panicked"], b["total_s"], b["prepare_s"]), (1, 61.0, 36.0))
        s = kernel.summarize(GUEST, lines)
        self.assertEqual(s["problems"], [])
        self.assertIn("after 1 boot(s) that panicked and were booted again", "\n".join(kernel.table(s)))
        self.assertEqual(kernel.boot(STDERR_FIRST, T0)["panicked"], 0)

    def test_no_boot_and_unstamped_lines(self):
        b = kernel.boot(["rxe-guest: rxe0 ACTIVE after 5.0 s (kernel x)", "garbage"], T0)
        self.assertIsNone(b["qemu_to_rxe_s"])
        self.assertIsNone(kernel.boot(STDERR_FIRST, None)["total_s"])


class Guest(unittest.TestCase):
    def test_the_guests_report(self):
        g = kernel.guest(GUEST)
        self.assertEqual(g["kernel"], "7.3.4+deb13-amd64")
        self.assertEqual(g["ublk"], {"bits": "0xfff", "names": ["SUPPORT_ZERO_COPY", "URING_CMD_COMP_IN_TASK",
                                                                 "UPDATE_SIZE"], "update_size": True})
        self.assertEqual(len(g["runs"]), 1)
        r = g["runs"][0]
        self.assertEqual((r["test"], r["filter"], r["rc"], r["secs"], r["passed"], r["failed"]),
                         ("ublk", "two_volumes", 0, 8.2, 1, 0))
        self.assertEqual(r["tests"], [("two_volumes_attached_at_once_stay_apart", "ok", 7.512)])

    def test_a_driver_without_update_size(self):
        g = kernel.guest(["@@ublk features 0x1ff ZONED", "@@ublk update_size no"])
        self.assertIs(g["ublk"]["update_size"], False)


class Verdict(unittest.TestCase):
    def test_a_good_run_passes(self):
        s = kernel.summarize(GUEST, STDERR_FIRST)
        self.assertEqual(s["problems"], [])
        self.assertEqual(s["run_s"], 91.0)
        text = "\n".join(kernel.table(s))
        self.assertIn("boot                61.0 s to rxe0 ACTIVE (36.0 s kernel and initramfs with the download, 25.0 s qemu)",
                      text)
        self.assertIn("ublk UPDATE_SIZE    yes", text)

    def test_what_fails_a_run(self):
        def problems(guest, stderr=STDERR_FIRST):
            return kernel.summarize(guest, stderr)["problems"]

        self.assertIn("the guest did not boot to rxe0 ACTIVE (see rxe-guest.sh's messages)",
                      problems(GUEST, []))
        no_ublk = [x for x in GUEST if not x.startswith("@@ublk")] + ["@@ublk-error no /dev/ublk-control"]
        self.assertEqual(problems(no_ublk),
                         ["the ublk driver's features were not read: no /dev/ublk-control"])
        failed = [x.replace("1 passed; 0 failed", "0 passed; 1 failed").replace("@@test-end 0", "@@test-end 101")
                  for x in GUEST]
        self.assertEqual(problems(failed), ["ublk:two_volumes: 1 test(s) failed"])
        none_ran = [x.replace("1 passed", "0 passed") for x in GUEST]
        self.assertEqual(problems(none_ran), ["ublk:two_volumes ran no test (is the filter right?)"])
        crashed = [x for x in GUEST if not x.startswith("test result")]
        self.assertEqual(problems(crashed), ["ublk:two_volumes exited with status 0 and 0 result line(s)"])
        cut = [x for x in GUEST if not x.startswith("@@test-end")]
        self.assertEqual(problems(cut), ["ublk:two_volumes did not finish (the guest stopped during it)"])


class Executables(unittest.TestCase):
    def test_the_test_targets_asked_for(self):
        msgs = [
            {"reason": "compiler-artifact", "target": {"name": "ublk", "kind": ["test"]},
             "executable": "/b/debug/deps/ublk-1"},
            {"reason": "compiler-artifact", "target": {"name": "rblk-test-client", "kind": ["bin"]},
             "executable": "/b/debug/rblk-test-client"},
            {"reason": "compiler-artifact", "target": {"name": "engine", "kind": ["test"]},
             "executable": "/b/debug/deps/engine-2"},
            {"reason": "build-finished", "success": True},
        ]
        lines = [json.dumps(m) for m in msgs] + ["not json"]
        self.assertEqual(kernel.executables(lines, {"ublk", "rblk-test-client"}), {"ublk": "/b/debug/deps/ublk-1"})
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "c.json")
            with open(path, "w") as f:
                f.write("\n".join(lines) + "\n")
            out, err = io.StringIO(), io.StringIO()
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                self.assertEqual(kernel.main(["kernel.py", "exes", path, "engine", "ublk"]), 0)
                self.assertEqual(kernel.main(["kernel.py", "exes", path, "nbd"]), 1)
            self.assertEqual(out.getvalue(), "/b/debug/deps/engine-2\n/b/debug/deps/ublk-1\n")
            self.assertIn("cargo built no test target nbd", err.getvalue())


if __name__ == "__main__":
    unittest.main()
