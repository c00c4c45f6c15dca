"""The contract between the planner and the compiler: the types and rules both sides share.

Nothing here imports the planner, the compiler or the cost model (tests/project/test_layering.py), and nothing
here imports torch: the planner reads it on its start-up path.
"""
