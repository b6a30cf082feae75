"""Ray Tune in the benchmark: what a Ray user would run, ASHA early stopping over TPE proposals.

    python -m scripts.benchmarking.ray_worker --workload a --storage URL --seed 3 \
        --cpus 2 --threads 1 --timeout 120

One driver process. ``ray.init`` starts Ray's own daemons and worker processes on the cores
the launcher pinned this process to (``--cpus`` of them, so Tune runs ``cpus // threads``
trials at once, each asking for ``threads`` CPUs). The search is Ray's ``OptunaSearch`` with
the same TPE the Optuna baselines use (multivariate, constant liar, seeded); the scheduler
is ``ASHAScheduler`` over the objective's report steps (``max_t`` = its number of reports,
``grace_period`` 1, ``reduction_factor`` 3: Ray's documented pattern). The trial function is
the benchmark's own Optuna objective (workloads.py: the same data, space, LightGBM params and
reports), handed a trial that reads Tune's config and reports to Tune; the CPU learner's
Datasets are binned once per Ray worker process, as Optuna's processes and ours bin theirs.

Tune keeps its results in its own folder; the benchmark reads curves from an Optuna study, so
the driver records each finished trial there as it sees it end (``datetime_complete`` is that
moment, Ray's result handling included): COMPLETE with its best reported loss where it ran all
its reports, PRUNED where ASHA stopped it; its start is when its trial function started.
Actors are reused between trials (Tune's ``reuse_actors``, off by default; its docs recommend
it for many short trials), as a careful Ray user would set it. What Tune's TPE learns is Ray's
own doing: OptunaSearch tells it every trial ASHA stopped as complete with its last reported
loss (``metric="loss"``, the value ASHA compares at its rungs), where the benchmark records
such a trial as PRUNED and a complete one by its best reported loss. A trial that raises is
recorded FAIL and its error file named in the driver's output. SIGTERM (the benchmark's stop)
shuts Ray down, its daemons with it. The GPU workloads are not supported: Ray's wheels exceed
what the GPU host can be given (docs/quality/method.md, Contenders).
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

__all__ = ["TuneTrial", "main", "record_trial", "space_distributions"]


def space_distributions() -> dict[str, Any]:
    """Optuna distributions of the LightGBM search space, to record Tune's trials (whose params
    come as plain values) in an Optuna study: those the search space's own suggestions
    (:func:`_search_space`, objectives/_suggest.py) give a trial."""
    import optuna

    trial = optuna.create_study().ask()
    _search_space(trial)
    return dict(trial.distributions)


class TuneTrial:
    """The Optuna trial the benchmark's objective expects, backed by Tune: suggestions come
    from the config OptunaSearch proposed, reports go to Tune (where ASHA may stop the trial),
    and Tune's scheduler, not the objective, prunes."""

    def __init__(self, config: dict[str, Any], report: Any) -> None:
        self.params = config
        self._report = report
        self.best = float("inf")
        self.started = time.time()  # recorded as the trial's start (record_trial)

    def _suggest(self, name: str, *_args: Any, **_kwargs: Any) -> Any:
        return self.params[name]

    suggest_float = suggest_int = suggest_categorical = _suggest

    def report(self, value: float, step: int) -> None:
        self.best = min(self.best, value)
        self._report({"loss": value, "best": self.best, "step": step, "started": self.started})

    def should_prune(self) -> bool:
        return False


def record_trial(study: Any, result: dict[str, Any], config: dict[str, Any], steps: int,
                 distributions: dict[str, Any], failed: bool = False) -> None:
    """Record one of Tune's trials, ended, in the run's Optuna study (where the benchmark reads
    its curve): COMPLETE with its best reported loss where it made all ``steps`` reports,
    PRUNED where ASHA stopped it earlier, FAIL where it raised; started when its trial function
    started (``result["started"]``), ended now. A trial that ended before its first report
    and did not fail has nothing to record."""
    import optuna

    state = optuna.trial.TrialState
    if failed:
        ended = state.FAIL
    elif "best" not in result:
        return
    else:
        ended = state.COMPLETE if result.get("step", 0) >= steps else state.PRUNED
    trial = optuna.trial.create_trial(
        state=ended, value=result["best"] if ended == state.COMPLETE else None,
        params={k: v for k, v in config.items() if k in distributions},
        distributions={k: d for k, d in distributions.items() if k in config})
    if "started" in result:
        trial.datetime_start = datetime.fromtimestamp(result["started"])
    study.add_trial(trial)


