"""What the version stamps cover: every source that decides which plan comes out, wherever it now lives."""

from autosp.planner import versions


def _labels(paths) -> set:
    return {versions._label(p) for p in paths}


def test_the_cost_model_stamp_covers_the_model_the_graph_profiler_and_the_contract():
    labels = _labels(versions._cost_model_files())
    for expected in ("cost_models/step_time.py", "cost_models/bulk.py", "profiling/graph/analyze.py",
                     "contract/specs.py", "contract/knobs.py", "contract/rules.py"):
        assert expected in labels, expected
    assert not any("calibrat" in label or "catalog" in label for label in labels)


def test_the_code_stamp_covers_the_search_but_not_the_command_lines():
    labels = _labels(versions._code_files())
    assert {"planner/api.py", "planner/search/strategies.py", "planner/search/moves.py",
            "planner/search/space.py", "contract/rules.py", "cost_models/catalog/hardware.py"} <= labels
    assert not any(label.startswith("planner/cli/") for label in labels)
