"""Generated sections of the repository's markdown: text between `<!-- NAME:begin -->` and `<!-- NAME:end -->`,
rewritten by the benchmark that measured it (README.md's headline and time-to-loss sections,
docs/benchmarks.md's one-host and link sections)."""

import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
BENCHMARKS = os.path.join(ROOT, "docs", "benchmarks.md")


def markers(name):
    return f"<!-- {name}:begin -->", f"<!-- {name}:end -->"


def rewrite(path, name, body):
    """Replaces section `name` of the markdown file `path` with `body` (markers added here)."""
    begin, end = markers(name)
    with open(path) as f:
        text = f.read()
    if begin not in text or end not in text:
        sys.exit(f"{os.path.relpath(path, ROOT)} has no {begin} ... {end} section to replace")
    text = re.sub(re.escape(begin) + ".*?" + re.escape(end), lambda _: f"{begin}\n\n{body.strip()}\n\n{end}", text,
                  flags=re.S)
    with open(path, "w") as f:
        f.write(text)
    print(f"{os.path.relpath(path, ROOT)}: section {name} rewritten")
