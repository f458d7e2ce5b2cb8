"""@ember_static_archives: Debian's static archives, for the release binaries.

The release tools (//tools/release) link every library but glibc statically,
from the same object files as the ordinary build. Ember's third_party targets
name libraries with -l flags; a linker searches every -L directory for
libNAME.so and then libNAME.a before it moves on to the next directory, so a
directory that holds only the .a files, searched first, turns those -l flags
into static links without touching the targets that carry them. This
repository is that directory (lib/, symbolic links to the system archives),
plus, per library, a cc_library whose linkopts list the archive's own
dependencies in link order, as `pkg-config --static` gives them (a static
archive, unlike a shared library, does not record what it needs).

A library Debian ships no .a for stays shared: it is left out of lib/, so its
-l flag finds the .so; `shared.txt` lists them. glibc (c, m, pthread, dl,
rt, util, resolv) always stays shared.

`NOTICES` holds the Debian copyright file of every package whose archive is
in lib/: the licence texts the release ships beside the binaries that
contain those libraries.

oneDNN (libdnnl, nn's convolutions) is not among the modules: no release
tool links nn (`bazel query 'somepath(//tools/release:hub,
//third_party/dnnl)'` is empty for all four), and Debian's libdnnl-dev ships
no libdnnl.a, so a tool that did would load libdnnl.so.2 at run time; release_test's list of the libraries each binary loads would then
fail. Programs that use nn link oneDNN as a shared library, through the
consumer workspace (tools/release/consumer_archive_test.sh builds //:ember,
nn included, against the source archive).
"""

# pkg-config modules of the libraries the tools link, beside every absl_*.
_MODULES = ["grpc++", "protobuf", "libcurl", "libarchive", "openblas"]

# What the static archives need that their pkg-config files do not name:
# the C++ runtime (Bazel's toolchain links -lstdc++), libquadmath, which
# libgfortran.a (OpenBLAS's LAPACK) calls, and GNU OpenMP, which Ember's
# intra-op pool runs on (//third_party/openmp's -lgomp).
_RUNTIME = ["stdc++", "quadmath", "gomp"]

# glibc's libraries, which stay shared: the release binaries need only glibc.
_GLIBC = ["c", "m", "pthread", "dl", "rt", "util", "resolv", "anl"]

def _run(ctx, args):
    result = ctx.execute(args)
    if result.return_code != 0:
        fail("@ember_static_archives: `%s` failed: %s" % (" ".join(args), result.stderr))
    return result.stdout

def _libs(ctx, modules):
    """The -l names `pkg-config --static` gives for `modules`, in link order."""
    out = _run(ctx, ["pkg-config", "--static", "--libs-only-l"] + modules)
    return [w[2:] for w in out.replace("\n", " ").split(" ") if w.startswith("-l")]

def _archive(ctx, name):
    """The path of libNAME.a in the compiler's search path, or None."""
    path = _run(ctx, ["gcc", "-print-file-name=lib%s.a" % name]).strip()
    return path if path.startswith("/") and ctx.path(path).exists else None

def _name(soname):
    """libldap-2.5.so.0 -> ldap, libnghttp2.so.14 -> nghttp2."""
    base = soname[len("lib"):].split(".so")[0]
    dash = base.rfind("-")
    if dash > 0 and base[dash + 1:dash + 2].isdigit():
        base = base[:dash]
    return base

def _needed(ctx, name):
    """The sonames libNAME.so loads directly (its DT_NEEDED entries)."""
    library = _run(ctx, ["gcc", "-print-file-name=lib%s.so" % name]).strip()
    if name in _GLIBC or not library.startswith("/") or not ctx.path(library).exists:
        return []
    result = ctx.execute(["objdump", "-p", library])  # fails on linker scripts
    found = []
    for line in result.stdout.splitlines():
        words = [w for w in line.strip().split(" ") if w]
        if len(words) == 2 and words[0] == "NEEDED":
            found.append(words[1])
    return found

def _closure(ctx, libs, sonames):
    """`libs` plus what their shared twins load that pkg-config left out or
    put too early (libidn2.a calls libunistring, libxml2.a liblzma): such a
    library is appended, so that a static archive comes after every archive
    that calls it. Records the sonames seen in `sonames`."""
    libs = list(libs)
    done = 0
    for _ in range(2000):
        if done == len(libs):
            break
        for soname in _needed(ctx, libs[done]):
            if not soname.startswith("lib"):
                continue  # the dynamic loader
            name = _name(soname)
            sonames.setdefault(name, soname)
            if name in _GLIBC + _RUNTIME + ["gcc_s"]:
                continue
            if name not in libs or (_archive(ctx, name) and _last(libs, name) < done):
                libs.append(name)
        done += 1
    if done != len(libs):
        fail("@ember_static_archives: the libraries' dependencies do not settle: %s" % libs)
    return libs

