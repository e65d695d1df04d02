#!/usr/bin/env python3
"""Prints a TCP port P of 127.0.0.1 such that P .. P+N-1 are all free now.

  free_ports.py N

A multi-rank trainer given --listen=127.0.0.1:P serves rank r on P + r; a run
of free ports chosen once stays the trainer's address across restarts (the
main job, tests/trainer/multi_rank/sharded_consumers_test.sh). Exits 1 when
no run is found in 100 tries.
"""
import socket
import sys


def main():
    ranks = int(sys.argv[1])
    for _ in range(100):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        held = []
        try:
            for p in range(port, port + ranks):
                s = socket.socket()
                held.append(s)
                s.bind(("127.0.0.1", p))
        except OSError:
            continue
        finally:
            for s in held:
                s.close()
        print(port)
        return 0
    print("free_ports.py: no run of %d free ports" % ranks, file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
