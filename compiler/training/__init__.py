"""What a training run needs around the engine: checkpoints, export, signals, data and schedules.

Each module holds one concern; ``autosp-train`` (:mod:`autosp.compiler.train_cli`) calls them through a few
hooks, and the Python API (:class:`~autosp.compiler.runtime.SPEngine`) through its methods.
"""
