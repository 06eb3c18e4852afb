#!/usr/bin/env python3
"""The include-direction check (docs/architecture.md, section 1).

Every folder of C code is a layer; a file may include its own layer and the
layers below it, and nothing above, except the upward edges named in ALLOWED
(each with the reason it still exists; none today). No code outside
transports/ (and tests/) names a particular transport
(PLAIT_TP_*, plait_transport_shm/inproc/net, or the tests' socket hooks
plait_net_conn_fd and plait_net_socket_comm_fd). Every quoted include is a path from
the repository root ("base/log.h") that names an existing file, except the
public header "plait.h" (include/), the configured "plait_config.h" and
headers generated into the build folder. A folder of SUBLAYERS (transports/net)
may include less than the rest of its layer.

    scripts/check_layers.py [ROOT]      check the tree at ROOT (default: this checkout)
    scripts/check_layers.py --self-test check that the check fails where it must

Exit status 0 when clean, 1 with one line per violation otherwise.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

# Bottom to top. A folder not listed here that holds C code is an error: a new
# folder must be given its place first.
LAYERS = [
    ("include", "the public API: plait.h"),
    ("base", "logging, the settings table and its parser, time, files, handles, TCP helpers, crypto"),
    ("bootstrap", "the out-of-band exchange between the ranks of a communicator"),
    ("topology", "the machine as a graph"),
    ("algorithms", "schedules, the stepper that walks them, the verifier"),
    ("transports", "how bytes reach a peer"),
    ("tuning", "the cost model and the tuner's search"),
    ("core", "communicators, planning, executors, streams, groups, the small-message path; core/cuda"),
    ("compat", "the NCCL ABI shim"),
    ("tools", "plait-info, plait-topo, plait-tune, plait-verify"),
    ("perf", "benchmarks"),
    ("tests", "tests"),
]
RANK = {name: i for i, (name, _) in enumerate(LAYERS)}
# Same rank: tools and perf may not include each other (neither does).
RANK["perf"] = RANK["tools"]

# Upward edges that are allowed, each named: (including folder, included file).
ALLOWED = {
}

# A transport is reached through its ops table (transports/transport.h): no
# code outside transports/ names a particular one. tests/ may (they check
# which transport a connection got).
TRANSPORT_ID = re.compile(r"\b(PLAIT_TP_(INPROC|SHM|NET|COUNT)|plait_transport_(shm|inproc|net)|plait_net_conn_fd"
                          r"|plait_net_socket_comm_fd)\b")
TRANSPORT_ID_FREE = ("transports", "tests")
# Folders inside a layer that may include less than the rest of it: each may
# include itself, the public header and the layers named here, nothing else
# of its own layer and no upward edge of ALLOWED.
SUBLAYERS = {
    "transports/net": (
        "the net providers (provider.h, socket.c): they sit below the transport boundary and the core, "
        "so that a provider (or an adapter around an NCCL net plugin) stands alone",
        {"base", "bootstrap"}),
}

# Quoted includes that are not paths from the root.
SPECIAL = {"plait.h", "plait_config.h"}
GENERATED = re.compile(r"^plait_kernel.*")

SOURCE = re.compile(r"\.(c|h|cu|cuh)$")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def layer_of(path):
    return path.split("/", 1)[0] if "/" in path else "."


def tracked_sources(root):
    try:
        out = subprocess.run(["git", "-C", root, "ls-files", "-co", "--exclude-standard"], check=True,
                             capture_output=True, text=True).stdout.split("\n")
    except (OSError, subprocess.CalledProcessError):
        out = []
        for d, _, names in os.walk(root):
            if "/.git" in d or "/build" in d:
                continue
            out += [os.path.relpath(os.path.join(d, n), root) for n in names]
    return sorted(p for p in out if SOURCE.search(p) and not p.startswith("tests/fixtures/"))


def check(root):
    problems = []
    for path in tracked_sources(root):
        layer = layer_of(path)
        if layer not in RANK:
            problems.append(f"{path}: folder '{layer}' is not a layer (scripts/check_layers.py LAYERS, "
                            "docs/architecture.md section 1)")
            continue
        try:
            text = open(os.path.join(root, path), encoding="utf-8", errors="replace").read()
        except OSError as e:
            problems.append(f"{path}: cannot be read: {e}")
            continue
        if layer not in TRANSPORT_ID_FREE:
            for m in TRANSPORT_ID.finditer(text):
                line = text.count("\n", 0, m.start()) + 1
                problems.append(f"{path}:{line}: names the transport '{m.group(1)}' outside transports/: ask the "
                                "pair's transport what it offers (plait_comm_pair_info, the connection's ops), "
                                "docs/architecture.md section 4")
        for m in INCLUDE.finditer(text):
            inc = m.group(1)
            line = text.count("\n", 0, m.start()) + 1
            where = f"{path}:{line}"
            if inc in SPECIAL or GENERATED.match(inc):
                continue
            if "/" not in inc or inc.startswith(("./", "../")) or "/../" in inc:
                problems.append(f'{where}: #include "{inc}" is not a path from the repository root')
                continue
            if not os.path.isfile(os.path.join(root, inc)):
                problems.append(f'{where}: #include "{inc}" names no file of the repository')
                continue
            sub = next((f for f in SUBLAYERS if path.startswith(f + "/")), None)
            if sub is not None:
                if not (inc.startswith(sub + "/") or layer_of(inc) in SUBLAYERS[sub][1]):
                    problems.append(f'{where}: {sub}/ may include only itself, '
                                    + ", ".join(f"{x}/" for x in sorted(SUBLAYERS[sub][1]))
                                    + f' and "plait.h", not "{inc}" ({SUBLAYERS[sub][0]})')
                continue
            target = layer_of(inc)
            if target not in RANK:
                problems.append(f'{where}: #include "{inc}" is in no layer')
                continue
            if RANK[target] > RANK[layer] or (RANK[target] == RANK[layer] and target != layer):
                if (layer, inc) in ALLOWED:
                    continue
                problems.append(f'{where}: {layer}/ includes "{inc}" from the layer above it ({target}/); '
                                "dependencies point down (docs/architecture.md section 1)")
    return problems


def self_test():
    """Copies this tree, plants one violation of each kind, and checks that
    each is reported (and that the clean copy is clean)."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    tmp = tempfile.mkdtemp(prefix="plait-layers-")
    failures = []
    try:
        for path in tracked_sources(here):
            dst = os.path.join(tmp, path)
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            shutil.copyfile(os.path.join(here, path), dst)
        if check(tmp):
            failures.append("the copy of the tree is not clean: " + "; ".join(check(tmp)[:3]))
        plants = [
            ("base/planted.c", '#include "core/comm.h"\n', "from the layer above"),
            ("algorithms/planted.c", '#include "transports/transport.h"\n', "from the layer above"),
            ("topology/planted.c", '#include "log.h"\n', "not a path from the repository root"),
            ("core/planted.c", '#include "../base/log.h"\n', "not a path from the repository root"),
            ("core/planted2.c", '#include "base/nothere.h"\n', "names no file"),
            ("src/planted.c", '#include "plait.h"\n', "is not a layer"),
            ("tools/planted.c", '#include "perf/common.h"\n', "from the layer above"),
            ("core/planted3.c", 'int f(const void *t) { return t == &plait_transport_shm; }\n', "outside transports/"),
            ("compat/planted.c", 'int g(const void *c) { return plait_net_conn_fd(c, 1); }\n', "outside transports/"),
            ("core/planted4.c", 'int h(const void *c) { return plait_net_socket_comm_fd(c); }\n', "outside transports/"),
            ("transports/net/planted.c", '#include "transports/transport.h"\n', "may include only itself"),
            ("transports/net/planted2.c", '#include "core/comm.h"\n', "may include only itself"),
            ("transports/net/planted3.c", '#include "topology/topo.h"\n', "may include only itself"),
        ]
        for path, line, expect in plants:
            dst = os.path.join(tmp, path)
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            with open(dst, "w") as f:
                f.write(line)
            # not tracked by git in the copy: walk instead
            got = [p for p in check(tmp) if p.startswith(path)]
            if not any(expect in p for p in got):
                failures.append(f"{path} ({line.strip()}): expected a report containing '{expect}', got {got}")
            os.remove(dst)
    finally:
        shutil.rmtree(tmp)
    for f in failures:
        print("self-test: " + f)
    print("self-test: %s" % ("FAILED" if failures else "ok"))
    return 1 if failures else 0


def main(argv):
    if len(argv) > 1 and argv[1] == "--self-test":
        return self_test()
    root = argv[1] if len(argv) > 1 else os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    problems = check(root)
    for p in problems:
        print(p)
    n = len(tracked_sources(root))
    print(f"layers: {n} files, {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
