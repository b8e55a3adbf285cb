# Sourced by the scripts/vendor-*.sh scripts. npm_unpack NAME VERSION DEST: the package from the
# npm registry unpacked in a temp dir (removed on exit), the shell there (its files under
# package/), and DEST emptied for what the script copies in.
npm_unpack() {
  local name="$1" version="$2" dest="$3"
  WORK="$(mktemp -d)"
  trap 'rm -rf "$WORK"' EXIT
  cd "$WORK"
  npm pack --silent "$name@$version" >/dev/null
  tar xzf ./*.tgz
  rm -rf "$dest"
  mkdir -p "$dest"
}
