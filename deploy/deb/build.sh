#!/usr/bin/env bash
# Debian packages of the two agents, from this checkout:
#   target/deb/loopwarden-node-agent_<version>_<arch>.deb
#   target/deb/loopwarden-cooling-ctrl_<version>_<arch>.deb
# Each holds the production build of its binary (no simulator linked, no
# debug information; its symbols are kept on purpose, so that a backtrace
# or the core dump of a hung agent names its functions), its systemd
# unit, its example configuration under /etc/loopwarden/ (a conffile: an
# upgrade never overwrites it; it may hold secrets such as
# console_password_hash, so it is shipped readable by root alone and the
# postinst gives the controller's to its group, 0640), its copyright and
# its documentation; in the host agent's loopwarden-slurm (the Slurm
# drain and resume its documented actions call) and the tmpfiles.d entry
# that makes its lock directory, /run/loopwarden-slurm, and in the
# controller's a udev rule that gives the GPIO chips to group gpio.
# The maintainer scripts never enable or start a service: an agent starts
# only once its configuration is edited (docs/install.md). The
# controller's postinst makes its system user, loopwarden-cdu.
#
# Needs cargo, dpkg-deb and dpkg-shlibdeps (dpkg-dev). Run it again at
# will: it rebuilds only what changed and replaces the packages.
#   deploy/deb/build.sh            build, then package
#   deploy/deb/build.sh --no-build package what target/production holds
set -euo pipefail
cd "$(dirname "$0")/../.."
case "${1:-}" in
  "" | --no-build) ;;
  *)
    echo "usage: deploy/deb/build.sh [--no-build]" >&2
    exit 2
    ;;
esac

out=target/deb
work=$out/work
profile=production
maintainer=${DEB_MAINTAINER:-Loopwarden maintainers <maintainers@loopwarden.invalid>}

for tool in cargo dpkg-deb dpkg-shlibdeps; do
  command -v "$tool" >/dev/null || {
    echo "deploy/deb/build.sh: $tool is not installed (dpkg-shlibdeps: apt-get install dpkg-dev)" >&2
    exit 2
  }
done

