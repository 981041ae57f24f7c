"""A framework that loads plugins from its config file, Hermes-style: each entry of
``plugins:`` names a module whose ``register(config)`` the framework calls before it trains.
dsec needs no more than its entry (framework.yaml). Run it from this folder:

    python framework.py framework.yaml

With no broker at the endpoint it trains all the same; the probe says what it dropped.
"""

from __future__ import annotations

import importlib
import sys

import torch
import yaml


def load_plugins(config: dict) -> None:
    for plugin in config.get("plugins", []):
        importlib.import_module(plugin["module"]).register(plugin.get("config", {}))


def train(config: dict) -> float:
    torch.manual_seed(0)
    hidden = config["model"]["hidden"]
    model = torch.nn.Sequential(torch.nn.Linear(4, hidden), torch.nn.Tanh(),
                                torch.nn.Linear(hidden, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(config["train"]["steps"]):
        x = torch.randn(32, 4)
        loss = (model(x) - x.sum(dim=1, keepdim=True)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return loss.item()


if __name__ == "__main__":
    with open(sys.argv[1]) as handle:
        settings = yaml.safe_load(handle)
    load_plugins(settings)
    print(f"final loss {train(settings):.4f}")
