#!/usr/bin/python3
"""The man pages (docs/man/*.scd): they render cleanly and they document
every option the programs have.

    man_test.py render PAGE...
        Each generated page (roff, from scdoc) through groff with every
        warning on (groff -t -man -ww -z), and through man-db the way lintian
        checks pages (man --warnings -E UTF-8 -l -Tutf8 -Z, 80 columns) when
        man is installed. Any message fails.

    man_test.py options SOURCE.scd -- COMMAND...
        COMMAND --help, and for a CLI11 program with subcommands each
        subcommand's --help, recursively: every long option printed (and
        every short option printed beside one, "-c,--config" or
        "-c, --config") must appear in the page's source as a word of its
        own, so a new option without a page entry fails here.
"""
import os
import re
import shutil
import subprocess
import sys

OPTION_RE = r"(?<![\w-])%s(?![\w-])"


def render(pages):
    env = dict(os.environ, LC_ALL="C.UTF-8", MANWIDTH="80", MANROFFSEQ="")
    failures = []
    runs = [["groff", "-t", "-man", "-ww", "-z", "-Tutf8"]]
    if shutil.which("man"):
        runs.append(["man", "--warnings", "-E", "UTF-8", "-l", "-Tutf8", "-Z"])
    else:
        print("man (man-db) not installed: checked with groff only")
    for page in pages:
        before = len(failures)
        with open(page) as f:
            head = f.read(4096)
        name, section = re.match(r"(.+)\.(\d)$", os.path.basename(page)).groups()
        th = re.search(r'^\.TH "([^"]+)" "(\d)"', head, re.M)
        if not th or th.groups() != (name, section):
            failures.append("%s: .TH says %s, the file name %s(%s)" % (
                page, th.groups() if th else None, name, section))
        if not re.search(r"^\.SH NAME\n(?:\.P\n)?%s \\?- \S" % re.escape(name), head, re.M):
            failures.append("%s: the NAME section is not '%s - description'" % (page, name))
        for cmd in runs:
            p = subprocess.run(cmd + [page], capture_output=True, text=True, env=env)
            msg = p.stderr.strip()
            if p.returncode != 0 or msg:
                failures.append("%s: %s (exit %d):\n%s" % (page, " ".join(cmd[:2]), p.returncode, msg))
        if len(failures) == before:
            print("%s: renders without warnings" % os.path.basename(page))
    assert not failures, "\n".join(failures)


def help_texts(command, path=()):
    """(subcommand path, --help output) for the program and each subcommand."""
    p = subprocess.run(command + list(path) + ["--help"], capture_output=True, text=True)
    assert p.returncode == 0, "%s --help: exit %d\n%s%s" % (
        " ".join(command + list(path)), p.returncode, p.stdout, p.stderr)
    yield path, p.stdout
    block = re.search(r"^Subcommands:\n((?:  \S.*\n)+)", p.stdout, re.M)
    for line in block.group(1).splitlines() if block else []:
        yield from help_texts(command, path + (line.split()[0],))


def options(source, command):
    with open(source) as f:
        page = f.read()
    missing = []
    n = 0
    for path, text in help_texts(command):
        found = set(re.findall(r"(?<![\w-])--[A-Za-z][\w-]*", text))
        found |= {m for m in re.findall(r"(?<![\w-])(-[A-Za-z0-9]),\s?--[A-Za-z]", text)}
        for opt in sorted(found):
            n += 1
            if not re.search(OPTION_RE % re.escape(opt), page):
                missing.append("%s (%s --help)" % (opt, " ".join([os.path.basename(command[-1])] + list(path))))
    assert not missing, "%s does not document:\n  %s" % (source, "\n  ".join(missing))
    print("%s: documents all %d options of %s --help" % (os.path.basename(source), n, os.path.basename(command[-1])))


def main():
    if len(sys.argv) >= 3 and sys.argv[1] == "render":
        render(sys.argv[2:])
    elif len(sys.argv) >= 5 and sys.argv[1] == "options" and sys.argv[3] == "--":
        options(sys.argv[2], sys.argv[4:])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
