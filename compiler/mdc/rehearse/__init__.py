"""``mdc rehearse``: play a compiled job on this machine's CPU (placeholder: being written)."""

from __future__ import annotations

import argparse
from typing import Any


def cmd_rehearse(args: argparse.Namespace, compiler: Any, out: Any) -> int:
    raise NotImplementedError
