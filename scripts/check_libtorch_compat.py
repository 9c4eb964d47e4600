"""Checks that titan.cpp's sources compile against another libtorch release's headers.

The build uses libtorch 2.15 (the pinned wheel); the GPU machines we check on have torch 2.11, and
users build against any 2.x release from 2.11 on. A full second build (and a second 6 GB CUDA
environment) per release is too slow for CI, but the API differences between releases are in the
headers: this script downloads the torch wheel of RELEASE without its dependencies (about 500 MB,
cached in ~/.cache/titan/libtorch-headers/RELEASE), unpacks its include/ folder, and runs the
compiler on every source of the build (src/, apps/, bench/, tests/ from compile_commands.json,
or those under the folders given)
with -fsyntax-only, those headers in place of the build's libtorch headers. The build's precompiled
header is rebuilt once against those headers (BUILD/libtorch-compat/RELEASE) and used by the units
that use it in the build: parsing the libtorch headers once instead of once per unit makes the
check about three times faster. Loading that 0.6 GB header still costs each unit about 8 s, so the
unity batches of one target are checked as one unit (BUILD/libtorch-compat/RELEASE/merged/); when a
merged unit fails, its batches are checked one by one and only their errors count (an error of the
merged unit alone is a name clash between batches, not a libtorch difference). Any error fails the
check with the compiler's output.

    python scripts/check_libtorch_compat.py --build build --release 2.11.0 [--jobs 2] [src/ apps/]

Run with the project environment's Python (scripts/python_env.sh), whose pip fetches the wheel.
"""
import argparse
import concurrent.futures
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import zipfile


def cache_root():
    return os.environ.get("TITAN_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "titan")


def headers_for(release):
    """The include/ folder of torch RELEASE's wheel, downloaded and unpacked once."""
    target = os.path.join(cache_root(), "libtorch-headers", release)
    stamp = os.path.join(target, ".unpacked")
    include = os.path.join(target, "include")
    if os.path.exists(stamp):
        return include
    shutil.rmtree(target, ignore_errors=True)
    staging = target + ".tmp.%d" % os.getpid()
    os.makedirs(staging)
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-input", "-q",
                    "-d", staging, "torch==" + release], check=True)
    wheels = [f for f in os.listdir(staging) if f.endswith(".whl")]
    if len(wheels) != 1:
        sys.exit("check_libtorch_compat: expected one torch wheel in %s, found %s" % (staging, wheels))
    wheel = os.path.join(staging, wheels[0])
    with zipfile.ZipFile(wheel) as z:
        members = [m for m in z.namelist() if m.startswith("torch/include/")]
        z.extractall(staging, members)
    os.rename(os.path.join(staging, "torch", "include"), os.path.join(staging, "include"))
    shutil.rmtree(os.path.join(staging, "torch"))
    os.remove(wheel)
    with open(os.path.join(staging, ".unpacked"), "w") as f:
        f.write(wheels[0] + "\n")
    os.rename(staging, target)
    return include


def rewrite(command, torch_include, new_include, pch=None):
    """The compile command with libtorch's include dirs swapped and -fsyntax-only. A unit that
    includes the build's PCH header includes PCH instead (the same header, precompiled against
    the other headers), or nothing when PCH is None."""
    args = shlex.split(command)
    out = []
    i = 0
    while i < len(args):
        a = args[i]
        if a == "-include" and i + 1 < len(args) and pch:
            out += ["-include", pch]
            i += 2
            continue
        if a in ("-include", "-o") and i + 1 < len(args):
            i += 2  # the PCH of the 2.15 build; the object file
            continue
        if a == "-c" or (a == "-Winvalid-pch" and not pch):
            i += 1
            continue
        if a == "-isystem" and i + 1 < len(args) and args[i + 1].startswith(torch_include):
            out += ["-isystem", new_include + args[i + 1][len(torch_include):]]
            i += 2
            continue
        out.append(a)
        i += 1
    return out + ["-fsyntax-only"]


