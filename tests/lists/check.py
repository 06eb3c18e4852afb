#!/usr/bin/env python3
"""The meson test lists against the tests (docs/testing.md, "Test lists").

Every Criterion binary has a list file, tests/lists/<binary>.txt, from which
tests/meson.build registers its meson tests. One line per Criterion test, as the
binary's --list prints it (suite/name), then optional words:

    suite/name                          registered with the binary's defaults
    suite/name timeout=900 suites=a,b   (binaries registered one test per line)
    suite/name off: why                 listed, deliberately not registered

Blank lines and lines starting with '#' are comments.

  check.py [--sources DIR] BINARY LIST [BINARY LIST ...]
      Fails, naming the binary and the test, when the binary has a test that its
      list lacks (unregistered) or the list names a test that the binary no
      longer has (renamed or removed), or a line is malformed. With --sources,
      also when a test source in DIR (a file with Test(...)) has no list file,
      or a list file in the folder of the lists has no source.
  check.py --update BINARY LIST
      Rewrites LIST from the binary's --list: lines of tests that still exist
      are kept as they are (with their words and comments), those of vanished
      tests are dropped, new tests are appended with the words of the first
      registered line of the same Criterion suite.
"""
import os
import re
import subprocess
import sys

OPTION_KEYS = ("timeout", "suites")


def binary_tests(binary):
    """The suite/name of every test of the binary, from its --list."""
    out = subprocess.run([binary, "--list"], capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        raise SystemExit(f"{binary} --list exited with {out.returncode}: {out.stderr.strip()}")
    tests, suite, expect = [], None, {}
    for line in out.stdout.splitlines():
        m = re.match(r"^(\S+): (\d+) tests?$", line)
        if m:
            suite = m.group(1)
            expect[suite] = int(m.group(2))
            continue
        m = re.match(r"^[├└]── (\S+)$", line)
        if m and suite is not None:
            tests.append(f"{suite}/{m.group(1)}")
            continue
        if line.strip():
            raise SystemExit(f"{binary} --list: a line this check does not understand: {line!r}")
    for s, n in expect.items():
        got = sum(1 for t in tests if t.split("/", 1)[0] == s)
        if got != n:
            raise SystemExit(f"{binary} --list: suite {s} says {n} tests, {got} listed")
    return tests


def parse_list(path):
    """[(line number, name or None, words, raw line)], and the problems found."""
    entries, problems = [], []
    with open(path) as f:
        raw = f.read().splitlines()
    for no, line in enumerate(raw, 1):
        words = line.split()
        if not words or words[0].startswith("#"):
            entries.append((no, None, [], line))
            continue
        name = words[0]
        where = f"{path}:{no}"
        if name.count("/") != 1 or not all(name.split("/")):
            problems.append(f"{where}: '{name}' is not suite/name")
        rest = words[1:]
        for i, w in enumerate(rest):
            if w == "off:":
                if i + 1 == len(rest):
                    problems.append(f"{where}: {name} is off without a reason")
                break
            key, eq, value = w.partition("=")
            if not eq or key not in OPTION_KEYS or not value:
                problems.append(f"{where}: {name}: '{w}' is not timeout=S, suites=a,b or 'off: reason'")
            elif key == "timeout" and not value.isdigit():
                problems.append(f"{where}: {name}: timeout '{value}' is not a number of seconds")
        entries.append((no, name, rest, line))
    return entries, problems


def check(binary, path):
    problems = []
    bname = os.path.basename(binary)
    if not os.path.exists(path):
        return [f"{bname}: its list file {path} does not exist"]
    entries, problems = parse_list(path)
    have = binary_tests(binary)
    listed = {}
    for no, name, _, _ in entries:
        if name is None:
            continue
        if name in listed:
            problems.append(f"{path}:{no}: {name} is listed twice (first on line {listed[name]})")
        listed.setdefault(name, no)
    for t in have:
        if t not in listed:
            problems.append(f"{bname}: test {t} is not in {path} (unregistered: add it, or mark it 'off: reason'; "
                            f"tests/lists/update.sh {os.path.abspath(binary)} does it)")
    have_set = set(have)
    for name, no in listed.items():
        if name not in have_set:
            problems.append(f"{path}:{no}: {bname} has no test {name} (renamed or removed?)")
    return problems


def check_sources(sources, lists_dir):
    problems = []
    stems = set()
    for f in sorted(os.listdir(sources)):
        if not f.endswith(".c"):
            continue
        with open(os.path.join(sources, f)) as fh:
            if re.search(r"^Test\(", fh.read(), re.M):
                stems.add(f[:-2])
    for s in sorted(stems):
        if not os.path.exists(os.path.join(lists_dir, s + ".txt")):
            problems.append(f"{s}: tests/{s}.c has tests but no list file {lists_dir}/{s}.txt")
    for f in sorted(os.listdir(lists_dir)):
        if f.endswith(".txt") and f[:-4] not in stems:
            problems.append(f"{lists_dir}/{f}: no test source tests/{f[:-4]}.c with Test(...)")
    return problems


def update(binary, path):
    have = binary_tests(binary)
    entries, problems = parse_list(path) if os.path.exists(path) else ([], [])
    if problems:
        raise SystemExit("\n".join(problems))
    have_set = set(have)
    out, kept, suite_words = [], set(), {}
    for _, name, words, line in entries:
        if name is None:
            out.append(line)
        elif name in have_set and name not in kept:
            out.append(line)
            kept.add(name)
            if "off:" not in words:
                suite_words.setdefault(name.split("/", 1)[0], words)
        else:
            print(f"dropped: {line.strip()}")
    for t in have:
        if t not in kept:
            words = suite_words.get(t.split("/", 1)[0], [])
            out.append(" ".join([t] + words))
            print(f"added: {out[-1]}")
    with open(path, "w") as f:
        f.write("\n".join(out).rstrip("\n") + "\n")


def main(argv):
    if argv[:1] == ["--update"]:
        if len(argv) != 3:
            raise SystemExit("usage: check.py --update BINARY LIST")
        update(argv[1], argv[2])
        return 0
    sources = None
    if argv[:1] == ["--sources"]:
        sources, argv = argv[1], argv[2:]
    if not argv or len(argv) % 2:
        raise SystemExit(__doc__)
    problems = []
    pairs = list(zip(argv[0::2], argv[1::2]))
    for binary, path in pairs:
        problems += check(binary, path)
    if sources:
        problems += check_sources(sources, os.path.dirname(os.path.abspath(pairs[0][1])))
    for p in problems:
        print(p)
    if problems:
        print(f"{len(problems)} problem(s) in the test lists")
        return 1
    print(f"{len(pairs)} binaries, every test listed and every listed test there")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
