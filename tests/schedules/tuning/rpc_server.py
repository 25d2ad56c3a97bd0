"""A TVM RPC server (as ``python -m tvm.exec.rpc_server`` with a tracker) that a test can put
in a known state, so the order of events in a tuning run is forced rather than raced:

    python tests/schedules/tuning/rpc_server.py --host H --port P --port-end Q --tracker H:P --key K
                                         [--gate FILE] [--hold-loads]

``--gate FILE``: the server starts (imports done) but binds and registers with the tracker
only once FILE exists; it logs ``waiting at the gate`` first.  ``--hold-loads``: every
measurement it is given stops in ``load_module`` (logged as such) and never returns, until
the server is killed.  Both act in the server's worker process (``server_init_callback``,
run before it binds), and the per-session processes it forks inherit them.
"""

from __future__ import annotations

import argparse

from tvm import rpc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--port-end", type=int, required=True)
    ap.add_argument("--tracker", required=True, help="HOST:PORT")
    ap.add_argument("--key", required=True)
    ap.add_argument("--gate")
    ap.add_argument("--hold-loads", action="store_true")
    args = ap.parse_args()
    gate, hold = args.gate, args.hold_loads

    def init() -> None:  # shipped by value (cloudpickle) to the server's worker process
        import os
        import time

        from tvm.rpc import server

        if gate:
            server.logger.info("waiting at the gate %s", gate)
            while not os.path.exists(gate):
                time.sleep(0.05)
        if hold:
            def held(path: str) -> None:
                server.logger.info("load_module %s: held until this server is killed", path)
                while True:
                    time.sleep(60)

            server._load_module = held  # what the session's tvm.rpc.server.load_module calls

    host, port = args.tracker.rsplit(":", 1)
    server = rpc.Server(args.host, args.port, args.port_end, key=args.key, tracker_addr=(host, int(port)),
                        server_init_callback=init)
    server.proc.join()


if __name__ == "__main__":
    main()
