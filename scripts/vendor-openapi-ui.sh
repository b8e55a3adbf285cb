#!/usr/bin/env bash
# Vendor Swagger UI (swagger-ui-dist, Apache-2.0) into collector/static so /schema renders the
# OpenAPI document with no public CDN: the server serves the bundle, its preset, its CSS and its
# icon itself (mallard/app.py points Litestar's SwaggerRenderPlugin at them).
# Usage: scripts/vendor-openapi-ui.sh [VERSION]   (default: the pinned version below; bump
# SWAGGER_UI_VERSION in mallard/app.py with it)
set -euo pipefail
VERSION="${1:-5.35.0}"
REPO="$(cd "$(dirname "$0")/.." && pwd)"
DEST="$REPO/collector/static/swagger-ui-dist/$VERSION"
# shellcheck source=scripts/npm-unpack.sh
source "$REPO/scripts/npm-unpack.sh"
npm_unpack "swagger-ui-dist" "$VERSION" "$DEST"
# Only what the page loads: the UMD bundle, the standalone preset (the top bar layout), the
# stylesheet and an icon; the ES bundles, the sample index.html and the source maps are not.
for f in swagger-ui-bundle.js swagger-ui-standalone-preset.js swagger-ui.css favicon-32x32.png \
  LICENSE NOTICE; do
  cp "package/$f" "$DEST/"
done
echo "$VERSION" > "$DEST/VERSION"
echo "vendored swagger-ui-dist@$VERSION into ${DEST#"$REPO"/}:"
ls "$DEST"
