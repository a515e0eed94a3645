"""Tokens of a pretrained ViT (paper scale): DINOv2 / CLIP / supervised ViTs via ``transformers``.

Needs ``pip install transformers`` and the weights (downloaded by transformers on first use; not
possible offline). Images are our rendered scenes, resized to the backbone's input size and
normalised with its processor; the tokens are the last hidden state after the final LayerNorm,
[CLS] first, register tokens (if any) dropped, so the probes see the same layout as the
from-scratch ViT.
"""
from __future__ import annotations

import numpy as np


def pretrained_tokens(images: np.ndarray, cfg: dict) -> np.ndarray:
    try:
        import torch
        from transformers import AutoConfig, AutoImageProcessor, AutoModel
    except ImportError as err:  # pragma: no cover - paper scale only
        raise ImportError("the paper-scale backbone needs `pip install transformers` (and network access "
                          f"for the weights of {cfg['name']})") from err
    device = cfg.get("device", "cuda" if torch.cuda.is_available() else "cpu")
    proc = AutoImageProcessor.from_pretrained(cfg["name"])
    if cfg.get("random_init"):
        torch.manual_seed(int(cfg.get("seed", 0)))
        model = AutoModel.from_config(AutoConfig.from_pretrained(cfg["name"])).to(device).eval()
    else:
        model = AutoModel.from_pretrained(cfg["name"]).to(device).eval()
    model = getattr(model, "vision_model", model)  # CLIP: the vision tower
    n_registers = int(getattr(model.config, "num_register_tokens", 0) or 0)
    out = []
    with torch.no_grad():
        for i in range(0, len(images), cfg.get("batch", 64)):
            batch = [np.transpose(x, (1, 2, 0)) for x in images[i:i + cfg.get("batch", 64)]]
            inputs = proc(images=batch, return_tensors="pt", do_rescale=False).to(device)
            hidden = model(pixel_values=inputs["pixel_values"]).last_hidden_state
            hidden = torch.cat([hidden[:, :1], hidden[:, 1 + n_registers:]], dim=1)
            out.append(hidden.float().cpu().numpy())
    return np.concatenate(out)
