"""MLflow "models from code" definition: FedPT's proxy-tuned composite (paper 002, Eq. 3).

Like ``hf_pyfunc_model.py`` this file stands alone (mlflow and pandas at module level, no
fedtune import, no pickle). The artifact is the directory FedPT exports: ``fedpt.json`` (alpha
and the parts), ``large/`` (the large model), ``small/`` (the small base model, its tokenizer
and ``adapter/``). Generation is ``fedtune_fedpt_decoding.generate_tokens``, a copy of
``fedtune.models.proxy_decoding`` shipped with the model (MLflow ``code_paths``): greedy
decoding on ``z_large + alpha * (z_small_ft - z_small_pre)`` with a KV cache per model. Each
prompt is put in the template the small model was trained with (``fedtune_prompt.json`` in
``small/``, read by ``fedtune_prompt_frame``, also shipped), as ``hf_pyfunc_model.py`` does.

Input: a table with a ``prompt`` column. Output: one continuation per prompt.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import mlflow
import pandas as pd  # type: ignore[import-untyped]
from mlflow.pyfunc.model import PythonModel, PythonModelContext

PROXY_ARTIFACT = "proxy_dir"
MANIFEST = "fedpt.json"
DEFAULT_MAX_NEW_TOKENS = 64


class ProxyTunedGenerator(PythonModel):
    """Greedy generation from the proxy-tuned large model."""

    def load_context(self, context: PythonModelContext) -> None:
        """Load the three models and the shared tokenizer."""
        from peft import PeftModel
        from transformers import AutoModelForCausalLM, AutoTokenizer

        root = Path(context.artifacts[PROXY_ARTIFACT])
        manifest = json.loads((root / MANIFEST).read_text())
        if not isinstance(manifest.get("large"), str):
            raise ValueError(
                f"{root / MANIFEST} names a remote large model ({manifest.get('large')!r}); "
                "this model can only be served where the large model's weights are present"
            )
        small = root / manifest["small"]
        self.alpha = float(manifest["alpha"])
        self.tokenizer = AutoTokenizer.from_pretrained(small)
        self.large = AutoModelForCausalLM.from_pretrained(root / manifest["large"]).eval()
        self.pre = AutoModelForCausalLM.from_pretrained(small).eval()
        tuned: Any = AutoModelForCausalLM.from_pretrained(small)
        self.tuned = PeftModel.from_pretrained(tuned, small / "adapter").eval()
        self.vocab_size = len(self.tokenizer)
        from fedtune_prompt_frame import read_template

        self.template = read_template(small)

    # ``model_input`` is a DataFrame on purpose (see hf_pyfunc_model.py).
    def predict(
        self,
        context: PythonModelContext,
        model_input: pd.DataFrame,
        params: dict[str, Any] | None = None,
    ) -> list[str]:
        """Generate a continuation for each prompt (``max_new_tokens`` param, default 64)."""
        import torch
        from fedtune_fedpt_decoding import CachedDecoder, generate_tokens
        from fedtune_prompt_frame import framed

        if hasattr(model_input, "columns"):
            prompts = [str(p) for p in model_input["prompt"].tolist()]
        elif isinstance(model_input, str):
            prompts = [model_input]
        else:
            prompts = [str(p) for p in model_input]
        max_new = int((params or {}).get("max_new_tokens", DEFAULT_MAX_NEW_TOKENS))
        outputs: list[str] = []
        for prompt in prompts:
            ids = self.tokenizer(framed(prompt, self.template), return_tensors="pt")["input_ids"]
            decoders = [CachedDecoder(m, self.vocab_size) for m in (self.large, self.pre, self.tuned)]
            with torch.no_grad():
                new = generate_tokens(
                    decoders,
                    ids,
                    self.alpha,
                    max_new_tokens=max_new,
                    eos_token_id=self.tokenizer.eos_token_id,
                )
            outputs.append(str(self.tokenizer.decode(new, skip_special_tokens=True)))
        return outputs


mlflow.models.set_model(ProxyTunedGenerator())
