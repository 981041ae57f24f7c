"""The contract between every part of dsec: events, features, policies, actuations, topics.

Other folders import this one; it imports nothing of theirs.
"""

from dsec.schemas.actuations import (
    ACTION_PARAM_MODELS,
    ActionKind,
    ActuationCommand,
    ActuationResult,
    ActuationStatus,
)
from dsec.schemas.base import SCHEMA_VERSION, Event, WorkerIdentity, new_event_id, now_ms
from dsec.schemas.codec import DecodeError, decode, encode
from dsec.schemas.dead_letters import DeadLetter
from dsec.schemas.features import FeatureEvent, GpuProfileEvent
from dsec.schemas.metrics import (
    CudaMemorySample,
    EpisodeSample,
    GpuSample,
    GradSyncSample,
    HeartbeatSample,
    MetricBatch,
    MetricColumns,
    MetricSample,
    RecoverySample,
    RuntimeSample,
    StepSample,
)
from dsec.schemas.policies import PolicyAction, PolicyDecision, PolicyDeletion, PolicySpec
from dsec.schemas.pools import PoolDeletion, PoolSpec
from dsec.schemas.runtimes import RegisteredRuntime, RuntimeMetricsPost, RuntimeRegistration
from dsec.schemas.signing import SignatureError, SignedBy, Signer, Verifier
from dsec.schemas.topics import TOPICS, TopicSpec, topic_names

__all__ = [
    "ACTION_PARAM_MODELS",
    "SCHEMA_VERSION",
    "TOPICS",
    "ActionKind",
    "ActuationCommand",
    "ActuationResult",
    "ActuationStatus",
    "CudaMemorySample",
    "DeadLetter",
    "DecodeError",
    "EpisodeSample",
    "Event",
    "FeatureEvent",
    "GpuProfileEvent",
    "GpuSample",
    "GradSyncSample",
    "HeartbeatSample",
    "MetricBatch",
    "MetricColumns",
    "MetricSample",
    "PolicyAction",
    "PolicyDecision",
    "PolicyDeletion",
    "PolicySpec",
    "PoolDeletion",
    "PoolSpec",
    "RecoverySample",
    "RegisteredRuntime",
    "RuntimeMetricsPost",
    "RuntimeRegistration",
    "RuntimeSample",
    "SignatureError",
    "SignedBy",
    "Signer",
    "StepSample",
    "TopicSpec",
    "Verifier",
    "WorkerIdentity",
    "decode",
    "encode",
    "new_event_id",
    "now_ms",
    "topic_names",
]
