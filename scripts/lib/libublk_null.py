"""scripts/lib/libublk-null.sh's Cargo.toml rewrite: libublk 0.4.8's manifest made buildable
offline for its examples/null.

    python3 scripts/lib/libublk_null.py CRATE/Cargo.toml

Keeps clap (in the offline registry), drops the other dev-dependencies and the [[test]] targets,
and adds path dependencies on the stand-ins for env_logger and daemonize (../stand-ins/NAME).
"""
import re
import sys

STAND_INS = ("env_logger", "daemonize")


def offline_manifest(text):
    """Cargo.toml's text -> the rewritten text."""
    out, skip = [], False
    for line in text.splitlines():
        m = re.match(r"^\[\[?([^\]]*)\]\]?\s*$", line)
        if m:
            skip = (m.group(1).startswith("dev-dependencies.") and m.group(1) != "dev-dependencies.clap"
                    or line.strip() == "[[test]]")
        if not skip:
            out.append(line)
    for name in STAND_INS:
        out += [f"[dev-dependencies.{name}]", f'path = "../stand-ins/{name}"']
    return "\n".join(out) + "\n"


def main(argv):
    if len(argv) != 2:
        print(f"usage: {argv[0]} CARGO_TOML", file=sys.stderr)
        return 2
    with open(argv[1]) as f:
        text = f.read()
    with open(argv[1], "w") as f:
        f.write(offline_manifest(text))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
