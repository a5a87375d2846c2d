"""MLflow "models from code" definition: text generation from a Hugging Face directory.

MLflow copies this file into every model that ``MlflowTracker.log_model`` logs and executes it
when the model is loaded, so it must stand alone: it never imports fedtune, and at module
level only mlflow (which is what runs it) and pandas (an mlflow dependency). No pickle is
involved: the model is this code plus the Hugging Face directory (safetensors weights,
tokenizer files, and an optional ``adapter/`` folder of PEFT files applied on top of the
base weights).

Input: a table with a ``prompt`` column. Output: one generated continuation per prompt
(greedy decoding; ``max_new_tokens`` is a request parameter). Where the directory holds
``fedtune_prompt.json`` (fedtune writes it with every model), each prompt is put in the
template the model was trained with, so "What is 2 + 3?" reaches the model as the
instruction of a training example did; a prompt that already is a whole template is kept.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlflow
import pandas as pd  # type: ignore[import-untyped]
from mlflow.pyfunc.model import PythonModel, PythonModelContext

HF_ARTIFACT = "hf_dir"
ADAPTER_SUBDIR = "adapter"
DEFAULT_MAX_NEW_TOKENS = 64


class HFTextGenerator(PythonModel):
    """Greedy text generation with a causal LM and its tokenizer."""

    def load_context(self, context: PythonModelContext) -> None:
        """Load tokenizer, model and (if present) the PEFT adapter from the artifact."""
        # Heavy imports live here so that logging the model does not import torch.
        from transformers import AutoModelForCausalLM, AutoTokenizer

        path = Path(context.artifacts[HF_ARTIFACT])
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        model: Any = AutoModelForCausalLM.from_pretrained(path)
        adapter = path / ADAPTER_SUBDIR
        if (adapter / "adapter_config.json").is_file():
            from peft import PeftModel

            model = PeftModel.from_pretrained(model, adapter)
        model.eval()
        self.model = model
        # Shipped with the model (MLflow code_paths): fedtune.models.prompt_frame.
        from fedtune_prompt_frame import read_template

        self.template = read_template(path)

    # ``model_input`` is annotated as a DataFrame on purpose: MLflow turns list[...] hints into
    # the model's signature (replacing the explicit one and its ``max_new_tokens`` param),
    # and warns when there is no hint at all; a DataFrame hint does neither.
    def predict(
        self,
        context: PythonModelContext,
        model_input: pd.DataFrame,
        params: dict[str, Any] | None = None,
    ) -> list[str]:
        """Generate a continuation for each prompt.

        Args:
            context: The MLflow context (unused after loading).
            model_input: A pandas DataFrame with a ``prompt`` column (or a list of strings).
            params: ``max_new_tokens`` (default 64).

        Returns:
            The generated text after each prompt, special tokens removed.
        """
        import torch
        from fedtune_prompt_frame import framed

        if hasattr(model_input, "columns"):
            prompts = [str(p) for p in model_input["prompt"].tolist()]
        elif isinstance(model_input, str):
            prompts = [model_input]
        else:
            prompts = [str(p) for p in model_input]
        max_new = int((params or {}).get("max_new_tokens", DEFAULT_MAX_NEW_TOKENS))
        tok = self.tokenizer
        pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        outputs: list[str] = []
        # One prompt at a time: no padding side effects, and serving batches are small.
        for prompt in prompts:
            enc = tok(framed(prompt, self.template), return_tensors="pt")
            with torch.no_grad():
                generated = self.model.generate(
                    **enc, max_new_tokens=max_new, do_sample=False, pad_token_id=pad_id
                )
            new_tokens = generated[0, enc["input_ids"].shape[1] :]
            outputs.append(str(tok.decode(new_tokens, skip_special_tokens=True)))
        return outputs


mlflow.models.set_model(HFTextGenerator())