def _last(items, item):
    return len(items) - 1 - items[::-1].index(item)

def _shared_flag(ctx, name, sonames):
    """The link flag for a library with no .a: -lNAME, or -l:SONAME when only
    its runtime package (no libNAME.so symlink from a -dev package) is
    installed."""
    if _run(ctx, ["gcc", "-print-file-name=lib%s.so" % name]).strip().startswith("/"):
        return "-l" + name
    if name in sonames:
        return "-l:" + sonames[name]
    fail("@ember_static_archives: lib%s has neither a .a nor a .so here" % name)

def _notices(ctx, static):
    """The copyright files of the Debian packages owning the archives in
    `static` (name -> path), one section per package, sorted."""
    owners = {}
    for name, path in static.items():
        real = _run(ctx, ["readlink", "-f", path]).strip()
        result = ctx.execute(["dpkg", "-S", real])
        if result.return_code != 0:
            result = ctx.execute(["dpkg", "-S", path])
        if result.return_code != 0:
            fail("@ember_static_archives: no Debian package owns %s, so its licence is unknown" % path)
        package = result.stdout.split(":")[0].strip()
        owners.setdefault(package, []).append("lib%s.a" % name)
    text = [
        "Third-party notices of the Ember tools.",
        "",
        "The release binaries contain these libraries, linked statically from",
        "Debian's packages; each section is that package's copyright file.",
        "",
    ]
    for package in sorted(owners):
        copyright = ctx.path("/usr/share/doc/%s/copyright" % package)
        if not copyright.exists:
            fail("@ember_static_archives: %s has no /usr/share/doc/%s/copyright" % (package, package))
        text += [
            "=" * 78,
            "%s (%s)" % (package, ", ".join(sorted(owners[package]))),
            "=" * 78,
            ctx.read(copyright),
            "",
        ]
    return "\n".join(text)

def _static_archives_impl(ctx):
    if not ctx.which("pkg-config"):
        fail("@ember_static_archives needs pkg-config: apt-get install pkg-config")
    absl = [
        line.split(" ")[0]
        for line in _run(ctx, ["pkg-config", "--list-all"]).splitlines()
        if line.startswith("absl_")
    ]
    sonames = {}
    per_module = {m: _closure(ctx, _libs(ctx, [m]), sonames) for m in _MODULES}
    per_module["absl"] = _closure(ctx, _libs(ctx, sorted(absl)), sonames)
    static = {}
    shared = []
    for libs in per_module.values() + [_RUNTIME]:
        for name in libs:
            if name in _GLIBC or name in static or name in shared:
                continue
            path = _archive(ctx, name)
            if path:
                static[name] = path
                ctx.symlink(path, "lib/lib%s.a" % name)
            else:
                shared.append(name)
    flags = {n: _shared_flag(ctx, n, sonames) for n in shared}
    ctx.file("NOTICES", _notices(ctx, static))
    ctx.file("shared.txt", "".join(["%s\n" % flags[n][2:].lstrip(":") for n in sorted(shared)]))
    build = [
        "# Written by the ember_static_archives rule (static_archives.bzl).",
        'package(default_visibility = ["//visibility:public"])',
        "",
        'exports_files(["NOTICES", "shared.txt"])',
        "",
        "# The archives a static link reads: a binary that links statically",
        "# passes them as additional_linker_inputs, so that they are in its",
        "# sandbox (cc_library has no such attribute in Bazel 4).",
        'filegroup(name = "archives", srcs = glob(["lib/*.a"]))',
        "",
        "# The C++ and GCC runtimes, static.",
        "cc_library(",
        '    name = "runtime",',
        '    linkopts = ["-Lexternal/%s/lib", "-static-libgcc"] + %s,' % (
            ctx.name,
            repr(["-l" + n for n in _RUNTIME]),
        ),
        ")",
        "",
    ]
    for module, libs in sorted(per_module.items()):
        build += [
            "cc_library(",
            "    name = %s," % repr(module),
            "    linkopts = %s," % repr([flags.get(n, "-l" + n) for n in libs]),
            '    deps = [":runtime"],',
            ")",
            "",
        ]
    ctx.file("BUILD.bazel", "\n".join(build))
    ctx.file("WORKSPACE", 'workspace(name = "%s")\n' % ctx.name)

ember_static_archives = repository_rule(
    implementation = _static_archives_impl,
    doc = "Links to Debian's static archives for //tools/release (see the module doc).",
    local = True,
)
