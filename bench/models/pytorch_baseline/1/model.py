"""Baseline: Hugging Face transformers + PyTorch inside a Python-backend model (text in, embedding out).

This is what `pipeline("feature-extraction")` wraps (AutoTokenizer + AutoModel), given its best case here: all
texts of one execute (the dynamic batcher's batch) are tokenized together, padded to the longest of them, run as
one forward pass, mean/CLS-pooled and L2-normalized like the exported ONNX graph.
"""
import json

import numpy as np
import torch
import triton_python_backend_utils as pb_utils
from transformers import AutoModel, AutoTokenizer


class TritonPythonModel:
    def initialize(self, args):
        parameters = {k: v["string_value"] for k, v in json.loads(args["model_config"])["parameters"].items()}
        threads = int(parameters.get("threads", "0"))
        if threads > 0:
            torch.set_num_threads(threads)
        self.device = parameters.get("device", "cpu")
        if self.device.startswith("cuda") and not torch.cuda.is_available():
            raise pb_utils.TritonModelException("pytorch_baseline: device cuda asked for, but torch sees no GPU")
        self.pooling = parameters.get("pooling", "mean")
        self.max_length = int(parameters["max_length"])
        self.tokenizer = AutoTokenizer.from_pretrained(parameters["model_path"])
        self.model = AutoModel.from_pretrained(parameters["model_path"]).eval().to(self.device)

    def execute(self, requests):
        texts = []
        counts = []
        for request in requests:
            rows = pb_utils.get_input_tensor_by_name(request, "text").as_numpy().reshape(-1)
            texts.extend(r.decode("utf-8") if isinstance(r, bytes) else str(r) for r in rows)
            counts.append(len(rows))
        batch = self.tokenizer(texts, padding=True, truncation=True, max_length=self.max_length,
                               return_tensors="pt").to(self.device)
        with torch.inference_mode():
            hidden = self.model(**batch)[0]
            if self.pooling == "cls":
                pooled = hidden[:, 0]
            else:
                mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            embeddings = torch.nn.functional.normalize(pooled, p=2.0, dim=1).float().cpu().numpy()
        responses, start = [], 0
        for count in counts:
            tensor = pb_utils.Tensor("embedding", np.ascontiguousarray(embeddings[start:start + count]))
            responses.append(pb_utils.InferenceResponse(output_tensors=[tensor]))
            start += count
        return responses
