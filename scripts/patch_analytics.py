"""Mallard's patches to the vendored analytics.js: every path of the tag stays on the Mallard
host it was loaded from, including the ones Mallard's settings cannot reach.

Usage: python3 scripts/patch_analytics.py DIR   (scripts/vendor-analytics.sh runs it)

Each patch replaces one exact piece of the minified build. Applying the patches again changes
nothing; a piece found neither patched nor unpatched (another version of analytics.js) stops
the script with an error, so a re-vendor cannot silently drop a patch. docs/privacy.md lists
the hosts left in the files and why the tag never asks them.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import NamedTuple

POLYFILL = "babel-polyfill-7.7.0.min.js"  # @babel/polyfill's dist/polyfill.min.js, vendored


class Patch(NamedTuple):
    file: str
    why: str
    before: str
    after: str


PATCHES = (
    Patch(
        "standalone.js",
        # RemoteMetrics() with no options (the loader's error path, when the settings or a
        # chunk fail to load, and a CSP violation) posted to api.segment.io at rate 1. At rate
        # 0 by default, metrics go out only when Mallard's settings turn them on, to the
        # events host those settings name.
        "metrics are off unless the settings turn them on",
        "this.sampleRate=null!==(n=null==t?void 0:t.sampleRate)&&void 0!==n?n:1,",
        "this.sampleRate=null!==(n=null==t?void 0:t.sampleRate)&&void 0!==n?n:0,",
    ),
    Patch(
        "standalone.js",
        # The CDN (settings, chunks) comes from `analytics._cdn`, else from the src of the
        # script, which the build only accepts over https: a plain <script> tag loading the
        # tag over http fell back to https://cdn.segment.com.
        "the CDN is read from an http script src too",
        r"a=/(https:\/\/.*)\/analytics\.js\/v1\/",
        r"a=/(https?:\/\/.*)\/analytics\.js\/v1\/",
    ),
    Patch(
        "standalone.js",
        # Browsers that need polyfills (IE 11, Firefox <= 46, Edge <= 13) loaded them from
        # cdnjs.cloudflare.com; they come from the tag's own bundles path (a.p) instead.
        "old browsers' polyfill comes from the bundles path",
        'we.setAttribute("src","https://cdnjs.cloudflare.com/ajax/libs/babel-polyfill/7.7.0/'
        'polyfill.min.js")',
        f'we.setAttribute("src",a.p+"{POLYFILL}")',
    ),
)


class PatchError(Exception):
    """A piece to patch is missing: the vendored build is not the one these patches fit."""


def patch_text(name: str, text: str) -> str:
    """`text` of file `name` with every patch of that file applied (each exactly once)."""
    for p in (p for p in PATCHES if p.file == name):
        done, todo = text.count(p.after), text.count(p.before)
        if done == 1 and todo == 0:
            continue
        if done == 0 and todo == 1:
            text = text.replace(p.before, p.after)
            continue
        raise PatchError(
            f"{name}: cannot apply patch '{p.why}': the piece to replace occurs {todo} times "
            f"and its patched form {done} times (each must be exactly once); update "
            "scripts/patch_analytics.py for this version of analytics.js"
        )
    return text


def patch_dir(directory: Path) -> list[str]:
    """Apply the patches in place; the names of the files changed."""
    changed = []
    for name in sorted({p.file for p in PATCHES}):
        path = directory / name
        text = path.read_text()
        patched = patch_text(name, text)
        if patched != text:
            path.write_text(patched)
            changed.append(name)
    return changed


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: patch_analytics.py DIR")
    try:
        changed = patch_dir(Path(sys.argv[1]))
    except PatchError as e:
        sys.exit(f"patch_analytics: {e}")
    print(f"patched: {', '.join(changed) or 'nothing to do (already patched)'}")
