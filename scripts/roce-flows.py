#!/usr/bin/env python3
"""roce-flows.py - RoCE v2 UDP source ports per QP and per connection, from a packet capture.

    scripts/roce-flows.py --local-ip ADDR [--expect-data-qps N] CAPTURE.pcap CCL_LOG

ADDR: the IPv4 address of the capturing host, whose rank wrote CCL_LOG (the two ends of a
connection may have equal QP numbers, so the address tells the directions apart).
CAPTURE.pcap: a libpcap file of Ethernet frames (tcpdump -w, any snap length of at least 54
bytes) holding RoCE v2 packets (UDP destination port 4791). CCL_LOG: the log of the ccl rank
on the capturing host at CCL_DEBUG=trace CCL_DEBUG_SUBSYS=net, whose line for each verbs
connection lists its QP pairs and the source port ccl's flow label gives each
("... UDP source ports (local>remote QP:port, control QP first) 17>18:49459 19>20:49460 ...").

For every connection in the log it prints, per QP pair (control QP first) and direction, the
source ports seen, the packets and the RDMA WRITE payload bytes; then the number of distinct
source ports per connection and direction. It checks that
  - each QP pair's packets, both ways, carry exactly the port the log announced (the device
    derives the port from the flow label, and both ends agree on it);
  - the data QPs of a connection use as many distinct ports as there are data QPs (and the
    control QP yet another), in each direction;
  - with --expect-data-qps N, each connection has N data QPs and each carried RDMA writes both
    ways.
The column "label 0" shows the port the device would have chosen itself without a label
(rdma_get_udp_sport with a zero flow label), for comparison.
Exit status: 0 all checks passed, 1 a check failed, 2 bad input.
"""
import argparse
import collections
import re
import struct
import sys

ROCE_PORT = 4791
SPORT_MIN = 0xC000


def kernel_flow_label(lqpn, rqpn):
    """rdma_calc_flow_label (include/rdma/ib_verbs.h)."""
    v = (lqpn * rqpn) & 0xFFFFFFFFFFFFFFFF
    v ^= v >> 20
    v ^= v >> 40
    return v & 0xFFFFF


def label_to_sport(fl):
    """rdma_flow_label_to_udp_sport."""
    fl &= 0xFFFFF
    return ((fl & 0x3FFF) ^ (fl >> 14)) | SPORT_MIN


def opclass(op):
    """The kind of an RC BTH opcode."""
    if 0x06 <= op <= 0x0B:
        return "write"
    if op <= 0x05:
        return "send"
    if op == 0x11:
        return "ack"
    return "other"


