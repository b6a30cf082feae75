"""An MLP trained with a real DataLoader loop; validation loss reported every epoch.

DataLoader settings (batch_size, num_workers, pin_memory, persistent_workers, prefetch_factor)
come from config; a list of batch sizes is searched. On a GPU slot the forward pass runs
under bf16 autocast.
"""

from __future__ import annotations

from typing import Any

import optuna

from hpo_orchestrator.config import TORCH_MLP_SPACE, TorchMLPObjectiveConfig, resolve_space
from hpo_orchestrator.objectives._generated import binary_classification
from hpo_orchestrator.objectives._suggest import suggest_all
from hpo_orchestrator.worker import phase, slot_info

__all__ = ["TorchMLPObjective"]


class TorchMLPObjective:
    def __init__(self, config: TorchMLPObjectiveConfig) -> None:
        # Imported here, not per call, so the import counts as start-up (hpo.startup_s).
        import torch  # noqa: F401

        self.config = config
        self.space = resolve_space(TORCH_MLP_SPACE, config.search_space, "objective", config.name)

    def _loader_options(self, trial: Any) -> dict[str, Any]:
        cfg = self.config
        sizes = cfg.batch_size
        batch_size = trial.suggest_categorical("batch_size", sizes) if isinstance(sizes, list) \
            else sizes
        options: dict[str, Any] = {"batch_size": batch_size, "num_workers": cfg.num_workers}
        if cfg.num_workers > 0:
            options["persistent_workers"] = cfg.persistent_workers
            if cfg.prefetch_factor is not None:
                options["prefetch_factor"] = cfg.prefetch_factor
        return options

    def __call__(self, trial: Any) -> float:
        import torch
        from torch import nn
        from torch.utils.data import DataLoader, TensorDataset

        cfg = self.config
        slot = slot_info()
        torch.set_num_threads(slot.num_threads)
        device = torch.device("cuda:0" if slot.on_gpu and torch.cuda.is_available() else "cpu")
        if slot.on_gpu and device.type == "cpu":
            trial.set_user_attr("hpo.warning",
                                "slot has a GPU but torch.cuda.is_available() is False "
                                "(CPU build of torch?); trained on CPU")
        use_bf16 = cfg.bf16 and device.type == "cuda"
        torch.manual_seed(cfg.seed + trial.number)

        with phase("data"):
            x_train, y_train, x_valid, y_valid = binary_classification(
                cfg.n_samples, cfg.n_features, cfg.seed)
            options = self._loader_options(trial)
            train_loader = DataLoader(
                TensorDataset(torch.from_numpy(x_train), torch.from_numpy(y_train)),
                shuffle=True, pin_memory=cfg.pin_memory and device.type == "cuda", **options)
            x_valid_t = torch.from_numpy(x_valid).to(device)
            y_valid_t = torch.from_numpy(y_valid).to(device)

        chosen = suggest_all(trial, self.space)
        width, depth, dropout = chosen["width"], chosen["depth"], chosen["dropout"]
        lr, weight_decay = chosen["lr"], chosen["weight_decay"]
        layers: list[nn.Module] = []
        fan_in = cfg.n_features
        for _ in range(depth):
            layers += [nn.Linear(fan_in, width), nn.ReLU(), nn.Dropout(dropout)]
            fan_in = width
        model = nn.Sequential(*layers, nn.Linear(fan_in, 1)).to(device)
        optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
        loss_fn = nn.BCEWithLogitsLoss()

        best = float("inf")
        effective: dict[str, Any] | None = None
        for epoch in range(1, cfg.epochs + 1):
            with phase("train"):
                model.train()
                for xb, yb in train_loader:
                    pinned = xb.is_pinned()
                    xb = xb.to(device, non_blocking=True)
                    yb = yb.to(device, non_blocking=True)
                    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=use_bf16):
                        out = model(xb).squeeze(1)
                        if effective is None:  # what ran, read during the first step
                            effective = _effective(train_loader, xb, out, pinned)
                            trial.set_user_attr("hpo.params_effective", effective)
                        loss = loss_fn(out, yb)
                    optimizer.zero_grad(set_to_none=True)
                    loss.backward()
                    optimizer.step()
            with phase("validate"), torch.no_grad():
                model.eval()
                with torch.autocast(device.type, dtype=torch.bfloat16, enabled=use_bf16):
                    logits = model(x_valid_t).squeeze(1)
                valid_loss = float(loss_fn(logits.float(), y_valid_t))
            best = min(best, valid_loss)
            # the value the trial returns, so the pruner judges what the study would keep
            # (docs/OBJECTIVES.md, "What to report")
            trial.report(best, epoch)
            # The last epoch is done: the trial completes with its value, never pruned there.
            if epoch < cfg.epochs and trial.should_prune():
                raise optuna.TrialPruned(f"pruned after epoch {epoch}")
        return best


def _effective(loader: Any, batch: Any, output: Any, pinned: bool) -> dict[str, Any]:
    """What the first training step ran with, read from torch and the DataLoader in use
    (not copied from the config): inside the autocast context, on the first batch."""
    import torch

    device_type = output.device.type
    autocast = torch.is_autocast_enabled(device_type)
    return {
        "device": str(output.device),
        "autocast_dtype": str(torch.get_autocast_dtype(device_type)).removeprefix("torch.")
        if autocast else None,
        "output_dtype": str(output.dtype).removeprefix("torch."),
        "torch_threads": torch.get_num_threads(),
        "pin_memory": pinned,
        "batch_size": int(batch.shape[0]),
        "num_workers": loader.num_workers,
        "persistent_workers": loader.persistent_workers,
        "prefetch_factor": loader.prefetch_factor,
    }
