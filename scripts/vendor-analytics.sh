#!/usr/bin/env bash
# Vendor Segment's analytics.js (@segment/analytics-next, MIT) into collector/static so the
# collector serves the tag and every chunk it can load lazily: a page never contacts a public CDN.
# scripts/patch_analytics.py then patches the paths Mallard's settings cannot reach (docs/privacy.md).
# Usage: scripts/vendor-analytics.sh [VERSION]   (default: the pinned version below)
set -euo pipefail
VERSION="${1:-1.84.3}"
REPO="$(cd "$(dirname "$0")/.." && pwd)"
DEST="$REPO/collector/static/analytics-next/$VERSION"
# shellcheck source=scripts/npm-unpack.sh
source "$REPO/scripts/npm-unpack.sh"
npm_unpack "@segment/analytics-next" "$VERSION" "$DEST"
# The standalone build plus its webpack chunks (named <chunk>.bundle.<contenthash>.js); the
# .gz and source-map copies are not needed to run the tag.
cp package/dist/umd/standalone.js "$DEST/"
cp package/dist/umd/*.bundle.*.js "$DEST/"
rm -f "$DEST"/*.gz "$DEST"/*.map
cp package/LICENSE.MD "$DEST/LICENSE.md"
# The polyfill old browsers need (analytics.js used to fetch it from cdnjs), @babel/polyfill (MIT).
mkdir polyfill
npm pack --silent "@babel/polyfill@7.7.0" >/dev/null
tar xzf babel-polyfill-7.7.0.tgz -C polyfill
cp polyfill/package/dist/polyfill.min.js "$DEST/babel-polyfill-7.7.0.min.js"
cp polyfill/package/LICENSE "$DEST/LICENSE-babel-polyfill.md"
python3 "$REPO/scripts/patch_analytics.py" "$DEST"
echo "$VERSION" > "$DEST/VERSION"
echo "vendored @segment/analytics-next@$VERSION into ${DEST#"$REPO"/}:"
ls "$DEST"
