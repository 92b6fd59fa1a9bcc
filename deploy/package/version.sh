#!/bin/sh
# version.sh VERSION: the package version of podgate's VERSION (git describe --tags --always
# --dirty). A release tag loses its "v" and sorts after the tag for later commits
# (v1.2.0 -> 1.2.0, v1.2.0-3-gabc -> 1.2.0+3.gabc); without a tag the version is
# 0.0.0+git<commit time>.<VERSION>, so that each commit's package sorts after the one before.
set -eu
v=${1:?usage: version.sh VERSION}
case $v in
v[0-9]*) echo "${v#v}" | sed 's/-/+/; s/-/./g' ;;
*) echo "0.0.0+git$(git log -1 --format=%cd --date=format:%Y%m%d%H%M%S 2>/dev/null).$v" | tr -- - . ;;
esac
