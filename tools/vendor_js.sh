#!/usr/bin/env bash
# Vendors the graph-layout library of etlab.visualizer from npm into etlab/visualizer/static.
#
# The bundle is committed, so installing etlab and running its tests need no npm; run this only to
# change the version. Provenance: npm package `elkjs` (Eclipse Layout Kernel compiled to JS,
# EPL-2.0, https://github.com/kieler/elkjs), file lib/elk.bundled.js, copied unchanged next to a
# VENDOR.txt that records name, version, tarball integrity and sha256.
set -euo pipefail

ELKJS_VERSION="${ELKJS_VERSION:-0.12.1}"
root="$(cd "$(dirname "$0")/.." && pwd)"
dest="$root/etlab/visualizer/static"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

cd "$work"
npm pack --silent "elkjs@${ELKJS_VERSION}" >/dev/null
tar -xzf "elkjs-${ELKJS_VERSION}.tgz"
integrity="$(npm view "elkjs@${ELKJS_VERSION}" dist.integrity)"

mkdir -p "$dest"
cp package/lib/elk.bundled.js "$dest/elk.bundled.js"
cp package/LICENSE.md "$dest/elk.LICENSE.md" 2>/dev/null || true
sha="$(sha256sum "$dest/elk.bundled.js" | cut -d' ' -f1)"
cat > "$dest/VENDOR.txt" <<TXT
elk.bundled.js: npm package elkjs@${ELKJS_VERSION}, file lib/elk.bundled.js (unchanged)
npm integrity: ${integrity}
sha256: ${sha}
license: EPL-2.0 (elk.LICENSE.md)
refresh: tools/vendor_js.sh (ELKJS_VERSION=x.y.z tools/vendor_js.sh)
TXT
echo "vendored elkjs ${ELKJS_VERSION} into ${dest}"
