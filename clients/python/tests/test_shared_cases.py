"""The demand definition, the cost models and the ramps agree with the Rust model's: the table in
shared_cases.json is computed by the Rust code (crates/core/tests/it/shared_cases.rs checks it is
current), and replayed here through the Python client's own meter and models."""

from __future__ import annotations

import json
import math
import pathlib
from typing import Any, Dict, List

import pytest

from tollgate._demand import Counts, DemandMeter
from tollgate._ramp import Ramp, RampSettings
from tollgate.cost import Consumption, CostModel, Usage

TABLE = json.loads((pathlib.Path(__file__).parent / "shared_cases.json").read_text())


def close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-12)


@pytest.mark.parametrize("sequence", range(len(TABLE["demand"])))
def test_demand_is_reported_as_the_rust_client_reports_it(sequence: int) -> None:
    meter = DemandMeter(0.0)
    steps: List[Dict[str, Any]] = TABLE["demand"][sequence]
    for i, step in enumerate(steps):
        c = step["counts"]
        counts = Counts(
            asked=c["asked"],
            consumed=c["consumed"],
            admitted_units=c["admitted_units"],
            unthrottled=c["unthrottled"],
            admitted=c["admitted"],
            throttled=c["throttled"],
            waited=c["waited"],
            detail=Consumption(**c["detail"]),
        )
        got = meter.report(step["at_s"], counts, step["waiting"], step["granted"])
        want = step["report"]
        for key in ("demand", "unthrottled", "waiting", "consumed", "requests", "throttled", "held", "waited"):
            assert close(getattr(got, key), want[key]), (sequence, i, key, getattr(got, key), want[key])
        for key, value in want["detail"].items():
            assert close(getattr(got.detail, key), value), (sequence, i, key)


def model(name: str, coefficients: Dict[str, float]) -> CostModel:
    if name == "fdb":
        return CostModel.fdb(**coefficients)
    if name == "ru":
        return CostModel.ru(**coefficients)
    if name == "linear":
        return CostModel.linear(**coefficients)
    return CostModel(name)


def test_every_cost_model_prices_as_the_rust_models_do() -> None:
    assert len(TABLE["cost"]) > 100
    for case in TABLE["cost"]:
        m = model(case["model"], case["coefficients"])
        u = case["usage"]
        usage = Usage(u["kind"], u["bytes"], u["cpu_ms"], u["replicas"], u["durable"], u["units"])
        assert close(m.cost(usage), case["cost"]), case
        assert close(m.upfront(usage), case["upfront"]), case


@pytest.mark.parametrize("case", range(len(TABLE["ramp"])))
def test_ramps_step_as_the_rust_model_steps_them(case: int) -> None:
    c = TABLE["ramp"][case]
    ramp = Ramp(RampSettings("ramp", c["settings"]), c["resume"])
    for i, step in enumerate(c["steps"]):
        assert ramp.at_epoch(step["epoch"]) == step["pool"], (case, i, step)
        ramp.use_units(step["used"])
        assert math.isclose(ramp.value, step["value"], rel_tol=1e-12, abs_tol=1e-9), (case, i, step)
