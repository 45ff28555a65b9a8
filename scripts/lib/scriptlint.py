"""The size rules of scripts/ (issue 45): no heredoc longer than 20 lines in a shell script, and
no script (shell or Python) longer than 400 lines, scripts/rxe-guest.sh excepted (it boots the
guest and builds its initramfs, and is the one script allowed to be long).

    python3 scripts/lib/scriptlint.py [FILE...]

With no FILE: every *.sh and *.py under scripts/ (scripts/lib/testdata left out) and .ci/run, from
the repository's root. Prints one line per breach, `FILE:LINE: what (N lines, limit M)`, and exits
1 when there is any; 0 and nothing printed otherwise.
"""
import os
import re
import sys

MAX_HEREDOC = 20
MAX_SCRIPT = 400
# The one script allowed past MAX_SCRIPT lines (its heredocs are held to MAX_HEREDOC all the same).
LONG_SCRIPTS = ("scripts/rxe-guest.sh",)

# `<<WORD`, `<<-WORD`, `<< 'WORD'`, `<<"WORD"`, `<<\WORD`; not `<<<` (a here-string) nor `$((1 << 20))`
# (arithmetic: the word after `<<` there is a number).
HEREDOC = re.compile(r"""(?<!<)<<(-?)[ \t]*(?:'([^']+)'|"([^"]+)"|\\?([A-Za-z_][A-Za-z0-9_]*))""")


def is_shell(path, first_line):
    return path.endswith(".sh") or (first_line.startswith("#!") and ("bash" in first_line or "sh" in first_line.split()[-1]))


def heredocs(lines):
    """[(line number of the `<<` line, body length in lines, delimiter)] of a shell script's lines.
    Several heredocs on one line are read one after the other, as the shell does. A heredoc that
    never ends runs to the end of the file."""
    out = []
    i = 0
    while i < len(lines):
        line = lines[i]
        stripped = line.lstrip()
        if stripped.startswith("#"):
            i += 1
            continue
        pending = []
        for m in HEREDOC.finditer(line):
            if in_arithmetic(line, m.start()):
                continue
            pending.append((m.group(1) == "-", m.group(2) or m.group(3) or m.group(4)))
        start = i + 1
        i += 1
        for strip_tabs, word in pending:
            body = 0
            while i < len(lines):
                text = lines[i].rstrip("\n")
                if strip_tabs:
                    text = text.lstrip("\t")
                i += 1
                if text == word:
                    break
                body += 1
            out.append((start, body, word))
    return out


def in_arithmetic(line, pos):
    """Is pos inside `$(( ... ))` or `(( ... ))` on this line (a shift, not a heredoc)?"""
    before = line[:pos]
    return before.count("((") > before.count("))")


def check_file(path, rel):
    """The breaches of one file: [(rel, line, message)]."""
    try:
        with open(path, errors="replace") as f:
            lines = f.readlines()
    except OSError as e:
        return [(rel, 0, f"cannot read: {e.strerror}")]
    out = []
    if len(lines) > MAX_SCRIPT and rel not in LONG_SCRIPTS:
        out.append((rel, 1, f"script of {len(lines)} lines (limit {MAX_SCRIPT}): split it or move code into scripts/lib"))
    if lines and is_shell(rel, lines[0]):
        for start, body, word in heredocs(lines):
            if body > MAX_HEREDOC:
                out.append((rel, start, f"heredoc {word} of {body} lines (limit {MAX_HEREDOC}): "
                                        "move it into a file of its own (Python under scripts/lib)"))
    return out


def default_files(root):
    """Every *.sh and *.py under root/scripts (testdata left out), and root/.ci/run."""
    files = []
    for d, dirs, names in os.walk(os.path.join(root, "scripts")):
        dirs[:] = sorted(x for x in dirs if x not in ("testdata", "__pycache__"))
        files += [os.path.join(d, n) for n in sorted(names) if n.endswith((".sh", ".py"))]
    ci = os.path.join(root, ".ci", "run")
    if os.path.exists(ci):
        files.append(ci)
    return files


def main(argv, root=None):
    root = root or os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    files = argv[1:] or default_files(root)
    breaches = []
    for path in files:
        full = path if os.path.isabs(path) else os.path.join(root, path)
        rel = os.path.relpath(full, root)
        breaches += check_file(full, rel)
    for rel, line, msg in breaches:
        print(f"{rel}:{line}: {msg}")
    return 1 if breaches else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
