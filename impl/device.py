"""The one place that decides where every impl/ tensor lives."""
from __future__ import annotations

import os
from typing import Optional, Union

import torch

ENV_VAR = "KVCHECK_DEVICE"


def resolve_device(device: Optional[Union[str, torch.device]] = None) -> torch.device:
    """Explicit argument, else $KVCHECK_DEVICE, else cuda if available, else cpu."""
    if device is None or device == "":
        device = os.environ.get(ENV_VAR) or None
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(device)
