"""The report runs no script that a writer of the storage put into it (issue 28.2).

Anyone who can write to the study (another host, `optuna study set-user-attr`, a shared .db
file) chooses its name, its attrs, the trials' hosts, params, errors and user attrs. Each of
them here carries markup that would run a script if a page wrote it unescaped; the page is
opened in headless Chromium, which must run none of it and show each as text.
"""

from __future__ import annotations

import os
from pathlib import Path

import optuna
import pytest

from hpo_orchestrator.report import CHART_IDS
from tests.conftest import run_cli

# Closes an attribute and a tag, then tries a script element and an event handler; both count.
PAYLOAD = ('"><script>window.__pwned=(window.__pwned||0)+1</script>'
           '<img src=x onerror="window.__pwned=(window.__pwned||0)+1">')

OBJECTIVE = f"""
import optuna

P = {PAYLOAD!r}


def objective(trial):
    trial.suggest_categorical(P, [P, "plain"])               # a param name and value
    trial.set_user_attr("hpo.params_effective", {{P: "ran " + P}})  # params_differ shows both
    trial.set_user_attr(P, P)                                 # a user attr
    for step in range(3):
        trial.report(float(step), step)
    if trial.number % 2:
        raise RuntimeError(P)                                 # hpo.error, failing_trials
    return 1.0
"""


def _poison_study_attrs(db: Path, study: str) -> None:
    loaded = optuna.load_study(study_name=study, storage=f"sqlite:///{db}")
    loaded.set_user_attr("hpo.pruner.min_resource_auto", {"min_resource": PAYLOAD, "reason": PAYLOAD})
    loaded.set_user_attr(f"hpo.packing.{PAYLOAD}", {
        "mode": "auto", "host": PAYLOAD, "target_gpu_util": PAYLOAD, "max_trials_per_gpu": PAYLOAD,
        "levels": [{"gpu": 0, "limit": PAYLOAD, "held": PAYLOAD}],
        "changes": [{"time": PAYLOAD, "gpu": 0, "from": 1, "to": 2, "reason": PAYLOAD}]})
    loaded.set_user_attr(f"hpo.devices.{PAYLOAD}", [{"index": 0, "uuid": PAYLOAD, "name": PAYLOAD}])
    loaded.set_user_attr(PAYLOAD, PAYLOAD)


@pytest.mark.slow
@pytest.mark.browser
def test_no_script_from_the_storage_runs_in_the_report(tmp_path: Path) -> None:
    from tests.browser import browser_unavailable, report_page_eval

    reason = browser_unavailable()
    if reason:
        if os.environ.get("HPO_TEST_REQUIRE_BROWSER") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    (tmp_path / "poisoned.py").write_text(OBJECTIVE)
    common = ("run", "objective=custom", "objective.target=poisoned:objective",
              f"study.name='{PAYLOAD}'", "scheduler.parallel=2", "study.max_failures=10")
    env = {"HPO_ORCHESTRATOR_FAKE_GPUS": "2"}
    # Two hosts, so host names label the devices, lanes and utilization lines
    first = run_cli(tmp_path, *common, f"scheduler.host='{PAYLOAD}'", "study.n_trials=4", env=env)
    assert "Traceback" not in first.stderr and (tmp_path / "hpo.db").exists(), first.stderr
    second = run_cli(tmp_path, *common, "scheduler.host=plain", "study.add_trials=2", env=env)
    assert "Traceback" not in second.stderr, second.stderr
    _poison_study_attrs(tmp_path / "hpo.db", PAYLOAD)

    page = tmp_path / "report.html"
    result = run_cli(tmp_path, "report", "--out", str(page), "--study", PAYLOAD)
    assert result.code == 0, result.stderr
    ran, shown = report_page_eval(page, len(CHART_IDS), "return [window.__pwned || 0, "
                                  "document.body.innerText.split('window.__pwned').length - 1];")
    assert ran == 0, "a script or event handler from the storage ran in the report"
    # Shown as text: the study name, min_resource=auto, packing, findings (errors, params)
    assert shown >= 8, f"the payload shows {shown} times as text"
