"""Shared Optuna studies: several planner workers, one study in a database (``--storage``, ``--study-name``).

How a distributed search runs (``autosp-plan ... --storage URL [--study-name NAME] --trials N`` on each
machine, then optionally ``--trials 0`` to read the result):

1. Every worker opens the same study in ``URL`` (any SQLAlchemy URL Optuna's ``RDBStorage`` takes:
   ``sqlite:///path`` for workers on one machine or a shared file system, ``postgresql+psycopg://...``
   across machines). The study is bound to one request (:func:`study_key`: model, hardware, workload,
   objective, search space and code versions); a worker with another request is refused with a usage
   error instead of mixing answers.
2. The warm starts are enqueued once (``skip_if_exists``); each worker runs its ``N`` TPE trials, the
   sampler conditioned on *every* worker's finished trials (Optuna reads them from the storage), with a
   per-worker seed so the workers do not propose the same points.
3. Each worker then reads the combined study, runs the local refinement from the best trials of all
   workers, and records what it found as trials of the study (``source: refine``); its plan is the best
   feasible trial of the study at that moment. The last worker to finish (or a ``--trials 0`` call,
   which runs no sampler trials) therefore answers from the whole study: the plan's candidate *is* the
   study's best feasible trial.

Every trial carries user attributes: ``candidate`` (the knobs, as the plan writes them), ``worker``,
``source`` (``sampler``, ``enqueued``, ``refine`` or ``measured``), ``fits`` and ``memory_bytes``;
measured trials (``--measure``) add the measured step time, throughput and peak memory
(:mod:`autosp.planner.measure`). Its value is the predicted tokens/s; constraints carry the memory
excess, so Optuna's constrained TPE treats workers' trials exactly as its own.
"""

from __future__ import annotations

import hashlib
import os
import socket
import time
from dataclasses import asdict, dataclass

from autosp.cost_models.specs import Candidate
from autosp.errors import UsageError

RETRIES = 6


@dataclass(frozen=True)
class Shared:
    """Where and as whom a worker joins a shared study."""

    storage: str
    study_name: str
    request_key: str
    summary: str
    worker: str
    collect_only: bool = False

    def sampler_seed(self, seed: int) -> int:
        """A per-worker seed: same seed, different workers, different proposals."""
        digest = hashlib.sha256(f"{seed}:{self.worker}".encode()).hexdigest()
        return int(digest[:8], 16)


def default_worker() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def study_key(request: dict) -> str:
    """What binds a study: the request without the per-worker settings (trials, seed, time budget, runner-ups)."""
    from autosp.planner.cache import request_key

    shared = {k: v for k, v in request.items() if k not in ("trials", "seed", "time_budget", "top_k", "search")}
    return request_key(shared)


def display(url: str) -> str:
    from autosp.planner.cache import display_location

    return display_location(url)


def open_storage(optuna, url: str):
    """Optuna's RDBStorage for ``url``, created with retries (workers starting together on a fresh
    database race to create its tables); UsageError for a malformed URL or a missing driver."""
    from autosp.planner.cache import make_engine

    _, engine, shown = make_engine(url, flag="--storage")  # the same URL checks and messages as --cache
    backend = engine.dialect.name
    engine.dispose()
    kwargs = {"pool_pre_ping": True}
    if backend == "sqlite":
        kwargs["connect_args"] = {"timeout": 60}
    last = None
    for attempt in range(RETRIES):
        try:
            storage = optuna.storages.RDBStorage(url, engine_kwargs=kwargs)
        except Exception as err:  # noqa: BLE001 - table-creation races surface as several error types
            last = err
            time.sleep(0.1 * (attempt + 1))
            continue
        if backend == "sqlite":
            _sqlite_pragmas(storage.engine)
        return storage
    raise UsageError(f"--storage {shown}: cannot open the study storage ({type(last).__name__}: "
                     f"{str(last).splitlines()[0] if str(last) else ''})")


