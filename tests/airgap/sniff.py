"""What reached the sink of the air-gapped namespace (scripts/airgap.sh starts this on the sink's
peer): one line per packet, its destination and, for DNS, the name asked, so a failing
`make test-airgap` says which host something tried to reach. Root only (a raw packet socket)."""

from __future__ import annotations

import socket
import struct
import sys


def describe(frame: bytes) -> str:
    ethertype = struct.unpack("!H", frame[12:14])[0]
    ip = frame[14:]
    if ethertype == 0x0806:
        return "arp"
    if ethertype != 0x0800:
        return f"ethertype {ethertype:#06x}"
    proto, dst = ip[9], socket.inet_ntoa(ip[16:20])
    payload = ip[(ip[0] & 0x0F) * 4 :]
    port = struct.unpack("!H", payload[2:4])[0] if proto in (6, 17) else 0
    kind = {6: "tcp", 17: "udp", 1: "icmp"}.get(proto, f"proto {proto}")
    line = f"{kind} {dst}:{port}"
    if proto == 17 and port == 53:
        labels, i = [], 8 + 12  # UDP header, DNS header
        while i < len(payload) and payload[i]:
            labels.append(payload[i + 1 : i + 1 + payload[i]].decode(errors="replace"))
            i += 1 + payload[i]
        line += f" dns {'.'.join(labels)}"
    return line


def main(iface: str, out: str) -> None:
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.ntohs(0x0003))
    s.bind((iface, 0))
    with open(out, "a", buffering=1) as log:
        while True:
            log.write(describe(s.recv(65535)) + "\n")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
