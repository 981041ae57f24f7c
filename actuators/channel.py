"""The local channel between a node actuator and the workers on its node.

A Unix domain socket in an owner-only run directory; frames are a 4-byte length
and a JSON object validated against the models below (never evaluated). The
daemon has already checked signature, expiry, order and duplicates before a
command enters the channel, and only the owner of the run directory can connect.
"""

from __future__ import annotations

import os
import socket
import stat
import struct
from pathlib import Path
from typing import Annotated, Literal

import orjson
from pydantic import Field, TypeAdapter, ValidationError

from dsec.schemas import ActuationStatus, WorkerIdentity
from dsec.schemas.actuations import ActionParams, SettingValue
from dsec.schemas.base import EpochMs, Model

MAX_FRAME_BYTES = 1 << 20
_LENGTH = struct.Struct(">I")


class Register(Model):
    type: Literal["register"] = "register"
    identity: WorkerIdentity
    pid: Annotated[int, Field(ge=0, le=2**31 - 1)]


class Apply(Model):
    type: Literal["apply"] = "apply"
    actuation_id: Annotated[str, Field(min_length=1, max_length=64)]
    action: ActionParams
    command_time_ms: EpochMs
    replay: bool = False  # desired state re-sent after the worker registered again


class Answer(Model):
    type: Literal["result"] = "result"
    actuation_id: Annotated[str, Field(min_length=1, max_length=64)]
    status: ActuationStatus
    detail: Annotated[str, Field(max_length=2048)] = ""
    replay: bool = False
    requested: SettingValue | None = None
    in_force: SettingValue | None = None


Frame = Annotated[Register | Apply | Answer, Field(discriminator="type")]
_FRAME = TypeAdapter(Frame)


class ChannelError(ConnectionError):
    """The peer closed, or sent something that is not a frame."""


def socket_path(run_dir: Path, node_id: str) -> Path:
    return run_dir / f"actuator-{node_id}.sock"


def prepare_run_dir(run_dir: Path) -> Path:
    """Creates the run directory owner-only, and refuses one that anyone else can enter."""
    run_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    info = run_dir.stat()
    if info.st_uid != os.getuid():
        raise PermissionError(f"{run_dir} belongs to uid {info.st_uid}, not to this user")
    if stat.S_IMODE(info.st_mode) & 0o077:
        os.chmod(run_dir, 0o700)
    return run_dir


def encode_frame(message: Model) -> bytes:
    body = orjson.dumps(message.model_dump(mode="json"))
    if len(body) > MAX_FRAME_BYTES:
        raise ValueError(f"frame of {len(body)} bytes is over {MAX_FRAME_BYTES}")
    return _LENGTH.pack(len(body)) + body


def decode_frame(body: bytes) -> Register | Apply | Answer:
    try:
        return _FRAME.validate_json(body)
    except ValidationError as exc:
        raise ChannelError(f"invalid frame: {exc.errors()[:3]}") from None


def _read_exactly(sock: socket.socket, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        part = sock.recv(size - len(data))
        if not part:
            raise ChannelError("peer closed the channel")
        data += part
    return bytes(data)


def read_frame(sock: socket.socket) -> Register | Apply | Answer:
    (length,) = _LENGTH.unpack(_read_exactly(sock, _LENGTH.size))
    if length > MAX_FRAME_BYTES:
        raise ChannelError(f"frame of {length} bytes is over {MAX_FRAME_BYTES}")
    return decode_frame(_read_exactly(sock, length))
