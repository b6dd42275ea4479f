#!/usr/bin/env bash
# The Debian package, built and checked as an operator gets it:
#
#   bash tests/packaging/deb_test.sh BUILD_DIR SOURCE_DIR
#
# 1. cpack -G DEB from BUILD_DIR (all targets built) into a temporary directory;
# 2. its contents (dpkg-deb): the programs, unit, sysusers file, udev rule, drop-ins, config and
#    policies, and the Python package where the unit and jouled look for them; the unit's
#    ExecStart=; conffiles naming every file in /etc; the libraries dpkg-shlibdeps found;
# 3. lintian: an error, or a warning not explained in packaging/debian/lintian-overrides, fails;
# 4. where this runs as root and may mount an overlay of / (in a mount namespace of its own):
#    dpkg installs the package for real in that throwaway overlay, the installed jouled starts on
#    the installed config and is asked for its devices by the installed joulectl, an edited
#    conffile survives reinstalling, and the package is removed and purged. The machine itself is
#    not touched. Elsewhere step 4 is reported as not run and the test still passes.
#
# Tools: cpack, dpkg-deb, dpkg-shlibdeps, lintian (scripts/install-deps.sh installs them); unshare,
# mount and chroot (util-linux, coreutils) for step 4.
set -euo pipefail

fail() { echo "FAIL: $*" >&2; exit 1; }

