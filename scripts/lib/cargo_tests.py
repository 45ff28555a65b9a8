"""scripts/test.sh's reading of cargo: the test executables a build made.

    cargo test --no-run --message-format=json | python3 scripts/lib/cargo_tests.py

prints the executable of every test artifact (profile.test: unit tests, integration tests), one a
line, each once, in cargo's order. Lines that are not JSON (cargo's own messages) are skipped.
"""
import json
import sys


def test_executables(lines):
    """The executables of the test artifacts among cargo's JSON messages, deduplicated, in order."""
    seen, out = set(), []
    for line in lines:
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        if not isinstance(msg, dict):
            continue
        exe = msg.get("executable")
        if msg.get("reason") == "compiler-artifact" and exe and msg.get("profile", {}).get("test") and exe not in seen:
            seen.add(exe)
            out.append(exe)
    return out


def main(argv, stdin=sys.stdin):
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    for exe in test_executables(stdin):
        print(exe)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
