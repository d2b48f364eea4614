#!/usr/bin/env python3
"""Sizes of the code under src/: no function over FUNCTION_LINES lines and no
file over FILE_LINES lines unless tests/style/size_exceptions.txt lists it
with a one-line reason; a listed one that is no longer over its limit must
leave the list, so the list only shrinks.

Functions are found the way clang-format lays them out (.clang-format:
Google style, namespaces not indented): a definition starts at column 0
with a signature that has a parameter list and no '=' at its top level,
and its body ends at the first '}' in column 0. Functions defined inside a
class body are indented, and not counted (they are short by house style);
lambdas count as part of their function.

  check_sizes.py ROOT            the check (exit 1 on a violation)
  check_sizes.py ROOT --report   the largest functions and files, and the check
"""
import os
import re
import sys

FUNCTION_LINES = 100
FILE_LINES = 700
EXCEPTIONS = os.path.join("tests", "style", "size_exceptions.txt")
SKIP = re.compile(r"^(#|//|/\*|\*|namespace\b|class\b|struct\b|enum\b|union\b|using\b|"
                  r"extern\b|typedef\b|static_assert\b|\}|$)")
OPERATOR = re.compile(r"operator\s*[^\s(]+")


def depth0(sig):
    """`sig` with everything inside (), <> and [] removed."""
    out, depth = [], 0
    for ch in sig:
        if ch in "([<":
            depth += 1
        elif ch in ")]>" and depth > 0:
            depth -= 1
        elif depth == 0:
            out.append(ch)
    return "".join(out)


def code(line):
    """`line` without a trailing // comment."""
    at = line.find("//")
    return line if at < 0 else line[:at]


def functions(path):
    """(name, first line, lines) of each function defined at column 0."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    found, i = [], 0
    while i < len(lines):
        line = lines[i]
        if not line or line[0] in " \t" or SKIP.match(line):
            i += 1
            continue
        # The signature runs to the line that opens the body (or ends it); a
        # template's header line is part of it.
        j, sig = i, code(line)
        while not sig.rstrip().endswith(("{", ";", "}")) and j + 1 < len(lines) and j - i < 30:
            j += 1
            sig += " " + code(lines[j]).strip()
        body = sig.rstrip().endswith("{")
        head = OPERATOR.sub("operator", sig.split("{")[0])
        if not body or "(" not in sig or "=" in depth0(head) or re.search(r"\b(class|struct|union)\b", depth0(head)):
            i = j + 1
            continue
        k = j + 1
        while k < len(lines) and not lines[k].startswith("}"):
            k += 1
        name = re.sub(r"\s+", " ", OPERATOR.sub(lambda m: m.group(0).replace(" ", ""), head).split("(")[0])
        name = name.split(" ")[-1]
        found.append((name, i + 1, k - i + 1))
        i = k + 1
    return found


def sources(root):
    for d, _, files in os.walk(os.path.join(root, "src")):
        for f in sorted(files):
            if f.endswith((".cc", ".h", ".c", ".hpp")):
                yield os.path.relpath(os.path.join(d, f), root)


def load_exceptions(root):
    """{(path, name or 'file'): reason} from the list; errors for lines
    without a reason."""
    allowed, errors = {}, []
    with open(os.path.join(root, EXCEPTIONS), encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            m = re.match(r"^(\S+)\s+(\S+)\s+--\s+(\S.*)$", line)
            if not m:
                errors.append("%s:%d: not 'path name -- reason': %s" % (EXCEPTIONS, n, line))
                continue
            allowed[(m.group(1), m.group(2))] = m.group(3)
    return allowed, errors


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    root, report = sys.argv[1], "--report" in sys.argv[2:]
    allowed, errors = load_exceptions(root)
    big_files, big_funcs, seen = [], [], set()
    for path in sources(root):
        with open(os.path.join(root, path), encoding="utf-8") as f:
            n = f.read().count("\n")
        big_files.append((n, path))
        if n > FILE_LINES:
            seen.add((path, "file"))
            if (path, "file") not in allowed:
                errors.append("%s: %d lines (over %d) and not in %s" % (path, n, FILE_LINES, EXCEPTIONS))
        for name, first, count in functions(os.path.join(root, path)):
            big_funcs.append((count, "%s:%d %s" % (path, first, name)))
            if count > FUNCTION_LINES:
                seen.add((path, name))
                if (path, name) not in allowed:
                    errors.append("%s:%d: %s is %d lines (over %d) and not in %s" %
                                  (path, first, name, count, FUNCTION_LINES, EXCEPTIONS))
    for key in sorted(set(allowed) - seen):
        errors.append("%s: %s %s is within its limit now: take it off the list" % (EXCEPTIONS, *key))
    if report:
        print("largest functions (lines):")
        for count, where in sorted(big_funcs, reverse=True)[:15]:
            print("  %5d  %s" % (count, where))
        print("largest files (lines):")
        for count, path in sorted(big_files, reverse=True)[:10]:
            print("  %5d  %s" % (count, path))
        print("functions over %d lines: %d; files over %d lines: %d; exceptions listed: %d" % (
            FUNCTION_LINES, sum(c > FUNCTION_LINES for c, _ in big_funcs), FILE_LINES,
            sum(c > FILE_LINES for c, _ in big_files), len(allowed)))
    for e in errors:
        print(e)
    if errors:
        print("check_sizes: %d problem(s); split the code, or list it in %s with its reason" %
              (len(errors), EXCEPTIONS))
        return 1
    print("check_sizes: %d functions and %d files checked" % (len(big_funcs), len(big_files)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