# The workspace's version (every crate takes it), and this machine's
# architecture as dpkg names it.
pkgid=$(cargo pkgid --locked -p node-agent)
version=${pkgid##*[#@]}
arch=$(dpkg --print-architecture)

if [ "${1:-}" != --no-build ]; then
  cargo build --profile "$profile" --locked --no-default-features -p node-agent -p cooling-ctrl
fi

rm -rf "$work"
mkdir -p "$work/debian"
# dpkg-shlibdeps reads debian/control for the source package's name.
printf 'Source: loopwarden\n\nPackage: loopwarden-node-agent\nArchitecture: any\n\nPackage: loopwarden-cooling-ctrl\nArchitecture: any\n' \
  >"$work/debian/control"

# The Debian changelog: one entry for this version of the source
# (loopwarden), naming the commit it was built from and its date.
changelog() {
  local commit date
  commit=$(git log -1 --format='commit %H' 2>/dev/null || echo "a checkout outside git")
  date=$(git log -1 --format=%cD 2>/dev/null || date -R)
  printf 'loopwarden (%s) unstable; urgency=medium\n\n  * Built from %s.\n\n -- %s  %s\n' \
    "$version" "$commit" "$maintainer" "$date"
}

# package NAME BINARY CONF-MODE GUIDE SUMMARY DESCRIPTION [EXTRA-FILE:DEST[:MODE] ...]
package() {
  local name=$1 bin=$2 conf_mode=$3 guide=$4 summary=$5 description=$6
  shift 6
  local root=$work/debian/$name
  local doc=$root/usr/share/doc/$name
  install -d -m 0755 "$root/DEBIAN" "$root/usr/bin" "$root/usr/lib/systemd/system" \
    "$root/etc/loopwarden" "$doc"
  install -m 0755 "target/$profile/$bin" "$root/usr/bin/$bin"
  install -m 0644 "deploy/systemd/$bin.service" "$root/usr/lib/systemd/system/$bin.service"
  install -m "$conf_mode" "deploy/etc/loopwarden/$bin.toml" "$root/etc/loopwarden/$bin.toml"
  install -m 0644 docs/install.md "docs/$guide" docs/security.md "$doc/"
  sed "s/@NAME@/$name/" deploy/deb/copyright >"$doc/copyright"
  changelog | gzip -9n >"$doc/changelog.gz"
  chmod 0644 "$doc/copyright" "$doc/changelog.gz"
  # SOURCE:DEST, or SOURCE:DEST:MODE (0644 when none is given).
  local extra dest mode
  for extra in "$@"; do
    dest=${extra#*:}
    mode=0644
    case $dest in
    *:*)
      mode=${dest#*:}
      dest=${dest%%:*}
      ;;
    esac
    install -D -m "$mode" "${extra%%:*}" "$root/$dest"
  done

  # What the binary links (libc, libgcc_s); NVML is opened at run time,
  # so it is no dependency of the package.
  local depends
  depends=$(cd "$work" && dpkg-shlibdeps -O "debian/$name/usr/bin/$bin" | sed -n 's/^shlibs:Depends=//p')
  local size
  size=$(du -sk --exclude=DEBIAN "$root" | cut -f1)
  cat >"$root/DEBIAN/control" <<CONTROL
Package: $name
Version: $version
Architecture: $arch
Maintainer: $maintainer
Installed-Size: $size
Depends: $depends
Section: admin
Priority: optional
Description: $summary
$description
CONTROL
  echo "/etc/loopwarden/$bin.toml" >"$root/DEBIAN/conffiles"
  local script
  for script in postinst prerm postrm; do
    sed -e "s/@NAME@/$name/g" -e "s/@BIN@/$bin/g" "deploy/deb/$script" >"$root/DEBIAN/$script"
    chmod 0755 "$root/DEBIAN/$script"
  done
  (cd "$root" && find usr -type f -print0 | sort -z | xargs -0 md5sum >DEBIAN/md5sums)
  chmod 0644 "$root/DEBIAN/control" "$root/DEBIAN/conffiles" "$root/DEBIAN/md5sums"

  local deb=$out/${name}_${version}_${arch}.deb
  dpkg-deb --root-owner-group --build "$root" "$deb" >/dev/null
  echo "$deb ($(du -k "$deb" | cut -f1) KiB; Depends: $depends)"
}

# The host agent runs as root: its configuration is root's alone. The
# controller reads its own through its group (root:loopwarden-cdu, set by
# the postinst once that group exists).
package loopwarden-node-agent node-agent 0600 node-agent.md \
  "Loopwarden GPU host agent" \
  " The Loopwarden agent on every GPU host of a liquid-cooled hall: it
 samples every GPU, decides each GPU's health, quarantines failing ones,
 applies power-cap leases from its CDU's controller and caps on its own
 when a GPU runs hot, and reports on the site's MQTT bus.
 .
 It reads the GPUs through NVML (libnvidia-ml.so.1), which comes with
 the NVIDIA driver and is loaded at run time: install the driver; the
 package does not depend on it.
 .
 loopwarden-slurm drains and resumes a Slurm node for the agent's
 quarantine and cooling-loss actions without lifting anyone else's drain." \
  deploy/slurm/loopwarden-slurm:usr/bin/loopwarden-slurm:0755 \
  deploy/tmpfiles.d/loopwarden-slurm.conf:usr/lib/tmpfiles.d/loopwarden-slurm.conf

package loopwarden-cooling-ctrl cooling-ctrl 0640 cooling.md \
  "Loopwarden CDU controller" \
  " The Loopwarden controller on every coolant distribution unit (CDU) of
 a liquid-cooled hall: it drives the CDU over Modbus (TCP or RTU), watches
 its leak ropes on the board's GPIO lines, runs the coolant as warm and
 the pumps as slow as the GPUs' margins allow, and leases power caps to
 its hosts when cooling falls short." \
  boards/cdus/sim-cdu.toml:usr/share/doc/loopwarden-cooling-ctrl/examples/register-map.toml \
  boards/pins/sim-controller.toml:usr/share/doc/loopwarden-cooling-ctrl/examples/pins.toml \
  deploy/deb/60-loopwarden-gpio.rules:usr/lib/udev/rules.d/60-loopwarden-gpio.rules
