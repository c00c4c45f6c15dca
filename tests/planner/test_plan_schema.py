"""The plan schema's candidate fields: validation of the 2-D SP, chunking and offload knobs, and old plans."""

import json

import pytest

from autosp.contract.specs import Candidate
from autosp.errors import UsageError
from autosp.contract.plan import SCHEMA_VERSION, plan_from_dict


def test_ring_divides_sp_and_names_both_dimensions():
    cand = Candidate(sp=8, ring=4)
    assert cand.ulysses == 2 and cand.short().startswith("sp8(u2xr4) ")
    assert Candidate(sp=8).ulysses == 8 and Candidate(sp=8).short().startswith("sp8 ")
    with pytest.raises(ValueError, match="ring"):
        Candidate(sp=6, ring=4)


@pytest.mark.parametrize("fields, needle", [
    ({"sequence_chunks": 0}, "sequence_chunks"),
    ({"ring": 0}, "ring"),
    ({"offload_chunks": True}, "sequence_chunks > 1"),
    ({"offload_chunks": 1, "sequence_chunks": 2}, "true or false"),
    ({"offload_param": True, "zero_stage": 2}, "zero_stage 3"),
])
def test_invalid_new_knobs_are_refused(fields, needle):
    with pytest.raises(ValueError, match=needle):
        Candidate(sp=2, **fields)


def test_a_version_1_plan_reads_with_the_new_knobs_off(tmp_path):
    from autosp.planner.api import make_plan

    plan = make_plan("llama-3.2-1b", "32k", "h100x8", cache=None)
    data = json.loads(plan.to_json())
    assert data["schema_version"] == SCHEMA_VERSION == 2
    data["schema_version"] = 1
    for name in ("ring", "sequence_chunks", "offload_chunks", "offload_param"):
        del data["candidate"][name]
    old = plan_from_dict(data)
    assert (old.candidate.ring, old.candidate.sequence_chunks) == (1, 1)
    assert not old.candidate.offload_chunks and not old.candidate.offload_param
    data["schema_version"] = SCHEMA_VERSION + 1
    with pytest.raises(UsageError, match="newer"):
        plan_from_dict(data)
