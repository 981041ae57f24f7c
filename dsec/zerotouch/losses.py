"""The loss and the clipping norm without code.

The loss is the scalar a program calls ``backward()`` on (``Tensor.backward`` is wrapped):
the last one before an optimizer step is that step's loss, as ``dsec.report_step(loss)``
would give it. Under fp16 loss scaling it is the scaled loss; a loop that calls
``torch.autograd.backward`` directly reports none. ``torch.nn.utils.clip_grad_norm_``
returns the total norm the program already paid for: at norm type 2 the probe takes it
instead of computing its own (``grad_norm_source="trainer"``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

Note = Callable[[Any], None]


def install_loss_hook(tensor_class: Any, note_loss: Note) -> None:
    original = tensor_class.backward
    if getattr(original, "__dsec_note__", None) is not None:
        return

    @functools.wraps(original)
    def backward(tensor: Any, *args: Any, **kwargs: Any) -> Any:
        if tensor.dim() == 0:
            note_loss(tensor)
        return original(tensor, *args, **kwargs)

    backward.__dsec_note__ = note_loss  # type: ignore[attr-defined]
    tensor_class.backward = backward


def install_clip_hook(nn_utils: Any, note_grad_norm: Note) -> None:
    """Wraps ``clip_grad_norm_`` where programs find it: ``torch.nn.utils`` and its
    ``clip_grad`` module."""
    original = nn_utils.clip_grad_norm_
    if getattr(original, "__dsec_note__", None) is not None:
        return

    @functools.wraps(original)
    def clip_grad_norm_(*args: Any, **kwargs: Any) -> Any:
        total_norm = original(*args, **kwargs)
        norm_type = kwargs.get("norm_type", args[2] if len(args) > 2 else 2.0)
        if float(norm_type) == 2.0:
            note_grad_norm(total_norm)
        return total_norm

    clip_grad_norm_.__dsec_note__ = note_grad_norm  # type: ignore[attr-defined]
    nn_utils.clip_grad_norm_ = clip_grad_norm_
    if getattr(nn_utils.clip_grad, "clip_grad_norm_", None) is original:
        nn_utils.clip_grad.clip_grad_norm_ = clip_grad_norm_
