#!/usr/bin/env bash
# `make test-airgap`: the air-gapped tests (pytest -m airgap) in a network namespace of their own
# (unshare --net, root only) with loopback up and one more interface, sink0: the default route,
# whose peer answers nothing. A packet meant for any other host (a DNS lookup, a connect) leaves
# through sink0 and is counted; the tests and this script fail unless that count stays 0.
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
sink_tx() { ip -s -j link show sink0 | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["stats64"]["tx"]["packets"])'; }

if [ "${1:-}" != "--inside" ]; then
  if [ "$(id -u)" != 0 ] || ! command -v unshare >/dev/null || ! command -v ip >/dev/null; then
    echo "make test-airgap: FAILED, it needs root, unshare(1) and ip(8) to make a network namespace" \
         "(uid $(id -u)); nothing was tested" >&2
    exit 2
  fi
  exec unshare --net -- "$0" --inside "$@"
fi
shift
ip link set lo up
ip link add sink0 type veth peer name sink1
for dev in sink0 sink1; do ip link set "$dev" addrgenmode none; ip link set "$dev" up; done
ip addr add 192.0.2.1/24 dev sink0
ip route add default via 192.0.2.2 dev sink0
ip neigh add 192.0.2.2 lladdr 02:00:00:00:00:02 dev sink0 nud permanent
cd "$REPO"
SENT="$(mktemp)"
python3 tests/airgap/sniff.py sink1 "$SENT" &
sniffer=$!
trap 'kill "$sniffer" 2>/dev/null; rm -f "$SENT"' EXIT
before="$(sink_tx)"
status=0
MALLARD_AIRGAP_SINK=sink0 MALLARD_AIRGAP_SENT="$SENT" "$REPO/.venv/bin/python" -m pytest -m airgap tests/airgap -p no:cacheprovider "$@" || status=$?
after="$(sink_tx)"
if [ "$after" != "$before" ]; then
  echo "make test-airgap: FAILED, $((after - before)) packet(s) were sent off the machine:" >&2
  sort "$SENT" | uniq -c >&2
  exit 1
fi
echo "make test-airgap: no packet left loopback ($before before, $after after)"
exit "$status"
