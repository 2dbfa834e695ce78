"""Stage 1 of a KV translator: ridge regression in closed form, on aligned tokens of texts both models
read (``align.features`` -> ``align.targets``), and the held-out R^2 of a map."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from kvviz.handoffs.translate.translator import KVTranslator, TranslatorConfig


class RidgeStats:
    """Sufficient statistics of (features, targets) over aligned tokens, for closed-form ridge.

    Sums are kept in float64 around a fixed shift (the first chunk's mean), which keeps the
    centred second moments accurate over a million tokens.
    """

    def __init__(self, in_width: int, out_width: int):
        self.n = 0
        self.shift_x = None
        self.shift_y = None
        self.sum_x = torch.zeros(in_width, dtype=torch.float64)
        self.sum_y = torch.zeros(out_width, dtype=torch.float64)
        self.sum_yy = torch.zeros(out_width, dtype=torch.float64)
        self.xtx = torch.zeros(in_width, in_width, dtype=torch.float64)
        self.xty = torch.zeros(in_width, out_width, dtype=torch.float64)

    def add(self, x: torch.Tensor, y: torch.Tensor) -> None:
        if self.shift_x is None:
            self.shift_x, self.shift_y = x.double().mean(0), y.double().mean(0)
        shift_x, shift_y = self.shift_x.float(), self.shift_y.float()
        for start in range(0, x.shape[0], 2048):  # float32 products of at most 2048 rows, summed in float64
            xs, ys = x[start : start + 2048].float() - shift_x, y[start : start + 2048].float() - shift_y
            self.n += xs.shape[0]
            self.sum_x.add_(xs.sum(0))
            self.sum_y.add_(ys.sum(0))
            self.sum_yy.add_((ys * ys).sum(0))
            self.xtx.add_(xs.T @ xs)  # in place: no float64 copy of the product
            self.xty.add_(xs.T @ ys)

    def state(self) -> dict:
        return {"n": torch.tensor([self.n], dtype=torch.float64), "shift_x": self.shift_x, "shift_y": self.shift_y,
                "sum_x": self.sum_x, "sum_y": self.sum_y, "sum_yy": self.sum_yy, "xtx": self.xtx, "xty": self.xty}

    def save(self, path: Path, meta: dict | None = None) -> None:
        from safetensors.torch import save_file

        tmp = Path(str(path) + ".tmp")
        save_file({k: v.contiguous() for k, v in self.state().items()}, str(tmp), metadata={"meta": json.dumps(meta or {})})
        tmp.replace(path)

    @classmethod
    def load(cls, path: Path) -> "RidgeStats":
        from safetensors.torch import load_file

        tensors = load_file(str(path))
        stats = cls(tensors["xtx"].shape[0], tensors["xty"].shape[1])
        stats.n = int(tensors["n"][0])
        for name in ("shift_x", "shift_y", "sum_x", "sum_y", "sum_yy", "xtx", "xty"):
            setattr(stats, name, tensors[name])
        return stats

    def merge(self, other: "RidgeStats") -> None:
        """Add another set of sums (taken around its own shift) to these."""
        if other.n == 0:
            return
        if self.n == 0:
            for name in ("n", "shift_x", "shift_y", "sum_x", "sum_y", "sum_yy", "xtx", "xty"):
                setattr(self, name, getattr(other, name).clone() if torch.is_tensor(getattr(other, name)) else getattr(other, name))
            return
        dx, dy = other.shift_x - self.shift_x, other.shift_y - self.shift_y  # x - s = (x - s') + d
        n = other.n
        self.xtx += other.xtx + torch.outer(other.sum_x, dx) + torch.outer(dx, other.sum_x) + n * torch.outer(dx, dx)
        self.xty += other.xty + torch.outer(other.sum_x, dy) + torch.outer(dx, other.sum_y) + n * torch.outer(dx, dy)
        self.sum_yy += other.sum_yy + 2 * dy * other.sum_y + n * dy * dy
        self.sum_x += other.sum_x + n * dx
        self.sum_y += other.sum_y + n * dy
        self.n += n

    def subset(self, columns: list[int]) -> "RidgeStats":
        """The sums of a subset of the feature columns (a smaller layout from a superset's sums)."""
        index = torch.tensor(columns)
        out = RidgeStats(len(columns), self.xty.shape[1])
        out.n, out.shift_x, out.shift_y = self.n, self.shift_x[index], self.shift_y
        out.sum_x, out.sum_y, out.sum_yy = self.sum_x[index], self.sum_y, self.sum_yy
        out.xtx, out.xty = self.xtx[index][:, index], self.xty[index]
        return out

    def moments(self):
        """(mean x, std x, mean y, std y, correlation of x, cross-correlation x-y), float64."""
        n = self.n
        mx, my = self.sum_x / n, self.sum_y / n
        cov_x = self.xtx / n - torch.outer(mx, mx)
        cov_xy = self.xty / n - torch.outer(mx, my)
        var_y = self.sum_yy / n - my * my
        sx = cov_x.diagonal().clamp_min(1e-12).sqrt()
        sy = var_y.clamp_min(1e-12).sqrt()
        return mx + self.shift_x, sx, my + self.shift_y, sy, cov_x / torch.outer(sx, sx), cov_xy / torch.outer(sx, sy)


def fit_ridge(stats: RidgeStats, lam: float, rank: int | None = None, columns: list[int] | None = None, ranks=None):
    """Closed-form ridge on z-scored features and targets: {weight or (down, up), x_mean, x_scale,
    y_mean, y_scale}. ``lam`` is relative to the (unit) feature variance. With ``rank``, the
    reduced-rank solution: W projected on the top ``rank`` directions of its fitted values.
    ``columns``: use only these feature columns (a smaller layout from the same sums).
    ``ranks``: several ranks at once (a dict rank -> result; the decompositions are shared).
    """
    mx, sx, my, sy, corr_x, corr_xy = stats.moments()
    if columns is not None:
        index = torch.tensor(columns)
        mx, sx, corr_x, corr_xy = mx[index], sx[index], corr_x[index][:, index], corr_xy[index]
    eye = torch.eye(corr_x.shape[0], dtype=torch.float64)
    weight = torch.linalg.solve(corr_x + lam * eye, corr_xy)  # [F, O] standardised
    base = {"x_mean": mx.float(), "x_scale": sx.float(), "y_mean": my.float(), "y_scale": sy.float()}
    wanted = list(ranks) if ranks is not None else ([rank] if rank is not None else [])
    if not wanted:
        return {**base, "weight": weight.float()}
    # fitted values' covariance W^T C W = (C^1/2 W)^T (C^1/2 W); its top eigenvectors via the small
    # side, in float32 (the directions need no float64; the products are the costly part)
    evals, evecs = torch.linalg.eigh(corr_x.float())
    fitted = ((evecs * evals.clamp_min(0).sqrt()) @ evecs.T) @ weight.float()  # C^1/2 W, [F, O]
    s_evals, s_evecs = torch.linalg.eigh(fitted @ fitted.T)
    out = {}
    for r in wanted:
        directions = fitted.T @ s_evecs[:, -r:] / s_evals[-r:].clamp_min(1e-12).sqrt()  # [O, r], orthonormal columns
        out[r] = {**base, "down": weight.float() @ directions, "up": directions.T.contiguous()}
    return out if ranks is not None else out[rank]


def fit_ridge_routed(stats: RidgeStats, config: TranslatorConfig, lam: float) -> dict:
    """Closed-form ridge for a translator with ``sources``: each receiver layer's keys and values from
    its own sharer layers' columns (``stats`` over ``config.sharer_layers``' features). Returns
    ``install_fit``'s input, with ``routed`` [L, F_l, 2 * kv_width] in z-scored units."""
    mx, sx, my, sy, corr_x, corr_xy = stats.moments()
    out = 2 * config.kv_width
    weights = []
    for layer, columns in enumerate(config.source_columns()):
        index = torch.tensor(columns)
        block = corr_x[index][:, index]
        targets_of_layer = corr_xy[index, layer * out:(layer + 1) * out]
        weights.append(torch.linalg.solve(block + lam * torch.eye(len(columns), dtype=block.dtype), targets_of_layer).float())
    return {"x_mean": mx.float(), "x_scale": sx.float(), "y_mean": my.float(), "y_scale": sy.float(),
            "routed": torch.stack(weights)}


def install_fit(translator: KVTranslator, fit: dict) -> None:
    """Put a ``fit_ridge`` result into a translator of the matching rank."""
    with torch.no_grad():
        for name in ("x_mean", "x_scale", "y_mean", "y_scale"):
            getattr(translator, name).copy_(fit[name])
        if translator.routed:
            translator.up.copy_(fit["routed"])
        elif translator.down is None:
            translator.up.copy_(fit["weight"])
        else:
            translator.down.copy_(fit["down"])
            translator.up.copy_(fit["up"])


def r_squared(translator: KVTranslator, x: torch.Tensor, y: torch.Tensor, layers: int) -> dict:
    """Held-out R^2 of the map on z-scored targets, pooled over K dims and over V dims, and per layer."""
    with torch.no_grad():
        predicted = translator.standardised(x)
        truth = (y - translator.y_mean) / translator.y_scale
    err = ((predicted - truth) ** 2).reshape(x.shape[0], layers, 2, -1).sum(dim=(0, 3)).double()
    centred = truth - truth.mean(0)
    var = (centred ** 2).reshape(x.shape[0], layers, 2, -1).sum(dim=(0, 3)).double()
    per_layer = 1 - err / var
    return {
        "k": float(1 - err[:, 0].sum() / var[:, 0].sum()),
        "v": float(1 - err[:, 1].sum() / var[:, 1].sum()),
        "k_layers": [round(float(v), 4) for v in per_layer[:, 0]],
        "v_layers": [round(float(v), 4) for v in per_layer[:, 1]],
    }