def _sqlite_pragmas(engine) -> None:
    """Write-ahead log and NORMAL sync for a study file: workers on one machine then read while one
    writes, and a trial costs no fsync (a crash loses at most the last trials, never the file).

    Every transaction also starts with ``BEGIN IMMEDIATE`` (it takes the file's write lock first). Optuna
    claims an enqueued warm start by reading its state and writing RUNNING under ``SELECT ... FOR UPDATE``,
    which SQLite ignores: with deferred transactions two workers could both read WAITING and both run the
    trial, the slower one then failing to tell it (optuna/optuna#4621). Under the write lock the second
    reads RUNNING and takes the next trial; trials are milliseconds of work, so serialising the workers'
    transactions costs little."""
    import sqlalchemy as sa

    @sa.event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn, _record):
        dbapi_conn.isolation_level = None  # SQLAlchemy, not the sqlite3 module, begins the transactions
        cursor = dbapi_conn.cursor()
        try:
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=NORMAL")
        except Exception:  # noqa: BLE001 - e.g. a file system without shared memory: keep the defaults
            pass
        finally:
            cursor.close()

    @sa.event.listens_for(engine, "begin")
    def _on_begin(conn):
        conn.exec_driver_sql("BEGIN IMMEDIATE")

    engine.dispose()  # connections made from now on get the pragmas


def open_study(optuna, shared: Shared, sampler):
    """The shared study, created on first use and checked to belong to this request."""
    storage = open_storage(optuna, shared.storage)
    last = None
    for attempt in range(RETRIES):
        try:
            study = optuna.create_study(storage=storage, study_name=shared.study_name, direction="maximize",
                                        sampler=sampler, load_if_exists=True)
            break
        except ValueError as err:  # e.g. an existing study with another direction
            raise UsageError(f"--study-name {shared.study_name}: {err}") from None
        except Exception as err:  # noqa: BLE001 - concurrent creation: retry, then give up loudly
            last = err
            time.sleep(0.1 * (attempt + 1))
    else:
        raise UsageError(f"--storage {display(shared.storage)}: cannot create study {shared.study_name} "
                         f"({type(last).__name__}: {str(last).splitlines()[0] if str(last) else ''})")
    bound = study.user_attrs.get("autosp_request")
    if bound is None:
        study.set_user_attr("autosp_request", shared.request_key)
        study.set_user_attr("autosp_request_summary", shared.summary)
    elif bound != shared.request_key:
        other = study.user_attrs.get("autosp_request_summary", "another request")
        raise UsageError(f"study {shared.study_name!r} in {display(shared.storage)} belongs to another request "
                         f"({other}; this one: {shared.summary}, or another autosp version); "
                         "use another --study-name")
    return study


def candidate_attrs(cand: Candidate) -> dict:
    return asdict(cand)


def candidate_of(trial) -> Candidate | None:
    data = trial.user_attrs.get("candidate")
    if not isinstance(data, dict):
        return None
    try:
        return Candidate(**data)
    except (TypeError, ValueError):
        return None


def add_trial(optuna, study, space, cand: Candidate, est, source: str, worker: str, extra: dict | None = None):
    """Record ``cand`` (scored ``est``) as a finished trial of ``study``."""
    choices = space.choices()
    distributions = {k: optuna.distributions.CategoricalDistribution(list(choices[k])) for k in space.KNOBS}
    params = {k: getattr(cand, k) for k in space.KNOBS}
    for k, v in params.items():
        if v not in choices[k]:
            return  # outside this space's choices (cannot be a trial of this study)
    valid = space.reason(cand) is None
    excess = (est.memory.total - est.capacity_bytes) / est.capacity_bytes if valid else 1.0
    constraints = {"valid": 0.0 if valid else 1.0, "memory": excess}
    attrs = {"candidate": candidate_attrs(cand), "worker": worker, "source": source,
             "fits": bool(valid and est.fits), "memory_bytes": est.memory.total, **(extra or {})}
    kwargs = dict(params=params, distributions=distributions,
                  value=est.tokens_per_second if valid else 0.0, user_attrs=attrs)
    import inspect

    if "constraints" in inspect.signature(optuna.trial.create_trial).parameters:  # optuna >= 5
        kwargs["constraints"] = constraints
    else:  # optuna 4.x: the sampler's constraints_func reads this user attribute
        attrs["constraints"] = [constraints[k] for k in sorted(constraints)]
    study.add_trial(optuna.trial.create_trial(**kwargs))


def finished_candidates(optuna, study) -> list[Candidate]:
    """The candidates of every finished trial of the study, in trial order, without repeats."""
    seen, out = set(), []
    for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
        cand = candidate_of(trial)
        if cand is not None and cand not in seen:
            seen.add(cand)
            out.append(cand)
    return out


def summary_of(optuna, study) -> dict:
    trials = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    workers = sorted({t.user_attrs.get("worker", "?") for t in trials if t.user_attrs.get("source") != "refine"})
    return {"trials_in_study": len(trials), "workers": workers}


__all__ = ["RETRIES", "Shared", "add_trial", "candidate_attrs", "candidate_of", "default_worker", "display",
           "finished_candidates", "open_storage", "open_study", "study_key", "summary_of"]