def _search_space(trial: Any) -> None:
    from hpo_orchestrator.config import LIGHTGBM_SPACE
    from hpo_orchestrator.objectives import suggest_all

    suggest_all(trial, LIGHTGBM_SPACE)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workload", required=True, choices=("a", "b"))
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--storage", required=True)
    parser.add_argument("--study", default="bench")
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--cpus", type=int, required=True, help="cores Ray may use")
    parser.add_argument("--threads", type=int, default=1, help="LightGBM threads per trial")
    parser.add_argument("--timeout", type=float, required=True, help="seconds")
    parser.add_argument("--run-dir", default=".", help="Tune's own results go under it")
    args = parser.parse_args(argv)
    import lightgbm  # noqa: F401  (before numpy: optuna_worker.py says why)
    import optuna
    import ray
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler
    from ray.tune.search.optuna import OptunaSearch

    from scripts.benchmarking.workloads import WORKLOADS

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    workload = WORKLOADS[args.workload].scaled(args.scale)
    cfg = workload.lightgbm
    steps = cfg.num_boost_round // cfg.report_every
    study = optuna.create_study(study_name=args.study, storage=args.storage)
    distributions = space_distributions()

    class Record(tune.Callback):
        def on_trial_complete(self, iteration: int, trials: list[Any], trial: Any,
                              **info: Any) -> None:
            record_trial(study, trial.last_result or {}, trial.config, steps, distributions)

        def on_trial_error(self, iteration: int, trials: list[Any], trial: Any,
                           **info: Any) -> None:
            record_trial(study, trial.last_result or {}, trial.config, steps, distributions,
                         failed=True)
            print(f"trial {trial.trial_id} failed: {trial.error_file}", file=sys.stderr)

    def stop(_signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt  # out of tuner.fit; the finally below shuts Ray down

    # a local Ray of its own, never a cluster that RAY_ADDRESS may name
    ray.init(address="local", num_cpus=args.cpus, include_dashboard=False,
             configure_logging=False)
    signal.signal(signal.SIGTERM, stop)  # after ray.init, which sets its own (it aborts)
    try:
        sampler = optuna.samplers.TPESampler(multivariate=True, constant_liar=True,
                                             seed=args.seed * 1000)
        tuner = tune.Tuner(
            tune.with_resources(tune.with_parameters(
                _trainable, workload=args.workload, scale=args.scale, threads=args.threads),
                {"cpu": args.threads}),
            tune_config=tune.TuneConfig(
                search_alg=OptunaSearch(_search_space, metric="loss", mode="min",
                                        sampler=sampler),
                scheduler=ASHAScheduler(metric="loss", mode="min", max_t=steps,
                                        grace_period=1, reduction_factor=3),
                num_samples=-1, time_budget_s=args.timeout,
                # a worker process per trial costs its imports and data every time: Ray's
                # docs say reuse "can drastically speed up" many short trials
                reuse_actors=True,
                max_concurrent_trials=max(1, args.cpus // args.threads)),
            run_config=tune.RunConfig(name="bench", verbose=0, callbacks=[Record()],
                                      storage_path=str(Path(args.run_dir).resolve() / "ray")))
        tuner.fit()
    except KeyboardInterrupt:
        pass
    finally:
        ray.shutdown()
    return 0


_OBJECTIVES: dict[tuple[str, float, int], Any] = {}  # per Ray worker process: data made once


def _trainable(config: dict[str, Any], workload: str, scale: float, threads: int) -> None:
    """Tune's trial function (module level, so that Ray's workers import it and keep
    :data:`_OBJECTIVES` between the trials a reused worker runs)."""
    from ray import tune

    from scripts.benchmarking.workloads import WORKLOADS, lightgbm_objective

    key = (workload, scale, threads)
    if key not in _OBJECTIVES:
        cfg = WORKLOADS[workload].scaled(scale).lightgbm
        _OBJECTIVES[key] = lightgbm_objective(cfg, {"device_type": "cpu"}, threads)
    _OBJECTIVES[key](TuneTrial(config, tune.report))


if __name__ == "__main__":
    # through the importable module, not __main__: Ray pickles __main__'s functions by value,
    # and each trial would then get an empty _OBJECTIVES
    from scripts.benchmarking import ray_worker

    sys.exit(ray_worker.main())
