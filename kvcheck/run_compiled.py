"""`python -m kvcheck.run_compiled ARGS...`: `kvcheck ARGS...` on the Cython build of the
explorer's modules (kvcheck/compiled.py; `make explore-compiled`), interpreted when there is
no build that matches the sources."""
from __future__ import annotations

import sys

from kvcheck.compiled import NotBuilt, activate, is_compiled


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        activate()
    except NotBuilt as e:
        print(f"kvcheck.compiled: {e}; running interpreted", file=sys.stderr)
    from kvcheck.cli import main as cli_main
    from kvcheck.explore import search
    print(f"[{'compiled' if is_compiled(search) else 'interpreted'} explorer]", file=sys.stderr)
    return cli_main(argv)


if __name__ == "__main__":
    sys.exit(main())