def precompile(build, release, commands, torch_include, new_include):
    """The build's PCH header (the one compile units -include) compiled against NEW_INCLUDE with
    the flags of a unit that uses it, as BUILD/libtorch-compat/RELEASE/<header>(.gch); None when
    no unit uses a PCH. GCC uses the .gch beside the header and falls back to the header itself
    for a unit whose flags do not match (slower, same verdict)."""
    for c in commands:
        args = shlex.split(c["command"])
        if "-include" not in args or "-x" in args:  # "-x c++-header": the build's own PCH
            continue
        header = args[args.index("-include") + 1]
        folder = os.path.join(os.path.abspath(build), "libtorch-compat", release)
        os.makedirs(folder, exist_ok=True)
        copy = os.path.join(folder, os.path.basename(header))
        shutil.copyfile(header, copy)
        cmd = rewrite(c["command"], torch_include, new_include, copy)
        at = cmd.index("-include")
        cmd = cmd[:at] + cmd[at + 2:]  # the header is the input now, not a prefix
        cmd = [x for x in cmd if x not in ("-fsyntax-only", c["file"])]
        took = time.time()
        r = subprocess.run(cmd + ["-x", "c++-header", copy, "-o", copy + ".gch"],
                           cwd=c["directory"], capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit("check_libtorch_compat: the precompiled header does not compile against "
                     "torch %s headers:\n%s" % (release, r.stderr[-6000:]))
        print("check_libtorch_compat: precompiled %s against torch %s headers (%.0f s)"
              % (os.path.basename(header), release, time.time() - took), flush=True)
        return copy
    return None


def merge_batches(build, release, units, by_file):
    """The units to compile: every unity batch of one target (same folder, same command) as one
    generated file that includes their sources, each other unit as itself. Maps each unit's path
    to the build's units it stands for. The merged unit is given the first batch's entry in
    BY_FILE, with its own path."""
    groups = {}
    for unit in sorted(units):
        c = by_file[unit]
        folder = os.path.dirname(unit)
        if os.path.basename(folder) != "Unity":
            groups[unit] = [unit]
            continue
        # The same command but for the unit's own name (its path and its object file's).
        key = (folder, c["directory"], c["command"].replace(os.path.basename(unit), "<unit>"))
        groups.setdefault(key, []).append(unit)
    out_dir = os.path.join(os.path.abspath(build), "libtorch-compat", release, "merged")
    os.makedirs(out_dir, exist_ok=True)
    merged = {}
    for key, members in groups.items():
        if isinstance(key, str) or len(members) == 1:
            merged[members[0]] = members
            continue
        folder = key[0]
        target = os.path.basename(os.path.dirname(folder))  # CMakeFiles/<target>.dir
        path = os.path.join(out_dir, target.replace(".dir", "") + ".cxx")
        with open(path, "w") as f:
            f.write("/* generated by check_libtorch_compat.py: the unity batches of %s */\n"
                    % target)
            for m in members:
                for source in units[m]:
                    f.write('#include "%s"\n' % source)
        first = by_file[members[0]]
        by_file[path] = dict(first, file=path,
                             command=first["command"].replace(members[0], path))
        merged[path] = members
    return merged


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--build", default="build", help="a configured build folder (compile_commands.json)")
    p.add_argument("--release", default="2.11.0", help="torch release whose headers to check against")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    p.add_argument("only", nargs="*",
                   help="check only sources under these folders of the repository (src/, apps/)")
    a = p.parse_args()

    commands = json.load(open(os.path.join(a.build, "compile_commands.json")))
    torch_include = None
    for c in commands:
        for arg in shlex.split(c["command"]):
            if arg.endswith("/torch/include"):
                torch_include = arg
                break
        if torch_include:
            break
    if not torch_include:
        sys.exit("check_libtorch_compat: no torch/include directory in %s/compile_commands.json"
                 % a.build)
    new_include = headers_for(a.release)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    # A unity build (CMAKE_UNITY_BUILD) compiles generated files that #include several sources:
    # each is checked as one unit, selected and reported by the sources it holds.
    units = {}
    for c in commands:
        path = c["file"]
        if path.endswith(".cpp"):
            units[path] = [path]
        elif os.sep + "Unity" + os.sep in path:
            with open(path) as f:
                units[path] = re.findall(r'^#include "(.+\.cpp)"', f.read(), re.M)
    if a.only:
        units = {u: m for u, m in units.items()
                 if any(os.path.relpath(s, root).startswith(o) for s in m for o in a.only)}
    if not units:
        sys.exit("check_libtorch_compat: no sources to check in %s/compile_commands.json"
                 % a.build)
    by_file = {c["file"]: c for c in commands}
    start = time.time()
    pch = precompile(a.build, a.release, commands, torch_include, new_include)
    merged = merge_batches(a.build, a.release, units, by_file)

    def check(unit):
        c = by_file[unit]
        r = subprocess.run(rewrite(c["command"], torch_include, new_include, pch),
                           cwd=c["directory"], capture_output=True, text=True)
        return unit, r.returncode, r.stderr

    failures = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=a.jobs) as pool:
        # The biggest units first, so that no long one starts last.
        order = sorted(merged, key=lambda u: (-len(merged[u]), u))
        suspects = []
        for unit, code, err in pool.map(check, order):
            if code == 0:
                continue
            if len(merged[unit]) == 1:
                failures.append((merged[unit][0], err))
            else:
                suspects.append((unit, err))
        for unit, err in suspects:
            found = [(u, e) for u, code, e in pool.map(check, merged[unit]) if code != 0]
            failures += found
            if not found:
                errors = [l for l in err.splitlines() if "error" in l] or ["?"]
                print("check_libtorch_compat: note: %s fails only as one unit (a name clash "
                      "between its unity batches, not a libtorch difference): %s"
                      % (unit, errors[0]), flush=True)
    took = time.time() - start
    for unit, err in failures:
        print("== %s\n%s" % (" ".join(units[unit]), err[-6000:]), file=sys.stderr)
    sources = sum(len(m) for m in units.values())
    failed = sum(len(units[u]) for u, _ in failures)
    print("check_libtorch_compat: %d of %d sources (%d unity batches in %d compile units) compile "
          "against torch %s headers (%.0f s)"
          % (sources - failed, sources, len(units), len(merged), a.release, took))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
