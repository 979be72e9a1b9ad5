"""The command's start, which every printed time counts from (a FOUND line, a part's
finish): set by `kvcheck.cli.main` as it starts and handed to worker processes, so that
a time printed in a worker counts from the command the user typed, not from the worker's
own start. time.monotonic() is one clock for every process of a machine (Linux, macOS)."""
from __future__ import annotations

import time

STARTED = time.monotonic()
"""When the command started (this module's import until `start()` or `set_start()`)."""
STARTED_WALL = time.time()
"""The same moment on the wall clock (files written since then have a later mtime)."""


def start() -> None:
    global STARTED, STARTED_WALL
    STARTED, STARTED_WALL = time.monotonic(), time.time()


def set_start(started: float, started_wall: float) -> None:
    """In a worker process: the driver's start."""
    global STARTED, STARTED_WALL
    STARTED, STARTED_WALL = started, started_wall


def stamp() -> tuple:
    """(STARTED, STARTED_WALL), for `set_start` in a worker."""
    return STARTED, STARTED_WALL


def since_start() -> float:
    return time.monotonic() - STARTED
