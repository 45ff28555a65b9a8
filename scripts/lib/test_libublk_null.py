"""Unit tests of scripts/lib/libublk_null.py on libublk 0.4.8's manifest layout."""
import unittest

from libublk_null import offline_manifest

MANIFEST = """[package]
name = "libublk"
version = "0.4.8"

[[test]]
name = "basic"
path = "tests/basic.rs"

[dependencies.libc]
version = "0.2"

[dev-dependencies.clap]
version = "4.3"
features = ["derive"]

[dev-dependencies.env_logger]
version = "0.9"

[dev-dependencies.ilog]
version = "1.0"
"""


class OfflineManifest(unittest.TestCase):
    """Would catch: a dev-dependency the offline registry lacks kept (the build fails), clap or a
    real dependency dropped, the tests kept (they need the dropped dev-dependencies), a stand-in
    not pointed to."""

    def test_keeps_clap_and_the_dependencies_and_drops_the_rest(self):
        out = offline_manifest(MANIFEST)
        self.assertIn("[dependencies.libc]\nversion = \"0.2\"", out)
        self.assertIn("[dev-dependencies.clap]\nversion = \"4.3\"\nfeatures = [\"derive\"]", out)
        self.assertNotIn("ilog", out)
        self.assertNotIn("[[test]]", out)
        self.assertNotIn("tests/basic.rs", out)
        self.assertNotIn('version = "0.9"', out)

    def test_points_to_the_stand_ins(self):
        out = offline_manifest(MANIFEST)
        self.assertTrue(out.endswith('[dev-dependencies.env_logger]\npath = "../stand-ins/env_logger"\n'
                                     '[dev-dependencies.daemonize]\npath = "../stand-ins/daemonize"\n'), out)


if __name__ == "__main__":
    unittest.main()
