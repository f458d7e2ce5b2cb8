#!/usr/bin/env bash
# Packs the statically linked tools into the release artifacts (run by the
# ember_release rule, release.bzl):
#   OUT/ember-tools-<version>-linux-x86_64.tar.gz
#       ember-tools-<version>-linux-x86_64/{bin/<tool>, share/man/man1/<tool>.1,
#       share/doc/ember-tools/SHARED_LIBRARIES, LICENSE, THIRD_PARTY_NOTICES,
#       SHA256SUMS}
#       (SHA256SUMS: of every other file, `sha256sum -c SHA256SUMS` inside)
#   OUT/ember-tools_<version>_amd64.deb   the tools under /usr/bin, Depends
#       computed by dpkg-shlibdeps from the binaries
#   OUT/SHA256SUMS                        of the two files above
# Both archives are reproducible: sorted, owned by root, dated SOURCE_DATE_EPOCH (0).
#
# usage: package.sh OUT VERSION_FILE LICENSE NOTICES TOOL_BINARY...
set -euo pipefail
out=$1 version_file=$2 license=$3 notices=$4
shift 4
version=$(tr -d '[:space:]' <"$version_file")
name="ember-tools-$version-linux-x86_64"
export SOURCE_DATE_EPOCH=0 LC_ALL=C
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
stage="$work/$name"
mkdir -p "$stage/bin" "$stage/share/man/man1" "$stage/share/doc/ember-tools"

# A man page from the tool's --help: the first usage line is the synopsis,
# the whole text the description (it names the exit codes).
man_page() {
  local tool=$1 help=$2
  printf '.TH %s 1 "" "ember-tools %s" "Ember tools"\n' "$(tr a-z A-Z <<<"$tool")" "$version"
  printf '.SH NAME\n%s \\- %s\n' "$tool" "$3"
  printf '.SH SYNOPSIS\n.nf\n%s\n.fi\n' "$(sed -n '1s/^usage: //p' <<<"$help" | sed 's/\\/\\e/g')"
  printf '.SH DESCRIPTION\n.nf\n%s\n.fi\n' "$(sed 's/\\/\\e/g; s/^\./\\\&./' <<<"$help")"
  printf '.SH VERSION\n%s\n' "$("$stage/bin/$tool" --version)"
}
declare -A summary=(
  [launch]="start and supervise the workers of a distributed job"
  [shm_manager]="clean up the shared memory of processes that died"
  [hub]="fetch hub repositories and weights from the command line"
  [lighthouse]="decide the quorums of fault-tolerant jobs' replica groups"
)
for binary in "$@"; do
  tool=$(basename "$binary")
  [[ -n "${summary[$tool]:-}" ]] || { echo "package.sh: unknown tool $binary" >&2; exit 1; }
  install -m 0755 "$binary" "$stage/bin/$tool"
  strip --strip-unneeded "$stage/bin/$tool"
  help=$("$stage/bin/$tool" --help)
  man_page "$tool" "$help" "${summary[$tool]}" >"$stage/share/man/man1/$tool.1"
done
install -m 0644 "$license" "$stage/LICENSE"
install -m 0644 "$notices" "$stage/THIRD_PARTY_NOTICES"
# The shared libraries each binary still loads besides glibc's (those Debian
# ships no static archive for; README.md "Installing the tools").
for binary in "$stage"/bin/*; do
  printf '%s:' "$(basename "$binary")"
  objdump -p "$binary" | awk '$1 == "NEEDED" { print $2 }' |
    { grep -Ev '^(libc|libm|libpthread|libdl|librt|libutil|libresolv)\.so|^ld-linux' || true; } |
    sed 's/^/ /' | tr -d '\n'
  echo
done >"$stage/share/doc/ember-tools/SHARED_LIBRARIES"
(cd "$stage" && find . -type f ! -name SHA256SUMS | sed 's|^\./||' | sort | xargs sha256sum >SHA256SUMS)
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$work" -cf - "$name" |
  gzip -9n >"$out/$name.tar.gz"

# The .deb: same binaries and pages, Depends on the packages of the shared
# libraries they still load (dpkg-shlibdeps reads the installed packages'
# symbols files, so the versions are the ones the binaries need).
deb="$work/deb"
mkdir -p "$deb/DEBIAN" "$deb/usr/bin" "$deb/usr/share/man/man1" "$deb/usr/share/doc/ember-tools"
cp -p "$stage"/bin/* "$deb/usr/bin/"
for page in "$stage"/share/man/man1/*.1; do gzip -9n <"$page" >"$deb/usr/share/man/man1/$(basename "$page").gz"; done
install -m 0644 "$license" "$deb/usr/share/doc/ember-tools/copyright"
install -m 0644 "$notices" "$deb/usr/share/doc/ember-tools/THIRD_PARTY_NOTICES"
mkdir -p "$work/src/debian"
printf 'Source: ember\n\nPackage: ember-tools\nArchitecture: amd64\n' >"$work/src/debian/control"
depends=$(cd "$work/src" && dpkg-shlibdeps -O "$deb"/usr/bin/* 2>/dev/null | sed -n 's/^shlibs:Depends=//p')
[[ -n "$depends" ]] || { echo "package.sh: dpkg-shlibdeps computed no Depends" >&2; exit 1; }
cat >"$deb/DEBIAN/control" <<END
Package: ember-tools
Version: $version
Architecture: amd64
Maintainer: The Ember authors <ember-tools@localhost>
Depends: $depends
Section: devel
Priority: optional
Installed-Size: $(du -sk --exclude=DEBIAN "$deb" | cut -f1)
Description: Ember's command-line tools: launch, shm_manager, hub, lighthouse
 launch starts the workers of a distributed job with PyTorch's launcher
 environment; shm_manager unlinks the shared memory of processes that died
 (Ember's file_system sharing strategy); hub fetches hub repositories and
 weights; lighthouse decides the quorums of fault-tolerant jobs.
END
find "$deb" -exec touch -h -d @0 {} +
dpkg-deb --root-owner-group -Zxz --build "$deb" "$out/ember-tools_${version}_amd64.deb" >/dev/null
(cd "$out" && sha256sum "$name.tar.gz" "ember-tools_${version}_amd64.deb" >SHA256SUMS)
