"""Which parameters form a "layer" and a "network", for per-layer and finer clipping.

* layer = a module that directly owns trainable parameters (e.g. one MaskedLinear, one
  LULinear with its lower/upper/log_diag/bias, one ActNorm); its parameters are clipped
  together.
* network = the top-level child module of the model that contains the layer (DP-HFlow's
  networks f^i: the shared MADE, each linear flow, the dequantizer, ...). Parameters owned
  directly by the model itself form one more network, named "".
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from privflow.privacy.dpsgd.grad_samplers import free_numel, param_layers


@dataclass(frozen=True, eq=False)
class LayerInfo:
    """One layer: its dotted name, module, trainable parameters, network and their free sizes."""

    name: str
    module: nn.Module
    params: tuple[nn.Parameter, ...]
    network: str
    free: tuple[int, ...]

    @property
    def complexity(self) -> int:
        """Parameter complexity: gradient entries that can be non-zero."""
        return sum(self.free)


def model_layers(model: nn.Module) -> list[LayerInfo]:
    """All layers of ``model`` in registration order."""
    out = []
    for name, m in param_layers(model):
        params = tuple(p for p in m.parameters(recurse=False) if p.requires_grad)
        sizes = free_numel(m)
        out.append(LayerInfo(name, m, params, name.split(".")[0] if name else "", tuple(sizes[p] for p in params)))
    return out
