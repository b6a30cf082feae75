"""Workload (c): a small CNN on generated images, GPU-bound, with a real start-up cost.

The product runs it as a custom objective (``objective=custom
objective.target=scripts.benchmarking.cnn:objective``) and Optuna's processes call the
same function, so both train the identical model on identical data in the identical space.
Start-up is real: importing torch, making the CUDA context, and generating the images (once
per process: cached, so a reuse worker or a long-lived Optuna process pays it once and a
fresh worker pays it per trial). Each image is smooth noise with its class's pattern (one of
ten fixed 9x9 templates) at a random place and strength, plus a fainter pattern of another
class as a distractor; 10 % of the labels are random (a floor on the loss). A CNN learns it
(translation-invariant detectors) over a few epochs, faster with the right width, rate and
batch: what the search has to find. No download. (A first version took labels from a random
"teacher" CNN: its logits varied by 0.008 across images against a noise of 1, so the labels
were noise and every trial ended near the chance loss.)

HPO_QUALITY_SCALE (default 1) shrinks the data for a dry run on a CPU machine.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any

__all__ = ["EPOCHS", "objective", "retrain_test_loss", "setup", "suggest"]

EPOCHS = 10
_ROWS = {"train": 24_000, "valid": 6_000, "test": 6_000}
_CLASSES = 10


def _device() -> Any:
    import torch

    return torch.device("cuda:0" if torch.cuda.is_available() else "cpu")


_PATCH = 9
_BACKGROUND = 2.0  # the noise's scale against the template's (unit std): the task's difficulty


def _place(x: Any, patches: Any, where: Any) -> None:
    """Add ``patches[k]`` (3 x P x P) onto image k of ``x`` at row/column ``where[k]``."""
    import torch

    n, size = len(x), _PATCH
    rows = (where[:, 0, None] + torch.arange(size))[:, None, :, None]
    cols = (where[:, 1, None] + torch.arange(size))[:, None, None, :]
    x.index_put_((torch.arange(n)[:, None, None, None], torch.arange(3)[None, :, None, None],
                  rows, cols), patches, accumulate=True)


@functools.cache
def _data() -> dict[str, tuple[Any, Any]]:
    """Images and labels per split, on the device, generated once per process (seed 0)."""
    import torch
    from torch import nn

    scale = float(os.environ.get("HPO_QUALITY_SCALE", "1"))
    gen = torch.Generator().manual_seed(0)
    size = _PATCH
    templates = nn.functional.avg_pool2d(torch.randn(_CLASSES, 3, size + 2, size + 2,
                                                     generator=gen), 3, stride=1)
    templates = (templates - templates.mean((1, 2, 3), keepdim=True)) \
        / templates.std((1, 2, 3), keepdim=True)
    out = {}
    for split, rows in _ROWS.items():
        n = max(256, int(rows * scale))
        x = nn.functional.avg_pool2d(torch.randn(n, 3, 34, 34, generator=gen), 3, stride=1) \
            * _BACKGROUND
        y = torch.randint(0, _CLASSES, (n,), generator=gen)
        other = (y + torch.randint(1, _CLASSES, (n,), generator=gen)) % _CLASSES
        strength = (torch.rand(n, generator=gen) * 0.6 + 0.6)[:, None, None, None]
        _place(x, strength * templates[y], torch.randint(0, 33 - size, (n, 2), generator=gen))
        _place(x, 0.5 * strength * templates[other],
               torch.randint(0, 33 - size, (n, 2), generator=gen))
        noisy = torch.rand(n, generator=gen) < 0.1
        y = torch.where(noisy, torch.randint(0, _CLASSES, (n,), generator=gen), y)
        out[split] = (x.to(_device()), y.to(_device()))
    return out


def setup() -> None:
    """The images on the device, generated once per process before its first trial: ours'
    ``objective.setup`` (docs/OBJECTIVES.md), so that a worker started ahead (the first wave,
    a spare) pays the data and the CUDA context, not the trial it is handed
    (``ours-setup`` in bench_quality.py)."""
    _data()


def _model(params: dict[str, Any]) -> Any:
    from torch import nn

    layers: list[nn.Module] = []
    width, fan_in = int(params["channels"]), 3
    for _ in range(int(params["depth"])):
        layers += [nn.Conv2d(fan_in, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(),
                   nn.MaxPool2d(2)]
        fan_in, width = width, width * 2
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Dropout(float(params["dropout"])), nn.Linear(fan_in, _CLASSES))


def _loss(model: Any, split: tuple[Any, Any], use_bf16: bool) -> float:
    import torch

    x, y = split
    model.eval()
    total = 0.0
    with torch.no_grad(), torch.autocast(x.device.type, torch.bfloat16, enabled=use_bf16):
        for i in range(0, len(y), 2048):
            out = model(x[i:i + 2048]).float()
            total += float(torch.nn.functional.cross_entropy(out, y[i:i + 2048], reduction="sum"))
    return total / len(y)


def _fit(params: dict[str, Any], seed: int,
         after_epoch: Callable[[int, float], None] | None) -> tuple[float, float, int]:
    """Train; returns (best validation loss, test loss at that epoch, that epoch)."""
    import torch

    data = _data()
    device = _device()
    use_bf16 = device.type == "cuda"
    torch.manual_seed(seed)
    model = _model(params).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=float(params["lr"]),
                                  weight_decay=float(params["weight_decay"]))
    x, y = data["train"]
    batch = int(params["batch_size"])
    best = (float("inf"), float("nan"), 0)
    for epoch in range(1, EPOCHS + 1):
        model.train()
        order = torch.randperm(len(y), device=device)
        for i in range(0, len(y), batch):
            idx = order[i:i + batch]
            with torch.autocast(device.type, torch.bfloat16, enabled=use_bf16):
                loss = torch.nn.functional.cross_entropy(model(x[idx]).float(), y[idx])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        valid = _loss(model, data["valid"], use_bf16)
        if valid < best[0]:
            test = float("nan") if after_epoch else _loss(model, data["test"], use_bf16)
            best = (valid, test, epoch)
        if after_epoch is not None:
            after_epoch(epoch, valid)
    return best


def suggest(trial: Any) -> dict[str, Any]:
    return {"lr": trial.suggest_float("lr", 1e-4, 3e-2, log=True),
            "channels": trial.suggest_int("channels", 16, 96, log=True),
            "depth": trial.suggest_int("depth", 1, 3),
            "dropout": trial.suggest_float("dropout", 0.0, 0.5),
            "weight_decay": trial.suggest_float("weight_decay", 1e-6, 1e-2, log=True),
            "batch_size": trial.suggest_categorical("batch_size", [64, 128, 256])}


def objective(trial: Any) -> float:
    """A plain Optuna objective: the best validation loss so far every epoch (the value it
    returns: a trial that peaked and then diverged is judged by its best, not stopped after
    it and lost; docs/OBJECTIVES.md), pruned before the last."""
    import optuna

    params = suggest(trial)
    best = float("inf")

    def after_epoch(epoch: int, valid: float) -> None:
        nonlocal best
        best = min(best, valid)
        trial.report(best, epoch)
        if epoch < EPOCHS and trial.should_prune():
            raise optuna.TrialPruned(f"pruned after epoch {epoch}")

    return _fit(params, trial.number, after_epoch)[0]


def retrain_test_loss(params: dict[str, Any], seed: int = 0) -> dict[str, Any]:
    """The held-out test loss of ``params`` retrained once, at its best validation epoch.
    ``seed``: the trial's number, which seeded its own training (objective above), so the
    retrained model starts as the trial's did."""
    valid, test, epoch = _fit(params, seed, None)
    return {"test_loss": test, "valid_loss": valid, "epoch": epoch}