[[ $# -eq 2 ]] || fail "usage: $0 BUILD_DIR SOURCE_DIR"
build=$(realpath "$1")
source=$(realpath "$2")
for tool in cpack dpkg-deb dpkg-shlibdeps lintian; do
  command -v "$tool" >/dev/null || fail "$tool not found (scripts/install-deps.sh installs it)"
done

tmp=$(mktemp -d /var/tmp/joule-deb.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

# ---- 1. build -------------------------------------------------------------------------------
cpack -G DEB --config "$build/CPackConfig.cmake" -B "$tmp/out" >"$tmp/cpack.log" 2>&1 ||
  { cat "$tmp/cpack.log" >&2; fail "cpack did not build the package"; }
debs=("$tmp"/out/*.deb)
[[ ${#debs[@]} -eq 1 && -f ${debs[0]} ]] || fail "cpack made ${#debs[@]} .deb files, not 1"
deb=${debs[0]}
echo "ok: built $(basename "$deb") ($(du -k "$deb" | cut -f1) KiB)"

# ---- 2. contents ----------------------------------------------------------------------------
dpkg-deb -c "$deb" | awk '{print $6}' | sed 's|^\./|/|' >"$tmp/files"
expected=(
  /usr/bin/jouled /usr/bin/joulectl /usr/bin/joule-worker
  /usr/share/man/man1/jouled.1.gz /usr/share/man/man1/joulectl.1.gz /usr/share/man/man1/joule-sim.1.gz
  /usr/share/bash-completion/completions/joulectl
  /usr/lib/systemd/system/jouled.service
  /usr/lib/sysusers.d/jouled.conf
  /usr/lib/udev/rules.d/60-jouled-rapl.rules
  /usr/share/joule/drop-ins/gpu.conf /usr/share/joule/drop-ins/cluster.conf
  /usr/share/joule/python/joule/__init__.py
  /etc/jouled/jouled.toml
  /usr/share/doc/joule/copyright /usr/share/doc/joule/changelog.gz
)
for policy in "$source"/config/policies.d/*.toml; do expected+=("/etc/jouled/policies.d/$(basename "$policy")"); done
for path in "${expected[@]}"; do
  grep -qxF "$path" "$tmp/files" || fail "the package lacks $path"
done
! grep -q '__pycache__\|\.pyc$' "$tmp/files" || fail "the package carries Python byte code"
echo "ok: ${#expected[@]} expected paths in the package"

dpkg-deb -x "$deb" "$tmp/tree"
dpkg-deb -e "$deb" "$tmp/control"
# The unit is written for /usr, so the package's is the repository's, byte for byte.
cmp -s "$tmp/tree/usr/lib/systemd/system/jouled.service" "$source/systemd/jouled.service" ||
  fail "the package's jouled.service differs from systemd/jouled.service"
grep -qx 'ExecStart=/usr/bin/jouled --config /etc/jouled/jouled.toml' "$tmp/tree/usr/lib/systemd/system/jouled.service" ||
  fail "the unit's ExecStart= does not name /usr/bin/jouled and /etc/jouled/jouled.toml"
# Every file in /etc is a conffile (dpkg then keeps an administrator's edits), and only those.
diff <(grep '^/etc/.*[^/]$' "$tmp/files" | sort) <(sort "$tmp/control/conffiles") >&2 ||
  fail "conffiles and the package's files in /etc differ (<: in /etc only, >: in conffiles only)"
for script in postinst prerm postrm; do
  [[ -x $tmp/control/$script ]] || fail "$script is missing or not executable"
  sh -n "$tmp/control/$script" || fail "$script: syntax error"
done
depends=$(dpkg-deb -f "$deb" Depends)
for library in libsqlite3-0 libsystemd0 libssl3 libtorch; do
  grep -q "$library" <<<"$depends" || fail "Depends lacks $library (dpkg-shlibdeps): $depends"
done
grep -q 'systemd-sysusers' <<<"$depends" || fail "Depends lacks systemd-sysusers for the postinst: $depends"
echo "ok: unit, conffiles, maintainer scripts, Depends: $depends"

# ---- 3. lintian -----------------------------------------------------------------------------
# Errors and warnings fail; infos are printed, not counted. Overrides come from the package.
status=0
lintian --display-info --fail-on error,warning "$deb" >"$tmp/lintian.log" 2>&1 || status=$?
grep -v '^running with root privileges' "$tmp/lintian.log" | sed 's/^/   lintian: /' || true
[[ $status -eq 0 ]] || fail "lintian found errors or warnings that packaging/debian/lintian-overrides does not explain"
echo "ok: lintian: no errors, no unexplained warnings"

# ---- 4. installed for real, in a throwaway overlay of / --------------------------------------
if [[ $(id -u) -ne 0 ]] || ! unshare --mount true 2>/dev/null; then
  echo "not run: installing for real needs root and a mount namespace (unshare --mount); steps 1-3 passed"
  exit 0
fi
cp "$deb" "$tmp/joule.deb"
cat >"$tmp/installed.sh" <<'EOF'
# Runs in its own mount namespace; everything written below lands in the overlay's upper dir.
set -euo pipefail
tmp=$1
mkdir -p "$tmp/upper" "$tmp/work" "$tmp/root"
mount -t overlay overlay -o "lowerdir=/,upperdir=$tmp/upper,workdir=$tmp/work" "$tmp/root" 2>"$tmp/mount.log" || exit 77
for dir in proc dev sys; do mount --rbind "/$dir" "$tmp/root/$dir"; done
mount -t tmpfs tmpfs "$tmp/root/run"
mkdir -p "$tmp/root/var/tmp/joule-deb"
cp "$tmp/joule.deb" "$tmp/root/var/tmp/joule-deb/"
exec chroot "$tmp/root" /bin/bash -s <<'INNER'
set -euo pipefail
fail() { echo "FAIL: $*" >&2; exit 1; }
cd /var/tmp/joule-deb
export DEBIAN_FRONTEND=noninteractive
# A machine that already has joule installed gets it purged here first (in the overlay only).
dpkg --purge joule >/dev/null 2>&1 || true
dpkg -i joule.deb >dpkg.log 2>&1 || { cat dpkg.log >&2; fail "dpkg -i failed"; }
getent passwd jouled >/dev/null || fail "the postinst did not create the jouled user"
echo "ok: dpkg -i installed it; the postinst created the jouled user ($(getent passwd jouled | cut -d: -f3))"

# The installed jouled on the installed config (loopback on a free port, state in a temp dir),
# asked by the installed joulectl. It finds joule-worker beside itself and the Python package in
# /usr/share/joule/python, as under the unit.
state=$(mktemp -d /var/tmp/joule-deb/state.XXXXXX)
chmod 0755 "$state"
/usr/bin/jouled --config /etc/jouled/jouled.toml --listen 127.0.0.1:0 --state-dir "$state/db" >jouled.log 2>&1 &
pid=$!
address=""
for _ in $(seq 100); do
  address=$(grep -m 1 -o 'listening on http://127\.0\.0\.1:[0-9]*' jouled.log | sed 's|listening on ||') || true
  [[ -n $address ]] && break
  kill -0 $pid 2>/dev/null || { cat jouled.log >&2; fail "the installed jouled exited at start"; }
  sleep 0.1
done
[[ -n $address ]] || { kill $pid; cat jouled.log >&2; fail "the installed jouled did not start listening"; }
/usr/bin/joulectl --server "$address" devices >devices.txt 2>&1 || { kill $pid; cat devices.txt jouled.log >&2; fail "joulectl devices failed"; }
kill $pid
jouled_status=0
wait $pid 2>/dev/null || jouled_status=$?
# How jouled ends is the daemon's tests' concern, not the package's; said, not failed.
[[ $jouled_status -eq 0 ]] || echo "note: the installed jouled exited with status $jouled_status on SIGTERM"
grep -q '^cpu' devices.txt || { cat devices.txt >&2; fail "joulectl devices did not list cpu"; }
grep -q 'source.*/etc/jouled/jouled.toml' jouled.log || { cat jouled.log >&2; fail "jouled did not read /etc/jouled/jouled.toml"; }
grep -q 'probing with /usr/bin/joule-worker' jouled.log || { cat jouled.log >&2; fail "jouled did not find /usr/bin/joule-worker"; }
grep -q 'Python package joule from /usr/share/joule/python' jouled.log ||
  { cat jouled.log >&2; fail "jouled did not find the Python package in /usr/share/joule/python"; }
echo "ok: the installed jouled read /etc/jouled/jouled.toml, found /usr/bin/joule-worker and /usr/share/joule/python; joulectl devices answered"

# An administrator's edit of a conffile survives reinstalling (dpkg keeps the old one unasked).
echo '# edited by the administrator' >>/etc/jouled/jouled.toml
dpkg -i --force-confold joule.deb >dpkg.log 2>&1 || { cat dpkg.log >&2; fail "reinstalling failed"; }
grep -q '^# edited by the administrator' /etc/jouled/jouled.toml || fail "reinstalling lost the edit of jouled.toml"
dpkg -r joule >dpkg.log 2>&1 || { cat dpkg.log >&2; fail "dpkg -r failed"; }
[[ ! -e /usr/bin/jouled && -f /etc/jouled/jouled.toml ]] || fail "dpkg -r should remove the programs and keep the config"
dpkg -P joule >dpkg.log 2>&1 || { cat dpkg.log >&2; fail "dpkg -P failed"; }
[[ ! -e /etc/jouled/jouled.toml ]] || fail "dpkg -P left /etc/jouled/jouled.toml"
echo "ok: an edited conffile survives reinstalling; dpkg -r keeps the config, dpkg -P removes it"
INNER
EOF
status=0
unshare --mount --propagation private bash "$tmp/installed.sh" "$tmp" || status=$?
if [[ $status -eq 77 ]]; then
  echo "not run: cannot mount an overlay of / here ($(cat "$tmp/mount.log")); steps 1-3 passed"
  exit 0
fi
[[ $status -eq 0 ]] || fail "installing, running or removing the package failed"
