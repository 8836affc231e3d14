"""Bench-only encoder for GPU machines without onnxruntime-gpu (bench/gpu.py): a bge-m3-sized XLM-R-shaped
transformer (random weights) in PyTorch, fp16, in a Python-backend model with the `embedding` model's contract
(input_ids, attention_mask -> CLS-pooled, L2-normalized `embedding`). Its config's parameters set the shape."""
import json

import numpy as np
import torch
import triton_python_backend_utils as pb_utils


class Encoder(torch.nn.Module):
    def __init__(self, vocab, hidden, layers, heads, ffn, positions):
        super().__init__()
        self.tokens = torch.nn.Embedding(vocab, hidden)
        self.positions = torch.nn.Embedding(positions, hidden)
        self.norm = torch.nn.LayerNorm(hidden)
        layer = torch.nn.TransformerEncoderLayer(hidden, heads, ffn, dropout=0.0, activation="gelu",
                                                 batch_first=True)
        self.layers = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=True)

    def forward(self, input_ids, attention_mask):
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        hidden = self.norm(self.tokens(input_ids) + self.positions(positions)[None])
        hidden = self.layers(hidden, src_key_padding_mask=attention_mask == 0)
        return torch.nn.functional.normalize(hidden[:, 0].float(), dim=-1)


def build_encoder(shape, device):
    """The encoder of `shape` (vocab, hidden, layers, heads, ffn, positions), random weights (seed 0), built on
    `device` itself (a bge-m3-sized one initialises in seconds there, not on the CPU), fp16 on a GPU. bench/gpu.py
    measures its ceiling with this same function."""
    torch.manual_seed(0)
    with device:
        model = Encoder(*(int(shape[key]) for key in ("vocab", "hidden", "layers", "heads", "ffn", "positions")))
    return model.to(torch.float16 if device.type == "cuda" else torch.float32).eval()


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        value = {k: v["string_value"] for k, v in config["parameters"].items()}
        self.device = torch.device("cuda" if value["device"] == "cuda" and torch.cuda.is_available() else "cpu")
        self.model = build_encoder(value, self.device)

    @torch.inference_mode()
    def execute(self, requests):
        ids = [pb_utils.get_input_tensor_by_name(r, "input_ids").as_numpy() for r in requests]
        masks = [pb_utils.get_input_tensor_by_name(r, "attention_mask").as_numpy() for r in requests]
        # The dynamic batcher merges equal shapes only: one run per distinct width, like the onnxruntime backend.
        responses = [None] * len(requests)
        by_width = {}
        for i, array in enumerate(ids):
            by_width.setdefault(array.shape[1], []).append(i)
        for members in by_width.values():
            batch_ids = torch.from_numpy(np.concatenate([ids[i] for i in members])).to(self.device)
            batch_mask = torch.from_numpy(np.concatenate([masks[i] for i in members])).to(self.device)
            vectors = self.model(batch_ids, batch_mask).cpu().numpy()
            start = 0
            for i in members:
                rows = ids[i].shape[0]
                responses[i] = pb_utils.InferenceResponse(
                    output_tensors=[pb_utils.Tensor("embedding", vectors[start:start + rows])])
                start += rows
        return responses
