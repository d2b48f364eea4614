#!/usr/bin/env python3
"""Code and docs cite only what the repository holds.

  check_citations.py SOURCE_DIR

Over every file git tracks (or every file, outside a checkout):
- a citation of a repository document in code, a comment or a
  configuration file, `docs/design.md#tables`: the file must exist and the
  citation must name a heading of it by its GitHub anchor (`## ICRC fix-up`
  is `#icrc-fix-up`), so a reader lands on the section meant;
- a relative Markdown link, `[text](../bench/README.md#figures)`: resolved from
  the page's own folder, the same rule;
- no citation of a design file outside the repository (a `DESIGN` markdown
  file, `../shared/`), no issue number (`issue 16`, `(#16)`) in code or docs:
  commit messages keep history.
Every failure names the file, the line and the citation.
"""

import os
import re
import subprocess
import sys

TEXT_SUFFIXES = (".cc", ".h", ".hpp", ".c", ".py", ".sh", ".md", ".build", ".txt", ".yaml", ".yml", ".scd",
                 ".in", ".json")
SKIP_DIRS = {".git", "subprojects"}
THIS = "tests/style/check_citations.py"

# A repository path ending in .md, optionally with an anchor.
CITE = re.compile(r"(?<![\w./-])((?:[\w-]+/)*[\w.-]+\.md)(#[\w-]+)?")
MD_LINK = re.compile(r"\]\(([^)\s#]*)(#[^)\s]+)?\)")
OUTSIDE = re.compile(r"\bDESIGN\.md\b|\.\./shared/")
ISSUE = re.compile(r"\bissues? #?\d+\b|\(#\d+\)|\b(?:for|see|in) #\d+\b", re.I)


def anchor(heading):
    h = heading.strip().lower()
    h = re.sub(r"[^\w\- ]", "", h)
    return h.replace(" ", "-")


def headings(path, cache={}):
    if path not in cache:
        anchors = set()
        in_code = False
        for line in open(path, errors="replace"):
            if line.startswith("```"):
                in_code = not in_code
            elif not in_code:
                m = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
                if m:
                    anchors.add(anchor(m.group(1)))
        cache[path] = anchors
    return cache[path]


def files(root):
    try:
        out = subprocess.run(["git", "-C", root, "ls-files"], capture_output=True, text=True, check=True).stdout
        names = out.splitlines()
    except (OSError, subprocess.CalledProcessError):
        names = []
        for d, subdirs, fs in os.walk(root):
            subdirs[:] = [s for s in subdirs if s not in SKIP_DIRS and not s.startswith("build")]
            names += [os.path.relpath(os.path.join(d, f), root) for f in fs]
    return [n for n in names if n.endswith(TEXT_SUFFIXES) and n != THIS and os.path.isfile(os.path.join(root, n))]


def check_target(root, rel_from, target, frag, where, errors):
    """TARGET (a path relative to REL_FROM, a folder of the repository) must exist, with FRAG's heading."""
    path = os.path.normpath(os.path.join(root, rel_from, target))
    if not os.path.exists(path):
        errors.append("%s: cites %s%s, which the repository lacks" % (where, target, frag or ""))
        return
    if frag and path.endswith(".md") and frag[1:] not in headings(path):
        errors.append("%s: cites %s%s: %s has no such heading" % (where, target, frag, os.path.relpath(path, root)))


def main():
    root = os.path.abspath(sys.argv[1])
    errors = []
    cited = 0
    for name in files(root):
        is_md = name.endswith(".md")
        folder = os.path.dirname(name)
        for no, line in enumerate(open(os.path.join(root, name), errors="replace"), 1):
            where = "%s:%d" % (name, no)
            if OUTSIDE.search(line):
                errors.append("%s: cites a file outside the repository: %s" % (where, line.strip()[:120]))
            if ISSUE.search(line):
                errors.append("%s: names an issue (history goes in commit messages): %s" % (where, line.strip()[:120]))
            if is_md:
                for m in MD_LINK.finditer(line):
                    target, frag = m.group(1), m.group(2)
                    if re.match(r"[a-z][a-z0-9+.-]*:", target):
                        continue  # http:, mailto:, ...
                    cited += 1
                    check_target(root, folder, target or os.path.basename(name), frag, where, errors)
                continue
            for m in CITE.finditer(line):
                target, frag = m.group(1), m.group(2)
                top = target.split("/")[0]
                if "/" in target and not os.path.isdir(os.path.join(root, top)):
                    continue  # an installed or foreign path, not a repository file
                if "/" not in target and target not in ("README.md", "CONTRIBUTING.md"):
                    continue  # a bare file name: not a repository citation
                cited += 1
                if not frag and not name.endswith(".scd"):  # a man page's SEE ALSO names whole documents
                    errors.append("%s: cites %s without a heading (cite %s#section)" % (where, target, target))
                check_target(root, "", target, frag, where, errors)
    for e in errors:
        print(e)
    if errors:
        print("FAIL: %d citation problems" % len(errors))
        return 1
    print("citations: %d checked in %d files, every cited file and heading exists" % (cited, len(files(root))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