def packets(path):
    """(src ip, dst ip, sport, dest qpn, opcode, udp payload bytes) of each RoCE v2 packet."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 24:
        raise ValueError(f"{path}: not a pcap file")
    magic = data[:4]
    if magic in (b"\xd4\xc3\xb2\xa1", b"\x4d\x3c\xb2\xa1"):
        end = "<"
    elif magic in (b"\xa1\xb2\xc3\xd4", b"\xa1\xb2\x3c\x4d"):
        end = ">"
    else:
        raise ValueError(f"{path}: not a pcap file (pcapng is not read; use tcpdump -w)")
    linktype = struct.unpack(end + "I", data[20:24])[0]
    if linktype != 1:
        raise ValueError(f"{path}: link type {linktype}, expected Ethernet (1)")
    off = 24
    while off + 16 <= len(data):
        _, _, incl, _ = struct.unpack(end + "IIII", data[off:off + 16])
        frame = data[off + 16:off + 16 + incl]
        off += 16 + incl
        eth = 14
        ethertype = struct.unpack(">H", frame[12:14])[0] if len(frame) >= 14 else 0
        if ethertype == 0x8100 and len(frame) >= 18:
            ethertype = struct.unpack(">H", frame[16:18])[0]
            eth = 18
        if ethertype != 0x0800 or len(frame) < eth + 20:
            continue
        ihl = (frame[eth] & 0x0F) * 4
        if frame[eth + 9] != 17:
            continue
        src = ".".join(str(b) for b in frame[eth + 12:eth + 16])
        dst = ".".join(str(b) for b in frame[eth + 16:eth + 20])
        udp = eth + ihl
        if len(frame) < udp + 8 + 12:
            continue
        sport, dport, ulen = struct.unpack(">HHH", frame[udp:udp + 6])
        if dport != ROCE_PORT:
            continue
        bth = udp + 8
        op = frame[bth]
        dqpn = int.from_bytes(frame[bth + 5:bth + 8], "big")
        yield src, dst, sport, dqpn, op, ulen - 8


def connections(path):
    """Per connection in the ccl log: [(local qpn, remote qpn, announced port), ...]."""
    conns = []
    pat = re.compile(r"connected to peer (\d+):.*UDP source ports \([^)]*\) ((?:\d+>\d+:\d+ ?)+)")
    with open(path, errors="replace") as f:
        for line in f:
            m = pat.search(line)
            if m:
                qps = [tuple(int(x) for x in re.split("[>:]", t)) for t in m.group(2).split()]
                conns.append((int(m.group(1)), qps))
    return conns


# Long: one report written top to bottom (the packets grouped by destination QP, then every
# check of the connection's QPs against them); each check reads the tables built at its start.
def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--local-ip", required=True)
    ap.add_argument("--expect-data-qps", type=int)
    ap.add_argument("pcap")
    ap.add_argument("log")
    a = ap.parse_args()
    try:
        pkts = list(packets(a.pcap))
        conns = connections(a.log)
    except (OSError, ValueError) as e:
        print(f"roce-flows: {e}", file=sys.stderr)
        return 2
    if not conns:
        print(f"roce-flows: no connection line in {a.log} (CCL_DEBUG=trace CCL_DEBUG_SUBSYS=net?)",
              file=sys.stderr)
        return 2
    if not pkts:
        print(f"roce-flows: no RoCE v2 packet in {a.pcap}", file=sys.stderr)
        return 2

    # Group by (source address, destination QP): the QP pair and direction a packet belongs to.
    by_dest = collections.defaultdict(lambda: {"ports": collections.Counter(), "pkts": 0,
                                               "write": 0, "kinds": collections.Counter()})
    for src, dst, sport, dqpn, op, plen in pkts:
        g = by_dest[(src, dst, dqpn)]
        g["ports"][sport] += 1
        g["pkts"] += 1
        g["kinds"][opclass(op)] += 1
        if opclass(op) == "write":
            g["write"] += plen
    hosts = sorted({(s, d) for s, d, *_ in pkts})
    print(f"{len(pkts)} RoCE v2 packets between {', '.join(f'{s}->{d}' for s, d in hosts)}")

    ok = True
    used = set()

    def fail(msg):
        nonlocal ok
        ok = False
        print(f"FAILED: {msg}")

    local_ip = a.local_ip
    peers = {d for s, d, _ in by_dest if s == local_ip} | {s for s, d, _ in by_dest if d == local_ip}
    if len(peers) != 1:
        print(f"roce-flows: expected packets between {local_ip} and one other host, "
              f"found {sorted(peers) or 'none'}", file=sys.stderr)
        return 2
    peer_ip = peers.pop()
    if len(conns) != 1:
        # Ranks of one host towards the same other host would share the pair of addresses; the
        # capture then cannot tell their connections apart by address alone.
        print(f"roce-flows: {len(conns)} connections in {a.log}; expected one", file=sys.stderr)
        return 2
    for peer, qps in conns:
        ndata = len(qps) - 1
        print(f"\nconnection to peer {peer} ({local_ip} <-> {peer_ip}): {ndata} data QPs")
        print(f"  {'QP':<8} {'local>remote':>13} {'port':>6} {'label 0':>8}  "
              f"{'out: ports seen':<16} {'pkts':>7} {'write MB':>9}  "
              f"{'in: ports seen':<16} {'pkts':>7} {'write MB':>9}")
        seen = {"out": [], "in": []}
        for k, (lq, rq, port) in enumerate(qps):
            name = "control" if k == 0 else f"data {k}"
            row = []
            for way, key in (("out", (local_ip, peer_ip, rq)), ("in", (peer_ip, local_ip, lq))):
                used.add(key)
                g = by_dest.get(key)
                if g is None:
                    row.append(("-", 0, 0.0))
                    if k > 0 and a.expect_data_qps:
                        fail(f"peer {peer} {name} ({way}): no packets")
                    continue
                ports = sorted(g["ports"])
                row.append((",".join(str(p) for p in ports), g["pkts"], g["write"] / 1e6))
                seen[way].extend(ports)
                if ports != [port]:
                    fail(f"peer {peer} {name} ({way}, to QP {key[2]}): ports {ports}, announced {port}")
                if k > 0 and a.expect_data_qps and g["kinds"]["write"] == 0:
                    fail(f"peer {peer} {name} ({way}): carried no RDMA write")
            dflt = label_to_sport(kernel_flow_label(lq, rq))
            print(f"  {name:<8} {f'{lq}>{rq}':>13} {port:>6} {dflt:>8}  "
                  f"{row[0][0]:<16} {row[0][1]:>7} {row[0][2]:>9.2f}  "
                  f"{row[1][0]:<16} {row[1][1]:>7} {row[1][2]:>9.2f}")
        for way in ("out", "in"):
            d = len(set(seen[way]))
            data_ports = set(p for lq, rq, p in qps[1:])
            print(f"  distinct UDP source ports, {way} ({local_ip if way == 'out' else peer_ip} -> "
                  f"{peer_ip if way == 'out' else local_ip}): {d} "
                  f"({len(data_ports & set(seen[way]))} on data QPs, control QP "
                  f"{'apart' if qps[0][2] not in data_ports else 'SHARED'})")
        if len({p for _, _, p in qps}) != len(qps):
            fail(f"peer {peer}: announced ports are not distinct: {[p for _, _, p in qps]}")
        if a.expect_data_qps is not None and ndata != a.expect_data_qps:
            fail(f"peer {peer}: {ndata} data QPs, expected {a.expect_data_qps}")
        for way in ("out", "in"):
            got = len(set(seen[way]) & {p for _, _, p in qps[1:]})
            if got != ndata:
                fail(f"peer {peer}: {got} distinct source ports on the {ndata} data QPs ({way})")
    stray = {k: v for k, v in by_dest.items() if k not in used}
    for (s, d, q), g in sorted(stray.items()):
        print(f"  note: {g['pkts']} packets {s}->{d} to QP {q} (ports {sorted(g['ports'])}) "
              "belong to no logged connection")
    print("\nroce-flows: " + ("all checks passed" if ok else "FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
