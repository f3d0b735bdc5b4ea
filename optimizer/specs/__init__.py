"""Job specs and layouts as the HTTP contract defines them (request side).

A request names presets or gives explicit fields; validation resolves presets, applies the
explicit overrides and checks every cross-field rule, so that an invalid request fails with a
message that names the field and the reason (HTTP 422) before any planning work starts.
"""

from optimizer.specs.cluster import ClusterSpec
from optimizer.specs.common import (
    AXES,
    MAX_ALLOW_VALUES,
    MAX_HIDDEN,
    MAX_LAYERS,
    MAX_NUM_GPUS,
    Activation,
    Framework,
    Precision,
    Recompute,
    ZeroStage,
)
from optimizer.specs.job import (
    MAX_COMPARE_LAYOUTS,
    CompareRequest,
    CostsSpec,
    EvaluateRequest,
    JobSpec,
    PlanRequest,
    ReliabilitySpec,
)
from optimizer.specs.layout import Layout, LayoutAllow, LayoutFix, PlacementSpec
from optimizer.specs.model import MODEL_FIELDS, MLAConfig, ModelSpec, MoEConfig
from optimizer.specs.search import Objective, SearchSpec
from optimizer.specs.training import TrainingSpec

__all__ = [
    "AXES",
    "MAX_ALLOW_VALUES",
    "MAX_COMPARE_LAYOUTS",
    "MAX_HIDDEN",
    "MAX_LAYERS",
    "MAX_NUM_GPUS",
    "MODEL_FIELDS",
    "Activation",
    "ClusterSpec",
    "CompareRequest",
    "CostsSpec",
    "EvaluateRequest",
    "Framework",
    "JobSpec",
    "Layout",
    "LayoutAllow",
    "LayoutFix",
    "MLAConfig",
    "ModelSpec",
    "MoEConfig",
    "Objective",
    "PlacementSpec",
    "PlanRequest",
    "Precision",
    "Recompute",
    "ReliabilitySpec",
    "SearchSpec",
    "TrainingSpec",
    "ZeroStage",
]
