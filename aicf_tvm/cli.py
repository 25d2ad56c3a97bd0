"""The ``aicf`` command: demo, compile, run, explain, tune.

Exit code 0 on success; any error prints one line (``aicf: error: ...``) and exits 1;
``--debug`` shows the full traceback instead.
"""

from __future__ import annotations

import argparse
import sys
import traceback
from typing import Callable, Sequence


def _cmd_explain(args: argparse.Namespace) -> int:
    from .explainer import explain
    from .frontends import load_model

    print(explain(load_model(args.model)))
    return 0


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {"explain": _cmd_explain}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="aicf", description="AICF on TVM: contract-driven fusion on TVM Relax.")
    parser.add_argument("--debug", action="store_true", help="show full tracebacks on error")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("explain", help="print the Emit table, contracts and fusion decisions of a model")
    p.add_argument("model", help="an ONNX file, a built-in model name, or package.module:function")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except KeyboardInterrupt:
        print("aicf: interrupted", file=sys.stderr)
        return 130
    except Exception as err:  # noqa: BLE001 - one line for users, traceback with --debug
        if args.debug:
            traceback.print_exc()
        else:
            msg = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            print(f"aicf: error: {msg}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
